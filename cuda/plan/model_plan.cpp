// model_plan.cpp — see model_plan.h. Host-only: everything pf_model_load checks before it
// touches a device.
#include "plan/model_plan.h"

#include <climits>
#include <cstring>

#include "base/error.h"

namespace pf {

const ProjGroup *layer_groups(bool attn) {
    using L = LayerWeights;
    static const ProjGroup kAttn[kLayerGroups] = {
        {{&L::wq, &L::wk, &L::wv}, 3, false, 0b001},
        {{&L::wo}, 1, true, 0},
        {{&L::gate, &L::up}, 2, false, 0b11},
        {{&L::down}, 1, true, 0},
    };
    static const ProjGroup kGdn[kLayerGroups] = {
        {{&L::qkv, &L::z, &L::beta, &L::alpha}, 4, false, 0b0010},
        {{&L::ssm_out}, 1, true, 0},
        {{&L::gate, &L::up}, 2, false, 0b11},
        {{&L::down}, 1, true, 0},
    };
    return attn ? kAttn : kGdn;
}
namespace {

constexpr int64_t kMaxDim = int64_t(1) << 24;  // widths, head counts and sizes: real ones are < 2^17

std::string ne_str(const std::vector<int64_t> &ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); i++) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

pf_status read_hparams(const GgufFile &f, Hparams *hp) {
    std::string arch;
    PF_TRY(f.get_str("general.architecture", &arch));
    if (arch == "qwen3") hp->arch = PF_ARCH_QWEN3;
    else if (arch == "qwen35") hp->arch = PF_ARCH_QWEN35;
    else
        return fail(PF_STATUS_UNSUPPORTED, "%s: unsupported architecture '%s' (supported: qwen3, qwen35)",
                    f.path().c_str(), arch.c_str());
    const std::string a = arch + ".";
    PF_TRY(f.get_u32(a + "block_count", &hp->n_block));
    int64_t nextn = 0;
    PF_TRY(f.get_u32(a + "nextn_predict_layers", &nextn, false));
    // MTP blocks are the last nextn of the block_count: n_layer = block_count - nextn, which the
    // "not positive" check below rejects as 0 unless 0 <= nextn < block_count (the subtraction
    // itself overflowed for block_count = INT64_MIN; found by review, confirmed by fuzz_gguf).
    hp->n_layer = nextn >= 0 && nextn < hp->n_block ? hp->n_block - nextn : 0;
    PF_TRY(f.get_u32(a + "embedding_length", &hp->n_embd));
    PF_TRY(f.get_u32(a + "feed_forward_length", &hp->n_ff));
    PF_TRY(f.get_u32(a + "attention.head_count", &hp->n_head));
    PF_TRY(f.get_u32(a + "attention.head_count_kv", &hp->n_head_kv));
    PF_TRY(f.get_u32(a + "attention.key_length", &hp->head_dim));
    int64_t vlen = hp->head_dim;
    PF_TRY(f.get_u32(a + "attention.value_length", &vlen, false));
    PF_TRY(f.get_f32(a + "rope.freq_base", &hp->rope_base));
    PF_TRY(f.get_f32(a + "attention.layer_norm_rms_epsilon", &hp->eps));
    hp->context_length = 0;
    PF_TRY(f.get_u32(a + "context_length", &hp->context_length, false));
    hp->rope_dim = hp->head_dim;
    PF_TRY(f.get_u32(a + "rope.dimension_count", &hp->rope_dim, false));
    const char *p = f.path().c_str();
    auto bad = [&](const char *what) {
        return fail(PF_STATUS_FORMAT_ERROR, "%s: inconsistent metadata: %s", p, what);
    };
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 ||
        hp->n_head_kv <= 0 || hp->head_dim <= 0)
        return bad("a layer count, width or head count is not positive");
    // The expected tensor shapes are products of these (2 * head_count * key_length, ...): a
    // bound far above any real model keeps every product inside int64 (two u32 values of 2^32
    // overflowed q_proj_dim; found by review, confirmed by fuzz_gguf on a crafted file).
    for (int64_t v : {hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim})
        if (v > kMaxDim) return bad("a width, head count or head size is beyond 2^24");
    // Every layer has at least 9 tensors: more layers than tensors is malformed, and must not
    // size the layer table (a block_count of 2^40 asked for terabytes; found by fuzz_gguf).
    if (hp->n_layer > int64_t(f.tensors().size()))
        return bad("block_count exceeds the number of tensors in the file");
    if (hp->n_head % hp->n_head_kv) return bad("head_count is not a multiple of head_count_kv");
    if (vlen != hp->head_dim) return bad("attention.value_length differs from key_length");
    if (hp->rope_dim <= 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return bad("rope.dimension_count must be even and at most key_length");
    if (hp->arch == PF_ARCH_QWEN35) {
        hp->interval = 4;
        PF_TRY(f.get_u32(a + "full_attention_interval", &hp->interval, false));
        PF_TRY(f.get_u32(a + "ssm.conv_kernel", &hp->conv_kernel));
        PF_TRY(f.get_u32(a + "ssm.state_size", &hp->ssm_dk));
        PF_TRY(f.get_u32(a + "ssm.group_count", &hp->ssm_hk));
        PF_TRY(f.get_u32(a + "ssm.time_step_rank", &hp->ssm_hv));
        int64_t inner = 0;
        PF_TRY(f.get_u32(a + "ssm.inner_size", &inner));
        if (hp->interval <= 0 || hp->conv_kernel < 2 || hp->ssm_dk <= 0 || hp->ssm_hk <= 0 || hp->ssm_hv <= 0)
            return bad("an ssm.* value or full_attention_interval is not positive");
        for (int64_t v : {hp->conv_kernel, hp->ssm_dk, hp->ssm_hk, hp->ssm_hv})
            if (v > kMaxDim) return bad("an ssm.* size is beyond 2^24");
        if (hp->ssm_hv % hp->ssm_hk) return bad("ssm.time_step_rank is not a multiple of ssm.group_count");
        if (inner % hp->ssm_hv) return bad("ssm.inner_size is not a multiple of ssm.time_step_rank");
        hp->ssm_dv = inner / hp->ssm_hv;
        if (hp->ssm_dv != hp->ssm_dk) return bad("GDN value head dim differs from ssm.state_size");
        if (hp->ssm_hv * hp->ssm_dk > INT64_MAX / hp->ssm_dv)  // the recurrent state's floats
            return bad("the recurrent state (time_step_rank x state_size^2) overflows");
    }
    return PF_STATUS_OK;
}

// Layer schedule: qwen3 all attention; qwen35 from attention.recurrent_layers when present,
// else attention iff (il + 1) % interval == 0 (spec.md §2). Checked against the tensors later.
std::vector<bool> schedule(const GgufFile &f, const Hparams &hp) {
    std::vector<bool> attn(size_t(hp.n_layer), true);
    if (hp.arch != PF_ARCH_QWEN35) return attn;
    const GgufValue *rec = f.find("qwen35.attention.recurrent_layers");
    for (int64_t il = 0; il < hp.n_layer; il++) {
        if (rec && rec->ints.size() >= size_t(hp.n_layer)) attn[size_t(il)] = rec->ints[size_t(il)] == 0;
        else attn[size_t(il)] = (il + 1) % hp.interval == 0;
    }
    return attn;
}

}  // namespace

