#!/usr/bin/env bash
# `pip install dsprep` as a Python user would: build the one wheel (the release `dsprep` binary
# and the `dsprep_client` package, daemon/pyproject.toml, maturin), install it into a fresh venv,
# pack the quickstart with the installed command, then run the Python client's tests against the
# installed binary and package (the torch and export tests need the extras venv and run in
# test.sh). Prints the wheel's size and the time from `pip install` to the first packed output.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="$(mktemp -d /tmp/dsprep-wheel.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
CACHE="${DSPREP_CACHE:-$HOME/.cache/dsprep-ci}"
MATURIN_VENV="$CACHE/venv-maturin-1.16.0"
if [ ! -f "$MATURIN_VENV/.complete" ]; then
  rm -rf "$MATURIN_VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$MATURIN_VENV"
  "$MATURIN_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin==1.16.0"
  touch "$MATURIN_VENV/.complete"
fi

# The wheel's binary is built with the release profile (daemon/pyproject.toml), as `pip install
# ./daemon` builds it. DSPREP_WHEEL_PROFILE=dev (set by .ci/run) packs the same files around the
# dev build of `dsprep` that test.sh has just made (a no-op here): the packaging is what this tests,
# and a cold release build costs CI 10-13 minutes on 2 cores.
profile="${DSPREP_WHEEL_PROFILE:-release}"
started=$(date +%s)
"$MATURIN_VENV/bin/maturin" build --quiet --profile "$profile" -m "$ROOT/daemon/Cargo.toml" -o "$WORK/wheels"
wheel=$(ls "$WORK"/wheels/dsprep-*.whl)
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB, $profile profile, built in $(( $(date +%s) - started )) s"

python3 -m venv "$WORK/venv"
installed=$(date +%s.%N)
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" pytest
"$WORK/venv/bin/dsprep" pack --recipe "$ROOT/config/quickstart.toml" --out "$WORK/packed" --quiet >/dev/null
echo "pip install to the first packed output: $(python3 -c "import time; print(f'{time.time() - $installed:.1f}')") s"
"$WORK/venv/bin/dsprep" verify "$WORK/packed"
"$WORK/venv/bin/python" -c "import dsprep_client, sys; assert dsprep_client.__file__.startswith('$WORK/venv'), dsprep_client.__file__"

# The client's tests against what the wheel installed: its binary and its package. The tests of
# the optional packages (torch, datasets, megatron-core, torchtitan, transformers) run in
# test.sh's extras venv; this venv has none of them, so they are left out here (and skip, not
# fail, if one is added without being left out).
cd "$WORK"
DSPREP_REQUIRE_EXTRAS=0 DSPREP_BIN="$WORK/venv/bin/dsprep" "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$ROOT/client/python/tests" --ignore="$ROOT/client/python/tests/test_torch.py" \
  --ignore="$ROOT/client/python/tests/test_export.py" \
  --ignore="$ROOT/client/python/tests/test_torchtitan.py" \
  --ignore="$ROOT/client/python/tests/test_hf_trainer.py" \
  --ignore="$ROOT/client/python/tests/test_loss_reports.py"
