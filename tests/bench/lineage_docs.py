#!/usr/bin/env python3
"""No document twice, none skipped, across three changes of course (issue 45), measured from
the packed document positions, not from counters.

Three sources of documents whose text names them ("doc source=sK file=F row=R ..."), served by
real daemons through a run with three changes of course (A; B: reweighted and a source added;
C: a source removed and the global batch doubled), SIGKILLed between, then `dsprep pack
--lineage` of the state directory (byte-equal to what the ranks got: tests/lineage.rs). Every
packed document is cut at its document start, decoded, and its (source, file, row) read back.
Prints, per source, the documents packed, duplicates, and the rows missing below each file's
highest packed row (what a change dropped, and a source's last look-ahead at the stream's end).

With --units, the three recipes also change how the stream is made: A mixes in documents and
packs `concat`; B mixes in tokens (`[mix] unit = "tokens"`); C packs `best_fit` (its pack is
format 7: its segments pack differently).

usage: tests/bench/lineage_docs.py [DSPREP_BIN] [--units]   (needs the `tokenizers` package)
"""

from __future__ import annotations

import collections
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
UNITS = "--units" in sys.argv
BIN = Path(ARGS[0]) if ARGS else ROOT / "target" / "release" / "dsprep"
TOKENIZER = ROOT / "config" / "tokenizers" / "gpt2" / "tokenizer.json"
WORDS = "the of and to in is was for on that with as by at from it an be this which or are".split()
FILES, ROWS = 3, 1500


def corpus(dir: Path) -> None:
    rng = random.Random(7)
    for s in range(3):
        (dir / f"s{s}").mkdir(parents=True)
        for f in range(FILES):
            with gzip.open(dir / f"s{s}" / f"part-{f}.jsonl.gz", "wt") as out:
                for r in range(ROWS):
                    filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 300)))
                    out.write(json.dumps({"text": f"doc source=s{s} file={f} row={r}. {filler}"}) + "\n")


def recipe(dir: Path, name: str, weights: dict, buffer: int, unit="documents", strategy="concat") -> Path:
    text = f"""version = 1
[tokenizer]
path = "{TOKENIZER}"
eos = "<|endoftext|>"
[packing]
seq_len = 256
strategy = "{strategy}"
[shuffle]
seed = 7
buffer_size = {buffer}
[mix]
stopping = "first_exhausted"
unit = "{unit}"
"""
    for source, weight in weights.items():
        text += f'[[source]]\nname = "{source}"\nweight = {weight}\nfiles = ["{dir}/{source}/*.jsonl.gz"]\nformat = "jsonl.gz"\n'
    path = dir / name
    path.write_text(text)
    return path


def serve(dir: Path, recipe: Path, world: int, mb: int, steps: range, extra: list) -> str:
    log = dir / "serve.log"
    endpoint = f"ipc://{dir}/d.sock"
    daemon = subprocess.Popen(
        [str(BIN), "serve", "--recipe", str(recipe), "--world-size", str(world), "--micro-batch", str(mb),
         "--endpoint", endpoint, "--metrics", "off", "--state-dir", str(dir / "state"), "--checkpoint-every", "5", *extra],
        stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    taps = [subprocess.Popen([str(BIN), "tap", "--endpoint", endpoint, "--rank", str(r), "--world-size", str(world),
                              "--start-step", str(steps.start), "--steps", str(len(steps)), "--out", str(dir / f"tap{r}.bin")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for r in range(world)]
    for t in taps:
        assert t.wait(timeout=600) == 0, log.read_text()
    daemon.kill()  # SIGKILL
    daemon.wait()
    return log.read_text()


def main() -> None:
    tok = Tokenizer.from_file(str(TOKENIZER))
    eos = tok.token_to_id("<|endoftext|>")
    with tempfile.TemporaryDirectory() as tmp:
        dir = Path(tmp)
        corpus(dir)
        a = recipe(dir, "a.toml", {"s0": 0.6, "s1": 0.4}, 500)
        unit = "tokens" if UNITS else "documents"
        b = recipe(dir, "b.toml", {"s0": 0.3, "s1": 0.3, "s2": 0.4}, 800, unit)
        c = recipe(dir, "c.toml", {"s0": 0.5, "s2": 0.5}, 300, unit, "best_fit" if UNITS else "concat")
        started = time.time()
        serve(dir, a, 2, 2, range(0, 60), [])
        serve(dir, b, 2, 2, range(60, 150), ["--resume", "latest", "--change-course"])
        log = serve(dir, c, 4, 2, range(150, 250), ["--resume", "latest", "--change-course"])
        out = dir / "packed"
        subprocess.run([str(BIN), "pack", "--lineage", str(dir / "state"), "--out", str(out), "--quiet"], check=True)
        m = json.loads((out / "manifest.json").read_text())
        tokens = np.concatenate([np.fromfile(out / s["file"], dtype="<u2") for s in m["shards"]])
        starts = np.fromfile(out / "doc_starts.u32", dtype="<u4").astype(np.int64)
        offsets = np.fromfile(out / "doc_starts_offsets.u64", dtype="<u8")
        wt = m["window_tokens"]
        at = np.concatenate([w * wt + starts[offsets[w]:offsets[w + 1]] for w in range(m["num_windows"])])
        seen = collections.Counter()
        unread = 0
        for k, begin in enumerate(at):
            end = at[k + 1] if k + 1 < len(at) else len(tokens)
            ids = [int(t) for t in tokens[begin:end] if t != eos]
            found = re.match(r"doc source=(s\d) file=(\d+) row=(\d+)\.", tok.decode(ids[:24]))
            if found is None:
                # The last document, cut by the end of the packed windows; under best_fit also
                # the later pieces of a document longer than a window (each piece starts one).
                unread += 1
                continue
            seen[(found[1], int(found[2]), int(found[3]))] += 1
        dropped = {d["source"]: d["documents"] for s in m["lineage"] for d in s.get("dropped", [])}
        for source in ("s0", "s1", "s2"):
            rows = [(f, r) for (s, f, r) in seen if s == source]
            twice = sum(1 for key, n in seen.items() if key[0] == source and n > 1)
            missing, partial = 0, []
            for f in range(FILES):
                packed = [r for (g, r) in rows if g == f]
                if packed:
                    missing += max(packed) + 1 - len(packed)
                    if len(packed) < ROWS:
                        partial.append((len(packed), max(packed)))
            # Read in shard order, a source has whole files behind it and at most one begun: its
            # rows read there are a prefix, each packed once or dropped by a change.
            n_dropped = dropped.get(source, 0)
            prefix = [(p + n_dropped, top) for p, top in partial]
            print(json.dumps({"source": source, "documents": sum(n for key, n in seen.items() if key[0] == source),
                              "distinct": len(rows), "duplicates": twice, "missing_below_highest_row": missing,
                              "dropped_by_changes": n_dropped, "files_begun": len(partial),
                              "prefix_rows_read_and_highest_packed": prefix,
                              "prefix_holds": len(partial) <= 1 and all(top < n for n, top in prefix)}))
        print(json.dumps({"segments": [(s["from_step"], s["from_window"], s["from_documents"], s["global_batch"]) for s in m["lineage"]],
                          "format": m.get("format"),
                          "documents_packed": sum(seen.values()), "pieces_without_header": unread,
                          "seconds": round(time.time() - started, 1),
                          "changed": log.count("changed course at step 150")}))


if __name__ == "__main__":
    main()
