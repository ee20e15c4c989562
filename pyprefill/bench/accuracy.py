"""The 8-bit leg's whole-model accuracy (issue 31), side by side in one run: the float64
simulation of the llama.cpp bar (int8 activations in groups of 32, exact weights: `int8-g32`) and
of the recipe the leg runs (`int8-g128-w128r-mix`), the GPU's int8 and f16 legs, and HF
transformers bf16 when asked; every figure is ||logits - float64 logits|| / ||float64 logits||
over all positions, with argmax agreement, against the unrounded float64 forward
(pyprefill.reference.quant_sim.simulate).

    python scripts/int8_accuracy.py qwen35-0.8b qwen3-0.6b tests/data/qwen35_hv1.mix.gguf --hf
"""
from __future__ import annotations

import numpy as np

from ..reference import quant_sim as qs

BAR = "int8-g32"              # llama.cpp's MMQ recipe (exact weights), the bar
RECIPE = "int8-g128-w128r-mix"  # what PF_GEMM_INT8 computes (docs/int8-recipe.md)


def file_sha256(path: str) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref))


def argmax_agree(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean(np.argmax(out, axis=1) == np.argmax(ref, axis=1)))


# name: session options. "int8 f32kv": the 8-bit leg with an fp32 KV cache and the cuBLAS
# attention path, closer to the float64 simulation upstream of each quantization.
RUNS = {"int8": dict(gemm="int8"), "f16": dict(gemm="f16"),
        "int8 f32kv": dict(gemm="int8", kv="f32", attention="cublas")}


def gpu_logits(path: str, tokens: np.ndarray, runs=tuple(RUNS), *, chunk: int = 512) -> dict:
    """The logits of every position for each run of RUNS (a fresh session each)."""
    from ..model import Model
    out = {}
    with Model.load(path, progress=False) as m:
        for name in runs:
            with m.session(max_tokens=len(tokens), chunk=min(chunk, len(tokens)), **RUNS[name]) as s:
                out[name] = s.prefill(tokens, "all").astype(np.float64)
    return out


def hf_logits(path: str, tokens: np.ndarray) -> np.ndarray:
    """HF transformers bf16 (sdpa) on the GGUF's dequantized weights (pyprefill.bench.model)."""
    import torch

    from .model import build_hf
    model = build_hf(torch, path)
    try:
        with torch.no_grad():
            ids = torch.as_tensor(np.asarray(tokens, np.int64)[None], device="cuda")
            return model(ids).logits[0].float().cpu().numpy().astype(np.float64)
    finally:
        del model
        torch.cuda.empty_cache()


def measure(path: str, tokens: np.ndarray, *, hf: bool = False, chunked: bool | None = None) -> dict:
    """One model's row: the simulated bar and recipe, the GPU legs (and HF), each against the
    float64 forward; `gpu_vs_recipe` = ||GPU int8 - simulated recipe|| / ||float64|| (and the
    same for the fp32-KV run). The GPU's inputs to each quantization differ from the float64
    ones by its other rounding (chiefly the fp16 form of the normed rows the int8 quantization
    reads on the act16 route, 2^-11 relative; an fp32 KV cache changes the distance by 1%,
    session 34), which moves codes across their rounding boundaries: the two int8 errors are
    then partly independent draws of the same size, so the pointwise distance is a fraction of
    the recipe's error while the errors themselves agree (gpu_int8 ~ sim_recipe)."""
    tokens = np.asarray(tokens, np.int32)
    chunked = len(tokens) > 64 if chunked is None else chunked
    sim = qs.simulate(path, tokens, [qs.RECIPES[BAR], qs.RECIPES[RECIPE]], keep_logits=True,
                      chunked=chunked)
    ref = sim.logits["exact"]
    row = {"model": path, "tokens": int(len(tokens))}
    for name, key in ((BAR, "sim_bar"), (RECIPE, "sim_recipe")):
        row[key] = rel(sim.logits[name], ref)
        row[key + "_argmax"] = argmax_agree(sim.logits[name], ref)
    got = gpu_logits(path, tokens)
    for name, lg in got.items():
        key = "gpu_" + name.replace(" ", "_")
        row[key] = rel(lg, ref)
        row[key + "_argmax"] = argmax_agree(lg, ref)
        row[key + "_finite"] = bool(np.isfinite(lg).all())
    scale = np.linalg.norm(sim.logits[RECIPE]) / np.linalg.norm(ref)
    row["gpu_vs_recipe"] = rel(got["int8"], sim.logits[RECIPE]) * scale
    row["gpu_f32kv_vs_recipe"] = rel(got["int8 f32kv"], sim.logits[RECIPE]) * scale
    if hf:
        lg = hf_logits(path, tokens)
        row["hf_bf16"] = rel(lg, ref)
        row["hf_bf16_argmax"] = argmax_agree(lg, ref)
    return row


