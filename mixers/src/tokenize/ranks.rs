//! The vocabulary half of the fast path's exactness check: turns HF's byte-level BPE vocabulary
//! and merge list into tiktoken ranks (bytes → id) and proves that tiktoken's merge loop gives
//! HF's ids for every possible piece, or refuses.
//!
//! The two loops differ. HF merges the adjacent pair with the lowest *merge-list index* among
//! pairs listed in `merges` (leftmost on a tie); tiktoken merges the adjacent pair whose
//! *concatenation* is a token with the lowest id (leftmost on a tie), whether or not that pair is
//! a listed merge. With ranks = ids they agree for every input when (checked below):
//! 1. the merged token's id never decreases along the merge list. So the merges of one token are
//!    next to each other, and both loops order merges of *different* tokens the same way.
//!    Vocabularies trained by HF or sentencepiece have one merge per token, in id order;
//!    vocabularies converted from tiktoken (Llama 3, cl100k, o200k) list every split of a token
//!    into two tokens, in rank order, which this allows;
//! 2. for every token t, tiktoken's own run on t's bytes (with t taken out of the ranks) stops at
//!    two parts (x, y) — the one way tiktoken ever builds t — and (x, y) is one of HF's merges
//!    for t; or it stops at more parts, and then tiktoken never builds t by merging.
//!
//! Why that suffices. Inside any piece, take adjacent parts x, y (in a state both loops have
//! reached) whose concatenation is a token t. No merge has crossed the ends of t's span, and
//! inside it the lowest-id-then-leftmost choice is the choice tiktoken makes on t's bytes alone,
//! so the parts over the span evolved exactly as in that solo run, which reached [x, y] and, with
//! t left out, stops there: (x, y) is the split of point 2, a listed HF merge (and t is not a
//! token left out below). So the pairs tiktoken may merge are exactly the pairs HF may merge, and
//! all candidates making one token t are the same merge, of one merge index. By point 1, HF's
//! lowest merge index is then tiktoken's lowest id, and both take the leftmost of those: at each
//! step both loops make the same merge, and both stop together.
//!
//! Whole pieces: tiktoken returns a piece's id directly when the piece is a token; HF does that
//! only with `ignore_merges`. Without it, tokens tiktoken never builds (point 2, second case) are
//! left out of the ranks: they were never merge candidates that won, so the runs are unchanged,
//! and the direct lookup then only finds tokens the merge loop would reach anyway.

use rustc_hash::{FxHashMap, FxHashSet};
use tokenizers::models::bpe::BPE;

use super::pipeline::Refusal;

