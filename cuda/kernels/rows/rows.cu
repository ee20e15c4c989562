// rows.cu — row kernels: RMSNorm, per-head RMSNorm, partial NEOX RoPE, SwiGLU, residual add,
// sigmoid output gate. Three layers per op: __global__ kernel (one args struct) -> launcher ->
// entry (declared in rows.cuh). All fp32; reductions in a fixed order (deterministic).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention/qk_math.cuh"
#include "kernels/rows/f16_rows.cuh"
#include "kernels/rows/rows.cuh"
#include "ptx/common.cuh"

namespace pf {
namespace {

constexpr int kElemBlock = 256;        // elementwise kernels: 8 warps, enough to hide latency
constexpr int kNormBlock = 256;        // full-row RMSNorm: one block per row

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
// silu(g) * u, the one expression of every SwiGLU form (g -> -inf: exp(-g) = inf and g / inf =
// -0, no NaN).
__device__ __forceinline__ float swiglu_value(float g, float u) { return (g / (1.0f + expf(-g))) * u; }

// ------------------------------------------------------------------------------ RMSNorm

struct RmsNormArgs {
    CMatF x;
    const float *w;
    MatF y;
    int64_t cols;
    float eps;
};

// One block per row. In place is safe: each thread rewrites only elements it read itself,
// after the block-wide sum (which synchronises) is complete.
__global__ void rms_norm_kernel(const __grid_constant__ RmsNormArgs a) {
    __shared__ float red[kWarpSize];
    const int64_t r = blockIdx.x;
    const float *x = a.x.ptr + r * a.x.ld;
    float *y = a.y.ptr + r * a.y.ld;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) s = fmaf(x[c], x[c], s);
    s = block_sum(s, red);
    const float inv = 1.0f / sqrtf(s / (float)a.cols + a.eps);
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) y[c] = (x[c] * inv) * a.w[c];
}

// ------------------------------------------------------------------------------ per-head RMSNorm

struct HeadNormArgs {
    MatF x;
    int64_t rows;
    int32_t n_heads;
    int64_t head_stride;
    int32_t head_dim;
    const float *w;
    float eps;
};

// One warp per (row, head); lanes stride over the head's elements.
__global__ void head_rms_norm_kernel(const __grid_constant__ HeadNormArgs a) {
    int64_t r, h;
    if (!warp_row_head(a.rows, a.n_heads, r, h)) return;
    float *x = a.x.ptr + r * a.x.ld + h * a.head_stride;
    const float inv = head_norm_inv(warp_sum_squares(x, a.head_dim), a.head_dim, a.eps);
    for (int i = threadIdx.x % kWarpSize; i < a.head_dim; i += kWarpSize)
        x[i] = head_norm_value(x[i], inv, a.w[i]);
}

// ------------------------------------------------------------------------------ RoPE

struct RopeArgs {
    MatF x;
    int64_t rows;
    int32_t n_heads;
    int64_t head_stride;
    int32_t half;     // rot_dim / 2
    int64_t pos0;
    const int64_t *pos0_dev;  // when set, the position of row 0 is read here (CUDA graphs)
    double base;      // theta_b, in double for the angle
    double rot;       // rot_dim
};

// One thread per (row, pair index i): the angle depends on (t, i) only, so it is computed once
// and applied to every head of the row.
__global__ void rope_neox_kernel(const __grid_constant__ RopeArgs a) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.rows * a.half) return;
    const int64_t t = idx / a.half;
    const int i = (int)(idx % a.half);
    // Angle in float64 (qk_math.cuh): fp32 would lose ~p*6e-8 rad to the product's rounding
    // alone (1.6e-2 rad at p = 2^18). Hopper's fp64 units make these two transcendentals per
    // thread cheap.
    const int64_t pos0 = a.pos0_dev ? *a.pos0_dev : a.pos0;
    float c, s;
    rope_cos_sin(a.base, a.rot, i, pos0 + t, c, s);
    float *row = a.x.ptr + t * a.x.ld + i;
    for (int h = 0; h < a.n_heads; ++h) {
        float *p = row + h * a.head_stride;
        const float u0 = p[0], u1 = p[a.half];
        p[0] = rope_lo(u0, u1, c, s);
        p[a.half] = rope_hi(u0, u1, c, s);
    }
}

// ------------------------------------------------------------------------------ elementwise

