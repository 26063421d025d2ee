//! The shared state directory of node daemons as a cluster filesystem behaves under trouble:
//! a node whose writes stall for seconds (the process stopped with SIGSTOP), a node whose files
//! appear late (it starts seconds after the other), and a state directory whose disk is full (a
//! tmpfs filled to the last byte, freed a few seconds later). Real daemons of the multinode
//! recipe on ipc sockets, real `dsprep tap` ranks: a stall or a full disk delays the steps, and
//! every rank's bytes still equal its slice of `dsprep pack`, every step's chain checked.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::PackedDataset;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;
use support::daemon::{Daemon, assert_tap_chains, chain_marks, expected_rank_bytes, tap};
use support::nodes::{packed_multinode, start_node};

const WORLD: u32 = 4;

/// Every rank's tap on its node's socket (ranks 0, 1 on node 0; 2, 3 on node 1), started now:
/// they wait for a daemon that is not there yet.
fn taps(dir: &Path, steps: u64) -> Vec<Child> {
    (0..WORLD)
        .map(|rank| {
            let node = rank / 2;
            let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
            tap(
                &endpoint,
                rank,
                WORLD,
                0,
                steps,
                &dir.join(format!("r{rank}.bin")),
            )
        })
        .collect()
}

/// Wait for every tap; each must succeed with its rank's bytes of the packed stream.
fn assert_taps_equal_the_pack(dir: &Path, taps: Vec<Child>, whole: &PackedDataset, what: &str) {
    let marks = chain_marks(whole, whole.num_windows());
    let steps = whole.num_windows() / u64::from(WORLD);
    for (rank, child) in (0..WORLD).zip(taps) {
        let result = child.wait_with_output().unwrap();
        assert!(
            result.status.success(),
            "{what}: rank {rank}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        let out = dir.join(format!("r{rank}.bin"));
        assert_eq!(
            assert_tap_chains(&out, &marks),
            steps as usize,
            "{what}: rank {rank}"
        );
        let want = expected_rank_bytes(whole, u64::from(WORLD), 1, u64::from(rank));
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{what}: rank {rank}'s bytes differ"
        );
    }
}

fn signal(daemon: &Daemon, signal: &str) {
    let pid = daemon.child.id().to_string();
    assert!(
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn a_node_that_starts_late_and_one_whose_writes_stall_delay_the_steps_and_change_no_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    let steps = whole.num_windows() / u64::from(WORLD);
    let extra = ["--metrics", "off", "--threads", "1"];
    let mut node0 = start_node(tmp.path(), 0, 2, WORLD, 1, &extra).unwrap();
    let taps = taps(tmp.path(), steps + 2);
    // Node 1's files appear 2 s after node 0's: node 0's ranks wait on its window digests.
    std::thread::sleep(Duration::from_secs(2));
    let mut node1 = start_node(tmp.path(), 1, 2, WORLD, 1, &extra).unwrap();
    // Node 0 stops for 3 s mid-stream: its writes to the state directory stall, node 1 waits.
    std::thread::sleep(Duration::from_millis(300));
    signal(&node0, "-STOP");
    std::thread::sleep(Duration::from_secs(3));
    signal(&node0, "-CONT");
    assert_taps_equal_the_pack(tmp.path(), taps, &whole, "late start and a stall");
    node0.terminate();
    node1.terminate();
}

/// A tmpfs of `bytes` mounted at `at`, unmounted (lazily) when dropped.
struct Tmpfs<'a>(&'a Path);

impl<'a> Tmpfs<'a> {
    fn mount(at: &'a Path, bytes: u64) -> Tmpfs<'a> {
        std::fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            mounted,
            "this test fills a disk: it mounts a tmpfs, which needs root (CI runs as root)"
        );
        Tmpfs(at)
    }

    /// Write a file until the disk is full.
    fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while filler.write_all(&block).is_ok() {}
        while filler.write_all(&block[..64]).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).status();
    }
}

#[test]
fn a_full_state_directory_delays_the_steps_until_it_has_room_and_changes_no_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = packed_multinode(tmp.path());
    let steps = whole.num_windows() / u64::from(WORLD);
    let state = tmp.path().join("state");
    let disk = Tmpfs::mount(&state, 4 << 20);
    disk.fill();
    let extra = ["--metrics", "off", "--threads", "1"];
    let mut nodes: Vec<Daemon> = (0..2)
        .map(|node| start_node(tmp.path(), node, 2, WORLD, 1, &extra).unwrap())
        .collect();
    let taps = taps(tmp.path(), steps + 2);
    std::thread::sleep(Duration::from_secs(3));
    disk.free();
    assert_taps_equal_the_pack(tmp.path(), taps, &whole, "a full disk");
    for node in &mut nodes {
        node.terminate();
    }
    let logs: String = nodes.iter().map(|d| d.log_text()).collect();
    assert!(
        logs.contains("No space left on device"),
        "the daemons met the full disk and said so:\n{logs}"
    );
}
