#!/usr/bin/env bash
# The Linux aarch64 wheel (Grace Hopper, Graviton and other Arm nodes), cross-built here: maturin
# with zig as the C/C++ cross compiler and linker (`ziglang` from PyPI, so no cross toolchain
# package is needed), for manylinux2014 (glibc 2.17). Then the wheel's own `dsprep` binary packs
# the quickstart under qemu-user, and the result must be byte-identical to the x86_64 pack of the
# same recipe: the stream does not depend on the machine. Not part of .ci/run (a second cold
# release build, ~15 minutes on 2 cores); run by hand before a release:
#
#   client/python/wheel-aarch64.sh [OUT_DIR]      # the wheel is left in OUT_DIR (default: dist/)
#
# Needs: rustup's aarch64-unknown-linux-gnu target (added if missing), and for the check
# Debian's qemu-user and libc6-arm64-cross (installed with apt-get when run as root).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/dist}"
TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu
CACHE="${DSPREP_CACHE:-$HOME/.cache/dsprep-ci}"
VENV="$CACHE/venv-maturin-1.16.0-zig-0.17.1"
WORK="$(mktemp -d /tmp/dsprep-aarch64.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

if ! rustup target list --installed | grep -qx "$TARGET"; then
  rustup target add "$TARGET"
fi
if ! command -v qemu-aarch64 >/dev/null || [ ! -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user libc6-arm64-cross libstdc++6-arm64-cross >/dev/null
  else
    echo "error: the check runs the aarch64 binary under qemu: install Debian's qemu-user and" \
         "libc6-arm64-cross (as root: apt-get install qemu-user libc6-arm64-cross libstdc++6-arm64-cross)" >&2
    exit 1
  fi
fi
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin==1.16.0" "ziglang==0.17.1"
  touch "$VENV/.complete"
fi

started=$(date +%s)
# maturin finds zig through the venv's `python -m ziglang`.
PATH="$VENV/bin:$PATH" maturin build --quiet --release --zig --target "$TARGET" \
  --compatibility manylinux2014 -m "$ROOT/daemon/Cargo.toml" -o "$WORK/wheels"
wheel=$(ls "$WORK"/wheels/dsprep-*aarch64*.whl)
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB, built in $(( $(date +%s) - started )) s"

# The wheel's binary, run under qemu: it must pack the same bytes as this machine's build.
"$VENV/bin/python" -m zipfile -e "$wheel" "$WORK/unpacked"
bin="$WORK/unpacked/dsprep-0.1.0.data/scripts/dsprep"
chmod +x "$bin"
file "$bin" | grep -q 'ARM aarch64' || { echo "error: $bin is not an aarch64 executable" >&2; exit 1; }
qemu-aarch64 -L "$SYSROOT" "$bin" pack --recipe "$ROOT/config/quickstart.toml" --out "$WORK/packed-aarch64" --quiet >/dev/null
qemu-aarch64 -L "$SYSROOT" "$bin" verify "$WORK/packed-aarch64"
cargo run --quiet --release --manifest-path "$ROOT/Cargo.toml" -p dsprep -- \
  pack --recipe "$ROOT/config/quickstart.toml" --out "$WORK/packed-x86_64" --quiet >/dev/null
diff -r "$WORK/packed-x86_64" "$WORK/packed-aarch64"
echo "aarch64: the quickstart packed under qemu is byte-identical to the x86_64 pack"
mkdir -p "$OUT"
cp "$wheel" "$OUT/"
echo "wrote $OUT/$(basename "$wheel")"
