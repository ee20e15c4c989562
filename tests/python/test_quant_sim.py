"""pyprefill.reference.quant_sim: the 8-bit recipe simulator (CPU only).

The quantizers against hand computations and gguf.quants' codes, the block unpacking against
gguf.quants.dequantize bit for bit, the projection arithmetic against its algebra, and the
whole-model hook: a recipe with no rounding must reproduce the reference bit for bit.
"""
import os

import gguf
import numpy as np
import pytest

from pyprefill.formats.model_desc import (QTYPE_F16, QTYPE_IQ4_XS, QTYPE_NAME, QTYPE_Q4_0,
                                          QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0)
from pyprefill.formats.quant import quantize, random_blocks
from pyprefill.reference import ReferenceModel
from pyprefill.reference import quant_sim as qs

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---------------------------------------------------------------------------------------------
# number formats

def test_round_half_away_is_c_roundf():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999999999999994, 3.7, -3.2, 0.0])
    assert qs.round_half_away(x).tolist() == [1, 2, 3, -1, -3, 0, 4, -3, 0]


def e4m3_grid():
    """Every finite non-negative e4m3 (fn) value from its bit fields (exp 15 mant 7 is NaN)."""
    vals = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue
            vals.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(sorted(vals))


def test_e4m3_grid_and_ties():
    g = e4m3_grid()
    assert g[-1] == 448.0 and g[1] == 2.0 ** -9
    assert np.array_equal(qs.to_e4m3(g), g) and np.array_equal(qs.to_e4m3(-g), -g)
    mid = (g[1:] + g[:-1]) / 2                            # ties go to the even mantissa
    lo_even = ((np.arange(len(g) - 1)) % 2) == 0          # the codes alternate even / odd
    assert np.array_equal(qs.to_e4m3(mid), np.where(lo_even, g[:-1], g[1:]))
    assert qs.to_e4m3(np.array([432.0, 460.0, 1e9, -1e9])).tolist() == [448, 448, 448, -448]
    assert qs.to_e4m3(np.array([0.3])).item() == 0.3125   # 1.25 * 2^-2


def test_fp16_bf16_match_numpy_and_the_bf16_writer(rng):
    x = rng.standard_normal(10000) * np.exp(rng.uniform(-12, 10, 10000))
    assert np.array_equal(qs.to_fp16(x), x.astype(np.float16).astype(np.float64))
    x32 = x.astype(np.float32)
    u = x32.view(np.uint32).astype(np.uint64)              # RNE on the upper 16 bits
    bf = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    assert np.array_equal(qs.to_bf16(x32.astype(np.float64)), bf.astype(np.float64))


# ---------------------------------------------------------------------------------------------
# int8 quantizers

def test_int8_groups_by_hand():
    x = np.array([[127.0, 62.5, -3.5, 0.4, 0, 0, 0, 0]])
    q, s = qs.quantize_int8(x, 4, "even")
    assert s.tolist() == [[1.0, 0.0]]                      # all-zero group: scale 0, codes 0
    assert q.tolist() == [[127, 62, -4, 0, 0, 0, 0, 0]]
    q, _ = qs.quantize_int8(x, 4, "away")
    assert q.tolist() == [[127, 63, -4, 0, 0, 0, 0, 0]]
    x = np.array([[1.0, -2.0, 0.5, 0.25]])                  # scale 2/127
    q, s = qs.quantize_int8(x, 0)
    assert q.tolist() == [[64, -127, 32, 16]] and s[0, 0] == 2 / 127
    assert np.allclose(qs.dequantize_groups(q, s), [[64 * 2 / 127, -2, 64 / 127, 32 / 127]])


def test_int8_ragged_last_group(rng):
    x = rng.standard_normal((3, 40))
    q, s = qs.quantize_int8(x, 32)
    assert q.shape == (3, 40) and s.shape == (3, 2)
    assert np.allclose(s[:, 1], np.abs(x[:, 32:]).max(axis=1) / 127)
    assert np.abs(qs.dequantize_groups(q, s, 32) - x).max() <= s.max() / 2 + 1e-15
    with pytest.raises(qs.InvalidArgumentError):
        qs.dequantize_groups(q[:, :39], s, 16)          # 3 groups of 16, not 2


