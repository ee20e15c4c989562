"""Gated DeltaNet kernels: causal conv1d + SiLU, per-head L2 norm and the gates (GB/s), and the
delta-rule scan on both paths ("sequential", "chunked") against flash-linear-attention's
`chunk_gated_delta_rule` (bf16; eager, and its calls replayed as CUDA graphs: the ratio's peer
where that runs), at qwen35-4b (16 key / 32 value heads) and qwen35-27b (16 / 48) shapes, d = 128. Also the carried-state case: four calls of T/4 tokens on one state against one
call of T (what chunked prefill does), and many sequences in one call (varlen: issue 28's
targets, FLA with cu_seqlens replayed as a CUDA graph). `--no-variants`: the delta rule on its
default path only (no sequential, tuning or carried rows; FLA under graphs alone as the peer),
for an A/B of two builds within one device call."""
from __future__ import annotations

import numpy as np

from ..formats.synth import preset_desc
from ..kernels import gdn as K

SHAPES = ("qwen35-4b", "qwen35-27b")
# (path, row label, context tuning): the chunked path with its default kernels (the state kernel
# `auto` picks), with each state kernel by name (warp: warp-owned; warpgroup: wgmma, sm_90a),
# with nopdl (the state kernel in plain stream order after the prep, not as its programmatic
# dependent), with onepass (no chained sub-passes: the default runs the prep of the next 2048-row
# sub-pass beside the warpgroup state kernel of this one, or of the second 1024-row half of a
# 2048-row call; timed only where the default chains) and subpass1024, side by side
# (pyprefill.tuning, set on the bench's context).
SCAN_VARIANTS = (("sequential", "sequential", {}), ("chunked", "chunked", {}),
                 ("chunked", "chunked warp-state", {"gdn_state": "warp"}),
                 ("chunked", "chunked wg-state", {"gdn_state": "warpgroup"}),
                 ("chunked", "chunked nopdl", {"gdn_pdl": False}),
                 ("chunked", "chunked onepass", {"gdn_subpass_rows": "one-pass"}),
                 ("chunked", "chunked subpass1024", {"gdn_subpass_rows": 1024}))
DEFAULT_VARIANTS = SCAN_VARIANTS[1:2]    # --no-variants: the default path alone
DEFAULT_SUBPASS = 2048    # kGdnSubpassRows (cuda/plan.h)
SHORT_SUBPASS = 1024      # kGdnShortSubpassRows: the default chains a call of 2048 rows as two of these


def default_chains(rows: int) -> bool:
    """Whether the default tuning chains sub-passes in a call of `rows` rows (where the chained
    form runs): sub-passes of DEFAULT_SUBPASS past it, two of SHORT_SUBPASS from 2 x that on."""
    return rows > DEFAULT_SUBPASS or rows >= 2 * SHORT_SUBPASS


# -- the wrapper calls: the only lines that touch pyprefill.kernels.gdn -------------------------
def _conv1d(ctx, m, window, weight, u, rows, conv_dim, kc):
    K.gdn_conv1d(ctx, m, window, weight, u, rows, conv_dim, kc)


def _l2norm(ctx, x, rows, n_heads, head_dim, eps, scale):
    K.gdn_l2norm(ctx, x, rows, n_heads, head_dim, eps, scale)


def _gates(ctx, b, alpha, ssm_a, dt_bias, beta, g, rows, n_v_heads):
    K.gdn_gates(ctx, b, alpha, ssm_a, dt_bias, beta, g, rows, n_v_heads)


def _scan(ctx, q, k, v, beta, g, state, o, rows, hk, hv, dk, dv, path):
    K.gdn_scan(ctx, q, k, v, beta, g, state, o, rows=rows, n_k_heads=hk, n_v_heads=hv, dk=dk,
               dv=dv, path=path)


def _scan_varlen(ctx, q, k, v, beta, g, states, o, cu_seqlens, n_states, hk, hv, dk, dv):
    K.gdn_scan_varlen(ctx, q, k, v, beta, g, states, o, cu_seqlens, n_states=n_states,
                      n_k_heads=hk, n_v_heads=hv, dk=dk, dv=dv)


def View(buf, off=0, ld=0):
    return K.View(buf, off, ld)
# ------------------------------------------------------------------------------------------------


def tag(d) -> str:
    return f"Hk{d.ssm_hk}/Hv{d.ssm_hv}"


