//! The engine chosen for a `tokenizer.json`, and dsprep's own engine's tables, as bytes, so that
//! what a file teaches the stage (HF's parse of the file, which engine encodes it, the merge table
//! as ids, the pre-tokenizer and added-token settings) is worked out once per file on a machine,
//! not once per process. For HF `tokenizers` 1.x the entry is the choice and the head: 1.x reads
//! the file itself. The caller keeps the bytes (the
//! daemon in files: `daemon/src/tokenizer_cache.rs`); this module only writes and checks them.
//!
//! An entry is one header line, `dsprep-engine-cache/8 <sha256 of the payload>`, then the payload:
//! a head line (JSON: the tokenizer file's sha256, the build that wrote it, the vocabulary's
//! extent and added tokens), the engine's tables (JSON, one line: `"Hf1"` for HF 1.x, which has
//! none) and their two large tables as little-endian words (`packed_tables.rs`; two zero counts
//! for HF 1.x). Format 8 added HF 1.x's entries: an entry of format 7 held dsprep's tables for
//! files `Auto` now gives to 1.x, and is rebuilt like any entry of another format. It is used
//! only when the payload's hash matches, it names the same tokenizer file (sha256 of its bytes)
//! and it was written by the same build of the engine (this crate's version and the `tokenizers`
//! version its parse follows); anything else is ignored, with the reason ([`CacheError`]), and
//! the engine is built from the file as if there were no entry. A stale or foreign entry, or one of an older format, can cost a
//! rebuild, never an id.
//!
//! The head is all the stage needs to start (BOS/EOS, vocabulary size): the tables, most of the
//! entry, are parsed and built into the engine on a thread of their own while the run starts
//! (`engines/engine_slot.rs`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::packed_tables::{self, LargeTables};
use super::{CacheError, TablesError};
use crate::engines::byte_level::ByteLevelTables;
use crate::engines::sentencepiece::SentencePieceTables;
use crate::read::token_list::TokenList;

/// The first word of an entry; bump the number when the entry's layout changes.
pub(crate) const FORMAT: &str = "dsprep-engine-cache/8";

/// The `tokenizers` release whose parse the tables follow (a test checks it against Cargo.lock).
pub(crate) const TOKENIZERS_VERSION: &str = "0.23.2";

/// Where the caller keeps entries, by key: the sha256 (hex) of the tokenizer file they are for,
/// and `-own` after it for the entry of [`crate::EngineChoice::Own`] (the same file may run
/// another engine under `Auto`). A key is ASCII letters, digits and `-`: fit for a file name.
pub trait EngineCache {
    /// The entry under `key`, if one is kept (unchecked bytes).
    fn load(&self, key: &str) -> Option<Vec<u8>>;
    /// Keep `entry` under `key`. Failing to keep it is not an error for the caller.
    fn store(&self, key: &str, entry: &[u8]);
}

/// The key of the entry for the tokenizer file `sha256` under `choice`.
pub(crate) fn key(sha256: &str, choice: crate::EngineChoice) -> String {
    match choice {
        crate::EngineChoice::Own => format!("{sha256}-own"),
        _ => sha256.to_string(),
    }
}

/// What the engine is built from: dsprep's tables, or, for HF `tokenizers` 1.x, nothing but the
/// file itself (the entry then records the choice and the head).
#[derive(Serialize, Deserialize)]
pub(crate) enum EngineTables {
    ByteLevel(ByteLevelTables),
    SentencePiece(SentencePieceTables),
    Hf1,
}

impl EngineTables {
    /// The merges and the whole tokens, the tables an entry keeps as bytes; `None` for HF 1.x.
    pub(crate) fn large_tables(&self) -> Option<LargeTables<'_>> {
        match self {
            Self::ByteLevel(tables) => Some(tables.large_tables()),
            Self::SentencePiece(tables) => Some(tables.large_tables()),
            Self::Hf1 => None,
        }
    }

    /// The tables [`Self::large_tables`] gave, read back.
    fn set_large_tables(
        &mut self,
        merges: Vec<(u32, u32, u32)>,
        whole: TokenList,
    ) -> Result<(), TablesError> {
        match self {
            Self::ByteLevel(tables) => tables.set_large_tables(merges, whole),
            Self::SentencePiece(tables) => tables.set_large_tables(merges, whole),
            Self::Hf1 if merges.is_empty() && whole.len() == 0 => {}
            Self::Hf1 => return Err(TablesError::Hf1WithTables),
        }
        Ok(())
    }
}

/// An entry's head: what the stage needs of HF's tokenizer without parsing the file again.
#[derive(Serialize, Deserialize)]
pub(crate) struct CachedHead {
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
}

/// An entry checked and its head parsed; the tables are still bytes ([`parse_tables`]).
pub(crate) struct CheckedEntry {
    pub head: CachedHead,
    /// Where the tables' JSON starts in the entry's bytes.
    pub tables_at: usize,
}

/// This build of the engine, as an entry records it.
pub(crate) fn built_by() -> String {
    format!(
        "dsprep-tokenize {} / tokenizers {TOKENIZERS_VERSION} / tokenizers {}",
        env!("CARGO_PKG_VERSION"),
        crate::engines::hf1::VERSION
    )
}

