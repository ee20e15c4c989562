// gdn_chunk_state_wg.cu — the warpgroup state kernel of the chunked delta rule (gdn_chunk.cu):
// wgmma, TMA and mbarriers, sm_90a only (it compiles to nothing elsewhere; state_wg_available
// says where it runs).
#include "base/cuda_check.cuh"
#include "kernels/gdn/gdn_chunk.cuh"
#include "ptx/hopper.cuh"
#include "ptx/wgmma.cuh"

namespace pf {
namespace gdnc {
namespace {
// ---------------------------------------------------- state kernel, warpgroup form (sm_90a only)
// The chunk step of the warp-owned kernel (same algebra, S^T with the value columns as rows) on
// Hopper's warpgroup MMA, the form FlashInfer's and FlashQLA's GDN kernels take on this card. A
// consumer warpgroup owns 64 value columns of a head (2 CTAs per head: Hv = 32 gives 64 CTAs,
// 48 gives 96; the pair form, WgForm below, puts both of a head's warpgroups in one CTA) and
// keeps S^T (64 x 128) as one m64n128 fp32 accumulator; every product of the step is a wgmma
// with its A operand in registers (the fp32 accumulator of the product before it, packed to
// fp16 as FlashAttention-3 reuses P) and its B operand in shared memory:
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
// The kernel's two forms, NWG consumer warpgroups a CTA (the same arithmetic per warpgroup, so
// the same bits): NWG = 1, a CTA per 64 value columns (two per value head), 160 threads (+ one
// producer warp), three stages; NWG = 2, the pair form, a CTA per value head whose two consumer
// warpgroups own its two column halves and share each stage's K, Q, Tm and P (one copy where the
// single form makes two), 384 threads (the producer a whole warpgroup, so that it can give its
// registers to the consumers: setmaxnreg), two stages (three of 82 KB do not fit). The pair runs
// two independent state chains on one SM and moves 112 KB a chunk step where two single CTAs move
// 160; it pays where the single form's grid needs more than one wave (many sequences:
// gdn_chunk.cu). H200, 16/32 heads (session 47): 4 x 8192 1.022 against 1.041 ms, 16 x 512 0.275
// against 0.297, 16/48 8 x 4096 1.498 against 1.584; one sequence at 16/48 (one wave of single
// CTAs) 0.448 against 0.395. ncu of a round at 4 x 8192: L2 76% and DRAM 59% busy, about twice a
// single chain's cycles a step: the step is bound by what it moves, not by the SM's issue.
template <int NWG>
struct WgForm {
    static_assert(NWG == 1 || NWG == 2, "one or two consumer warpgroups");
    static constexpr int kThreads = NWG == 1 ? 160 : 384;
    static constexpr int kStages = NWG == 1 ? 3 : 2;
};
// The pair form's register split: 384 threads start at 168 registers each; the producer
// warpgroup gives back to 24 and the consumers take 240 (128 * 24 + 256 * 240 = 64512 <= 65536),
// as in attention_wgmma.cu.
constexpr int kPairProducerRegs = 24;
constexpr int kPairConsumerRegs = 240;

template <int NWG>
struct StateWgSmem {
    struct alignas(1024) Stage {
        __half kh[kC * kDK];  // swizzled: column blocks x 0..63, 64..127 of 8 KB (hopper.cuh)
        __half qh[kC * kDK];
        __half tm[kC * kC];   // one swizzled block
        __half ph[kC * kC];
        float vst[NWG * kC * 64];  // per warpgroup two [64][32] fp32 blocks, 128-byte swizzle (wg_v_offset)
        float gam[kC];
        float beta[kC];
        float meta[4];
    };
    Stage st[WgForm<NWG>::kStages];
    uint64_t full[WgForm<NWG>::kStages];   // the stage's copies landed (TMA / bulk transactions, cp.async)
    uint64_t empty[WgForm<NWG>::kStages];  // the 4 NWG consumer warps are done with the stage
    SeqSpan seq;                           // the CTA's sequence (state_seq): read from here, not held in registers
};
template <int NWG>
constexpr size_t wg_state_smem() { return sizeof(StateWgSmem<NWG>) + 1024; }  // + the alignment slack
static_assert(wg_state_smem<1>() <= 227 * 1024 && wg_state_smem<2>() <= 227 * 1024, "one CTA an SM");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PF_GDN_WGMMA_DEVICE 1
#endif

#ifdef PF_GDN_WGMMA_DEVICE  // the warpgroup kernel's device helpers and rooms (sm_90a only)
using namespace hopper;

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

// The CTA's place: value head j, its key head jk (tiled pairing, qwen35 GGUF, spec.md G6) and
// its value columns from col0 (the single form: 64 of them, two CTAs per head; the pair: all 128).
struct WgCta {
    int j, jk, col0;
};
// The kernel's five TMA maps (its __grid_constant__ parameters).
struct WgMaps {
    const CUtensorMap *k, *q, *t, *p, *v;
};

// --------------------------------------------------------------- the producer warp
// Lane 0's part of staging chunk c (of the CTA's sequence sq) in stage d: it arms `full` with
// the chunk's byte count, then issues K, Q, Tm, P (and V when tma_v: 64 columns a consumer
// warpgroup) by TMA and the gates and meta by bulk copies; every copy completes on `full`.
template <int NWG>
__device__ __forceinline__ void wg_issue_stage(typename StateWgSmem<NWG>::Stage &d, uint32_t full,
                                               const StateArgs &a, const WgMaps &m, WgCta w, const SeqSpan &sq,
                                               int c, int64_t t0, bool tma_v) {
    // Workspace chunk sq.c0 + c; row coordinates < 2^31 (the launcher checks).
    const int64_t gc = sq.c0 + c;
    const int kr = int((w.jk * a.nc + gc) * kC), tr = int((w.j * a.nc + gc) * kC);
    const size_t hc = (size_t)w.j * a.nc + gc;
    const uint32_t kh = smem_addr(d.kh), qh = smem_addr(d.qh), vs = smem_addr(d.vst);
    mbar_arrive_expect_tx(full, kWgTmaBytes + kWgGateBytes + (tma_v ? NWG * kWgVBytes : 0));
    tma_load_2d(kh, m.k, 0, kr, full);
    tma_load_2d(kh + kC * kSwizzleRow, m.k, kSwizzleCols, kr, full);
    tma_load_2d(qh, m.q, 0, kr, full);
    tma_load_2d(qh + kC * kSwizzleRow, m.q, kSwizzleCols, kr, full);
    tma_load_2d(smem_addr(d.tm), m.t, 0, tr, full);
    tma_load_2d(smem_addr(d.ph), m.p, 0, tr, full);
    if (tma_v) {
        const int vrow = int(sq.r0 + t0);
#pragma unroll
        for (int h = 0; h < NWG; ++h) {
            const uint32_t vh = vs + h * kWgVBytes;
            const int col = w.j * kDK + w.col0 + 64 * h;
            tma_load_2d(vh, m.v, col, vrow, full);
            tma_load_2d(vh + kC * 32 * 4, m.v, col + 32, vrow, full);
        }
    }
    bulk_load(smem_addr(d.gam), a.w.gam + hc * kC, kC * 4, full);
    bulk_load(smem_addr(d.beta), a.w.bet + hc * kC, kC * 4, full);
    bulk_load(smem_addr(d.meta), a.w.meta + hc * 4, 16, full);
}

// 64 columns of V of a chunk into vst (one warpgroup's two swizzled blocks) by the warp's lanes
// (the chunk has fewer than 64 rows of its sequence, or V's rows are not 16-byte aligned):
// cp.async of 16 (VEC) or 4 bytes into the swizzled places the TMA would fill, zeros from row lim
// on. The caller makes the lane's copies one arrival on `full` (cp_async_arrive_noinc).
template <bool VEC>
__device__ __forceinline__ void wg_copy_v(float *vst, const float *vg, int64_t ldv, int lim, int lane) {
    if (VEC) {  // 4 columns of a row are 16 contiguous bytes of the swizzled block
#pragma unroll 4
        for (int e = lane; e < kC * 16; e += 32) {
            const int i = e >> 4, d4 = (e & 15) * 4;
            const bool ok = i < lim;
            cp_async16_zfill(&vst[wg_v_offset(i, d4)], vg + (ok ? i : 0) * ldv + d4, ok);
        }
    } else {
#pragma unroll 4
        for (int e = lane; e < kC * 64; e += 32) {
            const int i = e >> 6, d1 = e & 63;
            const bool ok = i < lim;
            cp_async4_zfill(&vst[wg_v_offset(i, d1)], vg + (ok ? i : 0) * ldv + d1, ok);
        }
    }
}

// The producer warp: the CTA's chunks into the stages, each refilled once the 4 NWG consumer
// warps released it (`empty`). It waits for the prep grid (PDL) before its first copy.
template <bool VEC, int NWG>
__device__ __forceinline__ void wg_state_producer(StateWgSmem<NWG> &s, const StateArgs &a, const WgMaps &m,
                                                  WgCta w, int lane) {
    constexpr int NS = WgForm<NWG>::kStages;
    const SeqSpan sq = s.seq;
    pdl_wait();   // the workspace is the prep grid's output (see produce_state_operands)
    // The next sub-pass's prep may start beside this grid (chained sub-passes): its
    // workspace half was last read by the state grid before the prep just waited for.
    pdl_launch_dependents();
    const float *vseq = a.v.ptr + sq.r0 * a.v.ld + (int64_t)w.j * kDK + w.col0;
    for (int c = 0; c < sq.nc; ++c) {
        const int b = c % NS;
        typename StateWgSmem<NWG>::Stage &d = s.st[b];
        const uint32_t full = smem_addr(&s.full[b]);
        const int64_t t0 = (int64_t)c * kC;
        const int lim = sq.rows - t0 < kC ? int(sq.rows - t0) : kC;  // rows of the sequence
        const bool tma_v = VEC && lim == kC;  // else V by cp.async, zeros from row lim
        if (c >= NS) mbar_wait(smem_addr(&s.empty[b]), uint32_t(c / NS - 1) & 1u);
        if (lane == 0) wg_issue_stage<NWG>(d, full, a, m, w, sq, c, t0, tma_v);
        if (tma_v) {
            mbar_arrive(full);
        } else {
#pragma unroll
            for (int h = 0; h < NWG; ++h)
                wg_copy_v<VEC>(d.vst + h * kC * 64, vseq + t0 * a.v.ld + 64 * h, a.v.ld, lim, lane);
            cp_async_arrive_noinc(full);
        }
    }
    cp_async_wait_all();
}

// ------------------------------------------------------------ the consumer warpgroup
// What a consumer thread carries from chunk to chunk: its 64 elements of S^T (S_true = S u per
// row), the A fragments of S^T entering the chunk, their rows' max |S_acc| and factors u / z.
struct WgCarry {
    float S[64];  // S^T[v][x] / u[h]: x = 8 (e >> 2) + 2 tig + (e & 1)
    float u[2];
    uint32_t sa[8][4];
    float ms[2], f[2];
};

// The wgmma descriptors of a stage: K K-major and MN-major (the same bytes), Q, Tm, P.
struct WgDescs {
    uint64_t dK, dKt, dQ, dT, dP;
};
template <class Stage>
__device__ __forceinline__ WgDescs wg_descs(const Stage &d) {
    const uint32_t kaddr = smem_addr(d.kh);
    return WgDescs{smem_desc(kaddr, 16, kSwizzleAtom),                // K-major
                   smem_desc(kaddr, kC * kSwizzleRow, kSwizzleAtom),  // MN-major
                   smem_desc(smem_addr(d.qh), 16, kSwizzleAtom), smem_desc(smem_addr(d.tm), 16, kSwizzleAtom),
                   smem_desc(smem_addr(d.ph), 16, kSwizzleAtom)};
}

// What the chunk's gates and scales give a thread for its chunk rows i = 8 nt + 2 tig + w and
// its two value columns: e^gamma, e^(gamma_last - gamma), beta V sigma_R, the factor of X_acc in
// R, and per column sigma_V, the V' factor and the master state's multiplier.
struct WgScales {
    float eg[8][2], dd[8][2], bv[32], rx[32];
    float sig_v[2], k_v[2], smul[2];
};

// The scales of a chunk, while X and S^T Q^T run (everything read from shared memory is loaded
// here: the waits after are memory clobbers that no load moves across): e^gamma, beta e^gamma,
// beta V and e^(gamma_last - gamma) of the thread's rows; the bounds and scales of its columns.
// vst: the warpgroup's 64 columns of V in the stage.
template <class Stage>
__device__ __forceinline__ void wg_chunk_scales(const Stage &d, const float *vst, int tig, int vr0,
                                                const WgCarry &st, WgScales &sc) {
    const float gl = d.gam[kC - 1], el = exp_ftz(gl);
    float be[8][2];
    float vm[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const float2 gg = *reinterpret_cast<const float2 *>(&d.gam[8 * nt + 2 * tig]);
        const float2 bb = *reinterpret_cast<const float2 *>(&d.beta[8 * nt + 2 * tig]);
        sc.eg[nt][0] = exp_ftz(gg.x);
        sc.eg[nt][1] = exp_ftz(gg.y);
        sc.dd[nt][0] = exp_ftz(gl - gg.x);  // exponent <= 0
        sc.dd[nt][1] = exp_ftz(gl - gg.y);
        be[nt][0] = bb.x * sc.eg[nt][0];
        be[nt][1] = bb.y * sc.eg[nt][1];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // element e = 4 nt + q: w = q & 1, h = q >> 1
            const float vx = vst[wg_v_offset(8 * nt + 2 * tig + (q & 1), vr0 + 8 * (q >> 1))];
            vm[q >> 1] = fmaxf(vm[q >> 1], fabsf(vx));
            sc.bv[4 * nt + q] = (q & 1 ? bb.y : bb.x) * vx;
        }
    }
    const float sig_t = d.meta[0], rs_t = d.meta[1];
    float sig_r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // |R| <= max|V| + sqrt(dk) max|S| (q, k unit vectors), max |V'| <= max_i sum_j |Tm_ij| max|R|
        const float r_bound = quad_max(vm[h]) + kSqrtDk * (st.ms[h] * st.u[h]);
        sig_r[h] = pow2_scale_f(r_bound);
        sc.sig_v[h] = pow2_scale_f(rs_t * r_bound);
        sc.k_v[h] = sc.sig_v[h] * pow2_inv(sig_t) * pow2_inv(sig_r[h]);  // exact: powers of two
        sc.smul[h] = st.u[h] * el * sc.sig_v[h];
    }
    // R = (beta V) sigma_R - (beta e^gamma f sigma_R) X_acc: one FFMA per element below.
#pragma unroll
    for (int e = 0; e < 32; ++e) {
        const int h = (e >> 1) & 1;
        sc.rx[e] = -be[e >> 2][e & 1] * (st.f[h] * sig_r[h]);
        sc.bv[e] *= sig_r[h];
    }
    // Pinned here, before the wait: the compiler would otherwise sink this arithmetic (no
    // memory access) below it, onto the chain.
    fence_regs(sc.eg);
    fence_regs(sc.rx);
    fence_regs(sc.dd);
    fence_regs(sc.bv);
    fence_regs(sc.k_v);
    fence_regs(sc.smul);
}

// Eight fp32 accumulator values as the four fp16 A registers of one k-step.
__device__ __forceinline__ void wg_pack_a(const float (&x)[8], uint32_t (&a)[4]) {
    a[0] = pack_half2(x[0], x[1]);
    a[1] = pack_half2(x[2], x[3]);
    a[2] = pack_half2(x[4], x[5]);
    a[3] = pack_half2(x[6], x[7]);
}

// R^T = beta (V^T - e^gamma X^T) as scaled fp16 A fragments (4 k-blocks over rows i), from X^T.
__device__ __forceinline__ void wg_delta_a(const WgScales &sc, const float (&xa)[32], uint32_t (&ra)[4][4]) {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
        float r[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) r[q] = fmaf(sc.rx[8 * kb + q], xa[8 * kb + q], sc.bv[8 * kb + q]);
        wg_pack_a(r, ra[kb]);
    }
}

