#!/usr/bin/env bash
# The main job: build libprefill, then run `pyprefill demo` (a synthetic model's prefill checked
# against the NumPy reference; without a GPU it says so and runs the reference alone).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
. scripts/env.sh
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DPF_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" >/dev/null
PYPREFILL_LIBRARY="$PWD/$BUILD_DIR/libprefill.so" PYTHONPATH="$PWD" "$PYTHON" -m pyprefill demo "$@"
