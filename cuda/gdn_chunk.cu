// gdn_chunk.cu — the gated delta rule (spec.md G7) in its chunkwise-parallel form (§3.2.1) on
// tensor cores: the long-prompt path of the fast legs. The sequential scan in gdn.cu stays the
// exact path (f32 leg) and the decode path.
//
// Algorithm, per value head j and chunk of C = 64 rows (K, Q: rows of key head j % Hk; S: the
// state entering the chunk; every product accumulates in fp32):
//   gamma = cumsum(g)                         in-chunk log-decay, non-increasing
//   Gam_ij = exp(gamma_i - gamma_j), i >= j   masked before the exp (never exp(-gamma) alone)
//   A  = strictly-lower(beta_i k_i.k_j Gam_ij);  Tm = (I + A)^-1
//   R  = beta (V - e^gamma (K S))             "the delta": what the chunk still has to write
//   V' = Tm R                                 (= U - W S of the spec, without forming W)
//   O  = e^gamma (Q S) + P V',  P = (Q K^T) Gam (lower, diagonal included)
//   S  = e^gamma_last S + K^T (e^(gamma_last - gamma) V')
// Folding W S into Tm (beta V - beta e^gamma K S) is exact algebra (spec: U = Tm beta V,
// W = Tm beta e^gamma K) and saves the 64x64x128 W product per chunk.
//
// Two kernels per pass of at most kGdnPassRows rows:
//  prep  (grid: chunks x key heads, all in parallel): K and Q to fp16 (kept for the state
//        kernel), K K^T and Q K^T once per key head, then per value head of that key head the
//        gates (gamma, beta), A, Tm = (I + A)^-1 (16x16 diagonal blocks by forward substitution
//        in fp32, then two levels of block merges on TF32 tensor cores) and P; Tm and P go to
//        the workspace as fp16. Nothing here depends on the state, so it is off the recurrence.
//        Two forms write the same bytes: v2 (default; grid rounds of 1-2 value heads x chunks x
//        key heads, the heads of a round side by side, 5 CTA barriers, ~43 KB of shared
//        memory) and v1 (value heads in turn, ~19 barriers, 111 KB), kept for A/B runs behind
//        PREFILL_GDN_PREP=v1.
//  state (sequential over chunks; the delta rule is independent across value columns, so a
//        head's 128 columns split across warps and CTAs). Default on sm_90a (compute capability
//        9.0, v's rows 16-byte aligned): the warpgroup kernel (gdn_chunk_state_wg_kernel, last
//        below): one warpgroup keeps 64 columns of S^T as a wgmma accumulator, every product a
//        register-A wgmma, operands by TMA (device run 51: 0.356 vs 0.404 ms per layer at 16/32
//        heads, T = 8192; 0.399 vs 0.527 at 16/48). Elsewhere, and with PREFILL_GDN_STATE=warp:
//        the warp-owned kernel
//        (gdn_chunk_state_t_kernel below): one warp keeps 16 columns of the state transposed in
//        its mma accumulators and runs the whole chunk step on its own registers, a producer
//        warp stages the chunk's operands three deep, one barrier per chunk (32 heads: 128 CTAs
//        of 2 compute warps). v2 (gdn_chunk_state_kernel, PREFILL_GDN_STATE=v2): the state
//        slice S[:, cols] (128 x BV fp32) spread over 16 warps of a CTA, per chunk three tensor-
//        core steps ([K; Q] S, Tm R, then P V' and K^T V') and four barriers. Device run 20
//        (H200, 16/32 heads, T = 8192): 0.409 ms per layer against v2's 0.610 (NOTES.md).
//
// Precision: fp16 tensor-core operands (11-bit significand: TF32's rounding unit, 2^-11), fp32
// accumulation, fp32 state, gates, decays and triangular inverse. Operands whose range the data
// do not bound (S, R, V', Tm) are stored in fp16 with an exact power-of-two scale per chunk,
// chosen from the tile's max |x| (S, Tm) or from a bound derived from maxima already known
// (R <= max|V| + sqrt(dk) max|S|, V' <= max_i sum_j |Tm_ij| max|R|), so that no element exceeds
// 2^15 (fp16: 65504) and no barrier is spent on a reduction; the scale is undone exactly in
// fp32. q and k must be L2-normalised (|x| <= 1, as G5 produces): they go to fp16 unscaled.
// Tested at 2e-3 relative against float64 (tests/python/test_kernel_gdn.py); the first build of
// this form (one kernel, same operand precision and scales) measured 3e-4 to 7e-4 (NOTES.md).
//
// Written for sm_80+ (mma.sync, ldmatrix, cp.async): it runs unchanged on Hopper; the warpgroup
// state kernel is sm_90a only (wgmma, TMA, mbarriers) and compiles to a trap elsewhere.
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "cuda_check.cuh"
#include "gdn.cuh"
#include "hopper.cuh"
#include "wgmma.cuh"

