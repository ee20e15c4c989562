"""Contexts, buffers and weights on a real device."""
import numpy as np
import pytest

from pyprefill import core, errors

pytestmark = pytest.mark.gpu

QTYPE_BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q8_0": (32, 34),
                "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_XS": (256, 136)}


@pytest.mark.parametrize("n", [1, 7, 777, 65537, 3 * 2**20 + 5])
def test_buffer_round_trip_odd_sizes(ctx, rng, n):
    x = rng.integers(0, 256, size=n, dtype=np.uint8)
    with ctx.buffer(n + 3) as buf:
        buf.poison()
        buf.upload(x, offset=3)
        back = buf.download(np.uint8, (n,), offset=3)
        head = buf.download(np.uint8, (3,))
    assert np.array_equal(back, x)
    assert (head == 0xFF).all()


def test_buffer_range_checked(ctx):
    with ctx.buffer(16) as buf:
        with pytest.raises(errors.InvalidArgumentError, match="outside the buffer"):
            buf.upload(np.zeros(5, np.float32))
        with pytest.raises(errors.InvalidArgumentError, match="outside the buffer"):
            buf.download(np.float32, (2,), offset=12)


@pytest.mark.parametrize("qtype", list(QTYPE_BLOCKS))
def test_weight_upload_every_qtype(ctx, rng, qtype):
    elems, nbytes = QTYPE_BLOCKS[qtype]
    n, k = 5, 512
    data = rng.integers(0, 256, size=(n, k // elems * nbytes), dtype=np.uint8)
    before = ctx.allocated()
    with ctx.weight(qtype, n, k, data) as w:
        info = w.info()
        assert info == {"qtype": core.QTYPES[qtype], "n": n, "k": k, "bytes": data.nbytes,
                        "f16_bytes": 0}
        assert ctx.allocated() == before + data.nbytes
    assert ctx.allocated() == before
    with pytest.raises(errors.InvalidArgumentError, match=f"needs {data.nbytes}"):
        ctx.weight(qtype, n, k, data[:, :-1].copy())


def test_two_contexts_in_one_process(rng):
    with core.Context(0) as a, core.Context(0) as b:
        x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(77).astype(np.float32)
        ba, bb = a.upload(x), b.upload(y)
        assert np.array_equal(ba.download(np.float32, x.shape), x)
        assert np.array_equal(bb.download(np.float32, y.shape), y)


def test_out_of_memory_keeps_context_usable(ctx, rng):
    free, total = ctx.memory()
    with pytest.raises(errors.OutOfMemoryError, match="out of device memory"):
        ctx.buffer(4 * total)
    x = rng.standard_normal(4096).astype(np.float32)
    with ctx.upload(x) as buf:
        assert np.array_equal(buf.download(np.float32, x.shape), x)


def test_create_destroy_cycles_do_not_leak():
    with core.Context(0) as probe:
        free0, _ = probe.memory()
    for _ in range(200):
        with core.Context(0) as c:
            c.buffer(1 << 20)
            c.weight("Q8_0", 4, 32, np.zeros((4, 34), np.uint8))
    with core.Context(0) as probe:
        free1, _ = probe.memory()
    # the driver's own bookkeeping moves a little; a leak of 200 contexts would be >= 6 GiB
    assert free0 - free1 < 64 << 20, f"device memory fell by {(free0 - free1) / 2**20:.1f} MiB"
