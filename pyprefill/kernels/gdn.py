"""Gated DeltaNet kernels (spec.md §3.2): causal conv1d + SiLU, per-head L2 norm, gates, gated
RMSNorm and the delta-rule scan, over float32 row-major activations.

Buffer level (named after the C entry: ``gdn_scan`` for ``pf_gdn_scan``): device Buffers /
:class:`~pyprefill.kernels._common.View` s in and out; state buffers (conv window, recurrent
state) are updated in place so that consecutive calls continue one sequence. Every row op equals
`rows` calls of itself with rows = 1 bit for bit (the per-token twin).

NumPy level (``gdn_scan_np``): arrays in, arrays out (upload, poison outputs with NaN, run,
download), used by the tests.

Many sequences in one call (``gdn_scan_varlen``, ``gdn_scan_varlen_np``): rows of several
sequences back to back (cu_seqlens), each with its own slot of a state pool.
"""
from __future__ import annotations

import numpy as np

from .._errors import _check
from .._ffi import enum_map, enum_value, ffi, lib
from ..core import Context
from ..errors import InvalidArgumentError
from ._common import (View, array_arg, c_view, check_heads_fit, ctx_arg, download, new_args,
                      poisoned, same_rows, set_view, upload)

SCAN_PATHS = enum_map("pf_gdn_scan_path", "PF_GDN_SCAN_")   # {"auto": 0, "sequential": 1, ...}
SCAN_PATH_NAMES = {v: k for k, v in SCAN_PATHS.items()}


def scan_path_id(path) -> int:
    """A pf_gdn_scan_path value from a name ("sequential") or one of the values."""
    return enum_value(path, SCAN_PATHS, "path")

# ----------------------------------------------------------------------------- buffer level


def gdn_conv1d(ctx: Context, m, window, weight, u, rows: int, conv_dim: int, kc: int) -> None:
    """u = silu(causal conv1d of concat(window, m)); window advances in place.
    window: [(kc-1)][conv_dim], weight: [conv_dim][kc] (vectors: View offsets honoured, ld
    ignored)."""
    vm, vwin, vw, vu = (c_view(m, "m"), c_view(window, "window"), c_view(weight, "weight"),
                        c_view(u, "u"))
    _check(lib.pf_gdn_conv1d(ctx_arg(ctx).ptr, vm, vwin, vw, vu, rows, conv_dim, kc))


def gdn_l2norm(ctx: Context, x, rows: int, n_heads: int, head_dim: int, eps: float = 1e-6,
               scale: float = 1.0, head_stride: int = 0) -> None:
    """Per-head L2 norm in place (HF formula), times `scale`."""
    vx = c_view(x, "x")
    _check(lib.pf_gdn_l2norm(ctx_arg(ctx).ptr, vx, rows, n_heads, head_dim, head_stride, eps,
                             scale))


def gdn_gates(ctx: Context, b, alpha, ssm_a, dt_bias, beta, g, rows: int, n_v_heads: int) -> None:
    """beta = sigmoid(b); g = ssm_a * softplus(alpha + dt_bias)."""
    a = new_args("pf_gdn_gates_args")
    for field, arg, name in ((a.b, b, "b"), (a.alpha, alpha, "alpha"), (a.ssm_a, ssm_a, "ssm_a"),
                             (a.dt_bias, dt_bias, "dt_bias"), (a.beta, beta, "beta"), (a.g, g, "g")):
        set_view(field, arg, name)
    a.rows, a.n_v_heads = rows, n_v_heads
    _check(lib.pf_gdn_gates(ctx_arg(ctx).ptr, a))


def gdn_gated_rms_norm(ctx: Context, o, z, w, y, rows: int, n_v_heads: int, dv: int,
                       eps: float = 1e-6) -> None:
    """y = RMSNorm(o per value head; w) * silu(z) (y may be o)."""
    a = new_args("pf_gdn_gated_rms_norm_args")
    for field, arg, name in ((a.o, o, "o"), (a.z, z, "z"), (a.w, w, "w"), (a.y, y, "y")):
        set_view(field, arg, name)
    a.rows, a.n_v_heads, a.dv, a.eps = rows, n_v_heads, dv, eps
    _check(lib.pf_gdn_gated_rms_norm(ctx_arg(ctx).ptr, a))


def _scan_args(q, k, v, beta, g, state, o, rows, n_k_heads, n_v_heads, dk, dv, path, workspace):
    a = new_args("pf_gdn_scan_args")
    for field, arg, name in ((a.q, q, "q"), (a.k, k, "k"), (a.v, v, "v"), (a.beta, beta, "beta"),
                             (a.g, g, "g"), (a.state, state, "state"), (a.o, o, "o")):
        if arg is not None:
            set_view(field, arg, name)
    if workspace is not None:
        set_view(a.workspace, workspace, "workspace")
    a.rows, a.n_k_heads, a.n_v_heads, a.dk, a.dv = rows, n_k_heads, n_v_heads, dk, dv
    a.path = scan_path_id(path)
    return a


