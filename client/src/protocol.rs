//! Wire protocol v7 between the daemon and trainer ranks (documented frame by frame in
//! PROTOCOL.md), and v1 to v5, which the daemon still answers byte for byte as before (a daemon
//! whose windows end in padding, `best_fit`, refuses v1 to v3: their clients would train on the
//! padding). v5's header adds the lineage segment that produced the step ([`ReplySegment`]); v6's
//! request adds the session's start time ([`Owner::started`]) and the keepalive kind, by which a
//! rank stays its session's whatever the time between steps. One implementation, used by both
//! sides.
//!
//! Transport: the daemon binds a ZeroMQ ROUTER socket; each rank connects a DEALER. A request is
//! one frame (64 bytes in v1 and v2, 80 in v3 to v5, 88 in v6); a reply is a header frame (96 bytes in v1; 224 in v2, which adds the stream
//! chain around the rank's rows and the step, see `chain`; 256 in v5, which adds the producing
//! segment's recipe hash) followed by the token payload, the
//! document-boundary frame, from v3 the document-source frame and in v4 the real-token frame
//! (ok), or by one UTF-8 message
//! frame (error). A reply speaks the
//! request's version. All integers are little-endian. Decoding never panics: every malformed
//! input is a typed error.

use crate::chain::Hash;

/// The version clients send: 3 adds the document-source frame to ok replies, 4 the real-token
/// frame (each row's tokens before its padding), 5 the lineage segment in the header, 6 the
/// session's start time and the keepalive, 7 the per-source loss report ([`report`]).
pub const PROTOCOL_VERSION: u16 = 7;
/// The oldest version that may send a loss report.
pub const REPORT_VERSION: u16 = 7;
/// The oldest version whose requests carry the session's start time, and may be keepalives.
pub const STARTED_VERSION: u16 = 6;
/// The oldest version whose header names the lineage segment that produced the step.
pub const SEGMENT_VERSION: u16 = 5;
/// The oldest version that knows padding: a daemon that pads refuses older requests.
pub const PADDING_VERSION: u16 = 4;
/// The oldest version the daemon still answers (in that version).
pub const OLDEST_VERSION: u16 = 1;
pub const REQUEST_MAGIC: [u8; 4] = *b"DSPQ";
pub const REPLY_MAGIC: [u8; 4] = *b"DSPR";
/// A request of versions 1 and 2.
pub const REQUEST_LEN: usize = 64;
/// A version 3 request: v2's, then the trainer process's global rank and session ([`Owner`]).
pub const REQUEST_V3_LEN: usize = REQUEST_LEN + 16;
/// A version 6 request: v3's, then the session's start time ([`Owner::started`]).
pub const REQUEST_V6_LEN: usize = REQUEST_V3_LEN + 8;

/// The length of a request in `version`.
pub fn request_len(version: u16) -> usize {
    match version {
        STARTED_VERSION.. => REQUEST_V6_LEN,
        3.. => REQUEST_V3_LEN,
        _ => REQUEST_LEN,
    }
}
/// A version 1 reply header.
pub const REPLY_HEADER_V1_LEN: usize = 96;
/// A version 2 (to 4) reply header: v1's, then four chain values.
pub const REPLY_HEADER_LEN: usize = REPLY_HEADER_V1_LEN + 4 * 32;
/// A version 5 reply header: v4's, then the producing segment's recipe hash.
pub const REPLY_HEADER_V5_LEN: usize = REPLY_HEADER_LEN + 32;

/// The length of a reply header in `version`.
pub fn reply_header_len(version: u16) -> usize {
    match version {
        1 => REPLY_HEADER_V1_LEN,
        v if v < SEGMENT_VERSION => REPLY_HEADER_LEN,
        _ => REPLY_HEADER_V5_LEN,
    }
}

