//! The producer of a daemon serving a recipe with `[lanes]`: it runs only the lanes its node
//! owns (`NodeSlice`), each on its own reader thread with a share of the tokenizer threads, and
//! puts their blocks together into this node's part of every global step.
//!
//! ```text
//! lane l: reader → tokenizers → packer ── blocks of K windows, bounded(2) ──┐
//! lane m: …                                                                  ├─▶ node order → StepStore
//! ```
//! Each lane publishes its progress ([`LaneProgress`]) so that every node learns where the
//! stream ends. Resuming (`--resume latest`) recomputes the lanes from their start and drops the
//! windows before the first step asked for: exact, with no checkpoint (lanes have none yet). A lane that runs ahead blocks on its channel: memory stays bounded by the
//! store's prefetch plus two blocks per lane.

use super::metrics::Metrics;
use super::producer::{Ended, StepAssembler};
use super::progress::{LaneFact, LaneProgress};
use super::store::{StepData, StepStore};
use crate::driver::LoadedRecipe;
use crate::driver::lanes::{LaneInputs, Stopped, run_packed};
use crate::driver::pipeline::PipelineConfig;
use anyhow::anyhow;
use crossbeam_channel::{Receiver, TrySendError, bounded};
use dsprep_client::format::Dtype;
use dsprep_mixers::PackedWindow;
use dsprep_mixers::lanes::{NodeSlice, block_lane};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Blocks a lane may have ready beyond the one being consumed.
const LANE_QUEUE_BLOCKS: usize = 2;

pub struct LaneProducer<'a> {
    pub loaded: &'a LoadedRecipe,
    pub inputs: &'a LaneInputs,
    pub slice: NodeSlice,
    pub store: &'a StepStore,
    pub metrics: &'a Metrics,
    /// Shared with the server when other nodes must be heard (more than one node).
    pub progress: Option<Arc<LaneProgress>>,
    pub threads: usize,
    pub chunk_text_bytes: usize,
    pub dtype: Dtype,
    pub wake: &'a zmq::Socket,
    /// Start at the first step a rank asks for (the store is unplaced until then), recomputing
    /// the lanes from their start and dropping the windows before it.
    pub resume: bool,
}

impl LaneProducer<'_> {
    pub fn run(self) -> anyhow::Result<Ended> {
        let lanes = self.slice.lanes();
        let spec = self.inputs.spec;
        let k = spec.block_windows as usize;
        let config = PipelineConfig {
            threads: (self.threads / lanes.len().max(1)).max(1),
            shuffle_fill: None,
            snapshot: None,
            chunk_text_bytes: self.chunk_text_bytes,
        };
        std::thread::scope(|scope| {
            let mut receivers: BTreeMap<u32, Receiver<Vec<PackedWindow>>> = BTreeMap::new();
            let mut handles = BTreeMap::new();
            for &lane in &lanes {
                let (tx, rx) = bounded::<Vec<PackedWindow>>(LANE_QUEUE_BLOCKS);
                receivers.insert(lane, rx);
                let (config, progress) = (&config, self.progress.as_deref());
                let handle = std::thread::Builder::new()
                    .name(format!("dsprep-lane-{lane}"))
                    .spawn_scoped(scope, move || {
                        let stream = self.inputs.stream(self.loaded, lane)?;
                        let mut block = Vec::with_capacity(k);
                        let mut blocks = 0u64;
                        let run = run_packed(
                            self.loaded,
                            stream,
                            config,
                            |source, len| {
                                self.metrics.documents[source as usize]
                                    .fetch_add(1, Ordering::Relaxed);
                                self.metrics.tokens[source as usize]
                                    .fetch_add(len, Ordering::Relaxed);
                            },
                            |window| {
                                block.push(window);
                                if block.len() < k {
                                    return Ok(());
                                }
                                let full = std::mem::replace(&mut block, Vec::with_capacity(k));
                                let full = match tx.try_send(full) {
                                    Ok(()) => None,
                                    Err(TrySendError::Full(full)) => Some(full),
                                    Err(TrySendError::Disconnected(_)) => {
                                        return Err(anyhow!(Stopped));
                                    }
                                };
                                if let Some(full) = full {
                                    // About to wait for the consumer: say how far this lane is
                                    // first, so other nodes are never left waiting on a stale file.
                                    if let Some(p) = progress {
                                        p.advance(
                                            lane,
                                            LaneFact {
                                                blocks,
                                                ended: false,
                                            },
                                            true,
                                        );
                                    }
                                    tx.send(full).map_err(|_| anyhow!(Stopped))?;
                                }
                                blocks += 1;
                                if let Some(p) = progress {
                                    p.advance(
                                        lane,
                                        LaneFact {
                                            blocks,
                                            ended: false,
                                        },
                                        false,
                                    );
                                }
                                Ok(())
                            },
                        )?;
                        if !run.stopped {
                            tracing::info!("lane {lane} ended after {blocks} blocks");
                        }
                        // Stopped or ended, the last count is written: other nodes may still
                        // be waiting to learn how far this lane reaches.
                        if let Some(p) = progress {
                            let ended = !run.stopped;
                            p.advance(lane, LaneFact { blocks, ended }, true);
                        }
                        anyhow::Ok(())
                    })
                    .map_err(|e| anyhow!("cannot start lane {lane}'s thread: {e}"))?;
                handles.insert(lane, handle);
            }
            let ended = self.assemble(&receivers);
            drop(receivers); // a lane still running sees its channel close and stops
            let mut failure = None;
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

    /// Take the node's blocks in order and cut them into its part of each global step, until a
    /// lane ends (or fails: its thread says why) or the store stops.
    fn assemble(&self, receivers: &BTreeMap<u32, Receiver<Vec<PackedWindow>>>) -> Ended {
        let first = match self.resume {
            false => 0,
            true => match self.store.wait_first_request() {
                Ok(step) => step,
                Err(_) => return Ended::Stopped,
            },
        };
        if first > 0 {
            tracing::info!("the first request is for step {first}: recomputing the lanes up to it");
        }
        self.store.place(first);
        let per_step = self.slice.windows_per_step();
        let mut steps = StepAssembler {
            global_batch: per_step,
            dtype: self.dtype,
            next_window: 0,
            keep_from: first * per_step,
            current: StepData {
                step: first,
                tokens: Vec::new(),
                doc_starts: Vec::new(),
            },
        };
        for i in 0.. {
            let (lane, _) = block_lane(&self.inputs.spec, self.slice.block(i));
            let Some(Ok(block)) = receivers.get(&lane).map(Receiver::recv) else {
                return Ended::EndOfData(steps.current.step);
            };
            for window in block {
                let Some(done) = steps.add(window) else {
                    continue;
                };
                if self.store.push(done).is_err() {
                    return Ended::Stopped;
                }
                let _ = self.wake.send(&b""[..], zmq::DONTWAIT);
            }
        }
        Ended::EndOfData(steps.current.step)
    }
}
