//! The `concat` packer: concatenates tokenized documents and cuts the stream into windows of
//! `seq_len + 1` tokens (inputs `w[..seq_len]`, labels `w[1..]`, as torchtitan does). Documents
//! are split across windows; there is no padding. The tokens left at the end that do not fill a
//! window are dropped by the driver and counted ([`Packer::leftover`]).
//!
//! Each window records where documents start inside it (offsets in `0..seq_len+1`), the source
//! each of them came from, and the source of the document that holds its first token (a window
//! that begins in the middle of a document has no start at 0).

use super::{PackedWindow, PackerState};

pub struct Packer {
    window_tokens: usize,
    /// Tokens of the window being filled (always fewer than `window_tokens`).
    pending: Vec<u32>,
    pending_starts: Vec<u32>,
    pending_sources: Vec<u16>,
    lead_source: u16,
    windows_emitted: u64,
}

impl Packer {
    pub fn new(window_tokens: usize) -> Self {
        assert!(window_tokens > 0);
        Self {
            window_tokens,
            pending: Vec::with_capacity(window_tokens),
            pending_starts: Vec::new(),
            pending_sources: Vec::new(),
            lead_source: 0,
            windows_emitted: 0,
        }
    }

    /// Append one document's tokens (BOS/EOS already applied) from recipe source `source`;
    /// completed windows go to `out`.
    pub fn push_doc(&mut self, mut tokens: &[u32], source: u16, out: &mut Vec<PackedWindow>) {
        if tokens.is_empty() {
            return;
        }
        self.drain(out);
        if self.pending.is_empty() {
            self.lead_source = source;
        }
        self.pending_starts.push(self.pending.len() as u32);
        self.pending_sources.push(source);
        while !tokens.is_empty() {
            let room = self.window_tokens - self.pending.len();
            let take = room.min(tokens.len());
            self.pending.extend_from_slice(&tokens[..take]);
            tokens = &tokens[take..];
            if self.pending.len() == self.window_tokens {
                let full =
                    std::mem::replace(&mut self.pending, Vec::with_capacity(self.window_tokens));
                out.push(PackedWindow {
                    real_tokens: full.len() as u32,
                    tokens: full,
                    doc_starts: std::mem::take(&mut self.pending_starts),
                    doc_sources: std::mem::take(&mut self.pending_sources),
                    lead_source: self.lead_source,
                    doc_positions: Vec::new(),
                });
                self.lead_source = source; // the next window goes on with this document
                self.windows_emitted += 1;
            }
        }
    }

    /// The whole windows `pending` holds, out in order: only a state transplanted at a change of
    /// course holds any (a `best_fit` pool's documents concatenated: `packer/transplant.rs`).
    /// The next document waits for them, and so does the end of the stream.
    pub fn drain(&mut self, out: &mut Vec<PackedWindow>) {
        let window = self.window_tokens;
        while self.pending.len() >= window {
            let rest = self.pending.split_off(window);
            let full = std::mem::replace(&mut self.pending, rest);
            let cut = (self.pending_starts).partition_point(|&s| (s as usize) < window);
            let doc_starts: Vec<u32> = self.pending_starts.drain(..cut).collect();
            let doc_sources: Vec<u16> = self.pending_sources.drain(..cut).collect();
            let lead_source = self.lead_source;
            // The next window's first token: a document starting there, or the last one begun.
            self.lead_source = match self.pending_starts.first() {
                Some(&s) if s as usize == window => self.pending_sources[0],
                _ => doc_sources.last().copied().unwrap_or(lead_source),
            };
            for s in &mut self.pending_starts {
                *s -= window as u32;
            }
            out.push(PackedWindow {
                real_tokens: window as u32,
                tokens: full,
                doc_starts,
                doc_sources,
                lead_source,
                doc_positions: Vec::new(),
            });
            self.windows_emitted += 1;
        }
    }

    /// Tokens waiting for a window to fill: at the end of the stream, the dropped tail.
    pub fn leftover(&self) -> &[u32] {
        &self.pending
    }

    /// Tokens pushed so far: where the next document starts in the stream.
    pub fn position_tokens(&self) -> u64 {
        self.windows_emitted() * self.window_tokens as u64 + self.leftover().len() as u64
    }

    pub fn windows_emitted(&self) -> u64 {
        self.windows_emitted
    }

    pub fn state(&self) -> PackerState {
        PackerState {
            pending: self.pending.clone(),
            pending_starts: self.pending_starts.clone(),
            pending_sources: self.pending_sources.clone(),
            lead_source: self.lead_source,
            windows_emitted: self.windows_emitted,
            pool: None,
        }
    }

