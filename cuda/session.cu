// session.cu — pf_session: creation (the sequence's state sized up front, the execution plan
// resolved, the session's executor), chunked prefill that continues from the position, greedy
// tokens, and the state save/restore format.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "cuda_check.cuh"
#include "executor.h"
#include "gdn.cuh"
#include "rows.cuh"
#include "session.h"
#include "session_state.h"

namespace pf {
namespace {

constexpr int32_t kDefaultMaxTokens = 4096;

size_t kv_elem(int32_t kv_dtype) { return state_kv_elem(kv_dtype); }

// Device bytes of a sequence's state: the KV caches and the GDN conv windows and states.
size_t sequence_bytes(const pf_model *m, int32_t max_tokens, int32_t kv_dtype) {
    const Hparams &hp = m->hp;
    const size_t kv_bytes = size_t(max_tokens) * size_t(hp.kv_dim()) * kv_elem(kv_dtype);
    return 2 * kv_bytes * size_t(m->n_attn_layers) +
           size_t(hp.n_layer - m->n_attn_layers) * 4 *
               size_t((hp.conv_kernel - 1) * hp.conv_dim() + hp.ssm_hv * hp.ssm_dk * hp.ssm_dv);
}

void sequence_free(pf_context *ctx, Sequence &q) {
    for (auto &a : q.allocs) device_free(ctx, a.first, a.second);
    q.allocs.clear();
}

// The state of one sequence of `max_tokens` positions: KV caches per attention layer, conv
// window and recurrent state per GDN layer. On failure nothing stays allocated.
pf_status sequence_alloc(const pf_model *m, int32_t max_tokens, int32_t kv_dtype, Sequence *q) {
    const Hparams &hp = m->hp;
    pf_context *ctx = m->ctx;
    q->max_tokens = max_tokens;
    q->kv_dtype = kv_dtype;
    q->k_cache.assign(size_t(m->n_attn_layers), nullptr);
    q->v_cache.assign(size_t(m->n_attn_layers), nullptr);
    q->conv.assign(size_t(hp.n_layer), nullptr);
    q->ssm.assign(size_t(hp.n_layer), nullptr);
    pf_status st = PF_STATUS_OK;
    auto A = [&](size_t bytes, void **p, const char *what) {
        if (st != PF_STATUS_OK) return;
        st = device_alloc(ctx, bytes, p, what);
        if (st == PF_STATUS_OK) q->allocs.emplace_back(*p, bytes);
    };
    const size_t kv_bytes = size_t(max_tokens) * size_t(hp.kv_dim()) * kv_elem(kv_dtype);
    for (int32_t i = 0; i < m->n_attn_layers; i++) {
        A(kv_bytes, &q->k_cache[size_t(i)], "KV cache K");
        A(kv_bytes, &q->v_cache[size_t(i)], "KV cache V");
    }
    for (int64_t il = 0; il < hp.n_layer; il++) {
        if (m->layers[size_t(il)].attn) continue;
        void *c = nullptr, *s = nullptr;
        A(size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4, &c, "conv window");
        A(size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4, &s, "recurrent state");
        q->conv[size_t(il)] = static_cast<float *>(c);
        q->ssm[size_t(il)] = static_cast<float *>(s);
    }
    if (st != PF_STATUS_OK) sequence_free(ctx, *q);
    return st;
}

// Zeroes a sequence's conv windows and recurrent states (the KV rows past pos are never read).
pf_status sequence_zero(const pf_model *m, Sequence &q, cudaStream_t st) {
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

// ---------------------------------------------------------------------------- lifecycle

pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out) {
    const Hparams &hp = m->hp;
    std::unique_ptr<pf_session> s(new pf_session());
    s->model = m;
    s->ctx = m->ctx;
    const int32_t max_tokens = o.max_tokens ? o.max_tokens : kDefaultMaxTokens;
    // The execution plan: the session's tuning over its model's over its context's, the options,
    // the device and the environment, resolved once.
    const pf_tuning t = tuning_over(o.tuning, tuning_over(m->tuning, m->ctx->tuning));
    s->plan = exec_plan(o.gemm_leg ? o.gemm_leg : m->gemm_leg, t, o.attn_path, o.kv_dtype, o.cuda_graphs == 1);
    if (log_enabled(kLogPlan)) {
        char buf[512];
        exec_plan_describe(s->plan, buf, sizeof buf);
        std::fprintf(stderr, "libprefill: session plan: %s\n", buf);
    }
    int32_t chunk = 0;
    if (o.chunk_tokens) chunk = std::min(o.chunk_tokens, max_tokens);
    else PF_TRY(auto_chunk(hp, max_tokens, sequence_bytes(m, max_tokens, o.kv_dtype), &chunk));
    PF_TRY(sequence_alloc(m, max_tokens, o.kv_dtype, &s->seq));
    Executor *e = nullptr;
    // One sequence: its ids at their positions (max_tokens of them), one item per step.
    pf_status st = executor_create(m, s->plan, chunk, max_tokens, 1, max_tokens, &e);
    s->exec.reset(e);
    if (st == PF_STATUS_OK) st = session_reset(s.get());
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
    DeviceGuard dg(s->ctx->device);
    PF_TRY(dg.status());
    Executor *e = s->exec.get();
    cudaStream_t st = s->ctx->stream;
    executor_begin(e);
    auto body = [&]() -> pf_status {
        // The call's tokens in one copy (a copy from pageable memory may wait for the stream:
        // once per call, not once per chunk), at their positions: a chunk's ids are then at
        // e->ids + its position, which the graphed embedding reads from the device.
        const int64_t pos_call = q.pos;
        PF_TRY(executor_upload_ids(e, tokens, n, pos_call));
        for (int64_t done = 0; done < n;) {
            const int64_t T = std::min<int64_t>(e->L.rows, n - done);
            PF_TRY(executor_step(e, {StepItem{&q, 0, T, q.pos}}, q.pos));
            const bool last_chunk = done + T == n;
            if (mode == PF_LOGITS_ALL) {
                for (int64_t r0 = 0; r0 < T; r0 += e->L.lm_rows) {
                    const int64_t rn = std::min<int64_t>(e->L.lm_rows, T - r0);
                    PF_TRY(executor_lm_head(e, r0, rn));
                    PF_CUDA_TRY(cudaMemcpyAsync(logits + size_t(done + r0) * size_t(V), e->logits,
                                                size_t(rn) * size_t(V) * 4, cudaMemcpyDeviceToHost, st));
                    if (last_chunk && r0 + rn == T) PF_TRY(argmax_rows(e->logits + (rn - 1) * V, 1, V, V, e->argmax, st));
                    PF_CUDA_TRY(cudaStreamSynchronize(st));  // e->logits is reused by the next pass
                }
            } else if (last_chunk) {
                PF_TRY(executor_lm_head(e, T - 1, 1));
                PF_TRY(argmax_rows(e->logits, 1, V, V, e->argmax, st));
                if (mode == PF_LOGITS_LAST)
                    PF_CUDA_TRY(cudaMemcpyAsync(logits, e->logits, size_t(V) * 4, cudaMemcpyDeviceToHost, st));
            }
            q.pos += T;
            done += T;
        }
        int32_t tok = -1;
        PF_CUDA_TRY(cudaMemcpyAsync(&tok, e->argmax, 4, cudaMemcpyDeviceToHost, st));
        PF_CUDA_TRY(cudaStreamSynchronize(st));
        q.last_token = tok;
        if (out_token) *out_token = tok;
        return PF_STATUS_OK;
    };
    const pf_status r = body();
    if (r != PF_STATUS_OK) q.broken = true;  // caches and states may be half-written
    return r;
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
    return PF_STATUS_OK;
}

}  // namespace pf
