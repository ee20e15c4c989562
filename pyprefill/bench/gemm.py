"""Projections on each leg against torch fp16 `x @ w.T` (TF/s), from fp32 x (the leg's cast
included) and, on the f16 leg, from fp16 x as the engine's producers write it; Q4_K -> fp16
dequantization against the device copy bandwidth (GB/s), and the two ceilings: the torch fp16
GEMM peak and the device-to-device copy. Shapes: a preset's attn_qkv, ffn_gate, the fused
gate|up and ffn_down (qwen35-4b; `--shapes` picks another). With the 8-bit leg, torch's FP8
`_scaled_mm` (row-wise scales) and int8 `_int_mm` run beside it as its GEMM peers (operands
already 8-bit: no quantization in their time; ours includes the activations' quantization).
With the blocks leg (`--gemm blocks`: the f16 leg on the GGUF blocks, no fp16 cache), each matrix
type of the Q4_K_M mix (BLOCK_MIX) runs on fp16 x beside cuBLAS on the cache (the leg's default,
then its two forms forced: "on chip", the GEMM on the blocks, and "slabs", per-call fp16 slabs
and cuBLAS: gemm_blocks_slab_rows), and torch's W4A16
GEMM (`torch._weight_int4pack_mm`: int4 weights in groups of 32, bf16 x) as the peer of its kind
where the GPU image's torch runs it (the row's note says which call form ran, or why none did).
Lengths 1, 16, 64 take the GEMV and small-GEMM routes (`-p 1 16 64 512 2048 8192`)."""
from __future__ import annotations

import numpy as np

from ..formats.synth import preset_desc
from ..kernels import gemm as K
from .timer import time_torch

SHAPES = "qwen35-4b"
BLOCK_MIX = ("Q4_K", "Q6_K")  # the matrix types of a Q4_K_M file (synth's q4_k_m mix)


# -- the wrapper calls: the only lines that touch pyprefill.kernels.gemm ------------------------
def _project(ctx, w, x, y, rows, leg):
    K.project(ctx, w, x, y, rows, leg=leg)


def _project_f16x(ctx, w, x16, inv, y, rows):
    K.project_f16x(ctx, w, x16, inv, y, rows)


def _cache_f16(w):
    K.weight_cache_f16(w)


def _set_blocks(ctx, on: bool, slab_rows=None):
    ctx.set_tuning(gemm_blocks=True if on else None, gemm_blocks_slab_rows=slab_rows if on else None)


def _cache_i8(w):
    K.weight_cache_i8(w)


def _dequantize_f16(ctx, w, out):
    K.dequantize(ctx, w, out, f16=True)


def View(buf, off=0, ld=0):
    return K.View(buf, off, ld)
# ------------------------------------------------------------------------------------------------


def projections(model: str = SHAPES) -> list[tuple[str, int, int]]:
    """(name, n, k) of the benchmarked weights of a preset."""
    d = preset_desc(model)
    return [("attn_qkv", d.conv_dim, d.n_embd), ("ffn_gate", d.n_ff, d.n_embd),
            ("ffn_gate_up", 2 * d.n_ff, d.n_embd), ("ffn_down", d.n_embd, d.n_ff)]


def _peak(torch, n: int, reps: int) -> tuple[float, dict]:
    x = torch.randn(n, n, device="cuda", dtype=torch.float16)
    w = torch.randn(n, n, device="cuda", dtype=torch.float16)
    t = time_torch(torch, lambda i: x @ w.T, reps=reps)
    return 2 * n ** 3 / (t["min_ms"] * 1e-3) / 1e12, t


def fp16_peak_tflops(torch, n: int = 8192, reps: int = 7) -> float:
    """torch's fp16 GEMM rate (n^3, fp32 accumulate, best of the reps) in TF/s: the ceiling of
    the projections and of the whole-model roofline."""
    return _peak(torch, n, reps)[0]


def fp16_peak(b) -> float:
    """fp16_peak_tflops, recorded as a row of the kernel suite."""
    n = 4096 if b.quick else 8192
    peak, t = _peak(b.torch, n, b.reps)
    b.add("peak fp16 gemm", 0, "torch fp16 x@w.T", t, flops=2 * n ** 3,
          note=f"{n}^3; best rep {peak:.1f} TF/s", peak_tflops=peak)
    return peak


def copy_bandwidth(b, nbytes: int = 1 << 30) -> None:
    """The device-to-device copy ceiling (bytes read + written)."""
    torch = b.torch
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    t = b.time_torch(lambda i: dst.copy_(src), target_s=0.05)
    b.add("device copy", 0, "torch copy_", t, nbytes=2 * nbytes, note=f"{nbytes >> 20} MiB")


