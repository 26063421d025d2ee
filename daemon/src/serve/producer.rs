//! The producer thread: runs the pipeline, cuts windows into global steps for the store, and
//! writes checkpoints. On resume it restores the pipeline from the newest checkpoint at or below
//! the step the trainers ask for, recomputes the windows in between and drops them, so the first
//! step it stores is exactly what an uninterrupted daemon would have served.

use super::metrics::Metrics;
use super::store::{HISTORY_STEPS, StepChain, StepData, StepStore};
use crate::checkpoint::{CheckpointDir, CheckpointMeta, RunIdentity};
use crate::driver::pipeline::{self, PipelineConfig};
use crate::driver::pretokenize::Pretokenized;
use crate::driver::{LoadedRecipe, Locator};
use crate::progress::FastForward;
use anyhow::{Context, anyhow};
use dsprep_client::chain::{self, Hash};
use dsprep_client::format::Dtype;
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::{DocStream, PackedWindow, Packer};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Checkpointing of a daemon with a state directory.
pub struct Checkpointing {
    pub dir: CheckpointDir,
    pub run: RunIdentity,
    /// Ask for a checkpoint every this many steps produced.
    pub every: u64,
}

/// Where production starts: the step to store first, and the checkpoint to get there from.
pub struct Start {
    pub step: u64,
    pub resume: Option<crate::checkpoint::Loaded>,
}

/// How production ended.
pub enum Ended {
    /// The data ended after this many steps.
    EndOfData(u64),
    /// The store was shut down.
    Stopped,
}

pub struct Producer<'a> {
    pub loaded: &'a LoadedRecipe,
    pub store: &'a StepStore,
    pub metrics: &'a Metrics,
    pub config: PipelineConfig,
    pub global_batch: u64,
    pub dtype: Dtype,
    pub wake: &'a zmq::Socket,
    pub checkpoints: Option<Checkpointing>,
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
        step.digests.push(digest);
        if step.doc_starts.len() as u64 == self.global_batch {
            let mut next = StepData::new(step.step + 1, self.global_batch as usize);
            next.tokens.reserve(step.tokens.len());
            let mut done = std::mem::replace(step, next);
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
    pub fn run(
        mut self,
        mut stream: DocStream<Pretokenized>,
        start: Start,
    ) -> anyhow::Result<Ended> {
        let recipe = &self.loaded.recipe;
        let window_tokens = recipe.packing.window_tokens();
        let mut packer = Packer::new(window_tokens);
        let mut chain_at = chain::START;
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
        if let Some(resume) = resume {
            chain_at = resume
                .meta
                .chain
                .as_deref()
                .and_then(chain::from_hex)
                .ok_or_else(|| {
                    anyhow!(
                        "checkpoint {}: its chain is not 64 hex digits",
                        resume.path.display()
                    )
                })?;
            let began = Instant::now();
            stream
                .restore(&resume.state.stream)
                .with_context(|| format!("resume from {}", resume.path.display()))?;
            packer = Packer::from_state(window_tokens, resume.state.packer).ok_or_else(|| {
                anyhow!(
                    "resume from {}: the packer state does not fit windows of {window_tokens} \
                     tokens",
                    resume.path.display()
                )
            })?;
            let first = first_kept_step(start.step, packer.windows_emitted(), self.global_batch);
            tracing::info!(
                "resuming from checkpoint {} (step {}, {} documents in, {} buffered) in {:.2} s; \
                 fast-forwarding {} windows to step {first} (serving from step {}, and the steps \
                 below it from {first} to ranks that ask late)",
                resume.path.display(),
                resume.meta.step,
                resume.state.stream.emitted,
                resume.state.stream.buffered.len(),
                began.elapsed().as_secs_f64(),
                (first * self.global_batch).saturating_sub(resume.meta.windows),
                start.step
            );
        } else if start.step > 0 {
            let first = first_kept_step(start.step, 0, self.global_batch);
            tracing::warn!(
                "no checkpoint at or below step {}: recomputing the stream from its start \
                 (fast-forwarding {} windows to step {first})",
                start.step,
                first * self.global_batch
            );
        }
        let first = first_kept_step(start.step, packer.windows_emitted(), self.global_batch);
        self.store.place(first, start.step);
        let mut steps = StepAssembler {
            global_batch: self.global_batch,
            dtype: self.dtype,
            next_window: packer.windows_emitted(),
            keep_from: first * self.global_batch,
            current: StepData::new(first, self.global_batch as usize),
            chain: Some(chain_at),
        };
        let from_window = steps.next_window;
        let mut fast_forward =
            FastForward::new("resume".into(), steps.keep_from.saturating_sub(from_window));
        let snapshot = Arc::new(AtomicBool::new(false));
        if self.checkpoints.is_some() {
            self.config.snapshot = Some(Arc::clone(&snapshot));
        }
        let mut kept = Snapshots {
            held: Default::default(),
            written: start.step,
        };
        let locator = Locator::new(stream.mixer());
        let locate = |pos: &dsprep_mixers::DocPos| locator.locate(pos);
        let mut stopped = false;
        let mut windows = Vec::new();
        let result = pipeline::run(stream, &self.loaded.stage, &self.config, &locate, |chunk| {
            for doc in chunk.docs() {
                let start = packer.position_tokens();
                self.metrics.count_document(0, &doc.produced(start));
                packer.push_doc(doc.tokens, doc.source, &mut windows);
            }
            for window in windows.drain(..) {
                let added = steps.add(window);
                fast_forward.advance(steps.next_window - from_window);
                let Some(done) = added else {
                    continue;
                };
                if self.store.push(done).is_err() {
                    stopped = true;
                    break;
                }
                let _ = self.wake.send(&b""[..], zmq::DONTWAIT);
                // One snapshot per step at most: the reader attaches it to the next chunk.
                snapshot.store(true, Ordering::Release);
            }
            let Some(c) = &self.checkpoints else {
                return if stopped {
                    Err(anyhow!("stopped"))
                } else {
                    Ok(())
                };
            };
            // A snapshot is taken where the steps have every window the packer emitted (not
            // when a stop cut the loop above short): its chain is the chain there.
            if let Some(state) = chunk.state
                && steps.next_window == packer.windows_emitted()
                && let Some(chain) = steps.chain_now()
            {
                kept.add(c, *state, &packer, chain);
            }
            kept.checkpoint(c, self.store.slowest(), stopped);
            if stopped {
                return Err(anyhow!("stopped"));
            }
            Ok(())
        });
        match result {
            Ok(_) if stopped => Ok(Ended::Stopped),
            Ok(_) => {
                if !steps.current.doc_starts.is_empty() {
                    tracing::info!(
                        windows = steps.current.doc_starts.len(),
                        "the last, incomplete global batch is not served (every rank gets the \
                         same steps)"
                    );
                }
                Ok(Ended::EndOfData(steps.current.step))
            }
            Err(_) if stopped => Ok(Ended::Stopped),
            Err(e) => Err(e),
        }
    }
}

