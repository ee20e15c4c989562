"""Issue 39, the prefix cache in the library (pf_prefix_cache, Model.prefix_tree): a radix tree
over token ids holding pages of the model's KV pool and snapshots of the recurrent state, a host
tier of pinned memory. On the tiny models of both archs (GPU):
- a chain of prompts (each the last plus new tokens), one leaving the chain at a snapshot and one
  inside an edge: the logits and greedy tokens through the tree against a cold session that made
  the calls the tree's history made for those tokens (bitwise on qwen35 on the f32 leg: the
  snapshots cut the steps alike; qwen3's resumed rows were computed in calls of other lengths, so
  within the f32 leg's 1e-5), the tokens served and prefilled;
- on the default leg every answer within the leg's bound of one cold call;
- everything evicted to the host tier and back: the same request bitwise as from the device;
- every page back in the pool when the sessions and the tree are gone; wrong uses are clear
  errors that change nothing."""
from __future__ import annotations

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model
from pyprefill import errors

from test_paged_sessions import _model, _skw   # the models of the paged tests (a pool per model)

PRESETS = ["qwen35-tiny", "qwen3-tiny"]
N = 64   # snapshot_every of the tests' trees: every 64-row step end


def _recurrent(m) -> bool:
    return m.info["n_layer"] > m.info["n_attn_layers"]


def _tree(m, **kw):
    return m.prefix_tree(snapshot_every=N if _recurrent(m) else 0, snapshot_slots=64 if _recurrent(m) else 0, **kw)


def _cold(m, legs, p, cuts):
    """(last logits, greedy token) of a contiguous session that ran p in calls ending at `cuts`
    (every step end of the tree's runs: the calls of a prompt's history and the snapshot
    positions each run kept)."""
    with m.session(max_tokens=1024, chunk=128, **_skw(legs)) as s:
        start = 0
        for cut in cuts:
            out = s.prefill(p[start:cut], "last", return_token=True)
            start = cut
    return out


