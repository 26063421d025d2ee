//! The threaded driver of the pipeline core, shared by `dsprep pack` and `dsprep serve`.
//!
//! ```text
//! reader thread ── DocChunk ──▶ N tokenizer threads ── TokenizedChunk ──▶ caller's thread
//!   Mixer → Shuffler           TokenizeStage::encode_doc        reorder by seq → sink
//! ```
//! In a mix in tokens the sources have tokenized their documents already
//! (`driver::pretokenize`): the tokenizer threads move their ids on, uncopied.
//! - Chunks carry a sequence number; the caller's thread puts them back in order, so the output
//!   never depends on thread timing or count.
//! - Bounded: at most `max_in_flight` chunks exist between the reader and the sink (a permit is
//!   taken before a chunk is made and returned once the sink has consumed it in order), so the
//!   reorder buffer and both channels stay bounded even when one thread is slow on a huge document.
//! - A sink's [`Flow::Stop`] ends the run the same way, without an error.
//! - Errors stop everything: a failing sink or tokenizer drops its channel ends, every other
//!   thread sees a closed channel and returns; a reader error is reported after the join.

use super::run::Flow;
use crate::waits::{self, Wait};
use anyhow::{Context, anyhow, bail};
use crossbeam_channel::{Receiver, Sender, bounded};
use dsprep_mixers::doc::{Doc, DocPos, DocSource, SourceCounters};
use dsprep_mixers::{DocStream, StreamState, TokenizeStage};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Documents per chunk at most.
const CHUNK_DOCS: usize = 128;
/// Text bytes per chunk at most (a chunk closes once it passes this), unless configured.
pub const CHUNK_TEXT_BYTES: usize = 256 * 1024;
/// A daemon's smallest chunk: 16 KiB of text per step, shared by the streams that make the step,
/// and never below 1 KiB.
const MIN_STEP_CHUNK_TEXT_BYTES: usize = 16 << 10;
const MIN_CHUNK_TEXT_BYTES: usize = 1 << 10;

/// A daemon's chunk size: about half of one stream's share of a step's text (`step_tokens`
/// shared by `streams` lanes, 1 without lanes; ~4 bytes per token), so that snapshots, hence
/// checkpoints, can be taken at least about twice per step; at least a stream's share of 16 KiB
/// (and 1 KiB), at most [`CHUNK_TEXT_BYTES`]. Chunking decides where snapshots can fall, never
/// the bytes.
pub fn step_chunk_text_bytes(step_tokens: u64, streams: u32) -> usize {
    let streams = streams.max(1);
    let text = step_tokens.saturating_mul(2) / u64::from(streams);
    let floor = (MIN_STEP_CHUNK_TEXT_BYTES / streams as usize).max(MIN_CHUNK_TEXT_BYTES);
    usize::try_from(text)
        .unwrap_or(usize::MAX)
        .clamp(floor, CHUNK_TEXT_BYTES)
}

#[derive(Clone)]
pub struct PipelineConfig {
    /// Tokenizer threads.
    pub threads: usize,
    /// Where the reader thread publishes the shuffle buffer's fill (documents), for metrics.
    pub shuffle_fill: Option<Arc<AtomicU64>>,
    /// Set by the sink to ask for a snapshot: the reader clears it and attaches the stream's
    /// state to the next chunk it closes ([`TokenizedChunk::state`]). `None`: no snapshots.
    pub snapshot: Option<Arc<AtomicBool>>,
    /// A chunk closes once its text passes this many bytes (or at 128 documents). Smaller chunks
    /// cost a little more channel traffic and give finer snapshot points.
    pub chunk_text_bytes: usize,
    /// With `snapshot`, the reader also takes one by itself on the first chunk that closes once
    /// this much text (4 bytes per token of a document tokenized ahead) has passed since its
    /// last, from the stream's first chunk on (0: only when asked). The reader runs up to
    /// `max_in_flight` chunks ahead of the sink, so an ask lands that far ahead in the stream;
    /// a pace puts snapshots everywhere, at places that depend on the documents only. A sink
    /// that does not [pace snapshots](super::run::WindowSink::paces_snapshots) runs with 0.
    pub snapshot_text_bytes: usize,
    /// Stop reading once the stream has emitted this many documents (a change of course takes
    /// over there): the run then ends with the stream's state at that point
    /// ([`Read::boundary`]), its windows not finished.
    pub stop_after_documents: Option<u64>,
    /// `[mix.adaptive]`: decides phases of the mix as the reader reaches them (a daemon's live
    /// run of its newest segment only; a replay takes the decisions from the lineage).
    pub decider: Option<Arc<dyn MixDecider>>,
}

