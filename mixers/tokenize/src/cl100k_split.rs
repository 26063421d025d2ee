//! The cl100k family of pre-tokenizer patterns as a hand-written scanner. Llama 3 and OpenAI's
//! cl100k_base split with
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! and Qwen2, Qwen2.5 and Qwen3 with the same pattern with `\p{N}` for `\p{N}{1,3}`. HF runs it
//! with fancy-regex, which is most of the fast path's time on these vocabularies. This scanner
//! gives the same matches, leftmost-first, alternative by alternative (each step below names the
//! alternative it stands for). Every character starts a match of some alternative, so the
//! matches tile the text. Differential tests against HF's own regex type check the two agree.

use super::char_classes::{CharClasses, HandBack, Kind, ascii_punctuation_end, is_cr_or_lf, tile};
use super::contractions::Contractions;

/// The cl100k / Llama 3 pattern, as Llama 3's `tokenizer.json` writes it.
pub(crate) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2/2.5/3 pattern: one number character per match.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub(crate) struct Cl100kSplitter {
    classes: CharClasses,
    /// Most number characters in one match: 3 for cl100k and Llama 3, 1 for Qwen.
    max_digits: usize,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)`
    contractions: Contractions,
}

impl Cl100kSplitter {
    /// The scanner for `pattern` if it is one of the family's patterns.
    pub(crate) fn for_pattern(pattern: &str) -> Option<Result<Self, String>> {
        let max_digits = match pattern {
            CL100K_PATTERN => 3,
            QWEN2_PATTERN => 1,
            _ => return None,
        };
        Some(Self::new(max_digits))
    }

    fn new(max_digits: usize) -> Result<Self, String> {
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
    use super::super::char_classes::{SCANNED_RUN_LIMIT, scanner_checks};
    use super::*;
    use proptest::prelude::*;
    use tokenizers::utils::SysRegex;

    use std::sync::LazyLock;

    /// Built once: compiling the regex and the class tables per case would dominate the tests.
    static REGEXES: LazyLock<[SysRegex; 2]> = LazyLock::new(|| {
        [CL100K_PATTERN, QWEN2_PATTERN].map(|p| SysRegex::new(p).expect("compiles"))
    });
    static SCANNERS: LazyLock<[Cl100kSplitter; 2]> = LazyLock::new(|| {
        [CL100K_PATTERN, QWEN2_PATTERN].map(|p| {
            Cl100kSplitter::for_pattern(p)
                .expect("family pattern")
                .expect("tables")
        })
    });

    fn index(pattern: &str) -> usize {
        usize::from(pattern == QWEN2_PATTERN)
    }

    fn hf(pattern: &str, text: &str) -> Vec<(usize, usize)> {
        REGEXES[index(pattern)].find_iter(text).collect()
    }

    fn ours(pattern: &str, text: &str) -> Vec<(usize, usize)> {
        SCANNERS[index(pattern)]
            .find_iter(text)
            .collect::<Result<_, _>>()
            .expect("no hand-back")
    }

    const HARD_CASES: &[&str] = &[
        "",
        " ",
        "  ",
        "hello world",
        "  hello   world  ",
        "don't we've I'll they'd 'S 'x ' I'M YOU'RE WE'VE SHE'LL HE'D IT'S 'ſ 'Ll",
        "x\n\ny\t\tz\r\n",
        "a \u{a0}b\u{3000} c\u{2003}\u{2003}d",
        "12.5% of 1,000,000 — ²³ Ⅻ ٣٤٥ 1234567890",
        "naïve café e\u{301} 日本語 😀😀 !!",
        " ' '' ''s 's' '123 (hello .com",
        "tab\t!\n?  ?",
        "end with spaces   ",
        "\n",
        " \n x",
        "a\r\n\r\n\r\nb",
        "a \n\n  b",
        "x  \n  \t\n y",
        "!!!\n\n\nword",
        scanner_checks::PUNCTUATION_RUNS,
        " !!!\r\nword",
        "\u{85}\u{2028}\u{2029}x \u{b}\u{c}y",
        "\u{301}abc \u{301}\u{301}",
        "ǅungla ß ʰ",
        // ASCII runs (longer than 8 bytes too) that run into longer characters.
        "abcdefghijé abcdefghij\u{301} abcdefgh日本 abcdefghij² abcdefghij\u{a0}x (abcdefghijé",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ@[`{abcdefghijklmnopqrstuvwxyz abcdefg×yz abcdefg\u{2003}x",
        "0123456789٣٤ 12345678Ⅻ !!!!!!!!!!é ........\u{301} ?????????\u{a0} ×é \u{a0}é",
        "          \u{3000}  x         \u{85}x\n\n\n\n\n\n\n\n\n\ny \t\t\t\t\t\t\t\t\t!",
        "    \n        \r\n\t  foo \u{2028}\n\u{2029}  x  \u{85}  \r  x\r\n",
        "         ",
        "x         ",
        "'sa 'tt 'rev 'vee 'mm 'lll 'dd 'r 'v 'l 'S 'RE 'LL 'ſ 'ſa 'Rx 'vE 'lL 'é '\u{301}",
        "x'\ny'\r\n'' '' '\t .'s ('t",
    ];

    #[test]
    fn matches_hf_on_the_hard_cases() {
        for pattern in [CL100K_PATTERN, QWEN2_PATTERN] {
            for text in HARD_CASES {
                assert_eq!(ours(pattern, text), hf(pattern, text), "{text:?}");
            }
        }
    }

    #[test]
    fn other_patterns_have_no_scanner() {
        assert!(Cl100kSplitter::for_pattern(r"\s+|\S+").is_none());
        assert!(Cl100kSplitter::for_pattern(super::super::gpt2_split::GPT2_PATTERN).is_none());
    }

    /// The hand-back bound is safe: up to it, HF's regex never gives up on a whitespace run, in
    /// the shapes that make it backtrack through the whole run.
    #[test]
    fn regex_does_not_give_up_below_the_scanned_run_limit() {
        for pattern in [CL100K_PATTERN, QWEN2_PATTERN] {
            for unit in [" ", "\t", "\u{a0}"] {
                // The longest run the scanner keeps (the leading "\n" joins the run).
                let run = unit.repeat((SCANNED_RUN_LIMIT - 1) / unit.len());
                for text in [
                    format!("{run}x"),
                    format!("\n{run}x"),
                    format!("x{run}"),
                    format!("!{run}1"),
                ] {
                    let covered: usize = hf(pattern, &text).iter().map(|(s, e)| e - s).sum();
                    assert_eq!(covered, text.len(), "{pattern} gave up on {unit:?}");
                    assert_eq!(ours(pattern, &text), hf(pattern, &text));
                    // GPT-2's pattern (its scanner uses the same bound).
                    let gpt2 =
                        SysRegex::new(super::super::gpt2_split::GPT2_PATTERN).expect("compiles");
                    let covered: usize = gpt2.find_iter(&text).map(|(s, e)| e - s).sum();
                    assert_eq!(covered, text.len(), "GPT-2's pattern gave up on {unit:?}");
                }
            }
        }
    }

    #[test]
    fn longer_runs_are_handed_back() {
        let splitter = &SCANNERS[0];
        let text = format!("a{}b", " ".repeat(SCANNED_RUN_LIMIT + 1));
        let found: Vec<_> = splitter.find_iter(&text).collect();
        assert_eq!(found, [Ok((0, 1)), Err(HandBack)]);
    }

    fn character() -> impl Strategy<Value = char> {
        prop_oneof![
            // Whitespace kinds, CR/LF runs.
            prop::sample::select(vec![
                ' ', '\n', '\r', '\t', '\u{b}', '\u{c}', '\u{85}', '\u{a0}', '\u{1680}',
                '\u{2003}', '\u{2028}', '\u{2029}', '\u{3000}'
            ]),
            // Apostrophes and the letters of the contractions, in every case (and ſ, K).
            prop::sample::select(vec![
                '\'', '\'', 's', 'S', 'ſ', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l',
                'L', 'd', 'D', 'k', '\u{212a}'
            ]),
            // Letters with and without case, marks, numbers of every kind, other characters.
            prop::sample::select(vec![
                'a', 'Z', 'é', 'ǅ', 'ß', 'ʰ', '日', '한', 'ا', 'क', '\u{301}', '\u{94d}',
                '\u{e01}', '0', '7', '٣', '२', '²', 'Ⅻ', '½', '𝟙', '.', '!', '-', '_', '$', '😀',
                '\u{200d}', '\u{0}', '\u{FFFD}'
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn matches_hf_on_random_text(text in scanner_checks::text_of(character())) {
            for pattern in [CL100K_PATTERN, QWEN2_PATTERN] {
                prop_assert_eq!(ours(pattern, &text), hf(pattern, &text));
            }
        }

        #[test]
        fn matches_hf_on_text_with_ascii_stretches(
            text in scanner_checks::text_with_ascii_stretches(character()))
        {
            for pattern in [CL100K_PATTERN, QWEN2_PATTERN] {
                prop_assert_eq!(ours(pattern, &text), hf(pattern, &text));
            }
        }

        #[test]
        fn matches_hf_on_digit_runs(digits in proptest::collection::vec(
            prop::sample::select(vec!['1', '٣', '²', 'Ⅻ', ' ', 'a', ',']), 0..20)
            .prop_map(|cs| cs.into_iter().collect::<String>()))
        {
            for pattern in [CL100K_PATTERN, QWEN2_PATTERN] {
                prop_assert_eq!(ours(pattern, &digits), hf(pattern, &digits));
            }
        }
    }
}
