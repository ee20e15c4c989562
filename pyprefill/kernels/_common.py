"""What every kernel-level wrapper family shares: the View operand (pf_view), argument checks of
contexts, views, arrays and ints, device buffers for the NumPy-level calls, and the filling of
size-prefixed argument structs (pf_<op>_args).

Naming (one scheme for every family): the buffer-level wrapper is the C entry minus ``pf_``
(``pf_rms_norm`` -> ``rms_norm``) and takes Buffers / Views; the NumPy-level convenience is the
same name + ``_np`` (arrays in, outputs poisoned with NaN before the kernel runs, arrays out).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._errors import _check
from .._ffi import ffi, lib
from ..core import Buffer, Context, Weight, as_carray
from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class View:
    """A pf_view: element (r, c) is element off + r*ld + c of `buf`, counted in the operand's
    dtype (float32 unless the op says otherwise). ld = 0 means the op's natural width; vector
    operands ignore ld."""

    buf: Buffer
    off: int = 0
    ld: int = 0


def as_view(arg, name: str) -> View:
    """A View from a View or a Buffer (offset 0, natural ld); InvalidArgumentError naming `name`
    otherwise."""
    if isinstance(arg, View):
        if not isinstance(arg.buf, Buffer):
            raise InvalidArgumentError(f"{name}: View.buf must be a Buffer, got {type(arg.buf).__name__}")
        return arg
    if isinstance(arg, Buffer):
        return View(arg)
    raise InvalidArgumentError(f"{name}: expected a pyprefill Buffer or View, got {type(arg).__name__}")


def c_view(arg, name: str):
    """A new ``pf_view *`` for a View or Buffer argument (the Buffer stays alive through `arg`)."""
    v = as_view(arg, name)
    return ffi.new("pf_view *", {"buf": v.buf.ptr, "off": int(v.off), "ld": int(v.ld)})


def set_view(field, arg, name: str) -> None:
    """Fill a pf_view field of an argument struct from a View or Buffer argument."""
    v = as_view(arg, name)
    field.buf, field.off, field.ld = v.buf.ptr, int(v.off), int(v.ld)


def new_args(ctype: str):
    """A ``pf_<op>_args *`` filled by its pf_<op>_args_init (struct_size and the defaults)."""
    a = ffi.new(f"{ctype} *")
    _check(getattr(lib, f"{ctype}_init")(a, ffi.sizeof(ctype)))
    return a


def _handle_arg(obj, cls, name: str):
    if not isinstance(obj, cls):
        raise InvalidArgumentError(f"{name}: expected a pyprefill {cls.__name__}, got {type(obj).__name__}")
    return obj


def ctx_arg(ctx) -> Context:
    return _handle_arg(ctx, Context, "ctx")


def weight_arg(w, name: str = "weight") -> Weight:
    return _handle_arg(w, Weight, name)


def buffer_arg(b, name: str) -> Buffer:
    """A whole-buffer operand (a KV cache, attention's q and out)."""
    return _handle_arg(b, Buffer, name)


def int_arg(name: str, value, *, minimum: int | None = 0) -> int:
    """An int (numpy integers too, not bool) >= minimum (None: any)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}: expected an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name}: {value} must be >= {minimum}")
    return int(value)


def array_arg(arr, name: str, *, ndim: int, dtypes=(np.float32,), cols: int | None = None,
              min_cols: int | None = None) -> np.ndarray:
    """Check a NumPy argument (type, dtype, dimensions, columns) and return it C-contiguous."""
    if not isinstance(arr, np.ndarray):
        raise InvalidArgumentError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    allowed = [np.dtype(d) for d in dtypes]
    if arr.dtype not in allowed:
        want = " or ".join(d.name for d in allowed)
        raise InvalidArgumentError(f"{name}: expected dtype {want}, got {arr.dtype} (shape {arr.shape})")
    if arr.ndim != ndim:
        raise InvalidArgumentError(f"{name}: expected a {ndim}-D array, got shape {arr.shape}")
    if cols is not None and arr.shape[-1] != cols:
        raise InvalidArgumentError(f"{name}: expected {cols} columns, got shape {arr.shape}")
    if min_cols is not None and arr.shape[-1] < min_cols:
        raise InvalidArgumentError(f"{name}: shape {arr.shape} has fewer than {min_cols} columns")
    return np.ascontiguousarray(arr)


def same_rows(name: str, arr: np.ndarray, rows: int, other: str) -> None:
    if arr.shape[0] != rows:
        raise InvalidArgumentError(f"{name}: {arr.shape[0]} rows, {other} has {rows}")


def head_width(n_heads: int, head_dim: int, head_stride: int) -> int:
    return (n_heads - 1) * (head_stride or head_dim) + head_dim


def check_heads_fit(x: np.ndarray, name: str, n_heads: int, head_dim: int, head_stride: int,
                    col0: int) -> None:
    """The heads (n_heads of head_dim at head_stride from column col0) fit in x's rows."""
    if n_heads < 1 or head_dim < 1 or col0 < 0:
        raise InvalidArgumentError(f"{name}: n_heads={n_heads}, head_dim={head_dim}, col0={col0}")
    need = col0 + head_width(n_heads, head_dim, head_stride)
    if x.shape[1] < need:
        raise InvalidArgumentError(f"{name}: rows of {x.shape[1]} columns cannot hold {n_heads} "
                                   f"heads of {head_dim} at stride {head_stride or head_dim} from "
                                   f"column {col0} (need {need}); shape {x.shape}")


# ----------------------------------------------------------------------------- device buffers


def upload(ctx: Context, arr: np.ndarray) -> Buffer:
    """A new device buffer holding `arr` (at least 4 bytes, so that empty arrays work too)."""
    as_carray(arr, "arr")
    buf = Buffer(ctx_arg(ctx), max(arr.nbytes, 4))
    if arr.nbytes:
        buf.upload(arr)
    return buf


def poisoned(ctx: Context, nbytes: int) -> Buffer:
    """A new device buffer of `nbytes` bytes (at least 4), every byte 0xFF (float NaN)."""
    buf = Buffer(ctx_arg(ctx), max(int(nbytes), 4))
    buf.poison()
    return buf


def out_buffer(ctx: Context, shape, dtype, init: np.ndarray | None, name: str) -> Buffer:
    """An output buffer of `shape` (`dtype`): poisoned with NaN, or holding `init` (which must
    have that shape and dtype)."""
    if init is None:
        return poisoned(ctx, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    if init.shape != tuple(shape) or init.dtype != np.dtype(dtype):
        raise InvalidArgumentError(f"{name}: expected {np.dtype(dtype).name} of shape {tuple(shape)}, "
                                   f"got {init.dtype} of shape {init.shape}")
    return upload(ctx, np.ascontiguousarray(init))


def download(ctx: Context, buf: Buffer, dtype, shape) -> np.ndarray:
    """The buffer's first elements as an array, after the context's stream has finished."""
    ctx.synchronize()
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype)
    return buf.download(dtype, shape)


__all__ = ["View", "as_view", "c_view", "set_view", "new_args", "ctx_arg", "weight_arg", "buffer_arg",
           "int_arg", "array_arg", "same_rows", "head_width", "check_heads_fit", "upload",
           "poisoned", "out_buffer", "download"]
