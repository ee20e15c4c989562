// f16_rows.cuh — the f16 leg's input form, written by the kernel that produces a projection's
// input (RMSNorm, SwiGLU, the gated RMSNorm, the attention output gate) in the same pass, so
// that no separate cast pass runs before the GEMM (design.md "Numbers and layouts").
//
// The form (the contract of gemm.cuh's f16 leg, shared with its cast kernel):
//  - x16: [rows][ld16] fp16; row r holds round_to_nearest_fp16(y[r][c] * 2^-e_r);
//  - inv: [rows] fp32, 2^e_r (1 for an unscaled row);
//  - e_r = 0 unless the row's max|y| > kF16RowMax (and finite): then e_r is chosen so that the
//    scaled max stays below 2^kF16SafeExp (fp16 max 65504): the cast never makes Inf, and the
//    scaling by a power of two is exact. Inf/NaN rows stay unscaled and propagate as in fp32;
//  - when the projection accumulates into an fp32 output (the residual stream), the producer
//    also multiplies that output's row by 2^-e_r, so that the GEMM's beta = 1 adds in the
//    scaled domain; project_f16_rows multiplies the row by 2^e_r after the GEMM.
// A producer computes each fp32 value exactly as its fp32 twin does, so x16 and inv are
// bitwise what the cast kernel makes of the twin's output.
#pragma once

#include <cuda_fp16.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "plan/plan.h"  // RowForm
#include "ptx/common.cuh"

namespace pf {

constexpr float kF16RowMax = 32768.0f;  // rows above this are scaled before the fp16 cast
constexpr int kF16SafeExp = 15;         // scaled row max stays below 2^15 (fp16 max 65504)
constexpr int kF16RowThreads = 256;     // one block per row for the producers

// The row scale for a row of max|y| = m (m >= 0 or NaN-free max): scale = 2^-e, inv = 2^e.
__device__ __forceinline__ void f16_row_scale(float m, float *scale, float *inv) {
    *scale = 1.0f;
    *inv = 1.0f;
    if (m > kF16RowMax && m <= FLT_MAX) {  // Inf/NaN rows stay unscaled: they propagate as in f32
        int e2 = 0;
        frexpf(m, &e2);                    // m < 2^e2
        const int e = e2 - kF16SafeExp;    // m * 2^-e < 2^15
        *scale = ldexpf(1.0f, -e);         // powers of two: scaling is exact
        *inv = ldexpf(1.0f, e);
    }
}

// Where a producer writes the f16 form of its output (see the file comment).
struct F16Out {
    __half *x16 = nullptr;  // [rows][ld16]
    int64_t ld16 = 0;
    float *inv = nullptr;   // [rows]
    float *acc = nullptr;   // optional: the fp32 output the projection accumulates into, [rows][ld_acc]
    int64_t ld_acc = 0;
    int64_t n_acc = 0;      // columns of acc to pre-scale
    RowForm form;           // how the producer holds the row (the plan's; every form the same bits)
};

// Producers stage the row's fp32 values in dynamic shared memory when it fits in the default
// 48 KB (f16_stage_bytes): each value is then computed once and read back from shared memory for
// the write, instead of being recomputed from global memory (which doubled the producer's DRAM
// reads once the rows in flight outgrew L2, and made the act16 route slower than the cast:
// docs/notes-archive-2026-12.md, 2026-11-30 run 12). Wider rows (the 27B shape's n_ff) recompute, and so does
// every row of the form PF_ROW_FORM_RECOMPUTE (form.stage false; the tests run every form: the
// same bits).
constexpr size_t kF16StageMaxBytes = 48 * 1024;
inline size_t f16_stage_bytes(int64_t cols, RowForm form, size_t other_bytes = 0) {
    if (!form.stage) return 0;
    const size_t b = size_t(cols) * sizeof(float);
    return b + other_bytes <= kF16StageMaxBytes ? b : 0;
}

// The row's scale and inverse from each thread's partial max |value| (block-wide; NaN-free:
// fmaxf skips NaN elements, in any order the same max).
__device__ __forceinline__ void f16_block_scale(float m, float *red, float *scale, float *inv) {
    f16_row_scale(block_max(m, red), scale, inv);
}

// The end of every producer, for row r: the accumulate target's pre-scale (rows scaled by
// 2^-e) and the inverse scale 2^e.
__device__ __forceinline__ void f16_finish_row(const F16Out &out, int64_t r, float scale, float inv) {
    if (out.acc && scale != 1.0f) {
        float *yr = out.acc + r * out.ld_acc;
        for (int64_t j = threadIdx.x; j < out.n_acc; j += blockDim.x) yr[j] *= scale;
    }
    if (threadIdx.x == 0) out.inv[r] = inv;
}

// The second half of every producer, for row r of a block of threads: the row's max over
// `value(c)` for c < cols, the scale, the fp16 row, the accumulate target's pre-scale and the
// inverse scale. `value` must return the same float for the same c each time. `red`: block_max
// scratch. `stage`: null (value is called twice per element: the row max, then the write) or
// cols floats of shared memory (value is called once; the write reads the staged float, the
// same bits). block_max ends with __syncthreads(), so the staged row is complete before the write.
template <class Value>
__device__ __forceinline__ void f16_write_row(const F16Out &out, int64_t r, int64_t cols,
                                              const Value &value, float *red, float *stage = nullptr) {
    float m = 0.0f;
    if (stage) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = value(c);
            stage[c] = v;
            m = fmaxf(m, fabsf(v));
        }
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(value(c)));
    }
    m = block_max(m, red);  // >= 0: fmaxf skips NaN elements
    float scale, inv;
    f16_row_scale(m, &scale, &inv);
    __half *h = out.x16 + r * out.ld16;
    if (stage && reinterpret_cast<uintptr_t>(h) % 4 == 0) {  // half2 stores of staged pairs
        __half2 *h2 = reinterpret_cast<__half2 *>(h);
        for (int64_t j = threadIdx.x; j < cols / 2; j += blockDim.x)
            h2[j] = __floats2half2_rn(stage[2 * j] * scale, stage[2 * j + 1] * scale);
        if (cols % 2 && threadIdx.x == 0) h[cols - 1] = __float2half_rn(stage[cols - 1] * scale);
    } else if (stage) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) h[c] = __float2half_rn(stage[c] * scale);
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) h[c] = __float2half_rn(value(c) * scale);
    }
    f16_finish_row(out, r, scale, inv);
}

