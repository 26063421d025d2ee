"""Fixtures for the Python client's tests: the real `dsprep` binary (`DSPREP_BIN`, default
`<repo>/target/debug/dsprep`), a `dsprep serve` process on an ipc socket in a temp dir (or the
endpoint given), and the quickstart packed once per session by `dsprep pack` (as shipped, and
as a `best_fit` variant whose windows end in padding). No mocks: real processes, real sockets.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "config" / "quickstart.toml"


def dsprep_bin() -> Path:
    path = Path(os.environ.get("DSPREP_BIN", REPO / "target" / "debug" / "dsprep"))
    if not path.is_file():
        pytest.fail(
            f"the dsprep binary is missing at {path}: build it with `cargo build -p dsprep` "
            "(or point DSPREP_BIN at one); these tests run the real daemon",
            pytrace=False,
        )
    return path


class Daemon:
    """`dsprep serve` on `ipc://<dir>/d.sock`, ready once it logs that it serves; stopped by `stop()`."""

    def __init__(
        self,
        tmp: Path,
        recipe: Path,
        world_size: int,
        micro_batch: int,
        prefetch: int = 4,
        metrics: bool = False,
        extra: Sequence[str] = (),
        endpoint: Optional[str] = None,
    ):
        self.endpoint = endpoint or f"ipc://{tmp / 'd.sock'}"
        args = [str(dsprep_bin()), "serve", "--recipe", str(recipe), "--endpoint", self.endpoint]
        args += ["--world-size", str(world_size), "--micro-batch", str(micro_batch), "--prefetch", str(prefetch)]
        args += ["--metrics", "127.0.0.1:0" if metrics else "off", *extra]
        env = dict(os.environ, DSPREP_LOG="info")
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
        self.log: List[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()
        deadline = time.monotonic() + 30
        while not self._ready.wait(0.05):
            if self.process.poll() is not None:
                time.sleep(0.1)
                raise RuntimeError(f"dsprep serve exited with {self.process.returncode}:\n" + "\n".join(self.log))
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("dsprep serve did not get ready in 30 s:\n" + "\n".join(self.log))
        found = [re.search(r"metrics on (http://\S+)", line) for line in self.log]
        self.metrics_url: Optional[str] = next((m.group(1) for m in found if m), None)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip("\n"))
            if "serving recipe" in line:
                self._ready.set()

    def metric(self, series: str) -> float:
        """One series' value from `/metrics`, e.g. `dsprep_replies_total{status="step_ahead"}`."""
        assert self.metrics_url, "started without metrics"
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            body = response.read().decode()
        for line in body.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        raise KeyError(f"{series} not in:\n{body}")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as when a node dies."""
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (the daemon shuts down cleanly and removes its socket file), SIGKILL after 5 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def daemon_factory(tmp_path):
    started: List[Daemon] = []

    def start(
        recipe: Path = QUICKSTART,
        world_size: int = 1,
        micro_batch: int = 1,
        prefetch: int = 4,
        metrics: bool = False,
        in_dir: Optional[Path] = None,
        extra: Sequence[str] = (),
        endpoint: Optional[str] = None,
    ) -> Daemon:
        where = in_dir or tmp_path / f"daemon{len(started)}"
        where.mkdir(exist_ok=True)
        d = Daemon(where, recipe, world_size, micro_batch, prefetch, metrics, extra, endpoint)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def pack(recipe: Path, out: Path) -> Path:
    done = subprocess.run(
        [str(dsprep_bin()), "pack", "--recipe", str(recipe), "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def packed_dir(tmp_path_factory) -> Path:
    """The quickstart packed by `dsprep pack`: what every rank must be served."""
    return pack(QUICKSTART, tmp_path_factory.mktemp("pack") / "packed")


#: The `best_fit` variant's `[packing]` additions: a pool small enough that the quickstart's
#: windows often end in padding.
BEST_FIT_PACKING = 'strategy = "best_fit"\npool_documents = 200\n'


@pytest.fixture(scope="session")
def best_fit_recipe(tmp_path_factory) -> Path:
    """The quickstart's recipe with `[packing] strategy = "best_fit"` and `pool_documents = 200`,
    in a temp dir (its relative paths made absolute)."""
    text = QUICKSTART.read_text()
    config = QUICKSTART.parent
    edits = [("[packing]\n", "[packing]\n" + BEST_FIT_PACKING), ('"tokenizers/', f'"{config}/tokenizers/'), ('"samples/', f'"{config}/samples/')]
    for old, new in edits:
        assert old in text, f"{QUICKSTART} changed: no {old!r} in it"
        text = text.replace(old, new)
    recipe = tmp_path_factory.mktemp("best_fit") / "recipe.toml"
    recipe.write_text(text)
    return recipe


@pytest.fixture(scope="session")
def best_fit_dir(best_fit_recipe) -> Path:
    """The `best_fit` quickstart packed by `dsprep pack` (format 5)."""
    return pack(best_fit_recipe, best_fit_recipe.parent / "packed")


class RawWindows:
    """The packed windows read straight from the files with plain numpy (no dsprep_client code),
    the reference every served or packed batch is compared with."""

    def __init__(self, packed: Path):
        import json

        self.manifest = m = json.loads((packed / "manifest.json").read_text())
        dtype = "<u2" if m["dtype"] == "u16" else "<u4"
        self.window_tokens = m["window_tokens"]
        self.tokens = np.concatenate([np.fromfile(packed / s["file"], dtype=dtype) for s in m["shards"]]).reshape(-1, self.window_tokens)
        self.starts = np.fromfile(packed / "doc_starts.u32", dtype="<u4")
        self.offsets = np.fromfile(packed / "doc_starts_offsets.u64", dtype="<u8")
        self.recipe_hash = m["recipe_hash"]
        self.num_windows = m["num_windows"]
        self.doc_sources_all = np.fromfile(packed / "doc_sources.u16", dtype="<u2")
        self.lead_sources = np.fromfile(packed / "lead_sources.u16", dtype="<u2")
        # Format 5 (best_fit): each window's tokens before its padding; without it, every token.
        if "real_tokens" in m:
            self.real_tokens = np.fromfile(packed / "real_tokens.u32", dtype="<u4")
        else:
            self.real_tokens = np.full(self.num_windows, self.window_tokens)

    def doc_sources(self, window: int) -> np.ndarray:
        return self.doc_sources_all[self.offsets[window] : self.offsets[window + 1]]

    def input_sources(self, window: int) -> list:
        """The source of each input token of `window`, token by token in plain Python."""
        starts = dict(zip(self.doc_starts(window).tolist(), self.doc_sources(window).tolist()))
        source, out = int(self.lead_sources[window]), []
        for t in range(self.window_tokens - 1):
            source = starts.get(t, source)
            out.append(source)
        return out

    def chain_before(self, window: int) -> bytes:
        """The stream chain before `window` (FORMAT.md "Stream chain"), by hand with hashlib."""
        import hashlib

        at = bytes(32)
        for w in range(window):
            at = hashlib.sha256(at + hashlib.sha256(self.tokens[w].tobytes()).digest()).digest()
        return at

    def doc_starts(self, window: int) -> np.ndarray:
        return self.starts[self.offsets[window] : self.offsets[window + 1]]

    def rank_windows(self, step: int, rank: int, world_size: int, micro_batch: int) -> range:
        first = (step * world_size + rank) * micro_batch
        return range(first, first + micro_batch)


@pytest.fixture(scope="session")
def raw(packed_dir) -> RawWindows:
    return RawWindows(packed_dir)


@pytest.fixture(scope="session")
def best_fit_raw(best_fit_dir) -> RawWindows:
    return RawWindows(best_fit_dir)
