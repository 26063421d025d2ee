//! DeepSeek V3's pre-tokenizer as one hand-written scanner. Its `tokenizer.json` cuts a text with
//! three regex Splits, each `Isolated` (matches and the gaps between them are all pieces), each
//! applied to every piece the one before made:
//!
//! ```text
//! 1. \p{N}{1,3}
//! 2. [一-龥぀-ゟ゠-ヿ]+
//! 3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! HF runs the third with fancy-regex and all three one piece at a time, which is most of the
//! fast path's time on this vocabulary. The scanner gives the same pieces in one pass: the first
//! two splits make *segments* (a group of up to three numbers; a run of the CJK class; a run of
//! everything else), and the third pattern's matches and gaps within each segment are the pieces.
//! A number is never in the CJK class (checked when the tables are built), so a run of the CJK
//! class never holds one. In a group of numbers the third pattern matches nothing (no number is a
//! letter, mark, punctuation, symbol or space), so the group is one piece. Differential tests
//! against HF's own regex type, split after split, check the two agree.

use super::char_classes::{
    CharClasses, HIGH_BITS, HandBack, ascii_in_range, ascii_letters_end, ascii_punctuation_end,
    ascii_run_end, is_cr_or_lf, ranges,
};
use super::class_table::ClassTable;

/// The first split: groups of up to three number characters.
pub(crate) const DEEPSEEK_DIGITS: &str = r"\p{N}{1,3}";
/// The second split: runs of CJK ideographs and kana.
pub(crate) const DEEPSEEK_CJK: &str = "[一-龥぀-ゟ゠-ヿ]+";
/// The third split, as DeepSeek V3's `tokenizer.json` writes it (with CR and LF characters, not
/// escapes, inside its classes).
pub(crate) const DEEPSEEK_PATTERN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/// Which of the third pattern's classes a character is in (they are disjoint), with the first
/// split's numbers as a class of their own. One byte per character, with [`CJK`] added.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Kind {
    /// none of the others
    Other = 0,
    /// `[\p{L}\p{M}]`
    Word = 1,
    /// `[\p{P}\p{S}]`
    Punct = 2,
    /// `\s`
    Space = 3,
    /// `\p{N}`
    Number = 4,
}

/// Added to a character's [`Kind`] byte when it is in the second split's class.
const CJK: u8 = 8;

const KINDS: [Kind; 5] = [
    Kind::Other,
    Kind::Word,
    Kind::Punct,
    Kind::Space,
    Kind::Number,
];

fn kind_of(class: u8) -> Kind {
    KINDS[usize::from(class & 7).min(KINDS.len() - 1)]
}

/// The segment a character starts (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Segment {
    Numbers,
    Cjk,
    Plain,
}

fn segment_of(class: u8) -> Segment {
    if kind_of(class) == Kind::Number {
        Segment::Numbers
    } else if class & CJK != 0 {
        Segment::Cjk
    } else {
        Segment::Plain
    }
}

/// The end of the run of ASCII characters other than digits from byte `at` of `bytes`, 8 bytes
/// at a time.
fn ascii_non_digits_end(bytes: &[u8], at: usize) -> usize {
    let stops = |chunk: u64| (chunk & HIGH_BITS) | ascii_in_range(chunk, b'0', b'9');
    ascii_run_end(bytes, at, stops, |b| b.is_ascii() && !b.is_ascii_digit())
}

pub(crate) struct DeepSeekSplitter {
    /// Each character's [`Kind`], with [`CJK`] added.
    classes: ClassTable,
    /// For whitespace runs (`\s` from the same tables).
    spaces: CharClasses,
}

impl DeepSeekSplitter {
    /// The scanner for these splits (each: pattern, keeps matches, keeps gaps), if they are
    /// DeepSeek V3's.
    pub(crate) fn for_splits(splits: &[(&str, bool, bool)]) -> Option<Result<Self, String>> {
        let deepseek = [DEEPSEEK_DIGITS, DEEPSEEK_CJK, DEEPSEEK_PATTERN].map(|p| (p, true, true));
        (splits == deepseek).then(Self::new)
    }

