"""The 8-bit leg (PF_GEMM_INT8, issue 31; docs/int8-recipe.md): activations and weights quantized
to int8 per row and 128 columns, int8 tensor cores with one fp32 promotion per group.

The GPU must compute what pyprefill.reference.quant_sim.gemm_i8_reference computes: the same
codes (its float32 quantizer is the kernel's, bit for bit), the exact product of the dequantized
operands in float64; only the kernel's fp32 promotion and accumulation differ (bound 1e-5).
Outputs are NaN-poisoned first, so every unwritten element fails."""
import numpy as np
import pytest
from helpers import assert_close, make_weight, randn

from pyprefill import errors
from pyprefill.kernels import gemm
from pyprefill.reference import quant_sim as qs

QTYPES = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
I8_BOUND = 1e-5  # against the recipe's float64 product: fp32 promotion and accumulation only


@pytest.fixture
def hopper(ctx, rng):
    """Skips (with the library's reason) where the 8-bit leg cannot run: it needs an sm_90a
    build on a compute capability 9.0 device; every other device gets UnsupportedError."""
    w, _ = make_weight(ctx, rng, "F32", 8, 128)
    with w:
        try:
            gemm.project_np(ctx, w, randn(rng, 2, 128), leg="int8")
        except errors.UnsupportedError as e:
            assert "Hopper" in str(e), str(e)
            pytest.skip(f"the 8-bit leg does not run on this device: {e}")
    return ctx


