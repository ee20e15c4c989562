// session.cu — pf_session: creation (all state and chunk scratch sized up front), the layer
// loop of one chunk (spec.md §1.3 for qwen3, §3 for qwen35), chunked prefill that continues from
// the session's position, greedy tokens, and the state save/restore format.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>

#include "attention.cuh"
#include "cuda_check.cuh"
#include "dequant.cuh"
#include "f16_rows.cuh"
#include "gdn.cuh"
#include "gemm.cuh"
#include "gemm_lt.cuh"
#include "qk_rope.cuh"
#include "rows.cuh"
#include "session.h"
#include "session_state.h"

namespace pf {
namespace {

constexpr int32_t kDefaultMaxTokens = 4096;
// Auto chunk (pf_session_options.chunk_tokens = 0): 2048 rows measured ~20% faster than 512
// for qwen35-4b on the H200 (fewer, larger GEMMs; the delta rule's chunked path fills the GPU).
constexpr int32_t kAutoChunk = 2048;
constexpr int32_t kMinAutoChunk = 256;
constexpr size_t kAutoChunkShare = 4;  // the chunk's scratch takes at most 1/4 of the free memory
constexpr int32_t kLmRows = 32;  // LM-head rows per pass for PF_LOGITS_ALL: [32][n_vocab] fp32
constexpr float kL2NormEps = 1e-6f;  // GDN q/k L2 norm: HF hard-codes 1e-6 (spec.md §0, G5)

pf_status salloc(pf_session *s, size_t bytes, void **out, const char *what) {
    PF_TRY(device_alloc(s->ctx, bytes, out, what));
    s->allocs.emplace_back(*out, bytes);
    return PF_STATUS_OK;
}

template <class T>
pf_status salloc_t(pf_session *s, size_t count, T **out, const char *what) {
    void *p = nullptr;
    PF_TRY(salloc(s, count * sizeof(T), &p, what));
    *out = static_cast<T *>(p);
    return PF_STATUS_OK;
}

size_t kv_elem(int32_t kv_dtype) { return state_kv_elem(kv_dtype); }

// ---------------------------------------------------------------------------- one chunk

// Runs a chunk's launches in order, as steps: graphed steps (launches that depend on the chunk
// length only; RoPE, kv_write, and with s->graph_attn the embedding and the flash attention
// kernels read the position from s->pos_dev) and eager steps (with PREFILL_GRAPH_ATTN=0 the
// embedding, whose ids pointer moves with the chunk, and attention whenever it is not graphed:
// cuBLAS launches depend on the position, and so does AUTO's choice of path). Modes:
//  - Eager: every step runs.
//  - Capture: consecutive graphed steps are captured into one segment (it ends at the next eager
//    step or at close); eager steps are skipped. Nothing runs on the device.
//  - Replay: each segment's graph is launched where its first step stands; eager steps run.
// So Capture then Replay launches exactly what Eager launches, in the same order.
class ChunkRunner {
  public:
    enum Mode { Eager, Capture, Replay };
    ChunkRunner(cudaStream_t st, Mode mode, std::vector<cudaGraphExec_t> *segs)
        : st_(st), mode_(mode), segs_(segs) {}
    ChunkRunner(const ChunkRunner &) = delete;
    ChunkRunner &operator=(const ChunkRunner &) = delete;
    ~ChunkRunner() { abort(); }

    template <class F>
    pf_status graphed(F &&fn) {
        if (mode_ == Eager) return fn();
        if (mode_ == Replay) {
            if (open_) return PF_STATUS_OK;  // the segment's graph holds this step
            PF_CHECK_ARG(next_ < segs_->size(), "chunk graph: replay past the %zu captured segments",
                         segs_->size());
            PF_CUDA_TRY(cudaGraphLaunch((*segs_)[next_++], st_));
            open_ = true;
            return PF_STATUS_OK;
        }
        if (!open_) {
            PF_CUDA_TRY(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal));
            open_ = true;
        }
        return fn();
    }

    template <class F>
    pf_status eager(F &&fn) {
        PF_TRY(close());
        return mode_ == Capture ? PF_STATUS_OK : fn();
    }

    // Ends the open segment (Capture: instantiates it).
    pf_status close() {
        if (!open_) return PF_STATUS_OK;
        open_ = false;
        if (mode_ != Capture) return PF_STATUS_OK;
        cudaGraph_t g = nullptr;
        PF_CUDA_TRY(cudaStreamEndCapture(st_, &g));
        cudaGraphExec_t e = nullptr;
        const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
        (void)cudaGraphDestroy(g);
        if (err != cudaSuccess) return cuda_fail(err, __FILE__, __LINE__, "chunk graph: cudaGraphInstantiate");
        segs_->push_back(e);
        return PF_STATUS_OK;
    }

    // After a failure while capturing: leaves capture mode and clears the (non-sticky) error.
    void abort() {
        if (open_ && mode_ == Capture) {
            cudaGraph_t g = nullptr;
            (void)cudaStreamEndCapture(st_, &g);
            if (g) (void)cudaGraphDestroy(g);
            (void)cudaGetLastError();
        }
        open_ = false;
    }

