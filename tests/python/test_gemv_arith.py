"""The arithmetic the GEMV form of the blocks product rests on (cuda/kernels/gemm/gemm_q16_gemv_kernel.cuh),
checked exhaustively on the CPU: every value its fp16 operands take is an integer (or an exact
fraction) that fp16 holds exactly, so its products with the fp16 rows are exact and the result is
the exact weight's within fp32 accumulation. A change of a constant or of a type's range fails here
before it reaches the GPU tests (test_kernel_gemm_q16.py: the kernel against float64).

- The bias trick: the fp16 with bits 0x6400 | v is 1024 + v for v < 1024 (the quant's low form),
  and with bits 0x6400 | (q << 4) it is 1024 + 16 q (the high nibble in place).
- Q4_K / Q5_K: the multipliers and addends (sc, -1024 sc; sc / 16, -64 sc) are exact fp16 for every
  6-bit scale, and one fused multiply-add of the biased quant gives sc * q exactly (sc * q <= 945,
  Q5_K 1953: below 2048, where fp16's integers stop being consecutive).
- Q6_K: sc * (q - 32) reaches 4064, past 2048, so the kernel splits the int8 scale as 16 a + b
  (b = sc & 15, a = sc >> 4); a + 8 comes from the byte as ((byte >> 4) & 15) ^ 8; every constant
  (b, -1056 b, b / 16, -96 b; a, -1056 a, a / 16, -96 a) and every product b (q - 32), a (q - 32) is
  exact fp16, and b (q - 32) + 16 a (q - 32) = sc (q - 32).
The fused multiply-add is modelled as the exact product and sum in float64 (exact for these sizes)
rounded once to fp16, as fma.rn.f16x2 does."""
from __future__ import annotations

import numpy as np


def _f16_bits(bits: int) -> float:
    return float(np.array([bits], np.uint16).view(np.float16)[0])


def _exact16(v: float) -> bool:
    """Whether fp16 holds v exactly (and finitely)."""
    h = np.float16(v)
    return bool(np.isfinite(h)) and float(h) == v


def _fma16(a: float, b: float, c: float) -> float:
    """fma.rn.f16: a * b + c computed exactly (float64 holds these products and sums exactly), then
    rounded once to fp16."""
    return float(np.float16(a * b + c))


def test_bias_trick_low_and_high_forms():
    for v in range(1024):
        assert _f16_bits(0x6400 | v) == 1024 + v
    for q in range(64):  # a nibble, a Q5_K five-bit or a Q6_K six-bit quant above bit 4
        assert _f16_bits(0x6400 | (q << 4)) == 1024 + 16 * q


def test_q4k_q5k_scaled_quants_are_exact():
    for sc in range(64):
        lo_mul, lo_add = float(sc), -1024.0 * sc
        hi_mul, hi_add = sc / 16, -64.0 * sc
        for c in (lo_mul, lo_add, hi_mul, hi_add):
            assert _exact16(c), (sc, c)
        assert _exact16(sc)  # the min's operand m (the same 6-bit range)
        for q in range(32):  # Q4_K's nibbles and Q5_K's five bits
            assert _fma16(1024 + q, lo_mul, lo_add) == sc * q, (sc, q)
            assert _fma16(1024 + 16 * q, hi_mul, hi_add) == sc * q, (sc, q)
    assert 63 * 31 < 2048


def test_q6k_split_scale_is_exact():
    for byte in range(256):
        sc = byte - 256 if byte >= 128 else byte  # the int8 scale
        b, a = sc & 15, sc >> 4
        assert 16 * a + b == sc and 0 <= b <= 15 and -8 <= a <= 7
        assert ((byte >> 4) & 15) ^ 8 == a + 8  # the kernel's a + 8 from the byte
        consts = (b, -1056.0 * b, b / 16, -96.0 * b, a, -1056.0 * a, a / 16, -96.0 * a)
        assert all(_exact16(c) for c in consts), sc
        for q in range(64):
            a1 = _fma16(1024 + q, b, -1056.0 * b)              # low nibbles: 1024 + q
            a2 = _fma16(1024 + q, a, -1056.0 * a)
            h1 = _fma16(1024 + 16 * q, b / 16, -96.0 * b)      # high nibbles: 1024 + 16 q
            h2 = _fma16(1024 + 16 * q, a / 16, -96.0 * a)
            assert a1 == h1 == b * (q - 32) and a2 == h2 == a * (q - 32), (sc, q)
            assert a1 + 16 * a2 == sc * (q - 32)


def test_q6k_one_product_would_not_be_exact():
    """Why the split: some int8 scale times q - 32 is an odd integer past 2048, which fp16 rounds."""
    assert not _exact16(127 * 31) and 127 * 31 > 2048
