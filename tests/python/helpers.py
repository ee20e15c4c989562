"""Shared test helpers: the error measure of design.md (relative Frobenius error over the whole
array, worst single row beside it) with both numbers in the failure message."""
from __future__ import annotations

import numpy as np


def rel_error(ref: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """(||out-ref|| / ||ref|| over the whole array, the worst row's relative error)."""
    r = np.asarray(ref, dtype=np.float64)
    o = np.asarray(out, dtype=np.float64)
    whole = float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-300))
    if r.ndim >= 2:
        r2, o2 = r.reshape(r.shape[0], -1), o.reshape(o.shape[0], -1)
        rows = np.linalg.norm(o2 - r2, axis=1) / np.maximum(np.linalg.norm(r2, axis=1), 1e-300)
        worst = float(rows.max(initial=0.0))
    else:
        worst = whole
    return whole, worst


def assert_close(name: str, ref, out, *, rtol: float, worst_rtol: float | None = None) -> float:
    ref, out = np.asarray(ref), np.asarray(out)
    assert out.shape == ref.shape, f"{name}: shape {out.shape} != reference {ref.shape}"
    assert np.isfinite(out).all(), (
        f"{name}: {int((~np.isfinite(out)).sum())} non-finite values in the output "
        f"(unwritten elements stay NaN after poisoning)")
    whole, worst = rel_error(ref, out)
    msg = f"{name}: rel error {whole:.3e} (bound {rtol:.0e}), worst row {worst:.3e}"
    assert whole <= rtol, msg
    if worst_rtol is not None:
        assert worst <= worst_rtol, msg + f" (row bound {worst_rtol:.0e})"
    return whole


def randn(rng, *shape, scale: float = 1.0) -> np.ndarray:
    """Fresh float32 normal values (never zeros: they hide unwritten outputs)."""
    x = rng.standard_normal(shape, dtype=np.float32)
    return x * np.float32(scale) if scale != 1.0 else x


def make_weight(ctx, rng, qtype: str, n: int, k: int):
    """(Weight on ctx, float64 reference [n][k]) from random valid blocks of realistic scale;
    the reference is gguf's own dequantizer, independent of the library's."""
    import gguf

    from pyprefill import core
    from pyprefill.formats.quant import random_blocks
    data = random_blocks(n, k, core.qtype_id(qtype), rng)
    ref = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]).astype(np.float64)
    return ctx.weight(qtype, n, k, data), ref


def blocks_unsupported(ctx) -> str | None:
    """None where ctx's device runs the GEMM on the GGUF blocks (the sm_90a kernels; sessions then
    run an uncached matrix on them, tuning gemm_blocks), else the library's reason: probed with the
    8-bit leg, which has the same check."""
    from pyprefill import errors
    from pyprefill.kernels import gemm
    rng = np.random.default_rng(5)
    w, _ = make_weight(ctx, rng, "Q8_0", 8, 128)
    with w:
        try:
            gemm.project_np(ctx, w, randn(rng, 2, 128), leg="int8")
        except errors.UnsupportedError as e:
            return str(e)
    return None


def assert_uncached_auto_leg(model, ctx, tokens, f32_logits, **session_kw) -> None:
    """A model without its fp16 caches on the leg auto: the f32 leg bit for bit (f32_logits), or
    on a device that runs the GEMM on the blocks the f16 leg on them (bitwise a session asking
    for f16, not the f32 leg's bits, within the default legs' 2e-2 of them)."""
    with model.session(gemm="auto", **session_kw) as s:
        got = s.prefill(tokens, "all")
    if blocks_unsupported(ctx) is not None:
        assert np.array_equal(got, f32_logits), "auto without the fp16 cache is not the f32 leg"
        return
    with model.session(gemm="f16", **session_kw) as s:
        assert np.array_equal(got, s.prefill(tokens, "all")), "auto without the fp16 cache is not the blocks"
    assert not np.array_equal(got, f32_logits)
    assert_close("auto on the blocks", f32_logits, got, rtol=2e-2)


# ----------------------------------------------------------------------------- C argument checks
# The C API checks scalars and shapes, then NULL views and buffers, then ctx: tests call it with
# ctx = NULL and views without a buffer, so that every check up to the NULL-buffer phase runs on
# the CPU.


def null_view(off: int = 0, ld: int = 0):
    """A `pf_view *` without a buffer (its offset and row stride still checked)."""
    from pyprefill._ffi import ffi
    return ffi.new("pf_view *", {"buf": ffi.NULL, "off": off, "ld": ld})


def c_args(ctype: str, **fields):
    """A `pf_<op>_args *` filled by its _init function, then by `fields` (a dict value fills the
    fields of a view, e.g. q={"ld": 100})."""
    from pyprefill._ffi import ffi, lib
    a = ffi.new(f"{ctype} *")
    assert getattr(lib, f"{ctype}_init")(a, ffi.sizeof(ctype)) == lib.PF_STATUS_OK
    for key, value in fields.items():
        if isinstance(value, dict):
            for vk, vv in value.items():
                setattr(getattr(a, key), vk, vv)
        else:
            setattr(a, key, value)
    return a


def status_and_error(status) -> tuple[int, str]:
    """(status, pf_last_error()) right after a C call."""
    from pyprefill._ffi import ffi, lib
    return int(status), ffi.string(lib.pf_last_error()).decode()
