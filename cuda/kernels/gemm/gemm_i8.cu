// gemm_i8.cu — the 8-bit leg's kernels: group-of-128 int8 quantization of rows, and the int8 x
// int8 GEMM with one fp32 promotion per 128-wide K group on Hopper's tensor cores (sm_90a).
// Contract in gemm_i8.cuh; the GEMM kernel, its design and its launch in gemm_i8_kernel.cuh.
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "kernels/dequant/dequant.cuh"
#include "kernels/gemm/gemm.cuh"  // ProjEnv, weight_slab_rows
#include "kernels/gemm/gemm_i8.cuh"
#include "kernels/gemm/gemm_i8_kernel.cuh"
#include "plan/qtype.h"
#include "ptx/common.cuh"

namespace pf {
namespace {

// ------------------------------------------------------------------ quantization

constexpr int kQuantWarps = 8;  // warps per block; one warp per (row, group)

// One warp per (row, group of 128): lane l holds columns 4l .. 4l + 3 of the group.
// T = float: fp32 rows; T = __half: the f16 leg's input form (fp16 rows times their inverse row
// scale inv[r], a power of two: exact in fp32).
template <typename T>
__global__ void quantize_i8_kernel(const T *__restrict__ x, int64_t ldx, const float *__restrict__ inv,
                                   int64_t rows, int64_t k, int8_t *__restrict__ q, int64_t ldq,
                                   float *__restrict__ s, int64_t lds, int vec) {
    const int64_t groups = (k + kI8Group - 1) / kI8Group;
    const int64_t item = int64_t(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
    if (item >= rows * groups) return;
    const int lane = threadIdx.x & 31;
    const int64_t r = item / groups, g = item - r * groups;
    const int64_t c0 = g * kI8Group + 4 * lane;
    const T *xr = x + r * ldx;
    float v[4];
    if constexpr (sizeof(T) == 4) {
        if (vec && c0 + 3 < k) {
            const float4 t = *reinterpret_cast<const float4 *>(xr + c0);
            v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = c0 + e < k ? float(xr[c0 + e]) : 0.f;
        }
    } else {
        const float sc = inv ? inv[r] : 1.f;
        if (vec && c0 + 3 < k) {
            const uint2 t = *reinterpret_cast<const uint2 *>(xr + c0);
            const float2 lo = __half22float2(*reinterpret_cast<const __half2 *>(&t.x));
            const float2 hi = __half22float2(*reinterpret_cast<const __half2 *>(&t.y));
            v[0] = lo.x * sc, v[1] = lo.y * sc, v[2] = hi.x * sc, v[3] = hi.y * sc;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = c0 + e < k ? __half2float(xr[c0 + e]) * sc : 0.f;
        }
    }
    float m = 0.f;
    bool nan = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        m = fmaxf(m, fabsf(v[e]));  // fmaxf skips NaN
        nan |= isnan(v[e]);
    }
    m = warp_max(m);
    // A NaN in the group makes its scale NaN, an Inf makes it Inf (codes 0): the row's outputs
    // are then NaN, as the other legs' would be, instead of the group silently dropped.
    const float sc = __any_sync(0xffffffffu, nan) ? __int_as_float(0x7fc00000) : __fdiv_rn(m, 127.0f);
    int32_t packed = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        int c = 0;
        if (sc > 0.f) {
            c = __float2int_rn(__fdiv_rn(v[e], sc));  // NaN -> 0; |c| <= 127 by construction
            c = max(-127, min(127, c));
        }
        packed |= (c & 0xFF) << (8 * e);
    }
    int8_t *qr = q + r * ldq;
    if (c0 + 3 < k && ((reinterpret_cast<uintptr_t>(qr + c0) & 3) == 0)) {
        *reinterpret_cast<int32_t *>(qr + c0) = packed;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (c0 + e < k) qr[c0 + e] = int8_t((packed >> (8 * e)) & 0xFF);
    }
    if (lane == 0) s[g * lds + r] = sc;
}

// r[c] = max over groups of tmp[g][c] (one thread per row).
__global__ void i8_row_factor_kernel(const float *__restrict__ tmp, int64_t ldt, int64_t n,
                                     int64_t groups, float *__restrict__ r) {
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float m = 0.f;
    for (int64_t g = 0; g < groups; ++g) m = fmaxf(m, tmp[g * ldt + c]);
    r[c] = m;
}

// b[g][blk] = max over the block's rows c of fp32(tmp[g][c] / r[c]) (0 where r = 0); one warp
// per (group, block), lane l taking rows 4l .. 4l + 3 of the block.
__global__ void i8_block_factor_kernel(const float *__restrict__ tmp, int64_t ldt, int64_t n,
                                       int64_t groups, const float *__restrict__ r,
                                       float *__restrict__ b, int64_t ldb) {
    const int64_t blocks = (n + kI8Group - 1) / kI8Group;
    const int64_t item = int64_t(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
    if (item >= groups * blocks) return;
    const int64_t g = item / blocks, blk = item - g * blocks;
    float m = 0.f;
    for (int e = 0; e < 4; ++e) {
        const int64_t c = blk * kI8Group + 4 * (threadIdx.x & 31) + e;
        if (c < n && r[c] > 0.f) m = fmaxf(m, __fdiv_rn(tmp[g * ldt + c], r[c]));
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) b[g * ldb + blk] = m;
}

// The codes of a rank-1 weight's rows: s = r[c] * b[g][c / 128] (fp32), q = rint(w / s), 0 where
// s = 0. One warp per (row, group) as quantize_i8_kernel.
__global__ void quantize_i8_r1_kernel(const float *__restrict__ x, int64_t ldx,
                                      int64_t rows, int64_t k, const float *__restrict__ r,
                                      const float *__restrict__ b, int64_t ldb,
                                      int8_t *__restrict__ q, int64_t ldq) {
    const int64_t groups = (k + kI8Group - 1) / kI8Group;
    const int64_t item = int64_t(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
    if (item >= rows * groups) return;
    const int lane = threadIdx.x & 31;
    const int64_t c = item / groups, g = item - c * groups;
    const float sc = r[c] * b[g * ldb + c / kI8Group];
    const int64_t c0 = g * kI8Group + 4 * lane;
    const float *xr = x + c * ldx;
    int8_t *qr = q + c * ldq;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if (c0 + e >= k) break;
        int v = 0;
        if (sc > 0.f) v = max(-127, min(127, __float2int_rn(__fdiv_rn(xr[c0 + e], sc))));
        qr[c0 + e] = int8_t(v);
    }
}

template <typename T>
pf_status launch_quantize(const T *x, int64_t ldx, const float *inv, int64_t rows, int64_t k,
                          I8Mat out, cudaStream_t st, const char *name) {
    if (rows == 0) return PF_STATUS_OK;
    const int64_t items = rows * i8_groups(k);
    const int64_t blocks = ceil_div(items, kQuantWarps);
    if (blocks > kMaxGridX)
        return fail(PF_STATUS_UNSUPPORTED, "%s: %lld rows x %lld columns exceed one grid", name,
                    (long long)rows, (long long)k);
    const int vec = (reinterpret_cast<uintptr_t>(x) % (4 * sizeof(T))) == 0 && ldx % 4 == 0;
    quantize_i8_kernel<T><<<unsigned(blocks), 32 * kQuantWarps, 0, st>>>(x, ldx, inv, rows, k, out.q,
                                                                          out.ldq, out.s, out.lds, vec);
    PF_LAUNCH_CHECK("%s", name);
    return PF_STATUS_OK;
}

// ------------------------------------------------------------------ host

// The production instance: 128-wide tiles, two fragments per consumer, the I2FP conversion, the
// rank-1 weight form, clusters of two blocks sharing their A tile (1 x 2), a persistent grid
// (bench_gemm_i8 measures the others: NOTES.md, the 8-bit leg).
constexpr int kBN = 128, kCM = 1, kCN = 2;

// The persistent grid's clusters on the current device (cudaOccupancyMaxActiveClusters, once
// per device; 0 when the query fails: one cluster per tile then).
int i8_grid_clusters() {
    constexpr auto query = i8k::max_active_clusters<kBN, i8k::kI8Cvt, true, true, kCM, kCN>;
    return std::max(0, per_device_value(reinterpret_cast<const void *>(query), query));
}

pf_status launch_gemm_i8(I8Mat a, I8Mat w, int64_t rows, int64_t n, int64_t k, float *y,
                         int64_t ldy, bool accumulate, cudaStream_t st) {
    i8k::Maps maps;
    const CUresult r = i8k::make_maps(&maps, a, w, rows, n, k, kBN, kCM, kCN);
    if (r != CUDA_SUCCESS)
        return fail(PF_STATUS_CUDA_ERROR,
                    "gemm_i8: cuTensorMapEncodeTiled(rows=%lld, n=%lld, k=%lld) failed: %d",
                    (long long)rows, (long long)n, (long long)k, int(r));
    const i8k::I8GemmArgs f = i8k::make_args(rows, n, k, y, ldy, accumulate, kBN, w.r);
    const auto kernel = i8k::gemm_i8_kernel<kBN, i8k::kI8Cvt, true, true, kCM, kCN>;
    PF_TRY(set_max_dynamic_smem(kernel, int(i8k::i8_smem_bytes<kBN, true>()), "gemm_i8_kernel"));
    int clusters = i8_grid_clusters();
    // Without a persistent grid: one cluster per cluster tile, within one grid.
    if (clusters == 0 && int64_t(f.m_tiles) * ((f.n_tiles + kCN - 1) / kCN) * kCN > kMaxGridX)
        return fail(PF_STATUS_UNSUPPORTED, "gemm_i8: %d x %d tiles exceed one grid", f.m_tiles, f.n_tiles);
    const cudaError_t e = i8k::launch<kBN, i8k::kI8Cvt, true, true, kCM, kCN>(maps, f, st, clusters);
    if (e != cudaSuccess) return launch_fail(e, __FILE__, __LINE__, "gemm_i8_kernel");
    return PF_STATUS_OK;
}

}  // namespace

pf_status quantize_i8_rows(const float *x, int64_t ldx, int64_t rows, int64_t k, I8Mat out,
                           cudaStream_t st) {
    return launch_quantize<float>(x, ldx, nullptr, rows, k, out, st, "quantize_i8_kernel<float>");
}

pf_status quantize_i8_rows_f16(const __half *x16, int64_t ldx, const float *inv, int64_t rows,
                               int64_t k, I8Mat out, cudaStream_t st) {
    return launch_quantize<__half>(x16, ldx, inv, rows, k, out, st, "quantize_i8_kernel<half>");
}

pf_status quantize_i8_weight_rows(const float *w32, int64_t ldw, int64_t rows, int64_t k, I8Mat out,
                                 float *tmp, cudaStream_t st) {
    if (rows == 0) return PF_STATUS_OK;
    const int64_t groups = i8_groups(k), ldt = i8_scale_ld(rows);
    I8Mat t = out;  // the per-(row, group) scales into tmp; these codes are overwritten below
    t.s = tmp;
    t.lds = ldt;
    PF_TRY(quantize_i8_rows(w32, ldw, rows, k, t, st));
    i8_row_factor_kernel<<<unsigned(ceil_div(rows, 256)), 256, 0, st>>>(tmp, ldt, rows, groups, out.r);
    PF_LAUNCH_CHECK("i8_row_factor_kernel");
    const int64_t blocks = groups * i8_blocks(rows);
    i8_block_factor_kernel<<<unsigned(ceil_div(blocks, kQuantWarps)), 32 * kQuantWarps, 0, st>>>(
        tmp, ldt, rows, groups, out.r, out.s, out.lds);
    PF_LAUNCH_CHECK("i8_block_factor_kernel");
    const int64_t items = rows * groups;
    quantize_i8_r1_kernel<<<unsigned(ceil_div(items, kQuantWarps)), 32 * kQuantWarps, 0, st>>>(
        w32, ldw, rows, k, out.r, out.s, out.lds, out.q, out.ldq);
    PF_LAUNCH_CHECK("quantize_i8_r1_kernel");
    return PF_STATUS_OK;
}

bool gemm_i8_available() { return sm90a_kernels_available(current_device()); }

pf_status gemm_i8(I8Mat a, I8Mat w, int64_t rows, int64_t n, int64_t k, float *y, int64_t ldy,
                  bool accumulate, cudaStream_t st) {
    if (rows == 0 || n == 0) return PF_STATUS_OK;
    if (!gemm_i8_available())
        return fail(PF_STATUS_UNSUPPORTED,
                    "gemm_i8: the 8-bit leg needs an sm_90a build on a compute capability 9.0 "
                    "device (Hopper) with the driver's TMA encoder");
    if (rows > INT_MAX || n > INT_MAX || k > INT_MAX || k % 16 != 0 || w.r == nullptr)
        return fail(PF_STATUS_UNSUPPORTED, "gemm_i8: rows=%lld n=%lld k=%lld (k must be a multiple "
                    "of 16, each below 2^31; the weight in the rank-1 form)", (long long)rows,
                    (long long)n, (long long)k);
    return launch_gemm_i8(a, w, rows, n, k, y, ldy, accumulate, st);
}

}  // namespace pf

