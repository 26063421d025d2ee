//! The vocabulary of a byte-level BPE as the fast path uses it: each of the 256 bytes' ids, the
//! pieces that are one token whole ([`crate::engines::whole_tokens`]), and the merge table
//! ([`crate::engines::merges`]) read from HF's own model. Nothing here needs proving: the merge
//! loop is HF's, over HF's merges, and the whole tokens are what HF's lookup (`ignore_merges`) or that
//! merge loop gives, so the only checks are that every byte has a token (else HF would take its
//! unknown-token path) and that the merges name tokens of the vocabulary.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::BPE;

use super::Refusal;
use super::token_list::TokenList;
use crate::engines::merges::{BytePairs, Merges};
use crate::engines::whole_tokens::WholeTokens;

/// What the byte-level engine needs of the vocabulary.
pub(crate) struct ByteVocab {
    /// The pieces that are one token whole.
    pub whole: WholeTokens,
    /// The bytes' tokens, and the merges of every two of them.
    pub byte_pairs: BytePairs,
    pub merges: Merges,
    pub ignore_merges: bool,
    pub num_tokens: usize,
}

/// What [`read`] reads from HF's model, as plain data: the form the engine cache
/// ([`crate::cache::entry`]) keeps, and what [`ByteVocab::from_tables`] builds the engine's
/// vocabulary from.
#[derive(Serialize, Deserialize)]
pub(crate) struct VocabTables {
    /// The pieces that are one token whole, as bytes and id: for `ignore_merges` vocabularies
    /// every token, else the tokens whose bytes the merge loop merges back into them. In the
    /// engine cache as bytes after the JSON (`cache/packed_tables.rs`).
    #[serde(skip)]
    pub whole: TokenList,
    /// The 256 bytes' ids.
    pub byte_ids: Vec<u32>,
    /// The merges in rank order: left id, right id, merged id. In the engine cache as bytes
    /// after the JSON (`cache/packed_tables.rs`).
    #[serde(skip)]
    pub merges: Vec<(u32, u32, u32)>,
    pub ignore_merges: bool,
    pub num_tokens: usize,
}

impl ByteVocab {
    /// The vocabulary from its tables (fresh from [`read`], or from the engine cache).
    pub fn from_tables(tables: &VocabTables) -> Result<Self, Refusal> {
        let byte_ids: [u32; 256] =
            tables
                .byte_ids
                .as_slice()
                .try_into()
                .map_err(|_| Refusal::ByteIds {
                    count: tables.byte_ids.len(),
                })?;
        let whole = WholeTokens::new(&tables.whole);
        let merges = Merges::new(tables.merges.iter().copied());
        Ok(Self {
            whole,
            byte_pairs: BytePairs::new(&merges, byte_ids),
            merges,
            ignore_merges: tables.ignore_merges,
            num_tokens: tables.num_tokens,
        })
    }
}

/// GPT-2's byte ↔ printable-character table that byte-level BPE vocabularies are written in
/// (HF `pre_tokenizers::byte_level::bytes_char`): printable Latin-1 bytes stand for themselves,
/// the other 68 bytes take the characters from U+0100 on, in byte order.
pub(crate) fn byte_to_char() -> [char; 256] {
    let stands_for_itself = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next_shifted = 0x100u32;
    for b in 0..=255u8 {
        table[usize::from(b)] = if stands_for_itself(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next_shifted).unwrap_or('\0');
            next_shifted += 1;
            c
        };
    }
    table
}

/// The bytes a vocabulary string stands for; `None` when it has a character outside the
/// byte-level alphabet (such a token can never come out of byte-level BPE).
fn token_bytes(token: &str, char_to_byte: &FxHashMap<char, u8>) -> Option<Vec<u8>> {
    token
        .chars()
        .map(|c| char_to_byte.get(&c).copied())
        .collect()
}

/// How many of the model's vocabulary entries, other than the `added` tokens' contents, have a
/// character outside the byte-level alphabet: none in a byte-level BPE's vocabulary as GPT-2
/// wrote it; Command R+'s 1,403 emoji and symbols written in raw UTF-8; every multi-byte token
/// of a SentencePiece-style vocabulary.
pub(crate) fn raw_utf8_tokens(bpe: &BPE, added: &[String]) -> usize {
    let alphabet: FxHashSet<char> = byte_to_char().into_iter().collect();
    let added: FxHashSet<&str> = added.iter().map(String::as_str).collect();
    (bpe.get_vocab().keys())
        .filter(|token| !added.contains(token.as_str()))
        .filter(|token| token.chars().any(|c| !alphabet.contains(&c)))
        .count()
}

