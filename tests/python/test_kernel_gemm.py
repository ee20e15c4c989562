"""Projections Y = X . W^T through the f32 leg (bound 1e-5 vs float64), the f16 leg with an
fp16 cache and streaming (bound 3e-3), accumulate, strided outputs, fp16 overflow protection,
the leg defaults (env PREFILL_GEMM) and the all-or-nothing prewarm."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close, make_weight, null_view, randn, status_and_error

from pyprefill import core, errors
from pyprefill._errors import _check
from pyprefill._ffi import ffi, lib
from pyprefill.kernels import gemm
from pyprefill.kernels._common import View
from pyprefill.reference import ops

QTYPES = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
F32_BOUND, F16_BOUND = 1e-5, 3e-3
ROOT = Path(__file__).resolve().parents[2]




# ------------------------------------------------------------------ CPU: argument checks


def _status(call) -> tuple[int, str]:
    return status_and_error(call())


def test_project_argument_checks_before_device_work():
    N, v = ffi.NULL, null_view()
    s, msg = _status(lambda: lib.pf_project(N, N, v, v, -1, 0, 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "rows=-1" in msg
    s, msg = _status(lambda: lib.pf_project(N, N, v, v, 4, 2, 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "accumulate=2" in msg
    s, msg = _status(lambda: lib.pf_project(N, N, v, v, 4, 0, 9))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "leg=9 is not a pf_gemm_leg" in msg
    s, msg = _status(lambda: lib.pf_project(N, N, v, v, 4, 0, lib.PF_GEMM_F16))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg


def test_project_f16x_argument_checks_before_device_work():
    N, v = ffi.NULL, null_view()
    s, msg = _status(lambda: lib.pf_project_f16x(N, N, v, v, v, -1, 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "rows=-1" in msg
    s, msg = _status(lambda: lib.pf_project_f16x(N, N, v, v, v, 4, 3))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "accumulate=3" in msg
    s, msg = _status(lambda: lib.pf_project_f16x(N, N, v, N, v, 4, 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg


def test_fused_argument_checks_before_device_work():
    N, v = ffi.NULL, null_view()
    s, msg = _status(lambda: lib.pf_qgemm(N, N, v, v, -3, 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "rows=-3" in msg
    s, msg = _status(lambda: lib.pf_qgemm(N, N, v, v, 3, 0))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg
    s, msg = _status(lambda: lib.pf_qgemm_swiglu(N, N, v, v, 3))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg
    s, msg = _status(lambda: lib.pf_qgemv(N, N, v, v, 5))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "accumulate=5" in msg
    s, msg = _status(lambda: lib.pf_qgemv(N, N, v, v, 1))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg


def test_prewarm_argument_checks():
    rep = ffi.new("pf_prewarm_report *")
    with pytest.raises(errors.AbiMismatchError, match="struct_size"):
        _check(lib.pf_prewarm_report_init(rep, ffi.sizeof("pf_prewarm_report") - 8))
    _check(lib.pf_prewarm_report_init(rep, ffi.sizeof("pf_prewarm_report")))
    assert rep.struct_size == ffi.sizeof("pf_prewarm_report") and rep.armed == 0
    N = ffi.NULL
    s, msg = _status(lambda: lib.pf_prewarm_f16(N, N, -1, 0, rep))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "count=-1" in msg
    s, msg = _status(lambda: lib.pf_prewarm_f16(N, N, 2, 0, rep))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "weights is NULL" in msg
    arr = ffi.new("pf_weight *[]", 2)
    s, msg = _status(lambda: lib.pf_prewarm_f16(N, arr, 2, 0, rep))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "weights[0] is NULL" in msg
    bad = ffi.new("pf_prewarm_report *")
    s, msg = _status(lambda: lib.pf_prewarm_f16(N, arr, 0, 0, bad))
    assert s == lib.PF_STATUS_ABI_MISMATCH and "pf_prewarm_report_init" in msg
    s, msg = _status(lambda: lib.pf_prewarm_f16(N, arr, 0, 0, rep))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "ctx is NULL" in msg
    s, msg = _status(lambda: lib.pf_weight_cache_f16(N))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg
    s, msg = _status(lambda: lib.pf_weight_drop_f16(N))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg


def test_leg_names_and_setter():
    assert gemm.LEGS == {"default": 0, "auto": 1, "f32": 2, "f16": 3, "int8": 4}
    assert gemm.leg_id("F16") == lib.PF_GEMM_F16 and gemm.leg_id("auto") == lib.PF_GEMM_AUTO
    with pytest.raises(errors.InvalidArgumentError, match="leg: unknown name 'f8'"):
        gemm.leg_id("f8")
    with pytest.raises(errors.InvalidArgumentError, match="leg=4 is not a pf_gemm_leg"):
        gemm.gemm_set_default_leg("int8")
    before = gemm.gemm_default_leg()
    try:
        gemm.gemm_set_default_leg("f32")
        assert gemm.gemm_default_leg() == "f32"
        gemm.gemm_set_default_leg("f16")
        assert gemm.gemm_default_leg() == "f16"
    finally:
        gemm.gemm_set_default_leg("default")
    assert gemm.gemm_default_leg() == before


def _default_leg_in_subprocess(value):
    env = dict(os.environ)
    env.pop("PREFILL_GEMM", None)
    if value is not None:
        env["PREFILL_GEMM"] = value
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    code = ("from pyprefill.kernels import gemm\n"
            "print(gemm.gemm_default_leg()); print(gemm.gemm_default_leg())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "PREFILL_GEMM" in line]
    return r.stdout.split(), warnings


@pytest.mark.parametrize("value,expect,n_warn", [
    (None, "auto", 0), ("", "auto", 0), ("auto", "auto", 0), ("f16", "f16", 0), ("F32", "f32", 0),
    ("bogus", "auto", 1), ("int8", "auto", 1)])
def test_env_default_leg(value, expect, n_warn):
    legs, warnings = _default_leg_in_subprocess(value)
    assert legs == [expect, expect]
    assert len(warnings) == n_warn, warnings


# ------------------------------------------------------------------ GPU: legs vs float64


def _ref(x: np.ndarray, w64: np.ndarray) -> np.ndarray:
    """The oracle's projection (x @ W.T in float64) of x's first k columns."""
    return ops.project(x[:, :w64.shape[1]], w64)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 777])
@pytest.mark.parametrize("qtype", QTYPES)
def test_f32_leg_every_qtype(ctx, rng, qtype, rows):
    w, w64 = make_weight(ctx, rng, qtype, 96, 512)
    with w:
        x = randn(rng, rows, 512)
        assert_close(f"f32/{qtype}", _ref(x, w64), gemm.project_np(ctx, w, x, leg="f32"),
                     rtol=F32_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("cached", [True, False], ids=["cache", "streaming"])
@pytest.mark.parametrize("rows", [1, 7, 777])
@pytest.mark.parametrize("qtype", QTYPES)
def test_f16_leg_every_qtype(ctx, rng, qtype, rows, cached):
    w, w64 = make_weight(ctx, rng, qtype, 96, 512)
    with w:
        if cached:
            gemm.weight_cache_f16(w)
            assert w.info()["f16_bytes"] == 96 * 512 * 2
        x = randn(rng, rows, 512)
        assert_close(f"f16/{qtype}", _ref(x, w64), gemm.project_np(ctx, w, x, leg="f16"),
                     rtol=F16_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "F16"])
def test_project_f16x_is_the_f16_leg_on_its_input_form(ctx, rng, qtype):
    """pf_project_f16x on fp16 rows x16 with power-of-two row scales inv equals, bit for bit,
    the f16 leg of pf_project on X = x16 * inv (its cast leaves these rows unscaled: |X| <=
    2^15), and the float64 product of X with the weight's fp16 copy within fp32 accumulation
    (1e-5); y is poisoned first, so every element is written."""
    n, k, rows = 96, 512, 37
    w, _ = make_weight(ctx, rng, qtype, n, k)
    with w:
        if qtype != "F16":
            gemm.weight_cache_f16(w)
        w16 = gemm.weight_f16_np(ctx, w) if qtype != "F16" else gemm.dequantize_np(ctx, w, f16=True)
        x16 = np.clip(rng.standard_normal((rows, k)), -8, 8).astype(np.float16)
        inv = rng.choice(np.array([1.0, 16.0, 1024.0], np.float32), size=rows)
        x = x16.astype(np.float32) * inv[:, None]
        got = gemm.project_f16x_np(ctx, w, x16, inv)
        assert np.isfinite(got).all()
        assert np.array_equal(got, gemm.project_np(ctx, w, x, leg="f16")), \
            f"{qtype}: pf_project_f16x differs from the f16 leg on x16 * inv"
        assert_close(f"f16x/{qtype}", x.astype(np.float64) @ w16.astype(np.float64).T, got,
                     rtol=F32_BOUND)
        # accumulate without row scales: y0 + x16 @ W16^T
        y0 = randn(rng, rows, n)
        acc = gemm.project_f16x_np(ctx, w, x16, None, accumulate=True, y=y0)
        want = y0.astype(np.float64) + x16.astype(np.float64) @ w16.astype(np.float64).T
        assert_close(f"f16x accumulate/{qtype}", want, acc, rtol=F32_BOUND)


@pytest.mark.gpu
def test_project_f16x_needs_an_fp16_copy_and_packed_rows(ctx, rng):
    w, _ = make_weight(ctx, rng, "Q4_K", 64, 256)
    with w, ctx.upload(np.ones((3, 300), np.float16)) as xb, ctx.buffer(3 * 64 * 4) as yb:
        with pytest.raises(errors.UnsupportedError, match="no fp16 copy"):
            gemm.project_f16x(ctx, w, View(xb), None, View(yb), 3)
        gemm.weight_cache_f16(w)
        with pytest.raises(errors.UnsupportedError, match="x16 row stride ld=300"):
            gemm.project_f16x(ctx, w, View(xb, 0, 300), None, View(yb), 3)
        with ctx.buffer(8) as small:
            with pytest.raises(errors.InvalidArgumentError, match="inv"):
                gemm.project_f16x(ctx, w, View(xb), View(small), View(yb), 3)


@pytest.mark.gpu
@pytest.mark.parametrize("leg,cached", [("f32", False), ("f16", True), ("f16", False)],
                         ids=["f32", "f16-cache", "f16-streaming"])
@pytest.mark.parametrize("qtype,rows,k,n", [("Q4_K", 64, 2560, 9216), ("Q6_K", 7, 1024, 3584),
                                            ("Q8_0", 777, 1024, 3584), ("Q5_K", 33, 5120, 1024),
                                            ("IQ4_XS", 5, 5120, 640)])
def test_real_dims(ctx, rng, qtype, rows, k, n, leg, cached):
    w, w64 = make_weight(ctx, rng, qtype, n, k)
    with w:
        if cached:
            gemm.weight_cache_f16(w)
        x = randn(rng, rows, k)
        assert_close(f"{leg}/{qtype} {rows}x{k}->{n}", _ref(x, w64), gemm.project_np(ctx, w, x, leg=leg),
                     rtol=F32_BOUND if leg == "f32" else F16_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("leg,cached", [("f32", False), ("f16", True), ("f16", False)],
                         ids=["f32", "f16-cache", "f16-streaming"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_strided_x_and_y_gap_untouched(ctx, rng, leg, cached, accumulate):
    n, k, rows = 200, 256, 7
    w, w64 = make_weight(ctx, rng, "Q4_K", n, k)
    with w:
        if cached:
            gemm.weight_cache_f16(w)
        x = randn(rng, rows, k + 13)                       # ldx = k + 13: the tail is ignored
        x[:, k:] = np.nan
        ldy = n + 37
        y0 = np.full((rows, ldy), 12345.0, np.float32)     # sentinel in every column
        y0[:, :n] = randn(rng, rows, n)
        out = gemm.project_np(ctx, w, x, leg=leg, accumulate=accumulate, y=y0)
        assert (out[:, n:] == 12345.0).all(), "columns beyond n were written"
        ref = _ref(x[:, :k], w64) + (y0[:, :n] if accumulate else 0.0)
        assert_close(f"{leg} strided acc={accumulate}", ref, out[:, :n],
                     rtol=F32_BOUND if leg == "f32" else F16_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("padded", [False, True], ids=["ldx=k", "ldx=k+1"])
@pytest.mark.parametrize("cached", [True, False], ids=["cache", "streaming"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_f16_leg_activations_beyond_fp16_range(ctx, rng, cached, accumulate, padded):
    n, k, rows = 160, 512, 7
    w, w64 = make_weight(ctx, rng, "Q8_0", n, k)
    with w:
        if cached:
            gemm.weight_cache_f16(w)
        x = randn(rng, rows, k + int(padded))     # ldx = k + 1: the unaligned (scalar) cast path
        x[0] *= 1e5                 # a whole row ~1e5 (fp16 max is 65504)
        x[2, 3] = -2.5e5            # one spike in an otherwise small row
        x[4] *= 3e7                 # far beyond
        x[5] *= 1e-3                # a small row next to them
        y0 = (randn(rng, rows, n) * 100.0) if accumulate else None
        out = gemm.project_np(ctx, w, x, leg="f16", accumulate=accumulate, y=y0)
        ref = _ref(x, w64) + (y0 if accumulate else 0.0)
        assert np.isfinite(out).all(), "fp16 overflow leaked into the output"
        assert_close("f16 |x|~1e5", ref, out, rtol=F16_BOUND, worst_rtol=F16_BOUND)


@pytest.mark.gpu
@pytest.mark.parametrize("leg", ["f32", "f16"])
def test_accumulate_is_residual_add(ctx, rng, leg):
    n, k, rows = 1024, 1024, 33
    w, w64 = make_weight(ctx, rng, "Q6_K", n, k)
    with w:
        x, y0 = randn(rng, rows, k), randn(rng, rows, n)
        out = gemm.project_np(ctx, w, x, leg=leg, accumulate=True, y=y0)
        assert_close(f"{leg} residual", _ref(x, w64) + y0, out,
                     rtol=F32_BOUND if leg == "f32" else F16_BOUND)


@pytest.mark.gpu
def test_auto_and_default_legs(ctx, rng):
    n, k, rows = 128, 256, 9
    w, w64 = make_weight(ctx, rng, "Q4_K", n, k)
    with w:
        x = randn(rng, rows, k)
        f32 = gemm.project_np(ctx, w, x, leg="f32")
        assert np.array_equal(gemm.project_np(ctx, w, x, leg="auto"), f32)   # no cache: f32
        gemm.weight_cache_f16(w)
        f16 = gemm.project_np(ctx, w, x, leg="f16")
        assert np.array_equal(gemm.project_np(ctx, w, x, leg="auto"), f16)   # cache: f16
        assert not np.array_equal(f16, f32)
        try:
            gemm.gemm_set_default_leg("f32")
            assert np.array_equal(gemm.project_np(ctx, w, x), f32)
            gemm.gemm_set_default_leg("auto")
            assert np.array_equal(gemm.project_np(ctx, w, x), f16)
        finally:
            gemm.gemm_set_default_leg("default")
        gemm.weight_drop_f16(w)
        assert w.info()["f16_bytes"] == 0
        assert np.array_equal(gemm.project_np(ctx, w, x, leg="auto"), f32)


@pytest.mark.gpu
def test_project_bad_calls(ctx, rng):
    """(The 8-bit leg's own checks: test_kernel_gemm_i8.py.)"""
    w, _ = make_weight(ctx, rng, "Q8_0", 64, 128)
    with w:
        x = randn(rng, 3, 128)
        with pytest.raises(errors.InvalidArgumentError, match="fewer than 128 columns"):
            gemm.project_np(ctx, w, x[:, :64].copy())
        with ctx.upload(x) as xb:
            with pytest.raises(errors.InvalidArgumentError, match="x row stride ld=100 must be >= its width 128"):
                gemm.project(ctx, w, View(xb, 0, 100), View(xb, 0, 64), 3)
            with pytest.raises(errors.InvalidArgumentError, match="y overlaps x"):
                gemm.project(ctx, w, View(xb, 0, 128), View(xb, 0, 64), 3)
            with ctx.buffer(4 * 64 * 3 - 4) as small:
                with pytest.raises(errors.InvalidArgumentError, match="y holds 764 bytes"):
                    gemm.project(ctx, w, View(xb, 0, 128), View(small, 0, 64), 3)
                with pytest.raises(errors.InvalidArgumentError, match="y holds 764 bytes"):
                    gemm.project(ctx, w, xb, View(small, 1), 3)     # the offset counts
        empty = gemm.project_np(ctx, w, np.zeros((0, 128), np.float32))
        assert empty.shape == (0, 64)


# ------------------------------------------------------------------ GPU: prewarm


@pytest.mark.gpu
def test_prewarm_all_or_nothing(ctx, rng):
    shapes = [("Q4_K", 512, 1024), ("Q6_K", 256, 512), ("Q8_0", 96, 1024)]
    made = [make_weight(ctx, rng, q, n, k) for q, n, k in shapes]
    ws = [w for w, _ in made]
    try:
        set_bytes = sum(n * k * 2 for _, n, k in shapes)
        alloc0 = ctx.allocated()
        _, total = ctx.memory()

        rep = gemm.prewarm_f16(ctx, ws, headroom_bytes=2 * total)        # cannot fit
        assert not rep["armed"] and "does not fit" in rep["reason"]
        assert rep["weights_added"] == 0 and rep["bytes_added"] == 0
        assert rep["bytes_total"] == set_bytes and rep["weights_total"] == 3
        assert all(w.info()["f16_bytes"] == 0 for w in ws)
        assert ctx.allocated() == alloc0

        gemm.weight_cache_f16(ws[0])                                            # one already cached
        rep = gemm.prewarm_f16(ctx, ws, headroom_bytes=2 * total)
        assert not rep["armed"] and rep["weights_cached"] == 1
        assert ws[0].info()["f16_bytes"] > 0, "a cache made before the call was dropped"
        assert ws[1].info()["f16_bytes"] == 0 and ws[2].info()["f16_bytes"] == 0
        gemm.weight_drop_f16(ws[0])
        assert ctx.allocated() == alloc0

        rep = gemm.prewarm_f16(ctx, ws + [ws[1]], headroom_bytes=1 << 20)  # repeated entry once
        assert rep["armed"] and rep["reason"] == "", rep
        assert rep["weights_total"] == 3 and rep["weights_added"] == 3
        assert rep["bytes_added"] == set_bytes and rep["elapsed_ms"] > 0
        assert ctx.allocated() == alloc0 + set_bytes
        for (w, w64), (q, n, k) in zip(made, shapes):
            assert w.info()["f16_bytes"] == n * k * 2
            x = randn(rng, 5, k)
            assert_close(f"prewarmed {q}", _ref(x, w64), gemm.project_np(ctx, w, x, leg="auto"),
                         rtol=F16_BOUND)
            assert np.array_equal(gemm.project_np(ctx, w, x, leg="auto"),
                                  gemm.project_np(ctx, w, x, leg="f16"))

        rep = gemm.prewarm_f16(ctx, ws)                                  # all cached: done
        assert rep["armed"] and rep["weights_added"] == 0 and rep["bytes_needed"] == 0
        assert gemm.prewarm_f16(ctx, [])["armed"]
        for w in ws:
            gemm.weight_drop_f16(w)
        assert ctx.allocated() == alloc0
    finally:
        for w in ws:
            w.close()


@pytest.mark.gpu
def test_weight_of_another_context_is_rejected(ctx, rng):
    with core.Context(0) as other:
        w, _ = make_weight(other, rng, "Q8_0", 32, 64)
        with w, pytest.raises(errors.InvalidArgumentError, match="belongs to another context"):
            gemm.prewarm_f16(ctx, [w])
