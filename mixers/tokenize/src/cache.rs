//! The engine cache: what a `tokenizer.json` teaches the stage (which engine encodes it, dsprep's
//! engine's tables), kept as one checked entry per file ([`entry`]) whose two large tables are
//! little-endian words ([`packed_tables`]). The caller keeps the bytes ([`EngineCache`]).

pub(crate) mod entry;
pub(crate) mod packed_tables;

pub use entry::EngineCache;

use crate::engines::hf1::Hf1Error;
use crate::read::Refusal;

/// Why an engine-cache entry is ignored, as the engine line says it after "engine cache entry
/// ignored: ": torn or cut short, of another format, for another file or build, or tables that
/// do not parse or build. The engine is then chosen and built from the file, and the entry
/// replaced: an ignored entry costs a rebuild, never an id.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheError {
    #[error("no header line")]
    NoHeader,
    #[error("header is not UTF-8")]
    HeaderNotUtf8,
    #[error("header has no payload hash")]
    NoPayloadHash,
    #[error("format {found:?}, this build reads {:?}", entry::FORMAT)]
    OtherFormat { found: String },
    #[error("payload does not match its sha256 (corrupt or cut short)")]
    Torn,
    #[error("payload has no head line")]
    NoHead,
    #[error("head does not parse: {0}")]
    Head(serde_json::Error),
    #[error("entry is for tokenizer sha256 {entry}, not {file}")]
    OtherFile { entry: String, file: String },
    #[error("written by {written_by}, this is {this}")]
    OtherBuild { written_by: String, this: String },
    #[error("tables do not parse: {0}")]
    Tables(TablesError),
    /// The tables parse, but dsprep's engine does not build from them.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The entry chose HF 1.x, which does not read the file.
    #[error(transparent)]
    Hf1(#[from] Hf1Error),
    #[error("the engine's build was lost (a panic while building it)")]
    BuildLost,
}

/// What is wrong with an entry's tables (their JSON line and their large tables' words), or
/// why an entry's bytes could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TablesError {
    #[error("no line ends their JSON")]
    NoJsonLine,
    #[error("{0}")]
    Json(serde_json::Error),
    /// `what` ran past the end of the bytes, which start at byte `at` of the large tables.
    #[error("cut short in {what}, at byte {at}")]
    CutShort { what: &'static str, at: usize },
    #[error("{bytes} bytes after the last table")]
    Trailing { bytes: usize },
    #[error("HF 1.x's entry holds tables")]
    Hf1WithTables,
    #[error("{entries} entries in one table")]
    TooLarge { entries: usize },
}
