//! Hostile wire input at volume (issue 13, point 5): a real `dsprep serve` on an ipc endpoint
//! takes 10,000,000 random and mutated frames from 12 DEALER sockets while one well-behaved rank
//! pulls the whole quickstart stream through it. The rank must receive exactly the packed
//! windows; no hostile frame may be served or move a position (impostors with the right recipe
//! hash and the rank's global rank are refused by the ownership check); the daemon answers every
//! message that deserves an answer (its own count); its RSS stays under its first sample +
//! [`RSS_MARGIN`]; it shuts down cleanly afterwards.
//!
//! `DSPREP_WIRE_FUZZ_FRAMES` sets another count, `DSPREP_WIRE_FUZZ_SEED` replays a run (the seed
//! is printed). Half the hostile peers read their replies, and every reply that arrives must be
//! the error its frame deserves (predicted here with the decoder the daemon uses), never data.
//! The other half never read theirs, as a hostile peer may: ZeroMQ's ROUTER drops replies to a
//! peer past its high-water mark, which such a peer is allowed to lose. Every wait has a
//! deadline, a panic in any thread stops the others, and a daemon that exits fails the test at
//! once with its log.
#![allow(clippy::unwrap_used)] // test helpers fail loudly on purpose

mod support;

use dsprep_client::protocol::{DecodeError, Owner, ReplyHeader, Request, RequestKind, Status};
use dsprep_client::{Client, ClientConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::daemon::{Daemon, expected_rank_bytes};
use support::watch::{MIB, Rng, RssWatcher, StopOnPanic, count_from_env, rss_bytes, seed_from_env};
use support::{pack_dataset, quickstart};

/// Frames sent in all unless `DSPREP_WIRE_FUZZ_FRAMES` says otherwise (about 40 s in the debug
/// build on 2 cores: BENCHMARKS.md).
const DEFAULT_FRAMES: u64 = 10_000_000;
/// Hostile sockets (threads); the even ones read their replies, the odd ones never do.
const SENDERS: u64 = 12;
/// The daemon's RSS may grow by at most this much over its first sample (taken once the honest
/// rank has its first step): ZeroMQ's pipes to 12 peers at their high-water marks, the step
/// store, and the allocator's slack.
const RSS_MARGIN: u64 = 32 * MIB;
/// A hostile socket is closed and a new one opened every this many frames (a new peer identity).
const RECONNECT_EVERY: u64 = 50_000;
/// The largest frame the daemon reads: a peer sending a larger one is disconnected before the
/// frame is allocated.
const MAX_FRAME: usize = dsprep::serve::MAX_REQUEST_FRAME_BYTES;
/// A socket that reads its replies sends one frame over the limit every this many frames.
const OVERSIZE_EVERY: u64 = 10_000;
/// Predictions kept per reading socket, to pair with the replies that arrive.
const RING: usize = 1 << 16;
/// Frames one socket may send (22 bits of the request id).
const MAX_FRAMES_PER_SENDER: u64 = 1 << 22;

/// The request id of frame `seq` of sender `me`: 6 bits of sender, 22 of sequence and 36 of a
/// check over both, so that an id a mutation damaged (the reply echoes it) pairs with no other
/// frame's prediction.
fn frame_id(me: u64, seq: u64) -> u64 {
    let mut check = Rng::new((me << 32) ^ seq ^ 0x5eed);
    (me << 58) | (seq << 36) | (check.next_u64() & ((1 << 36) - 1))
}

/// What the daemon does with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// An error reply with this status, echoing this request id.
    Reply(Status, u64),
    /// No reply: a release, or a frame over the size limit (the peer is disconnected).
    Nothing,
    /// It would be served (or move a position): never sent.
    Servable,
}

