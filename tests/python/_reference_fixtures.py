"""Shared loading of the HF parity fixtures in tests/data (made by scripts/make_fixtures.py)."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
MODELS = ("qwen3_tiny", "qwen35_hv2", "qwen35_hv1")
QUANTS = ("f32", "mix")


def fixture_path(name: str) -> str:
    """Path of a file in tests/data; a missing fixture fails the test (never skips)."""
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        pytest.fail(f"missing fixture {path}: run scripts/make_fixtures.py")
    return path


def load_npz(model: str, quant: str) -> tuple[str, list[np.ndarray], list[np.ndarray]]:
    """(gguf path, prompts, HF logits per prompt as float64)."""
    z = np.load(fixture_path(f"{model}.{quant}.npz"))
    n = int(z["n_prompts"])
    return (fixture_path(str(z["gguf"])), [z[f"tokens_{i}"] for i in range(n)],
            [z[f"logits_{i}"].astype(np.float64) for i in range(n)])


@functools.lru_cache(maxsize=None)
def reference_model(path: str, dtype: type = np.float64):
    from pyprefill.reference import ReferenceModel
    return ReferenceModel(path, dtype)


def rel_err(out: np.ndarray, ref: np.ndarray) -> tuple[float, float, int]:
    """(||out-ref||/||ref|| over the whole array, worst per-position relative error, its row)."""
    out, ref = np.atleast_2d(out), np.atleast_2d(ref)
    per = np.linalg.norm(out - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    return (float(np.linalg.norm(out - ref) / np.linalg.norm(ref)), float(per.max()),
            int(per.argmax()))
