// gdn_chunk.cu — the gated delta rule (spec.md G7) in its chunkwise-parallel form (spec.md §3.2.1) on
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
// Two kernels per pass of at most kGdnPassRows rows, in four rooms:
//  gdn_chunk_prep.cu   the prep kernel (grid: rounds of 1-2 value heads x chunks x key heads, all
//        in parallel): K and Q to fp16 (kept for the state kernel), K K^T and Q K^T once per key
//        head, then per value head the gates (gamma, beta), A, Tm = (I + A)^-1 (16x16 diagonal
//        blocks by forward substitution in fp32, then two levels of block merges on TF32 tensor
//        cores) and P; Tm and P go to the workspace as fp16. Nothing here depends on the state,
//        so it is off the recurrence.
//  gdn_chunk_state_wg.cu   the state kernel on sm_90a (compute capability 9.0, v rows 16-byte
//        aligned): one warpgroup keeps 64 columns of S^T as a wgmma accumulator, every product a
//        register-A wgmma, operands by TMA (device run 51: 0.356 vs 0.404 ms per layer against the
//        warp-owned kernel at 16/32 heads, T = 8192; 0.399 vs 0.527 at 16/48).
//  gdn_chunk_state.cu   the state kernel elsewhere (sm_80+): one warp keeps 16 columns of the state
//        transposed in its mma accumulators and runs the whole chunk step on its own registers, a
//        producer warp stages the chunk's operands three deep, one barrier per chunk.
//  gdn_chunk.cu (this file)   the plan of a call: passes or chained sub-passes, which state kernel,
//        programmatic dependence.
// Each state kernel runs sequentially over the chunks of its pass; the delta rule is independent
// across value columns, so a head's 128 columns split across CTAs.
//
// Precision: fp16 tensor-core operands (11-bit significand: TF32's rounding unit, 2^-11), fp32
// accumulation, fp32 state, gates, decays and triangular inverse. Operands whose range the data
// do not bound (S, R, V', Tm) are stored in fp16 with an exact power-of-two scale per chunk,
// chosen from the tile's max |x| (S, Tm) or from a bound derived from maxima already known
// (R <= max|V| + sqrt(dk) max|S|, V' <= max_i sum_j |Tm_ij| max|R|), so that no element exceeds
// 2^15 (fp16: 65504) and no barrier is spent on a reduction; the scale is undone exactly in
// fp32. q and k must be L2-normalised (|x| <= 1, as G5 produces): they go to fp16 unscaled.
// Tested at 2e-3 relative against float64 (tests/python/test_kernel_gdn.py); the first build of
// this form (one kernel, same operand precision and scales) measured 3e-4 to 7e-4 (docs/notes-archive-2026-12.md).
//
// Written for sm_80+ (mma.sync, ldmatrix, cp.async): it runs unchanged on Hopper; the warpgroup
// state kernel is sm_90a only (wgmma, TMA, mbarriers) and compiles to a trap elsewhere.
#include <cuda_fp16.h>

//
// Written for sm_80+ (mma.sync, ldmatrix, cp.async): it runs unchanged on Hopper; the warpgroup
// state kernel is sm_90a only (wgmma, TMA, mbarriers) and compiles to a trap elsewhere.
#include "kernels/gdn/gdn.cuh"
#include "kernels/gdn/gdn_chunk.cuh"

