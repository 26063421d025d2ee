//! The fault soak (issue 13, point 4): a real `dsprep serve` with checkpoints serves 8 ranks, each a
//! real `dsprep tap` process, while a seeded schedule SIGKILLs and restarts ranks (a restarted
//! trainer: a new session, started later, which takes the rank over at once (protocol v6),
//! continuing from the step after its last complete one with the chain it saved), SIGKILLs the daemon and resumes it,
//! stops a rank past the prefetch window (SIGSTOP, SIGCONT) while the others wait, and fills the
//! state directory's disk (a 512 KiB tmpfs when this runs as root, else the checkpoints'
//! temporary files are made links to /dev/full). Ranks also close cleanly and reopen (each
//! process pulls a seeded number of steps). At the end every rank's bytes, over all its
//! processes, equal its slice of a `dsprep pack` of the same recipe, byte for byte; the daemon's
//! RSS never exceeded its first sample + [`RSS_MARGIN`]; no log holds a panic; every checkpoint
//! left is sound. Every wait has a deadline.
//!
//! `DSPREP_SOAK_SECS` (default [`DEFAULT_SECS`]) is how long faults go on (the ranks are paced so
//! that the stream lasts about that long); `DSPREP_SOAK_SEED` replays a schedule (the seed is
//! printed). CONTRIBUTING.md "Fault soak and wire fuzz" gives the longer manual run.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep::checkpoint::CheckpointDir;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::daemon::{Daemon, chain_marks, expected_rank_bytes, http_get};
use support::taps::{TapRank, recorded};
use support::watch::{MIB, Rng, RssWatcher, count_from_env, rss_bytes, seed_from_env};
use support::{pack_dataset, quickstart_variant};

const WORLD: u32 = 8;
const PREFETCH: u64 = 4;
/// Seconds a killed or stopped rank's session keeps its rank without a request or keepalive (a
/// restarted one, started later, takes it over at once).
const OWNER_TIMEOUT_S: u64 = 2;
const CHECKPOINT_EVERY: u64 = 10;
/// Seconds of faults unless `DSPREP_SOAK_SECS` says otherwise.
const DEFAULT_SECS: u64 = 120;
/// The daemon's RSS may exceed its first sample (once every rank is served) by at most this.
const RSS_MARGIN: u64 = 32 * MIB;
/// The state directory's disk when it is a tmpfs: a few checkpoints (about 25 KiB each) fit.
const TMPFS_BYTES: u64 = 512 << 10;
/// How far the ranks go on a full disk at most, waiting for a checkpoint write to fail.
const DISK_FULL_STEPS: u64 = 300;
/// No single wait (a rank's progress after a fault, a daemon's restart) may take longer.
const WAIT: Duration = Duration::from_secs(180);

/// What the schedule did, for the report.
#[derive(Debug, Default)]
struct Counts {
    rank_kills: u64,
    daemon_kills: u64,
    stalls: u64,
    /// Stalls during which another rank reached the prefetch window's end.
    stalls_that_held_others: u64,
    disk_full_episodes: u64,
    checkpoint_failures_logged: u64,
    clean_reopens: u64,
    rank_owned_refusals: f64,
}

/// One rank: its tap processes one after another, stopped at times.
struct Rank {
    tap: TapRank,
    stopped: bool,
    /// How many steps each of its processes pulls before it closes cleanly (seeded per rank).
    segments: Rng,
}

impl std::ops::Deref for Rank {
    type Target = TapRank;
    fn deref(&self) -> &TapRank {
        &self.tap
    }
}

impl std::ops::DerefMut for Rank {
    fn deref_mut(&mut self) -> &mut TapRank {
        &mut self.tap
    }
}

/// The state directory's disk, and how to fill it.
enum Disk {
    /// A tmpfs mounted at the path: filled with a file until ENOSPC.
    Tmpfs(PathBuf),
    /// No mount possible (not root): the checkpoints' temporary names become links to /dev/full.
    DevFull,
}

