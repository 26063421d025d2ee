"""A torch `IterableDataset` over this rank's batches, served (`ipc://`/`tcp://` endpoint) or
packed (a directory), yielding dicts of torch tensors. torch is imported only when this module
is, so the rest of the package works without it.

`state_dict()` / `load_state_dict()` hold the next step and the recipe hash, which is the
protocol torchdata's `StatefulDataLoader` calls on a dataset. Use it with `batch_size=None`
(every item already is this rank's micro batch). `num_workers=0` is enough (the daemon already
does the loading); with W workers each takes every W-th step, and the loader, which takes the
workers' items in turn, yields them in order.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .batch import Batch
from .client import Client, process_session
from .errors import ConfigError
from .packed import PackedDataset

Source = Union[Client, PackedDataset]


def to_tensors(batch: Batch) -> Dict[str, Any]:
    """A batch as torch tensors: ids, labels and positions as int64 `[micro_batch, seq_len]`
    (labels -100, torch's ignore index, where the next token is padding; positions 0 there),
    `real_tokens` as int64 `[micro_batch]` (each row's tokens before its padding: `seq_len + 1`
    without padding), `cu_seqlens` per row (over the real inputs) and `cu_seqlens_flat` (int32,
    see `Batch.cu_seqlens_flat`), `step` as an int, and where the daemon or pack records them
    (protocol v3, format 3) `input_sources`: int64 `[micro_batch, seq_len]`, the recipe source
    index of every input token, to log the loss per source; from a daemon of protocol v5,
    `segment` (an int): the lineage segment whose recipe produced the step."""
    as_long = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    out = {
        "input_ids": as_long(batch.input_ids),
        "labels": as_long(batch.labels),
        "real_tokens": as_long(batch.real_tokens),
        "position_ids": torch.from_numpy(batch.position_ids),
        "cu_seqlens": [torch.from_numpy(cu) for cu in batch.cu_seqlens],
        "cu_seqlens_flat": torch.from_numpy(batch.cu_seqlens_flat),
        "step": batch.step,
    }
    if batch.input_sources is not None:
        out["input_sources"] = torch.from_numpy(batch.input_sources)
    if batch.segment is not None:
        out["segment"] = batch.segment
    return out


class DsprepIterableDataset(IterableDataset):
    """This rank's batches from `source`: an endpoint string (then `Client(source, **kwargs)`
    connects lazily, in the process that iterates), a packed directory path
    (`PackedDataset(source, **kwargs)`), or a ready `Client`/`PackedDataset`. A daemon serving
    with CURVE: pass `curve_server_key=` and `curve_client_key=` (paths) in `kwargs`, or set
    DSPREP_CURVE_SERVER_KEY / DSPREP_CURVE_CLIENT_KEY, which DataLoader workers inherit."""

    def __init__(self, source: Union[str, Source], **kwargs: Any):
        super().__init__()
        self._spec = source
        self._kwargs = kwargs
        if isinstance(source, str) and source.startswith(("ipc://", "tcp://", "inproc://")):
            # Made here, in the trainer process, so that its DataLoader workers (forked or
            # spawned) share it: together they are one owner of the rank at the daemon.
            self._kwargs.setdefault("session", process_session())
        self._source: Optional[Source] = source if isinstance(source, (Client, PackedDataset)) else None
        self._state: Dict[str, Any] = {"next_step": 0, "recipe_hash": None}

    def source(self) -> Source:
        if self._source is None:
            spec = str(self._spec)
            if spec.startswith(("ipc://", "tcp://", "inproc://")):
                self._source = Client(spec, **self._kwargs)
            else:
                self._source = PackedDataset(spec, **self._kwargs)
            self._source.load_state_dict(self._state)
        return self._source

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        """This rank's steps in order. Under a DataLoader with W workers, worker `w` yields steps
        `n + w, n + w + W, …` (from the state's next step `n`), so the loader, which takes the
        workers' items in turn, still yields every step once, in order."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        source = self.source()
        step = int(self._state["next_step"])
        if int(self._state.get("workers", 1)) != workers:
            step += worker  # a state of the whole rank: this worker starts at its own offset
        while True:
            batch = source.batch_at(step)
            if batch is None:
                return
            step += workers
            self._state = dict(source.state_dict(), next_step=step)
            if workers > 1:
                self._state["workers"] = workers  # this worker's own next step, not the rank's
            yield to_tensors(batch)

    def state_dict(self) -> Dict[str, Any]:
        """The next step to yield (this worker's, under W workers), the recipe hash and the
        stream chain of what was yielded."""
        return dict(self._state)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from the saved step; a different recipe is refused (`RecipeMismatch`)."""
        self._state = {"next_step": int(state["next_step"]), "recipe_hash": state.get("recipe_hash")}
        for key in ("stream_chain", "workers"):
            if state.get(key):
                self._state[key] = state[key]
        if self._source is not None:
            self._source.load_state_dict(self._state)
