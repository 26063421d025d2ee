//! The producer of a daemon serving a recipe with `[lanes]`: it runs only the lanes its node
//! owns (`NodeSlice`), each on its own reader thread with a share of the tokenizer threads, and
//! puts their blocks together into this node's part of every global step.
//!
//! ```text
//! lane l: reader → tokenizers → packer ── blocks of K windows, bounded(2) ──┐
//! lane m: …                                                                  ├─▶ node order → StepStore
//! ```
//! Each lane publishes its progress ([`LaneProgress`]) so that every node learns where the
//! stream ends. A lane that runs ahead blocks on its channel: memory stays bounded by the
//! store's prefetch plus two blocks per lane.
//!
//! With a state directory each lane checkpoints itself ([`LaneCheckpoints`]) at or below what the
//! slowest rank has reached. Resuming (`--resume latest`) starts 8 steps (`HISTORY_STEPS`)
//! below the first step a rank asks for, as an uninterrupted daemon holds them: each lane
//! continues from its newest checkpoint at or below the windows it owes before that step (else
//! from its start) and drops the windows in between.

use super::course::{LaneStart, NodeCourse, lane_start, tag};
use super::lane_chain::{LaneChain, Linked};
use super::progress::{LaneFact, LaneProgress};
use crate::checkpoint::LaneCheckpoints;
use crate::checkpoint::lane::SegmentTag;
use crate::driver::LoadedRecipe;
use crate::driver::lineage::SegmentSink;
use crate::driver::pipeline::{MixDecider, PipelineConfig, ProducedDoc};
use crate::driver::run::{Flow, Snapshots, StreamStart, WindowSink};
use crate::progress::FastForward;
use crate::serve::adaptive::{Decider, Planner};
use crate::serve::metrics::Metrics;
use crate::serve::placement::{first_request, held_from};
use crate::serve::producer::{Ended, StepAssembler};
use crate::serve::store::{StepData, StepSegments, StepStore};
use anyhow::anyhow;
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use dsprep_client::format::Dtype;
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::lanes::{NodeSlice, block_lane, lane_windows_before};
use dsprep_mixers::packer::PackingCounters;
use dsprep_mixers::{LanesSpec, PackedWindow};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Blocks a lane may have ready beyond the one being consumed.
pub const LANE_QUEUE_BLOCKS: usize = 2;

pub struct LaneProducer<'a> {
    pub loaded: &'a LoadedRecipe,
    /// The lineage (a change of course made at the first request) and each segment's input.
    pub course: NodeCourse,
    pub spec: LanesSpec,
    pub slice: NodeSlice,
    pub store: &'a StepStore,
    pub metrics: &'a Metrics,
    /// Shared with the server when other nodes must be heard (more than one node).
    pub progress: Option<Arc<LaneProgress>>,
    pub threads: usize,
    pub dtype: Dtype,
    pub wake: &'a zmq::Socket,
    /// Start at the first step a rank asks for (the store is unplaced until then).
    pub resume: bool,
    /// With a state directory: the lanes' checkpoints, and every how many steps to write one.
    pub checkpoints: Option<LaneCheckpoints>,
    /// With a state directory: this branch's folder (progress, digests, chain); its branch 0
    /// is the stream's (checkpoints, locks).
    pub stream_dir: Option<std::path::PathBuf>,
    pub branch_dir: Option<std::path::PathBuf>,
    pub checkpoint_every: u64,
    /// `[mix.adaptive]`: the daemon's decisions, which each lane takes at its own share of
    /// their token points.
    pub decider: Option<Arc<Decider>>,
}

