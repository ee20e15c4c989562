"""Row kernels (RMSNorm, per-head RMSNorm, partial NEOX RoPE, SwiGLU, residual add, sigmoid
output gate) over float32 row-major activations.

Two levels:
- buffer level (``*_rows``): device Buffers in and out, for callers that keep data on the
  device. A matrix argument is a :class:`View` (buffer, element offset, row stride) or a plain
  Buffer (offset 0, the op's natural row stride);
- NumPy level: arrays in, arrays out (upload, poison the output with NaN, run, download), used
  by the tests. In-place ops return the whole updated array.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._errors import _check
from .._ffi import lib
from ..core import Buffer, Context, as_carray
from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class View:
    """An fp32 [rows][ld] view into `buf`: row r, column c is float element off + r*ld + c.
    ld = 0 means the op's natural width (a packed matrix)."""

    buf: Buffer
    off: int = 0
    ld: int = 0


def as_view(arg, name: str) -> View:
    """A View from a View or a Buffer; InvalidArgumentError naming `name` otherwise."""
    if isinstance(arg, View):
        if not isinstance(arg.buf, Buffer):
            raise InvalidArgumentError(f"{name}: View.buf must be a Buffer, got {type(arg.buf).__name__}")
        return arg
    if isinstance(arg, Buffer):
        return View(arg)
    raise InvalidArgumentError(f"{name}: expected a pyprefill Buffer or View, got {type(arg).__name__}")


def _ctx(ctx) -> Context:
    if not isinstance(ctx, Context):
        raise InvalidArgumentError(f"ctx: expected a pyprefill Context, got {type(ctx).__name__}")
    return ctx


def f32_matrix(arr, name: str, *, cols: int | None = None, ndim: int = 2) -> np.ndarray:
    """Check that `arr` is a C-contiguous float32 array of `ndim` dims (and `cols` columns)."""
    as_carray(arr, name, np.float32)
    if arr.ndim != ndim:
        raise InvalidArgumentError(f"{name}: expected a {ndim}-D array, got shape {arr.shape}")
    if cols is not None and arr.shape[-1] != cols:
        raise InvalidArgumentError(f"{name}: expected {cols} columns, got shape {arr.shape}")
    return arr


def upload(ctx: Context, arr: np.ndarray) -> Buffer:
    """A new device buffer holding `arr` (at least 4 bytes)."""
    buf = Buffer(_ctx(ctx), max(arr.nbytes, 4))
    if arr.nbytes:
        buf.upload(arr)
    return buf


def poisoned(ctx: Context, nbytes: int) -> Buffer:
    """A new device buffer of `nbytes` bytes (at least 4), every float NaN."""
    buf = Buffer(_ctx(ctx), max(nbytes, 4))
    buf.poison()
    return buf


# ----------------------------------------------------------------------------- buffer level

def rms_norm_rows(ctx: Context, x, w, y, rows: int, cols: int, eps: float) -> None:
    """y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w over `cols` columns (y may be x)."""
    x, w, y = as_view(x, "x"), as_view(w, "w"), as_view(y, "y")
    _check(lib.pf_rms_norm_rows(_ctx(ctx).ptr, x.buf.ptr, x.off, x.ld, w.buf.ptr, w.off,
                                y.buf.ptr, y.off, y.ld, rows, cols, eps))


def head_rms_norm_rows(ctx: Context, x, w, rows: int, n_heads: int, head_dim: int, eps: float,
                       head_stride: int = 0) -> None:
    """Per-head RMSNorm in place; head h at column h*head_stride (0 = head_dim)."""
    x, w = as_view(x, "x"), as_view(w, "w")
    _check(lib.pf_head_rms_norm_rows(_ctx(ctx).ptr, x.buf.ptr, x.off, x.ld, rows, n_heads,
                                     head_stride, head_dim, w.buf.ptr, w.off, eps))


def rope_neox_rows(ctx: Context, x, rows: int, n_heads: int, head_dim: int, rot_dim: int,
                   pos0: int, base: float, head_stride: int = 0) -> None:
    """Partial NEOX RoPE in place; row t at position pos0 + t."""
    x = as_view(x, "x")
    _check(lib.pf_rope_neox_rows(_ctx(ctx).ptr, x.buf.ptr, x.off, x.ld, rows, n_heads,
                                 head_stride, head_dim, rot_dim, pos0, base))


def swiglu_rows(ctx: Context, g, u, out, rows: int, cols: int) -> None:
    """out = silu(g) * u."""
    g, u, out = as_view(g, "g"), as_view(u, "u"), as_view(out, "out")
    _check(lib.pf_swiglu_rows(_ctx(ctx).ptr, g.buf.ptr, g.off, g.ld, u.buf.ptr, u.off, u.ld,
                              out.buf.ptr, out.off, out.ld, rows, cols))


def add_rows(ctx: Context, y, x, rows: int, cols: int) -> None:
    """y += x."""
    y, x = as_view(y, "y"), as_view(x, "x")
    _check(lib.pf_add_rows(_ctx(ctx).ptr, y.buf.ptr, y.off, y.ld, x.buf.ptr, x.off, x.ld, rows,
                           cols))


def sigmoid_gate_rows(ctx: Context, o, gate, rows: int, n_heads: int, head_dim: int,
                      gate_head_stride: int = 0) -> None:
    """o[r, h*D + i] *= sigmoid(gate[r, h*gate_head_stride + i]) in place."""
    o, gate = as_view(o, "o"), as_view(gate, "gate")
    _check(lib.pf_sigmoid_gate_rows(_ctx(ctx).ptr, o.buf.ptr, o.off, o.ld, gate.buf.ptr,
                                    gate.off, gate.ld, gate_head_stride, rows, n_heads, head_dim))