def projection(b, name: str, T: int, n: int, k: int, legs) -> None:
    flops = 2 * T * n * k
    op, peer = f"proj {name}", None
    if b.torch is not None:
        torch = b.torch
        sets = b.sets(2 * (T * k + T * n + n * k), max_sets=8)
        xs = [torch.randn(T, k, device="cuda", dtype=torch.float16) for _ in range(sets)]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) / 50 for _ in range(sets)]
        t = b.time_torch(lambda i: xs[i % sets] @ ws[i % sets].T)
        peer = b.add(op, T, "torch fp16 x@w.T", t, flops=flops)
        del xs, ws
        if "int8" in legs:
            b.rec.guard(f"{op} T={T} torch 8-bit peers", _torch_8bit, b, op, T, n, k, peer)
        if "blocks" in legs:
            b.rec.guard(f"{op} T={T} torch W4A16 peer", _torch_w4a16, b, op, T, n, k, peer)
    if b.ctx is None:
        return
    sets = b.sets(4 * (T * k + T * n) + 2 * n * k, max_sets=8)
    ws = [b.weight("Q4_K", n, k) for _ in range(sets)]
    xs, ys = b.slab(T, k, sets), b.out_slab(T, n, sets)

    def run(leg):
        if leg == "blocks":
            return run_blocks()
        if leg in ("f16", "auto"):
            for w in ws:
                _cache_f16(w)
        if leg == "int8":
            for w in ws:
                _cache_i8(w)
        t = b.time_ours(lambda i: _project(b.ctx, ws[i % sets], View(xs.buf, xs.off(i), k),
                                           View(ys.buf, ys.off(i), n), T, leg),
                        reps=b.reps if leg != "f32" else max(2, b.reps // 2))
        b.add(op, T, f"ours {leg} leg", t, flops=flops, peer=peer,
              note=f"Q4_K {n}x{k}, fp32 x and y", sets=sets)

    def run_blocks():
        """The f16 leg on the GGUF blocks (tuning gemm_blocks, no fp16 cache): each type of the mix
        on fp16 x as the producers write it (its peer: "ours f16 leg, fp16 x", cuBLAS on the
        cache), and Q4_K on fp32 x too."""
        x16 = b.upload(b.rand(sets * T, k).astype(np.float16))
        inv = b.upload(np.ones(T, np.float32))
        _set_blocks(b.ctx, True)
        try:
            for qt in BLOCK_MIX:
                bws = [b.weight(qt, n, k) for _ in range(sets)]   # never cached
                label = "ours blocks, fp16 x" if qt == "Q4_K" else f"ours blocks {qt}, fp16 x"
                def f16x(i):
                    _project_f16x(b.ctx, bws[i % sets], View(x16, (i % sets) * T * k), View(inv),
                                  View(ys.buf, ys.off(i), n), T)
                t = b.time_ours(f16x, reps=b.reps)
                b.add(op, T, label, t, flops=flops, peer=peer,
                      note=f"{qt} {n}x{k} read as blocks, fp16 x, fp32 y", sets=sets)
                if T > 1:   # the two forms of the leg either side of its crossover (gemm_blocks_slab_rows)
                    for form, slab_rows in (("on chip", "never"), ("slabs", 2)):
                        _set_blocks(b.ctx, True, slab_rows)
                        t = b.time_ours(f16x, reps=b.reps)
                        b.add(op, T, label.replace("blocks", f"blocks {form}"), t, flops=flops, peer=peer,
                              note=f"{qt} {n}x{k}, gemm_blocks_slab_rows {slab_rows}", sets=sets)
                    _set_blocks(b.ctx, True)
                if qt == "Q4_K":
                    t = b.time_ours(lambda i: _project(b.ctx, bws[i % sets], View(xs.buf, xs.off(i), k),
                                                       View(ys.buf, ys.off(i), n), T, "f16"), reps=b.reps)
                    b.add(op, T, "ours blocks leg", t, flops=flops, peer=peer,
                          note=f"Q4_K {n}x{k} read as blocks, fp32 x and y", sets=sets)
                del bws
        finally:
            _set_blocks(b.ctx, False)

    def run_f16x():
        """The f16 leg as the engine runs it on the act16 route: the producer (RMSNorm, SwiGLU,
        the gates) has written the fp16 rows and their scales, so the projection is the GEMM
        and the unscale pass (pf_project_f16x), no cast."""
        for w in ws:
            _cache_f16(w)
        x16 = b.upload(b.rand(sets * T, k).astype(np.float16))
        inv = b.upload(np.ones(T, np.float32))
        t = b.time_ours(lambda i: _project_f16x(b.ctx, ws[i % sets], View(x16, (i % sets) * T * k),
                                                View(inv), View(ys.buf, ys.off(i), n), T),
                        reps=b.reps)
        b.add(op, T, "ours f16 leg, fp16 x", t, flops=flops, peer=peer,
              note=f"Q4_K {n}x{k}, fp16 x as the producers write it, fp32 y", sets=sets)

    for leg in b.legs:
        b.rec.guard(f"{op} T={T} {leg} leg", run, leg)
    if "f16" in b.legs:
        b.rec.guard(f"{op} T={T} f16 leg, fp16 x", run_f16x)


def _torch_8bit(b, op: str, T: int, n: int, k: int, peer) -> None:
    """torch's FP8 GEMM (e4m3 x e4m3 -> bf16, one scale per row of x and of w) and int8 GEMM
    (int8 x int8 -> int32) on the same shape."""
    torch = b.torch
    flops = 2 * T * n * k
    sets = b.sets(T * k + n * k + 4 * T * n, max_sets=8)
    xs = [torch.randn(T, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(sets)]
    ws = [torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(sets)]
    sa = torch.ones(T, 1, device="cuda", dtype=torch.float32)
    sb = torch.ones(1, n, device="cuda", dtype=torch.float32)
    t = b.time_torch(lambda i: torch._scaled_mm(xs[i % sets], ws[i % sets].T, scale_a=sa,
                                                scale_b=sb, out_dtype=torch.bfloat16))
    b.add(op, T, "torch fp8 _scaled_mm", t, flops=flops, peer=peer, note="row-wise scales, bf16 out")
    del xs, ws
    xi = [torch.randint(-127, 128, (T, k), device="cuda", dtype=torch.int8) for _ in range(sets)]
    wi = [torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8) for _ in range(sets)]
    t = b.time_torch(lambda i: torch._int_mm(xi[i % sets], wi[i % sets].T))
    b.add(op, T, "torch int8 _int_mm", t, flops=flops, peer=peer, note="int32 out, no scales")


def int4pack(torch, w4, inner_k_tiles: int = 8):
    """torch's int4 weight packing of codes w4 [n][k] (int32 in 0..15), in the call form this
    torch has: uint8 [n][k / 2] two codes a byte (torch >= 2.5), else the int32 codes themselves.
    Returns (packed, form)."""
    try:
        u8 = (w4[:, ::2] << 4 | w4[:, 1::2]).to(torch.uint8)
        return torch._convert_weight_to_int4pack(u8, inner_k_tiles), "uint8 packing"
    except (RuntimeError, TypeError):
        return torch._convert_weight_to_int4pack(w4, inner_k_tiles), "int32 packing"


def _torch_w4a16(b, op: str, T: int, n: int, k: int, peer, group: int = 32) -> None:
    """torch's W4A16 GEMM (`torch._weight_int4pack_mm`: bf16 x times int4 codes with a bf16 scale
    and zero per group of `group` columns): the kind of GEMM the blocks leg is, as torch ships it."""
    torch = b.torch
    flops = 2 * T * n * k
    sets = b.sets(2 * T * k + n * k // 2 + 2 * T * n, max_sets=8)
    xs = [torch.randn(T, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    packed, form = [], ""
    for _ in range(sets):
        p, form = int4pack(torch, torch.randint(0, 16, (n, k), device="cuda", dtype=torch.int32))
        packed.append(p)
    sz = torch.ones(k // group, n, 2, device="cuda", dtype=torch.bfloat16)
    sz[..., 1] = 8.0
    t = b.time_torch(lambda i: torch._weight_int4pack_mm(xs[i % sets], packed[i % sets], group, sz))
    b.add(op, T, "torch W4A16 int4pack_mm", t, flops=flops, peer=peer,
          note=f"int4 groups of {group}, bf16 x and y ({form})")


def dequant(b, qtype: str = "Q4_K") -> None:
    from ..core import matrix_bytes
    if b.ctx is None:
        return
    _, n, k = projections()[1]                      # ffn_gate
    nbytes = matrix_bytes(qtype, n, k) + 2 * n * k  # blocks read + fp16 written
    sets = b.sets(nbytes, max_sets=8)
    ws = [b.weight(qtype, n, k) for _ in range(sets)]
    outs = [b.buffer(2 * n * k) for _ in range(sets)]
    t = b.time_ours(lambda i: _dequantize_f16(b.ctx, ws[i % sets], outs[i % sets]))
    b.add(f"dequant {qtype}", 0, "ours -> fp16", t, nbytes=nbytes,
          note=f"{n}x{k}; blocks read + fp16 written", sets=sets)


def run(b, lengths) -> None:
    if b.torch is not None:
        b.peak_tflops = b.op("torch fp16 peak", fp16_peak, b)
        b.op("device copy", copy_bandwidth, b)
    b.op("dequant Q4_K", dequant, b)
    for T in lengths:
        for name, n, k in projections(b.shapes):
            b.op(f"proj {name} T={T}", projection, b, name, T, n, k, b.legs)
