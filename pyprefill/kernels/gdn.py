"""Gated DeltaNet kernels (spec §3.2): causal conv1d + SiLU, per-head L2 norm, gates, gated
RMSNorm and the delta-rule scan, over float32 row-major activations.

Buffer level (``*_rows``): device Buffers / :class:`~pyprefill.kernels.rows.View` s in and out;
state buffers (conv window, recurrent state) are updated in place so that consecutive calls
continue one sequence. Every row op equals `rows` calls of itself with rows = 1 bit for bit
(the per-token twin).

NumPy level: arrays in, arrays out (upload, poison outputs with NaN, run, download), used by the
tests.
"""
from __future__ import annotations

import numpy as np

from .._errors import _check
from .._ffi import lib
from ..core import Context
from ..errors import InvalidArgumentError
from .rows import View, _check_heads_fit, _ctx, as_view, f32_matrix, poisoned, upload

# ----------------------------------------------------------------------------- buffer level


def gdn_conv1d_rows(ctx: Context, m, window, weight, u, rows: int, conv_dim: int,
                    kc: int) -> None:
    """u = silu(causal conv1d of concat(window, m)); window advances in place.
    window: [(kc-1)][conv_dim], weight: [conv_dim][kc] (View offsets honoured, ld ignored)."""
    m, window, weight, u = (as_view(m, "m"), as_view(window, "window"), as_view(weight, "weight"),
                            as_view(u, "u"))
    _check(lib.pf_gdn_conv1d_rows(_ctx(ctx).ptr, m.buf.ptr, m.off, m.ld, window.buf.ptr,
                                  window.off, weight.buf.ptr, weight.off, u.buf.ptr, u.off, u.ld,
                                  rows, conv_dim, kc))


def gdn_l2norm_rows(ctx: Context, x, rows: int, n_heads: int, head_dim: int, eps: float = 1e-6,
                    scale: float = 1.0, head_stride: int = 0) -> None:
    """Per-head L2 norm in place (HF formula), times `scale`."""
    x = as_view(x, "x")
    _check(lib.pf_gdn_l2norm_rows(_ctx(ctx).ptr, x.buf.ptr, x.off, x.ld, rows, n_heads,
                                  head_stride, head_dim, eps, scale))


def gdn_gates_rows(ctx: Context, b, alpha, ssm_a, dt_bias, beta, g, rows: int,
                   n_v_heads: int) -> None:
    """beta = sigmoid(b); g = ssm_a * softplus(alpha + dt_bias)."""
    b, alpha, ssm_a, dt_bias, beta, g = (as_view(b, "b"), as_view(alpha, "alpha"),
                                         as_view(ssm_a, "ssm_a"), as_view(dt_bias, "dt_bias"),
                                         as_view(beta, "beta"), as_view(g, "g"))
    _check(lib.pf_gdn_gates_rows(_ctx(ctx).ptr, b.buf.ptr, b.off, b.ld, alpha.buf.ptr, alpha.off,
                                 alpha.ld, ssm_a.buf.ptr, ssm_a.off, dt_bias.buf.ptr, dt_bias.off,
                                 beta.buf.ptr, beta.off, beta.ld, g.buf.ptr, g.off, g.ld, rows,
                                 n_v_heads))


def gdn_gated_rms_norm_rows(ctx: Context, o, z, w, y, rows: int, n_v_heads: int, dv: int,
                            eps: float = 1e-6) -> None:
    """y = RMSNorm(o per value head; w) * silu(z) (y may be o)."""
    o, z, w, y = as_view(o, "o"), as_view(z, "z"), as_view(w, "w"), as_view(y, "y")
    _check(lib.pf_gdn_gated_rms_norm_rows(_ctx(ctx).ptr, o.buf.ptr, o.off, o.ld, z.buf.ptr,
                                          z.off, z.ld, w.buf.ptr, w.off, y.buf.ptr, y.off, y.ld,
                                          rows, n_v_heads, dv, eps))


def gdn_scan_rows(ctx: Context, q, k, v, beta, g, state, o, rows: int, n_k_heads: int,
                  n_v_heads: int, dk: int, dv: int) -> None:
    """The gated delta rule over `rows` tokens; state ([n_v_heads][dk][dv]) updated in place."""
    q, k, v, beta, g, state, o = (as_view(q, "q"), as_view(k, "k"), as_view(v, "v"),
                                  as_view(beta, "beta"), as_view(g, "g"), as_view(state, "state"),
                                  as_view(o, "o"))
    _check(lib.pf_gdn_scan_rows(_ctx(ctx).ptr, q.buf.ptr, q.off, q.ld, k.buf.ptr, k.off, k.ld,
                                v.buf.ptr, v.off, v.ld, beta.buf.ptr, beta.off, beta.ld, g.buf.ptr,
                                g.off, g.ld, state.buf.ptr, state.off, o.buf.ptr, o.off, o.ld,
                                rows, n_k_heads, n_v_heads, dk, dv))


# ----------------------------------------------------------------------------- NumPy level


