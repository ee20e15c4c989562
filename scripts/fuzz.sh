#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer, clang, no
# GPU) of every byte the library parses: the GGUF reader and model validation (fuzz_gguf) and
# the session-state check and copy plan of a restore (fuzz_state), the checks and step cutting
# of a batch plan (fuzz_batch), the tensor-parallel plan of a model over ranks (fuzz_shard), and
# the prefix cache's bookkeeping under sequences of operations (fuzz_prefix). Sources: tests/fuzz/.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     default 60 s for each of: gguf state batch shard prefix
# Builds the targets under $FUZZ_DIR (default build-fuzz), replays the committed regressions
# (tests/fuzz/regressions/TARGET), then fuzzes each target for SECONDS from the committed seeds
# (tests/fuzz/corpus/TARGET, never modified) and the corpus grown by earlier runs
# ($FUZZ_DIR/corpus/TARGET, kept between runs). Prints one table row per target (executions,
# coverage cov: and features ft: from libFuzzer's final stats) and exits non-zero on any
# finding: a crash, a leak, undefined behaviour, a timeout, an out-of-memory or a contract
# violation (the targets abort on those). Findings land in $FUZZ_DIR/artifacts/TARGET/.
# FUZZ_JOBS=2 runs the targets side by side; FUZZ_CXX picks the compiler (default clang++);
# FUZZ_ARGS adds libFuzzer options (e.g. -use_value_profile=1).
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} = 0 ] && TARGETS=(gguf state batch shard prefix)
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
CXX=${FUZZ_CXX:-clang++}
JOBS=${FUZZ_JOBS:-1}
HOST_SOURCES=(cuda/plan/gguf.cpp cuda/plan/model_plan.cpp cuda/plan/qtype.cpp cuda/base/error.cpp cuda/plan/session_state.cpp cuda/plan/batch_plan.cpp
              cuda/plan/shard_plan.cpp cuda/plan/page_pool.cpp cuda/plan/prefix_tree.cpp)
FLAGS=(-std=c++17 -Wall -Wextra -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -Iinclude -Icuda)
declare -A MAX_LEN=([gguf]=131072 [state]=4096 [batch]=4096 [shard]=64 [prefix]=2048)
declare -A PARSES=([gguf]="cuda/plan/gguf.cpp cuda/plan/model_plan.cpp cuda/plan/qtype.cpp" [state]="cuda/plan/session_state.cpp"
                   [batch]="cuda/plan/batch_plan.cpp" [shard]="cuda/plan/shard_plan.cpp"
                   [prefix]="cuda/plan/page_pool.cpp cuda/plan/prefix_tree.cpp")

if ! command -v "$CXX" >/dev/null; then
  echo "fuzz.sh: $CXX not found (libFuzzer needs clang)" >&2
  exit 2
fi
mkdir -p "$FUZZ_DIR"
for t in "${TARGETS[@]}"; do
  [ -f "tests/fuzz/fuzz_$t.cpp" ] || { echo "fuzz.sh: unknown target $t" >&2; exit 2; }
  "$CXX" "${FLAGS[@]}" "tests/fuzz/fuzz_$t.cpp" "${HOST_SOURCES[@]}" -o "$FUZZ_DIR/fuzz_$t" \
    || { echo "fuzz.sh: building fuzz_$t failed" >&2; exit 2; }
done

# libFuzzer options shared by every run: a finding is any of these
COMMON=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_target() {
  local t=$1 bin=$FUZZ_DIR/fuzz_$t log=$FUZZ_DIR/fuzz_$t.log
  local art=$FUZZ_DIR/artifacts/$t/ corpus=$FUZZ_DIR/corpus/$t
  mkdir -p "$art" "$corpus"
  local dict=() regs=(tests/fuzz/regressions/"$t"/*)
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  {
    if [ -e "${regs[0]}" ]; then   # every committed finding must stay fixed
      echo "== replaying ${#regs[@]} regression input(s)"
      "$bin" "${COMMON[@]}" "${regs[@]}" 2>&1 || { echo "REGRESSION"; return 1; }
    fi
    echo "== fuzzing for $SECS s"
    "$bin" "${COMMON[@]}" "${dict[@]}" -max_len="${MAX_LEN[$t]:-65536}" -max_total_time="$SECS" \
      -artifact_prefix="$art" ${FUZZ_ARGS:-} "$corpus" "tests/fuzz/corpus/$t" 2>&1
  } > "$log" 2>&1
}

declare -A RC
pids=()
for t in "${TARGETS[@]}"; do
  if [ "$JOBS" -gt 1 ]; then
    run_target "$t" & pids+=("$t:$!")
  else
    run_target "$t"; RC[$t]=$?
  fi
done
for p in "${pids[@]}"; do wait "${p#*:}"; RC[${p%%:*}]=$?; done

status=0
echo "| target | seconds | executions | exec/s | cov | ft | corpus | findings |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for t in "${TARGETS[@]}"; do
  log=$FUZZ_DIR/fuzz_$t.log
  execs=$(awk '/^stat::number_of_executed_units:/ {v = $2} END {print v}' "$log")
  rate=$(awk '/^stat::average_exec_per_sec:/ {v = $2} END {print v}' "$log")
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
  cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.*corp: ([0-9]+\/[0-9a-zA-Z]+).*/\1/p' <<<"$last")
  found=$(ls "$FUZZ_DIR/artifacts/$t/" 2>/dev/null | grep -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
  if [ "${RC[$t]}" != 0 ] || [ -n "$found" ]; then
    status=1
    what=$(grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|contract violated|REGRESSION' "$log" | cut -c1-120)
    found="FOUND (rc ${RC[$t]}): ${what:-see $log} ${found//$'\n'/ }"
  else
    found=none
  fi
  echo "| $t | $SECS | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $found |"
done
[ $status = 0 ] || echo "fuzz.sh: findings above; logs in $FUZZ_DIR/fuzz_<target>.log" >&2

# FUZZ_COVERAGE=1: line coverage of the parsing sources by each target's whole corpus (seeds,
# grown corpus, regressions), from a source-based coverage build of the replay harness.
if [ "${FUZZ_COVERAGE:-0}" = 1 ] && command -v llvm-profdata >/dev/null && command -v llvm-cov >/dev/null; then
  for t in "${TARGETS[@]}"; do
    bin=$FUZZ_DIR/cover_$t
    "$CXX" -std=c++17 -O0 -fprofile-instr-generate -fcoverage-mapping -Iinclude -Icuda \
      "tests/fuzz/fuzz_$t.cpp" tests/fuzz/replay_main.cpp "${HOST_SOURCES[@]}" -o "$bin" || continue
    LLVM_PROFILE_FILE=$FUZZ_DIR/cover_$t.profraw "$bin" "$FUZZ_DIR/corpus/$t" "tests/fuzz/corpus/$t" \
      "tests/fuzz/regressions/$t" >/dev/null 2>&1
    llvm-profdata merge -o "$FUZZ_DIR/cover_$t.profdata" "$FUZZ_DIR/cover_$t.profraw"
    echo "line coverage of fuzz_$t's corpus:"
    llvm-cov report "$bin" -instr-profile="$FUZZ_DIR/cover_$t.profdata" ${PARSES[$t]} \
      | awk 'NR == 1 || /\.cpp/ || /^TOTAL/'
  done
fi
exit $status
