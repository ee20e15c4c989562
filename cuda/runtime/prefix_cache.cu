// prefix_cache.cu — see prefix_cache.h.
#include "runtime/prefix_cache.h"

#include <algorithm>

#include "base/cuda_check.cuh"
#include "runtime/batch.h"
#include "runtime/kv_pool.h"
#include "runtime/run.h"
#include "runtime/session.h"

namespace pf {
namespace {

using Held = pf_prefix_cache::Held;

char *slot_at(pf_prefix_cache *c, int32_t slot) { return c->slot_mem + size_t(slot) * c->snap_bytes; }

// Gives back the ids of the evictions whose copies are done (all of them, waiting, when `wait`):
// in stream order, so the first not done stops it.
pf_status reclaim(pf_prefix_cache *c, bool wait) {
    size_t done = 0;
    for (; done < c->held.size(); ++done) {
        const cudaEvent_t ev = c->held[done].done;
        if (wait) PF_CUDA_TRY(cudaEventSynchronize(ev));
        const cudaError_t q = cudaEventQuery(ev);
        if (q == cudaErrorNotReady) break;
        PF_CUDA_TRY(q);
    }
    if (!done) return PF_STATUS_OK;
    {
        std::lock_guard<std::mutex> lock(c->pool->mu);
        for (size_t i = 0; i < done; ++i) {
            for (int32_t id : c->held[i].pages) PF_TRY(c->pool->ids.unref(id, nullptr));
            for (int32_t id : c->held[i].slots) PF_TRY(c->slots.unref(id, nullptr));
        }
    }
    for (size_t i = 0; i < done; ++i)  // completed: kept for the next eviction (none made per call)
        if (c->held[i].done) c->spare_events.push_back(c->held[i].done);
    c->held.erase(c->held.begin(), c->held.begin() + std::ptrdiff_t(done));
    return PF_STATUS_OK;
}

// The copy stream waits for what the context's stream has queued so far (the wait takes the
// event's state when it is queued: the event may be recorded again at once).
pf_status copy_stream_after_ctx(pf_prefix_cache *c) {
    PF_CUDA_TRY(cudaEventRecord(c->ctx_mark, c->ctx->stream));
    PF_CUDA_TRY(cudaStreamWaitEvent(c->copy_stream, c->ctx_mark, 0));
    return PF_STATUS_OK;
}

// Queues the copies of an evict plan (device -> host, in the plan's order) on the copy stream,
// after the context's work; `held`, the moved ids evict_to held, go back (reclaim) once the
// copies' event has completed. A failure waits for what was queued, so that reclaim may give
// them back.
pf_status apply_evict(pf_prefix_cache *c, const EvictPlan &plan, Held held) {
    if (held.pages.empty() && held.slots.empty()) return PF_STATUS_OK;
    cudaError_t ce = cudaSuccess;
    if (!c->spare_events.empty()) {  // one a completed eviction left (re-recording it is allowed)
        held.done = c->spare_events.back();
        c->spare_events.pop_back();
    } else {
        ce = cudaEventCreateWithFlags(&held.done, cudaEventDisableTiming);
    }
    if (ce != cudaSuccess) {  // nothing queued: the ids go back now
        std::lock_guard<std::mutex> lock(c->pool->mu);
        for (int32_t id : held.pages) (void)c->pool->ids.unref(id, nullptr);
        for (int32_t id : held.slots) (void)c->slots.unref(id, nullptr);
        PF_CUDA_TRY(ce);
    }
    c->held.push_back(std::move(held));  // an unrecorded event counts as done
    cudaStream_t st = c->copy_stream;
    auto queue = [&]() -> pf_status {
        PF_TRY(copy_stream_after_ctx(c));
        for (const Move &m : plan.page_moves)
            PF_TRY(kv_pool_page_host(*c->pool, m.from, c->host_pages + size_t(m.to) * c->pool->page_bytes, true, st));
        for (const Move &m : plan.slot_moves)
            PF_CUDA_TRY(cudaMemcpyAsync(c->host_slots + size_t(m.to) * c->snap_bytes, slot_at(c, m.from),
                                        c->snap_bytes, cudaMemcpyDeviceToHost, st));
        PF_CUDA_TRY(cudaEventRecord(c->held.back().done, st));
        return PF_STATUS_OK;
    };
    const pf_status r = queue();
    if (r != PF_STATUS_OK) (void)cudaStreamSynchronize(st);
    return r;
}

// Queues a restore's copies (host -> device) on the copy stream, after the context's work and
// the earlier moves, and makes the context's stream wait for them.
pf_status apply_restore(pf_prefix_cache *c, const RestorePlan &plan) {
    if (plan.page_moves.empty() && plan.slot_moves.empty()) return PF_STATUS_OK;
    cudaStream_t st = c->copy_stream;
    PF_TRY(copy_stream_after_ctx(c));
    for (const Move &m : plan.page_moves)
        PF_TRY(kv_pool_page_host(*c->pool, m.to, c->host_pages + size_t(m.from) * c->pool->page_bytes, false, st));
    for (const Move &m : plan.slot_moves)
        PF_CUDA_TRY(cudaMemcpyAsync(slot_at(c, m.to), c->host_slots + size_t(m.from) * c->snap_bytes, c->snap_bytes,
                                    cudaMemcpyHostToDevice, st));
    PF_CUDA_TRY(cudaEventRecord(c->copy_mark, st));
    PF_CUDA_TRY(cudaStreamWaitEvent(c->ctx->stream, c->copy_mark, 0));
    return PF_STATUS_OK;
}

// Evicts down to target bytes (the tree under the pool's lock, the moved ids held in the same
// lock: no other user of the pool can take one before its copy has read it) and queues the
// plan's copies. *freed_any: the device bytes went down.
pf_status evict_to(pf_prefix_cache *c, int64_t target, bool *freed_any = nullptr) {
    EvictPlan plan;
    Held held;
    int64_t before = 0, after = 0;
    {
        std::lock_guard<std::mutex> lock(c->pool->mu);
        before = c->tree->stats().device_bytes;
        PF_TRY(c->tree->evict(target, &plan));
        after = c->tree->stats().device_bytes;
        for (const Move &m : plan.page_moves) {
            PF_TRY(c->pool->ids.hold(m.from));
            held.pages.push_back(m.from);
        }
        for (const Move &m : plan.slot_moves) {
            PF_TRY(c->slots.hold(m.from));
            held.slots.push_back(m.from);
        }
    }
    if (freed_any) *freed_any = after < before;
    return apply_evict(c, plan, std::move(held));
}

int64_t device_bytes(pf_prefix_cache *c) {
    std::lock_guard<std::mutex> lock(c->pool->mu);
    return c->tree->stats().device_bytes;
}

}  // namespace

pf_status prefix_cache_create(pf_model *m, const pf_prefix_cache_options &o, pf_prefix_cache **out) {
    *out = nullptr;
    KvPool *pool = m->kv_pool;
    PF_CHECK_ARG(pool != nullptr, "pf_prefix_cache_create: the model has no KV pool (make one with pf_model_kv_pool "
                 "first: the cache holds its pages)");
    std::unique_ptr<pf_prefix_cache> c(new pf_prefix_cache());
    c->model = m;
    c->ctx = m->ctx;
    c->ref.reset(m->ctx);
    c->snap_bytes = snapshot_bytes(m);
    const bool recurrent = c->snap_bytes > 0;
    c->snapshot_every = recurrent ? o.snapshot_every : 0;
    const int32_t n_slots = recurrent ? o.snapshot_slots : 0;
    PF_CHECK_ARG(!recurrent || n_slots >= 1, "pf_prefix_cache_create: snapshot_slots=%d: a qwen35 model's cache needs "
                 "at least one", (int)o.snapshot_slots);
    PF_TRY(c->slots.init(n_slots, "snapshot slot"));
    PrefixConfig cfg;
    cfg.page_rows = pool->page_rows;
    cfg.snapshot_every = c->snapshot_every;
    cfg.recurrent = recurrent;
    cfg.page_bytes = int64_t(pool->page_bytes);
    cfg.snapshot_bytes = int64_t(c->snap_bytes);
    cfg.device_budget = o.device_bytes ? o.device_bytes
                                       : int64_t(pool->mem_bytes / 2 + size_t(n_slots) * c->snap_bytes / 2);
    cfg.host_budget = o.host_bytes;
    cfg.n_vocab = m->hp.n_vocab;
    DeviceGuard dg(m->ctx->device);
    PF_TRY(dg.status());
    {
        std::lock_guard<std::mutex> lock(pool->mu);
        PF_TRY(PrefixTree::create(cfg, &pool->ids, recurrent ? &c->slots : nullptr, &c->tree));
    }
    c->pool = pool;
    auto undo = [&](pf_status r) {
        prefix_cache_destroy(c.release());
        return r;
    };
    {
        std::lock_guard<std::mutex> lock(pool->mu);
        ++pool->users;  // the pool stays while the cache holds its pages
    }
    if (n_slots) {
        c->slot_mem_bytes = size_t(n_slots) * c->snap_bytes;
        void *p = nullptr;
        const pf_status r = device_alloc(m->ctx, c->slot_mem_bytes, &p, "prefix cache: snapshot slots");
        if (r != PF_STATUS_OK) {
            c->slot_mem_bytes = 0;
            return undo(r);
        }
        c->slot_mem = static_cast<char *>(p);
    }
    // The host tier: every id the tree may hand out, pinned now (a move must not fail halfway
    // through a plan the tree has already made).
    const size_t hp = size_t(c->tree->host_page_pool().capacity()) * pool->page_bytes,
                 hs = size_t(c->tree->host_slot_pool().capacity()) * c->snap_bytes;
    for (int k = 0; k < 2; ++k) {
        const size_t bytes = k ? hs : hp;
        if (!bytes) continue;
        void *p = nullptr;
        const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return undo(fail(PF_STATUS_OUT_OF_MEMORY, "pf_prefix_cache_create: host_bytes=%lld: %zu bytes of pinned "
                             "host memory for the %s: %s", (long long)o.host_bytes, bytes,
                             k ? "snapshots" : "pages", cudaGetErrorString(e)));
        }
        (k ? c->host_slots : c->host_pages) = static_cast<char *>(p);
        c->pinned_bytes += bytes;
    }
    if (c->pinned_bytes) {  // the host tier's stream and the two events that order it with the context's
        cudaError_t e = cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ctx_mark, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->copy_mark, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return undo(fail(PF_STATUS_CUDA_ERROR, "pf_prefix_cache_create: the host tier's copy stream: %s",
                             cudaGetErrorString(e)));
        }
    }
    *out = c.release();
    return PF_STATUS_OK;
}

