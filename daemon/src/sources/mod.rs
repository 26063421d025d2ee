//! File sources: a recipe `[[source]]` becomes a [`LocalSource`] that lists its shards (local
//! globs, or Hub listings at a pinned commit; sorted, then a seeded shuffle), reads them one
//! after another with the reader of their format, applies the row filter, counts and skips empty
//! documents, and hands documents to the mixer in a fixed order. Where the bytes come from never
//! changes the documents: a Hub shard yields exactly what the same file read locally yields.
//!
//! Hub shards are opened one ahead: while shard k is read, shard k+1's footer and first row
//! groups (or first body chunks) are already on their way.

mod content;
mod hub_parquet;
mod hub_spool;
mod hub_stream;
mod hub_verify;
mod jsonl;
mod listing;
mod page_check;
mod parquet;
mod read_ahead;
mod sample;

pub use content::FILE_BITS;
pub use listing::{ListError, list_shards, list_source};
pub use parquet::local_row_groups;
pub use sample::{ShardSample, sample_local_shard};

use crate::hub::{Download, ExpectedHash, HubClient, HubError, HubFile, Verified};
use content::{BlobShard, CONTENT_BATCH_ROWS, ContentResolver};
use dsprep_mixers::doc::{Doc, DocPos, DocSource, SourceCounters, SourceCursor, SourceError};
use dsprep_mixers::recipe::{Format, MAX_SPLIT_READ_BYTES, Oversize, SourceSpec, Verify};
use dsprep_mixers::split::{self, SplitDoc};
use hub_verify::Check;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An error inside one shard: names the file and, where known, the row or line.
#[derive(Clone, Debug, thiserror::Error)]
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

/// How a Hub error reads inside a shard error.
pub(crate) fn hub_error(error: HubError) -> String {
    format!("cannot read: {error}")
}

/// One shard of a source: a local file or a Hub file at a pinned commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shard {
    Local(PathBuf),
    /// One row group of a local parquet file: the unit a recipe's lanes deal out
    /// (`crate::driver::lanes`). Rows keep their numbers in the file.
    LocalRowGroup {
        path: PathBuf,
        row_group: usize,
    },
    Hub(Arc<HubFile>),
}

