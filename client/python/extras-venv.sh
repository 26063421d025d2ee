#!/usr/bin/env bash
# A venv with the Python tests' optional packages (torch and torchdata for the torch adapter,
# datasets and megatron-core for the export tests), made once per machine and reused by later runs: outside the
# clone (DSPREP_CACHE, default ~/.cache/dsprep-ci), keyed by the pinned versions. Prints the venv's path. About 2 minutes and 5.4 GB the first time (PyPI's
# Linux torch wheel carries the CUDA libraries; the tests use the CPU).
set -euo pipefail
TORCH=2.15.0
TORCHDATA=0.11.0
DATASETS=5.2.0
MEGATRON_CORE=0.16.1
CACHE="${DSPREP_CACHE:-$HOME/.cache/dsprep-ci}"
VENV="$CACHE/venv-torch-$TORCH-torchdata-$TORCHDATA-datasets-$DATASETS-mcore-$MEGATRON_CORE"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "torch==$TORCH" "torchdata==$TORCHDATA" "datasets==$DATASETS" \
    "megatron-core==$MEGATRON_CORE" numpy >&2
  touch "$VENV/.complete"   # only a finished install is reused
fi
echo "$VENV"
