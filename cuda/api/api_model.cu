// api_model.cu — the model-level C API: models and sessions. Validation, then delegation to
// runtime/ (model.cu, session.cu, batch.cu).
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "base/cuda_check.cuh"
#include "kernels/gemm/gemm.cuh"
#include "plan/defaults.h"
#include "plan/plan.h"
#include "runtime/batch.h"
#include "runtime/kv_pool.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace pf {
// The options a session adds to the model-level checks: the executor and the snapshots.
pf_status session_options_check(const pf_session_options &o, const char *fn) {
    PF_CHECK_ARG(o.own_executor == 0 || o.own_executor == 1, "%s: own_executor=%d must be 0 or 1", fn,
                 o.own_executor);
    PF_CHECK_ARG(o.snapshot_every >= 0 && o.snapshot_every % 64 == 0,
                 "%s: snapshot_every=%d must be 0 or a positive multiple of 64", fn, o.snapshot_every);
    PF_CHECK_ARG(o.snapshot_at_end == 0 || o.snapshot_at_end == 1, "%s: snapshot_at_end=%d must be 0 or 1", fn,
                 o.snapshot_at_end);
    PF_CHECK_ARG(o.snapshot_slots >= 0 && o.snapshot_slots <= 65536, "%s: snapshot_slots=%d must be in [0, 65536]",
                 fn, o.snapshot_slots);
    PF_CHECK_ARG(o.snapshot_slots > 0 || (o.snapshot_every == 0 && o.snapshot_at_end == 0),
                 "%s: snapshot_every=%d / snapshot_at_end=%d need snapshot_slots > 0", fn, o.snapshot_every,
                 o.snapshot_at_end);
    PF_CHECK_ARG(o.kv_paged == 0 || o.kv_paged == 1, "%s: kv_paged=%d must be 0 or 1", fn, o.kv_paged);
    return PF_STATUS_OK;
}

}  // namespace pf

extern "C" PF_API pf_status pf_model_options_init(pf_model_options *opts, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(pf::struct_init(opts, struct_size, "pf_model_options_init", "pf_model_options"));
        opts->prewarm = 1;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_model_load(pf_model **out, pf_context *ctx, const char *path,
                                         const pf_model_options *opts) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_model_load: out is NULL");
        *out = nullptr;
        PF_CHECK_ARG(path != nullptr, "pf_model_load: path is NULL");
        pf_model_options o;
        PF_TRY(pf_model_options_init(&o, sizeof o));
        if (opts) {
            PF_TRY(pf::struct_check(opts, "pf_model_load", "opts"));
            o = *opts;
        }
        PF_TRY(pf::leg_check(o.gemm_leg, true, "pf_model_load", "gemm_leg"));
        PF_TRY(pf::tuning_check(o.tuning, "pf_model_load"));
        PF_CHECK_ARG(ctx != nullptr, "pf_model_load: ctx is NULL");
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::model_load(ctx, path, o, out);
    });
}

extern "C" PF_API pf_status pf_model_inspect(const char *path, pf_model_info *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(path != nullptr, "pf_model_inspect: path is NULL");
        PF_CHECK_ARG(out != nullptr, "pf_model_inspect: out is NULL");
        return pf::model_inspect(path, out);
    });
}

extern "C" PF_API void pf_model_destroy(pf_model *model) {
    if (!model) return;
    pf::model_destroy(model);
}

extern "C" PF_API pf_status pf_model_info_get(const pf_model *model, pf_model_info *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(model != nullptr, "pf_model_info_get: model is NULL");
        PF_CHECK_ARG(out != nullptr, "pf_model_info_get: out is NULL");
        pf::model_info(model, out);
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_model_prewarm(pf_model *model, size_t headroom_bytes, int32_t *armed) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(model != nullptr, "pf_model_prewarm: model is NULL");
        PF_CHECK_ARG(armed != nullptr, "pf_model_prewarm: armed is NULL");
        pf::DeviceGuard dg(model->ctx->device);
        PF_TRY(dg.status());
        return pf::model_prewarm(model, headroom_bytes, armed);
    });
}

