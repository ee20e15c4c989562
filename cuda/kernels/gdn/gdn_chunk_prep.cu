// gdn_chunk_prep.cu — the prep kernel of the chunked delta rule (gdn_chunk.cu): per chunk and
// key head, K and Q to fp16, K K^T and Q K^T, and per value head the gates, A, Tm = (I + A)^-1
// and P into the pass's workspace.
#include "base/cuda_check.cuh"
#include "kernels/gdn/gdn_chunk.cuh"

namespace pf {
namespace gdnc {
namespace {

// Gates of value head j for chunk c (one warp; rows cr.t0 .. cr.t0 + cr.lim - 1, zeros after),
// in two halves so that the K/Q loads go out between them: prep_gates_load reads the lane's two
// rows of g and beta, prep_gates_store takes the inclusive scan of g (fp32): gamma, beta into
// gam[64], bet[64] and the workspace.
struct GateRows {
    float g0, g1, b0, b1;
};
__device__ __forceinline__ GateRows prep_gates_load(const PrepArgs &a, ChunkRows cr, int j) {
    const int lane = threadIdx.x & 31;
    const int64_t t0 = cr.t0;
    GateRows r{0.0f, 0.0f, 0.0f, 0.0f};
    if (2 * lane < cr.lim) {
        r.g0 = a.g.ptr[(t0 + 2 * lane) * a.g.ld + j];
        r.b0 = a.beta.ptr[(t0 + 2 * lane) * a.beta.ld + j];
    }
    if (2 * lane + 1 < cr.lim) {
        r.g1 = a.g.ptr[(t0 + 2 * lane + 1) * a.g.ld + j];
        r.b1 = a.beta.ptr[(t0 + 2 * lane + 1) * a.beta.ld + j];
    }
    return r;
}
__device__ __forceinline__ void prep_gates_store(const PrepArgs &a, int c, int j, GateRows r, float *gam,
                                                 float *bet) {
    const int lane = threadIdx.x & 31;
    const size_t hc = (size_t)j * a.nc + c;
    float x = r.g0 + r.g1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    const float lo = x - r.g1;
    gam[2 * lane] = lo;
    gam[2 * lane + 1] = x;
    bet[2 * lane] = r.b0;
    bet[2 * lane + 1] = r.b1;
    *reinterpret_cast<float2 *>(a.w.gam + hc * kC + 2 * lane) = make_float2(lo, x);
    *reinterpret_cast<float2 *>(a.w.bet + hc * kC + 2 * lane) = make_float2(r.b0, r.b1);
}

// K and Q rows of key head jk, chunk c (rows cr.t0 .. cr.t0 + cr.lim - 1), to fp16: into the
// shared tiles kh, qh and, when `store`, the workspace (rows past the chunk's: zero). NT threads (t: this thread's index), loads
// in batches of 8 float4 per thread all issued before any store: the compiler may not move a
// load of q or k above a store to the workspace (they could alias), and one load in flight per
// thread left the first prep kernel waiting on DRAM latency (ncu: long scoreboard, 40% of the
// stall samples).
template <bool VEC, int NT>
__device__ __forceinline__ void prep_load_kq(const PrepArgs &a, int c, ChunkRows cr, int jk, int t,
                                             __half (*kh)[kLdH], __half (*qh)[kLdH], bool store) {
    constexpr int kLoads = 8;
    constexpr int kIters = kC * kDK / 4 / NT;  // float4 per thread and matrix
    constexpr int kRowsPerIt = NT / (kDK / 4);  // rows one iteration covers: the thread's column d is fixed
    static_assert(kIters % kLoads == 0 && NT % (kDK / 4) == 0, "batches");
    // The thread's first row i0 and column d; each iteration moves kRowsPerIt rows down, so the
    // addresses are pointers advanced by a stride (the first form derived each one from the
    // element index with 64-bit multiplies; the load phase was a sixth of the instructions).
    const int i0 = t / (kDK / 4), d = (t % (kDK / 4)) * 4;
    const float *kp = a.k.row(cr.t0 + i0) + (int64_t)jk * kDK + d;
    const float *qp = a.q.row(cr.t0 + i0) + (int64_t)jk * kDK + d;
    const int64_t kstep = kRowsPerIt * a.k.ld, qstep = kRowsPerIt * a.q.ld;
    const size_t kq_off = ((size_t)jk * a.nc + c) * kC * kDK + (size_t)i0 * kDK + d;
    __half *wk = a.w.kh + kq_off, *wq = a.w.qh + kq_off;
#pragma unroll 1
    for (int it0 = 0; it0 < kIters; it0 += kLoads) {
        float4 kx[kLoads], qx[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int i = i0 + (it0 + u) * kRowsPerIt;
            kx[u] = qx[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (i < cr.lim) {
                if (VEC) {
                    kx[u] = __ldg(reinterpret_cast<const float4 *>(kp));
                    qx[u] = __ldg(reinterpret_cast<const float4 *>(qp));
                } else {
                    kx[u] = make_float4(__ldg(kp), __ldg(kp + 1), __ldg(kp + 2), __ldg(kp + 3));
                    qx[u] = make_float4(__ldg(qp), __ldg(qp + 1), __ldg(qp + 2), __ldg(qp + 3));
                }
            }
            kp += kstep;
            qp += qstep;
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int i = i0 + (it0 + u) * kRowsPerIt;
            uint2 kp2, qp2;
            kp2.x = pack_half2(kx[u].x, kx[u].y);
            kp2.y = pack_half2(kx[u].z, kx[u].w);
            qp2.x = pack_half2(qx[u].x, qx[u].y);
            qp2.y = pack_half2(qx[u].z, qx[u].w);
            *reinterpret_cast<uint2 *>(&kh[i][d]) = kp2;
            *reinterpret_cast<uint2 *>(&qh[i][d]) = qp2;
            if (store) {
                *reinterpret_cast<uint2 *>(wk + (size_t)u * kRowsPerIt * kDK) = kp2;
                *reinterpret_cast<uint2 *>(wq + (size_t)u * kRowsPerIt * kDK) = qp2;
            }
        }
        wk += (size_t)kLoads * kRowsPerIt * kDK;
        wq += (size_t)kLoads * kRowsPerIt * kDK;
    }
}

// ---------------------------------------------------------------------------------- prep kernel
// Everything of a chunk that does not depend on the state (see gdn_chunk.cu), for every chunk of a
// pass in parallel. The first form of this kernel (v1: value heads in turn, ~19 barriers per CTA,
// 111 KB of shared memory, 2 CTAs of 4 warps per SM; ncu, H200, qwen35-4b, 8192 rows: 157-194 us,
// 1.4 TB/s, IPC 1.5) was replaced by this one, which writes the same bytes (every fp32 value from
// the same operations on the same operands in the same order); v1 was deleted once the NOTES archive kept
// its numbers (archive, sessions 21-23). Here:
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
constexpr int kPrepThreads = 128;
constexpr int kPrepWarps = kPrepThreads / 32;

template <int NH>
struct PrepSmem {
    union {
        struct {  // phase 1: K, Q in fp16, the operands of K K^T and Q K^T
            __half kh[kC][kLdH];
            __half qh[kC][kLdH];
        } in;
        struct {  // phase 2: per head, Tm (lower) + A^T (strict upper); X of the merges per warp
            float t[NH][kC][kLdF];
            float xs[kPrepWarps][NH][32][8];  // row stride 8: B-fragment reads (row tig, col g8) hit 32 banks
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

// The CTA's work: chunk c of key head jk and the NH value heads jk + (NH round + h) Hk, h < NH.
struct PrepCta {
    int round, c, jk;
};
// The (value head, chunk) index of the CTA's head h: its place in the workspace's Tm, P, meta.
template <int NH>
__device__ __forceinline__ size_t prep_hc(const PrepArgs &a, PrepCta p, int h) {
    return (size_t)(p.jk + (NH * p.round + h) * a.n_k_heads) * a.nc + p.c;
}

// K K^T and Q K^T, row strip `warp` of both (k steps 0..7 in order), into the warp's mma
// accumulators. Only n-tiles nt <= 2 warp + 1 (the lower triangle) are computed; A and P need
// nothing else.
template <int NH>
__device__ __forceinline__ void prep_products(const PrepSmem<NH> &s, int warp, int lane, float (&ak)[8][4],
                                              float (&aq)[8][4]) {
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
            mma_m16n8k16(ak[2 * np], fk, bf[0], bf[1]);
            mma_m16n8k16(ak[2 * np + 1], fk, bf[2], bf[3]);
            mma_m16n8k16(aq[2 * np], fq, bf[0], bf[1]);
            mma_m16n8k16(aq[2 * np + 1], fq, bf[2], bf[3]);
        }
    }
}

// A (transposed, strict upper triangle of the head's tile) and P (straight to the workspace
// as fp16, zeros above the diagonal) for row strip `warp`, from the accumulators: v1's
// expressions (d shared by A and P; bi * kk * d multiplied left to right). The heads are the
// innermost loop so that each accumulator dies after its last use (register pressure). It takes
// the gates and tiles as arrays, not PrepSmem: a room is simplified before it is inlined, and
// from the struct the arrays' shared-memory offsets end up in registers instead of in the loads'
// immediates (the code of the kernel before the split, instruction for instruction).
template <int NH>
__device__ __forceinline__ void prep_a_and_p(const PrepArgs &a, const float (&gam)[NH][kC],
                                             const float (&beta)[NH][kC], float (&t)[NH][kC][kLdF], PrepCta p,
                                             int warp, int g8, int tig, const float (&ak)[8][4],
                                             const float (&aq)[8][4]) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = 16 * warp + g8 + 8 * hr;
        float gi[NH], bi[NH];
#pragma unroll
        for (int h = 0; h < NH; ++h) gi[h] = gam[h][i], bi[h] = beta[h][i];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int h = 0; h < NH; ++h) {
                float pv[2] = {0.0f, 0.0f};
                if (nt <= 2 * warp + 1) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = 8 * nt + 2 * tig + e;
                        const float d = col <= i ? exp_ftz(gi[h] - gam[h][col]) : 0.0f;  // exponent <= 0
                        if (col < i) t[h][col][i] = bi[h] * ak[nt][2 * hr + e] * d;  // A_i,col at [col][i]
                        pv[e] = col <= i ? aq[nt][2 * hr + e] * d : 0.0f;
                    }
                }
                *reinterpret_cast<uint32_t *>(a.w.p + (prep_hc<NH>(a, p, h) * kC + i) * kC + 8 * nt + 2 * tig) =
                    pack_half2(pv[0], pv[1]);
            }
        }
    }
}

