// gdn.cu — Gated DeltaNet kernels (spec.md §3.2): conv1d + SiLU, L2 norm, gates, gated RMSNorm,
// and the chunk-resident sequential delta-rule scan. Three layers per op: __global__ kernel (one
// args struct) -> launcher -> entry (declared in gdn.cuh). fp32 throughout; every reduction has
// a fixed order that does not depend on the number of rows, so each row kernel equals `rows`
// launches of itself with rows = 1 bit for bit (the per-token twin).
#include <cuda_pipeline_primitives.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/gdn/gdn.cuh"
#include "kernels/rows/f16_rows.cuh"
#include "ptx/common.cuh"

namespace pf {
namespace {

__device__ __forceinline__ float silu_(float x) { return x / (1.0f + expf(-x)); }

// ------------------------------------------------------------------------------ conv1d + SiLU

constexpr int kConvThreads = 128;     // channels per block (coalesced row segments of 512 B)
constexpr int64_t kConvMinChunk = 16; // rows per thread; >= kGdnMaxConvKernel - 1, so only the
                                      // first chunk of a channel ever reads the old window

// What both conv kernels read and write: input rows m, the KC-1-row window, taps, output rows u.
struct ConvIO {
    CMatF m;
    float *window;
    const float *weight;
    MatF u;
    int64_t rows;
    int64_t conv_dim;
};

struct ConvArgs : ConvIO {
    int64_t chunk;  // rows per thread
};

// The new window of channel ch: its old one (old, in registers) with the last min(rows, KC-1)
// inputs appended. The caller is the only reader of that channel's old window, so writing it
// now races with nobody.
template <int KC>
__device__ __forceinline__ void conv_store_window(const ConvIO &a, int64_t ch, float (&old)[KC - 1]) {
    const int64_t t_first = a.rows > KC - 1 ? a.rows - (KC - 1) : 0;
#pragma unroll
    for (int s = 0; s < KC - 1; ++s) {
        const int64_t t = t_first + s;
        if (t < a.rows) {
#pragma unroll
            for (int i = 0; i < KC - 2; ++i) old[i] = old[i + 1];
            old[KC - 2] = a.m.ptr[t * a.m.ld + ch];
        }
    }
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) a.window[(int64_t)i * a.conv_dim + ch] = old[i];
}

// Thread (channel ch, chunk blockIdx.y) computes rows [r0, r0 + chunk) of channel ch, holding
// the KC-1 previous inputs X[t .. t+KC-2] in registers (X = concat(window, m)).
template <int KC>
__global__ void __launch_bounds__(kConvThreads) conv1d_silu_kernel(const __grid_constant__ ConvArgs a) {
    static_assert(KC >= 2 && KC - 1 <= kConvMinChunk, "window must lie inside the first chunk");
    const int64_t ch = (int64_t)blockIdx.x * kConvThreads + threadIdx.x;
    if (ch >= a.conv_dim) return;
    const int64_t r0 = (int64_t)blockIdx.y * a.chunk;
    const int64_t r1 = r0 + a.chunk < a.rows ? r0 + a.chunk : a.rows;
    float w[KC];
#pragma unroll
    for (int i = 0; i < KC; ++i) w[i] = a.weight[ch * KC + i];
    float prev[KC - 1];  // prev[i] = X[r0 + i]
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) {
        const int64_t xr = r0 + i;  // X row; < KC-1 only for r0 == 0 (chunk >= KC-1)
        prev[i] = xr < KC - 1 ? a.window[xr * a.conv_dim + ch] : a.m.ptr[(xr - (KC - 1)) * a.m.ld + ch];
    }
    float old[KC - 1];  // the old window of this channel (meaningful for blockIdx.y == 0)
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) old[i] = prev[i];
    for (int64_t t = r0; t < r1; ++t) {
        const float cur = a.m.ptr[t * a.m.ld + ch];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KC - 1; ++i) acc = fmaf(prev[i], w[i], acc);  // oldest tap first
        acc = fmaf(cur, w[KC - 1], acc);                                 // tap KC-1: token t
        a.u.ptr[t * a.u.ld + ch] = silu_(acc);
#pragma unroll
        for (int i = 0; i < KC - 2; ++i) prev[i] = prev[i + 1];
        prev[KC - 2] = cur;
    }
    if (blockIdx.y == 0) conv_store_window<KC>(a, ch, old);  // this thread read the old window
}

// ------------------------------------------------------------------------------ conv1d + SiLU + q/k L2 norm

constexpr int kConvNormWarps = 4;   // warps per block: 4 channel groups side by side
constexpr int kConvNormRows = 16;   // rows per warp, held in registers; >= kGdnMaxConvKernel - 1,
                                    // so only the first chunk of a group reads the old window
static_assert(kConvNormRows >= kGdnMaxConvKernel - 1, "the window must lie inside the first chunk");

struct ConvNormArgs : ConvIO {
    int32_t n_k_heads;  // groups [0, n_k_heads) are q heads, [n_k_heads, 2 n_k_heads) k heads
    float eps;
    float q_scale;
    // varlen form only: sequence blockIdx.z's first row, rows and window (device arrays)
    const int64_t *seq_row0 = nullptr, *seq_rows = nullptr;
    float *const *seq_window = nullptr;
};

// conv1d_silu_kernel, then l2norm_kernel on the q and k heads, in one pass. Warp = (group of
// G = 32 PER channels, kConvNormRows rows); a group of the q | k part is one head (dk = G), and
// lane l owns its channels l + 32 j, j < PER: the elements l2norm_kernel's lane l sums
// (warp_sum_squares: fmaf in j order from 0, then warp_sum), so each head's sum, factor and
// products are that kernel's expressions on the conv's values: the same bits. Each channel's
// conv is conv1d_silu_kernel's (the same taps, the same fmaf order; which thread computes a
// channel or how rows are chunked changes no operation). Every input of the warp (the KC-1
// rows before the chunk, the chunk's rows, the weights) is loaded before the first use.
template <int KC, int PER>
__device__ __forceinline__ void conv1d_silu_l2norm_body(const ConvNormArgs &a) {
    constexpr int R = kConvNormRows;
    constexpr int G = PER * kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int64_t grp = (int64_t)blockIdx.y * kConvNormWarps + threadIdx.x / kWarpSize;
    if (grp * G >= a.conv_dim) return;  // whole warps leave: the shuffles below stay full-warp
    const int64_t r0 = (int64_t)blockIdx.x * R;
    int64_t ch[PER];
    bool ok[PER];  // channel inside conv_dim (false only in a partial last group of v)
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        ch[j] = grp * G + lane + kWarpSize * j;
        ok[j] = ch[j] < a.conv_dim;
    }
    float w[PER][KC], prev[PER][KC - 1], x[R][PER];  // prev[j][i] = X[r0 + i], X = concat(window, m)