def gdn_conv1d(ctx: Context, m: np.ndarray, window: np.ndarray,
               weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u, new_window) for m [rows][conv_dim], window [kc-1][conv_dim], weight [conv_dim][kc]."""
    f32_matrix(m, "m")
    conv_dim = m.shape[1]
    f32_matrix(weight, "weight")
    if weight.shape[0] != conv_dim or not 2 <= weight.shape[1] <= 8:
        raise InvalidArgumentError(f"weight: expected shape ({conv_dim}, kc) with kc in [2, 8], "
                                   f"got {weight.shape}")
    kc = weight.shape[1]
    f32_matrix(window, "window", cols=conv_dim)
    if window.shape[0] != kc - 1:
        raise InvalidArgumentError(f"window: expected shape ({kc - 1}, {conv_dim}), got {window.shape}")
    with upload(ctx, m) as bm, upload(ctx, window) as bwin, upload(ctx, weight) as bw, \
            poisoned(ctx, m.nbytes) as bu:
        gdn_conv1d_rows(ctx, bm, bwin, bw, bu, m.shape[0], conv_dim, kc)
        return bu.download(np.float32, m.shape), bwin.download(np.float32, window.shape)


def gdn_l2norm(ctx: Context, x: np.ndarray, n_heads: int, head_dim: int, eps: float = 1e-6,
               scale: float = 1.0, head_stride: int = 0, col0: int = 0) -> np.ndarray:
    """L2 norm (times scale) of the heads inside x ([rows][ld]); returns the whole array."""
    f32_matrix(x, "x")
    _check_heads_fit(x, "x", n_heads, head_dim, head_stride, col0)
    with upload(ctx, x) as bx:
        gdn_l2norm_rows(ctx, View(bx, col0, x.shape[1]), x.shape[0], n_heads, head_dim, eps,
                        scale, head_stride)
        return bx.download(np.float32, x.shape)


def gdn_gates(ctx: Context, b: np.ndarray, alpha: np.ndarray, ssm_a: np.ndarray,
              dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(beta, g) for b, alpha [rows][n_v_heads] and ssm_a, dt_bias [n_v_heads]."""
    f32_matrix(b, "b")
    hv = b.shape[1]
    f32_matrix(alpha, "alpha", cols=hv)
    if alpha.shape != b.shape:
        raise InvalidArgumentError(f"alpha: shape {alpha.shape} differs from b's {b.shape}")
    f32_matrix(ssm_a, "ssm_a", cols=hv, ndim=1)
    f32_matrix(dt_bias, "dt_bias", cols=hv, ndim=1)
    with upload(ctx, b) as bb, upload(ctx, alpha) as ba, upload(ctx, ssm_a) as bs, \
            upload(ctx, dt_bias) as bd, poisoned(ctx, b.nbytes) as bbeta, \
            poisoned(ctx, b.nbytes) as bg:
        gdn_gates_rows(ctx, bb, ba, bs, bd, bbeta, bg, b.shape[0], hv)
        return bbeta.download(np.float32, b.shape), bg.download(np.float32, b.shape)


def gdn_gated_rms_norm(ctx: Context, o: np.ndarray, z: np.ndarray, w: np.ndarray,
                       n_v_heads: int, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm(o per head of dv = len(w); w) * silu(z) for o, z [rows][n_v_heads*dv]."""
    f32_matrix(w, "w", ndim=1)
    dv = w.shape[0]
    f32_matrix(o, "o", cols=n_v_heads * dv)
    f32_matrix(z, "z", cols=n_v_heads * dv)
    if z.shape != o.shape:
        raise InvalidArgumentError(f"z: shape {z.shape} differs from o's {o.shape}")
    with upload(ctx, o) as bo, upload(ctx, z) as bz, upload(ctx, w) as bw, \
            poisoned(ctx, o.nbytes) as by:
        gdn_gated_rms_norm_rows(ctx, bo, bz, bw, by, o.shape[0], n_v_heads, dv, eps)
        return by.download(np.float32, o.shape)


def gdn_scan(ctx: Context, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray,
             g: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(o, new_state) of the gated delta rule. state [n_v_heads][dk][dv] fixes the dims;
    q, k: [rows][n_k_heads*dk], v: [rows][n_v_heads*dv], beta, g: [rows][n_v_heads]."""
    f32_matrix(state, "state", ndim=3)
    hv, dk, dv = state.shape
    f32_matrix(q, "q")
    rows = q.shape[0]
    if q.shape[1] % dk:
        raise InvalidArgumentError(f"q: {q.shape[1]} columns is not a multiple of dk={dk}")
    hk = q.shape[1] // dk
    for name, a, cols in (("k", k, hk * dk), ("v", v, hv * dv), ("beta", beta, hv), ("g", g, hv)):
        f32_matrix(a, name, cols=cols)
        if a.shape[0] != rows:
            raise InvalidArgumentError(f"{name}: {a.shape[0]} rows, q has {rows}")
    with upload(ctx, q) as bq, upload(ctx, k) as bk, upload(ctx, v) as bv, \
            upload(ctx, beta) as bb, upload(ctx, g) as bg, upload(ctx, state) as bs, \
            poisoned(ctx, v.nbytes) as bo:
        gdn_scan_rows(ctx, bq, bk, bv, bb, bg, bs, bo, rows, hk, hv, dk, dv)
        return bo.download(np.float32, v.shape), bs.download(np.float32, state.shape)


__all__ = ["gdn_conv1d_rows", "gdn_l2norm_rows", "gdn_gates_rows", "gdn_gated_rms_norm_rows",
           "gdn_scan_rows", "gdn_conv1d", "gdn_l2norm", "gdn_gates", "gdn_gated_rms_norm",
           "gdn_scan"]
