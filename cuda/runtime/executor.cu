// executor.cu — the chunk executor's layout, creation (one workspace, the GEMM plan of its
// shapes) and the LM head. The layer loop and the graphs are in forward.cu.
#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "base/cuda_check.cuh"
#include "kernels/attention/attention.cuh"
#include "kernels/gdn/gdn.cuh"
#include "kernels/gemm/gemm.cuh"
#include "kernels/gemm/gemm_lt.cuh"
#include "plan/defaults.h"
#include "runtime/executor.h"
#include "runtime/project.h"
#include "runtime/model.h"  // model_i8_groups
#include "runtime/sequence.h"

namespace pf {
namespace {

constexpr int32_t kMinAutoStepRows = 256;
constexpr size_t kAutoStepShare = 4;  // the step's scratch takes at most 1/4 of the free memory
constexpr size_t kStreamReserve = size_t(768) << 20;  // a streaming model's scratch beside the chunk
constexpr int64_t kLmRows = 32;        // LM-head rows per pass for PF_LOGITS_ALL: [32][n_vocab] fp32
constexpr int64_t kSideStreams = 16;   // streams for the items' attention (a decode item's flash
                                       // grid is a few blocks: 16 of them side by side fill more SMs)

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// The f16-leg GEMM shapes of a step of e->L.step_rows rows: the GEMMs the layer loop runs
// (for_each_gemm over the layer description's groups: a fused block or a part, the accumulating
// out-projections into the residual stream), each with the fp16 matrix it reads; then the
// executor's plan (the process's choice per shape, timed for the shapes it has none for yet) on
// the workspace: x = h16 [rows][k16] fp16, y = a [rows][w_a] (the accumulating shapes too: never
// the residual stream x, the caches or the states). The slabs of a streamed matrix run GemmEx.
pf_status plan_gemms(Executor *e) {
    const pf_model *m = e->model;
    const Hparams &hp = m->hp;
    const int64_t T = e->L.step_rows, d = hp.n_embd;
    std::vector<GemmTuneJob> jobs;
    for (const LayerWeights &Lw : m->layers) {
        const ProjGroup *groups = layer_groups(Lw.attn);
        for (int32_t gi = 0; gi < kLayerGroups; ++gi) {
            const ProjGroup &g = groups[gi];
            const int64_t ldy = g.accumulate ? d : group_width(Lw, g);
            PF_TRY(for_each_gemm(e->plan, Lw, g, [&](const ProjRoute &r, pf_weight *w, int64_t) {
                const __half *whole = r.weight == WeightForm::F16Cache ? w->f16
                                      : r.weight == WeightForm::F16    ? static_cast<const __half *>(w->data)
                                                                       : nullptr;
                GemmTuneJob j;
                j.shape = GemmShape{w->n, T, w->k, ldy, g.accumulate};
                j.w = whole;
                if (r.weight == WeightForm::F16Blocks && T >= e->plan.blocks_slab_rows) {
                    // The blocks' per-call slabs: timed on the slab scratch (reserved above; its
                    // contents do not matter for the timing), each GEMM's shape.
                    std::vector<int64_t> widths;
                    slab_gemm_widths(w, &widths);
                    j.w = static_cast<const __half *>(e->w16.ptr);
                    for (const int64_t n : widths) {
                        j.shape.n = n;
                        jobs.push_back(j);
                    }
                    return PF_STATUS_OK;
                }
                if (!whole) return PF_STATUS_OK;  // not the f16 leg, or its streaming slabs
                jobs.push_back(j);
                return PF_STATUS_OK;
            }));
        }
    }
    if (jobs.empty()) return PF_STATUS_OK;  // the f32 leg, or no fp16 copies
    std::unique_ptr<GemmPlan> plan(new GemmPlan());
    PF_TRY(gemm_plan_build(e->ctx, jobs, e->h16, size_t(T * e->L.k16), e->a, size_t(T * e->L.w_a), e->plan.gemm_lt,
                           plan.get()));
    if (plan->size() > 0) e->gemm_plan = std::move(plan);  // none: every call runs GemmEx
    return PF_STATUS_OK;
}

// The slab ring's jobs (plan.blocks_ring): the layer loop's GEMMs on blocks whose slab holds them
// whole (for_each_gemm over the layer description's groups, in the order the layers run them),
// then its buffers. A ring the device memory does not hold stays off (the slabs in line).
pf_status ring_jobs(Executor *e) {
    SlabRing &r = e->ring;
    for (const LayerWeights &Lw : e->model->layers) {
        const ProjGroup *groups = layer_groups(Lw.attn);
        for (int32_t gi = 0; gi < kLayerGroups; ++gi)
            PF_TRY(for_each_gemm(e->plan, Lw, groups[gi], [&](const ProjRoute &rt, pf_weight *w, int64_t) {
                if (rt.weight != WeightForm::F16Blocks || !slab_whole(w)) return PF_STATUS_OK;
                SlabRing::Job j;
                if (w->nparts > 0) j.parts.assign(w->parts, w->parts + w->nparts);
                else j.parts.push_back(w);
                j.n = w->n;
                j.k = w->k;
                r.jobs.push_back(std::move(j));
                return PF_STATUS_OK;
            }));
    }
    r.weight_forms = e->ctx->weight_forms.load();
    return slab_ring_alloc(e->ctx, &r, e->plan.blocks_ring);
}

// The cuBLAS attention path's workspace: the path is chosen per call (attention_resolved_path):
// always cuBLAS for an fp32 cache or a forced path, and with AUTO also for short chunks deep into
// the cache (few flash blocks, many keys). Sized for the most query rows a cuBLAS call of this
// executor can have, at keys up to the capacity (the choice is monotone: fewer rows and more keys
// favour cuBLAS); attention() runs smaller passes where a call needs more.
size_t attention_ws_bytes(const pf_model *m, const ExecPlan &plan, int64_t T, int64_t capacity, void *k, void *v,
                          bool paged) {
    const Hparams &hp = m->hp;
    if (m->n_attn_layers == 0) return 0;
    AttentionArgs a;
    a.k_cache = k;
    a.v_cache = v;
    // Paged sequences: the cuBLAS path gathers their rows first (the table's address is not
    // read here, only whether there is one).
    if (paged) a.pages = KvPages{reinterpret_cast<const int32_t *>(k), kKvPageGranule};
    a.kv_dtype = plan.kv_dtype;
    a.n_heads = int32_t(hp.n_head);
    a.n_kv_heads = int32_t(hp.n_head_kv);
    a.head_dim = int32_t(hp.head_dim);
    a.path = plan.attn_path;
    auto cublas_at = [&](int64_t rows) {
        a.rows = rows;
        a.pos0 = capacity - rows;
        return attention_resolved_path(a) == PF_ATTN_CUBLAS;
    };
    int64_t rows = 0;  // the most rows of a cuBLAS call (0: never)
    if (cublas_at(T)) {
        rows = T;
    } else if (cublas_at(1)) {
        int64_t lo = 1, hi = T;  // cublas_at(lo), !cublas_at(hi)
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            (cublas_at(mid) ? lo : hi) = mid;
        }
        rows = lo;
    }
    if (rows == 0) return 0;
    a.path = PF_ATTN_CUBLAS;
    a.rows = rows;
    a.pos0 = capacity - rows;
    return attention_workspace_bytes(a, attention_rows_per_pass(a));
}

}  // namespace

