//! The fast path's piece cache: a piece's bytes → its ids, one per tokenizer thread, of fixed size
//! ([`CACHE_BYTES`] per thread, allocated on the thread's first document, never grown).
//!
//! Most pieces of a text are words met before (" the", "\n", "    return"), and a hit skips the
//! merge loop. Pieces of at most [`SHORT_KEY`] bytes (nearly all of them) are keyed by one
//! 128-bit number ([`short_key`]: the bytes and the length, read from the text in one load where
//! it can be) and kept with up to [`SHORT_IDS`] ids in 32-byte slots, two to a 64-byte bucket:
//! a lookup is one hash and one cache line, a new piece takes its bucket's first slot and moves
//! the one there to the second, and a hit in the second slot moves it back to the first, so a
//! bucket keeps the two pieces it saw most recently. Longer pieces (up to [`MAX_KEY`] bytes and
//! [`MAX_IDS`] ids) have a direct-mapped table of 64-byte slots. Longer ones still (up to
//! [`LONG_KEY`] bytes), pieces of 16 to 32 bytes with more ids than a 64-byte slot holds, and
//! short pieces of more than [`SHORT_IDS`] ids (up to [`LONG_IDS`]; their short slot says where
//! they are) have a small direct-mapped table of their own: in code they are mostly comment
//! rules ("////…", "# ----…", "=====\n\n") and indentation met again and again ("\n" and seven
//! spaces are eight GPT-2 tokens), and a miss costs the merge loop. Pieces past that are not
//! cached (rare). The ids never depend on the cache: it only holds what the merge loop gave for
//! the same bytes, for the one engine that owns it (a thread that switches engines clears it
//! first).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::prefetch::prefetch;

/// Longest piece of the short table, in bytes (the 16th byte of its key holds the length).
pub(crate) const SHORT_KEY: usize = 15;
/// Most ids of a piece in the short table.
pub(crate) const SHORT_IDS: usize = 4;
/// log2 of the short table's buckets (two slots each).
const SHORT_BITS: u32 = 14;
/// Longest piece cached, in bytes.
pub(crate) const MAX_KEY: usize = 32;
/// Most ids of a piece in the long table.
pub(crate) const MAX_IDS: usize = 7;
const SLOT_BITS: u32 = 14;
/// Longest piece cached at all, in bytes.
pub(crate) const LONG_KEY: usize = 128;
/// Most ids of a cached piece.
pub(crate) const LONG_IDS: usize = 32;
/// log2 of the slots of the table for the longest pieces and those of many ids.
const LONG_BITS: u32 = 10;
/// Memory of one thread's cache: 16,384 buckets of two 32-byte short slots (1 MiB), 16,384
/// long slots of 64 bytes (1 MiB), and 1,024 slots of 264 bytes for the longest pieces (264 KiB).
pub(crate) const CACHE_BYTES: usize = (1 << SHORT_BITS) * std::mem::size_of::<Bucket>()
    + (1 << SLOT_BITS) * std::mem::size_of::<Slot>()
    + (1 << LONG_BITS) * std::mem::size_of::<LongSlot>();

/// The bits of a short key's top byte that hold its id count (its low bits hold the length).
const COUNT_SHIFT: u32 = 124;
const COUNT_BITS: u128 = 0xF << COUNT_SHIFT;
/// The id count of a short slot whose piece has more than [`SHORT_IDS`] ids: they are in the
/// table for the longest pieces.
const OVERFLOW: u128 = 0xF;

/// A short key's piece: its bytes (the first `len` of the 16) and `len`.
#[inline]
fn short_bytes(key: u128) -> ([u8; 16], usize) {
    (key.to_le_bytes(), ((key >> 120) & 0xF) as usize)
}

/// A piece of 1 to [`SHORT_KEY`] bytes as one number: its bytes little-endian, zero above them,
/// and its length in the top byte (so no piece's key is 0, the free slots' key).
#[inline]
pub(crate) fn short_key(piece: &[u8]) -> u128 {
    let mut word = [0u8; 16];
    word[..piece.len()].copy_from_slice(piece);
    u128::from_le_bytes(word) | ((piece.len() as u128) << 120)
}

/// The mask that keeps a key's first `len` bytes, by `len` (a table: a variable shift of a u128
/// is a branchy sequence).
const KEEP: [u128; 16] = {
    let mut keep = [0u128; 16];
    let mut len = 1;
    while len < 16 {
        keep[len] = (1u128 << (8 * len)) - 1;
        len += 1;
    }
    keep
};

