"""pyprefill.formats.synth: presets, quant mixes, synthetic files loading back (CPU only)."""
import argparse

import gguf
import numpy as np
import pytest

from pyprefill.errors import InvalidArgumentError
from pyprefill.formats.gguf_model import expected_tensors, load_model_desc, read_tensor
from pyprefill.info_cli import add_info_parser, describe
from pyprefill.formats.model_desc import (QTYPE_BF16, QTYPE_F32, QTYPE_IQ4_XS, QTYPE_Q4_K,
                                          QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, row_bytes)
from pyprefill.formats.synth import (MIXES, PRESETS, add_synth_parser, preset_desc,
                                     synthetic_vocab, tensor_plan, write_synthetic)


@pytest.mark.parametrize("model", ["qwen3-tiny", "qwen35-tiny"])
@pytest.mark.parametrize("mix", MIXES)
def test_tiny_round_trip(tmp_path, model, mix):
    path = tmp_path / f"{model}-{mix}.gguf"
    d = write_synthetic(model, mix, path, seed=1, progress=False)
    again = load_model_desc(path)
    assert again == d
    plan = tensor_plan(preset_desc(model), mix)
    assert [n for n, _, _ in plan] == list(d.tensors)
    for name, shape, qtype in plan:
        t = d.tensors[name]
        assert (t.shape, t.qtype) == (shape, qtype), name
        assert t.nbytes == row_bytes(qtype, shape[-1]) * int(np.prod(shape[:-1]))
    w = read_tensor(d, "blk.0.ffn_down.weight")
    assert np.isfinite(w).all() and 0.01 < w.std() < 0.1
    norm = read_tensor(d, "output_norm.weight")
    assert np.all(np.abs(norm - 1) < 0.5)
    if d.arch == "qwen35":
        assert np.all(read_tensor(d, "blk.0.ssm_a") < 0)


def test_exact_mode_and_overrides(tmp_path):
    d = write_synthetic("qwen35-tiny", "ud", tmp_path / "x.gguf", progress=False, fast=False,
                        n_layer=8, n_vocab=512)
    assert d.n_layer == 8 and d.n_vocab == 512 and d.attn_layers == (3, 7)
    assert d.tensors["blk.0.ffn_up.weight"].qtype == QTYPE_IQ4_XS
    assert d.tensors["blk.0.ssm_alpha.weight"].qtype == QTYPE_Q8_0
    assert d.tensors["blk.3.attn_v.weight"].qtype == QTYPE_Q6_K
    assert d.tensors["blk.3.attn_q.weight"].qtype == QTYPE_Q5_K


def test_real_preset_shapes():
    """Every preset's tensor table has the spec.md §5 shapes (no file written)."""
    d = preset_desc("qwen35-4b")
    assert (d.n_layer, len(d.attn_layers), d.conv_dim, d.n_vocab) == (32, 8, 8192, 248320)
    exp = expected_tensors(d)
    assert exp["blk.0.attn_qkv.weight"][0] == (8192, 2560)
    assert exp["blk.0.ssm_conv1d.weight"][0] == (8192, 4)
    assert exp["blk.0.ssm_alpha.weight"][0] == (32, 2560)
    assert exp["blk.0.ssm_out.weight"][0] == (2560, 4096)
    assert exp["blk.3.attn_q.weight"][0] == (2 * 16 * 256, 2560)
    assert exp["blk.3.attn_k.weight"][0] == (4 * 256, 2560)
    assert "output.weight" not in exp and len(exp) == 426  # unsloth 4B file: 426 tensors
    d9 = preset_desc("qwen35-9b")
    assert len(expected_tensors(d9)) == 427                 # 9B Q4_K_M file: 427 tensors
    d27 = preset_desc("qwen35-27b")
    e27 = expected_tensors(d27)
    assert d27.conv_dim == 10240 and d27.value_dim == 6144 and len(d27.attn_layers) == 16
    assert e27["blk.0.ffn_down.weight"][0] == (5120, 17408)
    assert e27["blk.63.attn_output.weight"][0] == (5120, 24 * 256)
    q = expected_tensors(preset_desc("qwen3-0.6b"))
    assert q["blk.0.attn_q.weight"][0] == (2048, 1024)      # H*D != d
    assert q["blk.27.attn_q_norm.weight"][0] == (128,)
    assert "output.weight" in expected_tensors(preset_desc("qwen3-8b"))
    for name in PRESETS:
        p = preset_desc(name)
        for n, (shape, allowed) in expected_tensors(p).items():
            assert all(s > 0 for s in shape), (name, n)
            assert allowed, (name, n)


