"""pyprefill.formats.gguf_model: loading, validation and the typed errors (CPU only)."""
import os

import gguf
import numpy as np
import pytest

from gguf_helpers import replace_entry, tiny_desc, write_gguf
from pyprefill.errors import GGUFError, UnsupportedError
from pyprefill.formats.gguf_model import expected_tensors, load_model_desc, read_tensor
from pyprefill.formats.model_desc import QTYPE_F16, QTYPE_F32, QTYPE_Q4_K, QTYPE_Q8_0
from pyprefill.formats.synth import write_synthetic


@pytest.fixture(scope="module")
def qwen35_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "qwen35-tiny.gguf"
    write_synthetic("qwen35-tiny", "q4_k_m", path, seed=3, progress=False, fast=False)
    return path


def test_loads_valid_file(qwen35_file):
    d = load_model_desc(qwen35_file)
    assert d.arch == "qwen35" and d.n_layer == 4 and d.n_block == 4
    assert d.layer_kinds == ("gdn", "gdn", "gdn", "attn")
    assert (d.ssm_hk, d.ssm_hv, d.ssm_dk, d.ssm_dv) == (2, 4, 128, 128)
    assert d.conv_dim == 1024 and d.rope_dim == 64 and d.head_dim == 256
    assert not d.tied_output and d.n_vocab == 1024
    assert d.eps == pytest.approx(1e-6) and d.rope_base == 1e7
    assert set(d.tensors) == set(expected_tensors(d))
    t = d.tensors["blk.0.attn_qkv.weight"]
    assert t.shape == (1024, 256) and t.nbytes > 0


def test_read_tensor_matches_reader(qwen35_file):
    d = load_model_desc(qwen35_file)
    reader = gguf.GGUFReader(str(qwen35_file))
    for name in ("blk.3.attn_q.weight", "blk.0.ssm_a", "token_embd.weight",
                 "blk.0.ssm_conv1d.weight"):
        a = read_tensor(d, name)
        b = read_tensor(reader, name)
        assert a.dtype == np.float32 and a.shape == d.tensors[name].shape
        assert np.array_equal(a, b)
        c = read_tensor(d, name, dtype=np.float64)
        assert c.dtype == np.float64 and np.array_equal(c, a.astype(np.float64))
    assert np.all(read_tensor(d, "blk.0.ssm_a") < 0)
    with pytest.raises(GGUFError, match="no tensor 'nope'"):
        read_tensor(d, "nope")


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        load_model_desc(tmp_path / "absent.gguf")


def test_bad_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(GGUFError, match=r"not a GGUF file \(magic b'GGML'"):
        load_model_desc(p)


@pytest.mark.parametrize("keep", [10, 300, -100])
def test_truncated(qwen35_file, tmp_path, keep):
    """Cut inside the header (10), inside the metadata (300), inside the last tensor (-100)."""
    data = qwen35_file.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(GGUFError, match="truncated") as e:
        load_model_desc(p)
    assert str(p) in str(e.value)


def test_unsupported_arch(tmp_path):
    p = write_gguf(tmp_path / "llama.gguf", tiny_desc("qwen3-tiny"), arch="llama")
    with pytest.raises(UnsupportedError,
                       match=r"unsupported architecture 'llama' \(supported: qwen3, qwen35\)"):
        load_model_desc(p)


def test_minimal_writer_file_loads(tmp_path):
    """The helper writes valid files: the failures below are due to the one injected fault."""
    for model in ("qwen3-tiny", "qwen35-tiny"):
        d = load_model_desc(write_gguf(tmp_path / f"{model}.gguf", tiny_desc(model)))
        assert d.n_layer == 4 and d.arch == model.split("-")[0]


def test_missing_tensor(tmp_path):
    desc = tiny_desc("qwen3-tiny")
    p = write_gguf(tmp_path / "m.gguf", desc,
                   edit=lambda plan: [e for e in plan if e[0] != "blk.2.ffn_up.weight"])
    with pytest.raises(GGUFError, match=r"missing tensor 'blk.2.ffn_up.weight' "
                                        r"\(expected shape \(512, 256\)\)"):
        load_model_desc(p)


def test_wrong_shape(tmp_path):
    desc = tiny_desc("qwen3-tiny")
    p = write_gguf(tmp_path / "s.gguf", desc,
                   edit=lambda plan: replace_entry(plan, "blk.1.attn_k.weight", shape=(128, 256)))
    with pytest.raises(GGUFError, match=r"tensor 'blk.1.attn_k.weight' has shape \(128, 256\), "
                                        r"expected \(256, 256\)"):
        load_model_desc(p)


