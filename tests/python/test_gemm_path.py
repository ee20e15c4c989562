"""Issue 11, the path around the GEMMs: fused projections (Q|K|V, the GDN in-projections, FFN
gate|up run as one GEMM on the f16 leg), the f16 leg's input written by the producing kernels
(the act16 route), the session's workspace (a warmed session allocates nothing during a
prefill) and the automatic chunk. GPU; under a minute on the tiny models."""
from __future__ import annotations

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model
from _reference_fixtures import rel_err

pytestmark = pytest.mark.gpu

PRESETS = ["qwen3-tiny", "qwen35-tiny"]
F16_BOUND = 3e-3     # design.md: f16 leg vs its reference (fused vs unfused: same legs otherwise)
MODEL_BOUND = 2e-2   # design.md: whole model at the default legs (fp16 KV, flash) vs an exact run


def _load(path: str, gemm: str, fuse: bool):
    from pyprefill.model import Model
    return Model.load(path, gemm=gemm, prewarm=gemm != "f32", progress=False,
                      tuning={"fuse_groups": fuse})   # the prewarm's layout (and the sessions')


def _logits(m, tokens, *, fuse: bool = True, **kw):
    with m.session(max_tokens=1024, tuning={"fuse_groups": fuse}, **kw) as s:
        return s.prefill(tokens, "all")


@pytest.mark.parametrize("mix", ["q8_0", "q4_k_m"])
@pytest.mark.parametrize("preset", PRESETS)
def test_fused_projections_match_unfused(preset, mix, rng):
    """One GEMM over the fused fp16 block, the same block run part by part, and separate caches
    (no fusion at prewarm) agree within the f16 leg's bound; and all three are the f16 leg (not
    silently the f32 one): within the whole-model bound of the exact legs' logits, not bitwise
    equal to them."""
    path = synth_model(preset, mix)
    fused_m = _load(path, "f16", True)
    plain_m = _load(path, "f16", False)
    exact_m = _load(path, "f32", False)
    try:
        assert fused_m.info["f16_armed"] and plain_m.info["f16_armed"]
        assert fused_m.info["f16_bytes"] == plain_m.info["f16_bytes"], "fusion changed the cache's bytes"
        for T in (1, 7, 150):
            tokens = random_tokens(rng, T, fused_m.n_vocab)
            fused = _logits(fused_m, tokens, fuse=True, chunk=64)
            sliced = _logits(fused_m, tokens, fuse=False, chunk=64)
            plain = _logits(plain_m, tokens, chunk=64)
            exact = _logits(exact_m, tokens, chunk=64, gemm="f32", kv="f32", attention="cublas")
            for name, out in (("fused", fused), ("fused block, part by part", sliced), ("separate caches", plain)):
                assert np.isfinite(out).all(), f"{preset}.{mix} T={T} {name}: non-finite logits"
                whole, worst, row = rel_err(out, exact)
                assert whole <= MODEL_BOUND, f"{preset}.{mix} T={T} {name} vs f32 legs: {whole:.2e} (worst {worst:.2e} at {row})"
            whole, worst, row = rel_err(fused, plain)
            assert whole <= F16_BOUND, f"{preset}.{mix} T={T} fused vs unfused: {whole:.2e} (worst {worst:.2e} at {row})"
            whole, worst, row = rel_err(sliced, plain)
            assert whole <= F16_BOUND, f"{preset}.{mix} T={T} slices vs separate: {whole:.2e} (worst {worst:.2e} at {row})"
            assert not np.array_equal(fused, exact), "the f16 leg returned the f32 leg's logits"
    finally:
        for m in (fused_m, plain_m, exact_m):
            m.close()


@pytest.mark.parametrize("preset", PRESETS)
def test_f32_leg_is_untouched_by_fusion(preset, rng):
    """The exact leg never runs the fused block: its logits are bitwise those of a model
    prewarmed without fusion, and of a model with no fp16 cache at all."""
    path = synth_model(preset, "q4_k_m")
    tokens = random_tokens(rng, 150, _vocab(path))
    exact = dict(gemm="f32", kv="f32", attention="cublas", chunk=64)
    outs = []
    for gemm, fuse in (("f16", True), ("f16", False), ("f32", False)):
        with _load(path, gemm, fuse) as m:
            outs.append(_logits(m, tokens, fuse=fuse, **exact))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("legs", ["default", "f32"])
