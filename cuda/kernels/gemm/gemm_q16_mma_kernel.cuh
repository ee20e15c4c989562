// gemm_q16_mma_kernel.cuh — the GEMM on the GGUF blocks for compute capability 8.x (mma.sync; an
// experiment beside gemm_q16_kernel.cuh, built only into tests/cpp/bench_gemm_q16 until it is
// checked on a GPU): Y^T = W X^T with the weight as the register operand (A) of
// mma.m16n8k16, decoded by each thread from the raw blocks in shared memory (q16_raw.cuh
// decode_fragment: the prewarm's values bit for bit), and X's fp16 rows the B operand, loaded
// with ldmatrix from a 128-byte-swizzled tile that cp.async fills (the Ampere form of
// gemm_q16_rs_kernel.cuh; Marlin's choice of the quantized weight as the register operand).
//
// The block: 128 threads (4 warps, 2 x 2), an output tile of 128 rows of X (tokens) x 64 weight
// rows; warp (wm, wn) owns weight rows 32 wm .. + 31 (two m16 tiles) and tokens 64 wn .. + 63
// (eight n8 tiles): 16 mma per 16-column step, each decoded weight element used for 64 tokens.
// Two X stages of 64 columns and two raw buffers of 256-column supersteps (69 KiB at most, under
// the 99 KiB of every 8.x card); every stage one cp.async group (the next X stage, and at a
// superstep's first stage the next superstep's raw blocks), waited for and published by one
// __syncthreads before the stage's products.
#pragma once

#include "kernels/gemm/q16_raw.cuh"

