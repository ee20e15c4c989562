// api_prefix.cu — the prefix cache's C API (issue 39): validation, then runtime/prefix_cache.cu.
#include <cstdio>

#include "base/cuda_check.cuh"
#include "runtime/batch.h"
#include "runtime/kv_pool.h"
#include "runtime/prefix_cache.h"
#include "runtime/sequence.h"
#include "runtime/session.h"

extern "C" PF_API pf_status pf_prefix_cache_options_init(pf_prefix_cache_options *opts, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(pf::struct_init(opts, struct_size, "pf_prefix_cache_options_init", "pf_prefix_cache_options"));
        opts->snapshot_every = -1;  // -1 / -1: the model's defaults (resolved in create)
        opts->snapshot_slots = -1;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_prefix_cache_create(pf_prefix_cache **out, pf_model *model,
                                                   const pf_prefix_cache_options *opts) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_prefix_cache_create";
        PF_CHECK_ARG(out != nullptr, "%s: out is NULL", fn);
        *out = nullptr;
        PF_CHECK_ARG(model != nullptr, "%s: model is NULL", fn);
        pf_prefix_cache_options o;
        PF_TRY(pf_prefix_cache_options_init(&o, sizeof o));
        if (opts) {
            PF_TRY(pf::struct_check(opts, fn, "opts", "pf_prefix_cache_options_init"));
            o = *opts;
        }
        const bool recurrent = pf::snapshot_bytes(model) > 0;
        if (o.snapshot_every == -1) o.snapshot_every = recurrent ? 1024 : 0;
        if (o.snapshot_slots == -1) o.snapshot_slots = recurrent ? 64 : 0;
        if (recurrent) {
            PF_CHECK_ARG(o.snapshot_every > 0 && o.snapshot_every % 64 == 0,
                         "%s: snapshot_every=%d must be a positive multiple of 64", fn, (int)o.snapshot_every);
            PF_CHECK_ARG(o.snapshot_slots >= 1 && o.snapshot_slots <= 65536,
                         "%s: snapshot_slots=%d must be in [1, 65536]", fn, (int)o.snapshot_slots);
        } else {
            PF_CHECK_ARG(o.snapshot_every == 0 && o.snapshot_slots == 0,
                         "%s: snapshot_every=%d / snapshot_slots=%d: the model has no recurrent state to snapshot "
                         "(both must be 0)", fn, (int)o.snapshot_every, (int)o.snapshot_slots);
        }
        PF_CHECK_ARG(o.device_bytes >= 0, "%s: device_bytes=%lld must be >= 0 (0 = the default)", fn,
                     (long long)o.device_bytes);
        PF_CHECK_ARG(o.host_bytes >= 0, "%s: host_bytes=%lld must be >= 0 (0 = no host tier)", fn,
                     (long long)o.host_bytes);
        pf::DeviceGuard dg(model->ctx->device);
        PF_TRY(dg.status());
        return pf::prefix_cache_create(model, o, out);
    });
}

extern "C" PF_API void pf_prefix_cache_destroy(pf_prefix_cache *c) { pf::prefix_cache_destroy(c); }

namespace {
// The checks of one prompt of a prefill through c (`what`: "" or "items[3]." naming the item).
pf_status request_check(const pf_prefix_cache *c, const pf_session *s, const int32_t *tokens, int32_t n,
                        int32_t mode, const float *logits, size_t logits_len, const char *fn, const char *what) {
    PF_CHECK_ARG(s != nullptr, "%s: %ssession is NULL", fn, what);
    PF_CHECK_ARG(s->model == c->model, "%s: %ssession is of another model than the cache", fn, what);
    PF_CHECK_ARG(s->seq.pool == c->pool, "%s: %ssession's KV rows are %s: the cache shares pages of the model's KV "
                 "pool with paged sessions (pf_session_options.kv_paged = 1)", fn, what,
                 s->seq.pool ? "in another pool" : "contiguous");
    PF_CHECK_ARG(n > 0, "%s: %sn_tokens=%d must be > 0", fn, what, (int)n);
    PF_CHECK_ARG(tokens != nullptr, "%s: %stokens is NULL", fn, what);
    PF_CHECK_ARG(n <= s->seq.capacity, "%s: %sn_tokens=%d exceeds the session's capacity of %d", fn, what, (int)n,
                 (int)s->seq.capacity);
    PF_CHECK_ARG(mode == PF_LOGITS_NONE || mode == PF_LOGITS_LAST,
                 "%s: %slogits_mode=%d must be PF_LOGITS_NONE or PF_LOGITS_LAST", fn, what, (int)mode);
    const int64_t V = c->model->hp.n_vocab;
    if (mode == PF_LOGITS_LAST) {
        PF_CHECK_ARG(logits != nullptr, "%s: %slogits is NULL", fn, what);
        PF_CHECK_ARG(logits_len >= size_t(V), "%s: %slogits_len=%zu, the mode needs %lld floats", fn, what,
                     logits_len, (long long)V);
    }
    for (int32_t i = 0; i < n; i++)
        PF_CHECK_ARG(tokens[i] >= 0 && tokens[i] < V, "%s: %stokens[%d]=%d is outside the vocabulary [0, %lld)", fn,
                     what, (int)i, (int)tokens[i], (long long)V);
    return PF_STATUS_OK;
}
}  // namespace

