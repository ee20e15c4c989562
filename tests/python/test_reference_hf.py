"""The NumPy reference against HF transformers logits (fixtures in tests/data, spec.md §8).

The fixture logits come from HF run in true float64 (tests/data/README.md), so the f32 files
are held to 1e-5 both over the whole array and at every position; quantized files are compared
with HF running the file's dequantized weights.
"""
from __future__ import annotations

import numpy as np
import pytest

from _reference_fixtures import MODELS, fixture_path, load_npz, reference_model, rel_err


def _run_all(path: str, prompts, dtype=np.float64) -> np.ndarray:
    model = reference_model(path, dtype)
    return np.concatenate([model.forward(p, "all") for p in prompts])


@pytest.mark.parametrize("model", MODELS)
def test_f32_file_matches_hf(model: str) -> None:
    path, prompts, ref = load_npz(model, "f32")
    out = _run_all(path, prompts)
    whole, worst, row = rel_err(out, np.concatenate(ref))
    print(f"{model}.f32: whole {whole:.2e}, worst position {worst:.2e} (row {row})")
    assert np.isfinite(out).all()
    assert whole <= 1e-5, f"whole-array relative error {whole:.3e}"
    assert worst <= 1e-5, f"worst position {row}: {worst:.3e}"


@pytest.mark.parametrize("model", MODELS)
def test_mix_file_matches_hf_with_dequantized_weights(model: str) -> None:
    path, prompts, ref = load_npz(model, "mix")
    out = _run_all(path, prompts)
    whole, worst, row = rel_err(out, np.concatenate(ref))
    print(f"{model}.mix: whole {whole:.2e}, worst position {worst:.2e} (row {row})")
    assert np.isfinite(out).all()
    assert whole <= 1e-4, f"whole-array relative error {whole:.3e}"


@pytest.mark.parametrize("model", MODELS)
def test_mix_file_is_really_quantized(model: str) -> None:
    """The mix logits differ from the f32 ones by quantization-sized amounts (the mix fixture
    is not accidentally the f32 model), while staying close (the same model)."""
    _, _, ref_f32 = load_npz(model, "f32")
    _, _, ref_mix = load_npz(model, "mix")
    whole, _, _ = rel_err(np.concatenate(ref_mix), np.concatenate(ref_f32))
    assert 1e-4 < whole < 0.3, whole


def test_mix_files_exercise_the_quant_types() -> None:
    """Across the mix fixtures every type the brief names appears at least once."""
    from pyprefill.formats.gguf_model import load_model_desc
    from pyprefill.formats.model_desc import (QTYPE_F16, QTYPE_IQ4_XS, QTYPE_Q4_K, QTYPE_Q6_K,
                                              QTYPE_Q8_0)
    seen = set()
    for model in MODELS:
        desc = load_model_desc(fixture_path(f"{model}.mix.gguf"))
        seen |= {t.qtype for t in desc.tensors.values()}
    assert {QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_IQ4_XS, QTYPE_F16} <= seen, seen


@pytest.mark.parametrize("model", ["qwen35_hv2", "qwen3_tiny"])
def test_float32_mode_close_to_float64(model: str) -> None:
    path, prompts, _ = load_npz(model, "f32")
    out64 = _run_all(path, prompts[-1:], np.float64)
    out32 = _run_all(path, prompts[-1:], np.float32)
    assert out32.dtype == np.float32
    whole, worst, _ = rel_err(out32.astype(np.float64), out64)
    print(f"{model}: float32 vs float64 whole {whole:.2e} worst {worst:.2e}")
    assert 0 < whole <= 1e-4 and worst <= 1e-4, (whole, worst)


def test_fixture_metadata_follows_the_spec() -> None:
    """What the exporter wrote (§1.1/§2.1 keys, schedule derived from layer_types, tying,
    ssm_a = −exp(A_log) < 0), as read back by the project loader."""
    from pyprefill.formats.gguf_model import load_model_desc, read_tensor
    q3 = load_model_desc(fixture_path("qwen3_tiny.f32.gguf"))
    assert (q3.arch, q3.n_embd, q3.n_head, q3.n_head_kv, q3.head_dim, q3.rope_dim) == \
        ("qwen3", 64, 4, 2, 32, 32)
    assert not q3.tied_output and q3.rope_base == 1e6
    hv2 = load_model_desc(fixture_path("qwen35_hv2.f32.gguf"))
    assert hv2.layer_kinds == ("gdn", "attn", "gdn", "attn") and hv2.full_attention_interval == 2
    assert (hv2.ssm_hk, hv2.ssm_hv, hv2.ssm_dk, hv2.ssm_dv, hv2.rope_dim) == (2, 4, 64, 64, 32)
    assert hv2.tied_output and "output.weight" not in hv2.tensors
    hv1 = load_model_desc(fixture_path("qwen35_hv1.f32.gguf"))
    assert hv1.layer_kinds == ("gdn", "gdn", "gdn", "attn") and hv1.full_attention_interval == 4
    assert (hv1.ssm_hk, hv1.ssm_hv, hv1.conv_kernel) == (2, 2, 4) and not hv1.tied_output
    for desc in (hv2, hv1):
        for il, kind in enumerate(desc.layer_kinds):
            if kind == "gdn":
                assert (read_tensor(desc, f"blk.{il}.ssm_a") < 0).all()
                assert read_tensor(desc, f"blk.{il}.ssm_conv1d.weight").shape == \
                    (desc.conv_dim, desc.conv_kernel)
