//! What the pre-tokenizer scanners share: the character classes they test (`\p{L}`, `\p{N}`,
//! `\s`, and case-insensitive letters), taken from `regex-syntax`, the crate fancy-regex compiles
//! HF's patterns with, so scanner and regex use the same Unicode tables; the runs of one class,
//! which classify ASCII with a byte table (built from those tables) and test runs of ASCII letters
//! and of spaces 8 bytes at a time, decoding a character only where they meet a non-ASCII byte.

use super::{HandBack, SCANNED_RUN_LIMIT, ScannerError};
use regex_syntax::hir::{Class, HirKind};

/// Which of the pattern's classes a character is in (they are disjoint).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s`
    Space,
    /// none of the three
    Other,
}

pub(crate) struct CharClasses {
    /// The kind of each byte that is a whole character (ASCII); `None` for the bytes of longer
    /// UTF-8 sequences, whose characters are looked up in the ranges.
    bytes: [Option<Kind>; 256],
    /// Sorted, disjoint code point ranges of `\p{L}`, `\p{N}` and `\s`.
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
    spaces: Vec<(u32, u32)>,
}

/// The code point ranges regex-syntax gives for a class expression such as `\p{L}` or `(?i:s)`.
pub(crate) fn ranges(class: &str) -> Result<Vec<(u32, u32)>, ScannerError> {
    let hir = regex_syntax::parse(class).map_err(|e| ScannerError::ClassSyntax {
        class: class.to_string(),
        message: e.to_string(),
    })?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(set)) => Ok(set
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect()),
        // A single character (a case-insensitive letter with no other case) is a literal.
        HirKind::Literal(literal) => std::str::from_utf8(&literal.0)
            .ok()
            .and_then(|s| s.chars().next())
            .map(|c| vec![(u32::from(c), u32::from(c))])
            .ok_or_else(|| ScannerError::NotOneCharacter {
                class: class.to_string(),
            }),
        other => Err(ScannerError::NotAClass {
            class: class.to_string(),
            found: format!("{other:?}"),
        }),
    }
}

pub(crate) fn contains(ranges: &[(u32, u32)], c: u32) -> bool {
    range_holding(ranges, c, |&range| range).is_some()
}

