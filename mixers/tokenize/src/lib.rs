//! The tokenize stage: text → ids with a Hugging Face `tokenizer.json`, plus the recipe's BOS/EOS
//! policy. `&self` and thread-safe: drivers call it from many threads and put the results back
//! in document order. The ids are exactly those of HF `tokenizers`
//! (`encode(text, add_special_tokens=False)`), which the manifest's tokenizer sha256 promises.
//!
//! Three engines produce those ids, chosen per file by what was measured fastest
//! ([`engines::choice`]): HF `tokenizers` 1.x ([`engines::hf1`]) for byte-level BPE; dsprep's own
//! engine, only where the `tokenizer.json` is one it reproduces step for step, for
//! SentencePiece-style BPE with byte fallback ([`engines::sentencepiece`]) and for byte-level BPE
//! that 1.x does not encode exactly ([`engines::byte_level`], its pre-tokenizer regex run by a
//! [`scanner`] where one is registered), both on HF's own merge loop ([`engines::merges`]) with a
//! per-thread piece cache ([`engines::piece_cache`]); and HF `tokenizers` 0.23 for anything else,
//! the stage saying why.
//!
//! The crate's parts: [`read`] reads HF's file for the own engines and says what they refuse;
//! [`engines`] holds the engines and the choice between them; [`scanner`] the hand-written
//! stand-ins for pre-tokenizer regexes; [`cache`] the engine cache's entries; [`stage`] builds
//! this facade's [`TokenizeStage`].

mod cache;
mod engines;
mod read;
mod scanner;
mod spec;
mod stage;

use std::sync::{Arc, OnceLock};

use engines::engine_slot::{Encoder, EngineSlot};
use tokenizers::Tokenizer;

pub use cache::EngineCache;
pub use engines::EncodeError;
pub use spec::{TokenRef, TokenizerSpec};
pub use stage::vocabulary::PadError;

/// The crate's error: what the caller asked for that the tokenizer file does not give, or a
/// document the engine failed on. What failed inside is the wing's own error ([`EncodeError`],
/// [`PadError`]), shown in the same words.
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
    #[error("tokenizing a document of {bytes} bytes failed: {error}")]
    Encode { bytes: usize, error: EncodeError },
    #[error("decoding failed: {0}")]
    Decode(String),
    /// A `best_fit` recipe's `[packing] pad` that names no pad of the tokenizer.
    #[error(transparent)]
    Pad(#[from] PadError),
}

/// Which engine [`TokenizeStage`] may run. All give the same ids (HF 0.23's); `Auto` is the
/// fastest for the file, the others exist to compare them and as escape hatches. `Hf1` is not
/// exact for one file measured (Command R+, whose vocabulary holds emoji as raw UTF-8 tokens that
/// 1.x emits and 0.23 never does: `mixers/tokenize/tests/hf1_differential.rs`), which is why
/// `Auto` does not give it such a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// The engine measured fastest for the file's family ([`engines::choice`]): HF `tokenizers`
    /// 1.x for byte-level BPE, dsprep's own engine for SentencePiece-style BPE and for a file 1.x
    /// does not encode exactly, HF 0.23 for what neither reproduces.
    #[default]
    Auto,
    /// dsprep's own engine when the tokenizer.json is one it reproduces exactly, else HF 0.23.
    Own,
    /// Always HF `tokenizers` 0.23.
    Hf,
    /// HF `tokenizers` 1.x (a release candidate) when it reads the tokenizer.json, else HF 0.23
    /// (the engine line says why).
    Hf1,
}

pub struct TokenizeStage {
    /// HF's tokenizer when it encodes; beside the fast engine, parsed from `json` only for a
    /// `decode` (a `best_fit` pad is looked up in a parse that is not kept).
    hf: OnceLock<Tokenizer>,
    /// The file's bytes, for HF's parse when it is first needed (empty when HF encodes);
    /// shared with the caller that read them ([`Self::from_json_bytes_cached`]).
    json: Arc<Vec<u8>>,
    origin: String,
    /// The engine that encodes: built with the stage, or, from an engine-cache entry, by the
    /// first caller of [`Self::build_engine`] or [`Self::encode_doc`].
    engine: EngineSlot,
    bos: Option<u32>,
    eos: u32,
    vocab_size: u32,
    sha256: String,
    /// The engine cache an entry came from, and the entry's key: should that entry's tables not
    /// build, the engine chosen from the file instead replaces it there.
    cache: Option<(SharedEngineCache, String)>,
    /// `Auto` or `Own`: what chooses the engine again should an entry's not build.
    choice: EngineChoice,
}

