//! Local-file sources: a recipe `[[source]]` becomes a [`LocalSource`] that lists its shards
//! (globs, sorted, then a seeded shuffle), reads them one after another with the reader of their
//! format, applies the row filter, counts and skips empty documents, and hands documents to the
//! mixer in a fixed order.

mod jsonl;
mod listing;
mod parquet;

pub use listing::{ListError, list_shards};

use dsprep_mixers::doc::{Doc, DocPos, DocSource, SourceCounters, SourceError};
use dsprep_mixers::recipe::{Format, SourceSpec};
use std::path::{Path, PathBuf};

/// An error inside one shard: names the file and, where known, the row or line.
#[derive(Debug, thiserror::Error)]
#[error("shard {}{}: {message}", path.display(), location.as_deref().map(|l| format!(" {l}")).unwrap_or_default())]
pub struct ShardError {
    pub path: PathBuf,
    /// e.g. `line 812`, `row 40`
    pub location: Option<String>,
    pub message: String,
}

impl ShardError {
    pub fn new(path: &Path, location: Option<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            location,
            message: message.into(),
        }
    }
}

/// One row as a shard reader sees it, before counting.
pub(crate) enum RowText {
    /// The row fails the recipe's filter (or its filter column is null).
    Filtered,
    /// Text is empty or null.
    Empty,
    Text(String),
}

/// Reads one shard's rows in order.
pub(crate) trait ShardReader: Send {
    /// The next row and its index in the shard, or `None` at the end.
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError>;
}

fn open_shard(path: &Path, spec: &SourceSpec) -> Result<Box<dyn ShardReader>, ShardError> {
    Ok(match spec.format {
        Format::Parquet => Box::new(parquet::ParquetShard::open(path, spec)?),
        Format::Jsonl => Box::new(jsonl::JsonlShard::open(path, spec, false)?),
        Format::JsonlGz => Box::new(jsonl::JsonlShard::open(path, spec, true)?),
    })
}

pub struct LocalSource {
    index: u16,
    spec: SourceSpec,
    /// In reading order (already shuffled).
    shards: Vec<PathBuf>,
    next_shard: usize,
    current: Option<(u32, Box<dyn ShardReader>)>,
    pass: u32,
    counters: SourceCounters,
}

impl LocalSource {
    pub fn new(index: u16, spec: SourceSpec, shards: Vec<PathBuf>) -> Self {
        Self {
            index,
            spec,
            shards,
            next_shard: 0,
            current: None,
            pass: 0,
            counters: SourceCounters::default(),
        }
    }

    pub fn shards(&self) -> &[PathBuf] {
        &self.shards
    }
}

impl DocSource for LocalSource {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.shards.get(self.next_shard) else {
                    if self.next_shard == self.shards.len() {
                        self.next_shard += 1; // the end of a pass is counted once
                        self.counters.passes_completed += 1;
                    }
                    return Ok(None);
                };
                let reader = open_shard(path, &self.spec)?;
                self.current = Some((self.next_shard as u32, reader));
                self.next_shard += 1;
            }
            let (shard, reader) = self.current.as_mut().expect("opened above");
            let Some((row, outcome)) = reader.next_row()? else {
                self.current = None;
                continue;
            };
            self.counters.rows_read += 1;
            match outcome {
                RowText::Filtered => self.counters.rows_filtered += 1,
                RowText::Empty => self.counters.rows_empty += 1,
                RowText::Text(text) => {
                    self.counters.documents += 1;
                    let pos = DocPos {
                        source: self.index,
                        pass: self.pass,
                        shard: *shard,
                        row,
                    };
                    return Ok(Some(Doc { pos, text }));
                }
            }
        }
    }

    fn restart(&mut self) -> Result<(), SourceError> {
        self.next_shard = 0;
        self.current = None;
        self.pass += 1;
        Ok(())
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }
}
