//! The recipe: the one document that decides the bytes of the token stream (sources, weights,
//! tokenizer, `seq_len`, seed). Parsed strictly — every unknown key and every invalid value is
//! reported at once, each with its field path — and identified by a hash of its canonical form
//! that goes into every manifest and checkpoint.
//!
//! Speed settings (threads, queue sizes, shard size) are not part of the recipe: they never change
//! the bytes.

mod adaptive;
mod filter;
mod location;
mod validate;

pub use adaptive::{AdaptiveSpec, Algorithm, OnMissing};
pub use dsprep_tokenize::{TokenRef, TokenizerSpec};
pub use filter::{CompareOp, RowFilter};
pub use location::{DEFAULT_REVISION, HUB_SCHEME, HubLocation};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The recipe format version this build reads and writes.
pub const RECIPE_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Recipe {
    /// Recipe format version; must be [`RECIPE_VERSION`].
    pub version: u32,
    pub tokenizer: TokenizerSpec,
    pub packing: PackingSpec,
    #[serde(default)]
    pub shuffle: ShuffleSpec,
    #[serde(default)]
    pub mix: MixSpec,
    /// `[lanes]`: split the stream into independent pipelines that separate processes (node
    /// daemons, `pack` parts) can run. Absent: one pipeline, the stream of earlier versions (and
    /// the same recipe hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<LanesSpec>,
    /// `[[source]]` tables, in the order written; the order is part of the stream.
    #[serde(rename = "source", default)]
    pub sources: Vec<SourceSpec>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PackingSpec {
    /// Tokens per training sequence; windows hold `seq_len + 1` tokens (inputs and labels
    /// overlap by one).
    pub seq_len: u32,
    /// How documents become windows. `concat` (the default, absent from the canonical form so
    /// that recipes written before `strategy` existed keep their hash) or `best_fit`.
    #[serde(default, skip_serializing_if = "PackStrategy::is_concat")]
    pub strategy: PackStrategy,
    /// `best_fit`: documents waiting in the pool (split between lanes as the shuffle buffer is).
    /// Filled in with [`DEFAULT_POOL_DOCUMENTS`] when absent; refused with `concat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_documents: Option<usize>,
    /// `best_fit`: the id written after a window's last document (absent: the recipe's EOS).
    /// Padding is marked by each window's real-token count, never by comparing ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad: Option<TokenRef>,
}

/// The pool of `best_fit` when the recipe does not size it.
pub const DEFAULT_POOL_DOCUMENTS: usize = 10_000;
/// The most bytes a whole `best_fit` pool may hold: `pool_documents × (seq_len + 1) × 4` (every
/// pooled document is at most a window) must stay at or below this.
pub const MAX_POOL_BYTES: u64 = 4 << 30;

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PackStrategy {
    /// Concatenate documents and cut the stream into windows (documents split across windows).
    #[default]
    Concat,
    /// Fill each window best-fit-decreasing from a pool of whole documents; the rest is padding.
    BestFit,
}

impl PackStrategy {
    fn is_concat(&self) -> bool {
        *self == PackStrategy::Concat
    }

    /// As the recipe spells it.
    pub fn name(self) -> &'static str {
        match self {
            PackStrategy::Concat => "concat",
            PackStrategy::BestFit => "best_fit",
        }
    }
}

impl PackingSpec {
    pub fn window_tokens(&self) -> usize {
        self.seq_len as usize + 1
    }

    /// Whether windows may end in padding (`best_fit`): the packed format and the wire say how
    /// many of each window's tokens are real.
    pub fn pads(&self) -> bool {
        self.strategy == PackStrategy::BestFit
    }

    /// The `best_fit` pool of the whole stream (`None` with `concat`).
    pub fn pool_documents(&self) -> Option<usize> {
        match self.strategy {
            PackStrategy::Concat => None,
            PackStrategy::BestFit => Some(self.pool_documents.unwrap_or(DEFAULT_POOL_DOCUMENTS)),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShuffleSpec {
    #[serde(default)]
    pub seed: u64,
    /// Documents held by the global shuffle buffer; 0 turns it off.
    #[serde(default = "default_buffer_size")]
    pub buffer_size: usize,
    /// Shuffle each source's shard (file) order with the seed.
    #[serde(default = "default_true")]
    pub shuffle_shards: bool,
}

impl Default for ShuffleSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            buffer_size: default_buffer_size(),
            shuffle_shards: true,
        }
    }
}

