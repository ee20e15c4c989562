// qgemm.cu — fused GEMM / GEMM + residual / gate+up+SwiGLU / GEMV straight on GGUF blocks
// (the idea of OxiBonsai's q_std prefill kernels for Q4_0/Q8_0 and of llama.cpp's mmq: never
// write the dequantized weight to memory). Built for every type quant.cuh decodes; Q4_0 and
// Q8_0 are the ones the engine calls directly.
//
// First version, correct and simple: a 64x64 output tile per block of 256 threads, each
// thread a 4x4 sub-tile; per 32-wide step of k one X tile (fp32) and one quantized block per
// weight row (decoded to fp32) go to shared memory, then fp32 FMAs. The entry points are
// shaped so that an mma/int8 kernel can replace the body later.
#include <algorithm>
#include <cstdint>

#include "base/context.h"
#include "kernels/dequant/quant.cuh"
#include "kernels/gemm/qgemm.cuh"
#include "plan/qtype.h"
#include "ptx/common.cuh"

namespace pf {
namespace {

constexpr int kBM = 64;       // rows of X per tile
constexpr int kBN = 64;       // rows of W (output columns) per tile
constexpr int kBK = 32;       // k per step = one Q4_0 / Q8_0 block
constexpr int kThreads = 256; // 16 x 16 threads, 4 x 4 outputs each
constexpr int kTM = kBM / 16, kTN = kBN / 16;
constexpr int kPad = 1;       // row stride 33 floats: the column reads of the inner loop hit
                              // 32 different banks
constexpr int kGemvWarps = 8; // outputs per GEMV block

struct QgemmArgs {
    const uint8_t *w;   // [n_rows_w][row_bytes]
    int64_t row_bytes;
    int64_t n, k;       // output columns, reduction length
    CMatF x;            // [rows][x.ld], the entry's view
    int64_t rows;
    MatF y;             // [rows][y.ld], the entry's view
    int accumulate;
};

template <int Q, bool kSwiglu>
__global__ void __launch_bounds__(kThreads) qgemm_kernel(const __grid_constant__ QgemmArgs a) {
    constexpr int G = kSwiglu ? 2 : 1;  // gate and up tiles for SwiGLU
    __shared__ float xs[kBM][kBK + kPad];
    __shared__ float ws[G][kBN][kBK + kPad];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
    float acc[G][kTM][kTN];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < kTM; ++i)
#pragma unroll
            for (int j = 0; j < kTN; ++j) acc[g][i][j] = 0.0f;

    const int wr = threadIdx.x >> 2;         // weight row of the tile this thread decodes
    const int we = (threadIdx.x & 3) * 8;    // its 8 elements of the 32
    const bool w_in = n0 + wr < a.n;
    for (int64_t k0 = 0; k0 < a.k; k0 += kBK) {
        // X tile: 64 x 32 floats, 8 per thread; a warp reads 32 consecutive floats (coalesced).
#pragma unroll
        for (int it = 0; it < kBM * kBK / kThreads; ++it) {
            const int idx = threadIdx.x + it * kThreads;
            const int r = idx >> 5, c = idx & 31;
            const int64_t row = m0 + r;
            xs[r][c] = row < a.rows ? a.x.ptr[row * a.x.ld + k0 + c] : 0.0f;
        }
        // W tile: one block of 32 per weight row, decoded to fp32 (exact, see quant.cuh).
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (w_in) decode8_at<Q>(a.w + (n0 + wr + int64_t(g) * a.n) * a.row_bytes, k0 + we, v);
#pragma unroll
            for (int e = 0; e < 8; ++e) ws[g][wr][we + e] = v[e];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < kBK; ++kk) {
            float av[kTM];
#pragma unroll
            for (int i = 0; i < kTM; ++i) av[i] = xs[ty + 16 * i][kk];
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int j = 0; j < kTN; ++j) {
                    const float b = ws[g][tx + 16 * j][kk];
#pragma unroll
                    for (int i = 0; i < kTM; ++i) acc[g][i][j] = fmaf(av[i], b, acc[g][i][j]);
                }
        }
        __syncthreads();  // the next step overwrites the tiles
    }
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
        const int64_t row = m0 + ty + 16 * i;
        if (row >= a.rows) continue;
#pragma unroll
        for (int j = 0; j < kTN; ++j) {
            const int64_t col = n0 + tx + 16 * j;
            if (col >= a.n) continue;
            float *yp = a.y.ptr + row * a.y.ld + col;
            if (kSwiglu) {
                const float g = acc[0][i][j], u = acc[G - 1][i][j];
                *yp = g / (1.0f + expf(-g)) * u;  // silu(g) * u; exp overflow gives -0, not NaN
            } else {
                *yp = a.accumulate ? *yp + acc[0][i][j] : acc[0][i][j];
            }
        }
    }
}

struct QgemvArgs {
    const uint8_t *w;
    int64_t row_bytes, n, k;
    const float *x;
    float *y;
    int accumulate;
};

