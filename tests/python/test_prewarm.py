"""Issue 11 item 7: the prewarm (every matrix dequantized to an fp16 cache in a few batched
launches, prewarm.cu) writes exactly gguf.quants.dequantize's values rounded to fp16, bit for bit,
and bitwise what pf_dequantize writes, for every weight type the product loads (F32, F16, BF16,
Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS), in kernel-level sets (odd shapes, partial tiles, more
matrices than one launch takes, misaligned element-type slices) and in whole models with their
fused blocks (Q|K|V, GDN qkv|z|beta|alpha, gate|up). The destination is poisoned first: the
contexts are made with PF_CONTEXT_POISON, so every cache starts as NaN bytes. Also the entries
that serve it: pf_buffer_copy (the copy-bandwidth yardstick), pf_weight_copy_f16,
pf_model_weight, pf_model_prewarm_report, and the shared cache allocation's lifetime.
Prewarm v2 (session 17): the kernel's persistent CTAs take several tiles each, of changing
matrices and types (sets of thousands of tiles), and the cache comes in pieces allocated one
after the other (tuning prewarm_piece_bytes sets the first piece's bytes, "one-allocation" = one
allocation; prewarm_fail_piece=N makes piece N's allocation fail): every piece setting gives the
same bits and the same logits, and a failing piece leaves nothing behind. The cache rule (session
45, issue 38): a model's prewarm leaves a unit at its file's size where the blocks' form measured
within the margin of the cache (tuning prewarm_cache_rows / _margin), and says so in the report."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
from helpers import assert_uncached_auto_leg, null_view, status_and_error
from test_kernel_dequant import QTYPES, oracle, random_blocks

from _engine_models import random_tokens, synth_model
from _engine_models import test_dir as _test_dir
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


def _block_elems(q: str) -> int:
    return 1 if q in ("F32", "F16", "BF16") else (32 if q in ("Q4_0", "Q8_0") else 256)


def _check_against_dequantize(ctx, cases, ws):
    for (q, n, k, regime), w in zip(cases, ws):
        assert_bitwise(f"prewarm {q} {n}x{k} {regime} vs pf_dequantize",
                       gemm.dequantize_np(ctx, w, f16=True), gemm.weight_f16_np(ctx, w))


@pytest.fixture(params=["default", 1, "one-allocation"], ids=lambda p: f"piece={p}")
def piece_ctx(request, poisoned_ctx):
    """A poisoned context whose tuning sets prewarm_piece_bytes: the library's default (256
    MiB: one piece for these sets), 1 byte (each matrix its own piece until the doubling target
    outgrows them) or one allocation."""
    if request.param != "default":
        poisoned_ctx.set_tuning(prewarm_piece_bytes=request.param)
    return poisoned_ctx


@pytest.mark.gpu
def test_prewarm_many_tiles_per_cta_bitwise(piece_ctx, rng):
    """~3800 tiles in one launch: more than the resident CTAs of any current GPU (H200: 132 SMs
    x 6), so each persistent CTA takes several tiles, and its next tile (staged while the current
    one decodes) is often of another matrix and type, element types included. Row counts and
    k = 7680 put every matrix end inside a tile."""
    ctx = piece_ctx
    cases = [(QTYPES[(5 + i) % len(QTYPES)], 131 + 37 * i, 7680, "normal") for i in range(12)]
    assert sum(n * k for _, n, k, _ in cases) > 3500 * TILE
    ws = [ctx.weight(q, n, k, random_blocks(rng, q, n, k, r)) for q, n, k, r in cases]
    try:
        rep = gemm.prewarm_f16(ctx, ws)
        assert rep["armed"], rep
        assert rep["bytes_added"] == sum(n * k * 2 for _, n, k, _ in cases)
        _check_against_dequantize(ctx, cases, ws)
    finally:
        for w in ws:
            w.close()


@pytest.mark.gpu
@pytest.mark.parametrize("count", [1, 95, 96, 97, 192, 193, 301])
def test_prewarm_matrix_counts_around_the_launch_size(poisoned_ctx, rng, count):
    """Sets of 1 to 301 matrices (96 per launch): one launch, exactly full, one over, two full,
    four launches; small matrices of every type, odd rows, some of several tiles with a partial
    last one. In pieces of at least 4 KiB (many pieces, each its own launches)."""
    ctx = poisoned_ctx
    ctx.set_tuning(prewarm_piece_bytes=4096)
    cases = []
    for i in range(count):
        q = QTYPES[i % len(QTYPES)]
        blk = _block_elems(q)
        k = blk * (1 + i % 3) if blk > 1 else 5 + i % 11     # element types: k not a multiple of 8
        n = 1 + (i * 7) % 13 if i % 10 else (TILE // k) * 2 + 3
        cases.append((q, n, k, "normal"))
    made = [_make(ctx, rng, *c) for c in cases]
    ws = [w for w, _ in made]
    try:
        rep = gemm.prewarm_f16(ctx, ws)
        assert rep["armed"] and rep["weights_added"] == count, rep
        for (q, n, k, regime), (w, ref16) in zip(cases, made):
            cache = gemm.weight_f16_np(ctx, w)
            assert_bitwise(f"#{count} {q} {n}x{k} vs gguf", ref16, cache)
            assert_bitwise(f"#{count} {q} {n}x{k} vs pf_dequantize",
                           gemm.dequantize_np(ctx, w, f16=True), cache)
    finally:
        for w in ws:
            w.close()


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "F16"])
@pytest.mark.parametrize("delta_blocks", [-1, 0, 1, 33])
def test_prewarm_sizes_around_the_tile(poisoned_ctx, rng, qtype, delta_blocks):
    """One matrix of 1, 2 and 3 tiles plus or minus blocks (delta_blocks blocks past a whole
    number of tiles): the last tile full, short by a block, or a few blocks long, including the
    2-byte tails of Q4_0, Q8_0, Q6_K and IQ4_XS tiles whose bytes are not a multiple of 16."""
    ctx = poisoned_ctx
    blk = _block_elems(qtype) if qtype != "F16" else 8
    cases = [(qtype, 1, tiles * TILE + delta_blocks * blk, "normal") for tiles in (1, 2, 3)]
    made = [_make(ctx, rng, *c) for c in cases]
    ws = [w for w, _ in made]
    try:
        assert gemm.prewarm_f16(ctx, ws)["armed"]
        for (q, n, k, _), (w, ref16) in zip(cases, made):
            assert_bitwise(f"{q} 1x{k} vs gguf", ref16, gemm.weight_f16_np(ctx, w))
    finally:
        for w in ws:
            w.close()


@pytest.mark.gpu
def test_each_piece_lives_until_its_last_cache(poisoned_ctx, rng):
    """prewarm_piece_bytes=1: three matrices, three pieces (targets 1, 2, 4 bytes). Dropping
    one cache frees its own piece and nothing else; the others keep their bits."""
    ctx = poisoned_ctx
    ctx.set_tuning(prewarm_piece_bytes=1)
    made = [_make(ctx, rng, q, 64, 512, "normal") for q in ("Q4_K", "Q6_K", "Q8_0")]
    ws = [w for w, _ in made]
    one = 64 * 512 * 2
    alloc_weights = ctx.allocated()
    try:
        assert gemm.prewarm_f16(ctx, ws)["armed"]
        assert ctx.allocated() - alloc_weights == 3 * one
        gemm.weight_drop_f16(ws[1])
        assert ctx.allocated() - alloc_weights == 2 * one
        for i in (0, 2):
            assert_bitwise(f"{i} after piece 1 went", made[i][1], gemm.weight_f16_np(ctx, ws[i]))
        gemm.weight_drop_f16(ws[0])
        gemm.weight_drop_f16(ws[2])
        assert ctx.allocated() == alloc_weights
    finally:
        for w in ws:
            w.close()


@pytest.mark.gpu
@pytest.mark.parametrize("fail_piece", [1, 2, 6])
def test_failing_piece_rolls_back_every_piece(poisoned_ctx, rng, fail_piece):
    """The allocation of piece N refused (tuning prewarm_fail_piece, 1-based; pieces of 1 byte
    doubling: one matrix each) while earlier pieces are being dequantized: not armed, the reason
    names the piece, no weight cached, the context's bytes and the device's free memory back; then
    the same set arms and is bitwise right."""
    ctx = poisoned_ctx
    ctx.set_tuning(prewarm_piece_bytes=1)
    made = [_make(ctx, rng, QTYPES[i % len(QTYPES)], 37, 2560, "normal") for i in range(8)]
    ws = [w for w, _ in made]
    try:
        ctx.synchronize()
        alloc0, free0 = ctx.allocated(), ctx.memory()[0]
        ctx.set_tuning(prewarm_piece_bytes=1, prewarm_fail_piece=fail_piece)
        rep = gemm.prewarm_f16(ctx, ws)
        assert not rep["armed"] and rep["weights_added"] == 0, rep
        assert f"piece {fail_piece} of 8" in rep["reason"] and "prewarm_fail_piece" in rep["reason"], rep
        assert all(w.info()["f16_bytes"] == 0 for w in ws)
        ctx.synchronize()
        assert ctx.allocated() == alloc0
        assert abs(ctx.memory()[0] - free0) <= (1 << 20)
        ctx.set_tuning(prewarm_piece_bytes=1)
        assert gemm.prewarm_f16(ctx, ws)["armed"]
        for (w, ref16) in made:
            assert_bitwise("after the rollback", ref16, gemm.weight_f16_np(ctx, w))
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
def test_model_prewarm_bitwise_with_fused_blocks(mix):
    from pyprefill.model import Model
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
@pytest.mark.parametrize("mix", ["q4_k_m", "f16"])
def test_model_prewarm_in_pieces_same_bits_and_logits(mix, rng):
    """prewarm_piece_bytes=1 (a tiny model's caches in a dozen or more pieces, each fused group
    whole in one) against one allocation: every cache bitwise gguf's, and a session's logits on
    the f16 leg with the fused projections bitwise the same."""
    from pyprefill.model import Model
    path = synth_model("qwen35-tiny", mix)
    refs = [(name, ref16) for name, _, ref16 in _matrices(path)]
    logits, toks = {}, None
    for piece in ("one-allocation", 1):
        with core.Context(0, poison=True) as ctx:
            with Model(path, context=ctx, gemm="f16", prewarm=True, progress=False,
                       tuning={"prewarm_piece_bytes": piece}) as m:
                rep = m.prewarm_report()
                assert rep["armed"] and rep["bytes_added"] == m.info["f16_bytes"], rep
                for name, ref16 in refs:
                    assert_bitwise(f"{mix} piece={piece} {name}", ref16, gemm.weight_f16_np(ctx, m.weight(name)))
                toks = random_tokens(rng, 50, m.n_vocab) if toks is None else toks
                with m.session(max_tokens=64, chunk=32) as s:
                    logits[piece] = s.prefill(toks, "all")
    assert np.isfinite(logits["one-allocation"]).all()
    assert np.array_equal(logits["one-allocation"], logits[1]), "pieces changed the f16 leg's logits"


@pytest.mark.gpu
def test_model_prewarm_failing_piece_leaves_the_exact_leg(rng):
    """A model whose prewarm loses a later piece's allocation (the context's tuning
    prewarm_fail_piece=4 with pieces from 1 byte: pieces 1-3 already launched): not armed at
    load nor when called again, nothing kept (the context's bytes, the device's free memory), the
    auto leg is the f32 leg bit for bit (on a device that runs the GEMM on the blocks: the f16 leg
    on the blocks, bitwise a session asking for f16, within its bound of the f32 leg); without the
    hook the same model arms."""
    from pyprefill.model import Model
    exact = dict(kv="f32", attention="cublas")
    path = synth_model("qwen35-tiny", "q4_k_m")
    with Model.load(path, gemm="f32", prewarm=False, progress=False) as ref:
        toks = random_tokens(rng, 50, ref.n_vocab)
        with ref.session(max_tokens=64, chunk=32, **exact) as s:
            want = s.prefill(toks, "all")
    with core.Context(0) as ctx:
        ctx.set_tuning(prewarm_piece_bytes=1, prewarm_fail_piece=4)   # the model inherits it
        with Model(path, context=ctx, gemm="auto", prewarm=True, progress=False) as m:
            rep = m.prewarm_report()
            assert not rep["armed"] and "prewarm_fail_piece" in rep["reason"], rep
            assert m.info["f16_armed"] == 0 and m.info["f16_bytes"] == 0
            ctx.synchronize()
            alloc0, free0 = ctx.allocated(), ctx.memory()[0]
            assert m.prewarm() is False
            ctx.synchronize()
            assert ctx.allocated() == alloc0 and abs(ctx.memory()[0] - free0) <= (1 << 20)
            assert_uncached_auto_leg(m, ctx, toks, want, max_tokens=64, chunk=32, **exact)
            ctx.set_tuning(prewarm_piece_bytes=1)
            assert m.prewarm() is True and m.info["f16_armed"] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["qwen35-tiny", "qwen3-tiny"])
def test_partial_prewarm_under_a_memory_budget_streams_the_rest(preset, rng):
    """Issue 29 item 2: a context whose memory budget holds the model and half of its fp16 cache
    (plus the headroom): the prewarm caches whole groups, largest first, up to what fits, reports
    partial, and the leg auto runs every matrix on the f16 leg (the uncached ones streamed, or on a
    device that runs the GEMM on the blocks, as per-call slabs: tuning gemm_blocks_slab_rows 2, so
    that the LM head's pieces of fewer than 65 rows take them too): with fused groups off (so that
    a cached and a streamed matrix take the same GEMM), bitwise the fully cached model's logits,
    and not the f32 leg's. Allocations past the budget fail with OUT_OF_MEMORY naming it."""
    from pyprefill.model import Model
    path = synth_model(preset, "q4_k_m")
    nofuse = dict(fuse_groups=False)
    toks = random_tokens(rng, 70, 1024)
    kw = dict(max_tokens=128, chunk=128, kv="f32", attention="cublas")
    with Model.load(path, gemm="auto", prewarm=True, progress=False, tuning=nofuse) as full:
        assert full.info["f16_armed"] == 1
        f16_total = full.info["f16_bytes"]
        held_weights = full.ctx.allocated() - f16_total
        with full.session(gemm="auto", **kw) as s:
            want = s.prefill(toks, "all")
        with full.session(gemm="f32", **kw) as s:
            exact = s.prefill(toks, "all")
    headroom = 64 << 20
    budget = held_weights + f16_total // 2 + headroom
    with core.Context(0, memory_budget=budget) as ctx:
        with Model(path, context=ctx, gemm="auto", prewarm=True, prewarm_headroom=headroom,
                   progress=False, tuning=dict(nofuse, gemm_blocks_slab_rows=2)) as m:
            rep = m.prewarm_report()
            assert rep["partial"] and not rep["armed"], rep
            assert 0 < rep["weights_cached"] < rep["weights_total"], rep
            assert 0 < rep["bytes_added"] <= f16_total // 2, rep
            assert rep["reason"].startswith("partial: "), rep
            assert m.info["f16_armed"] == 0 and m.info["f16_bytes"] == rep["bytes_added"]
            assert ctx.allocated() <= budget
            with m.session(gemm="auto", **kw) as s:
                got = s.prefill(toks, "all")
            assert np.array_equal(got, want), "a partly cached model differs from the fully cached one"
            assert not np.array_equal(got, exact), "the streamed matrices ran the f32 leg"
            with pytest.raises(errors.OutOfMemoryError, match=f"past its memory budget of {budget} bytes"):
                core.Buffer(ctx, budget)
            assert ctx.memory()[0] <= budget - ctx.allocated()