/// What an entry keeps of HF's tokenizer for the file `sha256`, so that a stage starts without
/// parsing it. `extent` is the vocabulary's size and the first id without a token.
pub(crate) fn head_of(
    sha256: &str,
    hf: &tokenizers::Tokenizer,
    (vocab_size, dense_ids): (u32, u32),
) -> CachedHead {
    CachedHead {
        tokenizer_sha256: sha256.to_string(),
        built_by: built_by(),
        vocab_size,
        dense_ids,
        added: hf
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (token.content, id))
            .collect(),
    }
}

/// Keep in `cache`, under `key`, the entry of `head` and the engine's `tables`.
pub(crate) fn keep(
    cache: &(dyn EngineCache + Send + Sync),
    key: &str,
    head: &CachedHead,
    tables: &EngineTables,
) {
    if let Ok(bytes) = to_bytes(head, tables) {
        cache.store(key, &bytes);
    }
}

/// The entry's bytes.
pub(crate) fn to_bytes(head: &CachedHead, tables: &EngineTables) -> Result<Vec<u8>, TablesError> {
    // Compact JSON has no raw newline (one in a string is written `\n`): the head is one line.
    let mut payload = serde_json::to_vec(head).map_err(TablesError::Json)?;
    payload.push(b'\n');
    serde_json::to_writer(&mut payload, tables).map_err(TablesError::Json)?;
    payload.push(b'\n');
    packed_tables::write(tables.large_tables(), &mut payload)?;
    let mut bytes = format!("{FORMAT} {}\n", hex::encode(Sha256::digest(&payload))).into_bytes();
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// The entry in `bytes` if it is whole and is for this tokenizer file and this build; else why
/// it is ignored. The whole payload is checked against its hash here; only the head is parsed.
pub(crate) fn check(bytes: &[u8], tokenizer_sha256: &str) -> Result<CheckedEntry, CacheError> {
    let line_end = |from: usize| {
        bytes[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| from + i)
    };
    let header_end = line_end(0).ok_or(CacheError::NoHeader)?;
    let header =
        std::str::from_utf8(&bytes[..header_end]).map_err(|_| CacheError::HeaderNotUtf8)?;
    let (format, hash) = header.split_once(' ').ok_or(CacheError::NoPayloadHash)?;
    if format != FORMAT {
        return Err(CacheError::OtherFormat {
            found: format.to_string(),
        });
    }
    let payload_at = header_end + 1;
    if hex::encode(Sha256::digest(&bytes[payload_at..])) != hash {
        return Err(CacheError::Torn);
    }
    let head_end = line_end(payload_at).ok_or(CacheError::NoHead)?;
    let head: CachedHead =
        serde_json::from_slice(&bytes[payload_at..head_end]).map_err(CacheError::Head)?;
    if head.tokenizer_sha256 != tokenizer_sha256 {
        return Err(CacheError::OtherFile {
            entry: head.tokenizer_sha256,
            file: tokenizer_sha256.to_string(),
        });
    }
    if head.built_by != built_by() {
        return Err(CacheError::OtherBuild {
            written_by: head.built_by,
            this: built_by(),
        });
    }
    Ok(CheckedEntry {
        head,
        tables_at: head_end + 1,
    })
}

/// Whether the tables of a checked entry (`bytes[entry.tables_at..]`) are HF 1.x's, which hold
/// nothing but the choice.
pub(crate) fn is_hf1(tables: &[u8]) -> bool {
    tables.starts_with(b"\"Hf1\"\n")
}

/// The tables of a checked entry (`bytes[entry.tables_at..]`): their JSON line, then their large
/// tables' bytes.
pub(crate) fn parse_tables(tables: &[u8]) -> Result<EngineTables, CacheError> {
    let parse = || {
        let json_end = tables
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(TablesError::NoJsonLine)?;
        let mut parsed: EngineTables =
            serde_json::from_slice(&tables[..json_end]).map_err(TablesError::Json)?;
        let (merges, whole) = packed_tables::read(&tables[json_end + 1..])?;
        parsed.set_large_tables(merges, whole)?;
        Ok(parsed)
    };
    parse().map_err(CacheError::Tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `tokenizers` version an entry records is the one this build links.
    #[test]
    fn tokenizers_version_is_the_locked_one() {
        let lock = include_str!("../../../../Cargo.lock");
        let locked = lock
            .split("[[package]]")
            .find(|p| p.contains("\nname = \"tokenizers\"\n"))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .expect("tokenizers in Cargo.lock");
        assert_eq!(locked.trim_matches('"'), TOKENIZERS_VERSION);
    }

    /// HF 1.x's tables holding dsprep's large tables are refused: the entry is ignored.
    #[test]
    fn hf1_tables_with_large_tables_are_refused() {
        let hf = tokenizers::Tokenizer::from_file("../../config/tokenizers/gpt2/tokenizer.json")
            .expect("gpt2");
        let learnt = crate::engines::FastEngine::learn(&hf).expect("fast path");
        let mut bytes = b"\"Hf1\"\n".to_vec();
        packed_tables::write(learnt.large_tables(), &mut bytes).expect("writes");
        let refused = parse_tables(&bytes).map(|_| ()).expect_err("refused");
        assert!(matches!(
            refused,
            CacheError::Tables(TablesError::Hf1WithTables)
        ));
        assert_eq!(
            refused.to_string(),
            "tables do not parse: HF 1.x's entry holds tables"
        );
    }
}
