//! The pieces a BPE engine turns into one token whole, looked up before merging: one table per
//! engine, read-only, shared by every tokenizer thread.
//!
//! Which pieces, byte-level (`read/byte_vocab.rs`): under `ignore_merges` (Llama 3) every token,
//! since HF looks a piece up in the vocabulary before merging it; otherwise the tokens whose bytes HF's
//! merge loop merges back into that one token (most tokens do). SentencePiece-style
//! (`sentencepiece.rs`): the tokens whose text, as a piece, the merge loop merges back into that
//! token. Both are worked out once, when the engine's tables are learned, and kept with them in
//! the engine cache. Either way a hit is the id the merge loop would give, so the table changes
//! speed, never ids. Most pieces of text are such tokens
//! (" the", " of", "ing"), so a piece met for the first time costs a lookup here instead of the
//! merge loop.
//!
//! Pieces of at most [`SHORT_KEY`] bytes are keyed as in the piece cache ([`short_key`]) and kept
//! in an open-addressing table of 24-byte slots, at most three quarters full (Qwen3's 151,000
//! tokens: 6 MiB); longer tokens, rare, in a hash map.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::piece_cache::{SHORT_KEY, short_hash, short_key};
use super::prefetch::prefetch;
use crate::read::token_list::TokenList;

/// One token: its short key as two words ([0, 0] marks a free slot), and its id.
#[derive(Clone, Copy)]
struct Slot {
    key: [u64; 2],
    id: u32,
}

const FREE: Slot = Slot { key: [0; 2], id: 0 };

pub(crate) struct WholeTokens {
    slots: Box<[Slot]>,
    /// 64 − log2(slots).
    shift: u32,
    /// Tokens in `slots`.
    short: usize,
    long: FxHashMap<Box<[u8]>, u32>,
}

fn words(key: u128) -> [u64; 2] {
    [key as u64, (key >> 64) as u64]
}

impl WholeTokens {
    /// The table of `tokens` (each token's bytes and id; no two with the same bytes).
    pub fn new(tokens: &TokenList) -> Self {
        let short = tokens
            .iter()
            .filter(|(bytes, _)| (1..=SHORT_KEY).contains(&bytes.len()))
            .count();
        let capacity = (short * 4 / 3 + 1).next_power_of_two().max(16);
        let mut table = Self {
            slots: vec![FREE; capacity].into_boxed_slice(),
            shift: 64 - capacity.trailing_zeros(),
            short: 0,
            long: FxHashMap::default(),
        };
        // Each short token's slot is a miss in a table of megabytes: inserted as they came, one
        // miss after another, Llama 3's 128,000 took 28 ms on the path of the run's first
        // document. Now each slot is asked for when its token is keyed and filled AHEAD tokens
        // later, so the misses overlap.
        const AHEAD: usize = 16;
        let mut keyed = VecDeque::with_capacity(AHEAD);
        for (bytes, id) in tokens.iter() {
            match bytes.len() {
                0 => {}
                1..=SHORT_KEY => {
                    let key = short_key(bytes);
                    let home = table.home(short_hash(key));
                    prefetch(&table.slots[home]);
                    if keyed.len() == AHEAD
                        && let Some((key, home, id)) = keyed.pop_front()
                    {
                        table.insert_short(key, home, id);
                    }
                    keyed.push_back((key, home, id));
                }
                _ => {
                    table.long.insert(bytes.into(), id);
                }
            }
        }
        for (key, home, id) in keyed {
            table.insert_short(key, home, id);
        }
        table
    }

    /// How many tokens the table holds.
    pub fn len(&self) -> usize {
        self.short + self.long.len()
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        // The piece cache takes the hash's top bits; this table takes others.
        (hash.rotate_left(32) >> self.shift) as usize
    }

    /// Insert `key` (a short key, whose slot is `home`) as `id`.
    fn insert_short(&mut self, key: u128, home: usize, id: u32) {
        let mask = self.slots.len() - 1;
        let mut at = home;
        let key = words(key);
        while self.slots[at].key != FREE.key && self.slots[at].key != key {
            at = (at + 1) & mask;
        }
        if self.slots[at].key == FREE.key {
            self.short += 1;
        }
        self.slots[at] = Slot { key, id };
    }

    /// Start loading the slot where [`Self::get_short`] will begin looking for the piece of hash
    /// `hash` ([`short_hash`]).
    #[inline]
    pub fn prefetch_short(&self, hash: u64) {
        prefetch(&self.slots[self.home(hash)]);
    }

    /// The token of the short piece `key` ([`short_key`]) of hash `hash` ([`short_hash`]).
    #[inline]
    pub fn get_short(&self, key: u128, hash: u64) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut at = self.home(hash);
        let key = words(key);
        loop {
            let slot = self.slots[at & mask];
            if slot.key == key {
                return Some(slot.id);
            }
            if slot.key == FREE.key {
                return None;
            }
            at += 1;
        }
    }

    /// The token of a piece of any length (none for the empty piece, whose key would be a free
    /// slot's).
    pub fn get(&self, piece: &[u8]) -> Option<u32> {
        if piece.is_empty() {
            None
        } else if piece.len() <= SHORT_KEY {
            let key = short_key(piece);
            self.get_short(key, short_hash(key))
        } else {
            self.get_long(piece)
        }
    }

    /// The token of a piece longer than [`SHORT_KEY`] bytes.
    #[inline]
    pub fn get_long(&self, piece: &[u8]) -> Option<u32> {
        if self.long.is_empty() {
            return None;
        }
        self.long.get(piece).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_token_and_nothing_else() {
        let tokens: Vec<(Vec<u8>, u32)> = (0..5000u32)
            .map(|i| (format!(" w{i}").into_bytes(), i))
            .chain([(b"a sixteen-byte t".to_vec(), 9000), (b"x".to_vec(), 9001)])
            .collect();
        let table = WholeTokens::new(&tokens.iter().map(|(b, id)| (b, *id)).collect());
        assert_eq!(table.len(), tokens.len());
        let find = |piece: &[u8]| table.get(piece);
        for (bytes, id) in &tokens {
            assert_eq!(
                find(bytes),
                Some(*id),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        for miss in [
            &b" w5000"[..],
            b" w",
            b"w1",
            b"a sixteen-byte x",
            b"x\0",
            b"",
        ] {
            assert_eq!(find(miss), None, "{:?}", String::from_utf8_lossy(miss));
        }
    }
}
