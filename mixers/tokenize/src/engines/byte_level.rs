//! The fast path for byte-level BPE (GPT-2, Llama 3, the cl100k family, Qwen, o200k, Mistral's
//! Tekken, DeepSeek V3): HF's pipeline step for step, built only when [`crate::read::pipeline`]
//! finds a configuration it reproduces.
//!
//! Each step is HF's own step, or the same code HF runs: added tokens are found with the same
//! trie crate ([`super::added`]); NFC and NFKC with HF's crate ([`super::normalization`]); pieces
//! come from HF's own regex type (`tokenizers::utils::SysRegex`, which also stops where HF stops
//! on a regex error), or, for GPT-2's, the cl100k and o200k families' patterns and DeepSeek V3's
//! splits, from a scanner with the same pieces that hands a text back to the regexes wherever a
//! regex could give up; a piece's ids come from HF's merge loop over HF's merges
//! ([`super::merges`]), from the thread's [`super::piece_cache`] when the same bytes were merged
//! before, or from [`super::whole_tokens`] when the piece is one token whole.

use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use super::EncodeError;
use super::added::{AddedSplitter, Segment};
use super::normalization::Normalization;
use super::piece_cache::{self, PieceCache};
use super::regex_copies::RegexCopies;
use crate::cache::packed_tables::LargeTables;
use crate::read::Refusal;
use crate::read::byte_vocab::{self, ByteVocab, VocabTables};
use crate::read::pipeline::{self, AddedSpec, OuterCut};
use crate::read::token_list::TokenList;
use crate::scanner::{self, HandBack, Scanner};

/// A cut HF makes before the last split: a regex Split (DeepSeek V3's digit groups and CJK runs),
/// its regex in copies and what it keeps, or `Digits` (Command R+'s).
enum OuterSplit {
    Regex {
        regexes: RegexCopies,
        keep_matches: bool,
        keep_gaps: bool,
    },
    Numbers {
        individual: bool,
    },
}

/// HF's `Digits` over `text`: every piece, in order, to `next`. HF cuts with its char-predicate
/// pattern: each character `char::is_numeric` holds for is a match (a run of them one match when
/// not `individual`), the stretches between are kept too.
fn cut_numbers(
    text: &str,
    individual: bool,
    mut next: impl FnMut(usize, usize) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let mut start = 0;
    let mut in_number = false;
    for (at, c) in text.char_indices() {
        let numeric = c.is_numeric();
        if at > start && (numeric != in_number || (numeric && individual)) {
            next(start, at)?;
            start = at;
        }
        in_number = numeric;
    }
    if start < text.len() {
        next(start, text.len())?;
    }
    Ok(())
}

