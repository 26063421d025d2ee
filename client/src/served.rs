//! The trainer-side client of the daemon: one rank's connection, `next_batch()` / `batch_at(step)`,
//! timeouts with reconnect, batches whose tokens are a view of the received frame (no copy), and
//! the stream chain checked on every step (its rows hash to the chain the daemon states, and each
//! step continues the one before, or the value a resumed trainer saved). With CURVE keys the
//! connection is authenticated and encrypted; a refused handshake is a typed error
//! (`Unauthorized`), not a hang (`connection.rs`). While a client lives, a keepalive thread keeps
//! its rank at the daemon however long a step takes (`keepalive.rs`).

use crate::batch::{cu_seqlens, masked_labels, position_ids, source_token_counts, token_sources};
use crate::chain::{self, Hash};
use crate::connection::Connection;
use crate::curve::{CLIENT_KEY_ENV, ClientKeys, SERVER_KEY_ENV};
use crate::keepalive::Keepalive;
use crate::packed::TokenSlice;
use crate::parallel::Parallelism;
use crate::protocol::report::{MAX_REPORT_ENTRIES, SourceLoss, SourceSums, encode_report};
use crate::protocol::{
    DecodeError, Owner, PROTOCOL_VERSION, ReplyChain, ReplyHeader, Request, RequestKind, Status,
    decode_doc_sources, decode_doc_starts, decode_real_tokens, ok_reply_frames,
};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(String),
    #[error("zeromq: {0}")]
    Zmq(#[from] zmq::Error),
    #[error(
        "no reply from the daemon at {endpoint} after {waited:?} ({attempts} attempts): is it running?"
    )]
    DaemonGone {
        endpoint: String,
        waited: Duration,
        attempts: u32,
    },
    #[error("malformed reply from the daemon: {0}")]
    Protocol(#[from] DecodeError),
    #[error("protocol version: {0}")]
    UnsupportedVersion(String),
    #[error("recipe mismatch: {0}")]
    RecipeMismatch(String),
    #[error("rank/world size mismatch: {0}")]
    LayoutMismatch(String),
    #[error("step out of range: {0}")]
    StepGone(String),
    #[error("step out of range: {0}")]
    StepAhead(String),
    #[error("the daemon rejected the request as malformed: {0}")]
    Malformed(String),
    #[error("the daemon's pipeline failed: {0}")]
    DaemonFailed(String),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// Another trainer process holds this global rank (protocol v3).
    #[error("rank taken: {0}")]
    RankOwned(String),
    /// A trainer process started later holds this global rank (protocol v6): this process
    /// belongs to a job that was replaced, and should exit. Never retried.
    #[error("superseded: {0}")]
    Superseded(String),
    /// The stream chain does not continue: the daemon is not serving the stream this trainer
    /// consumed, or the bytes changed on the way.
    #[error("stream chain: {0}")]
    ChainMismatch(String),
    /// The daemon refused this client's handshake (CURVE keys missing, not allowed, or for
    /// another daemon), or never completed one.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub endpoint: String,
    pub rank: u32,
    pub world_size: u32,
    /// The recipe hash (hex) this trainer expects; `None` accepts the daemon's.
    pub recipe_hash: Option<String>,
    /// How long one attempt waits for a reply before reconnecting.
    pub timeout: Duration,
    /// Attempts before giving up with [`ClientError::DaemonGone`].
    pub attempts: u32,
    /// Tensor/context/pipeline parallel sizes: the client asks for its data-parallel rank's
    /// batches, so every rank of one model-parallel group gets the same bytes (`parallel.rs`).
    pub parallel: Parallelism,
    /// The session that owns `rank` at the daemon (PROTOCOL.md "One owner per rank"); `None`:
    /// this process's own ([`process_session`]), shared by every client it makes. Either way
    /// the session's start time is the process's ([`process_session_started`]).
    pub session: Option<u64>,
    /// CURVE keys, for a daemon that serves with CURVE (`--curve-secret-key`): the daemon's
    /// public key and this client's key pair. `None`: a plain connection.
    pub curve: Option<ClientKeys>,
}