/// Read the vocabulary and merges of HF's byte-level BPE model.
pub(crate) fn read(bpe: &BPE) -> Result<VocabTables, Refusal> {
    let char_to_byte: FxHashMap<char, u8> = byte_to_char()
        .iter()
        .enumerate()
        .filter_map(|(b, c)| u8::try_from(b).ok().map(|b| (*c, b)))
        .collect();
    let vocab = bpe.get_vocab();
    let mut seen_ids: FxHashSet<u32> = FxHashSet::default();
    let mut tokens = Vec::new();
    for (token, &id) in &vocab {
        if !seen_ids.insert(id) {
            return Err(Refusal::SharedId { id });
        }
        if let Some(bytes) = token_bytes(token, &char_to_byte) {
            tokens.push((bytes, id));
        }
    }
    // A fixed order, so that an engine-cache entry is the same bytes on every build.
    tokens.sort_unstable_by_key(|&(_, id)| id);
    // Every byte needs a token, else HF's per-character lookup takes its unknown-token path.
    let mut byte_ids = [0u32; 256];
    for (byte, (id, c)) in (0..=255u8).zip(byte_ids.iter_mut().zip(byte_to_char())) {
        *id = *(vocab.get(&c.to_string())).ok_or(Refusal::ByteWithoutToken { byte })?;
    }
    let merges = merge_table(bpe, &vocab)?;
    let whole = if bpe.ignore_merges {
        tokens.into_iter().collect()
    } else {
        merging_to_themselves(tokens, &merges, byte_ids)
    };
    Ok(VocabTables {
        whole,
        byte_ids: byte_ids.to_vec(),
        merges,
        ignore_merges: bpe.ignore_merges,
        num_tokens: vocab.len(),
    })
}

/// The tokens whose bytes HF's merge loop (over `merges`) merges into that one token.
fn merging_to_themselves(
    tokens: Vec<(Vec<u8>, u32)>,
    merges: &[(u32, u32, u32)],
    byte_ids: [u32; 256],
) -> TokenList {
    let table = Merges::new(merges.iter().copied());
    let byte_pairs = BytePairs::new(&table, byte_ids);
    let mut symbols = Vec::new();
    tokens
        .into_iter()
        .filter(|(bytes, id)| {
            table.merge_bytes(bytes, &byte_pairs, &mut symbols);
            symbols == [*id]
        })
        .collect()
}

/// HF's merges as ids, in rank order: each pair's tokens and the token their concatenation is.
pub(crate) fn merge_table(
    bpe: &BPE,
    vocab: &std::collections::HashMap<String, u32>,
) -> Result<Vec<(u32, u32, u32)>, Refusal> {
    let merges = serialized_merges(bpe)?;
    let id = |token: &str, index: usize| {
        vocab
            .get(token)
            .copied()
            .ok_or_else(|| Refusal::MergeOutsideVocabulary {
                index,
                token: token.to_string(),
            })
    };
    let mut table = Vec::with_capacity(merges.len());
    for (index, (left, right)) in merges.iter().enumerate() {
        let merged = format!("{left}{right}");
        table.push((id(left, index)?, id(right, index)?, id(&merged, index)?));
    }
    Ok(table)
}

/// HF keeps its merges private; its serializer is the public view of the merge map. (Through
/// bytes rather than a `serde_json::Value`: the vocabulary is then skipped, not built as a tree.)
pub(crate) fn serialized_merges(bpe: &BPE) -> Result<Vec<(String, String)>, Refusal> {
    #[derive(serde::Deserialize)]
    struct Merges {
        merges: Vec<(String, String)>,
    }
    serde_json::to_vec(bpe)
        .and_then(|bytes| serde_json::from_slice::<Merges>(&bytes))
        .map(|m| m.merges)
        .map_err(|e| Refusal::Merges {
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection_onto_hf_alphabet() {
        let table = byte_to_char();
        let ours: std::collections::HashSet<char> = table.iter().copied().collect();
        let hf: std::collections::HashSet<char> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .collect();
        assert_eq!(ours.len(), 256);
        assert_eq!(ours, hf);
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
    }

    /// HF's byte-level pre-tokenizer writes each UTF-8 byte as a character; ours must agree on
    /// every byte that can occur in text.
    #[test]
    fn byte_table_matches_hf_pre_tokenizer() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let table = byte_to_char();
        let byte_level =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false);
        for c in [
            '\u{0}', '\u{7f}', 'a', ' ', '\u{80}', 'é', '\u{7ff}', '€', '\u{ffff}', '😀',
        ]
        .into_iter()
        .chain((0u32..0x80).filter_map(char::from_u32))
        .chain((0x80u32..0x800).step_by(7).filter_map(char::from_u32))
        // Three- and four-byte characters: every lead byte 0xE0..=0xF4, many trail bytes.
        .chain(
            (0x800u32..0x11_0000)
                .step_by(251)
                .filter_map(char::from_u32),
        ) {
            let text = c.to_string();
            let mut pre = PreTokenizedString::from(text.as_str());
            byte_level.pre_tokenize(&mut pre).expect("pre-tokenize");
            let hf: String = pre
                .get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(s, _, _)| s)
                .collect();
            let ours: String = text.bytes().map(|b| table[usize::from(b)]).collect();
            assert_eq!(hf, ours, "{c:?}");
        }
    }
}
