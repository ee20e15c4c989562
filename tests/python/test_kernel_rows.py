"""Row kernels (RMSNorm, per-head RMSNorm, partial NEOX RoPE, SwiGLU, residual add, sigmoid gate)
against float64 NumPy references (bound 1e-5, design.md), plus the C API's argument checks (CPU).

The references are the oracle's (pyprefill.reference.ops, itself checked against HF fixtures):
ops.rms_norm, ops.rope_neox_partial, ops.silu, ops.sigmoid, with ops.heads / ops.put_heads
addressing the heads inside the kernels' rows."""
import numpy as np
import pytest

from helpers import assert_close, c_args, null_view as V, randn
from pyprefill import errors
from pyprefill._ffi import ffi, lib
from pyprefill.kernels import rows as K
from pyprefill.kernels._common import View, poisoned, upload
from pyprefill.reference import ops

RTOL = 1e-5
NULL = ffi.NULL
gpu = pytest.mark.gpu


def on_heads(x, n_heads, head_dim, head_stride, col0, fn):
    """x in float64 with fn applied to its heads ((T, H, D) -> (T, H, D)); other columns kept."""
    h = ops.heads(x, n_heads, head_dim, head_stride, col0)
    return ops.put_heads(x, fn(h), head_stride, col0)


def silu64(x):
    return ops.silu(np.asarray(x, np.float64))


ROWS = [1, 7, 777]

# ----------------------------------------------------------------------------- GPU: RMSNorm


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", [1024, 2560, 5120, 37])
def test_rms_norm(ctx, rng, rows, cols):
    x = randn(rng, rows, cols, scale=3.0)
    w = randn(rng, cols)
    y = K.rms_norm_np(ctx, x, w, 1e-6)
    assert_close("rms_norm", ops.rms_norm(x, w, 1e-6), y, rtol=RTOL)


@gpu
def test_rms_norm_strided_and_in_place(ctx, rng):
    rows, cols, ld = 7, 2560, 2560 + 300
    x = randn(rng, rows, ld)
    w = randn(rng, cols)
    ref = ops.rms_norm(x[:, 100:100 + cols], w, 1e-6)
    with upload(ctx, x) as bx, upload(ctx, w) as bw, poisoned(ctx, rows * ld * 4) as by:
        # strided out of place: y lands at column 5 of ld-wide rows; other columns stay NaN
        K.rms_norm(ctx, View(bx, 100, ld), bw, View(by, 5, ld), rows, cols, 1e-6)
        y = by.download(np.float32, (rows, ld))
        assert_close("rms_norm strided", ref, y[:, 5:5 + cols], rtol=RTOL)
        assert np.isnan(y[:, :5]).all() and np.isnan(y[:, 5 + cols:]).all()
        # in place
        K.rms_norm(ctx, View(bx, 100, ld), bw, View(bx, 100, ld), rows, cols, 1e-6)
        x2 = bx.download(np.float32, (rows, ld))
    assert np.array_equal(x2[:, 100:100 + cols], y[:, 5:5 + cols])
    assert np.array_equal(x2[:, :100], x[:, :100]) and np.array_equal(x2[:, 100 + cols:], x[:, 100 + cols:])


# ----------------------------------------------------------------------------- GPU: QK-norm


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n_heads,head_dim,interleaved", [
    (16, 128, False), (32, 128, False), (8, 128, False),     # qwen3 q / k rows
    (8, 256, True), (16, 256, True), (24, 256, True),        # qwen35 [q | gate] rows
    (4, 256, False)])                                         # qwen35 k rows
def test_head_rms_norm(ctx, rng, rows, n_heads, head_dim, interleaved):
    stride = 2 * head_dim if interleaved else head_dim
    x = randn(rng, rows, n_heads * stride, scale=2.0)
    w = randn(rng, head_dim)
    out = K.head_rms_norm_np(ctx, x, w, n_heads, head_dim, 1e-6, head_stride=stride)
    ref = on_heads(x, n_heads, head_dim, stride, 0, lambda h: ops.rms_norm(h, w, 1e-6))
    assert_close("head_rms_norm", ref, out, rtol=RTOL)
    if interleaved:  # the gate halves are not touched
        for h in range(n_heads):
            g = slice(h * stride + head_dim, (h + 1) * stride)
            assert np.array_equal(out[:, g], x[:, g])


