//! `best_fit` with `[[mix.phase]]`, end to end on real processes: the same windows at 1 and 2
//! threads, the phase ledger (manifest, `verify`, `inspect --mix`) counted by mixing position —
//! exactly what the mixer decided, checked against the `concat` pack of the same recipe, whose
//! windows keep the mixing order — served == packed for 8 ranks with `/metrics`' phase tokens agreeing, and a
//! daemon SIGKILLed on both sides of the phase boundary resuming exactly; with `[lanes]`, lane
//! parts + finish == one pack, each lane's documents in the phase of its own mixing position.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::PackedDataset;
use dsprep_mixers::ledger::{PhaseLedger, PhasePoints};
use std::path::{Path, PathBuf};
use support::daemon::{Daemon, assert_tap_chains, chain_marks, expected_rank_bytes, tap_all};
use support::nodes::multinode;
use support::serve_run::{Run, global_batches};
use support::*;

const WINDOW: u64 = 513;
const AT: u64 = 400_000;

/// The quickstart in tokens with a phase at 400 000 tokens, packed best-fit (a pool of 300).
fn phased_best_fit(dir: &Path) -> PathBuf {
    let phased = quickstart_with_a_phase(dir, AT);
    let replace = [(
        "seq_len = 512",
        "seq_len = 512\nstrategy = \"best_fit\"\npool_documents = 300",
    )];
    recipe_variant(&phased, dir, "bf-phase.toml", &replace)
}

/// Per phase, per source: (tokens, document starts) as the manifest gives them.
fn manifest_ledger(data: &PackedDataset) -> Vec<Vec<(u64, u64)>> {
    (data.manifest().phases.iter())
        .map(|p| p.sources.iter().map(|s| (s.tokens, s.documents)).collect())
        .collect()
}

/// What the mixer decided, read from the `concat` pack of the same mix (its windows keep the
/// mixing order: a start's place in the windows is its mixing position): per source, the
/// tokens and the `best_fit` document starts (a document over a window is cut into
/// `ceil(len / window)` pieces) of every document of phase 0, i.e. mixed before `AT`.
fn mixed_before_the_point(concat: &PackedDataset, sources: usize) -> Vec<(u64, u64)> {
    let mut starts: Vec<(u64, u16)> = Vec::new();
    for w in 0..concat.num_windows() {
        let window = concat.window(w).unwrap();
        let doc_sources = window.doc_sources.unwrap();
        for (&s, &source) in window.doc_starts.iter().zip(doc_sources) {
            starts.push((w * WINDOW + u64::from(s), source));
        }
    }
    let mut phase0 = vec![(0u64, 0u64); sources];
    for pair in starts.windows(2) {
        let ((start, source), (next, _)) = (pair[0], pair[1]);
        if start >= AT {
            break;
        }
        let len = next - start;
        phase0[usize::from(source)].0 += len;
        phase0[usize::from(source)].1 += len.div_ceil(WINDOW);
    }
    phase0
}

