"""Attention over a resident KV cache, and the LM-head helper (argmax), at kernel level.

KV cache of one layer: two buffers K and V, each ``[capacity][n_kv_heads * head_dim]`` row-major,
fp16 (``"f16"``, default) or fp32 (``"f32"``, the exact path). Query head ``h`` reads KV head
``h // (n_heads // n_kv_heads)`` (grouped GQA).

Buffer level (data stays on the device): :func:`kv_write`, :func:`attention`, :func:`argmax_rows`,
:func:`plan`. NumPy level (arrays in, arrays out; outputs poisoned with NaN before the kernel runs):
:func:`kv_write_np`, :func:`attention_np`, :func:`argmax_rows_np`.
"""
from __future__ import annotations

import numpy as np

from .._errors import _check
from .._ffi import ffi, lib
from ..core import Buffer, Context
from ..errors import InvalidArgumentError

KV_DTYPES = {"f16": 0, "f32": 1}
PATHS = {"auto": 0, "cublas": 1, "flash": 2}
_PATH_NAMES = {v: k for k, v in PATHS.items()}
_NP_KV = {0: np.float16, 1: np.float32}


def _kv_dtype_id(kv_dtype) -> int:
    if isinstance(kv_dtype, str):
        try:
            return KV_DTYPES[kv_dtype.lower()]
        except KeyError:
            raise InvalidArgumentError(f"kv_dtype: {kv_dtype!r} is not one of {list(KV_DTYPES)}")
    if isinstance(kv_dtype, (type, np.dtype)) and np.dtype(kv_dtype) in (np.float16, np.float32):
        return 0 if np.dtype(kv_dtype) == np.float16 else 1
    if kv_dtype in (0, 1):
        return int(kv_dtype)
    raise InvalidArgumentError(f"kv_dtype: {kv_dtype!r} is not 'f16', 'f32', 0 or 1")


def _path_id(path) -> int:
    if isinstance(path, str):
        try:
            return PATHS[path.lower()]
        except KeyError:
            raise InvalidArgumentError(f"path: {path!r} is not one of {list(PATHS)}")
    if path in (0, 1, 2):
        return int(path)
    raise InvalidArgumentError(f"path: {path!r} is not 'auto', 'cublas', 'flash', 0, 1 or 2")


def _int(name: str, value, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}: expected an int, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name}: {value} must be >= {minimum}")
    return int(value)


def options(*, n_heads: int, n_kv_heads: int, head_dim: int, rows: int, pos0: int = 0,
            scale: float = 0.0, kv_dtype="f16", path="auto", q_head_stride: int = 0,
            q_row_stride: int = 0, out_row_stride: int = 0, rows_per_pass: int = 0,
            scores_budget_bytes: int = 0):
    """A filled ``pf_attention_options`` (cffi struct). The library validates the values."""
    o = ffi.new("pf_attention_options *")
    _check(lib.pf_attention_options_init(o, ffi.sizeof("pf_attention_options")))
    o.n_heads, o.n_kv_heads, o.head_dim = int(n_heads), int(n_kv_heads), int(head_dim)
    o.rows, o.pos0, o.scale = int(rows), int(pos0), float(scale)
    o.kv_dtype, o.path = _kv_dtype_id(kv_dtype), _path_id(path)
    o.q_head_stride, o.q_row_stride, o.out_row_stride = (int(q_head_stride), int(q_row_stride),
                                                         int(out_row_stride))
    o.rows_per_pass, o.scores_budget_bytes = int(rows_per_pass), int(scores_budget_bytes)
    return o


def plan(**kw) -> dict:
    """What :func:`attention` would run for these options (keywords of :func:`options`):
    ``{"path": "cublas" | "flash", "rows_per_pass": int, "workspace_bytes": int}``. No device needed."""
    o = options(**kw)
    p, r, w = ffi.new("int32_t *"), ffi.new("int64_t *"), ffi.new("size_t *")
    _check(lib.pf_attention_plan(o, p, r, w))
    return {"path": _PATH_NAMES[int(p[0])], "rows_per_pass": int(r[0]), "workspace_bytes": int(w[0])}


