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

use super::char_classes::{CharClasses, HandBack, Kind, SCANNED_RUN_LIMIT, contains, ranges, tile};

/// The cl100k / Llama 3 pattern, as Llama 3's `tokenizer.json` writes it.
pub(crate) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2/2.5/3 pattern: one number character per match.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The contractions of the first alternative, in its order (none is a prefix of a later one).
const CONTRACTIONS: [&str; 7] = ["s", "t", "re", "ve", "m", "ll", "d"];

pub(crate) struct Cl100kSplitter {
    classes: CharClasses,
    /// Most number characters in one match: 3 for cl100k and Llama 3, 1 for Qwen.
    max_digits: usize,
    /// For each contraction, per letter, the characters `(?i:x)` matches (e.g. `s`: s, S, ſ).
    contractions: Vec<Vec<Vec<(u32, u32)>>>,
}

fn is_cr_or_lf(c: char) -> bool {
    c == '\r' || c == '\n'
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
        let contractions = CONTRACTIONS
            .iter()
            .map(|suffix| {
                suffix
                    .chars()
                    .map(|letter| ranges(&format!("(?i:{letter})")))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            classes: CharClasses::new()?,
            max_digits,
            contractions,
        })
    }

    /// Byte length of the contraction (after the apostrophe) `rest` starts with, if any.
    fn contraction(&self, rest: &str) -> Option<usize> {
        self.contractions.iter().find_map(|letters| {
            let mut len = 0;
            let mut chars = rest.chars();
            for class in letters {
                let c = chars.next()?;
                if !contains(class, u32::from(c)) {
                    return None;
                }
                len += c.len_utf8();
            }
            Some(len)
        })
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let rest = &text[start..];
        let Some(c) = rest.chars().next() else {
            return Ok(start);
        };
        let width = c.len_utf8();
        let kind = self.classes.kind(c);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\''
            && let Some(len) = self.contraction(&rest[1..])
        {
            return Ok(start + 1 + len);
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if kind == Kind::Letter {
            return Ok(start + self.classes.run(rest, Kind::Letter));
        }
        // Letter runs (the common case) are done; the rest looks one character ahead.
        let next_kind = rest[width..].chars().next().map(|n| self.classes.kind(n));
        if kind != Kind::Number && !is_cr_or_lf(c) && next_kind == Some(Kind::Letter) {
            return Ok(start + width + self.classes.run(&rest[width..], Kind::Letter));
        }
        // \p{N}{1,3} (or \p{N})
        if kind == Kind::Number {
            let end = rest
                .char_indices()
                .take(self.max_digits)
                .take_while(|&(_, n)| self.classes.kind(n) == Kind::Number)
                .last()
                .map_or(width, |(i, n)| i + n.len_utf8());
            return Ok(start + end);
        }
        //  ?[^\s\p{L}\p{N}]+[\r\n]*
        let body = if c == ' ' && next_kind == Some(Kind::Other) {
            1
        } else {
            0
        };
        if kind == Kind::Other || body == 1 {
            let end = body + self.classes.run(&rest[body..], Kind::Other);
            let newlines = rest[end..]
                .find(|n: char| !is_cr_or_lf(n))
                .unwrap_or(rest.len() - end);
            return Ok(start + end + newlines);
        }
        // Whitespace from here on. The regex walks the whole run for the next three.
        let run = self.classes.run(rest, Kind::Space);
        if run > SCANNED_RUN_LIMIT {
            return Err(HandBack);
        }
        let spaces = &rest[..run];
        // \s*[\r\n]+ : \s* gives back characters until a CR or LF can follow, so the match ends
        // just after the run's last CR or LF (no CR or LF follows it inside the run).
        if let Some(last) = spaces.rfind(is_cr_or_lf) {
            return Ok(start + last + 1);
        }
        // \s+(?!\S) : the run, less its last character when a non-space follows and that leaves
        // at least one; else \s+ : the single whitespace character.
        if run == rest.len() {
            return Ok(start + run);
        }
        let last = spaces.chars().next_back().map_or(0, char::len_utf8);
        Ok(start + if run > last { run - last } else { run })
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
        " !!!\r\nword",
        "\u{85}\u{2028}\u{2029}x \u{b}\u{c}y",
        "\u{301}abc \u{301}\u{301}",
        "ǅungla ß ʰ",
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
        fn matches_hf_on_random_text(text in proptest::collection::vec(character(), 0..48)
            .prop_map(|cs| cs.into_iter().collect::<String>()))
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
