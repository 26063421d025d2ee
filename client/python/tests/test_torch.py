"""The torch adapter with a real torch: tensors equal the served numpy batches, served and packed
sources are interchangeable, and the state round-trips, also through torchdata's
StatefulDataLoader when that is installed.

Skipped, with the reason printed, where torch is not installed: PyPI serves only CUDA builds of
torch for Linux, which pull several GB of CUDA packages; CI does not install them."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed: PyPI's Linux torch wheels require several GB of CUDA packages and no CPU-only "
    "build is on PyPI, so CI does not install it (install a CPU build of torch into the venv to run these tests)",
)

from dsprep_client import Client, DsprepIterableDataset, RecipeMismatch  # noqa: E402


def test_yields_torch_tensors_equal_to_the_numpy_batches(daemon_factory, packed_dir):
    daemon = daemon_factory(world_size=1, micro_batch=2, prefetch=4)
    served = iter(DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10))
    packed = iter(DsprepIterableDataset(str(packed_dir), micro_batch=2, rank=0, world_size=1))
    reference = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    for step in range(5):
        a, b, want = next(served), next(packed), reference.next_batch()
        assert a["step"] == b["step"] == step
        assert a["input_ids"].dtype == torch.int64 and a["input_ids"].shape == (2, 512)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens_flat"):
            assert torch.equal(a[key], b[key]), key
        assert np.array_equal(a["input_ids"].numpy(), want.input_ids.astype(np.int64))
        assert np.array_equal(a["position_ids"].numpy(), want.position_ids)
        assert all(torch.equal(x, torch.from_numpy(y)) for x, y in zip(a["cu_seqlens"], want.cu_seqlens))
    reference.close()


def test_state_dict_round_trip(daemon_factory, raw):
    daemon = daemon_factory(world_size=1, micro_batch=1, prefetch=8)
    ds = DsprepIterableDataset(daemon.endpoint, rank=0, world_size=1, timeout=10)
    it = iter(ds)
    for _ in range(4):
        next(it)
    state = ds.state_dict()
    assert state == {"next_step": 4, "recipe_hash": raw.recipe_hash}
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
