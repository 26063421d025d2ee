//! Sources that tokenize ahead, for a mix in tokens (`[mix] unit = "tokens"`): the mixer needs
//! each document's length before it draws the next one, so every source reads its documents in
//! batches and a pool of threads tokenizes a batch while the mixer works through the one before.
//!
//! Invisible to the stream's state: a source's cursor is the one from before the first document
//! it has read but not handed over, so a checkpoint never records a document read ahead, and a
//! resumed source reads (and tokenizes) those documents again. Batches end where the source's pass
//! ends; the next pass is read after [`DocSource::restart`], as without read-ahead. Without a
//! pool (a mix in documents) a source passes its documents through untouched.
//!
//! Bounded: per source, at most [`AHEAD_BATCHES`] batches of at most [`BATCH_DOCS`] documents
//! or [`BATCH_TEXT_BYTES`] of text (plus the document that crosses it).

use crate::sources::LocalSource;
use anyhow::Context;
use crossbeam_channel::{Receiver, Sender, bounded};
use dsprep_mixers::TokenizeStage;
use dsprep_mixers::doc::{Doc, DocPos, DocSource, SourceCounters, SourceCursor, SourceError};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

/// Batches a source keeps read ahead: one being handed over, one being tokenized.
pub const AHEAD_BATCHES: usize = 2;
/// Documents per batch at most.
pub const BATCH_DOCS: usize = 64;
/// Text bytes per batch at most (a batch closes once it passes this).
pub const BATCH_TEXT_BYTES: usize = 256 * 1024;

/// A batch's token ids, document by document, or the failing document's index and the reason.
type Encoded = Result<Vec<Vec<u32>>, (usize, String)>;

struct Job {
    texts: Vec<String>,
    reply: Sender<Encoded>,
}

/// Threads that tokenize batches of texts. They end once every handle to the pool is dropped.
pub struct TokenizePool {
    jobs: Sender<Job>,
}

impl TokenizePool {
    pub fn start(stage: Arc<TokenizeStage>, threads: usize) -> anyhow::Result<Arc<Self>> {
        let (jobs, queue) = bounded::<Job>(4 * threads.max(1));
        for k in 0..threads.max(1) {
            let (stage, queue) = (stage.clone(), queue.clone());
            std::thread::Builder::new()
                .name(format!("dsprep-pretokenize-{k}"))
                .spawn(move || {
                    for job in queue {
                        let _ = job.reply.send(encode_all(&stage, &job.texts));
                    }
                })
                .context("cannot start a tokenizer thread")?;
        }
        Ok(Arc::new(TokenizePool { jobs }))
    }

    fn submit(&self, texts: Vec<String>) -> Receiver<Encoded> {
        let (reply, answer) = bounded(1);
        // The pool's threads live as long as this handle: a send fails only if they all died,
        // and then the dropped reply is reported by `wait`.
        let _ = self.jobs.send(Job { texts, reply });
        answer
    }

    fn wait(answer: &Receiver<Encoded>) -> Encoded {
        answer
            .recv()
            .unwrap_or_else(|_| Err((0, "the tokenizer thread stopped".to_string())))
    }
}

fn encode_all(stage: &TokenizeStage, texts: &[String]) -> Encoded {
    texts
        .iter()
        .enumerate()
        .map(|(k, text)| {
            let mut ids = Vec::new();
            stage
                .encode_doc(text, &mut ids)
                .map(|()| ids)
                .map_err(|e| (k, e.to_string()))
        })
        .collect()
}

/// A document read ahead (or the end of the pass), with the cursor from before it was read.
struct Ahead {
    before: SourceCursor,
    doc: Option<Doc>,
}

struct Batch {
    items: VecDeque<Ahead>,
    /// The batch's tokens, until they have been put into its documents.
    pending: Option<Receiver<Encoded>>,
}

/// A local source whose documents come tokenized when it has a pool (see the module doc).
pub struct Pretokenized {
    inner: LocalSource,
    pool: Option<Arc<TokenizePool>>,
    batches: VecDeque<Batch>,
    /// The last batch read ends with the pass: nothing more is read until a restart.
    read_to_end: bool,
}

impl Pretokenized {
    pub fn new(inner: LocalSource, pool: Option<Arc<TokenizePool>>) -> Self {
        Pretokenized {
            inner,
            pool,
            batches: VecDeque::new(),
            read_to_end: false,
        }
    }

    /// The source's shards, in reading order.
    pub fn shards(&self) -> &[PathBuf] {
        self.inner.shards()
    }

    /// The local source read through this one.
    pub fn local(&self) -> &LocalSource {
        &self.inner
    }

