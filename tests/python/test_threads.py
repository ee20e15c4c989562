"""Issue 13 item 5: threads. pf_last_error is per thread (CPU); two sessions of one model
driven from two threads under a lock, and two contexts driven from two threads at the same time,
give logits bitwise equal to running the same work one after another (GPU; about 20 s). What is
and is not thread-safe is stated in include/prefill.h's conventions."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model
from pyprefill._ffi import ffi, lib

ROUNDS = 2000


def test_last_error_is_per_thread():
    """Two threads fail different calls, then each reads pf_last_error after both failed: each
    must read its own message, every round (a process-wide buffer would show the other's)."""
    calls = {
        "a": (lambda out: lib.pf_qtype_matrix_bytes(lib.PF_QTYPE_Q4_K, 4, 100, out), "k=100 is not a multiple"),
        "b": (lambda out: lib.pf_qtype_matrix_bytes(10, 4, 256, out), "GGML type 10 is not supported"),
    }
    both_failed = threading.Barrier(2)
    both_read = threading.Barrier(2)
    wrong: dict[str, list[str]] = {"a": [], "b": []}

    def worker(name):
        call, want = calls[name]
        out = ffi.new("size_t *")
        for _ in range(ROUNDS):
            assert call(out) != lib.PF_STATUS_OK
            both_failed.wait()                      # the other thread has failed too
            msg = ffi.string(lib.pf_last_error()).decode()
            if want not in msg:
                wrong[name].append(msg)
            both_read.wait()

    lib.pf_device_count(ffi.NULL)                    # the main thread's own failure
    main_msg = ffi.string(lib.pf_last_error()).decode()
    threads = [threading.Thread(target=worker, args=(n,)) for n in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert wrong == {"a": [], "b": []}, {k: v[:3] for k, v in wrong.items()}
    assert ffi.string(lib.pf_last_error()).decode() == main_msg == "pf_device_count: out is NULL"


# ------------------------------------------------------------------------------- GPU

LEGS = {"exact": dict(gemm="f32", kv="f32", attention="cublas"),
        "default": dict(gemm="default", kv="f16", attention="auto")}


def _work(model, tokens, schedule, legs, lock=None):
    """Prefill `tokens` in the chunks of `schedule` on a fresh session, then decode 4 greedy
    tokens; returns every logit row and the generated tokens. `lock` (if given) is held for each
    library call: the caller's serialisation of one context's users."""
    import contextlib
    guard = lock if lock is not None else contextlib.nullcontext()
    with guard:
        s = model.session(max_tokens=512, chunk=64, kv=legs["kv"], attention=legs["attention"],
                          gemm=legs["gemm"])
    rows, pos = [], 0
    for n in schedule:
        with guard:
            rows.append(s.prefill(tokens[pos:pos + n], "all"))
        pos += n
    with guard:
        gen = s.generate(4)
        s.close()
    return np.concatenate(rows), gen


def _run_threads(jobs):
    results, errors_ = [None] * len(jobs), []

    def run(i, job):
        try:
            results[i] = job()
        except BaseException as exc:   # reported by the main thread
            errors_.append(exc)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors_:
        raise errors_[0]
    return results


def _same(a, b, what):
    (la, ga), (lb, gb) = a, b
    assert np.array_equal(ga, gb), f"{what}: generated tokens differ: {ga} vs {gb}"
    assert np.array_equal(la, lb), f"{what}: logits differ, max |diff| {np.abs(la - lb).max():.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("legs", list(LEGS))
def test_two_sessions_of_one_model_from_two_threads_under_a_lock(legs, rng):
    from pyprefill.model import Model
    with Model.load(synth_model("qwen35-tiny"), gemm=LEGS[legs]["gemm"],
                    prewarm=legs == "default", progress=False) as m:
        toks = [random_tokens(rng, 300, m.n_vocab) for _ in range(2)]
        scheds = [[1, 63, 64, 100, 72], [150, 1, 1, 148]]
        alone = [_work(m, toks[i], scheds[i], LEGS[legs]) for i in range(2)]
        lock = threading.Lock()
        for _ in range(3):
            both = _run_threads([lambda i=i: _work(m, toks[i], scheds[i], LEGS[legs], lock)
                                 for i in range(2)])
            for i in range(2):
                _same(both[i], alone[i], f"{legs}: session {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("legs", list(LEGS))
def test_two_contexts_from_two_threads_at_once(legs, rng):
    """Each thread owns a context (a model loaded on its own context), no lock: both run at the
    same time on one device and match the sequential results bit for bit."""
    from pyprefill.model import Model
    presets = ("qwen35-tiny", "qwen3-tiny")
    models = [Model.load(synth_model(p), gemm=LEGS[legs]["gemm"], prewarm=legs == "default",
                         progress=False) for p in presets]
    try:
        toks = [random_tokens(rng, 400, m.n_vocab) for m in models]
        scheds = [[7, 200, 193], [64] * 6 + [16]]
        alone = [_work(models[i], toks[i], scheds[i], LEGS[legs]) for i in range(2)]
        for _ in range(3):
            both = _run_threads([lambda i=i: _work(models[i], toks[i], scheds[i], LEGS[legs])
                                 for i in range(2)])
            for i in range(2):
                _same(both[i], alone[i], f"{legs}: context {i} ({presets[i]})")
    finally:
        for m in models:
            m.close()
