// api_rows.cu — kernel-level C API of the row kernels (rows.cuh). Each entry checks every
// argument (scalars, then NULL buffers, then ctx, then buffer ownership and sizes, then
// overlaps: see api_views.h) before any device work, then calls the internal entry on the
// context's stream.
#include "api_views.h"
#include "cuda_check.cuh"
#include "rows.cuh"

extern "C" PF_API pf_status pf_rms_norm_rows(pf_context *ctx, const pf_buffer *x, int64_t x_off,
                                            int64_t ldx, const pf_buffer *w, int64_t w_off,
                                            pf_buffer *y, int64_t y_off, int64_t ldy,
                                            int64_t rows, int64_t cols, float eps) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(cols >= 1, "%s: cols=%lld must be >= 1", fn, (long long)cols);
        PF_TRY(pf::eps_arg(fn, eps));
        if (ldx == 0) ldx = cols;
        if (ldy == 0) ldy = cols;
        const pf::RowsView vx{x, x_off, ldx, rows, cols, "x"}, vy{y, y_off, ldy, rows, cols, "y"};
        const pf::RowsView vw = pf::vec_view(w, w_off, cols, "w");
        PF_TRY(pf::check_views(fn, ctx, {vx, vw, vy}));
        PF_CHECK_ARG(pf::views_same(vx, vy) || !pf::views_overlap(vx, vy),
                     "%s: y overlaps x (only y == x, same offset and ld, is allowed)", fn);
        PF_CHECK_ARG(!pf::views_overlap(vw, vy), "%s: y overlaps w", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::rms_norm_rows(vx.ptr(), ldx, vw.ptr(), vy.ptr(), ldy, rows, cols, eps,
                                 ctx->stream);
    });
}

extern "C" PF_API pf_status pf_head_rms_norm_rows(pf_context *ctx, pf_buffer *x, int64_t x_off,
                                                 int64_t ldx, int64_t rows, int32_t n_heads,
                                                 int64_t head_stride, int32_t head_dim,
                                                 const pf_buffer *w, int64_t w_off, float eps) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t width = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, &head_stride, head_dim, &ldx, &width));
        PF_TRY(pf::eps_arg(fn, eps));
        const pf::RowsView vx{x, x_off, ldx, rows, width, "x"};
        const pf::RowsView vw = pf::vec_view(w, w_off, head_dim, "w");
        PF_TRY(pf::check_views(fn, ctx, {vx, vw}));
        PF_CHECK_ARG(!pf::views_overlap(vx, vw), "%s: x overlaps w", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::head_rms_norm_rows(vx.ptr(), ldx, rows, n_heads, head_stride, head_dim,
                                      vw.ptr(), eps, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_rope_neox_rows(pf_context *ctx, pf_buffer *x, int64_t x_off,
                                             int64_t ldx, int64_t rows, int32_t n_heads,
                                             int64_t head_stride, int32_t head_dim,
                                             int32_t rot_dim, int64_t pos0, float base) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t width = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, &head_stride, head_dim, &ldx, &width));
        PF_CHECK_ARG(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim,
                     "%s: rot_dim=%d must be even and in [2, head_dim=%d]", fn, rot_dim, head_dim);
        PF_CHECK_ARG(pos0 >= 0 && pos0 <= (int64_t(1) << 52), "%s: pos0=%lld out of range", fn,
                     (long long)pos0);
        PF_CHECK_ARG(base > 1.0f && std::isfinite(base), "%s: base=%g must be finite and > 1", fn,
                     (double)base);
        const pf::RowsView vx{x, x_off, ldx, rows, width, "x"};
        PF_TRY(pf::check_views(fn, ctx, {vx}));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::rope_neox_rows(vx.ptr(), ldx, rows, n_heads, head_stride, head_dim, rot_dim,
                                  pos0, base, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_swiglu_rows(pf_context *ctx, const pf_buffer *g, int64_t g_off,
                                          int64_t ldg, const pf_buffer *u, int64_t u_off,
                                          int64_t ldu, pf_buffer *out, int64_t out_off,
                                          int64_t ldo, int64_t rows, int64_t cols) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(cols >= 1, "%s: cols=%lld must be >= 1", fn, (long long)cols);
        if (ldg == 0) ldg = cols;
        if (ldu == 0) ldu = cols;
        if (ldo == 0) ldo = cols;
        const pf::RowsView vg{g, g_off, ldg, rows, cols, "g"}, vu{u, u_off, ldu, rows, cols, "u"},
            vo{out, out_off, ldo, rows, cols, "out"};
        PF_TRY(pf::check_views(fn, ctx, {vg, vu, vo}));
        PF_CHECK_ARG(pf::views_same(vo, vg) || !pf::views_overlap(vo, vg),
                     "%s: out overlaps g (only out == g, same offset and ld, is allowed)", fn);
        PF_CHECK_ARG(pf::views_same(vo, vu) || !pf::views_overlap(vo, vu),
                     "%s: out overlaps u (only out == u, same offset and ld, is allowed)", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::swiglu_rows(vg.ptr(), ldg, vu.ptr(), ldu, vo.ptr(), ldo, rows, cols,
                               ctx->stream);
    });
}

extern "C" PF_API pf_status pf_add_rows(pf_context *ctx, pf_buffer *y, int64_t y_off, int64_t ldy,
                                       const pf_buffer *x, int64_t x_off, int64_t ldx,
                                       int64_t rows, int64_t cols) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(cols >= 1, "%s: cols=%lld must be >= 1", fn, (long long)cols);
        if (ldy == 0) ldy = cols;
        if (ldx == 0) ldx = cols;
        const pf::RowsView vy{y, y_off, ldy, rows, cols, "y"}, vx{x, x_off, ldx, rows, cols, "x"};
        PF_TRY(pf::check_views(fn, ctx, {vy, vx}));
        PF_CHECK_ARG(!pf::views_overlap(vy, vx), "%s: y overlaps x", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::add_rows(vy.ptr(), ldy, vx.ptr(), ldx, rows, cols, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_sigmoid_gate_rows(pf_context *ctx, pf_buffer *o, int64_t o_off,
                                                int64_t ldo, const pf_buffer *gate,
                                                int64_t gate_off, int64_t ldgate,
                                                int64_t gate_head_stride, int64_t rows,
                                                int32_t n_heads, int32_t head_dim) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t gate_width = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, &gate_head_stride, head_dim, &ldgate, &gate_width));
        const int64_t width = (int64_t)n_heads * head_dim;
        if (ldo == 0) ldo = width;
        const pf::RowsView vo{o, o_off, ldo, rows, width, "o"},
            vg{gate, gate_off, ldgate, rows, gate_width, "gate"};
        PF_TRY(pf::check_views(fn, ctx, {vo, vg}));
        PF_CHECK_ARG(!pf::views_overlap(vo, vg), "%s: o overlaps gate", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::sigmoid_gate_rows(vo.ptr(), ldo, vg.ptr(), ldgate, gate_head_stride, rows,
                                     n_heads, head_dim, ctx->stream);
    });
}
