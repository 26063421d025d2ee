//! The cl100k family of pre-tokenizer patterns as a hand-written scanner. Llama 3 and OpenAI's
//! cl100k_base split with
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! and Qwen2, Qwen2.5 and Qwen3 with the same pattern with `\p{N}` for `\p{N}{1,3}`. HF runs it
//! with fancy-regex, which is most of dsprep's engine's time on these vocabularies. Qwen's files
//! normalize with NFC, which HF `tokenizers` 1.x applies with other Unicode tables than 0.23, so
//! dsprep's engine, on this scanner, encodes them. This scanner
//! gives the same matches, leftmost-first, alternative by alternative (each step below names the
//! alternative it stands for). Every character starts a match of some alternative, so the
//! matches tile the text. The conformance harness checks the two agree (`conformance.rs`).

use super::char_classes::{CharClasses, Kind, ascii_punctuation_end, is_cr_or_lf};
use super::contractions::Contractions;
use super::{HandBack, Scanner, ScannerError};

/// The cl100k / Llama 3 pattern, as Llama 3's `tokenizer.json` writes it.
pub(crate) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2/2.5/3 pattern: one number character per match.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

struct Cl100kSplitter {
    classes: CharClasses,
    /// Most number characters in one match: 3 for cl100k and Llama 3, 1 for Qwen.
    max_digits: usize,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)`
    contractions: Contractions,
}

impl Cl100kSplitter {
    fn new(max_digits: usize) -> Result<Self, ScannerError> {
        Ok(Self {
            classes: CharClasses::new()?,
            max_digits,
            contractions: Contractions::new()?,
        })
    }

    /// The end of the `\p{N}{1,3}` (or `\p{N}`) match at `start`, whose first character is a
    /// number `width` bytes wide.
    fn digits_end(&self, text: &str, start: usize, width: usize) -> usize {
        let mut end = start + width;
        for _ in 1..self.max_digits {
            match self.classes.kind_at(text, end) {
                Some((Kind::Number, width)) => end += width,
                _ => break,
            }
        }
        end
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    /// The commonest shapes, ASCII `word` and ` word` (or `(word`, `.word`, ...), take a short
    /// way; [`Self::any_match_end`] takes every shape.
    #[inline]
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let bytes = text.as_bytes();
        match bytes.get(start) {
            Some(b) if b.is_ascii_alphabetic() => Ok(self.classes.letters_end(text, start + 1)),
            Some(&b)
                if self.joins_letters(b)
                    && bytes.get(start + 1).is_some_and(u8::is_ascii_alphabetic) =>
            {
                Ok(self.classes.letters_end(text, start + 2))
            }
            _ => match ascii_punctuation_end(bytes, start, is_cr_or_lf) {
                Some(end) => Ok(end),
                None => self.any_match_end(text, start),
            },
        }
    }

    /// Whether ASCII `b` is a `[^\r\n\p{L}\p{N}]` that starts no contraction.
    fn joins_letters(&self, b: u8) -> bool {
        matches!(self.classes.byte_kind(b), Some(Kind::Space | Kind::Other))
            && !matches!(b, b'\r' | b'\n' | b'\'')
    }

    #[inline(never)]
    fn any_match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let classes = &self.classes;
        let bytes = text.as_bytes();
        let Some((kind, width)) = classes.kind_at(text, start) else {
            return Ok(start);
        };
        // [^\r\n\p{L}\p{N}]?\p{L}+ starting with its letters: the common case first.
        if kind == Kind::Letter {
            return Ok(classes.letters_end(text, start + width));
        }
        let first = bytes[start];
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if first == b'\''
            && let Some(end) = self.contractions.after_apostrophe(text, start + 1)
        {
            return Ok(end);
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+ starting with one other character; the rest looks one
        // character ahead.
        let next = classes.kind_at(text, start + width);
        if let Some((Kind::Letter, next_width)) = next
            && kind != Kind::Number
            && !is_cr_or_lf(first)
        {
            return Ok(classes.letters_end(text, start + width + next_width));
        }
        // \p{N}{1,3} (or \p{N})
        if kind == Kind::Number {
            return Ok(self.digits_end(text, start, width));
        }
        //  ?[^\s\p{L}\p{N}]+[\r\n]*
        let body = match next {
            Some((Kind::Other, _)) if first == b' ' => start + 1,
            _ if kind == Kind::Other => start,
            // \s*[\r\n]+|\s+(?!\S)|\s+ : a whitespace character starts the match.
            _ => return classes.newline_or_spaces_end(text, start),
        };
        let mut end = classes.run_end(text, body, Kind::Other);
        while bytes.get(end).is_some_and(|&b| is_cr_or_lf(b)) {
            end += 1;
        }
        Ok(end)
    }
}

/// The registry's builder for the cl100k / Llama 3 pattern.
pub(super) fn build_cl100k() -> super::Built {
    Ok(Box::new(Cl100kSplitter::new(3)?))
}

/// The registry's builder for the Qwen2/2.5/3 pattern.
pub(super) fn build_qwen2() -> super::Built {
    Ok(Box::new(Cl100kSplitter::new(1)?))
}

impl Scanner for Cl100kSplitter {
    #[inline]
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        Cl100kSplitter::match_end(self, text, start)
    }
}
