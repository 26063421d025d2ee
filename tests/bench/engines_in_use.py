#!/usr/bin/env python3
"""Issue 49's targets from a tests/bench/engines.sh run with ENGINES="auto before hf1 gigatoken":
per tokenizer, the engine `auto` runs (from its engine line), and per CPU-second of the encoding
thread, medians over rounds of each round's ratio (the engines of a round run one after another):
  - on the seed mix, auto ÷ the faster of (`before`: dsprep's fast path before the decision, hf1)
    (target ≥ 0.9);
  - on English, code and European prose, auto ÷ GigaToken (target ≥ 1.3).

    python3 tests/bench/engines_in_use.py RUNS.jsonl
"""

import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rate = {}
line = {}
for r in rows:
    rate[(r["tokenizer"], r["text"], r["round"], r["engine"])] = r["text_tokens"] / r["cpu_seconds"]
    if r["engine"] == "auto":
        line[r["tokenizer"]] = r.get("engine_line", "")


def ratios(tok, text, num, den):
    out = []
    for (t, x, rnd, e), v in rate.items():
        if (t, x, e) != (tok, text, num):
            continue
        dens = [rate.get((tok, text, rnd, d)) for d in den]
        dens = [d for d in dens if d]
        if dens:
            out.append(v / max(dens))
    return statistics.median(out) if out else None


def median_rate(tok, text, engine):
    vals = [v for (t, x, _, e), v in rate.items() if (t, x, e) == (tok, text, engine)]
    return statistics.median(vals) / 1e6 if vals else None


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


tokenizers = list(dict.fromkeys(r["tokenizer"] for r in rows))
print("| tokenizer | engine in use | mix: auto / before / HF 1.x / GigaToken (M tok/CPU-s) "
      "| auto ÷ max(before, HF 1.x), mix | auto ÷ GigaToken: english / code / european |")
print("|---|---|---|---|---|")
for tok in tokenizers:
    engine = "HF 1.x" if line.get(tok, "").startswith("HF tokenizers 1.") else "dsprep's own"
    rates = " / ".join(fmt(median_rate(tok, "mix", e), 1) for e in ["auto", "before", "hf1", "gigatoken"])
    target = ratios(tok, "mix", "auto", ["before", "hf1"])
    giga = " / ".join(fmt(ratios(tok, k, "auto", ["gigatoken"])) for k in ["english", "code", "european"])
    print(f"| {tok} | {engine} | {rates} | {fmt(target)} | {giga} |")
