//! The step store: completed global steps between the pipeline (producer) and the server.
//!
//! Bound: the producer may be at most `prefetch` steps ahead of the slowest rank's position (the
//! step it asked for last). Steps more than [`HISTORY_STEPS`] below the slowest position are
//! dropped: a rank that died in the middle of a step can ask again for the ones before, and a
//! rank's DataLoader workers, which drift a few steps apart, still find theirs. The store
//! therefore holds at most `prefetch + HISTORY_STEPS` steps (a request further ahead than the
//! prefetch window is refused as `StepAhead`, never parked). A lagging rank slows the pipeline;
//! it never grows memory.

use dsprep_client::chain::{self, Hash};
use dsprep_client::protocol::ReplySegment;
use dsprep_mixers::lineage::Lineage;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A resuming daemon starts at the lowest step asked for once no request has lowered it (and no
/// rank has asked for the first time) for this long
/// (a rank's DataLoader workers ask for consecutive steps at about the same time, in any order,
/// and a loaded machine can start one worker a good while after another) …
pub const PLACEMENT_SETTLE: Duration = Duration::from_secs(1);
/// … and once every rank has asked, or this long after the first request.
pub const PLACEMENT_WAIT_ALL: Duration = Duration::from_secs(5);

/// Steps kept below the slowest rank's position. More than one: a rank's DataLoader workers ask
/// for interleaved steps, and each runs up to `prefetch_factor` items ahead of the trainer, so the
/// step it asked for last can be a few steps past what another of its workers still needs (2
/// workers × 2 by default; 8 covers 4 workers).
pub const HISTORY_STEPS: u64 = 8;

/// One global step: `world_size × micro_batch` consecutive windows.
#[derive(Debug)]
pub struct StepData {
    pub step: u64,
    /// Little-endian token ids of every window, in order: rank `r`'s rows are the `r`-th slice of
    /// `micro_batch` windows.
    pub tokens: Vec<u8>,
    /// Document starts of every window.
    pub doc_starts: Vec<Vec<u32>>,
    /// The source of every window's document starts, and of its first token.
    pub doc_sources: Vec<Vec<u16>>,
    pub lead_sources: Vec<u16>,
    /// Every window's tokens before its padding (the whole window without `best_fit`).
    pub real_tokens: Vec<u32>,
    /// sha256 of every window's bytes, in order: what the stream chain links.
    pub digests: Vec<Hash>,
    /// The stream chain around the windows held (`dsprep_client::chain`).
    pub chain: StepChain,
    /// The lineage segment whose recipe made the step (changes of course fall on step
    /// boundaries: one segment per step), named in v5 reply headers.
    pub segment: ReplySegment,
}

impl StepData {
    /// An empty step `step`, for about `windows` windows.
    pub fn new(step: u64, windows: usize) -> Self {
        StepData {
            step,
            tokens: Vec::new(),
            doc_starts: Vec::with_capacity(windows),
            doc_sources: Vec::with_capacity(windows),
            lead_sources: Vec::with_capacity(windows),
            real_tokens: Vec::with_capacity(windows),
            digests: Vec::with_capacity(windows),
            chain: StepChain::default(),
            segment: ReplySegment::default(),
        }
    }
}

/// Which segment of the lineage made a step: the lineage the producer serves (a change to make
/// included) and each segment's recipe hash as bytes.
#[derive(Clone, Debug)]
pub struct StepSegments {
    lineage: Lineage,
    hashes: Vec<[u8; 32]>,
}

impl StepSegments {
    pub fn of(lineage: &Lineage) -> StepSegments {
        let hashes = (lineage.segments.iter())
            .map(|s| {
                let mut hash = [0u8; 32];
                // A lineage's hashes are checked against its recipes when it is read or made.
                let _ = hex::decode_to_slice(&s.recipe_hash, &mut hash);
                hash
            })
            .collect();
        StepSegments {
            lineage: lineage.clone(),
            hashes,
        }
    }

    /// The segment in force at `step` (a change of course takes over at a step boundary).
    pub fn at(&self, step: u64) -> ReplySegment {
        let k = self.lineage.segment_at_step(step);
        ReplySegment {
            index: u32::try_from(k).unwrap_or(u32::MAX),
            recipe_hash: self.hashes.get(k).copied().unwrap_or_default(),
        }
    }
}

/// The stream chain of one step as this daemon holds it: before the global step, before each
/// window held and after the last (`marks`, one more than the windows), after the global step.
/// A node daemon holds only its ranks' windows, a contiguous part of the step.
#[derive(Debug, Default)]
pub struct StepChain {
    pub step_start: Hash,
    pub marks: Vec<Hash>,
    pub step_end: Hash,
}

impl StepChain {
    /// The chain of windows `digests` from `start`, when they are the whole step.
    pub fn linked(start: Hash, digests: &[Hash]) -> StepChain {
        let mut marks = Vec::with_capacity(digests.len() + 1);
        marks.push(start);
        let mut at = start;
        for digest in digests {
            at = chain::link(&at, digest);
            marks.push(at);
        }
        StepChain {
            step_start: start,
            marks,
            step_end: at,
        }
    }
}

/// What a rank's request for a step finds.
#[derive(Debug)]
pub enum Lookup {
    /// The step, and the total number of steps once the end of the data is known.
    Ready(Arc<StepData>, Option<u64>),
    /// The stream ended with `num_steps` steps; the step asked for is not one of them.
    EndOfData {
        num_steps: u64,
    },
    /// Not produced yet, but will be without any other rank moving: wait.
    NotYet,
    /// Already dropped: the oldest step held is `oldest`.
    Gone {
        oldest: u64,
    },
    /// Further ahead than will be produced until slower ranks move (`limit` is the first step
    /// refused).
    Ahead {
        limit: u64,
    },
    Failed(String),
    ShuttingDown,
}

struct State {
    steps: VecDeque<Arc<StepData>>,
    /// Index of `steps[0]` (equals `produced` when empty).
    first: u64,
    produced: u64,
    end: Option<u64>,
    /// Per rank: the step it asked for last (0 before it asks).
    positions: Vec<u64>,
    failed: Option<String>,
    shutdown: bool,
    /// False while a resuming daemon waits for the first request to know where to start.
    placed: bool,
    /// The lowest step asked for before placement, when the first request came, and when the
    /// last one that lowered it or came from a rank for the first time did.
    first_request: Option<u64>,
    first_request_at: Option<Instant>,
    last_request_at: Option<Instant>,
    /// Per rank, whether it has asked before placement.
    asked: Vec<bool>,
    /// The step the ranks asked for first when the store was placed.
    placed_at: u64,
}

impl State {
    fn slowest(&self) -> u64 {
        self.positions.iter().copied().min().unwrap_or(0)
    }

    fn evict(&mut self) {
        let keep_from = self.slowest().saturating_sub(HISTORY_STEPS);
        while self.first < keep_from && !self.steps.is_empty() {
            self.steps.pop_front();
            self.first += 1;
        }
    }
}

pub struct StepStore {
    state: Mutex<State>,
    room: Condvar,
    prefetch: u64,
}

/// The producer was told to stop.
#[derive(Debug)]
pub struct Stopped;

impl StepStore {
    /// A store whose first step is 0.
    pub fn new(world_size: u32, prefetch: u64) -> Self {
        let store = Self::unplaced(world_size, prefetch);
        store.place(0, 0);
        store
    }

    /// A store that learns its first step from the first request (a resuming daemon continues at
    /// whatever step the trainers ask for): see [`StepStore::wait_first_request`].
    pub fn unplaced(world_size: u32, prefetch: u64) -> Self {
        let state = State {
            steps: VecDeque::new(),
            first: 0,
            produced: 0,
            end: None,
            positions: vec![0; world_size as usize],
            failed: None,
            shutdown: false,
            placed: false,
            first_request: None,
            first_request_at: None,
            last_request_at: None,
            asked: vec![false; world_size as usize],
            placed_at: 0,
        };
        Self {
            state: Mutex::new(state),
            room: Condvar::new(),
            prefetch: prefetch.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wait for the first requests to an unplaced store; returns the lowest step asked for once
    /// every rank has asked (or [`PLACEMENT_WAIT_ALL`] has passed since the first request) and no
    /// request has lowered it or come from a new rank for [`PLACEMENT_SETTLE`].
    pub fn wait_first_request(&self) -> Result<u64, Stopped> {
        let mut state = self.lock();
        loop {
            if state.shutdown {
                return Err(Stopped);
            }
            let wait = match (
                state.first_request,
                state.first_request_at,
                state.last_request_at,
            ) {
                (Some(step), Some(first), Some(last)) => {
                    let quiet = last.elapsed();
                    let all = state.asked.iter().all(|&a| a);
                    let waited_all = first.elapsed() >= PLACEMENT_WAIT_ALL;
                    if quiet >= PLACEMENT_SETTLE && (all || waited_all) {
                        return Ok(step);
                    }
                    let settle = PLACEMENT_SETTLE.saturating_sub(quiet);
                    let until = match all {
                        true => settle,
                        false => settle.max(PLACEMENT_WAIT_ALL.saturating_sub(first.elapsed())),
                    };
                    until.max(Duration::from_millis(1))
                }
                _ => Duration::from_secs(3600),
            };
            state = self
                .room
                .wait_timeout(state, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Start the store at `first`, with every rank taken to be at `at` (≥ `first`): the
    /// producer's first push is `first`, and earlier steps are gone. A resuming daemon holds the
    /// steps below the one asked for (`at`) from `first` on, for ranks that ask late.
    pub fn place(&self, first: u64, at: u64) {
        let mut state = self.lock();
        debug_assert!(first <= at);
        state.first = first;
        state.produced = first;
        state.positions.iter_mut().for_each(|p| *p = at);
        state.placed = true;
        state.placed_at = at;
        self.room.notify_all();
    }

    /// Add the next step, waiting while the producer is `prefetch` steps ahead of the slowest rank.
    pub fn push(&self, data: StepData) -> Result<(), Stopped> {
        let mut state = self.lock();
        while !state.shutdown && state.produced >= state.slowest() + self.prefetch {
            state = self.room.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if state.shutdown {
            return Err(Stopped);
        }
        debug_assert_eq!(data.step, state.produced);
        state.steps.push_back(Arc::new(data));
        state.produced += 1;
        Ok(())
    }

    /// Wait until the slowest rank is past `step` (its position, returned) or the store shuts
    /// down.
    pub fn wait_slowest_past(&self, step: u64) -> Result<u64, Stopped> {
        let mut state = self.lock();
        loop {
            if state.shutdown {
                return Err(Stopped);
            }
            if state.slowest() > step {
                return Ok(state.slowest());
            }
            state = self.room.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The stream has ended: no more steps. Said once, at the first call.
    pub fn finish(&self) {
        let mut state = self.lock();
        if state.end.is_none() {
            state.end = Some(state.produced);
            let num_steps = state.produced;
            tracing::info!(num_steps, "end of data: every rank gets {num_steps} steps");
        }
    }

    pub fn fail(&self, message: String) {
        self.lock().failed = Some(message);
    }

    pub fn is_shut_down(&self) -> bool {
        self.lock().shutdown
    }

    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.room.notify_all();
    }

    /// Rank `rank` asks for `step` (rank already checked against the world size).
    pub fn lookup(&self, rank: u32, step: u64) -> Lookup {
        let mut state = self.lock();
        if state.shutdown {
            return Lookup::ShuttingDown;
        }
        if !state.placed {
            if let Some(message) = &state.failed {
                return Lookup::Failed(message.clone());
            }
            // Only news restarts the quiet period: a lower step, or a rank's first request (the
            // server looks parked requests up again and again).
            let lower = state.first_request.is_none_or(|s| step < s);
            let first_of_rank = state
                .asked
                .get_mut(rank as usize)
                .is_some_and(|asked| !std::mem::replace(asked, true));
            if lower || first_of_rank {
                state.first_request = Some(state.first_request.map_or(step, |s| s.min(step)));
                state.first_request_at.get_or_insert_with(Instant::now);
                state.last_request_at = Some(Instant::now());
                self.room.notify_all();
            }
            return Lookup::NotYet;
        }
        if let Some(num_steps) = state.end
            && step >= num_steps
        {
            return Lookup::EndOfData { num_steps };
        }
        if step < state.first {
            return Lookup::Gone {
                oldest: state.first,
            };
        }
        let others = state
            .positions
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != rank as usize)
            .map(|(_, p)| *p)
            .min();
        let limit = others.unwrap_or(step).min(step) + self.prefetch;
        if step >= limit && step >= state.produced {
            return Lookup::Ahead { limit };
        }
        state.positions[rank as usize] = step;
        state.evict();
        self.room.notify_all();
        if step < state.produced {
            return Lookup::Ready(
                Arc::clone(&state.steps[(step - state.first) as usize]),
                state.end,
            );
        }
        match &state.failed {
            Some(message) => Lookup::Failed(message.clone()),
            None => Lookup::NotYet,
        }
    }

    /// The step the ranks asked for first (a resumed daemon's trainers resume there: they report
    /// no step below it again); 0 before placement.
    pub fn placed_at(&self) -> u64 {
        self.lock().placed_at
    }

    /// Whether rank `rank` has fetched `step`: a step produced, at or below the one it asked for
    /// last (a loss report is taken only for such a step).
    pub fn fetched(&self, rank: u32, step: u64) -> bool {
        let state = self.lock();
        step < state.produced && (state.positions.get(rank as usize)).is_some_and(|&p| step <= p)
    }

    /// The slowest rank's position: the lowest step a rank asked for last.
    pub fn slowest(&self) -> u64 {
        self.lock().slowest()
    }

    /// (oldest step held, steps produced, steps held, end) for metrics.
    pub fn snapshot(&self) -> StoreSnapshot {
        let state = self.lock();
        StoreSnapshot {
            oldest: state.first,
            produced: state.produced,
            held: state.steps.len() as u64,
            num_steps: state.end,
            positions: state.positions.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct StoreSnapshot {
    pub oldest: u64,
    pub produced: u64,
    pub held: u64,
    pub num_steps: Option<u64>,
    pub positions: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(i: u64) -> StepData {
        StepData {
            tokens: vec![i as u8],
            ..StepData::new(i, 0)
        }
    }

    fn ready(l: Lookup) -> u64 {
        match l {
            Lookup::Ready(d, _) => d.step,
            other => panic!("not ready: {other:?}"),
        }
    }

    #[test]
    fn the_producer_stops_prefetch_steps_ahead_of_the_slowest_rank() {
        let store = Arc::new(StepStore::new(2, 3));
        let producer = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..10)
                    .map(|i| store.push(step(i)))
                    .take_while(Result::is_ok)
                    .count()
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            store.snapshot().produced,
            3,
            "three steps ahead of position 0"
        );
        assert_eq!(ready(store.lookup(0, 2)), 2);
        assert_eq!(store.snapshot().produced, 3, "rank 1 is still at 0");
        assert_eq!(ready(store.lookup(1, 1)), 1);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let s = store.snapshot();
        assert_eq!(
            (s.oldest, s.produced, s.held),
            (0, 4, 4),
            "history below the slowest"
        );
        store.shutdown();
        assert_eq!(producer.join().unwrap(), 4);
    }

    #[test]
    fn an_unplaced_store_starts_where_the_first_request_asks() {
        let store = Arc::new(StepStore::unplaced(2, 2));
        assert!(matches!(store.lookup(1, 7), Lookup::NotYet));
        assert!(matches!(store.lookup(0, 5), Lookup::NotYet));
        assert_eq!(
            store.wait_first_request().unwrap(),
            5,
            "the lowest step asked for"
        );
        store.place(5, 5);
        store.push(step(5)).unwrap();
        assert_eq!(ready(store.lookup(0, 5)), 5);
        assert!(matches!(store.lookup(1, 4), Lookup::Gone { oldest: 5 }));
        let waiting = StepStore::unplaced(1, 1);
        waiting.shutdown();
        assert!(
            waiting.wait_first_request().is_err(),
            "shutdown ends the wait"
        );
    }

    #[test]
    fn a_store_placed_below_the_ranks_serves_a_rank_that_asks_late() {
        let store = StepStore::unplaced(2, 2);
        store.place(3, 5);
        for s in 3..7 {
            store.push(step(s)).unwrap(); // up to 2 (prefetch) past where the ranks are
        }
        assert_eq!(store.snapshot().produced, 7);
        assert_eq!(ready(store.lookup(0, 5)), 5);
        assert_eq!(ready(store.lookup(1, 4)), 4, "a rank that asks late");
        assert!(matches!(store.lookup(1, 2), Lookup::Gone { oldest: 3 }));
    }

    #[test]
    fn placement_waits_until_the_requests_have_been_quiet() {
        let store = StepStore::unplaced(2, 2);
        assert!(matches!(store.lookup(0, 6), Lookup::NotYet));
        assert!(matches!(store.lookup(1, 6), Lookup::NotYet));
        assert!(matches!(store.lookup(0, 5), Lookup::NotYet));
        let last = Instant::now();
        // The server looks parked requests up again: that is not news.
        assert!(matches!(store.lookup(1, 6), Lookup::NotYet));
        assert!(matches!(store.lookup(0, 5), Lookup::NotYet));
        assert_eq!(store.wait_first_request().unwrap(), 5);
        assert!(
            last.elapsed() >= PLACEMENT_SETTLE,
            "a worker that asks late for a lower step is still waited for"
        );
    }

    #[test]
    fn old_steps_are_gone_and_far_steps_are_ahead() {
        let store = StepStore::new(2, 2);
        store.push(step(0)).unwrap();
        store.push(step(1)).unwrap();
        assert!(matches!(store.lookup(0, 5), Lookup::Ahead { limit: 2 }));
        assert_eq!(ready(store.lookup(0, 1)), 1);
        assert_eq!(ready(store.lookup(1, 1)), 1);
        assert!(matches!(store.lookup(0, 2), Lookup::NotYet));
        store.push(step(2)).unwrap();
        assert_eq!(ready(store.lookup(1, 2)), 2);
        assert_eq!(ready(store.lookup(0, 2)), 2);
        for s in 3..=HISTORY_STEPS + 1 {
            store.push(step(s)).unwrap();
            assert_eq!(ready(store.lookup(0, s)), s);
            assert_eq!(ready(store.lookup(1, s)), s);
        }
        assert!(
            matches!(store.lookup(0, 0), Lookup::Gone { oldest: 1 }),
            "HISTORY_STEPS of history below the slowest rank"
        );
        assert_eq!(
            ready(store.lookup(0, 1)),
            1,
            "a rank may ask again for the steps before"
        );
        let last = HISTORY_STEPS + 1;
        assert_eq!(ready(store.lookup(0, last)), last);
        store.push(step(last + 1)).unwrap();
        store.finish();
        assert!(matches!(
            store.lookup(1, last + 2),
            Lookup::EndOfData { num_steps } if num_steps == last + 2
        ));
        assert_eq!(ready(store.lookup(0, last + 1)), last + 1);
    }

    #[test]
    fn a_step_names_the_segment_in_force_at_it() {
        let lineage = dsprep_mixers::test_fixtures::lineage();
        let segments = StepSegments::of(&lineage);
        let hash = |k: usize| {
            let mut h = [0u8; 32];
            hex::decode_to_slice(&lineage.segments[k].recipe_hash, &mut h).unwrap();
            h
        };
        assert_ne!(hash(0), hash(1));
        for (step, index) in [(0, 0), (4, 0), (5, 1), (900, 1)] {
            let want = ReplySegment {
                index,
                recipe_hash: hash(index as usize),
            };
            assert_eq!(segments.at(step), want, "step {step}");
        }
    }
}