// Diagonal 16x16 blocks of (I + A)^-1: warp w owns block w, lane l < 16 column l (lanes
// 16..31 repeat 0..15); v1's two FMA chains, the NH heads interleaved. The warp's block of A
// must be complete (it wrote all of it: __syncwarp before).
template <int NH>
__device__ __forceinline__ void prep_diagonal_inverse(PrepSmem<NH> &s, int warp, int lane) {
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

// One m16n8 fragment per head of a product over KS k-steps of 8 on TF32 tensor cores, the NH
// heads interleaved: acc[h] = sum_k A_h(rows r, r + 8; k) B_h(k; the lane's column), from
// a(h, row, kk) (row 0 or 8 of the fragment, kk its k index) and b(h, kk). prep_merge's two
// products (X = A_rc Tm_cc, then Tm_rr X).
template <int NH, int KS, class AFn, class BFn>
__device__ __forceinline__ void merge_product(float (&acc)[NH][4], int tig, AFn a, BFn b) {
#pragma unroll
    for (int h = 0; h < NH; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        const int k0 = 8 * ks;
#pragma unroll
        for (int h = 0; h < NH; ++h)
            mma_m16n8k8_tf32(acc[h], to_tf32(a(h, 0, k0 + tig)), to_tf32(a(h, 8, k0 + tig)),
                             to_tf32(a(h, 0, k0 + tig + 4)), to_tf32(a(h, 8, k0 + tig + 4)),
                             to_tf32(b(h, k0 + tig)), to_tf32(b(h, k0 + tig + 4)));
    }
}

// One level of the block merges of Tm = (I + A)^-1 (the two levels, 16 -> 32 and 32 -> 64,
// are this one loop): for the off-diagonal block of rows rb .. rb + 16 MT - 1 and columns cb ..
// cb + 16 MT - 1, the warp's 8 output columns cb + 8 nt ..: X = A_rc Tm_cc[:, cols] (MT 16-row
// tiles, 2 MT k-steps of 8 on TF32 tensor cores, the NH heads interleaved), then Tm_rc[:, cols] =
// -Tm_rr X (v1's two halves per n-tile). X goes through the warp's scratch xs: the second
// product needs only the warp's own X columns, so the halves are separated by __syncwarp only.
// Publishes the new elements' max |Tm| per head.
template <int NH, int MT>
__device__ __forceinline__ void prep_merge(PrepSmem<NH> &s, int warp, int g8, int tig, int rb, int cb, int nt) {
    constexpr int KS = 2 * MT;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int r = rb + 16 * mt + g8;  // the fragment's rows r, r + 8
        float acc[NH][4];
        merge_product<NH, KS>(acc, tig, [&](int h, int row, int kk) { return a_at(s.u.inv.t[h], r + row, cb + kk); },
                              [&](int h, int kk) { return tm_at(s.u.inv.t[h], cb + kk, cb + 8 * nt + g8); });
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
    for (int mt = 0; mt < MT; ++mt) {
        const int r = rb + 16 * mt + g8;
        float acc[NH][4];
        merge_product<NH, KS>(acc, tig, [&](int h, int row, int kk) { return tm_at(s.u.inv.t[h], r + row, rb + kk); },
                              [&](int h, int kk) { return s.u.inv.xs[warp][h][kk][g8]; });
#pragma unroll
        for (int h = 0; h < NH; ++h) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s.u.inv.t[h][r + 8 * (e >> 1)][cb + 8 * nt + 2 * tig + (e & 1)] = -acc[h][e];
                m[h] = fmaxf(m[h], fabsf(acc[h][e]));
            }
            if (MT == 1) publish_max(&s.max_t[h], m[h]);  // one m-tile: the head's max is final here
        }
    }
    if (MT > 1) {
#pragma unroll
        for (int h = 0; h < NH; ++h) publish_max(&s.max_t[h], m[h]);
    }
}

