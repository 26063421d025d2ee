//! Node daemons change course: the multinode recipe (`[lanes]`) served by 2 node daemons to
//! real `dsprep tap` ranks, SIGKILLed, resumed with an edited recipe (`--change-course`:
//! weights changed, a source added), SIGKILLed again and resumed. Every rank's bytes must be
//! exactly `dsprep pack --lineage` of the state directory, and the steps below the change
//! exactly the old recipe's stream.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};
use support::daemon::{Daemon, assert_tap_chains, chain_marks, expected_rank_bytes, tap_all};
use support::nodes::{multinode, node_args};
use support::{dsprep_ok, recipe_variant};

/// Bytes of one row (a window of 513 u16 tokens).
const ROW: usize = 513 * 2;

/// A: the multinode recipe without finemath. B: fineweb-edu and c4 reweighted, finemath added.
fn recipes(dir: &Path) -> (PathBuf, PathBuf) {
    let b = recipe_variant(
        &multinode(),
        dir,
        "b.toml",
        &[
            ("weight = 0.40", "weight = 0.20"),
            ("weight = 0.15", "weight = 0.30"),
        ],
    );
    let text = std::fs::read_to_string(&b).unwrap();
    let a_text = text
        .split("[[source]]\nname = \"finemath\"")
        .next()
        .unwrap();
    let a_text = a_text
        .replace("weight = 0.20", "weight = 0.40")
        .replace("weight = 0.30\nfiles = [\"", "weight = 0.15\nfiles = [\"");
    let a = dir.join("a.toml");
    std::fs::write(&a, a_text).unwrap();
    (a, b)
}

/// Node `node` of `nodes` serving `recipe` (world × micro batch) on `dir/node<N>.sock`.
fn start(
    dir: &Path,
    recipe: &Path,
    (node, nodes): (u32, u32),
    (world, mb): (u32, u32),
    extra: &[&str],
) -> Result<Daemon, String> {
    let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
    let mut more = vec!["--checkpoint-every", "3"];
    if !extra.contains(&"--metrics") {
        more.extend(["--metrics", "off"]);
    }
    more.extend_from_slice(extra);
    let args = node_args(dir, node, nodes, world, mb, &more);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(recipe, &endpoint, &args)
}

/// `count` node daemons of `recipe`, world 4 × micro batch 1.
fn nodes(dir: &Path, recipe: &Path, count: u32, extra: &[&str]) -> Vec<Daemon> {
    nodes_of(dir, recipe, count, (4, 1), extra)
}

fn nodes_of(
    dir: &Path,
    recipe: &Path,
    count: u32,
    layout: (u32, u32),
    extra: &[&str],
) -> Vec<Daemon> {
    (0..count)
        .map(|n| start(dir, recipe, (n, count), layout, extra).unwrap())
        .collect()
}

/// Every rank's taps (world 4) from `start` for `steps` steps, its output files.
fn pull(dir: &Path, daemons: &[Daemon], start: u64, steps: u64, tag: &str) -> Vec<PathBuf> {
    pull_world(dir, daemons, 4, start, steps, tag)
}

fn pull_world(
    dir: &Path,
    daemons: &[Daemon],
    world: u32,
    start: u64,
    steps: u64,
    tag: &str,
) -> Vec<PathBuf> {
    let daemons: Vec<&Daemon> = daemons.iter().collect();
    tap_all(dir, &daemons, world, start, steps, tag, &[])
}

