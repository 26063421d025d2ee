"""Authenticated serving from Python: pyzmq reads the key files `dsprep keygen` writes (and the
daemon reads the ones pyzmq's `zmq.auth` writes), a client with allowed keys reads exactly the
packed windows from a CURVE daemon on tcp://127.0.0.1, and a client without keys, with a key
not allowed, or with the wrong server key raises `Unauthorized` and moves nothing."""

import os
import socket
import stat
import subprocess
import time

import numpy as np
import pytest
import zmq
import zmq.auth

from conftest import dsprep_bin
from dsprep_client import Client, ConfigError, Unauthorized


def keygen(path):
    done = subprocess.run([str(dsprep_bin()), "keygen", "--out", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return f"{path}.key", f"{path}.key_secret"


def free_tcp_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def keys(tmp_path):
    """The daemon's keys, a trainer made by `dsprep keygen` and one made by pyzmq (both allowed),
    and a stranger (not allowed)."""
    server = keygen(tmp_path / "server")
    trainer = keygen(tmp_path / "trainer")
    stranger = keygen(tmp_path / "stranger")
    allow = tmp_path / "allow"
    allow.mkdir()
    (allow / "trainer.key").write_bytes(open(trainer[0], "rb").read())
    made = tmp_path / "pyzmq"
    made.mkdir()
    pyzmq_trainer = zmq.auth.create_certificates(str(made), "pytrainer")
    (allow / "pytrainer.key").write_bytes(open(pyzmq_trainer[0], "rb").read())
    return {"server": server, "trainer": trainer, "pyzmq": pyzmq_trainer, "stranger": stranger, "allow": allow}


def curve_daemon(daemon_factory, keys, **kwargs):
    extra = ["--curve-secret-key", keys["server"][1], "--curve-allow", str(keys["allow"])]
    return daemon_factory(extra=extra, endpoint=free_tcp_endpoint(), metrics=True, **kwargs)


def test_pyzmq_loads_the_key_files_dsprep_keygen_writes(tmp_path):
    assert zmq.has("curve"), "pyzmq wheels bundle a libzmq with CURVE"
    public_file, secret_file = keygen(tmp_path / "node")
    for path in (public_file, secret_file):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    public, none = zmq.auth.load_certificate(public_file)
    assert len(public) == 40 and none is None
    public_again, secret = zmq.auth.load_certificate(secret_file)
    assert public_again == public and len(secret) == 40
    assert zmq.curve_public(secret) == public, "the secret key is the public key's"
    assert zmq.auth.load_certificates(str(tmp_path)) == {public: True}, "an allow list of its *.key"
    again = subprocess.run([str(dsprep_bin()), "keygen", "--out", str(tmp_path / "node")], capture_output=True, text=True, timeout=30)
    assert again.returncode == 1
    assert again.stderr.strip() == (
        f"error: {public_file}: already exists: pass --force to replace it (then give the new public key to every "
        "side that has the old one)"
    )


def test_python_clients_with_allowed_keys_read_the_packed_windows(daemon_factory, keys, raw, monkeypatch):
    world, mb = 2, 2
    daemon = curve_daemon(daemon_factory, keys, world_size=world, micro_batch=mb, prefetch=4)
    by_argument = Client(daemon.endpoint, rank=0, world_size=world, timeout=10, curve_server_key=keys["server"][0], curve_client_key=keys["pyzmq"][1])
    monkeypatch.setenv("DSPREP_CURVE_SERVER_KEY", keys["server"][0])
    monkeypatch.setenv("DSPREP_CURVE_CLIENT_KEY", keys["trainer"][1])
    by_environment = Client(daemon.endpoint, rank=1, world_size=world, timeout=10)
    for step in range(6):
        for rank, client in enumerate((by_argument, by_environment)):
            batch = client.batch_at(step)
            assert np.array_equal(batch.tokens, raw.tokens[list(raw.rank_windows(step, rank, world, mb))])
    by_argument.close()
    by_environment.close()
    assert daemon.metric("dsprep_auth_accepted_total") >= 2


def test_refused_python_clients_raise_unauthorized_and_move_nothing(daemon_factory, keys, monkeypatch):
    daemon = curve_daemon(daemon_factory, keys, world_size=2, micro_batch=1, prefetch=4)
    deadline = time.monotonic() + 60
    while daemon.metric('dsprep_steps{kind="produced"}') < 4:  # the prefetch window full: it stands still
        assert time.monotonic() < deadline, "\n".join(daemon.log)
        time.sleep(0.05)
    series = ['dsprep_rank_step{rank="0"}', 'dsprep_rank_step{rank="1"}', 'dsprep_steps{kind="held"}']
    before = [daemon.metric(s) for s in series]
    endpoint = daemon.endpoint
    monkeypatch.delenv("DSPREP_CURVE_SERVER_KEY", raising=False)
    monkeypatch.delenv("DSPREP_CURVE_CLIENT_KEY", raising=False)
    cases = [
        ({}, f"the daemon at {endpoint} serves with CURVE and this client has no keys"),
        (
            {"curve_server_key": keys["server"][0], "curve_client_key": keys["stranger"][1]},
            f"the daemon at {endpoint} refused this client's CURVE key (ZAP status 400)",
        ),
        (
            {"curve_server_key": keys["stranger"][0], "curve_client_key": keys["trainer"][1]},
            f"the daemon at {endpoint} broke off 3 CURVE handshakes in a row",
        ),
    ]
    for rank in range(2):
        for kwargs, message in cases:
            client = Client(endpoint, rank=rank, world_size=2, timeout=5, attempts=2, **kwargs)
            with pytest.raises(Unauthorized) as e:
                client.batch_at(3)
            assert str(e.value).startswith(message), str(e.value)
            client.close()
    assert [daemon.metric(s) for s in series] == before, "nothing moved"
    assert daemon.metric('dsprep_auth_refused_total{reason="key_not_allowed"}') >= 2
    assert daemon.metric("dsprep_auth_accepted_total") == 0


def test_one_key_without_the_other_is_a_config_error(keys, monkeypatch):
    monkeypatch.setenv("DSPREP_CURVE_SERVER_KEY", keys["server"][0])
    monkeypatch.delenv("DSPREP_CURVE_CLIENT_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"^DSPREP_CURVE_SERVER_KEY is set but DSPREP_CURVE_CLIENT_KEY is not"):
        Client("tcp://127.0.0.1:1", rank=0, world_size=1)
    with pytest.raises(ConfigError, match=r"holds no secret-key"):
        Client("tcp://127.0.0.1:1", rank=0, world_size=1, curve_server_key=keys["server"][0], curve_client_key=keys["trainer"][0])