fn default_buffer_size() -> usize {
    10_000
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MixSpec {
    #[serde(default)]
    pub stopping: Stopping,
    /// What the sources' weights are shares of. `documents` (the default) is left out of the
    /// canonical form, so recipes written before `unit` existed keep their hash.
    #[serde(default, skip_serializing_if = "MixUnit::is_documents")]
    pub unit: MixUnit,
    /// `[[mix.phase]]`: from a point of the stream on, other weights (a mix in tokens only).
    /// The `[[source]]` weights are phase 0's.
    #[serde(default, rename = "phase", skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseSpec>,
    /// `[mix.adaptive]`: shares decided during the run from the trainers' per-source loss
    /// (absent from the canonical form when not set, so other recipes keep their hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveSpec>,
}

/// `[[mix.phase]]`: the weights in force from `at_tokens` tokens of the stream on (BOS/EOS
/// included), until the next phase. The switch comes at the first document drawn once the stream
/// holds at least `at_tokens` tokens (the document that crosses the point is finished first).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    pub at_tokens: u64,
    /// Per source name, its weight in this phase; a source not named has weight 0 (it takes no
    /// part in the phase). A source of weight 0 in `[[source]]` may join in a phase.
    pub weights: std::collections::BTreeMap<String, f64>,
}

/// What a source's weight is a share of (`[mix] unit`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MixUnit {
    /// The probability of drawing the next document from the source, as in HF
    /// `interleave_datasets(probabilities=…)`; the shuffle buffer is global.
    #[default]
    Documents,
    /// The share of the stream's tokens (BOS/EOS included) that come from the source, held
    /// while streaming: each source is shuffled in its own share of the buffer, and the next
    /// document comes from the source furthest below its share (`crate::mixer`).
    Tokens,
}

impl MixUnit {
    pub fn is_documents(&self) -> bool {
        *self == MixUnit::Documents
    }
}

/// `[lanes]`: see `crate::lanes` for how the input is dealt and the windows interleaved.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LanesSpec {
    /// Independent pipelines, each over a disjoint share of every source's input.
    pub count: u32,
    /// Consecutive windows taken from one lane before the next lane's turn.
    pub block_windows: u32,
}

/// When the mixed stream ends; the semantics of HF `interleave_datasets(stopping_strategy=…)`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stopping {
    /// End right after the last document of the first source to run out.
    #[default]
    FirstExhausted,
    /// A source that runs out starts again from its first document; end right after every
    /// source has emitted its last document at least once.
    AllExhausted,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SourceSpec {
    pub name: String,
    /// The source's share of the mix: of its documents (`[mix] unit = "documents"`, the
    /// probability of drawing the next document from it) or of its tokens (`unit = "tokens"`).
    /// Relative: weights are divided by their sum. 0 drops the source.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Glob patterns, relative to the recipe file's folder, or Hub patterns
    /// `hf://datasets/OWNER/NAME[@REVISION]/GLOB` (see [`HubLocation`]).
    pub files: Vec<String>,
    pub format: Format,
    /// Where the document text is in a row.
    #[serde(default)]
    pub text: TextField,
    /// Keep only rows where a numeric column passes, e.g. `"int_score >= 3"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<RowFilter>,
    /// Rows that hold content ids instead of text (The Stack v2 `*-ids`): where to fetch each
    /// blob. `text` then names the list and its id field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<ContentSpec>,
    /// The largest document text, in bytes ([`DEFAULT_MAX_DOCUMENT_BYTES`] when absent): what
    /// one document may cost in memory. Absent, it is not part of the canonical form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_document_bytes: Option<u64>,
    /// What a larger document does (`error` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversize: Option<Oversize>,
    /// How Hub files are checked against what the Hub says ([`Verify`]). A safety setting: it
    /// never changes the bytes, so it is not part of the canonical form (nor of the recipe hash).
    #[serde(default, skip_serializing)]
    pub verify: Verify,
}

/// `verify`: how a Hub file's bytes are checked before any token is made from them.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// The default: every byte checked. A parquet file whose pages carry CRCs is read by ranges
    /// (only the columns the recipe needs), each page checked against its CRC; one without is
    /// downloaded whole and checked against the Hub's sha256 before it is read. JSON lines are
    /// always checked whole.
    #[default]
    Auto,
    /// Parquet by ranges, each page that carries a CRC checked against it: the fast opt-in.
    /// Files written without page CRCs (most on the Hub) are read unchecked.
    Pages,
    /// Download each file whole, check its sha256 against the Hub's, then read the local copy,
    /// page CRCs or not.
    Full,
    /// Nothing checked: parquet read by ranges, JSON lines streamed as they arrive.
    None,
}

