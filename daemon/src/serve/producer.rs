//! The producer thread: runs the pipeline, cuts windows into global steps for the store, and
//! writes checkpoints. On resume it restores the pipeline from the newest checkpoint at or below
//! the step the trainers ask for, recomputes the windows in between and drops them, so the first
//! step it stores is exactly what an uninterrupted daemon would have served.

use super::course::{Course, Placed};
use super::metrics::Metrics;
use super::placement::first_held_step;
use super::store::{StepChain, StepData, StepSegments, StepStore};
use crate::checkpoint::{CheckpointDir, CheckpointMeta, RunIdentity};
use crate::driver::lineage::SegmentSink;
use crate::driver::pipeline::{PipelineConfig, ProducedDoc};
use crate::driver::run::{Flow, Snapshots, StreamStart, WindowSink};
use crate::progress::FastForward;
use anyhow::anyhow;
use dsprep_client::chain::{self, Hash};
use dsprep_client::format::Dtype;
use dsprep_mixers::PackedWindow;
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::packer::PackingCounters;
use std::time::Instant;

/// Checkpointing of a daemon with a state directory.
pub struct Checkpointing<'a> {
    pub dir: &'a CheckpointDir,
    pub run: RunIdentity,
    /// Ask for a checkpoint every this many steps produced.
    pub every: u64,
}

/// How production ended.
pub enum Ended {
    /// The data ended (the store says after how many steps).
    EndOfData,
    /// The store was shut down.
    Stopped,
}

pub struct Producer<'a> {
    pub store: &'a StepStore,
    pub metrics: &'a Metrics,
    pub config: PipelineConfig,
    pub global_batch: u64,
    pub dtype: Dtype,
    pub wake: &'a zmq::Socket,
    /// The stream's lineage (placed: any change of course made).
    pub course: &'a Course,
    /// Ask for a checkpoint every this many steps produced.
    pub checkpoint_every: u64,
}

/// Collects windows into global steps (or a node's part of them), dropping those below the
/// first step to store, with each window's digest. Over the whole stream (`chain` given) it also
/// links the stream chain; a node daemon's part is linked by `LaneChain` instead.
pub(super) struct StepAssembler {
    pub global_batch: u64,
    pub dtype: Dtype,
    /// Index of the next window the packer emits.
    pub next_window: u64,
    /// Windows below this index are recomputed only to get past them (fast-forward).
    pub keep_from: u64,
    pub current: StepData,
    /// The stream chain before `current`'s first window (before `next_window` while
    /// fast-forwarding), when this assembler sees every window of the stream.
    pub chain: Option<Hash>,
    /// Which lineage segment made each step.
    pub segments: StepSegments,
}

impl StepAssembler {
    pub fn add(&mut self, window: PackedWindow) -> Option<StepData> {
        let index = self.next_window;
        self.next_window += 1;
        let step = &mut self.current;
        let from = step.tokens.len();
        self.dtype.extend_bytes(&window.tokens, &mut step.tokens);
        let digest = chain::window_digest(&step.tokens[from..]);
        if index < self.keep_from {
            step.tokens.truncate(from);
            if let Some(at) = &mut self.chain {
                *at = chain::link(at, &digest);
            }
            return None;
        }
        step.doc_starts.push(window.doc_starts);
        step.doc_sources.push(window.doc_sources);
        step.lead_sources.push(window.lead_source);
        step.real_tokens.push(window.real_tokens);
        step.digests.push(digest);
        if step.doc_starts.len() as u64 == self.global_batch {
            let mut next = StepData::new(step.step + 1, self.global_batch as usize);
            next.tokens.reserve(step.tokens.len());
            let mut done = std::mem::replace(step, next);
            done.segment = self.segments.at(done.step);
            if let Some(at) = &mut self.chain {
                done.chain = StepChain::linked(*at, &done.digests);
                *at = done.chain.step_end;
            }
            return Some(done);
        }
        None
    }

    /// The stream chain before `next_window` (when this assembler links it).
    pub fn chain_now(&self) -> Option<Hash> {
        let at = self.chain?;
        Some(
            self.current
                .digests
                .iter()
                .fold(at, |at, digest| chain::link(&at, digest)),
        )
    }
}

