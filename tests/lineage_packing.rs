//! Changing the packing at a change of course, end to end: real daemons SIGKILLed and resumed
//! with a recipe that switches `concat` ↔ `best_fit` or shrinks the `best_fit` pool, real `dsprep
//! tap` ranks, and `dsprep pack --lineage` of the state directory at 1 and 2 threads. What the
//! ranks received must be exactly the packed lineage (format 7: each segment's packing recorded),
//! which `dsprep verify --lineage` passes; a daemon whose lineage pads anywhere refuses protocol
//! v3 clients.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};
use support::lineage::{assert_refuses_v3, change, quickstart_edit, windows};
use support::serve_run::Run;
use support::*;

/// `[packing]` with `best_fit` and a pool of `n` documents.
fn best_fit(n: u32) -> (&'static str, String) {
    (
        "seq_len = 512",
        format!("seq_len = 512\nstrategy = \"best_fit\"\npool_documents = {n}"),
    )
}

/// The quickstart with a buffer of 100 and `packing` (`None`: `concat`), reweighted when asked.
fn recipe(dir: &Path, name: &str, packing: Option<(&str, String)>, reweight: bool) -> PathBuf {
    let mut edits: Vec<(&str, &str)> = vec![("buffer_size = 1000", "buffer_size = 100")];
    if let Some((from, to)) = &packing {
        edits.push((from, to));
    }
    if reweight {
        edits.push(("weight = 0.40", "weight = 0.10"));
    }
    quickstart_edit(dir, name, &edits, &["finemath"])
}

/// `dsprep pack --lineage STATE` at 1 and at 2 threads: byte-identical directories; the first,
/// opened, after `dsprep verify --lineage` passes on it.
fn pack_both(dir: &Path, state: &Path) -> PackedDataset {
    let outs = [dir.join("packed-1"), dir.join("packed-2")];
    for (out, threads) in outs.iter().zip(["1", "2"]) {
        dsprep_ok(&[
            "pack",
            "--lineage",
            state.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--threads",
            threads,
            "--quiet",
        ]);
    }
    assert!(
        dir_bytes(&outs[0]) == dir_bytes(&outs[1]),
        "1 and 2 threads differ"
    );
    let verified = dsprep_ok(&[
        "verify",
        outs[0].to_str().unwrap(),
        "--lineage",
        state.to_str().unwrap(),
    ]);
    assert!(verified.contains("packs the lineage"), "{verified}");
    PackedDataset::open(&outs[0]).unwrap()
}

/// Each segment's packing in the manifest (format 7): strategy and first window.
fn packings(data: &PackedDataset) -> Vec<(String, u64)> {
    let m = data.manifest();
    assert_eq!(m.format_version, 7);
    (m.lineage.as_ref().unwrap().iter())
        .map(|s| {
            let p = s.packing.as_ref().unwrap();
            assert!(p.first_window >= s.from_window);
            (p.strategy.clone(), p.first_window)
        })
        .collect()
}

/// Windows `range` are padded windows (each starts a document at 0) or, `concat`, full.
fn assert_packed_as(data: &PackedDataset, range: std::ops::Range<u64>, padded: bool) {
    for w in range {
        let window = data.window(w).unwrap();
        match padded {
            true => assert_eq!(window.doc_starts.first(), Some(&0), "window {w}"),
            false => assert_eq!(window.real_tokens, 513, "window {w}"),
        }
    }
}

