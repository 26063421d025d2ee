//! The serving loop: one thread owns the ROUTER socket, decodes requests, answers from the step
//! store, and parks requests for steps not produced yet until the producer signals a new step.
//! A malformed or hostile message gets a typed error reply and never stops the loop.

use super::metrics::Metrics;
use super::nodes::progress::{Gate, LaneProgress};
use super::owners::{Claimant, Owners, RefusalReason};
use super::reports::{Refused, Reports};
use super::store::{Lookup, StepStore};
use dsprep_client::protocol::report::decode_report;
use dsprep_client::protocol::{
    DecodeError, OLDEST_VERSION, PADDING_VERSION, ReplyChain, ReplyHeader, Request, RequestKind,
    Status, encode_doc_sources, encode_doc_starts, encode_real_tokens, ok_reply_frames,
};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The daemon's fixed layout, echoed in every reply header.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub world_size: u32,
    pub micro_batch: u32,
    pub window_tokens: u32,
    pub dtype_bytes: u8,
    pub recipe_hash: [u8; 32],
    /// The ranks this daemon answers: `local_ranks` of them from `first_rank` (all of them on
    /// one node).
    pub first_rank: u32,
    pub local_ranks: u32,
    /// Whether windows may end in padding (`best_fit`): clients older than protocol v4 cannot
    /// tell it from tokens, and are refused.
    pub pads: bool,
}

impl Layout {
    fn owns(&self, rank: u32) -> bool {
        rank >= self.first_rank && rank - self.first_rank < self.local_ranks
    }
}

/// How long the loop sleeps in `poll` before checking for shutdown.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often requests waiting on other nodes' lanes are looked at again.
const GATE_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Requests waiting for a step at most (beyond, the oldest are refused): bounds the parked list.
const MAX_PARKED: usize = 4096;
/// Malformed requests are logged at most this often, saying how many were not: a flood of
/// hostile frames must not become a flood of log lines.
const MALFORMED_LOG_EVERY: Duration = Duration::from_secs(1);

/// When a malformed request was last logged, and how many came since without a log line.
#[derive(Default)]
pub struct MalformedLog {
    last: Cell<Option<Instant>>,
    unlogged: Cell<u64>,
}

impl MalformedLog {
    fn note(&self, status: Status, message: &str) {
        let now = Instant::now();
        if self
            .last
            .get()
            .is_some_and(|at| now.duration_since(at) < MALFORMED_LOG_EVERY)
        {
            self.unlogged.set(self.unlogged.get() + 1);
            return;
        }
        self.last.set(Some(now));
        let unlogged = self.unlogged.replace(0);
        if unlogged > 0 {
            tracing::warn!(
                ?status,
                message,
                "malformed request ({unlogged} more since the last one logged)"
            );
        } else {
            tracing::warn!(?status, message, "malformed request");
        }
    }
}

struct Parked {
    identity: Vec<u8>,
    request: Request,
}

pub struct Server {
    pub router: zmq::Socket,
    /// Signalled by the producer after each new step (and at the end).
    pub wake: zmq::Socket,
    pub store: Arc<StepStore>,
    pub metrics: Arc<Metrics>,
    pub layout: Layout,
    pub shutdown: Arc<AtomicBool>,
    /// With several node daemons: the lanes' progress, and the global batch in windows. A step
    /// is served only once every lane of the stream is known to reach it.
    pub gate: Option<(Arc<LaneProgress>, u64)>,
    pub malformed_log: MalformedLog,
    /// Which trainer process each global rank belongs to (v3 requests).
    pub owners: Owners,
    /// The earlier recipes of the stream's lineage (`lineage.json`): a trainer that pinned one
    /// of them is served too, the stream it pinned being the one that changed course.
    pub earlier_recipes: Vec<[u8; 32]>,
    /// The trainers' loss reports (v7).
    pub reports: Arc<Reports>,
}