namespace pf {
namespace {

constexpr int kC = 64;          // chunk rows (spec.md §3.2.1)
constexpr int kDK = 128;        // dk = dv of the chunked path (all qwen35 sizes)
constexpr int kLdH = kDK + 8;   // fp16 row stride of K, Q: 272 B, ldmatrix rows hit 8 distinct 16 B bank groups
constexpr int kLdF = kC + 4;    // fp32 row stride of 64-wide tiles: fragment reads (row g, col tig) conflict-free
constexpr int kLdP = kC + 8;    // fp16 row stride of 64-wide tiles (Tm, P): 144 B
constexpr int kLdX = 32 + 4;    // fp32 merge scratch (32 x 32)
constexpr float kScaleTop = 14.0f;  // scaled fp16 tiles: max |x| below 2^15
constexpr float kSqrtDk = 11.3138f; // >= sqrt(128): |k . s| <= ||k|| ||s|| <= sqrt(dk) max|s|

// ------------------------------------------------------------------ tensor-core primitives

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane i gives the row address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// d += a (16x16 fp16, row) * b (16x8 fp16, col), fp32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// d += a (16x8 tf32, row) * b (8x8 tf32, col), fp32 accumulation (the triangular merges: fp32
// range for Tm, 2^-11 operand rounding).
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// Lane addresses of ldmatrix x4 for the operand shapes used here (tile origin (r0, c0) in the
// stored array, lane i):
//  A, stored [m][k]:               row r0 + (i&7) + 8((i>>3)&1), col c0 + 8(i>>4)
//  A, stored [k][m] (.trans):      row r0 + (i&7) + 8(i>>4),     col c0 + 8((i>>3)&1)
//  B pair, stored [n][k]:          row r0 + (i&7) + 8(i>>4),     col c0 + 8((i>>3)&1)
//  B pair, stored [k][n] (.trans): row r0 + (i&7) + 8((i>>3)&1), col c0 + 8(i>>4)
// (a "B pair" is the fragments of two n-tiles: regs 0,1 for columns n0..n0+7, 2,3 for n0+8..)
__device__ __forceinline__ int lrow_a(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
__device__ __forceinline__ int lcol_a(int lane) { return 8 * (lane >> 4); }
__device__ __forceinline__ int lrow_b(int lane) { return (lane & 7) + 8 * (lane >> 4); }
__device__ __forceinline__ int lcol_b(int lane) { return 8 * ((lane >> 3) & 1); }

// --------------------------------------------------------------------------- small helpers

// Programmatic dependent launch (sm_90+; no-ops below): the prep kernel lets the state kernel
// of its pass be scheduled as soon as every prep CTA has started, and the state kernel's
// producer waits for the whole prep grid (its writes visible) before its first copy of the
// workspace. The state kernel's launch and prologue (shared memory, the state into registers)
// then overlap the prep's last wave instead of following it.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

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

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n"); }

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

size_t workspace_layout(int64_t nc, int64_t hk, int64_t hv, void *base, Workspace *w) {
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

struct PrepArgs {
    const float *q;
    int64_t ldq;
    const float *k;
    int64_t ldk;
    const float *beta;
    int64_t ld_beta;
    const float *g;
    int64_t ld_g;
    int64_t rows;  // rows of this pass
    int32_t n_k_heads, n_v_heads, nc;
    Workspace w;
};

// Gates of value head j for chunk c (one warp): gamma = inclusive scan of g (fp32) and beta, into
// gam[64], bet[64] and the workspace. Both prep kernels.
__device__ __forceinline__ void prep_gates(const PrepArgs &a, int c, int j, float *gam, float *bet) {
    const int lane = threadIdx.x & 31;
    const int64_t t0 = (int64_t)c * kC;
    const size_t hc = (size_t)j * a.nc + c;
    float g0 = 0.0f, g1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
    if (t0 + 2 * lane < a.rows) {
        g0 = a.g[(t0 + 2 * lane) * a.ld_g + j];
        b0 = a.beta[(t0 + 2 * lane) * a.ld_beta + j];
    }
    if (t0 + 2 * lane + 1 < a.rows) {
        g1 = a.g[(t0 + 2 * lane + 1) * a.ld_g + j];
        b1 = a.beta[(t0 + 2 * lane + 1) * a.ld_beta + j];
    }
    float x = g0 + g1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    const float lo = x - g1;
    gam[2 * lane] = lo;
    gam[2 * lane + 1] = x;
    bet[2 * lane] = b0;
    bet[2 * lane + 1] = b1;
    *reinterpret_cast<float2 *>(a.w.gam + hc * kC + 2 * lane) = make_float2(lo, x);
    *reinterpret_cast<float2 *>(a.w.bet + hc * kC + 2 * lane) = make_float2(b0, b1);
}

// K and Q rows of key head jk, chunk c, to fp16: into the shared tiles kh, qh and, when
// `store`, the workspace (rows past the end: zero). NT threads (t: this thread's index), loads
// in batches of 8 float4 per thread all issued before any store: the compiler may not move a
// load of q or k above a store to the workspace (they could alias), and one load in flight per
// thread left the first prep kernel waiting on DRAM latency (ncu: long scoreboard, 40% of the
// stall samples). Both prep kernels.
template <bool VEC, int NT>
__device__ __forceinline__ void prep_load_kq(const PrepArgs &a, int c, int jk, int t,
                                             __half (*kh)[kLdH], __half (*qh)[kLdH], bool store) {
    constexpr int kLoads = 8;
    constexpr int kIters = kC * kDK / 4 / NT;  // float4 per thread and matrix
    static_assert(kIters % kLoads == 0, "batches");
    const int64_t t0 = (int64_t)c * kC;
    const size_t kq_off = ((size_t)jk * a.nc + c) * kC * kDK;
#pragma unroll 1
    for (int it0 = 0; it0 < kIters; it0 += kLoads) {
        float4 kx[kLoads], qx[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int e = t + (it0 + u) * NT;
            const int i = e / (kDK / 4), d = (e % (kDK / 4)) * 4;
            kx[u] = qx[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t0 + i < a.rows) {
                const float *kp = a.k + (t0 + i) * a.ldk + (int64_t)jk * kDK + d;
                const float *qp = a.q + (t0 + i) * a.ldq + (int64_t)jk * kDK + d;
                if (VEC) {
                    kx[u] = __ldg(reinterpret_cast<const float4 *>(kp));
                    qx[u] = __ldg(reinterpret_cast<const float4 *>(qp));
                } else {
                    kx[u] = make_float4(__ldg(kp), __ldg(kp + 1), __ldg(kp + 2), __ldg(kp + 3));
                    qx[u] = make_float4(__ldg(qp), __ldg(qp + 1), __ldg(qp + 2), __ldg(qp + 3));
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int e = t + (it0 + u) * NT;
            const int i = e / (kDK / 4), d = (e % (kDK / 4)) * 4;
            uint2 kp2, qp2;
            kp2.x = pack_half2(kx[u].x, kx[u].y);
            kp2.y = pack_half2(kx[u].z, kx[u].w);
            qp2.x = pack_half2(qx[u].x, qx[u].y);
            qp2.y = pack_half2(qx[u].z, qx[u].w);
            *reinterpret_cast<uint2 *>(&kh[i][d]) = kp2;
            *reinterpret_cast<uint2 *>(&qh[i][d]) = qp2;
            if (store) {
                *reinterpret_cast<uint2 *>(a.w.kh + kq_off + (size_t)i * kDK + d) = kp2;
                *reinterpret_cast<uint2 *>(a.w.qh + kq_off + (size_t)i * kDK + d) = qp2;
            }
        }
    }
}

constexpr int kGateSlots = 4;  // value heads per key head whose gates are read up front

struct PrepSmem {
    __half kh[kC][kLdH];
    __half qh[kC][kLdH];
    float kk[kC][kLdF];  // K K^T (lower part)
    float qk[kC][kLdF];  // Q K^T (lower part, diagonal included)
    float as[kC][kLdF];  // A, strictly lower
    float ts[kC][kLdF];  // Tm, lower
    float xs[32][kLdX];  // merge scratch
    float gam[kGateSlots][kC];   // gates of value head jk + u Hk in slot u % kGateSlots
    float beta[kGateSlots][kC];
    unsigned max_t, max_rs;
};

constexpr int kPrepThreads = 128;

template <bool VEC>
__global__ void __launch_bounds__(kPrepThreads)
    gdn_chunk_prep_kernel(const __grid_constant__ PrepArgs a) {
    pdl_launch_dependents();  // the state kernel may start its prologue (it waits for this grid)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    PrepSmem &s = *reinterpret_cast<PrepSmem *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;
    const int c = blockIdx.x, jk = blockIdx.y;

    // Gates of value head j into slot u (one warp), to the workspace too.
    const auto gates = [&](int j, int u) { prep_gates(a, c, j, s.gam[u], s.beta[u]); };
    // The first kGateSlots value heads' gates, one warp each, before the K/Q traffic (the
    // loop over value heads below then starts without a dependent global load).
    static_assert(kPrepThreads / 32 == kGateSlots, "one warp per gate slot");
    if (jk + warp * a.n_k_heads < a.n_v_heads) gates(jk + warp * a.n_k_heads, warp);

    // K and Q rows to fp16, into shared memory and the workspace.
    prep_load_kq<VEC, kPrepThreads>(a, c, jk, tid, s.kh, s.qh, true);
    // Tm's blocks above the diagonal are never written and must read as zero in the merges.
    for (int e = tid; e < kC * kLdF; e += kPrepThreads) s.ts[e / kLdF][e % kLdF] = 0.0f;
    __syncthreads();

    // K K^T (strip = warp) and Q K^T (strip = 3 - warp: the two triangles balance per warp).
    {
        const int sk = warp, sq = 3 - warp;
        float ak[8][4], aq[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) ak[nt][e] = aq[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kDK / 16; ++ks) {
            uint32_t fk[4], fq[4];
            ldsm_x4(fk, &s.kh[16 * sk + lrow_a(lane)][16 * ks + lcol_a(lane)]);
            ldsm_x4(fq, &s.qh[16 * sq + lrow_a(lane)][16 * ks + lcol_a(lane)]);
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                if (np > sk && np > sq) continue;
                uint32_t bf[4];
                ldsm_x4(bf, &s.kh[16 * np + lrow_b(lane)][16 * ks + lcol_b(lane)]);
                if (np <= sk) {
                    mma_f16(ak[2 * np], fk, bf[0], bf[1]);
                    mma_f16(ak[2 * np + 1], fk, bf[2], bf[3]);
                }
                if (np <= sq) {
                    mma_f16(aq[2 * np], fq, bf[0], bf[1]);
                    mma_f16(aq[2 * np + 1], fq, bf[2], bf[3]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * nt + 2 * tig + (e & 1), rr = g8 + 8 * (e >> 1);
                if (nt <= 2 * sk + 1) s.kk[16 * sk + rr][col] = ak[nt][e];
                if (nt <= 2 * sq + 1) s.qk[16 * sq + rr][col] = aq[nt][e];
            }
    }

    for (int j = jk, hh = 0; j < a.n_v_heads; j += a.n_k_heads, ++hh) {
        const size_t hc = (size_t)j * a.nc + c;  // (value head, chunk) index of the workspace
        const int slot = hh % kGateSlots;
        const float *gam = s.gam[slot], *bet = s.beta[slot];
        __syncthreads();                          // the previous head's reads of s.* are done
        if (hh >= kGateSlots && warp == 0) gates(j, slot);
        if (tid == 0) s.max_t = s.max_rs = 0u;
        __syncthreads();
        // A (strictly lower) and P (lower incl. diagonal, straight to the workspace as fp16).
        for (int e = tid; e < kC * kC / 2; e += kPrepThreads) {
            const int i = e / (kC / 2), jj = (e % (kC / 2)) * 2;
            const float gi = gam[i], bi = bet[i];
            float av[2], pv[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int col = jj + u;
                const float d = col <= i ? __expf(gi - gam[col]) : 0.0f;  // exponent <= 0
                av[u] = col < i ? bi * s.kk[i][col] * d : 0.0f;
                pv[u] = col <= i ? s.qk[i][col] * d : 0.0f;
            }
            s.as[i][jj] = av[0];
            s.as[i][jj + 1] = av[1];
            *reinterpret_cast<uint32_t *>(a.w.p + hc * kC * kC + (size_t)i * kC + jj) =
                pack_half2(pv[0], pv[1]);
        }
        __syncthreads();
        {   // diagonal 16x16 blocks of (I + A)^-1: warp w owns block w, lane l < 16 column l
            const int b0 = 16 * warp, col = lane & 15;
            float x[16];
            float m = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                float acc0 = 0.0f, acc1 = 0.0f;  // two chains: half the dependent latency
#pragma unroll
                for (int mm = 0; mm < i; ++mm) {
                    if (mm & 1) acc1 = fmaf(s.as[b0 + i][b0 + mm], x[mm], acc1);
                    else acc0 = fmaf(s.as[b0 + i][b0 + mm], x[mm], acc0);
                }
                x[i] = i == col ? 1.0f : (i < col ? 0.0f : -(acc0 + acc1));
                m = fmaxf(m, fabsf(x[i]));
            }
            if (lane < 16) {
#pragma unroll
                for (int i = 0; i < 16; ++i) s.ts[b0 + i][b0 + col] = x[i];
            }
            publish_max(&s.max_t, m);
        }
        __syncthreads();
        // merge 16 -> 32: blocks (1,0) and (3,2): X = A_rc Tm_cc, then Tm_rc = -Tm_rr X.
        if (warp < 2) {
            const int rb = 16 * (2 * warp + 1), cb = 16 * (2 * warp);
            float acc[2][4] = {};
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const int k0 = 8 * ks;
                const uint32_t a0 = to_tf32(s.as[rb + g8][cb + k0 + tig]);
                const uint32_t a1 = to_tf32(s.as[rb + g8 + 8][cb + k0 + tig]);
                const uint32_t a2 = to_tf32(s.as[rb + g8][cb + k0 + tig + 4]);
                const uint32_t a3 = to_tf32(s.as[rb + g8 + 8][cb + k0 + tig + 4]);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                    mma_tf32(acc[nt], a0, a1, a2, a3, to_tf32(s.ts[cb + k0 + tig][cb + 8 * nt + g8]),
                             to_tf32(s.ts[cb + k0 + tig + 4][cb + 8 * nt + g8]));
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s.xs[16 * warp + g8 + 8 * (e >> 1)][8 * nt + 2 * tig + (e & 1)] = acc[nt][e];
        }
        __syncthreads();
        if (warp < 2) {
            const int rb = 16 * (2 * warp + 1), cb = 16 * (2 * warp);
            float acc[2][4] = {};
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const int k0 = 8 * ks;
                const uint32_t a0 = to_tf32(s.ts[rb + g8][rb + k0 + tig]);
                const uint32_t a1 = to_tf32(s.ts[rb + g8 + 8][rb + k0 + tig]);
                const uint32_t a2 = to_tf32(s.ts[rb + g8][rb + k0 + tig + 4]);
                const uint32_t a3 = to_tf32(s.ts[rb + g8 + 8][rb + k0 + tig + 4]);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                    mma_tf32(acc[nt], a0, a1, a2, a3,
                             to_tf32(s.xs[16 * warp + k0 + tig][8 * nt + g8]),
                             to_tf32(s.xs[16 * warp + k0 + tig + 4][8 * nt + g8]));
            }
            float m = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s.ts[rb + g8 + 8 * (e >> 1)][cb + 8 * nt + 2 * tig + (e & 1)] = -acc[nt][e];
                    m = fmaxf(m, fabsf(acc[nt][e]));
                }
            publish_max(&s.max_t, m);
        }
        __syncthreads();
        // merge 32 -> 64: X = A[32:64][0:32] Tm[0:32][0:32]; Tm[32:64][0:32] = -Tm[32:64][32:64] X.
        // Eight 16x8 output tiles, two per warp.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int tile = 2 * warp + u, mt = tile >> 2, nt = tile & 3;
            float acc[4] = {};
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const int k0 = 8 * ks;
                mma_tf32(acc, to_tf32(s.as[32 + 16 * mt + g8][k0 + tig]),
                         to_tf32(s.as[32 + 16 * mt + g8 + 8][k0 + tig]),
                         to_tf32(s.as[32 + 16 * mt + g8][k0 + tig + 4]),
                         to_tf32(s.as[32 + 16 * mt + g8 + 8][k0 + tig + 4]),
                         to_tf32(s.ts[k0 + tig][8 * nt + g8]), to_tf32(s.ts[k0 + tig + 4][8 * nt + g8]));
            }
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s.xs[16 * mt + g8 + 8 * (e >> 1)][8 * nt + 2 * tig + (e & 1)] = acc[e];
        }
        __syncthreads();
        {
            float m = 0.0f;
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int tile = 2 * warp + u, mt = tile >> 2, nt = tile & 3;
                float acc[4] = {};
#pragma unroll
                for (int ks = 0; ks < 4; ++ks) {
                    const int k0 = 8 * ks;
                    mma_tf32(acc, to_tf32(s.ts[32 + 16 * mt + g8][32 + k0 + tig]),
                             to_tf32(s.ts[32 + 16 * mt + g8 + 8][32 + k0 + tig]),
                             to_tf32(s.ts[32 + 16 * mt + g8][32 + k0 + tig + 4]),
                             to_tf32(s.ts[32 + 16 * mt + g8 + 8][32 + k0 + tig + 4]),
                             to_tf32(s.xs[k0 + tig][8 * nt + g8]), to_tf32(s.xs[k0 + tig + 4][8 * nt + g8]));
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s.ts[32 + 16 * mt + g8 + 8 * (e >> 1)][8 * nt + 2 * tig + (e & 1)] = -acc[e];
                    m = fmaxf(m, fabsf(acc[e]));
                }
            }
            publish_max(&s.max_t, m);
        }
        __syncthreads();
        {   // Tm (scaled fp16) to the workspace; max row sum of |Tm| bounds V' = Tm R.
            const float st = pow2_scale(s.max_t);
            float worst = 0.0f;
            for (int i = 16 * warp; i < 16 * warp + 16; ++i) {
                const float2 t2 = *reinterpret_cast<const float2 *>(&s.ts[i][2 * lane]);
                *reinterpret_cast<uint32_t *>(a.w.tm + hc * kC * kC + (size_t)i * kC + 2 * lane) =
                    pack_half2(t2.x * st, t2.y * st);
                float rs = fabsf(t2.x) + fabsf(t2.y);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, o);
                worst = fmaxf(worst, rs);
            }
            if (lane == 0) atomicMax(&s.max_rs, __float_as_uint(worst));
            __syncthreads();
            if (tid == 0)
                *reinterpret_cast<float4 *>(a.w.meta + hc * 4) =
                    make_float4(st, __uint_as_float(s.max_rs), 0.0f, 0.0f);
        }
    }
}

// --------------------------------------------------------------------------- prep kernel, v2
// The same outputs as gdn_chunk_prep_kernel, bit for bit (every fp32 value comes from the same
// operations on the same operands in the same order: the same mma sequences and fragments, the
// same forward substitution, the same row-sum tree), rearranged for throughput. The v1 kernel
// (ncu, H200, qwen35-4b, 8192 rows: 157-194 us, 1.4 TB/s, IPC 1.5) ran 2 CTAs of 4 warps per SM
// (111 KB of shared memory) through ~19 barriers per CTA: 2 warps per scheduler stalled on
// barriers and load latency. Here:
//  - K K^T and Q K^T stay in the mma accumulators of the warp that owns the row strip (warp w:
//    rows 16w..16w+15 of both) and A, P are built from there: no kk, qk tiles in shared memory,
//    no stores and loads of them.
//  - One fp32 64x64 tile per value head holds both matrices of the inverse: Tm in its lower
//    triangle (diagonal included), A transposed in its strict upper triangle (A_ij, i > j, at
//    [j][i]); every read of Tm masks the upper triangle to the zeros that v1's tile held there.
//    The tiles and the merge scratch overlay the fp16 K, Q tiles (dead once the products are in
//    registers): ~43 KB per CTA (v1: 111 KB), so registers, not shared memory, bound occupancy.
//  - The NH value heads of a round (2 when Hv / Hk is even, else 1; one round per CTA, grid
//    rounds x chunks x key heads) go through each step together: two independent dependency
//    chains per warp in the forward substitution and the merges, one set of barriers for both.
//  - Barriers: the 16 -> 32 merge needs only the warp pair that owns the two diagonal blocks
//    (a 64-thread named barrier); each merge output is split by 8-column tiles so that a warp
//    computes X = A Tm and then -Tm X for its own columns with no barrier between the two.
//    Per CTA: 5 CTA barriers + 1 pair barrier for NH heads (v1: 1 + 9 per value head, 19 for
//    the 2 heads of a qwen35-4b key head).
// With Hv / Hk odd and > 1 the CTAs of one key head recompute K K^T (64x64x128 on tensor cores)
// and re-read q, k (from L2: the rounds of a chunk are adjacent in launch order); only round 0
// writes the fp16 K, Q to the workspace.
constexpr int kPrepV2Threads = 128;
constexpr int kPrepV2Warps = kPrepV2Threads / 32;

template <int NH>
struct PrepV2Smem {
    union {
        struct {  // phase 1: K, Q in fp16, the operands of K K^T and Q K^T
            __half kh[kC][kLdH];
            __half qh[kC][kLdH];
        } in;
        struct {  // phase 2: per head, Tm (lower) + A^T (strict upper); X of the merges per warp
            float t[NH][kC][kLdF];
            float xs[kPrepV2Warps][NH][32][8];  // row stride 8: B-fragment reads (row tig, col g8) hit 32 banks
        } inv;
    } u;
    float gam[NH][kC];
    float beta[NH][kC];
    unsigned max_t[NH], max_rs[NH];  // max |Tm| and max row sum of |Tm| (bit patterns, >= 0)
};

// Tm[i][j] from a head's tile: its lower triangle, zero above the diagonal (where A^T lives).
// Upper elements are not loaded at all: another warp may be writing A^T there.
__device__ __forceinline__ float tm_at(const float (&t)[kC][kLdF], int i, int j) {
    return j <= i ? t[i][j] : 0.0f;
}
// A[i][j], i > j, from its transposed place.
__device__ __forceinline__ float a_at(const float (&t)[kC][kLdF], int i, int j) { return t[j][i]; }

// bar.sync on a named barrier shared by `count` threads (a multiple of 32); orders shared memory
// among them like __syncthreads does for the CTA.
__device__ __forceinline__ void named_barrier(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

template <bool VEC, int NH>
__global__ void __launch_bounds__(kPrepV2Threads, 5)
    gdn_chunk_prep_v2_kernel(const __grid_constant__ PrepArgs a) {
    static_assert(NH >= 1 && NH <= kPrepV2Warps, "one warp per head's gates");
    pdl_launch_dependents();  // the state kernel may start its prologue (it waits for this grid)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    PrepV2Smem<NH> &s = *reinterpret_cast<PrepV2Smem<NH> *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;
    const int round = blockIdx.x, c = blockIdx.y, jk = blockIdx.z;
    // Head h of this CTA: value head jk + (NH round + h) Hk; hc(h) its (head, chunk) index.
    const auto head_hc = [&](int h) {
        return (size_t)(jk + (NH * round + h) * a.n_k_heads) * a.nc + c;
    };

    // Gates first (one warp per head), then the K/Q traffic.
    if (warp < NH) prep_gates(a, c, jk + (NH * round + warp) * a.n_k_heads, s.gam[warp], s.beta[warp]);
    if (tid < NH) s.max_t[tid] = s.max_rs[tid] = 0u;

    // K and Q rows to fp16; only round 0 writes them to the workspace.
    prep_load_kq<VEC, kPrepV2Threads>(a, c, jk, tid, s.u.in.kh, s.u.in.qh, round == 0);
    __syncthreads();  // K, Q tiles and the gates complete

    // K K^T and Q K^T, row strip w of both (v1's mma sequence per tile: the same fragments, k
    // steps 0..7 in order, so the same accumulators). Only n-tiles nt <= 2w + 1 (the lower
    // triangle) are computed; A and P need nothing else.
    float ak[8][4], aq[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ak[nt][e] = aq[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDK / 16; ++ks) {
        uint32_t fk[4], fq[4];
        ldsm_x4(fk, &s.u.in.kh[16 * warp + lrow_a(lane)][16 * ks + lcol_a(lane)]);
        ldsm_x4(fq, &s.u.in.qh[16 * warp + lrow_a(lane)][16 * ks + lcol_a(lane)]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            if (np > warp) continue;
            uint32_t bf[4];
            ldsm_x4(bf, &s.u.in.kh[16 * np + lrow_b(lane)][16 * ks + lcol_b(lane)]);
            mma_f16(ak[2 * np], fk, bf[0], bf[1]);
            mma_f16(ak[2 * np + 1], fk, bf[2], bf[3]);
            mma_f16(aq[2 * np], fq, bf[0], bf[1]);
            mma_f16(aq[2 * np + 1], fq, bf[2], bf[3]);
        }
    }
    __syncthreads();  // every warp is done with kh, qh: the inverse tiles overlay them

    // A (transposed, strict upper triangle of the head's tile) and P (straight to the workspace
    // as fp16, zeros above the diagonal) for row strip w, from the accumulators: v1's
    // expressions (d shared by A and P; bi * kk * d multiplied left to right). The heads are the
    // innermost loop so that each accumulator dies after its last use (register pressure).
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = 16 * warp + g8 + 8 * hr;
        float gi[NH], bi[NH];
#pragma unroll
        for (int h = 0; h < NH; ++h) gi[h] = s.gam[h][i], bi[h] = s.beta[h][i];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                float pv[2] = {0.0f, 0.0f};
                if (nt <= 2 * warp + 1) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = 8 * nt + 2 * tig + e;
                        const float d = col <= i ? __expf(gi[h] - s.gam[h][col]) : 0.0f;  // exponent <= 0
                        if (col < i) s.u.inv.t[h][col][i] = bi[h] * ak[nt][2 * hr + e] * d;  // A_i,col at [col][i]
                        pv[e] = col <= i ? aq[nt][2 * hr + e] * d : 0.0f;
                    }
                }
                *reinterpret_cast<uint32_t *>(a.w.p + (head_hc(h) * kC + i) * kC + 8 * nt + 2 * tig) =
                    pack_half2(pv[0], pv[1]);
            }
        }
    }
    __syncwarp();  // the warp's diagonal block of A is complete (it wrote all of it)

    // Diagonal 16x16 blocks of (I + A)^-1: warp w owns block w, lane l < 16 column l (lanes
    // 16..31 repeat 0..15); v1's two FMA chains, the NH heads interleaved.
    {
        const int b0 = 16 * warp, col = lane & 15;
        float x[NH][16];
        float m[NH];
#pragma unroll
        for (int h = 0; h < NH; ++h) m[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                const float(&t)[kC][kLdF] = s.u.inv.t[h];
                float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
                for (int mm = 0; mm < i; ++mm) {
                    if (mm & 1) acc1 = fmaf(a_at(t, b0 + i, b0 + mm), x[h][mm], acc1);
                    else acc0 = fmaf(a_at(t, b0 + i, b0 + mm), x[h][mm], acc0);
                }
                x[h][i] = i == col ? 1.0f : (i < col ? 0.0f : -(acc0 + acc1));
                m[h] = fmaxf(m[h], fabsf(x[h][i]));
            }
        }
        __syncwarp();  // all lanes' reads of A's diagonal block precede the overwrite below