impl Shard {
    /// The local path, or `hf://datasets/{repo}@{sha}/{path}`: how messages and positions name it.
    pub fn display_path(&self) -> PathBuf {
        match self {
            Shard::Local(path) => path.clone(),
            Shard::LocalRowGroup { path, row_group } => {
                PathBuf::from(format!("{}[row group {row_group}]", path.display()))
            }
            Shard::Hub(file) => PathBuf::from(file.location()),
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
    /// Text of this many bytes, over the source's `max_document_bytes`.
    Oversize(u64),
    /// A JSON line of this many bytes, longer than any document within the source's
    /// `max_document_bytes` can need: read to its end, not kept.
    LongLine(u64),
}

/// Reads one shard's rows in order.
pub(crate) trait ShardReader: Send {
    /// The next row and its index in the shard, or `None` at the end.
    fn next_row(&mut self) -> Result<Option<(u64, RowText)>, ShardError>;
}

/// What a source needs to open its shards besides the recipe: where relative paths start, the
/// Hub client (when the recipe reads the network) and the content resolver (Stack v2 ids).
#[derive(Clone, Default)]
pub struct SourceContext {
    pub base: PathBuf,
    pub hub: Option<Arc<HubClient>>,
}

/// Open a shard for reading (on the calling thread: [`LocalSource::open_fresh`] has its rows read
/// ahead). `from_row` is a hint: readers that can start later (local parquet, at the row group
/// holding it) do, and every reader still numbers rows from the file's start, so the caller skips
/// what remains below `from_row`.
fn open_shard(
    shard: &Shard,
    download: Option<&Arc<Download>>,
    spec: &SourceSpec,
    hub: Option<&Arc<HubClient>>,
    content: Option<&Arc<ContentResolver>>,
    from_row: u64,
) -> Result<Box<dyn ShardReader>, ShardError> {
    let batch_rows = if content.is_some() {
        CONTENT_BATCH_ROWS
    } else {
        parquet::BATCH_ROWS
    };
    let parquet_reader = |batches: Box<dyn parquet::BatchSource>,
                          label: PathBuf,
                          first_row: u64|
     -> Box<dyn ShardReader> {
        match content {
            Some(resolver) => Box::new(
                BlobShard::new(label, batches, spec, resolver.clone()).starting_at(first_row),
            ),
            None => Box::new(parquet::ParquetShard::new(batches, spec).starting_at(first_row)),
        }
    };
    match shard {
        Shard::Local(path) => Ok(match spec.format {
            Format::Parquet => {
                let from = match content {
                    Some(_) => {
                        BlobShard::<Box<dyn parquet::BatchSource>>::repository_row(spec, from_row)
                    }
                    None => from_row,
                };
                let (batches, first_row) =
                    parquet::LocalBatches::open(path, spec, batch_rows, from, None)?;
                parquet_reader(Box::new(batches), path.clone(), first_row)
            }
            Format::Jsonl => Box::new(jsonl::JsonlShard::open(path, spec, false)?),
            Format::JsonlGz => Box::new(jsonl::JsonlShard::open(path, spec, true)?),
        }),
        Shard::LocalRowGroup { path, row_group } => {
            if spec.format != Format::Parquet || content.is_some() {
                return Err(ShardError::new(
                    path,
                    None,
                    "internal error: only plain parquet shards are split into row groups",
                ));
            }
            let (batches, first_row) =
                parquet::LocalBatches::open(path, spec, batch_rows, from_row, Some(*row_group))?;
            Ok(parquet_reader(Box::new(batches), path.clone(), first_row))
        }
        Shard::Hub(file) => {
            let label = PathBuf::from(file.location());
            let (Some(client), Some(download)) = (hub, download) else {
                return Err(ShardError::new(
                    &label,
                    None,
                    "a Hub shard needs a Hub client",
                ));
            };
            let download = download.clone();
            let expected = ExpectedHash::of(file);
            let io = client.handle();
            let by_ranges = |check| {
                let batches = hub_parquet::HubBatches::start(
                    client.clone(),
                    download.clone(),
                    spec,
                    batch_rows,
                    check,
                );
                Ok(parquet_reader(Box::new(batches), label.clone(), 0))
            };
            match (spec.format, spec.verify) {
                (Format::Parquet, Verify::Auto) => return by_ranges(Check::Auto(expected)),
                (Format::Parquet, Verify::Pages) => return by_ranges(Check::Pages),
                (Format::Parquet, Verify::None) => return by_ranges(Check::None),
                (Format::Parquet, Verify::Full) | (Format::Jsonl | Format::JsonlGz, _) => {}
            }
            let expected = match (expected, spec.verify) {
                (Some(expected), Verify::Auto | Verify::Pages | Verify::Full) => expected,
                (None, Verify::Auto | Verify::Full) => {
                    return Err(ShardError::new(
                        &label,
                        None,
                        format!(
                            "the Hub's listing gives no sha256 or git blob id for it, so its \
                             bytes cannot be checked (verify = \"{}\"): set verify = \"none\" \
                             on its source to read it unchecked",
                            verify_name(spec.verify)
                        ),
                    ));
                }
                // Nothing to check against, or asked not to: streamed as it arrives.
                (_, Verify::Pages | Verify::None) => {
                    download.record(Verified::Nothing);
                    let stream = hub_stream::ChannelRead::start(&io, download);
                    return Ok(whole_file_reader(label, Box::new(stream), spec));
                }
            };
            let spooled = hub_spool::SpooledRead::start(io, download, expected);
            Ok(match spec.format {
                Format::Parquet => parquet_reader(
                    Box::new(hub_spool::SpooledParquet::new(
                        label.clone(),
                        spooled,
                        spec,
                        batch_rows,
                    )),
                    label,
                    0,
                ),
                Format::Jsonl | Format::JsonlGz => {
                    whole_file_reader(label, Box::new(spooled), spec)
                }
            })
        }
    }
}

/// `verify`'s value as a recipe writes it.
fn verify_name(verify: Verify) -> &'static str {
    match verify {
        Verify::Auto => "auto",
        Verify::Pages => "pages",
        Verify::Full => "full",
        Verify::None => "none",
    }
}

/// A JSON-lines shard (plain or gzip, as `spec` says) over the bytes of a whole Hub file.
fn whole_file_reader(
    label: PathBuf,
    bytes: Box<dyn std::io::Read + Send>,
    spec: &SourceSpec,
) -> Box<dyn ShardReader> {
    match spec.format {
        Format::JsonlGz => Box::new(jsonl::JsonlShard::from_gzip(label, bytes, spec)),
        _ => Box::new(jsonl::JsonlShard::from_reader(
            label,
            Box::new(std::io::BufReader::with_capacity(1 << 16, bytes)),
            spec,
        )),
    }
}

impl parquet::BatchSource for Box<dyn parquet::BatchSource> {
    fn next_batch(
        &mut self,
        next_row: u64,
    ) -> Result<Option<arrow_array::RecordBatch>, ShardError> {
        self.as_mut().next_batch(next_row)
    }
}

/// A recipe source over files, local or on the Hub.
pub struct LocalSource {
    index: u16,
    spec: SourceSpec,
    /// In reading order (already shuffled).
    shards: Vec<Shard>,
    /// `shards`' display paths, for positions and messages.
    paths: Vec<PathBuf>,
    /// Per Hub shard, its download: resolved once, reused by every pass.
    downloads: Vec<Option<Arc<Download>>>,
    hub: Option<Arc<HubClient>>,
    content: Option<Arc<ContentResolver>>,
    next_shard: usize,
    current: Option<(u32, Box<dyn ShardReader>)>,
    /// The next row of `current` to hand out (the row after the last one read).
    current_row: u64,
    /// A row already read from `current` (by [`DocSource::seek`]) and not yet handed out.
    held: Option<(u64, RowText)>,
    /// A Hub shard opened ahead of its turn: (index in `shards`, reader).
    ahead: Option<(usize, Box<dyn ShardReader>)>,
    /// The row being cut into pieces (`oversize = "split"`), until its last piece is handed out.
    splitting: Option<Splitting>,
    pass: u32,
    counters: SourceCounters,
}

/// A row over `max_document_bytes` being handed out piece by piece.
struct Splitting {
    shard: u32,
    row: u64,
    doc: SplitDoc,
}

impl LocalSource {
    /// The Hub client this source reads through, if it reads the Hub.
    pub fn hub(&self) -> Option<&Arc<HubClient>> {
        self.hub.as_ref()
    }
    /// A source over local files only.
    pub fn new(index: u16, spec: SourceSpec, shards: Vec<PathBuf>) -> Self {
        let shards = shards.into_iter().map(Shard::Local).collect();
        Self::with_shards(index, spec, shards, &SourceContext::default())
            .unwrap_or_else(|e| unreachable!("no content resolver without content: {e}"))
    }