impl Server {
    pub fn run(self) -> anyhow::Result<()> {
        let mut parked: Vec<Parked> = Vec::new();
        let (every, mut last_line) = (crate::progress::plain_every(), Instant::now());
        loop {
            if last_line.elapsed() >= every.max(POLL_INTERVAL) {
                last_line = Instant::now();
                self.progress_line();
            }
            let (router_ready, wake_ready) = {
                let mut items = [
                    self.router.as_poll_item(zmq::POLLIN),
                    self.wake.as_poll_item(zmq::POLLIN),
                ];
                let interval = if self.gate.is_some() && !parked.is_empty() {
                    GATE_POLL_INTERVAL
                } else {
                    POLL_INTERVAL
                };
                match zmq::poll(&mut items, interval.as_millis() as i64) {
                    Ok(_) | Err(zmq::Error::EINTR) => {}
                    Err(e) => return Err(anyhow::anyhow!("poll failed: {e}")),
                }
                (items[0].is_readable(), items[1].is_readable())
            };
            if self.shutdown.load(Ordering::Relaxed) {
                for p in parked.drain(..) {
                    self.reply_error(
                        &p.identity,
                        &p.request,
                        Status::ShuttingDown,
                        "the daemon is shutting down",
                    );
                }
                return Ok(());
            }
            if wake_ready {
                while self.wake.recv_bytes(zmq::DONTWAIT).is_ok() {}
            }
            if router_ready {
                while let Ok(frames) = self.router.recv_multipart(zmq::DONTWAIT) {
                    self.handle(frames, &mut parked);
                }
            }
            if (wake_ready || self.gate.is_some()) && !parked.is_empty() {
                let waiting = std::mem::take(&mut parked);
                for p in waiting {
                    self.answer(p.identity, p.request, &mut parked);
                }
            }
        }
    }

