"""Benchmarks on the public wrappers (pyprefill.core, pyprefill.kernels, pyprefill.model), each
next to its peer in the same process: `pyprefill bench` / `python3 -m pyprefill.bench`.

    timer.py       the one timing loop (warm-up, batches, medians) and the L2 rotation count
    gemm.py        projections per leg vs torch fp16, Q4_K dequant, the fp16 and copy ceilings
    rows.py        RMSNorm, RoPE, SwiGLU (GB/s)
    gdn.py         conv1d, L2 norm, gates, the delta-rule scan vs FLA (sequential, chunked)
    attention.py   flash and cuBLAS paths vs torch SDPA
    model.py       whole-model prefill vs HF transformers, the roofline
    report.py      Markdown tables, JSON, the plot
    cli.py         the command line

Peers (torch, flash-linear-attention, transformers, matplotlib) are optional imports.
"""
from .cli import main

__all__ = ["main"]