/// The daemon's answer to `frames`, predicted with the decoder it uses (the order of its checks
/// is `daemon/src/serve/server.rs` `Server::handle`).
fn predict(frames: &[Vec<u8>], real_hash: &[u8; 32], honest: Owner) -> Expect {
    if frames.iter().any(|f| f.len() > MAX_FRAME) {
        return Expect::Nothing;
    }
    let salvaged = Request::salvage_request_id(&frames[0]);
    if frames.len() != 1 {
        return Expect::Reply(Status::Malformed, salvaged);
    }
    let request = match Request::decode(&frames[0]) {
        Ok(request) => request,
        Err(DecodeError::Version { .. }) => {
            return Expect::Reply(Status::UnsupportedVersion, salvaged);
        }
        Err(_) => return Expect::Reply(Status::Malformed, salvaged),
    };
    let id = request.request_id;
    if request.recipe_hash.is_some_and(|h| h != *real_hash) {
        return Expect::Reply(Status::RecipeMismatch, id);
    }
    if request.world_size != 1 || request.rank != 0 {
        return Expect::Reply(Status::LayoutMismatch, id);
    }
    if request.kind == RequestKind::Release {
        // Another session's release frees nothing; the honest session is never sent.
        return match request.owner {
            Some(owner) if owner == honest => Expect::Servable,
            _ => Expect::Nothing,
        };
    }
    match request.owner {
        Some(owner)
            if owner.global_rank == honest.global_rank && owner.session != honest.session =>
        {
            Expect::Reply(Status::RankOwned, id)
        }
        // Another global rank: served as a tensor-parallel peer would be (the protocol guards
        // against mistakes, not attackers). No owner (v1, v2, session 0): refused while a trainer
        // holds the rank, which the honest one does only while it pulls, so this cannot say
        // which. Either way such a frame is never sent: `message` gives it the wrong hash.
        _ => Expect::Servable,
    }
}

/// Makes hostile messages.
struct Hostile {
    rng: Rng,
    real_hash: [u8; 32],
    /// The real hash with every byte inverted: no single mutation turns it into the real one.
    wrong_hash: [u8; 32],
    honest: Owner,
    num_steps: u64,
}

impl Hostile {
    fn u32_field(&mut self) -> u32 {
        match self.rng.below(6) {
            0 => 0,
            1 => 1,
            2 => self.rng.below(16) as u32,
            3 => u32::MAX,
            _ => self.rng.next_u64() as u32,
        }
    }

    fn step_field(&mut self) -> u64 {
        match self.rng.below(5) {
            0 => self.rng.below(self.num_steps + 16),
            1 => u64::MAX - self.rng.below(4),
            2 => 1 << self.rng.below(64),
            _ => self.rng.next_u64(),
        }
    }

    /// A well-formed request of any version with hostile fields and `hash`.
    fn request(&mut self, id: u64, hash: [u8; 32]) -> Vec<u8> {
        let version = self.rng.between(1, 3) as u16;
        let kind = if version == 3 && self.rng.percent(10) {
            RequestKind::Release
        } else {
            RequestKind::Batch
        };
        let owner = Some(Owner {
            global_rank: self.u32_field(),
            session: self.rng.next_u64(),
            started: 0,
        });
        Request {
            version,
            kind,
            request_id: id,
            rank: self.u32_field(),
            world_size: self.u32_field(),
            step: self.step_field(),
            recipe_hash: Some(hash),
            owner,
        }
        .encode()
    }

