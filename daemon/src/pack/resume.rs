//! Checkpoints of `dsprep pack`: the same checkpoint format as the daemon's (the pipeline state
//! from `dsprep_mixers::checkpoint`), with the packer's output progress as metadata, kept as
//! `checkpoint.ckpt` in the partial output directory. A pack that is killed continues from it on
//! the next run with the same recipe and output, and writes the same bytes as an uninterrupted one.

use super::output::{CHECKPOINT_FILE, WriterProgress};
use crate::files::write_atomic;
use anyhow::Context;
use dsprep_client::format::Dtype;
use dsprep_mixers::checkpoint::{self, PipelineState};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a pack must match to continue, and how far its output had come.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackCheckpoint {
    pub created_by: String,
    /// The recipe's hash, or `lineage <hash>` for a pack of a lineage (`--lineage`).
    pub recipe_hash: String,
    /// The lineage segment whose recipe made the state (0 without a lineage), and each
    /// segment's count so far (`--lineage`).
    #[serde(default)]
    pub segment: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<super::lineage::SegmentCounts>,
    /// Per source, its shards in reading order.
    pub shards: Vec<Vec<String>>,
    pub window_tokens: u64,
    pub dtype: Dtype,
    pub windows_per_shard: u64,
    pub writer: WriterProgress,
    pub docs_per_source: Vec<u64>,
    pub tokens_per_source: Vec<u64>,
    /// A lineage's: the counters of the `best_fit` packings a `concat` one followed, summed
    /// (the packer in force counts its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing_done: Option<dsprep_mixers::packer::PackingCounters>,
}

impl PackCheckpoint {
    /// Why a pack described by `now` cannot continue from `self`, if it cannot.
    pub fn mismatch(&self, now: &PackCheckpoint) -> Option<String> {
        if self.recipe_hash != now.recipe_hash {
            return Some(format!(
                "it packs recipe {}, this recipe is {}",
                self.recipe_hash, now.recipe_hash
            ));
        }
        if self.writer.chain.is_none() {
            return Some("an older dsprep wrote it, without the stream chain".into());
        }
        if self.writer.ledger.is_none() {
            return Some("an older dsprep wrote it, without the phase ledger".into());
        }
        if self.shards != now.shards {
            return Some("the sources' shard lists have changed".into());
        }
        if (self.window_tokens, self.dtype, self.windows_per_shard)
            != (now.window_tokens, now.dtype, now.windows_per_shard)
        {
            return Some(format!(
                "its layout ({} tokens per window, {:?}, {} windows per shard) differs from this \
                 run's ({}, {:?}, {}): --shard-mib or the tokenizer changed",
                self.window_tokens,
                self.dtype,
                self.windows_per_shard,
                now.window_tokens,
                now.dtype,
                now.windows_per_shard
            ));
        }
        None
    }
}

/// Write the checkpoint into the partial directory (atomically).
pub fn write(partial: &Path, meta: &PackCheckpoint, state: &PipelineState) -> anyhow::Result<()> {
    let path = partial.join(CHECKPOINT_FILE);
    write_atomic(&path, &checkpoint::encode(meta, state))
        .with_context(|| format!("cannot write checkpoint {}", path.display()))
}

/// The interrupted pack in `partial` this run can continue, if any. A checkpoint that is corrupt
/// or belongs to another recipe or layout is reported and ignored: the pack starts over.
pub fn load(partial: &Path, now: &PackCheckpoint) -> Option<(PackCheckpoint, PipelineState)> {
    let path = partial.join(CHECKPOINT_FILE);
    let bytes = std::fs::read(&path).ok()?;
    match checkpoint::decode::<PackCheckpoint>(&bytes) {
        Ok((meta, state)) => match meta.mismatch(now) {
            None => Some((meta, state)),
            Some(why) => {
                tracing::warn!(
                    "not continuing the interrupted pack in {}: {why}; starting over",
                    partial.display()
                );
                None
            }
        },
        Err(e) => {
            tracing::warn!(
                "not continuing the interrupted pack in {}: checkpoint {}: {e}; starting over",
                partial.display(),
                path.display()
            );
            None
        }
    }
}
