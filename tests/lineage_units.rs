//! Changing course across mix units and in a mix in tokens, end to end: real daemons SIGKILLed
//! and resumed with an edited recipe (`--change-course`), real `dsprep tap` ranks, and `dsprep
//! pack --lineage` (at another thread count) of the state directory. A change of `[mix] unit`
//! with a source added, and in tokens a source removed with the buffer resized: the ranks get
//! exactly the packed lineage's windows across the changes and the resumes after them.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::format::DroppedDocuments;
use std::path::{Path, PathBuf};
use support::lineage::*;
use support::serve_run::Run;
use support::*;

const IN_TOKENS: (&str, &str) = ("[mix]\n", "[mix]\nunit = \"tokens\"\n");

/// The quickstart with a buffer of `buffer`, mixed in tokens if `tokens`, without `drop`.
fn edit(dir: &Path, name: &str, tokens: bool, buffer: u32, drop: &[&str]) -> PathBuf {
    let size = format!("buffer_size = {buffer}");
    let mut replace = vec![("buffer_size = 1000", size.as_str())];
    if tokens {
        replace.push(IN_TOKENS);
    }
    quickstart_edit(dir, name, &replace, drop)
}

/// The documents each segment of `data`'s lineage counts for source `name`.
fn documents(data: &dsprep_client::PackedDataset, name: &str) -> Vec<u64> {
    let manifest = data.manifest();
    (manifest.lineage.as_ref().unwrap().iter())
        .map(|s| {
            let source = s.sources.iter().find(|x| x.name == name);
            source.map_or(0, |x| x.documents)
        })
        .collect()
}

/// The count the log line of a change gives for `name`'s dropped documents.
fn dropped_in_log(log: &str, name: &str) -> u64 {
    let marker = format!("dropped: \"{name}\" ");
    (log.split(&marker).nth(1))
        .and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {marker:?} in the log:\n{log}"))
}

#[test]
fn a_change_from_documents_to_tokens_with_a_source_added_serves_the_packed_lineage() {
    let tmp = tempfile::tempdir().unwrap();
    let a = edit(tmp.path(), "a.toml", false, 100, &["finemath"]);
    let b = edit(tmp.path(), "b.toml", true, 100, &[]);
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    // A (documents) to step 20, SIGKILL.
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 20);
    drop(daemon);
    // B (tokens, finemath added) from step 20, SIGKILL at step 35.
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 20, 15));
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 20 (window 80, document "),
        "{log}"
    );
    assert!(!log.contains("dropped: "), "nothing dropped: {log}");
    drop(daemon);
    // B resumed from its own checkpoint, to step 50.
    let daemon = run.start_with(&b, 2, 2, &["--resume", "latest"]).unwrap();
    got.extend(run.pull(&daemon, 2, 35, 15));
    drop(daemon);

    let packed = tmp.path().join("packed");
    let data = pack_lineage_with(&run.state, &packed, &["--threads", "1"]);
    assert_eq!(got.len(), 200 * 513 * 2);
    assert!(
        got == windows(&data, 0..200),
        "documents → tokens: served and packed differ"
    );
    let manifest = data.manifest();
    let segments = manifest.lineage.as_ref().unwrap();
    let starts: Vec<u64> = segments.iter().map(|s| s.from_window).collect();
    assert_eq!(starts, [0, 80]);
    assert_eq!(documents(&data, "finemath")[0], 0);
    assert!(documents(&data, "finemath")[1] > 0);
    assert!(segments[1].dropped.is_empty());
    let verified = dsprep_ok(&[
        "verify",
        packed.to_str().unwrap(),
        "--lineage",
        run.state.to_str().unwrap(),
    ]);
    assert!(verified.contains("packs the lineage"), "{verified}");
    // Below the change, the stream is recipe A's alone.
    let plain = pack_dataset(&a, &tmp.path().join("packed-a"));
    assert!(windows(&plain, 0..80) == windows(&data, 0..80));
}

