#!/usr/bin/env python3
"""The 8-bit leg's whole-model accuracy table (issue 31; pyprefill.bench.accuracy): the simulated
llama.cpp bar and recipe, the GPU's int8 and f16 legs and (--hf) HF transformers bf16, each
against the float64 forward. Needs a CUDA device (Hopper for the int8 leg).

    python scripts/int8_accuracy.py qwen35-0.8b qwen3-0.6b tests/data/qwen35_hv1.mix.gguf \\
        --tokens 48 --hf --gguf-dir /tmp/gguf --json out/int8_accuracy.json
    python scripts/int8_accuracy.py --hidden out/hs/*.npz      # sim_8bit.py --save-hidden runs
    python scripts/int8_accuracy.py qwen35-0.8b --long 1024 16384 32768
MODEL: a GGUF path, or a synth preset (written as q4_k_m into --gguf-dir, reused; seed 0, as
scripts/sim_8bit.py writes them).
"""
import argparse
import json
import os
import sys
import tempfile
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyprefill.bench import accuracy  # noqa: E402
from pyprefill.bench.model import synthetic_gguf  # noqa: E402
from pyprefill.model import inspect  # noqa: E402


def model_path(m: str, gguf_dir: str) -> str:
    """A GGUF path, or the synth preset's file as the model bench writes and reuses it."""
    if os.path.exists(m):
        return m
    log = types.SimpleNamespace(say=lambda line: print(line, file=sys.stderr))
    return synthetic_gguf(log, m, "q4_k_m", gguf_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--hidden", nargs="+", default=[], metavar="NPZ",
                    help="compare against simulations saved by sim_8bit.py --save-hidden (the "
                         "model: the preset of the file's name in --gguf-dir, checked by sha256)")
    ap.add_argument("--long", nargs="+", type=int, default=[], metavar="T",
                    help="also the long-prompt check (int8 vs f16 on the last 64 positions)")
    ap.add_argument("--tokens", nargs="+", type=int, default=[48])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf", action="store_true", help="also HF transformers bf16 (torch, CUDA)")
    ap.add_argument("--gguf-dir", default=tempfile.gettempdir())
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = []
    for npz in a.hidden:
        z = np.load(npz)
        preset = str(z["gguf"]).removesuffix(".gguf").removesuffix(".q4_k_m")
        path = model_path(preset, a.gguf_dir)
        if accuracy.file_sha256(path) != str(z["sha256"]):
            print(f"{npz}: {path} is not the simulated file (sha256 differs)", file=sys.stderr)
            return 1
        row = accuracy.measure_hidden(npz, path)
        rows.append(row)
        print(accuracy.table([row]).splitlines()[-1], flush=True)
    for m in a.models:
        path = model_path(m, a.gguf_dir)
        n_vocab = inspect(path)["n_vocab"]
        if a.long:
            for r in accuracy.long_context(path, a.long):
                print(f"long: {os.path.basename(path)} T={r['tokens']}: finite {r['finite']}, "
                      f"int8 vs f16 over the last 64 positions {r['int8_vs_f16']:.4g}", flush=True)
        for T in a.tokens if not a.long else []:
            toks = np.random.default_rng(a.seed).integers(0, n_vocab, size=T).astype(np.int32)
            row = accuracy.measure(path, toks, hf=a.hf)
            rows.append(row)
            print(accuracy.table([row]).splitlines()[-1], flush=True)
    print()
    print(accuracy.table(rows))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
