"""Text prompts: a byte-level BPE tokenizer built from a GGUF's own vocabulary (CPU)."""
import pytest

from pyprefill.formats.synth import write_synthetic

tokenizers = pytest.importorskip("tokenizers", reason="the optional `tokenizers` extra is not installed")


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "qwen3-tiny.gguf"
    write_synthetic("qwen3-tiny", "q8_0", path, progress=False)
    return str(path)


@pytest.mark.parametrize("text", ["Hello world, prefill!", "  spaces\tand\nnewlines ", "ünïcödé ✓ 漢字"])
def test_round_trip(gguf_path, text):
    from pyprefill.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(gguf_path)
    ids = tok.encode(text)
    assert ids and all(0 <= i < 1024 for i in ids)
    assert tok.decode(ids) == text


def test_non_gpt2_vocabulary_is_refused(tmp_path):
    import gguf

    from pyprefill.errors import UnsupportedError
    from pyprefill.tokenizer import Tokenizer
    p = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(p), "qwen3")
    w.add_string("tokenizer.ggml.model", "llama")
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(UnsupportedError, match="only 'gpt2'"):
        Tokenizer.from_gguf(str(p))
