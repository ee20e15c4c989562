#!/usr/bin/env python3
"""The 8-bit leg's whole-model accuracy table (issue 31; pyprefill.bench.accuracy): the simulated
llama.cpp bar and recipe, the GPU's int8 and f16 legs and (--hf) HF transformers bf16, each
against the float64 forward. Needs a CUDA device (Hopper for the int8 leg).

    python scripts/int8_accuracy.py qwen35-0.8b qwen3-0.6b tests/data/qwen35_hv1.mix.gguf \\
        --tokens 48 1024 --hf --gguf-dir /tmp/gguf --json out/int8_accuracy.json
MODEL: a GGUF path, or a synth preset (written as q4_k_m into --gguf-dir, reused).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyprefill.bench import accuracy  # noqa: E402
from pyprefill.formats.synth import write_synthetic  # noqa: E402
from pyprefill.model import inspect  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", nargs="+", type=int, default=[48])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf", action="store_true", help="also HF transformers bf16 (torch, CUDA)")
    ap.add_argument("--gguf-dir", default=tempfile.gettempdir())
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = []
    for m in a.models:
        path = m
        if not os.path.exists(m):
            path = os.path.join(a.gguf_dir, f"bench-{m}-q4_k_m.gguf")
            if not os.path.exists(path):
                write_synthetic(m, "q4_k_m", path, progress=False)
        n_vocab = inspect(path)["n_vocab"]
        for T in a.tokens:
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
