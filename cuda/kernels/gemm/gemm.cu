// gemm.cu — the projection legs (f32 SGEMM, f16 tensor-op GEMM with fp16 overflow
// protection), the weights' fp16 caches and the all-or-nothing prewarm.
//
// Row-major Y[rows][n] = X[rows][k] . W[n][k]^T is, read column-major, Y^T = W^T' X^T with
// W^T' the column-major view of row-major W (k x n, ld k) transposed: cuBLAS
//   gemm(OP_T, OP_N, m = n, n = rows, k, A = W (ld k), B = X (ld ldx), C = Y (ld ldy)).
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cfloat>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "kernels/dequant/dequant.cuh"
#include "kernels/dequant/prewarm.cuh"
#include "kernels/gemm/gemm.cuh"
#include "kernels/gemm/gemm_i8.cuh"  // the 8-bit leg (project_i8)
#include "kernels/gemm/gemm_lt.cuh"   // gemm_f16: the f16 leg's GEMM and its per-shape algorithm
#include "kernels/gemm/gemm_q16.cuh"  // gemm_q16: the f16 leg's GEMM on the GGUF blocks
#include "kernels/gemm/qgemm.cuh"
#include "kernels/gemm/slab_ring.cuh"  // the slabs dequantized ahead (an executor's ring)
#include "kernels/rows/f16_rows.cuh"  // the row-scale rule (kF16RowMax, f16_row_scale)
#include "plan/defaults.h"
#include "plan/qtype.h"
#include "ptx/common.cuh"

namespace pf {
namespace {

// ------------------------------------------------------------------ sizes and slabs

constexpr size_t kSlabBytes = size_t(512) << 20;  // bound on a dequantized weight slab (scratch)
constexpr int kCastThreads = 256;
constexpr int kMaxRowBlocks = 65535;              // grid-stride over rows beyond this

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

int64_t row_bytes(const pf_weight *w) {
    int64_t be = 1, bb = 4;
    qtype_block(w->qtype, &be, &bb);
    return w->k / be * bb;
}

// Weight rows per slab of `elem_bytes` elements so that the slab stays under kSlabBytes.
int64_t slab_rows(int64_t n, int64_t k, size_t elem_bytes) {
    const int64_t r = int64_t(kSlabBytes / (size_t(k) * elem_bytes));
    return std::max<int64_t>(1, std::min<int64_t>(n, r));
}

// ------------------------------------------------------------------ f16 activation kernels

struct CastArgs {
    const float *x;       // [rows][ldx]
    int64_t ldx;
    int64_t rows, k;
    __half *xh;           // [rows][k] fp16 (scaled rows)
    float *inv_scale;     // [rows]: 2^e for a row scaled by 2^-e, 1 otherwise
    float *y;             // [rows][ldy], pre-scaled when accumulate and the row is scaled
    int64_t ldy, n;
    int accumulate;
};

// One block per row: max|x| of the row, a power-of-two scale when it exceeds kF16RowMax, the
// fp16 cast, and the pre-scale of the existing output row for accumulate. kVec: x rows are
// 16-byte aligned and k % 4 == 0, so 4 elements move per float4 load / 8-byte store (the second
// read of the row comes from L1/L2).
template <bool kVec>
__global__ void cast_rows_f16_kernel(const __grid_constant__ CastArgs a) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const float *xr = a.x + r * a.ldx;
        __half *hr = a.xh + r * a.k;
        float m = 0.0f;
        if constexpr (kVec) {
            for (int64_t j = threadIdx.x; j < a.k / 4; j += blockDim.x) {
                const float4 v = reinterpret_cast<const float4 *>(xr)[j];
                m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
            }
        } else {
            for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x) m = fmaxf(m, fabsf(xr[j]));
        }
        m = block_max(m, red);  // >= 0: fmaxf skips NaN elements
        float scale, inv;
        f16_row_scale(m, &scale, &inv);
        if constexpr (kVec) {
            for (int64_t j = threadIdx.x; j < a.k / 4; j += blockDim.x) {
                const float4 v = reinterpret_cast<const float4 *>(xr)[j];
                __half2 *h2 = reinterpret_cast<__half2 *>(hr) + 2 * j;  // 8-byte aligned: k % 4 == 0
                h2[0] = __floats2half2_rn(v.x * scale, v.y * scale);
                h2[1] = __floats2half2_rn(v.z * scale, v.w * scale);
            }
        } else {
            for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x)
                hr[j] = __float2half_rn(xr[j] * scale);
        }
        if (a.accumulate && scale != 1.0f) {
            float *yr = a.y + r * a.ldy;
            for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) yr[j] *= scale;
        }
        if (threadIdx.x == 0) a.inv_scale[r] = inv;
    }
}

struct UnscaleArgs {
    const float *inv_scale;
    float *y;
    int64_t ldy, rows, n;
};

// Undoes the row scale on the GEMM output. Rows are scaled only when an input row exceeds
// kF16RowMax, so the common case is a launch with nothing to do: each block reads the inverse
// scales of blockDim.x rows (one per thread) and leaves at once unless one of them is not 1
// (__syncthreads_or: block-uniform); then the block rescales those rows together. A grid of
// rows / blockDim.x blocks instead of one block per row (device run 23: 2.2 us per launch at
// 512 rows, 145 launches per qwen3-4b chunk).
__global__ void unscale_rows_kernel(const __grid_constant__ UnscaleArgs a) {
    for (int64_t r0 = int64_t(blockIdx.x) * blockDim.x; r0 < a.rows; r0 += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = r0 + threadIdx.x;
        const float mine = r < a.rows ? a.inv_scale[r] : 1.0f;
        if (!__syncthreads_or(mine != 1.0f)) continue;
        const int64_t n_rows = a.rows - r0 < blockDim.x ? a.rows - r0 : blockDim.x;
        for (int64_t i = 0; i < n_rows; ++i) {
            const float inv = a.inv_scale[r0 + i];  // the same address in every thread
            if (inv == 1.0f) continue;
            float *yr = a.y + (r0 + i) * a.ldy;
            for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) yr[j] *= inv;
        }
    }
}

// The unscale launch: one block of kCastThreads per kCastThreads rows.
pf_status launch_unscale(const float *inv, float *y, int64_t ldy, int64_t rows, int64_t n, cudaStream_t st) {
    const int grid = int(std::min<int64_t>(ceil_div(rows, kCastThreads), kMaxRowBlocks));
    unscale_rows_kernel<<<grid, kCastThreads, 0, st>>>(UnscaleArgs{inv, y, ldy, rows, n});
    PF_LAUNCH_CHECK("unscale_rows_kernel");
    return PF_STATUS_OK;
}

// ------------------------------------------------------------------ the legs

QMatrix blocks_of(const pf_weight *w) { return QMatrix{w->data, w->qtype, w->n, w->k}; }

