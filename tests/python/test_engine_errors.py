"""Model-level errors without a device (pf_model_inspect parses and validates like
pf_model_load, before any device work): a typed error each, naming the fault."""
import os
import pytest

from pyprefill import errors
from pyprefill.model import inspect

from gguf_helpers import replace_entry, tiny_desc, write_gguf

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
GOOD = os.path.join(DATA, "qwen35_hv2.mix.gguf")


def test_inspect_a_good_file():
    info = inspect(GOOD)
    assert info["arch"] == "qwen35" and info["n_layer"] == 4 and info["n_attn_layers"] == 2
    assert info["ssm_hv"] == 2 * info["ssm_hk"] and info["tied_output"] == 1


def test_missing_file():
    with pytest.raises(errors.GGUFError, match="cannot open"):
        inspect("/nonexistent/model.gguf")


def test_bad_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(errors.GGUFError, match="bad magic"):
        inspect(str(p))


@pytest.mark.parametrize("cut", [10, 1000, -100])
def test_truncated_file(tmp_path, cut):
    data = open(GOOD, "rb").read()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:cut])
    with pytest.raises(errors.GGUFError, match="truncated"):
        inspect(str(p))


def test_wrong_arch(tmp_path):
    path = write_gguf(tmp_path / "llama.gguf", tiny_desc("qwen3-tiny"), arch="llama")
    with pytest.raises(errors.UnsupportedError, match="unsupported architecture 'llama'"):
        inspect(str(path))


def test_valid_synthetic_file_inspects(tmp_path):
    path = write_gguf(tmp_path / "ok.gguf", tiny_desc("qwen35-tiny"))
    assert inspect(str(path))["n_layer"] == 4


def test_missing_tensor(tmp_path):
    drop = lambda plan: [e for e in plan if e[0] != "blk.3.attn_k.weight"]
    path = write_gguf(tmp_path / "missing.gguf", tiny_desc("qwen35-tiny"), edit=drop)
    with pytest.raises(errors.GGUFError, match=r"tensor blk\.3\.attn_k\.weight is missing"):
        inspect(str(path))


def test_wrong_shape(tmp_path):
    path = write_gguf(tmp_path / "shape.gguf", tiny_desc("qwen35-tiny"),
                      edit=lambda plan: replace_entry(plan, "blk.0.ssm_out.weight", shape=(256, 256)))
    with pytest.raises(errors.GGUFError, match=r"tensor blk\.0\.ssm_out\.weight: expected ne \[512, 256\], found \[256, 256\]"):
        inspect(str(path))


def test_unsupported_qtype(tmp_path):
    path = write_gguf(tmp_path / "q2k.gguf", tiny_desc("qwen3-tiny"),
                      edit=lambda plan: replace_entry(plan, "blk.1.ffn_up.weight", qtype=10))
    with pytest.raises(errors.UnsupportedError, match=r"blk\.1\.ffn_up\.weight has GGML type 10"):
        inspect(str(path))


def test_schedule_mismatch(tmp_path):
    path = write_gguf(tmp_path / "sched.gguf", tiny_desc("qwen35-tiny"),
                      extra_kv={"qwen35.full_attention_interval": 2})
    with pytest.raises(errors.GGUFError, match="should be an attention layer"):
        inspect(str(path))


def test_a_wrapped_cause_survives(tmp_path):
    """A message that wraps an inner one keeps the inner text whole: "malformed tensor X:
    <cause>" used to be formatted over the cause it quoted (pf_last_error() read while being
    written), leaving "...: 0 block size 32". A tensor whose ne0 is not a multiple of its block
    (patched into a valid file's header) fails in the inner check."""
    import struct
    path = write_gguf(tmp_path / "ne0.gguf", tiny_desc("qwen3-tiny"))
    raw = bytearray(path.read_bytes())
    name = b"blk.1.ffn_up.weight"
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)   # n_dims (u32), ne0 (u64)
    ne0 = struct.unpack_from("<Q", raw, at + 4)[0]
    struct.pack_into("<Q", raw, at + 4, ne0 - 12)
    path.write_bytes(bytes(raw))
    with pytest.raises(errors.GGUFError) as info:
        inspect(str(path))
    msg = str(info.value)
    assert msg.count("malformed tensor") == 1, msg
    assert f"k={ne0 - 12} is not a multiple of the Q8_0 block size 32" in msg, msg


def test_reading_and_contents_have_their_own_status(tmp_path):
    """IO_ERROR (GGUFError) for a file that cannot be read; FORMAT_ERROR (GGUFFormatError, a
    GGUFError too, so `except GGUFError` keeps working) for its contents."""
    from pyprefill._ffi import lib
    with pytest.raises(errors.GGUFError) as info:
        inspect(str(tmp_path / "none.gguf"))
    assert not isinstance(info.value, errors.GGUFFormatError)
    assert info.value.status == lib.PF_STATUS_IO_ERROR and "PF_STATUS_IO_ERROR" in str(info.value)
    with pytest.raises(errors.GGUFError) as info:
        inspect(str(tmp_path))
    assert info.value.status == lib.PF_STATUS_IO_ERROR and "not a regular file (a directory)" in str(info.value)
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(errors.GGUFFormatError) as info:
        inspect(str(p))
    assert info.value.status == lib.PF_STATUS_FORMAT_ERROR and isinstance(info.value, OSError)
    assert 'not a GGUF file (bad magic "GGML", expected "GGUF")' in str(info.value)


def test_a_tensor_count_too_large_is_named(tmp_path):
    """One tensor more in the header than in the file: the padding or the data after the last
    tensor info is read as one; the message names the info's index and the count (the CLI test
    has the file whose padding reads as an empty name: "is tensor_count too large?")."""
    import struct
    raw = bytearray(open(GOOD, "rb").read())
    n = struct.unpack_from("<Q", raw, 8)[0]
    struct.pack_into("<Q", raw, 8, n + 1)
    p = tmp_path / "extra.gguf"
    p.write_bytes(bytes(raw))
    with pytest.raises(errors.GGUFFormatError, match=rf"tensor info {n} of tensor_count {n + 1}, at byte \d+"):
        inspect(str(p))
