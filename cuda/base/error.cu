// error.cu — CUDA and cuBLAS errors mapped to statuses (pf_last_error itself: error.cpp).
#include <cstring>

#include "base/cuda_check.cuh"
#include "base/error.h"

namespace pf {

pf_status cuda_fail(cudaError_t e, const char *file, int line, const char *what) {
    (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    pf_status s = PF_STATUS_CUDA_ERROR;
    if (e == cudaErrorMemoryAllocation) s = PF_STATUS_OUT_OF_MEMORY;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
        s = PF_STATUS_NO_DEVICE;
    const char *base = strrchr(file, '/');
    return fail(s, "%s:%d %s: %s (%s)", base ? base + 1 : file, line, what, cudaGetErrorString(e),
                cudaGetErrorName(e));
}

pf_status cublas_fail(cublasStatus_t st, const char *file, int line, const char *what) {
    (void)cudaGetLastError();
    const char *base = strrchr(file, '/');
    const pf_status s =
        st == CUBLAS_STATUS_ALLOC_FAILED ? PF_STATUS_OUT_OF_MEMORY : PF_STATUS_CUBLAS_ERROR;
    return fail(s, "%s:%d %s: %s", base ? base + 1 : file, line, what, cublasGetStatusString(st));
}

}  // namespace pf
