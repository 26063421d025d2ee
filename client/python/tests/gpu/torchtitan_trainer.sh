#!/usr/bin/env bash
# torchtitan's real Trainer (`torchtitan.train`, llama3 debug model, vocabulary widened to GPT-2's)
# fed by dsprep on a GPU host, killed and resumed: not run in CI (torchtitan's trainer has no CPU
# mode). Needs: a CUDA GPU (NGPU of them, default 1), a venv with torch, torchtitan 0.3.0 and
# dsprep_client (`pip install torchtitan==0.3.0 ./client/python`; PYTHON, default python3), and
# the daemon (DSPREP_BIN, default target/debug/dsprep; `cargo build -p dsprep`).
#
# Three runs of STEPS (default 10) steps, checkpointing every 4: an uninterrupted run; a run killed
# (SIGKILL, with its daemon) once it took step 6's batch, after its step-4 checkpoint; and that
# run restarted (torchtitan loads its newest checkpoint; the daemon with --resume latest). Every
# batch each rank took is recorded (step and sha256); the killed run's batches of steps 1..4 and
# the resumed run's must be the uninterrupted run's, and the last step's loss the same.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../../.." && pwd)"
PYTHON="${PYTHON:-python3}"
NGPU="${NGPU:-1}"
STEPS="${STEPS:-10}"
MICRO_BATCH="${MICRO_BATCH:-2}"
DSPREP_BIN="${DSPREP_BIN:-$ROOT/target/debug/dsprep}"
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" STEPS CHECKPOINT_EVERY=4
export DSPREP_RECIPE="$ROOT/config/quickstart.toml" DSPREP_MICRO_BATCH="$MICRO_BATCH" DSPREP_WORLD="$NGPU"

serve() {   # serve NAME [flags…]: a daemon on $WORK/NAME.sock, its state in $WORK/state-NAME
  local name="$1"; shift
  "$DSPREP_BIN" serve --recipe "$DSPREP_RECIPE" --endpoint "ipc://$WORK/$name.sock" --world-size "$NGPU" \
    --micro-batch "$MICRO_BATCH" --metrics off "$@" 2>"$WORK/$name.daemon.log" &
  DAEMON=$!
  for _ in $(seq 300); do grep -q "serving recipe" "$WORK/$name.daemon.log" && return; sleep 0.1; done
  echo "the daemon did not start:" >&2; cat "$WORK/$name.daemon.log" >&2; exit 1
}

train() {   # train NAME SOCKET: torchtitan's trainer, its outputs in $WORK/NAME
  DSPREP_ENDPOINT="ipc://$WORK/$2.sock" DSPREP_RECORD="$WORK/$1.batches" DUMP_FOLDER="$WORK/$1" \
    "$PYTHON" -m torch.distributed.run --nproc_per_node "$NGPU" --master_port "${3:-29511}" \
    -m torchtitan.train --module dsprep_titan_config --config llama3_dsprep >"$WORK/$1.log" 2>&1
}

last_loss() { grep -o "loss: *[0-9.]*" "$WORK/$1.log" | tail -1 | grep -o "[0-9.]*$"; }

echo "== uninterrupted run ($STEPS steps, $NGPU GPU(s), micro batch $MICRO_BATCH) in $WORK"
serve whole
train whole whole || { tail -50 "$WORK/whole.log"; exit 1; }
kill "$DAEMON"; wait "$DAEMON" || true

echo "== a run killed after its step-4 checkpoint"
serve killed --state-dir "$WORK/state" --checkpoint-every 1 --keep-checkpoints 100
KILLED_DAEMON=$DAEMON
train killed killed 29512 &
TRAINER=$!
for _ in $(seq 3000); do
  [ -d "$WORK/killed/checkpoint/step-4" ] && [ "$(cat "$WORK"/killed.batches.rank* 2>/dev/null | wc -l)" -ge $((6 * NGPU)) ] && break
  kill -0 "$TRAINER" 2>/dev/null || { echo "the trainer ended early:" >&2; tail -50 "$WORK/killed.log" >&2; exit 1; }
  sleep 0.1
done
pkill -KILL -P "$TRAINER" 2>/dev/null || true   # torchrun's ranks
kill -KILL "$TRAINER" "$KILLED_DAEMON" 2>/dev/null || true
wait "$TRAINER" 2>/dev/null || true
sleep 2

echo "== resumed"
for r in $(seq 0 $((NGPU - 1))); do head -4 "$WORK/killed.batches.rank$r" >"$WORK/resumed.batches.rank$r"; done
serve killed --state-dir "$WORK/state" --checkpoint-every 1 --keep-checkpoints 100 --resume latest
DSPREP_ENDPOINT="ipc://$WORK/killed.sock" DSPREP_RECORD="$WORK/resumed.batches" DUMP_FOLDER="$WORK/killed" \
  "$PYTHON" -m torch.distributed.run --nproc_per_node "$NGPU" --master_port 29513 \
  -m torchtitan.train --module dsprep_titan_config --config llama3_dsprep >"$WORK/resumed.log" 2>&1 \
  || { tail -50 "$WORK/resumed.log"; exit 1; }
kill "$DAEMON"; wait "$DAEMON" || true

status=0
for r in $(seq 0 $((NGPU - 1))); do
  if cmp -s "$WORK/whole.batches.rank$r" "$WORK/resumed.batches.rank$r"; then
    echo "rank $r: $(wc -l <"$WORK/whole.batches.rank$r") batches, the killed-and-resumed run's equal the uninterrupted run's"
  else
    echo "rank $r: the batches differ:" >&2; diff "$WORK/whole.batches.rank$r" "$WORK/resumed.batches.rank$r" >&2 || true; status=1
  fi
done
echo "last loss: uninterrupted $(last_loss whole), resumed $(last_loss resumed)"
grep -q "Loading the checkpoint from .*step-4" "$WORK/resumed.log" || { echo "the resumed run did not load step-4" >&2; status=1; }
[ "$(last_loss whole)" = "$(last_loss resumed)" ] || { echo "the last losses differ" >&2; status=1; }
exit "$status"