@pytest.mark.parametrize("preset", PRESETS)
def test_warm_session_prefill_allocates_nothing(preset, legs, rng):
    """After one round of prefills, a session's next rounds (the same lengths and modes, and
    then new lengths) leave the context's byte count and the device's free memory exactly where
    they were: every scratch was sized at creation; 1000 prefills of random lengths add no
    bytes to the context."""
    from pyprefill.model import Model
    path = synth_model(preset, "q4_k_m")
    kw = dict(kv="f32", attention="cublas", gemm="f32") if legs == "f32" else {}
    with Model.load(path, gemm="f32" if legs == "f32" else "default", prewarm=legs != "f32", progress=False) as m:
        ctx = m.ctx
        with m.session(max_tokens=1024, chunk=128, **kw) as s:
            plan = [(1, "last"), (7, "all"), (300, "last"), (130, "all"), (128, "none")]

            def round_():
                s.reset()
                for n, mode in plan:
                    s.prefill(random_tokens(rng, n, m.n_vocab), mode)
                ctx.synchronize()
            round_()
            round_()   # lengths that came back are captured as CUDA graphs in this round
            alloc0, free0 = ctx.allocated(), ctx.memory()[0]
            for _ in range(3):
                round_()
                assert ctx.allocated() == alloc0, f"prefill allocated {ctx.allocated() - alloc0:+d} bytes"
                assert ctx.memory()[0] == free0, f"free device memory moved by {ctx.memory()[0] - free0:+d} bytes"
            # Issue 11: no growth across 1000 prefills of random lengths (new GEMM shapes, the
            # same scratch; the driver may still load kernels, so the context's bytes only).
            s.reset()
            for n in rng.integers(1, 300, size=1000):
                if s.position + n > 1024:
                    s.reset()
                s.prefill(random_tokens(rng, int(n), m.n_vocab), "last")
            assert ctx.allocated() == alloc0, f"1000 prefills allocated {ctx.allocated() - alloc0:+d} bytes"


@pytest.mark.parametrize("preset", PRESETS)
def test_deep_short_chunks_allocate_nothing(preset, rng):
    """Short chunks deep into a long cache take the cuBLAS attention path (attention_resolved_path:
    few flash blocks, many keys), whose workspace the session sized at creation: after a
    prefill that stays on the flash path, decode steps and short chunks past 2048 positions add
    no bytes to the context."""
    from pyprefill.model import Model
    path = synth_model(preset, "q4_k_m")
    with Model.load(path, progress=False) as m:
        ctx = m.ctx
        with m.session(max_tokens=4096) as s:
            s.prefill(random_tokens(rng, 1500, m.n_vocab), "last")      # flash only
            ctx.synchronize()
            alloc0 = ctx.allocated()
            s.prefill(random_tokens(rng, 600, m.n_vocab), "all")        # rows 600 up to 2100 keys
            s.generate(4)                                               # rows 1, > 2048 keys
            s.prefill(random_tokens(rng, 33, m.n_vocab), "last")
            s.prefill(random_tokens(rng, 300, m.n_vocab), "none")
            ctx.synchronize()
            assert ctx.allocated() == alloc0, f"deep chunks allocated {ctx.allocated() - alloc0:+d} bytes"


@pytest.mark.parametrize("preset", PRESETS)
def test_auto_chunk_is_2048_rows_within_capacity(preset, rng):
    """chunk_tokens = 0 (the default) picks 2048 rows on a device with room (capped at the
    capacity): bitwise the logits of an explicit chunk of that size, and of the capacity."""
    from pyprefill.model import Model
    path = synth_model(preset, "q8_0")
    with Model.load(path, progress=False) as m:
        tokens = random_tokens(rng, 2100, m.n_vocab)
        cap = min(4096, m.info["context_length"] or 4096)
        tokens = tokens[: min(2100, cap)]
        outs = {}
        for chunk in (0, min(2048, cap), 512):
            with m.session(max_tokens=cap, chunk=chunk) as s:
                outs[chunk] = s.prefill(tokens, "last")
        assert np.array_equal(outs[0], outs[min(2048, cap)]), "auto chunk is not 2048 rows"
        whole, worst, _ = rel_err(outs[0], outs[512])
        assert whole <= 2e-2, f"auto chunk vs 512: {whole:.2e}"


