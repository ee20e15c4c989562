"""Float64 models of 8-bit projection recipes (issue 31): what an int8 or e4m3 tensor-core leg
computes, so that the recipe is chosen before the kernel is written.

A recipe says, per projection, how its input rows x (T, K) and its weight W (N, K) are rounded;
the product of the rounded operands is then taken in float64 (an int8 tensor core's int32 sums
are exact, and the float64 product of dequantized values equals Σ (int dot) · scales up to
float64 rounding). Everything else of the model (norms, conv, attention, the recurrence, the
LM head, the embeddings) stays the float64 reference. The error of a recipe is measured against
the same forward with no rounding at all, on the logits of every position:

    from pyprefill.reference import quant_sim as qs
    res = qs.simulate("model.gguf", tokens, [qs.RECIPES["int8-g32"], qs.RECIPES["int8-g128"]])
    res.metrics["int8-g32"].rel, .worst, .argmax          # ||out-ref||/||ref||, worst row, argmax
    ReferenceModel(path, project=qs.model_projector(desc, recipe))   # one recipe, whole model

The quantizers (int8 groups, llama.cpp's q8_1, e4m3 and 16-bit floats) and the GGUF block
unpacking (integer codes + sub-block scales and mins) are public: the tests check them against
hand computations, gguf.quants' codes and gguf.quants.dequantize. `simulate` walks the model
layer by layer with every recipe in step, dequantizing one layer's weights at a time (float64),
so memory stays at one layer plus the LM head's vocabulary chunk.

llama.cpp's MMQ (ggml-cuda quantize.cu quantize_mmq_q8_1, mmq.cuh) as modelled by act="q8_1":
activations in fp32 are cut in groups of 32; amax = max|x|; d_inv = 127/amax and q = roundf(x *
d_inv) in fp32 (roundf: ties away from zero, not to even); d = 1/d_inv. For weights whose MMQ
tile needs the activation sums (Q4_0/Q4_1/Q5_1/Q4_K/Q5_K: layout DS4) d is stored as fp16 beside
the fp16 sum of the *unquantized* fp32 values of the group; for the others (Q8_0, Q6_K, IQ4_XS,
Q5_0: layout D4) d stays fp32. Q4_K/Q5_K tiles hold d·sc and -dmin·m as fp16 products (half2),
and the dot of a 32-wide sub-block is d·sc·d8·(q·q8) - dmin·m·s8: the min term uses the exact
activation sum, not the quantized one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedError
from ..formats.gguf_model import load_model_desc
from ..formats.model_desc import (QTYPE_BF16, QTYPE_BLOCK, QTYPE_F16, QTYPE_F32, QTYPE_IQ4_XS,
                                  QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0,
                                  ModelDesc, row_bytes)
from . import ops
from .model import empty_layer_state, layer_forward, layer_tensor_names

# ---------------------------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------------------------

E4M3_MAX = 448.0        # largest finite e4m3 (OCP "e4m3fn": no infinities, S.1111.111 is NaN)
INT8_MAX = 127          # symmetric int8: codes in [-127, 127], scale = amax / 127
I8_GROUP = 128          # the 8-bit leg's group along K (cuda/gemm_i8.cuh kI8Group)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf / round: nearest integer, ties away from zero (exact for every float)."""
    a = np.abs(x)
    fl = np.floor(a)
    return np.copysign(fl + (a - fl >= 0.5), x)


def round_to_float(x: np.ndarray, mant_bits: int, emin: int, max_finite: float) -> np.ndarray:
    """x rounded to nearest-even in a binary float format with `mant_bits` stored mantissa bits,
    smallest normal exponent `emin` (subnormals below it) and largest finite value `max_finite`;
    magnitudes beyond it saturate to ±max_finite. Exact in float64 for the 8/16-bit formats."""
    x = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(x)                              # |x| = m·2^e, m in [0.5, 1): top bit 2^(e-1)
    quantum = np.ldexp(1.0, np.maximum(e - 1, emin) - mant_bits)
    y = np.rint(x / quantum) * quantum              # division by a power of two: exact
    return np.clip(y, -max_finite, max_finite)


def to_fp16(x: np.ndarray) -> np.ndarray:
    """IEEE half, round to nearest even, saturating at ±65504 (float64 values on the fp16 grid)."""
    return round_to_float(x, 10, -14, 65504.0)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """bfloat16, round to nearest even (float64 values on the bf16 grid)."""
    return round_to_float(x, 7, -126, 3.3895313892515355e38)


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """OCP e4m3 (fn), round to nearest even, saturating at ±448 (as cvt.rn.satfinite.e4m3x2)."""
    return round_to_float(x, 3, -6, E4M3_MAX)


def _groups(x: np.ndarray, group: int) -> np.ndarray:
    """x (T, K) as (T, ceil(K/g), g), the last group padded with zeros when g does not divide K
    (a kernel pads K the same way); group 0 (or >= K) is the whole row."""
    T, K = x.shape
    g = K if group <= 0 or group >= K else group
    pad = -K % g
    if pad:
        x = np.pad(x, ((0, 0), (0, pad)))
    return x.reshape(T, -1, g)


