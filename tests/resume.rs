//! Exact resume, end to end: real daemons killed with SIGKILL (or stopped with SIGTERM) and
//! restarted with `--resume latest`, real `dsprep tap` ranks. What the ranks receive across the
//! interruptions must be exactly the uninterrupted stream, which `dsprep pack` writes (tests/serve.rs
//! checks that an uninterrupted daemon serves the packed windows).
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep::checkpoint::CheckpointDir;
use std::path::{Path, PathBuf};
use support::daemon::tap;
use support::serve_run::{Run, global_batches};
use support::*;

/// The quickstart with another shuffle buffer, mixed in documents or in tokens, written with
/// absolute paths into `dir`.
fn quickstart_with_buffer(dir: &Path, buffer: usize, unit: &str) -> PathBuf {
    quickstart_variant(
        dir,
        &format!("quickstart-buffer{buffer}-{unit}.toml"),
        &[
            ("buffer_size = 1000", &format!("buffer_size = {buffer}")),
            ("[mix]\n", &format!("[mix]\nunit = {unit:?}\n")),
        ],
    )
}

#[test]
fn killed_and_resumed_daemons_serve_exactly_the_uninterrupted_stream() {
    // The mix in tokens has a phase boundary at 400 k tokens (step ~195 of 366): the daemon is
    // killed before it (step 151) and after it (step 292).
    for (buffer, unit) in [(1000, "documents"), (0, "documents"), (1000, "tokens")] {
        let tmp = tempfile::tempdir().unwrap();
        let recipe = match unit {
            "tokens" => quickstart_with_a_phase(tmp.path(), 400_000),
            _ => quickstart_with_buffer(tmp.path(), buffer, unit),
        };
        let dataset = pack_dataset(&recipe, &tmp.path().join("packed"));
        let (world, mb) = (2u32, 2u64);
        let gb = u64::from(world) * mb;
        let num_steps = dataset.num_windows() / gb;
        let run = Run {
            dir: tmp.path(),
            recipe: &recipe,
            state: tmp.path().join("state"),
            every: 7,
        };
        // Stop points: before the first checkpoint (resume recomputes from the start), in the
        // middle (after the small sources' first passes ended: `all_exhausted` restarts them),
        // then a graceful stop, then the rest.
        let stops = [3, 151, num_steps * 4 / 5, num_steps];
        let mut got = Vec::new();
        let mut from = 0;
        for (k, &to) in stops.iter().enumerate() {
            let mut daemon = run.start(world, mb as u32, k > 0).unwrap();
            got.extend(run.pull(&daemon, world, from, to - from));
            if k > 0 {
                let log = daemon.log_text();
                let resumed = log.contains("resuming from checkpoint");
                assert_eq!(resumed, from >= 7, "buffer {buffer}, from {from}:\n{log}");
                // The windows recomputed before the first step held show as progress (a line
                // before the last of them, and one when done).
                let windows: u64 = log
                    .split("fast-forwarding ")
                    .nth(1)
                    .and_then(|rest| rest.split(' ').next()?.parse().ok())
                    .unwrap_or(0);
                if windows > 1 {
                    assert!(
                        log.contains("resume progress: resume: fast-forwarding, window 1 of "),
                        "{log}"
                    );
                    assert!(log.contains("resume: fast-forward of "), "{log}");
                }
            }
            if k == 2 {
                daemon.terminate();
            }
            drop(daemon); // SIGKILL
            from = to;
        }
        assert_eq!(got.len() as u64, num_steps * gb * 513 * 2);
        assert!(
            got == global_batches(&dataset, gb, 0..num_steps),
            "buffer {buffer}: the resumed stream differs from the uninterrupted one"
        );
        // The last checkpoints are past an `all_exhausted` restart: passes are in the state.
        let dir = CheckpointDir::open(&run.state, 3).unwrap();
        let (_, newest) = dir.list().unwrap().pop().unwrap();
        let (meta, state) = CheckpointDir::read(&newest).unwrap();
        assert!(meta.step > 151);
        assert!(
            state.stream.sources.iter().any(|s| s.pass > 0),
            "some source has restarted: {:?}",
            state.stream.sources
        );
        assert_eq!(
            state.stream.buffered.len(),
            buffer.min(state.stream.buffered.len())
        );
        assert_eq!(dir.list().unwrap().len(), 3, "the last 3 are kept");
    }
}

