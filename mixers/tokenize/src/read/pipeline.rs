//! The pipeline half of the fast path's exactness check: reads what HF loaded from the
//! `tokenizer.json` (normalizer, pre-tokenizer, model flags, added tokens, post-processor,
//! truncation, padding) and either describes a pipeline the fast path reproduces step for step,
//! or says which setting it does not reproduce. Anything not known to be reproduced is refused:
//! HF then runs, so a refusal costs speed, never ids.

use tokenizers::models::ModelWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use super::Refusal;
use crate::engines::normalization::Normalization;
use crate::scanner::GPT2_PATTERN;

/// How text between added tokens is cut into pieces for BPE, as HF's `NormalizedString::split`
/// does it: a regex's matches and the gaps between them, each kept or dropped.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct PieceSplit {
    pub pattern: String,
    pub keep_matches: bool,
    pub keep_gaps: bool,
}

/// A cut HF makes before the last split, each piece it keeps going on to the next.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) enum OuterCut {
    /// A regex `Split`.
    Regex(PieceSplit),
    /// `Digits`: HF cuts where `char::is_numeric` holds, each such character a piece of its own
    /// (`individual_digits`) or each run of them one piece, and keeps the stretches between.
    Numbers { individual: bool },
}

/// An added token as the fast path matches it: `pattern` is what HF's tries hold (normalized
/// content for `normalized` tokens), `skip` mirrors HF's `encode_special_tokens`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct AddedSpec {
    pub id: u32,
    pub pattern: String,
    pub normalized: bool,
    pub skip: bool,
}

/// A pipeline the fast path reproduces.
pub(crate) struct Pipeline<'t> {
    pub normalization: Normalization,
    /// Cuts HF applies before `split`, in order, each to every piece the one before kept
    /// (DeepSeek V3 isolates digit groups, then CJK runs, then cuts by its pattern; Command R+
    /// isolates each digit, then cuts by GPT-2's).
    pub outer: Vec<OuterCut>,
    pub split: PieceSplit,
    pub added: Vec<AddedSpec>,
    pub bpe: &'t BPE,
}

/// The `type` HF writes for a component, for messages.
fn type_name<T: serde::Serialize>(component: &T) -> String {
    serde_json::to_value(component)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// A component as a refusal shows it: its JSON (its `type` if that fails), or "none".
fn shown<T: serde::Serialize>(component: Option<&T>) -> String {
    component.map_or("none".to_string(), |c| {
        serde_json::to_string(c).unwrap_or_else(|_| type_name(c))
    })
}

/// Truncation and padding change what `encode` returns; neither engine of the fast path has them.
fn check_no_truncation_or_padding(tokenizer: &Tokenizer) -> Result<(), Refusal> {
    if tokenizer.get_truncation().is_some() {
        return Err(Refusal::Truncation);
    }
    if tokenizer.get_padding().is_some() {
        return Err(Refusal::Padding);
    }
    Ok(())
}

/// Whether the model is a BPE with byte fallback: the SentencePiece-style engine's, not the
/// byte-level one's.
pub(crate) fn has_byte_fallback(tokenizer: &Tokenizer) -> bool {
    matches!(tokenizer.get_model(), ModelWrapper::BPE(bpe) if bpe.byte_fallback)
}

pub(crate) fn analyse(tokenizer: &Tokenizer) -> Result<Pipeline<'_>, Refusal> {
    check_no_truncation_or_padding(tokenizer)?;
    let bpe = bpe_model(tokenizer)?;
    if bpe.byte_fallback {
        return Err(Refusal::ByteFallback);
    }
    // A Sequence of nothing, or of one normalizer, is that (DeepSeek V3 writes an empty one).
    let normalizer = match tokenizer.get_normalizer() {
        Some(NormalizerWrapper::Sequence(seq)) => match seq.as_ref() {
            [] => None,
            [one] => Some(one),
            _ => tokenizer.get_normalizer(),
        },
        other => other,
    };
    let normalization = match normalizer {
        None => Normalization::None,
        Some(NormalizerWrapper::NFC(_)) => Normalization::Nfc,
        Some(NormalizerWrapper::NFKC(_)) => Normalization::Nfkc,
        Some(other) => {
            return Err(Refusal::Normalizer {
                normalizer: type_name(other),
            });
        }
    };
    let (outer, split) = piece_splits(tokenizer.get_pre_tokenizer())?;
    if let Some(post) = tokenizer.get_post_processor() {
        check_post_processor(post)?;
    }
    let added = added_tokens(tokenizer, normalization)?;
    Ok(Pipeline {
        normalization,
        outer,
        split,
        added,
        bpe,
    })
}