impl LaneProducer<'_> {
    pub fn run(mut self) -> anyhow::Result<Ended> {
        let Some(asked) = first_request(self.resume, self.store) else {
            return Ok(Ended::Stopped);
        };
        let base = self.stream_dir.clone();
        let branch = |n: usize| base.as_deref().map(|b| super::branch_dir(b, n));
        if !(self.course).settle(asked, &self.spec, branch, self.store)? {
            return Ok(Ended::Stopped);
        }
        let window_tokens = self.loaded.recipe.packing.window_tokens() as u64;
        let decider = self.decider.as_deref();
        crate::serve::course_placed(self.metrics, decider, &self.course.lineage, window_tokens)?;
        // Steps count from where the lineage set this global batch (step 0 but after a change
        // of it).
        let (origin_step, origin_window) = self.course.origin(asked, self.slice.global_batch)?;
        self.slice =
            (self.slice.clone().with_origin(origin_step, origin_window)).map_err(|e| anyhow!(e))?;
        if let Some(p) = &self.progress {
            p.set_origin(origin_step, origin_window);
        }
        // As a single daemon does: the steps below the one asked for are held too, for a rank
        // whose request was lost with the killed daemon and asks again late.
        let first = held_from(asked, origin_step);
        if asked > 0 {
            tracing::info!(
                "the first request is for step {asked}; the lanes resume at step {first}, so \
                 the {} steps below it are held for ranks that ask late",
                asked - first
            );
        }
        let lanes = self.slice.lanes();
        // About half of one lane's share of a step per chunk, and a snapshot (hence a possible
        // lane checkpoint) about once per its share.
        let step_tokens = self.slice.global_batch * window_tokens;
        let threads = (self.threads / lanes.len().max(1)).max(1);
        std::thread::scope(|scope| {
            let mut receivers: BTreeMap<u32, Receiver<Vec<PackedWindow>>> = BTreeMap::new();
            let mut handles = BTreeMap::new();
            for &lane in &lanes {
                let (tx, rx) = bounded::<Vec<PackedWindow>>(LANE_QUEUE_BLOCKS);
                receivers.insert(lane, rx);
                let config = PipelineConfig {
                    decider: (self.decider.clone())
                        .map(|d| Arc::new(Planner::new(d, Some(lane))) as Arc<dyn MixDecider>),
                    ..PipelineConfig::for_steps(threads, step_tokens, self.slice.count)
                };
                let lane_run = LaneRun {
                    course: &self.course,
                    spec: self.spec,
                    slice: &self.slice,
                    store: self.store,
                    metrics: self.metrics,
                    progress: self.progress.as_deref(),
                    checkpoints: self.checkpoints.as_ref(),
                    checkpoint_every: self.checkpoint_every,
                    decider: self.decider.as_deref(),
                };
                let handle = std::thread::Builder::new()
                    .name(format!("dsprep-lane-{lane}"))
                    .spawn_scoped(scope, move || lane_run.run(lane, first, config, tx))
                    .map_err(|e| anyhow!("cannot start lane {lane}'s thread: {e}"))?;
                handles.insert(lane, handle);
            }
            let ended = self.assemble(first, asked, &receivers);
            if let Some(decider) = &self.decider {
                decider.stop(); // a lane waiting for node 0's decision stops waiting
            }
            drop(receivers); // a lane still running sees its channel close and stops
            let (ended, mut failure) = match ended {
                Ok(ended) => (ended, None),
                Err(e) => (Ended::EndOfData, Some(e)),
            };
            for (lane, handle) in handles {
                match handle.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => failure = failure.or(Some(e.context(format!("lane {lane}")))),
                    Err(_) => failure = failure.or(Some(anyhow!("lane {lane}'s thread panicked"))),
                }
            }
            match (ended, failure) {
                (Ended::Stopped, _) => Ok(Ended::Stopped),
                (_, Some(e)) => Err(e),
                (ended, None) => Ok(ended),
            }
        })
    }

    /// Take the node's blocks in order from step `first` and cut them into its part of each
    /// global step, each linked into the stream chain, until a lane ends (or fails: its thread
    /// says why) or the store stops. The ranks are taken to be at step `asked` (≥ `first`).
    fn assemble(
        &self,
        first: u64,
        asked: u64,
        receivers: &BTreeMap<u32, Receiver<Vec<PackedWindow>>>,
    ) -> anyhow::Result<Ended> {
        let mut chain = LaneChain::new(
            self.spec,
            self.slice.clone(),
            self.branch_dir.clone(),
            self.progress.clone(),
        );
        self.store.place(first, asked);
        let per_step = self.slice.windows_per_step();
        let from = self.slice.first_block_of_step(first);
        let mut steps = StepAssembler {
            global_batch: per_step,
            dtype: self.dtype,
            next_window: from * self.slice.block_windows,
            keep_from: self.slice.own_windows_before(first),
            current: StepData::new(first, per_step as usize),
            chain: None,
            segments: StepSegments::of(&self.course.lineage),
        };
        for i in from.. {
            let (lane, _) = block_lane(&self.spec, self.slice.block(i));
            let Some(Ok(block)) = receivers.get(&lane).map(Receiver::recv) else {
                return Ok(Ended::EndOfData);
            };
            for window in block {
                let Some(mut done) = steps.add(window) else {
                    continue;
                };
                match chain.link_step(&mut done, self.store) {
                    Ok(Linked::Yes) => {}
                    Ok(Linked::BeyondEnd) => return Ok(Ended::EndOfData),
                    Ok(Linked::Stopped) => return Ok(Ended::Stopped),
                    Err(e) => return Err(e),
                }
                if self.store.push(done).is_err() {
                    return Ok(Ended::Stopped);
                }
                let _ = self.wake.send(&b""[..], zmq::DONTWAIT);
            }
        }
        Ok(Ended::EndOfData)
    }
}