/// Decides the mix while the stream is read (`[mix.adaptive]`): the reader asks before every
/// document it draws, and adds the phases it gets to the mixer before the draw, as a mixer made
/// with them would have them ([`dsprep_mixers::Mixer::push_phase`]).
pub trait MixDecider: Send + Sync {
    /// The stream has `tokens` tokens: the phases to add now, each from which of the stream's
    /// tokens on which weights (one per source) hold. Blocks while a decision waits for the
    /// trainers' reports; an error stops the run.
    fn before_draw(&self, tokens: u64) -> anyhow::Result<Vec<(u64, Vec<f64>)>>;
}

/// What the reader did: each source's counters, and the stream's state where it stopped at
/// [`PipelineConfig::stop_after_documents`].
pub struct Read {
    pub counters: Vec<SourceCounters>,
    pub boundary: Option<Box<StreamState>>,
}

impl PipelineConfig {
    /// `threads` tokenizing, chunks of `chunk_text_bytes`, no metrics (snapshots are the run's:
    /// `driver::run`).
    pub fn new(threads: usize, chunk_text_bytes: usize) -> Self {
        Self {
            threads,
            shuffle_fill: None,
            snapshot: None,
            chunk_text_bytes,
            snapshot_text_bytes: 0,
            stop_after_documents: None,
            decider: None,
        }
    }

    /// A daemon's stream (or a lane) making steps of `step_tokens` shared by `streams`:
    /// chunks of about half its share of a step ([`step_chunk_text_bytes`]), a paced snapshot
    /// about once per its share of a step (~4 bytes of text a token).
    pub fn for_steps(threads: usize, step_tokens: u64, streams: u32) -> Self {
        let share = step_tokens.saturating_mul(4) / u64::from(streams.max(1));
        Self {
            snapshot_text_bytes: usize::try_from(share).unwrap_or(usize::MAX),
            ..Self::new(threads, step_chunk_text_bytes(step_tokens, streams))
        }
    }

    fn max_in_flight(&self) -> usize {
        4 * self.threads + 2
    }
}

struct DocChunk {
    seq: u64,
    docs: Vec<Doc>,
    state: Option<Box<StreamState>>,
}

/// A chunk of documents in stream order, tokenized.
pub struct TokenizedChunk {
    pub seq: u64,
    /// Per document: its source index and its number of tokens (BOS/EOS included).
    doc_sources: Vec<u16>,
    doc_lens: Vec<u32>,
    /// Per document: 0, or its piece number when it is a piece of a split row.
    doc_pieces: Vec<u32>,
    /// The documents' tokens: concatenated when the tokenizer threads made them, or each
    /// document's own when they were tokenized ahead (moved here, not copied).
    tokens: Vec<u32>,
    doc_tokens: Vec<Vec<u32>>,
    /// When a snapshot was asked for: the stream's state right after this chunk's last document.
    pub state: Option<Box<StreamState>>,
}

/// A document as the packer took it: what the daemon's metrics count.
#[derive(Clone, Copy, Debug)]
pub struct ProducedDoc {
    pub source: u16,
    /// Where it starts in its lane's own stream (the stream's, without lanes), in tokens.
    pub start_tokens: u64,
    pub tokens: u64,
    /// 0, or its piece number when it is a piece of a split row.
    pub piece: u32,
}

/// One document of a [`TokenizedChunk`].
pub struct ChunkDoc<'a> {
    pub source: u16,
    /// 0, or its piece number when it is a piece of a split row.
    pub piece: u32,
    /// Its tokens, BOS/EOS included.
    pub tokens: &'a [u32],
}

