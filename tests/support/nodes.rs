//! Node daemons of the multinode recipe (`config/quickstart-multinode.toml`) for the tests:
//! their arguments, starting them on ipc sockets, and reading every rank's bytes.

use super::daemon::{Daemon, assert_tap_chains, tap_all};
use super::repo_root;
use std::path::{Path, PathBuf};

pub fn multinode() -> PathBuf {
    repo_root().join("config/quickstart-multinode.toml")
}

/// `dsprep pack` of the multinode recipe into `dir/whole` (the real binary, default settings:
/// what node daemons and parts must equal), opened.
pub fn packed_multinode(dir: &Path) -> dsprep_client::PackedDataset {
    let out = dir.join("whole");
    super::dsprep_ok(&[
        "pack",
        "--recipe",
        multinode().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    dsprep_client::PackedDataset::open(&out).unwrap()
}

/// `serve` arguments for node `node` of `nodes` serving `world × micro_batch`, sharing
/// `dir/state`, plus `extra`.
pub fn node_args(
    dir: &Path,
    node: u32,
    nodes: u32,
    world: u32,
    micro_batch: u32,
    extra: &[&str],
) -> Vec<String> {
    let state = dir.join("state");
    let mut args: Vec<String> = [
        "--world-size",
        &world.to_string(),
        "--micro-batch",
        &micro_batch.to_string(),
        "--node-rank",
        &node.to_string(),
        "--nodes",
        &nodes.to_string(),
        "--state-dir",
        state.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// Node `node` of `nodes` of the multinode recipe on `dir/node<N>.sock` (see [`node_args`]).
pub fn start_node(
    dir: &Path,
    node: u32,
    nodes: u32,
    world: u32,
    micro_batch: u32,
    extra: &[&str],
) -> Result<Daemon, String> {
    let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
    let args = node_args(dir, node, nodes, world, micro_batch, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(&multinode(), &endpoint, &args)
}

/// All `nodes` node daemons (see [`start_node`]).
pub fn start_nodes(
    dir: &Path,
    nodes: u32,
    world: u32,
    micro_batch: u32,
    extra: &[&str],
) -> Vec<Daemon> {
    (0..nodes)
        .map(|node| start_node(dir, node, nodes, world, micro_batch, extra).unwrap())
        .collect()
}

/// [`tap_all`]'s outputs for world 4, read, after checking every step's chain against `marks`.
pub fn tap_all_bytes(
    dir: &Path,
    daemons: &[&Daemon],
    start: u64,
    steps: u64,
    tag: &str,
    marks: &[String],
) -> Vec<Vec<u8>> {
    // Like a resumed trainer, each tap holds the daemons to the chain before its first step.
    let expect = ["--expect-chain", &marks[start as usize * 4]];
    tap_all(dir, daemons, 4, start, steps, tag, &expect)
        .into_iter()
        .map(|out| {
            assert_eq!(assert_tap_chains(&out, marks), steps as usize, "{tag}");
            std::fs::read(out).unwrap()
        })
        .collect()
}