/// An engine cache the stage may keep, to replace an entry found unsound on the building thread.
pub type SharedEngineCache = Arc<dyn EngineCache + Send + Sync>;

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
        // A copy here costs nothing worth counting: without a cache HF parses the file at once
        // (about a second for Llama 3). The stage keeps it beside the fast engine only.
        Self::from_json_bytes_cached(Arc::new(json.to_vec()), spec, origin, choice, None)
    }

    /// As [`Self::from_json_bytes_with`], reading the fast engine's tables from `cache` when it
    /// holds a sound entry for this file, and keeping them there when it does not. The ids are
    /// the same either way; the engine line says which it was. From an entry, the engine is
    /// built when first asked for: a caller that has a thread to spare runs
    /// [`Self::build_engine`] on it while the run starts, else the first document builds it.
    ///
    /// The stage keeps `json` (shared, not copied) until it parses HF's tokenizer, if ever.
    pub fn from_json_bytes_cached(
        json: Arc<Vec<u8>>,
        spec: &TokenizerSpec,
        origin: &str,
        choice: EngineChoice,
        cache: Option<SharedEngineCache>,
    ) -> Result<Self, TokenizeError> {
        Self::build(json, spec, origin, choice, cache)
    }

    /// Append the ids of one document (`[BOS] text-ids EOS`) to `out`. On error `out` is left
    /// as it was.
    pub fn encode_doc(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        let start_len = out.len();
        out.extend(self.bos);
        let encoded = match &self.engine().encoder {
            Encoder::Fast(fast) => fast.encode(text, out),
            Encoder::Hf1(hf1) if engines::hf1::cuts_like_hf(text) => hf1.encode(text, out),
            Encoder::Hf1(_) | Encoder::Hf => self
                .hf()?
                .encode_fast(text, false)
                .map(|encoding| out.extend_from_slice(encoding.get_ids()))
                .map_err(|e| EncodeError::Hf {
                    message: e.to_string(),
                }),
        };
        if let Err(error) = encoded {
            out.truncate(start_len);
            return Err(TokenizeError::Encode {
                bytes: text.len(),
                error,
            });
        }
        out.push(self.eos);
        Ok(())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.hf()?
            .decode(ids, false)
            .map_err(|e| TokenizeError::Decode(e.to_string()))
    }

    /// Build the engine now if it is still to build (from an engine-cache entry), so that the
    /// first document does not wait for it. Any thread may call it, once or more; threads that
    /// encode meanwhile wait for it.
    pub fn build_engine(&self) {
        self.engine();
    }

    /// Which engine encodes and why (e.g. "HF tokenizers: normalizer Lowercase is not
    /// reproduced by the fast path"). For logs and manifests: the ids do not depend on it.
    /// Builds an engine still to build.
    pub fn engine_description(&self) -> String {
        self.engine().description.clone()
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

    /// The pad id of a `best_fit` recipe: `[packing] pad` when set, which must name a special
    /// (added) token of the tokenizer, else the recipe's EOS. The error says what to change.
    pub fn resolve_pad(&self, pad: Option<&TokenRef>) -> Result<u32, TokenizeError> {
        let Some(pad) = pad else {
            return Ok(self.eos);
        };
        // Asked once, before the run: HF parsed for it is dropped after, not kept for the run.
        let parsed;
        let hf = match self.hf.get() {
            Some(hf) => hf,
            None => {
                parsed = stage::build::parse_tokenizer(&self.json, &self.origin)?;
                &parsed
            }
        };
        let pad = stage::vocabulary::resolve_pad(hf, pad, &self.origin, self.eos, self.vocab_size)?;
        Ok(pad)
    }

    /// sha256 of the `tokenizer.json` bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}
