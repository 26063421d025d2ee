//! The stream chain (`dsprep_client::chain`) of a laned stream, linked by every node daemon
//! though each holds only its own ranks' windows: the nodes exchange window digests through the
//! shared state directory, as they exchange lane progress (`progress.rs`).
//!
//! In `lanes-<stream id>/`:
//! - `windows.bin`: the sha256 of each window of the stream, 32 bytes at `32 × window`, written
//!   by the node that runs the window's lane as it assembles it.
//! - `chain.bin`: the stream chain before each global block, 32 bytes per block, written by
//!   every node (they are the same bytes): where a restarted node picks the chain up.
//!
//! Each is opened once per process and written and read in place, so linking costs the shared
//! filesystem's metadata server nothing per step, whatever the number of lanes.
//!
//! After a change of course both are a branch's (`branch-<n>/`), seeded from the branch below
//! with the entries before the change ([`seed_branch`]).
//!
//! Both hold facts about the deterministic stream. An entry already there (left by an earlier
//! run, or by another node) is compared, never overwritten: a difference stops the daemon with a
//! message naming the file and the window, because the stream is no longer the one served
//! before. All-zero bytes (a hole in a file) mean "not written yet".
//!
//! Linking step `s` needs every window digest of the step: a node waits (re-reading at most
//! every [`READ_EVERY`]) until the other nodes have assembled their parts, as their ranks must
//! anyway for a synchronous training step.

use super::progress::{Gate, LaneProgress, READ_EVERY};
use crate::files::patiently;
use crate::serve::store::{StepChain, StepData, StepStore};
use anyhow::{Context, bail};
use dsprep_client::chain::{self, Hash};
use dsprep_mixers::lanes::{NodeSlice, block_lane};
use dsprep_mixers::recipe::LanesSpec;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a node waits on another node's digests before saying so in the log (it keeps
/// waiting: that node may be restarting).
const WAIT_LOG_AFTER: Duration = Duration::from_secs(10);

pub struct LaneChain {
    spec: LanesSpec,
    slice: NodeSlice,
    /// The stream's folder on the state directory; `None` for a lone daemon without one (every
    /// window is then its own, and nothing is written).
    dir: Option<PathBuf>,
    progress: Option<Arc<LaneProgress>>,
    windows_file: Option<File>,
    chain_file: Option<File>,
    /// The chain before this global block, once known.
    at: Option<(u64, Hash)>,
}

/// The two files of 32-byte entries: window digests by stream window, the chain by block.
#[derive(Clone, Copy)]
enum Entry {
    Window,
    Chain,
}

/// What linking a step found.
pub enum Linked {
    Yes,
    /// The stream ends before this step (another node's lane ran out): it is never served.
    BeyondEnd,
    /// The daemon is stopping.
    Stopped,
}

/// What waiting on other nodes gave: a value, the stream's end before it, or the daemon stopping.
enum Waited<T> {
    Got(T),
    End,
    Stopped,
}

impl LaneChain {
    pub fn new(
        spec: LanesSpec,
        slice: NodeSlice,
        dir: Option<PathBuf>,
        progress: Option<Arc<LaneProgress>>,
    ) -> Self {
        LaneChain {
            spec,
            slice,
            dir,
            progress,
            windows_file: None,
            chain_file: None,
            at: None,
        }
    }

    /// Fill `step.chain` from its own digests (`step.digests`, this node's part of the step) and
    /// the other nodes' (from their files), after writing its own for them.
    pub fn link_step(&mut self, step: &mut StepData, store: &StepStore) -> anyhow::Result<Linked> {
        let g = self.slice.global_batch;
        let part = self.slice.windows_per_step();
        let first = self.slice.step_window(step.step);
        let own_from = first + u64::from(self.slice.node) * part;
        for (i, digest) in step.digests.iter().enumerate() {
            self.put_digest(own_from + i as u64, digest)?;
        }
        let k = self.slice.block_windows;
        let mut at = match self.chain_before(first / k, store)? {
            Waited::Got(at) => at,
            Waited::End => return Ok(Linked::BeyondEnd),
            Waited::Stopped => return Ok(Linked::Stopped),
        };
        let mut marks = Vec::with_capacity(part as usize + 1);
        let step_start = at;
        for w in first..first + g {
            if (own_from..own_from + part).contains(&w) {
                marks.push(at); // before each own window
            }
            if w > first && w % k == 0 {
                self.put_chain(w / k, &at)?;
            }
            let digest = match w.checked_sub(own_from) {
                Some(i) if i < part => step.digests[i as usize],
                _ => match self.wait_digest(w, step.step, store)? {
                    Waited::Got(d) => d,
                    Waited::End => return Ok(Linked::BeyondEnd),
                    Waited::Stopped => return Ok(Linked::Stopped),
                },
            };
            at = chain::link(&at, &digest);
            if w + 1 == own_from + part {
                marks.push(at);
            }
        }
        self.put_chain((first + g) / k, &at)?;
        self.at = Some(((first + g) / k, at));
        step.chain = StepChain {
            step_start,
            marks,
            step_end: at,
        };
        Ok(Linked::Yes)
    }

