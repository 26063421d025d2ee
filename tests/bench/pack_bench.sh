#!/usr/bin/env bash
# Benchmark `dsprep pack` (release build) on the peer's corpus, against the tokenizer ceiling and
# the HF-datasets peer pipeline (../shared/bench/peer). One JSON line per run goes to RESULTS.
#
#   bash tests/bench/pack_bench.sh CORPUS TOKENIZER RESULTS [RUNS...]
#
# CORPUS:    made by ../shared/bench/peer/make_corpus.py (--total-mb 200 --shards-per-source 8 --seed 0)
# TOKENIZER: a tokenizer.json (the shipped config/tokenizers/gpt2/tokenizer.json is the reference)
# RUNS:      any of: t1 t2 t2_b100k t2_hf t2_tokens t2_b1k t2_tokens_b1k t2_b0 t2_tokens_b0
#            t2_same t2_same_b0 (default: t1 t2 t2_b100k);
#            *_tokens* mix in tokens ([mix] unit = "tokens"), *_b1k with a 1,000-document buffer,
#            *_b0 with none; t2_same* mix in documents by the weights that give t2_tokens' token
#            mix on the 500 MB corpus (its realized shares of documents), to compare the units at
#            the same stream mix
# Same mix as the peer's default: fineweb-edu 0.40, c4 0.15, zyda-2 0.30, the-stack-v2 0.10,
# finemath 0.05; first_exhausted; seed 0; seq_len 2048.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; TOK="$(realpath "$2")"; RESULTS="$(realpath -m "$3")"; shift 3
RUNS="${*:-t1 t2 t2_b100k}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT


# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
dsprep_bin   # BIN: DSPREP_BIN, or a release build made here
recipe() { peer_recipe 2048 "$1"; }  # buffer_size

run() {  # name threads buffer [extra dsprep args]
  local name="$1" threads="$2" buffer="$3"; shift 3
  recipe "$buffer" > "$WORK/recipe.toml"
  /usr/bin/time -f '%M %e %U %S' -o "$WORK/time" \
    "$BIN" pack --recipe "$WORK/recipe.toml" --out "$WORK/out" --threads "$threads" --quiet --force "$@" > "$WORK/summary"
  read -r rss_kb wall user sys < "$WORK/time"
  python3 - "$name" "$threads" "$buffer" "$rss_kb" "$wall" "$user" "$sys" "$WORK/summary" "$WORK/out/manifest.json" >> "$RESULTS" <<'PY'
import json, re, sys
name, threads, buffer, rss_kb, wall, user, sys_s, summary, manifest = sys.argv[1:]
text = open(summary).read()
m = json.load(open(manifest))
tokens = sum(s["tokens"] for s in m["sources"])
first = re.search(r"first window after ([0-9.]+) s", text)
wall = float(wall)
print(json.dumps({
    "run": name, "threads": int(threads), "buffer_size": int(buffer), "wall_s": wall,
    "tokens": tokens, "tokens_per_s": round(tokens / wall), "docs": sum(s["documents"] for s in m["sources"]),
    "windows": m["num_windows"], "first_window_s": float(first.group(1)) if first else None,
    "peak_rss_mb": round(int(rss_kb) / 1024, 1), "cpu_s": round(float(user) + float(sys_s), 2),
    "engine_line": next((l for l in text.splitlines() if l.startswith("tokenizer engine")), None),
    "token_shares": {s["name"]: round(s.get("realized_token_fraction", 0), 4) for s in m["sources"]},
    "doc_shares": {s["name"]: round(s["realized_fraction"], 4) for s in m["sources"]},
}))
PY
  tail -n 1 "$RESULTS"
}

# t2_tokens' realized shares of documents on the 500 MB corpus (BENCHMARKS.md "A mix in tokens").
SAME_MIX="0.3961 0.2441 0.2979 0.0254 0.0365"

for r in $RUNS; do
  case "$r" in
    t1) run t1 1 10000 ;;
    t2) run t2 2 10000 ;;
    t2_b100k) run t2_b100k 2 100000 ;;
    t1_hf) run t1_hf 1 10000 --tokenizer-engine hf ;;
    t2_hf) run t2_hf 2 10000 --tokenizer-engine hf ;;
    t2_tokens) MIX_UNIT=tokens run t2_tokens 2 10000 ;;
    t2_b1k) run t2_b1k 2 1000 ;;
    t2_tokens_b1k) MIX_UNIT=tokens run t2_tokens_b1k 2 1000 ;;
    t2_b0) run t2_b0 2 0 ;;
    t2_tokens_b0) MIX_UNIT=tokens run t2_tokens_b0 2 0 ;;
    t2_same) PEER_WEIGHTS="$SAME_MIX" run t2_same 2 10000 ;;
    t2_same_b0) PEER_WEIGHTS="$SAME_MIX" run t2_same_b0 2 0 ;;
    *) echo "unknown run $r" >&2; exit 2 ;;
  esac
done
