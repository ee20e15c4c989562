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
#include "runtime/project.h"
#include "runtime/sequence.h"

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

    Mode mode() const { return mode_; }

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
    a.pages = sequence_kv_pages(*it.seq);
    a.kv_capacity = sequence_kv_rows(*it.seq);
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
    const ProjGroup *groups = layer_groups(true);
    const int64_t W = qd + 2 * kvd;  // group_width(Lw, groups[kMixerIn])
    float *q = e->a, *k = e->a + qd, *v = e->a + qd + kvd, *o = e->o;
    const float eps = float(hp.eps);
    const bool fused_rope = e->plan.fuse_qk_rope && qk_norm_rope_kv_supported(int32_t(D), int32_t(hp.rope_dim));
    // An item's q/k norms, RoPE (at its position on the device) and KV-cache write, on `s`.
    auto rope = [&](size_t i, cudaStream_t s) -> pf_status {
        const StepItem &it = items[i];
        const KvCache cache{it.seq->k_cache[size_t(Lw.attn_index)], it.seq->v_cache[size_t(Lw.attn_index)],
                            it.seq->kv_dtype, sequence_kv_pages(*it.seq)};
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
            a.pages = cache.pages;
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
        a.stream = s;
        return attention(ctx, a);
    };
    // Several items on the flash path: each item's RoPE + attention on a side stream, forked
    // from st and joined back (a step graph captures the branches): the items' small grids run
    // side by side instead of one after another. Same launches, same bits.
    const bool fork = e->attn_in_graph && items.size() > 1 && !e->side.empty();
    PF_TRY(R.graphed([&]() -> pf_status {
        PF_TRY(project_group(e, Lw, groups[kMixerIn], step_input(e, CMatF{e->h, hp.n_embd}), T, MatF{e->a, W}));
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
        ProjIn in = ProjIn::f32(CMatF{o, H * D});  // qwen3: fp32 o (the f16 leg casts it)
        if (gated && e->act16) {
            PF_TRY(sigmoid_gate_rows_f16(CMatF{o, H * D}, CMatF{q + D, W}, gh, f16_out(e, H * D, e->x), T, st));
            in = step_input(e, in.x);
        } else if (gated) {
            PF_TRY(sigmoid_gate_rows(MatF{o, H * D}, CMatF{q + D, W}, gh, T, st));
        }
        return project_group(e, Lw, groups[kMixerOut], in, T, MatF{e->x, hp.n_embd});
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
    ProjRoute r;
    return step_route(e->plan, Lw.qkv, &r) != PF_STATUS_OK || r.leg == PF_GEMM_F32;
}

// One GDN layer's sequence part in a step (G3-G7: conv + SiLU, the q/k L2 norms, the delta rule),
// its operands at step row 0 (an item's are at its row0).
struct GdnMix {
    int64_t il = 0;           // the layer
    GdnConvNormArgs conv;     // m -> u over the step's rows (the window per item)
    GdnScanArgs scan;         // u, beta, g -> o over the step's rows (the state per item)
    bool fused = false;       // conv + norms as one kernel (gdn_conv1d_l2norm_supported)
    bool exact = false;       // the in-projection runs the f32 leg (gdn_exact)
};

// G3 conv + SiLU (advances the item's window), G5 L2 norm of q (then 1/sqrt(dk)) and of k, on
// one item's rows: one kernel when fused, else three (bitwise the same).
pf_status conv_norm_item(const Executor *e, const GdnMix &g, const StepItem &it, bool fused) {
    const GdnConvNormArgs &c = g.conv;
    const int64_t kd = int64_t(c.n_k_heads) * c.dk;
    const CMatF mi = c.m.rows_from(it.row0);
    const MatF ui = c.u.rows_from(it.row0);
    float *window = it.seq->conv[size_t(g.il)];
    cudaStream_t st = e->ctx->stream;
    if (fused) {
        GdnConvNormArgs ci = c;
        ci.m = mi;
        ci.window = window;
        ci.u = ui;
        ci.rows = it.rows;
        return gdn_conv1d_l2norm_rows(ci, st);
    }
    PF_TRY(gdn_conv1d_rows(mi, window, c.weight, ui, it.rows, c.conv_dim, c.kc, st));
    PF_TRY(gdn_l2norm_rows(ui, it.rows, c.n_k_heads, c.dk, c.dk, c.eps, c.q_scale, st));
    return gdn_l2norm_rows(ui.cols_from(kd), it.rows, c.n_k_heads, c.dk, c.dk, c.eps, 1.0f, st);
}

// Every item in one launch per kind (tuning.varlen; the step's tables, varlen_tables): bitwise
// the per-item launches of gdn_mix_items.
pf_status gdn_mix_varlen(Executor *e, const GdnMix &g, const std::vector<StepItem> &items) {
    cudaStream_t st = e->ctx->stream;
    const VarlenStep &vs = e->vstep;
    const int64_t gi = e->gdn_slot[size_t(g.il)];
    auto ptrs = [&](const VarlenGroup &grp) {
        return reinterpret_cast<float *const *>(e->tab + grp.state + gi * grp.n);
    };
    if (g.fused) {
        GdnConvSeqs cs;
        cs.n = vs.all.n;
        cs.row0 = e->tab + vs.all.row0;
        cs.rows = e->tab + vs.all.rows;
        cs.windows = ptrs(vs.all);
        cs.max_rows = vs.max_rows;
        PF_TRY(gdn_conv1d_l2norm_rows_varlen(g.conv, cs, st));
    } else {
        for (const StepItem &it : items) PF_TRY(conv_norm_item(e, g, it, false));
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
        PF_TRY(gdn_chunk_scan_rows_varlen(g.scan, seqs(vs.chunked), e->gdn_ws, e->L.gdn_ws, e->plan.gdn, st));
    if (vs.sequential.n) PF_TRY(gdn_scan_rows_varlen(g.scan, seqs(vs.sequential), st));
    return PF_STATUS_OK;
}

// Item by item: conv + norms, then G6-G7 the delta rule (tiled pairing) on the item's path.
pf_status gdn_mix_items(Executor *e, const GdnMix &g, const std::vector<StepItem> &items) {
    cudaStream_t st = e->ctx->stream;
    const GdnScanArgs &b = g.scan;
    const int64_t kd = int64_t(b.n_k_heads) * b.dk;
    for (const StepItem &it : items) {
        PF_TRY(conv_norm_item(e, g, it, g.fused));
        const MatF ui = g.conv.u.rows_from(it.row0);
        GdnScanArgs sa = b;
        sa.q = CMatF(ui);
        sa.k = CMatF(ui.cols_from(kd));
        sa.v = CMatF(ui.cols_from(2 * kd));
        sa.beta = b.beta.rows_from(it.row0);
        sa.g = b.g.rows_from(it.row0);
        sa.state = it.seq->ssm[size_t(g.il)];
        sa.o = b.o.rows_from(it.row0);
        sa.rows = it.rows;
        if (scan_path(e, g.exact, it.rows) == PF_GDN_SCAN_CHUNKED)
            PF_TRY(gdn_chunk_scan_rows(sa, e->gdn_ws, e->L.gdn_ws, e->plan.gdn, st));
        else
            PF_TRY(gdn_scan_rows(sa, st));
    }
    return PF_STATUS_OK;
}

// Gated DeltaNet mixer (spec.md §3.2 G1-G9): x += GDN(h) . W_out^T.
pf_status gdn_layer(Executor *e, const LayerWeights &Lw, int64_t il, const std::vector<StepItem> &items, int64_t T) {
    const Hparams &hp = e->model->hp;
    cudaStream_t st = e->ctx->stream;
    const int64_t cd = hp.conv_dim(), vd = hp.value_dim(), kd = hp.key_dim(), Hv = hp.ssm_hv;
    // qkv | z | b | a side by side in one [T][W] scratch (see attn_layer).
    const ProjGroup *groups = layer_groups(false);
    const int64_t W = cd + vd + 2 * Hv;  // group_width(Lw, groups[kMixerIn])
    float *m = e->a, *z = e->a + cd, *bl = e->a + cd + vd, *al = e->a + cd + vd + Hv;
    float *u = e->b, *o = e->o;
    PF_TRY(project_group(e, Lw, groups[kMixerIn], step_input(e, CMatF{e->h, hp.n_embd}), T, MatF{e->a, W}));
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
    GdnMix g;
    g.il = il;
    g.scan.q = CMatF{u, cd};
    g.scan.k = CMatF{u + kd, cd};
    g.scan.v = CMatF{u + 2 * kd, cd};
    g.scan.beta = CMatF{e->beta, Hv};
    g.scan.g = CMatF{e->g, Hv};
    g.scan.o = MatF{o, vd};
    g.scan.rows = T;
    g.scan.n_k_heads = Hk;
    g.scan.n_v_heads = int32_t(Hv);
    g.scan.dk = dk;
    g.scan.dv = dv;
    g.conv.m = CMatF{m, W};
    g.conv.weight = Lw.conv_w;
    g.conv.u = MatF{u, cd};
    g.conv.rows = T;
    g.conv.conv_dim = cd;
    g.conv.kc = int32_t(hp.conv_kernel);
    g.conv.n_k_heads = Hk;
    g.conv.dk = dk;
    g.conv.eps = kL2NormEps;
    g.conv.q_scale = float(1.0 / std::sqrt(double(dk)));
    g.fused = e->plan.fuse_conv_norm && gdn_conv1d_l2norm_supported(dk, g.conv.kc);
    g.exact = gdn_exact(e, Lw);
    // The step's varlen groups were made for the first GDN layer's leg (a layer whose leg differs
    // runs item by item).
    if (e->vstep.on && g.exact == e->vstep_exact) PF_TRY(gdn_mix_varlen(e, g, items));
    else PF_TRY(gdn_mix_items(e, g, items));
    // G8 gated RMSNorm in place on o (row-local), G9 out-projection into the residual stream
    GdnGatedNormArgs na;
    na.o = CMatF{o, vd};
    na.z = CMatF{z, W};
    na.w = Lw.ssm_norm;
    na.rows = T;
    na.n_v_heads = int32_t(Hv);
    na.dv = dv;
    na.eps = float(hp.eps);
    if (e->act16) PF_TRY(gdn_gated_rms_norm_rows_f16(na, f16_out(e, vd, e->x), st));
    else PF_TRY(gdn_gated_rms_norm_rows(na, MatF{o, vd}, st));
    return project_group(e, Lw, groups[kMixerOut], step_input(e, CMatF{o, vd}), T, MatF{e->x, hp.n_embd});
}

// FFN (B3): x += (silu(h2 Wg^T) * (h2 Wu^T)) Wd^T, h2 = RMSNorm(x).
pf_status ffn(Executor *e, const LayerWeights &Lw, int64_t T) {
    const Hparams &hp = e->model->hp;
    const int64_t d = hp.n_embd, ff = hp.n_ff, W = 2 * ff;
    const ProjGroup *groups = layer_groups(Lw.attn);
    PF_TRY(norm_input(e, e->x, Lw.post_norm, T));
    // gate | up side by side ([T][2 n_ff]); SwiGLU writes over the gate half.
    PF_TRY(project_group(e, Lw, groups[kFfnIn], step_input(e, CMatF{e->h, d}), T, MatF{e->a, W}));
    if (e->act16)  // SwiGLU writes down's input form (and pre-scales x's rows if need be)
        PF_TRY(swiglu_rows_f16(CMatF{e->a, W}, CMatF{e->a + ff, W}, f16_out(e, ff, e->x), T, ff, e->ctx->stream));
    else
        PF_TRY(swiglu_rows(CMatF{e->a, W}, CMatF{e->a + ff, W}, MatF{e->a, W}, T, ff, e->ctx->stream));
    return project_group(e, Lw, groups[kFfnOut], step_input(e, CMatF{e->a, W}), T, MatF{e->x, d});
}

// One step of T rows (the items'), its launches through R; e->attn_in_graph set for this step.
pf_status run_step(Executor *e, const std::vector<StepItem> &items, int64_t T, Runner &R) {
    const pf_model *m = e->model;
    const Hparams &hp = m->hp;
    const int64_t d = hp.n_embd;
    // The step's ids at e->ids + *vals[0]: the same launch for any step of this shape
    PF_TRY(R.graphed([&] {
        // The slab ring (its fork and first slabs): for steps of the slab rows that are one capture
        // (attention inside the graph) or eager, under the weight forms its jobs were listed for.
        const bool ring = T >= e->plan.blocks_slab_rows && (R.mode() == Runner::Eager || e->attn_in_graph) &&
                          e->ring.weight_forms == e->ctx->weight_forms.load();
        PF_TRY(slab_ring_begin(e->ctx, &e->ring, ring));
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
    PF_TRY(R.graphed([&] { return slab_ring_end(e->ctx, &e->ring); }));
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
    key.f16_rows = e->f16_rows;
    key.scratch[0] = e->w32.ptr;
    key.scratch[1] = e->w16.ptr;
    key.scratch[2] = e->x16.ptr;
    key.weight_forms = e->ctx->weight_forms.load();
    auto same = [&](const StepGraph &g) {
        return g.act16 == key.act16 && g.f16_rows == key.f16_rows && g.weight_forms == key.weight_forms &&
               std::equal(g.scratch, g.scratch + 3, key.scratch);
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
    PF_CHECK_ARG(T >= 1 && T <= e->L.step_rows && int64_t(items.size()) <= e->L.max_items,
                 "executor_step: %lld rows, %zu items (at most %lld and %lld)", (long long)T, items.size(),
                 (long long)e->L.step_rows, (long long)e->L.max_items);
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
    return project_in(e, m->output, step_input(e, CMatF{e->h, d}), n, MatF{e->logits, hp.n_vocab}, false);
}

}  // namespace pf