StepLayout step_layout(const Hparams &hp, int64_t step_rows, int64_t max_items, int64_t ids, int64_t n_gdn) {
    StepLayout L;
    const int64_t T = step_rows;
    const int64_t Hv = std::max<int64_t>(hp.ssm_hv, 1);
    L.step_rows = T;
    L.lm_rows = std::min<int64_t>(kLmRows, T);
    L.d = hp.n_embd;
    L.w_a = std::max({hp.q_proj_dim() + 2 * hp.kv_dim(), hp.conv_dim() + hp.value_dim() + 2 * Hv, 2 * hp.n_ff});
    L.w_b = hp.conv_dim();
    L.w_o = std::max(hp.n_head * hp.head_dim, hp.value_dim());
    L.w_gate = Hv;
    L.k16 = std::max({L.d, hp.n_ff, hp.n_head * hp.head_dim, hp.value_dim()});
    L.max_items = max_items;
    L.ids = ids;
    if (hp.ssm_hv > 0 && gdn_chunk_supported(int32_t(hp.ssm_dk), int32_t(hp.ssm_dv))) {
        L.gdn_ws = gdn_chunk_workspace_bytes(T, int32_t(hp.ssm_hk), int32_t(hp.ssm_hv));
        if (max_items > 1)  // a varlen pass holds every chunk of a step: at most T/64 + items
            L.gdn_ws = std::max(L.gdn_ws, gdn_chunk_varlen_workspace_bytes((T + 63) / 64 + max_items,
                                                                           int32_t(hp.ssm_hk), int32_t(hp.ssm_hv)));
    }
    // varlen tables: all (row0, rows, windows), chunked (row0, rows, chunk0, states), sequential
    // (row0, rows, states)
    if (max_items > 1 && n_gdn > 0) L.tab = 7 * max_items + 1 + 3 * n_gdn * max_items;
    size_t at = 0;
    auto take = [&](size_t bytes) {
        const size_t off = at;
        at += align256(bytes);
        return off;
    };
    const size_t f = sizeof(float);
    L.off_x = take(size_t(T * L.d) * f);
    L.off_h = take(size_t(T * L.d) * f);
    L.off_a = take(size_t(T * L.w_a) * f);
    L.off_b = take(size_t(T * L.w_b) * f);
    L.off_o = take(size_t(T * L.w_o) * f);
    L.off_beta = take(size_t(T * L.w_gate) * f);
    L.off_g = take(size_t(T * L.w_gate) * f);
    L.off_h16 = take(size_t(T * L.k16) * sizeof(__half));
    L.off_inv16 = take(size_t(T) * f);
    L.off_gdn = take(L.gdn_ws);
    L.row_bytes = at;  // everything above grows with the rows
    L.off_logits = take(size_t(L.lm_rows) * size_t(hp.n_vocab) * f);
    L.off_xg = take(size_t(L.lm_rows * L.d) * f);
    L.off_ids = take(size_t(ids) * sizeof(int32_t));
    L.off_vals = take(size_t(1 + max_items) * sizeof(int64_t));
    L.off_argmax = take(size_t(max_items) * sizeof(int32_t));
    L.off_tab = take(size_t(L.tab) * sizeof(int64_t));
    L.bytes = at;
    return L;
}

