#!/usr/bin/env python3
"""The 8-bit projection recipes of issue 31, simulated in float64 (pyprefill.reference.quant_sim):
one markdown table, a row per recipe and a column per model, each cell the relative logits error
||out - ref|| / ||ref|| over all positions and the argmax agreement against the unrounded
float64 forward of the same GGUF.

    PYTHONPATH=. .venv/bin/python scripts/sim_8bit.py qwen3-0.6b qwen35-0.8b \\
        tests/data/qwen35_hv1.mix.gguf --tokens 48 --recipes table
    ... --recipes int8-g32,int8-g128-w128 --roles      # plus each projection's own error

A model is a GGUF path or a synth preset name (optionally preset:mix, default q4_k_m), written
once under --work with seed 0 (`pyprefill synth`). Prompts: --tokens random ids (seed --seed).
Memory: one layer of float64 weights plus a vocabulary chunk of the LM head at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyprefill.formats.gguf_model import load_model_desc  # noqa: E402
from pyprefill.formats.synth import PRESETS, write_synthetic  # noqa: E402
from pyprefill.bench.accuracy import file_sha256  # noqa: E402
from pyprefill.reference import quant_sim as qs  # noqa: E402

GROUPS = {
    "table": ["bf16", "int8-g32", "int8-g128", "e4m3-g128", "fp8-qwen"],
    "candidates": ["q8_1-llama", "int8-g32", "int8-g32-xs", "int8-g64", "int8-g128",
                   "int8-g128-xs", "int8-row", "int8-g32-w32", "int8-g128-w128",
                   "int8-g128-w128b", "int8-g128-had", "int8-g128-w128-had",
                   "int8-g128-w128-mix", "int8x2-g128"],
    "long": ["q8_1-llama", "int8-g32", "int8-g128-w128", "int8-g128-w128-mix"],
}


def resolve_model(spec: str, work: str) -> str:
    """A GGUF path for `spec` (a path, or a preset[:mix] synthesized under `work` once)."""
    if os.path.exists(spec):
        return spec
    preset, _, mix = spec.partition(":")
    if preset not in PRESETS:
        raise SystemExit(f"{spec}: neither a file nor a synth preset ({', '.join(PRESETS)})")
    mix = mix or "q4_k_m"
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"{preset}.{mix}.gguf")
    if not os.path.exists(path):
        write_synthetic(preset, mix, path, seed=0, progress=False)
    return path


def resolve_recipes(spec: str) -> list[qs.Recipe]:
    names: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if part == "all":
            names += [n for n in qs.RECIPES if n != "exact"]
        elif part in GROUPS:
            names += GROUPS[part]
        elif part:
            names.append(part)
    unknown = [n for n in names if n not in qs.RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipes {unknown} (known: {', '.join(qs.RECIPES)})")
    return [qs.RECIPES[n] for n in dict.fromkeys(names)]


def label(path: str) -> str:
    return os.path.basename(path).removesuffix(".gguf")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="GGUF paths or synth presets (preset[:mix])")
    ap.add_argument("--recipes", default="table",
                    help="comma list of recipe names or groups (table, candidates, all)")
    ap.add_argument("--tokens", type=int, default=48, help="prompt length (random ids)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    ap.add_argument("--chunked", action="store_true",
                    help="chunked delta rule (faster for long prompts; equal up to rounding)")
    ap.add_argument("--roles", action="store_true",
                    help="also print each projection role's own relative error")
    ap.add_argument("--work", default="out", help="where synthesized models are written")
    ap.add_argument("--json", help="write every number to this JSON file")
    ap.add_argument("--save-hidden", metavar="DIR",
                    help="write DIR/<model>.<tokens>.npz: the tokens, the float64 forward's normed "
                         "final hidden states, each recipe's metrics, the GGUF's sha256 "
                         "(scripts/int8_accuracy.py --hidden compares the GPU against them)")
    ap.add_argument("--list", action="store_true", help="list the recipes and exit")
    args = ap.parse_args(argv)
    if args.list:
        for r in qs.RECIPES.values():
            print(f"{r.name:18s} {r.note}")
        return 0
    if not args.models:
        ap.error("give at least one model (a GGUF path or a synth preset)")
    recipes = resolve_recipes(args.recipes)
    results = []
    for spec in args.models:
        path = resolve_model(spec, args.work)
        desc = load_model_desc(path)
        toks = np.random.default_rng(args.seed).integers(0, desc.n_vocab, args.tokens)
        t0 = time.perf_counter()
        res = qs.simulate(path, toks, recipes, chunked=args.chunked, role_stats=args.roles,
                          keep_hidden=bool(args.save_hidden),
                          log=lambda s: print(f"  {label(path)}: {s}", end="\r",
                                              file=sys.stderr, flush=True))
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # KiB -> GiB
        print(f"{label(path)}: {args.tokens} tokens, {len(recipes)} recipes + reference in "
              f"{wall:.0f} s (reference forward {res.metrics['exact'].seconds:.1f} s), peak RSS "
              f"so far {rss:.2f} GiB", file=sys.stderr)
        results.append((label(path), res, wall))
        if args.save_hidden:
            os.makedirs(args.save_hidden, exist_ok=True)
            out = os.path.join(args.save_hidden, f"{label(path)}.{args.tokens}.npz")
            np.savez(out, tokens=toks, sha256=file_sha256(path), gguf=os.path.basename(path),
                     recipes=np.array(list(res.hidden)), hidden_exact=res.hidden["exact"],
                     **{f"rel_{n}": m.rel for n, m in res.metrics.items()},
                     **{f"argmax_{n}": m.argmax for n, m in res.metrics.items()})
            print(f"{label(path)}: hidden states in {out}", file=sys.stderr)
    names = [r.name for r in recipes]
    cols = [m for m, _, _ in results]
    print(f"\nRelative logits error ||out-ref||/||ref|| over all {args.tokens} positions, argmax "
          f"agreement (prompt seed {args.seed}):\n")
    print("| recipe | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for n in names:
        cells = [f"{res.metrics[n].rel:.3g}, {100 * res.metrics[n].argmax:.0f}%"
                 for _, res, _ in results]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\nWorst single position, seconds for the recipe:\n")
    print("| recipe | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for n in ["exact"] + names:
        cells = [f"{res.metrics[n].worst:.3g}, {res.metrics[n].seconds:.1f} s"
                 for _, res, _ in results]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if args.roles:
        for m, res, _ in results:
            roles = sorted({r for n in names for r in res.metrics[n].roles})
            print(f"\n{m}: each projection's own relative error (its input as the recipe sees "
                  f"it, over all layers):\n")
            print("| recipe | " + " | ".join(roles) + " |")
            print("|---" * (len(roles) + 1) + "|")
            for n in names:
                rr = res.metrics[n].roles
                print(f"| {n} | " + " | ".join(f"{rr[r]:.2e}" if r in rr else "-" for r in roles)
                      + " |")
    if args.json:
        out = {"tokens": args.tokens, "seed": args.seed, "models": {
            m: {"wall_s": wall, "metrics": {n: vars(v) for n, v in res.metrics.items()}}
            for m, res, wall in results}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
