"""Fused kernels on the blocks (GEMM, GEMM + residual, gate+up+SwiGLU, GEMV) against a float64
reference of the dequantized weights (gguf.quants.dequantize): Q4_0 / Q8_0 (the ones they are
meant for) at real dims, every other type at small shapes. They use fp32 arithmetic (exactly
decoded weights, fp32 FMA accumulation), so the bound is design.md's 1e-5."""
import numpy as np
import pytest
from helpers import assert_close, make_weight, randn

from pyprefill import errors
from pyprefill.kernels import gemm
from pyprefill.kernels._common import View
from pyprefill.reference import ops

pytestmark = pytest.mark.gpu

FUSED = ["Q4_0", "Q8_0"]
OTHERS = ["F32", "F16", "BF16", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
BOUND = 1e-5  # fp32 math




def ref_swiglu(x, w64, n):
    """The oracle's gate+up+SwiGLU: silu(x Wg^T) * (x Wu^T), Wg = rows [0, n), Wu = [n, 2n)."""
    return ops.silu(ops.project(x, w64[:n])) * ops.project(x, w64[n:])


@pytest.mark.parametrize("accumulate", [False, True], ids=["gemm", "residual"])
@pytest.mark.parametrize("rows,k,n", [(1, 1024, 3584), (7, 96, 100), (777, 1024, 1000),
                                      (64, 2560, 9216), (33, 5120, 640), (130, 32, 65)])
@pytest.mark.parametrize("qtype", FUSED)
def test_qgemm(ctx, rng, qtype, rows, k, n, accumulate):
    w, w64 = make_weight(ctx, rng, qtype, n, k)
    with w:
        x = randn(rng, rows, k)
        y0 = randn(rng, rows, n) if accumulate else None
        out = gemm.qgemm_np(ctx, w, x, accumulate=accumulate, y=y0)
        ref = ops.project(x, w64) + (y0 if accumulate else 0.0)
        assert_close(f"qgemm {qtype} {rows}x{k}->{n}", ref, out, rtol=BOUND)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("qtype", FUSED)
def test_qgemm_strided_gap_untouched(ctx, rng, qtype, accumulate):
    rows, k, n = 70, 256, 130
    w, w64 = make_weight(ctx, rng, qtype, n, k)
    with w:
        x = randn(rng, rows, k + 5)
        x[:, k:] = np.nan                                   # ignored columns of a strided x
        ldy = n + 11
        y0 = np.full((rows, ldy), -777.0, np.float32)
        y0[:, :n] = randn(rng, rows, n)
        out = gemm.qgemm_np(ctx, w, x, accumulate=accumulate, y=y0)
        assert (out[:, n:] == -777.0).all(), "columns beyond n were written"
        ref = ops.project(x[:, :k], w64) + (y0[:, :n] if accumulate else 0.0)
        assert_close(f"qgemm strided {qtype}", ref, out[:, :n], rtol=BOUND)


@pytest.mark.parametrize("rows,k,n", [(1, 1024, 3584), (7, 1024, 3584), (777, 256, 200),
                                      (64, 2560, 9216), (5, 64, 33)])
@pytest.mark.parametrize("qtype", FUSED)
def test_qgemm_swiglu(ctx, rng, qtype, rows, k, n):
    w, w64 = make_weight(ctx, rng, qtype, 2 * n, k)     # rows [0, n) gate, [n, 2n) up
    with w:
        x = randn(rng, rows, k)
        out = gemm.qgemm_swiglu_np(ctx, w, x, ldo=n + 3)
        assert np.isnan(out[:, n:]).all(), "columns beyond n were written"
        ref = ref_swiglu(x, w64, n)
        assert_close(f"swiglu {qtype} {rows}x{k}->{n}", ref, out[:, :n], rtol=BOUND)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("k,n", [(1024, 3584), (2560, 9216), (32, 7), (5120, 1000)])
@pytest.mark.parametrize("qtype", FUSED)
def test_qgemv(ctx, rng, qtype, k, n, accumulate):
    w, w64 = make_weight(ctx, rng, qtype, n, k)
    with w:
        x = randn(rng, k)
        y0 = randn(rng, n) if accumulate else None
        out = gemm.qgemv_np(ctx, w, x, accumulate=accumulate, y=y0)
        ref = ops.project(x, w64) + (y0 if accumulate else 0.0)
        assert_close(f"qgemv {qtype} {k}->{n}", ref, out, rtol=BOUND)


def test_fused_matches_f32_leg(ctx, rng):
    w, _ = make_weight(ctx, rng, "Q4_0", 300, 512)
    with w:
        x = randn(rng, 19, 512)
        fused = gemm.qgemm_np(ctx, w, x)
        leg = gemm.project_np(ctx, w, x, leg="f32")
        assert_close("fused vs f32 leg", leg.astype(np.float64), fused, rtol=BOUND)


@pytest.mark.parametrize("qtype", OTHERS)
def test_fused_other_qtypes(ctx, rng, qtype):
    k, n = 512, 96
    w, w64 = make_weight(ctx, rng, qtype, 2 * n, k)
    with w:
        x = randn(rng, 7, k)
        y0 = randn(rng, 7, 2 * n)
        assert_close(f"qgemm {qtype}", ops.project(x, w64) + y0,
                     gemm.qgemm_np(ctx, w, x, accumulate=True, y=y0), rtol=BOUND)
        assert_close(f"qgemv {qtype}", ops.project(x[0], w64), gemm.qgemv_np(ctx, w, x[0]),
                     rtol=BOUND)
        assert_close(f"swiglu {qtype}", ref_swiglu(x, w64, n), gemm.qgemm_swiglu_np(ctx, w, x),
                     rtol=BOUND)


def test_fused_rejects_bad_shapes(ctx, rng):
    w, w64 = make_weight(ctx, rng, "F32", 8, 100)       # k not a multiple of 32
    with w:
        with pytest.raises(errors.InvalidArgumentError, match="k=100 must be a multiple of 32"):
            gemm.qgemm_np(ctx, w, randn(rng, 3, 100))
        x = randn(rng, 1, 100)                          # one row: the GEMV takes any k
        assert_close("qgemv k=100", ops.project(x, w64), gemm.qgemm_np(ctx, w, x), rtol=BOUND)
    w, _ = make_weight(ctx, rng, "Q8_0", 63, 64)
    with w:
        with pytest.raises(errors.InvalidArgumentError, match="even count"):
            gemm.qgemm_swiglu_np(ctx, w, randn(rng, 3, 64))
        with pytest.raises(errors.InvalidArgumentError, match="x: expected 64 columns"):
            gemm.qgemv_np(ctx, w, randn(rng, 63))
        with ctx.upload(randn(rng, 3, 64)) as xb:
            with pytest.raises(errors.InvalidArgumentError, match="y overlaps x"):
                gemm.qgemm(ctx, w, View(xb, 0, 64), View(xb, 0, 63), 3)
            with pytest.raises(errors.InvalidArgumentError, match="y overlaps x"):
                gemm.qgemv(ctx, w, xb, View(xb, 10))
        empty = gemm.qgemm_np(ctx, w, np.zeros((0, 64), np.float32))
        assert empty.shape == (0, 63)
