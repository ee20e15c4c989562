"""Gated DeltaNet kernels (conv1d + SiLU, L2 norm, gates, gated RMSNorm, delta-rule scan) against
float64 NumPy references (bound 1e-5, design.md); the per-token twins (rows = 1, T launches)
bitwise equal to the row kernels; state carried across calls; the C API's argument checks (CPU).

The references are the oracle's (pyprefill.reference.ops, spec.md §3.2 G2, G3, G5, G7, G8; itself
checked against HF fixtures): ops.causal_conv1d_silu, ops.l2_norm, ops.gdn_gates,
ops.gated_rms_norm and ops.delta_rule_recurrent, on the kernels' [T][heads * dim] rows."""
import numpy as np
import pytest

from helpers import assert_close, c_args, null_view as V, randn
from pyprefill import errors
from pyprefill._errors import _check
from pyprefill._ffi import ffi, lib
from pyprefill.kernels import gdn as G
from pyprefill.kernels._common import View, poisoned, upload
from pyprefill.reference import ops

RTOL = 1e-5
NULL = ffi.NULL
gpu = pytest.mark.gpu
ROWS = [1, 7, 777]

# ----------------------------------------------------------------------------- references
# Thin adapters from the kernels' row layout to the oracle's (T, heads, dim) arrays.


def ref_l2(x, eps, scale):
    """Per-head L2 norm of x (..., dim), times scale (G5)."""
    return ops.l2_norm(x, eps) * scale


def ref_gated_norm(o, z, w, hv, eps):
    """G8 on [T][hv*dv] rows."""
    T, dv = o.shape[0], w.shape[0]
    return ops.gated_rms_norm(o.reshape(T, hv, dv), w, z.reshape(T, hv, dv), eps).reshape(T, hv * dv)


def ref_scan(q, k, v, beta, g, S0, form=ops.delta_rule_recurrent):
    """G7 on [T][heads*dim] rows (value head j paired with key head j % Hk). Returns (o, S).
    form: the oracle's recurrence (the definition), or ops.delta_rule_chunked (the same function,
    itself checked against the recurrence in test_reference_ops, fast enough for 64k rows)."""
    hv, dk, dv = S0.shape
    T = q.shape[0]
    hk = q.shape[1] // dk
    o, S = form(q.reshape(T, hk, dk), k.reshape(T, hk, dk), v.reshape(T, hv, dv), g, beta, S0)
    return o.reshape(T, hv * dv), S


# ----------------------------------------------------------------------------- inputs


def assert_scan(name, ref, out, rtol):
    """assert_close on both results of a scan, (o, state) against the reference's pair."""
    (ro, rS), (o, S) = ref, out
    hv = S.shape[0]
    assert_close(f"{name} o", ro, o, rtol=rtol)
    assert_close(f"{name} state", rS.reshape(hv, -1), S.reshape(hv, -1), rtol=rtol)


def l2n32(x, hk, dk, scale=1.0):
    """Rows of hk heads of dk, L2-normalised per head (as the model's G5), float32."""
    return ref_l2(x.reshape(x.shape[0], hk, dk), 1e-6, scale).reshape(x.shape).astype(np.float32)


def scan_inputs(rng, T, hk, hv, dk, dv, state_scale=0.5):
    """Model-like inputs: q, k L2-normalised (q / sqrt(dk)), beta in (0, 1), decays from
    g = ssm_a * softplus(alpha + dt_bias) with ssm_a = -exp(U(-1, 1))."""
    q = l2n32(randn(rng, T, hk * dk), hk, dk, 1.0 / np.sqrt(dk))
    k = l2n32(randn(rng, T, hk * dk), hk, dk)
    v = randn(rng, T, hv * dv)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((T, hv))))).astype(np.float32)
    ssm_a = -np.exp(rng.uniform(-1, 1, hv))
    dt_bias = rng.uniform(-1, 1, hv)
    g = (ssm_a * ops.softplus(rng.standard_normal((T, hv)) + dt_bias)).astype(np.float32)
    S0 = randn(rng, hv, dk, dv, scale=state_scale)
    return q, k, v, beta, g, S0


# ----------------------------------------------------------------------------- GPU: conv1d


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("conv_dim", [6144, 8192, 10240, 96])
def test_conv1d(ctx, rng, rows, conv_dim):
    kc = 4
    m, window, weight = randn(rng, rows, conv_dim), randn(rng, kc - 1, conv_dim), randn(rng, conv_dim, kc, scale=0.5)
    u, new_window = G.gdn_conv1d_np(ctx, m, window, weight)
    ref_u, ref_w = ops.causal_conv1d_silu(m, window, weight)
    assert_close("conv1d u", ref_u, u, rtol=RTOL)
    assert np.array_equal(new_window, ref_w.astype(np.float32)), "window must be the last kc-1 rows of concat(window, m)"


@gpu
@pytest.mark.parametrize("kc", [2, 3, 5, 8])
def test_conv1d_other_kernel_sizes(ctx, rng, kc):
    m, window, weight = randn(rng, 40, 200), randn(rng, kc - 1, 200), randn(rng, 200, kc)
    u, new_window = G.gdn_conv1d_np(ctx, m, window, weight)
    ref_u, ref_w = ops.causal_conv1d_silu(m, window, weight)
    assert_close("conv1d u", ref_u, u, rtol=RTOL)
    assert np.array_equal(new_window, ref_w.astype(np.float32))


def _conv_in_calls(ctx, m, window, weight, sizes, *, strided=False):
    """Run conv1d over m in consecutive calls of the given row counts; (u, window)."""
    T, C = m.shape
    kc = weight.shape[1]
    ld = C + 5 if strided else C
    cm, cu = (2, 1) if strided else (0, 0)      # column of m / u inside their ld-wide rows
    src = np.full((T, ld), np.nan, np.float32)
    src[:, cm:cm + C] = m
    with upload(ctx, src) as bm, upload(ctx, window) as bwin, upload(ctx, weight) as bw, \
            poisoned(ctx, T * ld * 4) as bu:
        t = 0
        for n in sizes:
            G.gdn_conv1d(ctx, View(bm, t * ld + cm, ld), bwin, bw, View(bu, t * ld + cu, ld), n, C,
                         kc)
            t += n
        assert t == T
        u = bu.download(np.float32, (T, ld))
        if strided:
            assert np.isnan(u[:, 0]).all() and np.isnan(u[:, 1 + C:]).all(), "wrote outside u's columns"
        return u[:, cu:cu + C], bwin.download(np.float32, window.shape)


@gpu
def test_conv1d_twin_and_chunking_are_bitwise(ctx, rng):
    """One call over T rows == T calls of one row (the decode twin) == calls of 1, 2, 1, ...
    rows (T < kc-1 per call keeps part of the old window), bit for bit, strided or not."""
    T, C, kc = 50, 6144, 4
    m, window, weight = randn(rng, T, C), randn(rng, kc - 1, C), randn(rng, C, kc, scale=0.5)
    u1, w1 = _conv_in_calls(ctx, m, window, weight, [T])
    ut, wt = _conv_in_calls(ctx, m, window, weight, [1] * T)
    uc, wc = _conv_in_calls(ctx, m, window, weight, [1, 2, 1, 1, 2, 17, 16, 1, 9], strided=True)
    for u, w in ((ut, wt), (uc, wc)):
        assert np.array_equal(u, u1) and np.array_equal(w, w1)
    ref_u, ref_w = ops.causal_conv1d_silu(m, window, weight)
    assert_close("conv1d chunked", ref_u, uc, rtol=RTOL)
    assert np.array_equal(w1, ref_w.astype(np.float32))


@gpu
def test_conv1d_many_rows_uses_several_chunks_per_channel(ctx, rng):
    T, C, kc = 3000, 130, 4   # > one chunk of rows per thread, channel count not a multiple of 128
    m, window, weight = randn(rng, T, C), randn(rng, kc - 1, C), randn(rng, C, kc)
    u, new_window = G.gdn_conv1d_np(ctx, m, window, weight)
    ref_u, ref_w = ops.causal_conv1d_silu(m, window, weight)
    assert_close("conv1d long", ref_u, u, rtol=RTOL)
    assert np.array_equal(new_window, ref_w.astype(np.float32))


# ----------------------------------------------------------------------------- GPU: L2 norm


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hk,dk", [(16, 128), (2, 16), (4, 32)])
def test_l2norm_q_and_k_inside_conv_rows(ctx, rng, rows, hk, dk):
    """q at column 0 (scale 1/sqrt(dk)) and k at column hk*dk of conv-output rows."""
    key_dim = hk * dk
    conv_dim = 2 * key_dim + 2 * key_dim   # q | k | v (v wider, as for Hv = 2 Hk)
    u = randn(rng, rows, conv_dim, scale=2.0)
    scale = 1.0 / np.sqrt(dk)
    out = G.gdn_l2norm_np(ctx, u, hk, dk, 1e-6, scale, col0=0)
    out = G.gdn_l2norm_np(ctx, out, hk, dk, 1e-6, 1.0, col0=key_dim)
    ref_q = ref_l2(ops.heads(u, hk, dk), 1e-6, scale).reshape(rows, key_dim)
    ref_k = ref_l2(ops.heads(u, hk, dk, col0=key_dim), 1e-6, 1.0).reshape(rows, key_dim)
    assert_close("l2 q", ref_q, out[:, :key_dim], rtol=RTOL)
    assert_close("l2 k", ref_k, out[:, key_dim:2 * key_dim], rtol=RTOL)
    assert np.array_equal(out[:, 2 * key_dim:], u[:, 2 * key_dim:]), "v columns changed"


