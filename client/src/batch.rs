//! How windows become per-rank batches: global step `s` is the `world_size × micro_batch`
//! consecutive windows starting at `s × world_size × micro_batch`, and rank `r` takes the
//! contiguous `micro_batch` windows at offset `r × micro_batch` inside it. Every rank gets the
//! same number of steps: a last, incomplete global batch is not served.

use crate::packed::{TokenSlice, Window};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLayout {
    pub world_size: u32,
    pub micro_batch: u32,
}

impl BatchLayout {
    pub fn global_batch(&self) -> u64 {
        u64::from(self.world_size) * u64::from(self.micro_batch)
    }

    /// Steps every rank gets out of `num_windows` windows.
    pub fn num_steps(&self, num_windows: u64) -> u64 {
        num_windows / self.global_batch()
    }

    /// The window indices rank `rank` reads at step `step`.
    pub fn windows(&self, step: u64, rank: u32) -> std::ops::Range<u64> {
        let first = step * self.global_batch() + u64::from(rank) * u64::from(self.micro_batch);
        first..first + u64::from(self.micro_batch)
    }
}

/// The source of each of the first `len` tokens of a row whose documents start at `doc_starts`
/// (from `doc_sources`), the first of them continuing a document from `lead`: what a trainer
/// masks its loss with to log it per source.
pub fn token_sources(len: usize, doc_starts: &[u32], doc_sources: &[u16], lead: u16) -> Vec<u16> {
    let mut out = Vec::with_capacity(len);
    let mut source = lead;
    let mut next = doc_starts.iter().zip(doc_sources).peekable();
    for t in 0..len {
        while let Some((_, &s)) = next.next_if(|(start, _)| **start as usize <= t) {
            source = s;
        }
        out.push(source);
    }
    out
}

/// flash-attention style cumulative sequence lengths over a row's real inputs: `[0, s1, …, end]`,
/// each `s` a document start inside the first `seq_len` tokens, `end` the inputs before the
/// padding (`min(real_tokens, seq_len)`; `seq_len` without padding).
pub fn cu_seqlens(doc_starts: &[u32], real_tokens: u32, seq_len: u32) -> Vec<u32> {
    let end = real_tokens.min(seq_len);
    let mut cu = vec![0];
    cu.extend(doc_starts.iter().copied().filter(|&s| s > 0 && s < end));
    cu.push(end);
    cu
}

/// Position ids over a row's `seq_len` inputs from its [`cu_seqlens`]: restarting at 0 at each
/// document start, and 0 on padding.
pub fn position_ids(cu_seqlens: &[u32], seq_len: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = cu_seqlens.windows(2).flat_map(|w| 0..w[1] - w[0]).collect();
    ids.resize(seq_len as usize, 0);
    ids
}

/// A row's labels as a loss takes them: label `i` is token `i + 1`, or `ignore_index` where that
/// is padding (at or after `real_tokens`).
pub fn masked_labels(row: TokenSlice<'_>, real_tokens: u32, ignore_index: i64) -> Vec<i64> {
    (1..row.len())
        .map(|t| match t < real_tokens as usize {
            true => i64::from(row.get(t).unwrap_or_default()),
            false => ignore_index,
        })
        .collect()
}

/// Tokens per source over rows' token sources, as `(source, tokens)` sorted by source.
pub fn source_token_counts<'a>(rows: impl IntoIterator<Item = &'a [u16]>) -> Vec<(u16, u64)> {
    let mut counts = std::collections::BTreeMap::new();
    for row in rows {
        for &s in row {
            *counts.entry(s).or_insert(0u64) += 1;
        }
    }
    counts.into_iter().collect()
}

/// One rank's rows for one step, borrowed from the memory map.
#[derive(Debug)]
pub struct Batch<'a> {
    pub step: u64,
    pub rank: u32,
    pub rows: Vec<Window<'a>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_sources_follow_the_starts_from_the_lead() {
        assert_eq!(
            token_sources(6, &[0, 2, 5], &[3, 1, 4], 9),
            [3, 3, 1, 1, 1, 4]
        );
        assert_eq!(token_sources(4, &[2], &[1], 9), [9, 9, 1, 1]);
        assert_eq!(token_sources(3, &[], &[], 2), [2, 2, 2]);
        assert_eq!(
            token_sources(2, &[1, 5], &[7, 8], 0),
            [0, 7],
            "starts past len are ignored"
        );
        let rows = [
            token_sources(4, &[2], &[1], 9),
            token_sources(3, &[], &[], 1),
        ];
        assert_eq!(
            source_token_counts(rows.iter().map(Vec::as_slice)),
            [(1, 5), (9, 2)]
        );
    }

    #[test]
    fn ranks_tile_the_global_batch() {
        let layout = BatchLayout {
            world_size: 4,
            micro_batch: 2,
        };
        let all: Vec<u64> = (0..4).flat_map(|r| layout.windows(3, r)).collect();
        assert_eq!(all, (24..32).collect::<Vec<_>>());
        assert_eq!(layout.num_steps(31), 3);
        assert_eq!(layout.num_steps(32), 4);
    }
}
