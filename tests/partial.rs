//! What every failure of `dsprep pack` leaves, with the real binary: `OUT.partial` is removed
//! unless it holds a checkpoint to continue from, a lane part's `OUT.lanes` is kept while it
//! holds complete lanes, and the error's last line says which. The paths here are the ones the
//! other tests do not reach: a writer that fails to start (plain pack, lane, finish), and a
//! pack that fails to continue from its checkpoint.
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
    assert_eq!(
        last,
        format!("removed {}: no lane was complete", lanes.display())
    );
    assert!(!lanes.exists());

    // Lane 1 cannot start, after lane 0 is complete: kept, and the rerun keeps lane 0.
    block_the_writer(&lanes.join("lane-00001.partial"));
    let (_, last) = failed_last_line(&pack_args(&recipe, &out, &part0));
    assert_eq!(
        last,
        format!(
            "kept {}: 1 of 8 lanes are complete there ([0]); the same command keeps them and \
             packs the rest",
            lanes.display()
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
