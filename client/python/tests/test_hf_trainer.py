"""The HF Trainer adapter against the real `transformers` (5.24) and the real daemon: a tiny Llama
(built in the test, nothing downloaded) trained by `DsprepTrainer`; a run killed (SIGKILL, with its
daemon) after its checkpoint and resumed through the Trainer's own `resume_from_checkpoint`
gives the model exactly the batches, and the losses, of an uninterrupted run; the items carry
`input_ids`, `labels` (-100 on padding) and `position_ids`; a setting that does not match the
daemon or the recipe is refused with both values named.

CI installs transformers (`client/python/extras-venv.sh`) and sets DSPREP_REQUIRE_EXTRAS=1: there a
missing transformers fails these tests instead of skipping them."""


import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from extras import extra

torch = extra("torch")
extra("transformers")

from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments  # noqa: E402

from dsprep_client import ConfigError, PackedDataset  # noqa: E402
from dsprep_client.hf_trainer import STATE_FILE, DsprepHFDataset, DsprepTrainer  # noqa: E402

QUICKSTART = Path(__file__).resolve().parents[3] / "config" / "quickstart.toml"
WORKER = Path(__file__).with_name("hf_trainer_worker.py")


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_killed_run_resumed_from_the_trainers_checkpoint_sees_the_uninterrupted_batches(daemon_factory, packed_dir, tmp_path):
    """6 optimizer steps × 2 accumulated micro batches of 1 window. The uninterrupted run; then a
    run killed with its daemon after its step-3 checkpoint, during step 5 (9 batches in), and
    resumed (`resume_from_checkpoint=True`, the daemon with `--resume latest`): the 6 batches up to
    the checkpoint and the 6 after the resume are the uninterrupted run's 12, which are the packed
    stream's steps 0..11, and steps 4..6 log the same losses."""

    def run(daemon, out: str, mode: str) -> subprocess.Popen:
        cmd = [sys.executable, str(WORKER), daemon.endpoint, str(tmp_path / f"{out}-ckpt"), str(tmp_path / out), "6", mode, str(QUICKSTART)]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def finish(proc: subprocess.Popen) -> None:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-4000:]

    whole = run(daemon_factory(world_size=1, micro_batch=1, prefetch=8), "whole", "fresh")
    serve = ["--state-dir", str(tmp_path / "state"), "--checkpoint-every", "1", "--keep-checkpoints", "100"]
    first = daemon_factory(world_size=1, micro_batch=1, prefetch=8, in_dir=tmp_path / "d", extra=serve)
    killed = run(first, "killed", "hold:9")
    deadline = time.monotonic() + 240
    while len(lines(tmp_path / "killed.jsonl")) < 9 or not (tmp_path / "killed-ckpt" / "checkpoint-3" / STATE_FILE).exists():
        assert killed.poll() is None, killed.stderr.read()[-4000:]
        assert time.monotonic() < deadline, "the run did not reach its 9th batch"
        time.sleep(0.1)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    first.kill()
    finish(whole)

    second = daemon_factory(world_size=1, micro_batch=1, prefetch=8, in_dir=tmp_path / "d", extra=serve + ["--resume", "latest"])
    finish(run(second, "killed", "resume"))  # the same output dir: resumes from its checkpoint-3

    uninterrupted, seen = lines(tmp_path / "whole.jsonl"), lines(tmp_path / "killed.jsonl")
    assert len(uninterrupted) == 12 and len(seen) == 9 + 6
    assert seen[:6] + seen[9:] == uninterrupted, "every batch after the resume is the uninterrupted run's"
    packed = PackedDataset(packed_dir, micro_batch=1, rank=0, world_size=1)
    for step, got in enumerate(uninterrupted):
        want = packed.batch_at(step)
        assert got["input_ids"] == want.input_ids.astype(np.int64).tolist(), step
        assert got["labels"] == want.labels.tolist() and got["position_ids"] == want.position_ids.tolist(), step
    whole_loss = {x["step"]: x["loss"] for x in lines(tmp_path / "whole.loss.jsonl")}
    resumed_loss = {x["step"]: x["loss"] for x in lines(tmp_path / "killed.loss.jsonl")[-3:]}
    assert sorted(resumed_loss) == [4, 5, 6]
    for step, loss in resumed_loss.items():
        assert loss == pytest.approx(whole_loss[step], rel=1e-5), f"step {step}"


