"""Attention over a resident KV cache, and the LM-head helper (argmax), at kernel level.

KV cache of one layer: two buffers K and V, each ``[capacity][n_kv_heads * head_dim]`` row-major,
fp16 (``"f16"``, default) or fp32 (``"f32"``, the exact path). Query head ``h`` reads KV head
``h // (n_heads // n_kv_heads)`` (grouped GQA).

Paged KV (``page_table``, ``page_rows``): the K and V buffers are pools of pages of ``page_rows``
rows (a multiple of 64) and an int32 page table names the pool page of each page of positions:
position ``p`` lies at pool row ``table[p // page_rows] * page_rows + p % page_rows``.
:func:`paginate` makes pools and a table out of contiguous caches (for tests and benchmarks).

Buffer level (named after the C entry; data stays on the device): :func:`kv_write`,
:func:`attention`, :func:`argmax`, :func:`attention_plan`, :func:`attention_options`. NumPy level
(arrays in, arrays out; outputs poisoned with NaN before the kernel runs): :func:`kv_write_np`,
:func:`attention_np`, :func:`argmax_np`.
"""
from __future__ import annotations

import math

import numpy as np

from .._errors import _check
from .._ffi import enum_map, enum_value, ffi, lib
from ..core import Buffer, Context
from ..errors import InvalidArgumentError
from ._common import (View, array_arg, buffer_arg, c_view, ctx_arg, download, int_arg, new_args,
                      poisoned, set_view, upload)

KV_DTYPES = enum_map("pf_kv_dtype", "PF_KV_")        # {"f16": 0, "f32": 1}
PATHS = enum_map("pf_attn_path", "PF_ATTN_")         # {"auto": 0, "cublas": 1, "flash": 2}
KERNELS = enum_map("pf_attn_kernel", "PF_ATTN_KERNEL_")  # {"auto": 0, "mma": 1, "wgmma": 2}
_PATH_NAMES = {v: k for k, v in PATHS.items()}
_NP_KV = {KV_DTYPES["f16"]: np.float16, KV_DTYPES["f32"]: np.float32}


def kv_dtype_id(kv_dtype) -> int:
    """A pf_kv_dtype value from a name ("f16"), a NumPy dtype (float16 / float32) or a value."""
    if isinstance(kv_dtype, (type, np.dtype)) and np.dtype(kv_dtype) in (np.float16, np.float32):
        return KV_DTYPES["f16" if np.dtype(kv_dtype) == np.float16 else "f32"]
    return enum_value(kv_dtype, KV_DTYPES, "kv_dtype")


def path_id(path) -> int:
    """A pf_attn_path value from a name ("flash") or one of the values."""
    return enum_value(path, PATHS, "path")


def kernel_id(kernel) -> int:
    """A pf_attn_kernel value from a name ("auto", "mma", "wgmma") or one of the values."""
    return enum_value(kernel, KERNELS, "kernel")


def attention_options(*, n_heads: int, n_kv_heads: int, head_dim: int, rows: int, pos0: int = 0,
                      scale: float = 0.0, kv_dtype="f16", path="auto", q_head_stride: int = 0,
                      q_row_stride: int = 0, out_row_stride: int = 0, rows_per_pass: int = 0,
                      scores_budget_bytes: int = 0, kernel="auto", position_on_device: bool = False,
                      page_rows: int = 0):
    """A filled ``pf_attention_options`` (cffi struct). The library validates the values.
    ``kernel`` picks the flash kernel ("auto": the context's tuning.attn_kernel, else wgmma on
    Hopper with an sm_90a build, else mma; "mma"; "wgmma": UNSUPPORTED at run time where it is not
    built or the device is not compute capability 9.0). ``position_on_device`` (testing) runs the
    flash path as a session's CUDA graph does: pos0 read from device memory. ``page_rows`` > 0:
    paged caches (:func:`attention` with a ``page_table``)."""
    o = new_args("pf_attention_options")
    o.n_heads, o.n_kv_heads, o.head_dim = int(n_heads), int(n_kv_heads), int(head_dim)
    o.rows, o.pos0, o.scale = int(rows), int(pos0), float(scale)
    o.kv_dtype, o.path = kv_dtype_id(kv_dtype), path_id(path)
    o.q_head_stride, o.q_row_stride, o.out_row_stride = (int(q_head_stride), int(q_row_stride),
                                                         int(out_row_stride))
    o.rows_per_pass, o.scores_budget_bytes = int(rows_per_pass), int(scores_budget_bytes)
    o.kernel = kernel_id(kernel)
    o.position_on_device = 1 if position_on_device else 0
    o.page_rows = int(page_rows)
    return o


