// model.cu — GGUF -> pf_model: the host-only plan (model_plan.cpp: metadata, the expected
// tensor table checked name by name, shape by shape and type by type), then the upload.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "base/cuda_check.cuh"
#include "kernels/gemm/gemm.cuh"
#include "kernels/gemm/gemm_q16.cuh"
#include "plan/gguf.h"
#include "runtime/kv_pool.h"
#include "ptx/common.cuh"
#include "runtime/model.h"

namespace pf {
namespace {

constexpr size_t kDefaultPrewarmHeadroom = size_t(2) << 30;  // room for sessions and scratch

// Where planned tensor `p` lands in model `m`.
pf_weight **matrix_slot(pf_model *m, const PlannedTensor &p) {
    switch (p.slot) {
        case TensorSlot::TokEmbd: return &m->tok_embd;
        case TensorSlot::Output: return &m->output;
        case TensorSlot::Layer: return &(m->layers[size_t(p.layer)].*p.mat);
        default: return nullptr;
    }
}

const float **vector_slot(pf_model *m, const PlannedTensor &p) {
    switch (p.slot) {
        case TensorSlot::OutputNorm: return &m->output_norm;
        case TensorSlot::Layer: return &(m->layers[size_t(p.layer)].*p.vec);
        default: return nullptr;
    }
}

}  // namespace

pf_status model_load(pf_context *ctx, const char *path, const pf_model_options &o, pf_model **out) {
    const auto t0 = std::chrono::steady_clock::now();
    GgufFile f;
    PF_TRY(f.open(path));
    ModelPlan plan;
    PF_TRY(model_plan(f, &plan));
    const Hparams &hp = plan.hp;

    std::unique_ptr<pf_model> m(new pf_model());
    m->ref.reset(ctx);
    m->ctx = ctx;
    m->path = path;
    m->hp = hp;
    m->gemm_leg = o.gemm_leg;
    m->progress = o.progress;
    m->progress_user = o.progress_user;
    m->tuning = o.tuning;
    m->layers = plan.layers;
    m->n_attn_layers = plan.n_attn_layers;
    const bool tied = plan.tied;
    const size_t arena_floats = plan.arena_floats, total = plan.tensor_bytes;

    DeviceGuard dg(ctx->device);
    PF_TRY(dg.status());
    pf_model *raw = m.get();
    auto cleanup = [&]() { model_destroy(m.release()); };
    if (pf_status s = device_alloc(ctx, arena_floats * 4, &raw->arena, "model vectors"); s != PF_STATUS_OK) {
        cleanup();
        return s;
    }
    raw->arena_bytes = arena_floats * 4;
    size_t arena_off = 0, done = 0;
    for (const PlannedTensor &e : plan.tensors) {
        const GgufTensor *t = e.t;
        pf_status s = PF_STATUS_OK;
        if (e.kind == TensorKind::Matrix) {
            pf_weight **dst = matrix_slot(raw, e);
            const int64_t rows = t->ne[1], k = t->ne[0];
            s = pf_weight_create(dst, ctx, int32_t(t->type), rows, k, t->data, t->bytes);
            if (s == PF_STATUS_OK) {
                raw->weights.push_back(*dst);
                raw->weight_names.push_back(e.name);
            } else {
                s = fail(s, "%s: uploading %s: %s", path, e.name.c_str(), pf_last_error());
            }
        } else {
            float *dst = static_cast<float *>(raw->arena) + arena_off;
            const cudaError_t ce = cudaMemcpyAsync(dst, t->data, t->bytes, cudaMemcpyHostToDevice, ctx->stream);
            if (ce != cudaSuccess) s = cuda_fail(ce, __FILE__, __LINE__, e.name.c_str());
            *vector_slot(raw, e) = dst;
            arena_off += size_t(t->bytes / 4 + 63) / 64 * 64;
        }
        if (s != PF_STATUS_OK) {
            cleanup();
            return s;
        }
        done += t->bytes;
        if (o.progress) o.progress(o.progress_user, "load", int64_t(done), int64_t(total));
    }
    if (tied) raw->output = raw->tok_embd;
    const cudaError_t ce = cudaStreamSynchronize(ctx->stream);
    if (ce != cudaSuccess) {
        const pf_status s = cuda_fail(ce, __FILE__, __LINE__, "model upload");
        cleanup();
        return s;
    }
    // Fingerprint: the dims and the file size, enough to refuse a state from another model.
    raw->fingerprint = model_fingerprint(hp, f.file_bytes());
    raw->load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (o.prewarm) {
        int32_t armed = 0;
        if (pf_status s = model_prewarm(raw, o.prewarm_headroom_bytes, &armed); s != PF_STATUS_OK) {
            cleanup();
            return s;
        }
        (void)armed;  // not armed: partly cached (the rest streams) or not at all; the report says
    }
    *out = m.release();
    return PF_STATUS_OK;
}

void model_destroy(pf_model *m) {
    if (!m) return;
    DeviceGuard dg(m->ctx->device);
    (void)cudaStreamSynchronize(m->ctx->stream);
    for (pf_weight *w : m->weights) pf_weight_destroy(w);
    kv_pool_destroy(m->kv_pool);
    device_free(m->ctx, m->arena, m->arena_bytes);
    delete m;
}

// The fp16 caches of every matrix (the int8 copies of the recipe's for a model on the 8-bit leg),
// in the layer description's fused groups: pf_model_options.prewarm and pf_model_prewarm.
pf_status model_prewarm(pf_model *m, size_t headroom, int32_t *armed) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t total = 0;  // fp16 bytes of the whole set, for the progress report
    for (const pf_weight *w : m->weights) total += w->n * w->k * int64_t(sizeof(__half));
    if (m->progress) m->progress(m->progress_user, "prewarm", 0, total);
    pf_prewarm_report rep;
    std::memset(&rep, 0, sizeof rep);
    rep.struct_size = sizeof rep;
    const pf_tuning t = tuning_over(m->tuning, m->ctx->tuning);
    PrewarmPlan plan = prewarm_plan(t);
    plan.partial = true;  // what does not fit streams (pf_model_options.prewarm)
    plan.last = m->output;  // the LM head: last (the last-token logits take the GEMV)
    // The cache rule where the sessions' f16 leg reads an uncached block matrix in place (gemm_blocks
    // on, as model_exec_plan resolves it for this device): else an uncached matrix would stream.
    plan.rule = m->gemm_leg != PF_GEMM_F32 && switch_on(t.gemm_blocks, true) && gemm_q16_available(m->ctx->device);
    for (pf_weight *w : m->weights) w->f16_stream = false;
    const bool fuse = switch_on(t.fuse_groups, true);
    // A model whose sessions run the 8-bit leg by default: the recipe's matrices get their int8
    // copy instead of an fp16 one (about half the bytes), the others their fp16 copy.
    std::vector<std::vector<pf_weight *>> f16_groups = model_f16_groups(m, fuse);
    if (m->gemm_leg == PF_GEMM_INT8) {
        PF_TRY(int8_leg_check("model prewarm (gemm_leg PF_GEMM_INT8)"));
        const std::vector<std::vector<pf_weight *>> i8 = model_i8_groups(m, fuse);
        std::unordered_set<const pf_weight *> eight;
        for (const auto &g : i8) eight.insert(g.begin(), g.end());
        std::vector<std::vector<pf_weight *>> rest;
        for (const auto &g : f16_groups) {
            std::vector<pf_weight *> keep;
            for (pf_weight *w : g)
                if (!eight.count(w)) keep.push_back(w);
            if (keep.size() == g.size()) rest.push_back(keep);
            else for (pf_weight *w : keep) rest.push_back({w});  // no longer one block
        }
        f16_groups = std::move(rest);
        for (pf_weight *w : m->weights)
            if (eight.count(w)) weight_drop_f16(w);
        PF_TRY(weight_cache_i8_groups(m->ctx, i8));
    }
    PF_TRY(prewarm_f16_groups(m->ctx, f16_groups, headroom ? headroom : kDefaultPrewarmHeadroom, plan, &rep));
    if (rep.partial || m->gemm_leg == PF_GEMM_INT8)  // matrices without an fp16 copy stream on the
        for (pf_weight *w : m->weights)                // f16 leg under AUTO / F16
            w->f16_stream = w->f16 == nullptr;
    m->ctx->weight_forms++;  // f16_stream may have moved without an arena made or freed
    m->prewarm_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    m->prewarm_report = rep;
    *armed = rep.armed;
    if (m->progress) m->progress(m->progress_user, "prewarm", total, total);
    return PF_STATUS_OK;
}

