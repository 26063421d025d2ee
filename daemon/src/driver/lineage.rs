//! A lineage run: the stream of several recipes one after the other
//! ([`dsprep_mixers::lineage`]). Each segment's recipe is built into its own document stream
//! (over every source of the lineage, see [`Lineage::effective_recipe`]) and run through the one
//! run path ([`run_stream`]) until the document where the next recipe takes over; there the
//! pipeline's state is made the next recipe's ([`transplant`]) and the run goes on, the sink
//! seeing one stream of windows. `dsprep serve` and `dsprep pack --lineage` both run through
//! [`Segments::run`]; where a change is made, [`Segments::documents_at_window`] finds the
//! document it takes over at. A lane of a laned stream runs the same way over its own lineage
//! ([`Segments::for_lane`]: its streams built from each segment's dealt input).

use super::lanes::LaneInputs;
use super::pipeline::{ChunkDoc, PipelineConfig};
use super::pretokenize::Pretokenized;
use super::run::{
    Flow, RunEnd, Snapshots, StreamStart, WindowSink, deliver, open_start, pack_doc, run_stream,
};
use super::stream::{LoadedRecipe, Locator, build_stream};
use anyhow::{Context, anyhow, bail};
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::lineage::{Lineage, transplant};
use dsprep_mixers::packer::{PackingCounters, transplant_packer};
use dsprep_mixers::recipe::PackStrategy;
use dsprep_mixers::{DocStream, PackedWindow, WindowPacker};
use std::path::PathBuf;
use std::sync::Arc;

/// A lineage with each segment's recipe loaded (its effective recipe, sharing the first's
/// tokenizer: a change never changes it).
pub struct Segments {
    pub lineage: Lineage,
    pub loaded: Vec<LoadedRecipe>,
    /// A lane's segments: the lane, and each segment's input dealt to the lanes.
    pub lane: Option<(u32, Vec<Arc<LaneInputs>>)>,
}

/// The sources segment `k` of a laned stream deals to its lanes, in order: every source that takes
/// part in it or in an earlier segment, by the first segment it takes part in, then in recipe
/// order. Segment 0 deals what its recipe alone would; a source a change stops drawing from keeps
/// its units in their lanes (its cursor counts in them), and one a change starts drawing from is
/// dealt after the others, so no other source's units move to another lane.
fn dealt_sources(lineage: &Lineage, k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::new();
    for j in 0..=k {
        let recipe = lineage.effective_recipe(j);
        for i in 0..recipe.sources.len() {
            if recipe.takes_part(i) && !order.contains(&i) {
                order.push(i);
            }
        }
    }
    order
}

/// A sink told where segments begin, besides what [`WindowSink`] sees.
pub trait SegmentSink: WindowSink {
    /// Segment `k` takes over (not called for the segment a run starts in); `dropped`: per
    /// source name, the documents of sources it stops drawing from that had been drawn but not
    /// emitted.
    fn segment_began(&mut self, _k: usize, _dropped: &[(String, u64)]) {}

    /// Segment `k`'s packer takes over (after [`SegmentSink::segment_began`]): the first window
    /// it makes is `first_window` (at or past the segment's `from_window`: the windows the old
    /// packer emitted at the boundary document are the old packing's), and `ended` holds the
    /// counters of a `best_fit` packing a `concat` one follows.
    fn packer_took_over(
        &mut self,
        _k: usize,
        _first_window: u64,
        _ended: Option<&PackingCounters>,
    ) {
    }
}

