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
    /// The lineage segment whose recipe made the state (`lineage.json`), and the step it
    /// starts at; 0 in checkpoints written before lineages.
    #[serde(default)]
    pub segment: usize,
    #[serde(default)]
    pub segment_step: u64,
    /// Documents the stream had emitted (where in a lineage the state is). Older checkpoints
    /// lack it.
    #[serde(default)]
    pub documents: Option<u64>,
}

/// What this run is: checked against every checkpoint before it is used. Over a lineage, each
/// segment has its recipe, global batch and shard lists; a checkpoint names its segment.
#[derive(Clone, Debug)]
pub struct RunIdentity {
    pub lineage: dsprep_mixers::lineage::Lineage,
    /// Per segment, per source, its shards in reading order.
    pub shards: Vec<Vec<Vec<String>>>,
    /// This run's layout.
    pub world_size: u32,
    pub micro_batch: u32,
}

impl RunIdentity {
    /// The header of a checkpoint of segment `segment` after `windows` windows and `documents`
    /// documents.
    pub fn meta(
        &self,
        segment: usize,
        windows: u64,
        documents: u64,
        chain: dsprep_client::chain::Hash,
    ) -> CheckpointMeta {
        let s = &self.lineage.segments[segment];
        CheckpointMeta {
            created_by: format!("dsprep {}", env!("CARGO_PKG_VERSION")),
            recipe_hash: s.recipe_hash.clone(),
            windows,
            global_batch: s.global_batch,
            step: self.lineage.step_at_window(windows),
            world_size: self.world_size,
            micro_batch: self.micro_batch,
            shards: self.shards[segment].clone(),
            chain: Some(dsprep_client::chain::to_hex(&chain)),
            segment,
            segment_step: s.from_step,
            documents: Some(documents),
        }
    }

    /// Why this run cannot continue from `meta`, if it cannot.
    pub fn mismatch(&self, meta: &CheckpointMeta) -> Option<String> {
        let segments = &self.lineage.segments;
        let Some(s) = segments.get(meta.segment) else {
            return Some(format!(
                "it was written in segment {} of the lineage, which has {}",
                meta.segment,
                segments.len()
            ));
        };
        if let Some(why) = recipe_mismatch(&meta.recipe_hash, &s.recipe_hash) {
            return Some(why);
        }
        if meta.global_batch != s.global_batch {
            let layout = self.world_size as u64 * self.micro_batch as u64;
            return Some(format!(
                "its global batch is {} windows (world size {} × micro batch {}), this run's is \
                 {layout} ({} × {}): steps would cover other windows; keep world size × micro \
                 batch = {}, or change course with --recipe (docs/serving.md)",
                meta.global_batch,
                meta.world_size,
                meta.micro_batch,
                self.world_size,
                self.micro_batch,
                meta.global_batch
            ));
        }
        if meta.segment_step != s.from_step {
            return Some(format!(
                "it belongs to a branch of the lineage that a change of course replaced (its \
                 segment began at step {}, the lineage's at {})",
                meta.segment_step, s.from_step
            ));
        }
        if let Some(next) = segments.get(meta.segment + 1) {
            match meta.documents {
                Some(documents) if documents <= next.from_documents => {}
                _ => {
                    return Some(format!(
                        "it lies past the change of course at step {} (document {})",
                        next.from_step, next.from_documents
                    ));
                }
            }
        }
        shards_mismatch(&meta.shards, &self.shards[meta.segment])
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
