//! The one conformance harness: every scanner of the [`super::REGISTRY`] against HF's own regex
//! type (`tokenizers::utils::SysRegex`, fancy-regex, what HF cuts with) compiled from the row's
//! pattern, on the same texts: hard cases, random texts drawn to hit every class the patterns
//! tell apart, and whitespace runs up to and past the hand-back bound. A new scanner is a file
//! and a registry row; it is checked here with no test code of its own.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokenizers::utils::SysRegex;

use super::{HandBack, REGISTRY, SCANNED_RUN_LIMIT, Scanner, find_iter};

/// Texts that sit on the patterns' edges: contractions in every case, whitespace runs before a
/// word and at the end, CR/LF runs, Unicode spaces, numbers of every kind, marks, letters without
/// case, emoji, and ASCII runs (longer than 8 bytes too) that run into longer characters.
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
    "abcdefghijé abcdefghij\u{301} abcdefgh日本 abcdefghij² abcdefghij\u{a0}x (abcdefghijé",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ@[`{abcdefghijklmnopqrstuvwxyz abcdefg×yz abcdefg\u{2003}x",
    "0123456789٣٤ 12345678Ⅻ !!!!!!!!!!é ........\u{301} ?????????\u{a0} ×é \u{a0}é",
    "          \u{3000}  x         \u{85}x\n\n\n\n\n\n\n\n\n\ny \t\t\t\t\t\t\t\t\t!",
    "    \n        \r\n\t  foo \u{2028}\n\u{2029}  x  \u{85}  \r  x\r\n",
    "         ",
    "x         ",
    "'sa 'tt 'rev 'vee 'mm 'lll 'dd 'r 'v 'l 'S 'RE 'LL 'ſ 'ſa 'Rx 'vE 'lL 'é '\u{301}",
    "x'\ny'\r\n'' '' '\t .'s ('t",
    ".'s ''t .'re ,'ll \u{b}!\u{b} !\u{c}x (\u{7f}",
    "McDonald's HTTPServer (iPhone) DON'T \u{301}ABC!",
    // Punctuation runs as code has them: before a letter, into characters that are not ASCII,
    // at a control; `/` and CR LF after a run.
    "(A) ((a (a (HTTP ( a ): =\n\n x = {}\n\tif (x) {\r\n/ y',)]\u{b}z ,\u{1f}z .\u{301} !é ,日 \
     (1 '' ''s 's, ',\n !/\n/ !«x» +€5 )」",
];

/// Whitespace of the kinds the patterns treat apart: U+0020, CR and LF, other ASCII and Unicode
/// spaces, line and paragraph separators.
const WHITESPACE: &[char] = &[
    ' ', '\n', '\r', '\t', '\u{b}', '\u{c}', '\u{85}', '\u{a0}', '\u{1680}', '\u{2003}',
    '\u{2028}', '\u{2029}', '\u{3000}',
];

/// Characters of every class the patterns tell apart: apostrophes and the contractions' letters
/// in every case (and ſ, K); upper, lower, title, modifier and uncased letters; marks; numbers of
/// every kind; punctuation, symbols, controls, emoji and a joiner.
const CLASSES: &[char] = &[
    '\'', 's', 'S', 'ſ', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l', 'L', 'd', 'D', 'k',
    '\u{212a}', 'a', 'Z', 'é', 'É', 'ǅ', 'ß', 'ʰ', 'ˆ', '日', '한', 'ا', 'क', '\u{301}', '\u{94d}',
    '\u{e01}', '0', '7', '٣', '²', 'Ⅻ', '𝟙', '𝐀', '𝐚', '.', '!', '/', '(', '_', '$', '×', '😀',
    '\u{200d}', '\u{0}', '\u{ad}', '\u{FFFD}',
];

/// Texts of up to 32 pieces: a character (of a listed class, or any) or an ASCII stretch long
/// enough for the scanners' 8-byte steps.
fn random_text() -> impl Strategy<Value = String> {
    let character = prop_oneof![
        prop::sample::select(WHITESPACE),
        prop::sample::select(CLASSES),
        any::<char>(),
    ];
    let ascii = prop_oneof![
        "[a-zA-Z]{1,20}",
        "[0-9]{1,12}",
        " {1,12}",
        "[ \t\r\n]{1,6}",
        "[ -~]{1,24}",
    ];
    let piece = prop_oneof![3 => character.prop_map(String::from), 2 => ascii];
    proptest::collection::vec(piece, 0..32).prop_map(|pieces| pieces.concat())
}

/// `scanner` against the regex of `pattern` on one text: the same ranges, and no hand-back;
/// [`Scanner::cut`], what the engine runs, gives what [`find_iter`] gives.
fn same_pieces(scanner: &dyn Scanner, regex: &SysRegex, text: &str) -> Result<(), String> {
    let ours: Result<Vec<_>, HandBack> = find_iter(scanner, text).collect();
    let mut cut = vec![(0, 0); 3];
    let whole = scanner.cut(text, &mut cut).map(|()| cut);
    if whole != ours {
        return Err(format!("{text:?}: cut {whole:?}, find_iter {ours:?}"));
    }
    let hf: Vec<(usize, usize)> = regex.find_iter(text).collect();
    match ours {
        Ok(ours) if ours == hf => Ok(()),
        Ok(ours) => Err(format!("{text:?}: scanner {ours:?}, HF's regex {hf:?}")),
        Err(HandBack) => Err(format!("{text:?}: handed back below the bound")),
    }
}

/// Whitespace runs just under [`SCANNED_RUN_LIMIT`], in the shapes that make the regex backtrack
/// through the whole run: HF's regex never gives up on them (its matches cover the text) and the
/// scanner agrees; past the bound the scanner hands the text back.
fn long_runs(scanner: &dyn Scanner, regex: &SysRegex) -> Result<(), String> {
    for unit in [" ", "\t", "\u{a0}", "\n", "\r\n", " \n"] {
        let run = unit.repeat((SCANNED_RUN_LIMIT - 1) / unit.len());
        for (prefix, suffix) in [("", "x"), ("\n", "x"), ("x", ""), ("!", "1"), ("x", "\n")] {
            let text = format!("{prefix}{run}{suffix}");
            let covered: usize = regex.find_iter(&text).map(|(s, e)| e - s).sum();
            if covered != text.len() {
                return Err(format!("HF's regex gave up on a run of {unit:?}"));
            }
            same_pieces(scanner, regex, &text)
                .map_err(|_| format!("a run of {unit:?} after {prefix:?}: pieces differ"))?;
        }
    }
    let text = format!("a{}b", " ".repeat(SCANNED_RUN_LIMIT + 1));
    let found: Vec<_> = find_iter(scanner, &text).take(3).collect();
    if found != [Ok((0, 1)), Err(HandBack)] {
        return Err(format!(
            "past the bound: {found:?}, not a hand-back after \"a\""
        ));
    }
    Ok(())
}

/// `scanner` against HF's regex for `pattern`: hard cases, `cases` random texts, long runs. The
/// first difference found, with its text, is the error.
fn check(scanner: &dyn Scanner, pattern: &str, cases: u32) -> Result<(), String> {
    let regex = SysRegex::new(pattern).map_err(|e| format!("{pattern:?} does not compile: {e}"))?;
    for text in HARD_CASES {
        same_pieces(scanner, &regex, text)?;
    }
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&random_text(), |text| {
            same_pieces(scanner, &regex, &text).map_err(TestCaseError::fail)
        })
        .map_err(|e| e.to_string())?;
    long_runs(scanner, &regex)
}

#[test]
fn every_registered_scanner_matches_hf_regex() {
    for row in REGISTRY {
        let scanner = (row.build)().unwrap_or_else(|e| panic!("{}: {e}", row.name));
        check(scanner.as_ref(), row.pattern, 3000).unwrap_or_else(|e| panic!("{}: {e}", row.name));
    }
}

/// The harness fails a scanner that is wrong by one character class: each registered scanner
/// checked against its pattern with one class narrowed (the letter runs' `\p{L}` to `\p{Ll}`,
/// the whitespace runs' `\s` to `[\t ]`) is reported, with the text that shows it.
#[test]
fn a_scanner_wrong_by_one_class_fails() {
    for row in REGISTRY {
        let scanner = (row.build)().expect("builds");
        for (class, narrower) in [(r"\p{L}+", r"\p{Ll}+"), (r"\s+(?!\S)", r"[\t ]+(?!\S)")] {
            assert!(row.pattern.contains(class), "{}: no {class}", row.name);
            let other = row.pattern.replacen(class, narrower, 1);
            let found = check(scanner.as_ref(), &other, 300);
            assert!(
                found.is_err(),
                "{}: {class} → {narrower} not caught",
                row.name
            );
        }
    }
}

/// Every registered pattern is written as HF writes it (the key a `tokenizer.json` is matched
/// by), and a pattern without a scanner finds none.
#[test]
fn the_registry_is_keyed_by_hf_patterns() {
    assert_eq!(
        REGISTRY[0].pattern,
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    );
    assert!(super::for_pattern(r"\s+|\S+").is_none());
    let (name, built) = super::for_pattern(REGISTRY[0].pattern).expect("GPT-2's");
    assert_eq!(name, "GPT-2");
    assert!(built.is_ok());
}
