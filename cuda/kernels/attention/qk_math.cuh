// qk_math.cuh — the per-value arithmetic of the attention layer's q/k preparation: the per-head
// RMSNorm, the NeoX RoPE angle and rotation, and the cache conversion. One definition each,
// called by the separate kernels (head_rms_norm_kernel and rope_neox_kernel in rows.cu,
// kv_write_kernel in attention.cu) and by the fused one (qk_rope.cu): the same inline function
// on the same fp32 inputs gives the same bits, so the fused path is bitwise the unfused one.
//
// What could still break that is contraction: with nvcc's default -fmad=true, NVVM may turn
// a * b + c into an fma, and ptxas may fuse an unrounded PTX mul.f32 into the add.f32 /
// sub.f32 that uses it — a choice made per kernel, not per source expression. So every
// product that feeds a sum here is written with explicit rounding intrinsics (__fmul_rn and
// __fmaf_rn are never merged or split by either compiler). The other operations cannot be
// contracted: IEEE division and sqrt (-prec-div and
// -prec-sqrt are on by default: no --use_fast_math in this build), and the angle in float64,
// whose only unrounded multiplies (in pow and sincos's reduction) feed no add.
// Included by kernel .cu files only.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace pf {

// ------------------------------------------------------------------------------ per-head RMSNorm

// 1 / sqrt(mean of squares + eps) from the sum of squares of n values (warp_sum_squares).
__device__ __forceinline__ float head_norm_inv(float sum_sq, int n, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)n + eps);
}

// One normed value: (x * inv) * w. Two products, so nothing to contract here; __fmul_rn keeps
// the fused kernel from merging the second one into a RoPE sum that uses the value.
__device__ __forceinline__ float head_norm_value(float x, float inv, float w) {
    return __fmul_rn(__fmul_rn(x, inv), w);
}

// ------------------------------------------------------------------------------ NeoX RoPE

// cos and sin of pair i's angle at position pos: theta = pos * base^(-2i / rot), in float64
// (fp32 would lose ~pos * 6e-8 rad to the product's rounding alone), rounded to fp32.
__device__ __forceinline__ void rope_cos_sin(double base, double rot, int i, int64_t pos, float &c,
                                             float &s) {
    const double inv_freq = pow(base, -(2.0 * i) / rot);
    const double phi = (double)pos * inv_freq;
    double sd, cd;
    sincos(phi, &sd, &cd);  // full double range reduction (Payne-Hanek for large phi)
    s = (float)sd;
    c = (float)cd;
}

// The rotated pair (u0, u1) = (x[i], x[i + half]):
//   x[i]        = u0 * c - u1 * s  as fma(u0, c, -(u1 * s))
//   x[i + half] = u0 * s + u1 * c  as fma(u0, s,   u1 * c)   (NVVM's own contraction of it)
__device__ __forceinline__ float rope_lo(float u0, float u1, float c, float s) {
    return __fmaf_rn(u0, c, -__fmul_rn(u1, s));
}
__device__ __forceinline__ float rope_hi(float u0, float u1, float c, float s) {
    return __fmaf_rn(u0, s, __fmul_rn(u1, c));
}

// ------------------------------------------------------------------------------ KV cache values

// fp32 -> fp16, round to nearest even, saturating: |x| > 65504 would round to inf (at 65520 and
// up), and an inf key or value turns into NaN inside the softmax or P.V (inf * 0).
__device__ __forceinline__ __half to_half_sat(float x) {
    if (fabsf(x) > 65504.f) x = copysignf(65504.f, x);  // false for NaN: NaN stays NaN
    return __float2half_rn(x);
}

// A value in the cache's element type: float as is, __half through to_half_sat.
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return to_half_sat(x); }

}  // namespace pf
