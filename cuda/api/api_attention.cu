// api_attention.cu — the attention family's kernel-level C API: KV-cache writes, causal grouped
// attention, argmax. Every entry validates all arguments in the order of api_views.h (scalars
// and shapes, NULL buffers, ctx, ownership and fit, overlaps) before any device work, then calls
// the internal entry on ctx->stream.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "api/api_views.h"
#include "base/context.h"
#include "base/cuda_check.cuh"
#include "kernels/attention/attention.cuh"
#include "kernels/rows/rows.cuh"

namespace {

constexpr int64_t kMaxStride = INT32_MAX;  // cuBLAS leading dimensions are int

const char *kv_dtype_name(int32_t t) { return t == PF_KV_F16 ? "F16" : "F32"; }
size_t kv_elem_bytes(int32_t t) { return t == PF_KV_F16 ? 2 : 4; }

pf_status check_kv_dtype(int32_t kv_dtype, const char *fn) {
    PF_CHECK_ARG(kv_dtype == PF_KV_F16 || kv_dtype == PF_KV_F32,
                 "%s: kv_dtype=%d (PF_KV_F16 = 0 or PF_KV_F32 = 1)", fn, (int)kv_dtype);
    return PF_STATUS_OK;
}

// Rows a cache buffer holds: bytes / (kv_dim * element size).
int64_t cache_capacity(const pf_buffer *b, int64_t kv_dim, int32_t kv_dtype) {
    return int64_t(b->bytes / (size_t(kv_dim) * kv_elem_bytes(kv_dtype)));
}

pf_status check_cache(const pf_context *ctx, const pf_buffer *b, int64_t kv_dim, int32_t kv_dtype,
                      int64_t needed_rows, const char *fn, const char *arg) {
    PF_CHECK_ARG(b != nullptr, "%s: %s is NULL", fn, arg);
    PF_CHECK_ARG(b->ctx == ctx, "%s: %s belongs to another context", fn, arg);
    const int64_t cap = cache_capacity(b, kv_dim, kv_dtype);
    PF_CHECK_ARG(needed_rows <= cap,
                 "%s: positions up to %lld need %lld rows but %s holds %lld rows of %lld %s values "
                 "(%zu bytes)",
                 fn, (long long)needed_rows - 1, (long long)needed_rows, arg, (long long)cap,
                 (long long)kv_dim, kv_dtype_name(kv_dtype), b->bytes);
    return PF_STATUS_OK;
}

// Paged caches: the page table's first n_pages int32 entries, read to the host (a synchronous
// copy on ctx's stream) and checked: each names a page of pools of pool_pages pages; when
// `write_from` >= 0, entries write_from .. n_pages - 1 (the pages a write reaches) are distinct.
pf_status check_page_table(pf_context *ctx, const pf_buffer *table, int64_t n_pages, int64_t pool_pages,
                           int64_t write_from, const char *fn) {
    PF_CHECK_ARG(table != nullptr, "%s: page_table is NULL", fn);
    PF_CHECK_ARG(table->ctx == ctx, "%s: page_table belongs to another context", fn);
    PF_CHECK_ARG(int64_t(table->bytes / sizeof(int32_t)) >= n_pages,
                 "%s: positions up to the call's last need %lld page-table entries but page_table "
                 "holds %zu int32 (%zu bytes)",
                 fn, (long long)n_pages, table->bytes / sizeof(int32_t), table->bytes);
    std::vector<int32_t> ids(static_cast<size_t>(n_pages));
    pf::DeviceGuard dg(ctx->device);
    PF_TRY(dg.status());
    PF_CUDA_TRY(cudaMemcpyAsync(ids.data(), table->ptr, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                ctx->stream));
    PF_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    for (int64_t k = 0; k < n_pages; ++k)
        PF_CHECK_ARG(ids[size_t(k)] >= 0 && ids[size_t(k)] < pool_pages,
                     "%s: page_table[%lld] = %d is not a page of the pools (0..%lld)", fn, (long long)k,
                     (int)ids[size_t(k)], (long long)pool_pages - 1);
    for (int64_t k = std::max<int64_t>(write_from, 0); write_from >= 0 && k < n_pages; ++k)
        for (int64_t k2 = write_from; k2 < k; ++k2)
            PF_CHECK_ARG(ids[size_t(k)] != ids[size_t(k2)],
                         "%s: page_table[%lld] and page_table[%lld] are both page %d: the pages a "
                         "write reaches must be distinct",
                         fn, (long long)k2, (long long)k, (int)ids[size_t(k)]);
    return PF_STATUS_OK;
}

// The K and V pools of paged caches: buffers of ctx, distinct, each at least one page of
// page_rows rows and at most 2^31 - 1 rows; *pages = the whole pages both hold.
pf_status check_pools(const pf_context *ctx, const pf_buffer *k, const pf_buffer *v, int64_t kv_dim,
                      int32_t kv_dtype, int64_t page_rows, const char *fn, const char *k_arg, const char *v_arg,
                      int64_t *pages) {
    *pages = INT64_MAX;
    for (const auto &[b, arg] : {std::pair{k, k_arg}, std::pair{v, v_arg}}) {
        PF_CHECK_ARG(b != nullptr, "%s: %s is NULL", fn, arg);
        PF_CHECK_ARG(b->ctx == ctx, "%s: %s belongs to another context", fn, arg);
        const int64_t cap = cache_capacity(b, kv_dim, kv_dtype);
        PF_CHECK_ARG(cap >= page_rows && cap <= INT32_MAX,
                     "%s: %s holds %lld rows of %lld %s values (%zu bytes): a pool needs at least one "
                     "page of %lld rows and at most 2^31 - 1 rows",
                     fn, arg, (long long)cap, (long long)kv_dim, kv_dtype_name(kv_dtype), b->bytes,
                     (long long)page_rows);
        *pages = std::min(*pages, cap / page_rows);
    }
    PF_CHECK_ARG(k != v, "%s: %s and %s are the same buffer", fn, k_arg, v_arg);
    return PF_STATUS_OK;
}

// Resolved, validated options: everything pf_attention checks before it looks at buffers.
struct resolved_options {
    pf::AttentionArgs args;  // pointers left null
    int64_t kv_dim = 0;
};

pf_status resolve_options(const pf_attention_options *o, const char *fn, resolved_options *out) {
    PF_CHECK_ARG(o != nullptr, "%s: opts is NULL (fill one with pf_attention_options_init)", fn);
    PF_TRY(pf::struct_check(o, fn, "opts", "pf_attention_options_init"));
    PF_CHECK_ARG(o->n_heads >= 1 && o->n_heads <= 4096, "%s: n_heads=%d must be in 1..4096", fn,
                 (int)o->n_heads);
    PF_CHECK_ARG(o->n_kv_heads >= 1 && o->n_kv_heads <= o->n_heads,
                 "%s: n_kv_heads=%d must be in 1..n_heads=%d", fn, (int)o->n_kv_heads,
                 (int)o->n_heads);
    PF_CHECK_ARG(o->n_heads % o->n_kv_heads == 0,
                 "%s: n_heads=%d is not a multiple of n_kv_heads=%d (grouped GQA)", fn,
                 (int)o->n_heads, (int)o->n_kv_heads);
    PF_CHECK_ARG(o->head_dim >= 2 && o->head_dim <= 4096 && o->head_dim % 2 == 0,
                 "%s: head_dim=%d must be even and in 2..4096", fn, (int)o->head_dim);
    PF_TRY(check_kv_dtype(o->kv_dtype, fn));
    PF_CHECK_ARG(o->path == PF_ATTN_AUTO || o->path == PF_ATTN_CUBLAS || o->path == PF_ATTN_FLASH,
                 "%s: path=%d (PF_ATTN_AUTO 0, PF_ATTN_CUBLAS 1, PF_ATTN_FLASH 2)", fn, (int)o->path);
    PF_CHECK_ARG(o->kernel == PF_ATTN_KERNEL_AUTO || o->kernel == PF_ATTN_KERNEL_MMA ||
                     o->kernel == PF_ATTN_KERNEL_WGMMA,
                 "%s: kernel=%d (PF_ATTN_KERNEL_AUTO 0, PF_ATTN_KERNEL_MMA 1, PF_ATTN_KERNEL_WGMMA 2)",
                 fn, (int)o->kernel);
    PF_CHECK_ARG(o->position_on_device == 0 || o->position_on_device == 1,
                 "%s: position_on_device=%d must be 0 or 1", fn, (int)o->position_on_device);
    PF_CHECK_ARG(o->rows >= 0, "%s: rows=%lld must be >= 0", fn, (long long)o->rows);
    PF_CHECK_ARG(o->pos0 >= 0, "%s: pos0=%lld must be >= 0", fn, (long long)o->pos0);
    PF_CHECK_ARG(o->rows <= INT32_MAX && o->pos0 <= INT32_MAX - o->rows,
                 "%s: pos0=%lld + rows=%lld exceeds 2^31 - 1 positions", fn, (long long)o->pos0,
                 (long long)o->rows);
    PF_CHECK_ARG(std::isfinite(o->scale) && o->scale >= 0.f,
                 "%s: scale=%g must be finite and >= 0 (0 = 1/sqrt(head_dim))", fn, (double)o->scale);
    PF_CHECK_ARG(o->rows_per_pass >= 0, "%s: rows_per_pass=%lld must be >= 0", fn,
                 (long long)o->rows_per_pass);
    PF_CHECK_ARG(o->page_rows == 0 ||
                     (o->page_rows > 0 && o->page_rows <= INT32_MAX && o->page_rows % pf::kKvPageGranule == 0),
                 "%s: page_rows=%lld must be 0 (contiguous caches) or a positive multiple of %d", fn,
                 (long long)o->page_rows, pf::kKvPageGranule);

    const int64_t H = o->n_heads, D = o->head_dim;
    const int64_t qhs = o->q_head_stride ? o->q_head_stride : D;
    PF_CHECK_ARG(qhs >= D && qhs <= kMaxStride,
                 "%s: q_head_stride=%lld must be >= head_dim=%lld (and <= 2^31 - 1)", fn,
                 (long long)o->q_head_stride, (long long)D);
    const int64_t q_width = (H - 1) * qhs + D;  // floats of one q row that are read
    const int64_t ldq = o->q_row_stride ? o->q_row_stride : H * qhs;
    PF_CHECK_ARG(ldq >= q_width && ldq <= kMaxStride,
                 "%s: q_row_stride=%lld must be >= (n_heads-1)*q_head_stride + head_dim = %lld "
                 "(and <= 2^31 - 1)",
                 fn, (long long)o->q_row_stride, (long long)q_width);
    const int64_t ldo = o->out_row_stride ? o->out_row_stride : H * D;
    PF_CHECK_ARG(ldo >= H * D && ldo <= kMaxStride,
                 "%s: out_row_stride=%lld must be >= n_heads*head_dim = %lld (and <= 2^31 - 1)", fn,
                 (long long)o->out_row_stride, (long long)(H * D));

    pf::AttentionArgs &a = out->args;
    a = pf::AttentionArgs{};
    a.ldq = ldq;
    a.q_head_stride = qhs;
    a.kv_dtype = o->kv_dtype;
    a.ldo = ldo;
    a.n_heads = o->n_heads;
    a.n_kv_heads = o->n_kv_heads;
    a.head_dim = o->head_dim;
    a.rows = o->rows;
    a.pos0 = o->pos0;
    a.scale = o->scale > 0.f ? o->scale : float(1.0 / std::sqrt(double(D)));
    a.path = o->path;
    a.kernel = o->kernel;
    a.rows_per_pass = o->rows_per_pass;
    a.scores_budget_bytes = o->scores_budget_bytes;
    // Buffers come from cudaMalloc (256-byte aligned): plan as if the caches were aligned (and,
    // paged, as if the table were there: the cuBLAS path's workspace counts the gathered rows).
    a.k_cache = a.v_cache = reinterpret_cast<const void *>(uintptr_t(256));
    a.pages.page_rows = int32_t(o->page_rows);
    if (o->page_rows > 0) a.pages.table = reinterpret_cast<const int32_t *>(uintptr_t(256));
    if (o->path == PF_ATTN_FLASH && !pf::attention_flash_supported(a))
        return pf::fail(PF_STATUS_UNSUPPORTED,
                        "%s: path=PF_ATTN_FLASH needs an F16 cache and head_dim 128 or 256 (got "
                        "kv_dtype=%s, head_dim=%d); use PF_ATTN_CUBLAS or PF_ATTN_AUTO",
                        fn, kv_dtype_name(o->kv_dtype), (int)o->head_dim);
    if (pf::attention_resolved_path(a) == PF_ATTN_CUBLAS) {
        const int64_t rpp = pf::attention_rows_per_pass(a);
        const size_t bytes = pf::attention_workspace_bytes(a, rpp);
        PF_CHECK_ARG(bytes <= (size_t(1) << 46),
                     "%s: one pass of %lld rows over %lld keys needs %zu bytes of workspace", fn,
                     (long long)rpp, (long long)(o->pos0 + o->rows), bytes);
    }
    a.k_cache = a.v_cache = nullptr;
    a.pages.table = nullptr;
    out->kv_dim = int64_t(o->n_kv_heads) * D;
    return PF_STATUS_OK;
}

}  // namespace

