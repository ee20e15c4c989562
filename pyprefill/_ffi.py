"""Declares libprefill's C API to cffi (ABI mode) and loads the library.

The declarations are read from include/prefill.h itself (the region between the PF_CDEF
markers), so there is no second copy to drift. The library is found inside the installed
package (importlib.resources), or at $PYPREFILL_LIBRARY, or in a source checkout's build dir.
"""
from __future__ import annotations

import os
import re
from importlib.resources import files
from pathlib import Path

from cffi import FFI

_PKG = files(__package__)
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


def header_path() -> Path:
    installed = Path(str(_PKG / "include" / "prefill.h"))   # put there by the wheel build
    if installed.is_file():
        return installed
    return _SOURCE_ROOT / "include" / "prefill.h"           # a source checkout


def cdef_source(header: str) -> str:
    """The declarations between the PF_CDEF markers, with the PF_API macro removed."""
    try:
        body = header.split("PF_CDEF_BEGIN", 1)[1].split("*/", 1)[1]
        body = body.split("/* PF_CDEF_END */", 1)[0]
    except IndexError as exc:
        raise ImportError("prefill.h lacks the PF_CDEF_BEGIN/PF_CDEF_END markers") from exc
    return body.replace("PF_API", "")


HEADER = header_path().read_text()
HEADER_VERSION = tuple(int(re.search(rf"#define PF_VERSION_{p} (\d+)", HEADER).group(1))
                       for p in ("MAJOR", "MINOR", "PATCH"))
ffi = FFI()
ffi.cdef(cdef_source(HEADER))


def _candidates() -> list[str]:
    out = []
    env = os.environ.get("PYPREFILL_LIBRARY")
    if env:
        return [env]                                          # explicit: nothing else
    out.append(str(_PKG / "lib" / "libprefill.so"))
    out.append(str(_PKG / "lib" / "libprefill.so.0"))
    # a source checkout: the most recently built library first (older build dirs may be stale)
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:          # a dangling symlink: tried last, reported by _load
            return 0.0
    builds = sorted(_SOURCE_ROOT.glob("build*/libprefill.so"), key=mtime, reverse=True)
    out.extend(str(b) for b in builds)
    return out


def _load():
    errors = []
    for path in _candidates():
        if not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            return ffi.dlopen(path)
        except OSError as exc:                                # keep every reason, like cairocffi
            errors.append(f"{path}: {exc}")
    raise ImportError("cannot load libprefill (set PYPREFILL_LIBRARY or pip install pyprefill):\n  "
                      + "\n  ".join(errors))


lib = _load()
_lib_version = lib.pf_version()
if _lib_version // 10000 != HEADER_VERSION[0]:
    raise ImportError(f"libprefill version {_lib_version} does not match the header's major "
                      f"version {HEADER_VERSION[0]} ({header_path()})")
