#!/usr/bin/env bash
# The engines in use (ENGINE=auto, the default: HF tokenizers 1.x or dsprep's own, as a pack
# chooses; ENGINE=fast: dsprep's own engine) against HF `tokenizers` 0.23 at volume: on text this machine already holds (every
# message catalogue's translations, some 200 languages and scripts, tests/bench/mo_texts.py;
# the Python standard library; the sources in cargo's registry) and on 50 MB of seeded random
# text (tests/bench/random_texts.py, SEED default 0). Each tokenizer encodes each folder with
# HF 0.23 and with the engine, chosen from the file and from its engine-cache entry
# (mixers/tokenize/examples/engine_diff.rs), once in 4 KB documents and once a file per document (the
# registry: 4 KB documents only, its first REGISTRY_MB); one line per run goes to RESULTS, and
# every differing document, shrunk, to RESULTS.d/.
#
#   bash tests/bench/engine_soak.sh RESULTS [TOKENIZERS...]   # default: all thirteen
#
# TEXTS (default: the four above, where present) overrides the folders; THREADS (default 2).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RESULTS="$(realpath -m "$1")"; shift
NAMES="${*:-gpt2 qwen3 llama3 llama2 cl100k o200k deepseek_v3 gemma gemma3 yi tekken command_r claude}"
THREADS="${THREADS:-2}"; REGISTRY_MB="${REGISTRY_MB:-100}"; ENGINE="${ENGINE:-auto}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
# shellcheck source=tests/bench/peer_recipe.sh
source "$ROOT/tests/bench/peer_recipe.sh"

REGISTRY="${CARGO_HOME:-$HOME/.cargo}/registry/src"
if [[ -z "${TEXTS:-}" ]]; then
  python3 "$ROOT/tests/bench/mo_texts.py" "$WORK/catalogues" /usr/share/locale >&2
  python3 "$ROOT/tests/bench/random_texts.py" "$WORK/random" 50 "${SEED:-0}" >&2
  TEXTS="$WORK/catalogues $WORK/random"
  for dir in "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" "$REGISTRY"; do
    [[ -d "$dir" ]] && TEXTS="$TEXTS $dir"
  done
fi
(cd "$ROOT" && cargo build --release -q -p dsprep-tokenize --example engine_diff)
BIN="$ROOT/target/release/examples/engine_diff"
mkdir -p "$RESULTS.d"; : > "$RESULTS"

status=0
for doc_bytes in 4096 0; do
  for name in $NAMES; do
    bench_tokenizer "$name"
    for text in $TEXTS; do
      max=1000000
      if [[ "$text" == "$REGISTRY" ]]; then
        [[ "$doc_bytes" == 0 ]] && continue
        max="$REGISTRY_MB"
      fi
      out="$RESULTS.d/$name.$doc_bytes.$(basename "$text")"
      "$BIN" --tokenizer "$TOK" --engine "$ENGINE" --text "$text" --threads "$THREADS" --doc-bytes "$doc_bytes" \
        --max-mb "$max" --report 5 > "$out" || status=1
      python3 - "$name" "$text" "$out" >> "$RESULTS" <<'PY'
import json, sys
name, text, out = sys.argv[1:]
summary = json.loads(open(out).read().splitlines()[-1])
summary.update(name=name, text=text)
del summary["engine"]
print(json.dumps(summary))
PY
      tail -1 "$RESULTS" >&2
    done
  done
done
exit "$status"
