"""`state_dict()` / `load_state_dict()`: the next step and the recipe hash (and for the served
client the stream chain, checked on resume: test_chain.py), for the served client and the packed
reader alike; a resumed reader continues exactly where the saved one was,
also against a restarted daemon (which serves any step it still holds)."""

import numpy as np
import pytest

from dsprep_client import Client, PackedDataset, RecipeMismatch


def test_client_state_round_trips_across_a_daemon_restart(daemon_factory, raw, tmp_path):
    first = daemon_factory(world_size=1, micro_batch=2, prefetch=8, in_dir=tmp_path)
    client = Client(first.endpoint, rank=0, world_size=1, timeout=10)
    for _ in range(5):
        client.next_batch()
    state = client.state_dict()
    assert state == {"next_step": 5, "recipe_hash": raw.recipe_hash, "stream_chain": [5, raw.chain_before(10).hex()]}
    client.close()
    first.stop()

    second = daemon_factory(world_size=1, micro_batch=2, prefetch=8, in_dir=tmp_path)
    resumed = Client(second.endpoint, rank=0, world_size=1, timeout=10)
    resumed.load_state_dict(state)
    batch = resumed.next_batch()
    assert batch.step == 5
    assert np.array_equal(batch.tokens, raw.tokens[10:12])
    assert resumed.state_dict() == {"next_step": 6, "recipe_hash": raw.recipe_hash, "stream_chain": [6, raw.chain_before(12).hex()]}

    # A saved recipe hash is enforced from then on.
    stale = Client(second.endpoint, rank=0, world_size=1, timeout=10)
    stale.load_state_dict({"next_step": 6, "recipe_hash": "cd" * 32})
    with pytest.raises(RecipeMismatch, match="the trainer expects " + "cd" * 32):
        stale.next_batch()
    for c in (resumed, stale):
        c.close()


def test_packed_state_round_trips_and_refuses_another_recipe(packed_dir, raw):
    reader = PackedDataset(packed_dir, micro_batch=2, rank=1, world_size=2)
    for _ in range(7):
        reader.next_batch()
    state = reader.state_dict()
    assert state == {"next_step": 7, "recipe_hash": raw.recipe_hash}
    again = PackedDataset(packed_dir, micro_batch=2, rank=1, world_size=2)
    again.load_state_dict(state)
    batch = again.next_batch()
    assert (batch.step, batch.first_window) == (7, (7 * 2 + 1) * 2)
    assert np.array_equal(batch.tokens, raw.tokens[30:32])
    with pytest.raises(RecipeMismatch):
        again.load_state_dict({"next_step": 0, "recipe_hash": "00" * 32})
    with pytest.raises(RecipeMismatch):
        PackedDataset(packed_dir, recipe_hash="11" * 32, rank=0, world_size=1)
