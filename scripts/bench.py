#!/usr/bin/env python3
"""pyprefill benchmarks on a GPU machine: kernels and whole-model prefill, each next to its peer.

    python3 scripts/bench.py kernels|model|all [--out DIR] [--quick]

kernels  per op at T = 512 / 2048 / 8192, qwen35-4b shapes (spec §5.1): projections on the f16
         and f32 legs vs torch fp16 `x @ w.T`, Q4_K dequant to fp16, rmsnorm, rope, conv1d,
         l2norm, gates, the delta-rule scan vs FLA `chunk_gated_delta_rule`, attention (flash and
         cuBLAS paths, fp16 KV) vs torch SDPA.
model    whole-model prefill tokens/s on synthetic GGUFs (qwen35-4b, qwen3-4b, q4_k_m) at
         512 / 2048 / 8192 tokens, f16 and f32 legs, vs HF transformers bf16 on the same
         (dequantized) weights, and the roofline 2 x non-embedding params x tokens over the
         measured torch fp16 GEMM peak.

Method (/work/.library/device/METHOD.md): random inputs (never zeros), rotated among several
sets when one set fits in L2, warm-up first, median of several timed batches. Our library runs
on its own non-blocking stream, so its ops are timed with the host clock around a batch of
calls followed by Context.synchronize() (per-call time = batch time / calls; one cffi call is
~1 us of host time); torch peers with CUDA events on torch's stream. Whole-model prefill is
wall clock (prefill returns once the logits are on the host).

Everything degrades: a missing torch, FLA, library function or a failing op prints one
"skipped:" line and the run continues; without a GPU it prints "no GPU: benchmarks skipped"
and exits 0. Results: bench_<name>.json (every repeat) and bench_<name>.md under --out.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

L2_BYTES = 50 << 20          # H200 L2 is 50 MiB (60 MiB on some parts): rotate past 2x this
MIB = 1 << 20

# qwen35-4b shapes (spec §5.1)
D_MODEL, N_FF = 2560, 9216
N_HEAD, N_HEAD_KV, HEAD_DIM, ROT_DIM, ROPE_BASE = 16, 4, 256, 64, 1e7
GDN_HK, GDN_HV, GDN_DK, GDN_DV, CONV_K = 16, 32, 128, 128, 4
CONV_DIM = 2 * GDN_HK * GDN_DK + GDN_HV * GDN_DV   # 8192
VALUE_DIM = GDN_HV * GDN_DV                         # 4096
EPS = 1e-6

SKIPPED: list[dict] = []


def skip(what: str, why) -> None:
    why = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
    SKIPPED.append({"what": what, "why": why})
    print(f"skipped: {what}: {why}", flush=True)


class Skip(Exception):
    pass


# ------------------------------------------------------------------------------ environment

def try_torch():
    try:
        import torch
        return torch
    except Exception as exc:   # noqa: BLE001  (ImportError or a broken install)
        skip("torch peers", f"torch not importable ({exc})")
        return None


def try_pyprefill():
    """(core module, ffi, lib) or None with a printed reason."""
    try:
        from pyprefill import core
        from pyprefill._ffi import ffi, lib
        return core, ffi, lib
    except Exception as exc:   # noqa: BLE001
        skip("pyprefill", f"library not loadable ({str(exc).splitlines()[0]})")
        return None


def gpu_present(torch, pp) -> bool:
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return True
        except Exception:   # noqa: BLE001
            pass
    if pp is not None:
        try:
            return pp[0].device_count() > 0
        except Exception:   # noqa: BLE001
            return False
    return False


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:   # noqa: BLE001
        pass
    return None


def meta(torch, pp) -> dict:
    m = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
         "python": platform.python_version(), "commit": git_commit(),
         "library": os.environ.get("PYPREFILL_LIBRARY")}
    if torch is not None:
        m["torch"] = torch.__version__
        try:
            m["device"] = torch.cuda.get_device_name(0)
            m["cuda"] = torch.version.cuda
        except Exception:   # noqa: BLE001
            pass
    if pp is not None:
        try:
            m["pyprefill_version"] = pp[0].version()
        except Exception:   # noqa: BLE001
            pass
    for mod in ("transformers", "fla", "triton"):
        try:
            m[mod] = __import__(mod).__version__
        except Exception:   # noqa: BLE001
            m[mod] = None
    return m


# ------------------------------------------------------------------------------ timing

def summarize(per_call_ms: list[float]) -> dict:
    return {"median_ms": statistics.median(per_call_ms), "min_ms": min(per_call_ms),
            "max_ms": max(per_call_ms), "reps_ms": per_call_ms}


def _calls_per_batch(est_s: float, target_s: float, cap: int) -> int:
    return max(1, min(cap, int(math.ceil(target_s / max(est_s, 1e-7)))))


def time_ours(fn, ctx, reps: int, warm: int = 2, target_s: float = 0.02, cap: int = 200) -> dict:
    """fn(i) enqueues one call on the library's stream. Host clock around a batch of calls plus
    ctx.synchronize(); the per-call time of each batch; median over `reps` batches."""
    for i in range(warm):
        fn(i)
    ctx.synchronize()
    t0 = time.perf_counter()
    fn(warm)
    ctx.synchronize()
    n = _calls_per_batch(time.perf_counter() - t0, target_s, cap)
    out = []
    for r in range(reps):
        t0 = time.perf_counter()
        for i in range(n):
            fn(r * n + i)
        ctx.synchronize()
        out.append((time.perf_counter() - t0) * 1e3 / n)
    d = summarize(out)
    d["calls_per_batch"] = n
    return d


def time_torch(torch, fn, reps: int, warm: int = 2, target_s: float = 0.02, cap: int = 200) -> dict:
    """fn(i) launches on torch's current stream; CUDA events around a batch of calls."""
    for i in range(warm):
        fn(i)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(warm)
    e.record()
    e.synchronize()
    n = _calls_per_batch(s.elapsed_time(e) / 1e3, target_s, cap)
    out = []
    for r in range(reps):
        s.record()
        for i in range(n):
            fn(r * n + i)
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / n)
    d = summarize(out)
    d["calls_per_batch"] = n
    return d


