//! The tokenize stage: text → ids with a Hugging Face `tokenizer.json`, plus the recipe's BOS/EOS
//! policy. `&self` and thread-safe: drivers call it from many threads and put the results back
//! in document order. The ids are exactly those of HF `tokenizers`
//! (`encode(text, add_special_tokens=False)`), which the manifest's tokenizer sha256 promises.
//!
//! Three engines produce those ids, chosen per file by what was measured fastest ([`choice`]):
//! HF `tokenizers` 1.x ([`hf1`]) for byte-level BPE; dsprep's own engine, only where the
//! `tokenizer.json` is one it reproduces step for step, for SentencePiece-style BPE with byte
//! fallback ([`sentencepiece`]) and for byte-level BPE that 1.x does not encode exactly
//! ([`byte_level`], its pre-tokenizer regex run by a [`scanner`] where one is registered), both on
//! HF's own merge loop ([`merges`]) with a per-thread piece cache ([`piece_cache`]); and HF
//! `tokenizers` 0.23 for anything else, the stage saying why.

mod added;
mod byte_level;
mod byte_vocab;
mod char_classes;
mod choice;
mod engine_cache;
mod engine_slot;
mod hf1;
mod merges;
mod normalization;
mod packed_tables;
mod piece_cache;
mod pipeline;
mod prefetch;
mod regex_copies;
mod scanner;
mod sentencepiece;
mod spec;
mod token_list;
mod whole_tokens;

use std::sync::{Arc, OnceLock};

use byte_level::ByteLevelBpe;
use engine_cache::{CachedHead, EngineTables};
use engine_slot::{Encoder, Engine, EngineSlot};
use sentencepiece::SentencePieceBpe;
use sha2::{Digest, Sha256};
pub use spec::{TokenRef, TokenizerSpec};
use tokenizers::Tokenizer;

pub use engine_cache::EngineCache;

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

/// Which engine [`TokenizeStage`] may run. All give the same ids (HF 0.23's); `Auto` is the
/// fastest for the file, the others exist to compare them and as escape hatches. `Hf1` is not
/// exact for one file measured (Command R+, whose vocabulary holds emoji as raw UTF-8 tokens that
/// 1.x emits and 0.23 never does: `mixers/tokenize/tests/hf1_differential.rs`), which is why
/// `Auto` does not give it such a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// The engine measured fastest for the file's family ([`choice`]): HF `tokenizers` 1.x for
    /// byte-level BPE, dsprep's own engine for SentencePiece-style BPE and for a file 1.x does
    /// not encode exactly, HF 0.23 for what neither reproduces.
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

/// The two engines of the fast path.
enum FastEngine {
    ByteLevel(Box<ByteLevelBpe>),
    SentencePiece(Box<SentencePieceBpe>),
}

impl FastEngine {
    /// What the engine for the tokenizer's kind of BPE is built from, or why it would not
    /// reproduce HF's ids.
    fn learn(tokenizer: &Tokenizer) -> Result<EngineTables, pipeline::Refusal> {
        if pipeline::has_byte_fallback(tokenizer) {
            SentencePieceBpe::learn(tokenizer).map(EngineTables::SentencePiece)
        } else {
            ByteLevelBpe::learn(tokenizer).map(EngineTables::ByteLevel)
        }
    }