extern "C" PF_API pf_status pf_model_prewarm_report(const pf_model *model, pf_prewarm_report *report) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_model_prewarm_report";
        PF_CHECK_ARG(report != nullptr, "%s: report is NULL", fn);
        PF_TRY(pf::struct_check(report, fn, "report", "pf_prewarm_report_init"));
        PF_CHECK_ARG(model != nullptr, "%s: model is NULL", fn);
        if (model->prewarm_report.struct_size == 0) {
            PF_TRY(pf_prewarm_report_init(report, sizeof *report));
            std::snprintf(report->reason, sizeof report->reason, "not run");
            return PF_STATUS_OK;
        }
        *report = model->prewarm_report;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_model_weight(pf_model *model, const char *name, pf_weight **out) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_model_weight";
        PF_CHECK_ARG(out != nullptr, "%s: out is NULL", fn);
        *out = nullptr;
        PF_CHECK_ARG(name != nullptr, "%s: name is NULL", fn);
        PF_CHECK_ARG(model != nullptr, "%s: model is NULL", fn);
        for (size_t i = 0; i < model->weight_names.size(); ++i)
            if (model->weight_names[i] == name) {
                *out = model->weights[i];
                return PF_STATUS_OK;
            }
        return pf::fail(PF_STATUS_INVALID_ARGUMENT, "%s: the model has no matrix named '%s'", fn, name);
    });
}

extern "C" PF_API pf_status pf_model_kv_pool(pf_model *model, int32_t page_rows, int32_t n_pages,
                                             int32_t kv_dtype) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_model_kv_pool";
        PF_CHECK_ARG(page_rows > 0 && page_rows % pf::kKvPageGranule == 0,
                     "%s: page_rows=%d must be a positive multiple of %d", fn, (int)page_rows, pf::kKvPageGranule);
        PF_CHECK_ARG(n_pages >= 1 && int64_t(n_pages) * page_rows <= INT32_MAX,
                     "%s: n_pages=%d must be >= 1 with n_pages * page_rows < 2^31", fn, (int)n_pages);
        PF_CHECK_ARG(kv_dtype == PF_KV_F16 || kv_dtype == PF_KV_F32, "%s: kv_dtype=%d (0 = fp16, 1 = fp32)", fn,
                     (int)kv_dtype);
        PF_CHECK_ARG(model != nullptr, "%s: model is NULL", fn);
        if (model->n_attn_layers == 0)
            return pf::fail(PF_STATUS_UNSUPPORTED, "%s: the model has no attention layers", fn);
        int32_t users = 0;
        if (model->kv_pool) {
            std::lock_guard<std::mutex> lock(model->kv_pool->mu);
            users = model->kv_pool->users;
        }
        PF_CHECK_ARG(users == 0, "%s: the model's KV pool is in use by %d session(s): destroy them first", fn,
                     (int)users);
        pf::DeviceGuard dg(model->ctx->device);
        PF_TRY(dg.status());
        pf::KvPool *p = nullptr;
        if (model->kv_pool) {  // the old one goes first: both may not fit
            PF_CUDA_TRY(cudaStreamSynchronize(model->ctx->stream));
            pf::kv_pool_destroy(model->kv_pool);
            model->kv_pool = nullptr;
        }
        PF_TRY(pf::kv_pool_create(model, page_rows, n_pages, kv_dtype, &p));
        model->kv_pool = p;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_model_kv_pool_info(const pf_model *model, int32_t *n_pages, int32_t *n_free,
                                                  int32_t *page_rows, size_t *bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(model != nullptr, "pf_model_kv_pool_info: model is NULL");
        pf::KvPool *p = model->kv_pool;
        std::unique_lock<std::mutex> lock;
        if (p) lock = std::unique_lock<std::mutex>(p->mu);
        if (n_pages) *n_pages = p ? p->n_pages() : 0;
        if (n_free) *n_free = p ? p->ids.n_free() : 0;
        if (page_rows) *page_rows = p ? p->page_rows : 0;
        if (bytes) *bytes = p ? p->mem_bytes : 0;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_options_init(pf_session_options *opts, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(pf::struct_init(opts, struct_size, "pf_session_options_init", "pf_session_options"));
        opts->max_tokens = pf::kDefaultCapacity;
        opts->cuda_graphs = 1;
        opts->own_executor = 1;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_create(pf_session **out, pf_model *model,
                                             const pf_session_options *opts) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_session_create: out is NULL");
        *out = nullptr;
        pf_session_options o;
        PF_TRY(pf_session_options_init(&o, sizeof o));
        if (opts) {
            PF_TRY(pf::struct_check(opts, "pf_session_create", "opts"));
            o = *opts;
        }
        PF_CHECK_ARG(o.max_tokens > 0, "pf_session_create: max_tokens=%d must be > 0", o.max_tokens);
        PF_CHECK_ARG(o.chunk_tokens >= 0, "pf_session_create: chunk_tokens=%d must be >= 0 (0 = auto)", o.chunk_tokens);
        PF_CHECK_ARG(o.kv_dtype == PF_KV_F16 || o.kv_dtype == PF_KV_F32,
                     "pf_session_create: kv_dtype=%d (0 = fp16, 1 = fp32)", o.kv_dtype);
        PF_TRY(pf::leg_check(o.gemm_leg, true, "pf_session_create", "gemm_leg"));
        PF_CHECK_ARG(o.attn_path >= PF_ATTN_AUTO && o.attn_path <= PF_ATTN_FLASH,
                     "pf_session_create: attn_path=%d is not a pf_attn_path", o.attn_path);
        PF_CHECK_ARG(o.cuda_graphs == 0 || o.cuda_graphs == 1, "pf_session_create: cuda_graphs=%d must be 0 or 1",
                     o.cuda_graphs);
        PF_TRY(pf::tuning_check(o.tuning, "pf_session_create"));
        PF_TRY(pf::session_options_check(o, "pf_session_create"));
        PF_CHECK_ARG(model != nullptr, "pf_session_create: model is NULL");
        if (model->hp.context_length > 0)
            PF_CHECK_ARG(o.max_tokens <= model->hp.context_length,
                         "pf_session_create: max_tokens=%d exceeds the model's context_length %lld",
                         o.max_tokens, (long long)model->hp.context_length);
        pf::DeviceGuard dg(model->ctx->device);
        PF_TRY(dg.status());
        return pf::session_create(model, o, out);
    });
}

