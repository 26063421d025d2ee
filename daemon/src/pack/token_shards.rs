//! The token shards of a packed directory and the stream chain over their windows, on threads
//! of their own: `dsprep-shards` writes and syncs the files, `dsprep-filehash` hashes them, and
//! `dsprep-chain` links every window's digest into the chain. The pipeline's thread only copies
//! each window's bytes into a block, which the three threads read.
//!
//! Hashing is most of what writing costs: every window's bytes go through sha256 twice, once
//! for the shard file's hash and once for the window's digest in the stream chain (FORMAT.md).
//! On the pipeline's thread that capped `pack` near ten tokenizer threads, and one thread doing
//! both still held back 16 (tests/bench/runs/2026-11-27-device-16core/NOTES.md, "16 cores");
//! one thread writing and hashing the files could feed about 230 M tokens/s of `u32` tokens,
//! what 16 cores need of Llama 3 (tests/bench/runs/2026-11-27-2core-vm/NOTES.md, "what one
//! thread can feed"). What the threads compute is what the pipeline's thread computed before,
//! in the same order, so the files, their hashes and the chain are unchanged.
//!
//! Memory: blocks of [`BLOCK_BYTES`] (or one window, if larger), shared by the threads: at most
//! ten, the slowest thread's four waiting and one being read, one being filled and four kept
//! for reuse ([`BLOCKS_WAITING`]).
//! Errors: a write, create or sync error is kept by the files' thread and returned by the next
//! [`TokenShards::sync`] (a checkpoint) or [`TokenShards::finish`]; nothing after it is written.

use crate::files::SyncedWriter;
use crate::waits::{self, Wait};
use anyhow::{Context, anyhow};
use crossbeam_channel::{Receiver, Sender, bounded};
use dsprep_client::chain::{self, Hash};
use dsprep_client::format::{self, ChainMark, Dtype, OutputFile};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Window bytes the pipeline's thread collects before handing them to the threads. A hand-off
/// can put a thread to sleep and wake it, which took about 130 µs on a VM's vCPUs: with 256 KiB
/// blocks, two waiting, the pipeline's thread spent more of a 16-thread run blocked on the two
/// queues than working (tests/bench/runs/2026-11-27-device-16core/NOTES.md,
/// "16 cores, where the threads wait").
pub const BLOCK_BYTES: usize = 1 << 20;

/// Blocks waiting for each thread at most, and kept for reuse at most: enough for a thread
/// that stalls on a write or a sync not to stop the pipeline's thread at once.
const BLOCKS_WAITING: usize = 4;

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

/// One of the three things done with every window, on a thread of its own.
trait Stage: Send + 'static {
    /// What a sync or the finish reports.
    type Progress: Send + 'static;
    const THREAD: &'static str;
    fn add_window(&mut self, bytes: &[u8]) -> anyhow::Result<()>;
    fn sync(&mut self) -> anyhow::Result<Self::Progress>;
    fn finish(self) -> anyhow::Result<Self::Progress>;
}

/// The token shard files: each window's bytes written into its shard.
pub struct ShardFiles {
    /// The partial directory the shards are written in.
    pub dir: PathBuf,
    pub windows_per_shard: u64,
    /// The open shard, and the windows in it.
    pub open: Option<SyncedWriter>,
    pub windows_in_shard: u64,
    /// Every shard, the open one last (its size filled in when it closes; its sha256 is
    /// [`ShardHashes`]' and is empty here).
    pub shards: Vec<OutputFile>,
}

impl ShardFiles {
    /// No shard written yet.
    pub fn new(dir: PathBuf, windows_per_shard: u64) -> Self {
        Self {
            dir,
            windows_per_shard: windows_per_shard.max(1),
            open: None,
            windows_in_shard: 0,
            shards: Vec::new(),
        }
    }

    fn close_shard(&mut self) -> anyhow::Result<()> {
        if let Some(shard) = self.open.take() {
            let size_bytes = shard.finish().with_context(|| {
                format!("cannot finish a token shard in {}", self.dir.display())
            })?;
            let entry = self.shards.last_mut().expect("a shard is open");
            entry.size_bytes = size_bytes;
            self.windows_in_shard = 0;
        }
        Ok(())
    }
}

