// attention.cu — KV-cache writes, causal grouped attention (cuBLAS and flash paths).
// Shapes and layouts are documented at the declarations in attention.cuh.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/attention/attention.cuh"
#include "kernels/attention/qk_math.cuh"
#include "ptx/common.cuh"
#include "ptx/mma.cuh"

namespace pf {
namespace {

constexpr size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// to_half_sat, from_float<T>: the cache conversion, in qk_math.cuh (the fused q/k kernel writes
// the cache with the same function).

// Grid size of a grid-stride loop over `n` elements with 256-thread blocks; capped because each
// thread loops anyway and 2^20 blocks already cover every SM many times.
unsigned grid_for(int64_t n) {
    return unsigned(std::min<int64_t>(std::max<int64_t>(ceil_div(n, 256), 1), int64_t(1) << 20));
}

// ---------------------------------------------------------------------------------- kv_write

struct KvWriteArgs {
    CMatF k, v;  // the entry's views
    int64_t rows, kv_dim;
    void *k_cache, *v_cache;  // the caches' row 0 (or the pools')
    int64_t pos0;
    const int64_t *pos0_dev;  // when set, pos0 is read here when the kernel runs
    KvPages pages;            // position p at row pages.row(p)
};

template <typename T>
__global__ void kv_write_kernel(const __grid_constant__ KvWriteArgs a) {
    const int64_t pos0 = a.pos0_dev ? *a.pos0_dev : a.pos0;
    T *kc = static_cast<T *>(a.k_cache);
    T *vc = static_cast<T *>(a.v_cache);
    const int64_t total = a.rows * a.kv_dim;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / a.kv_dim, c = i - r * a.kv_dim;
        const int64_t o = a.pages.row(pos0 + r) * a.kv_dim + c;
        kc[o] = from_float<T>(a.k.ptr[r * a.k.ld + c]);
        vc[o] = from_float<T>(a.v.ptr[r * a.v.ld + c]);
    }
}

// The cuBLAS path's view of paged caches: dst row j = the pool's row pages.row(j), j < n, in
// 16-byte units (kv_dim * element size is a multiple of 16: the launcher checks) or elements.
struct GatherKvArgs {
    const void *k, *v;
    void *dk, *dv;
    int64_t n, row_bytes;
    KvPages pages;
};

template <typename U>
__global__ void gather_kv_kernel(const __grid_constant__ GatherKvArgs a) {
    const int64_t per_row = a.row_bytes / int64_t(sizeof(U)), total = a.n * per_row;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t j = i / per_row, c = i - j * per_row;
        const int64_t src = a.pages.row(j) * per_row + c;
        static_cast<U *>(a.dk)[i] = static_cast<const U *>(a.k)[src];
        static_cast<U *>(a.dv)[i] = static_cast<const U *>(a.v)[src];
    }
}

pf_status kv_write_launch(const KvWriteArgs &a, int32_t kv_dtype, cudaStream_t stream) {
    const int64_t rows = a.rows, kv_dim = a.kv_dim;
    if (kv_dtype == PF_KV_F16)
        kv_write_kernel<__half><<<grid_for(rows * kv_dim), 256, 0, stream>>>(a);
    else
        kv_write_kernel<float><<<grid_for(rows * kv_dim), 256, 0, stream>>>(a);
    PF_LAUNCH_CHECK("kv_write_kernel<%s>", kv_dtype == PF_KV_F16 ? "__half" : "float");
    return PF_STATUS_OK;
}

// ------------------------------------------------------------------- cuBLAS path: helpers

// dst[(h * n + t) * D + d] = q[t * ldq + h * qhs + d]: the [H][n][D] layout lets one strided-batched
// GEMM per KV head take its G query heads as G*n consecutive columns.
struct GatherQArgs {
    CMatF q;  // from the pass's first row
    int64_t qhs;
    void *dst;
    int64_t n, H, D;
};

template <typename T>
__global__ void gather_q_kernel(const __grid_constant__ GatherQArgs a) {
    T *dst = static_cast<T *>(a.dst);
    const int64_t total = a.H * a.n * a.D;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t d = i % a.D, ht = i / a.D;
        const int64_t t = ht % a.n, h = ht / a.n;
        dst[i] = from_float<T>(a.q.ptr[t * a.q.ld + h * a.qhs + d]);
    }
}

constexpr int kSoftmaxThreads = 256;

// One block per score row (h, t): row t of a pass sees keys 0..pos0 + t (pos0 = the pass's first
// position); P = exp(s - max) / sum over those, 0 past them (the PV GEMM reads the whole row).
// P may alias the scores (fp32 cache: in place, each element read before it is written by the
// same thread) or be a separate fp16 array.
struct SoftmaxArgs {
    const float *scores;  // [H * n][T]
    void *probs;          // [H * n][T], float or __half
    int64_t n, T, pos0;
};