    /// A request with 1 to 3 mutations: bit flips, bytes set, truncation, extension, another
    /// version or kind.
    fn mutated(&mut self, id: u64) -> Vec<u8> {
        let mut bytes = self.request(id, self.wrong_hash);
        for _ in 0..self.rng.between(1, 3) {
            match self.rng.below(7) {
                0 if !bytes.is_empty() => {
                    let at = self.rng.below(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << self.rng.below(8);
                }
                1 if !bytes.is_empty() => {
                    let at = self.rng.below(bytes.len() as u64) as usize;
                    bytes[at] = self.rng.byte();
                }
                2 => bytes.truncate(self.rng.below(bytes.len() as u64 + 1) as usize),
                3 => {
                    let more = self.rng.between(1, 40) as usize;
                    bytes.extend(self.rng.bytes(more));
                }
                4 if bytes.len() >= 6 => {
                    let version: u16 = match self.rng.below(5) {
                        0 => 0,
                        1 => 4,
                        2 => u16::MAX,
                        3 => self.rng.between(1, 3) as u16, // the length of another version
                        _ => self.rng.next_u64() as u16,
                    };
                    bytes[4..6].copy_from_slice(&version.to_le_bytes());
                }
                5 if bytes.len() >= 8 => {
                    let kind = [0u16, 2, 3, u16::MAX][self.rng.below(4) as usize];
                    bytes[6..8].copy_from_slice(&kind.to_le_bytes());
                }
                _ => {
                    let len = self.rng.below(bytes.len() as u64 + 1) as usize;
                    bytes = bytes[..len].to_vec();
                    bytes.extend(std::iter::repeat_n(0u8, self.rng.below(24) as usize));
                }
            }
        }
        bytes
    }

    /// The right recipe hash and rank 0, from a session that is not the honest one: refused as
    /// `rank owned` (or, with a rank outside the layout, `layout mismatch`); sometimes a release.
    fn impostor(&mut self, id: u64) -> Vec<u8> {
        let mut session = self.rng.next_u64() | 1;
        if session == self.honest.session {
            session ^= 2;
        }
        let outside = self.rng.percent(20);
        let step = if self.rng.percent(70) {
            self.rng.below(self.num_steps + 8)
        } else {
            self.step_field()
        };
        Request {
            version: 3,
            kind: if self.rng.percent(5) {
                RequestKind::Release
            } else {
                RequestKind::Batch
            },
            request_id: id,
            rank: if outside {
                self.rng.between(1, 9) as u32
            } else {
                0
            },
            world_size: 1,
            step,
            recipe_hash: Some(self.real_hash),
            owner: Some(Owner {
                global_rank: self.honest.global_rank,
                session,
                started: 0,
            }),
        }
        .encode()
    }

    fn random_frame(&mut self) -> Vec<u8> {
        let len = self.rng.below(200) as usize;
        let mut bytes = self.rng.bytes(len);
        if bytes.len() >= 6 && self.rng.percent(50) {
            bytes[..4].copy_from_slice(b"DSPQ");
            let version = self.rng.below(5) as u16;
            bytes[4..6].copy_from_slice(&version.to_le_bytes());
        }
        bytes
    }

    /// One hostile message (its frames), never one the daemon would serve; `oversize`: one frame
    /// over the daemon's frame limit.
    fn message(&mut self, id: u64, oversize: bool) -> (Vec<Vec<u8>>, Expect) {
        let mut frames = match self.rng.below(1000) {
            0..=399 => vec![self.mutated(id)],
            400..=549 => vec![self.request(id, self.wrong_hash)],
            550..=699 => vec![self.impostor(id)],
            700..=799 => vec![self.random_frame()],
            800..=899 => (0..self.rng.between(2, 8))
                .map(|_| match self.rng.below(3) {
                    0 => self.request(id, self.wrong_hash),
                    1 => self.impostor(id),
                    _ => self.random_frame(),
                })
                .collect(),
            900..=979 => vec![Vec::new(); self.rng.between(1, 3) as usize],
            _ => {
                let len = self.rng.between(81, MAX_FRAME as u64) as usize;
                let mut bytes = self.request(id, self.wrong_hash);
                bytes.resize(len, 0);
                vec![bytes]
            }
        };
        if oversize {
            // A frame over the daemon's limit (up to 16 MiB, zeros after a request's first
            // bytes): the daemon must drop the connection, not allocate it.
            let mut bytes = self.request(id, self.wrong_hash);
            let len = (MAX_FRAME as u64 + 1).max((64 << 10) << self.rng.below(9));
            bytes.resize(len as usize, 0);
            frames = vec![bytes];
        }
        let mut expect = predict(&frames, &self.real_hash, self.honest);
        if expect == Expect::Servable {
            // Only an unlucky random frame lands here: give it the wrong hash.
            frames[0][32..64].copy_from_slice(&self.wrong_hash);
            expect = predict(&frames, &self.real_hash, self.honest);
        }
        assert_ne!(expect, Expect::Servable, "{frames:?}");
        (frames, expect)
    }
}

/// What one hostile socket saw.
#[derive(Debug, Default)]
struct SenderReport {
    sent: u64,
    /// Frames over the daemon's limit (each costs the socket its connection).
    oversize: u64,
    /// Messages sent that the daemon answers (by prediction), markers included.
    answerable: u64,
    /// Markers sent (see [`barrier`]), besides the frames.
    markers: u64,
    replies: u64,
    /// Replies matched to their frame's prediction (the rest echo an id a mutation changed).
    paired: u64,
    by_status: std::collections::BTreeMap<u16, u64>,
}

struct Shared {
    endpoint: String,
    real_hash: [u8; 32],
    honest: Owner,
    num_steps: u64,
    sent: AtomicU64,
    stop: Arc<AtomicBool>,
    deadline: Instant,
}

/// A DEALER to the daemon.
/// Set when a thread panicked: the others stop with this message, and the first panic that is
/// not this one is the test's.
const STOPPED: &str = "stopped: another thread failed";

impl Shared {
    /// Go on waiting for `what`, unless the deadline has passed or another thread failed.
    fn going_on(&self, what: &str) {
        assert!(!self.stop.load(Ordering::Relaxed), "{STOPPED}");
        assert!(
            Instant::now() < self.deadline,
            "no {what} before the deadline"
        );
    }
}

fn open_socket(context: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let socket = context.socket(zmq::DEALER).unwrap();
    socket.set_linger(0).unwrap();
    socket.set_reconnect_ivl(10).unwrap(); // back at once after the daemon drops an oversize frame
    socket.connect(endpoint).unwrap();
    socket
}

/// Send `message`, waiting for room (the daemon reads slower than we write) within the deadline.
fn send(socket: &zmq::Socket, message: &[Vec<u8>], shared: &Shared, mut waiting: impl FnMut()) {
    loop {
        match socket.send_multipart(message, zmq::DONTWAIT) {
            Ok(()) => return,
            Err(zmq::Error::EAGAIN) => {
                shared.going_on("room to send");
                waiting();
                socket.poll(zmq::POLLOUT, 100).unwrap();
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// Check one reply: an error whose status is the one predicted for its frame (when its echoed
/// id pairs it with one). Returns the id it echoes.
fn check_reply(
    reply: &[Vec<u8>],
    ring: &mut [(u64, Status)],
    me: u64,
    report: &mut SenderReport,
) -> u64 {
    report.replies += 1;
    let header = ReplyHeader::decode(&reply[0]).expect("every reply has a valid header");
    *report.by_status.entry(header.status as u16).or_insert(0) += 1;
    let message = || {
        reply
            .get(1)
            .map(|m| String::from_utf8_lossy(m).into_owned())
            .unwrap_or_default()
    };
    assert!(
        matches!(
            header.status,
            Status::UnsupportedVersion
                | Status::RecipeMismatch
                | Status::LayoutMismatch
                | Status::Malformed
                | Status::RankOwned
        ),
        "a hostile frame got {:?}: {}",
        header.status,
        message()
    );
    assert_eq!(reply.len(), 2, "an error reply is the header and a message");
    assert!(!reply[1].is_empty() && std::str::from_utf8(&reply[1]).is_ok());
    let id = header.request_id;
    let seq = (id >> 36) & (MAX_FRAMES_PER_SENDER - 1);
    let slot = &mut ring[(seq as usize) % RING];
    if id == frame_id(me, seq) && slot.0 == id {
        assert_eq!(header.status, slot.1, "request {id:#x}: {}", message());
        slot.0 = u64::MAX;
        report.paired += 1;
    }
    id
}

/// Read and check every reply waiting on `socket`.
fn drain(socket: &zmq::Socket, ring: &mut [(u64, Status)], me: u64, report: &mut SenderReport) {
    while let Ok(reply) = socket.recv_multipart(zmq::DONTWAIT) {
        check_reply(&reply, ring, me, report);
    }
}

/// Wait until the daemon has read everything sent on `socket`, before it is closed (closing a
/// socket loses what libzmq's engine still buffers for a slow reader). A marker (a request with
/// the wrong recipe hash) is answered only after every message sent before it on the same
/// connection, so its reply is the proof; the marker is sent again until one is answered (a
/// deaf peer's replies past the high-water mark are dropped, a marker's among them).
fn barrier(
    socket: &zmq::Socket,
    ring: &mut [(u64, Status)],
    me: u64,
    report: &mut SenderReport,
    shared: &Shared,
) {
    loop {
        report.markers += 1;
        let id = frame_id(me, MAX_FRAMES_PER_SENDER - report.markers);
        let marker = Request {
            version: 3,
            kind: RequestKind::Batch,
            request_id: id,
            rank: 0,
            world_size: 1,
            step: 0,
            recipe_hash: Some(shared.real_hash.map(|b| !b)),
            owner: None,
        };
        ring[((MAX_FRAMES_PER_SENDER - report.markers) as usize) % RING] =
            (id, Status::RecipeMismatch);
        send(socket, &[marker.encode()], shared, || {
            drain(socket, ring, me, report)
        });
        report.answerable += 1;
        let wait = Instant::now() + Duration::from_secs(1);
        while Instant::now() < wait {
            shared.going_on("a marker's reply");
            if socket.poll(zmq::POLLIN, 100).unwrap() == 0 {
                continue;
            }
            while let Ok(reply) = socket.recv_multipart(zmq::DONTWAIT) {
                if check_reply(&reply, ring, me, report) == id {
                    return;
                }
            }
        }
    }
}

fn hostile_sender(me: u64, frames: u64, reads: bool, seed: u64, shared: &Shared) -> SenderReport {
    let context = zmq::Context::new();
    let mut socket = open_socket(&context, &shared.endpoint);
    // Frames over the limit go on a socket of their own: the daemon drops its connection, and
    // what it still queued, each time.
    let big = open_socket(&context, &shared.endpoint);
    let mut hostile = Hostile {
        rng: Rng::new(seed ^ me.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        real_hash: shared.real_hash,
        wrong_hash: shared.real_hash.map(|b| !b),
        honest: shared.honest,
        num_steps: shared.num_steps,
    };
    let mut ring = vec![(u64::MAX, Status::Ok); RING];
    let mut report = SenderReport::default();
    for seq in 0..frames {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if seq % RECONNECT_EVERY == RECONNECT_EVERY - 1 {
            barrier(&socket, &mut ring, me, &mut report, shared);
            socket = open_socket(&context, &shared.endpoint);
        }
        let id = frame_id(me, seq);
        // Only a peer that reads its replies sends frames over the limit: ZeroMQ (4.3) notices
        // that the daemon dropped a connection only by reading from it, which it stops doing
        // while the peer's receive queue is full, so a deaf peer would wedge its own socket.
        let oversize = reads && seq % OVERSIZE_EVERY == OVERSIZE_EVERY / 2;
        let (message, expect) = hostile.message(id, oversize);
        report.oversize += u64::from(oversize);
        if oversize {
            send(&big, &message, shared, || {});
        } else {
            send(&socket, &message, shared, || {
                if reads {
                    drain(&socket, &mut ring, me, &mut report);
                }
            });
        }
        if let Expect::Reply(status, reply_id) = expect {
            report.answerable += 1;
            if reply_id == id {
                ring[(seq as usize) % RING] = (id, status);
            }
        }
        report.sent += 1;
        shared.sent.fetch_add(1, Ordering::Relaxed);
        if reads && seq % 16 == 0 {
            drain(&socket, &mut ring, me, &mut report);
        }
    }
    barrier(&socket, &mut ring, me, &mut report, shared);
    report
}

/// The honest rank: pulls step `k` once `k / num_steps` of the frames have been sent (so it is
/// served all through the flood), then asks for the step after the last once every frame has
/// been sent, and keeps its client (and so its rank) until the test ends.
fn honest_rank(shared: &Shared, total: u64, first: &AtomicU64) -> (Vec<u8>, Client) {
    let config = ClientConfig {
        endpoint: shared.endpoint.clone(),
        rank: 0,
        world_size: 1,
        recipe_hash: Some(hex::encode(shared.real_hash)),
        timeout: Duration::from_secs(30),
        attempts: 4,
        parallel: Default::default(),
        session: Some(shared.honest.session),
        curve: None,
    };
    let mut client = Client::with_config(config).unwrap();
    let mut received = Vec::new();
    let wait_for = |sent: u64| {
        while shared.sent.load(Ordering::Relaxed) < sent {
            shared.going_on("the senders");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    for step in 0..shared.num_steps {
        wait_for((u128::from(total) * u128::from(step) / u128::from(shared.num_steps)) as u64);
        let batch = client
            .batch_at(step)
            .unwrap_or_else(|e| panic!("the honest rank at step {step}: {e}"))
            .unwrap_or_else(|| panic!("end of data at step {step}"));
        received.extend_from_slice(batch.tokens().as_bytes());
        first.store(step + 1, Ordering::Relaxed);
    }
    wait_for(total);
    let after = client.batch_at(shared.num_steps).unwrap();
    assert!(after.is_none(), "the stream ends after its last step");
    (received, client)
}

/// Wait for every thread to finish, within the deadline, calling `check` as it waits (it fails
/// the test if the daemon has died); a panic in one thread is re-raised here.
fn join_all<T>(
    threads: Vec<JoinHandle<T>>,
    deadline: Instant,
    stop: &AtomicBool,
    mut check: impl FnMut(),
) -> Vec<T> {
    while !threads.iter().all(JoinHandle::is_finished) {
        if stop.load(Ordering::Relaxed) {
            break; // one ended by panicking: the others stop on the flag
        }
        check();
        assert!(
            Instant::now() < deadline,
            "the fuzz did not end before its deadline"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut first_failure = None;
    let mut results = Vec::new();
    for t in threads {
        let grace = Instant::now() + Duration::from_secs(30);
        while !t.is_finished() {
            assert!(
                Instant::now() < grace,
                "a thread did not stop after a panic"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        match t.join() {
            Ok(value) => results.push(value),
            Err(payload) => {
                let secondary = payload
                    .downcast_ref::<String>()
                    .is_some_and(|m| m.contains(STOPPED));
                if first_failure.is_none() || !secondary {
                    first_failure = Some(payload);
                }
                if !secondary {
                    break;
                }
            }
        }
    }
    if let Some(payload) = first_failure {
        std::panic::resume_unwind(payload);
    }
    results
}

#[test]
fn millions_of_hostile_frames_leave_the_honest_rank_exact_and_memory_flat() {
    let total = count_from_env("DSPREP_WIRE_FUZZ_FRAMES", DEFAULT_FRAMES);
    let seed = seed_from_env("DSPREP_WIRE_FUZZ_SEED");
    println!(
        "wire fuzz: {total} frames from {SENDERS} sockets, seed {seed:#x} (DSPREP_WIRE_FUZZ_SEED replays it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let packed = pack_dataset(&quickstart(), &tmp.path().join("packed"));
    let expected = expected_rank_bytes(&packed, 1, 1, 0);
    let num_steps = packed.num_windows();
    let mut real_hash = [0u8; 32];
    hex::decode_to_slice(&packed.manifest().recipe_hash, &mut real_hash).unwrap();

    let endpoint = format!("ipc://{}", tmp.path().join("d.sock").display());
    let args = [
        "--world-size",
        "1",
        "--micro-batch",
        "1",
        "--prefetch",
        "4",
        "--metrics",
        "127.0.0.1:0",
        "--owner-timeout",
        "3600",
    ];
    let mut daemon = Daemon::start_with(&quickstart(), &endpoint, &args).unwrap();
    let pid = daemon.child.id();
    let watcher = RssWatcher::start(pid, Duration::from_millis(20));

    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared {
        endpoint,
        real_hash,
        honest: Owner {
            global_rank: 0,
            session: seed.rotate_left(17) | 1,
            started: 0,
        },
        num_steps,
        sent: AtomicU64::new(0),
        stop: Arc::clone(&stop),
        deadline: Instant::now() + Duration::from_secs(300 + total / 20_000),
    });
    let first = Arc::new(AtomicU64::new(0));
    let honest = {
        let (shared, first, stop) = (Arc::clone(&shared), Arc::clone(&first), Arc::clone(&stop));
        std::thread::spawn(move || {
            let _stop = StopOnPanic(stop);
            honest_rank(&shared, total, &first)
        })
    };
    // The hostile peers start once the honest rank owns rank 0 (before, an impostor would be its
    // first owner, legitimately).
    while first.load(Ordering::Relaxed) == 0 {
        assert!(
            !honest.is_finished(),
            "the honest rank ended before its first step"
        );
        assert!(Instant::now() < shared.deadline, "no first step");
        std::thread::sleep(Duration::from_millis(10));
    }
    let rss_start = rss_bytes(pid).unwrap();
    let started = Instant::now();
    let senders: Vec<_> = (0..SENDERS)
        .map(|me| {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            let frames = total / SENDERS + u64::from(me < total % SENDERS);
            assert!(
                frames <= MAX_FRAMES_PER_SENDER,
                "at most {MAX_FRAMES_PER_SENDER} frames per socket"
            );
            std::thread::spawn(move || {
                let _stop = StopOnPanic(stop);
                hostile_sender(me, frames, me % 2 == 0, seed, &shared)
            })
        })
        .collect();
    let mut daemon_up = || {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            stop.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(200)); // the rest of its log
            panic!("the daemon exited ({status}):\n{}", daemon.log_text());
        }
    };
    let reports = join_all(senders, shared.deadline, &stop, &mut daemon_up);
    let elapsed = started.elapsed();
    let (received, client) = join_all(vec![honest], shared.deadline, &stop, &mut daemon_up)
        .pop()
        .unwrap();
    let rss = watcher.finish();

    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is still up"
    );
    let sent: u64 = reports.iter().map(|r| r.sent).sum();
    assert_eq!(sent, total, "every frame was sent");
    assert_eq!(
        received.len(),
        expected.len(),
        "the honest rank got every step"
    );
    assert!(
        received == expected,
        "the honest rank got exactly the packed windows"
    );
    // Nothing moved the honest rank's position: it is its last step (the end-of-data request
    // after it moves nothing).
    assert_eq!(
        daemon.metric("dsprep_rank_step{rank=\"0\"}"),
        (num_steps - 1) as f64
    );
    let mut by_status = std::collections::BTreeMap::new();
    for r in &reports {
        for (status, n) in &r.by_status {
            *by_status.entry(*status).or_insert(0u64) += n;
        }
    }
    let replies: u64 = reports.iter().map(|r| r.replies).sum();
    let answerable: u64 = reports.iter().map(|r| r.answerable).sum();
    let oversize: u64 = reports.iter().map(|r| r.oversize).sum();
    let markers: u64 = reports.iter().map(|r| r.markers).sum();
    // What the daemon answered, by its own count: every answerable message reaches it (the
    // last ones a moment after the senders are done).
    let answered = || -> f64 {
        [
            "unsupported_version",
            "recipe_mismatch",
            "layout_mismatch",
            "malformed",
            "rank_owned",
        ]
        .iter()
        .map(|s| daemon.metric(&format!("dsprep_replies_total{{status=\"{s}\"}}")))
        .sum()
    };
    let until = Instant::now() + Duration::from_secs(60);
    while answered() < answerable as f64 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        answered(),
        answerable as f64,
        "the daemon answered every message that deserves a reply"
    );
    let paired: u64 = reports.iter().map(|r| r.paired).sum();
    for status in [
        Status::UnsupportedVersion,
        Status::RecipeMismatch,
        Status::LayoutMismatch,
        Status::Malformed,
        Status::RankOwned,
    ] {
        assert!(
            by_status.get(&(status as u16)).copied().unwrap_or(0) > 0,
            "some hostile frames are refused as {status:?}: {by_status:?}"
        );
    }
    assert!(paired > 0 && paired <= replies);
    let peak = rss.peak();
    println!(
        "wire fuzz: {sent} frames (and {markers} markers) in {:.1} s ({:.0} frames/s); replies \
         read: {replies} ({paired} paired with their frame's prediction), by status \
         {by_status:?}; the daemon answered all {answerable} messages that deserve a reply; \
         {oversize} frames over the limit dropped their connections; daemon RSS {:.1} MiB at the \
         start, peak {:.1} MiB over {} samples (bound: start + {} MiB)",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64(),
        rss_start as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        rss.len(),
        RSS_MARGIN / MIB
    );
    assert!(
        peak <= rss_start + RSS_MARGIN,
        "the daemon's RSS peaked at {peak} bytes, over its start {rss_start} + {RSS_MARGIN}"
    );
    daemon.terminate();
    drop(client);
    let log = daemon.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
