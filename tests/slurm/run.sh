#!/bin/bash
# The shipped Slurm examples on a real (one-machine, 4-node) Slurm cluster: config/slurm/serve.sbatch
# with 4 node daemons and 8 `dsprep tap` ranks, config/slurm/pack.sh with 4 array tasks and the
# finish, and config/slurm/serve-replicas.sbatch (one daemon over CURVE for TP 2 × PP 2 ranks on
# 4 nodes, after the node daemons refuse that layout). Each must equal one `dsprep pack` of
# config/quickstart-multinode.toml, byte for byte.
# Needs root (it installs and starts Slurm: tests/slurm/cluster.sh). Bounded: 5 minutes per job.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
export DSPREP=${DSPREP:-$root/target/debug/dsprep}
[ -x "$DSPREP" ] || cargo build -q -p dsprep
recipe=$root/config/quickstart-multinode.toml

if [ "$(id -u)" != 0 ]; then
  if [ "${CI:-}" = true ]; then
    echo "error: tests/slurm/run.sh needs root in CI (it installs and starts Slurm)" >&2
    exit 1
  fi
  echo "SKIPPED tests/slurm/run.sh: it needs root to install and start Slurm (CI runs it as root)" >&2
  exit 0
fi
tests/slurm/cluster.sh start
trap 'tests/slurm/cluster.sh stop' EXIT
export W=$(mktemp -d /tmp/dsprep-slurm.XXXXXX)
chmod 755 "$W"

wait_job() {  # wait_job ID: until it has left the queue (at most 300 s)
  for _ in $(seq 1 300); do
    squeue -h -j "$1" 2>/dev/null | grep -q . || return 0
    sleep 1
  done
  echo "error: Slurm job $1 did not finish in 300 s" >&2
  squeue >&2
  return 1
}

"$DSPREP" pack --recipe "$recipe" --out "$W/whole" --quiet

echo "== serve: 4 node daemons (srun, SLURM_NODEID) × 2 ranks each"
export RANKS_PER_NODE=2 MICRO_BATCH=2 STATE_DIR=$W/state SOCK_DIR=$W PLAN=$W/plan.json
export TRAINER='"$DSPREP" tap --endpoint "$DSPREP_ENDPOINT" --rank "$RANK" --world-size "$WORLD_SIZE" --steps 1000000 --out "$W/rank$RANK.bin"'
job=$(sbatch --parsable -N 4 -o "$W/serve.out" config/slurm/serve.sbatch "$recipe")
wait_job "$job"
cat "$W/serve.out"
python3 - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
plan = json.load(open(f"{w}/plan.json"))
assert plan["format"] == "dsprep-plan", "serve.sbatch wrote the job's plan once, where PLAN says"
m = json.load(open(f"{w}/whole/manifest.json"))
stream = b"".join(open(f"{w}/whole/{s['file']}", "rb").read() for s in m["shards"])
window = m["window_tokens"] * (2 if m["dtype"] == "u16" else 4)
world, mb = 8, 2
steps = m["num_windows"] // (world * mb)
for rank in range(world):
    want = b"".join(stream[((s * world + rank) * mb) * window:((s * world + rank) * mb + mb) * window]
                    for s in range(steps))
    got = open(f"{w}/rank{rank}.bin", "rb").read()
    assert got == want, f"rank {rank}: {len(got)} bytes received, {len(want)} expected"
print(f"serve: 8 ranks on 4 node daemons received exactly the packed stream ({steps} steps each)")
PY

echo "== pack: 4 array tasks, then the finish"
finish=$(config/slurm/pack.sh "$recipe" "$W/parts" 4 -o "$W/pack-%A_%a.out")
wait_job "$finish"
cat "$W"/pack-*.out
diff -r "$W/whole" "$W/parts"
echo "pack: 4 array tasks + finish wrote exactly the bytes of one pack"
echo "== data-parallel replicas across nodes (NeuronX Distributed's layout, scaled down: TP 2 × PP 2 on 4 nodes, DP 2)"
# Node daemons started the usual way, with the job's layout, refuse it and print the launch.
cat > "$W/refuse.sbatch" <<EOF
#!/bin/bash
srun --ntasks-per-node=1 bash -c 'DSPREP_TP=2 DSPREP_PP=2 "$DSPREP" serve --recipe "$recipe" --world-size 2 --micro-batch 1 --metrics off --endpoint "ipc://$W/refused-\$SLURM_NODEID.sock"; true'
EOF
job=$(sbatch --parsable -N 4 -o "$W/refused.out" "$W/refuse.sbatch")
wait_job "$job"
refused=$(grep -c "a data-parallel replica spans nodes" "$W/refused.out" || true)
[ "$refused" = 4 ] || { cat "$W/refused.out"; echo "error: $refused of 4 node daemons refused the layout" >&2; exit 1; }
grep -q -- "--nodes 1 --node-rank 0 --endpoint tcp://" "$W/refused.out"
echo "replicas: all 4 node daemons refused TP 2 × PP 2 with DP 2, and printed the one-daemon launch"
# That launch: config/slurm/serve-replicas.sbatch, one daemon over CURVE, 8 ranks with the layout.
# A replica's TP and PP peers must stay within the daemon's history (8 steps) of each other, as
# their collectives keep real trainers; these taps have none, so they are paced (100 ms a step).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export RANKS_PER_NODE=2 TP=2 CP=1 PP=2 MICRO_BATCH=1 PORT=$port
export KEY_DIR=$W/keys STATE_DIR=$W/state-replicas
export TRAINER='"$DSPREP" tap --endpoint "$DSPREP_ENDPOINT" --rank "$RANK" --world-size "$WORLD_SIZE" --tensor-parallel "$DSPREP_TP" --pipeline-parallel "$DSPREP_PP" --steps 120 --step-ms 100 --out "$W/replica-rank$RANK.bin"'
job=$(sbatch --parsable -N 4 -o "$W/replicas.out" config/slurm/serve-replicas.sbatch "$recipe")
wait_job "$job"
cat "$W/replicas.out"
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
m = json.load(open(f"{w}/whole/manifest.json"))
stream = b"".join(open(f"{w}/whole/{s['file']}", "rb").read() for s in m["shards"])
window = m["window_tokens"] * (2 if m["dtype"] == "u16" else 4)
dp_world = 2
steps = 120  # what each paced tap pulls
for rank in range(8):
    dp = (rank // 2) % 2  # tp-cp-dp-pp: rank = tp + 2 × (dp + 2 × pp)
    want = b"".join(stream[(s * dp_world + dp) * window:(s * dp_world + dp + 1) * window] for s in range(steps))
    got = open(f"{w}/replica-rank{rank}.bin", "rb").read()
    assert got == want, f"rank {rank} (DP rank {dp}): {len(got)} bytes received, {len(want)} expected"
print(f"replicas: 8 ranks on 4 nodes (TP 2 × PP 2) each received their DP rank's packed stream ({steps} steps); one daemon read the input, the other 3 nodes none")
PY
echo "slurm: 3 passed, 0 failed"