extern "C" PF_API pf_status pf_attention_options_init(pf_attention_options *opts, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(opts != nullptr, "pf_attention_options_init: opts is NULL");
        PF_TRY(pf::struct_init(opts, struct_size, "pf_attention_options_init", "pf_attention_options"));
        opts->kv_dtype = PF_KV_F16;
        opts->path = PF_ATTN_AUTO;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_attention_plan(const pf_attention_options *opts, int32_t *out_path,
                                             int64_t *out_rows_per_pass,
                                             size_t *out_workspace_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        resolved_options r;
        PF_TRY(resolve_options(opts, "pf_attention_plan", &r));
        r.args.k_cache = r.args.v_cache = reinterpret_cast<const void *>(uintptr_t(256));
        if (r.args.pages.page_rows > 0) r.args.pages.table = reinterpret_cast<const int32_t *>(uintptr_t(256));
        const int32_t path = pf::attention_resolved_path(r.args);
        const int64_t rpp = path == PF_ATTN_CUBLAS ? pf::attention_rows_per_pass(r.args) : 0;
        if (out_path) *out_path = path;
        if (out_rows_per_pass) *out_rows_per_pass = rpp;
        if (out_workspace_bytes)
            *out_workspace_bytes = path == PF_ATTN_CUBLAS ? pf::attention_workspace_bytes(r.args, rpp) : 0;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_kv_write_args_init(pf_kv_write_args *args, size_t struct_size) {
    return pf::args_init(args, struct_size, __func__, "pf_kv_write_args",
                         [](pf_kv_write_args &a) { a.kv_dtype = PF_KV_F16; });
}

extern "C" PF_API pf_status pf_kv_write(pf_context *ctx, const pf_kv_write_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_kv_write_args_init"));
        const pf_kv_write_args &a = *args;
        const int64_t kv_dim = a.kv_dim, rows = a.rows, pos0 = a.pos0;
        PF_CHECK_ARG(kv_dim >= 1 && kv_dim <= kMaxStride, "%s: kv_dim=%lld must be in 1..2^31-1",
                     fn, (long long)kv_dim);
        PF_CHECK_ARG(rows >= 0 && rows <= INT32_MAX, "%s: rows=%lld must be in 0..2^31-1", fn,
                     (long long)rows);
        PF_CHECK_ARG(pos0 >= 0 && pos0 <= INT32_MAX - rows,
                     "%s: pos0=%lld must be >= 0 and pos0 + rows < 2^31", fn, (long long)pos0);
        const pf::RowsView vk = pf::matrix_view(a.k, "k", rows, kv_dim, kv_dim),
                           vv = pf::matrix_view(a.v, "v", rows, kv_dim, kv_dim);
        PF_CHECK_ARG(vk.ld <= kMaxStride && vv.ld <= kMaxStride,
                     "%s: k ld=%lld, v ld=%lld must be at most 2^31 - 1", fn, (long long)vk.ld,
                     (long long)vv.ld);
        PF_TRY(check_kv_dtype(a.kv_dtype, fn));
        const bool paged = a.page_table != nullptr;
        PF_CHECK_ARG(paged ? a.page_rows > 0 && a.page_rows <= INT32_MAX && a.page_rows % pf::kKvPageGranule == 0
                           : a.page_rows == 0,
                     "%s: page_rows=%lld must be a positive multiple of %d with a page_table, 0 without", fn,
                     (long long)a.page_rows, pf::kKvPageGranule);
        PF_TRY(pf::check_shapes(fn, {vk, vv}));
        PF_TRY(pf::check_nulls(fn, {vk, vv}));
        PF_TRY(pf::check_ctx(fn, ctx));
        PF_TRY(pf::check_fits(fn, ctx, {vk, vv}));
        int64_t pool_pages = 0;
        if (paged) {
            PF_TRY(check_pools(ctx, a.k_cache, a.v_cache, kv_dim, a.kv_dtype, a.page_rows, fn, "k_cache", "v_cache",
                               &pool_pages));
        } else {
            PF_TRY(check_cache(ctx, a.k_cache, kv_dim, a.kv_dtype, pos0 + rows, fn, "k_cache"));
            PF_TRY(check_cache(ctx, a.v_cache, kv_dim, a.kv_dtype, pos0 + rows, fn, "v_cache"));
        }
        PF_CHECK_ARG(a.k_cache != a.v_cache, "%s: k_cache and v_cache are the same buffer", fn);
        PF_CHECK_ARG(vk.buf != a.k_cache && vk.buf != a.v_cache && vv.buf != a.k_cache &&
                         vv.buf != a.v_cache,
                     "%s: k and v must not be cache buffers (write the fp32 cache with a "
                     "projection's strided output instead)",
                     fn);
        PF_CHECK_ARG(!paged || (a.page_table != a.k_cache && a.page_table != a.v_cache && a.page_table != vk.buf &&
                                a.page_table != vv.buf),
                     "%s: page_table must be a buffer of its own", fn);
        if (rows == 0) return PF_STATUS_OK;
        pf::KvCache cache{a.k_cache->ptr, a.v_cache->ptr, a.kv_dtype};
        if (paged) {
            const int64_t P = a.page_rows;
            PF_TRY(check_page_table(ctx, a.page_table, (pos0 + rows + P - 1) / P, pool_pages, pos0 / P, fn));
            cache.pages = pf::KvPages{static_cast<const int32_t *>(a.page_table->ptr), int32_t(P)};
        }
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::kv_write(vk.cmat(), vv.cmat(), rows, kv_dim, cache, pos0, ctx->stream);
    });
}

