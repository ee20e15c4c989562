"""The header's cdef region parses with cffi as it is, and the library exports exactly the
functions it declares (CPU: needs the built library, not a GPU)."""
import re
import subprocess

import pytest
from cffi import FFI

from pyprefill import _ffi

DECLARED = sorted(set(re.findall(r"PF_API\s+[\w\s\*]+?\b(pf_\w+)\s*\(", _ffi.HEADER)))


def test_cdef_region_parses():
    ffi = FFI()
    ffi.cdef(_ffi.cdef_source(_ffi.HEADER))
    assert ffi.sizeof("pf_context_options") > 0


def test_header_declares_functions():
    assert len(DECLARED) >= 20, DECLARED
    assert "pf_last_error" in DECLARED and "pf_context_create" in DECLARED


def test_cdef_region_has_no_preprocessor_lines():
    body = _ffi.cdef_source(_ffi.HEADER)
    assert not [l for l in body.splitlines() if l.lstrip().startswith("#")]


@pytest.mark.parametrize("name", DECLARED)
def test_declared_function_is_exported(name):
    assert getattr(_ffi.lib, name) is not None


def _library_path() -> str:
    import os
    return os.environ.get("PYPREFILL_LIBRARY") or _ffi._candidates()[0]


def test_library_exports_only_declared_pf_symbols():
    path = _library_path()
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"nm failed on {path}: {out.stderr}")
    symbols = sorted(line.split()[-1] for line in out.stdout.splitlines() if line.strip())
    assert symbols, f"no dynamic symbols in {path}"
    assert symbols == DECLARED, (
        f"exported but not declared: {sorted(set(symbols) - set(DECLARED))}; "
        f"declared but not exported: {sorted(set(DECLARED) - set(symbols))}")
