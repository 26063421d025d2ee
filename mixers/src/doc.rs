//! Documents and the interface every source implements (local files now, the Hub later).

use crate::split::SplitDoc;

/// Where a document came from: enough to read it again (resume re-reads shuffle-buffer members
/// by position instead of storing their text).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct DocPos {
    /// Index of the source in the recipe.
    pub source: u16,
    /// How many times the source had been restarted (`all_exhausted`) when this was read.
    pub pass: u32,
    /// Index of the shard in the source's (shuffled) shard order.
    pub shard: u32,
    /// Row in the shard (parquet row, or 0-based line of a JSON-lines file).
    pub row: u64,
    /// 0: the row's text, whole. `k ≥ 1`: the row's `k`-th piece, its text being over the
    /// source's `max_document_bytes` under `oversize = "split"` ([`crate::split`]). Absent from
    /// the JSON form when 0, so positions of whole rows read and write as before pieces existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub piece: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl DocPos {
    /// Whether this is a piece of a split row: pieces never enter a shuffle buffer, so a row's
    /// pieces leave their source in order.
    pub fn is_piece(&self) -> bool {
        self.piece > 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doc {
    pub pos: DocPos,
    /// Never empty as a source reads it (sources count and skip empty documents); emptied by a
    /// source that tokenizes ahead, once `tokens` holds the document.
    pub text: String,
    /// The document's token ids (BOS/EOS included) when its source has tokenized it already:
    /// a mix in tokens (`[mix] unit = "tokens"`) needs every document's length before it is
    /// drawn. `None`: the pipeline's tokenize stage encodes `text`.
    pub tokens: Option<Vec<u32>>,
}

impl Doc {
    pub fn new(pos: DocPos, text: String) -> Self {
        Doc {
            pos,
            text,
            tokens: None,
        }
    }
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
    /// Rows whose text was larger than the source's `max_document_bytes`, skipped
    /// (`oversize = "skip"`).
    #[serde(default)]
    pub rows_oversize: u64,
    /// Rows over `max_document_bytes` cut into pieces (`oversize = "split"`).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub rows_split: u64,
    /// The pieces of those rows handed to the mixer (each one is also a document).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub split_pieces: u64,
    /// Documents handed to the mixer (a split row's pieces count one each).
    pub documents: u64,
    /// Times the source reached its end (`all_exhausted` restarts it).
    pub passes_completed: u32,
}

/// The boxed error sources return; the mixer wraps it with the source's name.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Where a source stands: the next row it will read is `row` of shard `shard` in pass `pass`;
/// or, in the middle of a split row (`piece ≥ 1`), the next document is piece `piece` of row
/// `row`.
/// With the source's counters this is its whole state, so a freshly opened source that
/// [`DocSource::seek`]s to it continues exactly where the original was. A `shard` at or past the
/// shard count means the pass has been read to its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceCursor {
    pub pass: u32,
    pub shard: u64,
    pub row: u64,
    /// 0, or the next piece of row `row` (see above). Absent from the JSON form when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub piece: u32,
    pub counters: SourceCounters,
}

