"""The loss per source a trainer reports to `[mix.adaptive]` (protocol v7, `Client.report`):
from its per-token loss (`cross_entropy(..., reduction="none")`), the batch's `input_sources`
and its labels (positions whose label is `IGNORE_INDEX` do not count). Computed on the loss's
device with two `bincount`s and moved to the host once. Call it where the loss is: on the last
pipeline stage; only one rank of a model-parallel group sends it (`Client.reports_loss`).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from .batch import IGNORE_INDEX


def per_source_loss(loss: Any, sources: Any, labels: Any, ignore_index: int = IGNORE_INDEX) -> Dict[int, Tuple[float, int]]:
    """Per source index, (summed loss, counted tokens) over the positions whose label counts.
    `loss`, `sources` and `labels` are tensors of one shape (`[micro_batch, seq_len]`): the
    per-token loss, the source of each input token (`Batch.input_sources`, the torch dataset's
    `input_sources`), and the labels. Sources without counted tokens are left out."""
    import torch

    if loss.shape != sources.shape or loss.shape != labels.shape:
        raise ValueError(
            f"loss {tuple(loss.shape)}, sources {tuple(sources.shape)} and labels {tuple(labels.shape)} "
            "must have one shape (one value per input token)"
        )
    counted = labels.reshape(-1) != ignore_index
    src = sources.reshape(-1)[counted].to(torch.int64)
    if src.numel() == 0:
        return {}
    values = loss.detach().reshape(-1)[counted].to(torch.float64)
    length = int(src.max().item()) + 1
    sums = torch.bincount(src, weights=values, minlength=length).cpu().tolist()
    tokens = torch.bincount(src, minlength=length).cpu().tolist()
    return {s: (sums[s], int(tokens[s])) for s in range(length) if tokens[s] > 0}