/// What a lane's thread needs of the producer (all of it shareable between threads).
#[derive(Clone, Copy)]
struct LaneRun<'a> {
    course: &'a NodeCourse,
    spec: LanesSpec,
    slice: &'a NodeSlice,
    store: &'a StepStore,
    metrics: &'a Metrics,
    progress: Option<&'a LaneProgress>,
    checkpoints: Option<&'a LaneCheckpoints>,
    checkpoint_every: u64,
    decider: Option<&'a Decider>,
}

impl LaneRun<'_> {
    /// One lane, from the windows it owes before step `first`: sends its blocks to `tx`.
    fn run(
        &self,
        lane: u32,
        first: u64,
        config: PipelineConfig,
        tx: Sender<Vec<PackedWindow>>,
    ) -> anyhow::Result<()> {
        let spec = self.spec;
        let k = spec.block_windows as usize;
        let start = lane_windows_before(&spec, lane, self.slice.step_block(first));
        let segments = (self.course).lane_segments(lane, &spec, self.checkpoints, &config)?;
        let from = match first {
            0 => None,
            _ => Some(lane_start(&segments, lane, self.checkpoints, start)?),
        };
        let LaneStart {
            segment,
            start: from,
            windows,
            checkpoint,
        } = from.unwrap_or(LaneStart {
            segment: segments.lineage.first_segment(),
            start: StreamStart::Fresh,
            windows: 0,
            checkpoint: None,
        });
        match checkpoint {
            Some(path) => tracing::info!(
                "lane {lane}: resuming from {} (window {windows}), recomputing {} windows to \
                 window {start}",
                path.display(),
                start - windows
            ),
            None if first > 0 => tracing::info!(
                "lane {lane}: no checkpoint at or below window {start}: recomputing it from its \
                 start"
            ),
            None => {}
        }
        let skip = start - windows;
        let writer = self.checkpoints.map(|c| LaneWriter {
            checkpoints: c,
            lane,
            held: VecDeque::new(),
            written: start,
            every_windows: (self.checkpoint_every * self.slice.global_batch
                / u64::from(spec.count))
            .max(1),
        });
        let mut sink = LaneSink {
            lane,
            run: self,
            tx,
            block: Vec::with_capacity(k),
            blocks: start / u64::from(spec.block_windows),
            skip,
            to_skip: skip,
            fast_forward: FastForward::new(format!("lane {lane}"), skip),
            writer,
            tags: (0..segments.lineage.segments.len())
                .map(|k| tag(&segments.lineage, k))
                .collect(),
            segment,
        };
        self.metrics.lane_segment_began(segment, &[]);
        let run = segments.run(segment, from, None, &config, &mut sink)?;
        let blocks = sink.blocks;
        if !run.stopped {
            tracing::info!("lane {lane} ended after {blocks} blocks");
            if let Some(decider) = self.decider {
                decider.lane_ended(lane, blocks);
            }
        }
        if let Some(w) = sink.writer.as_mut() {
            // Shutting down (or ended): the newest snapshot the slowest rank has reached is
            // written whatever --checkpoint-every says, so a restart redoes as little as it can.
            w.flush(self.reached(lane));
        }
        // Stopped or ended, the last count is written: other nodes may still be waiting to
        // learn how far this lane reaches.
        self.publish(lane, blocks, !run.stopped, true);
        Ok(())
    }

    /// How far lane `lane` is, for the other nodes (`now`: write the file at once).
    fn publish(&self, lane: u32, blocks: u64, ended: bool, now: bool) {
        if let Some(p) = self.progress {
            p.advance(lane, LaneFact { blocks, ended }, now);
        }
    }

    /// Lane `lane`'s windows the slowest local rank has reached: checkpoints stay at or below.
    fn reached(&self, lane: u32) -> u64 {
        let block = self.slice.step_block(self.store.slowest());
        lane_windows_before(&self.spec, lane, block)
    }
}

/// A lane's sink: windows dropped up to the lane's start, then gathered into blocks for the
/// node's assembler (`tx`); snapshots handed to the lane's checkpoint writer.
struct LaneSink<'a> {
    lane: u32,
    run: &'a LaneRun<'a>,
    tx: Sender<Vec<PackedWindow>>,
    block: Vec<PackedWindow>,
    /// Blocks sent (counted from the lane's start).
    blocks: u64,
    /// Windows still to drop before the first one sent, of `to_skip`.
    skip: u64,
    to_skip: u64,
    fast_forward: FastForward,
    writer: Option<LaneWriter<'a>>,
    /// Each segment's tag in checkpoints, and the segment running.
    tags: Vec<SegmentTag>,
    segment: usize,
}

