"""Many sequences at once (issue 28): batched prefill of N prompts against the same prompts as
single calls and against HF transformers batched (padding + attention mask); decode steps of many
sessions against one; fork and snapshot rollback of a long session.

Whole-model rows are wall clock from the call to the logits (or greedy tokens) on the host,
median of the repeats, on synthetic GGUFs of the real shapes (`formats.synth`). Every session is
reset (ours) or the cache dropped (HF: use_cache=False) before a timed call, so every repeat
prefills from position 0.
"""
from __future__ import annotations

import gc
import time

import numpy as np

from ._common import first_line
from .timer import HostClock, measure

# (name, prompt lengths) per preset: the target cases.
def _cases(preset: str, rng, quick: bool) -> list[tuple[str, list[int]]]:
    if quick:
        return [("4x128", [128] * 4), ("8 ragged 16..256", [int(x) for x in rng.integers(16, 257, 8)])]
    ragged = [int(x) for x in rng.integers(64, 1025, 32)]
    table = {"qwen35-4b": [("16x512", [512] * 16), ("32 ragged 64..1024", ragged), ("64x128", [128] * 64)],
             "qwen3-4b": [("16x512", [512] * 16)],
             "qwen35-0.8b": [("32x256", [256] * 32)]}
    return table.get(preset, [("16x512", [512] * 16)])


def _row(model: str, case: str, impl: str, n_tokens: int, t: dict | None = None, **extra) -> dict:
    row = {"model": model, "case": case, "impl": impl, "tokens": n_tokens, **extra}
    if t is not None:
        row.update(t, tok_s=n_tokens / (t["median_ms"] * 1e-3))
    return row


def _say(rec, r: dict) -> None:
    rate = f"{r['tok_s']:10.0f} tok/s" if r.get("tok_s") else ""
    rec.say(f"  {r['model']:12s} {r['case']:22s} {r['impl']:26s} {r.get('median_ms', 0):9.3f} ms {rate}")


def bench_ours(rec, model, label: str, cases, *, steps, reps: int, rng, variants) -> list[dict]:
    """Per case: the batch at each step size (and each tuning variant), then the same prompts as
    single calls of one session with its own executor."""
    ctx, V = model.ctx, model.n_vocab
    rows = []
    for case, lens in cases:
        N, total, cap = len(lens), sum(lens), max(lens)
        prompts = [[rng.integers(0, V, n, dtype=np.int32) for n in lens] for _ in range(2)]
        sessions = [model.session(max_tokens=cap, own_executor=False) for _ in lens]
        try:
            for step in steps:
                for vname, tuning in variants:
                    impl = f"ours batch step {step}" + (f" {vname}" if vname else "")
                    try:
                        with model.batch(max_items=N, step_tokens=step, max_tokens=total, max_context=cap,
                                         tuning=tuning) as b:
                            def reset(_i):
                                for s in sessions:
                                    s.reset()

                            out = {}

                            def call(i):
                                out["r"] = b.prefill([dict(session=s, tokens=p, logits="last")
                                                      for s, p in zip(sessions, prompts[i % 2])])
                            t = measure(call, HostClock(ctx.synchronize), reps=reps, warmup=2, max_calls=1,
                                        setup=reset)
                            if not all(np.isfinite(o["logits"]).all() for o in out["r"]):
                                raise RuntimeError("non-finite logits")
                        r = _row(label, case, impl, total, t, items=N, step=step)
                        _say(rec, r)
                    except Exception as exc:   # noqa: BLE001  one row says why
                        r = _row(label, case, impl, total, error=f"{type(exc).__name__}: {first_line(exc)}")
                        rec.skip(f"{label} {case} {impl}", r["error"])
                    rows.append(r)
        finally:
            for s in sessions:
                s.close()
        # the same prompts one call each (one session, its own executor, reset between them)
        impl = "ours single calls"
        try:
            with model.session(max_tokens=cap) as s:
                def call(i):
                    for p in prompts[i % 2]:
                        s.reset()
                        s.prefill(p, "last")
                t = measure(call, HostClock(ctx.synchronize), reps=reps, warmup=1, max_calls=1)
            r = _row(label, case, impl, total, t, items=N)
            _say(rec, r)
        except Exception as exc:   # noqa: BLE001
            r = _row(label, case, impl, total, error=f"{type(exc).__name__}: {first_line(exc)}")
            rec.skip(f"{label} {case} {impl}", r["error"])
        rows.append(r)
    return rows


