"""One trainer rank's connection to `dsprep serve`: `next_batch()` / `batch_at(step)` over a
ZeroMQ DEALER socket, with a timeout per attempt, reconnect, and the 20 ms step-ahead retry of
the Rust client (client/src/served.rs). A batch's tokens are numpy views of the received
frames. With CURVE keys the connection is authenticated and encrypted, and a refused handshake
raises `Unauthorized` (curve.py). While a client lives, a thread with its own socket sends the
daemon a keepalive for its rank every 0.25 s (protocol v6), so the rank stays this process's
however long a step takes; a rank a later trainer process took over raises `Superseded`.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import zmq

from .batch import Batch
from . import chain
from .curve import CLIENT_KEY_ENV, SERVER_KEY_ENV, HandshakeWatch, load_keys
from .errors import ChainMismatch, ConfigError, DaemonGone, ProtocolError, RankOwned, StepAhead, Unauthorized
from .parallel import data_parallel, parallel_from_env, reports_loss
from .protocol import (
    KEEPALIVE_INTERVAL_S,
    KIND_KEEPALIVE,
    KIND_RELEASE,
    KIND_REPORT,
    UNKNOWN_STEPS,
    ReplyHeader,
    decode_header,
    encode_report,
    decode_reply,
    encode_request,
)

#: How often a rank that is ahead of the others asks again.
AHEAD_RETRY_S = 0.020
#: A rank another process holds is asked for again this often, for this long: past the daemon's
#: default owner timeout (10 s), so a trainer gets the rank of one that just died (a trainer
#: started later than a live owner takes the rank at once, protocol v6), while two trainers
#: started with the same RANK fail within it.
OWNED_RETRY_S = 0.25
OWNED_PATIENCE_S = 15.0

#: Keepalives queued at most on the keepalive socket while the daemon is unreachable.
KEEPALIVE_QUEUED = 4


class Session(int):
    """A session id that carries its start time (`started`, ns since the Unix epoch) along, also
    through pickling into a spawned DataLoader worker."""

    started: int

    def __new__(cls, session: int, started: int) -> "Session":
        value = super().__new__(cls, session)
        value.started = int(started)
        return value

    def __reduce__(self) -> Any:
        return (Session, (int(self), self.started))


_SESSION: Optional[Session] = None


def process_session() -> Session:
    """This process's session id (never 0): random, made once per process and inherited by the
    DataLoader workers it forks, so they all own its rank together. Its `started` (when it was
    made, ns since the Unix epoch) goes with every request (protocol v6): a later trainer process
    takes the rank over at once, an earlier one (a zombie of a replaced job) is refused."""
    global _SESSION
    if _SESSION is None:
        _SESSION = Session(secrets.randbits(64) | 1, time.time_ns())
    return _SESSION


class _Keepalive:
    """Sends `frame` (the rank's keepalive request) every `KEEPALIVE_INTERVAL_S` from a daemon
    thread with its own DEALER socket, until `stop()`. Never blocks the trainer: sends never wait
    (a full queue drops one), the daemon never answers. A forked DataLoader worker inherits the
    object but not the thread: the parent's thread keeps the session's rank."""

    def __init__(self, context: zmq.Context, endpoint: str, keys: Any, frame: bytes):
        self._stopped = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, args=(context, endpoint, keys, frame), name="dsprep-keepalive", daemon=True
        )
        self._thread.start()

    def _run(self, context: zmq.Context, endpoint: str, keys: Any, frame: bytes) -> None:
        try:
            socket = context.socket(zmq.DEALER)
        except zmq.ZMQError:
            return
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SNDHWM, KEEPALIVE_QUEUED)
            if keys is not None:
                keys.apply(socket)
            socket.connect(endpoint)
            while True:
                try:
                    socket.send(frame, zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass  # the queue is full (the daemon is away): the next one follows
                if self._stopped.wait(KEEPALIVE_INTERVAL_S):
                    return
        except zmq.ZMQError:
            return  # the batch requests will say what is wrong with the endpoint
        finally:
            socket.close(linger=0)

    def signal(self) -> None:
        """Stop at the next wake-up (safe from a finalizer)."""
        self._stopped.set()

    def stop(self) -> None:
        """Stop, and wait (briefly) for the thread to close its socket, in the process that started it."""
        self._stopped.set()
        if os.getpid() == self._pid and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=1.0)


def layout_from_env(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Rank and world size: as given, else `RANK`/`WORLD_SIZE` (as torchrun sets them), else 0 of 1."""

    def read(name: str) -> Optional[int]:
        value = os.environ.get(name)
        if value is None:
            return None
        try:
            return int(value.strip())
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not a whole number") from None

    if rank is None and world_size is None:
        rank, world_size = read("RANK"), read("WORLD_SIZE")
        if (rank is None) != (world_size is None):
            raise ConfigError("set both RANK and WORLD_SIZE, or neither")
        if rank is None:
            rank, world_size = 0, 1
    if rank is None or world_size is None:
        raise ConfigError("pass both rank= and world_size=, or neither (then RANK/WORLD_SIZE are read)")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not below world size {world_size}")
    return rank, world_size


def parse_recipe_hash(text: Optional[str]) -> Optional[bytes]:
    if text is None:
        return None
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ConfigError(f"recipe hash {text!r} is not 64 hex digits")
    return raw


def recipe_note(pinned: str, batch: Batch) -> str:
    """What a trainer pinned to `pinned` is told when the daemon serves it `batch` of another
    recipe: its pinned recipe is an earlier one of the stream's lineage (the daemon refuses any
    other), and (protocol v5) which segment made this step."""
    note = (
        f"recipe {pinned} this trainer pinned is an earlier recipe of the stream's lineage: the "
        f"daemon changed course to recipe {batch.recipe_hash} and serves the trainer that stream"
    )
    if batch.segment is not None:
        note += f"; step {batch.step} is segment {batch.segment}'s (recipe {batch.segment_recipe_hash})"
    return note


class Client:
    """A rank of the daemon at `endpoint` (`ipc://PATH` or `tcp://HOST:PORT`).

    `timeout` (seconds) bounds one attempt; after `attempts` attempts without a reply,
    `DaemonGone` is raised. `recipe_hash` (hex) refuses a daemon serving another recipe.
    With model parallelism (`tensor_parallel`, `context_parallel`, `pipeline_parallel`,
    `rank_order`; else DSPREP_TP/CP/PP/RANK_ORDER) the client asks for its data-parallel rank's
    batches: `self.dp_rank` of `self.dp_size` (see parallel.py).
    A daemon serving with CURVE needs `curve_server_key` (path to its `NAME.key`) and
    `curve_client_key` (this client's `NAME.key_secret`), else DSPREP_CURVE_SERVER_KEY and
    DSPREP_CURVE_CLIENT_KEY; a refused handshake raises `Unauthorized`.
    """

    def __init__(
        self,
        endpoint: str,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        recipe_hash: Optional[str] = None,
        timeout: float = 30.0,
        attempts: int = 4,
        tensor_parallel: Optional[int] = None,
        context_parallel: Optional[int] = None,
        pipeline_parallel: Optional[int] = None,
        rank_order: Optional[str] = None,
        session: Optional[int] = None,
        curve_server_key: Optional[str] = None,
        curve_client_key: Optional[str] = None,
        session_started: Optional[int] = None,
    ):
        self.endpoint = endpoint
        self._keys = load_keys(curve_server_key, curve_client_key)
        #: Owns `rank` at the daemon (PROTOCOL.md "One owner per rank"): this process's by default.
        self.session = int(session) if session else int(process_session())
        #: When the session started (ns since the Unix epoch): `session_started`, else the one a
        #: `Session` carries (a spawned DataLoader worker's parent's), else this process's.
        self.session_started = int(
            session_started if session_started is not None else getattr(session, "started", None) or process_session().started
        )
        self.rank, self.world_size = layout_from_env(rank, world_size)
        tp, cp, pp, order = parallel_from_env(tensor_parallel, context_parallel, pipeline_parallel, rank_order)
        self.dp_rank, self.dp_size = data_parallel(self.rank, self.world_size, tp, cp, pp, order)
        #: Whether this rank sends its loss reports: one rank per model-parallel group.
        self.reports_loss = reports_loss(self.rank, self.world_size, tp, cp, pp, order)
        self._expected_hash = parse_recipe_hash(recipe_hash)
        self.timeout = float(timeout)
        self.attempts = max(1, int(attempts))
        #: The step `next_batch` asks for next.
        self.next_step = 0
        #: Learned from the daemon's first reply.
        self.micro_batch: Optional[int] = None
        self.seq_len: Optional[int] = None
        self.num_steps: Optional[int] = None
        self.served_recipe_hash: Optional[str] = None
        #: Set once a pinned recipe is served as an earlier recipe of the daemon's lineage.
        self.recipe_note: Optional[str] = None
        #: (step, chain): the stream chain before `step`, once a step was received; saved by
        #: `state_dict` and checked again after `load_state_dict`.
        self.stream_chain: Optional[Tuple[int, bytes]] = None
        self._next_request_id = 1
        # The process-wide context: it outlives every client, so garbage collection never has to
        # terminate a context whose sockets are still open (that blocks forever).
        self._context = zmq.Context.instance()
        self._watch: Optional[HandshakeWatch] = None
        self._socket = self._open()
        beat = encode_request(0, self.dp_rank, self.dp_size, 0, owner=self._owner(), kind=KIND_KEEPALIVE)
        self._keepalive = _Keepalive(self._context, endpoint, self._keys, beat)
        weakref.finalize(self, self._keepalive.signal)

    def _owner(self) -> Tuple[int, int, int]:
        """(global rank, session, start time): who asks, in every request."""
        return (self.rank, self.session, self.session_started)

    # -- the batch API (shared with PackedDataset) --------------------------------------------

    @property
    def recipe_hash(self) -> Optional[str]:
        """The recipe hash expected, else the one the daemon served, else None."""
        if self._expected_hash is not None:
            return self._expected_hash.hex()
        return self.served_recipe_hash

    def next_batch(self) -> Optional[Batch]:
        """The next step's batch, or None once the stream has ended (the same step for every rank)."""
        return self.batch_at(self.next_step)

    def batch_at(self, step: int) -> Optional[Batch]:
        """The batch of `step`; `next_batch` continues after it.

        A step beyond the daemon's prefetch window (other ranks are slower) is asked for again
        every 20 ms until `timeout × attempts` has passed; then `StepAhead` is raised. A rank held
        by another trainer process is asked for again every 0.25 s for up to 15 s (if that
        process died, the rank passes once it has been silent for the daemon's owner timeout);
        then `RankOwned` is raised. A rank a trainer process started later holds raises
        `Superseded` at once: this process belongs to a job that was replaced.
        """
        if step < 0:
            raise ConfigError(f"step {step} is negative")
        patience = self.timeout * self.attempts
        started = time.monotonic()
        while True:
            try:
                batch = self._request(step)
            except StepAhead:
                if time.monotonic() - started >= patience:
                    raise
                time.sleep(AHEAD_RETRY_S)
                continue
            except RankOwned:
                if time.monotonic() - started >= min(patience, OWNED_PATIENCE_S):
                    raise
                time.sleep(OWNED_RETRY_S)
                continue
            if batch is not None:
                self._check_chain(batch)
                self.next_step = step + 1
                self.micro_batch, self.seq_len = batch.micro_batch, batch.seq_len
                self.served_recipe_hash = batch.recipe_hash
                self._note_pinned_recipe(batch)
            return batch

    def _note_pinned_recipe(self, batch: Batch) -> None:
        """A pinned recipe the daemon no longer serves was accepted as an earlier recipe of its
        lineage (PROTOCOL.md status 11): say so once, in `recipe_note` and as a warning."""
        pinned = self._expected_hash.hex() if self._expected_hash is not None else None
        if pinned is None or pinned == batch.recipe_hash or self.recipe_note is not None:
            return
        self.recipe_note = recipe_note(pinned, batch)
        warnings.warn(self.recipe_note, stacklevel=3)

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"next_step": self.next_step, "recipe_hash": self.recipe_hash}
        if self.stream_chain is not None:
            state["stream_chain"] = [self.stream_chain[0], self.stream_chain[1].hex()]
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from the saved step; a saved recipe hash must match the daemon's from now on,
        and a saved stream chain must be where the daemon's stream stands (else `ChainMismatch`)."""
        self.next_step = int(state["next_step"])
        if state.get("recipe_hash"):
            self._expected_hash = parse_recipe_hash(state["recipe_hash"])
        saved = state.get("stream_chain")
        if saved:
            step, value = int(saved[0]), bytes.fromhex(saved[1])
            if len(value) != 32:
                raise ConfigError(f"stream_chain {saved!r} is not a step and 64 hex digits")
            self.stream_chain = (step, value)

    def _check_chain(self, batch: Batch) -> None:
        """The rows hash to the chain the reply states, and the step starts where this trainer's
        stream stands (the previous step, or the saved state)."""
        c = batch.chain
        if c is None:
            raise ProtocolError("an ok v2 reply without its chain")
        rows_end = chain.extend(c.rows_start, (row.tobytes() for row in batch.tokens))
        step_first = batch.step * batch.world_size * batch.micro_batch
        last_rank = batch.rank + 1 == batch.world_size
        if rows_end != c.rows_end or (batch.first_window == step_first and c.rows_start != c.step_start) or (last_rank and c.rows_end != c.step_end):
            raise ChainMismatch(
                f"rank {batch.rank}'s rows at step {batch.step} do not hash to the chain the daemon states "
                f"({c.rows_end.hex()} from {c.rows_start.hex()}, the rows give {rows_end.hex()}): "
                "the bytes changed between the daemon and this rank"
            )
        if self.stream_chain is not None and self.stream_chain[0] == batch.step and self.stream_chain[1] != c.step_start:
            raise ChainMismatch(
                f"the stream this trainer consumed stands at {self.stream_chain[1].hex()} before step {batch.step}, "
                f"the daemon's step {batch.step} starts from {c.step_start.hex()}: the daemon is not continuing the same "
                "stream (other inputs, another --state-dir, or a resume that went wrong); nothing from it was used"
            )
        self.stream_chain = (batch.step + 1, c.step_end)

    def report(self, step: int, losses: Dict[int, Tuple[float, int]]) -> bool:
        """Report this rank's loss per source for `step` (protocol v7): `losses` maps a source
        index to (summed per-token loss, counted tokens), as `per_source_loss` makes it. What
        `[mix.adaptive]` decides from and `/metrics` shows. Never waits: the daemon does not answer.
        Returns whether it was sent: only one rank of a model-parallel group reports
        (`reports_loss`: the last pipeline stage, tensor rank 0), and a full queue drops it."""
        if not self.reports_loss:
            return False
        request_id = self._next_request_id
        self._next_request_id += 1
        frame = encode_request(
            request_id, self.dp_rank, self.dp_size, step, self._expected_hash, owner=self._owner(), kind=KIND_REPORT
        )
        entries = [(source, loss, tokens) for source, (loss, tokens) in sorted(losses.items())]
        try:
            self._socket.send_multipart([frame, encode_report(entries)], zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def close(self) -> None:
        """Stop the keepalive, release the rank at the daemon (a clean exit: the next trainer may
        take it at once) and close the socket."""
        self._keepalive.stop()
        try:
            release = encode_request(0, self.dp_rank, self.dp_size, 0, owner=self._owner(), kind=KIND_RELEASE)
            self._socket.send(release, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # best effort: the daemon frees the rank after its owner timeout anyway
        self._close_socket(linger=100)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------

    def _open(self) -> zmq.Socket:
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self._keys is not None:
            self._keys.apply(socket)
        self._watch = HandshakeWatch(socket, self.endpoint, curve=self._keys is not None)
        try:
            socket.connect(self.endpoint)
        except zmq.ZMQError as e:
            self._watch.close()
            socket.close(linger=0)
            raise ConfigError(f"cannot connect to {self.endpoint}: {e}") from e
        return socket

    def _close_socket(self, linger: int) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._socket.close(linger=linger)

    def _request(self, step: int) -> Optional[Batch]:
        started = time.monotonic()
        handshake_seen = False
        for attempt in range(1, self.attempts + 1):
            request_id = self._next_request_id
            self._next_request_id += 1
            frame = encode_request(request_id, self.dp_rank, self.dp_size, step, self._expected_hash, owner=self._owner())
            self._socket.send(frame)
            reply = self._wait_reply(request_id)
            handshake_seen = handshake_seen or (self._watch is not None and self._watch.succeeded)
            if reply is not None:
                header, frames = reply
                if header.num_steps != UNKNOWN_STEPS:
                    self.num_steps = header.num_steps
                return decode_reply(frames, header)
            # No reply in time: the daemon may have restarted; a new socket drops stale replies.
            if attempt < self.attempts:
                self._close_socket(linger=0)
                self._socket = self._open()
        waited = time.monotonic() - started
        if self._keys is not None and not handshake_seen:
            raise Unauthorized(
                f"no reply from the daemon at {self.endpoint} after {waited:.2f} s ({self.attempts} attempts) and no "
                "CURVE handshake completed: the daemon may have refused this client's CURVE key, or is not running; "
                f"check {SERVER_KEY_ENV} / {CLIENT_KEY_ENV}"
            )
        raise DaemonGone(self.endpoint, waited, self.attempts)

    def _wait_reply(self, request_id: int) -> Optional[Tuple[ReplyHeader, List[zmq.Frame]]]:
        """The reply to `request_id` (header and frames), or None when none came within the timeout."""
        deadline = time.monotonic() + self.timeout
        assert self._watch is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._watch.socket, zmq.POLLIN)
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return None
            ready = dict(poller.poll(max(left_ms, 1)))
            if self._watch.socket in ready:
                self._watch.read_events()
            if self._socket not in ready:
                continue
            frames = self._socket.recv_multipart(copy=False)
            header = decode_header(frames[0])
            if header.request_id == request_id:
                return header, frames
            # else: a late reply to a request given up on