    fn handle(&self, mut frames: Vec<Vec<u8>>, parked: &mut Vec<Parked>) {
        if frames.is_empty() {
            return;
        }
        let identity = frames.remove(0);
        // A loss report (v7) is a request frame and its entries; every other request is one frame.
        let report = (frames.len() == 2)
            .then(|| Request::decode(&frames[0]).ok())
            .flatten()
            .filter(|r| r.kind == RequestKind::Report);
        if let Some(request) = report {
            self.report(&request, &frames[1]);
            return;
        }
        if frames.len() != 1 {
            let id = frames
                .first()
                .map(|f| Request::salvage_request_id(f))
                .unwrap_or(0);
            let msg = format!(
                "a request is exactly one frame (a loss report two), got {}",
                frames.len()
            );
            self.send_error(&identity, id, 0, Status::Malformed, &msg);
            return;
        }
        let request = match Request::decode(&frames[0]) {
            Ok(request) => request,
            Err(e) => {
                let status = if matches!(e, DecodeError::Version { .. }) {
                    Status::UnsupportedVersion
                } else {
                    Status::Malformed
                };
                self.send_error(
                    &identity,
                    Request::salvage_request_id(&frames[0]),
                    0,
                    status,
                    &format!("request rejected: {e}"),
                );
                return;
            }
        };
        if request.kind == RequestKind::Report {
            let msg = "a loss report is two frames: the request and its entries";
            self.malformed_log.note(Status::Malformed, msg);
            return; // never answered
        }
        if request.kind == RequestKind::Keepalive {
            // Keeps only a rank the session owns; never answered (the clients' keepalive
            // sockets do not read).
            if let Some(owner) = request.owner {
                self.owners.keep(owner, Instant::now());
            }
            return;
        }
        let layout = self.layout;
        if layout.pads && request.version < PADDING_VERSION {
            let msg = format!(
                "this daemon packs best_fit windows that end in padding, which a protocol v{} \
                 client would train on as tokens; upgrade the trainer's dsprep_client to one that \
                 speaks v{PADDING_VERSION} (it masks the padding)",
                request.version
            );
            self.reply_error(&identity, &request, Status::UnsupportedVersion, &msg);
            return;
        }
        if let Some(expected) = request.recipe_hash
            && expected != layout.recipe_hash
            && !self.earlier_recipes.contains(&expected)
        {
            let msg = recipe_mismatch(&layout.recipe_hash, &self.earlier_recipes, &expected);
            self.reply_error(&identity, &request, Status::RecipeMismatch, &msg);
            return;
        }
        if request.world_size != layout.world_size || request.rank >= layout.world_size {
            let msg = format!(
                "the daemon serves world size {} (micro batch {}); the request is rank {} of world size {}",
                layout.world_size, layout.micro_batch, request.rank, request.world_size
            );
            self.reply_error(&identity, &request, Status::LayoutMismatch, &msg);
            return;
        }
        if !layout.owns(request.rank) {
            let msg = format!(
                "rank {} is not served here: this node daemon serves ranks {}..={} of world size {} (ranks are laid out node by node); connect rank {} to its own node's daemon",
                request.rank,
                layout.first_rank,
                layout.first_rank + layout.local_ranks - 1,
                layout.world_size,
                request.rank
            );
            self.reply_error(&identity, &request, Status::LayoutMismatch, &msg);
            return;
        }
        if request.kind == RequestKind::Release {
            if let Some(owner) = request.owner {
                self.owners.release(owner);
            }
            return; // no reply
        }
        let claimant = Claimant::of(request.owner, request.version, &identity);
        if let Err(refusal) = self.owners.claim(claimant, request.rank, Instant::now()) {
            // Refused before the store sees it: nothing the daemon holds moves.
            self.metrics.count_owner_refused(refusal.reason);
            if refusal.first {
                tracing::warn!(
                    rank = request.rank,
                    reason = refusal.reason.label(),
                    message = refusal.message,
                    "refused a session its rank (logged once per session)"
                );
            }
            let status = match refusal.reason {
                RefusalReason::Owned => Status::RankOwned,
                RefusalReason::Superseded => Status::Superseded,
            };
            self.reply_error(&identity, &request, status, &refusal.message);
            return;
        }
        if parked.len() >= MAX_PARKED {
            let oldest = parked.remove(0);
            self.reply_error(
                &oldest.identity,
                &oldest.request,
                Status::StepAhead,
                "too many requests are waiting for steps not produced yet",
            );
        }
        self.answer(identity, request, parked);
    }

    /// The progress line of the trainers' loss (`DSPREP_PROGRESS_SECS`, 30 s by default), when
    /// reports came since the last one.
    fn progress_line(&self) {
        let loss = self.reports.progress_part();
        if !loss.is_empty() {
            let s = self.store.snapshot();
            let slowest = s.positions.iter().copied().min().unwrap_or(0);
            tracing::info!(
                "steps produced {}, slowest rank at step {slowest}{loss}",
                s.produced
            );
        }
    }

    /// A loss report (v7): taken only from the rank's owner, for a step it fetched, into
    /// [`Reports`]; never answered (a refusal is counted, and a malformed one logged).
    fn report(&self, request: &Request, entries: &[u8]) {
        let entries = match decode_report(entries) {
            Ok(entries) => entries,
            Err(e) => {
                self.malformed_log.note(Status::Malformed, &e.to_string());
                return;
            }
        };
        let layout = self.layout;
        let owned = request
            .owner
            .is_some_and(|owner| self.owners.owns(owner, request.rank));
        let fetched = request.world_size == layout.world_size
            && layout.owns(request.rank)
            && owned
            && (self.store).fetched(request.rank - layout.first_rank, request.step);
        if !fetched {
            self.reports.refuse(Refused::NotFetched);
            return;
        }
        let _ = (self.reports).accept(request.rank - layout.first_rank, request.step, &entries);
    }

