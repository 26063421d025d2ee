//! The tokenize stage: text → ids with a Hugging Face `tokenizer.json`, plus the recipe's BOS/EOS
//! policy. `&self` and thread-safe: drivers call it from many threads and put the results back
//! in document order. The ids are exactly those of HF `tokenizers`
//! (`encode(text, add_special_tokens=False)`), which the manifest's tokenizer sha256 promises.

use crate::recipe::{TokenRef, TokenizerSpec};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizer {origin}: does not parse as a tokenizer.json: {message}")]
    Parse { origin: String, message: String },
    #[error("tokenizer.{field}: token {token} is not in the vocabulary of {origin}")]
    UnknownToken { field: &'static str, token: TokenRef, origin: String },
    #[error("tokenizer {origin}: {vocab_size} ids do not fit in u32")]
    VocabTooLarge { origin: String, vocab_size: u64 },
    #[error("tokenizing a document of {bytes} bytes failed: {message}")]
    Encode { bytes: usize, message: String },
    #[error("decoding failed: {0}")]
    Decode(String),
}

pub struct TokenizeStage {
    tokenizer: Tokenizer,
    bos: Option<u32>,
    eos: u32,
    vocab_size: u32,
    sha256: String,
}

impl TokenizeStage {
    /// Build from the bytes of a `tokenizer.json`; `origin` names the file in errors.
    pub fn from_json_bytes(json: &[u8], spec: &TokenizerSpec, origin: &str) -> Result<Self, TokenizeError> {
        let tokenizer = Tokenizer::from_bytes(json)
            .map_err(|e| TokenizeError::Parse { origin: origin.to_string(), message: e.to_string() })?;
        // Ids run from 0 to the largest id in the vocabulary, added tokens included.
        let max_id = tokenizer.get_vocab(true).values().copied().max().unwrap_or(0);
        let vocab_size = u64::from(max_id) + 1;
        let vocab_size = u32::try_from(vocab_size)
            .map_err(|_| TokenizeError::VocabTooLarge { origin: origin.to_string(), vocab_size })?;
        let resolve = |field: &'static str, token: &TokenRef| -> Result<u32, TokenizeError> {
            let found = match token {
                TokenRef::Id(id) => tokenizer.id_to_token(*id).map(|_| *id),
                TokenRef::Text(text) => tokenizer.token_to_id(text),
            };
            found.ok_or_else(|| TokenizeError::UnknownToken { field, token: token.clone(), origin: origin.to_string() })
        };
        let eos = resolve("eos", &spec.eos)?;
        let bos = spec.bos.as_ref().map(|b| resolve("bos", b)).transpose()?;
        let sha256 = hex::encode(Sha256::digest(json));
        Ok(Self { tokenizer, bos, eos, vocab_size, sha256 })
    }

    /// Append the ids of one document (`[BOS] text-ids EOS`) to `out`.
    pub fn encode_doc(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| TokenizeError::Encode { bytes: text.len(), message: e.to_string() })?;
        out.extend(self.bos);
        out.extend_from_slice(encoding.get_ids());
        out.push(self.eos);
        Ok(())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.tokenizer.decode(ids, false).map_err(|e| TokenizeError::Decode(e.to_string()))
    }

    /// One more than the largest id the tokenizer can produce.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// sha256 of the `tokenizer.json` bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}