pub(crate) struct ByteLevelBpe {
    /// Added tokens matched in the raw text, then those matched in the normalized text.
    raw_added: AddedSplitter,
    normalized_added: AddedSplitter,
    normalization: Normalization,
    /// The splits before the last, in order; each cuts every piece the one before kept.
    outer: Vec<OuterSplit>,
    regexes: RegexCopies,
    /// The pattern scanned by hand instead of by fancy-regex (same matches), where a scanner
    /// is registered for it, and the scanner's name.
    scanner: Option<(&'static str, Box<dyn Scanner>)>,
    keep_matches: bool,
    keep_gaps: bool,
    vocab: ByteVocab,
    /// Names this engine's entries in the per-thread piece caches.
    cache_owner: u64,
    description: String,
}

/// That `start..end` is a range of `text` (ordered, inside it), as an error rather than a panic if
/// a regex ever reported another.
#[inline]
fn check_range(text: &str, start: usize, end: usize) -> Result<(), Cut> {
    if start <= end && end <= text.len() {
        return Ok(());
    }
    Err(Cut::Error(EncodeError::CutOutsideText {
        start,
        end,
        len: text.len(),
    }))
}

/// The longest text a scanner cuts whole before its pieces are encoded (the pieces of one such
/// text, at most 16 bytes each per byte of it, are the most a thread holds for it).
const CUT_AT_ONCE: usize = 64 * 1024;

/// Pieces encoded a batch at a time: each piece's lookups are asked for from memory
/// ([`super::prefetch`]) when it is cut, and read [`BATCH`] pieces later, so that the misses of
/// pieces met for the first time overlap instead of following one another.
const BATCH: usize = 32;

/// A piece cut but not yet encoded: its range in the text, and for a short piece its key and hash.
#[derive(Clone, Copy, Default)]
struct Pending {
    start: usize,
    end: usize,
    key: u128,
    hash: u64,
}

#[derive(Default)]
struct PieceBatch {
    pieces: [Pending; BATCH],
    len: usize,
}

/// Why cutting a text into pieces stopped.
enum Cut {
    /// The scanner handed the text back to the regex.
    HandBack,
    Error(EncodeError),
}

impl Cut {
    fn into_error(self) -> EncodeError {
        match self {
            // Only scanners hand back, and their texts go to the regex: a bug if ever seen.
            Self::HandBack => EncodeError::HandedBack,
            Self::Error(error) => error,
        }
    }
}

/// Everything the byte-level engine is built from, read from a `tokenizer.json` by
/// [`ByteLevelBpe::learn`]: plain data, the form the engine cache ([`crate::cache::entry`]) keeps.
#[derive(Serialize, Deserialize)]
pub(crate) struct ByteLevelTables {
    normalization: Normalization,
    /// The pre-tokenizer's cuts before the last split (none but for a Sequence of several).
    outer: Vec<OuterCut>,
    pattern: String,
    keep_matches: bool,
    keep_gaps: bool,
    added: Vec<AddedSpec>,
    vocab: VocabTables,
}

impl ByteLevelTables {
    /// The merges and the whole tokens, the tables the engine cache keeps as bytes.
    pub(crate) fn large_tables(&self) -> LargeTables<'_> {
        LargeTables {
            merges: &self.vocab.merges,
            whole: &self.vocab.whole,
        }
    }

    /// The tables [`Self::large_tables`] gave, read back.
    pub(crate) fn set_large_tables(&mut self, merges: Vec<(u32, u32, u32)>, whole: TokenList) {
        self.vocab.merges = merges;
        self.vocab.whole = whole;
    }
}

impl ByteLevelBpe {
    /// What the engine for `tokenizer` is built from, or why it would not reproduce HF's ids.
    pub fn learn(tokenizer: &Tokenizer) -> Result<ByteLevelTables, Refusal> {
        // The cheap configuration checks first; the vocabulary is read last.
        let pipeline = pipeline::analyse(tokenizer)?;
        Ok(ByteLevelTables {
            normalization: pipeline.normalization,
            outer: pipeline.outer,
            pattern: pipeline.split.pattern,
            keep_matches: pipeline.split.keep_matches,
            keep_gaps: pipeline.split.keep_gaps,
            added: pipeline.added,
            vocab: byte_vocab::read(pipeline.bpe)?,
        })
    }

