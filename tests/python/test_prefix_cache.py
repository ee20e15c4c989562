"""The prefix cache over sessions (pyprefill.prefix_cache, issue 39's first form).

Without a GPU, against a model double whose sessions keep their token history and snapshot
positions as the library does (snapshots every N positions and at each call's end, copy_from(pos)
only at a snapshot for a recurrent model) and whose "logits" are a function of the history: what
the cache resumes from, what it re-runs and prefills, where it keeps snapshots, exact repeats,
eviction, and the argument checks. On the GPU (qwen35-tiny and qwen3-tiny): the cache's logits
and greedy tokens against cold sessions run in the same calls, bit for bit."""
import numpy as np
import pytest
from _engine_models import random_tokens

pytest.importorskip("pyprefill._ffi", reason="libprefill not loadable (the package imports it)")

from pyprefill import errors  # noqa: E402
from pyprefill.model import Session  # noqa: E402
from pyprefill.prefix_cache import PrefixCache  # noqa: E402

V = 1000


def _logits(history) -> np.ndarray:
    h = hash(tuple(int(x) for x in history)) & 0xFFFFFFFF
    return np.array([h % 1009, h % 997, len(history)], np.float32)


class FakeSession(Session):
    """A session double: no handle, the token history, the snapshot positions."""

    def __init__(self, model, max_tokens, kv, every, at_end, slots, paged=False):   # noqa: D107  (no handle)
        self.model, self.max_tokens, self.kv, self.paged = model, max_tokens, kv, paged
        self.every, self.at_end, self.slots = every, at_end, slots
        self.history, self.snaps, self.is_closed = [], [], False

    @property
    def position(self) -> int:
        return len(self.history)

    def run(self, tokens):
        start = len(self.history)
        self.history += [int(t) for t in tokens]
        end = len(self.history)
        if self.every:
            self.snaps += [p for p in range(start + 1, end + 1) if p % self.every == 0]
        if self.at_end and end not in self.snaps:
            self.snaps.append(end)
        self.snaps = sorted(set(self.snaps))[-self.slots:] if self.slots else []

    def copy_from(self, other, pos=None):
        if pos is None:
            pos = other.position
        assert 0 <= pos <= other.position
        if other.model.recurrent and pos not in (0, other.position) and pos not in other.snaps:
            raise errors.UnsupportedError(f"no snapshot at {pos}")
        self.history, self.snaps = list(other.history[:pos]), []

    def snapshots(self):
        return list(self.snaps), 64

    # a session with its own executor, as the bench's serving loops use it
    def prefill(self, tokens, logits="last", *, return_token=False):
        self.run(tokens)
        out = _logits(self.history) if logits == "last" else None
        return (out, int(_logits(self.history)[0])) if return_token else out

    def generate(self, n):
        out = []
        for _ in range(n):
            out.append(int(_logits(self.history)[0]) % V)
            self.run([out[-1]])
        return np.array(out, np.int32)

    def reset(self):
        self.history, self.snaps = [], []

    def close(self):
        self.is_closed = True