template <typename P>
__global__ void __launch_bounds__(kSoftmaxThreads) causal_softmax_kernel(const __grid_constant__ SoftmaxArgs a) {
    __shared__ float sh[kSoftmaxThreads / 32];
    const int64_t row = blockIdx.x;
    const int64_t valid = a.pos0 + row % a.n + 1;  // <= T by construction
    const float *s = a.scores + row * a.T;
    P *p = static_cast<P *>(a.probs) + row * a.T;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < valid; j += kSoftmaxThreads) m = fmaxf(m, s[j]);
    m = block_max_serial<kSoftmaxThreads>(m, sh);  // no partial is NaN: fmaxf skips NaN
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < valid; j += kSoftmaxThreads) sum += expf(s[j] - m);
    sum = block_sum_serial<kSoftmaxThreads>(sum, sh);
    const float inv = 1.f / sum;  // sum >= 1 (the max term); NaN scores propagate as NaN
    for (int64_t j = threadIdx.x; j < a.T; j += kSoftmaxThreads)
        p[j] = j < valid ? from_float<P>(expf(s[j] - m) * inv) : from_float<P>(0.f);
}

// -------------------------------------------------------------------------- flash kernel
//
// FlashAttention-2's schedule (Dao, 2023), written for mma.sync.m16n8k16 (fp16 in, fp32 out).
// A block owns one KV head g and a tile of BM = 64 "packed" query rows: packed row m is query row
// t = m / G of head h = g*G + m % G, so the G heads that share KV head g share every K/V tile
// (and a decode step with rows = 1 still fills G rows of the tile). Each of the 4 warps owns 16
// packed rows; per KV tile of BC keys it computes S = Q K^T (16 x BC), applies the causal mask,
// updates the running max / sum (online softmax, base 2) and accumulates O += P V (16 x D).
// Keys past the tile's last visible position are never loaded: that is the causal tile skip.
//
// Fragment layouts of mma.m16n8k16.row.col (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// lane = 4 * gid + tig (gid = lane / 4 in 0..7, tig = lane % 4 in 0..3), each .b32 register
// holding two fp16 of consecutive column (A, C) or k (B) index, the lower index in the low half:
//   A (16x16, row-major): a[0] = A[gid][2tig..+1]     a[1] = A[gid+8][2tig..+1]
//                         a[2] = A[gid][2tig+8..+9]   a[3] = A[gid+8][2tig+8..+9]
//   B (16x8, "col"):      b[0] = B[2tig..+1][gid]     b[1] = B[2tig+8..+9][gid]
//   C (16x8, fp32):       c[0..1] = C[gid][2tig..+1]  c[2..3] = C[gid+8][2tig..+1]
// So the C fragments of n-tiles 2kk and 2kk+1 of S are exactly the A fragment of k-step kk of P
// (the FA2 register reuse: P never leaves registers).

struct FlashArgs {
    CMatF q;  // the launcher's q (AttentionArgs q, ldq)
    int64_t qhs;
    const __half *k_cache, *v_cache;
    int64_t kv_dim;
    KvPages pages;  // key j at row pages.row(j) of the caches
    MatF o;   // the launcher's o (AttentionArgs o, ldo)
    int32_t G;
    int64_t rows, pos0;
    const int64_t *pos0_dev;  // when set, pos0 is read here when the kernel runs (CUDA graphs)
    float scale_log2;  // scale * log2(e): the softmax runs in base 2 (exp2f)
};

constexpr int kFlashBM = 64;        // packed query rows per block
constexpr int kFlashThreads = 128;  // 4 warps x 16 rows

__device__ __forceinline__ uint32_t ld_smem_u32(const __half *p) {
    return *reinterpret_cast<const uint32_t *>(p);  // two consecutive fp16, 4-byte aligned
}

template <int D, int BC>
constexpr size_t flash_smem_bytes() {
    return size_t(kFlashBM + 2 * BC) * (D + 8) * sizeof(__half);
}

