"""The torch adapter with a real torch: tensors equal the served numpy batches, served and packed
sources are interchangeable, padding (best_fit) is ignored by the loss, and the state round-trips,
also through torchdata's StatefulDataLoader when that is installed.

CI installs torch and torchdata (into a venv cached outside the clone, `client/python/extras-venv.sh`)
and sets DSPREP_REQUIRE_EXTRAS=1: there a missing torch fails these tests instead of skipping them.
Elsewhere they are skipped, with the reason printed, where torch is not installed."""

import itertools
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
extra("torchdata")

from dsprep_client import Client, DsprepIterableDataset, PackedDataset, RecipeMismatch  # noqa: E402


def test_yields_torch_tensors_equal_to_the_numpy_batches(daemon_factory, packed_dir):
    daemon = daemon_factory(world_size=1, micro_batch=2, prefetch=4)
    served = iter(DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10))
    packed = iter(DsprepIterableDataset(str(packed_dir), micro_batch=2, rank=0, world_size=1))
    reference = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    for step in range(5):
        a, b, want = next(served), next(packed), reference.next_batch()
        assert a["step"] == b["step"] == step
        assert (a["segment"], "segment" in b) == (0, False), "served (v5), not packed"
        assert a["input_ids"].dtype == torch.int64 and a["input_ids"].shape == (2, 512)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens_flat", "input_sources"):
            assert torch.equal(a[key], b[key]), key
        assert a["input_sources"].dtype == torch.int64 and np.array_equal(a["input_sources"].numpy(), want.input_sources)
        assert np.array_equal(a["input_ids"].numpy(), want.input_ids.astype(np.int64))
        assert np.array_equal(a["position_ids"].numpy(), want.position_ids)
        assert all(torch.equal(x, torch.from_numpy(y)) for x, y in zip(a["cu_seqlens"], want.cu_seqlens))
    reference.close()


def test_best_fit_items_carry_real_tokens_and_the_loss_ignores_the_padding(daemon_factory, best_fit_recipe, best_fit_dir, best_fit_raw):
    mb, steps = 4, 200
    packed = DsprepIterableDataset(str(best_fit_dir), micro_batch=mb, rank=0, world_size=1)
    daemon = daemon_factory(recipe=best_fit_recipe, world_size=1, micro_batch=mb, prefetch=8)
    served = iter(DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10))
    reference = PackedDataset(best_fit_dir, micro_batch=mb)
    padded = 0
    for item in itertools.islice(packed, steps):
        want, other = reference.batch_at(item["step"]), next(served)
        for key in ("input_ids", "labels", "position_ids", "real_tokens", "cu_seqlens_flat"):
            assert torch.equal(item[key], other[key]), key
        assert item["real_tokens"].dtype == torch.int64 and item["real_tokens"].shape == (mb,)
        assert item["real_tokens"].tolist() == want.real_tokens.tolist()
        assert item["labels"].dtype == torch.int64 and torch.equal(item["labels"], torch.from_numpy(want.labels))
        assert torch.equal(item["position_ids"], torch.from_numpy(want.position_ids))
        for i, (w, real) in enumerate(zip(want.window_indices(), item["real_tokens"].tolist())):
            labels = item["labels"][i]
            assert torch.all(labels[real - 1 :] == -100), f"window {w}: -100 from the last real token on"
            assert torch.equal(labels[: real - 1], torch.from_numpy(best_fit_raw.tokens[w, 1:real].astype(np.int64)))
            assert torch.all(item["position_ids"][i, real:] == 0)
            if real < best_fit_raw.window_tokens and not padded:
                # The loss counts exactly the real next tokens: -100 is cross_entropy's ignore index.
                loss = torch.nn.functional.cross_entropy(torch.zeros(512, 50257), labels, reduction="none")
                assert torch.equal(loss > 0, torch.arange(512) < real - 1)
            padded += real < best_fit_raw.window_tokens
    assert padded >= 20, "the steps compared hold padded rows"


def test_state_dict_round_trip(daemon_factory, raw):
    daemon = daemon_factory(world_size=1, micro_batch=1, prefetch=8)
    ds = DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10)
    it = iter(ds)
    for _ in range(4):
        next(it)
    state = ds.state_dict()
    assert state == {"next_step": 4, "recipe_hash": raw.recipe_hash, "stream_chain": [4, raw.chain_before(4).hex()]}
    resumed = DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10)
    resumed.load_state_dict(state)
    item = next(iter(resumed))
    assert item["step"] == 4
    assert np.array_equal(item["input_ids"][0].numpy(), raw.tokens[4][:-1].astype(np.int64))
    wrong = DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10)
    wrong.load_state_dict({"next_step": 4, "recipe_hash": "ef" * 32})
    with pytest.raises(RecipeMismatch):
        next(iter(wrong))


