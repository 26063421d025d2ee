//! The o200k family of pre-tokenizer patterns as a hand-written scanner. OpenAI's o200k
//! (GPT-4o's `o200k_base`, gpt-oss's `o200k_harmony`) splits with
//!
//! ```text
//! [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! (one line in the file), and Mistral's Tekken (Mistral NeMo, Small 3, Pixtral) with the same
//! pattern without the two contractions and with `\p{N}` for `\p{N}{1,3}`. HF runs them with
//! fancy-regex: most of the fast path's time on these vocabularies. Call the first bracket class
//! *upper* and the second *lower*; modifier and other letters and marks are in both. A word is
//! cut where a lower letter is followed by an upper one ("McDonald" is "Mc", "Donald"), and a
//! run of upper letters keeps the lower ones after it ("HTTPServer" is "HTTPServer"). The
//! scanner gives the same matches, leftmost-first, alternative by alternative, backtracking where
//! the regex backtracks (each step names the alternative it stands for). Every character starts
//! a match of some alternative, so the matches tile the text. Differential tests against HF's
//! own regex type check the two agree.

use super::char_classes::{
    CharClasses, HIGH_BITS, HandBack, ascii_in_range, ascii_punctuation_end, ascii_run_end,
    is_cr_or_lf, tile,
};
use super::class_table::ClassTable;
use super::contractions::Contractions;

/// o200k's pattern, as its `tokenizer.json` writes it.
pub(crate) const O200K_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Tekken's pattern (Mistral NeMo's `tokenizer.json`): no contractions, one number character per
/// match.
pub(crate) const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which class a character is in (they are disjoint), as the table's byte.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Kind {
    /// none of the others: punctuation, symbols, controls that are not `\s`, ...
    Other = 0,
    /// `[\p{Lu}\p{Lt}]`: upper only
    Upper = 1,
    /// `\p{Ll}`: lower only
    Lower = 2,
    /// `[\p{Lm}\p{Lo}]`: upper and lower
    Both = 3,
    /// `\p{M}`: upper and lower, and no `\p{L}`
    Mark = 4,
    /// `\p{N}`
    Number = 5,
    /// `\s`
    Space = 6,
}

const KINDS: [Kind; 7] = [
    Kind::Other,
    Kind::Upper,
    Kind::Lower,
    Kind::Both,
    Kind::Mark,
    Kind::Number,
    Kind::Space,
];

impl Kind {
    fn of(byte: u8) -> Self {
        KINDS[usize::from(byte).min(KINDS.len() - 1)]
    }

    /// In `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
    fn is_upper(self) -> bool {
        matches!(self, Self::Upper | Self::Both | Self::Mark)
    }

    /// In `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
    fn is_lower(self) -> bool {
        matches!(self, Self::Lower | Self::Both | Self::Mark)
    }

    /// In `[^\s\p{L}\p{N}]`.
    fn is_other_or_mark(self) -> bool {
        matches!(self, Self::Other | Self::Mark)
    }
}