def _prompts(rng, V):
    p1 = random_tokens(rng, 300, V)
    p2 = np.concatenate([p1, random_tokens(rng, 150, V)])
    p3 = np.concatenate([p2, random_tokens(rng, 200, V)])
    p4 = np.concatenate([p2[:320], random_tokens(rng, 100, V)])   # leaves p2 at 320 (a snapshot)
    p4[320] = (p2[320] + 1) % V
    p5 = np.concatenate([p3[:333], random_tokens(rng, 50, V)])    # leaves p3 at 333 (inside an edge)
    p5[333] = (p3[333] + 1) % V
    p6 = np.concatenate([p5, random_tokens(rng, 40, V)])          # extends p5
    p7 = np.concatenate([p3[:333], random_tokens(rng, 30, V)])    # a third branch at 333
    p7[333] = next(t for t in range(V) if t not in (p3[333], p5[333]))
    return {"p1": p1, "p2": p2, "p3": p3, "p4": p4, "p5": p5, "p6": p6, "p7": p7}


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_tree_matches_a_cold_run_in_the_same_calls(preset, rng):
    m = _model(preset, "f32")
    m.kv_pool(64, page_rows=64, kv="f32")
    recurrent = _recurrent(m)
    P = _prompts(rng, m.n_vocab)
    # where the cold session's calls end: the history of each prompt's positions in the tree,
    # with every snapshot its runs kept (N = 64: the multiples of 64 that keep a run's snapshots
    # at most 64 apart from where it resumed, and its end).
    # qwen35: p1 snapshots at 64..256 and 300; p2 resumes at p1's end (300) and keeps 320, 384,
    # 448 (450 - 384 > 64), 450; p3 at p2's (450): 512, 576, 640, 650; p4 at the snapshot p2's
    # run kept at 320: 384, 420; p5 at 320 (the deepest snapshot below its match 333), re-running
    # 13 tokens in its one call (the tree keeps its own versions of the pages from 320 on and no
    # state at the branch point 333: the re-run rule): 383; p6 at p5's end, on p5's pages: 423
    # only (383 to 423 is within 64: no step end at 384). qwen3 resumes at the match itself.
    # p7 leaves p3 at p5's branch point: from 320 again, on p1/p2's pages (p5's are another
    # history's: before the re-run rule it got p2's rows with p5's state at 333).
    B = [64, 128, 192, 256, 300]
    cuts = {"p1": B, "p2": B + [320, 384, 448, 450], "p3": B + [320, 384, 448, 450, 512, 576, 640, 650],
            "p4": B + [320, 384, 420], "p5": B + [320, 383], "p6": B + [320, 383, 423], "p7": B + [320, 363]}
    if not recurrent:
        cuts.update(p1=[300], p2=[300, 450], p3=[300, 450, 650])
        cuts.update(p4=[300, 320, 420], p5=[300, 333, 383], p6=[300, 333, 383, 423], p7=[300, 333, 363])
    served = {"p1": 0, "p2": 300, "p3": 450, "p4": 320, "p5": 320 if recurrent else 333, "p6": 383,
              "p7": 320 if recurrent else 333}
    with _tree(m) as tree, m.session(max_tokens=1024, chunk=128, paged=True, **_skw("f32")) as user:
        total = 0
        for name, p in P.items():
            before = tree.stats["served_tokens"]
            got, tok = tree.prefill(user, p, return_token=True)
            assert user.position == p.size
            assert tree.stats["served_tokens"] - before == served[name], name
            total += p.size - served[name]
            want, want_tok = _cold(m, "f32", p, cuts[name])
            if recurrent:
                assert np.array_equal(got, want), f"{preset} {name}: the tree's logits differ"
                assert tok == want_tok
            else:
                from test_batch import _close
                _close(got, want, "f32", f"{preset} {name} through the tree")
            # the session continues on its own (decode), then the next prompt replaces its state
            user.generate(3)
        st = tree.stats
        assert st["requests"] == 7 and st["prefilled_tokens"] == total
        assert st["device_pages"] > 0 and st["snapshots_skipped"] == 0
        assert (st["device_snapshots"] > 0) == recurrent
    assert m.kv_pool_info()["free"] == 64, "pages not given back"


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_default_leg_within_the_bound_of_one_cold_call(preset, rng):
    from test_batch import _close
    m = _model(preset, "default")
    m.kv_pool(64, page_rows=64)
    with _tree(m) as tree, m.session(max_tokens=1024, chunk=128, paged=True) as user:
        for name, p in _prompts(rng, m.n_vocab).items():
            got = tree.prefill(user, p)
            with m.session(max_tokens=1024) as cold:
                want = cold.prefill(p)
            _close(got, want, "default", f"{preset} {name} through the tree")
    assert m.kv_pool_info()["free"] == 64


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_host_tier_round_trip_is_bitwise(preset, rng):
    """p3 served twice from the device (the second: nothing new to insert), then everything
    evicted to the host tier and p3 served again: bitwise the second answer; the pages and
    snapshots came back (stats), the pinned bytes are what host_bytes asked."""
    m = _model(preset, "f32")
    m.kv_pool(64, page_rows=64, kv="f32")
    P = _prompts(rng, m.n_vocab)
    host = 64 << 20
    with _tree(m, host_bytes=host) as tree, m.session(max_tokens=1024, chunk=128, paged=True, **_skw("f32")) as user:
        for name in ("p1", "p2", "p3"):
            tree.prefill(user, P[name])
        a, ta = tree.prefill(user, P["p3"], return_token=True)
        tree.evict(0)
        st = tree.stats
        assert st["device_bytes"] == 0 and st["offloaded_pages"] > 0 and st["host_pages"] > 0
        assert (st["offloaded_snapshots"] > 0) == _recurrent(m)
        assert 0 < st["pinned_bytes"] <= (2 * host if _recurrent(m) else host)
        b, tb = tree.prefill(user, P["p3"], return_token=True)
        assert np.array_equal(a, b) and ta == tb, f"{preset}: a hit from the host tier differs"
        st = tree.stats
        assert st["restored_pages"] > 0 and (st["restored_snapshots"] > 0) == _recurrent(m)
        tree.clear()
    assert m.kv_pool_info()["free"] == 64


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_host_tier_under_a_tight_budget_is_bitwise(preset, rng):
    """Every call evicts into the host tier (a device budget of four pages and two snapshots):
    its copies run on the cache's own stream and may still be reading pages when the next call
    takes pages of the pool, and the next hits come back from the host tier. Each answer of a
    sequence of requests is bitwise the answer of a tree that keeps everything on the device."""
    m = _model(preset, "f32")
    m.kv_pool(64, page_rows=64, kv="f32")
    info = m.kv_pool_info()
    page = info["bytes"] // info["pages"]
    snap = 0
    if _recurrent(m):
        with m.session(max_tokens=64, own_executor=False, snapshot_slots=1, **_skw("f32")) as probe:
            snap = probe.snapshots()[1]
    P = _prompts(rng, m.n_vocab)
    order = ["p1", "p2", "p3", "p4", "p3", "p5", "p6", "p2", "p7", "p1", "p6", "p3"]

    def run(**kw):
        out = []
        with _tree(m, **kw) as tree, m.session(max_tokens=1024, chunk=128, paged=True, **_skw("f32")) as user:
            for name in order:
                out.append(tree.prefill(user, P[name], return_token=True))
            st = tree.stats
        return out, st

    want, _ = run()
    got, st = run(device_bytes=4 * page + 2 * snap, host_bytes=64 << 20)
    assert st["offloaded_pages"] > 0 and st["restored_pages"] > 0, st
    assert (st["restored_snapshots"] > 0) == _recurrent(m), st
    for name, (a, ta), (b, tb) in zip(order, want, got):
        assert np.array_equal(a, b) and ta == tb, f"{preset} {name}: an answer through the host tier differs"
    assert m.kv_pool_info()["free"] == 64, "pages not given back"