#pragma unroll
    for (int j = 0; j < PER; ++j) {
#pragma unroll
        for (int i = 0; i < KC; ++i) w[j][i] = ok[j] ? a.weight[ch[j] * KC + i] : 0.0f;
#pragma unroll
        for (int i = 0; i < KC - 1; ++i) {
            const int64_t xr = r0 + i;  // X row; < KC-1 only for r0 == 0 (R >= KC-1)
            prev[j][i] = !ok[j] ? 0.0f
                         : xr < KC - 1 ? a.window[xr * a.conv_dim + ch[j]]
                                       : a.m.ptr[(xr - (KC - 1)) * a.m.ld + ch[j]];
        }
#pragma unroll
        for (int k = 0; k < R; ++k)
            x[k][j] = ok[j] && r0 + k < a.rows ? a.m.ptr[(r0 + k) * a.m.ld + ch[j]] : 0.0f;
    }
    // Warp-uniform: which part of qkv this group is.
    const bool norm = grp < 2 * (int64_t)a.n_k_heads;
    const float scale = grp < a.n_k_heads ? a.q_scale : 1.0f;
#pragma unroll
    for (int k = 0; k < R; ++k) {
        if (r0 + k >= a.rows) break;  // warp-uniform
        float y[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < KC - 1; ++i) {  // oldest tap first: X[r0 + k + i]
                const float xi = k + i < KC - 1 ? prev[j][k + i] : x[k + i - (KC - 1)][j];
                acc = fmaf(xi, w[j][i], acc);
            }
            acc = fmaf(x[k][j], w[j][KC - 1], acc);  // tap KC-1: token r0 + k
            y[j] = silu_(acc);
        }
        if (norm) {  // l2norm_kernel: warp_sum_squares, then the factor and the products
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < PER; ++j) s = fmaf(y[j], y[j], s);
            s = warp_sum(s);
            const float f = (1.0f / sqrtf(s + a.eps)) * scale;  // HF: x * rsqrt(sum x^2 + eps)
#pragma unroll
            for (int j = 0; j < PER; ++j) y[j] = y[j] * f;
        }
        float *ur = a.u.ptr + (r0 + k) * a.u.ld;
#pragma unroll
        for (int j = 0; j < PER; ++j)
            if (ok[j]) ur[ch[j]] = y[j];
    }
    if (blockIdx.x == 0) {
        // The new windows, as conv1d_silu_kernel makes them: prev holds the old ones (r0 = 0),
        // and only this warp read its channels' old windows.
#pragma unroll
        for (int j = 0; j < PER; ++j)
            if (ok[j]) conv_store_window<KC>(a, ch[j], prev[j]);
    }
}

template <int KC, int PER>
__global__ void __launch_bounds__(kConvNormWarps *kWarpSize) conv1d_silu_l2norm_kernel(const __grid_constant__ ConvNormArgs a) {
    conv1d_silu_l2norm_body<KC, PER>(a);
}

// The varlen form: block (x, y, z) is block (x, y) of sequence z's own call (its rows, its
// window); blocks past that sequence's rows leave at once (whole blocks: no shuffle is split).
template <int KC, int PER>
__global__ void __launch_bounds__(kConvNormWarps *kWarpSize) conv1d_silu_l2norm_varlen_kernel(const __grid_constant__ ConvNormArgs a) {
    const int64_t row0 = a.seq_row0[blockIdx.z], rows = a.seq_rows[blockIdx.z];
    if ((int64_t)blockIdx.x * kConvNormRows >= rows) return;
    ConvNormArgs s = a;
    s.m.ptr = a.m.ptr + row0 * a.m.ld;
    s.u.ptr = a.u.ptr + row0 * a.u.ld;
    s.rows = rows;
    s.window = a.seq_window[blockIdx.z];
    conv1d_silu_l2norm_body<KC, PER>(s);
}

// ------------------------------------------------------------------------------ L2 norm

struct L2Args {
    MatF x;
    int64_t rows;
    int32_t n_heads;
    int64_t head_stride;
    int32_t head_dim;
    float eps;
    float scale;
};

// One warp per (row, head).
__global__ void l2norm_kernel(const __grid_constant__ L2Args a) {
    int64_t r, h;
    if (!warp_row_head(a.rows, a.n_heads, r, h)) return;
    float *x = a.x.ptr + r * a.x.ld + h * a.head_stride;
    const float s = warp_sum_squares(x, a.head_dim);
    const float f = (1.0f / sqrtf(s + a.eps)) * a.scale;  // HF: x * rsqrt(sum x^2 + eps)
    for (int i = threadIdx.x % kWarpSize; i < a.head_dim; i += kWarpSize) x[i] = x[i] * f;
}

// ------------------------------------------------------------------------------ gates

struct GatesArgs {
    CMatF b, alpha;
    const float *ssm_a;
    const float *dt_bias;
    MatF beta, g;
    int64_t rows;
    int32_t n_v_heads;
};

__global__ void gates_kernel(const __grid_constant__ GatesArgs a) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.rows * a.n_v_heads) return;
    const int64_t r = idx / a.n_v_heads;
    const int j = (int)(idx % a.n_v_heads);
    const float bl = a.b.ptr[r * a.b.ld + j];
    a.beta.ptr[r * a.beta.ld + j] = 1.0f / (1.0f + expf(-bl));
    const float x = a.alpha.ptr[r * a.alpha.ld + j] + a.dt_bias[j];
    const float sp = x > 20.0f ? x : log1pf(expf(x));  // PyTorch/ggml threshold: exp would overflow
    a.g.ptr[r * a.g.ld + j] = a.ssm_a[j] * sp;
}

// ------------------------------------------------------------------------------ gated RMSNorm

struct GatedNormArgs {
    CMatF o, z;
    const float *w;
    MatF y;
    int64_t rows;
    int32_t n_v_heads;
    int32_t dv;
    float eps;
};

