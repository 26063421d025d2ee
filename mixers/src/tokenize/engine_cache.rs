//! The fast engine's tables as bytes, so that what a `tokenizer.json` teaches the engine (HF's
//! parse of the file, the merge table as ids, the pre-tokenizer and added-token settings) is
//! worked out once per file on a machine, not once per process. The caller keeps the bytes (the
//! daemon in files: `daemon/src/tokenizer_cache.rs`); this module only writes and checks them.
//!
//! An entry is one header line, `dsprep-engine-cache/2 <sha256 of the payload>`, then the payload
//! (JSON). It is used only when the payload's hash matches, it names the same tokenizer file
//! (sha256 of its bytes) and it was written by the same build of the engine (this crate's version
//! and the `tokenizers` version its parse follows); anything else is ignored, with the reason, and
//! the engine is built from the file as if there were no entry. A stale or foreign entry can cost
//! a rebuild, never an id.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::byte_level::ByteLevelTables;
use super::sentencepiece::SentencePieceTables;

/// The first word of an entry; bump the number when the entry's layout changes.
const FORMAT: &str = "dsprep-engine-cache/2";

/// The `tokenizers` release whose parse the tables follow (a test checks it against Cargo.lock).
pub(crate) const TOKENIZERS_VERSION: &str = "0.23.2";

/// Where the caller keeps entries, by the sha256 (hex) of the tokenizer file they are for.
pub trait EngineCache {
    /// The entry for `tokenizer_sha256`, if one is kept (unchecked bytes).
    fn load(&self, tokenizer_sha256: &str) -> Option<Vec<u8>>;
    /// Keep `entry` for `tokenizer_sha256`. Failing to keep it is not an error for the caller.
    fn store(&self, tokenizer_sha256: &str, entry: &[u8]);
}

/// What a fast engine is built from.
#[derive(Serialize, Deserialize)]
pub(crate) enum EngineTables {
    ByteLevel(ByteLevelTables),
    SentencePiece(SentencePieceTables),
}

/// One cache entry: the engine's tables and what the stage needs of HF's tokenizer without
/// parsing the file again.
#[derive(Serialize, Deserialize)]
pub(crate) struct CachedEngine {
    /// sha256 (hex) of the tokenizer file.
    pub tokenizer_sha256: String,
    /// The build that wrote the entry (see [`built_by`]).
    pub built_by: String,
    /// One more than the largest id.
    pub vocab_size: u32,
    /// Every id below this one has a token (so an id the recipe names is checked without HF).
    pub dense_ids: u32,
    /// Every added token's content and id (a BOS/EOS given as text is looked up here).
    pub added: Vec<(String, u32)>,
    pub engine: EngineTables,
}

/// This build of the engine, as an entry records it.
pub(crate) fn built_by() -> String {
    format!(
        "dsprep-mixers {} / tokenizers {TOKENIZERS_VERSION}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The entry's bytes.
pub(crate) fn to_bytes(entry: &CachedEngine) -> Result<Vec<u8>, String> {
    let payload = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
    let mut bytes = format!("{FORMAT} {}\n", hex::encode(Sha256::digest(&payload))).into_bytes();
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// The entry in `bytes` if it is whole and is for this tokenizer file and this build; else why
/// it is ignored.
pub(crate) fn from_bytes(bytes: &[u8], tokenizer_sha256: &str) -> Result<CachedEngine, String> {
    let newline = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line")?;
    let (header, payload) = (&bytes[..newline], &bytes[newline + 1..]);
    let header = std::str::from_utf8(header).map_err(|_| "header is not UTF-8")?;
    let (format, hash) = header.split_once(' ').ok_or("header has no payload hash")?;
    if format != FORMAT {
        return Err(format!("format {format:?}, this build reads {FORMAT:?}"));
    }
    if hex::encode(Sha256::digest(payload)) != hash {
        return Err("payload does not match its sha256 (corrupt or cut short)".to_string());
    }
    let entry: CachedEngine =
        serde_json::from_slice(payload).map_err(|e| format!("payload does not parse: {e}"))?;
    if entry.tokenizer_sha256 != tokenizer_sha256 {
        return Err(format!(
            "entry is for tokenizer sha256 {}, not {tokenizer_sha256}",
            entry.tokenizer_sha256
        ));
    }
    if entry.built_by != built_by() {
        return Err(format!(
            "written by {}, this is {}",
            entry.built_by,
            built_by()
        ));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `tokenizers` version an entry records is the one this build links.
    #[test]
    fn tokenizers_version_is_the_locked_one() {
        let lock = include_str!("../../../Cargo.lock");
        let locked = lock
            .split("[[package]]")
            .find(|p| p.contains("\nname = \"tokenizers\"\n"))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .expect("tokenizers in Cargo.lock");
        assert_eq!(locked.trim_matches('"'), TOKENIZERS_VERSION);
    }
}