namespace pf {
namespace q16mma {

using q16::kRawCols;
using q16::Q16Args;
using q16::RawGeom;

constexpr int kTN = 128;                      // rows of X (tokens) per block
constexpr int kWM = 64;                       // weight rows per block
constexpr int kBK = 64;                       // columns per X stage (128 bytes of fp16 per row)
constexpr int kThreads = 128;
constexpr int kTileX = kTN * kBK * 2;         // bytes of one X stage
constexpr int kStagesPerRaw = kRawCols / kBK;
constexpr int kBand = 8;                      // token tiles per raster band

template <int Q>
__host__ __device__ constexpr size_t smem_bytes() {
    return 2 * size_t(kTileX) + 2 * size_t(kWM) * RawGeom<Q>::kSlot;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// X stage ks (columns 64 ks ..) of the tile's rows m0 .. into `dst` (kTN rows x 128 bytes, chunk c
// of row r at chunk c ^ (r % 8)): rows past `rows` and columns past k as zeros (k % 8 == 0).
__device__ __forceinline__ void x_issue(const Q16Args &a, const __half *x16, unsigned char *dst, int m0, int ks) {
    for (int i = int(threadIdx.x); i < kTN * 8; i += kThreads) {
        const int r = i >> 3, c = i & 7;
        const int row = m0 + r, col = ks * kBK + 8 * c;
        const bool ok = row < a.rows && col < a.k;
        const __half *src = x16 + (ok ? int64_t(row) * a.k + col : 0);
        cp_async16_zfill(dst + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
}

template <int Q>
__device__ __forceinline__ void mma_tile(const Q16Args &a, const __half *x16, unsigned char *smem, int m0, int n0) {
    // X stage buffer b and raw buffer b (computed, not arrays: an indexed array would live in local memory)
    const auto xs = [&](int b) { return smem + (b & 1) * kTileX; };
    const auto raws = [&](int b) { return smem + 2 * kTileX + (b & 1) * kWM * RawGeom<Q>::kSlot; };
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int wm = warp >> 1, wn = warp & 1;
    const int gid = lane >> 2, tig = lane & 3;
    const int stages = (a.k + kBK - 1) / kBK;
    const int supersteps = (a.k + kRawCols - 1) / kRawCols;
    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
    x_issue(a, x16, xs(0), m0, 0);
    q16::raw_issue<Q>(a, raws(0), kWM, n0, 0, int(threadIdx.x), kThreads);
    cp_async_commit();
    for (int ks = 0; ks < stages; ++ks) {
        cp_async_wait_all();
        __syncthreads();  // stage ks (and its superstep) landed for every thread; stage ks - 1 consumed
        if (ks + 1 < stages) x_issue(a, x16, xs(ks + 1), m0, ks + 1);
        if (ks % kStagesPerRaw == 0 && ks / kStagesPerRaw + 1 < supersteps)
            q16::raw_issue<Q>(a, raws(ks / kStagesPerRaw + 1), kWM, n0, ks / kStagesPerRaw + 1, int(threadIdx.x),
                              kThreads);
        cp_async_commit();
        const unsigned char *xt = xs(ks);
        const int j = ks / kStagesPerRaw;
        const unsigned char *raw = raws(j);
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
            const int step = ks * (kBK / 16) + kk;
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const int r0 = wm * 32 + mt * 16 + gid;
                q16::decode_fragment<Q>(a, raw, r0, q16::raw_offset<Q>(a, n0, r0, j),
                                        q16::raw_offset<Q>(a, n0, r0 + 8, j), step, tig, af[mt]);
            }
#pragma unroll
            for (int np = 0; np < 4; ++np) {  // n8 tiles 2 np and 2 np + 1 (ptx/mma.cuh "B pair, stored [n][k]")
                const int r = wn * 64 + np * 16 + lrow_b(lane);
                const int c = 2 * kk + (lcol_b(lane) >> 3);
                uint32_t b[4];
                ldsm_x4(b, xt + r * 128 + ((c ^ (r & 7)) << 4));
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_m16n8k16(acc[mt][2 * np], af[mt], b[0], b[1]);
                    mma_m16n8k16(acc[mt][2 * np + 1], af[mt], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait_all();
    // acc[mt][nt]: weight rows r + gid (e = 0, 1) and r + gid + 8 (e = 2, 3), tokens t + 2 tig + e % 2.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int w = n0 + wm * 32 + mt * 16 + gid + 8 * (e >> 1);
                const int t = m0 + wn * 64 + nt * 8 + 2 * tig + (e & 1);
                if (w < a.n && t < a.rows) {
                    float *y = a.y + int64_t(t) * a.ldy + w;
                    const float v = (a.accumulate ? *y : 0.f) + acc[mt][nt][e];
                    *y = a.inv ? v * a.inv[t] : v;
                }
            }
}

#endif  // __CUDA_ARCH__ >= 800

// One block per 128-token x 64-weight-row output tile (m_tiles x n_tiles), rastered in bands of
// kBand token tiles; smem_bytes<Q>() of dynamic shared memory.
template <int Q>
__global__ void __launch_bounds__(kThreads)
    gemm_q16_mma_kernel(const __grid_constant__ Q16Args a, const __half *__restrict__ x16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(128) unsigned char smem[];
    int mt, nt;
    q16::band_tile(int(blockIdx.x), a.m_tiles, a.n_tiles, kBand, mt, nt);
    mma_tile<Q>(a, x16, smem, mt * kTN, nt * kWM);
#endif
}

// The arguments with this kernel's tiles.
template <int Q>
inline Q16Args make_args(const void *blocks, int64_t n, int64_t k, const float *inv, int64_t rows, float *y,
                         int64_t ldy, bool accumulate) {
    return q16::args_for<Q>(blocks, n, k, inv, rows, y, ldy, accumulate, kTN, kWM);
}

// Launches m_tiles x n_tiles blocks; smem_bytes<Q>() must have been allowed first. x16: [rows][k]
// fp16, 16-byte aligned, k % 8 == 0.
template <int Q>
cudaError_t launch(const Q16Args &a, const __half *x16, cudaStream_t st) {
    gemm_q16_mma_kernel<Q><<<unsigned(int64_t(a.m_tiles) * a.n_tiles), kThreads, smem_bytes<Q>(), st>>>(a, x16);
    return cudaGetLastError();
}

}  // namespace q16mma
}  // namespace pf