# ----------------------------------------------------------------------------- GPU: RoPE


ROPE_CASES = {  # n_heads, head_dim, head_stride, rot_dim, base
    "qwen3-q": (32, 128, 128, 128, 1e6),
    "qwen3-k": (8, 128, 128, 128, 1e6),
    "qwen35-q": (16, 256, 512, 64, 1e7),   # [q | gate] rows: q heads at stride 2D
    "qwen35-k": (4, 256, 256, 64, 1e7),
    "tiny": (3, 32, 40, 16, 1e4),
}


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("pos0", [0, 5, 100_000, 262_000])
@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_neox(ctx, rng, rows, pos0, case):
    n_heads, head_dim, stride, rot, base = ROPE_CASES[case]
    ld = n_heads * stride + 3
    x = randn(rng, rows, ld)
    out = K.rope_neox_np(ctx, x, n_heads, head_dim, rot, pos0, base, head_stride=stride, col0=1)
    ref = on_heads(x, n_heads, head_dim, stride, 1,
                   lambda h: ops.rope_neox_partial(h, pos0, rot, base))
    rotated = np.concatenate([np.arange(1 + h * stride, 1 + h * stride + rot) for h in range(n_heads)])
    assert_close("rope rotated dims", ref[:, rotated], out[:, rotated], rtol=RTOL)
    keep = np.setdiff1d(np.arange(ld), rotated)
    assert np.array_equal(out[:, keep], x[:, keep]), "dims outside [0, rot_dim) of each head changed"


@gpu
def test_rope_twin_is_bitwise(ctx, rng):
    """T rows in one call == T calls of one row at pos0 + t (the decode twin)."""
    n_heads, head_dim, stride, rot, base = ROPE_CASES["qwen35-q"]
    rows, ld, pos0 = 37, n_heads * stride, 123_456
    x = randn(rng, rows, ld)
    with upload(ctx, x) as a, upload(ctx, x) as b:
        K.rope_neox(ctx, View(a, 0, ld), rows, n_heads, head_dim, rot, pos0, base, stride)
        for t in range(rows):
            K.rope_neox(ctx, View(b, t * ld, ld), 1, n_heads, head_dim, rot, pos0 + t, base, stride)
        assert np.array_equal(a.download(np.float32, x.shape), b.download(np.float32, x.shape))


# ----------------------------------------------------------------------------- GPU: elementwise


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", [3072, 9216, 17408, 33])
def test_swiglu(ctx, rng, rows, cols):
    g = randn(rng, rows, cols, scale=4.0)
    u = randn(rng, rows, cols)
    out = K.swiglu_np(ctx, g, u)
    assert_close("swiglu", silu64(g) * u, out, rtol=RTOL)


@gpu
def test_swiglu_extreme_inputs_are_finite(ctx):
    g = np.array([[-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4]], np.float32)
    u = np.ones_like(g)
    out = K.swiglu_np(ctx, g, u)
    assert np.isfinite(out).all()
    assert_close("swiglu extremes", silu64(g), out, rtol=RTOL)


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", [1024, 2560, 5120, 13])
def test_add(ctx, rng, rows, cols):
    y, x = randn(rng, rows, cols), randn(rng, rows, cols)
    out = K.add_np(ctx, y, x)
    assert np.array_equal(out, y + x)   # one fp32 add per element: exact


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n_heads,head_dim", [(8, 256), (16, 256), (24, 256), (3, 32)])
def test_sigmoid_gate_qwen35(ctx, rng, rows, n_heads, head_dim):
    """o *= sigmoid(gate) with the gate read from the [q | gate] q-projection rows."""
    o = randn(rng, rows, n_heads * head_dim)
    qg = randn(rng, rows, 2 * n_heads * head_dim, scale=3.0)
    out = K.sigmoid_gate_np(ctx, o, qg, n_heads, head_dim, gate_head_stride=2 * head_dim,
                            gate_col0=head_dim)
    gate = ops.heads(qg, n_heads, head_dim, 2 * head_dim, head_dim).reshape(rows, -1)
    assert_close("sigmoid_gate", o.astype(np.float64) * ops.sigmoid(gate), out, rtol=RTOL)


