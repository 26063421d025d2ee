//! Sources that tokenize ahead, for a mix in tokens (`[mix] unit = "tokens"`): the mixer needs
//! each document's length before it draws the next one, so it gives each source the documents
//! about to leave that source's shuffle buffer, a batch at a time and a batch ahead
//! ([`DocSource::tokenize_ahead`]), and a pool of threads tokenizes them while the mixer works
//! through the batch before. Only documents about to be emitted are tokenized: not the buffers'
//! residents, so a `first_exhausted` end throws away at most two batches per source.
//!
//! Nothing here is in the stream's state: the mixer's state lists the documents out of the
//! buffers, and a resumed mixer gives them to tokenize again. Without a pool (a mix in
//! documents) a source passes its documents through untouched.
//!
//! Bounded: the mixer keeps at most two batches per source out of its buffer (`AHEAD_DOCS`
//! documents or `AHEAD_TEXT_BYTES` of text each, `dsprep_mixers::mixer`), and the pool's queue
//! holds `4 × threads` jobs.

use crate::sources::LocalSource;
use anyhow::Context;
use crossbeam_channel::{Receiver, Sender, bounded};
use dsprep_mixers::TokenizeStage;
use dsprep_mixers::doc::{Doc, DocPos, DocSource, SourceCounters, SourceCursor, SourceError};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

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
            // About 0.25 to 0.35 GPT-2 tokens per byte of prose: one allocation for most.
            let mut ids = Vec::with_capacity(text.len() / 3 + 2);
            stage
                .encode_doc(text, &mut ids)
                .map(|()| ids)
                .map_err(|e| (k, e.to_string()))
        })
        .collect()
}

/// A local source that tokenizes documents ahead when it has a pool (see the module doc).
pub struct Pretokenized {
    inner: LocalSource,
    pool: Option<Arc<TokenizePool>>,
    /// Batches given to the pool, in order, with their documents' positions (for messages).
    pending: VecDeque<(Vec<DocPos>, Receiver<Encoded>)>,
    /// The ids of the oldest batch's documents not taken yet, in order.
    taken: VecDeque<Vec<u32>>,
}

impl Pretokenized {
    pub fn new(inner: LocalSource, pool: Option<Arc<TokenizePool>>) -> Self {
        Pretokenized {
            inner,
            pool,
            pending: VecDeque::new(),
            taken: VecDeque::new(),
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
}

impl DocSource for Pretokenized {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        self.inner.next_doc()
    }

    fn restart(&mut self) -> Result<(), SourceError> {
        self.inner.restart()
    }

    fn counters(&self) -> SourceCounters {
        self.inner.counters()
    }

    fn cursor(&self) -> SourceCursor {
        self.inner.cursor()
    }

    fn seek(&mut self, cursor: &SourceCursor) -> Result<(), SourceError> {
        self.pending.clear();
        self.taken.clear();
        self.inner.seek(cursor)
    }

    fn read_docs(&mut self, positions: &[DocPos]) -> Result<Vec<String>, SourceError> {
        self.inner.read_docs(positions)
    }

    fn tokenize_ahead(&mut self, docs: Vec<(DocPos, String)>) -> Result<(), SourceError> {
        let Some(pool) = &self.pool else {
            return Err("a mix in documents does not tokenize ahead".into());
        };
        let (positions, texts): (Vec<DocPos>, Vec<String>) = docs.into_iter().unzip();
        let answer = pool.submit(texts);
        self.pending.push_back((positions, answer));
        Ok(())
    }

    fn take_tokens(&mut self) -> Result<Vec<u32>, SourceError> {
        if self.taken.is_empty() {
            let Some((positions, answer)) = self.pending.pop_front() else {
                return Err("internal error: tokens taken for a document not given".into());
            };
            match TokenizePool::wait(&answer) {
                Ok(all) => self.taken = all.into(),
                Err((k, message)) => {
                    let at = positions.get(k).map(|p| self.locate(p)).unwrap_or_default();
                    return Err(format!("{at}: {message}").into());
                }
            }
        }
        self.taken
            .pop_front()
            .ok_or_else(|| "internal error: a batch without documents was tokenized".into())
    }
}
