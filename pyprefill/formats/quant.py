"""NumPy quantizers that write GGML blocks, and fast random valid blocks for synthetic models.

`quantize(x, qtype)`: x (rows, k) float -> uint8 (rows, row_bytes(qtype, k)), bit-compatible with
ggml's block layouts (ggml-common.h) so that `gguf.quants.dequantize` and llama.cpp read them.
The scale searches follow ggml's reference quantizers (ggml-quants.c `quantize_row_*_ref`,
`make_qkx2_quants`, `make_qx_quants`, `quantize_row_iq4_xs_impl`) in a vectorised, slightly
simplified form (fixed candidate grids, no imatrix).

`random_blocks(rows, k, qtype, rng)`: random quant bits with finite fp16 scales chosen so that
the dequantized weights have an RMS of about `scale` and a mean near zero (benchmark models).
"""
from __future__ import annotations

import numpy as np

from .model_desc import (QTYPE_BF16, QTYPE_BLOCK, QTYPE_F16, QTYPE_F32, QTYPE_IQ4_XS, QTYPE_NAME,
                         QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, row_bytes)
from ..errors import InvalidArgumentError, UnsupportedError

QK_K = 256
# IQ4_NL / IQ4_XS non-linear 4-bit grid (ggml-common.h kvalues_iq4nl).
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
# Sub-blocks quantized per call of the K-quant searches: bounds temporaries to ~100 MB.
_CHUNK_SUBBLOCKS = 1 << 15

WRITABLE_QTYPES = (QTYPE_F32, QTYPE_F16, QTYPE_BF16, QTYPE_Q4_0, QTYPE_Q8_0,
                   QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_XS)


# ---------------------------------------------------------------------------------------------
# small helpers

def _f16(x: np.ndarray) -> np.ndarray:
    """float -> fp16 bytes (..., 2) uint8, saturating to the finite fp16 range."""
    return np.clip(x, -65504.0, 65504.0).astype(np.float16)[..., None].view(np.uint8)


def _f16_round(x: np.ndarray) -> np.ndarray:
    """The float32 value a scale takes after being stored as fp16."""
    return np.clip(x, -65504.0, 65504.0).astype(np.float16).astype(np.float32)


