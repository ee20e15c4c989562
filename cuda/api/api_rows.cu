// api_rows.cu — kernel-level C API of the row kernels (rows.cuh). Each entry checks every
// argument in the order of api_views.h (scalars and shapes, NULL buffers, ctx, ownership and
// fit, overlaps) before any device work, then calls the internal entry on the context's stream.
#include "api/api_views.h"
#include "base/cuda_check.cuh"
#include "kernels/rows/rows.cuh"

namespace {

pf_status cols_args(const char *fn, int64_t rows, int64_t cols) {
    PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
    PF_CHECK_ARG(cols >= 1, "%s: cols=%lld must be >= 1", fn, (long long)cols);
    return PF_STATUS_OK;
}

}  // namespace

extern "C" PF_API pf_status pf_rms_norm(pf_context *ctx, const pf_view *x, const pf_view *w,
                                       const pf_view *y, int64_t rows, int64_t cols, float eps) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(cols_args(fn, rows, cols));
        PF_TRY(pf::eps_arg(fn, eps));
        pf::RowsView vx, vw, vy;
        PF_TRY(pf::matrix_arg(fn, x, "x", rows, cols, cols, &vx));
        PF_TRY(pf::vector_arg(fn, w, "w", cols, &vw));
        PF_TRY(pf::matrix_arg(fn, y, "y", rows, cols, cols, &vy));
        PF_TRY(pf::check_views(fn, ctx, {vx, vw, vy}));
        PF_CHECK_ARG(pf::views_same(vx, vy) || !pf::views_overlap(vx, vy),
                     "%s: y overlaps x (only y == x, same offset and ld, is allowed)", fn);
        PF_CHECK_ARG(!pf::views_overlap(vw, vy), "%s: y overlaps w", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::rms_norm_rows(vx.cmat(), vw.ptr(), vy.mat(), rows, cols, eps, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_head_rms_norm(pf_context *ctx, const pf_view *x, const pf_view *w,
                                            int64_t rows, int32_t n_heads, int32_t head_dim,
                                            int64_t head_stride, float eps) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t width = 0, natural_ld = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, head_dim, &head_stride, &width, &natural_ld));
        PF_TRY(pf::eps_arg(fn, eps));
        pf::RowsView vx, vw;
        PF_TRY(pf::matrix_arg(fn, x, "x", rows, width, natural_ld, &vx));
        PF_TRY(pf::vector_arg(fn, w, "w", head_dim, &vw));
        PF_TRY(pf::check_views(fn, ctx, {vx, vw}));
        PF_CHECK_ARG(!pf::views_overlap(vx, vw), "%s: x overlaps w", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::head_rms_norm_rows(vx.mat(), rows, pf::HeadLayout{n_heads, head_stride, head_dim}, vw.ptr(),
                                      eps, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_rope_neox_args_init(pf_rope_neox_args *args, size_t struct_size) {
    return pf::args_init(args, struct_size, __func__, "pf_rope_neox_args");
}

extern "C" PF_API pf_status pf_rope_neox(pf_context *ctx, const pf_rope_neox_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_rope_neox_args_init"));
        const pf_rope_neox_args &a = *args;
        int64_t head_stride = a.head_stride, width = 0, natural_ld = 0;
        PF_TRY(pf::heads_args(fn, a.rows, a.n_heads, a.head_dim, &head_stride, &width,
                              &natural_ld));
        PF_CHECK_ARG(a.rot_dim >= 2 && a.rot_dim % 2 == 0 && a.rot_dim <= a.head_dim,
                     "%s: rot_dim=%d must be even and in [2, head_dim=%d]", fn, a.rot_dim,
                     a.head_dim);
        PF_CHECK_ARG(a.pos0 >= 0 && a.pos0 <= (int64_t(1) << 52), "%s: pos0=%lld out of range",
                     fn, (long long)a.pos0);
        PF_CHECK_ARG(a.base > 1.0f && std::isfinite(a.base), "%s: base=%g must be finite and > 1",
                     fn, (double)a.base);
        const pf::RowsView vx = pf::matrix_view(a.x, "x", a.rows, width, natural_ld);
        PF_TRY(pf::check_views(fn, ctx, {vx}));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::rope_neox_rows(vx.mat(), a.rows, pf::HeadLayout{a.n_heads, head_stride, a.head_dim}, a.rot_dim,
                                  a.pos0, a.base, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_swiglu(pf_context *ctx, const pf_view *g, const pf_view *u,
                                     const pf_view *out, int64_t rows, int64_t cols) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(cols_args(fn, rows, cols));
        pf::RowsView vg, vu, vo;
        PF_TRY(pf::matrix_arg(fn, g, "g", rows, cols, cols, &vg));
        PF_TRY(pf::matrix_arg(fn, u, "u", rows, cols, cols, &vu));
        PF_TRY(pf::matrix_arg(fn, out, "out", rows, cols, cols, &vo));
        PF_TRY(pf::check_views(fn, ctx, {vg, vu, vo}));
        PF_CHECK_ARG(pf::views_same(vo, vg) || !pf::views_overlap(vo, vg),
                     "%s: out overlaps g (only out == g, same offset and ld, is allowed)", fn);
        PF_CHECK_ARG(pf::views_same(vo, vu) || !pf::views_overlap(vo, vu),
                     "%s: out overlaps u (only out == u, same offset and ld, is allowed)", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::swiglu_rows(vg.cmat(), vu.cmat(), vo.mat(), rows, cols, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_add(pf_context *ctx, const pf_view *y, const pf_view *x,
                                  int64_t rows, int64_t cols) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(cols_args(fn, rows, cols));
        pf::RowsView vy, vx;
        PF_TRY(pf::matrix_arg(fn, y, "y", rows, cols, cols, &vy));
        PF_TRY(pf::matrix_arg(fn, x, "x", rows, cols, cols, &vx));
        PF_TRY(pf::check_views(fn, ctx, {vy, vx}));
        PF_CHECK_ARG(!pf::views_overlap(vy, vx), "%s: y overlaps x", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::add_rows(vy.mat(), vx.cmat(), rows, cols, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_sigmoid_gate(pf_context *ctx, const pf_view *o,
                                           const pf_view *gate, int64_t rows, int32_t n_heads,
                                           int32_t head_dim, int64_t gate_head_stride) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t gate_width = 0, gate_ld = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, head_dim, &gate_head_stride, &gate_width,
                              &gate_ld));
        const int64_t width = (int64_t)n_heads * head_dim;
        pf::RowsView vo, vg;
        PF_TRY(pf::matrix_arg(fn, o, "o", rows, width, width, &vo));
        PF_TRY(pf::matrix_arg(fn, gate, "gate", rows, gate_width, gate_ld, &vg));
        PF_TRY(pf::check_views(fn, ctx, {vo, vg}));
        PF_CHECK_ARG(!pf::views_overlap(vo, vg), "%s: o overlaps gate", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::sigmoid_gate_rows(vo.mat(), vg.cmat(), pf::HeadLayout{n_heads, gate_head_stride, head_dim}, rows,
                                     ctx->stream);
    });
}
