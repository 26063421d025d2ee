//! The fast path for SentencePiece-style BPE with byte fallback (Llama 2, Mistral 7B).
//!
//! HF runs such a `tokenizer.json` as: added tokens found in the raw text; each stretch between
//! them normalized to "▁" + the stretch with every space written "▁"; that whole stretch one BPE
//! word: its characters looked up (a character outside the vocabulary becomes its UTF-8 bytes'
//! `<0xNN>` tokens), then merged by HF's merge loop. A document is one word, so HF's word cache
//! never hits and every document pays the merge loop over its whole length.
//!
//! This engine cuts the stretch into pieces and merges each alone, which gives the same ids when
//! no merge can join the two sides of a cut. It cuts before a "▁" whose preceding character is
//! not "▁", and only where [`Joins`] shows, from the merge list, that no merge has a left token
//! ending in that character and a right token starting with "▁" (for Llama 2 and Mistral the only
//! such merges are of "▁" runs). Why that suffices: a symbol that starts at the cut starts with
//! the "▁" there (the "▁" is a token, and merges only concatenate), and a symbol that ends there
//! ends with the preceding character's token (or a `<0xNN>` token, whose text ends in '>'); a
//! merge across the cut would be a listed merge of such a pair. Merges on the two sides then never
//! interact, and HF's loop (lowest rank, leftmost first) makes, within each piece, the merges it
//! would make on that piece alone. Pieces are merged by [`super::merges`] (HF's loop) and cached
//! per thread ([`super::piece_cache`]), keyed by their raw bytes (a space stands for "▁").

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;
use tokenizers::models::bpe::BPE;

use super::added::{AddedSplitter, Segment};
use super::byte_vocab::{merge_table, serialized_merges};
use super::merges::Merges;
use super::piece_cache::{self, PieceCache};
use super::pipeline::{self, AddedSpec, METASPACE, Refusal};

/// No token for a character.
const NONE: u32 = u32::MAX;

/// Which characters a merge may join to a following "▁" (so no cut may follow them).
struct Joins {
    /// Last characters of left tokens of merges whose right token starts with "▁".
    before_metaspace: FxHashSet<char>,
}

impl Joins {
    fn from_merges(merges: &[(String, String)]) -> Self {
        let before_metaspace = merges
            .iter()
            .filter(|(_, right)| right.starts_with(METASPACE))
            .filter_map(|(left, _)| left.chars().next_back())
            .collect();
        Self { before_metaspace }
    }

    /// May a piece end after `c` (whose token is `in_vocab`, else its `<0xNN>` bytes)?
    fn may_cut_after(&self, c: char, in_vocab: bool) -> bool {
        let last = if in_vocab { c } else { '>' };
        c != ' ' && c != METASPACE && !self.before_metaspace.contains(&last)
    }
}

pub(crate) struct SentencePieceBpe {
    added: AddedSplitter,
    merges: Merges,
    /// ASCII characters' ids ([`NONE`] where not in the vocabulary); a space is "▁"'s id.
    ascii: [u32; 128],
    chars: FxHashMap<char, u32>,
    /// `<0xNN>` ids of the 256 bytes.
    bytes: [u32; 256],
    joins: Joins,
    /// Every ASCII character after which a piece may end (most of them).
    cut_after_ascii: [bool; 128],
    cache_owner: u64,
    description: String,
}

/// Everything the SentencePiece-style engine is built from, read from a `tokenizer.json` by
/// [`SentencePieceBpe::learn`]: plain data, the form the engine cache ([`super::engine_cache`])
/// keeps.
#[derive(Serialize, Deserialize)]
pub(crate) struct SentencePieceTables {
    added: Vec<AddedSpec>,
    /// `<0xNN>` ids of the 256 bytes.
    bytes: Vec<u32>,
    /// "▁"'s id.
    metaspace: u32,
    /// Every one-character token but "▁": the character and its id.
    chars: Vec<(char, u32)>,
    /// The merges in rank order: left id, right id, merged id.
    merges: Vec<(u32, u32, u32)>,
    /// See [`Joins`].
    before_metaspace: Vec<char>,
    num_tokens: usize,
}

impl SentencePieceBpe {
    /// What the engine for `tokenizer` is built from, or why it would not reproduce HF's ids.
    pub fn learn(tokenizer: &Tokenizer) -> Result<SentencePieceTables, Refusal> {
        let pipeline = pipeline::analyse_sentencepiece(tokenizer)?;
        let bpe: &BPE = pipeline.bpe;
        let vocab = bpe.get_vocab();
        let mut bytes = vec![NONE; 256];
        for (b, id) in bytes.iter_mut().enumerate() {
            let name = format!("<0x{b:02X}>");
            *id = *vocab.get(&name).ok_or_else(|| {
                Refusal::new(format!(
                    "byte fallback token {name} is missing: HF would take its unknown-token path"
                ))
            })?;
        }
        let metaspace = *vocab
            .get(&METASPACE.to_string())
            .ok_or_else(|| Refusal::new("\"▁\" has no token in the vocabulary".to_string()))?;
        let chars = vocab
            .iter()
            .filter_map(|(token, &id)| {
                let mut it = token.chars();
                match (it.next(), it.next()) {
                    (Some(c), None) if c != METASPACE => Some((c, id)),
                    _ => None,
                }
            })
            .collect();
        let merge_list = serialized_merges(bpe)?;
        Ok(SentencePieceTables {
            added: pipeline.added,
            bytes,
            metaspace,
            chars,
            merges: merge_table(bpe, &vocab)?,
            before_metaspace: Joins::from_merges(&merge_list)
                .before_metaspace
                .into_iter()
                .collect(),
            num_tokens: vocab.len(),
        })
    }