  private:
    cudaStream_t st_;
    Mode mode_;
    std::vector<cudaGraphExec_t> *segs_;
    size_t next_ = 0;
    bool open_ = false;
};

// The f16 leg's input form of [rows][cols] in the session's fp16 scratch (f16_rows.cuh); `acc`
// (optional, [rows][n_embd]) is the residual stream the projection will accumulate into.
F16Out f16_out(pf_session *s, int64_t cols, float *acc = nullptr) {
    F16Out o;
    o.x16 = s->h16;
    o.ld16 = cols;  // the GEMM reads rows of k = cols
    o.inv = s->inv16;
    if (acc) {
        o.acc = acc;
        o.ld_acc = o.n_acc = s->model->hp.n_embd;
    }
    return o;
}

// The normed input of the projections (RMSNorm of x's rows): fp16 in h16 on the act16 route,
// fp32 in h otherwise.
pf_status norm_input(pf_session *s, const float *x, const float *w, int64_t rows) {
    const Hparams &hp = s->model->hp;
    const int64_t d = hp.n_embd;
    if (s->act16) return rms_norm_rows_f16(x, d, w, f16_out(s, d), rows, d, float(hp.eps), s->ctx->stream);
    return rms_norm_rows(x, d, w, s->h, d, rows, d, float(hp.eps), s->ctx->stream);
}

// y (+)= input . W^T for the input norm_input or a producer left: project_f16_rows on the
// act16 route, project() on s->h-like fp32 `x` (row stride ldx) otherwise.
pf_status project_in(pf_session *s, pf_weight *w, const float *x, int64_t ldx, int64_t rows, float *y,
                     int64_t ldy, bool accumulate) {
    if (s->act16) return project_f16_rows(s->ctx, w, s->h16, s->inv16, rows, y, ldy, accumulate);
    return project(s->ctx, w, x, rows, ldx, y, ldy, accumulate, s->leg);
}

// Projects s->h through weights that share it as input into column slices of one [T][ldy]
// output (out[i] = the first column of part i's slice). One GEMM through the fused fp16 block
// when the parts run the f16 leg and were prewarmed as a group (model_f16_groups), else one
// projection per part: the same values within the f16 leg's tolerance, the same layout.
pf_status project_group(pf_session *s, std::initializer_list<pf_weight *> parts,
                        std::initializer_list<float *> out, int64_t T, int64_t ldy) {
    const int64_t d = s->model->hp.n_embd;
    pf_weight view;
    if (s->fuse && fused_f16_view(parts.begin(), int32_t(parts.size()), s->leg, &view))
        return project_in(s, &view, s->h, d, T, *out.begin(), ldy, false);
    float *const *y = out.begin();
    for (pf_weight *w : parts) PF_TRY(project_in(s, w, s->h, d, T, *y++, ldy, false));
    return PF_STATUS_OK;
}

// attention's arguments for the index-th attention layer over a chunk of T rows at s->pos: q in
// the side-by-side scratch s->a (see attn_layer), o in s->o, the host position.
attention_args attn_args(const pf_session *s, int32_t index, int64_t T) {
    const Hparams &hp = s->model->hp;
    const int64_t D = hp.head_dim, H = hp.n_head;
    const bool gated = hp.arch == PF_ARCH_QWEN35;
    attention_args a;
    a.q = s->a;
    a.ldq = hp.q_proj_dim() + 2 * hp.kv_dim();
    a.q_head_stride = gated ? 2 * D : D;
    a.k_cache = s->k_cache[size_t(index)];
    a.v_cache = s->v_cache[size_t(index)];
    a.kv_dtype = s->kv_dtype;
    a.o = s->o;
    a.ldo = H * D;
    a.n_heads = int32_t(H);
    a.n_kv_heads = int32_t(hp.n_head_kv);
    a.head_dim = int32_t(D);
    a.rows = T;
    a.pos0 = s->pos;
    a.scale = float(1.0 / std::sqrt(double(D)));
    a.path = s->attn_path;
    a.workspace = s->attn_ws;  // the cuBLAS path's scratch (null when the session runs flash)
    a.workspace_bytes = s->attn_ws_bytes;
    return a;
}

// Whether a chunk of T rows at s->pos runs attention inside the chunk's graph: the switch is on
// and every attention layer resolves to the flash path here (the kernels then take the position
// from s->pos_dev; a cuBLAS layer's launches depend on it). A function of (T, s->pos) only: it
// is part of the chunk graph's key, so a replay runs the structure that was captured.
bool attn_graphable(const pf_session *s, int64_t T) {
    if (!s->graph_attn) return false;
    for (int32_t i = 0; i < s->model->n_attn_layers; i++)
        if (attention_resolved_path(attn_args(s, i, T)) != PF_ATTN_FLASH) return false;
    return true;
}

// Attention mixer (spec.md §1.3 steps 2-7 / §3.1 A1-A9): x += attention(h) . Wo^T.
pf_status attn_layer(pf_session *s, const LayerWeights &L, int64_t T, ChunkRunner &R) {
    pf_context *ctx = s->ctx;
    const Hparams &hp = s->model->hp;
    cudaStream_t st = ctx->stream;
    const int64_t D = hp.head_dim, H = hp.n_head, kvd = hp.kv_dim(), qd = hp.q_proj_dim();
    const bool gated = hp.arch == PF_ARCH_QWEN35;
    const int64_t q_head_stride = gated ? 2 * D : D;
    // q | k | v side by side in one [T][W] scratch: one fused GEMM on the f16 leg, three
    // projections into the column slices otherwise (the same layout downstream).
    const int64_t W = qd + 2 * kvd;
    float *q = s->a, *k = s->a + qd, *v = s->a + qd + kvd, *o = s->o;
    void *kc = s->k_cache[size_t(L.attn_index)], *vc = s->v_cache[size_t(L.attn_index)];
    const float eps = float(hp.eps);
    PF_TRY(R.graphed([&]() -> pf_status {
        PF_TRY(project_group(s, {L.wq, L.wk, L.wv}, {q, k, v}, T, W));
        if (s->fuse_qkrope) {  // the five launches below in one, bitwise the same (qk_rope.cu)
            QkRopeKvArgs a;
            a.q = q;
            a.ldq = W;
            a.q_head_stride = q_head_stride;
            a.k = k;
            a.ldk = W;
            a.v = v;
            a.ldv = W;
            a.rows = T;
            a.n_heads = int32_t(H);
            a.n_kv_heads = int32_t(hp.n_head_kv);
            a.head_dim = int32_t(D);
            a.rot_dim = int32_t(hp.rope_dim);
            a.rope_base = float(hp.rope_base);
            a.q_norm = L.q_norm;
            a.k_norm = L.k_norm;
            a.eps = eps;
            a.pos0_dev = s->pos_dev;
            a.k_cache = kc;
            a.v_cache = vc;
            a.kv_dtype = s->kv_dtype;
            return qk_norm_rope_kv_at(a, st);
        }
        PF_TRY(head_rms_norm_rows(q, W, T, int32_t(H), q_head_stride, int32_t(D), L.q_norm, eps, st));
        PF_TRY(head_rms_norm_rows(k, W, T, int32_t(hp.n_head_kv), D, int32_t(D), L.k_norm, eps, st));
        // RoPE reads the chunk's position from s->pos_dev: the same launch at any position
        PF_TRY(rope_neox_rows_at(q, W, T, int32_t(H), q_head_stride, int32_t(D), int32_t(hp.rope_dim),
                                 s->pos_dev, float(hp.rope_base), st));
        PF_TRY(rope_neox_rows_at(k, W, T, int32_t(hp.n_head_kv), D, int32_t(D), int32_t(hp.rope_dim),
                                 s->pos_dev, float(hp.rope_base), st));
        return kv_write_at(k, W, v, W, T, kvd, kc, vc, s->kv_dtype, s->pos_dev, st);  // rows pos..pos+T-1
    }));
    attention_args a = attn_args(s, L.attn_index, T);
    if (s->attn_in_graph) {
        // The flash kernels with the position on the device: the same launch at any position
        // (grid over query tiles x heads, the key loop bounded in the kernel, the wgmma maps over
        // the whole capacity), so it joins the graph segment.
        a.path = PF_ATTN_FLASH;  // attn_graphable resolved it for this chunk
        a.pos0_dev = s->pos_dev;
        a.kv_capacity = s->max_tokens;
        PF_TRY(R.graphed([&] { return attention(ctx, a); }));
    } else {
        // The cuBLAS path's launches (and AUTO's choice) depend on the position: run eagerly
        // between the graph segments.
        PF_TRY(R.eager([&] { return attention(ctx, a); }));
    }
    // A8: o *= sigmoid(gate), the gate half of each head's [q | gate] row; on the act16 route
    // the gate writes wo's input form (and pre-scales x's rows where a row needs it)
    return R.graphed([&]() -> pf_status {
        if (gated && s->act16) {
            PF_TRY(sigmoid_gate_rows_f16(o, H * D, q + D, W, 2 * D, f16_out(s, H * D, s->x), T, int32_t(H),
                                         int32_t(D), st));
            return project_f16_rows(ctx, L.wo, s->h16, s->inv16, T, s->x, hp.n_embd, true);
        }
        if (gated) PF_TRY(sigmoid_gate_rows(o, H * D, q + D, W, 2 * D, T, int32_t(H), int32_t(D), st));
        return project(ctx, L.wo, o, T, H * D, s->x, hp.n_embd, true, s->leg);  // qwen3: fp32 o, cast there
    });
}

// Gated DeltaNet mixer (spec.md §3.2 G1-G9): x += GDN(h) . W_out^T.
pf_status gdn_layer(pf_session *s, const LayerWeights &L, int64_t il, int64_t T) {
    pf_context *ctx = s->ctx;
    const Hparams &hp = s->model->hp;
    cudaStream_t st = ctx->stream;
    const int64_t cd = hp.conv_dim(), vd = hp.value_dim(), kd = hp.key_dim(), Hv = hp.ssm_hv;
    // qkv | z | b | a side by side in one [T][W] scratch (see attn_layer).
    const int64_t W = cd + vd + 2 * Hv;
    float *m = s->a, *z = s->a + cd, *bl = s->a + cd + vd, *al = s->a + cd + vd + Hv;
    float *u = s->b, *o = s->o, *beta = s->s3, *g = s->s4;
    PF_TRY(project_group(s, {L.qkv, L.z, L.beta, L.alpha}, {m, z, bl, al}, T, W));
    const float eps = float(hp.eps);
    const int32_t Hk = int32_t(hp.ssm_hk), dk = int32_t(hp.ssm_dk), dv = int32_t(hp.ssm_dv);
    // G2 gates, G3 conv + SiLU (advances the window), G5 L2 norm of q (then 1/sqrt(dk)) and k
    PF_TRY(gdn_gates_rows(bl, W, al, W, L.ssm_a, L.dt_bias, beta, Hv, g, Hv, T, int32_t(Hv), st));
    const int32_t kc = int32_t(hp.conv_kernel);
    const float q_scale = float(1.0 / std::sqrt(double(dk)));
    if (s->fuse_convnorm && gdn_conv1d_l2norm_supported(dk, kc)) {  // the three below in one pass, bitwise
        PF_TRY(gdn_conv1d_l2norm_rows(m, W, s->conv[size_t(il)], L.conv_w, u, cd, T, cd, kc, Hk, dk, kL2NormEps,
                                      q_scale, st));
    } else {
        PF_TRY(gdn_conv1d_rows(m, W, s->conv[size_t(il)], L.conv_w, u, cd, T, cd, kc, st));
        PF_TRY(gdn_l2norm_rows(u, cd, T, Hk, dk, dk, kL2NormEps, q_scale, st));
        PF_TRY(gdn_l2norm_rows(u + kd, cd, T, Hk, dk, dk, kL2NormEps, 1.0f, st));
    }
    // G6-G7 delta rule (tiled pairing), G8 gated RMSNorm in place on o
    // The chunked (tensor-core) delta rule on the fast legs from kGdnChunkMinRows rows on; the
    // sequential scan on the exact f32 leg, for decode and for short chunks.
    int32_t run = PF_GEMM_F32;
    PF_TRY(resolve_gemm_leg(L.qkv, s->leg, &run));
    const int32_t pick = gdn_scan_env_default();
    if (gdn_chunk_supported(dk, dv) && s->gdn_ws != nullptr &&
        (pick == 2 || (pick == 0 && run != PF_GEMM_F32 && T >= kGdnChunkMinRows)))
        PF_TRY(gdn_chunk_scan_rows(u, cd, u + kd, cd, u + 2 * kd, cd, beta, Hv, g, Hv, s->ssm[size_t(il)], o,
                                   vd, T, Hk, int32_t(Hv), dk, dv, s->gdn_ws, s->gdn_ws_bytes, 0, st));
    else
        PF_TRY(gdn_scan_rows(u, cd, u + kd, cd, u + 2 * kd, cd, beta, Hv, g, Hv, s->ssm[size_t(il)], o, vd, T,
                             Hk, int32_t(Hv), dk, dv, st));
    if (s->act16) {
        PF_TRY(gdn_gated_rms_norm_rows_f16(o, vd, z, W, L.ssm_norm, f16_out(s, vd, s->x), T, int32_t(Hv), dv,
                                           eps, st));
        return project_f16_rows(ctx, L.ssm_out, s->h16, s->inv16, T, s->x, hp.n_embd, true);
    }
    PF_TRY(gdn_gated_rms_norm_rows(o, vd, z, W, L.ssm_norm, o, vd, T, int32_t(Hv), dv, eps, st));
    return project(ctx, L.ssm_out, o, T, vd, s->x, hp.n_embd, true, s->leg);
}

// FFN (B3): x += (silu(h2 Wg^T) * (h2 Wu^T)) Wd^T, h2 = RMSNorm(x).
pf_status ffn(pf_session *s, const LayerWeights &L, int64_t T) {
    const Hparams &hp = s->model->hp;
    const int64_t d = hp.n_embd, ff = hp.n_ff, W = 2 * ff;
    PF_TRY(norm_input(s, s->x, L.post_norm, T));
    // gate | up side by side ([T][2 n_ff]); SwiGLU writes over the gate half.
    PF_TRY(project_group(s, {L.gate, L.up}, {s->a, s->a + ff}, T, W));
    if (s->act16)  // SwiGLU writes down's input form (and pre-scales x's rows if need be)
        PF_TRY(swiglu_rows_f16(s->a, W, s->a + ff, W, f16_out(s, ff, s->x), T, ff, s->ctx->stream));
    else
        PF_TRY(swiglu_rows(s->a, W, s->a + ff, W, s->a, W, T, ff, s->ctx->stream));
    return project_in(s, L.down, s->a, W, T, s->x, d, true);
}

// One chunk of T <= s->chunk tokens (ids: their device ids, s->ids + s->pos) at s->pos (also in
// s->pos_dev), its launches through R (ChunkRunner); s->attn_in_graph set for this chunk.
pf_status run_chunk(pf_session *s, const int32_t *ids, int64_t T, ChunkRunner &R) {
    pf_model *m = s->model;
    const Hparams &hp = m->hp;
    const int64_t d = hp.n_embd;
    if (s->graph_attn) {  // the chunk's ids at s->ids + *pos_dev: the same launch for any chunk
        PF_TRY(R.graphed([&] {
            return embed_rows_at(m->tok_embd->data, m->tok_embd->qtype, hp.n_vocab, d, s->ids, s->pos_dev, T,
                                 s->x, d, s->ctx->stream);
        }));
    } else {
        PF_TRY(R.eager([&] {  // where the ids are moves with the chunk
            return embed_rows(m->tok_embd->data, m->tok_embd->qtype, hp.n_vocab, d, ids, T, s->x, d,
                              s->ctx->stream);
        }));
    }
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const LayerWeights &L = m->layers[size_t(il)];
        PF_TRY(R.graphed([&] { return norm_input(s, s->x, L.attn_norm, T); }));
        if (L.attn) PF_TRY(attn_layer(s, L, T, R));
        else PF_TRY(R.graphed([&] { return gdn_layer(s, L, il, T); }));
        PF_TRY(R.graphed([&] { return ffn(s, L, T); }));
    }
    return R.close();
}

