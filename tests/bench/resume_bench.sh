#!/usr/bin/env bash
# Resume benchmark (issue 4): time from `dsprep serve --resume latest` to a rank's first batch,
# early (about 10^3 documents in) and far (about 10^6 documents in) into the stream, with a
# 100k-document shuffle buffer; and the checkpoint's write time and size.
#
# usage: tests/bench/resume_bench.sh CORPUS_DIR     (CORPUS_DIR from make_short_docs.py)
#        POOL_DOCUMENTS=10000 tests/bench/resume_bench.sh CORPUS_DIR   # [packing] best_fit
# Needs a release build: cargo build --release -p dsprep (DSPREP_BIN overrides the binary).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"
BIN="${DSPREP_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep}"
WORK="$(mktemp -d)"
trap 'pkill -P $$ || true; rm -rf "$WORK"' EXIT

cat >"$WORK/r.toml" <<TOML
version = 1
[tokenizer]
path = "$ROOT/config/tokenizers/gpt2/tokenizer.json"
eos = "<|endoftext|>"
[packing]
seq_len = 2048
$([ -n "${POOL_DOCUMENTS:-}" ] && printf 'strategy = "best_fit"\npool_documents = %s' "$POOL_DOCUMENTS")
[shuffle]
seed = 0
buffer_size = 100000
[mix]
stopping = "first_exhausted"
[[source]]
name = "short"
weight = 1.0
files = ["$CORPUS/short/sample/10BT/*.parquet"]
format = "parquet"
text = "text"
TOML

EP="ipc://$WORK/d.sock"
serve() {  # extra args...
  "$BIN" serve --recipe "$WORK/r.toml" --world-size 1 --micro-batch 8 --endpoint "$EP" \
    --metrics off --prefetch 4 --state-dir "$WORK/state" --keep-checkpoints 1000 "$@" 2>>"$WORK/serve.log" >/dev/null &
  echo $!
}
ms() { date +%s%3N; }

# One uninterrupted daemon, pulled to step 2500, writing a checkpoint every 5 steps.
pid=$(serve --checkpoint-every 5)
"$BIN" tap --endpoint "$EP" --rank 0 --world-size 1 --steps 2500 --out "$WORK/all.bin" >/dev/null
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
grep -o 'written: step [0-9]*, [0-9]* documents in, [0-9]* buffered, [0-9.]* ms' "$WORK/serve.log" >"$WORK/written.txt"
echo "checkpoints written: $(wc -l <"$WORK/written.txt"); write times (ms): $(awk '{print $(NF-1)}' "$WORK/written.txt" | sort -n | awk '{a[NR]=$1} END {print "min " a[1] ", median " a[int((NR+1)/2)] ", max " a[NR]}')"

for want in 1000 1000000; do
  # The first checkpoint at least `want` documents in.
  line=$(awk -v w="$want" '$4 >= w {print; exit}' "$WORK/written.txt")
  step=$(echo "$line" | awk '{print $3}' | tr -d ,)
  file="$WORK/state/step-$(printf %012d "$step").ckpt"
  mkdir -p "$WORK/r$want" && cp "$file" "$WORK/r$want/"
  for run in 1 2 3; do
    : >"$WORK/serve.log"
    t0=$(ms)
    pid=$("$BIN" serve --recipe "$WORK/r.toml" --world-size 1 --micro-batch 8 --endpoint "$EP" \
      --metrics off --prefetch 4 --state-dir "$WORK/r$want" --resume latest 2>>"$WORK/serve.log" >/dev/null & echo $!)
    "$BIN" tap --endpoint "$EP" --rank 0 --world-size 1 --start-step "$step" --steps 1 --out "$WORK/one.bin" >/dev/null
    t1=$(ms)
    kill -9 "$pid"; wait "$pid" 2>/dev/null || true
    rm -f "$WORK/r$want"/.*.tmp
    ls "$WORK/r$want"/*.ckpt | grep -v "step-$(printf %012d "$step")" | xargs -r rm -f || true
    expect=$(dd if="$WORK/all.bin" bs=$((8 * 2049 * 2)) skip="$step" count=1 2>/dev/null | sha256sum | cut -c1-16)
    got=$(sha256sum <"$WORK/one.bin" | cut -c1-16)
    restored=$(grep -o 'in [0-9.]* s; fast-forwarding [0-9]* windows' "$WORK/serve.log" || echo "?")
    echo "{\"position_docs\": $(echo "$line" | awk '{print $4}'), \"step\": $step, \"run\": $run, \"start_to_first_batch_ms\": $((t1 - t0)), \"restore\": \"$restored\", \"checkpoint_bytes\": $(stat -c %s "$file"), \"bytes_match\": $([ "$expect" = "$got" ] && echo true || echo false)}"
  done
done
