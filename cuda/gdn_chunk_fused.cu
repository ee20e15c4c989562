// gdn_chunk_fused.cu — an experiment kept behind PREFILL_GDN_CHUNK=fused: the chunked delta
// rule (spec §3.2.1) as ONE kernel per (value head, 32 value columns) that does everything of a
// chunk in its CTA (K K^T, Q K^T, the 64x64 inverse, the state steps). It was the first version
// (measured: 1.32 ms at T = 8192, 16/32 heads, latency-bound at 11 barriers per chunk; see
// NOTES.md, 2026-11-30) and needs no workspace. gdn_chunk.cu's prep + state kernels replace it;
// it stays as a checked alternative until the split version has run everywhere.
//
// Same algorithm, precision and tests as gdn_chunk.cu (tests/python/test_kernel_gdn.py runs the
// chunked tests on both).
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "cuda_check.cuh"
#include "gdn.cuh"

namespace pf {
namespace {

constexpr int kC = 64;          // chunk rows (spec §3.2.1)
constexpr int kDK = 128;        // dk = dv of the chunked path (all qwen35 sizes)
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kLdH = kDK + 8;   // fp16 row stride of K, Q: 272 B, ldmatrix rows hit 8 distinct 16 B bank groups
constexpr int kLdF = kC + 4;    // fp32 row stride of A, Tm: fragment reads (row g, col tig) conflict-free
constexpr int kLdP = kC + 8;    // fp16 row stride of P: 144 B
constexpr int kLdX = 32 + 4;    // fp32 merge scratch (32 x 32)
constexpr float kScaleTop = 14.0f;  // scaled fp16 tiles: max |x| in [2^14, 2^15)

template <int BV>
struct ChunkSmem {
    static constexpr int kLdV = BV + 8;   // fp16 [.][BV] tiles: 16 B row shift mod 128 B
    static constexpr int kLdVf = BV + 4;  // fp32 V staging (16 B-aligned rows for cp.async)
    float kst[kC][kDK];      // fp32 K of the next chunk (cp.async)
    float qst[kC][kDK];      // fp32 Q of the next chunk
    float vst[kC][kLdVf];    // fp32 V slice of the chunk
    float gst[kC];           // g of the next chunk
    float bst[kC];           // beta of the next chunk
    __half kh[kC][kLdH];     // K (fp16)
    __half qh[kC][kLdH];     // Q (fp16)
    float as[kC][kLdF];      // A, strictly lower
    float ts[kC][kLdF];      // Tm = (I + A)^-1, lower
    float xs[32][kLdX];      // merge scratch
    __half ph[kC][kLdP];     // P = (Q K^T) Gam, lower incl. diagonal
    __half sh[kDK][kLdV];    // S * sigma_S
    __half rh[kC][kLdV];     // R * sigma_R
    __half vph[kC][kLdV];    // V' * sigma_V
    __half vdh[kC][kLdV];    // e^(gamma_last - gamma) V' * sigma_V
    float gam[kC];           // gamma
    float egam[kC];          // e^gamma
    float edec[kC];          // e^(gamma_last - gamma)
    float beta[kC];
    unsigned max_r, max_t, max_v, max_s[2];  // max |x| bit patterns (non-negative floats order as uints)
};

struct ChunkArgs {
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
    int32_t n_v_heads;
};

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

// ---------------------------------------------------------------------------------- kernel

template <int BV, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunk_fused_kernel(const __grid_constant__ ChunkArgs a) {
    constexpr int NT = BV / 8;  // n-tiles of the value slice
    using Smem = ChunkSmem<BV>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &s = *reinterpret_cast<Smem *>(smem_raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;  // mma fragment row group / thread in group
    const int strip = warp & 3;                 // 16-row strip of the chunk
    const int half = warp >> 2;                 // 0: K side, 1: Q side
    const int slices = kDK / BV;
    const int j = blockIdx.x / slices;          // value head
    const int col0 = (blockIdx.x % slices) * BV;
    const int jk = j % a.n_k_heads;             // tiled pairing (qwen35 GGUF, spec G6)
    const float *qg = a.q + (int64_t)jk * kDK;
    const float *kg = a.k + (int64_t)jk * kDK;
    const float *vg = a.v + (int64_t)j * kDK + col0;
    float *og = a.o + (int64_t)j * kDK + col0;
    float *state = a.state + (int64_t)j * kDK * kDK + col0;
    const int64_t n_chunks = (a.rows + kC - 1) / kC;

    // Stage chunk c's K, Q, g, beta (one commit group) and, separately, its V slice. Rows past
    // the end read as zero (q = k = v = 0, beta = g = 0 change nothing, spec §3.2.1).
    const auto stage_kq = [&](int64_t c) {
        const int64_t t0 = c * kC;
        if (VEC) {
#pragma unroll 4
            for (int e = tid; e < kC * kDK / 4; e += kThreads) {
                const int i = e / (kDK / 4), d = (e % (kDK / 4)) * 4;
                const bool ok = t0 + i < a.rows;
                const int64_t t = ok ? t0 + i : 0;
                cp_async16(&s.kst[i][d], kg + t * a.ldk + d, ok);
                cp_async16(&s.qst[i][d], qg + t * a.ldq + d, ok);
            }
        } else {
            for (int e = tid; e < kC * kDK; e += kThreads) {
                const int i = e / kDK, d = e % kDK;
                const bool ok = t0 + i < a.rows;
                const int64_t t = ok ? t0 + i : 0;
                cp_async4(&s.kst[i][d], kg + t * a.ldk + d, ok);
                cp_async4(&s.qst[i][d], qg + t * a.ldq + d, ok);
            }
        }
        if (tid < 2 * kC) {
            const int i = tid % kC;
            const bool ok = t0 + i < a.rows;
            const int64_t t = ok ? t0 + i : 0;
            if (tid < kC) cp_async4(&s.gst[i], a.g + t * a.ld_g + j, ok);
            else cp_async4(&s.bst[i], a.beta + t * a.ld_beta + j, ok);
        }
        cp_async_commit();
    };
    const auto stage_v = [&](int64_t c) {
        const int64_t t0 = c * kC;
        if (VEC) {
            for (int e = tid; e < kC * BV / 4; e += kThreads) {
                const int i = e / (BV / 4), d = (e % (BV / 4)) * 4;
                const bool ok = t0 + i < a.rows;
                cp_async16(&s.vst[i][d], vg + (ok ? t0 + i : 0) * a.ldv + d, ok);
            }
        } else {
            for (int e = tid; e < kC * BV; e += kThreads) {
                const int i = e / BV, d = e % BV;
                const bool ok = t0 + i < a.rows;
                cp_async4(&s.vst[i][d], vg + (ok ? t0 + i : 0) * a.ldv + d, ok);
            }
        }
        cp_async_commit();
    };

    stage_kq(0);
    stage_v(0);

    // The state slice: warp w holds rows [16w, 16w + 16) x BV columns as mma accumulators.
    float S[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * warp + g8 + 8 * h;
            const float *x = state + (int64_t)row * kDK + 8 * nt + 2 * tig;  // any float offset
            S[nt][2 * h] = x[0];
            S[nt][2 * h + 1] = x[1];
        }
    if (tid == 0) {
        s.max_r = s.max_t = s.max_v = 0u;
        s.max_s[0] = s.max_s[1] = 0u;
    }
    // Tm's blocks above the diagonal are never written and must read as zero in the merges.
    for (int e = tid; e < kC * kLdF; e += kThreads) s.ts[e / kLdF][e % kLdF] = 0.0f;
    __syncthreads();
    {
        float m = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) m = fmaxf(m, fabsf(S[nt][e]));
        publish_max(&s.max_s[0], m);
    }
    __syncthreads();
    float sig_s = pow2_scale(s.max_s[0]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<uint32_t *>(&s.sh[16 * warp + g8 + 8 * h][8 * nt + 2 * tig]) =
                pack_half2(S[nt][2 * h] * sig_s, S[nt][2 * h + 1] * sig_s);

    for (int64_t c = 0; c < n_chunks; ++c) {
        const int slot = (int)(c & 1);  // max_s slot of the state entering chunk c
        // ---- P0: the staged chunk lands; K, Q to fp16; gamma and the decays.
        cp_async_wait_all();
        __syncthreads();
        if (tid == 0) {
            s.max_r = s.max_t = s.max_v = 0u;
            s.max_s[slot ^ 1] = 0u;
        }
        for (int e = tid; e < kC * kDK / 4; e += kThreads) {
            const int i = e / (kDK / 4), d = (e % (kDK / 4)) * 4;
            const float4 kx = *reinterpret_cast<const float4 *>(&s.kst[i][d]);
            const float4 qx = *reinterpret_cast<const float4 *>(&s.qst[i][d]);
            uint2 kp, qp;
            kp.x = pack_half2(kx.x, kx.y);
            kp.y = pack_half2(kx.z, kx.w);
            qp.x = pack_half2(qx.x, qx.y);
            qp.y = pack_half2(qx.z, qx.w);
            *reinterpret_cast<uint2 *>(&s.kh[i][d]) = kp;
            *reinterpret_cast<uint2 *>(&s.qh[i][d]) = qp;
        }
        if (warp == 0) {  // inclusive scan of g over 64 rows, two per lane, fp32
            const float g0 = s.gst[2 * lane], g1 = s.gst[2 * lane + 1];
            float x = g0 + g1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            const float hi = x, lo = x - g1;  // gamma at rows 2l+1 and 2l
            const float last = __shfl_sync(0xffffffffu, x, 31);
            s.gam[2 * lane] = lo;
            s.gam[2 * lane + 1] = hi;
            s.egam[2 * lane] = __expf(lo);
            s.egam[2 * lane + 1] = __expf(hi);
            s.edec[2 * lane] = __expf(last - lo);  // <= 0 exponents: no overflow
            s.edec[2 * lane + 1] = __expf(last - hi);
            s.beta[2 * lane] = s.bst[2 * lane];
            s.beta[2 * lane + 1] = s.bst[2 * lane + 1];
        }
        __syncthreads();
        if (c + 1 < n_chunks) stage_kq(c + 1);  // staging buffers are free: overlap the chunk

        // ---- P1: [K; Q] S (K side: strip rows of K, Q side: of Q) and K K^T / Q K^T strips.
        const __half(*xh)[kLdH] = half == 0 ? s.kh : s.qh;
        const int r0 = 16 * strip;
        float accs[NT][4];
        float acck[8][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) accs[nt][e] = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acck[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kDK / 16; ++ks) {
            uint32_t af[4];
            ldsm_x4(af, &xh[r0 + lrow_a(lane)][16 * ks + lcol_a(lane)]);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                uint32_t bf[4];
                ldsm_x4_t(bf, &s.sh[16 * ks + lrow_a(lane)][16 * np + lcol_a(lane)]);
                mma_f16(accs[2 * np], af, bf[0], bf[1]);
                mma_f16(accs[2 * np + 1], af, bf[2], bf[3]);
            }
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                if (np > strip) continue;  // column tiles right of the diagonal block: masked
                uint32_t bf[4];
                ldsm_x4(bf, &s.kh[16 * np + lrow_b(lane)][16 * ks + lcol_b(lane)]);
                mma_f16(acck[2 * np], af, bf[0], bf[1]);
                mma_f16(acck[2 * np + 1], af, bf[2], bf[3]);
            }
        }
        const float inv_s = 1.0f / sig_s;
        float rr[NT][4];  // K side: R = beta (V - e^gamma K S); Q side: O part e^gamma Q S
        {
            float m = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = r0 + g8 + 8 * h;
                const float gi = s.gam[i], bi = s.beta[i], ei = s.egam[i];
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    if (nt > 2 * strip + 1) continue;
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int jj = 8 * nt + 2 * tig + e;
                        const float x = acck[nt][2 * h + e];
                        if (half == 0) {
                            s.as[i][jj] = i > jj ? bi * x * __expf(gi - s.gam[jj]) : 0.0f;
                        } else {
                            s.ph[i][jj] = __float2half_rn(
                                i >= jj ? x * __expf(gi - s.gam[jj]) : 0.0f);
                        }
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float ks_ = accs[nt][2 * h + e] * inv_s * ei;
                        if (half == 0) {
                            const float r = bi * (s.vst[i][8 * nt + 2 * tig + e] - ks_);
                            rr[nt][2 * h + e] = r;
                            m = fmaxf(m, fabsf(r));
                        } else {
                            rr[nt][2 * h + e] = ks_;
                        }
                    }
            }
            if (half == 0) publish_max(&s.max_r, m);
        }
        __syncthreads();
        if (c + 1 < n_chunks) stage_v(c + 1);  // V of this chunk has been read

