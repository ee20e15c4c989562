// sequence.cu — see sequence.h.
#include "runtime/sequence.h"

#include <atomic>

#include "base/cuda_check.cuh"
#include "plan/session_state.h"  // state_kv_elem
#include "runtime/kv_pool.h"

namespace pf {
namespace {

// The layout of a sequence's state in its one allocation (256-byte aligned pieces, in this
// order): the K and V rows per attention layer (paged: the page table's device copy instead,
// the views then the pool's arrays), the conv window and recurrent state per GDN layer, the
// snapshot slots. Returns the bytes; with q, also points q's views into `base`.
size_t sequence_layout(const pf_model *m, int32_t capacity, int32_t kv_dtype, int32_t snap_slots,
                       const KvPool *pool, char *base, Sequence *q) {
    const Hparams &hp = m->hp;
    size_t at = 0;
    auto take = [&](size_t bytes) {
        char *p = base ? base + at : nullptr;
        at += (bytes + 255) & ~size_t(255);
        return p;
    };
    if (pool) {
        int32_t *table = reinterpret_cast<int32_t *>(take(size_t(pages_for(capacity, pool->page_rows)) * 4));
        if (q) {
            q->table = table;
            q->k_cache = pool->k;
            q->v_cache = pool->v;
        }
    } else {
        const size_t kv_bytes = size_t(capacity) * size_t(hp.kv_dim()) * state_kv_elem(kv_dtype);
        for (int32_t i = 0; i < m->n_attn_layers; i++) {
            void *k = take(kv_bytes), *v = take(kv_bytes);
            if (q) {
                q->k_cache[size_t(i)] = k;
                q->v_cache[size_t(i)] = v;
            }
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

// q's recurrent state as one span when its layers' conv windows and states lie back to back in
// the sequence's allocation in layer order (sequence_layout puts them so; the 256-byte alignment
// leaves no gap when their sizes are multiples of 256, as in every Qwen3.5 shape): then it has
// the layout of a snapshot slot, and one copy moves it (the copies layer by layer cost ~5 us a
// launch: 48 of them were most of a fork's 0.34 ms at qwen35-4b, session 42 call E). nullptr when
// there is a gap or no recurrent state.
char *recurrent_span(const Sequence &q, size_t *bytes) {
    char *start = nullptr, *next = nullptr;
    bool whole = true;
    for_each_recurrent(q, [&](void *conv, size_t cb, void *ssm, size_t sb) {
        if (!start) start = next = static_cast<char *>(conv);
        whole = whole && conv == next && static_cast<char *>(conv) + cb == ssm;
        next = static_cast<char *>(ssm) + sb;
    });
    *bytes = size_t(next - start);
    return whole ? start : nullptr;
}

// Copies between a snapshot slot and q's recurrent state, layer by layer (conv window, then
// state), or as one span (recurrent_span): into the slot (to_slot) or back. `what` names the
// copy in a failure.
pf_status snapshot_copy(Sequence &q, char *slot, bool to_slot, cudaStream_t st, const char *what) {
    size_t bytes = 0;
    char *span = recurrent_span(q, &bytes);
    if (span && bytes == q.snap_bytes) {
        const cudaError_t e = to_slot ? cudaMemcpyAsync(slot, span, bytes, cudaMemcpyDeviceToDevice, st)
                                      : cudaMemcpyAsync(span, slot, bytes, cudaMemcpyDeviceToDevice, st);
        return e == cudaSuccess ? PF_STATUS_OK : cuda_fail(e, __FILE__, __LINE__, what);
    }
    pf_status r = PF_STATUS_OK;
    for_each_recurrent(q, [&](void *conv, size_t cb, void *ssm, size_t sb) {
        if (r != PF_STATUS_OK) return;
        cudaError_t e = to_slot ? cudaMemcpyAsync(slot, conv, cb, cudaMemcpyDeviceToDevice, st)
                                : cudaMemcpyAsync(conv, slot, cb, cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess)
            e = to_slot ? cudaMemcpyAsync(slot + cb, ssm, sb, cudaMemcpyDeviceToDevice, st)
                        : cudaMemcpyAsync(ssm, slot + cb, sb, cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) r = cuda_fail(e, __FILE__, __LINE__, what);
        slot += cb + sb;
    });
    return r;
}

}  // namespace

size_t sequence_bytes(const pf_model *m, int32_t capacity, int32_t kv_dtype, int32_t snap_slots, const KvPool *pool) {
    return sequence_layout(m, capacity, kv_dtype, snapshot_bytes(m) ? snap_slots : 0, pool, nullptr, nullptr);
}

pf_status sequence_alloc(const pf_model *m, int32_t capacity, int32_t kv_dtype, int32_t snap_slots, Sequence *q,
                         KvPool *pool) {
    const Hparams &hp = m->hp;
    pf_context *ctx = m->ctx;
    static std::atomic<uint64_t> next_id{1};
    q->model = m;
    q->id = next_id++;
    q->capacity = capacity;
    q->kv_dtype = kv_dtype;
    q->k_cache.assign(size_t(m->n_attn_layers), nullptr);
    q->v_cache.assign(size_t(m->n_attn_layers), nullptr);
    q->conv.assign(size_t(hp.n_layer), nullptr);
    q->ssm.assign(size_t(hp.n_layer), nullptr);
    q->snap_bytes = snapshot_bytes(m);
    q->snap_slots = q->snap_bytes ? snap_slots : 0;
    q->pool = nullptr;  // set once the allocation stands (sequence_free gives the use back)
    q->pages.clear();
    const size_t bytes = sequence_layout(m, capacity, kv_dtype, q->snap_slots, pool, nullptr, nullptr);
    void *mem = nullptr;
    PF_TRY(device_alloc_pooled(ctx, bytes, &mem, "session state (KV caches, recurrent states, snapshots)"));
    q->mem = mem;
    q->mem_bytes = bytes;
    sequence_layout(m, capacity, kv_dtype, q->snap_slots, pool, static_cast<char *>(mem), q);
    if (pool) {
        std::lock_guard<std::mutex> lock(pool->mu);
        ++pool->users;
        q->pool = pool;
    }
    return PF_STATUS_OK;
}

void sequence_pages_clear(Sequence &q) {
    if (!q.pool) return;
    std::lock_guard<std::mutex> lock(q.pool->mu);
    (void)page_table_release(q.pool->ids, &q.pages, nullptr);  // every id is held: cannot fail
}

namespace {
// sequence_free's: the pages, then the use of the pool.
void sequence_leave_pool(Sequence &q) {
    if (!q.pool) return;
    sequence_pages_clear(q);
    std::lock_guard<std::mutex> lock(q.pool->mu);
    --q.pool->users;
    q.pool = nullptr;
}
}  // namespace

void sequence_free(pf_context *ctx, Sequence &q) {
    sequence_leave_pool(q);
    device_free_pooled(ctx, q.mem, q.mem_bytes);
    q.mem = nullptr;
    q.mem_bytes = 0;
}

KvPages sequence_kv_pages(const Sequence &q) {
    return q.pool ? KvPages{q.table, q.pool->page_rows} : KvPages{};
}

int64_t sequence_kv_rows(const Sequence &q) { return q.pool ? q.pool->rows() : q.capacity; }

pf_status sequence_pages_reserve(Sequence &q, int64_t rows, cudaStream_t st) {
    if (!q.pool || rows <= 0) return PF_STATUS_OK;
    KvPool &p = *q.pool;
    PageCopy cow;
    std::vector<int64_t> fresh;
    {
        std::lock_guard<std::mutex> lock(p.mu);
        const pf_status r = page_table_append(p.ids, &q.pages, q.pos, rows, p.page_rows, &cow, &fresh);
        if (r == PF_STATUS_OUT_OF_MEMORY)
            return fail(r, "KV pool: positions %lld..%lld need more pages of %d rows than the %d of %d free "
                        "(pf_model_kv_pool sizes the pool; sessions that end or roll back give theirs back)",
                        (long long)q.pos, (long long)(q.pos + rows - 1), (int)p.page_rows, (int)p.ids.n_free(),
                        (int)p.n_pages());
        PF_TRY(r);
    }
    if (cow.index >= 0) PF_TRY(kv_pool_copy_page(p, cow.src, cow.dst, cow.rows, st));
    // From pageable memory: the host copy is staged before the call returns, so the table may
    // change afterwards; every kernel of the run reads it after this copy (stream order).
    PF_CUDA_TRY(cudaMemcpyAsync(q.table, q.pages.data(), q.pages.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    return PF_STATUS_OK;
}

pf_status sequence_pages_truncate(Sequence &q, int64_t to, int64_t from) {
    if (!q.pool) return PF_STATUS_OK;
    std::lock_guard<std::mutex> lock(q.pool->mu);
    return page_table_rollback(q.pool->ids, &q.pages, from, to, q.pool->page_rows, nullptr, nullptr);
}

pf_status sequence_zero(Sequence &q, cudaStream_t st) {
    q.snaps.clear();
    pf_status r = PF_STATUS_OK;
    for_each_recurrent(q, [&](void *conv, size_t cb, void *ssm, size_t sb) {
        if (r != PF_STATUS_OK) return;
        cudaError_t e = cudaMemsetAsync(conv, 0, cb, st);
        if (e == cudaSuccess) e = cudaMemsetAsync(ssm, 0, sb, st);
        if (e != cudaSuccess) r = cuda_fail(e, __FILE__, __LINE__, "sequence_zero: cudaMemsetAsync");
    });
    return r;
}

pf_status sequence_copy(Sequence &dst, const Sequence &src, cudaStream_t st) {
    return sequence_copy_prefix(dst, src, src.pos, nullptr, st);
}

pf_status sequence_copy_prefix(Sequence &dst, const Sequence &src, int64_t pos, const Snapshot *h, cudaStream_t st) {
    if (!h && pos != src.pos && snapshot_bytes(src.model) > 0)
        return fail(PF_STATUS_INTERNAL, "sequence_copy_prefix: a recurrent state at %lld needs its snapshot",
                    (long long)pos);
    if (dst.pool != src.pool)  // session.cu copy_at refuses it with the user's message first
        return fail(PF_STATUS_INTERNAL, "sequence_copy_prefix: sequences of different KV kinds");
    const Hparams &hp = src.model->hp;
    if (src.pool) {  // dst shares src's pages of [0, pos): its partial last page is copied on write
        KvPool &p = *src.pool;
        std::lock_guard<std::mutex> lock(p.mu);
        const std::vector<int32_t> ids(src.pages.begin(), src.pages.begin() + pages_for(pos, p.page_rows));
        std::vector<int32_t> old = dst.pages;
        PF_TRY(page_table_share(p.ids, ids, pos, p.page_rows, &dst.pages));
        PF_TRY(page_table_release(p.ids, &old, nullptr));  // after the share: a page both hold stays
    }
    const size_t kv_rows = src.pool ? 0 : size_t(pos) * size_t(hp.kv_dim()) * state_kv_elem(src.kv_dtype);
    for (size_t i = 0; i < src.k_cache.size() && kv_rows; ++i) {
        PF_CUDA_TRY(cudaMemcpyAsync(dst.k_cache[i], src.k_cache[i], kv_rows, cudaMemcpyDeviceToDevice, st));
        PF_CUDA_TRY(cudaMemcpyAsync(dst.v_cache[i], src.v_cache[i], kv_rows, cudaMemcpyDeviceToDevice, st));
    }
    if (h) {  // the recurrent state at pos: src's snapshot slot into dst's conv windows and states
        PF_TRY(snapshot_copy(dst, src.snap_mem + size_t(h->slot) * src.snap_bytes, false, st,
                             "copy_prefix: cudaMemcpyAsync"));
    } else {
        // Both of one model: the same GDN layers, conv window and state sizes; one span each
        // where the layout allows (recurrent_span), else layer by layer.
        size_t bytes = 0, src_bytes = 0;
        char *d = recurrent_span(dst, &bytes);
        const char *from = recurrent_span(src, &src_bytes);
        if (d && from && bytes == src_bytes) {
            PF_CUDA_TRY(cudaMemcpyAsync(d, from, bytes, cudaMemcpyDeviceToDevice, st));
        } else {
            const size_t conv = size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4,
                         ssm = size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4;
            for (size_t il = 0; il < src.conv.size(); ++il) {
                if (!src.conv[il]) continue;
                PF_CUDA_TRY(cudaMemcpyAsync(dst.conv[il], src.conv[il], conv, cudaMemcpyDeviceToDevice, st));
                PF_CUDA_TRY(cudaMemcpyAsync(dst.ssm[il], src.ssm[il], ssm, cudaMemcpyDeviceToDevice, st));
            }
        }
    }
    dst.pos = pos;
    dst.last_token = h ? h->last_token : pos == src.pos ? src.last_token : -1;
    dst.broken = false;
    dst.snaps.clear();
    return PF_STATUS_OK;
}

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
    PF_TRY(snapshot_copy(q, q.snap_mem + size_t(slot) * q.snap_bytes, true, st, "snapshot: cudaMemcpyAsync"));
    q.snaps.push_back(Snapshot{q.pos, last_token, slot});
    return PF_STATUS_OK;
}

pf_status snapshot_copy_slot(Sequence &q, char *slot, bool to_slot, cudaStream_t st) {
    return snapshot_copy(q, slot, to_slot, st, to_slot ? "prefix cache: snapshot" : "prefix cache: restore");
}

pf_status snapshot_restore(Sequence &q, const Snapshot &h, cudaStream_t st) {
    return snapshot_copy(q, q.snap_mem + size_t(h.slot) * q.snap_bytes, false, st, "rollback: cudaMemcpyAsync");
}

}  // namespace pf