namespace {

// pf_attention and pf_attention_paged after their options: the buffers' checks, then the call.
pf_status run_attention(pf_context *ctx, const pf_attention_options *opts, resolved_options &r,
                        const pf_buffer *q, const pf_buffer *k_cache, const pf_buffer *v_cache,
                        const pf_buffer *page_table, pf_buffer *out, const char *fn) {
    pf::AttentionArgs &a = r.args;
    const bool paged = a.pages.page_rows > 0;
    // q and out are whole buffers (offset 0) with the options' strides.
    const int64_t H = a.n_heads, D = a.head_dim;
    const int64_t q_width = (H - 1) * a.q_head_stride + D;
    const pf::RowsView vq{q, 0, a.ldq, a.rows, q_width, sizeof(float), "q"},
        vo{out, 0, a.ldo, a.rows, H * D, sizeof(float), "out"};
    PF_TRY(pf::check_shapes(fn, {vq, vo}));
    PF_TRY(pf::check_ctx(fn, ctx));
    PF_TRY(pf::check_fits(fn, ctx, {vq, vo}));
    int64_t pool_pages = 0;
    if (paged) {
        PF_TRY(check_pools(ctx, k_cache, v_cache, r.kv_dim, a.kv_dtype, a.pages.page_rows, fn, "k_pool", "v_pool",
                           &pool_pages));
        PF_CHECK_ARG(page_table != out, "%s: out must be a buffer distinct from page_table", fn);
    } else {
        PF_TRY(check_cache(ctx, k_cache, r.kv_dim, a.kv_dtype, a.pos0 + a.rows, fn, "k_cache"));
        PF_TRY(check_cache(ctx, v_cache, r.kv_dim, a.kv_dtype, a.pos0 + a.rows, fn, "v_cache"));
        PF_CHECK_ARG(k_cache != v_cache, "%s: k_cache and v_cache are the same buffer", fn);
    }
    PF_CHECK_ARG(out != q && out != k_cache && out != v_cache,
                 "%s: out must be a buffer distinct from q, k_cache and v_cache", fn);
    if (a.rows == 0) return PF_STATUS_OK;
    if (paged) {
        PF_TRY(check_page_table(ctx, page_table, (a.pos0 + a.rows + a.pages.page_rows - 1) / a.pages.page_rows,
                                pool_pages, -1, fn));
        a.pages.table = static_cast<const int32_t *>(page_table->ptr);
        a.kv_capacity = pool_pages * a.pages.page_rows;  // the wgmma kernel's maps span the pools
    }
    a.q = static_cast<const float *>(q->ptr);
    a.k_cache = k_cache->ptr;
    a.v_cache = v_cache->ptr;
    a.o = static_cast<float *>(out->ptr);
    pf::DeviceGuard dg(ctx->device);
    PF_TRY(dg.status());
    // The flash kernel: the options', else the context's tuning, else wgmma where it runs.
    if (a.kernel == PF_ATTN_KERNEL_AUTO) a.kernel = ctx->tuning.attn_kernel;
    if (opts->position_on_device == 1 && pf::attention_resolved_path(a) == PF_ATTN_FLASH) {
        // Test hook: the session's form of the flash launch (position read on the device,
        // TMA maps over the caches' whole capacity), staged in the context's attention
        // scratch, which the flash path does not otherwise use.
        PF_TRY(pf::scratch_reserve(ctx, ctx->scratch_attn, sizeof(int64_t), "attention position"));
        int64_t *pos_dev = static_cast<int64_t *>(ctx->scratch_attn.ptr);
        PF_TRY(pf::store_i64(pos_dev, a.pos0, ctx->stream));
        a.pos0_dev = pos_dev;
        if (!paged)
            a.kv_capacity = std::min(cache_capacity(k_cache, r.kv_dim, a.kv_dtype),
                                     cache_capacity(v_cache, r.kv_dim, a.kv_dtype));
    }
    return pf::attention(ctx, a);
}

}  // namespace

