// gdn.cu — Gated DeltaNet kernels (spec §3.2): conv1d + SiLU, L2 norm, gates, gated RMSNorm,
// and the chunk-resident sequential delta-rule scan. Three layers per op: __global__ kernel (one
// args struct) -> launcher -> entry (declared in gdn.cuh). fp32 throughout; every reduction has
// a fixed order that does not depend on the number of rows, so each row kernel equals `rows`
// launches of itself with rows = 1 bit for bit (the per-token twin).
#include <climits>
#include <cmath>

#include "cuda_check.cuh"
#include "gdn.cuh"

namespace pf {
namespace {

constexpr int kWarp = 32;
constexpr int kHeadWarps = 4;           // warp-per-head kernels: 4 heads per 128-thread block
constexpr int64_t kMaxGridX = INT_MAX;  // gridDim.x limit (2^31 - 1)
constexpr int64_t kMaxGridY = 65535;    // gridDim.y limit

__device__ __forceinline__ float warp_sum(float v) {
    // Butterfly: all lanes end with the bitwise-same sum (a + b == b + a in IEEE arithmetic).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float silu_(float x) { return x / (1.0f + expf(-x)); }

// ------------------------------------------------------------------------------ conv1d + SiLU

constexpr int kConvThreads = 128;     // channels per block (coalesced row segments of 512 B)
constexpr int64_t kConvMinChunk = 16; // rows per thread; >= kGdnMaxConvKernel - 1, so only the
                                      // first chunk of a channel ever reads the old window

struct ConvArgs {
    const float *m;
    int64_t ldm;
    float *window;
    const float *weight;
    float *u;
    int64_t ldu;
    int64_t rows;
    int64_t conv_dim;
    int64_t chunk;  // rows per thread
};

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
        prev[i] = xr < KC - 1 ? a.window[xr * a.conv_dim + ch] : a.m[(xr - (KC - 1)) * a.ldm + ch];
    }
    float old[KC - 1];  // the old window of this channel (meaningful for blockIdx.y == 0)
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) old[i] = prev[i];
    for (int64_t t = r0; t < r1; ++t) {
        const float cur = a.m[t * a.ldm + ch];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KC - 1; ++i) acc = fmaf(prev[i], w[i], acc);  // oldest tap first
        acc = fmaf(cur, w[KC - 1], acc);                                 // tap KC-1: token t
        a.u[t * a.ldu + ch] = silu_(acc);
#pragma unroll
        for (int i = 0; i < KC - 2; ++i) prev[i] = prev[i + 1];
        prev[KC - 2] = cur;
    }
    if (blockIdx.y == 0) {
        // New window = last KC-1 rows of X: start from the old one and append the last
        // min(rows, KC-1) inputs. This thread is the only reader of the old window of `ch`
        // (its values are in registers), so writing it now races with nobody.
        const int64_t t_first = a.rows > KC - 1 ? a.rows - (KC - 1) : 0;
#pragma unroll
        for (int s = 0; s < KC - 1; ++s) {
            const int64_t t = t_first + s;
            if (t < a.rows) {
#pragma unroll
                for (int i = 0; i < KC - 2; ++i) old[i] = old[i + 1];
                old[KC - 2] = a.m[t * a.ldm + ch];
            }
        }
#pragma unroll
        for (int i = 0; i < KC - 1; ++i) a.window[(int64_t)i * a.conv_dim + ch] = old[i];
    }
}

// ------------------------------------------------------------------------------ L2 norm

struct L2Args {
    float *x;
    int64_t ld;
    int64_t rows;
    int32_t n_heads;
    int64_t head_stride;
    int32_t head_dim;
    float eps;
    float scale;
};

