#!/usr/bin/env python3
"""The mix of a packed directory along its stream, as BENCHMARKS.md "Along the stream" shows it.

    python3 tests/bench/mix_spans.py PACKED_DIR SPANS_CSV [--span-points 2] [--prefix-tokens 10000000]

SPANS_CSV is `dsprep inspect PACKED_DIR --mix --every N --csv SPANS_CSV`. Prints a markdown
table, one row per source: its target, the worst |share - target| over prefixes of at least
--prefix-tokens tokens, how many full spans are off by more than --span-points, the median / p95
/ max span deviation (points), and the longest document and the p99 document (tokens, BOS/EOS
included) read from the directory's document index. Standard library only.
"""
import argparse
import array
import csv
import json
import os
import statistics


def document_lengths(packed):
    """Per source index, the lengths of its documents in stream order (the last one may be cut)."""
    manifest = json.load(open(os.path.join(packed, "manifest.json")))
    window = manifest["window_tokens"]

    def read(name, code):
        values = array.array(code)
        with open(os.path.join(packed, name), "rb") as f:
            values.frombytes(f.read())
        return values

    starts, offsets = read("doc_starts.u32", "I"), read("doc_starts_offsets.u64", "Q")
    sources = read("doc_sources.u16", "H")
    lengths = {}
    last = None  # (source, global start)
    for w in range(len(offsets) - 1):
        for k in range(offsets[w], offsets[w + 1]):
            at = w * window + starts[k]
            if last is not None:
                lengths.setdefault(last[0], []).append(at - last[1])
            last = (sources[k], at)
    if last is not None:
        lengths.setdefault(last[0], []).append((len(offsets) - 1) * window - last[1])
    return manifest, lengths


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("packed")
    ap.add_argument("spans_csv")
    ap.add_argument("--span-points", type=float, default=2.0)
    ap.add_argument("--prefix-tokens", type=int, default=10_000_000)
    args = ap.parse_args()
    manifest, lengths = document_lengths(args.packed)
    names = [s["name"] for s in manifest["sources"]]
    targets = {s["name"]: s["target_fraction"] for s in manifest["sources"]}
    rows = list(csv.DictReader(open(args.spans_csv)))
    every = int(rows[0]["tokens"]) if rows else 0
    full = [r for r in rows if every and int(r["tokens"]) % every == 0]
    print(f"{len(full)} spans of {every} tokens, {rows[-1]['tokens'] if rows else 0} tokens in all")
    print()
    print("| source | target | worst prefix ≥ %d M (points) | spans over ±%g points | median / p95 / max span deviation | longest document (p99) |"
          % (args.prefix_tokens // 1_000_000, args.span_points))
    print("|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        target = targets[name]
        spans = [abs(float(r[f"span:{name}"]) - target) * 100 for r in full]
        prefix = [abs(float(r[f"total:{name}"]) - target) * 100 for r in rows
                  if int(r["tokens"]) >= args.prefix_tokens]
        over = sum(d > args.span_points for d in spans)
        docs = lengths.get(i, [])
        print("| %s | %.0f %% | %.2f | %d | %.2f / %.2f / %.2f | %s (%s) |" % (
            name, target * 100, max(prefix, default=0.0), over,
            statistics.median(spans) if spans else 0, percentile(spans, 95), max(spans, default=0),
            f"{max(docs, default=0):,}", f"{percentile(docs, 99):,}"))


if __name__ == "__main__":
    main()
