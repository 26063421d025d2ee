//! What every failure of `dsprep pack` leaves, with the real binary: `OUT.partial` is removed
//! unless it holds a checkpoint to continue from, a lane part's `OUT.lanes` is kept while it
//! holds complete lanes, and the error's last line says which. The paths here are the ones the
//! other tests do not reach: a writer that fails to start (plain pack, lane, finish), and a
//! pack that fails to continue from its checkpoint. Then what a job of parts leaves for
//! `dsprep pack --status` and the finish (each part's state, the resubmission below
//! `MaxArraySize`, many parts per Slurm task), and bad input to them, each with its one error.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::path::{Path, PathBuf};
use support::*;

/// The last line of a failed run's stderr, and that it failed with exit code 1.
fn failed_last_line(args: &[&str]) -> (String, String) {
    let out = dsprep(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    (stderr, last)
}

/// Make the writer fail right after it takes `partial`'s lock: a directory where it creates
/// the document index.
fn block_the_writer(partial: &Path) {
    std::fs::create_dir_all(partial.join("doc_starts.u32/in-the-way")).unwrap();
}

#[test]
fn a_pack_whose_writer_fails_to_start_removes_its_partial_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = quickstart();
    let out = tmp.path().join("out");
    let partial = tmp.path().join("out.partial");
    block_the_writer(&partial);
    let (stderr, last) = failed_last_line(&pack_args(&recipe, &out, &[]));
    assert!(
        stderr.contains(&format!(
            "cannot clear {}",
            partial.join("doc_starts.u32").display()
        )),
        "{stderr}"
    );
    assert_eq!(
        last,
        format!(
            "removed {}: it held no checkpoint to continue from",
            partial.display()
        )
    );
    assert!(!partial.exists() && !out.exists());
}

/// A pack fails after its checkpoints (a document over the limit at the end); then its input
/// shrinks, so the checkpoint's buffered documents are gone: continuing fails, and the partial
/// directory, which holds the checkpoint, is kept and said to be.
#[test]
fn a_pack_that_fails_to_continue_keeps_its_checkpoint_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let line = |i: usize| {
        let doc = format!("document {i}: {}", "lorem ipsum dolor sit amet ".repeat(37));
        serde_json::json!({ "text": doc }).to_string() + "\n"
    };
    let mut text: String = (0..6000).map(line).collect();
    text.push_str(&(serde_json::json!({ "text": "x".repeat(5000) }).to_string() + "\n"));
    std::fs::write(tmp.path().join("d.jsonl"), text).unwrap();
    let source = "[[source]]\nname = \"d\"\nfiles = [\"d.jsonl\"]\nformat = \"jsonl\"\n\
                  max_document_bytes = 2000\n";
    let recipe = write_recipe(tmp.path(), &recipe(64, 200, "first_exhausted", source));
    let out = tmp.path().join("out");
    let partial = tmp.path().join("out.partial");
    let (stderr, last) = failed_last_line(&pack_args(&recipe, &out, &["--checkpoint-secs", "0"]));
    assert!(
        stderr.contains("line 6001: a document of 5000 bytes"),
        "{stderr}"
    );
    assert!(last.starts_with(&format!(
        "kept {}: it holds a checkpoint",
        partial.display()
    )));

    let kept: String = (0..100).map(line).collect();
    std::fs::write(tmp.path().join("d.jsonl"), kept).unwrap();
    let (stderr, last) = failed_last_line(&pack_args(&recipe, &out, &[]));
    assert!(
        stderr.contains(&format!(
            "continue the interrupted pack in {}",
            partial.display()
        )) && stderr.contains("the checkpoint refers to a document that is not there"),
        "{stderr}"
    );
    assert!(
        last.starts_with(&format!(
            "kept {}: it holds a checkpoint after ",
            partial.display()
        )) && last.ends_with("(--fresh starts over)"),
        "{last}"
    );
    assert!(partial.join("checkpoint.ckpt").is_file());
    assert!(!out.exists());
}

fn multinode() -> PathBuf {
    repo_root().join("config/quickstart-multinode.toml")
}