def test_unsupported_qtype(tmp_path):
    desc = tiny_desc("qwen35-tiny")
    p = write_gguf(tmp_path / "q2k.gguf", desc,
                   edit=lambda plan: replace_entry(plan, "blk.0.ffn_gate.weight", qtype=10))
    with pytest.raises(UnsupportedError, match=r"tensor 'blk.0.ffn_gate.weight' has unsupported "
                                               r"type Q2_K \(10\); supported: F32, F16"):
        load_model_desc(p)


@pytest.mark.parametrize("name", ["blk.0.attn_norm.weight", "blk.1.ssm_a",
                                  "blk.2.ssm_conv1d.weight", "blk.0.ssm_dt.bias"])
def test_f32_only_tensors(tmp_path, name):
    desc = tiny_desc("qwen35-tiny")
    p = write_gguf(tmp_path / "f16norm.gguf", desc,
                   edit=lambda plan: replace_entry(plan, name, qtype=QTYPE_F16))
    with pytest.raises(UnsupportedError,
                       match=rf"tensor '{name}' has type F16, expected one of F32$"):
        load_model_desc(p)


def test_schedule_mismatch(tmp_path):
    """Metadata says interval 2 (blk.1 attention) but the tensors follow interval 4."""
    desc = tiny_desc("qwen35-tiny")
    p = write_gguf(tmp_path / "sched.gguf", desc,
                   extra_kv={"qwen35.full_attention_interval": 2})
    with pytest.raises(GGUFError, match=r"layer schedule mismatch: full_attention_interval=2 "
                                        r"makes blk.1 a full-attention layer \(needs "
                                        r"blk.1.attn_q.weight\), but the file has "
                                        r"blk.1.attn_qkv.weight instead"):
        load_model_desc(p)


def test_missing_metadata_key(tmp_path):
    p = write_gguf(tmp_path / "nokey.gguf", tiny_desc("qwen35-tiny"),
                   skip_keys=("qwen35.ssm.group_count",))
    with pytest.raises(GGUFError, match=r"missing metadata key 'qwen35.ssm.group_count'"):
        load_model_desc(p)


def test_unexpected_tensor(tmp_path):
    desc = tiny_desc("qwen3-tiny")
    p = write_gguf(tmp_path / "bias.gguf", desc,
                   edit=lambda plan: plan + [("blk.0.attn_q.bias", (512,), QTYPE_F32)])
    with pytest.raises(UnsupportedError, match=r"unexpected tensor 'blk.0.attn_q.bias'"):
        load_model_desc(p)


def test_mtp_blocks_are_skipped(tmp_path):
    """block_count includes a trailing MTP block (nextn_predict_layers = 1): n_layer excludes it."""
    desc = tiny_desc("qwen35-tiny")
    mtp = [("blk.4.attn_q.weight", (1024, 256), QTYPE_Q8_0),
           ("blk.4.nextn.eh_proj.weight", (256, 512), QTYPE_Q8_0),
           ("blk.4.nextn.enorm.weight", (256,), QTYPE_F32)]
    p = write_gguf(tmp_path / "mtp.gguf", desc, edit=lambda plan: plan + mtp,
                   extra_kv={"qwen35.block_count": 5, "qwen35.nextn_predict_layers": 1})
    d = load_model_desc(p)
    assert (d.n_block, d.n_layer, d.nextn_predict_layers) == (5, 4, 1)
    assert len(d.layer_kinds) == 4


def test_tied_output_and_vocab(tmp_path):
    d = load_model_desc(write_gguf(tmp_path / "t.gguf", tiny_desc("qwen3-tiny", n_vocab=300)))
    assert d.tied_output and d.n_vocab == 300
    assert "output.weight" not in expected_tensors(d)
    d = load_model_desc(write_gguf(tmp_path / "u.gguf", tiny_desc("qwen35-tiny")))
    assert not d.tied_output
    assert expected_tensors(d)["output.weight"][0] == (1024, 256)


def test_wrong_type_for_k(tmp_path):
    """A K-quant needs rows that are a multiple of 256: allowed qtypes depend on k."""
    desc = tiny_desc("qwen3-tiny")
    exp = expected_tensors(desc)
    assert QTYPE_Q4_K in exp["blk.0.attn_q.weight"][1]
    assert exp["blk.0.attn_norm.weight"][1] == (QTYPE_F32,)