# ----------------------------------------------------------------------------- NumPy level

def _head_width(n_heads: int, head_dim: int, head_stride: int) -> int:
    return (n_heads - 1) * (head_stride or head_dim) + head_dim


def _check_heads_fit(x: np.ndarray, name: str, n_heads: int, head_dim: int, head_stride: int,
                     col0: int) -> None:
    if n_heads < 1 or head_dim < 1 or col0 < 0:
        raise InvalidArgumentError(f"{name}: n_heads={n_heads}, head_dim={head_dim}, col0={col0}")
    need = col0 + _head_width(n_heads, head_dim, head_stride)
    if x.shape[1] < need:
        raise InvalidArgumentError(f"{name}: rows of {x.shape[1]} columns cannot hold {n_heads} "
                                   f"heads of {head_dim} at stride {head_stride or head_dim} from "
                                   f"column {col0} (need {need}); shape {x.shape}")


def rms_norm(ctx: Context, x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm of each row of x ([rows][cols] float32) with weight w ([cols])."""
    f32_matrix(x, "x")
    f32_matrix(w, "w", cols=x.shape[1], ndim=1)
    rows, cols = x.shape
    with upload(ctx, x) as bx, upload(ctx, w) as bw, poisoned(ctx, x.nbytes) as by:
        rms_norm_rows(ctx, bx, bw, by, rows, cols, eps)
        return by.download(np.float32, x.shape)


def head_rms_norm(ctx: Context, x: np.ndarray, w: np.ndarray, n_heads: int, head_dim: int,
                  eps: float = 1e-6, head_stride: int = 0, col0: int = 0) -> np.ndarray:
    """Per-head RMSNorm of the heads inside x ([rows][ld]): head h at column
    col0 + h*head_stride. Returns the whole array (other columns unchanged)."""
    f32_matrix(x, "x")
    f32_matrix(w, "w", cols=head_dim, ndim=1)
    _check_heads_fit(x, "x", n_heads, head_dim, head_stride, col0)
    with upload(ctx, x) as bx, upload(ctx, w) as bw:
        head_rms_norm_rows(ctx, View(bx, col0, x.shape[1]), bw, x.shape[0], n_heads, head_dim,
                           eps, head_stride)
        return bx.download(np.float32, x.shape)


def rope_neox(ctx: Context, x: np.ndarray, n_heads: int, head_dim: int, rot_dim: int, pos0: int,
              base: float, head_stride: int = 0, col0: int = 0) -> np.ndarray:
    """Partial NEOX RoPE of the heads inside x ([rows][ld]); returns the whole array."""
    f32_matrix(x, "x")
    _check_heads_fit(x, "x", n_heads, head_dim, head_stride, col0)
    with upload(ctx, x) as bx:
        rope_neox_rows(ctx, View(bx, col0, x.shape[1]), x.shape[0], n_heads, head_dim, rot_dim,
                       pos0, base, head_stride)
        return bx.download(np.float32, x.shape)


def swiglu(ctx: Context, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u for [rows][cols] float32 arrays."""
    f32_matrix(g, "g")
    f32_matrix(u, "u")
    if u.shape != g.shape:
        raise InvalidArgumentError(f"u: shape {u.shape} differs from g's {g.shape}")
    with upload(ctx, g) as bg, upload(ctx, u) as bu, poisoned(ctx, g.nbytes) as bo:
        swiglu_rows(ctx, bg, bu, bo, g.shape[0], g.shape[1])
        return bo.download(np.float32, g.shape)


def add(ctx: Context, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y + x for [rows][cols] float32 arrays (computed in place on the device copy of y)."""
    f32_matrix(y, "y")
    f32_matrix(x, "x")
    if x.shape != y.shape:
        raise InvalidArgumentError(f"x: shape {x.shape} differs from y's {y.shape}")
    with upload(ctx, y) as by, upload(ctx, x) as bx:
        add_rows(ctx, by, bx, y.shape[0], y.shape[1])
        return by.download(np.float32, y.shape)


def sigmoid_gate(ctx: Context, o: np.ndarray, gate: np.ndarray, n_heads: int, head_dim: int,
                 gate_head_stride: int = 0, gate_col0: int = 0) -> np.ndarray:
    """o ([rows][n_heads*head_dim]) times sigmoid of the gate heads inside gate ([rows][ld]):
    head h at column gate_col0 + h*gate_head_stride. Returns the gated o."""
    f32_matrix(o, "o", cols=n_heads * head_dim)
    f32_matrix(gate, "gate")
    if gate.shape[0] != o.shape[0]:
        raise InvalidArgumentError(f"gate: {gate.shape[0]} rows, o has {o.shape[0]}")
    _check_heads_fit(gate, "gate", n_heads, head_dim, gate_head_stride, gate_col0)
    with upload(ctx, o) as bo, upload(ctx, gate) as bg:
        sigmoid_gate_rows(ctx, bo, View(bg, gate_col0, gate.shape[1]), o.shape[0], n_heads,
                          head_dim, gate_head_stride)
        return bo.download(np.float32, o.shape)


__all__ = ["View", "as_view", "rms_norm_rows", "head_rms_norm_rows", "rope_neox_rows",
           "swiglu_rows", "add_rows", "sigmoid_gate_rows", "rms_norm", "head_rms_norm",
           "rope_neox", "swiglu", "add", "sigmoid_gate"]
