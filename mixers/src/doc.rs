//! Documents and the interface every source implements (local files now, the Hub later).

/// Where a document came from: enough to read it again (resume re-reads shuffle-buffer members
/// by position instead of storing their text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocPos {
    /// Index of the source in the recipe.
    pub source: u16,
    /// How many times the source had been restarted (`all_exhausted`) when this was read.
    pub pass: u32,
    /// Index of the shard in the source's (shuffled) shard order.
    pub shard: u32,
    /// Row in the shard (parquet row, or 0-based line of a JSON-lines file).
    pub row: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doc {
    pub pos: DocPos,
    /// Never empty: sources count and skip empty documents.
    pub text: String,
}

/// What a source has seen so far, split by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceCounters {
    /// Rows read from the files (every outcome).
    pub rows_read: u64,
    /// Rows dropped by the recipe's row filter (or whose filter column was null).
    pub rows_filtered: u64,
    /// Rows whose text was empty or null: counted and skipped.
    pub rows_empty: u64,
    /// Documents handed to the mixer.
    pub documents: u64,
    /// Times the source reached its end (`all_exhausted` restarts it).
    pub passes_completed: u32,
}

/// The boxed error sources return; the mixer wraps it with the source's name.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// A stream of documents in a fixed, deterministic order.
pub trait DocSource: Send {
    /// The next non-empty document that passes the row filter, or `None` at the end of the
    /// current pass.
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError>;
    /// Start the next pass from the first document, in the same order.
    fn restart(&mut self) -> Result<(), SourceError>;
    fn counters(&self) -> SourceCounters;
}

/// A source over documents held in memory: for tests and for callers that already have text.
#[derive(Clone, Debug)]
pub struct VecSource {
    source: u16,
    texts: Vec<String>,
    next: usize,
    pass: u32,
    counters: SourceCounters,
}

impl VecSource {
    pub fn new(source: u16, texts: Vec<String>) -> Self {
        Self {
            source,
            texts,
            next: 0,
            pass: 0,
            counters: SourceCounters::default(),
        }
    }
}

impl DocSource for VecSource {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        while let Some(text) = self.texts.get(self.next) {
            let row = self.next as u64;
            self.next += 1;
            self.counters.rows_read += 1;
            if text.is_empty() {
                self.counters.rows_empty += 1;
                continue;
            }
            self.counters.documents += 1;
            let pos = DocPos {
                source: self.source,
                pass: self.pass,
                shard: 0,
                row,
            };
            return Ok(Some(Doc {
                pos,
                text: text.clone(),
            }));
        }
        if self.next == self.texts.len() {
            self.next += 1; // count the end of a pass once
            self.counters.passes_completed += 1;
        }
        Ok(None)
    }

    fn restart(&mut self) -> Result<(), SourceError> {
        self.next = 0;
        self.pass += 1;
        Ok(())
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }
}
