#!/usr/bin/env bash
# `pip install .` on a fresh virtual environment: scikit-build-core builds libprefill and puts it
# (and prefill.h) inside the package; then the console script runs the smoke check and the
# package validates a GGUF without a device. PF_WHEEL_ARCH (default 90a) keeps CI's build short.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip
"$tmp/venv/bin/python" -m pip install -q . -C cmake.define.CMAKE_CUDA_ARCHITECTURES="${PF_WHEEL_ARCH:-90a}" \
  -C build-dir="$tmp/build"
cd "$tmp"   # away from the source tree: the installed package must stand alone
"$tmp/venv/bin/pyprefill"
"$tmp/venv/bin/python" - "$OLDPWD/tests/data/qwen35_hv2.mix.gguf" <<'PY'
import sys
import pyprefill, pyprefill.model
from importlib.resources import files
lib = files("pyprefill") / "lib" / "libprefill.so"
assert lib.is_file(), f"{lib} missing from the installed package"
info = pyprefill.model.inspect(sys.argv[1])
assert info["arch"] == "qwen35" and info["n_layer"] == 4, info
print(f"pip install . ok: {lib}, {info['arch']} model validated")
PY