#pragma unroll
        for (int h = 0; h < NH; ++h) {
            if (lane < 16) {
#pragma unroll
                for (int i = 0; i < 16; ++i) s.u.inv.t[h][b0 + i][b0 + col] = x[h][i];
            }
            publish_max(&s.max_t[h], m[h]);
        }
    }
    // The 16 -> 32 merges need the two diagonal blocks of a pair of warps (and A's block below
    // them, written by the pair's second warp): a barrier of that pair only.
    if (warp < 2) named_barrier(1, 64);  // ids as constants: ptxas then reserves 3 barriers, not 16
    else named_barrier(2, 64);

    // Merge 16 -> 32, blocks (1,0) (warps 0, 1) and (3,2) (warps 2, 3), 8 columns per warp:
    // X = A_rc Tm_cc[:, cols], then Tm_rc[:, cols] = -Tm_rr X (v1's two halves per n-tile).
    {
        const int pr = warp >> 1, nt = warp & 1;
        const int rb = 16 * (2 * pr + 1), cb = 32 * pr;
        float acc[NH][4];
#pragma unroll
        for (int h = 0; h < NH; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            const int k0 = 8 * ks;
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                const float(&t)[kC][kLdF] = s.u.inv.t[h];
                mma_tf32(acc[h], to_tf32(a_at(t, rb + g8, cb + k0 + tig)),
                         to_tf32(a_at(t, rb + g8 + 8, cb + k0 + tig)),
                         to_tf32(a_at(t, rb + g8, cb + k0 + tig + 4)),
                         to_tf32(a_at(t, rb + g8 + 8, cb + k0 + tig + 4)),
                         to_tf32(tm_at(t, cb + k0 + tig, cb + 8 * nt + g8)),
                         to_tf32(tm_at(t, cb + k0 + tig + 4, cb + 8 * nt + g8)));
            }
        }
#pragma unroll
        for (int h = 0; h < NH; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s.u.inv.xs[warp][h][g8 + 8 * (e >> 1)][2 * tig + (e & 1)] = acc[h][e];
        __syncwarp();
        float acc2[NH][4];
#pragma unroll
        for (int h = 0; h < NH; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc2[h][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            const int k0 = 8 * ks;
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                const float(&t)[kC][kLdF] = s.u.inv.t[h];
                const float(&x)[32][8] = s.u.inv.xs[warp][h];
                mma_tf32(acc2[h], to_tf32(tm_at(t, rb + g8, rb + k0 + tig)),
                         to_tf32(tm_at(t, rb + g8 + 8, rb + k0 + tig)),
                         to_tf32(tm_at(t, rb + g8, rb + k0 + tig + 4)),
                         to_tf32(tm_at(t, rb + g8 + 8, rb + k0 + tig + 4)),
                         to_tf32(x[k0 + tig][g8]), to_tf32(x[k0 + tig + 4][g8]));
            }
        }
#pragma unroll
        for (int h = 0; h < NH; ++h) {
            float m = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s.u.inv.t[h][rb + g8 + 8 * (e >> 1)][cb + 8 * nt + 2 * tig + (e & 1)] = -acc2[h][e];
                m = fmaxf(m, fabsf(acc2[h][e]));
            }
            publish_max(&s.max_t[h], m);
        }
    }
    __syncthreads();  // Tm[0:32][0:32], Tm[32:64][32:64] and A's lower-left quadrant complete

    // Merge 32 -> 64: X = A[32:64][0:32] Tm[0:32][0:32], Tm[32:64][0:32] = -Tm[32:64][32:64] X.
    // Warp w owns the 8 output columns 8w..8w+7 (both 16-row tiles): its X columns are all
    // the second product needs, so the two halves are separated by __syncwarp only.
    {
        const int nt = warp;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            float acc[NH][4];
#pragma unroll
            for (int h = 0; h < NH; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const int k0 = 8 * ks;
#pragma unroll
                for (int h = 0; h < NH; ++h) {
                    const float(&t)[kC][kLdF] = s.u.inv.t[h];
                    mma_tf32(acc[h], to_tf32(a_at(t, 32 + 16 * mt + g8, k0 + tig)),
                             to_tf32(a_at(t, 32 + 16 * mt + g8 + 8, k0 + tig)),
                             to_tf32(a_at(t, 32 + 16 * mt + g8, k0 + tig + 4)),
                             to_tf32(a_at(t, 32 + 16 * mt + g8 + 8, k0 + tig + 4)),
                             to_tf32(tm_at(t, k0 + tig, 8 * nt + g8)),
                             to_tf32(tm_at(t, k0 + tig + 4, 8 * nt + g8)));
                }
            }
#pragma unroll
            for (int h = 0; h < NH; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s.u.inv.xs[warp][h][16 * mt + g8 + 8 * (e >> 1)][2 * tig + (e & 1)] = acc[h][e];
        }
        __syncwarp();
        float m[NH];
#pragma unroll
        for (int h = 0; h < NH; ++h) m[h] = 0.0f;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            float acc[NH][4];
#pragma unroll
            for (int h = 0; h < NH; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const int k0 = 8 * ks;
#pragma unroll
                for (int h = 0; h < NH; ++h) {
                    const float(&t)[kC][kLdF] = s.u.inv.t[h];
                    const float(&x)[32][8] = s.u.inv.xs[warp][h];
                    mma_tf32(acc[h], to_tf32(tm_at(t, 32 + 16 * mt + g8, 32 + k0 + tig)),
                             to_tf32(tm_at(t, 32 + 16 * mt + g8 + 8, 32 + k0 + tig)),
                             to_tf32(tm_at(t, 32 + 16 * mt + g8, 32 + k0 + tig + 4)),
                             to_tf32(tm_at(t, 32 + 16 * mt + g8 + 8, 32 + k0 + tig + 4)),
                             to_tf32(x[k0 + tig][g8]), to_tf32(x[k0 + tig + 4][g8]));
                }
            }
#pragma unroll
            for (int h = 0; h < NH; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s.u.inv.t[h][32 + 16 * mt + g8 + 8 * (e >> 1)][8 * nt + 2 * tig + (e & 1)] = -acc[h][e];
                    m[h] = fmaxf(m[h], fabsf(acc[h][e]));
                }
        }
#pragma unroll
        for (int h = 0; h < NH; ++h) publish_max(&s.max_t[h], m[h]);
    }
    __syncthreads();  // Tm complete, max |Tm| final

    // Tm (scaled fp16) to the workspace, warp w rows 16w..16w+15, zeros above the diagonal; max
    // row sum of |Tm| (v1's pairs and butterfly, so the same fp32 sums).
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        const float(&t)[kC][kLdF] = s.u.inv.t[h];
        const float st = pow2_scale(s.max_t[h]);
        __half *tm = a.w.tm + head_hc(h) * kC * kC;
        float worst = 0.0f;
#pragma unroll 4
        for (int i = 16 * warp; i < 16 * warp + 16; ++i) {
            const float x0 = tm_at(t, i, 2 * lane), x1 = tm_at(t, i, 2 * lane + 1);
            *reinterpret_cast<uint32_t *>(tm + (size_t)i * kC + 2 * lane) = pack_half2(x0 * st, x1 * st);
            float rs = fabsf(x0) + fabsf(x1);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, o);
            worst = fmaxf(worst, rs);
        }
        if (lane == 0) atomicMax(&s.max_rs[h], __float_as_uint(worst));
    }
    __syncthreads();
    if (tid < NH)
        *reinterpret_cast<float4 *>(a.w.meta + head_hc(tid) * 4) =
            make_float4(pow2_scale(s.max_t[tid]), __uint_as_float(s.max_rs[tid]), 0.0f, 0.0f);
    // Chained sub-passes (gdn_chunk_scan_rows): this grid may run beside the state kernel of the
    // sub-pass before it (launched as its programmatic dependent); one CTA waits for that grid
    // before exiting, so that this grid's completion, which the next state kernel waits for,
    // implies it. Launched in plain stream order there is nothing to wait for.
    if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) pdl_wait();
}

// ----------------------------------------------------------------------------- state kernel

struct StateArgs {
    const float *v;
    int64_t ldv;
    float *state;
    float *o;
    int64_t ldo;
    int64_t rows;  // rows of this pass
    int32_t n_k_heads, n_v_heads, nc;
    Workspace w;
    int32_t chain;  // chained sub-passes: the state is read only after the prep grid completed
};

// One chunk's operands into a state kernel's stage buffer `d`: K, Q (fp16 rows of key head jk),
// Tm, P (fp16, value head j), BV columns of V from vg (fp32; rows past the pass read as zeros),
// the gates and meta. Issued by NT threads (t: this thread's index among them) as 16-byte
// cp.async, or 4-byte ones for V when its rows are not 16-byte aligned (VEC false); the caller
// commits the group.
template <int BV, bool VEC, int NT, class Stage>
__device__ __forceinline__ void stage_chunk(Stage &d, const StateArgs &a, const float *vg, int j,
                                            int jk, int c, int t) {
    // Unrolled for a single issuing warp (its loops run 32, 16 and 16 times); with a whole CTA
    // issuing they run once or twice and stay rolled.
    constexpr int kU8 = NT <= 32 ? 8 : 1, kU4 = NT <= 32 ? 4 : 1;
    const size_t kq = ((size_t)jk * a.nc + c) * kC * kDK;
    const size_t hc = (size_t)j * a.nc + c;
#pragma unroll kU8
    for (int e = t; e < kC * kDK / 8; e += NT) {  // 16 B = 8 halves
        const int i = e / (kDK / 8), d8 = (e % (kDK / 8)) * 8;
        cp_async16(&d.kh[i][d8], a.w.kh + kq + (size_t)i * kDK + d8, true);
        cp_async16(&d.qh[i][d8], a.w.qh + kq + (size_t)i * kDK + d8, true);
    }
#pragma unroll kU8
    for (int e = t; e < kC * kC / 8; e += NT) {
        const int i = e / (kC / 8), d8 = (e % (kC / 8)) * 8;
        cp_async16(&d.tm[i][d8], a.w.tm + hc * kC * kC + (size_t)i * kC + d8, true);
        cp_async16(&d.ph[i][d8], a.w.p + hc * kC * kC + (size_t)i * kC + d8, true);
    }
    const int64_t t0 = (int64_t)c * kC;
    if (VEC) {
#pragma unroll kU4
        for (int e = t; e < kC * BV / 4; e += NT) {
            const int i = e / (BV / 4), d4 = (e % (BV / 4)) * 4;
            const bool ok = t0 + i < a.rows;
            cp_async16(&d.vst[i][d4], vg + (ok ? t0 + i : 0) * a.ldv + d4, ok);
        }
    } else {
#pragma unroll kU4
        for (int e = t; e < kC * BV; e += NT) {
            const int i = e / BV, d1 = e % BV;
            const bool ok = t0 + i < a.rows;
            cp_async4(&d.vst[i][d1], vg + (ok ? t0 + i : 0) * a.ldv + d1, ok);
        }
    }
    for (int e = t; e < 2 * kC / 4 + 1; e += NT) {
        if (e < kC / 4) cp_async16(&d.gam[4 * e], a.w.gam + hc * kC + 4 * e, true);
        else if (e < kC / 2) cp_async16(&d.beta[4 * (e - kC / 4)], a.w.bet + hc * kC + 4 * (e - kC / 4), true);
        else cp_async16(&d.meta[0], a.w.meta + hc * 4, true);
    }
}