pf_status project_f32(const ProjEnv &env, WeightForm form, pf_weight *w, const float *x, int64_t rows, int64_t ldx,
                      float *y, int64_t ldy, bool accumulate) {
    pf_context *ctx = env.ctx;
    const int n = int(w->n), k = int(w->k);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    PF_CUBLAS_TRY(cublasSetPointerMode(ctx->blas_f32, CUBLAS_POINTER_MODE_HOST));
    if (rows == 1 && form == WeightForm::F32Slabs)  // one token: read the blocks once, fp32 math
        return qgemv(blocks_of(w), x, y, accumulate, ctx->stream);
    if (form == WeightForm::F32) {  // in place
        PF_CUBLAS_TRY(cublasSgemm(ctx->blas_f32, CUBLAS_OP_T, CUBLAS_OP_N, n, int(rows), k, &alpha,
                                  static_cast<const float *>(w->data), k, x, int(ldx), &beta, y,
                                  int(ldy)));
        return PF_STATUS_OK;
    }
    const int64_t slab = slab_rows(w->n, w->k, sizeof(float));
    PF_TRY(scratch_reserve(ctx, *env.w32, size_t(slab) * size_t(k) * sizeof(float),
                           "project (f32 leg): weight scratch"));
    float *ws = static_cast<float *>(env.w32->ptr);
    const int64_t rb = row_bytes(w);
    for (int64_t n0 = 0; n0 < w->n; n0 += slab) {
        const int64_t nc = std::min(slab, w->n - n0);
        // Same stream: the next slab's dequant waits for this slab's GEMM to finish reading.
        PF_TRY(dequantize(static_cast<const uint8_t *>(w->data) + n0 * rb, w->qtype, nc, w->k, ws,
                          false, ctx->stream));
        PF_CUBLAS_TRY(cublasSgemm(ctx->blas_f32, CUBLAS_OP_T, CUBLAS_OP_N, int(nc), int(rows), k,
                                  &alpha, ws, k, x, int(ldx), &beta, y + n0, int(ldy)));
    }
    return PF_STATUS_OK;
}

// The fp16 matrix of an f16-leg form that has one whole (the cache, an F16 weight in place),
// nullptr for the slabs.
const __half *f16_whole(WeightForm form, const pf_weight *w) {
    return form == WeightForm::F16Cache ? w->f16
           : form == WeightForm::F16    ? static_cast<const __half *>(w->data)
                                        : nullptr;
}

// X's rows in the f16 leg's input form in env.x16: [rows][k] fp16 (*xh), then the per-row
// inverse scales (*inv), one cast pass (and the accumulate target's pre-scale); `extra_w16`
// bytes of env.w16 are reserved first (the streaming slabs), so that an OOM leaves Y untouched.
pf_status cast_input(const ProjEnv &env, const float *x, int64_t rows, int64_t ldx, int64_t k, float *y, int64_t ldy,
                     int64_t n, bool accumulate, size_t extra_w16, __half **xh, float **inv) {
    pf_context *ctx = env.ctx;
    const size_t xh_bytes = align_up(size_t(rows) * size_t(k) * sizeof(__half), 256);
    PF_TRY(scratch_reserve(ctx, *env.x16, xh_bytes + size_t(rows) * sizeof(float),
                           "project (f16 leg): activation scratch"));
    if (extra_w16) PF_TRY(scratch_reserve(ctx, *env.w16, extra_w16, "project (f16 streaming leg): weight scratch"));
    *xh = static_cast<__half *>(env.x16->ptr);
    *inv = reinterpret_cast<float *>(static_cast<char *>(env.x16->ptr) + xh_bytes);
    const int grid = int(std::min<int64_t>(rows, kMaxRowBlocks));
    const CastArgs ca{x, ldx, rows, k, *xh, *inv, y, ldy, n, accumulate ? 1 : 0};
    const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0 && k % 4 == 0;
    if (vec)
        cast_rows_f16_kernel<true><<<grid, kCastThreads, 0, ctx->stream>>>(ca);
    else
        cast_rows_f16_kernel<false><<<grid, kCastThreads, 0, ctx->stream>>>(ca);
    PF_LAUNCH_CHECK("cast_rows_f16_kernel<%s>", vec ? "true" : "false");
    return PF_STATUS_OK;
}

// Whether a fused view of F16Blocks parts dequantizes them into one slab (the group's fp16 fits
// the slab bound), so that one GEMM runs them all.
bool group_slab(const pf_weight *w) {
    return w->nparts > 0 && size_t(w->n) * size_t(w->k) * sizeof(__half) <= kSlabBytes;
}

// Calls fn(part, col) for each part of a fused view in order, col its first output column.
template <class F>
pf_status each_part(const pf_weight *w, F &&fn) {
    int64_t col = 0;
    for (int32_t i = 0; i < w->nparts; ++i) {
        PF_TRY(fn(w->parts[i], col));
        col += w->parts[i]->n;
    }
    return PF_STATUS_OK;
}

// Bytes of the fp16 slab project_slabs dequantizes w into (a fused view: the group's, or its
// largest part's where the group does not fit the bound).
size_t slab_bytes16(const pf_weight *w) {
    if (group_slab(w)) return size_t(w->n) * size_t(w->k) * sizeof(__half);
    size_t most = 0;
    for (int32_t i = 0; i < w->nparts; ++i) most = std::max(most, slab_bytes16(w->parts[i]));
    if (w->nparts > 0) return most;
    return size_t(slab_rows(w->n, w->k, sizeof(__half))) * size_t(w->k) * sizeof(__half);
}

// The per-call fp16 slabs on fp16 rows in the f16 leg's input form: w's blocks dequantized into
// env.w16 by the prewarm's kernel (persistent CTAs over 8192-element tiles: bitwise dequantize()'s
// fp16, the cache's bits, at ~2x its bandwidth) and the cache's GEMM on each slab (gemm_f16: the
// plan's algorithm for the shape, as the cache's), then the unscale. A fused view that fits one
// slab (project_blocks_rows sends no other here) has its parts side by side in it and one GEMM.
// The streaming form (F16Slabs) runs it after its cast; the blocks form (F16Blocks) from
// env.blocks_slab_rows rows on, where it beats the GEMM on the blocks: the dequantization reads
// the blocks and writes 2 bytes a weight once a call, ~15-30 us a 4B matrix, against a GEMM of
// 2048 rows that the GEMM on the blocks runs at 0.44-0.64x cuBLAS (NOTES.md, session 40).
pf_status project_slabs(const ProjEnv &env, const pf_weight *w, const __half *x16, const float *inv, int64_t rows,
                        MatF y, bool accumulate) {
    pf_context *ctx = env.ctx;
    const int64_t n = w->n, k = w->k;
    PF_CHECK_ARG(rows <= INT_MAX && y.ld >= n && y.ld <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
                 "project (fp16 slabs): rows=%lld n=%lld k=%lld ldy=%lld", (long long)rows, (long long)n,
                 (long long)k, (long long)y.ld);
    PF_TRY(scratch_reserve(ctx, *env.w16, slab_bytes16(w), "project (f16 leg, fp16 slabs): weight scratch"));
    PF_CUBLAS_TRY(cublasSetPointerMode(ctx->blas_tc, CUBLAS_POINTER_MODE_HOST));
    __half *ws = static_cast<__half *>(env.w16->ptr);
    const float beta = accumulate ? 1.0f : 0.0f;
    const __half *ahead = nullptr;  // the slab dequantized ahead by the executor's ring
    if (env.ring && slab_whole(w)) PF_TRY(slab_ring_take(ctx, env.ring, w, &ahead));
    if (ahead) {
        PF_TRY(gemm_f16(ctx, env.plan, F16Gemm{ahead, n, k, x16, rows, y, beta}));
        PF_TRY(slab_ring_done(ctx, env.ring));
    } else if (w->nparts > 0) {  // a fused view that fits one slab: the parts side by side, one GEMM
        std::vector<prewarm_job> jobs;
        append_side_by_side(jobs, w->parts, size_t(w->nparts), ws);
        PF_TRY(prewarm_dequantize(jobs, ctx->stream));
        PF_TRY(gemm_f16(ctx, env.plan, F16Gemm{ws, n, k, x16, rows, y, beta}));
    } else {
        const int64_t slab = slab_rows(n, k, sizeof(__half)), rb = row_bytes(w);
        for (int64_t n0 = 0; n0 < n; n0 += slab) {
            const int64_t nc = std::min(slab, n - n0);
            // Same stream: the next slab's dequantization waits for this slab's GEMM to finish reading.
            PF_TRY(prewarm_dequantize(
                {prewarm_job{static_cast<const uint8_t *>(w->data) + n0 * rb, ws, nc * k, w->qtype}}, ctx->stream));
            PF_TRY(gemm_f16(ctx, env.plan, F16Gemm{ws, nc, k, x16, rows, MatF{y.ptr + n0, y.ld}, beta}));
        }
    }
    return inv ? launch_unscale(inv, y.ptr, y.ld, rows, n, ctx->stream) : PF_STATUS_OK;
}

