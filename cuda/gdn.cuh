// gdn.cuh — Gated DeltaNet kernels (spec.md §3.2, G2-G8): causal conv1d + SiLU over a chunk,
// per-head L2 norm, gates, gated RMSNorm, and the delta-rule recurrence with the state on chip.
// Internal entry points (namespace pf) called by the engine and by api_gdn.cu.
//
// Conventions (as rows.cuh): fp32 row-major [rows][ld] with explicit row strides in elements;
// rows == 0 is a no-op; scalar arguments are checked first (INVALID_ARGUMENT); launch errors are
// reported; nothing is allocated.
//
// Per-token twins. Every row kernel here is bitwise equal to `rows` launches of its per-token
// twin over the same rows (pointers advanced by one row each time, state carried): the twin
// is the same entry called with rows = 1 (the *_token inline wrappers below name it for the
// decode path). That holds by construction: each kernel computes a row's outputs with the same
// operations in the same order whatever `rows` is (no reduction spans rows, no tile size
// changes an operation), and the tests check it with np.array_equal.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "error.h"

namespace pf {
struct F16Out;  // f16_rows.cuh
}

namespace pf {

constexpr int kGdnMaxConvKernel = 8;  // conv kernel sizes Kc in [2, 8] are compiled (models: 4)

// G3: causal depthwise conv1d + SiLU over a chunk, advancing the window.
//  m:      [rows][ldm] pre-conv input (conv_dim columns used), read only
//  window: [kc-1][conv_dim] contiguous fp32, oldest row first; read, then replaced in place by
//          the last kc-1 rows of concat(window, m) (for rows < kc-1 part of the old window stays)
//  weight: [conv_dim][kc] (ssm_conv1d, NumPy (conv_dim, Kc)); tap kc-1 multiplies the current
//          token: c[t, ch] = sum_{i=0}^{kc-1} X[t+i, ch] * weight[ch, i], X = concat(window, m),
//          accumulated in that order (i = 0 first) with fmaf.
//  u:      [rows][ldu] = silu(c). u must not overlap m, window or weight.
//  Race freedom: threads own (channel, row chunk); the old window of a channel is read only by
//  the thread of that channel's first chunk, which also writes the new window after its reads.
pf_status gdn_conv1d_rows(const float *m, int64_t ldm, float *window, const float *weight,
                          float *u, int64_t ldu, int64_t rows, int64_t conv_dim, int32_t kc,
                          cudaStream_t stream);

// G5: per-head L2 norm in place, with a scale: for each row r and head h in [0, n_heads),
//  x_h <- x_h * ((1 / sqrt(sum_i x_h[i]^2 + eps)) * scale), head h at x + r*ld + h*head_stride.
//  This is HF's formula (x * rsqrt(sum x^2 + eps), eps = 1e-6); llama.cpp uses
//  x / max(||x||, eps), which differs by ~eps / (2 ||x||^2) relative (spec.md §0). scale = 1 for
//  k, 1/sqrt(dk) for q (applied after the normalisation, spec.md G5).
//  Sum of squares: lane l of one warp sums elements l, l+32, ... in order, then a fixed
//  butterfly over the 32 lanes.
pf_status gdn_l2norm_rows(float *x, int64_t ld, int64_t rows, int32_t n_heads,
                          int64_t head_stride, int32_t head_dim, float eps, float scale,
                          cudaStream_t stream);

// G3 + G5 in one pass (the session's path; env PREFILL_FUSE_CONVNORM=0 runs the three
// launches instead): gdn_conv1d_rows(m, ldm, window, weight, u, ldu, rows, conv_dim, kc), then
// gdn_l2norm_rows on the n_k_heads q heads at column 0 of u (scale q_scale) and on the
// n_k_heads k heads at column n_k_heads*dk (scale 1), each head normalised before it is
// stored; the value part is stored as the conv leaves it. Bitwise those launches' u and window:
// one warp per head with lane l owning elements l + 32 j, the l2norm's lanes and order.
// dk = 128 (gdn_conv1d_l2norm_supported), conv_dim >= 2 * n_k_heads * dk; the rest as the two.
bool gdn_conv1d_l2norm_supported(int32_t dk, int32_t kc);
pf_status gdn_conv1d_l2norm_rows(const float *m, int64_t ldm, float *window, const float *weight,
                                 float *u, int64_t ldu, int64_t rows, int64_t conv_dim, int32_t kc,
                                 int32_t n_k_heads, int32_t dk, float eps, float q_scale,
                                 cudaStream_t stream);

// G2: gates. For r < rows, j < n_v_heads:
//  beta[r, j] = sigmoid(b[r, j]) = 1 / (1 + exp(-b));
//  g[r, j]    = ssm_a[j] * softplus(alpha[r, j] + dt_bias[j]), softplus(x) = x for x > 20,
//               else log1p(exp(x)).
//  b: [rows][ldb], alpha: [rows][ld_alpha], ssm_a, dt_bias: [n_v_heads],
//  beta: [rows][ld_beta], g: [rows][ld_g]. Outputs must not overlap the inputs.
pf_status gdn_gates_rows(const float *b, int64_t ldb, const float *alpha, int64_t ld_alpha,
                         const float *ssm_a, const float *dt_bias, float *beta, int64_t ld_beta,
                         float *g, int64_t ld_g, int64_t rows, int32_t n_v_heads,
                         cudaStream_t stream);

// G8: gated RMSNorm per value head: for r < rows, j < n_v_heads, i < dv,
//  y[r, j*dv + i] = (o[r, j*dv + i] * inv) * w[i] * silu(z[r, j*dv + i]),
//  inv = 1 / sqrt(mean_i(o[r, j*dv + i]^2) + eps), silu(x) = x / (1 + exp(-x)).
//  o: [rows][ldo], z: [rows][ldz], w: [dv] (ssm_norm, shared by heads), y: [rows][ldy].
//  y == o (in place, same ld) is allowed.
pf_status gdn_gated_rms_norm_rows(const float *o, int64_t ldo, const float *z, int64_t ldz,
                                  const float *w, float *y, int64_t ldy, int64_t rows,
                                  int32_t n_v_heads, int32_t dv, float eps, cudaStream_t stream);
// The fp16 producer twin of gdn_gated_rms_norm_rows (rows.cuh "fp16 producers"): the gated
// norm's output in the f16 leg's input form for the ssm_out projection, bitwise what the cast
// makes of the fp32 twin's output. n_v_heads <= kMaxGatedF16Heads.
constexpr int32_t kMaxGatedF16Heads = 1024;  // head inverses in shared memory: 4 KiB
pf_status gdn_gated_rms_norm_rows_f16(const float *o, int64_t ldo, const float *z, int64_t ldz,
                                      const float *w, const F16Out &out, int64_t rows,
                                      int32_t n_v_heads, int32_t dv, float eps, cudaStream_t stream);

// G7: the gated delta rule, a chunk-resident sequential scan.
//  q, k:  [rows][ldq] / [rows][ldk], n_k_heads heads of dk each (head h at column h*dk); they
//         usually point into the conv output u (q at column 0, k at column n_k_heads*dk),
//         already L2-normalised (q also scaled by 1/sqrt(dk)).
//  v:     [rows][ldv], n_v_heads heads of dv.
//  beta, g: [rows][ld_beta] / [rows][ld_g], n_v_heads columns (from gdn_gates_rows).
//  state: [n_v_heads][dk][dv] fp32, S[j][a][b] (a = key index, b = value index; HF's layout,
//         the transpose of llama.cpp's); read at the start, written back at the end (in place).
//  o:     [rows][ldo], n_v_heads heads of dv. o must not overlap q, k, beta, g or state; o == v
//         exactly (same pointer and ld) is allowed.
//  Value head j uses key head j % n_k_heads (qwen35 GGUF, tiled pairing, spec.md G6);
//  n_v_heads must be a multiple of n_k_heads. dk, dv in {16, 32, 64, 128}.
//  Per token t, per head j (all fp32): S <- exp(g) S; e = (v - S^T k) * beta; S += k (x) e;
//  o = S^T q. Each S^T x sum over a in [0, dk) is taken in a fixed order (8 strided partial
//  sums of dk/8 terms, then a fixed butterfly), so the result does not depend on `rows`.
//  Design: one block per (value head, 16 value columns) — 8 columns when Hv*dv < 4096, so
//  that Hv = 16 still gives 256 blocks; the columns x dk state slice lives in registers (dk/8
//  entries per thread, 8 threads per column, loaded and stored through shared memory in
//  coalesced segments); q/k/v/beta/g rows are copied with cp.async into a double-buffered
//  16-token shared-memory tile while the previous tile is consumed; outputs leave through
//  shared memory. Bound: sequential in tokens (about 0.1-0.5 us per token on an H200 at real
//  dims); the chunkwise WY form (spec 3.2.1) is the long-prompt path, not built yet.
pf_status gdn_scan_rows(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                        int64_t ldv, const float *beta, int64_t ld_beta, const float *g,
                        int64_t ld_g, float *state, float *o, int64_t ldo, int64_t rows,
                        int32_t n_k_heads, int32_t n_v_heads, int32_t dk, int32_t dv,
                        cudaStream_t stream);

// G7 in the chunkwise-parallel form (spec.md §3.2.1) on tensor cores (gdn_chunk.cu): same
// arguments and result as gdn_scan_rows up to rounding (fp16 operands with exact per-chunk
// power-of-two scales, fp32 accumulation and state; tested at 2e-3 relative against float64,
// 3e-4 to 7e-4 measured on the first build of this form), for dk = dv = 128 (UNSUPPORTED otherwise). q and k must be L2-normalised
// (|x| <= 1). Not bitwise equal to the sequential scan, nor across different splits of one
// sequence into calls (chunk boundaries restart at every call). Runs in passes of at most
// kGdnPassRows rows, each a prep kernel (all chunks in parallel) and a state kernel (chunks in
// sequence); `workspace` (device, >= gdn_chunk_workspace_bytes(rows, ...) bytes, 256-byte
// aligned) holds the prep results of one pass. With the warpgroup state kernel, a call of more
// than kGdnSubpassRows rows whose workspace holds two sub-passes of kGdnSubpassRows runs chained
// sub-passes instead (the prep of sub-pass p + 1 beside the state kernel of sub-pass p, in the
// other workspace half; same bits; a call of two sub-passes only where the state grid leaves
// half the SMs idle). sm_count sizes the grid (0 = the device's). Asynchronous on
// `stream`; allocates nothing.
constexpr int64_t kGdnPassRows = 8192;
constexpr int64_t kGdnSubpassRows = 2048;
bool gdn_chunk_supported(int32_t dk, int32_t dv);
size_t gdn_chunk_workspace_bytes(int64_t rows, int32_t n_k_heads, int32_t n_v_heads);
pf_status gdn_chunk_scan_rows(const float *q, int64_t ldq, const float *k, int64_t ldk,
                              const float *v, int64_t ldv, const float *beta, int64_t ld_beta,
                              const float *g, int64_t ld_g, float *state, float *o, int64_t ldo,
                              int64_t rows, int32_t n_k_heads, int32_t n_v_heads, int32_t dk,
                              int32_t dv, void *workspace, size_t workspace_bytes,
                              int32_t sm_count, cudaStream_t stream);
// Rows from which the engine (and PF_GDN_SCAN_AUTO) takes the chunked path on the fast legs.
// Measured (H200, 16/32 heads): chunked 0.087 ms against sequential 0.203 at 512 rows (v1) and
// 0.185 against 0.798 at 2048 (v2); below 512 rows not measured yet, so one full chunk.
constexpr int64_t kGdnChunkMinRows = 64;
// What "auto" means for the delta rule, from env PREFILL_GDN_SCAN (read once): 0 auto (chunked
// on the fast legs from kGdnChunkMinRows rows), 1 sequential, 2 chunked wherever supported.
int32_t gdn_scan_env_default();
pf_status gdn_chunk_scan_rows(const float *q, int64_t ldq, const float *k, int64_t ldk,
                              const float *v, int64_t ldv, const float *beta, int64_t ld_beta,
                              const float *g, int64_t ld_g, float *state, float *o, int64_t ldo,
                              int64_t rows, int32_t n_k_heads, int32_t n_v_heads, int32_t dk,
                              int32_t dv, int32_t sm_count, cudaStream_t stream);

// ------------------------------------------------------------------ per-token twins (decode)
// One token: the row entries with rows = 1 (identical arithmetic, hence bitwise-equal results).

inline pf_status gdn_conv1d_token(const float *m, float *window, const float *weight, float *u,
                                  int64_t conv_dim, int32_t kc, cudaStream_t stream) {
    return gdn_conv1d_rows(m, conv_dim, window, weight, u, conv_dim, 1, conv_dim, kc, stream);
}

inline pf_status gdn_l2norm_token(float *x, int32_t n_heads, int64_t head_stride,
                                  int32_t head_dim, float eps, float scale, cudaStream_t stream) {
    return gdn_l2norm_rows(x, (int64_t)(n_heads - 1) * head_stride + head_dim, 1, n_heads,
                           head_stride, head_dim, eps, scale, stream);
}

inline pf_status gdn_gates_token(const float *b, const float *alpha, const float *ssm_a,
                                 const float *dt_bias, float *beta, float *g, int32_t n_v_heads,
                                 cudaStream_t stream) {
    return gdn_gates_rows(b, n_v_heads, alpha, n_v_heads, ssm_a, dt_bias, beta, n_v_heads, g,
                          n_v_heads, 1, n_v_heads, stream);
}

inline pf_status gdn_scan_token(const float *q, const float *k, const float *v, const float *beta,
                                const float *g, float *state, float *o, int32_t n_k_heads,
                                int32_t n_v_heads, int32_t dk, int32_t dv, cudaStream_t stream) {
    return gdn_scan_rows(q, (int64_t)n_k_heads * dk, k, (int64_t)n_k_heads * dk, v,
                         (int64_t)n_v_heads * dv, beta, n_v_heads, g, n_v_heads, state, o,
                         (int64_t)n_v_heads * dv, 1, n_k_heads, n_v_heads, dk, dv, stream);
}

}  // namespace pf