/// [`short_key`] of `text[start..end]` (at most [`SHORT_KEY`] bytes): one 16-byte load of the
/// text, masked to the piece, where 16 bytes follow `start`.
#[inline]
pub(crate) fn short_key_at(text: &[u8], start: usize, end: usize) -> u128 {
    let len = end - start;
    match text.get(start..start + 16) {
        Some(window) => {
            let mut word = [0u8; 16];
            word.copy_from_slice(window);
            (u128::from_le_bytes(word) & KEEP[len]) | ((len as u128) << 120)
        }
        None => short_key(&text[start..end]),
    }
}

/// The hash of a short key, shared by the piece cache and the whole-token table
/// ([`super::whole_tokens`]), which take different bits of it.
#[inline]
pub(crate) fn short_hash(key: u128) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let (lo, hi) = (key as u64, (key >> 64) as u64);
    (lo.wrapping_mul(K).rotate_left(29) ^ hi).wrapping_mul(K)
}

/// A short piece: its key (the id count in bits 124..128) and ids.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct ShortSlot {
    key: u128,
    ids: [u32; SHORT_IDS],
}

const SHORT_EMPTY: ShortSlot = ShortSlot {
    key: 0,
    ids: [0; SHORT_IDS],
};

/// Two short slots in one cache line: the most recently seen first.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket([ShortSlot; 2]);

const BUCKET_EMPTY: Bucket = Bucket([SHORT_EMPTY; 2]);

/// A piece and its ids in a direct-mapped table: the piece's bytes zero past its length
/// (compared whole), and length 0 for an empty entry (empty pieces are never cached).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Entry<const KEY: usize, const IDS: usize> {
    key: [u8; KEY],
    ids: [u32; IDS],
    key_len: u8,
    ids_len: u8,
}

impl<const KEY: usize, const IDS: usize> Entry<KEY, IDS> {
    const EMPTY: Self = Self {
        key: [0; KEY],
        ids: [0; IDS],
        key_len: 0,
        ids_len: 0,
    };

    /// The ids kept for the piece whose bytes, zero-padded, are `padded` and `len` long.
    #[inline]
    fn ids(&self, padded: &[u8; KEY], len: usize) -> Option<&[u32]> {
        (usize::from(self.key_len) == len && self.key == *padded)
            .then(|| &self.ids[..usize::from(self.ids_len)])
    }

    /// Keep `ids` for that piece (the caller checked both lengths).
    #[inline]
    fn set(&mut self, padded: [u8; KEY], len: usize, ids: &[u32]) {
        self.key_len = len as u8;
        self.key = padded;
        self.ids_len = ids.len() as u8;
        self.ids[..ids.len()].copy_from_slice(ids);
    }
}

/// A piece of up to [`MAX_KEY`] bytes and [`MAX_IDS`] ids: one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Slot(Entry<MAX_KEY, MAX_IDS>);

const EMPTY: Slot = Slot(Entry::EMPTY);

/// A piece too long, or of too many ids, for [`Slot`].
type LongSlot = Entry<LONG_KEY, LONG_IDS>;

/// One thread's cache and the scratch space its engine merges in.
pub(crate) struct PieceCache {
    owner: u64,
    short: Box<[Bucket]>,
    slots: Box<[Slot]>,
    long: Box<[LongSlot]>,
    /// Symbols of the piece being merged (reused: no allocation per piece).
    pub symbols: Vec<u32>,
    /// The pieces a scanner cut a text into, before they are encoded (scratch, reused).
    pub pieces: Vec<(usize, usize)>,
    /// A piece's key where it is not a slice of the text (reused likewise).
    pub key: Vec<u8>,
}

/// A distinct number per engine built in this process, naming a cache's owner.
pub(crate) fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    static CACHE: RefCell<Option<PieceCache>> = const { RefCell::new(None) };
}

/// Run `f` with this thread's cache, emptied first if another engine filled it.
pub(crate) fn with_cache<R>(owner: u64, f: impl FnOnce(&mut PieceCache) -> R) -> R {
    CACHE.with(|cell| {
        // A re-entrant call (none exists) would get a private cache rather than a panic.
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return f(&mut PieceCache::new(owner));
        };
        let cache = slot.get_or_insert_with(|| PieceCache::new(owner));
        if cache.owner != owner {
            cache.slots.fill(EMPTY);
            cache.short.fill(BUCKET_EMPTY);
            cache.long.fill(LongSlot::EMPTY);
            cache.owner = owner;
        }
        f(cache)
    })
}