template <int BV>
struct StateSmem {
    static constexpr int kLdV = BV + 8;   // fp16 [.][BV] tiles: 16 B row shift mod 128 B
    static constexpr int kLdVf = BV + 4;  // fp32 V staging (16 B-aligned rows for cp.async)
    struct Stage {
        __half kh[kC][kLdH];
        __half qh[kC][kLdH];
        __half tm[kC][kLdP];
        __half ph[kC][kLdP];
        float vst[kC][kLdVf];
        float gam[kC];
        float beta[kC];
        float meta[4];
    };
    Stage st[2];
    __half sh[kDK][kLdV];   // S * sigma_S
    __half rh[kC][kLdV];    // R * sigma_R
    __half vph[kC][kLdV];   // V' * sigma_V
    __half vdh[kC][kLdV];   // e^(gamma_last - gamma) V' * sigma_V
    unsigned max_s[2], max_v[2];  // max |x| bit patterns (non-negative floats order as uints)
};

// 16 warps (4 per scheduler): the chunk's chain is short and latency-bound, so the work of each
// step is split finer than the 8 warps of the first build (ncu, 8 warps: 2 warps per scheduler
// issuing once every 6.9 cycles, stalled on mma/ldmatrix results and barriers; NOTES.md):
//  [K; Q] S and the state update: 8 row strips x 2 column halves (HW columns);
//  Tm R:                           4 row strips x 4 column quarters (QW columns);
//  P V' (outputs):                 the Q-side warps of [K; Q] S, on the rows and columns whose
//                                  e^gamma Q S they hold.
constexpr int kStateWarps = 16;
constexpr int kStateThreads = 32 * kStateWarps;

// Two 8x8 b16 matrices, transposed (the B fragment of one n-tile from a [k][n] array): lanes
// 0..15 give the addresses of rows k0 .. k0 + 15 at column n0.
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

template <int BV, bool VEC, bool VEC_O>
__global__ void __launch_bounds__(kStateThreads, 1)
    gdn_chunk_state_kernel(const __grid_constant__ StateArgs a) {
    constexpr int HW = BV / 2;   // columns per warp: [K; Q] S, outputs, state
    constexpr int NTH = HW / 8;  // their n-tiles (2 or 4)
    constexpr int QW = BV / 4;   // columns per warp: Tm R
    constexpr int NTQ = QW / 8;  // (1 or 2)
    static_assert(NTH % 2 == 0 && (NTQ == 1 || NTQ == 2), "BV: 32 or 64");
    using Smem = StateSmem<BV>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &s = *reinterpret_cast<Smem *>(smem_raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;
    const int s8 = warp & 7;          // 16-row strip of [K; Q] (P1) and of the state (P3)
    const int side = s8 >> 2;         // P1: 0 = K rows, 1 = Q rows
    const int r1 = 16 * (s8 & 3);     // P1/P3: the strip's first chunk row
    const int ch = (warp >> 3) * HW;  // P1/P3: first column of the warp's half
    const int r2 = 16 * (warp & 3);   // P2: first chunk row of the strip
    const int cq = (warp >> 2) * QW;  // P2: first column of the warp's quarter
    const int slices = kDK / BV;
    const int j = blockIdx.x / slices;
    const int col0 = (blockIdx.x % slices) * BV;
    const int jk = j % a.n_k_heads;  // tiled pairing (qwen35 GGUF, spec.md G6)
    const float *vg = a.v + (int64_t)j * kDK + col0;
    float *og = a.o + (int64_t)j * kDK + col0;
    float *state = a.state + (int64_t)j * kDK * kDK + col0;

    const auto stage = [&](int c, int b) {
        stage_chunk<BV, VEC, kStateThreads>(s.st[b], a, vg, j, jk, c, tid);
        cp_async_commit();
    };

    stage(0, 0);
    float S[NTH][4];  // the state slice: rows [16 s8, +16) x columns [ch, ch + HW)
#pragma unroll
    for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // scalar accesses: the state may sit at any float offset
            const float *x = state + (int64_t)(16 * s8 + g8 + 8 * h) * kDK + ch + 8 * nt + 2 * tig;
            S[nt][2 * h] = x[0];
            S[nt][2 * h + 1] = x[1];
        }
    if (tid == 0) s.max_s[0] = s.max_s[1] = s.max_v[0] = s.max_v[1] = 0u;
    __syncthreads();
    {
        float m = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) m = fmaxf(m, fabsf(S[nt][e]));
        publish_max(&s.max_s[0], m);
    }

    for (int c = 0; c < a.nc; ++c) {
        const int b = c & 1;
        const typename Smem::Stage &d = s.st[b];
        // ---- P0: chunk c's operands land (and the max |S| of the state entering it).
        cp_async_wait_all();
        __syncthreads();
        if (c + 1 < a.nc) stage(c + 1, b ^ 1);  // buffer b^1 was last read in chunk c-1
        if (tid == 0) s.max_s[b ^ 1] = s.max_v[b ^ 1] = 0u;
        const float max_s = __uint_as_float(s.max_s[b]);
        const float sig_s = pow2_scale(s.max_s[b]);
#pragma unroll
        for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint32_t *>(&s.sh[16 * s8 + g8 + 8 * h][ch + 8 * nt + 2 * tig]) =
                    pack_half2(S[nt][2 * h] * sig_s, S[nt][2 * h + 1] * sig_s);
        {
            float m = 0.0f;
            for (int e = tid; e < kC * BV; e += kStateThreads) m = fmaxf(m, fabsf(d.vst[e / BV][e % BV]));
            publish_max(&s.max_v[b], m);
        }
        __syncthreads();

        // ---- P1: [K; Q] S. K side: R = beta (V - e^gamma K S) as scaled fp16; Q side keeps
        // e^gamma Q S in registers for the output.
        const float r_bound = __uint_as_float(s.max_v[b]) + kSqrtDk * max_s;  // >= max |R|
        const float sig_r = pow2_scale_f(r_bound);
        float os[NTH][4];
        {
            const __half(*xh)[kLdH] = side == 0 ? d.kh : d.qh;
            float acc[NTH][4];
#pragma unroll
            for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < kDK / 16; ++ks) {
                uint32_t af[4];
                ldsm_x4(af, &xh[r1 + lrow_a(lane)][16 * ks + lcol_a(lane)]);
#pragma unroll
                for (int np = 0; np < NTH / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.sh[16 * ks + lrow_a(lane)][ch + 16 * np + lcol_a(lane)]);
                    mma_f16(acc[2 * np], af, bf[0], bf[1]);
                    mma_f16(acc[2 * np + 1], af, bf[2], bf[3]);
                }
            }
            const float inv_s = 1.0f / sig_s;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = r1 + g8 + 8 * h;
                const float ei = __expf(d.gam[i]) * inv_s, bi = d.beta[i];
#pragma unroll
                for (int nt = 0; nt < NTH; ++nt) {
                    const int col = ch + 8 * nt + 2 * tig;
                    if (side == 0) {
                        const float2 v2 = *reinterpret_cast<const float2 *>(&d.vst[i][col]);
                        const float ra = bi * (v2.x - ei * acc[nt][2 * h]);
                        const float rb = bi * (v2.y - ei * acc[nt][2 * h + 1]);
                        *reinterpret_cast<uint32_t *>(&s.rh[i][col]) = pack_half2(ra * sig_r, rb * sig_r);
                    } else {
                        os[nt][2 * h] = ei * acc[nt][2 * h];
                        os[nt][2 * h + 1] = ei * acc[nt][2 * h + 1];
                    }
                }
            }
        }
        __syncthreads();

        // ---- P2: V' = Tm R (warp: a row strip, a quarter of the columns); V' and e^(..)V' as fp16.
        const float sig_t = d.meta[0];
        const float v_bound = d.meta[1] * r_bound;  // max_i sum_j |Tm_ij| * max |R| >= max |V'|
        const float sig_v = pow2_scale_f(v_bound);
        {
            float acc[NTQ][4];
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
            const int strip = r2 / 16;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                if (ks > strip) continue;  // Tm is lower triangular
                uint32_t af[4];
                ldsm_x4(af, &d.tm[r2 + lrow_a(lane)][16 * ks + lcol_a(lane)]);
                if (NTQ == 1) {
                    uint32_t bf[2];
                    ldsm_x2_t(bf, &s.rh[16 * ks + (lane & 15)][cq]);
                    mma_f16(acc[0], af, bf[0], bf[1]);
                } else {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.rh[16 * ks + lrow_a(lane)][cq + lcol_a(lane)]);
                    mma_f16(acc[0], af, bf[0], bf[1]);
                    mma_f16(acc[NTQ - 1], af, bf[2], bf[3]);
                }
            }
            const float k_v = sig_v / (sig_t * sig_r);  // exact: powers of two
            const float gl = d.gam[kC - 1];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r2 + g8 + 8 * h;
                const float dd = __expf(gl - d.gam[row]);  // exponent <= 0
#pragma unroll
                for (int nt = 0; nt < NTQ; ++nt) {
                    const int col = cq + 8 * nt + 2 * tig;
                    const float x0 = acc[nt][2 * h] * k_v, x1 = acc[nt][2 * h + 1] * k_v;
                    *reinterpret_cast<uint32_t *>(&s.vph[row][col]) = pack_half2(x0, x1);
                    *reinterpret_cast<uint32_t *>(&s.vdh[row][col]) = pack_half2(x0 * dd, x1 * dd);
                }
            }
        }
        __syncthreads();

        // ---- P3: O = e^gamma Q S + P V' (Q side); S = e^gamma_last S + K^T (e^(..) V') (all).
        const float inv_v = 1.0f / sig_v;
        if (side == 1) {
            float acc[NTH][4];
#pragma unroll
            for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
            const int strip = r1 / 16;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                if (ks > strip) continue;  // P is lower triangular
                uint32_t af[4];
                ldsm_x4(af, &d.ph[r1 + lrow_a(lane)][16 * ks + lcol_a(lane)]);
#pragma unroll
                for (int np = 0; np < NTH / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.vph[16 * ks + lrow_a(lane)][ch + 16 * np + lcol_a(lane)]);
                    mma_f16(acc[2 * np], af, bf[0], bf[1]);
                    mma_f16(acc[2 * np + 1], af, bf[2], bf[3]);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = r1 + g8 + 8 * h;
                const int64_t t = (int64_t)c * kC + i;
                if (t < a.rows) {
#pragma unroll
                    for (int nt = 0; nt < NTH; ++nt) {
                        float *out = og + t * a.ldo + ch + 8 * nt + 2 * tig;
                        const float o0 = fmaf(acc[nt][2 * h], inv_v, os[nt][2 * h]);
                        const float o1 = fmaf(acc[nt][2 * h + 1], inv_v, os[nt][2 * h + 1]);
                        if (VEC_O) {
                            *reinterpret_cast<float2 *>(out) = make_float2(o0, o1);
                        } else {
                            out[0] = o0;
                            out[1] = o1;
                        }
                    }
                }
            }
        }
        {
            float acc[NTH][4];
#pragma unroll
            for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                uint32_t af[4];  // (K^T)[a][i] = K[i][a]: the transpose of kh, via ldmatrix.trans
                ldsm_x4_t(af, &d.kh[16 * ks + lrow_b(lane)][16 * s8 + lcol_b(lane)]);
#pragma unroll
                for (int np = 0; np < NTH / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.vdh[16 * ks + lrow_a(lane)][ch + 16 * np + lcol_a(lane)]);
                    mma_f16(acc[2 * np], af, bf[0], bf[1]);
                    mma_f16(acc[2 * np + 1], af, bf[2], bf[3]);
                }
            }
            const float el = __expf(d.gam[kC - 1]);  // e^gamma_last
            float m = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    S[nt][e] = fmaf(el, S[nt][e], acc[nt][e] * inv_v);
                    m = fmaxf(m, fabsf(S[nt][e]));
                }
            publish_max(&s.max_s[b ^ 1], m);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float *x = state + (int64_t)(16 * s8 + g8 + 8 * h) * kDK + ch + 8 * nt + 2 * tig;
            x[0] = S[nt][2 * h];
            x[1] = S[nt][2 * h + 1];
        }
}

