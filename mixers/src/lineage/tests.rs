use super::*;
use crate::checkpoint::PipelineState;
use crate::doc::{Doc, VecSource};
use crate::mixer::{MixInput, Mixer};
use crate::packer::PackerState;
use crate::recipe::{MixUnit, Stopping};
use crate::shuffle::Shuffler;
use crate::stream::DocStream;
use std::collections::BTreeSet;

/// Two sources mixed in documents (also the fixture of `tokens_tests`).
pub(super) const A: &str = r#"
version = 1
[tokenizer]
path = "tok/tokenizer.json"
eos = "<|endoftext|>"
[packing]
seq_len = 512
[shuffle]
seed = 7
buffer_size = 100
[[source]]
name = "web"
weight = 0.7
files = ["web/*.parquet"]
format = "parquet"
[[source]]
name = "code"
weight = 0.3
files = ["code/*.parquet"]
format = "parquet"
"#;

fn recipe(text: &str) -> Recipe {
    Recipe::parse(text).unwrap()
}

/// `A` with `code` removed and `math` added (weights 0.5 / 0.5).
fn b() -> Recipe {
    let mut b = recipe(A);
    b.sources.retain(|s| s.name == "web");
    b.sources[0].weight = 0.5;
    b.sources.push(SourceSpec {
        name: "math".into(),
        files: vec!["math/*.parquet".into()],
        ..b.sources[0].clone()
    });
    b
}

#[test]
fn steps_map_to_windows_across_a_change_of_the_global_batch() {
    let a = Lineage::start(recipe(A), "/r".into(), 2, 4); // 8 windows a step
    let l = a.changed(b(), "/r".into(), 10, 80, 77, 4, 4); // 16 from step 10
    assert_eq!(l.segment_at_step(9), 0);
    assert_eq!(l.segment_at_step(10), 1);
    assert_eq!(l.window_of_step(9), 72);
    assert_eq!(l.window_of_step(10), 80);
    assert_eq!(l.window_of_step(12), 112);
    assert_eq!(l.step_at_window(80), 10);
    assert_eq!(l.step_at_window(81), 11);
    assert_eq!(l.step_at_window(79), 10, "ceil(79 / 8)");
    assert_eq!(l.step_at_window(96), 11);
    assert_eq!(l.first_step_of_batch(12, 16), 10);
    assert_eq!(l.first_step_of_batch(9, 8), 0);
    assert_eq!(a.first_step_of_batch(5, 8), 0);
}

#[test]
fn sources_keep_one_index_over_the_lineage() {
    let l = Lineage::start(recipe(A), "/r".into(), 1, 1).changed(b(), "/r".into(), 3, 3, 9, 1, 1);
    assert_eq!(l.source_names(), ["web", "code", "math"]);
    let effective = l.effective_recipe(1);
    let got: Vec<(&str, f64)> = (effective.sources.iter())
        .map(|s| (s.name.as_str(), s.weight))
        .collect();
    assert_eq!(got, [("web", 0.5), ("code", 0.0), ("math", 0.5)]);
    assert_eq!(l.effective_recipe(0), recipe(A));
}

#[test]
fn a_change_below_an_earlier_one_replaces_the_branch_and_keeps_it_in_the_log() {
    let l = Lineage::start(recipe(A), "/r".into(), 1, 1);
    let once = l.changed(b(), "/r".into(), 30, 30, 40, 1, 1);
    let mut c = recipe(A);
    c.sources[0].weight = 0.1;
    let again = once.changed(c.clone(), "/r".into(), 20, 20, 25, 1, 1);
    assert_eq!(again.segments.len(), 2);
    assert_eq!(again.segments[1].recipe, c);
    assert_eq!(again.abandoned.len(), 1);
    assert_eq!(again.abandoned[0].from_step, 30);
}