/// This process's session id: random per process start, the same for every client it makes.
pub fn process_session() -> u64 {
    this_process().0
}

/// When this process's session was made (its first client), in nanoseconds since the Unix epoch:
/// sent with every request (protocol v6), so a later trainer process takes the rank over at once
/// and an earlier one, a zombie of a replaced job, is refused.
pub fn process_session_started() -> u64 {
    this_process().1
}

/// (session, start time) of this process, made once.
fn this_process() -> (u64, u64) {
    static SESSION: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    *SESSION.get_or_init(|| {
        use sha2::{Digest, Sha256};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut hasher = Sha256::new();
        hasher.update(std::process::id().to_le_bytes());
        hasher.update(now.as_nanos().to_le_bytes());
        hasher.update((&SESSION as *const _ as usize).to_le_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        let started = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX).max(1);
        (u64::from_le_bytes(id) | 1, started)
    })
}

impl ClientConfig {
    /// Rank and world size from `RANK` and `WORLD_SIZE` (as torchrun sets them); a single process
    /// (neither set) is rank 0 of 1. Model parallelism from `DSPREP_TP`, `DSPREP_CP`, `DSPREP_PP`
    /// (default 1) and `DSPREP_RANK_ORDER` (default `tp-cp-dp-pp`). CURVE keys from
    /// `DSPREP_CURVE_SERVER_KEY` (the daemon's `NAME.key`) and `DSPREP_CURVE_CLIENT_KEY` (this
    /// client's `NAME.key_secret`), when set.
    pub fn from_env(endpoint: &str) -> Result<ClientConfig, ClientError> {
        let read = |name: &str| -> Result<Option<u32>, ClientError> {
            match std::env::var(name) {
                Ok(v) => v.trim().parse().map(Some).map_err(|_| {
                    ClientError::Config(format!("{name}={v:?} is not a whole number"))
                }),
                Err(_) => Ok(None),
            }
        };
        let (rank, world_size) = match (read("RANK")?, read("WORLD_SIZE")?) {
            (Some(r), Some(w)) => (r, w),
            (None, None) => (0, 1),
            _ => {
                return Err(ClientError::Config(
                    "set both RANK and WORLD_SIZE, or neither".into(),
                ));
            }
        };
        let parallel = Parallelism::from_env_or([None; 3], None, |name| std::env::var(name).ok())
            .map_err(ClientError::Config)?;
        Ok(ClientConfig {
            endpoint: endpoint.to_string(),
            rank,
            world_size,
            recipe_hash: None,
            timeout: Duration::from_secs(30),
            attempts: 4,
            parallel,
            session: None,
            curve: ClientKeys::from_env().map_err(ClientError::Config)?,
        })
    }
}

/// Reply payload frame, viewed as token ids. ZeroMQ's large messages are 8-byte aligned; a
/// misaligned frame (never seen) is copied once rather than refused.
enum Payload {
    Frame(zmq::Message),
    Copied(Vec<u32>),
}

/// One rank's rows for one step.
pub struct ServedBatch {
    pub header: ReplyHeader,
    payload: Payload,
    doc_offsets: Vec<u32>,
    doc_starts: Vec<u32>,
    /// v3: per row the source of its first token's document, and the source of every start.
    sources: Option<(Vec<u16>, Vec<u16>)>,
    /// v4: per row, the tokens before its padding (the whole row from a daemon that does not pad).
    real_tokens: Vec<u32>,
}