impl Stage for ShardFiles {
    /// The closed shards, their sha256 empty.
    type Progress = Vec<OutputFile>;
    const THREAD: &'static str = "dsprep-shards";

    fn add_window(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        if self.open.is_none() {
            let file = format::shard_file_name(self.shards.len());
            let path = self.dir.join(&file);
            self.open = Some(
                SyncedWriter::create(&path)
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
        self.windows_in_shard += 1;
        if self.windows_in_shard == self.windows_per_shard {
            self.close_shard()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<Vec<OutputFile>> {
        if let Some(shard) = &mut self.open {
            shard
                .sync()
                .with_context(|| format!("cannot sync {}", self.dir.display()))?;
        }
        let open = usize::from(self.open.is_some());
        Ok(self.shards[..self.shards.len() - open].to_vec())
    }

    fn finish(mut self) -> anyhow::Result<Vec<OutputFile>> {
        self.close_shard()?;
        Ok(self.shards)
    }
}

/// The sha256 of each token shard file: each window's bytes hashed into its shard's.
pub struct ShardHashes {
    pub windows_per_shard: u64,
    /// The open shard's hash so far, and the windows in it.
    pub open: Option<Sha256>,
    pub windows_in_shard: u64,
    /// The closed shards' sha256 (hex), in order.
    pub closed: Vec<String>,
}

impl ShardHashes {
    /// No shard hashed yet.
    pub fn new(windows_per_shard: u64) -> Self {
        Self {
            windows_per_shard: windows_per_shard.max(1),
            open: None,
            windows_in_shard: 0,
            closed: Vec::new(),
        }
    }

    fn close_shard(&mut self) {
        if let Some(hasher) = self.open.take() {
            self.closed.push(hex::encode(hasher.finalize()));
            self.windows_in_shard = 0;
        }
    }
}

impl Stage for ShardHashes {
    /// The closed shards' sha256.
    type Progress = Vec<String>;
    const THREAD: &'static str = "dsprep-filehash";

    fn add_window(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.open.get_or_insert_with(Sha256::new).update(bytes);
        self.windows_in_shard += 1;
        if self.windows_in_shard == self.windows_per_shard {
            self.close_shard();
        }
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<Vec<String>> {
        Ok(self.closed.clone())
    }

    fn finish(mut self) -> anyhow::Result<Vec<String>> {
        self.close_shard();
        Ok(self.closed)
    }
}

/// The stream chain over the windows, with a mark where each shard ends.
pub struct StreamChain {
    pub windows_per_shard: u64,
    /// Windows linked, all told.
    pub num_windows: u64,
    pub chain: Hash,
    /// The chain after each closed shard.
    pub chain_marks: Vec<ChainMark>,
}

impl StreamChain {
    /// Before the first window.
    pub fn new(windows_per_shard: u64) -> Self {
        Self {
            windows_per_shard: windows_per_shard.max(1),
            num_windows: 0,
            chain: chain::START,
            chain_marks: Vec::new(),
        }
    }

    fn mark(&mut self) {
        self.chain_marks.push(ChainMark {
            windows: self.num_windows,
            chain: chain::to_hex(&self.chain),
        });
    }
}

impl Stage for StreamChain {
    /// The chain now, and the marks.
    type Progress = (Hash, Vec<ChainMark>);
    const THREAD: &'static str = "dsprep-chain";

    fn add_window(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.chain = chain::link(&self.chain, &chain::window_digest(bytes));
        self.num_windows += 1;
        if self.num_windows.is_multiple_of(self.windows_per_shard) {
            self.mark();
        }
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<Self::Progress> {
        Ok((self.chain, self.chain_marks.clone()))
    }

    /// The marks end with one after the last window.
    fn finish(mut self) -> anyhow::Result<Self::Progress> {
        if self
            .chain_marks
            .last()
            .is_none_or(|m| m.windows != self.num_windows)
        {
            self.mark();
        }
        Ok((self.chain, self.chain_marks))
    }
}

/// Windows' bytes, back to back, and where each ends.
#[derive(Default)]
struct Block {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Block {
    fn windows(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(from, &end)| &self.bytes[from..end])
    }
}

/// Where a stage's thread sends its answer to a sync or the finish.
type Reply<P> = Sender<anyhow::Result<P>>;

enum Request<P> {
    Windows(Arc<Block>),
    Sync(Reply<P>),
    Finish(Reply<P>),
}

/// A stage on its thread (or, where that thread cannot be started, on the caller's, with a
/// warning).
struct Worker<S: Stage> {
    to_thread: Option<Sender<Request<S::Progress>>>,
    thread: Option<JoinHandle<()>>,
    /// Run here instead, when the thread could not be started.
    inline: Option<Guarded<S>>,
}

/// A stage and its first error: after an error it adds nothing more and answers every question
/// with that error. The same on the stage's thread and on the caller's.
struct Guarded<S: Stage> {
    stage: S,
    failed: Option<anyhow::Error>,
}

impl<S: Stage> Guarded<S> {
    fn new(stage: S) -> Self {
        Self {
            stage,
            failed: None,
        }
    }

    fn add(&mut self, block: &Block) {
        if self.failed.is_none() {
            self.failed = block
                .windows()
                .try_for_each(|w| self.stage.add_window(w))
                .err();
        }
    }

    fn sync(&mut self) -> anyhow::Result<S::Progress> {
        match &self.failed {
            Some(e) => Err(anyhow!("{e:#}")),
            None => self.stage.sync(),
        }
    }

    fn finish(self) -> anyhow::Result<S::Progress> {
        match self.failed {
            Some(e) => Err(e),
            None => self.stage.finish(),
        }
    }
}

impl<S: Stage> Worker<S> {
    fn start(stage: S, give_back: Sender<Block>, what: &str) -> Self {
        let (to_thread, requests) = bounded::<Request<S::Progress>>(BLOCKS_WAITING);
        // The stage goes over a channel once the thread runs, so a thread that cannot start
        // leaves it here.
        let (hand, handed) = bounded::<S>(1);
        let spawned = std::thread::Builder::new()
            .name(S::THREAD.into())
            .spawn(move || {
                if let Ok(stage) = handed.recv() {
                    serve(stage, requests, give_back);
                }
            });
        let (thread, inline) = match spawned {
            Ok(thread) => match hand.send(stage) {
                Ok(()) => (Some(thread), None),
                Err(unsent) => (None, Some(unsent.into_inner())),
            },
            Err(e) => {
                tracing::warn!(
                    "cannot start a thread for {what} ({e}): the pipeline's thread does it"
                );
                (None, Some(stage))
            }
        };
        Self {
            to_thread: thread.is_some().then_some(to_thread),
            thread,
            inline: inline.map(Guarded::new),
        }
    }

    /// Hand `block` to the stage; `wait` names the time the queue to its thread blocks.
    fn send(&mut self, block: Arc<Block>, wait: Wait) -> anyhow::Result<()> {
        if let Some(inline) = &mut self.inline {
            inline.add(&block);
            return Ok(());
        }
        let sent = match &self.to_thread {
            Some(to_thread) => {
                waits::timed(wait, || to_thread.send(Request::Windows(block))).is_ok()
            }
            None => false,
        };
        if !sent {
            return Err(self.stopped());
        }
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<S::Progress> {
        match &mut self.inline {
            Some(inline) => inline.sync(),
            None => self.ask(Request::Sync),
        }
    }

    fn finish(mut self) -> anyhow::Result<S::Progress> {
        let done = match self.inline.take() {
            Some(inline) => inline.finish(),
            None => self.ask(Request::Finish),
        };
        self.stop();
        done
    }

    fn ask(
        &mut self,
        request: fn(Reply<S::Progress>) -> Request<S::Progress>,
    ) -> anyhow::Result<S::Progress> {
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
        anyhow!("the thread {} stopped", S::THREAD)
    }

    /// Close the channel and wait for the thread, so nothing is written after.
    fn stop(&mut self) {
        self.to_thread = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<S: Stage> Drop for Worker<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A stage's thread: adds windows until asked to finish or the channel closes ([`Guarded`]
/// after an error). The last of the threads to be done with a block gives it back for reuse.
fn serve<S: Stage>(stage: S, requests: Receiver<Request<S::Progress>>, give_back: Sender<Block>) {
    let mut stage = Guarded::new(stage);
    for request in requests {
        match request {
            Request::Windows(block) => {
                stage.add(&block);
                if let Some(mut block) = Arc::into_inner(block) {
                    block.bytes.clear();
                    block.ends.clear();
                    let _ = give_back.try_send(block);
                }
            }
            Request::Sync(reply) => {
                let _ = reply.send(stage.sync());
            }
            Request::Finish(reply) => {
                let _ = reply.send(stage.finish());
                return;
            }
        }
    }
}

/// The token shards, their hashes and the stream chain, each on its own thread.
pub struct TokenShards {
    dtype: Dtype,
    filling: Block,
    reused: Receiver<Block>,
    files: Worker<ShardFiles>,
    hashes: Worker<ShardHashes>,
    chain: Worker<StreamChain>,
}

impl TokenShards {
    pub fn start(files: ShardFiles, hashes: ShardHashes, chain: StreamChain, dtype: Dtype) -> Self {
        let (give_back, reused) = bounded::<Block>(BLOCKS_WAITING);
        let what = format!("the token shards in {}", files.dir.display());
        Self {
            dtype,
            filling: Block::default(),
            reused,
            files: Worker::start(files, give_back.clone(), &what),
            hashes: Worker::start(hashes, give_back.clone(), "the token shards' sha256"),
            chain: Worker::start(chain, give_back, "the stream chain"),
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

    /// Give the threads the windows collected so far.
    fn hand_over(&mut self) -> anyhow::Result<()> {
        if self.filling.ends.is_empty() {
            return Ok(());
        }
        let next = self.reused.try_recv().unwrap_or_default();
        let block = Arc::new(std::mem::replace(&mut self.filling, next));
        self.files.send(Arc::clone(&block), Wait::SinkForShards)?;
        self.hashes
            .send(Arc::clone(&block), Wait::SinkForFileHash)?;
        self.chain.send(block, Wait::SinkForChain)
    }

    /// Everything pushed is written and fsynced; where the shards stand.
    pub fn sync(&mut self) -> anyhow::Result<ShardsProgress> {
        self.hand_over()?;
        ShardsProgress::of(self.files.sync()?, self.hashes.sync()?, self.chain.sync()?)
    }

    /// Everything pushed is written and the last shard closed.
    pub fn finish(mut self) -> anyhow::Result<ShardsProgress> {
        self.hand_over()?;
        ShardsProgress::of(
            self.files.finish()?,
            self.hashes.finish()?,
            self.chain.finish()?,
        )
    }
}

impl ShardsProgress {
    /// The files' thread's part, the hashes' and the chain's. The files' and the hashes' threads
    /// close a shard at the same window, so they give as many.
    fn of(
        mut closed: Vec<OutputFile>,
        hashes: Vec<String>,
        (chain, chain_marks): (Hash, Vec<ChainMark>),
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            closed.len() == hashes.len(),
            "internal error: {} token shards closed, {} hashed",
            closed.len(),
            hashes.len()
        );
        for (file, sha256) in closed.iter_mut().zip(hashes) {
            file.sha256 = sha256;
        }
        Ok(Self {
            closed,
            chain,
            chain_marks,
        })
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
        let mut shards = TokenShards::start(
            ShardFiles::new(dir.path().into(), 100),
            ShardHashes::new(100),
            StreamChain::new(100),
            Dtype::U16,
        );
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
        let mut shards = TokenShards::start(
            ShardFiles::new(gone.clone(), 10),
            ShardHashes::new(10),
            StreamChain::new(10),
            Dtype::U32,
        );
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