def test_stateful_dataloader_resumes_at_the_next_step(daemon_factory):
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    daemon = daemon_factory(world_size=1, micro_batch=1, prefetch=8, metrics=True)
    loader = stateful.StatefulDataLoader(DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10), batch_size=None)
    it = iter(loader)
    seen = [next(it)["step"] for _ in range(3)]
    state = loader.state_dict()
    assert next(it)["step"] == 3 and seen == [0, 1, 2]
    served = daemon.metric('dsprep_replies_total{status="ok"}')
    again = stateful.StatefulDataLoader(DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10), batch_size=None)
    again.load_state_dict(state)
    assert next(iter(again))["step"] == 3
    # Resumed from the dataset's state, not by fast-forwarding through steps 0..2 again.
    assert daemon.metric('dsprep_replies_total{status="ok"}') == served + 1


@pytest.mark.parametrize("workers", [0, 2])
def test_torchrun_style_ranks_killed_with_the_daemon_resume_from_their_checkpoint(daemon_factory, raw, tmp_path, workers):
    """Two rank processes (RANK/WORLD_SIZE as torchrun sets them) with StatefulDataLoader (0 or 2
    workers: with 2, each worker takes every other step) save a
    checkpoint after step 3, train on, and are killed with the daemon (SIGKILL) at step 6 or
    later. The job restarts: the daemon with --resume latest, the ranks from their checkpoint.
    Steps 4.. equal the uninterrupted stream, and the stream chain the loader state carries
    proves it continues."""
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    world, state = 2, tmp_path / "state"
    worker = Path(__file__).with_name("torch_rank_worker.py")
    args = ["--state-dir", str(state), "--checkpoint-every", "1"]

    def ranks(daemon, last, resume):
        procs = []
        for rank in range(world):
            out = str(tmp_path / f"rank{rank}")
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world))
            cmd = [sys.executable, str(worker), daemon.endpoint, out, str(workers), str(last), "3"]
            cmd += [out + ".ckpt"] if resume else []
            # Each rank in its own process group, killed as a whole like a job step: its
            # DataLoader workers die with it instead of asking on for their dead trainer.
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True))
        return procs

    def steps_written(rank):
        path = tmp_path / f"rank{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    first = daemon_factory(world_size=world, micro_batch=1, prefetch=4, in_dir=tmp_path / "d", extra=args)
    procs = ranks(first, last=1000, resume=False)
    deadline = time.monotonic() + 60
    while min(len(steps_written(r)) for r in range(world)) < 7:
        assert time.monotonic() < deadline, "the ranks did not reach step 6"
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs]
        time.sleep(0.05)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    first.kill()
    before = {r: len(steps_written(r)) for r in range(world)}

    second = daemon_factory(world_size=world, micro_batch=1, prefetch=4, in_dir=tmp_path / "d", extra=args + ["--resume", "latest"])
    procs = ranks(second, last=9, resume=True)
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for rank in range(world):
        resumed = steps_written(rank)[before[rank] :]
        assert [s["step"] for s in resumed] == list(range(4, 10)), "resumed at the step after the checkpoint"
        for s in resumed:
            window = (s["step"] * world + rank) * 1
            assert s["input_ids"][0] == raw.tokens[window][:-1].astype(np.int64).tolist(), f"rank {rank} step {s['step']}"


def test_the_dataset_passes_curve_keys_to_its_client(daemon_factory, tmp_path, raw):
    from dsprep_client import Unauthorized
    from test_curve import free_tcp_endpoint, keygen

    server, trainer = keygen(tmp_path / "server"), keygen(tmp_path / "trainer")
    allow = tmp_path / "allow"
    allow.mkdir()
    (allow / "trainer.key").write_bytes(Path(trainer[0]).read_bytes())
    extra = ["--curve-secret-key", server[1], "--curve-allow", str(allow)]
    daemon = daemon_factory(world_size=1, micro_batch=1, extra=extra, endpoint=free_tcp_endpoint())
    ds = DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10, curve_server_key=server[0], curve_client_key=trainer[1])
    item = next(iter(ds))
    assert np.array_equal(item["input_ids"].numpy(), raw.tokens[0:1, :-1].astype(np.int64))
    with pytest.raises(Unauthorized, match="serves with CURVE and this client has no keys"):
        next(iter(DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=5)))