    /// A source over any shards; fails when its `[source.content]` cannot be served.
    pub fn with_shards(
        index: u16,
        spec: SourceSpec,
        shards: Vec<Shard>,
        context: &SourceContext,
    ) -> Result<Self, String> {
        let content = ContentResolver::for_source(&spec, &context.base, context.hub.as_ref())
            .map_err(|e| format!("source {:?}: {e}", spec.name))?;
        let downloads = shards
            .iter()
            .map(|shard| match (shard, &context.hub) {
                (Shard::Hub(file), Some(hub)) => {
                    Some(Arc::new(Download::new(hub.inner().clone(), file.clone())))
                }
                _ => None,
            })
            .collect();
        Ok(Self {
            index,
            paths: shards.iter().map(Shard::display_path).collect(),
            downloads,
            spec,
            shards,
            hub: context.hub.clone(),
            content,
            next_shard: 0,
            current: None,
            current_row: 0,
            held: None,
            ahead: None,
            splitting: None,
            pass: 0,
            counters: SourceCounters::default(),
        })
    }

    /// Display paths of the shards, in reading order.
    pub fn shards(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The shards, in reading order.
    pub fn shard_list(&self) -> &[Shard] {
        &self.shards
    }

    fn open(&mut self, at: usize) -> Result<Box<dyn ShardReader>, ShardError> {
        if let Some((ahead_at, reader)) = self.ahead.take()
            && ahead_at == at
        {
            return Ok(reader);
        }
        self.open_fresh(at, 0)
    }

    /// Shard `at`, its rows read ahead on a thread of their own (`read_ahead.rs`).
    fn open_fresh(&self, at: usize, from_row: u64) -> Result<Box<dyn ShardReader>, ShardError> {
        let reader = open_shard(
            &self.shards[at],
            self.downloads[at].as_ref(),
            &self.spec,
            self.hub.as_ref(),
            self.content.as_ref(),
            from_row,
        )?;
        Ok(read_ahead::start(reader, self.shards[at].display_path()))
    }

    /// The row of `reader` at or after `row`, reading past the ones before it (uncounted: they
    /// were counted before the checkpoint); `None` at the shard's end.
    fn skip_to(
        reader: &mut dyn ShardReader,
        row: u64,
    ) -> Result<Option<(u64, RowText)>, ShardError> {
        while let Some((at, outcome)) = reader.next_row()? {
            if at >= row {
                return Ok(Some((at, outcome)));
            }
        }
        Ok(None)
    }

    /// Start the next shard now, so that its first rows are read (a Hub shard's fetched, a
    /// parquet shard's decoded) by the time the reader gets to it. Errors come when it is read:
    /// one that fails to open here is opened again at its turn.
    fn open_ahead(&mut self, at: usize) {
        if self.ahead.is_none()
            && at < self.shards.len()
            && let Ok(reader) = self.open_fresh(at, 0)
        {
            self.ahead = Some((at, reader));
        }
    }

    /// The next piece of the row being split, if one is being split.
    fn next_piece(&mut self) -> Option<Doc> {
        let splitting = self.splitting.as_mut()?;
        let (shard, row) = (splitting.shard, splitting.row);
        let taken = splitting.doc.take();
        if splitting.doc.is_done() {
            self.splitting = None; // lets go of the row's text
        }
        let (piece, text) = taken?;
        self.counters.documents += 1;
        self.counters.split_pieces += 1;
        Some(Doc::new(self.pos(shard, row, piece), text))
    }

    fn pos(&self, shard: u32, row: u64, piece: u32) -> DocPos {
        DocPos {
            source: self.index,
            pass: self.pass,
            shard,
            row,
            piece,
        }
    }

    /// Piece `k` of a row's text, if the source splits and the text was split.
    fn piece_of<'t>(&self, text: &'t str, k: u32) -> Option<&'t str> {
        let limit = self.spec.document_limit();
        let splits = self.spec.oversize == Some(Oversize::Split);
        (splits && text.len() as u64 > limit)
            .then(|| split::piece(text, limit as usize, k))
            .flatten()
    }

