"""Causal grouped attention over an fp16 KV cache against torch `scaled_dot_product_attention`
(fp16), for H16/Hkv4/D256 (qwen35-4b), H32/Hkv8/D128 (qwen3-4b) and H64/Hkv8/D128 (issue 40's
second hd128 shape; not with --quick): T new rows at position 0
for each length, and 2048 new rows at pos0 = 30720 (a chunk deep into a long prompt). Ours in
one run: both flash kernels by name ("ours flash wgmma": the Hopper kernel, skipped with the
reason where the device or build lacks it; "ours flash mma": the mma.sync kernel) and the cuBLAS
path (up to 8192 keys: past that its passes only measure the scores traffic); "paged P"
variants run the same kernels over paged caches (pages of P rows in a random order: the prefix
cache's form, issue 39), at 256 rows (the wgmma kernel's key tiles then often cross a page and
load in 16-row pieces) and at its tiles' multiple ("tile": kernels.attention.tile_page_rows, no
tile crosses a page); pf_attention_paged reads and checks the page table first (a synchronous
copy), which these times include. Beside torch SDPA's own choice, the same call with the backend
pinned to cuDNN and to flash (`torch.nn.attention.sdpa_kernel`; a backend that cannot run the case
is a skipped line: issue 40 asks for both in the same run). Each row's ratio is the unpinned SDPA
time / ours (> 1: ours faster). TF/s
count the causal FLOPs once: 4 x H x D x (query, key) pairs under the mask. The issue-10 table:
    pyprefill bench kernels --families attention --lengths 2048,8192,32768 --out DIR"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..formats.synth import preset_desc
from ..kernels import attention as K

SHAPES = ("qwen35-4b", "qwen3-4b")
# Attention shapes without a synth preset: (label, query heads, KV heads, head dim). Issue 40's
# hd128 targets name 64 query heads on 8 KV heads (a 32B-class model's attention) beside
# qwen3-4b's 32 on 8.
EXTRA_SHAPES = (("64q/8kv", 64, 8, 128),)
# (label, path, flash kernel, page rows: 0 = contiguous caches, "tile" = the tiles' multiple) of
# each timed variant of ours.
VARIANTS = (("flash wgmma", "flash", "wgmma", 0), ("flash mma", "flash", "mma", 0),
            ("cublas", "cublas", "auto", 0), ("flash wgmma paged 256", "flash", "wgmma", 256),
            ("flash wgmma paged tile", "flash", "wgmma", "tile"),
            ("flash mma paged 256", "flash", "mma", 256))
CUBLAS_MAX_KEYS = 8192
# torch SDPA's backends pinned beside its own choice: (label, torch.nn.attention.SDPBackend member).
PINNED = (("cuDNN", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"))
DEEP = (2048, 30720)          # (rows, pos0) of the chunk deep into a long prompt


# -- the wrapper calls: the only lines that touch pyprefill.kernels.attention -------------------
def _kv_write(ctx, k, v, k_cache, v_cache, rows, kv_dim, pos0, table=None, page_rows=0):
    K.kv_write(ctx, k, v, k_cache, v_cache, rows=rows, kv_dim=kv_dim, pos0=pos0, kv_dtype="f16",
               page_table=table, page_rows=page_rows)


def _tile_page_rows(head_dim):
    return K.tile_page_rows(head_dim)


def _attention(ctx, q, k_cache, v_cache, out, H, Hkv, D, rows, pos0, path, kernel, table=None,
               page_rows=0):
    K.attention(ctx, q, k_cache, v_cache, out, page_table=table, page_rows=page_rows, n_heads=H,
                n_kv_heads=Hkv, head_dim=D, rows=rows, pos0=pos0, kv_dtype="f16", path=path,
                kernel=kernel)
# ------------------------------------------------------------------------------------------------


def causal_pairs(rows: int, pos0: int) -> int:
    """(query, key) pairs under the causal mask: row t (position pos0 + t) sees pos0 + t + 1."""
    return rows * pos0 + rows * (rows + 1) // 2


def sdpa(torch, H: int, Hkv: int, D: int, rows: int, pos0: int, backend: str | None = None):
    """(call, how) for torch SDPA on random fp16 q [1,H,rows,D], k, v [1,Hkv,pos0+rows,D]: the
    first variant this torch runs (native GQA, else KV expanded; a lower-right causal mask when
    pos0 > 0); `backend` (an SDPBackend member's name) pins every call to that backend."""
    F = torch.nn.functional
    S = pos0 + rows
    q = torch.randn(1, H, rows, D, device="cuda", dtype=torch.float16)
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.float16)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.float16)
    ke, ve = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    sdpa = F.scaled_dot_product_attention
    if pos0 == 0:
        variants = [("enable_gqa", lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)),
                    ("KV expanded", lambda: sdpa(q, ke, ve, is_causal=True))]
    else:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(rows, S)
        variants = [("lower-right mask, enable_gqa",
                     lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True)),
                    ("lower-right mask, KV expanded", lambda: sdpa(q, ke, ve, attn_mask=mask))]
    if backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = getattr(SDPBackend, backend)

        def pin(fn):
            def run():
                with sdpa_kernel(be):
                    return fn()
            return run
        variants = [(how, pin(fn)) for how, fn in variants]
    errors = []
    for how, fn in variants:
        try:
            fn()
            torch.cuda.synchronize()
            return (lambda i: fn()), how
        except Exception as exc:   # noqa: BLE001  an older torch: try the next form
            errors.append(f"{how}: {type(exc).__name__}: {exc}")
    raise RuntimeError("; ".join(errors))


