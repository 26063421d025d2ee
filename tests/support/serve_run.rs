//! A daemon run that is stopped and resumed (tests/resume.rs, tests/best_fit.rs): start it with
//! checkpoints in a state directory, and pull global batches through real `dsprep tap` ranks.

use super::daemon::{Daemon, tap_with};
use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};

/// Windows `[step × gb, (step + 1) × gb)` of `data` for `steps`, as bytes: what the ranks of a
/// global batch of `gb` windows get, put back together.
pub fn global_batches(data: &PackedDataset, gb: u64, steps: std::ops::Range<u64>) -> Vec<u8> {
    (steps.start * gb..steps.end * gb)
        .flat_map(|w| data.window(w).unwrap().tokens.as_bytes().to_vec())
        .collect()
}

/// A daemon of `recipe` on `dir/d.sock` with its state in `state`, checkpointing every `every`
/// steps and keeping 3.
pub struct Run<'a> {
    pub dir: &'a Path,
    pub recipe: &'a Path,
    pub state: PathBuf,
    pub every: u64,
}

impl Run<'_> {
    pub fn start(&self, world: u32, mb: u32, resume: bool) -> Result<Daemon, String> {
        let extra: &[&str] = if resume { &["--resume", "latest"] } else { &[] };
        self.start_with(self.recipe, world, mb, extra)
    }

    /// Start the daemon of `recipe` (another recipe than the run's: a change of course) with
    /// `extra` flags.
    pub fn start_with(
        &self,
        recipe: &Path,
        world: u32,
        mb: u32,
        extra: &[&str],
    ) -> Result<Daemon, String> {
        let endpoint = format!("ipc://{}", self.dir.join("d.sock").display());
        let (world, mb, every) = (world.to_string(), mb.to_string(), self.every.to_string());
        let mut args = vec![
            "--world-size",
            &world,
            "--micro-batch",
            &mb,
            "--prefetch",
            "4",
            "--metrics",
            "off",
            "--state-dir",
            self.state.to_str().unwrap(),
            "--checkpoint-every",
            &every,
            "--keep-checkpoints",
            "3",
        ];
        args.extend(extra);
        // Every progress update logged (not one line per 30 s): the fast-forward shows.
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"));
        command.env("DSPREP_PROGRESS_SECS", "0");
        Daemon::start_cmd(command, recipe, &endpoint, &args)
    }

    /// Every rank pulls `steps` from `from`; returns the global batches they got, in step order
    /// (rank slices put back together).
    pub fn pull(&self, daemon: &Daemon, world: u32, from: u64, steps: u64) -> Vec<u8> {
        self.pull_with(daemon, world, from, steps, &[])
    }

    /// [`Run::pull`] with more tap arguments (`--report-loss SPEC`).
    pub fn pull_with(
        &self,
        daemon: &Daemon,
        world: u32,
        from: u64,
        steps: u64,
        extra: &[&str],
    ) -> Vec<u8> {
        let outs: Vec<PathBuf> = (0..world)
            .map(|r| self.dir.join(format!("rank{r}-from{from}.bin")))
            .collect();
        let taps: Vec<_> = (0..world)
            .map(|r| {
                tap_with(
                    &daemon.endpoint,
                    r,
                    world,
                    from,
                    steps,
                    &outs[r as usize],
                    extra,
                )
            })
            .collect();
        for (r, child) in taps.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "rank {r}: {}\ndaemon log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                daemon.log_text()
            );
        }
        let slices: Vec<Vec<u8>> = outs.iter().map(|o| std::fs::read(o).unwrap()).collect();
        let slice = slices[0].len() / steps.max(1) as usize;
        let got_steps = slices[0].len() / slice.max(1);
        let mut batches = Vec::new();
        for s in 0..got_steps {
            for rank_bytes in &slices {
                batches.extend_from_slice(&rank_bytes[s * slice..(s + 1) * slice]);
            }
        }
        batches
    }
}
