#!/usr/bin/env bash
# The one command for a GPU machine: build, run every test (GPU tests included, none may skip
# for want of a device), compute-sanitizer memcheck on the kernel tests, then the benchmarks.
# Logs go under $OUT (or ./out); a short summary table is printed last.
#   bash scripts/device-check.sh [--no-bench] [--no-sanitizer]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BENCH=1; SANITIZE=1
for a in "$@"; do
  case "$a" in --no-bench) BENCH=0 ;; --no-sanitizer) SANITIZE=0 ;; esac
done
if ls .whl/*.whl >/dev/null 2>&1; then   # cffi, pycparser, gguf: missing from the GPU image
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export BUILD_DIR=${BUILD_DIR:-/tmp/pf-build} PF_CUDA_ARCH=${PF_CUDA_ARCH:-90}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

declare -A RESULT
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; bash scripts/test.sh -j 1 -V; } 2>&1 | tee "$OUT/test.log"
RESULT[tests]=$([ "${PIPESTATUS[0]}" = 0 ] && echo pass || echo FAIL)
RESULT[test_time]=$(( $(date +%s) - t0 ))
export PYPREFILL_LIBRARY=$BUILD_DIR/libprefill.so PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
skips=$(grep -cE "SKIPPED \[" "$OUT/test.log" || true)
RESULT[skipped]=$skips

python3 -m pyprefill demo 2>&1 | tee "$OUT/demo.log"
RESULT[demo]=$([ "${PIPESTATUS[0]}" = 0 ] && echo ok || echo FAIL)

if [ $SANITIZE = 1 ] && command -v compute-sanitizer >/dev/null; then
  # memcheck over the kernel tests (bounded in time: a timeout is reported, not hidden)
  timeout "${SANITIZER_TIMEOUT:-900}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m pytest -q -x -m gpu -p no:cacheprovider ${SANITIZER_TESTS:-tests/python/test_kernel_*.py} \
    > "$OUT/memcheck.log" 2>&1
  rc=$?
  RESULT[memcheck]=$([ $rc = 0 ] && echo clean || { [ $rc = 124 ] && echo "timed out" || echo "FAIL (rc $rc)"; })
  tail -n 5 "$OUT/memcheck.log"
else
  RESULT[memcheck]=skipped
fi

if [ $BENCH = 1 ]; then
  python3 -m pyprefill bench all --out "$OUT" --plot "$OUT/bench_model.png" 2>&1 | tee "$OUT/bench.log"
  RESULT[bench]=$([ "${PIPESTATUS[0]}" = 0 ] && echo ok || echo FAIL)
fi

echo
echo "| check | result |"
echo "|---|---|"
for k in "${!RESULT[@]}"; do echo "| $k | ${RESULT[$k]} |"; done | sort
grep -E "^[0-9]+% tests passed|tests failed|passed|failed" "$OUT/test.log" | tail -n 4
grep -E "SKIPPED \[" "$OUT/test.log" | sed 's/^[0-9]*: //' | head -n 10
