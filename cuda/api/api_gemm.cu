// api_gemm.cu — the C API of the gemm family: dequantization, embedding gather, projections,
// fp16 caches and prewarm, fused kernels on the blocks. Every entry validates all of its
// arguments in the order of api_views.h (scalars and shapes, NULL weight and views, ctx,
// ownership and fit, overlaps) before any device work, then delegates to the internal entry
// points on ctx->stream.
#include <climits>

#include "api/api_views.h"
#include "base/context.h"
#include "base/cuda_check.cuh"
#include "kernels/dequant/dequant.cuh"
#include "kernels/gemm/gemm.cuh"
#include "kernels/gemm/gemm_q16.cuh"
#include "kernels/gemm/qgemm.cuh"
#include "plan/qtype.h"

namespace {

// Whether the kernel-level calls on ctx let the f16 leg read a weight's blocks (its tuning's
// gemm_blocks, where the device runs that GEMM): the call's part of the plan. (A NULL ctx is
// reported by the checks after the route's.)
bool blocks_on(const pf_context *ctx) {
    return ctx && pf::switch_on(ctx->tuning.gemm_blocks, false) && pf::gemm_q16_available(ctx->device);
}

constexpr int64_t kMaxBlasDim = INT_MAX;  // cuBLAS sizes and leading dimensions are int

pf_status weight_arg(const char *fn, const pf_weight *w, const char *name) {
    PF_CHECK_ARG(w != nullptr, "%s: %s is NULL", fn, name);
    return PF_STATUS_OK;
}

// The operands of a rows-in, rows-out entry: x [rows][ld] with k columns (ld 0 = k), out
// [rows][ld] with n columns (ld 0 = n), both fp32. w is known non-NULL.
pf_status rows_io_args(const char *fn, const pf_weight *w, const pf_view *x, const pf_view *out,
                       const char *out_name, int64_t rows, int64_t n, pf::RowsView *vx,
                       pf::RowsView *vo) {
    PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
    PF_TRY(pf::matrix_arg(fn, x, "x", rows, w->k, w->k, vx));
    return pf::matrix_arg(fn, out, out_name, rows, n, n, vo);
}

// Phases 1-5 of api_views.h for those operands: shapes, NULL buffers, ctx, w and both buffers of
// ctx and large enough, x and out not overlapping.
pf_status check_rows_io(const char *fn, const pf_context *ctx, const pf_weight *w,
                        const pf::RowsView &vx, const pf::RowsView &vo) {
    PF_TRY(pf::check_shapes(fn, {vx, vo}));
    PF_TRY(pf::check_nulls(fn, {vx, vo}));
    PF_TRY(pf::check_ctx(fn, ctx));
    PF_TRY(pf::check_weight(fn, ctx, w, "w"));
    PF_TRY(pf::check_fits(fn, ctx, {vx, vo}));
    PF_CHECK_ARG(!pf::views_overlap(vx, vo), "%s: %s overlaps x", fn, vo.name);
    return PF_STATUS_OK;
}

// Phases 1-4 for the one output view of an entry that reads weight w (dequantize, embed).
pf_status check_weight_out(const char *fn, const pf_context *ctx, const pf_weight *w,
                           const char *w_name, const pf::RowsView &vo) {
    PF_TRY(pf::check_shapes(fn, {vo}));
    PF_TRY(pf::check_nulls(fn, {vo}));
    PF_TRY(pf::check_ctx(fn, ctx));
    PF_TRY(pf::check_weight(fn, ctx, w, w_name));
    return pf::check_fits(fn, ctx, {vo});
}

}  // namespace

extern "C" PF_API pf_status pf_gemm_default_leg(int32_t *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_gemm_default_leg: out is NULL");
        *out = pf::gemm_default_leg();
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_gemm_set_default_leg(int32_t leg) {
    return pf::guard(__func__, [&]() -> pf_status {
        return pf::set_gemm_default_leg(leg);  // checks it (leg_check)
    });
}

extern "C" PF_API pf_status pf_dequantize(pf_context *ctx, const pf_weight *w, const pf_view *out,
                                         int32_t out_f16) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(out_f16 == 0 || out_f16 == 1, "%s: out_f16=%d must be 0 or 1", fn, int(out_f16));
        PF_TRY(weight_arg(fn, w, "w"));
        const size_t elem = out_f16 ? sizeof(uint16_t) : sizeof(float);
        pf::RowsView vo;
        PF_TRY(pf::matrix_arg(fn, out, "out", w->n, w->k, w->k, &vo, elem));
        if (vo.ld != w->k)  // the dequantize launcher writes packed [n][k]
            return pf::fail(PF_STATUS_UNSUPPORTED,
                            "%s: out row stride ld=%lld; rows are written packed (ld 0 or k=%lld)",
                            fn, (long long)vo.ld, (long long)w->k);
        PF_TRY(check_weight_out(fn, ctx, w, "w", vo));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::dequantize(w->data, w->qtype, w->n, w->k, vo.ptr<void>(), out_f16 == 1,
                              ctx->stream);
    });
}