// Elementwise kernels: grid.x = rows (up to 2^31-1), grid.y = column tiles of kElemTile
// (<= 65535, the loop covers the rest). Each thread loads kElemPer elements (coalesced, kElemBlock
// apart) before using any: several loads in flight per thread keep HBM busy.
constexpr int kElemPer = 4;
constexpr int kElemTile = kElemBlock * kElemPer;

// One kernel for the three ops: a.row(r) gives row r's pointers w; a.in0(w, c) and a.in1(w, c)
// read the two inputs of column c (0 past the end), a.store(w, c, x0, x1) writes the result.
template <class Args>
__global__ void __launch_bounds__(kElemBlock) elementwise_kernel(const __grid_constant__ Args a) {
    const typename Args::Row w = a.row(blockIdx.x);
    for (int64_t base = (int64_t)blockIdx.y * kElemTile + threadIdx.x; base < a.cols;
         base += (int64_t)gridDim.y * kElemTile) {
        float v0[kElemPer], v1[kElemPer];
#pragma unroll
        for (int e = 0; e < kElemPer; ++e) {
            const int64_t c = base + e * kElemBlock;
            v0[e] = c < a.cols ? a.in0(w, c) : 0.0f;
            v1[e] = c < a.cols ? a.in1(w, c) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < kElemPer; ++e) {
            const int64_t c = base + e * kElemBlock;
            if (c < a.cols) a.store(w, c, v0[e], v1[e]);
        }
    }
}

struct SwigluArgs {
    CMatF g, u;
    MatF out;
    int64_t cols;

    struct Row {
        const float *g, *u;
        float *out;
    };
    __device__ Row row(int64_t r) const { return {g.ptr + r * g.ld, u.ptr + r * u.ld, out.ptr + r * out.ld}; }
    __device__ float in0(const Row &w, int64_t c) const { return w.g[c]; }
    __device__ float in1(const Row &w, int64_t c) const { return w.u[c]; }
    __device__ void store(const Row &w, int64_t c, float gv, float uv) const {
        w.out[c] = swiglu_value(gv, uv);
    }
};

struct AddArgs {
    MatF y;
    CMatF x;
    int64_t cols;

    struct Row {
        float *y;
        const float *x;
    };
    __device__ Row row(int64_t r) const { return {y.ptr + r * y.ld, x.ptr + r * x.ld}; }
    __device__ float in0(const Row &w, int64_t c) const { return w.y[c]; }
    __device__ float in1(const Row &w, int64_t c) const { return w.x[c]; }
    __device__ void store(const Row &w, int64_t c, float yv, float xv) const { w.y[c] = yv + xv; }
};

struct GateArgs {
    MatF o;
    CMatF gate;
    int64_t gate_head_stride;
    int32_t head_dim;
    int32_t cols;  // n_heads * head_dim (< 2^31: 32-bit division per element)

    struct Row {
        float *o;
        const float *gate;
    };
    __device__ Row row(int64_t r) const { return {o.ptr + r * o.ld, gate.ptr + r * gate.ld}; }
    __device__ float in0(const Row &w, int64_t c) const { return w.o[c]; }
    __device__ float in1(const Row &w, int64_t c) const {
        const int ci = (int)c;
        return w.gate[(int64_t)(ci / head_dim) * gate_head_stride + ci % head_dim];
    }
    __device__ void store(const Row &w, int64_t c, float ov, float gv) const {
        w.o[c] = ov * sigmoidf_(gv);
    }
};

// ------------------------------------------------------------------------------ fp16 producers

// The ops above with the f16 leg's input form as output (f16_rows.cuh): one block per row, each
// fp32 value computed by the same expression as the fp32 twin, then f16_write_row.

struct RmsNormF16Args {
    CMatF x;
    const float *w;
    int64_t cols;
    float eps;
    F16Out out;
    int staged;  // the row's values staged in dynamic shared memory (f16_rows.cuh)
};

// The sum of squares in the fp32 twin's order (same block size, same loop, block_sum): the
// same inv, so the same values.
__global__ void rms_norm_f16_kernel(const __grid_constant__ RmsNormF16Args a) {
    __shared__ float red[kWarpSize];
    extern __shared__ float stage[];  // [cols] when staged (f16_stage_bytes), else none
    const int64_t r = blockIdx.x;
    const float *x = a.x.ptr + r * a.x.ld;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) s = fmaf(x[c], x[c], s);
    s = block_sum(s, red);
    const float inv = 1.0f / sqrtf(s / (float)a.cols + a.eps);
    f16_write_row(a.out, r, a.cols, [&](int64_t c) { return (x[c] * inv) * a.w[c]; }, red,
                  a.staged ? stage : nullptr);
}

