//! Parquet shards on the Hub, read by HTTP range: the footer first (one request for its last
//! 64 KiB, a second only if the metadata is larger), then, row group after row group, only the
//! column chunks of the projected leaves (coalesced into one request per row group when close).
//!
//! By default a file is read by ranges only when its first page carries a CRC ([`hub_verify`]);
//! one without is downloaded whole into the spool and checked against its sha256 instead
//! ([`SpooledParquet`]), chosen in the background as the shard opens.
//!
//! The decoding is parquet's async reader over [`HubReader`] (an `AsyncFileReader`), polled with
//! `block_on` on the source's reader thread, so decoding never runs on the IO runtime. Each
//! prefetched row group's page headers are checked there too, before the decoder sees them, and
//! the pages' CRCs as the source's `verify` says ([`Crc`]; a mismatch downloads the row group
//! again). A prefetch task fetches the next `readahead` row groups into a bounded channel, whole
//! or not at all (each range is re-fetched until complete), so the tokenizer does not wait on
//! the network.

use super::hub_spool::{SpooledParquet, SpooledRead};
use super::hub_verify::{self, Check};
use super::page_check::{Crc, PageFault, ReadAt};
use super::parquet::{BatchSource, check_pages, projection, with_string_views};
use super::{ShardError, hub_error};
use crate::hub::{Download, HubClient, HubError, RangeBytes, VERIFY_DOWNLOADS, Verified};
use arrow_array::RecordBatch;
use bytes::{Bytes, BytesMut};
use dsprep_mixers::recipe::SourceSpec;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{
    AsyncFileReader, ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Bytes read from the end of a file in the first footer request.
const FOOTER_HINT_BYTES: u64 = 64 << 10;
/// Column chunks closer than this are fetched in one request (the gap is read and dropped).
const COALESCE_GAP_BYTES: u64 = 256 << 10;
/// Row-group fetches in flight at once per shard (the channel holds `readahead` more).
const FETCHES_IN_FLIGHT: usize = 2;

type Prefetched = Result<Vec<RangeBytes>, HubError>;

/// `AsyncFileReader` over one Hub file: serves ranges from the prefetched row groups, and
/// fetches anything else directly.
pub(crate) struct HubReader {
    download: Arc<Download>,
    metadata: Option<Arc<ParquetMetaData>>,
    prefetched: Option<mpsc::Receiver<Prefetched>>,
    /// The prefetched buffers of the row group being decoded.
    current: Vec<RangeBytes>,
    /// The projection, and the row group the next prefetched buffers hold: their page headers
    /// are checked ([`check_pages`]) before the decoder sees them.
    mask: Option<ProjectionMask>,
    next_group: usize,
    /// Per row group, the ranges of its projected column chunks (to download one again).
    groups: Vec<Vec<Range<u64>>>,
    /// Which page CRCs are checked.
    crc: Crc,
}

/// A row group refused by [`check_pages`], as the decoder's error.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The prefetched buffers, read at file offsets (a range not fetched reads as nothing).
struct Buffers<'a>(&'a [RangeBytes]);

impl ReadAt for Buffers<'_> {
    fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let found = self.0.iter().find(|b| {
            let end = b.start + b.bytes.len() as u64;
            b.start <= offset && offset < end
        });
        Ok(found.map_or_else(Vec::new, |b| {
            let from = (offset - b.start) as usize;
            b.bytes[from..(from + len).min(b.bytes.len())].to_vec()
        }))
    }
}