// The register-resident form of the producers (rows.cu's *_reg kernels, form.regs): each thread
// loads every element of the row it owns before using any, so that NPER loads per thread are in
// flight instead of one (device run 23: the staged producers ran at 2.3-3.5x their bandwidth
// time at 512 rows, latency-bound on one dependent load per loop trip). The other forms
// (PF_ROW_FORM_STAGED / _RECOMPUTE) run the staged or recomputing producers instead; the tests
// run every form and compare the bits.

// A register-resident producer's element: one float (scalar ownership) or a float4 of four
// consecutive columns; its max |x| and its fp16 store at unit u of the row (float4: one
// 8-byte store, the row 8-byte aligned).
__device__ __forceinline__ float abs_max(float x) { return fabsf(x); }
__device__ __forceinline__ float abs_max(const float4 &v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}
__device__ __forceinline__ void store_f16(__half *row, int64_t u, float x, float scale) {
    row[u] = __float2half_rn(x * scale);
}
__device__ __forceinline__ void store_f16(__half *row, int64_t u, const float4 &v, float scale) {
    const __half2 lo = __floats2half2_rn(v.x * scale, v.y * scale);
    const __half2 hi = __floats2half2_rn(v.z * scale, v.w * scale);
    reinterpret_cast<uint2 *>(row)[u] =
        make_uint2(*reinterpret_cast<const uint32_t *>(&lo), *reinterpret_cast<const uint32_t *>(&hi));
}

// The second half of a register-resident producer: v[i] is unit u = threadIdx.x + i * blockDim.x
// of the row (a column, or with float4 the columns 4u .. 4u + 3; cols % 4 == 0 then), ignored
// from `units` on. Scalar ownership serves where the fp32 twin's summation order fixes which
// thread reads which column. The same max, scale, fp16 rounding, pre-scale and inverse as
// f16_write_row: the same bits.
template <int NPER, class T>
__device__ __forceinline__ void f16_write_regs(const F16Out &out, int64_t r, int64_t units,
                                               const T (&v)[NPER], float *red) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < NPER; ++i)
        if (threadIdx.x + int64_t(i) * blockDim.x < units) m = fmaxf(m, abs_max(v[i]));
    float scale, inv;
    f16_block_scale(m, red, &scale, &inv);
    __half *h = out.x16 + r * out.ld16;
#pragma unroll
    for (int i = 0; i < NPER; ++i) {
        const int64_t u = threadIdx.x + int64_t(i) * blockDim.x;
        if (u < units) store_f16(h, u, v[i], scale);
    }
    f16_finish_row(out, r, scale, inv);
}

}  // namespace pf