        // ---- P2: K side writes R (scaled fp16); Q side inverts the diagonal 16x16 blocks of
        // (I + A) by forward substitution in fp32 (lane l < 16 owns column l of its block).
        if (half == 0) {
            const float sr = pow2_scale(s.max_r);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<uint32_t *>(&s.rh[r0 + g8 + 8 * h][8 * nt + 2 * tig]) =
                        pack_half2(rr[nt][2 * h] * sr, rr[nt][2 * h + 1] * sr);
        } else {
            const int b0 = 16 * strip;
            const int col = lane & 15;
            float x[16];
            float m = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                float acc = 0.0f;
#pragma unroll
                for (int mm = 0; mm < i; ++mm) acc = fmaf(s.as[b0 + i][b0 + mm], x[mm], acc);
                x[i] = i == col ? 1.0f : (i < col ? 0.0f : -acc);
                m = fmaxf(m, fabsf(x[i]));
            }
            if (lane < 16) {
#pragma unroll
                for (int i = 0; i < 16; ++i) s.ts[b0 + i][b0 + col] = x[i];
            }
            publish_max(&s.max_t, m);
        }
        __syncthreads();

        // ---- P3: merge 16 -> 32: blocks (1,0) and (3,2): X = A_rc Tm_cc, Tm_rc = -Tm_rr X.
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

        // ---- P4: merge 32 -> 64: X = A[32:64][0:32] Tm[0:32][0:32];
        // Tm[32:64][0:32] = -Tm[32:64][32:64] X. Warp w: rows 16(w/4).., columns 8(w%4)..
        {
            const int mt = warp >> 2, nt = warp & 3;
            float acc[4] = {};
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const int k0 = 8 * ks;
                mma_tf32(acc, to_tf32(s.as[32 + 16 * mt + g8][k0 + tig]),
                         to_tf32(s.as[32 + 16 * mt + g8 + 8][k0 + tig]),
                         to_tf32(s.as[32 + 16 * mt + g8][k0 + tig + 4]),
                         to_tf32(s.as[32 + 16 * mt + g8 + 8][k0 + tig + 4]),
                         to_tf32(s.ts[k0 + tig][8 * nt + g8]),
                         to_tf32(s.ts[k0 + tig + 4][8 * nt + g8]));
            }
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s.xs[16 * mt + g8 + 8 * (e >> 1)][8 * nt + 2 * tig + (e & 1)] = acc[e];
        }
        __syncthreads();
        {
            const int mt = warp >> 2, nt = warp & 3;
            float acc[4] = {};
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                const int k0 = 8 * ks;
                mma_tf32(acc, to_tf32(s.ts[32 + 16 * mt + g8][32 + k0 + tig]),
                         to_tf32(s.ts[32 + 16 * mt + g8 + 8][32 + k0 + tig]),
                         to_tf32(s.ts[32 + 16 * mt + g8][32 + k0 + tig + 4]),
                         to_tf32(s.ts[32 + 16 * mt + g8 + 8][32 + k0 + tig + 4]),
                         to_tf32(s.xs[k0 + tig][8 * nt + g8]),
                         to_tf32(s.xs[k0 + tig + 4][8 * nt + g8]));
            }
            float m = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s.ts[32 + 16 * mt + g8 + 8 * (e >> 1)][8 * nt + 2 * tig + (e & 1)] = -acc[e];
                m = fmaxf(m, fabsf(acc[e]));
            }
            publish_max(&s.max_t, m);
        }
        __syncthreads();

        // ---- P5: V' = Tm R. Warp (strip, half): rows of the strip, half of the value columns;
        // Tm's fp32 rows become fp16 A fragments (scaled by sigma_T) as they are loaded.
        constexpr int NH = NT / 2;  // n-tiles per warp
        float vp[NH][4];
        {
            const float st = pow2_scale(s.max_t);
            const float sr = pow2_scale(s.max_r);
#pragma unroll
            for (int nt = 0; nt < NH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) vp[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                if (ks > strip) continue;  // Tm is lower triangular
                uint32_t af[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int row = r0 + g8 + 8 * (q & 1), colk = 16 * ks + 2 * tig + 8 * (q >> 1);
                    const float2 t2 = *reinterpret_cast<const float2 *>(&s.ts[row][colk]);
                    af[q] = pack_half2(t2.x * st, t2.y * st);
                }
#pragma unroll
                for (int np = 0; np < NH / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.rh[16 * ks + lrow_a(lane)]
                                       [8 * NH * half + 16 * np + lcol_a(lane)]);
                    mma_f16(vp[2 * np], af, bf[0], bf[1]);
                    mma_f16(vp[2 * np + 1], af, bf[2], bf[3]);
                }
            }
            const float unscale = 1.0f / (st * sr);
            float m = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NH; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    vp[nt][e] *= unscale;
                    m = fmaxf(m, fabsf(vp[nt][e]));
                }
            publish_max(&s.max_v, m);
        }
        __syncthreads();
        const float sig_v = pow2_scale(s.max_v);
