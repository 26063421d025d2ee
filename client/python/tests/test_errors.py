"""Every refusal of the daemon reaches the trainer as its own exception class with the daemon's
message, whether it comes through `Client` or through a raw ZeroMQ socket decoded by the package."""

import json
import random
import string
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from dsprep_client import (
    Client,
    ConfigError,
    DaemonFailed,
    DaemonGone,
    LayoutMismatch,
    Malformed,
    ProtocolError,
    RankOwned,
    RecipeMismatch,
    ShuttingDown,
    StepAhead,
    StepGone,
    UnsupportedVersion,
)
from dsprep_client.protocol import decode_header, decode_reply, encode_request

REPO = Path(__file__).resolve().parents[3]


class RawRank:
    """A DEALER socket speaking frames by hand, to send what the client never would."""

    def __init__(self, endpoint):
        self.context = zmq.Context.instance()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.connect(endpoint)

    def ask(self, *frames):
        self.socket.send_multipart(list(frames))
        assert self.socket.poll(10_000), "the daemon replies"
        return self.socket.recv_multipart(copy=False)

    def close(self):
        self.socket.close(linger=0)


def test_malformed_and_unsupported_requests_raise_their_classes(daemon_factory):
    daemon = daemon_factory(world_size=2, micro_batch=1)
    raw = RawRank(daemon.endpoint)
    with pytest.raises(Malformed, match=r"request rejected: message is 5 bytes, expected 88$") as e:
        decode_reply(raw.ask(b"hello"))
    assert e.value.status == 15 and e.value.header.world_size == 2
    with pytest.raises(Malformed, match=r"a request is exactly one frame \(a loss report two\), got 2"):
        decode_reply(raw.ask(encode_request(1, 0, 2, 0), b"extra"))
    bad_version = bytearray(encode_request(42, 0, 2, 0))
    bad_version[4] = 9
    frames = raw.ask(bytes(bad_version))
    assert decode_header(frames[0]).request_id == 42
    with pytest.raises(UnsupportedVersion, match="protocol version 9 is not supported"):
        decode_reply(frames)
    with pytest.raises(LayoutMismatch, match="the request is rank 2 of world size 2"):
        decode_reply(raw.ask(encode_request(2, 2, 2, 0)))
    # After all that, a good request is served.
    assert decode_reply(raw.ask(encode_request(3, 1, 2, 0))).first_window == 1
    raw.close()


def test_recipe_and_layout_mismatches_raise_with_the_daemons_message(daemon_factory, raw):
    daemon = daemon_factory(world_size=2, micro_batch=1)
    wrong = Client(daemon.endpoint, rank=0, world_size=2, recipe_hash="ab" * 32, timeout=5)
    with pytest.raises(RecipeMismatch) as e:
        wrong.next_batch()
    assert e.value.message == f"the daemon serves recipe {raw.recipe_hash}, the trainer expects {'ab' * 32}"
    assert wrong.next_step == 0, "a refused step is not consumed"
    right = Client(daemon.endpoint, rank=0, world_size=2, recipe_hash=raw.recipe_hash, timeout=5)
    assert right.next_batch().step == 0
    with pytest.raises(LayoutMismatch, match=r"the daemon serves world size 2 \(micro batch 1\); the request is rank 0 of world size 4"):
        Client(daemon.endpoint, rank=0, world_size=4, timeout=5).next_batch()
    for c in (wrong, right):
        c.close()


def test_step_gone_and_step_ahead(daemon_factory):
    daemon = daemon_factory(world_size=2, micro_batch=1, prefetch=2, metrics=True)
    r0 = Client(daemon.endpoint, rank=0, world_size=2, timeout=0.15, attempts=2)
    # Rank 1 has not asked for anything: step 10 is beyond the prefetch window. The client asks
    # again every 20 ms until timeout × attempts has passed, then raises.
    started = time.monotonic()
    with pytest.raises(StepAhead, match=r"^step out of range: step 10 is too far ahead: slower ranks hold the daemon at steps below 2 \(prefetch window\)$"):
        r0.batch_at(10)
    assert time.monotonic() - started >= 0.3
    assert daemon.metric('dsprep_replies_total{status="step_ahead"}') >= 5, "asked again every 20 ms"
    # A step ahead is served once the slower rank moves.
    r1 = Client(daemon.endpoint, rank=1, world_size=2, timeout=10)
    patient = Client(daemon.endpoint, rank=0, world_size=2, timeout=10)
    patient.batch_at(0)
    patient.batch_at(1)
    got = {}
    waiter = threading.Thread(target=lambda: got.update(batch=patient.batch_at(3)))
    waiter.start()
    time.sleep(0.1)
    for step in range(3):
        r1.batch_at(step)
    waiter.join(timeout=20)
    assert got["batch"].step == 3
    for step in range(4, 12):
        r1.batch_at(step - 1)
        patient.batch_at(step)
    r1.batch_at(11)
    with pytest.raises(StepGone) as e:
        r0.batch_at(1)
    assert e.value.message == "step 1 is no longer held: the oldest step held is 3 (resume from a checkpoint to go back further)"
    for c in (r0, r1, patient):
        c.close()