void prefix_cache_destroy(pf_prefix_cache *c) {
    if (!c) return;
    DeviceGuard dg(c->ctx->device);
    (void)cudaStreamSynchronize(c->ctx->stream);  // every copy from or into the memory below
    if (c->copy_stream) (void)cudaStreamSynchronize(c->copy_stream);
    if (c->pool) (void)reclaim(c, true);          // the ids held for the last moves
    for (const Held &h : c->held)                 // left by a failed reclaim
        if (h.done) (void)cudaEventDestroy(h.done);
    for (cudaEvent_t ev : c->spare_events) (void)cudaEventDestroy(ev);
    if (c->ctx_mark) (void)cudaEventDestroy(c->ctx_mark);
    if (c->copy_mark) (void)cudaEventDestroy(c->copy_mark);
    if (c->copy_stream) (void)cudaStreamDestroy(c->copy_stream);
    if (c->pool) {
        std::lock_guard<std::mutex> lock(c->pool->mu);
        c->tree.reset();  // drops the tree's page references
        --c->pool->users;
    }
    c->tree.reset();
    if (c->slot_mem) device_free(c->ctx, c->slot_mem, c->slot_mem_bytes);
    if (c->host_pages) (void)cudaFreeHost(c->host_pages);
    if (c->host_slots) (void)cudaFreeHost(c->host_slots);
    delete c;
}