extern "C" PF_API pf_status pf_embed(pf_context *ctx, const pf_weight *table, const int32_t *ids,
                                    int64_t rows, const pf_view *out) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(rows == 0 || ids != nullptr, "%s: ids is NULL (rows=%lld)", fn, (long long)rows);
        PF_TRY(weight_arg(fn, table, "table"));
        for (int64_t r = 0; r < rows; ++r)
            PF_CHECK_ARG(ids[r] >= 0 && ids[r] < table->n,
                         "%s: ids[%lld] = %d is outside [0, n_vocab=%lld)", fn, (long long)r,
                         int(ids[r]), (long long)table->n);
        pf::RowsView vo;
        PF_TRY(pf::matrix_arg(fn, out, "out", rows, table->k, table->k, &vo));
        PF_TRY(check_weight_out(fn, ctx, table, "table", vo));
        if (rows == 0) return PF_STATUS_OK;
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        // The ids travel through the activation scratch (stream-ordered with every user of it).
        PF_TRY(pf::scratch_reserve(ctx, ctx->scratch_f16_x, size_t(rows) * sizeof(int32_t),
                                   "pf_embed: ids"));
        int32_t *dids = static_cast<int32_t *>(ctx->scratch_f16_x.ptr);
        // Pageable source: returns once the ids are staged, so the caller may reuse them.
        PF_CUDA_TRY(cudaMemcpyAsync(dids, ids, size_t(rows) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, ctx->stream));
        return pf::embed_rows(pf::QMatrix{table->data, table->qtype, table->n, table->k}, dids, rows,
                              pf::MatF{vo.ptr(), vo.ld}, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_project(pf_context *ctx, pf_weight *w, const pf_view *x,
                                      const pf_view *y, int64_t rows, int32_t accumulate,
                                      int32_t leg) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_TRY(pf::leg_check(leg, true, fn, "leg"));
        PF_TRY(weight_arg(fn, w, "w"));
        pf::RowsView vx, vy;
        PF_TRY(rows_io_args(fn, w, x, y, "y", rows, w->n, &vx, &vy));
        PF_CHECK_ARG(rows <= kMaxBlasDim && vx.ld <= kMaxBlasDim && vy.ld <= kMaxBlasDim &&
                         w->n <= kMaxBlasDim && w->k <= kMaxBlasDim,
                     "%s: rows=%lld, x ld=%lld, y ld=%lld, n=%lld, k=%lld must fit in int32", fn,
                     (long long)rows, (long long)vx.ld, (long long)vy.ld, (long long)w->n,
                     (long long)w->k);
        // The call's plan: the process default resolved here, then the route (INT8: UNSUPPORTED
        // before device work where the device or k cannot run it).
        const int32_t asked = pf::resolve_default_leg(leg);
        if (asked == PF_GEMM_INT8) PF_TRY(pf::int8_leg_check("project"));
        pf::ProjRoute route;
        PF_TRY(pf::route_of_leg(asked, pf::weight_facts(w), blocks_on(ctx), "project", &route));
        PF_TRY(check_rows_io(fn, ctx, w, vx, vy));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        // The view offsets are applied here: pf::project takes pointers to row 0, column 0.
        return pf::project(pf::proj_env(ctx), route, w, pf::ProjIn::f32(pf::CMatF{vx.ptr(), vx.ld}),
                           pf::MatF{vy.ptr(), vy.ld}, rows, accumulate == 1);
    });
}