// ---------------------------------------------------------------------------- chunk graphs

constexpr size_t kMaxChunkGraphs = 8;  // chunk lengths with graphs per session (then eager)
constexpr size_t kSeenLengths = 16;    // recent chunk lengths remembered (capture on the 2nd sighting)

void destroy_graph(ChunkGraph &g) {
    for (cudaGraphExec_t e : g.segs) (void)cudaGraphExecDestroy(e);
    g.segs.clear();
}

// The graphs for a chunk of T rows now, or nullptr (run eagerly): a length is captured when it
// comes back (among the last kSeenLengths lengths), so that one-off tail lengths do not pay a
// capture, and only while the session holds fewer than kMaxChunkGraphs (the full chunk and the
// decode step, the lengths that recur, come first in practice; no eviction, so no churn). A graph whose key no longer holds
// (the act16 route, fusion, the fp16 caches or the resolved leg changed, the context's scratch
// moved) is dropped and captured anew. A length may hold two graphs, one with attention inside
// (s->attn_in_graph) and one in segments (AUTO's cuBLAS chunks deep into the cache): a decode
// that crosses that line, then a new prompt after a reset, replays both without recapture.
ChunkGraph *chunk_graph(pf_session *s, int64_t T) {
    if (!s->graph_env || s->graph_off) return nullptr;
    const pf_context *c = s->ctx;
    ChunkGraph key;
    key.T = T;
    key.attn = s->attn_in_graph;
    key.act16 = s->act16;
    key.fuse = s->fuse;
    key.cached = s->cached;
    key.leg = s->leg == PF_GEMM_DEFAULT ? gemm_default_leg() : s->leg;
    key.scratch[0] = c->scratch_f32.ptr;
    key.scratch[1] = c->scratch_f16_w.ptr;
    key.scratch[2] = c->scratch_f16_x.ptr;
    auto same = [&](const ChunkGraph &g) {
        return g.act16 == key.act16 && g.fuse == key.fuse && g.cached == key.cached && g.leg == key.leg &&
               std::equal(g.scratch, g.scratch + 3, key.scratch);
    };
    for (size_t i = 0; i < s->graphs.size(); ++i) {
        ChunkGraph &g = s->graphs[i];
        if (g.T != T || g.attn != key.attn) continue;
        if (same(g)) return &g;
        destroy_graph(g);
        s->graphs.erase(s->graphs.begin() + std::ptrdiff_t(i));
        break;
    }
    if (std::find(s->seen_T.begin(), s->seen_T.end(), T) == s->seen_T.end()) {
        if (s->seen_T.size() == kSeenLengths) s->seen_T.erase(s->seen_T.begin());
        s->seen_T.push_back(T);
        return nullptr;
    }
    if (s->graphs.size() == kMaxChunkGraphs) return nullptr;  // full: no churn of captures
    s->graphs.push_back(key);
    return &s->graphs.back();
}