class FakeModel:
    def __init__(self, recurrent=True, fail_at=None, pool_tokens=0):
        self.recurrent, self.n_vocab, self.fail_at = recurrent, V, fail_at
        # a KV pool of pool_tokens positions (0: none), pages of one token, no sharing: a run
        # past it raises OutOfMemoryError and changes nothing, as pf's paged runs do
        self.pool_tokens = pool_tokens
        self.info = dict(n_layer=4, n_attn_layers=1 if recurrent else 4, n_head_kv=2, head_dim=8,
                         ssm_hk=1, ssm_dk=2, ssm_hv=1, ssm_dv=2, conv_kernel=4)
        self.calls = []   # (session, tokens) of every prefill_batch
        self.made = []    # every session made
        self.batches = []  # the items of every prefill_batch
        self.reserved = []  # the arguments of every reserve_batch

    def reserve_batch(self, **kw):
        self.reserved.append(kw)

    def session(self, max_tokens, kv="f16", gemm="default", own_executor=True, snapshot_every=0,
                snapshot_at_end=False, snapshot_slots=0, paged=False):
        self.made.append(FakeSession(self, max_tokens, kv, snapshot_every, snapshot_at_end, snapshot_slots,
                                     paged))
        return self.made[-1]

    def kv_pool_info(self):
        return {"pages": self.pool_tokens, "free": self.pool_tokens - self._pool_used(), "page_rows": 1,
                "bytes": 0}

    def _pool_used(self):
        return sum(len(s.history) for s in self.made if s.paged and not s.is_closed)

    def prefill_batch(self, sessions, tokens, logits="last"):
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise errors.CudaError("injected")
        if any(s.paged for s in sessions) and \
                self._pool_used() + sum(np.asarray(t).size for t in tokens) > self.pool_tokens:
            raise errors.OutOfMemoryError("KV pool: injected")
        out = []
        for s, t in zip(sessions, tokens):
            self.calls.append((s, np.asarray(t).copy()))
            s.run(t)
            out.append({"logits": _logits(s.history) if logits == "last" else None,
                        "token": int(_logits(s.history)[0])})
        self.batches.append(len(sessions))
        return out


def _prompt(rng, n):
    return rng.integers(0, V, n, dtype=np.int32)


def test_resume_rerun_and_divergence_snapshots(rng):
    m = FakeModel()
    cache = PrefixCache(m, max_tokens=4096, snapshot_every=256)
    user = m.session(4096)
    a = _prompt(rng, 1000)
    got, tok = cache.prefill(user, a, return_token=True)
    assert np.array_equal(got, _logits(a)) and tok == int(_logits(a)[0]) and user.history == a.tolist()
    assert cache.stats["prefilled_tokens"] == 1000 and cache.stats["served_tokens"] == 0
    assert cache._entries[0].snapshots == [256, 512, 768, 1000]
    # b shares a's first 700 tokens: resumes at 512 (the deepest snapshot at or below 700), re-runs
    # 188, and its entry keeps a snapshot at the divergence point 700
    b = np.concatenate([a[:700], _prompt(rng, 300)])
    b[700] = (a[700] + 1) % V   # b leaves a exactly at 700
    assert np.array_equal(cache.prefill(user, b), _logits(b)) and user.history == b.tolist()
    assert cache.stats["served_tokens"] == 512 and cache.stats["rerun_tokens"] == 188
    assert cache.stats["prefilled_tokens"] == 1000 + 488 and cache.stats["hits"] == 1
    e = cache._entries[1]
    assert e.snapshots == [700, 768, 1000]
    assert [t.size for _, t in m.calls[-2:]] == [188, 300]    # to the divergence point, then the rest
    # c diverges at the same point: resumes at 700 exactly, nothing re-run
    c = np.concatenate([a[:700], _prompt(rng, 50)])
    c[700] = next(t for t in range(V) if t not in (a[700], b[700]))   # c leaves both at 700
    cache.prefill(user, c, "none")
    assert cache.stats["served_tokens"] == 512 + 700 and cache.stats["rerun_tokens"] == 188
    assert user.history == c.tolist()


def test_exact_repeat_and_prefix_of_an_entry(rng):
    m = FakeModel()
    cache = PrefixCache(m, max_tokens=2048, snapshot_every=256)
    user = m.session(2048)
    a = _prompt(rng, 600)
    first = cache.prefill(user, a)
    n_calls = len(m.calls)
    again, tok = cache.prefill(user, a, return_token=True)   # the same prompt: nothing runs
    assert np.array_equal(again, first) and tok == int(_logits(a)[0]) and len(m.calls) == n_calls
    assert len(cache._entries) == 1 and cache.stats["served_tokens"] == 600
    # a prefix of a ending at a snapshot (512): its last logits are not held, so one step of it
    # runs from the snapshot before (256)
    p = a[:512]
    assert np.array_equal(cache.prefill(user, p), _logits(p))
    assert m.calls[-1][1].size == 256 and user.history == p.tolist()


