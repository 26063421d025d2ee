//! The mix in tokens: every source's share of the tokens held at every point, resume exact.

use super::*;
use crate::doc::{ByteTokens, VecSource};
use crate::stream::DocStream;
use proptest::prelude::*;

type Source = ByteTokens<VecSource>;

/// Source `i` holds `lengths[i].len()` documents of those lengths in bytes (= tokens); every
/// fifth row is empty.
fn inputs(lengths: &[Vec<usize>], weights: &[f64]) -> Vec<MixInput<Source>> {
    lengths
        .iter()
        .zip(weights)
        .enumerate()
        .map(|(i, (lens, &w))| {
            let texts = lens
                .iter()
                .enumerate()
                .map(|(k, &len)| match k % 5 {
                    4 => String::new(),
                    _ => format!("{i}/{k}:{}", "x".repeat(len)),
                })
                .collect();
            MixInput {
                name: format!("s{i}"),
                weight: w,
                source: ByteTokens::new(VecSource::new(i as u16, texts)),
            }
        })
        .collect()
}

fn stream(
    lengths: &[Vec<usize>],
    weights: &[f64],
    stopping: Stopping,
    buffer: usize,
    seed: u64,
) -> DocStream<Source> {
    phased(lengths, weights, &[], stopping, buffer, seed)
}

/// [`stream`] with phases: from `at` tokens on, `weights`.
fn phased(
    lengths: &[Vec<usize>],
    weights: &[f64],
    phases: &[(u64, Vec<f64>)],
    stopping: Stopping,
    buffer: usize,
    seed: u64,
) -> DocStream<Source> {
    DocStream::new(
        Mixer::by_tokens(
            inputs(lengths, weights),
            stopping,
            seed,
            buffer,
            phases.to_vec(),
        ),
        Shuffler::new(0, seed),
    )
}

fn drain(s: &mut DocStream<Source>) -> Vec<Doc> {
    std::iter::from_fn(|| s.next_doc().unwrap()).collect()
}

fn tokens(doc: &Doc) -> u64 {
    doc.tokens.as_ref().map_or(0, |t| t.len() as u64)
}

/// The largest gap between a source's tokens and its share of every prefix of `docs`.
fn worst_gap(docs: &[Doc], weights: &[f64]) -> f64 {
    let sum: f64 = weights.iter().sum();
    let mut per = vec![0u64; weights.len()];
    let mut total = 0u64;
    let mut worst = 0.0f64;
    for doc in docs {
        per[usize::from(doc.pos.source)] += tokens(doc);
        total += tokens(doc);
        for (i, &t) in per.iter().enumerate() {
            worst = worst.max((t as f64 - weights[i] / sum * total as f64).abs());
        }
    }
    worst
}

#[test]
fn a_source_with_documents_100_times_longer_gets_its_share_of_tokens_not_of_documents() {
    // Source 0: ~20-token documents; source 1: ~2,000-token ones. Equal weights in tokens.
    let short: Vec<usize> = (0..40_000).map(|k| 10 + k % 21).collect();
    let long: Vec<usize> = (0..400).map(|k| 1_000 + (k * 37) % 2_001).collect();
    let weights = [1.0, 1.0];
    let docs = drain(&mut stream(
        &[short, long],
        &weights,
        Stopping::FirstExhausted,
        64,
        7,
    ));
    let from = |s: u16| {
        docs.iter()
            .filter(|d| d.pos.source == s)
            .map(tokens)
            .sum::<u64>()
    };
    let (t0, t1) = (from(0), from(1));
    let share0 = t0 as f64 / (t0 + t1) as f64;
    assert!(
        (share0 - 0.5).abs() < 0.005,
        "source 0 has {share0:.4} of the tokens"
    );
    let docs0 = docs.iter().filter(|d| d.pos.source == 0).count();
    assert!(
        docs0 > 50 * (docs.len() - docs0),
        "and ~100× the documents: {docs0} of {}",
        docs.len()
    );
    let max_len = docs.iter().map(tokens).max().unwrap() as f64;
    assert!(
        worst_gap(&docs, &weights) <= max_len,
        "within one document at every point"
    );
}

