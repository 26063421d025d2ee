//! The one run path of a stream (the recipe's single stream, or one lane): restore from a
//! snapshot or start fresh, run the threaded pipeline (`pipeline.rs`), pack windows, attach
//! snapshots, and hand each window to a [`WindowSink`] that answers continue or stop. `dsprep
//! pack`, its lane parts, the single daemon's producer and the node daemons' lanes all run
//! through [`run_stream`]; each is only a sink.

use super::pipeline::{self, ChunkDoc, PipelineConfig, ProducedDoc};
use super::pretokenize::Pretokenized;
use super::stream::{LoadedRecipe, Locator};
use anyhow::{Context, anyhow};
use dsprep_mixers::checkpoint::PipelineState;
use dsprep_mixers::doc::{DocPos, SourceCounters};
use dsprep_mixers::packer::PackingCounters;
use dsprep_mixers::{DocStream, PackedWindow, PackerConfig, WindowPacker};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where a run starts.
pub enum StreamStart {
    /// From the stream's beginning.
    Fresh,
    /// From a snapshot; `what` names it in errors (`resume from PATH`).
    Restore {
        state: Box<PipelineState>,
        what: String,
    },
    /// The stream given is restored already (a change of course, made live): with this packer.
    Live { packer: Box<WindowPacker> },
}

/// A sink's answer: go on, or stop the run here (not an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// The sink's handle on snapshots: [`Snapshots::ask`] has the reader attach the stream's state to
/// the next chunk it closes; the sink gets it in [`WindowSink::snapshot`]. A sink that
/// [paces snapshots](WindowSink::paces_snapshots) gets them without asking.
pub struct Snapshots(Arc<AtomicBool>);

impl Snapshots {
    /// A handle that asks no reader (a run on the caller's thread takes no snapshot).
    pub fn unused() -> Snapshots {
        Snapshots(Arc::new(AtomicBool::new(false)))
    }