template <int D, int BC>
__global__ void __launch_bounds__(kFlashThreads) flash_attn_kernel(const __grid_constant__ FlashArgs a) {
    static_assert(D % 16 == 0 && BC % 16 == 0, "tiles are whole mma steps");
    static_assert(kKvPageGranule % BC == 0, "a key tile lies in one page");
    // Shared rows are padded by 8 halves (16 bytes): the row stride is then 4 banks off a multiple
    // of 32 banks, so the 8 gid rows x 4 tig words of a fragment load hit 32 distinct banks.
    constexpr int LDS = D + 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half *sQ = reinterpret_cast<__half *>(smem_raw);  // [BM][LDS]
    __half *sK = sQ + kFlashBM * LDS;                    // [BC][LDS]
    __half *sV = sK + BC * LDS;                          // [BC][LDS]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int kvh = blockIdx.y;
    // Heaviest tiles (most keys, the end of the chunk) first, so the tail of the grid is short.
    const int64_t m0 = int64_t(gridDim.x - 1 - blockIdx.x) * kFlashBM;
    const int64_t packed = a.rows * a.G;
    const int64_t m_end = m0 + kFlashBM < packed ? m0 + kFlashBM : packed;
    // The grid and shared memory do not depend on the position: the key loop's bound does.
    const int64_t pos0 = a.pos0_dev ? *a.pos0_dev : a.pos0;
    const int64_t n_keys = pos0 + (m_end - 1) / a.G + 1;  // keys visible to the tile's last row

    // Q tile -> fp16 in shared memory (rows past the chunk are zero and never stored).
    for (int idx = threadIdx.x; idx < kFlashBM * D; idx += kFlashThreads) {
        const int r = idx / D, d = idx % D;
        const int64_t m = m0 + r;
        float x = 0.f;
        if (m < packed) {
            const int64_t t = m / a.G, h = int64_t(kvh) * a.G + (m - t * a.G);
            x = a.q.ptr[t * a.q.ld + h * a.qhs + d];
        }
        sQ[r * LDS + d] = to_half_sat(x);
    }

    // This thread's two rows (gid and gid + 8 of the warp's 16): last visible key of each.
    int64_t last_key[2];
    for (int i = 0; i < 2; ++i) {
        const int64_t m = m0 + warp * 16 + gid + 8 * i;
        last_key[i] = std::min(pos0 + m / a.G, n_keys - 1);
    }

    float acc[D / 8][4];  // O, 16 x D per warp: n-tile dt holds columns dt*8 .. dt*8+7
    for (int dt = 0; dt < D / 8; ++dt)
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // running max of the scaled (base-2) scores
    float row_sum[2] = {0.f, 0.f};              // this thread's partial sums (quad-reduced at the end)

    const __half *qw = sQ + warp * 16 * LDS;
    for (int64_t j0 = 0; j0 < n_keys; j0 += BC) {
        __syncthreads();  // all warps are done with the previous K/V tile (and sQ is written)
        // K, V tile: BC rows of D halves, 16-byte vectors; rows past n_keys are zero (P is 0 there,
        // but 0 * uninitialised shared memory could be NaN).
        constexpr int VPR = D / 8;
        // The tile's keys lie in one page (BC divides kKvPageGranule, which divides the pages):
        // one table read per tile.
        const int64_t row0 = a.pages.row(j0);
        for (int idx = threadIdx.x; idx < BC * VPR; idx += kFlashThreads) {
            const int r = idx / VPR, c = (idx % VPR) * 8;
            const int64_t j = j0 + r;
            uint4 kx = make_uint4(0, 0, 0, 0), vx = make_uint4(0, 0, 0, 0);
            if (j < n_keys) {
                const int64_t off = (row0 + r) * a.kv_dim + int64_t(kvh) * D + c;
                kx = *reinterpret_cast<const uint4 *>(a.k_cache + off);
                vx = *reinterpret_cast<const uint4 *>(a.v_cache + off);
            }
            *reinterpret_cast<uint4 *>(sK + r * LDS + c) = kx;
            *reinterpret_cast<uint4 *>(sV + r * LDS + c) = vx;
        }
        __syncthreads();

        // S = Q K^T: B[k][n] = K[j0 + n][k], i.e. B's column n is K's row n (contiguous in k).
        float s[BC / 8][4];
        for (int nt = 0; nt < BC / 8; ++nt)
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t af[4] = {
                ld_smem_u32(qw + gid * LDS + kk * 16 + 2 * tig),
                ld_smem_u32(qw + (gid + 8) * LDS + kk * 16 + 2 * tig),
                ld_smem_u32(qw + gid * LDS + kk * 16 + 2 * tig + 8),
                ld_smem_u32(qw + (gid + 8) * LDS + kk * 16 + 2 * tig + 8)};
#pragma unroll
            for (int nt = 0; nt < BC / 8; ++nt) {
                const __half *kr = sK + (nt * 8 + gid) * LDS + kk * 16 + 2 * tig;
                const uint32_t bf[2] = {ld_smem_u32(kr), ld_smem_u32(kr + 8)};
                mma_m16n8k16(s[nt], af, bf[0], bf[1]);
            }
        }

        // Scale, causal mask (key j visible to a row iff j <= its last key), tile row max.
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1;  // c[0..1]: row gid, c[2..3]: row gid + 8
                const int64_t j = j0 + nt * 8 + 2 * tig + (e & 1);
                const float x = j <= last_key[i] ? s[nt][e] * a.scale_log2 : -INFINITY;
                s[nt][e] = x;
                tile_max[i] = fmaxf(tile_max[i], x);
            }
        float alpha[2], base[2];
        for (int i = 0; i < 2; ++i) {
            // The 4 lanes of a quad (same gid) hold the row's columns: reduce over lane bits 0-1.
            tile_max[i] = quad_max(tile_max[i]);
            const float new_max = fmaxf(row_max[i], tile_max[i]);
            // A row with no visible key so far keeps max -inf; use 0 as the base so that
            // exp2(-inf - base) = 0 instead of NaN. (Key 0 is visible to every row, so this only
            // guards; the first tile always gives a finite max.)
            base[i] = new_max == -INFINITY ? 0.f : new_max;
            alpha[i] = exp2f(row_max[i] - base[i]);  // rescales the old O and sum; 0 on the first tile
            row_max[i] = new_max;
        }
        float tile_sum[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1;
                const float p = exp2f(s[nt][e] - base[i]);
                s[nt][e] = p;
                tile_sum[i] += p;
            }
        for (int i = 0; i < 2; ++i) row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            acc[dt][0] *= alpha[0];
            acc[dt][1] *= alpha[0];
            acc[dt][2] *= alpha[1];
            acc[dt][3] *= alpha[1];
        }

        // O += P V. A = P from the S accumulators (see the layout note above); B[k][n] =
        // V[j0 + kk*16 + k][dt*8 + n]: the two k of a register are two V rows, loaded one by one.
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            const uint32_t pf[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]),
                                    pack_half2(s[2 * kk][2], s[2 * kk][3]),
                                    pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                const __half *vp = sV + (kk * 16 + 2 * tig) * LDS + dt * 8 + gid;
                const uint32_t bf[2] = {pack_halves(vp[0], vp[LDS]), pack_halves(vp[8 * LDS], vp[9 * LDS])};
                mma_m16n8k16(acc[dt], pf, bf[0], bf[1]);
            }
        }
    }

    // Normalise and store the rows of this chunk (fp32; scalar stores: ldo may be odd).
    for (int i = 0; i < 2; ++i) {
        const float l = quad_sum(row_sum[i]);
        const float inv = 1.f / l;  // l >= 1 (the max term); NaN inputs stay NaN
        const int64_t m = m0 + warp * 16 + gid + 8 * i;
        if (m >= packed) continue;
        const int64_t t = m / a.G, h = int64_t(kvh) * a.G + (m - t * a.G);
        float *orow = a.o.ptr + t * a.o.ld + h * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            orow[dt * 8 + 2 * tig] = acc[dt][2 * i] * inv;
            orow[dt * 8 + 2 * tig + 1] = acc[dt][2 * i + 1] * inv;
        }
    }
}

