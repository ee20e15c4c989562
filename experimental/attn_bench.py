import sys, time, math
import numpy as np
sys.path.insert(0, "tests/python")
from pyprefill.core import Context
from pyprefill.kernels import attention as A
from test_kernel_attention import ref_attention, make_inputs
from helpers import rel_error

ctx = Context(0)
rng = np.random.default_rng(1)
# error margins
for (H, Hkv, D, qm) in [(16, 4, 256, 2), (32, 8, 128, 1)]:
    for rows, pos0 in [(777, 300), (1, 2000)]:
        for path, kv in [("cublas", "f32"), ("cublas", "f16"), ("flash", "f16")]:
            q, k, v, qhs = make_inputs(rng, H=H, Hkv=Hkv, D=D, qmult=qm, rows=rows, pos0=pos0, kv_dtype=kv)
            out = A.attention_np(ctx, q, k, v, n_heads=H, n_kv_heads=Hkv, head_dim=D, pos0=pos0, q_head_stride=qhs, path=path)
            ref = ref_attention(q, k, v, H=H, Hkv=Hkv, D=D, pos0=pos0, qhs=qhs)
            print(f"err H={H} D={D} rows={rows} pos0={pos0} {path}/{kv}: whole {rel_error(ref, out)[0]:.2e} worst {rel_error(ref, out)[1]:.2e}")

def bench(H, Hkv, D, rows, pos0, path, kv="f16", iters=20):
    kv_dim = Hkv * D
    cap = pos0 + rows
    esz = 2 if kv == "f16" else 4
    q = ctx.buffer(rows * H * D * 4); o = ctx.buffer(rows * H * D * 4)
    kc = ctx.buffer(cap * kv_dim * esz); vc = ctx.buffer(cap * kv_dim * esz)
    kc.upload((rng.standard_normal((cap, kv_dim)) * 1).astype(np.float16 if kv == "f16" else np.float32))
    vc.upload((rng.standard_normal((cap, kv_dim)) * 1).astype(np.float16 if kv == "f16" else np.float32))
    q.upload(rng.standard_normal((rows, H * D)).astype(np.float32))
    kw = dict(n_heads=H, n_kv_heads=Hkv, head_dim=D, rows=rows, pos0=pos0, path=path, kv_dtype=kv)
    A.attention(ctx, q, kc, vc, o, **kw); ctx.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        A.attention(ctx, q, kc, vc, o, **kw)
    ctx.synchronize()
    dt = (time.perf_counter() - t) / iters
    # causal flops: 4 * H * D * sum over rows of visible keys
    keys = rows * pos0 + rows * (rows + 1) / 2
    fl = 4 * H * D * keys
    for b in (q, o, kc, vc): b.close()
    return dt, fl / dt / 1e12

def torch_sdpa(H, Hkv, D, rows, pos0, iters=20):
    import torch
    import torch.nn.functional as F
    q = torch.randn(1, H, rows, D, device="cuda", dtype=torch.float16)
    k = torch.randn(1, Hkv, pos0 + rows, D, device="cuda", dtype=torch.float16)
    v = torch.randn(1, Hkv, pos0 + rows, D, device="cuda", dtype=torch.float16)
    if pos0 == 0:
        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        mask = torch.arange(pos0 + rows, device="cuda")[None, :] <= (pos0 + torch.arange(rows, device="cuda"))[:, None]
        f = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    f(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters): f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters

for (name, H, Hkv, D) in [("qwen35-4B", 16, 4, 256), ("qwen3-4B", 32, 8, 128)]:
    for rows, pos0 in [(4096, 0), (8192, 0), (512, 8192), (1, 8192), (1, 100000)]:
        line = f"{name} rows={rows} pos0={pos0}:"
        for path, kv in [("flash", "f16"), ("cublas", "f16"), ("cublas", "f32")]:
            try:
                dt, tf = bench(H, Hkv, D, rows, pos0, path, kv)
                line += f"  {path}/{kv} {dt*1e3:.3f} ms ({tf:.1f} TF/s)"
            except Exception as e:
                line += f"  {path}/{kv} ERR {e}"
        try:
            line += f"  torch-sdpa {torch_sdpa(H, Hkv, D, rows, pos0)*1e3:.3f} ms"
        except Exception as e:
            line += f"  torch ERR {str(e)[:80]}"
        print(line, flush=True)