impl HubReader {
    /// Row group `group`'s buffers once their pages pass [`check_pages`], CRCs included. Bytes
    /// that fail (a page that does not match its CRC, or a header that is not one) download the
    /// row group again, [`VERIFY_DOWNLOADS`] times in all: over a network a changed byte and a
    /// file written wrong look alike until a second download agrees.
    async fn checked(
        &self,
        group: usize,
        mut buffers: Vec<RangeBytes>,
    ) -> parquet::errors::Result<Vec<RangeBytes>> {
        let (Some(metadata), Some(mask)) = (&self.metadata, &self.mask) else {
            return Ok(buffers);
        };
        let mut attempt = 1;
        loop {
            let fault = match check_pages(metadata, group, mask, &mut Buffers(&buffers), self.crc) {
                Ok(pages) => {
                    self.download.record(Verified::Pages {
                        read: pages.pages,
                        with_crc: pages.with_crc,
                    });
                    return Ok(buffers);
                }
                Err(fault) => fault,
            };
            if attempt == VERIFY_DOWNLOADS {
                let why = match fault {
                    PageFault::Crc(why) => format!(
                        "{why}, on {VERIFY_DOWNLOADS} downloads: the bytes change on the way \
                         (a proxy or cache between here and the Hub?) or the file is corrupt"
                    ),
                    PageFault::NoCrc(why) => format!(
                        "{why} where the file's first page carries one, on {VERIFY_DOWNLOADS} \
                         downloads: read this file with verify = \"full\""
                    ),
                    PageFault::Refused(why) => why,
                };
                return Err(ParquetError::External(Box::new(Refused(why))));
            }
            tracing::warn!(
                "{}: {fault}; downloading row group {group} again ({attempt} of \
                 {VERIFY_DOWNLOADS})",
                self.download.file().location()
            );
            let ranges = self.groups.get(group).cloned().unwrap_or_default();
            buffers = fetch_coalesced(&self.download, ranges, None)
                .await
                .map_err(external)?;
            attempt += 1;
        }
    }

    fn lookup(&self, range: &Range<u64>) -> Option<Bytes> {
        self.current.iter().find_map(|b| {
            let end = b.start + b.bytes.len() as u64;
            (b.start <= range.start && range.end <= end).then(|| {
                b.bytes
                    .slice((range.start - b.start) as usize..(range.end - b.start) as usize)
            })
        })
    }
}

fn external(error: HubError) -> ParquetError {
    ParquetError::External(Box::new(error))
}

impl AsyncFileReader for HubReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            if let Some(bytes) = self.lookup(&range) {
                return Ok(bytes);
            }
            self.download.range(range).await.map_err(external)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            loop {
                let served: Option<Vec<Bytes>> = ranges.iter().map(|r| self.lookup(r)).collect();
                if let Some(served) = served {
                    return Ok(served);
                }
                let Some(prefetched) = self.prefetched.as_mut() else {
                    break;
                };
                match prefetched.recv().await {
                    Some(Ok(buffers)) => {
                        let group = self.next_group;
                        self.next_group += 1;
                        self.current = self.checked(group, buffers).await?;
                    }
                    Some(Err(error)) => return Err(external(error)),
                    None => self.prefetched = None,
                }
            }
            // Not planned ahead (never expected): fetch it now, coalesced.
            let buffers = fetch_coalesced(&self.download, ranges.clone(), None)
                .await
                .map_err(external)?;
            self.current = buffers;
            ranges
                .iter()
                .map(|r| {
                    self.lookup(r)
                        .ok_or_else(|| ParquetError::General("a fetched range went missing".into()))
                })
                .collect()
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            if let Some(metadata) = &self.metadata {
                return Ok(metadata.clone());
            }
            let size = self.download.file().size;
            let metadata = ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(FOOTER_HINT_BYTES as usize))
                .load_and_finish(&mut *self, size)
                .await?;
            let metadata = Arc::new(metadata);
            self.metadata = Some(metadata.clone());
            Ok(metadata)
        }
        .boxed()
    }
}

