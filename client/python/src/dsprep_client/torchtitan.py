"""torchtitan's data loader over dsprep: `DsprepDataLoader` is a torchtitan
`ParallelAwareDataloader` (so `BaseDataLoader`) whose items are torchtitan's batch,
`({"input": ids, "positions": positions}, labels)`: int64 `[local_batch_size, seq_len]`, the
positions restarting at 0 at every document start (torchtitan's block-causal document mask
reads them), the labels -100 where the next token is padding. `configure(config, ...)` fills and
checks a torchtitan `Trainer.Config` from the recipe and the daemon's layout.

Supported torchtitan versions: `SUPPORTED_TORCHTITAN` (0.3.0). Another version is refused on
import (`UnsupportedTorchtitan`), as its data loader and trainer interfaces change between
releases.

Its state in torchtitan's DCP checkpoint is one entry, `"dsprep"`, the same on every rank (a
global step of dsprep is the same on every rank): a resume at another data-parallel size whose
global batch (data-parallel size × local batch) is the same continues at the same step, where
torchtitan's own loaders assert the same data-parallel size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from .errors import ConfigError

#: The torchtitan releases this adapter is tested with (client/python/tests/test_torchtitan.py).
SUPPORTED_TORCHTITAN = ("0.3.0",)


class UnsupportedTorchtitan(ConfigError, ImportError):
    """The installed torchtitan is not a release this adapter supports."""


def _check_version() -> str:
    try:
        found = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        raise UnsupportedTorchtitan(
            f"dsprep_client.torchtitan needs torchtitan ({' or '.join(SUPPORTED_TORCHTITAN)}): "
            f"pip install torchtitan=={SUPPORTED_TORCHTITAN[-1]}"
        ) from None
    if found not in SUPPORTED_TORCHTITAN:
        raise UnsupportedTorchtitan(
            f"torchtitan {found} is installed; dsprep_client.torchtitan supports torchtitan "
            f"{', '.join(SUPPORTED_TORCHTITAN)} (its data loader and trainer interfaces change between releases): "
            f"pip install torchtitan=={SUPPORTED_TORCHTITAN[-1]}, or feed DsprepIterableDataset yourself"
        )
    return found


TORCHTITAN_VERSION = _check_version()

import torch  # noqa: E402
from torch.utils.data import IterableDataset  # noqa: E402
from torchtitan.components.dataloader import ParallelAwareDataloader  # noqa: E402

from ._recipe_check import (  # noqa: E402
    check_layout,
    elastic_step,
    recipe_facts,
    require_equal,
    require_vocab_covers,
)
from .torch_dataset import DsprepIterableDataset  # noqa: E402

#: The key of the loader's state in torchtitan's checkpoint, the same on every rank.
STATE_KEY = "dsprep"
STATE_VERSION = 1

TitanBatch = Tuple[Dict[str, torch.Tensor], torch.Tensor]


def titan_batch(item: Dict[str, Any]) -> TitanBatch:
    """A `DsprepIterableDataset` item as torchtitan's batch."""
    return {"input": item["input_ids"], "positions": item["position_ids"]}, item["labels"]


class _TitanItems(IterableDataset):
    """The items of a `DsprepIterableDataset` as (progress, torchtitan batch): progress is the
    step and the dataset's state right after it, which the loader keeps for what it yielded
    (DataLoader workers prefetch ahead of the trainer)."""

    def __init__(self, inner: DsprepIterableDataset, seq_len: Optional[int], local_batch_size: Optional[int]):
        super().__init__()
        self.inner = inner
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size

    def __iter__(self) -> Iterator[Tuple[Dict[str, Any], TitanBatch]]:
        checked = False
        for item in self.inner:
            if not checked:
                shape = tuple(item["input_ids"].shape)
                check_layout(
                    "torchtitan", self.seq_len, "training.seq_len", self.local_batch_size, "training.local_batch_size", shape[1], shape[0]
                )
                checked = True
            state = self.inner.state_dict()
            chain = state.get("stream_chain") if "workers" not in state else None
            progress = {"step": int(item["step"]), "recipe_hash": state.get("recipe_hash"), "stream_chain": chain}
            yield progress, titan_batch(item)


