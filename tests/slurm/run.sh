#!/bin/bash
# The shipped Slurm examples on a real (one-machine, 4-node) Slurm cluster: config/slurm/serve.sbatch
# with 4 node daemons and 8 `dsprep tap` ranks, config/slurm/pack.sh with 8 parts in 2 srun tasks
# of one allocation, then in arrays below the cluster's MaxArraySize (5) with one task killed
# mid-part, found by `dsprep pack --status` and resubmitted as it prints, and
# config/slurm/serve-replicas.sbatch (one daemon over CURVE for TP 2 × PP 2 ranks on
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

unset PLAN  # the serve test's; pack.sh writes its own unless PLAN is set
echo "== pack: 8 parts as 2 srun tasks of one allocation (SLURM_PROCID), then the finish"
finish=$(ALLOCATION=1 TASKS=2 config/slurm/pack.sh "$recipe" "$W/parts" 8 -N 2 -o "$W/alloc-%j.out")
wait_job "$finish"
cat "$W"/alloc-*.out
diff -r "$W/whole" "$W/parts"
echo "pack: 2 srun tasks of 4 parts each + finish wrote exactly the bytes of one pack"

echo "== pack: 8 parts in arrays below MaxArraySize 5; a task killed mid-part, --status, resubmit"
# 8 lanes of generated text, one file each. The file lane 5 reads is swapped for a named pipe
# after the plan, so part 5 (the second part of array task 2) blocks inside its lane, its
# partial directory locked, until the test scancels that task.
mkdir -p "$W/gen/data"
python3 - "$W/gen" "$root" <<'PY'
import json, random, sys
gen, root = sys.argv[1], sys.argv[2]
rng = random.Random(48)
for f in range(8):
    with open(f"{gen}/data/d{f}.jsonl", "w") as out:
        for _ in range(150 + 20 * f):
            words = ("".join(rng.choices("abcdefghijklmnop", k=rng.randint(2, 9))) for _ in range(rng.randint(20, 200)))
            out.write(json.dumps({"text": " ".join(words)}) + "\n")
open(f"{gen}/gen.toml", "w").write(f"""version = 1
[tokenizer]
path = "{root}/config/tokenizers/gpt2/tokenizer.json"
eos = "<|endoftext|>"
[packing]
seq_len = 128
[shuffle]
seed = 7
buffer_size = 100
[mix]
stopping = "all_exhausted"
[lanes]
count = 8
block_windows = 2
[[source]]
name = "gen"
weight = 1.0
files = ["data/*.jsonl"]
format = "jsonl"
text = "text"
""")
PY
gen=$W/gen/gen.toml
"$DSPREP" pack --recipe "$gen" --out "$W/gen-whole" --quiet
"$DSPREP" plan --recipe "$gen" --out "$W/gen.plan.json" >/dev/null
blocked=$(python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); print(p["sources"][0]["shards"][p["lanes"]["lanes"][5]["units"][0][0]]["path"])' "$W/gen.plan.json")
mv "$W/gen/$blocked" "$W/gen/held.jsonl"
mkfifo "$W/gen/$blocked"
finish=$(PLAN=$W/gen.plan.json config/slurm/pack.sh "$gen" "$W/gen-parts" 8 -o "$W/gen-%A_%a.out" 2>"$W/gen-submit.err")
cat "$W/gen-submit.err"
grep -q "8 parts in 4 task(s) of 2 part(s) (MaxArraySize 5)" "$W/gen-submit.err"
array=$(squeue -h -o "%i %j" | awk '$2 == "dsprep-pack" {split($1, a, "_"); print a[1]; exit}')
for _ in $(seq 1 300); do
  [ -f "$W/gen-parts.lanes/lane-00005.partial/tokenizer.json" ] && [ -f "$W/gen-parts.lanes/part-00004-of-00008.done" ] && break
  sleep 0.2
done
[ -d "$W/gen-parts.lanes/lane-00005.partial" ] || { squeue; echo "error: part 5 never started" >&2; exit 1; }
# As a user runs it by hand: MaxArraySize from `scontrol show config`, the part script from the
# checkout, the sbatch flags the array had (DSPREP_SBATCH_FLAGS; pack.sh passes them to the finish).
export DSPREP_SBATCH_FLAGS="-o $W/gen-%A_%a.out"
"$DSPREP" pack --recipe "$gen" --out "$W/gen-parts" --plan "$W/gen.plan.json" --status --parts 8 | tee "$W/status-running.txt"
grep -qF "part 5 (lane 5): running ($W/gen-parts.lanes/lane-00005.partial is locked by its task)" "$W/status-running.txt"
scancel "${array}_2"
wait_job "$finish"
cat "$W"/gen-*.out
# The finish ran anyway (afterany), failed, and named the part with its resubmission.
grep -qF "cannot finish $W/gen-parts: lane(s) 5 of 8 are not packed" "$W"/gen-*.out
[ ! -e "$W/gen-parts" ]
"$DSPREP" pack --recipe "$gen" --out "$W/gen-parts" --plan "$W/gen.plan.json" --status --parts 8 | tee "$W/status.txt"
grep -qF "part 5 (lane 5): stale ($W/gen-parts.lanes/lane-00005.partial is held by no task: its task was killed)" "$W/status.txt"
grep -qF "resubmit the 1 part(s) 5 (array indices below MaxArraySize 5; part = PART_OFFSET + index):" "$W/status.txt"
resubmit=$(grep '^  sbatch ' "$W/status.txt")
[ "$(echo "$resubmit" | wc -l)" = 1 ]
case "$resubmit" in *"--array=0 --export=ALL,PARTS=8,PARTS_PER_TASK=1,PART_OFFSET=5 "*) ;; *) echo "error: $resubmit" >&2; exit 1 ;; esac
rm "$W/gen/$blocked"
mv "$W/gen/held.jsonl" "$W/gen/$blocked"
job=$(eval "$resubmit" | awk '{print $NF}')
wait_job "$job"
finish=$(PARTS=8 sbatch --parsable -o "$W/gen-finish2.out" config/slurm/pack-finish.sbatch "$gen" "$W/gen-parts" "$W/gen.plan.json")
wait_job "$finish"
cat "$W/gen-finish2.out"
diff -r "$W/gen-whole" "$W/gen-parts"
echo "pack: 8 parts in 4 array tasks under MaxArraySize 5; task 2 killed in part 5; --status named it; its resubmission (PART_OFFSET 5, index 0) and the finish wrote exactly the bytes of one pack"
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
echo "slurm: 4 passed, 0 failed"
