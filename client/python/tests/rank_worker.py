"""One trainer rank as its own process (run by test_served.py): connects with RANK/WORLD_SIZE
from the environment, pulls every step until the end of the data, and saves what it got."""

import json
import sys

import numpy as np

from dsprep_client import Client


def main(endpoint: str, out: str) -> None:
    client = Client(endpoint, timeout=20, attempts=1)
    tokens, starts, positions, steps = [], [], [], []
    while (batch := client.next_batch()) is not None:
        steps.append(batch.step)
        tokens.append(np.array(batch.tokens))
        positions.append(batch.position_ids)
        starts.extend(s.tolist() for s in batch.doc_starts)
    np.save(out + ".tokens.npy", np.stack(tokens))
    np.save(out + ".positions.npy", np.stack(positions))
    summary = {"rank": client.rank, "world_size": client.world_size, "steps": steps, "num_steps": client.num_steps,
               "micro_batch": client.micro_batch, "recipe_hash": client.recipe_hash, "doc_starts": starts}
    with open(out + ".json", "w") as f:
        json.dump(summary, f)
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
