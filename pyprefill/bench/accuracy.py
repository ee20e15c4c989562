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


def rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref))


def argmax_agree(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean(np.argmax(out, axis=1) == np.argmax(ref, axis=1)))


def gpu_logits(path: str, tokens: np.ndarray, legs=("int8", "f16"), *, chunk: int = 512) -> dict:
    """The logits of every position on each leg (a fresh session each)."""
    from ..model import Model
    out = {}
    with Model.load(path, progress=False) as m:
        for leg in legs:
            with m.session(max_tokens=len(tokens), chunk=min(chunk, len(tokens)), gemm=leg) as s:
                out[leg] = s.prefill(tokens, "all").astype(np.float64)
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
    float64 forward; `gpu_vs_recipe` = ||GPU int8 - simulated recipe|| / ||float64||."""
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
    for leg, lg in got.items():
        row[f"gpu_{leg}"] = rel(lg, ref)
        row[f"gpu_{leg}_argmax"] = argmax_agree(lg, ref)
        row[f"gpu_{leg}_finite"] = bool(np.isfinite(lg).all())
    row["gpu_vs_recipe"] = rel(got["int8"], sim.logits[RECIPE]) * np.linalg.norm(sim.logits[RECIPE]) / np.linalg.norm(ref)
    if hf:
        lg = hf_logits(path, tokens)
        row["hf_bf16"] = rel(lg, ref)
        row["hf_bf16_argmax"] = argmax_agree(lg, ref)
    return row


def table(rows: list[dict]) -> str:
    head = ("| model | T | sim bar int8-g32 | sim recipe (x bar) | GPU int8 (x bar) | GPU int8 - sim "
            "recipe | GPU f16 | HF bf16 |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        hf = f"{r['hf_bf16']:.3g}, {r['hf_bf16_argmax']:.0%}" if "hf_bf16" in r else "-"
        lines.append(
            f"| {r['model'].rsplit('/', 1)[-1]} | {r['tokens']} | {r['sim_bar']:.3g}, {r['sim_bar_argmax']:.0%} "
            f"| {r['sim_recipe']:.3g} ({r['sim_recipe'] / r['sim_bar']:.2f}x), {r['sim_recipe_argmax']:.0%} "
            f"| {r['gpu_int8']:.3g} ({r['gpu_int8'] / r['sim_bar']:.2f}x), {r['gpu_int8_argmax']:.0%} "
            f"| {r['gpu_vs_recipe']:.3g} | {r['gpu_f16']:.3g}, {r['gpu_f16_argmax']:.0%} | {hf} |")
    return "\n".join(lines)