/// `dsprep pack --lineage STATE --out DIR/lineage`, opened.
fn pack_lineage(dir: &Path) -> PackedDataset {
    let (state, out) = (dir.join("state"), dir.join("lineage"));
    dsprep_ok(&[
        "pack",
        "--lineage",
        state.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    PackedDataset::open(&out).unwrap()
}

#[test]
fn two_node_daemons_change_course_and_serve_exactly_the_packed_lineage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = recipes(dir);
    let metrics = ["--metrics", "127.0.0.1:0"];
    let change = [
        "--resume",
        "latest",
        "--change-course",
        metrics[0],
        metrics[1],
    ];
    let resume = ["--resume", "latest", metrics[0], metrics[1]];
    // A to step 40, SIGKILL.
    let daemons = nodes(dir, &a, 2, &[]);
    let mut outs = vec![pull(dir, &daemons, 0, 40, "a")];
    drop(daemons);
    // A's lineage alone, for a verify against another lineage below.
    let lineage_a = dir.join("lineage-a.json");
    std::fs::copy(dir.join("state/lineage.json"), &lineage_a).unwrap();
    // B from step 40 (weights changed, finemath added), SIGKILL at step 67.
    let daemons = nodes(dir, &b, 2, &change);
    outs.push(pull(dir, &daemons, 40, 27, "b"));
    for (node, daemon) in daemons.iter().enumerate() {
        assert_segment_metrics(daemon, node);
    }
    let log0 = daemons[0].log_text();
    assert!(
        log0.contains("changed course at step 40 (window 160)"),
        "{log0}"
    );
    let log1 = daemons[1].log_text();
    assert!(log1.contains("node 0 changed course at step 40"), "{log1}");
    assert!(
        log1.contains("lane 1: the change at step 40 takes over at its window 20"),
        "{log1}"
    );
    drop(daemons);
    // Resume B (no change: the lineage has it) from step 67 to 80.
    let daemons = nodes(dir, &b, 2, &resume);
    outs.push(pull(dir, &daemons, 67, 13, "c"));
    for daemon in &daemons {
        assert_eq!(daemon.metric("dsprep_lineage_segment"), 1.0);
    }
    drop(daemons);

    // B's lanes packed alone and left unfinished in the pack's OUT.lanes: not this lineage's
    // lanes, so pack --lineage packs every lane again (else its bytes would not be the served).
    let out = dir.join("lineage");
    dsprep_ok(&[
        "pack",
        "--recipe",
        b.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--part",
        "0",
        "--parts",
        "1",
        "--quiet",
    ]);
    assert!(dir.join("lineage.lanes/lane-00000/lane.json").exists());
    let packed = pack_lineage(dir);
    assert_lineage_ledger(dir, &packed, &lineage_a);
    let marks = chain_marks(&packed, 80 * 4);
    let plain_a = dir.join("plain-a");
    dsprep_ok(&[
        "pack",
        "--recipe",
        a.to_str().unwrap(),
        "--out",
        plain_a.to_str().unwrap(),
        "--quiet",
    ]);
    let plain_a = PackedDataset::open(&plain_a).unwrap();
    for rank in 0..4usize {
        let want = expected_rank_bytes(&packed, 4, 1, rank as u64);
        let mut got = Vec::new();
        for (part, steps) in outs.iter().zip([40usize, 27, 13]) {
            assert_eq!(assert_tap_chains(&part[rank], &marks), steps, "rank {rank}");
            got.extend(std::fs::read(&part[rank]).unwrap());
        }
        assert_eq!(got.len(), 80 * ROW, "rank {rank}");
        assert!(
            got == want[..80 * ROW],
            "rank {rank}: the served bytes differ from pack --lineage"
        );
        let below = expected_rank_bytes(&plain_a, 4, 1, rank as u64);
        assert!(
            got[..40 * ROW] == below[..40 * ROW],
            "rank {rank}: the steps below the change are not A's"
        );
        assert!(
            got[40 * ROW..] != below[40 * ROW..80 * ROW],
            "rank {rank}: B changed nothing"
        );
    }
}

/// A series' samples in one `/metrics` body: label set → value.
fn samples(body: &str, series: &str) -> std::collections::BTreeMap<String, f64> {
    (body.lines())
        .filter_map(|l| {
            let rest = l.strip_prefix(series)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once("} ")?;
            Some((labels.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Node `node`'s `/metrics` after the change to B: its lanes run segment 1, finemath (only in
/// B) is counted in segment 1 only, and per source the segments' documents and tokens add up
/// to the daemon's totals (read once the counters hold still: the pipeline fills its prefetch).
fn assert_segment_metrics(daemon: &Daemon, node: usize) {
    let url = daemon.metrics.as_ref().unwrap();
    let mut body = support::daemon::http_get(url);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let again = support::daemon::http_get(url);
        let counters = |b: &str| samples(b, "dsprep_documents_total");
        if counters(&again) == counters(&body) || std::time::Instant::now() > deadline {
            body = again;
            break;
        }
        body = again;
    }
    assert_eq!(
        samples(&body, "dsprep_lineage_segment").len(),
        0,
        "the gauge has no labels"
    );
    assert!(
        body.lines().any(|l| l == "dsprep_lineage_segment 1"),
        "node {node}: {body}"
    );
    for (series, total) in [
        ("dsprep_segment_documents_total", "dsprep_documents_total"),
        ("dsprep_segment_tokens_total", "dsprep_tokens_total"),
    ] {
        let per_segment = samples(&body, series);
        let totals = samples(&body, total);
        assert_eq!(
            per_segment.get("segment=\"0\",source=\"finemath\""),
            None,
            "node {node}: {body}"
        );
        assert!(
            per_segment["segment=\"1\",source=\"finemath\""] > 0.0,
            "node {node}: {body}"
        );
        for (source, value) in &totals {
            let name = source.trim_start_matches("source=");
            let in_segment = |k: u32| {
                let key = format!("segment=\"{k}\",source={name}");
                per_segment.get(&key).copied().unwrap_or(0.0)
            };
            assert_eq!(
                in_segment(0) + in_segment(1),
                *value,
                "node {node}: {series} of {source}: {body}"
            );
        }
    }
    let dropped = samples(&body, "dsprep_lineage_dropped_documents_total");
    assert!(dropped.values().all(|&v| v == 0.0), "node {node}: {body}");
}

/// The laned pack's manifest carries the lineage with its ledger (the lanes' counts summed):
/// finemath only from B's segment, the segments adding up to the sources' totals; `dsprep
/// verify --lineage` passes against the state directory and fails against A's lineage alone.
fn assert_lineage_ledger(dir: &Path, packed: &PackedDataset, lineage_a: &Path) {
    let manifest = packed.manifest();
    let segments = manifest.lineage.as_ref().unwrap();
    assert_eq!(segments.len(), 2);
    assert_eq!((segments[1].from_step, segments[1].from_window), (40, 160));
    let documents = |k: usize, name: &str| {
        let source = segments[k].sources.iter().find(|s| s.name == name);
        source.unwrap().documents
    };
    assert_eq!(documents(0, "finemath"), 0);
    assert!(documents(1, "finemath") > 0);
    assert!(documents(0, "fineweb-edu") > 0 && documents(1, "fineweb-edu") > 0);
    for source in &manifest.sources {
        let summed = |f: fn(&dsprep_client::format::SegmentSource) -> u64| {
            (segments.iter())
                .map(|s| f(s.sources.iter().find(|x| x.name == source.name).unwrap()))
                .sum::<u64>()
        };
        assert_eq!(summed(|s| s.documents), source.documents, "{}", source.name);
        assert_eq!(summed(|s| s.tokens), source.tokens, "{}", source.name);
    }
    let (out, state) = (dir.join("lineage"), dir.join("state"));
    let verified = dsprep_ok(&[
        "verify",
        out.to_str().unwrap(),
        "--lineage",
        state.to_str().unwrap(),
    ]);
    assert!(verified.contains("packs the lineage"), "{verified}");
    let err = support::dsprep_fails(&[
        "verify",
        out.to_str().unwrap(),
        "--lineage",
        lineage_a.to_str().unwrap(),
    ]);
    let s = &segments[1];
    let want = format!(
        "{} does not pack the lineage {}: segment 1 is recipe {} from step 40 (window 160, \
         document {}), 4 windows a step in the pack, absent in the lineage",
        out.display(),
        lineage_a.display(),
        s.recipe_hash,
        s.from_documents
    );
    assert!(err.contains(&want), "{err}\nwant: {want}");
}

/// Four node daemons (world 8 × micro batch 2): A to step 12, a change to B at step 12 served to
/// step 20, then the trainers roll back to step 9 (below the change) and resume there; an edit
/// of `[lanes]` is refused first, naming the field, with nothing changed. Every step each rank
/// received, the replayed ones included, is `dsprep pack --lineage`'s.
#[test]
fn four_node_daemons_change_course_and_a_rollback_below_it_replays_the_lineage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = recipes(dir);
    let layout = (8, 2);
    let daemons = nodes_of(dir, &a, 4, layout, &[]);
    let first = pull_world(dir, &daemons, 8, 0, 12, "a");
    drop(daemons);
    let lanes = recipe_variant(
        &b,
        dir,
        "lanes.toml",
        &[("block_windows = 2", "block_windows = 4")],
    );
    let change = ["--resume", "latest", "--change-course"];
    let lineage_before = std::fs::read(dir.join("state/lineage.json")).unwrap();
    let e = start(dir, &lanes, (0, 4), layout, &change)
        .map(|_| ())
        .unwrap_err();
    assert!(
        e.contains("lanes: count 8 × block_windows 2 → count 8 × block_windows 4"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(dir.join("state/lineage.json")).unwrap(),
        lineage_before,
        "a refused change writes nothing"
    );
    let daemons = nodes_of(dir, &b, 4, layout, &change);
    let second = pull_world(dir, &daemons, 8, 12, 8, "b");
    drop(daemons);
    let daemons = nodes_of(dir, &b, 4, layout, &["--resume", "latest"]);
    let third = pull_world(dir, &daemons, 8, 9, 15, "c");
    drop(daemons);
    let packed = pack_lineage(dir);
    let marks = chain_marks(&packed, 24 * 16);
    let row = 2 * ROW;
    for rank in 0..8usize {
        let want = expected_rank_bytes(&packed, 8, 2, rank as u64);
        let read = |out: &PathBuf, steps| {
            assert_eq!(assert_tap_chains(out, &marks), steps, "rank {rank}");
            std::fs::read(out).unwrap()
        };
        let got = [read(&first[rank], 12), read(&second[rank], 8)].concat();
        assert!(got == want[..20 * row], "rank {rank}: steps 0..20 differ");
        let again = read(&third[rank], 15);
        assert!(
            again == want[9 * row..24 * row],
            "rank {rank}: the rollback to step 9 differs from the lineage"
        );
    }
}

/// Rank `rank`'s rows of steps `steps` of `data` when step `s` holds `global_batch` windows from
/// window `from_window` at step `from_step` (world 4).
fn rank_rows(
    data: &PackedDataset,
    (from_step, from_window, global_batch): (u64, u64, u64),
    steps: std::ops::Range<u64>,
    rank: u64,
) -> Vec<u8> {
    let mb = global_batch / 4;
    steps
        .flat_map(|s| {
            let first = from_window + (s - from_step) * global_batch + rank * mb;
            (first..first + mb).flat_map(|w| data.window(w).unwrap().tokens.as_bytes().to_vec())
        })
        .collect()
}

/// Two node daemons (world 4) serve A at micro batch 1 to step 40, then change course to B with
/// micro batch 2 (the global batch 4 → 8) at step 40, are SIGKILLed at step 60 and resumed at
/// step 52: steps of 8 windows from window 160 on, exactly `dsprep pack --lineage`'s. A change
/// at a window the nodes cannot split at the new global batch, and a step below the change asked
/// of daemons at the new global batch, are refused, naming the values.
#[test]
fn node_daemons_change_the_global_batch_at_a_change_of_course() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = recipes(dir);
    let daemons = nodes_of(dir, &a, 2, (4, 1), &[]);
    let first = pull_world(dir, &daemons, 4, 0, 40, "a");
    drop(daemons);
    let change = ["--resume", "latest", "--change-course"];
    // At step 41 (window 164) two nodes cannot split steps of 8 windows: refused, nothing written.
    let lineage = std::fs::read(dir.join("state/lineage.json")).unwrap();
    let daemons = nodes_of(dir, &b, 2, (4, 2), &change);
    let odd = dir.join("odd.bin");
    let refused = support::daemon::tap(&daemons[0].endpoint, 0, 4, 41, 1, &odd)
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("cannot change course at step 41: step 41 starts at window 164")
            && stderr.contains("must be a multiple of 8"),
        "{stderr}"
    );
    drop(daemons);
    assert_eq!(
        std::fs::read(dir.join("state/lineage.json")).unwrap(),
        lineage
    );
    let daemons = nodes_of(dir, &b, 2, (4, 2), &change);
    let second = pull_world(dir, &daemons, 4, 40, 20, "b");
    drop(daemons);
    let daemons = nodes_of(dir, &b, 2, (4, 2), &["--resume", "latest"]);
    let third = pull_world(dir, &daemons, 4, 52, 12, "c");
    drop(daemons);
    // Trainers that rolled back below the change ask this layout for a step it cannot serve.
    let daemons = nodes_of(dir, &b, 2, (4, 2), &["--resume", "latest"]);
    let below = dir.join("below.bin");
    let refused = support::daemon::tap(&daemons[0].endpoint, 0, 4, 30, 1, &below)
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains(
                "step 30 is in the stretch of the stream from step 0 with a global batch of 4 \
                 windows (world size 4 × micro batch 1)"
            ),
        "{stderr}"
    );
    drop(daemons);
    let packed = pack_lineage(dir);
    for rank in 0..4u64 {
        let read = |out: &PathBuf| std::fs::read(out).unwrap();
        let r = rank as usize;
        assert!(
            read(&first[r]) == rank_rows(&packed, (0, 0, 4), 0..40, rank),
            "rank {rank}: steps 0..40"
        );
        assert!(
            read(&second[r]) == rank_rows(&packed, (40, 160, 8), 40..60, rank),
            "rank {rank}: steps 40..60 at 8 windows a step"
        );
        assert!(
            read(&third[r]) == rank_rows(&packed, (40, 160, 8), 52..64, rank),
            "rank {rank}: steps 52..64 after the SIGKILL"
        );
    }
}

/// Node 1 started with `--change-course` while node 0 was not: node 1 waits for node 0's change
/// at its ranks' first request at most `--change-course-timeout` (1 s here), then exits with an
/// error naming node 0 and what to do.
#[test]
fn a_node_changing_course_alone_gives_up_after_the_timeout_naming_node_0() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = recipes(dir);
    let daemons = nodes(dir, &a, 2, &[]);
    pull(dir, &daemons, 0, 6, "a");
    drop(daemons);
    let extra = [
        "--resume",
        "latest",
        "--change-course",
        "--change-course-timeout",
        "1",
    ];
    let mut node1 = start(dir, &b, (1, 2), (4, 1), &extra).unwrap();
    // Node 1's ranks (2 and 3) ask for step 6: the change is to be taken from node 0.
    let taps: Vec<_> = (2..4u32)
        .map(|rank| {
            let out = dir.join(format!("b-r{rank}.bin"));
            support::daemon::tap(&node1.endpoint, rank, 4, 6, 2, &out)
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = node1.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 1 is still waiting: {}",
            node1.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    for mut tap in taps {
        let _ = tap.kill();
        let _ = tap.wait();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = node1.log_text();
    assert!(!status.success(), "{log}");
    let lineage = dir.join("state/lineage.json");
    let want = format!(
        "node 0 did not change course within 1 s (--change-course-timeout): {} still holds no \
         change to recipe {}. Node 1 was started with --change-course, so node 0 must be too: \
         restart every node daemon with --resume latest --change-course and that recipe, or \
         every one without --change-course to continue the stream as it was",
        lineage.display(),
        recipe_hash(&b)
    );
    assert!(log.contains(&want), "{log}\nwant: {want}");
}

/// A recipe's hash as `dsprep plan` shows it (`recipe PATH (HASH)`).
fn recipe_hash(recipe: &Path) -> String {
    let shown = dsprep_ok(&["plan", "--recipe", recipe.to_str().unwrap()]);
    shown
        .split('(')
        .find_map(|rest| {
            let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
            (hex.len() == 64).then_some(hex)
        })
        .unwrap_or_else(|| panic!("no recipe hash in:\n{shown}"))
}