@gpu
def test_l2norm_twin_is_bitwise(ctx, rng):
    T, hk, dk = 33, 16, 128
    ld = 3 * hk * dk
    x = randn(rng, T, ld)
    with upload(ctx, x) as a, upload(ctx, x) as b:
        G.gdn_l2norm(ctx, View(a, 0, ld), T, 2 * hk, dk, 1e-6, 0.125)
        for t in range(T):
            G.gdn_l2norm(ctx, View(b, t * ld, ld), 1, 2 * hk, dk, 1e-6, 0.125)
        assert np.array_equal(a.download(np.float32, x.shape), b.download(np.float32, x.shape))


# ----------------------------------------------------------------------------- GPU: gates


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hv", [16, 32, 48])
def test_gates(ctx, rng, rows, hv):
    b = randn(rng, rows, hv, scale=3.0)
    alpha = randn(rng, rows, hv, scale=4.0)
    alpha[0, 0] = 25.0     # softplus above its threshold: x itself
    ssm_a = (-np.exp(rng.uniform(-1, 1, hv))).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, hv).astype(np.float32)
    beta, g = G.gdn_gates_np(ctx, b, alpha, ssm_a, dt_bias)
    rb, rg = ops.gdn_gates(b, alpha, ssm_a, dt_bias)
    assert_close("beta", rb, beta, rtol=RTOL)
    assert_close("g", rg, g, rtol=RTOL)
    assert (g <= 0).all() and ((beta > 0) & (beta < 1)).all()


@gpu
def test_gates_twin_is_bitwise_and_strided(ctx, rng):
    """b and alpha interleaved in one [T][2*Hv] matrix, beta and g in another; T calls of one
    row == one call of T rows."""
    T, hv = 29, 32
    ba = randn(rng, T, 2 * hv, scale=3.0)
    ssm_a = (-np.exp(rng.uniform(-1, 1, hv))).astype(np.float32)
    dt = rng.uniform(-1, 1, hv).astype(np.float32)
    outs = []
    with upload(ctx, ba) as bba, upload(ctx, ssm_a) as bs, upload(ctx, dt) as bd:
        for calls in ([T], [1] * T):
            with poisoned(ctx, T * 2 * hv * 4) as bo:
                t = 0
                for n in calls:
                    r = t * 2 * hv
                    G.gdn_gates(ctx, View(bba, r, 2 * hv), View(bba, r + hv, 2 * hv), bs, bd,
                                View(bo, r, 2 * hv), View(bo, r + hv, 2 * hv), n, hv)
                    t += n
                outs.append(bo.download(np.float32, (T, 2 * hv)))
    assert np.array_equal(outs[0], outs[1])
    rb, rg = ops.gdn_gates(ba[:, :hv], ba[:, hv:], ssm_a, dt)
    assert_close("beta", rb, outs[0][:, :hv], rtol=RTOL)
    assert_close("g", rg, outs[0][:, hv:], rtol=RTOL)


# ----------------------------------------------------------------------------- GPU: gated norm


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hv,dv", [(16, 128), (32, 128), (48, 128), (3, 16)])
def test_gated_rms_norm(ctx, rng, rows, hv, dv):
    o = randn(rng, rows, hv * dv)
    z = randn(rng, rows, hv * dv, scale=2.0)
    w = randn(rng, dv)
    y = G.gdn_gated_rms_norm_np(ctx, o, z, w, hv, 1e-6)
    assert_close("gated_rms_norm", ref_gated_norm(o, z, w, hv, 1e-6), y, rtol=RTOL)


@gpu
def test_gated_rms_norm_in_place(ctx, rng):
    rows, hv, dv = 7, 32, 128
    o, z, w = randn(rng, rows, hv * dv), randn(rng, rows, hv * dv), randn(rng, dv)
    with upload(ctx, o) as bo, upload(ctx, z) as bz, upload(ctx, w) as bw:
        G.gdn_gated_rms_norm(ctx, bo, bz, bw, bo, rows, hv, dv, 1e-6)
        y = bo.download(np.float32, o.shape)
    assert_close("gated_rms_norm in place", ref_gated_norm(o, z, w, hv, 1e-6), y, rtol=RTOL)


# ----------------------------------------------------------------------------- GPU: scan


SCAN_DIMS = {  # hk, hv, dk, dv
    "0.8B": (16, 16, 128, 128),
    "4B": (16, 32, 128, 128),
    "27B": (16, 48, 128, 128),
    "tiny-16": (2, 4, 16, 16),
    "tiny-32": (2, 6, 32, 32),
    "mixed": (4, 12, 64, 32),
    "mixed2": (2, 2, 32, 64),
}


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dims", list(SCAN_DIMS))
def test_scan_matches_float64_recurrence(ctx, rng, rows, dims):
    hk, hv, dk, dv = SCAN_DIMS[dims]
    q, k, v, beta, g, S0 = scan_inputs(rng, rows, hk, hv, dk, dv)
    o, S = G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path="sequential")
    assert_scan("scan", ref_scan(q, k, v, beta, g, S0), (o, S), RTOL)


@gpu
@pytest.mark.parametrize("r", [1, 2, 3])
def test_scan_head_pairing_is_tiled(ctx, rng, r):
    """Hv = r*Hk: value head j reads key head j % Hk (a grouped j // r pairing would fail)."""
    hk, dk, dv = 4, 32, 32
    q, k, v, beta, g, S0 = scan_inputs(rng, 20, hk, r * hk, dk, dv)
    o, S = G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path="sequential")
    assert_scan("scan", ref_scan(q, k, v, beta, g, S0), (o, S), RTOL)


def _scan_in_calls(ctx, q, k, v, beta, g, S0, sizes, *, o_in_place=False, path="sequential",
                   workspace=None):
    """The scan over consecutive calls of the given row counts, with q, k, v inside one
    conv-output matrix [T][q | k | v | pad] and beta, g inside one [T][beta | g] matrix, as the
    engine lays them out. Returns (o, S); checks that nothing outside o's columns was written."""
    T = q.shape[0]
    hv, dk, dv = S0.shape
    kw, vw = q.shape[1], v.shape[1]
    hk = kw // dk
    ld = 2 * kw + vw + 3
    u = np.concatenate([q, k, v, np.zeros((T, 3), np.float32)], axis=1)
    bg = np.concatenate([beta, g], axis=1)
    ldo = vw + 7
    with upload(ctx, u) as bu, upload(ctx, bg) as bbg, upload(ctx, S0) as bs, \
            poisoned(ctx, T * ldo * 4) as bo:
        t = 0
        for n in sizes:
            r = t * ld
            out = View(bu, r + 2 * kw, ld) if o_in_place else View(bo, t * ldo + 4, ldo)
            G.gdn_scan(ctx, View(bu, r, ld), View(bu, r + kw, ld), View(bu, r + 2 * kw, ld),
                       View(bbg, t * 2 * hv, 2 * hv), View(bbg, t * 2 * hv + hv, 2 * hv),
                       bs, out, n, hk, hv, dk, dv, path, workspace)
            t += n
        assert t == T
        S = bs.download(np.float32, S0.shape)
        if o_in_place:
            return bu.download(np.float32, u.shape)[:, 2 * kw:2 * kw + vw], S
        o = bo.download(np.float32, (T, ldo))
    assert np.isnan(o[:, :4]).all() and np.isnan(o[:, 4 + vw:]).all(), "wrote outside o's columns"
    return o[:, 4:4 + vw], S


@gpu
@pytest.mark.parametrize("dims", ["4B", "tiny-32"])
def test_scan_state_carried_across_calls(ctx, rng, dims):
    """Calls of T = 1, 2, 3, 63, 64, 65, 777 rows carrying the state == one call over all rows,
    bit for bit (the tile of 32 tokens never changes an operation), and both match float64."""
    hk, hv, dk, dv = SCAN_DIMS[dims]
    sizes = [1, 2, 3, 63, 64, 65, 777]
    q, k, v, beta, g, S0 = scan_inputs(rng, sum(sizes), hk, hv, dk, dv)
    o1, S1 = _scan_in_calls(ctx, q, k, v, beta, g, S0, [sum(sizes)])
    oc, Sc = _scan_in_calls(ctx, q, k, v, beta, g, S0, sizes)
    assert np.array_equal(o1, oc) and np.array_equal(S1, Sc)
    assert_scan("scan", ref_scan(q, k, v, beta, g, S0), (oc, Sc), RTOL)