// Tm (scaled fp16) to the workspace, warp w rows 16w..16w+15, zeros above the diagonal, and the
// max row sum of |Tm|. Tm and max |Tm| complete. Lane l owns the 8 columns 8 (l % 8) .. of rows
// 16w + l / 8 + 4 r (r < 4): two 16-byte shared reads (two-way bank conflicted; swapping a
// lane's halves would take run-time indices into a register array, which ptxas turns into a
// select network: 4% more instructions for the whole kernel, measured slower) and one 16-byte
// store per row; the row's sum of |Tm| adds the lane's 8 in order, then the 8 lanes' partial sums
// by a 3-level butterfly. The first form stored 4 bytes per lane and row and summed each row by
// a 5-level butterfly: 19% of the kernel's instructions and 18% of its stall samples (ncu,
// session 46, T 8192 at 16/32). The sums only bound |V'| (the state kernel's fp16 scale for
// V'), so their order is free; this one is fixed, so the bits are reproducible run to run.
template <int NH>
__device__ __forceinline__ void prep_store_tm(const PrepArgs &a, PrepSmem<NH> &s, PrepCta p, int warp, int lane) {
    const int c8 = lane & 7;
#pragma unroll
    for (int h = 0; h < NH; ++h) {
        const float(&t)[kC][kLdF] = s.u.inv.t[h];
        const float st = pow2_scale(s.max_t[h]);
        __half *tm = a.w.tm + prep_hc<NH>(a, p, h) * kC * kC;
        float worst = 0.0f;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = 16 * warp + (lane >> 3) + 4 * r, j0 = 8 * c8;
            const float4 lo = *reinterpret_cast<const float4 *>(&t[i][j0]);
            const float4 hi = *reinterpret_cast<const float4 *>(&t[i][j0 + 4]);
            float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            float rs = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                x[e] = j0 + e <= i ? x[e] : 0.0f;  // Tm's lower triangle (A^T lives above)
                rs += fabsf(x[e]);
            }
            uint4 o;
            o.x = pack_half2(x[0] * st, x[1] * st);
            o.y = pack_half2(x[2] * st, x[3] * st);
            o.z = pack_half2(x[4] * st, x[5] * st);
            o.w = pack_half2(x[6] * st, x[7] * st);
            *reinterpret_cast<uint4 *>(tm + (size_t)i * kC + j0) = o;
#pragma unroll
            for (int o8 = 4; o8 > 0; o8 >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, o8);
            worst = fmaxf(worst, rs);
        }
        publish_max(&s.max_rs[h], worst);
    }
}

