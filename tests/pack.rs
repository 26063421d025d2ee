//! `dsprep pack` end to end on the shipped quickstart and on generated fixtures: determinism
//! across thread counts, agreement with a sequential run of the core, the packed format and its
//! reader.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use std::path::{Path, PathBuf};

use dsprep::driver::{build_mixer, load_recipe};
use dsprep::pack::{self, PackOptions};
use dsprep_client::{BatchLayout, PackedDataset};
use dsprep_mixers::{Packer, Shuffler};
use support::*;

fn pack_quickstart(out: &std::path::Path, threads: usize, shard_bytes: u64) -> pack::PackReport {
    let options = PackOptions {
        recipe: quickstart(),
        out: out.to_path_buf(),
        threads,
        shard_bytes,
        force: false,
        progress: false,
        engine: dsprep_mixers::EngineChoice::Auto,
        checkpoint_secs: 60,
        fresh: false,
        plan: None,
        lineage: None,
    };
    pack::pack(&options).expect("the quickstart packs")
}

#[test]
fn output_is_byte_identical_whatever_the_thread_count_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let runs: Vec<_> = [(1, "a"), (2, "b"), (4, "c"), (2, "d")]
        .iter()
        .map(|&(threads, name)| {
            let out = tmp.path().join(name);
            let out_str = out.to_str().unwrap().to_string();
            let threads = threads.to_string();
            dsprep_ok(&[
                "pack",
                "--recipe",
                quickstart().to_str().unwrap(),
                "--out",
                &out_str,
                "--threads",
                &threads,
                "--quiet",
            ]);
            dir_bytes(&out)
        })
        .collect();
    assert!(runs[0].iter().any(|(name, _)| name == "tokens-00000.bin"));
    for other in &runs[1..] {
        assert_eq!(runs[0], *other, "every file of the output is identical");
    }
}

#[test]
fn threaded_pack_equals_a_sequential_run_of_the_core() {
    let tmp = tempfile::tempdir().unwrap();
    let report = pack_quickstart(&tmp.path().join("p"), 3, 1 << 20);
    // The same core, driven one document at a time on this thread.
    let loaded = load_recipe(&quickstart()).unwrap();
    let mut mixer = build_mixer(&loaded).unwrap();
    let mut shuffler = Shuffler::new(
        loaded.recipe.shuffle.buffer_size,
        loaded.recipe.shuffle.seed,
    );
    let mut packer = Packer::new(loaded.recipe.packing.window_tokens());
    let mut docs = Vec::new();
    while let Some(doc) = mixer.next_doc().unwrap() {
        docs.extend(shuffler.push(doc));
    }
    docs.extend(shuffler.flush());
    let mut windows = Vec::new();
    let mut ids = Vec::new();
    for doc in &docs {
        ids.clear();
        loaded.stage.encode_doc(&doc.text, &mut ids).unwrap();
        packer.push_doc(&ids, doc.pos.source, &mut windows);
    }
    let dataset = PackedDataset::open(&report.out).unwrap();
    assert_eq!(dataset.num_windows(), windows.len() as u64);
    for (i, want) in windows.iter().enumerate() {
        let got = dataset.window(i as u64).unwrap();
        assert_eq!(got.tokens.to_vec(), want.tokens, "window {i}");
        assert_eq!(got.doc_starts, want.doc_starts.as_slice(), "window {i}");
        assert_eq!(
            got.doc_sources,
            Some(want.doc_sources.as_slice()),
            "window {i}"
        );
        assert_eq!(got.lead_source, Some(want.lead_source), "window {i}");
    }
    assert_eq!(
        report.manifest.dropped_tail_tokens,
        packer.leftover().len() as u64
    );
    let docs_in_manifest: u64 = report.manifest.sources.iter().map(|s| s.documents).sum();
    assert_eq!(docs_in_manifest, docs.len() as u64);
}

#[test]
fn shard_size_changes_the_files_not_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let one = pack_quickstart(&tmp.path().join("one"), 2, 1 << 30);
    let window_bytes = 513 * 2;
    let many = pack_quickstart(&tmp.path().join("many"), 2, 100 * window_bytes);
    assert_eq!(one.manifest.shards.len(), 1);
    assert_eq!(
        many.manifest.shards.len() as u64,
        one.manifest.num_windows.div_ceil(100)
    );
    let concat = |dir: &std::path::Path| -> Vec<u8> {
        dir_bytes(dir)
            .into_iter()
            .filter(|(n, _)| n.starts_with("tokens-"))
            .flat_map(|(_, b)| b)
            .collect()
    };
    assert_eq!(concat(&one.out), concat(&many.out));
    assert_eq!(
        std::fs::read(one.out.join("doc_starts.u32")).unwrap(),
        std::fs::read(many.out.join("doc_starts.u32")).unwrap()
    );
}