std::vector<std::vector<pf_weight *>> model_f16_groups(const pf_model *m, bool fuse) {
    std::vector<std::vector<pf_weight *>> groups;
    std::unordered_set<const pf_weight *> listed;
    if (fuse)  // the layer description's groups of several parts, in layer order
        for (const LayerWeights &L : m->layers) {
            const ProjGroup *gs = layer_groups(L.attn);
            for (int32_t gi = 0; gi < kLayerGroups; ++gi) {
                if (gs[gi].count < 2) continue;
                std::vector<pf_weight *> g;
                for (int32_t i = 0; i < gs[gi].count; ++i) g.push_back(L.*gs[gi].parts[i]);
                bool fresh = true;  // keep it simple: a weight listed before makes the others alone
                for (pf_weight *w : g) fresh = fresh && w && !listed.count(w);
                if (!fresh) continue;
                listed.insert(g.begin(), g.end());
                groups.push_back(std::move(g));
            }
        }
    for (pf_weight *w : m->weights)
        if (listed.insert(w).second) groups.push_back({w});
    return groups;
}

std::vector<std::vector<pf_weight *>> model_i8_groups(const pf_model *m, bool fuse) {
    auto eight_bit = [](const pf_weight *w) {
        return w && w->k % 16 == 0 && w->qtype != PF_QTYPE_F32 && w->qtype != PF_QTYPE_F16 &&
               w->qtype != PF_QTYPE_BF16;
    };
    std::vector<std::vector<pf_weight *>> groups;
    for (const LayerWeights &L : m->layers) {
        const ProjGroup *gs = layer_groups(L.attn);
        for (int32_t gi = 0; gi < kLayerGroups; ++gi) {
            // The group's recipe members: one arena (fused) when there are several and all are
            // 8-bit-able, else each 8-bit-able one alone.
            std::vector<pf_weight *> members;
            for (int32_t i = 0; i < gs[gi].count; ++i)
                if (gs[gi].int8_recipe & (1u << i)) members.push_back(L.*gs[gi].parts[i]);
            bool all = true;
            for (pf_weight *w : members) all = all && eight_bit(w);
            if (fuse && all && members.size() > 1) {
                groups.push_back(members);
                continue;
            }
            for (pf_weight *w : members)
                if (eight_bit(w)) groups.push_back({w});
        }
    }
    return groups;
}

ExecPlan model_exec_plan(const pf_model *m, int32_t gemm_leg, const pf_tuning &tuning, int32_t attn_path,
                         int32_t kv_dtype, int32_t cuda_graphs) {
    const pf_tuning t = tuning_over(tuning, tuning_over(m->tuning, m->ctx->tuning));
    ExecPlan p = exec_plan(gemm_leg ? gemm_leg : m->gemm_leg, t, attn_path, kv_dtype, cuda_graphs == 1);
    p.gemm_blocks = p.gemm_blocks && gemm_q16_available(m->ctx->device);  // the device's part of the choice
    return p;
}

void model_info(const pf_model *m, pf_model_info *o) {
    hparam_info(m->hp, m->n_attn_layers, m->output == m->tok_embd, o);
    bool armed = !m->weights.empty();
    for (const pf_weight *w : m->weights) {
        o->weight_bytes += w->bytes;
        if (w->f16) o->f16_bytes += size_t(w->n) * size_t(w->k) * 2;
        else armed = false;
    }
    o->f16_armed = armed;
    o->load_ms = m->load_ms;
    o->prewarm_ms = m->prewarm_ms;
}

}  // namespace pf
