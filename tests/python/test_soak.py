"""Issue 13 item 6: soak. Cycles of create / prefill in random chunks / save / restore into a
fresh session / continue / destroy, on both archs, with no error and no growth of host RSS or of
device memory. PF_SOAK_CYCLES sets the count (default 50, about 10 s; the issue's run is 2000).
Where $OUT is set (scripts/device-check.sh), the numbers also go to $OUT/soak.json."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model

pytestmark = pytest.mark.gpu

MiB = 1 << 20
CYCLES = int(os.environ.get("PF_SOAK_CYCLES", "50"))
RSS_SLACK = 16 * MiB      # the allocator's and the interpreter's own noise
CONFIGS = [dict(kv="f16", attention="auto"), dict(kv="f32", attention="cublas")]
CHUNKS = (1, 7, 64, 256)
CAPACITY = 320
MAX_PROMPT = 239
DEVICE_SLACK = 4 * MiB    # the driver's own (lazily loaded kernels); the context's bytes are exact


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(ctx):
    """(host RSS, device free bytes, the context's bytes) after the device is drained."""
    ctx.synchronize()
    return _rss(), ctx.memory()[0], ctx.allocated()


def _report_and_check(before, after, report: dict, cycles: int) -> None:
    """Print the soak's figures (and add them to $OUT/soak.json), then check that nothing grew."""
    (rss0, free0, alloc0), (rss1, free1, alloc1) = before, after
    report.update(rss_delta_mib=round((rss1 - rss0) / MiB, 3),
                  device_free_delta_mib=round((free1 - free0) / MiB, 3), context_bytes_delta=alloc1 - alloc0)
    print(f"soak: {report}")
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "soak.json")
        prior = json.load(open(path)) if os.path.exists(path) else []
        json.dump(prior + [report], open(path, "w"), indent=1)
    assert alloc1 == alloc0, f"the context holds {alloc1 - alloc0:+d} bytes more after {cycles} cycles"
    assert abs(free1 - free0) <= DEVICE_SLACK, f"device free memory moved by {(free1 - free0) / MiB:+.2f} MiB"
    assert rss1 - rss0 <= RSS_SLACK, f"host RSS grew by {(rss1 - rss0) / MiB:.1f} MiB in {cycles} cycles"


def _schedule(rng, n: int) -> list[int]:
    """n split into 1..6 random pieces."""
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(int(rng.integers(0, 6)), n - 1), replace=False))
    return [int(x) for x in np.diff(np.concatenate([[0], cuts, [n]]))]


def _cycle(m, rng, cfg, chunk, n=None, pieces=None):
    n = int(rng.integers(1, MAX_PROMPT + 1)) if n is None else n
    toks = random_tokens(rng, n + 8, m.n_vocab)
    s = m.session(max_tokens=CAPACITY, chunk=chunk, **cfg)
    pos = 0
    for piece in pieces or _schedule(rng, n):
        out = s.prefill(toks[pos:pos + piece], ("none", "last", "all")[int(rng.integers(0, 3))])
        assert out is None or np.isfinite(out).all()
        pos += piece
    state = s.save()
    r = m.session(max_tokens=CAPACITY, chunk=chunk, **cfg)
    r.restore(state)
    assert r.position == n
    a = s.prefill(toks[n:], "last")      # the same work from the same state: the same bits
    b = r.prefill(toks[n:], "last")
    assert np.isfinite(a).all() and np.array_equal(a, b)
    r.close()
    s.close()


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_soak_create_prefill_save_restore_destroy(preset, rng):
    from pyprefill.model import Model
    with Model.load(synth_model(preset, "q4_k_m"), progress=False) as m:
        ctx = m.ctx
        # warm-up: every config and chunk size with the longest prompt in one piece (the largest
        # attention and GEMM scratch), a one-token piece, and a random cycle, so that the
        # context's grow-on-demand scratch has its final size before the counting starts
        for cfg in CONFIGS:
            for chunk in CHUNKS:
                _cycle(m, rng, cfg, chunk, n=MAX_PROMPT, pieces=[MAX_PROMPT])
                _cycle(m, rng, cfg, chunk, n=2, pieces=[1, 1])
                _cycle(m, rng, cfg, chunk)
        before = _measure(ctx)
        t0 = time.perf_counter()
        for i in range(CYCLES):
            _cycle(m, rng, CONFIGS[i % len(CONFIGS)], int(rng.choice(CHUNKS)))
        after = _measure(ctx)
        _report_and_check(before, after, {"preset": preset, "cycles": CYCLES,
                                          "seconds": round(time.perf_counter() - t0, 2)}, CYCLES)