impl Producer<'_> {
    /// Run from `start` to the end of the data or a shutdown.
    pub fn run(self, mut start: Placed) -> anyhow::Result<Ended> {
        let change = start.change.take();
        // Steps and windows as they will be: with a change of course to make, its lineage.
        let lineage = match &change {
            Some(change) => &change.prospective,
            None => &self.course.segments.lineage,
        };
        let resume = match start.resume {
            Some(resume) if resume.meta.chain.is_none() => {
                tracing::warn!(
                    "checkpoint {} was written before checkpoints held the stream chain: not \
                     used, the stream is recomputed from its start",
                    resume.path.display()
                );
                None
            }
            other => other,
        };
        let mut resume_note = None;
        let (chain_at, windows, from) = match resume {
            Some(resume) => {
                let chain_at = (resume.meta.chain.as_deref())
                    .and_then(chain::from_hex)
                    .ok_or_else(|| {
                        anyhow!(
                            "checkpoint {}: its chain is not 64 hex digits",
                            resume.path.display()
                        )
                    })?;
                let windows = resume.state.packer.windows_emitted;
                let first = first_held_step(lineage, start.step, windows, self.global_batch);
                let resumed = format!(
                    "resuming from checkpoint {} (step {}, {} documents in, {} buffered)",
                    resume.path.display(),
                    resume.meta.step,
                    resume.state.stream.emitted,
                    resume.state.stream.buffered.len(),
                );
                let then = format!(
                    "fast-forwarding {} windows to step {first} (serving from step {}, and the \
                     steps below it from {first} to ranks that ask late)",
                    lineage
                        .window_of_step(first)
                        .saturating_sub(resume.meta.windows),
                    start.step
                );
                resume_note = Some((resumed, then));
                let from = StreamStart::Restore {
                    what: format!("resume from {}", resume.path.display()),
                    state: Box::new(resume.state),
                };
                (chain_at, windows, from)
            }
            None => {
                if start.step > 0 {
                    let first = first_held_step(lineage, start.step, 0, self.global_batch);
                    tracing::warn!(
                        "no checkpoint at or below step {}: recomputing the stream from its \
                         start (fast-forwarding {} windows to step {first})",
                        start.step,
                        lineage.window_of_step(first)
                    );
                }
                (chain::START, 0, StreamStart::Fresh)
            }
        };
        let first = first_held_step(lineage, start.step, windows, self.global_batch);
        self.store.place(first, start.step);
        let steps = StepAssembler {
            global_batch: self.global_batch,
            dtype: self.dtype,
            next_window: windows,
            keep_from: lineage.window_of_step(first),
            current: StepData::new(first, self.global_batch as usize),
            chain: Some(chain_at),
            segments: StepSegments::of(lineage),
        };
        let fast_forward =
            FastForward::new("resume".into(), steps.keep_from.saturating_sub(windows));
        let mut checkpoints = (self.course.kept.as_ref()).map(|(_, dir)| Checkpointing {
            dir,
            run: self.course.identity(),
            every: self.checkpoint_every,
        });
        // A later change of the global batch ends what this daemon can serve: its layout cuts
        // the stream into steps only up to there.
        let batch_ends = (lineage.segments.iter())
            .find(|s| s.from_step > start.step && s.global_batch != self.global_batch)
            .map(|s| (s.from_step, s.from_window, s.global_batch));
        let mut sink = StepSink {
            store: self.store,
            metrics: self.metrics,
            wake: self.wake,
            checkpoints: checkpoints.take(),
            segment: start.segment,
            batch_ends,
            steps,
            from_window: windows,
            fast_forward,
            resume_note,
            kept: HeldSnapshots::new(start.step),
        };
        // The segment this run starts in (a resume past a change starts in it).
        self.metrics.segment_began(start.segment, &[]);
        let run = match change {
            None => {
                let built = start.built.take().map(|stream| *stream);
                (self.course.segments).run(start.segment, from, built, &self.config, &mut sink)?
            }
            Some(change) => {
                // Up to the change on this thread, then the change written, then the rest.
                let began = Instant::now();
                let base = &change.base;
                let live = base.run_to_change(start.segment, from, change.window, &mut sink)?;
                let Some(live) = live else {
                    return Ok(Ended::Stopped);
                };
                let (segments, shards) =
                    self.course.commit_change(&change, live.documents, began)?;
                if let Some(c) = &mut sink.checkpoints {
                    c.run.lineage = segments.lineage.clone();
                    c.run.shards = shards;
                }
                segments.run_from_live(change.kept, live, &self.config, &mut sink)?
            }
        };
        if run.stopped {
            return Ok(Ended::Stopped);
        }
        if !sink.steps.current.doc_starts.is_empty() {
            tracing::info!(
                windows = sink.steps.current.doc_starts.len(),
                "the last, incomplete global batch is not served (every rank gets the same steps)"
            );
        }
        self.store.finish();
        // Requests parked for the step past the last are answered now (end of data), not when
        // the drain below ends.
        let _ = self.wake.send(&b""[..], zmq::DONTWAIT);
        // The ranks still have the prefetched steps to read: the checkpoints due meanwhile, and
        // on shutdown, are written from what is held.
        if let Some(c) = &sink.checkpoints {
            let mut slowest = self.store.slowest();
            loop {
                sink.kept.checkpoint(c, slowest, false);
                match self.store.wait_slowest_past(slowest) {
                    Ok(now) => slowest = now,
                    Err(_) => {
                        sink.kept.checkpoint(c, self.store.slowest(), true);
                        break;
                    }
                }
            }
        }
        Ok(Ended::EndOfData)
    }
}

