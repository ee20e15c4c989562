// qk_rope.cu — the attention layer's q/k preparation fused (qk_rope.cuh): per-head RMSNorm of
// q and k, NeoX RoPE of both at the device-held position, k and v into the KV cache, in one
// launch instead of five.
//
// Why it is bitwise the five separate kernels (rows.cu head_rms_norm_kernel, rope_neox_kernel;
// attention.cu kv_write_kernel):
//  - the RMS sum of a head is warp_sum_squares over the head's D values, by one warp, lane l
//    taking i = l, l + 32, ... (common.cuh): the very function head_rms_norm_kernel calls, the
//    same order. inv and each normed value come from head_norm_inv / head_norm_value.
//  - the angle of pair i at position p is rope_cos_sin(base, rot_dim, i, p) with the same
//    double arguments as rope_launch passes (double(rope_base), double(rot_dim)), and the
//    pair is rotated by rope_lo / rope_hi on the normed values — the separate path stores
//    those values as fp32 and reads them back, here they are held in shared memory as fp32:
//    the same bits either way. Dims rot_dim..D-1 keep the normed value.
//  - the cache gets from_float<T> of the final k value and of raw v, as kv_write_kernel does.
//  - qk_math.cuh writes every product that meets a sum with rounding intrinsics, so neither
//    compiler can contract the same expression differently in the two kernels.
#include <cmath>

#include "kernels/attention/qk_math.cuh"
#include "kernels/attention/qk_rope.cuh"
#include "kernels/rows/f16_rows.cuh"
#include "ptx/common.cuh"

