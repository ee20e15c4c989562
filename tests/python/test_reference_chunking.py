"""Chunking invariance, decode-vs-prefill parity and the chunked delta rule inside the model
(float64; spec.md §8 step 3): one-shot prefill vs any chunk schedule agree to 1e-10 relative."""
from __future__ import annotations

import numpy as np
import pytest

from _reference_fixtures import MODELS, load_npz, reference_model, rel_err

SCHEDULES = {
    "1": [1], "2": [2], "3": [3], "63": [63], "64": [64], "65": [65],
    "mixed": [2, 1, 6, 64, 3, 65, 1], "mixed2": [63, 1, 1, 70, 5],
}


def _schedule(n: int, pattern: list[int]) -> list[int]:
    """Chunk sizes covering n tokens, cycling through pattern."""
    sizes, i = [], 0
    while sum(sizes) < n:
        sizes.append(min(pattern[i % len(pattern)], n - sum(sizes)))
        i += 1
    return sizes


def _chunked(model, tokens: np.ndarray, sizes: list[int], **kw) -> np.ndarray:
    sess = model.session(**kw)
    out, p = [], 0
    for s in sizes:
        out.append(sess.prefill(tokens[p:p + s], "all"))
        p += s
    assert sess.pos == len(tokens)
    return np.concatenate(out)


def _long_prompt(model_name: str):
    path, prompts, _ = load_npz(model_name, "f32")
    return reference_model(path), prompts[-1]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("model_name", MODELS)
def test_chunk_schedules_match_one_shot(model_name: str, schedule: str) -> None:
    model, tokens = _long_prompt(model_name)
    n = 140 if SCHEDULES[schedule] == [1] else len(tokens)   # token-by-token: shorter prompt
    tokens = tokens[:n]
    one = model.forward(tokens, "all")
    out = _chunked(model, tokens, _schedule(n, SCHEDULES[schedule]))
    whole, worst, row = rel_err(out, one)
    assert whole <= 1e-10 and worst <= 1e-10, (whole, worst, row)


@pytest.mark.parametrize("model_name", ["qwen35_hv2", "qwen35_hv1"])
@pytest.mark.parametrize("chunk", [64, 16, 5])
def test_chunked_delta_rule_in_model(model_name: str, chunk: int) -> None:
    """use_chunked_delta (§3.2.1) gives the recurrent-form logits, one shot and across chunk
    boundaries that are not multiples of the delta chunk (state carry)."""
    model, tokens = _long_prompt(model_name)
    ref = model.forward(tokens, "all")
    one = model.session(use_chunked_delta=True, delta_chunk=chunk).prefill(tokens, "all")
    split = _chunked(model, tokens, [100, 3, 100], use_chunked_delta=True, delta_chunk=chunk)
    for out in (one, split):
        whole, worst, _ = rel_err(out, ref)
        assert whole <= 1e-10 and worst <= 1e-10, (whole, worst)


@pytest.mark.parametrize("model_name", MODELS)
def test_decode_after_prefill_matches_one_shot(model_name: str) -> None:
    model, tokens = _long_prompt(model_name)
    one = model.forward(tokens[:80], "all")
    sess = model.session()
    last = sess.prefill(tokens[:60], "last")
    assert last.shape == (model.desc.n_vocab,)
    steps = [last] + [sess.decode(int(t)) for t in tokens[60:80]]
    whole, worst, _ = rel_err(np.stack(steps), one[59:80])
    assert whole <= 1e-10 and worst <= 1e-10, (whole, worst)


@pytest.mark.parametrize("model_name", ["qwen35_hv2", "qwen3_tiny"])
def test_cloned_session_continues_identically(model_name: str) -> None:
    """A session copied at a boundary (prefix caching) continues like the original, and the
    original is not disturbed by the copy's progress."""
    model, tokens = _long_prompt(model_name)
    sess = model.session()
    sess.prefill(tokens[:50], "none")
    snap = sess.clone()
    a = sess.prefill(tokens[50:90], "all")
    snap.prefill(tokens[50:70], "none")
    b = snap.prefill(tokens[70:90], "all")
    np.testing.assert_allclose(b, a[20:], rtol=1e-10, atol=1e-12)
    assert sess.pos == snap.pos == 90


def test_logits_modes_and_errors() -> None:
    from pyprefill.errors import InvalidArgumentError
    model, tokens = _long_prompt("qwen35_hv2")
    all_ = model.session().prefill(tokens[:7], "all")
    last = model.session().prefill(tokens[:7], "last")
    none = model.session().prefill(tokens[:7], "none")
    assert all_.shape == (7, model.desc.n_vocab) and none.shape == (0, model.desc.n_vocab)
    np.testing.assert_allclose(last, all_[-1], rtol=1e-12, atol=1e-12)
    with pytest.raises(InvalidArgumentError):
        model.session().prefill([model.desc.n_vocab])
    with pytest.raises(InvalidArgumentError):
        model.session().prefill([])
    with pytest.raises(InvalidArgumentError):
        model.session().prefill([1], "first")