@pytest.mark.gpu
def test_wrong_uses_are_clear_errors(rng):
    m = _model("qwen35-tiny", "f32")
    m.kv_pool(16, page_rows=64, kv="f32")
    p = random_tokens(rng, 100, m.n_vocab)
    other = _model("qwen3-tiny", "f32")
    other.kv_pool(16, page_rows=64, kv="f32")
    with _tree(m) as tree, m.session(max_tokens=256, **_skw("f32")) as flat, \
            m.session(max_tokens=64, paged=True, **_skw("f32")) as small, \
            m.session(max_tokens=256, paged=True, **_skw("f32")) as user, \
            other.session(max_tokens=256, paged=True, **_skw("f32")) as foreign:
        cases = [(lambda: tree.prefill(flat, p), "contiguous"),
                 (lambda: tree.prefill(small, p), "capacity"),
                 (lambda: tree.prefill(foreign, p), "another model"),
                 (lambda: tree.prefill(user, np.array([0, m.n_vocab], np.int32)), "tokens"),
                 (lambda: tree.prefill(user, p, "all"), "logits"),
                 (lambda: tree.evict(-1), "target_bytes")]
        for call, say in cases:
            with pytest.raises(errors.InvalidArgumentError, match=say):
                call()
        assert tree.stats["requests"] == 0 and tree.stats["nodes"] == 0
        with pytest.raises(errors.InvalidArgumentError, match="snapshot_every"):
            m.prefix_tree(snapshot_every=100)
        with pytest.raises(errors.InvalidArgumentError, match="recurrent"):
            other.prefix_tree(snapshot_every=64)
    from pyprefill.model import Model
    with Model.load(synth_model("qwen3-tiny", "q4_k_m"), gemm="f32", prewarm=False, progress=False) as bare:
        with pytest.raises(errors.InvalidArgumentError, match="KV pool"):
            bare.prefix_tree()


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_a_batch_through_the_tree(preset, rng):
    """Four prompts in one batch after p1: one extending p1, two sharing a new 200-token prefix
    (computed once, first, as a request of its own), one leaving p1 inside an edge: each within
    the f32 leg's 1e-5 of one cold call (a batch's steps hold other rows), the tokens prefilled
    exactly those, the sessions at their prompts' ends and decoding on."""
    from test_batch import _close
    m = _model(preset, "f32")
    m.kv_pool(64, page_rows=64, kv="f32")
    recurrent = _recurrent(m)
    V = m.n_vocab
    p1 = random_tokens(rng, 300, V)
    shared = random_tokens(rng, 200, V)
    shared[0] = (p1[0] + 1) % V
    a = np.concatenate([p1, random_tokens(rng, 100, V)])
    b = np.concatenate([shared, random_tokens(rng, 50, V)])
    c = np.concatenate([shared, random_tokens(rng, 80, V)])
    c[200] = (b[200] + 1) % V
    d = np.concatenate([p1[:150], random_tokens(rng, 60, V)])
    d[150] = (p1[150] + 1) % V
    kw = dict(max_tokens=1024, chunk=128, paged=True, **_skw("f32"))
    with _tree(m) as tree, m.session(**kw) as s0, m.session(**kw) as s1, m.session(**kw) as s2, \
            m.session(**kw) as s3, m.session(**kw) as s4:
        tree.prefill(s0, p1, "none")
        before = tree.stats
        outs = tree.prefill_batch([s1, s2, s3, s4], [a, b, c, d])
        st = tree.stats
        for name, s, p, o in zip("abcd", (s1, s2, s3, s4), (a, b, c, d), outs):
            assert s.position == p.size
            with m.session(max_tokens=1024, **_skw("f32")) as cold:
                want = cold.prefill(p)
            _close(o["logits"], want, "f32", f"{preset} {name} in a batch through the tree")
            s.generate(2)
        # a: 100 past p1's end; the shared prefix once (200), b 50 and c 80 past it; d from the
        # snapshot at 128 (qwen35) or its match 150 (qwen3)
        assert st["prefilled_tokens"] - before["prefilled_tokens"] == 100 + 200 + 50 + 80 + (82 if recurrent else 60)
        assert st["requests"] - before["requests"] == 5
        with pytest.raises(errors.InvalidArgumentError, match="same session"):
            tree.prefill_batch([s1, s1], [a, b])
        with pytest.raises(errors.InvalidArgumentError, match="contiguous"):
            with m.session(max_tokens=1024, **_skw("f32")) as flat:
                tree.prefill_batch([s1, flat], [a, b])
    assert m.kv_pool_info()["free"] == 64


