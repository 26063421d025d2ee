//! The first documents of a local shard and how much of the shard they are: what `dsprep plan`
//! measures a source's tokens per byte on. Rows are read as a pack reads them (the text field,
//! the filter, the document limit), up to a budget of text; the share of the shard's bytes they
//! took is exact when the shard is read to its end, else the share of its rows (parquet, from
//! the footer) or of its bytes read from disk (JSON lines, gzip or not: a read-ahead of at most
//! 128 KiB over).

use super::jsonl::JsonlShard;
use super::parquet::{self, LocalBatches, ParquetShard};
use super::{RowText, ShardError, ShardReader};
use dsprep_mixers::recipe::{Format, SourceSpec};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The documents read from the start of a shard.
pub struct ShardSample {
    /// Their texts, in order (rows filtered out, empty or over the limit have none).
    pub texts: Vec<String>,
    /// Rows read, documents or not.
    pub rows: u64,
    /// The share of the shard's bytes those rows are (1 when the shard was read to its end).
    pub fraction: f64,
}

/// Read `path` (a local shard of `spec`) from its start until `text_budget_bytes` of document
/// text or its end. `None` for a source whose text is fetched per blob (`[source.content]`).
pub fn sample_local_shard(
    path: &Path,
    spec: &SourceSpec,
    text_budget_bytes: usize,
) -> Result<Option<ShardSample>, ShardError> {
    if spec.content.is_some() {
        return Ok(None);
    }
    let fail = |message: String| ShardError::new(path, None, message);
    let size = std::fs::metadata(path)
        .map_err(|e| fail(format!("cannot stat: {e}")))?
        .len();
    let read = Arc::new(AtomicU64::new(0));
    let (mut reader, rows_in_shard): (Box<dyn ShardReader>, Option<u64>) = match spec.format {
        Format::Parquet => {
            let (batches, _) = LocalBatches::open(path, spec, parquet::BATCH_ROWS, 0, None)?;
            let rows = parquet::local_num_rows(path)?;
            (Box::new(ParquetShard::new(batches, spec)), Some(rows))
        }
        Format::Jsonl | Format::JsonlGz => {
            let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
            let counted = Counted {
                inner: file,
                read: Arc::clone(&read),
            };
            let shard = match spec.format {
                Format::JsonlGz => {
                    JsonlShard::from_gzip(path.to_path_buf(), Box::new(counted), spec)
                }
                _ => JsonlShard::from_reader(
                    path.to_path_buf(),
                    Box::new(BufReader::with_capacity(1 << 16, counted)),
                    spec,
                ),
            };
            (Box::new(shard), None)
        }
    };
    let (mut texts, mut rows, mut text_bytes) = (Vec::new(), 0u64, 0usize);
    let limit = spec.document_limit();
    while text_bytes < text_budget_bytes {
        let Some((_, row)) = reader.next_row()? else {
            return Ok(Some(ShardSample {
                texts,
                rows,
                fraction: 1.0,
            }));
        };
        rows += 1;
        if let RowText::Text(text) = row
            && text.len() as u64 <= limit
        {
            text_bytes += text.len();
            texts.push(text);
        }
    }
    let fraction = match rows_in_shard {
        Some(total) => rows as f64 / total.max(1) as f64,
        None => read.load(Ordering::Relaxed) as f64 / size.max(1) as f64,
    };
    Ok(Some(ShardSample {
        texts,
        rows,
        fraction: fraction.min(1.0),
    }))
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}