pf_status project_f16(const ProjEnv &env, WeightForm form, pf_weight *w, const float *x, int64_t rows, int64_t ldx,
                      float *y, int64_t ldy, bool accumulate) {
    pf_context *ctx = env.ctx;
    const int64_t n = w->n, k = w->k;
    const __half *whole = f16_whole(form, w);
    // One token and no fp16 copy: a streaming dequant would read and write the whole weight;
    // the GEMV reads the blocks once (fp32 math: more exact than the leg promises, no overflow).
    if (rows == 1 && !whole) return qgemv(blocks_of(w), x, y, accumulate, ctx->stream);
    __half *xh = nullptr;
    float *inv = nullptr;
    PF_TRY(cast_input(env, x, rows, ldx, k, y, ldy, n, accumulate, whole ? 0 : slab_bytes16(w), &xh, &inv));
    if (!whole) return project_slabs(env, w, xh, inv, rows, MatF{y, ldy}, accumulate);  // streaming
    PF_CUBLAS_TRY(cublasSetPointerMode(ctx->blas_tc, CUBLAS_POINTER_MODE_HOST));
    PF_TRY(gemm_f16(ctx, env.plan, F16Gemm{whole, n, k, xh, rows, MatF{y, ldy}, accumulate ? 1.0f : 0.0f}));
    return launch_unscale(inv, y, ldy, rows, n, ctx->stream);
}

pf_status project_blocks_rows(const ProjEnv &env, const pf_weight *w, const __half *x16, const float *inv,
                              int64_t rows, MatF y, bool accumulate);

// A fused view's parts at the GEMV form's row counts: each run of consecutive parts of one type
// that it reads (up to kQ16GemvMaxParts) in one launch, the others one by one (project_blocks_rows).
pf_status gemv_parts(const ProjEnv &env, const pf_weight *w, const __half *x16, const float *inv, int64_t rows,
                     MatF y, bool accumulate) {
    const auto runs = [&](const pf_weight *p) {
        return gemm_q16_gemv_runs(p->qtype, p->data, p->k, rows, env.blocks_gemv_rows);
    };
    int64_t col = 0;
    for (int32_t i = 0; i < w->nparts;) {
        const pf_weight *p = w->parts[i];
        int32_t j = i + 1;
        while (runs(p) && j < w->nparts && j - i < kQ16GemvMaxParts && w->parts[j]->qtype == p->qtype &&
               runs(w->parts[j]))
            ++j;
        if (j - i == 1) {
            PF_TRY(project_blocks_rows(env, p, x16, inv, rows, y.cols_from(col), accumulate));
            col += p->n;
            i = j;
            continue;
        }
        Q16Gemm g;
        g.qtype = p->qtype;
        g.k = p->k;
        g.blocks = p->data;
        g.nparts = j - i;
        for (int32_t q = i; q < j; ++q) {
            g.part_blocks[q - i] = w->parts[q]->data;
            g.part_n[q - i] = w->parts[q]->n;
            g.n += w->parts[q]->n;
        }
        g.x16 = x16;
        g.inv = inv;
        g.rows = rows;
        g.y = y.cols_from(col);
        g.accumulate = accumulate;
        g.gemv_rows = env.blocks_gemv_rows;
        PF_TRY(gemm_q16(g, env.ctx->stream));
        col += g.n;
        i = j;
    }
    return PF_STATUS_OK;
}

// The f16 leg on the GGUF blocks (F16Blocks) on fp16 rows in its input form: the GEMM with the
// blocks dequantized on the chip and the unscale fused (gemm_q16), or from env.blocks_slab_rows
// rows on the per-call slabs (project_slabs).
pf_status project_blocks_rows(const ProjEnv &env, const pf_weight *w, const __half *x16, const float *inv,
                              int64_t rows, MatF y, bool accumulate) {
    const bool slabs = rows >= env.blocks_slab_rows;
    if (w->nparts > 0 && !slabs && rows <= env.blocks_gemv_rows)  // the GEMV form: runs of parts in one launch
        return gemv_parts(env, w, x16, inv, rows, y, accumulate);
    if (w->nparts > 0 && !(slabs && group_slab(w)))  // a fused view: its parts one by one
        return each_part(w, [&](const pf_weight *p, int64_t col) {
            return project_blocks_rows(env, p, x16, inv, rows, y.cols_from(col), accumulate);
        });
    if (slabs) return project_slabs(env, w, x16, inv, rows, y, accumulate);
    Q16Gemm g;
    g.blocks = w->data;
    g.qtype = w->qtype;
    g.n = w->n;
    g.k = w->k;
    g.x16 = x16;
    g.inv = inv;
    g.rows = rows;
    g.y = y;
    g.accumulate = accumulate;
    g.gemv_rows = env.blocks_gemv_rows;
    return gemm_q16(g, env.ctx->stream);
}

// The same on fp32 rows: cast to the input form first; one row: the GEMV on the blocks (as for
// the slabs).
pf_status project_blocks(const ProjEnv &env, const pf_weight *w, const float *x, int64_t rows, int64_t ldx,
                         float *y, int64_t ldy, bool accumulate) {
    if (rows == 1 && w->nparts > 0)  // a fused view: the GEMV of each part
        return each_part(w, [&](const pf_weight *p, int64_t col) {
            return qgemv(blocks_of(p), x, y + col, accumulate, env.ctx->stream);
        });
    if (rows == 1) return qgemv(blocks_of(w), x, y, accumulate, env.ctx->stream);
    __half *xh = nullptr;
    float *inv = nullptr;
    // The slabs' scratch before the cast (which pre-scales an accumulate target): an OOM leaves Y as it was.
    PF_TRY(cast_input(env, x, rows, ldx, w->k, y, ldy, w->n, accumulate,
                      rows >= env.blocks_slab_rows ? slab_bytes16(w) : 0, &xh, &inv));
    return project_blocks_rows(env, w, xh, inv, rows, MatF{y, ldy}, accumulate);
}