/// The first step a daemon starting at `start` (the lowest step asked for) holds, with the
/// pipeline at `windows` (restored from a checkpoint, or 0): up to [`HISTORY_STEPS`] below
/// `start`, as an uninterrupted daemon holds them, as far as the checkpoint reaches. A rank whose
/// request was lost with a killed daemon asks again only after its timeout, when the others may
/// have placed the new daemon above its step: it still finds its step.
fn first_kept_step(start: u64, windows: u64, global_batch: u64) -> u64 {
    start
        .saturating_sub(HISTORY_STEPS)
        .max(windows.div_ceil(global_batch))
        .min(start)
}

/// Snapshots taken since the slowest rank's position, in memory, newest last. A checkpoint is
/// useful only at or below the step a trainer will resume from, and trainers are behind the
/// pipeline (by up to `prefetch` steps, and the chunks in flight): so checkpoints are written from
/// the newest snapshot at or below the slowest rank, every `every` steps and on shutdown.
/// At most one snapshot per step is taken, so this holds about `prefetch + 2` of them.
struct Snapshots {
    held: std::collections::VecDeque<(CheckpointMeta, PipelineState)>,
    /// The step of the last checkpoint written (or where this run started).
    written: u64,
}

impl Snapshots {
    fn add(
        &mut self,
        c: &Checkpointing,
        stream: dsprep_mixers::StreamState,
        packer: &Packer,
        chain: Hash,
    ) {
        let meta = c.run.meta(packer.windows_emitted(), chain);
        tracing::debug!(step = meta.step, held = self.held.len(), "snapshot taken");
        if self.held.back().is_some_and(|(m, _)| m.step == meta.step) {
            self.held.pop_back(); // the newer one is as good and more recent
        }
        self.held.push_back((
            meta,
            PipelineState {
                stream,
                packer: packer.state(),
            },
        ));
    }

    /// Drop what the slowest rank has passed, and write the newest snapshot it has reached if
    /// `every` steps have passed since the last checkpoint (or `now`, on shutdown). A write that
    /// fails (a full disk, say) is logged and serving goes on: the next is tried `every` steps
    /// later, and the checkpoints already written stay usable (a failed write leaves no file).
    fn checkpoint(&mut self, c: &Checkpointing, slowest: u64, now: bool) {
        let reached = self.held.iter().rposition(|(m, _)| m.step <= slowest);
        let Some(reached) = reached else {
            return;
        };
        self.held.drain(..reached);
        let step = self.held[0].0.step;
        let due = step > self.written && (now || step >= self.written + c.every);
        if due {
            let (meta, state) = &self.held[0];
            if let Err(e) = write_checkpoint(c, meta, state) {
                tracing::warn!(
                    "CHECKPOINT NOT WRITTEN, serving goes on (the next is tried {} steps later; the \
                     newest written stays the one to resume from): {e:#}",
                    c.every
                );
            }
            self.written = step;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_daemon_keeps_the_history_its_checkpoint_reaches() {
        assert_eq!(
            first_kept_step(123, 0, 4),
            123 - HISTORY_STEPS,
            "no checkpoint"
        );
        assert_eq!(
            first_kept_step(123, 470, 4),
            118,
            "a checkpoint at window 470"
        );
        assert_eq!(
            first_kept_step(123, 492, 4),
            123,
            "a checkpoint at the step asked for"
        );
        assert_eq!(first_kept_step(3, 0, 4), 0);
        assert_eq!(first_kept_step(0, 0, 4), 0);
    }
}