/// The largest document text a source takes unless it says otherwise: 64 MiB. Repository-level
/// code documents (The Stack v2) reach tens of MB; a web page past this is a dump, not a page.
pub const DEFAULT_MAX_DOCUMENT_BYTES: u64 = 64 << 20;
/// The largest `max_document_bytes` a recipe may set: 1 GiB.
pub const MAX_DOCUMENT_BYTES_LIMIT: u64 = 1 << 30;

/// What a document larger than `max_document_bytes` does.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Oversize {
    /// Stop with the file, row and size.
    #[default]
    Error,
    /// Leave it out of the stream, counted (`rows_oversize` in the summary and the manifest).
    Skip,
    /// Cut it into pieces of at most `max_document_bytes` ([`crate::split`] states where), each
    /// a document of its own, in order (`rows_split` and `split_pieces` count them). A row over
    /// [`MAX_SPLIT_READ_BYTES`] is still an error: that is what splitting reads at most.
    Split,
}

/// The largest row text a source with `oversize = "split"` reads (and holds while it hands out
/// its pieces): 1 GiB, the largest `max_document_bytes` allowed. A larger row stops the run.
pub const MAX_SPLIT_READ_BYTES: u64 = MAX_DOCUMENT_BYTES_LIMIT;

impl SourceSpec {
    /// The largest document text this source takes, in bytes.
    pub fn document_limit(&self) -> u64 {
        self.max_document_bytes
            .unwrap_or(DEFAULT_MAX_DOCUMENT_BYTES)
    }

    /// The largest row text this source reads, in bytes: its [`SourceSpec::document_limit`], or
    /// [`MAX_SPLIT_READ_BYTES`] when it splits larger rows. Readers refuse a longer row before
    /// copying it out.
    pub fn read_limit(&self) -> u64 {
        match self.oversize.unwrap_or_default() {
            Oversize::Split => MAX_SPLIT_READ_BYTES.max(self.document_limit()),
            Oversize::Error | Oversize::Skip => self.document_limit(),
        }
    }
}

/// `[source.content]`: fetch each file's content by its blob id (The Stack v2 smol-ids has
/// repository rows whose `files` carry `blob_id` and `src_encoding` but no content).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContentSpec {
    /// URL of one blob, with `{blob_id}` in it. Default (when `mirror_dir` is not set either):
    /// [`DEFAULT_CONTENT_URL`]. Blobs may be gzip-compressed (they are on Software Heritage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_template: Option<String>,
    /// A local folder holding one file per blob, named by its id (gzip-compressed or plain);
    /// relative to the recipe file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_dir: Option<String>,
    /// One document per repository row (its files joined with `text.separator`) or per file.
    #[serde(default)]
    pub per: ContentPer,
    /// The struct field naming each file's encoding (`UTF-8`, `ISO-8859-1`, …); a null or
    /// missing value means UTF-8.
    #[serde(default = "default_encoding_field")]
    pub encoding_field: String,
    /// Blobs fetched at once. A speed setting: it never changes the bytes, so it is not part of
    /// the canonical form (nor of the recipe hash).
    #[serde(default = "default_content_concurrency", skip_serializing)]
    pub concurrency: usize,
}

/// Software Heritage's bucket, as the Stack v2 card reads it (anonymous access is not
/// guaranteed: see the README on mirrors and presigned templates).
pub const DEFAULT_CONTENT_URL: &str = "https://softwareheritage.s3.amazonaws.com/content/{blob_id}";

fn default_encoding_field() -> String {
    "src_encoding".to_string()
}

fn default_content_concurrency() -> usize {
    16
}

/// What one document is when content is fetched per blob.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ContentPer {
    /// A repository row's files, joined with the separator of `text`.
    #[default]
    Repository,
    /// Each file alone.
    File,
}

fn default_weight() -> f64 {
    1.0
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Format {
    #[serde(rename = "parquet")]
    Parquet,
    #[serde(rename = "jsonl")]
    Jsonl,
    #[serde(rename = "jsonl.gz")]
    JsonlGz,
}

/// How to get a document's text out of a row.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum TextField {
    /// A string column (`text` for FineWeb-Edu, C4, Zyda-2, FineMath; `content` for per-file code).
    Column(String),
    /// A list-of-structs column whose items' `field` strings are joined with `separator`: a
    /// repository-level row of The Stack v2 (`files[].content`) becomes one document.
    Join(JoinField),
}

/// `text = { list = "files", field = "content", separator = "\n\n" }`
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JoinField {
    pub list: String,
    pub field: String,
    #[serde(default = "default_separator")]
    pub separator: String,
}