/// The single daemon's sink: windows into global steps for the store, snapshots held until the
/// slowest rank reaches them, then written as checkpoints.
struct StepSink<'a> {
    store: &'a StepStore,
    metrics: &'a Metrics,
    wake: &'a zmq::Socket,
    checkpoints: Option<Checkpointing<'a>>,
    /// The lineage segment whose recipe makes the documents now.
    segment: usize,
    /// Where a change of the global batch ends what this daemon serves: its step, window and
    /// global batch.
    batch_ends: Option<(u64, u64, u64)>,
    steps: StepAssembler,
    from_window: u64,
    fast_forward: FastForward,
    /// What to say once restored from a checkpoint: before and after the time it took.
    resume_note: Option<(String, String)>,
    kept: HeldSnapshots,
}

impl WindowSink for StepSink<'_> {
    fn keeps_snapshots(&self) -> bool {
        self.checkpoints.is_some()
    }

    fn paces_snapshots(&self) -> bool {
        self.checkpoints.is_some()
    }

    fn started(&mut self, restored_in: Option<std::time::Duration>) {
        if let (Some((resumed, then)), Some(took)) = (self.resume_note.take(), restored_in) {
            tracing::info!("{resumed} in {:.2} s; {then}", took.as_secs_f64());
        }
    }

    fn document(&mut self, doc: ProducedDoc) {
        self.metrics.count_document(0, &doc);
    }

    fn packing(&mut self, counters: &PackingCounters, pool_documents: usize) {
        self.metrics.set_packing(0, counters, pool_documents);
    }

    fn window(&mut self, window: PackedWindow, _: &Snapshots) -> anyhow::Result<Flow> {
        if let Some((step, at, global_batch)) = self.batch_ends
            && self.steps.next_window == at
        {
            self.store.fail(format!(
                "the stream's global batch changes at step {step} to {global_batch} windows: \
                 restart the daemon with world size × micro batch = {global_batch} to serve it"
            ));
            return Ok(Flow::Stop);
        }
        let added = self.steps.add(window);
        (self.fast_forward).advance(self.steps.next_window - self.from_window);
        let Some(done) = added else {
            return Ok(Flow::Continue);
        };
        if self.store.push(done).is_err() {
            return Ok(Flow::Stop);
        }
        let _ = self.wake.send(&b""[..], zmq::DONTWAIT);
        Ok(Flow::Continue)
    }

    fn snapshot(&mut self, state: PipelineState) -> anyhow::Result<()> {
        // Taken where the steps have every window the packer emitted: its chain is the chain
        // there.
        if let Some(c) = &self.checkpoints
            && let Some(chain) = self.steps.chain_now()
        {
            self.kept.add(c, self.segment, state, chain);
        }
        Ok(())
    }

    fn chunk_end(&mut self, stopping: bool, _: &Snapshots) -> anyhow::Result<Flow> {
        if let Some(c) = &self.checkpoints {
            self.kept.checkpoint(c, self.store.slowest(), stopping);
        }
        Ok(Flow::Continue)
    }
}

impl SegmentSink for StepSink<'_> {
    fn segment_began(&mut self, k: usize, dropped: &[(String, u64)]) {
        self.segment = k;
        self.metrics.segment_began(k, dropped);
    }
}

/// Snapshots taken since the slowest rank's position, in memory, oldest first, at most one per
/// step. The reader takes about one per step wherever the stream is ([`WindowSink::paces_snapshots`]), so
/// whatever step a trainer resumes from, a snapshot lies at or just below it. A checkpoint is
/// useful only at or below the step a trainer will resume from, and trainers are behind the
/// pipeline (by up to `prefetch` steps, and the chunks in flight): so once the slowest rank has
/// reached a multiple of `every`, the newest snapshot at or below that multiple is written; on
/// shutdown, the newest at or below the slowest rank. This holds about `prefetch + 2` of them.
struct HeldSnapshots {
    held: std::collections::VecDeque<(CheckpointMeta, PipelineState)>,
    /// The step of the last checkpoint written (or where this run started).
    written: u64,
    /// The last multiple of `every` a checkpoint was written for (or where this run started).
    covered: u64,
}