impl std::fmt::Debug for ServedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedBatch")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl ServedBatch {
    pub fn step(&self) -> u64 {
        self.header.step
    }

    pub fn rows(&self) -> usize {
        self.header.micro_batch as usize
    }

    /// The index in the stream's lineage of the segment whose recipe produced this step (0: the
    /// first recipe); `None` from a daemon older than protocol v5.
    pub fn segment(&self) -> Option<u32> {
        self.header.segment.map(|s| s.index)
    }

    /// That segment's recipe hash (the header's `recipe_hash` is the daemon's: the lineage's
    /// newest); `None` from a daemon older than protocol v5.
    pub fn segment_recipe_hash(&self) -> Option<[u8; 32]> {
        self.header.segment.map(|s| s.recipe_hash)
    }

    /// Row `i`'s bytes as received (little-endian ids): what the stream chain hashes.
    fn row_bytes(&self, i: usize) -> &[u8] {
        let row = self.header.window_tokens as usize * self.header.dtype_bytes as usize;
        &self.bytes()[i * row..(i + 1) * row]
    }

    fn bytes(&self) -> &[u8] {
        match &self.payload {
            Payload::Frame(m) => m,
            Payload::Copied(words) => {
                &bytemuck::cast_slice::<u32, u8>(words)[..self.header.payload_bytes()]
            }
        }
    }

    /// All rows' tokens, `[micro_batch, seq_len + 1]` row-major.
    pub fn tokens(&self) -> TokenSlice<'_> {
        let bytes = self.bytes();
        match self.header.dtype_bytes {
            2 => TokenSlice::U16(bytemuck::cast_slice(bytes)),
            _ => TokenSlice::U32(bytemuck::cast_slice(bytes)),
        }
    }

    /// Row `i`'s `seq_len + 1` tokens.
    pub fn row(&self, i: usize) -> TokenSlice<'_> {
        let w = self.header.window_tokens as usize;
        match self.tokens() {
            TokenSlice::U16(t) => TokenSlice::U16(&t[i * w..(i + 1) * w]),
            TokenSlice::U32(t) => TokenSlice::U32(&t[i * w..(i + 1) * w]),
        }
    }

    /// Row `i`'s inputs: its first `seq_len` tokens.
    pub fn inputs(&self, i: usize) -> TokenSlice<'_> {
        slice(self.row(i), 0, self.header.window_tokens as usize - 1)
    }

    /// Row `i`'s labels: its last `seq_len` tokens as they are, padding included; a loss wants
    /// [`ServedBatch::masked_labels`] when the daemon pads (`best_fit`).
    pub fn labels(&self, i: usize) -> TokenSlice<'_> {
        slice(self.row(i), 1, self.header.window_tokens as usize)
    }

    /// Offsets in row `i` where a document begins.
    pub fn doc_starts(&self, i: usize) -> &[u32] {
        &self.doc_starts[self.doc_offsets[i] as usize..self.doc_offsets[i + 1] as usize]
    }

    /// The recipe source index of each document starting in row `i` (protocol v3).
    pub fn doc_sources(&self, i: usize) -> Option<&[u16]> {
        let (_, sources) = self.sources.as_ref()?;
        sources.get(self.doc_offsets[i] as usize..self.doc_offsets[i + 1] as usize)
    }

    /// The source of the document that holds row `i`'s first token (protocol v3).
    pub fn lead_source(&self, i: usize) -> Option<u16> {
        self.sources.as_ref()?.0.get(i).copied()
    }

    /// The source of each of row `i`'s input tokens, for a loss per source (protocol v3).
    pub fn input_sources(&self, i: usize) -> Option<Vec<u16>> {
        let len = self.header.window_tokens as usize - 1;
        let (starts, sources) = (self.doc_starts(i), self.doc_sources(i)?);
        Some(token_sources(len, starts, sources, self.lead_source(i)?))
    }

    /// Input tokens per source over every row, `(source, tokens)` sorted by source (protocol v3).
    pub fn source_token_counts(&self) -> Option<Vec<(u16, u64)>> {
        let rows = (0..self.rows())
            .map(|i| self.input_sources(i))
            .collect::<Option<Vec<_>>>()?;
        Some(source_token_counts(rows.iter().map(Vec::as_slice)))
    }

    /// Per source, the summed loss and counted tokens of this batch's rows (protocol v3 sources):
    /// `loss` is the per-token loss, `rows × seq_len` row-major (position `t` predicts token
    /// `t + 1` and counts for input token `t`'s source); a position counts when its label is not
    /// padding. What [`Client::report`] sends. `None` without document sources (protocol < 3),
    /// or when `loss` is not `rows × seq_len` long.
    pub fn per_source_loss(&self, loss: &[f32]) -> Option<Vec<SourceLoss>> {
        let seq_len = self.header.window_tokens as usize - 1;
        if loss.len() != self.rows() * seq_len {
            return None;
        }
        let mut sums = SourceSums::default();
        for (i, row) in loss.chunks_exact(seq_len.max(1)).enumerate() {
            // Positions whose label is a real token: below real_tokens − 1.
            let counted = (self.real_tokens(i) as usize)
                .saturating_sub(1)
                .min(seq_len);
            let (starts, sources) = (self.doc_starts(i), self.doc_sources(i)?);
            let (mut from, mut source) = (0, self.lead_source(i)?);
            for (&start, &next) in starts.iter().zip(sources) {
                let start = (start as usize).min(counted);
                sums.add(source, &row[from.min(start)..start]);
                (from, source) = (start, next);
            }
            sums.add(source, &row[from.min(counted)..counted]);
        }
        Some(sums.entries())
    }

    /// Row `i`'s tokens before its padding (`best_fit`, protocol v4); the whole row otherwise.
    pub fn real_tokens(&self, i: usize) -> u32 {
        self.real_tokens[i]
    }

    /// Row `i`'s labels as a loss takes them: the next token, or `ignore_index` (-100 in torch)
    /// where that is padding.
    pub fn masked_labels(&self, i: usize, ignore_index: i64) -> Vec<i64> {
        masked_labels(self.row(i), self.real_tokens(i), ignore_index)
    }

    /// flash-attention style cumulative sequence lengths over row `i`'s real inputs: `[0, s1, …,
    /// end]`, each `s` a document start inside the inputs, `end` where the inputs' padding begins
    /// (`seq_len` when there is none).
    pub fn cu_seqlens(&self, i: usize) -> Vec<u32> {
        cu_seqlens(
            self.doc_starts(i),
            self.real_tokens(i),
            self.header.window_tokens - 1,
        )
    }

    /// Position ids over row `i`'s inputs, restarting at 0 at each document start; 0 on padding.
    pub fn position_ids(&self, i: usize) -> Vec<u32> {
        position_ids(&self.cu_seqlens(i), self.header.window_tokens - 1)
    }
}

