"""pyprefill.formats.gguf_meta: a GGUF's metadata read without gguf.GGUFReader (CPU)."""
import re
import struct

import numpy as np
import pytest

from pyprefill.errors import GGUFError
from pyprefill.formats.gguf_meta import read_metadata
from pyprefill.formats.synth import write_synthetic


@pytest.fixture(scope="module")
def synthetic_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("meta") / "qwen35-tiny.gguf"
    write_synthetic("qwen35-tiny", "q4_k_m", path, progress=False)
    return str(path)


def test_equals_gguf_reader(synthetic_gguf):
    import gguf
    ours = read_metadata(synthetic_gguf)
    ref = {k: f.contents() for k, f in gguf.GGUFReader(synthetic_gguf).fields.items()
           if not k.startswith("GGUF.")}
    assert ours.keys() == ref.keys()
    for k, v in ref.items():
        got = ours[k]
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == v, k
    assert isinstance(ours["tokenizer.ggml.tokens"], list)
    assert ours["tokenizer.ggml.token_type"].dtype == np.int32


def test_only_the_keys_asked_for(synthetic_gguf):
    assert read_metadata(synthetic_gguf, ["tokenizer.ggml.pre", "no.such.key"]) == \
        {"tokenizer.ggml.pre": "qwen35"}
    assert read_metadata(synthetic_gguf, []) == {}


def test_faults_name_the_file(synthetic_gguf, tmp_path):
    data = open(synthetic_gguf, "rb").read()
    cases = {"cut.gguf": data[:3000], "magic.gguf": b"GGUX" + data[4:],
             "v1.gguf": data[:4] + struct.pack("<I", 1) + data[8:], "tiny.gguf": b"GGUF"}
    needles = {"cut.gguf": "truncated or malformed", "magic.gguf": "not a GGUF file (magic",
               "v1.gguf": "GGUF version 1", "tiny.gguf": "not a GGUF file (4 bytes)"}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(GGUFError, match=rf"{name}: .*{re.escape(needles[name])}"):
            read_metadata(tmp_path / name)
    with pytest.raises(GGUFError, match="no such file"):
        read_metadata(tmp_path / "none.gguf")