impl SegmentSink for LaneSink<'_> {
    fn segment_began(&mut self, k: usize, dropped: &[(String, u64)]) {
        self.segment = k;
        self.run.metrics.lane_segment_began(k, dropped);
    }
}

impl WindowSink for LaneSink<'_> {
    fn keeps_snapshots(&self) -> bool {
        self.writer.is_some()
    }

    fn paces_snapshots(&self) -> bool {
        self.writer.is_some()
    }

    fn document(&mut self, doc: ProducedDoc) {
        (self.run.metrics).count_document_in(self.lane, self.segment as u64, &doc);
    }

    fn packing(&mut self, counters: &PackingCounters, pool_documents: usize) {
        self.run
            .metrics
            .set_packing(self.lane, counters, pool_documents);
    }

    fn window(&mut self, window: PackedWindow, _: &Snapshots) -> anyhow::Result<Flow> {
        if self.skip > 0 {
            self.skip -= 1;
            self.fast_forward.advance(self.to_skip - self.skip);
            return Ok(Flow::Continue);
        }
        self.block.push(window);
        let k = self.run.spec.block_windows as usize;
        if self.block.len() < k {
            return Ok(Flow::Continue);
        }
        let full = std::mem::replace(&mut self.block, Vec::with_capacity(k));
        let full = match self.tx.try_send(full) {
            Ok(()) => None,
            Err(TrySendError::Full(full)) => Some(full),
            Err(TrySendError::Disconnected(_)) => return Ok(Flow::Stop),
        };
        if let Some(full) = full {
            // About to wait for the consumer: say how far this lane is first, so other nodes
            // are never left waiting on a stale file.
            self.run.publish(self.lane, self.blocks, false, true);
            if self.tx.send(full).is_err() {
                return Ok(Flow::Stop);
            }
        }
        self.blocks += 1;
        self.run.publish(self.lane, self.blocks, false, false);
        Ok(Flow::Continue)
    }

    fn snapshot(&mut self, state: PipelineState) -> anyhow::Result<()> {
        if let Some(w) = self.writer.as_mut() {
            let tag = self.tags[self.segment].clone();
            w.add(state, tag, self.run.reached(self.lane));
        }
        Ok(())
    }
}

/// A lane's snapshots since its last checkpoint, and when to write the next: the newest snapshot
/// at or below the windows the slowest rank has reached, once `every_windows` have passed.
struct LaneWriter<'a> {
    checkpoints: &'a LaneCheckpoints,
    lane: u32,
    held: VecDeque<(PipelineState, SegmentTag)>,
    written: u64,
    every_windows: u64,
}

impl LaneWriter<'_> {
    fn add(&mut self, state: PipelineState, tag: SegmentTag, reached: u64) {
        tracing::debug!(
            lane = self.lane,
            windows = state.packer.windows_emitted,
            reached,
            held = self.held.len(),
            "lane snapshot"
        );
        self.held.push_back((state, tag));
        let Some(newest) = self
            .held
            .iter()
            .rposition(|(s, _)| s.packer.windows_emitted <= reached)
        else {
            return;
        };
        if self.held[newest].0.packer.windows_emitted >= self.written + self.every_windows {
            self.write(newest);
        }
        self.held.drain(..newest);
    }

    /// Write the newest held snapshot at or below `reached` if it is newer than the last written.
    fn flush(&mut self, reached: u64) {
        let newest = self
            .held
            .iter()
            .rposition(|(s, _)| s.packer.windows_emitted <= reached);
        if let Some(newest) = newest
            && self.held[newest].0.packer.windows_emitted > self.written
        {
            self.write(newest);
            tracing::info!(
                "lane {}: checkpoint at window {} written on stop",
                self.lane,
                self.written
            );
        }
    }

    fn write(&mut self, at: usize) {
        let (state, tag) = &self.held[at];
        let windows = state.packer.windows_emitted;
        let began = std::time::Instant::now();
        match self.checkpoints.write(self.lane, windows, state, tag) {
            Ok(path) => tracing::debug!(
                "lane {} checkpoint {} ({} buffered, {:.1} ms)",
                self.lane,
                path.display(),
                state.stream.buffered.len(),
                began.elapsed().as_secs_f64() * 1e3
            ),
            Err(e) => tracing::warn!("lane {}: {e:#} (the next one is tried later)", self.lane),
        }
        self.written = windows;
    }
}