impl ChunkDoc<'_> {
    /// This document as produced, starting `start_tokens` into its lane's stream (where the
    /// packer stands before it is pushed).
    pub fn produced(&self, start_tokens: u64) -> ProducedDoc {
        ProducedDoc {
            source: self.source,
            start_tokens,
            tokens: self.tokens.len() as u64,
            piece: self.piece,
        }
    }
}

impl TokenizedChunk {
    /// Each document, in stream order.
    pub fn docs(&self) -> impl Iterator<Item = ChunkDoc<'_>> {
        let mut at = 0usize;
        let flat = self.doc_tokens.is_empty();
        let docs = self.doc_sources.iter().zip(&self.doc_lens);
        (docs.zip(&self.doc_pieces).enumerate()).map(move |(k, ((&source, &len), &piece))| {
            let tokens = match flat {
                true => &self.tokens[at..at + len as usize],
                false => &self.doc_tokens[k][..],
            };
            at += len as usize;
            ChunkDoc {
                source,
                piece,
                tokens,
            }
        })
    }

    pub fn num_docs(&self) -> usize {
        self.doc_lens.len()
    }

    pub fn num_tokens(&self) -> u64 {
        self.doc_lens.iter().map(|&l| u64::from(l)).sum()
    }
}

type WorkerResult = anyhow::Result<TokenizedChunk>;

/// Run the pipeline to the end of the stream, handing tokenized chunks to `sink` in order, until
/// the sink answers [`Flow::Stop`] (or to [`PipelineConfig::stop_after_documents`]). Returns
/// what the reader did, or `None` when the sink stopped the run.
pub fn run<S: DocSource>(
    stream: DocStream<S>,
    stage: &TokenizeStage,
    config: &PipelineConfig,
    locate: &(dyn Fn(&DocPos) -> String + Sync),
    sink: impl FnMut(TokenizedChunk) -> anyhow::Result<Flow>,
) -> anyhow::Result<Option<Read>> {
    let threads = config.threads.max(1);
    let capacity = config.max_in_flight();
    let (doc_tx, doc_rx) = bounded::<DocChunk>(capacity);
    let (tok_tx, tok_rx) = bounded::<WorkerResult>(capacity);
    let (permit_tx, permit_rx) = bounded::<()>(capacity);
    for _ in 0..capacity {
        permit_tx
            .send(())
            .expect("the permit channel has room for every permit");
    }
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("dsprep-reader".into())
            .spawn_scoped(scope, move || {
                read_mix_shuffle(stream, doc_tx, permit_rx, config)
            })
            .context("cannot start the reader thread")?;
        for k in 0..threads {
            let (doc_rx, tok_tx) = (doc_rx.clone(), tok_tx.clone());
            std::thread::Builder::new()
                .name(format!("dsprep-tokenize-{k}"))
                .spawn_scoped(scope, move || {
                    tokenize_chunks(stage, locate, doc_rx, tok_tx)
                })
                .context("cannot start a tokenizer thread")?;
        }
        drop((doc_rx, tok_tx));
        let sunk = reorder_into(sink, tok_rx, permit_tx);
        tracing::debug!(
            "the pipeline's waits so far in this process: {}",
            waits::summary()
        );
        let read = reader
            .join()
            .map_err(|_| anyhow!("the reader thread panicked"))?;
        // A reader error explains a short stream: report it before anything the sink saw.
        let read = read?;
        Ok(match sunk? {
            Flow::Continue => Some(read),
            Flow::Stop => None,
        })
    })
}