    fn from_tables(tables: &EngineTables) -> Result<Self, pipeline::Refusal> {
        Ok(match tables {
            EngineTables::ByteLevel(t) => Self::ByteLevel(Box::new(ByteLevelBpe::from_tables(t)?)),
            EngineTables::SentencePiece(t) => {
                Self::SentencePiece(Box::new(SentencePieceBpe::from_tables(t)?))
            }
            EngineTables::Hf1 => {
                return Err(pipeline::Refusal::new(
                    "the tables say HF tokenizers 1.x encodes, not the fast path",
                ));
            }
        })
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

/// The ids a recipe's BOS/EOS may name, and the vocabulary size: read from HF's tokenizer, or
/// from an engine-cache entry without it.
enum Vocabulary<'a> {
    Hf(&'a Tokenizer),
    Cached(&'a CachedHead),
}

impl Vocabulary<'_> {
    /// `Some(Some(id))` found, `Some(None)` not in the vocabulary, `None` the cache cannot say.
    fn find(&self, token: &TokenRef) -> Option<Option<u32>> {
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
        let sha256 = hex::encode(Sha256::digest(json.as_slice()));
        let cache = cache.filter(|_| matches!(choice, EngineChoice::Auto | EngineChoice::Own));
        let key = engine_cache::key(&sha256, choice);
        let mut ignored = None;
        if let Some(cache) = &cache
            && let Some(bytes) = cache.load(&key)
        {
            let kept = (Arc::clone(cache), key.clone());
            match Self::from_cache_entry(bytes, &json, spec, origin, &sha256, kept, choice) {
                Ok(Some(stage)) => return Ok(stage),
                Ok(None) => {}
                Err(why) => ignored = Some(why),
            }
        }
        let hf = parse_tokenizer(&json, origin)?;
        let (vocab_size, dense_ids) = vocab_extent(&hf, origin)?;
        let (bos, eos) = resolve_specials(&Vocabulary::Hf(&hf), spec, origin)?;
        let mut engine = match choice {
            EngineChoice::Hf => Engine {
                encoder: Encoder::Hf,
                description: "HF tokenizers (engine Hf was asked for)".to_string(),
            },
            EngineChoice::Hf1 => hf1_engine(&json),
            EngineChoice::Auto | EngineChoice::Own => {
                let (engine, tables) = choose_engine(choice, &hf, &json);
                if let (Some(cache), Some(tables)) = (&cache, tables) {
                    let head = cached_head(&sha256, &hf, (vocab_size, dense_ids));
                    keep_entry(cache.as_ref(), &key, &head, &tables);
                }
                engine
            }
        };
        if let Some(why) = ignored {
            engine
                .description
                .push_str(&format!("; engine cache entry ignored: {why}"));
        }
        // HF's tokenizer is kept only when it is the engine. Beside the fast engine it would
        // hold tens of MB for the whole run (Qwen3 and Llama 3's vocabularies and merges) for a
        // `decode` or a pad that may never come: the file's bytes (a few MB, shared with the
        // caller) parse it again then, as after an engine-cache entry.
        let (hf, json) = match engine.encoder {
            Encoder::Fast(_) | Encoder::Hf1(_) => (OnceLock::new(), json),
            Encoder::Hf => (OnceLock::from(hf), Arc::default()),
        };
        Ok(Self {
            hf,
            json,
            origin: origin.to_string(),
            engine: EngineSlot::ready(engine),
            bos,
            eos,
            vocab_size,
            sha256,
            cache: None,
            choice,
        })
    }

    /// The stage from a cache entry: `Ok(Some)` with its engine being built from the entry's
    /// tables, `Ok(None)` the entry is sound but cannot resolve the recipe's BOS/EOS without HF
    /// (build as usual), `Err` why it is ignored.
    fn from_cache_entry(
        bytes: Vec<u8>,
        json: &Arc<Vec<u8>>,
        spec: &TokenizerSpec,
        origin: &str,
        sha256: &str,
        cache: (SharedEngineCache, String),
        choice: EngineChoice,
    ) -> Result<Option<Self>, String> {
        let entry = engine_cache::check(&bytes, sha256)?;
        let vocabulary = Vocabulary::Cached(&entry.head);
        let found = |token: &TokenRef| vocabulary.find(token).flatten();
        let (Some(eos), bos) = (found(&spec.eos), spec.bos.as_ref().map(found)) else {
            return Ok(None);
        };
        if bos == Some(None) {
            return Ok(None);
        }
        let tables_at = entry.tables_at;
        // HF 1.x's entry names the engine and holds no tables: 1.x reads the file's bytes.
        let file = engine_cache::is_hf1(&bytes[tables_at..]).then(|| Arc::clone(json));
        let engine = EngineSlot::later(move || {
            if let Some(file) = file {
                engine_cache::parse_tables(&bytes[tables_at..])?;
                let hf1 = hf1::Hf1Engine::from_json(&file)?;
                return Ok(Engine {
                    description: format!(
                        "{} (chosen by the engine cache)",
                        hf1.description(choice::HF1_REASON)
                    ),
                    encoder: Encoder::Hf1(Box::new(hf1)),
                });
            }
            let tables = engine_cache::parse_tables(&bytes[tables_at..])?;
            let fast = FastEngine::from_tables(&tables).map_err(|r| r.to_string())?;
            Ok(Engine {
                description: format!("{} (tables from the engine cache)", fast.description()),
                encoder: Encoder::Fast(fast),
            })
        });
        Ok(Some(Self {
            hf: OnceLock::new(),
            json: Arc::clone(json),
            origin: origin.to_string(),
            engine,
            bos: bos.flatten(),
            eos,
            vocab_size: entry.head.vocab_size,
            sha256: sha256.to_string(),
            cache: Some(cache),
            choice,
        }))
    }

    /// The engine, waiting the first time for the thread building it from a cache entry. Should
    /// that thread give none (an entry that checked out but does not build), the engine is
    /// learnt from the file instead, replaces the entry, and the line says why.
    fn engine(&self) -> &Engine {
        self.engine.get(|why| {
            let mut engine = match self.hf() {
                Ok(hf) => {
                    let (engine, tables) = choose_engine(self.choice, hf, &self.json);
                    if let (Some((cache, key)), Some(tables), Ok(extent)) =
                        (&self.cache, tables, vocab_extent(hf, &self.origin))
                    {
                        let head = cached_head(&self.sha256, hf, extent);
                        keep_entry(cache.as_ref(), key, &head, &tables);
                    }
                    engine
                }
                Err(e) => Engine {
                    encoder: Encoder::Hf,
                    description: format!("HF tokenizers: {e}"),
                },
            };
            engine
                .description
                .push_str(&format!("; engine cache entry ignored: {why}"));
            engine
        })
    }

    /// HF's tokenizer, parsed now if it has not been.
    fn hf(&self) -> Result<&Tokenizer, TokenizeError> {
        if let Some(hf) = self.hf.get() {
            return Ok(hf);
        }
        let parsed = parse_tokenizer(&self.json, &self.origin)?;
        Ok(self.hf.get_or_init(|| parsed))
    }

    /// Append the ids of one document (`[BOS] text-ids EOS`) to `out`. On error `out` is left
    /// as it was.
    pub fn encode_doc(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        let start_len = out.len();
        out.extend(self.bos);
        let encoded = match &self.engine().encoder {
            Encoder::Fast(fast) => fast.encode(text, out),
            Encoder::Hf1(hf1) if hf1::cuts_like_hf(text) => hf1.encode(text, out),
            Encoder::Hf1(_) | Encoder::Hf => self
                .hf()?
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
    pub fn resolve_pad(&self, pad: Option<&TokenRef>) -> Result<u32, String> {
        let Some(pad) = pad else {
            return Ok(self.eos);
        };
        // Asked once, before the run: HF parsed for it is dropped after, not kept for the run.
        let parsed;
        let hf = match self.hf.get() {
            Some(hf) => hf,
            None => {
                parsed = parse_tokenizer(&self.json, &self.origin).map_err(|e| e.to_string())?;
                &parsed
            }
        };
        let id = match pad {
            TokenRef::Id(id) => hf.id_to_token(*id).map(|_| *id).ok_or_else(|| {
                format!(
                    "packing.pad = {id} is not an id of {} (its ids are 0 to {}): name one of \
                     its special tokens, or remove pad to pad with the EOS (id {})",
                    self.origin,
                    self.vocab_size.saturating_sub(1),
                    self.eos
                )
            })?,
            TokenRef::Text(text) => hf.token_to_id(text).ok_or_else(|| {
                format!(
                    "packing.pad = {text:?} is not a token of {}: name one of its special \
                     tokens, or remove pad to pad with the EOS (id {})",
                    self.origin, self.eos
                )
            })?,
        };
        let decoder = hf.get_added_tokens_decoder();
        if decoder.get(&id).is_some_and(|t| t.special) {
            return Ok(id);
        }
        let text = hf.id_to_token(id).unwrap_or_default();
        Err(format!(
            "packing.pad = {pad} is the ordinary token {text:?} (id {id}), which text itself \
             becomes: name a special token of {} instead, or remove pad to pad with the EOS \
             (id {})",
            self.origin, self.eos
        ))
    }

    /// sha256 of the `tokenizer.json` bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}

/// HF's parse of a `tokenizer.json`; `origin` names the file in the error.
fn parse_tokenizer(json: &[u8], origin: &str) -> Result<Tokenizer, TokenizeError> {
    Tokenizer::from_bytes(json).map_err(|e| TokenizeError::Parse {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}

/// The fast engine for `hf` and the tables it was built from, or HF's own when the fast path
/// would not give its ids (the line says why).
fn learn_engine(hf: &Tokenizer) -> (Engine, Option<EngineTables>) {
    match FastEngine::learn(hf).and_then(|t| Ok((FastEngine::from_tables(&t)?, t))) {
        Ok((fast, tables)) => (
            Engine {
                description: fast.description().to_string(),
                encoder: Encoder::Fast(fast),
            },
            Some(tables),
        ),
        Err(refusal) => (
            Engine {
                encoder: Encoder::Hf,
                description: format!("HF tokenizers: {refusal}"),
            },
            None,
        ),
    }
}

/// The engine `choice` (`Auto` or `Own`) runs for `hf`, read from the file `json`, and what an
/// engine-cache entry keeps of it.
fn choose_engine(
    choice: EngineChoice,
    hf: &Tokenizer,
    json: &[u8],
) -> (Engine, Option<EngineTables>) {
    if choice == EngineChoice::Own {
        return learn_engine(hf);
    }
    match choice::route(hf, json) {
        choice::Route::Hf1(hf1) => (
            Engine {
                description: hf1.description(choice::HF1_REASON),
                encoder: Encoder::Hf1(hf1),
            },
            Some(EngineTables::Hf1),
        ),
        choice::Route::Own(why_not_hf1) => {
            let (mut engine, tables) = learn_engine(hf);
            if let Some(why) = why_not_hf1 {
                engine
                    .description
                    .push_str(&format!("; not HF tokenizers 1.x: {why}"));
            }
            (engine, tables)
        }
    }
}

/// HF `tokenizers` 1.x's engine for the file `json`, or HF 0.23's when 1.x does not read it (the
/// line says why: the ids are the same either way).
fn hf1_engine(json: &[u8]) -> Engine {
    match hf1::Hf1Engine::from_json(json) {
        Ok(engine) => Engine {
            description: engine.description("engine Hf1 was asked for"),
            encoder: Encoder::Hf1(Box::new(engine)),
        },
        Err(why) => Engine {
            encoder: Encoder::Hf,
            description: format!(
                "HF tokenizers: HF tokenizers {} does not read the file ({why})",
                hf1::VERSION
            ),
        },
    }
}

/// What an engine-cache entry keeps of HF's tokenizer for the file `sha256`, so that a stage
/// starts without parsing it. `extent` is [`vocab_extent`]'s.
fn cached_head(sha256: &str, hf: &Tokenizer, (vocab_size, dense_ids): (u32, u32)) -> CachedHead {
    CachedHead {
        tokenizer_sha256: sha256.to_string(),
        built_by: engine_cache::built_by(),
        vocab_size,
        dense_ids,
        added: hf
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (token.content, id))
            .collect(),
    }
}

/// Keep in `cache`, under `key`, the entry of `head` and the engine's `tables`.
fn keep_entry(
    cache: &(dyn EngineCache + Send + Sync),
    key: &str,
    head: &CachedHead,
    tables: &EngineTables,
) {
    if let Ok(bytes) = engine_cache::to_bytes(head, tables) {
        cache.store(key, &bytes);
    }
}

/// One more than the largest id (added tokens included), and the first id without a token.
fn vocab_extent(hf: &Tokenizer, origin: &str) -> Result<(u32, u32), TokenizeError> {
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
fn resolve_specials(
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