// One chunk: eagerly, or through its graphs (captured first when new). A failed capture (an
// operation the stream capture refuses) has run nothing: the chunk then runs eagerly, and so
// does the session from then on.
pf_status run_chunk_graphed(pf_session *s, const int32_t *ids, int64_t T) {
    cudaStream_t st = s->ctx->stream;
    s->attn_in_graph = attn_graphable(s, T);  // before chunk_graph: part of the key
    ChunkGraph *g = chunk_graph(s, T);
    if (g && g->segs.empty()) {
        pf_status r;
        {
            ChunkRunner cap(st, ChunkRunner::Capture, &g->segs);
            r = run_chunk(s, ids, T, cap);
        }  // ~ChunkRunner ends a capture left open
        if (r != PF_STATUS_OK) {
            (void)cudaGetLastError();
            destroy_graph(*g);
            s->graphs.pop_back();  // the entry chunk_graph just added
            s->graph_off = true;
            g = nullptr;
        }
    }
    ChunkRunner run(st, g ? ChunkRunner::Replay : ChunkRunner::Eager, g ? &g->segs : nullptr);
    return run_chunk(s, ids, T, run);
}

// s->pos into s->pos_dev, in stream order (a kernel argument: no host staging, no wait).
pf_status set_position(pf_session *s) { return store_i64(s->pos_dev, s->pos, s->ctx->stream); }

