"""The library's GGUF reader on corrupted files: every mutation either validates or raises a
typed error, GGUFFormatError (PF_STATUS_FORMAT_ERROR: the bytes of a readable file are never an
IO_ERROR) or UnsupportedError; nothing crashes the process (CPU: pf_model_inspect needs no
device)."""
import os

import numpy as np
import pytest

from pyprefill import errors
from pyprefill.model import inspect

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
FILES = ["qwen35_hv2.mix.gguf", "qwen3_tiny.mix.gguf"]


def _mutations(data: bytes, header: int, rng: np.random.Generator, count: int):
    """Flips in the header and metadata (counts, lengths, offsets, dims), cuts and splices."""
    for i in range(count):
        b = bytearray(data)
        kind = i % 4
        if kind == 0:                                  # a few random bytes anywhere in the header
            for pos in rng.integers(0, header, size=rng.integers(1, 8)):
                b[pos] = int(rng.integers(0, 256))
        elif kind == 1:                                # one 8-byte field set to an extreme value
            pos = int(rng.integers(8, header - 8))
            extreme = (0, 1, 2**31, 2**63 - 1, 2**64 - 1)[int(rng.integers(0, 5))]
            b[pos:pos + 8] = extreme.to_bytes(8, "little")
        elif kind == 2:                                # truncated anywhere
            b = b[:int(rng.integers(0, len(data)))]
        else:                                          # a chunk of the header duplicated
            pos = int(rng.integers(0, header))
            b = b[:pos] + b[pos:pos + int(rng.integers(1, 64))] + b[pos:]
        yield bytes(b)


@pytest.mark.parametrize("name", FILES)
def test_corrupt_files_never_crash(tmp_path, name):
    import gguf
    data = open(os.path.join(DATA, name), "rb").read()
    header = gguf.GGUFReader(os.path.join(DATA, name)).data_offset   # metadata + tensor infos
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    outcomes = {"ok": 0}
    path = tmp_path / "fuzz.gguf"
    for blob in _mutations(data, header, rng, 300):
        path.write_bytes(blob)
        try:
            inspect(str(path))
            outcomes["ok"] += 1
        except (errors.GGUFFormatError, errors.UnsupportedError) as exc:
            assert str(exc), "an error without a message"
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
    # a flip inside a string or an unused key may still validate; most mutations must be caught
    assert outcomes.get("GGUFFormatError", 0) + outcomes.get("UnsupportedError", 0) > 150, outcomes


REGRESSIONS = os.path.join(os.path.dirname(__file__), "..", "fuzz", "regressions", "gguf")


@pytest.mark.parametrize("name", sorted(os.listdir(REGRESSIONS)) if os.path.isdir(REGRESSIONS) else [])
def test_fuzz_findings_are_typed_errors(name):
    """Each input scripts/fuzz.sh once crashed on (UB, a huge allocation) is now a typed error
    through the public entry point, with a message naming the fault."""
    with pytest.raises((errors.GGUFFormatError, errors.UnsupportedError)) as info:
        inspect(os.path.join(REGRESSIONS, name))
    assert name in str(info.value)   # the message names the file (and then the fault)