namespace {

// Takes a device slot for a snapshot: a free one, or one an eviction frees; -1 when none can be
// had (the snapshot is skipped).
int32_t take_slot(pf_prefix_cache *c, pf_status *err) {
    int32_t id = -1;
    *err = PF_STATUS_OK;
    for (int tries = 0; tries < 4; ++tries) {
        if (c->slots.alloc(&id) == PF_STATUS_OK) return id;
        if (!c->held.empty()) {  // slots an eviction's copies still read: wait for them first
            *err = reclaim(c, true);
            if (*err != PF_STATUS_OK) break;
            continue;
        }
        bool freed = false;
        *err = evict_to(c, std::max<int64_t>(0, device_bytes(c) - int64_t(c->snap_bytes)), &freed);
        if (*err != PF_STATUS_OK || !freed) break;
    }
    return -1;
}

// One prompt of a call: its session, what the tree gave it and what it runs.
struct Req {
    pf_session *s = nullptr;
    const int32_t *tokens = nullptr;
    int64_t n = 0;
    int32_t mode = PF_LOGITS_NONE;
    float *logits = nullptr;
    int32_t *out_token = nullptr;
    PrefixHit hit;
    bool leased = false;
    std::vector<int64_t> plan;        // the tree's snapshot plan, ascending (its steps end there)
    std::vector<SnapshotRef> snaps;   // the slots this call took (one reference each)
};

// Keeps req's snapshot due at seq's position (in the plan, not yet kept) in a slot.
pf_status keep_snapshot(pf_prefix_cache *c, Req &r, Sequence &seq, cudaStream_t st) {
    if (!std::binary_search(r.plan.begin(), r.plan.end(), seq.pos)) return PF_STATUS_OK;
    if (!r.snaps.empty() && r.snaps.back().pos == seq.pos) return PF_STATUS_OK;
    pf_status err = PF_STATUS_OK;
    const int32_t slot = take_slot(c, &err);
    PF_TRY(err);
    if (slot < 0) {
        ++c->skipped;
        return PF_STATUS_OK;
    }
    r.snaps.push_back(SnapshotRef{seq.pos, slot});  // before the copy: a failure still gives it back
    return snapshot_copy_slot(seq, slot_at(c, slot), true, st);
}

// Looks req up, brings a host-tier hit back, attaches the hit to its session (pages of [0, R)
// shared, the recurrent state the snapshot's at R) and takes the tree's snapshot plan.
pf_status attach(pf_prefix_cache *c, Req &r) {
    KvPool &pool = *c->pool;
    Sequence &q = r.s->seq;
    cudaStream_t st = c->ctx->stream;
    {
        std::lock_guard<std::mutex> lock(pool.mu);  // short of the last token: its logits are not kept
        PF_TRY(c->tree->lookup(r.tokens, r.n, r.n - 1, &r.hit));
    }
    r.leased = true;
    if (r.hit.needs_restore()) {  // host-tier pages or snapshot back on the device first
        RestorePlan rp;
        pf_status e = PF_STATUS_OK;
        for (int tries = 0; tries < 2; ++tries) {
            {
                std::lock_guard<std::mutex> lock(pool.mu);
                e = c->tree->restore(&r.hit, &rp);
            }
            if (e != PF_STATUS_OUT_OF_MEMORY) break;
            if (!c->held.empty()) {  // pages an eviction's copies still read: wait for them first
                PF_TRY(reclaim(c, true));
                continue;
            }
            const int64_t need = int64_t(r.hit.pages.size()) * int64_t(pool.page_bytes) + int64_t(c->snap_bytes);
            PF_TRY(evict_to(c, std::max<int64_t>(0, device_bytes(c) - need)));
        }
        PF_TRY(e);
        PF_TRY(apply_restore(c, rp));
    }
    const int64_t R = r.hit.resume;
    sequence_pages_clear(q);
    q.snaps.clear();
    q.pos = 0;
    if (R > 0) {
        std::lock_guard<std::mutex> lock(pool.mu);
        const std::vector<int32_t> ids(r.hit.pages.begin(), r.hit.pages.begin() + pages_for(R, pool.page_rows));
        PF_TRY(page_table_share(pool.ids, ids, R, pool.page_rows, &q.pages));
    }
    q.broken = true;  // until the state below is in place
    PF_TRY(r.hit.snapshot >= 0 ? snapshot_copy_slot(q, slot_at(c, r.hit.snapshot), false, st) : sequence_zero(q, st));
    q.broken = false;
    q.pos = R;
    q.last_token = -1;
    {
        std::lock_guard<std::mutex> lock(pool.mu);
        PF_TRY(c->tree->snapshot_plan(r.tokens, r.n, R, &r.plan));
    }
    return PF_STATUS_OK;
}

// Serves reqs (distinct sessions, checked) on executor e in runs of at most max_items items and
// max_tokens tokens: the ids of finished moves given back, every request attached, then each
// request's tokens from its resume point in one call (its steps end at the tree's snapshot
// plan: past the re-run rule's point, the end and the multiples of N that keep the snapshots
// within N), the calls of many requests run together and cut only where the executor's limits
// or the plans make them, then the inserts (in order) and an eviction back to the budget (its
// copies on the copy stream). On failure every request's session is left reset and the tree as
// it was, less what it evicted.
pf_status serve(pf_prefix_cache *c, Executor *e, std::vector<Req> &reqs, int64_t max_items, int64_t max_tokens) {
    KvPool &pool = *c->pool;
    cudaStream_t st = c->ctx->stream;
    auto release = [&]() {  // the leases and the slot references of this call
        std::lock_guard<std::mutex> lock(pool.mu);
        for (Req &r : reqs) {
            if (r.leased) (void)c->tree->lease_release(r.hit.lease, nullptr);
            r.leased = false;
            for (const SnapshotRef &h : r.snaps) (void)c->slots.unref(h.slot, nullptr);
            r.snaps.clear();
        }
    };
    auto body = [&]() -> pf_status {
        PF_TRY(reclaim(c, false));
        for (Req &r : reqs) PF_TRY(attach(c, r));
        // at most this many tokens of one request per run, whole 64-row chunks when cut
        const int64_t cap = std::max<int64_t>(64, max_tokens / 64 * 64);
        for (;;) {
            std::vector<Req *> round;
            for (Req &r : reqs)
                if (r.s->seq.pos < r.n) round.push_back(&r);
            if (round.empty()) break;
            for (size_t i0 = 0; i0 < round.size();) {  // runs within the executor's limits
                std::vector<RunItem> items;
                std::vector<Req *> who;
                int64_t tokens = 0;
                for (; i0 < round.size() && int64_t(items.size()) < max_items; ++i0) {
                    Req &r = *round[i0];
                    Sequence &q = r.s->seq;
                    const int64_t end = std::min(r.n, q.pos + cap);
                    if (!items.empty() && tokens + (end - q.pos) > max_tokens) break;
                    const bool last = end == r.n;
                    RunItem it;
                    it.seq = &q;
                    it.tokens = r.tokens + q.pos;
                    it.n = end - q.pos;
                    it.mode = last ? r.mode : PF_LOGITS_NONE;
                    it.logits = last ? r.logits : nullptr;
                    it.out_token = last ? r.out_token : nullptr;
                    it.planned_pos = q.pos;
                    if (!r.plan.empty()) {  // the steps end at the snapshot plan's positions
                        it.cuts = r.plan;
                        it.at_cut = [c, &r](Sequence &seq, cudaStream_t s) { return keep_snapshot(c, r, seq, s); };
                    }
                    tokens += it.n;
                    items.push_back(std::move(it));
                    who.push_back(&r);
                }
                for (;;) {
                    RunPlan rp = run_plan(*e, items);
                    const pf_status res = run_execute(e, rp);
                    if (res == PF_STATUS_OUT_OF_MEMORY && !who[0]->s->seq.broken) {
                        // the pool was short and nothing ran: the pages held for the last
                        // moves come back, else cached pages leave the device for the run's
                        // pages (each round takes the tree's bytes lower)
                        if (!c->held.empty()) {
                            PF_TRY(reclaim(c, true));
                            continue;
                        }
                        const int64_t need = (tokens / pool.page_rows + 2 * int64_t(items.size())) *
                                             int64_t(pool.page_bytes);
                        bool freed = false;
                        PF_TRY(evict_to(c, std::max<int64_t>(0, device_bytes(c) - need), &freed));
                        if (freed) continue;
                    }
                    PF_TRY(res);
                    break;
                }
            }
        }
        // Into the tree: each prompt's pages and snapshots (the tree takes its own references).
        for (Req &r : reqs) {
            InsertResult ins;
            std::lock_guard<std::mutex> lock(pool.mu);
            Sequence &q = r.s->seq;
            // own_from R: the session computed [R, n) itself (the tree's re-run rule keeps its
            // versions of the pages from R's on and none of its states at or below the point
            // where it left the tree)
            PF_TRY(c->tree->insert(r.tokens, r.n, q.pages.data(), int64_t(q.pages.size()), r.snaps.data(),
                                   int64_t(r.snaps.size()), &ins, r.hit.resume));
        }
        return PF_STATUS_OK;
    };
    const pf_status res = body();
    release();
    if (res != PF_STATUS_OK) {  // the sessions back at position 0
        for (Req &r : reqs) {
            Sequence &q = r.s->seq;
            sequence_pages_clear(q);
            q.broken = sequence_zero(q, st) != PF_STATUS_OK || cudaStreamSynchronize(st) != cudaSuccess;
            q.pos = 0;
            q.last_token = -1;
        }
        return res;
    }
    for (const Req &r : reqs) {
        ++c->requests;
        c->prefilled += r.n - r.hit.resume;
    }
    // Back within the budget. The copies of the moves to the host tier are queued behind the run
    // (whose outputs are on the host already) and not waited for: the next use of a freed page
    // comes after them on the stream.
    return evict_to(c, c->tree->config().device_budget);
}

Req make_req(pf_session *s, const int32_t *tokens, int64_t n, int32_t mode, float *logits, int32_t *out_token) {
    Req r;
    r.s = s;
    r.tokens = tokens;
    r.n = n;
    r.mode = mode;
    r.logits = logits;
    r.out_token = out_token;
    return r;
}

}  // namespace

