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
//! Unicode tables. A differential test against HF's own regex type checks the two agree.

use super::char_classes::{
    CharClasses, HandBack, Kind, SCANNED_RUN_LIMIT, spaces_before_word_end, tile,
};

/// The pattern this scanner reproduces: HF `ByteLevel`'s own splitting regex (`use_regex:
/// true`), copied from tokenizers 0.23's `pre_tokenizers/byte_level.rs`, where it is private. The
/// differential tests pin it.
pub(crate) const GPT2_PATTERN: &str =
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

pub(crate) struct Gpt2Splitter {
    classes: CharClasses,
}

impl Gpt2Splitter {
    pub(crate) fn new() -> Result<Self, String> {
        Ok(Self {
            classes: CharClasses::new()?,
        })
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    /// The commonest shapes, ASCII `word` and ` word`, take a short way; [`Self::any_match_end`]
    /// takes every shape. (The other scanners' short way for ASCII punctuation runs,
    /// `ascii_punctuation_end`, measured no gain here: GPT-2's general path has no classes to
    /// tell apart in such a run.)
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

    /// The matches of the pattern in `text`, as HF's regex would report them: `(start, end)` byte
    /// ranges that tile the text, or [`HandBack`] where the regex itself must cut the text.
    pub(crate) fn find_iter<'a>(
        &'a self,
        text: &'a str,
    ) -> impl Iterator<Item = Result<(usize, usize), HandBack>> + 'a {
        tile(text, move |at| self.match_end(text, at))
    }
}

#[cfg(test)]
mod tests {
    use super::super::char_classes::scanner_checks;
    use super::*;
    use proptest::prelude::*;
    use tokenizers::utils::SysRegex;

    use std::sync::LazyLock;

    /// Built once: compiling the regex and the class tables per case would dominate the tests.
    static REGEX: LazyLock<SysRegex> =
        LazyLock::new(|| SysRegex::new(GPT2_PATTERN).expect("compiles"));
    static SCANNER: LazyLock<Gpt2Splitter> = LazyLock::new(|| Gpt2Splitter::new().expect("tables"));

    fn hf(text: &str) -> Vec<(usize, usize)> {
        REGEX.find_iter(text).collect()
    }

    fn ours(text: &str) -> Vec<(usize, usize)> {
        SCANNER
            .find_iter(text)
            .collect::<Result<_, _>>()
            .expect("no hand-back")
    }

    #[test]
    fn matches_hf_on_the_hard_cases() {
        for text in [
            "",
            " ",
            "  ",
            "hello world",
            "  hello   world  ",
            "don't we've I'll they'd 'S 'x '",
            "x\n\ny\t\tz\r\n",
            "a \u{a0}b\u{3000} c\u{2003}\u{2003}d",
            "12.5% of 1,000 — ²³ Ⅻ ٣٤٥",
            "naïve café e\u{301} 日本語 😀😀 !!",
            " ' '' ''s 's'",
            "tab\t!\n?  ?",
            "end with spaces   ",
            "\n",
            " \n x",
            // ASCII runs (longer than 8 bytes too) that run into longer characters.
            "abcdefghijé abcdefghij\u{301} abcdefgh日本 abcdefghij² abcdefghij\u{a0}x",
            "ABCDEFGHIJKLMNOPQRSTUVWXYZ@[`{abcdefghijklmnopqrstuvwxyz abcdefg×yz abcdefg\u{2003}x",
            "0123456789٣٤ 12345678Ⅻ !!!!!!!!!!é ........\u{301} ?????????\u{a0}",
            "          \u{3000}  x         \u{85}x\n\n\n\n\n\n\n\n\n\ny \t\t\t\t\t\t\t\t\t!",
            "         ",
            "x         ",
            "'sa 'tt 'rev 'vee 'mm 'lll 'dd 'r 'v 'l 'S 'RE 'LL 'ſ",
            scanner_checks::PUNCTUATION_RUNS,
            ".'s ''t .'re ,'ll \u{b}!\u{b} !\u{c}x (\u{7f}",
        ] {
            assert_eq!(ours(text), hf(text), "{text:?}");
        }
    }

    /// Single characters of every kind.
    fn character() -> impl Strategy<Value = char> {
        prop_oneof![
            scanner_checks::whitespace(),
            prop::sample::select(vec![
                '\'', 's', 'l', 'd', 'A', 'é', '日', '7', '²', 'Ⅻ', '.', '!', '\u{301}', '😀', '×',
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn matches_hf_on_random_text(
            text in scanner_checks::text_with_ascii_stretches(character()))
        {
            prop_assert_eq!(ours(&text), hf(&text));
        }
    }
}