// Logits of chunk rows [r0, r0 + n) (n <= s->lm_rows) into s->logits: final norm, LM head.
pf_status lm_head(pf_session *s, int64_t r0, int64_t n) {
    pf_model *m = s->model;
    const Hparams &hp = m->hp;
    const int64_t d = hp.n_embd;
    PF_TRY(norm_input(s, s->x + r0 * d, m->output_norm, n));
    return project_in(s, m->output, s->h, d, n, s->logits, hp.n_vocab, false);
}

// Whether every matrix of the model has its fp16 cache (the prewarm is all or nothing).
bool all_cached(const pf_session *s) {
    for (const pf_weight *w : s->model->weights)
        if (!w->f16) return false;
    return true;
}

// Whether this call runs the act16 route: enabled, every matrix cached (project_f16_rows needs
// an fp16 copy; AUTO without one would be the f32 leg), the session's leg f16 or auto.
bool act16_route(const pf_session *s) {
    if (!s->act16_env || !s->cached) return false;
    const int32_t leg = s->leg == PF_GEMM_DEFAULT ? gemm_default_leg() : s->leg;
    return leg == PF_GEMM_F16 || leg == PF_GEMM_AUTO;
}

// Device bytes of a session's chunk scratch for chunks of T rows (x, h, a, b, o, the gates, the
// LM-head rows, the ids, the delta rule's workspace, the f16 leg's fp16 activations), without
// the KV caches and recurrent states (which do not depend on T) or the cuBLAS attention path's
// budget-bound workspace.
size_t chunk_scratch_bytes(const Hparams &hp, int64_t T) {
    const int64_t Hv = std::max<int64_t>(hp.ssm_hv, 1);
    int64_t w = 2 * hp.n_embd;
    w += std::max({hp.q_proj_dim() + 2 * hp.kv_dim(), hp.conv_dim() + hp.value_dim() + 2 * Hv, 2 * hp.n_ff});
    w += hp.conv_dim() + std::max(hp.n_head * hp.head_dim, hp.value_dim()) + 2 * Hv;
    const int64_t k_max = std::max({hp.n_embd, hp.n_ff, hp.n_head * hp.head_dim, hp.value_dim()});
    size_t b = size_t(T) * size_t(w) * 4 + size_t(T) * size_t(k_max) * 2 + size_t(T) * 8;
    if (hp.ssm_hv > 0 && gdn_chunk_supported(int32_t(hp.ssm_dk), int32_t(hp.ssm_dv)))
        b += gdn_chunk_workspace_bytes(T, int32_t(hp.ssm_hk), int32_t(hp.ssm_hv));
    return b;
}

// The chunk when the options leave it 0: kAutoChunk rows (capped at the capacity), halved down
// to kMinAutoChunk while its scratch would take more than 1/kAutoChunkShare of the device memory
// free after the KV caches and recurrent states (`state_bytes`).
pf_status auto_chunk(const Hparams &hp, int32_t max_tokens, size_t state_bytes, int32_t *out) {
    size_t free_b = 0, total_b = 0;
    PF_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    const size_t avail = free_b > state_bytes ? free_b - state_bytes : 0;
    int32_t c = std::min(kAutoChunk, max_tokens);
    while (c > kMinAutoChunk && chunk_scratch_bytes(hp, c) > avail / kAutoChunkShare) c /= 2;
    *out = c;
    return PF_STATUS_OK;
}

// The f16-leg GEMM shapes of a chunk of s->chunk rows, as the layer loop runs them now (the
// fused block of project_group or its parts side by side, the accumulating wo / ssm_out / down
// into the residual stream), each with the weight it reads; then the session's plan (the
// process's choice per shape, timed for the shapes it has none for yet) on the chunk scratch:
// x = h16 [chunk][widest k] fp16, y = a [chunk][widest group] (the accumulating shapes too:
// never the residual stream x, the caches or the states).
pf_status plan_gemms(pf_session *s, size_t x_elems, size_t y_elems, GemmLtMode mode) {
    const pf_model *m = s->model;
    const Hparams &hp = m->hp;
    const int64_t T = s->chunk, d = hp.n_embd;
    std::vector<GemmTuneJob> jobs;
    auto add = [&](pf_weight *w, int64_t ldy, bool accumulate) {
        int32_t run = PF_GEMM_F32;
        if (!w || resolve_gemm_leg(w, s->leg, &run) != PF_STATUS_OK || run != PF_GEMM_F16) return;
        const __half *whole = w->f16 ? w->f16
                              : w->qtype == PF_QTYPE_F16 ? static_cast<const __half *>(w->data)
                                                         : nullptr;
        if (!whole) return;  // the streaming leg's slabs run GemmEx
        GemmTuneJob j;
        j.shape = GemmShape{w->n, T, w->k, ldy, accumulate};
        j.w = whole;
        jobs.push_back(j);
    };
    auto group = [&](std::initializer_list<pf_weight *> parts, int64_t ldy) {
        pf_weight view;
        if (s->fuse && fused_f16_view(parts.begin(), int32_t(parts.size()), s->leg, &view))
            return add(&view, ldy, false);
        for (pf_weight *w : parts) add(w, ldy, false);
    };
    for (const LayerWeights &L : m->layers) {
        if (L.attn) {
            group({L.wq, L.wk, L.wv}, hp.q_proj_dim() + 2 * hp.kv_dim());
            add(L.wo, d, true);
        } else {
            group({L.qkv, L.z, L.beta, L.alpha}, hp.conv_dim() + hp.value_dim() + 2 * hp.ssm_hv);
            add(L.ssm_out, d, true);
        }
        group({L.gate, L.up}, 2 * hp.n_ff);
        add(L.down, d, true);
    }
    if (jobs.empty()) return PF_STATUS_OK;  // the f32 leg, or no fp16 copies
    std::unique_ptr<GemmPlan> plan(new GemmPlan());
    PF_TRY(gemm_plan_build(s->ctx, jobs, s->h16, x_elems, s->a, y_elems, mode, plan.get()));
    if (plan->size() > 0) s->gemm_plan = plan.release();  // none: every call runs GemmEx
    return PF_STATUS_OK;
}

