//! The fast path for SentencePiece-style BPE with byte fallback (Llama 2, Mistral 7B, Gemma,
//! Yi, InternLM2, and such files with a Metaspace pre-tokenizer).
//!
//! HF runs such a `tokenizer.json` as: added tokens found in the raw text; each stretch between
//! them with every space written "▁" and, as [`Prepend`] says, a "▁" in front (Llama 2 and
//! Mistral prepend one to each stretch, Gemma, Yi and InternLM2 none, files with a Metaspace
//! pre-tokenizer to the first); that whole stretch one BPE word: its characters looked up (a
//! character outside the vocabulary becomes its UTF-8 bytes' `<0xNN>` tokens), then merged by
//! HF's merge loop. A document is one word, so HF's word cache never hits and every document
//! pays the merge loop over its whole length.
//!
//! This engine cuts the stretch into pieces and merges each alone, which gives the same ids when
//! no merge can join the two sides of a cut. It cuts between two characters `a` and `b` only
//! where [`Joins`] shows, from the merge list, that no merge has a left token ending in `a` and a
//! right token starting with `b` (a space counts as "▁"; a character outside the vocabulary as
//! its byte fallback tokens, `<0xNN>`, which start with '<' and end with '>'). For Llama 2 and
//! Mistral that is before most "▁" (the merges across one join "▁" runs) and between a word and
//! the punctuation after it ("▁word" + ","), so most pieces are a word or a mark, met before.
//! Why it suffices: a symbol that starts at the cut starts with `b`'s token (merges only
//! concatenate), and a symbol that ends there ends with `a`'s; a merge across the cut would be a
//! listed merge of such a pair. Merges on the two sides then never interact, and HF's loop
//! (lowest rank, leftmost first) makes, within each piece, the merges it
//! would make on that piece alone. Pieces are merged by [`super::merges`] (HF's loop) and cached
//! per thread ([`super::piece_cache`]), keyed by their raw bytes (a space stands for "▁"). A piece
//! met for the first time that is one token whole ("▁the") is looked up in a read-only table
//! ([`super::whole_tokens`]) instead: every token a merge makes or a character is, kept where the
//! merge loop over its own text, as a piece, gives back that one token, so a hit is the loop's
//! answer.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;
use tokenizers::models::bpe::BPE;

use super::added::{AddedSplitter, Segment};
use super::merges::Merges;
use super::piece_cache::{self, PieceCache};
use super::whole_tokens::WholeTokens;
use crate::cache::packed_tables::LargeTables;
use crate::read::Refusal;
use crate::read::byte_vocab::{merge_table, serialized_merges};
use crate::read::pipeline::{self, AddedSpec, METASPACE, Prepend};
use crate::read::token_list::TokenList;

/// No token for a character.
const NONE: u32 = u32::MAX;

/// Which adjacent characters a merge may join (so no cut may fall between them).
struct Joins {
    /// (last character of the left token, first character of the right token) of every merge.
    pairs: FxHashSet<(char, char)>,
}

impl Joins {
    fn from_merges(merges: &[(String, String)]) -> Self {
        let pairs = merges
            .iter()
            .filter_map(|(left, right)| Some((left.chars().next_back()?, right.chars().next()?)))
            .collect();
        Self { pairs }
    }

