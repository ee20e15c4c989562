"""Prefix reuse (issue 39): the two generated request traces of the issue and what serving them
costs, per request the time to first token, per trace p50 / p99, the prompt tokens prefilled
against the trace's minimum (each distinct prefix once) and the device bytes.

(a) chat: conversations x turns on a shared system prompt; a turn's prompt is the conversation so
    far (system prompt, every earlier user turn and reply) and the new user turn; the reply is
    greedy tokens from the model, which the next turn's prompt includes.
(b) branching: a shared long context; branches that keep its first d tokens (d at random) and add
    their own, some of them extended again by a later request.

Sides: "cache off" serves every request with a cold prefill from position 0 (one session, reset
before each): the baseline every cache is measured against. "cache on" serves them through
`model.prefix_cache` (pyprefill.prefix_cache: entries that are whole sessions, a hit attached by a
device copy of the KV rows), with snapshots every 1024 positions (256 with --quick;
--snapshot-every sets it for every cache side) and half the free device memory as its budget.
"cache on (pages)": the same cache on paged sessions
(`paged=True`: a pool of KV pages of half the free device memory, made for it; entries and the
serving session share the pages of common prefixes, a hit copies only the recurrent state).
"cache on (tree)": the library's tree (Model.prefix_tree: pf_prefix_cache) over a pool of half the
free device memory: each distinct prefix held once in pages, snapshots in slots of its own.
Per side the context's device bytes at its end and the cache's own (its entries' states and
snapshots and, paged, the pool's pages in use; the tree's pages and snapshots).

The traces are pure functions of a seed (chat_script, branch_trace) and the minimum a cache must
prefill (distinct_prefix_tokens) is computed from the prompts as served, so both are checked on a
machine without a GPU (tests/python/test_bench_cache.py).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from ._common import first_line


@dataclasses.dataclass(frozen=True)
class TraceSize:
    """The generator's parameters: (lo, hi) ranges are inclusive token counts."""
    conversations: int = 32
    turns: int = 8
    system: int = 2048
    user: tuple[int, int] = (100, 600)
    reply: tuple[int, int] = (100, 300)
    context: int = 16384
    branches: int = 64
    branch: tuple[int, int] = (200, 2000)
    extended: float = 0.25   # the fraction of branches a later request extends


FULL = TraceSize()
QUICK = TraceSize(conversations=4, turns=3, system=256, user=(20, 60), reply=(8, 16), context=1024,
                  branches=8, branch=(32, 128))


@dataclasses.dataclass
class ChatScript:
    """The chat trace before the model has replied: the system prompt, per conversation per turn
    the user's tokens and the reply's length. Requests go round-robin over the conversations, turn
    by turn (every conversation's turn t before any turn t + 1), as concurrent users would send."""
    system: np.ndarray
    users: list[list[np.ndarray]]   # [conversation][turn]
    replies: list[list[int]]        # [conversation][turn] tokens generated after the turn's prompt

    def order(self) -> list[tuple[int, int]]:
        return [(c, t) for t in range(len(self.users[0])) for c in range(len(self.users))]

    def capacity(self) -> int:
        """The positions the longest conversation reaches (its every turn and reply)."""
        return max(len(self.system) + sum(len(u) + r for u, r in zip(us, rs))
                   for us, rs in zip(self.users, self.replies))


def _randint(rng, lo_hi: tuple[int, int]) -> int:
    return int(rng.integers(lo_hi[0], lo_hi[1] + 1))


def chat_script(rng, vocab: int, size: TraceSize = FULL) -> ChatScript:
    system = rng.integers(0, vocab, size.system, dtype=np.int32)
    users = [[rng.integers(0, vocab, _randint(rng, size.user), dtype=np.int32) for _ in range(size.turns)]
             for _ in range(size.conversations)]
    replies = [[_randint(rng, size.reply) for _ in range(size.turns)] for _ in range(size.conversations)]
    return ChatScript(system, users, replies)


def chat_prompt(script: ChatScript, c: int, t: int, replied: list[np.ndarray]) -> np.ndarray:
    """Turn t's prompt of conversation c: the system prompt, then each earlier turn's user tokens
    and reply (replied[i]: the tokens the model generated after turn i), then turn t's user tokens."""
    if len(replied) < t:
        raise ValueError(f"conversation {c} turn {t}: {len(replied)} replies known, {t} needed")
    parts = [script.system]
    for i in range(t):
        parts += [script.users[c][i], replied[i]]
    parts.append(script.users[c][t])
    return np.concatenate(parts).astype(np.int32)