#[test]
fn best_fit_with_a_phase_packs_alike_at_any_thread_count_and_counts_where_the_mixer_decided() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = phased_best_fit(tmp.path());
    let (one, two) = (tmp.path().join("t1"), tmp.path().join("t2"));
    let summary = dsprep_ok(&pack_args(&recipe, &one, &["--threads", "1"]));
    dsprep_ok(&pack_args(&recipe, &two, &["--threads", "2"]));
    assert!(dir_bytes(&one) == dir_bytes(&two), "1 and 2 threads differ");
    let data = PackedDataset::open(&one).unwrap();
    let m = data.manifest().clone();
    assert_eq!(
        m.format_version, 6,
        "a best_fit pack with phases is format 6"
    );
    assert_eq!(
        m.doc_positions.as_ref().map(|f| f.file.as_str()),
        Some("doc_positions.u64")
    );
    let concat = pack_dataset(
        &quickstart_with_a_phase(tmp.path(), AT),
        &tmp.path().join("concat"),
    );
    let cm = concat.manifest();
    // Phase 0 holds exactly the documents mixed before the point: their tokens, and their
    // starts (pieces of cut documents included).
    let ledger = manifest_ledger(&data);
    let sources = m.sources.len();
    assert_eq!(ledger[0], mixed_before_the_point(&concat, sources));
    let tokens = |phases: &Vec<Vec<(u64, u64)>>, k: usize| -> u64 {
        phases[k].iter().map(|&(t, _)| t).sum::<u64>()
    };
    assert_eq!(
        (tokens(&ledger, 0), tokens(&manifest_ledger(&concat), 0)),
        (401_454, 401_454)
    );
    // Phase 1: the rest, the concat pack's dropped tail included (best_fit drops nothing).
    assert_eq!(
        tokens(&ledger, 1),
        tokens(&manifest_ledger(&concat), 1) + cm.dropped_tail_tokens
    );
    assert_eq!((tokens(&ledger, 1), cm.dropped_tail_tokens), (351_408, 291));
    let packing = m.packing.clone().unwrap();
    let documents: u64 = m.sources.iter().map(|s| s.documents).sum();
    let starts: u64 = m.phases.iter().map(|p| p.documents).sum();
    assert_eq!(
        starts,
        documents + packing.cut_pieces - packing.documents_cut
    );
    assert_eq!((m.phases[0].documents, m.phases[1].documents), (1077, 869));
    // c4 and zyda-2 leave the mix at the point: not one of their documents counts in phase 1,
    // though best_fit packs some of theirs after phase 1's first documents.
    for name in ["c4", "zyda-2"] {
        let i = m.sources.iter().position(|s| s.name == name).unwrap();
        assert_eq!(ledger[1][i], (0, 0), "{name}");
    }
    // Counted by window instead, the phases would be wrong: phase 1 documents land before
    // the point (the pool packs them with earlier ones).
    let began = m.phases[1].began_at_tokens.unwrap();
    assert!(began < AT, "phase 1's first document landed at {began}");
    let points = PhasePoints::from_parts(vec![AT], WINDOW, None);
    let mut by_window = PhaseLedger::new(&points, sources);
    for w in 0..data.num_windows() {
        let window = data.window(w).unwrap();
        let (sources, lead) = (window.doc_sources.unwrap(), window.lead_source.unwrap());
        let len = u64::from(window.real_tokens);
        by_window.add_window(&points, w, len, window.doc_starts, sources, lead);
    }
    assert_ne!(by_window.phases[0].total_tokens(), 401_454);
    // The summary, verify and inspect --mix say the same.
    assert!(
        summary.contains(
            "phase 1 (at 400000 tokens; its first document at 334476): 351408 tokens and 869 \
             document starts in windows"
        ),
        "{summary}"
    );
    assert!(dsprep_ok(&["verify", one.to_str().unwrap()]).starts_with("ok: "));
    let inspect = dsprep_ok(&["inspect", one.to_str().unwrap(), "--mix"]);
    let c4 = inspect
        .lines()
        .skip_while(|l| !l.starts_with("phase 1"))
        .find(|l| l.starts_with("c4"))
        .unwrap();
    assert!(c4.contains("0.00%"), "{inspect}");
    let positions = one.join("doc_positions.u64");
    let mut bytes = std::fs::read(&positions).unwrap();
    // A torn position file is named, by verify and by the reader.
    bytes.truncate(bytes.len() - 8);
    std::fs::write(&positions, &bytes).unwrap();
    let err = dsprep_fails(&["verify", one.to_str().unwrap()]);
    assert!(err.contains("doc_positions.u64"), "{err}");
    let err = PackedDataset::open(&one).err().unwrap().to_string();
    assert!(err.contains("doc_positions.u64"), "{err}");
}

