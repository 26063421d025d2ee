//! Checkpoints of single lanes, for node daemons serving a recipe with `[lanes]`: each lane's
//! pipeline state (`dsprep_mixers::checkpoint`, the same bytes as the daemon's and `pack`'s) at
//! a count of the lane's own windows, in `lanes-<stream id>/lane-NNNNN/w-<windows>.ckpt` on the
//! shared state directory, written atomically by the node that runs the lane, the last K kept.
//!
//! A lane's checkpoint does not depend on the node count, the world size or the global batch, so
//! any node that runs the lane later (the same node restarted, or another node count) resumes it.

use crate::files::write_atomic;
use anyhow::Context;
use dsprep_mixers::checkpoint::{self, PipelineState};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct LaneMeta {
    created_by: String,
    recipe_hash: String,
    lane: u32,
    /// The lane's windows emitted when the state was taken.
    windows: u64,
}

pub struct LaneCheckpoints {
    dir: PathBuf,
    recipe_hash: String,
    keep: usize,
}

/// A lane checkpoint read back.
pub struct LaneResume {
    pub windows: u64,
    pub state: PipelineState,
    pub path: PathBuf,
}

impl LaneCheckpoints {
    /// Checkpoints under `stream_dir` (the lanes' `lanes-<stream id>` directory).
    pub fn new(stream_dir: &Path, recipe_hash: String, keep: usize) -> Self {
        Self {
            dir: stream_dir.to_path_buf(),
            recipe_hash,
            keep: keep.max(1),
        }
    }

    fn lane_dir(&self, lane: u32) -> PathBuf {
        self.dir.join(format!("lane-{lane:05}"))
    }

    /// Write lane `lane`'s state after `windows` of its windows; keep the newest K.
    pub fn write(&self, lane: u32, windows: u64, state: &PipelineState) -> anyhow::Result<PathBuf> {
        let dir = self.lane_dir(lane);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let meta = LaneMeta {
            created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
            recipe_hash: self.recipe_hash.clone(),
            lane,
            windows,
        };
        let path = dir.join(format!("w-{windows:016}.ckpt"));
        write_atomic(&path, &checkpoint::encode(&meta, state))
            .with_context(|| format!("cannot write lane checkpoint {}", path.display()))?;
        let listed = self.list(lane);
        for (_, old) in listed.iter().take(listed.len().saturating_sub(self.keep)) {
            let _ = std::fs::remove_file(old);
        }
        Ok(path)
    }

    /// Lane `lane`'s checkpoints, oldest first.
    fn list(&self, lane: u32) -> Vec<(u64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(self.lane_dir(lane)) else {
            return Vec::new();
        };
        let mut found: Vec<(u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let windows = name
                    .strip_prefix("w-")?
                    .strip_suffix(".ckpt")?
                    .parse()
                    .ok()?;
                Some((windows, e.path()))
            })
            .collect();
        found.sort();
        found
    }

    /// The newest sound checkpoint of `lane` at or below `windows`; a corrupt or foreign one is
    /// skipped with a warning.
    pub fn newest_at_or_below(&self, lane: u32, windows: u64) -> Option<LaneResume> {
        for (at, path) in self.list(lane).into_iter().rev() {
            if at > windows {
                continue;
            }
            let decoded = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| checkpoint::decode::<LaneMeta>(&b).map_err(|e| e.to_string()));
            match decoded {
                Ok((meta, state))
                    if meta.lane == lane
                        && meta.windows == at
                        && meta.recipe_hash == self.recipe_hash =>
                {
                    return Some(LaneResume {
                        windows: at,
                        state,
                        path,
                    });
                }
                Ok(_) => tracing::warn!(
                    "skipping lane checkpoint {}: it belongs to another lane or recipe",
                    path.display()
                ),
                Err(e) => tracing::warn!(
                    "skipping lane checkpoint {}: {e}; trying an older one",
                    path.display()
                ),
            }
        }
        None
    }
}
