//! Which engine encodes a file when the recipe leaves it to dsprep ([`super::EngineChoice::Auto`]),
//! and the reason its engine line gives. Both engines give HF's ids, so choosing per file is safe;
//! the choice is speed, measured per family on the seed mix (BENCHMARKS.md, "Tokenizer engines"):
//! where dsprep's own engine is not at least 1.25 × HF `tokenizers` 1.x, 1.x encodes.
//!
//! - Byte-level BPE (GPT-2, Qwen3, Llama 3, cl100k, o200k, Tekken, DeepSeek V3, Claude): HF 1.x,
//!   0.7–1.1 × ours on the mix (o200k 0.99–1.39 over two runs, not shown ≥ 1.25).
//! - SentencePiece-style BPE with byte fallback (Llama 2, Yi, Gemma 3; Gemma, which 1.x does not
//!   read): dsprep's, 4.4–4.8 × 1.x.
//! - A byte-level vocabulary with tokens written in raw UTF-8 (Command R+'s emoji): dsprep's, as
//!   1.x is not exact for it (it emits those tokens; 0.23, the ids' reference, never does).
//! - Anything else: dsprep's engine when it reproduces HF's pipeline, else HF 0.23.

use tokenizers::Tokenizer;
use tokenizers::models::ModelWrapper;

use super::byte_vocab;
use super::hf1::Hf1Engine;

/// The engine line's reason when HF 1.x encodes under `Auto`.
pub(crate) const HF1_REASON: &str = "byte-level BPE, where dsprep's own engine is not 1.25 × \
                                     faster (BENCHMARKS.md, \"Tokenizer engines\")";

/// Where a file goes under `Auto`.
pub(crate) enum Route {
    /// HF `tokenizers` 1.x, read from the file.
    Hf1(Box<Hf1Engine>),
    /// dsprep's own engine when it reproduces the file's pipeline, else HF 0.23; `Some` says why
    /// not 1.x when the file is BPE (a line for the log), `None` for any other model.
    Own(Option<String>),
}

/// The route of the tokenizer `hf`, whose file's bytes are `json`.
pub(crate) fn route(hf: &Tokenizer, json: &[u8]) -> Route {
    let ModelWrapper::BPE(bpe) = hf.get_model() else {
        return Route::Own(None);
    };
    if bpe.byte_fallback {
        return Route::Own(Some(
            "SentencePiece-style BPE, where dsprep's engine is 4.4–4.8 × HF tokenizers 1.x on \
             the seed mix"
                .to_string(),
        ));
    }
    let raw = byte_vocab::raw_utf8_tokens(bpe);
    if raw > 0 {
        return Route::Own(Some(format!(
            "{raw} vocabulary tokens are written in raw UTF-8, which HF tokenizers 1.x emits and \
             0.23 never does"
        )));
    }
    match Hf1Engine::from_json(json) {
        Ok(engine) => Route::Hf1(Box::new(engine)),
        Err(why) => Route::Own(Some(format!(
            "HF tokenizers {} does not read the file ({why})",
            super::hf1::VERSION
        ))),
    }
}
