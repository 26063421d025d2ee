//! HF's BPE merge loop, exactly: the merge table (pair of ids → rank, merged id) read from HF's
//! own model, and the loop that merges a word's symbols. Both engines of the fast path (byte-level
//! and SentencePiece-style) run their pieces through it, so their ids are HF's by construction,
//! not by a proof about another library's loop.
//!
//! HF's `Word::merge_all` pops the pair with the lowest rank from a heap, leftmost (by the left
//! symbol's first position) on a tie, skips entries whose pair has changed since they were pushed,
//! and pushes the merged symbol's new pairs. A stale entry can only pass its check if the pair now
//! at its position makes the same token, and the span starting there only grows, so such a pair
//! is the same pair: the loop is "merge the lowest-ranked adjacent pair, leftmost first, until none
//! is in the table". [`Merges::merge`] runs exactly that: a scan over the symbols for short words
//! (most pieces), and the same heap-and-links loop as HF's for long ones.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// Words with more symbols than this are merged with a heap (O(n log n)); shorter ones by a scan
/// for the lowest pair (O(n²), but no allocation and a few cache lines).
const SCAN_LIMIT: usize = 48;

/// The merge table: `(left, right)` ids → `(rank, merged id)`, as HF's `BPE::merges` holds it.
pub(crate) struct Merges {
    table: FxHashMap<u64, u64>,
}