namespace pf {

using namespace gdnc;

bool gdn_chunk_supported(int32_t dk, int32_t dv) { return dk == kDK && dv == kDK; }

size_t gdn_chunk_workspace_bytes(int64_t rows, int32_t n_k_heads, int32_t n_v_heads) {
    const int64_t pass = rows < kGdnPassRows ? rows : kGdnPassRows;
    if (pass <= 0 || n_k_heads <= 0 || n_v_heads <= 0) return 0;
    return workspace_layout((pass + kC - 1) / kC, n_k_heads, n_v_heads, nullptr, nullptr);
}

size_t gdn_chunk_varlen_workspace_bytes(int64_t total_chunks, int32_t n_k_heads, int32_t n_v_heads) {
    if (total_chunks <= 0 || n_k_heads <= 0 || n_v_heads <= 0) return 0;
    return workspace_layout(total_chunks, n_k_heads, n_v_heads, nullptr, nullptr);
}

namespace {

// The checks of both entries before the rows (`fn` names the entry).
pf_status chunk_args_check(const char *fn, const GdnScanArgs &a) {
    PF_CHECK_ARG(a.rows >= 0, "%s: rows=%lld < 0", fn, (long long)a.rows);
    PF_CHECK_ARG(a.n_k_heads >= 1 && a.n_v_heads >= 1 && a.n_v_heads % a.n_k_heads == 0,
                 "%s: n_v_heads=%d must be a positive multiple of n_k_heads=%d", fn, a.n_v_heads,
                 a.n_k_heads);
    if (!gdn_chunk_supported(a.dk, a.dv))
        return fail(PF_STATUS_UNSUPPORTED,
                    "%s: the chunked delta rule is built for dk = dv = 128, got dk=%d, dv=%d (use the "
                    "sequential path)", fn, a.dk, a.dv);
    const int64_t kw = (int64_t)a.n_k_heads * a.dk, vw = (int64_t)a.n_v_heads * a.dv;
    PF_CHECK_ARG(a.q.ld >= kw && a.k.ld >= kw && a.v.ld >= vw && a.o.ld >= vw && a.beta.ld >= a.n_v_heads &&
                     a.g.ld >= a.n_v_heads,
                 "%s: a row stride is below its width", fn);
    return PF_STATUS_OK;
}

// What both entries launch with: the operands' alignment, the state kernel, PDL.
struct ChunkLaunch {
    bool vec_qk = false, vec_v = false, wg = false, pair = false, pdl = false;
    int sm_count = 0;
};

// n_seqs: the state grid's sequences (its y extent).
pf_status chunk_launch(const char *fn, const GdnScanArgs &a, const GdnChunkPlan &plan, int32_t n_seqs,
                       ChunkLaunch *out) {
    const auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    out->vec_qk = aligned(a.q.ptr) && aligned(a.k.ptr) && a.q.ld % 4 == 0 && a.k.ld % 4 == 0;
    out->vec_v = aligned(a.v.ptr) && a.v.ld % 4 == 0;
    PF_TRY(device_sm_count(&out->sm_count));
    // The state kernel (plan.state; auto: the warpgroup kernel where it runs and V's rows are
    // 16-byte aligned, for its TMA map; else the warp-owned one). Asked for by name, the warpgroup
    // kernel also takes unaligned V rows (by cp.async).
    const bool wg_avail = state_wg_available();
    const bool named_wg = plan.state == GdnStateKernel::Warpgroup || plan.state == GdnStateKernel::WarpgroupPair;
    if (named_wg && !wg_avail)
        return fail(PF_STATUS_UNSUPPORTED,
                    "%s: the warpgroup state kernel (tuning.gdn_state) needs an sm_90a build on a compute "
                    "capability 9.0 device", fn);
    out->wg = named_wg || (plan.state == GdnStateKernel::Auto && out->vec_v && wg_avail);
    // Its pair form (one CTA per value head, the same bits) where asked, and under auto where the
    // single form's grid (2 CTAs per value head and sequence, one an SM) needs more than one wave:
    // the pair runs two chains an SM in one wave instead of one in two (H200, session 47: 2-9%
    // faster there, e.g. 16/32 4 x 8192 1.022 against 1.041 ms; slower within one wave, 16/48
    // 1 x 8192 0.448 against 0.395).
    out->pair = out->wg && (plan.state == GdnStateKernel::WarpgroupPair ||
                            (plan.state == GdnStateKernel::Auto &&
                             2 * (int64_t)a.n_v_heads * n_seqs > (int64_t)out->sm_count));
    int cc_major = 0;
    PF_TRY(device_cc_major(&cc_major));
    // The state kernel as the prep kernel's programmatic dependent (compute capability 9.0 and up;
    // see pdl_wait): the same kernels and bits either way.
    out->pdl = cc_major >= 9 && plan.pdl;
    return PF_STATUS_OK;
}

}  // namespace

pf_status gdn_chunk_scan_rows(const GdnScanArgs &a, void *workspace, size_t workspace_bytes,
                              const GdnChunkPlan &plan, cudaStream_t stream) {
    const char *fn = "gdn_chunk_scan_rows";
    const int64_t rows = a.rows;
    const int32_t n_k_heads = a.n_k_heads, n_v_heads = a.n_v_heads;
    PF_TRY(chunk_args_check(fn, a));
    if (rows == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(a.q.ptr && a.k.ptr && a.v.ptr && a.beta.ptr && a.g.ptr && a.state && a.o.ptr,
                 "gdn_chunk_scan_rows: null pointer");
    const size_t need = gdn_chunk_workspace_bytes(rows, n_k_heads, n_v_heads);
    PF_CHECK_ARG(workspace != nullptr && workspace_bytes >= need,
                 "gdn_chunk_scan_rows: workspace of %zu bytes, %zu needed", workspace_bytes, need);
    ChunkLaunch L;
    PF_TRY(chunk_launch(fn, a, plan, 1, &L));
    const bool wg = L.wg, pdl = L.pdl;
    const int sm_count = L.sm_count;
    // Chained sub-passes of plan.subpass_rows (default kGdnSubpassRows). Device run s24-1 (H200,
    // same process, ms, one pass -> 2048-row sub-passes): 16/32 heads T 8192 0.3563 -> 0.3135,
    // T 32768 1.4256 -> 1.1618; 16/48 T 8192 0.4052 -> 0.4047, T 32768 1.6186 -> 1.5687 (other
    // sizes slower or even: docs/notes-archive-2026-12.md,, session 24). The warpgroup state kernel leaves SMs
    // idle (16/32 heads: 64 CTAs on 132 SMs), so the prep of sub-pass p + 1 runs there, beside the
    // state kernel of sub-pass p, into the other half of the workspace; every launch stays in
    // this stream, chained by programmatic dependence: state(p) lets prep(p + 1) start once it has
    // waited for prep(p), whose completion implies state(p - 1)'s (the prep's last CTA waits for
    // it), so that a workspace half is rewritten only after the state grid that read it has
    // completed, and state(p) reads the state only after state(p - 1) has written it. Needs the
    // warpgroup state kernel, PDL and a workspace of two sub-passes (else one pass); the sub-pass
    // boundaries are chunk boundaries, so the bits are those of one pass.
    // A call no longer than one default sub-pass but at least two short ones (a session's
    // 2048-row step) chains the short ones (kGdnShortSubpassRows): the first prep, the one part
    // that nothing overlaps, is half as long.
    const int64_t sub = plan.short_subpass_rows > 0 && rows <= plan.subpass_rows &&
                                rows >= 2 * plan.short_subpass_rows
                            ? plan.short_subpass_rows
                            : plan.subpass_rows;
    const size_t half = sub > 0 ? gdn_chunk_workspace_bytes(sub, n_k_heads, n_v_heads) : 0;
    // Where the state grid (2 CTAs per value head) leaves fewer than half the SMs to the prep, one
    // overlapped prep does not pay for the split: two sub-passes run as one pass there (s24-2,
    // 16/48 heads, T 4096: 0.2124 chained vs 0.2076 ms).
    const bool room = 4 * (int64_t)n_v_heads <= sm_count || rows > 2 * sub;
    const bool chain = sub > 0 && rows > sub && room && wg && pdl && workspace_bytes >= 2 * half;
    const int64_t step = chain ? sub : kGdnPassRows;
    int64_t pass = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += step, ++pass) {
        const int64_t n = rows - r0 < step ? rows - r0 : step;
        const int32_t nc = int32_t((n + kC - 1) / kC);
        Workspace w{};
        workspace_layout(nc, n_k_heads, n_v_heads,
                         static_cast<char *>(workspace) + (chain ? size_t(pass & 1) * half : 0), &w);
        const PrepArgs pa{a.q.rows_from(r0), a.k.rows_from(r0), a.beta.rows_from(r0), a.g.rows_from(r0), n,
                          n_k_heads, n_v_heads, nc, w, SeqTable{}};
        PF_TRY(launch_prep(pa, L.vec_qk, chain && pass > 0, stream));
        const StateArgs sa{a.v.rows_from(r0), a.state, a.o.rows_from(r0), n, n_k_heads, n_v_heads, nc, w,
                           chain ? 1 : 0, SeqTable{}};
        if (wg) PF_TRY(launch_state_wg(sa, L.vec_v, L.pair, pdl, stream));
        else PF_TRY(launch_state_warp(sa, L.vec_v, sm_count, pdl, stream));
    }
    return PF_STATUS_OK;
}

// One pass over every chunk of every sequence: the prep over the flattened chunk table (grid y =
// the call's chunks; each CTA finds its sequence in chunk0), then the state kernel with a
// sequence dimension (grid y = the sequences), as the prep's programmatic dependent. No chained
// sub-passes: with many sequences the state grid fills the SMs (8 x 1024 rows at 16/32 heads:
// 512 CTAs), so there is little to overlap; a call of one or two long sequences is faster through
// gdn_chunk_scan_rows (its sub-passes), with the same bits.
pf_status gdn_chunk_scan_rows_varlen(const GdnScanArgs &a, const GdnSeqs &seqs, void *workspace,
                                     size_t workspace_bytes, const GdnChunkPlan &plan, cudaStream_t stream) {
    const char *fn = "gdn_chunk_scan_rows_varlen";
    const int32_t n_k_heads = a.n_k_heads, n_v_heads = a.n_v_heads;
    PF_TRY(chunk_args_check(fn, a));
    PF_CHECK_ARG(seqs.n >= 0 && seqs.n <= kMaxGridY, "%s: n=%d sequences outside [0, %lld]", fn, seqs.n,
                 (long long)kMaxGridY);
    if (seqs.n == 0) return PF_STATUS_OK;
    PF_CHECK_ARG(seqs.host_rows != nullptr, "%s: host_rows is NULL", fn);
    int64_t sum = 0, chunks = 0;
    for (int32_t i = 0; i < seqs.n; ++i) {
        PF_CHECK_ARG(seqs.host_rows[i] >= 1, "%s: sequence %d has %lld rows (>= 1 each)", fn, i,
                     (long long)seqs.host_rows[i]);
        sum += seqs.host_rows[i];
        chunks += (seqs.host_rows[i] + kC - 1) / kC;
    }
    PF_CHECK_ARG(sum <= a.rows, "%s: the sequences hold %lld rows, the views %lld", fn, (long long)sum,
                 (long long)a.rows);
    // Grid y of the prep, and the TMA maps' row coordinates ([heads x chunks x 64] rows, int32).
    const int64_t heads = n_k_heads > n_v_heads ? n_k_heads : n_v_heads;
    PF_CHECK_ARG(chunks <= kMaxGridY && heads * chunks * kC <= INT32_MAX,
                 "%s: %lld chunks of %d heads in one call (at most %lld, and heads x chunks x 64 < 2^31): "
                 "split the call", fn, (long long)chunks, int(heads), (long long)kMaxGridY);
    PF_CHECK_ARG(a.q.ptr && a.k.ptr && a.v.ptr && a.beta.ptr && a.g.ptr && a.o.ptr, "%s: null pointer", fn);
    PF_CHECK_ARG(seqs.row0 && seqs.rows && seqs.chunk0 && seqs.state, "%s: null sequence table", fn);
    const size_t need = gdn_chunk_varlen_workspace_bytes(chunks, n_k_heads, n_v_heads);
    PF_CHECK_ARG(workspace != nullptr && workspace_bytes >= need, "%s: workspace of %zu bytes, %zu needed",
                 fn, workspace_bytes, need);
    ChunkLaunch L;
    PF_TRY(chunk_launch(fn, a, plan, seqs.n, &L));
    const int32_t nc = int32_t(chunks);
    Workspace w{};
    workspace_layout(nc, n_k_heads, n_v_heads, workspace, &w);
    const SeqTable t{seqs.row0, seqs.rows, seqs.chunk0, seqs.state, seqs.n};
    const PrepArgs pa{a.q, a.k, a.beta, a.g, a.rows, n_k_heads, n_v_heads, nc, w, t};
    PF_TRY(launch_prep(pa, L.vec_qk, false, stream));
    const StateArgs sa{a.v, nullptr, a.o, a.rows, n_k_heads, n_v_heads, nc, w, 0, t};
    if (L.wg) return launch_state_wg(sa, L.vec_v, L.pair, L.pdl, stream);
    return launch_state_warp(sa, L.vec_v, L.sm_count, L.pdl, stream);
}

}  // namespace pf
