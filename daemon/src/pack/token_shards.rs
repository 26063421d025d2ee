//! The token shards of a packed directory and the stream chain over their windows, written,
//! hashed and synced on a thread of their own (`dsprep-shards`): the pipeline's thread only
//! copies each window's bytes into a block.
//!
//! Hashing is most of what writing costs: every window's bytes go through sha256 twice, once
//! for the shard file's hash and once for the window's digest in the stream chain (FORMAT.md).
//! On the pipeline's thread that capped `pack` near ten tokenizer threads; here it runs beside
//! them. What the thread computes is what the pipeline's thread computed before, in the same
//! order, so the files, their hashes and the chain are unchanged.
//!
//! Memory: blocks of [`BLOCK_BYTES`] (or one window, if larger); at most two wait for the
//! thread, one is being written, one is being filled and two are kept for reuse.
//! Errors: a write, create or sync error is kept by the thread and returned by the next
//! [`TokenShards::sync`] (a checkpoint) or [`TokenShards::finish`]; nothing after it is written.

use crate::files::HashingWriter;
use anyhow::{Context, anyhow};
use crossbeam_channel::{Receiver, Sender, bounded};
use dsprep_client::chain::{self, Hash};
use dsprep_client::format::{self, ChainMark, Dtype, OutputFile};
use std::path::PathBuf;
use std::thread::JoinHandle;

/// Window bytes the pipeline's thread collects before handing them to the thread.
pub const BLOCK_BYTES: usize = 256 << 10;

/// Where the token shards stand: what a checkpoint records of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardsProgress {
    /// Closed shards, with their sizes and sha256.
    pub closed: Vec<OutputFile>,
    /// The stream chain after every window written.
    pub chain: Hash,
    /// The chain after each closed shard.
    pub chain_marks: Vec<ChainMark>,
}

/// The token shard files and the chain, on whichever thread writes them.
pub struct ShardFiles {
    /// The partial directory the shards are written in.
    pub dir: PathBuf,
    pub windows_per_shard: u64,
    /// The open shard, and the windows in it.
    pub open: Option<HashingWriter>,
    pub windows_in_shard: u64,
    pub num_windows: u64,
    /// Every shard, the open one last (its size and hash filled in when it closes).
    pub shards: Vec<OutputFile>,
    pub chain: Hash,
    pub chain_marks: Vec<ChainMark>,
}

impl ShardFiles {
    /// No shard written yet.
    pub fn new(dir: PathBuf, windows_per_shard: u64) -> Self {
        Self {
            dir,
            windows_per_shard: windows_per_shard.max(1),
            open: None,
            windows_in_shard: 0,
            num_windows: 0,
            shards: Vec::new(),
            chain: chain::START,
            chain_marks: Vec::new(),
        }
    }

    fn write_window(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        if self.open.is_none() {
            let file = format::shard_file_name(self.shards.len());
            let path = self.dir.join(&file);
            self.open = Some(
                HashingWriter::create(&path)
                    .with_context(|| format!("cannot create {}", path.display()))?,
            );
            self.shards.push(OutputFile {
                file,
                size_bytes: 0,
                sha256: String::new(),
            });
        }
        let shard = self.open.as_mut().expect("opened above");
        shard
            .write_all(bytes)
            .with_context(|| format!("cannot write a token shard in {}", self.dir.display()))?;
        self.chain = chain::link(&self.chain, &chain::window_digest(bytes));
        self.num_windows += 1;
        self.windows_in_shard += 1;
        if self.windows_in_shard == self.windows_per_shard {
            self.close_shard()?;
        }
        Ok(())
    }

