#!/usr/bin/env bash
# Changing course on node daemons against a plain resume (issue 45): time from launching 2 node
# daemons (`dsprep serve --node-rank R --nodes 2 --resume latest`) to every rank's first batch at
# step STEP, with the same recipe and with an edited one (`--change-course`: fineweb-edu
# reweighted 0.40 -> 0.20, the buffer halved), alternating, on the multinode quickstart
# (config/quickstart-multinode.toml, [lanes] count 8, world 4 x micro batch 1).
#
# usage: tests/bench/change_nodes_bench.sh [STEP] [ROUNDS]     (defaults: 40, 3)
# Needs a release build: cargo build --release -p dsprep (DSPREP_BIN overrides the binary).
# Prints one JSON line per run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STEP="${1:-40}"
ROUNDS="${2:-3}"
BIN="${DSPREP_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep}"
WORK="$(mktemp -d)"
trap 'pkill -P $$ || true; rm -rf "$WORK"' EXIT
ms() { date +%s%3N; }

recipe() {  # buffer, fineweb-edu's weight
  sed -e "s#\"tokenizers/#\"$ROOT/config/tokenizers/#" -e "s#\"samples/#\"$ROOT/config/samples/#" \
    -e "s/buffer_size = 1000 /buffer_size = $1 /" -e "s/weight = 0.40/weight = $2/" \
    "$ROOT/config/quickstart-multinode.toml"
}
recipe 1000 0.40 >"$WORK/a.toml"
recipe 500 0.20 >"$WORK/b.toml"

# serve STATE RECIPE LOG EXTRA...: both node daemons in the background; their pids on stdout.
serve() {
  local state=$1 recipe=$2 log=$3; shift 3
  for node in 0 1; do
    "$BIN" serve --recipe "$recipe" --world-size 4 --micro-batch 1 --node-rank "$node" --nodes 2 \
      --endpoint "ipc://$WORK/node$node.sock" --metrics off --prefetch 4 --state-dir "$state" \
      --keep-checkpoints 1000 --checkpoint-every 5 "$@" 2>>"$log.$node" >/dev/null &
    echo $!
  done
}

# taps START STEPS TAG: every rank (0, 1 on node 0; 2, 3 on node 1), waited for.
taps() {
  local pids=()
  for rank in 0 1 2 3; do
    "$BIN" tap --endpoint "ipc://$WORK/node$((rank / 2)).sock" --rank "$rank" --world-size 4 \
      --start-step "$1" --steps "$2" --out "$WORK/$3$rank.bin" >/dev/null 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}

# Recipe A served to step STEP + 20 (checkpoints every 5 steps), SIGKILLed.
mapfile -t pids < <(serve "$WORK/state" "$WORK/a.toml" "$WORK/first.log")
taps 0 $((STEP + 20)) all
kill -9 "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true

for run in $(seq 1 "$ROUNDS"); do
  for kind in plain change; do
    rm -rf "$WORK/r" && cp -r "$WORK/state" "$WORK/r"
    recipe="$WORK/a.toml" extra=()
    if [ "$kind" = change ]; then recipe="$WORK/b.toml"; extra=(--change-course); fi
    rm -f "$WORK/resume.log".*
    t0=$(ms)
    mapfile -t pids < <(serve "$WORK/r" "$recipe" "$WORK/resume.log" --resume latest "${extra[@]}")
    taps "$STEP" 1 one
    t1=$(ms)
    kill -9 "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
    changed=false
    grep -q "changed course at step $STEP" "$WORK/resume.log.0" && changed=true
    echo "{\"step\": $STEP, \"kind\": \"$kind\", \"run\": $run, \"start_to_first_batch_ms\": $((t1 - t0)), \"changed\": $changed}"
  done
done