#[test]
fn each_source_is_shuffled_alone_and_read_once_per_pass() {
    let lengths = vec![vec![5; 300], vec![50; 80]];
    let docs = drain(&mut stream(
        &lengths,
        &[0.5, 0.5],
        Stopping::AllExhausted,
        32,
        3,
    ));
    let passes = |s: u16| {
        docs.iter()
            .filter(|d| d.pos.source == s)
            .map(|d| d.pos.pass)
            .max()
            .unwrap()
    };
    assert_eq!(passes(1), 0, "the source that runs out last is read once");
    assert!(passes(0) >= 1, "the one that runs out first is read again");
    let first_pass: Vec<u64> = docs
        .iter()
        .filter(|d| d.pos.source == 0 && d.pos.pass == 0)
        .map(|d| d.pos.row)
        .collect();
    let mut sorted = first_pass.clone();
    sorted.sort_unstable();
    assert_ne!(first_pass, sorted, "shuffled");
    assert_eq!(
        sorted,
        (0..300).filter(|k| k % 5 != 4).collect::<Vec<_>>(),
        "every document of the pass once"
    );
    assert_eq!(
        docs,
        drain(&mut stream(
            &lengths,
            &[0.5, 0.5],
            Stopping::AllExhausted,
            32,
            3
        )),
        "the seed decides"
    );
}

#[test]
fn a_zero_weight_source_is_never_read_in_tokens() {
    let lengths = vec![vec![5; 30], vec![5; 30]];
    let mut s = stream(&lengths, &[1.0, 0.0], Stopping::FirstExhausted, 8, 1);
    let docs = drain(&mut s);
    assert_eq!(docs.len(), 24);
    assert!(docs.iter().all(|d| d.pos.source == 0));
    assert_eq!(s.mixer().inputs()[1].source.counters().rows_read, 0);
}

#[test]
fn a_source_that_cannot_tokenize_ahead_is_refused() {
    let inputs = vec![MixInput {
        name: "plain".into(),
        weight: 1.0,
        source: VecSource::new(0, vec!["a".into()]),
    }];
    let mut mixer = Mixer::by_tokens(inputs, Stopping::FirstExhausted, 0, 0, Vec::new());
    let err = mixer.next_doc().unwrap_err().to_string();
    assert!(
        err.contains(
            "source \"plain\": a mix in tokens needs sources that tokenize ahead (internal \
             error: this source cannot tokenize documents ahead)"
        ),
        "{err}"
    );
}

#[test]
fn a_checkpoint_of_one_unit_does_not_restore_the_other() {
    let lengths = vec![vec![5; 30]];
    let mut by_tokens = stream(&lengths, &[1.0], Stopping::FirstExhausted, 8, 1);
    by_tokens.next_doc().unwrap();
    let by_documents = || {
        DocStream::new(
            Mixer::new(inputs(&lengths, &[1.0]), Stopping::FirstExhausted, 1),
            Shuffler::new(8, 1),
        )
    };
    let err = by_documents()
        .restore(&by_tokens.state())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a mix in tokens, the recipe's in documents"),
        "{err}"
    );
}

#[test]
fn a_phase_begins_with_the_first_document_drawn_once_the_stream_holds_its_tokens() {
    // Source 1 has weight 0 until 1,000 tokens, then source 0 has.
    let lengths = vec![vec![30; 200], vec![40; 200]];
    let phases = [(1_000, vec![0.0, 1.0])];
    let docs = drain(&mut phased(
        &lengths,
        &[1.0, 0.0],
        &phases,
        Stopping::FirstExhausted,
        8,
        2,
    ));
    let mut before = 0u64;
    for doc in &docs {
        let want = if before >= 1_000 { 1 } else { 0 };
        assert_eq!(
            doc.pos.source, want,
            "the document drawn after {before} tokens"
        );
        before += tokens(doc);
    }
    assert!(
        docs.iter().any(|d| d.pos.source == 1),
        "source 1 joins in phase 1"
    );
}

#[test]
fn each_phase_holds_its_own_shares_from_where_it_begins() {
    let lengths = vec![
        (0..3_000).map(|k| 5 + k % 20).collect(),
        (0..3_000).map(|k| 50 + k % 200).collect(),
    ];
    let phases = [(20_000, vec![0.2, 0.8])];
    let docs = drain(&mut phased(
        &lengths,
        &[0.5, 0.5],
        &phases,
        Stopping::FirstExhausted,
        16,
        4,
    ));
    let (mut at, mut per_phase) = (0u64, [[0u64; 2]; 2]);
    for doc in &docs {
        let phase = usize::from(at >= 20_000);
        per_phase[phase][usize::from(doc.pos.source)] += tokens(doc);
        at += tokens(doc);
    }
    let share0 = |p: [u64; 2]| p[0] as f64 / (p[0] + p[1]) as f64;
    assert!((share0(per_phase[0]) - 0.5).abs() < 0.015, "{per_phase:?}");
    assert!((share0(per_phase[1]) - 0.2).abs() < 0.015, "{per_phase:?}");
}

