// api_gemm.cu — the C API of the gemm family: dequantization, embedding gather, projections,
// fp16 caches and prewarm, fused kernels on the blocks. Every entry validates all of its
// arguments (scalars first, then the weight, then ctx, then the buffers) before any device
// work, then delegates to the internal entry points on ctx->stream.
#include <climits>

#include "context.h"
#include "cuda_check.cuh"
#include "dequant.cuh"
#include "gemm.cuh"
#include "qgemm.cuh"

namespace {

// Bytes spanned by `rows` rows of `width` elements of `elem` bytes at row stride `ld`:
// ((rows-1)*ld + width) * elem, 0 for rows == 0. False on int64 / size_t overflow.
bool strided_bytes(int64_t rows, int64_t ld, int64_t width, size_t elem, size_t *out) {
    if (rows == 0) {
        *out = 0;
        return true;
    }
    int64_t span = 0;
    if (__builtin_mul_overflow(rows - 1, ld, &span) || __builtin_add_overflow(span, width, &span))
        return false;
    size_t b = 0;
    if (__builtin_mul_overflow(size_t(span), elem, &b)) return false;
    *out = b;
    return true;
}

pf_status check_rows_stride(const char *fn, int64_t rows, const char *ld_name, int64_t ld,
                            const char *width_name, int64_t width, size_t *bytes) {
    PF_CHECK_ARG(ld >= width, "%s: %s=%lld < %s=%lld", fn, ld_name, (long long)ld, width_name,
                 (long long)width);
    PF_CHECK_ARG(strided_bytes(rows, ld, width, sizeof(float), bytes),
                 "%s: rows=%lld x %s=%lld overflows", fn, (long long)rows, ld_name, (long long)ld);
    return PF_STATUS_OK;
}

pf_status check_weight(const char *fn, const char *arg, const pf_weight *w, const pf_context *ctx) {
    PF_CHECK_ARG(ctx != nullptr, "%s: ctx is NULL", fn);
    PF_CHECK_ARG(w->ctx == ctx, "%s: %s belongs to another context", fn, arg);
    return PF_STATUS_OK;
}

// The checks every rows-in, rows-out entry shares: x [rows][ldx] with k columns, out
// [rows][ldo] with n columns (both fp32), w and both buffers of ctx, x and out not overlapping.
pf_status check_rows_io(const char *fn, pf_context *ctx, const pf_weight *w, const pf_buffer *x,
                        int64_t rows, int64_t ldx, const pf_buffer *out, const char *out_name,
                        const char *ldo_name, int64_t ldo, int64_t n) {
    size_t xb = 0, ob = 0;
    PF_TRY(check_rows_stride(fn, rows, "ldx", ldx, "k", w->k, &xb));
    PF_TRY(check_rows_stride(fn, rows, ldo_name, ldo, "n", n, &ob));
    PF_TRY(check_weight(fn, "w", w, ctx));
    PF_TRY(pf::check_buffer(ctx, x, xb, fn, "x"));
    PF_TRY(pf::check_buffer(ctx, out, ob, fn, out_name));
    PF_CHECK_ARG(rows == 0 || x != out, "%s: x and %s are the same buffer (they must not overlap)",
                 fn, out_name);
    return PF_STATUS_OK;
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
        PF_CHECK_ARG(leg == PF_GEMM_DEFAULT || leg == PF_GEMM_AUTO || leg == PF_GEMM_F32 ||
                         leg == PF_GEMM_F16,
                     "pf_gemm_set_default_leg: leg=%d must be PF_GEMM_DEFAULT (env), PF_GEMM_AUTO, "
                     "PF_GEMM_F32 or PF_GEMM_F16",
                     int(leg));
        return pf::set_gemm_default_leg(leg);
    });
}