fn slice(t: TokenSlice<'_>, from: usize, to: usize) -> TokenSlice<'_> {
    match t {
        TokenSlice::U16(s) => TokenSlice::U16(&s[from..to]),
        TokenSlice::U32(s) => TokenSlice::U32(&s[from..to]),
    }
}

/// How often a rank that is ahead of the others asks again.
pub const AHEAD_RETRY: Duration = Duration::from_millis(20);
/// How often a rank held by another process is asked for again, and for how long: past the
/// daemon's default owner timeout (10 s), so a trainer gets the rank of one that just died (a
/// trainer started later than a live owner takes the rank at once, protocol v6), while two
/// trainers started with the same `RANK` fail within this.
pub const OWNED_RETRY: Duration = Duration::from_millis(250);
pub const OWNED_PATIENCE: Duration = Duration::from_secs(15);

pub struct Client {
    context: zmq::Context,
    connection: Connection,
    config: ClientConfig,
    /// This rank's data-parallel rank and the data-parallel world: what it asks the daemon for.
    data_parallel: (u32, u32),
    recipe_hash: Option<[u8; 32]>,
    next_step: u64,
    next_request_id: u64,
    /// The stream chain before a step: what that step's reply must start from.
    chain_before: Option<(u64, Hash)>,
    /// Set once a pinned recipe is served as an earlier recipe of the daemon's lineage.
    recipe_note: Option<String>,
    /// Keeps the rank at the daemon between requests; stopped when the client is dropped.
    keepalive: Option<Keepalive>,
}

impl Client {
    /// Connect as the rank given by `RANK`/`WORLD_SIZE`.
    pub fn connect(endpoint: &str) -> Result<Client, ClientError> {
        Client::with_config(ClientConfig::from_env(endpoint)?)
    }

    pub fn with_config(config: ClientConfig) -> Result<Client, ClientError> {
        if config.world_size == 0 || config.rank >= config.world_size {
            return Err(ClientError::Config(format!(
                "rank {} is not below world size {}",
                config.rank, config.world_size
            )));
        }
        let data_parallel = config
            .parallel
            .data_parallel(config.rank, config.world_size)
            .map_err(ClientError::Config)?;
        let recipe_hash = match &config.recipe_hash {
            None => None,
            Some(h) => {
                let bytes = chain::from_hex(h).ok_or_else(|| {
                    ClientError::Config(format!("recipe hash {h:?} is not 64 hex digits"))
                })?;
                Some(bytes)
            }
        };
        let context = zmq::Context::new();
        let connection = Connection::open(&context, &config.endpoint, config.curve.as_ref())?;
        let owner = owner_of(&config);
        let beat = Request {
            kind: RequestKind::Keepalive,
            step: 0,
            request_id: 0,
            ..batch_request(owner, data_parallel, None)
        };
        let keepalive = Keepalive::start(
            &context,
            &config.endpoint,
            config.curve.as_ref(),
            beat.encode(),
        )?;
        Ok(Client {
            context,
            connection,
            config,
            data_parallel,
            recipe_hash,
            next_step: 0,
            next_request_id: 1,
            chain_before: None,
            recipe_note: None,
            keepalive: Some(keepalive),
        })
    }

    /// Leave without releasing the rank and stop keeping it: what the daemon sees of a process
    /// that died (the rank passes once the owner timeout has gone by without a request). For
    /// tests and drills; a trainer that is done drops its client (a clean exit releases).
    pub fn abandon(mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.stop();
        }
        std::mem::forget(self);
    }

    /// `(step, chain)`: the stream chain before `step`, once a step has been received. A trainer
    /// saves it with its checkpoint and gives it back to [`Client::expect_chain`] on resume.
    pub fn stream_chain(&self) -> Option<(u64, Hash)> {
        self.chain_before
    }

    /// A resumed trainer's saved [`Client::stream_chain`]: the reply for `step` must start from
    /// `chain`, else [`ClientError::ChainMismatch`] (the daemon is not continuing this stream).
    pub fn expect_chain(&mut self, step: u64, chain: Hash) {
        self.chain_before = Some((step, chain));
        self.next_step = step;
    }

    /// The rows hash to the chain the reply states, and the step starts where this trainer's
    /// stream stands (the previous step, or the value given to `expect_chain`).
    fn check_chain(&mut self, batch: &ServedBatch) -> Result<(), ClientError> {
        let header = &batch.header;
        let Some(c) = header.chain else {
            return Err(DecodeError::Frames("an ok v2 reply without its chain".into()).into());
        };
        let step = header.step;
        let rows = (0..batch.rows()).map(|i| batch.row_bytes(i));
        let rows_end = chain::extend(&c.rows_start, rows);
        let step_first = step * u64::from(header.world_size) * u64::from(header.micro_batch);
        let last_rank = header.rank + 1 == header.world_size;
        if rows_end != c.rows_end
            || (header.first_window == step_first && c.rows_start != c.step_start)
            || (last_rank && c.rows_end != c.step_end)
        {
            return Err(ClientError::ChainMismatch(format!(
                "rank {}'s rows at step {step} do not hash to the chain the daemon states ({} \
                 from {}, the rows give {}): the bytes changed between the daemon and this rank",
                header.rank,
                chain::to_hex(&c.rows_end),
                chain::to_hex(&c.rows_start),
                chain::to_hex(&rows_end)
            )));
        }
        if let Some((expected_step, expected)) = self.chain_before
            && expected_step == step
            && expected != c.step_start
        {
            return Err(ClientError::ChainMismatch(chain_break(step, &expected, &c)));
        }
        self.chain_before = Some((step + 1, c.step_end));
        Ok(())
    }

    /// Once this trainer's pinned recipe ([`ClientConfig::recipe_hash`]) is served as an earlier
    /// recipe of the daemon's lineage (the daemon changed course from it; any other recipe is
    /// refused, [`ClientError::RecipeMismatch`]): what it is served, in words.
    pub fn recipe_note(&self) -> Option<&str> {
        self.recipe_note.as_deref()
    }

    /// Note a pinned recipe that the daemon serves as an earlier recipe of its lineage.
    fn note_pinned_recipe(&mut self, batch: &ServedBatch) {
        let Some(pinned) = self.recipe_hash else {
            return;
        };
        if pinned == batch.header.recipe_hash || self.recipe_note.is_some() {
            return;
        }
        let mut note = format!(
            "recipe {} this trainer pinned is an earlier recipe of the stream's lineage: the \
             daemon changed course to recipe {} and serves the trainer that stream",
            chain::to_hex(&pinned),
            chain::to_hex(&batch.header.recipe_hash)
        );
        if let Some(s) = batch.header.segment {
            note += &format!(
                "; step {} is segment {}'s (recipe {})",
                batch.step(),
                s.index,
                chain::to_hex(&s.recipe_hash)
            );
        }
        self.recipe_note = Some(note);
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// (data-parallel rank, data-parallel world size): the rank and world size the daemon sees.
    /// Report this rank's loss per source for `step` (protocol v7; [`ServedBatch::per_source_loss`]
    /// makes `entries`): what `[mix.adaptive]` decides from, and what the daemon's `/metrics`
    /// show per source. Never waits: the report is queued on the socket and the daemon does not
    /// answer it. Returns whether it was sent: only one rank of a model-parallel group reports
    /// ([`Parallelism::reports_loss`]: the last pipeline stage, tensor rank 0), the others and a
    /// full queue send nothing.
    pub fn report(&mut self, step: u64, entries: &[SourceLoss]) -> Result<bool, ClientError> {
        let reports = (self.config.parallel)
            .reports_loss(self.config.rank, self.config.world_size)
            .map_err(ClientError::Config)?;
        if !reports {
            return Ok(false);
        }
        if entries.len() > MAX_REPORT_ENTRIES {
            return Err(ClientError::Config(format!(
                "a loss report holds at most {MAX_REPORT_ENTRIES} sources, got {}",
                entries.len()
            )));
        }
        let request = Request {
            kind: RequestKind::Report,
            request_id: self.next_request_id,
            step,
            ..batch_request(self.owner(), self.data_parallel, self.recipe_hash)
        };
        self.next_request_id += 1;
        let frames = [request.encode(), encode_report(entries)];
        Ok(self
            .connection
            .socket
            .send_multipart(frames, zmq::DONTWAIT)
            .is_ok())
    }

    pub fn data_parallel(&self) -> (u32, u32) {
        self.data_parallel
    }

    /// The step `next_batch` asks for next.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// The next step's batch, or `None` once the stream has ended (every rank ends at the same step).
    pub fn next_batch(&mut self) -> Result<Option<ServedBatch>, ClientError> {
        self.batch_at(self.next_step)
    }

    /// The batch of `step`; `next_batch` continues after it.
    ///
    /// A step further ahead than the daemon's prefetch window (other ranks are slower) is asked
    /// for again every [`AHEAD_RETRY`] until `timeout × attempts` has passed: in data-parallel
    /// training the slower ranks catch up; only then is [`ClientError::StepAhead`] returned. A
    /// rank another process holds is asked for again every [`OWNED_RETRY`] for up to
    /// [`OWNED_PATIENCE`] (the old owner's process may have died: the rank passes once it has
    /// been silent for the daemon's owner timeout, 10 s unless set); then
    /// [`ClientError::RankOwned`]. A rank a later process holds is
    /// [`ClientError::Superseded`] at once.
    pub fn batch_at(&mut self, step: u64) -> Result<Option<ServedBatch>, ClientError> {
        let patience = self.config.timeout * self.config.attempts.max(1);
        let started = Instant::now();
        loop {
            match self.request(step) {
                Err(ClientError::StepAhead(_)) if started.elapsed() < patience => {
                    std::thread::sleep(AHEAD_RETRY)
                }
                Err(ClientError::RankOwned(_))
                    if started.elapsed() < patience.min(OWNED_PATIENCE) =>
                {
                    std::thread::sleep(OWNED_RETRY)
                }
                other => return other,
            }
        }
    }

    /// This trainer process at the daemon: its global rank and session (batches and release).
    fn owner(&self) -> Owner {
        owner_of(&self.config)
    }

    fn request(&mut self, step: u64) -> Result<Option<ServedBatch>, ClientError> {
        let started = Instant::now();
        let mut handshake_seen = false;
        for attempt in 1..=self.config.attempts.max(1) {
            let request_id = self.next_request_id;
            self.next_request_id += 1;
            let request = Request {
                request_id,
                step,
                ..batch_request(self.owner(), self.data_parallel, self.recipe_hash)
            };
            self.connection.socket.send(&request.encode()[..], 0)?;
            let reply = self.wait_reply(request_id)?;
            handshake_seen |= self.connection.handshake_succeeded();
            if let Some(reply) = reply {
                let batch = reply?;
                if let Some(batch) = &batch {
                    self.check_chain(batch)?;
                    self.note_pinned_recipe(batch);
                }
                self.next_step = step + 1;
                return Ok(batch);
            }
            // No reply in time: the daemon may have restarted; a new socket drops stale replies.
            if attempt < self.config.attempts {
                self.connection = Connection::open(
                    &self.context,
                    &self.config.endpoint,
                    self.config.curve.as_ref(),
                )?;
            }
        }
        if self.config.curve.is_some() && !handshake_seen {
            return Err(ClientError::Unauthorized(format!(
                "no reply from the daemon at {} after {:?} ({} attempts) and no CURVE handshake \
                 completed: the daemon may have refused this client's CURVE key, or is not \
                 running; check {SERVER_KEY_ENV} / {CLIENT_KEY_ENV}",
                self.config.endpoint,
                started.elapsed(),
                self.config.attempts.max(1)
            )));
        }
        Err(ClientError::DaemonGone {
            endpoint: self.config.endpoint.clone(),
            waited: started.elapsed(),
            attempts: self.config.attempts.max(1),
        })
    }

    /// Wait for the reply to `request_id`: `None` on timeout.
    #[allow(clippy::type_complexity)]
    fn wait_reply(
        &mut self,
        request_id: u64,
    ) -> Result<Option<Result<Option<ServedBatch>, ClientError>>, ClientError> {
        let deadline = Instant::now() + self.config.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            if !self.connection.wait_readable(left)? {
                continue; // a handshake event, or the deadline: looked at again above
            }
            let socket = &self.connection.socket;
            let mut frames = Vec::with_capacity(3);
            loop {
                frames.push(socket.recv_msg(0)?);
                if !socket.get_rcvmore()? {
                    break;
                }
            }
            let header = ReplyHeader::decode(&frames[0])?;
            if header.request_id != request_id {
                continue; // a late reply to a request we gave up on
            }
            return Ok(Some(self.batch_from_reply(header, frames)));
        }
    }

    fn batch_from_reply(
        &self,
        header: ReplyHeader,
        mut frames: Vec<zmq::Message>,
    ) -> Result<Option<ServedBatch>, ClientError> {
        let message = || {
            frames
                .get(1)
                .map(|m| String::from_utf8_lossy(m).into_owned())
                .unwrap_or_default()
        };
        match header.status {
            Status::Ok => {}
            Status::EndOfData => return Ok(None),
            Status::UnsupportedVersion => return Err(ClientError::UnsupportedVersion(message())),
            Status::RecipeMismatch => return Err(ClientError::RecipeMismatch(message())),
            Status::LayoutMismatch => return Err(ClientError::LayoutMismatch(message())),
            Status::StepGone => return Err(ClientError::StepGone(message())),
            Status::StepAhead => return Err(ClientError::StepAhead(message())),
            Status::Malformed => return Err(ClientError::Malformed(message())),
            Status::DaemonFailed => return Err(ClientError::DaemonFailed(message())),
            Status::ShuttingDown => return Err(ClientError::ShuttingDown),
            Status::RankOwned => return Err(ClientError::RankOwned(message())),
            Status::Superseded => return Err(ClientError::Superseded(message())),
        }
        let expected = ok_reply_frames(header.version);
        if frames.len() != expected {
            return Err(DecodeError::Frames(format!(
                "an ok reply of version {} has {expected} frames, got {}",
                header.version,
                frames.len()
            ))
            .into());
        }
        let real_tokens = (expected >= 5).then(|| frames.pop().expect("5 frames"));
        let sources = (expected >= 4).then(|| frames.pop().expect("4 frames"));
        let docs = frames.pop().expect("3 frames");
        let tokens = frames.pop().expect("3 frames");
        if tokens.len() != header.payload_bytes() {
            return Err(DecodeError::Frames(format!(
                "token frame is {} bytes, the header says {}",
                tokens.len(),
                header.payload_bytes()
            ))
            .into());
        }
        let (doc_offsets, doc_starts) =
            decode_doc_starts(&docs, header.micro_batch as usize, header.window_tokens)?;
        let sources = match sources {
            Some(frame) => Some(decode_doc_sources(
                &frame,
                header.micro_batch as usize,
                doc_starts.len(),
            )?),
            None => None,
        };
        let real_tokens = match real_tokens {
            Some(frame) => {
                decode_real_tokens(&frame, header.micro_batch as usize, header.window_tokens)?
            }
            None => vec![header.window_tokens; header.micro_batch as usize],
        };
        let payload = if (tokens.as_ptr() as usize).is_multiple_of(4) {
            Payload::Frame(tokens)
        } else {
            let mut words = vec![0u32; tokens.len().div_ceil(4)];
            bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..tokens.len()]
                .copy_from_slice(&tokens);
            Payload::Copied(words)
        };
        Ok(Some(ServedBatch {
            header,
            payload,
            doc_offsets,
            doc_starts,
            sources,
            real_tokens,
        }))
    }
}