fn lengths_strategy() -> impl Strategy<Value = Vec<Vec<usize>>> {
    // 2 to 4 sources; each source's documents up to 3, 30 or 300 tokens long (100× apart).
    proptest::collection::vec(
        (
            prop_oneof![Just(3usize), Just(30), Just(300)],
            5usize..400,
            any::<u64>(),
        )
            .prop_map(|(max, n, salt)| {
                (0..n)
                    .map(|k| 1 + ((k as u64).wrapping_mul(2_654_435_761) ^ salt) as usize % max)
                    .collect()
            }),
        2..5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// At every point of the stream, every source's tokens are within (sources − 1) of the
    /// longest document of its share: the largest-deficit rule's bound.
    #[test]
    fn every_share_is_held_at_every_point(
        lengths in lengths_strategy(),
        raw_weights in proptest::collection::vec(0.05f64..1.0, 4),
        all in any::<bool>(),
        buffer in 0usize..64,
        seed in any::<u64>(),
    ) {
        let weights = &raw_weights[..lengths.len()];
        let stopping = if all { Stopping::AllExhausted } else { Stopping::FirstExhausted };
        let docs = drain(&mut stream(&lengths, weights, stopping, buffer, seed));
        let max_len = docs.iter().map(tokens).max().unwrap_or(0) as f64;
        let bound = (lengths.len() - 1) as f64 * max_len + 1e-6;
        prop_assert!(worst_gap(&docs, weights) <= bound, "gap {} > {bound}", worst_gap(&docs, weights));
    }

    /// Cut anywhere (before, at or after a phase boundary) and restored from the state: the
    /// same documents, the same counts.
    #[test]
    fn a_restored_mix_in_tokens_continues_exactly(
        lengths in lengths_strategy(),
        raw_weights in proptest::collection::vec(0.05f64..1.0, 4),
        phase_weights in proptest::collection::vec(0.0f64..1.0, 4),
        phase_at in proptest::option::of(1u64..20_000),
        all in any::<bool>(),
        buffer in 0usize..64,
        seed in any::<u64>(),
        cut_frac in 0.0f64..=1.0,
    ) {
        let weights = &raw_weights[..lengths.len()];
        let mut later = phase_weights[..lengths.len()].to_vec();
        later[0] += 0.01; // never all zero
        let phases: Vec<(u64, Vec<f64>)> = phase_at.map(|at| (at, later)).into_iter().collect();
        let stopping = if all { Stopping::AllExhausted } else { Stopping::FirstExhausted };
        let stream = |_: &[Vec<usize>], _: &[f64], stopping, buffer, seed| phased(&lengths, weights, &phases, stopping, buffer, seed);
        let whole = drain(&mut stream(&lengths, weights, stopping, buffer, seed));
        let cut = (whole.len() as f64 * cut_frac) as usize;
        let mut first = stream(&lengths, weights, stopping, buffer, seed);
        let mut got: Vec<Doc> = (0..cut).map(|_| first.next_doc().unwrap().unwrap()).collect();
        let mut second = stream(&lengths, weights, stopping, buffer, seed);
        second.restore(&first.state()).unwrap();
        prop_assert_eq!(second.mixer().emitted_tokens(), first.mixer().emitted_tokens());
        got.extend(drain(&mut second));
        prop_assert_eq!(got, whole);
    }
}

/// Only documents about to be emitted are tokenized: at a `first_exhausted` end each source
/// has given at most two batches of documents out of its buffer that are never emitted, while
/// its buffer still holds hundreds.
#[test]
fn only_documents_about_to_be_emitted_are_tokenized() {
    let lengths = vec![vec![20; 3000], vec![30; 900]];
    let mut s = stream(&lengths, &[0.5, 0.5], Stopping::FirstExhausted, 1000, 5);
    let docs = drain(&mut s);
    assert!(docs.len() > 1000, "{}", docs.len());
    let state = s.mixer().state();
    for (i, input) in s.mixer().inputs().iter().enumerate() {
        let thrown_away = input.source.1.len();
        assert!(thrown_away <= 2 * AHEAD_DOCS, "source {i}: {thrown_away}");
        assert!(
            state.shuffles[i].held >= 400 || state.shuffles[i].draining,
            "source {i}: {:?}",
            state.shuffles[i]
        );
    }
    assert!(state.shuffles[0].held >= 400, "{:?}", state.shuffles[0]);
}

/// Stopped after any document and restored, a mix in tokens is at every later document in the
/// very state of one never stopped (the batches out of each buffer included), so what a change
/// of course moves does not depend on where the stream was last resumed.
#[test]
fn a_restored_mix_in_tokens_is_in_the_state_of_one_never_stopped() {
    let lengths = vec![(0..600).map(|k| 3 + k % 40).collect(), vec![20; 300]];
    let weights = [0.6, 0.4];
    let mut whole = stream(&lengths, &weights, Stopping::AllExhausted, 32, 5);
    let states: Vec<_> = (0..400)
        .map(|_| {
            whole.next_doc().unwrap().unwrap();
            whole.state()
        })
        .collect();
    assert!(
        (states.iter()).any(|s| s.mixer.shuffles.iter().any(|b| b.ready_batch > 0)),
        "two batches out at some point"
    );
    for stop in [1, 37, 64, 65, 150, 290] {
        let mut resumed = stream(&lengths, &weights, Stopping::AllExhausted, 32, 5);
        resumed.restore(&states[stop - 1]).unwrap();
        for (k, state) in states.iter().enumerate().skip(stop) {
            resumed.next_doc().unwrap().unwrap();
            assert_eq!(&resumed.state(), state, "stopped after {stop}, at {k}");
        }
    }
}

/// Many short phases of one mix, source 1's documents 10× longer: each phase that starts from
/// zero lets the long source's overshoot stand, while phases that carry their deficits
/// (`[mix.adaptive]`) hold the shares over the whole stream.
#[test]
fn phases_that_carry_their_deficits_hold_the_shares_over_the_whole_stream() {
    let lengths = vec![
        (0..4_000).map(|k| 5 + k % 20).collect(),
        (0..1_000).map(|k| 100 + k % 200).collect(),
    ];
    let phases: Vec<(u64, Vec<f64>)> = (1..60).map(|k| (k * 1_000, vec![0.7, 0.3])).collect();
    let run = |carry: bool| {
        let mut s = phased(
            &lengths,
            &[0.7, 0.3],
            &phases,
            Stopping::FirstExhausted,
            16,
            4,
        );
        if carry {
            s.mixer_mut().carry_deficits();
        }
        let docs = drain(&mut s);
        let at_60k: Vec<Doc> = {
            let mut t = 0;
            docs.into_iter()
                .take_while(|d| {
                    t += tokens(d);
                    t <= 60_000
                })
                .collect()
        };
        worst_gap(&at_60k, &[0.7, 0.3])
    };
    let (reset, carried) = (run(false), run(true));
    assert!(carried < 320.0, "within about one long document: {carried}");
    assert!(
        reset > 4.0 * carried,
        "phases from zero drift: {reset} against {carried}"
    );
}

#[test]
fn a_restored_mix_that_carries_its_deficits_is_in_the_state_of_one_never_stopped() {
    let lengths = vec![(0..600).map(|k| 3 + k % 40).collect(), vec![60; 300]];
    let phases: Vec<(u64, Vec<f64>)> = (1..20).map(|k| (k * 700, vec![0.6, 0.4])).collect();
    let make = || {
        let mut s = phased(
            &lengths,
            &[0.6, 0.4],
            &phases,
            Stopping::AllExhausted,
            32,
            5,
        );
        s.mixer_mut().carry_deficits();
        s
    };
    let mut whole = make();
    let states: Vec<_> = (0..400)
        .map(|_| {
            whole.next_doc().unwrap().unwrap();
            whole.state()
        })
        .collect();
    assert!(
        states.iter().any(|s| !s.mixer.owed.is_empty()),
        "something owed"
    );
    for stop in [1, 64, 150, 290] {
        let mut resumed = make();
        resumed.restore(&states[stop - 1]).unwrap();
        for (k, state) in states.iter().enumerate().skip(stop) {
            resumed.next_doc().unwrap().unwrap();
            assert_eq!(&resumed.state(), state, "stopped after {stop}, at {k}");
        }
    }
}