void plan_tensor_table(const Hparams &hp, const std::vector<bool> &attn, bool tied, ModelPlan *plan) {
    plan->hp = hp;
    plan->layers.assign(size_t(hp.n_layer), LayerWeights());
    plan->tied = tied;
    plan->arena_floats = 0;
    plan->tensor_bytes = 0;
    const int64_t d = hp.n_embd, D = hp.head_dim;
    std::vector<PlannedTensor> &ex = plan->tensors;
    ex.clear();
    auto top = [&](const std::string &n, std::vector<int64_t> ne, TensorKind kind, TensorSlot slot) {
        PlannedTensor t;
        t.name = n;
        t.ne = std::move(ne);
        t.kind = kind;
        t.slot = slot;
        ex.push_back(std::move(t));
    };
    auto in_layer = [&](int64_t il, const std::string &n, std::vector<int64_t> ne, TensorKind kind,
                        MatrixField mat, VectorField vec) {
        PlannedTensor t;
        t.name = n;
        t.ne = std::move(ne);
        t.kind = kind;
        t.layer = il;
        t.mat = mat;
        t.vec = vec;
        ex.push_back(std::move(t));
    };
    top("token_embd.weight", {d, hp.n_vocab}, TensorKind::Matrix, TensorSlot::TokEmbd);
    top("output_norm.weight", {d}, TensorKind::Vector, TensorSlot::OutputNorm);
    if (!tied) top("output.weight", {d, hp.n_vocab}, TensorKind::Matrix, TensorSlot::Output);
    int32_t n_attn = 0;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        LayerWeights &L = plan->layers[size_t(il)];
        const std::string b = "blk." + std::to_string(il) + ".";
        auto vec = [&](const std::string &n, int64_t len, VectorField dst) {
            in_layer(il, n, {len}, TensorKind::Vector, nullptr, dst);
        };
        auto mat = [&](const std::string &n, int64_t k, int64_t rows, MatrixField dst) {
            in_layer(il, n, {k, rows}, TensorKind::Matrix, dst, nullptr);
        };
        L.attn = attn[size_t(il)];
        vec(b + "attn_norm.weight", d, &LayerWeights::attn_norm);
        vec(b + (hp.arch == PF_ARCH_QWEN35 ? "post_attention_norm.weight" : "ffn_norm.weight"), d,
            &LayerWeights::post_norm);
        mat(b + "ffn_gate.weight", d, hp.n_ff, &LayerWeights::gate);
        mat(b + "ffn_up.weight", d, hp.n_ff, &LayerWeights::up);
        mat(b + "ffn_down.weight", hp.n_ff, d, &LayerWeights::down);
        if (L.attn) {
            L.attn_index = n_attn++;
            mat(b + "attn_q.weight", d, hp.q_proj_dim(), &LayerWeights::wq);
            mat(b + "attn_k.weight", d, hp.kv_dim(), &LayerWeights::wk);
            mat(b + "attn_v.weight", d, hp.kv_dim(), &LayerWeights::wv);
            mat(b + "attn_output.weight", hp.n_head * D, d, &LayerWeights::wo);
            vec(b + "attn_q_norm.weight", D, &LayerWeights::q_norm);
            vec(b + "attn_k_norm.weight", D, &LayerWeights::k_norm);
        } else {
            mat(b + "attn_qkv.weight", d, hp.conv_dim(), &LayerWeights::qkv);
            mat(b + "attn_gate.weight", d, hp.value_dim(), &LayerWeights::z);
            mat(b + "ssm_beta.weight", d, hp.ssm_hv, &LayerWeights::beta);
            mat(b + "ssm_alpha.weight", d, hp.ssm_hv, &LayerWeights::alpha);
            mat(b + "ssm_out.weight", hp.value_dim(), d, &LayerWeights::ssm_out);
            in_layer(il, b + "ssm_conv1d.weight", {hp.conv_kernel, hp.conv_dim()}, TensorKind::Conv,
                     nullptr, &LayerWeights::conv_w);
            vec(b + "ssm_a", hp.ssm_hv, &LayerWeights::ssm_a);
            vec(b + "ssm_dt.bias", hp.ssm_hv, &LayerWeights::dt_bias);
            vec(b + "ssm_norm.weight", hp.ssm_dv, &LayerWeights::ssm_norm);
        }
    }
    plan->n_attn_layers = n_attn;
}

