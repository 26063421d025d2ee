//! Node daemons change their packing at a change of course: the multinode recipe (`[lanes]`)
//! served by 2 node daemons to real `dsprep tap` ranks, SIGKILLed, resumed with the other
//! packing (`concat` → `best_fit`, and `best_fit` → `concat`; once also mixing in tokens instead
//! of documents, a source removed), SIGKILLed again and resumed. Each lane's packer (and state)
//! takes over at the lane's own point. Every rank's bytes (and each row's real
//! tokens) must be exactly `dsprep pack --lineage` of the state directory (format 7, each
//! segment's packing with its first window in each lane), which `dsprep verify --lineage`
//! passes.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::PackedDataset;
use std::path::{Path, PathBuf};
use support::daemon::{Daemon, expected_rank_bytes, headers, tap_all};
use support::lineage::assert_refuses_v3;
use support::nodes::{multinode, node_args};
use support::{dsprep_fails, dsprep_ok, recipe_variant};

/// The multinode recipe's `[packing]`.
const CONCAT: &str = "seq_len = 512 ";

/// The multinode recipe as `name`, with `best_fit` (a pool of 64) when asked; reweighted when
/// asked (a change must change something besides the packing for a test to see the mix move).
fn recipe(dir: &Path, name: &str, best_fit: bool, reweight: bool) -> PathBuf {
    recipe_with(dir, name, best_fit, reweight, &[])
}

/// [`recipe`] with `more` edits.
fn recipe_with(
    dir: &Path,
    name: &str,
    best_fit: bool,
    reweight: bool,
    more: &[(&str, &str)],
) -> PathBuf {
    let mut edits = vec![("buffer_size = 1000", "buffer_size = 100")];
    edits.extend_from_slice(more);
    if best_fit {
        edits.push((
            CONCAT,
            "seq_len = 512\nstrategy = \"best_fit\"\npool_documents = 64\n",
        ));
    }
    if reweight {
        edits.push(("weight = 0.40", "weight = 0.10"));
    }
    recipe_variant(&multinode(), dir, name, &edits)
}

/// The 2 node daemons of `recipe`, world 4 × micro batch 1.
fn nodes(dir: &Path, recipe: &Path, extra: &[&str]) -> Vec<Daemon> {
    (0..2)
        .map(|node| {
            let endpoint = format!("ipc://{}", dir.join(format!("node{node}.sock")).display());
            let mut more = vec!["--checkpoint-every", "3", "--metrics", "off"];
            more.extend_from_slice(extra);
            let args = node_args(dir, node, 2, 4, 1, &more);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Daemon::start_with(recipe, &endpoint, &args).unwrap()
        })
        .collect()
}

/// A from step 0 to 20, SIGKILL; B (`--change-course`) from 20 to 30, SIGKILL; B resumed from
/// 30 to 40, each node daemon then refusing protocol v3 (the lineage pads, whatever B does).
/// Returns every rank's pulls in order.
fn serve(dir: &Path, a: &Path, b: &Path) -> Vec<Vec<PathBuf>> {
    let daemons = nodes(dir, a, &[]);
    let mut outs = vec![tap(dir, &daemons, 0, 20, "a")];
    drop(daemons);
    let daemons = nodes(dir, b, &["--resume", "latest", "--change-course"]);
    outs.push(tap(dir, &daemons, 20, 10, "b"));
    let log = daemons[1].log_text();
    assert!(log.contains("node 0 changed course at step 20"), "{log}");
    drop(daemons);
    let daemons = nodes(dir, b, &["--resume", "latest"]);
    outs.push(tap(dir, &daemons, 30, 10, "c"));
    daemons.iter().for_each(assert_refuses_v3);
    drop(daemons);
    outs
}

fn tap(dir: &Path, daemons: &[Daemon], start: u64, steps: u64, tag: &str) -> Vec<PathBuf> {
    let daemons: Vec<&Daemon> = daemons.iter().collect();
    tap_all(dir, &daemons, 4, start, steps, tag, &[])
}

/// `dsprep pack --lineage STATE` (every lane, then the finish), which `dsprep verify --lineage`
/// passes; opened.
fn pack_lineage(dir: &Path) -> PackedDataset {
    let (state, out) = (dir.join("state"), dir.join("lineage"));
    let (state_s, out_s) = (state.to_str().unwrap(), out.to_str().unwrap());
    dsprep_ok(&["pack", "--lineage", state_s, "--out", out_s, "--quiet"]);
    let verified = dsprep_ok(&["verify", out_s, "--lineage", state_s]);
    assert!(verified.contains("packs the lineage"), "{verified}");
    PackedDataset::open(&out).unwrap()
}

/// Every rank's bytes and rows' real tokens over 40 steps are the packed lineage's.
fn assert_served_is_packed(outs: &[Vec<PathBuf>], packed: &PackedDataset) {
    let (mut rows, mut padded_rows) = (0, 0);
    for rank in 0..4u64 {
        let want = expected_rank_bytes(packed, 4, 1, rank);
        let mut got = Vec::new();
        for part in outs {
            let out = &part[rank as usize];
            got.extend(std::fs::read(out).unwrap());
            for h in headers(out) {
                let window = h["step"].as_u64().unwrap() * 4 + rank;
                let real = packed.window(window).unwrap().real_tokens;
                assert_eq!(h["real_tokens"][0].as_u64(), Some(u64::from(real)));
                (real < 513).then(|| padded_rows += 1);
                rows += 1;
            }
        }
        assert_eq!(got.len(), 40 * 513 * 2, "rank {rank}");
        assert!(
            got == want[..got.len()],
            "rank {rank}: the served bytes differ from pack --lineage"
        );
    }
    assert_eq!(rows, 4 * 40, "a header for every row");
    assert!(padded_rows > 0, "no padded row was served");
}