@gpu
@pytest.mark.parametrize("dims", ["27B", "tiny-16"])
def test_scan_twin_is_bitwise(ctx, rng, dims):
    """T launches of one row (the decode twin) == one launch of T rows, output and state."""
    hk, hv, dk, dv = SCAN_DIMS[dims]
    T = 45
    q, k, v, beta, g, S0 = scan_inputs(rng, T, hk, hv, dk, dv)
    o1, S1 = _scan_in_calls(ctx, q, k, v, beta, g, S0, [T])
    ot, St = _scan_in_calls(ctx, q, k, v, beta, g, S0, [1] * T)
    assert np.array_equal(o1, ot) and np.array_equal(S1, St)


@gpu
def test_scan_output_in_place_over_v(ctx, rng):
    hk, hv, dk, dv = SCAN_DIMS["4B"]
    q, k, v, beta, g, S0 = scan_inputs(rng, 70, hk, hv, dk, dv)
    o, S = _scan_in_calls(ctx, q, k, v, beta, g, S0, [70], o_in_place=True)
    assert_scan("scan (in place)", ref_scan(q, k, v, beta, g, S0), (o, S), RTOL)


@gpu
def test_scan_from_zero_state_long(ctx, rng):
    """A fresh sequence (S = 0) over 2000 tokens stays within the bound (no drift)."""
    hk, hv, dk, dv = SCAN_DIMS["tiny-32"]
    q, k, v, beta, g, _ = scan_inputs(rng, 2000, hk, hv, dk, dv)
    S0 = np.zeros((hv, dk, dv), np.float32)
    o, S = G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path="sequential")
    assert_scan("scan", ref_scan(q, k, v, beta, g, S0), (o, S), RTOL)


@gpu
def test_gdn_chain_two_chunks_equals_one(ctx, rng):
    """conv -> L2 norm -> gates -> scan -> gated norm for a prompt in two chunks (state carried
    in the window and S) equals the whole prompt in one chunk, bit for bit."""
    hk, hv, dk, dv, kc = 2, 4, 32, 32, 4
    key_dim, conv_dim = hk * dk, 2 * hk * dk + hv * dv
    T = 40
    m = randn(rng, T, conv_dim)
    window = np.zeros((kc - 1, conv_dim), np.float32)
    weight = randn(rng, conv_dim, kc, scale=0.5)
    b, alpha, z = randn(rng, T, hv), randn(rng, T, hv), randn(rng, T, hv * dv)
    ssm_a = (-np.exp(rng.uniform(-1, 1, hv))).astype(np.float32)
    dt = rng.uniform(-1, 1, hv).astype(np.float32)
    norm_w = randn(rng, dv)

    def run(splits):
        win, S = window.copy(), np.zeros((hv, dk, dv), np.float32)
        ys, t = [], 0
        for n in splits:
            u, win = G.gdn_conv1d_np(ctx, np.ascontiguousarray(m[t:t + n]), win, weight)
            u = G.gdn_l2norm_np(ctx, u, hk, dk, 1e-6, 1.0 / np.sqrt(dk), col0=0)
            u = G.gdn_l2norm_np(ctx, u, hk, dk, 1e-6, 1.0, col0=key_dim)
            beta, g = G.gdn_gates_np(ctx, np.ascontiguousarray(b[t:t + n]),
                                  np.ascontiguousarray(alpha[t:t + n]), ssm_a, dt)
            o, S = G.gdn_scan_np(ctx, np.ascontiguousarray(u[:, :key_dim]),
                              np.ascontiguousarray(u[:, key_dim:2 * key_dim]),
                              np.ascontiguousarray(u[:, 2 * key_dim:]), beta, g, S)
            ys.append(G.gdn_gated_rms_norm_np(ctx, o, np.ascontiguousarray(z[t:t + n]), norm_w, hv))
            t += n
        return np.concatenate(ys), win, S

    y1, w1, S1 = run([T])
    y2, w2, S2 = run([1, 2, 37])
    assert np.array_equal(y1, y2) and np.array_equal(w1, w2) and np.array_equal(S1, S2)


@gpu
def test_scan_paths(ctx, rng):
    """AUTO: the sequential scan for dims other than 128 (bit for bit), the chunked one for
    dk = dv = 128 from 64 rows (bit for bit with an explicit CHUNKED); CHUNKED on other dims is
    UNSUPPORTED before any device work."""
    hk, hv, dk, dv = SCAN_DIMS["tiny-32"]
    q, k, v, beta, g, S0 = scan_inputs(rng, 65, hk, hv, dk, dv)
    oa, Sa = _scan_in_calls(ctx, q, k, v, beta, g, S0, [65], path="auto")
    os_, Ss = _scan_in_calls(ctx, q, k, v, beta, g, S0, [65], path="sequential")
    assert np.array_equal(oa, os_) and np.array_equal(Sa, Ss)
    with pytest.raises(errors.UnsupportedError, match="built for dk = dv = 128"):
        G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path="chunked")
    q, k, v, beta, g, S0 = scan_inputs(rng, 65, 2, 4, 128, 128)
    oa, Sa = _scan_in_calls(ctx, q, k, v, beta, g, S0, [65], path="auto")
    oc, Sc = _scan_in_calls(ctx, q, k, v, beta, g, S0, [65], path="chunked")
    assert np.array_equal(oa, oc) and np.array_equal(Sa, Sc)


def test_scan_plan():
    """The path AUTO picks and the chunked workspace (CPU: no device needed)."""
    assert G.gdn_scan_plan(63, 16, 32, 128, 128) == {"path": "sequential", "workspace_bytes": 0}
    p = G.gdn_scan_plan(64, 16, 32, 128, 128)
    assert p["path"] == "chunked" and p["workspace_bytes"] > 0
    assert G.gdn_scan_plan(4096, 16, 32, 64, 64)["path"] == "sequential"
    assert G.gdn_scan_plan(8, 16, 32, 128, 128, path="chunked")["path"] == "chunked"
    # the workspace covers one pass: it stops growing past kGdnPassRows (8192) rows
    w8, w16 = (G.gdn_scan_plan(n, 16, 32, 128, 128)["workspace_bytes"] for n in (8192, 16384))
    assert w8 == w16 > G.gdn_scan_plan(4096, 16, 32, 128, 128)["workspace_bytes"]
    with pytest.raises(errors.UnsupportedError, match="dk = dv = 128"):
        G.gdn_scan_plan(64, 2, 4, 64, 64, path="chunked")
    with pytest.raises(errors.InvalidArgumentError, match="multiple of n_k_heads"):
        G.gdn_scan_plan(64, 3, 4, 128, 128)


# ----------------------------------------------------------------------------- GPU: chunked scan
# The chunkwise-parallel delta rule (spec.md §3.2.1) on tensor cores: fp16 operands with exact
# per-chunk power-of-two scales, fp32 accumulation and state. Bound 2e-3 relative against the
# float64 recurrence (issue 9), on model-like inputs (q, k L2-normalised, beta in (0, 1), decays
# from ssm_a * softplus).

CHUNK_TOL = 2e-3
CHUNK_HEADS = {"hv=hk": (2, 2), "hv=2hk": (2, 4), "hv=3hk": (1, 3)}




@pytest.fixture(params=["warp", "warpgroup", "warpgroup_pair"])
def state_kernel(request, ctx):
    """The state kernels of the chunked path by name (the context's tuning.gdn_state, restored
    after the test): the warp-owned one, the warpgroup one (wgmma; an sm_90a build on a compute
    capability 9.0 device, skipped elsewhere: the library refuses it there with
    UnsupportedError) and its pair form (a CTA per value head)."""
    old = ctx.tuning()
    ctx.set_tuning(old, gdn_state=request.param)
    try:
        if request.param != "warp":
            _skip_without_wg(ctx, "the warpgroup state kernel is not available here")
        yield request.param
    finally:
        ctx.set_tuning(old)


def _skip_without_wg(ctx, why):
    """Skips the test where the library refuses the warpgroup state kernel (set on ctx by the
    caller): no sm_90a build or not a compute capability 9.0 device."""
    probe = scan_inputs(np.random.default_rng(0), 1, 1, 1, 128, 128)
    try:
        G.gdn_scan_np(ctx, *probe, path="chunked")
    except errors.UnsupportedError as exc:
        ctx.set_tuning()
        pytest.skip(f"{why}: {exc}")


def ref_scan_long(q, k, v, beta, g, S0):
    return ref_scan(q, k, v, beta, g, S0, form=ops.delta_rule_chunked)


@gpu
@pytest.mark.parametrize("rows", [1, 63, 64, 65, 777])
@pytest.mark.parametrize("heads", list(CHUNK_HEADS))
def test_chunked_matches_float64(ctx, rng, rows, heads, state_kernel):
    hk, hv = CHUNK_HEADS[heads]
    q, k, v, beta, g, S0 = scan_inputs(rng, rows, hk, hv, 128, 128)
    o, S = _scan_in_calls(ctx, q, k, v, beta, g, S0, [rows], path="chunked")
    assert_scan("chunked", ref_scan(q, k, v, beta, g, S0), (o, S), CHUNK_TOL)


