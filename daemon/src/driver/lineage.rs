//! A lineage run: the stream of several recipes one after the other
//! ([`dsprep_mixers::lineage`]). Each segment's recipe is built into its own document stream
//! (over every source of the lineage, see [`Lineage::effective_recipe`]) and run through the one
//! run path ([`run_stream`]) until the document where the next recipe takes over; there the
//! pipeline's state is made the next recipe's ([`transplant`]) and the run goes on, the sink
//! seeing one stream of windows. `dsprep serve` and `dsprep pack --lineage` both run through
//! [`Segments::run`]; where a change is made, [`Segments::documents_at_window`] finds the
//! document it takes over at.

use super::pipeline::PipelineConfig;
use super::run::{Flow, RunEnd, Snapshots, StreamStart, WindowSink, run_stream};
use super::stream::{LoadedRecipe, Locator, build_stream};
use anyhow::{Context, anyhow};
use dsprep_mixers::PackedWindow;
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::lineage::{Lineage, transplant};
use std::path::PathBuf;
use std::sync::Arc;

/// A lineage with each segment's recipe loaded (its effective recipe, sharing the first's
/// tokenizer: a change never changes it).
pub struct Segments {
    pub lineage: Lineage,
    pub loaded: Vec<LoadedRecipe>,
}

/// A sink told where segments begin, besides what [`WindowSink`] sees.
pub trait SegmentSink: WindowSink {
    /// Segment `k` takes over (not called for the segment a run starts in); `dropped`: per
    /// source name, the documents of sources it stops drawing from that had been drawn but not
    /// emitted.
    fn segment_began(&mut self, _k: usize, _dropped: &[(String, u64)]) {}
}

impl Segments {
    /// Load every segment's effective recipe over `first` (the stream's tokenizer and stage).
    pub fn load(lineage: Lineage, first: &LoadedRecipe) -> Segments {
        let loaded = (0..lineage.segments.len())
            .map(|k| LoadedRecipe {
                recipe: lineage.effective_recipe(k),
                base: PathBuf::from(&lineage.segments[k].base),
                tokenizer_json: Arc::clone(&first.tokenizer_json),
                stage: Arc::clone(&first.stage),
                plan: None,
                pad_id: first.pad_id,
            })
            .collect();
        Segments { lineage, loaded }
    }

    /// Per segment, per source, its shards' display paths in reading order (what a checkpoint
    /// of the segment must match). Lists every source that the segment reads.
    pub fn shard_names(&self, k: usize) -> anyhow::Result<Vec<Vec<String>>> {
        let stream = build_stream(&self.loaded[k], 1)?;
        Ok(Locator::new(stream.mixer()).shard_names())
    }

    /// Run from segment `k` at `start` to the end of the data (or the sink's stop), crossing
    /// every later change of course. `threads` tokenize (and tokenize ahead in a mix in tokens).
    pub fn run(
        &self,
        mut k: usize,
        mut start: StreamStart,
        config: &PipelineConfig,
        sink: &mut impl SegmentSink,
    ) -> anyhow::Result<RunEnd> {
        loop {
            let loaded = &self.loaded[k];
            let next = self.lineage.segments.get(k + 1);
            let stream = build_stream(loaded, config.threads)?;
            let config = PipelineConfig {
                stop_after_documents: next.map(|s| s.from_documents),
                ..config.clone()
            };
            let end = run_stream(loaded, stream, start, config, loaded.packer(None), sink)?;
            let Some(boundary) = end.boundary else {
                return Ok(end);
            };
            let (state, change) = transplant(boundary, &self.loaded[k + 1].recipe)
                .map_err(|e| anyhow!("the change of course at segment {}: {e}", k + 1))?;
            let names = self.lineage.source_names();
            let dropped: Vec<(String, u64)> = (change.dropped.iter())
                .map(|&(i, n)| (names[usize::from(i)].clone(), n))
                .collect();
            k += 1;
            let s = &self.lineage.segments[k];
            tracing::info!(
                "recipe {} takes over at step {} (window {}, document {}){}",
                s.recipe_hash,
                s.from_step,
                s.from_window,
                s.from_documents,
                if dropped.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; documents drawn but not emitted of sources it no longer draws from, \
                         dropped: {}",
                        (dropped.iter())
                            .map(|(name, n)| format!("{name:?} {n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            );
            sink.segment_began(k, &dropped);
            start = StreamStart::Restore {
                state: Box::new(state),
                what: format!("the change of course to recipe {}", s.recipe_hash),
            };
        }
    }

    /// The document at which a change made at window `window` takes over: the first document
    /// boundary where the packer has emitted `window` windows, running from segment `k` at
    /// `start` (a state with fewer windows than that, or the stream's start).
    pub fn documents_at_window(
        &self,
        k: usize,
        start: StreamStart,
        window: u64,
        config: &PipelineConfig,
    ) -> anyhow::Result<u64> {
        if window == 0 {
            return Ok(0);
        }
        let mut finder = BoundaryFinder {
            window,
            found: None,
        };
        let config = PipelineConfig {
            snapshot: None,
            shuffle_fill: None,
            ..config.clone()
        };
        self.run(k, start, &config, &mut finder)
            .context("finding where the change of course takes over")?;
        finder.found.ok_or_else(|| {
            anyhow!(
                "the stream ends before window {window}: there is no step there to change course at"
            )
        })
    }
}

/// Finds the first document boundary with `window` windows emitted, and stops the run there.
struct BoundaryFinder {
    window: u64,
    found: Option<u64>,
}

impl WindowSink for BoundaryFinder {
    fn keeps_snapshots(&self) -> bool {
        false
    }

    fn pushed(&mut self, documents: u64, windows: u64) {
        if self.found.is_none() && windows >= self.window {
            self.found = Some(documents);
        }
    }

    fn window(&mut self, _: PackedWindow, _: &Snapshots) -> anyhow::Result<Flow> {
        Ok(match self.found {
            Some(_) => Flow::Stop,
            None => Flow::Continue,
        })
    }

    fn snapshot(&mut self, _: PipelineState) -> anyhow::Result<()> {
        Ok(())
    }

    fn chunk_end(&mut self, _: bool, _: &Snapshots) -> anyhow::Result<Flow> {
        Ok(match self.found {
            Some(_) => Flow::Stop,
            None => Flow::Continue,
        })
    }
}

impl SegmentSink for BoundaryFinder {}
