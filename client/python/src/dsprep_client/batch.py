"""One rank's rows for one step, the same object whether it was served by the daemon or read
from a packed directory: numpy views of the tokens plus what a trainer derives from the
document boundaries (position ids that restart at each document, cu_seqlens) and from their
sources (which recipe source every input token came from, tokens per source).

Global step `s` is the `world_size × micro_batch` windows from `s × world_size × micro_batch`;
rank `r` takes the `micro_batch` windows at offset `r × micro_batch` (FORMAT.md, "Batches").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Optional

import numpy as np


@dataclass(eq=False)
class Batch:
    step: int
    rank: int
    world_size: int
    #: Index in the stream of row 0's window.
    first_window: int
    #: `[micro_batch, seq_len + 1]` token ids (uint16 or uint32), read-only, usually a view of
    #: the received frame or of the memory map.
    tokens: np.ndarray
    #: Per row, the offsets in the window where a document begins (uint32). A row without a
    #: start at 0 continues a document from the previous window.
    doc_starts: List[np.ndarray] = field(repr=False)
    #: Steps every rank gets in total, once the end of the data is known.
    num_steps: Optional[int] = None
    recipe_hash: str = ""
    #: Served batches (protocol v2): the stream chain around these rows and their step
    #: (`protocol.ReplyChain`), which the client has checked.
    chain: Optional[Any] = field(default=None, repr=False)
    #: Per row, the recipe source index of each document start (uint16), aligned with
    #: `doc_starts`; None from a daemon older than protocol v3 or a pack older than format 3.
    doc_sources: Optional[List[np.ndarray]] = field(default=None, repr=False)
    #: Per row, the source of the document that holds its first token (uint16 `[micro_batch]`).
    lead_sources: Optional[np.ndarray] = field(default=None, repr=False)

    @property
    def micro_batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1]) - 1

    @property
    def input_ids(self) -> np.ndarray:
        """`[micro_batch, seq_len]`: each window's first `seq_len` tokens (a view)."""
        return self.tokens[:, :-1]

    @property
    def labels(self) -> np.ndarray:
        """`[micro_batch, seq_len]`: each window's last `seq_len` tokens (a view)."""
        return self.tokens[:, 1:]

    @cached_property
    def cu_seqlens(self) -> List[np.ndarray]:
        """Per row, flash-attention style cumulative lengths over the inputs: `[0, s1, …, seq_len]`
        (int32), each `s` a document start inside the inputs."""
        seq_len = self.seq_len
        out = []
        for starts in self.doc_starts:
            inner = starts[(starts > 0) & (starts < seq_len)].astype(np.int32)
            out.append(np.concatenate(([0], inner, [seq_len])).astype(np.int32))
        return out

    @cached_property
    def cu_seqlens_flat(self) -> np.ndarray:
        """The rows' cu_seqlens over the flattened `[micro_batch × seq_len]` inputs (int32), as
        varlen attention kernels take them."""
        seq_len = self.seq_len
        parts = [np.zeros(1, np.int32)] + [cu[1:] + i * seq_len for i, cu in enumerate(self.cu_seqlens)]
        return np.concatenate(parts).astype(np.int32)

    @cached_property
    def position_ids(self) -> np.ndarray:
        """`[micro_batch, seq_len]` int64 positions, restarting at 0 at every document start."""
        seq_len = self.seq_len
        last_start = np.zeros((self.micro_batch, seq_len), dtype=np.int64)
        for i, cu in enumerate(self.cu_seqlens):
            last_start[i, cu[1:-1]] = cu[1:-1]
        np.maximum.accumulate(last_start, axis=1, out=last_start)
        return np.arange(seq_len, dtype=np.int64)[None, :] - last_start

    @cached_property
    def input_sources(self) -> Optional[np.ndarray]:
        """`[micro_batch, seq_len]` int64: the recipe source index of every input token, to mask a
        loss per source with (None without `doc_sources`)."""
        if self.doc_sources is None or self.lead_sources is None:
            return None
        seq_len = self.seq_len
        out = np.empty((self.micro_batch, seq_len), dtype=np.int64)
        for i, (starts, sources) in enumerate(zip(self.doc_starts, self.doc_sources)):
            inside = starts < seq_len
            cuts = np.concatenate(([0], starts[inside].astype(np.int64), [seq_len]))
            values = np.concatenate(([self.lead_sources[i]], sources[inside])).astype(np.int64)
            out[i] = np.repeat(values, np.diff(cuts))
        return out

    def source_token_counts(self) -> Optional[Dict[int, int]]:
        """Input tokens per source index over the whole batch (None without `doc_sources`)."""
        sources = self.input_sources
        if sources is None:
            return None
        values, counts = np.unique(sources, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts)}

    def window_indices(self) -> range:
        return range(self.first_window, self.first_window + self.micro_batch)