struct SwigluF16Args {
    CMatF g, u;
    int64_t cols;
    F16Out out;
    int staged;
};

__global__ void __launch_bounds__(kF16RowThreads) swiglu_f16_kernel(const __grid_constant__ SwigluF16Args a) {
    __shared__ float red[kWarpSize];
    extern __shared__ float stage[];
    const int64_t r = blockIdx.x;
    const float *g = a.g.ptr + r * a.g.ld, *u = a.u.ptr + r * a.u.ld;
    f16_write_row(a.out, r, a.cols, [&](int64_t c) { return swiglu_value(g[c], u[c]); }, red,
                  a.staged ? stage : nullptr);
}

// Register-resident twins (f16_rows.cuh, f16_write_regs): every load of the row is issued before
// the first use. RMSNorm keeps the fp32 twin's column ownership (c = t + i * blockDim.x, same
// block size) and so its summation order: the same inv, the same values, the same bits.
template <int NPER>
__global__ void rms_norm_f16_reg_kernel(const __grid_constant__ RmsNormF16Args a) {
    __shared__ float red[kWarpSize];
    const int64_t r = blockIdx.x;
    const float *x = a.x.ptr + r * a.x.ld;
    float xv[NPER], wv[NPER];
#pragma unroll
    for (int i = 0; i < NPER; ++i) {
        const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
        xv[i] = c < a.cols ? x[c] : 0.0f;
        wv[i] = c < a.cols ? a.w[c] : 0.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NPER; ++i)
        if (threadIdx.x + int64_t(i) * blockDim.x < a.cols) s = fmaf(xv[i], xv[i], s);
    s = block_sum(s, red);
    const float inv = 1.0f / sqrtf(s / (float)a.cols + a.eps);
#pragma unroll
    for (int i = 0; i < NPER; ++i) xv[i] = (xv[i] * inv) * wv[i];
    f16_write_regs(a.out, r, a.cols, xv, red);
}

