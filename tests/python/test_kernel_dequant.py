"""Dequantization and the embedding gather against gguf.quants.dequantize (the independent
oracle): fp32 output within 1 ulp (the decoders are exact, so in practice bit-equal), fp16 output
equal to the oracle's value rounded to fp16. Random valid blocks include extreme scales: large
and small fp16 d, subnormal d, zero d, and maximal 6-bit sub-scales."""
import gguf
import numpy as np
import pytest
from helpers import null_view, status_and_error

from pyprefill import core, errors
from pyprefill._errors import _check
from pyprefill._ffi import ffi, lib
from pyprefill.kernels import gemm
from pyprefill.kernels._common import View

QTYPES = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q8_0": (32, 34),
          "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_XS": (256, 136)}
# byte offsets of the fp16 scale fields inside a block (d, and dmin for Q4_K / Q5_K)
F16_FIELDS = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0]}
REGIMES = ["normal", "large", "small", "subnormal", "zero_and_extremes", "max_scales"]


def _f16_values(rng, n: int, regime: str) -> np.ndarray:
    """n finite fp16 scale values (as float16) of the regime, random signs."""
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    if regime in ("normal", "max_scales"):
        v = rng.uniform(1e-3, 1e-1, n)
    elif regime == "large":
        v = rng.uniform(1e4, 65504.0, n)
    elif regime == "small":
        v = rng.uniform(6.104e-5, 1e-3, n)          # just above fp16's smallest normal
    elif regime == "subnormal":
        bits = rng.integers(1, 0x400, n).astype(np.uint16)   # exponent 0, mantissa != 0
        return (bits | np.where(sign < 0, 0x8000, 0).astype(np.uint16)).view(np.float16)
    elif regime == "zero_and_extremes":
        v = rng.choice([0.0, 65504.0, 2.0 ** -24, 2.0 ** -14, 1.0], n)
    else:
        raise ValueError(regime)
    return (sign * v).astype(np.float16)


