"""The engine (model level) against the HF fixtures and the NumPy reference: both archs,
Hv = Hk, 2*Hk and 3*Hk, every quant mix, chunking invariance, decode, save/restore, two
sessions, and errors that leave the session unchanged."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from _reference_fixtures import MODELS, QUANTS, load_npz, reference_model, rel_err

pytestmark = pytest.mark.gpu

F32 = dict(gemm="f32", kv="f32", attention="cublas")   # the exact legs
DEFAULT = dict(gemm="default", kv="f16", attention="auto")


@functools.lru_cache(maxsize=None)
def _model(path: str, gemm: str):
    from pyprefill.model import Model
    return Model.load(path, gemm=gemm, prewarm=gemm != "f32", progress=False)


def _session(path: str, legs: dict, max_tokens: int = 1024, chunk: int = 512):
    m = _model(path, legs["gemm"])
    return m.session(max_tokens=max_tokens, chunk=chunk, kv=legs["kv"], attention=legs["attention"])


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("model", MODELS)
def test_f32_legs_match_hf_fixtures(model, quant):
    path, prompts, hf = load_npz(model, quant)
    outs, refs = [], []
    for tokens, want in zip(prompts, hf):
        s = _session(path, F32)
        outs.append(s.prefill(tokens, "all"))
        refs.append(want)
        s.close()
    whole, worst, row = rel_err(np.concatenate(outs), np.concatenate(refs))
    assert np.isfinite(np.concatenate(outs)).all()
    assert whole <= 1e-4 and worst <= 1e-4, f"{model}.{quant}: {whole:.2e} / worst {worst:.2e} at row {row}"


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("model", MODELS)
def test_default_legs_match_hf_fixtures(model, quant):
    path, prompts, hf = load_npz(model, quant)
    outs = [(_session(path, DEFAULT).prefill(t, "all")) for t in prompts]
    out, ref = np.concatenate(outs), np.concatenate(hf)
    whole, worst, row = rel_err(out, ref)
    agree = float((out.argmax(-1) == ref.argmax(-1)).mean())
    assert whole <= 2e-2, f"{model}.{quant}: rel error {whole:.2e} (worst {worst:.2e} at row {row})"
    assert agree >= 0.99, f"{model}.{quant}: argmax equal on {agree:.1%} of positions"


SYNTH_MIXES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "ud"]


@functools.lru_cache(maxsize=None)
def _synth(preset: str, mix: str) -> str:
    from pyprefill.formats.synth import write_synthetic
    from _engine_models import test_dir
    path = os.path.join(test_dir(), f"{preset}-{mix}.gguf")
    if not os.path.exists(path):
        write_synthetic(preset, mix, path, seed=7, progress=False)
    return path


@pytest.mark.parametrize("mix", SYNTH_MIXES)
@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_engine_matches_reference_on_synthetic_mixes(preset, mix, rng):
    path = _synth(preset, mix)
    ref = reference_model(path)
    tokens = rng.integers(0, ref.desc.n_vocab, size=150).astype(np.int32)
    want = ref.session().prefill(tokens, "all")
    got = _session(path, F32).prefill(tokens, "all")
    whole, worst, row = rel_err(got, want)
    assert whole <= 1e-4, f"{preset} {mix} f32 legs: {whole:.2e} (worst {worst:.2e} at {row})"
    got = _session(path, DEFAULT).prefill(tokens, "last")
    whole, _, _ = rel_err(got, want[-1])
    assert whole <= 2e-2 and got.argmax() == want[-1].argmax(), f"{preset} {mix} default legs: {whole:.2e}"


SCHEDULES = [[1] * 12, [2] * 6, [3, 3, 3, 3], [63, 64, 65], [777], [1, 2, 3, 63, 64, 65, 5, 777 - 203]]


@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_chunking_invariance(preset, rng):
    path = _synth(preset, "q8_0")
    V = reference_model(path).desc.n_vocab
    tokens = rng.integers(0, V, size=1000).astype(np.int32)
    for schedule in SCHEDULES:
        n = sum(schedule)
        one = _session(path, F32, max_tokens=1024, chunk=1024).prefill(tokens[:n], "all")
        s = _session(path, F32, max_tokens=1024, chunk=64)       # internal chunks of 64 as well
        parts, pos = [], 0
        for c in schedule:
            parts.append(s.prefill(tokens[pos:pos + c], "all"))
            pos += c
        assert s.position == n
        whole, worst, row = rel_err(np.concatenate(parts), one)
        assert whole <= 1e-5, f"schedule {schedule}: {whole:.2e} (worst {worst:.2e} at {row})"
    # the internal chunk size alone
    for chunk in (1, 2, 3, 63, 64, 65, 777):
        got = _session(path, F32, chunk=chunk).prefill(tokens[:800], "last")
        ref = _session(path, F32, chunk=1024).prefill(tokens[:800], "last")
        whole, _, _ = rel_err(got, ref)
        assert whole <= 1e-5, f"chunk={chunk}: {whole:.2e}"


@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_decode_after_prefill_matches_one_shot(preset, rng):
    path = _synth(preset, "q4_k_m")
    V = reference_model(path).desc.n_vocab
    tokens = rng.integers(0, V, size=70).astype(np.int32)
    one = _session(path, F32).prefill(tokens, "all")
    s = _session(path, F32)
    s.prefill(tokens[:60], "none")
    steps = np.stack([s.decode(int(t)) for t in tokens[60:]])
    whole, worst, row = rel_err(steps, one[60:])
    assert whole <= 1e-5, f"decode vs one shot: {whole:.2e} (worst {worst:.2e} at {row})"


@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_generate_is_greedy(preset, rng):
    path = _synth(preset, "q8_0")
    V = reference_model(path).desc.n_vocab
    tokens = rng.integers(0, V, size=20).astype(np.int32)
    s = _session(path, F32)
    logits, tok = s.prefill(tokens, "last", return_token=True)
    assert tok == int(np.argmax(logits))
    gen = s.generate(5)
    s2 = _session(path, F32)
    s2.prefill(tokens, "none")
    seq, nxt = [], tok
    for _ in range(5):
        seq.append(nxt)
        nxt = int(np.argmax(s2.decode(nxt)))
    assert [tok] + gen[:-1].tolist() == seq and gen[-1] == nxt


@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_save_restore_continues_exactly(preset, kv, rng):
    path = _synth(preset, "q8_0")
    V = reference_model(path).desc.n_vocab
    tokens = rng.integers(0, V, size=120).astype(np.int32)
    legs = dict(F32, kv=kv)
    whole_run = _session(path, legs).prefill(tokens, "all")[80:]
    s = _session(path, legs)
    s.prefill(tokens[:80], "none")
    state = s.save()
    s.prefill(rng.integers(0, V, size=10).astype(np.int32), "none")   # move on: must not matter
    r = _model(path, legs["gemm"]).restore(state, max_tokens=1024, kv=kv, attention="cublas")
    assert r.position == 80
    got = r.prefill(tokens[80:], "all")
    assert np.array_equal(got, whole_run) or rel_err(got, whole_run)[0] <= 1e-6


def test_two_sessions_interleaved(rng):
    path = _synth("qwen35-tiny", "q8_0")
    V = reference_model(path).desc.n_vocab
    a_tok = rng.integers(0, V, size=90).astype(np.int32)
    b_tok = rng.integers(0, V, size=90).astype(np.int32)
    a_one = _session(path, F32).prefill(a_tok, "last")
    b_one = _session(path, F32).prefill(b_tok, "last")
    a, b = _session(path, F32), _session(path, F32)
    for i in range(0, 90, 30):
        a.prefill(a_tok[i:i + 30], "none")
        b.prefill(b_tok[i:i + 30], "none")
    a.reset(); b.reset()
    for i in range(0, 90, 30):
        la = a.prefill(a_tok[i:i + 30], "last")
        lb = b.prefill(b_tok[i:i + 30], "last")
    assert rel_err(la, a_one)[0] <= 1e-5 and rel_err(lb, b_one)[0] <= 1e-5


def test_errors_leave_the_session_unchanged(rng):
    from pyprefill import errors
    path = _synth("qwen35-tiny", "q8_0")
    V = reference_model(path).desc.n_vocab
    tokens = rng.integers(0, V, size=40).astype(np.int32)
    s = _session(path, F32, max_tokens=64)
    s.prefill(tokens[:30], "none")
    with pytest.raises(errors.InvalidArgumentError, match="exceed the session's capacity of 64"):
        s.prefill(rng.integers(0, V, size=40).astype(np.int32))
    bad = tokens[30:].copy()
    bad[3] = V + 5
    with pytest.raises(errors.InvalidArgumentError, match=rf"tokens\[3\] = {V + 5} is outside the vocabulary \[0, {V}\)"):
        s.prefill(bad)
    bad[3] = -1
    with pytest.raises(errors.InvalidArgumentError, match="outside the vocabulary"):
        s.prefill(bad)
    assert s.position == 30
    got = s.prefill(tokens[30:], "last")
    want = _session(path, F32).prefill(tokens, "last")
    assert rel_err(got, want)[0] <= 1e-5
    with pytest.raises(errors.InvalidArgumentError, match="another model|not a pyprefill"):
        s.restore(b"PFSTATE1" + bytes(80))


def test_model_info_and_prewarm_report():
    path = _synth("qwen35-tiny", "q4_k_m")
    m = _model(path, "default")
    info = m.info
    assert info["arch"] == "qwen35" and info["n_layer"] == 4 and info["n_attn_layers"] == 1
    assert info["f16_armed"] == 1 and info["f16_bytes"] > 0 and info["prewarm_ms"] > 0


# The chunk as one CUDA graph: the embedding and the flash attention kernels read the position
# from the device, so they join the graph (chunks on the cuBLAS attention path keep attention
# between segments). The model lives in a poisoned context: every cache row a prefill has not
# written is NaN, which the wgmma kernel's capacity-wide TMA maps load into its last key tile and
# must keep out.
GRAPH_CONFIGS = [True, False]   # CUDA graphs on / off


def _graph_rounds(m, graphs, rounds, body, **kw):
    """`rounds` runs of body(session) in one session (reset between them) with CUDA graphs
    `graphs`: a length is captured when it comes back, so later rounds replay."""
    got = []
    with m.session(graphs=graphs, **kw) as s:
        for _ in range(rounds):
            s.reset()
            got.extend(body(s))
    return got


def _assert_bitwise(outs, what):
    want = outs[False]   # every kernel launched
    for key, got in outs.items():
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert np.isfinite(a).all(), f"{what} graphs={key} step {i}: non-finite output"
            assert np.array_equal(a, b), (f"{what} graphs={key} step {i}: differs from every kernel "
                                          f"launched (max |diff| {np.abs(a - b).max():.3e})")


@pytest.mark.parametrize("chunk,lengths", [(1, (20, 13)), (64, (150, 800, 150)), (777, (150, 800, 150)),
                                           (0, (150, 800, 150))], ids=["chunk1", "chunk64", "chunk777", "whole"])
@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_chunk_as_one_graph_is_bitwise_eager(preset, chunk, lengths, rng):
    """Attention (and the embedding) inside the chunk's graph, replayed at other positions than
    the captured one, give bitwise the logits of every kernel launched: chunks of 1, 64, 777 rows and the whole call (0: the auto
    chunk), calls after the first at positions > 0, decode steps after the prefills, three
    rounds so that every length is captured and replayed."""
    from pyprefill.core import Context
    from pyprefill.model import Model
    path = _synth(preset, "q4_k_m")
    with Context(0, poison=True) as ctx:
        m = Model.load(path, context=ctx, progress=False)
        prompts = [rng.integers(0, m.n_vocab, size=n).astype(np.int32) for n in lengths]

        def body(s):
            out = [s.prefill(p, "all") for p in prompts]
            out.append(s.generate(3).astype(np.float32))
            out.extend(s.decode(int(t)) for t in prompts[0][:3])   # decode steps with their logits
            return out
        try:
            outs = {cfg: _graph_rounds(m, cfg, 3, body, max_tokens=2048, chunk=chunk)
                    for cfg in GRAPH_CONFIGS}
        finally:
            m.close()
    _assert_bitwise(outs, f"{preset} chunk={chunk}")


@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_one_graph_across_the_cublas_line(preset, rng):
    """AUTO runs short chunks deep into the cache (past 2048 keys) on cuBLAS, whose launches
    depend on the position: such chunks keep attention between segments, the others run it in
    the graph, and one length may hold both graphs. Decode steps from position 2040 to 2060
    and a 7-row chunk past 2048, three rounds (each graph replayed after a reset): bitwise the
    same logits with graphs on and off."""
    from pyprefill.core import Context
    from pyprefill.model import Model
    path = _synth(preset, "q4_k_m")
    with Context(0, poison=True) as ctx:
        m = Model.load(path, context=ctx, progress=False)
        prompt = rng.integers(0, m.n_vocab, size=2040).astype(np.int32)
        tail = rng.integers(0, m.n_vocab, size=7).astype(np.int32)

        def body(s):
            out = [s.prefill(prompt, "last")]
            out.extend(s.decode(int(t)) for t in prompt[:12])    # positions 2040..2051
            out.append(s.prefill(tail, "all"))                   # 2052..2058: cuBLAS
            out.extend(s.decode(int(t)) for t in prompt[:2])
            return out
        try:
            outs = {cfg: _graph_rounds(m, cfg, 3, body, max_tokens=4096, chunk=0)
                    for cfg in GRAPH_CONFIGS}
        finally:
            m.close()
    _assert_bitwise(outs, f"{preset} across 2048")


@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_graph_captured_anew_when_the_caches_change(preset, rng):
    """A step graph holds the addresses of the weights' fp16 caches. Every matrix's cache
    dropped (pf_weight_drop_f16: the arenas freed, their bytes then handed to a poisoned buffer)
    and made again (pf_model_prewarm, at other addresses) between calls of a session that replays
    its graphs: the next steps, captured anew, give bitwise the logits of a session without
    graphs; then the caches dropped (the uncached route): the same. A key without the weights'
    forms would replay reads of the freed, poisoned caches in the first case."""
    import gguf as gg
    from pyprefill import errors
    from pyprefill.core import Context
    from pyprefill.kernels import gemm
    from pyprefill.model import Model
    path = _synth(preset, "q4_k_m")
    names = [t.name for t in gg.GGUFReader(path).tensors if len(t.shape) == 2 and t.name != "token_embd.weight"]
    with Context(0, poison=True) as ctx:
        m = Model.load(path, context=ctx, progress=False)
        prompt = rng.integers(0, m.n_vocab, size=150).astype(np.int32)
        cached_bytes = m.info["f16_bytes"]
        try:
            with m.session(graphs=True, max_tokens=1024) as g, m.session(graphs=False, max_tokens=1024) as e:
                def rounds(n):
                    out = {True: [], False: []}
                    for _ in range(n):
                        for key, s in ((True, g), (False, e)):
                            s.reset()
                            out[key].extend([s.prefill(prompt, "all"), s.decode(int(prompt[0]))])
                    return out
                _assert_bitwise(rounds(3), f"{preset} cached")             # captured, replayed

                def drop_all():
                    dropped = 0
                    for name in names:
                        try:
                            w = m.weight(name)
                        except errors.InvalidArgumentError:                # not a projection matrix
                            continue
                        gemm.weight_drop_f16(w)
                        dropped += 1
                    assert dropped >= 4
                # The caches made again at other addresses with no step between (the route and
                # the scratch unchanged): the freed bytes held by a poisoned buffer first.
                drop_all()
                with ctx.buffer(cached_bytes):
                    assert m.prewarm()
                    _assert_bitwise(rounds(2), f"{preset} caches made again")
                drop_all()                                                 # the uncached route
                with ctx.buffer(cached_bytes):
                    _assert_bitwise(rounds(2), f"{preset} caches dropped")
        finally:
            m.close()


def _default_legs_against_f32_legs(path, preset, n_tokens, chunks, floor, rng):
    """The default legs' logits at every position of n_tokens random tokens, in each session
    chunk of `chunks`, against the f32 legs' (one chunk): design.md's whole-model bound 2e-2,
    the argmax equal on >= `floor` of the positions, everything finite."""
    tokens = rng.integers(0, _model(path, F32["gemm"]).n_vocab, size=n_tokens).astype(np.int32)
    s = _session(path, F32, chunk=0)
    want = s.prefill(tokens, "all")
    s.close()
    assert np.isfinite(want).all(), f"{preset}: the f32 legs' logits are not finite"
    for chunk in chunks:
        s = _session(path, DEFAULT, chunk=chunk)
        got = s.prefill(tokens, "all")
        s.close()
        assert np.isfinite(got).all(), f"{preset} chunk={chunk}: non-finite logits on the default legs"
        whole, worst, row = rel_err(got, want)
        agree = float((got.argmax(-1) == want.argmax(-1)).mean())
        assert whole <= 2e-2, f"{preset} chunk={chunk}: rel error {whole:.2e} (worst {worst:.2e} at row {row})"
        assert agree >= floor, f"{preset} chunk={chunk}: argmax equal on {agree:.1%} of positions"


@pytest.mark.parametrize("preset, chunks", [("qwen35-0.8b", (0,)), ("qwen3-0.6b", (1, 64, 777, 0))],
                         ids=["qwen35-0.8b", "qwen3-0.6b"])
def test_default_legs_match_f32_leg_at_small_model_shapes(preset, chunks, rng):
    """Issues 9 and 10, whole model at a real model's shape: 512 tokens on a synthetic q4_k_m
    file of the qwen35-0.8b shape (24 layers: 18 GDN layers on the chunked delta rule, 6 flash
    attention layers) and of the qwen3-0.6b shape (28 flash attention layers; session chunks of
    1, 64, 777 and the whole prompt): the default legs' logits at every position against the f32
    legs' (within 1e-4 of HF's fp32 on the fixtures) within design.md's whole-model bound, 2e-2.
    The argmax: design.md's >= 99% of the positions at the qwen3 shape; at the qwen35 shape
    >= 97%, the measured floor: device run 34 (.devrun/exact_diag.py) traced the flips to the
    f16 GEMM leg on this synthetic file's flat logits (248320 random-weight logits of std 1.04:
    the 10th percentile of the f32 leg's top-2 margin is 0.031, below the 0.087 that the f16
    GEMMs alone move a logit): default legs 98.4% (97.9% on this test's tokens), the same with
    the sequential delta rule 98.6%, f32 GEMMs with the chunked delta rule 99.0%."""
    _default_legs_against_f32_legs(_synth(preset, "q4_k_m"), preset, 512, chunks,
                                   0.97 if preset.startswith("qwen35") else 0.99, rng)


@pytest.mark.parametrize("preset", ["qwen35-tiny-hv1", "qwen35-tiny", "qwen35-tiny-hv3"],
                         ids=["hv=hk", "hv=2hk", "hv=3hk"])
def test_default_legs_match_f32_leg_at_head_ratios(preset, rng):
    """Issue 9, whole model, each head ratio: the qwen35 tiny models have dk = dv = 128, so the
    default legs run the chunked delta rule on every session chunk of 64 rows or more, with
    Hv = Hk, 2 Hk and 3 Hk value heads over Hk = 2 key heads (the tiled pairing, and the prep's
    one-head rounds when Hv / Hk is odd). 300 tokens in session chunks of 64 (the state carried
    through four chunked calls, then 44 rows on the sequential scan) and as one chunk: the
    default legs' logits at every position against the f32 legs' (sequential delta rule, f32
    GEMMs, cuBLAS attention: within 1e-4 of HF's fp32 on the fixtures) within design.md's
    whole-model bound, 2e-2 with the argmax equal on >= 99% of the positions."""
    _default_legs_against_f32_legs(_synth(preset, "q8_0"), preset, 300, (64, 0), 0.99, rng)


@pytest.mark.parametrize("sub", ["256", "1024", "default"])
def test_gdn_subpasses_bitwise_one_pass_in_the_model(sub, rng):
    """The chained GDN sub-passes (the prep of the next sub-pass beside the warpgroup state
    kernel, launches chained by programmatic dependence; tuning gdn_subpass_rows 256 / 1024, or
    the default 2048) inside the session's chunk graphs and with every kernel launched: the logits
    of a prompt in one session chunk and in chunks of 700 (the state carried) bit for bit those of
    one pass (gdn_subpass_rows "one-pass"). The chained form needs a call of more rows than a sub-pass
    and a session workspace of two sub-passes: with the warpgroup kernel it runs for sub-passes
    of 256 in every call here (the 700-row workspace: 11 chunks >= 2 x 4), for 1024 in the
    1500-row call of the 2048-row session and for the default in the 4500-row call of the
    4800-row session; the other calls compare one pass with one pass (elsewhere: all of them)."""
    path = _synth("qwen35-tiny", "q8_0")
    m = _model(path, "default")
    n = 4500 if sub == "default" else 1500
    tokens = rng.integers(0, m.n_vocab, size=n).astype(np.int32)
    outs = {}
    for mode in ("one-pass", None if sub == "default" else int(sub)):
        for chunk in (n if sub == "default" else 2048, 700):
            for graphs in (True, False):
                with m.session(max_tokens=max(n + 300, 2048), chunk=chunk, graphs=graphs,
                               tuning={"gdn_subpass_rows": mode}) as s:
                    outs[mode, chunk, graphs] = [s.prefill(tokens, "all"), s.prefill(tokens[:300], "all")]
    for (mode, chunk, graphs), got in outs.items():
        want = outs["one-pass", chunk, graphs]
        for a, b in zip(got, want):
            assert np.isfinite(a).all(), f"sub={mode} chunk={chunk} graphs={graphs}: non-finite logits"
            assert np.array_equal(a, b), (f"sub={mode} chunk={chunk} graphs={graphs}: differs from one "
                                          f"pass (max |diff| {np.abs(a - b).max():.3e})")