fn bpe_model(tokenizer: &Tokenizer) -> Result<&BPE, Refusal> {
    let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
        return Err(Refusal::NotBpe {
            model: type_name(tokenizer.get_model()),
        });
    };
    // HF only draws random numbers for a non-zero dropout.
    if let Some(p) = bpe.dropout.filter(|p| *p != 0.0) {
        return Err(Refusal::Dropout { dropout: p });
    }
    // An empty prefix/suffix is what HF pastes around pieces: nothing (Qwen's files set "").
    let affix_set = |affix: &Option<String>| affix.as_deref().is_some_and(|a| !a.is_empty());
    if affix_set(&bpe.continuing_subword_prefix) || affix_set(&bpe.end_of_word_suffix) {
        return Err(Refusal::SubwordAffixes);
    }
    Ok(bpe)
}

/// A SentencePiece-style BPE pipeline the fast path reproduces: every space is written "▁"
/// (by a Replace normalizer, or by a Metaspace pre-tokenizer), a "▁" is prepended to a stretch
/// of text between added tokens as [`Prepend`] says, nothing else cuts the stretch (it is one BPE
/// word), and the model merges characters, with `<0xNN>` byte tokens for characters outside the
/// vocabulary.
pub(crate) struct SentencePiecePipeline<'t> {
    pub added: Vec<AddedSpec>,
    pub bpe: &'t BPE,
    pub prepend: Prepend,
    /// What writes spaces as "▁" and prepends one, as the engine line says it.
    pub spaces: String,
}

/// Which stretches between added tokens get a "▁" in front.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Prepend {
    /// Every stretch: a Prepend normalizer (Llama 2, Mistral 7B).
    Always,
    /// Every stretch that does not already start with a space or "▁": a Metaspace
    /// pre-tokenizer with `prepend_scheme` "always".
    UnlessThere,
    /// The stretch that starts the document, unless it starts with a space or "▁": a Metaspace
    /// pre-tokenizer with `prepend_scheme` "first" (Mistral 7B v0.3's and other files that
    /// recent `transformers` write).
    FirstUnlessThere,
    /// None: a Replace normalizer alone (Gemma, Yi, InternLM2), or Metaspace with "never".
    Never,
}

/// The metaspace character SentencePiece writes for a space.
pub(crate) const METASPACE: char = '\u{2581}';

/// Whether the normalizer prepends "▁" ([`Prepend::Always`]), only writes spaces as "▁"
/// ([`Prepend::Never`]), or is not one the fast path reproduces (`None`).
fn sentencepiece_normalizer(normalizer: &NormalizerWrapper) -> Option<Prepend> {
    let metaspace = METASPACE.to_string();
    let spaces_to_metaspace = |r: &NormalizerWrapper| {
        let NormalizerWrapper::Replace(r) = r else {
            return false;
        };
        let replace = serde_json::to_value(r).unwrap_or_default();
        replace["pattern"]["String"] == " " && replace["content"] == metaspace.as_str()
    };
    match normalizer {
        one @ NormalizerWrapper::Replace(_) => spaces_to_metaspace(one).then_some(Prepend::Never),
        NormalizerWrapper::Sequence(seq) => match seq.as_ref() {
            [NormalizerWrapper::Prepend(p), r] => {
                (p.prepend == metaspace && spaces_to_metaspace(r)).then_some(Prepend::Always)
            }
            [r] => spaces_to_metaspace(r).then_some(Prepend::Never),
            _ => None,
        },
        _ => None,
    }
}