#[test]
fn manifest_accounts_for_every_token_and_document() {
    let tmp = tempfile::tempdir().unwrap();
    let m = pack_quickstart(&tmp.path().join("p"), 2, 1 << 30).manifest;
    let tokens: u64 = m.sources.iter().map(|s| s.tokens).sum();
    assert_eq!(m.num_windows * 513 + m.dropped_tail_tokens, tokens);
    assert!(m.dropped_tail_tokens < 513);
    assert_eq!(m.dtype, dsprep_client::Dtype::U16);
    assert_eq!(m.tokenizer.vocab_size, 50257);
    assert_eq!(m.tokenizer.eos_id, 50256);
    assert_eq!(m.format_version, 4);
    assert_eq!(
        m.recipe_hash,
        load_recipe(&quickstart()).unwrap().recipe.hash()
    );
    let finemath = m.sources.iter().find(|s| s.name == "finemath").unwrap();
    // The sample's finemath files hold 16 rows with int_score 2 out of 80 per pass.
    assert_eq!(finemath.rows_filtered * 80, finemath.rows_read * 16);
    let fineweb = m.sources.iter().find(|s| s.name == "fineweb-edu").unwrap();
    // One row of the sample has empty text: skipped and counted on every pass.
    assert_eq!(
        fineweb.rows_empty,
        u64::from(fineweb.passes_completed) + u64::from(fineweb.rows_read % 120 != 0)
    );
    // all_exhausted: every source finished at least one pass.
    assert!(
        m.sources.iter().all(|s| s.passes_completed >= 1),
        "{:?}",
        m.sources
    );
    // Inputs: every shipped sample file of the active sources, with checksums.
    assert_eq!(m.inputs.len(), 2 + 3 + 2 + 1 + 2);
    assert!(
        m.inputs
            .iter()
            .all(|i| i.sha256.len() == 64 && i.size_bytes > 0)
    );
    assert!(
        m.inputs
            .iter()
            .any(|i| i.path == "samples/c4/en/c4-train.00001-of-00003.json.gz")
    );
    // The document index agrees with the EOS tokens: a document starts right after each EOS.
    let dataset = PackedDataset::open(tmp.path().join("p")).unwrap();
    for i in 1..dataset.num_windows() {
        let (prev, w) = (dataset.window(i - 1).unwrap(), dataset.window(i).unwrap());
        let starts_at_zero = w.doc_starts.first() == Some(&0);
        assert_eq!(
            starts_at_zero,
            prev.tokens.get(512) == Some(50256),
            "window {i}"
        );
    }
}

#[test]
fn batches_tile_the_windows_rank_by_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let report = pack_quickstart(&tmp.path().join("p"), 2, 1 << 30);
    let dataset = PackedDataset::open(&report.out).unwrap();
    let layout = BatchLayout {
        world_size: 8,
        micro_batch: 4,
    };
    let steps = dataset.num_steps(layout);
    assert_eq!(steps, dataset.num_windows() / 32);
    let mut seen = Vec::new();
    for step in [0, 1, steps - 1] {
        for rank in 0..8 {
            let batch = dataset.batch(step, rank, layout).unwrap();
            assert_eq!(batch.rows.len(), 4);
            seen.extend(batch.rows.iter().map(|w| w.index));
            for w in &batch.rows {
                assert_eq!(
                    w.tokens.to_vec(),
                    dataset.window(w.index).unwrap().tokens.to_vec()
                );
            }
        }
    }
    let want: Vec<u64> = [0, 1, steps - 1]
        .iter()
        .flat_map(|s| s * 32..s * 32 + 32)
        .collect();
    assert_eq!(seen, want);
    let err = dataset.batch(steps, 0, layout).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("step {steps} does not exist: {steps} steps at world size 8 × micro batch 4")
    );
    assert_eq!(
        dataset.batch(0, 8, layout).unwrap_err().to_string(),
        "rank 8 is not below world size 8"
    );
}

