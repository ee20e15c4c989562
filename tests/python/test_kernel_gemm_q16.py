"""The f16 leg on a weight's GGUF blocks (tuning gemm_blocks, weight form F16Blocks, issue 38):
fp16 rows times the blocks dequantized on the chip (kernels/gemm/gemm_q16_kernel.cuh), sm_90a.

- Every block type at ragged shapes (rows, n, k not multiples of the 128 x 128 x 64 tile; k % 256
  != 0 for the 32-element types, whose rows are then only 2-byte aligned), against float64 on
  fresh random blocks within the f16 leg's bound, outputs NaN-poisoned first.
- The weight operand is the prewarm's fp16 bit for bit: with X the identity, each output is one
  product (Y[r][c] = W16[c][r], no rounding of a sum), so the GEMM on the blocks, the GEMM on the
  cache and the cache itself agree exactly.
- fp16 rows with row scales (pf_project_f16x) equal the fp32 path on their twin bit for bit;
  accumulate, strided outputs, activations past the fp16 range, one row (the GEMV).
- No fp16 copy of the weight is made: the context holds no slab scratch (what streaming needs).
- From tuning gemm_blocks_slab_rows rows on (default 65) the blocks leg runs per-call fp16 slabs
  and the cache's GEMM on them: bitwise the cache's products (the same operand, shape and cuBLAS
  call), on fp32 rows and on fp16 rows with scales, accumulate included; the tests of the GEMM on
  the blocks above pin gemm_blocks_slab_rows "never" so that it runs at every row count.
- Few rows (1..64: gemm_q16_skinny_kernel.cuh, split K over clusters of 1-8 blocks): every type
  at ragged shapes with every tile count and split (among the ragged shapes above), the operand
  the cache's bit for bit (X's rows unit vectors), fp16 rows with scales, strided accumulate;
  every shape the same bits run after run. The tests above pin gemm_blocks_gemv_rows "never".
- The GEMV form (up to gemm_blocks_gemv_rows rows of Q4_K / Q5_K / Q6_K, default 8:
  gemm_q16_gemv_kernel.cuh, the scales on the fp32 sums): 1-16 rows at ragged n and k with every
  K-slice count, within fp32 accumulation of the float64 product of the exact weight (gguf's
  dequantizer) on fp16-exact rows and within the f16 leg's bound of the cache; X's rows unit
  vectors give the library's fp32 decode exactly; fp16 rows with scales, strided accumulate; the
  same bits run after run.
Where the device does not run it (no sm_90a build or not compute capability 9.0) the tests skip,
with the 8-bit leg's reason (the same sm_90a check)."""
import numpy as np
import pytest
from helpers import assert_close, blocks_unsupported, make_weight, randn

from pyprefill.core import Context
from pyprefill.kernels import gemm
from pyprefill.reference import ops

BLOCK_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
F16_BOUND, F32_BOUND = 3e-3, 1e-5


def _blocks_on(c: Context, slab_rows="never", gemv_rows="never") -> None:
    """gemm_blocks on in c (the GEMM on the blocks at every row count unless `slab_rows` says from
    which the per-call slabs run, and its few-rows form unless `gemv_rows` says up to which the
    GEMV form runs on Q4_K / Q5_K / Q6_K: None = the library's default); skips where the device does not
    run the sm_90a kernels (helpers.blocks_unsupported)."""
    why = blocks_unsupported(c)
    if why is not None:
        pytest.skip(f"the sm_90a kernels do not run on this device: {why}")
    c.set_tuning(gemm_blocks="on", gemm_blocks_slab_rows=slab_rows, gemm_blocks_gemv_rows=gemv_rows)


@pytest.fixture
def bctx():
    """A context whose kernel-level calls read uncached weights' blocks (gemm_blocks on); skips
    where the device does not run the sm_90a kernels."""
    with Context(0) as c:
        _blocks_on(c)
        yield c


def _ref(x: np.ndarray, w64: np.ndarray) -> np.ndarray:
    return ops.project(x[:, :w64.shape[1]], w64)


