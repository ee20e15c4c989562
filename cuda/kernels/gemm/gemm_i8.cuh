// gemm_i8.cuh — the 8-bit leg's arithmetic (issue 31, recipe `int8-g128-w128-mix`,
// docs/int8-recipe.md): rows quantized to int8 in groups of 128 along K with one fp32 scale per
// row and group, and the product of two such operands on Hopper's int8 tensor cores with one
// fp32 promotion per group. Internal host entry points (namespace pf); kernels in gemm_i8.cu.
//
// The form of a quantized matrix (activations X [rows][k] and weights W [n][k] alike):
//   codes  q[r][c]  int8 in [-127, 127], row-major, rows `ldq` bytes apart (ldq >= k, % 16 == 0);
//   scales s[g][r]  fp32, group-major ("transposed": the rows of one group contiguous, `lds`
//                   floats apart, lds >= rows, % 4 == 0), g < groups = ceil(k / 128);
//   value  x[r][c] ~ s[c / 128][r] * q[r][c].
// Quantization of a group of 128 values v (a short last group is padded with zeros):
//   amax = max |v|, s = amax / 127 (fp32, rounded), q = rint(v / s) (fp32 division, rounded;
//   ties to even), q = 0 where s = 0. A group holding a NaN gets s = NaN, one holding an Inf
//   s = Inf (codes 0 in both): the rows' products are then NaN, never silently finite. Bitwise
//   reproducible in NumPy float32 (pyprefill/reference/quant_sim.py quantize_i8_rows_f32).
// Weights take the rank-1 form (recipe int8-g128-w128r-mix, docs/int8-recipe.md): the scale of
// row c in group g is the fp32 product r[c] * b[g][c / 128], with a = amax / 127 of each (row,
// group) as above, r[c] = max over g of a (one factor per row), b = max over the block's 128 rows
// of fp32(a / r) (<= 1; 0 where r = 0): r * b >= a, nothing clips. Codes q = rint(w / (r * b)).
// Product (gemm_i8): Y[r][j] (+)= r[j] * sum_g (sa[g][r] * b[g][j / 128]) * P_g[r][j], P_g the
// exact int32 dot of the 128 codes of group g (|P_g| <= 128 * 127 * 127 < 2^22), promoted to
// fp32 once per group: one FFMA per element and group (a per-(row, group) weight scale would
// need a second multiply: measured 0.88 against 1.00 PF/s, NOTES.md).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "prefill.h"

namespace pf {

constexpr int64_t kI8Group = 128;  // K values per scale (one promotion per group)

inline int64_t i8_groups(int64_t k) { return (k + kI8Group - 1) / kI8Group; }
// Row stride of the codes (bytes) and of the scales (floats) this leg allocates.
inline int64_t i8_code_ld(int64_t k) { return (k + 15) / 16 * 16; }
inline int64_t i8_scale_ld(int64_t rows) { return (rows + 3) / 4 * 4; }
inline size_t i8_codes_bytes(int64_t rows, int64_t k) { return size_t(rows) * size_t(i8_code_ld(k)); }
inline size_t i8_scales_bytes(int64_t rows, int64_t k) {
    return size_t(i8_groups(k)) * size_t(i8_scale_ld(rows)) * sizeof(float);
}
inline int64_t i8_blocks(int64_t rows) { return (rows + kI8Group - 1) / kI8Group; }
inline size_t i8_align(size_t v) { return (v + 255) / 256 * 256; }
// Bytes of a rank-1 weight of n rows: codes, row factors, block factors (each 256-aligned).
inline size_t i8_weight_bytes(int64_t n, int64_t k) {
    return i8_align(i8_codes_bytes(n, k)) + i8_align(size_t(n) * sizeof(float)) +
           i8_align(size_t(i8_groups(k)) * size_t(i8_scale_ld(i8_blocks(n))) * sizeof(float));
}

// A quantized matrix on the device (see above). The rank-1 weight form (r != nullptr) has the
// scale of row c and group g as the fp32 product r[c] * s[g][c / 128]: one factor per row and one
// per block of 128 rows and group (s then has ceil(rows / 128) columns, lds >= that, % 4 == 0).
struct I8Mat {
    int8_t *q = nullptr;
    int64_t ldq = 0;
    float *s = nullptr;
    int64_t lds = 0;
    float *r = nullptr;
};

// x [rows][ldx] fp32 -> out (codes and scales of `rows` x k). ldx >= k; any alignment (float4
// loads where x and ldx allow). Asynchronous on st.
pf_status quantize_i8_rows(const float *x, int64_t ldx, int64_t rows, int64_t k, I8Mat out,
                           cudaStream_t st);

// The same from the f16 leg's input form (f16_rows.cuh): fp16 rows x16 [rows][ldx] times their
// inverse row scales inv [rows] (nullptr: 1).
pf_status quantize_i8_rows_f16(const __half *x16, int64_t ldx, const float *inv, int64_t rows,
                               int64_t k, I8Mat out, cudaStream_t st);

// The rank-1 weight form of w32 [rows][ldw] fp32 (a whole matrix, or a run of whole 128-row
// blocks of one, whose factors are then the matrix's) into out (codes, out.r [rows], out.s = b
// [groups][out.lds >= i8_blocks(rows)]): the per-(row, group) scales into tmp (groups *
// i8_scale_ld(rows) floats), the row and block factors, then the codes. Asynchronous on st.
pf_status quantize_i8_weight_rows(const float *w32, int64_t ldw, int64_t rows, int64_t k, I8Mat out,
                                 float *tmp, cudaStream_t st);

// Y[r][j] (+)= X . W^T over the quantized forms: a [rows][k] (per-(row, group) scales), w [n][k]
// in the rank-1 form; y fp32 [rows][ldy] (columns [n, ldy) untouched). UNSUPPORTED where the
// sm_90a kernel cannot run (gemm_i8_available). Sizes must fit in int32; k % 16 == 0 (the TMA's
// 16-byte row strides). Asynchronous on st.
pf_status gemm_i8(I8Mat a, I8Mat w, int64_t rows, int64_t n, int64_t k, float *y, int64_t ldy,
                  bool accumulate, cudaStream_t st);

// The kernel runs on the current device: an sm_90a build, compute capability 9.0, TMA encoder.
bool gemm_i8_available();

}  // namespace pf