impl HeldSnapshots {
    fn new(start: u64) -> Self {
        HeldSnapshots {
            held: Default::default(),
            written: start,
            covered: start,
        }
    }

    fn add(&mut self, c: &Checkpointing, segment: usize, state: PipelineState, chain: Hash) {
        let documents = state.stream.emitted;
        let meta = c
            .run
            .meta(segment, state.packer.windows_emitted, documents, chain);
        tracing::debug!(step = meta.step, held = self.held.len(), "snapshot taken");
        if self.held.back().is_some_and(|(m, _)| m.step == meta.step) {
            self.held.pop_back(); // the newer one is as good and more recent
        }
        self.held.push_back((meta, state));
    }

    /// The index of the newest held snapshot at or below `step`.
    fn newest_at_or_below(&self, step: u64) -> Option<usize> {
        self.held.iter().rposition(|(m, _)| m.step <= step)
    }

    /// Write what is due with the slowest rank at `slowest`: for each multiple of `every` it has
    /// reached since the last call, the newest snapshot at or below that multiple; on
    /// shutdown (`stopping`), the newest at or below `slowest`, or a line saying why none is.
    /// Then drop what the slowest rank has passed. A write that fails (a full disk, say) is
    /// logged and serving goes on: the next is tried at the next multiple, and the checkpoints
    /// already written stay usable (a failed write leaves no file).
    fn checkpoint(&mut self, c: &Checkpointing, slowest: u64, stopping: bool) {
        // Every multiple the slowest rank has reached since the last call: a chunk of long
        // documents can carry it past several.
        let mut multiple = (self.covered / c.every + 1) * c.every;
        while multiple <= slowest {
            let below = self.newest_at_or_below(multiple);
            if let Some(at) = below
                && self.held[at].0.step > self.written
            {
                self.write(c, at);
            }
            if below.is_none() || self.written + c.every <= multiple {
                // Snapshots fall between documents: one document spans these steps.
                tracing::info!(
                    "the checkpoint for step {multiple} is at step {}, more than {} steps below \
                     it: no document ends in between (checkpoints fall between documents)",
                    self.written,
                    c.every
                );
            }
            self.covered = multiple;
            multiple += c.every;
        }
        if stopping {
            match self.newest_at_or_below(slowest) {
                Some(at) if self.held[at].0.step > self.written => self.write(c, at),
                Some(_) => tracing::info!(
                    "stopping: the newest checkpoint, step {}, is the slowest rank's (step \
                     {slowest}) latest; none written",
                    self.written
                ),
                None => tracing::warn!(
                    "stopping: NO CHECKPOINT WRITTEN for the slowest rank's step {slowest}: {}",
                    match self.held.front() {
                        Some((m, _)) => format!(
                            "the oldest snapshot held is of step {}, above it (the ranks \
                             have not reached the stream's first snapshot)",
                            m.step
                        ),
                        None => "no snapshot has been taken yet (the shuffle buffer is still \
                                 filling, or no chunk of documents has been packed)"
                            .to_string(),
                    }
                ),
            }
        }
        if let Some(reached) = self.newest_at_or_below(slowest) {
            self.held.drain(..reached);
        }
    }

    fn write(&mut self, c: &Checkpointing, at: usize) {
        let (meta, state) = &self.held[at];
        let step = meta.step;
        if let Err(e) = write_checkpoint(c, meta, state) {
            tracing::warn!(
                "CHECKPOINT NOT WRITTEN, serving goes on (the next is tried at the next multiple \
                 of {} steps; the newest written stays the one to resume from): {e:#}",
                c.every
            );
        }
        self.written = step;
    }
}

fn write_checkpoint(
    c: &Checkpointing,
    meta: &CheckpointMeta,
    state: &PipelineState,
) -> anyhow::Result<()> {
    let began = Instant::now();
    let path = c.dir.write(meta, state)?;
    tracing::info!(
        "checkpoint {} written: step {}, {} documents in, {} buffered, {:.1} ms",
        path.display(),
        meta.step,
        state.stream.emitted,
        state.stream.buffered.len(),
        began.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