def test_q8_1_by_hand():
    x = (np.arange(32) - 16.0)[None, :]
    q, d, s = qs.quantize_q8_1(x, "mmq")                   # d_inv = 127/16 = 7.9375 exactly
    assert q[0, :4].tolist() == [-127, -119, -111, -103]  # roundf(-16*7.9375) ...
    assert q[0, 17].item() == 8 and q[0, 18].item() == 16  # 7.9375 -> 8, 15.875 -> 16
    assert d[0, 0] == np.float32(1) / np.float32(7.9375) and s[0, 0] == -16.0
    q, d, s = qs.quantize_q8_1(np.zeros((1, 64)))
    assert not q.any() and not d.any() and not s.any()


@pytest.mark.parametrize("scale", [1.0, 1e-3, 37.0])
def test_q8_1_codes_match_gguf_q8_0(rng, scale):
    """gguf-py's Q8_0 quantizer is ggml's reference q8 (d = amax/127, roundf(x/d)): the "ref"
    variant gives its codes and fp16 d exactly; the CUDA "mmq" variant (127/amax) differs from
    it by at most one code, rarely."""
    x = (rng.standard_normal((64, 256)) * scale).astype(np.float32)
    x[0, :32] = np.round(x[0, :32] * 4) / 4                # some exact ties
    blocks = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)
    q, d, s = qs.quantize_q8_1(x, "ref")
    assert np.array_equal(q.reshape(-1, 32), blocks[:, 2:].view(np.int8))
    assert np.array_equal(d.reshape(-1).astype(np.float16).view(np.uint8).reshape(-1, 2),
                          blocks[:, :2])
    qm, dm, sm = qs.quantize_q8_1(x, "mmq")
    diff = np.abs(qm.astype(int) - q)
    assert diff.max() <= 1 and diff.mean() < 1e-3
    assert np.array_equal(sm, s) and np.allclose(dm, d, rtol=2e-7)
    assert np.allclose(s, x.reshape(64, -1, 32).sum(axis=-1), rtol=1e-5, atol=1e-5 * scale)


def test_e4m3_groups(rng):
    x = rng.standard_normal((5, 256))
    v, s = qs.quantize_e4m3(x, 128)
    assert s.shape == (5, 2) and np.allclose(np.abs(v).max(axis=1), 448.0)
    grid = e4m3_grid()
    assert np.isin(np.abs(v), grid).all()
    assert 0.01 < rel(qs.dequantize_groups(v, s), x) < 0.05   # 3 mantissa bits: ~2.5%


# ---------------------------------------------------------------------------------------------
# GGUF blocks as codes

BLOCKS = [QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_XS]
CODE_RANGE = {QTYPE_Q4_0: (-8, 7), QTYPE_Q8_0: (-128, 127), QTYPE_Q4_K: (0, 15),
              QTYPE_Q5_K: (0, 31), QTYPE_Q6_K: (-32, 31), QTYPE_IQ4_XS: (-127, 113)}


