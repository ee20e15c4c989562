"""Row kernels (RMSNorm, per-head RMSNorm, partial NEOX RoPE, SwiGLU, residual add, sigmoid
output gate) over float32 row-major activations.

Two levels (the scheme of :mod:`pyprefill.kernels._common`):
- buffer level, named after the C entry (``rms_norm`` for ``pf_rms_norm``): device Buffers in and
  out. A matrix argument is a :class:`View` (buffer, element offset, row stride) or a plain
  Buffer (offset 0, the op's natural row stride);
- NumPy level (``rms_norm_np``): arrays in, arrays out (upload, poison the output with NaN, run,
  download), used by the tests. In-place ops return the whole updated array.
"""
from __future__ import annotations

import numpy as np

from .._errors import _check
from .._ffi import lib
from ..core import Context
from ..errors import InvalidArgumentError
from ._common import (View, array_arg, c_view, check_heads_fit, ctx_arg, download, new_args,
                      poisoned, set_view, upload)

# ----------------------------------------------------------------------------- buffer level


def rms_norm(ctx: Context, x, w, y, rows: int, cols: int, eps: float) -> None:
    """y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w over `cols` columns (y may be x)."""
    vx, vw, vy = c_view(x, "x"), c_view(w, "w"), c_view(y, "y")
    _check(lib.pf_rms_norm(ctx_arg(ctx).ptr, vx, vw, vy, rows, cols, eps))


def head_rms_norm(ctx: Context, x, w, rows: int, n_heads: int, head_dim: int, eps: float,
                  head_stride: int = 0) -> None:
    """Per-head RMSNorm in place; head h at column h*head_stride (0 = head_dim)."""
    vx, vw = c_view(x, "x"), c_view(w, "w")
    _check(lib.pf_head_rms_norm(ctx_arg(ctx).ptr, vx, vw, rows, n_heads, head_dim, head_stride,
                                eps))


def rope_neox(ctx: Context, x, rows: int, n_heads: int, head_dim: int, rot_dim: int, pos0: int,
              base: float, head_stride: int = 0) -> None:
    """Partial NEOX RoPE in place; row t at position pos0 + t."""
    a = new_args("pf_rope_neox_args")
    set_view(a.x, x, "x")
    a.rows, a.n_heads, a.head_dim, a.head_stride = rows, n_heads, head_dim, head_stride
    a.rot_dim, a.base, a.pos0 = rot_dim, base, pos0
    _check(lib.pf_rope_neox(ctx_arg(ctx).ptr, a))


def swiglu(ctx: Context, g, u, out, rows: int, cols: int) -> None:
    """out = silu(g) * u (out may be g or u)."""
    vg, vu, vo = c_view(g, "g"), c_view(u, "u"), c_view(out, "out")
    _check(lib.pf_swiglu(ctx_arg(ctx).ptr, vg, vu, vo, rows, cols))


def add(ctx: Context, y, x, rows: int, cols: int) -> None:
    """y += x."""
    vy, vx = c_view(y, "y"), c_view(x, "x")
    _check(lib.pf_add(ctx_arg(ctx).ptr, vy, vx, rows, cols))


def sigmoid_gate(ctx: Context, o, gate, rows: int, n_heads: int, head_dim: int,
                 gate_head_stride: int = 0) -> None:
    """o[r, h*D + i] *= sigmoid(gate[r, h*gate_head_stride + i]) in place."""
    vo, vg = c_view(o, "o"), c_view(gate, "gate")
    _check(lib.pf_sigmoid_gate(ctx_arg(ctx).ptr, vo, vg, rows, n_heads, head_dim,
                               gate_head_stride))


# ----------------------------------------------------------------------------- NumPy level