    fn read_batch(&mut self, pool: &TokenizePool) -> Result<(), SourceError> {
        let (mut items, mut texts, mut bytes) = (VecDeque::new(), Vec::new(), 0);
        while items.len() < BATCH_DOCS && bytes < BATCH_TEXT_BYTES {
            let before = self.inner.cursor();
            let Some(mut doc) = self.inner.next_doc()? else {
                items.push_back(Ahead { before, doc: None });
                self.read_to_end = true;
                break;
            };
            bytes += doc.text.len();
            texts.push(std::mem::take(&mut doc.text));
            items.push_back(Ahead {
                before,
                doc: Some(doc),
            });
        }
        let pending = (!texts.is_empty()).then(|| pool.submit(texts));
        self.batches.push_back(Batch { items, pending });
        Ok(())
    }

    /// Where a document is, for messages: `shard PATH row N`.
    fn locate(&self, pos: &DocPos) -> String {
        let shard = self.inner.shards().get(pos.shard as usize);
        let shard = shard.map(|p| p.display().to_string()).unwrap_or_default();
        format!(
            "shard {shard} row {}{}",
            pos.row,
            super::stream::piece_label(pos)
        )
    }

    /// Put the front batch's tokens into its documents, waiting for them if need be.
    fn resolve_front(&mut self) -> Result<(), SourceError> {
        let Some(batch) = self.batches.front_mut() else {
            return Ok(());
        };
        let Some(answer) = batch.pending.take() else {
            return Ok(());
        };
        let mut docs = batch.items.iter_mut().filter_map(|a| a.doc.as_mut());
        match TokenizePool::wait(&answer) {
            Ok(all) => {
                for (doc, ids) in docs.by_ref().zip(all) {
                    doc.tokens = Some(ids);
                }
                Ok(())
            }
            Err((k, message)) => {
                let pos = docs.nth(k).map(|d| d.pos);
                let at = pos.map(|p| self.locate(&p)).unwrap_or_default();
                Err(format!("{at}: {message}").into())
            }
        }
    }
}

impl DocSource for Pretokenized {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        let Some(pool) = self.pool.clone() else {
            return self.inner.next_doc();
        };
        while self.batches.len() < AHEAD_BATCHES && !self.read_to_end {
            self.read_batch(&pool)?;
        }
        self.resolve_front()?;
        let Some(batch) = self.batches.front_mut() else {
            return Ok(None); // the pass's end was handed over already
        };
        let ahead = batch.items.pop_front().expect("a batch is never empty");
        if batch.items.is_empty() {
            self.batches.pop_front();
        }
        Ok(ahead.doc)
    }

    fn restart(&mut self) -> Result<(), SourceError> {
        self.batches.clear();
        self.read_to_end = false;
        self.inner.restart()
    }

    fn counters(&self) -> SourceCounters {
        self.cursor().counters
    }

    fn cursor(&self) -> SourceCursor {
        match self.batches.front().and_then(|b| b.items.front()) {
            Some(ahead) => ahead.before,
            None => self.inner.cursor(),
        }
    }

    fn seek(&mut self, cursor: &SourceCursor) -> Result<(), SourceError> {
        self.batches.clear();
        self.read_to_end = false;
        self.inner.seek(cursor)
    }

    fn read_docs(&mut self, positions: &[DocPos]) -> Result<Vec<String>, SourceError> {
        self.inner.read_docs(positions)
    }

    fn reread(&mut self, positions: &[DocPos]) -> Result<Vec<Doc>, SourceError> {
        let texts = self.inner.read_docs(positions)?;
        let Some(pool) = &self.pool else {
            let docs = positions.iter().zip(texts);
            return Ok(docs.map(|(pos, text)| Doc::new(*pos, text)).collect());
        };
        // In batches, so that a resumed buffer of many documents is tokenized on every thread.
        let mut texts = texts.into_iter();
        let answers: Vec<Receiver<Encoded>> = positions
            .chunks(BATCH_DOCS)
            .map(|chunk| pool.submit(texts.by_ref().take(chunk.len()).collect()))
            .collect();
        let mut docs = Vec::with_capacity(positions.len());
        for (chunk, answer) in positions.chunks(BATCH_DOCS).zip(answers) {
            match TokenizePool::wait(&answer) {
                Ok(all) => docs.extend(chunk.iter().zip(all).map(|(pos, ids)| Doc {
                    pos: *pos,
                    text: String::new(),
                    tokens: Some(ids),
                })),
                Err((k, message)) => {
                    let at = chunk.get(k).map(|p| self.locate(p)).unwrap_or_default();
                    return Err(format!("{at}: {message}").into());
                }
            }
        }
        Ok(docs)
    }
}
