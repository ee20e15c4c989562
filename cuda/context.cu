// context.cu — device selection, accounting, scratch, buffer checks (qtype geometry: qtype.cpp).
#include <climits>
#include <new>

#include "context.h"
#include "cuda_check.cuh"

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

pf_status device_alloc(pf_context *ctx, size_t bytes, void **out, const char *what) {
    *out = nullptr;
    if (bytes == 0) return PF_STATUS_OK;
    const cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        *out = nullptr;
        (void)cudaGetLastError();
        if (e == cudaErrorMemoryAllocation)
            return fail(PF_STATUS_OUT_OF_MEMORY, "%s: cudaMalloc of %zu bytes failed (out of device memory)",
                        what, bytes);
        return cuda_fail(e, __FILE__, __LINE__, what);
    }
    ctx->allocated += bytes;
    if (ctx->flags & PF_CONTEXT_POISON) {
        // Before any use: work queued later on the stream (uploads, kernels) comes after it.
        const cudaError_t m = cudaMemsetAsync(*out, 0xFF, bytes, ctx->stream);
        if (m != cudaSuccess) {
            device_free(ctx, *out, bytes);
            *out = nullptr;
            return cuda_fail(m, __FILE__, __LINE__, what);
        }
    }
    return PF_STATUS_OK;
}

void device_free(pf_context *ctx, void *ptr, size_t bytes) {
    if (!ptr) return;
    (void)cudaFree(ptr);
    ctx->allocated -= bytes;
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
    return PF_STATUS_OK;
}

void f16_release(pf_weight *w) {
    F16Arena *a = w->f16_arena;
    w->f16 = nullptr;
    w->f16_arena = nullptr;
    w->f16_block = nullptr;
    if (!a || --a->refs > 0) return;
    (void)cudaStreamSynchronize(w->ctx->stream);  // no queued GEMM may still read it
    device_free(w->ctx, a->ptr, a->bytes);
    delete a;
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
