//! The stage's engine, built now or still to build: from an engine-cache entry the engine is
//! parsed and built by whichever thread first asks for it, [`crate::TokenizeStage::build_engine`]
//! (a thread of the caller's, while the run starts: shards listed, the shuffle buffer filled) or
//! the first document to encode. The crate starts no thread of its own.

use std::sync::{Mutex, OnceLock};

use crate::cache::CacheError;

/// What encodes a document's text.
pub(crate) enum Encoder {
    /// dsprep's fast path.
    Fast(super::FastEngine),
    /// HF `tokenizers` 1.x.
    Hf1(Box<super::hf1::Hf1Engine>),
    /// HF `tokenizers` 0.23: the stage's own parse of the file.
    Hf,
}

/// The engine that encodes, and the line that says which it is.
pub(crate) struct Engine {
    pub encoder: Encoder,
    pub description: String,
}

/// What building gives: the engine, or why the engine-cache entry it was building from is
/// ignored.
type Build = Result<Engine, CacheError>;

/// Builds the engine, once.
type Builder = Box<dyn FnOnce() -> Build + Send>;

/// An engine, ready or still to build.
pub(crate) struct EngineSlot {
    ready: OnceLock<Engine>,
    /// The build, until the engine is first asked for.
    pending: Mutex<Option<Builder>>,
}

impl EngineSlot {
    pub fn ready(engine: Engine) -> Self {
        Self {
            ready: OnceLock::from(engine),
            pending: Mutex::new(None),
        }
    }

    /// An engine `build` makes when it is first asked for.
    pub fn later(build: impl FnOnce() -> Build + Send + 'static) -> Self {
        Self {
            ready: OnceLock::new(),
            pending: Mutex::new(Some(Box::new(build))),
        }
    }

    /// The engine, built by this call if it is the first to ask (others asking meanwhile wait
    /// for it). When the build gives no engine, `fallback` makes one from why not.
    pub fn get(&self, fallback: impl FnOnce(CacheError) -> Engine) -> &Engine {
        self.ready.get_or_init(|| {
            let build = self.pending.lock().ok().and_then(|mut p| p.take());
            let why = match build.map(|build| build()) {
                Some(Ok(engine)) => return engine,
                Some(Err(why)) => why,
                None => CacheError::BuildLost,
            };
            fallback(why)
        })
    }
}
