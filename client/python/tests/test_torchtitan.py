"""The torchtitan adapter against the real torchtitan (0.3.0) and the real daemon: the loader is
torchtitan's `ParallelAwareDataloader`, built by its config as torchtitan's trainer builds it,
its batches are torchtitan's `({"input", "positions"}, labels)` and equal the packed windows,
`configure` fills and refuses a torchtitan `Trainer.Config`, and the loader's state goes through
`torch.distributed.checkpoint` with 2 gloo ranks (real processes) and resumes exactly at the
same data-parallel size and at another one with the same global batch.

CI installs torchtitan (`client/python/extras-venv.sh`) and sets DSPREP_REQUIRE_EXTRAS=1: there a
missing torchtitan fails these tests instead of skipping them."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from extras import extra

torch = extra("torch")
extra("torchtitan")

from torchtitan.components.dataloader import BaseDataLoader, ParallelAwareDataloader  # noqa: E402

from dsprep_client import ConfigError, PackedDataset  # noqa: E402
from dsprep_client.torchtitan import DsprepDataLoader, configure  # noqa: E402

CONFIG = Path(__file__).resolve().parents[3] / "config"
GPT2 = CONFIG / "tokenizers" / "gpt2"


def build(endpoint: str, world: int = 1, rank: int = 0, seq_len: int = 512, local_batch: int = 2) -> DsprepDataLoader:
    """As torchtitan's Trainer builds `config.dataloader`."""
    return DsprepDataLoader.Config(endpoint=endpoint, timeout=10).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=seq_len, local_batch_size=local_batch, snapshot_every_n_steps=None
    )


def expected(packed_dir: Path, step: int, rank: int, world: int, micro_batch: int):
    """The packed batch of `step` for `rank`: what an uninterrupted stream gives there."""
    return PackedDataset(packed_dir, micro_batch=micro_batch, rank=rank, world_size=world).batch_at(step)


def test_the_loader_is_torchtitans_and_yields_its_batch_shape(daemon_factory, packed_dir, raw):
    daemon = daemon_factory(world_size=2, micro_batch=2, prefetch=8)
    loader = build(daemon.endpoint, world=2, rank=1)
    assert isinstance(loader, ParallelAwareDataloader) and isinstance(loader, BaseDataLoader)
    for step, batch in zip(range(4), loader):
        inputs, labels = batch  # as torchtitan's trainer unpacks it
        assert sorted(inputs) == ["input", "positions"]
        want = expected(packed_dir, step, 1, 2, 2)
        for got, ref in ((inputs["input"], want.input_ids), (inputs["positions"], want.position_ids), (labels, want.labels)):
            assert got.dtype == torch.int64 and got.shape == (2, 512)
            assert np.array_equal(got.numpy(), ref.astype(np.int64))
        first = (step * 2 + 1) * 2
        assert np.array_equal(inputs["input"].numpy(), raw.tokens[first : first + 2, :-1].astype(np.int64))
        # Document starts are where positions are 0: torchtitan's block-causal mask reads them.
        for row, w in enumerate(want.window_indices()):
            starts = set(raw.doc_starts(w).tolist()) | {0}
            zeros = set(np.flatnonzero(inputs["positions"][row].numpy() == 0).tolist())
            assert zeros == {s for s in starts if s < 512}
    state = json.loads(loader.state_dict()["dsprep"])
    assert state["next_step"] == 4 and state["dp_world_size"] == 2 and state["local_batch_size"] == 2
    assert state["stream_chain"] == [4, raw.chain_before(16).hex()]


def test_a_layout_mismatch_is_refused_with_both_values_and_the_setting(daemon_factory):
    daemon = daemon_factory(world_size=1, micro_batch=2, prefetch=4)
    with pytest.raises(ConfigError, match=r"training\.seq_len is 1024, while dsprep's is 512 \(recipe \[packing\] seq_len\)"):
        next(iter(build(daemon.endpoint, seq_len=1024)))
    with pytest.raises(ConfigError, match=r"training\.local_batch_size is 3, while dsprep's is 2 \(dsprep serve --micro-batch\)"):
        next(iter(build(daemon.endpoint, local_batch=3)))


