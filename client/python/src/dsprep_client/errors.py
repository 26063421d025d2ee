"""Exceptions of the dsprep client: one class per reply status of the wire protocol (PROTOCOL.md),
plus the client-side failures (nothing answers, a refused CURVE handshake, a reply that breaks the
protocol, a stream chain that does not continue, bad settings).

Every exception raised by this package derives from ``DsprepError``. A status error carries the
daemon's message (``.message``), the status code (``.status``) and the reply header (``.header``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Type

if TYPE_CHECKING:
    from .protocol import ReplyHeader


class DsprepError(Exception):
    """Base class of every error this package raises."""


class ConfigError(DsprepError, ValueError):
    """Bad client settings: rank not below world size, RANK without WORLD_SIZE, a bad recipe hash."""


class DaemonGone(DsprepError):
    """No reply within the timeout on any attempt: the daemon is not running or not reachable."""

    def __init__(self, endpoint: str, waited_s: float, attempts: int):
        self.endpoint = endpoint
        self.waited_s = waited_s
        self.attempts = attempts
        super().__init__(
            f"no reply from the daemon at {endpoint} after {waited_s:.2f} s ({attempts} attempts): is it running?"
        )


class Unauthorized(DsprepError):
    """The daemon refused this client's handshake: CURVE keys missing, not in the daemon's
    allow list, or for another daemon (DSPREP_CURVE_SERVER_KEY / DSPREP_CURVE_CLIENT_KEY)."""


class ChainMismatch(DsprepError):
    """The stream chain does not continue: the daemon is not serving the stream this trainer
    consumed (other inputs, another state dir, a resume gone wrong), or the bytes changed on the way."""


class ProtocolError(DsprepError):
    """A reply that breaks the wire protocol (bad length, magic, frame count, document index)."""


class StatusError(DsprepError):
    """The daemon refused a request; ``message`` is the daemon's own explanation."""

    status: int = -1
    label: str = "refused"

    def __init__(self, message: str, header: Optional["ReplyHeader"] = None):
        self.message = message
        self.header = header
        super().__init__(f"{self.label}: {message}" if message and message != self.label else self.label)


class UnsupportedVersion(StatusError):
    status = 10
    label = "protocol version"


class RecipeMismatch(StatusError):
    status = 11
    label = "recipe mismatch"


class LayoutMismatch(StatusError):
    status = 12
    label = "rank/world size mismatch"


class StepGone(StatusError):
    status = 13
    label = "step out of range"


class StepAhead(StatusError):
    status = 14
    label = "step out of range"


class Malformed(StatusError):
    status = 15
    label = "the daemon rejected the request as malformed"


class DaemonFailed(StatusError):
    status = 16
    label = "the daemon's pipeline failed"


class ShuttingDown(StatusError):
    status = 17
    label = "the daemon is shutting down"


class RankOwned(StatusError):
    """Another trainer process holds this global rank (protocol v3): two trainers started with the
    same RANK, or a restarted one asking before the old one's owner timeout."""

    status = 18
    label = "rank taken"


class Superseded(StatusError):
    """A trainer process started later holds this global rank (protocol v6): this process belongs
    to a job that was replaced (a zombie of a killed job), and should exit. Never retried."""

    status = 19
    label = "superseded"


STATUS_ERRORS: Dict[int, Type[StatusError]] = {
    cls.status: cls
    for cls in (UnsupportedVersion, RecipeMismatch, LayoutMismatch, StepGone, StepAhead, Malformed, DaemonFailed, ShuttingDown, RankOwned, Superseded)
}