// The f16 leg on fp16 rows already in its form: the GEMM of project_f16 and its unscale, no cast
// pass. `whole`: the weight's fp16 matrix (f16_whole). inv nullptr: every row unscaled (no
// unscale pass; pf_project_f16x).
pf_status project_f16_rows(const ProjEnv &env, const __half *whole, pf_weight *w, const __half *x16, const float *inv,
                           int64_t rows, MatF ym, bool accumulate) {
    pf_context *ctx = env.ctx;
    float *y = ym.ptr;
    const int64_t ldy = ym.ld;
    PF_CHECK_ARG(whole != nullptr, "project: the weight (n=%lld k=%lld) has no fp16 copy",
                 (long long)w->n, (long long)w->k);
    PF_CHECK_ARG(rows >= 0 && rows <= INT_MAX && ldy >= w->n && ldy <= INT_MAX && w->n <= INT_MAX &&
                     w->k <= INT_MAX,
                 "project (fp16 rows): rows=%lld n=%lld k=%lld ldy=%lld", (long long)rows,
                 (long long)w->n, (long long)w->k, (long long)ldy);
    if (rows == 0) return PF_STATUS_OK;
    PF_CUBLAS_TRY(cublasSetPointerMode(ctx->blas_tc, CUBLAS_POINTER_MODE_HOST));
    PF_TRY(gemm_f16(ctx, env.plan, F16Gemm{whole, w->n, w->k, x16, rows, MatF{y, ldy}, accumulate ? 1.0f : 0.0f}));
    if (!inv) return PF_STATUS_OK;  // every row unscaled (pf_project_f16x with inv NULL)
    return launch_unscale(inv, y, ldy, rows, w->n, ctx->stream);
}

size_t f16_bytes(const pf_weight *w) { return size_t(w->n) * size_t(w->k) * sizeof(__half); }

}  // namespace

// ------------------------------------------------------------------ entry points

void bare_view(const pf_weight *first, int64_t n, pf_weight *view) {
    view->f16 = nullptr;
    view->f16_arena = nullptr;
    view->f16_block = nullptr;
    view->f16_stream = false;
    view->i8 = nullptr;
    view->i8_r = view->i8_b = nullptr;
    view->i8_arena = nullptr;
    view->i8_block = nullptr;
    view->parts = nullptr;
    view->nparts = 0;
    view->data = nullptr;
    view->bytes = 0;
    view->ctx = first->ctx;
    view->qtype = first->qtype;
    view->n = n;
    view->k = first->k;
}

int64_t weight_slab_rows(int64_t n, int64_t k, size_t elem_bytes) { return slab_rows(n, k, elem_bytes); }

__half *append_side_by_side(std::vector<prewarm_job> &jobs, const pf_weight *const *parts, size_t count,
                            __half *dst) {
    for (size_t i = 0; i < count; ++i) {
        const pf_weight *p = parts[i];
        jobs.push_back(prewarm_job{p->data, dst, p->n * p->k, p->qtype});
        dst += p->n * p->k;
    }
    return dst;
}

bool slab_whole(const pf_weight *w) { return w->nparts > 0 ? group_slab(w) : slab_rows(w->n, w->k, sizeof(__half)) >= w->n; }

void slab_gemm_widths(const pf_weight *w, std::vector<int64_t> *out) {
    if (group_slab(w)) {
        out->push_back(w->n);
    } else if (w->nparts > 0) {
        (void)each_part(w, [&](const pf_weight *p, int64_t) {
            slab_gemm_widths(p, out);
            return PF_STATUS_OK;
        });
    } else {
        const int64_t slab = slab_rows(w->n, w->k, sizeof(__half));
        for (int64_t n0 = 0; n0 < w->n; n0 += slab) out->push_back(std::min(slab, w->n - n0));
    }
}

pf_status int8_leg_check(const char *who) {
    if (gemm_i8_available()) return PF_STATUS_OK;
    return fail(PF_STATUS_UNSUPPORTED,
                "%s: the 8-bit leg (PF_GEMM_INT8) runs on Hopper only (an sm_90a build on a compute "
                "capability 9.0 device); use PF_GEMM_F16 or PF_GEMM_F32", who);
}

pf_status project(const ProjEnv &env, const ProjRoute &r, pf_weight *w, const ProjIn &in, MatF ym, int64_t rows,
                  bool accumulate) {
    if (in.x16) {  // the producers' fp16 rows
        switch (r.weight) {
            case WeightForm::F16Cache:
            case WeightForm::F16: return project_f16_rows(env, f16_whole(r.weight, w), w, in.x16, in.inv, rows, ym,
                                                          accumulate);
            case WeightForm::F16Blocks:
                PF_CHECK_ARG(rows >= 0, "project (fp16 rows): rows=%lld", (long long)rows);
                if (rows == 0) return PF_STATUS_OK;
                return project_blocks_rows(env, w, in.x16, in.inv, rows, ym, accumulate);
            case WeightForm::I8Copy:
                PF_CHECK_ARG(!accumulate, "project: the 8-bit leg does not accumulate on fp16 rows");
                return project_i8_rows(env, w, in.x16, in.inv, rows, ym);
            default:
                return fail(PF_STATUS_INVALID_ARGUMENT, "project: the %s weight form takes fp32 rows, not fp16 ones",
                            weight_form_name(r.weight));
        }
    }
    const float *x = in.x.ptr;
    float *y = ym.ptr;
    const int64_t ldx = in.x.ld, ldy = ym.ld;
    PF_CHECK_ARG(rows >= 0 && ldx >= w->k && ldy >= w->n,
                 "project: rows=%lld ldx=%lld ldy=%lld (need rows >= 0, ldx >= k=%lld, ldy >= n=%lld)",
                 (long long)rows, (long long)ldx, (long long)ldy, (long long)w->k, (long long)w->n);
    PF_CHECK_ARG(rows <= INT_MAX && w->n <= INT_MAX && w->k <= INT_MAX && ldx <= INT_MAX &&
                     ldy <= INT_MAX,
                 "project: rows=%lld n=%lld k=%lld ldx=%lld ldy=%lld must each fit in int32 (cuBLAS)",
                 (long long)rows, (long long)w->n, (long long)w->k, (long long)ldx, (long long)ldy);
    if (rows == 0) return PF_STATUS_OK;
    switch (r.weight) {
        case WeightForm::F32:
        case WeightForm::F32Slabs: return project_f32(env, r.weight, w, x, rows, ldx, y, ldy, accumulate);
        case WeightForm::F16Cache:
        case WeightForm::F16:
        case WeightForm::F16Slabs: return project_f16(env, r.weight, w, x, rows, ldx, y, ldy, accumulate);
        case WeightForm::F16Blocks: return project_blocks(env, w, x, rows, ldx, y, ldy, accumulate);
        case WeightForm::I8Copy:
        case WeightForm::I8Slabs: return project_i8(env, w, x, rows, ldx, y, ldy, accumulate);
    }
    return fail(PF_STATUS_INTERNAL, "project: weight form %d", int(r.weight));
}

