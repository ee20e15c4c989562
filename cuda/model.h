// model.h — pf_model: hyper-parameters read from GGUF metadata, validated tensors uploaded to
// the device (matrices as pf_weight raw blocks, 1-D tensors and the conv kernel as fp32 in one
// arena), and the per-layer view the forward pass walks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "context.h"
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

}  // namespace pf

struct pf_model {
    pf_context *ctx = nullptr;
    std::string path;
    pf::Hparams hp;
    std::vector<pf::LayerWeights> layers;
    pf_weight *tok_embd = nullptr;
    pf_weight *output = nullptr;      // == tok_embd when tied
    const float *output_norm = nullptr;
    std::vector<pf_weight *> weights; // every matrix we own (for prewarm and destroy)
    void *arena = nullptr;            // fp32 vectors and conv kernels
    size_t arena_bytes = 0;
    int32_t gemm_leg = 0;
    int32_t n_attn_layers = 0;
    uint64_t fingerprint = 0;         // identifies the model for session state restore
    double load_ms = 0, prewarm_ms = 0;
    pf_progress_fn progress = nullptr;  // from the load options: reports the prewarm too
    void *progress_user = nullptr;
};

namespace pf {
// Parses and validates `path`; with ctx == nullptr stops there and fills *inspect (no device
// work), else uploads and returns the model in *out.
pf_status model_load(pf_context *ctx, const char *path, const pf_model_options &o, pf_model **out,
                     pf_model_info *inspect = nullptr);
void model_destroy(pf_model *m);
pf_status model_prewarm(pf_model *m, size_t headroom, int32_t *armed);
void model_info(const pf_model *m, pf_model_info *out);
}  // namespace pf
