// gdn_chunk_state.cu — the warp-owned state kernel of the chunked delta rule (gdn_chunk.cu):
// mma.sync on sm_80 and later, the path wherever the warpgroup kernel (gdn_chunk_state_wg.cu)
// does not run.
#include "base/cuda_check.cuh"
#include "kernels/gdn/gdn_chunk.cuh"

namespace pf {
namespace gdnc {
namespace {

// One chunk's operands into a state kernel's stage buffer `d`: K, Q (fp16 rows of key head jk),
// Tm, P (fp16, value head j) of workspace chunk c, BV columns of V from vg (fp32, the chunk's
// first row; rows from lim on read as zeros: past the sequence, never read), the gates and meta.
// Issued by NT threads (t: this thread's index among them) as 16-byte cp.async, or 4-byte ones
// for V when its rows are not 16-byte aligned (VEC false); the caller commits the group.
template <int BV, bool VEC, int NT, class Stage>
__device__ __forceinline__ void stage_chunk(Stage &d, const StateArgs &a, const float *vg, int lim,
                                            int j, int jk, int64_t c, int t) {
    // Unrolled for a single issuing warp (its loops run 32, 16 and 16 times); with a whole CTA
    // issuing they run once or twice and stay rolled.
    constexpr int kU8 = NT <= 32 ? 8 : 1, kU4 = NT <= 32 ? 4 : 1;
    const size_t kq = ((size_t)jk * a.nc + c) * kC * kDK;
    const size_t hc = (size_t)j * a.nc + c;
#pragma unroll kU8
    for (int e = t; e < kC * kDK / 8; e += NT) {  // 16 B = 8 halves
        const int i = e / (kDK / 8), d8 = (e % (kDK / 8)) * 8;
        cp_async16_zfill(&d.kh[i][d8], a.w.kh + kq + (size_t)i * kDK + d8, true);
        cp_async16_zfill(&d.qh[i][d8], a.w.qh + kq + (size_t)i * kDK + d8, true);
    }
#pragma unroll kU8
    for (int e = t; e < kC * kC / 8; e += NT) {
        const int i = e / (kC / 8), d8 = (e % (kC / 8)) * 8;
        cp_async16_zfill(&d.tm[i][d8], a.w.tm + hc * kC * kC + (size_t)i * kC + d8, true);
        cp_async16_zfill(&d.ph[i][d8], a.w.p + hc * kC * kC + (size_t)i * kC + d8, true);
    }
    if (VEC) {
#pragma unroll kU4
        for (int e = t; e < kC * BV / 4; e += NT) {
            const int i = e / (BV / 4), d4 = (e % (BV / 4)) * 4;
            const bool ok = i < lim;
            cp_async16_zfill(&d.vst[i][d4], vg + (ok ? i : 0) * a.v.ld + d4, ok);
        }
    } else {
#pragma unroll kU4
        for (int e = t; e < kC * BV; e += NT) {
            const int i = e / BV, d1 = e % BV;
            const bool ok = i < lim;
            cp_async4_zfill(&d.vst[i][d1], vg + (ok ? i : 0) * a.v.ld + d1, ok);
        }
    }
    for (int e = t; e < 2 * kC / 4 + 1; e += NT) {
        if (e < kC / 4) cp_async16_zfill(&d.gam[4 * e], a.w.gam + hc * kC + 4 * e, true);
        else if (e < kC / 2) cp_async16_zfill(&d.beta[4 * (e - kC / 4)], a.w.bet + hc * kC + 4 * (e - kC / 4), true);
        else cp_async16_zfill(&d.meta[0], a.w.meta + hc * 4, true);
    }
}

// --------------------------------------------------------------- state kernel, warp-owned form
// The chunk step (gdn_chunk.cu) laid out so that the recurrence never leaves a warp. The delta rule is independent across value
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
// Its predecessor (v2: the state slice spread over 16 warps of a CTA, three tensor-core steps and
// four barriers per chunk; deleted, numbers in docs/notes-archive-2026-12.md) spent ~3.7 us per chunk on its
// barriers and dependent shared-memory steps (ncu, runs 4-7); this one ~2.2 us (run 20: 282 us at T = 8192,
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
    SeqSpan seq;  // the CTA's sequence (state_seq): read from here, not held in registers
};


// fp16 A fragments (m16 x k16, k-block kb) from the fp32 accumulators of n8 tiles 2 kb, 2 kb + 1,
// times `scale`.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4],
                                         float scale) {
    a[0] = pack_half2(c0[0] * scale, c0[1] * scale);
    a[1] = pack_half2(c0[2] * scale, c0[3] * scale);
    a[2] = pack_half2(c1[0] * scale, c1[1] * scale);
    a[3] = pack_half2(c1[2] * scale, c1[3] * scale);
}

// The producer warp of a warp-owned state kernel, for every chunk of its sequence: chunk
// c + NS - 1 into the buffer freed by chunk c - 1 (st[(c + NS - 1) % NS]) once everyone is past
// chunk c's barrier. It passes the same __syncthreads once per chunk as the compute warps (no
// early exit), and its wait_group before the barrier publishes chunk c's copies.
template <int BV, int NS, bool VEC, class Stage>
__device__ __forceinline__ void produce_state_operands(const StateArgs &a, Stage *st, const SeqSpan &sq,
                                                       int j, int jk, int col0) {
    const int lane = threadIdx.x & 31;
    const float *vg = a.v.ptr + sq.r0 * a.v.ld + (int64_t)j * kDK + col0;
    // Chunk c: workspace chunk sq.c0 + c, V rows from 64 c, valid rows min(64, rows - 64 c).
    const auto stage = [&](int c) {
        const int64_t t0 = (int64_t)c * kC;
        const int lim = sq.rows - t0 < kC ? int(sq.rows - t0) : kC;
        stage_chunk<BV, VEC, 32>(st[c % NS], a, vg + t0 * a.v.ld, lim, j, jk, sq.c0 + c, lane);
    };
    // The workspace is the prep grid's output: wait for that grid when this kernel was launched
    // as its programmatic dependent (returns at once otherwise). The compute warps read only the
    // state (not the prep's) before their first chunk, which reaches them through this warp.
    pdl_wait();
#pragma unroll
    for (int c = 0; c < NS - 1; ++c) {
        if (c < sq.nc) stage(c);
        cp_async_commit();  // empty groups keep the count: group c is chunk c
    }
    for (int c = 0; c < sq.nc; ++c) {
        cp_async_wait<NS - 2>();
        __syncthreads();
        if (c + NS - 1 < sq.nc) stage(c + NS - 1);
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
    // The CTA's sequence (varlen: blockIdx.y's) for every warp, through shared memory.
    if (tid == 0) s.seq = state_seq(a);
    __syncthreads();
    float *og = a.o.ptr + s.seq.r0 * a.o.ld + (int64_t)j * kDK + col0 + vc;
    float *state = s.seq.state + (int64_t)j * kDK * kDK + col0 + vc;

    if (warp == NW) {  // the producer
        produce_state_operands<BV, NS, VEC>(a, s.st, s.seq, j, jk, col0);
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
    for (int c = 0; c < s.seq.nc; ++c) {
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
                    mma_m16n8k16(acc[2 * np], sa, bb[kb & 1][np][0], bb[kb & 1][np][1]);
                    mma_m16n8k16(acc[2 * np + 1], sa, bb[kb & 1][np][2], bb[kb & 1][np][3]);
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
                mma_m16n8k16(vp[2 * np], ra[kb], bt[f][0], bt[f][1]);
                mma_m16n8k16(vp[2 * np + 1], ra[kb], bt[f][2], bt[f][3]);
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
                    mma_m16n8k16(op[2 * np], va[kb], bt[f][0], bt[f][1]);
                    mma_m16n8k16(op[2 * np + 1], va[kb], bt[f][2], bt[f][3]);
                }
            const int64_t t0 = (int64_t)c * kC, left = s.seq.rows - t0;
            const int lim = left < kC ? int(left) : kC;  // rows of this chunk (of its sequence)
            float *orow = og + (t0 + 2 * tig) * a.o.ld + g8;              // row 2 tig of the chunk
#pragma unroll
            for (int nt = 0; nt < 8; ++nt, orow += 8 * a.o.ld)
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int i = 8 * nt + 2 * tig + u;
                    if (i < lim) {
                        float *p = orow + (u ? a.o.ld : 0);
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
                    mma_m16n8k16(acc[2 * np], vd[kb], bb[st & 1][q4][0], bb[st & 1][q4][1]);
                    mma_m16n8k16(acc[2 * np + 1], vd[kb], bb[st & 1][q4][2], bb[st & 1][q4][3]);
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

template <int NW, int NS, bool VEC>
pf_status launch_state_t_ns(const StateArgs &a, bool pdl, cudaStream_t stream) {
    using Smem = StateTSmem<NW, NS>;
    PF_TRY(set_max_dynamic_smem(gdn_chunk_state_t_kernel<NW, NS, VEC>, int(sizeof(Smem)),
                                "gdn_chunk_state_t_kernel"));
    // x: value heads x column slices; y: the sequences of a varlen pass (else 1).
    const dim3 grid(unsigned(a.n_v_heads * (kDK / (16 * NW))), unsigned(a.seqs.n > 0 ? a.seqs.n : 1));
    const unsigned block = 32 * (NW + 1);
    const cudaError_t e = launch_pdl(gdn_chunk_state_t_kernel<NW, NS, VEC>, grid, block,
                                              sizeof(Smem), pdl, stream, a);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gdn_chunk_state_t_kernel<%d, %d, %d> (PDL)", NW,
                           NS, int(VEC));
    PF_LAUNCH_CHECK("gdn_chunk_state_t_kernel<%d, %d, %d>", NW, NS, int(VEC));
    return PF_STATUS_OK;
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
// warps, 96 CTAs; a varlen pass counts the slices of all its sequences). Every warp runs its own
// chain; the CTA shares the chunk's operands. NW changes no bit of the result (each warp's
// scales are its own columns').
template <bool VEC>
pf_status launch_state_t_fit(const StateArgs &a, int32_t sm_count, bool pdl, cudaStream_t stream) {
    const int64_t slices = (int64_t)a.n_v_heads * (kDK / 16) * (a.seqs.n > 0 ? a.seqs.n : 1);
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

}  // namespace

pf_status launch_state_warp(const StateArgs &a, bool vec, int32_t sm_count, bool pdl, cudaStream_t stream) {
    return vec ? launch_state_t_fit<true>(a, sm_count, pdl, stream)
               : launch_state_t_fit<false>(a, sm_count, pdl, stream);
}

}  // namespace gdnc
}  // namespace pf