class DsprepDataLoader(ParallelAwareDataloader):
    """torchtitan's data loader over a dsprep daemon (or a packed directory): this data-parallel
    rank's micro batches as `({"input", "positions"}, labels)`.

    Set it as the job's `dataloader` (`DsprepDataLoader.Config(endpoint="ipc://dsprep.sock")`);
    torchtitan's trainer builds it with its data-parallel rank and size, `training.seq_len` and
    `training.local_batch_size` (or the pipeline's micro batch size), which must equal the recipe's
    `seq_len` and the daemon's `--micro-batch` (checked on the first batch). Serve
    `--world-size` = torchtitan's data-parallel size (ranks / (TP × CP × PP)).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        endpoint: str = ""
        """The daemon's endpoint (`ipc://…`, `tcp://…`) or a `dsprep pack` directory."""

        micro_batch: int | None = None
        """A packed directory's micro batch (default: the trainer's local batch size)."""

        recipe_hash: str | None = None
        """Refuse a daemon serving another recipe (hex)."""

        timeout: float = 30.0
        """Seconds one request waits for the daemon."""

        attempts: int = 4
        """Requests without a reply before `DaemonGone`."""

        curve_server_key: str | None = None
        """The daemon's CURVE public key file (else DSPREP_CURVE_SERVER_KEY)."""

        curve_client_key: str | None = None
        """This trainer's CURVE secret key file (else DSPREP_CURVE_CLIENT_KEY)."""

    def __init__(
        self,
        config: "DsprepDataLoader.Config",
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any = None,
        seq_len: Optional[int] = None,
        local_batch_size: Optional[int] = None,
        snapshot_every_n_steps: Optional[int] = None,
        **kwargs: Any,
    ):
        if not config.endpoint:
            raise ConfigError("DsprepDataLoader.Config.endpoint is empty: set it to the daemon's endpoint or a packed directory")
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        source: Dict[str, Any] = {"rank": dp_rank, "world_size": dp_world_size}
        if config.endpoint.startswith(("ipc://", "tcp://", "inproc://")):
            # torchtitan gives the data-parallel rank and size already: no TP/CP/PP mapping here.
            source.update(
                tensor_parallel=1,
                context_parallel=1,
                pipeline_parallel=1,
                rank_order="tp-cp-dp-pp",
                recipe_hash=config.recipe_hash,
                timeout=config.timeout,
                attempts=config.attempts,
                curve_server_key=config.curve_server_key,
                curve_client_key=config.curve_client_key,
            )
        else:
            mb = config.micro_batch or local_batch_size
            if not mb:
                raise ConfigError("a packed directory needs DsprepDataLoader.Config.micro_batch or the trainer's local batch size")
            source.update(micro_batch=int(mb), recipe_hash=config.recipe_hash)
        self._dsprep = DsprepIterableDataset(config.endpoint, **source)
        self._progress: Dict[str, Any] = {"next_step": 0, "recipe_hash": config.recipe_hash, "stream_chain": None}
        loader_kwargs: Dict[str, Any] = {
            "batch_size": None,  # every item already is this rank's micro batch
            "num_workers": config.num_workers,
            "persistent_workers": config.persistent_workers,
            "pin_memory": config.pin_memory,
            "prefetch_factor": config.prefetch_factor,
        }
        loader_kwargs.update(kwargs)
        super().__init__(
            _TitanItems(self._dsprep, seq_len, local_batch_size), dp_rank=dp_rank, dp_world_size=dp_world_size, **loader_kwargs
        )

    def __iter__(self) -> Iterator[TitanBatch]:  # type: ignore[override]
        """torchtitan's batches in step order. Without DataLoader workers or pinned memory the
        items are taken straight from the dataset: `batch_size=None` makes the DataLoader a
        pass-through, and skipping its machinery saves ~0.2 ms a step (bench/titan_overhead.py)."""
        direct = self.num_workers == 0 and not self.pin_memory
        items = iter(self.dataset) if direct else super().__iter__()
        for progress, batch in items:
            self._progress = {
                "next_step": progress["step"] + 1,
                "recipe_hash": progress["recipe_hash"],
                "stream_chain": progress["stream_chain"],
            }
            yield batch

    def state_dict(self) -> Dict[str, Any]:
        """`{"dsprep": JSON}`: the next step this rank's trainer takes (one past the last batch it
        was given), the recipe hash, the stream chain there, and the data-parallel size and local
        batch it was saved at. The same on every rank after the same step, so DCP keeps one copy."""
        state = dict(self._progress, version=STATE_VERSION, dp_world_size=self.dp_world_size)
        state["local_batch_size"] = self.local_batch_size
        return {STATE_KEY: json.dumps(state, sort_keys=True)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Continue at the saved step, at this data-parallel size or another one with the same
        global batch (else `ConfigError` naming both). An empty state (a fresh job) is a no-op."""
        if not state_dict:
            return
        if STATE_KEY not in state_dict:
            raise ConfigError(
                f"the checkpoint's dataloader state has no {STATE_KEY!r} entry (keys: {sorted(state_dict)}): "
                "it was saved by another data loader, so dsprep cannot know where this job stands"
            )
        state = json.loads(state_dict[STATE_KEY])
        if int(state.get("version", 0)) != STATE_VERSION:
            raise ConfigError(f"dsprep loader state version {state.get('version')} is not {STATE_VERSION}")
        saved_world, saved_mb = int(state["dp_world_size"]), state.get("local_batch_size")
        if saved_mb is not None:
            elastic_step(saved_world, int(saved_mb), self.dp_world_size, self.local_batch_size, "training.local_batch_size")
        self._progress = {k: state.get(k) for k in ("next_step", "recipe_hash", "stream_chain")}
        inner = {"next_step": int(state["next_step"]), "recipe_hash": state.get("recipe_hash")}
        if state.get("stream_chain"):
            inner["stream_chain"] = state["stream_chain"]
        self._dsprep.load_state_dict(inner)


def configure(
    config: Any,
    *,
    endpoint: Optional[str] = None,
    recipe: Union[str, Path, None] = None,
    micro_batch: Optional[int] = None,
    world_size: Optional[int] = None,
    tokenizer_dir: Union[str, Path, None] = None,
    **loader: Any,
) -> Any:
    """Fill and check torchtitan `Trainer.Config` `config` for dsprep, in place (and return it).

    - `endpoint`: sets `config.dataloader = DsprepDataLoader.Config(endpoint=..., **loader)`.
    - `recipe` (the recipe file the daemon serves): `training.seq_len` is set to its
      `[packing] seq_len` where left at torchtitan's default, else must equal it; the model's
      `vocab_size` must cover the recipe tokenizer's ids; `hf_assets_path` (the folder
      torchtitan's tokenizer loads `tokenizer.json` from) must hold the recipe's tokenizer
      (`tokenizer_dir` sets it first).
    - `micro_batch` (the daemon's `--micro-batch`): `training.local_batch_size` must equal it
      (without pipeline parallelism; with it, `parallelism.pipeline_parallel_microbatch_size`).
    - `world_size` (the daemon's `--world-size`): with `training.global_batch_size` set, it must
      be `world_size × micro_batch × gradient accumulation`.

    A mismatch raises `ConfigError` with both values and the setting to change.
    """
    if endpoint is not None:
        config.dataloader = DsprepDataLoader.Config(endpoint=endpoint, **loader)
    if not isinstance(config.dataloader, DsprepDataLoader.Config):
        raise ConfigError(
            f"config.dataloader is a {type(config.dataloader).__qualname__}, not DsprepDataLoader.Config: "
            "pass endpoint= (or set config.dataloader = DsprepDataLoader.Config(endpoint=...))"
        )
    training = config.training
    if recipe is not None:
        facts = recipe_facts(recipe)
        default_seq_len = type(training)().seq_len
        if training.seq_len == default_seq_len and training.seq_len != facts.seq_len:
            training.seq_len = facts.seq_len
        require_equal("the window", "training.seq_len", training.seq_len, f"{facts.recipe} [packing] seq_len", facts.seq_len)
        spec = getattr(config, "model_spec", None)
        vocab = getattr(getattr(spec, "model", None), "vocab_size", None)
        if vocab is not None:
            require_vocab_covers("the model config's vocab_size", int(vocab), facts.tokenizer_path, facts.vocab_size)
        loss_fn = getattr(getattr(config, "loss", None), "loss_fn", None)
        loss_vocab = getattr(loss_fn, "global_vocab_size", None)
        if loss_vocab is not None and vocab is not None:
            if int(loss_vocab) != int(vocab):
                raise ConfigError(
                    f"the loss's vocabulary: loss.loss_fn.global_vocab_size is {loss_vocab}, the model's vocab_size is "
                    f"{vocab}; set loss.loss_fn.global_vocab_size = {vocab}"
                )
        if tokenizer_dir is not None:
            config.hf_assets_path = str(tokenizer_dir)
        found = Path(config.hf_assets_path) / "tokenizer.json"
        if not found.is_file():
            raise ConfigError(
                f"torchtitan loads its tokenizer from hf_assets_path/tokenizer.json, and {found} does not exist: set "
                f"hf_assets_path (--hf_assets_path) to a folder holding the recipe's tokenizer {facts.tokenizer_path}"
            )
        if found.resolve() != facts.tokenizer_path.resolve() and found.read_bytes() != facts.tokenizer_path.read_bytes():
            raise ConfigError(
                f"torchtitan's tokenizer {found} (hf_assets_path) is not the recipe's {facts.tokenizer_path}: "
                "set hf_assets_path to a folder holding the recipe's tokenizer.json"
            )
    if micro_batch is not None:
        if getattr(config.parallelism, "pipeline_parallel_degree", 1) > 1:
            setting, value = "parallelism.pipeline_parallel_microbatch_size", config.parallelism.pipeline_parallel_microbatch_size
        else:
            setting, value = "training.local_batch_size", training.local_batch_size
        require_equal("the per-rank batch", setting, value, "dsprep serve --micro-batch", int(micro_batch))
        global_batch = getattr(training, "global_batch_size", -1)
        if world_size is not None and global_batch is not None and global_batch > 0:
            step = int(world_size) * int(micro_batch)
            if global_batch % step:
                raise ConfigError(
                    f"training.global_batch_size is {global_batch}, not a multiple of dsprep's global step, --world-size "
                    f"{world_size} × --micro-batch {micro_batch} = {step}: set training.global_batch_size to a multiple of {step}"
                )
    return config


__all__ = [
    "DsprepDataLoader",
    "SUPPORTED_TORCHTITAN",
    "STATE_KEY",
    "TORCHTITAN_VERSION",
    "UnsupportedTorchtitan",
    "configure",
    "titan_batch",
]