def _safe_inv(x: np.ndarray) -> np.ndarray:
    """1/x, 0 where x == 0 (ggml: `id = d ? 1.0f/d : 0.0f`)."""
    out = np.zeros_like(x)
    np.divide(1.0, x, out=out, where=x != 0)
    return out


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 2*m) values 0..15 -> (n, m) bytes: element l < m low nibble, l >= m high nibble."""
    m = q.shape[-1] // 2
    return (q[..., :m] | (q[..., m:] << 4)).astype(np.uint8)


def pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """6-bit scales and mins (n, 8) -> the 12-byte Q4_K/Q5_K `scales` field (n, 12).

    Bytes 0-3: sc[0..3] | top 2 bits of sc[4..7] in bits 6-7; bytes 4-7: the same for mins;
    bytes 8-11: low 4 bits of sc[4..7] | low 4 bits of mn[4..7] << 4 (ggml get_scale_min_k4).
    """
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.empty(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return out


def _check_input(x: np.ndarray, qtype: int) -> np.ndarray:
    if qtype not in WRITABLE_QTYPES:
        raise UnsupportedError(f"cannot quantize to ggml type {qtype} "
                               f"(writable: {', '.join(QTYPE_NAME[t] for t in WRITABLE_QTYPES)})")
    x = np.asarray(x)
    if x.ndim != 2:
        raise InvalidArgumentError(f"quantize expects a 2-D (rows, k) array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InvalidArgumentError("quantize input contains NaN or Inf")
    row_bytes(qtype, x.shape[1])  # raises ValueError when k is not a multiple of the block
    return np.ascontiguousarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# scale searches (vectorised over sub-blocks)

def _search_affine(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                   nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """x, w (n, s) -> (scale, the_min) (n,) with x ~ scale*L - the_min, L in [0, nmax].

    ggml's make_qkx2_quants: min clamped to <= 0, then candidate inverse scales
    (nmax + rmin + rdelta*i)/(max - min), each refined by weighted least squares for (scale, min).
    """
    xmin = np.minimum(x.min(axis=1), 0.0)
    xmax = x.max(axis=1)
    rng_ = xmax - xmin
    flat = rng_ <= 0
    rng_ = np.where(flat, 1.0, rng_)
    best_scale = rng_ / nmax
    best_min = xmin.copy()
    L = np.clip(np.rint((x - xmin[:, None]) / best_scale[:, None]), 0, nmax)
    best_err = (w * (best_scale[:, None] * L + best_min[:, None] - x) ** 2).sum(axis=1)
    sw = w.sum(axis=1)
    sx = (w * x).sum(axis=1)
    for i in range(nstep + 1):
        iscale = (nmax + rmin + rdelta * i) / rng_
        L = np.clip(np.rint(iscale[:, None] * (x - xmin[:, None])), 0, nmax)
        sl = (w * L).sum(axis=1)
        sl2 = (w * L * L).sum(axis=1)
        sxl = (w * L * x).sum(axis=1)
        D = sw * sl2 - sl * sl
        ok = D > 0
        Dn = np.where(ok, D, 1.0)
        scale = (sw * sxl - sx * sl) / Dn
        mn = (sl2 * sx - sl * sxl) / Dn
        pos = mn > 0  # ggml: a positive min is replaced by 0 and the scale refit alone
        scale = np.where(pos, sxl / np.where(sl2 > 0, sl2, 1.0), scale)
        mn = np.where(pos, 0.0, mn)
        err = (w * (scale[:, None] * L + mn[:, None] - x) ** 2).sum(axis=1)
        better = ok & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, mn, best_min)
    best_scale = np.where(flat, 0.0, best_scale)
    return best_scale.astype(np.float32), (-best_min).astype(np.float32)


def _best_ls_scale(x: np.ndarray, w: np.ndarray, ntry: int, levels) -> np.ndarray:
    """x, w (n, s) -> the scale (n,) of the best of 2*ntry+1 candidate level sets.

    `levels(i, vmax)` gives candidate i's quantized values (n, s) for the signed extremes vmax
    (n,); each candidate's scale is refit by weighted least squares (sum w*x*q / sum w*q*q) and
    the one with the smallest weighted error wins (ggml's make_qx_quants / iq4 search loop).
    """
    idx = np.abs(x).argmax(axis=1)
    vmax = x[np.arange(x.shape[0]), idx]
    zero = vmax == 0
    vmax = np.where(zero, 1.0, vmax)
    best_scale = np.zeros(x.shape[0], np.float32)
    best_err = np.full(x.shape[0], np.inf, np.float32)
    for i in range(-ntry, ntry + 1):
        q = levels(i, vmax)
        sxq = (w * x * q).sum(axis=1)
        sq2 = (w * q * q).sum(axis=1)
        scale = np.where(sq2 > 0, sxq / np.where(sq2 > 0, sq2, 1.0), 0.0)
        err = (w * (scale[:, None] * q - x) ** 2).sum(axis=1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
    return np.where(zero, 0.0, best_scale).astype(np.float32)


def _search_symmetric(x: np.ndarray, w: np.ndarray, nmax: int, ntry: int) -> np.ndarray:
    """x, w (n, s) -> scale (n,) with x ~ scale*L, L in [-nmax, nmax-1].

    ggml's make_qx_quants (rmse_type 1): the signed extreme maps to -nmax, then inverse scales
    -(nmax + 0.1*i)/max for i in [-ntry, ntry], each refit by weighted least squares.
    """
    return _best_ls_scale(x, w, ntry, lambda i, vmax: np.clip(
        np.rint((-(nmax + 0.1 * i) / vmax)[:, None] * x), -nmax, nmax - 1))


def _nearest_iq4(v: np.ndarray) -> np.ndarray:
    """Index of the nearest kvalues_iq4nl entry (ggml best_index_int8), v any shape."""
    mid = (KVALUES_IQ4NL[1:] + KVALUES_IQ4NL[:-1]) / 2
    return np.searchsorted(mid, v).astype(np.uint8)


def _search_iq4(x: np.ndarray, w: np.ndarray, ntry: int = 7) -> np.ndarray:
    """x, w (n, 32) -> scale (n,) with x ~ scale*kvalues[L] (quantize_row_iq4_xs_impl search)."""
    return _best_ls_scale(x, w, ntry, lambda i, vmax: KVALUES_IQ4NL[
        _nearest_iq4(((i + KVALUES_IQ4NL[0]) / vmax)[:, None] * x)])


# ---------------------------------------------------------------------------------------------
# per-type block writers: blocks (n, block_elems) float32 -> (n, block_bytes) uint8

def _q4_0(b: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q4_0_ref: d = signed max / -8, q = x/d + 8.5 truncated, clamp 15."""
    idx = np.abs(b).argmax(axis=1)
    vmax = b[np.arange(b.shape[0]), idx]
    d = vmax / -8.0
    q = np.clip((b * _safe_inv(d)[:, None] + 8.5).astype(np.int32), 0, 15).astype(np.uint8)
    return np.concatenate([_f16(d), _pack_nibbles(q)], axis=1)


def _q8_0(b: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q8_0_ref: d = amax/127, q = round(x/d)."""
    d = np.abs(b).max(axis=1) / 127.0
    q = np.rint(b * _safe_inv(d)[:, None]).astype(np.int8)
    return np.concatenate([_f16(d), q.view(np.uint8)], axis=1)


def _qk_affine(b: np.ndarray, nbits: int) -> np.ndarray:
    """Q4_K (nbits 4) / Q5_K (nbits 5) super-blocks, ggml quantize_row_q4_K_ref / q5_K_ref."""
    n = b.shape[0]
    nmax = (1 << nbits) - 1
    sub = b.reshape(n * 8, 32)
    av = np.sqrt((sub * sub).mean(axis=1, keepdims=True))
    w = av + np.abs(sub)  # ggml's weights without an importance matrix
    if nbits == 4:
        scale, the_min = _search_affine(sub, w, nmax, -1.0, 0.1, 20)
    else:
        scale, the_min = _search_affine(sub, w, nmax, -0.5, 0.1, 15)
    scale = scale.reshape(n, 8)
    the_min = the_min.reshape(n, 8)
    max_scale = scale.max(axis=1)
    max_min = the_min.max(axis=1)
    ls = np.clip(np.rint(scale * _safe_inv(max_scale / 63)[:, None]), 0, 63)
    lm = np.clip(np.rint(the_min * _safe_inv(max_min / 63)[:, None]), 0, 63)
    d = _f16_round(max_scale / 63)
    dmin = _f16_round(max_min / 63)
    dl = d[:, None] * ls                     # effective sub-block scales after fp16 rounding
    ml = dmin[:, None] * lm
    q = np.rint((b.reshape(n, 8, 32) + ml[..., None]) * _safe_inv(dl)[..., None])
    q = np.clip(q, 0, nmax).astype(np.uint8)  # (n, 8, 32)
    # qs: group g of 32 bytes = sub-block 2g (low nibbles) and 2g+1 (high nibbles)
    lo = q & 15
    qs = (lo[:, 0::2] | (lo[:, 1::2] << 4)).reshape(n, 128)
    parts = [_f16(d), _f16(dmin), pack_k_scales(ls, lm)]
    if nbits == 5:
        # qh[l] bit j = bit 4 of element l of sub-block j
        hi = (q >> 4).astype(np.uint8)
        qh = np.zeros((n, 32), np.uint8)
        for j in range(8):
            qh |= hi[:, j, :] << j
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1)


def _q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks, ggml quantize_row_q6_K_ref: 16 sub-blocks of 16, int8 scales, fp16 d.

    Layout (210 bytes): ql[128], qh[64], scales[16] int8, d fp16. Element e = 128h + t:
    low 4 bits in ql[64h + t%64] (nibble t//64), high 2 bits in qh[32h + t%32] (bits 2*(t//32)).
    """
    n = b.shape[0]
    sub = b.reshape(n * 16, 16)
    scale = _search_symmetric(sub, sub * sub, 32, 9).reshape(n, 16)
    idx = np.abs(scale).argmax(axis=1)
    max_scale = scale[np.arange(n), idx]
    iscale = -128.0 * _safe_inv(max_scale)
    d = _f16_round(_safe_inv(iscale))
    ls = np.clip(np.rint(iscale[:, None] * scale), -128, 127)
    dl = d[:, None] * ls
    q = np.clip(np.rint(b.reshape(n, 16, 16) * _safe_inv(dl)[..., None]), -32, 31)
    q = (q + 32).astype(np.uint8).reshape(n, 2, 128)   # (n, half, t)
    lo = q & 15
    ql = (lo[:, :, :64] | (lo[:, :, 64:] << 4)).reshape(n, 128)
    hi = q >> 4
    qh = (hi[:, :, 0:32] | (hi[:, :, 32:64] << 2) | (hi[:, :, 64:96] << 4)
          | (hi[:, :, 96:128] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, ls.astype(np.int8).view(np.uint8), _f16(d)], axis=1)


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    """IQ4_XS super-blocks, ggml quantize_row_iq4_xs_impl without imatrix (weights x^2).

    Layout (136 bytes): d fp16, scales_h u16 (2 bits per sub-block), scales_l[4] (4 bits per
    sub-block), qs[128] (sub-block j = bytes 16j..16j+15, element l < 16 low, l >= 16 high).
    Sub-block scale = d * (6-bit value - 32).
    """
    n = b.shape[0]
    sub = b.reshape(n * 8, 32)
    scale = _search_iq4(sub, sub * sub).reshape(n, 8)
    idx = np.abs(scale).argmax(axis=1)
    max_scale = scale[np.arange(n), idx]
    d = _f16_round(max_scale / -32.0)
    ls = np.clip(np.rint(scale * _safe_inv(d)[:, None]), -32, 31)
    dl = d[:, None] * ls
    q = _nearest_iq4(b.reshape(n, 8, 32) * _safe_inv(dl)[..., None])  # (n, 8, 32)
    qs = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(n, 128)
    l6 = (ls + 32).astype(np.uint16)
    scales_h = np.zeros(n, np.uint16)
    for j in range(8):
        scales_h |= (l6[:, j] >> 4) << (2 * j)
    low = (l6 & 15).astype(np.uint8)
    scales_l = low[:, 0::2] | (low[:, 1::2] << 4)
    return np.concatenate([_f16(d), scales_h[:, None].view(np.uint8), scales_l, qs], axis=1)


_BLOCK_WRITERS = {
    QTYPE_Q4_0: _q4_0, QTYPE_Q8_0: _q8_0,
    QTYPE_Q4_K: lambda b: _qk_affine(b, 4), QTYPE_Q5_K: lambda b: _qk_affine(b, 5),
    QTYPE_Q6_K: _q6_k, QTYPE_IQ4_XS: _iq4_xs,
}


def quantize(x: np.ndarray, qtype: int) -> np.ndarray:
    """x (rows, k) float -> uint8 (rows, row_bytes(qtype, k)) GGML blocks of type qtype."""
    x = _check_input(x, qtype)
    rows, k = x.shape
    if qtype == QTYPE_F32:
        return x.view(np.uint8).reshape(rows, 4 * k).copy()
    if qtype == QTYPE_F16:
        return np.clip(x, -65504, 65504).astype(np.float16).view(np.uint8).reshape(rows, 2 * k)
    if qtype == QTYPE_BF16:
        # round to nearest even on the upper 16 bits (ggml_compute_fp32_to_bf16; no NaN here)
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype(np.uint16).view(np.uint8).reshape(rows, 2 * k)
    elems, nbytes = QTYPE_BLOCK[qtype]
    blocks = x.reshape(-1, elems)
    per_chunk = max(1, _CHUNK_SUBBLOCKS * 32 // elems)
    out = np.empty((blocks.shape[0], nbytes), np.uint8)
    writer = _BLOCK_WRITERS[qtype]
    for s in range(0, blocks.shape[0], per_chunk):
        out[s:s + per_chunk] = writer(blocks[s:s + per_chunk])
    return out.reshape(rows, row_bytes(qtype, k))


# ---------------------------------------------------------------------------------------------
# random valid blocks

def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes, fast (the bit generator's raw 64-bit output, ~GB/s)."""
    words = rng.bit_generator.random_raw((n + 7) // 8)
    return np.asarray(words, dtype=np.uint64).view(np.uint8)[:n]


def _random_d(rng: np.random.Generator, n: int, base: float) -> np.ndarray:
    """n fp16 scales as bytes (n, 2): base * U(0.75, 1.25), always finite and positive."""
    return _f16(base * (0.75 + 0.5 * rng.random(n, dtype=np.float32)))


def random_blocks(rows: int, k: int, qtype: int, rng: np.random.Generator,
                  scale: float = 0.03) -> np.ndarray:
    """Random valid GGML data (rows, row_bytes(qtype, k)) uint8 with dequantized RMS ~ scale.

    Quant bits are uniform random; scales are set so that the mean is ~0: Q4_K/Q5_K use
    mins m = sc and dmin = d * (mid-level), Q6_K / IQ4_XS / Q4_0 / Q8_0 are symmetric codes.
    """
    if qtype not in WRITABLE_QTYPES:
        raise UnsupportedError(f"cannot write ggml type {qtype}")
    rb = row_bytes(qtype, k)
    if qtype in (QTYPE_F32, QTYPE_F16, QTYPE_BF16):
        w = (rng.standard_normal((rows, k), dtype=np.float32) * np.float32(scale))
        return quantize(w, qtype)
    elems, nbytes = QTYPE_BLOCK[qtype]
    n = rows * (k // elems)
    out = _random_bytes(rng, n * nbytes).reshape(n, nbytes).copy()
    if qtype == QTYPE_Q4_0:      # q - 8 uniform on [-8, 7]: RMS ~ 4.6
        out[:, 0:2] = _random_d(rng, n, scale / 4.6)
    elif qtype == QTYPE_Q8_0:    # uniform int8: RMS ~ 73.9
        out[:, 0:2] = _random_d(rng, n, scale / 73.9)
    elif qtype in (QTYPE_Q4_K, QTYPE_Q5_K):
        mid = 7.5 if qtype == QTYPE_Q4_K else 15.5      # mean of the uniform code
        rms_q = 4.6 if qtype == QTYPE_Q4_K else 9.2     # RMS of the centred code
        sc = (32 + (_random_bytes(rng, n * 8) & 31)).reshape(n, 8)  # 6-bit scales 32..63
        d = (scale / (rms_q * 48.0)) * (0.75 + 0.5 * rng.random(n, dtype=np.float32))
        out[:, 0:2] = _f16(d)
        out[:, 2:4] = _f16(d * mid)                     # dmin * m = d * sc * mid: zero mean
        out[:, 4:16] = pack_k_scales(sc, sc)
    elif qtype == QTYPE_Q6_K:    # q - 32 uniform on [-32, 31]: RMS ~ 18.5; scales 16..127
        out[:, 192:208] = (16 + (_random_bytes(rng, n * 16) % 112)).reshape(n, 16)
        out[:, 208:210] = _random_d(rng, n, scale / (18.5 * 72.0))
    elif qtype == QTYPE_IQ4_XS:  # kvalues RMS ~ 68; 6-bit scales 40..63 -> 8..31
        out[:, 0:2] = _random_d(rng, n, scale / (68.0 * 20.0))
        l6 = (40 + (_random_bytes(rng, n * 8) % 24)).reshape(n, 8).astype(np.uint16)
        sh = np.zeros(n, np.uint16)
        for j in range(8):
            sh |= (l6[:, j] >> 4) << (2 * j)
        out[:, 2:4] = sh[:, None].view(np.uint8)
        low = (l6 & 15).astype(np.uint8)
        out[:, 4:8] = low[:, 0::2] | (low[:, 1::2] << 4)
    return out.reshape(rows, rb)
