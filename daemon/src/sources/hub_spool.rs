//! Hub files read whole (JSON lines, C4's `.json.gz`, parquet with `verify = "full"`, and by
//! default parquet without page CRCs):
//! downloaded into a spool file on local disk while hashed, checked against the hash the Hub
//! gives ([`ExpectedHash`]), and only then read. A file whose bytes do not match is downloaded
//! again, [`VERIFY_DOWNLOADS`] times in all, then stops the run naming the file and both
//! hashes: no byte of a file is used before the whole of it is checked, so nothing wrong is
//! ever tokenized, packed or served.
//!
//! The spool file is anonymous (unlinked at once: a killed process leaves nothing behind) in
//! `DSPREP_SPOOL_DIR` (default: the system's temporary folder). A plain thread per file writes
//! and hashes it, so hashing stays off the IO runtime; the download streams into the same bounded
//! channel as a streamed file's ([`ChannelRead`]). A shard opened ahead of its turn spools while
//! the one before it is read, so at most two files per source are on disk at once: the spool's
//! bound is the two largest files of each source read whole.

use super::ShardError;
use super::hub_stream::ChannelRead;
use super::parquet::{BatchSource, LocalBatches};
use crate::hub::{Download, ExpectedHash, HashMismatch, HubError, VERIFY_DOWNLOADS, Verified};
use arrow_array::RecordBatch;
use dsprep_mixers::recipe::SourceSpec;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A file being downloaded and checked in the background.
pub(crate) struct Spool {
    done: crossbeam_channel::Receiver<Result<File, HubError>>,
    /// Set when the reader is gone: the download stops at its next chunk.
    cancel: Arc<AtomicBool>,
}

impl Spool {
    /// Start downloading `download` into a spool file now, through the IO runtime `io`.
    pub(crate) fn start(
        io: tokio::runtime::Handle,
        download: Arc<Download>,
        expected: ExpectedHash,
    ) -> Spool {
        let (tx, done) = crossbeam_channel::bounded(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        let spawned = std::thread::Builder::new()
            .name("dsprep-spool".into())
            .spawn(move || {
                let _ = tx.send(spool(&io, &download, &expected, &stop));
            });
        if let Err(e) = spawned {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let _ = tx.send(Err(HubError::Config(format!(
                "cannot start a spool thread: {e}"
            ))));
            return Spool { done: rx, cancel };
        }
        Spool { done, cancel }
    }

    /// The checked file, positioned at its start (blocks until it is downloaded and checked).
    pub(crate) fn wait(&self) -> Result<File, HubError> {
        self.done
            .recv()
            .unwrap_or_else(|_| Err(HubError::Config("the spool thread stopped".into())))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

/// Download, hash and check, up to [`VERIFY_DOWNLOADS`] times.
fn spool(
    io: &tokio::runtime::Handle,
    download: &Arc<Download>,
    expected: &ExpectedHash,
    cancel: &AtomicBool,
) -> Result<File, HubError> {
    let what = download.file().location();
    let dir = &download.config().spool_dir;
    let local = |action: &str, e: io::Error| {
        HubError::Spool(format!(
            "{what}: cannot {action} its spool file in {} ({e}): set DSPREP_SPOOL_DIR to a \
             writable local folder with room for two of the source's files",
            dir.display()
        ))
    };
    let mut got = String::new();
    for attempt in 1..=VERIFY_DOWNLOADS {
        let mut file = tempfile::tempfile_in(dir).map_err(|e| local("create", e))?;
        let mut hasher = expected.hasher(download.file().size);
        let mut body = ChannelRead::start(io, download.clone());
        {
            let mut out = BufWriter::with_capacity(1 << 20, &mut file);
            while let Some(chunk) = body.next_chunk() {
                if cancel.load(Ordering::SeqCst) {
                    return Err(HubError::Config("the reader is gone".into()));
                }
                let chunk = chunk?;
                hasher.update(&chunk);
                out.write_all(&chunk).map_err(|e| local("write", e))?;
            }
            out.flush().map_err(|e| local("write", e))?;
        }
        got = hasher.finish_hex();
        if got == expected.hex() {
            file.rewind().map_err(|e| local("read", e))?;
            download.record(Verified::WholeFile(expected.kind()));
            return Ok(file);
        }
        if attempt < VERIFY_DOWNLOADS {
            tracing::warn!(
                "{what}: the bytes downloaded hash to {got}, the Hub's {} is {}; downloading \
                 again ({attempt} of {VERIFY_DOWNLOADS})",
                expected.kind(),
                expected.hex()
            );
        }
    }
    Err(HubError::Corrupt(Box::new(HashMismatch {
        what,
        kind: expected.kind(),
        expected: expected.hex().to_string(),
        got,
        attempts: VERIFY_DOWNLOADS,
    })))
}

/// A spooled file as a blocking `Read`: the first read waits for the check.
pub(crate) struct SpooledRead {
    spool: Spool,
    file: Option<File>,
}

impl SpooledRead {
    pub(crate) fn start(
        io: tokio::runtime::Handle,
        download: Arc<Download>,
        expected: ExpectedHash,
    ) -> SpooledRead {
        SpooledRead {
            spool: Spool::start(io, download, expected),
            file: None,
        }
    }
}

impl Read for SpooledRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.file.is_none() {
            self.file = Some(self.spool.wait().map_err(io::Error::other)?);
        }
        match self.file.as_mut() {
            Some(file) => file.read(buf),
            None => Ok(0),
        }
    }
}

/// A Hub parquet file read whole (`verify = "full"`, or by default when its pages carry no
/// CRCs): spooled, checked, then read as a local file.
pub(crate) struct SpooledParquet {
    label: PathBuf,
    spool: Option<SpooledRead>,
    spec: SourceSpec,
    batch_rows: usize,
    batches: Option<LocalBatches>,
}

impl SpooledParquet {
    pub(crate) fn new(
        label: PathBuf,
        spool: SpooledRead,
        spec: &SourceSpec,
        batch_rows: usize,
    ) -> SpooledParquet {
        SpooledParquet {
            label,
            spool: Some(spool),
            spec: spec.clone(),
            batch_rows,
            batches: None,
        }
    }
}

impl BatchSource for SpooledParquet {
    fn next_batch(&mut self, next_row: u64) -> Result<Option<RecordBatch>, ShardError> {
        if let Some(spooled) = self.spool.take() {
            let file = spooled
                .spool
                .wait()
                .map_err(|e| ShardError::new(&self.label, None, super::hub_error(e)))?;
            let (batches, _) =
                LocalBatches::open_file(&self.label, file, &self.spec, self.batch_rows, 0, None)?;
            self.batches = Some(batches);
        }
        match self.batches.as_mut() {
            Some(batches) => batches.next_batch(next_row),
            None => Ok(None),
        }
    }
}