@gpu
@pytest.mark.parametrize("dims", ["0.8B", "4B", "27B", "wide"])
def test_chunked_real_shapes(ctx, rng, dims, state_kernel):
    """All heads of the real models. Warp-owned kernel on 132 SMs: 1, 2 and 4 warps per CTA for
    Hv = 16, 32, 48; "wide" (Hv = 72) takes its 8-warp instance."""
    hk, hv, dk, dv = SCAN_DIMS[dims] if dims != "wide" else (8, 72, 128, 128)
    q, k, v, beta, g, S0 = scan_inputs(rng, 333, hk, hv, dk, dv)
    o, S = G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path="chunked")
    assert_scan("chunked", ref_scan_long(q, k, v, beta, g, S0), (o, S), CHUNK_TOL)


@gpu
def test_chunked_state_carried_across_calls(ctx, rng, state_kernel):
    """Calls of 1, 2, 63, 64, 65 and the rest carry the state (within the bound, not bitwise:
    chunks restart at every call); the caller's workspace at a byte offset serves each call."""
    sizes = [1, 2, 63, 64, 65, 582]
    q, k, v, beta, g, S0 = scan_inputs(rng, sum(sizes), 2, 4, 128, 128)
    need = G.gdn_scan_plan(max(sizes), 2, 4, 128, 128, path="chunked")["workspace_bytes"]
    with ctx.buffer(need + 512) as ws:
        ws.poison()
        oc, Sc = _scan_in_calls(ctx, q, k, v, beta, g, S0, sizes, path="chunked",
                                workspace=View(ws, 256, 0))
    assert_scan("chunked (carried)", ref_scan(q, k, v, beta, g, S0), (oc, Sc), CHUNK_TOL)


@gpu
@pytest.mark.parametrize("hk, hv, sizes", [(2, 4, [1, 2, 63, 64, 65, 582]), (16, 32, [333, 65]),
                                           (16, 48, [200, 64])])
def test_chunked_pdl_bitwise_stream_order(ctx, rng, hk, hv, sizes, state_kernel):
    """The state kernel (each by name) launched as the prep kernel's programmatic dependent (the
    default on compute capability 9.0+) against plain stream order (tuning gdn_pdl off): the
    same kernels on the same inputs, so the same bits, with the state carried across calls (a
    prep after a state kernel, a state kernel after a prep, each pair once per call), and within
    the float64 bound."""
    inputs = scan_inputs(rng, sum(sizes), hk, hv, 128, 128)
    base = ctx.tuning()
    out = {}
    for pdl in (True, False):
        ctx.set_tuning(base, gdn_pdl=pdl)
        out[pdl] = _scan_in_calls(ctx, *inputs, sizes, path="chunked")
    ctx.set_tuning(base)
    ref = (ref_scan_long if hk >= 16 else ref_scan)(*inputs)
    assert_scan("chunked (PDL)", ref, out[True], CHUNK_TOL)
    for a, b, what in zip(out[True], out[False], ("o", "state")):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{what} differs with PDL off"


@gpu
@pytest.mark.parametrize("hk, hv, sizes, sub", [(2, 4, [777], 128), (1, 3, [640], 64),
                                                (16, 32, [2048], 512), (16, 48, [1100], 256),
                                                (2, 4, [300, 65, 520], 128),
                                                (16, 32, [4160], None), (2, 6, [5000, 1000], None)])
def test_chunked_subpasses_bitwise_one_pass(ctx, rng, hk, hv, sizes, sub):
    """Chained sub-passes (the default's 2048 rows where sub is None, else tuning
    gdn_subpass_rows: the prep of sub-pass p + 1 beside the warpgroup state kernel of sub-pass p,
    two workspace halves, every launch chained by programmatic dependence) against one pass
    (gdn_subpass_rows "one-pass"): the same chunks through the same kernels, so the same bits,
    with the state carried across calls, and within the float64 bound. The preconditions of the
    chained form hold here (the warpgroup kernel, rows > sub, a workspace of two sub-passes), so
    a race between the overlapped grids shows as differing bits."""
    ctx.set_tuning(gdn_state="warpgroup")
    _skip_without_wg(ctx, "the chained sub-passes need the warpgroup state kernel")
    mode = None if sub is None else sub        # None: the library's default
    rows = 2048 if sub is None else sub        # kGdnSubpassRows (cuda/plan.h)
    assert any(n > rows for n in sizes)
    for n in sizes:
        if n > rows:
            whole = G.gdn_scan_plan(n, hk, hv, 128, 128, path="chunked")["workspace_bytes"]
            half = G.gdn_scan_plan(rows, hk, hv, 128, 128, path="chunked")["workspace_bytes"]
            assert whole >= 2 * half, f"{n} rows: a workspace of {whole} bytes < 2 x {half}"
    inputs = scan_inputs(rng, sum(sizes), hk, hv, 128, 128)
    strided, aligned = {}, {}   # v inside the conv-output matrix (4-byte rows) / contiguous v
    try:
        for m in (mode, "one-pass"):
            ctx.set_tuning(gdn_state="warpgroup", gdn_subpass_rows=m)
            strided[m] = _scan_in_calls(ctx, *inputs, sizes, path="chunked")
            if len(sizes) == 1:
                aligned[m] = G.gdn_scan_np(ctx, *inputs, path="chunked")
    finally:
        ctx.set_tuning()
    ref = (ref_scan_long if hk >= 16 else ref_scan)(*inputs)
    assert_scan("chunked (sub-passes)", ref, strided[mode], CHUNK_TOL)
    for form, out in (("strided v", strided), ("aligned v", aligned)):
        for a, b, what in zip(out.get(mode, ()), out.get("one-pass", ()), ("o", "state")):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), \
                f"{what} differs between sub-passes of {rows} rows and one pass ({form})"


@gpu
@pytest.mark.parametrize("hk, hv", [(16, 32), (2, 4)])
def test_chunked_2048_row_calls_bitwise_one_pass(ctx, rng, hk, hv):
    """Under the default tuning a call of 2048 rows (a session's step) chains two sub-passes of
    1024 rows (kGdnShortSubpassRows, cuda/plan.h) where the chained form runs: bitwise one pass,
    the state carried over three calls, and within the float64 bound. (That the split happens is
    the bench's to show: the default row at 2048 against "chunked subpass1024".)"""
    ctx.set_tuning(gdn_state="warpgroup")
    _skip_without_wg(ctx, "the chained sub-passes need the warpgroup state kernel")
    whole = G.gdn_scan_plan(2048, hk, hv, 128, 128, path="chunked")["workspace_bytes"]
    half = G.gdn_scan_plan(1024, hk, hv, 128, 128, path="chunked")["workspace_bytes"]
    assert whole >= 2 * half, f"a 2048-row workspace of {whole} bytes < 2 x {half}"
    sizes = [2048, 2048, 2048]
    inputs = scan_inputs(rng, sum(sizes), hk, hv, 128, 128)
    out = {}
    try:
        for m in (None, "one-pass"):
            ctx.set_tuning(gdn_state="warpgroup", gdn_subpass_rows=m)
            out[m] = _scan_in_calls(ctx, *inputs, sizes, path="chunked")
    finally:
        ctx.set_tuning()
    ref = (ref_scan_long if hk >= 16 else ref_scan)(*inputs)
    assert_scan("chunked (2048-row calls)", ref, out[None], CHUNK_TOL)
    for a, b, what in zip(out[None], out["one-pass"], ("o", "state")):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), \
            f"{what} differs between a 2048-row call's default and one pass"


@gpu
@pytest.mark.parametrize("case", ["no decay, beta~1", "strong decay", "large values", "zero state"])
def test_chunked_hard_cases(ctx, rng, case, state_kernel):
    """No decay with beta ~ 1 (the triangular solve at its worst conditioning), decays of -40
    per row (exp underflows: no NaN), values of 1e4 (past fp16's range after the products: the
    per-chunk scales keep the operands finite), a fresh sequence."""
    q, k, v, beta, g, S0 = scan_inputs(rng, 300, 2, 4, 128, 128)
    if case == "no decay, beta~1":
        g = np.full_like(g, -1e-6)
        beta = np.full_like(beta, 0.999)
    elif case == "strong decay":
        g = np.full_like(g, -40.0)
    elif case == "large values":
        v *= np.float32(1e4)
        S0 *= np.float32(1e4)
    else:
        S0 = np.zeros_like(S0)
    o, S = _scan_in_calls(ctx, q, k, v, beta, g, S0, [300], path="chunked")
    assert_scan(f"chunked ({case})", ref_scan(q, k, v, beta, g, S0), (o, S), CHUNK_TOL)


_LONG = {}


def _long_case(rows, hk, hv):
    """Inputs and their float64 reference for the long cases, computed once per session (the
    reference over 8192 rows x 32 heads takes seconds)."""
    if (rows, hk, hv) not in _LONG:
        rng = np.random.default_rng(rows * 131 + hk * 7 + hv)
        inp = scan_inputs(rng, rows, hk, hv, 128, 128)
        _LONG[rows, hk, hv] = inp, ref_scan_long(*inp)
    return _LONG[rows, hk, hv]


