// model_plan.h — the host-only half of model loading: hyper-parameters read from GGUF metadata
// (spec.md §1.1 / §2.1), the layer schedule, and the expected tensor table (§1.2 / §2.2-2.5)
// checked name by name, shape by shape and type by type. No CUDA: model.cu uploads what a plan
// lists, pf_model_inspect reports it, and the GGUF fuzz target runs it on arbitrary bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/gguf.h"
#include "prefill.h"

namespace pf {

struct Hparams {
    int32_t arch = 0;            // PF_ARCH_*
    int64_t n_layer = 0, n_block = 0, n_embd = 0, n_ff = 0, n_vocab = 0;
    int64_t n_head = 0, n_head_kv = 0, head_dim = 0, rope_dim = 0;
    double rope_base = 0, eps = 0;
    int64_t context_length = 0;
    // qwen35
    int64_t interval = 0, conv_kernel = 0, ssm_dk = 0, ssm_dv = 0, ssm_hk = 0, ssm_hv = 0;
    int64_t key_dim() const { return ssm_hk * ssm_dk; }
    int64_t value_dim() const { return ssm_hv * ssm_dv; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
    // width of one q-projection row: qwen35 rows are per-head [q | gate]
    int64_t q_proj_dim() const { return (arch == PF_ARCH_QWEN35 ? 2 : 1) * n_head * head_dim; }
    int64_t kv_dim() const { return n_head_kv * head_dim; }
};

struct LayerWeights {
    bool attn = false;           // attention layer (else GDN)
    int32_t attn_index = -1;     // which KV cache (attention layers only)
    const float *attn_norm = nullptr, *post_norm = nullptr;   // [d]
    pf_weight *gate = nullptr, *up = nullptr, *down = nullptr;
    // attention
    pf_weight *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const float *q_norm = nullptr, *k_norm = nullptr;          // [D]
    // Gated DeltaNet
    pf_weight *qkv = nullptr, *z = nullptr, *beta = nullptr, *alpha = nullptr, *ssm_out = nullptr;
    const float *conv_w = nullptr;   // [conv_dim][Kc]
    const float *ssm_a = nullptr, *dt_bias = nullptr;           // [Hv]
    const float *ssm_norm = nullptr;                            // [dv]
};

// A field of LayerWeights that a matrix / a vector lands in.
using MatrixField = pf_weight *LayerWeights::*;
using VectorField = const float *LayerWeights::*;

// The projections of a layer, in the order the layer loop runs them: each group reads one input
// (the normed residual stream, or the mixer's / the FFN's output) and writes its parts' outputs
// side by side in one [rows][sum of n] scratch, in the parts' order (q | k | v, the GDN's
// qkv | z | beta | alpha, gate | up), or, for a lone out-projection, accumulates into the
// residual stream. The one list that the layer loop (runtime/forward.cu), the executor's scratch
// and GEMM plan, the prewarm's fused fp16 blocks and the 8-bit leg's copies read.
struct ProjGroup {
    MatrixField parts[4] = {};
    int32_t count = 0;
    bool accumulate = false;  // x += input . W^T (one part)
    // Bit i: parts[i] runs the 8-bit leg under PF_GEMM_INT8 (recipe int8-g128-w128r-mix,
    // docs/int8-recipe.md: attn_q, the GDN attn_gate (z), ffn_gate | ffn_up; the wide-input
    // out-projections, the writers of carried state and beta / alpha stay on the f16 leg).
    uint8_t int8_recipe = 0;
};
enum LayerGroup : int32_t { kMixerIn = 0, kMixerOut = 1, kFfnIn = 2, kFfnOut = 3, kLayerGroups = 4 };
// The kLayerGroups groups of an attention (attn) or Gated DeltaNet layer, in LayerGroup order.
const ProjGroup *layer_groups(bool attn);

enum class TensorKind { Vector, Matrix, Conv };  // Vector/Conv: F32 only; Matrix: any supported qtype

// Where a planned tensor lands in the model: a model-level slot, or a field of one layer.
enum class TensorSlot { Layer, TokEmbd, Output, OutputNorm };

struct PlannedTensor {
    std::string name;
    std::vector<int64_t> ne;               // expected, GGUF order
    TensorKind kind = TensorKind::Vector;
    TensorSlot slot = TensorSlot::Layer;
    int64_t layer = -1;                    // slot Layer: which layer
    MatrixField mat = nullptr;             // slot Layer, kind Matrix
    VectorField vec = nullptr;             // slot Layer, kind Vector or Conv
    const GgufTensor *t = nullptr;         // the validated tensor in the file
};

struct ModelPlan {
    Hparams hp;
    std::vector<LayerWeights> layers;      // attn and attn_index set; pointers null
    int32_t n_attn_layers = 0;
    bool tied = false;                     // no output.weight: token_embd is the LM head
    std::vector<PlannedTensor> tensors;    // every expected tensor, in upload order
    size_t arena_floats = 0;               // fp32 arena for vectors and conv kernels (256 B aligned)
    size_t tensor_bytes = 0;               // bytes of every planned tensor
};

// Reads the metadata of an opened file, checks every expected tensor (name, shape, type) and
// fills *plan. FORMAT_ERROR / UNSUPPORTED naming the fault, as pf_model_load reports them.
pf_status model_plan(const GgufFile &f, ModelPlan *plan);
// The expected tensor table of a model with these hyper-parameters (n_vocab set), layer schedule
// (attn[il]: an attention layer) and output (tied: no output.weight): sets plan->hp, layers,
// n_attn_layers, tied and tensors, every `t` null and the byte counts 0. model_plan checks a file
// against it; the shard plan's tests and fuzz target run it on hyper-parameters alone.
void plan_tensor_table(const Hparams &hp, const std::vector<bool> &attn, bool tied, ModelPlan *plan);
// The pf_model_info fields every model has (dims, layer counts, tied output); the rest zero.
void hparam_info(const Hparams &hp, int32_t n_attn_layers, bool tied, pf_model_info *out);
// What pf_model_inspect reports for a valid plan (no device: f16 fields and times 0).
void model_plan_info(const ModelPlan &plan, pf_model_info *out);
// Identifies a model for session-state restore: its dims and the file size.
uint64_t model_fingerprint(const Hparams &hp, size_t file_bytes);
// pf_model_inspect on a file, and on bytes in memory (`name` stands for the path in messages).
pf_status model_inspect(const char *path, pf_model_info *out);
pf_status model_inspect_memory(const void *data, size_t size, const char *name, pf_model_info *out);

}  // namespace pf
