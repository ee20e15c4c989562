# Sourced by scripts/test.sh and scripts/demo.sh (after scripts/env.sh): pf_build TESTS [ARGS...]
# configures and builds libprefill in $BUILD_DIR (Ninja when installed; TESTS = ON builds the C
# tests too; ARGS go to CMake), printing each build step as it happens; the whole output goes to
# $BUILD_DIR/build.log. PF_CUDA_ARCH (e.g. 90a, or "80;90a") picks the GPU architectures; unset,
# the CMake default (80 and 90a) stands. On failure it prints the error (the compiler's, from the
# first failing step) and returns 1.
pf_build() {
  local tests=$1; shift
  local log="$BUILD_DIR/build.log" t0=$SECONDS opts=$- rc
  local -a gen=() arch=() st
  command -v ninja >/dev/null && gen=(-G Ninja)
  [ -n "${PF_CUDA_ARCH:-}" ] && arch=(-DCMAKE_CUDA_ARCHITECTURES="$PF_CUDA_ARCH")
  mkdir -p "$BUILD_DIR"
  echo "libprefill: configuring in $BUILD_DIR"
  if ! cmake -S . -B "$BUILD_DIR" "${gen[@]}" "${arch[@]}" -DPF_BUILD_TESTS="$tests" "$@" \
       > "$log" 2>&1; then
    echo "libprefill: CMake failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
  local archs
  archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null)
  echo "libprefill: building for CUDA architectures ${archs:-?} (PF_CUDA_ARCH sets them); a first" \
       "build takes a few minutes, longer on few cores; full output in $log"
  set +e
  cmake --build "$BUILD_DIR" -j "$(nproc)" 2>&1 | tee -a "$log" \
    | grep --line-buffered -E '^\[ *[0-9]+(/[0-9]+|%)\]'
  st=("${PIPESTATUS[@]}")
  [[ $opts == *e* ]] && set -e
  rc=${st[0]}
  if [ "$rc" != 0 ]; then
    echo "libprefill: the build failed (exit $rc); the error, from $log:" >&2
    # from the first failing step (ninja: "FAILED:", make: "Error N", a compiler's "error:") on
    if grep -qE '^FAILED: |error:|Error [0-9]+' "$log"; then
      awk '/^FAILED: |error:|Error [0-9]+/ { on = 1 } on { print; if (++n >= 60) exit }' "$log" >&2
      echo "(the whole output: $log)" >&2
    else
      tail -n 40 "$log" >&2
    fi
    return 1
  fi
  if grep -q "no work to do" "$log"; then
    echo "libprefill: up to date ($BUILD_DIR/libprefill.so)"
  else
    echo "libprefill: built in $((SECONDS - t0)) s ($BUILD_DIR/libprefill.so)"
  fi
}
