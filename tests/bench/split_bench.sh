#!/usr/bin/env bash
# A mix in tokens along the stream, whole documents against `oversize = "split"` (release build):
# the peer's five-source recipe in tokens (buffer 10,000, seq_len 2048, --threads 2), packed
# once per setting, read back with `dsprep inspect --mix --every 1000000 --csv`, and summed up by
# tests/bench/mix_spans.py (BENCHMARKS.md "Along the stream").
#
#   bash tests/bench/split_bench.sh CORPUS TOKENIZER OUTDIR [SETTING...]
#
# CORPUS: ../shared/bench/peer/make_corpus.py output (--total-mb 500 --shards-per-source 8 --seed 0)
# SETTING: whole | stack:BYTES (split the-stack-v2 at BYTES) | all:BYTES (split every source)
#          (default: whole stack:16384 all:16384)
# OUTDIR keeps each setting's spans CSV, table and timing; the packed directories are removed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; TOK="$(realpath "$2")"; OUTDIR="$(realpath -m "$3")"; shift 3
SETTINGS="${*:-whole stack:16384 all:16384}"
mkdir -p "$OUTDIR"
if [ -z "${DSPREP_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p dsprep --quiet)
fi
BIN="${DSPREP_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep}"
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"

for setting in $SETTINGS; do
  name="${setting/:/-}"
  case "$setting" in
    whole) unset SPLIT_BYTES ;;
    stack:*) export SPLIT_BYTES="${setting#stack:}" SPLIT_SOURCES="the-stack-v2" ;;
    all:*) export SPLIT_BYTES="${setting#all:}" SPLIT_SOURCES="fineweb-edu c4 zyda-2 the-stack-v2 finemath" ;;
    *) echo "unknown setting $setting" >&2; exit 2 ;;
  esac
  MIX_UNIT=tokens peer_recipe 2048 10000 > "$OUTDIR/$name.toml"
  /usr/bin/time -f '%M %e %U %S' -o "$OUTDIR/$name.time" \
    "$BIN" pack --recipe "$OUTDIR/$name.toml" --out "$OUTDIR/$name.packed" --threads 2 --quiet --force \
    > "$OUTDIR/$name.summary"
  "$BIN" inspect "$OUTDIR/$name.packed" --mix --every 1000000 --csv "$OUTDIR/$name.csv" > /dev/null
  python3 "$ROOT/tests/bench/mix_spans.py" "$OUTDIR/$name.packed" "$OUTDIR/$name.csv" > "$OUTDIR/$name.md"
  read -r rss_kb wall user sys < "$OUTDIR/$name.time"
  echo "== $setting: wall ${wall} s, user ${user} s, peak RSS $((rss_kb / 1024)) MiB"
  grep -E 'split into|packed ' "$OUTDIR/$name.summary" || true
  cat "$OUTDIR/$name.md"
  rm -rf "$OUTDIR/$name.packed"
done
