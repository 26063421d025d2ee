//! Checkpoint files: the pipeline's state (`dsprep_mixers::checkpoint`) with what this run must
//! match to continue from it (recipe hash, global batch, the shard lists), written atomically
//! into a state directory as `step-<step>.ckpt`, the last K kept.
//!
//! A checkpoint taken after window `W` serves every step from `ceil(W / global_batch)`: the
//! windows in between are recomputed and dropped on resume. A torn or corrupt file fails its
//! checksum and the previous one is used, with a warning.

use crate::files::{sync_dir, write_atomic};
use anyhow::{Context, bail};
use dsprep_mixers::checkpoint::{self, PipelineState};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
        if meta.recipe_hash != self.recipe_hash {
            return Some(format!(
                "it was written for recipe {}, this recipe is {}: the recipe (or a default it \
                 fills in) has changed",
                meta.recipe_hash, self.recipe_hash
            ));
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
        if meta.shards.len() != self.shards.len() {
            return Some(format!(
                "it has {} sources, the recipe {}",
                meta.shards.len(),
                self.shards.len()
            ));
        }
        for (source, (had, has)) in meta.shards.iter().zip(&self.shards).enumerate() {
            if had != has {
                let first = had
                    .iter()
                    .zip(has)
                    .position(|(a, b)| a != b)
                    .unwrap_or(had.len().min(has.len()));
                return Some(format!(
                    "source {source}'s shards differ from the checkpoint's (it listed {} shards, \
                     now {}; first difference at position {first}: {:?} vs {:?})",
                    had.len(),
                    has.len(),
                    had.get(first),
                    has.get(first)
                ));
            }
        }
        None
    }
}

/// A checkpoint read back and checked.
pub struct Loaded {
    pub path: PathBuf,
    pub meta: CheckpointMeta,
    pub state: PipelineState,
}

/// The state directory.
pub struct CheckpointDir {
    dir: PathBuf,
    keep: usize,
}

impl CheckpointDir {
    /// Open (and create) `dir`, keeping the last `keep` checkpoints.
    pub fn open(dir: &Path, keep: usize) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            keep: keep.max(1),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file_for(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:012}.ckpt"))
    }

    /// The checkpoint files, by step, oldest first.
    pub fn list(&self) -> anyhow::Result<Vec<(u64, PathBuf)>> {
        let entries = std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot list {}", self.dir.display()))?;
        let mut found = Vec::new();
        for entry in entries {
            let path = entry?.path();
            let step = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("step-")?.strip_suffix(".ckpt")?.parse().ok());
            if let Some(step) = step {
                found.push((step, path));
            }
        }
        found.sort();
        Ok(found)
    }

    /// Write a checkpoint (atomically), then drop all but the last `keep`. Returns its path.
    pub fn write(&self, meta: &CheckpointMeta, state: &PipelineState) -> anyhow::Result<PathBuf> {
        let path = self.file_for(meta.step);
        let bytes = checkpoint::encode(meta, state);
        write_atomic(&path, &bytes)
            .with_context(|| format!("cannot write checkpoint {}", path.display()))?;
        // The checkpoint is in place: failing to drop an old one only costs disk space.
        if let Err(e) = self.prune() {
            tracing::warn!("old checkpoints in {} stay: {e:#}", self.dir.display());
        }
        Ok(path)
    }

    /// Remove all but the last `keep` checkpoints.
    fn prune(&self) -> anyhow::Result<()> {
        let all = self.list()?;
        if all.len() > self.keep {
            for (_, old) in &all[..all.len() - self.keep] {
                std::fs::remove_file(old)
                    .with_context(|| format!("cannot remove old checkpoint {}", old.display()))?;
            }
            sync_dir(&self.dir);
        }
        Ok(())
    }

    /// Read and check one checkpoint file.
    pub fn read(path: &Path) -> anyhow::Result<(CheckpointMeta, PipelineState)> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        checkpoint::decode(&bytes).with_context(|| format!("checkpoint {}", path.display()))
    }

    /// The newest usable checkpoint that serves `step` (its step ≤ `step`), or `None` when the
    /// stream must start from its beginning. Corrupt files are skipped with a warning; a sound
    /// checkpoint that does not belong to this run is an error that says what differs.
    pub fn newest_for(&self, step: u64, run: &RunIdentity) -> anyhow::Result<Option<Loaded>> {
        for (at, path) in self.list()?.into_iter().rev() {
            if at > step {
                continue;
            }
            match Self::read(&path) {
                Ok((meta, state)) => {
                    if let Some(why) = run.mismatch(&meta) {
                        bail!("cannot resume from checkpoint {}: {why}", path.display());
                    }
                    return Ok(Some(Loaded { path, meta, state }));
                }
                Err(e) => {
                    tracing::warn!("CHECKPOINT UNUSABLE, falling back to an older one: {e:#}")
                }
            }
        }
        Ok(None)
    }

    /// Refuse a run that does not match the newest sound checkpoint, before anything starts.
    pub fn check_newest(&self, run: &RunIdentity) -> anyhow::Result<()> {
        self.newest_for(u64::MAX, run).map(drop)
    }
}
