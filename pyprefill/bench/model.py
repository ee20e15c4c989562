"""Whole-model prefill, tokens/s: ours on each gemm leg against HF transformers (bf16, sdpa, +FLA
when installed) holding the same, dequantized, weights, and the roofline 2 x non-embedding
params x tokens over the measured torch fp16 GEMM peak.

`bench_gguf` measures one file (what `pyprefill bench FILE` runs); `run` writes synthetic GGUFs
of real shapes (formats.synth presets) and measures each (`pyprefill bench model`). Ours is
timed by wall clock around Session.prefill, which returns once the logits are on the host; HF
by wall clock around model(...) and the logits' copy to the host."""
from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from .._defaults import DEFAULT_STEP_TOKENS
from ..formats.gguf_model import load_model_desc
from ._common import first_line
from .timer import HostClock, measure

EMBEDDINGS = ("token_embd.weight", "output.weight")


def param_counts(desc) -> tuple[int, int]:
    """(all parameters, non-embedding parameters) of a GGUF's ModelDesc."""
    sizes = {name: int(np.prod(t.shape)) for name, t in desc.tensors.items()}
    return sum(sizes.values()), sum(n for name, n in sizes.items() if name not in EMBEDDINGS)


# ------------------------------------------------------------------------------------ HF peer

def hf_config(desc):
    """(transformers config, model class) of the model a qwen3 / qwen35 GGUF describes."""
    common = dict(vocab_size=desc.n_vocab, hidden_size=desc.n_embd, intermediate_size=desc.n_ff,
                  num_hidden_layers=desc.n_layer, num_attention_heads=desc.n_head,
                  num_key_value_heads=desc.n_head_kv, head_dim=desc.head_dim,
                  max_position_embeddings=min(desc.context_length, 32768), rms_norm_eps=desc.eps,
                  tie_word_embeddings=desc.tied_output)
    if desc.arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        rope = {"rope_type": "default", "rope_theta": desc.rope_base}
        return Qwen3Config(**common, rope_parameters=rope), Qwen3ForCausalLM
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    half = desc.rope_dim // 2          # mrope sections sum to rope_dim / 2 (text: all equal)
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    cfg = Qwen3_5TextConfig(
        **common, layer_types=["full_attention" if k == "attn" else "linear_attention"
                               for k in desc.layer_kinds],
        linear_num_key_heads=desc.ssm_hk, linear_num_value_heads=desc.ssm_hv,
        linear_key_head_dim=desc.ssm_dk, linear_value_head_dim=desc.ssm_dv,
        linear_conv_kernel_dim=desc.conv_kernel,
        rope_parameters={"rope_type": "default", "rope_theta": desc.rope_base,
                         "partial_rotary_factor": desc.rope_dim / desc.head_dim,
                         "mrope_section": sections, "mrope_interleaved": True})
    return cfg, Qwen3_5ForCausalLM


def build_hf(torch, path: str, device: str = "cuda"):
    """An HF model (bf16, sdpa) on `device` holding the GGUF's dequantized weights."""
    from ..formats.hf_export import load_gguf_into_hf
    cfg, cls = hf_config(load_model_desc(path))
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(torch.bfloat16).eval()
    load_gguf_into_hf(model, path, workers=max(1, min(16, os.cpu_count() or 1)))
    gc.collect()
    return model


# ------------------------------------------------------------------------------------ prewarm

def device_copy_gbs(ctx, nbytes: int, *, reps: int = 5, copies: int = 4) -> float:
    """The device copy bandwidth in GB/s of bytes read + written: pf_buffer_copy (a
    device-to-device cudaMemcpyAsync, what torch's copy_ runs) of nbytes between two buffers,
    `copies` back to back between host clocks, median of `reps` after one warm-up."""
    src, dst = ctx.buffer(nbytes), ctx.buffer(nbytes)
    try:
        src.fill(0)
        dst.copy_from(src)
        ctx.synchronize()
        per_copy = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(copies):
                dst.copy_from(src)
            ctx.synchronize()
            per_copy.append((time.perf_counter() - t0) / copies)
    finally:
        src.close()
        dst.close()
    return 2 * nbytes / float(np.median(per_copy)) / 1e9