    /// May a piece end between `a` and `b`, whose tokens are `a_in_vocab` and `b_in_vocab` (else
    /// their `<0xNN>` bytes)? A space is "▁" here, as HF's normalizer wrote it.
    fn may_cut_between(&self, a: char, a_in_vocab: bool, b: char, b_in_vocab: bool) -> bool {
        let as_token = |c: char| if c == ' ' { METASPACE } else { c };
        let last = if a_in_vocab { as_token(a) } else { '>' };
        let first = if b_in_vocab { as_token(b) } else { '<' };
        !self.pairs.contains(&(last, first))
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
    /// Bit `b` of row `a`: may a piece end between ASCII characters `a` and `b`?
    cut_ascii: [u128; 128],
    /// The pieces that are one token whole, keyed as the piece cache keys them.
    whole: WholeTokens,
    /// Which stretches between added tokens get a "▁" in front.
    prepend: Prepend,
    cache_owner: u64,
    description: String,
}

/// Everything the SentencePiece-style engine is built from, read from a `tokenizer.json` by
/// [`SentencePieceBpe::learn`]: plain data, the form the engine cache ([`crate::cache::entry`])
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
    /// The merges in rank order: left id, right id, merged id. In the engine cache as bytes
    /// after the JSON (`cache/packed_tables.rs`).
    #[serde(skip)]
    merges: Vec<(u32, u32, u32)>,
    /// See [`Joins`]: each merge's left token's last character and right token's first.
    joined: Vec<(char, char)>,
    /// Which stretches between added tokens get a "▁" in front.
    prepend: Prepend,
    /// What writes spaces as "▁" and prepends one, as the engine line says it.
    spaces: String,
    /// The pieces that are one token whole ([`SentencePieceBpe::merging_to_themselves`]), keyed
    /// as the piece cache keys pieces, with their ids. In the engine cache as bytes after the
    /// JSON.
    #[serde(skip)]
    whole: TokenList,
    num_tokens: usize,
}

impl SentencePieceTables {
    /// The merges and the whole tokens, the tables the engine cache keeps as bytes.
    pub(crate) fn large_tables(&self) -> LargeTables<'_> {
        LargeTables {
            merges: &self.merges,
            whole: &self.whole,
        }
    }

    /// The tables [`Self::large_tables`] gave, read back.
    pub(crate) fn set_large_tables(&mut self, merges: Vec<(u32, u32, u32)>, whole: TokenList) {
        self.merges = merges;
        self.whole = whole;
    }
}

impl SentencePieceBpe {
    /// What the engine for `tokenizer` is built from, or why it would not reproduce HF's ids.
    pub fn learn(tokenizer: &Tokenizer) -> Result<SentencePieceTables, Refusal> {
        let pipeline = pipeline::analyse_sentencepiece(tokenizer)?;
        let bpe: &BPE = pipeline.bpe;
        let vocab = bpe.get_vocab();
        let mut bytes = vec![NONE; 256];
        for (byte, id) in (0..=255u8).zip(bytes.iter_mut()) {
            let name = format!("<0x{byte:02X}>");
            // An ASCII character with a token of its own never falls back to its byte (Gemma
            // has "\t", not <0x09>); a space is "▁" by then.
            let never_used = byte == b' '
                || (byte.is_ascii() && vocab.contains_key(&char::from(byte).to_string()));
            match vocab.get(&name) {
                Some(&found) => *id = found,
                None if never_used => {}
                None => return Err(Refusal::ByteFallbackMissing { byte }),
            }
        }
        let metaspace = *vocab
            .get(&METASPACE.to_string())
            .ok_or(Refusal::NoMetaspace)?;
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
        let mut tables = SentencePieceTables {
            added: pipeline.added,
            bytes,
            metaspace,
            chars,
            merges: merge_table(bpe, &vocab)?,
            joined: {
                let mut pairs: Vec<(char, char)> =
                    Joins::from_merges(&merge_list).pairs.into_iter().collect();
                // A fixed order, so that an engine-cache entry is the same bytes on every build.
                pairs.sort_unstable();
                pairs
            },
            prepend: pipeline.prepend,
            spaces: pipeline.spaces,
            whole: TokenList::default(),
            num_tokens: vocab.len(),
        };
        // Worked out once per tokenizer file (the engine cache keeps it), by the engine itself.
        tables.whole = Self::from_tables(&tables)?.merging_to_themselves(&vocab);
        Ok(tables)
    }

