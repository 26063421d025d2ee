//! Where the pipeline's threads wait on each other: the time each hand-off (a bounded queue
//! between two threads) kept its waiting side blocked, summed over the process. Logged at debug
//! level (`DSPREP_LOG=dsprep=debug`) when a pipeline run ends, to find which thread bounds a run
//! on many cores: the side that waits least on its input is the busy one.
//!
//! Always on: one clock read before and after each blocking call, which hands over a chunk, a
//! group of rows or a block of windows (hundreds of KiB), never a token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A hand-off, named by who waits for what.
#[derive(Clone, Copy, Debug)]
pub enum Wait {
    /// The reader, for a shard's next rows (the thread reading them ahead is behind).
    ReaderForRows,
    /// The reader, for a permit: as many chunks as allowed are in flight (the sink is behind).
    ReaderForPermit,
    /// The reader, for room in the tokenizers' queue (every tokenizer is busy).
    ReaderForTokenizers,
    /// A tokenizer thread, for a chunk of documents (the reader is behind).
    TokenizerForChunk,
    /// A tokenizer thread, for room in the sink's queue.
    TokenizerForSink,
    /// The sink (the caller's thread), for the next chunk in order.
    SinkForChunk,
    /// The sink, for room in the queue of the thread writing the token shards.
    SinkForShards,
    /// The sink, for room in the queue of the thread hashing the token shard files.
    SinkForFileHash,
    /// The sink, for room in the queue of the thread hashing the stream chain.
    SinkForChain,
}

const WAITS: [Wait; 9] = [
    Wait::ReaderForRows,
    Wait::ReaderForPermit,
    Wait::ReaderForTokenizers,
    Wait::TokenizerForChunk,
    Wait::TokenizerForSink,
    Wait::SinkForChunk,
    Wait::SinkForShards,
    Wait::SinkForFileHash,
    Wait::SinkForChain,
];

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::ReaderForRows => "reader for rows read ahead",
            Wait::ReaderForPermit => "reader for permits",
            Wait::ReaderForTokenizers => "reader for tokenizers",
            Wait::TokenizerForChunk => "tokenizers for chunks",
            Wait::TokenizerForSink => "tokenizers for the sink",
            Wait::SinkForChunk => "sink for the next chunk",
            Wait::SinkForShards => "sink for the shards thread",
            Wait::SinkForFileHash => "sink for the file hash thread",
            Wait::SinkForChain => "sink for the chain thread",
        }
    }
}

static NANOS: [AtomicU64; WAITS.len()] = [const { AtomicU64::new(0) }; WAITS.len()];
static TIMES: [AtomicU64; WAITS.len()] = [const { AtomicU64::new(0) }; WAITS.len()];

/// Run `blocking` (a queue's send or receive) and count the time it took as `wait`'s.
pub fn timed<T>(wait: Wait, blocking: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = blocking();
    let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    NANOS[wait as usize].fetch_add(nanos, Ordering::Relaxed);
    TIMES[wait as usize].fetch_add(1, Ordering::Relaxed);
    out
}

/// Each hand-off's seconds of waiting (summed over the threads on its waiting side) and calls so
/// far, in one line: `reader for rows read ahead 0.412 s / 1730, ...`.
pub fn summary() -> String {
    WAITS
        .iter()
        .map(|&w| {
            let seconds = NANOS[w as usize].load(Ordering::Relaxed) as f64 / 1e9;
            let times = TIMES[w as usize].load(Ordering::Relaxed);
            format!("{} {seconds:.3} s / {times}", w.name())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Other tests of this process may wait on the same hand-off meanwhile: only growth is exact.
    #[test]
    fn a_timed_wait_is_counted_under_its_name() {
        let at = Wait::SinkForChain as usize;
        let (nanos, times) = (
            NANOS[at].load(Ordering::Relaxed),
            TIMES[at].load(Ordering::Relaxed),
        );
        let got = timed(Wait::SinkForChain, || {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        assert_eq!(got, 7);
        assert!(TIMES[at].load(Ordering::Relaxed) > times);
        assert!(NANOS[at].load(Ordering::Relaxed) - nanos >= 20_000_000);
        let line = summary();
        assert_eq!(line.split(", ").count(), WAITS.len(), "{line}");
        assert!(line.contains("sink for the chain thread "), "{line}");
    }
}