#[test]
fn verify_and_inspect_work_and_verify_catches_a_flipped_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    let out_str = out.to_str().unwrap();
    dsprep_ok(&[
        "pack",
        "--recipe",
        quickstart().to_str().unwrap(),
        "--out",
        out_str,
        "--quiet",
    ]);
    let ok = dsprep_ok(&["verify", out_str]);
    assert!(ok.starts_with(&format!("ok: {out_str} — ")), "{ok}");
    let text = dsprep_ok(&["inspect", out_str, "--window", "3"]);
    assert!(text.starts_with("window 3 of "), "{text}");
    assert!(text.contains("──── tokens 0.."), "{text}");
    // The stream chain the manifest records is recomputed from the windows.
    let manifest_path = out.join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path).unwrap();
    let mut m: dsprep_client::Manifest = serde_json::from_str(&original).unwrap();
    let last = m.chain.last_mut().unwrap();
    assert_eq!(last.windows, m.num_windows);
    let (windows, recorded) = (last.windows, last.chain.clone());
    last.chain = "ab".repeat(32);
    std::fs::write(&manifest_path, serde_json::to_string(&m).unwrap()).unwrap();
    let err = dsprep_fails(&["verify", out_str]);
    assert!(
        err.contains(&format!(
            "window {}: the stream chain after it is {recorded}, the manifest says {} (the \
             windows are not the ones packed)",
            windows - 1,
            "ab".repeat(32)
        )),
        "{err}"
    );
    std::fs::write(&manifest_path, original).unwrap();
    let shard = out.join("tokens-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[1000] ^= 0x01;
    std::fs::write(&shard, bytes).unwrap();
    let err = dsprep_fails(&["verify", out_str]);
    assert!(
        err.contains(&format!("{}: sha256 is ", shard.display())),
        "{err}"
    );
    assert!(err.contains("(the file changed after packing)"), "{err}");
}

#[test]
fn the_summary_reports_per_source_counts_and_the_mix() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    let stdout = dsprep_ok(&[
        "pack",
        "--recipe",
        quickstart().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    // The quickstart mixes by documents; the summary says so first, before any share is read.
    let mut lines = stdout.lines();
    let first = lines.next().unwrap_or_default();
    assert!(first.starts_with("mix: by DOCUMENTS"), "{stdout}");
    assert!(first.contains("NOT of the tokens"), "{stdout}");
    assert!(
        lines.next().unwrap_or_default().starts_with("packed "),
        "{stdout}"
    );
    for name in [
        "fineweb-edu",
        "c4",
        "zyda-2",
        "the-stack-v2",
        "finemath",
        "dropped tail:",
    ] {
        assert!(stdout.contains(name), "{name} missing from:\n{stdout}");
    }
}

/// `[mix] unit = "tokens"` on the quickstart: every source's share of the tokens is its weight,
/// within about one of its documents; the bytes do not depend on the thread count.
#[test]
fn a_mix_in_tokens_holds_the_quickstart_shares_whatever_the_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = quickstart_in_tokens(tmp.path());
    let mut runs = Vec::new();
    let mut summary = String::new();
    for threads in ["1", "2"] {
        let out = tmp.path().join(format!("t{threads}"));
        summary = dsprep_ok(&[
            "pack",
            "--recipe",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--threads",
            threads,
            "--quiet",
        ]);
        runs.push(dir_bytes(&out));
    }
    assert_eq!(runs[0], runs[1], "1 and 2 threads write the same files");
    let dataset = PackedDataset::open(tmp.path().join("t1")).unwrap();
    let m = dataset.manifest();
    let total: u64 = m.sources.iter().map(|s| s.tokens).sum();
    for s in &m.sources {
        let off = s.realized_token_fraction - s.target_fraction;
        // The Stack's 20 repository documents are ~0.5 % of the stream each.
        assert!(
            off.abs() < 0.01,
            "{}: {off:+.4} off its share of tokens",
            s.name
        );
        let share = s.tokens as f64 / total as f64;
        assert!((s.realized_token_fraction - share).abs() < 1e-12, "{s:?}");
    }
    let stack = m.sources.iter().find(|s| s.name == "the-stack-v2").unwrap();
    assert!(
        stack.realized_fraction < 0.02 && stack.realized_token_fraction > 0.09,
        "10 % of the tokens from 1 % of the documents: {stack:?}"
    );
    assert!(
        summary.contains("target: share of tokens (recipe [mix] unit)"),
        "{summary}"
    );
    assert!(summary.starts_with("mix: in TOKENS"), "{summary}");
    let documents = pack_quickstart(&tmp.path().join("d"), 2, 1 << 30).manifest;
    let stack = documents
        .sources
        .iter()
        .find(|s| s.name == "the-stack-v2")
        .unwrap();
    assert!(
        stack.realized_token_fraction > 0.5,
        "in documents the same weight gives The Stack most of the tokens: {stack:?}"
    );
}

