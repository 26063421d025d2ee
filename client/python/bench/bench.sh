#!/usr/bin/env bash
# Trainer-client benchmarks (BENCHMARKS.md, "Trainer clients"), release build, on the
# quickstart recipe with 2048-token windows (world 8 × micro batch 8, as tests/bench/serve_bench.sh):
#   1. Python `Client.batch_at` re-requesting the 8 steps a warm daemon holds (1 and 8 rank
#      threads), next to the Rust fetch_bench on the same daemon;
#   2. the same windows read from a `dsprep pack` directory through numpy.memmap (PackedDataset);
#   3. the example trainer (`train --launch 2`): share of step time spent waiting for data.
# One JSON line (or trainer summary line) per measurement goes to stdout.
#
#   bash client/python/bench/bench.sh PYTHON   # a python with dsprep_client installed
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PY="${1:-python3}"
WORK="$(mktemp -d)"
cleanup() { [ -n "${DAEMON:-}" ] && kill "$DAEMON" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
(cd "$ROOT" && cargo build --release --quiet -p dsprep -p dsprep-client --bin dsprep --example fetch_bench --example train)
T="${CARGO_TARGET_DIR:-$ROOT/target}/release"

recipe() {  # seq_len -> the quickstart with absolute paths
  sed -e "s/seq_len = 512/seq_len = $1/" -e "s#\"samples/#\"$ROOT/config/samples/#" \
      -e "s#\"tokenizers/#\"$ROOT/config/tokenizers/#" "$ROOT/config/quickstart.toml"
}

start_daemon() {  # recipe world mb prefetch
  "$T/dsprep" serve --recipe "$1" --endpoint "ipc://$WORK/d.sock" --world-size "$2" --micro-batch "$3" \
    --prefetch "$4" --metrics 127.0.0.1:0 2> "$WORK/daemon.log" &
  DAEMON=$!
  for _ in $(seq 600); do grep -q "serving recipe" "$WORK/daemon.log" 2>/dev/null && break; sleep 0.1; done
  PORT=$(grep -o 'metrics on http://127.0.0.1:[0-9]*' "$WORK/daemon.log" | grep -o '[0-9]*$')
}

produced() { curl -s "http://127.0.0.1:$PORT/metrics" | awk '$1 == "dsprep_steps{kind=\"produced\"}" { print $2 }'; }
stop_daemon() { kill -TERM "$DAEMON"; wait "$DAEMON" || true; DAEMON=; }

echo "# uptime before: $(uptime)"
recipe 2048 > "$WORK/r2048.toml"
start_daemon "$WORK/r2048.toml" 8 8 8
while [ "$(produced)" != 8 ]; do sleep 0.2; done
# One rank cycles over the 8 held steps. With 8 ranks cycling, the slowest position passes 2 and
# step 0 is dropped (it is history): they share steps 0 and 1, which stay held.
for spec in "1 8" "8 2"; do
  read -r ranks held <<<"$spec"
  "$PY" "$ROOT/client/python/bench/fetch_bench.py" --endpoint "ipc://$WORK/d.sock" --world-size 8 --ranks "$ranks" --held "$held" --requests 4000
  "$PY" "$ROOT/client/python/bench/fetch_bench.py" --endpoint "ipc://$WORK/d.sock" --world-size 8 --ranks "$ranks" --held "$held" --requests 4000 --touch
  echo "rust: $("$T/examples/fetch_bench" "ipc://$WORK/d.sock" 8 "$ranks" "$held" 4000)"
done
stop_daemon

"$T/dsprep" pack --recipe "$WORK/r2048.toml" --out "$WORK/packed" --quiet > /dev/null
for touch in "" --touch; do
  "$PY" "$ROOT/client/python/bench/fetch_bench.py" --packed "$WORK/packed" --micro-batch 8 --world-size 8 --ranks 1 --held 8 --requests 4000 $touch
done

# 3. The trainer: 2 ranks × micro batch 4 × 512 tokens (d_model 64, 2 layers), then the test's tiny shape.
recipe 512 > "$WORK/r512.toml"
start_daemon "$WORK/r512.toml" 2 4 8
"$T/examples/train" --launch 2 --endpoint "ipc://$WORK/d.sock" --steps 60 --d-model 64 --layers 2 --heads 4 --seed 1 | grep -E 'done|step=59'
stop_daemon
recipe 64 > "$WORK/r64.toml"
start_daemon "$WORK/r64.toml" 2 2 8
"$T/examples/train" --launch 2 --endpoint "ipc://$WORK/d.sock" --steps 60 --seed 1 | grep -E 'done|step=59'
stop_daemon
echo "# uptime after: $(uptime)"
