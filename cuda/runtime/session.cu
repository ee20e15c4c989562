// session.cu — pf_session: creation (the sequence's state sized up front, the execution plan
// resolved, the session's executor), chunked prefill that continues from the position, greedy
// tokens, and the state save/restore format.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/cuda_check.cuh"
#include "kernels/gdn/gdn.cuh"
#include "kernels/rows/rows.cuh"
#include "plan/session_state.h"
#include "runtime/batch.h"
#include "runtime/executor.h"
#include "runtime/session.h"

namespace pf {
namespace {

constexpr int32_t kDefaultMaxTokens = 4096;

size_t kv_elem(int32_t kv_dtype) { return state_kv_elem(kv_dtype); }

// The layout of a sequence's state in its one allocation (256-byte aligned pieces, in this
// order): the K and V rows per attention layer, the conv window and recurrent state per GDN
// layer, the snapshot slots. Returns the bytes; with q, also points q's views into `base`.
size_t sequence_layout(const pf_model *m, int32_t max_tokens, int32_t kv_dtype, int32_t snap_slots, char *base,
                       Sequence *q) {
    const Hparams &hp = m->hp;
    size_t at = 0;
    auto take = [&](size_t bytes) {
        char *p = base ? base + at : nullptr;
        at += (bytes + 255) & ~size_t(255);
        return p;
    };
    const size_t kv_bytes = size_t(max_tokens) * size_t(hp.kv_dim()) * kv_elem(kv_dtype);
    for (int32_t i = 0; i < m->n_attn_layers; i++) {
        void *k = take(kv_bytes), *v = take(kv_bytes);
        if (q) {
            q->k_cache[size_t(i)] = k;
            q->v_cache[size_t(i)] = v;
        }
    }
    for (int64_t il = 0; il < hp.n_layer; il++) {
        if (m->layers[size_t(il)].attn) continue;
        float *c = reinterpret_cast<float *>(take(size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4));
        float *h = reinterpret_cast<float *>(take(size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4));
        if (q) {
            q->conv[size_t(il)] = c;
            q->ssm[size_t(il)] = h;
        }
    }
    const size_t snap = snapshot_bytes(m);
    char *slots = snap && snap_slots ? take(snap * size_t(snap_slots)) : nullptr;
    if (q) q->snap_mem = slots;
    return at;
}

void sequence_free(pf_context *ctx, Sequence &q) {
    device_free_pooled(ctx, q.mem, q.mem_bytes);
    q.mem = nullptr;
    q.mem_bytes = 0;
}

// The state of one sequence of `max_tokens` positions: KV caches per attention layer, conv
// window and recurrent state per GDN layer, the snapshot slots; one allocation from the
// context's sequence pool (so that a new session or fork of a size seen before takes no
// cudaMalloc). On failure nothing stays allocated.
pf_status sequence_alloc(const pf_model *m, int32_t max_tokens, int32_t kv_dtype, int32_t snap_slots, Sequence *q) {
    const Hparams &hp = m->hp;
    pf_context *ctx = m->ctx;
    static std::atomic<uint64_t> next_id{1};
    q->model = m;
    q->id = next_id++;
    q->max_tokens = max_tokens;
    q->kv_dtype = kv_dtype;
    q->k_cache.assign(size_t(m->n_attn_layers), nullptr);
    q->v_cache.assign(size_t(m->n_attn_layers), nullptr);
    q->conv.assign(size_t(hp.n_layer), nullptr);
    q->ssm.assign(size_t(hp.n_layer), nullptr);
    q->snap_bytes = snapshot_bytes(m);
    q->snap_slots = q->snap_bytes ? snap_slots : 0;
    const size_t bytes = sequence_layout(m, max_tokens, kv_dtype, q->snap_slots, nullptr, nullptr);
    void *mem = nullptr;
    PF_TRY(device_alloc_pooled(ctx, bytes, &mem, "session state (KV caches, recurrent states, snapshots)"));
    q->mem = mem;
    q->mem_bytes = bytes;
    sequence_layout(m, max_tokens, kv_dtype, q->snap_slots, static_cast<char *>(mem), q);
    return PF_STATUS_OK;
}

// Each GDN layer's (conv window, recurrent state): the spans a snapshot keeps, in layer order.
template <class F>
void for_each_recurrent(const pf_model *m, Sequence &q, F &&f) {
    const Hparams &hp = m->hp;
    const size_t conv = size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4, ssm = size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4;
    for (size_t il = 0; il < q.conv.size(); ++il)
        if (q.conv[il]) f(static_cast<void *>(q.conv[il]), conv, static_cast<void *>(q.ssm[il]), ssm);
}

// Zeroes a sequence's conv windows and recurrent states (the KV rows past pos are never read).
pf_status sequence_zero(const pf_model *m, Sequence &q, cudaStream_t st) {
    q.snaps.clear();
    const Hparams &hp = m->hp;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        if (q.conv[size_t(il)])
            PF_CUDA_TRY(cudaMemsetAsync(q.conv[size_t(il)], 0, size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4, st));
        if (q.ssm[size_t(il)])
            PF_CUDA_TRY(cudaMemsetAsync(q.ssm[size_t(il)], 0, size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4, st));
    }
    return PF_STATUS_OK;
}

}  // namespace