// V' * sigma_V (the outputs' A operand, pa) and e^(gamma_last - gamma) V' * sigma_V (the
// update's, ua), from V'^T.
__device__ __forceinline__ void wg_update_a(const WgScales &sc, const float (&va)[32], uint32_t (&pa)[4][4],
                                            uint32_t (&ua)[4][4]) {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
        float x[8], y[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int e = 8 * kb + q;
            x[q] = va[e] * sc.k_v[(e >> 1) & 1];
            y[q] = x[q] * sc.dd[e >> 2][e & 1];
        }
        wg_pack_a(x, pa[kb]);
        wg_pack_a(y, ua[kb]);
    }
}

// The chunk step of one consumer thread (stage d landed): X and half of S^T Q^T (which runs while
// R is computed), V' and the other half of S^T Q^T, the update, P V' (the next chunk's
// conversion of S runs while P V' does). oa: the chunk's outputs O^T, in the units of u; vst: the
// warpgroup's 64 columns of V in the stage.
template <class Stage>
__device__ __forceinline__ void wg_chunk_step(const Stage &d, const float *vst, int tig, int vr0, WgCarry &st,
                                              float (&oa)[32]) {
    const WgDescs ds = wg_descs(d);
    // X^T = S^T K^T, then the first half (k-steps over x < 64) of S^T Q^T, the outputs' part:
    // it runs while R is computed. Its second half goes in behind V', so that V' waits in the
    // tensor pipe behind 4 k-steps of it, not 8 (device run s23-3: 0.3539 vs 0.3614 ms at
    // 16/32 heads, T = 8192; 0.4032 vs 0.4093 at 16/48).
    float xa[32];
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 8; ++kb)
        wgmma::wgmma_rsk<64>(xa, st.sa[kb], desc_add(ds.dK, uint32_t(kb >> 2) * kC * kSwizzleRow + 32u * (kb & 3)),
                             kb > 0);
    wgmma_commit();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) wgmma::wgmma_rsk<64>(oa, st.sa[kb], desc_add(ds.dQ, 32u * kb), kb > 0);
    wgmma_commit();
    WgScales sc;
    wg_chunk_scales(d, vst, tig, vr0, st, sc);
    wgmma_wait<1>();
    fence_regs(xa);
    uint32_t ra[4][4];
    wg_delta_a(sc, xa, ra);

    // V'^T = R^T Tm^T, then the second half of S^T Q^T; the master state into the update's
    // units meanwhile.
    float va[32];
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) wgmma::wgmma_rsk<64>(va, ra[kb], desc_add(ds.dT, 32u * kb), kb > 0);
    wgmma_commit();
