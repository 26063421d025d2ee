"""Python trainer client of dsprep: `Client` speaks wire protocol v7 to `dsprep serve` (one rank,
checking the stream chain of every step, and reporting its loss per source: `per_source_loss`), `PackedDataset` reads a `dsprep pack` directory (format
v5) with the same batch API, and `DsprepIterableDataset` wraps either for torch (imported lazily:
torch is optional). A `Batch`'s labels carry `IGNORE_INDEX` (-100) where the next token is padding.
"""

from typing import Any

from .batch import IGNORE_INDEX, Batch
from .client import Client
from .errors import (
    ChainMismatch,
    ConfigError,
    DaemonFailed,
    DaemonGone,
    DsprepError,
    LayoutMismatch,
    Malformed,
    ProtocolError,
    RankOwned,
    RecipeMismatch,
    ShuttingDown,
    StatusError,
    StepAhead,
    StepGone,
    Superseded,
    Unauthorized,
    UnsupportedVersion,
)
from .packed import PackedDataset, PackedFormatError

__all__ = [
    "Batch",
    "ChainMismatch",
    "Client",
    "ConfigError",
    "DaemonFailed",
    "DaemonGone",
    "DsprepError",
    "DsprepIterableDataset",
    "IGNORE_INDEX",
    "LayoutMismatch",
    "Malformed",
    "Unauthorized",
    "PackedDataset",
    "PackedFormatError",
    "ProtocolError",
    "RankOwned",
    "RecipeMismatch",
    "ShuttingDown",
    "StatusError",
    "StepAhead",
    "StepGone",
    "Superseded",
    "UnsupportedVersion",
    "per_source_loss",
]


def __getattr__(name: str) -> Any:
    if name == "DsprepIterableDataset":  # imports torch, only when asked for
        from .torch_dataset import DsprepIterableDataset

        return DsprepIterableDataset
    if name == "per_source_loss":  # imports torch when called
        from .loss import per_source_loss

        return per_source_loss
    raise AttributeError(f"module 'dsprep_client' has no attribute {name!r}")