def gdn_scan(ctx: Context, q, k, v, beta, g, state, o, rows: int, n_k_heads: int, n_v_heads: int,
             dk: int, dv: int, path="auto", workspace=None) -> None:
    """The gated delta rule over `rows` tokens; state ([n_v_heads][dk][dv], a vector view: ld
    ignored) updated in place. path: "auto", "sequential" or "chunked" (a pf_gdn_scan_path).
    workspace: a Buffer or View (byte offset) of at least gdn_scan_plan()'s bytes for the
    chunked path; None = the context's own scratch."""
    a = _scan_args(q, k, v, beta, g, state, o, rows, n_k_heads, n_v_heads, dk, dv, path, workspace)
    _check(lib.pf_gdn_scan(ctx_arg(ctx).ptr, a))


def gdn_scan_plan(rows: int, n_k_heads: int, n_v_heads: int, dk: int, dv: int,
                  path="auto") -> dict:
    """What gdn_scan would run (no device needed): {"path": "sequential" | "chunked",
    "workspace_bytes": int}."""
    a = _scan_args(None, None, None, None, None, None, None, rows, n_k_heads, n_v_heads, dk, dv,
                   path, None)
    p, w = ffi.new("int32_t *"), ffi.new("size_t *")
    _check(lib.pf_gdn_scan_plan(a, p, w))
    return {"path": SCAN_PATH_NAMES[int(p[0])], "workspace_bytes": int(w[0])}


def _cu_seqlens_arg(cu_seqlens):
    """cu_seqlens as a C int64_t[] (kept alive by the caller) and n_seqs; InvalidArgumentError
    for anything but a 1-D sequence of ints with at least one entry."""
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 1 or not (cu.size == 1 or np.issubdtype(cu.dtype, np.integer)):
        raise InvalidArgumentError(f"cu_seqlens: expected a 1-D array of n_seqs + 1 ints, got "
                                   f"{cu.dtype} of shape {cu.shape}")
    return ffi.new("int64_t[]", [int(x) for x in cu]), cu.size - 1


def _varlen_args(q, k, v, beta, g, states, o, cu_seqlens, state_indices, n_states, n_k_heads,
                 n_v_heads, dk, dv, path, workspace):
    """(pf_gdn_scan_varlen_args *, the C arrays it points to: keep them alive for the call)."""
    a = new_args("pf_gdn_scan_varlen_args")
    for field, arg, name in ((a.q, q, "q"), (a.k, k, "k"), (a.v, v, "v"), (a.beta, beta, "beta"),
                             (a.g, g, "g"), (a.state, states, "states"), (a.o, o, "o")):
        if arg is not None:
            set_view(field, arg, name)
    if workspace is not None:
        set_view(a.workspace, workspace, "workspace")
    cu, n_seqs = _cu_seqlens_arg(cu_seqlens)
    keep = [cu]
    a.cu_seqlens, a.n_seqs = cu, n_seqs
    if state_indices is not None:
        idx = np.asarray(state_indices)
        if idx.ndim != 1 or idx.size != n_seqs or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise InvalidArgumentError(f"state_indices: expected {n_seqs} ints (one per sequence), got "
                                       f"{idx.dtype} of shape {idx.shape}")
        c_idx = ffi.new("int32_t[]", [int(x) for x in idx] or [0])
        keep.append(c_idx)
        a.state_indices = c_idx
    a.n_states, a.n_k_heads, a.n_v_heads, a.dk, a.dv = n_states, n_k_heads, n_v_heads, dk, dv
    a.path = scan_path_id(path)
    return a, keep


def gdn_scan_varlen(ctx: Context, q, k, v, beta, g, states, o, cu_seqlens, n_states: int,
                    n_k_heads: int, n_v_heads: int, dk: int, dv: int, state_indices=None,
                    path="auto", workspace=None) -> None:
    """The gated delta rule over several sequences in one call: sequence i is rows
    [cu_seqlens[i], cu_seqlens[i+1]) of q, k, v, beta, g, o with the state in slot
    state_indices[i] (None: slot i) of `states`, a pool of n_states states [n_v_heads][dk][dv]
    (a vector view), updated in place. path: as gdn_scan. workspace: a Buffer or View (byte
    offset) of at least gdn_scan_varlen_plan()'s bytes; None = the context's own scratch."""
    a, keep = _varlen_args(q, k, v, beta, g, states, o, cu_seqlens, state_indices, n_states,
                           n_k_heads, n_v_heads, dk, dv, path, workspace)
    _check(lib.pf_gdn_scan_varlen(ctx_arg(ctx).ptr, a))
    del keep