/// A pre-tokenizer that cuts nothing after the normalizer wrote spaces as "▁": none, or a
/// `Split` on a literal string with a space in it (Gemma 3 splits on " "), which never matches.
fn cuts_nothing_after_spaces_are_metaspace(pre: Option<&PreTokenizerWrapper>) -> bool {
    match pre {
        None => true,
        Some(PreTokenizerWrapper::Split(split)) => {
            !split.invert
                && matches!(&split.pattern, SplitPattern::String(literal) if literal.contains(' '))
        }
        Some(_) => false,
    }
}

/// How spaces become "▁" and which stretches get one in front (and how the engine line says
/// so), or why the fast path does not reproduce this file's way.
fn sentencepiece_spaces(tokenizer: &Tokenizer) -> Result<(Prepend, String), Refusal> {
    let (normalizer, pre) = (tokenizer.get_normalizer(), tokenizer.get_pre_tokenizer());
    if let (None, Some(PreTokenizerWrapper::Metaspace(m))) = (normalizer, pre) {
        // HF's Metaspace writes each space as the replacement, then prepends one as its scheme
        // says; with `split` it would also cut before every replacement.
        if m.get_replacement() == METASPACE && !m.get_split() {
            let (prepend, scheme) = match m.get_prepend_scheme() {
                PrependScheme::Always => (Prepend::UnlessThere, "always"),
                PrependScheme::First => (Prepend::FirstUnlessThere, "first"),
                PrependScheme::Never => (Prepend::Never, "never"),
            };
            let spaces = format!("pre-tokenizer Metaspace (prepend_scheme {scheme})");
            return Ok((prepend, spaces));
        }
    }
    let Some(prepend) = normalizer.and_then(sentencepiece_normalizer) else {
        return Err(Refusal::SentencePieceSpaces {
            normalizer: shown(normalizer),
            pre_tokenizer: shown(pre),
        });
    };
    if !cuts_nothing_after_spaces_are_metaspace(pre) {
        return Err(Refusal::SentencePiecePreTokenizer {
            pre_tokenizer: shown(pre),
        });
    }
    let spaces = match prepend {
        Prepend::Always => "normalizer Prepend \"▁\" + Replace \" \" → \"▁\"",
        _ => "normalizer Replace \" \" → \"▁\"",
    };
    Ok((prepend, spaces.to_string()))
}

pub(crate) fn analyse_sentencepiece(
    tokenizer: &Tokenizer,
) -> Result<SentencePiecePipeline<'_>, Refusal> {
    check_no_truncation_or_padding(tokenizer)?;
    let bpe = bpe_model(tokenizer)?;
    if bpe.ignore_merges {
        return Err(Refusal::SentencePieceIgnoreMerges);
    }
    let (prepend, spaces) = sentencepiece_spaces(tokenizer)?;
    if let Some(post) = tokenizer.get_post_processor() {
        check_post_processor(post)?;
    }
    let added = added_tokens(tokenizer, Normalization::None)?;
    if let Some(token) = added.iter().find(|a| a.normalized) {
        return Err(Refusal::NormalizedAddedToken {
            pattern: token.pattern.clone(),
        });
    }
    Ok(SentencePiecePipeline {
        added,
        bpe,
        prepend,
        spaces,
    })
}

fn flatten<'a>(pre: &'a PreTokenizerWrapper, steps: &mut Vec<&'a PreTokenizerWrapper>) {
    match pre {
        PreTokenizerWrapper::Sequence(seq) => seq.as_ref().iter().for_each(|p| flatten(p, steps)),
        other => steps.push(other),
    }
}