def test_no_recurrent_state_resumes_at_the_shared_prefix(rng):
    m = FakeModel(recurrent=False)
    cache = PrefixCache(m, max_tokens=2048, snapshot_every=256)
    user = m.session(2048)
    a = _prompt(rng, 500)
    cache.prefill(user, a)
    b = np.concatenate([a[:333], _prompt(rng, 40)])
    b[333] = (a[333] + 1) % V
    assert np.array_equal(cache.prefill(user, b), _logits(b))
    assert cache.stats["served_tokens"] == 333 and cache.stats["rerun_tokens"] == 0
    assert m.calls[-1][1].size == 40 and m.calls[-1][0].snaps == []
    # a prefix of an entry: only its last token runs again (for its logits)
    assert np.array_equal(cache.prefill(user, a[:200]), _logits(a[:200]))
    assert m.calls[-1][1].size == 1 and user.history == a[:200].tolist()


def test_least_recently_used_entries_go_first(rng):
    m = FakeModel()
    cache = PrefixCache(m, max_tokens=1024, snapshot_every=256, max_entries=2)
    user = m.session(1024)
    a, b, c = (_prompt(rng, 300) for _ in range(3))
    cache.prefill(user, a)
    cache.prefill(user, b)
    cache.prefill(user, a)            # a used again: b is now the oldest
    cache.prefill(user, c)
    kept = [e.tokens.tolist() for e in cache._entries]
    assert kept == [a.tolist(), c.tolist()] and cache.stats["evicted"] == 1
    assert cache.stats["entries"] == 2 and cache.stats["device_bytes"] == 2 * cache.entry_bytes()
    cache.clear()
    assert cache._entries == [] and cache.stats["entries"] == 0


def test_the_batch_executor_is_made_with_the_cache(rng):
    """The executor the entries run on is reserved when the cache is made (not in the first
    request's time), for the entries' context and KV dtype; requests then run on it."""
    m = FakeModel()
    cache = PrefixCache(m, max_tokens=1536, snapshot_every=256, kv="f32")
    assert m.reserved == [dict(max_context=1536, kv="f32")]
    assert not m.calls
    user = m.session(1536, kv="f32")
    cache.prefill(user, rng.integers(0, V, 300))
    assert len(m.calls) == 1 and len(m.reserved) == 1


def test_budget_in_bytes(rng):
    m = FakeModel()
    one = PrefixCache(m, max_tokens=1024, snapshot_every=256).entry_bytes()
    with pytest.raises(errors.InvalidArgumentError, match=f"budget_bytes=100 holds no entry: one takes {one}"):
        PrefixCache(m, max_tokens=1024, snapshot_every=256, budget_bytes=100)
    cache = PrefixCache(m, max_tokens=1024, snapshot_every=256, budget_bytes=2 * one + 1)
    user = m.session(1024)
    for _ in range(4):
        cache.prefill(user, _prompt(rng, 200))
    assert len(cache._entries) == 2 and cache.stats["evicted"] == 2


def test_a_failed_prefill_leaves_the_cache_as_it_was(rng):
    m = FakeModel(fail_at=1)
    cache = PrefixCache(m, max_tokens=1024, snapshot_every=256)
    user = m.session(1024)
    cache.prefill(user, _prompt(rng, 100))
    with pytest.raises(errors.CudaError, match="injected"):
        cache.prefill(user, _prompt(rng, 100))
    assert len(cache._entries) == 1 and cache.stats["requests"] == 1   # a failed request is not counted