    fn new() -> Result<Self, String> {
        let mut classes = ClassTable::new(&[
            (r"[\p{L}\p{M}]", Kind::Word as u8),
            (r"[\p{P}\p{S}]", Kind::Punct as u8),
            (r"\s", Kind::Space as u8),
            (r"\p{N}", Kind::Number as u8),
        ])?;
        // The first alternative's class, ASCII punctuation, is the ASCII part of the third
        // class: `match_end` tells the two apart by the table.
        if let Some(b) = (0..128u8)
            .find(|&b| (classes.ascii(b) == Kind::Punct as u8) != b.is_ascii_punctuation())
        {
            return Err(format!(
                "[\\p{{P}}\\p{{S}}] and ASCII punctuation disagree on {b:#04x}"
            ));
        }
        let cjk_class = &DEEPSEEK_CJK[..DEEPSEEK_CJK.len() - 1];
        classes.add_flag(cjk_class, CJK)?;
        for c in ranges(cjk_class)?.into_iter().flat_map(|(lo, hi)| lo..=hi) {
            let c = char::from_u32(c).ok_or("a class holds a surrogate")?;
            if kind_of(classes.of(c)) == Kind::Number {
                return Err(format!("{cjk_class} holds the number {c:?}"));
            }
        }
        Ok(Self {
            classes,
            spaces: CharClasses::new()?,
        })
    }

    /// The class byte and byte width of the character at byte `at` of `text` (a char
    /// boundary), or `None` at the end.
    #[inline]
    fn class_at(&self, text: &str, at: usize) -> Option<(u8, usize)> {
        self.classes.at(text, at)
    }

    fn kind_at(&self, text: &str, at: usize) -> Option<(Kind, usize)> {
        self.class_at(text, at)
            .map(|(class, width)| (kind_of(class), width))
    }

    /// The end of the segment that starts at byte `start` of `text` (a char boundary before the
    /// end): up to three numbers, or the run of characters that start the same kind of segment.
    fn segment_end(&self, text: &str, start: usize) -> usize {
        let Some((class, width)) = self.class_at(text, start) else {
            return start;
        };
        let segment = segment_of(class);
        let mut end = start + width;
        let mut numbers = 1;
        let bytes = text.as_bytes();
        loop {
            // Plain ASCII other than digits, the bulk of most texts, 8 bytes at a time.
            if segment == Segment::Plain {
                end = ascii_non_digits_end(bytes, end);
            }
            match self.class_at(text, end) {
                Some((class, width)) if segment_of(class) == segment => {
                    if segment == Segment::Numbers {
                        if numbers == 3 {
                            return end;
                        }
                        numbers += 1;
                    }
                    end += width;
                }
                _ => return end,
            }
        }
    }

    /// The end of the run of `[\p{L}\p{M}]` from byte `at` of `segment`: ASCII letters 8 bytes at
    /// a time, other characters looked up.
    #[inline]
    fn word_end(&self, segment: &str, mut at: usize) -> usize {
        loop {
            at = ascii_letters_end(segment.as_bytes(), at);
            match self.kind_at(segment, at) {
                Some((Kind::Word, width)) => at += width,
                _ => return at,
            }
        }
    }

    /// The end of the run of `[\p{P}\p{S}]` from byte `at` of `segment`.
    fn punct_end(&self, segment: &str, mut at: usize) -> usize {
        while let Some((Kind::Punct, width)) = self.kind_at(segment, at) {
            at += width;
        }
        at
    }

    /// The end of the third pattern's match that starts at byte `start` of `segment` (a char
    /// boundary before its end), `None` if none starts there. The first alternative (ASCII only),
    /// the commonest shapes, ASCII `word` and ` word`, and runs of ASCII punctuation take a short
    /// way; [`Self::any_match_end`] takes every other shape.
    #[inline]
    fn match_end(&self, segment: &str, start: usize) -> Result<Option<usize>, HandBack> {
        let bytes = segment.as_bytes();
        let Some(&b) = bytes.get(start) else {
            return Ok(None);
        };
        if b.is_ascii_alphabetic() {
            return Ok(Some(self.word_end(segment, start + 1)));
        }
        if b.is_ascii() && bytes.get(start + 1).is_some_and(u8::is_ascii_alphabetic) {
            // An ASCII character before an ASCII letter: punctuation starts the first
            // alternative; anything else but CR and LF (a space, a control) the second.
            if kind_of(self.classes.ascii(b)) == Kind::Punct {
                return Ok(Some(ascii_letters_end(bytes, start + 2)));
            }
            if b != b'\r' && b != b'\n' {
                return Ok(Some(self.word_end(segment, start + 2)));
            }
        }
        // ` ?[\p{P}\p{S}]+[\r\n]*` over ASCII (runs in code: " =", "):", "(").
        if let Some(end) = ascii_punctuation_end(bytes, start, is_cr_or_lf) {
            return Ok(Some(end));
        }
        self.any_match_end(segment, start)
    }

