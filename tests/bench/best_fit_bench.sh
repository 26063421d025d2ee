#!/usr/bin/env bash
# Packing without truncation, measured: `dsprep pack` of the peer corpus with `concat` and with
# `best_fit` at pools of 1k, 10k and 100k documents, per tokenizer and seq_len, in one run on one
# machine. Prints a markdown table: tokens/s (inside the pack), padding (% of window tokens),
# documents that fit a window but are cut (from `dsprep inspect --mix`), documents longer than a
# window (best_fit cuts only those), the pool's peak, and the process's peak RSS.
#
#   CORPUS=/work/peerbench/corpus tests/bench/best_fit_bench.sh [TOKENIZERS] [SEQ_LENS] [POOLS]
#   defaults: "gpt2 llama3" "2048 4096" "1000 10000 100000"; THREADS (default 2); RUNS (default 1,
#   the best of RUNS is shown). CORPUS: ../shared/bench/peer/make_corpus.py --total-mb 100
#   --shards-per-source 8 --seed 0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tests/bench/peer_recipe.sh"
: "${CORPUS:?set CORPUS to a make_corpus.py output}"
TOKENIZERS="${1:-gpt2 llama3}"; SEQ_LENS="${2:-2048 4096}"; POOLS="${3:-1000 10000 100000}"
THREADS="${THREADS:-2}"; RUNS="${RUNS:-1}"
dsprep_bin
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT

# One pack: prints "tokens/s rss_kib", keeps the output in $work/out.
pack_once() {
  local recipe="$1" best=0 rss=0 line
  for _ in $(seq "$RUNS"); do
    /usr/bin/time -f '%M' -o "$work/rss" "$BIN" pack --recipe "$recipe" --out "$work/out" --force \
      --threads "$THREADS" --quiet > "$work/summary" 2>&1
    line="$(grep -o '— [0-9]* tokens/s' "$work/summary" | tr -dc 0-9)"
    if [ "$line" -gt "$best" ]; then best="$line"; rss="$(tail -1 "$work/rss")"; fi
  done
  echo "$best $rss"
}

echo "| tokenizer | seq_len | packing | tokens/s | vs concat | padding | fitting docs cut | longer than a window | pool peak (docs / MiB) | peak RSS |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for tok in $TOKENIZERS; do
  bench_tokenizer "$tok"
  for seq in $SEQ_LENS; do
    concat_rate=0
    for pool in concat $POOLS; do
      if [ "$pool" = concat ]; then unset POOL_DOCUMENTS; else export POOL_DOCUMENTS="$pool"; fi
      peer_recipe "$seq" 10000 > "$work/recipe.toml"
      read -r rate rss <<<"$(pack_once "$work/recipe.toml")"
      [ "$pool" = concat ] && concat_rate="$rate"
      mix="$("$BIN" inspect "$work/out" --mix)"
      cut="$(grep -o 'cut across windows: [0-9]* ([0-9.]*%)' <<<"$mix" | sed 's/cut across windows: //')"
      read -r padding longer peak_docs peak_tokens <<<"$(python3 - "$work/out/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
p = m.get("packing") or {}
total = m["num_windows"] * m["window_tokens"]
print(f'{100 * p.get("padding_tokens", 0) / max(total, 1):.2f}%', p.get("documents_cut", "-"),
      p.get("pool_peak_documents", "-"), p.get("pool_peak_tokens", 0))
PY
)"
      label="concat"; [ "$pool" != concat ] && label="best_fit, pool $pool"
      peak="-"; [ "$pool" != concat ] && peak="$peak_docs / $((peak_tokens * 4 / 1048576))"
      ratio="$(python3 -c "print(f'{$rate / max($concat_rate, 1):.2f}×')")"
      echo "| $tok | $seq | $label | $(python3 -c "print(f'{$rate/1e6:.1f} M')") | $ratio | $padding | $cut | $longer | $peak | $((rss / 1024)) MiB |"
    done
  done
done