// One warp per (row, value head). In place (y == o) is safe: a lane rewrites only the elements
// it read, after the warp's sum is complete.
__global__ void gated_rms_norm_kernel(const __grid_constant__ GatedNormArgs a) {
    int64_t r, h;
    if (!warp_row_head(a.rows, a.n_v_heads, r, h)) return;
    const int64_t col = h * a.dv;
    const float *o = a.o.ptr + r * a.o.ld + col;
    const float *z = a.z.ptr + r * a.z.ld + col;
    float *y = a.y.ptr + r * a.y.ld + col;
    const float s = warp_sum_squares(o, a.dv);
    const float inv = 1.0f / sqrtf(s / (float)a.dv + a.eps);
    for (int i = threadIdx.x % kWarpSize; i < a.dv; i += kWarpSize)
        y[i] = ((o[i] * inv) * a.w[i]) * silu_(z[i]);
}

struct GatedNormF16Args {
    CMatF o, z;
    const float *w;
    int32_t n_v_heads;
    int32_t dv;
    float eps;
    F16Out out;
    int staged;  // the row's values staged in shared memory after head_inv (f16_rows.cuh)
};

// The fp16 producer twin (f16_rows.cuh): one block per row; warp j takes heads j, j + 8, ...
// and computes each head's inverse RMS exactly as gated_rms_norm_kernel's warp does (the same
// lanes, the same butterfly) into shared memory; then the row's values as the twin computes them.
__global__ void __launch_bounds__(kF16RowThreads) gated_rms_norm_f16_kernel(const __grid_constant__ GatedNormF16Args a) {
    extern __shared__ float head_inv[];  // [n_v_heads], then [cols] staged values when staged
    __shared__ float red[kWarpSize];
    const int64_t r = blockIdx.x;
    const float *o = a.o.ptr + r * a.o.ld, *z = a.z.ptr + r * a.z.ld;
    const int warp = threadIdx.x / kWarpSize, n_warps = blockDim.x / kWarpSize;
    for (int h = warp; h < a.n_v_heads; h += n_warps) {
        const float s = warp_sum_squares(o + (int64_t)h * a.dv, a.dv);
        if (threadIdx.x % kWarpSize == 0) head_inv[h] = 1.0f / sqrtf(s / (float)a.dv + a.eps);
    }
    __syncthreads();
    const int64_t cols = (int64_t)a.n_v_heads * a.dv;
    f16_write_row(a.out, r, cols, [&](int64_t c) {
        const int ci = (int)c;
        return ((o[c] * head_inv[ci / a.dv]) * a.w[ci % a.dv]) * silu_(z[c]);
    }, red, a.staged ? head_inv + a.n_v_heads : nullptr);
}

// The register form (f16_rows.cuh): warp j holds heads j, j + 8, ... (at most HW of them) with
// lane l owning elements l + 32 i of each (dv = 32 PER), all loaded before the first use; each
// head's inverse RMS is warp_sum_squares' loop on those registers (the same lanes, order and
// butterfly), each value the twin's expression: the same bits as the staged kernel.
template <int PER, int HW>
__global__ void __launch_bounds__(kF16RowThreads) gated_rms_norm_f16_reg_kernel(const __grid_constant__ GatedNormF16Args a) {
    __shared__ float red[kWarpSize];
    const int64_t r = blockIdx.x;
    const float *o = a.o.ptr + r * a.o.ld, *z = a.z.ptr + r * a.z.ld;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, n_warps = blockDim.x / kWarpSize;
    float ov[HW][PER], zv[HW][PER];
#pragma unroll
    for (int k = 0; k < HW; ++k) {
        const int h = warp + k * n_warps;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int64_t c = (int64_t)h * a.dv + lane + kWarpSize * j;
            ov[k][j] = h < a.n_v_heads ? o[c] : 0.0f;
            zv[k][j] = h < a.n_v_heads ? z[c] : 0.0f;
        }
    }
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < HW; ++k) {
        if (warp + k * n_warps >= a.n_v_heads) continue;  // warp-uniform
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < PER; ++j) ss = fmaf(ov[k][j], ov[k][j], ss);
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)a.dv + a.eps);
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            ov[k][j] = ((ov[k][j] * inv) * a.w[lane + kWarpSize * j]) * silu_(zv[k][j]);
            m = fmaxf(m, fabsf(ov[k][j]));
        }
    }
    float scale, inv_row;
    f16_block_scale(m, red, &scale, &inv_row);
    __half *h16 = a.out.x16 + r * a.out.ld16;
#pragma unroll
    for (int k = 0; k < HW; ++k) {
        const int h = warp + k * n_warps;
        if (h >= a.n_v_heads) continue;
#pragma unroll
        for (int j = 0; j < PER; ++j)
            h16[(int64_t)h * a.dv + lane + kWarpSize * j] = __float2half_rn(ov[k][j] * scale);
    }
    f16_finish_row(a.out, r, scale, inv_row);
}

// ------------------------------------------------------------------------------ delta-rule scan

constexpr int kScanParts = 8;  // threads per value column: the dk sums split 8 ways
constexpr int kScanTile = 16;  // tokens per shared-memory tile (double-buffered)

struct ScanArgs {
    CMatF q, k, v, beta, g;  // the entry's views (GdnScanArgs)
    float *state;
    MatF o;
    int64_t rows;
    int32_t n_k_heads;
    int32_t dv;
    int32_t vec4;  // q, k, v 16-byte aligned with row strides % 4 == 0: 16-byte async copies
    // Varlen (gdn_scan_rows_varlen): sequence blockIdx.y + seq_base holds rows [row0, row0 + rows)
    // and its own state; null: one sequence of `rows` rows from row 0 with `state`.
    const int64_t *seq_row0;
    const int64_t *seq_rows;
    float *const *seq_state;
    int32_t seq_base;
};

// Sum over the kScanParts lanes of one column (lane bits 0..2). Butterfly: all 8 lanes end
// with the bitwise-same value.
__device__ __forceinline__ float part_sum(float v) {
#pragma unroll
    for (int off = 1; off < kScanParts; off <<= 1) v += __shfl_xor_sync(kFullMask, v, off);
    return v;
}

// Two independent part_sums, interleaved so that each shuffle's latency hides the other's.
// Each value goes through exactly the operations part_sum would apply to it.
__device__ __forceinline__ void part_sum2(float &a, float &b) {
#pragma unroll
    for (int off = 1; off < kScanParts; off <<= 1) {
        const float ta = __shfl_xor_sync(kFullMask, a, off);
        const float tb = __shfl_xor_sync(kFullMask, b, off);
        a += ta;
        b += tb;
    }
}