    /// The engine from its tables (fresh from [`Self::learn`], or from the engine cache).
    pub fn from_tables(tables: &ByteLevelTables) -> Result<Self, Refusal> {
        let raw_added = AddedSplitter::new(&tables.added, false)?;
        let normalized_added = AddedSplitter::new(&tables.added, true)?;
        let compiled = (|| {
            let outer = tables
                .outer
                .iter()
                .map(|cut| match cut {
                    OuterCut::Regex(split) => Ok(OuterSplit::Regex {
                        regexes: RegexCopies::new(&split.pattern)?,
                        keep_matches: split.keep_matches,
                        keep_gaps: split.keep_gaps,
                    }),
                    &OuterCut::Numbers { individual } => Ok(OuterSplit::Numbers { individual }),
                })
                .collect::<Result<Vec<_>, Refusal>>()?;
            Ok::<_, Refusal>((outer, RegexCopies::new(&tables.pattern)?))
        })();
        let vocab = ByteVocab::from_tables(&tables.vocab);
        let (outer, regexes) = compiled?;
        let vocab = vocab?;
        let outer_patterns: String = tables
            .outer
            .iter()
            .map(|cut| match cut {
                OuterCut::Regex(split) => format!("{:?} then ", split.pattern),
                OuterCut::Numbers { individual: true } => "Digits (each) then ".to_string(),
                OuterCut::Numbers { individual: false } => "Digits (runs) then ".to_string(),
            })
            .collect();
        let scanner = match scanner::for_pattern(&tables.pattern) {
            Some((name, built)) => Some((name, built?)),
            None => None,
        };
        let description = format!(
            "fast path: dsprep's byte-level BPE, HF's merge loop over HF's merges ({} tokens, \
             {} merges{}, {} tokens looked up whole; normalizer {}; {} added tokens; \
             pre-tokenizer regex {}{:?}{}; piece cache {} KiB per thread)",
            vocab.num_tokens,
            vocab.merges.len(),
            if vocab.ignore_merges {
                ", ignore_merges"
            } else {
                ""
            },
            vocab.whole.len(),
            tables.normalization.name(),
            tables.added.len(),
            outer_patterns,
            tables.pattern,
            match &scanner {
                Some((name, _)) => format!(", scanned by dsprep's {name} scanner"),
                None => String::new(),
            },
            piece_cache::CACHE_BYTES >> 10,
        );
        Ok(Self {
            raw_added,
            normalized_added,
            normalization: tables.normalization,
            outer,
            regexes,
            scanner,
            keep_matches: tables.keep_matches,
            keep_gaps: tables.keep_gaps,
            vocab,
            cache_owner: piece_cache::new_owner(),
            description,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Append the ids HF's `encode(text, add_special_tokens=False)` gives to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), EncodeError> {
        piece_cache::with_cache(self.cache_owner, |cache| self.encode_with(text, cache, out))
    }

    fn encode_with(
        &self,
        text: &str,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), EncodeError> {
        // HF: non-normalized added tokens in the raw text; normalize what lies between them;
        // normalized added tokens in that; pre-tokenize and BPE what lies between those.
        self.raw_added.split(text, |segment| match segment {
            Segment::Added(id) => {
                out.push(id);
                Ok(())
            }
            Segment::Text(raw) => {
                let normalized = self.normalization.apply(raw);
                self.normalized_added
                    .split(&normalized, |segment| match segment {
                        Segment::Added(id) => {
                            out.push(id);
                            Ok(())
                        }
                        Segment::Text(between) => self.encode_split(between, cache, out),
                    })
            }
        })
    }

    /// HF's pre-tokenizer and BPE on a text between added tokens, split after split.
    fn encode_split(
        &self,
        text: &str,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), EncodeError> {
        self.encode_outer(0, text, cache, out)
    }

    /// The splits before the last, from `level` on: each kept piece of `self.outer[level]`'s cut
    /// goes on to the next split, and past the last outer one to [`Self::encode_pieces`].
    /// Empty pieces are dropped, as HF drops them.
    fn encode_outer(
        &self,
        level: usize,
        text: &str,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), EncodeError> {
        let Some(split) = self.outer.get(level) else {
            return self.encode_pieces(text, cache, out);
        };
        let mut next = |start: usize, end: usize| {
            check_range(text, start, end).map_err(Cut::into_error)?;
            match text.get(start..end) {
                Some("") => Ok(()),
                Some(piece) => self.encode_outer(level + 1, piece, cache, out),
                None => Err(EncodeError::CutOffCharacters { start, end }),
            }
        };
        let (regexes, keep_matches, keep_gaps) = match split {
            &OuterSplit::Numbers { individual } => return cut_numbers(text, individual, next),
            OuterSplit::Regex {
                regexes,
                keep_matches,
                keep_gaps,
            } => (regexes, *keep_matches, *keep_gaps),
        };
        let mut previous = 0;
        for (start, end) in regexes.for_this_thread().find_iter(text) {
            if keep_gaps {
                next(previous, start)?;
            }
            if keep_matches {
                next(start, end)?;
            }
            previous = end;
        }
        if keep_gaps {
            next(previous, text.len())?;
        }
        Ok(())
    }

    /// HF's `Pattern for &SysRegex` + `NormalizedString::split`: matches and the gaps between
    /// them, each kept or dropped by the split behaviour, empty ones dropped. A scanner that
    /// hands the text back (a whitespace run where the regex may give up) has its ids taken back
    /// and the regex cuts the text.
    fn encode_pieces(
        &self,
        text: &str,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), EncodeError> {
        let from_regex = || self.regexes.for_this_thread().find_iter(text).map(Ok);
        let Some((_, scanner)) = &self.scanner else {
            return (self.encode_matches(text, from_regex(), cache, out)).map_err(Cut::into_error);
        };
        // A text of up to CUT_AT_ONCE bytes is cut whole first (one dynamic call, the scanner's
        // own loop inlined), then encoded; a longer one match by match, so that the pieces held
        // stay bounded. A hand-back takes back what was encoded, and the regex cuts the text.
        let mark = out.len();
        let scanned = if text.len() <= CUT_AT_ONCE {
            let mut pieces = std::mem::take(&mut cache.pieces);
            let scanned = match scanner.cut(text, &mut pieces) {
                Ok(()) => {
                    let matches = pieces.iter().map(|&piece| Ok(piece));
                    self.encode_matches(text, matches, cache, out)
                }
                Err(HandBack) => Err(Cut::HandBack),
            };
            pieces.clear();
            cache.pieces = pieces;
            scanned
        } else {
            let matches = scanner::find_iter(scanner.as_ref(), text);
            self.encode_matches(text, matches, cache, out)
        };
        match scanned {
            Err(Cut::HandBack) => {
                out.truncate(mark);
                (self.encode_matches(text, from_regex(), cache, out)).map_err(Cut::into_error)
            }
            other => other.map_err(Cut::into_error),
        }
    }

    fn encode_matches(
        &self,
        text: &str,
        matches: impl Iterator<Item = Result<(usize, usize), HandBack>>,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), Cut> {
        let bytes = text.as_bytes();
        let mut batch = PieceBatch::default();
        let mut previous = 0;
        for found in matches {
            let (start, end) = found.map_err(|HandBack| Cut::HandBack)?;
            if self.keep_gaps && previous < start {
                check_range(text, previous, start)?;
                self.queue(bytes, previous, start, &mut batch, cache, out);
            }
            if self.keep_matches && start < end {
                check_range(text, start, end)?;
                self.queue(bytes, start, end, &mut batch, cache, out);
            }
            previous = end;
        }
        if self.keep_gaps && previous < text.len() {
            self.queue(bytes, previous, text.len(), &mut batch, cache, out);
        }
        self.flush(bytes, &mut batch, cache, out);
        Ok(())
    }

    /// Add `text[start..end]` to the batch, asking for the memory its lookups will read; encode
    /// the batch once it is full.
    #[inline(always)]
    fn queue(
        &self,
        text: &[u8],
        start: usize,
        end: usize,
        batch: &mut PieceBatch,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) {
        let mut piece = Pending {
            start,
            end,
            key: 0,
            hash: 0,
        };
        if end - start <= piece_cache::SHORT_KEY {
            piece.key = piece_cache::short_key_at(text, start, end);
            piece.hash = piece_cache::short_hash(piece.key);
            cache.prefetch_short(piece.hash);
            self.vocab.whole.prefetch_short(piece.hash);
        }
        batch.pieces[batch.len] = piece;
        batch.len += 1;
        if batch.len == BATCH {
            self.flush(text, batch, cache, out);
        }
    }

    /// Encode the batch's pieces in order and empty it.
    fn flush(
        &self,
        text: &[u8],
        batch: &mut PieceBatch,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) {
        for piece in &batch.pieces[..batch.len] {
            if piece.end - piece.start <= piece_cache::SHORT_KEY {
                self.encode_short(text, piece, cache, out);
            } else {
                self.encode_long(&text[piece.start..piece.end], cache, out);
            }
        }
        batch.len = 0;
    }

    /// HF's BPE model on a piece of at most [`piece_cache::SHORT_KEY`] bytes: from the piece
    /// cache when these bytes were merged before, else the piece's token when it is one token
    /// whole (HF's lookup under `ignore_merges`, or a token the merge loop makes of its own
    /// bytes), else the merge loop over its bytes.
    #[inline(always)]
    fn encode_short(
        &self,
        text: &[u8],
        piece: &Pending,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) {
        let (key, hash) = (piece.key, piece.hash);
        if let Some(ids) = cache.get_short(key, hash) {
            match ids {
                [id] => out.push(*id),
                ids => out.extend_from_slice(ids),
            }
            return;
        }
        if let Some(id) = self.vocab.whole.get_short(key, hash) {
            out.push(id);
            cache.insert_short(key, hash, &[id]);
            return;
        }
        let first = out.len();
        self.merge(&text[piece.start..piece.end], cache, out);
        cache.insert_short(key, hash, &out[first..]);
    }

    /// [`Self::encode_short`] for a longer piece.
    fn encode_long(&self, bytes: &[u8], cache: &mut PieceCache, out: &mut Vec<u32>) {
        if let Some(ids) = cache.get(bytes) {
            out.extend_from_slice(ids);
            return;
        }
        let first = out.len();
        match self.vocab.whole.get_long(bytes) {
            Some(id) => out.push(id),
            None => self.merge(bytes, cache, out),
        }
        cache.insert(bytes, &out[first..]);
    }

    /// The merge loop over a piece's bytes, its ids appended to `out`.
    fn merge(&self, bytes: &[u8], cache: &mut PieceCache, out: &mut Vec<u32>) {
        let symbols = &mut cache.symbols;
        self.vocab
            .merges
            .merge_bytes(bytes, &self.vocab.byte_pairs, symbols);
        out.extend_from_slice(symbols);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// HF's `Digits` pre-tokenizer's pieces, by byte offsets.
    fn hf_digits(text: &str, individual: bool) -> Vec<(usize, usize)> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let mut pre = PreTokenizedString::from(text);
        tokenizers::pre_tokenizers::digits::Digits::new(individual)
            .pre_tokenize(&mut pre)
            .expect("Digits");
        pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, offsets, _)| offsets)
            .collect()
    }