    fn answer(&self, identity: Vec<u8>, request: Request, parked: &mut Vec<Parked>) {
        let claimant = Claimant::of(request.owner, request.version, &identity);
        self.owners.touch(claimant, request.rank, Instant::now());
        let local_rank = request.rank - self.layout.first_rank;
        match self.store.lookup(local_rank, request.step) {
            Lookup::Ready(step, num_steps) => match &self.gate {
                None => self.send_batch(&identity, &request, &step, num_steps),
                Some((lanes, global_batch)) => match lanes.gate(request.step, *global_batch) {
                    Gate::Open(num_steps) => self.send_batch(&identity, &request, &step, num_steps),
                    Gate::End(num_steps) => self.send_end(&identity, &request, num_steps),
                    Gate::Wait => parked.push(Parked { identity, request }),
                },
            },
            Lookup::NotYet => parked.push(Parked { identity, request }),
            Lookup::EndOfData { num_steps } => match &self.gate {
                None => self.send_end(&identity, &request, num_steps),
                // This node's lanes ended; the stream may end earlier on another node's lane.
                Some((lanes, global_batch)) => match lanes.gate(request.step, *global_batch) {
                    Gate::End(num_steps) => self.send_end(&identity, &request, num_steps),
                    Gate::Open(_) | Gate::Wait => parked.push(Parked { identity, request }),
                },
            },
            Lookup::Gone { oldest } => {
                let msg = format!(
                    "step {} is no longer held: the oldest step held is {oldest} (resume from a checkpoint to go back further)",
                    request.step
                );
                self.reply_error(&identity, &request, Status::StepGone, &msg);
            }
            Lookup::Ahead { limit } => {
                let msg = format!(
                    "step {} is too far ahead: slower ranks hold the daemon at steps below {limit} (prefetch window)",
                    request.step
                );
                self.reply_error(&identity, &request, Status::StepAhead, &msg);
            }
            Lookup::Failed(message) => {
                self.reply_error(&identity, &request, Status::DaemonFailed, &message)
            }
            Lookup::ShuttingDown => self.reply_error(
                &identity,
                &request,
                Status::ShuttingDown,
                "the daemon is shutting down",
            ),
        }
    }

    fn send_end(&self, identity: &[u8], request: &Request, num_steps: u64) {
        let header = self.header(request, Status::EndOfData, num_steps);
        self.metrics.count_reply("end_of_data");
        let _ = self.router.send_multipart([identity, &header.encode()], 0);
    }

    fn header(&self, request: &Request, status: Status, num_steps: u64) -> ReplyHeader {
        let l = self.layout;
        ReplyHeader {
            version: request.version,
            status,
            request_id: request.request_id,
            step: request.step,
            rank: request.rank,
            world_size: l.world_size,
            micro_batch: l.micro_batch,
            window_tokens: l.window_tokens,
            dtype_bytes: l.dtype_bytes,
            recipe_hash: l.recipe_hash,
            num_steps,
            first_window: first_window(request.step, request.rank, l),
            chain: None,
            segment: None,
        }
    }