#pragma unroll
    for (int kb = 4; kb < 8; ++kb)
        wgmma::wgmma_rsk<64>(oa, st.sa[kb], desc_add(ds.dQ, kC * kSwizzleRow + 32u * (kb & 3)), 1);
    wgmma_commit();
#pragma unroll
    for (int e = 0; e < 64; ++e) st.S[e] *= sc.smul[(e >> 1) & 1];
    wgmma_wait<1>();  // V' done; S^T Q^T may still run
    fence_regs(va);
    fence_regs(ra);
    uint32_t pa[4][4], ua[4][4];
    wg_update_a(sc, va, pa, ua);

    // S^T += (e^(gamma_last - gamma) V' sigma_V)^T K; then, with S^T Q^T complete, O^T in the
    // units of V' sigma_V: e^gamma (S^T Q^T) f sigma_V, and O^T += (V' sigma_V)^T P^T.
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
        wgmma::wgmma_rs<128>(st.S, ua[kb], desc_add(ds.dKt, uint32_t(kb) * 2 * kSwizzleAtom), 1);
    wgmma_commit();
    wgmma_wait<1>();  // S^T Q^T done; the update may still run
    fence_regs(oa);
    fence_regs(st.sa);
#pragma unroll
    for (int e = 0; e < 32; ++e) {
        const int h = (e >> 1) & 1;
        oa[e] *= sc.eg[e >> 2][e & 1] * (st.f[h] * sc.sig_v[h]);
    }
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) wgmma::wgmma_rsk<64>(oa, pa[kb], desc_add(ds.dP, 32u * kb), 1);
    wgmma_commit();
    st.u[0] = pow2_inv(sc.sig_v[0]);
    st.u[1] = pow2_inv(sc.sig_v[1]);

    // The next chunk's A fragments once the update is done (P V' may still run).
    wgmma_wait<1>();
    fence_regs(st.S);
    fence_regs(ua);
    wg_state_to_a(st.S, st.u, st.sa, st.ms, st.f);
    wgmma_wait<0>();
    fence_regs(oa);
    fence_regs(pa);
}

