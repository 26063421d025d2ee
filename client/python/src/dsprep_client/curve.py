"""CURVE keys for a daemon that serves with CURVE (PROTOCOL.md "Security"): the daemon's public
key and this client's key pair, read from ZeroMQ certificate files (`dsprep keygen` writes them
in the format of pyzmq's `zmq.auth`, which reads them here) given as arguments or by
`DSPREP_CURVE_SERVER_KEY` (the daemon's `NAME.key`) and `DSPREP_CURVE_CLIENT_KEY` (this client's
`NAME.key_secret`). A secret key is never printed.

Also the handshake watch of a connection (`HandshakeWatch`): a refused handshake never produces
a reply, so the client reads its socket's monitor events to fail at once with `Unauthorized`
instead of waiting out its timeout (client/src/connection.rs does the same in Rust).
"""

from __future__ import annotations

import itertools
import os
import struct
from typing import NamedTuple, Optional, Union

import zmq
import zmq.auth

from .errors import ConfigError, Unauthorized

SERVER_KEY_ENV = "DSPREP_CURVE_SERVER_KEY"
CLIENT_KEY_ENV = "DSPREP_CURVE_CLIENT_KEY"
#: CURVE handshakes broken off with no detail (or, without keys, connections made again before any
#: handshake completed), in a row, before the client stops waiting.
NO_DETAIL_FAILURES = 3
#: Numbers the handshake monitors' inproc addresses (see `HandshakeWatch`).
_MONITOR_IDS = itertools.count()

HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_CONNECTED
)
_MECHANISM_MISMATCH = 0x11000002

PathLike = Union[str, "os.PathLike[str]"]


class ClientKeys(NamedTuple):
    """Z85 text of the daemon's public key and of this client's key pair."""

    server_public: bytes
    client_public: bytes
    client_secret: bytes

    def __repr__(self) -> str:
        return f"ClientKeys(server_public={self.server_public!r}, client_public={self.client_public!r}, client_secret=<secret>)"

    def apply(self, socket: zmq.Socket) -> None:
        """Make `socket` a CURVE client of the daemon (before it connects)."""
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.client_public
        socket.curve_secretkey = self.client_secret


def _load(path: PathLike, what: str) -> "tuple[bytes, Optional[bytes]]":
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {os.fspath(path)}: not a readable ZeroMQ certificate file ({e})") from None
    if len(public) != 40:
        raise ConfigError(f"{what} {os.fspath(path)}: public-key is not a 40-character Z85 key")
    return public, secret


def load_keys(server_key: Optional[PathLike] = None, client_key: Optional[PathLike] = None) -> Optional[ClientKeys]:
    """The keys from the two files, as given, else from the environment; None when neither is set
    (a plain connection). One without the other is a `ConfigError`."""
    if server_key is None and client_key is None:
        server_key = os.environ.get(SERVER_KEY_ENV) or None
        client_key = os.environ.get(CLIENT_KEY_ENV) or None
        names = (SERVER_KEY_ENV, CLIENT_KEY_ENV)
    else:
        names = ("curve_server_key", "curve_client_key")
    if server_key is None and client_key is None:
        return None
    if server_key is None or client_key is None:
        given, missing = (names[0], names[1]) if client_key is None else (names[1], names[0])
        raise ConfigError(
            f"{given} is set but {missing} is not: a CURVE client needs both "
            "(the daemon's NAME.key and this client's NAME.key_secret)"
        )
    if not zmq.has("curve"):
        raise ConfigError(f"this pyzmq's libzmq {zmq.zmq_version()} has no CURVE: install a pyzmq wheel (they have it)")
    server_public, _ = _load(server_key, names[0])
    client_public, client_secret = _load(client_key, names[1])
    if client_secret is None:
        raise ConfigError(
            f"{names[1]} {os.fspath(client_key)} holds no secret-key: give the NAME.key_secret file that "
            "`dsprep keygen` wrote, not the public NAME.key"
        )
    return ClientKeys(server_public, client_public, client_secret)


class HandshakeWatch:
    """The monitor of one DEALER socket's handshakes."""

    def __init__(self, socket: zmq.Socket, endpoint: str, curve: bool):
        # An address of its own: pyzmq's default, "inproc://monitor.s-<fd>", is reused by the next
        # socket that gets the same file descriptor, while the closed socket's monitor may still
        # hold it; that next client then never saw its handshake events (a refused key read as
        # "no reply"), and its sockets' monitors stayed bound for the clients after it.
        self.monitored = socket
        address = f"inproc://dsprep-handshakes-{os.getpid()}-{next(_MONITOR_IDS)}"
        self.socket = socket.get_monitor_socket(HANDSHAKE_EVENTS, addr=address)
        self.endpoint = endpoint
        self.curve = curve
        #: A handshake completed (a reply can come).
        self.succeeded = False
        self._no_detail = 0
        self._connected = 0

    def read_events(self) -> None:
        """Take the events there are; raise `Unauthorized` once the daemon is known to refuse."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not frames or len(frames[0]) != 6:
                continue
            event, value = struct.unpack("=HI", frames[0])
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded, self._no_detail = True, 0
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise Unauthorized(
                    f"the daemon at {self.endpoint} refused this client's CURVE key (ZAP status {value}): its public key "
                    "(the NAME.key beside the NAME.key_secret given) is not in the daemon's --curve-allow directory; "
                    f"check {CLIENT_KEY_ENV}"
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                raise Unauthorized(self._protocol_failure(value))
            elif event == zmq.EVENT_CONNECTED and not self.succeeded and not self.curve:
                # A CURVE daemon closes a plain client's connection at the greeting; when it closes
                # before this side has read the daemon's mechanism, no protocol event comes, and
                # the socket connects again. (Not EVENT_DISCONNECTED: with it in the mask, later
                # clients in the same process went unanswered in the tests.)
                self._connected += 1
                if self._connected > NO_DETAIL_FAILURES:
                    raise Unauthorized(self._protocol_failure(_MECHANISM_MISMATCH))
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.curve:
                self._no_detail += 1
                if self._no_detail >= NO_DETAIL_FAILURES:
                    raise Unauthorized(
                        f"the daemon at {self.endpoint} broke off {self._no_detail} CURVE handshakes in a row: it cannot "
                        "open this client's HELLO, so the server public key given is not the daemon's (or the daemon "
                        f"refused this client); check {SERVER_KEY_ENV} / {CLIENT_KEY_ENV}"
                    )

    def _protocol_failure(self, code: int) -> str:
        if code == _MECHANISM_MISMATCH and not self.curve:
            return (
                f"the daemon at {self.endpoint} serves with CURVE and this client has no keys: set {SERVER_KEY_ENV} "
                f"(the daemon's NAME.key) and {CLIENT_KEY_ENV} (this client's NAME.key_secret, whose NAME.key is in "
                "the daemon's --curve-allow directory)"
            )
        if code == _MECHANISM_MISMATCH:
            return (
                f"the daemon at {self.endpoint} does not serve with CURVE but this client has CURVE keys: unset "
                f"{SERVER_KEY_ENV} / {CLIENT_KEY_ENV}, or serve with --curve-secret-key and --curve-allow"
            )
        return (
            f"the handshake with the daemon at {self.endpoint} failed (ZMTP protocol error {code:#x}): check "
            f"{SERVER_KEY_ENV} / {CLIENT_KEY_ENV}"
        )

    def close(self) -> None:
        """Stop the monitor (unbinding its address) and close its socket; before the monitored
        socket is closed."""
        try:
            self.monitored.disable_monitor()
        except zmq.ZMQError:
            pass
        self.socket.close(linger=0)