def test_configure_fills_and_checks_a_torchtitan_trainer_config(tmp_path):
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    recipe = CONFIG / "quickstart.toml"
    # The debug model's 2048 ids do not cover GPT-2's 50257.
    with pytest.raises(ConfigError, match=r"vocab_size is 2048, the recipe's tokenizer .*gpt2/tokenizer.json has ids up to 50256 \(50257 ids\)"):
        configure(config, endpoint="ipc:///x.sock", recipe=recipe, micro_batch=8, tokenizer_dir=GPT2)
    config.model_spec.model.vocab_size = 50304
    config.loss.loss_fn.global_vocab_size = 50304
    # hf_assets_path is where torchtitan's tokenizer reads tokenizer.json from.
    with pytest.raises(ConfigError, match=r"hf_assets_path/tokenizer.json.*does not exist"):
        configure(config, endpoint="ipc:///x.sock", recipe=recipe, micro_batch=8, tokenizer_dir=tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    with pytest.raises(ConfigError, match=r"is not the recipe's .*gpt2/tokenizer.json"):
        configure(config, endpoint="ipc:///x.sock", recipe=recipe, tokenizer_dir=other)
    configure(config, endpoint="ipc:///x.sock", recipe=recipe, micro_batch=8, world_size=2, tokenizer_dir=GPT2)
    assert config.training.seq_len == 512, "filled from the recipe's [packing] seq_len"
    assert isinstance(config.dataloader, DsprepDataLoader.Config) and config.dataloader.endpoint == "ipc:///x.sock"
    with pytest.raises(ConfigError, match=r"training\.local_batch_size is 8, while dsprep's is 4 \(dsprep serve --micro-batch\); set training\.local_batch_size = 4"):
        configure(config, recipe=recipe, micro_batch=4)
    config.training.seq_len = 1024
    with pytest.raises(ConfigError, match=r"training\.seq_len is 1024, while dsprep's is 512 \(.*quickstart.toml \[packing\] seq_len\)"):
        configure(config, recipe=recipe)
    config.training.seq_len = 512
    config.training.global_batch_size = 20
    with pytest.raises(ConfigError, match=r"global_batch_size is 20, not a multiple of .* --world-size 2 × --micro-batch 8 = 16"):
        configure(config, micro_batch=8, world_size=2)


def test_another_torchtitan_version_is_refused(tmp_path):
    """A fake torchtitan 0.2.0 distribution ahead on the path: the import names both versions."""
    dist = tmp_path / "torchtitan-0.2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torchtitan\nVersion: 0.2.0\n")
    code = "import dsprep_client.torchtitan"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "UnsupportedTorchtitan: torchtitan 0.2.0 is installed; dsprep_client.torchtitan supports torchtitan 0.3.0" in done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dcp_checkpoint_resumes_exactly_at_the_same_and_another_data_parallel_size(daemon_factory, packed_dir, tmp_path):
    """2 gloo ranks (local batch 2, global batch 4) take steps 0..4 and save the loader with
    `dcp.save` after step 2; the daemon is killed. Resumed from that checkpoint (`dcp.load`) with
    the daemon restarted (`--resume latest`): 2 ranks again, and (at the same time, against its own
    copy of the daemon's state) 1 rank with local batch 4 (the same global batch); each yields
    steps 3.. exactly as the uninterrupted stream."""
    worker = Path(__file__).with_name("titan_rank_worker.py")
    ckpt = tmp_path / "ckpt"

    def serve_args(state: Path) -> list:
        return ["--state-dir", str(state), "--checkpoint-every", "1", "--keep-checkpoints", "100"]

    def start(daemon, world: int, local_batch: int, steps: int, mode: str, tag: str) -> list:
        port, procs = free_port(), []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            out = str(tmp_path / f"{tag}-rank{rank}")
            cmd = [sys.executable, str(worker), daemon.endpoint, out, str(local_batch), str(steps), str(ckpt), mode]
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        return procs

    def finish(procs: list) -> None:
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err

    def check(tag: str, world: int, local_batch: int, first_step: int, steps: int) -> None:
        for rank in range(world):
            lines = (tmp_path / f"{tag}-rank{rank}.jsonl").read_text().splitlines()
            assert len(lines) == steps
            for step, line in zip(range(first_step, first_step + steps), lines):
                got, want = json.loads(line), expected(packed_dir, step, rank, world, local_batch)
                assert got["input"] == want.input_ids.astype(np.int64).tolist(), f"{tag} rank {rank} step {step}"
                assert got["positions"] == want.position_ids.tolist(), f"{tag} rank {rank} step {step}"
                assert got["labels"] == want.labels.tolist(), f"{tag} rank {rank} step {step}"

    first = daemon_factory(world_size=2, micro_batch=2, prefetch=4, in_dir=tmp_path / "d", extra=serve_args(tmp_path / "state"))
    finish(start(first, world=2, local_batch=2, steps=5, mode="save:3", tag="first"))
    first.kill()
    check("first", 2, 2, 0, 5)

    # Both resumes at once, each with its own copy of the daemon's state directory.
    shutil.copytree(tmp_path / "state", tmp_path / "state-other")
    resume = ["--resume", "latest"]
    same = daemon_factory(world_size=2, micro_batch=2, prefetch=4, in_dir=tmp_path / "d", extra=serve_args(tmp_path / "state") + resume)
    other = daemon_factory(world_size=1, micro_batch=4, prefetch=4, in_dir=tmp_path / "o", extra=serve_args(tmp_path / "state-other") + resume)
    procs = start(same, world=2, local_batch=2, steps=4, mode="load", tag="same")
    procs += start(other, world=1, local_batch=4, steps=4, mode="load", tag="other")
    finish(procs)
    check("same", 2, 2, 3, 4)
    check("other", 1, 4, 3, 4)


def test_a_resume_with_another_global_batch_is_refused(daemon_factory):
    daemon = daemon_factory(world_size=2, micro_batch=2, prefetch=4)
    saved = build(daemon.endpoint, world=2, rank=0).state_dict()
    fresh = build(daemon.endpoint, world=1, rank=0, local_batch=2)
    with pytest.raises(ConfigError, match=r"2 data-parallel ranks × 2 = 4 windows, this job's is 1 × training\.local_batch_size 2 = 2.*set training\.local_batch_size = 4"):
        fresh.load_state_dict(saved)
    fresh.load_state_dict({})  # a fresh job: nothing to load