/// The frames of an ok reply in `version`: header, tokens, document starts, from v3 on the
/// document sources, and from v4 on the real-token counts.
pub fn ok_reply_frames(version: u16) -> usize {
    match version {
        ..=2 => 3,
        3 => 4,
        _ => 5,
    }
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// The batch of `rank` at `step`.
    Batch = 1,
    /// Version 3: the trainer process is done with its rank (a clean exit): another process may
    /// take it at once. No reply.
    Release = 2,
    /// Version 6: the trainer process is alive and keeps its rank, however long its step takes.
    /// Sent by the clients' keepalive thread every [`KEEPALIVE_INTERVAL`]; it only keeps a rank
    /// the session owns (it never claims one), and is never answered.
    Keepalive = 3,
    /// Version 7: the rank's per-source loss for a step it trained on, in a second frame
    /// ([`report::encode_report`]). Never answered.
    Report = 4,
}

/// How often the clients send a keepalive (v6) for their rank: a quarter of the shortest owner
/// timeout the daemon accepts (`serve --owner-timeout 1`), so three in a row may be lost.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// [`PROTOCOL_VERSION`], or [`OLDEST_VERSION`] from an old client: the reply speaks it.
    pub version: u16,
    pub kind: RequestKind,
    /// Echoed in the reply, so a client can drop late replies to requests it gave up on.
    pub request_id: u64,
    pub rank: u32,
    pub world_size: u32,
    pub step: u64,
    /// The recipe hash the trainer expects, or `None` to accept the daemon's.
    pub recipe_hash: Option<[u8; 32]>,
    /// Version 3: the trainer process that asks (`None` in older versions, and on the wire a
    /// session of 0). A global rank belongs to the session that first asks for it: see
    /// PROTOCOL.md "One owner per rank".
    pub owner: Option<Owner>,
}

/// Who asks: the trainer process's global rank (`RANK`), and a random session id (never 0) shared
/// by that process and its DataLoader workers, new each time a trainer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub global_rank: u32,
    pub session: u64,
    /// Version 6: when the session was made, in nanoseconds since the Unix epoch (0: not sent,
    /// versions 3 to 5). A later session takes the rank over at once; an earlier one is refused
    /// ([`Status::Superseded`]): PROTOCOL.md "One owner per rank".
    pub started: u64,
}

/// Reply status codes (the `status` field of the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    /// The stream has ended: `step` is past the last step (the same for every rank).
    EndOfData = 1,
    UnsupportedVersion = 10,
    RecipeMismatch = 11,
    /// Rank or world size does not match the daemon's layout.
    LayoutMismatch = 12,
    /// The step is older than every step the daemon still holds.
    StepGone = 13,
    /// The step is further ahead than the daemon will produce before slower ranks move on.
    StepAhead = 14,
    Malformed = 15,
    /// The daemon's pipeline failed (bad input); the message says why.
    DaemonFailed = 16,
    ShuttingDown = 17,
    /// The global rank belongs to another trainer process (session) that asked recently.
    RankOwned = 18,
    /// Version 6: the global rank belongs to a session that started later: this process belongs
    /// to a job that was replaced, and should exit.
    Superseded = 19,
}

impl Status {
    pub fn from_u16(code: u16) -> Option<Status> {
        use Status::*;
        [
            Ok,
            EndOfData,
            UnsupportedVersion,
            RecipeMismatch,
            LayoutMismatch,
            StepGone,
            StepAhead,
            Malformed,
            DaemonFailed,
            ShuttingDown,
            RankOwned,
            Superseded,
        ]
        .into_iter()
        .find(|s| *s as u16 == code)
    }

    pub fn is_error(self) -> bool {
        !matches!(self, Status::Ok | Status::EndOfData)
    }
}

/// The stream chain (`crate::chain`) around an ok reply's rows, in version 2: what a client
/// checks its rows against, and what links one step to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyChain {
    /// Before the step's first window (`step × world_size × micro_batch`).
    pub step_start: Hash,
    /// Before this rank's first row (`first_window`).
    pub rows_start: Hash,
    /// After this rank's last row: `rows_start` extended by the rows' bytes.
    pub rows_end: Hash,
    /// After the step's last window: the next step's `step_start`.
    pub step_end: Hash,
}

/// Which recipe of the stream's lineage produced an ok reply's step, in version 5: a change of
/// course takes over at a step boundary, so every window of a step is one segment's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplySegment {
    /// The segment's index in the lineage (`lineage.json`; 0: the stream's first recipe).
    pub index: u32,
    /// Its recipe's hash (the header's `recipe_hash` is the daemon's, the lineage's newest).
    pub recipe_hash: [u8; 32],
}

