"""The torchtitan loader's per-step data time against `DsprepIterableDataset` alone, on the same
daemon: a daemon serving `--world-size 4`, ranks 0 and 1 read by `DsprepIterableDataset` iterated
directly (the second one measures the noise between two identical readers), rank 2 by
`StatefulDataLoader(DsprepIterableDataset, batch_size=None)`, rank 3 by
`dsprep_client.torchtitan.DsprepDataLoader` (built by its config, as torchtitan's trainer builds
it). Each step takes one batch from each in turn (order rotated every step), timing each
`next()`, then sleeps `--compute-ms` (the model's step) so the daemon stays ahead of the ranks,
as in training. Prints one JSON line: median and p99 per step (µs) of each, and the overhead of
the torchtitan loader over the dataset alone.

  python titan_overhead.py --dsprep target/release/dsprep --recipe RECIPE \
      --micro-batch 2 --steps 1200 --compute-ms 10 [--titan-rank 0]

(the quickstart has about 45 steps at world 4 × micro batch 8: use a larger corpus, e.g. the
100 MB corpus of BENCHMARKS.md; `--titan-rank 0` swaps the loader's and the plain dataset's
ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsprep", required=True, help="the dsprep binary")
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--compute-ms", type=float, default=10.0)
    ap.add_argument("--titan-rank", type=int, default=3, help="the torchtitan loader's rank (the dataset alone takes rank 3 when this is 0)")
    args = ap.parse_args()

    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from dsprep_client import DsprepIterableDataset
    from dsprep_client.torchtitan import TORCHTITAN_VERSION, DsprepDataLoader

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp())
    endpoint = f"ipc://{work / 'd.sock'}"
    cmd = [args.dsprep, "serve", "--recipe", args.recipe, "--endpoint", endpoint, "--world-size", "4"]
    cmd += ["--micro-batch", str(args.micro_batch), "--prefetch", "64", "--metrics", "off"]
    log = open(work / "daemon.log", "w+")
    daemon = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL, env=dict(os.environ, DSPREP_LOG="info"))
    try:
        for _ in range(600):
            log.seek(0)
            if "serving recipe" in log.read():
                break
            time.sleep(0.1)
        titan_rank = args.titan_rank
        plain = iter(DsprepIterableDataset(endpoint, rank=3 if titan_rank == 0 else 0, world_size=4, timeout=60))
        twin = iter(DsprepIterableDataset(endpoint, rank=1, world_size=4, timeout=60))
        stateful = iter(StatefulDataLoader(DsprepIterableDataset(endpoint, rank=2, world_size=4, timeout=60), batch_size=None))
        titan_loader = DsprepDataLoader.Config(endpoint=endpoint, timeout=60).build(
            dp_world_size=4, dp_rank=titan_rank, tokenizer=None, seq_len=None, local_batch_size=args.micro_batch
        )
        titan = iter(titan_loader)
        names = ["dataset", "dataset_twin", "stateful_dataloader", "torchtitan"]
        iters = [plain, twin, stateful, titan]
        times = {n: [] for n in names}
        shape, held = None, [None] * 4
        for step in range(args.warmup + args.steps):
            order = [(step + k) % 4 for k in range(4)]
            for k in order:
                t0 = time.perf_counter()
                held[k] = next(iters[k])  # each reader frees only its own previous batch here
                dt = time.perf_counter() - t0
                if step >= args.warmup:
                    times[names[k]].append(dt)
                if k == 3 and shape is None:
                    shape = list(held[k][0]["input"].shape)
            time.sleep(args.compute_ms / 1000)
        titan_loader.state_dict()  # the state it would checkpoint
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)

    def stats(xs):
        a = np.array(xs) * 1e6
        return {"median_us": round(float(np.median(a)), 1), "p99_us": round(float(np.percentile(a, 99)), 1), "mean_us": round(float(a.mean()), 1)}

    out = {n: stats(times[n]) for n in names}
    base, titan_s = out["dataset"], out["torchtitan"]
    step_ms = args.compute_ms + base["median_us"] / 1000
    out.update(
        steps=args.steps,
        batch_shape=shape,
        compute_ms=args.compute_ms,
        torchtitan_rank=args.titan_rank,
        torchtitan_extra_median_us=round(titan_s["median_us"] - base["median_us"], 1),
        twin_extra_median_us=round(out["dataset_twin"]["median_us"] - base["median_us"], 1),
        torchtitan_extra_share_of_data_time=round((titan_s["median_us"] - base["median_us"]) / base["median_us"], 4),
        torchtitan_extra_share_of_step=round((titan_s["median_us"] - base["median_us"]) / 1000 / step_ms, 5),
        torchtitan_version=TORCHTITAN_VERSION,
        torch=torch.__version__,
        machine=f"{platform.machine()} {os.cpu_count()} cores",
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
