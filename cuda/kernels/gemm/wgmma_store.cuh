// wgmma_store.cuh — the fp32 stores of a wgmma accumulator's column pairs, shared by the GEMM
// kernels' epilogues (gemm_i8_kernel.cuh, gemm_q16_kernel.cuh): a thread holds columns c and
// c + 1 of a row (the D layout of ptx/wgmma.cuh), stored as one float2 where the row allows it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pf {

// y[c], y[c + 1] of row yr, each only where its column is below n: (accumulate ? y : 0) + v,
// times `scale` when kScaled (the f16 leg's row unscale). vec2: yr + c may be stored as a float2
// (8-byte aligned row and ld).
template <bool kScaled>
__device__ __forceinline__ void store_pair(float *yr, int c, int n, float v0, float v1, bool vec2, bool accumulate,
                                           float scale) {
    if (vec2 && c + 1 < n) {
        float2 *dst = reinterpret_cast<float2 *>(yr + c);
        if (accumulate) {
            const float2 old = *dst;
            v0 += old.x, v1 += old.y;
        }
        if (kScaled) v0 *= scale, v1 *= scale;
        *dst = make_float2(v0, v1);
    } else {
        if (c < n) yr[c] = kScaled ? (accumulate ? yr[c] + v0 : v0) * scale : (accumulate ? yr[c] + v0 : v0);
        if (c + 1 < n)
            yr[c + 1] = kScaled ? (accumulate ? yr[c + 1] + v1 : v1) * scale : (accumulate ? yr[c + 1] + v1 : v1);
    }
}

}  // namespace pf
