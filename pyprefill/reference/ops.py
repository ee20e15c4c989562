"""The ops of spec.md §0-§3 as plain NumPy functions: the oracle the CUDA kernels are judged by.

Every function computes in the dtype of its (floating) inputs' `dtype` argument: float64 for the
exact oracle, float32 to mimic an fp32 engine. Nothing here knows about files or models; shapes
are given in each docstring with T = tokens of the chunk, d = model width.

Conventions (spec.md §0): a projection is `x @ W.T` with W in NumPy (out, in) order; positions of a
chunk are `pos0 + t`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

DType = type[np.floating] | np.dtype
# A projection hook: project(role, x, w) -> x @ w.T computed some other way (e.g. with the inputs
# rounded as an 8-bit leg would round them, reference/quant_sim.py). `role` is the GGUF tensor's
# short name ("attn_q", "ffn_down", "ssm_beta", ...); x is (T, in) and w (out, in) in the
# function's dtype. None (the default everywhere) means the plain product.
Projector = Callable[[str, np.ndarray, np.ndarray], np.ndarray]
# The model-level form: project(layer_index, role, x, w).
LayerProjector = Callable[[int, str, np.ndarray, np.ndarray], np.ndarray]


def _f(x: np.ndarray, dtype: DType) -> np.ndarray:
    """`x` as an array of `dtype` (no copy when it already is one)."""
    return np.asarray(x, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# §0 building blocks
# ---------------------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, dtype: DType = np.float64) -> np.ndarray:
    """RMSNorm over the last axis (spec.md §0): `x / sqrt(mean(x²) + eps) * w`.

    x: (..., n); w: (n,) plain multiplicative weight (GGUF norms already hold `1 + w_HF`).
    """
    x = _f(x, dtype)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + _f(eps, dtype)) * _f(w, dtype)


def project(x: np.ndarray, w: np.ndarray, dtype: DType = np.float64) -> np.ndarray:
    """A projection (spec.md §0): `x @ W.T`, W in NumPy (out, in) order; (..., in) -> (..., out)."""
    return _f(x, dtype) @ _f(w, dtype).T


def _proj(hook: Projector | None, role: str, x: np.ndarray, w: np.ndarray,
          dtype: DType) -> np.ndarray:
    """`x @ w.T` (x already of `dtype`), or the hook's version of it for projection `role`."""
    if hook is None:
        return x @ _f(w, dtype).T
    return hook(role, x, _f(w, dtype))


def _head_columns(n_heads: int, head_dim: int, head_stride: int, col0: int) -> np.ndarray:
    """Column indices (n_heads, head_dim) of the heads inside a row: head h at
    col0 + h*head_stride (head_stride 0 = head_dim)."""
    stride = head_stride or head_dim
    if stride < head_dim or col0 < 0:
        raise ValueError(f"head_stride={head_stride} < head_dim={head_dim} or col0={col0} < 0")
    return col0 + stride * np.arange(n_heads)[:, None] + np.arange(head_dim)[None, :]


def heads(x: np.ndarray, n_heads: int, head_dim: int, head_stride: int = 0, col0: int = 0,
          dtype: DType = np.float64) -> np.ndarray:
    """The heads inside activation rows, as the kernels address them: x (T, ld) -> (T, n_heads,
    head_dim), head h = columns [col0 + h*head_stride, + head_dim) (head_stride 0 = head_dim).
    qwen35's q-projection rows hold per-head [q | gate]: q heads at head_stride 2·D from column
    0, gate heads at 2·D from column D (§7.3)."""
    return _f(x, dtype)[:, _head_columns(n_heads, head_dim, head_stride, col0)]


def put_heads(x: np.ndarray, h: np.ndarray, head_stride: int = 0, col0: int = 0,
              dtype: DType = np.float64) -> np.ndarray:
    """A copy of x (T, ld) as `dtype` with the heads of `heads(x, H, D, head_stride, col0)`
    replaced by h (T, H, D); every other column unchanged."""
    out = _f(x, dtype).copy()
    _, n_heads, head_dim = h.shape
    out[:, _head_columns(n_heads, head_dim, head_stride, col0)] = h
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), elementwise."""
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), written to avoid overflow warnings for large |x|."""
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def softplus(x: np.ndarray, threshold: float = 20.0) -> np.ndarray:
    """log(1 + exp(x)), and x itself where x > threshold (PyTorch and ggml, spec.md §0)."""
    out = np.log1p(np.exp(np.minimum(x, threshold)))
    return np.where(x > threshold, x, out)