// --------------------------------------------------------------- state kernel, warp-owned form
// The same chunk step as gdn_chunk_state_kernel (same operands, precision and scales), laid out
// so that the recurrence never leaves a warp. The delta rule is independent across value
// columns, and every product of the step keeps the value column as its row when it is written
// transposed (S^T: dv x dk, the layout FlashInfer's GDN kernels keep on Hopper):
//   X^T  = S^T K^T                 (16 x 64, K = dk)     R^T = beta (V^T - e^gamma X^T)
//   V'^T = R^T Tm^T                (16 x 64, K = 64)
//   O^T  = e^gamma (S^T Q^T) + V'^T P^T
//   S^T  = e^gamma_last S^T + (e^(gamma_last - gamma) V')^T K
// With value columns as the M dimension of mma.m16n8k16, the accumulator of one product is,
// register for register, the A operand of the next (the fp32 C fragments of two adjacent n8
// tiles pack into the fp16 A fragment of one k16 block, as FlashAttention-2 reuses P), so a
// warp owning 16 value columns runs the whole chain on its own registers: no shared-memory
// round trip and no barrier inside the step, and the power-of-two scales come from warp
// reductions. The CTA's warps share only the chunk's operands (K, Q, Tm, P, gates, the V
// columns), staged kStages deep with cp.async by one producer warp (on a scheduler of its own
// for NW <= 3: the compute warps issue no copy instructions) behind one barrier per chunk.
// The v2 kernel above spent ~3.7 us per chunk on its four barriers and three dependent
// shared-memory steps (ncu, NOTES.md runs 4-7); this one ~2.2 us (run 20: 282 us at T = 8192,
// 16/32 heads), where each compute warp issues ~232 mma.sync, ~116 ldmatrix and ~1500 other
// instructions per chunk alone on its scheduler: the step is one warp's dependent instruction
// stream (4.5 cycles per issued instruction, stalls on fixed-latency dependencies), not a
// bandwidth (L2 56%, DRAM 29%). A form with separate output warps (S and V' handed over in
// shared memory behind named barriers) measured no faster (run 19: 282 us; the warps then
// waited at the barrier) and was removed.
template <int NW, int NS>
struct StateTSmem {
    static constexpr int kBV = 16 * NW;      // value columns of the CTA
    static constexpr int kLdVf = kBV + 4;    // fp32 V rows: fragment reads (row 2 tig, col g8) conflict-free
    struct Stage {
        __half kh[kC][kLdH];
        __half qh[kC][kLdH];
        __half tm[kC][kLdP];
        __half ph[kC][kLdP];
        float vst[kC][kLdVf];
        float gam[kC];
        float beta[kC];
        float meta[4];
    };
    static constexpr int kStages = NS;  // 3 where the shared memory allows (Hopper), else 2
    Stage st[NS];
};

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// fp16 A fragments (m16 x k16, k-block kb) from the fp32 accumulators of n8 tiles 2 kb, 2 kb + 1,
// times `scale`.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4],
                                         float scale) {
    a[0] = pack_half2(c0[0] * scale, c0[1] * scale);
    a[1] = pack_half2(c0[2] * scale, c0[3] * scale);
    a[2] = pack_half2(c1[0] * scale, c1[1] * scale);
    a[3] = pack_half2(c1[2] * scale, c1[3] * scale);
}

// The producer warp of a warp-owned state kernel, for every chunk of the pass: chunk
// c + NS - 1 into the buffer freed by chunk c - 1 (st[(c + NS - 1) % NS]) once everyone is past
// chunk c's barrier. It passes the same __syncthreads once per chunk as the compute warps (no
// early exit), and its wait_group before the barrier publishes chunk c's copies.
template <int BV, int NS, bool VEC, class Stage>
__device__ __forceinline__ void produce_state_operands(const StateArgs &a, Stage *st, int j, int jk,
                                                       int col0) {
    const int lane = threadIdx.x & 31;
    const float *vg = a.v + (int64_t)j * kDK + col0;
    // The workspace is the prep grid's output: wait for that grid when this kernel was launched
    // as its programmatic dependent (returns at once otherwise). The compute warps read only the
    // state (not the prep's) before their first chunk, which reaches them through this warp.
    pdl_wait();
#pragma unroll
    for (int c = 0; c < NS - 1; ++c) {
        if (c < a.nc) stage_chunk<BV, VEC, 32>(st[c], a, vg, j, jk, c, lane);
        cp_async_commit();  // empty groups keep the count: group c is chunk c
    }
    for (int c = 0; c < a.nc; ++c) {
        cp_async_wait<NS - 2>();
        __syncthreads();
        if (c + NS - 1 < a.nc) stage_chunk<BV, VEC, 32>(st[(c + NS - 1) % NS], a, vg, j, jk, c + NS - 1, lane);
        cp_async_commit();
    }
    cp_async_wait<0>();
}

template <int NW, int NS_, bool VEC>
__global__ void __launch_bounds__(32 * (NW + 1), 1)
    gdn_chunk_state_t_kernel(const __grid_constant__ StateArgs a) {
    using Smem = StateTSmem<NW, NS_>;
    constexpr int BV = Smem::kBV;
    constexpr int NS = Smem::kStages;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &s = *reinterpret_cast<Smem *>(smem_raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;
    const int slices = kDK / BV;
    const int j = blockIdx.x / slices;
    const int col0 = (blockIdx.x % slices) * BV;
    const int jk = j % a.n_k_heads;  // tiled pairing (qwen35 GGUF, spec.md G6)
    const int vc = 16 * warp;        // the warp's first column within the CTA's V tile
    float *og = a.o + (int64_t)j * kDK + col0 + vc;
    float *state = a.state + (int64_t)j * kDK * kDK + col0 + vc;

    if (warp == NW) {  // the producer
        produce_state_operands<BV, NS, VEC>(a, s.st, j, jk, col0);
        return;
    }

    // S^T[v][x] = S[x][v] (v: the warp's 16 columns, x: dk) as 16 n8 accumulator tiles over x:
    // S[nt][e] holds v = g8 + 8 (e >> 1), x = 8 nt + 2 tig + (e & 1).
    float S[16][4];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            S[nt][e] = state[(int64_t)(8 * nt + 2 * tig + (e & 1)) * kDK + g8 + 8 * (e >> 1)];

    // max |S| of the state entering the chunk (four partial maxima: a short dependent chain)
    const auto state_max = [&]() {
        float m4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 16; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) m4[e] = fmaxf(m4[e], fabsf(S[nt][e]));
        return warp_max(fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3])));
    };
    float ms = state_max();

    // Issue order matters: ldmatrix and mma are volatile asm, so the code order below is the
    // order the warp issues them in. Each product loads the B fragments of its next k-block
    // before the mma of the current one (the ldmatrix latency hides behind the mma), the
    // state-independent products (S^T Q^T, V'^T P^T) sit between the chain's steps, and the
    // chain (X, R, V', the update) is one dependent line with no barrier: the warp runs alone on
    // its scheduler, so its own instruction-level parallelism is all the latency hiding there is.
    for (int c = 0; c < a.nc; ++c) {
        const int b = c % NS;
        const typename Smem::Stage &d = s.st[b];
        __syncthreads();  // chunk c landed (the producer waited for it); chunk c - 1's buffer is free

        const float sig_s = pow2_scale(__float_as_uint(ms)), inv_s = 1.0f / sig_s;
        // the warp's rows of this lane: i = 8 nt + 2 tig + u; e^gamma_i / sigma_S for R and O
        float eg[8][2];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int u = 0; u < 2; ++u) eg[nt][u] = __expf(d.gam[8 * nt + 2 * tig + u]) * inv_s;
        // acc = S^T B^T for a [row i][x] fp16 tile B (K or Q: stored [n][k], ldmatrix plain), the
        // A fragments of S^T converted per k-block and B's fragments one k-block ahead.
        const auto s_times = [&](float (&acc)[8][4], const __half (*bt)[kLdH]) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
            uint32_t bb[2][4][4];
#pragma unroll
            for (int np = 0; np < 4; ++np) ldsm_x4(bb[0][np], &bt[16 * np + lrow_b(lane)][lcol_b(lane)]);
#pragma unroll
            for (int kb = 0; kb < 8; ++kb) {
                if (kb + 1 < 8)
#pragma unroll
                    for (int np = 0; np < 4; ++np)
                        ldsm_x4(bb[(kb + 1) & 1][np], &bt[16 * np + lrow_b(lane)][16 * (kb + 1) + lcol_b(lane)]);
                uint32_t sa[4];
                acc_to_a(sa, S[2 * kb], S[2 * kb + 1], sig_s);
#pragma unroll
                for (int np = 0; np < 4; ++np) {
                    mma_f16(acc[2 * np], sa, bb[kb & 1][np][0], bb[kb & 1][np][1]);
                    mma_f16(acc[2 * np + 1], sa, bb[kb & 1][np][2], bb[kb & 1][np][3]);
                }
            }
        };
        // |R| <= max|V| + sqrt(dk) max|S| (q, k unit vectors), as the v2 kernel; here max |V| and
        // max |S| are the warp's own columns'.
        float vm4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                vm4[e] = fmaxf(vm4[e], fabsf(d.vst[8 * nt + 2 * tig + (e & 1)][vc + g8 + 8 * (e >> 1)]));
        const float r_bound = warp_max(fmaxf(fmaxf(vm4[0], vm4[1]), fmaxf(vm4[2], vm4[3]))) + kSqrtDk * ms;

        // X^T = S^T K^T (B from K stored [row i][x]: [n][k], ldmatrix plain).
        float xk[8][4];
        s_times(xk, d.kh);
        // Tm's fragments (lower triangle: the n-pair of rows 16 np needs k-blocks kb <= np),
        // issued now so that they land while R is computed.
        uint32_t bt[10][4];
#pragma unroll
        for (int np = 0, f = 0; np < 4; ++np)
#pragma unroll
            for (int kb = 0; kb <= np; ++kb, ++f)
                ldsm_x4(bt[f], &d.tm[16 * np + lrow_b(lane)][16 * kb + lcol_b(lane)]);

        // R^T = beta (V^T - e^gamma X^T) as scaled fp16 A fragments (4 k-blocks over rows i).
        const float sig_r = pow2_scale_f(r_bound);
        uint32_t ra[4][4];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
            float r[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int nt = 2 * kb + h, i = 8 * nt + 2 * tig + (e & 1);
                    const float vx = d.vst[i][vc + g8 + 8 * (e >> 1)];
                    r[h][e] = d.beta[i] * (vx - eg[nt][e & 1] * xk[nt][e]);
                }
            acc_to_a(ra[kb], r[0], r[1], sig_r);
        }

        // V'^T = R^T Tm^T (B from Tm stored [i][j]: [n][k]).
        float vp[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) vp[nt][e] = 0.0f;
#pragma unroll
        for (int np = 0, f = 0; np < 4; ++np)
#pragma unroll
            for (int kb = 0; kb <= np; ++kb, ++f) {
                mma_f16(vp[2 * np], ra[kb], bt[f][0], bt[f][1]);
                mma_f16(vp[2 * np + 1], ra[kb], bt[f][2], bt[f][3]);
            }

        // S^T Q^T (independent of V': issued while the V' mma drain), for the outputs.
        float xq[8][4];
        s_times(xq, d.qh);
        // P's fragments (lower triangle, diagonal included), landing while V' is converted.
#pragma unroll
        for (int np = 0, f = 0; np < 4; ++np)
#pragma unroll
            for (int kb = 0; kb <= np; ++kb, ++f)
                ldsm_x4(bt[f], &d.ph[16 * np + lrow_b(lane)][16 * kb + lcol_b(lane)]);

        // V' * sigma_V (outputs) and e^(gamma_last - gamma) V' * sigma_V (state update).
        const float sig_t = d.meta[0];
        const float v_bound = d.meta[1] * r_bound;  // max_i sum_j |Tm_ij| * max |R| >= max |V'|
        const float sig_v = pow2_scale_f(v_bound), inv_v = 1.0f / sig_v;
        const float k_v = sig_v / (sig_t * sig_r);  // exact: powers of two
        const float gl = d.gam[kC - 1];
        uint32_t va[4][4], vd[4][4];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
            float x[2][4], y[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int nt = 2 * kb + h;
                    const float dd = __expf(gl - d.gam[8 * nt + 2 * tig + u]);  // exponent <= 0
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        x[h][2 * hh + u] = vp[nt][2 * hh + u] * k_v;
                        y[h][2 * hh + u] = x[h][2 * hh + u] * dd;
                    }
                }
            acc_to_a(va[kb], x[0], x[1], 1.0f);
            acc_to_a(vd[kb], y[0], y[1], 1.0f);
        }

        // O^T = e^gamma (S^T Q^T) + V'^T P^T; the warp's 16 columns of 64 rows straight to
        // global memory (each store instruction fills four whole 32-byte sectors).
        {
            float op[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) op[nt][e] = 0.0f;
#pragma unroll
            for (int np = 0, f = 0; np < 4; ++np)
#pragma unroll
                for (int kb = 0; kb <= np; ++kb, ++f) {
                    mma_f16(op[2 * np], va[kb], bt[f][0], bt[f][1]);
                    mma_f16(op[2 * np + 1], va[kb], bt[f][2], bt[f][3]);
                }
            const int64_t t0 = (int64_t)c * kC;
            const int lim = a.rows - t0 < kC ? int(a.rows - t0) : kC;  // rows of this chunk
            float *orow = og + (t0 + 2 * tig) * a.ldo + g8;              // row 2 tig of the chunk
#pragma unroll
            for (int nt = 0; nt < 8; ++nt, orow += 8 * a.ldo)
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int i = 8 * nt + 2 * tig + u;
                    if (i < lim) {
                        float *p = orow + (u ? a.ldo : 0);
                        p[0] = fmaf(op[nt][u], inv_v, eg[nt][u] * xq[nt][u]);
                        p[8] = fmaf(op[nt][2 + u], inv_v, eg[nt][u] * xq[nt][2 + u]);
                    }
                }
        }

        // S^T = e^gamma_last S^T + (e^(gamma_last - gamma) V')^T K (B from K stored [i][x]:
        // [k][n], ldmatrix .trans).
        {
            float acc[16][4];
#pragma unroll
            for (int nt = 0; nt < 16; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
            uint32_t bb[2][4][4];
#pragma unroll
            for (int q4 = 0; q4 < 4; ++q4) ldsm_x4_t(bb[0][q4], &d.kh[lrow_a(lane)][16 * q4 + lcol_a(lane)]);
            // 32 (kb, np) steps, fragments one step of four ahead: step s = (kb, half): np = 4 half + q4
#pragma unroll
            for (int st = 0; st < 8; ++st) {
                const int kb = st >> 1, half = st & 1;
                if (st + 1 < 8) {
                    const int kb1 = (st + 1) >> 1, half1 = (st + 1) & 1;
#pragma unroll
                    for (int q4 = 0; q4 < 4; ++q4)
                        ldsm_x4_t(bb[(st + 1) & 1][q4],
                                  &d.kh[16 * kb1 + lrow_a(lane)][16 * (4 * half1 + q4) + lcol_a(lane)]);
                }
#pragma unroll
                for (int q4 = 0; q4 < 4; ++q4) {
                    const int np = 4 * half + q4;
                    mma_f16(acc[2 * np], vd[kb], bb[st & 1][q4][0], bb[st & 1][q4][1]);
                    mma_f16(acc[2 * np + 1], vd[kb], bb[st & 1][q4][2], bb[st & 1][q4][3]);
                }
            }
            const float el = __expf(gl);  // e^gamma_last
#pragma unroll
            for (int nt = 0; nt < 16; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[nt][e] = fmaf(el, S[nt][e], acc[nt][e] * inv_v);
        }
        ms = state_max();
    }
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            state[(int64_t)(8 * nt + 2 * tig + (e & 1)) * kDK + g8 + 8 * (e >> 1)] = S[nt][e];
}

