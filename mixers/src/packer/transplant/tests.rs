//! The packer's transplant at a change of course: no token lost or repeated across a switch of
//! strategy, a smaller pool drains, another pad pads the windows after the change.

use super::*;
use crate::packer::{BestFitPacker, PackedWindow, Packer, WindowPacker};
use proptest::prelude::*;

const PAD: u32 = 99_999;

/// Document `k` has tokens `k*1000 ..` (every token of the stream distinct).
fn docs_of(lens: &[usize]) -> Vec<Vec<u32>> {
    (lens.iter().enumerate())
        .map(|(k, &n)| (0..n as u32).map(|t| k as u32 * 1000 + t).collect())
        .collect()
}

fn concat(window: usize) -> PackerConfig {
    PackerConfig {
        window_tokens: window,
        best_fit: None,
    }
}

fn best_fit(window: usize, pool: usize, pad: u32) -> PackerConfig {
    PackerConfig {
        window_tokens: window,
        best_fit: Some((pool, pad)),
    }
}

/// Pack `docs[..cut]` with `before`, change to `after` there, pack the rest and finish: the
/// windows, and the tail left.
fn run(
    docs: &[Vec<u32>],
    cut: usize,
    before: PackerConfig,
    after: PackerConfig,
) -> (Vec<PackedWindow>, Vec<u32>) {
    let mut out = Vec::new();
    let mut packer = WindowPacker::new(before);
    for (k, d) in docs[..cut].iter().enumerate() {
        packer.push_doc(d, (k % 3) as u16, &mut out);
    }
    let changed = transplant_packer(packer.state(), &after);
    assert_eq!(changed.state.windows_emitted, out.len() as u64);
    let mut packer = WindowPacker::from_state(after, changed.state).unwrap();
    for (k, d) in docs.iter().enumerate().skip(cut) {
        packer.push_doc(d, (k % 3) as u16, &mut out);
    }
    packer.finish(&mut out);
    let tail = match &packer {
        WindowPacker::Concat(p) => p.leftover().to_vec(),
        WindowPacker::BestFit(_) => Vec::new(),
    };
    (out, tail)
}

/// Every real token of `windows` and `tail`, sorted, against every token of `docs`.
fn same_tokens(docs: &[Vec<u32>], windows: &[PackedWindow], tail: &[u32]) -> bool {
    let mut got: Vec<u32> = (windows.iter())
        .flat_map(|w| w.tokens[..w.real_tokens as usize].iter().copied())
        .chain(tail.iter().copied())
        .collect();
    let mut want: Vec<u32> = docs.iter().flatten().copied().collect();
    got.sort_unstable();
    want.sort_unstable();
    got == want
}

proptest! {
    /// `concat` → `best_fit`: the window being filled enters the pool; every token lands once,
    /// and every window the new packer makes starts a document at 0 and pads with its pad.
    #[test]
    fn concat_to_best_fit_loses_and_repeats_no_token(lens in proptest::collection::vec(1usize..40, 0..50), window in 1usize..32, pool in 1usize..10, cut in 0usize..50) {
        let docs = docs_of(&lens);
        let cut = cut.min(docs.len());
        let (windows, tail) = run(&docs, cut, concat(window), best_fit(window, pool, PAD));
        prop_assert!(tail.is_empty());
        prop_assert!(same_tokens(&docs, &windows, &tail));
        let total: usize = docs[..cut].iter().map(Vec::len).sum();
        for w in &windows[total / window..] {
            prop_assert_eq!(w.doc_starts.first(), Some(&0));
            prop_assert!(w.tokens[w.real_tokens as usize..].iter().all(|&t| t == PAD));
        }
    }

    /// `best_fit` → `concat`: the pool's documents open the concat stream; every token lands
    /// once (the tail that fills no window aside), in full windows after the change.
    #[test]
    fn best_fit_to_concat_loses_and_repeats_no_token(lens in proptest::collection::vec(1usize..40, 0..50), window in 1usize..32, pool in 1usize..10, cut in 0usize..50) {
        let docs = docs_of(&lens);
        let cut = cut.min(docs.len());
        let mut before = WindowPacker::new(best_fit(window, pool, PAD));
        let mut first = Vec::new();
        for (k, d) in docs[..cut].iter().enumerate() {
            before.push_doc(d, (k % 3) as u16, &mut first);
        }
        let (windows, tail) = run(&docs, cut, best_fit(window, pool, PAD), concat(window));
        prop_assert_eq!(&windows[..first.len()], &first[..]);
        prop_assert!(tail.len() < window);
        prop_assert!(same_tokens(&docs, &windows, &tail));
        prop_assert!(windows[first.len()..].iter().all(|w| w.real_tokens as usize == window));
    }

    /// Back and forth, with no document between the two changes: still every token once.
    #[test]
    fn two_switches_in_a_row_lose_no_token(lens in proptest::collection::vec(1usize..40, 0..50), window in 1usize..16, pool in 1usize..10, cut in 0usize..50) {
        let docs = docs_of(&lens);
        let cut = cut.min(docs.len());
        let mut out = Vec::new();
        let mut packer = WindowPacker::new(best_fit(window, pool, PAD));
        for (k, d) in docs[..cut].iter().enumerate() {
            packer.push_doc(d, (k % 3) as u16, &mut out);
        }
        let state = transplant_packer(packer.state(), &concat(window)).state;
        let state = transplant_packer(state, &best_fit(window, pool, PAD)).state;
        let mut packer = WindowPacker::from_state(best_fit(window, pool, PAD), state).unwrap();
        for (k, d) in docs.iter().enumerate().skip(cut) {
            packer.push_doc(d, (k % 3) as u16, &mut out);
        }
        packer.finish(&mut out);
        prop_assert!(same_tokens(&docs, &out, &[]));
    }
}

