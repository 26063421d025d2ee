"""Wire protocol v7 between `dsprep serve` and a trainer rank, frame by frame as PROTOCOL.md
describes it (the Rust side is client/src/protocol.rs). Encoding and decoding only: no sockets.

A request is one frame (64 bytes in v1 and v2, 80 in v3 to v5, 88 in v6, which adds the
session's start time; a v6 keepalive keeps the rank between steps and is never answered). A reply is a header (224 bytes from
v2: v1's 96, then the stream chain around the rank's rows and the step; a reply speaks the
request's version; 256 in v5, which adds the lineage segment that produced the step), then the
token frame, the document-boundary frame, (v3) the document-source
frame and (v4) the real-token frame (ok), nothing (end of data) or one UTF-8 message (an error
status, raised as its exception class). Token, boundary, source and real-token frames become
numpy views without a copy. A daemon whose windows end in padding (`best_fit`) refuses requests
older than v4, whose clients would train on the padding.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .batch import Batch
from .errors import STATUS_ERRORS, ProtocolError, UnsupportedVersion

#: The version this client sends: 3 adds the document-source frame, 4 the real-token frame, 5
#: the lineage segment in the header, 6 the session's start time and the keepalive, 7 the loss
#: report.
PROTOCOL_VERSION = 7
#: The oldest version that may send a loss report (`KIND_REPORT`).
REPORT_VERSION = 7
#: The oldest version whose requests carry the session's start time, and may be keepalives.
STARTED_VERSION = 6
#: The oldest version whose header names the lineage segment that produced the step.
SEGMENT_VERSION = 5
#: The oldest version the daemon answers.
OLDEST_VERSION = 1
REQUEST_MAGIC = b"DSPQ"
REPLY_MAGIC = b"DSPR"
REQUEST_LEN = 64
REPLY_HEADER_V1_LEN = 96
REPLY_HEADER_LEN = REPLY_HEADER_V1_LEN + 4 * 32
#: Version 5: v4's header, then the producing segment's recipe hash.
REPLY_HEADER_V5_LEN = REPLY_HEADER_LEN + 32
KIND_BATCH = 1
#: Version 3: the trainer process is done with its rank (no reply).
KIND_RELEASE = 2
#: Version 6: the trainer process is alive and keeps its rank (never answered; it claims nothing).
KIND_KEEPALIVE = 3
#: Version 7: the rank's loss per source for a step it trained on, in a second frame
#: (`encode_report`); never answered.
KIND_REPORT = 4
#: A report entry: u32 source, u32 reserved (zero), f64 summed loss, u64 counted tokens.
_REPORT_ENTRY = struct.Struct("<IIdQ")
#: The most entries one report holds (its frame stays within the daemon's 4096-byte limit).
MAX_REPORT_ENTRIES = 4096 // _REPORT_ENTRY.size
#: How often the client's keepalive thread sends one (seconds): a quarter of the shortest owner
#: timeout the daemon accepts (`serve --owner-timeout 1`).
KEEPALIVE_INTERVAL_S = 0.25
#: A request from version 3 on: v2's 64 bytes, then the owner's global rank, 4 reserved bytes, session.
REQUEST_V3_LEN = 80
#: Version 6: v3's, then the session's start time (u64 nanoseconds since the Unix epoch).
REQUEST_V6_LEN = 88
STATUS_OK = 0
STATUS_END_OF_DATA = 1
#: `num_steps` while the end of the data is not known yet.
UNKNOWN_STEPS = 2**64 - 1

_REQUEST = struct.Struct("<4sHHQIIQ32s")
_OWNER = struct.Struct("<IIQ")
_STARTED = struct.Struct("<Q")
_HEADER = struct.Struct("<4sHHQQIIIIB3sI32sQQ")
_CHAIN = struct.Struct("<32s32s32s32s")
assert _REQUEST.size == REQUEST_LEN and _HEADER.size == REPLY_HEADER_V1_LEN
assert _REQUEST.size + _OWNER.size == REQUEST_V3_LEN
assert REQUEST_V3_LEN + _STARTED.size == REQUEST_V6_LEN
assert _HEADER.size + _CHAIN.size == REPLY_HEADER_LEN


class ReplyChain(NamedTuple):
    """The stream chain around an ok v2 reply's rows (PROTOCOL.md, "Reply")."""

    step_start: bytes
    rows_start: bytes
    rows_end: bytes
    step_end: bytes