    /// The engine from its tables (fresh from [`Self::learn`], or from the engine cache).
    pub fn from_tables(tables: &SentencePieceTables) -> Result<Self, Refusal> {
        let added = AddedSplitter::new(&tables.added, false)?;
        let bytes: [u32; 256] =
            tables
                .bytes
                .as_slice()
                .try_into()
                .map_err(|_| Refusal::ByteFallbackIds {
                    count: tables.bytes.len(),
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
            pairs: tables.joined.iter().copied().collect(),
        };
        let merges = Merges::new(tables.merges.iter().copied());
        let mut cut_ascii = [0u128; 128];
        for (a, row) in cut_ascii.iter_mut().enumerate() {
            for b in 0..128 {
                let (a_in, b_in) = (ascii[a] != NONE, ascii[b] != NONE);
                if joins.may_cut_between(char::from(a as u8), a_in, char::from(b as u8), b_in) {
                    *row |= 1 << b;
                }
            }
        }
        let whole = WholeTokens::new(&tables.whole);
        let description = format!(
            "fast path: dsprep's SentencePiece-style BPE with byte fallback, HF's merge loop over \
             HF's merges ({} tokens, {} merges, {} tokens looked up whole; {}; {} added tokens; \
             pieces cut between two characters no merge joins (the merges join {} pairs); piece \
             cache {} KiB per thread)",
            tables.num_tokens,
            merges.len(),
            whole.len(),
            tables.spaces,
            tables.added.len(),
            joins.pairs.len(),
            piece_cache::CACHE_BYTES >> 10,
        );
        Ok(Self {
            added,
            merges,
            ascii,
            chars,
            bytes,
            joins,
            cut_ascii,
            whole,
            prepend: tables.prepend,
            cache_owner: piece_cache::new_owner(),
            description,
        })
    }

    /// The tokens HF's merge loop gives back whole from their own text as a piece: each token's
    /// text keyed as the piece cache keys pieces (a space for "▁"), kept where
    /// [`Self::merge_piece`] over that key is that one token, so a hit is the loop's answer.
    fn merging_to_themselves(&self, vocab: &std::collections::HashMap<String, u32>) -> TokenList {
        let mut symbols = Vec::new();
        let mut whole: Vec<(Vec<u8>, u32)> = vocab
            .iter()
            .filter_map(|(token, &id)| {
                let key = token.replace(METASPACE, " ").into_bytes();
                self.merge_piece(&key, &mut symbols);
                (symbols == [id]).then_some((key, id))
            })
            .collect();
        // A fixed order, so that an engine-cache entry is the same bytes on every build.
        whole.sort_unstable_by_key(|&(_, id)| id);
        whole.into_iter().collect()
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Append the ids HF's `encode(text, add_special_tokens=False)` gives to `out`. Nothing
    /// here can fail: every character has a token or its bytes' tokens.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let Ok(()) = piece_cache::with_cache(self.cache_owner, |cache| {
            // Whether the next segment starts the document (no added token before it).
            let mut at_start = true;
            self.added.split(text, |segment| {
                match segment {
                    Segment::Added(id) => out.push(id),
                    Segment::Text(raw) => {
                        let prepended = self.prepends(raw, at_start);
                        self.encode_stretch(raw, prepended, cache, out);
                    }
                }
                at_start = false;
                Ok::<(), std::convert::Infallible>(())
            })
        });
    }

    /// Whether `raw`, a stretch between added tokens (the document's first, if `at_start`), gets
    /// a "▁" in front. HF's Metaspace asks whether the stretch starts with "▁" once spaces are
    /// "▁": a space or a "▁" in the text.
    fn prepends(&self, raw: &str, at_start: bool) -> bool {
        let there = raw.starts_with(' ') || raw.starts_with(METASPACE);
        match self.prepend {
            Prepend::Always => true,
            Prepend::UnlessThere => !there,
            Prepend::FirstUnlessThere => at_start && !there,
            Prepend::Never => false,
        }
    }

    /// May a piece end between `a` and `b`, whose tokens are `a_in` and `b_in` (else their
    /// `<0xNN>` bytes)?
    #[inline]
    fn may_cut_between(&self, a: char, a_in: bool, b: char, b_in: bool) -> bool {
        if a.is_ascii() && b.is_ascii() {
            return self.cut_ascii[a as usize] >> (b as u32) & 1 == 1;
        }
        self.joins.may_cut_between(a, a_in, b, b_in)
    }

    /// One stretch between added tokens (after a "▁" if `prepended`), cut into pieces.
    fn encode_stretch(
        &self,
        raw: &str,
        mut prepended: bool,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) {
        let bytes = raw.as_bytes();
        let mut piece_start = 0;
        // `prepended` from here: whether the next piece has the prepended "▁" in front.
        // The character before `at` and whether it has a token: none before the first (the
        // prepended "▁" may not end a piece alone).
        let mut before: Option<(char, bool)> = None;
        let mut at = 0;
        while at < bytes.len() {
            let b = bytes[at];
            let (c, in_vocab) = if b.is_ascii() {
                (char::from(b), self.ascii[usize::from(b)] != NONE)
            } else {
                match raw.get(at..).and_then(|rest| rest.chars().next()) {
                    Some(c) => (c, self.chars.contains_key(&c)),
                    None => break,
                }
            };
            if let Some((a, a_in)) = before
                && self.may_cut_between(a, a_in, c, in_vocab)
            {
                self.encode_piece(&bytes[piece_start..at], prepended, cache, out);
                (piece_start, prepended) = (at, false);
            }
            before = Some((c, in_vocab));
            at += c.len_utf8();
        }
        self.encode_piece(&bytes[piece_start..], prepended, cache, out);
    }

    /// One piece (raw bytes, a space standing for "▁"); `prepended`: the stretch's first piece,
    /// with the prepended "▁" in front, which a leading space stands for in the key.
    fn encode_piece(
        &self,
        piece: &[u8],
        prepended: bool,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) {
        let mut key = std::mem::take(&mut cache.key);
        key.clear();
        if prepended {
            key.push(b' ');
        }
        key.extend_from_slice(piece);
        if let Some(ids) = cache.get(&key) {
            match ids {
                [id] => out.push(*id),
                ids => out.extend_from_slice(ids),
            }
        } else if let Some(id) = self.whole.get(&key) {
            out.push(id);
            cache.insert(&key, &[id]);
        } else {
            let start = out.len();
            let mut symbols = std::mem::take(&mut cache.symbols);
            self.merge_piece(&key, &mut symbols);
            out.extend_from_slice(&symbols);
            cache.symbols = symbols;
            cache.insert(&key, &out[start..]);
        }
        cache.key = key;
    }

    /// HF's model on a piece keyed as the piece cache keys it (its text, a leading space for the
    /// prepended "▁"; valid UTF-8, since pieces are cut at characters): its characters' tokens
    /// (a character outside the vocabulary as its bytes' `<0xNN>` tokens), merged; into `symbols`.
    fn merge_piece(&self, key: &[u8], symbols: &mut Vec<u32>) {
        symbols.clear();
        for c in String::from_utf8_lossy(key).chars() {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joins(merges: &[(&str, &str)]) -> Joins {
        let merges: Vec<(String, String)> = merges
            .iter()
            .map(|&(l, r)| (l.to_string(), r.to_string()))
            .collect();
        Joins::from_merges(&merges)
    }

    #[test]
    fn a_cut_falls_only_where_no_merge_joins_the_two_characters() {
        let joins = joins(&[
            ("▁", "t"),
            ("▁t", "he"),
            ("e", "."),
            ("▁", "▁"),
            ("<0xF0>", "<0x9F>"),
        ]);
        // "▁" + "t…", "…e" + ".", "▁" + "▁": joined, so never cut; a space is "▁".
        assert!(!joins.may_cut_between(' ', true, 't', true));
        assert!(!joins.may_cut_between('\u{2581}', true, 't', true));
        assert!(!joins.may_cut_between('e', true, '.', true));
        assert!(!joins.may_cut_between(' ', true, ' ', true));
        // No merge ends in 'd' before '.', or in 'e' before "▁".
        assert!(joins.may_cut_between('d', true, '.', true));
        assert!(joins.may_cut_between('e', true, ' ', true));
        // A character outside the vocabulary is its bytes' tokens: "<0x…>" begins with '<' and
        // ends with '>', and ("<0xF0>", "<0x9F>") joins '>' to '<'.
        assert!(!joins.may_cut_between('🦀', false, '🦀', false));
        assert!(joins.may_cut_between('🦀', false, 'x', true));
        assert!(joins.may_cut_between('x', true, '🦀', false));
    }
}
