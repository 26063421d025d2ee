//! The fault soak of node daemons and of array-task parts (the single daemon's is `soak.rs`).
//!
//! Node daemons: the multinode recipe (`[lanes]`, 8 lanes) at seq_len 128, served to 8 real
//! `dsprep tap` ranks by node daemons that a seeded schedule SIGKILLs one at a time (the node
//! restarted alone with `--resume latest` while the others serve) or all at once (the job
//! restarted on another node count: 1, 2 or 4 nodes). Ranks reopen after every clean close and
//! every failure, from the step after their last complete one, holding the daemons to the chain
//! they saved. At the end every rank's bytes equal its slice of `dsprep pack`, and every step's
//! rows were checked against the packed stream's chain.
//!
//! Parts: `dsprep pack --part i --parts 4` on a tmpfs, one part first on a full disk (it fails,
//! saying so), then every part SIGKILLed at seeded moments and run again until it completes;
//! `--finish` then writes the bytes of one pack and `dsprep verify` passes.
//!
//! `DSPREP_SOAK_SEED` replays a schedule (the seed is printed). `DSPREP_NODE_SOAK_SEQ_LEN`
//! (default 128) sets the windows' length: smaller windows make a longer stream and a longer
//! soak (CONTRIBUTING.md "Fault soak and wire fuzz").
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::daemon::{Daemon, chain_marks, expected_rank_bytes};
use support::nodes::multinode;
use support::taps::TapRank;
use support::watch::{Rng, count_from_env, seed_from_env};
use support::{dir_bytes, dsprep_ok, pack_dataset, recipe_variant};

const WORLD: u32 = 8;
const NODE_COUNTS: [u32; 3] = [1, 2, 4];
/// No wait for the ranks' progress may take longer.
const WAIT: Duration = Duration::from_secs(120);

fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[derive(Debug, Default)]
struct Counts {
    node_kills: u64,
    job_restarts: u64,
    node_counts: Vec<u32>,
    tap_failures: u64,
    clean_reopens: u64,
}

struct Job {
    dir: PathBuf,
    recipe: PathBuf,
    state: PathBuf,
    nodes: u32,
    /// Bumped at every job restart: each generation's sockets have names of their own.
    generation: u32,
    daemons: Vec<Daemon>,
    ranks: Vec<TapRank>,
    marks: Vec<String>,
    num_steps: u64,
    step_bytes: usize,
    rng: Rng,
    counts: Counts,
}

impl Job {
    fn endpoint(&self, node: u32) -> String {
        let socket = format!("g{}-n{node}.sock", self.generation);
        format!("ipc://{}", self.dir.join(socket).display())
    }

    fn start_node(&self, node: u32, resume: bool) -> Daemon {
        let (nodes, rank, state) = (
            self.nodes.to_string(),
            node.to_string(),
            self.state.display().to_string(),
        );
        let mut args = vec![
            "--world-size",
            "8",
            "--micro-batch",
            "1",
            "--node-rank",
            &rank,
            "--nodes",
            &nodes,
            "--state-dir",
            &state,
            "--checkpoint-every",
            "3",
            "--keep-checkpoints",
            "4",
            "--prefetch",
            "4",
            "--owner-timeout",
            "2",
            "--metrics",
            "off",
            "--threads",
            "1",
        ];
        if resume {
            args.extend(["--resume", "latest"]);
        }
        Daemon::start_with(&self.recipe, &self.endpoint(node), &args)
            .unwrap_or_else(|log| panic!("node {node} of {} did not start: {log}", self.nodes))
    }

    /// Start every node daemon of a job on `nodes` nodes.
    fn start_job(&mut self, nodes: u32, resume: bool) {
        self.generation += 1;
        self.nodes = nodes;
        self.counts.node_counts.push(nodes);
        self.daemons = (0..nodes).map(|n| self.start_node(n, resume)).collect();
    }

    fn spawn_tap(&mut self, r: usize) {
        let per_node = WORLD / self.nodes;
        let endpoint = self.endpoint(r as u32 / per_node);
        let steps = self.rng.between(2, 8);
        let dir = self.dir.clone();
        self.ranks[r].spawn(&dir, &endpoint, WORLD, steps, &["--timeout-s", "5"]);
    }

    fn collect(&mut self, r: usize) {
        let (steps, bytes) = (self.num_steps, self.step_bytes);
        self.ranks[r].collect(WORLD, steps, bytes, &self.marks);
    }