// One warp per output row. Block types: lane l takes the 8-element groups l, l+32, ... (a warp
// step covers 256 consecutive elements, so the block bytes it reads are contiguous) and
// decodes each group with one header read; element types: one element per lane and step.
// A shuffle reduction ends it.
template <int Q, bool kVecX>
__global__ void __launch_bounds__(kGemvWarps * 32) qgemv_kernel(const __grid_constant__ QgemvArgs a) {
    const int64_t j = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
    if (j >= a.n) return;  // whole warps leave together: the shuffles below stay full-warp
    const int lane = threadIdx.x & 31;
    const uint8_t *rp = a.w + j * a.row_bytes;
    float acc = 0.0f;
    if constexpr (qtraits<Q>::kElems == 1) {
#pragma unroll 4
        for (int64_t c = lane; c < a.k; c += 32) acc = fmaf(decode_at<Q>(rp, c), a.x[c], acc);
    } else {
        // Unrolled so that several iterations' loads are in flight (one row per warp is
        // latency-bound otherwise: ~10 dependent steps of 256 elements for k = 2560).
#pragma unroll 4
        for (int64_t c0 = int64_t(lane) * 8; c0 < a.k; c0 += 32 * 8) {
            float v[8], xv[8];
            decode8_at<Q>(rp, c0, v);
            if constexpr (kVecX) {  // x 16-byte aligned: two vector loads
                const float4 x0 = reinterpret_cast<const float4 *>(a.x + c0)[0];
                const float4 x1 = reinterpret_cast<const float4 *>(a.x + c0)[1];
                xv[0] = x0.x; xv[1] = x0.y; xv[2] = x0.z; xv[3] = x0.w;
                xv[4] = x1.x; xv[5] = x1.y; xv[6] = x1.z; xv[7] = x1.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) xv[e] = a.x[c0 + e];
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) acc = fmaf(v[e], xv[e], acc);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) a.y[j] = a.accumulate ? a.y[j] + acc : acc;
}

pf_status check_shape(int32_t qtype, int64_t n, int64_t k, int64_t rows, bool tiled,
                      int64_t *row_bytes, const char *what) {
    int64_t be = 0, bb = 0;
    if (!qtype_block(qtype, &be, &bb))
        return fail(PF_STATUS_UNSUPPORTED, "%s: GGML type %d is not supported", what, int(qtype));
    PF_CHECK_ARG(n > 0 && k > 0 && k % be == 0, "%s: n=%lld k=%lld (k must be a positive multiple of "
                 "the %s block size %lld)", what, (long long)n, (long long)k, pf_qtype_name(qtype),
                 (long long)be);
    PF_CHECK_ARG(!tiled || k % kBK == 0,
                 "%s: k=%lld must be a multiple of %d for the tiled kernels", what, (long long)k, kBK);
    PF_CHECK_ARG((rows + kBM - 1) / kBM <= kMaxGridY, "%s: rows=%lld exceeds %lld", what,
                 (long long)rows, (long long)kMaxGridY * kBM);
    *row_bytes = k / be * bb;
    return PF_STATUS_OK;
}

template <bool kSwiglu>
pf_status launch_gemm(const QMatrix &wm, CMatF xm, MatF ym, int64_t rows, bool accumulate,
                      cudaStream_t stream, const char *what) {
    const void *w = wm.blocks;
    const int32_t qtype = wm.qtype;
    const int64_t n = wm.n, k = wm.k;
    int64_t rb = 0;
    PF_TRY(check_shape(qtype, n, k, rows, true, &rb, what));
    if (rows == 0) return PF_STATUS_OK;
    const QgemmArgs a{static_cast<const uint8_t *>(w), rb, n, k, xm, rows, ym, accumulate ? 1 : 0};
    const dim3 grid(unsigned((n + kBN - 1) / kBN), unsigned((rows + kBM - 1) / kBM));
    dispatch_qtype(qtype, [&](auto tag) {
        qgemm_kernel<decltype(tag)::value, kSwiglu><<<grid, kThreads, 0, stream>>>(a);
    });
    PF_LAUNCH_CHECK("qgemm_kernel<%s, %s> (%s)", pf_qtype_name(qtype), kSwiglu ? "true" : "false",
                    what);
    return PF_STATUS_OK;
}

}  // namespace

bool qgemm_supports(int32_t qtype) {
    int64_t be = 0, bb = 0;
    return qtype_block(qtype, &be, &bb);  // every type quant.cuh decodes
}

pf_status qgemv(const QMatrix &wm, const float *x, float *y, bool accumulate, cudaStream_t stream) {
    const void *w = wm.blocks;
    const int32_t qtype = wm.qtype;
    const int64_t n = wm.n, k = wm.k;
    int64_t rb = 0;
    PF_TRY(check_shape(qtype, n, k, 1, false, &rb, "qgemv"));
    const QgemvArgs a{static_cast<const uint8_t *>(w), rb, n, k, x, y, accumulate ? 1 : 0};
    const unsigned grid = unsigned((n + kGemvWarps - 1) / kGemvWarps);
    const bool vec_x = reinterpret_cast<uintptr_t>(x) % 16 == 0;  // float4 loads of x
    dispatch_qtype(qtype, [&](auto tag) {
        constexpr int Q = decltype(tag)::value;
        if (vec_x)
            qgemv_kernel<Q, true><<<grid, kGemvWarps * 32, 0, stream>>>(a);
        else
            qgemv_kernel<Q, false><<<grid, kGemvWarps * 32, 0, stream>>>(a);
    });
    PF_LAUNCH_CHECK("qgemv_kernel<%s, %s>", pf_qtype_name(qtype), vec_x ? "true" : "false");
    return PF_STATUS_OK;
}

pf_status qgemm(const QMatrix &w, CMatF x, MatF y, int64_t rows, bool accumulate, cudaStream_t stream) {
    if (rows == 1) return qgemv(w, x.ptr, y.ptr, accumulate, stream);  // one token: GEMV
    return launch_gemm<false>(w, x, y, rows, accumulate, stream, "qgemm");
}

pf_status qgemm_swiglu(const QMatrix &w, CMatF x, MatF out, int64_t rows, cudaStream_t stream) {
    return launch_gemm<true>(w, x, out, rows, false, stream, "qgemm_swiglu");
}

}  // namespace pf
