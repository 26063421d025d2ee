//! The tokenize stage: text → ids with a Hugging Face `tokenizer.json`, plus the recipe's BOS/EOS
//! policy. `&self` and thread-safe: drivers call it from many threads and put the results back
//! in document order. The ids are exactly those of HF `tokenizers`
//! (`encode(text, add_special_tokens=False)`), which the manifest's tokenizer sha256 promises.
//!
//! Two engines produce those ids: HF `tokenizers` itself, and dsprep's fast path, chosen only when
//! the `tokenizer.json` is one it reproduces step for step: byte-level BPE ([`byte_level`]) and
//! SentencePiece-style BPE with byte fallback ([`sentencepiece`]), both on HF's own merge loop
//! ([`merges`]) with a per-thread piece cache ([`piece_cache`]). Otherwise the stage says why and
//! runs HF.

mod added;
mod byte_level;
mod byte_vocab;
mod char_classes;
mod cl100k_split;
mod gpt2_split;
mod merges;
mod piece_cache;
mod pipeline;
mod sentencepiece;

use crate::recipe::{TokenRef, TokenizerSpec};
use byte_level::ByteLevelBpe;
use sentencepiece::SentencePieceBpe;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizer {origin}: does not parse as a tokenizer.json: {message}")]
    Parse { origin: String, message: String },
    #[error("tokenizer.{field}: token {token} is not in the vocabulary of {origin}")]
    UnknownToken {
        field: &'static str,
        token: TokenRef,
        origin: String,
    },
    #[error("tokenizer {origin}: {vocab_size} ids do not fit in u32")]
    VocabTooLarge { origin: String, vocab_size: u64 },
    #[error("tokenizing a document of {bytes} bytes failed: {message}")]
    Encode { bytes: usize, message: String },
    #[error("decoding failed: {0}")]
    Decode(String),
}

/// Which engine [`TokenizeStage`] may run. Both give the same ids; `Hf` exists to compare the
/// two and as an escape hatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// dsprep's fast path when the tokenizer.json is one it reproduces exactly, else HF.
    #[default]
    Auto,
    /// Always HF `tokenizers`.
    Hf,
}

/// The two engines of the fast path.
enum FastEngine {
    ByteLevel(Box<ByteLevelBpe>),
    SentencePiece(Box<SentencePieceBpe>),
}

impl FastEngine {
    /// The engine for the tokenizer's kind of BPE, or why it would not reproduce HF's ids.
    fn build(tokenizer: &Tokenizer) -> Result<Self, pipeline::Refusal> {
        if pipeline::has_byte_fallback(tokenizer) {
            SentencePieceBpe::build(tokenizer).map(|e| Self::SentencePiece(Box::new(e)))
        } else {
            ByteLevelBpe::build(tokenizer).map(|e| Self::ByteLevel(Box::new(e)))
        }
    }

    fn description(&self) -> &str {
        match self {
            Self::ByteLevel(engine) => engine.description(),
            Self::SentencePiece(engine) => engine.description(),
        }
    }

    fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        match self {
            Self::ByteLevel(engine) => engine.encode(text, out),
            Self::SentencePiece(engine) => engine.encode(text, out),
        }
    }
}

pub struct TokenizeStage {
    tokenizer: Tokenizer,
    /// `Some` when the fast path runs; HF `tokenizer` is still kept for `decode` and ids.
    fast: Option<FastEngine>,
    engine_description: String,
    bos: Option<u32>,
    eos: u32,
    vocab_size: u32,
    sha256: String,
}

impl TokenizeStage {
    /// Build from the bytes of a `tokenizer.json`; `origin` names the file in errors. Uses the
    /// fast path when it is provably exact ([`EngineChoice::Auto`]).
    pub fn from_json_bytes(
        json: &[u8],
        spec: &TokenizerSpec,
        origin: &str,
    ) -> Result<Self, TokenizeError> {
        Self::from_json_bytes_with(json, spec, origin, EngineChoice::Auto)
    }

    /// As [`Self::from_json_bytes`], with the engine chosen by `choice`.
    pub fn from_json_bytes_with(
        json: &[u8],
        spec: &TokenizerSpec,
        origin: &str,
        choice: EngineChoice,
    ) -> Result<Self, TokenizeError> {
        let tokenizer = Tokenizer::from_bytes(json).map_err(|e| TokenizeError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        // Ids run from 0 to the largest id in the vocabulary, added tokens included.
        let max_id = tokenizer
            .get_vocab(true)
            .values()
            .copied()
            .max()
            .unwrap_or(0);
        let vocab_size = u64::from(max_id) + 1;
        let vocab_size = u32::try_from(vocab_size).map_err(|_| TokenizeError::VocabTooLarge {
            origin: origin.to_string(),
            vocab_size,
        })?;
        let resolve = |field: &'static str, token: &TokenRef| -> Result<u32, TokenizeError> {
            let found = match token {
                TokenRef::Id(id) => tokenizer.id_to_token(*id).map(|_| *id),
                TokenRef::Text(text) => tokenizer.token_to_id(text),
            };
            found.ok_or_else(|| TokenizeError::UnknownToken {
                field,
                token: token.clone(),
                origin: origin.to_string(),
            })
        };
        let eos = resolve("eos", &spec.eos)?;
        let bos = spec.bos.as_ref().map(|b| resolve("bos", b)).transpose()?;
        let sha256 = hex::encode(Sha256::digest(json));
        let (fast, engine_description) = match choice {
            EngineChoice::Hf => (None, "HF tokenizers (engine Hf was asked for)".to_string()),
            EngineChoice::Auto => match FastEngine::build(&tokenizer) {
                Ok(fast) => {
                    let description = fast.description().to_string();
                    (Some(fast), description)
                }
                Err(refusal) => (None, format!("HF tokenizers: {refusal}")),
            },
        };
        Ok(Self {
            tokenizer,
            fast,
            engine_description,
            bos,
            eos,
            vocab_size,
            sha256,
        })
    }

    /// Append the ids of one document (`[BOS] text-ids EOS`) to `out`. On error `out` is left
    /// as it was.
    pub fn encode_doc(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        let start_len = out.len();
        out.extend(self.bos);
        let encoded = match &self.fast {
            Some(fast) => fast.encode(text, out),
            None => self
                .tokenizer
                .encode_fast(text, false)
                .map(|encoding| out.extend_from_slice(encoding.get_ids()))
                .map_err(|e| e.to_string()),
        };
        if let Err(message) = encoded {
            out.truncate(start_len);
            return Err(TokenizeError::Encode {
                bytes: text.len(),
                message,
            });
        }
        out.push(self.eos);
        Ok(())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| TokenizeError::Decode(e.to_string()))
    }

    /// Which engine encodes, and under [`EngineChoice::Auto`] why HF runs when it does (e.g.
    /// "HF tokenizers: normalizer NFKC is not reproduced by the fast path"). For logs and
    /// manifests: the ids do not depend on it.
    pub fn engine_description(&self) -> String {
        self.engine_description.clone()
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