/// The message for a step that does not continue this trainer's stream.
fn chain_break(step: u64, expected: &Hash, c: &ReplyChain) -> String {
    format!(
        "the stream this trainer consumed stands at {} before step {step}, the daemon's step \
         {step} starts from {}: the daemon is not continuing the same stream (other inputs, \
         another --state-dir, or a resume that went wrong); nothing from it was used",
        chain::to_hex(expected),
        chain::to_hex(&c.step_start)
    )
}

/// The owner `config` asks as: its global rank, its session, the process's start time.
fn owner_of(config: &ClientConfig) -> Owner {
    Owner {
        global_rank: config.rank,
        session: config.session.unwrap_or_else(process_session),
        started: process_session_started(),
    }
}

/// A batch request of `owner` for its data-parallel rank at step 0 (request id 0).
fn batch_request(
    owner: Owner,
    data_parallel: (u32, u32),
    recipe_hash: Option<[u8; 32]>,
) -> Request {
    Request {
        version: PROTOCOL_VERSION,
        kind: RequestKind::Batch,
        request_id: 0,
        rank: data_parallel.0,
        world_size: data_parallel.1,
        step: 0,
        recipe_hash,
        owner: Some(owner),
    }
}

impl Drop for Client {
    /// A clean exit stops the keepalive and releases the rank at the daemon (protocol v3), so a
    /// next trainer process may take it at once; best effort, never waits on the daemon.
    fn drop(&mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.stop();
        }
        let release = Request {
            kind: RequestKind::Release,
            ..batch_request(self.owner(), self.data_parallel, None)
        };
        let socket = &self.connection.socket;
        let _ = socket.set_linger(100);
        let _ = socket.send(&release.encode()[..], zmq::DONTWAIT);
    }
}