    /// The chain before global block `block`: from memory, else `chain.bin`, else linked from
    /// the newest entry below it through the digest files; or the end (the stream ends first),
    /// or the daemon stopping.
    fn chain_before(&mut self, block: u64, store: &StepStore) -> anyhow::Result<Waited<Hash>> {
        if let Some((b, at)) = self.at
            && b == block
        {
            return Ok(Waited::Got(at));
        }
        let mut from = block;
        let mut at = chain::START;
        while from > 0 {
            if let Some(found) = self.read_chain(from)? {
                at = found;
                break;
            }
            from -= 1;
        }
        let k = self.slice.block_windows;
        for w in from * k..block * k {
            let step = self.slice.step_of_window(w);
            match self.wait_digest(w, step, store)? {
                Waited::Got(digest) => at = chain::link(&at, &digest),
                other => return Ok(other),
            }
        }
        if from < block {
            tracing::info!(
                "the stream chain before block {block} was linked from block {from}'s recorded \
                 value and {} window digests",
                (block - from) * k
            );
        }
        Ok(Waited::Got(at))
    }

    /// Window `w`'s digest from its lane's file, waiting for its node to write it; or the end,
    /// when the stream is known to end before `step`; or the daemon stopping.
    fn wait_digest(
        &mut self,
        w: u64,
        step: u64,
        store: &StepStore,
    ) -> anyhow::Result<Waited<Hash>> {
        let (lane, _) = self.lane_window(w);
        let began = Instant::now();
        let mut said = false;
        loop {
            if let Some(digest) = self.read_entry(Entry::Window, w)? {
                return Ok(Waited::Got(digest));
            }
            if store.is_shut_down() {
                return Ok(Waited::Stopped);
            }
            if let Some(p) = &self.progress
                && let Gate::End(num_steps) = p.gate(step, self.slice.global_batch)
                && step >= num_steps
            {
                return Ok(Waited::End);
            }
            if self.dir.is_none() {
                bail!("internal error: window {w} is another node's, and there is no state dir");
            }
            if !said && began.elapsed() > WAIT_LOG_AFTER {
                said = true;
                tracing::warn!(
                    "step {step}: waiting for lane {lane}'s window digests from the node that \
                     runs it (is it running?)"
                );
            }
            std::thread::sleep(READ_EVERY);
        }
    }

    /// (lane, index among the lane's windows) of global window `w`.
    fn lane_window(&self, w: u64) -> (u32, u64) {
        let k = self.slice.block_windows;
        let (lane, lane_block) = block_lane(&self.spec, w / k);
        (lane, lane_block * k + w % k)
    }

    fn put_digest(&mut self, w: u64, digest: &Hash) -> anyhow::Result<()> {
        let (lane, index) = self.lane_window(w);
        self.put_entry(Entry::Window, w, digest, || {
            format!("window {w} of the stream (window {index} of lane {lane})")
        })
    }

    fn put_chain(&mut self, block: u64, at: &Hash) -> anyhow::Result<()> {
        self.put_entry(Entry::Chain, block, at, || {
            format!("the stream chain before block {block}")
        })
    }

    fn read_chain(&mut self, block: u64) -> anyhow::Result<Option<Hash>> {
        self.read_entry(Entry::Chain, block)
    }

    /// `windows.bin` or `chain.bin`, opened once.
    fn file(&mut self, entry: Entry) -> anyhow::Result<Option<(&File, PathBuf)>> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        let (slot, path) = match entry {
            Entry::Window => (&mut self.windows_file, dir.join("windows.bin")),
            Entry::Chain => (&mut self.chain_file, dir.join("chain.bin")),
        };
        if slot.is_none() {
            *slot = Some(open(&path)?);
        }
        Ok(slot.as_ref().map(|f| (f, path)))
    }

    fn read_entry(&mut self, entry: Entry, index: u64) -> anyhow::Result<Option<Hash>> {
        let Some((file, path)) = self.file(entry)? else {
            return Ok(None);
        };
        let mut entry = [0u8; 32];
        let read = patiently(&path, "read", || {
            match file.read_exact_at(&mut entry, index * 32) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
                Err(e) => Err(e),
            }
        })?;
        Ok((read && entry != [0; 32]).then_some(entry))
    }

    /// Write an entry, or check the one already there.
    fn put_entry(
        &mut self,
        entry: Entry,
        index: u64,
        value: &Hash,
        what: impl Fn() -> String,
    ) -> anyhow::Result<()> {
        let existing = self.read_entry(entry, index)?;
        let Some((file, path)) = self.file(entry)? else {
            return Ok(());
        };
        match existing {
            Some(found) if found == *value => Ok(()),
            Some(found) => bail!(
                "{}: {} is {} in this run, but the file holds {} from an earlier one: this is \
                 not the stream served before under this state directory (did its inputs \
                 change?); nothing more is served",
                path.display(),
                what(),
                chain::to_hex(value),
                chain::to_hex(&found)
            ),
            None => patiently(&path, "write", || file.write_all_at(value, index * 32)),
        }
    }
}

fn open(path: &std::path::Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// Seed a branch's files (`to`) with the entries of the branch below (`from`) that hold before
/// stream window `windows`: window digests below it, and the chain before every block up to
/// the one holding it, and nothing past them. Written by node 0 before it writes the change into
/// `lineage.json`, so no node uses the branch yet.
pub fn seed_branch(
    from: &std::path::Path,
    to: &std::path::Path,
    windows: u64,
    block_windows: u64,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    let entries = [
        ("windows.bin", windows),
        ("chain.bin", windows / block_windows.max(1) + 1),
    ];
    for (name, count) in entries {
        let source = from.join(name);
        let bytes = match std::fs::read(&source) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", source.display())),
        };
        let keep = bytes
            .len()
            .min(usize::try_from(count.saturating_mul(32)).unwrap_or(usize::MAX));
        let target = to.join(name);
        let file = open(&target)?;
        // Past the change nothing is known yet (an attempt at it that was never made may have
        // seeded more): cut there.
        (file.set_len(keep as u64))
            .and_then(|()| file.write_all_at(&bytes[..keep], 0))
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    Ok(())
}