pub(crate) struct O200kSplitter {
    kinds: ClassTable,
    /// For whitespace runs (`\s` from the same tables).
    spaces: CharClasses,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` after a word: o200k's, not Tekken's.
    contractions: Option<Contractions>,
    /// Most number characters in one match: 3 for o200k, 1 for Tekken.
    max_digits: usize,
}

/// The end of the run of ASCII lower-case letters from byte `at` of `bytes`, 8 bytes at a time.
fn ascii_lower_end(bytes: &[u8], at: usize) -> usize {
    let stops = |chunk: u64| !ascii_in_range(chunk, b'a', b'z') & HIGH_BITS;
    ascii_run_end(bytes, at, stops, |b| b.is_ascii_lowercase())
}

impl O200kSplitter {
    /// The scanner for `pattern` if it is one of the family's patterns.
    pub(crate) fn for_pattern(pattern: &str) -> Option<Result<Self, String>> {
        let (contractions, max_digits) = match pattern {
            O200K_PATTERN => (true, 3),
            TEKKEN_PATTERN => (false, 1),
            _ => return None,
        };
        Some(Self::new(contractions, max_digits))
    }

    fn new(contractions: bool, max_digits: usize) -> Result<Self, String> {
        let kinds = ClassTable::new(&[
            (r"[\p{Lu}\p{Lt}]", Kind::Upper as u8),
            (r"\p{Ll}", Kind::Lower as u8),
            (r"[\p{Lm}\p{Lo}]", Kind::Both as u8),
            (r"\p{M}", Kind::Mark as u8),
            (r"\p{N}", Kind::Number as u8),
            (r"\s", Kind::Space as u8),
        ])?;
        // The short ways in `match_end` test ASCII letters by their case.
        for b in 0..128u8 {
            let kind = Kind::of(kinds.ascii(b));
            let by_case = if b.is_ascii_uppercase() {
                Kind::Upper
            } else if b.is_ascii_lowercase() {
                Kind::Lower
            } else {
                kind
            };
            if kind != by_case || matches!(kind, Kind::Both | Kind::Mark) {
                return Err(format!("the classes and ASCII case disagree on {b:#04x}"));
            }
        }
        Ok(Self {
            kinds,
            spaces: CharClasses::new()?,
            contractions: contractions.then(Contractions::new).transpose()?,
            max_digits,
        })
    }

    #[inline]
    fn kind_at(&self, text: &str, at: usize) -> Option<(Kind, usize)> {
        self.kinds
            .at(text, at)
            .map(|(byte, width)| (Kind::of(byte), width))
    }

    /// The end of the run of characters of `kind`-class `class` from byte `at` of `text`.
    #[inline]
    fn run_end(&self, text: &str, mut at: usize, class: impl Fn(Kind) -> bool) -> usize {
        while let Some((kind, width)) = self.kind_at(text, at)
            && class(kind)
        {
            at += width;
        }
        at
    }

    /// The end of the lower run from byte `at` (ASCII 8 bytes at a time), and of the contraction
    /// after it if one follows: the end of the first two alternatives once their lower part
    /// starts at `at`.
    #[inline]
    fn lower_then_contraction_end(&self, text: &str, mut at: usize) -> usize {
        loop {
            at = ascii_lower_end(text.as_bytes(), at);
            match self.kind_at(text, at) {
                Some((kind, width)) if kind.is_lower() => at += width,
                _ => break,
            }
        }
        self.contraction_end(text, at)
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at byte `at`: the end of the contraction there, or `at`
    /// (always `at` for a pattern without contractions).
    #[inline]
    fn contraction_end(&self, text: &str, at: usize) -> usize {
        if let Some(contractions) = &self.contractions
            && text.as_bytes().get(at) == Some(&b'\'')
        {
            return contractions.after_apostrophe(text, at + 1).unwrap_or(at);
        }
        at
    }

    /// The first alternative without its optional first character, from byte `at`:
    /// `upper* lower+ contraction?`. The regex takes the longest upper run, then gives back one
    /// character at a time until a lower character can follow: the character after the run if
    /// it is lower, else the run's last character that is lower too (a modifier or other letter,
    /// or a mark), else none and no match.
    fn upper_lower_end(&self, text: &str, at: usize) -> Option<usize> {
        let mut end = at;
        let mut last_lower = None;
        while let Some((kind, width)) = self.kind_at(text, end)
            && kind.is_upper()
        {
            if kind.is_lower() {
                last_lower = Some(end);
            }
            end += width;
        }
        let lower = match self.kind_at(text, end) {
            Some((Kind::Lower, _)) => end,
            _ => last_lower?,
        };
        Some(self.lower_then_contraction_end(text, lower))
    }

    /// The second alternative without its optional first character, from byte `at`:
    /// `upper+ lower* contraction?`.
    fn upper_end(&self, text: &str, at: usize) -> Option<usize> {
        let end = self.run_end(text, at, Kind::is_upper);
        (end > at).then(|| self.lower_then_contraction_end(text, end))
    }

    /// The end (byte offset) of the match that starts at `start` (a char boundary before the end).
    /// The commonest shapes, ASCII `word`, `Word` and ` word` (or `(Word`, `.word`, ...), take a
    /// short way; [`Self::any_match_end`] takes every shape.
    #[inline]
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let bytes = text.as_bytes();
        let mut at = start;
        // [^\r\n\p{L}\p{N}]? as one ASCII character before an ASCII letter.
        if let Some(&b) = bytes.get(at)
            && !b.is_ascii_alphanumeric()
            && b.is_ascii()
            && !is_cr_or_lf(b)
            && bytes.get(at + 1).is_some_and(u8::is_ascii_alphabetic)
        {
            at += 1;
        }
        match bytes.get(at) {
            Some(b) if b.is_ascii_lowercase() => Ok(self.lower_then_contraction_end(text, at + 1)),
            Some(b)
                if b.is_ascii_uppercase()
                    && bytes.get(at + 1).is_some_and(u8::is_ascii_lowercase) =>
            {
                Ok(self.lower_then_contraction_end(text, at + 2))
            }
            _ => match ascii_punctuation_end(bytes, start, |b| matches!(b, b'\r' | b'\n' | b'/')) {
                Some(end) => Ok(end),
                None => self.any_match_end(text, start),
            },
        }
    }

    #[inline(never)]
    fn any_match_end(&self, text: &str, start: usize) -> Result<usize, HandBack> {
        let bytes = text.as_bytes();
        let Some((kind, width)) = self.kind_at(text, start) else {
            return Ok(start);
        };
        let first = bytes[start];
        // The first two alternatives. The regex tries each with the optional
        // [^\r\n\p{L}\p{N}] taken (when this character is one), then without it; without it
        // they need a letter or mark here, with it one next.
        let after = start + width;
        let next = self.kind_at(text, after);
        let starts_word = |kind: Kind| kind.is_upper() || kind.is_lower();
        let optional =
            matches!(kind, Kind::Other | Kind::Mark | Kind::Space) && !is_cr_or_lf(first);
        let word_end = if starts_word(kind) {
            // A mark is both: taken as the optional character first. Without it the first
            // alternative always matches a mark, so the second is tried only after a letter.
            (kind == Kind::Mark)
                .then(|| self.upper_lower_end(text, after))
                .flatten()
                .or_else(|| self.upper_lower_end(text, start))
                .or_else(|| self.upper_end(text, start))
        } else if optional && next.is_some_and(|(next, _)| starts_word(next)) {
            self.upper_lower_end(text, after)
                .or_else(|| self.upper_end(text, after))
        } else {
            None
        };
        if let Some(end) = word_end {
            return Ok(end);
        }
        // \p{N}{1,3} (o200k), \p{N} (Tekken)
        if kind == Kind::Number {
            let mut end = after;
            for _ in 1..self.max_digits {
                match self.kind_at(text, end) {
                    Some((Kind::Number, width)) => end += width,
                    _ => break,
                }
            }
            return Ok(end);
        }
        //  ?[^\s\p{L}\p{N}]+[\r\n/]*
        let body = match next {
            Some((next, _)) if first == b' ' && next.is_other_or_mark() => Some(after),
            _ if kind.is_other_or_mark() => Some(start),
            _ => None,
        };
        if let Some(body) = body {
            let mut end = self.run_end(text, body, Kind::is_other_or_mark);
            while matches!(bytes.get(end), Some(b'\r' | b'\n' | b'/')) {
                end += 1;
            }
            return Ok(end);
        }
        // \s*[\r\n]+|\s+(?!\S)|\s+ : a whitespace character starts the match.
        self.spaces.newline_or_spaces_end(text, start)
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

    /// A pattern of the family with HF's regex for it and the scanner, built once: compiling the
    /// regex and the class tables per case would dominate the tests.
    struct Variant {
        name: &'static str,
        regex: SysRegex,
        scanner: O200kSplitter,
    }

    static VARIANTS: LazyLock<Vec<Variant>> = LazyLock::new(|| {
        [("o200k", O200K_PATTERN), ("Tekken", TEKKEN_PATTERN)]
            .into_iter()
            .map(|(name, pattern)| Variant {
                name,
                regex: SysRegex::new(pattern).expect("compiles"),
                scanner: O200kSplitter::for_pattern(pattern)
                    .expect("a pattern of the family")
                    .expect("tables"),
            })
            .collect()
    });

    fn variant(name: &str) -> &'static Variant {
        VARIANTS.iter().find(|v| v.name == name).expect("known")
    }

    fn hf(variant: &Variant, text: &str) -> Vec<(usize, usize)> {
        variant.regex.find_iter(text).collect()
    }

    fn ours(variant: &Variant, text: &str) -> Vec<(usize, usize)> {
        variant
            .scanner
            .find_iter(text)
            .collect::<Result<_, _>>()
            .expect("no hand-back")
    }

    fn pieces<'t>(variant: &Variant, text: &'t str) -> Vec<&'t str> {
        ours(variant, text)
            .into_iter()
            .map(|(s, e)| &text[s..e])
            .collect()
    }

    /// Each variant's matches against HF's on `text`.
    fn check(text: &str) -> Result<(), TestCaseError> {
        for variant in VARIANTS.iter() {
            prop_assert_eq!(ours(variant, text), hf(variant, text), "{}", variant.name);
        }
        Ok(())
    }

    const HARD_CASES: &[&str] = &[
        "",
        " ",
        "  ",
        "hello world",
        "Hello World HELLO WORLD hELLO",
        "McDonald HTTPServer iPhone XMLHttpRequest camelCase snake_case ABCdef",
        "don't DON'T Don't we've I'll they'd 'S 'x ' I'M YOU'RE HE'D IT'S 'ſ 'Ll 's",
        "x\n\ny\t\tz\r\n",
        "a \u{a0}b\u{3000} c\u{2003}\u{2003}d",
        "12.5% of 1,000,000 — ²³ Ⅻ ٣٤٥ 1234567890",
        "naïve café e\u{301} 日本語 😀😀 !!",
        "\u{301}ABC! \u{301}abc \u{301}\u{301} A\u{301}B \u{301}Ab",
        "ǅungla ǅ ß ʰ ʰA Aʰ AʰB ʰa 日A A日 A日b 한국어 ا ক্ষ",
        "path/to/file.txt a//b !\n/ x/\r\n/y <br/>\n",
        scanner_checks::PUNCTUATION_RUNS,
        " ' '' ''s 's' '123 (hello .com (Hello (HELLO",
        "tab\t!\n?  ?",
        "end with spaces   ",
        "\n",
        " \n x",
        "a\r\n\r\n\r\nb",
        "!!!\n\n\nword",
        "\u{85}\u{2028}\u{2029}x \u{b}\u{c}y",
        "\u{0}\u{0}a \u{1}\u{200b}\u{200d}x \u{ad}y co\u{ad}op",
        "abcdefghijé abcdefghij\u{301} abcdefgh日本 abcdefghij² abcdefghij\u{a0}x (abcdefghijé",
        "ABCDEFGHIJé ABCDEFGHIJKLMNOPabcdefghijklmnopQRST abcdefghijklmnopQ",
        "          \u{3000}  x         \u{85}x\n\n\n\n\n\n\n\n\n\ny \t\t\t\t\t\t\t\t\t!",
        "𝐀𝐁𝐂 𝐚𝐛𝐜 𝐀𝐛 𝟙𝟚𝟛𝟜 😀a",
    ];

    #[test]
    fn matches_hf_on_the_hard_cases() {
        for text in HARD_CASES {
            check(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        }
    }

    /// The pieces spelled out, for a reader (and against a reference that agrees by accident).
    #[test]
    fn cuts_words_by_case() {
        let text = "McDonald's HTTPServer (iPhone) DON'T \u{301}ABC!";
        assert_eq!(
            pieces(variant("o200k"), text),
            [
                "Mc",
                "Donald's",
                " HTTPServer",
                " (",
                "i",
                "Phone",
                ")",
                " DON'T",
                " \u{301}",
                "ABC",
                "!"
            ]
        );
    }

    /// Tekken keeps no contraction with its word and cuts numbers a character at a time.
    #[test]
    fn tekken_cuts_contractions_and_digits_apart() {
        let text = "McDonald's DON'T 2024, 12.5";
        assert_eq!(
            pieces(variant("Tekken"), text),
            [
                "Mc", "Donald", "'s", " DON", "'T", " ", "2", "0", "2", "4", ",", " ", "1", "2",
                ".", "5"
            ]
        );
        assert_eq!(
            pieces(variant("o200k"), text),
            [
                "Mc", "Donald's", " DON'T", " ", "202", "4", ",", " ", "12", ".", "5"
            ]
        );
    }

    #[test]
    fn other_patterns_have_no_scanner() {
        assert!(O200kSplitter::for_pattern(r"\s+|\S+").is_none());
        assert!(O200kSplitter::for_pattern(super::super::cl100k_split::CL100K_PATTERN).is_none());
        // o200k's contractions with one digit per match: not a pattern any file uses.
        let mixed = O200K_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}");
        assert!(O200kSplitter::for_pattern(&mixed).is_none());
    }

    #[test]
    fn long_runs_match_hf_up_to_the_limit_and_are_handed_back_past_it() {
        for variant in VARIANTS.iter() {
            scanner_checks::assert_long_runs(
                &[" ", "\t", "\u{a0}", "A", "a", "\u{301}", "ʰ", "!", "/", "1"],
                &[("A", "!")],
                |text| variant.scanner.find_iter(text).collect(),
                |text| hf(variant, text),
            );
        }
    }

    fn character() -> impl Strategy<Value = char> {
        prop_oneof![
            scanner_checks::whitespace(),
            // Apostrophes and the letters of the contractions, in every case (and ſ, K).
            prop::sample::select(vec![
                '\'', '\'', 's', 'S', 'ſ', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l',
                'L', 'd', 'D', 'k', '\u{212a}'
            ]),
            // Upper, lower, title, modifier and other letters; marks; numbers; the rest.
            prop::sample::select(vec![
                'a', 'Z', 'é', 'É', 'ǅ', 'ß', 'ʰ', 'ˆ', '日', '한', 'ا', '\u{301}', '\u{94d}',
                '\u{e01}', '0', '7', '٣', '²', 'Ⅻ', '𝟙', '𝐀', '𝐚', '.', '!', '/', '(', '_', '$',
                '😀', '\u{200d}', '\u{0}', '\u{ad}', '\u{FFFD}'
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn matches_hf_on_random_text(text in scanner_checks::text_of(character())) {
            check(&text)?;
        }

        #[test]
        fn matches_hf_on_text_with_ascii_stretches(
            text in scanner_checks::text_with_ascii_stretches(character()))
        {
            check(&text)?;
        }

        /// Upper-case runs and the lower-case letters after them, ASCII and not.
        #[test]
        fn matches_hf_on_cased_words(text in proptest::collection::vec(prop_oneof![
            "[A-Z]{1,12}[a-z]{0,12}",
            character().prop_map(String::from),
        ], 0..16).prop_map(|pieces| pieces.concat()))
        {
            check(&text)?;
        }

        #[test]
        fn matches_hf_on_cased_runs(text in proptest::collection::vec(
            prop::sample::select(vec!['A', 'b', 'ǅ', 'ʰ', '日', '\u{301}', '\'', 's', ' ', '1', '!']),
            0..20).prop_map(|cs| cs.into_iter().collect::<String>()))
        {
            check(&text)?;
        }
    }
}
