"""The prefix-reuse traces of `pyprefill bench cache` (issue 39), without a GPU: the generators'
shapes and ranges, the chat prompts' assembly, the minimum a cache must prefill, and the table."""
import numpy as np
import pytest

from pyprefill.bench import cache


def _rng(seed=5):
    return np.random.default_rng(seed)


def test_chat_script_shapes_and_ranges():
    size = cache.TraceSize(conversations=5, turns=4, system=300, user=(10, 20), reply=(3, 7))
    s = cache.chat_script(_rng(), 1000, size)
    assert len(s.system) == 300 and s.system.dtype == np.int32
    assert len(s.users) == 5 and all(len(u) == 4 for u in s.users)
    assert all(10 <= len(t) <= 20 for u in s.users for t in u)
    assert all(3 <= r <= 7 for rs in s.replies for r in rs)
    assert all(0 <= int(t.min()) and int(t.max()) < 1000 for u in s.users for t in u)
    # round-robin over the conversations, turn by turn
    assert s.order()[:6] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (0, 1)]
    assert len(s.order()) == 20


def test_chat_prompt_is_the_conversation_so_far():
    s = cache.chat_script(_rng(), 50, cache.TraceSize(conversations=2, turns=3, system=8, user=(2, 4),
                                                     reply=(1, 2)))
    replied = [np.array([7, 7], np.int32), np.array([9], np.int32)]
    p0 = cache.chat_prompt(s, 1, 0, [])
    assert np.array_equal(p0, np.concatenate([s.system, s.users[1][0]]))
    p2 = cache.chat_prompt(s, 1, 2, replied)
    want = np.concatenate([s.system, s.users[1][0], replied[0], s.users[1][1], replied[1], s.users[1][2]])
    assert np.array_equal(p2, want) and p2.dtype == np.int32
    # each turn's prompt starts with the one before it and its reply: what a cache reuses
    p1 = cache.chat_prompt(s, 1, 1, replied[:1])
    assert np.array_equal(p2[:len(p1) + len(replied[1])], np.concatenate([p1, replied[1]]))
    with pytest.raises(ValueError, match="1 replies known, 2 needed"):
        cache.chat_prompt(s, 0, 2, replied[:1])


def test_branch_trace_shares_the_context_and_extends_branches():
    size = cache.TraceSize(context=500, branches=12, branch=(10, 30), extended=0.25)
    prompts = cache.branch_trace(_rng(7), 1000, size)
    assert len(prompts) == 12 + 3
    firsts, seconds = prompts[:12], prompts[12:]
    # every first request is a prefix of the shared context (the generator's first draw) plus
    # 10-30 tokens of its own
    ctx = _rng(7).integers(0, 1000, 500, dtype=np.int32)
    for p in firsts:
        assert any(len(p) - n <= 500 and np.array_equal(p[:len(p) - n], ctx[:len(p) - n])
                   for n in range(10, 31)), "not the context's prefix plus 10-30 tokens"
    assert len({len(p) for p in firsts}) > 1   # the depths differ
    # every second request extends one of the first ones by 10-30 tokens
    for q in seconds:
        base = [p for p in firsts if len(p) < len(q) and np.array_equal(q[:len(p)], p)]
        assert base and 10 <= len(q) - len(base[-1]) <= 30
    # seeded: the same trace again
    again = cache.branch_trace(_rng(7), 1000, size)
    assert all(np.array_equal(a, b) for a, b in zip(prompts, again))


def test_distinct_prefix_tokens_counts_a_trie():
    assert cache.distinct_prefix_tokens([]) == 0
    assert cache.distinct_prefix_tokens([[1, 2, 3]]) == 3
    assert cache.distinct_prefix_tokens([[1, 2, 3], [1, 2, 3]]) == 3          # the same prompt twice
    assert cache.distinct_prefix_tokens([[1, 2, 3], [1, 2, 4]]) == 4          # a branch at the end
    assert cache.distinct_prefix_tokens([[1, 2], [1, 2, 5, 6]]) == 4          # an extension
    assert cache.distinct_prefix_tokens([[1, 2, 3], [4, 2, 3], [1, 9]]) == 3 + 3 + 1
    # against a trie built by hand on random prompts with shared prefixes
    rng = _rng(11)
    base = rng.integers(0, 3, 40)
    prompts = [np.concatenate([base[:rng.integers(0, 41)], rng.integers(0, 3, rng.integers(0, 10))])
               for _ in range(30)]
    trie, nodes = {}, 0
    for p in prompts:
        node = trie
        for t in p.tolist():
            if t not in node:
                node[t] = {}
                nodes += 1
            node = node[t]
    assert cache.distinct_prefix_tokens(prompts) == nodes


