#!/usr/bin/env bash
# `dsprep pack --status` over 4,096 lanes (issue 48): a recipe of 4,096 one-line files with
# [lanes] count = 4096, its plan, and an OUT.lanes/ as a job leaves it, made here without packing:
# 4,093 complete lanes of 8 files each with their parts' `.done` records, part 17 failed (its
# `.failed` record), lane 42's partial directory left by a killed task, lane 3000 never packed.
# Then the status at 4,096 parts (one lane each) and at 64 parts (64 lanes each): wall time over
# 5 runs, and the metadata calls of one run counted with `strace -f -c` (openat, statx,
# newfstatat, getdents64, flock), beside the same status of an output with no OUT.lanes/ (the
# recipe's and the plan's own reads).
#
#   bash tests/bench/status_bench.sh [DSPREP]      # default: target/release/dsprep
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DSPREP=$(realpath "${1:-$ROOT/target/release/dsprep}")
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export DSPREP_MAX_ARRAY_SIZE=1001  # no scontrol asked
python3 - "$ROOT" <<'PY'
import json, os, sys
root = sys.argv[1]
os.makedirs("data")
for i in range(4096):
    open(f"data/d{i:05}.jsonl", "w").write(json.dumps({"text": f"document {i} " * 20}) + "\n")
open("r.toml", "w").write(f"""version = 1
[tokenizer]
path = "{root}/config/tokenizers/gpt2/tokenizer.json"
eos = "<|endoftext|>"
[packing]
seq_len = 512
[shuffle]
seed = 7
buffer_size = 100
[mix]
stopping = "all_exhausted"
[lanes]
count = 4096
block_windows = 1
[[source]]
name = "gen"
weight = 1.0
files = ["data/*.jsonl"]
format = "jsonl"
text = "text"
""")
PY
"$DSPREP" plan --recipe r.toml --out plan.json >/dev/null
python3 - <<'PY'
import json, os
h = json.load(open("plan.json"))["recipe_hash"]
d = "out.lanes"
os.makedirs(d)
files = ["manifest.json", "lane.json", "tokenizer.json", "tokens-00000.u16", "doc_starts.u32",
         "doc_starts_offsets.u64", "doc_sources.u16", "lead_sources.u16"]
for lane in range(4096):
    if lane in (17, 3000):
        continue
    if lane == 42:
        os.makedirs(f"{d}/lane-00042.partial")
        open(f"{d}/lane-00042.partial/.lock", "w").close()
        continue
    os.makedirs(f"{d}/lane-{lane:05}")
    for f in files:
        open(f"{d}/lane-{lane:05}/{f}", "w").close()
done = json.dumps({"recipe_hash": h})
for part in range(4096):
    if part not in (17, 42, 3000):
        open(f"{d}/part-{part:05}-of-04096.done", "w").write(done)
failed = {"recipe_hash": h, "error": "lane 17 of 4096: cannot read input data/d00017.jsonl"}
open(f"{d}/part-00017-of-04096.failed", "w").write(json.dumps(failed))
for part in range(1, 64):
    if part != 46:  # part 0 holds lanes 17 and 42, part 46 lane 3000
        open(f"{d}/part-{part:05}-of-00064.done", "w").write(done)
PY
echo "entries in OUT.lanes/: $(ls out.lanes | wc -l) (and $((4093 * 8)) lane files below them)"
for parts in 4096 64; do
  for out in out none; do
    walls=$(for _ in 1 2 3 4 5; do
      /usr/bin/time -f "%e" "$DSPREP" pack --recipe r.toml --out $out --plan plan.json --status --parts $parts 2>&1 >/dev/null | tail -1
    done | sort -n | tr '\n' ' ')
    strace -f -c -o trace.txt "$DSPREP" pack --recipe r.toml --out $out --plan plan.json --status --parts $parts >/dev/null 2>&1
    calls=$(awk '$NF ~ /^(openat|statx|newfstatat|getdents64|flock)$/ {printf "%s %s, ", $NF, $4}' trace.txt)
    echo "parts $parts, OUT.lanes ${out/none/absent}: wall s (5 runs, sorted) $walls; calls: $calls"
  done
done
"$DSPREP" pack --recipe r.toml --out out --plan plan.json --status --parts 4096