extern "C" PF_API pf_status pf_project_f16x(pf_context *ctx, pf_weight *w, const pf_view *x16,
                                           const pf_view *inv, const pf_view *y, int64_t rows,
                                           int32_t accumulate) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_TRY(weight_arg(fn, w, "w"));
        pf::RowsView vx, vi, vy;
        PF_TRY(pf::matrix_arg(fn, x16, "x16", rows, w->k, w->k, &vx, sizeof(uint16_t)));
        PF_TRY(pf::matrix_arg(fn, y, "y", rows, w->n, w->n, &vy));
        if (vx.ld != w->k)  // the GEMM reads x16 as packed [rows][k]
            return pf::fail(PF_STATUS_UNSUPPORTED,
                            "%s: x16 row stride ld=%lld; rows are read packed (ld 0 or k=%lld)",
                            fn, (long long)vx.ld, (long long)w->k);
        PF_CHECK_ARG(rows <= kMaxBlasDim && vy.ld <= kMaxBlasDim && w->n <= kMaxBlasDim &&
                         w->k <= kMaxBlasDim,
                     "%s: rows=%lld, y ld=%lld, n=%lld, k=%lld must fit in int32", fn,
                     (long long)rows, (long long)vy.ld, (long long)w->n, (long long)w->k);
        if (inv) {
            PF_TRY(pf::vector_arg(fn, inv, "inv", rows, &vi));
            PF_TRY(pf::check_shapes(fn, {vx, vi, vy}));
            PF_TRY(pf::check_nulls(fn, {vx, vi, vy}));
        } else {
            PF_TRY(pf::check_shapes(fn, {vx, vy}));
            PF_TRY(pf::check_nulls(fn, {vx, vy}));
        }
        PF_TRY(pf::check_ctx(fn, ctx));
        PF_TRY(pf::check_weight(fn, ctx, w, "w"));
        PF_TRY(pf::check_fits(fn, ctx, {vx, vy}));
        if (inv) PF_TRY(pf::check_fits(fn, ctx, {vi}));
        PF_CHECK_ARG(!pf::views_overlap(vx, vy), "%s: y overlaps x16", fn);
        PF_CHECK_ARG(!inv || !pf::views_overlap(vi, vy), "%s: y overlaps inv", fn);
        pf::ProjRoute route;  // the f16 leg: fp16 rows against its cache or an F16 weight, not slabs
        PF_TRY(pf::route_of_leg(PF_GEMM_F16, pf::weight_facts(w), blocks_on(ctx), fn, &route));
        if (route.weight == pf::WeightForm::F16Slabs)
            return pf::fail(PF_STATUS_UNSUPPORTED,
                            "%s: w (n=%lld k=%lld) has no fp16 copy (pf_weight_cache_f16 first)", fn,
                            (long long)w->n, (long long)w->k);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::project(pf::proj_env(ctx), route, w,
                           pf::ProjIn::f16(vx.ptr<const __half>(), inv ? vi.ptr<const float>() : nullptr),
                           pf::MatF{vy.ptr(), vy.ld}, rows, accumulate == 1);
    });
}

extern "C" PF_API pf_status pf_weight_cache_f16(pf_weight *w) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(w != nullptr, "pf_weight_cache_f16: w is NULL");
        pf::DeviceGuard dg(w->ctx->device);
        PF_TRY(dg.status());
        return pf::weight_cache_f16(w);
    });
}

extern "C" PF_API pf_status pf_weight_drop_f16(pf_weight *w) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(w != nullptr, "pf_weight_drop_f16: w is NULL");
        pf::DeviceGuard dg(w->ctx->device);
        PF_TRY(dg.status());
        return pf::weight_drop_f16(w);
    });
}

extern "C" PF_API pf_status pf_weight_cache_i8(pf_weight *w) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(w != nullptr, "pf_weight_cache_i8: w is NULL");
        pf::DeviceGuard dg(w->ctx->device);
        PF_TRY(dg.status());
        PF_TRY(pf::int8_leg_check("project"));  // Hopper
        pf::ProjRoute route;                     // and k % 16 == 0
        PF_TRY(pf::route_of_leg(PF_GEMM_INT8, pf::weight_facts(w), false, "project", &route));
        return pf::weight_cache_i8(w);
    });
}