#pragma unroll
        for (int nt = 0; nt < NH; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r0 + g8 + 8 * h, col = 8 * NH * half + 8 * nt + 2 * tig;
                const float d = s.edec[row] * sig_v;
                *reinterpret_cast<uint32_t *>(&s.vph[row][col]) =
                    pack_half2(vp[nt][2 * h] * sig_v, vp[nt][2 * h + 1] * sig_v);
                *reinterpret_cast<uint32_t *>(&s.vdh[row][col]) =
                    pack_half2(vp[nt][2 * h] * d, vp[nt][2 * h + 1] * d);
            }
        __syncthreads();

        // ---- P6: O = e^gamma Q S + P V' (Q side), S = e^gamma_last S + K^T (e^(..) V') (all).
        const float inv_v = 1.0f / sig_v;
        if (half == 1) {
            float acc[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                if (ks > strip) continue;  // P is lower triangular
                uint32_t af[4];
                ldsm_x4(af, &s.ph[r0 + lrow_a(lane)][16 * ks + lcol_a(lane)]);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.vph[16 * ks + lrow_a(lane)][16 * np + lcol_a(lane)]);
                    mma_f16(acc[2 * np], af, bf[0], bf[1]);
                    mma_f16(acc[2 * np + 1], af, bf[2], bf[3]);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = r0 + g8 + 8 * h;
                const int64_t t = c * kC + i;
                if (t < a.rows) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        float *out = og + t * a.ldo + 8 * nt + 2 * tig;  // any float offset
                        out[0] = rr[nt][2 * h] + acc[nt][2 * h] * inv_v;
                        out[1] = rr[nt][2 * h + 1] + acc[nt][2 * h + 1] * inv_v;
                    }
                }
            }
        }
        {
            float acc[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                uint32_t af[4];  // (K^T)[a][i] = K[i][a]: the transpose of kh, via ldmatrix.trans
                ldsm_x4_t(af, &s.kh[16 * ks + lrow_b(lane)][16 * warp + lcol_b(lane)]);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4_t(bf, &s.vdh[16 * ks + lrow_a(lane)][16 * np + lcol_a(lane)]);
                    mma_f16(acc[2 * np], af, bf[0], bf[1]);
                    mma_f16(acc[2 * np + 1], af, bf[2], bf[3]);
                }
            }
            const float el = s.egam[kC - 1];  // e^gamma_last
            float m = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    S[nt][e] = fmaf(el, S[nt][e], acc[nt][e] * inv_v);
                    m = fmaxf(m, fabsf(S[nt][e]));
                }
            publish_max(&s.max_s[slot ^ 1], m);
        }
        __syncthreads();
        // ---- P7: the state entering the next chunk, scaled to fp16 (read after P0's barriers).
        sig_s = pow2_scale(s.max_s[slot ^ 1]);
        if (c + 1 < n_chunks) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<uint32_t *>(
                        &s.sh[16 * warp + g8 + 8 * h][8 * nt + 2 * tig]) =
                        pack_half2(S[nt][2 * h] * sig_s, S[nt][2 * h + 1] * sig_s);
        }
    }
    cp_async_wait_all();  // nothing is in flight by now; keep the invariant explicit
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * warp + g8 + 8 * h;
            float *x = state + (int64_t)row * kDK + 8 * nt + 2 * tig;
            x[0] = S[nt][2 * h];
            x[1] = S[nt][2 * h + 1];
        }
}