    fn ours_digits(text: &str, individual: bool) -> Vec<(usize, usize)> {
        let mut pieces = Vec::new();
        cut_numbers(text, individual, |start, end| {
            pieces.push((start, end));
            Ok(())
        })
        .expect("never fails");
        pieces
    }

    #[test]
    fn digits_are_cut_as_hf_cuts_them() {
        // U+11DE0.. and U+16FF4..: digits `char::is_numeric` knows and the regex tables of this
        // build do not (a `\p{N}` split would keep them in the text).
        for text in [
            "",
            "1",
            "12a",
            "a12",
            "x1\u{11DE0}\u{11DE1}y \u{16FF4}½²Ⅻ٣ 𝟙z",
            "abc",
        ] {
            for individual in [true, false] {
                assert_eq!(
                    ours_digits(text, individual),
                    hf_digits(text, individual),
                    "{text:?}"
                );
            }
        }
        assert_eq!(ours_digits("a\u{11DE0}", true), [(0, 1), (1, 5)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn digits_are_cut_as_hf_cuts_random_text(text in proptest::collection::vec(prop_oneof![
            prop::sample::select(vec!['1', '٣', '²', 'Ⅻ', '½', '\u{11DE0}', '\u{16FF4}', 'a', ' ']),
            any::<char>(),
        ], 0..24).prop_map(|cs| cs.into_iter().collect::<String>())) {
            for individual in [true, false] {
                prop_assert_eq!(ours_digits(&text, individual), hf_digits(&text, individual));
            }
        }
    }
}