/// Format 3: every token of every window has its document's source, and per source the tokens
/// in the windows plus the dropped tail are the manifest's counts, in documents and in tokens.
#[test]
fn every_windowed_token_has_its_source_and_the_counts_match_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let in_tokens = quickstart_in_tokens(tmp.path());
    for (name, recipe) in [("documents", quickstart()), ("tokens", in_tokens)] {
        let dataset = pack_dataset(&recipe, &tmp.path().join(name));
        let m = dataset.manifest();
        assert_eq!(m.format_version, 4);
        let mut counted = vec![0u64; m.sources.len()];
        for w in 0..dataset.num_windows() {
            let window = dataset.window(w).unwrap();
            let docs = window.doc_sources.unwrap();
            assert_eq!(docs.len(), window.doc_starts.len());
            let all = dsprep_client::batch::token_sources(
                window.tokens.len(),
                window.doc_starts,
                docs,
                window.lead_source.unwrap(),
            );
            for s in all {
                counted[s as usize] += 1;
            }
            assert_eq!(window.input_sources().unwrap().len(), 512);
        }
        let mut tail = 0;
        for (s, &c) in m.sources.iter().zip(&counted) {
            assert!(
                c <= s.tokens,
                "{name}: {} windows hold {c} of its {} tokens",
                s.name,
                s.tokens
            );
            tail += s.tokens - c;
        }
        assert_eq!(
            tail, m.dropped_tail_tokens,
            "{name}: only the tail is missing"
        );
    }
}

/// Packs of format 3 (no phase ledger), 2 (no document sources) and 1 (no stream chain either)
/// still read and verify; windows of formats 1 and 2 have no sources.
#[test]
fn packs_of_formats_1_and_2_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    pack_quickstart(&out, 2, 1 << 30);
    let now = PackedDataset::open(&out)
        .unwrap()
        .window(7)
        .unwrap()
        .tokens
        .to_vec();
    let path = out.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m.as_object_mut().unwrap().remove("phases");
    m["format_version"] = 3.into();
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    let three = PackedDataset::open(&out).unwrap();
    assert!(three.manifest().phases.is_empty());
    assert_eq!(three.window(7).unwrap().tokens.to_vec(), now, "format 3");
    dsprep_ok(&["verify", out.to_str().unwrap()]);
    let table = dsprep_ok(&["inspect", out.to_str().unwrap(), "--mix"]);
    assert!(table.starts_with("stream: tokens 0..the end"), "{table}");
    for version in [2, 1] {
        let object = m.as_object_mut().unwrap();
        object.remove("doc_sources");
        object.remove("lead_sources");
        if version == 1 {
            object.remove("chain");
        }
        object.insert("format_version".into(), version.into());
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
        std::fs::remove_file(out.join("doc_sources.u16")).ok();
        std::fs::remove_file(out.join("lead_sources.u16")).ok();
        let old = PackedDataset::open(&out).unwrap();
        let window = old.window(7).unwrap();
        assert_eq!(window.tokens.to_vec(), now, "format {version}");
        assert_eq!((window.doc_sources, window.lead_source), (None, None));
        assert_eq!(window.input_sources(), None);
        dsprep_ok(&["verify", out.to_str().unwrap()]);
        let err = dsprep_fails(&["inspect", out.to_str().unwrap(), "--mix"]);
        assert!(
            err.contains(&format!(
                "format {version} records no document sources (format 3 does)"
            )),
            "{err}"
        );
    }
}

