//! Checkpoint directories: one type, [`CheckpointStore`], writes, prunes and picks every kind of
//! checkpoint with one policy; only the file naming and the header differ ([`Header`]): a
//! daemon's `step-<step>.ckpt` (`step.rs`) and a lane's `w-<windows>.ckpt` (`lane.rs`). Every
//! file holds the pipeline's state (`dsprep_mixers::checkpoint`, the same bytes as `pack`'s).
//!
//! The policy:
//! - a checkpoint is written atomically (a temporary file, fsync, rename, fsync of the directory);
//!   a temporary file a killed process left is removed by the next write's prune;
//! - then all but the newest K are removed and the directory is fsynced again;
//! - the directory's checkpoints are its newest K files: a process killed between a rename and
//!   its prune leaves one more file, which is not listed (nor used) and goes at the next write;
//! - the checkpoint to continue from is the newest at or below a position; a corrupt or torn file
//!   is skipped with a warning (the next older one is tried); a sound file of another run is an
//!   error that names the file and says what differs.

pub mod lane;
pub mod lane_lineage;
pub mod lineage;
pub mod step;

pub use lane::LaneCheckpoints;
pub use step::{CheckpointDir, CheckpointMeta, RunIdentity};

use crate::files::{sync_dir, write_atomic};
use anyhow::{Context, bail};
use dsprep_mixers::checkpoint::{self, PipelineState};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// A kind of checkpoint: its header and how its files are named (`<PREFIX><position>.ckpt`,
/// the position zero-padded to `DIGITS`).
pub trait Header: Serialize + DeserializeOwned {
    const PREFIX: &'static str;
    const DIGITS: usize;
    /// Where in its stream the checkpoint was taken: the number in its file name.
    fn position(&self) -> u64;
}

/// A checkpoint read back and checked.
pub struct Loaded<M> {
    pub path: PathBuf,
    pub meta: M,
    pub state: PipelineState,
}

/// A directory of checkpoints of one kind, the newest `keep` kept.
pub struct CheckpointStore<M> {
    dir: PathBuf,
    keep: usize,
    header: PhantomData<fn() -> M>,
}

/// A store's files in its directory.
struct Scan {
    /// Every checkpoint file, by position, oldest first.
    checkpoints: Vec<(u64, PathBuf)>,
    /// The temporary files of writes a killed process left (`.NAME.ckpt.tmp`, never renamed
    /// into place).
    partial: Vec<PathBuf>,
}

impl<M: Header> CheckpointStore<M> {
    /// Open (and create) `dir`, keeping the newest `keep` checkpoints (at least one).
    pub fn open(dir: &Path, keep: usize) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            keep: keep.max(1),
            header: PhantomData,
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file_for(&self, position: u64) -> PathBuf {
        let digits = M::DIGITS;
        (self.dir).join(format!("{}{position:0digits$}.ckpt", M::PREFIX))
    }

    /// Every checkpoint file, by position, oldest first (a prune's leftovers included).
    fn list_all(&self) -> anyhow::Result<Vec<(u64, PathBuf)>> {
        Ok(self.scan()?.checkpoints)
    }

    /// What the directory holds of this store's.
    fn scan(&self) -> anyhow::Result<Scan> {
        let entries = std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot list {}", self.dir.display()))?;
        let (mut found, mut partial) = (Vec::new(), Vec::new());
        for entry in entries {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let position =
                (name.strip_prefix(M::PREFIX)).and_then(|n| n.strip_suffix(".ckpt")?.parse().ok());
            if let Some(position) = position {
                found.push((position, path));
            } else if (name.strip_prefix('.'))
                .and_then(|n| n.strip_suffix(".ckpt.tmp"))
                .is_some_and(|n| n.starts_with(M::PREFIX))
            {
                partial.push(path);
            }
        }
        found.sort();
        Ok(Scan {
            checkpoints: found,
            partial,
        })
    }

    /// The directory's checkpoints (its newest `keep` files), by position, oldest first.
    pub fn list(&self) -> anyhow::Result<Vec<(u64, PathBuf)>> {
        let mut all = self.list_all()?;
        let leftovers = all.len().saturating_sub(self.keep);
        all.drain(..leftovers);
        Ok(all)
    }

    /// Write a checkpoint (atomically), then drop all but the newest `keep`. Returns its path.
    pub fn write(&self, meta: &M, state: &PipelineState) -> anyhow::Result<PathBuf> {
        let path = self.file_for(meta.position());
        write_atomic(&path, &checkpoint::encode(meta, state))
            .with_context(|| format!("cannot write checkpoint {}", path.display()))?;
        // The checkpoint is in place: failing to drop an old one only costs disk space.
        if let Err(e) = self.prune() {
            tracing::warn!("old checkpoints in {} stay: {e:#}", self.dir.display());
        }
        Ok(path)
    }