def test_trace_row_and_table():
    prompts = [np.arange(10, dtype=np.int32), np.arange(12, dtype=np.int32)]
    r = cache.trace_row("qwen35-4b", "branch", "cache off (cold)", [2.0, 4.0], prompts, 22, 3 * 2**30)
    assert r["min_tokens"] == 12 and r["prompt_tokens"] == 22
    assert r["prefilled_vs_min"] == pytest.approx(22 / 12)
    assert r["ttft_p50_ms"] == pytest.approx(3.0)
    t = cache.table([r]).splitlines()
    assert t[0].startswith("Prefix reuse traces")
    assert t[-1] == "| qwen35-4b | branch | cache off (cold) | 2 | 3.00 | 3.98 |  | 22 | 22 | 12 | 1.83 |  | 3.00 |  |"
    r = cache.trace_row("m", "chat", "cache on (tree)", [1.0], prompts[:1], 10, 2**30, 3 * 2**29)
    assert cache.table([r]).splitlines()[-1].endswith("| 1.00 | 1.50 |")
    r = cache.trace_row("m", "chat", "cache on (tree, N=512)", [1.0], prompts[:1], 10, 2**30, 0, 512, 77)
    assert r["snapshot_every"] == 512 and cache.table([r]).splitlines()[-1].endswith("| 77 | 1.00 | 0.00 |")


def test_side_runs():
    """The sides in their fixed order, the cold side once, each cache side once per N of a sweep."""
    assert cache.side_runs(None, None) == [("cold", "cache off (cold)", None), ("sessions", "cache on (sessions)", None),
                                            ("pages", "cache on (pages)", None), ("tree", "cache on (tree)", None)]
    assert cache.side_runs(["tree", "cold"], [512]) == [("cold", "cache off (cold)", None),
                                                       ("tree", "cache on (tree)", 512)]
    assert cache.side_runs(["tree", "pages"], [256, 1024]) == [
        ("pages", "cache on (pages, N=256)", 256), ("pages", "cache on (pages, N=1024)", 1024),
        ("tree", "cache on (tree, N=256)", 256), ("tree", "cache on (tree, N=1024)", 1024)]
    with pytest.raises(ValueError, match="'forest'"):
        cache.side_runs(["forest"], None)
    with pytest.raises(ValueError, match="'forest'"):
        cache.run(None, None, models=[], quick=True, sides=["forest"])
    with pytest.raises(ValueError, match="snapshot_every=100"):
        cache.run(None, None, models=[], quick=True, snapshot_every=[512, 100])


def test_snapshot_every_option():
    assert cache._every(False, None) == 1024 and cache._every(True, None) == 256 and cache._every(True, 512) == 512
    with pytest.raises(ValueError, match="multiple of 64"):
        cache.run(None, None, models=[], quick=True, snapshot_every=100)


def test_table_with_attach_rows():
    r = cache.trace_row("m", "chat", "cache on (sessions)", [1.0], [np.arange(4, dtype=np.int32)], 4, None)
    a = {"model": "m", "case": "attach 8192 of 8192 tokens (its end)", "median_ms": 0.4321}
    t = cache.table([r, a]).splitlines()
    assert t[-3:] == ["| model | case | median ms |", "|---|---|---:|", "| m | attach 8192 of 8192 tokens (its end) | 0.432 |"]


def test_quick_sizes_are_small():
    q = cache.QUICK
    assert q.system + q.turns * (q.user[1] + q.reply[1]) <= 1024 and q.context + 2 * q.branch[1] <= 2048