@pytest.mark.parametrize("source", ["random", "quantized"])
@pytest.mark.parametrize("qtype", BLOCKS, ids=lambda q: QTYPE_NAME[q])
def test_unpack_matches_gguf_dequantize(qtype, source, rng):
    rows, k = 7, 512
    if source == "random":                                 # every bit pattern, valid scales
        raw = random_blocks(rows, k, qtype, rng)
    else:
        raw = quantize(rng.standard_normal((rows, k)).astype(np.float32) * 0.05, qtype)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(rows, k)
    b = qs.unpack_blocks(raw, qtype, k)
    assert b.q.shape == (rows, k) and b.scale.shape == (rows, k // b.sub)
    assert b.sub == (16 if qtype == QTYPE_Q6_K else 32)
    assert (b.mins is not None) == (qtype in (QTYPE_Q4_K, QTYPE_Q5_K))
    lo, hi = CODE_RANGE[qtype]
    assert lo <= b.q.min() and b.q.max() <= hi
    if source == "random" and qtype != QTYPE_IQ4_XS:       # random bits reach both ends
        assert b.q.min() == lo and b.q.max() == hi
    assert np.array_equal(b.dequantize_f32(), ref)         # bit for bit
    exact = b.values()                                     # scale*q - mins in float64
    if b.mins is None:                                     # no rounding in float32 at all
        assert np.array_equal(exact, ref.astype(np.float64))
    else:                                                  # float32 rounds s*q - m once
        assert np.all(np.abs(exact - ref) <= np.spacing(np.abs(ref).astype(np.float32)))


def test_unpack_rejects_float_types():
    with pytest.raises(qs.UnsupportedError):
        qs.unpack_blocks(np.zeros((1, 64), np.uint8), QTYPE_F16, 32)


# ---------------------------------------------------------------------------------------------
# one projection

def forms_for(qtype, rng, n=48, k=512):
    raw = random_blocks(n, k, qtype, rng)
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(n, k)
    return qs.WeightForms(w.astype(np.float64), qtype, raw)


@pytest.mark.parametrize("qtype", [QTYPE_Q4_K, QTYPE_Q5_K], ids=lambda q: QTYPE_NAME[q])
def test_min_term_algebra(qtype, rng):
    """Weights with mins: sums of the rounded x give exactly x̂ W^T; sums of the exact x give
    x̂ (s q)^T - S(x) m^T (llama.cpp's form)."""
    f = forms_for(qtype, rng)
    x = rng.standard_normal((9, 512))
    b = f.blocks()
    xh = qs.round_activations(qs.Leg("int8", 128), x, qtype)
    y = qs.project(qs.Leg("int8", 128, "blocks", min_sums="rounded"), x, f)
    assert rel(y, xh @ b.values().T) < 1e-13
    y = qs.project(qs.Leg("int8", 128, "blocks"), x, f)
    sums = x.reshape(9, -1, 32).sum(axis=-1)
    want = xh @ b.scaled_codes().T - sums @ b.mins.astype(np.float64).T
    assert rel(y, want) < 1e-13
    assert rel(y, x @ f.w.T) > rel(xh @ f.w.T, x @ f.w.T)  # the exact sums cost accuracy here


def test_q8_1_llama_leg(rng):
    """act q8_1 against Q8_0 (layout d4: fp32 d) is q·d @ W^T; against Q4_K (ds4) the scales
    and the sums are fp16 and the weight scales too."""
    x = rng.standard_normal((5, 512))
    f = forms_for(QTYPE_Q8_0, rng)
    q, d, _ = qs.quantize_q8_1(x)
    y = qs.project(qs.Leg("q8_1", 32, "blocks_llama"), x, f)
    assert rel(y, qs.dequantize_groups(q, d.astype(np.float64)) @ f.w.T) < 1e-13
    f = forms_for(QTYPE_Q4_K, rng)
    b = f.blocks()
    y = qs.project(qs.Leg("q8_1", 32, "blocks_llama"), x, f)
    xh = qs.dequantize_groups(q, qs.to_fp16(d))
    sums = qs.to_fp16(qs.quantize_q8_1(x)[2].astype(np.float64))
    want = xh @ b.scaled_codes(fp16_scales=True).T - sums @ qs.to_fp16(b.mins).T
    assert rel(y, want) < 1e-13


def test_leg_error_sizes(rng):
    """Per-projection errors on Gaussian rows are where the formats put them."""
    f = forms_for(QTYPE_Q6_K, rng, n=64, k=1024)
    x = rng.standard_normal((32, 1024))
    ref = x @ f.w.T
    err = {name: rel(qs.project(leg, x, f), ref) for name, leg in {
        "f16": qs.F16_LEG, "int8x2": qs.Leg("int8x2", 128, "blocks"),
        "g32": qs.Leg("int8", 32, "blocks"), "g128": qs.Leg("int8", 128, "blocks"),
        "w128": qs.Leg("int8", 128, "int8", (1, 128)), "e4m3": qs.Leg("e4m3", 128)}.items()}
    assert err["f16"] < 1e-3 and err["int8x2"] < 1e-4
    assert 2e-3 < err["g32"] < err["g128"] < err["w128"] < 1.2e-2 < err["e4m3"] < 4e-2, err


def test_rotation_is_exact_without_rounding(rng):
    f = forms_for(QTYPE_Q4_K, rng)
    x = rng.standard_normal((4, 512))
    h = qs.hadamard(128)
    assert np.allclose(h @ h.T, np.eye(128), atol=1e-14)
    y = qs.project(qs.Leg("exact", 0, "exact", rotate=128), x, f)
    assert rel(y, x @ f.w.T) < 1e-14


def test_recipe_routing():
    r = qs.RECIPES["int8-g128"]
    assert r.leg_for("ffn_up", QTYPE_Q4_K) == r.leg
    assert r.leg_for("ssm_beta", QTYPE_Q4_K) == qs.F16_LEG       # GDN gates stay 16-bit
    assert r.leg_for("ffn_up", QTYPE_F16) == qs.F16_LEG          # no blocks: the f16 leg
    mix = qs.with_roles(r, "m", {"ffn_down": qs.F16_LEG})
    assert mix.leg_for("ffn_down", QTYPE_Q6_K) == qs.F16_LEG and mix.leg_for(
        "ffn_up", QTYPE_Q4_K) == r.leg
    assert qs.RECIPES["bf16"].leg_for("ssm_alpha", QTYPE_Q4_K) == qs.RECIPES["bf16"].leg


# ---------------------------------------------------------------------------------------------
# whole models

@pytest.mark.parametrize("name", ["qwen3_tiny.mix", "qwen35_hv2.mix"])
def test_no_rounding_reproduces_the_reference_bitwise(name):
    path = os.path.join(DATA, f"{name}.gguf")
    ref_model = ReferenceModel(path)
    toks = np.random.default_rng(3).integers(0, ref_model.desc.n_vocab, 19)
    ref = ref_model.forward(toks, "all")
    hooked = ReferenceModel(path, project=qs.model_projector(ref_model.desc,
                                                             qs.RECIPES["exact"]))
    assert np.array_equal(hooked.forward(toks, "all"), ref)
    res = qs.simulate(path, toks, [qs.RECIPES["int8-g32"], qs.RECIPES["bf16"]],
                      keep_logits=True)
    assert np.array_equal(res.logits["exact"], ref)
    m = res.metrics["exact"]
    assert m.rel == 0 and m.worst == 0 and m.argmax == 1
    # the layer-by-layer driver and the ReferenceModel hook run the same arithmetic
    int8 = ReferenceModel(path, project=qs.model_projector(ref_model.desc,
                                                           qs.RECIPES["int8-g32"]))
    assert np.array_equal(int8.forward(toks, "all"), res.logits["int8-g32"])
    got = res.metrics["int8-g32"]
    assert got.rel == pytest.approx(rel(res.logits["int8-g32"], ref), rel=1e-12)
    assert 1e-3 < got.rel < 0.1 and got.worst >= got.rel


def test_simulate_chunked_vocab_and_role_stats(tmp_path):
    """LM head in vocabulary chunks: the same metrics as one chunk; role stats per projection."""
    from pyprefill.formats.synth import write_synthetic
    path = str(tmp_path / "t.gguf")
    write_synthetic("qwen35-tiny", "q4_k_m", path, progress=False, n_layer=2, interval=2)
    toks = np.arange(11) * 37
    recs = [qs.RECIPES["int8-g128"], qs.RECIPES["q8_1-llama"]]
    a = qs.simulate(path, toks, recs, role_stats=True)
    b = qs.simulate(path, toks, recs, vocab_chunk=100)
    for n in ("int8-g128", "q8_1-llama"):
        assert a.metrics[n].rel == pytest.approx(b.metrics[n].rel, rel=1e-9)
        assert a.metrics[n].argmax == b.metrics[n].argmax
    roles = a.metrics["int8-g128"].roles
    assert set(roles) >= {"attn_qkv", "ssm_out", "attn_q", "ffn_down", "ssm_beta"}
    assert roles["ssm_beta"] < 1e-3 < roles["ffn_up"] < 2e-2       # gates on the f16 leg


def test_arch_roles():
    leg = qs.Leg("int8", 128, "int8", (1, 128))
    r = qs.Recipe("t", leg, arch_roles=(("qwen35", (("attn_qkv", qs.F16_LEG),)),
                                        ("qwen3", (("ffn_down", qs.F16_LEG),))))
    q35, q3 = r.for_arch("qwen35"), r.for_arch("qwen3")
    assert q35.leg_for("attn_qkv", QTYPE_Q5_K) == qs.F16_LEG
    assert q35.leg_for("ffn_down", QTYPE_Q6_K) == leg
    assert q3.leg_for("ffn_down", QTYPE_Q6_K) == qs.F16_LEG
    assert q3.leg_for("attn_q", QTYPE_Q4_K) == leg
    assert qs.RECIPES["int8-g32"].for_arch("qwen3") is qs.RECIPES["int8-g32"]
    mix = qs.RECIPES["int8-g128-w128-mix"]
    assert {r for r, _ in mix.roles} == set(qs.MIX_F16_ROLES)
    assert mix.leg_for("ffn_up", QTYPE_Q4_K).weight == "int8"


def test_hidden_states_give_the_simulated_logits_errors():
    """simulate(keep_hidden=True) and lm_head_errors: the errors of a recipe's logits computed
    from the float64 hidden states through the LM head in vocabulary chunks equal the
    simulation's own metrics (the path that compares the GPU against a saved simulation)."""
    path = os.path.join(os.path.dirname(__file__), "..", "data", "qwen35_hv1.mix.gguf")
    toks = np.random.default_rng(0).integers(0, 128, 20)
    res = qs.simulate(path, toks, [qs.RECIPES["int8-g128-w128r-mix"]], keep_logits=True,
                      keep_hidden=True)
    assert set(res.hidden) == {"exact", "int8-g128-w128r-mix"} and res.hidden["exact"].shape[0] == 20
    got = qs.lm_head_errors(path, res.hidden["exact"], {"mix": res.logits["int8-g128-w128r-mix"]},
                            vocab_chunk=50)
    m = res.metrics["int8-g128-w128r-mix"]
    assert got["mix"][0] == pytest.approx(m.rel, rel=1e-9) and got["mix"][1] == m.argmax
    assert m.rel > 0



@pytest.mark.parametrize("name", ["qwen3_tiny.mix", "qwen35_hv2.mix"])
def test_gdn_rows16_recipe(name):
    """f16-rows16 (issue 40's 16-bit rows between the GDN kernels, modelled): on a model without
    GDN layers the f16 leg's logits bit for bit; on a hybrid one different from them, with an
    error of the f16 leg's order; one GDN layer with its rows in fp16 differs from the float64
    layer by about fp16's rounding (2^-11 relative), not more."""
    from pyprefill.reference.model import empty_layer_state, layer_forward
    from pyprefill.reference.quant_sim import _layer_forms
    path = os.path.join(DATA, f"{name}.gguf")
    desc = ReferenceModel(path).desc
    toks = np.random.default_rng(4).integers(0, desc.n_vocab, 23)
    res = qs.simulate(path, toks, [qs.RECIPES["f16"], qs.RECIPES["f16-rows16"]], keep_logits=True)
    f16, rows16 = res.logits["f16"], res.logits["f16-rows16"]
    if "gdn" not in desc.layer_kinds:
        assert np.array_equal(rows16, f16)
        return
    assert not np.array_equal(rows16, f16)
    m16, mrows = res.metrics["f16"], res.metrics["f16-rows16"]
    assert 0 < mrows.rel < 4 * m16.rel, (m16.rel, mrows.rel)
    w, _ = _layer_forms(desc, desc.layer_kinds.index("gdn"))
    h = np.random.default_rng(5).standard_normal((9, desc.n_embd))
    state = empty_layer_state(desc, "gdn")
    a, _ = layer_forward(desc, "gdn", w, h, 0, state, gdn_rows16=True)
    b, _ = layer_forward(desc, "gdn", w, h, 0, state)
    mix_a, mix_b = a - h, b - h
    err = rel(mix_a, mix_b)
    assert 1e-6 < err < 4e-3, err