namespace pf {
namespace {

constexpr int kQkWarps = 8;  // one block per row; its warps take the row's q and k heads in turn
constexpr int kQkThreads = kQkWarps * kWarpSize;
constexpr int kQkMaxHeadDim = 1024;  // shared memory: (kQkWarps * D + rot_dim) floats <= 36 KiB

struct QkArgs {
    float *q;
    int64_t ldq, qhs;
    float *k;
    int64_t ldk;
    const float *v;
    int64_t ldv;
    int32_t n_heads, n_kv_heads, head_dim, half;
    double base, rot;  // as rope_launch passes them
    const float *q_norm, *k_norm;
    float eps;
    const int64_t *pos0_dev;
    void *k_cache, *v_cache;
    int64_t kv_dim;
    KvPages pages;
};

// One block per row t. Shared memory: the row's cos / sin per pair (computed once per row, as
// rope_neox_kernel computes them once per (row, pair)), then a D-float stage per warp.
template <typename T>
__global__ void __launch_bounds__(kQkThreads) qk_norm_rope_kv_kernel(const __grid_constant__ QkArgs a) {
    extern __shared__ float sm[];
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int D = a.head_dim, half = a.half;
    float *cs = sm, *sn = sm + half, *stage = sm + 2 * half + warp * D;
    const int64_t t = blockIdx.x;
    const int64_t pos = *a.pos0_dev + t;
    for (int i = threadIdx.x; i < half; i += kQkThreads) rope_cos_sin(a.base, a.rot, i, pos, cs[i], sn[i]);
    __syncthreads();
    T *kc = static_cast<T *>(a.k_cache) + a.pages.row(pos) * a.kv_dim;
    T *vc = static_cast<T *>(a.v_cache) + a.pages.row(pos) * a.kv_dim;
    // Heads 0..H-1 are q's, H..H+Hkv-1 k's; warp-uniform branches only.
    for (int hh = warp; hh < a.n_heads + a.n_kv_heads; hh += kQkWarps) {
        const bool is_q = hh < a.n_heads;
        const int h = is_q ? hh : hh - a.n_heads;
        float *x = is_q ? a.q + t * a.ldq + h * a.qhs : a.k + t * a.ldk + (int64_t)h * D;
        const float *w = is_q ? a.q_norm : a.k_norm;
        // head_rms_norm_kernel's values (every read of x is done before the first write)
        const float inv = head_norm_inv(warp_sum_squares(x, D), D, a.eps);
        for (int i = lane; i < D; i += kWarpSize) stage[i] = head_norm_value(x[i], inv, w[i]);
        __syncwarp();
        // rope_neox_kernel's values on them, then kv_write_kernel's conversion of k
        for (int i = lane; i < D; i += kWarpSize) {
            float y;
            if (i < half) y = rope_lo(stage[i], stage[i + half], cs[i], sn[i]);
            else if (i < 2 * half) y = rope_hi(stage[i - half], stage[i], cs[i - half], sn[i - half]);
            else y = stage[i];
            x[i] = y;
            if (!is_q) kc[(int64_t)h * D + i] = from_float<T>(y);
        }
        __syncwarp();  // the stage is the warp's next head's
    }
    const float *v = a.v + t * a.ldv;
    for (int64_t c = threadIdx.x; c < a.kv_dim; c += kQkThreads) vc[c] = from_float<T>(v[c]);
}

// The register form, for D = 32 PER and half = rot_dim / 2 = 32 HP (qwen3: D 128, full RoPE,
// PER 4, HP 2; qwen35: D 256, rot_dim 64, PER 8, HP 1): lane l holds elements i = l + 32 j of a
// head, so both members of a RoPE pair (i, i + half) are in one lane (j, j + HP) and the head
// never goes through shared memory. Each warp's first head and the row's v are loaded before the
// cos / sin, and every next head while the current one is worked on (the staged kernel waits on
// one load per step). The same functions in the same order as the staged kernel (the sum of
// squares is warp_sum_squares' loop, lane-strided, then warp_sum): the same bits.
template <typename T, int PER, int HP>
__global__ void __launch_bounds__(kQkThreads) qk_norm_rope_kv_reg_kernel(const __grid_constant__ QkArgs a) {
    extern __shared__ float sm[];
    constexpr int D = kWarpSize * PER, half = kWarpSize * HP, kV = 4;
    static_assert(2 * HP <= PER, "rot_dim <= head_dim");
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    float *cs = sm, *sn = sm + half;
    const int64_t t = blockIdx.x;
    const int n_all = a.n_heads + a.n_kv_heads;
    // Heads 0..H-1 are q's, H..H+Hkv-1 k's; warp-uniform branches only.
    const auto head = [&](int hh) {
        return hh < a.n_heads ? a.q + t * a.ldq + hh * a.qhs : a.k + t * a.ldk + int64_t(hh - a.n_heads) * D;
    };
    float cur[PER], vv[kV];
    if (warp < n_all) {
        const float *x = head(warp);
#pragma unroll
        for (int j = 0; j < PER; ++j) cur[j] = x[lane + kWarpSize * j];
    }
    const float *v = a.v + t * a.ldv;
#pragma unroll
    for (int e = 0; e < kV; ++e) {
        const int64_t c = threadIdx.x + int64_t(e) * kQkThreads;
        vv[e] = c < a.kv_dim ? v[c] : 0.0f;
    }
    const int64_t pos = *a.pos0_dev + t;
    for (int i = threadIdx.x; i < half; i += kQkThreads) rope_cos_sin(a.base, a.rot, i, pos, cs[i], sn[i]);
    __syncthreads();
    T *kc = static_cast<T *>(a.k_cache) + a.pages.row(pos) * a.kv_dim;
    T *vc = static_cast<T *>(a.v_cache) + a.pages.row(pos) * a.kv_dim;
    for (int hh = warp; hh < n_all; hh += kQkWarps) {
        float nxt[PER];
        if (hh + kQkWarps < n_all) {
            const float *xn = head(hh + kQkWarps);
#pragma unroll
            for (int j = 0; j < PER; ++j) nxt[j] = xn[lane + kWarpSize * j];
        }
        const bool is_q = hh < a.n_heads;
        const int h = is_q ? hh : hh - a.n_heads;
        float *x = head(hh);
        const float *w = is_q ? a.q_norm : a.k_norm;
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < PER; ++j) ss = fmaf(cur[j], cur[j], ss);
        const float inv = head_norm_inv(warp_sum(ss), D, a.eps);
        float nv[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) nv[j] = head_norm_value(cur[j], inv, w[lane + kWarpSize * j]);
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int i = lane + kWarpSize * j;
            float y;
            if (j < HP) y = rope_lo(nv[j], nv[(j + HP) % PER], cs[i], sn[i]);
            else if (j < 2 * HP) y = rope_hi(nv[(j + PER - HP) % PER], nv[j], cs[i - half], sn[i - half]);
            else y = nv[j];
            x[i] = y;
            if (!is_q) kc[int64_t(h) * D + i] = from_float<T>(y);
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) cur[j] = nxt[j];
    }
#pragma unroll
    for (int e = 0; e < kV; ++e) {
        const int64_t c = threadIdx.x + int64_t(e) * kQkThreads;
        if (c < a.kv_dim) vc[c] = from_float<T>(vv[e]);
    }
    for (int64_t c = threadIdx.x + int64_t(kV) * kQkThreads; c < a.kv_dim; c += kQkThreads)
        vc[c] = from_float<T>(v[c]);
}