extern "C" PF_API pf_status pf_attention(pf_context *ctx, const pf_attention_options *opts,
                                        const pf_buffer *q, const pf_buffer *k_cache,
                                        const pf_buffer *v_cache, pf_buffer *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_attention";
        resolved_options r;
        PF_TRY(resolve_options(opts, fn, &r));
        PF_CHECK_ARG(opts->page_rows == 0, "%s: opts->page_rows=%lld: paged caches go to pf_attention_paged", fn,
                     (long long)opts->page_rows);
        return run_attention(ctx, opts, r, q, k_cache, v_cache, nullptr, out, fn);
    });
}

extern "C" PF_API pf_status pf_attention_paged(pf_context *ctx, const pf_attention_options *opts,
                                              const pf_buffer *q, const pf_buffer *k_pool,
                                              const pf_buffer *v_pool, const pf_buffer *page_table,
                                              pf_buffer *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_attention_paged";
        resolved_options r;
        PF_TRY(resolve_options(opts, fn, &r));
        PF_CHECK_ARG(opts->page_rows > 0, "%s: opts->page_rows=0: set the pools' page rows (contiguous caches "
                     "go to pf_attention)", fn);
        return run_attention(ctx, opts, r, q, k_pool, v_pool, page_table, out, fn);
    });
}

