//! The stream chain: a checksum over every window of a stream, chained in stream order, so that
//! a value at window `w` proves everything before it. The daemon computes it as it serves, `dsprep
//! pack` records it in the manifest, and the clients check it (FORMAT.md "Stream chain").
//!
//! `chain(0)` is 32 zero bytes; `chain(w + 1) = sha256(chain(w) ‖ sha256(window w))`, where
//! window `w`'s bytes are its token ids as stored and served (little-endian, the recipe's dtype).
//! A window's digest is computed once; linking it costs one 64-byte hash.

use sha2::{Digest, Sha256};

/// A 32-byte chain value or window digest.
pub type Hash = [u8; 32];

/// The chain before the first window.
pub const START: Hash = [0; 32];

/// sha256 of one window's bytes.
pub fn window_digest(window: &[u8]) -> Hash {
    Sha256::digest(window).into()
}

/// The chain after a window whose digest is `digest`, from the chain before it.
pub fn link(before: &Hash, digest: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update(before);
    h.update(digest);
    h.finalize().into()
}

/// The chain after `windows` (each one window's bytes), from `before`.
pub fn extend<'a>(before: &Hash, windows: impl IntoIterator<Item = &'a [u8]>) -> Hash {
    windows
        .into_iter()
        .fold(*before, |at, window| link(&at, &window_digest(window)))
}

/// Lower-case hex, as manifests and messages write a chain value.
pub fn to_hex(hash: &Hash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A 32-byte value (a chain value, a recipe hash) from 64 hex digits.
pub fn from_hex(text: &str) -> Option<Hash> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_sha256_of_the_previous_value_and_the_window_digest() {
        let a = [1u8, 0, 2, 0];
        let b = [3u8, 0];
        let after_a: Hash = Sha256::digest([START, Sha256::digest(a).into()].concat()).into();
        let after_b: Hash = Sha256::digest([after_a, Sha256::digest(b).into()].concat()).into();
        assert_eq!(extend(&START, [&a[..]]), after_a);
        assert_eq!(extend(&START, [&a[..], &b[..]]), after_b);
        assert_eq!(extend(&after_a, [&b[..]]), after_b);
        assert_ne!(extend(&START, [&b[..], &a[..]]), after_b, "order matters");
        assert_eq!(from_hex(&to_hex(&after_b)), Some(after_b));
        assert_eq!(from_hex("xyz"), None);
    }
}