template <int BV, bool VEC>
pf_status launch_chunk(const ChunkArgs &a, int blocks, cudaStream_t stream) {
    const size_t smem = sizeof(ChunkSmem<BV>);
    PF_TRY(set_max_dynamic_smem(gdn_chunk_fused_kernel<BV, VEC>, int(smem), "gdn_chunk_fused_kernel"));
    gdn_chunk_fused_kernel<BV, VEC><<<blocks, kThreads, smem, stream>>>(a);
    PF_LAUNCH_CHECK("gdn_chunk_fused_kernel<%d, %d>", BV, int(VEC));
    return PF_STATUS_OK;
}

}  // namespace

pf_status gdn_chunk_fused_scan_rows(const float *q, int64_t ldq, const float *k, int64_t ldk,
                              const float *v, int64_t ldv, const float *beta, int64_t ld_beta,
                              const float *g, int64_t ld_g, float *state, float *o, int64_t ldo,
                              int64_t rows, int32_t n_k_heads, int32_t n_v_heads, int32_t dk,
                              int32_t dv, int32_t sm_count, cudaStream_t stream) {
    PF_CHECK_ARG(rows >= 0, "gdn_chunk_fused_scan_rows: rows=%lld < 0", (long long)rows);
    PF_CHECK_ARG(n_k_heads >= 1 && n_v_heads >= 1 && n_v_heads % n_k_heads == 0,
                 "gdn_chunk_fused_scan_rows: n_v_heads=%d must be a positive multiple of n_k_heads=%d",
                 n_v_heads, n_k_heads);
    if (!gdn_chunk_supported(dk, dv))
        return fail(PF_STATUS_UNSUPPORTED,
                    "gdn_chunk_fused_scan_rows: the chunked delta rule is built for dk = dv = 128, "
                    "got dk=%d, dv=%d (use the sequential path)", dk, dv);
    const int64_t kw = (int64_t)n_k_heads * dk, vw = (int64_t)n_v_heads * dv;
    PF_CHECK_ARG(ldq >= kw && ldk >= kw && ldv >= vw && ldo >= vw && ld_beta >= n_v_heads &&
                     ld_g >= n_v_heads,
                 "gdn_chunk_fused_scan_rows: a row stride is below its width");
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(q && k && v && beta && g && state && o, "gdn_chunk_fused_scan_rows: null pointer");
    const auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = aligned(q) && aligned(k) && aligned(v) && ldq % 4 == 0 && ldk % 4 == 0 &&
                     ldv % 4 == 0;
    const ChunkArgs a{q, ldq, k, ldk, v, ldv, beta, ld_beta, g, ld_g, state, o, ldo, rows,
                      n_k_heads, n_v_heads};
    // 32 value columns per CTA when that does not exceed one wave (Hv = 32: 128 CTAs on 132
    // SMs); else 64 (Hv = 48: 96 CTAs), fewer CTAs with twice the state per CTA.
    if (sm_count <= 0) PF_TRY(device_sm_count(&sm_count));
    const bool narrow = (int64_t)n_v_heads * (dv / 32) <= sm_count;
    const int blocks = narrow ? n_v_heads * (dv / 32) : n_v_heads * (dv / 64);
    if (narrow) return vec ? launch_chunk<32, true>(a, blocks, stream)
                           : launch_chunk<32, false>(a, blocks, stream);
    return vec ? launch_chunk<64, true>(a, blocks, stream) : launch_chunk<64, false>(a, blocks, stream);
}

}  // namespace pf
