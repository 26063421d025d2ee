//! The contractions `(?i:'s|'t|'re|'ve|'m|'ll|'d)` of the cl100k family's pre-tokenizer
//! patterns, matched as fancy-regex matches them: case-insensitively by Unicode's
//! simple case folding (so `'ſ` is `'s`, as `'S` is), the letters' classes taken
//! from `regex-syntax`.

use super::ScannerError;
use super::char_classes::{contains, ranges};

/// The contractions, in the patterns' order (none is a prefix of a later one).
const CONTRACTIONS: [&str; 7] = ["s", "t", "re", "ve", "m", "ll", "d"];

pub(crate) struct Contractions {
    /// For each contraction, per letter, the characters `(?i:x)` matches (e.g. `s`: s, S, ſ).
    letters: Vec<Vec<Vec<(u32, u32)>>>,
    /// Per ASCII character, the one contraction whose first letter it is, if any.
    by_first: Box<[Option<u8>; 128]>,
}

/// The end of `letters` (a character class per letter) spelled from byte `at` of `text`, if they
/// are.
fn spelled_end(text: &str, at: usize, letters: &[Vec<(u32, u32)>]) -> Option<usize> {
    let mut end = at;
    for class in letters {
        let c = text.get(end..)?.chars().next()?;
        if !contains(class, u32::from(c)) {
            return None;
        }
        end += c.len_utf8();
    }
    Some(end)
}

impl Contractions {
    pub(crate) fn new() -> Result<Self, ScannerError> {
        let letters = CONTRACTIONS
            .iter()
            .map(|suffix| {
                suffix
                    .chars()
                    .map(|letter| ranges(&format!("(?i:{letter})")))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut by_first = Box::new([None; 128]);
        for (index, spelled) in (0u8..).zip(&letters) {
            let first = spelled
                .first()
                .ok_or(ScannerError::ContractionWithoutLetters)?;
            for b in 0..128u8 {
                if contains(first, u32::from(b))
                    && by_first[usize::from(b)].replace(index).is_some()
                {
                    return Err(ScannerError::ContractionsShareFirst {
                        first: char::from(b),
                    });
                }
            }
        }
        Ok(Self { letters, by_first })
    }

    /// The end (byte offset) of the contraction (after an apostrophe) that starts at byte `at`
    /// of `text`, if any. After an ASCII character only the one contraction it starts is tried.
    pub(crate) fn after_apostrophe(&self, text: &str, at: usize) -> Option<usize> {
        let &b = text.as_bytes().get(at)?;
        if b.is_ascii() {
            let index = self.by_first[usize::from(b)]?;
            return spelled_end(text, at, self.letters.get(usize::from(index))?);
        }
        self.letters
            .iter()
            .find_map(|spelled| spelled_end(text, at, spelled))
    }
}