/// `key` zero-padded to `N` bytes (the caller checked its length).
#[inline]
fn padded<const N: usize>(key: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out[..key.len()].copy_from_slice(key);
    out
}

#[inline]
fn slot_of(padded: &[u8; MAX_KEY], len: usize) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (len as u64).wrapping_mul(K);
    for chunk in padded.chunks_exact(8).take(len.div_ceil(8)) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    (h >> (64 - SLOT_BITS)) as usize
}

/// The slot of a piece in the table for the longest pieces.
#[inline]
fn long_slot_of(key: &[u8]) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (key.len() as u64).wrapping_mul(K);
    let mut chunks = key.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(23) ^ u64::from(b)).wrapping_mul(K);
    }
    (h >> (64 - LONG_BITS)) as usize
}

/// The ids of a short piece of more than [`SHORT_IDS`] ids, kept in `long`, the table for the
/// longest pieces (`None` if another piece took its slot there).
#[cold]
#[inline(never)]
fn get_many(long: &[LongSlot], key: u128) -> Option<&[u32]> {
    let (bytes, len) = short_bytes(key);
    long[long_slot_of(&bytes[..len])].ids(&padded(&bytes[..len]), len)
}

impl PieceCache {
    fn new(owner: u64) -> Self {
        Self {
            owner,
            short: vec![BUCKET_EMPTY; 1 << SHORT_BITS].into_boxed_slice(),
            slots: vec![EMPTY; 1 << SLOT_BITS].into_boxed_slice(),
            long: vec![LongSlot::EMPTY; 1 << LONG_BITS].into_boxed_slice(),
            symbols: Vec::new(),
            pieces: Vec::new(),
            key: Vec::new(),
        }
    }

    /// Start loading the bucket of the short piece of hash `hash` ([`short_hash`]), which
    /// [`Self::get_short`] will read soon.
    #[inline]
    pub fn prefetch_short(&self, hash: u64) {
        prefetch(&self.short[(hash >> (64 - SHORT_BITS)) as usize]);
    }

    /// The ids cached for the short piece `key` ([`short_key`]) of hash `hash` ([`short_hash`]).
    #[inline]
    pub fn get_short(&mut self, key: u128, hash: u64) -> Option<&[u32]> {
        let bucket = &mut self.short[(hash >> (64 - SHORT_BITS)) as usize];
        let count = |slot: &ShortSlot| (slot.key >> COUNT_SHIFT) as usize;
        if bucket.0[0].key & !COUNT_BITS == key {
            let slot = &bucket.0[0];
            if count(slot) <= SHORT_IDS {
                return Some(&slot.ids[..count(slot)]);
            }
            return get_many(&self.long, key);
        }
        if bucket.0[1].key & !COUNT_BITS == key {
            bucket.0.swap(0, 1);
            let slot = &bucket.0[0];
            if count(slot) <= SHORT_IDS {
                return Some(&slot.ids[..count(slot)]);
            }
            return get_many(&self.long, key);
        }
        None
    }

    /// Remember `ids` for the short piece `key` (nothing happens past [`LONG_IDS`] ids). A piece
    /// of more than [`SHORT_IDS`] ids (a run of spaces in code, where every space is a token of
    /// its own: "\n" and seven spaces are eight GPT-2 tokens) is kept in the table for the
    /// longest pieces, its bucket's slot marked [`OVERFLOW`].
    #[inline]
    pub fn insert_short(&mut self, key: u128, hash: u64, ids: &[u32]) {
        if ids.len() > SHORT_IDS {
            self.insert_many(key, hash, ids);
            return;
        }
        let bucket = &mut self.short[(hash >> (64 - SHORT_BITS)) as usize];
        bucket.0[1] = bucket.0[0];
        let slot = &mut bucket.0[0];
        slot.key = key | ((ids.len() as u128) << COUNT_SHIFT);
        slot.ids[..ids.len()].copy_from_slice(ids);
    }

    /// [`Self::insert_short`] for a piece of more than [`SHORT_IDS`] ids.
    #[cold]
    #[inline(never)]
    fn insert_many(&mut self, key: u128, hash: u64, ids: &[u32]) {
        if ids.len() > LONG_IDS {
            return;
        }
        let (bytes, len) = short_bytes(key);
        self.long[long_slot_of(&bytes[..len])].set(padded(&bytes[..len]), len, ids);
        let bucket = &mut self.short[(hash >> (64 - SHORT_BITS)) as usize];
        // A piece whose entry in the long table was taken is still marked first in its bucket
        // (the lookup that missed moved it there): mark it again rather than twice.
        if bucket.0[0].key & !COUNT_BITS != key {
            bucket.0[1] = bucket.0[0];
        }
        bucket.0[0].key = key | (OVERFLOW << COUNT_SHIFT);
    }

