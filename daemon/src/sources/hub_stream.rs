//! Hub files read front to back (C4's `.json.gz`): a task streams the body into a bounded
//! channel of chunks, resuming a cut body at the byte it stopped at; the reader thread sees a
//! plain `Read` and feeds it through gzip into the JSON-lines reader. No shard is downloaded
//! whole first: at most [`CHUNKS_AHEAD`] chunks wait in memory.

use crate::hub::{Download, HubError};
use bytes::{Buf, Bytes};
use std::io::{self, Read};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Body chunks buffered ahead of the reader (hyper's chunks are at most a few dozen KiB).
const CHUNKS_AHEAD: usize = 64;

/// The bytes of one Hub file, in order, as a blocking `Read`.
pub(crate) struct ChannelRead {
    chunks: mpsc::Receiver<Result<Bytes, HubError>>,
    current: Bytes,
    done: bool,
}

impl ChannelRead {
    /// Start streaming `download` on the IO runtime `io` now (it fills the channel while
    /// earlier shards are read).
    pub(crate) fn start(io: &tokio::runtime::Handle, download: Arc<Download>) -> ChannelRead {
        let (tx, rx) = mpsc::channel(CHUNKS_AHEAD);
        io.spawn(download.stream_into(tx));
        ChannelRead {
            chunks: rx,
            current: Bytes::new(),
            done: false,
        }
    }
}

impl ChannelRead {
    /// The body's next chunk, in order (blocks: the reader thread is a plain thread, never a
    /// runtime worker); `None` at its end, and after an error.
    pub(crate) fn next_chunk(&mut self) -> Option<Result<Bytes, HubError>> {
        if self.done {
            return None;
        }
        let next = self.chunks.blocking_recv();
        self.done = !matches!(next, Some(Ok(_)));
        next
    }
}

impl Read for ChannelRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.next_chunk() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Err(io::Error::other(error)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}