#[test]
fn world_size_changes_that_keep_the_global_batch_keep_every_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let run = Run {
        dir: tmp.path(),
        recipe: &quickstart(),
        state: tmp.path().join("state"),
        every: 5,
    };
    let mut got = Vec::new();
    for (k, (world, mb, from, to)) in [(8u32, 1u64, 0u64, 40u64), (4, 2, 40, 90), (2, 4, 90, 140)]
        .into_iter()
        .enumerate()
    {
        let daemon = run.start(world, mb as u32, k > 0).unwrap();
        got.extend(run.pull(&daemon, world, from, to - from));
    }
    assert!(
        got == global_batches(&dataset, 8, 0..140),
        "the global batches changed"
    );

    // A change that cannot be honoured is refused before anything is served.
    let err = run.start(3, 2, true).err().unwrap();
    let newest = CheckpointDir::open(&run.state, 3)
        .unwrap()
        .list()
        .unwrap()
        .pop()
        .unwrap()
        .1;
    assert!(
        err.contains(&format!(
            "error: cannot resume from checkpoint {}: its global batch is 8 windows (world size 2 \
             × micro batch 4), this run's is 6 (3 × 2): steps would cover other windows; keep \
             world size × micro batch = 8",
            newest.display()
        )),
        "{err}"
    );
    // So is a fresh start on a directory that holds a run's checkpoints.
    let err = run.start(2, 4, false).err().unwrap();
    assert!(
        err.contains(&format!(
            "holds checkpoints of an earlier run (newest: step {}); pass --resume latest",
            newest.file_stem().unwrap().to_str().unwrap()["step-".len()..]
                .parse::<u64>()
                .unwrap()
        )),
        "{err}"
    );
}

#[test]
fn a_corrupt_latest_checkpoint_falls_back_to_the_previous_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let run = Run {
        dir: tmp.path(),
        recipe: &quickstart(),
        state: tmp.path().join("state"),
        every: 5,
    };
    let mut got = Vec::new();
    {
        let daemon = run.start(1, 2, false).unwrap();
        got.extend(run.pull(&daemon, 1, 0, 300));
    }
    // Tear the newest checkpoint that would serve step 300.
    let dir = CheckpointDir::open(&run.state, 3).unwrap();
    let list = dir.list().unwrap();
    let usable: Vec<&(u64, PathBuf)> = list.iter().filter(|(s, _)| *s <= 300).collect();
    assert!(usable.len() >= 2, "{list:?}");
    let (torn_step, torn) = usable[usable.len() - 1];
    let (previous_step, _) = usable[usable.len() - 2];
    let mut bytes = std::fs::read(torn).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(torn, bytes).unwrap();

    let daemon = run.start(1, 2, true).unwrap();
    got.extend(run.pull(&daemon, 1, 300, 40));
    let log = daemon.log_text();
    assert!(
        log.contains(&format!(
            "CHECKPOINT UNUSABLE, falling back to an older one: checkpoint {}: checksum mismatch",
            torn.display()
        )),
        "{log}"
    );
    assert!(log.contains(&format!("(step {previous_step}, ")), "{log}");
    assert!(*torn_step > *previous_step);
    assert!(got == global_batches(&dataset, 2, 0..340));
}

