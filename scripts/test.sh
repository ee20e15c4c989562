#!/usr/bin/env bash
# Build libprefill and run the whole test suite (ctest: the C tests, then pytest on this build),
# then a summary: ctest's and pytest's counts and every skip reason with its count. GPU tests run
# where a CUDA device is present and skip with the reason elsewhere. Each build step and each
# test shows as it happens (pytest's progress too: ctest -V, its preamble filtered out).
#   bash scripts/test.sh [CTEST ARGS...]   (BUILD_DIR, PF_CUDA_ARCH and PYTHON may be set)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
. scripts/env.sh
. scripts/build.sh
pf_build ON -DPython3_EXECUTABLE="$PYTHON"
rm -f "$BUILD_DIR/Testing/Temporary/LastTest.log"   # the summary reads this run's, not an old one
set +e
echo "ctest: $(ctest --test-dir "$BUILD_DIR" -N "$@" | sed -n 's/^Total Tests: //p') tests; pytest" \
     "prints a row of dots per ~70 tests (a minute or two on 2 cores without a GPU)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -V "$@" 2>&1 | tee "$BUILD_DIR/ctest.log" \
  | awk -f scripts/ctest-progress.awk
rc=${PIPESTATUS[0]}
set -e
echo
echo "== summary ($BUILD_DIR/ctest.log, $BUILD_DIR/Testing/Temporary/LastTest.log)"
"$PYTHON" scripts/test_summary.py "$BUILD_DIR" || true
exit "$rc"