def test_q4_k_m_mix_rules():
    d = preset_desc("qwen35-9b")
    plan = {n: q for n, _, q in tensor_plan(d, "q4_k_m")}
    assert plan["output.weight"] == QTYPE_Q6_K and plan["token_embd.weight"] == QTYPE_Q4_K
    assert plan["blk.0.ffn_down.weight"] == QTYPE_Q6_K       # first eighth
    assert plan["blk.4.ffn_down.weight"] == QTYPE_Q4_K
    assert plan["blk.6.attn_qkv.weight"] == QTYPE_Q6_K       # (6 - 4) % 3 == 2
    assert plan["blk.5.attn_qkv.weight"] == QTYPE_Q5_K
    assert plan["blk.0.attn_norm.weight"] == QTYPE_F32
    assert plan["blk.0.ssm_conv1d.weight"] == QTYPE_F32
    tied = {n: q for n, _, q in tensor_plan(preset_desc("qwen35-4b"), "q4_k_m")}
    assert tied["token_embd.weight"] == QTYPE_Q6_K
    # 27B Q4_K_M is about 15.5 GiB: 16-17 GB as published
    total = sum(row_bytes(q, s[-1]) * int(np.prod(s[:-1]))
                for _, s, q in tensor_plan(preset_desc("qwen35-27b"), "q4_k_m"))
    assert 15e9 < total < 18e9
    assert {q for _, _, q in tensor_plan(d, "bf16")} == {QTYPE_F32, QTYPE_BF16}


def test_vocab_is_valid():
    tokens, types, merges, ids = synthetic_vocab("qwen35", 4096)
    assert len(tokens) == len(types) == 4096 and len(set(tokens)) == 4096
    assert ids["<|im_end|>"] == 4095 and tokens[4095] == "<|im_end|>" and types[4095] == 3
    assert all(" " not in t for t in tokens[:4093])
    vocab = set(tokens)
    for m in merges:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    tokens, types, merges, ids = synthetic_vocab("qwen3", 151936)
    assert ids["<|im_end|>"] == 151645 and tokens[151645] == "<|im_end|>"
    assert types[151700] == 5 and len(set(tokens)) == 151936


def test_tokenizer_metadata(tmp_path):
    path = tmp_path / "t.gguf"
    write_synthetic("qwen3-tiny", "q8_0", path, progress=False)
    r = gguf.GGUFReader(str(path))
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert r.fields["tokenizer.ggml.pre"].contents() == "qwen2"
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 1024
    assert r.fields["tokenizer.ggml.eos_token_id"].contents() == 1023
    assert r.fields["general.architecture"].contents() == "qwen3"


def test_bad_arguments(tmp_path):
    with pytest.raises(InvalidArgumentError, match="unknown quant mix 'q3_k'"):
        write_synthetic("qwen3-tiny", "q3_k", tmp_path / "a.gguf", progress=False)
    with pytest.raises(InvalidArgumentError, match="unknown model preset 'llama-7b'"):
        write_synthetic("llama-7b", "q8_0", tmp_path / "a.gguf", progress=False)
    with pytest.raises(InvalidArgumentError, match="n_vocab must be"):
        preset_desc("qwen3-tiny", n_vocab=100)
    assert not (tmp_path / "a.gguf").exists()


def test_cli_parsers(tmp_path, capsys):
    ap = argparse.ArgumentParser(prog="pyprefill")
    sub = ap.add_subparsers()
    add_synth_parser(sub)
    add_info_parser(sub)
    out = tmp_path / "c.gguf"
    a = ap.parse_args(["synth", "--model", "qwen35-tiny", "--quant", "q4_0", "-o", str(out),
                       "--layers", "2", "--vocab", "512", "--seed", "4", "-q"])
    assert a.func(a) == 0
    a = ap.parse_args(["info", str(out)])
    assert a.func(a) == 0
    text = capsys.readouterr().out
    assert "arch: qwen35" in text and "n_layer: 2" in text and "Q4_0" in text
    assert "2 layers: 2 GDN + 0 full attention" in text
    a = ap.parse_args(["info", str(tmp_path / "none.gguf")])
    assert a.func(a) == 1
    assert "cannot open: No such file" in capsys.readouterr().err


def test_describe_lists_types(tmp_path):
    path = tmp_path / "d.gguf"
    write_synthetic("qwen35-tiny", "q4_k_m", path, progress=False)
    text = describe(path)
    for word in ("Q4_K", "Q5_K", "Q6_K", "F32", "conv_dim 1024", "attention at 3",
                 "total tensor bytes"):
        assert word in text, word