BATCH_CYCLES = int(os.environ.get("PF_SOAK_BATCH_CYCLES", "100"))
BATCH_CAP = 384


def _batch_cycle(m, b, rng, stats):
    """One server-loop turn: 1..8 sessions (some with snapshots every 64), 1..4 batch calls of
    ragged pieces over random subsets, forks of random members, rollbacks to a held snapshot,
    then every session destroyed in a random order."""
    live = []
    for _ in range(int(rng.integers(1, 9))):
        every, at_end = int(rng.choice([0, 64])), bool(rng.integers(0, 2))
        live.append(m.session(max_tokens=BATCH_CAP, own_executor=bool(rng.integers(0, 2)), snapshot_every=every,
                              snapshot_at_end=at_end, snapshot_slots=4 if every or at_end else 0))
    for _ in range(int(rng.integers(1, 5))):
        pick = [s for s in live if rng.random() < 0.7 and s.position < BATCH_CAP - 8] or []
        if pick:
            lens = [int(rng.integers(1, min(200, BATCH_CAP - s.position) + 1)) for s in pick]
            modes = [("last", "none", "all")[int(rng.integers(0, 3))] for _ in pick]
            out = b.prefill([{"session": s, "tokens": random_tokens(rng, n, m.n_vocab), "logits": md}
                             for s, n, md in zip(pick, lens, modes)])
            for o, md in zip(out, modes):
                assert md == "none" or np.isfinite(o["logits"]).all()
                assert 0 <= o["token"] < m.n_vocab
            stats["items"] += len(pick)
        if live and rng.random() < 0.4:
            live.append(live[int(rng.integers(0, len(live)))].fork())
            stats["forks"] += 1
        if live and rng.random() < 0.4:
            s = live[int(rng.integers(0, len(live)))]
            held, _ = s.snapshots()
            s.rollback(int(rng.choice(held)) if held else 0)     # position 0 is always held
            stats["rollbacks"] += 1
    for i in rng.permutation(len(live)):
        live[int(i)].close()


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_soak_batches_forks_snapshots(preset, rng):
    """Issue 28: random batches with forks, snapshots, rollbacks and destroys; memory flat."""
    from pyprefill.model import Model
    with Model.load(synth_model(preset, "q4_k_m"), progress=False) as m:
        ctx = m.ctx
        b = m.batch(max_items=64, step_tokens=256, max_context=BATCH_CAP)
        stats = {"items": 0, "forks": 0, "rollbacks": 0}
        for _ in range(10):                      # warm-up: graphs and grow-on-demand scratch
            _batch_cycle(m, b, rng, stats)
        before = _measure(ctx)
        t0 = time.perf_counter()
        for _ in range(BATCH_CYCLES):
            _batch_cycle(m, b, rng, stats)
        after = _measure(ctx)
        b.close()
        assert stats["forks"] and stats["items"]
        _report_and_check(before, after, {"preset": preset, "batch_cycles": BATCH_CYCLES, **stats,
                                          "seconds": round(time.perf_counter() - t0, 2)}, BATCH_CYCLES)


TREE_REQUESTS = int(os.environ.get("PF_SOAK_TREE_REQUESTS", "2000"))   # the run: 10000