// ------------------------------------------------------------------ per-context scratch

// The cuBLAS path's scratch for calls without a workspace (the kernel-level API): the context's
// scratch_attn, grown on demand. Sessions pass their own workspace and never reach this.
pf_status reserve_scratch(pf_context *ctx, size_t bytes, void **out) {
    PF_TRY(scratch_reserve(ctx, ctx->scratch_attn, bytes, "attention scratch"));
    *out = ctx->scratch_attn.ptr;
    return PF_STATUS_OK;
}

// ------------------------------------------------------------------------- cuBLAS path

// Workspace of the cuBLAS path for passes of n query rows over at most pos0 + rows keys: gathered
// q [H][n][D] (cache dtype), fp32 scores [H][n][T], fp16 probabilities [H][n][T] (fp16 cache);
// with paged caches first the K and V rows [0, T) gathered contiguous (paged_kv_bytes).
size_t paged_kv_bytes(const AttentionArgs &a) {
    if (!a.pages.paged()) return 0;
    const size_t T = size_t(a.pos0 + std::max<int64_t>(a.rows, 1));
    const size_t row = size_t(a.n_kv_heads) * size_t(a.head_dim) * (a.kv_dtype == PF_KV_F16 ? 2 : 4);
    return 2 * align256(T * row);
}

size_t cublas_bytes(const AttentionArgs &a, int64_t n_rows) {
    const size_t H = size_t(a.n_heads), n = size_t(n_rows), D = size_t(a.head_dim);
    const size_t T = size_t(a.pos0 + std::max<int64_t>(a.rows, 1));
    const bool f16 = a.kv_dtype == PF_KV_F16;
    return paged_kv_bytes(a) + align256(H * n * D * (f16 ? 2 : 4)) + align256(H * n * T * 4) +
           (f16 ? align256(H * n * T * 2) : 0);
}