extern "C" PF_API pf_status pf_argmax(pf_context *ctx, const pf_view *x, const pf_view *out_ids,
                                     int64_t rows, int64_t n) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0 && rows <= INT32_MAX, "%s: rows=%lld must be in 0..2^31-1", fn,
                     (long long)rows);
        PF_CHECK_ARG(n >= 1 && n <= INT32_MAX, "%s: n=%lld must be in 1..2^31-1", fn, (long long)n);
        pf::RowsView vx, vo;
        PF_TRY(pf::matrix_arg(fn, x, "x", rows, n, n, &vx));
        PF_TRY(pf::vector_arg(fn, out_ids, "out_ids", rows, &vo, sizeof(int32_t)));
        PF_CHECK_ARG(vx.ld >= n && vx.ld <= kMaxStride,
                     "%s: x ld=%lld must be >= n=%lld (and <= 2^31 - 1)", fn, (long long)vx.ld,
                     (long long)n);
        PF_TRY(pf::check_views(fn, ctx, {vx, vo}));
        PF_CHECK_ARG(!pf::views_overlap(vx, vo), "%s: out_ids overlaps x", fn);
        if (rows == 0) return PF_STATUS_OK;
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::argmax_rows(vx.ptr(), rows, n, vx.ld, vo.ptr<int32_t>(), ctx->stream);
    });
}