pf_status prefix_cache_prefill(pf_prefix_cache *c, pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                               float *logits, int32_t *out_token) {
    std::lock_guard<std::mutex> guard(c->mu);
    DeviceGuard dg(c->ctx->device);
    PF_TRY(dg.status());
    std::vector<Req> reqs{make_req(s, tokens, n, mode, logits, out_token)};
    return serve(c, s->exec.get(), reqs, 1, int64_t(1) << 40);  // one item: each call whole
}

pf_status prefix_cache_prefill_batch(pf_prefix_cache *c, pf_batch *b, const pf_batch_item *items, int32_t n) {
    std::lock_guard<std::mutex> guard(c->mu);
    DeviceGuard dg(c->ctx->device);
    PF_TRY(dg.status());
    // A prefix that two prompts share beyond what the tree holds (64 tokens or more past it) is
    // served first, as a request of its own in one of their sessions, so that it is computed
    // once; then every prompt together.
    for (int32_t rounds = 0; rounds < n; ++rounds) {  // bounded: an insert the budget evicts at once
        int64_t best = 0;
        int32_t who = -1;
        {
            std::lock_guard<std::mutex> lock(c->pool->mu);
            for (int32_t i = 0; i < n; ++i)
                for (int32_t j = i + 1; j < n; ++j) {
                    const int64_t lim = std::min(items[i].n_tokens, items[j].n_tokens);
                    int64_t m = 0;
                    while (m < lim && items[i].tokens[m] == items[j].tokens[m]) ++m;
                    // the tree's match of that prefix (the last token is never matched)
                    const int64_t held = c->tree->held_prefix(items[i].tokens, m);
                    if (m > best && m >= held + 64 + 1) {
                        best = m;
                        who = i;
                    }
                }
        }
        if (who < 0) break;
        std::vector<Req> first{make_req(items[who].session, items[who].tokens, best, PF_LOGITS_NONE, nullptr,
                                        nullptr)};
        PF_TRY(serve(c, b->exec.get(), first, 1, b->opts.max_tokens));
    }
    std::vector<Req> reqs;
    for (int32_t i = 0; i < n; ++i)
        reqs.push_back(make_req(items[i].session, items[i].tokens, items[i].n_tokens, items[i].logits_mode,
                                items[i].logits, items[i].out_token));
    return serve(c, b->exec.get(), reqs, b->opts.max_items, b->opts.max_tokens);
}

