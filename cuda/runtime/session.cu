// session.cu — pf_session: creation (the sequence's state sized up front, the execution plan
// resolved, the session's executor), prefill that continues from the position (run.h), and the
// state: save / restore (plan/session_state.h's format), copy, rollback to a snapshot.
#include "runtime/session.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/cuda_check.cuh"
#include "plan/defaults.h"
#include "plan/session_state.h"
#include "runtime/kv_pool.h"
#include "runtime/project.h"
#include "runtime/run.h"

namespace pf {

// ---------------------------------------------------------------------------- lifecycle

pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out, const pf_session *like) {
    const Hparams &hp = m->hp;
    std::unique_ptr<pf_session> s(new pf_session());
    s->model = m;
    s->ref.reset(m->ctx);
    s->ctx = m->ctx;
    s->opts = o;
    const int32_t capacity = o.max_tokens;  // > 0: pf_session_create checked it
    KvPool *pool = nullptr;
    if (o.kv_paged == 1) {
        pool = m->kv_pool;
        PF_CHECK_ARG(pool != nullptr, "pf_session_create: kv_paged=1 but the model has no KV pool (make one with "
                     "pf_model_kv_pool first)");
        PF_CHECK_ARG(pool->kv_dtype == o.kv_dtype, "pf_session_create: kv_dtype=%d but the model's KV pool holds "
                     "kv_dtype=%d", (int)o.kv_dtype, (int)pool->kv_dtype);
    }
    // The execution plan: the session's tuning over its model's over its context's, the options,
    // the device and the environment, resolved once.
    s->plan = like ? like->plan : model_exec_plan(m, o.gemm_leg, o.tuning, o.attn_path, o.kv_dtype, o.cuda_graphs);
    if (log_enabled(kLogPlan) && !like) {
        char buf[512];
        exec_plan_describe(s->plan, buf, sizeof buf);
        std::fprintf(stderr, "libprefill: session plan: %s\n", buf);
    }
    int32_t step_rows = 0;
    if (o.chunk_tokens) step_rows = std::min(o.chunk_tokens, capacity);
    else if (o.own_executor && !(like && like->exec)) {
        bool streaming = false, blocks = false;
        for (const pf_weight *w : m->weights) {
            streaming = streaming || w->f16_stream;
            // A layer matrix the plan reads from its blocks (the LM head's last-token rows take the GEMV).
            ProjRoute r;
            if (w != m->output && w != m->tok_embd && step_route(s->plan, w, &r) == PF_STATUS_OK)
                blocks = blocks || r.weight == WeightForm::F16Blocks;
        }
        const size_t state = sequence_bytes(m, capacity, o.kv_dtype, o.snapshot_slots, pool);
        PF_TRY(auto_step_rows(m->ctx, hp, capacity, state, streaming, blocks ? kBlocksStepRows : kDefaultStepRows,
                              &step_rows));
    }
    PF_TRY(sequence_alloc(m, capacity, o.kv_dtype, o.snapshot_slots, &s->seq, pool));
    s->seq.snap_every = o.snapshot_every;
    s->seq.snap_at_end = o.snapshot_at_end == 1;
    pf_status st = PF_STATUS_OK;
    if (like && like->exec) {
        s->exec = like->exec;
        ++s->exec->sharers;
    } else if (o.own_executor) {
        // One sequence, one item per step: a call's ids (at most the capacity) back to back.
        Executor *e = nullptr;
        st = executor_create(m, s->plan, step_rows, capacity, 1, capacity, &e);
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
    sequence_pages_clear(s->seq);
    PF_TRY(sequence_zero(s->seq, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    s->seq.pos = 0;
    s->seq.broken = false;
    s->seq.last_token = -1;
    return PF_STATUS_OK;
}

// ---------------------------------------------------------------------------- prefill

pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode, float *logits,
                          int32_t *out_token) {
    Sequence &q = s->seq;
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
    l.max_tokens = s->seq.capacity;
    l.n_attn = s->model->n_attn_layers;
    l.n_gdn = n_gdn_layers(s->seq);
    l.kv_dim = hp.kv_dim();
    l.conv_floats = (hp.conv_kernel - 1) * hp.conv_dim();
    l.ssm_floats = hp.ssm_hv * hp.ssm_dk * hp.ssm_dv;
    l.n_vocab = hp.n_vocab;
    return l;
}

// The device address of a span's data: K/V cache rows from 0, or the index-th GDN layer's
// conv window / recurrent state (a paged sequence's K/V rows: for_each_piece).
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
// Calls f(device address, offset in the span, bytes) for each contiguous piece of a span: the
// span itself, or for a paged sequence's K/V rows one piece per page (rows [k P, min((k + 1) P,
// pos)) at pool page pages[k]). f returns a cudaError_t.
template <class F>
pf_status for_each_piece(Sequence &q, const StateSpan &sp, F &&f) {
    if (!q.pool || (sp.kind != StateSpan::K && sp.kind != StateSpan::V)) {
        PF_CUDA_TRY(f(span_device(q, sp), size_t(0), sp.bytes));
        return PF_STATUS_OK;
    }
    const size_t page = size_t(q.pool->page_rows) * q.pool->row_bytes();
    char *base = static_cast<char *>(span_device(q, sp));
    for (size_t k = 0; k * page < sp.bytes; ++k)
        PF_CUDA_TRY(f(base + size_t(q.pages[k]) * page, k * page, std::min(page, sp.bytes - k * page)));
    return PF_STATUS_OK;
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
        PF_TRY(for_each_piece(q, sp, [&](void *dev, size_t off, size_t n) {
            return cudaMemcpyAsync(p + sp.offset + off, dev, n, cudaMemcpyDeviceToHost, st);
        }));
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
    if (q.pool) {  // fresh pages for the state's positions
        sequence_pages_clear(q);
        q.pos = 0;
        PF_TRY(sequence_pages_reserve(q, h.pos, st));
    }
    for (const StateSpan &sp : state_spans(l, h.pos))
        PF_TRY(for_each_piece(q, sp, [&](void *dev, size_t off, size_t n) {
            return cudaMemcpyAsync(dev, p + sp.offset + off, n, cudaMemcpyHostToDevice, st);
        }));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    q.pos = h.pos;
    q.last_token = h.last_token;
    q.broken = false;
    q.snaps.clear();  // they belonged to the state before
    return PF_STATUS_OK;
}

namespace {

// The snapshot of q at pos, or UNSUPPORTED naming the nearest ones held (fn names the call).
pf_status snapshot_at(const Sequence &q, int64_t pos, const char *fn, const Snapshot **out) {
    *out = nullptr;
    for (const Snapshot &h : q.snaps)
        if (h.pos == pos) *out = &h;
    if (*out) return PF_STATUS_OK;
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

// pf_session_copy and pf_session_copy_prefix (fn): dst takes src's state as it stood at pos.
pf_status copy_at(pf_session *dst, const pf_session *src, int64_t pos, const char *fn) {
    PF_CHECK_ARG(dst != src, "%s: dst and src are the same session", fn);
    PF_CHECK_ARG(dst->model == src->model, "%s: dst and src are sessions of different models", fn);
    PF_CHECK_ARG(dst->seq.kv_dtype == src->seq.kv_dtype, "%s: dst has kv_dtype=%d, src %d", fn, dst->seq.kv_dtype,
                 src->seq.kv_dtype);
    PF_CHECK_ARG(!src->seq.broken, "%s: src hit a device error earlier", fn);
    if (dst->seq.pool != src->seq.pool)
        return fail(PF_STATUS_UNSUPPORTED,
                    "%s: the sessions' KV rows are of different kinds (src %s, dst %s): copy between paged "
                    "sessions of one model's pool or between contiguous ones",
                    fn, src->seq.pool ? "paged" : "contiguous", dst->seq.pool ? "paged" : "contiguous");
    PF_CHECK_ARG(pos >= 0 && pos <= src->seq.pos, "%s: pos=%lld must be in [0, %lld] (src's position)", fn,
                 (long long)pos, (long long)src->seq.pos);
    PF_CHECK_ARG(pos <= dst->seq.capacity, "%s: %lld positions to copy, dst holds %d positions", fn, (long long)pos,
                 dst->seq.capacity);
    DeviceGuard dg(src->ctx->device);
    PF_TRY(dg.status());
    if (pos == 0 && src->seq.pos > 0) return session_reset(dst);
    const Snapshot *hit = nullptr;  // the recurrent state at pos when it is not src's own
    if (pos != src->seq.pos && snapshot_bytes(src->model) > 0) PF_TRY(snapshot_at(src->seq, pos, fn, &hit));
    cudaStream_t st = src->ctx->stream;
    dst->seq.broken = true;  // until every copy has landed
    PF_TRY(sequence_copy_prefix(dst->seq, src->seq, pos, hit, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    dst->seq.broken = false;
    return PF_STATUS_OK;
}

}  // namespace

pf_status session_copy(pf_session *dst, const pf_session *src) {
    return copy_at(dst, src, src->seq.pos, "pf_session_copy");
}

pf_status session_copy_prefix(pf_session *dst, const pf_session *src, int64_t pos) {
    return copy_at(dst, src, pos, "pf_session_copy_prefix");
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
    if (!recurrent) {  // the KV rows past pos are simply not read again (paged: their pages go)
        PF_TRY(sequence_pages_truncate(q, pos));
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
    PF_TRY(snapshot_at(q, pos, fn, &hit));
    const int32_t tok = hit->last_token;
    q.broken = true;  // until every copy has landed
    PF_TRY(snapshot_restore(q, *hit, st));
    PF_CUDA_TRY(cudaStreamSynchronize(st));
    PF_TRY(sequence_pages_truncate(q, pos));
    drop_after(pos);
    q.pos = pos;
    q.last_token = tok;
    q.broken = false;
    return PF_STATUS_OK;
}

}  // namespace pf
