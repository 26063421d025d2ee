#!/usr/bin/env bash
# Scaling 1 -> 16 on the `device` machine, from the bundle tests/bench/device_bundle.sh packed:
# unpacks it under /tmp, copies the corpus REPS times (default 12: 1.2 GB of text, a 16-thread
# run of about two seconds, a one-thread run of about twenty; the shuffle buffer's fill, about
# 0.1 s whatever the threads, is then about 5 % of the 16-thread run, not the 10 % of REPS=6),
# builds each tokenizer's engine cache once, then runs tests/bench/scaling_bench.sh for each
# build in the bundle, outputs on /dev/shm. Results go to $OUT (the device call's folder that
# comes back) or ./devbench-results.
#
#   bash tests/bench/device_scaling.sh [TOKENIZERS...]      # default: gpt2 llama3 qwen3 llama2
#
# THREADS (default "1 16"), MODES (default "cores copies"), ROUNDS (default 2) pass through.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="$ROOT/.devbench"; WORK=/tmp/devbench; RESULTS="${OUT:-$ROOT/devbench-results}"
NAMES="${*:-gpt2 llama3 qwen3 llama2}"; REPS="${REPS:-12}"
export THREADS="${THREADS:-1 16}" MODES="${MODES:-cores copies}" ROUNDS="${ROUNDS:-2}"
rm -rf "$WORK"; mkdir -p "$WORK/bin" "$WORK/corpus" "$RESULTS"

python3 - "$BUNDLE" "$WORK" <<'PY'
import lzma, os, pathlib, sys
bundle, work = map(pathlib.Path, sys.argv[1:])
for xz in list(bundle.glob("bin/*.xz")) + list(bundle.glob("tokcache/*/*.xz")):
    kind = xz.parent.name if xz.parent.parent.name == "tokcache" else None
    out = work / "tokcache" / kind / xz.stem if kind else work / "bin" / xz.stem / "dsprep"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(lzma.decompress(xz.read_bytes()))
    os.chmod(out, 0o755)
PY
for dir in "$BUNDLE"/corpus/*/; do
  src="$(basename "$dir")"; mkdir -p "$WORK/corpus/$src"
  for r in $(seq "$REPS"); do
    for f in "$dir"*.parquet; do cp "$f" "$WORK/corpus/$src/r$r-$(basename "$f")"; done
  done
done
export DSPREP_TOKENIZER_CACHE="$WORK/tokcache" DSPREP_ENGINE_CACHE="$WORK/engines" OUT_ROOT=/dev/shm
{ nproc; grep -m1 "model name" /proc/cpuinfo; uname -r; du -sh "$WORK/corpus"; } | tee "$RESULTS/machine.txt"

# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
CORPUS="$WORK/corpus"
for build in "$WORK"/bin/*/; do
  build="$(basename "$build")"; bin="$WORK/bin/$build/dsprep"
  for name in $NAMES; do   # each engine cache built once, outside the timed runs
    bench_tokenizer "$name"; export TOK EOS
    peer_recipe 2048 10000 > "$WORK/warm.toml"
    "$bin" pack --recipe "$WORK/warm.toml" --out /dev/shm/dsprep-warm --threads 16 > /dev/null
    rm -rf /dev/shm/dsprep-warm
  done
  DSPREP_BIN="$bin" bash "$ROOT/tests/bench/scaling_bench.sh" "$CORPUS" "$RESULTS/$build.jsonl" $NAMES \
    | tee "$RESULTS/$build.txt"
done