pf_status prefix_cache_evict(pf_prefix_cache *c, int64_t target) {
    std::lock_guard<std::mutex> guard(c->mu);
    DeviceGuard dg(c->ctx->device);
    PF_TRY(dg.status());
    PF_TRY(evict_to(c, target));
    PF_CUDA_TRY(cudaStreamSynchronize(c->ctx->stream));
    PF_TRY(reclaim(c, true));  // the moves done: the pool's pages back when they are free
    return PF_STATUS_OK;
}

pf_status prefix_cache_clear(pf_prefix_cache *c) {
    std::lock_guard<std::mutex> guard(c->mu);
    DeviceGuard dg(c->ctx->device);
    PF_TRY(dg.status());
    PF_TRY(reclaim(c, true));  // the ids held for the last moves
    EvictPlan plan;
    std::lock_guard<std::mutex> lock(c->pool->mu);
    return c->tree->clear(&plan);
}

void prefix_cache_stats(pf_prefix_cache *c, pf_prefix_cache_stats *out) {
    std::lock_guard<std::mutex> guard(c->mu);
    PrefixStats t;
    {
        std::lock_guard<std::mutex> lock(c->pool->mu);
        t = c->tree->stats();
    }
    out->requests = c->requests;
    out->prompt_tokens = t.prompt_tokens;
    out->matched_tokens = t.matched_tokens;
    out->served_tokens = t.served_tokens;
    out->rerun_tokens = t.rerun_tokens;
    out->prefilled_tokens = c->prefilled;
    out->nodes = t.nodes;
    out->device_pages = t.device_pages;
    out->device_snapshots = t.device_snapshots;
    out->device_bytes = t.device_bytes;
    out->host_pages = t.host_pages;
    out->host_snapshots = t.host_snapshots;
    out->host_bytes = t.host_bytes;
    out->evicted_pages = t.evicted_pages;
    out->evicted_snapshots = t.evicted_snapshots;
    out->offloaded_pages = t.offloaded_pages;
    out->offloaded_snapshots = t.offloaded_snapshots;
    out->restored_pages = t.restored_pages;
    out->restored_snapshots = t.restored_snapshots;
    out->snapshots_skipped = c->skipped;
    out->pinned_bytes = int64_t(c->pinned_bytes);
}

}  // namespace pf
