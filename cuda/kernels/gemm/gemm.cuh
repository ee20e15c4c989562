// gemm.cuh — projections Y = X . W^T along a route (plan/route.h: the leg and the weight's form),
// the weights' fp16 caches and the all-or-nothing fp16 prewarm. Internal host entry points
// (namespace pf); the C API is in api/api_gemm.cu.
#pragma once

#include <climits>
#include <cstdint>
#include <vector>

#include "base/context.h"
#include "base/mat.h"
#include "kernels/dequant/prewarm.cuh"  // prewarm_job
#include "plan/plan.h"  // PrewarmPlan
#include "plan/route.h"  // ProjRoute, WeightFacts
#include "prefill.h"

namespace pf {

class GemmPlan;    // gemm_lt.cuh
struct SlabRing;   // slab_ring.cuh

// What a route reads of w now: its type, shape and copies.
inline WeightFacts weight_facts(const pf_weight *w) {
    WeightFacts f;
    f.qtype = w->qtype;
    f.n = w->n;
    f.k = w->k;
    f.f16 = w->f16 != nullptr;
    f.f16_stream = w->f16_stream;
    f.i8 = w->i8 != nullptr;
    return f;
}

// Where a projection runs: the context (its stream and cuBLAS handles), the scratch it may use
// and, on the f16 leg, the per-shape GEMM choices. Kernel-level calls (api_gemm.cu) run with the
// context's grow-on-demand scratch and no plan (cublasGemmEx); a chunk executor with fixed slices
// of its workspace (sized at creation: a call that would need more is an INTERNAL error, never an
// allocation) and its plan.
struct ProjEnv {
    pf_context *ctx = nullptr;
    const GemmPlan *plan = nullptr;  // gemm_lt.cuh; nullptr: cublasGemmEx
    Scratch *w32 = nullptr;          // f32 leg: dequantized weight slabs (nullptr: ctx->scratch_f32)
    Scratch *w16 = nullptr;          // f16 streaming leg: fp16 weight slabs (ctx->scratch_f16_w)
    Scratch *x16 = nullptr;          // f16 leg: activations rounded to fp16 + row scales (ctx->scratch_f16_x)
    // F16Blocks: calls of at least this many rows run per-call fp16 slabs in w16 and the GEMM of
    // the cache on them (plan.h blocks_slab_rows: the session's plan, or ctx's tuning).
    int64_t blocks_slab_rows = INT64_MAX;
    // F16Blocks: calls of at most this many rows on Q4_K / Q5_K / Q6_K run the GEMV form (plan.h
    // blocks_gemv_rows).
    int64_t blocks_gemv_rows = 0;
    // F16Blocks at the slab rows: slabs dequantized ahead on a stream of their own (an executor's
    // step with tuning gemm_blocks_ring; slab_ring.cuh), or nullptr (in line).
    SlabRing *ring = nullptr;
};
// The kernel-level environment of ctx.
inline ProjEnv proj_env(pf_context *ctx) {
    ProjEnv e;
    e.ctx = ctx;
    e.w32 = &ctx->scratch_f32;
    e.w16 = &ctx->scratch_f16_w;
    e.x16 = &ctx->scratch_f16_x;
    e.blocks_slab_rows = blocks_slab_rows(ctx->tuning);
    e.blocks_gemv_rows = blocks_gemv_rows(ctx->tuning);
    return e;
}

// A projection's input: fp32 rows, or the f16 leg's input form as a producer writes it
// (kernels/rows/f16_rows.cuh: fp16 rows [rows][k] with row stride k, scaled per row by a power of
// two where a row exceeds the fp16 range, the inverse scales beside them, and the accumulate
// target pre-scaled by the producer).
struct ProjIn {
    CMatF x;                      // fp32 rows, x.ld >= k (when x16 is null)
    const __half *x16 = nullptr;  // fp16 rows [rows][k]
    const float *inv = nullptr;   // their inverse row scales [rows]; nullptr: every row unscaled
    static ProjIn f32(CMatF x) {
        ProjIn in;
        in.x = x;
        return in;
    }
    static ProjIn f16(const __half *x16, const float *inv) {
        ProjIn in;
        in.x16 = x16;
        in.inv = inv;
        return in;
    }
};

// Projection through weight w ([n][k] GGUF blocks, n = w->n, k = w->k) along route r (plan/route.h,
// made from weight_facts(w)):
//   Y[r][j] = (accumulate ? Y[r][j] : 0) + sum_i X[r][i] * W[j][i]   for r < rows, j < n
// Y: device fp32, y.ld >= n; columns [n, y.ld) are never touched. X and Y must not overlap.
// rows == 0 is a no-op. One case per weight form:
//  - F32 (in place) / F32Slabs: cuBLAS SGEMM on ctx->blas_f32 (pedantic math, no TF32), the
//    blocks dequantized to fp32 slabs in env.w32 first.
//  - F16Cache / F16 (in place) / F16Slabs: fp32 X rounded to fp16 into env.x16; fp16 x fp16 ->
//    fp32 with fp32 compute (gemm_lt.cuh gemm_f16: cublasGemmEx, or the cuBLASLt algorithm
//    env.plan has for the shape); the slabs dequantized per call into env.w16 ("streaming").
//    A row of X with max|x| > 32768 is scaled by a power of two 2^-e before the cast and its
//    output row by 2^e after (exact; with accumulate the existing Y row is pre-scaled by 2^-e
//    so that the GEMM's beta = 1 adds in the scaled domain): activations never become Inf.
//  - F16Blocks: the GEMM on the GGUF blocks dequantized on the chip (gemm_q16.cuh; one fp32 row:
//    the GEMV); from env.blocks_slab_rows rows on, the blocks dequantized per call into fp16
//    slabs in env.w16 (the prewarm's kernel: the cache's bits) and the cache's GEMM on them.
//  - I8Copy / I8Slabs: the 8-bit leg (project_i8).
//  - rows == 1 on a slab form (F32Slabs, F16Slabs): the fused GEMV (qgemm.cuh) reads the blocks
//    once with fp32 math instead of dequantizing the whole weight for one token.
// fp16 input rows (in.x16): F16Cache / F16 / F16Blocks run the GEMM on them as they are and unscale
// (bitwise what the fp32 path returns for the producer's fp32 twin output); I8Copy quantizes them to int8
// (no accumulate); other forms take fp32 rows (INVALID_ARGUMENT).
// Sizes (rows, n, k, x.ld, y.ld) must fit in int32 (cuBLAS). Asynchronous on ctx->stream.
pf_status project(const ProjEnv &env, const ProjRoute &r, pf_weight *w, const ProjIn &in, MatF y, int64_t rows,
                  bool accumulate);

// The scratch bytes project(env, r, w, fp32 rows, ., rows, .) needs in each of ProjEnv's three
// (for an executor's workspace: the largest over its weights).
struct ProjScratchBytes {
    size_t w32 = 0, w16 = 0, x16 = 0;
};
// blocks_slab_rows: ProjEnv's (F16Blocks from that many rows on needs the slabs' w16).
ProjScratchBytes project_scratch_bytes(const ProjRoute &r, const pf_weight *w, int64_t rows,
                                       int64_t blocks_slab_rows);
// Appends to `jobs` the prewarm jobs that dequantize `count` matrices of one k side by side from
// dst on ([sum n][k] fp16: a fused group's cache, or its slab); returns the end, dst + sum n k.
__half *append_side_by_side(std::vector<prewarm_job> &jobs, const pf_weight *const *parts, size_t count,
                            __half *dst);
// Whether the per-call fp16 slabs hold w (a matrix, or a fused view of the blocks) whole: one
// slab, one GEMM (what a slab ring's job is).
bool slab_whole(const pf_weight *w);
// Appends the n of each GEMM that the per-call fp16 slabs run for w (or a fused view of the
// blocks), in order: for the executor's GEMM plan, the shapes it times.
void slab_gemm_widths(const pf_weight *w, std::vector<int64_t> *out);

// Fills w->f16 (n*k fp16, row-major [n][k]) from w's blocks; a no-op when already cached.
// OUT_OF_MEMORY leaves w uncached and the context usable.
pf_status weight_cache_f16(pf_weight *w);
// Drops w->f16; the arena holding it is freed (after the context's stream drains) when w was
// its last cached weight. A no-op when not cached.
pf_status weight_drop_f16(pf_weight *w);

// All-or-nothing fp16 caching of a set of weights of ctx (NULL entries are invalid; repeated
// entries count once; already cached weights count as done). Arms only when the bytes still
// needed + headroom_bytes <= the device's free memory; on a shortfall or an allocation failure
// every cache made by this call is freed, report->armed = 0 with the reason in
// report->reason, and the status is OK. CUDA faults return their status (after the rollback).
// A few allocations ("pieces", gemm.cu plan_pieces: whole fused groups each, the first small,
// each next twice the last) hold every cache the call makes, each freed with the last of its
// caches; each piece is filled by the batched dequantization of prewarm.cu as soon as it is
// allocated, while the next is allocated (plan: the first piece's bytes, a piece made to fail
// for tests). report->device_ms times the launches on the device.
// Synchronizes ctx->stream. `report` may be NULL.
pf_status prewarm_f16(pf_context *ctx, pf_weight *const *weights, int32_t count,
                      size_t headroom_bytes, const PrewarmPlan &plan, pf_prewarm_report *report);

// prewarm_f16 over groups of weights that share an input (a model's Q|K|V, its GDN
// in-projections, FFN gate|up): a group of >= 2 weights with the same k, none cached yet and
// none listed before, has its fp16 caches back to back in the group's order ([sum n][k],
// row-major), so that one GEMM can run them all (fused_f16_view); the bytes are the same as
// separate caches. Other members are cached alone. Same contract otherwise
// (all or nothing, the report counts weights). prewarm_f16 is this with groups of one.
pf_status prewarm_f16_groups(pf_context *ctx, const std::vector<std::vector<pf_weight *>> &groups,
                             size_t headroom_bytes, const PrewarmPlan &plan, pf_prewarm_report *report);

// OK where the 8-bit leg can run (gemm_i8_available), else UNSUPPORTED naming `who` and Hopper.
pf_status int8_leg_check(const char *who);

// Weight rows per dequantized slab of `elem_bytes` elements (the bound every leg's slabs keep).
int64_t weight_slab_rows(int64_t n, int64_t k, size_t elem_bytes);

// The 8-bit leg (gemm_i8.cu; recipe in docs/int8-recipe.md): X quantized per row and 128
// columns into env.x16 (codes, then scales), W from its int8 copy (w->i8) or, without one,
// dequantized to fp32 slabs in env.w32 and put in the rank-1 form in env.w16 slab by slab; the
// product on the int8 tensor cores (gemm_i8), fp32 output. UNSUPPORTED off sm_90a / compute
// capability 9.0 and for k % 16 != 0 (route_of_leg). Called by project() for the 8-bit leg's forms.
pf_status project_i8(const ProjEnv &env, pf_weight *w, const float *x, int64_t rows, int64_t ldx,
                     float *y, int64_t ldy, bool accumulate);
// The 8-bit leg on the f16 leg's input form (x16 [rows][k] fp16, inverse row scales inv): the
// producers' fp16 rows quantized to int8 (x = x16 * inv; the fp16 rounding, 2^-11, is far below
// an int8 step), no accumulate. w must have its int8 copy. project() for I8Copy on fp16 rows.
pf_status project_i8_rows(const ProjEnv &env, pf_weight *w, const __half *x16, const float *inv,
                          int64_t rows, MatF y);
// Scratch of project_i8: activations (env.x16), a streamed weight's slab form (env.w16; its
// fp32 slab in env.w32 is i8_weight_slab_rows(n, k) rows).
size_t i8_activation_bytes(int64_t rows, int64_t k);
size_t i8_streaming_bytes(int64_t n, int64_t k);
int64_t i8_weight_slab_rows(int64_t n, int64_t k);
// Fills the int8 copies (rank-1 form) of groups of weights that share an input: a group whose
// members all need one and whose rows are whole 128-row blocks (the last may be ragged) gets one
// arena with its members back to back, so that one GEMM runs them all (fused_i8_view); others
// are cached member by member. Already cached weights are skipped. OUT_OF_MEMORY leaves the
// group uncached. Synchronizes the stream.
pf_status weight_cache_i8_groups(pf_context *ctx, const std::vector<std::vector<pf_weight *>> &groups);
pf_status weight_cache_i8(pf_weight *w);
// Drops w's int8 copy; its arena is freed (after the stream drains) with the last member.
void weight_drop_i8(pf_weight *w);
// When parts (in order) are the consecutive members of one int8 group: *view = a weight of
// n = sum of n whose int8 copy is the group's (fused_view's I8Copy case).
bool fused_i8_view(pf_weight *const *parts, int32_t count, pf_weight *view);

// When every weight of `parts` (in order) runs route r and their copies of that route are
// consecutive slices of one fused block (prewarm_f16_groups for F16Cache, weight_cache_i8_groups
// for I8Copy), fills *view with a weight of n = sum of n, the same k, whose copy is the block:
// project() through it writes the parts' outputs side by side ([rows][n_0 | n_1 | ...]). F16Blocks
// parts of one k make a view that lists them (pf_weight::parts): the per-call slabs dequantize
// them side by side into one slab and run one GEMM (the cache's fused GEMM, bit for bit), fewer
// rows run them one by one. The view owns nothing (a value on the caller's stack; never
// destroyed), and `parts` must outlive it. False otherwise (and for every other form): the caller
// runs the parts one by one.
bool fused_view(const ProjRoute &r, pf_weight *const *parts, int32_t count, pf_weight *view);
// A fused view's common fields: first's context, type and k, n rows, no copy, no parts, no
// reference of its own (the views fill their form's fields after).
void bare_view(const pf_weight *first, int64_t n, pf_weight *view);

}  // namespace pf
