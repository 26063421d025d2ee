//! Checkpoints of single lanes, for node daemons serving a recipe with `[lanes]`: each lane's
//! pipeline state at a count of the lane's own windows, in
//! `lanes-<stream id>/lane-NNNNN/w-<windows>.ckpt` on the shared state directory, written by the
//! node that runs the lane ([`super::CheckpointStore`]'s policy: atomic, the newest K kept).
//!
//! A lane's checkpoint does not depend on the node count, the world size or the global batch, so
//! any node that runs the lane later (the same node restarted, or another node count) resumes it.

use super::step::recipe_mismatch;
use super::{CheckpointStore, Header, Loaded};
use dsprep_mixers::checkpoint::PipelineState;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneMeta {
    created_by: String,
    recipe_hash: String,
    lane: u32,
    /// The lane's windows emitted when the state was taken.
    windows: u64,
}

impl Header for LaneMeta {
    const PREFIX: &'static str = "w-";
    const DIGITS: usize = 16;
    fn position(&self) -> u64 {
        self.windows
    }
}

/// The lanes' checkpoints under one stream's folder.
pub struct LaneCheckpoints {
    dir: PathBuf,
    recipe_hash: String,
    keep: usize,
}

impl LaneCheckpoints {
    /// Checkpoints under `stream_dir` (the lanes' `lanes-<stream id>` directory).
    pub fn new(stream_dir: &Path, recipe_hash: String, keep: usize) -> Self {
        Self {
            dir: stream_dir.to_path_buf(),
            recipe_hash,
            keep,
        }
    }

    /// Lane `lane`'s checkpoint directory (created).
    fn store(&self, lane: u32) -> anyhow::Result<CheckpointStore<LaneMeta>> {
        CheckpointStore::open(&self.dir.join(format!("lane-{lane:05}")), self.keep)
    }

    /// Write lane `lane`'s state after `windows` of its windows; keep the newest K.
    pub fn write(&self, lane: u32, windows: u64, state: &PipelineState) -> anyhow::Result<PathBuf> {
        let meta = LaneMeta {
            created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
            recipe_hash: self.recipe_hash.clone(),
            lane,
            windows,
        };
        self.store(lane)?.write(&meta, state)
    }

    /// The newest sound checkpoint of `lane` at or below `windows`; a corrupt one is skipped
    /// with a warning, one of another lane or recipe is an error.
    pub fn newest_at_or_below(
        &self,
        lane: u32,
        windows: u64,
    ) -> anyhow::Result<Option<Loaded<LaneMeta>>> {
        self.store(lane)?.newest_at_or_below(windows, |meta| {
            if meta.lane != lane {
                Some(format!("it is lane {}'s, not lane {lane}'s", meta.lane))
            } else {
                recipe_mismatch(&meta.recipe_hash, &self.recipe_hash)
            }
        })
    }
}
