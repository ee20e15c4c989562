"""Dequantization, the embedding gather, projections (f32 / f16 legs), fp16 caches and prewarm,
and the fused Q4_0 / Q8_0 kernels.

Buffer-level calls (``*_into``) take pyprefill Buffers and Weights and leave results on the
device. The NumPy convenience calls (arrays in, arrays out) upload, poison the output buffer
with NaN, run, synchronize and download; the tests use them.

Shapes: a weight is ``[n][k]`` (GGUF, ``k`` contiguous); activations are float32
``[rows][ld]`` row-major with ``ld >= width``; ``y = x @ W.T``.
"""
from __future__ import annotations

import numpy as np

from .._errors import _check
from .._ffi import ffi, lib
from ..core import Buffer, Context, Weight, as_carray
from ..errors import InvalidArgumentError

LEGS = {"default": 0, "auto": 1, "f32": 2, "f16": 3, "int8": 4}
_LEG_NAMES = {v: k for k, v in LEGS.items()}


def leg_id(leg) -> int:
    """A pf_gemm_leg value from a name ("f16") or an int."""
    if isinstance(leg, str):
        try:
            return LEGS[leg.lower()]
        except KeyError:
            raise InvalidArgumentError(f"leg: unknown leg {leg!r} (known: {', '.join(LEGS)})") from None
    return int(leg)


def default_leg() -> str:
    """The process default leg ("auto", "f32" or "f16"), from env PREFILL_GEMM unless overridden."""
    out = ffi.new("int32_t *")
    _check(lib.pf_gemm_default_leg(out))
    return _LEG_NAMES[int(out[0])]


def set_default_leg(leg) -> None:
    """Override the process default leg; "default" restores the env value."""
    _check(lib.pf_gemm_set_default_leg(leg_id(leg)))


# ------------------------------------------------------------------ buffer level


def dequantize_into(ctx: Context, weight: Weight, out: Buffer, *, f16: bool = False) -> None:
    _check(lib.pf_dequantize(ctx.ptr, weight.ptr, out.ptr, 1 if f16 else 0))


def embed_rows_into(ctx: Context, table: Weight, ids: np.ndarray, out: Buffer, ldo: int) -> None:
    ids = _ids_array(ids)
    keep = as_carray(ids, "ids", np.int32)          # alive until the call returns
    ptr = ffi.cast("const int32_t *", keep) if ids.size else ffi.NULL
    _check(lib.pf_embed_rows(ctx.ptr, table.ptr, ptr, ids.size, out.ptr, ldo))


def project_into(ctx: Context, weight: Weight, x: Buffer, rows: int, ldx: int, y: Buffer, ldy: int,
                 *, accumulate: bool = False, leg="default") -> None:
    _check(lib.pf_project(ctx.ptr, weight.ptr, x.ptr, rows, ldx, y.ptr, ldy, 1 if accumulate else 0,
                          leg_id(leg)))


def qgemm_into(ctx: Context, weight: Weight, x: Buffer, rows: int, ldx: int, y: Buffer, ldy: int,
               *, accumulate: bool = False) -> None:
    _check(lib.pf_qgemm(ctx.ptr, weight.ptr, x.ptr, rows, ldx, y.ptr, ldy, 1 if accumulate else 0))


def qgemm_swiglu_into(ctx: Context, weight: Weight, x: Buffer, rows: int, ldx: int, out: Buffer,
                      ldo: int) -> None:
    _check(lib.pf_qgemm_swiglu(ctx.ptr, weight.ptr, x.ptr, rows, ldx, out.ptr, ldo))


def qgemv_into(ctx: Context, weight: Weight, x: Buffer, y: Buffer, *, accumulate: bool = False) -> None:
    _check(lib.pf_qgemv(ctx.ptr, weight.ptr, x.ptr, y.ptr, 1 if accumulate else 0))


def cache_f16(weight: Weight) -> None:
    """Cache the weight as fp16 (no-op when cached)."""
    _check(lib.pf_weight_cache_f16(weight.ptr))


def drop_f16(weight: Weight) -> None:
    _check(lib.pf_weight_drop_f16(weight.ptr))


def prewarm_f16(ctx: Context, weights, headroom_bytes: int = 0) -> dict:
    """All-or-nothing fp16 caching of `weights`; returns the report as a dict."""
    weights = list(weights)
    arr = ffi.new("pf_weight *[]", max(len(weights), 1))
    for i, w in enumerate(weights):
        arr[i] = w.ptr
    rep = ffi.new("pf_prewarm_report *")
    _check(lib.pf_prewarm_report_init(rep, ffi.sizeof("pf_prewarm_report")))
    _check(lib.pf_prewarm_f16(ctx.ptr, arr, len(weights), int(headroom_bytes), rep))
    return {
        "armed": bool(rep.armed), "weights_total": rep.weights_total,
        "weights_cached": rep.weights_cached, "weights_added": rep.weights_added,
        "bytes_total": rep.bytes_total, "bytes_needed": rep.bytes_needed,
        "bytes_added": rep.bytes_added, "free_bytes": rep.free_bytes,
        "headroom_bytes": rep.headroom_bytes, "elapsed_ms": rep.elapsed_ms,
        "reason": ffi.string(rep.reason).decode("utf-8", "replace"),
    }


# ------------------------------------------------------------------ NumPy convenience


