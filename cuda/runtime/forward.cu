// forward.cu — the layer loop of one step (spec.md §1.3 for qwen3, §3 for qwen35) over the rows of
// one or many sequences, and its CUDA graphs. The projections, norms, gates and FFN run once over
// all rows of the step; what reads or writes a sequence's state (the q/k RoPE and the KV-cache
// write, attention, the GDN conv window and the delta rule) runs per item, on the item's rows and
// state.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "base/cuda_check.cuh"
#include "kernels/attention/attention.cuh"
#include "kernels/attention/qk_rope.cuh"
#include "kernels/dequant/dequant.cuh"
#include "kernels/gdn/gdn.cuh"
#include "kernels/gemm/gemm.cuh"
#include "kernels/gemm/gemm_lt.cuh"
#include "kernels/rows/f16_rows.cuh"
#include "kernels/rows/rows.cuh"
#include "runtime/executor.h"
#include "runtime/session.h"

namespace pf {
namespace {

constexpr float kL2NormEps = 1e-6f;  // GDN q/k L2 norm: HF hard-codes 1e-6 (spec.md §0, G5)

// Runs a step's launches in order, as steps of two kinds: graphed (launches that depend on the
// step's shape only: the positions and the ids offset are read from device memory) and eager
// (attention on the cuBLAS path, whose launches and AUTO choice depend on the position). Modes:
//  - Eager: every step runs.
//  - Capture: consecutive graphed steps are captured into one segment (it ends at the next eager
//    step or at close); eager steps are skipped. Nothing runs on the device.
//  - Replay: each segment's graph is launched where its first step stands; eager steps run.
// So Capture then Replay launches exactly what Eager launches, in the same order.
class Runner {
  public:
    enum Mode { Eager, Capture, Replay };
    Runner(cudaStream_t st, Mode mode, std::vector<cudaGraphExec_t> *segs) : st_(st), mode_(mode), segs_(segs) {}
    Runner(const Runner &) = delete;
    Runner &operator=(const Runner &) = delete;
    ~Runner() { abort(); }

