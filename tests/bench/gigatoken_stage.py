#!/usr/bin/env python3
"""GigaToken's tokenize stage alone, on the documents `tokenize_bench` reads, for a per-core
comparison with dsprep's (tests/bench/tokenize_vs_gigatoken.sh runs both on one pinned core).

usage: gigatoken_stage.py TOKENIZER_JSON DOCS.json.gz [--max-mb M]

DOCS is gzip JSON lines with a `text` field (the bench writes it). A fresh tokenizer object is
built in this process (cold caches; its one-time set-up on the first call is done on a two-word
text outside the clock); only encoding is timed: each document encoded on this
thread (`encode_batch(..., parallel=False)`), as dsprep's stage encodes one document per call.
Prints one JSON line in tokenize_bench's fields (tokens exclude EOS; dsprep's count includes one
EOS per document, which the bench subtracts)."""
import argparse, gzip, json, time

ap = argparse.ArgumentParser()
ap.add_argument("tokenizer"); ap.add_argument("docs")
ap.add_argument("--batch", type=int, default=64, help="documents per encode_batch call")
a = ap.parse_args()

with gzip.open(a.docs, "rt", encoding="utf-8") as f:
    docs = [json.loads(line)["text"] for line in f]
text_bytes = sum(len(d.encode()) for d in docs)

import gigatoken
t0 = time.perf_counter()
tok = gigatoken.Tokenizer(a.tokenizer)
# GigaToken sets itself up on its first call (~0.4 s here); one tiny text outside the clock
# keeps that out, and leaves its caches all but cold.
tok.encode_batch_list(["warm up"], parallel=False)
build = time.perf_counter() - t0
tokens = 0
started, cpu_started = time.perf_counter(), time.thread_time()
for i in range(0, len(docs), a.batch):
    for ids in tok.encode_batch_list(docs[i:i + a.batch], parallel=False):
        tokens += len(ids)
seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
print(json.dumps({"engine": "gigatoken", "docs": len(docs), "bytes": text_bytes, "tokens": tokens,
                  "seconds": seconds, "tokens_per_s": tokens / seconds,
                  "cpu_seconds": cpu_seconds, "tokens_per_cpu_s": tokens / cpu_seconds,
                  "mb_per_s": text_bytes / 1e6 / seconds, "build_seconds": build}))