def conv1d(b, T: int, d) -> None:
    C, kc = d.conv_dim, d.conv_kernel
    nbytes = 8 * T * C
    n = b.sets(nbytes)
    ms, us = b.slab(T, C, n), b.out_slab(T, C, n)
    window, weight = b.upload(b.rand(kc - 1, C)), b.upload(b.rand(C, kc, scale=0.5))
    t = b.time_ours(lambda i: _conv1d(b.ctx, View(ms.buf, ms.off(i), C), window, weight,
                                      View(us.buf, us.off(i), C), T, C, kc))
    b.add(f"conv1d+silu {tag(d)}", T, "ours", t, nbytes=nbytes, note=f"conv_dim={C} Kc={kc}",
          sets=n)


def l2norm(b, T: int, d) -> None:
    C, heads, dk = d.conv_dim, 2 * d.ssm_hk, d.ssm_dk   # q and k heads lead each row
    nbytes = 8 * T * heads * dk
    n = b.sets(nbytes)
    xs = b.slab(T, C, n)
    t = b.time_ours(lambda i: _l2norm(b.ctx, View(xs.buf, xs.off(i), C), T, heads, dk, d.eps, 1.0))
    b.add(f"l2norm {tag(d)}", T, "ours", t, nbytes=nbytes,
          note=f"q+k {heads} heads x {dk}, in place", sets=n)


def gates(b, T: int, d) -> None:
    hv = d.ssm_hv
    nbytes = 16 * T * hv
    n = b.sets(nbytes)
    bs, alphas = b.slab(T, hv, n), b.slab(T, hv, n)
    betas, gs = b.out_slab(T, hv, n), b.out_slab(T, hv, n)
    ssm_a, dt_bias = b.upload(-np.exp(b.rand(hv, scale=0.5))), b.upload(b.rand(hv, scale=0.5))

    def call(i):
        _gates(b.ctx, View(bs.buf, bs.off(i), hv), View(alphas.buf, alphas.off(i), hv), ssm_a,
               dt_bias, View(betas.buf, betas.off(i), hv), View(gs.buf, gs.off(i), hv), T, hv)
    b.add(f"gates {tag(d)}", T, "ours", b.time_ours(call), nbytes=nbytes, note=f"Hv={hv}", sets=n)


