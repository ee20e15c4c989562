#!/usr/bin/env bash
# The main job: build libprefill (each step shown; on failure the compiler's error), then run
# `pyprefill demo` (a synthetic model's prefill checked against the NumPy reference; without a
# GPU it says why and runs the reference alone). Arguments go to the demo (`--length N`,
# `--seed S`, `--dir DIR`).
#   bash scripts/demo.sh            (BUILD_DIR, PF_CUDA_ARCH and PYTHON may be set)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
. scripts/env.sh
. scripts/build.sh
pf_build OFF
PYPREFILL_LIBRARY="$PWD/$BUILD_DIR/libprefill.so" PYTHONPATH="$PWD" "$PYTHON" -m pyprefill demo "$@"
