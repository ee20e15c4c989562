// model.cu — GGUF -> pf_model: the host-only plan (model_plan.cpp: metadata, the expected
// tensor table checked name by name, shape by shape and type by type), then the upload.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "base/cuda_check.cuh"
#include "plan/gguf.h"
#include "ptx/common.cuh"
#include "runtime/model.h"

namespace pf {
namespace {

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
    device_free(m->ctx, m->arena, m->arena_bytes);
    delete m;
}

std::vector<std::vector<pf_weight *>> model_f16_groups(const pf_model *m, bool fuse) {
    std::vector<std::vector<pf_weight *>> groups;
    std::unordered_set<const pf_weight *> listed;
    auto add = [&](std::vector<pf_weight *> g) {
        for (pf_weight *w : g)
            if (!w || listed.count(w)) return;  // keep it simple: alone below
        listed.insert(g.begin(), g.end());
        groups.push_back(std::move(g));
    };
    if (fuse)
        for (const LayerWeights &L : m->layers) {
            if (L.attn) add({L.wq, L.wk, L.wv});
            else add({L.qkv, L.z, L.beta, L.alpha});
            add({L.gate, L.up});
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
        for (pf_weight *w : {L.attn ? L.wq : L.z})
            if (eight_bit(w)) groups.push_back({w});
        if (fuse && eight_bit(L.gate) && eight_bit(L.up)) {
            groups.push_back({L.gate, L.up});
        } else {
            for (pf_weight *w : {L.gate, L.up})
                if (eight_bit(w)) groups.push_back({w});
        }
    }
    return groups;
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