@gpu
@pytest.mark.parametrize("rows, hk, hv", [(8192, 16, 32), (65536, 1, 2)])
def test_chunked_long(ctx, rows, hk, hv, state_kernel):
    """The qwen35-4b shape at 8192 rows, and 65536 rows (eight passes of 8192): within the bound,
    no NaN or Inf."""
    (q, k, v, beta, g, S0), (ro, rS) = _long_case(rows, hk, hv)
    o, S = G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path="chunked")
    assert_scan("chunked (long)", (ro, rS), (o, S), CHUNK_TOL)


@gpu
def test_chunked_output_in_place_over_v(ctx, rng, state_kernel):
    q, k, v, beta, g, S0 = scan_inputs(rng, 130, 2, 4, 128, 128)
    o, S = _scan_in_calls(ctx, q, k, v, beta, g, S0, [130], o_in_place=True, path="chunked")
    assert_scan("chunked (in place)", ref_scan(q, k, v, beta, g, S0), (o, S), CHUNK_TOL)


@gpu
def test_chunked_workspace_checks(ctx, rng):
    q, k, v, beta, g, S0 = scan_inputs(rng, 64, 2, 4, 128, 128)
    need = G.gdn_scan_plan(64, 2, 4, 128, 128)["workspace_bytes"]
    with ctx.buffer(need) as ws:
        with pytest.raises(errors.InvalidArgumentError, match="workspace"):
            _scan_in_calls(ctx, q, k, v, beta, g, S0, [64], path="chunked",
                           workspace=View(ws, 256, 0))           # 256 bytes short
    with ctx.buffer(need + 512) as ws:
        with pytest.raises(errors.InvalidArgumentError, match="multiple of 256"):
            _scan_in_calls(ctx, q, k, v, beta, g, S0, [64], path="chunked",
                           workspace=View(ws, 4, 0))


@gpu
def test_gdn_buffer_checks_on_device(ctx):
    with ctx.buffer(4096 * 4) as a, ctx.buffer(64 * 4) as small:
        with pytest.raises(errors.InvalidArgumentError, match="u overlaps m"):
            G.gdn_conv1d(ctx, View(a, 0, 64), small, View(a, 2048, 0), View(a, 10, 64), 2, 16, 4)
        with pytest.raises(errors.InvalidArgumentError, match="weight holds 256 bytes"):
            G.gdn_conv1d(ctx, a, View(a, 3000, 0), small, View(a, 1000, 0), 2, 32, 4)
        with pytest.raises(errors.InvalidArgumentError, match="o overlaps q"):
            G.gdn_scan(ctx, View(a, 0, 64), View(a, 16, 64), View(a, 32, 64), small,
                       View(small, 8, 0), View(a, 3000, 0), View(a, 0, 64), 2, 1, 1, 16, 16)
        with pytest.raises(errors.InvalidArgumentError, match="state holds"):
            G.gdn_scan(ctx, a, a, a, a, a, small, View(a, 2048, 0), 1, 1, 1, 16, 16)


# ----------------------------------------------------------------------------- GPU: many sequences
# pf_gdn_scan_varlen: the rows of several sequences back to back (cu_seqlens), each sequence
# with its own slot of a state pool, in one call (issue 28). Exactly one pf_gdn_scan per sequence
# on its rows and its slot: the sequential path always bitwise, the chunked path bitwise for
# sequences within one pass (<= 8192 rows: the same chunks through the same kernels).

VARLEN_MIXES = {
    "ragged": [1, 63, 64, 65, 777],
    "one row beside long ones": [1, 2048, 1, 300],
    "8x129": [129] * 8,
}


def varlen_inputs(rng, lens, hk, hv, dk, dv, n_states=None):
    """(q, k, v, beta, g, states, cu_seqlens): scan_inputs over all rows and a pool of n_states
    random states (default: one per sequence)."""
    q, k, v, beta, g, _ = scan_inputs(rng, sum(lens), hk, hv, dk, dv)
    states = randn(rng, n_states or len(lens), hv, dk, dv, scale=0.5)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    return q, k, v, beta, g, states, cu


def _slots(cu, state_indices):
    return list(range(len(cu) - 1)) if state_indices is None else [int(s) for s in state_indices]


def varlen_per_sequence(ctx, q, k, v, beta, g, states, cu, state_indices=None, path="sequential"):
    """What a varlen call must give: one pf_gdn_scan per sequence on its rows and its slot."""
    o = np.full(v.shape, np.nan, np.float32)
    out = states.copy()
    for i, s in enumerate(_slots(cu, state_indices)):
        r = slice(int(cu[i]), int(cu[i + 1]))
        o[r], out[s] = G.gdn_scan_np(ctx, *(np.ascontiguousarray(x[r]) for x in (q, k, v, beta, g)),
                                     states[s], path=path)
    return o, out


def varlen_reference(q, k, v, beta, g, states, cu, state_indices=None):
    """float64 per sequence (the recurrence; its chunked float64 form past 1000 rows)."""
    o = np.zeros(v.shape, np.float64)
    out = states.astype(np.float64)
    for i, s in enumerate(_slots(cu, state_indices)):
        r = slice(int(cu[i]), int(cu[i + 1]))
        ref = ref_scan_long if r.stop - r.start > 1000 else ref_scan
        o[r], out[s] = ref(*(x[r] for x in (q, k, v, beta, g)), states[s])
    return o, out


def assert_bitwise(name, got, want, what=("o", "states")):
    for a, b, w in zip(got, want, what):
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), \
            f"{name}: {w} differs bitwise ({int((a.view(np.uint32) != b.view(np.uint32)).sum())} elements)"


def _varlen_strided(ctx, q, k, v, beta, g, states, cu, state_indices=None, path="auto", *,
                    o_in_place=False, workspace=None):
    """The varlen call with the engine's layout (as _scan_in_calls): q, k, v inside one
    conv-output matrix [T][q | k | v | pad] of odd row stride (4-byte aligned rows: the kernels'
    unaligned forms), beta, g inside one [T][beta | g] matrix, o in a wider poisoned matrix (or
    over v). Returns (o, states); checks that nothing outside o's columns was written."""
    T = q.shape[0]
    n_states, hv, dk, dv = states.shape
    kw, vw = q.shape[1], v.shape[1]
    hk = kw // dk
    ld = 2 * kw + vw + 3
    u = np.concatenate([q, k, v, np.zeros((T, 3), np.float32)], axis=1)
    bg = np.concatenate([beta, g], axis=1)
    ldo = vw + 7
    with upload(ctx, u) as bu, upload(ctx, bg) as bbg, upload(ctx, states) as bs, \
            poisoned(ctx, T * ldo * 4) as bo:
        out = View(bu, 2 * kw, ld) if o_in_place else View(bo, 4, ldo)
        G.gdn_scan_varlen(ctx, View(bu, 0, ld), View(bu, kw, ld), View(bu, 2 * kw, ld),
                          View(bbg, 0, 2 * hv), View(bbg, hv, 2 * hv), bs, out, cu, n_states, hk,
                          hv, dk, dv, state_indices, path, workspace)
        S = bs.download(np.float32, states.shape)
        if o_in_place:
            return bu.download(np.float32, u.shape)[:, 2 * kw:2 * kw + vw], S
        o = bo.download(np.float32, (T, ldo))
    assert np.isnan(o[:, :4]).all() and np.isnan(o[:, 4 + vw:]).all(), "wrote outside o's columns"
    return o[:, 4:4 + vw], S


@gpu
@pytest.mark.parametrize("mix", list(VARLEN_MIXES))
@pytest.mark.parametrize("dims", ["4B", "tiny-16", "mixed"])
def test_varlen_sequential_bitwise_and_float64(ctx, rng, mix, dims):
    """The sequential path: bitwise one pf_gdn_scan per sequence (every token's arithmetic is the
    one-sequence kernel's), within 1e-5 of float64; contiguous and strided operands."""
    hk, hv, dk, dv = SCAN_DIMS[dims]
    inp = varlen_inputs(rng, VARLEN_MIXES[mix], hk, hv, dk, dv)
    out = G.gdn_scan_varlen_np(ctx, *inp, path="sequential")
    assert_bitwise("sequential varlen", out, varlen_per_sequence(ctx, *inp, path="sequential"))
    assert_bitwise("sequential varlen (strided)", _varlen_strided(ctx, *inp, path="sequential"), out)
    assert_scan("sequential varlen", varlen_reference(*inp), out, RTOL)


