// common.cuh — what the kernel files share: hardware limits, warp / block reductions in a fixed
// order, warp-per-(row, head) helpers, per-device set-up done once, and the launch check.
// Included by the kernel .cu files only. The CUDA / cuBLAS error mapping (PF_CUDA_TRY,
// PF_CUBLAS_TRY) stays in cuda_check.cuh, which the API layer includes; it is included here.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "base/cuda_check.cuh"

namespace pf {

// ------------------------------------------------------------------ hardware limits

constexpr int kWarpSize = 32;           // threads per warp (every NVIDIA arch)
constexpr unsigned kFullMask = 0xffffffffu;  // all 32 lanes take part in a shuffle
constexpr int64_t kMaxGridX = INT_MAX;  // gridDim.x limit, 2^31 - 1 (sm_30 and later)
constexpr int64_t kMaxGridY = 65535;    // gridDim.y (and .z) limit

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------ reductions
//
// Every reduction here has one fixed order, whatever the data and the launch: that is what
// keeps the row kernels bitwise equal to their per-token twins and runs deterministic. The
// operators take (own value, partner's value) in that order.

struct SumOp {
    static constexpr float kIdentity = 0.0f;
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {  // fmaxf: a NaN operand yields the other one (NaN only when both are NaN)
    static constexpr float kIdentity = -INFINITY;
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly over the 32 lanes, xor offsets 16, 8, 4, 2, 1. Every lane ends with the
// bitwise-same value: at each step a lane combines its partner's partial with its own, and
// a + b == b + a, fmaxf(a, b) == fmaxf(b, a) in IEEE arithmetic.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off >>= 1)
        v = Op()(v, __shfl_xor_sync(kFullMask, v, off));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<SumOp>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<MaxOp>(v); }

// Block-wide reductions (blockDim.x a multiple of 32, <= 1024). Every thread returns the same
// value. First a butterfly within each warp; then the per-warp partials, put in shared `red`
// (>= blockDim.x / 32 floats), are combined in one of two fixed orders:
//  - block_sum / block_max: a second butterfly in every warp over red[lane], the lanes past the
//    last warp padded with Op's identity (0, -inf);
//  - block_sum_serial / block_max_serial<kThreads>: left to right from Op's identity in every
//    thread, for a block of exactly kThreads threads (the order of the attention softmax).
// Both end with __syncthreads(), so `red` may be reused by the next call at once.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float *red) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int n_warps = blockDim.x / kWarpSize;
    v = warp_reduce<Op>(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < n_warps ? red[lane] : Op::kIdentity;
    t = warp_reduce<Op>(t);
    __syncthreads();  // every warp has read red[] before a later call may overwrite it
    return t;
}
__device__ __forceinline__ float block_sum(float v, float *red) {
    return block_reduce<SumOp>(v, red);
}
__device__ __forceinline__ float block_max(float v, float *red) {
    return block_reduce<MaxOp>(v, red);
}

template <class Op, int kThreads>
__device__ __forceinline__ float block_reduce_serial(float v, float *red) {
    static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, one block");
    v = warp_reduce<Op>(v);
    if (threadIdx.x % kWarpSize == 0) red[threadIdx.x / kWarpSize] = v;
    __syncthreads();
    float r = Op::kIdentity;
#pragma unroll
    for (int w = 0; w < kThreads / kWarpSize; ++w) r = Op()(r, red[w]);  // the same in every thread
    __syncthreads();
    return r;
}
template <int kThreads>
__device__ __forceinline__ float block_sum_serial(float v, float *red) {
    return block_reduce_serial<SumOp, kThreads>(v, red);
}
template <int kThreads>
__device__ __forceinline__ float block_max_serial(float v, float *red) {
    return block_reduce_serial<MaxOp, kThreads>(v, red);
}

// ------------------------------------------------------------------ one warp per (row, head)

constexpr int kHeadWarps = 4;  // warp-per-(row, head) kernels: 4 heads per 128-thread block

// This warp's (row, head) among rows x n_heads, warp gw = r * n_heads + h of the grid; false
// past the last one. Whole warps leave together, so the shuffles after it stay full-warp.
__device__ __forceinline__ bool warp_row_head(int64_t rows, int32_t n_heads, int64_t &r,
                                              int64_t &h) {
    const int64_t gw = (int64_t)blockIdx.x * kHeadWarps + threadIdx.x / kWarpSize;
    if (gw >= rows * n_heads) return false;
    r = gw / n_heads;
    h = gw % n_heads;
    return true;
}

// Sum of x[i]^2, i < n, over one warp: lane l accumulates i = l, l + 32, ... in order with fmaf,
// then warp_sum. Every lane returns the same value.
__device__ __forceinline__ float warp_sum_squares(const float *x, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x % kWarpSize; i < n; i += kWarpSize) s = fmaf(x[i], x[i], s);
    return warp_sum(s);
}

// Grid of a warp-per-(row, head) launch over `warps` warps (blocks of kHeadWarps warps).
inline unsigned head_warp_blocks(int64_t warps) { return (unsigned)ceil_div(warps, kHeadWarps); }

// ------------------------------------------------------------------ per-device set-up
//
// Keyed by the current device (the API layer makes the context's device current before any
// launcher runs), queried or set once per device, cached for the process, thread-safe.

// Launch-time choice of a kernel instance: calls f(std::integral_constant<int, N>) for the
// smallest N of Ns with need <= N; false if need exceeds them all (the caller's general kernel
// runs). The register-resident row kernels size their per-thread arrays this way.
template <int... Ns, class F>
bool with_smallest_fit(int64_t need, F &&f) {
    return ((need <= Ns ? (f(std::integral_constant<int, Ns>{}), true) : false) || ...);
}

// Streaming multiprocessors of the current device (cudaDevAttrMultiProcessorCount).
pf_status device_sm_count(int *out);
// Shared memory one block may opt in to on the current device
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on sm_90, 163 KB on sm_80).
pf_status device_smem_optin(int *out);
// Compute capability major of the current device (cudaDevAttrComputeCapabilityMajor).
pf_status device_cc_major(int *out);

