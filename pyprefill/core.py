"""Owner classes over the core C API: Context, Buffer, Weight.

Each owns one handle; `close()` frees it now (and is idempotent), the context-manager form
closes on exit, and an ffi.gc destructor is the safety net. A Buffer or Weight keeps its
Context alive, and closing a Context first closes what it still owns.
"""
from __future__ import annotations

import weakref

import numpy as np

from ._checks import INT32_MAX, int_arg
from ._errors import _check
from ._ffi import enum_map, enum_value, ffi, lib
from .errors import InvalidArgumentError, PrefillError

QTYPES = enum_map("pf_qtype", "PF_QTYPE_", lower=False)   # {"F32": 0, "F16": 1, "Q4_0": 2, ...}


def device_count() -> int:
    n = ffi.new("int32_t *")
    _check(lib.pf_device_count(n))
    return int(n[0])


def version() -> str:
    v = lib.pf_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def qtype_id(qtype) -> int:
    """A GGML type id from a name ("Q4_K") or an int (the library judges unknown ids)."""
    return enum_value(qtype, QTYPES, "qtype", any_int=True)


def matrix_bytes(qtype, n: int, k: int) -> int:
    out = ffi.new("size_t *")
    _check(lib.pf_qtype_matrix_bytes(qtype_id(qtype), n, k, out))
    return int(out[0])


def as_carray(arr, name: str, dtype=None, *, writable: bool = False):
    """Check that `arr` is a C-contiguous NumPy array (of `dtype` if given) and return a cffi
    view of it that keeps the array alive. Errors name the argument and what was received."""
    if not isinstance(arr, np.ndarray):
        raise InvalidArgumentError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise InvalidArgumentError(f"{name}: expected dtype {np.dtype(dtype)}, got {arr.dtype} "
                                   f"(shape {arr.shape})")
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError(f"{name}: array of shape {arr.shape} is not C-contiguous "
                                   "(use np.ascontiguousarray)")
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(f"{name}: array is read-only")
    return ffi.from_buffer("char[]", arr, require_writable=writable)