extern "C" PF_API void pf_session_destroy(pf_session *s) { pf::session_destroy(s); }

namespace {
// pf_session_prefill's checks against the session's state (named as that call: generate feeds
// its tokens through it one by one).
pf_status prefill_check(const pf_session *s, const int32_t *tokens, int32_t n, int32_t mode, const float *logits,
                        size_t logits_len) {
    const int64_t V = s->model->hp.n_vocab;
    const pf::Sequence &q = s->seq;
    PF_CHECK_ARG(!q.broken, "pf_session_prefill: the session hit a device error earlier; call "
                            "pf_session_reset");
    PF_CHECK_ARG(n > 0, "pf_session_prefill: n_tokens=%d must be > 0", n);
    PF_CHECK_ARG(tokens != nullptr, "pf_session_prefill: tokens is NULL");
    PF_CHECK_ARG(mode >= PF_LOGITS_NONE && mode <= PF_LOGITS_ALL,
                 "pf_session_prefill: logits_mode=%d is not a pf_logits_mode", mode);
    PF_CHECK_ARG(q.pos + n <= q.capacity,
                 "pf_session_prefill: %d tokens at position %lld exceed the session's capacity of %d",
                 n, (long long)q.pos, q.capacity);
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
        return pf::fail(PF_STATUS_UNSUPPORTED, "pf_session_prefill: the session has no executor of its own "
                                               "(created with own_executor = 0): run it in a pf_batch");
    return PF_STATUS_OK;
}
}  // namespace