// The kernel orchestrates the rooms above, one CTA barrier (or the pair barrier) between
// phases that read what other warps wrote.
template <bool VEC, int NH>
__global__ void __launch_bounds__(kPrepThreads, 5)
    gdn_chunk_prep_kernel(const __grid_constant__ PrepArgs a) {
    static_assert(NH >= 1 && NH <= kPrepWarps, "one warp per head's gates");
    pdl_launch_dependents();  // the state kernel may start its prologue (it waits for this grid)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    PrepSmem<NH> &s = *reinterpret_cast<PrepSmem<NH> *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;  // mma fragment coordinates
    const PrepCta p{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};

    // The chunk's rows (each warp finds them: varlen, a search in the sequence table).
    const ChunkRows cr = prep_chunk_rows(a, p.c);

    // The gates' loads (one warp per head), the K/Q traffic, then the gates' scan: the scan's
    // wait for g does not hold back that warp's K/Q loads.
    const int jg = p.jk + (NH * p.round + (warp < NH ? warp : 0)) * a.n_k_heads;
    GateRows gr{};
    if (warp < NH) gr = prep_gates_load(a, cr, jg);
    if (tid < NH) s.max_t[tid] = s.max_rs[tid] = 0u;

    // K and Q rows to fp16; only round 0 writes them to the workspace.
    prep_load_kq<VEC, kPrepThreads>(a, p.c, cr, p.jk, tid, s.u.in.kh, s.u.in.qh, p.round == 0);
    if (warp < NH) prep_gates_store(a, p.c, jg, gr, s.gam[warp], s.beta[warp]);
    __syncthreads();  // K, Q tiles and the gates complete

    float ak[8][4], aq[8][4];
    prep_products(s, warp, lane, ak, aq);
    __syncthreads();  // every warp is done with kh, qh: the inverse tiles overlay them
    prep_a_and_p(a, s.gam, s.beta, s.u.inv.t, p, warp, g8, tig, ak, aq);
    __syncwarp();  // the warp's diagonal block of A is complete (it wrote all of it)
    prep_diagonal_inverse(s, warp, lane);

    // The 16 -> 32 merges need the two diagonal blocks of a pair of warps (and A's block below
    // them, written by the pair's second warp): a barrier of that pair only.
    if (warp < 2) named_barrier(1, 64);  // ids as constants: ptxas then reserves 3 barriers, not 16
    else named_barrier(2, 64);
    // Merge 16 -> 32, blocks (1,0) (warps 0, 1) and (3,2) (warps 2, 3), 8 columns per warp.
    prep_merge<NH, 1>(s, warp, g8, tig, 16 * (2 * (warp >> 1) + 1), 32 * (warp >> 1), warp & 1);
    __syncthreads();  // Tm[0:32][0:32], Tm[32:64][32:64] and A's lower-left quadrant complete
    // Merge 32 -> 64: X = A[32:64][0:32] Tm[0:32][0:32], Tm[32:64][0:32] = -Tm[32:64][32:64] X;
    // warp w owns the 8 output columns 8w..8w+7 (both 16-row tiles).
    prep_merge<NH, 2>(s, warp, g8, tig, 32, 0, warp);
    __syncthreads();  // Tm complete, max |Tm| final

    prep_store_tm(a, s, p, warp, lane);
    __syncthreads();
    if (tid < NH)
        *reinterpret_cast<float4 *>(a.w.meta + prep_hc<NH>(a, p, tid) * 4) =
            make_float4(pow2_scale(s.max_t[tid]), __uint_as_float(s.max_rs[tid]), 0.0f, 0.0f);
    // Chained sub-passes (gdn_chunk_scan_rows): this grid may run beside the state kernel of the
    // sub-pass before it (launched as its programmatic dependent); one CTA waits for that grid
    // before exiting, so that this grid's completion, which the next state kernel waits for,
    // implies it. Launched in plain stream order there is nothing to wait for.
    if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) pdl_wait();
}