extern "C" PF_API pf_status pf_dequantize(pf_context *ctx, const pf_weight *w, pf_buffer *out,
                                         int32_t out_f16) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_dequantize";
        PF_CHECK_ARG(out_f16 == 0 || out_f16 == 1, "%s: out_f16=%d must be 0 or 1", fn, int(out_f16));
        PF_CHECK_ARG(w != nullptr, "%s: w is NULL", fn);
        PF_TRY(check_weight(fn, "w", w, ctx));
        size_t bytes = 0;
        PF_CHECK_ARG(!__builtin_mul_overflow(size_t(w->n) * size_t(w->k), out_f16 ? 2u : 4u, &bytes),
                     "%s: n=%lld x k=%lld overflows", fn, (long long)w->n, (long long)w->k);
        PF_TRY(pf::check_buffer(ctx, out, bytes, fn, "out"));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::dequantize(w->data, w->qtype, w->n, w->k, out->ptr, out_f16 == 1, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_embed_rows(pf_context *ctx, const pf_weight *table,
                                         const int32_t *ids, int64_t rows, pf_buffer *out,
                                         int64_t ldo) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_embed_rows";
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(rows == 0 || ids != nullptr, "%s: ids is NULL (rows=%lld)", fn, (long long)rows);
        PF_CHECK_ARG(table != nullptr, "%s: table is NULL", fn);
        for (int64_t r = 0; r < rows; ++r)
            PF_CHECK_ARG(ids[r] >= 0 && ids[r] < table->n,
                         "%s: ids[%lld] = %d is outside [0, n_vocab=%lld)", fn, (long long)r,
                         int(ids[r]), (long long)table->n);
        size_t out_bytes = 0;
        PF_TRY(check_rows_stride(fn, rows, "ldo", ldo, "k", table->k, &out_bytes));
        PF_TRY(check_weight(fn, "table", table, ctx));
        PF_TRY(pf::check_buffer(ctx, out, out_bytes, fn, "out"));
        if (rows == 0) return PF_STATUS_OK;
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        // The ids travel through the activation scratch (stream-ordered with every user of it).
        PF_TRY(pf::scratch_reserve(ctx, ctx->scratch_f16_x, size_t(rows) * sizeof(int32_t),
                                   "pf_embed_rows: ids"));
        int32_t *dids = static_cast<int32_t *>(ctx->scratch_f16_x.ptr);
        // Pageable source: returns once the ids are staged, so the caller may reuse them.
        PF_CUDA_TRY(cudaMemcpyAsync(dids, ids, size_t(rows) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, ctx->stream));
        return pf::embed_rows(table->data, table->qtype, table->n, table->k, dids, rows,
                              static_cast<float *>(out->ptr), ldo, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_project(pf_context *ctx, pf_weight *w, const pf_buffer *x,
                                      int64_t rows, int64_t ldx, pf_buffer *y, int64_t ldy,
                                      int32_t accumulate, int32_t leg) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_project";
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_CHECK_ARG(leg >= PF_GEMM_DEFAULT && leg <= PF_GEMM_INT8,
                     "%s: leg=%d is not a pf_gemm_leg (0..4)", fn, int(leg));
        PF_CHECK_ARG(w != nullptr, "%s: w is NULL", fn);
        PF_CHECK_ARG(rows <= INT_MAX && ldx <= INT_MAX && ldy <= INT_MAX && w->n <= INT_MAX &&
                         w->k <= INT_MAX,
                     "%s: rows=%lld, ldx=%lld, ldy=%lld, n=%lld, k=%lld must fit in int32", fn,
                     (long long)rows, (long long)ldx, (long long)ldy, (long long)w->n,
                     (long long)w->k);
        int32_t run = 0;
        PF_TRY(pf::resolve_gemm_leg(w, leg, &run));  // INT8: UNSUPPORTED before device work
        PF_TRY(check_rows_io(fn, ctx, w, x, rows, ldx, y, "y", "ldy", ldy, w->n));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::project(ctx, w, static_cast<const float *>(x->ptr), rows, ldx,
                           static_cast<float *>(y->ptr), ldy, accumulate == 1, leg);
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
        if (report && report->struct_size != sizeof(pf_prewarm_report))
            return pf::fail(PF_STATUS_ABI_MISMATCH,
                            "%s: report->struct_size=%zu, expected %zu (fill report with "
                            "pf_prewarm_report_init)",
                            fn, report->struct_size, sizeof(pf_prewarm_report));
        for (int32_t i = 0; i < count; ++i)
            PF_CHECK_ARG(weights[i] != nullptr, "%s: weights[%d] is NULL", fn, int(i));
        PF_CHECK_ARG(ctx != nullptr, "%s: ctx is NULL", fn);
        for (int32_t i = 0; i < count; ++i)
            PF_CHECK_ARG(weights[i]->ctx == ctx, "%s: weights[%d] belongs to another context", fn,
                         int(i));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::prewarm_f16(ctx, weights, count, headroom_bytes, report);
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

extern "C" PF_API pf_status pf_qgemm(pf_context *ctx, const pf_weight *w, const pf_buffer *x,
                                    int64_t rows, int64_t ldx, pf_buffer *y, int64_t ldy,
                                    int32_t accumulate) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_qgemm";
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_TRY(check_fused_weight(fn, w));
        PF_CHECK_ARG(rows == 1 || w->k % 32 == 0,
                     "%s: k=%lld must be a multiple of 32 for the tiled kernel (rows=%lld)", fn,
                     (long long)w->k, (long long)rows);
        PF_TRY(check_rows_io(fn, ctx, w, x, rows, ldx, y, "y", "ldy", ldy, w->n));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::qgemm(w->data, w->qtype, w->n, w->k, static_cast<const float *>(x->ptr), rows,
                         ldx, static_cast<float *>(y->ptr), ldy, accumulate == 1, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_qgemm_swiglu(pf_context *ctx, const pf_weight *w,
                                           const pf_buffer *x, int64_t rows, int64_t ldx,
                                           pf_buffer *out, int64_t ldo) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_qgemm_swiglu";
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_TRY(check_fused_weight(fn, w));
        PF_CHECK_ARG(w->n % 2 == 0, "%s: w has n=%lld rows; gate+up needs an even count (2 x n_ff)",
                     fn, (long long)w->n);
        PF_CHECK_ARG(w->k % 32 == 0, "%s: k=%lld must be a multiple of 32", fn, (long long)w->k);
        const int64_t n = w->n / 2;
        PF_TRY(check_rows_io(fn, ctx, w, x, rows, ldx, out, "out", "ldo", ldo, n));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::qgemm_swiglu(w->data, w->qtype, n, w->k, static_cast<const float *>(x->ptr),
                                rows, ldx, static_cast<float *>(out->ptr), ldo, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_qgemv(pf_context *ctx, const pf_weight *w, const pf_buffer *x,
                                    pf_buffer *y, int32_t accumulate) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_qgemv";
        PF_CHECK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d must be 0 or 1", fn,
                     int(accumulate));
        PF_TRY(check_fused_weight(fn, w));
        PF_TRY(check_weight(fn, "w", w, ctx));
        PF_TRY(pf::check_buffer(ctx, x, size_t(w->k) * sizeof(float), fn, "x"));
        PF_TRY(pf::check_buffer(ctx, y, size_t(w->n) * sizeof(float), fn, "y"));
        PF_CHECK_ARG(x != y, "%s: x and y are the same buffer (they must not overlap)", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::qgemv(w->data, w->qtype, w->n, w->k, static_cast<const float *>(x->ptr),
                         static_cast<float *>(y->ptr), accumulate == 1, ctx->stream);
    });
}
