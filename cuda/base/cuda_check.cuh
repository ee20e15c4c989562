// cuda_check.cuh — CUDA / cuBLAS error mapping. Included by .cu files only (kernel files get it
// through common.cuh, which adds the launch check PF_LAUNCH_CHECK).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "base/error.h"

namespace pf {
// Maps a CUDA error to a status: allocation failures are OUT_OF_MEMORY (the context stays
// usable), a missing driver/device is NO_DEVICE, the rest CUDA_ERROR. Clears the sticky-free
// error state so that the next call starts clean.
pf_status cuda_fail(cudaError_t e, const char *file, int line, const char *what);
pf_status cublas_fail(cublasStatus_t s, const char *file, int line, const char *what);
}  // namespace pf

#define PF_CUDA_TRY(expr)                                                     \
    do {                                                                      \
        const cudaError_t pf_e_ = (expr);                                     \
        if (pf_e_ != cudaSuccess) return pf::cuda_fail(pf_e_, __FILE__, __LINE__, #expr); \
    } while (0)

#define PF_CUBLAS_TRY(expr)                                                   \
    do {                                                                      \
        const cublasStatus_t pf_b_ = (expr);                                  \
        if (pf_b_ != CUBLAS_STATUS_SUCCESS)                                   \
            return pf::cublas_fail(pf_b_, __FILE__, __LINE__, #expr);         \
    } while (0)