    /// The ids cached for `key`.
    #[inline]
    pub fn get(&mut self, key: &[u8]) -> Option<&[u32]> {
        if key.is_empty() || key.len() > LONG_KEY {
            return None;
        }
        if key.len() <= SHORT_KEY {
            let wanted = short_key(key);
            return self.get_short(wanted, short_hash(wanted));
        }
        if key.len() <= MAX_KEY {
            let padded = padded(key);
            let found = self.slots[slot_of(&padded, key.len())]
                .0
                .ids(&padded, key.len());
            if found.is_some() {
                return found;
            }
        }
        self.long[long_slot_of(key)].ids(&padded(key), key.len())
    }

    /// Remember `ids` for `key` (nothing happens for pieces too long to cache, or of too many
    /// ids).
    #[inline]
    pub fn insert(&mut self, key: &[u8], ids: &[u32]) {
        if key.is_empty() || key.len() > LONG_KEY || ids.len() > LONG_IDS {
            return;
        }
        if key.len() <= SHORT_KEY {
            let wanted = short_key(key);
            self.insert_short(wanted, short_hash(wanted), ids);
            return;
        }
        if key.len() <= MAX_KEY && ids.len() <= MAX_IDS {
            let padded = padded(key);
            self.slots[slot_of(&padded, key.len())]
                .0
                .set(padded, key.len(), ids);
            return;
        }
        self.long[long_slot_of(key)].set(padded(key), key.len(), ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fit_their_lines_and_the_cap_is_2_mib_and_264_kib() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::size_of::<ShortSlot>(), 32);
        assert_eq!(std::mem::size_of::<LongSlot>(), 264);
        assert_eq!(CACHE_BYTES, (2 << 20) + (264 << 10));
    }

    #[test]
    fn hits_misses_and_limits() {
        let mut cache = PieceCache::new(1);
        assert_eq!(cache.get(b" the"), None);
        cache.insert(b" the", &[262]);
        assert_eq!(cache.get(b" the"), Some(&[262][..]));
        assert_eq!(cache.get(b" thE"), None);
        cache.insert(b"", &[1]);
        assert_eq!(cache.get(b""), None);
        // Past MAX_KEY bytes or MAX_IDS ids, the table of the longest pieces: up to LONG_KEY
        // bytes and LONG_IDS ids.
        let long = [b'x'; MAX_KEY + 1];
        cache.insert(&long, &[1]);
        assert_eq!(cache.get(&long), Some(&[1][..]));
        let longest = [b'/'; LONG_KEY];
        cache.insert(&longest, &[3; LONG_IDS]);
        assert_eq!(cache.get(&longest), Some(&[3; LONG_IDS][..]));
        assert_eq!(
            cache.get(&longest[..LONG_KEY - 1]),
            None,
            "length is part of the key"
        );
        let too_long = [b'/'; LONG_KEY + 1];
        cache.insert(&too_long, &[1]);
        assert_eq!(cache.get(&too_long), None);
        let base64 = b"/IEphISBCZWloZXJodW";
        cache.insert(base64, &[5; MAX_IDS + 1]);
        assert_eq!(cache.get(base64), Some(&[5; MAX_IDS + 1][..]));
        cache.insert(b"seventeen bytes..", &[1; LONG_IDS + 1]);
        assert_eq!(cache.get(b"seventeen bytes.."), None);
        cache.insert(b"many", &[1; MAX_IDS + 1]);
        assert_eq!(cache.get(b"many"), Some(&[1; MAX_IDS + 1][..]));
        cache.insert(b"seventeen bytes!!", &[7; MAX_IDS]);
        assert_eq!(cache.get(b"seventeen bytes!!"), Some(&[7; MAX_IDS][..]));
        cache.insert(b"sixteen bytes!!!", &[4]);
        assert_eq!(cache.get(b"sixteen bytes!!!"), Some(&[4][..]));
        // Short pieces: up to SHORT_IDS ids, the length part of the key.
        cache.insert(b"seven!!", &[1, 2, 3, 4]);
        cache.insert(b"seven!!\0", &[5]);
        assert_eq!(cache.get(b"seven!!\0"), Some(&[5][..]));
        assert_eq!(
            cache.get(b"seven!!"),
            Some(&[1, 2, 3, 4][..]),
            "length is part of the key"
        );
        // Short pieces of more ids: kept with the longest pieces, up to LONG_IDS.
        cache.insert(b"five ids", &[1, 2, 3, 4, 5]);
        assert_eq!(cache.get(b"five ids"), Some(&[1, 2, 3, 4, 5][..]));
        let spaces = b"\n              ";
        let ids: Vec<u32> = (0..15).collect();
        cache.insert(spaces, &ids);
        assert_eq!(cache.get(spaces), Some(&ids[..]));
        assert_eq!(cache.get(&spaces[..14]), None, "length is part of the key");
        cache.insert(b"too many", &[1; LONG_IDS + 1]);
        assert_eq!(cache.get(b"too many"), None);
        cache.insert(b"fifteen bytes!!", &[9, 8]);
        assert_eq!(cache.get(b"fifteen bytes!!"), Some(&[9, 8][..]));
    }

