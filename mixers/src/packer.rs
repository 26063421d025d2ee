//! The packer: concatenates tokenized documents and cuts the stream into windows of
//! `seq_len + 1` tokens (inputs `w[..seq_len]`, labels `w[1..]`, as torchtitan does). Documents
//! are split across windows; there is no padding. The tokens left at the end that do not fill a
//! window are dropped by the driver and counted ([`Packer::leftover`]).
//!
//! Each window records where documents start inside it (offsets in `0..seq_len+1`); a window that
//! begins in the middle of a document has no start at 0.

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedWindow {
    pub tokens: Vec<u32>,
    /// Offsets in `tokens` where a document begins, strictly increasing.
    pub doc_starts: Vec<u32>,
}

/// The packer's whole state: the tokens of the window being filled and their document starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackerState {
    pub pending: Vec<u32>,
    pub pending_starts: Vec<u32>,
    pub windows_emitted: u64,
}

pub struct Packer {
    window_tokens: usize,
    /// Tokens of the window being filled (always fewer than `window_tokens`).
    pending: Vec<u32>,
    pending_starts: Vec<u32>,
    windows_emitted: u64,
}

impl Packer {
    pub fn new(window_tokens: usize) -> Self {
        assert!(window_tokens > 0);
        Self {
            window_tokens,
            pending: Vec::with_capacity(window_tokens),
            pending_starts: Vec::new(),
            windows_emitted: 0,
        }
    }

    /// Append one document's tokens (BOS/EOS already applied); completed windows go to `out`.
    pub fn push_doc(&mut self, mut tokens: &[u32], out: &mut Vec<PackedWindow>) {
        if tokens.is_empty() {
            return;
        }
        self.pending_starts.push(self.pending.len() as u32);
        while !tokens.is_empty() {
            let room = self.window_tokens - self.pending.len();
            let take = room.min(tokens.len());
            self.pending.extend_from_slice(&tokens[..take]);
            tokens = &tokens[take..];
            if self.pending.len() == self.window_tokens {
                let full =
                    std::mem::replace(&mut self.pending, Vec::with_capacity(self.window_tokens));
                out.push(PackedWindow {
                    tokens: full,
                    doc_starts: std::mem::take(&mut self.pending_starts),
                });
                self.windows_emitted += 1;
            }
        }
    }

    /// Tokens waiting for a window to fill: at the end of the stream, the dropped tail.
    pub fn leftover(&self) -> &[u32] {
        &self.pending
    }

    pub fn windows_emitted(&self) -> u64 {
        self.windows_emitted
    }

    pub fn state(&self) -> PackerState {
        PackerState {
            pending: self.pending.clone(),
            pending_starts: self.pending_starts.clone(),
            windows_emitted: self.windows_emitted,
        }
    }

    /// A packer that continues from `state`; `None` if the state cannot belong to a packer of
    /// this window size.
    pub fn from_state(window_tokens: usize, state: PackerState) -> Option<Self> {
        let starts_ok = state.pending_starts.windows(2).all(|w| w[0] < w[1])
            && state
                .pending_starts
                .last()
                .is_none_or(|&s| (s as usize) < state.pending.len());
        if window_tokens == 0 || state.pending.len() >= window_tokens || !starts_ok {
            return None;
        }
        let mut pending = state.pending;
        pending.reserve(window_tokens - pending.len());
        Some(Self {
            window_tokens,
            pending,
            pending_starts: state.pending_starts,
            windows_emitted: state.windows_emitted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pack(docs: &[Vec<u32>], window: usize) -> (Vec<PackedWindow>, Vec<u32>) {
        let mut p = Packer::new(window);
        let mut out = Vec::new();
        for d in docs {
            p.push_doc(d, &mut out);
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
                    tokens: vec![1, 2, 3, 4],
                    doc_starts: vec![0, 3]
                },
                PackedWindow {
                    tokens: vec![5, 6, 7, 8],
                    doc_starts: vec![]
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
                tokens: vec![3, 4],
                doc_starts: vec![0]
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
            prop_assert_eq!(got, want.into_iter().filter(|&s| s < complete).collect::<Vec<_>>());
        }
    }
}