def test_arguments_are_checked(rng):
    m, other = FakeModel(), FakeModel()
    with pytest.raises(errors.InvalidArgumentError, match="multiple of 64"):
        PrefixCache(m, max_tokens=1024, snapshot_every=100)
    with pytest.raises(errors.InvalidArgumentError, match="kv"):
        PrefixCache(m, max_tokens=1024, kv="bf16")
    cache = PrefixCache(m, max_tokens=1024, snapshot_every=256)
    user = m.session(1024)
    cases = [(lambda: cache.prefill(other.session(1024), [1, 2]), "Session of the cache's model"),
             (lambda: cache.prefill("s", [1, 2]), "Session of the cache's model"),
             (lambda: cache.prefill(user, [1, V]), "tokens"),
             (lambda: cache.prefill(user, []), "tokens: empty"),
             (lambda: cache.prefill(user, np.zeros(1025, np.int32)), "1025 tokens"),
             (lambda: cache.prefill(m.session(1024, kv="f32"), [1]), "kv='f32'"),
             (lambda: cache.prefill(user, [1], logits="all"), "logits")]
    for call, say in cases:
        with pytest.raises(errors.InvalidArgumentError, match=say):
            call()
    assert cache._entries == [] and m.calls == []


# ------------------------------------------------------------------------------------ on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_cache_matches_a_cold_run_in_the_same_calls(preset, rng):
    """Three prompts on one system prompt, the third sharing more of the second: each answer through
    the cache (last logits, greedy token) against a cold session that made the calls the cache's
    entries made for those tokens (qwen35: bitwise, the snapshots cut the steps alike; qwen3: its
    resumed rows were computed in calls of other lengths, so within the f32 leg's 1e-5), and the
    tokens served, re-run and prefilled."""
    from test_batch import _close, _model, _skw
    m = _model(preset, "f32")
    recurrent = m.info["n_layer"] > m.info["n_attn_layers"]
    V = m.n_vocab
    system = random_tokens(rng, 300, V)
    a = np.concatenate([system, random_tokens(rng, 120, V)])
    b = np.concatenate([system, random_tokens(rng, 90, V)])
    b[300] = (a[300] + 1) % V   # the prompts part exactly where the comments below say
    c = np.concatenate([b[:350], random_tokens(rng, 70, V)])
    c[350] = (b[350] + 1) % V
    # where the cold session's calls end. qwen35 (snapshots every 128): a in one call; b resumes
    # from a's entry at 256, runs to the divergence point 300, then the rest; c resumes from b's
    # entry at 300 (its divergence snapshot), runs to 350 (where c leaves b), then the rest.
    # qwen3 (no recurrent state): b resumes at 300, c at 350.
    cuts = ({"a": [420], "b": [256, 300, 390], "c": [256, 300, 350, 420]} if recurrent else
            {"a": [420], "b": [300, 390], "c": [300, 350, 420]})
    with m.prefix_cache(max_tokens=1024, snapshot_every=128, gemm="f32", kv="f32") as cache, \
            m.session(max_tokens=1024, **_skw("f32")) as user:
        for name, p in (("a", a), ("b", b), ("c", c)):
            got, tok = cache.prefill(user, p, return_token=True)
            assert user.position == p.size
            with m.session(max_tokens=1024, own_executor=False, snapshot_every=128, snapshot_at_end=True,
                           snapshot_slots=16, **_skw("f32")) as cold:
                start = 0
                for cut in cuts[name]:
                    out = m.prefill_batch([cold], [p[start:cut]], logits="last")[0]
                    start = cut
            if recurrent:
                assert np.array_equal(got, out["logits"]), f"{preset} {name}: the cache's logits differ"
                assert tok == out["token"]
            else:
                _close(got, out["logits"], "f32", f"{preset} {name} through the cache")
        st = cache.stats
        if recurrent:
            assert (st["served_tokens"], st["rerun_tokens"], st["prefilled_tokens"]) == (556, 94, 674)
        else:
            assert (st["served_tokens"], st["rerun_tokens"], st["prefilled_tokens"]) == (650, 0, 580)
        assert st["requests"] == 3 and st["hits"] == 2 and st["entries"] == 3