/// A lane part whose lane fails to start: the lane's partial directory is removed, and the last
/// line says what `OUT.lanes` holds (nothing: removed; lanes complete before: kept). The rerun
/// keeps the complete lanes. Then a finish whose writer fails removes `OUT.partial` and keeps
/// `OUT.lanes`, its input.
#[test]
fn lane_parts_and_the_finish_say_what_they_leave() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = multinode();
    let out = tmp.path().join("out");
    let lanes = tmp.path().join("out.lanes");
    // Part 0 of 4 packs lanes 0 and 1. Lane 0 cannot start: nothing complete, nothing kept.
    block_the_writer(&lanes.join("lane-00000.partial"));
    let part0 = ["--part", "0", "--parts", "4"];
    let (stderr, last) = failed_last_line(&pack_args(&recipe, &out, &part0));
    assert!(
        stderr.contains(&format!(
            "removed {}: it held no checkpoint to continue from",
            lanes.join("lane-00000.partial").display()
        )),
        "{stderr}"
    );
    let record = lanes.join("part-00000-of-00004.failed");
    assert_eq!(
        last,
        format!(
            "kept {}: no lane is complete there; the failure is recorded in {} (`dsprep pack \
             --status` shows it)",
            lanes.display(),
            record.display()
        )
    );
    assert!(record.is_file() && !lanes.join("lane-00000.partial").exists());

    // Lane 1 cannot start, after lane 0 is complete: kept, and the rerun keeps lane 0.
    block_the_writer(&lanes.join("lane-00001.partial"));
    let (_, last) = failed_last_line(&pack_args(&recipe, &out, &part0));
    assert_eq!(
        last,
        format!(
            "kept {}: 1 of 8 lanes are complete there ([0]); the same command keeps them and \
             packs the rest; the failure is recorded in {}",
            lanes.display(),
            record.display()
        )
    );
    assert!(!lanes.join("lane-00001.partial").exists());
    let rerun = dsprep_ok(&pack_args(&recipe, &out, &part0));
    assert!(
        rerun.contains("packed lanes [1] (kept [0], complete from an earlier run)"),
        "{rerun}"
    );
    for part in ["1", "2", "3"] {
        dsprep_ok(&pack_args(&recipe, &out, &["--part", part, "--parts", "4"]));
    }

    let partial = tmp.path().join("out.partial");
    block_the_writer(&partial);
    let (_, last) = failed_last_line(&pack_args(&recipe, &out, &["--finish"]));
    assert_eq!(
        last,
        format!(
            "removed {}: it held no checkpoint to continue from",
            partial.display()
        )
    );
    assert!(!partial.exists() && !out.exists());
    assert!(
        lanes.join("lane-00007").is_dir(),
        "the lanes, the finish's input, stay"
    );
    dsprep_ok(&pack_args(&recipe, &out, &["--finish"]));
    assert!(out.join("manifest.json").is_file() && !lanes.exists());
}

/// `dsprep ARGS` with `env` set, outside any Slurm task, with the resubmission's settings fixed
/// (no `scontrol` asked): MaxArraySize 3, the part script `pack-part.sbatch`, flags `-p debug`.
fn dsprep_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"));
    for var in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_COUNT",
        "SLURM_PROCID",
    ] {
        command.env_remove(var);
    }
    command
        .env("DSPREP_MAX_ARRAY_SIZE", "3")
        .env("DSPREP_PART_SCRIPT", "pack-part.sbatch")
        .env("DSPREP_SBATCH_FLAGS", "-p debug");
    command.envs(env.iter().copied());
    command.args(args).output().unwrap()
}