/// The reader thread: draws documents from the stream (asking `config.decider` before each),
/// groups them into chunks for the tokenizers, and attaches the stream's state where a snapshot
/// is asked for or due.
fn read_mix_shuffle<S: DocSource>(
    mut stream: DocStream<S>,
    doc_tx: Sender<DocChunk>,
    permits: Receiver<()>,
    config: &PipelineConfig,
) -> anyhow::Result<Read> {
    let (chunk_text_bytes, shuffle_fill) =
        (config.chunk_text_bytes, config.shuffle_fill.as_deref());
    // The sink's ask, and the pace (`PipelineConfig::snapshot_text_bytes`).
    let snapshot: Option<(&AtomicBool, usize)> =
        (config.snapshot.as_deref()).map(|asked| (asked, config.snapshot_text_bytes));
    let (stop_after_documents, decider) = (config.stop_after_documents, config.decider.as_deref());
    let mut chunker = Chunker {
        seq: 0,
        docs: Vec::with_capacity(CHUNK_DOCS),
        text_bytes: 0,
        max_text_bytes: chunk_text_bytes.max(1),
        doc_tx,
        permits,
    };
    // Text since the last snapshot (the first chunk is as far from none as can be).
    let mut since = usize::MAX;
    let mut state_if_asked = |stream: &DocStream<S>, chunk_text_bytes: usize| {
        since = since.saturating_add(chunk_text_bytes);
        let due = snapshot.is_some_and(|(asked, pace)| {
            asked.swap(false, Ordering::AcqRel) || (pace > 0 && since >= pace)
        });
        due.then(|| {
            since = 0;
            Box::new(stream.state())
        })
    };
    let read = |stream: &DocStream<S>, boundary| Read {
        counters: counters(stream),
        boundary,
    };
    let more = |stream: &DocStream<S>| stop_after_documents.is_none_or(|n| stream.emitted() < n);
    let decide = |stream: &mut DocStream<S>| -> anyhow::Result<()> {
        if let Some(decider) = decider {
            for (at, weights) in decider.before_draw(stream.mixer().total_tokens())? {
                stream.mixer_mut().push_phase(at, &weights);
            }
        }
        Ok(())
    };
    while more(&stream) {
        decide(&mut stream)?;
        let Some(doc) = stream.next_doc()? else {
            break;
        };
        if let Some(fill) = shuffle_fill {
            fill.store(stream.buffered() as u64, Ordering::Relaxed);
        }
        if chunker.push(doc) && !chunker.send(state_if_asked(&stream, chunker.text_bytes)) {
            return Ok(read(&stream, None));
        }
    }
    chunker.send(state_if_asked(&stream, chunker.text_bytes));
    let boundary = match stop_after_documents {
        None => None,
        Some(n) if stream.emitted() == n => Some(Box::new(stream.state())),
        Some(n) => bail!(
            "the stream ended after {} documents, before document {n} where the lineage's next              recipe takes over: the inputs have changed since the change was made",
            stream.emitted()
        ),
    };
    Ok(read(&stream, boundary))
}

/// Groups documents into chunks.
struct Chunker {
    seq: u64,
    docs: Vec<Doc>,
    text_bytes: usize,
    max_text_bytes: usize,
    doc_tx: Sender<DocChunk>,
    permits: Receiver<()>,
}

impl Chunker {
    /// Add a document; true once the chunk is full and should be sent.
    fn push(&mut self, doc: Doc) -> bool {
        self.text_bytes += doc.text.len() + 4 * doc.tokens.as_ref().map_or(0, Vec::len);
        self.docs.push(doc);
        self.docs.len() >= CHUNK_DOCS || self.text_bytes >= self.max_text_bytes
    }

    /// Send the chunk (with the stream's state after it, if asked for). Returns false once the
    /// downstream has gone (it failed, and reports why).
    fn send(&mut self, state: Option<Box<StreamState>>) -> bool {
        if self.docs.is_empty() && state.is_none() {
            return true;
        }
        self.text_bytes = 0;
        let docs = std::mem::replace(&mut self.docs, Vec::with_capacity(CHUNK_DOCS));
        let chunk = DocChunk {
            seq: self.seq,
            docs,
            state,
        };
        let sent = waits::timed(Wait::ReaderForPermit, || self.permits.recv()).is_ok()
            && waits::timed(Wait::ReaderForTokenizers, || self.doc_tx.send(chunk)).is_ok();
        self.seq += 1;
        sent
    }
}

fn counters<S: DocSource>(stream: &DocStream<S>) -> Vec<SourceCounters> {
    stream
        .mixer()
        .inputs()
        .iter()
        .map(|i| i.source.counters())
        .collect()
}

