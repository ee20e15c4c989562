"""Synthetic models for the model-level GPU tests (reliability: restore, memory faults,
threads, soak): written once per machine under $PF_TEST_TMP, shared by every test module."""
from __future__ import annotations

import functools
import os
import struct


def cache_dir() -> str:
    """Where the synthetic models are kept between runs ($PF_TEST_TMP; conftest.py names it at
    the end of a run that left files there)."""
    return os.environ.get("PF_TEST_TMP", "/tmp/pyprefill-tests")


def test_dir() -> str:
    d = cache_dir()
    os.makedirs(d, exist_ok=True)
    return d


@functools.lru_cache(maxsize=None)
def synth_model(preset: str, mix: str = "q8_0", seed: int = 7) -> str:
    """Path of a synthetic `preset` model in quant mix `mix` (the same files as test_engine)."""
    from pyprefill.formats.synth import write_synthetic
    path = os.path.join(test_dir(), f"{preset}-{mix}.gguf" if seed == 7 else f"{preset}-{mix}-s{seed}.gguf")
    if not os.path.exists(path):
        write_synthetic(preset, mix, path, seed=seed, progress=False)
    return path


def patch_context_limit(src: str, dst: str, arch: str) -> str:
    """Writes `src` to `dst` with its u32 `<arch>.context_length` set to 0 (no limit): same
    size, same tensors. Returns dst."""
    data = bytearray(open(src, "rb").read())
    key = f"{arch}.context_length".encode()
    at = data.find(struct.pack("<Q", len(key)) + key)
    assert at > 0, f"{src}: no {key!r}"
    at += 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4, "context_length is not a u32"
    struct.pack_into("<I", data, at + 4, 0)
    with open(dst, "wb") as f:
        f.write(data)
    return dst


@functools.lru_cache(maxsize=None)
def without_context_limit(preset: str, mix: str = "q8_0") -> str:
    """synth_model(preset, mix) without a context limit, so that a session may ask for any
    capacity (the out-of-memory tests)."""
    arch = "qwen35" if preset.startswith("qwen35") else "qwen3"
    return patch_context_limit(synth_model(preset, mix),
                               os.path.join(test_dir(), f"{preset}-{mix}-nolimit.gguf"), arch)


def random_tokens(rng, n: int, n_vocab: int):
    import numpy as np
    return rng.integers(0, n_vocab, size=n).astype(np.int32)