// sum_i S[i] * x[p + 8 i] with A interleaved accumulators (shorter dependency chains), combined
// in a fixed tree: ((acc0 + acc1) + (acc2 + acc3)).
template <int N>
__device__ __forceinline__ float dot_part(const float (&S)[N], const float *x, int p) {
    constexpr int A = N < 4 ? N : 4;
    float acc[A];
#pragma unroll
    for (int i = 0; i < A; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i % A] = fmaf(S[i], x[p + kScanParts * i], acc[i % A]);
    if constexpr (A == 4) return (acc[0] + acc[1]) + (acc[2] + acc[3]);
    else if constexpr (A == 2) return acc[0] + acc[1];
    else return acc[0];
}

// Block = (value head j, value columns [col0, col0 + COLS)). Thread (c = tid / 8, p = tid % 8)
// holds S[a][col0 + c] for a = p + 8 i, i < DK/8, in registers for the whole call. Key rows are
// strided over the 8 parts so that a warp's shared-memory reads of k/q hit 8 distinct banks.
// Token rows are staged with cp.async into one half of a double buffer while the other half is
// being consumed, so global latency is off the sequential path. Varlen: blockIdx.y picks the
// sequence (its rows and state); every token's arithmetic is the one-sequence kernel's.
template <int DK, int COLS>
__global__ void __launch_bounds__(COLS *kScanParts) scan_kernel(const __grid_constant__ ScanArgs a) {
    constexpr int N = DK / kScanParts;  // state entries per thread
    constexpr int kThreads = COLS * kScanParts;
    __shared__ __align__(16) float sk[2][kScanTile][DK];
    __shared__ __align__(16) float sq[2][kScanTile][DK];
    __shared__ __align__(16) float sv[2][kScanTile][COLS];
    __shared__ float sbeta[2][kScanTile];
    __shared__ float sg[2][kScanTile];
    __shared__ float so[kScanTile][COLS];
    __shared__ float sS[DK][COLS];  // state slice in transit (coalesced row segments)

    const int tid = threadIdx.x;
    const int p = tid % kScanParts;
    const int c = tid / kScanParts;
    const int blocks_per_head = a.dv / COLS;
    const int j = blockIdx.x / blocks_per_head;
    const int col0 = (blockIdx.x % blocks_per_head) * COLS;
    const int jk = j % a.n_k_heads;                   // tiled pairing (qwen35 GGUF, spec.md G6)
    const int64_t hv_col = (int64_t)j * a.dv + col0;  // this block's columns in v / o rows
    const int64_t hk_col = (int64_t)jk * DK;          // the paired key head in q / k rows
    // This block's sequence: rows [r0, r0 + rows) of the operands and its state.
    int64_t r0 = 0, rows = a.rows;
    float *state_base = a.state;
    if (a.seq_rows != nullptr) {
        const int64_t s = (int64_t)a.seq_base + blockIdx.y;
        r0 = a.seq_row0[s];
        rows = a.seq_rows[s];
        state_base = a.seq_state[s];
    }
    float *state = state_base + (int64_t)j * DK * a.dv + col0;

    // Issue the async copies of tile [t0, t0 + nt) into buffer b, as one commit group: k and q
    // rows, then v rows, in pieces of V floats (V = 4: 16-byte copies; V = 1: 4-byte copies).
    const auto stage = [&](int b, int64_t t0, int nt) {
        const auto copy_kqv = [&](auto piece) {
            constexpr int V = decltype(piece)::value;
            for (int e = tid; e < nt * (DK / V); e += kThreads) {
                const int tt = e / (DK / V), d = (e % (DK / V)) * V;
                __pipeline_memcpy_async(&sk[b][tt][d], a.k.ptr + (r0 + t0 + tt) * a.k.ld + hk_col + d, 4 * V);
                __pipeline_memcpy_async(&sq[b][tt][d], a.q.ptr + (r0 + t0 + tt) * a.q.ld + hk_col + d, 4 * V);
            }
            for (int e = tid; e < nt * (COLS / V); e += kThreads) {
                const int tt = e / (COLS / V), cc = (e % (COLS / V)) * V;
                __pipeline_memcpy_async(&sv[b][tt][cc], a.v.ptr + (r0 + t0 + tt) * a.v.ld + hv_col + cc, 4 * V);
            }
        };
        if (a.vec4) copy_kqv(std::integral_constant<int, 4>{});
        else copy_kqv(std::integral_constant<int, 1>{});
        for (int e = tid; e < nt; e += kThreads) {
            __pipeline_memcpy_async(&sbeta[b][e], a.beta.ptr + (r0 + t0 + e) * a.beta.ld + j, 4);
            __pipeline_memcpy_async(&sg[b][e], a.g.ptr + (r0 + t0 + e) * a.g.ld + j, 4);
        }
        __pipeline_commit();
    };
    const auto tile_rows = [&](int64_t t0) {
        return rows - t0 < kScanTile ? (int)(rows - t0) : kScanTile;
    };

    stage(0, 0, tile_rows(0));  // the first tile's copies overlap the state load
    for (int e = tid; e < DK * COLS; e += kThreads)
        sS[e / COLS][e % COLS] = state[(int64_t)(e / COLS) * a.dv + e % COLS];
    __syncthreads();
    float S[N];
#pragma unroll
    for (int i = 0; i < N; ++i) S[i] = sS[p + kScanParts * i][c];

    int cur = 0;
    for (int64_t t0 = 0; t0 < rows; t0 += kScanTile, cur ^= 1) {
        const int nt = tile_rows(t0);
        if (t0 + kScanTile < rows) stage(cur ^ 1, t0 + kScanTile, tile_rows(t0 + kScanTile));
        else __pipeline_commit();  // an empty group keeps "all but the newest" meaning this tile
        __pipeline_wait_prior(1);  // this thread's copies of the current tile have landed
        __syncthreads();           // ... and everyone else's
        const float(*k)[DK] = sk[cur];
        const float(*q)[DK] = sq[cur];
        // Token 0 of the tile: decay, then (S^T k) partial, reduced.
        float decay = expf(sg[cur][0]);  // g <= 0: decay in (0, 1]
#pragma unroll
        for (int i = 0; i < N; ++i) S[i] *= decay;
        float kv = part_sum(dot_part<N>(S, k[0], p));
        for (int tt = 0; tt < nt; ++tt) {
            const float err = (sv[cur][tt][c] - kv) * sbeta[cur][tt];
#pragma unroll
            for (int i = 0; i < N; ++i) S[i] = fmaf(k[tt][p + kScanParts * i], err, S[i]);
            float oq = dot_part<N>(S, q[tt], p);  // (S^T q) partial, after the update
            if (tt + 1 < nt) {
                // The next token's decay and (S^T k) partial need only the updated S: start
                // them now and reduce both partials together.
                decay = expf(sg[cur][tt + 1]);
#pragma unroll
                for (int i = 0; i < N; ++i) S[i] *= decay;
                float kvn = dot_part<N>(S, k[tt + 1], p);
                part_sum2(oq, kvn);
                kv = kvn;
            } else {
                oq = part_sum(oq);
            }
            if (p == 0) so[tt][c] = oq;
        }
        __syncthreads();  // so[] complete; buffer `cur` fully read before it is refilled
        for (int e = tid; e < nt * COLS; e += kThreads) {
            const int tt = e / COLS, cc = e % COLS;
            a.o.ptr[(r0 + t0 + tt) * a.o.ld + hv_col + cc] = so[tt][cc];
        }
        // so[] is written again only after the next tile's __syncthreads: these reads are done.
    }

#pragma unroll
    for (int i = 0; i < N; ++i) sS[p + kScanParts * i][c] = S[i];
    __syncthreads();
    for (int e = tid; e < DK * COLS; e += kThreads)
        state[(int64_t)(e / COLS) * a.dv + e % COLS] = sS[e / COLS][e % COLS];
}

