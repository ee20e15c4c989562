// context.cu — device selection, accounting, scratch, buffer checks (qtype geometry: qtype.cpp).
#include <climits>

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
    return PF_STATUS_OK;
}

void device_free(pf_context *ctx, void *ptr, size_t bytes) {
    if (!ptr) return;
    (void)cudaFree(ptr);
    ctx->allocated -= bytes;
}

pf_status scratch_reserve(pf_context *ctx, Scratch &s, size_t bytes, const char *what) {
    if (s.bytes >= bytes) return PF_STATUS_OK;
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
