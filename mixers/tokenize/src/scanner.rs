//! Scanners: hand-written stand-ins for a pre-tokenizer's regex, and the registry that picks one
//! by the regex's pattern. HF cuts a text into pieces with fancy-regex, which is most of the
//! byte-level engine's time; a scanner gives the same pieces without a regex engine.
//!
//! A scanner is one file under `scanner/` implementing [`Scanner`], plus one row of
//! [`REGISTRY`] keyed by HF's pattern. Nothing else is written per scanner: [`find_iter`] walks
//! any scanner over a text, and one conformance harness (`scanner/conformance.rs`) checks every
//! registered scanner against HF's own regex type on the same texts.

pub(crate) mod char_classes;
mod cl100k;
mod contractions;
mod gpt2;

pub(crate) use gpt2::PATTERN as GPT2_PATTERN;

#[cfg(test)]
mod conformance;

/// How far a scanner follows one whitespace run before it hands the text back to HF's regex.
/// fancy-regex backtracks through the whole run for `\s*[\r\n]+` and `\s+(?!\S)` and gives up
/// past its backtrack limit (1,000,000 steps; measured with GPT-2's, cl100k's and Qwen's
/// patterns: a run of 999,999 spaces, tabs or NBSPs), after which HF stops splitting; the regex,
/// not the scanner, must then cut the text. A byte count is at least the character count, so
/// this bound is safe for any characters; the conformance harness pins that the regex holds up
/// to it.
pub(crate) const SCANNED_RUN_LIMIT: usize = 64 * 1024;

/// A scanner met a whitespace run longer than [`SCANNED_RUN_LIMIT`]: cut this text with HF's
/// regex instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandBack;

/// A hand-written scanner for one pre-tokenizer regex, whose matches tile every text (every
/// character starts a match of some alternative).
///
/// The contract, checked for every registered scanner by the conformance harness:
/// - from `start`, a character boundary before the end of `text`, [`Self::match_end`] gives the
///   end of the match HF's regex reports there (leftmost-first, alternative by alternative), so
///   that [`find_iter`]'s ranges are HF's matches of the whole text: contiguous, ordered, from 0
///   to `text.len()`, on character boundaries;
/// - it hands the text back ([`HandBack`]) before following a whitespace run past
///   [`SCANNED_RUN_LIMIT`] bytes, where the regex could give up; the caller then cuts the whole
///   text with the regex, so a scanner never needs to know where the regex would stop.
///
/// The character classes come from `regex-syntax` ([`char_classes`]), the crate
/// fancy-regex compiles HF's pattern with, so both read the same Unicode tables.
pub(crate) trait Scanner: Send + Sync {
    /// The end (byte offset) of the match that starts at `start`.
    fn match_end(&self, text: &str, start: usize) -> Result<usize, HandBack>;

    /// Every match of `text`, in order, into `pieces` (emptied first): [`find_iter`] collected,
    /// or the [`HandBack`] it met. One call per text: through a `dyn Scanner` only this call is
    /// dynamic, each match is found by the scanner's own `match_end`, inlined.
    fn cut(&self, text: &str, pieces: &mut Vec<(usize, usize)>) -> Result<(), HandBack> {
        pieces.clear();
        for piece in find_iter(self, text) {
            pieces.push(piece?);
        }
        Ok(())
    }
}

/// A registered scanner: the pattern it stands in for, exactly as HF's `tokenizer.json` writes
/// it, and how to build it.
pub(crate) struct Registered {
    /// What the engine line calls it.
    pub name: &'static str,
    pub pattern: &'static str,
    pub build: fn() -> Built,
}

/// A scanner built, or why its tables did not build.
pub(crate) type Built = Result<Box<dyn Scanner>, ScannerError>;

/// Why a scanner's tables did not build: a character class `regex-syntax` does not give as the
/// scanner needs it. Never seen with the `regex-syntax` this crate is built with; should one
/// occur, HF's regex cuts the pieces instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScannerError {
    #[error("{class}: {message}")]
    ClassSyntax { class: String, message: String },
    #[error("{class}: literal is not one character")]
    NotOneCharacter { class: String },
    #[error("{class} is not a Unicode class: {found}")]
    NotAClass { class: String, found: String },
    #[error("\\p{{L}} and ASCII letters disagree on {byte:#04x}")]
    LettersDisagree { byte: u8 },
    #[error("a contraction without letters")]
    ContractionWithoutLetters,
    #[error("two contractions start with {first:?}")]
    ContractionsShareFirst { first: char },
}

/// Every scanner, by HF's pattern: those of the byte-level files dsprep's engine runs because HF
/// `tokenizers` 1.x does not encode them exactly (BENCHMARKS.md, "Tokenizer engines"): GPT-2's
/// (Command R+, Claude) and the cl100k family's (Qwen2/2.5/3; Llama 3 and cl100k_base share the
/// scanner). A file with any other pattern is cut by HF's regex type.
pub(crate) const REGISTRY: &[Registered] = &[
    Registered {
        name: "GPT-2",
        pattern: gpt2::PATTERN,
        build: gpt2::build,
    },
    Registered {
        name: "cl100k-family",
        pattern: cl100k::QWEN2_PATTERN,
        build: cl100k::build_qwen2,
    },
    Registered {
        name: "cl100k-family",
        pattern: cl100k::CL100K_PATTERN,
        build: cl100k::build_cl100k,
    },
];

/// The registered scanner for `pattern`, built, with its name; `None` when none is registered.
pub(crate) fn for_pattern(pattern: &str) -> Option<(&'static str, Built)> {
    (REGISTRY.iter())
        .find(|row| row.pattern == pattern)
        .map(|row| (row.name, (row.build)()))
}

/// The matches of `scanner`'s pattern in `text`, as HF's regex would report them: `(start, end)`
/// byte ranges that tile the text, or a [`HandBack`], after which nothing more is scanned (the
/// regex cuts the whole text).
pub(crate) fn find_iter<'a, S: Scanner + ?Sized>(
    scanner: &'a S,
    text: &'a str,
) -> impl Iterator<Item = Result<(usize, usize), HandBack>> + 'a {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= text.len() {
            return None;
        }
        let found = scanner.match_end(text, at).map(|end| (at, end));
        at = found.map_or(text.len(), |(_, end)| end);
        Some(found)
    })
}
