#!/usr/bin/env bash
# Benchmark `[mix.adaptive]` on node daemons, release build, one JSON line per measurement to
# RESULTS. The peer's mix in tokens with [lanes] count = 8 (block_windows 4), 8 `dsprep tap`
# ranks (ranks 0–3 on node 0, 4–7 on node 1) pulling every step and reporting a synthetic loss:
#  1. tokens/s of 2 node daemons (world 8 × micro batch 4, seq 2048, prefetch 8) with
#     `[mix.adaptive]` off and on (every 20 steps, lag $LAG; max_change 1e-9, so both serve the
#     same mix and only the machinery differs: each node's reports handed to node 0 through the
#     state directory once per decision, node 0's decision written, the others reading it, every
#     lane taking it), three rounds each, alternating; the served tokens over the taps' wall time;
#  2. with world 8 × micro batch 1 and max_change 0.05: the decisions' trajectory
#     (`inspect --decisions --plot`), how many held, and the realized share of every source per
#     10 M tokens of `pack --lineage` against the shares decided for those tokens
#     (tests/bench/adaptive_fidelity.py).
#
#   bash tests/bench/adaptive_nodes_bench.sh CORPUS RESULTS [PLOT.svg]
#   PARTS="1" LAG=48 bash tests/bench/adaptive_nodes_bench.sh …   # some parts, another lag
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; RESULTS="$(realpath -m "$2")"; PLOT="$(realpath -m "${3:-adaptive-nodes-trajectory.svg}")"
WORK="$(mktemp -d)"
cleanup() { kill ${DAEMONS[*]:-} 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
(cd "$ROOT" && cargo build --release -p dsprep --quiet)
T="${CARGO_TARGET_DIR:-$ROOT/target}/release"
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
bench_tokenizer gpt2
export MIX_UNIT=tokens
LAG=${LAG:-40}
DAEMONS=()

start_nodes() {  # recipe mb: two node daemons of world 8 sharing $WORK/state
  local recipe=$1 mb=$2 n
  DAEMONS=()
  for n in 0 1; do
    "$T/dsprep" serve --recipe "$recipe" --endpoint "ipc://$WORK/node$n.sock" --world-size 8 \
      --micro-batch "$mb" --prefetch 8 --node-rank "$n" --nodes 2 --state-dir "$WORK/state" \
      --metrics off 2> "$WORK/node$n.log" &
    DAEMONS+=($!)
  done
  for n in 0 1; do
    for _ in $(seq 600); do grep -q "serving recipe" "$WORK/node$n.log" 2>/dev/null && break; sleep 0.1; done
  done
}
stop_nodes() { kill -TERM "${DAEMONS[@]}"; wait "${DAEMONS[@]}" || true; DAEMONS=(); }
adaptive() {  # max_change → the [mix.adaptive] table
  printf '[mix.adaptive]\nalgorithm = "exp3"\nevery = 20\nlag = %s\nmin_weight = 0.02\nmax_change = %s\n' "$LAG" "$1"
}
part() { [[ " ${PARTS:-1 2} " == *" $1 "* ]]; }
LOSS="0=3.0,1=3.0:-0.004,2=3.0:-0.004,3=3.0:-0.004,4=3.0:-0.004"
taps() {  # the 8 ranks, each on its node, until the end; prints the tokens served
  local pids=() r
  for r in $(seq 0 7); do
    "$T/dsprep" tap --endpoint "ipc://$WORK/node$((r / 4)).sock" --rank "$r" --world-size 8 \
      --steps 100000 --out "$WORK/tap$r.bin" --report-loss "$LOSS" > /dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo $(( $(cat "$WORK"/tap*.bin | wc -c) / 2 ))
}
held() { grep -c "holds the shares" "$WORK/node0.log" || true; }
decided() { grep -c "mix decision for step" "$WORK/node0.log" || true; }

peer_recipe 2048 10000 8 > "$WORK/off.toml"
{ cat "$WORK/off.toml"; adaptive 1e-9; } > "$WORK/still.toml"
{ cat "$WORK/off.toml"; adaptive 0.05; } > "$WORK/on.toml"

# 1. Tokens/s with adaptive mixing off and on (the same mix).
for round in 1 2 3; do
  part 1 || break
  for mode in off still; do
    rm -rf "$WORK/state"
    start_nodes "$WORK/$mode.toml" 4
    began=$(date +%s.%N)
    tokens=$(taps)
    seconds=$(echo "$(date +%s.%N) - $began" | bc -l)
    stop_nodes
    printf '{"bench": "nodes_served", "adaptive": "%s", "round": %s, "tokens": %s, "seconds": %.3f, "tokens_per_s": %.0f, "decisions": %s, "held": %s}\n' \
      "$mode" "$round" "$tokens" "$seconds" "$(echo "$tokens / $seconds" | bc -l)" "$(decided)" "$(held)" >> "$RESULTS"
  done
done

# 2. The trajectory, the decisions that held, and the realized shares.
part 2 || exit 0
rm -rf "$WORK/state"
start_nodes "$WORK/on.toml" 1
taps > /dev/null
stop_nodes
printf '{"bench": "nodes_decisions", "lag": %s, "decisions": %s, "held": %s}\n' "$LAG" "$(decided)" "$(held)" >> "$RESULTS"
grep -m3 "holds the shares" "$WORK/node0.log" | cut -c1-600 >&2 || true
"$T/dsprep" inspect "$WORK/state" --decisions --plot "$PLOT" > "$WORK/decisions.txt"
"$T/dsprep" pack --lineage "$WORK/state" --out "$WORK/packed" --quiet
"$T/dsprep" inspect "$WORK/packed" --mix --every 10000000 --csv "$WORK/spans.csv" > /dev/null
python3 "$ROOT/tests/bench/adaptive_fidelity.py" "$WORK/state/lineage.json" "$WORK/spans.csv" >> "$RESULTS"
echo "trajectory: $PLOT"