def test_loaded_models_closes_each_before_the_next(monkeypatch):
    """bench.model.loaded_models (the batch and cache suites' loop): one model at a time, each
    closed with its context before the next loads; a preset whose GGUF or load fails is skipped
    with its reason and the others still run."""
    import pyprefill.core
    import pyprefill.model
    from pyprefill.bench import model as bm
    from pyprefill.bench._common import Recorder
    events = []

    class Ctx:
        def __init__(self, device):
            events.append("ctx")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append("ctx closed")

    class M:
        def __init__(self, path):
            self.path = path

        @classmethod
        def load(cls, path, progress, context):
            if "bad" in path:
                raise RuntimeError("no such weights")
            events.append(f"load {path}")
            return cls(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append(f"close {self.path}")

    def synth(rec, preset, mix, directory):
        if preset == "nofile":
            raise OSError("disk full")
        return preset

    monkeypatch.setattr(pyprefill.core, "Context", Ctx)
    monkeypatch.setattr(pyprefill.model, "Model", M)
    monkeypatch.setattr(bm, "synthetic_gguf", synth)
    rec = Recorder(False)
    seen = []
    for preset, path, model in bm.loaded_models(rec, ["a", "nofile", "bad", "b"], "q4_k_m", None):
        seen.append(preset)
        events.append(f"use {preset}")
    assert seen == ["a", "b"]
    assert events == ["ctx", "load a", "use a", "close a", "ctx closed", "ctx", "ctx closed",
                      "ctx", "load b", "use b", "close b", "ctx closed"]
    reasons = " ".join(str(s) for s in rec.skipped)
    assert "disk full" in reasons and "no such weights" in reasons


class _Echo:
    """A fake model for chat_replies / serve_chat: a session's greedy token is a hash of every
    token it has seen (so a wrong prompt or a lost decode step changes the replies)."""
    n_vocab = 1000

    class Session:
        def __init__(self, model, max_tokens):
            self.model, self.max_tokens, self.seen, self.closed = model, max_tokens, [], False

        def reset(self):
            self.seen = []

        def close(self):
            self.closed = True

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def tok(self):
            return int(sum((i + 1) * t for i, t in enumerate(self.seen)) % _Echo.n_vocab)

    def __init__(self):
        self.sessions, self.batches = [], []

    def session(self, max_tokens, own_executor=True, paged=False):
        s = _Echo.Session(self, max_tokens)
        self.sessions.append(s)
        return s

    def prefill_batch(self, sessions, tokens, logits="last"):
        self.batches.append(len(sessions))
        out = []
        for s, t in zip(sessions, tokens):
            s.seen += [int(x) for x in t]
            assert len(s.seen) <= s.max_tokens
            out.append({"logits": None, "token": s.tok()})
        return out


def test_chat_replies_match_generating_in_each_session():
    """chat_replies (the replies batched across conversations) gives what one session per turn
    prefilling the prompt cold and decoding each token gives, and every side then serves the
    same prompts without generating."""
    size = cache.TraceSize(conversations=3, turns=3, system=5, user=(2, 4), reply=(1, 4))
    script = cache.chat_script(_rng(9), _Echo.n_vocab, size)
    model = _Echo()
    replies = cache.chat_replies(model, script)
    assert all(s.closed for s in model.sessions)
    assert max(model.batches) == 3   # the decode steps ran the conversations together
    for c in range(3):   # each conversation by hand: a cold prefill, then one token at a time
        for t in range(3):
            s = _Echo.Session(model, 10**6)
            s.seen = [int(x) for x in cache.chat_prompt(script, c, t, replies[c])]
            want = [s.tok()]
            while len(want) < script.replies[c][t]:
                s.seen.append(want[-1])
                want.append(s.tok())
            assert replies[c][t].tolist() == want, (c, t)
    calls = []   # the fake sessions have no generate: serving with replies must not call it
    ttft, prompts = cache.serve_chat(model, script, lambda s, p: calls.append(p.size) or 7, replies=replies)
    assert len(ttft) == len(prompts) == 9 and calls == [p.size for p in prompts]
    assert [p.tolist() for p in prompts] == [cache.chat_prompt(script, c, t, replies[c]).tolist()
                                             for c, t in script.order()]


def test_cli_sweep_options():
    """`pyprefill bench cache --snapshot-every 256 512 --cache-sides cold tree` reaches run()'s
    arguments; a side the suite does not have is refused by the parser."""
    from pyprefill.bench.cli import build_parser
    a = build_parser().parse_args(["cache", "--snapshot-every", "256", "512", "--cache-sides", "cold", "tree"])
    assert a.snapshot_every == [256, 512] and a.cache_sides == ["cold", "tree"]
    assert build_parser().parse_args(["cache"]).snapshot_every is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cache", "--cache-sides", "forest"])