def test_arguments_are_checked_before_the_library():
    """Without a GPU: PrefixTree's own checks (what the library is not even asked)."""
    pytest.importorskip("pyprefill._ffi", reason="libprefill not loadable (the package imports it)")
    from pyprefill.model import Session
    from pyprefill.prefix_tree import PrefixTree

    class Model:
        n_vocab = 10

    class Sess(Session):
        def __init__(self):   # noqa: D107  (no handle: never reaches the library)
            pass

    t = PrefixTree.__new__(PrefixTree)
    t.model = Model()
    cases = [(lambda: t.prefill(object(), [1]), "session: expected"),
             (lambda: t.prefill(Sess(), [1], "all"), "logits"),
             (lambda: t.prefill(Sess(), [10]), "tokens"),
             (lambda: t.prefill_batch([Sess()], []), "sessions: 1 sessions for 0"),
             (lambda: t.prefill_batch([], []), "at least one"),
             (lambda: t.prefill_batch([Sess(), 3], [[1], [1]]), r"sessions\[1\]"),
             (lambda: t.prefill_batch([Sess()], [[11]]), r"tokens\[0\]"),
             (lambda: t.prefill_batch([Sess()], [[1]], "x"), "logits")]
    for call, say in cases:
        with pytest.raises(errors.InvalidArgumentError, match=say):
            call()
