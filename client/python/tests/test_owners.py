"""One owner per rank for any step time (protocol v6), against the real daemon: the client's
keepalive thread keeps its rank through a step slower than `--owner-timeout`, even while the main
thread is busy, and a client of an earlier session (a zombie of a replaced job) raises
`Superseded` at once, counted in /metrics."""

import pickle
import time

import numpy as np
import pytest

from dsprep_client import Client, RankOwned, Superseded
from dsprep_client.client import Session, process_session
from dsprep_client.protocol import KIND_KEEPALIVE, REQUEST_V6_LEN, encode_request

#: A zombie's session started this long before the owner's (ns).
EARLIER_NS = 10_000_000_000


def busy(seconds: float) -> None:
    """A long training step: the main thread computes (holding the GIL between switches)."""
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        x += sum(range(1000))


def test_the_keepalive_keeps_the_rank_through_a_step_slower_than_the_owner_timeout(daemon_factory, raw):
    daemon = daemon_factory(world_size=2, micro_batch=1, prefetch=4, metrics=True, extra=["--owner-timeout", "1"])
    owner = Client(daemon.endpoint, rank=0, world_size=2, timeout=10, session=0xA1)
    assert np.array_equal(owner.batch_at(0).tokens[0], raw.tokens[0])
    busy(3.0)  # three owner timeouts without a request
    intruder = Client(daemon.endpoint, rank=0, world_size=2, timeout=1, attempts=1, session=0x30)
    with pytest.raises(RankOwned, match=r"belongs to another trainer process \(session 00000000000000a1, which asked 0\.") as e:
        intruder.batch_at(1)
    assert e.value.status == 18
    zombie_started = owner.session_started - EARLIER_NS
    zombie = Client(daemon.endpoint, rank=0, world_size=2, timeout=5, session=0x20, session_started=zombie_started)
    started = time.monotonic()
    with pytest.raises(Superseded) as e:
        zombie.batch_at(1)
    assert time.monotonic() - started < 1.0, "never retried"
    assert e.value.status == 19
    assert e.value.message.startswith(
        f"rank 0 (data-parallel rank 0) belongs to session 00000000000000a1, started at {owner.session_started} ns since the Unix epoch"
    )
    assert e.value.message.endswith(
        f"this session 0000000000000020 started earlier, at {zombie_started} ns: this process belongs to a job that was replaced, and should exit"
    )
    assert str(e.value).startswith("superseded: rank 0")
    assert daemon.metric('dsprep_owner_refused_total{reason="superseded"}') == 1
    assert daemon.metric('dsprep_rank_step{rank="0"}') == 0, "no refused request moved the rank"
    batch = owner.batch_at(1)
    assert np.array_equal(batch.tokens[0], raw.tokens[2]), "the owner goes on with its bytes"
    for client in (zombie, intruder, owner):
        client.close()


def test_a_session_carries_its_start_time_into_requests_and_spawned_workers():
    session = process_session()
    assert isinstance(session, Session) and session.started > 0
    copy = pickle.loads(pickle.dumps(session))
    assert (int(copy), copy.started) == (int(session), session.started), "a spawned worker's"
    beat = encode_request(0, 1, 2, 0, owner=(3, int(session), session.started), kind=KIND_KEEPALIVE)
    assert len(beat) == REQUEST_V6_LEN == 88
    assert beat[6:8] == (3).to_bytes(2, "little")
    assert beat[80:88] == session.started.to_bytes(8, "little")
    v5 = encode_request(0, 1, 2, 0, version=5, owner=(3, int(session), session.started))
    assert len(v5) == 80 and v5[4:8] == bytes([5, 0, 1, 0]) and v5[8:] == beat[8:80], "v5: no start time"
