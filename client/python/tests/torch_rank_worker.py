"""One torchrun-style trainer rank (run by test_torch.py): RANK/WORLD_SIZE from the environment,
a torchdata StatefulDataLoader (`workers` DataLoader workers) over DsprepIterableDataset. It appends every step's input ids to
`OUT.jsonl` as it trains, saves the loader's state after step `checkpoint_at` to `OUT.ckpt` (a
trainer checkpoint), and, given a checkpoint, resumes from it. It stops after step `last`."""

import json
import sys

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from dsprep_client import DsprepIterableDataset


def main(endpoint: str, out: str, workers: int, last: int, checkpoint_at: int, resume_from: str) -> None:
    loader = StatefulDataLoader(DsprepIterableDataset(endpoint, timeout=20), batch_size=None, num_workers=workers)
    if resume_from:
        loader.load_state_dict(torch.load(resume_from, weights_only=False))
    with open(out + ".jsonl", "a") as f:
        for item in loader:
            f.write(json.dumps({"step": item["step"], "input_ids": item["input_ids"].tolist()}) + "\n")
            f.flush()
            if item["step"] == checkpoint_at:
                torch.save(loader.state_dict(), out + ".ckpt")
            if item["step"] >= last:
                break


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] if len(sys.argv) > 6 else "")
