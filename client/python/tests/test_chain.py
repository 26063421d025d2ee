"""The stream chain on the wire (protocol v2): every served step's rows hash to the chain the
daemon states, the chain is the one computed here with hashlib over the packed windows (FORMAT.md
"Stream chain"), a resumed client checks it continues its own stream, and a v1 request is still
answered in v1 (no chain)."""

import numpy as np
import pytest
import zmq

from dsprep_client import ChainMismatch, Client
from dsprep_client.protocol import REPLY_HEADER_V1_LEN, decode_header, decode_reply, encode_request


def test_every_step_carries_the_chain_computed_by_hand(daemon_factory, raw):
    world, mb, steps = 2, 2, 6
    daemon = daemon_factory(world_size=world, micro_batch=mb, prefetch=4)
    expected = [raw.chain_before(w) for w in range(steps * world * mb + 1)]
    clients = [Client(daemon.endpoint, rank=r, world_size=world, timeout=10) for r in range(world)]
    for step in range(steps):
        for rank, c in enumerate(clients):
            batch = c.next_batch()
            first = (step * world + rank) * mb
            assert batch.chain.step_start == expected[step * world * mb]
            assert batch.chain.rows_start == expected[first]
            assert batch.chain.rows_end == expected[first + mb]
            assert batch.chain.step_end == expected[(step + 1) * world * mb]
            assert c.stream_chain == (step + 1, expected[(step + 1) * world * mb])
    state = clients[0].state_dict()
    assert state["stream_chain"] == [steps, expected[steps * world * mb].hex()]
    for c in clients:
        c.close()


def test_a_resumed_client_checks_that_the_daemon_continues_its_stream(daemon_factory, raw):
    daemon = daemon_factory(world_size=1, micro_batch=1, prefetch=8)
    first = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    for _ in range(3):
        first.next_batch()
    saved = first.state_dict()
    first.close()

    # The saved state continues: step 3 starts where step 2 ended.
    resumed = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    resumed.load_state_dict(saved)
    assert resumed.next_batch().step == 3

    # A trainer whose stream stood elsewhere is refused loudly, and the step is not consumed.
    other = dict(saved, stream_chain=[3, "11" * 32])
    wrong = Client(daemon.endpoint, rank=0, world_size=1, timeout=10)
    wrong.load_state_dict(other)
    with pytest.raises(ChainMismatch, match=r"the stream this trainer consumed stands at (11){32} before step 3, the daemon's step 3 starts from [0-9a-f]{64}: the daemon is not continuing the same stream"):
        wrong.next_batch()
    assert wrong.next_step == 3
    for c in (resumed, wrong):
        c.close()


def test_a_version_1_request_gets_a_version_1_reply(daemon_factory, raw):
    daemon = daemon_factory(world_size=1, micro_batch=1)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(daemon.endpoint)
    socket.send(encode_request(5, 0, 1, 2, version=1))
    assert socket.poll(10_000), "the daemon replies"
    frames = socket.recv_multipart(copy=False)
    assert len(frames[0].bytes) == REPLY_HEADER_V1_LEN
    header = decode_header(frames[0])
    assert (header.version, header.chain) == (1, None)
    assert np.array_equal(decode_reply(frames).tokens[0], raw.tokens[2])
    socket.close(linger=0)


def test_a_version_4_request_gets_the_version_4_header_and_5_adds_the_segment(daemon_factory):
    daemon = daemon_factory(world_size=1, micro_batch=1)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(daemon.endpoint)
    replies = {}
    for version in (4, 5):
        socket.send(encode_request(5, 0, 1, 2, version=version))
        assert socket.poll(10_000), "the daemon replies"
        replies[version] = socket.recv_multipart()
    v4, v5 = replies[4], replies[5]
    assert (len(v4[0]), len(v5[0])) == (224, 256)
    assert v4[0][41:48] == bytes(7), "v4's reserved bytes stay zero"
    assert v5[0][44:48] == bytes(4), "segment 0: a stream of one recipe"
    assert v5[0][224:] == v5[0][48:80], "its recipe is the daemon's"
    assert v4[0][6:] == v5[0][6:224] and v4[1:] == v5[1:]
    h4, h5 = decode_header(v4[0]), decode_header(v5[0])
    assert (h4.segment, h5.segment) == (None, (0, h5.recipe_hash))
    batch = decode_reply(v5)
    assert (batch.segment, batch.segment_recipe_hash) == (0, batch.recipe_hash)
    assert decode_reply(v4).segment is None
    socket.close(linger=0)