def quantize_int8(x: np.ndarray, group: int, rounding: str = "even"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 in groups of `group` along the last axis: scale = max|x| / 127 per group,
    q = round(x / scale) (rounding "even" = to nearest even, "away" = C's roundf); an all-zero
    group gets scale 0 and codes 0. x (T, K) -> (q int8 (T, K), scale float64 (T, ceil(K/g)))."""
    x = np.asarray(x, dtype=np.float64)
    xg = _groups(x, group)
    scale = np.abs(xg).max(axis=-1) / INT8_MAX
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    r = xg / safe
    q = np.rint(r) if rounding == "even" else round_half_away(r)
    q = np.clip(q, -INT8_MAX, INT8_MAX).astype(np.int8)
    return q.reshape(x.shape[0], -1)[:, :x.shape[1]], scale


def quantize_i8_rows_f32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-bit leg's quantizer as the GPU computes it (cuda/gemm_i8.cuh), bit for bit: float32
    x (T, K) in groups of 128, amax = max|x| over the group, s = float32(amax / 127), q =
    rint(float32(x / s)) (float32 division, ties to even), q = 0 where s = 0; a group holding a
    NaN gets s = NaN, one holding an Inf s = Inf, both with codes 0; a short last group is padded
    with zeros. Returns (q int8 (T, K), s float32 (T, ceil(K/128)))."""
    x = np.asarray(x, dtype=np.float32)
    xg = _groups(x, I8_GROUP)
    amax = np.abs(xg).max(axis=-1).astype(np.float32)   # NaN where the group holds one
    scale = (amax / np.float32(INT8_MAX)).astype(np.float32)
    ok = np.isfinite(scale) & (scale > 0)
    safe = np.where(ok, scale, np.float32(1.0))[..., None]
    r = (np.where(ok[..., None], xg, np.float32(0.0)) / safe).astype(np.float32)
    q = np.clip(np.rint(r), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q.reshape(x.shape[0], -1)[:, :x.shape[1]], scale


def quantize_i8_weight_f32(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 8-bit leg's rank-1 weight form as the GPU computes it (cuda/gemm_i8.cuh), bit for
    bit: float32 w (N, K); a = the per-(row, group) scales of quantize_i8_rows_f32; r[c] = max
    over groups of a; b[blk, g] = max over the block's 128 rows of float32(a / r) (0 where r =
    0); s = float32(r * b); q = rint(float32(w / s)), 0 where s = 0. Returns (q int8 (N, K),
    r float32 (N,), b float32 (ceil(N/128), G))."""
    w = np.asarray(w, dtype=np.float32)
    N, K = w.shape
    _, a = quantize_i8_rows_f32(w)
    r, b = weight_scales_rank1(a, I8_GROUP)
    s = (r[:, None] * np.repeat(b, I8_GROUP, axis=0)[:N]).astype(np.float32)   # (N, G)
    wg = _groups(w, I8_GROUP)
    ok = s > 0
    qv = (np.where(ok[..., None], wg, np.float32(0)) / np.where(ok, s, np.float32(1))[..., None])
    q = np.clip(np.rint(qv.astype(np.float32)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q.reshape(N, -1)[:, :K], r, b


def gemm_i8_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """What the 8-bit leg computes for y = x . w^T (x float32 (T, K) activations, w float32
    (N, K) dequantized weights), in float64: x by quantize_i8_rows_f32, w by
    quantize_i8_weight_f32, the exact product of the dequantized operands (the GPU's int32 sums
    are exact; only its fp32 promotion and accumulation differ, ~1e-7 relative)."""
    qx, sx = quantize_i8_rows_f32(x)
    qw, r, b = quantize_i8_weight_f32(w)
    N = w.shape[0]
    sw = (r[:, None] * np.repeat(b, I8_GROUP, axis=0)[:N]).astype(np.float32)
    return (dequantize_groups(qx, sx.astype(np.float64), I8_GROUP)
            @ dequantize_groups(qw, sw.astype(np.float64), I8_GROUP).T)


def dequantize_groups(q: np.ndarray, scale: np.ndarray, group: int = 0) -> np.ndarray:
    """q (T, K) codes (or grid values) times their group's scale (T, ceil(K/g)) -> float64 (T, K);
    group as given to the quantizer (0: K / scale columns, which must then divide K)."""
    T, K = q.shape
    G = scale.shape[-1]
    if group <= 0:
        g = K // G
        if g * G != K:
            raise InvalidArgumentError(f"{G} groups do not split K={K}: give the group size")
    else:
        g = min(group, K)
    if -(-K // g) != G:
        raise InvalidArgumentError(f"{G} scales per row do not fit K={K} in groups of {g}")
    full = np.pad(q.astype(np.float64), ((0, 0), (0, g * G - K)))
    return (full.reshape(T, G, g) * scale[..., None]).reshape(T, -1)[:, :K]


def quantize_e4m3(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """e4m3 in groups along the last axis (DeepSeek/Qwen FP8: scale = max|x| / 448 per group,
    values rounded to nearest even on the e4m3 grid). Returns (values on the e4m3 grid (T, K)
    float64, scale (T, G))."""
    x = np.asarray(x, dtype=np.float64)
    xg = _groups(x, group)
    scale = np.abs(xg).max(axis=-1) / E4M3_MAX
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    return to_e4m3(xg / safe).reshape(x.shape[0], -1)[:, :x.shape[1]], scale


def q8_1_layout(qtype: int) -> str:
    """Which q8_1 tile layout llama.cpp's MMQ uses for activations against weights of `qtype`:
    "ds4" (fp16 d + fp16 sum of the group's unquantized values) or "d4" (fp32 d only)."""
    return "ds4" if qtype in (QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K) else "d4"


def quantize_q8_1(x: np.ndarray, variant: str = "mmq"
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's q8_1 activation blocks (32 values), emulated in fp32 as the C/CUDA code runs.

    variant "mmq" (ggml-cuda quantize_mmq_q8_1): d_inv = 127/amax, q = roundf(x·d_inv),
    d = 1/d_inv. variant "ref" (ggml-quants.c quantize_row_q8_1_ref and gguf-py's Q8_0):
    d = amax/127, id = 1/d, q = roundf(x·id). The two differ only where the fp32 reciprocals
    differ in the last bit and a product falls on a tie. sum: the fp32 sum of the group's fp32
    values in the order of the MMQ kernel (4 per thread left to right, then a xor-butterfly over
    8 threads); llama.cpp stores it as fp16 (layout ds4). An all-zero group gets d = 0, q = 0.
    x (T, K), K a multiple of 32 -> (q int8 (T, K), d float32 (T, K/32), sum float32 (T, K/32)).
    """
    x32 = np.asarray(x, dtype=np.float32)
    T, K = x32.shape
    if K % 32:
        raise InvalidArgumentError(f"q8_1 needs K a multiple of 32, got {K}")
    xb = x32.reshape(T, K // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    zero = amax == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        if variant == "mmq":
            d_inv = np.float32(127.0) / amax
            d = np.where(zero, np.float32(0), np.float32(1.0) / d_inv).astype(np.float32)
            mul = np.where(zero, np.float32(0), d_inv).astype(np.float32)
        elif variant == "ref":
            d = (amax / np.float32(127.0)).astype(np.float32)
            mul = np.where(d == 0, np.float32(0), np.float32(1.0) / d).astype(np.float32)
        else:
            raise InvalidArgumentError(f"q8_1 variant must be 'mmq' or 'ref', got {variant!r}")
    prod = (xb * mul[..., None]).astype(np.float32)             # the fp32 product, then roundf
    q = round_half_away(prod.astype(np.float64)).astype(np.int8).reshape(T, K)
    s4 = ((xb[..., 0::4] + xb[..., 1::4]) + xb[..., 2::4]) + xb[..., 3::4]   # (T, nb, 8) threads
    for off in (4, 2, 1):                                       # __shfl_xor_sync butterfly
        idx = np.arange(8) ^ off
        s4 = (s4 + s4[..., idx]).astype(np.float32)
    return q, d, s4[..., 0].astype(np.float32)


# ---------------------------------------------------------------------------------------------
# GGUF blocks as integer codes + sub-block scales
# ---------------------------------------------------------------------------------------------

_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                  dtype=np.int16)                   # ggml kvalues_iq4nl: IQ4_XS's code book
BLOCK_QTYPES = (QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_XS)
FLOAT_QTYPES = (QTYPE_F32, QTYPE_F16, QTYPE_BF16)


@dataclass
class BlockCodes:
    """A GGUF block-quantized matrix as an int8 tensor core sees it: W = scale·q - mins per
    sub-block of `sub` columns.

    q (N, K) int16: the integer codes (Q4_0 nibble-8; Q8_0 as stored; Q4_K/Q5_K the unsigned
    4/5-bit codes; Q6_K 6-bit code - 32; IQ4_XS the code book value), all within int8.
    scale (N, K/sub) float32: d·sc etc., as gguf.quants computes it in float32.
    mins (N, K/sub) float32 or None: dmin·m of Q4_K/Q5_K, subtracted.
    """
    qtype: int
    q: np.ndarray
    scale: np.ndarray
    mins: np.ndarray | None
    sub: int

    def dequantize_f32(self) -> np.ndarray:
        """W in float32 with gguf.quants' order of operations (fp32 scale·q, then - mins)."""
        N, K = self.q.shape
        qs = self.q.reshape(N, -1, self.sub).astype(np.float32)
        w = self.scale[..., None] * qs
        if self.mins is not None:
            w = w - self.mins[..., None]
        return w.reshape(N, K)

    def scaled_codes(self, fp16_scales: bool = False) -> np.ndarray:
        """scale·q as float64 (N, K) (exact; fp16_scales: the scale rounded to fp16 first, as
        llama.cpp's Q4_K/Q5_K tiles hold it)."""
        N, K = self.q.shape
        s = to_fp16(self.scale) if fp16_scales else self.scale.astype(np.float64)
        return (self.q.reshape(N, -1, self.sub) * s[..., None]).reshape(N, K)

    def values(self) -> np.ndarray:
        """The exact real values scale·q - mins as float64 (N, K)."""
        w = self.scaled_codes()
        if self.mins is not None:
            N, K = w.shape
            w = (w.reshape(N, -1, self.sub) - self.mins.astype(np.float64)[..., None]).reshape(N, K)
        return w


def _f16_field(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 little-endian fp16 -> (n,) float32."""
    return np.ascontiguousarray(b).view(np.float16).reshape(-1).astype(np.float32)


def _k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte Q4_K/Q5_K scales field (n, 12) -> 6-bit (sc, m) each (n, 8): j < 4 in the low 6
    bits of bytes j / j+4; j >= 4 low nibbles in byte j+4 (sc) / its high nibble (m), top 2 bits
    in bits 6-7 of bytes j-4 (sc) / j (m) (ggml get_scale_min_k4)."""
    b = sc12.astype(np.uint16)
    sc = np.empty((b.shape[0], 8), np.uint16)
    mn = np.empty_like(sc)
    sc[:, :4] = b[:, 0:4] & 63
    mn[:, :4] = b[:, 4:8] & 63
    sc[:, 4:] = (b[:, 8:12] & 15) | ((b[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (b[:, 8:12] >> 4) | ((b[:, 4:8] >> 6) << 4)
    return sc, mn


def unpack_blocks(raw: np.ndarray, qtype: int, k: int) -> BlockCodes:
    """GGUF rows (N, row_bytes(qtype, k)) uint8 -> BlockCodes (codes, sub-block scales, mins)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    N = raw.shape[0]
    if qtype not in BLOCK_QTYPES:
        raise UnsupportedError(f"no integer codes for ggml type {qtype}")
    if raw.shape != (N, row_bytes(qtype, k)):
        raise InvalidArgumentError(f"raw rows {raw.shape} do not hold {k} values of type {qtype}")
    elems, nbytes = QTYPE_BLOCK[qtype]
    blk = raw.reshape(-1, nbytes)                                  # (n blocks, bytes)
    n = blk.shape[0]
    mins = None
    if qtype == QTYPE_Q8_0:                                        # d, qs[32] int8
        sub, scale = 32, _f16_field(blk[:, 0:2])[:, None]
        q = blk[:, 2:34].view(np.int8).astype(np.int16)
    elif qtype == QTYPE_Q4_0:                                      # d, qs[16]: l<16 low, else high
        sub, scale = 32, _f16_field(blk[:, 0:2])[:, None]
        qs = blk[:, 2:18]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int16) - 8
    elif qtype in (QTYPE_Q4_K, QTYPE_Q5_K):
        # d, dmin, scales[12], (Q5_K: qh[32]), qs[128]: sub-block j = nibble (j % 2) of bytes
        # 32·(j // 2) ..+31; Q5_K's fifth bit of element l of sub-block j is bit j of qh[l]
        sub = 32
        d, dmin = _f16_field(blk[:, 0:2]), _f16_field(blk[:, 2:4])
        sc, mn = _k_scales(blk[:, 4:16])
        qs = blk[:, -128:].reshape(n, 4, 32)
        q = np.stack([qs & 15, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.int16)
        if qtype == QTYPE_Q5_K:
            qh = blk[:, 16:48]
            q |= ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
                  ).astype(np.int16) << 4
        q = q.reshape(n, 256)
        scale = d[:, None] * sc.astype(np.float32)
        mins = dmin[:, None] * mn.astype(np.float32)
    elif qtype == QTYPE_Q6_K:
        # ql[128], qh[64], scales[16] int8, d: element 128h + t: low 4 bits = nibble (t // 64)
        # of ql[64h + t % 64], high 2 bits = bits 2·(t // 32) of qh[32h + t % 32]; code - 32
        sub = 16
        ql = blk[:, 0:128].reshape(n, 2, 64)
        qh = blk[:, 128:192].reshape(n, 2, 32)
        lo = np.concatenate([ql & 15, ql >> 4], axis=2)                            # (n, 2, 128)
        hi = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)         # (n, 2, 128)
        q = ((lo | (hi << 4)).astype(np.int16) - 32).reshape(n, 256)
        scale = _f16_field(blk[:, 208:210])[:, None] * blk[:, 192:208].view(np.int8
                                                                            ).astype(np.float32)
    else:                                                          # IQ4_XS
        # d, scales_h u16 (2 bits per sub-block), scales_l[4] (nibbles), qs[128]: sub-block j
        # = bytes 16j..16j+15, element l < 16 low nibble, l >= 16 high; scale d·(l6 - 32)
        sub = 32
        d = _f16_field(blk[:, 0:2])
        sh = np.ascontiguousarray(blk[:, 2:4]).view(np.uint16).reshape(-1)
        sl = blk[:, 4:8]
        low = np.stack([sl & 15, sl >> 4], axis=2).reshape(n, 8).astype(np.int16)
        high = ((sh[:, None] >> (2 * np.arange(8, dtype=np.uint16))[None, :]) & 3).astype(np.int16)
        scale = d[:, None] * ((low | (high << 4)) - 32).astype(np.float32)
        qs = blk[:, 8:136].reshape(n, 8, 16)
        q = _IQ4NL[np.concatenate([qs & 15, qs >> 4], axis=2)].reshape(n, 256)
    per_row = k // sub
    return BlockCodes(qtype, q.reshape(N, k), scale.reshape(N, per_row).astype(np.float32),
                      None if mins is None else mins.reshape(N, per_row).astype(np.float32), sub)


def read_raw(desc: ModelDesc, name: str) -> tuple[int, np.ndarray]:
    """(qtype, raw rows (N, row_bytes) uint8 memory-mapped) of a 2-D tensor of the file."""
    t = desc.tensors[name]
    raw = np.memmap(desc.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))
    return t.qtype, raw.reshape(-1, row_bytes(t.qtype, t.shape[-1]))


def dequantize_raw(raw: np.ndarray, qtype: int, k: int) -> np.ndarray:
    """Rows of raw GGUF data -> float32 (N, k) through gguf.quants.dequantize (the reference's
    reader: formats.gguf_model.read_tensor)."""
    from gguf.quants import dequantize
    if qtype in (QTYPE_F32, QTYPE_F16):
        return np.ascontiguousarray(raw).view(np.float32 if qtype == QTYPE_F32 else np.float16
                                              ).reshape(-1, k).astype(np.float32)
    return dequantize(np.asarray(raw), qtype).reshape(-1, k).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------

ACTS = ("exact", "f16", "bf16", "int8", "q8_1", "e4m3", "int8x2")
WEIGHTS = ("exact", "f16", "bf16", "blocks", "blocks_llama", "int8", "int8r", "e4m3")
GDN_GATE_ROLES = ("ssm_beta", "ssm_alpha")      # stay on the 16-bit leg in every 8-bit recipe


@dataclass(frozen=True)
class Leg:
    """How one projection y = x W^T is computed.

    act: the input rows' rounding: exact | f16 | bf16 | int8 (groups of `group` along K) |
      q8_1 (llama.cpp MMQ, groups of 32, see the module doc) | e4m3 (groups of `group`) |
      int8x2 (two int8 passes: x ≈ s1·q1 + s2·q2, the second on the residual).
    group: activation group along K (0 = the whole row).
    weight: exact (the dequantized GGUF value) | f16 | bf16 | blocks (the GGUF block codes and
      sub-block scales, mins handled through activation sums) | blocks_llama (blocks with
      Q4_K/Q5_K scales and mins rounded to fp16, as llama.cpp's tiles) | int8 / e4m3 (the
      dequantized value re-quantized in blocks of `wblock` = (rows, cols along K)) | int8r
      (int8 with a rank-1 scale: one factor per output row times one per block of `wblock`,
      see weight_scales_rank1).
    min_sums: for weights with mins: "exact" (sums of the unrounded x, as llama.cpp) or
      "rounded" (sums of the rounded x, as a kernel that folds the min into the int8 product).
    rounding: int8 ties, "even" or "away".
    rotate: width of a block Hadamard rotation applied along K to x and W before rounding (0 =
      none); needs a weight that is re-quantized after the rotation (int8 / e4m3) or exact.
    """
    act: str = "exact"
    group: int = 0
    weight: str = "exact"
    wblock: tuple[int, int] = (1, 128)
    min_sums: str = "exact"
    rounding: str = "even"
    rotate: int = 0

    def __post_init__(self) -> None:
        if self.act not in ACTS or self.weight not in WEIGHTS:
            raise InvalidArgumentError(f"bad leg act={self.act!r} weight={self.weight!r}")
        if self.rotate and self.weight in ("blocks", "blocks_llama"):
            raise InvalidArgumentError("a rotated input needs re-quantized weights, not blocks")

    def is_exact(self) -> bool:
        return self.act == "exact" and self.weight == "exact" and not self.rotate


F16_LEG = Leg("f16", weight="f16")
EXACT_LEG = Leg()


@dataclass(frozen=True)
class Recipe:
    """A named rule giving each projection its Leg: `leg` by default, `roles` overriding it per
    role (GGUF short name), `arch_roles` adding overrides for one architecture only
    ((arch, roles) pairs, applied by `for_arch`), `gates` for the GDN β/α projections (16-bit by
    default). Weights stored as F32/F16/BF16 have no blocks: with `float_weights_f16` an 8-bit
    leg falls back to the f16 leg for them (llama.cpp runs such matrices through cuBLAS, not
    MMQ)."""
    name: str
    leg: Leg
    roles: tuple[tuple[str, Leg], ...] = ()
    gates: Leg | None = F16_LEG
    float_weights_f16: bool = True
    note: str = ""
    arch_roles: tuple[tuple[str, tuple[tuple[str, Leg], ...]], ...] = ()
    gdn_rows16: bool = False   # the GDN layers' q / k / v / o rows in fp16 (ops.gdn_mixer rows16)

    def for_arch(self, arch: str) -> "Recipe":
        """This recipe with the overrides of `arch` merged into `roles`."""
        extra = dict(dict(self.arch_roles).get(arch, ()))
        if not extra and not self.arch_roles:
            return self
        return replace(self, roles=tuple(sorted({**dict(self.roles), **extra}.items())),
                       arch_roles=())

    def leg_for(self, role: str, qtype: int) -> Leg:
        leg = dict(self.roles).get(role, self.leg)
        if role in GDN_GATE_ROLES and self.gates is not None and role not in dict(self.roles):
            leg = self.gates
        eight_bit = leg.act in ("int8", "q8_1", "e4m3", "int8x2") or leg.weight in (
            "blocks", "blocks_llama", "int8", "int8r", "e4m3")
        if eight_bit and qtype in FLOAT_QTYPES and self.float_weights_f16:
            return F16_LEG
        return leg


# Projections whose input has a wide range (the outputs of SwiGLU, of the gated norm and of
# attention), and the projections the chosen mix keeps on the f16 leg: those inputs plus the
# projections that write carried state (K and V rows of the KV cache; the GDN q/k/v that feed
# the recurrence). docs/int8-recipe.md has the measurements behind the list.
WIDE_INPUT_ROLES = ("ffn_down", "ssm_out", "attn_output")
STATE_WRITER_ROLES = ("attn_k", "attn_v", "attn_qkv")
MIX_F16_ROLES = WIDE_INPUT_ROLES + STATE_WRITER_ROLES


def _int8(group: int, weight: str = "blocks", **kw) -> Leg:
    return Leg("int8", group, weight, **kw)


# The recipes of the table and the candidates (docs/int8-recipe.md says which is which).
# "blocks" weights with min_sums="rounded" give exactly x̂ W^T with W the dequantized GGUF value;
# the "-xs" twins take the Q4_K/Q5_K min term on the exact activation sums, as llama.cpp does.
RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("exact", EXACT_LEG, gates=None, note="no rounding (must equal the reference)"),
    Recipe("bf16", Leg("bf16", weight="bf16"), gates=None,
           note="bf16 activations and weights, every projection"),
    Recipe("f16", F16_LEG, gates=None, note="fp16 activations and weights (the f16 leg)"),
    Recipe("f16-rows16", F16_LEG, gates=None, gdn_rows16=True,
           note="the f16 leg with the GDN q / k / v / o rows in fp16 between its kernels (issue 40)"),
    Recipe("q8_1-llama", Leg("q8_1", 32, "blocks_llama"),
           note="llama.cpp MMQ: q8_1 activations (fp32 math, roundf, fp16 d and exact-x sums "
                "for DS4 types), fp16 Q4_K/Q5_K sub-scales and mins"),
    *[Recipe(f"int8-g{g}", _int8(g, min_sums="rounded"),
             note=f"int8 activations g{g}, weights from the blocks, min term on the rounded x")
      for g in (32, 64, 128)],
    *[Recipe(f"int8-g{g}-xs", _int8(g),
             note=f"int8 activations g{g}, weights from the blocks, min term on the exact x")
      for g in (32, 64, 128)],
    Recipe("int8-row", _int8(0, min_sums="rounded"),
           note="int8 activations, one scale per row, weights from the blocks"),
    Recipe("int8-g32-w32", _int8(32, "int8", wblock=(1, 32)),
           note="int8 g32 activations, weights re-quantized to int8 per 1x32"),
    Recipe("int8-g128-w128", _int8(128, "int8", wblock=(1, 128)),
           note="int8 g128 activations, weights re-quantized to int8 per 1x128"),
    Recipe("int8-g128-w128b", _int8(128, "int8", wblock=(128, 128)),
           note="int8 g128 activations, weights re-quantized to int8 per 128x128 block"),
    Recipe("int8x2-g128", Leg("int8x2", 128, "blocks", min_sums="rounded"),
           note="two int8 passes (x and its residual), g128, weights from the blocks"),
    Recipe("int8-g128-had", _int8(128, "int8", wblock=(1, 128), rotate=128),
           note="128-wide Hadamard on x and W, int8 g128 activations, int8 1x128 weights"),
    Recipe("int8-g128-w128-had", _int8(128, "int8", wblock=(1, 128)),
           roles=tuple((r, _int8(128, "int8", wblock=(1, 128), rotate=128))
                       for r in WIDE_INPUT_ROLES),
           note="int8-g128-w128, the wide-input projections rotated by a 128-wide Hadamard"),
    Recipe("int8-g128-w128-mix", _int8(128, "int8", wblock=(1, 128)),
           roles=tuple((r, F16_LEG) for r in sorted(MIX_F16_ROLES)),
           note="int8-g128-w128 with ffn_down, ssm_out, attn_output, attn_k, attn_v, attn_qkv "
                "on the f16 leg (the chosen recipe)"),
    Recipe("int8-g128-w128r-mix", _int8(128, "int8r", wblock=(128, 128)),
           roles=tuple((r, F16_LEG) for r in sorted(MIX_F16_ROLES)),
           note="the mix with rank-1 weight scales: per output row x per 128 rows and 128 "
                "columns (one fp32 multiply per promotion instead of one per element)"),
    Recipe("int8-g128-w128r", _int8(128, "int8r", wblock=(128, 128)),
           note="int8 g128 activations, int8 weights with rank-1 scales, every projection"),
    Recipe("e4m3-g128", Leg("e4m3", 128, "exact"),
           note="e4m3 activations 1x128, exact weights"),
    Recipe("fp8-qwen", Leg("e4m3", 128, "e4m3", wblock=(128, 128)),
           note="official Qwen FP8: e4m3 activations 1x128, e4m3 weights 128x128 blocks"),
]}


def with_roles(base: Recipe, name: str, roles: dict[str, Leg], note: str = "") -> Recipe:
    """`base` with some roles on other legs (a per-projection mix)."""
    return replace(base, name=name, roles=tuple(sorted({**dict(base.roles), **roles}.items())),
                   note=note or base.note)


# ---------------------------------------------------------------------------------------------
# One projection
# ---------------------------------------------------------------------------------------------

def hadamard(n: int) -> np.ndarray:
    """The orthonormal Sylvester Hadamard matrix of order n (a power of two)."""
    if n < 1 or n & (n - 1):
        raise InvalidArgumentError(f"Hadamard order {n} is not a power of two")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def _rotate(a: np.ndarray, width: int) -> np.ndarray:
    """Rows of a (.., K) times the block-diagonal Hadamard of blocks `width` along K."""
    K = a.shape[-1]
    w = min(width, K)
    while K % w:                           # the largest power of two dividing K, at most width
        w //= 2
    return (a.reshape(*a.shape[:-1], K // w, w) @ hadamard(w)).reshape(a.shape)


def round_activations(leg: Leg, x: np.ndarray, qtype: int) -> np.ndarray:
    """The input rows as the leg's tensor core sees them (float64 (T, K))."""
    if leg.act == "exact":
        return x
    if leg.act == "f16":
        return to_fp16(x)
    if leg.act == "bf16":
        return to_bf16(x)
    g = leg.group
    if leg.act == "int8":
        return dequantize_groups(*quantize_int8(x, g, leg.rounding), g)
    if leg.act == "int8x2":
        q1 = dequantize_groups(*quantize_int8(x, g, leg.rounding), g)
        return q1 + dequantize_groups(*quantize_int8(x - q1, g, leg.rounding), g)
    if leg.act == "e4m3":
        return dequantize_groups(*quantize_e4m3(x, g), g)
    q, d, _ = quantize_q8_1(x, "mmq")                               # q8_1
    if q8_1_layout(qtype) == "ds4":
        d = to_fp16(d)
    return dequantize_groups(q, d.astype(np.float64), 32)


def weight_scales_rank1(a: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank-1 weight scales for the ideal per-(row, group) scales a = amax / 127 (N, G), computed
    in a's precision (float64 for the simulation, float32 for the GPU's arithmetic): a factor
    per output row r = max over groups of a, and one per block of `rows` output rows and group,
    b = max over the block's rows of a / r (<= 1), so that r * b >= a everywhere (no clipping).
    Returns (r (N,), b (ceil(N/rows), G)); an all-zero row gets r = 0 (and counts as 0 in b)."""
    N, G = a.shape
    r = a.max(axis=1)
    ratio = np.where(r[:, None] > 0, a / np.where(r > 0, r, 1)[:, None], 0).astype(a.dtype)
    ratio = np.pad(ratio, ((0, -N % rows), (0, 0)))
    b = ratio.reshape(-1, rows, G).max(axis=1)
    return r, b


def round_weight(leg: Leg, w: np.ndarray) -> np.ndarray:
    """A re-quantized weight (float64 (N, K)) for weight kinds exact / f16 / bf16 / int8 / int8r /
    e4m3."""
    if leg.weight == "exact":
        return w
    if leg.weight == "int8r":   # one scale per (row, group) = r[row] * b[row block, group]
        N, K = w.shape
        br, bc = leg.wblock
        wp = np.pad(w, ((0, 0), (0, -K % bc)))
        wg = wp.reshape(N, -1, bc)
        r, b = weight_scales_rank1(np.abs(wg).max(axis=2) / INT8_MAX, br)
        scale = r[:, None] * np.repeat(b, br, axis=0)[:N]
        q = np.clip(np.rint(wg / np.where(scale > 0, scale, 1.0)[..., None]), -INT8_MAX, INT8_MAX)
        return (q * scale[..., None]).reshape(N, -1)[:, :K]
    if leg.weight == "f16":
        return to_fp16(w)
    if leg.weight == "bf16":
        return to_bf16(w)
    N, K = w.shape
    br, bc = min(leg.wblock[0], N), min(leg.wblock[1], K)
    wp = np.pad(w, ((0, -N % br), (0, -K % bc)))     # ragged edge blocks: zeros change no amax
    wb = wp.reshape(wp.shape[0] // br, br, wp.shape[1] // bc, bc)
    amax = np.abs(wb).max(axis=(1, 3), keepdims=True)
    top = INT8_MAX if leg.weight == "int8" else E4M3_MAX
    scale = amax / top
    r = wb / np.where(scale > 0, scale, 1.0)
    v = np.rint(r) if leg.weight == "int8" else to_e4m3(r)
    return (v * scale).reshape(wp.shape)[:N, :K]


class WeightForms:
    """The forms of one matrix the legs ask for, made on first use and kept: the exact float64
    value, its block codes, and each re-quantized variant."""

    def __init__(self, w: np.ndarray, qtype: int, raw: np.ndarray | None = None):
        self.w, self.qtype, self.raw = w, qtype, raw
        self._blocks: BlockCodes | None = None
        self._cache: dict[tuple, object] = {}

    def blocks(self) -> BlockCodes | None:
        if self._blocks is None and self.qtype in BLOCK_QTYPES and self.raw is not None:
            self._blocks = unpack_blocks(self.raw, self.qtype, self.w.shape[1])
        return self._blocks

    def get(self, leg: Leg):
        """(W used in x̂ W^T (N, K) float64, mins (N, K/sub) float64 or None, sub)."""
        key = (leg.weight, leg.wblock if leg.weight in ("int8", "int8r", "e4m3") else None, leg.rotate)
        if key not in self._cache:
            if leg.weight in ("blocks", "blocks_llama"):
                b = self.blocks()
                if b is None:          # no codes (float matrix or no raw data): the exact value
                    self._cache[key] = (self.w, None, 0)
                else:
                    llama = leg.weight == "blocks_llama" and b.qtype in (QTYPE_Q4_K, QTYPE_Q5_K)
                    mins = None if b.mins is None else (
                        to_fp16(b.mins) if llama else b.mins.astype(np.float64))
                    self._cache[key] = (b.scaled_codes(fp16_scales=llama), mins, b.sub)
            else:
                w = _rotate(self.w, leg.rotate) if leg.rotate else self.w
                self._cache[key] = (round_weight(leg, w), None, 0)
        return self._cache[key]


def project(leg: Leg, x: np.ndarray, forms: WeightForms) -> np.ndarray:
    """y = x W^T (T, N) computed as `leg` rounds it; x (T, K) float64."""
    if leg.is_exact():
        return x @ forms.w.T
    xr = _rotate(x, leg.rotate) if leg.rotate else x
    xh = round_activations(leg, xr, forms.qtype)
    w, mins, sub = forms.get(leg)
    y = xh @ w.T
    if mins is not None:                  # - Σ_sub m · Σ_{k in sub} x_k
        src = x if leg.min_sums == "exact" else xh
        if leg.act == "q8_1" and q8_1_layout(forms.qtype) == "ds4":
            sums = to_fp16(_q8_1_sums(x, sub))
        else:
            sums = src.reshape(src.shape[0], -1, sub).sum(axis=-1)
        y = y - sums @ mins.T
    return y


def _q8_1_sums(x: np.ndarray, sub: int) -> np.ndarray:
    """The fp32 sums llama.cpp's q8_1 stores per 32 values (sub must be 32)."""
    if sub != 32:
        raise UnsupportedError(f"q8_1 sums are per 32 values, the weight's sub-blocks are {sub}")
    return quantize_q8_1(x, "mmq")[2].astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Whole models
# ---------------------------------------------------------------------------------------------

def _layer_forms(desc: ModelDesc, i: int) -> tuple[dict[str, np.ndarray], dict[str, WeightForms]]:
    """Layer i's tensors (float64, as ReferenceModel holds them) and the matrices' WeightForms."""
    w, forms = {}, {}
    for short, name in layer_tensor_names(desc, i).items():
        t = desc.tensors[name]
        qtype, raw = read_raw(desc, name)
        k = t.shape[-1]
        val = dequantize_raw(raw, qtype, k).reshape(t.shape).astype(np.float64)
        w[short] = val
        if len(t.shape) == 2 and short != "ssm_conv1d":
            forms[short] = WeightForms(val, qtype, raw)
    return w, forms


def _hook(recipe: Recipe, forms: dict[str, WeightForms], stats: dict | None) -> ops.Projector:
    """The ops.Projector of one recipe over one layer's matrices."""
    def hook(role: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        f = forms[role]
        leg = recipe.leg_for(role, f.qtype)
        y = project(leg, x, f)
        if stats is not None and not leg.is_exact():     # this projection's own error
            ref = x @ f.w.T
            a, b = stats.setdefault(role, [0.0, 0.0])
            stats[role] = [a + float(np.sum((y - ref) ** 2)), b + float(np.sum(ref ** 2))]
        return y
    return hook


def model_projector(desc: ModelDesc, recipe: Recipe) -> ops.LayerProjector:
    """A ReferenceModel(project=...) hook running `recipe` (block codes read from desc's file)."""
    cache: dict[tuple[int, str], WeightForms] = {}
    recipe = recipe.for_arch(desc.arch)

    def hook(i: int, role: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        key = (i, role)
        if key not in cache:
            qtype, raw = read_raw(desc, layer_tensor_names(desc, i)[role])
            cache[key] = WeightForms(w, qtype, raw)
        f = cache[key]
        return project(recipe.leg_for(role, f.qtype), x, f)
    return hook


@dataclass
class Metrics:
    """Logits error of one recipe against the unrounded forward: rel = ||out-ref|| / ||ref||
    over the whole (T, V) array, worst = the largest per-position relative error, argmax = the
    share of positions whose argmax token agrees; seconds = wall time spent on this recipe;
    roles = per-projection role relative error of the projection alone, over all its layers."""
    rel: float
    worst: float
    argmax: float
    seconds: float
    roles: dict[str, float] = field(default_factory=dict)


@dataclass
class SimResult:
    model: str
    tokens: int
    metrics: dict[str, Metrics]
    logits: dict[str, np.ndarray] | None = None
    hidden: dict[str, np.ndarray] | None = None   # the LM head's input (T, d), per recipe


def simulate(path: str, tokens: Sequence[int], recipes: Iterable[Recipe], *,
             chunked: bool = False, vocab_chunk: int = 32768, role_stats: bool = False,
             keep_logits: bool = False, keep_hidden: bool = False,
             log: Callable[[str], None] | None = None) -> SimResult:
    """Run the float64 forward of `tokens` once per recipe (plus the unrounded reference) over
    the GGUF at `path`, layer by layer, and compare the logits of every position.

    chunked: the chunked delta rule instead of the recurrence (GDN layers). vocab_chunk: LM-head
    rows dequantized at a time. role_stats: also measure each projection's own error.
    keep_logits: return the logits (T, V) of every recipe (small models only).
    keep_hidden: return the normed final hidden states (T, d) of every recipe (the LM head's
    input: the logits of any model size, computed later in vocabulary chunks; lm_head_errors).
    """
    desc = load_model_desc(str(path))
    recipes = [r for r in recipes if r.name != "exact"]
    names = ["exact"] + [r.name for r in recipes]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"duplicate recipe names in {names}")
    by_name = {"exact": RECIPES["exact"],
               **{r.name: r.for_arch(desc.arch) for r in recipes}}
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= desc.n_vocab:
        raise InvalidArgumentError(f"tokens must be non-empty ids in [0, {desc.n_vocab})")
    secs = {n: 0.0 for n in names}
    stats: dict[str, dict] = {n: {} for n in names}
    qe, raw_e = read_raw(desc, "token_embd.weight")
    x0 = dequantize_raw(raw_e[ids], qe, desc.n_embd).astype(np.float64)
    xs = {n: x0 for n in names}
    states = {n: [empty_layer_state(desc, kind) for kind in desc.layer_kinds] for n in names}
    for i, kind in enumerate(desc.layer_kinds):
        w, forms = _layer_forms(desc, i)
        for n in names:
            t0 = time.perf_counter()
            hook = _hook(by_name[n], forms, stats[n] if role_stats else None)
            xs[n], states[n][i] = layer_forward(desc, kind, w, xs[n], 0, states[n][i],
                                                chunked=chunked, project=hook,
                                                gdn_rows16=by_name[n].gdn_rows16)
            secs[n] += time.perf_counter() - t0
        if log:
            log(f"layer {i + 1}/{len(desc.layer_kinds)} ({kind})")
        del w, forms
    # LM head in vocabulary chunks: ||diff||², ||ref||² and the running argmax per row
    qn, raw_n = read_raw(desc, "output_norm.weight")
    onorm = dequantize_raw(raw_n, qn, desc.n_embd).reshape(-1).astype(np.float64)
    hs = {n: ops.rms_norm(xs[n], onorm, desc.eps) for n in names}
    T = ids.size
    acc = _LogitErrors(T, names)
    kept = {n: [] for n in names} if keep_logits else None
    for v0, wc in _head_chunks(desc, vocab_chunk):
        ref = None
        for n in names:
            t0 = time.perf_counter()
            lg = hs[n] @ wc.T
            acc.add(n, v0, lg, ref)
            ref = lg if ref is None else ref
            if kept is not None:
                kept[n].append(lg)
            secs[n] += time.perf_counter() - t0
    metrics = {}
    for n in names:
        roles = {r: float(np.sqrt(a / b)) if b > 0 else 0.0 for r, (a, b) in stats[n].items()}
        rel, worst, agree = acc.metrics(n, "exact")
        metrics[n] = Metrics(rel=rel, worst=worst, argmax=agree, seconds=secs[n], roles=roles)
    logits = {n: np.concatenate(kept[n], axis=1) for n in names} if kept is not None else None
    return SimResult(str(path), T, metrics, logits, hs if keep_hidden else None)


class _LogitErrors:
    """Logits met vocabulary chunk by chunk: per position ||out - ref||² and ||ref||², and each
    array's running argmax."""

    def __init__(self, T: int, names: Iterable[str]):
        names = list(names)
        self.ref2 = np.zeros(T)
        self.diff2 = {n: np.zeros(T) for n in names}
        self.best = {n: np.full(T, -np.inf) for n in names}
        self.arg = {n: np.zeros(T, np.int64) for n in names}

    def add(self, name: str, v0: int, lg: np.ndarray, ref: np.ndarray | None) -> None:
        """Columns v0.. of `name`'s logits; ref None: they are the reference's."""
        if ref is None:
            self.ref2 += np.sum(lg * lg, axis=1)
        else:
            self.diff2[name] += np.sum((lg - ref) ** 2, axis=1)
        m = lg.max(axis=1)
        self.arg[name] = np.where(m > self.best[name], v0 + lg.argmax(axis=1), self.arg[name])
        self.best[name] = np.maximum(self.best[name], m)

    def metrics(self, name: str, ref_name: str) -> tuple[float, float, float]:
        """(whole-array relative error, worst position's, argmax agreement with ref_name)."""
        d = self.diff2[name]
        return (float(np.sqrt(d.sum() / self.ref2.sum())), float(np.sqrt(np.max(d / self.ref2))),
                float(np.mean(self.arg[name] == self.arg[ref_name])))


def _head_chunks(desc: ModelDesc, vocab_chunk: int):
    """(first row, float64 rows) of the LM head's matrix, vocab_chunk rows at a time."""
    out_name = "token_embd.weight" if desc.tied_output else "output.weight"
    qo, raw_o = read_raw(desc, out_name)
    for v0 in range(0, desc.n_vocab, vocab_chunk):
        yield v0, dequantize_raw(raw_o[v0:v0 + vocab_chunk], qo, desc.n_embd).astype(np.float64)


def lm_head_errors(path: str, hidden: np.ndarray, others: dict[str, np.ndarray], *,
                   vocab_chunk: int = 32768) -> dict[str, tuple[float, float]]:
    """(||out - ref|| / ||ref||, argmax agreement) over all positions of each logits array in
    `others` (name -> (T, V)) against the float64 logits of `hidden` (T, d: the normed final
    hidden states, SimResult.hidden) through the GGUF's LM head, in vocabulary chunks."""
    acc = _LogitErrors(hidden.shape[0], ["ref", *others])
    for v0, wc in _head_chunks(load_model_desc(str(path)), vocab_chunk):
        ref = hidden @ wc.T
        acc.add("ref", v0, ref, None)
        for n, o in others.items():
            acc.add(n, v0, np.asarray(o[:, v0:v0 + wc.shape[0]], np.float64), ref)
    out = {}
    for n in others:
        rel, _, agree = acc.metrics(n, "ref")
        out[n] = (rel, agree)
    return out
