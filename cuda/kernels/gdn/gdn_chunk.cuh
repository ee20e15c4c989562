// gdn_chunk.cuh — what the rooms of the chunked delta rule share (gdn_chunk.cu: the plan and
// the passes; gdn_chunk_prep.cu: the prep kernel; gdn_chunk_state.cu: the warp-owned state kernel,
// sm_80+; gdn_chunk_state_wg.cu: the warpgroup state kernel, sm_90a): the tile constants, the
// workspace layout of one pass, the kernels' arguments and the launchers. The algorithm and the
// precision are described at the top of gdn_chunk.cu.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/mat.h"
#include "ptx/common.cuh"
#include "ptx/mma.cuh"

namespace pf {
namespace gdnc {

constexpr int kC = 64;          // chunk rows (spec.md §3.2.1)
constexpr int kDK = 128;        // dk = dv of the chunked path (all qwen35 sizes)
constexpr int kLdH = kDK + 8;   // fp16 row stride of K, Q: 272 B, ldmatrix rows hit 8 distinct 16 B bank groups
constexpr int kLdF = kC + 4;    // fp32 row stride of 64-wide tiles: fragment reads (row g, col tig) conflict-free
constexpr int kLdP = kC + 8;    // fp16 row stride of 64-wide tiles (Tm, P): 144 B
constexpr int kLdX = 32 + 4;    // fp32 merge scratch (32 x 32)
constexpr float kScaleTop = 14.0f;  // scaled fp16 tiles: max |x| below 2^15
constexpr float kSqrtDk = 11.3138f; // >= sqrt(128): |k . s| <= ||k|| ||s|| <= sqrt(dk) max|s|

// ------------------------------------------------------------------------------ helpers

// Publishes a warp's max |x| into *slot (all lanes call).
__device__ __forceinline__ void publish_max(unsigned *slot, float local) {
    const float m = warp_max(local);
    if ((threadIdx.x & 31) == 0) atomicMax(slot, __float_as_uint(m));
}

// The power-of-two scale that brings max |x| = from_bits(bits) to [2^14, 2^15); 1 for zero.
__device__ __forceinline__ float pow2_scale(unsigned bits) {
    if (bits == 0) return 1.0f;
    const int e = (int)((bits >> 23) & 0xff) - 127;  // floor(log2 max) for normal numbers
    int se = 127 + (int)kScaleTop - e;
    se = se < 1 ? 1 : (se > 254 ? 254 : se);
    return __uint_as_float((unsigned)se << 23);
}

// e^x for x <= 0 as __expf computes it (x times log2(e) in fp32, then the ex2 unit), with
// results below 2^-126 flushed to zero: __expf keeps them as fp32 subnormals by a range check,
// a halving and a squaring around the ex2 (4 more instructions each). The same bits wherever
// __expf's result is a normal number; the gates' decays that flush are below 1e-38 and only
// scale terms that the fp16 operands (smallest subnormal 6e-8) cannot hold either.
__device__ __forceinline__ float exp_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269502f));
    return y;
}

// pow2_scale for a (non-negative) bound given as a float.
__device__ __forceinline__ float pow2_scale_f(float bound) { return pow2_scale(__float_as_uint(bound)); }

// ------------------------------------------------------------------------------ workspace
// Per pass of nc chunks: K, Q fp16 [Hk][nc][64][128]; Tm, P fp16 [Hv][nc][64][64] (Tm scaled);
// gamma, beta fp32 [Hv][nc][64]; meta fp32 [Hv][nc][4] = {sigma_T, max row sum |Tm|, 0, 0}.
struct Workspace {
    __half *kh, *qh, *tm, *p;
    float *gam, *bet, *meta;
};

constexpr size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

inline size_t workspace_layout(int64_t nc, int64_t hk, int64_t hv, void *base, Workspace *w) {
    const size_t kq = align256(size_t(hk * nc) * kC * kDK * sizeof(__half));
    const size_t tp = align256(size_t(hv * nc) * kC * kC * sizeof(__half));
    const size_t gv = align256(size_t(hv * nc) * kC * sizeof(float));
    const size_t mt = align256(size_t(hv * nc) * 4 * sizeof(float));
    if (w != nullptr) {
        char *b = static_cast<char *>(base);
        w->kh = reinterpret_cast<__half *>(b);
        w->qh = reinterpret_cast<__half *>(b + kq);
        w->tm = reinterpret_cast<__half *>(b + 2 * kq);
        w->p = reinterpret_cast<__half *>(b + 2 * kq + tp);
        w->gam = reinterpret_cast<float *>(b + 2 * kq + 2 * tp);
        w->bet = reinterpret_cast<float *>(b + 2 * kq + 2 * tp + gv);
        w->meta = reinterpret_cast<float *>(b + 2 * kq + 2 * tp + 2 * gv);
    }
    return 2 * kq + 2 * tp + 2 * gv + mt;
}

// ------------------------------------------------------------------------------ prep kernel

// The sequences of a varlen pass (gdn_chunk_scan_rows_varlen; GdnSeqs' device arrays): chunk
// chunk0[s] + c of the pass is chunk c of sequence s, rows row0[s] + 64 c ... of the operands.
// n == 0: the pass is one sequence of the args' `rows` rows from row 0 (gdn_chunk_scan_rows).
struct SeqTable {
    const int64_t *row0 = nullptr;
    const int64_t *rows = nullptr;
    const int64_t *chunk0 = nullptr;
    float *const *state = nullptr;
    int32_t n = 0;
};