    /// A packer that continues from `state`; `None` if the state cannot belong to a packer of
    /// this window size. A state transplanted at a change of course may hold whole windows
    /// ([`Packer::drain`]).
    pub fn from_state(window_tokens: usize, state: PackerState) -> Option<Self> {
        let starts_ok = state.pending_starts.windows(2).all(|w| w[0] < w[1])
            && state
                .pending_starts
                .last()
                .is_none_or(|&s| (s as usize) < state.pending.len())
            && state.pending_sources.len() == state.pending_starts.len();
        if window_tokens == 0 || !starts_ok || state.pool.is_some() {
            return None;
        }
        let mut pending = state.pending;
        pending.reserve(window_tokens.saturating_sub(pending.len()));
        Some(Self {
            window_tokens,
            pending,
            pending_starts: state.pending_starts,
            pending_sources: state.pending_sources,
            lead_source: state.lead_source,
            windows_emitted: state.windows_emitted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Document `k` comes from source `k % 3`.
    fn pack(docs: &[Vec<u32>], window: usize) -> (Vec<PackedWindow>, Vec<u32>) {
        let mut p = Packer::new(window);
        let mut out = Vec::new();
        for (k, d) in docs.iter().enumerate() {
            p.push_doc(d, (k % 3) as u16, &mut out);
        }
        (out, p.leftover().to_vec())
    }

    #[test]
    fn splits_documents_across_windows() {
        let (w, rest) = pack(&[vec![1, 2, 3], vec![4, 5, 6, 7, 8], vec![9]], 4);
        assert_eq!(
            w,
            vec![
                PackedWindow {
                    real_tokens: 4,
                    tokens: vec![1, 2, 3, 4],
                    doc_starts: vec![0, 3],
                    doc_sources: vec![0, 1],
                    lead_source: 0,
                    doc_positions: vec![],
                },
                PackedWindow {
                    real_tokens: 4,
                    tokens: vec![5, 6, 7, 8],
                    doc_starts: vec![],
                    doc_sources: vec![],
                    lead_source: 1,
                    doc_positions: vec![],
                },
            ]
        );
        assert_eq!(rest, vec![9]);
    }

    #[test]
    fn a_document_ending_on_a_window_edge_starts_the_next_at_zero() {
        let (w, rest) = pack(&[vec![1, 2], vec![3, 4], vec![5]], 2);
        assert_eq!(
            w[1],
            PackedWindow {
                real_tokens: 2,
                tokens: vec![3, 4],
                doc_starts: vec![0],
                doc_sources: vec![1],
                lead_source: 1,
                doc_positions: vec![],
            }
        );
        assert_eq!(rest, vec![5]);
    }

    proptest! {
        #[test]
        fn loses_and_adds_no_token(docs in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 1..50), 0..40), window in 1usize..64) {
            let (w, rest) = pack(&docs, window);
            let flat: Vec<u32> = docs.concat();
            let mut packed: Vec<u32> = w.iter().flat_map(|w| w.tokens.clone()).collect();
            prop_assert!(w.iter().all(|w| w.tokens.len() == window));
            prop_assert!(rest.len() < window);
            packed.extend(&rest);
            prop_assert_eq!(packed, flat);
            // Every document start is recorded exactly once, at its global offset.
            let mut want = Vec::new();
            let mut at = 0usize;
            for d in &docs { want.push(at); at += d.len(); }
            let got: Vec<usize> = w.iter().enumerate().flat_map(|(i, w)| w.doc_starts.iter().map(move |&s| i * window + s as usize)).collect();
            let complete = w.len() * window;
            prop_assert_eq!(got, want.iter().copied().filter(|&s| s < complete).collect::<Vec<_>>());
            // Every token's source: the lead's up to the first start, then each start's.
            let mut owner = Vec::new();
            for (k, d) in docs.iter().enumerate() { owner.extend(std::iter::repeat_n((k % 3) as u16, d.len())); }
            for (i, w) in w.iter().enumerate() {
                prop_assert_eq!(w.doc_sources.len(), w.doc_starts.len());
                let mut source = w.lead_source;
                for t in 0..window {
                    if let Some(k) = w.doc_starts.iter().position(|&s| s as usize == t) { source = w.doc_sources[k]; }
                    prop_assert_eq!(source, owner[i * window + t]);
                }
            }
        }

        /// Cut anywhere: a packer from the state packs the rest as the uncut one does.
        #[test]
        fn a_packer_from_its_state_continues_exactly(docs in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 1..50), 0..40), window in 1usize..64, cut in 0usize..40) {
            let (whole, rest) = pack(&docs, window);
            let cut = cut.min(docs.len());
            let mut first = Packer::new(window);
            let mut got = Vec::new();
            for (k, d) in docs[..cut].iter().enumerate() { first.push_doc(d, (k % 3) as u16, &mut got); }
            let mut second = Packer::from_state(window, first.state()).unwrap();
            for (k, d) in docs.iter().enumerate().skip(cut) { second.push_doc(d, (k % 3) as u16, &mut got); }
            prop_assert_eq!(got, whole);
            prop_assert_eq!(second.leftover(), &rest[..]);
        }
    }
}