// Makes a session's GEMM plan current on its context for one prefill call (restored on exit, on
// every path: kernel-level calls between prefills run GemmEx).
class PlanScope {
  public:
    PlanScope(pf_context *ctx, const GemmPlan *plan) : ctx_(ctx), old_(ctx->gemm_plan) { ctx->gemm_plan = plan; }
    ~PlanScope() { ctx_->gemm_plan = old_; }
    PlanScope(const PlanScope &) = delete;
    PlanScope &operator=(const PlanScope &) = delete;

  private:
    pf_context *ctx_;
    const GemmPlan *old_;
};

}  // namespace

// ---------------------------------------------------------------------------- lifecycle

pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out) {
    const Hparams &hp = m->hp;
    std::unique_ptr<pf_session> s(new pf_session());
    s->model = m;
    s->ctx = m->ctx;
    s->max_tokens = o.max_tokens ? o.max_tokens : kDefaultMaxTokens;
    s->kv_dtype = o.kv_dtype;
    s->leg = o.gemm_leg ? o.gemm_leg : m->gemm_leg;
    s->attn_path = o.attn_path;
    s->fuse = fuse_env_enabled();
    s->act16_env = act16_env_enabled();
    s->graph_env = o.cuda_graphs == 1 && graph_env_enabled();
    s->fuse_qkrope = qkrope_env_enabled() && qk_norm_rope_kv_supported(int32_t(hp.head_dim), int32_t(hp.rope_dim));
    s->graph_attn = graph_attn_env_enabled();
    s->fuse_convnorm = convnorm_env_enabled();
    const size_t kv_bytes = size_t(s->max_tokens) * size_t(hp.kv_dim()) * kv_elem(s->kv_dtype);
    if (o.chunk_tokens) {
        s->chunk = std::min(o.chunk_tokens, s->max_tokens);
    } else {
        const size_t states = 2 * kv_bytes * size_t(m->n_attn_layers) +
                              size_t(hp.n_layer - m->n_attn_layers) * 4 *
                                  size_t((hp.conv_kernel - 1) * hp.conv_dim() + hp.ssm_hv * hp.ssm_dk * hp.ssm_dv);
        PF_TRY(auto_chunk(hp, s->max_tokens, states, &s->chunk));
    }
    const int64_t T = s->chunk, d = hp.n_embd;
    const int64_t Hv = std::max<int64_t>(hp.ssm_hv, 1);
    // a: the widest projection group's side-by-side outputs (see project_group)
    const int64_t w_a = std::max({hp.q_proj_dim() + 2 * hp.kv_dim(), hp.conv_dim() + hp.value_dim() + 2 * Hv,
                                  2 * hp.n_ff});
    const int64_t w_b = hp.conv_dim();  // GDN conv output (0 for qwen3: not allocated)
    const int64_t w_o = std::max(hp.n_head * hp.head_dim, hp.value_dim());
    pf_session *r = s.get();
    auto fail_cleanup = [&](pf_status st) { session_destroy(s.release()); return st; };
    pf_status st = PF_STATUS_OK;
    auto A = [&](size_t count, float **p, const char *what) {
        if (st == PF_STATUS_OK) st = salloc_t(r, count, p, what);
    };
    A(size_t(T * d), &r->x, "session scratch x");
    A(size_t(T * d), &r->h, "session scratch h");
    A(size_t(T * w_a), &r->a, "session scratch a");
    A(size_t(T * w_b), &r->b, "session scratch b");
    A(size_t(T * w_o), &r->o, "session scratch o");
    A(size_t(T * Hv), &r->s3, "session scratch gates");
    A(size_t(T * Hv), &r->s4, "session scratch gates");
    r->lm_rows = int32_t(std::min<int64_t>(kLmRows, T));
    A(size_t(r->lm_rows) * size_t(hp.n_vocab), &r->logits, "session logits");
    const int64_t k16 = std::max({d, hp.n_ff, hp.n_head * hp.head_dim, hp.value_dim()});  // widest projection input
    if (st == PF_STATUS_OK) st = salloc_t(r, size_t(T * k16), &r->h16, "session scratch h16");
    A(size_t(T), &r->inv16, "session scratch row scales");
    if (st == PF_STATUS_OK) st = salloc_t(r, size_t(r->max_tokens), &r->ids, "session token ids");
    if (st == PF_STATUS_OK) st = salloc_t(r, 1, &r->pos_dev, "session position");
    if (st == PF_STATUS_OK) st = salloc_t(r, 1, &r->argmax, "session argmax");
    r->k_cache.assign(size_t(m->n_attn_layers), nullptr);
    r->v_cache.assign(size_t(m->n_attn_layers), nullptr);
    r->conv.assign(size_t(hp.n_layer), nullptr);
    r->ssm.assign(size_t(hp.n_layer), nullptr);
    for (int32_t i = 0; i < m->n_attn_layers && st == PF_STATUS_OK; i++) {
        st = salloc(r, kv_bytes, &r->k_cache[size_t(i)], "KV cache K");
        if (st == PF_STATUS_OK) st = salloc(r, kv_bytes, &r->v_cache[size_t(i)], "KV cache V");
    }
    for (int64_t il = 0; il < hp.n_layer && st == PF_STATUS_OK; il++) {
        if (m->layers[size_t(il)].attn) continue;
        A(size_t((hp.conv_kernel - 1) * hp.conv_dim()), &r->conv[size_t(il)], "conv window");
        A(size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv), &r->ssm[size_t(il)], "recurrent state");
    }
    // The chunked delta rule's workspace (prep results of one pass of <= chunk rows).
    if (st == PF_STATUS_OK && hp.ssm_hv > 0 && gdn_chunk_supported(int32_t(hp.ssm_dk), int32_t(hp.ssm_dv))) {
        r->gdn_ws_bytes = gdn_chunk_workspace_bytes(T, int32_t(hp.ssm_hk), int32_t(hp.ssm_hv));
        if (r->gdn_ws_bytes) st = salloc(r, r->gdn_ws_bytes, &r->gdn_ws, "GDN chunk workspace");
    }
    // The cuBLAS attention path's workspace. The path is chosen per call (attention_resolved_path):
    // always cuBLAS for an fp32 cache or a forced path, and with AUTO also for short chunks deep
    // into the cache (few flash blocks, many keys). Sized for the most query rows a cuBLAS call
    // of this session can have, at keys up to the capacity (the choice is monotone: fewer rows
    // and more keys favour cuBLAS); attention() runs smaller passes where a call needs more.
    if (st == PF_STATUS_OK && m->n_attn_layers > 0) {
        attention_args a;
        a.k_cache = r->k_cache[0];
        a.v_cache = r->v_cache[0];
        a.kv_dtype = r->kv_dtype;
        a.n_heads = int32_t(hp.n_head);
        a.n_kv_heads = int32_t(hp.n_head_kv);
        a.head_dim = int32_t(hp.head_dim);
        a.path = r->attn_path;
        auto cublas_at = [&](int64_t rows) {
            a.rows = rows;
            a.pos0 = r->max_tokens - rows;
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
        if (rows > 0) {
            a.path = PF_ATTN_CUBLAS;
            a.rows = rows;
            a.pos0 = r->max_tokens - rows;
            r->attn_ws_bytes = attention_workspace_bytes(a, attention_rows_per_pass(a));
            if (r->attn_ws_bytes) st = salloc(r, r->attn_ws_bytes, &r->attn_ws, "attention workspace");
        }
    }
    // The context's projection scratch, grown now for this session's shapes and legs: a prefill
    // then allocates nothing (as long as the weights' caches stay as they are now).
    for (const LayerWeights &L : m->layers)
        for (pf_weight *w : {L.wq, L.wk, L.wv, L.wo, L.qkv, L.z, L.beta, L.alpha, L.ssm_out, L.gate, L.up, L.down})
            if (w && st == PF_STATUS_OK) st = project_reserve(r->ctx, w, T, r->leg);
    if (st == PF_STATUS_OK) st = project_reserve(r->ctx, m->output, r->lm_rows, r->leg);
    // The f16 leg's GEMM algorithms for the chunk's projection shapes (times the shapes the
    // process has not chosen for yet, on the session's scratch; synchronizes).
    const GemmLtMode lt = gemm_lt_env_mode();
    if (st == PF_STATUS_OK && lt != kGemmLtOff) st = plan_gemms(r, size_t(T * k16), size_t(T * w_a), lt);
    if (st != PF_STATUS_OK) return fail_cleanup(st);
    if ((st = session_reset(r)) != PF_STATUS_OK) return fail_cleanup(st);
    *out = s.release();
    return PF_STATUS_OK;
}