// SwiGLU's value has no order: float4 ownership (cols % 4 == 0, 16-byte aligned g and u rows).
template <int NPER>
__global__ void __launch_bounds__(kF16RowThreads) swiglu_f16_reg_kernel(const __grid_constant__ SwigluF16Args a) {
    __shared__ float red[kWarpSize];
    const int64_t r = blockIdx.x, n4 = a.cols / 4;
    const float4 *g = reinterpret_cast<const float4 *>(a.g.ptr + r * a.g.ld);
    const float4 *u = reinterpret_cast<const float4 *>(a.u.ptr + r * a.u.ld);
    float4 gv[NPER], uv[NPER];
#pragma unroll
    for (int i = 0; i < NPER; ++i) {
        const int64_t c4 = threadIdx.x + int64_t(i) * blockDim.x;
        gv[i] = c4 < n4 ? g[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
        uv[i] = c4 < n4 ? u[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < NPER; ++i) {
        gv[i].x = swiglu_value(gv[i].x, uv[i].x);
        gv[i].y = swiglu_value(gv[i].y, uv[i].y);
        gv[i].z = swiglu_value(gv[i].z, uv[i].z);
        gv[i].w = swiglu_value(gv[i].w, uv[i].w);
    }
    f16_write_regs(a.out, r, n4, gv, red);
}

struct GateF16Args {
    CMatF o, gate;
    int64_t gate_head_stride;
    int32_t head_dim;
    int32_t cols;
    F16Out out;
    int staged;
};

__global__ void __launch_bounds__(kF16RowThreads) sigmoid_gate_f16_kernel(const __grid_constant__ GateF16Args a) {
    __shared__ float red[kWarpSize];
    extern __shared__ float stage[];
    const int64_t r = blockIdx.x;
    const float *o = a.o.ptr + r * a.o.ld, *gate = a.gate.ptr + r * a.gate.ld;
    f16_write_row(a.out, r, a.cols, [&](int64_t c) {
        const int ci = (int)c;
        return o[c] * sigmoidf_(gate[(int64_t)(ci / a.head_dim) * a.gate_head_stride + ci % a.head_dim]);
    }, red, a.staged ? stage : nullptr);
}

pf_status check_f16_out(const char *fn, const F16Out &out, int64_t cols) {
    PF_CHECK_ARG(out.x16 && out.inv, "%s: null fp16 output (x16=%p inv=%p)", fn, (void *)out.x16,
                 (void *)out.inv);
    PF_CHECK_ARG(out.ld16 >= cols, "%s: ld16=%lld < cols=%lld", fn, (long long)out.ld16, (long long)cols);
    PF_CHECK_ARG(!out.acc || (out.n_acc >= 1 && out.ld_acc >= out.n_acc),
                 "%s: accumulate target n_acc=%lld ld_acc=%lld", fn, (long long)out.n_acc,
                 (long long)out.ld_acc);
    return PF_STATUS_OK;
}

dim3 elementwise_grid(int64_t rows, int64_t cols) {
    int64_t yb = ceil_div(cols, kElemTile);
    if (yb > kMaxGridY) yb = kMaxGridY;
    return dim3((unsigned)rows, (unsigned)yb, 1);
}

// ---------------------------------------------------------------------------------- argmax

struct ArgmaxArgs {
    const float *x;
    int64_t n, ld;
    int32_t *out;
};

constexpr int kArgmaxThreads = 512;

// (v1, i1) ranks before (v2, i2): NaN above all numbers, then larger value, then lower index.
__device__ __forceinline__ bool ranks_before(float v1, int32_t i1, float v2, int32_t i2) {
    const bool n1 = isnan(v1), n2 = isnan(v2);
    if (n1 || n2) return n1 && (!n2 || i1 < i2);
    return v1 > v2 || (v1 == v2 && i1 < i2);
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const __grid_constant__ ArgmaxArgs a) {
    __shared__ float sv[kArgmaxThreads / 32];
    __shared__ int32_t si[kArgmaxThreads / 32];
    const float *x = a.x + int64_t(blockIdx.x) * a.ld;
    float best = -INFINITY;
    int32_t bi = INT32_MAX;  // sentinel: any element, even -inf, wins by the lower index
    for (int64_t i = threadIdx.x; i < a.n; i += kArgmaxThreads) {
        const float v = x[i];
        if (ranks_before(v, int32_t(i), best, bi)) best = v, bi = int32_t(i);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(kFullMask, best, o);
        const int32_t oi = __shfl_xor_sync(kFullMask, bi, o);
        if (ranks_before(ov, oi, best, bi)) best = ov, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = best, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kArgmaxThreads / 32; ++w)
            if (ranks_before(sv[w], si[w], best, bi)) best = sv[w], bi = si[w];
        a.out[blockIdx.x] = bi;
    }
}

// ---------------------------------------------------------------------------- row gather

constexpr int kGatherRows = 32;  // rows per gather launch (their indices are kernel arguments)
struct GatherArgs {
    CMatF x;
    MatF out;
    int64_t cols;
    int32_t n;
    int64_t rows[kGatherRows];
};
// Block r copies row rows[r] of x to row r of out.
__global__ void gather_rows_kernel(const __grid_constant__ GatherArgs a) {
    const float *src = a.x.ptr + a.rows[blockIdx.x] * a.x.ld;
    float *dst = a.out.ptr + int64_t(blockIdx.x) * a.out.ld;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) dst[c] = src[c];
}

// ---------------------------------------------------------------------------- device values

constexpr int kStoreValues = 32;  // int64 values per store launch (kernel parameters)
struct StoreArgs {
    int64_t *dst;
    int32_t n;
    int64_t v[kStoreValues];
};
__global__ void store_i64_kernel(const __grid_constant__ StoreArgs a) {
    if (int(threadIdx.x) < a.n) a.dst[threadIdx.x] = a.v[threadIdx.x];
}

}  // namespace

// ------------------------------------------------------------------------------ entries

