//! A torchrun-style launcher: runs this program `world_size` times on this node with `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE` set, waits for every rank, and stops the
//! others as soon as one fails (a data-parallel job cannot go on without a rank).

use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// Start `world_size` copies of this executable with `args`; the first failure's status wins.
pub fn launch(world_size: u32, args: &[String]) -> std::io::Result<ExitStatus> {
    let exe = std::env::current_exe()?;
    let mut children: Vec<(u32, Child)> = Vec::new();
    for rank in 0..world_size {
        let child = Command::new(&exe)
            .args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", world_size.to_string())
            .spawn();
        match child {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                stop(&mut children);
                return Err(e);
            }
        }
    }
    let mut last = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait()? {
                None => i += 1,
                Some(status) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() {
                        eprintln!(
                            "launch: rank {rank} exited with {status}; stopping the other ranks"
                        );
                        stop(&mut children);
                        return Ok(status);
                    }
                    last = Some(status);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(last.unwrap_or_default())
}

/// Kill and reap the ranks this launcher started.
fn stop(children: &mut Vec<(u32, Child)>) {
    for (_, child) in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
    children.clear();
}
