"""Reader of a `dsprep pack` output directory (FORMAT.md, format v5; v1 to v4 are still read)
through numpy.memmap, with the batch API of the served client: `batch_at(step)`, `next_batch()`,
`rank`, `world_size`, `micro_batch`, `state_dict()`. A trainer switches between served and packed
data by swapping one object. Opening checks the manifest, the file sizes and the real-token
counts (cheap); `dsprep verify` checks checksums. The windows of a pack without
`real_tokens.u32` (`concat`, format 4 and older) have no padding: `window_tokens` real tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np

from .batch import Batch
from .client import layout_from_env, parse_recipe_hash
from .parallel import data_parallel, parallel_from_env
from .errors import ConfigError, DsprepError, RecipeMismatch

FORMAT_NAME = "dsprep-packed"
#: The newest version `dsprep pack` writes (2 adds the stream chain, 3 the documents' sources, 4
#: the manifest's phase ledger, 5 padded windows: `real_tokens.u32` and the manifest's `packing`;
#: a pack without padding is still written as 4; 6 the documents' mixing positions; 7 each lineage
#: segment's packing, where a change of course changed it: its windows read as 5's do, each
#: window's real tokens from `real_tokens.u32`); 1 is still read.
FORMAT_VERSION = 7
OLDEST_FORMAT_VERSION = 1


class PackedFormatError(DsprepError):
    """The directory is not a readable packed output (format v1 to v5), naming the file at fault."""


class PackedDataset:
    """Rank `rank` of `world_size` reading `micro_batch` windows per step from `path`.

    Rank and world size come from `RANK`/`WORLD_SIZE` unless given. `micro_batch` is not stored
    in the directory (the daemon's `--micro-batch` decides it when served): pass the same value.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        micro_batch: int = 1,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        recipe_hash: Optional[str] = None,
        tensor_parallel: Optional[int] = None,
        context_parallel: Optional[int] = None,
        pipeline_parallel: Optional[int] = None,
        rank_order: Optional[str] = None,
    ):
        self.path = Path(path)
        self.rank, self.world_size = layout_from_env(rank, world_size)
        tp, cp, pp, order = parallel_from_env(tensor_parallel, context_parallel, pipeline_parallel, rank_order)
        #: The data-parallel rank and size whose rows this rank reads (as `Client`).
        self.dp_rank, self.dp_size = data_parallel(self.rank, self.world_size, tp, cp, pp, order)
        if micro_batch < 1:
            raise ConfigError(f"micro batch must be at least 1, got {micro_batch}")
        self.micro_batch = int(micro_batch)
        self.manifest = read_manifest(self.path)
        m = self.manifest
        self.seq_len: int = m["seq_len"]
        self.window_tokens: int = m["window_tokens"]
        self.num_windows: int = m["num_windows"]
        self.served_recipe_hash: str = m["recipe_hash"]
        expected = parse_recipe_hash(recipe_hash)
        if expected is not None and expected.hex() != self.served_recipe_hash:
            raise RecipeMismatch(f"{self.path} holds recipe {self.served_recipe_hash}, the trainer expects {expected.hex()}")
        self._dtype = np.dtype("<u2") if m["dtype"] == "u16" else np.dtype("<u4")
        self._per_shard: int = m["windows_per_shard"]
        self._shards: List[np.ndarray] = [self._map_shard(f) for f in m["shards"]]
        if sum(len(s) for s in self._shards) != self.num_windows:
            raise PackedFormatError(f"{self.path}: shards hold {sum(len(s) for s in self._shards)} windows, the manifest says {self.num_windows}")
        self._doc_starts = self._map(m["doc_starts"], np.dtype("<u4"))
        self._doc_offsets = self._map(m["doc_starts_offsets"], np.dtype("<u8"))
        if len(self._doc_offsets) != self.num_windows + 1:
            raise PackedFormatError(f"{self.path / m['doc_starts_offsets']['file']}: does not hold num_windows + 1 offsets")
        # Format 3: each document start's source, and each window's first token's.
        self._doc_sources: Optional[np.ndarray] = None
        self._lead_sources: Optional[np.ndarray] = None
        if "doc_sources" in m and "lead_sources" in m:
            self._doc_sources = self._map(m["doc_sources"], np.dtype("<u2"))
            self._lead_sources = self._map(m["lead_sources"], np.dtype("<u2"))
            if len(self._doc_sources) != len(self._doc_starts) or len(self._lead_sources) != self.num_windows:
                raise PackedFormatError(f"{self.path}: doc_sources.u16 / lead_sources.u16 do not match the document index")
        # Format 5 (`best_fit`): each window's tokens before its padding.
        self._real_tokens: Optional[np.ndarray] = None
        if "real_tokens" in m:
            self._real_tokens = self._map_real_tokens(m["real_tokens"])
        self.num_steps = self.num_windows // (self.dp_size * self.micro_batch)
        #: The step `next_batch` reads next.
        self.next_step = 0

    @property
    def recipe_hash(self) -> str:
        return self.served_recipe_hash

    def window(self, index: int) -> np.ndarray:
        """Window `index`'s `seq_len + 1` tokens (a view of the map)."""
        if not 0 <= index < self.num_windows:
            raise IndexError(f"window {index} does not exist: the dataset has {self.num_windows} windows")
        return self._shards[index // self._per_shard][index % self._per_shard]

    def window_doc_starts(self, index: int) -> np.ndarray:
        lo, hi = int(self._doc_offsets[index]), int(self._doc_offsets[index + 1])
        return self._doc_starts[lo:hi]

    def window_doc_sources(self, index: int) -> Optional[np.ndarray]:
        """The source index of each document starting in window `index` (None before format 3)."""
        if self._doc_sources is None:
            return None
        lo, hi = int(self._doc_offsets[index]), int(self._doc_offsets[index + 1])
        return self._doc_sources[lo:hi]

    def window_lead_source(self, index: int) -> Optional[int]:
        """The source of the document holding window `index`'s first token (None before format 3)."""
        return None if self._lead_sources is None else int(self._lead_sources[index])

    def window_real_tokens(self, index: int) -> int:
        """Window `index`'s tokens before its padding (`window_tokens` in a pack without padding)."""
        return self.window_tokens if self._real_tokens is None else int(self._real_tokens[index])

    def batch_at(self, step: int) -> Optional[Batch]:
        """This rank's rows at `step`, or None past the last step; `next_batch` continues after it."""
        if step < 0:
            raise IndexError(f"step {step} is negative")
        if step >= self.num_steps:
            return None
        first = (step * self.dp_size + self.dp_rank) * self.micro_batch
        shard, at = divmod(first, self._per_shard)
        if at + self.micro_batch <= self._per_shard:
            tokens = self._shards[shard][at : at + self.micro_batch]  # a view of one shard's map
        else:
            tokens = np.stack([self.window(i) for i in range(first, first + self.micro_batch)])
        rows = range(first, first + self.micro_batch)
        starts = [self.window_doc_starts(i) for i in rows]
        sources = None
        if self._doc_sources is not None and self._lead_sources is not None:
            sources = [self.window_doc_sources(i) for i in rows]
            leads = np.asarray(self._lead_sources[first : first + self.micro_batch])
        real = None if self._real_tokens is None else np.asarray(self._real_tokens[first : first + self.micro_batch])
        self.next_step = step + 1
        return Batch(
            step=step,
            rank=self.dp_rank,
            world_size=self.dp_size,
            first_window=first,
            tokens=tokens,
            doc_starts=starts,
            num_steps=self.num_steps,
            recipe_hash=self.served_recipe_hash,
            doc_sources=sources,
            lead_sources=leads if sources is not None else None,
            real_tokens=real,
        )

    def next_batch(self) -> Optional[Batch]:
        return self.batch_at(self.next_step)

    def state_dict(self) -> Dict[str, Any]:
        return {"next_step": self.next_step, "recipe_hash": self.recipe_hash}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        saved = state.get("recipe_hash")
        if saved and saved != self.served_recipe_hash:
            raise RecipeMismatch(f"{self.path} holds recipe {self.served_recipe_hash}, the saved state expects {saved}")
        self.next_step = int(state["next_step"])

    def close(self) -> None:
        """Nothing to release explicitly: the maps close when the arrays are collected."""

    def _map(self, entry: Dict[str, Any], dtype: np.dtype) -> np.ndarray:
        path = self.path / entry["file"]
        try:
            size = path.stat().st_size
        except OSError as e:
            raise PackedFormatError(f"{path}: {e.strerror}") from e
        if size != entry["size_bytes"]:
            raise PackedFormatError(f"{path}: is {size} bytes, the manifest says {entry['size_bytes']}")
        if size % dtype.itemsize:
            raise PackedFormatError(f"{path}: {size} bytes is not a whole number of {dtype.itemsize}-byte values")
        if size == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    def _map_real_tokens(self, entry: Dict[str, Any]) -> np.ndarray:
        """`real_tokens.u32`, checked as the Rust reader does: one count per window, each 1 to
        `window_tokens`."""
        counts = self._map(entry, np.dtype("<u4"))
        path = self.path / entry["file"]
        if len(counts) != self.num_windows:
            raise PackedFormatError(f"{path}: holds {4 * len(counts)} bytes, not {self.num_windows} counts")
        bad = np.flatnonzero((counts == 0) | (counts > self.window_tokens))
        if len(bad):
            raise PackedFormatError(
                f"{path}: window {bad[0]} has {counts[bad[0]]} real tokens; a window holds 1 to {self.window_tokens}"
            )
        return counts

    def _map_shard(self, entry: Dict[str, Any]) -> np.ndarray:
        flat = self._map(entry, self._dtype)
        if len(flat) % self.window_tokens:
            raise PackedFormatError(f"{self.path / entry['file']}: does not hold whole windows of {self.window_tokens} tokens")
        return flat.reshape(-1, self.window_tokens)


def read_manifest(path: Path) -> Dict[str, Any]:
    manifest = path / "manifest.json"
    try:
        value = json.loads(manifest.read_text())
    except OSError as e:
        raise PackedFormatError(f"{manifest}: {e.strerror} (a packed directory holds manifest.json, written last)") from e
    except json.JSONDecodeError as e:
        raise PackedFormatError(f"{manifest}: not a dsprep manifest: {e}") from e
    if not isinstance(value, dict) or value.get("format") != FORMAT_NAME:
        raise PackedFormatError(f"{manifest}: not a dsprep manifest: field `format` is not {FORMAT_NAME!r}")
    if value.get("format_version") not in range(OLDEST_FORMAT_VERSION, FORMAT_VERSION + 1):
        raise PackedFormatError(
            f"{manifest}: format version {value.get('format_version')} is not supported (this reader reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
        )
    return value
