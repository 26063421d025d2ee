"""A trainer that pinned its recipe across a change of course (`dsprep serve --resume latest
--change-course`): the daemon serves it while the pinned recipe is in the stream's lineage (the
client says so), and refuses a recipe that is not, with the daemon's message. Every served batch
names the lineage segment whose recipe made it (protocol v5). Real daemons, a real state
directory."""

from __future__ import annotations

import json
import warnings

import pytest

from conftest import QUICKSTART
from dsprep_client import Client, RecipeMismatch


def variant(tmp_path, name: str, weight: str) -> str:
    """The quickstart with fineweb-edu's weight set, its relative paths made absolute."""
    config = QUICKSTART.parent
    text = QUICKSTART.read_text().replace('"tokenizers/', f'"{config}/tokenizers/').replace('"samples/', f'"{config}/samples/')
    assert "weight = 0.40" in text
    path = tmp_path / name
    path.write_text(text.replace("weight = 0.40", f"weight = {weight}").replace("buffer_size = 1000", "buffer_size = 100"))
    return str(path)


def test_a_pinned_recipe_is_served_while_the_lineage_holds_it(daemon_factory, tmp_path):
    a, b = variant(tmp_path, "a.toml", "0.40"), variant(tmp_path, "b.toml", "0.10")
    state = tmp_path / "state"
    first = daemon_factory(recipe=a, world_size=1, micro_batch=2, extra=["--state-dir", str(state)])
    client = Client(first.endpoint, rank=0, world_size=1, timeout=10)
    for _ in range(12):
        batch = client.next_batch()
        assert (batch.segment, batch.segment_recipe_hash) == (0, batch.recipe_hash)
    pinned = client.recipe_hash
    saved = client.state_dict()
    client.close()
    first.kill()

    resume = ["--state-dir", str(state), "--resume", "latest"]
    second = daemon_factory(recipe=b, world_size=1, micro_batch=2, metrics=True, extra=[*resume, "--change-course"])
    # The trainer resumes from its own state: pinned to recipe A, which the lineage holds.
    trainer = Client(second.endpoint, rank=0, world_size=1, timeout=10)
    trainer.load_state_dict(saved)
    with pytest.warns(UserWarning) as said:
        batch = trainer.next_batch()
    assert batch.step == 12
    lineage = json.loads((state / "lineage.json").read_text())["lineage"]
    hashes = [s["recipe_hash"] for s in lineage["segments"]]
    assert hashes[0] == pinned and batch.recipe_hash == hashes[1] != pinned
    # The step names the segment that made it: B's, from the change on.
    assert (batch.segment, batch.segment_recipe_hash) == (1, hashes[1])
    note = (
        f"recipe {pinned} this trainer pinned is an earlier recipe of the stream's lineage: the daemon changed "
        f"course to recipe {hashes[1]} and serves the trainer that stream; step 12 is segment 1's (recipe {hashes[1]})"
    )
    assert [str(w.message) for w in said if w.category is UserWarning] == [note] and trainer.recipe_note == note
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        trainer.next_batch()
    assert not [w for w in later if str(w.message) == note], "said once"
    # A step below the change, still held: A's segment, from B's daemon.
    below = trainer.batch_at(11)
    assert (below.segment, below.segment_recipe_hash, below.recipe_hash) == (0, hashes[0], hashes[1])
    assert [s["from_step"] for s in lineage["segments"]] == [0, 12]
    # /metrics: the segment in force, and what each segment produced.
    assert second.metric("dsprep_lineage_segment") == 1
    assert second.metric('dsprep_segment_documents_total{segment="1",source="fineweb-edu"}') > 0
    # A recipe the lineage does not hold is refused, naming both.
    stranger = Client(second.endpoint, rank=0, world_size=1, recipe_hash="cd" * 32, timeout=10)
    stranger.next_step = 13
    with pytest.raises(RecipeMismatch) as e:
        stranger.next_batch()
    assert e.value.message == (
        f"the daemon serves recipe {hashes[1]}, the trainer expects {'cd' * 32}, which is no earlier recipe of its "
        f"lineage either ({hashes[0]})"
    )
    for c in (trainer, stranger):
        c.close()