impl Default for TextField {
    fn default() -> Self {
        TextField::Column("text".to_string())
    }
}

fn default_separator() -> String {
    "\n\n".to_string()
}

/// Everything wrong with a recipe, each with its field path.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("{0}")]
    Syntax(String),
    #[error("{}", format_field_errors(.0))]
    Invalid(Vec<FieldError>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// e.g. `source[2].weight`
    pub path: String,
    pub message: String,
}

fn format_field_errors(errors: &[FieldError]) -> String {
    let lines: Vec<String> = errors
        .iter()
        .map(|e| format!("  {}: {}", e.path, e.message))
        .collect();
    format!(
        "{} problem(s) in the recipe:\n{}",
        errors.len(),
        lines.join("\n")
    )
}

impl Recipe {
    /// Parse and validate TOML text. Reports unknown keys and invalid values together.
    pub fn parse(text: &str) -> Result<Recipe, RecipeError> {
        let mut unknown = Vec::new();
        let deserializer =
            toml::Deserializer::parse(text).map_err(|e| RecipeError::Syntax(e.to_string()))?;
        let recipe: Recipe =
            serde_ignored::deserialize(deserializer, |path| unknown.push(path.to_string()))
                .map_err(|e: toml::de::Error| RecipeError::Syntax(e.to_string()))?;
        let mut errors: Vec<FieldError> = unknown
            .into_iter()
            .map(|path| FieldError {
                path: validate::index_path(&path),
                message: "unknown key".to_string(),
            })
            .collect();
        errors.extend(validate::validate(&recipe));
        if errors.is_empty() {
            let mut recipe = recipe;
            recipe.fill_defaults();
            Ok(recipe)
        } else {
            Err(RecipeError::Invalid(errors))
        }
    }

    /// Defaults that depend on other fields, filled in so the canonical form spells them out.
    fn fill_defaults(&mut self) {
        self.packing.pool_documents = self.packing.pool_documents();
        for source in &mut self.sources {
            if let Some(content) = &mut source.content
                && content.url_template.is_none()
                && content.mirror_dir.is_none()
            {
                content.url_template = Some(DEFAULT_CONTENT_URL.to_string());
            }
        }
    }

    /// Whether any source that takes part reads from the Hub or fetches content over HTTP.
    pub fn needs_network(&self) -> bool {
        self.active_sources().any(|(_, s)| {
            s.files.iter().any(|f| HubLocation::is_hub(f))
                || s.content.as_ref().is_some_and(|c| c.url_template.is_some())
        })
    }

    /// The canonical form: JSON of the parsed recipe with every default filled in, so two
    /// recipes that mean the same stream have the same form whatever their spelling.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("a recipe always serializes")
    }

    /// sha256 of the canonical form, hex: the identity of the token stream.
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"dsprep-recipe\n");
        hasher.update(self.canonical_json().as_bytes());
        hex::encode(hasher.finalize())
    }

    /// Sources that take part in the mix (weight > 0 in `[[source]]` or in a phase), with their
    /// index in `sources`: the sources that are listed and read.
    pub fn active_sources(&self) -> impl Iterator<Item = (usize, &SourceSpec)> {
        self.sources
            .iter()
            .enumerate()
            .filter(|(i, _)| self.takes_part(*i))
    }

    /// Whether source `index` has weight > 0 in `[[source]]` or in some phase.
    pub fn takes_part(&self, index: usize) -> bool {
        self.phase_weights()
            .iter()
            .any(|w| w.get(index).is_some_and(|&w| w > 0.0))
    }

    /// Every phase's weights, source by source in recipe order: phase 0 (`[[source]]`), then
    /// each `[[mix.phase]]`'s.
    pub fn phase_weights(&self) -> Vec<Vec<f64>> {
        let base = self.sources.iter().map(|s| s.weight).collect();
        let phases = self.mix.phases.iter().map(|p| self.weights_of(p));
        std::iter::once(base).chain(phases).collect()
    }

    /// A phase's weights, source by source in recipe order (a source it does not name: 0).
    pub fn weights_of(&self, phase: &PhaseSpec) -> Vec<f64> {
        self.sources
            .iter()
            .map(|s| phase.weights.get(&s.name).copied().unwrap_or(0.0))
            .collect()
    }

    /// Every phase's targets: its weights divided by their sum (see [`Recipe::phase_weights`]).
    pub fn phase_targets(&self) -> Vec<Vec<f64>> {
        self.phase_weights()
            .iter()
            .map(|weights| crate::mixer::target_shares(weights))
            .collect()
    }
}

#[cfg(test)]
mod tests;
