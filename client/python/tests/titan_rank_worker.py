"""One torchtitan data-parallel rank (run by test_torchtitan.py): a gloo process group from
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, `DsprepDataLoader` built through torchtitan's config
(`Config.build(...)`, as torchtitan's trainer builds its data loader), and its state in
`torch.distributed.checkpoint` under "dataloader", as torchtitan's CheckpointManager keeps it.

argv: endpoint, out (this rank's batches go to OUT.jsonl), local batch size, steps to take,
checkpoint dir, and "save:N" (save after N batches, then take the rest) or "load" (load first).
"""

import json
import os
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from dsprep_client.torchtitan import DsprepDataLoader


def main(endpoint: str, out: str, local_batch: int, steps: int, ckpt: str, mode: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = DsprepDataLoader.Config(endpoint=endpoint, timeout=20).build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=512, local_batch_size=local_batch
    )
    if mode == "load":
        dcp.load({"dataloader": loader}, checkpoint_id=ckpt)
    save_after = int(mode.split(":")[1]) if mode.startswith("save:") else -1
    it = iter(loader)
    with open(f"{out}.jsonl", "a") as f:
        for taken in range(steps):
            if taken == save_after:
                dcp.save({"dataloader": loader}, checkpoint_id=ckpt)
            inputs, labels = next(it)
            f.write(json.dumps({"input": inputs["input"].tolist(), "positions": inputs["positions"].tolist(), "labels": labels.tolist()}) + "\n")
            f.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