def n_sets(bytes_per_set: int, cap: int = 8) -> int:
    """Input sets to rotate so that one pass over them exceeds 2x L2."""
    return max(1, min(cap, math.ceil(2 * L2_BYTES / max(bytes_per_set, 1))))


# ------------------------------------------------------------------------------ C API access

class CApi:
    """Feature detection over libprefill's C API: a function is used only when it exists in the
    loaded library AND its declared argument types are the ones this script passes."""

    def __init__(self, core, ffi, lib):
        self.core, self.ffi, self.lib = core, ffi, lib
        from pyprefill._errors import _check
        self.check = _check

    def fn(self, names, kinds: list[str]):
        names = [names] if isinstance(names, str) else names
        seen = []
        for name in names:
            try:
                f = getattr(self.lib, name)
            except (AttributeError, Exception) as exc:   # noqa: BLE001 undeclared or unexported
                seen.append(f"{name}: absent ({str(exc).splitlines()[0][:80]})")
                continue
            args = [a.cname.replace("const ", "").strip() for a in self.ffi.typeof(f).args]
            if args != kinds:
                seen.append(f"{name}({', '.join(args)}) differs from the expected "
                            f"({', '.join(kinds)})")
                continue
            return f
        raise Skip("; ".join(seen))

    def enum(self, name: str) -> int:
        try:
            return int(getattr(self.lib, name))
        except Exception as exc:   # noqa: BLE001
            raise Skip(f"{name} not declared ({exc})")

    def call(self, f, *args) -> None:
        self.check(f(*args))


CTX, BUF, W, I64, I32, F32 = "pf_context *", "pf_buffer *", "pf_weight *", "int64_t", "int32_t", "float"


# ------------------------------------------------------------------------------ kernels