// The epilogue of a chunk: this thread's 2 value columns x 16 rows of chunk c, the rows of its
// sequence only. og: the thread's first column at the sequence's row 0.
__device__ __forceinline__ void wg_store_outputs(float *og, int64_t ldo, int64_t rows, int c, int tig,
                                                 const float (&oa)[32], const float (&u)[2]) {
    const int64_t t0 = (int64_t)c * kC, left = rows - t0;
    const int lim = left < kC ? int(left) : kC;  // rows of this chunk (of its sequence)
    float *orow = og + (t0 + 2 * tig) * ldo;  // row 2 tig of the chunk
#pragma unroll
    for (int nt = 0; nt < 8; ++nt, orow += 8 * ldo)
#pragma unroll
        for (int w = 0; w < 2; ++w)
            if (8 * nt + 2 * tig + w < lim) {
                float *p = orow + (w ? ldo : 0);
                p[0] = oa[4 * nt + w] * u[0];
                p[8] = oa[4 * nt + 2 + w] * u[1];
            }
}

// A consumer warpgroup (warps 0-3, and 4-7 in the pair form): S^T of its 64 value columns from
// the state, the chunks in turn (each stage released to the producer as soon as its operands are
// read), S^T back. Warpgroup wg owns the CTA's columns 64 wg .. 64 wg + 63. This thread's two
// accumulator rows (value columns): vr0 + 8 h of the warpgroup's 64, vr0 = 16 (warp % 4) + g8;
// accumulator element e of an m64nN tile: row half h = (e >> 1) & 1, column 8 (e >> 2) + 2 tig +
// (e & 1) (wgmma.cuh).
template <int NWG>
__device__ __forceinline__ void wg_state_consumer(StateWgSmem<NWG> &s, const StateArgs &a, WgCta w, int warp,
                                                  int lane, int g8, int tig) {
    constexpr int NS = WgForm<NWG>::kStages;
    const int wg = warp >> 2, vr0 = 16 * (warp & 3) + g8, col0 = w.col0 + 64 * wg;
    float *og = a.o.ptr + s.seq.r0 * a.o.ld + (int64_t)w.j * kDK + col0 + vr0;
    float *state = s.seq.state + (int64_t)w.j * kDK * kDK + col0 + vr0;

    // Chained sub-passes: the state grid of the sub-pass before may still be writing the state;
    // the prep grid's completion implies its completion (the prep's last wait).
    if (a.chain) pdl_wait();
    WgCarry st;
#pragma unroll
    for (int e = 0; e < 64; ++e)
        st.S[e] = state[(int64_t)(8 * (e >> 2) + 2 * tig + (e & 1)) * kDK + 8 * ((e >> 1) & 1)];
    st.u[0] = st.u[1] = 1.0f;
    wg_state_to_a(st.S, st.u, st.sa, st.ms, st.f);

    for (int c = 0; c < s.seq.nc; ++c) {
        const int b = c % NS;
        mbar_wait(smem_addr(&s.full[b]), uint32_t(c / NS) & 1u);
        float oa[32];
        wg_chunk_step(s.st[b], s.st[b].vst + wg * kC * 64, tig, vr0, st, oa);
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(&s.empty[b]));  // this warp is done with stage b
        wg_store_outputs(og, a.o.ld, s.seq.rows, c, tig, oa, st.u);
    }
