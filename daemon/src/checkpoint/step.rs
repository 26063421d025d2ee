//! The daemon's checkpoints: the pipeline's state with what this run must match to continue
//! from it (recipe hash, global batch, the shard lists), as `step-<step>.ckpt` in the state
//! directory ([`super::CheckpointStore`]'s policy: atomic, the newest K kept).
//!
//! A checkpoint taken after window `W` serves every step from `ceil(W / global_batch)`: the
//! windows in between are recomputed and dropped on resume. A torn or corrupt file fails its
//! checksum and the previous one is used, with a warning.

use super::{CheckpointStore, Header, Loaded};
use serde::{Deserialize, Serialize};

/// What a run must match to continue from a checkpoint, and where in the stream it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub created_by: String,
    pub recipe_hash: String,
    /// Windows emitted when the state was taken.
    pub windows: u64,
    /// Windows per global step (world size × micro batch).
    pub global_batch: u64,
    /// The first step served from this checkpoint: `ceil(windows / global_batch)`.
    pub step: u64,
    /// The layout of the run that wrote it (informative: resume may use another world size).
    pub world_size: u32,
    pub micro_batch: u32,
    /// Per source, its shards in reading order (paths, or `hf://` locations at a commit).
    pub shards: Vec<Vec<String>>,
    /// The stream chain after `windows` windows (hex; `dsprep_client::chain`). Older
    /// checkpoints lack it: a daemon then recomputes the stream from its start.
    #[serde(default)]
    pub chain: Option<String>,
}

/// What this run is: checked against every checkpoint before it is used.
#[derive(Clone, Debug)]
pub struct RunIdentity {
    pub recipe_hash: String,
    pub global_batch: u64,
    pub world_size: u32,
    pub micro_batch: u32,
    pub shards: Vec<Vec<String>>,
}

impl RunIdentity {
    pub fn meta(&self, windows: u64, chain: dsprep_client::chain::Hash) -> CheckpointMeta {
        CheckpointMeta {
            created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
            recipe_hash: self.recipe_hash.clone(),
            windows,
            global_batch: self.global_batch,
            step: windows.div_ceil(self.global_batch),
            world_size: self.world_size,
            micro_batch: self.micro_batch,
            shards: self.shards.clone(),
            chain: Some(dsprep_client::chain::to_hex(&chain)),
        }
    }

    /// Why this run cannot continue from `meta`, if it cannot.
    pub fn mismatch(&self, meta: &CheckpointMeta) -> Option<String> {
        if let Some(why) = recipe_mismatch(&meta.recipe_hash, &self.recipe_hash) {
            return Some(why);
        }
        if meta.global_batch != self.global_batch {
            return Some(format!(
                "its global batch is {} windows (world size {} × micro batch {}), this run's is \
                 {} ({} × {}): steps would cover other windows; keep world size × micro batch = {}",
                meta.global_batch,
                meta.world_size,
                meta.micro_batch,
                self.global_batch,
                self.world_size,
                self.micro_batch,
                meta.global_batch
            ));
        }
        shards_mismatch(&meta.shards, &self.shards)
    }
}

/// Why a checkpoint of recipe `had` does not belong to a run of recipe `has`, if it does not
/// (every kind of checkpoint says it this way).
pub fn recipe_mismatch(had: &str, has: &str) -> Option<String> {
    (had != has).then(|| {
        format!(
            "it was written for recipe {had}, this recipe is {has}: the recipe (or a default it \
             fills in) has changed"
        )
    })
}

/// Why a checkpoint that read the shards `had` (per source, in reading order) cannot continue a
/// run that reads `has`, if it cannot.
pub fn shards_mismatch(had: &[Vec<String>], has: &[Vec<String>]) -> Option<String> {
    if had.len() != has.len() {
        return Some(format!(
            "it has {} sources, the recipe {}",
            had.len(),
            has.len()
        ));
    }
    for (source, (had, has)) in had.iter().zip(has).enumerate() {
        if had != has {
            let first = had
                .iter()
                .zip(has)
                .position(|(a, b)| a != b)
                .unwrap_or(had.len().min(has.len()));
            return Some(format!(
                "source {source}'s shards differ from the checkpoint's (it listed {} shards, now \
                 {}; first difference at position {first}: {:?} vs {:?})",
                had.len(),
                has.len(),
                had.get(first),
                has.get(first)
            ));
        }
    }
    None
}

/// The daemon's state directory: `step-<step>.ckpt`, the step being the first it serves.
pub type CheckpointDir = CheckpointStore<CheckpointMeta>;

impl Header for CheckpointMeta {
    const PREFIX: &'static str = "step-";
    const DIGITS: usize = 12;
    fn position(&self) -> u64 {
        self.step
    }
}

impl CheckpointDir {
    /// The newest usable checkpoint that serves `step` (its step ≤ `step`), or `None` when the
    /// stream must start from its beginning (see [`CheckpointStore::newest_at_or_below`]).
    pub fn newest_for(
        &self,
        step: u64,
        run: &RunIdentity,
    ) -> anyhow::Result<Option<Loaded<CheckpointMeta>>> {
        self.newest_at_or_below(step, |meta| run.mismatch(meta))
    }

    /// Refuse a run that does not match the newest sound checkpoint, before anything starts.
    pub fn check_newest(&self, run: &RunIdentity) -> anyhow::Result<()> {
        self.newest_for(u64::MAX, run).map(drop)
    }
}
