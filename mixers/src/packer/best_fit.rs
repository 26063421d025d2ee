//! The `best_fit` packer: documents wait in a pool of at most `capacity` documents; when it is
//! full, one window is filled best-fit-decreasing from it — the longest document first, then again
//! and again the longest that still fits — and the rest of the window is padding. A document of a
//! window or more is cut into window-sized pieces, each a document start: every full piece is a
//! window of its own at once, the remainder waits in the pool. These are the only documents cut.
//! At the end of the stream the pool is packed out whole, so no token is dropped.
//!
//! After a change of course the pool may hold more documents than its capacity (a smaller
//! `pool_documents`, or a `concat` window's tokens transplanted: `packer/transplant.rs`): the
//! packer then takes no new document until the pool is below its capacity again, filling windows
//! from the pool first, as it always does, one at a time.
//!
//! Deterministic: the pool is ordered by (length, arrival), so of two documents of one length the
//! earlier is taken first, whatever the thread count. A document's arrival number is its mixing
//! position: the tokens pushed before it (where it starts in the stream as mixed, before any
//! reordering), so every window says where each of its documents was mixed
//! ([`PackedWindow::doc_positions`]) and the ledger counts phases by it, not by the window. Memory: at most `capacity` documents of
//! fewer than `window_tokens` tokens each (the recipe caps `capacity × window_tokens × 4` bytes).

use super::{PackedWindow, PackerState, PackingCounters, PoolState, PooledDoc};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The pool's order: by length, then arrival (reversed, so that the last of a length is the
/// earliest).
type PoolKey = (u32, Reverse<u64>);

pub struct BestFitPacker {
    window_tokens: usize,
    capacity: usize,
    pad_id: u32,
    /// Each document's source and tokens (its key holds its mixing position), shared with the snapshots that hold it (a snapshot per
    /// step costs a reference per pooled document, not a copy of the pool).
    pool: BTreeMap<PoolKey, (u16, Arc<[u32]>)>,
    pool_tokens: u64,
    next_seq: u64,
    pushed_tokens: u64,
    windows_emitted: u64,
    counters: PackingCounters,
}

impl BestFitPacker {
    pub fn new(window_tokens: usize, capacity: usize, pad_id: u32) -> Self {
        assert!(window_tokens > 0 && capacity > 0);
        Self {
            window_tokens,
            capacity,
            pad_id,
            pool: BTreeMap::new(),
            pool_tokens: 0,
            next_seq: 0,
            pushed_tokens: 0,
            windows_emitted: 0,
            counters: PackingCounters::default(),
        }
    }

    /// Take one document (BOS/EOS already applied) from recipe source `source`; windows it
    /// completes go to `out`.
    pub fn push_doc(&mut self, tokens: &[u32], source: u16, out: &mut Vec<PackedWindow>) {
        if tokens.is_empty() {
            return;
        }
        // A pool over its capacity (a change of course made it smaller) drains first.
        while self.pool.len() >= self.capacity {
            self.fill_one(out);
        }
        // Its mixing position; never below `next_seq`, so a pool restored from a checkpoint of
        // an older dsprep (arrival counts) keeps its order.
        let position = self.pushed_tokens.max(self.next_seq);
        self.pushed_tokens += tokens.len() as u64;
        self.next_seq = self.next_seq.max(position + 1);
        let window = self.window_tokens;
        if tokens.len() > window {
            self.counters.documents_cut += 1;
            self.counters.cut_pieces += tokens.len().div_ceil(window) as u64;
        }
        let mut pieces = tokens.chunks_exact(window);
        for piece in pieces.by_ref() {
            self.emit(vec![(source, position, piece)], out);
        }
        let rest = pieces.remainder();
        if rest.is_empty() {
            return;
        }
        let key = (rest.len() as u32, Reverse(position));
        self.pool.insert(key, (source, Arc::from(rest)));
        self.pool_tokens += rest.len() as u64;
        let counters = &mut self.counters;
        counters.pool_peak_documents = counters.pool_peak_documents.max(self.pool.len() as u64);
        counters.pool_peak_tokens = counters.pool_peak_tokens.max(self.pool_tokens);
        while self.pool.len() >= self.capacity {
            self.fill_one(out);
        }
    }