    pub fn ask(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What a run does with what it produces. Called on the caller's thread, in stream order.
pub trait WindowSink {
    /// The run is about to start the pipeline (`restored_in`: restoring the snapshot took this).
    fn started(&mut self, _restored_in: Option<Duration>) {}

    /// Whether this sink keeps snapshots (when not, the reader never takes one).
    fn keeps_snapshots(&self) -> bool {
        true
    }

    /// Whether the reader takes snapshots for this sink without asks: one on the first chunk
    /// that closes once `snapshot_text_bytes` of text (about a step's, in a daemon:
    /// [`PipelineConfig::for_steps`]) has passed since the last, from the stream's start. Asking
    /// once per step instead would put each snapshot as far ahead as the reader runs (`4 × threads +
    /// 2` chunks), and none in a stream's first chunks: on the quickstart at 2 ranks × 2 the
    /// first came at step 67, after the ranks' last step. One a step, not one a chunk: the
    /// states in flight each hold the shuffle buffer's references.
    fn paces_snapshots(&self) -> bool {
        false
    }

    /// A document as the packer takes it.
    fn document(&mut self, _doc: ProducedDoc) {}

    /// After each document is packed: the documents the stream has emitted up to it, and the
    /// windows the packer has emitted.
    fn pushed(&mut self, _documents: u64, _windows: u64) {}

    /// After each chunk, with `best_fit`: the packer's counters and the documents in its pool.
    fn packing(&mut self, _counters: &PackingCounters, _pool_documents: usize) {}

    /// A complete window.
    fn window(&mut self, window: PackedWindow, snapshots: &Snapshots) -> anyhow::Result<Flow>;

    /// The whole state after a chunk whose snapshot was asked for, every window before it
    /// taken by [`WindowSink::window`] (none is taken after a stop).
    fn snapshot(&mut self, _state: PipelineState) -> anyhow::Result<()> {
        Ok(())
    }

    /// The end of a chunk (`stopping`: a window answered [`Flow::Stop`]; the run stops after
    /// this whatever the answer).
    fn chunk_end(&mut self, _stopping: bool, _snapshots: &Snapshots) -> anyhow::Result<Flow> {
        Ok(Flow::Continue)
    }
}

/// How a run ended.
pub struct RunEnd {
    /// Each source's counters (empty when the sink stopped the run).
    pub counters: Vec<SourceCounters>,
    /// Tokens of the last window that did not fill (dropped; always 0 with `best_fit`, which
    /// packs its pool out at the end).
    pub leftover_tokens: u64,
    /// `best_fit`'s counters at the end (`None` with `concat`, or when the sink stopped).
    pub packing: Option<PackingCounters>,
    /// Whether the sink stopped the run before the stream's end.
    pub stopped: bool,
    /// The whole state where the run stopped at
    /// [`PipelineConfig::stop_after_documents`](super::pipeline::PipelineConfig): the next
    /// recipe of a lineage takes over from it.
    pub boundary: Option<PipelineState>,
}

impl RunEnd {
    pub fn stopped() -> RunEnd {
        RunEnd {
            counters: Vec::new(),
            leftover_tokens: 0,
            packing: None,
            stopped: true,
            boundary: None,
        }
    }
}

/// Run `stream` from `start` through the pipeline and the packer `packing` builds, handing `sink`
/// every document, window and asked-for snapshot. `config.snapshot` is the run's own. At the
/// stream's end a `best_fit` packer's pool becomes the last windows.
pub fn run_stream(
    loaded: &LoadedRecipe,
    mut stream: DocStream<Pretokenized>,
    start: StreamStart,
    mut config: PipelineConfig,
    packing: PackerConfig,
    sink: &mut impl WindowSink,
) -> anyhow::Result<RunEnd> {
    let began = Instant::now();
    let (mut packer, restored, mut documents) = open_start(loaded, &mut stream, start, packing)?;
    sink.started(restored.then(|| began.elapsed()));
    let asked = Arc::new(AtomicBool::new(false));
    config.snapshot = sink.keeps_snapshots().then(|| Arc::clone(&asked));
    if !sink.paces_snapshots() {
        config.snapshot_text_bytes = 0;
    }
    let snapshots = Snapshots(asked);
    let locator = Locator::new(stream.mixer());
    let locate = |pos: &DocPos| locator.locate(pos);
    let mut windows = Vec::new();
    let run = pipeline::run(stream, &loaded.stage, &config, &locate, |chunk| {
        for doc in chunk.docs() {
            pack_doc(&mut packer, doc, &mut documents, &mut windows, sink);
        }
        let stopping = deliver(&packer, &mut windows, sink, &snapshots)?;
        if let Some(state) = chunk.state
            && !stopping
        {
            sink.snapshot(PipelineState {
                stream: *state,
                packer: packer.state(),
            })?;
        }
        match (sink.chunk_end(stopping, &snapshots)?, stopping) {
            (Flow::Continue, false) => Ok(Flow::Continue),
            _ => Ok(Flow::Stop),
        }
    })?;
    let Some(read) = run else {
        return Ok(RunEnd::stopped());
    };
    let counters = read.counters;
    if let Some(stream) = read.boundary {
        // A lineage's next recipe takes over here: what the packer holds goes on with it.
        return Ok(RunEnd {
            counters,
            leftover_tokens: 0,
            packing: packer.counters(),
            stopped: false,
            boundary: Some(PipelineState {
                stream: *stream,
                packer: packer.state(),
            }),
        });
    }
    // The end of the stream: what the packer still holds becomes windows (`best_fit`).
    packer.finish(&mut windows);
    if !windows.is_empty() {
        let stopping = deliver(&packer, &mut windows, sink, &snapshots)?;
        if sink.chunk_end(stopping, &snapshots)? == Flow::Stop || stopping {
            return Ok(RunEnd::stopped());
        }
    }
    Ok(RunEnd {
        counters,
        leftover_tokens: packer.leftover_tokens(),
        packing: packer.counters(),
        stopped: false,
        boundary: None,
    })
}

/// Where a run starts: the stream restored (or fresh), the packer, whether it was restored, and
/// the documents the stream had emitted.
pub fn open_start(
    loaded: &LoadedRecipe,
    stream: &mut DocStream<Pretokenized>,
    start: StreamStart,
    packing: PackerConfig,
) -> anyhow::Result<(WindowPacker, bool, u64)> {
    Ok(match start {
        StreamStart::Fresh => (WindowPacker::new(packing), false, 0),
        StreamStart::Live { packer } => (*packer, true, stream.emitted()),
        StreamStart::Restore { state, what } => {
            let state = *state;
            let documents = state.stream.emitted;
            stream.restore(&state.stream).context(what.clone())?;
            let packer = WindowPacker::from_state(packing, state.packer).ok_or_else(|| {
                anyhow!(
                    "{what}: the checkpoint's packer state does not fit this recipe's packing \
                     (strategy {}, windows of {} tokens{})",
                    loaded.recipe.packing.strategy.name(),
                    packing.window_tokens,
                    match packing.best_fit {
                        Some((pool, _)) => format!(", a pool of {pool} documents"),
                        None => String::new(),
                    }
                )
            })?;
            (packer, true, documents)
        }
    })
}

/// Pack one document: `sink` told of it as the packer takes it and of where the packer stands
/// after, `documents` (the stream's documents packed) counted on, the windows it completes added
/// to `windows`.
pub fn pack_doc(
    packer: &mut WindowPacker,
    doc: ChunkDoc<'_>,
    documents: &mut u64,
    windows: &mut Vec<PackedWindow>,
    sink: &mut impl WindowSink,
) {
    sink.document(doc.produced(packer.position_tokens()));
    packer.push_doc(doc.tokens, doc.source, windows);
    *documents += 1;
    sink.pushed(*documents, packer.windows_emitted());
}

/// Tell `sink` where the `best_fit` packer stands, then give it the windows in order until one
/// answers stop; true if one did. `windows` is emptied either way.
pub fn deliver(
    packer: &WindowPacker,
    windows: &mut Vec<PackedWindow>,
    sink: &mut impl WindowSink,
    snapshots: &Snapshots,
) -> anyhow::Result<bool> {
    if let Some(counters) = packer.counters() {
        sink.packing(&counters, packer.pool_documents());
    }
    for window in windows.drain(..) {
        if sink.window(window, snapshots)? == Flow::Stop {
            return Ok(true); // dropping the drain empties `windows`
        }
    }
    Ok(false)
}
