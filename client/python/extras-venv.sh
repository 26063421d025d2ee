#!/usr/bin/env bash
# A venv with the Python tests' optional packages (torch and torchdata for the torch adapter,
# datasets and megatron-core for the export tests, torchtitan and transformers for the trainer
# adapters' tests), made once per machine and reused by later runs: outside the
# clone (DSPREP_CACHE, default ~/.cache/dsprep-ci), keyed by the pinned versions. Prints the venv's path. About 2 minutes and 5.4 GB the first time (PyPI's
# Linux torch wheel carries the CUDA libraries; the tests use the CPU).
set -euo pipefail
TORCH=2.15.0
TORCHDATA=0.11.0
DATASETS=5.2.0
MEGATRON_CORE=0.16.1
TORCHTITAN=0.3.0
TRANSFORMERS=5.24.0
CACHE="${DSPREP_CACHE:-$HOME/.cache/dsprep-ci}"
VENV="$CACHE/venv-torch-$TORCH-torchdata-$TORCHDATA-datasets-$DATASETS-mcore-$MEGATRON_CORE-titan-$TORCHTITAN-tf-$TRANSFORMERS"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "torch==$TORCH" "torchdata==$TORCHDATA" "datasets==$DATASETS" \
    "megatron-core==$MEGATRON_CORE" "transformers==$TRANSFORMERS" accelerate==1.15.0 numpy >&2
  # torchtitan pins datasets<4.8, which the export tests' datasets 5.x breaks; torchtitan itself
  # (its dataloader, config and trainer modules, which the tests import) needs only these, so it
  # goes in without its declared dependencies (wandb is imported only when enabled).
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "torchtitan==$TORCHTITAN" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    tyro==1.0.17 spmd_types==0.2.3 tensorboard==2.21.0 torch_checkpointing==0.1.1 einops >&2
  "$VENV/bin/python" -c "import torchtitan.trainer, torchtitan.components.dataloader, transformers.trainer" >&2
  touch "$VENV/.complete"   # only a finished install is reused
fi
echo "$VENV"