struct PrepArgs {
    CMatF q, k, beta, g;  // the launcher's views (GdnScanArgs), from the pass's first row
    int64_t rows;  // rows of this pass (one sequence)
    int32_t n_k_heads, n_v_heads, nc;  // nc: chunks of the pass (all sequences')
    Workspace w;
    SeqTable seqs;
};

// ----------------------------------------------------------------------------- state kernel

struct StateArgs {
    CMatF v;  // the launcher's views (GdnScanArgs), from the pass's first row
    float *state;
    MatF o;
    int64_t rows;  // rows of this pass (one sequence)
    int32_t n_k_heads, n_v_heads, nc;  // nc: chunks of the pass (all sequences')
    Workspace w;
    int32_t chain;  // chained sub-passes: the state is read only after the prep grid completed
    SeqTable seqs;  // varlen: sequence blockIdx.y (grid y = seqs.n)
};

// ------------------------------------------------------------------------------ sequences

// What a state CTA (or a prep CTA) works on: `nc` chunks from the pass's chunk c0 (workspace
// index), the sequence's rows from row r0 of the operands, `rows` of them, and its state.
struct SeqSpan {
    int64_t r0, rows, c0;
    int32_t nc;
    float *state;
};

// The sequence of a state CTA: blockIdx.y's in a varlen pass, else the pass itself.
__device__ __forceinline__ SeqSpan state_seq(const StateArgs &a) {
    if (a.seqs.n == 0) return SeqSpan{0, a.rows, 0, a.nc, a.state};
    const int s = blockIdx.y;
    const int64_t c0 = a.seqs.chunk0[s];
    return SeqSpan{a.seqs.row0[s], a.seqs.rows[s], c0, int32_t(a.seqs.chunk0[s + 1] - c0), a.seqs.state[s]};
}

// The sequence s of global chunk c (chunk0[s] <= c < chunk0[s + 1]; chunk0 strictly increasing,
// chunk0[0] = 0 <= c < chunk0[n]), found by the whole warp: 32 probes per step (lane l reads
// chunk0[lo + l stride]), the last probe <= c narrows [lo, hi) 32-fold; 1 step up to 32
// sequences, 2 up to 1024. Every lane returns the same s.
__device__ __forceinline__ int warp_find_seq(const int64_t *chunk0, int n, int64_t c) {
    const int lane = threadIdx.x & 31;
    int lo = 0, hi = n;  // chunk0[lo] <= c < chunk0[hi]
    while (hi - lo > 1) {
        const int stride = (hi - lo + 31) / 32;
        const int idx = lo + lane * stride;
        const unsigned le = __ballot_sync(0xffffffffu, idx < hi && chunk0[idx] <= c);
        lo += (31 - __clz(le)) * stride;  // lane 0 always holds (chunk0[lo] <= c): le != 0
        hi = min(lo + stride, hi);
    }
    return lo;
}

// A prep CTA's chunk (global chunk c of the pass): its first row t0 in the operands and its rows
// lim in [1, 64] (rows from t0 + lim on belong to no sequence or to the next one: never read).
// Called by whole warps (varlen: warp_find_seq).
struct ChunkRows {
    int64_t t0;
    int lim;
};
__device__ __forceinline__ ChunkRows prep_chunk_rows(const PrepArgs &a, int c) {
    int64_t t0 = (int64_t)c * kC, left = a.rows - t0;
    if (a.seqs.n > 0) {
        const int s = warp_find_seq(a.seqs.chunk0, a.seqs.n, c);
        const int64_t local = (int64_t)(c - a.seqs.chunk0[s]) * kC;
        t0 = a.seqs.row0[s] + local;
        left = a.seqs.rows[s] - local;
    }
    return ChunkRows{t0, left < kC ? int(left) : kC};
}

// ------------------------------------------------------------------------------ launchers

// The prep kernel over one pass (grid: rounds of value heads x chunks x key heads); `vec`: q and
// k rows 16-byte aligned; `pdl`: as the programmatic dependent of the state kernel before it
// (chained sub-passes).
pf_status launch_prep(const PrepArgs &a, bool vec, bool pdl, cudaStream_t stream);
// The warp-owned state kernel (gdn_chunk_state.cu); `vec`: v rows 16-byte aligned; sm_count
// sizes the CTAs (one wave); `pdl`: as the prep kernel's programmatic dependent.
pf_status launch_state_warp(const StateArgs &a, bool vec, int32_t sm_count, bool pdl, cudaStream_t stream);
// The warpgroup state kernel (gdn_chunk_state_wg.cu; sm_90a builds on compute capability 9.0);
// `pair`: its pair form (one CTA per value head, two consumer warpgroups; the same bits).
pf_status launch_state_wg(const StateArgs &a, bool vec, bool pair, bool pdl, cudaStream_t stream);
// Whether the warpgroup kernel can run on the current device (sm90a_kernels_available).
bool state_wg_available();

}  // namespace gdnc
}  // namespace pf