// Paged caches for the cuBLAS path: rows [0, pos0 + rows) of both into `dst` (paged_kv_bytes),
// contiguous; *k, *v then point there.
pf_status gather_paged_kv(const AttentionArgs &a, char *dst, const void **k, const void **v, cudaStream_t st) {
    const int64_t n = a.pos0 + a.rows;
    const int64_t row_bytes = int64_t(a.n_kv_heads) * a.head_dim * (a.kv_dtype == PF_KV_F16 ? 2 : 4);
    GatherKvArgs g{a.k_cache, a.v_cache, dst, dst + align256(size_t(n * row_bytes)), n, row_bytes, a.pages};
    if (row_bytes % 16 == 0) {
        gather_kv_kernel<uint4><<<grid_for(n * row_bytes / 16), 256, 0, st>>>(g);
        PF_LAUNCH_CHECK("gather_kv_kernel<uint4>");
    } else {
        gather_kv_kernel<uint16_t><<<grid_for(n * row_bytes / 2), 256, 0, st>>>(g);
        PF_LAUNCH_CHECK("gather_kv_kernel<uint16_t>");
    }
    *k = g.dk;
    *v = g.dv;
    return PF_STATUS_OK;
}

pf_status attention_cublas(pf_context *ctx, const AttentionArgs &a) {
    const int64_t H = a.n_heads, Hkv = a.n_kv_heads, D = a.head_dim, G = H / Hkv;
    const bool f16 = a.kv_dtype == PF_KV_F16;
    const size_t esz = f16 ? sizeof(__half) : sizeof(float);
    int64_t rpp = attention_rows_per_pass(a);
    void *ws = nullptr;
    if (a.workspace) {
        // A caller's workspace: the largest pass that fits (cublas_bytes grows with n).
        if (cublas_bytes(a, rpp) > a.workspace_bytes) {
            int64_t lo = 0, hi = rpp;  // cublas_bytes(lo) <= workspace_bytes < cublas_bytes(hi)
            while (hi - lo > 1) {
                const int64_t mid = lo + (hi - lo) / 2;
                (cublas_bytes(a, mid) <= a.workspace_bytes ? lo : hi) = mid;
            }
            rpp = lo;
        }
        PF_CHECK_ARG(rpp >= 1, "attention: workspace of %zu bytes holds no pass (one row needs %zu)",
                     a.workspace_bytes, cublas_bytes(a, 1));
        ws = a.workspace;
    } else {
        PF_TRY(reserve_scratch(ctx, cublas_bytes(a, rpp), &ws));
    }
    const int64_t t_max = a.pos0 + a.rows;
    char *base = static_cast<char *>(ws);
    const cudaStream_t st = ctx->stream;
    const void *k_cache = a.k_cache, *v_cache = a.v_cache;
    if (a.pages.paged()) {
        PF_TRY(gather_paged_kv(a, base, &k_cache, &v_cache, st));
        base += paged_kv_bytes(a);
    }
    void *qs = base;                                                       // [H][n][D] cache dtype
    float *scores = reinterpret_cast<float *>(base + align256(size_t(H * rpp * D) * esz));  // [H][n][T]
    void *probs = f16 ? static_cast<void *>(reinterpret_cast<char *>(scores) +
                                            align256(size_t(H * rpp * t_max) * sizeof(float)))
                      : static_cast<void *>(scores);  // fp32: softmax in place
    const float one = 1.f, zero = 0.f;

    for (int64_t r0 = 0; r0 < a.rows; r0 += rpp) {
        const int64_t n = std::min(rpp, a.rows - r0);
        const int64_t p0 = a.pos0 + r0, T = p0 + n;  // this pass sees keys 0..T-1

        GatherQArgs ga{CMatF{a.q, a.ldq}.rows_from(r0), a.q_head_stride, qs, n, H, D};
        if (f16)
            gather_q_kernel<__half><<<grid_for(H * n * D), 256, 0, st>>>(ga);
        else
            gather_q_kernel<float><<<grid_for(H * n * D), 256, 0, st>>>(ga);
        PF_LAUNCH_CHECK("gather_q_kernel<%s>", f16 ? "__half" : "float");

        // Column-major view (cuBLAS): for KV head g, C (T x G*n, ldc T) = op(A) B with
        // A = K cache at column g*D as (D x T, lda kv_dim), transposed; B = gathered q of heads
        // g*G .. g*G+G-1 as (D x G*n, ldb D). C is scores[h][t][j] row-major, h = g*G + i.
        // Batch over g: strides D (A), G*n*D (B), G*n*T (C).
        const int64_t kv_dim = Hkv * D;
        if (f16) {
            PF_CUBLAS_TRY(cublasGemmStridedBatchedEx(
                ctx->blas_tc, CUBLAS_OP_T, CUBLAS_OP_N, int(T), int(G * n), int(D), &a.scale,
                k_cache, CUDA_R_16F, int(kv_dim), (long long)D, qs, CUDA_R_16F, int(D),
                (long long)(G * n * D), &zero, scores, CUDA_R_32F, int(T), (long long)(G * n * T),
                int(Hkv), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        } else {
            PF_CUBLAS_TRY(cublasSgemmStridedBatched(
                ctx->blas_f32, CUBLAS_OP_T, CUBLAS_OP_N, int(T), int(G * n), int(D), &a.scale,
                static_cast<const float *>(k_cache), int(kv_dim), (long long)D,
                static_cast<const float *>(qs), int(D), (long long)(G * n * D), &zero, scores, int(T),
                (long long)(G * n * T), int(Hkv)));
        }

        SoftmaxArgs sa{scores, probs, n, T, p0};
        if (f16)
            causal_softmax_kernel<__half><<<unsigned(H * n), kSoftmaxThreads, 0, st>>>(sa);
        else
            causal_softmax_kernel<float><<<unsigned(H * n), kSoftmaxThreads, 0, st>>>(sa);
        PF_LAUNCH_CHECK("causal_softmax_kernel<%s>", f16 ? "__half" : "float");

        // For KV head g, batch over its heads i: C (D x n, ldc ldo) = A B with A = V cache at
        // column g*D as (D x T, lda kv_dim), shared (stride 0); B = P of head g*G+i as (T x n,
        // ldb T), stride n*T; C = o rows r0.., column (g*G+i)*D, stride D.
        for (int64_t g = 0; g < Hkv; ++g) {
            float *o_g = a.o + r0 * a.ldo + g * G * D;
            if (f16) {
                const __half *v_g = static_cast<const __half *>(v_cache) + g * D;
                const __half *p_g = static_cast<const __half *>(probs) + g * G * n * T;
                PF_CUBLAS_TRY(cublasGemmStridedBatchedEx(
                    ctx->blas_tc, CUBLAS_OP_N, CUBLAS_OP_N, int(D), int(n), int(T), &one, v_g,
                    CUDA_R_16F, int(kv_dim), 0LL, p_g, CUDA_R_16F, int(T), (long long)(n * T), &zero,
                    o_g, CUDA_R_32F, int(a.ldo), (long long)D, int(G), CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
            } else {
                const float *v_g = static_cast<const float *>(v_cache) + g * D;
                const float *p_g = static_cast<const float *>(probs) + g * G * n * T;
                PF_CUBLAS_TRY(cublasSgemmStridedBatched(
                    ctx->blas_f32, CUBLAS_OP_N, CUBLAS_OP_N, int(D), int(n), int(T), &one, v_g,
                    int(kv_dim), 0LL, p_g, int(T), (long long)(n * T), &zero, o_g, int(a.ldo),
                    (long long)D, int(G)));
            }
        }
    }
    return PF_STATUS_OK;
}

// -------------------------------------------------------------------------- flash path

template <int D, int BC>
pf_status launch_flash(const AttentionArgs &a, cudaStream_t st) {
    constexpr size_t smem = flash_smem_bytes<D, BC>();
    // Above the 48 KiB default: opt in, once per device.
    PF_TRY(set_max_dynamic_smem(flash_attn_kernel<D, BC>, int(smem), "flash_attn_kernel"));
    FlashArgs f;
    f.q = CMatF{a.q, a.ldq};
    f.qhs = a.q_head_stride;
    f.k_cache = static_cast<const __half *>(a.k_cache);
    f.v_cache = static_cast<const __half *>(a.v_cache);
    f.kv_dim = int64_t(a.n_kv_heads) * D;
    f.pages = a.pages;
    f.o = MatF{a.o, a.ldo};
    f.G = a.n_heads / a.n_kv_heads;
    f.rows = a.rows;
    f.pos0 = a.pos0;
    f.pos0_dev = a.pos0_dev;
    f.scale_log2 = a.scale * 1.4426950408889634f;
    const dim3 grid(unsigned(ceil_div(a.rows * f.G, kFlashBM)), unsigned(a.n_kv_heads));
    flash_attn_kernel<D, BC><<<grid, kFlashThreads, smem, st>>>(f);
    PF_LAUNCH_CHECK("flash_attn_kernel<%d, %d>", D, BC);
    return PF_STATUS_OK;
}

}  // namespace

// ------------------------------------------------------------------------- entry points

pf_status check_pages(const KvPages &p, const char *fn) {
    PF_CHECK_ARG(!p.paged() || (p.page_rows > 0 && p.page_rows % kKvPageGranule == 0),
                 "%s: page_rows=%d must be a positive multiple of %d", fn, (int)p.page_rows,
                 kKvPageGranule);
    return PF_STATUS_OK;
}

pf_status kv_write(CMatF km, CMatF vm, int64_t rows, int64_t kv_dim, const KvCache &cache, int64_t pos0,
                   cudaStream_t stream) {
    const int64_t ldk = km.ld, ldv = vm.ld;
    void *k_cache = cache.k, *v_cache = cache.v;
    const int32_t kv_dtype = cache.dtype;
    PF_CHECK_ARG(rows >= 0 && kv_dim > 0 && pos0 >= 0 && ldk >= kv_dim && ldv >= kv_dim,
                 "kv_write: rows=%lld kv_dim=%lld pos0=%lld ldk=%lld ldv=%lld", (long long)rows,
                 (long long)kv_dim, (long long)pos0, (long long)ldk, (long long)ldv);
    PF_CHECK_ARG(kv_dtype == PF_KV_F16 || kv_dtype == PF_KV_F32, "kv_write: kv_dtype=%d",
                 (int)kv_dtype);
    PF_TRY(check_pages(cache.pages, "kv_write"));
    if (rows == 0) return PF_STATUS_OK;
    return kv_write_launch(KvWriteArgs{km, vm, rows, kv_dim, k_cache, v_cache, pos0, nullptr, cache.pages},
                           kv_dtype, stream);
}

pf_status kv_write_at(CMatF km, CMatF vm, int64_t rows, int64_t kv_dim, const KvCache &cache,
                      const int64_t *pos0_dev, cudaStream_t stream) {
    const int64_t ldk = km.ld, ldv = vm.ld;
    void *k_cache = cache.k, *v_cache = cache.v;
    const int32_t kv_dtype = cache.dtype;
    PF_CHECK_ARG(rows >= 0 && kv_dim > 0 && ldk >= kv_dim && ldv >= kv_dim && pos0_dev != nullptr,
                 "kv_write_at: rows=%lld kv_dim=%lld ldk=%lld ldv=%lld pos0_dev=%p", (long long)rows,
                 (long long)kv_dim, (long long)ldk, (long long)ldv, (const void *)pos0_dev);
    PF_CHECK_ARG(kv_dtype == PF_KV_F16 || kv_dtype == PF_KV_F32, "kv_write_at: kv_dtype=%d",
                 (int)kv_dtype);
    PF_TRY(check_pages(cache.pages, "kv_write_at"));
    if (rows == 0) return PF_STATUS_OK;
    return kv_write_launch(KvWriteArgs{km, vm, rows, kv_dim, k_cache, v_cache, 0, pos0_dev, cache.pages},
                           kv_dtype, stream);
}

bool attention_flash_supported(const AttentionArgs &a) {
    const auto aligned16 = [](const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    return a.kv_dtype == PF_KV_F16 && (a.head_dim == 128 || a.head_dim == 256) &&
           aligned16(a.k_cache) && aligned16(a.v_cache);
}

int32_t attention_resolved_path(const AttentionArgs &a) {
    if (a.path == PF_ATTN_FLASH) return PF_ATTN_FLASH;
    if (a.path == PF_ATTN_CUBLAS || !attention_flash_supported(a)) return PF_ATTN_CUBLAS;
    // AUTO. The flash grid has ceil(rows*G/64) x Hkv blocks, each walking every visible key:
    // a decode-like chunk over a long cache would leave most SMs idle for a long time, where the
    // cuBLAS GEMMs spread the keys over the whole GPU.
    const int64_t G = a.n_heads / a.n_kv_heads;
    const int64_t blocks = ceil_div(a.rows * G, kFlashBM) * a.n_kv_heads;
    if (blocks < 32 && a.pos0 + a.rows > 2048) return PF_ATTN_CUBLAS;
    return PF_ATTN_FLASH;
}

int32_t attention_resolved_kernel(const AttentionArgs &a, int device) {
    if (a.kernel == PF_ATTN_KERNEL_MMA || a.kernel == PF_ATTN_KERNEL_WGMMA) return a.kernel;
    return sm90a_kernels_available(device) ? PF_ATTN_KERNEL_WGMMA : PF_ATTN_KERNEL_MMA;
}

int64_t attention_rows_per_pass(const AttentionArgs &a) {
    const int64_t rows = std::max<int64_t>(a.rows, 1);
    int64_t rpp = a.rows_per_pass;
    if (rpp <= 0) {
        const size_t budget = a.scores_budget_bytes ? a.scores_budget_bytes : kAttnDefaultBudget;
        // cublas_bytes(a, n) <= n * cublas_bytes(a, 1): this n keeps a pass within the budget.
        // Paged caches' gathered rows are not a pass's: they come on top, and the passes are
        // those of contiguous caches (the same cuBLAS calls, bitwise the same output).
        rpp = int64_t(std::min<size_t>(budget / (cublas_bytes(a, 1) - paged_kv_bytes(a)), size_t(INT_MAX)));
    }
    rpp = std::min(rpp, rows);
    // H * n score rows form a grid dimension and G * n a cuBLAS int.
    rpp = std::min<int64_t>(rpp, INT_MAX / std::max(a.n_heads, 1));
    return std::max<int64_t>(rpp, 1);
}

size_t attention_workspace_bytes(const AttentionArgs &a, int64_t rows_per_pass) {
    return attention_resolved_path(a) == PF_ATTN_FLASH ? 0 : cublas_bytes(a, rows_per_pass);
}

pf_status attention(pf_context *ctx, const AttentionArgs &a) {
    PF_CHECK_ARG(ctx != nullptr, "attention: ctx is NULL");
    PF_CHECK_ARG(a.n_heads > 0 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0,
                 "attention: n_heads=%d n_kv_heads=%d", a.n_heads, a.n_kv_heads);
    PF_CHECK_ARG(a.head_dim > 0 && a.head_dim % 2 == 0, "attention: head_dim=%d", a.head_dim);
    PF_CHECK_ARG(a.rows >= 0 && a.pos0 >= 0 && a.pos0 + a.rows <= INT_MAX,
                 "attention: rows=%lld pos0=%lld", (long long)a.rows, (long long)a.pos0);
    PF_CHECK_ARG(a.kv_dtype == PF_KV_F16 || a.kv_dtype == PF_KV_F32, "attention: kv_dtype=%d",
                 (int)a.kv_dtype);
    PF_CHECK_ARG(a.q_head_stride >= a.head_dim &&
                     a.ldq >= (a.n_heads - 1) * a.q_head_stride + a.head_dim &&
                     a.ldo >= int64_t(a.n_heads) * a.head_dim && a.ldo <= INT_MAX,
                 "attention: strides q_head_stride=%lld ldq=%lld ldo=%lld too small",
                 (long long)a.q_head_stride, (long long)a.ldq, (long long)a.ldo);
    PF_TRY(check_pages(a.pages, "attention"));
    if (a.rows == 0) return PF_STATUS_OK;
    const int32_t path = attention_resolved_path(a);
    if (path == PF_ATTN_FLASH) {
        if (!attention_flash_supported(a))
            return fail(PF_STATUS_UNSUPPORTED,
                        "attention: the flash path needs an fp16 cache (kv_dtype=%d), head_dim 128 "
                        "or 256 (head_dim=%d) and 16-byte aligned caches",
                        (int)a.kv_dtype, a.head_dim);
        // The device position: the host copy must fit the caches (the kernels trust it). Paged:
        // kv_capacity is the pools' rows (the wgmma kernel's maps span them), whole pages; the
        // table's length is the caller's to check.
        PF_CHECK_ARG(a.pages.paged() || !a.pos0_dev ||
                         (a.kv_capacity >= a.pos0 + a.rows && a.kv_capacity <= INT_MAX),
                     "attention: pos0_dev with kv_capacity=%lld rows, pos0=%lld + rows=%lld",
                     (long long)a.kv_capacity, (long long)a.pos0, (long long)a.rows);
        PF_CHECK_ARG(!a.pages.paged() || (a.kv_capacity >= a.pages.page_rows && a.kv_capacity <= INT_MAX &&
                                          a.kv_capacity % a.pages.page_rows == 0),
                     "attention: paged caches with kv_capacity=%lld rows (whole pages of %d rows, at "
                     "most 2^31 - 1)",
                     (long long)a.kv_capacity, (int)a.pages.page_rows);
        if (attention_resolved_kernel(a, ctx->device) == PF_ATTN_KERNEL_WGMMA) {
            if (!sm90a_kernels_available(ctx->device))
                return fail(PF_STATUS_UNSUPPORTED,
                            "attention: kernel=PF_ATTN_KERNEL_WGMMA needs a compute capability 9.0 "
                            "device and a library built with sm_90a (CMAKE_CUDA_ARCHITECTURES 90a)");
            return attention_flash_wgmma(a, a.stream ? a.stream : ctx->stream);
        }
        if (a.head_dim == 128) return launch_flash<128, 64>(a, a.stream ? a.stream : ctx->stream);
        return launch_flash<256, 32>(a, a.stream ? a.stream : ctx->stream);
    }
    return attention_cublas(ctx, a);
}

void attention_release(pf_context *ctx) { scratch_release(ctx, ctx->scratch_attn); }

}  // namespace pf