def _act16_logits(path: str, on: bool, tokens, form: str = "regs", **kw):
    """Logits with the producers writing the f16 leg's input (on) or a cast pass (off), the
    producers in `form` (_producer_form)."""
    from pyprefill.model import Model
    with Model.load(path, gemm="f16", progress=False) as m:
        assert m.info["f16_armed"]
        tuning = {"f16_producers": on, "row_form": _producer_form(form)}
        with m.session(max_tokens=1024, tuning=tuning, **kw) as s:
            return s.prefill(tokens, "all")


def _producer_form(stage: str) -> str:
    """The f16 producers' form (tuning.row_form): "regs" (the default, "auto": RMSNorm, SwiGLU
    and the GDN gated RMSNorm with the row in registers), "staged" (the row staged in shared
    memory) or "recompute" (the path of rows wider than 12288 floats)."""
    return {"regs": "auto", "staged": "staged", "recompute": "recompute"}[stage]


@pytest.mark.parametrize("stage", ["regs", "staged", "recompute"])
@pytest.mark.parametrize("mix", ["q8_0", "q4_k_m"])
@pytest.mark.parametrize("preset", PRESETS)
def test_act16_route_is_bitwise_the_cast_route(preset, mix, stage, rng):
    """RMSNorm, SwiGLU, the gated RMSNorm and the attention output gate writing the f16 leg's
    input form themselves (no cast pass) give bitwise the logits of the fp32 outputs cast by
    the f16 leg (tuning f16_producers off): the same fp32 values, the same rounding, the same
    GEMMs; in each producer form (_producer_form)."""
    path = synth_model(preset, mix)
    for T, chunk in ((1, 64), (7, 64), (150, 64), (300, 0)):
        tokens = random_tokens(rng, T, _vocab(path))
        on = _act16_logits(path, True, tokens, stage, chunk=chunk)
        off = _act16_logits(path, False, tokens, stage, chunk=chunk)
        assert np.isfinite(on).all(), f"{preset}.{mix} T={T}: non-finite logits"
        assert np.array_equal(on, off), (f"{preset}.{mix} T={T}: act16 route differs from the cast route "
                                         f"(max |diff| {np.abs(on - off).max():.3e})")


def _model_4b(preset: str, layers: int) -> str:
    """A q8_0 synthetic file of a 4B preset's widths with `layers` layers and a vocabulary of
    1024 (written once into the test directory)."""
    import os

    from _engine_models import test_dir
    from pyprefill.formats.synth import write_synthetic
    path = os.path.join(test_dir(), f"{preset}-l{layers}-v1024-q8_0.gguf")
    if not os.path.exists(path):
        write_synthetic(preset, "q8_0", path + ".tmp", seed=7, progress=False, n_layer=layers, n_vocab=1024)
        os.replace(path + ".tmp", path)
    return path


@pytest.mark.parametrize("preset,layers", [("qwen3-4b", 1), ("qwen35-4b", 4)])
def test_row_kernel_forms_are_bitwise_at_4b_widths(preset, layers, rng):
    """The row kernels' register form at the benchmark models' widths (hidden 2560, n_ff 9728 /
    9216: the RMSNorm instance of 10 columns per thread, SwiGLU's of 10 float4, the q/k RoPE
    with 32 + 8 and 16 + 4 heads over 8 warps, the gated RMSNorm's 32 value heads, 4 per warp),
    which the tiny presets do not reach: the 4B
    shapes with 1 / 4 layers and a small vocabulary give bitwise the logits of the staged
    forms (row_form staged) and of the cast route (f16_producers off), chunks of 64 and the
    whole prompt."""
    path = _model_4b(preset, layers)
    for T, chunk in ((150, 64), (300, 0)):
        tokens = random_tokens(rng, T, 1024)
        outs = {}
        for form in ("regs", "staged"):
            outs[form] = _act16_logits(path, True, tokens, form, chunk=chunk)
        outs["cast"] = _act16_logits(path, False, tokens, chunk=chunk)
        assert np.isfinite(outs["regs"]).all(), f"{preset} T={T}: non-finite logits"
        for other in ("staged", "cast"):
            assert np.array_equal(outs["regs"], outs[other]), (
                f"{preset} T={T} chunk={chunk}: the register form differs from {other} "
                f"(max |diff| {np.abs(outs['regs'] - outs[other]).max():.3e})")


