// model.h — pf_model: hyper-parameters read from GGUF metadata, validated tensors uploaded to
// the device (matrices as pf_weight raw blocks, 1-D tensors and the conv kernel as fp32 in one
// arena), and the per-layer view the forward pass walks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/context.h"
#include "plan/model_plan.h"  // Hparams, LayerWeights (host-only)
#include "plan/plan.h"        // ExecPlan
#include "prefill.h"

namespace pf {
struct KvPool;
}

struct pf_model {
    pf::CtxRef ref;                       // first: the last member to go
    pf_context *ctx = nullptr;
    std::string path;
    pf::Hparams hp;
    std::vector<pf::LayerWeights> layers;
    pf_weight *tok_embd = nullptr;
    pf_weight *output = nullptr;      // == tok_embd when tied
    const float *output_norm = nullptr;
    std::vector<pf_weight *> weights; // every matrix we own (for prewarm and destroy)
    std::vector<std::string> weight_names;  // GGUF tensor name of weights[i] (pf_model_weight)
    void *arena = nullptr;            // fp32 vectors and conv kernels
    size_t arena_bytes = 0;
    int32_t gemm_leg = 0;
    int32_t n_attn_layers = 0;
    uint64_t fingerprint = 0;         // identifies the model for session state restore
    double load_ms = 0, prewarm_ms = 0;
    pf_prewarm_report prewarm_report{};  // the last prewarm's (struct_size 0: none yet)
    pf_progress_fn progress = nullptr;  // from the load options: reports the prewarm too
    void *progress_user = nullptr;
    pf_tuning tuning{};                 // the load options' (over the context's for the prewarm)
    pf::KvPool *kv_pool = nullptr;      // the paged sessions' pages (pf_model_kv_pool), or none
};

namespace pf {
// Parses and validates `path` (model_plan), uploads it and returns the model in *out.
pf_status model_load(pf_context *ctx, const char *path, const pf_model_options &o, pf_model **out);
void model_destroy(pf_model *m);
pf_status model_prewarm(pf_model *m, size_t headroom, int32_t *armed);
// The prewarm's groups (prewarm_f16_groups): per layer the weights that share an input, in the
// column order the session reads their fused output — Q|K|V, GDN qkv|z|beta|alpha, FFN
// gate|up — when `fuse`, then every other matrix alone (each weight once).
std::vector<std::vector<pf_weight *>> model_f16_groups(const pf_model *m, bool fuse);
// The matrices the 8-bit leg runs (recipe int8-g128-w128r-mix, docs/int8-recipe.md): attn_q, the
// GDN attn_gate (z), ffn_gate | ffn_up (one group, fused when `fuse`), those of them with GGUF
// blocks (a float-typed matrix stays on the f16 leg, as llama.cpp runs such matrices through
// cuBLAS) and k % 16 == 0. The others (the wide-input projections ffn_down, ssm_out,
// attn_output; the writers of carried state attn_k, attn_v, the GDN attn_qkv; beta, alpha, the
// LM head) stay on the f16 leg.
std::vector<std::vector<pf_weight *>> model_i8_groups(const pf_model *m, bool fuse);
void model_info(const pf_model *m, pf_model_info *out);
// The execution plan of a session or batch of m (exec_plan): `tuning` over the model's over its
// context's, the leg asked (PF_GEMM_DEFAULT: the model's, then the process default), the
// attention path, the KV dtype and the graphs (cuda_graphs == 1) of its options.
ExecPlan model_exec_plan(const pf_model *m, int32_t gemm_leg, const pf_tuning &tuning, int32_t attn_path,
                         int32_t kv_dtype, int32_t cuda_graphs);
}  // namespace pf