// ---------------------------------------------------- state kernel, warpgroup form (sm_90a only)
// The chunk step of the warp-owned kernel (same algebra, S^T with the value columns as rows) on
// Hopper's warpgroup MMA, the form FlashInfer's and FlashQLA's GDN kernels take on this card. A
// consumer warpgroup owns 64 value columns of a head (2 CTAs per head: Hv = 32 gives 64 CTAs,
// 48 gives 96) and keeps S^T (64 x 128) as one m64n128 fp32 accumulator; every product of the
// step is a wgmma with its A operand in registers (the fp32 accumulator of the product before
// it, packed to fp16 as FlashAttention-3 reuses P) and its B operand in shared memory:
//   X^T = S^T K^T, S^T Q^T     m64n64k16 x 8  (B: K, Q stored [i][x], K-major)
//   V'^T = R^T Tm^T            m64n64k16 x 4  (B: Tm stored [i][j], K-major)
//   O^T += V'^T P^T            m64n64k16 x 4  (B: P stored [i][j], K-major)
//   S^T += V''^T K             m64n128k16 x 4 (B: K stored [j][x], MN-major: the same bytes)
// 20 wgmma per chunk and warpgroup where the warp-owned kernel issues ~232 mma.sync per warp;
// the update accumulates into the master state itself. One producer warp stages the chunks
// three deep (K, Q, Tm, P into the 128-byte-swizzled layout the descriptors read, hopper.cuh;
// the pipeline is described above the kernel). ncu (device run 53, T = 8192): 229 us per layer
// at 16/32 heads (warp-owned: 272), ~3500 cycles per chunk, the tensor pipe a third busy: the
// step is one warpgroup's dependent chain.
// Precision as the other state kernels (fp16 operands, fp32 accumulation, power-of-two scales),
// with the scales per value column (per accumulator row: a reduction over the 4 lanes of a quad,
// no barrier) instead of per warp. The master state is kept as S_true = S_acc * u (u a power of
// two per row): before the update S_acc is multiplied by u e^gamma_last sigma_V, so that the
// update, whose A operand is V'' * sigma_V, accumulates into it in the same units; u becomes
// 1 / sigma_V. sigma_V comes from a bound known at the chunk's start (the bound on |V'|
// below), so that multiply runs while V' is computed.
constexpr int kWgStateThreads = 160;  // one consumer warpgroup + one producer warp
constexpr int kWgStateStages = 3;

struct StateWgSmem {
    struct alignas(1024) Stage {
        __half kh[kC * kDK];  // swizzled: column blocks x 0..63, 64..127 of 8 KB (hopper.cuh)
        __half qh[kC * kDK];
        __half tm[kC * kC];   // one swizzled block
        __half ph[kC * kC];
        float vst[kC * 64];   // two [64][32] fp32 blocks, 128-byte swizzle (wg_v_offset)
        float gam[kC];
        float beta[kC];
        float meta[4];
    };
    Stage st[kWgStateStages];
    uint64_t full[kWgStateStages];   // the stage's copies landed (TMA / bulk transactions)
    uint64_t empty[kWgStateStages];  // the 4 consumer warps are done with the stage
};
constexpr size_t kWgStateSmem = sizeof(StateWgSmem) + 1024;  // + the 1024-byte alignment slack

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PF_GDN_WGMMA_DEVICE 1
#endif

#ifdef PF_GDN_WGMMA_DEVICE  // the warpgroup kernel's device helpers (sm_90a only)
constexpr uint32_t kWgTmaBytes = 2 * kC * kDK * 2 + 2 * kC * kC * 2;  // K, Q, Tm, P (fp16)
constexpr uint32_t kWgVBytes = kC * 64 * 4;                           // V's 64 columns (fp32)
constexpr uint32_t kWgGateBytes = 2 * kC * 4 + 16;                    // gamma, beta, meta

// Float offset of V element (row i, column col < 64) in a stage: block col / 32 of [64][32]
// floats (128-byte rows), 16-byte chunk (col % 32) / 4 XOR i % 8 (the TMA's 128-byte swizzle),
// which makes the consumers' reads (rows 2 tig + w, columns g8 + const) conflict-free.
__device__ __forceinline__ int wg_v_offset(int i, int col) {
    return (col >> 5) * (kC * 32) + i * 32 + ((((col & 31) >> 2) ^ (i & 7)) << 2) + (col & 3);
}

// Bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into
// shared memory, completing on mbarrier bar (PTX cp.async.bulk).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// cp.async of this thread so far, completing as one (non-counted) arrival on mbarrier bar.
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Max over the 4 lanes of a quad (the lanes that hold one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// 1 / x for a power of two x = 2^(E - 127), E in [1, 254] (pow2_scale's range), exactly.
__device__ __forceinline__ float pow2_inv(float x) {
    const unsigned e = __float_as_uint(x) >> 23;
    return e < 254u ? __uint_as_float((254u - e) << 23) : __uint_as_float(1u << 22);  // 2^-127
}

// S^T (fp32, 64 per thread) to fp16 A fragments with each row scaled to max |x| in [2^14, 2^15)
// (four partial maxima per row: short dependent chains); ms: the rows' max |S_acc|, f: u / z
// (X_true = X_acc f, exact: powers of two).
__device__ __forceinline__ void wg_state_to_a(const float (&S)[64], const float (&u)[2],
                                              uint32_t (&sa)[8][4], float (&ms)[2], float (&f)[2]) {
    float m4[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int e = 0; e < 64; ++e) {
        float &m = m4[(e >> 1) & 1][(e & 1) | ((e >> 1) & 2)];
        m = fmaxf(m, fabsf(S[e]));
    }
    float z[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        ms[h] = quad_max(fmaxf(fmaxf(m4[h][0], m4[h][1]), fmaxf(m4[h][2], m4[h][3])));
        z[h] = pow2_scale(__float_as_uint(ms[h]));
        f[h] = u[h] * pow2_inv(z[h]);
    }
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
        sa[kb][0] = pack_half2(S[8 * kb + 0] * z[0], S[8 * kb + 1] * z[0]);
        sa[kb][1] = pack_half2(S[8 * kb + 2] * z[1], S[8 * kb + 3] * z[1]);
        sa[kb][2] = pack_half2(S[8 * kb + 4] * z[0], S[8 * kb + 5] * z[0]);
        sa[kb][3] = pack_half2(S[8 * kb + 6] * z[1], S[8 * kb + 7] * z[1]);
    }
}

#endif  // PF_GDN_WGMMA_DEVICE

// Pipeline (FlashAttention-3's producer/consumer form): per stage a `full` mbarrier that the
// producer arms with the chunk's byte count and the copies complete, and an `empty` one that the
// 4 consumer warps arrive on when done with it, so that the producer runs up to 3 chunks ahead
// with no CTA barrier. The producer's lane 0 issues everything: K, Q, Tm, P and V by TMA (V's
// 64 columns as two 32-float boxes, 128-byte swizzle), the gates and meta by bulk copies; when V's
// rows are not 16-byte aligned (VEC false) the warp's lanes copy V by 4-byte cp.async into the
// same swizzled places, each lane's copies completing as an arrival on `full` (its count then
// 1 + 32).
// The chunk step: X and half of S^T Q^T (which runs while R is computed), V' and the other half
// of S^T Q^T, the update, P V' (the next chunk's conversion of S runs while P V' does).
template <bool VEC>
__global__ void __launch_bounds__(kWgStateThreads, 1)
    gdn_chunk_state_wg_kernel(const __grid_constant__ StateArgs a,
                              const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_t,
                              const __grid_constant__ CUtensorMap tm_p,
                              const __grid_constant__ CUtensorMap tm_v) {
#ifdef PF_GDN_WGMMA_DEVICE
    using namespace hopper;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *base = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    StateWgSmem &s = *reinterpret_cast<StateWgSmem *>(base);
    constexpr int NS = kWgStateStages;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;
    const int j = blockIdx.x >> 1, col0 = (blockIdx.x & 1) * 64;
    const int jk = j % a.n_k_heads;  // tiled pairing (qwen35 GGUF, spec.md G6)
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < NS; ++b) {
            mbar_init(smem_addr(&s.full[b]), VEC ? 1 : 33);
            mbar_init(smem_addr(&s.empty[b]), 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();  // the only CTA barrier

    if (warp == 4) {  // the producer
        if (VEC && lane != 0) return;
        pdl_wait();   // the workspace is the prep grid's output (see produce_state_operands)
        // The next sub-pass's prep may start beside this grid (chained sub-passes): its
        // workspace half was last read by the state grid before the prep just waited for.
        pdl_launch_dependents();
        for (int c = 0; c < a.nc; ++c) {
            const int b = c % NS;
            StateWgSmem::Stage &d = s.st[b];
            const uint32_t full = smem_addr(&s.full[b]);
            if (c >= NS) mbar_wait(smem_addr(&s.empty[b]), uint32_t(c / NS - 1) & 1u);
            if (lane == 0) {
                const int kr = (jk * a.nc + c) * kC, tr = (j * a.nc + c) * kC;
                const size_t hc = (size_t)j * a.nc + c;
                const uint32_t kh = smem_addr(d.kh), qh = smem_addr(d.qh), vs = smem_addr(d.vst);
                mbar_arrive_expect_tx(full, kWgTmaBytes + kWgGateBytes + (VEC ? kWgVBytes : 0));
                tma_load_2d(kh, &tm_k, 0, kr, full);
                tma_load_2d(kh + kC * kSwizzleRow, &tm_k, kSwizzleCols, kr, full);
                tma_load_2d(qh, &tm_q, 0, kr, full);
                tma_load_2d(qh + kC * kSwizzleRow, &tm_q, kSwizzleCols, kr, full);
                tma_load_2d(smem_addr(d.tm), &tm_t, 0, tr, full);
                tma_load_2d(smem_addr(d.ph), &tm_p, 0, tr, full);
                if (VEC) {
                    tma_load_2d(vs, &tm_v, j * kDK + col0, c * kC, full);
                    tma_load_2d(vs + kC * 32 * 4, &tm_v, j * kDK + col0 + 32, c * kC, full);
                }
                bulk_load(smem_addr(d.gam), a.w.gam + hc * kC, kC * 4, full);
                bulk_load(smem_addr(d.beta), a.w.bet + hc * kC, kC * 4, full);
                bulk_load(smem_addr(d.meta), a.w.meta + hc * 4, 16, full);
            }
            if (!VEC) {
                const float *vg = a.v + (int64_t)j * kDK + col0;
                const int64_t t0 = (int64_t)c * kC;
#pragma unroll 4
                for (int e = lane; e < kC * 64; e += 32) {
                    const int i = e >> 6, d1 = e & 63;
                    const bool ok = t0 + i < a.rows;
                    cp_async4(&d.vst[wg_v_offset(i, d1)], vg + (ok ? t0 + i : 0) * a.ldv + d1, ok);
                }
                cp_async_arrive_noinc(full);
            }
        }
        if (!VEC) cp_async_wait_all();
        return;
    }

    // This thread's two accumulator rows (value columns): vr0 + 8 h of the CTA's 64, vr0 =
    // 16 warp + g8; accumulator element e of an m64nN tile: row half h = (e >> 1) & 1, column
    // 8 (e >> 2) + 2 tig + (e & 1) (wgmma.cuh).
    const int vr0 = 16 * warp + g8;
    float *og = a.o + (int64_t)j * kDK + col0 + vr0;
    float *state = a.state + (int64_t)j * kDK * kDK + col0 + vr0;

    // Chained sub-passes: the state grid of the sub-pass before may still be writing the state;
    // the prep grid's completion implies its completion (the prep's last wait).
    if (a.chain) pdl_wait();
    float S[64];  // S^T[v][x] / u[h]: x = 8 (e >> 2) + 2 tig + (e & 1)
#pragma unroll
    for (int e = 0; e < 64; ++e)
        S[e] = state[(int64_t)(8 * (e >> 2) + 2 * tig + (e & 1)) * kDK + 8 * ((e >> 1) & 1)];
    float u[2] = {1.0f, 1.0f};
    uint32_t sa[8][4];  // the A fragments of the state entering the chunk
    float ms[2], f[2];
    wg_state_to_a(S, u, sa, ms, f);

    for (int c = 0; c < a.nc; ++c) {
        const int b = c % NS;
        const StateWgSmem::Stage &d = s.st[b];
        mbar_wait(smem_addr(&s.full[b]), uint32_t(c / NS) & 1u);
        const uint32_t kaddr = smem_addr(d.kh);
        const uint64_t dK = smem_desc(kaddr, 16, kSwizzleAtom);                // K-major
        const uint64_t dKt = smem_desc(kaddr, kC * kSwizzleRow, kSwizzleAtom);  // MN-major
        const uint64_t dQ = smem_desc(smem_addr(d.qh), 16, kSwizzleAtom);
        const uint64_t dT = smem_desc(smem_addr(d.tm), 16, kSwizzleAtom);
        const uint64_t dP = smem_desc(smem_addr(d.ph), 16, kSwizzleAtom);

        // X^T = S^T K^T, then the first half (k-steps over x < 64) of S^T Q^T, the outputs' part:
        // it runs while R is computed. Its second half goes in behind V', so that V' waits in the
        // tensor pipe behind 4 k-steps of it, not 8 (device run s23-3: 0.3539 vs 0.3614 ms at
        // 16/32 heads, T = 8192; 0.4032 vs 0.4093 at 16/48).
        float xa[32], oa[32];
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 8; ++kb)
            wgmma::wgmma_rsk<64>(xa, sa[kb], desc_add(dK, uint32_t(kb >> 2) * kC * kSwizzleRow + 32u * (kb & 3)), kb > 0);
        wgmma_commit();
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
            wgmma::wgmma_rsk<64>(oa, sa[kb], desc_add(dQ, 32u * kb), kb > 0);
        wgmma_commit();

        // While it runs (everything read from shared memory is loaded here: the waits below are
        // memory clobbers that no load moves across): for this thread's chunk rows
        // i = 8 nt + 2 tig + w, e^gamma, beta e^gamma, beta V and e^(gamma_last - gamma); the
        // bounds and scales of its two value columns.
        const float gl = d.gam[kC - 1], el = __expf(gl);
        float eg[8][2], be[8][2], dd[8][2], bv[32];
        float vm[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float2 gg = *reinterpret_cast<const float2 *>(&d.gam[8 * nt + 2 * tig]);
            const float2 bb = *reinterpret_cast<const float2 *>(&d.beta[8 * nt + 2 * tig]);
            eg[nt][0] = __expf(gg.x);
            eg[nt][1] = __expf(gg.y);
            dd[nt][0] = __expf(gl - gg.x);  // exponent <= 0
            dd[nt][1] = __expf(gl - gg.y);
            be[nt][0] = bb.x * eg[nt][0];
            be[nt][1] = bb.y * eg[nt][1];
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // element e = 4 nt + q: w = q & 1, h = q >> 1
                const float vx = d.vst[wg_v_offset(8 * nt + 2 * tig + (q & 1), vr0 + 8 * (q >> 1))];
                vm[q >> 1] = fmaxf(vm[q >> 1], fabsf(vx));
                bv[4 * nt + q] = (q & 1 ? bb.y : bb.x) * vx;
            }
        }
        const float sig_t = d.meta[0], rs_t = d.meta[1];
        float sig_r[2], sig_v[2], k_v[2], smul[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // |R| <= max|V| + sqrt(dk) max|S| (q, k unit vectors), max |V'| <= max_i sum_j |Tm_ij| max|R|
            const float r_bound = quad_max(vm[h]) + kSqrtDk * (ms[h] * u[h]);
            sig_r[h] = pow2_scale_f(r_bound);
            sig_v[h] = pow2_scale_f(rs_t * r_bound);
            k_v[h] = sig_v[h] * pow2_inv(sig_t) * pow2_inv(sig_r[h]);  // exact: powers of two
            smul[h] = u[h] * el * sig_v[h];
        }
        // R = (beta V) sigma_R - (beta e^gamma f sigma_R) X_acc: one FFMA per element below.
        float rx[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            const int h = (e >> 1) & 1;
            rx[e] = -be[e >> 2][e & 1] * (f[h] * sig_r[h]);
            bv[e] *= sig_r[h];
        }
        // Pinned here, before the wait: the compiler would otherwise sink this arithmetic (no
        // memory access) below it, onto the chain.
        fence_regs(eg);
        fence_regs(rx);
        fence_regs(dd);
        fence_regs(bv);
        fence_regs(k_v);
        fence_regs(smul);

        // R^T = beta (V^T - e^gamma X^T) as scaled fp16 A fragments (4 k-blocks over rows i).
        wgmma_wait<1>();
        fence_regs(xa);
        uint32_t ra[4][4];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
            float r[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) r[q] = fmaf(rx[8 * kb + q], xa[8 * kb + q], bv[8 * kb + q]);
            ra[kb][0] = pack_half2(r[0], r[1]);
            ra[kb][1] = pack_half2(r[2], r[3]);
            ra[kb][2] = pack_half2(r[4], r[5]);
            ra[kb][3] = pack_half2(r[6], r[7]);
        }

        // V'^T = R^T Tm^T, then the second half of S^T Q^T; the master state into the update's
        // units meanwhile.
        float va[32];
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) wgmma::wgmma_rsk<64>(va, ra[kb], desc_add(dT, 32u * kb), kb > 0);
        wgmma_commit();
