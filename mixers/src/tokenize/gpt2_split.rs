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

use super::char_classes::{CharClasses, HandBack, Kind, SCANNED_RUN_LIMIT, tile};

/// The pattern this scanner reproduces: HF `ByteLevel`'s own splitting regex (`use_regex:
/// true`), copied from tokenizers 0.23's `pre_tokenizers/byte_level.rs`, where it is private. The
/// differential tests pin it.
pub(crate) const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

pub(crate) struct Gpt2Splitter {
    classes: CharClasses,
}

impl Gpt2Splitter {
    pub(crate) fn new() -> Result<Self, String> {
        Ok(Self {
            classes: CharClasses::new()?,
        })
    }

    fn kind(&self, c: char) -> Kind {
        self.classes.kind(c)
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let rest = &text[start..];
        let Some(c) = rest.chars().next() else {
            return Ok(start);
        };
        let bytes = rest.as_bytes();
        // 's 't 're 've 'm 'll 'd
        if c == '\'' {
            let contraction = [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"]
                .into_iter()
                .find(|suffix| bytes[1..].starts_with(suffix));
            if let Some(suffix) = contraction {
                return Ok(start + 1 + suffix.len());
            }
        }
        // The run of one kind after an optional single U+0020.
        let run = |from: usize, kind: Kind| from + self.classes.run(&rest[from..], kind);
        let first = self.kind(c);
        let (kind, body) = if c == ' ' {
            match rest[1..].chars().next().map(|n| self.kind(n)) {
                Some(k @ (Kind::Letter | Kind::Number | Kind::Other)) => (k, 1),
                _ => (Kind::Space, 0),
            }
        } else {
            (first, 0)
        };
        if kind != Kind::Space {
            return Ok(start + run(body, kind));
        }
        // \s+(?!\S): the whitespace run, less its last character when a non-space follows and
        // that leaves at least one; else \s+: the single whitespace character. The regex walks
        // the whole run for this.
        let end = run(0, Kind::Space);
        if end > SCANNED_RUN_LIMIT {
            return Err(HandBack);
        }
        if end == rest.len() {
            return Ok(start + end);
        }
        let last = rest[..end].chars().next_back().map_or(0, char::len_utf8);
        Ok(if end - last > 0 {
            start + end - last
        } else {
            start + end
        })
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
        ] {
            assert_eq!(ours(text), hf(text), "{text:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn matches_hf_on_random_text(text in proptest::collection::vec(
            prop_oneof![
                Just(' '), Just('\n'), Just('\t'), Just('\r'), Just('\u{a0}'), Just('\u{3000}'),
                Just('\''), Just('s'), Just('l'), Just('d'), Just('A'), Just('é'), Just('日'),
                Just('7'), Just('²'), Just('Ⅻ'), Just('.'), Just('!'), Just('\u{301}'), Just('😀'),
                any::<char>(),
            ],
            0..40,
        ).prop_map(|cs| cs.into_iter().collect::<String>())) {
            prop_assert_eq!(ours(&text), hf(&text));
        }
    }
}