def tiny_model(vocab: int = 50304, positions: int = 512) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=positions,
    )
    return LlamaForCausalLM(config)


def arguments(tmp_path: Path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, report_to="none", use_cpu=True, disable_tqdm=True, **kw)


def test_items_and_refusals(daemon_factory, best_fit_recipe, best_fit_dir, tmp_path):
    daemon = daemon_factory(recipe=best_fit_recipe, world_size=1, micro_batch=4, prefetch=8)
    ds = DsprepHFDataset(daemon.endpoint, rank=0, world_size=1, timeout=10)
    trainer = DsprepTrainer(model=tiny_model(), args=arguments(tmp_path, per_device_train_batch_size=4), train_dataset=ds, recipe=QUICKSTART)
    reference = PackedDataset(best_fit_dir, micro_batch=4)
    ds.load_state_dict({"next_step": 120})  # the best_fit stream's first padded windows are near step 122
    padded = 0
    for step, item in zip(range(120, 140), trainer.get_train_dataloader()):
        assert sorted(item) == ["input_ids", "labels", "position_ids"]
        want = reference.batch_at(step)
        assert all(v.dtype == torch.int64 and v.shape == (4, 512) for v in item.values())
        assert np.array_equal(item["labels"].numpy(), want.labels) and np.array_equal(item["position_ids"].numpy(), want.position_ids)
        for row, real in enumerate(want.real_tokens.tolist()):
            assert torch.all(item["labels"][row, real - 1 :] == -100), "-100 from the last real token on"
            padded += real < 513
    assert padded > 0, "the steps compared hold padded rows"
    assert trainer.dsprep_state()["next_step"] == 140

    # The per-device batch against the daemon's --micro-batch, named with both values.
    plain = daemon_factory(world_size=1, micro_batch=4, prefetch=4)
    wrong = DsprepTrainer(model=tiny_model(), args=arguments(tmp_path, per_device_train_batch_size=3), train_dataset=DsprepHFDataset(plain.endpoint, rank=0, world_size=1, timeout=10))
    with pytest.raises(ConfigError, match=r"TrainingArguments\.per_device_train_batch_size is 3, while dsprep's is 4 \(dsprep serve --micro-batch\)"):
        next(iter(wrong.get_train_dataloader()))
    # The model against the recipe's tokenizer and seq_len.
    with pytest.raises(ConfigError, match=r"model\.config\.vocab_size is 1000, the recipe's tokenizer .*gpt2/tokenizer.json has ids up to 50256"):
        DsprepTrainer(model=tiny_model(vocab=1000), args=arguments(tmp_path, per_device_train_batch_size=4), train_dataset=ds, recipe=QUICKSTART)
    with pytest.raises(ConfigError, match=r"max_position_embeddings is 256, the recipe .*quickstart.toml \[packing\] seq_len is 512"):
        DsprepTrainer(model=tiny_model(positions=256), args=arguments(tmp_path, per_device_train_batch_size=4), train_dataset=ds, recipe=QUICKSTART)
    with pytest.raises(ConfigError, match=r"the dataset's world_size is 2, the Trainer's world size is 1"):
        DsprepTrainer(model=tiny_model(), args=arguments(tmp_path, per_device_train_batch_size=4), train_dataset=DsprepHFDataset(daemon.endpoint, rank=0, world_size=2))
    # A resume at another global batch.
    folder = tmp_path / "out" / "checkpoint-5"
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text(json.dumps({"version": 1, "next_step": 10, "world_size": 1, "micro_batch": 2}))
    with pytest.raises(ConfigError, match=r"1 data-parallel ranks × 2 = 2 windows, this job's is 1 × TrainingArguments\.per_device_train_batch_size 4 = 4"):
        trainer.train(resume_from_checkpoint=str(folder))

