// context.cu — device selection, accounting, scratch, qtype geometry, buffer checks.
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

bool qtype_block(int32_t qtype, int64_t *elems, int64_t *bytes) {
    switch (qtype) {
        case PF_QTYPE_F32: *elems = 1; *bytes = 4; return true;
        case PF_QTYPE_F16: *elems = 1; *bytes = 2; return true;
        case PF_QTYPE_BF16: *elems = 1; *bytes = 2; return true;
        case PF_QTYPE_Q4_0: *elems = 32; *bytes = 18; return true;
        case PF_QTYPE_Q8_0: *elems = 32; *bytes = 34; return true;
        case PF_QTYPE_Q4_K: *elems = 256; *bytes = 144; return true;
        case PF_QTYPE_Q5_K: *elems = 256; *bytes = 176; return true;
        case PF_QTYPE_Q6_K: *elems = 256; *bytes = 210; return true;
        case PF_QTYPE_IQ4_XS: *elems = 256; *bytes = 136; return true;
        default: return false;
    }
}

pf_status matrix_bytes(int32_t qtype, int64_t n, int64_t k, size_t *out, const char *what) {
    int64_t be = 0, bb = 0;
    if (!qtype_block(qtype, &be, &bb))
        return fail(PF_STATUS_UNSUPPORTED,
                    "%s: GGML type %d is not supported (supported: F32 0, F16 1, Q4_0 2, Q8_0 8, "
                    "Q4_K 12, Q5_K 13, Q6_K 14, IQ4_XS 23, BF16 30)",
                    what, (int)qtype);
    PF_CHECK_ARG(n > 0 && k > 0, "%s: shape n=%lld k=%lld must be positive", what, (long long)n,
                 (long long)k);
    PF_CHECK_ARG(k % be == 0, "%s: k=%lld is not a multiple of the %s block size %lld", what,
                 (long long)k, pf_qtype_name(qtype), (long long)be);
    const int64_t blocks_per_row = k / be;
    // n * blocks_per_row * bb must not overflow 63 bits.
    PF_CHECK_ARG(blocks_per_row <= INT64_MAX / bb && n <= INT64_MAX / (blocks_per_row * bb),
                 "%s: n=%lld x k=%lld overflows", what, (long long)n, (long long)k);
    *out = (size_t)(n * blocks_per_row * bb);
    return PF_STATUS_OK;
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
