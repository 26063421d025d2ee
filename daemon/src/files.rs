//! File helpers shared by the drivers: streaming sha256, a writer that counts what it writes
//! and syncs as it goes (and one that hashes it too), and patient IO on a shared state
//! directory.

use crate::writeback::Writeback;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Up to `len` bytes of `file` from `offset` (fewer only where the file ends), read in place.
pub fn read_at_most(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Size and sha256 (hex) of a file, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// Bytes a writer writes between two nudges of its writeback thread.
const WRITEBACK_BYTES: u64 = 16 << 20;

/// A buffered file writer that counts what it writes and has the disk write it as it goes (a
/// [`Writeback`] once it passes 16 MiB), so that its last sync is short.
pub struct SyncedWriter {
    inner: BufWriter<File>,
    written: u64,
    writeback: Option<Writeback>,
    /// `written` at which to nudge the writeback thread next.
    next_writeback: u64,
}

impl SyncedWriter {
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(Self::from_file(File::create(path)?, 0))
    }

    /// Continue the file at `path` after its first `keep` bytes: anything after them is cut off
    /// (an interrupted pack wrote past its checkpoint).
    pub fn append_after(path: &Path, keep: u64) -> io::Result<Self> {
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        let len = file.metadata()?.len();
        if len < keep {
            return Err(shorter_than_kept(path, len, keep));
        }
        file.set_len(keep)?;
        file.seek(SeekFrom::Start(keep))?;
        Ok(Self::from_file(file, keep))
    }

    /// A writer going on from `file`'s position, `written` bytes into it.
    fn from_file(file: File, written: u64) -> Self {
        Self {
            inner: BufWriter::with_capacity(1 << 20, file),
            written,
            writeback: None,
            next_writeback: written + WRITEBACK_BYTES,
        }
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.written += bytes.len() as u64;
        self.inner.write_all(bytes)?;
        if self.written >= self.next_writeback {
            self.next_writeback = self.written + WRITEBACK_BYTES;
            if self.writeback.is_none() {
                self.writeback = Writeback::start(self.inner.get_ref());
            }
            if let Some(writeback) = &self.writeback {
                writeback.nudge();
            }
        }
        Ok(())
    }

    /// Flush and fsync what was written so far (the writer stays open). An error of a
    /// background sync is this sync's: it may not be reported twice.
    pub fn sync(&mut self) -> io::Result<()> {
        self.inner.flush()?;
        if let Some(writeback) = self.writeback.take() {
            writeback.finish()?;
        }
        self.inner.get_ref().sync_data()
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flush, fsync and return the size.
    pub fn finish(self) -> io::Result<u64> {
        let file = self.inner.into_inner().map_err(|e| e.into_error())?;
        if let Some(writeback) = self.writeback {
            writeback.finish()?;
        }
        file.sync_all()?;
        Ok(self.written)
    }
}

/// `path` holds `len` bytes where a checkpoint kept `keep`.
fn shorter_than_kept(path: &Path, len: u64, keep: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "{} has {len} bytes, the checkpoint expects {keep}",
            path.display()
        ),
    )
}

/// The sha256 state after the first `len` bytes of `path`, to go on hashing what follows.
pub fn sha256_prefix(path: &Path, len: u64) -> io::Result<Sha256> {
    let mut hasher = Sha256::new();
    let copied = io::copy(&mut File::open(path)?.take(len), &mut HashInto(&mut hasher))?;
    if copied < len {
        return Err(shorter_than_kept(path, copied, len));
    }
    Ok(hasher)
}

/// A [`SyncedWriter`] that also keeps the sha256 of everything written.
pub struct HashingWriter {
    writer: SyncedWriter,
    hasher: Sha256,
}

impl HashingWriter {
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(Self {
            writer: SyncedWriter::create(path)?,
            hasher: Sha256::new(),
        })
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.update(bytes);
        self.writer.write_all(bytes)
    }

    /// Continue the file at `path` after its first `keep` bytes: anything after them is cut off
    /// (an interrupted pack wrote past its checkpoint), the kept bytes are hashed again.
    pub fn append_after(path: &Path, keep: u64) -> io::Result<Self> {
        Ok(Self {
            writer: SyncedWriter::append_after(path, keep)?,
            hasher: sha256_prefix(path, keep)?,
        })
    }

    /// Flush and fsync what was written so far (the writer stays open).
    pub fn sync(&mut self) -> io::Result<()> {
        self.writer.sync()
    }

    pub fn written(&self) -> u64 {
        self.writer.written()
    }

    /// Flush, fsync and return (size, sha256 hex).
    pub fn finish(self) -> io::Result<(u64, String)> {
        let size = self.writer.finish()?;
        Ok((size, hex::encode(self.hasher.finalize())))
    }
}