#pragma unroll
        for (int kb = 4; kb < 8; ++kb)
            wgmma::wgmma_rsk<64>(oa, sa[kb], desc_add(dQ, kC * kSwizzleRow + 32u * (kb & 3)), 1);
        wgmma_commit();
#pragma unroll
        for (int e = 0; e < 64; ++e) S[e] *= smul[(e >> 1) & 1];
        wgmma_wait<1>();  // V' done; S^T Q^T may still run
        fence_regs(va);
        fence_regs(ra);

        // V' * sigma_V (outputs) and e^(gamma_last - gamma) V' * sigma_V (the update).
        uint32_t pa[4][4], ua[4][4];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
            float x[8], y[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int e = 8 * kb + q;
                x[q] = va[e] * k_v[(e >> 1) & 1];
                y[q] = x[q] * dd[e >> 2][e & 1];
            }
            pa[kb][0] = pack_half2(x[0], x[1]);
            pa[kb][1] = pack_half2(x[2], x[3]);
            pa[kb][2] = pack_half2(x[4], x[5]);
            pa[kb][3] = pack_half2(x[6], x[7]);
            ua[kb][0] = pack_half2(y[0], y[1]);
            ua[kb][1] = pack_half2(y[2], y[3]);
            ua[kb][2] = pack_half2(y[4], y[5]);
            ua[kb][3] = pack_half2(y[6], y[7]);
        }

        // S^T += (e^(gamma_last - gamma) V' sigma_V)^T K; then, with S^T Q^T complete, O^T in the
        // units of V' sigma_V: e^gamma (S^T Q^T) f sigma_V, and O^T += (V' sigma_V)^T P^T.
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
            wgmma::wgmma_rs<128>(S, ua[kb], desc_add(dKt, uint32_t(kb) * 2 * kSwizzleAtom), 1);
        wgmma_commit();
        wgmma_wait<1>();  // S^T Q^T done; the update may still run
        fence_regs(oa);
        fence_regs(sa);
#pragma unroll
        for (int e = 0; e < 32; ++e) {
            const int h = (e >> 1) & 1;
            oa[e] *= eg[e >> 2][e & 1] * (f[h] * sig_v[h]);
        }
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) wgmma::wgmma_rsk<64>(oa, pa[kb], desc_add(dP, 32u * kb), 1);
        wgmma_commit();
        u[0] = pow2_inv(sig_v[0]);
        u[1] = pow2_inv(sig_v[1]);

        // The next chunk's A fragments once the update is done (P V' may still run).
        wgmma_wait<1>();
        fence_regs(S);
        fence_regs(ua);
        wg_state_to_a(S, u, sa, ms, f);
        wgmma_wait<0>();
        fence_regs(oa);
        fence_regs(pa);
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(&s.empty[b]));  // this warp is done with stage b

        // The outputs: this thread's 2 value columns x 16 rows of the chunk.
        const int64_t t0 = (int64_t)c * kC;
        const int lim = a.rows - t0 < kC ? int(a.rows - t0) : kC;
        float *orow = og + (t0 + 2 * tig) * a.ldo;  // row 2 tig of the chunk
#pragma unroll
        for (int nt = 0; nt < 8; ++nt, orow += 8 * a.ldo)
#pragma unroll
            for (int w = 0; w < 2; ++w)
                if (8 * nt + 2 * tig + w < lim) {
                    float *p = orow + (w ? a.ldo : 0);
                    p[0] = oa[4 * nt + w] * u[0];
                    p[8] = oa[4 * nt + 2 + w] * u[1];
                }
    }
#pragma unroll
    for (int e = 0; e < 64; ++e)
        state[(int64_t)(8 * (e >> 2) + 2 * tig + (e & 1)) * kDK + 8 * ((e >> 1) & 1)] = S[e] * u[(e >> 1) & 1];
#else
    __trap();  // sm_90a only: the host never launches it elsewhere (gdn_state_wg_available)
#endif
}

// A state kernel (or, chained, a prep kernel) with `args` on `stream`, as the programmatic
// dependent of the kernel just before it when `pdl` (see pdl_wait; in a stream capture this
// becomes the graph's programmatic edge), else in plain stream order. The launch's own error
// (PDL) is returned; the caller's PF_LAUNCH_CHECK reads the rest.
template <class... Params, class... Args>
cudaError_t launch_state_kernel(void (*kernel)(Params...), dim3 grid, unsigned block, size_t smem,
                                bool pdl, cudaStream_t stream, const Args &...args) {
    if (!pdl) {
        kernel<<<grid, block, smem, stream>>>(args...);
        return cudaSuccess;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <bool VEC>
pf_status launch_prep(const PrepArgs &a, cudaStream_t stream) {
    PF_TRY(set_max_dynamic_smem(gdn_chunk_prep_kernel<VEC>, int(sizeof(PrepSmem)), "gdn_chunk_prep_kernel"));
    gdn_chunk_prep_kernel<VEC><<<dim3(a.nc, a.n_k_heads), kPrepThreads, sizeof(PrepSmem), stream>>>(a);
    PF_LAUNCH_CHECK("gdn_chunk_prep_kernel<%d>", int(VEC));
    return PF_STATUS_OK;
}

// v2: one CTA per (round of NH value heads, chunk, key head); NH = 2 where Hv / Hk is even.
// Occupancy (sm_90): 96 registers x 128 threads and ~44 KB of shared memory per CTA: 5 CTAs,
// 20 warps per SM (v1: 2 CTAs, 8 warps); that needs the largest shared-memory carveout, asked
// for once per instance (a hint: on failure the driver's choice stands; current device only).
template <bool VEC, int NH>
pf_status launch_prep_v2_nh(const PrepArgs &a, bool pdl, cudaStream_t stream) {
    const int bytes = int(sizeof(PrepV2Smem<NH>));
    PF_TRY(set_max_dynamic_smem(gdn_chunk_prep_v2_kernel<VEC, NH>, bytes, "gdn_chunk_prep_v2_kernel"));
    static const bool carveout = [] {
        const cudaError_t e = cudaFuncSetAttribute(gdn_chunk_prep_v2_kernel<VEC, NH>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   int(cudaSharedmemCarveoutMaxShared));
        if (e != cudaSuccess) (void)cudaGetLastError();  // not an error of the launch below
        return e == cudaSuccess;
    }();
    (void)carveout;
    const dim3 grid((a.n_v_heads / a.n_k_heads) / NH, a.nc, a.n_k_heads);
    const cudaError_t e = launch_state_kernel(gdn_chunk_prep_v2_kernel<VEC, NH>, grid, kPrepV2Threads,
                                              size_t(bytes), pdl, stream, a);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gdn_chunk_prep_v2_kernel<%d, %d> (PDL)", int(VEC), NH);
    PF_LAUNCH_CHECK("gdn_chunk_prep_v2_kernel<%d, %d>", int(VEC), NH);
    return PF_STATUS_OK;
}

// pdl: as the programmatic dependent of the state kernel before it (chained sub-passes).
template <bool VEC>
pf_status launch_prep_v2(const PrepArgs &a, bool pdl, cudaStream_t stream) {
    PF_CHECK_ARG(a.n_k_heads <= 65535, "gdn_chunk_scan_rows: n_k_heads=%d > 65535 (grid z)", a.n_k_heads);
    if ((a.n_v_heads / a.n_k_heads) % 2 == 0) return launch_prep_v2_nh<VEC, 2>(a, pdl, stream);
    return launch_prep_v2_nh<VEC, 1>(a, pdl, stream);
}

// Which prep kernel: env PREFILL_GDN_PREP=v1 selects the first one (one CTA per chunk and key
// head, value heads in turn, 2 CTAs per SM) for side-by-side measurement; anything else
// (default) v2. Both write the same workspace, bit for bit. Read per call, like
// PREFILL_GDN_STATE.
bool gdn_prep_v1_from_env() {
    const char *e = std::getenv("PREFILL_GDN_PREP");
    return e != nullptr && std::strcmp(e, "v1") == 0;
}

template <int BV, bool VEC, bool VEC_O>
pf_status launch_state(const StateArgs &a, cudaStream_t stream) {
    PF_TRY(set_max_dynamic_smem(gdn_chunk_state_kernel<BV, VEC, VEC_O>, int(sizeof(StateSmem<BV>)),
                                "gdn_chunk_state_kernel"));
    gdn_chunk_state_kernel<BV, VEC, VEC_O>
        <<<a.n_v_heads * (kDK / BV), kStateThreads, sizeof(StateSmem<BV>), stream>>>(a);
    PF_LAUNCH_CHECK("gdn_chunk_state_kernel<%d, %d, %d>", BV, int(VEC), int(VEC_O));
    return PF_STATUS_OK;
}

template <int NW, int NS, bool VEC>
pf_status launch_state_t_ns(const StateArgs &a, bool pdl, cudaStream_t stream) {
    using Smem = StateTSmem<NW, NS>;
    PF_TRY(set_max_dynamic_smem(gdn_chunk_state_t_kernel<NW, NS, VEC>, int(sizeof(Smem)),
                                "gdn_chunk_state_t_kernel"));
    const unsigned grid = unsigned(a.n_v_heads * (kDK / (16 * NW))), block = 32 * (NW + 1);
    const cudaError_t e = launch_state_kernel(gdn_chunk_state_t_kernel<NW, NS, VEC>, dim3(grid), block,
                                              sizeof(Smem), pdl, stream, a);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gdn_chunk_state_t_kernel<%d, %d, %d> (PDL)", NW,
                           NS, int(VEC));
    PF_LAUNCH_CHECK("gdn_chunk_state_t_kernel<%d, %d, %d>", NW, NS, int(VEC));
    return PF_STATUS_OK;
}

// The warpgroup state kernel: two CTAs (64 value columns each) per value head; the TMA maps of
// this pass's K, Q ([Hk nc 64][128] fp16) and Tm, P ([Hv nc 64][64]) in the workspace, boxes of
// one chunk's 64 rows x 64 columns.
template <bool VEC>
pf_status launch_state_wg(const StateArgs &a, bool pdl, cudaStream_t stream) {
    PF_TRY(set_max_dynamic_smem(gdn_chunk_state_wg_kernel<VEC>, int(kWgStateSmem),
                                "gdn_chunk_state_wg_kernel"));
    CUtensorMap maps[5];
    const int64_t krows = (int64_t)a.n_k_heads * a.nc * kC, trows = (int64_t)a.n_v_heads * a.nc * kC;
    const struct { CUtensorMap *m; const void *base; int64_t cols, rows; } spec[4] = {
        {&maps[0], a.w.kh, kDK, krows}, {&maps[1], a.w.qh, kDK, krows},
        {&maps[2], a.w.tm, kC, trows}, {&maps[3], a.w.p, kC, trows}};
    for (const auto &m : spec) {
        const CUresult r = hopper::encode_fp16_sw128(m.m, m.base, m.cols, m.rows, kC);
        if (r != CUDA_SUCCESS)
            return fail(PF_STATUS_CUDA_ERROR,
                        "gdn_chunk_scan_rows: TMA map of the workspace (%lld x %lld fp16): CUresult %d",
                        (long long)m.rows, (long long)m.cols, int(r));
    }
    if (VEC) {  // V (fp32, [rows][ldv]) in boxes of 64 rows x 32 columns, 128-byte swizzle
        const CUresult r = hopper::encode_2d_sw128(&maps[4], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, a.v,
                                                   (int64_t)a.n_v_heads * kDK, a.rows, a.ldv * 4,
                                                   32, kC);
        if (r != CUDA_SUCCESS)
            return fail(PF_STATUS_CUDA_ERROR, "gdn_chunk_scan_rows: TMA map of v (%lld rows, ld %lld): CUresult %d",
                        (long long)a.rows, (long long)a.ldv, int(r));
    } else {
        maps[4] = maps[0];  // unused: V by cp.async
    }
    const cudaError_t e = launch_state_kernel(gdn_chunk_state_wg_kernel<VEC>, dim3(unsigned(a.n_v_heads * 2)),
                                              kWgStateThreads, kWgStateSmem, pdl, stream, a,
                                              maps[0], maps[1], maps[2], maps[3], maps[4]);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gdn_chunk_state_wg_kernel<%d> (PDL)", int(VEC));
    PF_LAUNCH_CHECK("gdn_chunk_state_wg_kernel<%d>", int(VEC));
    return PF_STATUS_OK;
}

// The warpgroup kernel can run on the current device (sm90a_kernels_available, cached per device).
bool gdn_state_wg_available() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return sm90a_kernels_available(dev);
}

