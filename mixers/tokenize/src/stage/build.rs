//! Building the stage: from the `tokenizer.json` (HF parses it, the engine is chosen and built
//! now, and an engine-cache entry is kept), or from a sound engine-cache entry (no HF parse: the
//! engine is built from the entry's tables by the first caller that asks for it, and, should
//! they not build, chosen from the file instead and the entry replaced).

use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use super::vocabulary::{Vocabulary, resolve_specials, vocab_extent};
use crate::cache::{CacheError, entry};
use crate::engines::FastEngine;
use crate::engines::choice::{self, choose_engine, hf1_engine};
use crate::engines::engine_slot::{Encoder, Engine, EngineSlot};
use crate::engines::hf1::Hf1Engine;
use crate::{
    EngineChoice, SharedEngineCache, TokenRef, TokenizeError, TokenizeStage, TokenizerSpec,
};

/// HF's parse of a `tokenizer.json`; `origin` names the file in the error.
pub(crate) fn parse_tokenizer(json: &[u8], origin: &str) -> Result<Tokenizer, TokenizeError> {
    Tokenizer::from_bytes(json).map_err(|e| TokenizeError::Parse {
        origin: origin.to_string(),
        message: e.to_string(),
    })
}

impl TokenizeStage {
    /// [`TokenizeStage::from_json_bytes_cached`]'s work.
    pub(crate) fn build(
        json: Arc<Vec<u8>>,
        spec: &TokenizerSpec,
        origin: &str,
        choice: EngineChoice,
        cache: Option<SharedEngineCache>,
    ) -> Result<Self, TokenizeError> {
        let sha256 = hex::encode(Sha256::digest(json.as_slice()));
        let cache = cache.filter(|_| matches!(choice, EngineChoice::Auto | EngineChoice::Own));
        let key = entry::key(&sha256, choice);
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
                    let head = entry::head_of(&sha256, &hf, (vocab_size, dense_ids));
                    entry::keep(cache.as_ref(), &key, &head, &tables);
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
    ) -> Result<Option<Self>, CacheError> {
        let checked = entry::check(&bytes, sha256)?;
        let vocabulary = Vocabulary::Cached(&checked.head);
        let found = |token: &TokenRef| vocabulary.find(token).flatten();
        let (Some(eos), bos) = (found(&spec.eos), spec.bos.as_ref().map(found)) else {
            return Ok(None);
        };
        if bos == Some(None) {
            return Ok(None);
        }
        let tables_at = checked.tables_at;
        // HF 1.x's entry names the engine and holds no tables: 1.x reads the file's bytes.
        let file = entry::is_hf1(&bytes[tables_at..]).then(|| Arc::clone(json));
        let engine = EngineSlot::later(move || {
            if let Some(file) = file {
                entry::parse_tables(&bytes[tables_at..])?;
                let hf1 = Hf1Engine::from_json(&file)?;
                return Ok(Engine {
                    description: format!(
                        "{} (chosen by the engine cache)",
                        hf1.description(choice::HF1_REASON)
                    ),
                    encoder: Encoder::Hf1(Box::new(hf1)),
                });
            }
            let tables = entry::parse_tables(&bytes[tables_at..])?;
            let fast = FastEngine::from_tables(&tables)?;
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
            vocab_size: checked.head.vocab_size,
            sha256: sha256.to_string(),
            cache: Some(cache),
            choice,
        }))
    }

    /// The engine, waiting the first time for the thread building it from a cache entry. Should
    /// that thread give none (an entry that checked out but does not build), the engine is
    /// learnt from the file instead, replaces the entry, and the line says why.
    pub(crate) fn engine(&self) -> &Engine {
        self.engine.get(|why| {
            let mut engine = match self.hf() {
                Ok(hf) => {
                    let (engine, tables) = choose_engine(self.choice, hf, &self.json);
                    if let (Some((cache, key)), Some(tables), Ok(extent)) =
                        (&self.cache, tables, vocab_extent(hf, &self.origin))
                    {
                        let head = entry::head_of(&self.sha256, hf, extent);
                        entry::keep(cache.as_ref(), key, &head, &tables);
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
    pub(crate) fn hf(&self) -> Result<&Tokenizer, TokenizeError> {
        if let Some(hf) = self.hf.get() {
            return Ok(hf);
        }
        let parsed = parse_tokenizer(&self.json, &self.origin)?;
        Ok(self.hf.get_or_init(|| parsed))
    }
}
