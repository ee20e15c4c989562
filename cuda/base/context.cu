// context.cu — device selection, accounting, scratch, buffer checks.
#include <algorithm>
#include <climits>
#include <new>

#include "base/context.h"
#include "base/cuda_check.cuh"

namespace pf {

DeviceGuard::DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
        const cudaError_t e = cudaSetDevice(device);
        if (e != cudaSuccess) status_ = cuda_fail(e, __FILE__, __LINE__, "cudaSetDevice");
    }
}

DeviceGuard::~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_)
        (void)cudaSetDevice(previous_);
}

namespace {
// The poison fill of new bytes (PF_CONTEXT_POISON) and the accounting, after an allocation.
pf_status after_alloc(pf_context *ctx, size_t bytes, void **out, const char *what, bool pooled) {
    ctx->allocated += bytes;
    if (ctx->flags & PF_CONTEXT_POISON) {
        // Before any use: work queued later on the stream (uploads, kernels) comes after it.
        const cudaError_t m = cudaMemsetAsync(*out, 0xFF, bytes, ctx->stream);
        if (m != cudaSuccess) {
            if (pooled) device_free_pooled(ctx, *out, bytes);
            else device_free(ctx, *out, bytes);
            *out = nullptr;
            return cuda_fail(m, __FILE__, __LINE__, what);
        }
    }
    return PF_STATUS_OK;
}

// The sequence pool's bytes held but unused (free for the next sequence).
size_t pool_unused(const pf_context *ctx) {
    if (!ctx->seq_pool) return 0;
    uint64_t reserved = 0, used = 0;
    if (cudaMemPoolGetAttribute(ctx->seq_pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
        cudaMemPoolGetAttribute(ctx->seq_pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return reserved > used ? size_t(reserved - used) : 0;
}

// The memory budget (pf_context_options.memory_budget_bytes): OUT_OF_MEMORY when `bytes` more
// would pass it; `pooled`: from the pool, whose unused bytes it may take.
pf_status budget_check(pf_context *ctx, size_t bytes, const char *what, bool pooled) {
    if (!ctx->budget) return PF_STATUS_OK;
    size_t held = ctx->allocated;
    if (!pooled) {  // the pool's unused bytes count against the budget until given back
        size_t unused = pool_unused(ctx);
        if (unused && held + bytes <= ctx->budget && held + unused + bytes > ctx->budget) {
            seq_pool_trim(ctx);
            unused = pool_unused(ctx);
        }
        held += unused;
    }
    if (held + bytes > ctx->budget)
        return fail(PF_STATUS_OUT_OF_MEMORY, "%s: %zu bytes would take the context past its memory budget of %zu "
                    "bytes (%zu held)", what, bytes, ctx->budget, held);
    return PF_STATUS_OK;
}

pf_status alloc_failed(cudaError_t e, size_t bytes, const char *what, const char *how) {
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation)
        return fail(PF_STATUS_OUT_OF_MEMORY, "%s: %s of %zu bytes failed (out of device memory)", what, how, bytes);
    return cuda_fail(e, __FILE__, __LINE__, what);
}
}  // namespace

pf_status device_alloc(pf_context *ctx, size_t bytes, void **out, const char *what) {
    *out = nullptr;
    if (bytes == 0) return PF_STATUS_OK;
    PF_TRY(budget_check(ctx, bytes, what, false));
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaErrorMemoryAllocation && ctx->seq_pool) {  // the pool may hold what is missing
        (void)cudaGetLastError();
        seq_pool_trim(ctx);
        e = cudaMalloc(out, bytes);
    }
    if (e != cudaSuccess) {
        *out = nullptr;
        return alloc_failed(e, bytes, what, "cudaMalloc");
    }
    return after_alloc(ctx, bytes, out, what, false);
}

void device_free(pf_context *ctx, void *ptr, size_t bytes) {
    if (!ptr) return;
    (void)cudaFree(ptr);
    ctx->allocated -= bytes;
}

pf_status device_alloc_pooled(pf_context *ctx, size_t bytes, void **out, const char *what) {
    *out = nullptr;
    if (bytes == 0) return PF_STATUS_OK;
    if (!ctx->seq_pool) {
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = ctx->device;
        cudaMemPool_t pool = nullptr;
        PF_CUDA_TRY(cudaMemPoolCreate(&pool, &props));
        uint64_t keep = UINT64_MAX;  // never give freed bytes back on a synchronize
        const cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        if (e != cudaSuccess) {
            (void)cudaMemPoolDestroy(pool);
            return cuda_fail(e, __FILE__, __LINE__, "cudaMemPoolSetAttribute");
        }
        ctx->seq_pool = pool;
    }
    PF_TRY(budget_check(ctx, bytes, what, true));
    const cudaError_t e = cudaMallocFromPoolAsync(out, bytes, ctx->seq_pool, ctx->stream);
    if (e != cudaSuccess) {
        *out = nullptr;
        return alloc_failed(e, bytes, what, "cudaMallocFromPoolAsync");
    }
    return after_alloc(ctx, bytes, out, what, true);
}

void device_free_pooled(pf_context *ctx, void *ptr, size_t bytes) {
    if (!ptr) return;
    (void)cudaFreeAsync(ptr, ctx->stream);
    ctx->allocated -= bytes;
}

void seq_pool_trim(pf_context *ctx) {
    if (!ctx->seq_pool) return;
    (void)cudaStreamSynchronize(ctx->stream);  // frees queued on the stream reach the pool
    (void)cudaMemPoolTrimTo(ctx->seq_pool, 0);
}

pf_status device_free_bytes(const pf_context *ctx, size_t *free_b, size_t *total_b) {
    PF_CUDA_TRY(cudaMemGetInfo(free_b, total_b));
    *free_b += pool_unused(ctx);  // held for sequences, unused: device_alloc trims it when it needs it
    if (ctx->budget) *free_b = std::min(*free_b, ctx->budget > ctx->allocated ? ctx->budget - ctx->allocated : 0);
    return PF_STATUS_OK;
}

pf_status f16_arena_create(pf_context *ctx, size_t bytes, F16Arena **out, const char *what) {
    *out = nullptr;
    F16Arena *a = new (std::nothrow) F16Arena();
    if (!a) return fail(PF_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", what);
    const pf_status s = device_alloc(ctx, bytes, &a->ptr, what);
    if (s != PF_STATUS_OK) {
        delete a;
        return s;
    }
    a->bytes = bytes;
    *out = a;
    ctx->weight_forms++;  // weights are about to point into it
    return PF_STATUS_OK;
}

void arena_release(pf_context *ctx, F16Arena *a) {
    if (!a) return;
    ctx->weight_forms++;  // a weight has just let go of it
    if (--a->refs > 0) return;
    (void)cudaStreamSynchronize(ctx->stream);  // no queued GEMM may still read it
    device_free(ctx, a->ptr, a->bytes);
    delete a;
}

void f16_release(pf_weight *w) {
    F16Arena *a = w->f16_arena;
    w->f16 = nullptr;
    w->f16_arena = nullptr;
    w->f16_block = nullptr;
    arena_release(w->ctx, a);
}

pf_status scratch_reserve(pf_context *ctx, Scratch &s, size_t bytes, const char *what) {
    if (s.bytes >= bytes) return PF_STATUS_OK;
    if (s.fixed)
        return fail(PF_STATUS_INTERNAL, "%s: %zu bytes needed, the executor's workspace holds %zu (a "
                    "sizing bug: report it)", what, bytes, s.bytes);
    scratch_release(ctx, s);
    void *p = nullptr;
    PF_TRY(device_alloc(ctx, bytes, &p, what));
    s.ptr = p;
    s.bytes = bytes;
    return PF_STATUS_OK;
}

void scratch_release(pf_context *ctx, Scratch &s) {
    device_free(ctx, s.ptr, s.bytes);
    s.ptr = nullptr;
    s.bytes = 0;
}

pf_status check_buffer(const pf_context *ctx, const pf_buffer *b, size_t bytes, const char *fn,
                       const char *arg) {
    PF_CHECK_ARG(b != nullptr, "%s: %s is NULL", fn, arg);
    PF_CHECK_ARG(b->ctx == ctx, "%s: %s belongs to another context", fn, arg);
    PF_CHECK_ARG(b->bytes >= bytes, "%s: %s holds %zu bytes, the operation needs %zu", fn, arg,
                 b->bytes, bytes);
    return PF_STATUS_OK;
}

}  // namespace pf