@pytest.mark.gpu
def test_model_prewarm_report_before_any_prewarm():
    from pyprefill.model import Model
    with Model(synth_model("qwen3-tiny"), prewarm=False, progress=False) as m:
        rep = m.prewarm_report()
        assert not rep["armed"] and rep["reason"] == "not run"
        assert m.prewarm()
        rep = m.prewarm_report()
        assert rep["armed"] and rep["weights_added"] == rep["weights_total"] > 0


def _rule_model() -> str:
    """qwen35-0.8b's shapes cut to 4 layers (one attention layer) and a 1024-token vocabulary:
    units of 4-17 MiB of fp16, inside the cache rule (tiny models' are under its floor)."""
    from pyprefill.formats.synth import write_synthetic
    path = os.path.join(_test_dir(), "qwen35-0.8b-l4-q4_k_m.gguf")
    if not os.path.exists(path):
        write_synthetic("qwen35-0.8b", "q4_k_m", path + ".tmp", seed=7, progress=False, n_layer=4,
                        n_vocab=1024)
        os.replace(path + ".tmp", path)
    return path


@pytest.mark.gpu
def test_cache_rule_keeps_the_file_size_where_asked(rng):
    """Issue 38's default: a model's prewarm caches a unit the f16 leg reads from its blocks only
    where the cache measured faster by more than the margin at the rule's rows. With a margin no
    measurement can pass (100000%) every such unit stays at its file's size (the LM head and
    the norms' vectors are outside the rule), the report says so, and a session's logits at 100
    rows (the blocks' per-call slabs: the cache's GEMM on the cache's bits) equal the fully cached
    model's bit for bit; with the default margin the report's counts, ratios and decisions agree
    (a unit left on its blocks measured within 3%, a cached one beyond)."""
    from pyprefill.model import Model
    path = _rule_model()
    kw = dict(max_tokens=128, chunk=128, kv="f32", attention="cublas")
    with Model.load(path, gemm="auto", prewarm=True, progress=False,
                    tuning={"prewarm_cache_rows": "no-rule"}) as full:
        rep = full.prewarm_report()
        assert rep["armed"] and rep["rule_rows"] == 0 and rep["weights_blocks"] == 0, rep
        assert "no cache rule" in rep["why"], rep
        toks = random_tokens(rng, 100, full.n_vocab)
        with full.session(**kw) as s:
            want = s.prefill(toks, "all")
        cached_bytes = full.info["f16_bytes"]
    with Model.load(path, gemm="auto", prewarm=True, progress=False,
                    tuning={"prewarm_cache_margin": 100000, "prewarm_cache_rows": 256}) as m:
        rep = m.prewarm_report()
        assert rep["armed"] and rep["rule_rows"] == 256, rep
        assert 0 < rep["weights_blocks"] < rep["weights_total"], rep     # the LM head stays cached
        assert rep["weights_cached"] + rep["weights_blocks"] == rep["weights_total"], rep
        assert 0 < rep["rule_ratio_min"] <= rep["rule_ratio_max"], rep
        assert "the rule at 256 rows" in rep["why"] and f"({rep['weights_blocks']} weights)" in rep["why"], rep
        assert m.info["f16_armed"] == 0 and 0 < m.info["f16_bytes"] < cached_bytes
        assert m.info["f16_bytes"] == rep["bytes_added"]
        with pytest.raises(errors.InvalidArgumentError):
            gemm.weight_f16_np(m.ctx, m.weight("blk.0.ffn_gate.weight"))        # no cache: its blocks
        with m.session(**kw) as s:
            got = s.prefill(toks, "all")
        assert np.array_equal(got, want), "a unit left on its blocks changed the logits at 100 rows"
    with Model.load(path, gemm="auto", prewarm=True, progress=False) as d:
        rep = d.prewarm_report()
        assert rep["armed"] and rep["rule_rows"] == 2048, rep
        assert rep["weights_cached"] + rep["weights_blocks"] == rep["weights_total"], rep
        if rep["weights_blocks"]:
            assert rep["rule_ratio_min"] <= 1.03, rep
        assert rep["rule_ratio_max"] > 1.03 or rep["weights_blocks"] > 0, rep
        print(f"cache rule at 2048 rows: {rep['why']}")