/// `dsprep inspect --mix`: the ledger from the windows, and a CSV of the shares along the stream.
#[test]
fn inspect_mix_prints_the_ledger_and_writes_the_shares_along_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    let dataset = pack_dataset(&quickstart_in_tokens(tmp.path()), &out);
    let csv = tmp.path().join("mix.csv");
    let table = dsprep_ok(&[
        "inspect",
        out.to_str().unwrap(),
        "--mix",
        "--every",
        "100000",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let total = dataset.num_windows() * 513;
    assert!(
        table.starts_with(&format!(
            "stream: tokens 0..the end, {total} tokens and {} document starts in windows (targets are shares of tokens)",
            dataset.manifest().num_doc_starts
        )),
        "{table}"
    );
    for s in &dataset.manifest().sources {
        let line = table.lines().find(|l| l.starts_with(&s.name)).unwrap();
        let off: f64 = line.split_whitespace().last().unwrap().parse().unwrap();
        assert!(off.abs() < 1.0, "{line}");
        assert!(
            line.contains(&format!("{:.2}%", 100.0 * s.target_fraction)),
            "{line}"
        );
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        text.lines().next().unwrap(),
        "tokens,span:fineweb-edu,span:c4,span:zyda-2,span:the-stack-v2,span:finemath,\
         total:fineweb-edu,total:c4,total:zyda-2,total:the-stack-v2,total:finemath"
    );
    assert_eq!(rows.len() as u64, total.div_ceil(100_000));
    for (k, row) in rows.iter().enumerate() {
        let at = if k + 1 == rows.len() {
            total
        } else {
            (k as u64 + 1) * 100_000
        };
        assert_eq!(row[0] as u64, at);
        for shares in [&row[1..6], &row[6..11]] {
            assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-5, "{row:?}");
        }
    }
    // Documents of unknown source (65535: pending in a checkpoint of an older dsprep) count in
    // no source, and the rows still fall every 100,000 tokens.
    let sources = out.join("lead_sources.u16");
    let mut bytes = std::fs::read(&sources).unwrap();
    bytes[..400].fill(0xff); // the first 200 windows' leads
    std::fs::write(&sources, bytes).unwrap();
    dsprep_ok(&[
        "inspect",
        out.to_str().unwrap(),
        "--every",
        "100000",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let again = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(again.lines().count(), text.lines().count(), "{again}");
    // The last row's totals are the table's shares of tokens.
    let last = rows.last().unwrap();
    for (i, s) in dataset.manifest().sources.iter().enumerate() {
        let line = table.lines().find(|l| l.starts_with(&s.name)).unwrap();
        let pct: f64 = line
            .split_whitespace()
            .nth(2)
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!(
            (pct - 100.0 * last[6 + i]).abs() < 0.006,
            "{line} vs {last:?}"
        );
    }
}

/// `dsprep inspect --plot`: an SVG of the stated size with, per source, its share along the
/// stream (two lines), its target and its document-length bars.
#[test]
fn inspect_plot_draws_the_shares_and_the_document_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    pack_dataset(&quickstart_with_a_phase(tmp.path(), 400_000), &out);
    let svg = tmp.path().join("mix.svg");
    let said = dsprep_ok(&[
        "inspect",
        out.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        said.contains("drew 960×720 SVG of the shares every 3762 tokens"),
        "{said}"
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="960" height="720" viewBox="0 0 960 720""#
    ));
    assert!(text.ends_with("</svg>\n"));
    assert_eq!(
        text.matches("<polyline").count(),
        2 * 5,
        "per source: so far, and per span"
    );
    // Targets: 5 sources in phase 0, 3 in phase 1 (c4 and zyda-2 have target 0 there: drawn too).
    assert_eq!(text.matches("stroke-dasharray").count(), 2 * 5);
    for name in ["fineweb-edu", "c4", "zyda-2", "the-stack-v2", "finemath"] {
        assert!(text.contains(&format!(">{name}</text>")), "legend {name}");
    }
    assert!(
        text.matches("<rect").count() > 6 + 5,
        "histogram bars besides background and legend"
    );
    let opened = text.matches('<').count();
    let closed = text.matches("/>").count() + text.matches("</").count() * 2;
    assert_eq!(opened, closed, "every element is closed");
}

/// `dsprep plan` off a terminal logs each source as it is listed (every update with
/// `DSPREP_PROGRESS_SECS=0`): a long Hub listing shows how far it got.
#[test]
fn plan_logs_its_progress_source_by_source() {
    let done = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"))
        .args(["plan", "--recipe", quickstart().to_str().unwrap()])
        .env("DSPREP_PROGRESS_SECS", "0")
        .output()
        .unwrap();
    assert!(done.status.success());
    let log = String::from_utf8_lossy(&done.stderr);
    for (k, (name, shards)) in [
        ("fineweb-edu", 2),
        ("c4", 3),
        ("zyda-2", 2),
        ("the-stack-v2", 1),
        ("finemath", 2),
    ]
    .iter()
    .enumerate()
    {
        let line = format!(
            "plan progress: listed source {name:?} ({} of 5): {shards} shards",
            k + 1
        );
        assert!(log.contains(&line), "{line} missing from:\n{log}");
    }
}

fn pack_fixture(
    dir: &std::path::Path,
    recipe_text: &str,
) -> (pack::PackReport, dsprep::driver::LoadedRecipe) {
    let recipe = write_recipe(dir, recipe_text);
    let options = PackOptions {
        recipe: recipe.clone(),
        out: dir.join("p"),
        threads: 2,
        shard_bytes: 1 << 20,
        force: false,
        progress: false,
        engine: dsprep_mixers::EngineChoice::Auto,
        checkpoint_secs: 60,
        fresh: false,
        plan: None,
        lineage: None,
    };
    (pack::pack(&options).unwrap(), load_recipe(&recipe).unwrap())
}

#[test]
fn first_exhausted_stops_when_the_smallest_source_runs_out() {
    let tmp = tempfile::tempdir().unwrap();
    write_c4_gz(
        &tmp.path().join("small.json.gz"),
        &["alpha one", "alpha two", "alpha three"],
    );
    let many: Vec<String> = (0..1000).map(|i| format!("beta {i}")).collect();
    write_c4_gz(
        &tmp.path().join("big.json.gz"),
        &many.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let sources = "[[source]]\nname = \"small\"\nfiles = [\"small.json.gz\"]\nformat = \"jsonl.gz\"\n\
                   [[source]]\nname = \"big\"\nfiles = [\"big.json.gz\"]\nformat = \"jsonl.gz\"\n";
    let (report, _) = pack_fixture(tmp.path(), &recipe(4, 0, "first_exhausted", sources));
    let s = &report.manifest.sources;
    assert_eq!(s[0].documents, 3, "the small source is read to its end");
    assert_eq!(s[0].passes_completed, 1);
    assert!(s[1].documents < 1000 && s[1].passes_completed == 0, "{s:?}");
}

#[test]
fn text_is_joined_from_a_list_of_structs() {
    let tmp = tempfile::tempdir().unwrap();
    let repos = [
        r#"{"repo_name":"r1","files":[{"path":"a.py","content":"print(1)"},{"path":"b.py","content":"print(2)"}]}"#,
        r#"{"repo_name":"r2","files":[{"path":"c.py","content":null},{"path":"d.py","content":"x = 3"}]}"#,
        r#"{"repo_name":"r3","files":[]}"#,
    ];
    std::fs::write(tmp.path().join("code.jsonl"), repos.join("\n")).unwrap();
    let sources = "[[source]]\nname = \"code\"\nfiles = [\"code.jsonl\"]\nformat = \"jsonl\"\n\
                   text = { list = \"files\", field = \"content\", separator = \"\\n#--\\n\" }\n";
    let (report, loaded) = pack_fixture(tmp.path(), &recipe(2, 0, "first_exhausted", sources));
    assert_eq!(report.manifest.sources[0].documents, 2);
    assert_eq!(
        report.manifest.sources[0].rows_empty, 1,
        "a repository with no files is an empty document"
    );
    let mut want = Vec::new();
    for text in ["print(1)\n#--\nprint(2)", "x = 3"] {
        loaded.stage.encode_doc(text, &mut want).unwrap();
    }
    let dataset = PackedDataset::open(&report.out).unwrap();
    let got: Vec<u32> = (0..dataset.num_windows())
        .flat_map(|i| dataset.window(i).unwrap().tokens.to_vec())
        .collect();
    assert_eq!(got, want[..want.len() / 3 * 3]);
    assert_eq!(report.manifest.dropped_tail_tokens as usize, want.len() % 3);
}

/// The golden output of format v1: the quickstart's bytes are part of the product's promise. If
/// this fails, a change altered the token stream of an unchanged recipe: that needs a recipe or
/// format version bump, never a silent update of these values.
#[test]
fn quickstart_output_is_pinned() {
    let tmp = tempfile::tempdir().unwrap();
    let m = pack_quickstart(&tmp.path().join("p"), 2, 1 << 30).manifest;
    assert_eq!(
        m.recipe_hash,
        "23742857b87ba2497bbf41cc2152754329f1929ec4fddc43986a32ba5e6d9f77"
    );
    assert_eq!(m.num_windows, 4050);
    assert_eq!(
        m.shards[0].sha256,
        "4ae14cf59bde37a13d4d24dde59a3e317257d9c9010b63542b73f820dc1d812a"
    );
    assert_eq!(
        m.doc_starts.sha256,
        "15a78fa8a8d5fd492fb4f1f597a477082fe16e182a350fe88ea88db8c5d11cac"
    );
}

#[test]
fn every_shipped_recipe_loads_and_lists_its_files() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(repo_root().join("config")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let loaded = load_recipe(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            // Hub presets are listed against a fake Hub in tests/hub.rs: no network here.
            if !loaded.recipe.needs_network() {
                build_mixer(&loaded).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            }
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(names.contains(&"quickstart.toml".to_string()), "{names:?}");
}

/// The quickstart recipe with another tokenizer, written to `dir` (sample paths made absolute).
fn quickstart_with_tokenizer(dir: &Path, tokenizer: &Path, eos: &str) -> PathBuf {
    let samples = repo_root().join("config/samples/");
    let recipe = std::fs::read_to_string(quickstart())
        .unwrap()
        .replace(
            "path = \"tokenizers/gpt2/tokenizer.json\"",
            &format!("path = {:?}", tokenizer.to_str().unwrap()),
        )
        .replace("eos = \"<|endoftext|>\"", &format!("eos = {eos:?}"))
        .replace("\"samples/", &format!("\"{}", samples.to_str().unwrap()));
    let path = dir.join("recipe.toml");
    std::fs::write(&path, recipe).unwrap();
    path
}

/// The engine line of `Auto` where HF tokenizers 1.x encodes.
const HF1_AUTO: &str = "tokenizer engine: HF tokenizers 1.0.0-rc.3 (byte-level BPE, where dsprep's \
                        own engine is not 1.25 × faster (BENCHMARKS.md, \"Tokenizer engines\"))";

/// Every engine packs the same bytes: `auto` (HF tokenizers 1.x for byte-level BPE, dsprep's own
/// for SentencePiece-style BPE and for Command R+), `own` (dsprep's own engine wherever it
/// reproduces the file) and `hf` (HF tokenizers 0.23), for every tokenizer at hand; each engine
/// line says which engine ran.
#[test]
fn every_tokenizer_engine_packs_identical_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    // (name, tokenizer, EOS, what auto runs: HF 1.x or dsprep's own engine, what the own
    // engine's line names)
    let own = "tokenizer engine: fast path: ";
    let mut tokenizers = vec![
        (
            "gpt2",
            gpt2_tokenizer(),
            "<|endoftext|>",
            HF1_AUTO,
            "GPT-2 scanner",
        ),
        // Qwen3 normalizes with NFC, which HF 1.x applies with other Unicode tables than 0.23:
        // dsprep's own engine under auto, on the cl100k family's scanner.
        (
            "qwen3",
            repo_root().join("config/tokenizers/qwen3/tokenizer.json"),
            "<|endoftext|>",
            own,
            "cl100k-family scanner",
        ),
    ];
    let fetched = [
        (
            "llama3",
            "<|end_of_text|>",
            HF1_AUTO,
            "cl100k-family scanner",
        ),
        ("cl100k", "<|endoftext|>", HF1_AUTO, "cl100k-family scanner"),
        // Command R+: each digit cut off (Digits) before GPT-2's pattern, on the GPT-2 scanner,
        // and Claude's 2023 file, NFKC before GPT-2's pattern: dsprep's own under auto too (HF
        // 1.x applies NFC and NFKC with other Unicode tables than 0.23).
        ("command_r", "<EOS_TOKEN>", own, "Digits (each) then"),
        ("claude", "<EOT>", own, "normalizer NFKC"),
        ("o200k", "<|endoftext|>", HF1_AUTO, "pre-tokenizer regex"),
        ("tekken", "</s>", HF1_AUTO, "pre-tokenizer regex"),
        // SentencePiece-style BPE with byte fallback (Mistral 7B's file).
        ("llama2", "</s>", own, "SentencePiece-style BPE"),
        // Three regex Splits one after another.
        (
            "deepseek_v3",
            "<｜end▁of▁sentence｜>",
            HF1_AUTO,
            "pre-tokenizer regex",
        ),
        // SentencePiece-style without the prepended "▁": Gemma (and Gemma 2), Gemma 3, Yi.
        ("gemma", "<eos>", own, "normalizer Replace"),
        ("gemma3", "<eos>", own, "normalizer Replace"),
        ("yi", "<|endoftext|>", own, "normalizer Replace"),
    ];
    for (name, eos, auto, marker) in fetched {
        if let Some(path) = fetched_tokenizer(name) {
            tokenizers.push((name, path, eos, auto, marker));
        }
    }
    // Mistral 7B's file as recent `transformers` writes it: a Metaspace pre-tokenizer instead of
    // the normalizer, "▁" prepended to the document's first stretch only.
    if let Some(llama2) = fetched_tokenizer("llama2") {
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(llama2).unwrap()).unwrap();
        json["normalizer"] = serde_json::Value::Null;
        json["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "\u{2581}",
            "prepend_scheme": "first", "split": false});
        let path = tmp.path().join("llama2-metaspace.json");
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        tokenizers.push((
            "llama2-metaspace",
            path,
            "</s>",
            own,
            "Metaspace (prepend_scheme first)",
        ));
    }
    for (name, tokenizer, eos, auto, marker) in tokenizers {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let recipe = quickstart_with_tokenizer(&dir, &tokenizer, eos);
        let mut outputs = Vec::new();
        for engine in ["auto", "own", "hf"] {
            let out = dir.join(engine);
            let stdout = dsprep_ok(&[
                "pack",
                "--recipe",
                recipe.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--quiet",
                "--tokenizer-engine",
                engine,
            ]);
            let line = stdout
                .lines()
                .find(|l| l.starts_with("tokenizer engine: "))
                .unwrap()
                .to_string();
            outputs.push((line, dir_bytes(&out)));
        }
        assert!(
            outputs[0].0.starts_with(auto),
            "{name}: auto runs {auto}: {}",
            outputs[0].0
        );
        assert!(
            outputs[1].0.starts_with(own) && outputs[1].0.contains(marker),
            "{name}: the own engine with {marker}: {}",
            outputs[1].0
        );
        assert_eq!(
            outputs[2].0,
            "tokenizer engine: HF tokenizers (engine Hf was asked for)"
        );
        assert!(
            outputs[0].1 == outputs[2].1 && outputs[1].1 == outputs[2].1,
            "{name}: the engines wrote different bytes"
        );
    }
}