/// A full disk fails checkpoint writes, not the daemon: it logs each failure, keeps serving the
/// ranks their exact bytes, writes checkpoints again once there is room, and resumes from them.
/// It used to stop its pipeline on the first failed write, and every rank then got "the daemon's
/// pipeline failed". The disk is "full" for the checkpoint files only: their temporary names are
/// links to /dev/full, whose writes fail with ENOSPC (the fault soak, tests/soak.rs, fills a real
/// tmpfs).
#[test]
fn a_full_disk_fails_checkpoints_not_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let run = Run {
        dir: tmp.path(),
        recipe: &quickstart(),
        state: tmp.path().join("state"),
        every: 2,
    };
    std::fs::create_dir_all(&run.state).unwrap();
    let full: Vec<PathBuf> = (0..=400)
        .map(|step| run.state.join(format!(".step-{step:012}.ckpt.tmp")))
        .collect();
    for link in &full {
        std::os::unix::fs::symlink("/dev/full", link).unwrap();
    }
    let daemon = run.start(2, 2, false).unwrap();
    let num_steps = dataset.num_windows() / 4;
    // Snapshots fall between documents: how many steps in the first write comes depends on the
    // documents' sizes. The ranks pull until one write has failed …
    let (mut got, mut at) = (Vec::new(), 0);
    while !daemon
        .log_text()
        .contains("CHECKPOINT NOT WRITTEN, serving goes on")
    {
        assert!(
            at < num_steps / 2,
            "no checkpoint was tried:\n{}",
            daemon.log_text()
        );
        got.extend(run.pull(&daemon, 2, at, 20));
        at += 20;
    }
    assert!(
        daemon.log_text().contains("No space left on device"),
        "{}",
        daemon.log_text()
    );
    let dir = CheckpointDir::open(&run.state, 3).unwrap();
    assert!(dir.list().unwrap().is_empty(), "no checkpoint was written");

    // … then there is room again: checkpoints are written, and a killed daemon resumes from them.
    for link in &full {
        let _ = std::fs::remove_file(link);
    }
    while !daemon.log_text().contains("written: step") {
        assert!(
            at < num_steps - 20,
            "no checkpoint was written:\n{}",
            daemon.log_text()
        );
        got.extend(run.pull(&daemon, 2, at, 20));
        at += 20;
    }
    let written = dir.list().unwrap();
    assert!(!written.is_empty());
    for (_, path) in &written {
        CheckpointDir::read(path).unwrap();
    }
    drop(daemon); // SIGKILL
    let mut resumed = run.start(2, 2, true).unwrap();
    got.extend(run.pull(&resumed, 2, at, 20));
    assert!(resumed.log_text().contains("resuming from checkpoint"));
    assert!(
        got == global_batches(&dataset, 4, 0..at + 20),
        "the ranks got the uninterrupted stream"
    );
    resumed.terminate(); // not in the middle of a write while the directory is listed
    let leftovers: Vec<_> = std::fs::read_dir(&run.state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A rank whose request was lost with a killed daemon asks the resumed one again only after its
/// timeout, later than the others: the resumed daemon has started at the lowest step asked by
/// then (5 s after the first request), above this rank's. It used to refuse the rank ("step 120
/// is no longer held: the oldest step held is 123"), so the rank could never go on; it now holds
/// the steps below the start that an uninterrupted daemon would (8, as far as its checkpoint
/// reaches), and serves the late rank its exact bytes.
#[test]
fn a_rank_that_asks_late_after_a_resume_gets_the_steps_the_others_passed() {
    let tmp = tempfile::tempdir().unwrap();
    let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let run = Run {
        dir: tmp.path(),
        recipe: &quickstart(),
        state: tmp.path().join("state"),
        every: 5,
    };
    let daemon = run.start(2, 2, false).unwrap();
    run.pull(&daemon, 2, 0, 120);
    // Rank 0 runs 3 steps ahead (within the prefetch window of 4), then the daemon dies.
    let ahead = tap(
        &daemon.endpoint,
        0,
        2,
        120,
        3,
        &tmp.path().join("ahead.bin"),
    );
    assert!(ahead.wait_with_output().unwrap().status.success());
    let checkpoints = CheckpointDir::open(&run.state, 3).unwrap().list().unwrap();
    assert!(
        checkpoints.first().is_some_and(|(step, _)| *step <= 115),
        "{checkpoints:?}"
    );
    drop(daemon); // SIGKILL

    let resumed = run.start(2, 2, true).unwrap();
    let first = tap(&resumed.endpoint, 0, 2, 123, 3, &tmp.path().join("r0.bin"));
    assert!(first.wait_with_output().unwrap().status.success());
    assert!(
        resumed
            .log_text()
            .contains("the first request is for step 123")
    );
    let late = tap(&resumed.endpoint, 1, 2, 120, 6, &tmp.path().join("r1.bin"));
    let out = late.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the late rank is served: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Vec<u8> = (120..126)
        .flat_map(|step| (2..4).map(move |w| step * 4 + w))
        .flat_map(|w| dataset.window(w).unwrap().tokens.as_bytes().to_vec())
        .collect();
    assert!(std::fs::read(tmp.path().join("r1.bin")).unwrap() == expected);
}

#[test]
fn a_graceful_stop_writes_a_checkpoint_the_ranks_can_resume_from() {
    // (world, micro batch, steps before the stop, where the checkpoint may lie): at or below the
    // slowest rank's last step, never ahead of it, as close below as the documents' ends allow
    // (the quickstart's longest document spans under 30 steps of 1 × 2 windows, under 16 of
    // 2 × 2). The second is early in the stream, where a SIGTERM used to write none.
    for (world, mb, stop, near) in [(1u32, 2u64, 300u64, 270..=299), (2, 2, 30, 14..=29)] {
        let tmp = tempfile::tempdir().unwrap();
        let dataset = pack_dataset(&quickstart(), &tmp.path().join("packed"));
        let run = Run {
            dir: tmp.path(),
            recipe: &quickstart(),
            state: tmp.path().join("state"),
            every: 1_000_000, // never periodically: only the stop writes one
        };
        let mut daemon = run.start(world, mb as u32, false).unwrap();
        let mut got = run.pull(&daemon, world, 0, stop);
        daemon.terminate();
        let list = CheckpointDir::open(&run.state, 3).unwrap().list().unwrap();
        assert_eq!(list.len(), 1, "{list:?}\n{}", daemon.log_text());
        let step = list[0].0;
        assert!(near.contains(&step), "{step}\n{}", daemon.log_text());
        let daemon = run.start(world, mb as u32, true).unwrap();
        got.extend(run.pull(&daemon, world, stop, 10));
        assert!(daemon.log_text().contains(&format!("(step {step}, ")));
        let gb = u64::from(world) * mb;
        assert!(got == global_batches(&dataset, gb, 0..stop + 10));
    }
}

/// `dsprep pack --recipe config/quickstart.toml --out OUT --quiet EXTRA…` as a child process.
fn pack_quickstart(out: &Path, extra: &[&str]) -> std::process::Output {
    pack_recipe(&quickstart(), out, extra)
}

/// `dsprep pack --recipe RECIPE --out OUT --quiet EXTRA…` as a child process.
fn pack_recipe(recipe: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let out = out.to_str().unwrap().to_string();
    let mut args = vec![
        "pack",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        &out,
        "--quiet",
    ];
    args.extend(extra);
    support::dsprep(&args)
}

/// [`pack_quickstart`], which must succeed; returns its stderr.
fn pack_quickstart_ok(out: &Path, extra: &[&str]) -> String {
    pack_recipe_ok(&quickstart(), out, extra)
}

/// [`pack_recipe`], which must succeed; returns its stderr.
fn pack_recipe_ok(recipe: &Path, out: &Path, extra: &[&str]) -> String {
    let done = pack_recipe(recipe, out, extra);
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "{stderr}");
    stderr
}

