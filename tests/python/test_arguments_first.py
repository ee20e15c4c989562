"""Model.load, Context, Session and Batch check every argument (and Model.load the file, with the
library's reader) before they ask for a device: on a machine without one, a wrong argument is
named as such, never reported as "no CUDA device" (CPU)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from pyprefill import errors

pytest.importorskip("pyprefill.model", reason="libprefill not loadable")
from pyprefill.core import Context, device_count  # noqa: E402
from pyprefill.model import Batch, Model, Session  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
TINY = os.path.join(DATA, "qwen3_tiny.mix.gguf")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("path, cls, words", [
    (None, errors.InvalidArgumentError, "path: expected a path (str or os.PathLike), got NoneType"),
    (123, errors.InvalidArgumentError, "path: expected a path (str or os.PathLike), got int 123"),
    ("", errors.InvalidArgumentError, "path: an empty path"),
    ("MISSING", errors.GGUFError, "cannot open: No such file or directory"),
    ("DIR", errors.GGUFError, "not a regular file (a directory)"),
    ("TEXT", errors.GGUFFormatError, 'not a GGUF file (bad magic "just"'),
], ids=["None", "int", "empty", "missing", "directory", "text"])
def test_model_load_names_the_path_fault_before_the_device(path, cls, words, tmp_path):
    (tmp_path / "notes.txt").write_text("just some text here")
    path = {"MISSING": str(tmp_path / "none.gguf"), "DIR": str(tmp_path),
            "TEXT": str(tmp_path / "notes.txt")}.get(path, path)
    with pytest.raises(cls) as info:
        Model.load(path)
    assert words in str(info.value), str(info.value)
    assert not isinstance(info.value, errors.NoDeviceError)


def test_model_load_of_a_fifo_returns_at_once(tmp_path):
    """The library refuses a FIFO before opening it (open() would wait for a writer forever);
    in a child process, so that a regression fails here instead of hanging the suite."""
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    code = ("import sys, pyprefill\n"
            "try:\n    pyprefill.Model.load(sys.argv[1])\n"
            "except pyprefill.GGUFError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.stdout.startswith("GGUFError PF_STATUS_IO_ERROR: ") and "not a regular file (a FIFO)" in out.stdout, \
        out.stdout + out.stderr


@pytest.mark.parametrize("kw, words", [
    (dict(device=-1), "device: -1 is less than 0"),
    (dict(device="0"), "device: '0' is not an int (got str)"),
    (dict(device=True), "device: True is not an int (got bool)"),
    (dict(device=0.0), "device: 0.0 is not an int (got float)"),
    (dict(gemm="f64"), "gemm: unknown name 'f64'"),
    (dict(prewarm_headroom=-1), "prewarm_headroom: -1 is less than 0"),
    (dict(tuning={"no_such_field": 1}), "tuning: unknown field 'no_such_field'"),
    (dict(context="ctx"), "context: expected a pyprefill.Context, got str"),
], ids=lambda v: str(v) if isinstance(v, str) else "-".join(map(str, v)))
def test_model_load_names_the_argument_before_the_device(kw, words):
    with pytest.raises(errors.InvalidArgumentError) as info:
        Model.load(TINY, **kw)
    assert words in str(info.value), str(info.value)


def test_model_load_asks_for_the_device_last():
    if device_count():
        pytest.skip("a GPU is present: the load succeeds (test_engine covers it)")
    with pytest.raises(errors.NoDeviceError, match="no CUDA device"):
        Model.load(TINY, progress=False)


@pytest.mark.parametrize("kw, words", [
    (dict(device=-1), "device: -1 is less than 0"),
    (dict(device="0"), "device: '0' is not an int (got str)"),
    (dict(device=1.0), "device: 1.0 is not an int"),
    (dict(workspace_bytes=-5), "workspace_bytes: -5 is less than 0"),
    (dict(memory_budget=2.5), "memory_budget: 2.5 is not an int"),
    (dict(memory_budget=-1), "memory_budget: -1 is less than 0"),
])
def test_context_names_the_argument_before_the_device(kw, words):
    with pytest.raises(errors.InvalidArgumentError) as info:
        Context(**kw)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("kw, words", [
    (dict(max_tokens=0), "max_tokens: 0 is less than 1"),
    (dict(max_tokens=2.5), "max_tokens: 2.5 is not an int"),
    (dict(max_tokens=2**31), "max_tokens: 2147483648 is more than 2147483647"),
    (dict(chunk=-1), "chunk: -1 is less than 0"),
    (dict(kv="f8"), "kv: 'f8' is not one of"),
    (dict(kv=["f16"]), "kv: ['f16'] is not one of"),
    (dict(attention="fast"), "attention: 'fast' is not one of"),
    (dict(gemm="bf16"), "gemm: unknown name 'bf16'"),
    (dict(snapshot_every=-64), "snapshot_every: -64 is less than 0"),
    (dict(snapshot_slots="2"), "snapshot_slots: '2' is not an int"),
    (dict(tuning=[("gemm_lt", "off")]), "tuning: expected a dict"),
    (dict(), "model: expected a pyprefill.Model, got NoneType"),
])
def test_session_checks_its_options_then_its_model(kw, words):
    """The options first (each named), then the model: the C API's order (scalars, then handles)."""
    with pytest.raises(errors.InvalidArgumentError) as info:
        Session(None, **kw)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("kw, words", [
    (dict(max_items=0), "max_items: 0 is less than 1"),
    (dict(step_tokens=-1), "step_tokens: -1 is less than 0"),
    (dict(max_tokens=1.5), "max_tokens: 1.5 is not an int"),
    (dict(max_context=-4096), "max_context: -4096 is less than 0"),
    (dict(kv="int4"), "kv: 'int4' is not one of"),
    (dict(), "model: expected a pyprefill.Model, got int"),
])
def test_batch_checks_its_options_then_its_model(kw, words):
    with pytest.raises(errors.InvalidArgumentError) as info:
        Batch(7, **kw)
    assert words in str(info.value), str(info.value)


def test_a_closed_model_is_named():
    m = Model.__new__(Model)            # never opened: its handle is None, as after close()
    with pytest.raises(errors.InvalidArgumentError, match="Model is closed"):
        Session(m)
    with pytest.raises(errors.InvalidArgumentError, match="Model is closed"):
        Batch(m)


def test_inspect_names_a_bad_path():
    from pyprefill.model import inspect
    with pytest.raises(errors.InvalidArgumentError, match="path: expected a path"):
        inspect(None)
    assert inspect(np.str_(TINY))["arch"] == "qwen3"          # a str subclass is a path