@gpu
def test_zero_rows_is_a_no_op(ctx, rng):
    x = randn(rng, 3, 64)
    with upload(ctx, x) as b, upload(ctx, np.ones(64, np.float32)) as w:
        K.rms_norm(ctx, b, w, b, 0, 64, 1e-6)
        K.head_rms_norm(ctx, b, w, 0, 2, 32, 1e-6)
        K.rope_neox(ctx, b, 0, 2, 32, 32, 7, 1e4)
        K.swiglu(ctx, b, b, b, 0, 64)
        K.sigmoid_gate(ctx, b, View(w, 0, 64), 0, 2, 32)
        K.add(ctx, b, w, 0, 64)
        assert np.array_equal(b.download(np.float32, x.shape), x)


@gpu
def test_buffer_checks_on_device(ctx):
    with ctx.buffer(64 * 4) as small, ctx.buffer(1024 * 4) as big:
        with pytest.raises(errors.InvalidArgumentError, match="x holds 256 bytes"):
            K.rms_norm(ctx, small, big, big, 2, 64, 1e-6)
        with pytest.raises(errors.InvalidArgumentError, match="y overlaps x"):
            K.rms_norm(ctx, View(big, 0, 64), small, View(big, 1, 64), 2, 64, 1e-6)
        with pytest.raises(errors.InvalidArgumentError, match="y overlaps x"):
            K.add(ctx, big, big, 2, 64)
        with pytest.raises(errors.InvalidArgumentError, match="o overlaps gate"):
            K.sigmoid_gate(ctx, View(big, 0, 128), View(big, 32, 128), 2, 2, 32)
        # disjoint column sections of one matrix are fine (same ld, disjoint columns)
        K.add(ctx, View(big, 0, 128), View(big, 64, 128), 2, 64)


# ----------------------------------------------------------------------------- CPU: argument checks


def _err(status, match):
    from pyprefill._errors import _check
    with pytest.raises(errors.InvalidArgumentError, match=match):
        _check(status)


def rope(**kw):
    return lib.pf_rope_neox(NULL, c_args("pf_rope_neox_args", **{
        "rows": 1, "n_heads": 2, "head_dim": 128, "rot_dim": 64, "base": 1e6, **kw}))


def test_c_api_scalar_checks_come_first():
    _err(lib.pf_rms_norm(NULL, V(), V(), V(), -1, 8, 1e-6), "rows=-1")
    _err(lib.pf_rms_norm(NULL, V(), V(), V(), 1, 0, 1e-6), "cols=0")
    _err(lib.pf_rms_norm(NULL, V(), V(), V(), 1, 8, -1.0), "eps")
    _err(lib.pf_rms_norm(NULL, V(ld=4), V(), V(), 1, 8, 1e-6), "x row stride ld=4")
    _err(lib.pf_rms_norm(NULL, V(off=-3), V(), V(), 1, 8, 1e-6), "x offset=-3")
    _err(lib.pf_rms_norm(NULL, V(), V(), V(ld=2 ** 50), 3, 8, 1e-6), "y row stride ld=")
    _err(lib.pf_head_rms_norm(NULL, V(), V(), 1, 0, 128, 0, 1e-6), "n_heads=0")
    _err(lib.pf_head_rms_norm(NULL, V(), V(), 1, 2, 128, 64, 1e-6), "head_stride=64")
    _err(lib.pf_head_rms_norm(NULL, V(ld=100), V(), 1, 2, 128, 0, 1e-6), "ld=100")
    _err(rope(rot_dim=63), "rot_dim=63")
    _err(rope(rot_dim=256), "rot_dim=256")
    _err(rope(pos0=-1), "pos0=-1")
    _err(rope(base=0.5), "base")
    _err(rope(n_heads=0), "n_heads=0")
    _err(rope(head_stride=100), "head_stride=100")
    _err(lib.pf_swiglu(NULL, V(), V(), V(), 1, -2), "cols=-2")
    _err(lib.pf_swiglu(NULL, V(), V(ld=7), V(), 1, 8), "u row stride ld=7")
    _err(lib.pf_add(NULL, V(), V(), -5, 8), "rows=-5")
    _err(lib.pf_sigmoid_gate(NULL, V(), V(), 1, 2, 128, 100), "head_stride=100")
    _err(lib.pf_sigmoid_gate(NULL, V(ld=10), V(), 1, 2, 128, 0), "o row stride ld=10")