impl Segments {
    /// Load every segment's effective recipe over `first` (the stream's tokenizer and stage),
    /// each with its own pad (a change may change it).
    pub fn load(lineage: Lineage, first: &LoadedRecipe) -> anyhow::Result<Segments> {
        let loaded = (0..lineage.segments.len())
            .map(|k| {
                let recipe = lineage.effective_recipe(k);
                // The first's pad when it is the same (resolving another may parse the
                // tokenizer's JSON).
                let same =
                    first.recipe.packing.pads() && first.recipe.packing.pad == recipe.packing.pad;
                let pad_id = match recipe.packing.strategy {
                    PackStrategy::Concat => first.stage.eos_id(),
                    PackStrategy::BestFit if same => first.pad_id,
                    PackStrategy::BestFit => (first.stage)
                        .resolve_pad(recipe.packing.pad.as_ref())
                        .map_err(|e| {
                            anyhow!(
                                "segment {k} (recipe {}): {e}",
                                lineage.segments[k].recipe_hash
                            )
                        })?,
                };
                let dealt_sources = recipe.lanes.map(|_| dealt_sources(&lineage, k));
                Ok(LoadedRecipe {
                    recipe,
                    base: PathBuf::from(&lineage.segments[k].base),
                    tokenizer_json: Arc::clone(&first.tokenizer_json),
                    stage: Arc::clone(&first.stage),
                    plan: None,
                    pad_id,
                    dealt_sources,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Segments {
            lineage,
            loaded,
            lane: None,
        })
    }

    /// Lane `lane`'s segments: `lineage` is the lane's own ([`Lineage::for_lane`]), `inputs`
    /// each segment's input dealt to the lanes.
    pub fn for_lane(
        lineage: Lineage,
        first: &LoadedRecipe,
        lane: u32,
        inputs: Vec<Arc<LaneInputs>>,
    ) -> anyhow::Result<Segments> {
        Ok(Segments {
            lane: Some((lane, inputs)),
            ..Segments::load(lineage, first)?
        })
    }

    /// Segment `k`'s stream (the lane's, for a lane's segments).
    fn build(&self, k: usize, threads: usize) -> anyhow::Result<DocStream<Pretokenized>> {
        match &self.lane {
            None => build_stream(&self.loaded[k], threads),
            Some((lane, inputs)) => inputs[k].stream(&self.loaded[k], *lane, threads),
        }
    }

    /// Segment `k`'s packer (a lane's own for a lane's segments).
    fn packer(&self, k: usize) -> dsprep_mixers::PackerConfig {
        self.loaded[k].packer(self.lane.as_ref().map(|(lane, _)| *lane))
    }

    /// Segment `k`'s stream built (every source it reads listed, `threads` tokenizing ahead in
    /// a mix in tokens), and per source its shards' display paths in reading order (what a
    /// checkpoint of the segment must match). A run of the segment may take the stream
    /// ([`Segments::run`]'s `built`), so its sources are listed once.
    pub fn list(
        &self,
        k: usize,
        threads: usize,
    ) -> anyhow::Result<(Vec<Vec<String>>, DocStream<Pretokenized>)> {
        let stream = self.build(k, threads)?;
        Ok((Locator::new(stream.mixer()).shard_names(), stream))
    }

    /// Run from segment `k` at `start` to the end of the data (or the sink's stop), crossing
    /// every later change of course. `threads` tokenize (and tokenize ahead in a mix in tokens).
    /// `built`: segment `k`'s stream, when the caller has built it already (its sources, and
    /// the Hub client that marks what it verified, are then the caller's).
    pub fn run(
        &self,
        mut k: usize,
        mut start: StreamStart,
        mut built: Option<DocStream<Pretokenized>>,
        config: &PipelineConfig,
        sink: &mut impl SegmentSink,
    ) -> anyhow::Result<RunEnd> {
        loop {
            let loaded = &self.loaded[k];
            let next = self.lineage.segments.get(k + 1);
            let stream = match built.take() {
                Some(stream) => stream,
                None => self.build(k, config.threads)?,
            };
            let config = PipelineConfig {
                stop_after_documents: next.map(|s| s.from_documents),
                // Decisions are made in the newest segment only; earlier ones replay theirs.
                decider: config.decider.clone().filter(|_| next.is_none()),
                ..config.clone()
            };
            let end = run_stream(loaded, stream, start, config, self.packer(k), sink)?;
            let Some(boundary) = end.boundary else {
                return Ok(end);
            };
            k += 1;
            let state = self.take_over(k, boundary, sink)?;
            start = StreamStart::Restore {
                state: Box::new(state),
                what: format!(
                    "the change of course to recipe {}",
                    self.lineage.segments[k].recipe_hash
                ),
            };
        }
    }

    /// Segment `k`'s recipe takes over from `state` (where the one before stopped): the state
    /// made its own (the packer's made its packing's: [`transplant_packer`]), the log line and
    /// the sink told (what was dropped, by source name; where its packer begins).
    fn take_over(
        &self,
        k: usize,
        state: PipelineState,
        sink: &mut impl SegmentSink,
    ) -> anyhow::Result<PipelineState> {
        let (mut state, change) = transplant(state, &self.loaded[k].recipe)
            .map_err(|e| anyhow!("the change of course at segment {k}: {e}"))?;
        let packing = transplant_packer(std::mem::take(&mut state.packer), &self.packer(k));
        state.packer = packing.state;
        let names = self.lineage.source_names();
        let dropped: Vec<(String, u64)> = (change.dropped.iter())
            .map(|&(i, n)| (names[usize::from(i)].clone(), n))
            .collect();
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
        sink.packer_took_over(k, state.packer.windows_emitted, packing.ended.as_ref());
        Ok(state)
    }

    /// Run segment `k` from `start` on this thread (no pipeline: the documents before a change
    /// are few when a checkpoint is near) until its packer has emitted `window` windows, handing
    /// `sink` every document and every window below `window` as [`Segments::run`] would. Returns
    /// the stream live at the first document boundary there (`None`: the sink stopped), for
    /// [`Segments::run_from_live`] once the change is written.
    pub fn run_to_change(
        &self,
        k: usize,
        start: StreamStart,
        window: u64,
        sink: &mut impl SegmentSink,
    ) -> anyhow::Result<Option<Live>> {
        let loaded = &self.loaded[k];
        let began = std::time::Instant::now();
        let mut stream = self.build(k, 1)?;
        let (mut packer, restored, mut documents) =
            open_start(loaded, &mut stream, start, self.packer(k))?;
        sink.started(restored.then(|| began.elapsed()));
        let locator = Locator::new(stream.mixer());
        let snapshots = Snapshots::unused();
        let (mut windows, mut held, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        while packer.windows_emitted() < window {
            let Some(mut doc) = stream.next_doc()? else {
                bail!(
                    "the stream ends after {} windows, before window {window}: there is no step \
                     there to change course at",
                    packer.windows_emitted()
                );
            };
            match doc.tokens.take() {
                Some(tokens) => ids = tokens,
                None => {
                    ids.clear();
                    (loaded.stage.encode_doc(&doc.text, &mut ids))
                        .map_err(|e| anyhow!(e).context(locator.locate(&doc.pos)))?;
                }
            }
            let doc = ChunkDoc {
                source: doc.pos.source,
                piece: doc.pos.piece,
                tokens: &ids,
            };
            pack_doc(&mut packer, doc, &mut documents, &mut windows, sink);
            // Windows at and past the change's open the next recipe's first step: given once the
            // change is made.
            let past = packer.windows_emitted().saturating_sub(window) as usize;
            held.extend(windows.drain(windows.len() - past.min(windows.len())..));
            if deliver(&packer, &mut windows, sink, &snapshots)? {
                return Ok(None);
            }
        }
        Ok(Some(Live {
            documents,
            stream,
            packer,
            held,
        }))
    }

    /// Go on from `live` (stopped where segment `k` takes over) to the end of the data: the
    /// state made segment `k`'s with the documents in memory moved over (none read again), the
    /// windows held at the change given to `sink`, then every later segment.
    pub fn run_from_live(
        &self,
        k: usize,
        live: Live,
        config: &PipelineConfig,
        sink: &mut impl SegmentSink,
    ) -> anyhow::Result<RunEnd> {
        let Live {
            stream,
            packer,
            mut held,
            ..
        } = live;
        let state = PipelineState {
            stream: stream.state(),
            packer: packer.state(),
        };
        let docs = stream.into_docs();
        let state = self.take_over(k, state, sink)?;
        let mut next = self.build(k, config.threads)?;
        (next.restore_from(&state.stream, docs))
            .with_context(|| format!("the change of course at segment {k}"))?;
        // The next recipe's packer goes on from this one's state made its packing's, as a replay
        // of the lineage restores it.
        let packing = self.packer(k);
        let packer = WindowPacker::from_state(packing, state.packer).ok_or_else(|| {
            anyhow!(
                "the change of course at segment {k}: the packer's state does not fit its packing"
            )
        })?;
        if deliver(&packer, &mut held, sink, &Snapshots::unused())? {
            return Ok(RunEnd::stopped());
        }
        let start = StreamStart::Live {
            packer: Box::new(packer),
        };
        self.run(k, start, Some(next), config, sink)
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
            decider: None,
            ..config.clone()
        };
        self.run(k, start, None, &config, &mut finder)
            .context("finding where the change of course takes over")?;
        finder.found.ok_or_else(|| {
            anyhow!(
                "the stream ends before window {window}: there is no step there to change course at"
            )
        })
    }
}

/// A segment's stream stopped where the next recipe takes over ([`Segments::run_to_change`]).
pub struct Live {
    /// The documents the stream had emitted: where the next recipe takes over.
    pub documents: u64,
    stream: DocStream<Pretokenized>,
    packer: WindowPacker,
    /// Windows the packer emitted at and past the change's window: the next recipe's first
    /// step opens with them.
    held: Vec<PackedWindow>,
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
