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
//!
//! The loop is bound by looking pairs up, each a random access into a table of up to hundreds of
//! thousands of merges: a byte-level word's first pairs, all pairs of two bytes' tokens, come from
//! a dense 256 × 256 table instead ([`BytePairs`]), and words of up to [`SMALL`] symbols are
//! scanned without a data-dependent branch but the lookups'. (An open-addressing table of 16-byte
//! slots at most three quarters full was tried for the pairs: twice the memory of the SwissTable
//! for 50,000–60,000 merges, and 60 % more L2 misses for SentencePiece BPE.)

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// Words with more symbols than this are merged with a heap (O(n log n)); shorter ones by a scan
/// for the lowest pair (O(n²), but no allocation and a few cache lines).
const SCAN_LIMIT: usize = 48;
/// Words of at most this many symbols (most pieces that reach the loop) are scanned over
/// fixed-size arrays: the lowest pair and the shift after a merge are then the same 16 steps
/// every time, which the compiler unrolls without a branch to mispredict.
const SMALL: usize = 16;

/// A pair that is not a merge, in the packed form `rank << 32 | merged id` (above every real one).
const NO_MERGE: u64 = u64::MAX;

/// The merge table: `(left, right)` ids → `(rank, merged id)`, as HF's `BPE::merges` holds it.
pub(crate) struct Merges {
    /// `key(left, right)` → `rank << 32 | merged`.
    table: FxHashMap<u64, u64>,
}

fn key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// A merge's rank and merged id, packed as the scan compares them: the lowest rank is the least.
fn packed(rank: u32, merged: u32) -> u64 {
    (u64::from(rank) << 32) | u64::from(merged)
}

impl Merges {
    /// From the merge list in rank order, each pair and the token it makes, as ids.
    pub fn new(merges: impl IntoIterator<Item = (u32, u32, u32)>) -> Self {
        let merges = merges.into_iter();
        // Sized once: grown as it filled, the table was moved four times over (Llama 3's 280,147
        // merges), on the path of the run's first document.
        let mut table =
            FxHashMap::with_capacity_and_hasher(merges.size_hint().0, Default::default());
        for (rank, (left, right, merged)) in merges.enumerate() {
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            // HF keeps the first rank of a pair listed twice (its serializer wrote that one).
            table
                .entry(key(left, right))
                .or_insert(packed(rank, merged));
        }
        Self { table }
    }

    /// `rank << 32 | merged id` of the pair `key`, or [`NO_MERGE`].
    #[inline]
    fn lookup(&self, key: u64) -> u64 {
        self.table.get(&key).copied().unwrap_or(NO_MERGE)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// `(rank, merged id)` of a pair, if it is a merge.
    #[inline]
    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        let value = self.lookup(key(left, right));
        (value != NO_MERGE).then_some(((value >> 32) as u32, value as u32))
    }

    /// Merge `symbols` (a word's initial ids) in place, as HF's merge loop does.
    pub fn merge(&self, symbols: &mut Vec<u32>) {
        if symbols.len() <= SMALL {
            let mut pairs = self.first_pairs::<SMALL>(symbols);
            self.merge_small(symbols, &mut pairs);
        } else if symbols.len() <= SCAN_LIMIT {
            let mut pairs = self.first_pairs::<SCAN_LIMIT>(symbols);
            self.merge_by_scan(symbols, &mut pairs);
        } else {
            self.merge_by_heap(symbols);
        }
    }

    /// The packed `(rank, merged)` of each adjacent pair of `symbols` (at most `N` of them),
    /// [`NO_MERGE`] past the last.
    fn first_pairs<const N: usize>(&self, symbols: &[u32]) -> [u64; N] {
        let mut pairs = [NO_MERGE; N];
        for (slot, two) in pairs.iter_mut().zip(symbols.windows(2)) {
            *slot = self.lookup(key(two[0], two[1]));
        }
        pairs
    }

    /// Merge a byte-level word given as its bytes: `symbols` is set to the bytes' tokens
    /// (`byte_pairs.byte_ids`), then merged as [`Self::merge`] does, its first pairs read from
    /// the dense table.
    pub fn merge_bytes(&self, bytes: &[u8], byte_pairs: &BytePairs, symbols: &mut Vec<u32>) {
        symbols.clear();
        symbols.extend(bytes.iter().map(|&b| byte_pairs.byte_ids[usize::from(b)]));
        if bytes.len() <= SMALL {
            let mut pairs = [NO_MERGE; SMALL];
            for (slot, two) in pairs.iter_mut().zip(bytes.windows(2)) {
                *slot = byte_pairs.get(two[0], two[1]);
            }
            self.merge_small(symbols, &mut pairs);
            return;
        }
        if bytes.len() > SCAN_LIMIT {
            self.merge_by_heap(symbols);
            return;
        }
        let mut pairs = [NO_MERGE; SCAN_LIMIT];
        for (slot, two) in pairs.iter_mut().zip(bytes.windows(2)) {
            *slot = byte_pairs.get(two[0], two[1]);
        }
        self.merge_by_scan(symbols, &mut pairs);
    }

