// qgemm.cuh — fused projections straight on GGUF blocks (no dequantized copy of W): GEMM,
// GEMM + residual (accumulate), gate+up+SwiGLU, and GEMV for one row. Built for every type
// quant.cuh decodes (Q4_0 and Q8_0 are the ones the engine calls directly). fp32 arithmetic on
// exactly decoded weights (tolerance 1e-5 vs float64). Internal host entry points (namespace
// pf); the C API is in api_gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/mat.h"
#include "prefill.h"

namespace pf {

// True when the fused kernels are built for this GGML type (every supported type).
bool qgemm_supports(int32_t qtype);

// Y[r][j] = (accumulate ? Y[r][j] : 0) + sum_i X[r][i] * W[j][i], r < rows, j < n.
// W: [n][k] GGUF blocks (k a multiple of 32 for the tiled kernels; any multiple of the block size
// for the GEMV). X: fp32 [rows][ld], ld >= k. Y: fp32 [rows][ld], ld >= n; columns [n, ld)
// untouched. X and Y must not overlap. rows == 1 runs the GEMV kernel. rows == 0 is a no-op.
// UNSUPPORTED for unknown types.
pf_status qgemm(const QMatrix &w, CMatF x, MatF y, int64_t rows, bool accumulate, cudaStream_t stream);

// Fused gate + up + SwiGLU: w.blocks is [2 w.n][k] — rows [0, n) the gate, rows [n, 2n) the up
// projection (the two GGUF tensors stacked). out[r][j] = silu(g) * u with
// g = X[r] . W[j], u = X[r] . W[n + j], silu(g) = g / (1 + exp(-g)); out: [rows][ld], ld >= n.
pf_status qgemm_swiglu(const QMatrix &w, CMatF x, MatF out, int64_t rows, cudaStream_t stream);

// GEMV for one row: y[j] = (accumulate ? y[j] : 0) + sum_i x[i] * W[j][i], j < n.
// x: device fp32 [k] (16-byte aligned gets vector loads); y: device fp32 [n]. One warp per
// output row.
pf_status qgemv(const QMatrix &w, const float *x, float *y, bool accumulate, cudaStream_t stream);

}  // namespace pf