// The conv kernels' instance for kc in [2, kGdnMaxConvKernel]: f(std::integral_constant<int,
// kc>); false for any other kc (the smallest fit of the exact sizes is kc itself).
template <class F>
bool with_conv_kc(int32_t kc, F &&f) {
    static_assert(kGdnMaxConvKernel == 8, "the instance list below ends at kGdnMaxConvKernel");
    return kc >= 2 && with_smallest_fit<2, 3, 4, 5, 6, 7, 8>(kc, f);
}

bool scan_dim_ok(int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

}  // namespace

// ------------------------------------------------------------------------------ entries

pf_status gdn_conv1d_rows(CMatF mm, float *window, const float *weight, MatF uu, int64_t rows,
                          int64_t conv_dim, int32_t kc, cudaStream_t stream) {
    const float *m = mm.ptr;
    float *u = uu.ptr;
    const int64_t ldm = mm.ld, ldu = uu.ld;
    PF_CHECK_ARG(rows >= 0, "gdn_conv1d_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(conv_dim >= 1, "gdn_conv1d_rows: conv_dim=%lld must be >= 1", (long long)conv_dim);
    PF_CHECK_ARG(kc >= 2 && kc <= kGdnMaxConvKernel, "gdn_conv1d_rows: kc=%d must be in [2, %d]",
                 kc, kGdnMaxConvKernel);
    PF_CHECK_ARG(ldm >= conv_dim && ldu >= conv_dim,
                 "gdn_conv1d_rows: ldm=%lld / ldu=%lld < conv_dim=%lld", (long long)ldm,
                 (long long)ldu, (long long)conv_dim);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(m && window && weight && u, "gdn_conv1d_rows: null pointer");
    // Rows per thread: at least kConvMinChunk, more when gridDim.y would exceed its limit.
    int64_t chunk = (rows + kMaxGridY - 1) / kMaxGridY;
    if (chunk < kConvMinChunk) chunk = kConvMinChunk;
    const ConvArgs a{{mm, window, weight, uu, rows, conv_dim}, chunk};
    const int64_t gx = (conv_dim + kConvThreads - 1) / kConvThreads;
    PF_CHECK_ARG(gx <= kMaxGridX, "gdn_conv1d_rows: conv_dim=%lld too large", (long long)conv_dim);
    const dim3 grid((unsigned)gx, (unsigned)((rows + chunk - 1) / chunk), 1);
    if (!with_conv_kc(kc, [&](auto KC) { conv1d_silu_kernel<KC><<<grid, kConvThreads, 0, stream>>>(a); }))
        return fail(PF_STATUS_INTERNAL, "gdn_conv1d_rows: kc=%d not dispatched", kc);
    PF_LAUNCH_CHECK("conv1d_silu_kernel<%d>", kc);
    return PF_STATUS_OK;
}

pf_status gdn_l2norm_rows(MatF xx, int64_t rows, int32_t n_heads, int64_t head_stride,
                          int32_t head_dim, float eps, float scale, cudaStream_t stream) {
    float *x = xx.ptr;
    const int64_t ld = xx.ld;
    PF_CHECK_ARG(rows >= 0, "gdn_l2norm_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(n_heads >= 1 && head_dim >= 1, "gdn_l2norm_rows: n_heads=%d head_dim=%d must be >= 1",
                 n_heads, head_dim);
    PF_CHECK_ARG(head_stride >= head_dim, "gdn_l2norm_rows: head_stride=%lld < head_dim=%d",
                 (long long)head_stride, head_dim);
    PF_CHECK_ARG(ld >= (int64_t)(n_heads - 1) * head_stride + head_dim,
                 "gdn_l2norm_rows: ld=%lld < (n_heads-1)*head_stride + head_dim", (long long)ld);
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "gdn_l2norm_rows: eps=%g must be finite, >= 0",
                 (double)eps);
    PF_CHECK_ARG(std::isfinite(scale), "gdn_l2norm_rows: scale=%g must be finite", (double)scale);
    PF_CHECK_ARG(rows * n_heads / kHeadWarps < kMaxGridX, "gdn_l2norm_rows: rows=%lld too large",
                 (long long)rows);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(x != nullptr, "gdn_l2norm_rows: x is NULL");
    const L2Args a{xx, rows, n_heads, head_stride, head_dim, eps, scale};
    const int64_t warps = rows * n_heads;
    l2norm_kernel<<<head_warp_blocks(warps), kHeadWarps * kWarpSize, 0, stream>>>(a);
    PF_LAUNCH_CHECK("l2norm_kernel");
    return PF_STATUS_OK;
}

bool gdn_conv1d_l2norm_supported(int32_t dk, int32_t kc) {
    return dk == 4 * kWarpSize && kc >= 2 && kc <= kGdnMaxConvKernel;
}