/// tiktoken's ranks for a vocabulary, with what was found on the way (for the description).
pub(crate) struct Ranks {
    pub encoder: FxHashMap<Vec<u8>, u32>,
    pub num_tokens: usize,
    pub num_merges: usize,
    /// Tokens no merge sequence builds, left out of `encoder` (without `ignore_merges`).
    pub num_unreachable: usize,
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

/// Short printable form of a token's bytes for refusal messages.
fn show(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown: String = text.chars().take(24).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    format!("{shown:?}")
}

/// Build tiktoken's ranks from HF's BPE model and prove the two merge loops agree.
pub(crate) fn build(bpe: &BPE) -> Result<Ranks, Refusal> {
    let char_to_byte: FxHashMap<char, u8> = byte_to_char()
        .iter()
        .enumerate()
        .filter_map(|(b, c)| u8::try_from(b).ok().map(|b| (*c, b)))
        .collect();

    // Vocabulary as bytes → id. Ids must be unique: tiktoken keys its decoder by id (and
    // asserts on duplicates), HF would map both strings to the one id.
    let vocab = bpe.get_vocab();
    let mut encoder: FxHashMap<Vec<u8>, u32> = FxHashMap::default();
    let mut seen_ids: FxHashSet<u32> = FxHashSet::default();
    for (token, &id) in &vocab {
        if !seen_ids.insert(id) {
            return Err(Refusal::new(format!(
                "two vocabulary entries share id {id}"
            )));
        }
        if let Some(bytes) = token_bytes(token, &char_to_byte) {
            encoder.insert(bytes, id);
        }
    }
    // Every byte needs a token, else HF's per-character lookup takes the unk/drop path that
    // tiktoken does not have (and tiktoken would panic on the missing rank).
    if let Some(b) = (0..=255u8).find(|b| !encoder.contains_key(&[*b][..])) {
        return Err(Refusal::new(format!(
            "byte 0x{b:02X} has no token in the vocabulary"
        )));
    }

    // HF's effective merge list in rank order (its serializer writes the merge map sorted by
    // rank, after duplicates were resolved the way HF resolves them).
    let merges = serialized_merges(bpe)?;
    // Token id → where each of its listed merges splits its bytes.
    let mut merge_splits: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    let mut previous: Option<(u32, usize)> = None;
    for (index, (left, right)) in merges.iter().enumerate() {
        let (Some(left_bytes), Some(right_bytes)) = (
            token_bytes(left, &char_to_byte),
            token_bytes(right, &char_to_byte),
        ) else {
            // A merge of tokens outside the byte alphabet never fires on byte-level input.
            continue;
        };
        let merged = [left_bytes.as_slice(), right_bytes.as_slice()].concat();
        let Some(&id) = encoder.get(&merged) else {
            return Err(Refusal::new(format!(
                "merge #{index} ({left:?}, {right:?}) makes no vocabulary token"
            )));
        };
        if let Some((previous_id, previous_index)) = previous
            && id < previous_id
        {
            return Err(Refusal::new(format!(
                "merge #{index} ({left:?}, {right:?}) makes id {id}, below id {previous_id} of \
                 merge #{previous_index}: HF's merge order and tiktoken's rank order differ"
            )));
        }
        previous = Some((id, index));
        merge_splits.entry(id).or_default().push(left_bytes.len());
    }

    // Point 2 of the module doc: how tiktoken builds each multi-byte token.
    let multi_byte: Vec<(Vec<u8>, u32)> = encoder
        .iter()
        .filter(|(bytes, _)| bytes.len() > 1)
        .map(|(bytes, id)| (bytes.clone(), *id))
        .collect();
    let mut unreachable = Vec::new();
    for (bytes, id) in multi_byte {
        encoder.remove(&bytes);
        let parts = tiktoken_rs::byte_pair_split(&bytes, &encoder);
        let tiktoken_split = (parts.len() == 2).then(|| parts[0].len());
        encoder.insert(bytes.clone(), id);
        let hf_splits = merge_splits.get(&id).map_or(&[][..], Vec::as_slice);
        match tiktoken_split {
            None => unreachable.push(bytes),
            Some(at) if hf_splits.contains(&at) => {}
            Some(at) => {
                let hf = match hf_splits {
                    [] => "HF has no merge for it".to_string(),
                    splits => {
                        let shown: Vec<String> = splits
                            .iter()
                            .map(|&hf_at| {
                                format!("{} + {}", show(&bytes[..hf_at]), show(&bytes[hf_at..]))
                            })
                            .collect();
                        format!("HF merges {}", shown.join(" or "))
                    }
                };
                return Err(Refusal::new(format!(
                    "token {id} {}: tiktoken builds it from {} + {}, {hf}",
                    show(&bytes),
                    show(&bytes[..at]),
                    show(&bytes[at..])
                )));
            }
        }
    }
    let num_unreachable = if bpe.ignore_merges {
        0
    } else {
        for bytes in &unreachable {
            encoder.remove(bytes);
        }
        unreachable.len()
    };
    Ok(Ranks {
        num_tokens: vocab.len(),
        num_merges: merges.len(),
        num_unreachable,
        encoder,
    })
}

/// HF keeps its merges private; its serializer is the public view of the merge map. (Through
/// bytes rather than a `serde_json::Value`: the vocabulary is then skipped, not built as a tree.)
fn serialized_merges(bpe: &BPE) -> Result<Vec<(String, String)>, Refusal> {
    #[derive(serde::Deserialize)]
    struct Merges {
        merges: Vec<(String, String)>,
    }
    serde_json::to_vec(bpe)
        .and_then(|bytes| serde_json::from_slice::<Merges>(&bytes))
        .map(|m| m.merges)
        .map_err(|e| Refusal::new(format!("could not read the BPE merges back: {e}")))
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
