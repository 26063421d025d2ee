//! What more than one example needs: documents from local files, an engine cache in memory, a
//! tokenizer spec.

// Each example takes the parts it needs: the others are unused there.
#![allow(dead_code)]

pub mod local_texts;
pub mod memory_cache;

use dsprep_tokenize::{TokenRef, TokenizerSpec};

/// A recipe's `[tokenizer]` for the file at `path`, its EOS id 0: the examples count and compare
/// ids, whatever the EOS.
pub fn tokenizer_spec(path: &std::path::Path) -> TokenizerSpec {
    TokenizerSpec {
        path: path.display().to_string(),
        eos: TokenRef::Id(0),
        bos: None,
    }
}
