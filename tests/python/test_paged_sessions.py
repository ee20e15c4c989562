"""Issue 39, paged KV in sessions: a model's pool of KV pages (pf_model_kv_pool), sessions made
with kv_paged = 1 taking pages as their positions reach them, forks and copies sharing the pages
of their common prefix. On the tiny models of both archs:
- a paged session gives bitwise the logits and greedy tokens of a contiguous one on the same
  calls (prefill in chunks, continued calls, decode steps), on both legs, pages of 64 rows and of
  the attention kernel's tiles' multiple;
- a fork holds no new page until it writes (its partial last page is then copied), and both
  sides continue bitwise as fresh contiguous runs; rollback and copy_from at snapshots, save and
  restore (paged <-> contiguous states), batches of paged sessions: bitwise their contiguous twins;
- the pool's pages all come back when the sessions end; a prefill the pool cannot hold fails with
  OutOfMemoryError and changes nothing; wrong uses are clear errors.
GPU; a minute or two. CPU: the entries' checks before they need a device."""
from __future__ import annotations

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model
from helpers import status_and_error
from pyprefill import errors

PRESETS = ["qwen3-tiny", "qwen35-tiny"]
_MODELS = {}


def _model(preset: str, legs: str):
    """A model of its own (the pool is per model), kept for the module."""
    from pyprefill.model import Model
    key = (preset, legs)
    if key not in _MODELS:
        _MODELS[key] = Model.load(synth_model(preset, "q4_k_m"), gemm="f32" if legs == "f32" else "default",
                                  prewarm=legs != "f32", progress=False)
    return _MODELS[key]


def _skw(legs: str) -> dict:
    return dict(kv="f32", attention="cublas", gemm="f32") if legs == "f32" else {}


def _pool(m, legs, pages=64, page_rows=0):
    m.kv_pool(pages, page_rows=page_rows, kv="f32" if legs == "f32" else "f16")
    return m.kv_pool_info()