def bench_decode(rec, model, label: str, *, n_items: int, context: int, reps: int, rng) -> list[dict]:
    """Decode steps (one token per session, greedy token back): n_items sessions at `context`
    positions in one batch call per step, against one session alone (its own executor)."""
    ctx, V = model.ctx, model.n_vocab
    rows = []
    extra = 512   # positions for the warm-up, the probe and the timed steps
    sessions = [model.session(max_tokens=context + extra, own_executor=False) for _ in range(n_items)]
    try:
        with model.batch(max_items=n_items, max_tokens=n_items * context, max_context=context + extra) as b:
            b.prefill([dict(session=s, tokens=rng.integers(0, V, context, dtype=np.int32), logits="none")
                       for s in sessions])
            toks = rng.integers(0, V, (n_items,), dtype=np.int32)

            def call(_i):
                out = b.prefill([dict(session=s, tokens=toks[j:j + 1], logits="none")
                                 for j, s in enumerate(sessions)])
                toks[:] = [o["token"] for o in out]
            t = measure(call, HostClock(ctx.synchronize), reps=reps, warmup=3, target_s=0.05, max_calls=64)
        r = _row(label, f"decode {n_items}x1 @{context}", "ours batch", n_items, t, items=n_items)
        _say(rec, r)
        rows.append(r)
    finally:
        for s in sessions:
            s.close()
    with model.session(max_tokens=context + extra) as s:
        s.prefill(rng.integers(0, V, context, dtype=np.int32), "none")
        tok = np.array([1], np.int32)

        def call1(_i):
            _, nxt = s.prefill(tok, "none", return_token=True)
            tok[0] = nxt
        t1 = measure(call1, HostClock(ctx.synchronize), reps=reps, warmup=3, target_s=0.05, max_calls=64)
    r1 = _row(label, f"decode 1x1 @{context}", "ours single session", 1, t1, items=1)
    _say(rec, r1)
    rows.append(r1)
    if rows[0].get("tok_s"):
        rows[0]["ratio_vs_one"] = rows[0]["tok_s"] / r1["tok_s"]
        rec.say(f"  decode: {n_items} items {rows[0]['ratio_vs_one']:.1f}x the tokens/s of one")
    return rows


def bench_fork(rec, model, label: str, *, T: int, reps: int, rng) -> list[dict]:
    """Fork of a session at T tokens (device copy of its KV rows and states), and the rollback to a
    snapshot (the recurrent state copied back); the bytes of one snapshot."""
    ctx, V = model.ctx, model.n_vocab
    rows = []
    with model.session(max_tokens=T + 64, snapshot_every=0, snapshot_at_end=True, snapshot_slots=2) as s:
        s.prefill(rng.integers(0, V, T, dtype=np.int32), "none")
        _, each = s.snapshots()
        forks = []

        def drop(_i):
            while forks:
                forks.pop().close()

        def fork(_i):
            forks.append(s.fork())
        # The first fork of this size takes the session pool's growth (a cudaMalloc); a later one
        # reuses what a closed fork gave back (pf_context_memory counts those bytes as free).
        ctx.synchronize()
        t0 = time.perf_counter()
        fork(0)
        ctx.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        drop(0)
        t = measure(fork, HostClock(ctx.synchronize), reps=reps, warmup=1, max_calls=1, setup=drop)
        drop(0)
        r = _row(label, f"fork @{T} (new session)", "ours", 0, t, snapshot_bytes=each, first_ms=first_ms)
        rec.say(f"  {label:12s} fork @{T}: {t['median_ms']:.3f} ms with the new session's allocation "
                f"(the first: {first_ms:.3f} ms, the pool growing; a snapshot holds {each / 2**20:.1f} MiB)")
        rows.append(r)
        with model.session(max_tokens=T + 64) as dst:
            t = measure(lambda _i: dst.copy_from(s), HostClock(ctx.synchronize), reps=reps, warmup=1, max_calls=8)
        r = _row(label, f"copy @{T} (into a session)", "ours", 0, t)
        rec.say(f"  {label:12s} copy @{T} into an existing session: {t['median_ms']:.3f} ms")
        rows.append(r)
        if each:
            tok = np.array([7], np.int32)

            def roll(_i):
                s.rollback(T)
            t = measure(roll, HostClock(ctx.synchronize), reps=reps, warmup=1, max_calls=1,
                        setup=lambda _i: s.prefill(tok, "none"))
            r = _row(label, f"rollback @{T}", "ours", 0, t, snapshot_bytes=each)
            rec.say(f"  {label:12s} rollback to the snapshot @{T}: {t['median_ms']:.3f} ms")
            rows.append(r)
    return rows


