#!/usr/bin/env bash
# The tokenize stage per core: dsprep's engine against GigaToken, on the same documents, the same
# pinned core, a fresh tokenizer object per run (each run is a new process: cold caches),
# alternating, ROUNDS rounds (default 7: each side encodes the 8 MB of code in ~0.1 s, and on a
# shared VM three such runs scatter by ±25 %); medians. One JSON line per run goes to RESULTS,
# then a table.
#
#   bash tests/bench/tokenize_vs_gigatoken.sh PEER_VENV RESULTS [TOKENIZERS...]
#
# PEER_VENV:  made by ../shared/bench/peer/setup.sh VENV --with-gigatoken
# TOKENIZERS: any of gpt2 qwen3 llama3 llama2 gemma gemma3 yi deepseek_v3 cl100k o200k command_r claude tekken (default: the first four; all but
#             gpt2 and qwen3 are fetched by config/tokenizers/fetch.sh).
# Texts: prose = 1,000 real C4 rows (tests/bench/data), code = the Python standard library of
# this machine's python3 (sorted .py files cut at line ends into ~4 KiB documents, first
# CODE_MB, default 8). Neither repeats documents. CORE (default 0) is the core both run on.
# The table gives medians and, beside them, the ratio of each side's fastest run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEER_PY="$1/bin/python"; RESULTS="$(realpath -m "$2")"; shift 2
NAMES="${*:-gpt2 llama3 qwen3 llama2}"
CORE="${CORE:-0}"; ROUNDS="${ROUNDS:-7}"; CODE_MB="${CODE_MB:-8}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

if [ -z "${DSPREP_TOKENIZE_BENCH:-}" ]; then
  (cd "$ROOT" && cargo build --release -p dsprep-tokenize --example tokenize_bench --quiet)
fi
BENCH="${DSPREP_TOKENIZE_BENCH:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/tokenize_bench}"

# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
cp "$ROOT/tests/bench/data/c4-en-1000.json.gz" "$WORK/prose.json.gz"
python3 - "$WORK/code.json.gz" "$CODE_MB" <<'PY'
import gzip, json, pathlib, sys, sysconfig
out, limit = sys.argv[1], float(sys.argv[2]) * 1e6
stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
total, docs, doc = 0, [], ""
for path in files:
    for line in path.read_bytes().decode("utf-8", "replace").splitlines(keepends=True):
        doc += line
        if len(doc.encode()) >= 4096:
            docs.append(doc); total += len(doc.encode()); doc = ""
    if total >= limit:
        break
with gzip.open(out, "wt", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
PY


tag() { python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r.update(tokenizer=sys.argv[1], text=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(r))' "$@"; }

for name in $NAMES; do
  bench_tokenizer "$name"
  for text in prose code; do
    for round in $(seq "$ROUNDS"); do
      taskset -c "$CORE" "$BENCH" --tokenizer "$TOK" --text-dir "$WORK/$text.json.gz" \
        --engine fast --threads 1 --max-mb 1000 | tag "$name" "$text" "$round" >> "$RESULTS"
      tail -n 1 "$RESULTS"
      RAYON_NUM_THREADS=1 taskset -c "$CORE" "$PEER_PY" "$ROOT/tests/bench/gigatoken_stage.py" \
        "$TOK" "$WORK/$text.json.gz" | tag "$name" "$text" "$round" >> "$RESULTS"
      tail -n 1 "$RESULTS"
    done
  done
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| tokenizer | text | dsprep tokens/s (median) | GigaToken tokens/s (median) | dsprep ÷ GigaToken | per CPU-second: dsprep ÷ GigaToken | best run ÷ best run | same token count |")
print("|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    k = (r["tokenizer"], r["text"])
    if k not in keys: keys.append(k)
for k in keys:
    ours = [r for r in rows if (r["tokenizer"], r["text"]) == k and r["engine"] != "gigatoken"]
    giga = [r for r in rows if (r["tokenizer"], r["text"]) == k and r["engine"] == "gigatoken"]
    if not ours or not giga: continue
    # dsprep's count has one EOS per document; GigaToken's has none.
    ours_tps = statistics.median((r["tokens"] - r["docs"]) / r["seconds"] for r in ours)
    giga_tps = statistics.median(r["tokens"] / r["seconds"] for r in giga)
    # Thread CPU time: the figure least moved by other work on the machine.
    ours_cpu = statistics.median((r["tokens"] - r["docs"]) / r["cpu_seconds"] for r in ours)
    giga_cpu = statistics.median(r["tokens"] / r["cpu_seconds"] for r in giga)
    # Each side's fastest run: on a VM whose neighbours slow single runs by up to 2×, the run
    # least disturbed.
    ours_best = max((r["tokens"] - r["docs"]) / r["seconds"] for r in ours)
    giga_best = max(r["tokens"] / r["seconds"] for r in giga)
    same = all(r["tokens"] - r["docs"] == giga[0]["tokens"] for r in ours)
    print(f"| {k[0]} | {k[1]} | {ours_tps:,.0f} | {giga_tps:,.0f} | **{ours_tps / giga_tps:.2f}×** | {ours_cpu / giga_cpu:.2f}× | {ours_best / giga_best:.2f}× | {'yes' if same else 'NO'} |")
PY