#pragma unroll
    for (int e = 0; e < 64; ++e)
        state[(int64_t)(8 * (e >> 2) + 2 * tig + (e & 1)) * kDK + 8 * ((e >> 1) & 1)] =
            st.S[e] * st.u[(e >> 1) & 1];
}

#endif  // PF_GDN_WGMMA_DEVICE

// Pipeline (FlashAttention-3's producer/consumer form): per stage a `full` mbarrier that the
// producer arms with the chunk's byte count and the copies complete, and an `empty` one that the
// 4 NWG consumer warps arrive on when done with it, so that the producer runs up to kStages chunks
// ahead with no CTA barrier. The producer's lane 0 issues K, Q, Tm, P and V by TMA (V's 64
// columns a warpgroup as two 32-float boxes, 128-byte swizzle), the gates and meta by bulk
// copies. V's map spans the rows of the whole pass, so the box of a chunk with fewer than 64 rows
// of its sequence would bring the next sequence's rows (a varlen pass; after the last sequence TMA
// fills zeros): such a chunk's V, and every chunk's when V's rows are not 16-byte aligned (VEC
// false), goes by the warp's lanes instead, cp.async of 16 (4) bytes into the same swizzled places
// with zero fill from the sequence's end, each lane's copies completing as an arrival on `full`.
// `full` counts 1 + 32 arrivals: lane 0's arming, then one per lane (its cp.async, or a plain
// arrival when TMA brought V). The kernel sets up the barriers and orchestrates the rooms above:
// the producer warp (wg_state_producer), the consumer warpgroups (wg_state_consumer,
// wg_chunk_step). The pair form's producer warp is the first of warpgroup 2, whose other warps
// leave at once (the setmaxnreg split stays at this branch, as attention_wgmma.cu's).
template <bool VEC, int NWG>
__global__ void __launch_bounds__(WgForm<NWG>::kThreads, 1)
    gdn_chunk_state_wg_kernel(const __grid_constant__ StateArgs a,
                              const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_t,
                              const __grid_constant__ CUtensorMap tm_p,
                              const __grid_constant__ CUtensorMap tm_v) {
#ifdef PF_GDN_WGMMA_DEVICE
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *base = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    StateWgSmem<NWG> &s = *reinterpret_cast<StateWgSmem<NWG> *>(base);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, tig = lane & 3;  // mma fragment coordinates
    // Single form: value head blockIdx.x / 2, columns 64 (blockIdx.x % 2) on; pair: head blockIdx.x.
    const int j = NWG == 1 ? blockIdx.x >> 1 : blockIdx.x, col0 = NWG == 1 ? (blockIdx.x & 1) * 64 : 0;
    const WgCta w{j, j % a.n_k_heads, col0};
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < WgForm<NWG>::kStages; ++b) {
            mbar_init(smem_addr(&s.full[b]), 1 + 32);
            mbar_init(smem_addr(&s.empty[b]), 4 * NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        s.seq = state_seq(a);  // the CTA's sequence (varlen: blockIdx.y's)
    }
    __syncthreads();  // the only CTA barrier

    const WgMaps maps{&tm_k, &tm_q, &tm_t, &tm_p, &tm_v};
    if constexpr (NWG == 1) {
        if (warp == 4) {  // the producer
            wg_state_producer<VEC, NWG>(s, a, maps, w, lane);
            return;
        }
    } else {
        if (warp >= 4 * NWG) {  // the producer warpgroup: its registers go to the consumers
            setmaxnreg_dec<kPairProducerRegs>();
            if (warp == 4 * NWG) wg_state_producer<VEC, NWG>(s, a, maps, w, lane);
            return;
        }
        setmaxnreg_inc<kPairConsumerRegs>();
    }
    wg_state_consumer<NWG>(s, a, w, warp, lane, g8, tig);
#else
    __trap();  // sm_90a only: the host never launches it elsewhere (gdn_state_wg_available)
#endif
}