/// The end of the document that crossed the change (and nothing else) is a pooled document at
/// the mixing position of its first token; it starts the first padded window.
#[test]
fn the_concat_window_being_filled_becomes_a_pooled_document() {
    let docs = docs_of(&[3, 12]);
    let mut p = Packer::new(10);
    let mut out = Vec::new();
    for (k, d) in docs.iter().enumerate() {
        p.push_doc(d, k as u16, &mut out);
    }
    assert_eq!(out.len(), 1);
    let changed = transplant_packer(p.state(), &best_fit(10, 4, PAD));
    assert_eq!(changed.ended, None);
    let pool = changed.state.pool.clone().unwrap();
    assert_eq!(pool.docs.len(), 1);
    assert_eq!((pool.docs[0].seq, pool.docs[0].source), (10, 1));
    assert_eq!(&pool.docs[0].tokens[..], &docs[1][7..]);
    assert_eq!((pool.next_seq, pool.pushed_tokens), (15, 15));
    let mut next = BestFitPacker::from_state(10, 4, PAD, changed.state).unwrap();
    next.finish(&mut out);
    assert_eq!(out[1].doc_starts, vec![0]);
    assert_eq!(out[1].doc_positions, vec![10]);
    assert_eq!(out[1].real_tokens, 5);
    assert_eq!(&out[1].tokens[..5], &docs[1][7..]);
    assert_eq!(&out[1].tokens[5..], &[PAD; 5]);
}

/// The pool's documents, in arrival order, open the concat stream before the next document;
/// the counters of the packing that ended are handed back.
#[test]
fn the_pool_opens_the_concat_stream_in_arrival_order() {
    let docs = docs_of(&[4, 3, 5]);
    let mut p = BestFitPacker::new(10, 8, PAD);
    let mut out = Vec::new();
    p.push_doc(&docs[0], 0, &mut out);
    p.push_doc(&docs[1], 1, &mut out);
    let changed = transplant_packer(p.state(), &concat(10));
    assert_eq!(changed.ended, Some(p.counters()));
    let s = &changed.state;
    assert!(s.pool.is_none());
    assert_eq!(
        (s.pending_starts.clone(), s.pending_sources.clone()),
        (vec![0, 4], vec![0, 1])
    );
    let mut next = Packer::from_state(10, changed.state).unwrap();
    next.push_doc(&docs[2], 2, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].doc_starts, vec![0, 4, 7]);
    assert_eq!(out[0].doc_sources, vec![0, 1, 2]);
    assert_eq!(next.leftover(), &docs[2][3..]);
}

/// A pool made smaller takes no new document until it is below its new size: the first
/// document after the change waits for windows of the old pool's documents.
#[test]
fn a_smaller_pool_drains_before_it_takes_a_document() {
    let docs = docs_of(&[2, 3, 4, 5, 6, 7]);
    let mut p = BestFitPacker::new(20, 8, PAD);
    let mut out = Vec::new();
    for (k, d) in docs[..5].iter().enumerate() {
        p.push_doc(d, k as u16, &mut out);
    }
    assert_eq!((out.len(), p.pool_len()), (0, 5));
    let changed = transplant_packer(p.state(), &best_fit(20, 2, PAD));
    let mut small = BestFitPacker::from_state(20, 2, PAD, changed.state).unwrap();
    small.push_doc(&docs[5], 5, &mut out);
    // 6+5+4+3+2 = 20: one window drains the pool whole; then the 7 waits alone.
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].doc_sources, vec![4, 3, 2, 1, 0]);
    assert_eq!(small.pool_len(), 1);
    let mut rest = Vec::new();
    small.finish(&mut rest);
    assert_eq!(rest[0].tokens[..7], docs[5][..]);
}

/// Another pad pads the windows the packer makes from the change on; those before keep theirs.
#[test]
fn another_pad_pads_from_the_change_on() {
    let docs = docs_of(&[6, 7, 5, 8]);
    let (windows, _) = run(&docs, 2, best_fit(10, 2, PAD), best_fit(10, 2, 7));
    assert_eq!(windows.len(), 4);
    assert_eq!(&windows[0].tokens[7..], &[PAD; 3]);
    assert!(
        windows[1..]
            .iter()
            .all(|w| w.tokens[w.real_tokens as usize..].iter().all(|&t| t == 7))
    );
    assert_eq!(windows[1].real_tokens, 6);
}