def bench_paged(rec, model, label: str, *, T: int, reps: int, rng) -> list[dict]:
    """Paged KV (issue 39) against contiguous sessions in one run, at T tokens: the prefill of T
    tokens from position 0 (the attention kernels reading through the page table), a fork and a
    copy into an existing session (the pages shared instead of the KV rows copied: the recurrent
    state is still copied), an attach at a snapshot halfway (copy_from(pos): what a prefix-cache
    hit costs), and the pool pages 16 forks hold (none until they write)."""
    ctx, V = model.ctx, model.n_vocab
    info = model.info
    from ..kernels.attention import tile_page_rows
    P = tile_page_rows(info["head_dim"])
    n_pages = 2 * (-(-(T + 64) // P)) + 4
    model.kv_pool(n_pages, page_rows=P)
    rows = []
    every = max(64, T // 2 // 64 * 64)
    kw = dict(max_tokens=T + 64, snapshot_every=every, snapshot_at_end=True, snapshot_slots=T // every + 2)
    tokens = rng.integers(0, V, T, dtype=np.int32)
    for impl, paged in (("contiguous", False), ("paged", True)):
        with model.session(paged=paged, **kw) as s, model.session(paged=paged, **kw) as dst:
            def prefill(_i):
                s.prefill(tokens, "none")
            t = measure(prefill, HostClock(ctx.synchronize), reps=reps, warmup=1, max_calls=1,
                        setup=lambda _i: s.reset())
            rows.append(_row(label, f"prefill @{T}", f"ours {impl}", T, t, page_rows=P if paged else 0))
            s.reset()
            s.prefill(tokens, "none")
            forks = []

            def drop(_i):
                while forks:
                    forks.pop().close()
            t = measure(lambda _i: forks.append(s.fork()), HostClock(ctx.synchronize), reps=reps, warmup=1,
                        max_calls=1, setup=drop)
            drop(0)
            rows.append(_row(label, f"fork @{T}", f"ours {impl}", 0, t))
            for pos, what in ((T, "copy"), (every, "attach at a snapshot")):
                t = measure(lambda _i: dst.copy_from(s, pos=pos), HostClock(ctx.synchronize), reps=reps,
                            warmup=1, max_calls=8)
                rows.append(_row(label, f"{what} @{pos}", f"ours {impl}", 0, t))
            if paged:
                free0 = model.kv_pool_info()["free"]
                forks = [s.fork() for _ in range(16)]
                held = free0 - model.kv_pool_info()["free"]
                drop(0)
                rec.say(f"  {label:12s} 16 forks of a paged session @{T} hold {held} new pages of {P} rows "
                        f"(the session holds {-(-T // P)}; {model.kv_pool_info()['bytes'] / n_pages / 2**20:.1f} "
                        f"MiB a page)")
    for r in rows:
        _say(rec, r)
    return rows


def bench_hf(rec, torch, path: str, label: str, cases, *, reps: int, rng) -> list[dict]:
    """HF transformers bf16 (+FLA for qwen35) over each case as one padded batch (left padding,
    attention mask), logits of each prompt's last token."""
    from .model import build_hf
    if rec.optional("transformers", "HF transformers peer") is None:
        return []
    try:
        model = build_hf(torch, path)
    except Exception as exc:   # noqa: BLE001
        rec.skip(f"HF {label}", f"build: {type(exc).__name__}: {first_line(exc)}")
        return []
    rows = []
    try:
        V = model.config.vocab_size
        for case, lens in cases:
            N, L = len(lens), max(lens)
            impl = "HF bf16 batched (padded)"
            try:
                sets = []
                for _ in range(2):
                    ids = torch.zeros((N, L), dtype=torch.long)
                    mask = torch.zeros((N, L), dtype=torch.long)
                    for j, n in enumerate(lens):
                        ids[j, L - n:] = torch.from_numpy(rng.integers(0, V, n))
                        mask[j, L - n:] = 1
                    sets.append((ids.cuda(), mask.cuda()))

                def call(i):
                    ids, mask = sets[i % 2]
                    with torch.inference_mode():
                        model(input_ids=ids, attention_mask=mask, use_cache=False,
                              logits_to_keep=1).logits.float().cpu()
                t = measure(call, HostClock(torch.cuda.synchronize), reps=reps, warmup=2, max_calls=1)
                r = _row(label, case, impl, sum(lens), t, items=N, padded_tokens=N * L)
                _say(rec, r)
            except Exception as exc:   # noqa: BLE001
                r = _row(label, case, impl, sum(lens), error=f"{type(exc).__name__}: {first_line(exc)}")
                rec.skip(f"HF {label} {case}", r["error"])
            rows.append(r)
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def run(rec, torch, *, models, steps, reps: int, peer: str, quick: bool, mix: str = "q4_k_m",
        gguf_dir: str | None = None, variants=(("", None),), decode: bool = True, fork: bool = True) -> dict:
    """The batch suite over each preset's synthetic GGUF; the HF peers after all of ours (each of
    our models closed before they load)."""
    from .model import loaded_models
    peers = []
    for preset, path, model in loaded_models(rec, models, mix, gguf_dir):
        rng = np.random.default_rng(28)
        cases = _cases(preset, rng, quick)
        rec.rows += bench_ours(rec, model, preset, cases, steps=steps, reps=reps, rng=rng, variants=variants)
        if decode:
            rec.rows += rec.guard(f"{preset} decode", bench_decode, rec, model, preset,
                                  n_items=8 if quick else 64, context=256 if quick else 1024,
                                  reps=reps, rng=rng) or []
        if fork:
            rec.rows += rec.guard(f"{preset} fork", bench_fork, rec, model, preset,
                                  T=1024 if quick else 8192, reps=reps, rng=rng) or []
            rec.rows += rec.guard(f"{preset} paged", bench_paged, rec, model, preset,
                                  T=1024 if quick else 8192, reps=reps, rng=rng) or []
        peers.append((preset, path, cases, rng))
    if peer == "hf" and torch is not None:
        for preset, path, cases, rng in peers:
            rec.rows += rec.guard(f"HF {preset}", bench_hf, rec, torch, path, preset, cases, reps=reps,
                                  rng=rng) or []
    _ratios(rec.rows)
    return {}


def _ratios(rows: list[dict]) -> None:
    """Each batch row against the single calls and the HF batch of its case (> 1: ours faster)."""
    for r in rows:
        if not r.get("tok_s") or not r["impl"].startswith("ours batch step"):
            continue
        for other, key in (("ours single calls", "ratio_vs_singles"), ("HF bf16 batched (padded)", "ratio_vs_hf")):
            peer = next((p for p in rows if p["model"] == r["model"] and p["case"] == r["case"]
                         and p["impl"] == other and p.get("tok_s")), None)
            if peer:
                r[key] = r["tok_s"] / peer["tok_s"]


def table(rows: list[dict]) -> str:
    lines = ["Many sequences (wall clock to the logits on the host, median of the repeats; tok/s = the "
             "case's real tokens / time; HF pads to the longest prompt). vs singles / vs HF: ours "
             "batch tok/s over theirs (> 1: the batch faster).", "",
             "| model | case | impl | median ms | tok/s | vs singles | vs HF | note |",
             "|---|---|---|---:|---:|---:|---:|---|"]

    def f(x, fmt):
        return "" if x is None else fmt.format(x)
    for r in rows:
        note = r.get("error", "")
        if r.get("ratio_vs_one"):
            note = f"{r['ratio_vs_one']:.1f}x one item's tok/s"
        if r.get("snapshot_bytes"):
            note = f"snapshot {r['snapshot_bytes'] / 2**20:.1f} MiB"
        if r.get("first_ms"):
            note += f"; the first fork {r['first_ms']:.3f} ms (the session pool grows)"
        lines.append(f"| {r['model']} | {r['case']} | {r['impl']} | {f(r.get('median_ms'), '{:.3f}')} | "
                     f"{f(r.get('tok_s') or None, '{:.0f}')} | {f(r.get('ratio_vs_singles'), '{:.2f}')} | "
                     f"{f(r.get('ratio_vs_hf'), '{:.2f}')} | {note} |")
    return "\n".join(lines)
