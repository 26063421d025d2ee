//! How node daemons agree on where a laned stream ends, with no process of their own in the
//! middle: facts about lanes, on the shared state directory.
//!
//! Each node publishes, per lane it runs, "this lane has at least B complete blocks" and, once
//! its mix has ended, "this lane has exactly B blocks", in `lanes-<stream id>/lane-NNNNN.json`
//! (written atomically, at most every [`WRITE_EVERY`] and always at the lane's end). These are
//! facts about the deterministic stream, not about a live process: a file left by an earlier run
//! of the same recipe and inputs (same stream id) is still true, and a node that restarts just
//! adds to it. Before a node serves global step `s`, the [`Gate`] checks that every lane of the
//! stream reaches past `s` (the stream's blocks are known to exist), or that the stream ends
//! before `s` (end of data, at the same step for every rank of every node); else the request
//! waits, re-reading the files at most every [`READ_EVERY`].

use crate::files::write_atomic;
use dsprep_mixers::lanes::blocks_known;
use dsprep_mixers::recipe::LanesSpec;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A lane's file is rewritten at most this often while it runs.
pub const WRITE_EVERY: Duration = Duration::from_millis(100);
/// Other nodes' files are read at most this often while a request waits on them.
pub const READ_EVERY: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneFact {
    /// Complete blocks the lane is known to have.
    pub blocks: u64,
    /// Whether `blocks` is all the lane will ever have.
    pub ended: bool,
}

impl LaneFact {
    fn merge(&mut self, other: LaneFact) {
        if other.ended {
            *self = other;
        } else if !self.ended {
            self.blocks = self.blocks.max(other.blocks);
        }
    }
}

/// The lanes' facts as this node knows them: its own lanes from memory, others from the files.
pub struct LaneProgress {
    spec: LanesSpec,
    dir: PathBuf,
    state: Mutex<ProgressState>,
}

struct ProgressState {
    facts: Vec<LaneFact>,
    last_write: Vec<Option<Instant>>,
    last_read: Option<Instant>,
}

impl LaneProgress {
    /// Progress files for the stream `stream_id` under `state_dir`.
    pub fn new(spec: LanesSpec, state_dir: &Path, stream_id: &str) -> std::io::Result<Self> {
        let dir = state_dir.join(format!("lanes-{stream_id}"));
        std::fs::create_dir_all(&dir)?;
        let n = spec.count as usize;
        Ok(Self {
            spec,
            dir,
            state: Mutex::new(ProgressState {
                facts: vec![LaneFact::default(); n],
                last_write: vec![None; n],
                last_read: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn file(&self, lane: u32) -> PathBuf {
        self.dir.join(format!("lane-{lane:05}.json"))
    }

    /// A lane this node runs has `blocks` complete blocks (and no more, if `ended`). Written at
    /// once when `now` (the lane is about to wait, or has ended), else at most every
    /// [`WRITE_EVERY`].
    pub fn advance(&self, lane: u32, fact: LaneFact, now: bool) {
        let due = {
            let mut state = self.lock();
            state.facts[lane as usize].merge(fact);
            let last = &mut state.last_write[lane as usize];
            let due = now || fact.ended || last.is_none_or(|t| t.elapsed() >= WRITE_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due.then_some(state.facts[lane as usize])
        };
        if let Some(fact) = due {
            let json = serde_json::to_vec(&fact).expect("plain data serializes");
            if let Err(e) = write_atomic(&self.file(lane), &json) {
                tracing::warn!(
                    "cannot publish lane {lane}'s progress to {}: {e} (other nodes wait for it)",
                    self.file(lane).display()
                );
            }
        }
    }

    /// Read every lane's file (other nodes' lanes; own lanes only gain nothing from it).
    fn refresh(&self, state: &mut ProgressState) {
        if state.last_read.is_some_and(|t| t.elapsed() < READ_EVERY) {
            return;
        }
        state.last_read = Some(Instant::now());
        for lane in 0..self.spec.count {
            let Ok(bytes) = std::fs::read(self.file(lane)) else {
                continue;
            };
            match serde_json::from_slice::<LaneFact>(&bytes) {
                Ok(fact) => state.facts[lane as usize].merge(fact),
                Err(e) => tracing::warn!(
                    "ignoring {}: {e} (a torn or foreign file; it is rewritten by its node)",
                    self.file(lane).display()
                ),
            }
        }
    }

    /// Whether global step `step` of `global_batch` windows may be served.
    pub fn gate(&self, step: u64, global_batch: u64) -> Gate {
        let k = u64::from(self.spec.block_windows);
        let decide = |facts: &[LaneFact]| {
            let lanes: Vec<(u64, bool)> = facts.iter().map(|f| (f.blocks, f.ended)).collect();
            let (blocks, is_end) = blocks_known(&self.spec, &lanes);
            let num_steps = (blocks * k) / global_batch;
            if step < num_steps {
                Some(Gate::Open(is_end.then_some(num_steps)))
            } else if is_end {
                Some(Gate::End(num_steps))
            } else {
                None
            }
        };
        let mut state = self.lock();
        if let Some(gate) = decide(&state.facts) {
            return gate;
        }
        self.refresh(&mut state);
        decide(&state.facts).unwrap_or(Gate::Wait)
    }
}

/// What the lanes' facts say about a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Every lane has it; the number of steps, if the end is known.
    Open(Option<u64>),
    /// The stream ends with this many steps, before the step asked for.
    End(u64),
    /// Not known yet: ask again.
    Wait,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_opens_when_every_lane_reaches_it_and_the_end_is_shared() {
        let spec = LanesSpec {
            count: 2,
            block_windows: 2,
        };
        let dir = tempfile::tempdir().unwrap();
        let node0 = LaneProgress::new(spec, dir.path(), "s").unwrap();
        let node1 = LaneProgress::new(spec, dir.path(), "s").unwrap();
        // Steps of 4 windows = one block of each lane.
        node0.advance(
            0,
            LaneFact {
                blocks: 3,
                ended: false,
            },
            false,
        );
        assert_eq!(node0.gate(0, 4), Gate::Wait, "lane 1 is not known yet");
        node1.advance(
            1,
            LaneFact {
                blocks: 2,
                ended: true,
            },
            false,
        );
        std::thread::sleep(READ_EVERY);
        assert_eq!(node0.gate(1, 4), Gate::Open(Some(2)));
        assert_eq!(node0.gate(2, 4), Gate::End(2));
        std::thread::sleep(READ_EVERY);
        assert_eq!(node1.gate(2, 4), Gate::End(2), "the other node agrees");
        let other = LaneProgress::new(spec, dir.path(), "t").unwrap();
        assert_eq!(
            other.gate(0, 4),
            Gate::Wait,
            "another stream's files are not read"
        );
    }
}
