#!/usr/bin/env bash
# Checkpoints when promised (issue 46): a daemon serving the 100 MB corpus with a 100k-document
# shuffle buffer, 2 ranks × micro batch 4, seq_len 2048, the default --checkpoint-every (500):
#   1. which steps its checkpoints land at (and, at --checkpoint-every 50, how far below each
#      multiple of 50 the one for it lies);
#   2. start → first batch of `dsprep serve --resume latest` for trainers that resume at step 6
#      and at step 500, 3 runs each, the bytes checked against the uninterrupted daemon's.
# One JSON line per measurement.
#
# usage: tests/bench/early_resume_bench.sh CORPUS_DIR     (../shared/bench/peer/make_corpus.py)
#        DSPREP_BIN=path/to/dsprep tests/bench/early_resume_bench.sh CORPUS_DIR   # another build
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
bench_tokenizer gpt2
dsprep_bin
WORK="$(mktemp -d)"
trap 'pkill -P $$ || true; rm -rf "$WORK"' EXIT
peer_recipe 2048 100000 >"$WORK/r.toml"
EP="ipc://$WORK/d.sock"
WORLD=2 MB=4
STEP_BYTES=$((MB * 2049 * 2))   # one rank's rows of one step, u16 ids

serve() {  # state_dir log extra...
  local state=$1 log=$2; shift 2
  "$BIN" serve --recipe "$WORK/r.toml" --world-size $WORLD --micro-batch $MB --endpoint "$EP" \
    --metrics off --prefetch 4 --state-dir "$state" --keep-checkpoints 1000 "$@" 2>>"$log" >/dev/null &
  echo $!
}
taps() {  # from steps out_prefix
  local pids=()
  for r in $(seq 0 $((WORLD - 1))); do
    "$BIN" tap --endpoint "$EP" --rank "$r" --world-size $WORLD --start-step "$1" --steps "$2" \
      --out "$3.$r" >/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
}
ms() { date +%s%3N; }
stop() {  # signal pid: the daemon is not this shell's child, so wait for it by polling
  kill "-$1" "$2" 2>/dev/null || true
  while kill -0 "$2" 2>/dev/null; do sleep 0.05; done
}
written() { grep -o 'written: step [0-9]*' "$1" | awk '{print $3}' | tr '\n' ' '; }

# 1. The uninterrupted daemon, pulled to step 520, stopped with SIGTERM.
for every in 500 50; do
  rm -rf "$WORK/s$every"
  pid=$(serve "$WORK/s$every" "$WORK/serve$every.log" --checkpoint-every $every)
  taps 0 520 "$WORK/all$every"
  stop TERM "$pid"
  steps=$(written "$WORK/serve$every.log")
  worst=$(echo "$steps" | tr ' ' '\n' | awk -v e=$every 'NF {s[n++]=$1} END {
    w=0; for (m=e; m<=519; m+=e) { b=-1; for (i=0;i<n;i++) if (s[i]<=m) b=s[i]; d=(b<0)?m:m-b; if (d>w) w=d }; print w }')
  echo "{\"checkpoint_every\": $every, \"written_steps\": \"$steps\", \"largest_gap_below_a_multiple\": $worst}"
done

# 2. Trainers resume at step T: the daemon restarts with --resume latest from the first run's
#    checkpoints (SIGTERM's included: the newest at or below T is used).
for want in 6 500; do
  for run in 1 2 3; do
    rm -rf "$WORK/r" && cp -r "$WORK/s500" "$WORK/r"
    : >"$WORK/resume.log"
    t0=$(ms)
    pid=$(serve "$WORK/r" "$WORK/resume.log" --resume latest)
    taps "$want" 1 "$WORK/one"
    t1=$(ms)
    stop KILL "$pid"
    match=true
    for r in $(seq 0 $((WORLD - 1))); do
      a=$(dd if="$WORK/all500.$r" bs=$STEP_BYTES skip="$want" count=1 2>/dev/null | sha256sum)
      b=$(sha256sum <"$WORK/one.$r")
      [ "$a" = "$b" ] || match=false
    done
    from=$(grep -o 'resuming from checkpoint [^ ]* (step [0-9]*' "$WORK/resume.log" | grep -o '[0-9]*$' || echo none)
    restore=$(grep -o ' in [0-9.]* s; fast-forwarding [0-9]* windows' "$WORK/resume.log" | head -1 || true)
    echo "{\"resume_at_step\": $want, \"run\": $run, \"start_to_first_batch_ms\": $((t1 - t0)), \"checkpoint_step\": \"$from\", \"restore\": \"${restore# }\", \"bytes_match\": $match}"
  done
done
