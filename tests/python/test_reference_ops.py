"""The reference ops of spec.md §0-§3 on random inputs: each against an independent, more literal
formulation (loops over heads/tokens, the definition), in float64."""
from __future__ import annotations

import numpy as np
import pytest

from pyprefill.reference import ops


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _delta_inputs(rng, T: int, Hk: int, r: int, dk: int, dv: int):
    Hv = Hk * r
    q = ops.l2_norm(rng.standard_normal((T, Hk, dk))) / np.sqrt(dk)
    k = ops.l2_norm(rng.standard_normal((T, Hk, dk)))
    v = rng.standard_normal((T, Hv, dv))
    beta, g = ops.gdn_gates(rng.standard_normal((T, Hv)), rng.standard_normal((T, Hv)),
                            -np.exp(rng.uniform(-1, 1.5, Hv)), rng.standard_normal(Hv))
    return q, k, v, g, beta


@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("chunk", [64, 16, 5])
def test_chunked_delta_rule_equals_recurrent(r: int, chunk: int) -> None:
    """§3.2.1 vs G7, T not a multiple of the chunk, nonzero initial state, and the state carried
    across a split at a non-chunk boundary."""
    rng = _rng(10 * r + chunk)
    T, Hk, dk, dv = 150, 2, 16, 8
    q, k, v, g, beta = _delta_inputs(rng, T, Hk, r, dk, dv)
    s0 = rng.standard_normal((Hk * r, dk, dv))
    o_ref, s_ref = ops.delta_rule_recurrent(q, k, v, g, beta, s0)
    o1, s1 = ops.delta_rule_chunked(q, k, v, g, beta, s0, chunk)
    o_a, s_a = ops.delta_rule_chunked(q[:99], k[:99], v[:99], g[:99], beta[:99], s0, chunk)
    o_b, s_b = ops.delta_rule_chunked(q[99:], k[99:], v[99:], g[99:], beta[99:], s_a, chunk)
    for o, s in ((o1, s1), (np.concatenate([o_a, o_b]), s_b)):
        assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) <= 1e-10
        assert np.linalg.norm(s - s_ref) / np.linalg.norm(s_ref) <= 1e-10


@pytest.mark.parametrize("segments", [1, 2, 3, 7])
def test_delta_rule_by_segments_equals_recurrent(segments: int) -> None:
    """Context parallelism: per-segment transfers and local states composed, then each
    segment's outputs from its true start state, equal the recurrence (T not a multiple of the
    chunk, a nonzero start state, more segments than chunks for 7)."""
    rng = _rng(40 + segments)
    T, Hk, r, dk, dv = 150, 2, 2, 16, 8
    q, k, v, g, beta = _delta_inputs(rng, T, Hk, r, dk, dv)
    s0 = rng.standard_normal((Hk * r, dk, dv))
    o_ref, s_ref = ops.delta_rule_recurrent(q, k, v, g, beta, s0)
    o, s = ops.delta_rule_segments(q, k, v, g, beta, s0, segments, chunk=16)
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) <= 1e-10
    assert np.linalg.norm(s - s_ref) / np.linalg.norm(s_ref) <= 1e-10


