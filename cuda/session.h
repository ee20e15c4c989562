// session.h — pf_session: one sequence's state (KV caches, conv windows, recurrent states,
// position) and the scratch of one chunk, all sized at creation so that prefill allocates
// nothing on its way through the layers.
#pragma once

#include <vector>

#include "model.h"

namespace pf {
// The CUDA graphs of one chunk length (session.cu, "chunk graphs"): the position-independent
// launches of a chunk of T rows as segments, valid while the key holds.
struct ChunkGraph {
    int64_t T = 0;
    bool act16 = false, fuse = false, cached = false;
    bool attn = false;  // attention inside (pf_session::attn_in_graph): the chunk is one graph
    int32_t leg = 0;                                      // the session's leg, PF_GEMM_DEFAULT resolved
    const void *scratch[3] = {nullptr, nullptr, nullptr};  // the context scratch the launches use
    std::vector<cudaGraphExec_t> segs;
};
}  // namespace pf

struct pf_session {
    pf_model *model = nullptr;
    pf_context *ctx = nullptr;
    int32_t max_tokens = 0, chunk = 0, kv_dtype = 0, leg = 0, attn_path = 0;
    int64_t pos = 0;
    bool broken = false;             // a device fault mid-chunk: state unknown until reset
    int32_t last_token = -1;         // greedy token after the last position (for generate)
    std::vector<void *> k_cache, v_cache;  // per attention layer [max_tokens][kv_dim]
    std::vector<float *> conv, ssm;         // per layer (GDN layers only; nullptr otherwise)
    bool fuse = true;                // run prewarmed groups as one GEMM (env PREFILL_FUSE at creation)
    // The attention layer's q/k norms, RoPE and cache write as one kernel (qk_rope.cuh; env
    // PREFILL_FUSE_QKROPE=0 turns it off at creation, for A/B runs: bitwise the same logits)
    bool fuse_qkrope = true;
    // The GDN conv1d + SiLU and the q/k L2 norms as one kernel (gdn_conv1d_l2norm_rows; env
    // PREFILL_FUSE_CONVNORM=0 turns it off at creation, for A/B runs: bitwise the same logits)
    bool fuse_convnorm = true;
    // chunk scratch, fp32 [chunk][width]: x the residual stream, h the normed input of the
    // projections, a the side-by-side outputs of a projection group, b the GDN conv output, o the
    // mixer output
    float *x = nullptr, *h = nullptr, *a = nullptr, *b = nullptr, *o = nullptr;
    float *s3 = nullptr, *s4 = nullptr;  // [chunk][Hv] GDN gates beta, g
    // The act16 route (f16 leg, every matrix with an fp16 copy; env PREFILL_F16_ACT=0 turns it
    // off at creation): the producers write the projections' input as fp16 rows + row scales
    // (f16_rows.cuh) into h16 [chunk][widest k] and inv16 [chunk]; no cast pass.
    bool act16_env = true;
    bool act16 = false;              // decided per prefill call (the caches may change between calls)
    bool cached = false;             // every matrix has its fp16 cache (per prefill call)
    __half *h16 = nullptr;
    float *inv16 = nullptr;
    int32_t *ids = nullptr;          // [max_tokens] device token ids: the call's at [pos, pos + n)
    int64_t *pos_dev = nullptr;      // [1] the chunk's position, for the launches inside CUDA graphs
    float *logits = nullptr;         // [lm_rows][n_vocab]
    int32_t lm_rows = 0;
    int32_t *argmax = nullptr;       // [1]
    void *gdn_ws = nullptr;          // chunked delta rule workspace (gdn_chunk_workspace_bytes)
    size_t gdn_ws_bytes = 0;
    void *attn_ws = nullptr;         // cuBLAS attention path workspace (attention_workspace_bytes)
    size_t attn_ws_bytes = 0;
    // CUDA graphs per chunk length (env PREFILL_GRAPH=0 turns them off at creation); a length is
    // captured when it comes back (seen_T), for at most kMaxChunkGraphs lengths
    bool graph_env = true;
    bool graph_off = false;          // a capture failed: this session runs eagerly from then on
    // The chunk as one graph (env PREFILL_GRAPH_ATTN=0 turns it off at creation, for A/B runs:
    // bitwise the same logits): the embedding reads its ids at s->ids + *pos_dev, and on chunks
    // whose attention runs the flash kernels (attn_in_graph, decided per chunk from the length
    // and the position: AUTO takes cuBLAS for short chunks deep into the cache) those read the
    // position from pos_dev too. Off, or on cuBLAS chunks: attention runs between segments.
    bool graph_attn = true;
    bool attn_in_graph = false;
    // The f16 leg's GEMM algorithm per projection shape at rows = chunk (gemm_lt.cuh): the
    // process's choice (timed by the first session that needed the shape), made current on the
    // context during each prefill. nullptr with env PREFILL_GEMM_LT=0 (read at creation: GemmEx
    // everywhere), on the f32 leg, or when every shape's choice is GemmEx. Owned (session_destroy
    // deletes it).
    pf::GemmPlan *gemm_plan = nullptr;
    std::vector<pf::ChunkGraph> graphs;
    std::vector<int64_t> seen_T;
    std::vector<std::pair<void *, size_t>> allocs;
};

namespace pf {
pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out);
void session_destroy(pf_session *s);
pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                          float *logits, size_t logits_len, int32_t *out_token);
pf_status session_reset(pf_session *s);
size_t session_state_size(const pf_session *s);
pf_status session_save(pf_session *s, void *dst, size_t bytes);
pf_status session_restore(pf_session *s, const void *src, size_t bytes);
}  // namespace pf
