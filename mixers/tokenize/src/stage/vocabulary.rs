//! The ids a recipe names, BOS, EOS and a `best_fit` pad, and the vocabulary's extent: read from
//! HF's tokenizer, or, for BOS and EOS, from an engine-cache entry without it.

use tokenizers::Tokenizer;

use crate::cache::entry::CachedHead;
use crate::{TokenRef, TokenizeError, TokenizerSpec};

/// The ids a recipe's BOS/EOS may name, and the vocabulary size: read from HF's tokenizer, or
/// from an engine-cache entry without it.
pub(crate) enum Vocabulary<'a> {
    Hf(&'a Tokenizer),
    Cached(&'a CachedHead),
}

impl Vocabulary<'_> {
    /// `Some(Some(id))` found, `Some(None)` not in the vocabulary, `None` the cache cannot say.
    pub(crate) fn find(&self, token: &TokenRef) -> Option<Option<u32>> {
        match (self, token) {
            (Self::Hf(hf), TokenRef::Id(id)) => Some(hf.id_to_token(*id).map(|_| *id)),
            (Self::Hf(hf), TokenRef::Text(text)) => Some(hf.token_to_id(text)),
            (Self::Cached(entry), TokenRef::Id(id)) => (*id < entry.dense_ids
                || entry.added.iter().any(|(_, added)| added == id))
            .then_some(Some(*id)),
            (Self::Cached(entry), TokenRef::Text(text)) => entry
                .added
                .iter()
                .find(|(content, _)| content == text)
                .map(|(_, id)| Some(*id)),
        }
    }
}

/// One more than the largest id (added tokens included), and the first id without a token.
pub(crate) fn vocab_extent(hf: &Tokenizer, origin: &str) -> Result<(u32, u32), TokenizeError> {
    let mut ids: Vec<u32> = hf.get_vocab(true).into_values().collect();
    ids.sort_unstable();
    ids.dedup();
    let max_id = ids.last().copied().unwrap_or(0);
    let vocab_size = u64::from(max_id) + 1;
    let vocab_size = u32::try_from(vocab_size).map_err(|_| TokenizeError::VocabTooLarge {
        origin: origin.to_string(),
        vocab_size,
    })?;
    let dense_ids = ids
        .iter()
        .enumerate()
        .take_while(|&(i, &id)| i as u64 == u64::from(id))
        .count();
    Ok((vocab_size, dense_ids as u32))
}

/// The recipe's BOS and EOS as ids.
pub(crate) fn resolve_specials(
    vocabulary: &Vocabulary<'_>,
    spec: &TokenizerSpec,
    origin: &str,
) -> Result<(Option<u32>, u32), TokenizeError> {
    let resolve = |field: &'static str, token: &TokenRef| -> Result<u32, TokenizeError> {
        vocabulary
            .find(token)
            .flatten()
            .ok_or_else(|| TokenizeError::UnknownToken {
                field,
                token: token.clone(),
                origin: origin.to_string(),
            })
    };
    let eos = resolve("eos", &spec.eos)?;
    let bos = spec.bos.as_ref().map(|b| resolve("bos", b)).transpose()?;
    Ok((bos, eos))
}

/// Why a `best_fit` recipe's `[packing] pad` names no pad of the tokenizer file `origin`, and
/// what to change (the EOS, `eos`, pads when `pad` is removed).
#[derive(Debug, thiserror::Error)]
pub enum PadError {
    /// The id is past the vocabulary (`last` is its largest id).
    #[error(
        "packing.pad = {id} is not an id of {origin} (its ids are 0 to {last}): name one of its \
         special tokens, or remove pad to pad with the EOS (id {eos})"
    )]
    NotAnId {
        id: u32,
        origin: String,
        last: u32,
        eos: u32,
    },
    /// The text is no token of the vocabulary.
    #[error(
        "packing.pad = {text:?} is not a token of {origin}: name one of its special tokens, or \
         remove pad to pad with the EOS (id {eos})"
    )]
    NotAToken {
        text: String,
        origin: String,
        eos: u32,
    },
    /// The token is an ordinary one (`text`, id `id`), which text itself becomes.
    #[error(
        "packing.pad = {pad} is the ordinary token {text:?} (id {id}), which text itself \
         becomes: name a special token of {origin} instead, or remove pad to pad with the EOS \
         (id {eos})"
    )]
    Ordinary {
        pad: TokenRef,
        text: String,
        id: u32,
        origin: String,
        eos: u32,
    },
}