namespace {

// One group of the prewarm: the fp16 caches of `parts` back to back ([sum n][k] when they
// share k). A lone weight is a unit of one.
struct F16Unit {
    std::vector<pf_weight *> parts;
    size_t bytes = 0;
};

// The cache of a prewarm is allocated in pieces, each launched as soon as it is allocated, so
// that the device dequantizes piece p while the host maps piece p + 1: one cudaMalloc of a
// whole 4B model's cache (~7.7 GB) took ~1 ms before the first launch (run 14), about a fifth
// of the prewarm. The first piece is small (its allocation is the only one the device waits
// for) and each next one twice the last: at ~0.13 ms per GB to allocate against ~0.4 ms per GB
// written to dequantize, an allocation ends while the piece before it is still being written,
// and a model is a handful of pieces (5 for 7.7 GB). A piece holds whole units, in order (a
// fused group stays one contiguous block), so it may outgrow its target. The first piece's target
// is the plan's (PrewarmPlan: 256 MiB by default).

struct F16Piece {
    size_t first = 0, end = 0;  // units [first, end)
    size_t bytes = 0;
    size_t parts = 0;           // weights in those units
};

// Consecutive runs of `units`: the first of at least `first_bytes`, each next of at least
// twice the last target, the rest in the last one; one run of all when first_bytes is 0.
std::vector<F16Piece> plan_pieces(const std::vector<F16Unit> &units, size_t first_bytes) {
    std::vector<F16Piece> pieces;
    size_t target = first_bytes;
    F16Piece cur;
    for (size_t i = 0; i < units.size(); ++i) {
        cur.end = i + 1;
        cur.bytes += units[i].bytes;
        cur.parts += units[i].parts.size();
        if (first_bytes != 0 && cur.bytes >= target) {
            pieces.push_back(cur);
            cur = F16Piece{i + 1, i + 1, 0, 0};
            target = target > SIZE_MAX / 2 ? SIZE_MAX : 2 * target;
        }
    }
    if (cur.end > cur.first) pieces.push_back(cur);
    return pieces;
}

// Caches the weights of `units` (`bytes` in all) in new arenas, back to back in order, one
// arena per piece (plan_pieces), and queues each piece's dequantization (prewarm.cu) right after
// its allocation. Events `start` / `stop` (may be nullptr) are recorded before the first
// piece's launches (after its allocation) and after the last piece's: device_ms spans every
// launch and any wait of the device for a later piece's allocation, not the first allocation.
// Nothing is waited for on success; on failure every piece's launches are drained, every arena
// freed, and nothing is cached.
pf_status cache_units(pf_context *ctx, const std::vector<F16Unit> &units, size_t bytes,
                      const PrewarmPlan &plan, cudaEvent_t start, cudaEvent_t stop) {
    if (units.empty()) return PF_STATUS_OK;
    const std::vector<F16Piece> pieces = plan_pieces(units, plan.first_piece_bytes);
    const int fail_piece = plan.fail_piece;
    size_t most_parts = 0, planned = 0;
    for (const F16Piece &p : pieces) {
        most_parts = std::max(most_parts, p.parts);
        planned += p.bytes;
    }
    if (planned != bytes)
        return fail(PF_STATUS_INTERNAL, "prewarm: pieces of %zu bytes for a cache of %zu", planned,
                    bytes);
    // Host allocations before the first device one: from here on nothing below throws.
    std::vector<F16Arena *> arenas;
    arenas.reserve(pieces.size());
    std::vector<prewarm_job> jobs;
    jobs.reserve(most_parts);
    auto rollback = [&](pf_status s) {
        (void)cudaStreamSynchronize(ctx->stream);  // launched pieces may still write their arenas
        for (F16Arena *a : arenas) {
            device_free(ctx, a->ptr, a->bytes);
            delete a;
        }
        return s;
    };
    for (size_t p = 0; p < pieces.size(); ++p) {
        char what[96];
        if (pieces.size() > 1)
            std::snprintf(what, sizeof what, "fp16 weight caches (prewarm, piece %zu of %zu)",
                          p + 1, pieces.size());
        else
            std::snprintf(what, sizeof what, "%s",
                          units.size() > 1            ? "fp16 weight caches (prewarm)"
                          : units[0].parts.size() > 1 ? "fused fp16 weight cache"
                                                      : "fp16 weight cache");
        F16Arena *arena = nullptr;
        const pf_status as =
            int(p) == fail_piece
                ? fail(PF_STATUS_OUT_OF_MEMORY,
                       "%s: allocation refused (tuning.prewarm_fail_piece=%d)", what, fail_piece + 1)
                : f16_arena_create(ctx, pieces[p].bytes, &arena, what);
        if (as != PF_STATUS_OK) return rollback(as);
        arenas.push_back(arena);
        jobs.clear();
        __half *at = static_cast<__half *>(arena->ptr);
        for (size_t u = pieces[p].first; u < pieces[p].end; ++u)
            at = append_side_by_side(jobs, units[u].parts.data(), units[u].parts.size(), at);
        cudaError_t e = p == 0 && start ? cudaEventRecord(start, ctx->stream) : cudaSuccess;
        if (e != cudaSuccess)
            return rollback(cuda_fail(e, __FILE__, __LINE__, "prewarm: cudaEventRecord"));
        if (const pf_status s = prewarm_dequantize(jobs, ctx->stream); s != PF_STATUS_OK)
            return rollback(s);
    }
    if (stop)
        if (const cudaError_t e = cudaEventRecord(stop, ctx->stream); e != cudaSuccess)
            return rollback(cuda_fail(e, __FILE__, __LINE__, "prewarm: cudaEventRecord"));
    for (size_t p = 0; p < pieces.size(); ++p) {
        __half *at = static_cast<__half *>(arenas[p]->ptr);
        for (size_t u = pieces[p].first; u < pieces[p].end; ++u)
            for (pf_weight *w : units[u].parts) {
                w->f16 = at;
                w->f16_arena = arenas[p];
                w->f16_block = units[u].parts.front();
                arenas[p]->refs++;
                at += w->n * w->k;
            }
    }
    return PF_STATUS_OK;
}

// Two events for the prewarm's device time; destroyed with the scope. Timing is optional: a
// failure to create them leaves both nullptr (device_ms then reads 0).
struct EventPair {
    cudaEvent_t ev[2] = {nullptr, nullptr};
    EventPair() {
        if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
            (void)cudaGetLastError();
            release();
        }
    }
    ~EventPair() { release(); }
    EventPair(const EventPair &) = delete;
    EventPair &operator=(const EventPair &) = delete;
    void release() {
        for (cudaEvent_t &e : ev)
            if (e) (void)cudaEventDestroy(e), e = nullptr;
    }
    double elapsed_ms() const {
        float ms = 0;
        if (!ev[0] || cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return double(ms);
    }
};

// ------------------------------------------------------------------ the cache rule
//
// A model's prewarm caches a unit (a fused group, or a lone matrix) whose every part the f16 leg
// can read from its blocks only where the cached GEMM is measured faster than the blocks' by more
// than the rule's margin at the rule's rows (PrewarmPlan::rule_rows, a session's default step):
// the issue "Weights at their GGUF size" asks that the file's size be kept wherever the cache
// buys less than that. What is timed is what a session runs at those rows: the blocks' form
// (project_blocks_rows: the per-call slabs and the cache's GEMM from gemm_blocks_slab_rows rows
// on, the GEMM on the blocks or the GEMV below) against the GEMM on the parts' fp16 side by side
// (the fused block the prewarm would lay out), both on the same fp16 rows, GemmEx (an executor's
// cuBLASLt choice is the same algorithm for both at the slab rows), a warm-up each and the
// medians of 5 interleaved rounds. Each shape is timed once per device and process (as gemm_lt's
// choice is), so two models of one shape in a process decide alike.

struct RuleTime {
    double cache_ms = 0, blocks_ms = 0;
    bool measured = false;
};

struct RuleKey {
    int device;
    int64_t rows, slab_rows, gemv_rows, k;
    std::vector<std::pair<int32_t, int64_t>> parts;  // (qtype, n) in order
    bool operator<(const RuleKey &o) const {
        return std::tie(device, rows, slab_rows, gemv_rows, k, parts) <
               std::tie(o.device, o.rows, o.slab_rows, o.gemv_rows, o.k, o.parts);
    }
};

std::mutex g_rule_mu;
std::map<RuleKey, RuleTime> g_rule_times;

// Whether the rule applies to a unit: every part a block type that the f16 leg reads in place.
bool rule_unit(const std::vector<pf_weight *> &parts) {
    for (const pf_weight *w : parts)
        if (!qtype_is_block(w->qtype) || w->nparts != 0 || !w->data) return false;
    return !parts.empty();
}

// Times one unit (RuleTime.measured false, status OK, when its scratch does not fit: the caller
// then caches it).
pf_status rule_time(pf_context *ctx, const std::vector<pf_weight *> &parts, const PrewarmPlan &plan, RuleTime *out) {
    *out = RuleTime{};
    const int64_t k = parts.front()->k, rows = plan.rule_rows;
    RuleKey key{ctx->device, rows, plan.rule_slab_rows, plan.rule_gemv_rows, k, {}};
    int64_t n = 0;
    for (const pf_weight *w : parts) {
        key.parts.emplace_back(w->qtype, w->n);
        n += w->n;
    }
    {
        std::lock_guard<std::mutex> lock(g_rule_mu);
        const auto it = g_rule_times.find(key);
        if (it != g_rule_times.end()) {
            *out = it->second;
            return PF_STATUS_OK;
        }
    }
    if (rows > INT_MAX || n > INT_MAX || k > INT_MAX) return PF_STATUS_OK;  // not a cuBLAS shape: cache
    pf_weight view;
    pf_weight *w = parts.front();
    if (parts.size() > 1) {
        ProjRoute r;
        r.leg = PF_GEMM_F16;
        r.weight = WeightForm::F16Blocks;
        if (!fused_view(r, parts.data(), int32_t(parts.size()), &view)) return PF_STATUS_OK;
        w = &view;
    }
    // Scratch of the call's own (freed before return): the fp16 rows, the output, and the unit's
    // fp16: from the slab rows on, the blocks' form's own slab (each of its runs writes the cache's
    // bits there, which the cache's GEMM then reads), else a copy dequantized here.
    Scratch xs, ys, w16, x16, w32, spare;
    struct Release {
        pf_context *ctx;
        Scratch *s[6];
        ~Release() {
            (void)cudaStreamSynchronize(ctx->stream);
            for (Scratch *p : s) scratch_release(ctx, *p);
        }
    } release{ctx, {&xs, &ys, &w16, &x16, &w32, &spare}};
    const bool slabs = rows >= plan.rule_slab_rows;
    const size_t xb = size_t(rows) * size_t(k) * sizeof(__half), yb = size_t(rows) * size_t(n) * sizeof(float);
    const size_t wb = size_t(n) * size_t(k) * sizeof(__half);
    if (slabs && slab_bytes16(w) != wb) return PF_STATUS_OK;  // slabs of parts of it, not its whole fp16: cache
    for (auto [sc, b] : {std::pair<Scratch *, size_t>{&xs, xb}, {&ys, yb}, {&w16, wb}}) {
        const pf_status st = scratch_reserve(ctx, *sc, b, "prewarm cache rule: scratch");
        if (st == PF_STATUS_OUT_OF_MEMORY) return PF_STATUS_OK;  // not measured: the caller caches
        PF_TRY(st);
    }
    // Rows of a moderate size (every element 0x3c3c, about 1.06): the times do not depend on them.
    PF_CUDA_TRY(cudaMemsetAsync(xs.ptr, 0x3c, xb, ctx->stream));
    if (!slabs) {
        std::vector<prewarm_job> jobs;
        append_side_by_side(jobs, parts.data(), parts.size(), static_cast<__half *>(w16.ptr));
        PF_TRY(prewarm_dequantize(jobs, ctx->stream));
    }
    ProjEnv env;
    env.ctx = ctx;
    env.w16 = slabs ? &w16 : &spare;  // below the slab rows the blocks' forms use no slab
    env.x16 = &x16;
    env.w32 = &w32;
    env.blocks_slab_rows = key.slab_rows;
    env.blocks_gemv_rows = key.gemv_rows;
    const __half *xh = static_cast<const __half *>(xs.ptr);
    const MatF y{static_cast<float *>(ys.ptr), n};
    auto blocks = [&] { return project_blocks_rows(env, w, xh, nullptr, rows, y, false); };
    auto cached = [&] {
        PF_CUBLAS_TRY(cublasSetPointerMode(ctx->blas_tc, CUBLAS_POINTER_MODE_HOST));
        return gemm_f16(ctx, nullptr, F16Gemm{static_cast<const __half *>(w16.ptr), n, k, xh, rows, y, 0.0f});
    };
    // A form that cannot run the unit (an error, cleared) is not measured: the caller caches it.
    if (blocks() != PF_STATUS_OK || cached() != PF_STATUS_OK) return PF_STATUS_OK;
    EventPair ev;
    cudaEvent_t mid = nullptr;
    if (!ev.ev[0] || cudaEventCreate(&mid) != cudaSuccess) {
        (void)cudaGetLastError();
        return PF_STATUS_OK;  // no events: not measured
    }
    std::vector<double> tb, tc;
    pf_status st = PF_STATUS_OK;
    for (int round = 0; round < 5 && st == PF_STATUS_OK; ++round) {
        (void)cudaEventRecord(ev.ev[0], ctx->stream);
        st = blocks();
        (void)cudaEventRecord(mid, ctx->stream);
        if (st == PF_STATUS_OK) st = cached();
        (void)cudaEventRecord(ev.ev[1], ctx->stream);
        if (st == PF_STATUS_OK && cudaEventSynchronize(ev.ev[1]) == cudaSuccess) {
            float m0 = 0, m1 = 0;
            if (cudaEventElapsedTime(&m0, ev.ev[0], mid) == cudaSuccess &&
                cudaEventElapsedTime(&m1, mid, ev.ev[1]) == cudaSuccess) {
                tb.push_back(m0);
                tc.push_back(m1);
            }
        }
    }
    (void)cudaEventDestroy(mid);
    (void)cudaGetLastError();
    if (st != PF_STATUS_OK || tb.size() < 3) return PF_STATUS_OK;
    std::sort(tb.begin(), tb.end());
    std::sort(tc.begin(), tc.end());
    out->blocks_ms = tb[tb.size() / 2];
    out->cache_ms = tc[tc.size() / 2];
    out->measured = out->cache_ms > 0;
    if (out->measured) {
        std::lock_guard<std::mutex> lock(g_rule_mu);
        g_rule_times.emplace(key, *out);  // a concurrent first measurement of the same key: the first stays
        *out = g_rule_times.find(key)->second;
    }
    return PF_STATUS_OK;
}

// fused_view's F16Cache case: the parts' fp16 caches are consecutive slices of one block.
bool fused_f16_view(pf_weight *const *parts, int32_t count, pf_weight *view) {
    if (count < 1 || !parts[0] || !parts[0]->f16 || !parts[0]->f16_block) return false;
    const pf_weight *first = parts[0];
    const __half *next = first->f16;
    int64_t n = 0;
    for (int32_t i = 0; i < count; ++i) {
        const pf_weight *w = parts[i];
        if (!w || w->f16 != next || w->f16_block != first->f16_block || w->k != first->k ||
            w->ctx != first->ctx)
            return false;
        next += w->n * w->k;
        n += w->n;
    }
    // A view: no reference of its own to the context (view->ref stays empty).
    bare_view(first, n, view);
    view->qtype = PF_QTYPE_F16;
    view->data = first->f16;  // an F16 weight in place: the same bytes as the cache
    view->bytes = size_t(n) * size_t(first->k) * sizeof(__half);
    view->f16 = first->f16;
    return true;
}

// fused_view's F16Blocks case: parts of one k and context, listed (their blocks stay where they
// are; the view holds no copy and no reference of its own).
bool fused_blocks_view(pf_weight *const *parts, int32_t count, pf_weight *view) {
    if (count < 1 || !parts[0]) return false;
    int64_t n = 0;
    for (int32_t i = 0; i < count; ++i) {
        const pf_weight *w = parts[i];
        if (!w || w->k != parts[0]->k || w->ctx != parts[0]->ctx || w->nparts != 0 || !w->data) return false;
        n += w->n;
    }
    bare_view(parts[0], n, view);
    view->parts = parts;
    view->nparts = count;
    return true;
}

}  // namespace

