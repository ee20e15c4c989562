"""Where a whole-model prefill's GPU time goes: a synthetic GGUF of each preset (formats.synth),
one session (the settings of `pyprefill bench model`: gemm auto with the fp16 cache, the
session's own step with --chunk 0), three timed prefills of T random tokens (tok/s at their
median, the benchmarks' convention), then one under torch.profiler (CUPTI sees every kernel of
the process), its GPU time by kernel family and by kernel.

    python3 scripts/profile_model.py --models qwen35-4b qwen3-4b -T 32768

Kernels that overlap (the delta rule's state kernel runs as the prep kernel's programmatic
dependent and waits inside its own duration) are each counted whole, so the kernel time can
exceed the wall. Needs a GPU, torch and the library (PYPREFILL_LIBRARY)."""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time

# Kernel name -> family, the first rule that matches (lower case).
FAMILIES = (
    ("attention", ("attn", "flash")),
    ("gdn", ("gdn", "delta", "conv1d")),
    ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "q16", "cublas", "gemv")),
    ("copy", ("memcpy", "memset", "copy")),
)


def family(kernel: str) -> str:
    """The family of a kernel name (FAMILIES), else "other"."""
    name = kernel.lower()
    for fam, keys in FAMILIES:
        if any(k in name for k in keys):
            return fam
    return "other"


def summarize(times: dict[str, tuple[float, int]], top: int = 16) -> list[str]:
    """Lines of a profile: {kernel: (ms, calls)} -> the families' shares, then the top kernels."""
    total = sum(ms for ms, _ in times.values())
    fam: dict[str, float] = collections.defaultdict(float)
    for name, (ms, _) in times.items():
        fam[family(name)] += ms
    lines = [f"   kernel time {total:.1f} ms; families: " + ", ".join(
        f"{f} {ms:.1f} ms ({100 * ms / total if total else 0:.0f}%)"
        for f, ms in sorted(fam.items(), key=lambda x: -x[1]))]
    for name, (ms, calls) in sorted(times.items(), key=lambda x: -x[1][0])[:top]:
        lines.append(f"   {ms:8.2f} ms {calls:5d}x  {name}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["qwen35-4b"], help="formats.synth presets")
    p.add_argument("-T", "--tokens", type=int, default=32768, help="prompt tokens (default 32768)")
    p.add_argument("--mix", default="q4_k_m", help="quant mix of the synthetic GGUF (default q4_k_m)")
    p.add_argument("--gemm", default="auto", help="GEMM leg (default auto)")
    p.add_argument("--chunk", type=int, default=0, help="session chunk (default 0: the session's own)")
    a = p.parse_args(argv)
    if a.tokens < 1:
        p.error(f"-T must be >= 1 (got {a.tokens})")
    if a.chunk < 0:
        p.error(f"--chunk must be >= 0 (got {a.chunk})")
    from pyprefill.formats.synth import MIXES, PRESETS
    unknown = [m for m in a.models if m.lower() not in PRESETS]
    if unknown:
        p.error(f"--models: no preset {', '.join(unknown)} (presets: {', '.join(PRESETS)})")
    if a.mix.lower() not in MIXES:
        p.error(f"--mix: no mix {a.mix} (mixes: {', '.join(MIXES)})")
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pyprefill.formats.synth import write_synthetic
    from pyprefill.model import Model
    torch.zeros(1, device="cuda")   # the CUDA context before the profiler starts
    rng = np.random.default_rng(1)
    for preset in a.models:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{preset}.gguf")
            write_synthetic(preset, a.mix, path, progress=False)
            model = Model.load(path, gemm=a.gemm, prewarm=a.gemm in ("auto", "f16"), progress=False)
            with model, model.session(max_tokens=a.tokens, chunk=a.chunk, gemm=a.gemm) as s:
                ids = rng.integers(0, model.n_vocab, a.tokens, dtype=np.int32)
                walls = []
                for _ in range(3):
                    s.reset()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    s.prefill(ids)
                    torch.cuda.synchronize()
                    walls.append((time.perf_counter() - t0) * 1e3)
                s.reset()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    t0 = time.perf_counter()
                    s.prefill(ids)
                    torch.cuda.synchronize()
                    wall = (time.perf_counter() - t0) * 1e3
        times: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
                times[ev.name[:90]][0] += us / 1e3
                times[ev.name[:90]][1] += 1
        med = statistics.median(walls)   # the benchmarks' convention: the median of the repeats
        print(f"== {preset} pp{a.tokens}: walls {[round(w, 1) for w in walls]} ms "
              f"({a.tokens / (med / 1e3):.0f} tok/s at the median), profiled wall {wall:.1f} ms")
        print("\n".join(summarize({k: (v[0], v[1]) for k, v in times.items()})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
