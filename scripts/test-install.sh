#!/usr/bin/env bash
# Installs a built tree into a temporary prefix, builds tests/consumer (a C program outside the
# tree) against it with find_package(prefill), and runs it.
#   bash scripts/test-install.sh BUILD_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: test-install.sh BUILD_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
if command -v nm >/dev/null; then
  bad=$(nm -D --defined-only "$tmp"/prefix/lib*/libprefill.so | awk '{print $3}' | grep -v '^pf_' || true)
  [ -z "$bad" ] || { echo "non-pf_ symbols exported: $bad"; exit 1; }
  echo "installed libprefill exports only pf_ symbols"
fi