pf_status rms_norm_rows(CMatF xm, const float *w, MatF ym, int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
    const float *x = xm.ptr;
    float *y = ym.ptr;
    const int64_t ldx = xm.ld, ldy = ym.ld;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "rms_norm_rows: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(cols >= 1, "rms_norm_rows: cols=%lld must be >= 1", (long long)cols);
    PF_CHECK_ARG(ldx >= cols && ldy >= cols, "rms_norm_rows: ldx=%lld / ldy=%lld < cols=%lld",
                 (long long)ldx, (long long)ldy, (long long)cols);
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "rms_norm_rows: eps=%g must be finite, >= 0",
                 (double)eps);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(x && w && y, "rms_norm_rows: null pointer (x=%p w=%p y=%p)", (const void *)x,
                 (const void *)w, (void *)y);
    const RmsNormArgs a{xm, w, ym, cols, eps};
    // Small rows (qwen 0.6B/0.8B hidden 1024): 128 threads, 8 elements each; larger: 256.
    const int block = cols <= 1024 ? 128 : kNormBlock;
    rms_norm_kernel<<<(unsigned)rows, block, 0, stream>>>(a);
    PF_LAUNCH_CHECK("rms_norm_kernel");
    return PF_STATUS_OK;
}

namespace {
pf_status check_heads(const char *fn, int64_t ld, int64_t rows, int32_t n_heads,
                      int64_t head_stride, int32_t head_dim) {
    PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
    PF_CHECK_ARG(n_heads >= 1, "%s: n_heads=%d must be >= 1", fn, n_heads);
    PF_CHECK_ARG(head_dim >= 1, "%s: head_dim=%d must be >= 1", fn, head_dim);
    PF_CHECK_ARG(head_stride >= head_dim, "%s: head_stride=%lld < head_dim=%d", fn,
                 (long long)head_stride, head_dim);
    PF_CHECK_ARG(ld >= (int64_t)(n_heads - 1) * head_stride + head_dim,
                 "%s: ld=%lld < (n_heads-1)*head_stride + head_dim = %lld", fn, (long long)ld,
                 (long long)((int64_t)(n_heads - 1) * head_stride + head_dim));
    PF_CHECK_ARG(rows * n_heads <= kMaxGridX, "%s: rows*n_heads=%lld too large", fn,
                 (long long)(rows * n_heads));
    return PF_STATUS_OK;
}
}  // namespace

pf_status head_rms_norm_rows(MatF xm, int64_t rows, HeadLayout heads, const float *w, float eps,
                             cudaStream_t stream) {
    float *x = xm.ptr;
    const int64_t ld = xm.ld, head_stride = heads.stride;
    const int32_t n_heads = heads.n, head_dim = heads.dim;
    PF_TRY(check_heads("head_rms_norm_rows", ld, rows, n_heads, head_stride, head_dim));
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps),
                 "head_rms_norm_rows: eps=%g must be finite, >= 0", (double)eps);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(x && w, "head_rms_norm_rows: null pointer (x=%p w=%p)", (void *)x,
                 (const void *)w);
    const HeadNormArgs a{xm, rows, n_heads, head_stride, head_dim, w, eps};
    const int64_t warps = rows * n_heads;
    head_rms_norm_kernel<<<head_warp_blocks(warps), kHeadWarps * kWarpSize, 0, stream>>>(a);
    PF_LAUNCH_CHECK("head_rms_norm_kernel");
    return PF_STATUS_OK;
}

namespace {
pf_status rope_launch(MatF xm, int64_t rows, HeadLayout heads, int32_t rot_dim, int64_t pos0,
                      const int64_t *pos0_dev, float base, cudaStream_t stream) {
    float *x = xm.ptr;
    const int64_t ld = xm.ld, head_stride = heads.stride;
    const int32_t n_heads = heads.n, head_dim = heads.dim;
    PF_TRY(check_heads("rope_neox_rows", ld, rows, n_heads, head_stride, head_dim));
    PF_CHECK_ARG(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim,
                 "rope_neox_rows: rot_dim=%d must be even, in [2, head_dim=%d]", rot_dim,
                 head_dim);
    PF_CHECK_ARG(pos0 >= 0 && pos0 <= INT64_MAX / 2 - rows, "rope_neox_rows: pos0=%lld out of range",
                 (long long)pos0);
    PF_CHECK_ARG(base > 1.0f && std::isfinite(base), "rope_neox_rows: base=%g must be > 1",
                 (double)base);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(x != nullptr, "rope_neox_rows: x is NULL");
    const int32_t half = rot_dim / 2;
    const RopeArgs a{xm, rows, n_heads, head_stride, half, pos0, pos0_dev, (double)base, (double)rot_dim};
    const int64_t threads = rows * half;
    const int block = 128;
    PF_CHECK_ARG((threads + block - 1) / block <= kMaxGridX, "rope_neox_rows: rows=%lld too large",
                 (long long)rows);
    rope_neox_kernel<<<(unsigned)((threads + block - 1) / block), block, 0, stream>>>(a);
    PF_LAUNCH_CHECK("rope_neox_kernel");
    return PF_STATUS_OK;
}
}  // namespace