/// Each segment's packing (format 7): its strategy and, per lane, its first window there.
fn packings(packed: &PackedDataset) -> Vec<(String, Vec<u64>)> {
    let m = packed.manifest();
    assert_eq!(m.format_version, 7);
    (m.lineage.as_ref().unwrap().iter())
        .map(|s| {
            let p = s.packing.as_ref().unwrap();
            assert!(p.first_window >= s.from_window);
            let lanes = p.lane_first_windows.clone().unwrap();
            assert_eq!(lanes.len(), 8);
            (p.strategy.clone(), lanes)
        })
        .collect()
}

/// Whether window `w` of the stream is padded: it is when it is in a `best_fit` segment in its
/// own lane (lane `b mod 8`, its window `(b div 8)·2 + w mod 2`, `b = w div 2`).
fn padded_at(packings: &[(String, Vec<u64>)], w: u64) -> bool {
    let (lane, own) = ((w / 2 % 8) as usize, w / 16 * 2 + w % 2);
    let k = packings.iter().rposition(|(_, l)| l[lane] <= own).unwrap();
    packings[k].0 == "best_fit"
}

fn assert_windows_packed_as(packed: &PackedDataset, packings: &[(String, Vec<u64>)]) {
    let mut padded = 0;
    for w in 0..packed.num_windows() {
        let window = packed.window(w).unwrap();
        match padded_at(packings, w) {
            true => {
                assert_eq!(window.doc_starts.first(), Some(&0), "window {w}");
                padded += 1;
            }
            false => assert_eq!(window.real_tokens, 513, "window {w}"),
        }
    }
    assert!(padded > 0);
}

#[test]
fn node_daemons_switch_concat_to_best_fit_lane_by_lane_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = recipe(dir, "a.toml", false, false);
    let b = recipe(dir, "b.toml", true, true);
    let outs = serve(dir, &a, &b);
    let packed = pack_lineage(dir);
    assert_served_is_packed(&outs, &packed);
    let packings = packings(&packed);
    assert_eq!(packings[0], ("concat".to_string(), vec![0; 8]));
    assert_eq!(packings[1].0, "best_fit");
    // Step 20 is window 80: every lane's own window 10 (5 rounds of 8 blocks of 2), or later.
    assert!(packings[1].1.iter().all(|&w| w >= 10), "{packings:?}");
    assert_windows_packed_as(&packed, &packings);
    assert!(packed.manifest().packing.as_ref().unwrap().padding_tokens > 0);

    // verify holds each window to its own lane's packing: the concat windows said to be padded
    // (every lane's best_fit from its window 0) fail.
    let out = dir.join("lineage");
    let manifest = out.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["lineage"][1]["packing"]["lane_first_windows"] = serde_json::json!(vec![0u64; 8]);
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let err = dsprep_fails(&["verify", out.to_str().unwrap()]);
    assert!(
        err.contains("with padding every window starts a document at 0"),
        "{err}"
    );
}

#[test]
fn node_daemons_switch_best_fit_to_concat_lane_by_lane_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = recipe(dir, "a.toml", true, false);
    let b = recipe(dir, "b.toml", false, true);
    let outs = serve(dir, &a, &b);
    let packed = pack_lineage(dir);
    assert_served_is_packed(&outs, &packed);
    let packings = packings(&packed);
    assert_eq!(packings[0], ("best_fit".to_string(), vec![0; 8]));
    assert_eq!(packings[1].0, "concat");
    assert!(packings[1].1.iter().all(|&w| w >= 10), "{packings:?}");
    assert_windows_packed_as(&packed, &packings);
}

#[test]
fn node_daemons_change_unit_source_and_packing_lane_by_lane_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = recipe(dir, "a.toml", false, false);
    // B mixes in tokens, stops drawing from c4 (weight 0) and packs best_fit.
    let tokens = [
        (
            "stopping = \"all_exhausted\"",
            "stopping = \"all_exhausted\"\nunit = \"tokens\"",
        ),
        ("weight = 0.15", "weight = 0.0"),
    ];
    let b = recipe_with(dir, "b.toml", true, false, &tokens);
    let outs = serve(dir, &a, &b);
    let packed = pack_lineage(dir);
    assert_served_is_packed(&outs, &packed);
    let packings = packings(&packed);
    assert_eq!(packings[1].0, "best_fit");
    assert_windows_packed_as(&packed, &packings);
    // The ledger of B's segment: c4 stopped, what it had drawn and not emitted dropped, and no
    // c4 document past the change in any lane.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("lineage/manifest.json")).unwrap()).unwrap();
    let b_segment = &manifest["lineage"][1];
    let sources = b_segment["sources"].as_array().unwrap();
    let c4 = sources.iter().find(|s| s["name"] == "c4");
    assert!(c4.is_none_or(|c4| c4["documents"] == 0), "{b_segment}");
    assert!(sources.iter().any(|s| s["documents"].as_u64() > Some(0)));
    let dropped = b_segment["dropped"].as_array().unwrap();
    assert!(
        dropped
            .iter()
            .any(|d| d["source"] == "c4" && d["documents"].as_u64() > Some(0)),
        "{b_segment}"
    );
}