void session_destroy(pf_session *s) {
    if (!s) return;
    DeviceGuard dg(s->ctx->device);
    (void)cudaStreamSynchronize(s->ctx->stream);
    for (ChunkGraph &g : s->graphs) destroy_graph(g);
    for (auto &a : s->allocs) device_free(s->ctx, a.first, a.second);
    delete s->gemm_plan;
    delete s;
}

pf_status session_reset(pf_session *s) {
    const Hparams &hp = s->model->hp;
    cudaStream_t st = s->ctx->stream;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        if (s->conv[size_t(il)])
            PF_CUDA_TRY(cudaMemsetAsync(s->conv[size_t(il)], 0,
                                        size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4, st));
        if (s->ssm[size_t(il)])
            PF_CUDA_TRY(cudaMemsetAsync(s->ssm[size_t(il)], 0,
                                        size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4, st));
    }
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    s->pos = 0;
    s->broken = false;
    s->last_token = -1;
    return PF_STATUS_OK;
}

// ---------------------------------------------------------------------------- prefill

pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                          float *logits, size_t logits_len, int32_t *out_token) {
    const Hparams &hp = s->model->hp;
    const int64_t V = hp.n_vocab;
    PF_CHECK_ARG(!s->broken, "pf_session_prefill: the session hit a device error earlier; call "
                             "pf_session_reset");
    PF_CHECK_ARG(n > 0, "pf_session_prefill: n_tokens=%d must be > 0", n);
    PF_CHECK_ARG(tokens != nullptr, "pf_session_prefill: tokens is NULL");
    PF_CHECK_ARG(mode >= PF_LOGITS_NONE && mode <= PF_LOGITS_ALL,
                 "pf_session_prefill: logits_mode=%d is not a pf_logits_mode", mode);
    PF_CHECK_ARG(s->pos + n <= s->max_tokens,
                 "pf_session_prefill: %d tokens at position %lld exceed the session's capacity of %d",
                 n, (long long)s->pos, s->max_tokens);
    const size_t need = mode == PF_LOGITS_ALL ? size_t(n) * size_t(V) : mode == PF_LOGITS_LAST ? size_t(V) : 0;
    if (need) {
        PF_CHECK_ARG(logits != nullptr, "pf_session_prefill: logits is NULL");
        PF_CHECK_ARG(logits_len >= need, "pf_session_prefill: logits_len=%zu, the mode needs %zu floats",
                     logits_len, need);
    }
    for (int32_t i = 0; i < n; i++)
        PF_CHECK_ARG(tokens[i] >= 0 && tokens[i] < V,
                     "pf_session_prefill: tokens[%d]=%d is outside the vocabulary [0, %lld)", i,
                     tokens[i], (long long)V);
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = s->ctx->stream;
    s->cached = all_cached(s);
    s->act16 = act16_route(s);
    const PlanScope plan_scope(s->ctx, s->gemm_plan);  // the session's GEMM choices, this call only
    auto body = [&]() -> pf_status {
        // The call's tokens in one copy (a copy from pageable memory may wait for the stream:
        // once per call, not once per chunk), at their positions: a chunk's ids are then at
        // s->ids + its position, which the graphed embedding reads from s->pos_dev.
        const int64_t pos_call = s->pos;
        PF_CUDA_TRY(cudaMemcpyAsync(s->ids + pos_call, tokens, size_t(n) * 4, cudaMemcpyHostToDevice, st));
        for (int64_t done = 0; done < n;) {
            const int64_t T = std::min<int64_t>(s->chunk, n - done);
            PF_TRY(set_position(s));
            PF_TRY(run_chunk_graphed(s, s->ids + pos_call + done, T));
            const bool last_chunk = done + T == n;
            if (mode == PF_LOGITS_ALL) {
                for (int64_t r0 = 0; r0 < T; r0 += s->lm_rows) {
                    const int64_t rn = std::min<int64_t>(s->lm_rows, T - r0);
                    PF_TRY(lm_head(s, r0, rn));
                    PF_CUDA_TRY(cudaMemcpyAsync(logits + size_t(done + r0) * size_t(V), s->logits,
                                                size_t(rn) * size_t(V) * 4, cudaMemcpyDeviceToHost, st));
                    if (last_chunk && r0 + rn == T) PF_TRY(argmax_rows(s->logits + (rn - 1) * V, 1, V, V, s->argmax, st));
                    PF_CUDA_TRY(cudaStreamSynchronize(st));  // s->logits is reused by the next pass
                }
            } else if (last_chunk) {
                PF_TRY(lm_head(s, T - 1, 1));
                PF_TRY(argmax_rows(s->logits, 1, V, V, s->argmax, st));
                if (mode == PF_LOGITS_LAST)
                    PF_CUDA_TRY(cudaMemcpyAsync(logits, s->logits, size_t(V) * 4, cudaMemcpyDeviceToHost, st));
            }
            s->pos += T;
            done += T;
        }
        int32_t tok = -1;
        PF_CUDA_TRY(cudaMemcpyAsync(&tok, s->argmax, 4, cudaMemcpyDeviceToHost, st));
        PF_CUDA_TRY(cudaStreamSynchronize(st));
        s->last_token = tok;
        if (out_token) *out_token = tok;
        return PF_STATUS_OK;
    };
    const pf_status r = body();
    if (r != PF_STATUS_OK) s->broken = true;  // caches and states may be half-written
    return r;
}

