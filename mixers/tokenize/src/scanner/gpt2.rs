//! GPT-2's pre-tokenizer pattern as a hand-written scanner. HF runs the regex
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! with fancy-regex, which is most of the fast path's time on GPT-2 vocabularies. This scanner
//! gives the same matches, leftmost-first, alternative by alternative. Every character starts a
//! match of some alternative, so the matches tile the text. The character classes are taken
//! from `regex-syntax`, the crate fancy-regex compiles the pattern with, so both use the same
//! Unicode tables. The conformance harness checks the two agree (`conformance.rs`).

use super::char_classes::{CharClasses, Kind, spaces_before_word_end};
use super::{HandBack, SCANNED_RUN_LIMIT, Scanner, ScannerError};

/// The pattern this scanner reproduces: HF `ByteLevel`'s own splitting regex (`use_regex:
/// true`), copied from tokenizers 0.23's `pre_tokenizers/byte_level.rs`, where it is private. The
/// registry keys the scanner by it.
pub(crate) const PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The byte length of the contraction (`s t re ve m ll d`) that `after`, the bytes after an
/// apostrophe, starts with.
fn contraction(after: &[u8]) -> Option<usize> {
    match after {
        [b's' | b't' | b'm' | b'd', ..] => Some(1),
        [b'r' | b'v', b'e', ..] | [b'l', b'l', ..] => Some(2),
        _ => None,
    }
}

struct Gpt2Splitter {
    classes: CharClasses,
}

impl Gpt2Splitter {
    fn new() -> Result<Self, ScannerError> {
        Ok(Self {
            classes: CharClasses::new()?,
        })
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    /// The commonest shapes, ASCII `word` and ` word`, take a short way; [`Self::any_match_end`]
    /// takes every shape.
    #[inline]
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let bytes = text.as_bytes();
        match bytes.get(start) {
            Some(b) if b.is_ascii_alphabetic() => Ok(self.classes.letters_end(text, start + 1)),
            Some(b' ') if bytes.get(start + 1).is_some_and(u8::is_ascii_alphabetic) => {
                Ok(self.classes.letters_end(text, start + 2))
            }
            _ => self.any_match_end(text, start),
        }
    }

    #[inline(never)]
    fn any_match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let classes = &self.classes;
        let Some((kind, width)) = classes.kind_at(text, start) else {
            return Ok(start);
        };
        let first = text.as_bytes()[start];
        // 's 't 're 've 'm 'll 'd
        if first == b'\''
            && let Some(len) = contraction(&text.as_bytes()[start + 1..])
        {
            return Ok(start + 1 + len);
        }
        //  ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ : the run of one kind, after an optional U+0020.
        if kind != Kind::Space {
            return Ok(classes.run_end(text, start + width, kind));
        }
        if first == b' '
            && let Some((next, next_width)) = classes.kind_at(text, start + 1)
            && next != Kind::Space
        {
            return Ok(classes.run_end(text, start + 1 + next_width, next));
        }
        // \s+(?!\S)|\s+ over the whitespace run; the regex walks the whole run for this.
        let (end, _) = classes.spaces_end(text, start);
        if end - start > SCANNED_RUN_LIMIT {
            return Err(HandBack);
        }
        Ok(spaces_before_word_end(text, start, end))
    }
}

/// The registry's builder.
pub(super) fn build() -> super::Built {
    Ok(Box::new(Gpt2Splitter::new()?))
}

impl Scanner for Gpt2Splitter {
    #[inline]
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        Gpt2Splitter::match_end(self, text, start)
    }
}