fn stdout_of(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last line of a failed run's error (exit code 1).
fn error_of(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let at = stderr.find("error: ").expect("an error line");
    stderr[at..].trim_end().to_string()
}

/// `--status` over a job of 8 lanes in 8 parts, each state in turn: complete (its record),
/// running (a lane's partial directory locked by a live process: here, this test), stale (the
/// same directory, its lock let go: a killed task), failed (the part's recorded error), missing
/// (parts never run, on one line). The resubmission leaves out the running part and splits its
/// indices below MaxArraySize 3 (part = PART_OFFSET + index). The finish, run early, says the
/// same. One SLURM task (SLURM_PROCID=1, 3 parts per task) packs parts 3-5 in turn.
#[test]
fn status_names_every_part_and_resubmits_only_those_to_rerun() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = multinode();
    let plan = tmp.path().join("plan.json");
    dsprep_ok(&[
        "plan",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        plan.to_str().unwrap(),
    ]);
    let out = tmp.path().join("out");
    let lanes = tmp.path().join("out.lanes");
    let with_plan = |extra: &[&str]| -> Vec<String> {
        let mut args = pack_args(&recipe, &out, &["--plan", plan.to_str().unwrap()]);
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect()
    };
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let args = with_plan(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dsprep_env(&args, env)
    };
    // Task 1 of an allocation, 3 parts a task: parts 3, 4 and 5, in turn.
    let packed = stdout_of(&run(
        &["--parts", "8", "--parts-per-task", "3"],
        &[("SLURM_PROCID", "1")],
    ));
    let said: Vec<&str> = packed.lines().map(|l| &l[..l.find(':').unwrap()]).collect();
    assert_eq!(said, ["part 3 of 8", "part 4 of 8", "part 5 of 8"]);
    for part in ["3", "4", "5"] {
        assert!(
            lanes
                .join(format!("part-0000{part}-of-00008.done"))
                .is_file()
        );
    }
    // Part 0 fails: its lane cannot start. The failure is recorded for the status.
    block_the_writer(&lanes.join("lane-00000.partial"));
    let failed = run(&["--part", "0", "--parts", "8"], &[]);
    let record = lanes.join("part-00000-of-00008.failed");
    assert_eq!(
        String::from_utf8_lossy(&failed.stderr)
            .trim_end()
            .lines()
            .last()
            .unwrap(),
        format!(
            "kept {}: 3 of 8 lanes are complete there ([3, 4, 5]); the same command keeps them \
             and packs the rest; the failure is recorded in {}",
            lanes.display(),
            record.display()
        )
    );
    // Part 6's lane is being packed (this test holds its lock); part 7's task was killed.
    let running = lanes.join("lane-00006.partial");
    std::fs::create_dir_all(&running).unwrap();
    let lock = std::fs::File::create(running.join(".lock")).unwrap();
    lock.try_lock().unwrap();
    let stale = lanes.join("lane-00007.partial");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::File::create(stale.join(".lock")).unwrap();

    let status = stdout_of(&run(&["--status", "--parts", "8"], &[]));
    let resubmit = |indices: &str, offset: u32| {
        format!(
            "  sbatch --array={indices} --export=ALL,PARTS=8,PARTS_PER_TASK=1,PART_OFFSET={offset} \
             -p debug pack-part.sbatch {} {} {}",
            recipe.display(),
            out.display(),
            plan.display()
        )
    };
    let left = [
        format!(
            "part 0 (lane 0): failed: lane 0 of 8: cannot clear {}: Is a directory (os error \
             21); removed {}: it held no checkpoint to continue from",
            lanes.join("lane-00000.partial/doc_starts.u32").display(),
            lanes.join("lane-00000.partial").display()
        ),
        format!(
            "part 6 (lane 6): running ({} is locked by its task)",
            running.display()
        ),
        format!(
            "part 7 (lane 7): stale ({} is held by no task: its task was killed)",
            stale.display()
        ),
        "part(s) 1-2: missing (no lane packed)".to_string(),
        "resubmit the 4 part(s) 0-2,7 (array indices below MaxArraySize 3; part = PART_OFFSET \
         + index):"
            .to_string(),
        resubmit("0-2", 0),
        resubmit("1", 6),
    ];
    let mut want = vec![format!(
        "{}: 8 lanes in 8 parts; 3 of 8 parts complete (in {})",
        out.display(),
        lanes.display()
    )];
    want.extend(left.iter().cloned());
    assert_eq!(status.lines().collect::<Vec<_>>(), want);

    // The finish, run now, names the same parts and commands, and writes nothing.
    let finish = run(&["--finish", "--parts", "8"], &[]);
    let mut said = vec![format!(
        "error: cannot finish {}: lane(s) 0-2,6-7 of 8 are not packed in {} (or belong to \
         another recipe):",
        out.display(),
        lanes.display()
    )];
    said.extend(left.iter().cloned());
    assert_eq!(error_of(&finish).lines().collect::<Vec<_>>(), said);
    assert!(!out.exists() && running.join(".lock").is_file());

    // Part 6 run again while its lane is locked: one error, the lane left to its task.
    let twice = run(&["--part", "6", "--parts", "8"], &[]);
    assert_eq!(
        error_of(&twice),
        format!(
            "error: part 6 of 8: lane 6's {} is locked by another running task (this part runs \
             twice?): left to it, nothing removed; `dsprep pack --status` shows the part as \
             running",
            running.display()
        )
    );
    assert!(running.join(".lock").is_file());
    drop(lock);

    // The resubmission's parts, then the finish: one pack's bytes.
    stdout_of(&run(
        &["--parts", "8"],
        &[
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ],
    ));
    for (id, offset) in [("0", "0"), ("1", "0"), ("2", "0"), ("0", "6"), ("1", "6")] {
        let env = [("SLURM_ARRAY_TASK_ID", id)];
        stdout_of(&run(&["--parts", "8", "--part-offset", offset], &env));
    }
    let status = stdout_of(&run(&["--status", "--parts", "8"], &[]));
    assert_eq!(
        status,
        format!(
            "{}: 8 lanes in 8 parts; 8 of 8 parts complete (in {})\nevery part is complete: run \
             the finish (dsprep pack --finish)\n",
            out.display(),
            lanes.display()
        )
    );
    stdout_of(&run(&["--finish", "--parts", "8"], &[]));
    let whole = tmp.path().join("whole");
    dsprep_ok(&pack_args(&recipe, &whole, &[]));
    assert_eq!(dir_bytes(&out), dir_bytes(&whole));
}