    #[inline(never)]
    fn any_match_end(&self, segment: &str, start: usize) -> Result<Option<usize>, HandBack> {
        let bytes = segment.as_bytes();
        let Some((kind, width)) = self.kind_at(segment, start) else {
            return Ok(None);
        };
        let first = bytes[start];
        let next = self.kind_at(segment, start + width);
        // The first alternative, ASCII punctuation before ASCII letters, `match_end` has taken.
        // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : from a letter or mark the run is the same with
        // or without it taken as the optional character.
        if kind == Kind::Word {
            return Ok(Some(self.word_end(segment, start + width)));
        }
        if let Some((Kind::Word, next_width)) = next
            && kind != Kind::Punct
            && !is_cr_or_lf(first)
        {
            return Ok(Some(self.word_end(segment, start + width + next_width)));
        }
        //  ?[\p{P}\p{S}]+[\r\n]*
        let body = match next {
            _ if kind == Kind::Punct => Some(start),
            Some((Kind::Punct, _)) if first == b' ' => Some(start + 1),
            _ => None,
        };
        if let Some(body) = body {
            let mut end = self.punct_end(segment, body);
            while bytes.get(end).is_some_and(|&b| is_cr_or_lf(b)) {
                end += 1;
            }
            return Ok(Some(end));
        }
        if kind == Kind::Space {
            return self.spaces.newline_or_spaces_end(segment, start).map(Some);
        }
        Ok(None)
    }

    /// Every piece of `text` the three splits make, in order: `(start, end)` byte ranges that tile
    /// the text, or [`HandBack`] where HF's regexes themselves must cut it.
    pub(crate) fn find_iter<'a>(&'a self, text: &'a str) -> Pieces<'a> {
        Pieces {
            scanner: self,
            text,
            segment: "",
            offset: 0,
            at: 0,
            pending: None,
        }
    }
}

/// The iterator [`DeepSeekSplitter::find_iter`] returns.
pub(crate) struct Pieces<'a> {
    scanner: &'a DeepSeekSplitter,
    text: &'a str,
    /// The current segment, which starts at byte `offset` of the text.
    segment: &'a str,
    offset: usize,
    /// Where the next piece starts in the segment.
    at: usize,
    /// A match found at the end of a gap, given after the gap.
    pending: Option<(usize, usize)>,
}