#[test]
fn a_mix_in_tokens_drops_a_source_and_resizes_its_buffer_then_mixes_in_documents_again() {
    let tmp = tempfile::tempdir().unwrap();
    let a = edit(tmp.path(), "a.toml", true, 200, &[]);
    let b = edit(tmp.path(), "b.toml", true, 50, &["c4"]);
    let c = edit(tmp.path(), "c.toml", false, 100, &[]);
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    // A (tokens, a buffer of 200) to step 130, SIGKILL. A mix in tokens takes snapshots only
    // every 128 documents (its chunks count no text), so its first checkpoints come late.
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 130);
    drop(daemon);
    // B from step 130: c4 removed, a buffer of 50 (the kept sources' shares of it smaller),
    // made on the way from A's checkpoint; SIGKILL at step 145.
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 130, 15));
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 130 (window 520, document "),
        "{log}"
    );
    assert!(!log.contains("no checkpoint"), "from A's checkpoint: {log}");
    let dropped = dropped_in_log(&log, "c4");
    assert!(dropped > 0);
    drop(daemon);
    // B resumed, to step 155, SIGKILL; then C from step 155: documents again, c4 back.
    let daemon = run.start_with(&b, 2, 2, &["--resume", "latest"]).unwrap();
    got.extend(run.pull(&daemon, 2, 145, 10));
    drop(daemon);
    let daemon = change(&run, &c, 2, 2);
    got.extend(run.pull(&daemon, 2, 155, 15));
    let log = daemon.log_text();
    assert!(
        log.contains("changed course at step 155 (window 620, document "),
        "{log}"
    );
    drop(daemon);

    let data = pack_lineage_with(&run.state, &tmp.path().join("packed"), &["--threads", "3"]);
    assert_eq!(got.len(), 680 * 513 * 2);
    assert!(
        got == windows(&data, 0..680),
        "tokens, a source removed and the buffer resized: served and packed differ"
    );
    let manifest = data.manifest();
    let segments = manifest.lineage.as_ref().unwrap();
    let starts: Vec<u64> = segments.iter().map(|s| s.from_window).collect();
    assert_eq!(starts, [0, 520, 620]);
    // What the change dropped is the log's count, in the ledger; c4 drew nothing in B and
    // draws again in C.
    assert_eq!(
        segments[1].dropped,
        [DroppedDocuments {
            source: "c4".into(),
            documents: dropped
        }]
    );
    assert!(segments[2].dropped.is_empty());
    let c4 = documents(&data, "c4");
    assert!(c4[0] > 0 && c4[1] == 0 && c4[2] > 0, "{c4:?}");
    let all: u64 = (segments.iter())
        .flat_map(|s| s.sources.iter().map(|x| x.documents))
        .sum();
    assert_eq!(
        all,
        manifest.sources.iter().map(|s| s.documents).sum::<u64>()
    );
}

#[test]
fn a_change_from_documents_to_tokens_with_a_source_removed_serves_the_packed_lineage() {
    let tmp = tempfile::tempdir().unwrap();
    let a = edit(tmp.path(), "a.toml", false, 100, &[]);
    let b = edit(tmp.path(), "b.toml", true, 100, &["c4"]);
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    // A (documents) to step 20, SIGKILL.
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 20);
    drop(daemon);
    // B (tokens, c4 removed) from step 20, SIGKILL at step 35.
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 20, 15));
    let log = daemon.log_text();
    let dropped = dropped_in_log(&log, "c4");
    drop(daemon);
    // B resumed from its own checkpoint, to step 50.
    let daemon = run.start_with(&b, 2, 2, &["--resume", "latest"]).unwrap();
    got.extend(run.pull(&daemon, 2, 35, 15));
    drop(daemon);

    let packed = tmp.path().join("packed");
    let data = pack_lineage_with(&run.state, &packed, &["--threads", "2"]);
    assert!(
        got == windows(&data, 0..200),
        "documents → tokens, c4 removed: served and packed differ"
    );
    assert_eq!(documents(&data, "c4")[1], 0);
    let segments = data.manifest().lineage.clone().unwrap();
    assert_eq!(
        segments[1].dropped,
        vec![DroppedDocuments {
            source: "c4".into(),
            documents: dropped
        }]
    );
}