impl Disk {
    fn mount(at: &Path) -> Disk {
        std::fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_BYTES}")])
            .arg("tmpfs")
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if mounted {
            return Disk::Tmpfs(at.to_path_buf());
        }
        println!(
            "soak: no tmpfs (not root, or no mount allowed): the disk fills through links to /dev/full"
        );
        Disk::DevFull
    }

    /// Fill the disk that holds `state` (the checkpoint files of steps up to `num_steps`).
    fn fill(&self, state: &Path, num_steps: u64) {
        match self {
            Disk::Tmpfs(at) => {
                use std::io::Write;
                let mut filler = std::fs::File::create(at.join("filler")).unwrap();
                let block = vec![0u8; 4096];
                while filler.write_all(&block).is_ok() {}
                while filler.write_all(&block[..64]).is_ok() {}
            }
            Disk::DevFull => {
                for step in 0..=num_steps {
                    let link = state.join(format!(".step-{step:012}.ckpt.tmp"));
                    let _ = std::os::unix::fs::symlink("/dev/full", link);
                }
            }
        }
    }

    fn free(&self, state: &Path) {
        match self {
            Disk::Tmpfs(at) => std::fs::remove_file(at.join("filler")).unwrap(),
            Disk::DevFull => {
                for entry in std::fs::read_dir(state).unwrap() {
                    let path = entry.unwrap().path();
                    if path.is_symlink() {
                        std::fs::remove_file(path).unwrap();
                    }
                }
            }
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        if let Disk::Tmpfs(at) = self {
            let _ = Command::new("umount").arg("-l").arg(at).status();
        }
    }
}

/// The soak's world: the daemon, the ranks, what is expected of them.
struct Soak {
    dir: PathBuf,
    recipe: PathBuf,
    endpoint: String,
    state: PathBuf,
    daemon: Option<Daemon>,
    /// Logs of the daemons killed so far.
    logs: Vec<String>,
    ranks: Vec<Rank>,
    marks: Vec<String>,
    num_steps: u64,
    step_bytes: usize,
    step_ms: u64,
    rng: Rng,
    counts: Counts,
    /// Tap failures (exit status and stderr), which a trainer's launcher would restart.
    failures: Vec<String>,
    /// The process the RSS watcher samples: the daemon of the moment (0 between a kill and a
    /// restart).
    rss_pid: Arc<AtomicU32>,
}

impl Soak {
    fn start_daemon(&mut self, resume: bool) {
        let state = self.state.to_str().unwrap().to_string();
        let (prefetch, every, owner) = (
            PREFETCH.to_string(),
            CHECKPOINT_EVERY.to_string(),
            OWNER_TIMEOUT_S.to_string(),
        );
        let mut args = vec![
            "--world-size",
            "8",
            "--micro-batch",
            "1",
            "--prefetch",
            &prefetch,
            "--metrics",
            "127.0.0.1:0",
            "--state-dir",
            &state,
            "--checkpoint-every",
            &every,
            "--keep-checkpoints",
            "3",
            "--owner-timeout",
            &owner,
        ];
        if resume {
            args.extend(["--resume", "latest"]);
        }
        let daemon = Daemon::start_with(&self.recipe, &self.endpoint, &args)
            .unwrap_or_else(|log| panic!("the daemon did not start: {log}"));
        self.rss_pid.store(daemon.child.id(), Ordering::Relaxed);
        self.daemon = Some(daemon);
    }

    fn daemon(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("a daemon runs")
    }

    fn daemon_log(&self) -> String {
        self.daemon
            .as_ref()
            .map(Daemon::log_text)
            .unwrap_or_default()
    }

