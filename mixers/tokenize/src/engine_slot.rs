//! The stage's engine, built now or still being built: an engine-cache entry's tables are parsed
//! and made into the fast engine on a thread of their own while the run starts (shards listed,
//! the shuffle buffer filled), and the first document to encode waits for it, once.

use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use super::FastEngine;
use super::hf1::Hf1Engine;

/// What encodes a document's text.
pub(super) enum Encoder {
    /// dsprep's fast path.
    Fast(FastEngine),
    /// HF `tokenizers` 1.x.
    Hf1(Box<Hf1Engine>),
    /// HF `tokenizers` 0.23: the stage's own parse of the file.
    Hf,
}

/// The engine that encodes, and the line that says which it is.
pub(super) struct Engine {
    pub encoder: Encoder,
    pub description: String,
}

/// What a building thread gives: the engine, or why it could not build one.
type Build = Result<Engine, String>;

/// An engine, ready or being built on a thread of its own.
pub(super) struct EngineSlot {
    ready: OnceLock<Engine>,
    /// The building thread until the engine is first asked for.
    building: Mutex<Option<JoinHandle<Build>>>,
}

impl EngineSlot {
    pub fn ready(engine: Engine) -> Self {
        Self {
            ready: OnceLock::from(engine),
            building: Mutex::new(None),
        }
    }

    /// Build the engine with `build` on a thread of its own. Should no thread start, the first
    /// [`Self::get`] has its fallback build one, saying why.
    pub fn build_beside(build: impl FnOnce() -> Build + Send + 'static) -> Self {
        let handle = std::thread::Builder::new()
            .name("dsprep-engine".into())
            .spawn(build)
            .ok();
        Self {
            ready: OnceLock::new(),
            building: Mutex::new(handle),
        }
    }

    /// The engine, waiting for its thread the first time it is asked for. When the thread gave
    /// no engine, `fallback` makes one from why not.
    pub fn get(&self, fallback: impl FnOnce(String) -> Engine) -> &Engine {
        self.ready.get_or_init(|| {
            let handle = self.building.lock().ok().and_then(|mut b| b.take());
            let why = match handle.map(JoinHandle::join) {
                Some(Ok(Ok(engine))) => return engine,
                Some(Ok(Err(why))) => why,
                Some(Err(_)) => "building the engine from it panicked".to_string(),
                None => "no thread could be started to build the engine from it".to_string(),
            };
            fallback(why)
        })
    }
}

impl Drop for EngineSlot {
    /// No building thread outlives its stage.
    fn drop(&mut self) {
        if let Ok(building) = self.building.get_mut()
            && let Some(handle) = building.take()
        {
            let _ = handle.join();
        }
    }
}