def gdn_scan_varlen_plan(cu_seqlens, n_k_heads: int, n_v_heads: int, dk: int, dv: int,
                         path="auto", state_indices=None, n_states: int | None = None) -> dict:
    """What gdn_scan_varlen would run (no device needed): {"path": "sequential" | "chunked",
    "workspace_bytes": int}. n_states None: one slot per sequence."""
    n = len(cu_seqlens) - 1
    a, keep = _varlen_args(None, None, None, None, None, None, None, cu_seqlens, state_indices,
                           n if n_states is None else n_states, n_k_heads, n_v_heads, dk, dv,
                           path, None)
    p, w = ffi.new("int32_t *"), ffi.new("size_t *")
    _check(lib.pf_gdn_scan_varlen_plan(a, p, w))
    del keep
    return {"path": SCAN_PATH_NAMES[int(p[0])], "workspace_bytes": int(w[0])}


# ----------------------------------------------------------------------------- NumPy level


def gdn_conv1d_np(ctx: Context, m: np.ndarray, window: np.ndarray,
                  weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u, new_window) for m [rows][conv_dim], window [kc-1][conv_dim], weight [conv_dim][kc]."""
    m = array_arg(m, "m", ndim=2)
    conv_dim = m.shape[1]
    weight = array_arg(weight, "weight", ndim=2)
    if weight.shape[0] != conv_dim or not 2 <= weight.shape[1] <= 8:
        raise InvalidArgumentError(f"weight: expected shape ({conv_dim}, kc) with kc in [2, 8], "
                                   f"got {weight.shape}")
    kc = weight.shape[1]
    window = array_arg(window, "window", ndim=2, cols=conv_dim)
    if window.shape[0] != kc - 1:
        raise InvalidArgumentError(f"window: expected shape ({kc - 1}, {conv_dim}), got {window.shape}")
    with upload(ctx, m) as bm, upload(ctx, window) as bwin, upload(ctx, weight) as bw, \
            poisoned(ctx, m.nbytes) as bu:
        gdn_conv1d(ctx, bm, bwin, bw, bu, m.shape[0], conv_dim, kc)
        return download(ctx, bu, np.float32, m.shape), download(ctx, bwin, np.float32, window.shape)


def gdn_l2norm_np(ctx: Context, x: np.ndarray, n_heads: int, head_dim: int, eps: float = 1e-6,
                  scale: float = 1.0, head_stride: int = 0, col0: int = 0) -> np.ndarray:
    """L2 norm (times scale) of the heads inside x ([rows][ld]); returns the whole array."""
    x = array_arg(x, "x", ndim=2)
    check_heads_fit(x, "x", n_heads, head_dim, head_stride, col0)
    with upload(ctx, x) as bx:
        gdn_l2norm(ctx, View(bx, col0, x.shape[1]), x.shape[0], n_heads, head_dim, eps, scale,
                   head_stride)
        return download(ctx, bx, np.float32, x.shape)


def gdn_gates_np(ctx: Context, b: np.ndarray, alpha: np.ndarray, ssm_a: np.ndarray,
                 dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(beta, g) for b, alpha [rows][n_v_heads] and ssm_a, dt_bias [n_v_heads]."""
    b = array_arg(b, "b", ndim=2)
    hv = b.shape[1]
    alpha = array_arg(alpha, "alpha", ndim=2, cols=hv)
    if alpha.shape != b.shape:
        raise InvalidArgumentError(f"alpha: shape {alpha.shape} differs from b's {b.shape}")
    ssm_a = array_arg(ssm_a, "ssm_a", ndim=1, cols=hv)
    dt_bias = array_arg(dt_bias, "dt_bias", ndim=1, cols=hv)
    with upload(ctx, b) as bb, upload(ctx, alpha) as ba, upload(ctx, ssm_a) as bs, \
            upload(ctx, dt_bias) as bd, poisoned(ctx, b.nbytes) as bbeta, \
            poisoned(ctx, b.nbytes) as bg:
        gdn_gates(ctx, bb, ba, bs, bd, bbeta, bg, b.shape[0], hv)
        return download(ctx, bbeta, np.float32, b.shape), download(ctx, bg, np.float32, b.shape)


