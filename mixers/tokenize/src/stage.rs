//! The stage behind its facade ([`crate::TokenizeStage`]): how it is built, from the file or from
//! an engine-cache entry, with the engine built when first asked for ([`build`]), and the ids a
//! recipe names (BOS, EOS, a `best_fit` pad) looked up in the vocabulary ([`vocabulary`]).

pub(crate) mod build;
pub(crate) mod vocabulary;