    /// The engine from its tables (fresh from [`Self::learn`], or from the engine cache).
    pub fn from_tables(tables: &SentencePieceTables) -> Result<Self, Refusal> {
        let added = AddedSplitter::new(&tables.added, false)?;
        let bytes: [u32; 256] = tables.bytes.as_slice().try_into().map_err(|_| {
            Refusal::new(format!(
                "{} byte fallback ids where there are 256 bytes",
                tables.bytes.len()
            ))
        })?;
        let mut ascii = [NONE; 128];
        let mut chars = FxHashMap::default();
        for &(c, id) in &tables.chars {
            if c.is_ascii() {
                ascii[c as usize] = id;
            } else {
                chars.insert(c, id);
            }
        }
        // HF's normalizer wrote each space as "▁" before the model saw it.
        ascii[usize::from(b' ')] = tables.metaspace;
        chars.insert(METASPACE, tables.metaspace);
        let joins = Joins {
            before_metaspace: tables.before_metaspace.iter().copied().collect(),
        };
        let merges = Merges::new(tables.merges.iter().copied());
        let mut cut_after_ascii = [false; 128];
        for (c, cut) in cut_after_ascii.iter_mut().enumerate() {
            let c = char::from(c as u8);
            *cut = joins.may_cut_after(c, ascii[c as usize] != NONE || c == ' ');
        }
        let mut before_metaspace: Vec<char> = joins.before_metaspace.iter().copied().collect();
        before_metaspace.sort_unstable();
        let description = format!(
            "fast path: dsprep's SentencePiece-style BPE with byte fallback, HF's merge loop over \
             HF's merges ({} tokens, {} merges; normalizer Prepend \"▁\" + Replace \" \" → \"▁\"; \
             {} added tokens; pieces cut before each \"▁\" that follows a character no merge joins \
             to \"▁\"{}; piece cache {} KiB per thread)",
            tables.num_tokens,
            merges.len(),
            tables.added.len(),
            if before_metaspace.iter().all(|&c| c == METASPACE) {
                String::new()
            } else {
                format!(", not after {before_metaspace:?}")
            },
            piece_cache::CACHE_BYTES >> 10,
        );
        Ok(Self {
            added,
            merges,
            ascii,
            chars,
            bytes,
            joins,
            cut_after_ascii,
            cache_owner: piece_cache::new_owner(),
            description,
        })
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Append the ids HF's `encode(text, add_special_tokens=False)` gives to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        piece_cache::with_cache(self.cache_owner, |cache| {
            self.added.split(text, |segment| {
                match segment {
                    Segment::Added(id) => out.push(id),
                    Segment::Text(raw) => self.encode_stretch(raw, cache, out),
                }
                Ok::<(), String>(())
            })
        })
    }

    /// May a piece end after `c`?
    #[inline]
    fn may_cut_after(&self, c: char) -> bool {
        if c.is_ascii() {
            self.cut_after_ascii[c as usize]
        } else {
            self.joins.may_cut_after(c, self.chars.contains_key(&c))
        }
    }

    /// One stretch between added tokens: "▁" + the stretch, cut into pieces.
    fn encode_stretch(&self, raw: &str, cache: &mut PieceCache, out: &mut Vec<u32>) {
        let bytes = raw.as_bytes();
        let mut piece_start = 0;
        let mut first = true;
        // The character before `at` may end a piece (the prepended "▁" may not).
        let mut may_cut = false;
        let mut at = 0;
        while at < bytes.len() {
            let b = bytes[at];
            if b.is_ascii() {
                if b == b' ' && may_cut {
                    self.encode_piece(&bytes[piece_start..at], first, cache, out);
                    (piece_start, first) = (at, false);
                }
                may_cut = self.cut_after_ascii[usize::from(b)];
                at += 1;
                continue;
            }
            let Some(c) = raw.get(at..).and_then(|rest| rest.chars().next()) else {
                break;
            };
            if c == METASPACE && may_cut {
                self.encode_piece(&bytes[piece_start..at], first, cache, out);
                (piece_start, first) = (at, false);
            }
            may_cut = self.may_cut_after(c);
            at += c.len_utf8();
        }
        self.encode_piece(&bytes[piece_start..], first, cache, out);
    }

    /// One piece (raw bytes, a space standing for "▁"); the stretch's first piece has the
    /// normalizer's "▁" in front, which a leading space stands for in the cache key.
    fn encode_piece(&self, piece: &[u8], first: bool, cache: &mut PieceCache, out: &mut Vec<u32>) {
        let mut key = std::mem::take(&mut cache.key);
        key.clear();
        if first {
            key.push(b' ');
        }
        key.extend_from_slice(piece);
        if let Some(ids) = cache.get(&key) {
            match ids {
                [id] => out.push(*id),
                ids => out.extend_from_slice(ids),
            }
        } else {
            let start = out.len();
            let symbols = &mut cache.symbols;
            symbols.clear();
            // The key is the piece's text with a leading space for the prepended "▁": valid
            // UTF-8, since pieces are cut at characters.
            for c in String::from_utf8_lossy(&key).chars() {
                let id = if c.is_ascii() {
                    self.ascii[c as usize]
                } else {
                    self.chars.get(&c).copied().unwrap_or(NONE)
                };
                if id != NONE {
                    symbols.push(id);
                } else {
                    let mut utf8 = [0u8; 4];
                    symbols.extend(
                        c.encode_utf8(&mut utf8)
                            .bytes()
                            .map(|b| self.bytes[usize::from(b)]),
                    );
                }
            }
            self.merges.merge(symbols);
            out.extend_from_slice(symbols);
            cache.insert(&key, &out[start..]);
        }
        cache.key = key;
    }
}
