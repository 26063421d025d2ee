//! The fast path's piece cache: a piece's bytes → its ids, one per tokenizer thread, of fixed size
//! ([`CACHE_BYTES`] per thread, allocated on the thread's first document, never grown).
//!
//! Most pieces of a text are words met before (" the", "\n", "    return"), and a hit skips the
//! merge loop. The cache is direct-mapped: a piece hashes to one slot holding its bytes and ids
//! inline, so a lookup is one hash and one cache line, and a new piece simply replaces what was
//! in its slot. Three tables by piece length, each with slots just large enough for its pieces,
//! so that the whole cache (2.25 MiB) stays in a core's L2 beside everything else: short pieces
//! (at most [`SHORT_KEY`] bytes and [`SHORT_IDS`] ids: most of the pieces of prose) in 16-byte
//! slots, medium ones (at most [`MEDIUM_KEY`] bytes and [`MEDIUM_IDS`] ids) in 32-byte slots,
//! the rest in 64-byte slots. Pieces longer than [`MAX_KEY`] bytes, or of more ids than their
//! table holds, are not cached (they are rare and cheap to miss). The ids never depend on the cache: it only holds
//! what the merge loop gave for the same bytes, for the one engine that owns it (a thread that
//! switches engines clears it first).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest piece cached, in bytes.
pub(crate) const MAX_KEY: usize = 32;
/// Most ids a cached piece may have.
pub(crate) const MAX_IDS: usize = 7;
const SLOT_BITS: u32 = 14;
/// Longest piece of the short table, in bytes.
pub(crate) const SHORT_KEY: usize = 6;
/// Most ids of a piece in the short table.
pub(crate) const SHORT_IDS: usize = 2;
const SHORT_BITS: u32 = 14;
/// Longest piece of the medium table, in bytes.
pub(crate) const MEDIUM_KEY: usize = 16;
/// Most ids of a piece in the medium table.
pub(crate) const MEDIUM_IDS: usize = 3;
const MEDIUM_BITS: u32 = 15;
/// Memory of one thread's cache: 16,384 short slots of 16 bytes (256 KiB), 32,768 medium slots
/// of 32 bytes (1 MiB) and 16,384 slots of 64 bytes (1 MiB).
pub(crate) const CACHE_BYTES: usize = (1 << SLOT_BITS) * std::mem::size_of::<Slot>()
    + (1 << SHORT_BITS) * std::mem::size_of::<ShortSlot>()
    + (1 << MEDIUM_BITS) * std::mem::size_of::<MediumSlot>();

/// A piece of `SHORT_KEY + 1 ..= MEDIUM_KEY` bytes: its bytes zero-padded, its ids, and its
/// length (0: empty) and id count in `meta`'s low two bytes.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct MediumSlot {
    key: [u64; 2],
    ids: [u32; MEDIUM_IDS],
    meta: u32,
}

const MEDIUM_EMPTY: MediumSlot = MediumSlot {
    key: [0; 2],
    ids: [0; MEDIUM_IDS],
    meta: 0,
};

#[inline]
fn medium_key(key: &[u8]) -> [u64; 2] {
    let mut bytes = [0u8; 16];
    bytes[..key.len()].copy_from_slice(key);
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&bytes[..8]);
    hi.copy_from_slice(&bytes[8..]);
    [u64::from_le_bytes(lo), u64::from_le_bytes(hi)]
}

#[inline]
fn medium_slot_of(key: [u64; 2], len: usize) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let h = ((key[0] ^ len as u64).wrapping_mul(K).rotate_left(23) ^ key[1]).wrapping_mul(K);
    (h >> (64 - MEDIUM_BITS)) as usize
}

/// A short piece: `key` is its bytes (little-endian), its id count at bits 48..56 and its length
/// at bits 56..64 (0: empty).
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct ShortSlot {
    key: u64,
    ids: [u32; SHORT_IDS],
}

const SHORT_EMPTY: ShortSlot = ShortSlot {
    key: 0,
    ids: [0; SHORT_IDS],
};

/// Bits of a short slot's key that hold the id count.
const SHORT_COUNT: u64 = 0xFF << 48;

/// A short piece's bytes and length as a short slot's key (id count zero).
#[inline]
fn short_key(key: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..key.len()].copy_from_slice(key);
    u64::from_le_bytes(word) | ((key.len() as u64) << 56)
}

#[inline]
fn short_slot_of(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHORT_BITS)) as usize
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Slot {
    /// The piece's bytes, zero past its length (compared whole, as four words).
    key: [u8; MAX_KEY],
    ids: [u32; MAX_IDS],
    /// 0: empty (empty pieces are never cached).
    key_len: u8,
    ids_len: u8,
}

const EMPTY: Slot = Slot {
    key: [0; MAX_KEY],
    ids: [0; MAX_IDS],
    key_len: 0,
    ids_len: 0,
};

/// One thread's cache and the scratch space its engine merges in.
pub(crate) struct PieceCache {
    owner: u64,
    slots: Box<[Slot]>,
    short: Box<[ShortSlot]>,
    medium: Box<[MediumSlot]>,
    /// Symbols of the piece being merged (reused: no allocation per piece).
    pub symbols: Vec<u32>,
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
            cache.short.fill(SHORT_EMPTY);
            cache.medium.fill(MEDIUM_EMPTY);
            cache.owner = owner;
        }
        f(cache)
    })
}