# ----------------------------------------------------------------------------- buffer level

def kv_write(ctx: Context, k: Buffer, v: Buffer, k_cache: Buffer, v_cache: Buffer, *, rows: int,
             kv_dim: int, pos0: int, kv_dtype="f16", ldk: int = 0, ldv: int = 0) -> None:
    """Write fp32 rows ``k``/``v`` ([rows][ldk] / [rows][ldv]) into the caches at positions
    ``pos0 .. pos0+rows-1``, converted to ``kv_dtype`` (fp16 saturates at +-65504)."""
    _check(lib.pf_kv_write(ctx.ptr, k.ptr, int(ldk), v.ptr, int(ldv), int(rows), int(kv_dim),
                           k_cache.ptr, v_cache.ptr, _kv_dtype_id(kv_dtype), int(pos0)))


def attention(ctx: Context, q: Buffer, k_cache: Buffer, v_cache: Buffer, out: Buffer, **kw) -> None:
    """Causal grouped attention of ``rows`` query rows at ``pos0..`` over cache rows
    ``0..pos0+rows-1`` into ``out`` ([rows][out_row_stride] fp32). Keywords: see :func:`options`."""
    _check(lib.pf_attention(ctx.ptr, options(**kw), q.ptr, k_cache.ptr, v_cache.ptr, out.ptr))


def argmax_rows(ctx: Context, x: Buffer, out_ids: Buffer, *, rows: int, n: int, ld: int = 0) -> None:
    """``out_ids[r] = argmax(x[r, :n])`` (int32; ties -> lowest index, NaN ranks highest)."""
    _check(lib.pf_argmax_rows(ctx.ptr, x.ptr, int(rows), int(n), int(ld), out_ids.ptr))


# ------------------------------------------------------------------------------ NumPy level

def _array(name: str, arr, ndim: int, dtypes) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise InvalidArgumentError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.ndim != ndim:
        raise InvalidArgumentError(f"{name}: expected {ndim} dimensions, got shape {arr.shape}")
    if arr.dtype not in [np.dtype(d) for d in dtypes]:
        raise InvalidArgumentError(f"{name}: dtype {arr.dtype} (shape {arr.shape}) is not one of "
                                   f"{[np.dtype(d).name for d in dtypes]}")
    return np.ascontiguousarray(arr)


def kv_write_np(ctx: Context, k: np.ndarray, v: np.ndarray, k_cache: np.ndarray,
                v_cache: np.ndarray, *, pos0: int) -> tuple[np.ndarray, np.ndarray]:
    """Upload the caches ([capacity][kv_dim], float16 or float32, both the same), write the fp32
    rows ``k``, ``v`` ([rows][kv_dim]) at ``pos0`` on the device, and return both caches."""
    k = _array("k", k, 2, [np.float32])
    v = _array("v", v, 2, [np.float32])
    k_cache = _array("k_cache", k_cache, 2, [np.float16, np.float32])
    v_cache = _array("v_cache", v_cache, 2, [k_cache.dtype])
    if k.shape != v.shape:
        raise InvalidArgumentError(f"v: shape {v.shape} differs from k's {k.shape}")
    if k_cache.shape != v_cache.shape or k_cache.shape[1] != k.shape[1]:
        raise InvalidArgumentError(f"k_cache/v_cache: shapes {k_cache.shape}/{v_cache.shape} must "
                                   f"be equal with kv_dim = {k.shape[1]} columns")
    pos0 = _int("pos0", pos0)
    rows, kv_dim = k.shape
    if pos0 + rows > k_cache.shape[0]:
        raise InvalidArgumentError(f"pos0: {pos0} + rows {rows} exceeds the cache capacity "
                                   f"{k_cache.shape[0]}")
    with ctx.upload(k) as bk, ctx.upload(v) as bv, ctx.upload(k_cache) as bkc, \
            ctx.upload(v_cache) as bvc:
        kv_write(ctx, bk, bv, bkc, bvc, rows=rows, kv_dim=kv_dim, pos0=pos0,
                 kv_dtype="f16" if k_cache.dtype == np.float16 else "f32")
        return bkc.download(k_cache.dtype, k_cache.shape), bvc.download(v_cache.dtype, v_cache.shape)