/// The first frame of every reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    /// The request's version: 1 to 5.
    pub version: u16,
    pub status: Status,
    pub request_id: u64,
    pub step: u64,
    pub rank: u32,
    pub world_size: u32,
    pub micro_batch: u32,
    /// `seq_len + 1`
    pub window_tokens: u32,
    /// Bytes per token id: 2 (`u16`) or 4 (`u32`).
    pub dtype_bytes: u8,
    pub recipe_hash: [u8; 32],
    /// Steps every rank gets in total, once known (end of data reached), else `u64::MAX`.
    pub num_steps: u64,
    /// Index of the first window of this rank's rows in the whole stream.
    pub first_window: u64,
    /// Version 2 ok replies: the stream chain around the rows and the step.
    pub chain: Option<ReplyChain>,
    /// Version 5 ok replies: the lineage segment that produced the step.
    pub segment: Option<ReplySegment>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message is {len} bytes, expected {expected}")]
    Length { len: usize, expected: usize },
    #[error("bad magic bytes {found:02x?}")]
    Magic { found: [u8; 4] },
    #[error(
        "protocol version {found} is not supported (this side speaks versions \
         {OLDEST_VERSION} to {PROTOCOL_VERSION})"
    )]
    Version { found: u16 },
    #[error("unknown request kind {0}")]
    Kind(u16),
    #[error("unknown status {0}")]
    Status(u16),
    #[error("dtype of {0} bytes per token is not 2 or 4")]
    Dtype(u8),
    #[error("{0}")]
    Frames(String),
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.at..self.at + N]); // callers check the length first
        self.at += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Check a frame's magic, version and length (`expected` for its version); returns the version
/// and a reader after it.
fn check_frame(
    bytes: &[u8],
    expected: fn(u16) -> usize,
    magic: [u8; 4],
) -> Result<(u16, Reader<'_>), DecodeError> {
    if bytes.len() < 6 {
        return Err(DecodeError::Length {
            len: bytes.len(),
            expected: expected(PROTOCOL_VERSION),
        });
    }
    let mut r = Reader { bytes, at: 0 };
    let found = r.take::<4>();
    if found != magic {
        return Err(DecodeError::Magic { found });
    }
    let version = r.u16();
    if !(OLDEST_VERSION..=PROTOCOL_VERSION).contains(&version) {
        return Err(DecodeError::Version { found: version });
    }
    if bytes.len() != expected(version) {
        return Err(DecodeError::Length {
            len: bytes.len(),
            expected: expected(version),
        });
    }
    Ok((version, r))
}