/// concat → best_fit at step 20 (reweighted), SIGKILL, resume; then the pool shrinks (64 → 8)
/// at step 35. The window the concat packer was filling enters the pool; the smaller pool
/// drains before it takes a document.
#[test]
fn concat_switches_to_best_fit_and_its_pool_shrinks_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let a = recipe(tmp.path(), "a.toml", None, false);
    let b = recipe(tmp.path(), "b.toml", Some(best_fit(64)), true);
    let c = recipe(tmp.path(), "c.toml", Some(best_fit(8)), true);
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 20);
    drop(daemon); // SIGKILL
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 20, 10));
    assert!(
        daemon
            .log_text()
            .contains("changed course at step 20 (window 80, "),
        "{}",
        daemon.log_text()
    );
    drop(daemon);
    let daemon = run.start_with(&b, 2, 2, &["--resume", "latest"]).unwrap();
    got.extend(run.pull(&daemon, 2, 30, 5));
    drop(daemon);
    let daemon = change(&run, &c, 2, 2);
    got.extend(run.pull(&daemon, 2, 35, 10));
    drop(daemon);

    let data = pack_both(tmp.path(), &run.state);
    assert!(got == windows(&data, 0..180), "served and packed differ");
    let packings = packings(&data);
    let names: Vec<&str> = packings.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(names, ["concat", "best_fit", "best_fit"]);
    let switch = packings[1].1;
    assert_packed_as(&data, 0..switch, false);
    assert_packed_as(&data, switch..data.num_windows(), true);
    assert!(data.manifest().packing.as_ref().unwrap().padding_tokens > 0);

    // verify holds each segment to its own packing: the concat windows said to be padded fail.
    let packed = tmp.path().join("packed-1");
    let manifest = packed.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["lineage"][1]["packing"]["first_window"] = 0.into();
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let out = dsprep(&["verify", packed.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("with padding every window starts a document at 0"),
        "{err}"
    );
}

/// best_fit → concat at step 20, SIGKILL, resume: the pool's documents open the concat stream
/// in arrival order; the daemon serving the concat recipe still refuses v3 clients (its lineage
/// pads).
#[test]
fn best_fit_switches_to_concat_exactly_and_the_daemon_still_pads_on_the_wire() {
    let tmp = tempfile::tempdir().unwrap();
    let a = recipe(tmp.path(), "a.toml", Some(best_fit(64)), false);
    let b = recipe(tmp.path(), "b.toml", None, true);
    let run = Run {
        dir: tmp.path(),
        recipe: &a,
        state: tmp.path().join("state"),
        every: 3,
    };
    let daemon = run.start(2, 2, false).unwrap();
    let mut got = run.pull(&daemon, 2, 0, 20);
    drop(daemon);
    let daemon = change(&run, &b, 2, 2);
    got.extend(run.pull(&daemon, 2, 20, 10));
    drop(daemon);
    let daemon = run.start_with(&b, 2, 2, &["--resume", "latest"]).unwrap();
    got.extend(run.pull(&daemon, 2, 30, 10));
    assert_refuses_v3(&daemon);
    drop(daemon);

    let data = pack_both(tmp.path(), &run.state);
    assert!(got == windows(&data, 0..160), "served and packed differ");
    let packings = packings(&data);
    assert_eq!(packings[0], ("best_fit".to_string(), 0));
    assert_eq!(packings[1].0, "concat");
    let switch = packings[1].1;
    assert_packed_as(&data, 0..switch, true);
    assert_packed_as(&data, switch..data.num_windows(), false);

    // inspect counts each window by its own packing: the concat windows cut documents that
    // would fit in one (a padded window never does), so the cut count is the concat stretch's.
    let packed = tmp.path().join("packed-1");
    let inspect = dsprep_ok(&["inspect", packed.to_str().unwrap(), "--mix"]);
    let (starts, cut) = concat_cuts(&data, switch);
    let line = format!("cut across windows: {cut} (");
    assert!(cut > 0 && inspect.contains(&line), "{line} in\n{inspect}");
    assert!(
        inspect.contains("documents that fit in a window: "),
        "{inspect}"
    );
    assert!(starts > cut);
}

/// From window `from` on (a concat stretch to the end): the documents that start there and the
/// ones of them that fit in a window but whose tokens lie in two.
fn concat_cuts(data: &PackedDataset, from: u64) -> (u64, u64) {
    let wt = u64::from(data.manifest().window_tokens);
    let mut begins = Vec::new();
    for w in from..data.num_windows() {
        let window = data.window(w).unwrap();
        begins.extend(window.doc_starts.iter().map(|&s| w * wt + u64::from(s)));
    }
    let cut = (begins.windows(2))
        .filter(|d| d[1] - d[0] <= wt && (d[1] - 1) / wt != d[0] / wt)
        .count();
    (begins.len() as u64, cut as u64)
}