    /// The text of `row` as a resumed split needs it: a row this source splits.
    fn split_row_text(
        &self,
        shard: usize,
        row: u64,
        read: Option<(u64, RowText)>,
    ) -> Result<String, ShardError> {
        let limit = self.spec.document_limit();
        match read {
            Some((at, RowText::Text(text)))
                if at == row
                    && text.len() as u64 > limit
                    && self.spec.oversize == Some(Oversize::Split) =>
            {
                Ok(text)
            }
            _ => Err(self.not_there(shard, row, 1, "it is not a row this source splits")),
        }
    }

    /// A checkpoint's piece of a split row that the file does not give.
    fn not_there(&self, shard: usize, row: u64, piece: u32, why: &str) -> ShardError {
        ShardError::new(
            &self.paths[shard],
            Some(format!("row {row} piece {piece}")),
            format!(
                "the checkpoint refers to a piece of a split row that is not there ({why}): has \
                 the file or max_document_bytes changed since?"
            ),
        )
    }

    /// A row over what the source takes: skipped and counted, or the run's error.
    fn oversize(&mut self, shard: u32, row: u64, outcome: RowText) -> Result<(), ShardError> {
        let limit = self.spec.document_limit();
        let policy = self.spec.oversize.unwrap_or_default();
        if policy == Oversize::Skip {
            self.counters.rows_oversize += 1;
            return Ok(());
        }
        let name = &self.spec.name;
        let (what, fix) = match (outcome, policy) {
            (RowText::LongLine(bytes), Oversize::Split) => (
                format!(
                    "a line of {bytes} bytes is longer than any document oversize = \"split\" \
                     reads can need (2 × {MAX_SPLIT_READ_BYTES} + 1 MiB)"
                ),
                "set oversize = \"skip\" to leave such documents out, counted",
            ),
            (RowText::LongLine(bytes), _) => (
                format!(
                    "a line of {bytes} bytes is longer than any document within source {name:?}'s \
                     max_document_bytes = {limit} can need (2 × max_document_bytes + 1 MiB)"
                ),
                "raise max_document_bytes (at most 1 GiB), set oversize = \"skip\" to leave such \
                 documents out, counted, or oversize = \"split\" to cut them into pieces",
            ),
            (outcome, Oversize::Split) => (
                format!(
                    "a document of {} bytes is over what oversize = \"split\" reads \
                     ({MAX_SPLIT_READ_BYTES} bytes, 1 GiB)",
                    outcome_bytes(&outcome)
                ),
                "set oversize = \"skip\" to leave such documents out, counted",
            ),
            (outcome, _) => (
                format!(
                    "a document of {} bytes is over source {name:?}'s max_document_bytes = {limit}",
                    outcome_bytes(&outcome)
                ),
                "raise max_document_bytes (at most 1 GiB), set oversize = \"skip\" to leave such \
                 documents out, counted, or oversize = \"split\" to cut them into pieces",
            ),
        };
        let location = match self.spec.format {
            Format::Jsonl | Format::JsonlGz => format!("line {}", row + 1),
            Format::Parquet => format!("row {row}"),
        };
        Err(ShardError::new(
            &self.paths[shard as usize],
            Some(location),
            format!("{what}: {fix}"),
        ))
    }
}

