//! What a part leaves in `OUT.lanes/` beside its lanes, for `dsprep pack --status` and the
//! finish: `part-IIIII-of-PPPPP.done` once every lane of part I of P is complete, or
//! `part-IIIII-of-PPPPP.failed` with its error. A part clears both when it starts, so a record
//! is its last run's. They let the status read one small file per part instead of every lane's
//! files: O(parts) metadata operations. A part killed outright (a time limit, `scancel`) writes
//! nothing; the status sees its lane's partial directory, locked by no one.

use crate::files::write_atomic;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A record's content: the recipe it was made for, and a failure's error.
#[derive(Debug, Serialize, Deserialize)]
pub struct PartRecord {
    pub recipe_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a part's last run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Done,
    Failed,
}

impl Ended {
    fn suffix(self) -> &'static str {
        match self {
            Ended::Done => "done",
            Ended::Failed => "failed",
        }
    }
}

/// The record's file name of part `part` of `parts`.
pub fn name(part: u32, parts: u32, ended: Ended) -> String {
    format!("part-{part:05}-of-{parts:05}.{}", ended.suffix())
}

pub fn path(dir: &Path, part: u32, parts: u32, ended: Ended) -> PathBuf {
    dir.join(name(part, parts, ended))
}

/// Clear part `part`'s records as it starts.
pub fn clear(dir: &Path, part: u32, parts: u32) -> anyhow::Result<()> {
    for ended in [Ended::Done, Ended::Failed] {
        let path = path(dir, part, parts, ended);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
        }
    }
    Ok(())
}

/// Record how part `part` ended (a failure with its error).
pub fn write(
    dir: &Path,
    part: u32,
    parts: u32,
    recipe_hash: &str,
    error: Option<&anyhow::Error>,
) -> anyhow::Result<PathBuf> {
    let ended = match error {
        Some(_) => Ended::Failed,
        None => Ended::Done,
    };
    let record = PartRecord {
        recipe_hash: recipe_hash.to_string(),
        // One line: the status prints it after the part's number.
        error: error.map(|e| format!("{e:#}").replace('\n', "; ")),
    };
    let path = path(dir, part, parts, ended);
    let json = serde_json::to_vec(&record).context("cannot encode a part record")?;
    write_atomic(&path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Read the record at `path`.
pub fn read(path: &Path) -> anyhow::Result<PartRecord> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a part record", path.display()))
}
