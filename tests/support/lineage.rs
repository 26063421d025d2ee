//! Changing course (tests/lineage.rs, tests/lineage_units.rs, tests/lineage_packing.rs,
//! tests/lineage_lanes_packing.rs):
//! recipes edited from the quickstart, a daemon restarted with `--change-course`, `dsprep pack
//! --lineage`, and packed windows as bytes.

use super::daemon::{Daemon, refused_v3};
use super::serve_run::Run;
use super::{dsprep_ok, quickstart_variant};
use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};

/// Windows `range` of `data`, as bytes.
pub fn windows(data: &PackedDataset, range: std::ops::Range<u64>) -> Vec<u8> {
    range
        .flat_map(|w| data.window(w).unwrap().tokens.as_bytes().to_vec())
        .collect()
}

/// `dsprep pack --lineage FROM --out OUT` (a state directory or its lineage.json), opened.
pub fn pack_lineage(from: &Path, out: &Path) -> PackedDataset {
    pack_lineage_with(from, out, &[])
}

/// [`pack_lineage`] with `extra` flags (`--threads N`).
pub fn pack_lineage_with(from: &Path, out: &Path, extra: &[&str]) -> PackedDataset {
    let mut args = vec![
        "pack",
        "--lineage",
        from.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend(extra);
    dsprep_ok(&args);
    PackedDataset::open(out).unwrap()
}

/// The quickstart (absolute paths) with `replace` applied and the sources named in `drop` cut.
pub fn quickstart_edit(dir: &Path, name: &str, replace: &[(&str, &str)], drop: &[&str]) -> PathBuf {
    let path = quickstart_variant(dir, name, replace);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut blocks: Vec<&str> = text.split("[[source]]\n").collect();
    let head = blocks.remove(0).to_string();
    let kept: Vec<&str> = (blocks.into_iter())
        .filter(|b| {
            !drop
                .iter()
                .any(|d| b.starts_with(&format!("name = \"{d}\"")))
        })
        .collect();
    let text = head + "[[source]]\n" + &kept.join("[[source]]\n");
    std::fs::write(&path, text).unwrap();
    path
}

/// The daemon of `recipe` resumed from the run's state directory with `--change-course`.
pub fn change(run: &Run, recipe: &Path, world: u32, mb: u32) -> Daemon {
    run.start_with(
        recipe,
        world,
        mb,
        &["--resume", "latest", "--change-course"],
    )
    .unwrap()
}

/// [`change`] to `recipe` at 2 × 2, refused: the error.
pub fn change_fails(run: &Run, recipe: &Path) -> String {
    run.start_with(recipe, 2, 2, &["--resume", "latest", "--change-course"])
        .err()
        .unwrap()
}

/// A protocol v3 request to `daemon`: refused (status 10), whatever the recipe in force.
pub fn assert_refuses_v3(daemon: &Daemon) {
    refused_v3(daemon, 2);
}