def attention_plan(**kw) -> dict:
    """What :func:`attention` would run for these options (keywords of
    :func:`attention_options`): ``{"path": "cublas" | "flash", "rows_per_pass": int,
    "workspace_bytes": int}``. No device needed."""
    o = attention_options(**kw)
    p, r, w = ffi.new("int32_t *"), ffi.new("int64_t *"), ffi.new("size_t *")
    _check(lib.pf_attention_plan(o, p, r, w))
    return {"path": _PATH_NAMES[int(p[0])], "rows_per_pass": int(r[0]), "workspace_bytes": int(w[0])}


# ----------------------------------------------------------------------------- buffer level

def kv_write(ctx: Context, k, v, k_cache: Buffer, v_cache: Buffer, *, rows: int, kv_dim: int,
             pos0: int, kv_dtype="f16", page_table: Buffer | None = None, page_rows: int = 0) -> None:
    """Write fp32 rows ``k``/``v`` (Views or Buffers, [rows][ld], ld 0 = kv_dim) into the caches
    (whole buffers) at positions ``pos0 .. pos0+rows-1``, converted to ``kv_dtype`` (fp16
    saturates at +-65504). With ``page_table`` (int32 Buffer) the caches are pools of pages of
    ``page_rows`` rows; the pages written must be distinct."""
    a = new_args("pf_kv_write_args")
    set_view(a.k, k, "k")
    set_view(a.v, v, "v")
    a.k_cache, a.v_cache = buffer_arg(k_cache, "k_cache").ptr, buffer_arg(v_cache, "v_cache").ptr
    a.rows, a.kv_dim, a.pos0 = int(rows), int(kv_dim), int(pos0)
    a.kv_dtype = kv_dtype_id(kv_dtype)
    if page_table is not None:
        a.page_table = buffer_arg(page_table, "page_table").ptr
    a.page_rows = int(page_rows)
    _check(lib.pf_kv_write(ctx_arg(ctx).ptr, a))