pf_status gdn_conv1d_l2norm_rows(const GdnConvNormArgs &args, cudaStream_t stream) {
    const float *m = args.m.ptr, *weight = args.weight;
    float *u = args.u.ptr, *window = args.window;
    const int64_t ldm = args.m.ld, ldu = args.u.ld, rows = args.rows, conv_dim = args.conv_dim;
    const int32_t kc = args.kc, n_k_heads = args.n_k_heads, dk = args.dk;
    const float eps = args.eps, q_scale = args.q_scale;
    PF_CHECK_ARG(rows >= 0, "gdn_conv1d_l2norm_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(gdn_conv1d_l2norm_supported(dk, kc),
                 "gdn_conv1d_l2norm_rows: dk=%d (must be %d), kc=%d (must be in [2, %d])", dk,
                 4 * kWarpSize, kc, kGdnMaxConvKernel);
    PF_CHECK_ARG(n_k_heads >= 1 && conv_dim >= 2 * (int64_t)n_k_heads * dk,
                 "gdn_conv1d_l2norm_rows: conv_dim=%lld < 2 * n_k_heads=%d * dk=%d",
                 (long long)conv_dim, n_k_heads, dk);
    PF_CHECK_ARG(ldm >= conv_dim && ldu >= conv_dim,
                 "gdn_conv1d_l2norm_rows: ldm=%lld / ldu=%lld < conv_dim=%lld", (long long)ldm,
                 (long long)ldu, (long long)conv_dim);
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps) && std::isfinite(q_scale),
                 "gdn_conv1d_l2norm_rows: eps=%g must be finite, >= 0; q_scale=%g finite",
                 (double)eps, (double)q_scale);
    const int64_t gx = (rows + kConvNormRows - 1) / kConvNormRows;
    const int64_t gy = (conv_dim + kConvNormWarps * dk - 1) / (kConvNormWarps * dk);
    PF_CHECK_ARG(gx <= kMaxGridX && gy <= kMaxGridY,
                 "gdn_conv1d_l2norm_rows: rows=%lld / conv_dim=%lld too large", (long long)rows,
                 (long long)conv_dim);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(m && window && weight && u, "gdn_conv1d_l2norm_rows: null pointer");
    const ConvNormArgs a{{args.m, window, weight, args.u, rows, conv_dim}, n_k_heads, eps, q_scale};
    const dim3 grid((unsigned)gx, (unsigned)gy, 1);
    constexpr int kThreads = kConvNormWarps * kWarpSize;
    if (!with_conv_kc(kc, [&](auto KC) { conv1d_silu_l2norm_kernel<KC, 4><<<grid, kThreads, 0, stream>>>(a); }))
        return fail(PF_STATUS_INTERNAL, "gdn_conv1d_l2norm_rows: kc=%d not dispatched", kc);
    PF_LAUNCH_CHECK("conv1d_silu_l2norm_kernel<%d, 4>", kc);
    return PF_STATUS_OK;
}

pf_status gdn_conv1d_l2norm_rows_varlen(const GdnConvNormArgs &args, const GdnConvSeqs &seqs, cudaStream_t stream) {
    const int64_t conv_dim = args.conv_dim, max_rows = seqs.max_rows;
    const int32_t kc = args.kc, n_k_heads = args.n_k_heads, dk = args.dk;
    PF_CHECK_ARG(seqs.n >= 0 && seqs.n <= kMaxGridY, "gdn_conv1d_l2norm_rows_varlen: n=%d must be in [0, %lld]",
                 seqs.n, (long long)kMaxGridY);
    PF_CHECK_ARG(max_rows >= 1 && max_rows <= args.rows,
                 "gdn_conv1d_l2norm_rows_varlen: max_rows=%lld must be in [1, rows=%lld]", (long long)max_rows,
                 (long long)args.rows);
    PF_CHECK_ARG(gdn_conv1d_l2norm_supported(dk, kc),
                 "gdn_conv1d_l2norm_rows_varlen: dk=%d (must be %d), kc=%d (must be in [2, %d])", dk,
                 4 * kWarpSize, kc, kGdnMaxConvKernel);
    PF_CHECK_ARG(n_k_heads >= 1 && conv_dim >= 2 * (int64_t)n_k_heads * dk,
                 "gdn_conv1d_l2norm_rows_varlen: conv_dim=%lld < 2 * n_k_heads=%d * dk=%d", (long long)conv_dim,
                 n_k_heads, dk);
    PF_CHECK_ARG(args.m.ld >= conv_dim && args.u.ld >= conv_dim,
                 "gdn_conv1d_l2norm_rows_varlen: ldm=%lld / ldu=%lld < conv_dim=%lld", (long long)args.m.ld,
                 (long long)args.u.ld, (long long)conv_dim);
    PF_CHECK_ARG(std::isfinite(args.eps) && args.eps >= 0.0f && std::isfinite(args.q_scale),
                 "gdn_conv1d_l2norm_rows_varlen: eps=%g must be finite, >= 0; q_scale=%g finite",
                 (double)args.eps, (double)args.q_scale);
    if (seqs.n == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(args.m.ptr && args.u.ptr && args.weight && seqs.row0 && seqs.rows && seqs.windows,
                 "gdn_conv1d_l2norm_rows_varlen: null pointer");
    const int64_t gx = (max_rows + kConvNormRows - 1) / kConvNormRows;
    const int64_t gy = (conv_dim + kConvNormWarps * dk - 1) / (kConvNormWarps * dk);
    PF_CHECK_ARG(gy <= kMaxGridY, "gdn_conv1d_l2norm_rows_varlen: conv_dim=%lld too large", (long long)conv_dim);
    ConvNormArgs a{{args.m, nullptr, args.weight, args.u, 0, conv_dim}, n_k_heads, args.eps, args.q_scale};
    a.seq_row0 = seqs.row0;
    a.seq_rows = seqs.rows;
    a.seq_window = seqs.windows;
    const dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)seqs.n);
    constexpr int kThreads = kConvNormWarps * kWarpSize;
    if (!with_conv_kc(kc, [&](auto KC) { conv1d_silu_l2norm_varlen_kernel<KC, 4><<<grid, kThreads, 0, stream>>>(a); }))
        return fail(PF_STATUS_INTERNAL, "gdn_conv1d_l2norm_rows_varlen: kc=%d not dispatched", kc);
    PF_LAUNCH_CHECK("conv1d_silu_l2norm_varlen_kernel<%d, 4>", kc);
    return PF_STATUS_OK;
}