size_t snapshot_bytes(const pf_model *m) {
    const Hparams &hp = m->hp;
    size_t n = 0;
    for (const LayerWeights &L : m->layers)
        if (!L.attn) n += size_t((hp.conv_kernel - 1) * hp.conv_dim() + hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4;
    return n;
}

pf_status snapshot_take(Sequence &q, int32_t last_token, cudaStream_t st) {
    if (q.snap_slots == 0) return PF_STATUS_OK;  // none kept (or no recurrent state to keep)
    if (!q.snaps.empty() && q.snaps.back().pos == q.pos) {  // already held
        q.snaps.back().last_token = last_token;
        return PF_STATUS_OK;
    }
    int32_t slot = 0;
    if (int32_t(q.snaps.size()) == q.snap_slots) {  // full: the oldest goes
        slot = q.snaps.front().slot;
        q.snaps.erase(q.snaps.begin());
    } else {
        std::vector<bool> used(size_t(q.snap_slots), false);
        for (const Snapshot &h : q.snaps) used[size_t(h.slot)] = true;
        while (used[size_t(slot)]) ++slot;
    }
    char *dst = q.snap_mem + size_t(slot) * q.snap_bytes;
    pf_status r = PF_STATUS_OK;
    for_each_recurrent(q.model, q, [&](void *conv, size_t cb, void *ssm, size_t sb) {
        if (r != PF_STATUS_OK) return;
        cudaError_t e = cudaMemcpyAsync(dst, conv, cb, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(dst + cb, ssm, sb, cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) r = cuda_fail(e, __FILE__, __LINE__, "snapshot: cudaMemcpyAsync");
        dst += cb + sb;
    });
    PF_TRY(r);
    q.snaps.push_back(Snapshot{q.pos, last_token, slot});
    return PF_STATUS_OK;
}

pf_status sequence_copy(Sequence &dst, const Sequence &src, cudaStream_t st) {
    const Hparams &hp = src.model->hp;
    const size_t kv_rows = size_t(src.pos) * size_t(hp.kv_dim()) * kv_elem(src.kv_dtype);
    for (size_t i = 0; i < src.k_cache.size(); ++i) {
        PF_CUDA_TRY(cudaMemcpyAsync(dst.k_cache[i], src.k_cache[i], kv_rows, cudaMemcpyDeviceToDevice, st));
        PF_CUDA_TRY(cudaMemcpyAsync(dst.v_cache[i], src.v_cache[i], kv_rows, cudaMemcpyDeviceToDevice, st));
    }
    Sequence &s = const_cast<Sequence &>(src);  // read only: for_each_recurrent walks both the same way
    std::vector<std::pair<void *, void *>> from, to;
    for_each_recurrent(src.model, s, [&](void *c, size_t, void *h, size_t) { from.emplace_back(c, h); });
    for_each_recurrent(dst.model, dst, [&](void *c, size_t, void *h, size_t) { to.emplace_back(c, h); });
    const size_t conv = size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4, ssm = size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4;
    for (size_t i = 0; i < from.size(); ++i) {
        PF_CUDA_TRY(cudaMemcpyAsync(to[i].first, from[i].first, conv, cudaMemcpyDeviceToDevice, st));
        PF_CUDA_TRY(cudaMemcpyAsync(to[i].second, from[i].second, ssm, cudaMemcpyDeviceToDevice, st));
    }
    dst.pos = src.pos;
    dst.last_token = src.last_token;
    dst.broken = false;
    dst.snaps.clear();
    return PF_STATUS_OK;
}

// ---------------------------------------------------------------------------- lifecycle

pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out, const pf_session *like) {
    const Hparams &hp = m->hp;
    std::unique_ptr<pf_session> s(new pf_session());
    s->model = m;
    s->ref.reset(m->ctx);
    s->ctx = m->ctx;
    s->opts = o;
    const int32_t max_tokens = o.max_tokens ? o.max_tokens : kDefaultMaxTokens;
    // The execution plan: the session's tuning over its model's over its context's, the options,
    // the device and the environment, resolved once.
    const pf_tuning t = tuning_over(o.tuning, tuning_over(m->tuning, m->ctx->tuning));
    s->plan = like ? like->plan : exec_plan(o.gemm_leg ? o.gemm_leg : m->gemm_leg, t, o.attn_path, o.kv_dtype, o.cuda_graphs == 1);
    if (log_enabled(kLogPlan) && !like) {
        char buf[512];
        exec_plan_describe(s->plan, buf, sizeof buf);
        std::fprintf(stderr, "libprefill: session plan: %s\n", buf);
    }
    int32_t chunk = 0;
    if (o.chunk_tokens) chunk = std::min(o.chunk_tokens, max_tokens);
    else if (o.own_executor && !(like && like->exec)) {
        bool streaming = false;
        for (const pf_weight *w : m->weights) streaming = streaming || w->f16_stream;
        const size_t state = sequence_layout(m, max_tokens, o.kv_dtype, o.snapshot_slots, nullptr, nullptr);
        PF_TRY(auto_chunk(m->ctx, hp, max_tokens, state, streaming, &chunk));
    }
    PF_TRY(sequence_alloc(m, max_tokens, o.kv_dtype, o.snapshot_slots, &s->seq));
    s->seq.snap_every = o.snapshot_every;
    s->seq.snap_at_end = o.snapshot_at_end == 1;
    pf_status st = PF_STATUS_OK;
    if (like && like->exec) {
        s->exec = like->exec;
        ++s->exec->sharers;
    } else if (o.own_executor) {
        // One sequence, one item per step: a call's ids (at most max_tokens) back to back.
        Executor *e = nullptr;
        st = executor_create(m, s->plan, chunk, max_tokens, 1, max_tokens, &e);
        s->exec.reset(e);
    }
    if (st == PF_STATUS_OK && !like) st = session_reset(s.get());
    if (st != PF_STATUS_OK) {
        session_destroy(s.release());
        return st;
    }
    *out = s.release();
    return PF_STATUS_OK;
}

void session_destroy(pf_session *s) {
    if (!s) return;
    DeviceGuard dg(s->ctx->device);
    (void)cudaStreamSynchronize(s->ctx->stream);
    if (s->exec) --s->exec->sharers;
    s->exec.reset();
    sequence_free(s->ctx, s->seq);
    delete s;
}

pf_status session_reset(pf_session *s) {
    cudaStream_t st = s->ctx->stream;
    PF_TRY(sequence_zero(s->model, s->seq, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    s->seq.pos = 0;
    s->seq.broken = false;
    s->seq.last_token = -1;
    return PF_STATUS_OK;
}

// ---------------------------------------------------------------------------- prefill

pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                          float *logits, size_t logits_len, int32_t *out_token) {
    const Hparams &hp = s->model->hp;
    const int64_t V = hp.n_vocab;
    Sequence &q = s->seq;
    PF_CHECK_ARG(!q.broken, "pf_session_prefill: the session hit a device error earlier; call "
                            "pf_session_reset");
    PF_CHECK_ARG(n > 0, "pf_session_prefill: n_tokens=%d must be > 0", n);
    PF_CHECK_ARG(tokens != nullptr, "pf_session_prefill: tokens is NULL");
    PF_CHECK_ARG(mode >= PF_LOGITS_NONE && mode <= PF_LOGITS_ALL,
                 "pf_session_prefill: logits_mode=%d is not a pf_logits_mode", mode);
    PF_CHECK_ARG(q.pos + n <= q.max_tokens,
                 "pf_session_prefill: %d tokens at position %lld exceed the session's capacity of %d",
                 n, (long long)q.pos, q.max_tokens);
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
    if (!s->exec)
        return fail(PF_STATUS_UNSUPPORTED, "pf_session_prefill: the session has no executor of its own (created "
                                           "with own_executor = 0): run it in a pf_batch");
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    RunItem it;
    it.seq = &q;
    it.tokens = tokens;
    it.n = n;
    it.mode = mode;
    it.logits = logits;
    it.out_token = out_token;
    it.planned_pos = q.pos;
    RunPlan plan = run_plan(*s->exec, {it});
    return run_execute(s->exec.get(), plan);
}

// ---------------------------------------------------------------------------- state

namespace {
int32_t n_gdn_layers(const Sequence &q) {
    int32_t n = 0;
    for (const float *c : q.conv) n += c != nullptr;
    return n;
}

// What this session expects of a state (and writes into one).
StateLayout state_layout(const pf_session *s) {
    const Hparams &hp = s->model->hp;
    StateLayout l;
    l.fingerprint = s->model->fingerprint;
    l.kv_dtype = s->seq.kv_dtype;
    l.max_tokens = s->seq.max_tokens;
    l.n_attn = s->model->n_attn_layers;
    l.n_gdn = n_gdn_layers(s->seq);
    l.kv_dim = hp.kv_dim();
    l.conv_floats = (hp.conv_kernel - 1) * hp.conv_dim();
    l.ssm_floats = hp.ssm_hv * hp.ssm_dk * hp.ssm_dv;
    l.n_vocab = hp.n_vocab;
    return l;
}

// The device address of a span's data: K/V cache rows from 0, or the index-th GDN layer's
// conv window / recurrent state.
void *span_device(Sequence &q, const StateSpan &sp) {
    switch (sp.kind) {
        case StateSpan::K: return q.k_cache[size_t(sp.index)];
        case StateSpan::V: return q.v_cache[size_t(sp.index)];
        default: break;
    }
    int32_t k = 0;
    for (size_t il = 0; il < q.conv.size(); il++) {
        if (!q.conv[il]) continue;
        if (k++ == sp.index) return sp.kind == StateSpan::Conv ? static_cast<void *>(q.conv[il]) : q.ssm[il];
    }
    return nullptr;
}
}  // namespace

size_t session_state_size(const pf_session *s) { return state_bytes(state_layout(s), s->seq.pos); }

pf_status session_save(pf_session *s, void *dst, size_t bytes) {
    Sequence &q = s->seq;
    PF_CHECK_ARG(!q.broken, "pf_session_save: the session hit a device error earlier");
    const StateLayout l = state_layout(s);
    const size_t need = state_bytes(l, q.pos);
    PF_CHECK_ARG(dst != nullptr, "pf_session_save: dst is NULL");
    PF_CHECK_ARG(bytes >= need, "pf_session_save: bytes=%zu, the state needs %zu", bytes, need);
    const StateHeader h = state_header(l, q.pos, q.last_token);
    char *p = static_cast<char *>(dst);
    std::memcpy(p, &h, sizeof h);
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = s->ctx->stream;
    for (const StateSpan &sp : state_spans(l, q.pos))
        PF_CUDA_TRY(cudaMemcpyAsync(p + sp.offset, span_device(q, sp), sp.bytes, cudaMemcpyDeviceToHost, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    return PF_STATUS_OK;
}

pf_status session_restore(pf_session *s, const void *src, size_t bytes) {
    Sequence &q = s->seq;
    const StateLayout l = state_layout(s);
    StateHeader h;
    PF_TRY(state_check(src, bytes, l, &h));  // everything is checked before the session changes
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = s->ctx->stream;
    const char *p = static_cast<const char *>(src);
    q.broken = true;  // until every copy has landed
    for (const StateSpan &sp : state_spans(l, h.pos))
        PF_CUDA_TRY(cudaMemcpyAsync(span_device(q, sp), p + sp.offset, sp.bytes, cudaMemcpyHostToDevice, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    q.pos = h.pos;
    q.last_token = h.last_token;
    q.broken = false;
    q.snaps.clear();  // they belonged to the state before
    return PF_STATUS_OK;
}

pf_status session_copy(pf_session *dst, const pf_session *src) {
    const char *fn = "pf_session_copy";
    PF_CHECK_ARG(dst != src, "%s: dst and src are the same session", fn);
    PF_CHECK_ARG(dst->model == src->model, "%s: dst and src are sessions of different models", fn);
    PF_CHECK_ARG(dst->seq.kv_dtype == src->seq.kv_dtype, "%s: dst has kv_dtype=%d, src %d", fn, dst->seq.kv_dtype,
                 src->seq.kv_dtype);
    PF_CHECK_ARG(!src->seq.broken, "%s: src hit a device error earlier", fn);
    PF_CHECK_ARG(src->seq.pos <= dst->seq.max_tokens, "%s: src stands at position %lld, dst holds %d positions", fn,
                 (long long)src->seq.pos, dst->seq.max_tokens);
    DeviceGuard dg(src->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = src->ctx->stream;
    dst->seq.broken = true;  // until every copy has landed
    PF_TRY(sequence_copy(dst->seq, src->seq, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    dst->seq.broken = false;
    return PF_STATUS_OK;
}

pf_status session_rollback(pf_session *s, int64_t pos) {
    const char *fn = "pf_session_rollback";
    Sequence &q = s->seq;
    PF_CHECK_ARG(!q.broken, "%s: the session hit a device error earlier", fn);
    PF_CHECK_ARG(pos >= 0 && pos <= q.pos, "%s: pos=%lld must be in [0, %lld] (the session's position)", fn,
                 (long long)pos, (long long)q.pos);
    if (pos == q.pos) return PF_STATUS_OK;
    const bool recurrent = snapshot_bytes(s->model) > 0;
    auto drop_after = [&](int64_t p) {
        while (!q.snaps.empty() && q.snaps.back().pos > p) q.snaps.pop_back();
    };
    if (!recurrent) {  // the KV rows past pos are simply not read again
        drop_after(pos);
        q.pos = pos;
        q.last_token = -1;
        return PF_STATUS_OK;
    }
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    cudaStream_t st = s->ctx->stream;
    if (pos == 0) return session_reset(s);
    const Snapshot *hit = nullptr;
    for (const Snapshot &h : q.snaps)
        if (h.pos == pos) hit = &h;
    if (!hit) {
        const Snapshot *below = nullptr, *above = nullptr;
        for (const Snapshot &h : q.snaps) {
            if (h.pos < pos) below = &h;
            if (h.pos > pos && !above) above = &h;
        }
        char near[96] = "none held; position 0 (the zero state) always works";
        if (below || above)
            std::snprintf(near, sizeof near, "%s%lld%s%s%lld", below ? "below at " : "",
                          below ? (long long)below->pos : 0LL, below && above ? ", " : "", above ? "above at " : "",
                          above ? (long long)above->pos : 0LL);
        return fail(PF_STATUS_UNSUPPORTED,
                    "%s: no snapshot of the recurrent state at position %lld (the nearest: %s; %zu held, "
                    "pf_session_options.snapshot_every / snapshot_at_end keep them)", fn, (long long)pos, near,
                    q.snaps.size());
    }
    const char *src = q.snap_mem + size_t(hit->slot) * q.snap_bytes;
    const int32_t tok = hit->last_token;
    q.broken = true;  // until every copy has landed
    pf_status r = PF_STATUS_OK;
    for_each_recurrent(s->model, q, [&](void *conv, size_t cb, void *ssm, size_t sb) {
        if (r != PF_STATUS_OK) return;
        cudaError_t e = cudaMemcpyAsync(conv, src, cb, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(ssm, src + cb, sb, cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) r = cuda_fail(e, __FILE__, __LINE__, "rollback: cudaMemcpyAsync");
        src += cb + sb;
    });
    PF_TRY(r);
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    drop_after(pos);
    q.pos = pos;
    q.last_token = tok;
    q.broken = false;
    return PF_STATUS_OK;
}

}  // namespace pf
