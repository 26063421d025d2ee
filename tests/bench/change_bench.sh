#!/usr/bin/env bash
# Changing course against a plain resume (issue 45): time from `dsprep serve --resume latest` to a
# rank's first batch at a checkpoint's step, with the same recipe and with an edited one
# (`--change-course`: a second source added, the buffer halved), run after run in one process
# tree; on the quickstart and on a corpus of short documents with a 100k-document buffer; and the
# lineage's size beside the checkpoint's.
#
# usage: tests/bench/change_bench.sh CORPUS_DIR     (CORPUS_DIR from make_short_docs.py)
# Needs a release build: cargo build --release -p dsprep (DSPREP_BIN overrides the binary).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"
BIN="${DSPREP_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep}"
WORK="$(mktemp -d)"
trap 'pkill -P $$ || true; rm -rf "$WORK"' EXIT
EP="ipc://$WORK/d.sock"
ms() { date +%s%3N; }

short_recipe() {  # buffer, extra source (0/1)
  cat <<TOML
version = 1
[tokenizer]
path = "$ROOT/config/tokenizers/gpt2/tokenizer.json"
eos = "<|endoftext|>"
[packing]
seq_len = 2048
[shuffle]
seed = 0
buffer_size = $1
[mix]
stopping = "first_exhausted"
[[source]]
name = "short"
weight = 1.0
files = ["$CORPUS/short/sample/10BT/*.parquet"]
format = "parquet"
text = "text"
TOML
  if [ "$2" = 1 ]; then
    printf '[[source]]\nname = "short-again"\nweight = 0.5\nfiles = ["%s/short/sample/10BT/*.parquet"]\nformat = "parquet"\ntext = "text"\n' "$CORPUS"
  fi
}

quickstart_recipe() {  # buffer, fineweb-edu's weight
  sed -e "s#\"tokenizers/#\"$ROOT/config/tokenizers/#" -e "s#\"samples/#\"$ROOT/config/samples/#" \
    -e "s/buffer_size = 1000 /buffer_size = $1 /" -e "s/weight = 0.40/weight = $2/" "$ROOT/config/quickstart.toml"
}

# bench NAME WORLD MB STEPS EVERY WANT...: an uninterrupted daemon of NAME/a.toml pulled to STEPS
# (a checkpoint every EVERY steps), then for each WANT (documents in) the first checkpoint at
# least that far, resumed 3 times plainly and 3 times changing course to NAME/b.toml.
bench() {
  local name=$1 world=$2 mb=$3 steps=$4 every=$5; shift 5
  local dir="$WORK/$name"
  "$BIN" serve --recipe "$dir/a.toml" --world-size "$world" --micro-batch "$mb" --endpoint "$EP" \
    --metrics off --prefetch 4 --state-dir "$dir/state" --keep-checkpoints 1000 --checkpoint-every "$every" \
    2>"$dir/serve.log" >/dev/null &
  local pid=$!
  for r in $(seq 0 $((world - 1))); do
    "$BIN" tap --endpoint "$EP" --rank "$r" --world-size "$world" --steps "$steps" --out "$dir/all$r.bin" >/dev/null &
  done
  wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  grep -o 'written: step [0-9]*, [0-9]* documents in' "$dir/serve.log" >"$dir/written.txt"
  for want in "$@"; do
    local line step file
    line=$(awk -v w="$want" '$4 >= w {print; exit}' "$dir/written.txt")
    step=$(echo "$line" | awk '{print $3}' | tr -d ,)
    file="$dir/state/step-$(printf %012d "$step").ckpt"
    for run in 1 2 3; do
      for kind in plain change; do
        rm -rf "$dir/r" && mkdir -p "$dir/r" && cp "$file" "$dir/state/lineage.json" "$dir/r/"
        local recipe="$dir/a.toml" extra=()
        if [ "$kind" = change ]; then recipe="$dir/b.toml"; extra=(--change-course); fi
        : >"$dir/resume.log"
        local t0 t1
        t0=$(ms)
        pid=$("$BIN" serve --recipe "$recipe" --world-size "$world" --micro-batch "$mb" --endpoint "$EP" \
          --metrics off --prefetch 4 --state-dir "$dir/r" --resume latest "${extra[@]}" 2>>"$dir/resume.log" >/dev/null & echo $!)
        for r in $(seq 0 $((world - 1))); do
          "$BIN" tap --endpoint "$EP" --rank "$r" --world-size "$world" --start-step "$step" --steps 1 --out "$dir/one$r.bin" >/dev/null &
        done
        wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
        t1=$(ms)
        kill -9 "$pid"; wait "$pid" 2>/dev/null || true
        local changed=false
        grep -q "changed course at step $step" "$dir/resume.log" && changed=true
        echo "{\"corpus\": \"$name\", \"position_docs\": $(echo "$line" | awk '{print $4}'), \"step\": $step, \"kind\": \"$kind\", \"run\": $run, \"start_to_first_batch_ms\": $((t1 - t0)), \"changed\": $changed, \"checkpoint_bytes\": $(stat -c %s "$file"), \"lineage_bytes\": $(stat -c %s "$dir/r/lineage.json")}"
      done
    done
  done
}

mkdir -p "$WORK/quickstart" "$WORK/short"
quickstart_recipe 1000 0.40 >"$WORK/quickstart/a.toml"
quickstart_recipe 500 0.20 >"$WORK/quickstart/b.toml"
bench quickstart 2 2 800 5 100 600
short_recipe 100000 0 >"$WORK/short/a.toml"
short_recipe 50000 1 >"$WORK/short/b.toml"
bench short 1 8 2500 5 1000 1000000
