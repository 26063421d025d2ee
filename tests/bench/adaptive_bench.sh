#!/usr/bin/env bash
# Benchmark `[mix.adaptive]` and the loss reports (protocol v7), release build, one JSON line per
# measurement to RESULTS:
#  1. what reporting costs a trainer: 8 ranks with 1 MiB batches (64 rows × 8192 tokens of u16)
#     re-requesting a warm daemon's held steps, without and with a report after each fetch
#     (client/examples/report_bench.rs): fetch p50/p99, the helper's and the send's p50/p99;
#  2. tokens/s served to 8 `dsprep tap` ranks (world 8 × micro batch 4, seq 2048), every rank
#     reporting a synthetic loss, with `[mix.adaptive]` off and on (every 20 steps, lag 16 over
#     prefetch 8; max_change 1e-9, so that both serve the same mix and only the machinery
#     differs: reports kept, decisions waited for and written, phases pushed), four rounds each,
#     alternating;
#  3. with world 8 × micro batch 1 and a decision every 20 steps: the decisions' trajectory when
#     fineweb-edu's loss stays at 3 nats while the others fall (`inspect --decisions --plot`),
#     and the realized share of every source per 10 M tokens of `pack --lineage` against the
#     shares decided for those tokens (tests/bench/adaptive_fidelity.py).
#
#   bash tests/bench/adaptive_bench.sh CORPUS RESULTS [PLOT.svg]
#   PARTS="1 2" bash tests/bench/adaptive_bench.sh …     # some of the parts (default: 1 2 3)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; RESULTS="$(realpath -m "$2")"; PLOT="$(realpath -m "${3:-adaptive-trajectory.svg}")"
WORK="$(mktemp -d)"
cleanup() { kill "${DAEMON:-0}" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
(cd "$ROOT" && cargo build --release -p dsprep -p dsprep-client --bins --example report_bench --quiet)
T="${CARGO_TARGET_DIR:-$ROOT/target}/release"
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
bench_tokenizer gpt2
export MIX_UNIT=tokens

start_daemon() {  # recipe world mb prefetch [serve flags…]
  local recipe=$1 world=$2 mb=$3 prefetch=$4; shift 4
  "$T/dsprep" serve --recipe "$recipe" --endpoint "ipc://$WORK/d.sock" --world-size "$world" \
    --micro-batch "$mb" --prefetch "$prefetch" --metrics 127.0.0.1:0 "$@" 2> "$WORK/daemon.log" &
  DAEMON=$!
  for _ in $(seq 600); do grep -q "serving recipe" "$WORK/daemon.log" 2>/dev/null && break; sleep 0.1; done
  PORT=$(grep -o 'metrics on http://127.0.0.1:[0-9]*' "$WORK/daemon.log" | grep -o '[0-9]*$')
}
stop_daemon() { kill -TERM "$DAEMON"; wait "$DAEMON" || true; DAEMON=; }
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v s="$1" 'index($0, s" ") == 1 { print $2 }'; }
adaptive() {  # every lag [max_change] → the [mix.adaptive] table
  printf '[mix.adaptive]\nalgorithm = "exp3"\nevery = %s\nlag = %s\nmin_weight = 0.02\nmax_change = %s\n' "$1" "$2" "${3:-0.05}"
}
part() { [[ " ${PARTS:-1 2 3} " == *" $1 "* ]]; }
LOSS="0=3.0,1=3.0:-0.004,2=3.0:-0.004,3=3.0:-0.004,4=3.0:-0.004"
taps() {  # 8 `dsprep tap` ranks pulling every step and reporting $LOSS; waits for them
  local pids=() r
  for r in $(seq 0 7); do
    "$T/dsprep" tap --endpoint "ipc://$WORK/d.sock" --rank "$r" --world-size 8 --steps 100000 \
      --out "$WORK/tap$r.bin" --report-loss "$LOSS" > /dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
}

# 1. Reporting's cost to the trainer.
if part 1; then
  peer_recipe 8191 1000 > "$WORK/r8k.toml"
  start_daemon "$WORK/r8k.toml" 8 64 2
  while [ "$(metric 'dsprep_steps{kind="produced"}')" != 2 ]; do sleep 0.2; done
  for mode in fetch send report fetch send report; do
    "$T/examples/report_bench" "ipc://$WORK/d.sock" 8 8 2 300 "$mode" >> "$RESULTS"
  done
  stop_daemon
fi

# 2. Tokens/s with adaptive mixing off and on: the daemon's production time, from "serving recipe"
# to "end of data" in its log (the taps connect within that, alike in both), its tokens from its
# shutdown line. Four rounds, alternating.
peer_recipe 2048 10000 > "$WORK/off.toml"
{ cat "$WORK/off.toml"; adaptive 20 16 1e-9; } > "$WORK/still.toml"
{ cat "$WORK/off.toml"; adaptive 20 16; } > "$WORK/on.toml"
stamp() { date -d "$(grep -m1 "$1" "$WORK/daemon.log" | cut -d' ' -f1)" +%s.%N; }
for round in 1 2 3 4; do
  part 2 || break
  for mode in off still; do
    rm -rf "$WORK/state"
    start_daemon "$WORK/$mode.toml" 8 4 8 --state-dir "$WORK/state"
    taps
    decisions=$(metric 'dsprep_mix_adaptive_decisions_total{outcome="decided"}')
    held=$(metric 'dsprep_mix_adaptive_decisions_total{outcome="held"}')
    stop_daemon
    seconds=$(echo "$(stamp 'end of data') - $(stamp 'serving recipe')" | bc -l)
    tokens=$(grep -o 'documents, [0-9]* tokens' "$WORK/daemon.log" | grep -o '[0-9]*')
    printf '{"bench": "served", "adaptive": "%s", "round": %s, "tokens": %s, "seconds": %.3f, "tokens_per_s": %.0f, "decisions": "%s", "held": "%s"}\n' \
      "$mode" "$round" "$tokens" "$seconds" "$(echo "$tokens / $seconds" | bc -l)" "${decisions:-0}" "${held:-0}" >> "$RESULTS"
  done
done

# 3. The trajectory and the realized shares (world 8 × micro batch 1: 4× the decisions).
part 3 || exit 0
rm -rf "$WORK/state"
start_daemon "$WORK/on.toml" 8 1 8 --state-dir "$WORK/state"
taps
stop_daemon
"$T/dsprep" inspect "$WORK/state" --decisions --plot "$PLOT" > "$WORK/decisions.txt"
"$T/dsprep" pack --lineage "$WORK/state" --out "$WORK/packed" --quiet
"$T/dsprep" inspect "$WORK/packed" --mix --every 10000000 --csv "$WORK/spans.csv" > /dev/null
python3 "$ROOT/tests/bench/adaptive_fidelity.py" "$WORK/state/lineage.json" "$WORK/spans.csv" >> "$RESULTS"
echo "trajectory: $PLOT"