/// Bad input to the parts and the status: one error each, naming the file or the setting.
#[test]
fn bad_part_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = multinode();
    let out = tmp.path().join("out");
    let run =
        |extra: &[&str], env: &[(&str, &str)]| dsprep_env(&pack_args(&recipe, &out, extra), env);
    // A plan of another recipe.
    let other = quickstart_variant(tmp.path(), "other.toml", &[("seed = 1234", "seed = 99")]);
    let plan = tmp.path().join("other.plan.json");
    dsprep_ok(&[
        "plan",
        "--recipe",
        other.to_str().unwrap(),
        "--out",
        plan.to_str().unwrap(),
    ]);
    let e = error_of(&run(&["--status", "--plan", plan.to_str().unwrap()], &[]));
    assert!(
        e.starts_with(&format!(
            "error: plan {} was made for recipe hash ",
            plan.display()
        )) && e.contains(&format!(
            "but recipe {} has hash {}: the recipe changed since (or it is another recipe)",
            recipe.display(),
            recipe_hash(&recipe)
        )),
        "{e}"
    );
    // Parts outside the plan's lanes.
    assert_eq!(
        error_of(&run(&["--status", "--parts", "9"], &[])),
        "error: --parts 9 is not a part count of this plan: its recipe has lanes.count = 8, so \
         parts run from 1 to 8"
    );
    assert_eq!(
        error_of(&run(&["--part", "2,9", "--parts", "8"], &[])),
        "error: --part 9 is not below --parts 8: parts are numbered 0..7"
    );
    assert_eq!(
        error_of(&run(&["--part", "2,x", "--parts", "8"], &[])),
        "error: --part \"2,x\": \"x\" is not a part number (write parts as 3,17,40-42)"
    );
    assert_eq!(
        error_of(&run(
            &["--parts", "8", "--parts-per-task", "2"],
            &[("SLURM_ARRAY_TASK_ID", "4")]
        )),
        "error: SLURM_ARRAY_TASK_ID=4 with --part-offset 0 and --parts-per-task 2 starts at part \
         8, which is not below --parts 8: parts are numbered 0..7"
    );
    assert_eq!(
        error_of(&run(&["--parts", "8"], &[])),
        "error: --parts 8 without --part packs a Slurm task's parts, but neither \
         SLURM_ARRAY_TASK_ID nor SLURM_PROCID is set: give --part"
    );
    assert_eq!(
        error_of(&run(&["--status"], &[("DSPREP_MAX_ARRAY_SIZE", "0")])),
        "error: DSPREP_MAX_ARRAY_SIZE=0: Slurm's MaxArraySize is at least 1"
    );
    // A record of another recipe's parts in OUT.lanes.
    let lanes = tmp.path().join("out.lanes");
    std::fs::create_dir_all(&lanes).unwrap();
    let record = lanes.join("part-00001-of-00008.done");
    std::fs::write(&record, r#"{"recipe_hash":"0123"}"#).unwrap();
    assert_eq!(
        error_of(&run(&["--status", "--parts", "8"], &[])),
        format!(
            "error: {} was written for recipe hash 0123, but recipe {} has hash {}: {} holds \
             another recipe's parts (remove it, or give the recipe and plan its parts ran with)",
            record.display(),
            recipe.display(),
            recipe_hash(&recipe),
            lanes.display()
        )
    );
}

/// The recipe hash `dsprep plan` records for `recipe`.
fn recipe_hash(recipe: &Path) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("p.json");
    dsprep_ok(&[
        "plan",
        "--recipe",
        recipe.to_str().unwrap(),
        "--out",
        plan.to_str().unwrap(),
    ]);
    let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(plan).unwrap()).unwrap();
    plan["recipe_hash"].as_str().unwrap().to_string()
}