@gpu
@pytest.mark.parametrize("mix", list(VARLEN_MIXES))
@pytest.mark.parametrize("heads", list(CHUNK_HEADS))
def test_varlen_chunked_bitwise_and_float64(ctx, rng, mix, heads, state_kernel):
    """The chunked path, each state kernel: bitwise one pf_gdn_scan per sequence (each sequence's
    chunks start at its first row: the same chunks through the same kernels), with contiguous
    operands (v by TMA, a sequence's last partial chunk by 16-byte cp.async) and strided ones
    (4-byte rows: 4-byte copies; the form of a copy changes no value); within CHUNK_TOL of
    float64."""
    hk, hv = CHUNK_HEADS[heads]
    inp = varlen_inputs(rng, VARLEN_MIXES[mix], hk, hv, 128, 128)
    out = G.gdn_scan_varlen_np(ctx, *inp, path="chunked")
    assert_bitwise("chunked varlen", out, varlen_per_sequence(ctx, *inp, path="chunked"))
    assert_bitwise("chunked varlen (strided)", _varlen_strided(ctx, *inp, path="chunked"), out)
    assert_scan("chunked varlen", varlen_reference(*inp), out, CHUNK_TOL)


@gpu
@pytest.mark.parametrize("hk, hv, lens", [(16, 32, [1, 65, 777, 2100, 64, 300]), (2, 4, [129] * 8),
                                          (16, 48, [1000, 3])])
def test_state_kernel_pair_form_is_bitwise(ctx, rng, hk, hv, lens):
    """The warpgroup state kernel's pair form (a CTA per value head: two consumer warpgroups on
    one SM sharing each chunk's K, Q, Tm and P) against its single form (a CTA per 64 value
    columns): the same arithmetic per warpgroup, so the same bits, for a varlen call (contiguous:
    V by TMA, a sequence's partial last chunk by 16-byte cp.async; strided: 4-byte copies) and
    for one sequence carried across calls; the default (auto: the pair where the single form's
    grid exceeds one wave; the warp-owned kernel for unaligned V rows) gives them too on the
    contiguous call; within CHUNK_TOL of float64."""
    base = ctx.tuning()
    inp = varlen_inputs(rng, lens, hk, hv, 128, 128)
    one = scan_inputs(rng, 700, hk, hv, 128, 128)
    got = {}
    try:
        for form in ("warpgroup", "warpgroup_pair", "auto"):
            ctx.set_tuning(base, gdn_state=form)
            if form != "auto":
                _skip_without_wg(ctx, "the warpgroup state kernel is not available here")
            got[form] = (G.gdn_scan_varlen_np(ctx, *inp, path="chunked"),
                         _varlen_strided(ctx, *inp, path="chunked"),
                         _scan_in_calls(ctx, *one, [65, 635], path="chunked"))
    finally:
        ctx.set_tuning(base)
    for i, what in enumerate(("varlen", "varlen (strided)", "one sequence")):
        assert_bitwise(f"pair {what}", got["warpgroup_pair"][i], got["warpgroup"][i])
    assert_bitwise("auto varlen", got["auto"][0], got["warpgroup"][0])
    assert_scan("pair varlen", varlen_reference(*inp), got["warpgroup_pair"][0], CHUNK_TOL)


@gpu
@pytest.mark.parametrize("hk, hv", [(16, 32), (16, 48)])
def test_varlen_chunked_real_shapes(ctx, rng, hk, hv, state_kernel):
    """The qwen35 4b / 27b heads: a ragged mix whose 2100-row sequence runs as chained sub-passes
    when alone (the same chunks as one pass): bitwise, and within CHUNK_TOL of float64."""
    inp = varlen_inputs(rng, [1, 65, 777, 2100], hk, hv, 128, 128)
    out = G.gdn_scan_varlen_np(ctx, *inp, path="chunked")
    assert_bitwise("chunked varlen", out, varlen_per_sequence(ctx, *inp, path="chunked"))
    assert_scan("chunked varlen", varlen_reference(*inp), out, CHUNK_TOL)


@gpu
def test_varlen_decode_64_sequences_of_one_row(ctx, rng):
    """Decode: 64 sequences of one row at 16/32 heads, one launch of the sequential scan (AUTO
    picks it: the longest sequence has fewer than 64 rows), bitwise the per-sequence calls."""
    inp = varlen_inputs(rng, [1] * 64, 16, 32, 128, 128)
    assert G.gdn_scan_varlen_plan(inp[-1], 16, 32, 128, 128)["path"] == "sequential"
    out = G.gdn_scan_varlen_np(ctx, *inp)
    assert_bitwise("decode varlen", out, varlen_per_sequence(ctx, *inp, path="sequential"))
    assert_scan("decode varlen", varlen_reference(*inp), out, RTOL)


@gpu
@pytest.mark.parametrize("path", ["sequential", "chunked"])
def test_varlen_state_indices_permuted(ctx, rng, path):
    """Five sequences on five of nine slots, in a shuffled order: each sequence reads and writes
    only its slot (bitwise the per-sequence calls on those slots), the other four slots come back
    unchanged, bit for bit."""
    inp = varlen_inputs(rng, [65, 1, 130, 64, 200], 2, 4, 128, 128, n_states=9)
    idx = rng.permutation(9)[:5].astype(np.int32)
    out = G.gdn_scan_varlen_np(ctx, *inp, state_indices=idx, path=path)
    assert_bitwise(f"{path} varlen (slots)", out,
                   varlen_per_sequence(ctx, *inp, state_indices=idx, path=path))
    unused = sorted(set(range(9)) - set(idx.tolist()))
    assert np.array_equal(out[1][unused].view(np.uint32), inp[5][unused].view(np.uint32)), \
        "a slot no sequence uses changed"
    tol = RTOL if path == "sequential" else CHUNK_TOL
    assert_scan(f"{path} varlen (slots)", varlen_reference(*inp, state_indices=idx), out, tol)


def _neighbours_do_not_leak(ctx, rng, poison, path):
    """Sequences 1 (65 rows: its last chunk has one row, the next 63 rows of its tile belong to
    sequence 2) and 3 (one row) beside neighbours 0, 2 and 4 whose rows (q, k, v, beta, g) and
    slots hold `poison`: the targets' outputs and states are bitwise those of the same call with
    clean neighbours, finite, and the per-sequence calls'."""
    lens = [70, 65, 130, 1, 64]
    q, k, v, beta, g, states, cu = varlen_inputs(rng, lens, 2, 4, 128, 128)
    clean = G.gdn_scan_varlen_np(ctx, q, k, v, beta, g, states, cu, path=path)
    bad = [x.copy() for x in (q, k, v, beta, g, states)]
    for i in (0, 2, 4):
        for x in bad[:5]:
            x[int(cu[i]):int(cu[i + 1])] = poison
        bad[5][i] = poison
    dirty = G.gdn_scan_varlen_np(ctx, *bad, cu, path=path)
    for t in (1, 3):
        r = slice(int(cu[t]), int(cu[t + 1]))
        assert_bitwise(f"{path} varlen, sequence {t} beside {poison}", (dirty[0][r], dirty[1][t]),
                       (clean[0][r], clean[1][t]))
        assert np.isfinite(dirty[0][r]).all() and np.isfinite(dirty[1][t]).all()
    per = varlen_per_sequence(ctx, q, k, v, beta, g, states, cu, path=path)
    assert_bitwise(f"{path} varlen (clean)", clean, per)


@gpu
@pytest.mark.parametrize("poison", [np.nan, 1e30])
def test_varlen_chunked_neighbours_do_not_leak(ctx, rng, poison, state_kernel):
    _neighbours_do_not_leak(ctx, rng, np.float32(poison), "chunked")


@gpu
@pytest.mark.parametrize("poison", [np.nan, 1e30])
def test_varlen_sequential_neighbours_do_not_leak(ctx, rng, poison):
    _neighbours_do_not_leak(ctx, rng, np.float32(poison), "sequential")


@gpu
@pytest.mark.parametrize("lens", [[4000, 100, 4000, 100, 4000], [2048] * 12])
def test_varlen_chunked_rounds(ctx, rng, lens, state_kernel):
    """Calls of more chunks than one round holds (kGdnVarlenRoundChunks = 128, cuda/plan.h): 3 x
    4000 + 2 x 100 rows (two rounds, the long sequences continuing in their slots), and 12 x
    2048 (three rounds of 8 x 16 or 4 x 32 chunks: the first sequences finish before the last
    start). A piece of a sequence starts at a multiple of 64 rows, so the chunks are the
    per-sequence call's and the state carries as between sub-passes: bitwise the per-sequence
    calls, within CHUNK_TOL of float64; the caller's workspace at a byte offset (strided
    operands)."""
    inp = varlen_inputs(rng, lens, 1, 2, 128, 128)
    need = G.gdn_scan_varlen_plan(inp[-1], 1, 2, 128, 128, path="chunked")["workspace_bytes"]
    one_round = G.gdn_scan_plan(8192, 1, 2, 128, 128, path="chunked")["workspace_bytes"]
    assert need <= one_round + 4096, "at most a round's scratch (128 chunks) and the tables"
    with ctx.buffer(need + 512) as ws:
        ws.poison()
        out = _varlen_strided(ctx, *inp, path="chunked", workspace=View(ws, 256, 0))
    assert_bitwise("chunked varlen (rounds)", out, varlen_per_sequence(ctx, *inp, path="chunked"))
    assert_scan("chunked varlen (rounds)", varlen_reference(*inp), out, CHUNK_TOL)