/// A stream of documents in a fixed, deterministic order.
pub trait DocSource: Send {
    /// The next non-empty document that passes the row filter, or `None` at the end of the
    /// current pass.
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError>;
    /// Start the next pass from the first document, in the same order.
    fn restart(&mut self) -> Result<(), SourceError>;
    fn counters(&self) -> SourceCounters;
    /// Where the source stands (see [`SourceCursor`]).
    fn cursor(&self) -> SourceCursor;
    /// Continue from `cursor`, taken from a source over the same shards. Called on a source that
    /// has not been read yet.
    fn seek(&mut self, cursor: &SourceCursor) -> Result<(), SourceError>;
    /// The texts of the documents at `positions` (all of this source), in the order given,
    /// without moving the cursor: how resume rebuilds the shuffle buffer from references. A
    /// position that is not a document of this source is an error.
    fn read_docs(&mut self, positions: &[DocPos]) -> Result<Vec<String>, SourceError>;
    /// The documents at `positions` as [`DocSource::next_doc`] gives them: what resume puts
    /// back into the stream.
    fn reread(&mut self, positions: &[DocPos]) -> Result<Vec<Doc>, SourceError> {
        let texts = self.read_docs(positions)?;
        Ok(positions
            .iter()
            .zip(texts)
            .map(|(pos, text)| Doc::new(*pos, text))
            .collect())
    }
    /// A mix in tokens: start tokenizing these documents (each with its position, for
    /// messages): the next ones the mixer will emit from this source, in that order. A driver
    /// runs this on a pool of threads; [`DocSource::take_tokens`] hands the ids back, one
    /// document at a time, in the order given. The default cannot: such a source must hand its
    /// documents over tokenized.
    fn tokenize_ahead(&mut self, docs: Vec<(DocPos, String)>) -> Result<(), SourceError> {
        let _ = docs;
        Err("this source cannot tokenize documents ahead".into())
    }
    /// The ids of the next document given to [`DocSource::tokenize_ahead`] (BOS/EOS included),
    /// waiting for them if need be.
    fn take_tokens(&mut self) -> Result<Vec<u32>, SourceError> {
        Err("this source cannot tokenize documents ahead".into())
    }
}

/// A source over documents held in memory: for tests and for callers that already have text.
/// With [`VecSource::splitting`], texts over a limit are cut into pieces as a file source cuts
/// them under `oversize = "split"`.
#[derive(Clone, Debug)]
pub struct VecSource {
    source: u16,
    texts: Vec<String>,
    next: usize,
    pass: u32,
    counters: SourceCounters,
    /// The piece size of `oversize = "split"`, if texts over it are split.
    split_limit: Option<usize>,
    /// The row being cut, and its pieces still to hand out.
    splitting: Option<(u64, SplitDoc)>,
}

impl VecSource {
    pub fn new(source: u16, texts: Vec<String>) -> Self {
        Self {
            source,
            texts,
            next: 0,
            pass: 0,
            counters: SourceCounters::default(),
            split_limit: None,
            splitting: None,
        }
    }

    /// Texts over `limit_bytes` are cut into pieces of at most that ([`crate::split`]).
    pub fn splitting(mut self, limit_bytes: usize) -> Self {
        self.split_limit = Some(limit_bytes);
        self
    }

    fn pos(&self, row: u64, piece: u32) -> DocPos {
        DocPos {
            source: self.source,
            pass: self.pass,
            shard: 0,
            row,
            piece,
        }
    }

    /// The next piece of the row being cut, if any.
    fn next_piece(&mut self) -> Option<Doc> {
        let (row, split) = self.splitting.as_mut()?;
        let row = *row;
        let (k, text) = split.take()?;
        if split.is_done() {
            self.splitting = None;
        }
        self.counters.documents += 1;
        self.counters.split_pieces += 1;
        Some(Doc::new(self.pos(row, k), text))
    }
}

