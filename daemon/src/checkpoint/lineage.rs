//! The state directory's `lineage.json`: the stream's lineage
//! ([`dsprep_mixers::lineage::Lineage`]), written atomically from a daemon's first start (before
//! any checkpoint) and at every change of course, with the sha256 of its content beside it, so
//! that a torn file or one edited by hand is refused by name, never trusted.
//!
//! ```json
//! {"sha256": "<hex of the lineage's JSON>", "lineage": { "format": 1, "segments": [ … ] }}
//! ```

use crate::files::{sync_dir, write_atomic};
use anyhow::{Context, bail};
use dsprep_mixers::lineage::{LINEAGE_FORMAT, LINEAGE_FORMAT_PLAIN, Lineage};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The lineage's file name in a state directory.
pub const LINEAGE_FILE: &str = "lineage.json";

#[derive(Serialize, Deserialize)]
struct LineageFile {
    sha256: String,
    lineage: serde_json::Value,
}

/// Where a state directory keeps its lineage.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(LINEAGE_FILE)
}

/// The identity of a lineage: the sha256 of its JSON (what a pack of it records).
pub fn hash(lineage: &Lineage) -> String {
    hex::encode(Sha256::digest(body(lineage)))
}

fn body(lineage: &Lineage) -> Vec<u8> {
    serde_json::to_vec(lineage).expect("a lineage always serializes")
}

/// Write `lineage` to `path` atomically (a temporary file, fsync, rename, fsync of the folder).
pub fn write(path: &Path, lineage: &Lineage) -> anyhow::Result<()> {
    // Format 2 only once it holds decisions: a lineage without them stays readable by older
    // dsprep.
    let lineage = &Lineage {
        format: lineage.needed_format(),
        ..lineage.clone()
    };
    let file = LineageFile {
        sha256: hash(lineage),
        lineage: serde_json::from_slice(&body(lineage)).expect("its own JSON reads back"),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).expect("a lineage file always serializes");
    bytes.push(b'\n');
    write_atomic(path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    Ok(())
}

/// Read a lineage file (or a state directory's), checked: `None` when there is none.
pub fn read(path: &Path) -> anyhow::Result<Option<Lineage>> {
    let path = if path.is_dir() {
        path_in(path)
    } else {
        path.to_path_buf()
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let refuse = |why: String| -> anyhow::Error {
        anyhow::anyhow!(
            "lineage {} is not usable: {why}; it is never trusted so (restore it from a backup, \
             or start a new stream with an empty --state-dir)",
            path.display()
        )
    };
    let file: LineageFile = serde_json::from_slice(&bytes)
        .map_err(|e| refuse(format!("not a lineage file ({e}): torn, or edited by hand")))?;
    let lineage: Lineage = serde_json::from_value(file.lineage)
        .map_err(|e| refuse(format!("its lineage does not read ({e})")))?;
    if !(LINEAGE_FORMAT_PLAIN..=LINEAGE_FORMAT).contains(&lineage.format) {
        return Err(refuse(format!(
            "format {} (this dsprep reads formats {LINEAGE_FORMAT_PLAIN} to {LINEAGE_FORMAT})",
            lineage.format
        )));
    }
    if hash(&lineage) != file.sha256 {
        return Err(refuse(
            "its content does not match its sha256: it was edited by hand or torn".into(),
        ));
    }
    check(&lineage).map_err(refuse)?;
    Ok(Some(lineage))
}

/// What every lineage holds: a first segment at step 0, segments in increasing order, each
/// recipe's hash its own.
fn check(lineage: &Lineage) -> Result<(), String> {
    let Some(first) = lineage.segments.first() else {
        return Err("it has no segment".into());
    };
    if (first.from_step, first.from_window, first.from_documents) != (0, 0, 0) {
        return Err("its first segment does not start at step 0".into());
    }
    for (k, pair) in lineage.segments.windows(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let expected = (b.from_step.checked_sub(a.from_step))
            .and_then(|steps| steps.checked_mul(a.global_batch))
            .and_then(|windows| windows.checked_add(a.from_window));
        if b.from_step <= a.from_step || Some(b.from_window) != expected {
            return Err(format!(
                "segment {} starts at step {} window {}, which does not follow segment {k} \
                 (step {}, {} windows a step)",
                k + 1,
                b.from_step,
                b.from_window,
                a.from_step,
                a.global_batch
            ));
        }
        if b.from_documents < a.from_documents {
            return Err(format!("segment {} starts before segment {k}", k + 1));
        }
    }
    for (k, s) in lineage.segments.iter().enumerate() {
        if s.recipe.hash() != s.recipe_hash {
            return Err(format!(
                "segment {k}'s recipe does not hash to its recipe_hash {}",
                s.recipe_hash
            ));
        }
        if s.global_batch == 0
            || s.global_batch != u64::from(s.world_size) * u64::from(s.micro_batch)
        {
            return Err(format!(
                "segment {k}'s global batch is not world size × micro batch"
            ));
        }
    }
    Ok(())
}

/// Refuse a state directory's lineage that is not the one this run continues, naming both.
pub fn refuse_other_stream(path: &Path, lineage: &Lineage, first_hash: &str) -> anyhow::Result<()> {
    if lineage.segments[0].recipe_hash != first_hash {
        bail!(
            "lineage {} belongs to another stream: its first recipe is {}, not {first_hash}",
            path.display(),
            lineage.segments[0].recipe_hash
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsprep_mixers::test_fixtures::lineage;

    #[test]
    fn a_lineage_round_trips_and_a_changed_byte_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert!(read(dir.path()).unwrap().is_none());
        write(&path, &lineage()).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(lineage()));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("\"from_documents\": 31", "\"from_documents\": 32"),
        )
        .unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "lineage {} is not usable: its content",
                path.display()
            )),
            "{err}"
        );
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("torn, or edited by hand"), "{err}");
    }

    #[test]
    fn segments_that_do_not_follow_each_other_are_refused() {
        let mut bad = lineage();
        bad.segments[1].from_window = 41;
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        write(&path, &bad).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(
            err.contains("segment 1 starts at step 5 window 41, which does not follow segment 0"),
            "{err}"
        );
    }
}
