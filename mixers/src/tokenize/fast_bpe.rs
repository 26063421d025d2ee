//! The fast path of the tokenize stage: byte-level BPE with tiktoken-rs's `CoreBPE`, 8–13× faster
//! per core than HF `tokenizers` (BENCHMARKS.md), built only when the exactness check
//! ([`super::pipeline`] for the pipeline, [`super::ranks`] for the vocabulary) proves it gives
//! HF's ids for every text.
//!
//! Each step is HF's own step, or the same code HF runs: added tokens are found with the same
//! trie crate ([`super::added`]); NFC is HF's NFC crate; pieces come from HF's own regex type
//! (`tokenizers::utils::SysRegex`, which also stops where HF stops on a regex error), or, for
//! GPT-2's and the cl100k family's patterns, from a scanner with the same matches that hands a
//! text back to that regex wherever the regex could give up; only the BPE of a piece is
//! tiktoken's. tiktoken's own regex pass is not used because it drops text
//! between matches, panics on regex errors and runs a different fancy-regex version.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;
use tiktoken_rs::CoreBPE;
use tokenizers::Tokenizer;
use tokenizers::utils::SysRegex;
use unicode_normalization_alignments::UnicodeNormalization;

use super::added::{AddedSplitter, Segment};
use super::char_classes::HandBack;
use super::cl100k_split::Cl100kSplitter;
use super::gpt2_split::{GPT2_PATTERN, Gpt2Splitter};
use super::pipeline::{self, Refusal};
use super::ranks;

/// The regex `CoreBPE` runs on one piece: the whole piece, so tiktoken does nothing but look
/// the piece up and merge it (its heap-based merge for long pieces included).
const WHOLE_PIECE: &str = "(?s:.+)";

/// fancy-regex searches take scratch space from a pool inside the regex; threads sharing one
/// regex contend for it (tiktoken's performance notes), so threads spread over a few copies.
const REGEX_COPIES: usize = 8;

/// A hand-written scanner that gives the same pieces as the pre-tokenizer's regex.
enum Scanner {
    Gpt2(Gpt2Splitter),
    Cl100k(Cl100kSplitter),
}

impl Scanner {
    /// The scanner for `pattern`, if there is one.
    fn for_pattern(pattern: &str) -> Result<Option<Self>, String> {
        if pattern == GPT2_PATTERN {
            return Gpt2Splitter::new().map(|s| Some(Self::Gpt2(s)));
        }
        Cl100kSplitter::for_pattern(pattern)
            .transpose()
            .map(|s| s.map(Self::Cl100k))
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Gpt2(_) => "GPT-2",
            Self::Cl100k(_) => "cl100k-family",
        }
    }
}

pub(crate) struct FastBpe {
    /// Added tokens matched in the raw text, then those matched in the normalized text.
    raw_added: AddedSplitter,
    normalized_added: AddedSplitter,
    nfc: bool,
    regexes: Vec<SysRegex>,
    /// The pattern scanned by hand instead of by fancy-regex (same matches), where it can be.
    scanner: Option<Scanner>,
    keep_matches: bool,
    keep_gaps: bool,
    /// Piece bytes → id for pieces that are one token (most are): skips tiktoken's per-call
    /// regex pass and allocation. The same map tiktoken holds, so the same answer.
    encoder: FxHashMap<Vec<u8>, u32>,
    bpe: CoreBPE,
    description: String,
}

/// HF's NFC: `unicode-normalization-alignments` (Unicode 9 tables), which HF's
/// `NormalizedString::nfc` collects the characters of. ASCII is its own NFC.
pub(crate) fn nfc(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.nfc().map(|(c, _)| c).collect())
    }
}

fn thread_slot() -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut hasher);
    (hasher.finish() % REGEX_COPIES as u64) as usize
}

/// `text[start..end]`, as an error rather than a panic if a regex ever reported a non-boundary.
fn slice(text: &str, start: usize, end: usize) -> Result<&str, Cut> {
    text.get(start..end).ok_or_else(|| {
        Cut::Error(format!(
            "pre-tokenizer regex reported bytes {start}..{end}, not a char range"
        ))
    })
}

/// Why cutting a text into pieces stopped.
enum Cut {
    /// The scanner handed the text back to the regex.
    HandBack,
    Error(String),
}

impl Cut {
    fn into_message(self) -> String {
        match self {
            // Only scanners hand back, and their texts go to the regex: a bug if ever seen.
            Self::HandBack => "a text cut by the pre-tokenizer regex was handed back".to_string(),
            Self::Error(message) => message,
        }
    }
}