/// The size a row outcome over the limit reports.
fn outcome_bytes(outcome: &RowText) -> u64 {
    match outcome {
        RowText::Oversize(bytes) | RowText::LongLine(bytes) => *bytes,
        RowText::Text(text) => text.len() as u64,
        RowText::Filtered | RowText::Empty => 0,
    }
}

impl DocSource for LocalSource {
    fn next_doc(&mut self) -> Result<Option<Doc>, SourceError> {
        loop {
            if let Some(doc) = self.next_piece() {
                return Ok(Some(doc));
            }
            if self.current.is_none() {
                if self.next_shard >= self.shards.len() {
                    if self.next_shard == self.shards.len() {
                        self.next_shard += 1; // the end of a pass is counted once
                        self.counters.passes_completed += 1;
                    }
                    return Ok(None);
                }
                let at = self.next_shard;
                let reader = self.open(at)?;
                self.current = Some((at as u32, reader));
                self.current_row = 0;
                self.next_shard += 1;
                self.open_ahead(at + 1);
            }
            let (shard, reader) = self.current.as_mut().expect("opened above");
            let shard = *shard;
            let next = match self.held.take() {
                Some(held) => Some(held),
                None => reader.next_row()?,
            };
            let Some((row, outcome)) = next else {
                self.current = None;
                continue;
            };
            self.current_row = row + 1;
            self.counters.rows_read += 1;
            let limit = self.spec.document_limit();
            let policy = self.spec.oversize.unwrap_or_default();
            match outcome {
                RowText::Filtered => self.counters.rows_filtered += 1,
                RowText::Empty => self.counters.rows_empty += 1,
                RowText::Text(text) if text.len() as u64 > limit && policy == Oversize::Split => {
                    self.counters.rows_split += 1;
                    let doc = SplitDoc::new(text, limit as usize);
                    self.splitting = Some(Splitting { shard, row, doc });
                }
                RowText::Text(text) if text.len() as u64 > limit => {
                    self.oversize(shard, row, RowText::Oversize(text.len() as u64))?;
                }
                RowText::Oversize(_) | RowText::LongLine(_) => {
                    self.oversize(shard, row, outcome)?;
                }
                RowText::Text(text) => {
                    self.counters.documents += 1;
                    return Ok(Some(Doc::new(self.pos(shard, row, 0), text)));
                }
            }
        }
    }