def gdn_gated_rms_norm_np(ctx: Context, o: np.ndarray, z: np.ndarray, w: np.ndarray,
                          n_v_heads: int, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm(o per head of dv = len(w); w) * silu(z) for o, z [rows][n_v_heads*dv]."""
    w = array_arg(w, "w", ndim=1)
    dv = w.shape[0]
    o = array_arg(o, "o", ndim=2, cols=n_v_heads * dv)
    z = array_arg(z, "z", ndim=2, cols=n_v_heads * dv)
    if z.shape != o.shape:
        raise InvalidArgumentError(f"z: shape {z.shape} differs from o's {o.shape}")
    with upload(ctx, o) as bo, upload(ctx, z) as bz, upload(ctx, w) as bw, \
            poisoned(ctx, o.nbytes) as by:
        gdn_gated_rms_norm(ctx, bo, bz, bw, by, o.shape[0], n_v_heads, dv, eps)
        return download(ctx, by, np.float32, o.shape)


def _scan_operands(q, k, v, beta, g, hv: int, dk: int, dv: int):
    """The delta rule's row operands checked against the state's dims (q's columns fix the key
    heads): (q, k, v, beta, g, rows, n_k_heads)."""
    q = array_arg(q, "q", ndim=2)
    rows = q.shape[0]
    if dk < 1 or q.shape[1] % dk:
        raise InvalidArgumentError(f"q: {q.shape[1]} columns is not a multiple of dk={dk}")
    hk = q.shape[1] // dk
    k = array_arg(k, "k", ndim=2, cols=hk * dk)
    v = array_arg(v, "v", ndim=2, cols=hv * dv)
    beta = array_arg(beta, "beta", ndim=2, cols=hv)
    g = array_arg(g, "g", ndim=2, cols=hv)
    for name, a in (("k", k), ("v", v), ("beta", beta), ("g", g)):
        same_rows(name, a, rows, "q")
    return q, k, v, beta, g, rows, hk


def gdn_scan_np(ctx: Context, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray,
                g: np.ndarray, state: np.ndarray, path="auto") -> tuple[np.ndarray, np.ndarray]:
    """(o, new_state) of the gated delta rule. state [n_v_heads][dk][dv] fixes the dims;
    q, k: [rows][n_k_heads*dk], v: [rows][n_v_heads*dv], beta, g: [rows][n_v_heads]."""
    state = array_arg(state, "state", ndim=3)
    hv, dk, dv = state.shape
    q, k, v, beta, g, rows, hk = _scan_operands(q, k, v, beta, g, hv, dk, dv)
    path = scan_path_id(path)
    with upload(ctx, q) as bq, upload(ctx, k) as bk, upload(ctx, v) as bv, \
            upload(ctx, beta) as bb, upload(ctx, g) as bg, upload(ctx, state) as bs, \
            poisoned(ctx, v.nbytes) as bo:
        gdn_scan(ctx, bq, bk, bv, bb, bg, bs, bo, rows, hk, hv, dk, dv, path)
        return download(ctx, bo, np.float32, v.shape), download(ctx, bs, np.float32, state.shape)


def gdn_scan_varlen_np(ctx: Context, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       beta: np.ndarray, g: np.ndarray, states: np.ndarray, cu_seqlens,
                       state_indices=None, path="auto") -> tuple[np.ndarray, np.ndarray]:
    """(o, new_states) of the gated delta rule over the sequences of cu_seqlens (rows
    [cu_seqlens[i], cu_seqlens[i+1]) of q, k, v, beta, g), sequence i on slot state_indices[i]
    (None: i) of states [n_states][n_v_heads][dk][dv], which fixes the dims; q, k:
    [rows][n_k_heads*dk], v: [rows][n_v_heads*dv], beta, g: [rows][n_v_heads], rows =
    cu_seqlens[-1]. Slots no sequence uses come back unchanged."""
    states = array_arg(states, "states", ndim=4)
    n_states, hv, dk, dv = states.shape
    q, k, v, beta, g, rows, hk = _scan_operands(q, k, v, beta, g, hv, dk, dv)
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 1 or int(cu[-1]) != rows:
        raise InvalidArgumentError(f"cu_seqlens: expected n_seqs + 1 offsets ending at q's {rows} rows, "
                                   f"got {cu_seqlens!r}")
    path = scan_path_id(path)
    with upload(ctx, q) as bq, upload(ctx, k) as bk, upload(ctx, v) as bv, \
            upload(ctx, beta) as bb, upload(ctx, g) as bg, upload(ctx, states) as bs, \
            poisoned(ctx, v.nbytes) as bo:
        gdn_scan_varlen(ctx, bq, bk, bv, bb, bg, bs, bo, cu, n_states, hk, hv, dk, dv,
                        state_indices, path)
        return download(ctx, bo, np.float32, v.shape), download(ctx, bs, np.float32, states.shape)


__all__ = ["SCAN_PATHS", "scan_path_id", "gdn_scan_plan", "gdn_conv1d", "gdn_l2norm", "gdn_gates",
           "gdn_gated_rms_norm", "gdn_scan", "gdn_scan_varlen", "gdn_scan_varlen_plan",
           "gdn_conv1d_np", "gdn_l2norm_np", "gdn_gates_np", "gdn_gated_rms_norm_np", "gdn_scan_np",
           "gdn_scan_varlen_np"]