def rms_norm_np(ctx: Context, x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm of each row of x ([rows][cols] float32) with weight w ([cols])."""
    x = array_arg(x, "x", ndim=2)
    w = array_arg(w, "w", ndim=1, cols=x.shape[1])
    rows, cols = x.shape
    with upload(ctx, x) as bx, upload(ctx, w) as bw, poisoned(ctx, x.nbytes) as by:
        rms_norm(ctx, bx, bw, by, rows, cols, eps)
        return download(ctx, by, np.float32, x.shape)


def head_rms_norm_np(ctx: Context, x: np.ndarray, w: np.ndarray, n_heads: int, head_dim: int,
                     eps: float = 1e-6, head_stride: int = 0, col0: int = 0) -> np.ndarray:
    """Per-head RMSNorm of the heads inside x ([rows][ld]): head h at column
    col0 + h*head_stride. Returns the whole array (other columns unchanged)."""
    x = array_arg(x, "x", ndim=2)
    w = array_arg(w, "w", ndim=1, cols=head_dim)
    check_heads_fit(x, "x", n_heads, head_dim, head_stride, col0)
    with upload(ctx, x) as bx, upload(ctx, w) as bw:
        head_rms_norm(ctx, View(bx, col0, x.shape[1]), bw, x.shape[0], n_heads, head_dim, eps,
                      head_stride)
        return download(ctx, bx, np.float32, x.shape)


def rope_neox_np(ctx: Context, x: np.ndarray, n_heads: int, head_dim: int, rot_dim: int,
                 pos0: int, base: float, head_stride: int = 0, col0: int = 0) -> np.ndarray:
    """Partial NEOX RoPE of the heads inside x ([rows][ld]); returns the whole array."""
    x = array_arg(x, "x", ndim=2)
    check_heads_fit(x, "x", n_heads, head_dim, head_stride, col0)
    with upload(ctx, x) as bx:
        rope_neox(ctx, View(bx, col0, x.shape[1]), x.shape[0], n_heads, head_dim, rot_dim, pos0,
                  base, head_stride)
        return download(ctx, bx, np.float32, x.shape)


def swiglu_np(ctx: Context, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u for [rows][cols] float32 arrays."""
    g = array_arg(g, "g", ndim=2)
    u = array_arg(u, "u", ndim=2)
    if u.shape != g.shape:
        raise InvalidArgumentError(f"u: shape {u.shape} differs from g's {g.shape}")
    with upload(ctx, g) as bg, upload(ctx, u) as bu, poisoned(ctx, g.nbytes) as bo:
        swiglu(ctx, bg, bu, bo, g.shape[0], g.shape[1])
        return download(ctx, bo, np.float32, g.shape)


def add_np(ctx: Context, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y + x for [rows][cols] float32 arrays (computed in place on the device copy of y)."""
    y = array_arg(y, "y", ndim=2)
    x = array_arg(x, "x", ndim=2)
    if x.shape != y.shape:
        raise InvalidArgumentError(f"x: shape {x.shape} differs from y's {y.shape}")
    with upload(ctx, y) as by, upload(ctx, x) as bx:
        add(ctx, by, bx, y.shape[0], y.shape[1])
        return download(ctx, by, np.float32, y.shape)


def sigmoid_gate_np(ctx: Context, o: np.ndarray, gate: np.ndarray, n_heads: int, head_dim: int,
                    gate_head_stride: int = 0, gate_col0: int = 0) -> np.ndarray:
    """o ([rows][n_heads*head_dim]) times sigmoid of the gate heads inside gate ([rows][ld]):
    head h at column gate_col0 + h*gate_head_stride. Returns the gated o."""
    o = array_arg(o, "o", ndim=2, cols=n_heads * head_dim)
    gate = array_arg(gate, "gate", ndim=2)
    if gate.shape[0] != o.shape[0]:
        raise InvalidArgumentError(f"gate: {gate.shape[0]} rows, o has {o.shape[0]}")
    check_heads_fit(gate, "gate", n_heads, head_dim, gate_head_stride, gate_col0)
    with upload(ctx, o) as bo, upload(ctx, gate) as bg:
        sigmoid_gate(ctx, bo, View(bg, gate_col0, gate.shape[1]), o.shape[0], n_heads, head_dim,
                     gate_head_stride)
        return download(ctx, bo, np.float32, o.shape)


__all__ = ["View", "rms_norm", "head_rms_norm", "rope_neox", "swiglu", "add", "sigmoid_gate",
           "rms_norm_np", "head_rms_norm_np", "rope_neox_np", "swiglu_np", "add_np",
           "sigmoid_gate_np"]
