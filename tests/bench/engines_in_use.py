#!/usr/bin/env python3
"""Issue 49's targets from a tests/bench/engines.sh run with ENGINES="auto before hf1 gigatoken":
per tokenizer, the engine `auto` runs (from its engine line), and per CPU-second of the encoding
thread, medians over rounds of each round's ratio (the engines of a round run one after another):
  - on the seed mix, auto ÷ the faster of (`before`: dsprep's fast path before the decision, hf1)
    (target ≥ 0.9);
  - on English, code and European prose, auto ÷ GigaToken (target ≥ 1.3).

    python3 tests/bench/engines_in_use.py RUNS.jsonl [MORE_RUNS.jsonl ...]

Several runs pool their rounds (each file's rounds stay rounds of their own). A run without
`auto` whose `hf1` is the engine `auto` runs for that tokenizer (byte-level BPE: a run of
ENGINES="before hf1") counts its `hf1` as `auto`.
"""

import json
import statistics
import sys
from collections import defaultdict

rows = []
for run, path in enumerate(sys.argv[1:]):
    for text in open(path):
        if text.strip():
            r = json.loads(text)
            r["round"] = (run, r["round"])
            rows.append(r)
line = {r["tokenizer"]: r.get("engine_line", "") for r in rows if r["engine"] == "auto"}
rate = {}
for r in rows:
    rate[(r["tokenizer"], r["text"], r["round"], r["engine"])] = r["text_tokens"] / r["cpu_seconds"]
for (tok, text, rnd, engine), v in list(rate.items()):
    runs_hf1 = line.get(tok, "").startswith("HF tokenizers 1.")
    if engine == "hf1" and runs_hf1 and (tok, text, rnd, "auto") not in rate:
        rate[(tok, text, rnd, "auto")] = v


def ratios(tok, text, num, den):
    out = []
    for (t, x, rnd, e), v in rate.items():
        if (t, x, e) != (tok, text, num):
            continue
        dens = [rate.get((tok, text, rnd, d)) for d in den]
        dens = [d for d in dens if d]
        if dens:
            out.append(v / max(dens))
    return (statistics.median(out), len(out)) if out else (None, 0)


def median_rate(tok, text, engine):
    vals = [v for (t, x, _, e), v in rate.items() if (t, x, e) == (tok, text, engine)]
    return statistics.median(vals) / 1e6 if vals else None


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


tokenizers = list(dict.fromkeys(r["tokenizer"] for r in rows))
print("| tokenizer | engine in use | mix: auto / before / HF 1.x / GigaToken (M tok/CPU-s) "
      "| auto ÷ max(before, HF 1.x), mix | auto ÷ GigaToken: english / prose / code / european |")
print("|---|---|---|---|---|")
for tok in tokenizers:
    engine = "HF 1.x" if line.get(tok, "").startswith("HF tokenizers 1.") else "dsprep's own"
    rates = " / ".join(fmt(median_rate(tok, "mix", e), 1) for e in ["auto", "before", "hf1", "gigatoken"])
    target, rounds = ratios(tok, "mix", "auto", ["before", "hf1"])
    giga = " / ".join(fmt(ratios(tok, k, "auto", ["gigatoken"])[0])
                      for k in ["english", "prose", "code", "european"])
    print(f"| {tok} | {engine} | {rates} | {fmt(target)} ({rounds} rounds) | {giga} |")