extern "C" PF_API pf_status pf_weight_drop_i8(pf_weight *w) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(w != nullptr, "pf_weight_drop_i8: w is NULL");
        pf::DeviceGuard dg(w->ctx->device);
        PF_TRY(dg.status());
        pf::weight_drop_i8(w);
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_weight_copy_f16(pf_context *ctx, const pf_weight *w, const pf_view *out) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(weight_arg(fn, w, "w"));
        pf::RowsView vo;
        PF_TRY(pf::matrix_arg(fn, out, "out", w->n, w->k, w->k, &vo, sizeof(uint16_t)));
        if (vo.ld != w->k)
            return pf::fail(PF_STATUS_UNSUPPORTED,
                            "%s: out row stride ld=%lld; rows are written packed (ld 0 or k=%lld)",
                            fn, (long long)vo.ld, (long long)w->k);
        PF_TRY(check_weight_out(fn, ctx, w, "w", vo));
        PF_CHECK_ARG(w->f16 != nullptr, "%s: w (n=%lld k=%lld) has no fp16 cache", fn,
                     (long long)w->n, (long long)w->k);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        PF_CUDA_TRY(cudaMemcpyAsync(vo.ptr<void>(), w->f16, size_t(w->n) * size_t(w->k) * sizeof(uint16_t),
                                    cudaMemcpyDeviceToDevice, ctx->stream));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_prewarm_report_init(pf_prewarm_report *report, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(report != nullptr, "pf_prewarm_report_init: report is NULL");
        PF_TRY(pf::struct_init(report, struct_size, "pf_prewarm_report_init", "pf_prewarm_report"));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_prewarm_f16(pf_context *ctx, pf_weight *const *weights,
                                          int32_t count, size_t headroom_bytes,
                                          pf_prewarm_report *report) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_prewarm_f16";
        PF_CHECK_ARG(count >= 0, "%s: count=%d < 0", fn, int(count));
        PF_CHECK_ARG(count == 0 || weights != nullptr, "%s: weights is NULL (count=%d)", fn, int(count));
        if (report) PF_TRY(pf::struct_check(report, fn, "report", "pf_prewarm_report_init"));
        for (int32_t i = 0; i < count; ++i)
            PF_CHECK_ARG(weights[i] != nullptr, "%s: weights[%d] is NULL", fn, int(i));
        PF_CHECK_ARG(ctx != nullptr, "%s: ctx is NULL", fn);
        for (int32_t i = 0; i < count; ++i)
            PF_CHECK_ARG(weights[i]->ctx == ctx, "%s: weights[%d] belongs to another context", fn,
                         int(i));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::prewarm_f16(ctx, weights, count, headroom_bytes, pf::prewarm_plan(ctx->tuning), report);
    });
}

// ------------------------------------------------------------------------------ fused kernels

namespace {
pf_status check_fused_weight(const char *fn, const pf_weight *w) {
    PF_CHECK_ARG(w != nullptr, "%s: w is NULL", fn);
    if (!pf::qgemm_supports(w->qtype))
        return pf::fail(PF_STATUS_UNSUPPORTED, "%s: no fused kernel for w of type %s (%d)", fn,
                        pf_qtype_name(w->qtype), int(w->qtype));
    return PF_STATUS_OK;
}
}  // namespace

extern "C" PF_API pf_status pf_qgemm(pf_context *ctx, const pf_weight *w, const pf_view *x,
                                    const pf_view *y, int64_t rows, int32_t accumulate) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_TRY(check_fused_weight(fn, w));
        PF_CHECK_ARG(rows == 1 || w->k % 32 == 0,
                     "%s: k=%lld must be a multiple of 32 for the tiled kernel (rows=%lld)", fn,
                     (long long)w->k, (long long)rows);
        pf::RowsView vx, vy;
        PF_TRY(rows_io_args(fn, w, x, y, "y", rows, w->n, &vx, &vy));
        PF_TRY(check_rows_io(fn, ctx, w, vx, vy));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::qgemm(pf::QMatrix{w->data, w->qtype, w->n, w->k}, pf::CMatF{vx.ptr(), vx.ld},
                         pf::MatF{vy.ptr(), vy.ld}, rows, accumulate == 1, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_qgemm_swiglu(pf_context *ctx, const pf_weight *w, const pf_view *x,
                                           const pf_view *out, int64_t rows) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_TRY(check_fused_weight(fn, w));
        PF_CHECK_ARG(w->n % 2 == 0, "%s: w has n=%lld rows; gate+up needs an even count (2 x n_ff)",
                     fn, (long long)w->n);
        PF_CHECK_ARG(w->k % 32 == 0, "%s: k=%lld must be a multiple of 32", fn, (long long)w->k);
        const int64_t n = w->n / 2;
        pf::RowsView vx, vo;
        PF_TRY(rows_io_args(fn, w, x, out, "out", rows, n, &vx, &vo));
        PF_TRY(check_rows_io(fn, ctx, w, vx, vo));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::qgemm_swiglu(pf::QMatrix{w->data, w->qtype, n, w->k}, pf::CMatF{vx.ptr(), vx.ld},
                                pf::MatF{vo.ptr(), vo.ld}, rows, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_qgemv(pf_context *ctx, const pf_weight *w, const pf_view *x,
                                    const pf_view *y, int32_t accumulate) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_TRY(check_fused_weight(fn, w));
        pf::RowsView vx, vy;
        PF_TRY(pf::vector_arg(fn, x, "x", w->k, &vx));
        PF_TRY(pf::vector_arg(fn, y, "y", w->n, &vy));
        PF_TRY(check_rows_io(fn, ctx, w, vx, vy));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::qgemv(pf::QMatrix{w->data, w->qtype, w->n, w->k}, vx.ptr(), vy.ptr(), accumulate == 1,
                         ctx->stream);
    });
}
