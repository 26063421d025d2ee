"""Served batches against `dsprep pack`: ranks in separate processes get exactly the packed
windows, the packed reader hands out the same batches, and document boundaries reset positions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import zmq

from dsprep_client import Client, PackedDataset

WORKER = Path(__file__).with_name("rank_worker.py")


def test_ranks_in_separate_processes_get_the_packed_windows_and_end_together(daemon_factory, raw, tmp_path):
    world, mb = 3, 2
    daemon = daemon_factory(world_size=world, micro_batch=mb, prefetch=4)
    outs = [str(tmp_path / f"rank{r}") for r in range(world)]
    ranks = [
        subprocess.Popen([sys.executable, str(WORKER), daemon.endpoint, outs[r]], env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world)), stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    for r, p in enumerate(ranks):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, f"rank {r}: {err}"
    num_steps = raw.num_windows // (world * mb)
    for r in range(world):
        summary = json.loads(Path(outs[r] + ".json").read_text())
        assert (summary["rank"], summary["world_size"], summary["micro_batch"]) == (r, world, mb)
        assert summary["steps"] == list(range(num_steps)), "every rank gets every step, then the end, at the same step"
        assert summary["num_steps"] == num_steps
        assert summary["recipe_hash"] == raw.recipe_hash
        got = np.load(outs[r] + ".tokens.npy")
        want = np.stack([raw.tokens[list(raw.rank_windows(s, r, world, mb))] for s in range(num_steps)])
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), f"rank {r}'s tokens differ from the packed windows"
        windows = [w for s in range(num_steps) for w in raw.rank_windows(s, r, world, mb)]
        assert summary["doc_starts"] == [raw.doc_starts(w).tolist() for w in windows]


def test_packed_dataset_batches_equal_served_batches(daemon_factory, packed_dir, raw):
    world, mb = 2, 3
    daemon = daemon_factory(world_size=world, micro_batch=mb, prefetch=4)
    served = [Client(daemon.endpoint, rank=r, world_size=world, timeout=10) for r in range(world)]
    packed = [PackedDataset(packed_dir, micro_batch=mb, rank=r, world_size=world) for r in range(world)]
    assert packed[0].num_steps == raw.num_windows // (world * mb)
    for step in range(30):
        for r in range(world):
            a, b = served[r].next_batch(), packed[r].next_batch()
            assert (a.step, a.rank, a.first_window) == (b.step, b.rank, b.first_window) == (step, r, (step * world + r) * mb)
            assert a.tokens.dtype == b.tokens.dtype == np.uint16
            assert np.array_equal(a.tokens, b.tokens)
            assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.labels, b.labels)
            assert np.array_equal(a.position_ids, b.position_ids)
            assert all(np.array_equal(x, y) for x, y in zip(a.cu_seqlens, b.cu_seqlens))
            assert [s.tolist() for s in a.doc_starts] == [s.tolist() for s in b.doc_starts]
            assert a.recipe_hash == b.recipe_hash == raw.recipe_hash
            # Protocol v3 / format 3: every document's source, and every input token's.
            windows = list(raw.rank_windows(step, r, world, mb))
            want = [raw.doc_sources(w).tolist() for w in windows]
            assert [s.tolist() for s in a.doc_sources] == [s.tolist() for s in b.doc_sources] == want
            assert a.lead_sources.tolist() == b.lead_sources.tolist() == [int(raw.lead_sources[w]) for w in windows]
            assert a.input_sources.tolist() == b.input_sources.tolist() == [raw.input_sources(w) for w in windows]
            counts = a.source_token_counts()
            assert counts == b.source_token_counts() and sum(counts.values()) == mb * 512
    assert (served[0].micro_batch, served[0].seq_len) == (packed[0].micro_batch, packed[0].seq_len) == (mb, 512)
    last = packed[1].batch_at(packed[1].num_steps - 1)
    assert np.array_equal(last.tokens, raw.tokens[list(raw.rank_windows(packed[1].num_steps - 1, 1, world, mb))])
    assert packed[1].batch_at(packed[1].num_steps) is None
    for c in served:
        c.close()


def test_batches_are_views_and_positions_restart_at_document_starts(daemon_factory, raw):
    daemon = daemon_factory(world_size=1, micro_batch=4, prefetch=2)
    client = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    restarts = 0
    for step in range(10):
        batch = client.next_batch()
        assert batch.step == step
        # Zero copy: the token array is a read-only view of the received ZeroMQ frame.
        assert not batch.tokens.flags.owndata and not batch.tokens.flags.writeable
        assert isinstance(batch.tokens.base, memoryview) or isinstance(batch.tokens.base.base, memoryview)
        assert batch.input_ids.shape == batch.labels.shape == batch.position_ids.shape == (4, 512)
        assert np.array_equal(batch.input_ids[:, 1:], batch.labels[:, :-1])
        for i in range(4):
            window = step * 4 + i
            starts = raw.doc_starts(window)
            assert np.array_equal(batch.doc_starts[i], starts)
            cu, pos = batch.cu_seqlens[i], batch.position_ids[i]
            assert cu[0] == 0 and cu[-1] == 512 and cu.dtype == np.int32
            assert pos[0] == 0, "a row starts at position 0, also when it continues a document"
            inner = [s for s in starts if 0 < s < 512]
            assert cu[1:-1].tolist() == inner
            for s in inner:
                assert pos[s] == 0, f"window {window}: positions restart at document start {s}"
                restarts += 1
            steps = np.diff(pos)
            assert np.all((steps == 1) | (pos[1:] == 0)), "positions count up by one inside a document"
        flat = np.concatenate([[0]] + [cu[1:] + i * 512 for i, cu in enumerate(batch.cu_seqlens)])
        assert np.array_equal(batch.cu_seqlens_flat, flat), "the rows' cu_seqlens over the flattened inputs"
    assert restarts > 10, "the quickstart's windows hold many documents"
    client.close()


def test_the_end_of_data_is_none_for_every_rank_at_the_same_step(daemon_factory, raw):
    world, mb = 2, 64
    daemon = daemon_factory(world_size=world, micro_batch=mb, prefetch=64)
    num_steps = raw.num_windows // (world * mb)
    clients = [Client(daemon.endpoint, rank=r, world_size=world, timeout=10) for r in range(world)]
    for step in range(num_steps):
        for c in clients:
            assert c.next_batch().step == step
    for c in clients:
        assert c.next_batch() is None
        assert c.num_steps == num_steps and c.next_step == num_steps
        assert c.batch_at(num_steps + 100) is None
        c.close()


def test_a_raw_zmq_request_encoded_by_the_package_gets_the_packed_window(daemon_factory, raw):
    from dsprep_client.protocol import decode_reply, encode_request

    daemon = daemon_factory(world_size=1, micro_batch=1)
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.connect(daemon.endpoint)
    socket.send(encode_request(7, 0, 1, 3))
    assert socket.poll(10_000), "the daemon replies"
    frames = socket.recv_multipart(copy=False)
    batch = decode_reply(frames)
    assert np.array_equal(batch.tokens[0], raw.tokens[3])
    socket.close(linger=0)


def test_tensor_parallel_peers_get_their_data_parallel_rank_served_and_packed(daemon_factory, packed_dir, raw):
    # World 4 with tensor parallel 2 (Megatron/torchtitan order): DP ranks 0, 0, 1, 1; the daemon
    # serves the DP world of 2. Peers in lock step, as their collectives keep them.
    dp_world, mb = 2, 2
    daemon = daemon_factory(world_size=dp_world, micro_batch=mb, prefetch=4)
    served = [Client(daemon.endpoint, rank=r, world_size=4, timeout=10, tensor_parallel=2) for r in range(4)]
    packed = [PackedDataset(packed_dir, micro_batch=mb, rank=r, world_size=4, tensor_parallel=2) for r in range(4)]
    assert [(c.dp_rank, c.dp_size) for c in served] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    for step in range(12):
        got = [c.next_batch() for c in served]
        from_pack = [p.next_batch() for p in packed]
        for r in range(4):
            dp = r // 2
            want = raw.tokens[list(raw.rank_windows(step, dp, dp_world, mb))]
            assert np.array_equal(got[r].tokens, want) and np.array_equal(from_pack[r].tokens, want)


def test_parallel_sizes_that_do_not_divide_the_world_are_refused():
    import pytest

    from dsprep_client import ConfigError
    from dsprep_client.parallel import data_parallel

    assert [data_parallel(r, 8, tensor=2, pipeline=2)[0] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [data_parallel(r, 8, tensor=2, pipeline=2, order="tp-cp-pp-dp")[0] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ConfigError, match=r"world size 8 is not a multiple of tensor × context × pipeline parallel = 3 × 1 × 1 = 3"):
        data_parallel(0, 8, tensor=3)
    with pytest.raises(ConfigError, match="rank order"):
        data_parallel(0, 8, order="dp-tp")


def test_a_pack_of_format_2_reads_without_sources(packed_dir, raw, tmp_path):
    """A directory written before format 3 (no doc_sources.u16 / lead_sources.u16) still reads:
    the same tokens, and no sources."""
    import shutil

    old = tmp_path / "v2"
    shutil.copytree(packed_dir, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for key in ("doc_sources", "lead_sources"):
        (old / manifest.pop(key)["file"]).unlink()
    manifest["format_version"] = 2
    (old / "manifest.json").write_text(json.dumps(manifest))
    batch = PackedDataset(old, micro_batch=2).batch_at(3)
    assert np.array_equal(batch.tokens, raw.tokens[6:8])
    assert (batch.doc_sources, batch.lead_sources, batch.input_sources, batch.source_token_counts()) == (None, None, None, None)