pf_status rope_neox_rows(MatF x, int64_t rows, HeadLayout heads, int32_t rot_dim, int64_t pos0,
                         float base, cudaStream_t stream) {
    return rope_launch(x, rows, heads, rot_dim, pos0, nullptr, base, stream);
}

pf_status rope_neox_rows_at(MatF x, int64_t rows, HeadLayout heads, int32_t rot_dim,
                            const int64_t *pos0_dev, float base, cudaStream_t stream) {
    PF_CHECK_ARG(pos0_dev != nullptr, "rope_neox_rows_at: pos0_dev is NULL");
    return rope_launch(x, rows, heads, rot_dim, 0, pos0_dev, base, stream);
}

pf_status swiglu_rows(CMatF gm, CMatF um, MatF om, int64_t rows, int64_t cols, cudaStream_t stream) {
    const float *g = gm.ptr, *u = um.ptr;
    float *out = om.ptr;
    const int64_t ldg = gm.ld, ldu = um.ld, ldo = om.ld;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "swiglu_rows: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(cols >= 1, "swiglu_rows: cols=%lld must be >= 1", (long long)cols);
    PF_CHECK_ARG(ldg >= cols && ldu >= cols && ldo >= cols,
                 "swiglu_rows: ldg=%lld / ldu=%lld / ldo=%lld < cols=%lld", (long long)ldg,
                 (long long)ldu, (long long)ldo, (long long)cols);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(g && u && out, "swiglu_rows: null pointer");
    const SwigluArgs a{gm, um, om, cols};
    elementwise_kernel<<<elementwise_grid(rows, cols), kElemBlock, 0, stream>>>(a);
    PF_LAUNCH_CHECK("elementwise_kernel<SwigluArgs>");
    return PF_STATUS_OK;
}

pf_status add_rows(MatF ym, CMatF xm, int64_t rows, int64_t cols, cudaStream_t stream) {
    float *y = ym.ptr;
    const float *x = xm.ptr;
    const int64_t ldy = ym.ld, ldx = xm.ld;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "add_rows: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(cols >= 1, "add_rows: cols=%lld must be >= 1", (long long)cols);
    PF_CHECK_ARG(ldy >= cols && ldx >= cols, "add_rows: ldy=%lld / ldx=%lld < cols=%lld",
                 (long long)ldy, (long long)ldx, (long long)cols);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(y && x, "add_rows: null pointer");
    const AddArgs a{ym, xm, cols};
    elementwise_kernel<<<elementwise_grid(rows, cols), kElemBlock, 0, stream>>>(a);
    PF_LAUNCH_CHECK("elementwise_kernel<AddArgs>");
    return PF_STATUS_OK;
}

pf_status sigmoid_gate_rows(MatF om, CMatF gm, HeadLayout gate_heads, int64_t rows, cudaStream_t stream) {
    float *o = om.ptr;
    const float *gate = gm.ptr;
    const int64_t ldo = om.ld, ldgate = gm.ld, gate_head_stride = gate_heads.stride;
    const int32_t n_heads = gate_heads.n, head_dim = gate_heads.dim;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "sigmoid_gate_rows: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(n_heads >= 1 && head_dim >= 1, "sigmoid_gate_rows: n_heads=%d head_dim=%d must be >= 1",
                 n_heads, head_dim);
    const int64_t cols = (int64_t)n_heads * head_dim;
    PF_CHECK_ARG(cols <= INT_MAX, "sigmoid_gate_rows: n_heads*head_dim=%lld >= 2^31",
                 (long long)cols);
    PF_CHECK_ARG(ldo >= cols, "sigmoid_gate_rows: ldo=%lld < n_heads*head_dim=%lld",
                 (long long)ldo, (long long)cols);
    PF_CHECK_ARG(gate_head_stride >= head_dim,
                 "sigmoid_gate_rows: gate_head_stride=%lld < head_dim=%d",
                 (long long)gate_head_stride, head_dim);
    PF_CHECK_ARG(ldgate >= (int64_t)(n_heads - 1) * gate_head_stride + head_dim,
                 "sigmoid_gate_rows: ldgate=%lld < (n_heads-1)*gate_head_stride + head_dim",
                 (long long)ldgate);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(o && gate, "sigmoid_gate_rows: null pointer");
    const GateArgs a{om, gm, gate_head_stride, head_dim, (int32_t)cols};
    elementwise_kernel<<<elementwise_grid(rows, cols), kElemBlock, 0, stream>>>(a);
    PF_LAUNCH_CHECK("elementwise_kernel<GateArgs>");
    return PF_STATUS_OK;
}