// Three stages of operands where the device's opt-in shared memory per block holds them (sm_90:
// 227 KB), else two (sm_80: 163 KB).
template <int NW, bool VEC>
pf_status launch_state_t(const StateArgs &a, bool pdl, cudaStream_t stream) {
    int optin = 0;
    PF_TRY(device_smem_optin(&optin));
    if (sizeof(StateTSmem<NW, 3>) <= size_t(optin)) return launch_state_t_ns<NW, 3, VEC>(a, pdl, stream);
    return launch_state_t_ns<NW, 2, VEC>(a, pdl, stream);
}

// The warp-owned state kernel with NW warps (16 value columns each) per CTA: the fewest warps
// per CTA whose CTAs still fit one wave (Hv = 32 on 132 SMs: 2 warps, 128 CTAs; Hv = 48: 4
// warps, 96 CTAs). Every warp runs its own chain; the CTA shares the chunk's operands.
template <bool VEC>
pf_status launch_state_t_fit(const StateArgs &a, int32_t sm_count, bool pdl, cudaStream_t stream) {
    const int64_t slices = (int64_t)a.n_v_heads * (kDK / 16);
    if (slices <= sm_count) return launch_state_t<1, VEC>(a, pdl, stream);
    if (slices <= 2LL * sm_count) return launch_state_t<2, VEC>(a, pdl, stream);
    if (slices <= 4LL * sm_count) return launch_state_t<4, VEC>(a, pdl, stream);
    // 8 warps where their two stages fit (sm_90); else 4 warps in more than one wave (sm_80's
    // 163 KB cannot hold two 8-warp stages).
    int optin = 0;
    PF_TRY(device_smem_optin(&optin));
    if (sizeof(StateTSmem<8, 2>) <= size_t(optin)) return launch_state_t<8, VEC>(a, pdl, stream);
    return launch_state_t<4, VEC>(a, pdl, stream);
}

// Which state kernel: env PREFILL_GDN_STATE = wg (the warpgroup kernel; an error where it is not
// available), warp (the warp-owned one), v2 (the CTA-wide one, four barriers per chunk), for
// side-by-side measurement; anything else (default): auto (below). Read per call
// (a getenv per GDN layer and pass), so that tests and benches can switch it in one process.
enum class StateKernel { kAuto, kWarp, kV2, kWg };
StateKernel gdn_state_kernel_from_env() {
    const char *e = std::getenv("PREFILL_GDN_STATE");
    if (e == nullptr) return StateKernel::kAuto;
    if (std::strcmp(e, "v2") == 0) return StateKernel::kV2;
    if (std::strcmp(e, "warp") == 0) return StateKernel::kWarp;
    if (std::strcmp(e, "wg") == 0) return StateKernel::kWg;
    return StateKernel::kAuto;
}

// Rows per chained sub-pass: kGdnSubpassRows unless env PREFILL_GDN_SUBPASS says otherwise (read
// per call, for side-by-side timing): a multiple of the 64-row chunk up to kGdnPassRows, or 0 for
// one pass of up to kGdnPassRows rows; anything else leaves the default.
int64_t gdn_subpass_rows_from_env() {
    const char *e = std::getenv("PREFILL_GDN_SUBPASS");
    if (e == nullptr || *e == '\0') return kGdnSubpassRows;
    char *end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (*end != '\0' || v < 0 || v % kC != 0 || v > kGdnPassRows) return kGdnSubpassRows;
    return int64_t(v);
}

// The state kernel's instance for (BV, V and O alignment).
template <int BV>
pf_status launch_state_bv(const StateArgs &a, bool vec_v, bool vec_o, cudaStream_t stream) {
    if (vec_v) return vec_o ? launch_state<BV, true, true>(a, stream) : launch_state<BV, true, false>(a, stream);
    return vec_o ? launch_state<BV, false, true>(a, stream) : launch_state<BV, false, false>(a, stream);
}

}  // namespace

bool gdn_chunk_supported(int32_t dk, int32_t dv) { return dk == kDK && dv == kDK; }


size_t gdn_chunk_workspace_bytes(int64_t rows, int32_t n_k_heads, int32_t n_v_heads) {
    const int64_t pass = rows < kGdnPassRows ? rows : kGdnPassRows;
    if (pass <= 0 || n_k_heads <= 0 || n_v_heads <= 0) return 0;
    return workspace_layout((pass + kC - 1) / kC, n_k_heads, n_v_heads, nullptr, nullptr);
}

int32_t gdn_scan_env_default() {
    static const int32_t value = [] {
        const char *e = std::getenv("PREFILL_GDN_SCAN");
        if (e == nullptr || *e == '\0' || std::strcmp(e, "auto") == 0) return 0;
        if (std::strcmp(e, "sequential") == 0) return 1;
        if (std::strcmp(e, "chunked") == 0) return 2;
        std::fprintf(stderr, "libprefill: PREFILL_GDN_SCAN=%.32s is not auto|sequential|chunked; "
                             "using auto\n", e);
        return 0;
    }();
    return value;
}

pf_status gdn_chunk_scan_rows(const float *q, int64_t ldq, const float *k, int64_t ldk,
                              const float *v, int64_t ldv, const float *beta, int64_t ld_beta,
                              const float *g, int64_t ld_g, float *state, float *o, int64_t ldo,
                              int64_t rows, int32_t n_k_heads, int32_t n_v_heads, int32_t dk,
                              int32_t dv, void *workspace, size_t workspace_bytes,
                              int32_t sm_count, cudaStream_t stream) {
    PF_CHECK_ARG(rows >= 0, "gdn_chunk_scan_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(n_k_heads >= 1 && n_v_heads >= 1 && n_v_heads % n_k_heads == 0,
                 "gdn_chunk_scan_rows: n_v_heads=%d must be a positive multiple of n_k_heads=%d",
                 n_v_heads, n_k_heads);
    if (!gdn_chunk_supported(dk, dv))
        return fail(PF_STATUS_UNSUPPORTED,
                    "gdn_chunk_scan_rows: the chunked delta rule is built for dk = dv = 128, "
                    "got dk=%d, dv=%d (use the sequential path)", dk, dv);
    const int64_t kw = (int64_t)n_k_heads * dk, vw = (int64_t)n_v_heads * dv;
    PF_CHECK_ARG(ldq >= kw && ldk >= kw && ldv >= vw && ldo >= vw && ld_beta >= n_v_heads &&
                     ld_g >= n_v_heads,
                 "gdn_chunk_scan_rows: a row stride is below its width");
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(q && k && v && beta && g && state && o, "gdn_chunk_scan_rows: null pointer");
    const size_t need = gdn_chunk_workspace_bytes(rows, n_k_heads, n_v_heads);
    PF_CHECK_ARG(workspace != nullptr && workspace_bytes >= need,
                 "gdn_chunk_scan_rows: workspace of %zu bytes, %zu needed", workspace_bytes, need);
    const auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec_qk = aligned(q) && aligned(k) && ldq % 4 == 0 && ldk % 4 == 0;
    const bool vec_v = aligned(v) && ldv % 4 == 0;
    const bool vec_o = reinterpret_cast<uintptr_t>(o) % 8 == 0 && ldo % 2 == 0;  // float2 stores
    // 32 value columns per state CTA when that fits one wave (Hv = 32: 128 CTAs on 132 SMs);
    // else 64 (Hv = 48: 96 CTAs), fewer CTAs with twice the state each.
    if (sm_count <= 0) PF_TRY(device_sm_count(&sm_count));
    const bool narrow = (int64_t)n_v_heads * (dv / 32) <= sm_count;
    StateKernel sk = gdn_state_kernel_from_env();
    if (sk == StateKernel::kWg && !gdn_state_wg_available())
        return fail(PF_STATUS_UNSUPPORTED,
                    "gdn_chunk_scan_rows: PREFILL_GDN_STATE=wg needs an sm_90a build on a compute "
                    "capability 9.0 device");
    // auto: the warpgroup kernel where it runs (sm_90a build, compute capability 9.0) and V's
    // rows are 16-byte aligned (its TMA map), else the warp-owned one. Device run 51 (H200, same
    // process): 0.3556 vs 0.4039 ms at 16/32 heads, T = 8192; 0.3993 vs 0.5274 at 16/48; 0.0934
    // vs 0.1064 and 0.1116 vs 0.1438 at T = 2048 (NOTES.md, session 22).
    if (sk == StateKernel::kAuto) sk = vec_v && gdn_state_wg_available() ? StateKernel::kWg : StateKernel::kWarp;
    const bool prep_v1 = gdn_prep_v1_from_env();
    int cc_major = 0;
    PF_TRY(device_cc_major(&cc_major));
    // The warp-owned state kernel as the prep kernel's programmatic dependent (compute
    // capability 9.0 and up; see pdl_wait) unless PREFILL_GDN_PDL=0 (read per call, for
    // side-by-side timing; the same kernels and bits either way).
    const bool pdl = cc_major >= 9 && env_switch_on("PREFILL_GDN_PDL");
    // Chained sub-passes of kGdnSubpassRows (PREFILL_GDN_SUBPASS=rows overrides, 0 = off; read per
    // call, for side-by-side timing). Device run s24-1 (H200, same process, ms, one pass -> 2048-row
    // sub-passes): 16/32 heads T 8192 0.3563 -> 0.3135, T 32768 1.4256 -> 1.1618; 16/48 T 8192
    // 0.4052 -> 0.4047, T 32768 1.6186 -> 1.5687 (1024-row sub-passes: slower than 2048 at 16/32
    // T 8192 / 32768 and 6-10% slower than the default at 16/48; at 16/32 T 2048, where the
    // default is one pass, 0.0938 -> 0.0923; 512: slower everywhere; 3072 / 4096, s24-2: slower
    // than 2048 at 16/32, within 1% at 16/48). The warpgroup state kernel leaves SMs idle (16/32 heads: 64 CTAs
    // on 132 SMs), so the prep of sub-pass p + 1 runs there, beside the state kernel of sub-pass
    // p, into the other half of the workspace; every launch stays in this stream, chained by
    // programmatic dependence: state(p) lets prep(p + 1) start once it has waited for prep(p),
    // whose completion implies state(p - 1)'s (the prep's last CTA waits for it), so that a
    // workspace half is rewritten only after the state grid that read it has completed, and
    // state(p) reads the state only after state(p - 1) has written it. Needs the warpgroup state
    // kernel, prep v2, PDL and a workspace of two sub-passes (else one pass as before); the
    // sub-pass boundaries are chunk boundaries, so the bits are those of one pass.
    const int64_t sub = gdn_subpass_rows_from_env();
    const size_t half = sub > 0 ? gdn_chunk_workspace_bytes(sub, n_k_heads, n_v_heads) : 0;
    // Where the state grid (2 CTAs per value head) leaves fewer than half the SMs to the prep, one
    // overlapped prep does not pay for the split: two sub-passes run as one pass there (s24-2,
    // 16/48 heads, T 4096: 0.2124 chained vs 0.2076 ms; 4 sub-passes: even, 16: 4% faster; 3 not
    // measured).
    const bool room = 4 * (int64_t)n_v_heads <= sm_count || rows > 2 * sub;
    const bool chain = sub > 0 && rows > sub && room && sk == StateKernel::kWg && !prep_v1 && pdl &&
                       workspace_bytes >= 2 * half;
    const int64_t step = chain ? sub : kGdnPassRows;
    int64_t pass = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += step, ++pass) {
        const int64_t n = rows - r0 < step ? rows - r0 : step;
        const int32_t nc = int32_t((n + kC - 1) / kC);
        Workspace w{};
        workspace_layout(nc, n_k_heads, n_v_heads,
                         static_cast<char *>(workspace) + (chain ? size_t(pass & 1) * half : 0), &w);
        const PrepArgs pa{q + r0 * ldq, ldq, k + r0 * ldk, ldk, beta + r0 * ld_beta, ld_beta,
                          g + r0 * ld_g, ld_g, n, n_k_heads, n_v_heads, nc, w};
        const bool prep_pdl = chain && pass > 0;
        if (prep_v1)
            PF_TRY(vec_qk ? launch_prep<true>(pa, stream) : launch_prep<false>(pa, stream));
        else
            PF_TRY(vec_qk ? launch_prep_v2<true>(pa, prep_pdl, stream) : launch_prep_v2<false>(pa, prep_pdl, stream));
        const StateArgs sa{v + r0 * ldv, ldv, state, o + r0 * ldo, ldo, n, n_k_heads, n_v_heads, nc, w,
                           chain ? 1 : 0};
        if (sk == StateKernel::kWg)
            PF_TRY(vec_v ? launch_state_wg<true>(sa, pdl, stream) : launch_state_wg<false>(sa, pdl, stream));
        else if (sk == StateKernel::kWarp)
            PF_TRY(vec_v ? launch_state_t_fit<true>(sa, sm_count, pdl, stream)
                         : launch_state_t_fit<false>(sa, sm_count, pdl, stream));
        else
            PF_TRY(narrow ? launch_state_bv<32>(sa, vec_v, vec_o, stream)
                          : launch_state_bv<64>(sa, vec_v, vec_o, stream));
    }
    return PF_STATUS_OK;
}

}  // namespace pf