def branch_trace(rng, vocab: int, size: TraceSize = FULL) -> list[np.ndarray]:
    """The branching trace's prompts in the order they are sent: each branch keeps the shared
    context's first d tokens (d uniform in [0, context]) and adds 200-2000 of its own; a quarter of
    the branches (size.extended) come back later as a longer request (the branch plus 200-2000 more
    tokens), after every first request."""
    context = rng.integers(0, vocab, size.context, dtype=np.int32)
    firsts = []
    for _ in range(size.branches):
        d = int(rng.integers(0, size.context + 1))
        own = rng.integers(0, vocab, _randint(rng, size.branch), dtype=np.int32)
        firsts.append(np.concatenate([context[:d], own]).astype(np.int32))
    n_ext = int(round(size.extended * size.branches))
    again = rng.choice(size.branches, size=n_ext, replace=False) if n_ext else []
    seconds = [np.concatenate([firsts[b], rng.integers(0, vocab, _randint(rng, size.branch), dtype=np.int32)])
               for b in again]
    return firsts + seconds


def distinct_prefix_tokens(prompts) -> int:
    """The tokens a perfect prefix cache prefills for these prompts: the positions of a trie of
    them (each distinct prefix once), = sum of lengths - sum of the longest common prefixes of
    neighbours in lexicographic order."""
    seqs = sorted(tuple(int(x) for x in p) for p in prompts)
    total = sum(len(s) for s in seqs)
    for a, b in zip(seqs, seqs[1:]):
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        total -= i
    return total


def percentile(xs, q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, np.float64), q)) if len(xs) else None


def _timed(first, s, p) -> tuple[float, int]:
    """(ms, the first token): first(s, p) prefills p into s and returns its greedy token (on the
    host, so the time is the time to first token)."""
    t0 = time.perf_counter()
    tok = first(s, p)
    return (time.perf_counter() - t0) * 1e3, int(tok)


def chat_replies(model, script: ChatScript) -> list[list[np.ndarray]]:
    """The trace's replies, computed once before any side is timed, so that every side serves the
    same prompts and no side's time is spent decoding: per turn, each conversation's prompt so far
    prefilled cold from position 0 (its own session), then every conversation's reply decoded
    greedily together, one batch of one token per conversation per step (model.prefill_batch: 32
    decode items at once instead of 32 x 300 single steps, which took most of a device call)."""
    n_conv, n_turns = len(script.users), len(script.users[0])
    replied: list[list[np.ndarray]] = [[] for _ in range(n_conv)]
    sessions = []
    try:
        for _ in range(n_conv):
            sessions.append(model.session(max_tokens=script.capacity(), own_executor=False))
        for t in range(n_turns):
            toks = []
            for c, s in enumerate(sessions):
                s.reset()
                out = model.prefill_batch([s], [chat_prompt(script, c, t, replied[c])], logits="none")
                toks.append([int(out[0]["token"])])
            for step in range(1, max(script.replies[c][t] for c in range(n_conv))):
                live = [c for c in range(n_conv) if script.replies[c][t] > step]
                outs = model.prefill_batch([sessions[c] for c in live],
                                           [np.array([toks[c][-1]], np.int32) for c in live], logits="none")
                for c, o in zip(live, outs):
                    toks[c].append(int(o["token"]))
            for c in range(n_conv):
                replied[c].append(np.array(toks[c][:script.replies[c][t]], np.int32))
    finally:
        for s in sessions:
            s.close()
    return replied


def serve_chat(model, script: ChatScript, first, before=None, paged: bool = False,
               replies: list[list[np.ndarray]] | None = None) -> tuple[list[float], list[np.ndarray]]:
    """Every turn of the chat trace, in order, into its conversation's session: before(s) (not in
    the time), the turn's prompt through first(s, p) (timed), then the reply: replies[c][t] when
    given (chat_replies), else generated in the session (not in the time). Returns the times to
    first token (ms) and the prompts as served. paged: the session's KV rows in the model's pool."""
    replied: list[list[np.ndarray]] = [[] for _ in script.users]
    ttft, prompts = [], []
    with model.session(max_tokens=script.capacity(), paged=paged) as s:
        for c, t in script.order():
            p = chat_prompt(script, c, t, replies[c] if replies is not None else replied[c])
            if before is not None:
                before(s)
            ms, tok = _timed(first, s, p)
            ttft.append(ms)
            prompts.append(p)
            if replies is not None:
                continue
            n = script.replies[c][t]   # the reply: the first token and n - 1 more, each fed back
            rest = s.generate(n - 1) if n > 1 else np.empty(0, np.int32)
            replied[c].append(np.concatenate([np.array([tok], np.int32), rest[:n - 1]]).astype(np.int32))
    return ttft, prompts