    fn close_shard(&mut self) -> anyhow::Result<()> {
        if let Some(shard) = self.open.take() {
            let (size_bytes, sha256) = shard.finish().with_context(|| {
                format!("cannot finish a token shard in {}", self.dir.display())
            })?;
            let entry = self.shards.last_mut().expect("a shard is open");
            entry.size_bytes = size_bytes;
            entry.sha256 = sha256;
            self.windows_in_shard = 0;
            self.chain_marks.push(ChainMark {
                windows: self.num_windows,
                chain: chain::to_hex(&self.chain),
            });
        }
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<ShardsProgress> {
        if let Some(shard) = &mut self.open {
            shard
                .sync()
                .with_context(|| format!("cannot sync {}", self.dir.display()))?;
        }
        let open = usize::from(self.open.is_some());
        Ok(ShardsProgress {
            closed: self.shards[..self.shards.len() - open].to_vec(),
            chain: self.chain,
            chain_marks: self.chain_marks.clone(),
        })
    }

    /// Close the open shard; the chain marks end with one after the last window.
    fn finish(mut self) -> anyhow::Result<ShardsProgress> {
        self.close_shard()?;
        if self
            .chain_marks
            .last()
            .is_none_or(|m| m.windows != self.num_windows)
        {
            self.chain_marks.push(ChainMark {
                windows: self.num_windows,
                chain: chain::to_hex(&self.chain),
            });
        }
        Ok(ShardsProgress {
            closed: self.shards,
            chain: self.chain,
            chain_marks: self.chain_marks,
        })
    }
}

/// Windows' bytes, back to back, and where each ends.
#[derive(Default)]
struct Block {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

enum Request {
    Windows(Block),
    Sync(Sender<anyhow::Result<ShardsProgress>>),
    Finish(Sender<anyhow::Result<ShardsProgress>>),
}

/// The token shards, written by the `dsprep-shards` thread (or, where that thread cannot be
/// started, on the caller's thread, with a warning).
pub struct TokenShards {
    dtype: Dtype,
    filling: Block,
    to_thread: Option<Sender<Request>>,
    reused: Receiver<Block>,
    thread: Option<JoinHandle<()>>,
    /// Written here instead, when the thread could not be started.
    inline: Option<ShardFiles>,
}

const STOPPED: &str = "the thread writing the token shards stopped";

impl TokenShards {
    pub fn start(files: ShardFiles, dtype: Dtype) -> Self {
        let (to_thread, requests) = bounded::<Request>(2);
        let (give_back, reused) = bounded::<Block>(2);
        // The files go over a channel once the thread runs, so a thread that cannot start
        // leaves them here.
        let (hand, handed) = bounded::<ShardFiles>(1);
        let spawned = std::thread::Builder::new()
            .name("dsprep-shards".into())
            .spawn(move || {
                if let Ok(files) = handed.recv() {
                    serve(files, requests, give_back);
                }
            });
        let (thread, inline) = match spawned {
            Ok(thread) => match hand.send(files) {
                Ok(()) => (Some(thread), None),
                Err(unsent) => (None, Some(unsent.into_inner())),
            },
            Err(e) => {
                tracing::warn!(
                    "cannot start a thread to write the token shards in {} ({e}): the \
                     pipeline's thread writes them",
                    files.dir.display()
                );
                (None, Some(files))
            }
        };
        Self {
            dtype,
            filling: Block::default(),
            to_thread: thread.is_some().then_some(to_thread),
            reused,
            thread,
            inline,
        }
    }

    /// Add one window (its tokens, stored as `dtype`).
    pub fn push(&mut self, tokens: &[u32]) -> anyhow::Result<()> {
        self.dtype.extend_bytes(tokens, &mut self.filling.bytes);
        self.filling.ends.push(self.filling.bytes.len());
        if self.filling.bytes.len() >= BLOCK_BYTES {
            self.hand_over()?;
        }
        Ok(())
    }

    /// Give the thread the windows collected so far.
    fn hand_over(&mut self) -> anyhow::Result<()> {
        if self.filling.ends.is_empty() {
            return Ok(());
        }
        let next = self.reused.try_recv().unwrap_or_default();
        let block = std::mem::replace(&mut self.filling, next);
        if let Some(files) = &mut self.inline {
            return write_block(files, &block);
        }
        let sent = match &self.to_thread {
            Some(to_thread) => to_thread.send(Request::Windows(block)).is_ok(),
            None => false,
        };
        if !sent {
            return Err(self.stopped());
        }
        Ok(())
    }

    /// Everything pushed is written and fsynced; where the shards stand.
    pub fn sync(&mut self) -> anyhow::Result<ShardsProgress> {
        self.hand_over()?;
        match &mut self.inline {
            Some(files) => files.sync(),
            None => self.ask(Request::Sync),
        }
    }

    /// Everything pushed is written and the last shard closed.
    pub fn finish(mut self) -> anyhow::Result<ShardsProgress> {
        self.hand_over()?;
        let done = match self.inline.take() {
            Some(files) => files.finish(),
            None => self.ask(Request::Finish),
        };
        self.stop();
        done
    }

    fn ask(
        &mut self,
        request: fn(Sender<anyhow::Result<ShardsProgress>>) -> Request,
    ) -> anyhow::Result<ShardsProgress> {
        let (reply, answer) = bounded(1);
        let sent = match &self.to_thread {
            Some(to_thread) => to_thread.send(request(reply)).is_ok(),
            None => false,
        };
        if !sent {
            return Err(self.stopped());
        }
        answer.recv().map_err(|_| self.stopped())?
    }

    /// The error for a thread that is gone: it panicked (its message is on stderr).
    fn stopped(&mut self) -> anyhow::Error {
        self.stop();
        anyhow!(STOPPED)
    }

