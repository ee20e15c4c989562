"""pyprefill.formats.quant: GGML block writers against gguf.quants.dequantize (CPU only)."""
import gguf
import numpy as np
import pytest

from pyprefill.errors import InvalidArgumentError, UnsupportedError
from pyprefill.formats.model_desc import (QTYPE_BF16, QTYPE_F16, QTYPE_F32, QTYPE_IQ4_XS,
                                          QTYPE_NAME, QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K,
                                          QTYPE_Q6_K, QTYPE_Q8_0, row_bytes)
from pyprefill.formats.quant import quantize, random_blocks

# relative RMS error bound of a round trip on standard-normal data, per type
BOUNDS = {QTYPE_F32: 0.0, QTYPE_F16: 1e-3, QTYPE_BF16: 1e-2, QTYPE_Q8_0: 1e-2,
          QTYPE_Q6_K: 2e-2, QTYPE_Q5_K: 4e-2, QTYPE_Q4_K: 1e-1, QTYPE_Q4_0: 1e-1,
          QTYPE_IQ4_XS: 1e-1}


def rel_rms(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("qtype", list(BOUNDS), ids=lambda q: QTYPE_NAME[q])
@pytest.mark.parametrize("rows", [1, 7])
def test_round_trip(qtype, rows):
    rng = np.random.default_rng(1000 + qtype + rows)
    x = rng.standard_normal((rows, 512)).astype(np.float32)
    x[0, :32] *= 50.0   # one block with a much larger range: scales are per block
    q = quantize(x, qtype)
    assert q.dtype == np.uint8 and q.shape == (rows, row_bytes(qtype, 512))
    y = gguf.quants.dequantize(q, gguf.GGMLQuantizationType(qtype)).reshape(x.shape)
    err = rel_rms(y, x)
    assert np.isfinite(y).all()
    assert err <= BOUNDS[qtype], f"{QTYPE_NAME[qtype]}: relative RMS error {err:.3g}"
    # the error bound must hold block-locally too, not only thanks to the large block
    err_rest = rel_rms(y[:, 256:], x[:, 256:])
    assert err_rest <= BOUNDS[qtype], f"{QTYPE_NAME[qtype]}: {err_rest:.3g} on normal blocks"


@pytest.mark.parametrize("qtype", [QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_BF16],
                         ids=lambda q: QTYPE_NAME[q])
def test_matches_gguf_reference_quantizer(qtype):
    """gguf-py implements ggml's reference Q4_0/Q8_0/BF16 quantizers: bytes must be equal."""
    x = np.random.default_rng(5).standard_normal((16, 256)).astype(np.float32)
    ours = quantize(x, qtype)
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType(qtype))
    assert np.array_equal(ours, ref.reshape(ours.shape))


@pytest.mark.parametrize("qtype", [QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_XS, QTYPE_Q4_0,
                                   QTYPE_Q8_0], ids=lambda q: QTYPE_NAME[q])
def test_zero_and_constant_blocks(qtype):
    """All-zero rows give zero (no NaN from 0/0); a constant row stays close to constant."""
    x = np.zeros((2, 256), np.float32)
    x[1] = 0.5
    y = gguf.quants.dequantize(quantize(x, qtype), gguf.GGMLQuantizationType(qtype))
    y = y.reshape(x.shape)
    assert np.all(y[0] == 0)
    assert np.allclose(y[1], 0.5, rtol=0.02), y[1][:8]


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of the Q4_K block"):
        quantize(np.zeros((2, 100), np.float32), QTYPE_Q4_K)
    with pytest.raises(InvalidArgumentError, match="2-D"):
        quantize(np.zeros(256, np.float32), QTYPE_Q8_0)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        quantize(np.full((1, 32), np.nan, np.float32), QTYPE_Q8_0)
    with pytest.raises(UnsupportedError, match="ggml type 10"):
        quantize(np.zeros((1, 256), np.float32), 10)


@pytest.mark.parametrize("qtype", list(BOUNDS), ids=lambda q: QTYPE_NAME[q])
def test_random_blocks_are_valid(qtype):
    rng = np.random.default_rng(qtype)
    b = random_blocks(64, 1024, qtype, rng, scale=0.03)
    assert b.dtype == np.uint8 and b.shape == (64, row_bytes(qtype, 1024))
    w = gguf.quants.dequantize(b, gguf.GGMLQuantizationType(qtype))
    assert np.isfinite(w).all()
    rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    assert 0.02 <= rms <= 0.045, f"{QTYPE_NAME[qtype]}: RMS {rms}"
    assert abs(float(w.mean())) < 0.2 * rms, f"{QTYPE_NAME[qtype]}: mean {w.mean()}"
    # random: two draws differ
    assert not np.array_equal(b, random_blocks(64, 1024, qtype, rng, scale=0.03))