def serve(model, prompts, first, before=None, paged: bool = False) -> list[float]:
    """Each prompt, in order, into one session: before(s) (not in the time), then first(s, p)
    (timed). Times to first token (ms). paged: the session's KV rows in the model's pool."""
    ttft = []
    with model.session(max_tokens=max(len(p) for p in prompts), paged=paged) as s:
        for p in prompts:
            if before is not None:
                before(s)
            ttft.append(_timed(first, s, p)[0])
    return ttft


def cold_first(s, p) -> int:
    """Cache off: the prompt from position 0 (the caller reset the session)."""
    return s.prefill(p, "none", return_token=True)[1]


def cached_first(cache):
    """Cache on: the prompt through the cache."""
    return lambda s, p: cache.prefill(s, p, "none", return_token=True)[1]


def trace_row(label: str, trace: str, impl: str, ttft: list[float], prompts, prefilled: int,
              device_bytes: int | None, cache_bytes: int | None = None, every: int | None = None,
              rerun: int | None = None) -> dict:
    """device_bytes: the context's allocation at the side's end; cache_bytes: the cache's own
    (entries' states and snapshots, the pool pages in use for the paged side; the tree's pages and
    snapshots); every: the side's N (None: the default or none); rerun: the tokens the side ran
    again below a hit (the tree counts them)."""
    total = sum(len(p) for p in prompts)
    least = distinct_prefix_tokens(prompts)
    return {"model": label, "trace": trace, "impl": impl, "requests": len(ttft),
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "ttft_ms": ttft, "prompt_tokens": total, "prefilled_tokens": prefilled,
            "min_tokens": least, "prefilled_vs_min": prefilled / least if least else None,
            "device_bytes": device_bytes, "cache_bytes": cache_bytes, "snapshot_every": every,
            "rerun_tokens": rerun}


def _say(rec, r: dict) -> None:
    rec.say(f"  {r['model']:12s} {r['trace']:7s} {r['impl']:20s} {r['requests']:4d} requests  TTFT p50 "
            f"{r['ttft_p50_ms']:8.2f} ms p99 {r['ttft_p99_ms']:8.2f} ms  prefilled {r['prefilled_tokens']} "
            f"tokens ({r['prefilled_vs_min']:.2f}x the minimum {r['min_tokens']})")