def l2_norm(x: np.ndarray, eps: float = 1e-6, dtype: DType = np.float64) -> np.ndarray:
    """Per-vector L2 normalisation over the last axis, HF's formula `x * rsqrt(Σx² + eps)`.

    llama.cpp uses `x / max(‖x‖₂, eps)` instead (spec.md §0); the two differ by ≈ eps/(2‖x‖²)
    relative for every vector (~1e-7 on tiny models). The oracle follows HF so that a float64 run
    can match HF to ~1e-12; an engine following llama.cpp is within fp32 noise of it.
    x: (..., n).
    """
    x = _f(x, dtype)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + _f(eps, dtype))


def rope_neox_partial(x: np.ndarray, pos0: int, rot_dim: int, base: float,
                      dtype: DType = np.float64) -> np.ndarray:
    """NEOX RoPE with partial rotation (spec.md §0.1 B1) on x: (T, heads, D) at positions pos0 + t.

    For i < R/2: φ_i = p · base^(−2i/R); pairs are half-split (i, i + R/2); dims [R, D) unchanged.
    """
    x = _f(x, dtype)
    T, _, D = x.shape
    R = rot_dim
    if R % 2 or R > D:
        raise ValueError(f"rotated width R={R} must be even and <= head dim {D}")
    half = R // 2
    pos = np.arange(pos0, pos0 + T, dtype=dtype)
    inv_freq = _f(base, dtype) ** (-(np.arange(half, dtype=dtype) * 2) / _f(R, dtype))
    phi = pos[:, None] * inv_freq[None, :]                     # (T, R/2)
    cos, sin = np.cos(phi)[:, None, :], np.sin(phi)[:, None, :]  # (T, 1, R/2)
    a, b = x[..., :half], x[..., half:R]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:R] = a * sin + b * cos
    return out