def test_chunk_transfer_form_equals_the_state_pass() -> None:
    """S_next = e^{γ_last} S + E V − D S chunk by chunk (E, D from K, g, β alone) gives the
    recurrence's states: the transfer form's algebra, for a state pass with one GEMM per chunk
    on its chain."""
    rng = _rng(7)
    T, Hk, r, dk, dv, C = 96, 2, 2, 16, 8, 16
    q, k, v, g, beta = _delta_inputs(rng, T, Hk, r, dk, dv)
    s0 = rng.standard_normal((Hk * r, dk, dv))
    E, D = ops.delta_rule_chunk_transfer(k, g, beta, chunk=C)
    S = s0.copy()
    for c in range(T // C):
        sl = slice(c * C, (c + 1) * C)
        _, s_ref = ops.delta_rule_recurrent(q[sl], k[sl], v[sl], g[sl], beta[sl], S)
        Vc = v[sl].transpose(1, 0, 2)                                     # (Hv, C, dv)
        decay = np.exp(g[sl].sum(axis=0))[:, None, None]                  # e^{γ_last}
        S = decay * S + np.einsum("haj,hjb->hab", E[c], Vc) - np.einsum("hac,hcb->hab", D[c], S)
        assert np.linalg.norm(S - s_ref) / np.linalg.norm(s_ref) <= 1e-10, f"chunk {c}"


def test_delta_rule_recurrent_is_the_definition_with_tiled_pairing() -> None:
    """G7 written per head and token with value head j reading key head j % Hk (§7.1)."""
    rng = _rng(1)
    T, Hk, r, dk, dv = 9, 2, 3, 4, 5
    q, k, v, g, beta = _delta_inputs(rng, T, Hk, r, dk, dv)
    s0 = rng.standard_normal((Hk * r, dk, dv))
    o, s = ops.delta_rule_recurrent(q, k, v, g, beta, s0)
    for j in range(Hk * r):
        S = s0[j].copy()
        kk = j % Hk
        for t in range(T):
            S = np.exp(g[t, j]) * S
            e = (v[t, j] - S.T @ k[t, kk]) * beta[t, j]
            S = S + np.outer(k[t, kk], e)
            np.testing.assert_allclose(o[t, j], S.T @ q[t, kk], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s[j], S, rtol=1e-12, atol=1e-12)


def test_chunked_delta_rule_survives_strong_decay() -> None:
    """Large |g| over a 64-token chunk: masking before exp keeps everything finite (§7.14)."""
    rng = _rng(2)
    q, k, v, g, beta = _delta_inputs(rng, 128, 2, 2, 8, 8)
    g = g * 200.0
    o_ref, s_ref = ops.delta_rule_recurrent(q, k, v, g, beta, np.zeros((4, 8, 8)))
    o, s = ops.delta_rule_chunked(q, k, v, g, beta, np.zeros((4, 8, 8)))
    assert np.isfinite(o).all() and np.isfinite(s).all()
    np.testing.assert_allclose(o, o_ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("splits", [[1, 1, 1, 1, 1, 1, 1], [2, 1, 4], [3, 4], [7]])
def test_conv1d_window_carries_across_chunks(splits: list[int]) -> None:
    """G3: chunked (incl. T < Kc−1) equals one shot; window = last Kc−1 pre-conv rows."""
    rng = _rng(3)
    C, Kc = 6, 4
    m = rng.standard_normal((7, C))
    w = rng.standard_normal((C, Kc))
    w0 = rng.standard_normal((Kc - 1, C))
    full, win_full = ops.causal_conv1d_silu(m, w0, w)
    # the definition: X = [w0; m], c[t] = Σ_i X[t+i] w[:, i]
    X = np.concatenate([w0, m])
    c = np.stack([sum(X[t + i] * w[:, i] for i in range(Kc)) for t in range(7)])
    np.testing.assert_allclose(full, c / (1 + np.exp(-c)), rtol=1e-13)
    np.testing.assert_array_equal(win_full, m[-(Kc - 1):])
    outs, win, p = [], w0, 0
    for s in splits:
        o, win = ops.causal_conv1d_silu(m[p:p + s], win, w)
        outs.append(o)
        p += s
    np.testing.assert_allclose(np.concatenate(outs), full, rtol=1e-13)
    np.testing.assert_array_equal(win, win_full)


def test_rope_neox_partial_pairs_and_passthrough() -> None:
    """B1: half-split pairs (i, i+R/2), φ_i = p·base^(−2i/R), dims ≥ R untouched."""
    rng = _rng(4)
    T, H, D, R, base, pos0 = 5, 3, 16, 8, 1e4, 11
    x = rng.standard_normal((T, H, D))
    y = ops.rope_neox_partial(x, pos0, R, base)
    np.testing.assert_array_equal(y[..., R:], x[..., R:])
    for t in range(T):
        for i in range(R // 2):
            phi = (pos0 + t) * base ** (-2 * i / R)
            a, b = x[t, :, i], x[t, :, i + R // 2]
            np.testing.assert_allclose(y[t, :, i], a * np.cos(phi) - b * np.sin(phi), rtol=1e-12)
            np.testing.assert_allclose(y[t, :, i + R // 2], a * np.sin(phi) + b * np.cos(phi),
                                       rtol=1e-12)


def test_attention_gqa_grouped_causal() -> None:
    """B2 against a per-head, per-token loop: head h reads kv head h // G; keys [0, p_t]."""
    rng = _rng(5)
    T, H, Hkv, D, pos0 = 4, 6, 2, 8, 3
    q = rng.standard_normal((T, H, D))
    kc = rng.standard_normal((pos0 + T, Hkv, D))
    vc = rng.standard_normal((pos0 + T, Hkv, D))
    o = ops.attention_gqa(q, kc, vc, pos0, 0.3)
    G = H // Hkv
    for t in range(T):
        for h in range(H):
            kv = h // G
            s = kc[:pos0 + t + 1, kv] @ q[t, h] * 0.3
            a = np.exp(s - s.max())
            a /= a.sum()
            np.testing.assert_allclose(o[t, h], a @ vc[:pos0 + t + 1, kv], rtol=1e-12)


def test_small_ops_formulas() -> None:
    rng = _rng(6)
    x = rng.standard_normal((3, 7))
    w = rng.standard_normal(7)
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6),
                               x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w)
    # HF's l2 norm: x * rsqrt(Σx² + eps) (not llama.cpp's x / max(‖x‖, eps))
    tiny = np.full((1, 4), 1e-4)
    np.testing.assert_allclose(ops.l2_norm(tiny, 1e-6), tiny / np.sqrt(4e-8 + 1e-6))
    # softplus: log1p(exp(x)), identity above 20, no overflow
    z = np.array([-30.0, 0.0, 19.9, 20.5, 800.0])
    sp = ops.softplus(z)
    np.testing.assert_allclose(sp[:3], np.log1p(np.exp(z[:3])))
    np.testing.assert_array_equal(sp[3:], z[3:])
    beta, g = ops.gdn_gates(np.array([[0.0, 2.0]]), np.array([[0.5, -1.0]]),
                            np.array([-2.0, -0.5]), np.array([0.1, 0.2]))
    np.testing.assert_allclose(beta, [[0.5, 1 / (1 + np.exp(-2.0))]])
    np.testing.assert_allclose(g, [[-2.0 * np.log1p(np.exp(0.6)), -0.5 * np.log1p(np.exp(-0.8))]])
    o, zg = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    wn = rng.standard_normal(4)
    np.testing.assert_allclose(ops.gated_rms_norm(o, wn, zg, 1e-6),
                               ops.rms_norm(o, wn, 1e-6) * zg / (1 + np.exp(-zg)))
    s = ops.sigmoid(np.array([-800.0, 0.0, 800.0]))
    np.testing.assert_array_equal(s, [0.0, 0.5, 1.0])


def test_project_is_x_times_w_transposed() -> None:
    """§0: a projection is x @ W.T with W in (out, in) order: y[t, j] = Σ_i x[t, i] W[j, i]."""
    rng = _rng(7)
    x, w = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((4, 5))
    y = ops.project(x, w)
    assert y.dtype == np.float64 and y.shape == (3, 4)
    for t in range(3):
        for j in range(4):
            np.testing.assert_allclose(y[t, j], sum(float(x[t, i]) * w[j, i] for i in range(5)),
                                       rtol=1e-13)
    np.testing.assert_allclose(ops.project(x[0], w), y[0], rtol=1e-13)   # one row
    assert ops.project(x, w, np.float32).dtype == np.float32


def test_heads_address_qwen35_q_gate_rows_as_the_attention_mixer() -> None:
    """heads() reads the kernels' row layout: head h at col0 + h*head_stride. On qwen35's
    [q | gate] q-projection rows (§7.3) it must give the mixer's own split: q heads at stride 2D
    from column 0, gate heads at stride 2D from column D."""
    rng = _rng(8)
    T, H, D = 3, 4, 6
    qg = rng.standard_normal((T, 2 * H * D))
    split = qg.reshape(T, H, 2 * D)                       # as ops.attention_mixer(gated=True)
    np.testing.assert_array_equal(ops.heads(qg, H, D, 2 * D), split[:, :, :D])
    np.testing.assert_array_equal(ops.heads(qg, H, D, 2 * D, D), split[:, :, D:])
    np.testing.assert_array_equal(ops.heads(qg, 2 * H, D), qg.reshape(T, 2 * H, D))  # stride 0 = D
    # the definition, with an offset and a stride that leaves gaps
    x = rng.standard_normal((2, 40)).astype(np.float32)
    h = ops.heads(x, 3, 5, 11, 4)
    assert h.dtype == np.float64 and h.shape == (2, 3, 5)
    for t in range(2):
        for hh in range(3):
            for d in range(5):
                assert h[t, hh, d] == x[t, 4 + 11 * hh + d]
    with pytest.raises(ValueError):
        ops.heads(x, 2, 5, 4)                             # overlapping heads


def test_put_heads_replaces_only_the_heads() -> None:
    rng = _rng(9)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    new = rng.standard_normal((3, 3, 5))
    y = ops.put_heads(x, new, 11, 4)
    assert y.dtype == np.float64 and y.shape == x.shape
    np.testing.assert_array_equal(ops.heads(y, 3, 5, 11, 4), new)
    mask = np.ones(40, bool)
    for hh in range(3):
        mask[4 + 11 * hh:4 + 11 * hh + 5] = False
    np.testing.assert_array_equal(y[:, mask], x[:, mask].astype(np.float64))
    # a per-head op through heads/put_heads equals the mixer's per-head QK-norm on (T, H, D)
    w = rng.standard_normal(5)
    packed = rng.standard_normal((3, 15))
    via = ops.put_heads(packed, ops.rms_norm(ops.heads(packed, 3, 5), w, 1e-6))
    np.testing.assert_allclose(via, ops.rms_norm(packed.reshape(3, 3, 5), w, 1e-6).reshape(3, 15),
                               rtol=1e-13)


def test_v_head_reorder_index_map_and_inverse() -> None:
    """§3.3: GGUF row (jj·Hk + kk)·h + e = HF row (kk·r + jj)·h + e; inverse restores."""
    from pyprefill.formats.hf_export import v_reorder, v_reorder_inverse
    Hk, r, h = 3, 2, 4
    hf = np.arange(Hk * r * h * 5).reshape(Hk * r * h, 5)
    gg = v_reorder(hf, Hk, Hk * r, h)
    for kk in range(Hk):
        for jj in range(r):
            for e in range(h):
                np.testing.assert_array_equal(gg[(jj * Hk + kk) * h + e], hf[(kk * r + jj) * h + e])
    np.testing.assert_array_equal(v_reorder_inverse(gg, Hk, Hk * r, h), hf)
    cols = v_reorder(hf.T, Hk, Hk * r, h, axis=1)
    np.testing.assert_array_equal(cols, gg.T)
    np.testing.assert_array_equal(v_reorder(hf[:Hk * h], Hk, Hk, h), hf[:Hk * h])  # Hv == Hk: identity


def test_attention_interval_from_layer_types() -> None:
    from pyprefill.errors import UnsupportedError
    from pyprefill.formats.hf_export import attention_interval
    L, F = "linear_attention", "full_attention"
    assert attention_interval([L, F, L, F]) == 2
    assert attention_interval([L, L, L, F, L, L, L, F]) == 4
    with pytest.raises(UnsupportedError):
        attention_interval([L, F, F, L])