def _vocab(path: str) -> int:
    from pyprefill.model import inspect
    return int(inspect(path)["n_vocab"])


NORMS = ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight", "ssm_norm.weight",
         "output_norm.weight")


def _loud_model(preset: str) -> str:
    """synth_model(preset, "f32") with every RMSNorm weight times 1e5: the projections' inputs
    reach |x| ~ 1e5 (beyond fp16's 65504), so rows take the power-of-two scaling."""
    import os
    import shutil

    import gguf
    from _engine_models import test_dir
    src = synth_model(preset, "f32")
    dst = os.path.join(test_dir(), f"{preset}-f32-loud.gguf")
    if not os.path.exists(dst):
        tmp = dst + ".tmp"
        shutil.copyfile(src, tmp)
        r = gguf.GGUFReader(tmp, "r+")
        for t in r.tensors:
            if t.name.endswith(NORMS):
                t.data[...] = t.data * np.float32(1e5)
        del r
        os.replace(tmp, dst)
    return dst


@pytest.mark.parametrize("stage", ["regs", "staged", "recompute"])
@pytest.mark.parametrize("preset", PRESETS)
def test_act16_route_scales_rows_beyond_fp16(preset, stage, rng):
    """Activations of ~1e5 (design.md: fp16 must not overflow silently): the producers' row
    scaling keeps every value finite and gives bitwise the cast route's logits."""
    path = _loud_model(preset)
    tokens = random_tokens(rng, 150, _vocab(path))
    on = _act16_logits(path, True, tokens, stage, chunk=64)
    off = _act16_logits(path, False, tokens, stage, chunk=64)
    assert np.isfinite(on).all(), "non-finite logits with activations of 1e5"
    assert np.array_equal(on, off), f"act16 route differs from the cast route (max |diff| {np.abs(on - off).max():.3e})"


@pytest.mark.parametrize("legs", ["default", "f32"])
@pytest.mark.parametrize("preset", PRESETS)
def test_chunk_graphs_are_bitwise_eager(preset, legs, rng, gemm_lt="on"):
    """A session replaying its chunks as CUDA graphs (a length is captured when it comes back)
    gives bitwise the logits and greedy tokens of one launching every kernel (cuda_graphs = 0):
    full chunks, tails, decode steps, after a reset and a restore; the chunks whose attention
    runs the cuBLAS path (the f32 legs) are graphed as segments with attention launched between
    them. The f16 leg's per-shape GEMM choice is on (test_gemm_lt runs this test again with a
    cuBLASLt algorithm forced onto every shape: gemm_lt="force")."""
    from pyprefill.model import Model
    path = synth_model(preset, "q4_k_m")
    kw = dict(kv="f32", attention="cublas", gemm="f32") if legs == "f32" else {}
    prompts = [random_tokens(rng, n, _vocab(path)) for n in (300, 300, 64, 1, 1, 130)]
    outs = {}
    with Model.load(path, gemm="f32" if legs == "f32" else "default", prewarm=legs != "f32", progress=False) as m:
        for graphs in (True, False):
            kw["graphs"] = graphs
            kw["tuning"] = {"gemm_lt": gemm_lt}
            got = []
            with m.session(max_tokens=1024, chunk=64, **kw) as s:
                for _ in range(3):                      # the same lengths again: replayed graphs
                    s.reset()
                    for p in prompts:
                        got.append(s.prefill(p, "all"))
                    got.append(s.generate(5).astype(np.float32))
                state = s.save()
            with m.restore(state, max_tokens=1024, chunk=64, **kw) as r:
                for _ in range(3):
                    got.append(r.prefill(prompts[2], "last"))
                    got.append(r.generate(3).astype(np.float32))
            outs[graphs] = got
    for off in (False,):
        for i, (a, b) in enumerate(zip(outs[True], outs[off])):
            assert np.isfinite(a).all(), f"step {i}: non-finite output with graphs"
            assert np.array_equal(a, b), f"step {i}: graphs differ from eager ({off}; max |diff| {np.abs(a - b).max():.3e})"


def _switch_run(m, field: str, on: bool, prompts, tuning=None, **kw):
    """Logits of every call and 4 greedy tokens of one session with the tuning switch `field`
    on or off (over `tuning`)."""
    outs = []
    with m.session(max_tokens=1024, tuning={**(tuning or {}), field: on}, **kw) as s:
        for p in prompts:                       # the later calls start at positions > 0
            outs.append(s.prefill(p, "all"))
        outs.append(s.generate(4).astype(np.float32))   # decode steps: one row each
    return outs