/// Fetch `ranges` (sorted or not), merging those closer than [`COALESCE_GAP_BYTES`]. Ranges
/// inside `held` (the footer read, which is the whole of a small file) cost no request.
async fn fetch_coalesced(
    download: &Download,
    mut ranges: Vec<Range<u64>>,
    held: Option<&RangeBytes>,
) -> Result<Vec<RangeBytes>, HubError> {
    if let Some(held) = held {
        let end = held.start + held.bytes.len() as u64;
        if ranges.iter().all(|r| held.start <= r.start && r.end <= end) {
            return Ok(vec![held.clone()]);
        }
    }
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end + COALESCE_GAP_BYTES => {
                last.end = last.end.max(range.end)
            }
            _ => merged.push(range),
        }
    }
    let mut out = Vec::with_capacity(merged.len());
    for range in merged {
        let bytes = download.range(range.clone()).await?;
        out.push(RangeBytes {
            start: range.start,
            bytes,
        });
    }
    Ok(out)
}

/// The footer: the last 64 KiB (or the whole small file), then the rest of the metadata if it
/// is longer. Decoded off the runtime, on the blocking pool. Also returns the tail read.
async fn load_metadata(download: &Download) -> Result<(ArrowReaderMetadata, RangeBytes), String> {
    let size = download.file().size;
    if size < 12 {
        return Err(format!("not a parquet file ({size} bytes)"));
    }
    let first = size.saturating_sub(FOOTER_HINT_BYTES);
    let tail = download
        .range(first..size)
        .await
        .map_err(|e| e.to_string())?;
    let n = tail.len();
    if &tail[n - 4..] != b"PAR1" {
        return Err("not a parquet file (it does not end with PAR1)".into());
    }
    let metadata_len =
        u32::from_le_bytes([tail[n - 8], tail[n - 7], tail[n - 6], tail[n - 5]]) as u64;
    let footer_start = size.checked_sub(8 + metadata_len).ok_or_else(|| {
        format!("corrupt footer: metadata of {metadata_len} bytes in a {size}-byte file")
    })?;
    let footer = if footer_start >= first {
        tail.slice((footer_start - first) as usize..n - 8)
    } else {
        let head = download
            .range(footer_start..first)
            .await
            .map_err(|e| e.to_string())?;
        let mut whole = BytesMut::with_capacity((metadata_len + 8) as usize);
        whole.extend_from_slice(&head);
        whole.extend_from_slice(&tail[..n - 8]);
        whole.freeze()
    };
    let metadata = tokio::task::spawn_blocking(move || {
        let metadata = ParquetMetaDataReader::decode_metadata(&footer)
            .map_err(|e| format!("not a readable parquet file: {e}"))?;
        super::parquet::check_column_chunks(&metadata, size)?;
        ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
            .and_then(with_string_views)
            .map_err(|e| format!("not a readable parquet file: {e}"))
    })
    .await
    .map_err(|e| format!("the footer decoder stopped: {e}"))??;
    Ok((
        metadata,
        RangeBytes {
            start: first,
            bytes: tail,
        },
    ))
}

/// For each row group, the byte ranges of the projected leaves' column chunks.
fn plan(metadata: &ParquetMetaData, mask: &ProjectionMask) -> Vec<Vec<Range<u64>>> {
    metadata
        .row_groups()
        .iter()
        .map(|rg| {
            (0..rg.num_columns())
                .filter(|&leaf| mask.leaf_included(leaf))
                .map(|leaf| {
                    let (start, len) = rg.column(leaf).byte_range();
                    start..start + len
                })
                .collect()
        })
        .collect()
}

type Stream = ParquetRecordBatchStream<HubReader>;

/// How a shard is read once its check is chosen.
enum Opened {
    Ranges(Box<Stream>),
    Whole(Box<SpooledParquet>),
}

