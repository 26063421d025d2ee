//! Changes of course in and across mix units ([`transplant()`]): documents → tokens, tokens →
//! documents, and in tokens a source added, a source removed, the buffer made smaller or larger.
//! Each: the stream after the change is the same whether the pipeline runs through it (the
//! documents in memory moved over), restores the transplanted state (re-read), or stops and
//! resumes after it; no document comes twice; every source the new recipe draws from skips none.

use super::*;
use crate::checkpoint::PipelineState;
use crate::doc::{ByteTokens, Doc, DocPos, VecSource};
use crate::mixer::{MixInput, Mixer};
use crate::packer::PackerState;
use crate::recipe::{MixUnit, Stopping};
use crate::shuffle::Shuffler;
use crate::stream::{DocStream, StreamState};
use std::collections::BTreeSet;

type Source = ByteTokens<VecSource>;

/// The rows every source has: enough that none runs out in these tests (one pass).
const ROWS: usize = 3_000;

/// One recipe of a test: per source of the lineage (index order), its name and weight (0: not
/// drawn); the mix's unit and buffer size.
#[derive(Clone)]
struct Mix {
    sources: Vec<(&'static str, f64)>,
    unit: MixUnit,
    buffer: usize,
}

impl Mix {
    fn new(sources: &[(&'static str, f64)], unit: MixUnit, buffer: usize) -> Mix {
        Mix {
            sources: sources.to_vec(),
            unit,
            buffer,
        }
    }

    /// Its stream over [`ROWS`] rows per source, rows of varied lengths (`name-k` and k % 17
    /// more bytes; a byte is a token).
    fn stream(&self) -> DocStream<Source> {
        let inputs = (self.sources.iter().enumerate())
            .map(|(i, &(name, weight))| MixInput {
                name: name.into(),
                weight,
                source: ByteTokens::new(VecSource::new(
                    i as u16,
                    (0..ROWS)
                        .map(|k| format!("{name}-{k}{}", "x".repeat(k % 17)))
                        .collect(),
                )),
            })
            .collect();
        match self.unit {
            MixUnit::Documents => DocStream::new(
                Mixer::new(inputs, Stopping::AllExhausted, 3),
                Shuffler::new(self.buffer, 3),
            ),
            MixUnit::Tokens => DocStream::new(
                Mixer::by_tokens(inputs, Stopping::AllExhausted, 3, self.buffer, Vec::new()),
                Shuffler::new(0, 3),
            ),
        }
    }

    /// Its stream's state after `n` documents.
    fn stream_state_after(&self, n: usize) -> StreamState {
        let mut stream = self.stream();
        draw(&mut stream, n);
        stream.state()
    }

    /// Its recipe (what [`transplant()`] reads of it: the sources that take part, the unit).
    fn recipe(&self) -> Recipe {
        let mut recipe = Recipe::parse(super::tests::A).unwrap();
        let spec = recipe.sources[0].clone();
        recipe.sources = (self.sources.iter())
            .map(|&(name, weight)| SourceSpec {
                name: name.into(),
                weight,
                files: vec![format!("{name}/*.parquet")],
                ..spec.clone()
            })
            .collect();
        recipe.mix.unit = self.unit;
        recipe.mix.stopping = Stopping::AllExhausted;
        recipe.shuffle.buffer_size = self.buffer;
        recipe
    }
}

fn draw(stream: &mut DocStream<Source>, n: usize) -> Vec<Doc> {
    (0..n)
        .map(|_| stream.next_doc().unwrap().unwrap())
        .collect()
}

/// Where the packer stands at the change: 3 windows and 10 tokens pushed.
fn packer() -> PackerState {
    PackerState {
        windows_emitted: 3,
        pending: vec![1; 10],
        pending_starts: vec![0],
        pending_sources: vec![0],
        ..PackerState::default()
    }
}

/// What a change did, for the test's own checks.
struct Changed {
    /// The state where `a` stopped, and made `b`'s.
    at: PipelineState,
    moved: PipelineState,
    dropped: Vec<(u16, u64)>,
    after: Vec<Doc>,
    /// The new recipe's stream where the test stopped.
    end: DocStream<Source>,
}

/// `a` draws `before` documents, then `b` takes over and draws `after`; asserts that the run
/// through the change, the restored state and a stop and resume after it agree, that no
/// document comes twice, and that every source `b` draws from skips none.
fn change(a: &Mix, b: &Mix, before: usize, after: usize) -> Changed {
    let mut first = a.stream();
    let drawn = draw(&mut first, before);
    let at = PipelineState {
        stream: first.state(),
        packer: packer(),
    };
    let (moved, report) = transplant(at.clone(), &b.recipe()).unwrap();
    // The same change from a stop before it: the same state moved the same way.
    let mut resumed = a.stream();
    resumed.restore(&a.stream_state_after(before / 2)).unwrap();
    draw(&mut resumed, before - before / 2);
    assert_eq!(resumed.state(), at.stream, "resumed before the change");
    // Restored from the transplanted state (re-read), as a replay of the lineage does.
    let mut restored = b.stream();
    restored.restore(&moved.stream).unwrap();
    let got = draw(&mut restored, after);
    // Run through the change: the documents in memory moved over, none read again.
    let mut live = b.stream();
    live.restore_from(&moved.stream, first.into_docs()).unwrap();
    assert_eq!(draw(&mut live, after), got, "run through the change");
    // Stopped after the change and resumed.
    let mut stopped = b.stream();
    stopped.restore(&moved.stream).unwrap();
    let mut again = draw(&mut stopped, after / 3);
    let mut resumed = b.stream();
    resumed.restore(&stopped.state()).unwrap();
    again.extend(draw(&mut resumed, after - after / 3));
    assert_eq!(again, got, "stopped and resumed after the change");
    assert_eq!(resumed.state(), restored.state());

    // No document twice; every source drawn from after the change skipped none: what it
    // emitted and what is still held are exactly the rows it has read.
    let end = restored.state();
    let held: Vec<DocPos> = (end.buffered.iter())
        .chain(end.mixer.peeked.iter().flatten())
        .copied()
        .collect();
    let emitted: Vec<DocPos> = drawn.iter().chain(&got).map(|d| d.pos).collect();
    let unique: BTreeSet<DocPos> = emitted.iter().chain(&held).copied().collect();
    assert_eq!(
        unique.len(),
        emitted.len() + held.len(),
        "a document came twice"
    );
    let recipe = b.recipe();
    for (i, _) in recipe.active_sources() {
        let mut rows: Vec<u64> = (emitted.iter().chain(&held))
            .filter(|p| usize::from(p.source) == i)
            .map(|p| {
                assert_eq!(p.pass, 0, "one pass");
                p.row
            })
            .collect();
        rows.sort_unstable();
        let read = end.sources[i].row;
        assert_eq!(rows, (0..read).collect::<Vec<u64>>(), "source {i}");
    }
    Changed {
        at,
        moved,
        dropped: report.dropped,
        after: got,
        end: restored,
    }
}

/// The documents of source `i` that `state` holds: buffered and the look-ahead.
fn held_of(state: &PipelineState, i: u16) -> u64 {
    let stream = &state.stream;
    (stream.buffered.iter())
        .chain(stream.mixer.peeked.iter().flatten())
        .filter(|p| p.source == i)
        .count() as u64
}

const WEB_CODE: [(&str, f64); 2] = [("web", 0.7), ("code", 0.3)];

#[test]
fn documents_to_tokens_moves_the_global_buffer_to_its_sources_buffers_in_buffer_order() {
    let a = Mix::new(&WEB_CODE, MixUnit::Documents, 40);
    let b = Mix::new(&WEB_CODE, MixUnit::Tokens, 40);
    let c = change(&a, &b, 150, 400);
    assert_eq!(c.dropped, vec![]);
    // Each source's residents, in the order they stood in the global buffer.
    let global = &c.at.stream.buffered;
    assert_eq!(global.len(), 40);
    let mixer = &c.moved.stream.mixer;
    let of = |i: u16| -> Vec<DocPos> { global.iter().filter(|p| p.source == i).copied().collect() };
    let (web, code) = (of(0), of(1));
    assert_eq!(
        c.moved.stream.buffered,
        [web.clone(), code.clone()].concat()
    );
    let counts: Vec<(u64, u64, bool)> = (mixer.shuffles.iter())
        .map(|s| (s.held, s.ready, s.draining))
        .collect();
    assert_eq!(
        counts,
        [(web.len() as u64, 0, false), (code.len() as u64, 0, false)]
    );
    // The stream's tokens so far are the packer's, counted in no source: phases count from the
    // stream's start.
    assert_eq!(mixer.earlier_tokens, 3 * 513 + 10);
    assert_eq!(mixer.emitted_tokens, [0, 0]);
    assert!(
        c.after.iter().all(|d| d.tokens.is_some()),
        "mixed in tokens"
    );
    // Each source's share of 40 is 20: the larger one lets its extra residents out first.
    for s in &c.end.state().mixer.shuffles {
        assert!(s.held <= 20, "{s:?}");
    }
}

#[test]
fn tokens_to_documents_merges_the_sources_buffers_source_by_source() {
    let a = Mix::new(&WEB_CODE, MixUnit::Tokens, 40);
    let b = Mix::new(&WEB_CODE, MixUnit::Documents, 16);
    let c = change(&a, &b, 150, 400);
    assert_eq!(c.dropped, vec![]);
    // The order the state listed them in: web's residents then the documents out of its
    // buffer, then code's.
    let was = &c.at.stream;
    assert_eq!(was.buffered.len(), {
        let s = &was.mixer.shuffles;
        (s[0].held + s[0].ready + s[1].held + s[1].ready) as usize
    });
    assert_eq!(c.moved.stream.buffered, was.buffered);
    let mixer = &c.moved.stream.mixer;
    assert!(mixer.shuffles.is_empty() && mixer.emitted_tokens.is_empty());
    assert_eq!((mixer.phase, mixer.earlier_tokens), (0, 0));
    // More than 16 residents: the extra ones left first; the buffer is at its size now.
    assert!(was.buffered.len() > 16);
    assert_eq!(c.end.buffered(), 16);
    assert!(
        c.after.iter().all(|d| d.tokens.is_none()),
        "mixed in documents"
    );
}

#[test]
fn a_source_added_to_a_mix_in_tokens_starts_at_its_beginning() {
    let a = Mix::new(&WEB_CODE, MixUnit::Tokens, 40);
    let b = Mix::new(
        &[("web", 0.4), ("code", 0.3), ("math", 0.3)],
        MixUnit::Tokens,
        40,
    );
    let c = change(&a, &b, 150, 400);
    assert_eq!(c.dropped, vec![]);
    let mixer = &c.moved.stream.mixer;
    assert_eq!(mixer.shuffles.len(), 3);
    assert_eq!(mixer.shuffles[2], Default::default());
    assert_eq!(mixer.emitted_tokens[2], 0);
    assert_eq!(
        mixer.phase_start, mixer.emitted_tokens,
        "shares count from here"
    );
    let math: Vec<&Doc> = c.after.iter().filter(|d| d.pos.source == 2).collect();
    assert!(math.len() > 50, "{}", math.len());
    // Its share of the tokens since the change: within one document of 30 %.
    let tokens = |s: Option<u16>| -> u64 {
        (c.after.iter())
            .filter(|d| s.is_none_or(|s| d.pos.source == s))
            .map(|d| d.tokens.as_ref().map_or(0, |t| t.len() as u64))
            .sum()
    };
    let share = tokens(Some(2)) as f64 / tokens(None) as f64;
    assert!((share - 0.3).abs() < 0.02, "{share}");
}

#[test]
fn a_source_removed_from_a_mix_in_tokens_drops_what_it_held_counted() {
    let a = Mix::new(
        &[("web", 0.4), ("code", 0.3), ("math", 0.3)],
        MixUnit::Tokens,
        60,
    );
    let b = Mix::new(
        &[("web", 0.5), ("code", 0.0), ("math", 0.5)],
        MixUnit::Tokens,
        60,
    );
    let c = change(&a, &b, 150, 400);
    // Its residents, the documents out of its buffer and its look-ahead: every one counted.
    let held = held_of(&c.at, 1);
    let s = &c.at.stream.mixer.shuffles[1];
    assert_eq!(held, s.held + s.ready + 1);
    assert!(s.ready > 0, "documents out of its buffer too");
    assert_eq!(c.dropped, vec![(1, held)]);
    assert!(c.after.iter().all(|d| d.pos.source != 1));
    assert_eq!(held_of(&c.moved, 1), 0);
    // Its cursor is kept for a later change; it is not read again.
    assert_eq!(c.end.state().sources[1], c.at.stream.sources[1]);
    // The others' buffers hold 30 each now (60 between two): they fill up.
    let end = c.end.state();
    assert_eq!(end.mixer.shuffles[0].held, 30);
    assert_eq!(end.mixer.shuffles[2].held, 30);
}

#[test]
fn a_smaller_buffer_in_tokens_lets_its_extra_residents_out_first_and_a_larger_one_fills() {
    let a = Mix::new(&WEB_CODE, MixUnit::Tokens, 200);
    let smaller = change(&a, &Mix::new(&WEB_CODE, MixUnit::Tokens, 20), 400, 600);
    let was: Vec<u64> = (smaller.at.stream.mixer.shuffles.iter())
        .map(|s| s.held)
        .collect();
    assert_eq!(was, [100, 100]);
    let moved: Vec<u64> = (smaller.moved.stream.mixer.shuffles.iter())
        .map(|s| s.held)
        .collect();
    assert_eq!(moved, was, "the residents are kept");
    let end: Vec<u64> = (smaller.end.state().mixer.shuffles.iter())
        .map(|s| s.held)
        .collect();
    assert_eq!(end, [10, 10]);

    let larger = change(&a, &Mix::new(&WEB_CODE, MixUnit::Tokens, 400), 400, 600);
    assert_eq!(larger.dropped, vec![]);
    let end: Vec<u64> = (larger.end.state().mixer.shuffles.iter())
        .map(|s| s.held)
        .collect();
    assert_eq!(end, [200, 200]);
}

#[test]
fn a_mix_in_tokens_that_had_ended_goes_on_after_a_change() {
    // `first_exhausted` ends the mix when code (60 rows) runs out; the change goes on with
    // every source running out at least once, code from its next pass.
    let short = |weights: &[f64], stopping| {
        let inputs = (["web", "code"].iter().zip(weights).enumerate())
            .map(|(i, (name, &weight))| MixInput {
                name: name.to_string(),
                weight,
                source: ByteTokens::new(VecSource::new(
                    i as u16,
                    (0..[400, 60][i]).map(|k| format!("{name}-{k}")).collect(),
                )),
            })
            .collect();
        DocStream::new(
            Mixer::by_tokens(inputs, stopping, 3, 20, Vec::new()),
            Shuffler::new(0, 3),
        )
    };
    let mut a = short(&[0.5, 0.5], Stopping::FirstExhausted);
    let before: Vec<Doc> = std::iter::from_fn(|| a.next_doc().unwrap()).collect();
    let state = PipelineState {
        stream: a.state(),
        packer: packer(),
    };
    assert!(state.stream.draining && state.stream.mixer.done);
    let mut next = Mix::new(&WEB_CODE, MixUnit::Tokens, 20).recipe();
    let (moved, report) = transplant(state, &next).unwrap();
    assert_eq!(report.dropped, vec![]);
    let run = |state: &StreamState| {
        let mut b = short(&[0.5, 0.5], Stopping::AllExhausted);
        b.restore(state).unwrap();
        std::iter::from_fn(move || b.next_doc().unwrap()).collect::<Vec<Doc>>()
    };
    let after = run(&moved.stream);
    assert_eq!(after, run(&moved.stream), "replayed exactly");
    let rows = |source: u16, pass: u32| -> BTreeSet<u64> {
        (before.iter().chain(&after))
            .filter(|d| d.pos.source == source && d.pos.pass == pass)
            .map(|d| d.pos.row)
            .collect()
    };
    assert_eq!(rows(1, 0).len(), 60, "code's first pass, before the change");
    assert!(!rows(1, 1).is_empty(), "code goes on in its next pass");
    assert_eq!(
        rows(0, 0).len(),
        400,
        "web runs out once: then the mix ends"
    );
    let all = before.len() + after.len();
    let unique: BTreeSet<DocPos> = before.iter().chain(&after).map(|d| d.pos).collect();
    assert_eq!(unique.len(), all, "a document came twice");
    // The new recipe must run every source out at least once to go on.
    next.mix.stopping = Stopping::FirstExhausted;
    let mut a = short(&[0.5, 0.5], Stopping::FirstExhausted);
    while a.next_doc().unwrap().is_some() {}
    let ended = PipelineState {
        stream: a.state(),
        packer: packer(),
    };
    let err = transplant(ended, &next).unwrap_err();
    assert!(
        err.contains("set [mix] stopping = \"all_exhausted\""),
        "{err}"
    );
}