def _tree_prompts(rng, vocab: int) -> list[np.ndarray]:
    """Both traces of `pyprefill bench cache` in miniature (random replies: no decoding), their
    requests interleaved: chat turns on a shared system prompt, branches of a shared context."""
    from pyprefill.bench import cache as bc
    size = bc.TraceSize(conversations=6, turns=4, system=128, user=(10, 60), reply=(5, 30), context=512,
                        branches=16, branch=(20, 120))
    script = bc.chat_script(rng, vocab, size)
    replies = [[random_tokens(rng, n, vocab) for n in r] for r in script.replies]
    chat = [bc.chat_prompt(script, c, t, replies[c]) for c, t in script.order()]
    branch = bc.branch_trace(rng, vocab, size)
    out = []
    for i in range(max(len(chat), len(branch))):
        out += ([chat[i]] if i < len(chat) else []) + ([branch[i]] if i < len(branch) else [])
    return out


@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_soak_prefix_tree(preset, rng):
    """Issue 39: requests of both cache traces through the library's prefix tree, one at a time
    and in batches of 2-4, under a device budget of 12 pages and 3 snapshots (so that nearly
    every request evicts) with a host tier of 48 pages and 8 snapshots: the tree within its
    budgets after every call, pages and snapshots moved to the host tier and back, device memory,
    the context's bytes and host RSS flat, every page back in the pool at the end.
    PF_SOAK_TREE_REQUESTS sets the count."""
    from pyprefill.model import Model
    with Model.load(synth_model(preset, "q4_k_m"), progress=False) as m:
        ctx = m.ctx
        m.kv_pool(160, page_rows=64)
        info = m.kv_pool_info()
        page = info["bytes"] // info["pages"]
        recurrent = m.info["n_layer"] > m.info["n_attn_layers"]
        prompts = _tree_prompts(rng, m.n_vocab)
        cap = max(p.size for p in prompts)
        kw, snap = {}, 0
        if recurrent:
            kw = dict(snapshot_every=128, snapshot_slots=24)
            with m.session(max_tokens=64, own_executor=False, snapshot_slots=1) as probe:
                snap = probe.snapshots()[1]
        budget = 12 * page + 3 * snap
        with m.prefix_tree(device_bytes=budget, host_bytes=48 * page + 8 * snap, **kw) as tree:
            sessions = [m.session(max_tokens=cap, paged=True) for _ in range(4)]

            def serve(i: int) -> None:
                k = int(rng.integers(2, 5)) if i % 4 == 3 else 1
                batch = [prompts[int(j)] for j in rng.integers(0, len(prompts), k)]
                if k == 1:
                    logits, tok = tree.prefill(sessions[0], batch[0], return_token=True)
                    assert np.isfinite(logits).all() and 0 <= tok < m.n_vocab
                else:
                    for o in tree.prefill_batch(sessions[:k], batch):
                        assert np.isfinite(o["logits"]).all()
                st = tree.stats
                assert st["device_bytes"] <= budget and st["host_bytes"] <= 48 * page + 8 * snap, st

            # Warm-up: graphs, scratch, the batch executor, and what the driver takes once for
            # them (graph memory, lazily loaded kernels): device free memory moved by the same
            # 4-6 MiB (over the 4 MiB slack) after 500 or 6 000 requests that followed 40 warm-up
            # ones (session 44, H200), so the first quarter of the count is warm-up too; after
            # the other files of device-check's part 4 in the same process it moved by -6 / -4
            # MiB with 540 warm-up requests and by -2 with 1 540 (6 000 measured: session 45),
            # so at least 1 000 more.
            for i in range(1000 + TREE_REQUESTS // 4):
                serve(i)
            before = _measure(ctx)
            t0 = time.perf_counter()
            for i in range(TREE_REQUESTS):
                serve(i)
            after = _measure(ctx)
            st = tree.stats
            assert st["offloaded_pages"] > 0 and st["restored_pages"] > 0 and st["evicted_pages"] > 0, st
            for s in sessions:
                s.close()
            tree.clear()
            assert m.kv_pool_info()["free"] == info["pages"], "pages not given back"
        _report_and_check(before, after, {"preset": preset, "tree_requests": TREE_REQUESTS,
                                          "seconds": round(time.perf_counter() - t0, 2),
                                          **{k: st[k] for k in ("served_tokens", "rerun_tokens", "prefilled_tokens",
                                                                "offloaded_pages", "restored_pages",
                                                                "evicted_pages")}}, TREE_REQUESTS)