/// Feeds what is copied into it to a hasher.
struct HashInto<'a>(&'a mut Sha256);

impl Write for HashInto<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Write `bytes` to `path` so that a crash leaves either the old file or the whole new one: write
/// `.<name>.tmp` beside it, fsync, rename over `path`, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = path.with_file_name(format!(".{}.tmp", name.to_string_lossy()));
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// Make a rename inside `dir` durable, where the platform allows it.
pub fn sync_dir(dir: &Path) {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if let Ok(handle) = File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// Why [`try_lock_file`] did not get its lock.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it.
    Held,
    Io(io::Error),
}

/// Open (creating) `path` and take an exclusive lock on it without waiting. The lock lasts as long
/// as the returned file is open, and ends with the process whatever way it ends.
pub fn try_lock_file(path: &Path) -> Result<File, LockError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(LockError::Io)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(LockError::Held),
        Err(std::fs::TryLockError::Error(e)) => Err(LockError::Io(e)),
    }
}

/// How long a read or write of the state directory is retried before the daemon gives up: a
/// cluster filesystem may fail for seconds (an EIO while a server fails over, a full quota being
/// cleared) and the steps wait meanwhile; past this it is down.
pub const STATE_IO_PATIENCE: Duration = Duration::from_secs(60);

/// `io` on `path`, retried with backoff (50 ms doubling to 2 s) for up to [`STATE_IO_PATIENCE`],
/// saying so once in the log; then the error, naming the file.
pub fn patiently<T>(
    path: &std::path::Path,
    action: &str,
    mut io: impl FnMut() -> std::io::Result<T>,
) -> anyhow::Result<T> {
    let began = Instant::now();
    let mut wait = Duration::from_millis(50);
    let mut said = false;
    loop {
        match io() {
            Ok(value) => {
                if said {
                    tracing::info!("{}: {action} works again", path.display());
                }
                return Ok(value);
            }
            Err(e) if began.elapsed() >= STATE_IO_PATIENCE => {
                anyhow::bail!(
                    "cannot {action} {} on the shared state directory for {} s, last: {e}; \
                     the steps wait on it (is the filesystem down or full?)",
                    path.display(),
                    STATE_IO_PATIENCE.as_secs()
                );
            }
            Err(e) => {
                if !said {
                    said = true;
                    tracing::warn!(
                        "cannot {action} {}: {e}; retrying for up to {} s (the steps wait)",
                        path.display(),
                        STATE_IO_PATIENCE.as_secs()
                    );
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past 16 MiB the writer syncs as it goes (a checkpoint's sync in between), and what it
    /// wrote, its size and its sha256 are exactly what was given; so is a file continued after
    /// its first bytes.
    #[test]
    fn a_writer_with_writeback_writes_and_hashes_every_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens.bin");
        let data: Vec<u8> = (0..40u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut writer = HashingWriter::create(&path).expect("create");
        for (k, piece) in data.chunks(1 << 20).enumerate() {
            writer.write_all(piece).expect("write");
            if k == 20 {
                assert!(
                    writer.writer.writeback.is_some(),
                    "writeback started past 16 MiB"
                );
                writer.sync().expect("sync");
            }
        }
        assert!(
            writer.writer.writeback.is_some(),
            "writeback started again past 32 MiB"
        );
        let (size, sha) = writer.finish().expect("finish");
        assert_eq!(size, data.len() as u64);
        assert_eq!(sha, hex::encode(Sha256::digest(&data)));
        assert!(std::fs::read(&path).expect("read") == data);

        let mut continued = HashingWriter::append_after(&path, 30 << 20).expect("continue");
        continued.write_all(&data[30 << 20..]).expect("write");
        assert_eq!(continued.finish().expect("finish"), (size, sha.clone()));
        assert!(std::fs::read(&path).expect("read") == data);

        // Continued without hashing, and hashed apart from a prefix, as the token shards are.
        let mut synced = SyncedWriter::append_after(&path, 7 << 20).expect("continue");
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            7 << 20,
            "cut to what is kept"
        );
        synced.write_all(&data[7 << 20..]).expect("write");
        assert_eq!(synced.finish().expect("finish"), size);
        assert!(std::fs::read(&path).expect("read") == data);
        let mut hasher = sha256_prefix(&path, 7 << 20).expect("prefix");
        hasher.update(&data[7 << 20..]);
        assert_eq!(hex::encode(hasher.finalize()), sha);
        let short = sha256_prefix(&path, size + 1).expect_err("past the end");
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
        assert!(
            SyncedWriter::append_after(&path, size + 1).is_err(),
            "a file shorter than what is kept"
        );
    }
}
