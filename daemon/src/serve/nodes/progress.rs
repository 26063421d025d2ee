//! How node daemons agree on where a laned stream ends, with no process of their own in the
//! middle: facts about lanes, on the shared state directory.
//!
//! Each node publishes, per lane it runs, "this lane has at least B complete blocks" and, once
//! its mix has ended, "this lane has exactly B blocks". These are facts about the deterministic
//! stream, not about a live process: a fact left by an earlier run of the same recipe and inputs
//! (same stream id) is still true, and a node that restarts just adds to it. Before a node serves
//! global step `s`, the [`Gate`] checks that every lane of the stream reaches past `s` (the
//! stream's blocks are known to exist), or that the stream ends before `s` (end of data, at the
//! same step for every rank of every node); else the request waits, re-reading the facts at most
//! every [`READ_EVERY`].
//!
//! All lanes' facts live in one file, `lanes-<stream id>/progress.bin`: a [`SLOT_BYTES`] slot per
//! lane, written in place (`pwrite`) by the node that runs the lane, at most every
//! [`WRITE_EVERY`] and always at the lane's end, and read whole by a node waiting on others. The
//! file is opened once per process, so the shared filesystem's metadata server sees nothing per
//! step, whatever the number of lanes and nodes (a file per lane rewritten by rename cost about
//! 1.35 × lanes metadata operations per node per step). A slot is `blocks` (u64), `ended` (u32,
//! 0 or 1) and the CRC-32 of those 12 bytes (u32), little-endian; all zero means nothing known
//! yet. A slot read torn, or not written yet on this node's view of the file (a cluster
//! filesystem may show another node's write late), reads as nothing known and is read again.

use crate::files::{patiently, read_at_most};
use dsprep_mixers::lanes::blocks_known;
use dsprep_mixers::recipe::LanesSpec;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A lane's slot is rewritten at most this often while it runs.
pub const WRITE_EVERY: Duration = Duration::from_millis(100);
/// The other lanes' slots are read at most this often while a request waits on them.
pub const READ_EVERY: Duration = Duration::from_millis(20);
/// Bytes of one lane's slot in `progress.bin`.
pub const SLOT_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

    fn to_slot(self) -> [u8; SLOT_BYTES] {
        let mut slot = [0u8; SLOT_BYTES];
        slot[..8].copy_from_slice(&self.blocks.to_le_bytes());
        slot[8..12].copy_from_slice(&u32::from(self.ended).to_le_bytes());
        let crc = crc32fast::hash(&slot[..12]);
        slot[12..].copy_from_slice(&crc.to_le_bytes());
        slot
    }

    /// The fact in `slot`; none when it is empty, torn or not one.
    fn from_slot(slot: &[u8]) -> Option<LaneFact> {
        let word =
            |at: usize| u32::from_le_bytes([slot[at], slot[at + 1], slot[at + 2], slot[at + 3]]);
        if slot.len() != SLOT_BYTES || crc32fast::hash(&slot[..12]) != word(12) {
            return None;
        }
        let mut blocks = [0u8; 8];
        blocks.copy_from_slice(&slot[..8]);
        match word(8) {
            ended @ (0 | 1) => Some(LaneFact {
                blocks: u64::from_le_bytes(blocks),
                ended: ended == 1,
            }),
            _ => None,
        }
    }
}

/// The lanes' facts as this node knows them: its own lanes from memory, others from the file.
pub struct LaneProgress {
    spec: LanesSpec,
    path: PathBuf,
    file: File,
    state: Mutex<ProgressState>,
    /// The step from which steps are of the served global batch, and its first window (set
    /// once the course is settled; 0 and 0 until then).
    origin: std::sync::OnceLock<(u64, u64)>,
}

struct ProgressState {
    facts: Vec<LaneFact>,
    last_write: Vec<Option<Instant>>,
    last_read: Option<Instant>,
    /// Own lanes whose last write failed.
    unpublished: Vec<bool>,
}

impl LaneProgress {
    /// The progress file of the stream `stream_id` under `state_dir`, opened (created) once; the
    /// facts already there (an earlier run's) are read at once.
    #[cfg(test)]
    pub fn new(spec: LanesSpec, state_dir: &Path, stream_id: &str) -> std::io::Result<Self> {
        Self::in_dir(spec, &state_dir.join(format!("lanes-{stream_id}")))
    }

