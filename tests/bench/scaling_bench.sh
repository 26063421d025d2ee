#!/usr/bin/env bash
# How `dsprep pack` scales with tokenizer threads, measured two ways, alternating, ROUNDS rounds
# (default 3); one JSON line per run goes to RESULTS, then a table of medians.
#
#   bash tests/bench/scaling_bench.sh CORPUS RESULTS [TOKENIZERS...]
#
# CORPUS: ../shared/bench/peer/make_corpus.py --total-mb 100 --shards-per-source 8 --seed 0
# THREADS (default "1 2"): the tokenizer thread counts; the first is the baseline.
#   - threads: `--threads N` alone. The reader and the writer run beside the tokenizer threads
#     on any free core, so at N = 1 they get a core of their own and the baseline is flattered.
#   - cores:   `--threads N` under `taskset` on cores 0..N-1, so every thread of the process
#     shares the N cores: throughput per core, as the cores are paid for.
#   - copies:  N separate `--threads 1` processes at once, process i under `taskset` on core i,
#     each packing the whole corpus into an output of its own: what N cores give when nothing
#     is shared but the machine (its caches, memory bandwidth, a VM's host). Their tokens/s,
#     summed, over one copy's is the most any N-thread pack could scale per core here; the
#     table's last column gives `cores` against it. One copy is the `cores` run at one thread,
#     which it reuses where MODES names `cores` before it.
# Each run gives tokens/s over the whole run and after the first window (the shuffle buffer's
# fill excluded). The table gives the ratio of medians and, beside it, the median of each
# round's own ratio (its runs are seconds apart, so a slow spell of the machine moves both).
# MODES (default "threads cores"): which of the three, above.
# OUT_ROOT (default a temporary directory): where the outputs go; a tmpfs (/dev/shm) keeps N
# copies' writes and syncs off a disk they would otherwise queue on.
# With PERF=1 each run at the last thread count is sampled, and the table gives each thread's
# share of the process's CPU (reader, the shards' reading and parquet decoding, tokenizers, the
# pipeline's thread that packs, the token shards' writing, their sha256, the stream chain, the
# engine's build from its cache entry, input hashing): with `perf` where it is installed (those runs' times
# then include its 2 kHz sampling, which lowers their ratios a little), else by reading /proc
# every 10 ms (tests/bench/thread_cpu.py; PERF=proc chooses it where perf is installed too),
# which also gives the cores busy and the peak RSS of those runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; RESULTS="$(realpath -m "$2")"; shift 2
NAMES="${*:-gpt2 llama3 qwen3 llama2}"; ROUNDS="${ROUNDS:-3}"; THREADS="${THREADS:-1 2}"
MODES="${MODES:-threads cores}"
WORK="$(mktemp -d)"
OUTS="$(mktemp -d "${OUT_ROOT:-$WORK}/dsprep-scaling.XXXXXX")"
trap 'rm -rf "$WORK" "$OUTS"' EXIT
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
dsprep_bin   # BIN: DSPREP_BIN, or a release build made here
LAST="${THREADS##* }"

for name in $NAMES; do
  bench_tokenizer "$name"
  export TOK EOS
  peer_recipe 2048 10000 > "$WORK/recipe.toml"
  for round in $(seq "$ROUNDS"); do
    for mode in $MODES; do
      for n in $THREADS; do
        # A fresh output directory each run: replacing the last run's (--force) would time
        # deleting 70 MB, which packing does not need.
        rm -rf "$OUTS"/out* "$WORK/threads.cpu" "$WORK"/summary*
        if [ "$mode" = copies ] && [ "$n" = 1 ] && [[ " $MODES " == *" cores "* ]]; then
          # One copy on core 0 is the `cores` run at one thread, command for command: reuse it.
          python3 - "$name" "$round" "$RESULTS" >> "$RESULTS" <<'PY'
import json, sys
name, rnd, results = sys.argv[1:]
rows = [json.loads(l) for l in open(results)]
row = next(r for r in rows if r["tokenizer"] == name and r["round"] == int(rnd)
           and r["mode"] == "cores" and r["threads"] == 1)
print(json.dumps(dict(row, mode="copies")))
PY
          tail -n 1 "$RESULTS"
          continue
        elif [ "$mode" = copies ]; then
          for i in $(seq 0 $((n - 1))); do
            taskset -c "$i" "$BIN" pack --recipe "$WORK/recipe.toml" --out "$OUTS/out.$i" --threads 1 \
              > "$WORK/summary.$i" 2>&1 &
          done
          wait
          python3 - "$name" "$round" "$n" "$WORK" >> "$RESULTS" <<'PY'
import json, re, sys
name, rnd, n, work = sys.argv[1:]
runs = []
for i in range(int(n)):
    text = open(f"{work}/summary.{i}").read()
    m = re.search(r"\((\d+) tokens, u\d+\) into .* in ([\d.]+) s", text)
    first = re.search(r"first window after ([\d.]+) s", text)
    if not m or not first:
        sys.exit(f"copy {i} did not finish:\n{text}")
    runs.append((int(m.group(1)), float(m.group(2)), float(first.group(1))))