extern "C" PF_API pf_status pf_session_prefill(pf_session *s, const int32_t *tokens, int32_t n_tokens,
                                              int32_t logits_mode, float *logits, size_t logits_len,
                                              int32_t *out_token) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_prefill: session is NULL");
        PF_TRY(prefill_check(s, tokens, n_tokens, logits_mode, logits, logits_len));
        return pf::session_prefill(s, tokens, n_tokens, logits_mode, logits, out_token);
    });
}

extern "C" PF_API pf_status pf_session_generate(pf_session *s, int32_t n, int32_t *out_tokens) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_generate: session is NULL");
        PF_CHECK_ARG(n > 0, "pf_session_generate: n=%d must be > 0", n);
        PF_CHECK_ARG(out_tokens != nullptr, "pf_session_generate: out_tokens is NULL");
        PF_CHECK_ARG(s->seq.last_token >= 0, "pf_session_generate: no prior prefill (nothing to continue from)");
        PF_CHECK_ARG(s->seq.pos + n <= s->seq.capacity,
                     "pf_session_generate: %d tokens at position %lld exceed the session's capacity of %d", n,
                     (long long)s->seq.pos, s->seq.capacity);
        for (int32_t i = 0; i < n; i++) {
            const int32_t feed = s->seq.last_token;
            PF_TRY(prefill_check(s, &feed, 1, PF_LOGITS_NONE, nullptr, 0));
            PF_TRY(pf::session_prefill(s, &feed, 1, PF_LOGITS_NONE, nullptr, &out_tokens[i]));
        }
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_position(const pf_session *s, int32_t *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_position: session is NULL");
        PF_CHECK_ARG(out != nullptr, "pf_session_position: out is NULL");
        *out = int32_t(s->seq.pos);
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_reset(pf_session *s) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_reset: session is NULL");
        pf::DeviceGuard dg(s->ctx->device);
        PF_TRY(dg.status());
        return pf::session_reset(s);
    });
}

extern "C" PF_API pf_status pf_session_state_size(const pf_session *s, size_t *out_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_state_size: session is NULL");
        PF_CHECK_ARG(out_bytes != nullptr, "pf_session_state_size: out_bytes is NULL");
        *out_bytes = pf::session_state_size(s);
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_save(pf_session *s, void *dst, size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_save: session is NULL");
        return pf::session_save(s, dst, bytes);
    });
}

extern "C" PF_API pf_status pf_session_restore(pf_session *s, const void *src, size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_restore: session is NULL");
        return pf::session_restore(s, src, bytes);
    });
}

extern "C" PF_API pf_status pf_session_copy(pf_session *dst, const pf_session *src) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(dst != nullptr, "pf_session_copy: dst is NULL");
        PF_CHECK_ARG(src != nullptr, "pf_session_copy: src is NULL");
        return pf::session_copy(dst, src);
    });
}

extern "C" PF_API pf_status pf_session_copy_prefix(pf_session *dst, const pf_session *src, int32_t pos) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(dst != nullptr, "pf_session_copy_prefix: dst is NULL");
        PF_CHECK_ARG(src != nullptr, "pf_session_copy_prefix: src is NULL");
        return pf::session_copy_prefix(dst, src, pos);
    });
}

extern "C" PF_API pf_status pf_session_fork(pf_session **out, const pf_session *src) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_session_fork: out is NULL");
        *out = nullptr;
        PF_CHECK_ARG(src != nullptr, "pf_session_fork: src is NULL");
        PF_CHECK_ARG(!src->seq.broken, "pf_session_fork: src hit a device error earlier");
        pf::DeviceGuard dg(src->ctx->device);
        PF_TRY(dg.status());
        pf_session *s = nullptr;
        PF_TRY(pf::session_create(src->model, src->opts, &s, src));
        const pf_status st = pf::session_copy(s, src);
        if (st != PF_STATUS_OK) {
            pf::session_destroy(s);
            return st;
        }
        *out = s;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_snapshots(const pf_session *s, int32_t *positions, int32_t capacity,
                                                int32_t *count, size_t *bytes_each) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_snapshots: session is NULL");
        PF_CHECK_ARG(capacity >= 0 && (positions != nullptr || capacity == 0),
                     "pf_session_snapshots: positions=%p with capacity=%d", (void *)positions, capacity);
        const auto &held = s->seq.snaps;
        for (size_t i = 0; i < held.size() && int32_t(i) < capacity; ++i) positions[i] = int32_t(held[i].pos);
        if (count) *count = int32_t(held.size());
        if (bytes_each) *bytes_each = s->seq.snap_bytes;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_session_rollback(pf_session *s, int32_t pos) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(s != nullptr, "pf_session_rollback: session is NULL");
        return pf::session_rollback(s, pos);
    });
}