template <typename T>
bool launch_qk_reg(const QkArgs &k, int64_t rows, cudaStream_t stream) {
    const size_t smem = size_t(k.half) * 2 * sizeof(float);
    if (k.head_dim == 128 && k.half == 64)
        qk_norm_rope_kv_reg_kernel<T, 4, 2><<<(unsigned)rows, kQkThreads, smem, stream>>>(k);
    else if (k.head_dim == 256 && k.half == 32)
        qk_norm_rope_kv_reg_kernel<T, 8, 1><<<(unsigned)rows, kQkThreads, smem, stream>>>(k);
    else
        return false;
    return true;
}

size_t qk_smem_bytes(int32_t head_dim, int32_t rot_dim) {
    return (size_t(kQkWarps) * size_t(head_dim) + size_t(rot_dim)) * sizeof(float);
}

}  // namespace

bool qk_norm_rope_kv_supported(int32_t head_dim, int32_t rot_dim) {
    return head_dim >= 1 && head_dim <= kQkMaxHeadDim && rot_dim >= 2 && rot_dim % 2 == 0 &&
           rot_dim <= head_dim;
}

pf_status qk_norm_rope_kv_at(const QkRopeKvArgs &a, cudaStream_t stream) {
    const char *fn = "qk_norm_rope_kv_at";
    const int64_t D = a.head_dim, kvd = int64_t(a.n_kv_heads) * D;
    PF_CHECK_ARG(a.rows >= 0 && a.rows <= kMaxGridX, "%s: rows=%lld out of range", fn, (long long)a.rows);
    PF_CHECK_ARG(a.n_heads >= 1 && a.n_kv_heads >= 1, "%s: n_heads=%d n_kv_heads=%d must be >= 1", fn,
                 a.n_heads, a.n_kv_heads);
    PF_CHECK_ARG(qk_norm_rope_kv_supported(a.head_dim, a.rot_dim),
                 "%s: head_dim=%d rot_dim=%d (rot_dim even, in [2, head_dim], head_dim <= %d)", fn,
                 a.head_dim, a.rot_dim, kQkMaxHeadDim);
    PF_CHECK_ARG(a.q_head_stride >= D && a.ldq >= (a.n_heads - 1) * a.q_head_stride + D,
                 "%s: q_head_stride=%lld ldq=%lld for %d heads of %lld", fn, (long long)a.q_head_stride,
                 (long long)a.ldq, a.n_heads, (long long)D);
    PF_CHECK_ARG(a.ldk >= kvd && a.ldv >= kvd, "%s: ldk=%lld ldv=%lld < n_kv_heads*head_dim=%lld", fn,
                 (long long)a.ldk, (long long)a.ldv, (long long)kvd);
    PF_CHECK_ARG(a.rope_base > 1.0f && std::isfinite(a.rope_base), "%s: rope_base=%g must be > 1", fn,
                 (double)a.rope_base);
    PF_CHECK_ARG(a.eps >= 0.0f && std::isfinite(a.eps), "%s: eps=%g must be finite, >= 0", fn, (double)a.eps);
    PF_CHECK_ARG(a.kv_dtype == PF_KV_F16 || a.kv_dtype == PF_KV_F32, "%s: kv_dtype=%d", fn, (int)a.kv_dtype);
    PF_TRY(check_pages(a.pages, fn));
    if (a.rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(a.q && a.k && a.v && a.q_norm && a.k_norm && a.pos0_dev && a.k_cache && a.v_cache,
                 "%s: null pointer", fn);
    const QkArgs k{a.q, a.ldq, a.q_head_stride, a.k, a.ldk, a.v, a.ldv, a.n_heads, a.n_kv_heads,
                   a.head_dim, a.rot_dim / 2, (double)a.rope_base, (double)a.rot_dim, a.q_norm, a.k_norm,
                   a.eps, a.pos0_dev, a.k_cache, a.v_cache, kvd, a.pages};
    // The register form for the two models' head shapes (a.regs false: the staged one).
    if (a.regs && (a.kv_dtype == PF_KV_F16 ? launch_qk_reg<__half>(k, a.rows, stream)
                                                        : launch_qk_reg<float>(k, a.rows, stream))) {
        PF_LAUNCH_CHECK("qk_norm_rope_kv_reg_kernel<%s>", a.kv_dtype == PF_KV_F16 ? "__half" : "float");
        return PF_STATUS_OK;
    }
    const size_t smem = qk_smem_bytes(a.head_dim, a.rot_dim);
    if (a.kv_dtype == PF_KV_F16)
        qk_norm_rope_kv_kernel<__half><<<(unsigned)a.rows, kQkThreads, smem, stream>>>(k);
    else
        qk_norm_rope_kv_kernel<float><<<(unsigned)a.rows, kQkThreads, smem, stream>>>(k);
    PF_LAUNCH_CHECK("qk_norm_rope_kv_kernel<%s>", a.kv_dtype == PF_KV_F16 ? "__half" : "float");
    return PF_STATUS_OK;
}

}  // namespace pf