impl Iterator for Pieces<'_> {
    type Item = Result<(usize, usize), HandBack>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let offset = self.offset;
        if let Some((start, end)) = self.pending.take() {
            self.at = end;
            return Some(Ok((offset + start, offset + end)));
        }
        if self.at >= self.segment.len() {
            let next = offset + self.segment.len();
            if next >= self.text.len() {
                return None;
            }
            let end = self.scanner.segment_end(self.text, next);
            self.segment = self.text.get(next..end).unwrap_or_default();
            self.offset = next;
            self.at = 0;
            return self.next();
        }
        let (segment, start) = (self.segment, self.at);
        // The third pattern's match here, or the gap up to the next one (or the segment's end).
        let mut gap_end = start;
        while gap_end < segment.len() {
            match self.scanner.match_end(segment, gap_end) {
                Err(HandBack) => {
                    (self.segment, self.offset, self.at) = ("", self.text.len(), 0);
                    return Some(Err(HandBack));
                }
                Ok(Some(end)) if gap_end == start => {
                    self.at = end;
                    return Some(Ok((offset + start, offset + end)));
                }
                Ok(Some(end)) => {
                    self.pending = Some((gap_end, end));
                    break;
                }
                Ok(None) => {
                    gap_end += self
                        .scanner
                        .class_at(segment, gap_end)
                        .map_or(segment.len() - gap_end, |(_, width)| width);
                }
            }
        }
        self.at = gap_end;
        Some(Ok((offset + start, offset + gap_end)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::char_classes::scanner_checks;
    use super::*;
    use proptest::prelude::*;
    use tokenizers::utils::SysRegex;

    use std::sync::LazyLock;

    /// Built once: compiling the regexes and the class tables per case would dominate the tests.
    static REGEXES: LazyLock<[SysRegex; 3]> = LazyLock::new(|| {
        [DEEPSEEK_DIGITS, DEEPSEEK_CJK, DEEPSEEK_PATTERN]
            .map(|p| SysRegex::new(p).expect("compiles"))
    });
    static SCANNER: LazyLock<DeepSeekSplitter> = LazyLock::new(|| {
        let isolated = |p| (p, true, true);
        DeepSeekSplitter::for_splits(&[
            isolated(DEEPSEEK_DIGITS),
            isolated(DEEPSEEK_CJK),
            isolated(DEEPSEEK_PATTERN),
        ])
        .expect("DeepSeek V3's splits")
        .expect("tables")
    });

    /// HF's pieces: each split's regex over every piece the one before made, matches and gaps
    /// kept, empty ones dropped (HF's `Isolated` split).
    fn hf(text: &str) -> Vec<(usize, usize)> {
        let mut pieces = vec![(0, text.len())];
        for regex in REGEXES.iter() {
            let mut next = Vec::new();
            for (offset, end) in pieces {
                let piece = &text[offset..end];
                let mut previous = 0;
                for (start, end) in regex.find_iter(piece) {
                    next.push((offset + previous, offset + start));
                    next.push((offset + start, offset + end));
                    previous = end;
                }
                next.push((offset + previous, offset + piece.len()));
            }
            pieces = next.into_iter().filter(|(s, e)| s < e).collect();
        }
        pieces
    }

    fn ours(text: &str) -> Vec<(usize, usize)> {
        SCANNER
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
        "don't we've I'll they'd 'S 'x ' .com -foo_bar(x) a.b.c e.g. U.S.A.",
        "x\n\ny\t\tz\r\n",
        "a \u{a0}b\u{3000} c\u{2003}\u{2003}d",
        "12.5% of 1,000,000 — ²³ Ⅻ ٣٤٥ 1234567890 12345 a1b22c333d4444",
        "naïve café e\u{301} 日本語 😀😀 !!",
        "日本語のテキスト、カタカナ・ひらがな。ー゛゜゠ 漢字123かな abc日本",
        "中文文本，包含标点。「引号」和数字２０２４年 龥龦 㐀 〇",
        " ' '' ''s 's' '123 (hello .com",
        scanner_checks::PUNCTUATION_RUNS,
        "tab\t!\n?  ?",
        "end with spaces   ",
        "\n",
        " \n x",
        "a\r\n\r\n\r\nb",
        "!!!\n\n\nword",
        " !!!\r\nword",
        " «word» „x“ ·y· ¿z? a+b=c $5 €5 ^_^ ~~ `code`",
        "\u{85}\u{2028}\u{2029}x \u{b}\u{c}y",
        "\u{301}abc \u{301}\u{301} a\u{301}\u{302}b \t\u{301}",
        "\u{0}\u{0}a \u{1}\u{200b}\u{200d}x \u{ad}y co\u{ad}op \u{e000}\u{e000} \u{0}",
        "\u{200d}\u{200d}\u{200d}",
        "ǅungla ß ʰ",
        "abcdefghijé abcdefghij\u{301} abcdefgh日本 abcdefghij² abcdefghij\u{a0}x (abcdefghijé",
        ".abcdefghijé -ABCDEFGHIJ日 'abcdefghij1",
        "0123456789٣٤ 12345678Ⅻ !!!!!!!!!!é ........\u{301} ?????????\u{a0} ×é \u{a0}é",
        "          \u{3000}  x         \u{85}x\n\n\n\n\n\n\n\n\n\ny \t\t\t\t\t\t\t\t\t!",
        "    \n        \r\n\t  foo \u{2028}\n\u{2029}  x  \u{85}  \r  x\r\n",
        "  1  日  ",
        "x  \n 1",
        "𝟙𝟚𝟛𝟜 𝐀𝐁𝐂 𝄞 😀a 🏳\u{fe0f}\u{200d}🌈",
    ];

    #[test]
    fn matches_hf_on_the_hard_cases() {
        for text in HARD_CASES {
            assert_eq!(ours(text), hf(text), "{text:?}");
        }
    }

    /// Every byte value at every place in and past the first 8-byte chunk, and short tails.
    #[test]
    fn ascii_non_digit_runs_8_bytes_at_a_time_match_a_byte_loop() {
        for len in 0..20 {
            for place in 0..len {
                for b in 0..=255u8 {
                    let mut bytes = vec![b'q'; len];
                    bytes[place] = b;
                    for from in 0..len {
                        let expected = bytes[from..]
                            .iter()
                            .position(|b| !b.is_ascii() || b.is_ascii_digit())
                            .map_or(len, |i| from + i);
                        assert_eq!(ascii_non_digits_end(&bytes, from), expected, "{bytes:?}");
                    }
                }
            }
        }
    }

    /// The pieces spelled out, for a reader (and against a reference that agrees by accident).
    #[test]
    fn cuts_numbers_cjk_runs_and_words() {
        let text = "Call 1234567 .NET's 日本語、テスト。\u{0}\u{0}x  \n";
        let pieces: Vec<&str> = ours(text).into_iter().map(|(s, e)| &text[s..e]).collect();
        assert_eq!(
            pieces,
            [
                "Call",
                " ",
                "123",
                "456",
                "7",
                " .",
                "NET",
                "'s",
                " ",
                "日本語",
                "、",
                "テスト",
                "。",
                "\u{0}",
                "\u{0}x",
                "  \n"
            ]
        );
    }

    #[test]
    fn other_splits_have_no_scanner() {
        let isolated = |p| (p, true, true);
        assert!(DeepSeekSplitter::for_splits(&[isolated(DEEPSEEK_PATTERN)]).is_none());
        assert!(
            DeepSeekSplitter::for_splits(&[
                isolated(DEEPSEEK_DIGITS),
                isolated(DEEPSEEK_CJK),
                (DEEPSEEK_PATTERN, true, false),
            ])
            .is_none()
        );
    }

    /// The first alternative's class is ASCII punctuation exactly, as the scanner tests it.
    #[test]
    fn the_first_alternatives_class_is_ascii_punctuation() {
        let end = DEEPSEEK_PATTERN
            .find("][A-Za-z]+")
            .expect("the first alternative")
            + 1;
        let class = &DEEPSEEK_PATTERN[..end];
        let expected: Vec<u32> = (0..128u8)
            .filter(u8::is_ascii_punctuation)
            .map(u32::from)
            .collect();
        let found: Vec<u32> = ranges(class)
            .expect("a class")
            .into_iter()
            .flat_map(|(lo, hi)| lo..=hi)
            .collect();
        assert_eq!(found, expected, "{class}");
    }

    #[test]
    fn long_runs_match_hf_up_to_the_limit_and_are_handed_back_past_it() {
        scanner_checks::assert_long_runs(
            &[" ", "\t", "\u{a0}", "x", "\u{301}", "!", "日"],
            &[],
            |text| SCANNER.find_iter(text).collect(),
            hf,
        );
    }

    fn character() -> impl Strategy<Value = char> {
        prop_oneof![
            scanner_checks::whitespace(),
            // ASCII punctuation of the first alternative, and other punctuation and symbols.
            prop::sample::select(vec![
                '\'', '.', '-', '_', '(', '$', '+', '`', '~', '«', '、', '。', '・', '゠', '゛',
                '€', '×', '😀'
            ]),
            // Letters, marks, CJK and kana, numbers of every kind, format and control characters.
            prop::sample::select(vec![
                'a', 'Z', 's', 'é', 'ǅ', 'ß', 'ʰ', '日', '龥', '龦', 'の', 'カ', 'ー', 'ゟ', '한',
                'ا', '\u{301}', '\u{3099}', '0', '7', '٣', '²', 'Ⅻ', '〇', '𝟙', '\u{0}',
                '\u{200d}', '\u{ad}', '\u{e000}', '\u{FFFD}'
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn matches_hf_on_random_text(text in scanner_checks::text_of(character())) {
            prop_assert_eq!(ours(&text), hf(&text));
        }

        #[test]
        fn matches_hf_on_number_runs(text in proptest::collection::vec(
            prop::sample::select(vec!['1', '٣', '²', 'Ⅻ', '〇', '日', ' ', 'a', ',']), 0..20)
            .prop_map(|cs| cs.into_iter().collect::<String>()))
        {
            prop_assert_eq!(ours(&text), hf(&text));
        }

        #[test]
        fn matches_hf_on_text_with_ascii_stretches(
            text in scanner_checks::text_with_ascii_stretches(character()))
        {
            prop_assert_eq!(ours(&text), hf(&text));
        }
    }
}
