#!/usr/bin/env bash
# Packs .devbench/, what tests/bench/device_scaling.sh needs on the `device` machine, which
# reaches no network and takes at most 64 MiB of ignored files with a call (`carry`):
#   - bin/NAME.xz: each build to measure, stripped (default: the release dsprep, as "dsprep");
#   - corpus/: the bench corpus rewritten with zstd level 19, the same row groups (100 MB of
#     text in ~21 MB; zstd decodes dearer than snappy, so parquet's share of the CPU rises
#     by about a point);
#   - tokcache/: the fetched Llama 3 and Llama 2 tokenizer.json files, xz-compressed.
#
#   bash tests/bench/device_bundle.sh CORPUS [NAME=PATH ...]
#
# CORPUS: ../shared/bench/peer/make_corpus.py --total-mb 100 --shards-per-source 8 --seed 0
# PYTHON: an interpreter with pyarrow (the peer venv's); default python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="$(cd "$1" && pwd)"; shift
BUNDLE="$ROOT/.devbench"
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/corpus" "$BUNDLE/tokcache"

builds=("$@")
if [ ${#builds[@]} = 0 ]; then
  (cd "$ROOT" && cargo build --release -p dsprep --quiet)
  builds=("dsprep=${CARGO_TARGET_DIR:-$ROOT/target}/release/dsprep")
fi
for spec in "${builds[@]}"; do
  name="${spec%%=*}"
  strip -o "$BUNDLE/bin/$name" "${spec#*=}"
  xz -T2 -6 "$BUNDLE/bin/$name"
done

"${PYTHON:-python3}" - "$CORPUS" "$BUNDLE/corpus" <<'PY'
import pathlib, sys
import pyarrow.parquet as pq
src, dst = map(pathlib.Path, sys.argv[1:])
for path in sorted(src.glob("*/*.parquet")):
    out = dst / path.parent.name / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    file = pq.ParquetFile(path)
    with pq.ParquetWriter(out, file.schema_arrow, compression="zstd", compression_level=19) as w:
        for g in range(file.num_row_groups):
            w.write_table(file.read_row_group(g))
PY

for name in llama3 llama2; do
  path="$("$ROOT/config/tokenizers/fetch.sh" "$name")"
  dir="$BUNDLE/tokcache/$(basename "$(dirname "$path")")"
  mkdir -p "$dir"
  xz -T2 -6 -c "$path" > "$dir/tokenizer.json.xz"
done
du -sh "$BUNDLE"
