//! Checkpoints of single lanes, for node daemons serving a recipe with `[lanes]`: each lane's
//! pipeline state at a count of the lane's own windows, in
//! `lanes-<stream id>/lane-NNNNN/w-<windows>.ckpt` on the shared state directory, written by the
//! node that runs the lane ([`super::CheckpointStore`]'s policy: atomic, the newest K kept).
//!
//! A lane's checkpoint does not depend on the node count, the world size or the global batch, so
//! any node that runs the lane later (the same node restarted, or another node count) resumes it.
//! It names the segment of the stream's lineage it was taken in (its recipe, and
//! [`dsprep_mixers::lineage::Lineage::prefix_key`]), so a lineage takes only checkpoints of its
//! own branch and segment; those of another (a replaced branch, a recipe past a change) are
//! passed over.

use super::{CheckpointStore, Header, Loaded};
use dsprep_mixers::checkpoint::PipelineState;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneMeta {
    created_by: String,
    pub recipe_hash: String,
    /// The lineage's segments up to this one ([`Lineage::prefix_key`]; empty: the first).
    ///
    /// [`Lineage::prefix_key`]: dsprep_mixers::lineage::Lineage::prefix_key
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lineage: String,
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
    keep: usize,
}

/// The segment of the lineage a state was taken in: its recipe hash and prefix key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentTag {
    pub recipe_hash: String,
    pub lineage: String,
}

impl LaneCheckpoints {
    /// Checkpoints under `stream_dir` (the lanes' `lanes-<stream id>` directory).
    pub fn new(stream_dir: &Path, keep: usize) -> Self {
        Self {
            dir: stream_dir.to_path_buf(),
            keep,
        }
    }

    /// Lane `lane`'s checkpoint directory (created).
    fn store(&self, lane: u32) -> anyhow::Result<CheckpointStore<LaneMeta>> {
        CheckpointStore::open(&self.dir.join(format!("lane-{lane:05}")), self.keep)
    }

    /// Write lane `lane`'s state after `windows` of its windows; keep the newest K.
    pub fn write(
        &self,
        lane: u32,
        windows: u64,
        state: &PipelineState,
        tag: &SegmentTag,
    ) -> anyhow::Result<PathBuf> {
        let meta = LaneMeta {
            created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
            recipe_hash: tag.recipe_hash.clone(),
            lineage: tag.lineage.clone(),
            lane,
            windows,
        };
        self.store(lane)?.write(&meta, state)
    }

    /// The newest sound checkpoint of `lane` at or below `windows` that `ours` takes (one of
    /// this lineage's segments, see [`crate::serve`]'s node course); a corrupt one is skipped
    /// with a warning, one of another lane is an error, one of another segment or branch is
    /// passed over.
    pub fn newest_at_or_below(
        &self,
        lane: u32,
        windows: u64,
        ours: impl Fn(&LaneMeta, &PipelineState) -> bool,
    ) -> anyhow::Result<Option<Loaded<LaneMeta>>> {
        let store = self.store(lane)?;
        for (at, path) in store.list()?.into_iter().rev() {
            if at > windows {
                continue;
            }
            let (meta, state) = match CheckpointStore::<LaneMeta>::read(&path) {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!("CHECKPOINT UNUSABLE, falling back to an older one: {e:#}");
                    continue;
                }
            };
            if meta.lane != lane || meta.windows != at {
                anyhow::bail!(
                    "cannot resume from checkpoint {}: it is lane {}'s at window {}, not lane \
                     {lane}'s at window {at}",
                    path.display(),
                    meta.lane,
                    meta.windows
                );
            }
            if !ours(&meta, &state) {
                tracing::info!(
                    "lane {lane}: {} is of another segment or branch of the lineage (recipe {}), \
                     passed over",
                    path.display(),
                    meta.recipe_hash
                );
                continue;
            }
            return Ok(Some(Loaded { path, meta, state }));
        }
        Ok(None)
    }
}
