#!/usr/bin/env bash
# Benchmark lanes (release build) on the peer's corpus: one pipeline vs 8 lanes in one `pack`;
# lanes at 1 and 2 tokenizer threads; `pack` parts as N = 1, 2, 4 simulated nodes (each part run
# alone, with every core, so its wall time is what one node of N would spend), the finish; and the
# reader's ceiling with 1 and 2 reader threads. One JSON line per run goes to RESULTS.
#
#   bash tests/bench/lanes_bench.sh CORPUS TOKENIZER RESULTS
#
# CORPUS as for pack_bench.sh (../shared/bench/peer/make_corpus.py: --total-mb 200
# --shards-per-source 8 --seed 0). Same mix as pack_bench.sh; buffer 10000; seq_len 2048.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; TOK="$(realpath "$2")"; RESULTS="$(realpath -m "$3")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$ROOT" && cargo build --release -p dsprep --quiet && cargo build --release -p dsprep --example reader_ceiling --quiet)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep"
CEILING="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/reader_ceiling"

# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
recipe() { peer_recipe 2048 10000 "$1"; }  # lanes (0 = none)

timed() {  # name extra-json command...: runs it under /usr/bin/time, appends a JSON line
  local name="$1" extra="$2"; shift 2
  /usr/bin/time -f '%M %e %U %S' -o "$WORK/time" "$@" > "$WORK/stdout"
  read -r rss_kb wall user sys < "$WORK/time"
  python3 - "$name" "$extra" "$rss_kb" "$wall" "$user" "$sys" "$WORK/stdout" >> "$RESULTS" <<'PY'
import json, re, sys
name, extra, rss_kb, wall, user, sys_s, stdout = sys.argv[1:]
line = {"run": name, "wall_s": float(wall), "cpu_s": float(user) + float(sys_s), "peak_rss_mb": int(rss_kb) / 1024}
line.update(json.loads(extra))
text = open(stdout).read()
m = re.search(r"\(([0-9]+) input bytes\)", text)
if m:
    line["input_bytes"] = int(m.group(1))
print(json.dumps(line))
PY
}

tokens_of() {  # manifest.json → tokens in windows
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["num_windows"]*m["window_tokens"])' "$1"
}

recipe 0 > "$WORK/plain.toml"; recipe 8 > "$WORK/lanes8.toml"
timed pack_plain_t2 '{"threads": 2, "lanes": 0}' "$BIN" pack --recipe "$WORK/plain.toml" --out "$WORK/plain" --threads 2 --quiet
echo "{\"run\": \"pack_plain_t2_tokens\", \"tokens\": $(tokens_of "$WORK/plain/manifest.json")}" >> "$RESULTS"
for t in 1 2; do
  timed "pack_lanes8_t$t" "{\"threads\": $t, \"lanes\": 8}" "$BIN" pack --recipe "$WORK/lanes8.toml" --out "$WORK/l$t" --threads "$t" --quiet
done
echo "{\"run\": \"pack_lanes8_tokens\", \"tokens\": $(tokens_of "$WORK/l2/manifest.json")}" >> "$RESULTS"
for n in 1 2 4; do
  for ((i = 0; i < n; i++)); do
    timed "part_${i}_of_$n" "{\"threads\": 2, \"lanes\": 8, \"part\": $i, \"parts\": $n}" \
      "$BIN" pack --recipe "$WORK/lanes8.toml" --out "$WORK/p$n" --threads 2 --quiet --part "$i" --parts "$n"
  done
  python3 - "$WORK/p$n.lanes" "$n" >> "$RESULTS" <<'PY'
import glob, json, sys
lanes_dir, n = sys.argv[1], int(sys.argv[2])
per_part = {}
for d in sorted(glob.glob(f"{lanes_dir}/lane-*")):
    if d.endswith(".partial"):
        continue
    info = json.load(open(f"{d}/lane.json")); m = json.load(open(f"{d}/manifest.json"))
    part = info["lane"] * n // info["count"]
    p = per_part.setdefault(part, {"tokens": 0, "documents": 0, "input_bytes": 0})
    p["tokens"] += sum(s["tokens"] for s in m["sources"]); p["documents"] += sum(s["documents"] for s in m["sources"])
    p["input_bytes"] += info["input_bytes"]
print(json.dumps({"run": f"parts_{n}_work", "per_part": per_part}))
PY
  timed "finish_$n" "{\"parts\": $n}" "$BIN" pack --recipe "$WORK/lanes8.toml" --out "$WORK/p$n" --finish --quiet
  cmp -s "$WORK/p$n/tokens-00000.bin" "$WORK/l2/tokens-00000.bin" || { echo "parts of $n differ from one pack" >&2; exit 1; }
done
for r in 1 2; do
  "$CEILING" "$WORK/lanes8.toml" "$r" | python3 -c 'import json,sys; l=json.load(sys.stdin); l["run"]="reader_ceiling_lanes8_r%d" % l["reader_threads"]; print(json.dumps(l))' >> "$RESULTS"
done
"$CEILING" "$WORK/plain.toml" | python3 -c 'import json,sys; l=json.load(sys.stdin); l["run"]="reader_ceiling_plain"; print(json.dumps(l))' >> "$RESULTS"
echo "results appended to $RESULTS"