    /// The key read from the text in one load equals the key built from the piece's bytes,
    /// wherever the piece lies (near the end of the text it is built from the bytes).
    #[test]
    fn keys_read_from_the_text_are_the_pieces_keys() {
        let text = b"a text of some forty-one bytes, at least!";
        for start in 0..text.len() {
            for end in start + 1..=(start + SHORT_KEY).min(text.len()) {
                assert_eq!(
                    short_key_at(text, start, end),
                    short_key(&text[start..end]),
                    "{start}..{end}"
                );
            }
        }
        assert_ne!(short_key(b"ab"), short_key(b"ab\0"));
    }

    /// A bucket keeps the two pieces it saw most recently, a hit counting as seen.
    #[test]
    fn a_bucket_keeps_its_two_most_recent_pieces() {
        let mut cache = PieceCache::new(1);
        // Three keys of one bucket.
        let bucket = |key: u128| short_hash(key) >> (64 - SHORT_BITS);
        let first = short_key(b"k0");
        let same: Vec<u128> = (1u32..)
            .map(|i| short_key(format!("k{i}").as_bytes()))
            .filter(|&key| bucket(key) == bucket(first))
            .take(2)
            .collect();
        let (a, b, c) = (first, same[0], same[1]);
        cache.insert_short(a, short_hash(a), &[1]);
        cache.insert_short(b, short_hash(b), &[2]);
        assert_eq!(cache.get_short(a, short_hash(a)), Some(&[1][..]));
        // `a` was seen last: a third piece evicts `b`.
        cache.insert_short(c, short_hash(c), &[3]);
        assert_eq!(cache.get_short(b, short_hash(b)), None);
        assert_eq!(cache.get_short(a, short_hash(a)), Some(&[1][..]));
        assert_eq!(cache.get_short(c, short_hash(c)), Some(&[3][..]));
    }

    /// A short piece of many ids whose entry in the table for the longest pieces was taken by
    /// another piece is a miss, never that piece's ids.
    #[test]
    fn a_short_piece_of_many_ids_evicted_from_the_long_table_is_a_miss() {
        let mut cache = PieceCache::new(1);
        let spaces = b"\n       ";
        cache.insert(spaces, &[198, 220, 220, 220, 220, 220, 220, 220]);
        let rival = (0u32..)
            .map(|i| format!("{i:0>40}"))
            .find(|rule| long_slot_of(rule.as_bytes()) == long_slot_of(spaces))
            .expect("some rule shares the slot");
        cache.insert(rival.as_bytes(), &[7; 10]);
        assert_eq!(cache.get(spaces), None);
        assert_eq!(cache.get(rival.as_bytes()), Some(&[7; 10][..]));
        cache.insert(spaces, &[1, 2, 3, 4, 5]);
        assert_eq!(cache.get(spaces), Some(&[1, 2, 3, 4, 5][..]));
        // Marked again, not twice: the bucket's other slot is not taken by a second mark.
        let bucket = &cache.short[(short_hash(short_key(spaces)) >> (64 - SHORT_BITS)) as usize];
        assert_ne!(bucket.0[0].key & !COUNT_BITS, bucket.0[1].key & !COUNT_BITS);
    }

    #[test]
    fn another_owner_starts_empty() {
        let rule = [b'='; 60];
        for key in [&b"word"[..], &b"a word of 20 bytes.."[..], &rule[..]] {
            with_cache(u64::MAX - 1, |c| c.insert(key, &[5]));
            assert_eq!(
                with_cache(u64::MAX - 1, |c| c.get(key).map(<[u32]>::to_vec)),
                Some(vec![5])
            );
            assert_eq!(
                with_cache(u64::MAX - 2, |c| c.get(key).map(<[u32]>::to_vec)),
                None
            );
        }
    }
}
