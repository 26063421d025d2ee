#!/usr/bin/env bash
# The tokenize stage's engines side by side, per core (issue 49): dsprep's fast path
# (`--engine fast`), HF tokenizers 1.x (`hf1`), HF tokenizers 0.23 (`hf`) and, with a peer venv,
# GigaToken, on one pinned core, each run a new process (a fresh tokenizer object, cold caches),
# start-up excluded (tokenize_bench and gigatoken_stage.py time encoding only), the engines taken
# in turn within each round, ROUNDS rounds (default 3); medians. One JSON line per run goes to
# OUT/runs.jsonl (with the load average when it started), then OUT/table.md.
#
#   bash tests/bench/engines.sh OUT [TOKENIZERS...]
#
# TOKENIZERS: any of gpt2 qwen3 llama3 llama2 gemma gemma3 yi deepseek_v3 cl100k o200k command_r
#             claude tekken (default: gpt2 qwen3 llama3; all but gpt2 and qwen3 are fetched by
#             config/tokenizers/fetch.sh).
# Texts (tests/bench/engine_texts.py, TEXT_MB per kind, default 8): english (every real web row
#   the repository holds, ~2.7 MB), code (Python's standard library), cjk (Japanese and Chinese
#   man pages: apt-get install manpages-ja manpages-zh), european (German, French, Spanish man
#   pages: manpages-de manpages-fr manpages-es), and mix, the seed mix (by bytes: English web
#   prose 60 %, code 20 %, math 5 %, CJK 7.5 %, European 7.5 %). Nothing repeats.
# CORE (default 1): the core every run is pinned to. PEER_VENV: a venv made by
#   ../shared/bench/peer/setup.sh VENV --with-gigatoken; without it GigaToken is left out.
# ENGINES (default "fast hf1 hf", plus gigatoken with PEER_VENV): auto (the engine a pack runs),
# fast (dsprep's own), hf1, hf, gigatoken, and before: BEFORE_BENCH, a tokenize_bench built from
# an earlier commit, run with `--engine fast` (the fast path as it was there). KINDS (default all
# five texts).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$(realpath -m "$1")"; shift
NAMES="${*:-gpt2 qwen3 llama3}"
CORE="${CORE:-1}"; ROUNDS="${ROUNDS:-3}"; TEXT_MB="${TEXT_MB:-8}"
ENGINES="${ENGINES:-fast hf1 hf${PEER_VENV:+ gigatoken}}"
mkdir -p "$OUT"
RESULTS="$OUT/runs.jsonl"

if [ -z "${DSPREP_TOKENIZE_BENCH:-}" ]; then
  (cd "$ROOT" && cargo build --release -p dsprep-tokenize --example tokenize_bench --quiet)
fi
BENCH="${DSPREP_TOKENIZE_BENCH:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/tokenize_bench}"

# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"
TEXTS="${TEXTS:-$OUT/texts}"  # TEXTS: a folder engine_texts.py already filled
if [ ! -f "$TEXTS/mix.json.gz" ]; then
  python3 "$ROOT/tests/bench/engine_texts.py" "$TEXTS" --mb "$TEXT_MB" | tee "$OUT/texts.txt"
fi

# tokenize_bench counts one EOS per document; GigaToken's line counts the text's ids only. Both
# are written as text_tokens (ids of the text alone) beside the run's labels and the load.
tag() {
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
name, text, rnd, engine, load = sys.argv[1:]
eos = r["docs"] if engine != "gigatoken" else 0
r.update(tokenizer=name, text=text, round=int(rnd), engine=engine, load=load,
         text_tokens=r["tokens"] - eos, text_tokens_per_s=(r["tokens"] - eos) / r["seconds"])
print(json.dumps(r))' "$@"
}

run() {  # run ENGINE TEXT
  case "$1" in
    before)  # dsprep's engine as a build before this one ran it (BEFORE_BENCH, `--engine fast`)
      taskset -c "$CORE" "$BEFORE_BENCH" --tokenizer "$TOK" --text-dir "$TEXTS/$2.json.gz" \
        --engine fast --threads 1 --max-mb 1000 ;;
    gigatoken)
      RAYON_NUM_THREADS=1 taskset -c "$CORE" "$PEER_VENV/bin/python" \
        "$ROOT/tests/bench/gigatoken_stage.py" "$TOK" "$TEXTS/$2.json.gz" ;;
    *)
      taskset -c "$CORE" "$BENCH" --tokenizer "$TOK" --text-dir "$TEXTS/$2.json.gz" \
        --engine "$1" --threads 1 --max-mb 1000 ;;
  esac
}

for name in $NAMES; do
  bench_tokenizer "$name"
  for text in ${KINDS:-english code cjk european mix}; do
    for round in $(seq "$ROUNDS"); do
      for engine in $ENGINES; do
        load="$(cut -d' ' -f1-3 /proc/loadavg)"
        # An engine that does not take the file (GigaToken 0.10 refuses NFKC: claude) is left out.
        if ! line="$(run "$engine" "$text")"; then
          echo "skipped: $engine does not take $name" >&2
          continue
        fi
        tag "$name" "$text" "$round" "$engine" "$load" <<<"$line" >> "$RESULTS"
        tail -n 1 "$RESULTS" | cut -c1-200
      done
    done
  done
done

python3 "$ROOT/tests/bench/engines_table.py" "$RESULTS" | tee "$OUT/table.md"