impl Request {
    /// The request frame in its version (an owner is sent from version 3 on).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; request_len(self.version)];
        out[0..4].copy_from_slice(&REQUEST_MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.rank.to_le_bytes());
        out[20..24].copy_from_slice(&self.world_size.to_le_bytes());
        out[24..32].copy_from_slice(&self.step.to_le_bytes());
        out[32..64].copy_from_slice(&self.recipe_hash.unwrap_or([0; 32]));
        if let (3.., Some(owner)) = (self.version, self.owner) {
            out[64..68].copy_from_slice(&owner.global_rank.to_le_bytes());
            // 68..72 reserved (zero)
            out[72..80].copy_from_slice(&owner.session.to_le_bytes());
            if self.version >= STARTED_VERSION {
                out[80..88].copy_from_slice(&owner.started.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
        let (version, mut r) = check_frame(bytes, request_len, REQUEST_MAGIC)?;
        let kind = match r.u16() {
            1 => RequestKind::Batch,
            2 if version >= 3 => RequestKind::Release,
            3 if version >= STARTED_VERSION => RequestKind::Keepalive,
            4 if version >= REPORT_VERSION => RequestKind::Report,
            other => return Err(DecodeError::Kind(other)),
        };
        let request_id = r.u64();
        let rank = r.u32();
        let world_size = r.u32();
        let step = r.u64();
        let hash = r.take::<32>();
        let recipe_hash = (hash != [0; 32]).then_some(hash);
        let owner = match version {
            3.. => {
                let global_rank = r.u32();
                let _reserved = r.u32();
                let session = r.u64();
                let started = if version >= STARTED_VERSION {
                    r.u64()
                } else {
                    0
                };
                (session != 0).then_some(Owner {
                    global_rank,
                    session,
                    started,
                })
            }
            _ => None,
        };
        Ok(Request {
            version,
            kind,
            request_id,
            rank,
            world_size,
            step,
            recipe_hash,
            owner,
        })
    }

    /// The request id of a frame that may be malformed, when it is long enough to hold one: error
    /// replies echo it so the client can match them.
    pub fn salvage_request_id(bytes: &[u8]) -> u64 {
        bytes
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0)
    }
}

impl ReplyHeader {
    /// The header frame in the header's version (a v1 header has no chain).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; reply_header_len(self.version)];
        out[0..4].copy_from_slice(&REPLY_MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&(self.status as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.step.to_le_bytes());
        out[24..28].copy_from_slice(&self.rank.to_le_bytes());
        out[28..32].copy_from_slice(&self.world_size.to_le_bytes());
        out[32..36].copy_from_slice(&self.micro_batch.to_le_bytes());
        out[36..40].copy_from_slice(&self.window_tokens.to_le_bytes());
        out[40] = self.dtype_bytes;
        // 41..44 reserved (zero); 44..48 the segment's index from v5 on (else zero)
        out[48..80].copy_from_slice(&self.recipe_hash);
        out[80..88].copy_from_slice(&self.num_steps.to_le_bytes());
        out[88..96].copy_from_slice(&self.first_window.to_le_bytes());
        if let (2.., Some(c)) = (self.version, &self.chain) {
            out[96..128].copy_from_slice(&c.step_start);
            out[128..160].copy_from_slice(&c.rows_start);
            out[160..192].copy_from_slice(&c.rows_end);
            out[192..224].copy_from_slice(&c.step_end);
        }
        if let (SEGMENT_VERSION.., Some(s)) = (self.version, &self.segment) {
            out[44..48].copy_from_slice(&s.index.to_le_bytes());
            out[224..256].copy_from_slice(&s.recipe_hash);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ReplyHeader, DecodeError> {
        let (version, mut r) = check_frame(bytes, reply_header_len, REPLY_MAGIC)?;
        let code = r.u16();
        let status = Status::from_u16(code).ok_or(DecodeError::Status(code))?;
        let request_id = r.u64();
        let step = r.u64();
        let rank = r.u32();
        let world_size = r.u32();
        let micro_batch = r.u32();
        let window_tokens = r.u32();
        let dtype_bytes = r.u8();
        if status == Status::Ok && dtype_bytes != 2 && dtype_bytes != 4 {
            return Err(DecodeError::Dtype(dtype_bytes));
        }
        r.take::<3>();
        let segment_index = r.u32();
        let recipe_hash = r.take::<32>();
        let num_steps = r.u64();
        let first_window = r.u64();
        let chain = (version >= 2 && status == Status::Ok).then(|| ReplyChain {
            step_start: r.take(),
            rows_start: r.take(),
            rows_end: r.take(),
            step_end: r.take(),
        });
        let segment = (version >= SEGMENT_VERSION && status == Status::Ok).then(|| ReplySegment {
            index: segment_index,
            recipe_hash: r.take(),
        });
        Ok(ReplyHeader {
            version,
            status,
            request_id,
            step,
            rank,
            world_size,
            micro_batch,
            window_tokens,
            dtype_bytes,
            recipe_hash,
            num_steps,
            first_window,
            chain,
            segment,
        })
    }

    /// Bytes the token payload frame of an ok reply must have.
    pub fn payload_bytes(&self) -> usize {
        self.micro_batch as usize * self.window_tokens as usize * self.dtype_bytes as usize
    }
}

/// The document-boundary frame of an ok reply: `micro_batch + 1` little-endian `u32` offsets, then
/// the starts; row `i`'s document starts are `starts[offsets[i]..offsets[i + 1]]`.
pub fn encode_doc_starts(rows: &[&[u32]]) -> Vec<u8> {
    let total: usize = rows.iter().map(|r| r.len()).sum();
    let mut out = Vec::with_capacity(4 * (rows.len() + 1 + total));
    let mut at = 0u32;
    out.extend(at.to_le_bytes());
    for row in rows {
        at += row.len() as u32;
        out.extend(at.to_le_bytes());
    }
    for row in rows {
        out.extend(row.iter().flat_map(|s| s.to_le_bytes()));
    }
    out
}

/// Decode and check a document-boundary frame for `rows` rows of `window_tokens` tokens.
pub fn decode_doc_starts(
    bytes: &[u8],
    rows: usize,
    window_tokens: u32,
) -> Result<(Vec<u32>, Vec<u32>), DecodeError> {
    let bad = |m: &str| DecodeError::Frames(format!("document-boundary frame: {m}"));
    if !bytes.len().is_multiple_of(4) || bytes.len() < 4 * (rows + 1) {
        return Err(bad("too short or not whole u32s"));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (offsets, starts) = words.split_at(rows + 1);
    if offsets[0] != 0
        || offsets.windows(2).any(|w| w[0] > w[1])
        || offsets[rows] as usize != starts.len()
    {
        return Err(bad("offsets are not a valid index of the starts"));
    }
    for i in 0..rows {
        let row = &starts[offsets[i] as usize..offsets[i + 1] as usize];
        if row.windows(2).any(|w| w[0] >= w[1]) || row.iter().any(|&s| s >= window_tokens) {
            return Err(bad(&format!(
                "row {i}'s starts are not increasing offsets inside the window"
            )));
        }
    }
    Ok((offsets.to_vec(), starts.to_vec()))
}

/// The document-source frame of a v3 ok reply: per row the source of the document that holds
/// its first token (`u16`), then the source of every document start, in the order of the
/// document-boundary frame (`u16` each).
pub fn encode_doc_sources(leads: &[u16], rows: &[&[u16]]) -> Vec<u8> {
    let total: usize = rows.iter().map(|r| r.len()).sum();
    let mut out = Vec::with_capacity(2 * (leads.len() + total));
    out.extend(leads.iter().flat_map(|s| s.to_le_bytes()));
    for row in rows {
        out.extend(row.iter().flat_map(|s| s.to_le_bytes()));
    }
    out
}

/// Decode a document-source frame for `rows` rows holding `starts` document starts in all:
/// (lead source per row, source per start).
pub fn decode_doc_sources(
    bytes: &[u8],
    rows: usize,
    starts: usize,
) -> Result<(Vec<u16>, Vec<u16>), DecodeError> {
    if bytes.len() != 2 * (rows + starts) {
        return Err(DecodeError::Frames(format!(
            "document-source frame: {} bytes, {rows} rows with {starts} document starts need {}",
            bytes.len(),
            2 * (rows + starts)
        )));
    }
    let mut all: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let sources = all.split_off(rows);
    Ok((all, sources))
}

/// The real-token frame of a v4 ok reply: per row, the tokens before its padding (`u32`; the
/// whole window when the daemon does not pad).
pub fn encode_real_tokens(rows: &[u32]) -> Vec<u8> {
    rows.iter().flat_map(|n| n.to_le_bytes()).collect()
}

/// Decode and check a real-token frame for `rows` rows of `window_tokens` tokens: each row holds
/// 1 to `window_tokens` real tokens.
pub fn decode_real_tokens(
    bytes: &[u8],
    rows: usize,
    window_tokens: u32,
) -> Result<Vec<u32>, DecodeError> {
    if bytes.len() != 4 * rows {
        return Err(DecodeError::Frames(format!(
            "real-token frame: {} bytes, {rows} rows need {}",
            bytes.len(),
            4 * rows
        )));
    }
    let counts: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if let Some(bad) = counts.iter().find(|&&n| n == 0 || n > window_tokens) {
        return Err(DecodeError::Frames(format!(
            "real-token frame: a row of {window_tokens} tokens cannot hold {bad} real tokens"
        )));
    }
    Ok(counts)
}

pub mod report;
#[cfg(test)]
mod tests;