// ---------------------------------------------------------------------------- state

namespace {
int32_t n_gdn_layers(const pf_session *s) {
    int32_t n = 0;
    for (const float *c : s->conv) n += c != nullptr;
    return n;
}

// What this session expects of a state (and writes into one).
StateLayout state_layout(const pf_session *s) {
    const Hparams &hp = s->model->hp;
    StateLayout l;
    l.fingerprint = s->model->fingerprint;
    l.kv_dtype = s->kv_dtype;
    l.max_tokens = s->max_tokens;
    l.n_attn = s->model->n_attn_layers;
    l.n_gdn = n_gdn_layers(s);
    l.kv_dim = hp.kv_dim();
    l.conv_floats = (hp.conv_kernel - 1) * hp.conv_dim();
    l.ssm_floats = hp.ssm_hv * hp.ssm_dk * hp.ssm_dv;
    l.n_vocab = hp.n_vocab;
    return l;
}

// The device address of a span's data: K/V cache rows from 0, or the index-th GDN layer's
// conv window / recurrent state.
void *span_device(pf_session *s, const StateSpan &sp) {
    switch (sp.kind) {
        case StateSpan::K: return s->k_cache[size_t(sp.index)];
        case StateSpan::V: return s->v_cache[size_t(sp.index)];
        default: break;
    }
    int32_t k = 0;
    for (size_t il = 0; il < s->conv.size(); il++) {
        if (!s->conv[il]) continue;
        if (k++ == sp.index) return sp.kind == StateSpan::Conv ? static_cast<void *>(s->conv[il]) : s->ssm[il];
    }
    return nullptr;
}
}  // namespace

size_t session_state_size(const pf_session *s) { return state_bytes(state_layout(s), s->pos); }

pf_status session_save(pf_session *s, void *dst, size_t bytes) {
    PF_CHECK_ARG(!s->broken, "pf_session_save: the session hit a device error earlier");
    const StateLayout l = state_layout(s);
    const size_t need = state_bytes(l, s->pos);
    PF_CHECK_ARG(dst != nullptr, "pf_session_save: dst is NULL");
    PF_CHECK_ARG(bytes >= need, "pf_session_save: bytes=%zu, the state needs %zu", bytes, need);
    const StateHeader h = state_header(l, s->pos, s->last_token);
    char *p = static_cast<char *>(dst);
    std::memcpy(p, &h, sizeof h);
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = s->ctx->stream;
    for (const StateSpan &sp : state_spans(l, s->pos))
        PF_CUDA_TRY(cudaMemcpyAsync(p + sp.offset, span_device(s, sp), sp.bytes, cudaMemcpyDeviceToHost, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    return PF_STATUS_OK;
}

pf_status session_restore(pf_session *s, const void *src, size_t bytes) {
    const StateLayout l = state_layout(s);
    StateHeader h;
    PF_TRY(state_check(src, bytes, l, &h));  // everything is checked before the session changes
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = s->ctx->stream;
    const char *p = static_cast<const char *>(src);
    s->broken = true;  // until every copy has landed
    for (const StateSpan &sp : state_spans(l, h.pos))
        PF_CUDA_TRY(cudaMemcpyAsync(span_device(s, sp), p + sp.offset, sp.bytes, cudaMemcpyHostToDevice, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    s->pos = h.pos;
    s->last_token = h.last_token;
    s->broken = false;
    return PF_STATUS_OK;
}

}  // namespace pf
