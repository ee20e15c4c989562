// prefix_cache.h — pf_prefix_cache: the prefix cache of issue 39 in the runtime. The host
// bookkeeping is plan/prefix_tree.h's PrefixTree (a radix tree over token ids whose nodes hold
// references on KV pages of the model's pool and on snapshot slots, least-recent-use eviction,
// a host tier of ids); this file owns the memory those ids name and carries out what the tree
// plans: the snapshot slots on the device, the host tier's pinned memory, the copies of an
// eviction (device -> host) and of a restore (host -> device), a session's attach (its page
// table shares the prefix's pages; its recurrent state copied from the snapshot) and the run of
// the rest in one call whose steps end where the tree wants snapshots (its snapshot plan).
//
// Streams: the host tier's copies go on a stream of the cache's own, so that the moves of an
// eviction overlap the next call's work. A move waits for everything the context's stream had
// queued (the runs that wrote the pages); the ids an eviction moves are held (one reference
// each, PagePool::hold) until its copies have read them, so no run writes them meanwhile (a
// session sharing such a page copies it before writing: refs > 1); the held ids go back when
// the copies' event has completed (reclaim: at each call's start, when a pool or the slots are
// short, at clear and destroy). A restore's copies follow the moves on that stream, after what
// the context's stream had queued (the pages it fills were free: earlier users may still be
// running), and the context's stream waits for them before the hit is used. Snapshot copies
// into and out of sessions stay on the context's stream.
//
// Locks: the cache's mutex over a whole call (the tree, the slots, the host memory); the pool's
// mutex around each tree call (the tree takes and drops page references, which the pool's other
// users take under it too): always in that order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "plan/prefix_tree.h"
#include "runtime/model.h"

namespace pf {
struct KvPool;
}

struct pf_prefix_cache {
    pf::CtxRef ref;                        // first: the last member to go
    pf_model *model = nullptr;
    pf_context *ctx = nullptr;
    pf::KvPool *pool = nullptr;            // the model's; one of its users while the cache lives
    int64_t snapshot_every = 0;            // N (0: a model without recurrent state)
    size_t snap_bytes = 0;                 // one snapshot (snapshot_bytes(model)); 0 without
    pf::PagePool slots;                    // the device snapshot slots' ids
    char *slot_mem = nullptr;              // [slots] x snap_bytes on the device
    size_t slot_mem_bytes = 0;
    std::unique_ptr<pf::PrefixTree> tree;
    char *host_pages = nullptr;            // pinned: [tree's host page ids] x page_bytes
    char *host_slots = nullptr;            // pinned: [tree's host slot ids] x snap_bytes
    size_t pinned_bytes = 0;
    cudaStream_t copy_stream = nullptr;    // the host tier's copies (with a host tier only)
    cudaEvent_t ctx_mark = nullptr;        // the copy stream's wait for the context's queued work
    cudaEvent_t copy_mark = nullptr;       // the context's wait for a restore's copies
    struct Held {                          // an eviction's moved ids, held until its copies are done
        cudaEvent_t done = nullptr;
        std::vector<int32_t> pages, slots;
    };
    std::vector<Held> held;                // in stream order
    std::vector<cudaEvent_t> spare_events; // `done` events of reclaimed evictions, for the next ones
    int64_t requests = 0, prefilled = 0, skipped = 0;
    std::mutex mu;
};

namespace pf {

// The cache of m with options o (checked by the API). INVALID_ARGUMENT when m has no KV pool.
pf_status prefix_cache_create(pf_model *m, const pf_prefix_cache_options &o, pf_prefix_cache **out);
void prefix_cache_destroy(pf_prefix_cache *c);
// pf_prefix_cache_prefill (arguments checked by the API but the tokens: the tree checks them).
pf_status prefix_cache_prefill(pf_prefix_cache *c, pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                               float *logits, int32_t *out_token);
// pf_prefix_cache_prefill_batch (items checked by the API): the batch's executor runs them.
pf_status prefix_cache_prefill_batch(pf_prefix_cache *c, pf_batch *b, const pf_batch_item *items, int32_t n);
pf_status prefix_cache_evict(pf_prefix_cache *c, int64_t target_bytes);
pf_status prefix_cache_clear(pf_prefix_cache *c);
void prefix_cache_stats(pf_prefix_cache *c, pf_prefix_cache_stats *out);

}  // namespace pf