    /// Reopen every rank whose tap ended (a clean close, or a failure a launcher restarts).
    fn tend(&mut self) {
        for r in 0..self.ranks.len() {
            let Some(child) = self.ranks[r].child.as_mut() else {
                continue;
            };
            let Some(status) = child.try_wait().unwrap() else {
                continue;
            };
            self.ranks[r].child = None;
            self.collect(r);
            if status.success() {
                self.counts.clean_reopens += u64::from(!self.ranks[r].done);
            } else {
                self.counts.tap_failures += 1;
            }
            if !self.ranks[r].done {
                self.spawn_tap(r);
            }
        }
    }

    fn all_done(&self) -> bool {
        self.ranks.iter().all(|r| r.done)
    }

    /// The fewest steps a rank has completed.
    fn slowest(&self) -> u64 {
        self.ranks.iter().map(|r| r.next).min().unwrap_or(0)
    }

    /// Tend the ranks for `time`, or until every rank is done.
    fn run_for(&mut self, time: Duration) {
        let until = Instant::now() + time;
        while Instant::now() < until && !self.all_done() {
            self.tend();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Tend the ranks until the slowest moves past `from`, at most [`WAIT`].
    fn wait_progress(&mut self, from: u64, what: &str) {
        let deadline = Instant::now() + WAIT;
        while self.slowest() <= from && !self.all_done() {
            assert!(
                Instant::now() < deadline,
                "{what}: no progress past step {from} in {WAIT:?}; logs:\n{}",
                self.logs()
            );
            self.tend();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn logs(&self) -> String {
        self.daemons
            .iter()
            .map(Daemon::log_text)
            .collect::<Vec<_>>()
            .join("\n---\n")
    }

    /// SIGKILL node `node` and start it again alone, resuming.
    fn kill_node(&mut self, node: usize) {
        kill9(&mut self.daemons[node].child);
        self.counts.node_kills += 1;
        self.daemons[node] = self.start_node(node as u32, true);
        let from = self.slowest();
        self.wait_progress(from, "after a node daemon was killed and restarted");
    }

    /// SIGKILL every daemon and every rank (the job dies), and restart on `nodes` nodes.
    fn restart_job(&mut self, nodes: u32) {
        for daemon in &mut self.daemons {
            kill9(&mut daemon.child);
        }
        for r in 0..self.ranks.len() {
            if let Some(mut child) = self.ranks[r].child.take() {
                kill9(&mut child);
                self.collect(r);
            }
        }
        self.counts.job_restarts += 1;
        self.start_job(nodes, true);
        for r in 0..self.ranks.len() {
            if !self.ranks[r].done {
                self.spawn_tap(r);
            }
        }
        let from = self.slowest();
        self.wait_progress(from, "after the job restarted on another node count");
    }
}

#[test]
fn node_daemons_killed_one_and_all_at_random_serve_every_rank_the_packed_stream() {
    let seed = seed_from_env("DSPREP_SOAK_SEED");
    let seq_len = count_from_env("DSPREP_NODE_SOAK_SEQ_LEN", 128);
    println!("node soak: seed {seed}, seq_len {seq_len} (DSPREP_SOAK_SEED replays it)");
    let tmp = tempfile::tempdir().unwrap();
    let recipe = recipe_variant(
        &multinode(),
        tmp.path(),
        "soak.toml",
        &[("seq_len = 512", &format!("seq_len = {seq_len}"))],
    );
    let whole = pack_dataset(&recipe, &tmp.path().join("whole"));
    let num_steps = whole.num_windows() / u64::from(WORLD);
    assert!(
        num_steps > 40,
        "{num_steps} steps: too short a stream to soak"
    );
    let mut job = Job {
        dir: tmp.path().to_path_buf(),
        recipe,
        state: tmp.path().join("state"),
        nodes: 0,
        generation: 0,
        daemons: Vec::new(),
        ranks: (0..WORLD).map(TapRank::new).collect(),
        marks: chain_marks(&whole, whole.num_windows()),
        num_steps,
        step_bytes: (seq_len as usize + 1) * 2,
        rng: Rng::new(seed),
        counts: Counts::default(),
    };
    let first = NODE_COUNTS[job.rng.below(3) as usize];
    job.start_job(first, false);
    for r in 0..job.ranks.len() {
        job.spawn_tap(r);
    }
    while !job.all_done() {
        let pause = Duration::from_millis(job.rng.between(200, 1200));
        job.run_for(pause);
        if job.all_done() {
            break;
        }
        if job.rng.percent(60) {
            let node = job.rng.below(u64::from(job.nodes)) as usize;
            job.kill_node(node);
        } else {
            let nodes = NODE_COUNTS[job.rng.below(3) as usize];
            job.restart_job(nodes);
        }
    }
    println!("node soak: {num_steps} steps, {:?}", job.counts);
    for rank in &job.ranks {
        let want = expected_rank_bytes(&whole, u64::from(WORLD), 1, u64::from(rank.rank));
        assert!(
            rank.received == want,
            "rank {}: {} bytes received over {} taps, {} expected",
            rank.rank,
            rank.received.len(),
            rank.lives,
            want.len()
        );
    }
    assert!(
        job.counts.node_kills + job.counts.job_restarts > 0,
        "no fault happened"
    );
    for daemon in &mut job.daemons {
        daemon.terminate();
    }
}

/// A tmpfs mounted at a path for the test's time.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(&at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            mounted,
            "this soak fills a disk: it mounts a tmpfs, which needs root"
        );
        Tmpfs(at)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn array_task_parts_killed_at_random_and_on_a_full_disk_finish_to_the_bytes_of_one_pack() {
    let seed = seed_from_env("DSPREP_SOAK_SEED");
    println!("parts soak: seed {seed} (DSPREP_SOAK_SEED replays it)");
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let recipe = multinode().to_str().unwrap().to_string();
    dsprep_ok(&[
        "pack",
        "--recipe",
        &recipe,
        "--out",
        whole.to_str().unwrap(),
        "--quiet",
    ]);
    let disk = Tmpfs::mount(tmp.path().join("disk"), 64 << 20);
    let out = disk.0.join("out");
    let out_s = out.to_str().unwrap().to_string();
    let part_cmd = |part: u32| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dsprep"));
        c.args(["pack", "--recipe", &recipe, "--out", &out_s, "--quiet"])
            .args(["--part", &part.to_string(), "--parts", "4"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };

    // A full disk: the part fails, says why, and leaves no lane looking complete.
    let filler = disk.0.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 1 << 16];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&block[..64]).is_ok() {}
    }
    let full = part_cmd(1).output().unwrap();
    let stderr = String::from_utf8_lossy(&full.stderr);
    assert!(!full.status.success(), "a part on a full disk fails");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let lanes = disk.0.join("out.lanes");
    for lane in ["lane-00002", "lane-00003"] {
        assert!(
            !lanes.join(lane).exists(),
            "{lane} looks complete after a full disk"
        );
    }
    std::fs::remove_file(&filler).unwrap();

    // Every part killed at seeded moments, run again until it completes.
    let mut kills = 0;
    let mut done = [false; 4];
    let mut rounds = 0;
    while done.iter().any(|d| !d) {
        rounds += 1;
        assert!(rounds < 200, "parts do not complete");
        for part in 0..4u32 {
            if done[part as usize] {
                continue;
            }
            let mut child = part_cmd(part).spawn().unwrap();
            // The first round kills every part within its first 100 ms; later ones at random.
            let (wait, kill) = match rounds {
                1 => (rng.between(0, 100), true),
                _ => (rng.between(0, 300), rng.percent(70)),
            };
            std::thread::sleep(Duration::from_millis(wait));
            if child.try_wait().unwrap().is_none() && kill {
                kill9(&mut child);
                kills += 1;
                continue;
            }
            let result = child.wait_with_output().unwrap();
            assert!(
                result.status.success(),
                "part {part}: {}",
                String::from_utf8_lossy(&result.stderr)
            );
            done[part as usize] = true;
        }
    }
    println!("parts soak: {kills} parts killed over {rounds} rounds");
    assert!(kills > 0, "no part was killed");
    dsprep_ok(&[
        "pack", "--recipe", &recipe, "--out", &out_s, "--quiet", "--finish",
    ]);
    let (got, want) = (dir_bytes(&out), dir_bytes(&whole));
    let differ: Vec<&String> = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| &a.0)
        .collect();
    assert!(
        got.len() == want.len() && differ.is_empty(),
        "parts killed at random, then a finish, wrote other bytes than one pack: {differ:?} \
         ({} files against {})",
        got.len(),
        want.len()
    );
    let verified = dsprep_ok(&["verify", &out_s]);
    assert!(verified.starts_with("ok: "), "{verified}");
}