def attention_np(ctx: Context, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, *,
                 n_heads: int, n_kv_heads: int, head_dim: int, pos0: int, q_head_stride: int = 0,
                 scale: float = 0.0, path="auto", rows_per_pass: int = 0,
                 scores_budget_bytes: int = 0, out_row_stride: int = 0) -> np.ndarray:
    """Causal grouped attention on the device.

    q: float32 [rows][q_row_stride] (row t = position pos0 + t; head h at column h*q_head_stride).
    k_cache, v_cache: [capacity][n_kv_heads*head_dim], float16 (fp16 cache) or float32 (fp32
    cache), rows 0..pos0+rows-1 filled. Returns float32 [rows][n_heads*head_dim] (the output buffer
    is poisoned with NaN first, so unwritten elements show)."""
    q = _array("q", q, 2, [np.float32])
    k_cache = _array("k_cache", k_cache, 2, [np.float16, np.float32])
    v_cache = _array("v_cache", v_cache, 2, [k_cache.dtype])
    n_heads, n_kv_heads = _int("n_heads", n_heads, minimum=1), _int("n_kv_heads", n_kv_heads, minimum=1)
    head_dim, pos0 = _int("head_dim", head_dim, minimum=1), _int("pos0", pos0)
    kv_dim = n_kv_heads * head_dim
    if k_cache.shape != v_cache.shape or k_cache.shape[1] != kv_dim:
        raise InvalidArgumentError(f"k_cache/v_cache: shapes {k_cache.shape}/{v_cache.shape} must be "
                                   f"equal with n_kv_heads*head_dim = {kv_dim} columns")
    rows = q.shape[0]
    if pos0 + rows > k_cache.shape[0]:
        raise InvalidArgumentError(f"pos0: {pos0} + rows {rows} exceeds the cache capacity "
                                   f"{k_cache.shape[0]}")
    ldo = out_row_stride or n_heads * head_dim
    out = np.empty((max(rows, 1), ldo), np.float32)
    with ctx.upload(q if q.size else np.zeros(1, np.float32)) as bq, \
            ctx.upload(k_cache) as bk, ctx.upload(v_cache) as bv, ctx.buffer(out.nbytes) as bo:
        bo.poison()
        attention(ctx, bq, bk, bv, bo, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                  rows=rows, pos0=pos0, scale=scale,
                  kv_dtype="f16" if k_cache.dtype == np.float16 else "f32", path=path,
                  q_head_stride=q_head_stride, q_row_stride=q.shape[1], out_row_stride=ldo,
                  rows_per_pass=rows_per_pass, scores_budget_bytes=scores_budget_bytes)
        bo.download_into(out)
    return out[:rows, :n_heads * head_dim]


def argmax_rows_np(ctx: Context, x: np.ndarray) -> np.ndarray:
    """Row-wise argmax of a float32 [rows][n] array on the device (int32 [rows])."""
    x = _array("x", x, 2, [np.float32])
    rows, n = x.shape
    if n < 1:
        raise InvalidArgumentError(f"x: shape {x.shape} has no columns")
    out = np.empty(max(rows, 1), np.int32)
    with ctx.upload(x if x.size else np.zeros(1, np.float32)) as bx, ctx.buffer(out.nbytes) as bo:
        bo.poison()
        argmax_rows(ctx, bx, bo, rows=rows, n=n)
        bo.download_into(out)
    return out[:rows]


__all__ = ["KV_DTYPES", "PATHS", "options", "plan", "kv_write", "attention", "argmax_rows",
           "kv_write_np", "attention_np", "argmax_rows_np"]
