//! Reading HF's `tokenizer.json` for dsprep's own engines: what HF loaded from the file
//! (normalizer, pre-tokenizer, model flags, added tokens, post-processor, truncation, padding:
//! [`pipeline`]), the byte-level vocabulary and merges ([`byte_vocab`]) and the tokens as bytes
//! ([`token_list`]), or the [`Refusal`] that names the setting the own engine does not reproduce.
//! A refusal costs speed, never ids: HF encodes the file then.

pub(crate) mod byte_vocab;
pub(crate) mod pipeline;
mod refusal;
pub(crate) mod token_list;

pub(crate) use refusal::Refusal;