/// 8 ranks served the phased best_fit stream get the packed bytes, and `/metrics` counts each
/// phase's documents as the manifest does. Then a daemon SIGKILLed before the phase boundary,
/// resumed, and SIGKILLed after it, resumed again, serves exactly the uninterrupted stream.
#[test]
fn best_fit_with_a_phase_is_served_as_packed_and_resumes_exactly_across_the_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = phased_best_fit(tmp.path());
    let data = pack_dataset(&recipe, &tmp.path().join("packed"));
    let m = data.manifest();
    let num_steps = data.num_windows() / 8;
    {
        let daemon = Daemon::start(tmp.path(), &recipe, 8, 1, 4);
        let outs = tap_all(tmp.path(), &[&daemon], 8, 0, num_steps + 1, "rank", &[]);
        let marks = chain_marks(&data, data.num_windows());
        for (rank, out) in outs.iter().enumerate() {
            assert_eq!(assert_tap_chains(out, &marks), num_steps as usize);
            assert!(
                std::fs::read(out).unwrap() == expected_rank_bytes(&data, 8, 1, rank as u64),
                "rank {rank}"
            );
        }
        // `/metrics` counts documents as mixed (a cut document once) and their tokens: each
        // phase's tokens per source are the manifest's.
        for (phase, stats) in m.phases.iter().enumerate() {
            for s in &stats.sources {
                let series = format!(
                    "dsprep_phase_tokens_total{{phase=\"{phase}\",source=\"{}\"}}",
                    s.name
                );
                assert_eq!(daemon.metric(&series), s.tokens as f64, "{series}");
            }
        }
    }
    // The boundary: the step that holds phase 1's first document (a pool keeps a few short
    // documents of phase 0 until the end: best-fit-decreasing takes the longest first).
    let boundary = m.phases[1].began_at_tokens.unwrap() / (8 * WINDOW);
    assert!((60..num_steps - 40).contains(&boundary), "step {boundary}");
    let run = Run {
        dir: tmp.path(),
        recipe: &recipe,
        state: tmp.path().join("state"),
        every: 7,
    };
    let mut got = Vec::new();
    let mut from = 0;
    for (k, to) in [boundary - 20, boundary + 25, num_steps]
        .into_iter()
        .enumerate()
    {
        let daemon = run.start(8, 1, k > 0).unwrap();
        got.extend(run.pull(&daemon, 8, from, to - from));
        if k > 0 {
            assert!(
                daemon.log_text().contains("resuming from checkpoint"),
                "{}",
                daemon.log_text()
            );
        }
        drop(daemon); // SIGKILL
        from = to;
    }
    assert!(
        got == global_batches(&data, 8, 0..num_steps),
        "the resumed phased best_fit stream differs from the uninterrupted one"
    );
}

/// The multinode recipe with 2 lanes, mixed in tokens with a phase at 200 000 tokens, packed
/// best-fit: one pack and lane parts + finish are the same directory; each lane's documents
/// count in the phase of their mixing position in the lane (c4 and zyda-2 have none in phase
/// 1), and verify recounts it.
#[test]
fn best_fit_with_a_phase_and_lanes_packs_alike_in_parts_and_counts_each_lane_by_mixing_position() {
    let tmp = tempfile::tempdir().unwrap();
    let replace = [
        ("count = 8 ", "count = 2 "),
        ("[mix]\n", "[mix]\nunit = \"tokens\"\n"),
        (
            "seq_len = 512",
            "seq_len = 512\nstrategy = \"best_fit\"\npool_documents = 300",
        ),
    ];
    let lanes = recipe_variant(&multinode(), tmp.path(), "mn.toml", &replace);
    let mut text = std::fs::read_to_string(&lanes).unwrap();
    text.push_str(
        "\n[[mix.phase]]\nat_tokens = 200000\n\
         weights = { finemath = 0.3, the-stack-v2 = 0.3, fineweb-edu = 0.4 }\n",
    );
    std::fs::write(&lanes, text).unwrap();
    let whole = tmp.path().join("whole");
    dsprep_ok(&pack_args(&lanes, &whole, &["--threads", "2"]));
    let parts = tmp.path().join("parts");
    for part in ["0", "1"] {
        dsprep_ok(&pack_args(
            &lanes,
            &parts,
            &["--part", part, "--parts", "2"],
        ));
    }
    dsprep_ok(&pack_args(&lanes, &parts, &["--finish"]));
    assert!(
        dir_bytes(&whole) == dir_bytes(&parts),
        "parts + finish differ"
    );
    let data = PackedDataset::open(&whole).unwrap();
    let m = data.manifest();
    assert!(m.doc_positions.is_some());
    for name in ["c4", "zyda-2"] {
        let s = (m.phases[1].sources.iter())
            .find(|s| s.name == name)
            .unwrap();
        assert_eq!((s.tokens, s.documents), (0, 0), "{name}");
    }
    let phase_tokens: Vec<u64> = m.phases.iter().map(|p| p.tokens).collect();
    assert_eq!(phase_tokens, [199_277, 367_512]);
    assert!(dsprep_ok(&["verify", whole.to_str().unwrap()]).starts_with("ok: "));
}