/// The pad id of a `best_fit` recipe's `[packing] pad`, which must name a special (added) token
/// of `hf` (the file `origin`, whose EOS is `eos`). The error says what to change.
pub(crate) fn resolve_pad(
    hf: &Tokenizer,
    pad: &TokenRef,
    origin: &str,
    eos: u32,
    vocab_size: u32,
) -> Result<u32, PadError> {
    let id = match pad {
        TokenRef::Id(id) => {
            (hf.id_to_token(*id).map(|_| *id)).ok_or_else(|| PadError::NotAnId {
                id: *id,
                origin: origin.to_string(),
                last: vocab_size.saturating_sub(1),
                eos,
            })?
        }
        TokenRef::Text(text) => hf.token_to_id(text).ok_or_else(|| PadError::NotAToken {
            text: text.clone(),
            origin: origin.to_string(),
            eos,
        })?,
    };
    let decoder = hf.get_added_tokens_decoder();
    if decoder.get(&id).is_some_and(|t| t.special) {
        return Ok(id);
    }
    Err(PadError::Ordinary {
        pad: pad.clone(),
        text: hf.id_to_token(id).unwrap_or_default(),
        id,
        origin: origin.to_string(),
        eos,
    })
}

#[cfg(test)]
mod tests {
    use crate::{PadError, TokenRef, TokenizeError, TokenizeStage, TokenizerSpec};

    /// A pad that names no special token is a [`PadError`] that says what to change, in the
    /// words `tests/best_fit.rs` asserts through the CLI.
    #[test]
    fn a_pad_that_is_no_special_token_says_what_to_change() {
        let json = std::fs::read("../../config/tokenizers/gpt2/tokenizer.json").expect("gpt2");
        let spec = TokenizerSpec {
            path: String::new(),
            eos: TokenRef::Text("<|endoftext|>".to_string()),
            bos: None,
        };
        let stage = TokenizeStage::from_json_bytes(&json, &spec, "gpt2").expect("stage");
        let pad = |pad: TokenRef| stage.resolve_pad(Some(&pad));
        assert_eq!(stage.resolve_pad(None).ok(), Some(50256));
        assert_eq!(
            pad(TokenRef::Text("<|endoftext|>".into())).ok(),
            Some(50256)
        );
        let refused = |token: TokenRef| match pad(token) {
            Err(TokenizeError::Pad(error)) => error,
            other => panic!("not a PadError: {other:?}"),
        };
        let not_an_id = refused(TokenRef::Id(60000));
        assert!(matches!(not_an_id, PadError::NotAnId { last: 50256, .. }));
        assert_eq!(
            not_an_id.to_string(),
            "packing.pad = 60000 is not an id of gpt2 (its ids are 0 to 50256): name one of its \
             special tokens, or remove pad to pad with the EOS (id 50256)"
        );
        assert_eq!(
            refused(TokenRef::Text("no such token".into())).to_string(),
            "packing.pad = \"no such token\" is not a token of gpt2: name one of its special \
             tokens, or remove pad to pad with the EOS (id 50256)"
        );
        let ordinary = refused(TokenRef::Text("the".into()));
        assert!(matches!(ordinary, PadError::Ordinary { id: 1169, .. }));
        assert_eq!(
            ordinary.to_string(),
            "packing.pad = \"the\" is the ordinary token \"the\" (id 1169), which text itself \
             becomes: name a special token of gpt2 instead, or remove pad to pad with the EOS \
             (id 50256)"
        );
    }
}