/// `key` zero-padded to [`MAX_KEY`] bytes (the caller checked its length).
#[inline]
fn padded(key: &[u8]) -> [u8; MAX_KEY] {
    let mut out = [0u8; MAX_KEY];
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

impl PieceCache {
    fn new(owner: u64) -> Self {
        Self {
            owner,
            slots: vec![EMPTY; 1 << SLOT_BITS].into_boxed_slice(),
            short: vec![SHORT_EMPTY; 1 << SHORT_BITS].into_boxed_slice(),
            medium: vec![MEDIUM_EMPTY; 1 << MEDIUM_BITS].into_boxed_slice(),
            symbols: Vec::new(),
            key: Vec::new(),
        }
    }

    /// The ids cached for `key`.
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<&[u32]> {
        if key.is_empty() || key.len() > MAX_KEY {
            return None;
        }
        if key.len() <= SHORT_KEY {
            let wanted = short_key(key);
            let slot = &self.short[short_slot_of(wanted)];
            return (slot.key & !SHORT_COUNT == wanted)
                .then(|| &slot.ids[..((slot.key & SHORT_COUNT) >> 48) as usize]);
        }
        if key.len() <= MEDIUM_KEY {
            let wanted = medium_key(key);
            let slot = &self.medium[medium_slot_of(wanted, key.len())];
            return (slot.meta & 0xFF == key.len() as u32 && slot.key == wanted)
                .then(|| &slot.ids[..(slot.meta >> 8) as usize]);
        }
        let padded = padded(key);
        let slot = &self.slots[slot_of(&padded, key.len())];
        (usize::from(slot.key_len) == key.len() && slot.key == padded)
            .then(|| &slot.ids[..usize::from(slot.ids_len)])
    }

    /// Remember `ids` for `key` (nothing happens for pieces too long to cache).
    #[inline]
    pub fn insert(&mut self, key: &[u8], ids: &[u32]) {
        if key.is_empty() || key.len() > MAX_KEY || ids.len() > MAX_IDS {
            return;
        }
        if key.len() <= SHORT_KEY {
            if ids.len() <= SHORT_IDS {
                let key = short_key(key);
                let slot = &mut self.short[short_slot_of(key)];
                slot.key = key | ((ids.len() as u64) << 48);
                slot.ids[..ids.len()].copy_from_slice(ids);
            }
            return;
        }
        if key.len() <= MEDIUM_KEY {
            if ids.len() <= MEDIUM_IDS {
                let wanted = medium_key(key);
                let slot = &mut self.medium[medium_slot_of(wanted, key.len())];
                slot.key = wanted;
                slot.meta = key.len() as u32 | ((ids.len() as u32) << 8);
                slot.ids[..ids.len()].copy_from_slice(ids);
            }
            return;
        }
        let padded = padded(key);
        let slot = &mut self.slots[slot_of(&padded, key.len())];
        slot.key_len = key.len() as u8;
        slot.key = padded;
        slot.ids_len = ids.len() as u8;
        slot.ids[..ids.len()].copy_from_slice(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fit_their_lines_and_the_cap_is_2_and_a_quarter_mib() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(std::mem::size_of::<MediumSlot>(), 32);
        assert_eq!(std::mem::size_of::<ShortSlot>(), 16);
        assert_eq!(CACHE_BYTES, (2 << 20) + (256 << 10));
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
        let long = [b'x'; MAX_KEY + 1];
        cache.insert(&long, &[1]);
        assert_eq!(cache.get(&long), None);
        cache.insert(b"many", &[1; MAX_IDS + 1]);
        assert_eq!(cache.get(b"many"), None);
        cache.insert(b"seventeen bytes!!", &[7; MAX_IDS]);
        assert_eq!(cache.get(b"seventeen bytes!!"), Some(&[7; MAX_IDS][..]));
        // Medium pieces: up to MEDIUM_IDS ids.
        cache.insert(b"seven!!", &[1, 2, 3]);
        assert_eq!(cache.get(b"seven!!"), Some(&[1, 2, 3][..]));
        cache.insert(b"sixteen bytes!!!", &[4]);
        assert_eq!(cache.get(b"sixteen bytes!!!"), Some(&[4][..]));
        cache.insert(b"seven!!\0", &[5]);
        assert_eq!(cache.get(b"seven!!\0"), Some(&[5][..]));
        assert_eq!(
            cache.get(b"seven!!"),
            Some(&[1, 2, 3][..]),
            "length is part of the key"
        );
        cache.insert(b"four ids", &[1, 2, 3, 4]);
        assert_eq!(cache.get(b"four ids"), None);
        // Short pieces: up to SHORT_IDS ids, the length part of the key.
        cache.insert(b"ab", &[1, 2]);
        cache.insert(b"ab\0", &[3]);
        assert_eq!(cache.get(b"ab"), Some(&[1, 2][..]));
        assert_eq!(cache.get(b"ab\0"), Some(&[3][..]));
        cache.insert(b"abc", &[1, 2, 3]);
        assert_eq!(cache.get(b"abc"), None);
        cache.insert(b"sixsix", &[6]);
        assert_eq!(cache.get(b"sixsix"), Some(&[6][..]));
    }

    #[test]
    fn another_owner_starts_empty() {
        with_cache(u64::MAX - 1, |c| c.insert(b"word", &[5]));
        assert_eq!(
            with_cache(u64::MAX - 1, |c| c.get(b"word").map(<[u32]>::to_vec)),
            Some(vec![5])
        );
        assert_eq!(
            with_cache(u64::MAX - 2, |c| c.get(b"word").map(<[u32]>::to_vec)),
            None
        );
    }
}