def test_c_api_null_views_then_buffers_then_ctx():
    _err(lib.pf_rms_norm(NULL, NULL, V(), V(), 1, 8, 1e-6), "view x is NULL")
    _err(lib.pf_rms_norm(NULL, V(), V(), NULL, 1, 8, 1e-6), "view y is NULL")
    _err(lib.pf_rms_norm(NULL, V(), V(), V(), 1, 8, 1e-6), "x is NULL")
    _err(lib.pf_head_rms_norm(NULL, V(), V(), 1, 2, 64, 0, 1e-6), "x is NULL")
    _err(rope(), "x is NULL")
    _err(lib.pf_swiglu(NULL, V(), V(), V(), 1, 8), "g is NULL")
    _err(lib.pf_add(NULL, V(), V(), 1, 8), "y is NULL")
    _err(lib.pf_sigmoid_gate(NULL, V(), V(), 1, 2, 64, 0), "o is NULL")
    # rows = 0 is still checked (no silent acceptance of NULL buffers)
    _err(lib.pf_add(NULL, V(), V(), 0, 8), "y is NULL")


def test_c_api_args_struct_checks():
    a = ffi.new("pf_rope_neox_args *")
    with pytest.raises(errors.AbiMismatchError, match="struct_size"):
        from pyprefill._errors import _check
        _check(lib.pf_rope_neox_args_init(a, ffi.sizeof("pf_rope_neox_args") - 8))
    _err(lib.pf_rope_neox(NULL, NULL), "args is NULL")
    assert lib.pf_rope_neox_args_init(a, ffi.sizeof("pf_rope_neox_args")) == lib.PF_STATUS_OK
    assert (a.rows, a.n_heads, a.head_dim, a.head_stride, a.rot_dim, a.pos0, a.base) == (0,) * 6 + (0.0,)
    assert (a.x.buf, a.x.off, a.x.ld) == (NULL, 0, 0)
    a.struct_size = 8
    assert lib.pf_rope_neox(NULL, a) == lib.PF_STATUS_ABI_MISMATCH
    assert "pf_rope_neox_args_init" in ffi.string(lib.pf_last_error()).decode()


def test_python_wrappers_check_types_and_shapes():
    with pytest.raises(errors.InvalidArgumentError, match="ctx: expected a pyprefill Context"):
        K.rms_norm_np(None, np.zeros((2, 4), np.float32), np.zeros(4, np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="x: expected dtype float32"):
        K.rms_norm_np(None, np.zeros((2, 4)), np.zeros(4, np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="w: expected 4 columns"):
        K.rms_norm_np(None, np.zeros((2, 4), np.float32), np.zeros(5, np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="need 257"):
        K.head_rms_norm_np(None, np.zeros((2, 256), np.float32), np.zeros(128, np.float32), 2, 128,
                           col0=1)
    with pytest.raises(errors.InvalidArgumentError, match="u: shape"):
        K.swiglu_np(None, np.zeros((2, 4), np.float32), np.zeros((2, 5), np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="y: expected a pyprefill Buffer or View"):
        K.add(None, None, np.zeros(3), 1, 3)
    with pytest.raises(errors.InvalidArgumentError, match="gate: 3 rows, o has 2"):
        K.sigmoid_gate_np(None, np.zeros((2, 8), np.float32), np.zeros((3, 8), np.float32), 2, 4)
