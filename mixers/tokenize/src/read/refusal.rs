//! [`Refusal`]: why dsprep's own engine does not take a `tokenizer.json`, naming the setting
//! (normalizer, pre-tokenizer, model, added token, post-processor, truncation, padding) or the
//! vocabulary entry it does not reproduce. HF then encodes the file: a refusal costs speed, never
//! ids. The engine line shows it (`engine_description()`).

use tokenizers::SplitDelimiterBehavior;

use crate::scanner::ScannerError;

/// What writes spaces as "▁" in the SentencePiece-style pipelines the fast path reproduces, as
/// a refusal names them.
const SENTENCEPIECE_SPACES: &str = "the normalizer [Prepend \"▁\", Replace \" \" → \"▁\"] (Llama 2, \
                                    Mistral 7B), Replace \" \" → \"▁\" alone or in a Sequence of one \
                                    (Gemma, Yi, InternLM2), or no normalizer and a Metaspace \
                                    pre-tokenizer that does not split";

/// Why the fast path is not used; shown in `engine_description()`. A component is named by the
/// `type` HF writes for it, or shown as its JSON.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("truncation is set in the tokenizer.json")]
    Truncation,
    #[error("padding is set in the tokenizer.json")]
    Padding,
    #[error("model {model} is not BPE")]
    NotBpe { model: String },
    #[error("BPE dropout {dropout} is random")]
    Dropout { dropout: f32 },
    #[error("BPE continuing_subword_prefix/end_of_word_suffix is not reproduced by the fast path")]
    SubwordAffixes,
    #[error("BPE byte_fallback is SentencePiece-style BPE, not byte-level")]
    ByteFallback,
    #[error("normalizer {normalizer} is not reproduced by the fast path")]
    Normalizer { normalizer: String },
    #[error("no pre-tokenizer: the fast path needs byte-level pre-tokenization")]
    NoPreTokenizer,
    /// The pre-tokenizer's steps (a Sequence flattened), by type.
    #[error("pre-tokenizer [{}] is not reproduced by the fast path", .steps.join(", "))]
    PreTokenizer { steps: Vec<String> },
    #[error("pre-tokenizer Split with a string pattern is not reproduced by the fast path")]
    SplitOnString,
    #[error("pre-tokenizer Split behavior {behavior:?} is not reproduced by the fast path")]
    SplitBehavior { behavior: SplitDelimiterBehavior },
    #[error("pre-tokenizer regex does not compile: {message}")]
    Regex { message: String },
    #[error("pre-tokenizer scanner tables: {0}")]
    ScannerTables(#[from] ScannerError),
    #[error("post-processor {post_processor} is not reproduced by the fast path")]
    PostProcessor { post_processor: String },
    #[error(
        "added token {content:?} has single_word/lstrip/rstrip, not reproduced by the fast path"
    )]
    AddedTokenFlags { content: String },
    #[error("an added token's content is empty")]
    EmptyAddedToken,
    #[error("two added tokens match {pattern:?}")]
    SameAddedTokens { pattern: String },
    #[error("added tokens do not build a trie: {message}")]
    AddedTrie { message: String },
    #[error("two vocabulary entries share id {id}")]
    SharedId { id: u32 },
    #[error("byte 0x{byte:02X} has no token in the vocabulary")]
    ByteWithoutToken { byte: u8 },
    #[error("{count} byte ids where there are 256 bytes")]
    ByteIds { count: usize },
    #[error("merge #{index} names {token:?}, not in the vocabulary")]
    MergeOutsideVocabulary { index: usize, token: String },
    #[error("could not read the BPE merges back: {message}")]
    Merges { message: String },
    #[error(
        "SentencePiece-style BPE: the fast path reproduces spaces written as \"▁\" by {}; not \
         the normalizer {normalizer} with the pre-tokenizer {pre_tokenizer}",
        SENTENCEPIECE_SPACES
    )]
    SentencePieceSpaces {
        normalizer: String,
        pre_tokenizer: String,
    },
    #[error(
        "SentencePiece-style BPE with pre-tokenizer {pre_tokenizer} is not reproduced by the fast \
         path (it reproduces none, or a Split on a string with a space in it, which the \
         normalizer's \"▁\" leaves nothing to match)"
    )]
    SentencePiecePreTokenizer { pre_tokenizer: String },
    #[error(
        "SentencePiece-style BPE with ignore_merges looks whole texts up, which the fast path does \
         not reproduce"
    )]
    SentencePieceIgnoreMerges,
    #[error(
        "added token {pattern:?} is matched after normalization, not reproduced by the \
         SentencePiece-style fast path"
    )]
    NormalizedAddedToken { pattern: String },
    #[error("byte fallback token <0x{byte:02X}> is missing: HF would take its unknown-token path")]
    ByteFallbackMissing { byte: u8 },
    #[error("\"▁\" has no token in the vocabulary")]
    NoMetaspace,
    #[error("{count} byte fallback ids where there are 256 bytes")]
    ByteFallbackIds { count: usize },
    #[error("the tables say HF tokenizers 1.x encodes, not the fast path")]
    Hf1Tables,
}
