"""The kernel families of pyprefill.bench on a fake device (CPU): every adapter's call binds to
the wrapper signature the benchmarks assume, every View stays inside its buffer, and a path the
build lacks (UnsupportedError) is one skipped line. Nothing is timed for real."""
import inspect
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("pyprefill.kernels.gemm", reason="libprefill not loadable")

from pyprefill.bench import _common, attention, gdn, gemm, rows  # noqa: E402
from pyprefill.errors import UnsupportedError  # noqa: E402


class FakeBuf:
    def __init__(self, nbytes):
        self.nbytes = int(nbytes)

    def poison(self):
        pass

    def close(self):
        pass


class FakeWeight(FakeBuf):
    def __init__(self, n, k):
        super().__init__(n * k)
        self.n, self.k = n, k


class FakeCtx:
    def upload(self, arr):
        assert arr.dtype == np.float32 and np.isfinite(arr).all() and np.any(arr != 0)
        return FakeBuf(arr.nbytes)

    def buffer(self, nbytes):
        return FakeBuf(nbytes)

    def weight(self, qtype, n, k, data):
        return FakeWeight(n, k)

    def synchronize(self):
        pass


@dataclass(frozen=True)
class View:
    buf: FakeBuf
    off: int = 0
    ld: int = 0


# The wrapper signatures the benchmarks are written against (the renamed pyprefill.kernels).
def project(ctx, w, x, y, rows, *, accumulate=False, leg="f16"): ...
def cache_f16(w): ...
def dequantize(ctx, w, out, f16=True): ...
def rms_norm_rows(ctx, x, w, y, rows, cols, eps): ...
def rope_neox_rows(ctx, x, rows, n_heads, head_dim, rot_dim, pos0, base, head_stride=0): ...
def swiglu_rows(ctx, g, u, out, rows, cols): ...
def gdn_conv1d_rows(ctx, m, window, weight, u, rows, conv_dim, kc): ...
def gdn_l2norm_rows(ctx, x, rows, n_heads, head_dim, eps, scale, head_stride=0): ...
def gdn_gates_rows(ctx, b, alpha, ssm_a, dt_bias, beta, g, rows, n_v_heads): ...
def gdn_scan(ctx, q, k, v, beta, g, state, o, *, rows, n_k_heads, n_v_heads, dk, dv,
             path="auto"): ...
def kv_write(ctx, k, v, k_cache, v_cache, *, rows, kv_dim, pos0, kv_dtype="f16"): ...
def attention_(ctx, q, k_cache, v_cache, out, *, n_heads, n_kv_heads, head_dim, rows, pos0,
               kv_dtype="f16", path="auto"): ...


API = {"gemm": [project, cache_f16, dequantize],
       "rows": [rms_norm_rows, rope_neox_rows, swiglu_rows],
       "gdn": [gdn_conv1d_rows, gdn_l2norm_rows, gdn_gates_rows, gdn_scan],
       "attention": [kv_write, attention_]}


def fake_module(family, calls):
    mod = types.SimpleNamespace(View=View)
    for fn in API[family]:
        name = fn.__name__.rstrip("_")

        def wrapper(*args, _fn=fn, _name=name, **kw):
            bound = inspect.signature(_fn).bind(*args, **kw)     # TypeError on a wrong call
            bound.apply_defaults()
            a = bound.arguments
            for arg, v in a.items():
                if isinstance(v, View):
                    floats = v.buf.nbytes // 4
                    need = a["rows"] * v.ld if v.ld else 1
                    assert 0 <= v.off and v.off + need <= floats, (_name, arg, v, a["rows"])
            if _name == "gdn_scan" and a["path"] == "chunked":
                raise UnsupportedError("the chunked scan is not in this build")
            calls.append((_name, a))
        setattr(mod, name, wrapper)
    return mod


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setattr(sys.modules["pyprefill.formats.quant"], "random_blocks",
                        lambda n, k, q, rng: np.ones((n, 1), np.uint8))
    rec = _common.Recorder()
    return _common.Bench(rec, FakeCtx(), None, reps=1, quick=True, legs=("f16", "f32"))


@pytest.mark.parametrize("family", [gemm, rows, gdn, attention],
                         ids=lambda m: m.__name__.split(".")[-1])
def test_family_on_a_fake_device(family, bench, monkeypatch):
    calls = []
    name = family.__name__.split(".")[-1]
    monkeypatch.setattr(family, "K", fake_module(name, calls))
    family.run(bench, [64])
    called = {c[0] for c in calls}
    assert called == {f.__name__.rstrip("_") for f in API[name]}
    ours = [r for r in bench.rec.rows if r["impl"].startswith("ours")]
    assert ours and all(r["median_ms"] > 0 and r["T"] in (0, 64) for r in ours)
    if name == "gdn":          # the chunked path is missing here: one skipped line per case
        why = "unsupported: the chunked scan is not in this build"
        assert [s["why"] for s in bench.rec.skipped] == [why] * 2
        assert {r["op"] for r in ours} >= {"delta-rule Hk16/Hv32",
                                           "delta-rule Hk16/Hv32 4x16 carried"}
        scans = [a for n, a in calls if n == "gdn_scan"]
        assert {a["rows"] for a in scans} == {64, 16}
    else:
        assert bench.rec.skipped == []
    if name == "gemm":
        assert {r["impl"] for r in ours} == {"ours f16 leg", "ours f32 leg", "ours -> fp16"}
        assert {a["leg"] for n, a in calls if n == "project"} == {"f16", "f32"}
