"""One rank's rows for one step, the same object whether it was served by the daemon or read
from a packed directory: numpy views of the tokens plus what a trainer derives from the
document boundaries (position ids that restart at each document, cu_seqlens), from each row's
real-token count (labels that ignore padding) and from the documents' sources (which recipe
source every input token came from, tokens per source).

Global step `s` is the `world_size × micro_batch` windows from `s × world_size × micro_batch`;
rank `r` takes the `micro_batch` windows at offset `r × micro_batch` (FORMAT.md, "Batches").

Padding (`[packing] strategy = "best_fit"`): a row's `tokens[real_tokens:]` are the pad id. It
is told by `real_tokens` only, never by comparing ids (the default pad is the EOS, also a real
token). A row whose `real_tokens` is the whole window (every row without `best_fit`) has no
padding: its labels are all the next tokens and its cu_seqlens end at `seq_len`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Optional

import numpy as np

#: The label of a position whose next token is padding: torch's `cross_entropy` ignores it.
IGNORE_INDEX = -100


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
    #: Per row, the tokens before its padding (uint32 `[micro_batch]`, 1 to `seq_len + 1`):
    #: protocol v4 / format 5; left out (None), every row is whole.
    real_tokens: Optional[np.ndarray] = None
    #: Served batches (protocol v5): the index in the stream's lineage of the segment whose
    #: recipe produced this step (0: the first recipe), and that recipe's hash (`recipe_hash` is
    #: the daemon's, its newest); None from an older daemon or a packed directory.
    segment: Optional[int] = None
    segment_recipe_hash: Optional[str] = None

    def __post_init__(self) -> None:
        if self.real_tokens is None:
            self.real_tokens = np.full(self.micro_batch, self.tokens.shape[1], dtype=np.uint32)

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

    @cached_property
    def labels(self) -> np.ndarray:
        """`[micro_batch, seq_len]` int64 (a copy): label `i` is token `i + 1` of the window, or
        `IGNORE_INDEX` (-100) where that token is padding (`i + 1 >= real_tokens`)."""
        out = self.tokens[:, 1:].astype(np.int64)
        padding = np.arange(1, self.seq_len + 1)[None, :] >= self.real_tokens.astype(np.int64)[:, None]
        out[padding] = IGNORE_INDEX
        return out

    @cached_property
    def cu_seqlens(self) -> List[np.ndarray]:
        """Per row, flash-attention style cumulative lengths over the real inputs:
        `[0, s1, …, end]` (int32), each `s` a document start inside them, `end` where the inputs'
        padding begins (`min(real_tokens, seq_len)`: `seq_len` in a row without padding)."""
        out = []
        for starts, real in zip(self.doc_starts, self.real_tokens):
            end = min(int(real), self.seq_len)
            inner = starts[(starts > 0) & (starts < end)]
            out.append(np.concatenate(([0], inner, [end])).astype(np.int32))
        return out

    @cached_property
    def cu_seqlens_flat(self) -> np.ndarray:
        """The rows' cu_seqlens over the flattened `[micro_batch × seq_len]` inputs (int32), as
        varlen attention kernels take them: row `i`'s documents at offset `i × seq_len`, and a
        row's padding, if any, one more segment of its own (its labels are all `IGNORE_INDEX`),
        so that the segments still cover every input position and the last value is
        `micro_batch × seq_len`."""
        seq_len = self.seq_len
        parts = [np.zeros(1, np.int64)]
        for i, cu in enumerate(self.cu_seqlens):
            parts.append(cu[1:].astype(np.int64) + i * seq_len)
            if cu[-1] < seq_len:
                parts.append(np.array([(i + 1) * seq_len]))
        return np.concatenate(parts).astype(np.int32)

    @cached_property
    def position_ids(self) -> np.ndarray:
        """`[micro_batch, seq_len]` int64 positions, restarting at 0 at every document start, and
        0 on the padding."""
        out = np.zeros((self.micro_batch, self.seq_len), dtype=np.int64)
        for i, cu in enumerate(self.cu_seqlens):
            cu = cu.astype(np.int64)
            out[i, : cu[-1]] = np.arange(cu[-1]) - np.repeat(cu[:-1], np.diff(cu))
        return out

    @cached_property
    def input_sources(self) -> Optional[np.ndarray]:
        """`[micro_batch, seq_len]` int64: the recipe source index of every input token, to mask a
        loss per source with (None without `doc_sources`). Padding counts as its row's last
        document's; mask it with `labels`."""
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