@pytest.mark.gpu
@pytest.mark.parametrize("page_rows", [64, 0], ids=["pages-64", "pages-tile"])
@pytest.mark.parametrize("legs", ["f32", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_paged_session_is_bitwise_contiguous(preset, legs, page_rows, rng):
    m = _model(preset, legs)
    info = _pool(m, legs, page_rows=page_rows)
    V = m.n_vocab
    calls = [random_tokens(rng, n, V) for n in (333, 150, 1, 64)]
    kw = dict(max_tokens=1024, chunk=128, **_skw(legs))
    with m.session(**kw) as flat, m.session(paged=True, **kw) as paged:
        for i, t in enumerate(calls):
            want, want_tok = flat.prefill(t, "all", return_token=True)
            got, tok = paged.prefill(t, "all", return_token=True)
            assert np.array_equal(got, want), f"{preset} {legs} P={info['page_rows']}: call {i} differs"
            assert tok == want_tok
        assert np.array_equal(paged.generate(5), flat.generate(5))
        held = -(-paged.position // info["page_rows"])
        assert m.kv_pool_info()["free"] == info["pages"] - held
    assert m.kv_pool_info()["free"] == info["pages"], "pages not given back"


@pytest.mark.gpu
@pytest.mark.parametrize("legs", ["f32", "default"])
@pytest.mark.parametrize("preset", PRESETS)
def test_fork_shares_pages_and_continues_bitwise(preset, legs, rng):
    """A fork at 333 (pages of 64: five full pages and a partial one) takes no page; its first
    write copies the partial page and takes what it reaches past it; both sides continue bitwise
    as fresh contiguous sessions on the same calls; copy_from into a paged session shares too."""
    m = _model(preset, legs)
    info = _pool(m, legs, page_rows=64)
    V = m.n_vocab
    first, x, y = random_tokens(rng, 333, V), random_tokens(rng, 150, V), random_tokens(rng, 97, V)
    kw = dict(max_tokens=1024, chunk=128, **_skw(legs))
    with m.session(paged=True, **kw) as a:
        a.prefill(first, "none")
        free0 = m.kv_pool_info()["free"]
        assert free0 == info["pages"] - 6
        with a.fork() as b, m.session(paged=True, **kw) as c:
            assert m.kv_pool_info()["free"] == free0, "a fork took pages before writing"
            c.prefill(random_tokens(rng, 20, V), "none")
            c.copy_from(a)
            assert m.kv_pool_info()["free"] == free0, "copy_from took pages or kept its old one"
            got = {"a": a.prefill(x, "all"), "b": b.prefill(y, "all"), "c": c.prefill(y, "all"),
                   "ga": a.generate(4), "gb": b.generate(4)}
            # a: 333 + 150 + 4 = 487 -> 8 pages, its partial one copied; b: 434 -> 7; c: 430 -> 7;
            # shared: pages 0..4 (full below 320)
            assert m.kv_pool_info()["free"] == info["pages"] - (5 + 3 + 2 + 2)
            for name, cont in (("a", x), ("b", y)):
                with m.session(**kw) as r:
                    r.prefill(first, "none")
                    assert np.array_equal(got[name], r.prefill(cont, "all")), f"{preset} {legs}: fork {name}"
                    assert np.array_equal(got["g" + name], r.generate(4))
            assert np.array_equal(got["b"], got["c"]), "copy_from differs from fork"
    assert m.kv_pool_info()["free"] == info["pages"]


@pytest.mark.gpu
@pytest.mark.parametrize("legs", ["f32", "default"])
def test_rollback_copy_prefix_and_restore(legs, rng):
    """qwen35 with snapshots: rollback to a snapshot gives its pages back and continues bitwise;
    copy_from at a snapshot shares the prefix's pages and continues as a cold run of the same
    calls; a paged state saved restores into a paged and a contiguous session (the same format),
    both continuing bitwise."""
    m = _model("qwen35-tiny", legs)
    info = _pool(m, legs, page_rows=64)
    V = m.n_vocab
    prompt, tail = random_tokens(rng, 700, V), random_tokens(rng, 150, V)
    kw = dict(max_tokens=1024, chunk=256, snapshot_every=128, snapshot_at_end=True, snapshot_slots=8,
              **_skw(legs))
    with m.session(paged=True, **kw) as src, m.session(paged=True, **kw) as dst, m.session(**kw) as flat:
        want = src.prefill(prompt, "all")
        assert m.kv_pool_info()["free"] == info["pages"] - 11
        state = src.save()
        src.rollback(384)
        assert m.kv_pool_info()["free"] == info["pages"] - 6
        assert np.array_equal(src.prefill(prompt[384:], "all"), want[384:]), "rollback then the rest"
        for p in (384, 128, 700):
            dst.copy_from(src, pos=p)
            got, tok = dst.prefill(tail, "all", return_token=True)
            with m.session(**kw) as cold:
                cold.prefill(prompt[:p], "none")
                w, wt = cold.prefill(tail, "all", return_token=True)
            assert np.array_equal(got, w) and tok == wt, f"{legs}: copy_from at {p}"
        dst.restore(state)
        flat.restore(state)
        assert dst.position == flat.position == 700
        assert np.array_equal(dst.prefill(tail, "all"), flat.prefill(tail, "all")), "restored states"
        assert flat.save() == dst.save(), "a paged and a contiguous session save different states"
    assert m.kv_pool_info()["free"] == info["pages"]


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_batch_of_paged_sessions(preset, rng):
    """A batch made after the pool runs paged items (ragged, at positions) bitwise as the same
    batch of contiguous sessions."""
    m = _model(preset, "default")
    _pool(m, "default", pages=128, page_rows=64)
    V = m.n_vocab
    mix = [(1, 0), (65, 0), (300, 0), (70, 130), (1, 200)]
    pre = [random_tokens(rng, p, V) for _, p in mix]
    new = [random_tokens(rng, n, V) for n, _ in mix]
    paged = [m.session(max_tokens=1024, paged=True) for _ in mix]
    flat = [m.session(max_tokens=1024) for _ in mix]
    try:
        for s, f, p in zip(paged, flat, pre):
            if p.size:
                s.prefill(p, "none")
                f.prefill(p, "none")
        with m.batch(step_tokens=256) as b:
            got = b.prefill([dict(session=s, tokens=t, logits="all") for s, t in zip(paged, new)])
            want = b.prefill([dict(session=s, tokens=t, logits="all") for s, t in zip(flat, new)])
        for i, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(g["logits"], w["logits"]) and g["token"] == w["token"], f"item {i}"
    finally:
        for s in paged + flat:
            s.close()


@pytest.mark.gpu
def test_pool_limits_and_errors(rng):
    """A prefill past the free pages: OutOfMemoryError, the session unchanged (position, state,
    pages); it goes through once another session gives its pages back. No pool, another dtype,
    a pool in use, copies between paged and contiguous sessions: clear errors."""
    m = _model("qwen3-tiny", "default")
    V = m.n_vocab
    m.kv_pool(4, page_rows=64)
    kw = dict(max_tokens=1024, chunk=128)
    with m.session(paged=True, **kw) as a, m.session(paged=True, **kw) as b:
        a.prefill(random_tokens(rng, 100, V), "none")      # 2 pages
        b.prefill(random_tokens(rng, 60, V), "none")       # 1 page
        before = a.save()
        with pytest.raises(errors.OutOfMemoryError, match="KV pool"):
            a.prefill(random_tokens(rng, 100, V), "none")  # needs 2 more, 1 free
        assert a.position == 100 and a.save() == before and m.kv_pool_info()["free"] == 1
        with pytest.raises(errors.InvalidArgumentError, match="in use by 2 session"):
            m.kv_pool(8, page_rows=64)
        with m.session(**kw) as flat:
            with pytest.raises(errors.UnsupportedError, match="different kinds"):
                flat.copy_from(a)
        b.close()
        a.prefill(random_tokens(rng, 100, V), "none")
        assert a.position == 200 and m.kv_pool_info()["free"] == 0
    with pytest.raises(errors.InvalidArgumentError, match="kv_dtype=1 but the model's KV pool holds"):
        m.session(paged=True, kv="f32", **kw)
    from pyprefill.model import Model
    with Model.load(synth_model("qwen3-tiny", "q4_k_m"), gemm="f32", prewarm=False, progress=False) as bare:
        assert bare.kv_pool_info() == {"pages": 0, "free": 0, "page_rows": 0, "bytes": 0}
        with pytest.raises(errors.InvalidArgumentError, match="no KV pool"):
            bare.session(paged=True, **kw)
    m.kv_pool(8, page_rows=128)                            # not in use: replaced
    assert m.kv_pool_info()["pages"] == 8 and m.kv_pool_info()["page_rows"] == 128


# ------------------------------------------------------------------------------ CPU

@pytest.mark.parametrize("args,say", [
    ((100, 4, 0), "page_rows=100"), ((0, 4, 0), "page_rows=0"), ((64, 0, 0), "n_pages=0"),
    ((64, 2**31 - 1, 0), "n_pages="), ((64, 4, 2), "kv_dtype=2"), ((64, 4, 0), "model is NULL"),
])
def test_kv_pool_checks_before_the_model(args, say):
    from pyprefill._ffi import ffi, lib
    s, msg = status_and_error(lib.pf_model_kv_pool(ffi.NULL, *args))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and say in msg, msg
    s, msg = status_and_error(lib.pf_model_kv_pool_info(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "model is NULL" in msg


def test_kv_paged_option_checked():
    from pyprefill._ffi import ffi, lib
    o = ffi.new("pf_session_options *")
    assert lib.pf_session_options_init(o, ffi.sizeof("pf_session_options")) == lib.PF_STATUS_OK
    assert o.kv_paged == 0
    o.kv_paged = 2
    s, msg = status_and_error(lib.pf_session_create(ffi.new("pf_session **"), ffi.NULL, o))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "kv_paged=2" in msg, msg


@pytest.mark.gpu
def test_prefix_cache_on_pages(rng):
    """The prefix cache with paged=True (entries and the caller's session paged, attaches sharing
    pages): the logits and greedy tokens of the contiguous cache on the same requests, bitwise,
    the session continuing alike; every page back once the caches and sessions close."""
    m = _model("qwen35-tiny", "default")
    info = _pool(m, "default", pages=256, page_rows=64)
    V = m.n_vocab
    base = random_tokens(rng, 600, V)
    prompts = [np.concatenate([base, random_tokens(rng, n, V)]) for n in (50, 120, 7)] + [base[:300]]
    with m.prefix_cache(max_tokens=1024, snapshot_every=128, paged=True) as pc, \
            m.prefix_cache(max_tokens=1024, snapshot_every=128) as fc, \
            m.session(max_tokens=1024, paged=True) as ps, m.session(max_tokens=1024) as fs:
        for i, p in enumerate(prompts):
            got, tok = pc.prefill(ps, p, return_token=True)
            want, want_tok = fc.prefill(fs, p, return_token=True)
            assert np.array_equal(got, want) and tok == want_tok, f"request {i}"
            assert np.array_equal(ps.generate(3), fs.generate(3)), f"request {i} continued"
        assert pc.stats["served_tokens"] == fc.stats["served_tokens"] > 0
    assert m.kv_pool_info()["free"] == info["pages"]