/// Every file of a packed directory, by name.
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_killed_pack_continues_where_it_stopped_and_writes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    killed_pack_continues(tmp.path(), &quickstart());
}

#[test]
fn a_killed_pack_mixed_in_tokens_continues_where_it_stopped_and_writes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    killed_pack_continues(tmp.path(), &quickstart_in_tokens(tmp.path()));
}

/// `best_fit`: the pool is in the checkpoint, and the padding's counts file is cut back with the
/// others.
#[test]
fn a_killed_best_fit_pack_continues_where_it_stopped_and_writes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let replace = [("seq_len = 512", "seq_len = 512\nstrategy = \"best_fit\"")];
    let recipe = quickstart_variant(tmp.path(), "bf.toml", &replace);
    killed_pack_continues(tmp.path(), &recipe);
}

/// The kill comes after the first 1 MiB shard (~524 k tokens): past a phase boundary at 300 k
/// tokens, and before one at 1 M, which the resumed pack then crosses.
#[test]
fn a_killed_pack_with_phases_continues_on_either_side_of_the_boundary() {
    for at_tokens in [300_000, 1_000_000] {
        let tmp = tempfile::tempdir().unwrap();
        killed_pack_continues(tmp.path(), &quickstart_with_a_phase(tmp.path(), at_tokens));
    }
}