bool fused_view(const ProjRoute &r, pf_weight *const *parts, int32_t count, pf_weight *view) {
    switch (r.weight) {
        case WeightForm::F16Cache: return fused_f16_view(parts, count, view);
        case WeightForm::I8Copy: return fused_i8_view(parts, count, view);
        case WeightForm::F16Blocks: return fused_blocks_view(parts, count, view);
        default: return false;
    }
}

ProjScratchBytes project_scratch_bytes(const ProjRoute &r, const pf_weight *w, int64_t rows,
                                       int64_t blocks_slab_rows) {
    ProjScratchBytes b;
    if (rows < 1) return b;
    const int64_t k = w->k;
    switch (r.weight) {
        case WeightForm::I8Slabs:
            if (w->qtype != PF_QTYPE_F32) b.w32 = size_t(i8_weight_slab_rows(w->n, k)) * size_t(k) * sizeof(float);
            b.w16 = i8_streaming_bytes(w->n, k);
            [[fallthrough]];
        case WeightForm::I8Copy:
            b.x16 = i8_activation_bytes(rows, k);
            return b;
        case WeightForm::F16Slabs:
            if (rows == 1) return b;  // the GEMV
            b.w16 = slab_bytes16(w);
            [[fallthrough]];
        case WeightForm::F16Blocks:  // its fp32 rows' cast (none for one row: the GEMV); its slabs
            if (r.weight == WeightForm::F16Blocks) {
                if (rows == 1) return b;
                if (rows >= blocks_slab_rows) b.w16 = slab_bytes16(w);
            }
            [[fallthrough]];
        case WeightForm::F16Cache:
        case WeightForm::F16:
            b.x16 = align_up(size_t(rows) * size_t(k) * sizeof(__half), 256) + size_t(rows) * sizeof(float);
            return b;
        case WeightForm::F32Slabs:
            if (rows > 1) b.w32 = size_t(slab_rows(w->n, k, sizeof(float))) * size_t(k) * sizeof(float);
            return b;
        case WeightForm::F32: return b;
    }
    return b;
}

