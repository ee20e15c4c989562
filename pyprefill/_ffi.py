"""Declares libprefill's C API to cffi (ABI mode) and loads the library.

The declarations are read from include/prefill.h itself (the region between the PF_CDEF
markers), so there is no second copy to drift. The library is found inside the installed
package (importlib.resources), or at $PYPREFILL_LIBRARY, or in a source checkout's build dir.
"""
from __future__ import annotations

import numbers
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


INSTALL_HINT = ("install: `pip install .` in the source checkout (the README's command), or build "
                "with `bash scripts/test.sh` (then build/libprefill.so is found); "
                "PYPREFILL_LIBRARY=/path/to/libprefill.so names the file to load")


def load_error(attempts: list[tuple[str, str | None]]) -> str:
    """The whole reason libprefill did not load, from (path, dlopen error or None when the file
    does not exist) per candidate: the first real load failure leads (a missing cuBLAS, a wrong
    architecture), then where else it looked and how to install. Never shortened."""
    failed = [(p, why) for p, why in attempts if why is not None]
    if failed:
        path, why = failed[0]
        lines = [f"cannot load libprefill: {path}: {why}"]
        lines += [f"  also failed: {p}: {w}" for p, w in failed[1:]]
        if "libcublas" in why:
            lines.append("  libcublas.so.13 and libcublasLt.so.13 are cuBLAS 13: from the CUDA 13 "
                         "toolkit (lib64/) or `pip install nvidia-cublas`; put their directory on "
                         "LD_LIBRARY_PATH")
    else:
        lines = ["cannot load libprefill: no libprefill.so found"]
    missing = [p for p, why in attempts if why is None]
    if missing:
        lines.append(f"  not found: {', '.join(missing)}")
    lines.append(f"  {INSTALL_HINT}")
    return "\n".join(lines)


def _load():
    attempts: list[tuple[str, str | None]] = []
    for path in _candidates():
        if not os.path.exists(path):
            attempts.append((path, None))
            continue
        try:
            return ffi.dlopen(path)
        except OSError as exc:                                # keep every reason, like cairocffi
            attempts.append((path, str(exc)))
    raise ImportError(load_error(attempts))


lib = _load()
_lib_version = lib.pf_version()
# 0.x: a minor version may change the API (0.2 changed the kernel level), so 0.x must match x.
_lib_mm = (_lib_version // 10000, _lib_version // 100 % 100)
if _lib_mm[0] != HEADER_VERSION[0] or (HEADER_VERSION[0] == 0 and _lib_mm[1] != HEADER_VERSION[1]):
    raise ImportError(f"libprefill version {_lib_mm[0]}.{_lib_mm[1]} does not match the header's "
                      f"{HEADER_VERSION[0]}.{HEADER_VERSION[1]} ({header_path()})")


def enum_map(ctype: str, prefix: str, *, lower: bool = True) -> dict[str, int]:
    """Names of a C enum of the header, read from the declarations: {suffix after `prefix`
    (lower-cased unless lower=False): value}, in value order. E.g. enum_map("pf_gemm_leg",
    "PF_GEMM_") == {"default": 0, "auto": 1, "f32": 2, "f16": 3, "int8": 4}."""
    items = sorted(ffi.typeof(ctype).relements.items(), key=lambda kv: kv[1])
    return {(n[len(prefix):].lower() if lower else n[len(prefix):]): int(v)
            for n, v in items if n.startswith(prefix)}


def enum_value(value, names: dict[str, int], arg: str, *, any_int: bool = False) -> int:
    """A C enum value from one of `names` (any case) or an int: one of the values, or any int
    when any_int (the library then judges it). InvalidArgumentError naming `arg` otherwise."""
    from .errors import InvalidArgumentError
    if isinstance(value, str):
        for name, v in names.items():
            if name.lower() == value.lower():
                return v
        raise InvalidArgumentError(f"{arg}: unknown name {value!r} (known: {', '.join(names)})")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and (any_int or int(value) in names.values()):
        return int(value)
    raise InvalidArgumentError(f"{arg}: {value!r} is neither a name ({', '.join(names)}) nor one "
                               f"of the values {sorted(set(names.values()))}")
