#!/usr/bin/env python3
"""The table of tests/bench/engines.sh from its runs.jsonl: per tokenizer and text kind, each
engine's median M tokens/s (ids of the text alone, EOS not counted) over its rounds, the fast
path ÷ HF 1.x and ÷ HF 0.23 (the median of each round's ratio: the engines of a round run one
after another, so a load that comes and goes moves both sides of a ratio alike), and whether every engine gave the same token count; then, per tokenizer, issue
49's rule on the seed mix (our fast path kept where it is ≥ 1.25 × HF 1.x).

    python3 tests/bench/engines_table.py RUNS.jsonl [--cpu]

With --cpu the figures are per CPU-second of the encoding thread (its CLOCK_THREAD_CPUTIME_ID,
which time spent waiting for the core does not count) instead of per wall-clock second: the
steadier figure on a machine others load.
"""

import json
import statistics
import sys

ORDER = ["fast", "hf1", "hf", "gigatoken"]
NAMES = {"fast": "fast path", "hf1": "HF 1.0-rc.3", "hf": "HF 0.23", "gigatoken": "GigaToken"}
TEXTS = ["english", "code", "cjk", "european", "mix"]

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
CPU = "--cpu" in sys.argv[2:]
for r in rows:
    r["rate"] = r["text_tokens"] / (r["cpu_seconds"] if CPU else r["seconds"])
engines = [e for e in ORDER if any(r["engine"] == e for r in rows)]
tokenizers = list(dict.fromkeys(r["tokenizer"] for r in rows))


def runs(tok, text, engine):
    return [r for r in rows if (r["tokenizer"], r["text"], r["engine"]) == (tok, text, engine)]


def median_mtps(tok, text, engine):
    got = runs(tok, text, engine)
    return statistics.median(r["rate"] for r in got) / 1e6 if got else None


unit = "M tok/CPU-s" if CPU else "M tok/s"
def round_ratio(tok, text, a, b):
    """The median over rounds of engine a's rate ÷ engine b's in the same round."""
    by_round = lambda e: {r["round"]: r["rate"] for r in runs(tok, text, e)}
    ra, rb = by_round(a), by_round(b)
    return statistics.median(ra[k] / rb[k] for k in ra if k in rb)


head = ["tokenizer", "text"] + [f"{NAMES[e]} {unit}" for e in engines]
head += ["fast ÷ HF 1.x", "fast ÷ HF 0.23", "same token count", "load (1-min, min–max)"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for tok in tokenizers:
    for text in TEXTS:
        figures = {e: median_mtps(tok, text, e) for e in engines}
        if all(v is None for v in figures.values()):
            continue
        cells = [tok, text] + [f"{figures[e]:.2f}" if figures[e] else "–" for e in engines]
        ratio = lambda a, b: f"{round_ratio(tok, text, a, b):.2f}" if figures.get(a) and figures.get(b) else "–"
        counts = {r["text_tokens"] for e in engines for r in runs(tok, text, e)}
        loads = [float(r["load"].split()[0]) for e in engines for r in runs(tok, text, e)]
        cells += [ratio("fast", "hf1"), ratio("fast", "hf"), "yes" if len(counts) == 1 else f"no: {sorted(counts)}",
                  f"{min(loads):.1f}–{max(loads):.1f}"]
        print("| " + " | ".join(cells) + " |")

print()
print("Issue 49's rule on the seed mix: our fast path stays where it is ≥ 1.25 × HF 1.x.")
print()
for tok in tokenizers:
    if runs(tok, "mix", "fast") and runs(tok, "mix", "hf1"):
        ratio = round_ratio(tok, "mix", "fast", "hf1")
        verdict = "fast path stays" if ratio >= 1.25 else "HF 1.x (fast path < 1.25 ×)"
        print(f"- {tok}: fast ÷ HF 1.x on the mix = {ratio:.2f} → {verdict}")