def copy_bytes_for(moved: int, free: int) -> int:
    """Bytes per buffer of the copy measurement: half the bytes the prewarm moved (so that the
    copy moves as many), at least 256 MiB (below that the copy is not at full rate), at most
    2 GiB and a quarter of the free device memory."""
    return int(max(min(max(moved // 2, 256 << 20), 2 << 30, free // 4), 1 << 20))


def prewarm_figures(report: dict | None, prewarm_ms: float | None, copy_gbs: float | None,
                    moved_fallback: int = 0) -> dict:
    """The prewarm's bandwidth: bytes read (GGUF blocks) + written (fp16 copies) over its wall
    time (host side included: allocation, launches, the final synchronisation) and over the
    dequantization's device time alone, each also as % of the device copy bandwidth."""
    moved = ((report["bytes_read"] + report["bytes_added"]) if report and report.get("armed")
             else moved_fallback)
    out = {"prewarm_bytes": moved}
    rates = {"prewarm_gbs": prewarm_ms,
             "prewarm_device_gbs": report.get("device_ms") if report else None}
    for key, ms in rates.items():
        if moved and ms:
            out[key] = moved / (ms * 1e6)
            if copy_gbs:
                out[key.replace("_gbs", "_pct_copy")] = 100 * out[key] / copy_gbs
    if copy_gbs:
        out["copy_gbs"] = copy_gbs
    return out


def _prewarm_line(label: str, base: dict) -> str:
    def pct(key):
        return f", {base[key]:.0f}% of the device copy" if key in base else ""
    line = (f"-- ours {label}: load {base['load_ms'] or 0:.0f} ms, prewarm "
            f"{base['prewarm_ms'] or 0:.1f} ms")
    if "prewarm_gbs" in base:
        line += (f" ({base['prewarm_bytes'] / 1e9:.2f} GB read + written: "
                 f"{base['prewarm_gbs']:.0f} GB/s{pct('prewarm_pct_copy')}")
        if "prewarm_device_gbs" in base:
            line += (f"; dequantization alone {base['prewarm_device_gbs']:.0f} GB/s"
                     f"{pct('prewarm_device_pct_copy')}")
        line += ")"
    if "copy_gbs" in base:
        line += f", device copy {base['copy_gbs']:.0f} GB/s"
    return line + f", fp16 cache {'armed' if base['f16_armed'] else 'not armed'}"


# ------------------------------------------------------------------------------------ timing

def _row(label: str, impl: str, T: int, t: dict | None = None, *, tokens: int | None = None, **extra) -> dict:
    """A row of `impl` at prompt length T; with timings t, tok_s = `tokens` (default T) a second."""
    row = {"model": label, "impl": impl, "T": T, **extra}
    if t is not None:
        n = T if tokens is None else tokens
        rates = [n / (ms * 1e-3) for ms in t["reps_ms"]]
        row.update(t, tok_s=n / (t["median_ms"] * 1e-3),
                   tok_s_std=float(np.std(rates, ddof=1)) if len(rates) > 1 else 0.0)
    return row


def _decode_times(s, ids, n: int, ctx, reps: int) -> dict:
    """Milliseconds of n greedy decode steps (Session.generate) after a prompt, the prompt's
    prefill untimed before each call (measure's setup), the same prompts as the prefill's."""
    def setup(i):
        s.reset()
        s.prefill(ids[i % len(ids)], "none")
    return measure(lambda i: s.generate(n), HostClock(ctx.synchronize), reps=reps, warmup=1,
                   max_calls=1, setup=setup)



def _say(rec, row: dict) -> None:
    mem = row.get("allocated_bytes")
    rec.say(f"  {row['model']:24s} {row['impl']:18s} T={row['T']:<6d} {row['median_ms']:9.2f} ms "
            f"{row['tok_s']:10.0f} tok/s" + (f"  device {mem / 2**30:.2f} GiB" if mem else ""))


# Leg variants for before/after runs in one process (session tuning fields, pyprefill.tuning):
# "LEG/nofuse" runs the projections of a group one by one (fuse_groups off), "LEG/noact16" casts
# the projections' inputs in a separate pass (f16_producers off), "LEG/nograph" launches every
# kernel (the session option graphs=False), "LEG/noqkrope" runs the attention layer's q/k norms,
# RoPE and cache write as five kernels (fuse_qk_rope off), "LEG/norowregs" runs the row kernels
# (RMSNorm, SwiGLU, the fused q/k RoPE) in their shared-memory form (row_form "staged"),
# "LEG/nolt" runs every f16-leg GEMM through cublasGemmEx instead of the per-shape algorithm timed
# at session creation (gemm_lt off; the choices stay made for the process, so "auto" and
# "auto/nolt" can run in either order), "LEG/noconvnorm" runs the GDN conv1d + SiLU and the q/k
# L2 norms as three kernels (fuse_conv_norm off), "LEG/seqscan" runs the delta rule token by
# token (gdn_scan sequential), "LEG/onepass" runs the chunked delta rule in one pass (no chained
# sub-passes), "LEG/warpstate" runs its warp-owned state kernel, "LEG/blocks" runs a model loaded
# without fp16 caches on the GGUF blocks, "LEG/noblocks" streams the uncached matrices' fp16 slabs
# on fp32 rows instead of reading their blocks (gemm_blocks off: before session 40's default),
# "LEG/nogemv" runs 1-8 rows of Q4_K / Q5_K / Q6_K blocks in the few-rows form instead of the GEMV form
# (gemm_blocks_gemv_rows never: before session 41's default), "LEG/ring" dequantizes the blocks'
# slabs ahead of their GEMMs in 3 buffers on a low-priority stream (gemm_blocks_ring 3).
VARIANT_TUNING = {"nofuse": {"fuse_groups": False}, "noact16": {"f16_producers": False},
                  "nograph": {}, "noqkrope": {"fuse_qk_rope": False}, "norowregs": {"row_form": "staged"},
                  "nolt": {"gemm_lt": "off"}, "noconvnorm": {"fuse_conv_norm": False},
                  "seqscan": {"gdn_scan": "sequential"}, "onepass": {"gdn_subpass_rows": "one-pass"},
                  "warpstate": {"gdn_state": "warp"},
                  "blocks": {"gemm_blocks": True}, "noblocks": {"gemm_blocks": False},
                  "nogemv": {"gemm_blocks_gemv_rows": "never"}, "ring": {"gemm_blocks_ring": 3}}


def split_leg(leg: str) -> tuple[str, dict, bool]:
    """("auto/nofuse/nograph") -> ("auto", {"fuse_groups": False}, False): the base leg, the
    session's tuning fields and whether it replays CUDA graphs; ValueError for an unknown variant."""
    base, *mods = leg.split("/")
    tuning, graphs = {}, True
    for m in mods:
        if m not in VARIANT_TUNING:
            raise ValueError(f"leg {leg!r}: unknown variant {m!r} (known: {', '.join(VARIANT_TUNING)})")
        tuning.update(VARIANT_TUNING[m])
        graphs = graphs and m != "nograph"
    return base, tuning, graphs


def bench_ours(rec, path: str, label: str, lengths, legs, *, chunk: int, reps: int,
               rng, budget_gib: float = 0, decode: int = 0) -> list[dict]:
    """budget_gib > 0: on a context with that memory budget (a smaller card: the prewarm caches
    what fits, the rest runs uncached); its rows' impl ends with " @<budget>GiB". decode > 0: after
    each length's prefill row, a row of `decode` greedy steps after a prompt of that length
    (impl "ours LEG tg<decode>", tok_s the decoded tokens a second)."""
    from ..core import Context
    from ..model import Model
    # "LEG/blocks" runs on a model loaded without fp16 caches (the f16 leg reads the GGUF blocks);
    # the other legs on one with them: one load each.
    blocks = [g for g in legs if "blocks" in g.split("/")[1:]]
    if blocks and len(blocks) < len(legs):
        return (bench_ours(rec, path, label, lengths, [g for g in legs if g not in blocks], chunk=chunk,
                           reps=reps, rng=rng, budget_gib=budget_gib, decode=decode) +
                bench_ours(rec, path, label, lengths, blocks, chunk=chunk, reps=reps, rng=rng,
                           budget_gib=budget_gib, decode=decode))
    rows: list[dict] = []
    bases = [split_leg(g)[0] for g in legs]
    at = f" @{budget_gib:g}GiB" if budget_gib else ""
    with Context(0, **({"memory_budget": int(budget_gib * 2**30)} if budget_gib else {})) as ctx:
        free0, _ = ctx.memory()
        try:
            model = Model.load(path, gemm=bases[0],
                               prewarm=not blocks and any(g in ("f16", "auto") for g in bases),
                               progress=False, context=ctx, tuning={"gemm_blocks": True} if blocks else None)
        except Exception as exc:   # noqa: BLE001  one row per wanted number says why
            rec.skip(f"ours {label}", f"load: {type(exc).__name__}: {first_line(exc)}")
            return [_row(label, f"ours {leg}{at}", T, error=f"load: {first_line(exc)}")
                    for leg in legs for T in lengths]
        info = model.info
        base = {"load_ms": info.get("load_ms"), "prewarm_ms": info.get("prewarm_ms"),
                "f16_armed": bool(info.get("f16_armed")), "weight_bytes": info.get("weight_bytes"),
                "f16_bytes": info.get("f16_bytes"), "chunk": chunk}
        if budget_gib:
            rep = rec.guard(f"ours {label}{at}: prewarm report", model.prewarm_report) or {}
            base.update(budget_gib=budget_gib, prewarm_partial=bool(rep.get("partial")),
                        cached_fraction=(rep.get("bytes_added", 0) / rep["bytes_total"]
                                         if rep.get("bytes_total") else None))
            rec.say(f"  {label}{at}: prewarm {rep.get('reason') or 'armed'}")
        if base["f16_armed"] and base["prewarm_ms"]:
            report = rec.guard(f"ours {label}: prewarm report", model.prewarm_report)
            moved = (base["weight_bytes"] or 0) + (base["f16_bytes"] or 0)
            copy_gbs = rec.guard(f"ours {label}: device copy", device_copy_gbs, ctx,
                                 copy_bytes_for(moved, ctx.memory()[0]))
            base.update(prewarm_figures(report, base["prewarm_ms"], copy_gbs, moved))
        rec.say(_prewarm_line(label, base))
        with model:
            for leg in legs:
                for T in lengths:
                    row = _row(label, f"ours {leg}{at}", T, **base)
                    try:
                        base_leg, tuning, graphs = split_leg(leg)
                        t_session = time.perf_counter()
                        with model.session(max_tokens=T + decode, chunk=min(chunk, T), gemm=base_leg,
                                           graphs=graphs, tuning=tuning) as s:
                            # creation, with the GEMM choices the process times for new shapes
                            session_ms = (time.perf_counter() - t_session) * 1e3
                            ids = [rng.integers(0, model.n_vocab, T, dtype=np.int32)
                                   for _ in range(4)]
                            logits = {}

                            def call(i):
                                logits["last"] = s.prefill(ids[i % 4])
                            t = measure(call, HostClock(ctx.synchronize), reps=reps, warmup=1,
                                        max_calls=1, setup=lambda i: s.reset())
                            if not np.isfinite(logits["last"]).all():
                                raise RuntimeError("non-finite logits")
                            free1, _ = ctx.memory()
                            row = _row(label, f"ours {leg}{at}", T, t, **base,
                                       allocated_bytes=ctx.allocated(), device_used_bytes=free0 - free1,
                                       session_ms=session_ms)
                            _say(rec, row)
                            if decode:   # its own row and its own error: the prefill row stands
                                rows.append(row)
                                impl = f"ours {leg} tg{decode}{at}"
                                row = _row(label, impl, T, **base, decode_tokens=decode)
                                td = _decode_times(s, ids, decode, ctx, reps)
                                row = _row(label, impl, T, td, tokens=decode, **base, decode_tokens=decode,
                                           ms_per_token=td["median_ms"] / decode, allocated_bytes=ctx.allocated())
                                _say(rec, row)
                    except Exception as exc:   # noqa: BLE001
                        row["error"] = f"{type(exc).__name__}: {first_line(exc)}"
                        rec.skip(f"ours {label} {leg}{at} T={T}", row["error"])
                    rows.append(row)
    return rows


def bench_hf(rec, torch, path: str, label: str, lengths, *, reps: int, rng) -> list[dict]:
    if rec.optional("transformers", "HF transformers peer") is None:
        return []
    fla = (load_model_desc(path).arch == "qwen35"
           and rec.optional("fla", "FLA kernels in the HF peer") is not None)
    impl = "HF bf16 sdpa" + ("+FLA" if fla else "")
    t0 = time.perf_counter()
    try:
        model = build_hf(torch, path)
    except Exception as exc:   # noqa: BLE001
        rec.skip(f"HF {label}", f"build: {type(exc).__name__}: {first_line(exc)}")
        gc.collect()
        torch.cuda.empty_cache()
        return [_row(label, impl, T, error=f"build: {first_line(exc)}") for T in lengths]
    build_s = time.perf_counter() - t0
    rec.say(f"-- {impl} {label}: built with the GGUF's weights in {build_s:.1f} s")
    rows = []
    try:
        V = model.config.vocab_size
        for T in lengths:
            row = _row(label, impl, T, build_s=build_s)
            try:
                ids = [torch.from_numpy(rng.integers(0, V, T)).cuda()[None] for _ in range(4)]
                torch.cuda.reset_peak_memory_stats()

                def call(i):
                    with torch.inference_mode():
                        model(ids[i % 4], use_cache=False, logits_to_keep=1).logits.float().cpu()
                t = measure(call, HostClock(torch.cuda.synchronize), reps=reps, warmup=2,
                            max_calls=1)
                row = _row(label, impl, T, t, build_s=build_s,
                           peak_bytes=torch.cuda.max_memory_allocated())
                _say(rec, row)
            except Exception as exc:   # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {first_line(exc)}"
                rec.skip(f"HF {label} T={T}", row["error"])
            rows.append(row)
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def bench_gguf(rec, path: str, label: str, lengths, legs, *, chunk: int = DEFAULT_STEP_TOKENS, reps: int = 5,
               peer: str = "hf", torch=None, peak_tflops: float | None = None,
               seed: int = 99, budgets=(), decode: int = 0) -> list[dict]:
    """Ours on each leg, then the HF peer, on one GGUF; every row carries the file's size and
    parameter counts, the roofline, % of it, and ours / HF at the same length. budgets: memory
    budgets in GiB to run ours under as well (each row's vs_unbudgeted: its tok/s over the same
    leg and length without a budget)."""
    rng = np.random.default_rng(seed)
    desc = load_model_desc(path)
    params, non_embd = param_counts(desc)
    roof = peak_tflops * 1e12 / (2 * non_embd) if peak_tflops else None
    rows = bench_ours(rec, path, label, lengths, legs, chunk=chunk, reps=reps, rng=rng, decode=decode)
    for b in budgets or ():
        more = bench_ours(rec, path, label, lengths, legs, chunk=chunk, reps=reps, rng=rng, budget_gib=b,
                          decode=decode)
        for r in more:
            free = next((x for x in rows if x["T"] == r["T"] and x.get("tok_s")
                         and x["impl"] == r["impl"].rsplit(" @", 1)[0]), None)
            if free and r.get("tok_s"):
                r["vs_unbudgeted"] = r["tok_s"] / free["tok_s"]
                rec.say(f"  {label} {r['impl']} T={r['T']}: {r['vs_unbudgeted']:.3f}x the unbudgeted tok/s "
                        f"(cached {100 * (r.get('cached_fraction') or 0):.0f}% of the fp16 bytes)")
        rows += more
    hf = []
    if peer == "hf" and torch is not None:
        hf = rec.guard(f"HF {label}", bench_hf, rec, torch, path, label, lengths, reps=reps,
                       rng=rng) or []
    by_T = {r["T"]: r for r in hf if r.get("tok_s")}
    for r in rows + hf:
        r.update(arch=desc.arch, size_bytes=os.path.getsize(path), params=params,
                 non_embedding_params=non_embd, roofline_tok_s=roof)
        if "decode_tokens" in r:   # decode steps: no prefill roofline, no prefill peer
            continue
        if roof and r.get("tok_s"):
            r["pct_roofline"] = 100 * r["tok_s"] / roof
        if r["impl"].startswith("ours") and r.get("tok_s") and r["T"] in by_T:
            r["ratio_vs_hf"] = r["tok_s"] / by_T[r["T"]]["tok_s"]
    return rows + hf


def synthetic_gguf(rec, preset: str, mix: str, directory: str) -> str:
    """The synthetic GGUF of a preset (formats.synth), written once and reused."""
    from ..formats.synth import write_synthetic
    path = Path(directory) / f"bench-{preset}-{mix}.gguf"
    if path.exists() and path.stat().st_size > 0:
        rec.say(f"-- reusing {path}")
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = path.with_suffix(".tmp.gguf")
    write_synthetic(preset, mix, tmp, progress=False)
    os.replace(tmp, path)
    rec.say(f"-- wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, "
            f"{time.perf_counter() - t0:.1f} s)")
    return str(path)


def loaded_models(rec, models, mix: str, gguf_dir: str | None):
    """(preset, GGUF path, model) for each preset whose synthetic GGUF could be written and loaded,
    each on a context of its own that is closed, with the model, before the next one loads (a
    preset that fails says why in one skip line). For the suites that run on one model at a time."""
    from ..core import Context
    from ..model import Model
    for preset in models:
        path = rec.guard(f"model {preset}", synthetic_gguf, rec, preset, mix, gguf_dir or tempfile.gettempdir())
        if path is None:
            continue
        t0 = time.perf_counter()
        with Context(0) as ctx:
            try:
                model = Model.load(path, progress=False, context=ctx)
            except Exception as exc:   # noqa: BLE001  one line says why
                rec.skip(f"ours {preset}", f"load: {type(exc).__name__}: {first_line(exc)}")
                continue
            with model:
                rec.say(f"-- {preset}: loaded in {time.perf_counter() - t0:.1f} s")
                yield preset, path, model


def run(rec, torch, *, models, lengths, legs, chunk: int, reps: int, peer: str, mix: str = "q4_k_m",
        gguf_dir: str | None = None, peak_tflops: float | None = None, budgets=(), decode: int = 0) -> dict:
    """The model suite: each preset's synthetic GGUF through bench_gguf."""
    from . import gemm
    if peak_tflops is None and torch is not None:
        peak_tflops = rec.guard("roofline (torch fp16 peak)", gemm.fp16_peak_tflops, torch)
    for preset in models:
        path = rec.guard(f"model {preset}", synthetic_gguf, rec, preset, mix,
                         gguf_dir or tempfile.gettempdir())
        if path is not None:
            rec.rows += bench_gguf(rec, path, preset, lengths, legs, chunk=chunk, reps=reps,
                                   peer=peer, torch=torch, peak_tflops=peak_tflops, budgets=budgets,
                                   decode=decode)
    return {"peak_fp16_tflops": peak_tflops}