    /// Remove every checkpoint at or past `position` that `keep` refuses (a branch a change of
    /// course replaced; one that cannot be read goes too), and make that durable.
    pub fn remove_from(&self, position: u64, keep: impl Fn(&M) -> bool) -> anyhow::Result<usize> {
        let gone: Vec<PathBuf> = (self.list_all()?.into_iter())
            .filter(|(at, path)| {
                *at >= position && Self::read(path).map_or(true, |(meta, _)| !keep(&meta))
            })
            .map(|(_, path)| path)
            .collect();
        for path in &gone {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove checkpoint {}", path.display()))?;
        }
        if !gone.is_empty() {
            sync_dir(&self.dir);
        }
        Ok(gone.len())
    }

    /// Remove all but the newest `keep` checkpoints, and the temporary files of killed writes,
    /// and make that durable.
    fn prune(&self) -> anyhow::Result<()> {
        let Scan {
            checkpoints: all,
            partial,
        } = self.scan()?;
        // This process writes the directory, one write at a time: a temporary file is a killed
        // process's.
        for path in partial {
            if std::fs::remove_file(&path).is_ok() {
                tracing::info!(
                    "removed {}: a checkpoint write a killed run left unfinished",
                    path.display()
                );
            }
        }
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
    pub fn read(path: &Path) -> anyhow::Result<(M, PipelineState)> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        checkpoint::decode(&bytes).with_context(|| format!("checkpoint {}", path.display()))
    }

    /// The newest usable checkpoint at or below `position`, or `None` when the stream must start
    /// from its beginning. `foreign` says why a sound checkpoint does not belong to this run (an
    /// error naming the file); corrupt files are skipped with a warning.
    pub fn newest_at_or_below(
        &self,
        position: u64,
        foreign: impl Fn(&M) -> Option<String>,
    ) -> anyhow::Result<Option<Loaded<M>>> {
        for (at, path) in self.list()?.into_iter().rev() {
            if at > position {
                continue;
            }
            match Self::read(&path) {
                Ok((meta, state)) => {
                    let why = match meta.position() == at {
                        true => foreign(&meta),
                        false => Some(format!(
                            "its header says position {}, its name {at}",
                            meta.position()
                        )),
                    };
                    if let Some(why) = why {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize)]
    struct TestMeta {
        at: u64,
        run: String,
    }

    impl Header for TestMeta {
        const PREFIX: &'static str = "t-";
        const DIGITS: usize = 4;
        fn position(&self) -> u64 {
            self.at
        }
    }

    fn state() -> PipelineState {
        let mixer = serde_json::json!({"rng_word_pos": 0, "peeked": [], "exhausted": [],
            "emitted": [], "started": false, "done": false});
        PipelineState {
            stream: dsprep_mixers::StreamState {
                sources: Vec::new(),
                mixer: serde_json::from_value(mixer).expect("a mixer state"),
                shuffle_rng_word_pos: 0,
                buffered: Vec::new(),
                draining: false,
                emitted: 0,
            },
            packer: Default::default(),
        }
    }

    fn meta(at: u64, run: &str) -> TestMeta {
        TestMeta {
            at,
            run: run.into(),
        }
    }

    #[test]
    fn keeps_the_newest_k_even_after_a_kill_between_rename_and_prune() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let store = CheckpointStore::<TestMeta>::open(tmp.path(), 2)?;
        for at in [10, 20, 30] {
            store.write(&meta(at, "a"), &state())?;
        }
        let listed: Vec<u64> = store.list()?.into_iter().map(|(at, _)| at).collect();
        assert_eq!(listed, [20, 30]);
        // A kill right after a rename: one file more than kept, not listed nor used.
        std::fs::copy(
            tmp.path().join("t-0020.ckpt"),
            tmp.path().join("t-0005.ckpt"),
        )?;
        assert_eq!(store.list()?.len(), 2);
        assert!(store.newest_at_or_below(15, |_| None)?.is_none());
        // A kill in the middle of a write: its temporary file, and another file of the user's.
        std::fs::write(tmp.path().join(".t-0035.ckpt.tmp"), b"half")?;
        std::fs::write(tmp.path().join(".notes.tmp"), b"mine")?;
        store.write(&meta(40, "a"), &state())?;
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        assert_eq!(names, [".notes.tmp", "t-0030.ckpt", "t-0040.ckpt"]);
        Ok(())
    }

    #[test]
    fn a_corrupt_file_falls_back_and_a_foreign_one_is_an_error() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let store = CheckpointStore::<TestMeta>::open(tmp.path(), 3)?;
        store.write(&meta(1, "a"), &state())?;
        let torn = store.write(&meta(2, "a"), &state())?;
        std::fs::write(&torn, b"torn")?;
        let mine = |m: &TestMeta| (m.run != "a").then(|| format!("run {}", m.run));
        let found = store.newest_at_or_below(5, mine)?;
        assert_eq!(found.map(|l| l.meta.at), Some(1));
        store.write(&meta(3, "b"), &state())?;
        let err = store
            .newest_at_or_below(5, mine)
            .err()
            .map(|e| format!("{e:#}"));
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("t-0003.ckpt: run b")),
            "{err:?}"
        );
        Ok(())
    }
}
