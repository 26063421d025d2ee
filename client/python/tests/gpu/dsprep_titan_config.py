"""A torchtitan job module for `torchtitan_trainer.sh` (not run in CI: torchtitan's trainer needs
a GPU): `--module dsprep_titan_config --config llama3_dsprep` is torchtitan's llama3 debug
model, its vocabulary widened to cover the quickstart's GPT-2 tokenizer, trained on the dsprep
daemon at DSPREP_ENDPOINT through `DsprepDataLoader`, checked by `configure` against the recipe
(DSPREP_RECIPE) and the daemon's DSPREP_WORLD × DSPREP_MICRO_BATCH. Every batch the trainer takes
is recorded (step, sha256 of its inputs, labels and positions) to DSPREP_RECORD.rank<R>."""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from torchtitan.models.llama3.config_registry import llama3_debugmodel

from dsprep_client.torchtitan import DsprepDataLoader, configure

REPO = Path(__file__).resolve().parents[4]
VOCAB = 50304  # GPT-2's 50257 ids, rounded up to a multiple of 64


class RecordingDataLoader(DsprepDataLoader):
    """`DsprepDataLoader` that appends a digest of every batch it gives the trainer to a file."""

    @dataclass(kw_only=True, slots=True)
    class Config(DsprepDataLoader.Config):
        record: str = ""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.record = f"{config.record}.rank{self.dp_rank}"

    def __iter__(self):
        for inputs, labels in super().__iter__():
            digest = hashlib.sha256()
            for t in (inputs["input"], inputs["positions"], labels):
                digest.update(t.contiguous().numpy().tobytes())
            with open(self.record, "a") as f:
                f.write(f"{self._progress['next_step'] - 1} {digest.hexdigest()}\n")
            yield inputs, labels


def llama3_dsprep():
    config = llama3_debugmodel()
    model = config.model_spec.model
    model.vocab_size = VOCAB
    model.tok_embeddings.num_embeddings = VOCAB
    model.lm_head.out_features = VOCAB
    config.loss.loss_fn.global_vocab_size = VOCAB
    config.validator.enable = False
    config.training.steps = int(os.environ.get("STEPS", "10"))
    config.training.local_batch_size = int(os.environ["DSPREP_MICRO_BATCH"])
    config.training.seq_len = 2048  # torchtitan's default: `configure` sets the recipe's
    config.checkpoint.enable = True
    config.checkpoint.interval = int(os.environ.get("CHECKPOINT_EVERY", "4"))
    config.checkpoint.last_save_model_only = False
    config.dump_folder = os.environ["DUMP_FOLDER"]
    config.metrics.log_freq = 1
    config.dataloader = RecordingDataLoader.Config(endpoint=os.environ["DSPREP_ENDPOINT"], record=os.environ["DSPREP_RECORD"])
    return configure(
        config,
        recipe=os.environ["DSPREP_RECIPE"],
        micro_batch=int(os.environ["DSPREP_MICRO_BATCH"]),
        world_size=int(os.environ["DSPREP_WORLD"]),
        tokenizer_dir=REPO / "config" / "tokenizers" / "gpt2",
    )