def _want(x: np.ndarray, w64: np.ndarray) -> np.ndarray:
    return qs.gemm_i8_reference(x, w64.astype(np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("cached", [True, False], ids=["cache", "streaming"])
@pytest.mark.parametrize("rows,n,k", [(1, 96, 512), (7, 200, 320), (300, 384, 1024),
                                      (130, 136, 2048)])
@pytest.mark.parametrize("qtype", QTYPES)
def test_int8_leg_is_the_recipe(hopper, rng, qtype, rows, n, k, cached):
    """Every GGUF type, ragged rows / n / k (k = 320: a short last group; 768 for the types
    of 256-wide blocks), cached or quantized per call: the recipe's product within fp32
    accumulation, and ~1e-2 from the exact one."""
    ctx = hopper
    if k == 320 and qtype in ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS"):
        k = 768
    w, w64 = make_weight(ctx, rng, qtype, n, k)
    with w:
        if cached:
            gemm.weight_cache_i8(w)
        x = randn(rng, rows, k)
        got = gemm.project_np(ctx, w, x, leg="int8")
        assert_close(f"int8/{qtype}", _want(x, w64), got, rtol=I8_BOUND)
        exact = x.astype(np.float64) @ w64.T
        err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
        assert 1e-4 < err < 5e-2, f"int8/{qtype}: {err:.2e} from the exact product"
        y0 = randn(rng, rows, n)
        acc = gemm.project_np(ctx, w, x, leg="int8", accumulate=True, y=y0)
        assert_close(f"int8 accumulate/{qtype}", y0 + _want(x, w64), acc, rtol=I8_BOUND)


@pytest.mark.gpu
def test_int8_cache_and_streaming_bitwise_and_strided_output(hopper, rng):
    """The weight's int8 copy and the per-call quantization (slabs of whole 128-row blocks) give
    the same bits; a strided output leaves its gap columns alone; many K groups (k = 5120, 40
    promotions) and a ragged last block of rows (n = 600)."""
    ctx = hopper
    n, k, rows, ldy = 600, 5120, 257, 616
    w, w64 = make_weight(ctx, rng, "Q4_K", n, k)
    with w:
        x = randn(rng, rows, k)
        streamed = gemm.project_np(ctx, w, x, leg="int8")
        gemm.weight_cache_i8(w)
        y0 = randn(rng, rows, ldy)
        got = gemm.project_np(ctx, w, x, leg="int8", y=y0.copy(), ldy=ldy)
        assert np.array_equal(got[:, :n], streamed), "the int8 copy differs from the streamed form"
        assert np.array_equal(got[:, n:], y0[:, n:]), "gap columns were written"
        assert_close("int8 k=5120", _want(x, w64), streamed, rtol=I8_BOUND)
        gemm.weight_drop_i8(w)
        gemm.weight_drop_i8(w)  # a no-op
        assert np.array_equal(gemm.project_np(ctx, w, x, leg="int8"), streamed)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [256, 384])
def test_int8_leg_over_more_tiles_than_the_grid_holds(hopper, rng, k):
    """The kernel's grid is persistent (as many 1 x 2 clusters as the device holds at once, 66
    on an H200): here about 300 cluster tiles, so each cluster runs several and its pipeline's
    stages and phases carry over from tile to tile (2 or 3 groups per tile against 6 stages);
    an odd count of 128-wide weight tiles leaves the last cluster's second block past n, and
    1100 rows a ragged last row tile. Plain and accumulated outputs."""
    ctx = hopper
    rows, n = 1100, 8200
    w, w64 = make_weight(ctx, rng, "F32", n, k)
    with w:
        gemm.weight_cache_i8(w)
        x = randn(rng, rows, k)
        want = _want(x, w64)
        assert_close(f"int8 {rows}x{n}x{k}", want, gemm.project_np(ctx, w, x, leg="int8"), rtol=I8_BOUND)
        y0 = randn(rng, rows, n)
        acc = gemm.project_np(ctx, w, x, leg="int8", accumulate=True, y=y0)
        assert_close(f"int8 accumulate {rows}x{n}x{k}", y0 + want, acc, rtol=I8_BOUND)


@pytest.mark.gpu
def test_int8_rows_are_independent(hopper, rng):
    """A NaN, an Inf or a huge value in one row changes no other row (bitwise); a NaN or an Inf
    makes its own row's outputs NaN (its group's scale is NaN / Inf), never silently finite."""
    ctx = hopper
    n, k, rows = 64, 256, 9
    w, _ = make_weight(ctx, rng, "Q8_0", n, k)
    with w:
        gemm.weight_cache_i8(w)
        x = randn(rng, rows, k)
        base = gemm.project_np(ctx, w, x, leg="int8")
        bad = x.copy()
        bad[6, :] *= np.float32(1e30)
        bad[2, 5] = np.nan
        bad[4, 200] = np.inf
        got = gemm.project_np(ctx, w, bad, leg="int8")
        keep = [r for r in range(rows) if r not in (2, 4, 6)]
        assert np.array_equal(got[keep], base[keep])
        assert np.isnan(got[[2, 4]]).all()
        assert_close("huge row", base[6].astype(np.float64) * 1e30, got[6], rtol=1e-5)


@pytest.mark.gpu
def test_int8_leg_refuses_k_not_a_multiple_of_16(hopper, rng):
    ctx = hopper
    w, _ = make_weight(ctx, rng, "F32", 8, 40)
    with w:
        with pytest.raises(errors.UnsupportedError, match=r"k % 16 == 0 \(weight n=8 k=40\)"):
            gemm.project_np(ctx, w, randn(rng, 3, 40), leg="int8")
        with pytest.raises(errors.UnsupportedError, match=r"k % 16"):
            gemm.weight_cache_i8(w)


def test_weight_form_matches_the_float64_recipe():
    """The float32 rank-1 weight form (the kernel's arithmetic) against the simulation's float64
    one (quant_sim.round_weight, weight "int8r"): the same values except on rare near-ties; r * b
    never below a row and group's own scale (nothing clips)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((300, 640)) * rng.uniform(0.001, 0.1, (300, 1))).astype(np.float32)
    q, r, b = qs.quantize_i8_weight_f32(w)
    assert q.shape == w.shape and r.shape == (300,) and b.shape == (3, 5)
    assert (b <= 1).all() and (b > 0).all()
    s = r[:, None] * np.repeat(b, 128, axis=0)[:300]
    _, a = qs.quantize_i8_rows_f32(w)
    assert (s >= a * (1 - 1e-6)).all()
    got = qs.dequantize_groups(q, s.astype(np.float64), 128)
    leg = qs.Leg("int8", 128, "int8r", wblock=(128, 128))
    want = qs.round_weight(leg, w.astype(np.float64))
    assert np.mean(np.abs(got - want) > 1e-6 * np.abs(want).max()) < 1e-3
    z = np.zeros((2, 128), np.float32)
    z[1, 7] = 2.0
    qz, rz, bz = qs.quantize_i8_weight_f32(z)
    assert rz[0] == 0 and not qz[0].any() and qz[1, 7] == 127


def test_quantizer_matches_the_float64_recipe_codes():
    """The float32 quantizer (the kernel's arithmetic) against the simulation's float64 one:
    the same codes except on rare near-ties, scales within float32 rounding."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 1000)) * rng.uniform(0.01, 100, (64, 1))).astype(np.float32)
    q32, s32 = qs.quantize_i8_rows_f32(x)
    q64, s64 = qs.quantize_int8(x, 128)
    assert q32.shape == (64, 1000) and s32.shape == (64, 8) and s32.dtype == np.float32
    assert np.mean(q32 != q64) < 1e-3
    assert np.allclose(s32, s64, rtol=1e-7, atol=0)
    z = np.zeros((3, 256), np.float32)
    z[1, 3], z[2, 200] = np.nan, -np.inf
    z[2, 5] = 1.0
    qz, sz = qs.quantize_i8_rows_f32(z)
    assert not qz[:2].any() and not sz[0].any() and np.isnan(sz[1, 0]) and sz[1, 1] == 0
    assert qz[2, 5] == 127 and sz[2, 0] == np.float32(1 / 127) and sz[2, 1] == np.inf
    assert not qz[2, 128:].any()