/// Pack `recipe`, SIGKILLed once it has checkpointed past its first shard, then again: the
/// second run continues and writes the bytes of an uninterrupted pack.
fn killed_pack_continues(dir: &Path, recipe_path: &Path) {
    let recipe = recipe_path.to_str().unwrap();
    let whole = dir.join("whole");
    pack_recipe_ok(recipe_path, &whole, &["--shard-mib", "1"]);

    let out = dir.join("out");
    let checkpoint = dir.join("out.partial/checkpoint.ckpt");
    let mut killed_at = None;
    for _attempt in 0..5 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"))
            .args([
                "pack",
                "--recipe",
                recipe,
                "--out",
                out.to_str().unwrap(),
                "--quiet",
            ])
            .args([
                "--shard-mib",
                "1",
                "--checkpoint-secs",
                "0",
                "--threads",
                "1",
                "--fresh",
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill it (SIGKILL) once it has checkpointed past its first shard.
        let mut checkpointed = false;
        while child.try_wait().unwrap().is_none() {
            if let Ok((meta, _)) = read_pack_checkpoint(&checkpoint)
                && meta["writer"]["closed_shards"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty())
            {
                checkpointed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if checkpointed && !out.exists() {
            killed_at =
                Some(read_pack_checkpoint(&checkpoint).unwrap().0["writer"]["num_windows"].clone());
            break;
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    let killed_at = killed_at.expect("a pack killed after its first checkpoint");

    let stderr = pack_recipe_ok(recipe_path, &out, &["--shard-mib", "1"]);
    assert!(
        stderr.contains(&format!(
            "continuing the interrupted pack in {}.partial at window {killed_at}",
            out.display()
        )),
        "{stderr}"
    );
    assert!(!dir.join("out.partial").exists());
    let (got, want) = (files_of(&out), files_of(&whole));
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        want.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert!(a == b, "{name} differs from the uninterrupted pack's");
    }
    dsprep_ok(&["verify", out.to_str().unwrap()]);
}

/// The JSON metadata of a pack checkpoint (its state is not needed here).
fn read_pack_checkpoint(path: &Path) -> Result<(serde_json::Value, ()), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    dsprep_mixers::checkpoint::decode::<serde_json::Value>(&bytes)
        .map(|(meta, _)| (meta, ()))
        .map_err(|e| e.to_string())
}

#[test]
fn a_changed_shard_list_is_refused_on_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let fw = tmp.path().join("fw");
    std::fs::create_dir_all(&fw).unwrap();
    let samples = repo_root().join("config/samples/fineweb-edu/sample/10BT");
    for name in ["000_00000.parquet", "001_00000.parquet"] {
        std::fs::copy(samples.join(name), fw.join(name)).unwrap();
    }
    let text = std::fs::read_to_string(quickstart_with_buffer(tmp.path(), 1000, "documents"))
        .unwrap()
        .replace(
            &format!(
                "{}/samples/fineweb-edu/sample/10BT",
                repo_root().join("config").display()
            ),
            &fw.display().to_string(),
        );
    let recipe = tmp.path().join("copied.toml");
    std::fs::write(&recipe, text).unwrap();
    let run = Run {
        dir: tmp.path(),
        recipe: &recipe,
        state: tmp.path().join("state"),
        every: 5,
    };
    {
        let daemon = run.start(1, 2, false).unwrap();
        run.pull(&daemon, 1, 0, 300);
    }
    assert!(
        !CheckpointDir::open(&run.state, 3)
            .unwrap()
            .list()
            .unwrap()
            .is_empty()
    );
    // A file appears under the source's glob: the shard order the checkpoint refers to is gone.
    std::fs::copy(
        samples.join("000_00000.parquet"),
        fw.join("002_00000.parquet"),
    )
    .unwrap();
    let err = run.start(1, 2, true).err().unwrap();
    assert!(
        err.contains("source 0's shards differ from the checkpoint's (it listed 2 shards, now 3;"),
        "{err}"
    );
}

#[test]
fn a_second_pack_to_the_same_output_is_refused_while_one_holds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let partial = tmp.path().join("out.partial");
    std::fs::create_dir_all(&partial).unwrap();
    let lock = std::fs::File::create(partial.join(".lock")).unwrap();
    lock.try_lock().unwrap(); // as a running pack holds it
    let failed = pack_quickstart(&out, &[]);
    assert!(!failed.status.success());
    let err = String::from_utf8_lossy(&failed.stderr);
    assert_eq!(
        err.trim(),
        format!(
            "error: another dsprep pack is writing {} (it holds {})",
            partial.display(),
            partial.join(".lock").display()
        )
    );
    assert!(
        partial.join(".lock").exists(),
        "the other pack's directory is left alone"
    );
    assert!(!out.exists());
}

#[test]
fn a_pack_with_an_unusable_checkpoint_starts_over_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    pack_quickstart_ok(&whole, &[]);
    let out = tmp.path().join("out");
    let partial = tmp.path().join("out.partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(
        partial.join("checkpoint.ckpt"),
        b"not a checkpoint at all, 40 bytes long..",
    )
    .unwrap();
    std::fs::write(partial.join("tokens-00000.bin"), b"stale").unwrap();
    let stderr = pack_quickstart_ok(&out, &[]);
    assert!(
        stderr.contains(&format!(
            "not continuing the interrupted pack in {}: checkpoint {}: not a dsprep checkpoint (bad magic); starting over",
            partial.display(),
            partial.join("checkpoint.ckpt").display()
        )),
        "{stderr}"
    );
    assert!(
        files_of(&out) == files_of(&whole),
        "a fresh start writes the same bytes"
    );
}