def test_nothing_listening_is_daemon_gone_after_the_timeout(tmp_path):
    client = Client(f"ipc://{tmp_path}/nobody.sock", rank=0, world_size=1, timeout=0.2, attempts=2)
    started = time.monotonic()
    with pytest.raises(DaemonGone, match=r"no reply from the daemon at ipc://.*nobody.sock after 0\.\d+ s \(2 attempts\): is it running\?"):
        client.next_batch()
    assert 0.35 <= time.monotonic() - started < 3
    client.close()


def write_jsonl_recipe(tmp_path, data_file, lines=None):
    if lines is not None:
        data_file.write_text("".join(lines))
    recipe = tmp_path / "recipe.toml"
    tokenizer = REPO / "config" / "tokenizers" / "gpt2" / "tokenizer.json"
    recipe.write_text(
        f'version = 1\n[tokenizer]\npath = "{tokenizer}"\neos = "<|endoftext|>"\n[packing]\nseq_len = 64\n'
        f'[shuffle]\nseed = 3\nbuffer_size = 0\n[mix]\nstopping = "first_exhausted"\n'
        f'[[source]]\nname = "notes"\nweight = 1.0\nfiles = ["{data_file.name}"]\nformat = "jsonl"\ntext = "text"\n'
    )
    return recipe


def test_a_pipeline_failure_is_daemon_failed_naming_the_file_and_line(daemon_factory, tmp_path):
    good = [f'{{"text": "note {i}: the quick brown fox jumps over the lazy dog"}}\n' for i in range(300)]
    recipe = write_jsonl_recipe(tmp_path, tmp_path / "notes.jsonl", good + ['{"text": 5}\n'])
    daemon = daemon_factory(recipe=recipe, world_size=1, micro_batch=1, prefetch=4)
    client = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    assert client.next_batch().step == 0, "the steps before the bad line are served"
    with pytest.raises(DaemonFailed) as e:
        client.batch_at(100_000)
    assert "notes.jsonl" in e.value.message and "line 301" in e.value.message, e.value.message
    client.close()


def test_a_waiting_request_gets_shutting_down_on_sigterm(daemon_factory, tmp_path):
    # One 20 MB document: tokenizing it takes seconds, and the request for step 0 waits meanwhile.
    rng = random.Random(5)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(40_000)]
    big = " ".join(words) * 60
    recipe = write_jsonl_recipe(tmp_path, tmp_path / "big.jsonl", [json.dumps({"text": big}) + "\n"])
    daemon = daemon_factory(recipe=recipe, world_size=1, micro_batch=1)
    client = Client(daemon.endpoint, rank=0, world_size=1, timeout=10, attempts=1)
    caught = {}

    def ask():
        try:
            client.batch_at(0)
        except ShuttingDown as e:
            caught["error"] = e

    asking = threading.Thread(target=ask)
    asking.start()
    time.sleep(0.3)
    daemon.process.terminate()
    asking.join(timeout=10)
    daemon.process.kill()  # it would wait for the tokenizer to finish the document
    assert str(caught.get("error")) == "the daemon is shutting down"
    client.close()


def test_bad_settings_and_bad_replies_are_typed(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="rank 2 is not below world size 2"):
        Client("ipc://x", rank=2, world_size=2)
    with pytest.raises(ConfigError, match="not 64 hex digits"):
        Client("ipc://x", rank=0, world_size=1, recipe_hash="abc")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="set both RANK and WORLD_SIZE, or neither"):
        Client("ipc://x")
    monkeypatch.setenv("WORLD_SIZE", "4")
    c = Client(f"ipc://{tmp_path}/x.sock")
    assert (c.rank, c.world_size) == (1, 4)
    c.close()
    with pytest.raises(ProtocolError, match="reply header is 5 bytes, expected 224"):
        decode_header(b"hello")
    with pytest.raises(ProtocolError, match="bad magic"):
        decode_header(b"XXXX" + bytes(92))


def test_a_second_trainer_with_the_same_rank_is_refused_and_a_clean_exit_frees_the_rank(daemon_factory, raw):
    """Protocol v3: a global rank belongs to one trainer process (session). Another is refused
    with `RankOwned` naming the rank; once the owner closes, the rank is free at once."""
    daemon = daemon_factory(world_size=2, micro_batch=1, prefetch=64, extra=["--owner-timeout", "30"])
    owner = Client(daemon.endpoint, rank=0, world_size=2, timeout=10, session=11)
    assert owner.batch_at(0) is not None
    intruder = Client(daemon.endpoint, rank=0, world_size=2, timeout=1, attempts=1, session=22)
    with pytest.raises(RankOwned, match=r"^rank taken: rank 0 \(data-parallel rank 0\) belongs to another trainer process \(session 000000000000000b, which asked") as e:
        intruder.batch_at(5)
    assert e.value.status == 18
    assert owner.batch_at(1).first_window == 2, "the owner goes on"
    owner.close()
    batch = intruder.batch_at(2)
    assert batch is not None and np.array_equal(batch.tokens[0], raw.tokens[4])
    intruder.close()