    fn restart(&mut self) -> Result<(), SourceError> {
        self.next_shard = 0;
        self.current = None;
        self.held = None;
        self.ahead = None;
        self.splitting = None;
        self.pass += 1;
        Ok(())
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }

    fn cursor(&self) -> SourceCursor {
        let (shard, row, piece) = match (&self.splitting, &self.current) {
            (Some(s), _) => (u64::from(s.shard), s.row, s.doc.next_piece()),
            (None, Some((shard, _))) => (u64::from(*shard), self.current_row, 0),
            (None, None) => (self.next_shard as u64, 0, 0),
        };
        SourceCursor {
            pass: self.pass,
            shard,
            row,
            piece,
            counters: self.counters,
        }
    }

    fn seek(&mut self, cursor: &SourceCursor) -> Result<(), SourceError> {
        let shards = self.shards.len() as u64;
        if cursor.shard > shards + 1 {
            return Err(format!(
                "the checkpoint's cursor is at shard {} of {shards}: the shard list has changed",
                cursor.shard
            )
            .into());
        }
        self.pass = cursor.pass;
        self.counters = cursor.counters;
        self.ahead = None;
        self.held = None;
        self.current = None;
        self.splitting = None;
        self.next_shard = cursor.shard as usize;
        if cursor.shard < shards {
            let at = cursor.shard as usize;
            let mut reader = self.open_fresh(at, cursor.row)?;
            self.held = Self::skip_to(reader.as_mut(), cursor.row)?;
            self.current_row = cursor.row;
            if cursor.piece > 0 {
                // In the middle of a split row: cut it again, up to the piece that comes next.
                let read = self.held.take();
                let text = self.split_row_text(at, cursor.row, read)?;
                let limit = self.spec.document_limit() as usize;
                let doc = SplitDoc::at_piece(text, limit, cursor.piece).ok_or_else(|| {
                    self.not_there(at, cursor.row, cursor.piece, "the row has fewer pieces")
                })?;
                let (shard, row) = (at as u32, cursor.row);
                self.splitting = Some(Splitting { shard, row, doc });
                self.current_row = cursor.row + 1;
            }
            self.current = Some((at as u32, reader));
            self.next_shard = at + 1;
            self.open_ahead(at + 1);
        } else if cursor.piece > 0 {
            return Err(format!(
                "the checkpoint's cursor is at piece {} past the last shard",
                cursor.piece
            )
            .into());
        }
        Ok(())
    }

    fn read_docs(&mut self, positions: &[DocPos]) -> Result<Vec<String>, SourceError> {
        // Shard by shard, each read once from its first wanted row.
        let mut order: Vec<usize> = (0..positions.len()).collect();
        order.sort_by_key(|&k| (positions[k].shard, positions[k].row));
        let mut texts = vec![String::new(); positions.len()];
        let mut k = 0;
        while k < order.len() {
            let shard = positions[order[k]].shard as usize;
            let Some(path) = self.paths.get(shard) else {
                return Err(format!(
                    "the checkpoint refers to shard {shard}, the source has {}",
                    self.shards.len()
                )
                .into());
            };
            let path = path.clone();
            let mut reader = self.open_fresh(shard, positions[order[k]].row)?;
            let mut last: Option<(u64, String)> = None;
            while k < order.len() && positions[order[k]].shard as usize == shard {
                let DocPos { row, piece, .. } = positions[order[k]];
                if last.as_ref().is_none_or(|(at, _)| *at != row) {
                    last = match Self::skip_to(reader.as_mut(), row)? {
                        Some((at, RowText::Text(text))) if at == row => Some((at, text)),
                        _ => {
                            return Err(ShardError::new(
                                &path,
                                Some(format!("row {row}")),
                                "the checkpoint refers to a document that is not there \
                                 (has the file changed since?)",
                            )
                            .into());
                        }
                    };
                }
                let text = last.as_ref().map(|(_, t)| t.as_str()).unwrap_or_default();
                texts[order[k]] = match piece {
                    0 => text.to_string(),
                    n => self
                        .piece_of(text, n)
                        .ok_or_else(|| self.not_there(shard, row, n, "no such piece"))?
                        .to_string(),
                };
                k += 1;
            }
        }
        Ok(texts)
    }
}

#[cfg(test)]
mod tests;