pf_status auto_step_rows(const pf_context *ctx, const Hparams &hp, int32_t cap, size_t state_bytes, bool streaming,
                         int32_t base, int32_t *out) {
    size_t free_b = 0, total_b = 0;
    PF_TRY(device_free_bytes(ctx, &free_b, &total_b));
    size_t avail = free_b > state_bytes ? free_b - state_bytes : 0;
    // A partly cached model streams every uncached matrix once per chunk: a smaller chunk costs
    // that again per row (qwen35-27b under a 24 GiB budget, 8192 tokens: 0.79x the cached speed
    // at the old auto chunk, 0.85x at 2048), so its chunk may take all the memory left but the
    // streaming scratch (at most one 512 MiB slab and the activations).
    const size_t share = streaming ? 1 : kAutoStepShare;
    if (streaming) avail = avail > kStreamReserve ? avail - kStreamReserve : 0;
    int32_t c = std::min(base, cap);
    while (c > kMinAutoStepRows && step_layout(hp, c, 1, 0).row_bytes > avail / share) c /= 2;
    *out = c;
    return PF_STATUS_OK;
}

Executor::~Executor() {
    if (!ctx) return;
    DeviceGuard dg(ctx->device);
    (void)cudaStreamSynchronize(ctx->stream);
    for (StepGraph &g : graphs)
        for (cudaGraphExec_t x : g.segs) (void)cudaGraphExecDestroy(x);
    for (cudaStream_t s : side) (void)cudaStreamDestroy(s);
    for (cudaEvent_t ev : side_ev) (void)cudaEventDestroy(ev);
    slab_ring_free(ctx, &ring);
    gemm_plan.reset();
    scratch_release(ctx, w32);
    scratch_release(ctx, w16);
    scratch_release(ctx, x16);
    device_free(ctx, attn_ws, attn_ws_bytes);
    device_free(ctx, ws, L.bytes);
}

