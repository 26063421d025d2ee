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

/// Node `node` of `nodes` serving `recipe` (world 4 × micro batch 1) on `dir/node<N>.sock`.
fn node(dir: &Path, recipe: &Path, node: u32, nodes: u32, extra: &[&str]) -> Daemon {
    let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
    let mut more = vec!["--metrics", "off", "--checkpoint-every", "3"];
    more.extend_from_slice(extra);
    let args = node_args(dir, node, nodes, 4, 1, &more);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(recipe, &endpoint, &args).unwrap()
}

fn nodes(dir: &Path, recipe: &Path, count: u32, extra: &[&str]) -> Vec<Daemon> {
    (0..count)
        .map(|n| node(dir, recipe, n, count, extra))
        .collect()
}

/// Every rank's taps from `start` for `steps` steps, its output files (checked later).
fn pull(dir: &Path, daemons: &[Daemon], start: u64, steps: u64, tag: &str) -> Vec<PathBuf> {
    let daemons: Vec<&Daemon> = daemons.iter().collect();
    tap_all(dir, &daemons, 4, start, steps, tag, &[])
}

#[test]
fn two_node_daemons_change_course_and_serve_exactly_the_packed_lineage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = recipes(dir);
    let change = ["--resume", "latest", "--change-course"];
    let resume = ["--resume", "latest"];
    // A to step 40, SIGKILL.
    let daemons = nodes(dir, &a, 2, &[]);
    let mut outs = vec![pull(dir, &daemons, 0, 40, "a")];
    drop(daemons);
    // B from step 40 (weights changed, finemath added), SIGKILL at step 67.
    let daemons = nodes(dir, &b, 2, &change);
    outs.push(pull(dir, &daemons, 40, 27, "b"));
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
    drop(daemons);

    let state = dir.join("state");
    let packed_out = dir.join("lineage");
    dsprep_ok(&[
        "pack",
        "--lineage",
        state.to_str().unwrap(),
        "--out",
        packed_out.to_str().unwrap(),
        "--quiet",
    ]);
    let packed = PackedDataset::open(&packed_out).unwrap();
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