#[test]
fn edits_that_change_what_an_id_means_or_how_input_is_dealt_are_refused_by_field() {
    assert_eq!(check_edit(&recipe(A), &b()), Vec::<Refusal>::new());
    let mut bad = recipe(A);
    bad.tokenizer.path = "other/tokenizer.json".into();
    bad.packing.seq_len = 1024;
    bad.shuffle.seed = 8;
    bad.sources[1].files = vec!["code2/*.parquet".into()];
    let fields: Vec<String> = check_edit(&recipe(A), &bad)
        .into_iter()
        .map(|r| r.field)
        .collect();
    assert_eq!(
        fields,
        [
            "tokenizer",
            "packing.seq_len",
            "shuffle.seed",
            "source \"code\""
        ]
    );
    let refusal = &check_edit(&recipe(A), &bad)[2];
    assert_eq!(
        refusal.to_string(),
        "shuffle.seed: 7 → 8: the seed decides every draw of the stream so far; keep 7"
    );
    // In tokens, or across units: sources added and removed, the buffer resized.
    let mut tokens = recipe(A);
    tokens.mix.unit = MixUnit::Tokens;
    let mut tokens_b = b();
    tokens_b.mix.unit = MixUnit::Tokens;
    tokens_b.shuffle.buffer_size = 40;
    assert_eq!(check_edit(&tokens, &tokens_b), Vec::<Refusal>::new());
    assert_eq!(check_edit(&recipe(A), &tokens_b), Vec::<Refusal>::new());
    assert_eq!(check_edit(&tokens_b, &b()), Vec::<Refusal>::new());
    // What stays refused in tokens too: each by its field.
    let mut lanes = tokens_b.clone();
    lanes.lanes = Some(crate::LanesSpec {
        count: 2,
        block_windows: 4,
    });
    lanes.shuffle.shuffle_shards = !tokens_b.shuffle.shuffle_shards;
    let fields: Vec<String> = check_edit(&tokens, &lanes)
        .into_iter()
        .map(|r| r.field)
        .collect();
    assert_eq!(fields, ["shuffle.shuffle_shards", "lanes"]);
}

/// The effective recipe of a change that keeps `web`, stops `code` and adds `math`.
fn two_of_three() -> Recipe {
    Lineage::start(recipe(A), "/r".into(), 1, 1)
        .changed(b(), "/r".into(), 1, 1, 1, 1, 1)
        .effective_recipe(1)
}

/// A stream over `sources` (name, rows, weight): every source's rows are `name-k`.
fn stream(sources: &[(&str, usize, f64)], buffer: usize) -> DocStream<VecSource> {
    let inputs = (sources.iter().enumerate())
        .map(|(i, &(name, n, weight))| MixInput {
            name: name.into(),
            weight,
            source: VecSource::new(i as u16, (0..n).map(|k| format!("{name}-{k}")).collect()),
        })
        .collect();
    DocStream::new(
        Mixer::new(inputs, Stopping::AllExhausted, 3),
        Shuffler::new(buffer, 3),
    )
}

#[test]
fn a_transplanted_stream_draws_nothing_twice_and_skips_nothing() {
    for (buffer_a, buffer_b) in [(16, 16), (16, 4), (4, 16), (0, 8)] {
        let mut a = stream(&[("web", 400, 0.7), ("code", 300, 0.3)], buffer_a);
        let before: Vec<Doc> = (0..30).map(|_| a.next_doc().unwrap().unwrap()).collect();
        let state = PipelineState {
            stream: a.state(),
            packer: PackerState::default(),
        };
        // `code` removed, `math` added; weights changed.
        let (moved, report) = transplant(state.clone(), &two_of_three()).unwrap();
        let mut b = stream(
            &[("web", 400, 0.5), ("code", 300, 0.0), ("math", 300, 0.5)],
            buffer_b,
        );
        b.restore(&moved.stream).unwrap();
        let after: Vec<Doc> = (0..60).map(|_| b.next_doc().unwrap().unwrap()).collect();
        // Every document once: those of `code` still held at the change were dropped, counted.
        let texts: Vec<&str> = (before.iter().chain(&after))
            .map(|d| d.text.as_str())
            .collect();
        let unique: BTreeSet<&str> = texts.iter().copied().collect();
        assert_eq!(unique.len(), texts.len(), "a document came twice");
        assert!(after.iter().all(|d| !d.text.starts_with("code")));
        assert!(after.iter().any(|d| d.text.starts_with("math")));
        let held_code = (state.stream.buffered.iter())
            .chain(state.stream.mixer.peeked.iter().flatten())
            .filter(|p| p.source == 1)
            .count() as u64;
        assert_eq!(report.dropped, vec![(1, held_code)], "buffer {buffer_a}");
        // `web` skipped nothing: what it emitted and what is still held are exactly the rows
        // it has read.
        let after_state = b.state();
        let mut web: Vec<u64> = (before.iter().chain(&after))
            .filter(|d| d.pos.source == 0)
            .map(|d| d.pos.row)
            .chain(
                (after_state.buffered.iter())
                    .chain(after_state.mixer.peeked.iter().flatten())
                    .filter(|p| p.source == 0)
                    .map(|p| p.row),
            )
            .collect();
        web.sort_unstable();
        let read = after_state.sources[0].row;
        assert_eq!(
            web,
            (0..read).collect::<Vec<u64>>(),
            "every row of web once"
        );
        // The restored state round-trips, the removed source's cursor kept for a later change.
        assert_eq!(b.state().sources[1], state.stream.sources[1]);
        // Replaying the same change gives the same documents.
        let mut again = stream(
            &[("web", 400, 0.5), ("code", 300, 0.0), ("math", 300, 0.5)],
            buffer_b,
        );
        again.restore(&moved.stream).unwrap();
        let replay: Vec<Doc> = (0..60)
            .map(|_| again.next_doc().unwrap().unwrap())
            .collect();
        assert_eq!(replay, after);
        // So does the change made live: the documents in memory moved over, not read again.
        let mut live = stream(
            &[("web", 400, 0.5), ("code", 300, 0.0), ("math", 300, 0.5)],
            buffer_b,
        );
        let known = a.into_docs();
        let held = state.stream.buffered.len() + state.stream.mixer.peeked.iter().flatten().count();
        assert_eq!(known.len(), held, "the buffer and the look-ahead");
        live.restore_from(&moved.stream, known).unwrap();
        let moved_over: Vec<Doc> = (0..60).map(|_| live.next_doc().unwrap().unwrap()).collect();
        assert_eq!(moved_over, after);
    }
}