// ------------------------------------------------------------------ the leg

namespace pf {

namespace {

// The quantized activations of `rows` x k at p: codes, then (256-aligned) the scales.
I8Mat act_layout(void *p, int64_t rows, int64_t k) {
    I8Mat m;
    m.q = static_cast<int8_t *>(p);
    m.ldq = i8_code_ld(k);
    m.s = reinterpret_cast<float *>(static_cast<char *>(p) + i8_align(i8_codes_bytes(rows, k)));
    m.lds = i8_scale_ld(rows);
    return m;
}
size_t act_bytes(int64_t rows, int64_t k) { return i8_align(i8_codes_bytes(rows, k)) + i8_scales_bytes(rows, k); }

// A rank-1 weight of n rows at p (i8_weight_bytes): codes, row factors, block factors.
I8Mat weight_layout(void *p, int64_t n, int64_t k) {
    char *c = static_cast<char *>(p);
    I8Mat m;
    m.q = reinterpret_cast<int8_t *>(c);
    m.ldq = i8_code_ld(k);
    c += i8_align(i8_codes_bytes(n, k));
    m.r = reinterpret_cast<float *>(c);
    c += i8_align(size_t(n) * sizeof(float));
    m.s = reinterpret_cast<float *>(c);
    m.lds = i8_scale_ld(i8_blocks(n));
    return m;
}

// W's rows [n0, n0 + nc) as fp32: dequantized into w32, or the F32 blocks in place.
pf_status weight_rows_f32(pf_weight *w, int64_t n0, int64_t nc, float *w32, const float **out,
                          cudaStream_t st) {
    if (w->qtype == PF_QTYPE_F32) {
        *out = static_cast<const float *>(w->data) + n0 * w->k;
        return PF_STATUS_OK;
    }
    int64_t be = 1, bb = 4;
    qtype_block(w->qtype, &be, &bb);
    PF_TRY(dequantize(static_cast<const uint8_t *>(w->data) + n0 * (w->k / be * bb), w->qtype, nc,
                      w->k, w32, false, st));
    *out = w32;
    return PF_STATUS_OK;
}

// Dequantized slabs of whole 128-row blocks (a slab boundary never splits a block of factors).
int64_t i8_slab_rows(int64_t n, int64_t k) {
    const int64_t s = weight_slab_rows(n, k, sizeof(float));
    return s >= n ? n : std::max<int64_t>(kI8Group, s / kI8Group * kI8Group);
}

// Scratch floats of the per-(row, group) scales of one slab (quantize_i8_weight_rows's tmp).
size_t slab_tmp_floats(int64_t slab, int64_t k) { return size_t(i8_groups(k)) * size_t(i8_scale_ld(slab)); }

// The rank-1 form of the whole of w into dst (dst.r and dst.s sized for w->n rows), slab by slab
// through w32 (slab rows x k floats; unused for F32 weights) and tmp (slab_tmp_floats): a slab is
// whole 128-row blocks, so its factors are the whole matrix's (r per row, b per block) and each
// slab is dequantized once.
pf_status quantize_weight(pf_weight *w, float *w32, float *tmp, I8Mat dst, cudaStream_t st) {
    const int64_t n = w->n, k = w->k, slab = i8_slab_rows(n, k);
    for (int64_t n0 = 0; n0 < n; n0 += slab) {
        const int64_t nc = std::min(slab, n - n0);
        I8Mat part = dst;
        part.q += n0 * dst.ldq;
        part.r += n0;
        part.s += n0 / kI8Group;
        const float *src = nullptr;
        PF_TRY(weight_rows_f32(w, n0, nc, w32, &src, st));
        PF_TRY(quantize_i8_weight_rows(src, k, nc, k, part, tmp, st));
    }
    return PF_STATUS_OK;
}

I8Mat weight_mat(const pf_weight *w) {
    I8Mat m;
    m.q = w->i8;
    m.ldq = i8_code_ld(w->k);
    m.r = w->i8_r;
    m.s = w->i8_b;
    m.lds = w->i8_ldb;
    return m;
}

void i8_release(pf_weight *w) {
    F16Arena *a = w->i8_arena;
    w->i8 = nullptr;
    w->i8_r = w->i8_b = nullptr;
    w->i8_ldb = 0;
    w->i8_arena = nullptr;
    w->i8_block = nullptr;
    arena_release(w->ctx, a);
}
}  // namespace

size_t i8_streaming_bytes(int64_t n, int64_t k) {
    const int64_t slab = i8_slab_rows(n, k);
    return i8_weight_bytes(slab, k) + i8_align(slab_tmp_floats(slab, k) * sizeof(float));
}

size_t i8_activation_bytes(int64_t rows, int64_t k) { return act_bytes(rows, k); }

int64_t i8_weight_slab_rows(int64_t n, int64_t k) { return i8_slab_rows(n, k); }

pf_status project_i8(const ProjEnv &env, pf_weight *w, const float *x, int64_t rows, int64_t ldx,
                     float *y, int64_t ldy, bool accumulate) {
    pf_context *ctx = env.ctx;
    const int64_t n = w->n, k = w->k;
    PF_TRY(scratch_reserve(ctx, *env.x16, act_bytes(rows, k), "project (8-bit leg): activation scratch"));
    const int64_t slab = i8_slab_rows(n, k);
    if (!w->i8) {  // reserved before any kernel runs: an OOM here leaves Y untouched
        if (w->qtype != PF_QTYPE_F32)
            PF_TRY(scratch_reserve(ctx, *env.w32, size_t(slab) * size_t(k) * sizeof(float),
                                   "project (8-bit leg): weight scratch"));
        PF_TRY(scratch_reserve(ctx, *env.w16, i8_streaming_bytes(n, k),
                               "project (8-bit leg): int8 weight scratch"));
    }
    const I8Mat xa = act_layout(env.x16->ptr, rows, k);
    PF_TRY(quantize_i8_rows(x, ldx, rows, k, xa, ctx->stream));
    if (w->i8) return gemm_i8(xa, weight_mat(w), rows, n, k, y, ldy, accumulate, ctx->stream);
    // Streaming: slab by slab of whole 128-row blocks (the factors of a slab are those of the
    // whole matrix: r per row, b per block), each quantized after the previous slab's GEMM.
    float *w32 = static_cast<float *>(env.w32->ptr);
    for (int64_t n0 = 0; n0 < n; n0 += slab) {
        const int64_t nc = std::min(slab, n - n0);
        const I8Mat wm = weight_layout(env.w16->ptr, nc, k);
        float *tmp = reinterpret_cast<float *>(static_cast<char *>(env.w16->ptr) + i8_weight_bytes(nc, k));
        const float *src = nullptr;
        PF_TRY(weight_rows_f32(w, n0, nc, w32, &src, ctx->stream));
        PF_TRY(quantize_i8_weight_rows(src, k, nc, k, wm, tmp, ctx->stream));
        PF_TRY(gemm_i8(xa, wm, rows, nc, k, y + n0, ldy, accumulate, ctx->stream));
    }
    return PF_STATUS_OK;
}

pf_status project_i8_rows(const ProjEnv &env, pf_weight *w, const __half *x16, const float *inv,
                          int64_t rows, MatF y) {
    pf_context *ctx = env.ctx;
    PF_CHECK_ARG(w->i8 != nullptr, "project_i8_rows: the weight (n=%lld k=%lld) has no int8 copy",
                 (long long)w->n, (long long)w->k);
    if (rows == 0) return PF_STATUS_OK;
    PF_TRY(scratch_reserve(ctx, *env.x16, act_bytes(rows, w->k), "project (8-bit leg): activation scratch"));
    const I8Mat xa = act_layout(env.x16->ptr, rows, w->k);
    PF_TRY(quantize_i8_rows_f16(x16, w->k, inv, rows, w->k, xa, ctx->stream));
    return gemm_i8(xa, weight_mat(w), rows, w->n, w->k, y.ptr, y.ld, false, ctx->stream);
}

pf_status weight_cache_i8_groups(pf_context *ctx, const std::vector<std::vector<pf_weight *>> &groups) {
    for (const auto &grp : groups) {
        std::vector<pf_weight *> parts;
        for (pf_weight *w : grp)
            if (!w->i8) parts.push_back(w);
        if (parts.empty()) continue;
        // One arena per group; its members' rows back to back. A member whose rows are not whole
        // 128-row blocks would share a block of factors with the next: the group is then cached
        // member by member (fused_i8_view needs one arena).
        bool fuse = parts.size() == grp.size();
        for (size_t i = 0; i < parts.size(); ++i)
            fuse = fuse && parts[i]->k == parts[0]->k && (i + 1 == parts.size() || parts[i]->n % kI8Group == 0);
        if (!fuse && parts.size() > 1) {
            for (pf_weight *w : parts) PF_TRY(weight_cache_i8_groups(ctx, {{w}}));
            continue;
        }
        int64_t n = 0;
        for (pf_weight *w : parts) n += w->n;
        const int64_t k = parts[0]->k;
        F16Arena *arena = nullptr;
        PF_TRY(f16_arena_create(ctx, i8_weight_bytes(n, k), &arena, "the 8-bit leg's weight copy"));
        const I8Mat all = weight_layout(arena->ptr, n, k);
        int64_t slab_max = 0;
        bool dequant = false;
        for (pf_weight *w : parts) {
            slab_max = std::max(slab_max, i8_slab_rows(w->n, k));
            dequant = dequant || w->qtype != PF_QTYPE_F32;
        }
        pf_status s = scratch_reserve(ctx, ctx->scratch_f32,
                                      dequant ? size_t(slab_max) * size_t(k) * sizeof(float) : 0,
                                      "pf_weight_cache_i8: weight scratch");
        if (s == PF_STATUS_OK)
            s = scratch_reserve(ctx, ctx->scratch_f16_x, slab_tmp_floats(slab_max, k) * sizeof(float),
                                "pf_weight_cache_i8: scale scratch");
        int64_t row0 = 0;
        for (pf_weight *w : parts) {
            if (s != PF_STATUS_OK) break;
            I8Mat dst = all;
            dst.q += row0 * all.ldq;
            dst.r += row0;
            dst.s += row0 / kI8Group;  // whole blocks: row0 % 128 == 0 for every member but a lone one
            s = quantize_weight(w, static_cast<float *>(ctx->scratch_f32.ptr),
                                static_cast<float *>(ctx->scratch_f16_x.ptr), dst, ctx->stream);
            row0 += w->n;
        }
        if (s == PF_STATUS_OK) {
            const cudaError_t e = cudaStreamSynchronize(ctx->stream);
            if (e != cudaSuccess) s = cuda_fail(e, __FILE__, __LINE__, "cudaStreamSynchronize");
        }
        if (s != PF_STATUS_OK) {
            (void)cudaStreamSynchronize(ctx->stream);
            device_free(ctx, arena->ptr, arena->bytes);
            delete arena;
            return s;
        }
        row0 = 0;
        for (pf_weight *w : parts) {
            w->i8 = all.q + row0 * all.ldq;
            w->i8_r = all.r + row0;
            w->i8_b = all.s + row0 / kI8Group;
            w->i8_ldb = all.lds;
            w->i8_arena = arena;
            w->i8_block = parts[0];
            ++arena->refs;
            row0 += w->n;
        }
    }
    return PF_STATUS_OK;
}

pf_status weight_cache_i8(pf_weight *w) { return weight_cache_i8_groups(w->ctx, {{w}}); }

void weight_drop_i8(pf_weight *w) { i8_release(w); }

bool fused_i8_view(pf_weight *const *parts, int32_t count, pf_weight *view) {
    if (count < 2 || !parts[0]->i8 || parts[0]->i8_block != parts[0]) return false;
    int64_t n = 0;
    for (int32_t i = 0; i < count; ++i) {
        const pf_weight *w = parts[i];
        if (!w->i8 || w->i8_arena != parts[0]->i8_arena || w->k != parts[0]->k ||
            w->i8 != parts[0]->i8 + n * i8_code_ld(w->k))
            return false;
        n += w->n;
    }
    // A view on the caller's stack (a fresh pf_weight): no reference of its own to the context,
    // no arena, nothing to free.
    bare_view(parts[0], n, view);
    view->i8 = parts[0]->i8;
    view->i8_r = parts[0]->i8_r;
    view->i8_b = parts[0]->i8_b;
    view->i8_ldb = parts[0]->i8_ldb;
    view->i8_block = parts[0];
    return true;
}

}  // namespace pf
