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

use regex_syntax::hir::{Class, HirKind};

/// The pattern this scanner reproduces, as HF's `ByteLevel` pre-tokenizer writes it.
pub(crate) const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Letter,
    Number,
    Space,
    Other,
}

pub(crate) struct Gpt2Splitter {
    ascii: [Kind; 128],
    /// Sorted, disjoint code point ranges of `\p{L}`, `\p{N}` and `\s`.
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
    spaces: Vec<(u32, u32)>,
}

fn ranges(class: &str) -> Result<Vec<(u32, u32)>, String> {
    let hir = regex_syntax::parse(class).map_err(|e| format!("{class}: {e}"))?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(set)) => Ok(set
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect()),
        other => Err(format!("{class} is not a Unicode class: {other:?}")),
    }
}

fn contains(ranges: &[(u32, u32)], c: u32) -> bool {
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

impl Gpt2Splitter {
    pub(crate) fn new() -> Result<Self, String> {
        let mut splitter = Self {
            ascii: [Kind::Other; 128],
            letters: ranges(r"\p{L}")?,
            numbers: ranges(r"\p{N}")?,
            spaces: ranges(r"\s")?,
        };
        for b in 0..128u8 {
            splitter.ascii[usize::from(b)] = splitter.classify_slow(char::from(b));
        }
        Ok(splitter)
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

    fn kind(&self, c: char) -> Kind {
        if c.is_ascii() {
            self.ascii[c as usize]
        } else {
            self.classify_slow(c)
        }
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    fn match_end(&self, text: &str, start: usize) -> usize {
        let rest = &text[start..];
        let mut chars = rest.char_indices();
        let Some((_, c)) = chars.next() else {
            return start;
        };
        let bytes = rest.as_bytes();
        // 's 't 're 've 'm 'll 'd
        if c == '\'' {
            let contraction = [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"]
                .into_iter()
                .find(|suffix| bytes[1..].starts_with(suffix));
            if let Some(suffix) = contraction {
                return start + 1 + suffix.len();
            }
        }
        // The run of one kind after an optional single U+0020.
        let run = |from: usize, kind: Kind| -> usize {
            rest[from..]
                .char_indices()
                .find(|&(_, c)| self.kind(c) != kind)
                .map_or(rest.len(), |(i, _)| from + i)
        };
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
            return start + run(body, kind);
        }
        // \s+(?!\S): the whitespace run, less its last character when a non-space follows and
        // that leaves at least one; else \s+: the single whitespace character.
        let end = run(0, Kind::Space);
        if end == rest.len() {
            return start + end;
        }
        let last = rest[..end].chars().next_back().map_or(0, char::len_utf8);
        if end - last > 0 {
            start + end - last
        } else {
            start + end
        }
    }

    /// The matches of the pattern in `text`, as HF's regex would report them: `(start, end)` byte
    /// ranges that tile the text.
    pub(crate) fn find_iter<'a>(
        &'a self,
        text: &'a str,
    ) -> impl Iterator<Item = (usize, usize)> + 'a {
        let mut at = 0;
        std::iter::from_fn(move || {
            if at >= text.len() {
                return None;
            }
            let end = self.match_end(text, at);
            let found = (at, end);
            at = end;
            Some(found)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokenizers::utils::SysRegex;

    fn hf(text: &str) -> Vec<(usize, usize)> {
        SysRegex::new(GPT2_PATTERN)
            .expect("compiles")
            .find_iter(text)
            .collect()
    }

    fn ours(text: &str) -> Vec<(usize, usize)> {
        Gpt2Splitter::new()
            .expect("tables")
            .find_iter(text)
            .collect()
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
