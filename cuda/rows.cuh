// rows.cuh — row kernels of the prefill: RMSNorm, per-head RMSNorm (QK-norm), partial NEOX
// RoPE, SwiGLU, residual add, sigmoid output gate. Internal entry points (namespace pf) called
// by the engine and by api_rows.cu.
//
// Common conventions:
//  - Activations are fp32, row-major: row r of a matrix starts at `ptr + r * ld` (ld in
//    elements, >= the row's used width). A row is a token. Pointers may point into a wider
//    buffer (e.g. into the q section of a projection output) — that is what the ld's are for.
//  - rows == 0 is a no-op (returns PF_STATUS_OK without launching).
//  - Sizes are int64_t; offsets inside the kernels are computed in int64 (no n*k overflow).
//  - Each entry checks its scalar arguments (INVALID_ARGUMENT, naming the argument), launches
//    on `stream`, and reports launch errors (PF_LAUNCH_CHECK). Nothing is allocated.
//  - fp32 throughout: sums of squares in fp32 with a fixed reduction order (deterministic run
//    to run); 1/sqrt is computed as 1.0f / sqrtf(.) (IEEE sqrt and division, not rsqrtf).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "error.h"

namespace pf {
struct F16Out;  // f16_rows.cuh
}

namespace pf {

// RMSNorm of each row: y[r, c] = x[r, c] / sqrt(mean_c(x[r, :]^2) + eps) * w[c].
//  x: [rows][ldx] (cols used), w: [cols], y: [rows][ldy]. y == x (in place, ldy == ldx) is
//  allowed; any other overlap of y with x is not. cols >= 1.
pf_status rms_norm_rows(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy,
                        int64_t rows, int64_t cols, float eps, cudaStream_t stream);

// Per-head RMSNorm in place (QK-norm): for each row r and head h in [0, n_heads), the head
// vector x[r*ld + h*head_stride + i], i in [0, head_dim), becomes
// x / sqrt(mean_i(x^2) + eps) * w[i].
//  head_stride >= head_dim: head_dim for qwen3 q/k rows, 2*head_dim for qwen35's interleaved
//  [q | gate] rows (the gate halves are untouched). w: [head_dim].
//  Requires ld >= (n_heads-1)*head_stride + head_dim.
pf_status head_rms_norm_rows(float *x, int64_t ld, int64_t rows, int32_t n_heads,
                             int64_t head_stride, int32_t head_dim, const float *w, float eps,
                             cudaStream_t stream);

// Partial NEOX RoPE in place. Same head addressing as head_rms_norm_rows. Row t has position
// p = pos0 + t. For i in [0, rot_dim/2): phi_i = p * base^(-2i/rot_dim),
//  (a, b) = (x[i], x[i + rot_dim/2]) -> (a cos phi - b sin phi, a sin phi + b cos phi);
//  dims [rot_dim, head_dim) are untouched. rot_dim even, 2 <= rot_dim <= head_dim.
//  Angle precision: phi is computed in float64 (pow and the product p * inv_freq in double,
//  then sincos in double, rounded to fp32 once), so it stays exact to fp32 rounding at any
//  position (p up to 2^31). An fp32 angle (HF, ggml) is off by up to ulp(phi) ~ p * 6e-8 rad,
//  i.e. ~1.6e-2 rad at p = 262144. The rotation itself is fp32.
//  The per-token twin is this entry with rows = 1 and pos0 = p (identical arithmetic).
pf_status rope_neox_rows(float *x, int64_t ld, int64_t rows, int32_t n_heads, int64_t head_stride,
                         int32_t head_dim, int32_t rot_dim, int64_t pos0, float base,
                         cudaStream_t stream);
// The same with the position of row 0 read from device memory when the kernel runs (a launch
// that a CUDA graph can replay at any position). The caller keeps 0 <= *pos0_dev <=
// INT64_MAX/2 - rows (the host cannot check it).
pf_status rope_neox_rows_at(float *x, int64_t ld, int64_t rows, int32_t n_heads, int64_t head_stride,
                            int32_t head_dim, int32_t rot_dim, const int64_t *pos0_dev, float base,
                            cudaStream_t stream);

// SwiGLU: out[r, c] = silu(g[r, c]) * u[r, c], silu(x) = x / (1 + exp(-x)).
//  g: [rows][ldg], u: [rows][ldu], out: [rows][ldo]; out may equal g or u exactly (same ld).
pf_status swiglu_rows(const float *g, int64_t ldg, const float *u, int64_t ldu, float *out,
                      int64_t ldo, int64_t rows, int64_t cols, cudaStream_t stream);

// Residual add: y[r, c] += x[r, c]. y: [rows][ldy], x: [rows][ldx]; must not overlap.
pf_status add_rows(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t rows, int64_t cols,
                   cudaStream_t stream);

// Sigmoid output gate (qwen35 attention, spec.md §3.1 A8), in place on o:
//  o[r*ldo + h*head_dim + i] *= sigmoid(gate[r*ldgate + h*gate_head_stride + i])
//  for h in [0, n_heads), i in [0, head_dim). For qwen35, gate points at column head_dim of
//  the q-projection output (the gate half of head 0), gate_head_stride = 2*head_dim,
//  ldgate = 2*n_heads*head_dim. sigmoid(x) = 1 / (1 + exp(-x)).
pf_status sigmoid_gate_rows(float *o, int64_t ldo, const float *gate, int64_t ldgate,
                            int64_t gate_head_stride, int64_t rows, int32_t n_heads,
                            int32_t head_dim, cudaStream_t stream);

// fp16 producers: the ops above writing the f16 leg's input form of their output instead of
// fp32 (f16_rows.cuh: fp16 rows, power-of-two row scales, the accumulate target's pre-scale),
// for project_f16_rows. Each value is computed as by the fp32 twin, so the fp16 rows and scales
// are bitwise what gemm.cuh's cast makes of the twin's output. out.ld16 >= cols.
pf_status rms_norm_rows_f16(const float *x, int64_t ldx, const float *w, const F16Out &out,
                            int64_t rows, int64_t cols, float eps, cudaStream_t stream);
pf_status swiglu_rows_f16(const float *g, int64_t ldg, const float *u, int64_t ldu,
                          const F16Out &out, int64_t rows, int64_t cols, cudaStream_t stream);
pf_status sigmoid_gate_rows_f16(const float *o, int64_t ldo, const float *gate, int64_t ldgate,
                                int64_t gate_head_stride, const F16Out &out, int64_t rows,
                                int32_t n_heads, int32_t head_dim, cudaStream_t stream);

}  // namespace pf
