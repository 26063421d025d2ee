//! Which engine encodes a file when the recipe leaves it to dsprep ([`crate::EngineChoice::Auto`]),
//! and the reason its engine line gives. Both engines give HF's ids, so choosing per file is safe;
//! the choice is speed, measured per family on the seed mix (BENCHMARKS.md, "Tokenizer engines"):
//! where dsprep's own engine is not at least 1.25 × HF `tokenizers` 1.x, 1.x encodes.
//!
//! - Byte-level BPE (GPT-2, Llama 3, cl100k, o200k, Tekken, DeepSeek V3): HF 1.x, whose speed
//!   ours is 0.8–0.96 × on the mix (o200k 0.99–1.39 over two runs, not shown ≥ 1.25).
//! - SentencePiece-style BPE with byte fallback (Llama 2, Yi, Gemma 3; Gemma, which 1.x does not
//!   read): dsprep's, 4.4–4.8 × 1.x.
//! - Where 1.x is not exact, dsprep's, whatever the speed: a byte-level vocabulary with tokens
//!   written in raw UTF-8 (Command R+'s emoji: 1.x emits them; 0.23, the ids' reference, never
//!   does), and a Unicode normalizer (Qwen2/2.5/3's and Command R+'s NFC, Claude's NFKC: 1.x
//!   normalizes with newer Unicode tables than 0.23, so combining marks 0.23 does not know, as
//!   in "a\u{1DFA}\u{301}" or Arabic's U+0898, are reordered and composed under 1.x only, and
//!   NFKC maps U+1E030 to U+0430 under 1.x only). Qwen3 was as fast under either (1.00–1.04).
//! - Anything else: dsprep's engine when it reproduces HF's pipeline, else HF 0.23.
//!
//! Two more differences are per document, not per file, and such a document is encoded by HF
//! 0.23 itself ([`super::hf1::cuts_like_hf`]): past a whitespace run of 64 KiB 0.23's regex can
//! give up and leave the rest of the text uncut, where 1.x cuts on; and a character 0.23's
//! Unicode tables do not assign (U+323B0, Unicode 17) may be a letter to 1.x's.

use tokenizers::Tokenizer;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;

use super::FastEngine;
use super::engine_slot::{Encoder, Engine};
use super::hf1::{self, Hf1Engine};
use crate::EngineChoice;
use crate::cache::entry::EngineTables;
use crate::read::byte_vocab;

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
    if let Some(name) = hf.get_normalizer().and_then(unicode_normalizer) {
        return Route::Own(Some(format!(
            "normalizer {name}, which HF tokenizers 1.x applies with other Unicode tables than \
             0.23"
        )));
    }
    let added: Vec<String> = (hf.get_added_tokens_decoder().into_values())
        .map(|token| token.content)
        .collect();
    let raw = byte_vocab::raw_utf8_tokens(bpe, &added);
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
            hf1::VERSION
        ))),
    }
}

/// The Unicode normalization form the normalizer applies (in a Sequence too), if any.
fn unicode_normalizer(normalizer: &NormalizerWrapper) -> Option<&'static str> {
    match normalizer {
        NormalizerWrapper::NFC(_) => Some("NFC"),
        NormalizerWrapper::NFD(_) => Some("NFD"),
        NormalizerWrapper::NFKC(_) => Some("NFKC"),
        NormalizerWrapper::NFKD(_) => Some("NFKD"),
        NormalizerWrapper::Sequence(sequence) => {
            sequence.as_ref().iter().find_map(unicode_normalizer)
        }
        _ => None,
    }
}

/// dsprep's own engine for `hf` and the tables it was built from, or HF's own when the own engine
/// would not give its ids (the line says why).
pub(crate) fn learn_engine(hf: &Tokenizer) -> (Engine, Option<EngineTables>) {
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
pub(crate) fn choose_engine(
    choice: EngineChoice,
    hf: &Tokenizer,
    json: &[u8],
) -> (Engine, Option<EngineTables>) {
    if choice == EngineChoice::Own {
        return learn_engine(hf);
    }
    match route(hf, json) {
        Route::Hf1(hf1) => (
            Engine {
                description: hf1.description(HF1_REASON),
                encoder: Encoder::Hf1(hf1),
            },
            Some(EngineTables::Hf1),
        ),
        Route::Own(why_not_hf1) => {
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
pub(crate) fn hf1_engine(json: &[u8]) -> Engine {
    match Hf1Engine::from_json(json) {
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