def scan_inputs(b, rows: int, d):
    """q, k (L2-normalised, q scaled by 1/sqrt(dk)), v, beta in (0, 1), g < 0: float32 rows."""
    hk, hv, dk = d.ssm_hk, d.ssm_hv, d.ssm_dk
    q, k = b.rand(rows, hk, dk), b.rand(rows, hk, dk)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.float32(np.sqrt(dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = b.rand(rows, hv, d.ssm_dv)
    beta = 1 / (1 + np.exp(-b.rand(rows, hv)))
    g = -np.abs(b.rand(rows, hv, scale=0.3)) - np.float32(0.01)
    return q, k, v, beta.astype(np.float32), g.astype(np.float32)


def fla_scan(b, fla, T: int, d, inputs, n: int, parts: int = 1, graph: bool = False):
    """Time FLA's chunk_gated_delta_rule on the same inputs (bf16; q/k expanded to the value
    heads, as the GGUF pairs value head j with key head j % Hk); `parts` calls of T/parts with
    the state carried. graph: each set's calls captured once as a CUDA graph and replayed
    (time_graphed). Returns the timing."""
    torch = b.torch
    idx = torch.arange(d.ssm_hv) % d.ssm_hk
    q, k, v, beta, g = (torch.from_numpy(a).cuda() for a in inputs)
    bf = torch.bfloat16
    sets = [(q[s * T:(s + 1) * T][:, idx].to(bf)[None].contiguous(),
             k[s * T:(s + 1) * T][:, idx].to(bf)[None].contiguous(),
             v[s * T:(s + 1) * T].to(bf)[None].contiguous(),
             beta[s * T:(s + 1) * T].to(bf)[None].contiguous(),
             g[s * T:(s + 1) * T][None].contiguous()) for s in range(n)]
    del q, k, v, beta, g
    step = T // parts

    def call(i):
        qs, ks, vs, bs, gs = sets[i % n]
        state = None
        for p in range(parts):
            r = slice(p * step, (p + 1) * step)
            _, state = fla(qs[:, r], ks[:, r], vs[:, r], g=gs[:, r], beta=bs[:, r], scale=1.0,
                           initial_state=state, output_final_state=True)
    return time_graphed(b, call, n) if graph else b.time_torch(call, warmup=3)


def time_graphed(b, call, n: int):
    """The timing of call(i) over n input sets, each set's call captured once as a CUDA graph and
    replayed (FlashQLA's benchmark form: FLA without graphs is launch-bound at short lengths).
    Two calls a set run first on a side stream: Triton's autotuning, first launches and FLA's
    tensor_cache (the chunk tables of a cu_seqlens tensor) before the captures, which then read
    them without a host sync."""
    torch = b.torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2 * n):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for i in range(n):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call(i)
        graphs.append(g)
    return b.time_torch(lambda i: graphs[i % n].replay(), warmup=3)


def scan(b, T: int, d, parts: int = 1) -> None:
    """Both our paths and FLA at T tokens, in `parts` calls of T/parts on one state."""
    hk, hv, dk, dv = d.ssm_hk, d.ssm_hv, d.ssm_dk, d.ssm_dv
    if T % parts:
        raise ValueError(f"T={T} does not split into {parts} calls")
    op = f"delta-rule {tag(d)}" + (f" {parts}x{T // parts} carried" if parts > 1 else "")
    per_set = 4 * T * (2 * hk * dk + 2 * hv * dv + 2 * hv) + 4 * hv * dk * dv
    n = b.sets(per_set, max_sets=8)
    inputs = scan_inputs(b, n * T, d)
    note = f"Hk={hk} Hv={hv} dk={dk} dv={dv}" + (", state carried" if parts > 1 else "")
    peer = None
    fla = None
    if b.torch is not None:
        mod = b.rec.optional("fla.ops.gated_delta_rule", "FLA chunk_gated_delta_rule")
        fla = getattr(mod, "chunk_gated_delta_rule", None) if mod is not None else None
    if fla is not None and b.variants:
        t = b.rec.guard(f"{op} T={T} FLA", fla_scan, b, fla, T, d, inputs, n, parts)
        if t is not None:
            peer = b.add(op, T, "FLA chunk bf16", t, note=note + ", q/k expanded")
    if fla is not None:
        # The same calls replayed as CUDA graphs (issue 40 asks for FLA under graphs): the ratio's
        # peer where it runs (the faster form of FLA).
        t = b.rec.guard(f"{op} T={T} FLA graph", fla_scan, b, fla, T, d, inputs, n, parts, graph=True)
        if t is not None:
            peer = b.add(op, T, "FLA chunk bf16 graph", t, note=note + ", q/k expanded")
    if b.ctx is None:
        return
    q, k, v, beta, g = (b.slab_of(a.reshape(n * T, -1), n) for a in inputs)
    state = b.slab(hv * dk, dv, n, scale=0.1)
    o = b.out_slab(T, hv * dv, n)
    step = T // parts

    def call(i, path):
        for r0 in range(0, T, step):              # the state carries from one call to the next
            qv, kv, vv, bv, gv, ov = (View(s.buf, s.off(i) + r0 * s.cols, s.cols)
                                      for s in (q, k, v, beta, g, o))
            _scan(b.ctx, qv, kv, vv, bv, gv, View(state.buf, state.off(i)), ov, step, hk, hv, dk,
                  dv, path)

    for path, label, tuning in SCAN_VARIANTS if b.variants else DEFAULT_VARIANTS:
        sub = tuning.get("gdn_subpass_rows")
        if sub is not None:
            sub = 0 if sub == "one-pass" else int(sub)
            if not 0 < sub < step and not default_chains(step):
                continue    # neither this nor the default chains calls of `step` rows: "chunked" again
        def run(path=path, label=label, tuning=tuning):
            b.ctx.set_tuning(tuning)                      # the kernel-level calls on this context
            try:
                t = b.time_ours(lambda i: call(i, path), target_s=0.01)
            finally:
                b.ctx.set_tuning()
            b.add(op, T, f"ours {label} fp32", t, peer=peer, note=note, sets=n)
        b.rec.guard(f"{op} T={T} {label}", run)


# Many sequences in one call (issue 28, "Many sequences at once"): n sequences of L tokens, one
# pf_gdn_scan_varlen against one FLA chunk_gated_delta_rule(..., cu_seqlens=...) captured and
# replayed as a CUDA graph (FlashQLA's benchmark form: FLA without graphs is launch-bound). The
# issue's targets (H200, ms; FlashInfer published 0.425 / 0.431 / 0.111 / 0.119 and 0.637):
VARLEN_CASES = {"qwen35-4b": ((4, 8192, 0.40), (8, 4096, 0.40), (4, 2048, 0.11), (8, 1024, 0.11)),
                "qwen35-27b": ((8, 4096, 0.60),)}


def fla_varlen(b, fla, d, inputs, cu, states0):
    """FLA's chunk_gated_delta_rule over the sequences of cu (bf16, q/k expanded to the value
    heads as in fla_scan; fp32 initial states [N][Hv][dk][dv]) as a replayed CUDA graph
    (time_graphed)."""
    torch = b.torch
    idx = torch.arange(d.ssm_hv) % d.ssm_hk
    q, k, v, beta, g = (torch.from_numpy(a).cuda() for a in inputs)
    bf = torch.bfloat16
    q, k = (x[:, idx].to(bf)[None].contiguous() for x in (q, k))
    v, beta, g = v.to(bf)[None].contiguous(), beta.to(bf)[None].contiguous(), g[None].contiguous()
    cu_t = torch.tensor(cu, dtype=torch.long, device="cuda")
    h0 = torch.from_numpy(states0).cuda()

    def once(i):
        return fla(q, k, v, g=g, beta=beta, scale=1.0, initial_state=h0, output_final_state=True,
                   cu_seqlens=cu_t)
    return time_graphed(b, once, 1)


def scan_varlen(b, d, n_seqs: int, L: int, target_ms: float) -> None:
    """Ours (the default path: chunked) and FLA on n_seqs sequences of L tokens in one call."""
    hk, hv, dk, dv = d.ssm_hk, d.ssm_hv, d.ssm_dk, d.ssm_dv
    T = n_seqs * L
    op = f"delta-rule varlen {n_seqs}x{L} {tag(d)}"
    inputs = scan_inputs(b, T, d)
    cu = np.arange(n_seqs + 1, dtype=np.int64) * L
    states0 = b.rand(n_seqs, hv, dk, dv, scale=0.1)
    note = f"Hk={hk} Hv={hv} dk={dk} dv={dv}, {n_seqs} states, target {target_ms} ms (H200)"
    peer = None
    if b.torch is not None:
        mod = b.rec.optional("fla.ops.gated_delta_rule", "FLA chunk_gated_delta_rule")
        fla = getattr(mod, "chunk_gated_delta_rule", None) if mod is not None else None
        if fla is not None:
            t = b.rec.guard(f"{op} FLA", fla_varlen, b, fla, d, inputs, cu, states0)
            if t is not None:
                peer = b.add(op, T, "FLA chunk bf16 graph", t, note=note + ", q/k expanded")
    if b.ctx is None:
        return
    # One input set: a set is far larger than the L2 (8192 rows: 0.4 GB of fp32 rows).
    q, k, v, beta, g = (b.slab_of(a.reshape(T, -1), 1) for a in inputs)
    states = b.slab_of(states0.reshape(n_seqs * hv * dk, dv), 1)
    o = b.out_slab(T, hv * dv)
    views = [View(s.buf, 0, s.cols) for s in (q, k, v, beta, g)]
    def call(i):
        _scan_varlen(b.ctx, *views, View(states.buf), View(o.buf, 0, o.cols), cu, n_seqs, hk, hv, dk, dv)
    t = b.time_ours(call, target_s=0.01)
    b.add(op, T, "ours fp32", t, peer=peer, note=note, target_ms=target_ms)
    # The warpgroup state kernel's two forms by name (the default takes the pair where the single
    # form's grid exceeds one wave): the same bits, side by side.
    for label, form in (("wg-single", "warpgroup"), ("wg-pair", "warpgroup_pair")) if b.variants else ():
        def run(label=label, form=form):
            b.ctx.set_tuning(gdn_state=form)
            try:
                tv = b.time_ours(call, target_s=0.01)
            finally:
                b.ctx.set_tuning()
            b.add(op, T, f"ours {label} fp32", tv, peer=peer, note=note)
        b.rec.guard(f"{op} {label}", run)


def run(b, lengths) -> None:
    for model in SHAPES[:1] if b.quick else SHAPES:
        d = preset_desc(model)
        for T in lengths:
            if b.ctx is not None:
                for fn in (conv1d, l2norm, gates):
                    b.op(f"{fn.__name__} {tag(d)} T={T}", fn, b, T, d)
            b.op(f"delta-rule {tag(d)} T={T}", scan, b, T, d)
            if T % 4 == 0 and b.variants:
                b.op(f"delta-rule {tag(d)} T={T} carried", scan, b, T, d, 4)
        # the cases whatever the lengths; --quick: the smallest
        for n_seqs, L, target in VARLEN_CASES[model][-1:] if b.quick else VARLEN_CASES[model]:
            b.op(f"delta-rule varlen {n_seqs}x{L} {tag(d)}", scan_varlen, b, d, n_seqs, L, target)