print(json.dumps({"tokenizer": name, "round": int(rnd), "mode": "copies", "threads": int(n),
    "tokens": sum(t for t, _, _ in runs), "wall_s": max(w for _, w, _ in runs),
    "first_window_s": max(f for _, _, f in runs),
    "tokens_per_s": round(sum(t / w for t, w, _ in runs)),
    "after_first_window_tokens_per_s": round(sum(t / (w - f) for t, w, f in runs)),
    "copies_tokens_per_s": [round(t / w) for t, w, _ in runs],
    "cpu_share_percent": {}, "cores_busy": None, "peak_rss_mb": None}))
PY
          tail -n 1 "$RESULTS"
          continue
        fi
        run=("$BIN" pack --recipe "$WORK/recipe.toml" --out "$OUTS/out" --threads "$n")
        if [ "$mode" = cores ]; then
          run=(taskset -c "0-$((n - 1))" "${run[@]}")
        fi
        if [ "${PERF:-0}" = 1 ] && [ "$n" = "$LAST" ] && command -v perf >/dev/null 2>&1; then
          perf record -q -e cpu-clock -F 2000 -o "$WORK/perf.data" -- "${run[@]}" > "$WORK/summary" 2>&1
          perf report -i "$WORK/perf.data" --no-children --sort comm --stdio 2>/dev/null \
            | awk '/%/ { gsub("%", "", $1); print $2, $1 }' > "$WORK/threads"
        elif [ "${PERF:-0}" != 0 ] && [ "$n" = "$LAST" ]; then
          python3 "$ROOT/tests/bench/thread_cpu.py" "$WORK/threads" -- "${run[@]}" > "$WORK/summary" 2>&1
        else
          "${run[@]}" > "$WORK/summary" 2>&1
          : > "$WORK/threads"
        fi
        [ -f "$WORK/threads.cpu" ] || echo 0 > "$WORK/threads.cpu"
        python3 - "$name" "$round" "$mode" "$n" "$WORK/summary" "$WORK/threads" >> "$RESULTS" <<'PY'
import json, re, sys
name, rnd, mode, n, summary, threads = sys.argv[1:]
text = open(summary).read()
m = re.search(r"\((\d+) tokens, u\d+\) into .* in ([\d.]+) s", text)
first = float(re.search(r"first window after ([\d.]+) s", text).group(1))
tokens, wall = int(m.group(1)), float(m.group(2))
cpu_s, peak_kib = (float(x) for x in (open(threads + ".cpu").read().split() + ["0"])[:2])
shares = {}
for line in open(threads):
    comm, share = line.split()
    key = re.sub(r"-\d+$", "", comm)
    shares[key] = round(shares.get(key, 0) + float(share), 1)
print(json.dumps({"tokenizer": name, "round": int(rnd), "mode": mode, "threads": int(n),
    "tokens": tokens, "wall_s": wall, "first_window_s": first,
    "tokens_per_s": round(tokens / wall), "after_first_window_tokens_per_s": round(tokens / (wall - first)),
    "cpu_share_percent": shares, "cores_busy": round(cpu_s / wall, 2) if cpu_s else None,
    "peak_rss_mb": round(peak_kib / 1024) if peak_kib else None}))
PY
        tail -n 1 "$RESULTS"
      done
    done
  done
done

python3 - "$RESULTS" "$THREADS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
counts = [int(t) for t in sys.argv[2].split()]
base, last = counts[0], counts[-1]
print(f"| tokenizer | scaling by | {base} → {last}: whole run | median of rounds' ratios | after the first window | CPU share at {last} (reader / shards' reading / tokenizers / pipeline / token shards / their sha256 / stream chain / engine build / input hashing) | cores busy at {last} | against copies (rounds' ratios) |")
print("|---|---|---|---|---|---|---|---|")
def median(rs, key): return statistics.median(r[key] for r in rs)
for name in dict.fromkeys(r["tokenizer"] for r in rows):
    ratios = {}
    for mode in ("threads", "cores", "copies"):
        at = {n: [r for r in rows if r["tokenizer"] == name and r["mode"] == mode and r["threads"] == n] for n in counts}
        if not at[base] or not at[last]: continue
        whole = median(at[last], "tokens_per_s") / median(at[base], "tokens_per_s")
        steady = median(at[last], "after_first_window_tokens_per_s") / median(at[base], "after_first_window_tokens_per_s")
        by_round = {r["round"]: {} for r in at[base]}
        for n in (base, last):
            for r in at[n]: by_round.setdefault(r["round"], {})[n] = r["tokens_per_s"]
        rounds = statistics.median(v[last] / v[base] for v in by_round.values() if base in v and last in v)
        shares = [r["cpu_share_percent"] for r in at[last] if r["cpu_share_percent"]]
        split = " / ".join(f'{statistics.median(s.get(k, 0) for s in shares):.0f} %'
                           for k in ("dsprep-reader", "dsprep-decode", "dsprep-tokenize", "dsprep",
                                     "dsprep-shards", "dsprep-filehash", "dsprep-chain", "dsprep-engine",
                                     "dsprep-hash-inp")) if shares else "—"
        busy = [r["cores_busy"] for r in at[last] if r.get("cores_busy")]
        busy = f"{statistics.median(busy):.1f}" if busy else "—"
        ratios[mode] = rounds
        against = f"{ratios['cores'] / rounds:.2f}" if mode == "copies" and "cores" in ratios else "—"
        print(f"| {name} | {mode} | {whole:.2f}× | {rounds:.2f}× | {steady:.2f}× | {split} | {busy} | {against} |")
PY
