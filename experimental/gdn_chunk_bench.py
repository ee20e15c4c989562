"""Times the chunked delta rule (pf_gdn_scan with path PF_GDN_SCAN_CHUNKED; the kernels of
experimental/gdn_chunked.patch, written against the 0.1 API, are to land behind that path) against
the sequential scan (path "sequential") and, when importable, FLA's chunk_gated_delta_rule, at
qwen35-4b shapes (Hk = 16, Hv = 32, dk = dv = 128), and prints each path's error against the
float64 recurrence on a short prompt first. Run from the repository root with the chunked path
built:  python3 experimental/gdn_chunk_bench.py
Our timings: host wall clock around a batch of calls + ctx.synchronize() (the library runs on its
own stream); FLA: the same around torch calls + torch.cuda.synchronize()."""
import sys
import time

import numpy as np

sys.path.insert(0, "tests/python")
from helpers import rel_error  # noqa: E402
from pyprefill.core import Context  # noqa: E402
from pyprefill.kernels import gdn as G  # noqa: E402
from test_kernel_gdn import ref_scan, scan_inputs  # noqa: E402

HK, HV, DK, DV = 16, 32, 128, 128
ctx = Context(0)
rng = np.random.default_rng(1)

# error against float64 (short prompt: the float64 recurrence is a Python loop)
for T in (777, 2048):
    q, k, v, beta, g, S0 = scan_inputs(rng, T, HK, HV, DK, DV)
    ro, rS = ref_scan(q, k, v, beta, g, S0)
    for name in ("sequential", "chunked"):
        o, S = G.gdn_scan_np(ctx, q, k, v, beta, g, S0, path=name)
        eo, wo = rel_error(ro, o)
        es, _ = rel_error(rS.reshape(HV, -1), S.reshape(HV, -1))
        print(f"err T={T} {name}: o whole {eo:.2e} worst row {wo:.2e}, state {es:.2e}")


def bench_ours(T, path, iters=20):
    q, k, v, beta, g, S0 = scan_inputs(rng, T, HK, HV, DK, DV)
    bufs = [ctx.buffer(a.nbytes) for a in (q, k, v, beta, g, S0)]
    for b, a in zip(bufs, (q, k, v, beta, g, S0)):
        b.upload(a)
    bq, bk, bv, bb, bg, bs = bufs
    bo = ctx.buffer(v.nbytes)
    call = lambda: G.gdn_scan(ctx, bq, bk, bv, bb, bg, bs, bo, T, HK, HV, DK, DV, path)  # noqa: E731
    call()
    ctx.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    ctx.synchronize()
    dt = (time.perf_counter() - t) / iters
    for b in bufs + [bo]:
        b.close()
    return dt


def bench_fla(T, iters=20):
    try:
        import torch
        import torch.nn.functional as F
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001
        return None, f"FLA not importable ({type(exc).__name__})"
    dev = "cuda"
    q = F.normalize(torch.randn(1, T, HV, DK, device=dev), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(1, T, HV, DK, device=dev), dim=-1).to(torch.bfloat16)
    v = torch.randn(1, T, HV, DV, device=dev, dtype=torch.bfloat16)
    beta = torch.rand(1, T, HV, device=dev, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(1, T, HV, device=dev, dtype=torch.float32))
    h0 = torch.zeros(1, HV, DK, DV, device=dev, dtype=torch.float32)
    f = lambda: chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,  # noqa: E731
                                       output_final_state=True)
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters, "bf16, Hv heads of q/k expanded"


for T in (2048, 8192):
    ts = bench_ours(T, "sequential")
    tc = bench_ours(T, "chunked")
    tf, note = bench_fla(T)
    fla = f"FLA chunk {tf * 1e3:.3f} ms ({note})" if tf else note
    print(f"T={T} Hk={HK} Hv={HV} d={DK}: sequential {ts * 1e3:.3f} ms, chunked {tc * 1e3:.3f} ms "
          f"({ts / tc:.2f}x), {fla}")