pf_status gdn_gates_rows(const GdnGatesArgs &args, cudaStream_t stream) {
    const float *b = args.b.ptr, *alpha = args.alpha.ptr, *ssm_a = args.ssm_a, *dt_bias = args.dt_bias;
    float *beta = args.beta.ptr, *g = args.g.ptr;
    const int64_t ldb = args.b.ld, ld_alpha = args.alpha.ld, ld_beta = args.beta.ld, ld_g = args.g.ld;
    const int64_t rows = args.rows;
    const int32_t n_v_heads = args.n_v_heads;
    PF_CHECK_ARG(rows >= 0, "gdn_gates_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(n_v_heads >= 1, "gdn_gates_rows: n_v_heads=%d must be >= 1", n_v_heads);
    PF_CHECK_ARG(ldb >= n_v_heads && ld_alpha >= n_v_heads && ld_beta >= n_v_heads &&
                     ld_g >= n_v_heads,
                 "gdn_gates_rows: row strides ldb=%lld ld_alpha=%lld ld_beta=%lld ld_g=%lld must "
                 "be >= n_v_heads=%d",
                 (long long)ldb, (long long)ld_alpha, (long long)ld_beta, (long long)ld_g,
                 n_v_heads);
    const int block = 128;
    PF_CHECK_ARG(rows * n_v_heads / block < kMaxGridX, "gdn_gates_rows: rows=%lld too large",
                 (long long)rows);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(b && alpha && ssm_a && dt_bias && beta && g, "gdn_gates_rows: null pointer");
    const GatesArgs a{args.b, args.alpha, ssm_a, dt_bias, args.beta, args.g, rows, n_v_heads};
    const int64_t n = rows * n_v_heads;
    gates_kernel<<<(unsigned)((n + block - 1) / block), block, 0, stream>>>(a);
    PF_LAUNCH_CHECK("gates_kernel");
    return PF_STATUS_OK;
}

pf_status gdn_gated_rms_norm_rows(const GdnGatedNormArgs &args, MatF yy, cudaStream_t stream) {
    const float *o = args.o.ptr, *z = args.z.ptr, *w = args.w;
    float *y = yy.ptr;
    const int64_t ldo = args.o.ld, ldz = args.z.ld, ldy = yy.ld, rows = args.rows;
    const int32_t n_v_heads = args.n_v_heads, dv = args.dv;
    const float eps = args.eps;
    PF_CHECK_ARG(rows >= 0, "gdn_gated_rms_norm_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(n_v_heads >= 1 && dv >= 1,
                 "gdn_gated_rms_norm_rows: n_v_heads=%d dv=%d must be >= 1", n_v_heads, dv);
    const int64_t width = (int64_t)n_v_heads * dv;
    PF_CHECK_ARG(ldo >= width && ldz >= width && ldy >= width,
                 "gdn_gated_rms_norm_rows: ldo=%lld ldz=%lld ldy=%lld must be >= n_v_heads*dv=%lld",
                 (long long)ldo, (long long)ldz, (long long)ldy, (long long)width);
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps),
                 "gdn_gated_rms_norm_rows: eps=%g must be finite, >= 0", (double)eps);
    PF_CHECK_ARG(rows * n_v_heads / kHeadWarps < kMaxGridX,
                 "gdn_gated_rms_norm_rows: rows=%lld too large", (long long)rows);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(o && z && w && y, "gdn_gated_rms_norm_rows: null pointer");
    const GatedNormArgs a{args.o, args.z, w, yy, rows, n_v_heads, dv, eps};
    const int64_t warps = rows * n_v_heads;
    gated_rms_norm_kernel<<<head_warp_blocks(warps), kHeadWarps * kWarpSize, 0, stream>>>(a);
    PF_LAUNCH_CHECK("gated_rms_norm_kernel");
    return PF_STATUS_OK;
}

pf_status gdn_gated_rms_norm_rows_f16(const GdnGatedNormArgs &args, const F16Out &out, cudaStream_t stream) {
    const float *o = args.o.ptr, *z = args.z.ptr, *w = args.w;
    const int64_t ldo = args.o.ld, ldz = args.z.ld, rows = args.rows;
    const int32_t n_v_heads = args.n_v_heads, dv = args.dv;
    const float eps = args.eps;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "gdn_gated_rms_norm_rows_f16: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(n_v_heads >= 1 && dv >= 1 && n_v_heads <= kMaxGatedF16Heads,
                 "gdn_gated_rms_norm_rows_f16: n_v_heads=%d (<= %d) dv=%d", n_v_heads, kMaxGatedF16Heads, dv);
    const int64_t width = (int64_t)n_v_heads * dv;
    PF_CHECK_ARG(width <= INT_MAX && ldo >= width && ldz >= width && out.ld16 >= width,
                 "gdn_gated_rms_norm_rows_f16: ldo=%lld ldz=%lld ld16=%lld must be >= n_v_heads*dv=%lld",
                 (long long)ldo, (long long)ldz, (long long)out.ld16, (long long)width);
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps),
                 "gdn_gated_rms_norm_rows_f16: eps=%g must be finite, >= 0", (double)eps);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(o && z && w && out.x16 && out.inv, "gdn_gated_rms_norm_rows_f16: null pointer");
    // The register form (dv = 128: every qwen35), heads per warp from 1 to 6.
    if (out.form.regs && dv == 4 * kWarpSize &&
        with_smallest_fit<1, 2, 4, 6>(ceil_div(n_v_heads, kF16RowThreads / kWarpSize), [&](auto hw) {
            const GatedNormF16Args a{args.o, args.z, w, n_v_heads, dv, eps, out, 0};
            gated_rms_norm_f16_reg_kernel<4, decltype(hw)::value><<<(unsigned)rows, kF16RowThreads, 0, stream>>>(a);
        })) {
        PF_LAUNCH_CHECK("gated_rms_norm_f16_reg_kernel");
        return PF_STATUS_OK;
    }
    const size_t heads = size_t(n_v_heads) * sizeof(float), stage = f16_stage_bytes(width, out.form, heads);
    const GatedNormF16Args a{args.o, args.z, w, n_v_heads, dv, eps, out, stage ? 1 : 0};
    gated_rms_norm_f16_kernel<<<(unsigned)rows, kF16RowThreads, heads + stage, stream>>>(a);
    PF_LAUNCH_CHECK("gated_rms_norm_f16_kernel");
    return PF_STATUS_OK;
}