/// Byte-level pre-tokenization the fast path reproduces: regex `Split`s and `Digits` (HF applies
/// each to every piece the one before kept), then `ByteLevel`, with its own regex (GPT-2's) or,
/// after a regex Split, without one; never with `add_prefix_space`. The cuts before the last,
/// then the last.
fn piece_splits(pre: Option<&PreTokenizerWrapper>) -> Result<(Vec<OuterCut>, PieceSplit), Refusal> {
    let Some(pre) = pre else {
        return Err(Refusal::NoPreTokenizer);
    };
    let mut steps = Vec::new();
    flatten(pre, &mut steps);
    let refuse = || Refusal::PreTokenizer {
        steps: steps.iter().map(|s| type_name(*s)).collect(),
    };
    match steps.as_slice() {
        [splits @ .., PreTokenizerWrapper::ByteLevel(b)]
            if !b.add_prefix_space && (b.use_regex || !splits.is_empty()) =>
        {
            let mut splits = splits
                .iter()
                .map(|step| match step {
                    PreTokenizerWrapper::Split(split) => regex_split(split).map(OuterCut::Regex),
                    PreTokenizerWrapper::Digits(digits) => Ok(OuterCut::Numbers {
                        individual: digits.individual_digits,
                    }),
                    _ => Err(refuse()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let last = if b.use_regex {
                PieceSplit {
                    pattern: GPT2_PATTERN.to_string(),
                    keep_matches: true,
                    keep_gaps: true,
                }
            } else {
                // Without ByteLevel's regex the last cut must be a regex Split.
                match splits.pop() {
                    Some(OuterCut::Regex(last)) => last,
                    _ => return Err(refuse()),
                }
            };
            Ok((splits, last))
        }
        _ => Err(refuse()),
    }
}

/// One regex `Split` as the fast path cuts it.
fn regex_split(split: &tokenizers::pre_tokenizers::split::Split) -> Result<PieceSplit, Refusal> {
    let SplitPattern::Regex(pattern) = &split.pattern else {
        return Err(Refusal::SplitOnString);
    };
    // `invert` swaps which spans count as matches; Isolated keeps every span and
    // Removed drops the spans that count as matches.
    let (keep_matches, keep_gaps) = match (split.behavior, split.invert) {
        (SplitDelimiterBehavior::Isolated, _) => (true, true),
        (SplitDelimiterBehavior::Removed, false) => (false, true),
        (SplitDelimiterBehavior::Removed, true) => (true, false),
        (behavior, _) => return Err(Refusal::SplitBehavior { behavior }),
    };
    Ok(PieceSplit {
        pattern: pattern.clone(),
        keep_matches,
        keep_gaps,
    })
}

/// With `add_special_tokens = false` (all the stage ever asks for), ByteLevel only moves
/// offsets and TemplateProcessing adds nothing; other processors are not vouched for.
fn check_post_processor(post: &PostProcessorWrapper) -> Result<(), Refusal> {
    match post {
        PostProcessorWrapper::ByteLevel(_) | PostProcessorWrapper::Template(_) => Ok(()),
        PostProcessorWrapper::Sequence(seq) => {
            seq.as_ref().iter().try_for_each(check_post_processor)
        }
        other => Err(Refusal::PostProcessor {
            post_processor: type_name(other),
        }),
    }
}

/// HF finds added tokens before anything else, even with `add_special_tokens = false`: the
/// non-normalized ones in the raw text, the normalized ones (by their normalized content) in the
/// normalized text between those. The whitespace/word flags are not reproduced.
fn added_tokens(
    tokenizer: &Tokenizer,
    normalization: Normalization,
) -> Result<Vec<AddedSpec>, Refusal> {
    let vocabulary = tokenizer.get_added_vocabulary();
    let skip_special = vocabulary.get_encode_special_tokens();
    let mut added = Vec::new();
    for (&id, token) in vocabulary.get_added_tokens_decoder() {
        if token.single_word || token.lstrip || token.rstrip {
            return Err(Refusal::AddedTokenFlags {
                content: token.content.clone(),
            });
        }
        let pattern = if token.normalized {
            normalization.apply(&token.content).into_owned()
        } else {
            token.content.clone()
        };
        added.push(AddedSpec {
            id,
            pattern,
            normalized: token.normalized,
            skip: skip_special && vocabulary.is_special_token(&token.content),
        });
    }
    Ok(added)
}