fn key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl Merges {
    /// From the merge list in rank order, each pair and the token it makes, as ids.
    pub fn new(merges: impl IntoIterator<Item = (u32, u32, u32)>) -> Self {
        let mut table = FxHashMap::default();
        for (rank, (left, right, merged)) in merges.into_iter().enumerate() {
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            // HF keeps the first rank of a pair listed twice (its serializer wrote that one).
            table
                .entry(key(left, right))
                .or_insert((u64::from(rank) << 32) | u64::from(merged));
        }
        Self { table }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// `(rank, merged id)` of a pair, if it is a merge.
    #[inline]
    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.table
            .get(&key(left, right))
            .map(|&v| ((v >> 32) as u32, v as u32))
    }

    /// Merge `symbols` (a word's initial ids) in place, as HF's merge loop does.
    pub fn merge(&self, symbols: &mut Vec<u32>) {
        if symbols.len() <= SCAN_LIMIT {
            self.merge_by_scan(symbols);
        } else {
            self.merge_by_heap(symbols);
        }
    }

    fn merge_by_scan(&self, symbols: &mut Vec<u32>) {
        // Per pair (i, i+1): its rank above its merged id, u64::MAX where it is not a merge. The
        // smallest is the lowest rank; equal values are the same pair, and the scan keeps the
        // leftmost. Symbols and pairs shift left by hand: at these lengths a loop beats memmove.
        let mut pairs = [u64::MAX; SCAN_LIMIT];
        let pair = |symbols: &[u32], i: usize| {
            self.table
                .get(&key(symbols[i], symbols[i + 1]))
                .copied()
                .unwrap_or(u64::MAX)
        };
        let mut n = symbols.len();
        for (i, slot) in pairs.iter_mut().enumerate().take(n.saturating_sub(1)) {
            *slot = pair(symbols, i);
        }
        while n >= 2 {
            let mut best = 0;
            for i in 1..n - 1 {
                if pairs[i] < pairs[best] {
                    best = i;
                }
            }
            if pairs[best] == u64::MAX {
                break;
            }
            symbols[best] = pairs[best] as u32;
            for j in best + 1..n - 1 {
                symbols[j] = symbols[j + 1];
                pairs[j] = pairs[j + 1];
            }
            n -= 1;
            pairs[n - 1] = u64::MAX;
            if best + 1 < n {
                pairs[best] = pair(symbols, best);
            } else {
                pairs[best] = u64::MAX;
            }
            if best > 0 {
                pairs[best - 1] = pair(symbols, best - 1);
            }
        }
        symbols.truncate(n);
    }

    /// HF's loop: a min-heap of (rank, position), symbols linked both ways, stale entries skipped.
    fn merge_by_heap(&self, symbols: &mut Vec<u32>) {
        const NONE: usize = usize::MAX;
        let n = symbols.len();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i < n { i } else { NONE }).collect();
        let mut alive = vec![true; n];
        let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some((rank, merged)) = self.get(symbols[i], symbols[i + 1]) {
                heap.push(Reverse((rank, i, merged)));
            }
        }
        while let Some(Reverse((_, at, merged))) = heap.pop() {
            let right = next[at];
            if !alive[at] || right == NONE {
                continue;
            }
            // Stale: the pair at `at` changed since this entry was pushed.
            if self
                .get(symbols[at], symbols[right])
                .is_none_or(|(_, now)| now != merged)
            {
                continue;
            }
            symbols[at] = merged;
            alive[right] = false;
            let after = next[right];
            next[at] = after;
            if after != NONE {
                prev[after] = at;
            }
            let before = prev[at];
            if before != NONE
                && let Some((rank, made)) = self.get(symbols[before], symbols[at])
            {
                heap.push(Reverse((rank, before, made)));
            }
            if after != NONE
                && let Some((rank, made)) = self.get(symbols[at], symbols[after])
            {
                heap.push(Reverse((rank, at, made)));
            }
        }
        let mut kept = 0;
        for i in 0..n {
            if alive[i] {
                symbols[kept] = symbols[i];
                kept += 1;
            }
        }
        symbols.truncate(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A toy vocabulary over ids 0..4 ("a".."d") with overlapping merges of equal and crossing
    /// ranks, to drive both loops through ties and re-merges.
    fn toy() -> Merges {
        Merges::new([
            (0, 1, 10),  // a b -> ab
            (1, 1, 11),  // b b -> bb
            (10, 2, 12), // ab c -> abc
            (2, 3, 13),  // c d -> cd
            (11, 1, 14), // bb b -> bbb
            (0, 0, 15),  // a a -> aa
            (15, 0, 16), // aa a -> aaa
            (12, 13, 17),
            (3, 3, 18),
            (18, 18, 19),
        ])
    }

    /// The definition: merge the lowest-ranked adjacent pair, leftmost first.
    fn reference(merges: &Merges, mut symbols: Vec<u32>) -> Vec<u32> {
        loop {
            let best = (0..symbols.len().saturating_sub(1))
                .filter_map(|i| {
                    merges
                        .get(symbols[i], symbols[i + 1])
                        .map(|m| (m.0, i, m.1))
                })
                .min();
            let Some((_, i, made)) = best else {
                return symbols;
            };
            symbols[i] = made;
            symbols.remove(i + 1);
        }
    }

    #[test]
    fn known_words() {
        let m = toy();
        let run = |s: &[u32]| {
            let mut v = s.to_vec();
            m.merge(&mut v);
            v
        };
        assert_eq!(run(&[0, 1, 2]), [12]);
        assert_eq!(run(&[1, 1, 1]), [14]);
        assert_eq!(run(&[0, 0, 0, 0]), [15, 15]);
        assert_eq!(run(&[0, 0, 0]), [16]);
        assert_eq!(run(&[0, 1, 2, 2, 3]), [17]);
        assert_eq!(run(&[0, 1, 2, 3, 3]), [12, 18]);
        assert_eq!(run(&[]), Vec::<u32>::new());
        assert_eq!(run(&[3]), [3]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn scan_and_heap_are_the_definition(word in proptest::collection::vec(0u32..4, 0..160)) {
            let m = toy();
            let want = reference(&m, word.clone());
            let mut by_scan_or_heap = word.clone();
            m.merge(&mut by_scan_or_heap);
            prop_assert_eq!(&by_scan_or_heap, &want);
            if word.len() > 1 {
                let mut by_heap = word.clone();
                m.merge_by_heap(&mut by_heap);
                prop_assert_eq!(&by_heap, &want);
            }
            if word.len() <= SCAN_LIMIT {
                let mut by_scan = word;
                m.merge_by_scan(&mut by_scan);
                prop_assert_eq!(&by_scan, &want);
            }
        }
    }
}
