// gemm_q16.cuh — the f16 leg's GEMM on a weight's GGUF blocks (the weight form F16Blocks,
// plan/route.h): the f16 leg's fp16 input rows times the blocks dequantized on the chip to the
// fp16 of the prewarm's cache, fp32 out (gemm_q16_kernel.cuh has the kernel and its design; up to
// 64 rows, gemm_q16_skinny_kernel.cuh's form bound by reading the blocks; up to gemv_rows rows of
// Q4_K / Q5_K / Q6_K, gemm_q16_gemv_kernel.cuh's, the scales on the fp32 sums: the exact weight).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/mat.h"
#include "prefill.h"

namespace pf {

// The GEMV form's limits (gemm_q16_gemv_kernel.cuh's kMaxRows and kMaxParts, checked there): rows
// of X a call (tuning.gemm_blocks_gemv_rows at most), and parts of a fused group in one launch.
constexpr int kQ16GemvMaxRows = 16;
constexpr int kQ16GemvMaxParts = 4;

struct Q16Gemm {
    const void *blocks = nullptr;  // W [n][k] GGUF blocks of qtype, k / block elements per row
    int32_t qtype = 0;
    int64_t n = 0, k = 0;
    const __half *x16 = nullptr;   // [rows][k] fp16, row stride k, 16-byte aligned
    const float *inv = nullptr;    // the rows' inverse scales [rows]; nullptr: none
    int64_t rows = 0;
    MatF y;                        // [rows][y.ld >= n] fp32
    bool accumulate = false;       // y += (else y =) x16 . W^T, before the rows' inverse scales
    int64_t gemv_rows = 0;         // up to this many rows on Q4_K / Q5_K / Q6_K: the GEMV form (the exact weight)
    // A fused group's parts in one launch of the GEMV form (nparts 2..4; then blocks is part 0's
    // and n their sum): part i's blocks and rows, its outputs at the next n_i columns of y. All
    // of qtype and k, each as gemm_q16_gemv_runs accepts.
    int32_t nparts = 0;
    const void *part_blocks[kQ16GemvMaxParts] = {};
    int64_t part_n[kQ16GemvMaxParts] = {};
};

// Whether `rows` rows on these blocks run the GEMV form (gemm_q16_gemv_kernel.cuh: Q4_K, Q5_K, Q6_K
// up to gemv_rows rows, blocks aligned for its loads).
bool gemm_q16_gemv_runs(int32_t qtype, const void *blocks, int64_t k, int64_t rows, int64_t gemv_rows);
// The types it reads: the GGUF block types (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS).
bool gemm_q16_type(int32_t qtype);
// Whether this build and `device` run it (an sm_90a build on compute capability 9.0 with the
// driver's TMA encoder).
bool gemm_q16_available(int device);
// y (+)= x16 . W^T, then each row times its inverse scale: the f16 leg's GEMM and unscale on the
// blocks. UNSUPPORTED where it does not run or for another type; INVALID_ARGUMENT for shapes out
// of range (sizes below 2^31, k a whole number of blocks, y.ld >= n). Asynchronous on `stream`.
pf_status gemm_q16(const Q16Gemm &g, cudaStream_t stream);

}  // namespace pf
