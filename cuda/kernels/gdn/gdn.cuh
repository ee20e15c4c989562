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
// is the same entry called with rows = 1 (what decode runs). That holds by construction: each
// kernel computes a row's outputs with the same operations in the same order whatever `rows` is
// (no reduction spans rows, no tile size changes an operation), and the tests check it with
// np.array_equal.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "base/mat.h"
#include "plan/plan.h"  // GdnChunkPlan, kGdnPassRows, kGdnSubpassRows, kGdnChunkMinRows

namespace pf {
struct F16Out;  // f16_rows.cuh
}

namespace pf {

constexpr int kGdnMaxConvKernel = 8;  // conv kernel sizes Kc in [2, 8] are compiled (models: 4)

// G3: causal depthwise conv1d + SiLU over a chunk, advancing the window.
//  m:      [rows][ld] pre-conv input (conv_dim columns used), read only
//  window: [kc-1][conv_dim] contiguous fp32, oldest row first; read, then replaced in place by
//          the last kc-1 rows of concat(window, m) (for rows < kc-1 part of the old window stays)
//  weight: [conv_dim][kc] (ssm_conv1d, NumPy (conv_dim, Kc)); tap kc-1 multiplies the current
//          token: c[t, ch] = sum_{i=0}^{kc-1} X[t+i, ch] * weight[ch, i], X = concat(window, m),
//          accumulated in that order (i = 0 first) with fmaf.
//  u:      [rows][ld] = silu(c). u must not overlap m, window or weight.
//  Race freedom: threads own (channel, row chunk); the old window of a channel is read only by
//  the thread of that channel's first chunk, which also writes the new window after its reads.
pf_status gdn_conv1d_rows(CMatF m, float *window, const float *weight, MatF u, int64_t rows,
                          int64_t conv_dim, int32_t kc, cudaStream_t stream);

// G5: per-head L2 norm in place, with a scale: for each row r and head h in [0, n_heads),
//  x_h <- x_h * ((1 / sqrt(sum_i x_h[i]^2 + eps)) * scale), head h at x.row(r) + h*head_stride.
//  This is HF's formula (x * rsqrt(sum x^2 + eps), eps = 1e-6); llama.cpp uses
//  x / max(||x||, eps), which differs by ~eps / (2 ||x||^2) relative (spec.md §0). scale = 1 for
//  k, 1/sqrt(dk) for q (applied after the normalisation, spec.md G5).
//  Sum of squares: lane l of one warp sums elements l, l+32, ... in order, then a fixed
//  butterfly over the 32 lanes.
pf_status gdn_l2norm_rows(MatF x, int64_t rows, int32_t n_heads, int64_t head_stride,
                          int32_t head_dim, float eps, float scale, cudaStream_t stream);

// G3 + G5 in one pass (the session's path; tuning.fuse_conv_norm off runs the three launches
// instead): gdn_conv1d_rows(m, window, weight, u, rows, conv_dim, kc), then gdn_l2norm_rows on
// the n_k_heads q heads at column 0 of u (scale q_scale) and on the n_k_heads k heads at column
// n_k_heads*dk (scale 1), each head normalised before it is stored; the value part is stored as
// the conv leaves it. Bitwise those launches' u and window: one warp per head with lane l owning
// elements l + 32 j, the l2norm's lanes and order. dk = 128 (gdn_conv1d_l2norm_supported),
// conv_dim >= 2 * n_k_heads * dk; the rest as the two.
struct GdnConvNormArgs {
    CMatF m;
    float *window = nullptr;
    const float *weight = nullptr;
    MatF u;
    int64_t rows = 0, conv_dim = 0;
    int32_t kc = 0, n_k_heads = 0, dk = 0;
    float eps = 0.0f, q_scale = 1.0f;
};
bool gdn_conv1d_l2norm_supported(int32_t dk, int32_t kc);
pf_status gdn_conv1d_l2norm_rows(const GdnConvNormArgs &a, cudaStream_t stream);

// The same over the rows of n sequences in one launch (a step of a batch, issue 28): sequence i
// holds rows [row0[i], row0[i] + rows[i]) of a.m and a.u (rows[i] >= 1) and its own window
// windows[i]; row0, rows, windows are device arrays of n entries, max_rows (host) >= every
// rows[i] sizes the grid. a.window and a.rows are unused (a.rows: the rows the views span, for
// the checks). Bitwise one gdn_conv1d_l2norm_rows call per sequence: each sequence's blocks run
// that kernel's arithmetic on its rows and window (grid z = sequence, n <= 65535).
struct GdnConvSeqs {
    int32_t n = 0;
    const int64_t *row0 = nullptr, *rows = nullptr;
    float *const *windows = nullptr;
    int64_t max_rows = 0;
};
pf_status gdn_conv1d_l2norm_rows_varlen(const GdnConvNormArgs &a, const GdnConvSeqs &seqs, cudaStream_t stream);

// G2: gates. For r < rows, j < n_v_heads:
//  beta[r, j] = sigmoid(b[r, j]) = 1 / (1 + exp(-b));
//  g[r, j]    = ssm_a[j] * softplus(alpha[r, j] + dt_bias[j]), softplus(x) = x for x > 20,
//               else log1p(exp(x)).
//  b, alpha: [rows][ld] inputs; ssm_a, dt_bias: [n_v_heads]; beta, g: [rows][ld] outputs, which
//  must not overlap the inputs.
struct GdnGatesArgs {
    CMatF b, alpha;
    const float *ssm_a = nullptr, *dt_bias = nullptr;
    MatF beta, g;
    int64_t rows = 0;
    int32_t n_v_heads = 0;
};
pf_status gdn_gates_rows(const GdnGatesArgs &a, cudaStream_t stream);

// G8: gated RMSNorm per value head: for r < rows, j < n_v_heads, i < dv,
//  y[r, j*dv + i] = (o[r, j*dv + i] * inv) * w[i] * silu(z[r, j*dv + i]),
//  inv = 1 / sqrt(mean_i(o[r, j*dv + i]^2) + eps), silu(x) = x / (1 + exp(-x)).
//  o, z: [rows][ld], w: [dv] (ssm_norm, shared by heads), y: [rows][ld]; y == o (in place, same
//  ld) is allowed.
struct GdnGatedNormArgs {
    CMatF o, z;
    const float *w = nullptr;
    int64_t rows = 0;
    int32_t n_v_heads = 0, dv = 0;
    float eps = 0.0f;
};
pf_status gdn_gated_rms_norm_rows(const GdnGatedNormArgs &a, MatF y, cudaStream_t stream);
// The fp16 producer twin of gdn_gated_rms_norm_rows (rows.cuh "fp16 producers"): the gated
// norm's output in the f16 leg's input form for the ssm_out projection, bitwise what the cast
// makes of the fp32 twin's output. n_v_heads <= kMaxGatedF16Heads.
constexpr int32_t kMaxGatedF16Heads = 1024;  // head inverses in shared memory: 4 KiB
pf_status gdn_gated_rms_norm_rows_f16(const GdnGatedNormArgs &a, const F16Out &out, cudaStream_t stream);

// G7: the gated delta rule's operands, for the sequential scan and the chunked form.
//  q, k:  [rows][ld], n_k_heads heads of dk each (head h at column h*dk); they usually point into
//         the conv output u (q at column 0, k at column n_k_heads*dk), already L2-normalised (q
//         also scaled by 1/sqrt(dk)).
//  v:     [rows][ld], n_v_heads heads of dv.
//  beta, g: [rows][ld], n_v_heads columns (from gdn_gates_rows).
//  state: [n_v_heads][dk][dv] fp32, S[j][a][b] (a = key index, b = value index; HF's layout,
//         the transpose of llama.cpp's); read at the start, written back at the end (in place).
//  o:     [rows][ld], n_v_heads heads of dv. o must not overlap q, k, beta, g or state; o == v
//         exactly (same pointer and ld) is allowed.
//  Value head j uses key head j % n_k_heads (qwen35 GGUF, tiled pairing, spec.md G6);
//  n_v_heads must be a multiple of n_k_heads.
struct GdnScanArgs {
    CMatF q, k, v, beta, g;
    float *state = nullptr;
    MatF o;
    int64_t rows = 0;
    int32_t n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
};

// G7 token by token: dk, dv in {16, 32, 64, 128}.
//  Per token t, per head j (all fp32): S <- exp(g) S; e = (v - S^T k) * beta; S += k (x) e;
//  o = S^T q. Each S^T x sum over a in [0, dk) is taken in a fixed order (8 strided partial
//  sums of dk/8 terms, then a fixed butterfly), so the result does not depend on `rows`.
//  Design: one block per (value head, 16 value columns) — 8 columns when Hv*dv < 4096, so
//  that Hv = 16 still gives 256 blocks; the columns x dk state slice lives in registers (dk/8
//  entries per thread, 8 threads per column, loaded and stored through shared memory in
//  coalesced segments); q/k/v/beta/g rows are copied with cp.async into a double-buffered
//  16-token shared-memory tile while the previous tile is consumed; outputs leave through
//  shared memory. Bound: sequential in tokens (about 0.1-0.5 us per token on an H200 at real
//  dims): the exact path (f32 leg) and decode's; the chunked form below is the fast legs' path
//  from kGdnChunkMinRows rows.
pf_status gdn_scan_rows(const GdnScanArgs &a, cudaStream_t stream);

// G7 in the chunkwise-parallel form (spec.md §3.2.1) on tensor cores (gdn_chunk.cu): the result of
// gdn_scan_rows up to rounding (fp16 operands with exact per-chunk power-of-two scales, fp32
// accumulation and state; tested at 2e-3 relative against float64, 3e-4 to 7e-4 measured), for
// dk = dv = 128 (UNSUPPORTED otherwise). q and k must be L2-normalised (|x| <= 1). Not bitwise
// equal to the sequential scan, nor across different splits of one sequence into calls (chunk
// boundaries restart at every call). Runs in passes of at most kGdnPassRows rows, each a prep
// kernel (all chunks in parallel) and a state kernel (chunks in sequence); `workspace` (device,
// >= gdn_chunk_workspace_bytes(rows, ...) bytes, 256-byte aligned) holds the prep results of one
// pass. `plan` picks the state kernel, the chained sub-passes (the prep of sub-pass p + 1 beside
// the state kernel of sub-pass p, in the other workspace half, where the workspace holds two;
// same bits) and programmatic dependence. Asynchronous on `stream`; allocates nothing.
bool gdn_chunk_supported(int32_t dk, int32_t dv);
size_t gdn_chunk_workspace_bytes(int64_t rows, int32_t n_k_heads, int32_t n_v_heads);
pf_status gdn_chunk_scan_rows(const GdnScanArgs &a, void *workspace, size_t workspace_bytes,
                              const GdnChunkPlan &plan, cudaStream_t stream);

// ------------------------------------------------------------------------------ many sequences
// The delta rule over the rows of several sequences in one launch ("varlen", issue 28): sequence
// i holds rows [row0_i, row0_i + rows_i) of q, k, v, beta, g and o (back to back or not, no
// padding, rows_i >= 1) and its own state [n_v_heads][dk][dv] (a separate allocation each,
// read and written in place; two sequences never share one). The result is exactly that of one
// call per sequence on its rows and its state: no sequence reads another's rows or state (rows
// past a sequence's end are zero-filled where a kernel's tile reaches them, never multiplied by
// zero: a NaN in a neighbour stays there).

// The sequences of a varlen call: device arrays of n entries (the engine fills them per step in
// its workspace with a kernel, so that a CUDA graph can replay the launch), and the host copy of
// the rows the launchers size their grids and the workspace with.
struct GdnSeqs {
    int32_t n = 0;                      // sequences
    const int64_t *row0 = nullptr;      // device [n]: first row of sequence i in q, k, v, beta, g, o
    const int64_t *rows = nullptr;      // device [n]: its rows (>= 1)
    const int64_t *chunk0 = nullptr;    // device [n + 1]: prefix sum of ceil(rows_i / 64) (chunked form)
    float *const *state = nullptr;      // device [n]: sequence i's state [Hv][dk][dv], read and written in place
    const int64_t *host_rows = nullptr; // host [n]: the same rows (grid sizing, workspace, checks)
};

// The sequential scan over every sequence in one launch (grid: gdn_scan_rows' blocks x
// sequences): bitwise what gdn_scan_rows gives each sequence alone (the same per-token
// arithmetic; its result does not depend on `rows`). a: q, k, v, beta, g, o and the dims as for
// gdn_scan_rows, a.rows = the rows the views span (>= every row0_i + rows_i), a.state unused.
// Decode: n sequences of one row each.
pf_status gdn_scan_rows_varlen(const GdnScanArgs &a, const GdnSeqs &seqs, cudaStream_t stream);

// The chunked form over every sequence in one pass: one prep launch over the flattened table of
// all chunks of all sequences (the workspace indexed by the global chunk, chunk0), then one
// state launch with a sequence dimension (each CTA walks its sequence's chunks with that
// sequence's state). Each sequence's chunks start at its own row0 (chunks never cross a
// sequence), so every chunk goes through the kernels' arithmetic as in gdn_chunk_scan_rows:
// bitwise what gdn_chunk_scan_rows gives each sequence alone (one pass or chained sub-passes:
// the same chunks). One pass, no chained sub-passes: the workspace holds all chunks of the call
// (gdn_chunk_varlen_workspace_bytes(total chunks)), and a caller that wants less memory splits
// the call (pf_gdn_scan_varlen runs rounds of at most kGdnVarlenRoundChunks chunks). Limits:
// n <= 65535, total chunks <= 65535 and total chunks * max(Hk, Hv) * 64 < 2^31 (grid and TMA
// coordinates); INVALID_ARGUMENT beyond. plan: the state kernel and PDL as gdn_chunk_scan_rows
// (plan.subpass_rows unused).
size_t gdn_chunk_varlen_workspace_bytes(int64_t total_chunks, int32_t n_k_heads, int32_t n_v_heads);
pf_status gdn_chunk_scan_rows_varlen(const GdnScanArgs &a, const GdnSeqs &seqs, void *workspace,
                                     size_t workspace_bytes, const GdnChunkPlan &plan, cudaStream_t stream);

}  // namespace pf