def bench_attach(rec, model, label: str, T: int, reps: int = 5) -> list[dict]:
    """What a hit costs to attach today (the issue's target: <= 0.1 ms for 8192 tokens with pages
    shared): Session.copy_from(entry, pos) of a T-token entry at its end (pf_session_copy) and at a
    snapshot halfway (pf_session_copy_prefix: KV rows and a snapshot's recurrent state), each the
    median of `reps` batches of device copies (synchronized)."""
    from .timer import HostClock, measure
    every = max(64, T // 2 // 64 * 64)
    rows = []
    rng = np.random.default_rng(7)
    with model.session(max_tokens=T, own_executor=False, snapshot_every=every, snapshot_at_end=True,
                       snapshot_slots=T // every + 2) as src, model.session(max_tokens=T) as dst:
        model.prefill_batch([src], [rng.integers(0, model.n_vocab, T, dtype=np.int32)], logits="none")
        for pos, what in ((T, "its end"), (every, "a snapshot")):
            t = measure(lambda _i: dst.copy_from(src, pos=pos), HostClock(model.ctx.synchronize), reps=reps,
                        warmup=2, max_calls=20)
            r = {"model": label, "case": f"attach {pos} of {T} tokens ({what})", "median_ms": t["median_ms"],
                 "pos": pos, "tokens": T}
            rec.say(f"  {label} attach a cached prefix of {pos} tokens ({what}): {t['median_ms']:.3f} ms")
            rows.append(r)
    return rows


def _pool_of_half_free(model) -> tuple[int, int]:
    """The model's KV pool made of half the free device memory, in pages of the attention
    kernel's tile multiple (fp16 K and V rows of every attention layer): (its pages, the bytes of
    one)."""
    from ..kernels.attention import tile_page_rows
    info = model.info
    rows = tile_page_rows(info["head_dim"])
    page = rows * info["n_attn_layers"] * 2 * info["n_head_kv"] * info["head_dim"] * 2
    pages = max(1, model.ctx.memory()[0] // 2 // page)
    model.kv_pool(pages, page_rows=rows)
    return pages, page


def _cache_for(model, max_tokens: int, quick: bool, paged: bool = False, every: int | None = None):
    """The cache of a "cache on" side: half the free device memory its budget; paged, a pool of
    half the free memory made first (its pages hold the KV rows; the budget counts the states)."""
    free, _ = model.ctx.memory()
    if paged:
        _pool_of_half_free(model)
        free, _ = model.ctx.memory()
    return model.prefix_cache(max_tokens=max_tokens, snapshot_every=_every(quick, every), max_entries=1024,
                              budget_bytes=free // 2, paged=paged)


def _every(quick: bool, every: int | None) -> int:
    """The caches' snapshot_every: the option's, else 1024 (256 with --quick)."""
    return every if every is not None else (256 if quick else 1024)


def _pool_bytes(model) -> int:
    """The device bytes of the model's KV pool pages in use (the paged sides' KV rows)."""
    info = model.kv_pool_info()
    return (info["pages"] - info["free"]) * (info["bytes"] // info["pages"]) if info["pages"] else 0


def _tree_for(model, quick: bool, every: int | None = None):
    """The "cache on (tree)" side: the library's tree (Model.prefix_tree) over a pool of half the
    free device memory, a device budget of half that pool, no host tier."""
    pages, page = _pool_of_half_free(model)
    info = model.info
    recurrent = info["n_layer"] > info["n_attn_layers"]
    return model.prefix_tree(snapshot_every=_every(quick, every) if recurrent else 0,
                             snapshot_slots=256 if recurrent else 0, device_bytes=pages * page // 2)


def tree_first(tree):
    """Cache on (tree): the prompt through the library's prefix tree."""
    return lambda s, p: tree.prefill(s, p, "none", return_token=True)[1]


SIDES = {"cold": "cache off (cold)", "sessions": "cache on (sessions)", "pages": "cache on (pages)",
         "tree": "cache on (tree)"}


def side_runs(sides, every) -> list[tuple[str, str, int | None]]:
    """(side key, impl label, N) of each side to run, in SIDES' order: the cold side once, each cache
    side once per N of `every` (None or one N: the plain labels; several: ", N=..." in each label,
    the sweep)."""
    sides = list(SIDES) if sides is None else list(sides)
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise ValueError(f"sides: {unknown} not among {list(SIDES)}")
    evs = every if isinstance(every, (list, tuple)) else [every]
    out = []
    for key in SIDES:
        if key not in sides:
            continue
        if key == "cold":
            out.append((key, SIDES[key], None))
            continue
        for ev in evs:
            label = SIDES[key] if len(evs) == 1 else SIDES[key][:-1] + f", N={ev})"
            out.append((key, label, ev))
    return out


def bench_model(rec, model, label: str, size: TraceSize, seed: int = 39, quick: bool = False,
                every=None, sides=None) -> list[dict]:
    """Both traces, cache off then on. The chat replies are the model's greedy tokens, computed
    once (chat_replies) and served by every side, so every side prefills the same prompts; when
    that fails, each side generates its own (then on the default leg a near tie may pick another
    token and the conversation differ from there); each row's minimum is of the prompts that
    side served. every: the caches' N, or a list of them (each cache side once per N); sides: the
    keys of SIDES to run (None: all)."""
    runs = side_runs(sides, every)
    rows = []
    rng = np.random.default_rng(seed)
    V = model.n_vocab
    script = chat_script(rng, V, size)
    branches = branch_trace(rng, V, size)
    t0 = time.perf_counter()
    replies = rec.guard(f"{label} chat replies", chat_replies, model, script)
    if replies is not None:
        rec.say(f"  {label} chat: the replies of {sum(map(len, replies))} turns computed in "
                f"{time.perf_counter() - t0:.1f} s (not timed)")
    for trace in ("chat", "branch"):
        for side, impl, n_every in runs:
            try:
                rerun = None
                if side == "cold":
                    reset = lambda s: s.reset()   # noqa: E731
                    if trace == "chat":
                        ttft, prompts = serve_chat(model, script, cold_first, reset, replies=replies)
                    else:
                        ttft, prompts = serve(model, branches, cold_first, reset), branches
                    prefilled, held, own = sum(len(p) for p in prompts), model.ctx.allocated(), None
                elif side == "tree":
                    with _tree_for(model, quick, n_every) as tree:
                        if trace == "chat":
                            ttft, prompts = serve_chat(model, script, tree_first(tree), paged=True, replies=replies)
                        else:
                            ttft, prompts = serve(model, branches, tree_first(tree), paged=True), branches
                        prefilled, held = tree.stats["prefilled_tokens"], model.ctx.allocated()
                        own, rerun = tree.stats["device_bytes"], tree.stats["rerun_tokens"]
                        rec.say(f"  {label} {trace} tree: {tree.stats}")
                else:
                    longest = script.capacity() if trace == "chat" else max(len(p) for p in branches)
                    paged = side == "pages"
                    with _cache_for(model, longest, quick, paged, n_every) as cache:
                        if trace == "chat":
                            ttft, prompts = serve_chat(model, script, cached_first(cache), paged=paged,
                                                       replies=replies)
                        else:
                            ttft, prompts = serve(model, branches, cached_first(cache), paged=paged), branches
                        prefilled, held = cache.stats["prefilled_tokens"], model.ctx.allocated()
                        own = cache.stats["device_bytes"] + (_pool_bytes(model) if paged else 0)
                        rec.say(f"  {label} {trace} cache: {cache.stats}")
                r = trace_row(label, trace, impl, ttft, prompts, prefilled, held, own, n_every, rerun)
                _say(rec, r)
                rows.append(r)
            except Exception as exc:   # noqa: BLE001  one line says why
                rec.skip(f"{label} {trace} {impl}", f"{type(exc).__name__}: {first_line(exc)}")
    rows_attach = rec.guard(f"{label} attach", bench_attach, rec, model, label, 1024 if quick else 8192) or []
    off = {r["trace"]: r for r in rows if r["impl"].startswith("cache off")}
    for on in rows:   # each "cache on" side against the cold side of its trace
        cold = off.get(on["trace"])
        if on["impl"].startswith("cache on") and cold and on["ttft_p50_ms"]:
            on["p50_vs_off"] = cold["ttft_p50_ms"] / on["ttft_p50_ms"]
            rec.say(f"  {label} {on['trace']} {on['impl']}: TTFT p50 {on['p50_vs_off']:.1f}x lower than cold")
    return rows + rows_attach


def run(rec, torch, *, models, quick: bool, mix: str = "q4_k_m", gguf_dir: str | None = None,
        snapshot_every=None, sides=None) -> dict:
    """The cache suite over each preset's synthetic GGUF (torch unused: no peer serves these).
    snapshot_every: the caches' N (None: 1024, 256 with quick), or a list of them (the sweep: each
    cache side once per N); sides: the keys of SIDES to run (None: all)."""
    from .model import loaded_models
    evs = snapshot_every if isinstance(snapshot_every, (list, tuple)) else [snapshot_every]
    for ev in evs:
        if ev is not None and (ev < 64 or ev % 64):
            raise ValueError(f"snapshot_every={ev} must be a positive multiple of 64")
    side_runs(sides, snapshot_every)   # unknown sides raise before a model loads
    for preset, _, model in loaded_models(rec, models, mix, gguf_dir):
        rec.rows += bench_model(rec, model, preset, QUICK if quick else FULL, quick=quick, every=snapshot_every,
                                sides=sides)
    return {}


def table(rows: list[dict]) -> str:
    lines = ["Prefix reuse traces (issue 39): time to first token per request (wall clock of the "
             "prefill call to the greedy token on the host), p50 / p99 over the trace; prefilled "
             "tokens against the minimum (each distinct prefix once).", "",
             "| model | trace | impl | requests | TTFT p50 ms | TTFT p99 ms | p50 off / on | prompt tokens | "
             "prefilled | minimum | prefilled / min | re-run | device GiB | cache GiB |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(x, fmt):
        return "" if x is None else fmt.format(x)
    for r in rows:
        if "trace" not in r:   # an attach row
            continue
        lines.append(f"| {r['model']} | {r['trace']} | {r['impl']} | {r['requests']} | "
                     f"{f(r.get('ttft_p50_ms'), '{:.2f}')} | {f(r.get('ttft_p99_ms'), '{:.2f}')} | "
                     f"{f(r.get('p50_vs_off'), '{:.1f}')} | "
                     f"{r['prompt_tokens']} | {r['prefilled_tokens']} | {r['min_tokens']} | "
                     f"{f(r.get('prefilled_vs_min'), '{:.2f}')} | {f(r.get('rerun_tokens'), '{}')} | "
                     f"{f(r['device_bytes'] / 2**30 if r.get('device_bytes') else None, '{:.2f}')} | "
                     f"{f(r['cache_bytes'] / 2**30 if r.get('cache_bytes') is not None else None, '{:.2f}')} |")
    attach = [r for r in rows if "trace" not in r]
    if attach:
        lines += ["", "| model | case | median ms |", "|---|---|---:|"]
        lines += [f"| {r['model']} | {r['case']} | {r['median_ms']:.3f} |" for r in attach]
    return "\n".join(lines)