pf_status model_plan(const GgufFile &f, ModelPlan *plan) {
    const char *path = f.path().c_str();
    Hparams hp;
    PF_TRY(read_hparams(f, &hp));
    const std::vector<bool> attn = schedule(f, hp);

    const GgufTensor *emb = f.tensor("token_embd.weight");
    if (!emb) return fail(PF_STATUS_FORMAT_ERROR, "%s: tensor token_embd.weight is missing", path);
    if (emb->ne.size() != 2 || emb->ne[0] != hp.n_embd)
        return fail(PF_STATUS_FORMAT_ERROR, "%s: tensor token_embd.weight: expected ne [%lld, n_vocab], found %s",
                    path, (long long)hp.n_embd, ne_str(emb->ne).c_str());
    hp.n_vocab = emb->ne[1];
    if (hp.n_vocab > INT32_MAX)  // token ids are int32 across the API
        return fail(PF_STATUS_FORMAT_ERROR, "%s: tensor token_embd.weight has %lld rows: more tokens than int32 ids",
                    path, (long long)hp.n_vocab);
    // The tensor set must match the schedule (spec.md §3.3 warning): fail loudly otherwise.
    for (int64_t il = 0; hp.arch == PF_ARCH_QWEN35 && il < hp.n_layer; il++) {
        const std::string b = "blk." + std::to_string(il) + ".";
        const bool has_q = f.tensor(b + "attn_q.weight") != nullptr;
        const bool has_qkv = f.tensor(b + "attn_qkv.weight") != nullptr;
        if (attn[size_t(il)] && !has_q)
            return fail(PF_STATUS_FORMAT_ERROR,
                        "%s: layer %lld should be an attention layer (full_attention_interval=%lld) "
                        "but tensor %sattn_q.weight is missing%s", path, (long long)il,
                        (long long)hp.interval, b.c_str(), has_qkv ? " (it has attn_qkv: a GDN layer)" : "");
        if (!attn[size_t(il)] && !has_qkv)
            return fail(PF_STATUS_FORMAT_ERROR,
                        "%s: layer %lld should be a Gated DeltaNet layer (full_attention_interval=%lld) "
                        "but tensor %sattn_qkv.weight is missing%s", path, (long long)il,
                        (long long)hp.interval, b.c_str(), has_q ? " (it has attn_q: an attention layer)" : "");
    }
    plan_tensor_table(hp, attn, f.tensor("output.weight") == nullptr, plan);
    std::vector<PlannedTensor> &ex = plan->tensors;

    // Validate everything before any device work.
    for (PlannedTensor &e : ex) {
        const GgufTensor *t = f.tensor(e.name);
        if (!t)
            return fail(PF_STATUS_FORMAT_ERROR, "%s: tensor %s is missing (expected ne %s)", path,
                        e.name.c_str(), ne_str(e.ne).c_str());
        if (t->ne != e.ne)
            return fail(PF_STATUS_FORMAT_ERROR, "%s: tensor %s: expected ne %s, found %s", path,
                        e.name.c_str(), ne_str(e.ne).c_str(), ne_str(t->ne).c_str());
        if (e.kind != TensorKind::Matrix && t->type != PF_QTYPE_F32)
            return fail(PF_STATUS_UNSUPPORTED, "%s: tensor %s: expected type F32, found %s (%u)", path,
                        e.name.c_str(), pf_qtype_name(int32_t(t->type)), t->type);
        if (e.kind != TensorKind::Matrix) plan->arena_floats += size_t(t->bytes / 4 + 63) / 64 * 64;  // 256 B aligned
        plan->tensor_bytes += t->bytes;
        e.t = t;
    }
    return PF_STATUS_OK;
}

