//! Watching processes from a test without hanging it: a seeded generator for repeatable
//! schedules and frames, the resident memory of a process (`/proc/PID/status` `VmRSS`), and an
//! RSS watcher thread that stops when told to or when it is dropped (so a panic anywhere in the
//! test stops it too: no scope waits on it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// SplitMix64: small, seeded, the same sequence on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `range` (inclusive).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// True with probability `percent / 100`.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.byte()).collect()
    }
}

/// A seed from the environment variable `name` (decimal or 0x-hex), else from the clock; the
/// caller prints it so that a failing run can be replayed.
pub fn seed_from_env(name: &str) -> u64 {
    match std::env::var(name) {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={text:?} is not a number"))
        }
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// A count from the environment variable `name`, else `default`.
pub fn count_from_env(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a whole number")),
        Err(_) => default,
    }
}

/// The resident set of process `pid` in bytes, or `None` once it has gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What an [`RssWatcher`] saw: every sample as (pid, bytes), in order.
#[derive(Clone, Debug, Default)]
pub struct RssSamples {
    pub samples: Vec<(u32, u64)>,
}

impl RssSamples {
    pub fn peak(&self) -> u64 {
        self.samples.iter().map(|s| s.1).max().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// Samples the RSS of the process whose id is in `pid` (0: none now, e.g. between a kill and a
/// restart) every `every`, until [`RssWatcher::finish`] or drop.
pub struct RssWatcher {
    pub pid: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<RssSamples>>,
}

impl RssWatcher {
    pub fn start(pid: u32, every: Duration) -> RssWatcher {
        let pid = Arc::new(AtomicU32::new(pid));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (pid, stop) = (Arc::clone(&pid), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut seen = RssSamples::default();
                while !stop.load(Ordering::Relaxed) {
                    let now = pid.load(Ordering::Relaxed);
                    if let Some(bytes) = (now != 0).then(|| rss_bytes(now)).flatten() {
                        seen.samples.push((now, bytes));
                    }
                    std::thread::sleep(every);
                }
                seen
            })
        };
        RssWatcher {
            pid,
            stop,
            thread: Some(thread),
        }
    }

    /// Stop sampling and return what was seen (the thread ends within one interval).
    pub fn finish(mut self) -> RssSamples {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("finished once");
        thread.join().expect("the RSS watcher does not panic")
    }
}

impl Drop for RssWatcher {
    fn drop(&mut self) {
        // On a panic elsewhere: stop the thread; it ends on its own within one interval.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sets `flag` when dropped during a panic: a thread holding one tells the others to stop.
pub struct StopOnPanic(pub Arc<AtomicBool>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

pub const MIB: u64 = 1 << 20;