// The warpgroup state kernel: NWG = 1, two CTAs (64 value columns each) per value head; NWG = 2,
// one; the TMA maps of this pass's K, Q ([Hk nc 64][128] fp16) and Tm, P ([Hv nc 64][64]) in the
// workspace, boxes of one chunk's 64 rows x 64 columns.
template <bool VEC, int NWG>
pf_status launch_state_wg_vec(const StateArgs &a, bool pdl, cudaStream_t stream) {
    constexpr size_t smem = wg_state_smem<NWG>();
    PF_TRY(set_max_dynamic_smem(gdn_chunk_state_wg_kernel<VEC, NWG>, int(smem), "gdn_chunk_state_wg_kernel"));
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
        const CUresult r = hopper::encode_2d_sw128(&maps[4], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, a.v.ptr,
                                                   (int64_t)a.n_v_heads * kDK, a.rows, a.v.ld * 4,
                                                   32, kC);
        if (r != CUDA_SUCCESS)
            return fail(PF_STATUS_CUDA_ERROR, "gdn_chunk_scan_rows: TMA map of v (%lld rows, ld %lld): CUresult %d",
                        (long long)a.rows, (long long)a.v.ld, int(r));
    } else {
        maps[4] = maps[0];  // unused: V by cp.async
    }
    // x: 2 / NWG CTAs per value head; y: the sequences of a varlen pass (else 1).
    const dim3 grid(unsigned(a.n_v_heads * 2 / NWG), unsigned(a.seqs.n > 0 ? a.seqs.n : 1));
    const cudaError_t e = launch_pdl(gdn_chunk_state_wg_kernel<VEC, NWG>, grid, WgForm<NWG>::kThreads, smem,
                                     pdl, stream, a, maps[0], maps[1], maps[2], maps[3], maps[4]);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gdn_chunk_state_wg_kernel<%d, %d> (PDL)", int(VEC), NWG);
    PF_LAUNCH_CHECK("gdn_chunk_state_wg_kernel<%d, %d>", int(VEC), NWG);
    return PF_STATUS_OK;
}

}  // namespace

pf_status launch_state_wg(const StateArgs &a, bool vec, bool pair, bool pdl, cudaStream_t stream) {
    if (pair) return vec ? launch_state_wg_vec<true, 2>(a, pdl, stream) : launch_state_wg_vec<false, 2>(a, pdl, stream);
    return vec ? launch_state_wg_vec<true, 1>(a, pdl, stream) : launch_state_wg_vec<false, 1>(a, pdl, stream);
}

bool state_wg_available() { return sm90a_kernels_available(current_device()); }

}  // namespace gdnc
}  // namespace pf