    /// The stream has ended: pack the whole pool.
    pub fn finish(&mut self, out: &mut Vec<PackedWindow>) {
        while !self.pool.is_empty() {
            self.fill_one(out);
        }
    }

    /// One window from the pool, best-fit-decreasing.
    fn fill_one(&mut self, out: &mut Vec<PackedWindow>) {
        let mut taken = Vec::new();
        let mut room = self.window_tokens;
        // The longest document that fits `room` (of one length, the earliest).
        while let Some((&key, _)) = self.pool.range(..=(room as u32, Reverse(0))).next_back() {
            let Some((source, tokens)) = self.pool.remove(&key) else {
                break;
            };
            room -= tokens.len();
            self.pool_tokens -= tokens.len() as u64;
            taken.push((source, key.1.0, tokens));
        }
        if !taken.is_empty() {
            self.emit(
                taken.iter().map(|(s, p, t)| (*s, *p, &t[..])).collect(),
                out,
            );
        }
    }

    /// A window of `docs` (source, mixing position, tokens) in order, padded to the window.
    fn emit(&mut self, docs: Vec<(u16, u64, &[u32])>, out: &mut Vec<PackedWindow>) {
        let mut tokens = Vec::with_capacity(self.window_tokens);
        let mut doc_starts = Vec::with_capacity(docs.len());
        let mut doc_sources = Vec::with_capacity(docs.len());
        let mut doc_positions = Vec::with_capacity(docs.len());
        for (source, position, doc) in &docs {
            doc_starts.push(tokens.len() as u32);
            doc_sources.push(*source);
            doc_positions.push(*position);
            tokens.extend_from_slice(doc);
        }
        let real_tokens = tokens.len();
        tokens.resize(self.window_tokens, self.pad_id);
        self.counters.padding_tokens += (self.window_tokens - real_tokens) as u64;
        self.windows_emitted += 1;
        out.push(PackedWindow {
            tokens,
            real_tokens: real_tokens as u32,
            lead_source: doc_sources[0],
            doc_starts,
            doc_sources,
            doc_positions,
        });
    }

    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }

    pub fn pool_tokens(&self) -> u64 {
        self.pool_tokens
    }

    pub fn pushed_tokens(&self) -> u64 {
        self.pushed_tokens
    }

    pub fn counters(&self) -> PackingCounters {
        self.counters
    }

    pub fn windows_emitted(&self) -> u64 {
        self.windows_emitted
    }

    pub fn state(&self) -> PackerState {
        let mut docs: Vec<PooledDoc> = (self.pool.iter())
            .map(|(&(_, Reverse(seq)), (source, tokens))| PooledDoc {
                seq,
                source: *source,
                tokens: Arc::clone(tokens),
            })
            .collect();
        docs.sort_unstable_by_key(|d| d.seq);
        PackerState {
            windows_emitted: self.windows_emitted,
            pool: Some(PoolState {
                docs,
                next_seq: self.next_seq,
                pushed_tokens: self.pushed_tokens,
                counters: self.counters,
            }),
            ..PackerState::default()
        }
    }

    /// A packer that continues from `state`; `None` if it cannot be this packer's: no pool, a
    /// pending `concat` window, a document longer than a window, or arrival numbers out of
    /// order. A pool of `capacity` documents or more (a change of course made it smaller) drains
    /// before the next document; a document of a whole window (a transplanted `concat` window's
    /// piece) fills one.
    pub fn from_state(
        window_tokens: usize,
        capacity: usize,
        pad_id: u32,
        state: PackerState,
    ) -> Option<Self> {
        let pool = state.pool?;
        let sound = window_tokens > 0
            && capacity > 0
            && state.pending.is_empty()
            && state.pending_starts.is_empty()
            && pool.docs.windows(2).all(|d| d[0].seq < d[1].seq)
            && pool.docs.last().is_none_or(|d| d.seq < pool.next_seq)
            && (pool.docs.iter()).all(|d| !d.tokens.is_empty() && d.tokens.len() <= window_tokens);
        if !sound {
            return None;
        }
        let mut packer = Self::new(window_tokens, capacity, pad_id);
        for doc in pool.docs {
            packer.pool_tokens += doc.tokens.len() as u64;
            let key = (doc.tokens.len() as u32, Reverse(doc.seq));
            packer.pool.insert(key, (doc.source, doc.tokens));
        }
        packer.next_seq = pool.next_seq;
        packer.pushed_tokens = pool.pushed_tokens;
        packer.windows_emitted = state.windows_emitted;
        packer.counters = pool.counters;
        Some(packer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAD: u32 = 9_999;

    /// Document `k` has tokens `k*1000 ..` and comes from source `k % 3`.
    fn docs_of(lens: &[usize]) -> Vec<Vec<u32>> {
        (lens.iter().enumerate())
            .map(|(k, &n)| (0..n as u32).map(|t| k as u32 * 1000 + t).collect())
            .collect()
    }

    fn pack(docs: &[Vec<u32>], window: usize, pool: usize) -> Vec<PackedWindow> {
        let mut p = BestFitPacker::new(window, pool, PAD);
        let mut out = Vec::new();
        for (k, d) in docs.iter().enumerate() {
            p.push_doc(d, (k % 3) as u16, &mut out);
        }
        p.finish(&mut out);
        assert_eq!(p.pool_len(), 0);
        out
    }

    #[test]
    fn fills_the_longest_first_then_the_longest_that_fits() {
        // Window 10, pool 4: the 4th document fills the pool: 6 goes first, then 3 (not 5), then 1.
        let docs = docs_of(&[3, 6, 5, 1]);
        let w = pack(&docs, 10, 4);
        assert_eq!(w[0].doc_starts, vec![0, 6, 9]);
        assert_eq!(w[0].doc_sources, vec![1, 0, 0]);
        assert_eq!(w[0].real_tokens, 10);
        assert_eq!(&w[0].tokens[..6], &docs[1][..]);
        // The end of the stream packs the 5 alone, padded.
        assert_eq!(w[1].real_tokens, 5);
        assert_eq!(&w[1].tokens[5..], &[PAD; 5]);
        assert_eq!((w[1].lead_source, w.len()), (2, 2));
    }

    #[test]
    fn only_documents_longer_than_a_window_are_cut() {
        let docs = docs_of(&[23, 4, 10]);
        let mut p = BestFitPacker::new(10, 100, PAD);
        let mut out = Vec::new();
        for (k, d) in docs.iter().enumerate() {
            p.push_doc(d, k as u16, &mut out);
        }
        // Two full pieces of the 23 at once, and the 10 (a window exactly): not cut.
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].tokens, docs[0][10..20].to_vec());
        p.finish(&mut out);
        // The 3-token remainder and the 4 share the last window.
        assert_eq!(out[3].doc_starts, vec![0, 4]);
        assert_eq!(out[3].real_tokens, 7);
        let c = p.counters();
        assert_eq!((c.documents_cut, c.cut_pieces, c.padding_tokens), (1, 3, 3));
    }

    proptest! {
        /// Every token lands once, documents whole unless longer than a window, windows full
        /// of real tokens then padding, at most `pool` documents waiting.
        #[test]
        fn keeps_every_document_whole_and_pads_the_rest(lens in proptest::collection::vec(1usize..40, 0..60), window in 1usize..32, pool in 1usize..12) {
            let docs = docs_of(&lens);
            let windows = pack(&docs, window, pool);
            let mut seen: Vec<(u32, Vec<u32>)> = Vec::new();
            let mut padding = 0;
            for w in &windows {
                prop_assert_eq!(w.tokens.len(), window);
                let real = w.real_tokens as usize;
                prop_assert!(real > 0 && real <= window);
                prop_assert!(w.tokens[real..].iter().all(|&t| t == PAD));
                padding += window - real;
                prop_assert_eq!(w.doc_starts.first(), Some(&0));
                prop_assert_eq!(w.lead_source, w.doc_sources[0]);
                let ends = w.doc_starts.iter().skip(1).copied().chain([real as u32]);
                for ((&s, e), &source) in w.doc_starts.iter().zip(ends).zip(&w.doc_sources) {
                    let piece = w.tokens[s as usize..e as usize].to_vec();
                    let doc = piece[0] / 1000;
                    prop_assert_eq!(source, (doc % 3) as u16);
                    seen.push((doc, piece));
                }
            }
            // Pieces of one document come in order; joined they are the document.
            seen.sort_by_key(|(doc, piece)| (*doc, piece[0]));
            let mut joined: Vec<Vec<u32>> = vec![Vec::new(); docs.len()];
            let mut pieces = vec![0usize; docs.len()];
            for (doc, piece) in seen {
                joined[doc as usize].extend(piece);
                pieces[doc as usize] += 1;
            }
            prop_assert_eq!(&joined, &docs);
            for (d, n) in docs.iter().zip(pieces) {
                prop_assert_eq!(n, d.len().div_ceil(window));
            }
            let total: usize = lens.iter().sum();
            prop_assert_eq!(windows.len() * window, total + padding);
        }

        /// Cut anywhere: a packer from its state packs the rest as the uncut one does.
        #[test]
        fn a_packer_from_its_state_continues_exactly(lens in proptest::collection::vec(1usize..40, 0..60), window in 1usize..32, pool in 1usize..12, cut in 0usize..60) {
            let docs = docs_of(&lens);
            let whole = pack(&docs, window, pool);
            let cut = cut.min(docs.len());
            let mut first = BestFitPacker::new(window, pool, PAD);
            let mut got = Vec::new();
            for (k, d) in docs[..cut].iter().enumerate() { first.push_doc(d, (k % 3) as u16, &mut got); }
            let mut second = BestFitPacker::from_state(window, pool, PAD, first.state()).unwrap();
            prop_assert_eq!(second.counters(), first.counters());
            for (k, d) in docs.iter().enumerate().skip(cut) { second.push_doc(d, (k % 3) as u16, &mut got); }
            second.finish(&mut got);
            prop_assert_eq!(got, whole);
        }
    }

    /// Every start carries its document's mixing position (tokens pushed before it), pieces of
    /// a cut document their document's, whatever window it lands in; a packer from its state
    /// goes on numbering from there.
    #[test]
    fn windows_say_where_each_document_was_mixed() {
        // Mixed at 0 (3 tokens), 3 (23: pieces of 10, 10, 3), 26 (6), 32 (1).
        let docs = docs_of(&[3, 23, 6, 1]);
        let mut p = BestFitPacker::new(10, 3, PAD);
        let mut out = Vec::new();
        for (k, d) in docs[..2].iter().enumerate() {
            p.push_doc(d, k as u16, &mut out);
        }
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|w| w.doc_positions == vec![3]));
        let mut p = BestFitPacker::from_state(10, 3, PAD, p.state()).unwrap();
        for (k, d) in docs.iter().enumerate().skip(2) {
            p.push_doc(d, k as u16, &mut out);
        }
        p.finish(&mut out);
        // The pool filled at the 6: it goes first with the earlier 3-token document; at the
        // end the piece left (mixed at 3) and the 1 share the last window.
        assert_eq!(out[2].doc_positions, vec![26, 0]);
        assert_eq!(out[2].doc_starts, vec![0, 6]);
        assert_eq!(out[3].doc_positions, vec![3, 32]);
        assert_eq!(out[3].doc_sources, vec![1, 3]);
        assert_eq!(p.state().pool.unwrap().next_seq, 33);
    }

    #[test]
    fn refuses_a_state_that_is_not_its_own() {
        let mut p = BestFitPacker::new(10, 4, PAD);
        let mut out = Vec::new();
        p.push_doc(&[1, 2, 3], 0, &mut out);
        let state = p.state();
        assert!(BestFitPacker::from_state(10, 4, PAD, state.clone()).is_some());
        // A smaller window than a pooled document, a concat state.
        assert!(BestFitPacker::from_state(2, 4, PAD, state.clone()).is_none());
        assert!(BestFitPacker::from_state(10, 4, PAD, PackerState::default()).is_none());
    }
}
