//! What a recipe says of its tokenizer: the file, and the special tokens the stage adds.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TokenizerSpec {
    /// A Hugging Face `tokenizer.json`, relative to the recipe file's folder.
    pub path: String,
    /// Appended to every document (token string or id). Required: it is what separates
    /// documents once they are packed.
    pub eos: TokenRef,
    /// Prepended to every document when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos: Option<TokenRef>,
}

/// A special token named by its string (`"<|endoftext|>"`) or its id (`50256`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum TokenRef {
    Id(u32),
    Text(String),
}

impl std::fmt::Display for TokenRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenRef::Id(id) => write!(f, "id {id}"),
            TokenRef::Text(text) => write!(f, "{text:?}"),
        }
    }
}