void hparam_info(const Hparams &hp, int32_t n_attn_layers, bool tied, pf_model_info *o) {
    std::memset(o, 0, sizeof *o);
    o->arch = hp.arch;
    o->n_layer = int32_t(hp.n_layer);
    o->n_embd = int32_t(hp.n_embd);
    o->n_ff = int32_t(hp.n_ff);
    o->n_vocab = int32_t(hp.n_vocab);
    o->n_head = int32_t(hp.n_head);
    o->n_head_kv = int32_t(hp.n_head_kv);
    o->head_dim = int32_t(hp.head_dim);
    o->rope_dim = int32_t(hp.rope_dim);
    o->n_attn_layers = n_attn_layers;
    o->ssm_hk = int32_t(hp.ssm_hk);
    o->ssm_hv = int32_t(hp.ssm_hv);
    o->ssm_dk = int32_t(hp.ssm_dk);
    o->ssm_dv = int32_t(hp.ssm_dv);
    o->conv_kernel = int32_t(hp.conv_kernel);
    o->tied_output = tied ? 1 : 0;
    o->context_length = hp.context_length;
}

void model_plan_info(const ModelPlan &plan, pf_model_info *o) {
    hparam_info(plan.hp, plan.n_attn_layers, plan.tied, o);
    o->weight_bytes = plan.tensor_bytes;
}

uint64_t model_fingerprint(const Hparams &hp, size_t file_bytes) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the dims and the file size
    for (int64_t v : {int64_t(hp.arch), hp.n_layer, hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_head, hp.n_head_kv,
                      hp.head_dim, hp.ssm_hk, hp.ssm_hv, hp.ssm_dk, hp.conv_kernel, int64_t(file_bytes)})
        h = (h ^ uint64_t(v)) * 1099511628211ull;
    return h;
}

pf_status model_inspect(const char *path, pf_model_info *out) {
    GgufFile f;
    PF_TRY(f.open(path));
    ModelPlan plan;
    PF_TRY(model_plan(f, &plan));
    model_plan_info(plan, out);
    return PF_STATUS_OK;
}

pf_status model_inspect_memory(const void *data, size_t size, const char *name, pf_model_info *out) {
    GgufFile f;
    PF_TRY(f.open_memory(data, size, name));
    ModelPlan plan;
    PF_TRY(model_plan(f, &plan));
    model_plan_info(plan, out);
    return PF_STATUS_OK;
}

}  // namespace pf
