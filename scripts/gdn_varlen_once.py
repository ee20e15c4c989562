"""One delta-rule call over many sequences (pf_gdn_scan_varlen, the default chunked path), a few
times, for a profiler or a sanitizer to watch: N sequences of L rows at the qwen35-4b GDN shape
(16 key heads, 32 value heads, dk = dv = 128), fp32 inputs as the engine's producers write them.

    ncu --kernel-name regex:gdn --set full -o varlen python3 scripts/gdn_varlen_once.py 4 8192 2
    compute-sanitizer --tool racecheck python3 scripts/gdn_varlen_once.py 3 200 1

Needs a GPU and the library (PYPREFILL_LIBRARY). Prints nothing but "done N L"."""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("n", type=int, help="sequences")
    p.add_argument("L", type=int, help="rows per sequence")
    p.add_argument("reps", type=int, nargs="?", default=3, help="calls (default 3)")
    p.add_argument("--hv", type=int, default=32, help="value heads (default 32; 16 key heads)")
    a = p.parse_args(argv)
    from pyprefill.core import Context
    from pyprefill.kernels import gdn as K
    from pyprefill.kernels._common import View
    hk, hv, dk, dv = 16, a.hv, 128, 128
    T = a.n * a.L
    rng = np.random.default_rng(0)

    def r(*shape, scale=1.0):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    q, k = r(T, hk, dk), r(T, hk, dk)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.float32(np.sqrt(dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = r(T, hv, dv)
    beta = (1 / (1 + np.exp(-r(T, hv)))).astype(np.float32)
    g = (-np.abs(r(T, hv, scale=0.3)) - 0.01).astype(np.float32)
    with Context(0) as ctx:
        bufs = [ctx.upload(np.ascontiguousarray(x.reshape(T, -1))) for x in (q, k, v, beta, g)]
        states = ctx.upload(r(a.n * hv * dk, dv, scale=0.1))
        o = ctx.upload(np.zeros((T, hv * dv), np.float32))
        cu = np.arange(a.n + 1, dtype=np.int64) * a.L
        for _ in range(a.reps):
            K.gdn_scan_varlen(ctx, *(View(b) for b in bufs), View(states), View(o), cu, n_states=a.n,
                              n_k_heads=hk, n_v_heads=hv, dk=dk, dv=dv)
        ctx.synchronize()
    print("done", a.n, a.L)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