def attention_gqa(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
                  scale: float, dtype: DType = np.float64) -> np.ndarray:
    """Causal grouped-query attention over a KV cache (spec.md §0.1 B2).

    q: (T, H, D) queries at positions pos0 + t; k_cache, v_cache: (P, Hkv, D) with P >= pos0 + T,
    rows [0, pos0 + T) valid. Query head h reads kv head h // (H / Hkv) (consecutive grouping);
    token t attends to cache rows [0, pos0 + t]. Returns o: (T, H, D).
    """
    q = _f(q, dtype)
    T, H, D = q.shape
    Hkv = k_cache.shape[1]
    if H % Hkv:
        raise ValueError(f"H={H} is not a multiple of Hkv={Hkv}")
    G = H // Hkv
    P = pos0 + T
    k = _f(k_cache[:P], dtype)
    v = _f(v_cache[:P], dtype)
    kv_of_head = np.arange(H) // G                               # grouped, not tiled (§7.2)
    kh = k[:, kv_of_head, :]                                     # (P, H, D)
    vh = v[:, kv_of_head, :]
    s = np.einsum("thd,phd->htp", q, kh) * _f(scale, dtype)      # (H, T, P)
    allowed = np.arange(P)[None, :] <= (pos0 + np.arange(T))[:, None]   # (T, P)
    s = np.where(allowed[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    a = np.exp(s)
    a = a / a.sum(axis=-1, keepdims=True)
    return np.einsum("htp,phd->thd", a, vh)


def swiglu(h: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
           dtype: DType = np.float64, *, project: Projector | None = None) -> np.ndarray:
    """SwiGLU FFN (spec.md §0.1 B3): (silu(h Wg^T) ⊙ (h Wu^T)) Wd^T.

    h: (T, d); w_gate, w_up: (n_ff, d); w_down: (d, n_ff). Returns (T, d). project: optional
    hook for the three products (roles ffn_gate, ffn_up, ffn_down).
    """
    h = _f(h, dtype)
    g = _proj(project, "ffn_gate", h, w_gate, dtype)
    u = _proj(project, "ffn_up", h, w_up, dtype)
    return _proj(project, "ffn_down", silu(g) * u, w_down, dtype)


def lm_head(x: np.ndarray, norm_w: np.ndarray, w_out: np.ndarray, eps: float,
            dtype: DType = np.float64) -> np.ndarray:
    """Final RMSNorm and output projection (spec.md §1.3 / §3): x (T, d), w_out (V, d) -> (T, V)."""
    return rms_norm(x, norm_w, eps, dtype) @ _f(w_out, dtype).T


# ---------------------------------------------------------------------------------------------
# Attention mixers (§1.3 qwen3, §3.1 qwen35 gated)
# ---------------------------------------------------------------------------------------------

def append_kv(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray,
              pos0: int) -> tuple[np.ndarray, np.ndarray]:
    """Caches holding rows [0, pos0) (shape (pos0, Hkv, D)) extended by k, v: (T, Hkv, D)."""
    if k_cache.shape[0] != pos0:
        raise ValueError(f"KV cache holds {k_cache.shape[0]} rows, expected pos0={pos0}")
    return (np.concatenate([k_cache, k.astype(k_cache.dtype)], axis=0),
            np.concatenate([v_cache, v.astype(v_cache.dtype)], axis=0))


def attention_mixer(h: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray,
                    wo: np.ndarray, q_norm: np.ndarray, k_norm: np.ndarray,
                    k_cache: np.ndarray, v_cache: np.ndarray, pos0: int, *, n_head: int,
                    n_head_kv: int, head_dim: int, rope_dim: int, rope_base: float, eps: float,
                    gated: bool, dtype: DType = np.float64, project: Projector | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full-attention mixer: qwen3 §1.3 steps 2-7 (gated=False) or qwen35 §3.1 A1-A9 (gated=True).

    h: (T, d) normed input; wq: (H·D, d), or (2·H·D, d) with per-head [q | gate] rows when gated
    (§7.3: head h owns rows [2hD, 2hD+D) = query, [2hD+D, 2hD+2D) = gate); wk, wv: (Hkv·D, d);
    wo: (d, H·D); q_norm, k_norm: (D,). k_cache, v_cache: (pos0, Hkv, D).
    Returns (out (T, d), new k_cache, new v_cache) with the caches grown to pos0 + T rows.
    project: optional hook for the four products (roles attn_q, attn_k, attn_v, attn_output).
    """
    h = _f(h, dtype)
    T = h.shape[0]
    H, Hkv, D = n_head, n_head_kv, head_dim
    qg = _proj(project, "attn_q", h, wq, dtype)
    if gated:
        qg = qg.reshape(T, H, 2 * D)                                     # A1
        q, gate = qg[:, :, :D], qg[:, :, D:].reshape(T, H * D)           # A2
    else:
        q, gate = qg.reshape(T, H, D), None
    k = _proj(project, "attn_k", h, wk, dtype).reshape(T, Hkv, D)       # A3
    v = _proj(project, "attn_v", h, wv, dtype).reshape(T, Hkv, D)
    q = rms_norm(q, q_norm, eps, dtype)                                  # A4 (per head over D)
    k = rms_norm(k, k_norm, eps, dtype)
    q = rope_neox_partial(q, pos0, rope_dim, rope_base, dtype)           # A5
    k = rope_neox_partial(k, pos0, rope_dim, rope_base, dtype)
    k_cache, v_cache = append_kv(k_cache, v_cache, k, v, pos0)           # A6
    o = attention_gqa(q, k_cache, v_cache, pos0, 1.0 / np.sqrt(D), dtype).reshape(T, H * D)  # A7
    if gate is not None:
        o = o * sigmoid(gate)                                            # A8: sigmoid gate
    return _proj(project, "attn_output", o, wo, dtype), k_cache, v_cache  # A9


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet (§3.2)
# ---------------------------------------------------------------------------------------------

def gdn_gates(b_logits: np.ndarray, a_logits: np.ndarray, ssm_a: np.ndarray,
              dt_bias: np.ndarray, dtype: DType = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """G2: β = sigmoid(bl), g = ssm_a ⊙ softplus(al + dt_bias) (log-decay, g ≤ 0).

    b_logits, a_logits: (T, Hv); ssm_a = −exp(A_log): (Hv,); dt_bias: (Hv,). Returns (β, g).
    """
    beta = sigmoid(_f(b_logits, dtype))
    g = _f(ssm_a, dtype) * softplus(_f(a_logits, dtype) + _f(dt_bias, dtype))
    return beta, g


def causal_conv1d_silu(m: np.ndarray, window: np.ndarray, w: np.ndarray,
                       dtype: DType = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """G3: causal depthwise conv (no bias) + SiLU, carrying a window of Kc−1 pre-conv rows.

    m: (T, C) new pre-conv rows; window: (Kc−1, C), oldest first (zeros at sequence start);
    w: (C, Kc), tap Kc−1 multiplies the current token. X = [window; m],
    c[t] = Σ_i X[t+i] ⊙ w[:, i]. Returns (silu(c) (T, C), new window = X[T:T+Kc−1]) — valid for
    any T ≥ 0 including T < Kc−1 (then part of the old window survives, §7.6).
    """
    m = _f(m, dtype)
    w = _f(w, dtype)
    T = m.shape[0]
    Kc = w.shape[1]
    if window.shape != (Kc - 1, m.shape[1]):
        raise ValueError(f"conv window shape {window.shape}, expected {(Kc - 1, m.shape[1])}")
    X = np.concatenate([_f(window, dtype), m], axis=0)                   # (Kc−1+T, C)
    c = np.zeros_like(m)
    for i in range(Kc):
        c += X[i:i + T] * w[:, i]
    return silu(c), X[T:T + Kc - 1].copy()


def delta_rule_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                         beta: np.ndarray, state: np.ndarray, dtype: DType = np.float64
                         ) -> tuple[np.ndarray, np.ndarray]:
    """G7, the gated delta rule token by token (the definition).

    q, k: (T, Hk, dk) already L2-normalised (q also scaled by 1/sqrt(dk), G5); v: (T, Hv, dv);
    g, beta: (T, Hv); state S: (Hv, dk, dv) with S[j][a][b], a = key index, b = value index.
    Value head j pairs with key head j % Hk (tiled, qwen35 GGUF, G6 / §7.1).
    Per step: S ← exp(g)·S; e = (v − Sᵀk)·β; S ← S + k ⊗ e; o = Sᵀq.
    Returns (o (T, Hv, dv), final state (Hv, dk, dv)).
    """
    q, k, v = _f(q, dtype), _f(k, dtype), _f(v, dtype)
    g, beta = _f(g, dtype), _f(beta, dtype)
    T, Hk, _ = q.shape
    Hv = v.shape[1]
    if Hv % Hk:
        raise ValueError(f"Hv={Hv} is not a multiple of Hk={Hk}")
    pair = np.arange(Hv) % Hk                                            # tiled pairing
    S = _f(state, dtype).copy()
    o = np.empty_like(v)
    for t in range(T):
        qt, kt = q[t, pair], k[t, pair]                                  # (Hv, dk)
        S *= np.exp(g[t])[:, None, None]
        e = (v[t] - np.einsum("jab,ja->jb", S, kt)) * beta[t][:, None]   # (Hv, dv)
        S += kt[:, :, None] * e[:, None, :]
        o[t] = np.einsum("jab,ja->jb", S, qt)
    return o, S


def delta_rule_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                       beta: np.ndarray, state: np.ndarray, chunk: int = 64,
                       dtype: DType = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """G7 in the chunked (WY/UT) form of spec.md §3.2.1; same arguments and results as
    `delta_rule_recurrent`, equal to it up to rounding.

    T is padded to a multiple of `chunk` with q = k = v = 0, β = 0, g = 0 (padded rows change
    nothing). Per chunk and value head j (K, Q = rows of key head j % Hk):
      γ = cumsum(g); Γ_ij = exp(γ_i − γ_j) for i ≥ j else 0 (masked BEFORE exp);
      A = strictly-lower(β_i k_i·k_j Γ_ij); Tm = (I + A)^{-1} (forward substitution);
      U = Tm(β⊙V); W = Tm(β⊙e^γ⊙K); V' = U − W S;
      O = (e^γ⊙Q) S + ((Q Kᵀ)⊙Γ) V'; S ← e^{γ_last} S + (e^{γ_last−γ}⊙K)ᵀ V'.
    """
    q, k, v = _f(q, dtype), _f(k, dtype), _f(v, dtype)
    g, beta = _f(g, dtype), _f(beta, dtype)
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    if Hv % Hk:
        raise ValueError(f"Hv={Hv} is not a multiple of Hk={Hk}")
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    pair = np.arange(Hv) % Hk
    C = chunk
    n_chunks = -(-T // C)
    Tp = n_chunks * C
    pad = Tp - T
    # head-major, padded: (Hv, Tp, ·)
    Qh = np.pad(q[:, pair].transpose(1, 0, 2), ((0, 0), (0, pad), (0, 0)))
    Kh = np.pad(k[:, pair].transpose(1, 0, 2), ((0, 0), (0, pad), (0, 0)))
    Vh = np.pad(v.transpose(1, 0, 2), ((0, 0), (0, pad), (0, 0)))
    Gh = np.pad(g.T, ((0, 0), (0, pad)))
    Bh = np.pad(beta.T, ((0, 0), (0, pad)))
    S = _f(state, dtype).copy()                                          # (Hv, dk, dv)
    O = np.empty((Hv, Tp, dv), dtype=dtype)
    lower_incl = np.tril(np.ones((C, C), dtype=bool))
    strict = np.tril(np.ones((C, C), dtype=bool), k=-1)
    for c0 in range(0, Tp, C):
        sl = slice(c0, c0 + C)
        Qc, Kc_, Vc, gc, bc = Qh[:, sl], Kh[:, sl], Vh[:, sl], Gh[:, sl], Bh[:, sl]
        gam = np.cumsum(gc, axis=-1)                                     # (Hv, C)
        diff = gam[:, :, None] - gam[:, None, :]                         # γ_i − γ_j
        Gam = np.where(lower_incl, np.exp(np.where(lower_incl, diff, 0.0)), 0.0)  # mask, then exp
        KK = np.einsum("hia,hja->hij", Kc_, Kc_)
        A = np.where(strict, bc[:, :, None] * KK * Gam, 0.0)             # (Hv, C, C)
        rhs_u = bc[:, :, None] * Vc                                      # β ⊙ V
        rhs_w = (bc * np.exp(gam))[:, :, None] * Kc_                     # β ⊙ e^γ ⊙ K
        U = np.empty_like(rhs_u)
        W = np.empty_like(rhs_w)
        for i in range(C):                                               # (I + A) X = rhs
            U[:, i] = rhs_u[:, i] - np.einsum("hj,hjb->hb", A[:, i, :i], U[:, :i])
            W[:, i] = rhs_w[:, i] - np.einsum("hj,hjb->hb", A[:, i, :i], W[:, :i])
        Vp = U - np.einsum("hia,hab->hib", W, S)                         # V' = U − W S
        QK = np.einsum("hia,hja->hij", Qc, Kc_) * Gam
        O[:, sl] = (np.einsum("hia,hab->hib", np.exp(gam)[:, :, None] * Qc, S)
                    + np.einsum("hij,hjb->hib", QK, Vp))
        last = gam[:, -1]                                                # (Hv,)
        decay_k = np.exp(last[:, None] - gam)[:, :, None] * Kc_          # (Hv, C, dk)
        S = np.exp(last)[:, None, None] * S + np.einsum("hia,hib->hab", decay_k, Vp)
    return O[:, :T].transpose(1, 0, 2).copy(), S


def delta_rule_chunk_transfer(k: np.ndarray, g: np.ndarray, beta: np.ndarray, chunk: int = 64,
                              dtype: DType = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """The state step of one chunk as an affine map (the form a kernel with one GEMM on its
    sequential chain would use): for each value head j and chunk,
        S_next = e^{γ_last} S + E V − D S,
    E = K̃ᵀ Tm diag(β) (dk x C), D = E diag(e^γ) K (dk x dk), K̃ = e^{γ_last − γ} ⊙ K, Tm =
    (I + A)^{-1} as in `delta_rule_chunked` (exact algebra: V' = Tm β (V − e^γ K S)).

    k: (T, Hk, dk) with T a multiple of `chunk`; g, beta: (T, Hv). Returns (E (n, Hv, dk, C),
    D (n, Hv, dk, dk)) for the n = T / chunk chunks; nothing here depends on V or S, so all of
    it can be computed in parallel before the state pass.
    """
    k, g, beta = _f(k, dtype), _f(g, dtype), _f(beta, dtype)
    T, Hk, dk = k.shape
    Hv = g.shape[1]
    if T % chunk:
        raise ValueError(f"T={T} is not a multiple of chunk={chunk}")
    pair = np.arange(Hv) % Hk
    C, n = chunk, T // chunk
    strict = np.tril(np.ones((C, C), dtype=bool), k=-1)
    lower_incl = np.tril(np.ones((C, C), dtype=bool))
    E = np.empty((n, Hv, dk, C), dtype=dtype)
    D = np.empty((n, Hv, dk, dk), dtype=dtype)
    for c in range(n):
        sl = slice(c * C, (c + 1) * C)
        Kc = k[sl][:, pair].transpose(1, 0, 2)                           # (Hv, C, dk)
        gam = np.cumsum(g[sl].T, axis=-1)                                # (Hv, C)
        bc = beta[sl].T
        diff = gam[:, :, None] - gam[:, None, :]
        Gam = np.where(lower_incl, np.exp(np.where(lower_incl, diff, 0.0)), 0.0)
        A = np.where(strict, bc[:, :, None] * np.einsum("hia,hja->hij", Kc, Kc) * Gam, 0.0)
        Tm = np.linalg.inv(np.eye(C, dtype=dtype)[None] + A)             # unit lower triangular
        Kt = np.exp(gam[:, -1:] - gam)[:, :, None] * Kc                  # K̃
        E[c] = np.einsum("hia,hij->haj", Kt, Tm) * bc[:, None, :]
        D[c] = np.einsum("haj,hjb->hab", E[c], np.exp(gam)[:, :, None] * Kc)
    return E, D


def delta_rule_segments(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                        beta: np.ndarray, state: np.ndarray, segments: int, chunk: int = 64,
                        dtype: DType = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """G7 by context parallelism (the composition a split of one long sequence over the GPU
    uses): the rows split into `segments` pieces on chunk boundaries; for each piece s, in
    parallel, its transfer M_s (the final state of the piece run from S = I with V = 0) and its
    local state L_s (run from S = 0); then sequentially S_{s+1} = M_s S_s + L_s (the delta rule
    is affine in the state it starts from); then each piece's outputs from its true S_s, in
    parallel again. Same arguments and results as `delta_rule_recurrent`, equal up to rounding.
    """
    q, k, v = _f(q, dtype), _f(k, dtype), _f(v, dtype)
    g, beta = _f(g, dtype), _f(beta, dtype)
    T = q.shape[0]
    Hv, dk, dv = state.shape
    n_chunks = -(-T // chunk)
    per = -(-n_chunks // max(1, segments)) * chunk
    bounds = [(a, min(a + per, T)) for a in range(0, T, per)] or [(0, 0)]
    eye = np.broadcast_to(np.eye(dk, dtype=dtype), (Hv, dk, dk)).copy()
    starts = [_f(state, dtype).copy()]
    for a, b in bounds[:-1]:                                             # phase 1 + 2
        sl = slice(a, b)
        _, M = delta_rule_chunked(q[sl], k[sl], np.zeros((b - a, Hv, dk), dtype), g[sl],
                                  beta[sl], eye, chunk, dtype)
        _, L = delta_rule_chunked(q[sl], k[sl], v[sl], g[sl], beta[sl],
                                  np.zeros_like(starts[0]), chunk, dtype)
        starts.append(np.einsum("hac,hcb->hab", M, starts[-1]) + L)
    o = np.empty((T, Hv, dv), dtype=dtype)
    S = starts[-1]
    for (a, b), S0 in zip(bounds, starts):                               # phase 3
        o[a:b], S = delta_rule_chunked(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], S0, chunk,
                                       dtype)
    return o, S


def gated_rms_norm(o: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float,
                   dtype: DType = np.float64) -> np.ndarray:
    """G8: RMSNorm(o; w) ⊙ silu(z), norm over the last axis (dv), w (dv,) shared by all heads
    (ssm_norm: no +1 offset). o, z: (T, Hv, dv)."""
    return rms_norm(o, w, eps, dtype) * silu(_f(z, dtype))


def gdn_mixer(h: np.ndarray, w_qkv: np.ndarray, w_gate: np.ndarray, w_beta: np.ndarray,
              w_alpha: np.ndarray, w_conv: np.ndarray, dt_bias: np.ndarray, ssm_a: np.ndarray,
              w_norm: np.ndarray, w_out: np.ndarray, conv_window: np.ndarray, state: np.ndarray,
              *, n_k_heads: int, n_v_heads: int, head_k_dim: int, head_v_dim: int, eps: float,
              chunked: bool = False, chunk: int = 64, dtype: DType = np.float64,
              project: Projector | None = None, rows16: bool = False
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Gated DeltaNet mixer G1-G9 of spec.md §3.2 on GGUF (tiled V-head order) tensors.

    h: (T, d) normed input; w_qkv: (2·Hk·dk + Hv·dv, d); w_gate: (Hv·dv, d); w_beta, w_alpha:
    (Hv, d); w_conv: (conv_dim, Kc); dt_bias, ssm_a: (Hv,); w_norm: (dv,); w_out: (d, Hv·dv);
    conv_window: (Kc−1, conv_dim); state: (Hv, dk, dv).
    Returns (out (T, d), new conv_window, new state). project: optional hook for the five
    products (roles attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out). rows16: the rows between
    the GDN kernels held in fp16 (q, k, v after the conv and the L2 norms, o after the delta rule,
    each rounded to nearest even; issue 40's 16-bit rows, modelled).
    """
    h = _f(h, dtype)
    T = h.shape[0]
    Hk, Hv, dk, dv = n_k_heads, n_v_heads, head_k_dim, head_v_dim
    key_dim = Hk * dk
    m = _proj(project, "attn_qkv", h, w_qkv, dtype)                      # G1
    z = _proj(project, "attn_gate", h, w_gate, dtype).reshape(T, Hv, dv)
    beta, g = gdn_gates(_proj(project, "ssm_beta", h, w_beta, dtype),
                        _proj(project, "ssm_alpha", h, w_alpha, dtype), ssm_a, dt_bias,
                        dtype)                                           # G2
    u, conv_window = causal_conv1d_silu(m, conv_window, w_conv, dtype)   # G3
    q = u[:, :key_dim].reshape(T, Hk, dk)                                # G4
    k = u[:, key_dim:2 * key_dim].reshape(T, Hk, dk)
    v = u[:, 2 * key_dim:].reshape(T, Hv, dv)
    q = l2_norm(q, 1e-6, dtype) / np.sqrt(_f(dk, dtype))                 # G5 (HF: eps 1e-6)
    k = l2_norm(k, 1e-6, dtype)
    if rows16:
        q, k, v = (_f(a.astype(np.float16), dtype) for a in (q, k, v))
    if chunked:                                                          # G6 + G7
        o, state = delta_rule_chunked(q, k, v, g, beta, state, chunk, dtype)
    else:
        o, state = delta_rule_recurrent(q, k, v, g, beta, state, dtype)
    if rows16:
        o = _f(o.astype(np.float16), dtype)
    y = gated_rms_norm(o, w_norm, z, eps, dtype).reshape(T, Hv * dv)     # G8
    return _proj(project, "ssm_out", y, w_out, dtype), conv_window, state  # G9