// One warp per (row, head).
__global__ void l2norm_kernel(const __grid_constant__ L2Args a) {
    const int64_t gw = (int64_t)blockIdx.x * kHeadWarps + threadIdx.x / kWarp;
    if (gw >= a.rows * a.n_heads) return;  // whole warps exit together
    const int lane = threadIdx.x % kWarp;
    float *x = a.x + (gw / a.n_heads) * a.ld + (gw % a.n_heads) * a.head_stride;
    float s = 0.0f;
    for (int i = lane; i < a.head_dim; i += kWarp) s = fmaf(x[i], x[i], s);
    s = warp_sum(s);
    const float f = (1.0f / sqrtf(s + a.eps)) * a.scale;  // HF: x * rsqrt(sum x^2 + eps)
    for (int i = lane; i < a.head_dim; i += kWarp) x[i] = x[i] * f;
}

// ------------------------------------------------------------------------------ gates

struct GatesArgs {
    const float *b;
    int64_t ldb;
    const float *alpha;
    int64_t ld_alpha;
    const float *ssm_a;
    const float *dt_bias;
    float *beta;
    int64_t ld_beta;
    float *g;
    int64_t ld_g;
    int64_t rows;
    int32_t n_v_heads;
};

__global__ void gates_kernel(const __grid_constant__ GatesArgs a) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= a.rows * a.n_v_heads) return;
    const int64_t r = idx / a.n_v_heads;
    const int j = (int)(idx % a.n_v_heads);
    const float bl = a.b[r * a.ldb + j];
    a.beta[r * a.ld_beta + j] = 1.0f / (1.0f + expf(-bl));
    const float x = a.alpha[r * a.ld_alpha + j] + a.dt_bias[j];
    const float sp = x > 20.0f ? x : log1pf(expf(x));  // PyTorch/ggml threshold: exp would overflow
    a.g[r * a.ld_g + j] = a.ssm_a[j] * sp;
}

// ------------------------------------------------------------------------------ gated RMSNorm

struct GatedNormArgs {
    const float *o;
    int64_t ldo;
    const float *z;
    int64_t ldz;
    const float *w;
    float *y;
    int64_t ldy;
    int64_t rows;
    int32_t n_v_heads;
    int32_t dv;
    float eps;
};

// One warp per (row, value head). In place (y == o) is safe: a lane rewrites only the elements
// it read, after the warp's sum is complete.
__global__ void gated_rms_norm_kernel(const __grid_constant__ GatedNormArgs a) {
    const int64_t gw = (int64_t)blockIdx.x * kHeadWarps + threadIdx.x / kWarp;
    if (gw >= a.rows * a.n_v_heads) return;
    const int lane = threadIdx.x % kWarp;
    const int64_t r = gw / a.n_v_heads, col = (gw % a.n_v_heads) * a.dv;
    const float *o = a.o + r * a.ldo + col;
    const float *z = a.z + r * a.ldz + col;
    float *y = a.y + r * a.ldy + col;
    float s = 0.0f;
    for (int i = lane; i < a.dv; i += kWarp) s = fmaf(o[i], o[i], s);
    s = warp_sum(s);
    const float inv = 1.0f / sqrtf(s / (float)a.dv + a.eps);
    for (int i = lane; i < a.dv; i += kWarp) y[i] = ((o[i] * inv) * a.w[i]) * silu_(z[i]);
}

// ------------------------------------------------------------------------------ delta-rule scan

constexpr int kScanCols = 16;                         // value columns per block
constexpr int kScanParts = 8;                         // threads per column: split of the dk sum
constexpr int kScanThreads = kScanCols * kScanParts;  // 128
constexpr int kScanTile = 32;                         // tokens staged per shared-memory tile

struct ScanArgs {
    const float *q;
    int64_t ldq;
    const float *k;
    int64_t ldk;
    const float *v;
    int64_t ldv;
    const float *beta;
    int64_t ld_beta;
    const float *g;
    int64_t ld_g;
    float *state;
    float *o;
    int64_t ldo;
    int64_t rows;
    int32_t n_k_heads;
    int32_t dv;
};

