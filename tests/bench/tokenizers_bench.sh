#!/usr/bin/env bash
# `dsprep pack` against the HF-datasets peer pipeline (../shared/bench/peer/hf_stream.py with
# --batched-tokenize) for the tokenizers users train with, in one run on the same cores, corpus
# and mix. One JSON line per run goes to RESULTS.
#
#   bash tests/bench/tokenizers_bench.sh CORPUS PEER_VENV RESULTS [TOKENIZERS...]
#
# CORPUS:     made by ../shared/bench/peer/make_corpus.py (--total-mb 100 --shards-per-source 8 --seed 0)
# PEER_VENV:  made by ../shared/bench/peer/setup.sh
# TOKENIZERS: any of gpt2 qwen3 llama3 llama2 gemma gemma3 yi deepseek_v3 cl100k o200k command_r claude tekken (default: gpt2 qwen3 llama3); all
#             but gpt2 and qwen3 are fetched by config/tokenizers/fetch.sh.
# The peer stops after PEER_TOKENS tokens (default 15,000,000); dsprep packs the whole corpus.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; PEER_PY="$2/bin/python"; RESULTS="$(realpath -m "$3")"; shift 3
NAMES="${*:-gpt2 qwen3 llama3}"
PEER="$ROOT/../shared/bench/peer/hf_stream.py"
PEER_TOKENS="${PEER_TOKENS:-15000000}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
dsprep_bin   # BIN: DSPREP_BIN, or a release build made here

for name in $NAMES; do
  bench_tokenizer "$name"
  export TOK EOS
  peer_recipe 2048 10000 > "$WORK/recipe.toml"
  /usr/bin/time -f '%M %e %U %S' -o "$WORK/time" \
    "$BIN" pack --recipe "$WORK/recipe.toml" --out "$WORK/out" --threads 2 --quiet --force > "$WORK/summary"
  read -r rss_kb wall user sys < "$WORK/time"
  python3 - "$name" "$rss_kb" "$wall" "$user" "$sys" "$WORK/summary" "$WORK/out/manifest.json" >> "$RESULTS" <<'PY'
import json, sys
name, rss_kb, wall, user, sys_s, summary, manifest = sys.argv[1:]
m = json.load(open(manifest))
tokens = sum(s["tokens"] for s in m["sources"])
print(json.dumps({
    "run": "dsprep pack --threads 2", "tokenizer": name, "wall_s": float(wall), "tokens": tokens,
    "tokens_per_s": round(tokens / float(wall)), "cpu_s": round(float(user) + float(sys_s), 2),
    "peak_rss_mb": round(int(rss_kb) / 1024, 1),
    "engine_line": next((l for l in open(summary) if l.startswith("tokenizer engine")), "").strip(),
}))
PY
  tail -n 1 "$RESULTS"
  "$PEER_PY" "$PEER" --data "$CORPUS" --tokenizer "$TOK" --eos-token "$EOS" \
    --weights 0.40,0.15,0.30,0.10,0.05 --seed 0 --buffer-size 10000 --seq-len 2048 --batch 8 \
    --batched-tokenize --max-tokens "$PEER_TOKENS" --progress 0 --no-shutdown-sleep 2>"$WORK/peer.err" \
    | python3 -c 'import json,sys; r=json.loads(sys.stdin.readlines()[-1]); r["run"]="peer --batched-tokenize"; r["tokenizer"]=sys.argv[1]; print(json.dumps(r))' "$name" >> "$RESULTS" \
    || { cat "$WORK/peer.err" >&2; exit 1; }
  tail -n 1 "$RESULTS"
done