    fn send_batch(
        &self,
        identity: &[u8],
        request: &Request,
        step: &super::store::StepData,
        num_steps: Option<u64>,
    ) {
        let l = self.layout;
        let mb = l.micro_batch as usize;
        let row_bytes = l.window_tokens as usize * l.dtype_bytes as usize;
        let first_row = (request.rank - l.first_rank) as usize * mb;
        let payload = &step.tokens[first_row * row_bytes..(first_row + mb) * row_bytes];
        let rows: Vec<&[u32]> = step.doc_starts[first_row..first_row + mb]
            .iter()
            .map(Vec::as_slice)
            .collect();
        let chain = &step.chain;
        let (Some(rows_start), Some(rows_end)) =
            (chain.marks.get(first_row), chain.marks.get(first_row + mb))
        else {
            let msg = format!("internal error: step {} has no stream chain", step.step);
            self.reply_error(identity, request, Status::DaemonFailed, &msg);
            return;
        };
        let header = ReplyHeader {
            chain: Some(ReplyChain {
                step_start: chain.step_start,
                rows_start: *rows_start,
                rows_end: *rows_end,
                step_end: chain.step_end,
            }),
            segment: Some(step.segment),
            ..self.header(request, Status::Ok, num_steps.unwrap_or(u64::MAX))
        };
        self.metrics.count_reply("ok");
        let (header, starts) = (header.encode(), encode_doc_starts(&rows));
        let mut frames = vec![identity, &header, payload, &starts];
        let (sources, real_tokens);
        if ok_reply_frames(request.version) >= 4 {
            let rows: Vec<&[u16]> = step.doc_sources[first_row..first_row + mb]
                .iter()
                .map(Vec::as_slice)
                .collect();
            sources = encode_doc_sources(&step.lead_sources[first_row..first_row + mb], &rows);
            frames.push(&sources);
        }
        if ok_reply_frames(request.version) >= 5 {
            real_tokens = encode_real_tokens(&step.real_tokens[first_row..first_row + mb]);
            frames.push(&real_tokens);
        }
        let _ = self.router.send_multipart(frames, 0);
    }

    fn reply_error(&self, identity: &[u8], request: &Request, status: Status, message: &str) {
        let header = self.header(request, status, u64::MAX);
        self.metrics.count_reply(status_name(status));
        tracing::debug!(
            rank = request.rank,
            step = request.step,
            ?status,
            message,
            "refused a request"
        );
        let _ = self
            .router
            .send_multipart([identity, &header.encode(), message.as_bytes()], 0);
    }

    fn send_error(
        &self,
        identity: &[u8],
        request_id: u64,
        step: u64,
        status: Status,
        message: &str,
    ) {
        // Answered in the oldest version: every client can read it.
        let request = Request {
            version: OLDEST_VERSION,
            kind: RequestKind::Batch,
            request_id,
            rank: 0,
            world_size: 0,
            step,
            recipe_hash: None,
            owner: None,
        };
        self.malformed_log.note(status, message);
        self.reply_error(identity, &request, status, message);
    }
}

/// Status 11's message: the recipe the daemon serves and the one the trainer expects, and the
/// earlier recipes of its lineage, with which a trainer pinned to one of them is served.
fn recipe_mismatch(serves: &[u8; 32], earlier: &[[u8; 32]], expected: &[u8; 32]) -> String {
    let mut msg = format!(
        "the daemon serves recipe {}, the trainer expects {}",
        hex::encode(serves),
        hex::encode(expected)
    );
    if !earlier.is_empty() {
        let earlier: Vec<String> = earlier.iter().map(hex::encode).collect();
        msg += &format!(
            ", which is no earlier recipe of its lineage either ({})",
            earlier.join(", ")
        );
    }
    msg
}

/// `(step × world_size + rank) × micro_batch`: the stream index of a rank's first row. A request
/// for a step far past any stream (a hostile or corrupt one, answered with an error) saturates
/// at `u64::MAX` instead of overflowing.
fn first_window(step: u64, rank: u32, layout: Layout) -> u64 {
    step.checked_mul(u64::from(layout.world_size))
        .and_then(|w| w.checked_add(u64::from(rank)))
        .and_then(|w| w.checked_mul(u64::from(layout.micro_batch)))
        .unwrap_or(u64::MAX)
}

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Ok => "ok",
        Status::EndOfData => "end_of_data",
        Status::UnsupportedVersion => "unsupported_version",
        Status::RecipeMismatch => "recipe_mismatch",
        Status::LayoutMismatch => "layout_mismatch",
        Status::StepGone => "step_gone",
        Status::StepAhead => "step_ahead",
        Status::Malformed => "malformed",
        Status::DaemonFailed => "daemon_failed",
        Status::ShuttingDown => "shutting_down",
        Status::RankOwned => "rank_owned",
        Status::Superseded => "superseded",
    }
}