void executor_destroy(Executor *e) { delete e; }

pf_status executor_create(const pf_model *m, const ExecPlan &plan, int64_t step_rows, int64_t capacity,
                          int64_t max_items, int64_t ids, Executor **out) {
    *out = nullptr;
    std::unique_ptr<Executor> e(new Executor());
    e->model = m;
    e->ctx = m->ctx;
    e->plan = plan;
    e->capacity = capacity;
    for (const LayerWeights &Lw : m->layers) e->gdn_slot.push_back(Lw.attn ? -1 : int32_t(e->n_gdn++));
    e->L = step_layout(m->hp, step_rows, max_items, ids, e->n_gdn);
    const StepLayout &L = e->L;
    pf_context *ctx = m->ctx;
    PF_TRY(device_alloc(ctx, L.bytes, &e->ws, "executor workspace"));
    char *base = static_cast<char *>(e->ws);
    e->x = reinterpret_cast<float *>(base + L.off_x);
    e->h = reinterpret_cast<float *>(base + L.off_h);
    e->a = reinterpret_cast<float *>(base + L.off_a);
    e->b = reinterpret_cast<float *>(base + L.off_b);
    e->o = reinterpret_cast<float *>(base + L.off_o);
    e->beta = reinterpret_cast<float *>(base + L.off_beta);
    e->g = reinterpret_cast<float *>(base + L.off_g);
    e->h16 = reinterpret_cast<__half *>(base + L.off_h16);
    e->inv16 = reinterpret_cast<float *>(base + L.off_inv16);
    e->gdn_ws = L.gdn_ws ? base + L.off_gdn : nullptr;
    e->logits = reinterpret_cast<float *>(base + L.off_logits);
    e->xg = reinterpret_cast<float *>(base + L.off_xg);
    e->ids = reinterpret_cast<int32_t *>(base + L.off_ids);
    e->vals = reinterpret_cast<int64_t *>(base + L.off_vals);
    e->argmax = reinterpret_cast<int32_t *>(base + L.off_argmax);
    e->tab = L.tab ? reinterpret_cast<int64_t *>(base + L.off_tab) : nullptr;
    e->tab_host.reserve(size_t(L.tab));
    e->tab_dev_copy.reserve(size_t(L.tab));
    // The cuBLAS attention path's workspace (its size needs aligned cache pointers: the base is).
    e->paged_kv = m->kv_pool != nullptr;
    e->attn_ws_bytes = attention_ws_bytes(m, plan, step_rows, capacity, e->ws, e->ws, e->paged_kv);
    if (e->attn_ws_bytes) PF_TRY(device_alloc(ctx, e->attn_ws_bytes, &e->attn_ws, "attention workspace"));
    if (max_items > 1 && m->n_attn_layers > 0) {  // the items' attention side by side
        const int64_t k = std::min<int64_t>(max_items, kSideStreams);
        for (int64_t j = 0; j < k; ++j) {
            cudaStream_t s = nullptr;
            PF_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            e->side.push_back(s);
        }
        for (int64_t j = 0; j <= k; ++j) {
            cudaEvent_t ev = nullptr;
            PF_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
            e->side_ev.push_back(ev);
        }
    }
    // The projection scratch for the legs and caches of now: a step then allocates nothing (as long
    // as the weights' caches stay as they are now; else the scratch grows on the call).
    // The 8-bit leg: the int8 copies of the recipe's matrices (kept by the model's weights, shared
    // by its later sessions); a device it cannot run on is UNSUPPORTED here, before any step.
    if (plan.leg == PF_GEMM_INT8) {
        PF_TRY(int8_leg_check("session (gemm_leg PF_GEMM_INT8)"));
        PF_TRY(weight_cache_i8_groups(ctx, model_i8_groups(m, plan.fuse_groups)));
    }
    // Every GEMM a step runs, as for_each_gemm walks them (a fused view of the blocks needs its
    // group's slab; the cache's views no more than their parts: one k).
    ProjScratchBytes need;
    auto grow_by = [&](const ProjRoute &route, const pf_weight *w, int64_t r) {
        const ProjScratchBytes b = project_scratch_bytes(route, w, r, plan.blocks_slab_rows);
        need.w32 = std::max(need.w32, b.w32);
        need.w16 = std::max(need.w16, b.w16);
        need.x16 = std::max(need.x16, b.x16);
        return PF_STATUS_OK;
    };
    for (const LayerWeights &Lw : m->layers) {
        const ProjGroup *groups = layer_groups(Lw.attn);
        for (int32_t gi = 0; gi < kLayerGroups; ++gi)
            PF_TRY(for_each_gemm(plan, Lw, groups[gi], [&](const ProjRoute &r, pf_weight *w, int64_t) {
                return grow_by(r, w, step_rows);
            }));
    }
    ProjRoute out_route;
    PF_TRY(step_route(plan, m->output, &out_route));
    PF_TRY(grow_by(out_route, m->output, L.lm_rows));
    PF_TRY(scratch_reserve(ctx, e->w32, need.w32, "project (f32 leg): weight scratch"));
    PF_TRY(scratch_reserve(ctx, e->w16, need.w16, "project (f16 streaming leg): weight scratch"));
    PF_TRY(scratch_reserve(ctx, e->x16, need.x16, "project (f16 leg): activation scratch"));
    // The f16 leg's GEMM algorithms for the step's projection shapes (times the shapes the process
    // has not chosen for yet, on the workspace; synchronizes).
    if (plan.gemm_lt != kGemmLtOff) PF_TRY(plan_gemms(e.get()));
    if (plan.blocks_ring > 0 && plan.gemm_blocks && step_rows >= plan.blocks_slab_rows) PF_TRY(ring_jobs(e.get()));
    *out = e.release();
    return PF_STATUS_OK;
}

pf_status executor_upload_ids(Executor *e, const int32_t *tokens, int64_t n, int64_t off) {
    PF_CHECK_ARG(off >= 0 && n >= 0 && off + n <= e->L.ids, "executor: %lld ids at %lld exceed its %lld",
                 (long long)n, (long long)off, (long long)e->L.ids);
    PF_CUDA_TRY(cudaMemcpyAsync(e->ids + off, tokens, size_t(n) * 4, cudaMemcpyHostToDevice, e->ctx->stream));
    return PF_STATUS_OK;
}

void executor_begin(Executor *e) {
    // Every matrix's route takes fp16 rows (route_takes_f16_rows: its fp16 cache, or its int8 copy
    // where the session runs it on the 8-bit leg): then, on a fast leg, the producers write the
    // f16 leg's input form (the act16 route). A step graph is keyed on both.
    bool f16_rows = true;
    for (const pf_weight *w : e->model->weights) {
        ProjRoute r;
        if (step_route(e->plan, w, &r) != PF_STATUS_OK || !route_takes_f16_rows(r)) f16_rows = false;
    }
    e->f16_rows = f16_rows;
    e->act16 = e->plan.f16_producers && f16_rows && e->plan.leg != PF_GEMM_F32;
}

}  // namespace pf