@gpu
@pytest.mark.parametrize("path", ["sequential", "chunked"])
def test_varlen_output_in_place_over_v(ctx, rng, path, state_kernel):
    inp = varlen_inputs(rng, [65, 130, 1], 2, 4, 128, 128)
    out = _varlen_strided(ctx, *inp, path=path, o_in_place=True)
    assert_bitwise(f"{path} varlen (o over v)", out, _varlen_strided(ctx, *inp, path=path))
    tol = RTOL if path == "sequential" else CHUNK_TOL
    assert_scan(f"{path} varlen (o over v)", varlen_reference(*inp), out, tol)


@gpu
def test_varlen_auto_path(ctx, rng):
    """AUTO: chunked for dk = dv = 128 once the longest sequence has 64 rows (every sequence on
    it, a one-row sequence too), bitwise an explicit CHUNKED; sequential for other dims and for
    sequences all shorter than 64 rows, bitwise an explicit SEQUENTIAL."""
    for lens, dims, want in (([1, 64, 3], (2, 4, 128, 128), "chunked"),
                             ([63, 1, 5], (2, 4, 128, 128), "sequential"),
                             ([1, 200], (2, 6, 32, 32), "sequential")):
        inp = varlen_inputs(rng, lens, *dims)
        assert G.gdn_scan_varlen_plan(inp[-1], *dims)["path"] == want
        assert_bitwise(f"auto varlen {lens}", G.gdn_scan_varlen_np(ctx, *inp),
                       G.gdn_scan_varlen_np(ctx, *inp, path=want))


@gpu
def test_varlen_buffer_checks_on_device(ctx):
    cu = np.array([0, 1, 3], np.int64)
    with ctx.buffer(8192 * 4) as a, ctx.buffer(1024 * 4) as small, ctx.buffer(256) as tiny:
        with pytest.raises(errors.InvalidArgumentError, match="state holds"):
            G.gdn_scan_varlen(ctx, a, a, a, a, a, small, View(a, 4096, 0), cu, 2, 1, 1, 32, 32)
        with pytest.raises(errors.InvalidArgumentError, match="o overlaps q"):
            G.gdn_scan_varlen(ctx, View(a, 0, 64), View(a, 16, 64), View(a, 32, 64), View(a, 4000, 0),
                              View(a, 4100, 0), small, View(a, 0, 64), cu, 2, 1, 1, 16, 16)
        with pytest.raises(errors.InvalidArgumentError, match="workspace holds"):
            G.gdn_scan_varlen(ctx, a, a, a, a, a, View(small, 0), View(a, 4096, 0), cu, 2, 1, 1, 16,
                              16, workspace=View(tiny, 256))


# ----------------------------------------------------------------------------- CPU: checks