class ReplyHeader(NamedTuple):
    """The first frame of every reply (PROTOCOL.md, "Reply")."""

    status: int
    request_id: int
    step: int
    rank: int
    world_size: int
    micro_batch: int
    window_tokens: int
    dtype_bytes: int
    recipe_hash: bytes
    num_steps: int
    first_window: int
    version: int = PROTOCOL_VERSION
    #: Version 2 ok replies: the stream chain around the rows and the step.
    chain: Optional[ReplyChain] = None
    #: Version 5 ok replies: (index in the lineage, its recipe hash) of the segment whose recipe
    #: produced the step.
    segment: Optional[Tuple[int, bytes]] = None

    def payload_bytes(self) -> int:
        return self.micro_batch * self.window_tokens * self.dtype_bytes


def encode_request(
    request_id: int,
    rank: int,
    world_size: int,
    step: int,
    recipe_hash: Optional[bytes] = None,
    version: int = PROTOCOL_VERSION,
    owner: Optional[Tuple[int, ...]] = None,
    kind: int = KIND_BATCH,
) -> bytes:
    """One request (a batch, from v3 a release, from v6 a keepalive); `recipe_hash` (32 bytes) or
    None to accept the daemon's recipe; `owner` = (global rank, session[, start time in ns since
    the Unix epoch]) from v3 on (session 0: no owner; the start time is sent from v6 on, 0 if not
    given)."""
    expected = recipe_hash if recipe_hash is not None else bytes(32)
    if len(expected) != 32:
        raise ValueError(f"a recipe hash is 32 bytes, got {len(expected)}")
    frame = _REQUEST.pack(REQUEST_MAGIC, version, kind, request_id, rank, world_size, step, expected)
    if version >= 3:
        global_rank, session, started = (tuple(owner) + (0,))[:3] if owner is not None else (0, 0, 0)
        frame += _OWNER.pack(global_rank, 0, session)
        if version >= STARTED_VERSION:
            frame += _STARTED.pack(started)
    return frame


def encode_report(entries: Sequence[Tuple[int, float, int]]) -> bytes:
    """A loss report's second frame (PROTOCOL.md "Loss reports"): per source, (source index,
    summed loss, counted tokens), each source once."""
    if len(entries) > MAX_REPORT_ENTRIES:
        raise ValueError(f"a loss report holds at most {MAX_REPORT_ENTRIES} sources, got {len(entries)}")
    return b"".join(_REPORT_ENTRY.pack(int(s), 0, float(loss), int(tokens)) for s, loss, tokens in entries)


def frame_view(frame: Any) -> memoryview:
    """The bytes of a received frame (a zmq.Frame from recv(copy=False), or bytes) without copying."""
    buffer = getattr(frame, "buffer", None)
    return buffer if buffer is not None else memoryview(frame)


def decode_header(frame: Any) -> ReplyHeader:
    view = frame_view(frame)
    if len(view) < REPLY_HEADER_V1_LEN:
        raise ProtocolError(f"reply header is {len(view)} bytes, expected {REPLY_HEADER_LEN}")
    magic, version, status, *rest = _HEADER.unpack_from(view)
    if magic != REPLY_MAGIC:
        raise ProtocolError(f"bad magic bytes {magic!r} in the reply header")
    if not OLDEST_VERSION <= version <= PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"the daemon replied in protocol version {version}; this client speaks versions {OLDEST_VERSION} to {PROTOCOL_VERSION}"
        )
    expected = reply_header_len(version)
    if len(view) != expected:
        raise ProtocolError(f"a version {version} reply header is {expected} bytes, got {len(view)}")
    request_id, step, rank, world_size, micro_batch, window_tokens, dtype_bytes, _reserved, index, recipe_hash, num_steps, first_window = rest
    if status not in (STATUS_OK, STATUS_END_OF_DATA) and status not in STATUS_ERRORS:
        raise ProtocolError(f"unknown reply status {status}")
    if status == STATUS_OK and dtype_bytes not in (2, 4):
        raise ProtocolError(f"dtype of {dtype_bytes} bytes per token is not 2 or 4")
    chain = ReplyChain(*_CHAIN.unpack_from(view, REPLY_HEADER_V1_LEN)) if version >= 2 and status == STATUS_OK else None
    segment = None
    if version >= SEGMENT_VERSION and status == STATUS_OK:
        segment = (index, bytes(view[REPLY_HEADER_LEN:REPLY_HEADER_V5_LEN]))
    return ReplyHeader(
        status, request_id, step, rank, world_size, micro_batch, window_tokens, dtype_bytes, recipe_hash, num_steps, first_window, version, chain, segment
    )


def reply_header_len(version: int) -> int:
    """A reply header's bytes in `version`: 96 (v1), 224 (v2 to v4), 256 (v5)."""
    return REPLY_HEADER_V1_LEN if version == 1 else REPLY_HEADER_LEN if version < SEGMENT_VERSION else REPLY_HEADER_V5_LEN