namespace {

// gdn_scan_rows (seqs null: one sequence of args.rows rows with args.state) and
// gdn_scan_rows_varlen (the sequences of seqs; `fn` names the entry in errors).
pf_status scan_rows(const char *fn, const GdnScanArgs &args, const GdnSeqs *seqs, cudaStream_t stream) {
    const float *q = args.q.ptr, *k = args.k.ptr, *v = args.v.ptr, *beta = args.beta.ptr, *g = args.g.ptr;
    float *state = args.state, *o = args.o.ptr;
    const int64_t ldq = args.q.ld, ldk = args.k.ld, ldv = args.v.ld, ld_beta = args.beta.ld, ld_g = args.g.ld,
                  ldo = args.o.ld, rows = args.rows;
    const int32_t n_k_heads = args.n_k_heads, n_v_heads = args.n_v_heads, dk = args.dk, dv = args.dv;
    PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
    PF_CHECK_ARG(n_k_heads >= 1 && n_v_heads >= 1 && n_v_heads % n_k_heads == 0,
                 "%s: n_v_heads=%d must be a positive multiple of n_k_heads=%d", fn,
                 n_v_heads, n_k_heads);
    PF_CHECK_ARG(scan_dim_ok(dk) && scan_dim_ok(dv),
                 "%s: dk=%d, dv=%d; each must be 16, 32, 64 or 128", fn, dk, dv);
    const int64_t kw = (int64_t)n_k_heads * dk, vw = (int64_t)n_v_heads * dv;
    PF_CHECK_ARG(ldq >= kw && ldk >= kw,
                 "%s: ldq=%lld / ldk=%lld < n_k_heads*dk=%lld", fn, (long long)ldq,
                 (long long)ldk, (long long)kw);
    PF_CHECK_ARG(ldv >= vw && ldo >= vw, "%s: ldv=%lld / ldo=%lld < n_v_heads*dv=%lld", fn,
                 (long long)ldv, (long long)ldo, (long long)vw);
    PF_CHECK_ARG(ld_beta >= n_v_heads && ld_g >= n_v_heads,
                 "%s: ld_beta=%lld / ld_g=%lld < n_v_heads=%d", fn, (long long)ld_beta,
                 (long long)ld_g, n_v_heads);
    int32_t n = 1;  // sequences (grid y)
    if (seqs != nullptr) {
        n = seqs->n;
        PF_CHECK_ARG(n >= 0, "%s: n=%d sequences < 0", fn, n);
        if (n == 0) return PF_STATUS_OK;
        PF_CHECK_ARG(seqs->host_rows != nullptr, "%s: host_rows is NULL", fn);
        int64_t sum = 0;
        for (int32_t i = 0; i < n; ++i) {
            PF_CHECK_ARG(seqs->host_rows[i] >= 1, "%s: sequence %d has %lld rows (>= 1 each)", fn, i,
                         (long long)seqs->host_rows[i]);
            sum += seqs->host_rows[i];
        }
        PF_CHECK_ARG(sum <= rows, "%s: the sequences hold %lld rows, the views %lld", fn,
                     (long long)sum, (long long)rows);
        PF_CHECK_ARG(seqs->row0 && seqs->rows && seqs->state, "%s: null sequence table", fn);
    }
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(q && k && v && beta && g && o && (seqs || state), "%s: null pointer", fn);
    const auto aligned = [](const void *ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    // Row r of a sequence starts (row0 + r) * ld floats in: 16-byte aligned with the base.
    const int32_t vec4 = aligned(q) && aligned(k) && aligned(v) && ldq % 4 == 0 && ldk % 4 == 0 &&
                         ldv % 4 == 0;
    ScanArgs a{args.q, args.k, args.v, args.beta, args.g, state, args.o, rows, n_k_heads, dv, vec4, nullptr,
               nullptr, nullptr, 0};
    if (seqs != nullptr) {
        a.seq_row0 = seqs->row0;
        a.seq_rows = seqs->rows;
        a.seq_state = seqs->state;
    }
    // 16 value columns per block (128 threads) when that gives about 2 blocks per SM: 2 x SMs
    // rounded down to a multiple of 32, at least 32 (256 on a 132-SM H100/H200: Hv*dv >= 4096,
    // e.g. Hv = 32, dv = 128); else 8 columns (64 threads) so that small head counts (Hv = 16)
    // still fill the GPU. Either way one thread holds dk/8 state entries and the per-token
    // arithmetic is the same: the choice changes speed, never a bit of the result (so a
    // sequence of a varlen call gets the blocks it would get alone).
    int sms = 0;
    PF_TRY(device_sm_count(&sms));
    const int64_t min_wide_blocks = std::max<int64_t>(32, 2 * int64_t(sms) / 32 * 32);
    const bool wide = vw / 16 >= min_wide_blocks;
    const unsigned gx = (unsigned)(vw / (wide ? 16 : 8));
    // Sequences in launches of at most kMaxGridY (grid y).
    for (int32_t base = 0; base < n; base += int32_t(kMaxGridY)) {
        a.seq_base = base;
        const dim3 grid(gx, unsigned(std::min<int64_t>(n - base, kMaxGridY)), 1);
#define PF_SCAN_CASE(DK)                                                                  \
    case DK:                                                                              \
        if (wide) scan_kernel<DK, 16><<<grid, 16 * kScanParts, 0, stream>>>(a);           \
        else scan_kernel<DK, 8><<<grid, 8 * kScanParts, 0, stream>>>(a);                  \
        break;
        switch (dk) {
            PF_SCAN_CASE(16)
            PF_SCAN_CASE(32)
            PF_SCAN_CASE(64)
            PF_SCAN_CASE(128)
            default: return fail(PF_STATUS_INTERNAL, "%s: dk=%d not dispatched", fn, dk);
        }
#undef PF_SCAN_CASE
        PF_LAUNCH_CHECK("scan_kernel<%d, %d>", dk, wide ? 16 : 8);
    }
    return PF_STATUS_OK;
}

}  // namespace

pf_status gdn_scan_rows(const GdnScanArgs &args, cudaStream_t stream) {
    return scan_rows("gdn_scan_rows", args, nullptr, stream);
}

pf_status gdn_scan_rows_varlen(const GdnScanArgs &args, const GdnSeqs &seqs, cudaStream_t stream) {
    return scan_rows("gdn_scan_rows_varlen", args, &seqs, stream);
}

}  // namespace pf
