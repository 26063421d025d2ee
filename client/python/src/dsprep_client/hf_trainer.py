"""The HF `transformers` Trainer over dsprep: `DsprepTrainer` is a `Trainer` whose training data is
this rank's batches from the daemon (`DsprepHFDataset`), and whose resume through the Trainer's
own checkpoint (`train(resume_from_checkpoint=...)`) continues at exactly the next step.

Items are `{"input_ids", "labels", "position_ids"}`, int64 `[micro_batch, seq_len]`: the labels
are -100 where the next token is padding (`[packing] strategy = "best_fit"`; a padded row's
padding sits after its real tokens, so a causal model needs no attention mask), and the position
ids restart at 0 at every document start.

What the Trainer does differently here, and why:

- Its data loader is not `accelerator.prepare`d: accelerate would shard (or dispatch from rank 0)
  an `IterableDataset`, and every dsprep rank already receives its own slice from the daemon.
- `args.ignore_data_skip` is set: the Trainer would fast-forward by asking for every step again
  from 0; dsprep's state (`dsprep_state.json` in every `checkpoint-N` folder, written by
  `DsprepStateCallback`) holds the next step instead.
- An `IterableDataset` has no length: set `TrainingArguments.max_steps`.

Tested with transformers 5.24 (`client/python/tests/test_hf_trainer.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

import transformers

from .errors import ConfigError

#: The transformers major release this adapter supports (tested with 5.24).
SUPPORTED_TRANSFORMERS_MAJOR = 5
if int(transformers.__version__.split(".")[0]) != SUPPORTED_TRANSFORMERS_MAJOR:
    raise ConfigError(
        f"transformers {transformers.__version__} is installed; dsprep_client.hf_trainer supports transformers "
        f"{SUPPORTED_TRANSFORMERS_MAJOR}.x (its Trainer's data loading and checkpoint interfaces): pip install 'transformers>=5,<6'"
    )

import torch  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402
from transformers import Trainer, TrainerCallback  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint  # noqa: E402

from ._recipe_check import check_layout, elastic_step, recipe_facts, require_vocab_covers  # noqa: E402
from .torch_dataset import DsprepIterableDataset  # noqa: E402

#: The file in each Trainer checkpoint folder that holds dsprep's state.
STATE_FILE = "dsprep_state.json"
STATE_VERSION = 1
#: The keys an item passes to the model.
ITEM_KEYS = ("input_ids", "labels", "position_ids")


class DsprepHFDataset(IterableDataset):
    """This rank's batches for the HF Trainer, over `DsprepIterableDataset(source, **kwargs)` (an
    endpoint or a packed directory; rank and world size from RANK/WORLD_SIZE unless given). Each
    item is `(progress, {"input_ids", "labels", "position_ids"})`; `DsprepTrainer`'s loader keeps
    the progress of what it gave the model and passes the dict on."""

    def __init__(self, source: Union[str, DsprepIterableDataset], **kwargs: Any):
        super().__init__()
        self.inner = source if isinstance(source, DsprepIterableDataset) else DsprepIterableDataset(source, **kwargs)
        self.micro_batch: Optional[int] = None  # the Trainer's per-device batch, checked on the first batch

    def __iter__(self) -> Iterator[Any]:
        checked = False
        for item in self.inner:
            if not checked:
                shape = tuple(item["input_ids"].shape)
                check_layout("the HF Trainer", None, "", self.micro_batch, "TrainingArguments.per_device_train_batch_size", shape[1], shape[0])
                checked = True
            state = self.inner.state_dict()
            chain = state.get("stream_chain") if "workers" not in state else None
            progress = {"step": int(item["step"]), "recipe_hash": state.get("recipe_hash"), "stream_chain": chain}
            yield progress, {key: item[key] for key in ITEM_KEYS}

    def state_dict(self) -> Dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


class _ProgressLoader(DataLoader):
    """A DataLoader (`batch_size=None`) that remembers the step after the last item it yielded."""

    def __init__(self, dataset: DsprepHFDataset, **kwargs: Any):
        super().__init__(dataset, batch_size=None, **kwargs)
        self.progress: Dict[str, Any] = {}

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:  # type: ignore[override]
        for progress, item in super().__iter__():
            self.progress = {"next_step": progress["step"] + 1, "recipe_hash": progress["recipe_hash"], "stream_chain": progress["stream_chain"]}
            yield item


class DsprepStateCallback(TrainerCallback):
    """Writes dsprep's state into every checkpoint folder the Trainer saves (process 0; the state
    is the same on every rank after the same optimizer step)."""

    def __init__(self, trainer: "DsprepTrainer"):
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not args.should_save:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if folder.is_dir():
            out = self.trainer.dsprep_state()
            tmp = folder / (STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(out, sort_keys=True))
            os.replace(tmp, folder / STATE_FILE)


class DsprepTrainer(Trainer):
    """`transformers.Trainer` trained on `train_dataset`, a `DsprepHFDataset`.

    `recipe` (the recipe file the daemon serves): the model's `config.vocab_size` must cover the
    recipe tokenizer's ids and its `max_position_embeddings` the recipe's `seq_len`. The Trainer's
    `per_device_train_batch_size` must equal the daemon's `--micro-batch` (checked on the first
    batch), its world size the daemon's `--world-size`. A mismatch raises `ConfigError` naming
    both values and the setting to change.
    """

    def __init__(self, *args: Any, recipe: Union[str, Path, None] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.train_dataset, DsprepHFDataset):
            raise ConfigError(
                f"DsprepTrainer trains on a DsprepHFDataset, not {type(self.train_dataset).__qualname__}: "
                "pass train_dataset=DsprepHFDataset('ipc://dsprep.sock')"
            )
        if self.args.max_steps is None or self.args.max_steps <= 0:
            raise ConfigError("TrainingArguments.max_steps is not set: dsprep's stream has no length the Trainer can count epochs in")
        self.args.ignore_data_skip = True  # dsprep's state, not a fast-forward from step 0
        self.train_dataset.micro_batch = self.args.per_device_train_batch_size
        inner = self.train_dataset.inner
        kwargs_world = inner._kwargs.get("world_size")
        if kwargs_world is not None and int(kwargs_world) != self.args.world_size:
            raise ConfigError(
                f"the dataset's world_size is {kwargs_world}, the Trainer's world size is {self.args.world_size}: "
                "serve and ask with --world-size = the number of trainer processes"
            )
        if recipe is not None:
            facts = recipe_facts(recipe)
            config = getattr(self.model, "config", None)
            vocab = getattr(config, "vocab_size", None)
            if vocab is not None:
                require_vocab_covers("model.config.vocab_size", int(vocab), facts.tokenizer_path, facts.vocab_size)
            positions = getattr(config, "max_position_embeddings", None)
            if positions is not None and int(positions) < facts.seq_len:
                raise ConfigError(
                    f"model.config.max_position_embeddings is {positions}, the recipe {facts.recipe} [packing] seq_len is "
                    f"{facts.seq_len}: set max_position_embeddings >= {facts.seq_len}"
                )
        self._loader: Optional[_ProgressLoader] = None
        self._resumed: Dict[str, Any] = {}
        self.add_callback(DsprepStateCallback(self))

    def get_train_dataloader(self) -> DataLoader:
        """This rank's batches, not sharded again by accelerate (see the module's docstring)."""
        args = self.args
        extra: Dict[str, Any] = {"num_workers": args.dataloader_num_workers, "pin_memory": args.dataloader_pin_memory}
        if args.dataloader_num_workers > 0:
            extra.update(persistent_workers=args.dataloader_persistent_workers, prefetch_factor=args.dataloader_prefetch_factor)
        self._loader = _ProgressLoader(self.train_dataset, **extra)
        return self._loader

    def dsprep_state(self) -> Dict[str, Any]:
        """What `DsprepStateCallback` saves: the next step (one past the last batch the model was
        given), the recipe hash, the stream chain there, the world size and micro batch."""
        progress = (self._loader.progress if self._loader is not None else {}) or self._resumed
        state = {k: progress.get(k) for k in ("next_step", "recipe_hash", "stream_chain")}
        if state["next_step"] is None:
            state["next_step"] = 0
        state.update(version=STATE_VERSION, world_size=self.args.world_size, micro_batch=self.args.per_device_train_batch_size)
        return state

    def train(self, resume_from_checkpoint: Union[str, bool, None] = None, *args: Any, **kwargs: Any) -> Any:
        """`Trainer.train`; with `resume_from_checkpoint` (a folder, or True: the newest in
        `output_dir`) dsprep continues at the step saved in that checkpoint's `dsprep_state.json`."""
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume_from_checkpoint:
            self._load_dsprep_state(Path(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_dsprep_state(self, folder: Path) -> None:
        path = folder / STATE_FILE
        if not path.is_file():
            raise ConfigError(
                f"the checkpoint {folder} has no {STATE_FILE}: it was not saved by DsprepTrainer (or the job died "
                "between the Trainer's save and dsprep's); resume from an earlier checkpoint"
            )
        state = json.loads(path.read_text())
        if int(state.get("version", 0)) != STATE_VERSION:
            raise ConfigError(f"{path}: dsprep state version {state.get('version')} is not {STATE_VERSION}")
        elastic_step(
            int(state["world_size"]), int(state["micro_batch"]), self.args.world_size, self.args.per_device_train_batch_size,
            "TrainingArguments.per_device_train_batch_size",
        )
        inner = {"next_step": int(state["next_step"]), "recipe_hash": state.get("recipe_hash")}
        if state.get("stream_chain"):
            inner["stream_chain"] = state["stream_chain"]
        self._resumed = dict(inner)
        self.train_dataset.load_state_dict(inner)


__all__ = ["SUPPORTED_TRANSFORMERS_MAJOR", "DsprepHFDataset", "DsprepStateCallback", "DsprepTrainer", "ITEM_KEYS", "STATE_FILE"]
