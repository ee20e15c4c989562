"""Dequantization, the embedding gather, projections (f32 / f16 legs), fp16 caches and prewarm,
and the fused Q4_0 / Q8_0 kernels.

Buffer level (named after the C entry: ``project`` for ``pf_project``): pyprefill Weights and
Buffers / :class:`~pyprefill.kernels._common.View` s, results left on the device. NumPy level
(``project_np``): arrays in, arrays out (upload, poison the output buffer with NaN, run,
synchronize, download); the tests use them.

Shapes: a weight is ``[n][k]`` (GGUF, ``k`` contiguous); activations are float32
``[rows][ld]`` row-major with ``ld >= width``; ``y = x @ W.T``.
"""
from __future__ import annotations

import numpy as np

from .._errors import _check
from .._ffi import enum_map, enum_value, ffi, lib
from ..core import Context, Weight, as_carray
from ..errors import InvalidArgumentError
from ._common import (View, array_arg, c_view, ctx_arg, download, out_buffer, upload,
                      weight_arg)

LEGS = enum_map("pf_gemm_leg", "PF_GEMM_")   # {"default": 0, "auto": 1, "f32": 2, "f16": 3, "int8": 4}
_LEG_NAMES = {v: k for k, v in LEGS.items()}


def leg_id(leg) -> int:
    """A pf_gemm_leg value from a name ("f16") or an int (the library judges unknown values)."""
    return enum_value(leg, LEGS, "leg", any_int=True)


def gemm_default_leg() -> str:
    """The process default leg ("auto", "f32" or "f16"), from env PREFILL_GEMM (read once per
    process) unless overridden."""
    out = ffi.new("int32_t *")
    _check(lib.pf_gemm_default_leg(out))
    return _LEG_NAMES[int(out[0])]


def gemm_set_default_leg(leg) -> None:
    """Override the process default leg; "default" restores the env value."""
    _check(lib.pf_gemm_set_default_leg(leg_id(leg)))


# ------------------------------------------------------------------ buffer level


def dequantize(ctx: Context, weight: Weight, out, *, f16: bool = False) -> None:
    """out = the weight as packed [n][k] float32 (or fp16: out's offset counts fp16 elements)."""
    w, vo = weight_arg(weight), c_view(out, "out")
    _check(lib.pf_dequantize(ctx_arg(ctx).ptr, w.ptr, vo, 1 if f16 else 0))


def embed(ctx: Context, table: Weight, ids, out) -> None:
    """out[r] = float32 row ids[r] of table for r < len(ids); ids: host int32 token ids."""
    ids = _ids_array(ids)
    t, vo = weight_arg(table, "table"), c_view(out, "out")
    keep = as_carray(ids, "ids", np.int32)          # alive until the call returns
    ptr = ffi.cast("const int32_t *", keep) if ids.size else ffi.NULL
    _check(lib.pf_embed(ctx_arg(ctx).ptr, t.ptr, ptr, ids.size, vo))


def project(ctx: Context, weight: Weight, x, y, rows: int, *, accumulate: bool = False,
            leg="default") -> None:
    """y[r] (+)= x[r] @ W.T for r < rows; x: [rows][ld] (k columns), y: [rows][ld] (n columns)."""
    w, vx, vy = weight_arg(weight), c_view(x, "x"), c_view(y, "y")
    _check(lib.pf_project(ctx_arg(ctx).ptr, w.ptr, vx, vy, rows, 1 if accumulate else 0,
                          leg_id(leg)))


def project_f16x(ctx: Context, weight: Weight, x16, inv, y, rows: int, *,
                 accumulate: bool = False) -> None:
    """y[r] = inv[r] * ((y[r] if accumulate) + x16[r] @ W16.T): the f16 leg from its input form
    (fp16 rows ``x16`` [rows][k], packed; ``inv`` float32 [rows] row scales or None for 1) on the
    weight's fp16 copy (UnsupportedError without one). See ``pf_project_f16x``."""
    w, vx, vy = weight_arg(weight), c_view(x16, "x16"), c_view(y, "y")
    vi = c_view(inv, "inv") if inv is not None else ffi.NULL
    _check(lib.pf_project_f16x(ctx_arg(ctx).ptr, w.ptr, vx, vi, vy, rows, 1 if accumulate else 0))


