"""Python client fetch benchmark, the counterpart of client/examples/fetch_bench.rs: `--ranks`
threads (one `Client` each, ranks 0..ranks of `--world-size`) re-request the `--held` steps a
warm daemon holds, round-robin, and time every `batch_at`. With `--packed DIR` it instead reads
the same windows from a `dsprep pack` directory through numpy.memmap (`PackedDataset`).
Prints one JSON line. `--touch` sums every batch's tokens, so the bytes are really read (a
served batch has already crossed the socket; a memmap view has not been read until touched).

  python fetch_bench.py --endpoint ipc://d.sock --world-size 8 --ranks 1 --held 8 --requests 2000
  python fetch_bench.py --packed packed/ --micro-batch 8 --world-size 8 --ranks 1 --held 8 --requests 2000
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np

from dsprep_client import Client, PackedDataset


def run_rank(args: argparse.Namespace, rank: int, out: list) -> None:
    if args.packed:
        source = PackedDataset(args.packed, micro_batch=args.micro_batch, rank=rank, world_size=args.world_size)
    else:
        source = Client(args.endpoint, rank=rank, world_size=args.world_size, timeout=30, attempts=1)
    latencies, nbytes, checksum = [], 0, 0
    for i in range(args.requests):
        t = time.perf_counter()
        batch = source.batch_at(i % args.held)
        if args.touch:
            checksum += int(batch.tokens.sum(dtype=np.uint64))
        latencies.append(time.perf_counter() - t)
        nbytes += batch.tokens.nbytes
    source.close()
    out.append((latencies, nbytes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint")
    p.add_argument("--packed")
    p.add_argument("--micro-batch", type=int, default=1, help="packed only (served: the daemon's)")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--held", type=int, required=True)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--touch", action="store_true")
    args = p.parse_args()
    if bool(args.endpoint) == bool(args.packed):
        p.error("give exactly one of --endpoint and --packed")
    results: list = []
    threads = [threading.Thread(target=run_rank, args=(args, r, results)) for r in range(args.ranks)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    all_s = sorted(x for latencies, _ in results for x in latencies)
    nbytes = sum(b for _, b in results)
    pct = lambda q: all_s[min(int(len(all_s) * q), len(all_s) - 1)] * 1e6  # noqa: E731
    print(json.dumps({
        "source": "packed" if args.packed else args.endpoint.split("://")[0],
        "ranks": args.ranks,
        "touch": args.touch,
        "requests": len(all_s),
        "batch_bytes": nbytes // len(all_s),
        "p50_us": round(pct(0.50), 1),
        "p99_us": round(pct(0.99), 1),
        "max_us": round(all_s[-1] * 1e6, 1),
        "gb_per_s": round(nbytes / wall / 1e9, 3),
        "batches_per_s": round(len(all_s) / wall),
    }))


if __name__ == "__main__":
    main()