/// The index of the range of `ranges` (sorted, disjoint; `bounds` gives each one's first and last
/// code point) that holds `c`, if one does.
pub(crate) fn range_holding<T>(
    ranges: &[T],
    c: u32,
    bounds: impl Fn(&T) -> (u32, u32),
) -> Option<usize> {
    ranges
        .binary_search_by(|range| {
            let (lo, hi) = bounds(range);
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .ok()
}

impl CharClasses {
    pub(crate) fn new() -> Result<Self, ScannerError> {
        let mut classes = Self {
            bytes: [None; 256],
            letters: ranges(r"\p{L}")?,
            numbers: ranges(r"\p{N}")?,
            spaces: ranges(r"\s")?,
        };
        for b in 0..128u8 {
            let kind = classes.classify(char::from(b));
            // `letters_end` tests ASCII letters 8 bytes at a time, without the tables.
            if (kind == Kind::Letter) != b.is_ascii_alphabetic() {
                return Err(ScannerError::LettersDisagree { byte: b });
            }
            classes.bytes[usize::from(b)] = Some(kind);
        }
        Ok(classes)
    }

    /// The kind of `b` if it is a whole character (ASCII), else `None`.
    #[inline]
    pub(crate) fn byte_kind(&self, b: u8) -> Option<Kind> {
        self.bytes[usize::from(b)]
    }

    fn classify(&self, c: char) -> Kind {
        let c = u32::from(c);
        if contains(&self.letters, c) {
            Kind::Letter
        } else if contains(&self.numbers, c) {
            Kind::Number
        } else if contains(&self.spaces, c) {
            Kind::Space
        } else {
            Kind::Other
        }
    }

    /// The kind and byte width of the character at byte `at` of `text` (a char boundary), or
    /// `None` at the end. ASCII is one table look-up; other characters are decoded.
    #[inline]
    pub(crate) fn kind_at(&self, text: &str, at: usize) -> Option<(Kind, usize)> {
        let &b = text.as_bytes().get(at)?;
        match self.bytes[usize::from(b)] {
            Some(kind) => Some((kind, 1)),
            None => self.wide_kind_at(text, at),
        }
    }

    #[inline(never)]
    fn wide_kind_at(&self, text: &str, at: usize) -> Option<(Kind, usize)> {
        let c = text.get(at..)?.chars().next()?;
        Some((self.classify(c), c.len_utf8()))
    }

    /// The end (byte offset) of the run of `kind` from byte `at` of `text` (a char boundary): a
    /// loop over ASCII bytes that decodes a character only where it meets a longer one.
    #[inline]
    pub(crate) fn run_end(&self, text: &str, mut at: usize, kind: Kind) -> usize {
        let bytes = text.as_bytes();
        loop {
            while let Some(&b) = bytes.get(at)
                && self.bytes[usize::from(b)] == Some(kind)
            {
                at += 1;
            }
            match self.kind_at(text, at) {
                Some((found, width)) if found == kind => at += width,
                _ => return at,
            }
        }
    }

    /// The end of the whitespace run from byte `at` of `text` (a char boundary), and the end of
    /// its last CR or LF if it has one. Runs of U+0020 are tested 8 bytes at a time.
    pub(crate) fn spaces_end(&self, text: &str, mut at: usize) -> (usize, Option<usize>) {
        let bytes = text.as_bytes();
        let mut newline_end = None;
        loop {
            at = ascii_spaces_end(bytes, at);
            match self.kind_at(text, at) {
                Some((Kind::Space, width)) => {
                    if matches!(bytes.get(at), Some(b'\r' | b'\n')) {
                        newline_end = Some(at + 1);
                    }
                    at += width;
                }
                _ => return (at, newline_end),
            }
        }
    }

    /// The end of the match at `start` (a whitespace character) of `\s*[\r\n]+|\s+(?!\S)|\s+`,
    /// the alternatives the cl100k family's pattern ends with. The
    /// regex walks the whole run for these, so past [`SCANNED_RUN_LIMIT`] the text is handed back.
    pub(crate) fn newline_or_spaces_end(
        &self,
        text: &str,
        start: usize,
    ) -> Result<usize, HandBack> {
        let (end, newline_end) = self.spaces_end(text, start);
        if end - start > SCANNED_RUN_LIMIT {
            return Err(HandBack);
        }
        // \s*[\r\n]+ : \s* gives back characters until a CR or LF can follow, so the match ends
        // just after the run's last CR or LF (no CR or LF follows it inside the run).
        if let Some(newline_end) = newline_end {
            return Ok(newline_end);
        }
        // \s+(?!\S)|\s+ over the run.
        Ok(spaces_before_word_end(text, start, end))
    }

    /// [`Self::run_end`] for letters, whose ASCII stretches are tested 8 bytes at a time.
    #[inline]
    pub(crate) fn letters_end(&self, text: &str, at: usize) -> usize {
        let end = ascii_letters_end(text.as_bytes(), at);
        match text.as_bytes().get(end) {
            Some(&b) if !b.is_ascii() => self.run_end(text, end, Kind::Letter),
            _ => end,
        }
    }
}

/// `0x01` in every byte of a `u64`.
const ONES: u64 = u64::from_ne_bytes([1; 8]);
/// The high bit of every byte of a `u64`.
pub(crate) const HIGH_BITS: u64 = ONES * 0x80;

/// The high bit of each byte of `chunk` that is not an ASCII letter, and of no other byte.
fn non_letters(chunk: u64) -> u64 {
    // Each byte less its high bit, lowercased: 0x20..=0x7f, so the sums below carry no byte into
    // the next one; a sum's high bit says the byte is at least 'a', or past 'z'.
    let folded = (chunk & !HIGH_BITS) | (ONES * 0x20);
    let from_a = folded + ONES * (0x80 - u64::from(b'a'));
    let past_z = folded + ONES * (0x80 - u64::from(b'z') - 1);
    !(from_a & !past_z & !chunk) & HIGH_BITS
}

/// The end of a run from byte `at` of `bytes`, 8 bytes at a time: `stops` gives, of a
/// little-endian chunk, a word with bits set in the bytes that end the run and in no other (the
/// high bit, or any), `keeps` says of one byte (for the tail) whether it goes on.
#[inline(always)]
pub(crate) fn ascii_run_end(
    bytes: &[u8],
    mut at: usize,
    stops: impl Fn(u64) -> u64,
    keeps: impl Fn(u8) -> bool,
) -> usize {
    while let Some(chunk) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let stopped = stops(u64::from_le_bytes(*chunk));
        if stopped != 0 {
            // The lowest set bit is in the first byte (little-endian) that ends the run.
            return at + (stopped.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while bytes.get(at).is_some_and(|&b| keeps(b)) {
        at += 1;
    }
    at
}

/// The end of the run of U+0020 from byte `at` of `bytes`, 8 bytes at a time.
fn ascii_spaces_end(bytes: &[u8], at: usize) -> usize {
    // Zero in each byte that is a space.
    let others = |chunk: u64| chunk ^ (ONES * u64::from(b' '));
    ascii_run_end(bytes, at, others, |b| b == b' ')
}

/// The end of the run of ASCII letters from byte `at` of `bytes`, 8 bytes at a time.
pub(crate) fn ascii_letters_end(bytes: &[u8], at: usize) -> usize {
    ascii_run_end(bytes, at, non_letters, |b| b.is_ascii_alphabetic())
}

/// `[\r\n]`, the patterns' line ends.
#[inline]
pub(crate) fn is_cr_or_lf(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// The end of the cl100k family's ` ?[^\s\p{L}\p{N}]+` and what `trailing` takes after it (`[\r\n]*`,
/// `[\r\n/]*`) from byte `start`, where the run is ASCII punctuation,
/// after one space or not, and ends at ASCII: the commonest shape in code after words and
/// whitespace (" =", "):", "("). `None` wherever the scanner's general path must decide: the run
/// ends at a character that is not ASCII or is a control (either could carry it on), or one
/// punctuation character is followed by a letter (it may start a word, `[^\r\n\p{L}\p{N}]?`
/// taken, or be a contraction's apostrophe).
#[inline]
pub(crate) fn ascii_punctuation_end(
    bytes: &[u8],
    start: usize,
    trailing: impl Fn(u8) -> bool,
) -> Option<usize> {
    let body = start + usize::from(bytes.get(start) == Some(&b' '));
    if !bytes.get(body)?.is_ascii_punctuation() {
        return None;
    }
    let mut end = body + 1;
    while bytes.get(end).is_some_and(u8::is_ascii_punctuation) {
        end += 1;
    }
    match bytes.get(end) {
        Some(b) if b.is_ascii_alphabetic() && end == start + 1 => return None,
        Some(b) if !(b.is_ascii_alphanumeric() || b.is_ascii_whitespace()) => return None,
        _ => {}
    }
    while bytes.get(end).is_some_and(|&b| trailing(b)) {
        end += 1;
    }
    Some(end)
}

/// The end of the match at `start` of GPT-2's and cl100k's `\s+(?!\S)|\s+` over the whitespace
/// run `start..end`: the run less its last character when a non-space follows (the run does not
/// end the text) and that leaves at least one character; else the whole run (at the text's end)
/// or its one character.
#[inline]
pub(crate) fn spaces_before_word_end(text: &str, start: usize, end: usize) -> usize {
    if end == text.len() {
        return end;
    }
    let last = text
        .get(..end)
        .and_then(|s| s.chars().next_back())
        .map_or(0, char::len_utf8);
    if end - last > start { end - last } else { end }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value at every place in and past the first 8-byte chunk, and short tails.
    #[test]
    fn ascii_runs_8_bytes_at_a_time_match_a_byte_loop() {
        for (fill, fast, slow) in [
            (
                b'q',
                ascii_letters_end as fn(&[u8], usize) -> usize,
                u8::is_ascii_alphabetic as fn(&u8) -> bool,
            ),
            (b' ', ascii_spaces_end, |b: &u8| *b == b' '),
        ] {
            for len in 0..20 {
                for place in 0..len {
                    for b in 0..=255u8 {
                        let mut bytes = vec![fill; len];
                        bytes[place] = b;
                        for from in 0..len {
                            let expected = bytes[from..]
                                .iter()
                                .position(|b| !slow(b))
                                .map_or(len, |i| from + i);
                            assert_eq!(fast(&bytes, from), expected, "{bytes:?} from {from}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn runs_cross_into_longer_characters() {
        let classes = CharClasses::new().expect("tables");
        let letters_then = |tail: &str| {
            let text = format!("abcdefghijKLMNOP{tail}");
            classes.letters_end(&text, 0) - 16
        };
        assert_eq!(letters_then("é日x!"), "é日x".len());
        assert_eq!(letters_then("\u{301}"), 0); // a mark is no \p{L}
        assert_eq!(letters_then("×a"), 0); // bytes C3 97: 'C' and a control once unmarked
        assert_eq!(letters_then("\u{2003}a"), 0);
        let text = "          \u{a0}\u{3000}\t\u{85}\n  \u{2028}   x";
        let end = text.len() - 1;
        assert_eq!(
            classes.spaces_end(text, 0),
            (end, Some(text.find("\n  ").unwrap() + 1))
        );
        assert_eq!(
            classes.spaces_end(text, 3),
            (end, Some(text.find("\n  ").unwrap() + 1))
        );
        assert_eq!(classes.spaces_end("  \u{2003}  \r", 0), (8, Some(8)));
        assert_eq!(classes.spaces_end("  \u{2003}  ", 0), (7, None));
        assert_eq!(classes.run_end("12٣٤²Ⅻx", 0, Kind::Number), "12٣٤²Ⅻ".len());
    }
}