// The current device (cudaGetDevice), or -1 (the error cleared) when there is none.
int current_device();
// query()'s value on the current device, computed once per (device, key) and kept; -1 when there
// is no current device. For figures a kernel's launch needs on every call (the int8 GEMM's
// persistent grid).
int per_device_value(const void *key, int (*query)());

// The library's sm_90a kernels (wgmma attention, the warpgroup GDN state kernel, the int8 GEMM)
// can run on `device` (-1: none): an sm_90a build (PF_HAVE_SM90A), compute capability 9.0 exactly
// and the driver's TMA map encoder. Cached per device.
bool sm90a_kernels_available(int device);

// Lets `kernel` take `bytes` of dynamic shared memory on the current device (above 48 KiB a
// kernel must opt in). The attribute persists on the device, so it is set once per (device,
// kernel); later calls return at once. `name` names the kernel in an error.
pf_status set_max_dynamic_smem(const void *kernel, int bytes, const char *name);
template <class Kernel>
pf_status set_max_dynamic_smem(Kernel *kernel, int bytes, const char *name) {
    return set_max_dynamic_smem(reinterpret_cast<const void *>(kernel), bytes, name);
}

// ------------------------------------------------------------------ launch check

// The status and pf_last_error() text of a failed launch: "<file>:<line> launch of <kernel>:
// <CUDA error>", `fmt` and its arguments naming the kernel (and its template instance).
pf_status launch_fail(cudaError_t e, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace pf

// After a kernel launch: launch-configuration errors surface here, not at a later call, and the
// message names the kernel: PF_LAUNCH_CHECK("scan_kernel<%d, %d>", dk, cols).
#define PF_LAUNCH_CHECK(...)                                                        \
    do {                                                                            \
        const cudaError_t pf_l_ = cudaGetLastError();                               \
        if (pf_l_ != cudaSuccess)                                                   \
            return pf::launch_fail(pf_l_, __FILE__, __LINE__, __VA_ARGS__);         \
    } while (0)
