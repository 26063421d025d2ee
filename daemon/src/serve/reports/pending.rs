//! The reports no decision has used yet, kept across a graceful stop (SIGINT/SIGTERM, as Slurm
//! sends before a job's time runs out): the stopping daemon writes them to
//! `adaptive-reports/pending-node<N>.json` in the state directory, and a daemon resumed on the
//! same ranks takes them back, so the first decisions after a planned restart are made from them
//! instead of holding. A SIGKILL loses them: keeping every report as it comes would cost the
//! shared filesystem an operation per step.

use super::{Reports, StepReports};
use crate::files::write_atomic;
use anyhow::Context;
use dsprep_mixers::adaptive::Observed;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A daemon's unused reports, as its file holds them.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PendingReports {
    /// The ranks they are of (`ranks` from `first_rank`), and the lineage's segments then.
    pub first_rank: u32,
    pub ranks: u32,
    pub segments: usize,
    pub steps: Vec<PendingStep>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PendingStep {
    pub step: u64,
    /// Per local rank: whether it reported the step.
    pub reported: Vec<bool>,
    /// Per source name: the sums of those reports.
    pub sums: BTreeMap<String, Observed>,
}

/// Node `node`'s file in the state directory `state_dir`.
pub fn path(state_dir: &Path, node: u32) -> PathBuf {
    state_dir
        .join("adaptive-reports")
        .join(format!("pending-node{node:05}.json"))
}

/// Write `pending` to `path` (its folder made), or remove a stale file when there is nothing.
pub fn save(path: &Path, pending: &PendingReports) -> anyhow::Result<()> {
    if pending.steps.is_empty() {
        let _ = std::fs::remove_file(path);
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let bytes = serde_json::to_vec(pending).context("unused reports as JSON")?;
    write_atomic(path, &bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Read and remove the file at `path` (`None` when there is none). It is used once.
pub fn take(path: &Path) -> anyhow::Result<Option<PendingReports>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let _ = std::fs::remove_file(path);
    serde_json::from_slice(&bytes)
        .map(Some)
        .with_context(|| format!("{} does not read as unused reports", path.display()))
}

impl Reports {
    /// The reports of the steps no decision has used yet, of a lineage of `segments` segments.
    pub fn pending(&self, segments: usize) -> PendingReports {
        let book = self.lock();
        PendingReports {
            first_rank: self.first_rank,
            ranks: self.ranks,
            segments,
            steps: (book.steps.iter())
                .map(|(&step, s)| PendingStep {
                    step,
                    reported: s.reported.clone(),
                    sums: (self.names.iter().cloned())
                        .zip(s.sums.iter().copied())
                        .collect(),
                })
                .collect(),
        }
    }

    /// Take back `pending` (a lineage of `segments` segments now): the steps the next decisions
    /// use, if they are of the same ranks and segment. The number of steps taken back, or why
    /// none were.
    pub fn take_back(&self, pending: PendingReports, segments: usize) -> Result<usize, String> {
        if (pending.first_rank, pending.ranks) != (self.first_rank, self.ranks) {
            return Err(format!(
                "they are of ranks {}..{}, this daemon serves ranks {}..{}",
                pending.first_rank,
                pending.first_rank + pending.ranks,
                self.first_rank,
                self.first_rank + self.ranks
            ));
        }
        if pending.segments != segments {
            return Err("the lineage has changed course since".into());
        }
        let mut book = self.lock();
        let Some(keep_from) = book.keep_from else {
            return Ok(0);
        };
        let mut taken = 0;
        for step in pending.steps.into_iter().filter(|s| s.step >= keep_from) {
            if step.reported.len() != self.ranks as usize {
                continue;
            }
            let sums = (self.names.iter())
                .map(|n| step.sums.get(n).copied().unwrap_or_default())
                .collect();
            book.steps.entry(step.step).or_insert(StepReports {
                reported: step.reported,
                sums,
            });
            taken += 1;
        }
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsprep_client::protocol::report::SourceLoss;
    use std::time::Duration;

    fn entry(loss_sum: f64, tokens: u64) -> [SourceLoss; 1] {
        [SourceLoss {
            source: 0,
            loss_sum,
            tokens,
        }]
    }

    /// Reports kept at a stop are taken back by a daemon of the same ranks, and a decision uses
    /// them as if they had never left; a daemon of other ranks takes none.
    #[test]
    fn unused_reports_survive_a_graceful_stop() {
        let tmp = tempfile::tempdir().unwrap();
        let file = path(tmp.path(), 0);
        let before = Reports::new(vec!["a".into()], 2, Some(3));
        before.accept(0, 3, &entry(4.0, 2)).unwrap();
        before.accept(1, 3, &entry(2.0, 2)).unwrap();
        before.accept(0, 4, &entry(1.0, 1)).unwrap();
        save(&file, &before.pending(1)).unwrap();

        let after = Reports::new(vec!["a".into()], 2, Some(3));
        let pending = take(&file).unwrap().unwrap();
        assert!(!file.exists(), "a file is used once");
        assert_eq!(after.take_back(pending, 1), Ok(2));
        after.accept(1, 4, &entry(1.0, 1)).unwrap();
        let (sums, missing) = after.wait_for(3, 5, Duration::ZERO, |_| false);
        assert!(missing.is_none());
        let all = Observed {
            loss_sum: 8.0,
            tokens: 6,
        };
        assert_eq!(sums, vec![all]);

        save(&file, &before.pending(1)).unwrap();
        let other = Reports::new(vec!["a".into()], 4, Some(3));
        let why = other.take_back(take(&file).unwrap().unwrap(), 1);
        assert_eq!(
            why,
            Err("they are of ranks 0..2, this daemon serves ranks 0..4".into())
        );
        save(
            &file,
            &Reports::new(vec!["a".into()], 2, Some(3)).pending(1),
        )
        .unwrap();
        assert!(!file.exists(), "nothing to keep, no file");
    }
}