/// The engine cache (DSPREP_ENGINE_CACHE): the first pack keeps the engine chosen for GPT-2 (HF
/// tokenizers 1.x) in one file named by the tokenizer's sha256, the next starts from there, a
/// damaged entry is ignored (the engine line says why) and replaced, `off` keeps nothing; the
/// bytes packed are the same every time.
#[test]
fn the_engine_cache_is_kept_used_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("engines");
    let pack_with = |value: &Path, out: &str| -> (String, Vec<(String, Vec<u8>)>) {
        let out = tmp.path().join(out);
        let quickstart = quickstart();
        let args = pack_args(&quickstart, &out, &[]);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_dsprep"))
            .args(&args)
            .env("DSPREP_ENGINE_CACHE", value)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        let line = stdout
            .lines()
            .find(|l| l.starts_with(HF1_AUTO))
            .unwrap_or_else(|| panic!("no HF 1.x engine line in {stdout}"))
            .to_string();
        (line, dir_bytes(&out))
    };
    let sha = hex_sha256(&std::fs::read(gpt2_tokenizer()).unwrap());
    let entry = cache.join(format!("{sha}.engine"));

    let (first, bytes) = pack_with(&cache, "first");
    assert!(!first.contains("engine cache"), "{first}");
    let names: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [format!("{sha}.engine")]);
    let sound = std::fs::read(&entry).unwrap();
    assert!(sound.starts_with(b"dsprep-engine-cache/8 "));

    let (second, second_bytes) = pack_with(&cache, "second");
    assert!(second.ends_with("(chosen by the engine cache)"), "{second}");
    assert!(second_bytes == bytes, "packed from the cache: other bytes");

    let mut damaged = sound.clone();
    let at = damaged.len() - 10;
    damaged[at] ^= 0x20;
    std::fs::write(&entry, &damaged).unwrap();
    let (third, third_bytes) = pack_with(&cache, "third");
    assert!(
        third.ends_with(
            "; engine cache entry ignored: payload does not match its sha256 (corrupt or cut short)"
        ),
        "{third}"
    );
    assert!(third_bytes == bytes, "past a damaged entry: other bytes");
    let replaced = std::fs::read(&entry).unwrap();
    assert!(replaced.starts_with(b"dsprep-engine-cache/8 ") && replaced != damaged);

    let (off, off_bytes) = pack_with(Path::new("off"), "off");
    assert!(!off.contains("engine cache"), "{off}");
    assert!(off_bytes == bytes);

    // A cache that cannot be written (a file where its directory would be) costs nothing.
    let blocked = tmp.path().join("a-file");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let (line, blocked_bytes) = pack_with(&blocked.join("engines"), "blocked");
    assert!(!line.contains("engine cache"), "{line}");
    assert!(blocked_bytes == bytes);
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