class _Owner:
    """One C handle with an idempotent close()."""

    _ptr = None

    def _adopt(self, ptr, destroy, parent=None):
        """Own `ptr`; `destroy` runs on close() or when the handle is collected. The destructor
        holds `parent` (the context, the model) so that garbage collection can never destroy
        a parent before its child, whatever order it clears attributes or cycles in."""
        if parent is None:
            self._ptr = ffi.gc(ptr, destroy)
        else:
            self._ptr = ffi.gc(ptr, lambda p, _parent=parent: destroy(p))

    @property
    def ptr(self):
        if self._ptr is None:
            raise InvalidArgumentError(f"{type(self).__name__} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        if self._ptr is not None:
            ffi.release(self._ptr)           # runs the destroy function now
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Context(_Owner):
    """One CUDA device, one stream, cuBLAS handles and a workspace.

    >>> with Context(device=0) as ctx:
    ...     buf = ctx.upload(np.arange(10, dtype=np.float32))
    """

    def __init__(self, device: int = 0, *, workspace_bytes: int = 0, poison: bool = False,
                 memory_budget: int = 0):
        """poison: every device allocation starts as 0xFF bytes (NaN), so that an element a
        kernel leaves unwritten shows (PF_CONTEXT_POISON; for tests). memory_budget: the most
        device bytes the context may hold (0: the device's memory), to run as a smaller card
        would: the prewarm caches what fits in it and streams the rest."""
        opts = ffi.new("pf_context_options *")                  # every argument before the device
        _check(lib.pf_context_options_init(opts, ffi.sizeof("pf_context_options")))
        opts.device = int_arg(device, "device", 0, INT32_MAX)
        opts.workspace_bytes = int_arg(workspace_bytes, "workspace_bytes", 0, 2**63 - 1)
        opts.memory_budget_bytes = int_arg(memory_budget, "memory_budget", 0, 2**63 - 1)   # bytes
        opts.flags = lib.PF_CONTEXT_POISON if poison else 0
        out = ffi.new("pf_context **")
        _check(lib.pf_context_create(out, opts))
        self._adopt(out[0], lib.pf_context_destroy)
        self.device = device
        self._children: weakref.WeakSet = weakref.WeakSet()

    def close(self) -> None:
        if self._ptr is None:
            return
        children, self._children = list(self._children), weakref.WeakSet()
        for child in children:                  # buffers, weights, models go before their context
            child.close()
        super().close()

    def synchronize(self) -> None:
        _check(lib.pf_context_synchronize(self.ptr))

    def set_tuning(self, tuning: dict | None = None, **fields) -> None:
        """The tuning of this context (pyprefill.tuning; for measurement and tests): used by
        the kernel-level calls on it from now on, and inherited by the models and sessions
        created on it afterwards. Replaces the previous tuning; no argument = all defaults."""
        from . import tuning as _tuning
        _check(lib.pf_context_set_tuning(self.ptr, _tuning.new({**(tuning or {}), **fields})))

    def tuning(self) -> dict:
        """The context's non-default tuning fields."""
        from . import tuning as _tuning
        t = ffi.new("pf_tuning *")
        _check(lib.pf_context_get_tuning(self.ptr, t))
        return _tuning.as_dict(t)

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes of the device now; free counts what closed sessions gave back to
        the context's session pool (kept for the next session or fork)."""
        f, t = ffi.new("size_t *"), ffi.new("size_t *")
        _check(lib.pf_context_memory(self.ptr, f, t))
        return int(f[0]), int(t[0])

    def allocated(self) -> int:
        """Device bytes held by this context (buffers, weights, caches, scratch)."""
        out = ffi.new("size_t *")
        _check(lib.pf_context_allocated(self.ptr, out))
        return int(out[0])

    def buffer(self, nbytes: int) -> "Buffer":
        return Buffer(self, nbytes)

    def upload(self, arr: np.ndarray) -> "Buffer":
        """A new buffer holding a copy of `arr` (any dtype, C-contiguous)."""
        as_carray(arr, "arr")
        buf = Buffer(self, max(arr.nbytes, 1))
        buf.upload(arr)
        return buf

    def weight(self, qtype, n: int, k: int, data: np.ndarray) -> "Weight":
        return Weight(self, qtype, n, k, data)


class Buffer(_Owner):
    """Device memory of `nbytes` bytes (contents undefined until written)."""

    def __init__(self, ctx: Context, nbytes: int):
        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise InvalidArgumentError(f"nbytes: must be a positive int, got {nbytes!r}")
        out = ffi.new("pf_buffer **")
        _check(lib.pf_buffer_create(out, ctx.ptr, int(nbytes)))
        self._adopt(out[0], lib.pf_buffer_destroy, ctx)
        self.ctx = ctx
        self.nbytes = int(nbytes)
        ctx._children.add(self)

    def upload(self, arr: np.ndarray, offset: int = 0) -> None:
        view = as_carray(arr, "arr")
        _check(lib.pf_buffer_upload(self.ptr, offset, view, arr.nbytes))

    def download(self, dtype, shape, offset: int = 0) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        view = as_carray(out, "out", writable=True)
        _check(lib.pf_buffer_download(self.ptr, offset, view, out.nbytes))
        return out

    def download_into(self, out: np.ndarray, offset: int = 0) -> np.ndarray:
        view = as_carray(out, "out", writable=True)
        _check(lib.pf_buffer_download(self.ptr, offset, view, out.nbytes))
        return out

    def fill(self, value: int, nbytes: int | None = None, offset: int = 0) -> None:
        """Set bytes to `value` (0xFF makes float32 NaN: poison before a kernel writes)."""
        _check(lib.pf_buffer_fill(self.ptr, offset, value, self.nbytes - offset if nbytes is None else nbytes))

    def poison(self) -> None:
        self.fill(0xFF)

    def copy_from(self, src: "Buffer", nbytes: int | None = None, offset: int = 0,
                  src_offset: int = 0) -> None:
        """Device-to-device copy of nbytes (default: all of src from src_offset) into this
        buffer at offset; asynchronous on the context's stream."""
        if not isinstance(src, Buffer):
            raise InvalidArgumentError(f"src: expected a Buffer, got {type(src).__name__}")
        n = src.nbytes - src_offset if nbytes is None else nbytes
        _check(lib.pf_buffer_copy(self.ptr, offset, src.ptr, src_offset, n))


class Weight(_Owner):
    """An [n][k] matrix of raw GGUF blocks on the device."""

    def __init__(self, ctx: Context, qtype, n: int, k: int, data: np.ndarray):
        q = qtype_id(qtype)
        view = as_carray(data, "data")
        out = ffi.new("pf_weight **")
        _check(lib.pf_weight_create(out, ctx.ptr, q, n, k, view, data.nbytes))
        self._adopt(out[0], lib.pf_weight_destroy, ctx)
        self.ctx = ctx
        self.qtype, self.n, self.k = q, int(n), int(k)
        ctx._children.add(self)

    @classmethod
    def _borrowed(cls, ptr, ctx: Context, owner) -> "Weight":
        """A weight the library owns (a model's matrix): never destroyed from Python; `owner`
        (the model) is kept alive with it."""
        w = cls.__new__(cls)
        w._ptr, w._owner, w.ctx = ptr, owner, ctx
        i = ffi.new("pf_weight_info *")
        _check(lib.pf_weight_info_get(ptr, i))
        w.qtype, w.n, w.k = int(i.qtype), int(i.n), int(i.k)
        return w

    def close(self) -> None:
        if getattr(self, "_owner", None) is not None:   # borrowed: forget it, the owner frees it
            self._ptr = None
            self._owner = None
            return
        super().close()

    def info(self) -> dict:
        i = ffi.new("pf_weight_info *")
        _check(lib.pf_weight_info_get(self.ptr, i))
        return {"qtype": i.qtype, "n": i.n, "k": i.k, "bytes": i.bytes, "f16_bytes": i.f16_bytes}


__all__ = ["Context", "Buffer", "Weight", "PrefillError", "device_count", "version",
           "matrix_bytes", "qtype_id", "QTYPES", "as_carray"]


def lib_header_version() -> tuple[int, int, int]:
    from ._ffi import HEADER_VERSION
    return HEADER_VERSION