def qgemm(ctx: Context, weight: Weight, x, y, rows: int, *, accumulate: bool = False) -> None:
    """Fused GEMM on the blocks: the contract of :func:`project`."""
    w, vx, vy = weight_arg(weight), c_view(x, "x"), c_view(y, "y")
    _check(lib.pf_qgemm(ctx_arg(ctx).ptr, w.ptr, vx, vy, rows, 1 if accumulate else 0))


def qgemm_swiglu(ctx: Context, weight: Weight, x, out, rows: int) -> None:
    """out = silu(x @ Wg.T) * (x @ Wu.T), Wg = rows [0, n) and Wu = rows [n, 2n) of the weight."""
    w, vx, vo = weight_arg(weight), c_view(x, "x"), c_view(out, "out")
    _check(lib.pf_qgemm_swiglu(ctx_arg(ctx).ptr, w.ptr, vx, vo, rows))


def qgemv(ctx: Context, weight: Weight, x, y, *, accumulate: bool = False) -> None:
    """One row: y (+)= W @ x; x and y are vectors of k and n floats."""
    w, vx, vy = weight_arg(weight), c_view(x, "x"), c_view(y, "y")
    _check(lib.pf_qgemv(ctx_arg(ctx).ptr, w.ptr, vx, vy, 1 if accumulate else 0))


def weight_cache_f16(weight: Weight) -> None:
    """Cache the weight as fp16 (no-op when cached)."""
    _check(lib.pf_weight_cache_f16(weight_arg(weight).ptr))


def weight_drop_f16(weight: Weight) -> None:
    """Free the weight's fp16 cache (no-op when none)."""
    _check(lib.pf_weight_drop_f16(weight_arg(weight).ptr))


def weight_cache_i8(weight: Weight) -> None:
    """Make the weight's copy for the 8-bit leg (int8 codes with rank-1 scales: a factor per
    output row times one per 128 rows and 128 columns; no-op when made). UnsupportedError where
    that leg cannot run (it needs Hopper, compute capability 9.0)."""
    _check(lib.pf_weight_cache_i8(weight_arg(weight).ptr))


def weight_drop_i8(weight: Weight) -> None:
    """Free the weight's 8-bit copy (no-op when none)."""
    _check(lib.pf_weight_drop_i8(weight_arg(weight).ptr))


def weight_copy_f16(ctx: Context, weight: Weight, out) -> None:
    """out = the weight's fp16 cache, packed [n][k] (out's offset counts fp16 elements)."""
    w, vo = weight_arg(weight), c_view(out, "out")
    _check(lib.pf_weight_copy_f16(ctx_arg(ctx).ptr, w.ptr, vo))


def new_prewarm_report():
    """A `pf_prewarm_report *` filled by its _init function."""
    rep = ffi.new("pf_prewarm_report *")
    _check(lib.pf_prewarm_report_init(rep, ffi.sizeof("pf_prewarm_report")))
    return rep


def prewarm_report_dict(rep) -> dict:
    """A pf_prewarm_report as a dict (device_ms: the dequantization launches on the device, from
    after the first piece of the cache is allocated; elapsed_ms: the whole call, host included)."""
    return {
        "armed": bool(rep.armed), "weights_total": rep.weights_total,
        "weights_cached": rep.weights_cached, "weights_added": rep.weights_added,
        "bytes_total": rep.bytes_total, "bytes_needed": rep.bytes_needed,
        "bytes_added": rep.bytes_added, "bytes_read": rep.bytes_read,
        "free_bytes": rep.free_bytes, "headroom_bytes": rep.headroom_bytes,
        "elapsed_ms": rep.elapsed_ms, "device_ms": rep.device_ms,
        "reason": ffi.string(rep.reason).decode("utf-8", "replace"),
        "partial": bool(rep.partial),
        "rule_rows": rep.rule_rows, "weights_blocks": rep.weights_blocks,
        "rule_ratio_min": rep.rule_ratio_min, "rule_ratio_max": rep.rule_ratio_max,
        "why": ffi.string(rep.why).decode("utf-8", "replace"),
    }