// One CTA per (round of NH value heads, chunk, key head); NH = 2 where Hv / Hk is even.
// Occupancy (sm_90): 96 registers x 128 threads and ~44 KB of shared memory per CTA: 5 CTAs,
// 20 warps per SM; that needs the largest shared-memory carveout, asked
// for once per instance (a hint: on failure the driver's choice stands; current device only).
template <bool VEC, int NH>
pf_status launch_prep_nh(const PrepArgs &a, bool pdl, cudaStream_t stream) {
    const int bytes = int(sizeof(PrepSmem<NH>));
    PF_TRY(set_max_dynamic_smem(gdn_chunk_prep_kernel<VEC, NH>, bytes, "gdn_chunk_prep_kernel"));
    static const bool carveout = [] {
        const cudaError_t e = cudaFuncSetAttribute(gdn_chunk_prep_kernel<VEC, NH>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   int(cudaSharedmemCarveoutMaxShared));
        if (e != cudaSuccess) (void)cudaGetLastError();  // not an error of the launch below
        return e == cudaSuccess;
    }();
    (void)carveout;
    const dim3 grid((a.n_v_heads / a.n_k_heads) / NH, a.nc, a.n_k_heads);
    const cudaError_t e = launch_pdl(gdn_chunk_prep_kernel<VEC, NH>, grid, kPrepThreads,
                                              size_t(bytes), pdl, stream, a);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gdn_chunk_prep_kernel<%d, %d> (PDL)", int(VEC), NH);
    PF_LAUNCH_CHECK("gdn_chunk_prep_kernel<%d, %d>", int(VEC), NH);
    return PF_STATUS_OK;
}

}  // namespace

pf_status launch_prep(const PrepArgs &a, bool vec, bool pdl, cudaStream_t stream) {
    PF_CHECK_ARG(a.n_k_heads <= 65535, "gdn_chunk_scan_rows: n_k_heads=%d > 65535 (grid z)", a.n_k_heads);
    const bool pair = (a.n_v_heads / a.n_k_heads) % 2 == 0;
    if (vec) return pair ? launch_prep_nh<true, 2>(a, pdl, stream) : launch_prep_nh<true, 1>(a, pdl, stream);
    return pair ? launch_prep_nh<false, 2>(a, pdl, stream) : launch_prep_nh<false, 1>(a, pdl, stream);
}

}  // namespace gdnc
}  // namespace pf
