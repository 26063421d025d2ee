//! The engines that encode: HF `tokenizers` 1.x ([`hf1`]), and dsprep's own BPE engines for
//! byte-level ([`byte_level`]) and SentencePiece-style ([`sentencepiece`]) files, both on HF's
//! merge loop ([`merges`]) with a per-thread piece cache ([`piece_cache`]) and a table of the
//! pieces that are one token whole ([`whole_tokens`]); which of them encodes a file
//! ([`choice`]); and the slot that holds the engine, built now or still to build
//! ([`engine_slot`]). HF `tokenizers` 0.23, the ids' reference, is the stage's own parse.

pub(crate) mod added;
pub(crate) mod byte_level;
pub(crate) mod choice;
pub(crate) mod engine_slot;
pub(crate) mod hf1;
pub(crate) mod merges;
pub(crate) mod normalization;
pub(crate) mod piece_cache;
pub(crate) mod prefetch;
pub(crate) mod regex_copies;
pub(crate) mod sentencepiece;
pub(crate) mod whole_tokens;

use tokenizers::Tokenizer;

use crate::cache::entry::EngineTables;
use crate::read::{Refusal, pipeline};
use byte_level::ByteLevelBpe;
use sentencepiece::SentencePieceBpe;

/// Why encoding a document failed: HF's engines' own errors, or a cut of dsprep's byte-level
/// engine outside the text (a regex or scanner bug, never seen). The stage's
/// [`crate::TokenizeError::Encode`] says which document.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// A pre-tokenizer cut reported a range outside the text.
    #[error("pre-tokenizer regex reported bytes {start}..{end} of a text of {len} bytes")]
    CutOutsideText {
        start: usize,
        end: usize,
        len: usize,
    },
    /// A pre-tokenizer cut reported a range whose ends are not between characters.
    #[error("pre-tokenizer regex reported bytes {start}..{end}, not on characters")]
    CutOffCharacters { start: usize, end: usize },
    /// A text the regex cuts was handed back to the regex as if a scanner had cut it.
    #[error("a text cut by the pre-tokenizer regex was handed back")]
    HandedBack,
    /// HF `tokenizers` 1.x's error.
    #[error("{message}")]
    Hf1 { message: String },
    /// HF `tokenizers` 0.23's error.
    #[error("{message}")]
    Hf { message: String },
}

/// The two engines of dsprep's own (the fast path).
pub(crate) enum FastEngine {
    ByteLevel(Box<ByteLevelBpe>),
    SentencePiece(Box<SentencePieceBpe>),
}

impl FastEngine {
    /// What the engine for the tokenizer's kind of BPE is built from, or why it would not
    /// reproduce HF's ids.
    pub(crate) fn learn(tokenizer: &Tokenizer) -> Result<EngineTables, Refusal> {
        if pipeline::has_byte_fallback(tokenizer) {
            SentencePieceBpe::learn(tokenizer).map(EngineTables::SentencePiece)
        } else {
            ByteLevelBpe::learn(tokenizer).map(EngineTables::ByteLevel)
        }
    }

    pub(crate) fn from_tables(tables: &EngineTables) -> Result<Self, Refusal> {
        Ok(match tables {
            EngineTables::ByteLevel(t) => Self::ByteLevel(Box::new(ByteLevelBpe::from_tables(t)?)),
            EngineTables::SentencePiece(t) => {
                Self::SentencePiece(Box::new(SentencePieceBpe::from_tables(t)?))
            }
            EngineTables::Hf1 => {
                return Err(Refusal::Hf1Tables);
            }
        })
    }

    pub(crate) fn description(&self) -> &str {
        match self {
            Self::ByteLevel(engine) => engine.description(),
            Self::SentencePiece(engine) => engine.description(),
        }
    }

    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), EncodeError> {
        match self {
            Self::ByteLevel(engine) => engine.encode(text, out),
            Self::SentencePiece(engine) => {
                engine.encode(text, out);
                Ok(())
            }
        }
    }
}