@pytest.mark.parametrize("recurrent", [True, False], ids=["qwen35-like", "qwen3-like"])
def test_a_batch_computes_a_shared_prefix_once(recurrent, rng):
    """Four requests on a new 500-token system prompt in one batch: the system prompt runs once
    (an entry of its own), then the four tails in one batch call; an identical prompt twice runs
    once; items that hit older entries resume there inside the batch; every answer the cold one."""
    m = FakeModel(recurrent=recurrent)
    cache = PrefixCache(m, max_tokens=4096, snapshot_every=256)
    users = [m.session(4096) for _ in range(4)]
    system = _prompt(rng, 500)
    prompts = [np.concatenate([system, _prompt(rng, n)]) for n in (30, 80, 120, 10)]
    for i in range(1, 4):   # the tails part at their first token
        prompts[i][500] = (prompts[i - 1][500] + 1) % V
    out = cache.prefill_batch(users, prompts)
    for u, p, o in zip(users, prompts, out):
        assert np.array_equal(o["logits"], _logits(p)) and o["token"] == int(_logits(p)[0])
        assert u.history == p.tolist()
    assert sum(t.size for _, t in m.calls) == 500 + 30 + 80 + 120 + 10, "the system prompt ran more than once"
    assert m.batches[-1] == 4   # the tails together
    st = cache.stats
    assert st["requests"] == 4 and st["served_tokens"] == 4 * 500 and st["prefilled_tokens"] == 740
    # a batch of an old prompt, a prompt twice and one extending an old one
    calls = len(m.calls)
    again = [prompts[1], prompts[2], prompts[2], np.concatenate([prompts[3], _prompt(rng, 40)])]
    out = cache.prefill_batch(users, again)
    for p, o in zip(again, out):
        assert np.array_equal(o["logits"], _logits(p))
    assert sum(t.size for _, t in m.calls[calls:]) == 40   # only the extension's own tokens ran
    with pytest.raises(errors.InvalidArgumentError, match="one session twice"):
        cache.prefill_batch([users[0], users[0]], prompts[:2])
    with pytest.raises(errors.InvalidArgumentError, match=r"tokens\[1\]: empty"):
        cache.prefill_batch(users[:2], [prompts[0], []])