@pytest.mark.parametrize("form", ["regs", "staged"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("preset", PRESETS)
def test_fused_qk_rope_is_bitwise_unfused(preset, kv, graphs, form, rng):
    """The attention layer's q/k RMSNorm, RoPE and KV-cache write as one kernel
    (qk_norm_rope_kv_at, the default) give bitwise the logits and greedy tokens of the five
    separate kernels (tuning fuse_qk_rope off): qwen3 (q heads of D) and qwen35 ([q | gate]
    heads, partial RoPE), fp16 and fp32 caches, chunks of 1, 7, 64 rows and the whole prompt,
    at position 0 and after earlier calls; the same lengths twice, so with graphs on the
    chunks also replay. Both forms of the fused kernel: heads in registers (the default for
    these head shapes: D 128 with full RoPE, D 256 with rot_dim 64) and staged in shared
    memory (row_form staged)."""
    from pyprefill.model import Model
    tuning = {"row_form": _producer_form(form)}
    path = synth_model(preset, "q4_k_m")
    prompts = [random_tokens(rng, n, _vocab(path)) for n in (150, 77, 150)]
    with Model.load(path, progress=False) as m:
        for chunk in (1, 7, 64, 0):             # 0: the auto chunk, the whole of each call
            kw = dict(chunk=chunk, kv=kv, graphs=graphs)
            on = _switch_run(m, "fuse_qk_rope", True, prompts, tuning, **kw)
            off = _switch_run(m, "fuse_qk_rope", False, prompts, tuning, **kw)
            for i, (a, b) in enumerate(zip(on, off)):
                assert np.isfinite(a).all(), f"{preset} kv={kv} chunk={chunk} call {i}: non-finite output"
                assert np.array_equal(a, b), (f"{preset} kv={kv} chunk={chunk} call {i}: fused q/k RoPE differs "
                                              f"(max |diff| {np.abs(a - b).max():.3e})")


@pytest.mark.parametrize("legs", ["default", "f32"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("model", ["qwen35-tiny", "qwen35-4b-l4"])
def test_fused_conv_norm_is_bitwise_unfused(model, graphs, legs, rng):
    """The GDN layer's conv1d + SiLU and q/k L2 norms as one kernel (gdn_conv1d_l2norm_rows,
    the default) give bitwise the logits and greedy tokens of the three separate kernels
    (tuning fuse_conv_norm off): the tiny preset (2 key heads, 4 value heads: 8 channel groups)
    and the 4B widths (16 + 16 key heads, 32 value heads, 4 layers, vocabulary 1024); chunks of
    1 and 7 rows (fewer rows than the conv window: the window shifts), 64 and the whole prompt,
    the conv window carried across chunks and calls (positions > 0), decode steps; graphs on
    (the same lengths twice: replayed) and off; the default legs and the exact f32 leg (which
    takes the fused kernel too: the conv and the norms are fp32 on every leg)."""
    from pyprefill.model import Model
    path = synth_model("qwen35-tiny", "q4_k_m") if model == "qwen35-tiny" else _model_4b("qwen35-4b", 4)
    prompts = [random_tokens(rng, n, _vocab(path)) for n in (150, 77, 150)]
    exact = dict(gemm="f32", kv="f32", attention="cublas") if legs == "f32" else {}
    with Model.load(path, gemm="f32" if legs == "f32" else "default", prewarm=legs != "f32", progress=False) as m:
        for chunk in (1, 7, 64, 0):             # 0: the auto chunk, the whole of each call
            kw = dict(chunk=chunk, graphs=graphs, **exact)
            on = _switch_run(m, "fuse_conv_norm", True, prompts, **kw)
            off = _switch_run(m, "fuse_conv_norm", False, prompts, **kw)
            assert len(on) == len(off) == len(prompts) + 1
            for i, (a, b) in enumerate(zip(on, off)):
                assert np.isfinite(a).all(), f"{model} {legs} chunk={chunk} call {i}: non-finite output"
                assert np.array_equal(a, b), (f"{model} {legs} chunk={chunk} call {i}: fused conv + L2 norm differs "
                                              f"(max |diff| {np.abs(a - b).max():.3e})")