#[test]
fn a_change_after_the_mix_ended_goes_on_when_every_source_runs_out_at_least_once() {
    let mut a = stream(&[("web", 30, 1.0)], 10);
    // 30 documents drawn: web has run out, the mix has ended, 5 wait in the buffer's drain.
    let before: Vec<Doc> = (0..25).map(|_| a.next_doc().unwrap().unwrap()).collect();
    let state = PipelineState {
        stream: a.state(),
        packer: PackerState::default(),
    };
    assert!(state.stream.draining && state.stream.mixer.done);
    let err = transplant(state.clone(), &two_of_three()).unwrap_err();
    assert!(
        err.contains("set [mix] stopping = \"all_exhausted\" to go on"),
        "{err}"
    );
    let mut next = two_of_three();
    next.mix.stopping = Stopping::AllExhausted;
    let (moved, report) = transplant(state, &next).unwrap();
    assert_eq!(report.dropped, vec![]);
    let mut b = stream(
        &[("web", 30, 0.5), ("code", 30, 0.0), ("math", 20, 0.5)],
        10,
    );
    b.restore(&moved.stream).unwrap();
    let after: Vec<Doc> = std::iter::from_fn(|| b.next_doc().unwrap()).collect();
    let first_pass: BTreeSet<u64> = (before.iter().chain(&after))
        .filter(|d| d.pos.source == 0 && d.pos.pass == 0)
        .map(|d| d.pos.row)
        .collect();
    assert_eq!(first_pass.len(), 30, "every row of web's first pass, once");
    let math: BTreeSet<u64> = (after.iter())
        .filter(|d| d.pos.source == 2)
        .map(|d| d.pos.row)
        .collect();
    assert_eq!(
        math.len(),
        20,
        "the new source ran out once, then the mix ended"
    );
    assert!(after.iter().any(|d| d.pos.source == 0 && d.pos.pass == 1));
}

/// The packing at a change: the strategy, the pool (larger or smaller) and the pad may change,
/// with `[lanes]` too.
#[test]
fn packing_may_change_at_a_change_with_lanes_or_without() {
    use crate::recipe::{PackStrategy, TokenRef};
    let mut old = recipe(A);
    old.packing.strategy = PackStrategy::BestFit;
    old.packing.pool_documents = Some(64);
    let mut concat = old.clone();
    concat.packing.strategy = PackStrategy::Concat;
    concat.packing.pool_documents = None;
    let mut small = old.clone();
    small.packing.pool_documents = Some(32);
    small.packing.pad = Some(TokenRef::Id(0));
    let mut grown = old.clone();
    grown.packing.pool_documents = Some(256);
    for new in [&concat, &small, &grown] {
        assert_eq!(check_edit(&old, new), Vec::<Refusal>::new());
        assert_eq!(check_edit(new, &old), Vec::<Refusal>::new());
    }
    let laned = |r: &Recipe| {
        let mut r = r.clone();
        r.lanes = Some(crate::LanesSpec {
            count: 4,
            block_windows: 8,
        });
        r
    };
    let refused = |old: &Recipe, new: &Recipe| -> Vec<String> {
        check_edit(&laned(old), &laned(new))
            .iter()
            .map(Refusal::to_string)
            .collect()
    };
    // With [lanes] each lane's packer is made the next packing's at the lane's own point: a
    // switch of strategy, another pad and another pool are all allowed, both ways.
    for new in [&concat, &small, &grown] {
        assert_eq!(refused(&old, new), Vec::<String>::new());
        assert_eq!(refused(new, &old), Vec::<String>::new());
    }
    assert_eq!(refused(&old, &grown), Vec::<String>::new());
    // The default pad (the EOS) written out is the same pad.
    let mut spelled = grown.clone();
    spelled.packing.pad = Some(old.tokenizer.eos.clone());
    assert_eq!(refused(&old, &spelled), Vec::<String>::new());
}