class KernelBench:
    def __init__(self, args, torch, pp):
        self.args, self.torch = args, torch
        self.rows: list[dict] = []
        self.api = CApi(*pp) if pp is not None else None
        self.ctx = None
        import numpy as np
        self.np = np
        self.rng = np.random.default_rng(1234)
        self.reps = args.reps

    # -- helpers
    def rand(self, *shape, scale=1.0):
        np = self.np
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

    def upload(self, arr):
        return self.ctx.upload(self.np.ascontiguousarray(arr))

    def add(self, op, T, impl, t, *, flops=None, nbytes=None, peer_of=None, note=""):
        row = {"op": op, "T": T, "impl": impl, **t, "note": note}
        if flops:
            row["flops"] = flops
            row["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
        if nbytes:
            row["bytes"] = nbytes
            row["gbps"] = nbytes / (t["median_ms"] * 1e-3) / 1e9
        if peer_of is not None:
            row["ratio_vs_peer"] = peer_of["median_ms"] / t["median_ms"]   # >1: ours faster
        self.rows.append(row)
        rate = (f" {row['tflops']:8.1f} TF/s" if "tflops" in row else
                f" {row['gbps']:8.1f} GB/s" if "gbps" in row else "")
        print(f"  {op:14s} T={T:5d} {impl:22s} {t['median_ms']:9.4f} ms{rate}", flush=True)
        return row

    def guarded(self, what, f, *a, **kw):
        try:
            return f(*a, **kw)
        except Skip as exc:
            skip(what, exc)
        except Exception as exc:   # noqa: BLE001
            skip(what, f"{type(exc).__name__}: {exc}")
            if self.args.verbose:
                traceback.print_exc()
        return None

    # -- run
    def run(self) -> dict:
        Ts = [512] if self.args.quick else self.args.lengths
        if self.api is not None:
            try:
                self.ctx = self.api.core.Context(0)
            except Exception as exc:   # noqa: BLE001
                skip("pyprefill kernels", f"no context ({exc})")
                self.api = None
        if self.api is None:
            skip("pyprefill kernels", "library unavailable: only the torch peers run")
        if self.torch is not None:
            self.guarded("torch fp16 peak", self.peak)
        for T in Ts:
            print(f"-- kernels T={T}", flush=True)
            for name, n, k in (("attn_qkv", CONV_DIM, D_MODEL), ("ffn_gate", N_FF, D_MODEL),
                               ("ffn_down", D_MODEL, N_FF)):
                self.guarded(f"proj {name} T={T}", self.proj, name, T, n, k)
            if T == Ts[0]:
                self.guarded("dequant Q4_K", self.dequant)
            self.guarded(f"rmsnorm T={T}", self.rmsnorm, T)
            self.guarded(f"rope T={T}", self.rope, T)
            self.guarded(f"conv1d T={T}", self.conv1d, T)
            self.guarded(f"l2norm T={T}", self.l2norm, T)
            self.guarded(f"gates T={T}", self.gates, T)
            self.guarded(f"delta-rule scan T={T}", self.scan, T)
            self.guarded(f"attention T={T}", self.attention, T)
            gc.collect()
        if self.ctx is not None:
            self.ctx.close()
        return {"rows": self.rows}

    def peak(self):
        torch = self.torch
        n = 4096 if self.args.quick else 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        t = time_torch(torch, lambda i: a @ b.T, self.reps)
        self.add("peak_gemm", n, "torch fp16", t, flops=2 * n ** 3)
        del a, b

    # -- projections
    def proj(self, name, T, n, k):
        np, torch = self.np, self.torch
        flops = 2 * T * n * k
        peer = None
        if torch is not None:
            sets = n_sets(T * k * 2 + T * n * 2, cap=4)
            xs = [torch.randn(T, k, device="cuda", dtype=torch.float16) for _ in range(sets)]
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) / 50 for _ in range(2)]
            t = time_torch(torch, lambda i: xs[i % sets] @ ws[i % 2].T, self.reps)
            peer = self.add(f"proj {name}", T, "torch fp16 x@w.T", t, flops=flops)
            del xs, ws
        if self.api is None:
            return
        api = self.api
        project = api.fn("pf_project", [CTX, W, BUF, I64, I64, BUF, I64, I32, I32])
        from pyprefill.formats.quant import random_blocks
        nw = 2
        weights = [self.ctx.weight("Q4_K", n, k, random_blocks(n, k, 12, self.rng)) for _ in range(nw)]
        sets = n_sets(T * (k + n) * 4, cap=4)
        xs = [self.upload(self.rand(T, k)) for _ in range(sets)]
        ys = [self.ctx.buffer(T * n * 4) for _ in range(sets)]
        try:
            for leg_name, enum in (("f16", "PF_GEMM_F16"), ("f32", "PF_GEMM_F32")):
                leg = api.enum(enum)
                if leg_name == "f16":
                    cache = api.fn("pf_weight_cache_f16", [W])
                    for w in weights:
                        api.call(cache, w.ptr)
                reps = self.reps if leg_name == "f16" else max(2, self.reps // 2)

                def f(i, leg=leg):
                    j = i % sets
                    api.call(project, self.ctx.ptr, weights[i % nw].ptr, xs[j].ptr, T, k,
                             ys[j].ptr, n, 0, leg)
                t = time_ours(f, self.ctx, reps, target_s=0.02 if leg_name == "f16" else 0.01)
                self.add(f"proj {name}", T, f"ours {leg_name} leg" + (" (fp16 cache)" if leg_name == "f16" else ""),
                         t, flops=flops, peer_of=peer)
        finally:
            for o in (*weights, *xs, *ys):
                o.close()

    def dequant(self):
        api = self.api
        if api is None:
            raise Skip("library unavailable")
        deq = api.fn("pf_dequantize", [CTX, W, BUF, I32])
        from pyprefill.formats.quant import random_blocks
        n, k = N_FF, D_MODEL
        blocks = random_blocks(n, k, 12, self.rng)
        ws = [self.ctx.weight("Q4_K", n, k, blocks) for _ in range(2)]
        outs = [self.ctx.buffer(n * k * 2) for _ in range(2)]
        try:
            t = time_ours(lambda i: api.call(deq, self.ctx.ptr, ws[i % 2].ptr, outs[i % 2].ptr, 1),
                          self.ctx, self.reps)
            self.add("dequant Q4_K", n, "ours -> fp16", t, nbytes=blocks.nbytes + n * k * 2,
                     note=f"{n}x{k}; bytes read + written")
        finally:
            for o in (*ws, *outs):
                o.close()

    # -- row ops (element-wise / per-row kernels: GB/s of the bytes they must move)
    def _rowop(self, op, T, f, nbytes, bufs, note=""):
        try:
            t = time_ours(f, self.ctx, self.reps)
            self.add(op, T, "ours", t, nbytes=nbytes, note=note)
        finally:
            for b in bufs:
                b.close()

    def rmsnorm(self, T):
        api = self._api()
        fn = api.fn("pf_rms_norm_rows", [CTX, BUF, I64, I64, BUF, I64, BUF, I64, I64, I64, I64, F32])
        sets = n_sets(T * D_MODEL * 8)
        xs = [self.upload(self.rand(T, D_MODEL)) for _ in range(sets)]
        ys = [self.ctx.buffer(T * D_MODEL * 4) for _ in range(sets)]
        w = self.upload(1 + 0.1 * self.rand(D_MODEL))
        self._rowop("rmsnorm", T, lambda i: api.call(fn, self.ctx.ptr, xs[i % sets].ptr, 0, D_MODEL, w.ptr, 0,
                                                    ys[i % sets].ptr, 0, D_MODEL, T, D_MODEL, EPS),
                    T * D_MODEL * 8, [*xs, *ys, w], note=f"[T][{D_MODEL}]")

    def rope(self, T):
        api = self._api()
        fn = api.fn("pf_rope_neox_rows", [CTX, BUF, I64, I64, I64, I32, I64, I32, I32, I64, F32])
        ld = N_HEAD * 2 * HEAD_DIM                 # qwen35 q rows: [q | gate] per head
        sets = n_sets(T * ld * 4)
        xs = [self.upload(self.rand(T, ld)) for _ in range(sets)]
        nbytes = T * N_HEAD * ROT_DIM * 4 * 2
        self._rowop("rope", T, lambda i: api.call(fn, self.ctx.ptr, xs[i % sets].ptr, 0, ld, T, N_HEAD,
                                                 2 * HEAD_DIM, HEAD_DIM, ROT_DIM, 0, ROPE_BASE),
                    nbytes, xs, note=f"q H={N_HEAD} D={HEAD_DIM} rot={ROT_DIM}, in place")

    def conv1d(self, T):
        api = self._api()
        fn = api.fn("pf_gdn_conv1d_rows", [CTX, BUF, I64, I64, BUF, I64, BUF, I64, BUF, I64, I64, I64, I64, I32])
        sets = n_sets(T * CONV_DIM * 8)
        ms = [self.upload(self.rand(T, CONV_DIM)) for _ in range(sets)]
        us = [self.ctx.buffer(T * CONV_DIM * 4) for _ in range(sets)]
        win = self.upload(self.rand(CONV_K - 1, CONV_DIM))
        wt = self.upload(self.rand(CONV_DIM, CONV_K, scale=0.5))
        self._rowop("conv1d+silu", T, lambda i: api.call(fn, self.ctx.ptr, ms[i % sets].ptr, 0, CONV_DIM, win.ptr, 0,
                                                        wt.ptr, 0, us[i % sets].ptr, 0, CONV_DIM, T, CONV_DIM,
                                                        CONV_K),
                    T * CONV_DIM * 8, [*ms, *us, win, wt], note=f"conv_dim={CONV_DIM} Kc={CONV_K}")

    def l2norm(self, T):
        api = self._api()
        fn = api.fn("pf_gdn_l2norm_rows", [CTX, BUF, I64, I64, I64, I32, I64, I32, F32, F32])
        sets = n_sets(T * CONV_DIM * 4)
        xs = [self.upload(self.rand(T, CONV_DIM)) for _ in range(sets)]
        nh = 2 * GDN_HK                           # q and k heads, contiguous at the row start
        self._rowop("l2norm", T, lambda i: api.call(fn, self.ctx.ptr, xs[i % sets].ptr, 0, CONV_DIM, T, nh,
                                                   GDN_DK, GDN_DK, EPS, 1.0),
                    T * nh * GDN_DK * 8, xs, note=f"q+k {nh} heads x {GDN_DK}, in place")

    def gates(self, T):
        api = self._api()
        fn = api.fn("pf_gdn_gates_rows", [CTX, BUF, I64, I64, BUF, I64, I64, BUF, I64, BUF, I64,
                                         BUF, I64, I64, BUF, I64, I64, I64, I32])
        Hv = GDN_HV
        sets = n_sets(T * Hv * 16)
        bs = [self.upload(self.rand(T, Hv)) for _ in range(sets)]
        als = [self.upload(self.rand(T, Hv)) for _ in range(sets)]
        betas = [self.ctx.buffer(T * Hv * 4) for _ in range(sets)]
        gs = [self.ctx.buffer(T * Hv * 4) for _ in range(sets)]
        a = self.upload(-self.np.exp(self.rand(Hv, scale=0.5)))
        dt = self.upload(self.rand(Hv, scale=0.5))
        self._rowop("gates", T, lambda i: api.call(fn, self.ctx.ptr, bs[i % sets].ptr, 0, Hv, als[i % sets].ptr, 0, Hv,
                                                  a.ptr, 0, dt.ptr, 0, betas[i % sets].ptr, 0, Hv,
                                                  gs[i % sets].ptr, 0, Hv, T, Hv),
                    T * Hv * 16, [*bs, *als, *betas, *gs, a, dt], note=f"Hv={Hv}")

    def _api(self):
        if self.api is None:
            raise Skip("library unavailable")
        return self.api

    def scan_inputs(self, T):
        np = self.np
        q = self.rand(T, GDN_HK, GDN_DK)
        k = self.rand(T, GDN_HK, GDN_DK)
        q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.float32(math.sqrt(GDN_DK))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        v = self.rand(T, GDN_HV, GDN_DV)
        beta = (1 / (1 + np.exp(-self.rand(T, GDN_HV)))).astype(np.float32)
        g = -np.abs(self.rand(T, GDN_HV, scale=0.3)).astype(np.float32) - np.float32(0.01)
        return q, k, v, beta, g

    def scan(self, T):
        np, torch = self.np, self.torch
        q, k, v, beta, g = self.scan_inputs(T)
        peer = None
        fla = None
        if torch is None:
            skip(f"FLA chunk_gated_delta_rule T={T}", "torch not importable")
        else:
            try:
                from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
            except Exception as exc:   # noqa: BLE001
                skip(f"FLA chunk_gated_delta_rule T={T}", f"fla not importable ({exc})")
        if fla is not None:
            try:
                rep = GDN_HV // GDN_HK       # qwen35 GGUF: value head j uses key head j % Hk (tiled)
                idx = torch.arange(GDN_HV) % GDN_HK
                qt = torch.from_numpy(q).cuda()[:, idx].to(torch.bfloat16)[None].contiguous()
                kt = torch.from_numpy(k).cuda()[:, idx].to(torch.bfloat16)[None].contiguous()
                vt = torch.from_numpy(v).cuda().to(torch.bfloat16)[None].contiguous()
                bt = torch.from_numpy(beta).cuda().to(torch.bfloat16)[None].contiguous()
                gt = torch.from_numpy(g).cuda()[None].contiguous()
                del rep

                def f(i):
                    fla(qt, kt, vt, g=gt, beta=bt, scale=1.0, initial_state=None,
                        output_final_state=True)
                t = time_torch(torch, f, self.reps, warm=3)
                peer = self.add("delta-rule", T, "FLA chunk bf16", t,
                                note=f"Hk={GDN_HK}->Hv={GDN_HV} dk=dv={GDN_DK}, q/k expanded")
            except Exception as exc:   # noqa: BLE001
                skip(f"FLA chunk_gated_delta_rule T={T}", f"{type(exc).__name__}: {exc}")
        api = self._api()
        fn = api.fn("pf_gdn_scan_rows", [CTX, BUF, I64, I64, BUF, I64, I64, BUF, I64, I64, BUF, I64, I64,
                                        BUF, I64, I64, BUF, I64, BUF, I64, I64, I64, I32, I32, I32, I32])
        ldqk = GDN_HK * GDN_DK
        qb, kb = self.upload(q.reshape(T, -1)), self.upload(k.reshape(T, -1))
        vb, bb, gb = self.upload(v.reshape(T, -1)), self.upload(beta), self.upload(g)
        st = self.upload(self.rand(GDN_HV, GDN_DK, GDN_DV, scale=0.1))
        ob = self.ctx.buffer(T * VALUE_DIM * 4)
        try:
            t = time_ours(lambda i: api.call(fn, self.ctx.ptr, qb.ptr, 0, ldqk, kb.ptr, 0, ldqk, vb.ptr, 0, VALUE_DIM,
                                             bb.ptr, 0, GDN_HV, gb.ptr, 0, GDN_HV, st.ptr, 0, ob.ptr, 0,
                                             VALUE_DIM, T, GDN_HK, GDN_HV, GDN_DK, GDN_DV),
                          self.ctx, self.reps, target_s=0.01)
            self.add("delta-rule", T, "ours sequential fp32", t, peer_of=peer,
                     note=f"Hk={GDN_HK} Hv={GDN_HV} dk=dv={GDN_DK}, state resident")
        finally:
            for b in (qb, kb, vb, bb, gb, st, ob):
                b.close()

    def attention(self, T):
        np, torch = self.np, self.torch
        H, Hkv, D = N_HEAD, N_HEAD_KV, HEAD_DIM
        flops = 4 * H * D * (T * (T + 1) // 2)     # QK^T and PV over the causal triangle
        peer = None
        if torch is not None:
            q = torch.randn(1, H, T, D, device="cuda", dtype=torch.float16)
            k = torch.randn(1, Hkv, T, D, device="cuda", dtype=torch.float16)
            v = torch.randn(1, Hkv, T, D, device="cuda", dtype=torch.float16)
            F = torch.nn.functional
            try:
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                sdpa = lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                how = "enable_gqa"
            except TypeError:
                ke, ve = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
                sdpa = lambda i: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)  # noqa: E731
                how = "KV expanded"
            t = time_torch(torch, sdpa, self.reps)
            peer = self.add("attention", T, "torch SDPA fp16", t, flops=flops, note=how)
            del q, k, v
        api = self._api()
        ffi = api.ffi
        attn = api.fn("pf_attention", [CTX, "pf_attention_options *", BUF, BUF, BUF, BUF])
        kvw = api.fn("pf_kv_write", [CTX, BUF, I64, BUF, I64, I64, I64, BUF, BUF, I32, I64])
        init = api.fn("pf_attention_options_init", ["pf_attention_options *", "size_t"])
        kv_dim = Hkv * D
        kf, vf = self.upload(self.rand(T, kv_dim)), self.upload(self.rand(T, kv_dim))
        kc, vc = self.ctx.buffer(T * kv_dim * 2), self.ctx.buffer(T * kv_dim * 2)
        qb = self.upload(self.rand(T, H * D))
        ob = self.ctx.buffer(T * H * D * 4)
        try:
            api.call(kvw, self.ctx.ptr, kf.ptr, kv_dim, vf.ptr, kv_dim, T, kv_dim, kc.ptr, vc.ptr,
                     api.enum("PF_KV_F16"), 0)
            for path_name, enum in (("flash", "PF_ATTN_FLASH"), ("cublas", "PF_ATTN_CUBLAS")):
                try:
                    opts = ffi.new("pf_attention_options *")
                    api.call(init, opts, ffi.sizeof("pf_attention_options"))
                    opts.n_heads, opts.n_kv_heads, opts.head_dim = H, Hkv, D
                    opts.kv_dtype = api.enum("PF_KV_F16")
                    opts.rows, opts.pos0 = T, 0
                    opts.path = api.enum(enum)
                    t = time_ours(lambda i: api.call(attn, self.ctx.ptr, opts, qb.ptr, kc.ptr, vc.ptr, ob.ptr),
                                  self.ctx, self.reps, target_s=0.01)
                    self.add("attention", T, f"ours {path_name} fp16 KV", t, flops=flops, peer_of=peer,
                             note=f"H={H} Hkv={Hkv} D={D} causal, fp32 q/out")
                except Skip as exc:
                    skip(f"attention {path_name} T={T}", exc)
                except Exception as exc:   # noqa: BLE001
                    skip(f"attention {path_name} T={T}", f"{type(exc).__name__}: {exc}")
        finally:
            for b in (kf, vf, kc, vc, qb, ob):
                b.close()


# ------------------------------------------------------------------------------ model

def hf_config(preset_name: str):
    from pyprefill.formats.synth import PRESETS
    p = PRESETS[preset_name]
    common = dict(vocab_size=p.n_vocab, hidden_size=p.n_embd, intermediate_size=p.n_ff,
                  num_hidden_layers=p.n_layer, num_attention_heads=p.n_head,
                  num_key_value_heads=p.n_head_kv, head_dim=p.head_dim,
                  max_position_embeddings=min(p.context_length, 32768), rms_norm_eps=1e-6,
                  tie_word_embeddings=p.tied)
    if p.arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        cfg = Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": p.rope_base})
        return cfg, Qwen3ForCausalLM
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    half = p.rope_dim // 2                       # mrope sections sum to rope_dim / 2 (text: all equal)
    sec = [half - 2 * (half // 3), half // 3, half // 3]
    cfg = Qwen3_5TextConfig(
        **common, layer_types=["full_attention" if (i + 1) % p.interval == 0 else "linear_attention"
                               for i in range(p.n_layer)],
        linear_num_key_heads=p.ssm_hk, linear_num_value_heads=p.ssm_hv,
        linear_key_head_dim=p.ssm_dk, linear_value_head_dim=p.ssm_dk,
        linear_conv_kernel_dim=p.conv_kernel,
        rope_parameters={"rope_type": "default", "rope_theta": p.rope_base,
                         "partial_rotary_factor": p.rope_dim / p.head_dim,
                         "mrope_section": sec, "mrope_interleaved": True})
    return cfg, Qwen3_5ForCausalLM


def build_hf(torch, preset_name: str, path: str, device: str = "cuda"):
    """HF model (bf16, cuda, sdpa) holding the GGUF's dequantized weights. The tensors are
    dequantized in a thread pool (gguf's NumPy dequantizer is the slow part on one core)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    import pyprefill.formats.gguf_model as gm
    from pyprefill.formats.hf_export import load_gguf_into_hf
    cfg, cls = hf_config(preset_name)
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(torch.bfloat16).eval()
    desc = gm.load_model_desc(path)
    orig = gm.read_tensor
    with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as ex:
        futs = {name: ex.submit(orig, desc, name, np.float32) for name in desc.tensors}
        gm.read_tensor = lambda d, name, dtype=np.float32: futs[name].result()   # noqa: E731
        try:
            load_gguf_into_hf(model, path)
        finally:
            gm.read_tensor = orig
            futs.clear()
    gc.collect()
    return model


def non_embedding_params(path: str) -> int:
    from pyprefill.formats.gguf_model import load_model_desc
    desc = load_model_desc(path)
    total = 0
    for name, t in desc.tensors.items():
        if name in ("token_embd.weight", "output.weight"):
            continue
        total += int(math.prod(t.shape))
    return total


class ModelBench:
    def __init__(self, args, torch, pp):
        self.args, self.torch, self.pp = args, torch, pp
        self.rows: list[dict] = []
        self.peak_tflops = None
        import numpy as np
        self.np = np
        self.rng = np.random.default_rng(99)

    def run(self) -> dict:
        a = self.args
        presets = a.models if not a.quick else ["qwen35-0.8b"]
        lengths = a.lengths if not a.quick else [512]
        legs = a.legs if not a.quick else ["f16"]
        if self.torch is not None:
            try:
                self.peak_tflops = self.measure_peak()
                print(f"-- torch fp16 GEMM peak {self.peak_tflops:.1f} TF/s", flush=True)
            except Exception as exc:   # noqa: BLE001
                skip("roofline", f"fp16 peak not measured ({exc})")
        for preset in presets:
            path = Path(a.gguf_dir) / f"bench-{preset}-{a.mix}.gguf"
            try:
                self.ensure_gguf(preset, path)
            except Exception as exc:   # noqa: BLE001
                skip(f"model {preset}", f"synthetic GGUF not written ({type(exc).__name__}: {exc})")
                for leg in legs:
                    for T in lengths:
                        self.rows.append({"model": preset, "impl": f"ours {leg}", "T": T,
                                          "error": f"GGUF: {exc}"})
                continue
            try:
                P = non_embedding_params(str(path))
            except Exception:   # noqa: BLE001
                P = None
            roof = (self.peak_tflops * 1e12 / (2 * P)) if (P and self.peak_tflops) else None
            ours = self.run_ours(preset, str(path), lengths, legs)
            hf = self.run_hf(preset, str(path), lengths)
            for r in ours + hf:
                r["non_embedding_params"] = P
                r["roofline_tok_s"] = roof
                if roof and r.get("tok_s"):
                    r["pct_roofline"] = 100 * r["tok_s"] / roof
                peer = next((h for h in hf if h["T"] == r["T"] and h.get("tok_s")), None)
                if r["impl"].startswith("ours") and r.get("tok_s") and peer:
                    r["ratio_vs_hf"] = r["tok_s"] / peer["tok_s"]
            self.rows += ours + hf
        return {"rows": self.rows, "peak_fp16_tflops": self.peak_tflops}

    def measure_peak(self) -> float:
        torch = self.torch
        n = 4096 if self.args.quick else 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        t = time_torch(torch, lambda i: a @ b.T, 5)
        del a, b
        return 2 * n ** 3 / (min(t["reps_ms"]) * 1e-3) / 1e12

    def ensure_gguf(self, preset, path: Path):
        if path.exists() and path.stat().st_size > 0:
            print(f"-- reusing {path}", flush=True)
            return
        from pyprefill.formats.synth import write_synthetic
        t0 = time.perf_counter()
        tmp = path.with_suffix(".tmp.gguf")
        write_synthetic(preset, self.args.mix, tmp, progress=False)
        os.replace(tmp, path)
        print(f"-- wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s)",
              flush=True)

    def ids(self, n_vocab, T):
        return self.rng.integers(0, n_vocab, size=T, dtype=self.np.int32)

    def run_ours(self, preset, path, lengths, legs) -> list[dict]:
        rows = []
        if self.pp is None:
            skip(f"ours {preset}", "library unavailable")
            return [{"model": preset, "impl": f"ours {leg}", "T": T, "error": "library unavailable"}
                    for leg in legs for T in lengths]
        try:
            from pyprefill.model import Model
        except Exception as exc:   # noqa: BLE001
            skip(f"ours {preset}", f"pyprefill.model not importable ({exc})")
            return [{"model": preset, "impl": f"ours {leg}", "T": T, "error": str(exc)}
                    for leg in legs for T in lengths]
        core = self.pp[0]
        ctx = model = None
        try:
            ctx = core.Context(0)
            free0, total = ctx.memory()
            model = Model.load(path, gemm="f16" if "f16" in legs else legs[0], prewarm=True,
                               progress=False, context=ctx)
            info = model.info
            base = {"model": preset, "load_ms": info.get("load_ms"), "prewarm_ms": info.get("prewarm_ms"),
                    "f16_armed": info.get("f16_armed"), "weight_bytes": info.get("weight_bytes"),
                    "f16_bytes": info.get("f16_bytes"), "chunk": self.args.chunk}
            print(f"-- ours {preset}: load {info.get('load_ms', 0):.0f} ms, prewarm "
                  f"{info.get('prewarm_ms', 0):.0f} ms, f16 armed {info.get('f16_armed')}", flush=True)
        except Exception as exc:   # noqa: BLE001
            skip(f"ours {preset}", f"load failed ({type(exc).__name__}: {exc})")
            if model is not None:
                model.close()
            if ctx is not None:
                ctx.close()
            return [{"model": preset, "impl": f"ours {leg}", "T": T, "error": f"load: {exc}"}
                    for leg in legs for T in lengths]
        try:
            for leg in legs:
                sess = None
                try:
                    sess = model.session(max_tokens=max(lengths) + 16, chunk=self.args.chunk, gemm=leg)
                except Exception as exc:   # noqa: BLE001
                    skip(f"ours {preset} {leg}", f"session: {exc}")
                    rows += [{**base, "impl": f"ours {leg}", "T": T, "error": f"session: {exc}"} for T in lengths]
                    continue
                reps = self.args.model_reps if leg == "f16" else max(2, self.args.model_reps // 2)
                for T in lengths:
                    row = {**base, "impl": f"ours {leg}", "T": T}
                    try:
                        times = []
                        for r in range(1 + reps):         # one warm-up
                            ids = self.ids(model.n_vocab, T)
                            sess.reset()
                            t0 = time.perf_counter()
                            logits = sess.prefill(ids)
                            dt = time.perf_counter() - t0
                            if not self.np.isfinite(logits).all():
                                raise RuntimeError("non-finite logits")
                            if r:
                                times.append(dt * 1e3)
                        med = statistics.median(times)
                        free1, _ = ctx.memory()
                        row.update(reps_ms=times, median_ms=med, tok_s=T / (med * 1e-3),
                                   allocated_bytes=ctx.allocated(), device_used_bytes=free0 - free1)
                        print(f"  {preset:12s} {'ours ' + leg:10s} T={T:5d} {med:9.2f} ms "
                              f"{row['tok_s']:10.0f} tok/s", flush=True)
                    except Exception as exc:   # noqa: BLE001
                        row["error"] = f"{type(exc).__name__}: {exc}"
                        skip(f"ours {preset} {leg} T={T}", row["error"])
                    rows.append(row)
                if sess is not None:
                    sess.close()
        finally:
            model.close()
            ctx.close()
        return rows

    def run_hf(self, preset, path, lengths) -> list[dict]:
        torch = self.torch
        if torch is None:
            skip(f"HF {preset}", "torch not importable")
            return []
        if self.args.no_hf:
            skip(f"HF {preset}", "--no-hf")
            return []
        rows = []
        model = None
        try:
            t0 = time.perf_counter()
            model = build_hf(torch, preset, path)
            build_s = time.perf_counter() - t0
            print(f"-- HF {preset}: built with the GGUF's weights in {build_s:.1f} s", flush=True)
        except Exception as exc:   # noqa: BLE001
            skip(f"HF {preset}", f"{type(exc).__name__}: {exc}")
            if self.args.verbose:
                traceback.print_exc()
            model = None
            gc.collect()
            torch.cuda.empty_cache()
            return [{"model": preset, "impl": "HF bf16 sdpa", "T": T, "error": f"build: {exc}"}
                    for T in lengths]
        try:
            V = model.config.vocab_size
            for T in lengths:
                row = {"model": preset, "impl": "HF bf16 sdpa", "T": T, "build_s": build_s}
                try:
                    torch.cuda.reset_peak_memory_stats()
                    times = []
                    reps = self.args.model_reps
                    with torch.no_grad():
                        for r in range(2 + reps):      # two warm-ups
                            ids = torch.from_numpy(self.ids(V, T).astype(self.np.int64)).cuda()[None]
                            torch.cuda.synchronize()
                            t1 = time.perf_counter()
                            out = model(ids, use_cache=False, logits_to_keep=1)
                            out.logits.float().cpu()
                            dt = time.perf_counter() - t1
                            if r >= 2:
                                times.append(dt * 1e3)
                            del out
                    med = statistics.median(times)
                    row.update(reps_ms=times, median_ms=med, tok_s=T / (med * 1e-3),
                               peak_bytes=torch.cuda.max_memory_allocated())
                    print(f"  {preset:12s} {'HF bf16':10s} T={T:5d} {med:9.2f} ms "
                          f"{row['tok_s']:10.0f} tok/s", flush=True)
                except Exception as exc:   # noqa: BLE001
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    skip(f"HF {preset} T={T}", row["error"])
                rows.append(row)
        finally:
            del model
            gc.collect()
            torch.cuda.empty_cache()
        return rows


# ------------------------------------------------------------------------------ output

def _f(x, fmt="{:.1f}"):
    return "" if x is None else fmt.format(x)


def kernels_table(res: dict) -> str:
    lines = ["Kernels, qwen35-4b shapes. Ours: host clock around a batch of calls + "
             "Context.synchronize() (library stream), per-call median of batches; torch/FLA: CUDA "
             "events. Inputs random, rotated past 2x L2. ratio = peer time / our time (>1: ours faster).",
             "", "| op | T | impl | median ms | TF/s | GB/s | ratio vs peer | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        lines.append(f"| {r['op']} | {r['T']} | {r['impl']} | {r['median_ms']:.4f} | "
                     f"{_f(r.get('tflops'))} | {_f(r.get('gbps'))} | {_f(r.get('ratio_vs_peer'), '{:.2f}')} | "
                     f"{r.get('note', '')} |")
    return "\n".join(lines)


def model_table(res: dict) -> str:
    peak = res.get("peak_fp16_tflops")
    lines = [f"Whole-model prefill (synthetic GGUF, wall clock incl. logits to host, median). "
             f"Roofline = measured torch fp16 peak ({_f(peak)} TF/s) / (2 x non-embedding params).",
             "", "| model | impl | T | median ms | tok/s | vs HF | roofline tok/s | % roofline | "
             "load ms | prewarm ms | device GiB | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        mem = r.get("allocated_bytes") or r.get("peak_bytes")
        lines.append(
            f"| {r['model']} | {r['impl']} | {r['T']} | {_f(r.get('median_ms'), '{:.2f}')} | "
            f"{_f(r.get('tok_s'), '{:.0f}')} | {_f(r.get('ratio_vs_hf'), '{:.2f}')} | "
            f"{_f(r.get('roofline_tok_s'), '{:.0f}')} | {_f(r.get('pct_roofline'))} | "
            f"{_f(r.get('load_ms'), '{:.0f}')} | {_f(r.get('prewarm_ms'), '{:.0f}')} | "
            f"{_f(mem / 2**30 if mem else None, '{:.2f}')} | {r.get('error', '')} |")
    return "\n".join(lines)


def write_out(out: str | None, name: str, data: dict, table: str) -> None:
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"bench_{name}.json").write_text(json.dumps(data, indent=1, default=str))
    (d / f"bench_{name}.md").write_text(table + "\n")


# ------------------------------------------------------------------------------ main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Writes bench_<name>.json and bench_<name>.md under --out.")
    p.add_argument("what", choices=["kernels", "model", "all"], help="which benchmarks")
    p.add_argument("--out", default=None, help="directory for bench_<name>.json / .md")
    p.add_argument("--quick", action="store_true", help="short smoke run (T=512, small model)")
    p.add_argument("--reps", type=int, default=7, help="timed batches per kernel (median)")
    p.add_argument("--model-reps", type=int, default=5, help="timed prefills per model/length")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--models", nargs="+", default=["qwen35-4b", "qwen3-4b"])
    p.add_argument("--legs", nargs="+", default=["f16", "f32"])
    p.add_argument("--mix", default="q4_k_m")
    p.add_argument("--chunk", type=int, default=2048, help="session chunk (rows per internal chunk)")
    p.add_argument("--gguf-dir", default="/tmp", help="where the synthetic GGUFs are written/reused")
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers peer")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks for skipped parts")
    a = p.parse_args(argv)
    if a.quick:
        a.reps = min(a.reps, 3)
        a.model_reps = min(a.model_reps, 2)
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch = try_torch()
    pp = try_pyprefill()
    if not gpu_present(torch, pp):
        print("no GPU: benchmarks skipped", flush=True)
        return 0
    m = meta(torch, pp)
    print(f"-- {m.get('device')} torch {m.get('torch')} commit {m.get('commit')}", flush=True)
    tables = []
    parts = ["kernels", "model"] if args.what == "all" else [args.what]
    for part in parts:
        SKIPPED.clear()
        t0 = time.perf_counter()
        try:
            bench = KernelBench(args, torch, pp) if part == "kernels" else ModelBench(args, torch, pp)
            res = bench.run()
        except Exception as exc:   # noqa: BLE001  a bug here must not lose the other part
            skip(part, f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
            res = {"rows": getattr(locals().get("bench"), "rows", []), "error": str(exc)}
        res["meta"] = m
        res["skipped"] = list(SKIPPED)
        res["wall_s"] = time.perf_counter() - t0
        res["args"] = vars(args)
        table = kernels_table(res) if part == "kernels" else model_table(res)
        write_out(args.out, part, res, table)
        tables.append(table)
        print(f"-- {part}: {res['wall_s']:.1f} s, {len(res['skipped'])} skipped", flush=True)
    print(f"-- total {time.perf_counter() - t_start:.1f} s", flush=True)
    for t in tables:
        print()
        print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