/// Open a Hub shard in the background: the check (`check`), then, read by ranges, the footer,
/// projection and the prefetch task; read whole, the spool. The shard comes back through
/// `opened` once its footer is read or its spool started.
async fn open(
    download: Arc<Download>,
    spec: SourceSpec,
    readahead: usize,
    batch_rows: usize,
    check: Check,
) -> Result<Opened, String> {
    let crc = match check {
        Check::Auto(expected) => {
            if hub_verify::first_page_has_crc(&download).await {
                Crc::Required
            } else {
                let label = PathBuf::from(download.file().location());
                let expected = expected.ok_or_else(|| hub_verify::NO_HASH.to_string())?;
                let io = tokio::runtime::Handle::current();
                let spooled = SpooledRead::start(io, download, expected);
                return Ok(Opened::Whole(Box::new(SpooledParquet::new(
                    label, spooled, &spec, batch_rows,
                ))));
            }
        }
        Check::Pages => Crc::WherePresent,
        Check::None => Crc::Off,
    };
    let (metadata, tail) = load_metadata(&download).await?;
    let mask = projection(metadata.schema(), metadata.parquet_schema(), &spec)?;
    let plan = plan(metadata.metadata(), &mask);
    let groups = plan.clone();
    let (tx, rx) = mpsc::channel::<Prefetched>(readahead);
    let fetcher = download.clone();
    tokio::spawn(async move {
        let mut fetches = futures_util::stream::iter(plan)
            .map(|ranges| {
                let (download, tail) = (fetcher.clone(), tail.clone());
                async move { fetch_coalesced(&download, ranges, Some(&tail)).await }
            })
            .buffered(FETCHES_IN_FLIGHT);
        while let Some(result) = fetches.next().await {
            let failed = result.is_err();
            if tx.send(result).await.is_err() || failed {
                return; // the shard was dropped, or its error is delivered
            }
        }
    });
    let reader = HubReader {
        download,
        metadata: Some(metadata.metadata().clone()),
        prefetched: Some(rx),
        current: Vec::new(),
        mask: Some(mask.clone()),
        next_group: 0,
        groups,
        crc,
    };
    ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata)
        .with_projection(mask)
        .with_batch_size(batch_rows)
        .build()
        .map(|stream| Opened::Ranges(Box::new(stream)))
        .map_err(|e| format!("cannot read: {e}"))
}

enum State {
    Opening(oneshot::Receiver<Result<Opened, String>>),
    Open(Opened),
}

/// Batches of a Hub parquet shard, checked as `check` says; opening starts at once in the
/// background.
pub(crate) struct HubBatches {
    label: PathBuf,
    client: Arc<HubClient>,
    state: State,
}

impl HubBatches {
    pub(crate) fn start(
        client: Arc<HubClient>,
        download: Arc<Download>,
        spec: &SourceSpec,
        batch_rows: usize,
        check: Check,
    ) -> HubBatches {
        let label = PathBuf::from(download.file().location());
        let (tx, rx) = oneshot::channel();
        let readahead = client.config().readahead_row_groups;
        let spec = spec.clone();
        client.spawn(async move {
            let _ = tx.send(open(download, spec, readahead, batch_rows, check).await);
        });
        HubBatches {
            label,
            client,
            state: State::Opening(rx),
        }
    }
}

impl BatchSource for HubBatches {
    fn next_batch(&mut self, next_row: u64) -> Result<Option<RecordBatch>, ShardError> {
        if let State::Opening(rx) = &mut self.state {
            let opened = self
                .client
                .block_on(rx)
                .map_err(|_| ShardError::new(&self.label, None, "the opening task stopped"))?;
            let opened = opened.map_err(|message| ShardError::new(&self.label, None, message))?;
            self.state = State::Open(opened);
        }
        let stream = match &mut self.state {
            State::Open(Opened::Ranges(stream)) => stream,
            State::Open(Opened::Whole(spooled)) => return spooled.next_batch(next_row),
            State::Opening(_) => unreachable!("opened above"),
        };
        let next = self.client.block_on(stream.next());
        next.transpose().map_err(|e| {
            let message = match e {
                ParquetError::External(inner) => match inner.downcast::<HubError>() {
                    Ok(hub) => hub_error(*hub),
                    Err(other) => match other.downcast::<Refused>() {
                        Ok(refused) => refused.0,
                        Err(other) => format!("cannot decode: {other}"),
                    },
                },
                other => format!("cannot decode: {other}"),
            };
            ShardError::new(&self.label, Some(format!("row {next_row}")), message)
        })
    }
}