// Sum over the kScanParts lanes of one column (lane bits 0..2). Butterfly: all 8 lanes end
// with the bitwise-same value.
__device__ __forceinline__ float part_sum(float v) {
#pragma unroll
    for (int off = 1; off < kScanParts; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Block = (value head j, value columns [col0, col0 + 16)). Thread (c = tid / 8, p = tid % 8)
// holds S[a][col0 + c] for a = p + 8 i, i < DK/8, in registers for the whole call. Key rows are
// strided over the 8 parts so that a warp's shared-memory reads of k/q hit 8 distinct banks.
template <int DK>
__global__ void __launch_bounds__(kScanThreads) scan_kernel(const __grid_constant__ ScanArgs a) {
    constexpr int N = DK / kScanParts;  // state entries per thread
    __shared__ float sk[kScanTile][DK];
    __shared__ float sq[kScanTile][DK];
    __shared__ float sv[kScanTile][kScanCols];
    __shared__ float so[kScanTile][kScanCols];
    __shared__ float sbeta[kScanTile];
    __shared__ float sg[kScanTile];
    __shared__ float sS[DK][kScanCols];  // state slice in transit (coalesced 64-byte rows)

    const int tid = threadIdx.x;
    const int p = tid % kScanParts;
    const int c = tid / kScanParts;
    const int blocks_per_head = a.dv / kScanCols;
    const int j = blockIdx.x / blocks_per_head;
    const int col0 = (blockIdx.x % blocks_per_head) * kScanCols;
    const int jk = j % a.n_k_heads;  // tiled pairing (qwen35 GGUF, spec G6)
    const int64_t hv_col = (int64_t)j * a.dv + col0;    // this block's columns in v / o rows
    const int64_t hk_col = (int64_t)jk * DK;            // the paired key head in q / k rows
    float *state = a.state + (int64_t)j * DK * a.dv + col0;

    for (int e = tid; e < DK * kScanCols; e += kScanThreads)
        sS[e / kScanCols][e % kScanCols] = state[(int64_t)(e / kScanCols) * a.dv + e % kScanCols];
    __syncthreads();
    float S[N];
#pragma unroll
    for (int i = 0; i < N; ++i) S[i] = sS[p + kScanParts * i][c];
    __syncthreads();  // sS is written again only at the end; keep the phases apart anyway

    for (int64_t t0 = 0; t0 < a.rows; t0 += kScanTile) {
        const int nt = a.rows - t0 < kScanTile ? (int)(a.rows - t0) : kScanTile;
        // Stage the tile: rows of q/k (DK contiguous floats each), v (16), beta, g.
        for (int e = tid; e < nt * DK; e += kScanThreads) {
            const int tt = e / DK, d = e % DK;
            sk[tt][d] = a.k[(t0 + tt) * a.ldk + hk_col + d];
            sq[tt][d] = a.q[(t0 + tt) * a.ldq + hk_col + d];
        }
        for (int e = tid; e < nt * kScanCols; e += kScanThreads) {
            const int tt = e / kScanCols, cc = e % kScanCols;
            sv[tt][cc] = a.v[(t0 + tt) * a.ldv + hv_col + cc];
        }
        for (int e = tid; e < nt; e += kScanThreads) {
            sbeta[e] = a.beta[(t0 + e) * a.ld_beta + j];
            sg[e] = a.g[(t0 + e) * a.ld_g + j];
        }
        __syncthreads();
        for (int tt = 0; tt < nt; ++tt) {
            const float decay = expf(sg[tt]);  // g <= 0: decay in (0, 1]
            float kv = 0.0f;                   // (S^T k)[col], after the decay
#pragma unroll
            for (int i = 0; i < N; ++i) {
                S[i] *= decay;
                kv = fmaf(S[i], sk[tt][p + kScanParts * i], kv);
            }
            kv = part_sum(kv);
            const float err = (sv[tt][c] - kv) * sbeta[tt];
            float oq = 0.0f;  // (S^T q)[col], after the update
#pragma unroll
            for (int i = 0; i < N; ++i) {
                S[i] = fmaf(sk[tt][p + kScanParts * i], err, S[i]);
                oq = fmaf(S[i], sq[tt][p + kScanParts * i], oq);
            }
            oq = part_sum(oq);
            if (p == 0) so[tt][c] = oq;
        }
        __syncthreads();  // so[] complete; sk/sq/sv no longer read: the next tile may overwrite
        for (int e = tid; e < nt * kScanCols; e += kScanThreads) {
            const int tt = e / kScanCols, cc = e % kScanCols;
            a.o[(t0 + tt) * a.ldo + hv_col + cc] = so[tt][cc];
        }
        // so[] is next written after the next tile's __syncthreads, so these reads are done.
    }

#pragma unroll
    for (int i = 0; i < N; ++i) sS[p + kScanParts * i][c] = S[i];
    __syncthreads();
    for (int e = tid; e < DK * kScanCols; e += kScanThreads)
        state[(int64_t)(e / kScanCols) * a.dv + e % kScanCols] = sS[e / kScanCols][e % kScanCols];
}

bool scan_dim_ok(int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

}  // namespace

// ------------------------------------------------------------------------------ entries

pf_status gdn_conv1d_rows(const float *m, int64_t ldm, float *window, const float *weight,
                          float *u, int64_t ldu, int64_t rows, int64_t conv_dim, int32_t kc,
                          cudaStream_t stream) {
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
    const ConvArgs a{m, ldm, window, weight, u, ldu, rows, conv_dim, chunk};
    const int64_t gx = (conv_dim + kConvThreads - 1) / kConvThreads;
    PF_CHECK_ARG(gx <= kMaxGridX, "gdn_conv1d_rows: conv_dim=%lld too large", (long long)conv_dim);
    const dim3 grid((unsigned)gx, (unsigned)((rows + chunk - 1) / chunk), 1);
    switch (kc) {
        case 2: conv1d_silu_kernel<2><<<grid, kConvThreads, 0, stream>>>(a); break;
        case 3: conv1d_silu_kernel<3><<<grid, kConvThreads, 0, stream>>>(a); break;
        case 4: conv1d_silu_kernel<4><<<grid, kConvThreads, 0, stream>>>(a); break;
        case 5: conv1d_silu_kernel<5><<<grid, kConvThreads, 0, stream>>>(a); break;
        case 6: conv1d_silu_kernel<6><<<grid, kConvThreads, 0, stream>>>(a); break;
        case 7: conv1d_silu_kernel<7><<<grid, kConvThreads, 0, stream>>>(a); break;
        case 8: conv1d_silu_kernel<8><<<grid, kConvThreads, 0, stream>>>(a); break;
        default: return fail(PF_STATUS_INTERNAL, "gdn_conv1d_rows: kc=%d not dispatched", kc);
    }
    PF_LAUNCH_CHECK("conv1d_silu_kernel");
    return PF_STATUS_OK;
}

pf_status gdn_l2norm_rows(float *x, int64_t ld, int64_t rows, int32_t n_heads,
                          int64_t head_stride, int32_t head_dim, float eps, float scale,
                          cudaStream_t stream) {
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
    const L2Args a{x, ld, rows, n_heads, head_stride, head_dim, eps, scale};
    const int64_t warps = rows * n_heads;
    l2norm_kernel<<<(unsigned)((warps + kHeadWarps - 1) / kHeadWarps), kHeadWarps * kWarp, 0,
                    stream>>>(a);
    PF_LAUNCH_CHECK("l2norm_kernel");
    return PF_STATUS_OK;
}

pf_status gdn_gates_rows(const float *b, int64_t ldb, const float *alpha, int64_t ld_alpha,
                         const float *ssm_a, const float *dt_bias, float *beta, int64_t ld_beta,
                         float *g, int64_t ld_g, int64_t rows, int32_t n_v_heads,
                         cudaStream_t stream) {
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
    const GatesArgs a{b, ldb, alpha, ld_alpha, ssm_a, dt_bias, beta, ld_beta, g, ld_g, rows,
                      n_v_heads};
    const int64_t n = rows * n_v_heads;
    gates_kernel<<<(unsigned)((n + block - 1) / block), block, 0, stream>>>(a);
    PF_LAUNCH_CHECK("gates_kernel");
    return PF_STATUS_OK;
}

pf_status gdn_gated_rms_norm_rows(const float *o, int64_t ldo, const float *z, int64_t ldz,
                                  const float *w, float *y, int64_t ldy, int64_t rows,
                                  int32_t n_v_heads, int32_t dv, float eps, cudaStream_t stream) {
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
    const GatedNormArgs a{o, ldo, z, ldz, w, y, ldy, rows, n_v_heads, dv, eps};
    const int64_t warps = rows * n_v_heads;
    gated_rms_norm_kernel<<<(unsigned)((warps + kHeadWarps - 1) / kHeadWarps), kHeadWarps * kWarp,
                            0, stream>>>(a);
    PF_LAUNCH_CHECK("gated_rms_norm_kernel");
    return PF_STATUS_OK;
}

pf_status gdn_scan_rows(const float *q, int64_t ldq, const float *k, int64_t ldk, const float *v,
                        int64_t ldv, const float *beta, int64_t ld_beta, const float *g,
                        int64_t ld_g, float *state, float *o, int64_t ldo, int64_t rows,
                        int32_t n_k_heads, int32_t n_v_heads, int32_t dk, int32_t dv,
                        cudaStream_t stream) {
    PF_CHECK_ARG(rows >= 0, "gdn_scan_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(n_k_heads >= 1 && n_v_heads >= 1 && n_v_heads % n_k_heads == 0,
                 "gdn_scan_rows: n_v_heads=%d must be a positive multiple of n_k_heads=%d",
                 n_v_heads, n_k_heads);
    PF_CHECK_ARG(scan_dim_ok(dk) && scan_dim_ok(dv),
                 "gdn_scan_rows: dk=%d, dv=%d; each must be 16, 32, 64 or 128", dk, dv);
    const int64_t kw = (int64_t)n_k_heads * dk, vw = (int64_t)n_v_heads * dv;
    PF_CHECK_ARG(ldq >= kw && ldk >= kw,
                 "gdn_scan_rows: ldq=%lld / ldk=%lld < n_k_heads*dk=%lld", (long long)ldq,
                 (long long)ldk, (long long)kw);
    PF_CHECK_ARG(ldv >= vw && ldo >= vw, "gdn_scan_rows: ldv=%lld / ldo=%lld < n_v_heads*dv=%lld",
                 (long long)ldv, (long long)ldo, (long long)vw);
    PF_CHECK_ARG(ld_beta >= n_v_heads && ld_g >= n_v_heads,
                 "gdn_scan_rows: ld_beta=%lld / ld_g=%lld < n_v_heads=%d", (long long)ld_beta,
                 (long long)ld_g, n_v_heads);
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(q && k && v && beta && g && state && o, "gdn_scan_rows: null pointer");
    const ScanArgs a{q, ldq, k, ldk, v, ldv, beta, ld_beta, g, ld_g, state, o, ldo, rows,
                     n_k_heads, dv};
    const unsigned grid = (unsigned)(vw / kScanCols);  // n_v_heads * (dv / 16) blocks
    switch (dk) {
        case 16: scan_kernel<16><<<grid, kScanThreads, 0, stream>>>(a); break;
        case 32: scan_kernel<32><<<grid, kScanThreads, 0, stream>>>(a); break;
        case 64: scan_kernel<64><<<grid, kScanThreads, 0, stream>>>(a); break;
        case 128: scan_kernel<128><<<grid, kScanThreads, 0, stream>>>(a); break;
        default: return fail(PF_STATUS_INTERNAL, "gdn_scan_rows: dk=%d not dispatched", dk);
    }
    PF_LAUNCH_CHECK("scan_kernel");
    return PF_STATUS_OK;
}

}  // namespace pf