fn tokenize_chunks(
    stage: &TokenizeStage,
    locate: &(dyn Fn(&DocPos) -> String + Sync),
    doc_rx: Receiver<DocChunk>,
    tok_tx: Sender<WorkerResult>,
) {
    while let Ok(DocChunk { seq, docs, state }) =
        waits::timed(Wait::TokenizerForChunk, || doc_rx.recv())
    {
        let mut out = TokenizedChunk {
            seq,
            doc_sources: Vec::with_capacity(docs.len()),
            doc_lens: Vec::with_capacity(docs.len()),
            doc_pieces: Vec::with_capacity(docs.len()),
            tokens: Vec::new(),
            doc_tokens: Vec::new(),
            state,
        };
        let mut result = Ok(());
        for mut doc in docs {
            let len = match doc.tokens.take() {
                // Tokenized ahead (a mix in tokens): every document of the chunk was.
                Some(tokens) => {
                    let len = tokens.len();
                    out.doc_tokens.push(tokens);
                    len
                }
                None => {
                    let before = out.tokens.len();
                    if let Err(e) = stage.encode_doc(&doc.text, &mut out.tokens) {
                        result = Err(anyhow!(e).context(locate(&doc.pos)));
                        break;
                    }
                    out.tokens.len() - before
                }
            };
            out.doc_sources.push(doc.pos.source);
            out.doc_lens.push(len as u32);
            out.doc_pieces.push(doc.pos.piece);
        }
        if !out.doc_tokens.is_empty() && out.doc_tokens.len() != out.doc_lens.len() {
            result = Err(anyhow!(
                "internal error: a chunk mixes documents tokenized ahead with others"
            ));
        }
        let failed = result.is_err();
        let sent = waits::timed(Wait::TokenizerForSink, || {
            tok_tx.send(result.map(|()| out)).is_ok()
        });
        if !sent || failed {
            return;
        }
    }
}

/// Hand chunks to `sink` in sequence order; a stop drops the channels, and every other thread
/// sees them closed and returns.
fn reorder_into(
    mut sink: impl FnMut(TokenizedChunk) -> anyhow::Result<Flow>,
    tok_rx: Receiver<WorkerResult>,
    permit_tx: Sender<()>,
) -> anyhow::Result<Flow> {
    let mut waiting = BTreeMap::new();
    let mut next = 0u64;
    while let Ok(result) = waits::timed(Wait::SinkForChunk, || tok_rx.recv()) {
        let chunk = result?;
        waiting.insert(chunk.seq, chunk);
        while let Some(chunk) = waiting.remove(&next) {
            if sink(chunk)? == Flow::Stop {
                return Ok(Flow::Stop);
            }
            next += 1;
            let _ = permit_tx.send(());
        }
    }
    anyhow::ensure!(
        waiting.is_empty(),
        "internal error: chunks {:?} arrived without their predecessors",
        waiting.keys().collect::<Vec<_>>()
    );
    Ok(Flow::Continue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemons_chunk_about_half_a_streams_share_of_a_step() {
        // A step of 4 windows of 513 tokens: the floor, 16 KiB for one stream, 2 KiB of 8 lanes.
        assert_eq!(step_chunk_text_bytes(4 * 513, 1), 16 << 10);
        assert_eq!(step_chunk_text_bytes(4 * 513, 8), 2 << 10);
        assert_eq!(step_chunk_text_bytes(4 * 513, 64), 1 << 10);
        assert_eq!(step_chunk_text_bytes(64 * 513, 1), 64 * 513 * 2);
        assert_eq!(step_chunk_text_bytes(512 * 2049, 8), CHUNK_TEXT_BYTES);
    }

    #[test]
    fn a_daemon_paces_a_snapshot_about_once_per_step_of_text() {
        // ~4 bytes of text a token, shared by the streams: every chunk at the quickstart's 2 × 2
        // (its chunks, at the 16 KiB floor, pass 8 KiB), every other chunk for large steps.
        let small = PipelineConfig::for_steps(2, 4 * 513, 1);
        assert_eq!(
            (small.chunk_text_bytes, small.snapshot_text_bytes),
            (16 << 10, 4 * 513 * 4)
        );
        let large = PipelineConfig::for_steps(2, 64 * 2049, 8);
        assert_eq!(large.snapshot_text_bytes, 2 * large.chunk_text_bytes);
        assert_eq!(PipelineConfig::new(2, 1 << 10).snapshot_text_bytes, 0);
    }
}
