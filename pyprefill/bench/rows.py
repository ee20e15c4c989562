"""Row kernels (RMSNorm, partial NEOX RoPE, SwiGLU) at qwen35-4b shapes, in GB/s of the bytes
each must move (inputs read once, outputs written once). No peer: these are memory-bound and
the number to compare with is the device copy row of the gemm family."""
from __future__ import annotations

from ..formats.synth import preset_desc
from ..kernels import rows as K

SHAPES = "qwen35-4b"


# -- the wrapper calls: the only lines that touch pyprefill.kernels.rows ------------------------
def _rms_norm(ctx, x, w, y, rows, cols, eps):
    K.rms_norm(ctx, x, w, y, rows, cols, eps)


def _rope(ctx, x, rows, n_heads, head_dim, rot_dim, pos0, base, head_stride):
    K.rope_neox(ctx, x, rows, n_heads, head_dim, rot_dim, pos0, base, head_stride=head_stride)


def _swiglu(ctx, g, u, out, rows, cols):
    K.swiglu(ctx, g, u, out, rows, cols)


def View(buf, off=0, ld=0):
    return K.View(buf, off, ld)
# ------------------------------------------------------------------------------------------------


def rms_norm(b, T: int, d) -> None:
    cols = d.n_embd
    nbytes = 8 * T * cols
    n = b.sets(nbytes)
    xs, ys = b.slab(T, cols, n), b.out_slab(T, cols, n)
    w = b.upload(1 + 0.1 * b.rand(cols))
    t = b.time_ours(lambda i: _rms_norm(b.ctx, View(xs.buf, xs.off(i), cols), w,
                                        View(ys.buf, ys.off(i), cols), T, cols, d.eps))
    b.add("rmsnorm", T, "ours", t, nbytes=nbytes, note=f"[T][{cols}]", sets=n)


def rope(b, T: int, d) -> None:
    H, D, R = d.n_head, d.head_dim, d.rope_dim
    ld = H * 2 * D if d.arch == "qwen35" else H * D   # qwen35 q rows: [q | gate] per head
    nbytes = 8 * T * H * R                             # the rotated columns, read and written
    n = b.sets(nbytes)
    xs = b.slab(T, ld, n)
    t = b.time_ours(lambda i: _rope(b.ctx, View(xs.buf, xs.off(i), ld), T, H, D, R, 0,
                                    d.rope_base, ld // H))
    b.add("rope", T, "ours", t, nbytes=nbytes, note=f"q H={H} D={D} rot={R}, in place", sets=n)


def swiglu(b, T: int, d) -> None:
    cols = d.n_ff
    nbytes = 12 * T * cols
    n = b.sets(nbytes)
    gs, us, outs = b.slab(T, cols, n), b.slab(T, cols, n), b.out_slab(T, cols, n)
    t = b.time_ours(lambda i: _swiglu(b.ctx, View(gs.buf, gs.off(i), cols),
                                      View(us.buf, us.off(i), cols),
                                      View(outs.buf, outs.off(i), cols), T, cols))
    b.add("swiglu", T, "ours", t, nbytes=nbytes, note=f"[T][{cols}]", sets=n)


def run(b, lengths) -> None:
    if b.ctx is None:
        return
    d = preset_desc(SHAPES)
    for T in lengths:
        for fn in (rms_norm, rope, swiglu):
            b.op(f"{fn.__name__} T={T}", fn, b, T, d)