extern "C" PF_API pf_status pf_prefix_cache_prefill(pf_prefix_cache *c, pf_session *s, const int32_t *tokens,
                                                    int32_t n, int32_t mode, float *logits, size_t logits_len,
                                                    int32_t *out_token) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_prefix_cache_prefill";
        PF_CHECK_ARG(c != nullptr, "%s: cache is NULL", fn);
        PF_TRY(request_check(c, s, tokens, n, mode, logits, logits_len, fn, ""));
        if (!s->exec)
            return pf::fail(PF_STATUS_UNSUPPORTED, "%s: the session has no executor of its own (created with "
                            "own_executor = 0): pf_prefix_cache_prefill_batch runs such sessions", fn);
        return pf::prefix_cache_prefill(c, s, tokens, n, mode, logits, out_token);
    });
}

extern "C" PF_API pf_status pf_prefix_cache_prefill_batch(pf_prefix_cache *c, pf_batch *b,
                                                          const pf_batch_item *items, int32_t n) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_prefix_cache_prefill_batch";
        PF_CHECK_ARG(c != nullptr, "%s: cache is NULL", fn);
        PF_CHECK_ARG(b != nullptr, "%s: batch is NULL", fn);
        PF_CHECK_ARG(b->model == c->model, "%s: the batch is of another model than the cache", fn);
        PF_CHECK_ARG(items != nullptr && n >= 1, "%s: %d items (at least one, items not NULL)", fn, (int)n);
        for (int32_t i = 0; i < n; ++i) {
            const pf_batch_item &it = items[i];
            char what[32];
            std::snprintf(what, sizeof what, "items[%d].", (int)i);
            PF_TRY(request_check(c, it.session, it.tokens, it.n_tokens, it.logits_mode, it.logits, it.logits_len,
                                 fn, what));
            PF_CHECK_ARG(it.session->seq.kv_dtype == b->opts.kv_dtype, "%s: items[%d].session's kv_dtype=%d, the "
                         "batch's %d", fn, (int)i, (int)it.session->seq.kv_dtype, (int)b->opts.kv_dtype);
            PF_CHECK_ARG(it.session->seq.capacity <= b->opts.max_context, "%s: items[%d].session holds %d positions, "
                         "the batch's max_context is %d", fn, (int)i, (int)it.session->seq.capacity,
                         (int)b->opts.max_context);
            for (int32_t j = 0; j < i; ++j)
                PF_CHECK_ARG(items[j].session != it.session, "%s: items[%d] and items[%d] have the same session", fn,
                             (int)j, (int)i);
        }
        pf::DeviceGuard dg(c->ctx->device);
        PF_TRY(dg.status());
        return pf::prefix_cache_prefill_batch(c, b, items, n);
    });
}

extern "C" PF_API pf_status pf_prefix_cache_evict(pf_prefix_cache *c, int64_t target_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(c != nullptr, "pf_prefix_cache_evict: cache is NULL");
        PF_CHECK_ARG(target_bytes >= 0, "pf_prefix_cache_evict: target_bytes=%lld must be >= 0",
                     (long long)target_bytes);
        return pf::prefix_cache_evict(c, target_bytes);
    });
}

extern "C" PF_API pf_status pf_prefix_cache_clear(pf_prefix_cache *c) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(c != nullptr, "pf_prefix_cache_clear: cache is NULL");
        return pf::prefix_cache_clear(c);
    });
}

extern "C" PF_API pf_status pf_prefix_cache_stats_get(pf_prefix_cache *c, pf_prefix_cache_stats *out,
                                                      size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(c != nullptr, "pf_prefix_cache_stats_get: cache is NULL");
        PF_TRY(pf::struct_init(out, struct_size, "pf_prefix_cache_stats_get", "pf_prefix_cache_stats"));
        pf::prefix_cache_stats(c, out);
        return PF_STATUS_OK;
    });
}
