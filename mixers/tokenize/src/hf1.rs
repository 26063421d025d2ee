//! Hugging Face `tokenizers` 1.x (a release candidate, the `tokenizers1` dependency) as an engine
//! of the stage beside HF 0.23 and the fast path ([`super::EngineChoice::Hf1`]): it reads the
//! same `tokenizer.json` (upgraded to 1.x's canonical form by its own converter) and gives the
//! ids of `encode(text, add_special_tokens=False)`; the stage adds BOS/EOS as for any engine.
//! Synchronous: built without 1.x's `parallelism` feature, it starts no thread.

use std::cell::RefCell;

use tokenizers1::pipeline::{EncodeOptions, PipelineToken, PipelineTokenizer};

/// The version pinned in the workspace's Cargo.toml, for the engine line.
pub(crate) const VERSION: &str = "1.0.0-rc.3";

thread_local! {
    /// 1.x appends `PipelineToken`s; one buffer per thread, reused, so an encode allocates
    /// nothing of its own before its ids are copied out.
    static TOKENS: RefCell<Vec<PipelineToken>> = const { RefCell::new(Vec::new()) };
}

/// HF `tokenizers` 1.x's tokenizer for one `tokenizer.json`.
pub(crate) struct Hf1Engine {
    tokenizer: PipelineTokenizer,
    options: EncodeOptions,
    /// Padding set in the file: 0.23's `encode` pads a lone document, which 1.x does only on its
    /// general path, not in `encode_into`.
    pads: bool,
}

impl Hf1Engine {
    /// Read a `tokenizer.json`, or say why 1.x does not.
    pub fn from_json(json: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(json).map_err(|e| format!("not UTF-8: {e}"))?;
        let canonical = tokenizers1::canonicalize_str(text)
            .map_err(|e| format!("its converter refused the file: {e}"))?;
        let tokenizer = tokenizers1::from_json(&canonical)
            .map_err(|e| format!("its reader refused the converted file: {e}"))?;
        let pads = tokenizer.get_padding().is_some();
        Ok(Self {
            tokenizer,
            options: EncodeOptions::no_specials(),
            pads,
        })
    }

    /// The engine line: the engine, and `why` it encodes.
    pub fn description(&self, why: &str) -> String {
        format!("HF tokenizers {VERSION} ({why})")
    }

    /// Append the ids of `text` to `out`; on error `out` may hold some of them (the stage
    /// truncates).
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        if self.pads {
            let encodings = self
                .tokenizer
                .encode(text, &self.options)
                .wait()
                .map_err(|e| e.to_string())?;
            for encoding in &encodings {
                out.extend(encoding.ids().iter().map(|t| t.id()));
            }
            return Ok(());
        }
        TOKENS.with_borrow_mut(|tokens| {
            tokens.clear();
            let encoded = self
                .tokenizer
                .encode_into(text, &self.options, tokens)
                .map_err(|e| e.to_string());
            out.extend(tokens.iter().map(|t| t.id()));
            encoded
        })
    }
}
