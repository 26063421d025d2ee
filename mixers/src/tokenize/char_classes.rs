//! What the pre-tokenizer scanners share: the character classes they test (`\p{L}`, `\p{N}`,
//! `\s`, and case-insensitive letters), taken from `regex-syntax`, the crate fancy-regex compiles
//! HF's patterns with, so scanner and regex use the same Unicode tables; the bound past which a
//! scanner hands a text back to the regex; and the loop that tiles a text with matches.

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
    ascii: [Kind; 128],
    /// Sorted, disjoint code point ranges of `\p{L}`, `\p{N}` and `\s`.
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
    spaces: Vec<(u32, u32)>,
}

/// The code point ranges regex-syntax gives for a class expression such as `\p{L}` or `(?i:s)`.
pub(crate) fn ranges(class: &str) -> Result<Vec<(u32, u32)>, String> {
    let hir = regex_syntax::parse(class).map_err(|e| format!("{class}: {e}"))?;
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
            .ok_or_else(|| format!("{class}: literal is not one character")),
        other => Err(format!("{class} is not a Unicode class: {other:?}")),
    }
}

pub(crate) fn contains(ranges: &[(u32, u32)], c: u32) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

impl CharClasses {
    pub(crate) fn new() -> Result<Self, String> {
        let mut classes = Self {
            ascii: [Kind::Other; 128],
            letters: ranges(r"\p{L}")?,
            numbers: ranges(r"\p{N}")?,
            spaces: ranges(r"\s")?,
        };
        for b in 0..128u8 {
            classes.ascii[usize::from(b)] = classes.classify_slow(char::from(b));
        }
        Ok(classes)
    }

    fn classify_slow(&self, c: char) -> Kind {
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

    pub(crate) fn kind(&self, c: char) -> Kind {
        if c.is_ascii() {
            self.ascii[c as usize]
        } else {
            self.classify_slow(c)
        }
    }

    /// The byte length of the run of `kind` at the start of `text`.
    pub(crate) fn run(&self, text: &str, kind: Kind) -> usize {
        text.char_indices()
            .find(|&(_, c)| self.kind(c) != kind)
            .map_or(text.len(), |(i, _)| i)
    }
}

/// How far a scanner follows one whitespace run before it hands the text back to HF's regex.
/// fancy-regex backtracks through the whole run for `\s*[\r\n]+` and `\s+(?!\S)` and gives up
/// past its backtrack limit (1,000,000 steps; measured with GPT-2's, cl100k's and Qwen's
/// patterns: a run of 999,999 spaces, tabs or NBSPs), after which HF stops splitting; the regex,
/// not the scanner, must then cut the text. A byte count is at least the character count, so
/// this bound is safe for any characters; a test pins that the regex holds up to it.
pub(crate) const SCANNED_RUN_LIMIT: usize = 64 * 1024;

/// A scanner met a whitespace run longer than [`SCANNED_RUN_LIMIT`]: cut this text with HF's
/// regex instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandBack;

/// A scanner's matches as HF's regex reports them: from the start of `text`, `match_end(at)` gives
/// the end of the match starting at `at`, so the `(start, end)` ranges tile the text. After a
/// [`HandBack`] nothing more is scanned: the regex cuts the whole text.
pub(crate) fn tile<'a>(
    text: &'a str,
    match_end: impl Fn(usize) -> Result<usize, HandBack> + 'a,
) -> impl Iterator<Item = Result<(usize, usize), HandBack>> + 'a {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= text.len() {
            return None;
        }
        let found = match_end(at).map(|end| (at, end));
        at = found.map_or(text.len(), |(_, end)| end);
        Some(found)
    })
}
