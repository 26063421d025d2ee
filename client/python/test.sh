#!/usr/bin/env bash
# The Python client's tests (client/python/tests) against the real `dsprep` binary: creates or
# reuses a venv (DSPREP_VENV, default <repo>/.venv-ci), installs the package and pytest into it,
# builds the daemon (`-p dsprep`: after `cargo test --workspace` that recompiles the dependencies
# whose features the workspace's dev-dependencies widen, ~4 min on 2 cores), and runs pytest.
# Extra arguments go to pytest. pytest's "no tests collected" (exit 5) is a failure here.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${DSPREP_VENV:-$ROOT/.venv-ci}"

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$ROOT/client/python" pytest
rm -rf "$ROOT/client/python/build" "$ROOT"/client/python/src/*.egg-info   # setuptools' in-tree leftovers

(cd "$ROOT" && cargo build --quiet --locked -p dsprep)
export DSPREP_BIN="${DSPREP_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/dsprep}"

status=0
"$VENV/bin/python" -m pytest "$ROOT/client/python/tests" "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "error: pytest collected no tests in client/python/tests" >&2
  exit 1
fi
exit "$status"