def time_variants(b, op: str, H: int, Hkv: int, D: int, rows: int, pos0: int, variants,
                  emit) -> None:
    """Times each (label, path, kernel, page rows) of ours on fresh inputs (caches filled up to
    pos0 + rows; paged ones through a random page order, one table per set) and calls
    emit(label, timing, sets); a variant that fails is one skipped line."""
    S, kv_dim = pos0 + rows, Hkv * D
    sizes = {pr: _tile_page_rows(D) if pr == "tile" else pr for *_, pr in variants if pr}
    S_pool = max([-(-S // P) * P for P in sizes.values()] + [S])  # whole pages of each size
    n = b.sets(4 * rows * H * D * 2 + 2 * S_pool * kv_dim * 2, max_sets=8)
    qs = [b.upload(b.rand(rows, H * D)) for _ in range(n)]
    outs = [b.buffer(4 * rows * H * D) for _ in range(n)]
    kcs = [b.buffer(2 * S_pool * kv_dim) for _ in range(n)]
    vcs = [b.buffer(2 * S_pool * kv_dim) for _ in range(n)]
    rng = np.random.default_rng(0)
    tables = {pr: [b.upload(rng.permutation(-(-S // P)).astype(np.int32)) for _ in range(n)]
              for pr, P in sizes.items()}
    for kc, vc in zip(kcs, vcs):                  # fill every cache row the queries may read
        k, v = b.upload(b.rand(S_pool, kv_dim)), b.upload(b.rand(S_pool, kv_dim))
        _kv_write(b.ctx, k, v, kc, vc, S_pool, kv_dim, 0)
        b.ctx.synchronize()
    for label, path, kernel, pr in variants:
        if path == "cublas" and S > CUBLAS_MAX_KEYS:
            continue
        def run(path=path, kernel=kernel, label=label, pr=pr):
            # A paged variant reads the same caches through its set's table: every page a
            # written one (up to the last page's tail), in a random order.
            t = b.time_ours(lambda i: _attention(b.ctx, qs[i % n], kcs[i % n], vcs[i % n],
                                                 outs[i % n], H, Hkv, D, rows, pos0, path, kernel,
                                                 tables[pr][i % n] if pr else None,
                                                 sizes.get(pr, 0)),
                            target_s=0.01)
            emit(label, t, n)
        b.rec.guard(f"{op} T={rows} {label}", run)


def case(b, d, rows: int, pos0: int) -> None:
    H, Hkv, D = d.n_head, d.n_head_kv, d.head_dim
    op = f"attention H{H}/Hkv{Hkv}/D{D}" + (f" pos0={pos0}" if pos0 else "")
    flops = 4 * H * D * causal_pairs(rows, pos0)
    note = f"causal, fp16 KV, fp32 q/out, {pos0 + rows} keys"
    peer = None
    if b.torch is not None:
        call, how = sdpa(b.torch, H, Hkv, D, rows, pos0)
        peer = b.add(op, rows, "torch SDPA fp16", b.time_torch(call), flops=flops, note=how)
        for label, backend in PINNED:
            def pinned(label=label, backend=backend):
                c, h = sdpa(b.torch, H, Hkv, D, rows, pos0, backend)
                b.add(op, rows, f"torch SDPA {label} (pinned)", b.time_torch(c), flops=flops, note=h)
            b.rec.guard(f"{op} T={rows} torch SDPA {label} (pinned)", pinned)
    if b.ctx is None:
        return

    def emit(label, t, n):
        b.add(op, rows, f"ours {label}", t, flops=flops, peer=peer, note=note, sets=n)
    time_variants(b, op, H, Hkv, D, rows, pos0, VARIANTS, emit)


def shapes(quick: bool) -> list:
    """(label, desc with n_head, n_head_kv, head_dim) of each shape to run: the first preset
    alone with --quick, else every preset and EXTRA_SHAPES."""
    out = [(model, preset_desc(model)) for model in (SHAPES[:1] if quick else SHAPES)]
    if not quick:
        out += [(label, SimpleNamespace(n_head=h, n_head_kv=hkv, head_dim=dh))
                for label, h, hkv, dh in EXTRA_SHAPES]
    return out


def run(b, lengths) -> None:
    for label, d in shapes(b.quick):
        for T in lengths:
            b.op(f"attention {label} T={T}", case, b, d, T, 0)
        if not b.quick:
            b.op(f"attention {label} rows={DEEP[0]} pos0={DEEP[1]}", case, b, d, *DEEP)