pf_status rms_norm_rows_f16(CMatF xm, const float *w, const F16Out &out, int64_t rows, int64_t cols,
                            float eps, cudaStream_t stream) {
    const float *x = xm.ptr;
    const int64_t ldx = xm.ld;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "rms_norm_rows_f16: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(cols >= 1 && ldx >= cols, "rms_norm_rows_f16: cols=%lld ldx=%lld", (long long)cols,
                 (long long)ldx);
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "rms_norm_rows_f16: eps=%g must be finite, >= 0",
                 (double)eps);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(x && w, "rms_norm_rows_f16: null pointer (x=%p w=%p)", (const void *)x, (const void *)w);
    PF_TRY(check_f16_out("rms_norm_rows_f16", out, cols));
    const int block = cols <= 1024 ? 128 : kNormBlock;  // rms_norm_rows' choice: the same sums
    if (out.form.regs &&
        with_smallest_fit<2, 4, 8, 10, 12, 16, 20>(ceil_div(cols, block), [&](auto n) {
            const RmsNormF16Args a{xm, w, cols, eps, out, 0};
            rms_norm_f16_reg_kernel<decltype(n)::value><<<(unsigned)rows, block, 0, stream>>>(a);
        })) {
        PF_LAUNCH_CHECK("rms_norm_f16_reg_kernel");
        return PF_STATUS_OK;
    }
    const size_t stage = f16_stage_bytes(cols, out.form);
    const RmsNormF16Args a{xm, w, cols, eps, out, stage ? 1 : 0};
    rms_norm_f16_kernel<<<(unsigned)rows, block, stage, stream>>>(a);
    PF_LAUNCH_CHECK("rms_norm_f16_kernel");
    return PF_STATUS_OK;
}

pf_status swiglu_rows_f16(CMatF gm, CMatF um, const F16Out &out, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
    const float *g = gm.ptr, *u = um.ptr;
    const int64_t ldg = gm.ld, ldu = um.ld;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "swiglu_rows_f16: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(cols >= 1 && ldg >= cols && ldu >= cols, "swiglu_rows_f16: cols=%lld ldg=%lld ldu=%lld",
                 (long long)cols, (long long)ldg, (long long)ldu);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(g && u, "swiglu_rows_f16: null pointer");
    PF_TRY(check_f16_out("swiglu_rows_f16", out, cols));
    const auto aligned = [](const void *p, uintptr_t b) { return reinterpret_cast<uintptr_t>(p) % b == 0; };
    const bool vec4 = cols % 4 == 0 && ldg % 4 == 0 && ldu % 4 == 0 && out.ld16 % 4 == 0 &&
                      aligned(g, 16) && aligned(u, 16) && aligned(out.x16, 8);
    if (vec4 && out.form.regs &&
        with_smallest_fit<1, 2, 4, 6, 8, 10, 12, 16>(ceil_div(cols / 4, kF16RowThreads), [&](auto n) {
            const SwigluF16Args a{gm, um, cols, out, 0};
            swiglu_f16_reg_kernel<decltype(n)::value><<<(unsigned)rows, kF16RowThreads, 0, stream>>>(a);
        })) {
        PF_LAUNCH_CHECK("swiglu_f16_reg_kernel");
        return PF_STATUS_OK;
    }
    const size_t stage = f16_stage_bytes(cols, out.form);
    const SwigluF16Args a{gm, um, cols, out, stage ? 1 : 0};
    swiglu_f16_kernel<<<(unsigned)rows, kF16RowThreads, stage, stream>>>(a);
    PF_LAUNCH_CHECK("swiglu_f16_kernel");
    return PF_STATUS_OK;
}