    template <class F>
    pf_status graphed(F &&fn) {
        if (mode_ == Eager) return fn();
        if (mode_ == Replay) {
            if (open_) return PF_STATUS_OK;  // the segment's graph holds this step
            PF_CHECK_ARG(next_ < segs_->size(), "step graph: replay past the %zu captured segments", segs_->size());
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
        cudaGraphExec_t x = nullptr;
        const cudaError_t err = cudaGraphInstantiate(&x, g, 0);
        (void)cudaGraphDestroy(g);
        if (err != cudaSuccess) return cuda_fail(err, __FILE__, __LINE__, "step graph: cudaGraphInstantiate");
        segs_->push_back(x);
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

ProjEnv proj(Executor *e) {
    ProjEnv p;
    p.ctx = e->ctx;
    p.plan = e->gemm_plan.get();
    p.w32 = &e->w32;
    p.w16 = &e->w16;
    p.x16 = &e->x16;
    return p;
}

// The f16 leg's input form of [rows][cols] in the fp16 scratch (f16_rows.cuh); `acc` (optional,
// [rows][n_embd]) is the residual stream the projection will accumulate into.
F16Out f16_out(const Executor *e, int64_t cols, float *acc = nullptr) {
    F16Out o;
    o.x16 = e->h16;
    o.ld16 = cols;  // the GEMM reads rows of k = cols
    o.inv = e->inv16;
    if (acc) {
        o.acc = acc;
        o.ld_acc = o.n_acc = e->model->hp.n_embd;
    }
    o.form = e->plan.rows;
    return o;
}

// The normed input of the projections (RMSNorm of x's rows): fp16 in h16 on the act16 route,
// fp32 in h otherwise.
pf_status norm_input(Executor *e, const float *x, const float *w, int64_t rows) {
    const Hparams &hp = e->model->hp;
    const int64_t d = hp.n_embd;
    if (e->act16) return rms_norm_rows_f16(CMatF{x, d}, w, f16_out(e, d), rows, d, float(hp.eps), e->ctx->stream);
    return rms_norm_rows(CMatF{x, d}, w, MatF{e->h, d}, rows, d, float(hp.eps), e->ctx->stream);
}

// y (+)= input . W^T for the input norm_input or a producer left: project_f16_rows on the
// act16 route, project() on fp32 `x` otherwise.
pf_status project_in(Executor *e, pf_weight *w, CMatF x, int64_t rows, MatF y, bool accumulate) {
    if (e->act16) {
        if (session_leg(e->plan.leg, w) == PF_GEMM_INT8 && !accumulate)  // the recipe's int8 inputs
            return project_i8_rows(proj(e), w, e->h16, e->inv16, rows, y);
        return project_f16_rows(proj(e), w, e->h16, e->inv16, rows, y, accumulate);
    }
    return project(proj(e), w, x, y, rows, accumulate, session_leg(e->plan.leg, w));
}

// Projects e->h through weights that share it as input into column slices of one [T][ldy]
// output (out[i] = the first column of part i's slice). One GEMM through the fused fp16 block
// when the parts run the f16 leg and were prewarmed as a group (model_f16_groups), else one
// projection per part: the same values within the f16 leg's tolerance, the same layout.
// Under the 8-bit leg the parts split into runs of one leg (Q | K | V: Q int8, K | V f16), each
// run one GEMM where its members are one fused block of that leg (fused_i8_view, fused_f16_view).
pf_status project_group(Executor *e, std::initializer_list<pf_weight *> parts, std::initializer_list<float *> out,
                        int64_t T, int64_t ldy) {
    const CMatF h{e->h, e->model->hp.n_embd};
    pf_weight *const *ps = parts.begin();
    float *const *ys = out.begin();
    const size_t n = parts.size();
    for (size_t i = 0; i < n;) {
        const int32_t leg = session_leg(e->plan.leg, ps[i]);
        size_t j = i + 1;
        while (j < n && session_leg(e->plan.leg, ps[j]) == leg) ++j;
        pf_weight view;
        const int32_t cnt = int32_t(j - i);
        const bool fused = e->plan.fuse_groups && cnt > 1 &&
                           (leg == PF_GEMM_INT8 ? fused_i8_view(ps + i, cnt, &view)
                                                : fused_f16_view(ps + i, cnt, leg, &view));
        if (fused) {
            PF_TRY(project_in(e, &view, h, T, MatF{ys[i], ldy}, false));
        } else {
            for (size_t k = i; k < j; ++k) PF_TRY(project_in(e, ps[k], h, T, MatF{ys[k], ldy}, false));
        }
        i = j;
    }
    return PF_STATUS_OK;
}

// Item i's position on the device (Executor::vals: [ids offset, pos_0, pos_1, ...]).
const int64_t *pos_dev(const Executor *e, size_t i) { return e->vals + 1 + i; }

// attention's arguments for item `it` (index i) in the index-th attention layer: q in the
// side-by-side scratch e->a (see attn_layer), o in e->o, at the item's rows; the host position.
AttentionArgs attn_args(const Executor *e, const StepItem &it, int32_t index) {
    const Hparams &hp = e->model->hp;
    const int64_t D = hp.head_dim, H = hp.n_head;
    const bool gated = hp.arch == PF_ARCH_QWEN35;
    AttentionArgs a;
    a.ldq = hp.q_proj_dim() + 2 * hp.kv_dim();
    a.q = e->a + it.row0 * a.ldq;
    a.q_head_stride = gated ? 2 * D : D;
    a.k_cache = it.seq->k_cache[size_t(index)];
    a.v_cache = it.seq->v_cache[size_t(index)];
    a.kv_dtype = it.seq->kv_dtype;
    a.ldo = H * D;
    a.o = e->o + it.row0 * a.ldo;
    a.n_heads = int32_t(H);
    a.n_kv_heads = int32_t(hp.n_head_kv);
    a.head_dim = int32_t(D);
    a.rows = it.rows;
    a.pos0 = it.pos;
    a.scale = float(1.0 / std::sqrt(double(D)));
    a.path = e->plan.attn_path;
    a.kernel = e->plan.attn_kernel;
    a.workspace = e->attn_ws;  // the cuBLAS path's scratch (null when only flash runs)
    a.workspace_bytes = e->attn_ws_bytes;
    return a;
}

// Whether a step runs attention inside its graph: every attention layer of every item resolves
// to the flash path (the kernels then take the position from device memory; a cuBLAS layer's
// launches depend on it). A function of the items' rows and positions only: part of the graph's
// key, so a replay runs the structure that was captured.
bool attn_graphable(const Executor *e, const std::vector<StepItem> &items) {
    for (const StepItem &it : items)
        for (int32_t i = 0; i < e->model->n_attn_layers; i++)
            if (attention_resolved_path(attn_args(e, it, i)) != PF_ATTN_FLASH) return false;
    return true;
}

// Attention mixer (spec.md §1.3 steps 2-7 / §3.1 A1-A9): x += attention(h) . Wo^T.
pf_status attn_layer(Executor *e, const LayerWeights &Lw, const std::vector<StepItem> &items, int64_t T, Runner &R) {
    pf_context *ctx = e->ctx;
    const Hparams &hp = e->model->hp;
    cudaStream_t st = ctx->stream;
    const int64_t D = hp.head_dim, H = hp.n_head, kvd = hp.kv_dim(), qd = hp.q_proj_dim();
    const bool gated = hp.arch == PF_ARCH_QWEN35;
    const int64_t q_head_stride = gated ? 2 * D : D;
    // q | k | v side by side in one [T][W] scratch: one fused GEMM on the f16 leg, three
    // projections into the column slices otherwise (the same layout downstream).
    const int64_t W = qd + 2 * kvd;
    float *q = e->a, *k = e->a + qd, *v = e->a + qd + kvd, *o = e->o;
    const float eps = float(hp.eps);
    const bool fused_rope = e->plan.fuse_qk_rope && qk_norm_rope_kv_supported(int32_t(D), int32_t(hp.rope_dim));
    // An item's q/k norms, RoPE (at its position on the device) and KV-cache write, on `s`.
    auto rope = [&](size_t i, cudaStream_t s) -> pf_status {
        const StepItem &it = items[i];
        const KvCache cache{it.seq->k_cache[size_t(Lw.attn_index)], it.seq->v_cache[size_t(Lw.attn_index)],
                            it.seq->kv_dtype};
        float *qi = q + it.row0 * W, *ki = k + it.row0 * W;
        const float *vi = v + it.row0 * W;
        if (fused_rope) {  // the five launches below in one, bitwise the same (qk_rope.cu)
            QkRopeKvArgs a;
            a.q = qi;
            a.ldq = W;
            a.q_head_stride = q_head_stride;
            a.k = ki;
            a.ldk = W;
            a.v = vi;
            a.ldv = W;
            a.rows = it.rows;
            a.n_heads = int32_t(H);
            a.n_kv_heads = int32_t(hp.n_head_kv);
            a.head_dim = int32_t(D);
            a.rot_dim = int32_t(hp.rope_dim);
            a.rope_base = float(hp.rope_base);
            a.q_norm = Lw.q_norm;
            a.k_norm = Lw.k_norm;
            a.eps = eps;
            a.pos0_dev = pos_dev(e, i);
            a.k_cache = cache.k;
            a.v_cache = cache.v;
            a.kv_dtype = cache.dtype;
            a.regs = e->plan.rows.regs;
            return qk_norm_rope_kv_at(a, s);
        }
        const HeadLayout qh{int32_t(H), q_head_stride, int32_t(D)}, kh{int32_t(hp.n_head_kv), D, int32_t(D)};
        PF_TRY(head_rms_norm_rows(MatF{qi, W}, it.rows, qh, Lw.q_norm, eps, s));
        PF_TRY(head_rms_norm_rows(MatF{ki, W}, it.rows, kh, Lw.k_norm, eps, s));
        // RoPE reads the item's position from device memory: the same launch at any position
        PF_TRY(rope_neox_rows_at(MatF{qi, W}, it.rows, qh, int32_t(hp.rope_dim), pos_dev(e, i), float(hp.rope_base), s));
        PF_TRY(rope_neox_rows_at(MatF{ki, W}, it.rows, kh, int32_t(hp.rope_dim), pos_dev(e, i), float(hp.rope_base), s));
        return kv_write_at(CMatF{ki, W}, CMatF{vi, W}, it.rows, kvd, cache, pos_dev(e, i), s);
    };
    // The flash kernels with the position on the device: the same launch at any position (grid
    // over query tiles x heads, the key loop bounded in the kernel, the wgmma maps over the whole
    // capacity), so they join the graph segment.
    auto flash = [&](size_t i, cudaStream_t s) {
        AttentionArgs a = attn_args(e, items[i], Lw.attn_index);
        a.path = PF_ATTN_FLASH;  // attn_graphable resolved it for this step
        a.pos0_dev = pos_dev(e, i);
        a.kv_capacity = items[i].seq->max_tokens;
        a.stream = s;
        return attention(ctx, a);
    };
    // Several items on the flash path: each item's RoPE + attention on a side stream, forked
    // from st and joined back (a step graph captures the branches): the items' small grids run
    // side by side instead of one after another. Same launches, same bits.
    const bool fork = e->attn_in_graph && items.size() > 1 && !e->side.empty();
    PF_TRY(R.graphed([&]() -> pf_status {
        PF_TRY(project_group(e, {Lw.wq, Lw.wk, Lw.wv}, {q, k, v}, T, W));
        if (!fork)
            for (size_t i = 0; i < items.size(); ++i) PF_TRY(rope(i, st));
        return PF_STATUS_OK;
    }));
    if (fork) {
        PF_TRY(R.graphed([&]() -> pf_status {
            const size_t n = std::min(items.size(), e->side.size());
            PF_CUDA_TRY(cudaEventRecord(e->side_ev[0], st));
            for (size_t j = 0; j < n; ++j) PF_CUDA_TRY(cudaStreamWaitEvent(e->side[j], e->side_ev[0], 0));
            for (size_t i = 0; i < items.size(); ++i) {
                PF_TRY(rope(i, e->side[i % n]));
                PF_TRY(flash(i, e->side[i % n]));
            }
            for (size_t j = 0; j < n; ++j) {
                PF_CUDA_TRY(cudaEventRecord(e->side_ev[1 + j], e->side[j]));
                PF_CUDA_TRY(cudaStreamWaitEvent(st, e->side_ev[1 + j], 0));
            }
            return PF_STATUS_OK;
        }));
    } else {
        for (size_t i = 0; i < items.size(); ++i) {
            if (e->attn_in_graph) {
                PF_TRY(R.graphed([&] { return flash(i, st); }));
            } else {
                // The cuBLAS path's launches (and AUTO's choice) depend on the position: run
                // eagerly between the graph segments.
                AttentionArgs a = attn_args(e, items[i], Lw.attn_index);
                PF_TRY(R.eager([&] { return attention(ctx, a); }));
            }
        }
    }
    // A8: o *= sigmoid(gate), the gate half of each head's [q | gate] row; on the act16 route
    // the gate writes wo's input form (and pre-scales x's rows where a row needs it)
    return R.graphed([&]() -> pf_status {
        const HeadLayout gh{int32_t(H), 2 * D, int32_t(D)};
        if (gated && e->act16) {
            PF_TRY(sigmoid_gate_rows_f16(CMatF{o, H * D}, CMatF{q + D, W}, gh, f16_out(e, H * D, e->x), T, st));
            return project_f16_rows(proj(e), Lw.wo, e->h16, e->inv16, T, MatF{e->x, hp.n_embd}, true);
        }
        if (gated) PF_TRY(sigmoid_gate_rows(MatF{o, H * D}, CMatF{q + D, W}, gh, T, st));
        // qwen3: fp32 o, cast there
        return project(proj(e), Lw.wo, CMatF{o, H * D}, MatF{e->x, hp.n_embd}, T, true,
                       session_leg(e->plan.leg, Lw.wo));
    });
}

// An item's delta-rule path: chunked (tensor cores) on the fast legs from kGdnChunkMinRows rows
// where the executor has the chunked workspace, sequential on the exact f32 leg (the leg the GDN
// in-projection runs), for decode and for short items (gdn_scan_choose).
int32_t scan_path(const Executor *e, bool exact, int64_t rows) {
    const Hparams &hp = e->model->hp;
    if (e->gdn_ws == nullptr) return PF_GDN_SCAN_SEQUENTIAL;
    return gdn_scan_choose(PF_GDN_SCAN_AUTO, e->plan.gdn_scan, exact, rows, int32_t(hp.ssm_dk), int32_t(hp.ssm_dv));
}

// Whether the layer's in-projection runs the exact f32 leg (the delta rule then runs sequential).
bool gdn_exact(const Executor *e, const LayerWeights &Lw) {
    int32_t run = PF_GEMM_F32;
    return resolve_gemm_leg(Lw.qkv, session_leg(e->plan.leg, Lw.qkv), &run) != PF_STATUS_OK || run == PF_GEMM_F32;
}

// Gated DeltaNet mixer (spec.md §3.2 G1-G9): x += GDN(h) . W_out^T.
pf_status gdn_layer(Executor *e, const LayerWeights &Lw, int64_t il, const std::vector<StepItem> &items, int64_t T) {
    pf_context *ctx = e->ctx;
    const Hparams &hp = e->model->hp;
    cudaStream_t st = ctx->stream;
    const int64_t cd = hp.conv_dim(), vd = hp.value_dim(), kd = hp.key_dim(), Hv = hp.ssm_hv;
    // qkv | z | b | a side by side in one [T][W] scratch (see attn_layer).
    const int64_t W = cd + vd + 2 * Hv;
    float *m = e->a, *z = e->a + cd, *bl = e->a + cd + vd, *al = e->a + cd + vd + Hv;
    float *u = e->b, *o = e->o;
    PF_TRY(project_group(e, {Lw.qkv, Lw.z, Lw.beta, Lw.alpha}, {m, z, bl, al}, T, W));
    const float eps = float(hp.eps);
    const int32_t Hk = int32_t(hp.ssm_hk), dk = int32_t(hp.ssm_dk), dv = int32_t(hp.ssm_dv);
    // G2 gates (row-local: every row of the step at once)
    GdnGatesArgs ga;
    ga.b = CMatF{bl, W};
    ga.alpha = CMatF{al, W};
    ga.ssm_a = Lw.ssm_a;
    ga.dt_bias = Lw.dt_bias;
    ga.beta = MatF{e->beta, Hv};
    ga.g = MatF{e->g, Hv};
    ga.rows = T;
    ga.n_v_heads = int32_t(Hv);
    PF_TRY(gdn_gates_rows(ga, st));
    const int32_t kc = int32_t(hp.conv_kernel);
    const float q_scale = float(1.0 / std::sqrt(double(dk)));
    // The layer's operands at step row 0 (an item's at its row0)
    GdnScanArgs base;
    base.q = CMatF{u, cd};
    base.k = CMatF{u + kd, cd};
    base.v = CMatF{u + 2 * kd, cd};
    base.beta = CMatF{e->beta, Hv};
    base.g = CMatF{e->g, Hv};
    base.o = MatF{o, vd};
    base.rows = T;
    base.n_k_heads = Hk;
    base.n_v_heads = int32_t(Hv);
    base.dk = dk;
    base.dv = dv;
    GdnConvNormArgs ca;
    ca.m = CMatF{m, W};
    ca.weight = Lw.conv_w;
    ca.u = MatF{u, cd};
    ca.rows = T;
    ca.conv_dim = cd;
    ca.kc = kc;
    ca.n_k_heads = Hk;
    ca.dk = dk;
    ca.eps = kL2NormEps;
    ca.q_scale = q_scale;
    const bool fused = e->plan.fuse_conv_norm && gdn_conv1d_l2norm_supported(dk, kc);
    const VarlenStep &vs = e->vstep;
    const bool exact = gdn_exact(e, Lw);
    // the step's groups were made for the first GDN layer's leg (a layer whose leg differs runs
    // per item)
    if (vs.on && exact == e->vstep_exact) {
        // Every item in one launch per kind (tuning.varlen): bitwise the per-item launches below.
        const int64_t gi = e->gdn_slot[size_t(il)];
        auto ptrs = [&](const VarlenGroup &grp) {
            return reinterpret_cast<float *const *>(e->tab + grp.state + gi * grp.n);
        };
        if (fused) {
            GdnConvSeqs cs;
            cs.n = vs.all.n;
            cs.row0 = e->tab + vs.all.row0;
            cs.rows = e->tab + vs.all.rows;
            cs.windows = ptrs(vs.all);
            cs.max_rows = vs.max_rows;
            PF_TRY(gdn_conv1d_l2norm_rows_varlen(ca, cs, st));
        } else {
            for (const StepItem &it : items) {
                const CMatF mi{m + it.row0 * W, W};
                const MatF ui{u + it.row0 * cd, cd};
                PF_TRY(gdn_conv1d_rows(mi, it.seq->conv[size_t(il)], Lw.conv_w, ui, it.rows, cd, kc, st));
                PF_TRY(gdn_l2norm_rows(ui, it.rows, Hk, dk, dk, kL2NormEps, q_scale, st));
                PF_TRY(gdn_l2norm_rows(ui.cols_from(kd), it.rows, Hk, dk, dk, kL2NormEps, 1.0f, st));
            }
        }
        auto seqs = [&](const VarlenGroup &grp) {
            GdnSeqs s;
            s.n = grp.n;
            s.row0 = e->tab + grp.row0;
            s.rows = e->tab + grp.rows;
            s.chunk0 = e->tab + grp.chunk0;
            s.state = ptrs(grp);
            s.host_rows = grp.host_rows.data();
            return s;
        };
        if (vs.chunked.n)
            PF_TRY(gdn_chunk_scan_rows_varlen(base, seqs(vs.chunked), e->gdn_ws, e->L.gdn_ws, e->plan.gdn, st));
        if (vs.sequential.n) PF_TRY(gdn_scan_rows_varlen(base, seqs(vs.sequential), st));
    } else {
        for (const StepItem &it : items) {
            float *window = it.seq->conv[size_t(il)], *state = it.seq->ssm[size_t(il)];
            const CMatF mi{m + it.row0 * W, W};
            const MatF ui{u + it.row0 * cd, cd};
            // G3 conv + SiLU (advances the window), G5 L2 norm of q (then 1/sqrt(dk)) and k
            if (fused) {  // the three below in one, bitwise
                GdnConvNormArgs ci = ca;
                ci.m = mi;
                ci.window = window;
                ci.u = ui;
                ci.rows = it.rows;
                PF_TRY(gdn_conv1d_l2norm_rows(ci, st));
            } else {
                PF_TRY(gdn_conv1d_rows(mi, window, Lw.conv_w, ui, it.rows, cd, kc, st));
                PF_TRY(gdn_l2norm_rows(ui, it.rows, Hk, dk, dk, kL2NormEps, q_scale, st));
                PF_TRY(gdn_l2norm_rows(ui.cols_from(kd), it.rows, Hk, dk, dk, kL2NormEps, 1.0f, st));
            }
            // G6-G7 delta rule (tiled pairing)
            GdnScanArgs sa = base;
            sa.q = CMatF(ui);
            sa.k = CMatF(ui.cols_from(kd));
            sa.v = CMatF(ui.cols_from(2 * kd));
            sa.beta = CMatF{e->beta + it.row0 * Hv, Hv};
            sa.g = CMatF{e->g + it.row0 * Hv, Hv};
            sa.state = state;
            sa.o = MatF{o + it.row0 * vd, vd};
            sa.rows = it.rows;
            if (scan_path(e, exact, it.rows) == PF_GDN_SCAN_CHUNKED)
                PF_TRY(gdn_chunk_scan_rows(sa, e->gdn_ws, e->L.gdn_ws, e->plan.gdn, st));
            else
                PF_TRY(gdn_scan_rows(sa, st));
        }
    }
    // G8 gated RMSNorm in place on o (row-local), G9 out-projection into the residual stream
    GdnGatedNormArgs na;
    na.o = CMatF{o, vd};
    na.z = CMatF{z, W};
    na.w = Lw.ssm_norm;
    na.rows = T;
    na.n_v_heads = int32_t(Hv);
    na.dv = dv;
    na.eps = eps;
    if (e->act16) {
        PF_TRY(gdn_gated_rms_norm_rows_f16(na, f16_out(e, vd, e->x), st));
        return project_f16_rows(proj(e), Lw.ssm_out, e->h16, e->inv16, T, MatF{e->x, hp.n_embd}, true);
    }
    PF_TRY(gdn_gated_rms_norm_rows(na, MatF{o, vd}, st));
    return project(proj(e), Lw.ssm_out, CMatF{o, vd}, MatF{e->x, hp.n_embd}, T, true,
                   session_leg(e->plan.leg, Lw.ssm_out));
}

// FFN (B3): x += (silu(h2 Wg^T) * (h2 Wu^T)) Wd^T, h2 = RMSNorm(x).
pf_status ffn(Executor *e, const LayerWeights &Lw, int64_t T) {
    const Hparams &hp = e->model->hp;
    const int64_t d = hp.n_embd, ff = hp.n_ff, W = 2 * ff;
    PF_TRY(norm_input(e, e->x, Lw.post_norm, T));
    // gate | up side by side ([T][2 n_ff]); SwiGLU writes over the gate half.
    PF_TRY(project_group(e, {Lw.gate, Lw.up}, {e->a, e->a + ff}, T, W));
    if (e->act16)  // SwiGLU writes down's input form (and pre-scales x's rows if need be)
        PF_TRY(swiglu_rows_f16(CMatF{e->a, W}, CMatF{e->a + ff, W}, f16_out(e, ff, e->x), T, ff, e->ctx->stream));
    else
        PF_TRY(swiglu_rows(CMatF{e->a, W}, CMatF{e->a + ff, W}, MatF{e->a, W}, T, ff, e->ctx->stream));
    return project_in(e, Lw.down, CMatF{e->a, W}, T, MatF{e->x, d}, true);
}

// One step of T rows (the items'), its launches through R; e->attn_in_graph set for this step.
pf_status run_step(Executor *e, const std::vector<StepItem> &items, int64_t T, Runner &R) {
    const pf_model *m = e->model;
    const Hparams &hp = m->hp;
    const int64_t d = hp.n_embd;
    // The step's ids at e->ids + *vals[0]: the same launch for any step of this shape
    PF_TRY(R.graphed([&] {
        return embed_rows_at(QMatrix{m->tok_embd->data, m->tok_embd->qtype, hp.n_vocab, d}, e->ids, e->vals, T,
                             MatF{e->x, d}, e->ctx->stream);
    }));
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const LayerWeights &Lw = m->layers[size_t(il)];
        PF_TRY(R.graphed([&] { return norm_input(e, e->x, Lw.attn_norm, T); }));
        if (Lw.attn) PF_TRY(attn_layer(e, Lw, items, T, R));
        else PF_TRY(R.graphed([&] { return gdn_layer(e, Lw, il, items, T); }));
        PF_TRY(R.graphed([&] { return ffn(e, Lw, T); }));
    }
    return R.close();
}

// ---------------------------------------------------------------------------- graphs

constexpr size_t kMaxGraphs = 8;   // step shapes with graphs per executor and session (LRU beyond)
constexpr size_t kSeenShapes = 16; // recent step shapes remembered per session (capture on the 2nd sighting)

void destroy_graph(StepGraph &g) {
    for (cudaGraphExec_t x : g.segs) (void)cudaGraphExecDestroy(x);
    g.segs.clear();
}

// The graphs for a step of this shape now, or nullptr (run eagerly): a shape is captured when it
// comes back (among the last kSeenShapes shapes), so that one-off tails do not pay a capture, and
// at most kMaxGraphs per executor, the least recently replayed evicted for a new one (a batch's
// item sets change as requests come and go; a capture needs a second sighting, so a stream of
// one-off shapes captures nothing). Sequences are keyed by id, never by address: a destroyed
// session's memory is never replayed into. A graph whose key no
// longer holds (the act16 route or the caches changed, the projection scratch moved) is dropped
// and captured anew. A shape may hold two graphs, one with attention inside and one in segments
// (AUTO's cuBLAS chunks deep into the cache): a decode that crosses that line, then a new prompt
// after a reset, replays both without recapture.
StepGraph *step_graph(Executor *e, const std::vector<StepItem> &items, int64_t T) {
    if (!e->plan.graphs || e->graph_off) return nullptr;
    StepGraph key;
    key.rows = T;
    for (const StepItem &it : items) key.items.emplace_back(it.seq->id, it.rows);
    key.used = ++e->steps;
    key.attn = e->attn_in_graph;
    key.act16 = e->act16;
    key.cached = e->cached;
    key.scratch[0] = e->w32.ptr;
    key.scratch[1] = e->w16.ptr;
    key.scratch[2] = e->x16.ptr;
    auto same = [&](const StepGraph &g) {
        return g.act16 == key.act16 && g.cached == key.cached && std::equal(g.scratch, g.scratch + 3, key.scratch);
    };
    for (size_t i = 0; i < e->graphs.size(); ++i) {
        StepGraph &g = e->graphs[i];
        if (g.rows != T || g.attn != key.attn || g.items != key.items) continue;
        if (same(g)) {
            g.used = key.used;
            return &g;
        }
        destroy_graph(g);
        e->graphs.erase(e->graphs.begin() + std::ptrdiff_t(i));
        break;
    }
    // Forks sharing the executor each keep what a session of its own would (else a dozen forks
    // decoding in turn would evict each other's graphs and capture at every step).
    const size_t sharers = size_t(std::max(1, e->sharers));
    if (std::find(e->seen.begin(), e->seen.end(), key.items) == e->seen.end()) {
        while (e->seen.size() >= kSeenShapes * sharers) e->seen.erase(e->seen.begin());
        e->seen.push_back(key.items);
        return nullptr;
    }
    while (e->graphs.size() >= kMaxGraphs * sharers) {  // full: the least recently replayed goes
        auto lru = std::min_element(e->graphs.begin(), e->graphs.end(),
                                    [](const StepGraph &a, const StepGraph &b) { return a.used < b.used; });
        destroy_graph(*lru);
        e->graphs.erase(lru);
    }
    e->graphs.push_back(key);
    return &e->graphs.back();
}

// The step's varlen groups and tables (e->vstep, e->tab): with tuning.varlen, several items and
// GDN layers. The tables depend on the items (sequences, rows) only, as the step graph's key
// does; uploaded (one copy, in stream order) when they differ from the last upload.
pf_status varlen_tables(Executor *e, const std::vector<StepItem> &items) {
    VarlenStep &vs = e->vstep;
    vs.on = e->plan.varlen && items.size() > 1 && e->tab != nullptr;
    if (!vs.on) return PF_STATUS_OK;
    const pf_model *m = e->model;
    for (const LayerWeights &Lw : m->layers)
        if (!Lw.attn) {
            e->vstep_exact = gdn_exact(e, Lw);
            break;
        }
    std::vector<int64_t> &t = e->tab_host;
    t.clear();
    vs.max_rows = 0;
    std::vector<const StepItem *> ch, sq;
    for (const StepItem &it : items) {
        vs.max_rows = std::max(vs.max_rows, it.rows);
        (scan_path(e, e->vstep_exact, it.rows) == PF_GDN_SCAN_CHUNKED ? ch : sq).push_back(&it);
    }
    // One group's slots: row0 [n], rows [n], chunk0 [n + 1] (chunked), pointers [G][n].
    auto group = [&](VarlenGroup &g, const std::vector<const StepItem *> &its, bool chunks, bool windows) {
        g.n = int32_t(its.size());
        g.host_rows.clear();
        g.row0 = int64_t(t.size());
        for (const StepItem *it : its) t.push_back(it->row0);
        g.rows = int64_t(t.size());
        for (const StepItem *it : its) {
            t.push_back(it->rows);
            g.host_rows.push_back(it->rows);
        }
        g.chunk0 = int64_t(t.size());
        if (chunks) {
            int64_t c = 0;
            t.push_back(0);
            for (const StepItem *it : its) t.push_back(c += (it->rows + 63) / 64);
        }
        g.state = int64_t(t.size());
        for (size_t il = 0; il < m->layers.size(); ++il) {
            if (e->gdn_slot[il] < 0) continue;
            for (const StepItem *it : its)
                t.push_back(int64_t(reinterpret_cast<intptr_t>(windows ? it->seq->conv[il] : it->seq->ssm[il])));
        }
    };
    std::vector<const StepItem *> all;
    for (const StepItem &it : items) all.push_back(&it);
    group(vs.all, all, false, true);
    group(vs.chunked, ch, true, false);
    group(vs.sequential, sq, false, false);
    PF_CHECK_ARG(int64_t(t.size()) <= e->L.tab, "executor: varlen tables of %zu slots exceed the %lld laid out",
                 t.size(), (long long)e->L.tab);
    if (t != e->tab_dev_copy) {
        PF_CUDA_TRY(cudaMemcpyAsync(e->tab, t.data(), t.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                                    e->ctx->stream));
        e->tab_dev_copy = t;
    }
    return PF_STATUS_OK;
}

}  // namespace

// One step: eagerly, or through its graphs (captured first when new). A failed capture (an
// operation the stream capture refuses) has run nothing: the step then runs eagerly, and so does
// the executor from then on.
pf_status executor_step(Executor *e, const std::vector<StepItem> &items, int64_t ids_off) {
    cudaStream_t st = e->ctx->stream;
    int64_t T = 0;
    for (const StepItem &it : items) {
        PF_CHECK_ARG(it.row0 == T && it.rows >= 1, "executor_step: item rows out of order");
        T += it.rows;
    }
    PF_CHECK_ARG(T >= 1 && T <= e->L.rows && int64_t(items.size()) <= e->L.max_items,
                 "executor_step: %lld rows, %zu items (at most %lld and %lld)", (long long)T, items.size(),
                 (long long)e->L.rows, (long long)e->L.max_items);
    // The ids offset and each item's position, in stream order (kernel arguments: no host staging).
    std::vector<int64_t> v(1 + items.size());
    v[0] = ids_off;
    for (size_t i = 0; i < items.size(); ++i) v[1 + i] = items[i].pos;
    PF_TRY(store_i64s(e->vals, v.data(), int64_t(v.size()), st));
    PF_TRY(varlen_tables(e, items));
    e->attn_in_graph = attn_graphable(e, items);  // before step_graph: part of the key
    StepGraph *g = step_graph(e, items, T);
    if (g && g->segs.empty()) {
        pf_status r;
        {
            Runner cap(st, Runner::Capture, &g->segs);
            r = run_step(e, items, T, cap);
        }  // ~Runner ends a capture left open
        if (r != PF_STATUS_OK) {
            (void)cudaGetLastError();
            destroy_graph(*g);
            e->graphs.pop_back();  // the entry step_graph just added
            e->graph_off = true;
            g = nullptr;
        }
    }
    Runner run(st, g ? Runner::Replay : Runner::Eager, g ? &g->segs : nullptr);
    return run_step(e, items, T, run);
}

pf_status executor_lm_head(Executor *e, const float *x, int64_t n) {
    const pf_model *m = e->model;
    const Hparams &hp = m->hp;
    const int64_t d = hp.n_embd;
    PF_TRY(norm_input(e, x, m->output_norm, n));
    return project_in(e, m->output, CMatF{e->h, d}, n, MatF{e->logits, hp.n_vocab}, false);
}

}  // namespace pf