    /// The scan for words of at most [`SMALL`] symbols, from each adjacent pair's packed
    /// `(rank, merged)` in `pairs` ([`NO_MERGE`] past the last pair).
    fn merge_small(&self, symbols: &mut Vec<u32>, pairs: &mut [u64; SMALL]) {
        let mut n = symbols.len();
        let mut word = [0u32; SMALL];
        word[..n].copy_from_slice(symbols);
        loop {
            let low = pairs.iter().copied().fold(NO_MERGE, u64::min);
            if low == NO_MERGE {
                break;
            }
            // The leftmost pair of the lowest rank (equal values are the same pair).
            let best = pairs.iter().position(|&p| p == low).unwrap_or(0);
            word[best] = low as u32;
            // Drop symbol best + 1 and pair best + 1: everything after them moves down one.
            for j in 1..SMALL - 1 {
                let moved = j > best;
                word[j] = if moved { word[j + 1] } else { word[j] };
                pairs[j] = if moved { pairs[j + 1] } else { pairs[j] };
            }
            word[SMALL - 1] = 0;
            pairs[SMALL - 1] = NO_MERGE;
            n -= 1;
            pairs[best] = if best + 1 < n {
                self.lookup(key(word[best], word[best + 1]))
            } else {
                NO_MERGE
            };
            if best > 0 {
                pairs[best - 1] = self.lookup(key(word[best - 1], word[best]));
            }
        }
        symbols.clear();
        symbols.extend_from_slice(&word[..n]);
    }

    /// The scan, from each adjacent pair's packed `(rank, merged)` in `pairs` ([`NO_MERGE`] where
    /// the pair is not a merge).
    fn merge_by_scan(&self, symbols: &mut Vec<u32>, pairs: &mut [u64; SCAN_LIMIT]) {
        // The smallest packed value is the lowest rank; equal values are the same pair, and the
        // scan keeps the leftmost. Symbols and pairs shift left by hand: at these lengths a loop
        // beats memmove.
        let pair = |symbols: &[u32], i: usize| self.lookup(key(symbols[i], symbols[i + 1]));
        let mut n = symbols.len();
        while n >= 2 {
            let mut best = 0;
            for i in 1..n - 1 {
                if pairs[i] < pairs[best] {
                    best = i;
                }
            }
            if pairs[best] == NO_MERGE {
                break;
            }
            symbols[best] = pairs[best] as u32;
            for j in best + 1..n - 1 {
                symbols[j] = symbols[j + 1];
                pairs[j] = pairs[j + 1];
            }
            n -= 1;
            pairs[n - 1] = NO_MERGE;
            if best + 1 < n {
                pairs[best] = pair(symbols, best);
            } else {
                pairs[best] = NO_MERGE;
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

/// Every pair of two bytes' tokens, looked up once: a byte-level word starts as its bytes'
/// tokens, so all of its first pairs come from here (512 KiB, of which text touches a few lines).
pub(crate) struct BytePairs {
    /// The token of each byte.
    pub byte_ids: [u32; 256],
    /// `rank << 32 | merged id` of the pair (byte `a`'s token, byte `b`'s token) at `a * 256 + b`.
    pairs: Box<[u64]>,
}

impl BytePairs {
    pub fn new(merges: &Merges, byte_ids: [u32; 256]) -> Self {
        let pairs = (0..256 * 256)
            .map(|ab: usize| merges.lookup(key(byte_ids[ab >> 8], byte_ids[ab & 0xFF])))
            .collect();
        Self { byte_ids, pairs }
    }

    #[inline]
    fn get(&self, a: u8, b: u8) -> u64 {
        self.pairs[usize::from(a) << 8 | usize::from(b)]
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
            // The same word as bytes whose tokens are the word's ids (bytes 0..4 are "a".."d";
            // every other byte is a token no merge names).
            let mut byte_ids = [99u32; 256];
            byte_ids[..4].copy_from_slice(&[0, 1, 2, 3]);
            let bytes: Vec<u8> = word.iter().map(|&id| id as u8).collect();
            let mut from_bytes = vec![7; 3];
            m.merge_bytes(&bytes, &BytePairs::new(&m, byte_ids), &mut from_bytes);
            prop_assert_eq!(&from_bytes, &want);
            if word.len() <= SMALL {
                let mut small = word.clone();
                let mut pairs = m.first_pairs::<SMALL>(&small);
                m.merge_small(&mut small, &mut pairs);
                prop_assert_eq!(&small, &want);
            }
            if word.len() <= SCAN_LIMIT {
                let mut by_scan = word;
                let mut pairs = m.first_pairs::<SCAN_LIMIT>(&by_scan);
                m.merge_by_scan(&mut by_scan, &mut pairs);
                prop_assert_eq!(&by_scan, &want);
            }
        }
    }
}
