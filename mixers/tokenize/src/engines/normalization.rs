//! HF's NFC and NFKC normalizers as the byte-level fast path runs them: the same crate HF's
//! `NormalizedString::nfc` / `nfkc` collect the characters of (`unicode-normalization-alignments`,
//! Unicode 9 tables), skipped where the crate's quick check (UAX #15) finds the text already in
//! the form, which most text is.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use unicode_normalization_alignments::{
    IsNormalized, UnicodeNormalization, is_nfc_quick, is_nfkc_quick,
};

/// The normalizer of a byte-level `tokenizer.json` the fast path reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Normalization {
    None,
    Nfc,
    Nfkc,
}

impl Normalization {
    /// The text as HF's normalizer leaves it (borrowed when that is the text itself).
    pub(crate) fn apply(self, text: &str) -> Cow<'_, str> {
        match self {
            Self::None => Cow::Borrowed(text),
            Self::Nfc if in_form_by_runs(text, |run| is_nfc_quick(run)) => Cow::Borrowed(text),
            Self::Nfc => Cow::Owned(text.nfc().map(|(c, _)| c).collect()),
            Self::Nfkc if in_form_by_runs(text, |run| is_nfkc_quick(run)) => Cow::Borrowed(text),
            Self::Nfkc => Cow::Owned(text.nfkc().map(|(c, _)| c).collect()),
        }
    }

    /// As the engine line names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Nfc => "NFC",
            Self::Nfkc => "NFKC",
        }
    }
}

/// The crate's quick check of `text`, run only over its stretches of non-ASCII characters: the
/// check passes over an ASCII character and starts afresh after it (ASCII is in NFC and NFKC and
/// has combining class 0), so the stretches' checks together are the text's. Most of a text's
/// bytes are ASCII, skipped eight at a time.
fn in_form_by_runs(text: &str, quick_check: impl Fn(std::str::Chars<'_>) -> IsNormalized) -> bool {
    let bytes = text.as_bytes();
    let mut at = 0;
    loop {
        at = next_non_ascii(bytes, at);
        if at >= bytes.len() {
            return true;
        }
        let end = bytes[at..]
            .iter()
            .position(u8::is_ascii)
            .map_or(bytes.len(), |n| at + n);
        // Both ends are character boundaries: ASCII bytes, or the text's ends.
        let Some(run) = text.get(at..end) else {
            return false;
        };
        if quick_check(run.chars()) != IsNormalized::Yes {
            return false;
        }
        at = end;
    }
}

/// The first byte at or after `at` that is not ASCII (`bytes.len()` if none).
fn next_non_ascii(bytes: &[u8], mut at: usize) -> usize {
    while let Some(word) = bytes.get(at..at + 8) {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(word);
        let high = u64::from_le_bytes(eight) & 0x8080_8080_8080_8080;
        if high != 0 {
            return at + (high.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    bytes[at.min(bytes.len())..]
        .iter()
        .position(|b| !b.is_ascii())
        .map_or(bytes.len(), |n| at + n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// HF's own normalizer of that form over `text`.
    fn hf(form: Normalization, text: &str) -> String {
        let mut normalized = tokenizers::NormalizedString::from(text);
        match form {
            Normalization::None => {}
            Normalization::Nfc => {
                tokenizers::Normalizer::normalize(&tokenizers::normalizers::NFC, &mut normalized)
                    .expect("nfc");
            }
            Normalization::Nfkc => {
                tokenizers::Normalizer::normalize(&tokenizers::normalizers::NFKC, &mut normalized)
                    .expect("nfkc");
            }
        }
        normalized.get().to_string()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Each form by stretches between ASCII characters is HF's of the whole text.
        #[test]
        fn forms_are_hfs_on_random_text(text in proptest::collection::vec(prop_oneof![
            prop::sample::select(vec![
                'a', 'e', ' ', '1', '.', '\u{301}', '\u{302}', '\u{323}', '\u{308}', '\u{e9}',
                '\u{212b}', '\u{2126}', '\u{1100}', '\u{1161}', '\u{11a8}', '\u{3000}',
                '\u{5d0}', '\u{5b7}', '\u{5bc}', 'ﬁ', '①', '²', 'Ⅻ', '\u{a0}', 'ｶ', '\u{ff9e}',
                '㎏', 'ſ', '\u{2000}'
            ]),
            any::<char>(),
        ], 0..40).prop_map(|cs| cs.into_iter().collect::<String>())) {
            for form in [Normalization::None, Normalization::Nfc, Normalization::Nfkc] {
                prop_assert_eq!(form.apply(&text), hf(form, &text));
            }
        }
    }

    #[test]
    fn the_first_non_ascii_byte_is_found_at_every_offset() {
        for len in 0..20 {
            for at in 0..=len {
                let mut bytes = vec![b'a'; len];
                if at < len {
                    bytes[at] = 0xC3;
                }
                for from in 0..=len {
                    let want = if at < len && from <= at { at } else { len };
                    assert_eq!(next_non_ascii(&bytes, from), want, "{len} {at} {from}");
                }
            }
        }
    }

    #[test]
    fn nfc_composes_like_hf() {
        let nfc = |text| Normalization::Nfc.apply(text);
        assert_eq!(nfc("e\u{301}"), "\u{e9}");
        assert!(matches!(nfc("plain ascii"), Cow::Borrowed(_)));
        assert!(matches!(
            nfc("caf\u{e9} \u{201c}quoted\u{201d} \u{4e2d}"),
            Cow::Borrowed(_)
        ));
        // Singletons NFC replaces (Ohm, Angstrom, EN QUAD), a mark to compose, marks to reorder.
        for (text, composed) in [
            ("\u{2126}", "\u{3a9}"),
            ("\u{212b}", "\u{c5}"),
            ("\u{2000}", "\u{2002}"),
            ("a\u{308}", "\u{e4}"),
            ("a\u{323}\u{302}", "\u{1ead}"),
            ("a\u{302}\u{323}", "\u{1ead}"),
        ] {
            assert_eq!(nfc(text), composed, "{text:?}");
        }
        // Stretches between ASCII characters: a mark after a space composes with nothing, a mark
        // out of order after ASCII, long ASCII before and after.
        for text in [
            "word \u{301} word",
            "a\u{323}\u{302} and 12345678 then a\u{302}\u{323}",
            "plain ascii for more than eight bytes \u{e9}\u{301}",
            "\u{e9}",
            "ascii\u{2126}",
            "Cafe\u{301} \u{212b} \u{1100}\u{1161}",
        ] {
            assert_eq!(nfc(text), hf(Normalization::Nfc, text), "{text:?}");
        }
    }

    #[test]
    fn nfkc_folds_compatibility_characters_like_hf() {
        let nfkc = |text| Normalization::Nfkc.apply(text);
        for (text, folded) in [
            ("ﬁ", "fi"),
            ("①", "1"),
            ("x²", "x2"),
            ("Ⅻ", "XII"),
            ("\u{a0}", " "),
            ("ｶﾞ", "ガ"),
            ("㎏", "kg"),
            ("e\u{301}", "\u{e9}"),
        ] {
            assert_eq!(nfkc(text), folded, "{text:?}");
            assert_eq!(nfkc(text), hf(Normalization::Nfkc, text), "{text:?}");
        }
        // In NFC but not NFKC: the quick checks differ.
        assert!(matches!(Normalization::Nfc.apply("ﬁ ①"), Cow::Borrowed(_)));
        assert!(matches!(nfkc("caf\u{e9} \u{4e2d}"), Cow::Borrowed(_)));
    }
}