pf_status weight_cache_f16(pf_weight *w) {
    if (w->f16) return PF_STATUS_OK;
    return cache_units(w->ctx, {F16Unit{{w}, f16_bytes(w)}}, f16_bytes(w), prewarm_plan(w->ctx->tuning), nullptr,
                       nullptr);
}

pf_status weight_drop_f16(pf_weight *w) {
    if (!w->f16) return PF_STATUS_OK;
    if (w->f16_arena && w->f16_arena->refs == 1)  // the last reference frees the arena
        PF_CUDA_TRY(cudaStreamSynchronize(w->ctx->stream));  // no queued GEMM may still read it
    f16_release(w);
    return PF_STATUS_OK;
}

pf_status prewarm_f16(pf_context *ctx, pf_weight *const *weights, int32_t count,
                      size_t headroom_bytes, const PrewarmPlan &plan, pf_prewarm_report *report) {
    std::vector<std::vector<pf_weight *>> groups;
    groups.reserve(size_t(count));
    for (int32_t i = 0; i < count; ++i) groups.push_back({weights[i]});
    return prewarm_f16_groups(ctx, groups, headroom_bytes, plan, report);
}

pf_status prewarm_f16_groups(pf_context *ctx, const std::vector<std::vector<pf_weight *>> &groups,
                             size_t headroom_bytes, const PrewarmPlan &plan, pf_prewarm_report *report) {
    const auto t0 = std::chrono::steady_clock::now();
    pf_prewarm_report rep;
    std::memset(&rep, 0, sizeof rep);
    rep.struct_size = sizeof rep;
    rep.headroom_bytes = headroom_bytes;
    std::function<void()> explain;  // fills rep.why (set once the rule has run)
    auto finish = [&](pf_status s) {
        rep.elapsed_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t0).count();
        if (explain) explain();
        if (report) *report = rep;
        return s;
    };

    // Distinct weights in the caller's order, and the allocations to make: a group of >= 2
    // fresh, uncached weights of one k is one block; any other member is cached alone.
    std::vector<pf_weight *> set;
    std::unordered_set<const pf_weight *> seen;  // a model has hundreds: no quadratic search
    std::vector<F16Unit> units;
    size_t need = 0;
    for (const std::vector<pf_weight *> &g : groups) {
        std::vector<pf_weight *> fresh;
        bool fusable = g.size() >= 2;
        for (pf_weight *w : g) {
            if (!seen.insert(w).second) {
                fusable = false;
                continue;
            }
            set.push_back(w);
            rep.bytes_total += f16_bytes(w);
            if (w->f16) {
                rep.weights_cached++;
                fusable = false;
                continue;
            }
            fusable = fusable && w->k == g.front()->k;
            fresh.push_back(w);
            need += f16_bytes(w);
        }
        if (fusable) {
            units.push_back(F16Unit{fresh, 0});
            for (pf_weight *w : fresh) units.back().bytes += f16_bytes(w);
        } else {
            for (pf_weight *w : fresh) units.push_back(F16Unit{{w}, f16_bytes(w)});
        }
    }
    rep.weights_total = int32_t(set.size());
    // The cache rule (a model's prewarm): units the f16 leg reads from their blocks no slower than
    // the rule's margin stay at their file's size; the LM head (plan.last) is outside it.
    int32_t rule_units = 0, rule_blocks_units = 0, unmeasured = 0;
    if (plan.rule && plan.rule_rows > 0) {
        rep.rule_rows = int32_t(plan.rule_rows);
        std::vector<F16Unit> kept;
        for (F16Unit &u : units) {
            const bool last = std::find(u.parts.begin(), u.parts.end(), plan.last) != u.parts.end();
            if (last || u.bytes < kPrewarmRuleMinBytes || !rule_unit(u.parts)) {
                kept.push_back(std::move(u));
                continue;
            }
            RuleTime rt;
            PF_TRY(rule_time(ctx, u.parts, plan, &rt));
            ++rule_units;
            if (!rt.measured) {
                ++unmeasured;
                kept.push_back(std::move(u));
                continue;
            }
            const double ratio = rt.blocks_ms / rt.cache_ms;
            rep.rule_ratio_min = rep.rule_ratio_min == 0 ? ratio : std::min(rep.rule_ratio_min, ratio);
            rep.rule_ratio_max = std::max(rep.rule_ratio_max, ratio);
            if (ratio > 1.0 + plan.rule_margin) {
                kept.push_back(std::move(u));
                continue;
            }
            ++rule_blocks_units;
            rep.weights_blocks += int32_t(u.parts.size());
            need -= u.bytes;
        }
        units.swap(kept);
    }
    rep.bytes_needed = need;
    explain = [&] {
        const int32_t cached = rep.weights_cached;
        int n = std::snprintf(rep.why, sizeof rep.why, "%d of %d weights cached", int(cached), int(rep.weights_total));
        if (rep.rule_rows > 0 && n > 0 && size_t(n) < sizeof rep.why)
            n += std::snprintf(rep.why + n, sizeof rep.why - size_t(n),
                               "; the rule at %d rows timed %d units the f16 leg can read from their blocks "
                               "(blocks / cache %.3f-%.3fx, margin %.0f%%): %d left at their file's size "
                               "(%d weights)%s",
                               int(rep.rule_rows), int(rule_units), rep.rule_ratio_min, rep.rule_ratio_max,
                               100.0 * plan.rule_margin, int(rule_blocks_units), int(rep.weights_blocks),
                               unmeasured ? ", some not timed (scratch did not fit): cached" : "");
        else if (n > 0 && size_t(n) < sizeof rep.why)
            n += std::snprintf(rep.why + n, sizeof rep.why - size_t(n), "; no cache rule (every matrix that fits)");
        if (rep.partial && n > 0 && size_t(n) < sizeof rep.why)
            std::snprintf(rep.why + n, sizeof rep.why - size_t(n), "; the rest did not fit");
    };

    size_t free_b = 0, total_b = 0;
    PF_TRY(device_free_bytes(ctx, &free_b, &total_b));
    rep.free_bytes = free_b;
    if (need > free_b || headroom_bytes > free_b - need) {
        std::snprintf(rep.reason, sizeof rep.reason,
                      "does not fit: %zu bytes to cache + %zu headroom > %zu free", need,
                      headroom_bytes, free_b);
        if (!plan.partial || free_b <= headroom_bytes) return finish(PF_STATUS_OK);
        // Partial: whole units (a fused group stays whole), largest first, while they fit; plan.last
        // after all others. Every uncached byte of a layer costs the same to stream, so the order
        // only sets how many launches stream (fewer, larger GEMMs from the cache).
        const size_t room = free_b - headroom_bytes;
        std::vector<size_t> order(units.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        auto is_last = [&](size_t i) {
            return std::find(units[i].parts.begin(), units[i].parts.end(), plan.last) != units[i].parts.end();
        };
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            if (is_last(a) != is_last(b)) return is_last(b);
            return units[a].bytes > units[b].bytes;
        });
        std::vector<bool> take(units.size(), false);
        size_t fit = 0;
        for (size_t i : order)
            if (fit + units[i].bytes <= room) {
                take[i] = true;
                fit += units[i].bytes;
            }
        std::vector<F16Unit> kept;
        for (size_t i = 0; i < units.size(); ++i)
            if (take[i]) kept.push_back(units[i]);
        units.swap(kept);
        need = fit;
        rep.partial = 1;
        if (units.empty()) return finish(PF_STATUS_OK);
    }

    size_t read = 0;  // GGUF bytes the dequantization reads
    for (const F16Unit &u : units)
        for (const pf_weight *w : u.parts) read += w->bytes;
    EventPair events;
    const pf_status s = cache_units(ctx, units, need, plan, events.ev[0], events.ev[1]);
    if (s == PF_STATUS_OUT_OF_MEMORY) {  // fragmentation or a concurrent allocation: not armed
        std::snprintf(rep.reason, sizeof rep.reason, "allocation failed for %zu weights: %s",
                      set.size() - size_t(rep.weights_cached), pf_last_error());
        return finish(PF_STATUS_OK);
    }
    if (s != PF_STATUS_OK) {
        std::snprintf(rep.reason, sizeof rep.reason, "failed: %s", pf_last_error());
        return finish(s);
    }
    int32_t weights_added = 0;
    for (const F16Unit &u : units) weights_added += int32_t(u.parts.size());
    const cudaError_t e = cudaStreamSynchronize(ctx->stream);  // a faulting dequant surfaces here
    if (e != cudaSuccess) {
        const pf_status fs = cuda_fail(e, __FILE__, __LINE__, "prewarm_f16: dequantize");
        std::snprintf(rep.reason, sizeof rep.reason, "failed: %s", pf_last_error());
        for (const F16Unit &u : units)
            for (pf_weight *w : u.parts) f16_release(w);  // the last one frees the arena
        return finish(fs);
    }
    // Nothing to cache (every weight already is): the events were never recorded, and asking for
    // their time is an API error that compute-sanitizer reports (device-check part 5, session 37).
    rep.device_ms = units.empty() ? 0.0 : events.elapsed_ms();
    rep.bytes_read = read;
    rep.bytes_added = need;
    rep.weights_added = weights_added;
    rep.weights_cached += weights_added;
    rep.armed = rep.weights_cached + rep.weights_blocks == rep.weights_total;
    if (rep.armed) {
        rep.reason[0] = '\0';
    } else {
        std::snprintf(rep.reason, sizeof rep.reason,
                      "partial: %d of %d weights cached (%zu bytes); the f16 leg reads the rest uncached "
                      "(GGUF blocks or fp16 slabs; %zu headroom, %zu free)", rep.weights_cached, rep.weights_total, need, headroom_bytes, free_b);
    }
    return finish(PF_STATUS_OK);
}

}  // namespace pf