@pytest.mark.parametrize("recurrent", [True, False], ids=["qwen35-like", "qwen3-like"])
def test_random_traces_keep_the_invariants(recurrent, rng):
    """Property test over random traces of prompts that share prefixes at random depths (a small
    vocabulary, so that chance matches happen too), a small entry limit: every answer is the cold
    answer, the caller's session holds exactly the prompt, no resume point passes the shared
    prefix or (qwen35) misses a snapshot, the token counts add up, and no more than max_entries
    entries live, every evicted one closed."""
    m = FakeModel(recurrent=recurrent)
    cache = PrefixCache(m, max_tokens=2048, snapshot_every=64, max_entries=4)
    user = m.session(2048)
    small = 3   # tokens 0..2: shared prefixes arise by chance as well as by construction
    pool = [rng.integers(0, small, rng.integers(1, 600), dtype=np.int32) for _ in range(6)]
    for step in range(120):
        base = pool[rng.integers(len(pool))]
        cut = int(rng.integers(0, base.size + 1))
        p = np.concatenate([base[:cut], rng.integers(0, small, rng.integers(0 if cut else 1, 200), dtype=np.int32)])
        if rng.random() < 0.3:
            pool.append(p)
        st0 = dict(cache.stats)
        calls0 = len(m.calls)
        got = cache.prefill(user, p)
        assert np.array_equal(got, _logits(p)), f"step {step}: not the cold answer"
        assert user.history == p.tolist()
        st = cache.stats
        served = st["served_tokens"] - st0["served_tokens"]
        prefilled = st["prefilled_tokens"] - st0["prefilled_tokens"]
        assert served + prefilled == p.size and st["prompt_tokens"] - st0["prompt_tokens"] == p.size
        ran = sum(t.size for _, t in m.calls[calls0:])
        assert ran == prefilled, f"step {step}: {ran} tokens ran, {prefilled} counted"
        assert len(cache._entries) <= 4 and st["entries"] == len(cache._entries)
        live = {id(e.session) for e in cache._entries}
        for e in cache._entries:
            if recurrent:   # every entry's snapshots are real positions of its own prompt
                assert all(0 < q <= e.tokens.size for q in e.snapshots)
        for s in m.made:   # the entries live, every other session the cache made is closed
            if s is not user:
                assert s.is_closed == (id(s) not in live), f"step {step}: an entry's session left open or closed"
    assert cache.stats["hits"] > 0 and cache.stats["evicted"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_a_batch_through_the_cache_matches_cold_sessions(preset, rng):
    """Three requests on one new system prompt in one batch, then again with one extended: each
    item's last logits within the f32 leg's 1e-5 of one cold call of its prompt (the calls differ:
    the shared prefix ran once, then the tails), and the greedy continuation of each caller's
    session equal to the cold session's."""
    from test_batch import _close, _model, _skw
    m = _model(preset, "f32")
    V = m.n_vocab
    system = random_tokens(rng, 260, V)
    prompts = [np.concatenate([system, random_tokens(rng, n, V)]) for n in (5, 64, 130)]
    for i in range(1, 3):
        prompts[i][260] = (prompts[i - 1][260] + 1) % V
    with m.prefix_cache(max_tokens=1024, snapshot_every=128, gemm="f32", kv="f32") as cache:
        users = [m.session(max_tokens=1024, **_skw("f32")) for _ in prompts]
        try:
            for batch in (prompts, [prompts[0], np.concatenate([prompts[1], random_tokens(rng, 40, V)]), prompts[2]]):
                out = cache.prefill_batch(users, batch)
                for u, p, o in zip(users, batch, out):
                    with m.session(max_tokens=1024, **_skw("f32")) as cold:
                        want = cold.prefill(p, "last")
                        _close(o["logits"][None], want[None], "f32", f"{preset} {p.size} tokens via the cache")
                        assert u.position == p.size
                        assert np.array_equal(u.generate(3), cold.generate(3))
        finally:
            for u in users:
                u.close()
        assert cache.stats["requests"] == 6 and cache.stats["hits"] >= 4


def test_the_bench_serves_a_chat_the_same_with_the_cache(rng):
    """pyprefill bench cache's serving loop (bench.cache.serve_chat) on the chat trace, cold and
    through the cache: the same prompts (the replies are the same greedy tokens), the cache
    prefilling fewer tokens than the cold side, and at least the trace's minimum."""
    from pyprefill.bench import cache as bc
    size = bc.TraceSize(conversations=3, turns=3, system=300, user=(20, 40), reply=(5, 9))
    m = FakeModel()
    script = bc.chat_script(rng, V, size)
    _, cold = bc.serve_chat(m, script, bc.cold_first, lambda s: s.reset())
    with PrefixCache(m, max_tokens=script.capacity(), snapshot_every=64) as cache:
        ttft, warm = bc.serve_chat(m, script, bc.cached_first(cache))
        assert [p.tolist() for p in warm] == [p.tolist() for p in cold]
        least = bc.distinct_prefix_tokens(warm)
        assert least <= cache.stats["prefilled_tokens"] < sum(p.size for p in cold)
        assert len(ttft) == 9 and cache.stats["requests"] == 9


def test_paged_cache_evicts_when_the_pool_is_short(rng):
    """paged=True: the entries are paged sessions, the callers' must be paged too; a run the pool
    cannot hold drops the least recently used entry not in use (its pages come back) and runs
    again, with the same result; without an entry to drop the error goes to the caller."""
    m = FakeModel(pool_tokens=2600)
    with pytest.raises(errors.InvalidArgumentError, match="no KV pool"):
        PrefixCache(FakeModel(), max_tokens=4096, paged=True)
    cache = PrefixCache(m, max_tokens=4096, snapshot_every=256, paged=True)
    assert cache.entry_bytes() < PrefixCache(FakeModel(), max_tokens=4096, snapshot_every=256).entry_bytes()
    with pytest.raises(errors.InvalidArgumentError, match="paged=False, the cache's entries paged=True"):
        cache.prefill(m.session(4096), _prompt(rng, 10))
    user = m.session(4096, paged=True)
    a, b, c = _prompt(rng, 1000), _prompt(rng, 1000), _prompt(rng, 900)
    cache.prefill(user, a)
    cache.prefill(user, b)                   # user 1000 + entries a, b: 3000 > 2600? a's entry goes
    assert cache.stats["evicted"] == 1 and [e.tokens.size for e in cache._entries] == [1000]
    assert np.array_equal(cache.prefill(user, c), _logits(c)) and user.history == c.tolist()
    assert cache.stats["evicted"] == 2
    big = FakeModel(pool_tokens=500)
    with pytest.raises(errors.OutOfMemoryError):
        PrefixCache(big, max_tokens=4096, paged=True).prefill(big.session(4096, paged=True), _prompt(rng, 600))


def test_the_bench_serves_a_chat_the_same_on_pages(rng):
    """The bench's serving loop with paged=True (the serving session paged, the cache's entries
    paged): the same prompts and tokens as the contiguous cache on the chat trace."""
    from pyprefill.bench import cache as bc
    size = bc.TraceSize(conversations=3, turns=3, system=300, user=(20, 40), reply=(5, 9))
    m = FakeModel(pool_tokens=100000)
    script = bc.chat_script(rng, V, size)
    with PrefixCache(m, max_tokens=script.capacity(), snapshot_every=64) as flat:
        _, want = bc.serve_chat(m, script, bc.cached_first(flat))
    with PrefixCache(m, max_tokens=script.capacity(), snapshot_every=64, paged=True) as cache:
        ttft, got = bc.serve_chat(m, script, bc.cached_first(cache), paged=True)
        assert [p.tolist() for p in got] == [p.tolist() for p in want] and len(ttft) == 9
        assert all(s.paged for s in m.made[-cache.stats["entries"]:])


@pytest.mark.parametrize("recurrent", [True, False])
def test_plan_finds_what_comparing_every_entry_finds(recurrent, rng):
    """_plan tries the entries in the order of _bound and stops early: on random entries (a
    shared 'system prompt', ties of use) it returns the resume, the shared prefix and the use
    tick that comparing every entry returns."""
    from pyprefill.prefix_cache import _Entry
    cache = PrefixCache.__new__(PrefixCache)   # no model: _plan reads only the entries
    cache._recurrent = recurrent
    system = rng.integers(0, 50, 300)
    cache._entries = []
    for _ in range(60):
        t = np.concatenate([system[:int(rng.integers(0, 301))], rng.integers(0, 50, int(rng.integers(1, 400)))])
        snaps = sorted({int(s) for s in rng.integers(1, t.size + 1, 4)} | {t.size}) if recurrent else []
        cache._entries.append(_Entry(None, t.astype(np.int32), snaps, None, 0, int(rng.integers(0, 4))))
    for _ in range(200):
        base = cache._entries[int(rng.integers(0, 60))].tokens
        p = np.concatenate([base[:int(rng.integers(0, base.size + 1))], rng.integers(0, 50, int(rng.integers(1, 50)))])
        p = p.astype(np.int32)
        want = None
        for e in cache._entries:
            m, r = cache._resume(e, p)
            if want is None or r > want[2] or (r == want[2] and e.tick > want[0].tick):
                want = (e, m, r)
        got = cache._plan(p)
        assert (got[1], got[2], got[0].tick) == (want[1], want[2], want[0].tick)