impl FastBpe {
    /// The fast engine for `tokenizer`, or why it would not reproduce HF's ids.
    pub fn build(tokenizer: &Tokenizer) -> Result<Self, Refusal> {
        // The cheap configuration checks first; the vocabulary proof walks every token.
        let pipeline = pipeline::analyse(tokenizer)?;
        let raw_added = AddedSplitter::new(&pipeline.added, false)?;
        let normalized_added = AddedSplitter::new(&pipeline.added, true)?;
        let regexes = (0..REGEX_COPIES)
            .map(|_| SysRegex::new(&pipeline.split.pattern))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Refusal::new(format!("pre-tokenizer regex does not compile: {e}")))?;
        let scanner = Scanner::for_pattern(&pipeline.split.pattern)
            .map_err(|e| Refusal::new(format!("pre-tokenizer scanner tables: {e}")))?;
        let ranks = ranks::build(pipeline.bpe)?;
        let bpe = CoreBPE::new(ranks.encoder.clone(), FxHashMap::default(), WHOLE_PIECE)
            .map_err(|e| Refusal::new(format!("tiktoken-rs refused the vocabulary: {e}")))?;
        let description = format!(
            "fast path: tiktoken-rs CoreBPE, checked to give HF tokenizers' ids (byte-level BPE, \
             {} tokens, {} merges, {} tokens no merge reaches left out; normalizer {}; \
             {} added tokens; pre-tokenizer regex {:?}{})",
            ranks.num_tokens,
            ranks.num_merges,
            ranks.num_unreachable,
            if pipeline.nfc { "NFC" } else { "none" },
            pipeline.added.len(),
            pipeline.split.pattern,
            match &scanner {
                Some(scanner) => format!(", scanned by dsprep's {} scanner", scanner.name()),
                None => String::new(),
            },
        );
        Ok(Self {
            raw_added,
            normalized_added,
            nfc: pipeline.nfc,
            regexes,
            scanner,
            keep_matches: pipeline.split.keep_matches,
            keep_gaps: pipeline.split.keep_gaps,
            encoder: ranks.encoder,
            bpe,
            description,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Append the ids HF's `encode(text, add_special_tokens=False)` gives to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let regex = &self.regexes[thread_slot() % self.regexes.len()];
        // HF: non-normalized added tokens in the raw text; normalize what lies between them;
        // normalized added tokens in that; pre-tokenize and BPE what lies between those.
        self.raw_added.split(text, |segment| match segment {
            Segment::Added(id) => {
                out.push(id);
                Ok(())
            }
            Segment::Text(raw) => {
                let normalized = if self.nfc {
                    nfc(raw)
                } else {
                    Cow::Borrowed(raw)
                };
                self.normalized_added
                    .split(&normalized, |segment| match segment {
                        Segment::Added(id) => {
                            out.push(id);
                            Ok(())
                        }
                        Segment::Text(between) => self.encode_pieces(regex, between, out),
                    })
            }
        })
    }

    /// HF's `Pattern for &SysRegex` + `NormalizedString::split`: matches and the gaps between
    /// them, each kept or dropped by the split behaviour, empty ones dropped. A scanner that
    /// hands the text back (a whitespace run where the regex may give up) has its ids taken back
    /// and the regex cuts the text.
    fn encode_pieces(
        &self,
        regex: &SysRegex,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), String> {
        let from_regex = || regex.find_iter(text).map(Ok);
        let mark = out.len();
        let scanned = match &self.scanner {
            Some(Scanner::Gpt2(scanner)) => self.encode_matches(text, scanner.find_iter(text), out),
            Some(Scanner::Cl100k(scanner)) => {
                self.encode_matches(text, scanner.find_iter(text), out)
            }
            None => self.encode_matches(text, from_regex(), out),
        };
        match scanned {
            Err(Cut::HandBack) => {
                out.truncate(mark);
                self.encode_matches(text, from_regex(), out)
                    .map_err(Cut::into_message)
            }
            other => other.map_err(Cut::into_message),
        }
    }

    fn encode_matches(
        &self,
        text: &str,
        matches: impl Iterator<Item = Result<(usize, usize), HandBack>>,
        out: &mut Vec<u32>,
    ) -> Result<(), Cut> {
        let mut previous = 0;
        for found in matches {
            let (start, end) = found.map_err(|HandBack| Cut::HandBack)?;
            if self.keep_gaps && previous < start {
                self.encode_piece(slice(text, previous, start)?, out);
            }
            if self.keep_matches && start < end {
                self.encode_piece(slice(text, start, end)?, out);
            }
            previous = end;
        }
        if self.keep_gaps && previous < text.len() {
            self.encode_piece(slice(text, previous, text.len())?, out);
        }
        Ok(())
    }

    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        match self.encoder.get(piece.as_bytes()) {
            Some(&id) => out.push(id),
            None => out.extend(self.bpe.encode_ordinary(piece)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfc_composes_like_hf() {
        assert_eq!(nfc("e\u{301}"), "\u{e9}");
        assert!(matches!(nfc("plain ascii"), Cow::Borrowed(_)));
        let mut hf = tokenizers::NormalizedString::from("Cafe\u{301} \u{212b} \u{1100}\u{1161}");
        tokenizers::Normalizer::normalize(&tokenizers::normalizers::NFC, &mut hf).expect("nfc");
        assert_eq!(nfc("Cafe\u{301} \u{212b} \u{1100}\u{1161}"), hf.get());
    }

    #[test]
    fn whole_piece_regex_hands_tiktoken_the_piece() {
        let encoder: FxHashMap<Vec<u8>, u32> = (0..=255u8)
            .map(|b| (vec![b], u32::from(b)))
            .chain([(b"ab".to_vec(), 300), (b"abc".to_vec(), 301)])
            .collect();
        let bpe = CoreBPE::new(encoder, FxHashMap::default(), WHOLE_PIECE).expect("bpe");
        // A regex that split on spaces or at line ends would change these.
        assert_eq!(bpe.encode_ordinary("abc"), [301]);
        assert_eq!(bpe.encode_ordinary("ab ab\n"), [300, 32, 300, 10]);
    }
}
