"""The stream chain (FORMAT.md "Stream chain"; the Rust side is client/src/chain.rs): a checksum
over every window of a stream, chained in stream order. ``chain(0)`` is 32 zero bytes and
``chain(w + 1) = sha256(chain(w) + sha256(window w))``, where a window's bytes are its token ids as
served (little-endian, the recipe's dtype).
"""

from __future__ import annotations

import hashlib
from typing import Iterable

#: The chain before the first window.
START = bytes(32)


def window_digest(window: bytes) -> bytes:
    return hashlib.sha256(window).digest()


def link(before: bytes, digest: bytes) -> bytes:
    return hashlib.sha256(before + digest).digest()


def extend(before: bytes, windows: Iterable[bytes]) -> bytes:
    """The chain after `windows` (each one window's bytes), from `before`."""
    at = before
    for window in windows:
        at = link(at, window_digest(window))
    return at