pf_status sigmoid_gate_rows_f16(CMatF om, CMatF gm, HeadLayout gate_heads, const F16Out &out,
                                int64_t rows, cudaStream_t stream) {
    const float *o = om.ptr, *gate = gm.ptr;
    const int64_t ldo = om.ld, ldgate = gm.ld, gate_head_stride = gate_heads.stride;
    const int32_t n_heads = gate_heads.n, head_dim = gate_heads.dim;
    PF_CHECK_ARG(rows >= 0 && rows <= kMaxGridX, "sigmoid_gate_rows_f16: rows=%lld out of range",
                 (long long)rows);
    PF_CHECK_ARG(n_heads >= 1 && head_dim >= 1, "sigmoid_gate_rows_f16: n_heads=%d head_dim=%d", n_heads,
                 head_dim);
    const int64_t cols = (int64_t)n_heads * head_dim;
    PF_CHECK_ARG(cols <= INT_MAX && ldo >= cols && gate_head_stride >= head_dim &&
                     ldgate >= (int64_t)(n_heads - 1) * gate_head_stride + head_dim,
                 "sigmoid_gate_rows_f16: ldo=%lld ldgate=%lld gate_head_stride=%lld", (long long)ldo,
                 (long long)ldgate, (long long)gate_head_stride);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(o && gate, "sigmoid_gate_rows_f16: null pointer");
    PF_TRY(check_f16_out("sigmoid_gate_rows_f16", out, cols));
    const size_t stage = f16_stage_bytes(cols, out.form);
    const GateF16Args a{om, gm, gate_head_stride, head_dim, (int32_t)cols, out, stage ? 1 : 0};
    sigmoid_gate_f16_kernel<<<(unsigned)rows, kF16RowThreads, stage, stream>>>(a);
    PF_LAUNCH_CHECK("sigmoid_gate_f16_kernel");
    return PF_STATUS_OK;
}

pf_status store_i64s(int64_t *dst, const int64_t *v, int64_t n, cudaStream_t stream) {
    PF_CHECK_ARG(dst != nullptr && (v != nullptr || n == 0) && n >= 0, "store_i64s: dst=%p v=%p n=%lld",
                 (void *)dst, (const void *)v, (long long)n);
    for (int64_t i = 0; i < n; i += kStoreValues) {
        StoreArgs a;
        a.dst = dst + i;
        a.n = int32_t(std::min<int64_t>(kStoreValues, n - i));
        for (int32_t j = 0; j < a.n; ++j) a.v[j] = v[i + j];
        store_i64_kernel<<<1, kStoreValues, 0, stream>>>(a);
        PF_LAUNCH_CHECK("store_i64_kernel");
    }
    return PF_STATUS_OK;
}

pf_status argmax_rows(const float *x, int64_t rows, int64_t n, int64_t ld, int32_t *out_ids,
                      cudaStream_t stream) {
    PF_CHECK_ARG(rows >= 0 && rows <= INT_MAX && n >= 1 && n <= INT32_MAX && ld >= n,
                 "argmax_rows: rows=%lld n=%lld ld=%lld", (long long)rows, (long long)n,
                 (long long)ld);
    if (rows == 0) return PF_STATUS_OK;
    argmax_rows_kernel<<<unsigned(rows), kArgmaxThreads, 0, stream>>>(ArgmaxArgs{x, n, ld, out_ids});
    PF_LAUNCH_CHECK("argmax_rows_kernel");
    return PF_STATUS_OK;
}


pf_status gather_rows(CMatF x, const int64_t *rows, int64_t n, MatF out, int64_t cols, cudaStream_t stream) {
    PF_CHECK_ARG(n >= 0 && cols >= 1 && x.ld >= cols && out.ld >= cols && (rows != nullptr || n == 0),
                 "gather_rows: n=%lld cols=%lld ldx=%lld ldo=%lld", (long long)n, (long long)cols, (long long)x.ld,
                 (long long)out.ld);
    for (int64_t i = 0; i < n; i += kGatherRows) {
        GatherArgs a;
        a.x = x;
        a.out = out.rows_from(i);
        a.cols = cols;
        a.n = int32_t(std::min<int64_t>(kGatherRows, n - i));
        for (int32_t j = 0; j < a.n; ++j) a.rows[j] = rows[i + j];
        gather_rows_kernel<<<unsigned(a.n), 256, 0, stream>>>(a);
        PF_LAUNCH_CHECK("gather_rows_kernel");
    }
    return PF_STATUS_OK;
}

}  // namespace pf
