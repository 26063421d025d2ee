"""Model parallelism and the data a rank gets, as in the Rust client (client/src/parallel.rs):
only data-parallel ranks differ in data, so a rank asks the daemon for its data-parallel rank's
batches and every rank of one tensor/context/pipeline-parallel group receives the same bytes.

Rank orders, fastest-varying dimension first: "tp-cp-dp-pp" (the default: Megatron-LM's
`tp-cp-ep-dp-pp`, torchtitan's mesh `[pp, dp, cp, tp]`, NeuronX Distributed) and "tp-cp-pp-dp".
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from .errors import ConfigError

RANK_ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp")


def data_parallel(
    rank: int, world_size: int, tensor: int = 1, context: int = 1, pipeline: int = 1, order: str = "tp-cp-dp-pp"
) -> Tuple[int, int]:
    """(data-parallel rank, data-parallel world size) of global `rank` of `world_size`."""
    if order not in RANK_ORDERS:
        raise ConfigError(f"rank order {order!r} is not one of {RANK_ORDERS}")
    model = tensor * context * pipeline
    if model < 1 or world_size % model != 0:
        raise ConfigError(
            f"world size {world_size} is not a multiple of tensor × context × pipeline parallel = "
            f"{tensor} × {context} × {pipeline} = {model}"
        )
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not below world size {world_size}")
    dp_size = world_size // model
    if order == "tp-cp-dp-pp":
        return (rank // (tensor * context)) % dp_size, dp_size
    return rank // model, dp_size


def parallel_from_env(
    tensor: Optional[int], context: Optional[int], pipeline: Optional[int], order: Optional[str]
) -> Tuple[int, int, int, str]:
    """Sizes as given, else DSPREP_TP / DSPREP_CP / DSPREP_PP (default 1) and DSPREP_RANK_ORDER."""

    def read(value: Optional[int], name: str) -> int:
        if value is not None:
            return int(value)
        text = os.environ.get(name)
        if text is None:
            return 1
        try:
            return int(text.strip())
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a whole number") from None

    order = order or os.environ.get("DSPREP_RANK_ORDER", "tp-cp-dp-pp").strip()
    return read(tensor, "DSPREP_TP"), read(context, "DSPREP_CP"), read(pipeline, "DSPREP_PP"), order


def reports_loss(
    rank: int, world_size: int, tensor: int = 1, context: int = 1, pipeline: int = 1, order: str = "tp-cp-dp-pp"
) -> bool:
    """Whether global `rank` reports its data-parallel rank's loss per source (protocol v7): one
    rank per model-parallel group, the last pipeline stage's (it holds the loss) with tensor and
    context rank 0, as the Rust client decides (`Parallelism::reports_loss`)."""
    _, dp_size = data_parallel(rank, world_size, tensor, context, pipeline, order)
    inner = tensor * context
    stage = rank // (inner * dp_size) if order == "tp-cp-dp-pp" else (rank // inner) % pipeline
    return rank % inner == 0 and stage + 1 == pipeline
