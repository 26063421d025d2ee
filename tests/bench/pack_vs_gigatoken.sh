#!/usr/bin/env bash
# `dsprep pack --threads 2` against the simplest pack written around GigaToken
# (../shared/bench/peer/gigatoken_pack.py, RAYON_NUM_THREADS=2), same corpus and tokenizer,
# alternating, ROUNDS rounds (default 2). One JSON line per run goes to RESULTS, then a table.
#
#   bash tests/bench/pack_vs_gigatoken.sh CORPUS PEER_VENV RESULTS [TOKENIZERS...]
#
# CORPUS:    ../shared/bench/peer/make_corpus.py --total-mb 100 --shards-per-source 8 --seed 0
# PEER_VENV: ../shared/bench/peer/setup.sh VENV --with-gigatoken
# dsprep packs the peer recipe (tests/bench/peer_recipe.sh: the five sources mixed, shuffled with
# a 10k buffer, seq_len 2048); the GigaToken script reads every file in order, no mix or shuffle.
# dsprep's tokens/s is over its whole process; the script's from its first import (its whole
# process in `process_tokens_per_s`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; PEER_PY="$2/bin/python"; RESULTS="$(realpath -m "$3")"; shift 3
NAMES="${*:-gpt2 llama3 qwen3 llama2}"; ROUNDS="${ROUNDS:-2}"
GIGA="$ROOT/../shared/bench/peer/gigatoken_pack.py"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
dsprep_bin   # BIN: DSPREP_BIN, or a release build made here

for name in $NAMES; do
  bench_tokenizer "$name"
  export TOK EOS
  peer_recipe 2048 10000 > "$WORK/recipe.toml"
  for round in $(seq "$ROUNDS"); do
    /usr/bin/time -f '%M %e %U %S' -o "$WORK/time" \
      "$BIN" pack --recipe "$WORK/recipe.toml" --out "$WORK/out" --threads 2 --quiet --force > "$WORK/summary"
    python3 - "$name" "$round" "$WORK/time" "$WORK/summary" "$WORK/out/manifest.json" >> "$RESULTS" <<'PY'
import json, sys
name, rnd, timef, summary, manifest = sys.argv[1:]
rss_kb, wall, user, sys_s = open(timef).read().split()
tokens = sum(s["tokens"] for s in json.load(open(manifest))["sources"])
print(json.dumps({"run": "dsprep pack --threads 2", "tokenizer": name, "round": int(rnd),
    "wall_s": float(wall), "tokens": tokens, "tokens_per_s": round(tokens / float(wall)),
    "cpu_s": round(float(user) + float(sys_s), 2), "peak_rss_mb": round(int(rss_kb) / 1024, 1),
    "engine_line": next((l for l in open(summary) if l.startswith("tokenizer engine")), "").strip()}))
PY
    tail -n 1 "$RESULTS"
    RAYON_NUM_THREADS=2 /usr/bin/time -f '%M %e %U %S' -o "$WORK/time" \
      "$PEER_PY" "$GIGA" "$CORPUS" "$TOK" "$EOS" > "$WORK/giga.json"
    python3 - "$name" "$round" "$WORK/time" "$WORK/giga.json" >> "$RESULTS" <<'PY'
import json, sys
name, rnd, timef, out = sys.argv[1:]
rss_kb, wall, user, sys_s = open(timef).read().split()
r = json.loads(open(out).read().strip().splitlines()[-1])
r.update(run="gigatoken_pack.py", tokenizer=name, round=int(rnd), process_wall_s=float(wall),
         process_tokens_per_s=round(r["tokens"] / float(wall)), cpu_s=round(float(user) + float(sys_s), 2),
         peak_rss_mb=round(int(rss_kb) / 1024, 1))
print(json.dumps(r))
PY
    tail -n 1 "$RESULTS"
  done
done

python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| tokenizer | dsprep pack tokens/s (CPU s) | GigaToken pack tokens/s, from import (whole process; CPU s) | dsprep ÷ GigaToken (whole process) |")
print("|---|---|---|---|")
for name in dict.fromkeys(r["tokenizer"] for r in rows):
    d = [r for r in rows if r["tokenizer"] == name and r["run"].startswith("dsprep")]
    g = [r for r in rows if r["tokenizer"] == name and r["run"] == "gigatoken_pack.py"]
    if not d or not g: continue
    dt = statistics.median(r["tokens_per_s"] for r in d); gt = statistics.median(r["tokens_per_s"] for r in g)
    gp = statistics.median(r["process_tokens_per_s"] for r in g)
    dc = round(statistics.median(r["cpu_s"] for r in d), 2); gc = round(statistics.median(r["cpu_s"] for r in g), 2)
    print(f"| {name} | {dt:,.0f} ({dc}) | {gt:,.0f} ({gp:,.0f}; {gc}) | **{dt/gt:.2f}×** ({dt/gp:.2f}×) |")
PY