def measure_hidden(npz: str, path: str) -> dict:
    """The row of `measure` from a simulation saved by scripts/sim_8bit.py --save-hidden (its
    tokens, its recipes' errors, the float64 hidden states): the GPU runs here, its logits
    compared with the float64 LM head of those states (lm_head_errors). For prompts whose float64
    logits do not fit in memory (1024 tokens x a 248k vocabulary)."""
    z = np.load(npz)
    tokens = z["tokens"].astype(np.int32)
    row = {"model": path, "tokens": int(len(tokens))}
    for name, key in ((BAR, "sim_bar"), (RECIPE, "sim_recipe")):
        row[key] = float(z[f"rel_{name}"])
        row[key + "_argmax"] = float(z[f"argmax_{name}"])
    got = gpu_logits(path, tokens, runs=("int8", "f16"))
    errs = qs.lm_head_errors(path, z["hidden_exact"], got)
    for name, (e, a) in errs.items():
        row[f"gpu_{name}"], row[f"gpu_{name}_argmax"] = e, a
        row[f"gpu_{name}_finite"] = bool(np.isfinite(got[name]).all())
    return row


def long_context(path: str, lengths=(1024, 16384, 32768), *, last: int = 64, seed: int = 0) -> list[dict]:
    """The int8 leg over long prompts (no float64 reference at these lengths): whether the
    logits of the last `last` positions are finite, and their distance to the f16 leg's (an
    order of magnitude closer to float64 than int8: a proxy of the int8 error), per length."""
    from ..model import Model
    rows = []
    with Model.load(path, progress=False) as m:
        for T in lengths:
            toks = np.random.default_rng(seed).integers(0, m.n_vocab, size=T).astype(np.int32)
            out = {}
            for leg in ("int8", "f16"):
                with m.session(max_tokens=T, gemm=leg) as s:
                    s.prefill(toks[:-last], "none")
                    out[leg] = s.prefill(toks[-last:], "all").astype(np.float64)
            rows.append({"model": path, "tokens": T, "finite": bool(np.isfinite(out["int8"]).all()),
                         "int8_vs_f16": rel(out["int8"], out["f16"])})
    return rows


def table(rows: list[dict]) -> str:
    head = ("| model | T | sim bar int8-g32 | sim recipe (x bar) | GPU int8 (x bar) | GPU int8 - sim "
            "recipe (f32 KV) | GPU f16 | HF bf16 |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        hf = f"{r['hf_bf16']:.3g}, {r['hf_bf16_argmax']:.0%}" if "hf_bf16" in r else "-"
        lines.append(
            f"| {r['model'].rsplit('/', 1)[-1]} | {r['tokens']} | {r['sim_bar']:.3g}, {r['sim_bar_argmax']:.0%} "
            f"| {r['sim_recipe']:.3g} ({r['sim_recipe'] / r['sim_bar']:.2f}x), {r['sim_recipe_argmax']:.0%} "
            f"| {r['gpu_int8']:.3g} ({r['gpu_int8'] / r['sim_bar']:.2f}x), {r['gpu_int8_argmax']:.0%} "
            f"| {r.get('gpu_vs_recipe', float('nan')):.3g} ({r.get('gpu_f32kv_vs_recipe', float('nan')):.3g}) "
            f"| {r['gpu_f16']:.3g}, "
            f"{r['gpu_f16_argmax']:.0%} | {hf} |")
    return "\n".join(lines)