extern "C" PF_API pf_status pf_batch_options_init(pf_batch_options *opts, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(pf::struct_init(opts, struct_size, "pf_batch_options_init", "pf_batch_options"));
        opts->max_items = 64;
        opts->cuda_graphs = 1;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_batch_create(pf_batch **out, pf_model *model, const pf_batch_options *opts) {
    return pf::guard(__func__, [&]() -> pf_status {
        const char *fn = "pf_batch_create";
        PF_CHECK_ARG(out != nullptr, "%s: out is NULL", fn);
        *out = nullptr;
        pf_batch_options o;
        PF_TRY(pf_batch_options_init(&o, sizeof o));
        if (opts) {
            PF_TRY(pf::struct_check(opts, fn, "opts", "pf_batch_options_init"));
            o = *opts;
        }
        PF_CHECK_ARG(o.max_items >= 1 && o.max_items <= 4096, "%s: max_items=%d must be in [1, 4096]", fn, o.max_items);
        PF_CHECK_ARG(o.step_tokens >= 0 && o.step_tokens <= (1 << 20), "%s: step_tokens=%d must be in [0, 2^20] "
                     "(0 = %d)", fn, o.step_tokens, int(pf::kDefaultStepRows));
        PF_CHECK_ARG(o.max_tokens >= 0 && o.max_context >= 0, "%s: max_tokens=%d / max_context=%d must be >= 0", fn,
                     o.max_tokens, o.max_context);
        PF_CHECK_ARG(o.kv_dtype == PF_KV_F16 || o.kv_dtype == PF_KV_F32, "%s: kv_dtype=%d (0 = fp16, 1 = fp32)", fn,
                     o.kv_dtype);
        PF_TRY(pf::leg_check(o.gemm_leg, true, fn, "gemm_leg"));
        PF_CHECK_ARG(o.attn_path >= PF_ATTN_AUTO && o.attn_path <= PF_ATTN_FLASH, "%s: attn_path=%d is not a "
                     "pf_attn_path", fn, o.attn_path);
        PF_CHECK_ARG(o.cuda_graphs == 0 || o.cuda_graphs == 1, "%s: cuda_graphs=%d must be 0 or 1", fn, o.cuda_graphs);
        PF_TRY(pf::tuning_check(o.tuning, fn));
        PF_CHECK_ARG(model != nullptr, "%s: model is NULL", fn);
        pf::DeviceGuard dg(model->ctx->device);
        PF_TRY(dg.status());
        return pf::batch_create(model, o, out);
    });
}

extern "C" PF_API void pf_batch_destroy(pf_batch *b) { pf::batch_destroy(b); }

extern "C" PF_API pf_status pf_batch_plan(pf_batch *b, const pf_batch_item *items, int32_t n_items) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(b != nullptr, "pf_batch_plan: batch is NULL");
        return pf::batch_plan(b, items, n_items);
    });
}

extern "C" PF_API pf_status pf_batch_run(pf_batch *b) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(b != nullptr, "pf_batch_run: batch is NULL");
        return pf::batch_run(b);
    });
}

extern "C" PF_API pf_status pf_batch_prefill(pf_batch *b, const pf_batch_item *items, int32_t n_items) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(b != nullptr, "pf_batch_prefill: batch is NULL");
        PF_TRY(pf::batch_plan(b, items, n_items));
        return pf::batch_run(b);
    });
}