    /// Close the channel and wait for the thread, so nothing writes in the directory after.
    fn stop(&mut self) {
        self.to_thread = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TokenShards {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_block(files: &mut ShardFiles, block: &Block) -> anyhow::Result<()> {
    let mut from = 0;
    for &end in &block.ends {
        files.write_window(&block.bytes[from..end])?;
        from = end;
    }
    Ok(())
}

/// The thread: writes blocks until asked to finish or the channel closes. After an error it
/// writes nothing more and answers every question with that error.
fn serve(mut files: ShardFiles, requests: Receiver<Request>, give_back: Sender<Block>) {
    let mut failed: Option<anyhow::Error> = None;
    for request in requests {
        match request {
            Request::Windows(mut block) => {
                if failed.is_none() {
                    failed = write_block(&mut files, &block).err();
                }
                block.bytes.clear();
                block.ends.clear();
                let _ = give_back.try_send(block);
            }
            Request::Sync(reply) => {
                let answer = match &failed {
                    Some(e) => Err(anyhow!("{e:#}")),
                    None => files.sync(),
                };
                let _ = reply.send(answer);
            }
            Request::Finish(reply) => {
                let _ = reply.send(match failed {
                    Some(e) => Err(e),
                    None => files.finish(),
                });
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::sha256_file;

    fn windows(count: u32, len: u32) -> Vec<Vec<u32>> {
        (0..count)
            .map(|w| (0..len).map(|t| (w * 7919 + t * 31) % 50_000).collect())
            .collect()
    }

    fn write_all(shards: &mut TokenShards, windows: &[Vec<u32>]) {
        for window in windows {
            shards.push(window).unwrap();
        }
    }

    #[test]
    fn shards_hashes_and_chain_are_those_of_the_windows_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // 2049-token windows of u16: 4,098 bytes, so a 256 KiB block holds 63 and a shard of
        // 100 windows ends inside the second block; 230 windows leave an open third shard.
        let all = windows(230, 2049);
        let mut shards = TokenShards::start(ShardFiles::new(dir.path().into(), 100), Dtype::U16);
        write_all(&mut shards, &all[..150]);
        let at_150 = shards.sync().unwrap();
        write_all(&mut shards, &all[150..]);
        let done = shards.finish().unwrap();

        let mut bytes = Vec::new();
        let mut chain_at = chain::START;
        let mut marks = Vec::new();
        for (i, window) in all.iter().enumerate() {
            let mut one = Vec::new();
            Dtype::U16.extend_bytes(window, &mut one);
            chain_at = chain::link(&chain_at, &chain::window_digest(&one));
            bytes.extend(one);
            if i + 1 == 150 {
                assert_eq!(at_150.chain, chain_at);
            }
            if i + 1 == 100 || i + 1 == 200 || i + 1 == 230 {
                marks.push(ChainMark {
                    windows: i as u64 + 1,
                    chain: chain::to_hex(&chain_at),
                });
            }
        }
        assert_eq!(at_150.closed.len(), 1, "one shard closed at 150 windows");
        assert_eq!(at_150.chain_marks, marks[..1]);
        assert_eq!(done.chain, chain_at);
        assert_eq!(done.chain_marks, marks);
        let names: Vec<_> = done.closed.iter().map(|s| s.file.as_str()).collect();
        assert_eq!(
            names,
            ["tokens-00000.bin", "tokens-00001.bin", "tokens-00002.bin"]
        );
        let shard_bytes = 100 * 4098;
        for (i, shard) in done.closed.iter().enumerate() {
            let from = i * shard_bytes;
            let expected = &bytes[from..(from + shard_bytes).min(bytes.len())];
            let on_disk = std::fs::read(dir.path().join(&shard.file)).unwrap();
            assert!(on_disk == expected, "{} holds its windows", shard.file);
            let (size, sha) = sha256_file(&dir.path().join(&shard.file)).unwrap();
            assert_eq!((shard.size_bytes, &shard.sha256), (size, &sha));
        }
    }

    #[test]
    fn an_error_on_the_thread_is_the_next_syncs_and_nothing_after_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("removed");
        let mut shards = TokenShards::start(ShardFiles::new(gone.clone(), 10), Dtype::U32);
        write_all(&mut shards, &windows(3, 100));
        let err = format!("{:#}", shards.sync().unwrap_err());
        let create = format!("cannot create {}", gone.join("tokens-00000.bin").display());
        assert!(err.starts_with(&create), "{err}");
        write_all(&mut shards, &windows(3, 100));
        let err = format!("{:#}", shards.finish().unwrap_err());
        assert!(err.starts_with(&create), "the first error, again: {err}");
        assert!(!gone.exists());
    }
}