def _k_for(qtype: str, k: int) -> int:
    """k for the type: the 256-element types need whole blocks."""
    return k if qtype in ("Q4_0", "Q8_0") else max(256, k // 256 * 256)


# Up to 64 rows, the few-rows form (gemm_q16_skinny_kernel.cuh): 1, 2, 4 and 8 tiles of 8 rows; k
# of 2560 / 5120 / 10240 columns gives its clusters of 2, 4 and 8 blocks (pick_split: 5 supersteps
# of 256 columns a block at least); n not a multiple of its 128-row weight tile.
SKINNY_SHAPES = [(2, 200, 512), (7, 130, 96), (8, 130, 2560), (9, 96, 5120), (31, 300, 1056), (33, 136, 10240),
                 (64, 129, 2304)]


@pytest.mark.gpu
# rows 300: one pair of blocks sharing the decoded weight tile (two 256-row tiles); 600: three row
# tiles, the last pair's second block past the matrix (it decodes its half and stores nothing).
@pytest.mark.parametrize("rows,n,k", SKINNY_SHAPES + [(129, 200, 1056), (300, 256, 2560), (600, 136, 1056)])
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_blocks_every_type_ragged(bctx, rng, qtype, rows, n, k):
    k = _k_for(qtype, k)
    w, w64 = make_weight(bctx, rng, qtype, n, k)
    with w:
        x = randn(rng, rows, k)
        got = gemm.project_np(bctx, w, x, leg="f16")
        assert np.array_equal(got, gemm.project_np(bctx, w, x, leg="f16")), "differs run to run"
        assert_close(f"blocks/{qtype} {rows}x{k}->{n}", _ref(x, w64), got, rtol=F16_BOUND)
        # the same product on the cache, within fp32 accumulation of the same fp16 operands
        gemm.weight_cache_f16(w)
        cached = gemm.project_np(bctx, w, x, leg="f16")
        assert_close(f"blocks vs cache/{qtype}", cached.astype(np.float64), got, rtol=F32_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_blocks_operand_is_the_cache_bit_for_bit(bctx, rng, qtype):
    """X = I: Y[r][c] = W16[c][r] exactly (one product per output), on the blocks and on the
    cache, and W16 is the prewarm's fp16."""
    n, k = 136, _k_for(qtype, 288)
    w, _ = make_weight(bctx, rng, qtype, n, k)
    with w:
        eye = np.eye(k, dtype=np.float32)
        on_blocks = gemm.project_np(bctx, w, eye, leg="f16")
        gemm.weight_cache_f16(w)
        w16 = gemm.weight_f16_np(bctx, w)
        on_cache = gemm.project_np(bctx, w, eye, leg="f16")
        assert np.isfinite(on_blocks).all()
        assert np.array_equal(on_blocks, on_cache), f"{qtype}: blocks and cache operands differ"
        assert np.array_equal(on_blocks, w16.astype(np.float32).T), f"{qtype}: the operand is not the cache's fp16"


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k", [(37, 512), (12, 5120)])  # the 256-row tiles; the few-rows form, split 4
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q4_0", "Q8_0"])
def test_blocks_on_fp16_rows_with_scales(bctx, rng, qtype, rows, k):
    """pf_project_f16x on an uncached weight (the producers' input form) equals the f16 leg on
    X = x16 * inv bit for bit (the same fp16 rows and scales reach the same kernel), and the
    float64 product with the weight's fp16 within fp32 accumulation."""
    n, k = 160, _k_for(qtype, k)
    w, _ = make_weight(bctx, rng, qtype, n, k)
    with w:
        w16 = gemm.dequantize_np(bctx, w, f16=True).astype(np.float64)
        x16 = np.clip(rng.standard_normal((rows, k)), -8, 8).astype(np.float16)
        inv = rng.choice(np.array([1.0, 16.0, 1024.0], np.float32), size=rows)
        x = x16.astype(np.float32) * inv[:, None]
        got = gemm.project_f16x_np(bctx, w, x16, inv)
        assert np.array_equal(got, gemm.project_np(bctx, w, x, leg="f16")), f"{qtype}: f16x differs"
        assert_close(f"f16x blocks/{qtype}", x.astype(np.float64) @ w16.T, got, rtol=F32_BOUND)
        y0 = randn(rng, rows, n)
        acc = gemm.project_f16x_np(bctx, w, x16, None, accumulate=True, y=y0)
        want = y0.astype(np.float64) + x16.astype(np.float64) @ w16.T
        assert_close(f"f16x blocks accumulate/{qtype}", want, acc, rtol=F32_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("rows", [9, 530])  # one block; pairs (three row tiles)
def test_blocks_strided_accumulate_and_fp16_range(bctx, rng, accumulate, rows):
    n, k = 200, 512
    w, w64 = make_weight(bctx, rng, "Q5_K", n, k)
    with w:
        x = randn(rng, rows, k + 13)
        x[:, k:] = np.nan                 # ldx = k + 13: the tail is never read
        x[0, :k] *= 1e5                   # rows past the fp16 range: scaled, then unscaled
        x[4, :k] *= 3e7
        ldy = n + 37
        y0 = np.full((rows, ldy), 12345.0, np.float32)
        y0[:, :n] = randn(rng, rows, n) * 100.0
        out = gemm.project_np(bctx, w, x, leg="f16", accumulate=accumulate, y=y0)
        assert (out[:, n:] == 12345.0).all(), "columns beyond n were written"
        ref = _ref(x[:, :k], w64) + (y0[:, :n] if accumulate else 0.0)
        assert np.isfinite(out).all()
        assert_close(f"blocks strided acc={accumulate}", ref, out[:, :n], rtol=F16_BOUND, worst_rtol=F16_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_blocks_one_row_and_auto(bctx, rng, qtype):
    """One row: the GEMV on the blocks; AUTO on an uncached block type runs the f16 leg (its
    result equals the f16 leg's, not the f32 leg's)."""
    w, w64 = make_weight(bctx, rng, qtype, 96, 512)
    with w:
        x = randn(rng, 1, 512)
        assert_close(f"one row/{qtype}", _ref(x, w64), gemm.project_np(bctx, w, x, leg="f16"), rtol=F32_BOUND)
        xs = randn(rng, 33, 512)
        auto = gemm.project_np(bctx, w, xs, leg="auto")
        assert np.array_equal(auto, gemm.project_np(bctx, w, xs, leg="f16"))


@pytest.mark.gpu
def test_blocks_make_no_fp16_copy(rng):
    """Streaming an uncached weight grows the context's slab scratch to an fp16 copy's size; the
    GEMM on the blocks allocates no slab at all (only the cast rows of fp32 inputs)."""
    n, k, rows = 1024, 2048, 64
    sizes = {}
    for blocks in (False, True):
        with Context(0) as c:
            w, _ = make_weight(c, rng, "Q4_K", n, k)
            with w:
                if blocks:
                    _blocks_on(c)
                before = c.allocated()
                gemm.project_np(c, w, randn(rng, rows, k), leg="f16")
                sizes[blocks] = c.allocated() - before
    assert sizes[False] >= n * k * 2, sizes
    assert sizes[True] < n * k * 2 // 8, sizes


# ----------------------------------------------------------------------------- per-call slabs


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [2, 300])
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_blocks_slabs_are_the_cache_bit_for_bit(rng, qtype, rows):
    """gemm_blocks_slab_rows 2: every call of 2+ rows dequantizes the blocks into an fp16 slab and
    runs the cache's GEMM on it; the products equal the cache's bit for bit on fp32 rows (strided,
    rows past the fp16 range), on fp16 rows with scales, and accumulating; the slab scratch is one
    fp16 copy of the matrix (at most), the weight keeps no cache."""
    n, k = 264, _k_for(qtype, 1056)
    with Context(0) as c:
        _blocks_on(c, slab_rows=2)
        w, w64 = make_weight(c, rng, qtype, n, k)
        with w:
            x = randn(rng, rows, k + 7)
            x[:, k:] = np.nan
            x[1, :k] *= 3e5
            ldy = n + 5
            y0 = np.full((rows, ldy), 321.0, np.float32)
            y0[:, :n] = randn(rng, rows, n)
            x16 = np.clip(rng.standard_normal((rows, k)), -8, 8).astype(np.float16)
            inv = rng.choice(np.array([1.0, 4.0, 512.0], np.float32), size=rows)
            before = c.allocated()
            got = gemm.project_np(c, w, x, leg="f16")
            acc = gemm.project_np(c, w, x, leg="f16", accumulate=True, y=y0)
            f16x = gemm.project_f16x_np(c, w, x16, inv)
            assert c.allocated() - before <= n * k * 2 + rows * (k * 2 + 4) + (1 << 20)
            assert np.isfinite(got).all() and (acc[:, n:] == 321.0).all()
            assert_close(f"slabs/{qtype}", _ref(x[:, :k], w64), got, rtol=F16_BOUND, worst_rtol=F16_BOUND)
            gemm.weight_cache_f16(w)
            assert np.array_equal(got, gemm.project_np(c, w, x, leg="f16")), f"{qtype}: not the cache's products"
            assert np.array_equal(acc, gemm.project_np(c, w, x, leg="f16", accumulate=True, y=y0))
            assert np.array_equal(f16x, gemm.project_f16x_np(c, w, x16, inv)), f"{qtype}: fp16 rows differ"


@pytest.mark.gpu
def test_blocks_slab_rows_default_crossover(rng):
    """The library's default (65): 64 rows run the GEMM on the blocks (its few-rows form), 65 the
    slabs (bitwise the cache's); both within fp32 accumulation of each other."""
    n, k = 200, 2560
    with Context(0) as c:
        _blocks_on(c, slab_rows=None)
        w, _ = make_weight(c, rng, "Q4_K", n, k)
        with w:
            x = randn(rng, 65, k)
            below = gemm.project_np(c, w, x[:64], leg="f16")
            at = gemm.project_np(c, w, x, leg="f16")
            gemm.weight_cache_f16(w)
            assert np.array_equal(at, gemm.project_np(c, w, x, leg="f16")), "65 rows: not the slabs"
            assert not np.array_equal(below, gemm.project_np(c, w, x[:64], leg="f16")), "64 rows: the slabs"
            assert_close("crossover", at[:64].astype(np.float64), below, rtol=F32_BOUND)


# ----------------------------------------------------------------------------- few rows (skinny)


def _check_strided_accumulate(ctx, rng, w, x, w64, name):
    """The f16 leg accumulating x @ W.T into a strided output y0 [rows, n + 5]: the columns past n
    untouched, the rest y0 + x @ w64.T within fp32 accumulation (x fp16-exact; w64 the operand the
    form multiplies, float64)."""
    rows, n = x.shape[0], w64.shape[0]
    y0 = np.full((rows, n + 5), 777.0, np.float32)
    y0[:, :n] = randn(rng, rows, n)
    acc = gemm.project_np(ctx, w, x, leg="f16", accumulate=True, y=y0)
    assert (acc[:, n:] == 777.0).all(), "columns beyond n were written"
    want = y0[:, :n].astype(np.float64) + x.astype(np.float64) @ w64.T
    assert_close(name, want, acc[:, :n], rtol=F32_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 40])
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_blocks_few_rows_operand_is_the_cache_bit_for_bit(bctx, rng, qtype, rows):
    """X's rows unit vectors e_c (c random, the last column among them): Y[i][j] = W16[j][c_i]
    exactly (one product per output, the other partials of the split exactly zero)."""
    n, k = 136, _k_for(qtype, 5120)
    w, _ = make_weight(bctx, rng, qtype, n, k)
    with w:
        cols = rng.choice(k - 1, size=rows, replace=rows > k - 1)
        cols[0] = k - 1
        x16 = np.zeros((rows, k), np.float16)
        x16[np.arange(rows), cols] = 1.0
        got = gemm.project_f16x_np(bctx, w, x16, None)
        gemm.weight_cache_f16(w)
        w16 = gemm.weight_f16_np(bctx, w)
        assert np.isfinite(got).all()
        assert np.array_equal(got, w16[:, cols].astype(np.float32).T), f"{qtype}: not the cache's fp16"


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_blocks_few_rows_strided_accumulate(bctx, rng, qtype):
    """Accumulate into a strided output on the few-rows form: columns past n untouched, float64
    within fp32 accumulation of the weight's fp16 (the split's partials summed, then added)."""
    n, k, rows = 260, _k_for(qtype, 5120), 12
    w, _ = make_weight(bctx, rng, qtype, n, k)
    with w:
        w16 = gemm.dequantize_np(bctx, w, f16=True).astype(np.float64)
        x = np.clip(rng.standard_normal((rows, k)), -8, 8).astype(np.float16).astype(np.float32)
        _check_strided_accumulate(bctx, rng, w, x, w16, f"few rows accumulate/{qtype}")


# ----------------------------------------------------------------------------- the GEMV form

GEMV_TYPES = ["Q4_K", "Q5_K", "Q6_K"]
# rows: one and two token tiles; n not a multiple of the 16-row group; k of 1-40 blocks, so that
# the K slices (pick_kslices: 1-8 a block of 8 warps) take from one block to several.
GEMV_SHAPES = [(1, 300, 2304), (3, 33, 256), (8, 137, 768), (9, 520, 4096), (16, 130, 2560), (5, 2560, 10240)]


@pytest.fixture
def gctx():
    """A context on the blocks with the GEMV form up to 16 rows; skips as bctx."""
    with Context(0) as c:
        _blocks_on(c, gemv_rows=16)
        yield c


def _f16_exact(rng, rows, k):
    """fp16 rows (clipped normals) and their exact float32 twin."""
    x16 = np.clip(rng.standard_normal((rows, k)), -8, 8).astype(np.float16)
    return x16, x16.astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n,k", GEMV_SHAPES)
@pytest.mark.parametrize("qtype", GEMV_TYPES)
def test_blocks_gemv_is_the_exact_weight(gctx, rng, qtype, rows, n, k):
    """The GEMV form multiplies the blocks' exact values: within fp32 accumulation of the float64
    product with gguf's dequantization; the same bits run to run; within the f16 leg's bound of
    the cache's GEMM (which rounds the weight to fp16)."""
    w, w64 = make_weight(gctx, rng, qtype, n, k)
    with w:
        x16, x = _f16_exact(rng, rows, k)
        got = gemm.project_f16x_np(gctx, w, x16, None)
        assert np.array_equal(got, gemm.project_f16x_np(gctx, w, x16, None)), "differs run to run"
        assert_close(f"gemv/{qtype} {rows}x{k}->{n}", x.astype(np.float64) @ w64.T, got, rtol=F32_BOUND)
        gemm.weight_cache_f16(w)
        cached = gemm.project_f16x_np(gctx, w, x16, None)
        assert_close(f"gemv vs cache/{qtype}", cached.astype(np.float64), got, rtol=F16_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("qtype", GEMV_TYPES)
def test_blocks_gemv_operand_is_the_fp32_decode(gctx, rng, qtype, rows):
    """X's rows unit vectors e_c (the last column among them): Y[i][j] = W[j][c_i], the library's
    fp32 decode (the value the prewarm rounds to fp16) exactly: the scales applied to exact sums
    round once, as the decoder's expression does; the few-rows form (gemv_rows never) gives the
    cache's fp16 of the same values."""
    n, k = 136, 5120
    w, _ = make_weight(gctx, rng, qtype, n, k)
    with w:
        cols = rng.choice(k - 1, size=rows, replace=False)
        cols[0] = k - 1
        x16 = np.zeros((rows, k), np.float16)
        x16[np.arange(rows), cols] = 1.0
        got = gemm.project_f16x_np(gctx, w, x16, None)
        w32 = gemm.dequantize_np(gctx, w)
        assert np.array_equal(got, w32[:, cols].T), f"{qtype}: not the fp32 decode"
        gctx.set_tuning(gemm_blocks="on", gemm_blocks_slab_rows="never", gemm_blocks_gemv_rows="never")
        few = gemm.project_f16x_np(gctx, w, x16, None)
        assert np.array_equal(few, w32[:, cols].T.astype(np.float16).astype(np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", GEMV_TYPES)
def test_blocks_gemv_scales_and_strided_accumulate(gctx, rng, qtype):
    """fp16 rows with row scales (the producers' input form) and accumulation into a strided
    output on the GEMV form: columns past n untouched, y0 + (x16 * inv) . W^T within fp32
    accumulation of float64 on the exact weight."""
    n, k, rows = 260, 2560, 6
    w, w64 = make_weight(gctx, rng, qtype, n, k)
    with w:
        x16, x = _f16_exact(rng, rows, k)
        inv = rng.choice(np.array([1.0, 16.0, 1024.0], np.float32), size=rows)
        got = gemm.project_f16x_np(gctx, w, x16, inv)
        assert_close(f"gemv scales/{qtype}", (x * inv[:, None]).astype(np.float64) @ w64.T, got, rtol=F32_BOUND)
        _check_strided_accumulate(gctx, rng, w, x, w64, f"gemv accumulate/{qtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["qwen3_tiny", "qwen35_hv2"])
def test_model_gemv_fused_groups_one_launch(bctx, model):
    """Steps of 8 rows on a model without caches run the GEMV form, a fused group's parts of one
    type in one launch (their 16-row groups side by side): the HF fixtures within the default
    legs' bound; the logits within fp32 accumulation of the same model with its groups unfused
    (each part its own launch); within twice the f16 leg's bound of the cached model (both legs
    are within it of the exact weights: the GEMV multiplies them, the cache their fp16)."""
    from _reference_fixtures import load_npz, rel_err

    from pyprefill.model import Model
    path, prompts, hf = load_npz(model, "mix")
    outs = {}
    for fuse in (True, False):
        with Model.load(path, prewarm=False, progress=False, tuning={"fuse_groups": fuse}) as cold:
            assert cold.refresh_info()["f16_bytes"] == 0
            got = []
            for tokens in prompts:
                with cold.session(1024, chunk=8) as s:
                    got.append(s.prefill(tokens, "all"))
            outs[fuse] = np.concatenate(got)
    with Model.load(path, progress=False) as warm:
        got = []
        for tokens in prompts:
            with warm.session(1024, chunk=8) as s:
                got.append(s.prefill(tokens, "all"))
        cached = np.concatenate(got)
    out, ref = outs[True], np.concatenate(hf)
    assert np.isfinite(out).all()
    whole, worst, row = rel_err(out, ref)
    assert whole <= 2e-2, f"{model}: {whole:.2e} from HF (worst {worst:.2e} at row {row})"
    assert float((out.argmax(-1) == ref.argmax(-1)).mean()) >= 0.99
    whole, worst, row = rel_err(out, outs[False])
    assert whole <= F32_BOUND, f"{model}: fused {whole:.2e} from unfused (worst {worst:.2e} at row {row})"
    whole, worst, row = rel_err(out, cached)
    assert whole <= 2 * F16_BOUND, f"{model}: {whole:.2e} from the cached model (worst {worst:.2e} at row {row})"


# ----------------------------------------------------------------------------- whole models


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [64, 512])  # the GEMM on the blocks; from 65 rows the slabs
@pytest.mark.parametrize("model", ["qwen3_tiny", "qwen35_hv2", "qwen35_hv1"])
def test_model_without_caches_on_the_blocks(bctx, model, chunk):
    """A model loaded without its fp16 caches (prewarm off), its sessions on the default leg with
    gemm_blocks (the default slab rows): the HF fixtures within the default legs' bounds, the
    prewarmed model's logits within the f16 leg's, and no fp16 copy held (f16_bytes 0)."""
    from _reference_fixtures import load_npz, rel_err

    from pyprefill.model import Model
    path, prompts, hf = load_npz(model, "mix")
    on = {"gemm_blocks": "on"}
    with Model.load(path, prewarm=False, progress=False, tuning=on) as cold, \
            Model.load(path, progress=False) as warm:
        assert cold.refresh_info()["f16_bytes"] == 0
        outs, warms = [], []
        for tokens in prompts:
            with cold.session(1024, chunk=chunk, tuning=on) as s:
                outs.append(s.prefill(tokens, "all"))
            with warm.session(1024, chunk=64) as s:
                warms.append(s.prefill(tokens, "all"))
        out, ref, cached = np.concatenate(outs), np.concatenate(hf), np.concatenate(warms)
        assert np.isfinite(out).all()
        whole, worst, row = rel_err(out, ref)
        assert whole <= 2e-2, f"{model}: {whole:.2e} from HF (worst {worst:.2e} at row {row})"
        assert float((out.argmax(-1) == ref.argmax(-1)).mean()) >= 0.99
        whole, worst, row = rel_err(out, cached)
        assert whole <= F16_BOUND, f"{model}: {whole:.2e} from the cached model (worst {worst:.2e} at {row})"
        assert cold.refresh_info()["f16_bytes"] == 0, "a cache appeared"


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_model_on_slabs_is_the_cached_model_bit_for_bit(bctx, rng, preset, fuse):
    """From the slab rows on, a session on the blocks runs the cache's GEMMs: each matrix (and, with
    fused groups, each group: its parts dequantized side by side into one slab, of mixed types in a
    Q4_K_M file, one GEMM) on the prewarm's fp16 bits, so a model without its caches gives the
    cached model's logits bit for bit (tuning gemm_blocks_slab_rows 2: every call of 2+ rows, the
    LM head's 32-row pieces too; prompts of 70 and 200 tokens in steps of 64, no call of one row)."""
    from _engine_models import random_tokens, synth_model

    from pyprefill.model import Model
    path = synth_model(preset, "q4_k_m")
    tuning = {"fuse_groups": fuse}
    with Model.load(path, progress=False, tuning=tuning) as warm, \
            Model.load(path, prewarm=False, progress=False, tuning=dict(tuning, gemm_blocks_slab_rows=2)) as cold:
        assert warm.info["f16_armed"] == 1 and cold.refresh_info()["f16_bytes"] == 0
        for n in (70, 200):
            toks = random_tokens(rng, n, warm.n_vocab)
            with warm.session(256, chunk=64) as s:
                want = s.prefill(toks, "all")
            with cold.session(256, chunk=64) as s:
                got = s.prefill(toks, "all")
            assert np.isfinite(got).all()
            assert np.array_equal(got, want), f"{preset} fuse={fuse} {n} tokens: not the cached model's logits"


@pytest.mark.gpu
def test_model_on_blocks_takes_a_longer_auto_step(bctx):
    """A session whose plan reads layer matrices from their blocks gets an auto step (chunk 0) of
    8192 rows (capped at max_tokens), so that each per-call slab is dequantized once per 8192 rows;
    a cached model keeps 2048. Seen in the scratch a session holds: the auto step's equals an
    explicit chunk of 8192 on the blocks (and more than 2048's), and 2048's on the cache."""
    from _engine_models import synth_model

    from pyprefill.model import Model
    path = synth_model("qwen35-tiny", "q4_k_m")

    def held(m, chunk):
        base = m.ctx.allocated()
        with m.session(8192, chunk=chunk) as s:
            s.prefill(np.arange(40, dtype=np.int32) % m.n_vocab, "last")
            return m.ctx.allocated() - base

    with Model.load(path, prewarm=False, progress=False) as cold:
        assert cold.refresh_info()["f16_bytes"] == 0
        got = {c: held(cold, c) for c in (0, 8192, 2048)}
        assert got[0] == got[8192] > got[2048], got
    with Model.load(path, progress=False) as warm:
        assert warm.info["f16_armed"] == 1
        got = {c: held(warm, c) for c in (0, 2048)}
        assert got[0] == got[2048], got


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_model_slab_ring_is_the_slabs_in_line_bit_for_bit(bctx, rng, preset, fuse):
    """Tuning gemm_blocks_ring: the blocks' slabs dequantized ahead of their GEMMs on a stream of
    their own, in 2 or 3 buffers, give the logits of the slabs in line bit for bit (the same
    dequantization into a buffer of the same alignment, the same GEMM), eagerly and through the
    step graphs (prompts of 70 and 200 tokens in steps of 64: the 64-row step comes back and is
    captured; the 8- and 6-row tails run eagerly); the ring's buffers are held while the session
    lives (its allocation) and none without it."""
    from _engine_models import random_tokens, synth_model

    from pyprefill.model import Model
    path = synth_model(preset, "q4_k_m")
    tuning = {"fuse_groups": fuse, "gemm_blocks_slab_rows": 2}
    with Model.load(path, prewarm=False, progress=False, tuning=tuning) as m:
        assert m.refresh_info()["f16_bytes"] == 0
        toks = {n: random_tokens(rng, n, m.n_vocab) for n in (70, 200)}
        got, held = {}, {}
        for ring in ("off", 2, 3):
            base = m.ctx.allocated()
            with m.session(256, chunk=64, tuning={"gemm_blocks_ring": ring}) as s:
                held[ring] = m.ctx.allocated() - base
                got[ring] = {}
                for n, t in toks.items():
                    s.reset()
                    got[ring][n] = s.prefill(t, "all")
                    s.reset()
                    again = s.prefill(t, "all")           # the 64-row steps now replay their graphs
                    assert np.array_equal(again, got[ring][n]), f"ring {ring}: a replay differs"
        assert held[2] > held["off"] and held[3] > held[2], held
        for ring in (2, 3):
            for n in toks:
                assert np.isfinite(got[ring][n]).all()
                assert np.array_equal(got[ring][n], got["off"][n]), f"{preset} fuse={fuse} ring {ring}, {n} tokens"


RING_CHILD = """
import sys, numpy as np
from pyprefill.model import Model
tokens = np.load(sys.argv[2])
with Model.load(sys.argv[1], prewarm=False, progress=False, tuning={"gemm_blocks_slab_rows": 2}) as m:
    with m.session(256, chunk=64, tuning={"gemm_blocks_ring": 3}) as s:
        s.prefill(tokens, "last")
"""


@pytest.mark.gpu
def test_model_slab_ring_takes_every_slab(bctx, rng, tmp_path):
    """The ring engages (the bitwise test above cannot tell a ring that never ran from one that
    did): a child process with PREFILL_LOG=ring (read once per process) prefilling 150 tokens in
    steps of 64 on qwen35-tiny without caches prints, for each step run eagerly or captured, that
    every one of the step's slab GEMMs took its slab from the ring (N of N, N the layer loop's
    slab GEMMs: at least one per layer)."""
    import re

    from _engine_models import random_tokens, synth_model
    from test_gemm_lt import _run_child
    path = synth_model("qwen35-tiny", "q4_k_m")
    np.save(tmp_path / "tokens.npy", random_tokens(rng, 150, 1024))
    r = _run_child(["-c", RING_CHILD, path, str(tmp_path / "tokens.npy")], {"PREFILL_LOG": "ring"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = re.findall(r"libprefill: slab ring: (\d+) of (\d+) slabs taken ahead \(3 buffers\)", r.stderr)
    assert lines, f"no ring step logged:\n{r.stderr[-2000:]}"
    assert all(a == b and int(b) >= 4 for a, b in lines), lines    # qwen35-tiny: 4 layers