def _err(status, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        _check(status)


def test_c_api_conv1d_checks():
    f = lib.pf_gdn_conv1d
    _err(f(NULL, V(), V(), V(), V(), -1, 64, 4), "rows=-1")
    _err(f(NULL, V(), V(), V(), V(), 1, 0, 4), "conv_dim=0")
    _err(f(NULL, V(), V(), V(), V(), 1, 64, 1), "kc=1")
    _err(f(NULL, V(), V(), V(), V(), 1, 64, 9), "kc=9")
    _err(f(NULL, V(ld=63), V(), V(), V(), 1, 64, 4), "m row stride ld=63")
    _err(f(NULL, V(), V(off=-1), V(), V(), 1, 64, 4), "window offset=-1")
    _err(f(NULL, V(), V(), NULL, V(), 1, 64, 4), "view weight is NULL")
    _err(f(NULL, V(), V(), V(), V(), 1, 64, 4), "m is NULL")


def test_c_api_l2norm_and_gates_and_norm_checks():
    _err(lib.pf_gdn_l2norm(NULL, V(), 1, 16, 0, 0, 1e-6, 1.0), "head_dim=0")
    _err(lib.pf_gdn_l2norm(NULL, V(), 1, 16, 128, 0, -1.0, 1.0), "eps")
    _err(lib.pf_gdn_l2norm(NULL, V(), 1, 16, 128, 0, 1e-6, float("inf")), "scale")
    _err(lib.pf_gdn_l2norm(NULL, V(), 1, 16, 128, 64, 1e-6, 1.0), "head_stride=64")
    _err(lib.pf_gdn_l2norm(NULL, V(), 1, 16, 128, 0, 1e-6, 1.0), "x is NULL")
    gates = lib.pf_gdn_gates
    _err(gates(NULL, NULL), "args is NULL")
    _err(gates(NULL, c_args("pf_gdn_gates_args", rows=1)), "n_v_heads=0")
    _err(gates(NULL, c_args("pf_gdn_gates_args", rows=1, n_v_heads=16, b={"ld": 8})), "b row stride ld=8")
    _err(gates(NULL, c_args("pf_gdn_gates_args", rows=1, n_v_heads=16)), "b is NULL")
    norm = lib.pf_gdn_gated_rms_norm
    defaults = c_args("pf_gdn_gated_rms_norm_args")
    assert defaults.eps == pytest.approx(1e-6) and defaults.rows == 0 and defaults.dv == 0
    _err(norm(NULL, c_args("pf_gdn_gated_rms_norm_args", rows=1, n_v_heads=16)), "dv=0")
    _err(norm(NULL, c_args("pf_gdn_gated_rms_norm_args", rows=1, n_v_heads=16, dv=128, eps=-1.0)), "eps")
    _err(norm(NULL, c_args("pf_gdn_gated_rms_norm_args", rows=1, n_v_heads=16, dv=128,
                          z={"ld": 100})), "z row stride")
    _err(norm(NULL, c_args("pf_gdn_gated_rms_norm_args", rows=1, n_v_heads=16, dv=128)), "o is NULL")


def test_c_api_scan_checks():
    def scan(rows=1, hk=16, hv=32, dk=128, dv=128, ldq=0, ld_beta=0, path=0, state_ld=0):
        return lib.pf_gdn_scan(NULL, c_args("pf_gdn_scan_args", rows=rows, n_k_heads=hk,
                                           n_v_heads=hv, dk=dk, dv=dv, path=path, q={"ld": ldq},
                                           beta={"ld": ld_beta}, state={"ld": state_ld}))
    a = c_args("pf_gdn_scan_args")
    assert (a.struct_size, a.path, a.rows, a.n_k_heads, a.n_v_heads, a.dk, a.dv) == \
        (ffi.sizeof("pf_gdn_scan_args"), lib.PF_GDN_SCAN_AUTO, 0, 0, 0, 0, 0)
    assert all((getattr(a, f).buf, getattr(a, f).off, getattr(a, f).ld) == (NULL, 0, 0)
               for f in ("q", "k", "v", "beta", "g", "state", "o", "workspace"))
    _err(scan(rows=-1), "rows=-1")
    _err(scan(hv=24), "n_v_heads=24 must be a multiple of n_k_heads=16")
    _err(scan(hk=0), "n_k_heads=0")
    _err(scan(dk=96), "dk=96")
    _err(scan(dv=256), "dv=256")
    _err(scan(path=3), "path=3")
    _err(scan(ldq=100), "q row stride ld=100")
    _err(scan(ld_beta=31), "beta row stride ld=31")
    _err(scan(state_ld=5), "q is NULL")          # the state is a vector: its ld is ignored
    _err(scan(), "q is NULL")
    _err(scan(path=lib.PF_GDN_SCAN_SEQUENTIAL), "q is NULL")
    _err(scan(path=lib.PF_GDN_SCAN_CHUNKED), "q is NULL")
    with pytest.raises(errors.UnsupportedError, match="built for dk = dv = 128, got dk=64"):
        _check(scan(path=lib.PF_GDN_SCAN_CHUNKED, dk=64, dv=64))
    bad = c_args("pf_gdn_scan_args")
    bad.struct_size = 16
    with pytest.raises(errors.AbiMismatchError, match="pf_gdn_scan_args_init"):
        _check(lib.pf_gdn_scan(NULL, bad))
    _err(lib.pf_gdn_scan(NULL, NULL), "args is NULL")
    with pytest.raises(errors.AbiMismatchError, match="struct_size"):
        _check(lib.pf_gdn_scan_args_init(a, ffi.sizeof("pf_gdn_scan_args") + 8))


def test_python_wrappers_check_shapes():
    s = np.zeros((4, 16, 16), np.float32)
    q = np.zeros((3, 32), np.float32)
    with pytest.raises(errors.InvalidArgumentError, match="v: expected 64 columns"):
        G.gdn_scan_np(None, q, q, np.zeros((3, 32), np.float32), np.zeros((3, 4), np.float32),
                      np.zeros((3, 4), np.float32), s)
    with pytest.raises(errors.InvalidArgumentError, match="beta: 2 rows"):
        G.gdn_scan_np(None, q, q, np.zeros((3, 64), np.float32), np.zeros((2, 4), np.float32),
                      np.zeros((3, 4), np.float32), s)
    with pytest.raises(errors.InvalidArgumentError, match="state: expected a 3-D array"):
        G.gdn_scan_np(None, q, q, q, q, q, np.zeros((4, 16), np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="path: unknown name 'wy'"):
        G.gdn_scan_np(None, q, q, np.zeros((3, 64), np.float32), np.zeros((3, 4), np.float32),
                      np.zeros((3, 4), np.float32), s, path="wy")
    with pytest.raises(errors.InvalidArgumentError, match="window: expected shape"):
        G.gdn_conv1d_np(None, np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32),
                        np.zeros((8, 4), np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="kc in"):
        G.gdn_conv1d_np(None, np.zeros((2, 8), np.float32), np.zeros((0, 8), np.float32),
                        np.zeros((8, 1), np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="ctx: expected a pyprefill Context"):
        G.gdn_gates_np(None, np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32),
                       np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert G.SCAN_PATHS == {"auto": 0, "sequential": 1, "chunked": 2}
    assert G.scan_path_id("Sequential") == lib.PF_GDN_SCAN_SEQUENTIAL and G.scan_path_id(2) == 2


def test_c_api_scan_varlen_checks():
    """pf_gdn_scan_varlen's argument checks, in the header's order (the struct, the scalars, the
    host arrays naming the sequence, then the views), before any device work (CPU)."""
    cu3 = ffi.new("int64_t[]", [0, 5, 9, 70])

    def varlen(cu=cu3, n=3, n_states=3, hk=2, hv=4, dk=128, dv=128, path=0, idx=None, ldq=0):
        a = c_args("pf_gdn_scan_varlen_args", n_seqs=n, n_states=n_states, n_k_heads=hk,
                   n_v_heads=hv, dk=dk, dv=dv, path=path, q={"ld": ldq})
        a.cu_seqlens = cu if cu is not None else NULL
        if idx is not None:
            keep = ffi.new("int32_t[]", idx)
            a.state_indices = keep
        return lib.pf_gdn_scan_varlen(NULL, a)

    a = c_args("pf_gdn_scan_varlen_args")
    assert (a.struct_size, a.path, a.n_seqs, a.n_states, a.n_k_heads, a.n_v_heads, a.dk, a.dv) == \
        (ffi.sizeof("pf_gdn_scan_varlen_args"), lib.PF_GDN_SCAN_AUTO, 0, 0, 0, 0, 0, 0)
    assert a.cu_seqlens == NULL and a.state_indices == NULL
    assert all((getattr(a, f).buf, getattr(a, f).off, getattr(a, f).ld) == (NULL, 0, 0)
               for f in ("q", "k", "v", "beta", "g", "state", "o", "workspace"))
    _err(lib.pf_gdn_scan_varlen(NULL, NULL), "args is NULL")
    bad = c_args("pf_gdn_scan_varlen_args")
    bad.struct_size = 16
    with pytest.raises(errors.AbiMismatchError, match="pf_gdn_scan_varlen_args_init"):
        _check(lib.pf_gdn_scan_varlen(NULL, bad))
    with pytest.raises(errors.AbiMismatchError, match="struct_size"):
        _check(lib.pf_gdn_scan_varlen_args_init(a, ffi.sizeof("pf_gdn_scan_varlen_args") - 8))
    _err(varlen(n=-1), "n_seqs=-1")
    _err(varlen(n_states=-2), "n_states=-2")
    _err(varlen(hv=6, hk=4), "n_v_heads=6 must be a multiple of n_k_heads=4")
    _err(varlen(dk=96), "dk=96")
    _err(varlen(path=3), "path=3")
    with pytest.raises(errors.UnsupportedError, match="built for dk = dv = 128, got dk=64"):
        _check(varlen(path=lib.PF_GDN_SCAN_CHUNKED, dk=64, dv=64))
    _err(varlen(cu=None), r"cu_seqlens is NULL \(n_seqs \+ 1 = 4 offsets\)")
    _err(varlen(cu=ffi.new("int64_t[]", [1, 5, 9, 70])), r"cu_seqlens\[0\] = 1 must be 0")
    _err(varlen(cu=ffi.new("int64_t[]", [0, 5, 5, 70])),
         r"sequence 1 has cu_seqlens\[2\] = 5 <= cu_seqlens\[1\] = 5")
    _err(varlen(cu=ffi.new("int64_t[]", [0, 5, 9, 2])), r"sequence 2 has cu_seqlens\[3\] = 2")
    _err(varlen(cu=ffi.new("int64_t[]", [0, 5, 9, 1 << 31])), r"cu_seqlens\[3\] = 2147483648")
    _err(varlen(n_states=2), r"n_states=2 < n_seqs=3 \(state_indices NULL")
    _err(varlen(n_states=5, idx=[0, 5, 1]), r"state_indices\[1\] = 5 is outside \[0, n_states=5\)")
    _err(varlen(n_states=5, idx=[4, -1, 1]), r"state_indices\[1\] = -1 is outside")
    _err(varlen(n_states=5, idx=[4, 2, 4]), r"state_indices\[2\] = 4 repeats state_indices\[0\]")
    _err(varlen(ldq=200), "q row stride ld=200")
    _err(varlen(), "q is NULL")
    _err(varlen(n_states=5, idx=[4, 2, 0], path=lib.PF_GDN_SCAN_SEQUENTIAL), "q is NULL")
    _err(varlen(cu=ffi.new("int64_t[]", [0]), n=0, n_states=0), "q is NULL")  # no-op only after the checks


def test_scan_varlen_plan():
    """The path AUTO picks and the workspace: the tables (4 n + 1 int64 per round, 256-aligned)
    and the chunked path's scratch of its largest round, rounds of at most 128 chunks (CPU)."""
    plan = G.gdn_scan_varlen_plan
    one = G.gdn_scan_plan(64, 16, 32, 128, 128)["workspace_bytes"]     # one chunk
    full = G.gdn_scan_plan(8192, 16, 32, 128, 128)["workspace_bytes"]  # 128 chunks
    assert plan([0, 64], 16, 32, 128, 128) == {"path": "chunked", "workspace_bytes": 256 + one}
    assert plan([0, 1, 65], 16, 32, 128, 128)["path"] == "chunked"    # every sequence on it
    assert plan([0, 1, 64], 16, 32, 128, 128)["path"] == "sequential"  # the longest has 63 rows
    assert plan(list(range(65)), 16, 32, 128, 128) == \
        {"path": "sequential", "workspace_bytes": (4 * 64 + 1) * 8 // 256 * 256 + 256}
    assert plan([0, 100], 2, 4, 64, 64)["path"] == "sequential"
    assert plan([0, 5], 2, 4, 128, 128, path="chunked")["path"] == "chunked"
    assert plan([0], 2, 4, 128, 128) == {"path": "sequential", "workspace_bytes": 0}
    # 4 x 8192: four rounds of 4 x 32 chunks; the tables 4 x (4 x 4 + 1) values = 544 bytes
    assert plan([0, 8192, 16384, 24576, 32768], 16, 32, 128, 128)["workspace_bytes"] == 768 + full
    # 8 x 129 rows: one round of 24 chunks
    w24 = plan([0] + [129 * (i + 1) for i in range(8)], 16, 32, 128, 128)["workspace_bytes"]
    assert one < w24 < full
    with pytest.raises(errors.UnsupportedError, match="dk = dv = 128"):
        plan([0, 64], 2, 4, 64, 64, path="chunked")
    with pytest.raises(errors.InvalidArgumentError, match="repeats"):
        plan([0, 1, 2], 2, 4, 128, 128, state_indices=[1, 1], n_states=2)


def test_python_varlen_wrappers_check_shapes():
    s = np.zeros((2, 4, 16, 16), np.float32)
    q = np.zeros((3, 32), np.float32)
    v, hv = np.zeros((3, 64), np.float32), np.zeros((3, 4), np.float32)
    with pytest.raises(errors.InvalidArgumentError, match="states: expected a 4-D array"):
        G.gdn_scan_varlen_np(None, q, q, v, hv, hv, s[0], [0, 3])
    with pytest.raises(errors.InvalidArgumentError, match="cu_seqlens: expected n_seqs \\+ 1 offsets"):
        G.gdn_scan_varlen_np(None, q, q, v, hv, hv, s, [0, 2])
    with pytest.raises(errors.InvalidArgumentError, match="v: expected 64 columns"):
        G.gdn_scan_varlen_np(None, q, q, q, hv, hv, s, [0, 3])
    with pytest.raises(errors.InvalidArgumentError, match="cu_seqlens: expected a 1-D array"):
        G.gdn_scan_varlen_plan(np.zeros((2, 2)), 1, 1, 16, 16)
    with pytest.raises(errors.InvalidArgumentError, match="state_indices: expected 2 ints"):
        G.gdn_scan_varlen_plan([0, 1, 2], 1, 1, 16, 16, state_indices=[0])
    with pytest.raises(errors.InvalidArgumentError, match="ctx: expected a pyprefill Context"):
        G.gdn_scan_varlen_np(None, q, q, v, hv, hv, s, [0, 1, 3])