    /// The progress file in `dir` (a stream's folder, or a branch's after a change of course).
    pub fn in_dir(spec: LanesSpec, dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("progress.bin");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let n = spec.count as usize;
        let progress = Self {
            spec,
            path,
            file,
            state: Mutex::new(ProgressState {
                facts: vec![LaneFact::default(); n],
                last_write: vec![None; n],
                last_read: None,
                unpublished: vec![false; n],
            }),
            origin: std::sync::OnceLock::new(),
        };
        {
            let mut state = progress.lock();
            progress.refresh(&mut state);
        }
        Ok(progress)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
            self.publish(lane, fact, now || fact.ended);
        }
    }

    /// Write lane `lane`'s slot. A write that fails is left for the next one (a lane's slot is
    /// rewritten as it runs, and while a request waits); the lane's last write (`patient`: its
    /// end, or before it waits on a full queue) is retried for up to
    /// [`crate::files::STATE_IO_PATIENCE`], as other nodes may wait on nothing else.
    fn publish(&self, lane: u32, fact: LaneFact, patient: bool) {
        let at = u64::from(lane) * SLOT_BYTES as u64;
        let slot = fact.to_slot();
        let written = if patient {
            patiently(&self.path, "write", || self.file.write_all_at(&slot, at))
        } else {
            self.file
                .write_all_at(&slot, at)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", self.path.display()))
        };
        let mut state = self.lock();
        match written {
            Ok(()) => state.unpublished[lane as usize] = false,
            Err(e) => {
                state.unpublished[lane as usize] = true;
                tracing::warn!(
                    "cannot publish lane {lane}'s progress: {e:#} (other nodes wait for it; \
                     written again while this node runs or waits)"
                );
            }
        }
    }

    /// Write again the own lanes whose last write failed (a request asks: this node still runs).
    fn republish(&self, state: std::sync::MutexGuard<'_, ProgressState>) {
        let again: Vec<(u32, LaneFact)> = state
            .unpublished
            .iter()
            .enumerate()
            .filter(|(_, u)| **u)
            .map(|(lane, _)| (lane as u32, state.facts[lane]))
            .collect();
        drop(state);
        for (lane, fact) in again {
            self.publish(lane, fact, false);
        }
    }

    /// Read every lane's slot (other nodes' lanes; own lanes only gain nothing from it).
    fn refresh(&self, state: &mut ProgressState) {
        if state.last_read.is_some_and(|t| t.elapsed() < READ_EVERY) {
            return;
        }
        state.last_read = Some(Instant::now());
        // Slots past what this node sees of the file are not written yet.
        let len = self.spec.count as usize * SLOT_BYTES;
        let bytes = read_at_most(&self.file, 0, len).unwrap_or_else(|e| {
            tracing::warn!(
                "cannot read the lanes' progress from {}: {e} (read again while a request waits)",
                self.path.display()
            );
            Vec::new()
        });
        for (lane, slot) in bytes.chunks_exact(SLOT_BYTES).enumerate() {
            if let Some(fact) = LaneFact::from_slot(slot) {
                state.facts[lane].merge(fact);
            }
        }
    }

    /// Steps are of the served global batch from step `step`, which starts at stream window
    /// `window` (a change of course set it there).
    pub fn set_origin(&self, step: u64, window: u64) {
        let _ = self.origin.set((step, window));
    }

    /// Whether global step `step` of `global_batch` windows may be served.
    pub fn gate(&self, step: u64, global_batch: u64) -> Gate {
        let k = u64::from(self.spec.block_windows);
        let (origin_step, origin_window) = self.origin.get().copied().unwrap_or((0, 0));
        let decide = |facts: &[LaneFact]| {
            let lanes: Vec<(u64, bool)> = facts.iter().map(|f| (f.blocks, f.ended)).collect();
            let (blocks, is_end) = blocks_known(&self.spec, &lanes);
            let num_steps = origin_step + (blocks * k).saturating_sub(origin_window) / global_batch;
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
            self.republish(state);
            return gate;
        }
        self.refresh(&mut state);
        let gate = decide(&state.facts).unwrap_or(Gate::Wait);
        self.republish(state);
        gate
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

    #[test]
    fn a_slot_round_trips_and_a_torn_or_empty_one_is_nothing() {
        let fact = LaneFact {
            blocks: 123_456_789_012,
            ended: true,
        };
        let slot = fact.to_slot();
        assert_eq!(LaneFact::from_slot(&slot), Some(fact));
        assert_eq!(LaneFact::from_slot(&[0u8; SLOT_BYTES]), None);
        for byte in 0..SLOT_BYTES {
            let mut torn = slot;
            torn[byte] ^= 0x10;
            assert_eq!(LaneFact::from_slot(&torn), None, "byte {byte}");
        }
    }

    #[test]
    fn a_restarted_node_starts_from_the_facts_on_file_and_never_lowers_them() {
        let spec = LanesSpec {
            count: 3,
            block_windows: 1,
        };
        let dir = tempfile::tempdir().unwrap();
        let first = LaneProgress::new(spec, dir.path(), "s").unwrap();
        first.advance(
            2,
            LaneFact {
                blocks: 9,
                ended: false,
            },
            true,
        );
        drop(first);
        let again = LaneProgress::new(spec, dir.path(), "s").unwrap();
        again.advance(
            2,
            LaneFact {
                blocks: 4,
                ended: false,
            },
            true,
        );
        let reader = LaneProgress::new(spec, dir.path(), "s").unwrap();
        assert_eq!(
            reader.lock().facts[2],
            LaneFact {
                blocks: 9,
                ended: false
            }
        );
    }
}