def prewarm_f16(ctx: Context, weights, headroom_bytes: int = 0) -> dict:
    """All-or-nothing fp16 caching of `weights`; returns the report as a dict."""
    weights = [weight_arg(w, "weights[]") for w in weights]
    arr = ffi.new("pf_weight *[]", max(len(weights), 1))
    for i, w in enumerate(weights):
        arr[i] = w.ptr
    rep = new_prewarm_report()
    _check(lib.pf_prewarm_f16(ctx_arg(ctx).ptr, arr, len(weights), int(headroom_bytes), rep))
    return prewarm_report_dict(rep)


# ------------------------------------------------------------------ NumPy level


def _ids_array(ids) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise InvalidArgumentError(f"ids: expected a 1-D array of token ids, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InvalidArgumentError(f"ids: expected integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
        raise InvalidArgumentError("ids: values do not fit in int32")
    return np.ascontiguousarray(ids, dtype=np.int32)


def _ld(name: str, ld, default: int) -> int:
    if ld is None:
        return default
    if isinstance(ld, bool) or not isinstance(ld, (int, np.integer)) or ld < default:
        raise InvalidArgumentError(f"{name}: {ld!r} must be an int >= {default}")
    return int(ld)


def dequantize_np(ctx: Context, weight: Weight, *, f16: bool = False) -> np.ndarray:
    """The weight as a float32 (or float16) [n, k] array."""
    weight_arg(weight)
    dt = np.float16 if f16 else np.float32
    with out_buffer(ctx, (weight.n, weight.k), dt, None, "out") as out:
        dequantize(ctx, weight, out, f16=f16)
        return download(ctx, out, dt, (weight.n, weight.k))


def weight_f16_np(ctx: Context, weight: Weight) -> np.ndarray:
    """The weight's fp16 cache as a float16 [n, k] array (copied into a NaN-poisoned buffer)."""
    weight_arg(weight)
    with out_buffer(ctx, (weight.n, weight.k), np.float16, None, "out") as out:
        weight_copy_f16(ctx, weight, out)
        return download(ctx, out, np.float16, (weight.n, weight.k))


def embed_np(ctx: Context, table: Weight, ids, *, ldo: int | None = None) -> np.ndarray:
    """Rows `ids` of the table, float32 [len(ids), ldo] (columns >= k stay NaN)."""
    weight_arg(table, "table")
    ids = _ids_array(ids)
    ldo = _ld("ldo", ldo, table.k)
    rows = ids.size
    with out_buffer(ctx, (rows, ldo), np.float32, None, "out") as out:
        embed(ctx, table, ids, View(out, 0, ldo))
        return download(ctx, out, np.float32, (rows, ldo))


def project_np(ctx: Context, weight: Weight, x: np.ndarray, *, leg="default",
               accumulate: bool = False, y: np.ndarray | None = None,
               ldy: int | None = None) -> np.ndarray:
    """x @ W.T (+ y when accumulate). x: float32 [rows, ldx >= k] (its first k columns are
    used). y: the initial output [rows, ldy] (None = NaN-poisoned, n columns). Returns the
    whole [rows, ldy] output buffer, gap columns included."""
    weight_arg(weight)
    x = array_arg(x, "x", ndim=2, min_cols=weight.k)
    rows, ldx = x.shape
    ldy = _ld("ldy", y.shape[1] if (ldy is None and y is not None) else ldy, weight.n)
    with upload(ctx, x) as xb, out_buffer(ctx, (rows, ldy), np.float32, y, "y") as yb:
        project(ctx, weight, View(xb, 0, ldx), View(yb, 0, ldy), rows, accumulate=accumulate,
                leg=leg)
        return download(ctx, yb, np.float32, (rows, ldy))


def project_f16x_np(ctx: Context, weight: Weight, x16: np.ndarray, inv: np.ndarray | None = None,
                    *, accumulate: bool = False, y: np.ndarray | None = None) -> np.ndarray:
    """:func:`project_f16x` on arrays: x16 float16 [rows, k], inv float32 [rows] or None, y the
    initial output float32 [rows, n] (None = NaN-poisoned). Returns y [rows, n]."""
    weight_arg(weight)
    x16 = array_arg(x16, "x16", ndim=2, dtypes=(np.float16,), cols=weight.k)
    rows = x16.shape[0]
    if inv is not None:
        inv = array_arg(inv, "inv", ndim=1)
        if inv.shape[0] != rows:
            raise InvalidArgumentError(f"inv: {inv.shape[0]} row scales, x16 has {rows} rows")
    with upload(ctx, x16) as xb, out_buffer(ctx, (rows, weight.n), np.float32, y, "y") as yb:
        if inv is None:
            project_f16x(ctx, weight, View(xb), None, View(yb), rows, accumulate=accumulate)
        else:
            with upload(ctx, inv) as ib:
                project_f16x(ctx, weight, View(xb), View(ib), View(yb), rows, accumulate=accumulate)
        return download(ctx, yb, np.float32, (rows, weight.n))


def qgemm_np(ctx: Context, weight: Weight, x: np.ndarray, *, accumulate: bool = False,
             y: np.ndarray | None = None, ldy: int | None = None) -> np.ndarray:
    """Fused Q4_0 / Q8_0 GEMM: the contract of :func:`project_np`."""
    weight_arg(weight)
    x = array_arg(x, "x", ndim=2, min_cols=weight.k)
    rows, ldx = x.shape
    ldy = _ld("ldy", y.shape[1] if (ldy is None and y is not None) else ldy, weight.n)
    with upload(ctx, x) as xb, out_buffer(ctx, (rows, ldy), np.float32, y, "y") as yb:
        qgemm(ctx, weight, View(xb, 0, ldx), View(yb, 0, ldy), rows, accumulate=accumulate)
        return download(ctx, yb, np.float32, (rows, ldy))


def qgemm_swiglu_np(ctx: Context, weight: Weight, x: np.ndarray, *,
                    ldo: int | None = None) -> np.ndarray:
    """silu(x @ Wg.T) * (x @ Wu.T) with Wg = rows [0, n) and Wu = rows [n, 2n) of the weight."""
    weight_arg(weight)
    x = array_arg(x, "x", ndim=2, min_cols=weight.k)
    rows, ldx = x.shape
    ldo = _ld("ldo", ldo, weight.n // 2)
    with upload(ctx, x) as xb, out_buffer(ctx, (rows, ldo), np.float32, None, "out") as ob:
        qgemm_swiglu(ctx, weight, View(xb, 0, ldx), View(ob, 0, ldo), rows)
        return download(ctx, ob, np.float32, (rows, ldo))


def qgemv_np(ctx: Context, weight: Weight, x: np.ndarray, *, accumulate: bool = False,
             y: np.ndarray | None = None) -> np.ndarray:
    """One row: W @ x (+ y when accumulate). x: float32 [k]; returns float32 [n]."""
    weight_arg(weight)
    x = array_arg(x, "x", ndim=1, cols=weight.k)
    init = None if y is None else array_arg(y, "y", ndim=1, cols=weight.n)
    with upload(ctx, x) as xb, out_buffer(ctx, (weight.n,), np.float32, init, "y") as yb:
        qgemv(ctx, weight, xb, yb, accumulate=accumulate)
        return download(ctx, yb, np.float32, (weight.n,))


__all__ = ["LEGS", "leg_id", "gemm_default_leg", "gemm_set_default_leg", "dequantize", "embed",
           "project", "project_f16x", "qgemm", "qgemm_swiglu", "qgemv", "weight_cache_f16", "weight_drop_f16",
           "weight_cache_i8", "weight_drop_i8",
           "weight_copy_f16", "new_prewarm_report", "prewarm_report_dict", "prewarm_f16",
           "weight_f16_np", "dequantize_np", "embed_np", "project_np", "project_f16x_np", "qgemm_np",
           "qgemm_swiglu_np", "qgemv_np"]
