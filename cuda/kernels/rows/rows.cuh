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

#include "base/error.h"
#include "base/mat.h"

namespace pf {
struct F16Out;  // f16_rows.cuh
}

namespace pf {

// The heads of a row: n heads of dim values, head h at column h * stride (stride >= dim: dim for
// qwen3 q/k rows, 2*dim for qwen35's interleaved [q | gate] rows, whose gate halves are untouched).
struct HeadLayout {
    int32_t n = 0;
    int64_t stride = 0;
    int32_t dim = 0;
};

// RMSNorm of each row: y[r, c] = x[r, c] / sqrt(mean_c(x[r, :]^2) + eps) * w[c].
//  x: [rows][ld] (cols used), w: [cols], y: [rows][ld]. y == x (in place, same ld) is allowed;
//  any other overlap of y with x is not. cols >= 1.
pf_status rms_norm_rows(CMatF x, const float *w, MatF y, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream);

// Per-head RMSNorm in place (QK-norm): for each row r and head h, the head vector
// x.row(r)[h*stride + i], i in [0, dim), becomes x / sqrt(mean_i(x^2) + eps) * w[i]. w: [dim].
// Requires x.ld >= (n-1)*stride + dim.
pf_status head_rms_norm_rows(MatF x, int64_t rows, HeadLayout heads, const float *w, float eps,
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
pf_status rope_neox_rows(MatF x, int64_t rows, HeadLayout heads, int32_t rot_dim, int64_t pos0,
                         float base, cudaStream_t stream);
// The same with the position of row 0 read from device memory when the kernel runs (a launch
// that a CUDA graph can replay at any position). The caller keeps 0 <= *pos0_dev <=
// INT64_MAX/2 - rows (the host cannot check it).
pf_status rope_neox_rows_at(MatF x, int64_t rows, HeadLayout heads, int32_t rot_dim,
                            const int64_t *pos0_dev, float base, cudaStream_t stream);

// SwiGLU: out[r, c] = silu(g[r, c]) * u[r, c], silu(x) = x / (1 + exp(-x)).
//  g, u, out: [rows][ld]; out may equal g or u exactly (same ld).
pf_status swiglu_rows(CMatF g, CMatF u, MatF out, int64_t rows, int64_t cols, cudaStream_t stream);

// Residual add: y[r, c] += x[r, c]. y, x: [rows][ld]; must not overlap.
pf_status add_rows(MatF y, CMatF x, int64_t rows, int64_t cols, cudaStream_t stream);

// Sigmoid output gate (qwen35 attention, spec.md §3.1 A8), in place on o:
//  o[r*ldo + h*head_dim + i] *= sigmoid(gate[r*ldgate + h*gate_head_stride + i])
//  for h in [0, n_heads), i in [0, head_dim). For qwen35, gate points at column head_dim of
//  the q-projection output (the gate half of head 0), gate stride = 2*head_dim, gate.ld =
//  2*n_heads*head_dim. sigmoid(x) = 1 / (1 + exp(-x)). `gate` gives the heads' count, stride and
//  dim (o's heads are packed: head h at column h*dim).
pf_status sigmoid_gate_rows(MatF o, CMatF gate, HeadLayout gate_heads, int64_t rows, cudaStream_t stream);

// fp16 producers: the ops above writing the f16 leg's input form of their output instead of
// fp32 (f16_rows.cuh: fp16 rows, power-of-two row scales, the accumulate target's pre-scale),
// for project_f16_rows. Each value is computed as by the fp32 twin, so the fp16 rows and scales
// are bitwise what gemm.cuh's cast makes of the twin's output. out.ld16 >= cols.
pf_status rms_norm_rows_f16(CMatF x, const float *w, const F16Out &out, int64_t rows, int64_t cols,
                            float eps, cudaStream_t stream);
pf_status swiglu_rows_f16(CMatF g, CMatF u, const F16Out &out, int64_t rows, int64_t cols,
                          cudaStream_t stream);
pf_status sigmoid_gate_rows_f16(CMatF o, CMatF gate, HeadLayout gate_heads, const F16Out &out,
                                int64_t rows, cudaStream_t stream);

// Greedy decoding helper: out_ids[r] = argmax_{i < n} x[r * ld + i] for r in [0, rows).
// x: device fp32 [rows][ld], ld >= n, 1 <= n <= INT32_MAX; out_ids: device int32 [rows].
// Ties go to the lowest index. NaN ranks above every number (as numpy.argmax): a row with NaN
// returns its first NaN's index. A row of all -inf returns 0. rows == 0 is a no-op.
pf_status argmax_rows(const float *x, int64_t rows, int64_t n, int64_t ld, int32_t *out_ids,
                      cudaStream_t stream);

// dst[i] = v[i] for i < n, in stream order (kernel arguments: no host staging, no wait): the
// positions and offsets a CUDA graph's launches read from device memory.
pf_status store_i64s(int64_t *dst, const int64_t *v, int64_t n, cudaStream_t stream);
inline pf_status store_i64(int64_t *dst, int64_t v, cudaStream_t stream) { return store_i64s(dst, &v, 1, stream); }

// out.row(j)[c] = x.row(rows[j])[c] for j < n, c < cols (rows: a HOST array of row indices of x;
// the rows the LM head reads for a batch's items). rows == 0 is a no-op.
pf_status gather_rows(CMatF x, const int64_t *rows, int64_t n, MatF out, int64_t cols, cudaStream_t stream);

}  // namespace pf