def _ids_array(ids) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise InvalidArgumentError(f"ids: expected a 1-D array of token ids, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InvalidArgumentError(f"ids: expected integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
        raise InvalidArgumentError("ids: values do not fit in int32")
    return np.ascontiguousarray(ids, dtype=np.int32)


def _matrix(x, name: str, min_cols: int) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2:
        raise InvalidArgumentError(
            f"{name}: expected a 2-D float32 array, got {getattr(x, 'dtype', type(x).__name__)} "
            f"of shape {getattr(x, 'shape', None)}")
    if x.shape[1] < min_cols:
        raise InvalidArgumentError(f"{name}: shape {x.shape} has fewer than {min_cols} columns")
    as_carray(x, name, np.float32)
    return x


def _out_buffer(ctx: Context, rows: int, ld: int, init: np.ndarray | None, name: str) -> Buffer:
    buf = Buffer(ctx, max(rows * ld * 4, 4))
    if init is None:
        buf.poison()                      # NaN: unwritten elements show
    else:
        if init.shape != (rows, ld) or init.dtype != np.float32:
            raise InvalidArgumentError(f"{name}: expected float32 of shape {(rows, ld)}, got "
                                       f"{init.dtype} of shape {init.shape}")
        buf.upload(np.ascontiguousarray(init))
    return buf


def _download(ctx: Context, buf: Buffer, dtype, shape) -> np.ndarray:
    ctx.synchronize()
    return buf.download(dtype, shape)


def dequantize(ctx: Context, weight: Weight, *, f16: bool = False) -> np.ndarray:
    """The weight as a float32 (or float16) [n, k] array."""
    es = 2 if f16 else 4
    with Buffer(ctx, weight.n * weight.k * es) as out:
        out.poison()
        dequantize_into(ctx, weight, out, f16=f16)
        return _download(ctx, out, np.float16 if f16 else np.float32, (weight.n, weight.k))


def embed_rows(ctx: Context, table: Weight, ids, *, ldo: int | None = None) -> np.ndarray:
    """Rows `ids` of the table, float32 [len(ids), ldo] (columns >= k stay NaN)."""
    ids = _ids_array(ids)
    ldo = table.k if ldo is None else int(ldo)
    rows = ids.size
    with _out_buffer(ctx, rows, ldo, None, "out") as out:
        embed_rows_into(ctx, table, ids, out, ldo)
        return _download(ctx, out, np.float32, (rows, ldo))


def project(ctx: Context, weight: Weight, x: np.ndarray, *, leg="default", accumulate: bool = False,
            y: np.ndarray | None = None, ldy: int | None = None) -> np.ndarray:
    """x @ W.T (+ y when accumulate). x: float32 [rows, ldx >= k] (its first k columns are
    used). y: the initial output [rows, ldy] (None = NaN-poisoned, n columns). Returns the
    whole [rows, ldy] output buffer, gap columns included."""
    x = _matrix(x, "x", weight.k)
    rows, ldx = x.shape
    ldy = (y.shape[1] if y is not None else weight.n) if ldy is None else int(ldy)
    with ctx.upload(x) as xb, _out_buffer(ctx, rows, ldy, y, "y") as yb:
        project_into(ctx, weight, xb, rows, ldx, yb, ldy, accumulate=accumulate, leg=leg)
        return _download(ctx, yb, np.float32, (rows, ldy))


def qgemm(ctx: Context, weight: Weight, x: np.ndarray, *, accumulate: bool = False,
          y: np.ndarray | None = None, ldy: int | None = None) -> np.ndarray:
    """Fused Q4_0 / Q8_0 GEMM: same contract as project()."""
    x = _matrix(x, "x", weight.k)
    rows, ldx = x.shape
    ldy = (y.shape[1] if y is not None else weight.n) if ldy is None else int(ldy)
    with ctx.upload(x) as xb, _out_buffer(ctx, rows, ldy, y, "y") as yb:
        qgemm_into(ctx, weight, xb, rows, ldx, yb, ldy, accumulate=accumulate)
        return _download(ctx, yb, np.float32, (rows, ldy))


def qgemm_swiglu(ctx: Context, weight: Weight, x: np.ndarray, *, ldo: int | None = None) -> np.ndarray:
    """silu(x @ Wg.T) * (x @ Wu.T) with Wg = rows [0, n) and Wu = rows [n, 2n) of the weight."""
    x = _matrix(x, "x", weight.k)
    rows, ldx = x.shape
    n = weight.n // 2
    ldo = n if ldo is None else int(ldo)
    with ctx.upload(x) as xb, _out_buffer(ctx, rows, ldo, None, "out") as ob:
        qgemm_swiglu_into(ctx, weight, xb, rows, ldx, ob, ldo)
        return _download(ctx, ob, np.float32, (rows, ldo))


def qgemv(ctx: Context, weight: Weight, x: np.ndarray, *, accumulate: bool = False,
          y: np.ndarray | None = None) -> np.ndarray:
    """One row: W @ x (+ y when accumulate). x: float32 [k]; returns float32 [n]."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.shape != (weight.k,):
        raise InvalidArgumentError(f"x: expected float32 of shape ({weight.k},), got "
                                   f"{getattr(x, 'dtype', type(x).__name__)} of shape {getattr(x, 'shape', None)}")
    init = None if y is None else np.asarray(y).reshape(1, -1)
    with ctx.upload(np.ascontiguousarray(x)) as xb, _out_buffer(ctx, 1, weight.n, init, "y") as yb:
        qgemv_into(ctx, weight, xb, yb, accumulate=accumulate)
        return _download(ctx, yb, np.float32, (weight.n,))


__all__ = ["LEGS", "leg_id", "default_leg", "set_default_leg", "dequantize_into", "embed_rows_into",
           "project_into", "qgemm_into", "qgemm_swiglu_into", "qgemv_into", "cache_f16", "drop_f16",
           "prewarm_f16", "dequantize", "embed_rows", "project", "qgemm", "qgemm_swiglu", "qgemv"]