def random_blocks(rng, qtype: str, n: int, k: int, regime: str = "normal") -> np.ndarray:
    """Random valid GGUF data (n, row_bytes) uint8: random bytes, with every fp16 scale field
    overwritten by a finite value of the regime (no NaN / Inf scales) and, for "max_scales",
    the sub-block scales set to their largest codes."""
    elems, nbytes = BLOCKS[qtype]
    if qtype == "F32":
        scale = {"large": 1e30, "small": 1e-30, "subnormal": 1e-40}.get(regime, 1.0)
        x = (rng.standard_normal((n, k)) * scale).astype(np.float32)
        return x.view(np.uint8).reshape(n, 4 * k)
    if qtype in ("F16", "BF16"):
        bits = rng.integers(0, 1 << 16, (n, k), dtype=np.uint32).astype(np.uint16)
        expmask = np.uint16(0x7C00 if qtype == "F16" else 0x7F80)
        bits[(bits & expmask) == expmask] &= np.uint16(0x8000 | 0x00FF)  # no Inf / NaN
        if regime == "subnormal":
            bits &= np.uint16(0x83FF if qtype == "F16" else 0x807F)      # exponent 0
        return bits.view(np.uint8).reshape(n, 2 * k)
    nb = n * (k // elems)
    data = rng.integers(0, 256, (nb, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        data[:, off:off + 2] = _f16_values(rng, nb, regime).view(np.uint8).reshape(nb, 2)
    if regime == "max_scales":
        if qtype in ("Q4_K", "Q5_K"):
            data[:, 4:16] = 0xFF                    # all 8 scales and 8 mins = 63
        elif qtype == "IQ4_XS":
            data[:, 2:8] = 0xFF                     # scales_h, scales_l: every ls = 63
        elif qtype == "Q6_K":
            data[:, 192:208] = np.where(np.arange(16) % 2 == 0, 0x80, 0x7F)  # -128 / 127
    return data.reshape(n, k // elems * nbytes)


def oracle(data: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]).astype(np.float32)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units in the last place of float32 (monotone integer mapping, +0 == -0)."""
    def key(x):
        i = np.ascontiguousarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(key(a) - key(b))


def _shape(qtype: str) -> tuple[int, int]:
    elems = BLOCKS[qtype][0]
    return 5, (100 if elems == 1 else 3 * elems)    # k = 100 for the element types: not /32


# ------------------------------------------------------------------ CPU: the generator itself


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("qtype", QTYPES)
def test_random_blocks_are_valid(rng, qtype, regime):
    n, k = _shape(qtype)
    data = random_blocks(rng, qtype, n, k, regime)
    assert data.dtype == np.uint8 and data.shape[0] == n
    assert data.nbytes == core.matrix_bytes(qtype, n, k)
    ref = oracle(data, qtype)
    assert ref.shape == (n, k) and np.isfinite(ref).all()


# ------------------------------------------------------------------ CPU: argument checks


def _status(call) -> tuple[int, str]:
    return status_and_error(call())


def test_dequantize_argument_checks():
    s, msg = _status(lambda: lib.pf_dequantize(ffi.NULL, ffi.NULL, null_view(), 2))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "out_f16=2" in msg
    s, msg = _status(lambda: lib.pf_dequantize(ffi.NULL, ffi.NULL, null_view(), 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg


def test_embed_argument_checks():
    ids = ffi.new("int32_t[]", [0, 1, 2])
    s, msg = _status(lambda: lib.pf_embed(ffi.NULL, ffi.NULL, ids, -1, null_view()))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "rows=-1" in msg
    s, msg = _status(lambda: lib.pf_embed(ffi.NULL, ffi.NULL, ffi.NULL, 3, null_view()))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "ids is NULL" in msg
    s, msg = _status(lambda: lib.pf_embed(ffi.NULL, ffi.NULL, ids, 3, null_view()))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "table is NULL" in msg
    with pytest.raises(errors.InvalidArgumentError, match="rows=-2"):
        _check(lib.pf_embed(ffi.NULL, ffi.NULL, ids, -2, null_view()))


def test_embed_ids_python_checks():
    with pytest.raises(errors.InvalidArgumentError, match=r"ids: expected a 1-D array"):
        gemm._ids_array(np.zeros((2, 2), np.int32))
    with pytest.raises(errors.InvalidArgumentError, match="ids: expected integers"):
        gemm._ids_array(np.array([1.5]))
    with pytest.raises(errors.InvalidArgumentError, match="int32"):
        gemm._ids_array(np.array([2 ** 40]))


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_f32_matches_gguf(ctx, rng, qtype, regime):
    n, k = _shape(qtype)
    data = random_blocks(rng, qtype, n, k, regime)
    ref = oracle(data, qtype)
    with ctx.weight(qtype, n, k, data) as w:
        out = gemm.dequantize_np(ctx, w)
    assert out.shape == ref.shape and np.isfinite(out).all()
    d = ulp_distance(out, ref)
    assert d.max() <= 1, (f"{qtype}/{regime}: {int((d > 1).sum())} elements > 1 ulp off; first at "
                          f"{np.argwhere(d > 1)[0]}: {out.flat[np.argmax(d)]} vs {ref.flat[np.argmax(d)]}")


@pytest.mark.gpu
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("qtype", QTYPES)
def test_dequantize_f16_is_rounded_oracle(ctx, rng, qtype, regime):
    n, k = _shape(qtype)
    data = random_blocks(rng, qtype, n, k, regime)
    with np.errstate(over="ignore"):                 # "large" K-quant values round to fp16 Inf
        ref = oracle(data, qtype).astype(np.float16)
    with ctx.weight(qtype, n, k, data) as w:
        out = gemm.dequantize_np(ctx, w, f16=True)
    assert out.dtype == np.float16 and out.shape == ref.shape
    assert not np.isnan(out).any()
    ref_b, out_b = ref.view(np.uint16), out.view(np.uint16)
    same = (ref_b == out_b) | ((ref == 0) & (out == 0) & (np.signbit(ref) == np.signbit(out)))
    assert same.all(), f"{qtype}/{regime}: {int((~same).sum())} fp16 values differ"


@pytest.mark.gpu
def test_dequantize_large_matrix_int64_offsets(ctx, rng):
    # a real embedding-sized weight (Qwen3-0.6B token_embd: 151936 x 1024, Q8_0): checks the
    # rows far from the start (byte offsets beyond 2^31 in the fp32 output)
    n, k, qtype = 151936, 1024, "Q8_0"
    data = random_blocks(rng, qtype, n, k)
    with ctx.weight(qtype, n, k, data) as w:
        out = gemm.dequantize_np(ctx, w)
    for rows in (slice(0, 3), slice(n // 2, n // 2 + 3), slice(n - 3, n)):
        assert ulp_distance(out[rows], oracle(data[rows], qtype)).max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", QTYPES)
def test_embed_matches_oracle_rows(ctx, rng, qtype):
    n_vocab, k = 300, 512
    data = random_blocks(rng, qtype, n_vocab, k)
    ids = np.concatenate([[0, n_vocab - 1, 5, 5], rng.integers(0, n_vocab, 33)]).astype(np.int32)
    ldo = k + 17
    with ctx.weight(qtype, n_vocab, k, data) as w:
        out = gemm.embed_np(ctx, w, ids, ldo=ldo)
    assert out.shape == (ids.size, ldo)
    assert np.isnan(out[:, k:]).all(), "columns beyond k were written"
    assert ulp_distance(out[:, :k], oracle(data[ids], qtype)).max() <= 1


@pytest.mark.gpu
def test_embed_real_vocab(ctx, rng):
    n_vocab, k, qtype = 151936, 1024, "Q6_K"
    data = random_blocks(rng, qtype, n_vocab, k)
    ids = rng.integers(0, n_vocab, 777).astype(np.int32)
    ids[:2] = [0, n_vocab - 1]
    with ctx.weight(qtype, n_vocab, k, data) as w:
        out = gemm.embed_np(ctx, w, ids)
    assert ulp_distance(out, oracle(data[ids], qtype)).max() <= 1


@pytest.mark.gpu
def test_embed_rejects_out_of_range_ids(ctx, rng):
    n_vocab, k = 100, 64
    data = random_blocks(rng, "Q8_0", n_vocab, k)
    with ctx.weight("Q8_0", n_vocab, k, data) as w, ctx.buffer(4 * k * 3) as out:
        out.poison()
        with pytest.raises(errors.InvalidArgumentError, match=r"ids\[2\] = 100 is outside \[0, n_vocab=100\)"):
            gemm.embed(ctx, w, np.array([1, 2, 100], np.int32), View(out, 0, k))
        with pytest.raises(errors.InvalidArgumentError, match=r"ids\[0\] = -1"):
            gemm.embed(ctx, w, np.array([-1, 2, 3], np.int32), out)
        ctx.synchronize()
        assert np.isnan(out.download(np.float32, (3, k))).all(), "a rejected call wrote output"
        empty = gemm.embed_np(ctx, w, np.zeros(0, np.int32))
        assert empty.shape == (0, k)


@pytest.mark.gpu
def test_dequantize_rejects_small_output(ctx, rng):
    data = random_blocks(rng, "Q4_0", 4, 64)
    with ctx.weight("Q4_0", 4, 64, data) as w, ctx.buffer(4 * 64 * 4 - 4) as out:
        with pytest.raises(errors.InvalidArgumentError, match="out holds 1020 bytes"):
            gemm.dequantize(ctx, w, out)
        with pytest.raises(errors.InvalidArgumentError, match="out holds 1020 bytes"):
            gemm.dequantize(ctx, w, View(out, 300), f16=True)    # (300 + 256) fp16 > 1020 bytes
        with pytest.raises(errors.UnsupportedError, match="written packed"):
            gemm.dequantize(ctx, w, View(out, 0, 65))
        gemm.dequantize(ctx, w, out, f16=True)   # 512 bytes suffice for fp16
        gemm.dequantize(ctx, w, View(out, 1, 64), f16=True)      # at an fp16 element offset
        ctx.synchronize()