    /// One series of the daemon's metrics (0 when absent).
    fn metric(&mut self, series: &str) -> f64 {
        let url = self.daemon().metrics.clone().expect("metrics on");
        http_get(&url)
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    fn spawn_tap(&mut self, r: usize, paced: bool) {
        let steps = self.ranks[r].segments.between(30, 300);
        let step_ms = if paced { self.step_ms } else { 0 }.to_string();
        let extra = ["--timeout-s", "10", "--step-ms", &step_ms];
        let (dir, endpoint) = (self.dir.clone(), self.endpoint.clone());
        self.ranks[r].spawn(&dir, &endpoint, WORLD, steps, &extra);
    }

    /// Take what rank `r`'s ended process recorded: its complete steps (checked against the
    /// stream's chain), appended to what the rank received.
    fn collect(&mut self, r: usize) {
        let (steps, bytes) = (self.num_steps, self.step_bytes);
        self.ranks[r].collect(WORLD, steps, bytes, &self.marks);
    }

    /// Restart ranks whose process ended (a clean close after its steps, or a failure a
    /// launcher would restart); check that the daemon is up.
    fn tend(&mut self, paced: bool) {
        for r in 0..self.ranks.len() {
            if self.ranks[r].stopped {
                continue; // reaped once it runs again
            }
            let Some(child) = self.ranks[r].child.as_mut() else {
                continue;
            };
            let Some(status) = child.try_wait().unwrap() else {
                continue;
            };
            self.ranks[r].child = None;
            self.collect(r);
            if !status.success() {
                let err = std::fs::read_to_string(format!("{}.err", self.ranks[r].out.display()))
                    .unwrap_or_default();
                self.failures
                    .push(format!("rank {r} ({status}): {}", err.trim()));
                assert!(
                    self.failures.len() < 50,
                    "taps keep failing: {:#?}",
                    self.failures
                );
            } else if !self.ranks[r].done {
                self.counts.clean_reopens += 1;
            }
            if !self.ranks[r].done {
                self.spawn_tap(r, paced);
            }
        }
        let daemon = self.daemon();
        if let Some(status) = daemon.child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(200));
            panic!("the daemon exited ({status}):\n{}", daemon.log_text());
        }
    }

    /// Tend the ranks until `done` says so, at most [`WAIT`].
    fn wait_until(&mut self, what: &str, mut done: impl FnMut(&mut Soak) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "soak: waited {WAIT:?} for {what}; failures {:#?}\ndaemon log:\n{}",
                self.failures,
                self.daemon_log()
            );
            self.tend(true);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Steps rank `r` has recorded so far (its processes' complete steps).
    fn progress(&self, r: usize) -> u64 {
        let rank = &self.ranks[r];
        let live = rank.child.as_ref().map_or(0, |_| {
            recorded(&rank.out)
                .iter()
                .filter(|l| l.get("chain").is_some())
                .count() as u64
        });
        rank.next + live
    }

    /// Every rank that is not done moves on by at least one step.
    fn wait_all_move(&mut self, what: &str) {
        let before: Vec<u64> = (0..self.ranks.len()).map(|r| self.progress(r)).collect();
        self.wait_until(what, |s| {
            (0..s.ranks.len()).all(|r| s.ranks[r].done || s.progress(r) > before[r])
        });
    }

    fn pid(&self, r: usize) -> Option<u32> {
        self.ranks[r].child.as_ref().map(Child::id)
    }

    fn kill_rank(&mut self, r: usize) {
        let Some(mut child) = self.ranks[r].child.take() else {
            return;
        };
        child.kill().unwrap();
        child.wait().unwrap();
        self.collect(r);
        self.counts.rank_kills += 1;
        if !self.ranks[r].done {
            // A restarted trainer: a new session, refused until the killed one's owner timeout.
            self.spawn_tap(r, true);
        }
        let before = self.progress(r);
        self.wait_until("a restarted rank's next step", |s| {
            s.ranks[r].done || s.progress(r) > before
        });
    }

    fn kill_daemon(&mut self) {
        self.counts.rank_owned_refusals +=
            self.metric("dsprep_replies_total{status=\"rank_owned\"}");
        let mut daemon = self.daemon.take().unwrap();
        self.rss_pid.store(0, Ordering::Relaxed);
        daemon.child.kill().unwrap();
        daemon.child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(100)); // the rest of its log
        self.logs.push(daemon.log_text());
        drop(daemon);
        self.counts.daemon_kills += 1;
        self.start_daemon(true);
        self.wait_all_move("every rank served by the resumed daemon");
    }

    fn signal(pid: u32, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {signal} {pid}");
    }

    /// Stop rank `r` for `millis`: the others may get at most `PREFETCH` steps past it.
    fn stall(&mut self, r: usize, millis: u64) {
        let Some(pid) = self.pid(r) else {
            return;
        };
        Soak::signal(pid, "-STOP");
        self.ranks[r].stopped = true;
        let held_at = self.progress(r);
        let until = Instant::now() + Duration::from_millis(millis);
        let mut furthest = 0;
        while Instant::now() < until {
            self.tend(true);
            for other in (0..self.ranks.len()).filter(|&o| o != r) {
                furthest = furthest.max(self.progress(other));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            furthest <= held_at + PREFETCH,
            "rank {r} stopped at {held_at}: another rank got to {furthest}, past the prefetch window"
        );
        self.counts.stalls += 1;
        // The stopped rank's position is its next step, or the one before while it waited
        // between steps: the others then stop one short of the window's end.
        self.counts.stalls_that_held_others += u64::from(furthest + 1 >= held_at + PREFETCH);
        Soak::signal(pid, "-CONT");
        self.ranks[r].stopped = false;
        let before = self.progress(r);
        self.wait_until("a stalled rank's next step", |s| {
            s.ranks[r].done || s.progress(r) > before
        });
    }

    /// The fewest steps any rank not done has recorded.
    fn slowest(&self) -> u64 {
        (0..self.ranks.len())
            .filter(|&r| !self.ranks[r].done)
            .map(|r| self.progress(r))
            .min()
            .unwrap_or(self.num_steps)
    }

    /// Fill the disk until a checkpoint write has failed while the ranks go on (or they have
    /// gone [`DISK_FULL_STEPS`] further: checkpoints follow the pipeline's snapshots, which a
    /// recipe of long documents spaces out), then free it until one is written again.
    fn disk_full(&mut self, disk: &Disk) {
        let count = |s: &mut Soak, needle: &str| s.daemon().log_text().matches(needle).count();
        let (failed, written) = (
            count(self, "CHECKPOINT NOT WRITTEN"),
            count(self, "written: step"),
        );
        disk.fill(&self.state, self.num_steps);
        let until = self.slowest() + DISK_FULL_STEPS;
        self.wait_until("a checkpoint write to fail on the full disk", |s| {
            count(s, "CHECKPOINT NOT WRITTEN") > failed || s.slowest() >= until
        });
        self.counts.checkpoint_failures_logged +=
            (count(self, "CHECKPOINT NOT WRITTEN") - failed) as u64;
        self.wait_all_move("the ranks served while the disk is full");
        disk.free(&self.state);
        let until = self.slowest() + DISK_FULL_STEPS;
        self.wait_until("a checkpoint written once there is room", |s| {
            count(s, "written: step") > written || s.slowest() >= until
        });
        self.counts.disk_full_episodes += 1;
    }
}

