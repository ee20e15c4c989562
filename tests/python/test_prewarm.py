"""Issue 11 item 7: the prewarm (every matrix dequantized to an fp16 cache in a few batched
launches, prewarm.cu) writes exactly gguf.quants.dequantize's values rounded to fp16, bit for bit,
and bitwise what pf_dequantize writes, for every weight type the product loads (F32, F16, BF16,
Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS), in kernel-level sets (odd shapes, partial tiles, more
matrices than one launch takes, misaligned element-type slices) and in whole models with their
fused blocks (Q|K|V, GDN qkv|z|beta|alpha, gate|up). The destination is poisoned first: the
contexts are made with PF_CONTEXT_POISON, so every cache starts as NaN bytes. Also the entries
that serve it: pf_buffer_copy (the copy-bandwidth yardstick), pf_weight_copy_f16,
pf_model_weight, pf_model_prewarm_report, and the shared cache allocation's lifetime."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from helpers import null_view, status_and_error
from test_kernel_dequant import QTYPES, oracle, random_blocks

from _engine_models import synth_model
from pyprefill import core, errors
from pyprefill._ffi import ffi, lib
from pyprefill.kernels import gemm

MIXES = ["q4_k_m", "ud", "f32", "f16", "bf16", "q4_0", "q8_0"]  # together: every weight type
TILE = 8192  # elements per CTA of the prewarm kernel (prewarm.cu kTileElems)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float16).view(np.uint16)


def assert_bitwise(name: str, ref16: np.ndarray, out16: np.ndarray) -> None:
    """Bit-equal fp16 arrays; the message counts and locates the differences."""
    assert out16.shape == ref16.shape, f"{name}: shape {out16.shape} != {ref16.shape}"
    diff = _bits(out16) != _bits(ref16)
    if diff.any():
        where = np.argwhere(diff)[:4].tolist()
        pytest.fail(f"{name}: {int(diff.sum())} of {diff.size} fp16 elements differ, first at "
                    f"{where}: got {out16[tuple(where[0])]!r}, want {ref16[tuple(where[0])]!r}"
                    f" (NaN = left unwritten)")


# ------------------------------------------------------------------ CPU: argument checks


def test_argument_checks_without_a_device():
    N = ffi.NULL
    s, msg = status_and_error(lib.pf_buffer_copy(N, 0, N, 0, 16))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "dst is NULL" in msg
    s, msg = status_and_error(lib.pf_weight_copy_f16(N, N, null_view()))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "w is NULL" in msg
    out = ffi.new("pf_weight **")
    s, msg = status_and_error(lib.pf_model_weight(N, b"output.weight", out))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "model is NULL" in msg
    s, msg = status_and_error(lib.pf_model_weight(N, N, out))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "name is NULL" in msg
    rep = ffi.new("pf_prewarm_report *")
    s, msg = status_and_error(lib.pf_model_prewarm_report(N, rep))
    assert s == lib.PF_STATUS_ABI_MISMATCH and "pf_prewarm_report_init" in msg
    gemm.new_prewarm_report()  # the struct (with device_ms, bytes_read) matches the library's
    s, msg = status_and_error(lib.pf_model_prewarm_report(N, gemm.new_prewarm_report()))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "model is NULL" in msg
    opts = ffi.new("pf_context_options *")
    assert lib.pf_context_options_init(opts, ffi.sizeof("pf_context_options")) == lib.PF_STATUS_OK
    opts.flags = 2
    s, msg = status_and_error(lib.pf_context_create(ffi.new("pf_context **"), opts))
    assert s == lib.PF_STATUS_INVALID_ARGUMENT and "flags=2" in msg


# ------------------------------------------------------------------ GPU: kernel level


@pytest.fixture
def poisoned_ctx():
    with core.Context(0, poison=True) as c:
        yield c


def _case_shapes() -> list[tuple[str, int, int, str]]:
    """(qtype, n, k, regime): per type one row, odd row counts, a matrix of several tiles with a
    partial last one, extreme scales; element types also with odd k (their caches then sit at
    2-byte offsets in the shared allocation, and so do the block-type caches after them)."""
    shapes = []
    for i, q in enumerate(QTYPES):
        blk = 1 if q in ("F32", "F16", "BF16") else (32 if q in ("Q4_0", "Q8_0") else 256)
        shapes += [(q, 1, blk * 2, "normal"), (q, 7, blk * 4, "max_scales" if blk > 1 else "normal"),
                   (q, 37, 2560, "normal"),                     # 94720 elements: 11.6 tiles
                   (q, 33, 512, ["large", "small", "subnormal", "zero_and_extremes"][i % 4])]
        if blk == 1:
            shapes += [(q, 3, 13, "normal"), (q, 5, 7, "subnormal")]
    return shapes


def _make(ctx, rng, q, n, k, regime):
    data = random_blocks(rng, q, n, k, regime)
    return ctx.weight(q, n, k, data), oracle(data, q).reshape(n, k).astype(np.float16)


@pytest.mark.gpu
def test_prewarm_every_qtype_bitwise(poisoned_ctx, rng):
    ctx = poisoned_ctx
    cases = _case_shapes()
    made = [_make(ctx, rng, *c) for c in cases]
    # More matrices than one launch takes (96): tiny ones of every type after the real cases.
    for i in range(110):
        q = QTYPES[i % len(QTYPES)]
        blk = 1 if q in ("F32", "F16", "BF16") else (32 if q in ("Q4_0", "Q8_0") else 256)
        cases.append((q, 1 + i % 3, blk * (1 + i % 2), "normal"))
        made.append(_make(ctx, rng, *cases[-1]))
    ws = [w for w, _ in made]
    try:
        rep = gemm.prewarm_f16(ctx, ws)
        assert rep["armed"], rep
        assert rep["bytes_added"] == sum(n * k * 2 for _, n, k, _ in cases)
        assert rep["bytes_read"] == sum(w.info()["bytes"] for w in ws)
        assert 0 < rep["device_ms"] <= rep["elapsed_ms"]
        for (q, n, k, regime), (w, ref16) in zip(cases, made):
            name = f"{q} {n}x{k} {regime}"
            cache = gemm.weight_f16_np(ctx, w)
            assert_bitwise(f"prewarm {name} vs gguf", ref16, cache)
            assert_bitwise(f"prewarm {name} vs pf_dequantize", gemm.dequantize_np(ctx, w, f16=True), cache)
    finally:
        for w in ws:
            w.close()


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", QTYPES)
def test_cache_f16_alone_bitwise(poisoned_ctx, rng, qtype):
    """pf_weight_cache_f16 (one weight, the same batched kernel) on a matrix of several tiles."""
    w, ref16 = _make(poisoned_ctx, rng, qtype, 19, 2048 if qtype not in ("F32", "F16", "BF16") else 2047,
                     "normal")
    with w:
        gemm.weight_cache_f16(w)
        assert_bitwise(f"cache {qtype}", ref16, gemm.weight_f16_np(poisoned_ctx, w))


@pytest.mark.gpu
def test_shared_allocation_lives_until_the_last_cache(poisoned_ctx, rng):
    ctx = poisoned_ctx
    made = [_make(ctx, rng, q, 64, 512, "normal") for q in ("Q4_K", "Q6_K", "Q8_0")]
    ws = [w for w, _ in made]
    alloc_weights = ctx.allocated()
    assert gemm.prewarm_f16(ctx, ws)["armed"]
    cached = ctx.allocated() - alloc_weights
    assert cached == 3 * 64 * 512 * 2
    gemm.weight_drop_f16(ws[0])                  # the others still use the allocation
    assert ctx.allocated() - alloc_weights == cached and ws[0].info()["f16_bytes"] == 0
    raw1 = ws[1].info()["bytes"]
    ws[1].close()                                # destroying a cached weight releases its share
    assert ctx.allocated() == alloc_weights + cached - raw1
    assert_bitwise("Q8_0 after its neighbours went", made[2][1], gemm.weight_f16_np(ctx, ws[2]))
    gemm.weight_drop_f16(ws[2])                  # the last one: freed
    assert ctx.allocated() == alloc_weights - raw1
    ws[0].close()
    ws[2].close()


@pytest.mark.gpu
def test_weight_copy_f16_needs_a_cache(ctx, rng):
    w, _ = _make(ctx, rng, "Q4_0", 8, 64, "normal")
    with w, pytest.raises(errors.InvalidArgumentError, match="has no fp16 cache"):
        gemm.weight_f16_np(ctx, w)


@pytest.mark.gpu
def test_poison_flag_and_buffer_copy(poisoned_ctx, rng):
    ctx = poisoned_ctx
    with ctx.buffer(4096) as a, ctx.buffer(4096) as b:
        ctx.synchronize()
        assert (a.download(np.uint8, 4096) == 0xFF).all(), "PF_CONTEXT_POISON: not 0xFF"
        x = rng.integers(0, 256, 4096, dtype=np.uint8)
        a.upload(x)
        b.copy_from(a, 1000, offset=96, src_offset=3)
        ctx.synchronize()
        got = b.download(np.uint8, 4096)
        assert (got[96:1096] == x[3:1003]).all() and (got[:96] == 0xFF).all() and (got[1096:] == 0xFF).all()
        with pytest.raises(errors.InvalidArgumentError, match="overlap"):
            a.copy_from(a, 100, offset=50, src_offset=0)
        with pytest.raises(errors.InvalidArgumentError, match="outside the buffer"):
            a.copy_from(b, 100, offset=4000)
        with core.Context(0) as other, other.buffer(64) as c:
            with pytest.raises(errors.InvalidArgumentError, match="different contexts"):
                c.copy_from(a, 64)


# ------------------------------------------------------------------ GPU: whole models


def _matrices(path: str):
    """(name, reference fp16 [n][k]) of every matrix the engine loads as a weight."""
    for t in gguf.GGUFReader(path).tensors:
        if len(t.shape) != 2 or t.name.endswith("ssm_conv1d.weight"):
            continue                      # 1-D tensors and the conv kernel are fp32 vectors
        n, k = int(t.shape[1]), int(t.shape[0])
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        yield t.name, t.tensor_type.name, ref.reshape(n, k).astype(np.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("mix", MIXES)
def test_model_prewarm_bitwise_with_fused_blocks(mix, monkeypatch):
    from pyprefill.model import Model
    monkeypatch.setenv("PREFILL_FUSE", "1")       # the fused layout (the default)
    path = synth_model("qwen35-tiny", mix)        # GDN and attention layers: every fused group
    seen = set()
    with core.Context(0, poison=True) as ctx:
        with Model(path, context=ctx, gemm="f16", prewarm=True, progress=False) as m:
            rep = m.prewarm_report()
            assert rep["armed"] and m.info["f16_armed"], rep
            assert rep["bytes_added"] == m.info["f16_bytes"] and rep["bytes_read"] == m.info["weight_bytes"]
            assert rep["device_ms"] > 0
            names = []
            for name, qtype, ref16 in _matrices(path):
                names.append(name)
                seen.add(qtype)
                assert_bitwise(f"{mix} {name} ({qtype})", ref16, gemm.weight_f16_np(ctx, m.weight(name)))
            assert any(n.endswith("attn_qkv.weight") for n in names)    # GDN qkv|z|beta|alpha
            assert any(n.endswith("attn_q.weight") for n in names)      # attention Q|K|V
            with pytest.raises(errors.InvalidArgumentError, match="no matrix named"):
                m.weight("blk.0.attn_norm.weight")
    assert seen, "no matrix compared"


@pytest.mark.gpu
def test_model_prewarm_report_before_any_prewarm():
    from pyprefill.model import Model
    with Model(synth_model("qwen3-tiny"), prewarm=False, progress=False) as m:
        rep = m.prewarm_report()
        assert not rep["armed"] and rep["reason"] == "not run"
        assert m.prewarm()
        rep = m.prewarm_report()
        assert rep["armed"] and rep["weights_added"] == rep["weights_total"] > 0