def decode_reply(frames: Sequence[Any], header: Optional[ReplyHeader] = None) -> Optional[Batch]:
    """A whole reply: the batch (ok), None (end of data), or the status's exception raised."""
    header = header if header is not None else decode_header(frames[0])
    if header.status == STATUS_END_OF_DATA:
        return None
    if header.status != STATUS_OK:
        message = bytes(frame_view(frames[1])).decode("utf-8", "replace") if len(frames) > 1 else ""
        raise STATUS_ERRORS[header.status](message, header)
    expected = ok_reply_frames(header.version)
    if len(frames) != expected:
        raise ProtocolError(f"an ok reply of version {header.version} has {expected} frames, got {len(frames)}")
    tokens_view, docs_view = frame_view(frames[1]), frame_view(frames[2])
    if len(tokens_view) != header.payload_bytes():
        raise ProtocolError(f"token frame is {len(tokens_view)} bytes, the header says {header.payload_bytes()}")
    dtype = np.dtype("<u2") if header.dtype_bytes == 2 else np.dtype("<u4")
    tokens = np.frombuffer(tokens_view, dtype=dtype).reshape(header.micro_batch, header.window_tokens)
    tokens.flags.writeable = False  # a view of the received frame: the same bytes the daemon sent
    doc_starts = decode_doc_starts(docs_view, header.micro_batch, header.window_tokens)
    leads, sources, real_tokens = None, None, None
    if expected >= 4:
        leads, sources = decode_doc_sources(frame_view(frames[3]), doc_starts)
    if expected >= 5:
        real_tokens = decode_real_tokens(frame_view(frames[4]), header.micro_batch, header.window_tokens)
    num_steps = None if header.num_steps == UNKNOWN_STEPS else header.num_steps
    return Batch(
        step=header.step,
        rank=header.rank,
        world_size=header.world_size,
        first_window=header.first_window,
        tokens=tokens,
        doc_starts=doc_starts,
        num_steps=num_steps,
        recipe_hash=header.recipe_hash.hex(),
        chain=header.chain,
        doc_sources=sources,
        lead_sources=leads,
        real_tokens=real_tokens,
        segment=header.segment[0] if header.segment is not None else None,
        segment_recipe_hash=header.segment[1].hex() if header.segment is not None else None,
    )


def ok_reply_frames(version: int) -> int:
    """The frames of an ok reply in `version`: header, tokens, document starts, from v3 the
    document sources, from v4 the real tokens."""
    return 3 if version <= 2 else 4 if version == 3 else 5


def decode_real_tokens(view: memoryview, rows: int, window_tokens: int) -> np.ndarray:
    """The real-token frame (v4): a u32 per row, the tokens before its padding (`window_tokens`
    from a daemon that does not pad); checked (1 to `window_tokens` each), then a uint32 view."""
    if len(view) != 4 * rows:
        raise ProtocolError(f"real-token frame: {len(view)} bytes, {rows} rows need {4 * rows}")
    counts = np.frombuffer(view, dtype="<u4")
    counts.flags.writeable = False
    bad = counts[(counts == 0) | (counts > window_tokens)]
    if len(bad):
        raise ProtocolError(f"real-token frame: a row of {window_tokens} tokens cannot hold {bad[0]} real tokens")
    return counts


def decode_doc_sources(view: memoryview, doc_starts: list) -> tuple:
    """The document-source frame (v3): a u16 lead source per row, then a u16 source per document
    start in the boundary frame's order; checked, then (leads, one uint16 view per row)."""
    rows, starts = len(doc_starts), sum(len(r) for r in doc_starts)
    if len(view) != 2 * (rows + starts):
        raise ProtocolError(
            f"document-source frame: {len(view)} bytes, {rows} rows with {starts} document starts need {2 * (rows + starts)}"
        )
    words = np.frombuffer(view, dtype="<u2")
    words.flags.writeable = False
    out, at = [], rows
    for row in doc_starts:
        out.append(words[at : at + len(row)])
        at += len(row)
    return words[:rows], out


def decode_doc_starts(view: memoryview, rows: int, window_tokens: int) -> list:
    """The document-boundary frame: `rows + 1` u32 offsets, then the starts; checked, then one
    `uint32` view per row (no copy)."""
    if len(view) % 4 != 0 or len(view) < 4 * (rows + 1):
        raise ProtocolError("document-boundary frame: too short or not whole u32s")
    words = np.frombuffer(view, dtype="<u4")
    words.flags.writeable = False
    offsets, starts = words[: rows + 1].astype(np.int64), words[rows + 1 :]
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != len(starts):
        raise ProtocolError("document-boundary frame: offsets are not a valid index of the starts")
    out = []
    for i in range(rows):
        row = starts[offsets[i] : offsets[i + 1]]
        if np.any(np.diff(row.astype(np.int64)) <= 0) or np.any(row >= window_tokens):
            raise ProtocolError(f"document-boundary frame: row {i}'s starts are not increasing offsets inside the window")
        out.append(row)
    return out