#[test]
fn ranks_and_the_daemon_killed_stalled_and_starved_of_disk_still_get_the_exact_stream() {
    let secs = count_from_env("DSPREP_SOAK_SECS", DEFAULT_SECS);
    let seed = seed_from_env("DSPREP_SOAK_SEED");
    println!("soak: {secs} s of faults, seed {seed:#x} (DSPREP_SOAK_SEED replays the schedule)");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    // The quickstart in windows of 129 tokens: about 2,000 steps of 8 ranks.
    let recipe = quickstart_variant(&dir, "soak.toml", &[("seq_len = 512", "seq_len = 128")]);
    let packed = pack_dataset(&recipe, &dir.join("packed"));
    let num_steps = packed.num_windows() / u64::from(WORLD);
    let disk = Disk::mount(&dir.join("disk"));
    let watcher = RssWatcher::start(0, Duration::from_millis(50));
    let state = dir.join("disk/state");
    let mut soak = Soak {
        endpoint: format!("ipc://{}", dir.join("d.sock").display()),
        dir,
        recipe,
        state,
        daemon: None,
        logs: Vec::new(),
        ranks: (0..WORLD)
            .map(|rank| Rank {
                tap: TapRank::new(rank),
                stopped: false,
                segments: Rng::new(seed ^ (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9)),
            })
            .collect(),
        marks: chain_marks(&packed, num_steps * u64::from(WORLD)),
        num_steps,
        step_bytes: packed.window(0).unwrap().tokens.as_bytes().len(),
        // Paced so that the stream lasts about as long as the faults go on.
        step_ms: (secs * 1000 / num_steps).max(5),
        rng: Rng::new(seed),
        counts: Counts::default(),
        failures: Vec::new(),
        rss_pid: Arc::clone(&watcher.pid),
    };
    soak.start_daemon(false);
    for r in 0..soak.ranks.len() {
        soak.spawn_tap(r, true);
    }
    soak.wait_all_move("every rank's first step");
    let rss_start = rss_bytes(soak.daemon().child.id()).unwrap();
    let started = Instant::now();
    let mut schedule = Vec::new();
    while started.elapsed() < Duration::from_secs(secs)
        && (0..soak.ranks.len()).all(|r| soak.progress(r) + 100 < num_steps)
    {
        let gap = Instant::now() + Duration::from_millis(soak.rng.between(500, 4000));
        while Instant::now() < gap {
            soak.tend(true);
            std::thread::sleep(Duration::from_millis(20));
        }
        let r = soak.rng.below(u64::from(WORLD)) as usize;
        match soak.rng.below(100) {
            0..=34 => {
                schedule.push(format!("kill rank {r}"));
                soak.kill_rank(r);
            }
            35..=59 => {
                schedule.push("kill the daemon".to_string());
                soak.kill_daemon();
            }
            60..=84 => {
                // Past the prefetch window: the others stop there, and wait.
                let millis = soak.rng.between(1_500, 5_000) + (PREFETCH + 1) * soak.step_ms;
                schedule.push(format!("stall rank {r} {millis} ms"));
                soak.stall(r, millis);
            }
            _ => {
                schedule.push("fill the disk".to_string());
                soak.disk_full(&disk);
            }
        }
    }
    // No more faults: the ranks finish unpaced.
    let deadline = Instant::now() + WAIT;
    while !soak.ranks.iter().all(|r| r.done) {
        assert!(Instant::now() < deadline, "the ranks did not finish");
        soak.tend(false);
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    soak.counts.rank_owned_refusals += soak.metric("dsprep_replies_total{status=\"rank_owned\"}");
    let mut daemon = soak.daemon.take().unwrap();
    daemon.terminate();
    soak.logs.push(daemon.log_text());
    let rss = watcher.finish();

    let mut compared = 0;
    for rank in &soak.ranks {
        let expected = expected_rank_bytes(&packed, u64::from(WORLD), 1, u64::from(rank.rank));
        assert_eq!(rank.received.len(), expected.len(), "rank {}", rank.rank);
        assert!(
            rank.received == expected,
            "rank {}: bytes differ",
            rank.rank
        );
        compared += expected.len();
    }
    for entry in std::fs::read_dir(&soak.dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "err") {
            let err = std::fs::read_to_string(&path).unwrap();
            assert!(!err.contains("panicked"), "{}: {err}", path.display());
        }
    }
    for log in &soak.logs {
        assert!(!log.contains("panicked"), "{log}");
        assert!(
            !log.contains("CHECKPOINT UNUSABLE"),
            "a torn checkpoint: {log}"
        );
    }
    for entry in std::fs::read_dir(&soak.state).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".ckpt") {
            CheckpointDir::read(&path).unwrap();
        }
    }
    let peak = rss.peak();
    let lives: u32 = soak.ranks.iter().map(|r| r.lives).sum();
    println!(
        "soak: seed {seed:#x}, {:.0} s; schedule {schedule:?}\n\
         soak: {} rank kills, {} daemon kills, {} stalls ({} in which the others reached the prefetch \
         window), {} disk-full episodes ({} checkpoint writes failed), {} clean reopens, {lives} \
         tap processes, {} rank-owned refusals; tap failures restarted: {:#?}\n\
         soak: {compared} bytes compared over {WORLD} ranks ({num_steps} steps each); daemon RSS \
         {:.1} MiB at the start, peak {:.1} MiB over {} samples (bound: start + {} MiB)",
        elapsed.as_secs_f64(),
        soak.counts.rank_kills,
        soak.counts.daemon_kills,
        soak.counts.stalls,
        soak.counts.stalls_that_held_others,
        soak.counts.disk_full_episodes,
        soak.counts.checkpoint_failures_logged,
        soak.counts.clean_reopens,
        soak.counts.rank_owned_refusals,
        soak.failures,
        rss_start as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        rss.len(),
        RSS_MARGIN / MIB
    );
    assert!(
        peak <= rss_start + RSS_MARGIN,
        "the daemon's RSS peaked at {peak} bytes, over {rss_start} + {RSS_MARGIN}"
    );
    assert!(
        soak.failures.is_empty(),
        "taps failed: {:#?}",
        soak.failures
    );
}

impl Drop for Soak {
    /// A failing soak leaves no process behind: stopped ranks are continued, then all killed.
    fn drop(&mut self) {
        for rank in &mut self.ranks {
            let stopped = rank.stopped;
            if let Some(child) = rank.tap.child.as_mut() {
                if stopped {
                    let _ = Command::new("kill")
                        .args(["-CONT", &child.id().to_string()])
                        .status();
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