def attention(ctx: Context, q: Buffer, k_cache: Buffer, v_cache: Buffer, out: Buffer, *,
              page_table: Buffer | None = None, **kw) -> None:
    """Causal grouped attention of ``rows`` query rows at ``pos0..`` over cache rows
    ``0..pos0+rows-1`` into ``out`` ([rows][out_row_stride] fp32). q and out are whole buffers
    (their strides are options). Keywords: see :func:`attention_options`. With ``page_table``
    (int32 Buffer; ``page_rows`` > 0) the caches are pools of pages (pf_attention_paged)."""
    o = attention_options(**kw)
    bufs = [buffer_arg(b, n).ptr for b, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"))]
    if page_table is None:
        _check(lib.pf_attention(ctx_arg(ctx).ptr, o, *bufs, buffer_arg(out, "out").ptr))
    else:
        _check(lib.pf_attention_paged(ctx_arg(ctx).ptr, o, *bufs, buffer_arg(page_table, "page_table").ptr,
                                      buffer_arg(out, "out").ptr))


def argmax(ctx: Context, x, out_ids, *, rows: int, n: int) -> None:
    """``out_ids[r] = argmax(x[r, :n])`` (int32 vector; ties -> lowest index, NaN ranks highest).
    x: a View or Buffer, [rows][ld] with ld 0 = n."""
    vx, vo = c_view(x, "x"), c_view(out_ids, "out_ids")
    _check(lib.pf_argmax(ctx_arg(ctx).ptr, vx, vo, int(rows), int(n)))


# ------------------------------------------------------------------------------ NumPy level

def kv_write_np(ctx: Context, k: np.ndarray, v: np.ndarray, k_cache: np.ndarray,
                v_cache: np.ndarray, *, pos0: int, page_table: np.ndarray | None = None,
                page_rows: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Upload the caches ([capacity][kv_dim], float16 or float32, both the same), write the fp32
    rows ``k``, ``v`` ([rows][kv_dim]) at ``pos0`` on the device, and return both caches. With
    ``page_table`` (int32) the caches are pools of pages of ``page_rows`` rows."""
    k = array_arg(k, "k", ndim=2)
    v = array_arg(v, "v", ndim=2)
    k_cache = array_arg(k_cache, "k_cache", ndim=2, dtypes=(np.float16, np.float32))
    v_cache = array_arg(v_cache, "v_cache", ndim=2, dtypes=(k_cache.dtype,))
    if k.shape != v.shape:
        raise InvalidArgumentError(f"v: shape {v.shape} differs from k's {k.shape}")
    if k_cache.shape != v_cache.shape or k_cache.shape[1] != k.shape[1]:
        raise InvalidArgumentError(f"k_cache/v_cache: shapes {k_cache.shape}/{v_cache.shape} must "
                                   f"be equal with kv_dim = {k.shape[1]} columns")
    pos0 = int_arg("pos0", pos0)
    rows, kv_dim = k.shape
    if page_table is None and pos0 + rows > k_cache.shape[0]:
        raise InvalidArgumentError(f"pos0: {pos0} + rows {rows} exceeds the cache capacity "
                                   f"{k_cache.shape[0]}")
    table = _table_arg(page_table)
    with upload(ctx, k) as bk, upload(ctx, v) as bv, upload(ctx, k_cache) as bkc, \
            upload(ctx, v_cache) as bvc, upload(ctx, table) as bt:
        kv_write(ctx, bk, bv, bkc, bvc, rows=rows, kv_dim=kv_dim, pos0=pos0,
                 kv_dtype=k_cache.dtype, page_table=bt if page_table is not None else None,
                 page_rows=page_rows)
        return (download(ctx, bkc, k_cache.dtype, k_cache.shape),
                download(ctx, bvc, v_cache.dtype, v_cache.shape))


def attention_np(ctx: Context, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, *,
                 n_heads: int, n_kv_heads: int, head_dim: int, pos0: int, q_head_stride: int = 0,
                 scale: float = 0.0, path="auto", rows_per_pass: int = 0,
                 scores_budget_bytes: int = 0, out_row_stride: int = 0,
                 kernel="auto", position_on_device: bool = False,
                 page_table: np.ndarray | None = None, page_rows: int = 0) -> np.ndarray:
    """Causal grouped attention on the device.

    q: float32 [rows][q_row_stride] (row t = position pos0 + t; head h at column h*q_head_stride).
    k_cache, v_cache: [capacity][n_kv_heads*head_dim], float16 (fp16 cache) or float32 (fp32
    cache), rows 0..pos0+rows-1 filled; or, with ``page_table`` (int32), pools of pages of
    ``page_rows`` rows holding those positions (:func:`paginate`). Returns float32
    [rows][n_heads*head_dim] (the output buffer is poisoned with NaN first, so unwritten elements
    show)."""
    q = array_arg(q, "q", ndim=2)
    k_cache = array_arg(k_cache, "k_cache", ndim=2, dtypes=(np.float16, np.float32))
    v_cache = array_arg(v_cache, "v_cache", ndim=2, dtypes=(k_cache.dtype,))
    n_heads = int_arg("n_heads", n_heads, minimum=1)
    n_kv_heads = int_arg("n_kv_heads", n_kv_heads, minimum=1)
    head_dim, pos0 = int_arg("head_dim", head_dim, minimum=1), int_arg("pos0", pos0)
    kv_dim = n_kv_heads * head_dim
    if k_cache.shape != v_cache.shape or k_cache.shape[1] != kv_dim:
        raise InvalidArgumentError(f"k_cache/v_cache: shapes {k_cache.shape}/{v_cache.shape} must be "
                                   f"equal with n_kv_heads*head_dim = {kv_dim} columns")
    rows = q.shape[0]
    if page_table is None and pos0 + rows > k_cache.shape[0]:
        raise InvalidArgumentError(f"pos0: {pos0} + rows {rows} exceeds the cache capacity "
                                   f"{k_cache.shape[0]}")
    ldo = out_row_stride or n_heads * head_dim
    table = _table_arg(page_table)
    with upload(ctx, q) as bq, upload(ctx, k_cache) as bk, upload(ctx, v_cache) as bv, \
            upload(ctx, table) as bt, poisoned(ctx, max(rows, 1) * ldo * 4) as bo:
        attention(ctx, bq, bk, bv, bo, page_table=bt if page_table is not None else None,
                  page_rows=page_rows, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                  rows=rows, pos0=pos0, scale=scale, kv_dtype=k_cache.dtype, path=path,
                  q_head_stride=q_head_stride, q_row_stride=q.shape[1], out_row_stride=ldo,
                  rows_per_pass=rows_per_pass, scores_budget_bytes=scores_budget_bytes,
                  kernel=kernel, position_on_device=position_on_device)
        out = download(ctx, bo, np.float32, (rows, ldo))
    return out[:, :n_heads * head_dim]


def _table_arg(page_table) -> np.ndarray:
    """The page table as int32 (an empty one when there is none: nothing is uploaded for it)."""
    if page_table is None:
        return np.zeros(0, np.int32)
    return array_arg(np.asarray(page_table), "page_table", ndim=1, dtypes=(np.int32,))


def tile_page_rows(head_dim: int) -> int:
    """The least page size (a multiple of 64) that the wgmma kernel's key tiles divide (176-key
    tiles at head_dim 128, 80 at 256: attention_wgmma.cu), so that no tile crosses a page and
    each loads as one box (across pages it loads in 16-row pieces, slower); 64 (the pages'
    granule) for head dims the flash kernels do not serve."""
    tile = {128: 176, 256: 80}.get(int(head_dim), 64)
    return tile * 64 // math.gcd(tile, 64)


def paginate(k_cache: np.ndarray, v_cache: np.ndarray, *, page_rows: int, rng: np.random.Generator,
             spare_pages: int = 3, fill=np.nan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pools and a page table holding the rows of contiguous caches ([n][kv_dim]): the
    ceil(n / page_rows) pages in a random order among ``spare_pages`` more, every row no page of
    the table holds (the spare pages, the last page's tail) set to ``fill``. Returns (k_pool,
    v_pool, table)."""
    n, kv_dim = k_cache.shape
    n_pages = -(-n // page_rows)
    total = n_pages + spare_pages
    table = rng.permutation(total)[:n_pages].astype(np.int32)
    pools = []
    for c in (k_cache, v_cache):
        pool = np.full((total * page_rows, kv_dim), fill, c.dtype)
        for i, pg in enumerate(table):
            rows = c[i * page_rows:(i + 1) * page_rows]
            pool[pg * page_rows:pg * page_rows + rows.shape[0]] = rows
        pools.append(pool)
    return pools[0], pools[1], table


def argmax_np(ctx: Context, x: np.ndarray) -> np.ndarray:
    """Row-wise argmax of a float32 [rows][n] array on the device (int32 [rows])."""
    x = array_arg(x, "x", ndim=2)
    rows, n = x.shape
    if n < 1:
        raise InvalidArgumentError(f"x: shape {x.shape} has no columns")
    with upload(ctx, x) as bx, poisoned(ctx, rows * 4) as bo:
        argmax(ctx, bx, bo, rows=rows, n=n)
        return download(ctx, bo, np.int32, (rows,))


__all__ = ["KV_DTYPES", "PATHS", "KERNELS", "View", "kv_dtype_id", "path_id", "kernel_id",
           "attention_options", "attention_plan", "kv_write", "attention", "argmax", "kv_write_np",
           "attention_np", "argmax_np", "paginate", "tile_page_rows"]
