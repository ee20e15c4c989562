#!/usr/bin/env bash
# Build libprefill and run the whole test suite (ctest: C tests + pytest on this build).
# GPU tests run where a CUDA device is present and skip with a reason elsewhere.
#   bash scripts/test.sh            (BUILD_DIR, PF_CUDA_ARCH and PYTHON may be set)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
. scripts/env.sh
ARCH_ARGS=()
[ -n "${PF_CUDA_ARCH:-}" ] && ARCH_ARGS=(-DCMAKE_CUDA_ARCHITECTURES="$PF_CUDA_ARCH")
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" "${ARCH_ARGS[@]}" -DPF_BUILD_TESTS=ON \
      -DPython3_EXECUTABLE="$PYTHON" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
