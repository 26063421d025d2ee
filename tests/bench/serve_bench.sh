#!/usr/bin/env bash
# Benchmark `dsprep serve` (release build): fetch latency from a warm daemon over ipc, tcp and
# tcp with CURVE (keys from `dsprep keygen`), GB/s to 8 concurrent ranks, and end-to-end tokens/s
# served to 8 `dsprep tap` processes versus `dsprep pack` on the same recipe. One JSON line per
# measurement goes to RESULTS. FETCH_ONLY=1 stops after the fetch runs.
#
#   bash tests/bench/serve_bench.sh CORPUS TOKENIZER RESULTS
#
# CORPUS as for pack_bench.sh (../shared/bench/peer/make_corpus.py output).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; TOK="$(realpath "$2")"; RESULTS="$(realpath -m "$3")"
WORK="$(mktemp -d)"
cleanup() { kill "${DAEMON:-0}" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
(cd "$ROOT" && cargo build --release -p dsprep -p dsprep-client --bins --example fetch_bench --quiet)
T="${CARGO_TARGET_DIR:-$ROOT/target}/release"

# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
recipe() { peer_recipe "$1" "$2"; }  # seq_len buffer

metric() {  # port series
  curl -s "http://127.0.0.1:$1/metrics" | awk -v s="$2" 'index($0, s" ") == 1 { print $2 }'
}

start_daemon() {  # recipe endpoint world mb prefetch [serve flags…]
  local recipe=$1 endpoint=$2 world=$3 mb=$4 prefetch=$5; shift 5
  "$T/dsprep" serve --recipe "$recipe" --endpoint "$endpoint" --world-size "$world" --micro-batch "$mb" \
    --prefetch "$prefetch" --metrics 127.0.0.1:0 "$@" 2> "$WORK/daemon.log" &
  DAEMON=$!
  for _ in $(seq 600); do grep -q "serving recipe" "$WORK/daemon.log" 2>/dev/null && break; sleep 0.1; done
  PORT=$(grep -o 'metrics on http://127.0.0.1:[0-9]*' "$WORK/daemon.log" | grep -o '[0-9]*$')
}

stop_daemon() { kill -TERM "$DAEMON"; wait "$DAEMON" || true; DAEMON=; }

# CURVE keys: the daemon's pair, and one client pair in the allow directory.
"$T/dsprep" keygen --out "$WORK/server" > /dev/null
"$T/dsprep" keygen --out "$WORK/client" > /dev/null
mkdir -p "$WORK/allow" && cp "$WORK/client.key" "$WORK/allow/"

# 1. Latency and GB/s from a warm daemon: world 8 × micro batch 8, prefetch 8 steps held; over ipc,
# tcp, and tcp with CURVE ("curve+" below is this script's marker, not an endpoint scheme).
for seq in 2048 8192; do
  recipe "$seq" 1000 > "$WORK/r$seq.toml"
  for ep in "ipc://$WORK/d.sock" "tcp://127.0.0.1:$((20000 + RANDOM % 20000))" \
            "curve+tcp://127.0.0.1:$((20000 + RANDOM % 20000))"; do
    endpoint=${ep#curve+}
    flags=() keys=() curve=false
    if [ "$ep" != "$endpoint" ]; then
      curve=true
      flags=(--curve-secret-key "$WORK/server.key_secret" --curve-allow "$WORK/allow")
      keys=(DSPREP_CURVE_SERVER_KEY="$WORK/server.key" DSPREP_CURVE_CLIENT_KEY="$WORK/client.key_secret")
    fi
    start_daemon "$WORK/r$seq.toml" "$endpoint" 8 8 8 "${flags[@]}"
    while [ "$(metric "$PORT" 'dsprep_steps{kind="produced"}')" != 8 ]; do sleep 0.2; done
    # One rank cycles over the 8 held steps. With 8 ranks cycling, the slowest position would pass
    # 2 and the daemon would drop step 0 (one step of history is kept): they share steps 0 and 1.
    for spec in "1 8" "8 2"; do
      read -r ranks held <<<"$spec"
      line=$(env "${keys[@]}" "$T/examples/fetch_bench" "$endpoint" 8 "$ranks" "$held" 2000)
      echo "{\"bench\": \"fetch\", \"curve\": $curve, \"seq_len\": $seq, \"micro_batch\": 8, ${line#\{}" | tee -a "$RESULTS"
    done
    stop_daemon
  done
done
[ "${FETCH_ONLY:-0}" = 1 ] && exit 0

# 2. End to end: 8 tap processes pull every step (world 8 × micro batch 4, seq_len 2048) vs pack.
recipe 2048 10000 > "$WORK/e2e.toml"
t0=$(date +%s.%N)
start_daemon "$WORK/e2e.toml" "ipc://$WORK/e2e.sock" 8 4 8
pids=()
for r in $(seq 0 7); do
  "$T/dsprep" tap --endpoint "ipc://$WORK/e2e.sock" --rank "$r" --world-size 8 --steps 100000000 --out "$WORK/tap$r.bin" > /dev/null &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
t1=$(date +%s.%N)
stop_daemon
served=$(( $(stat -c %s "$WORK"/tap*.bin | paste -sd+ | bc) / 2 ))
"$T/dsprep" pack --recipe "$WORK/e2e.toml" --out "$WORK/packed" --quiet > "$WORK/pack.txt"
pack_wall=$(grep -o 'in [0-9.]* s' "$WORK/pack.txt" | grep -o '[0-9.]*')
packed=$(python3 -c "import json; m=json.load(open('$WORK/packed/manifest.json')); print(m['num_windows']*m['window_tokens'])")
python3 - "$served" "$t0" "$t1" "$packed" "$pack_wall" >> "$RESULTS" <<'PY'
import json, sys
served, t0, t1, packed, pack_wall = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
wall = t1 - t0
print(json.dumps({"bench": "e2e_8_taps", "served_tokens": served, "serve_wall_s": round(wall, 2),
                  "served_tokens_per_s": round(served / wall), "packed_tokens": packed, "pack_wall_s": pack_wall,
                  "packed_tokens_per_s": round(packed / pack_wall), "serve_vs_pack": round((served / wall) / (packed / pack_wall), 3)}))
PY
tail -n 1 "$RESULTS"