impl DocSource for VecSource {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        if let Some(doc) = self.next_piece() {
            return Ok(Some(doc));
        }
        while let Some(text) = self.texts.get(self.next) {
            let row = self.next as u64;
            self.next += 1;
            self.counters.rows_read += 1;
            if text.is_empty() {
                self.counters.rows_empty += 1;
                continue;
            }
            if let Some(limit) = self.split_limit.filter(|&l| text.len() > l) {
                self.counters.rows_split += 1;
                self.splitting = Some((row, SplitDoc::new(text.clone(), limit)));
                return Ok(self.next_piece());
            }
            self.counters.documents += 1;
            return Ok(Some(Doc::new(self.pos(row, 0), text.clone())));
        }
        if self.next == self.texts.len() {
            self.next += 1; // count the end of a pass once
            self.counters.passes_completed += 1;
        }
        Ok(None)
    }

    fn restart(&mut self) -> Result<(), SourceError> {
        self.next = 0;
        self.splitting = None;
        self.pass += 1;
        Ok(())
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }

    fn cursor(&self) -> SourceCursor {
        let (row, piece) = match &self.splitting {
            Some((row, split)) => (*row, split.next_piece()),
            None => (self.next as u64, 0),
        };
        SourceCursor {
            pass: self.pass,
            shard: 0,
            row,
            piece,
            counters: self.counters,
        }
    }

    fn seek(&mut self, cursor: &SourceCursor) -> Result<(), SourceError> {
        if cursor.shard != 0 || cursor.row > self.texts.len() as u64 + 1 {
            return Err(format!("cursor {cursor:?} is past the source's end").into());
        }
        self.pass = cursor.pass;
        self.next = cursor.row as usize;
        self.counters = cursor.counters;
        self.splitting = None;
        if cursor.piece > 0 {
            let at = |text: &String, limit| SplitDoc::at_piece(text.clone(), limit, cursor.piece);
            let split = match (self.texts.get(self.next), self.split_limit) {
                (Some(text), Some(limit)) if text.len() > limit => at(text, limit),
                _ => None,
            };
            let Some(split) = split else {
                return Err(
                    format!("cursor {cursor:?} names a piece the row does not have").into(),
                );
            };
            self.splitting = Some((cursor.row, split));
            self.next += 1;
        }
        Ok(())
    }

    fn read_docs(&mut self, positions: &[DocPos]) -> Result<Vec<String>, SourceError> {
        positions
            .iter()
            .map(|pos| {
                let text = self
                    .texts
                    .get(pos.row as usize)
                    .filter(|t| pos.source == self.source && pos.shard == 0 && !t.is_empty());
                let doc = match (text, pos.piece, self.split_limit) {
                    (Some(text), 0, _) => Some(text.as_str()),
                    (Some(text), k, Some(limit)) if text.len() > limit => {
                        crate::split::piece(text, limit, k)
                    }
                    _ => None,
                };
                doc.map(str::to_string)
                    .ok_or_else(|| format!("{pos:?} is not a document of this source").into())
            })
            .collect()
    }
}

/// A source that tokenizes ahead, one token per byte of text: how tests feed a mix in tokens
/// without a tokenizer, through the same [`DocSource::tokenize_ahead`] path a driver's pool
/// takes.
#[cfg(test)]
pub(crate) struct ByteTokens<S>(pub S, pub std::collections::VecDeque<Vec<u32>>);

#[cfg(test)]
impl<S> ByteTokens<S> {
    pub fn new(inner: S) -> Self {
        ByteTokens(inner, Default::default())
    }
}

#[cfg(test)]
impl<S: DocSource> DocSource for ByteTokens<S> {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        self.0.next_doc()
    }
    fn restart(&mut self) -> Result<(), SourceError> {
        self.0.restart()
    }
    fn counters(&self) -> SourceCounters {
        self.0.counters()
    }
    fn cursor(&self) -> SourceCursor {
        self.0.cursor()
    }
    fn seek(&mut self, cursor: &SourceCursor) -> Result<(), SourceError> {
        self.1.clear();
        self.0.seek(cursor)
    }
    fn read_docs(&mut self, positions: &[DocPos]) -> Result<Vec<String>, SourceError> {
        self.0.read_docs(positions)
    }
    fn tokenize_ahead(&mut self, docs: Vec<(DocPos, String)>) -> Result<(), SourceError> {
        let ids = docs
            .iter()
            .map(|(_, text)| text.bytes().map(u32::from).collect());
        self.1.extend(ids);
        Ok(())
    }
    fn take_tokens(&mut self) -> Result<Vec<u32>, SourceError> {
        self.1
            .pop_front()
            .ok_or_else(|| "tokens taken for a document not given".into())
    }
}
