// kv_pool.h — a model's pool of KV pages (issue 39): every attention layer's K and V rows in
// pages of page_rows positions, handed to paged sessions by reference count (plan/page_pool.h's
// PagePool and page-table arithmetic), so that forks and prefix copies share the pages of a
// common prefix instead of copying rows, and a session holds only the pages its positions reach.
//
// Layout: per attention layer two arrays [n_pages * page_rows][kv_dim] of kv_dtype (one
// allocation), pool page g at rows [g P, (g + 1) P) of each: the caches of attention.cuh's
// KvPages with table entries naming pool pages. A paged sequence (runtime/sequence.h) holds a
// page table of pages_for(pos) ids and its device copy; its rows are written only into pages it
// alone references (page_table_append copies a shared partial page first).
//
// Thread safety: the pool's ids are taken and dropped under its mutex (sessions of one model
// may run on different threads); a page's rows are only written by the one session holding it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/attention/attention.cuh"
#include "plan/page_pool.h"
#include "prefill.h"

struct pf_model;

namespace pf {

struct KvPool {
    pf_context *ctx = nullptr;
    int32_t page_rows = 0;  // P: a positive multiple of kKvPageGranule
    int32_t kv_dtype = PF_KV_F16;
    int64_t kv_dim = 0;
    PagePool ids;           // capacity = the pool's pages
    std::vector<void *> k, v;  // per attention layer [n_pages * P][kv_dim]
    void *mem = nullptr;
    size_t mem_bytes = 0;
    size_t page_bytes = 0;  // one page of every layer's K and V
    int32_t users = 0;      // sequences on the pool (under mu): it may not go while any does
    std::mutex mu;

    int32_t n_pages() const { return ids.capacity(); }
    int64_t rows() const { return int64_t(n_pages()) * page_rows; }  // of each layer's array
    size_t row_bytes() const { return size_t(kv_dim) * (kv_dtype == PF_KV_F16 ? 2 : 4); }
};

// A pool of n_pages pages of page_rows rows for m's attention layers (one device allocation;
// the rows are not initialised). INVALID_ARGUMENT for page_rows not a positive multiple of 64,
// n_pages < 1 or n_pages * page_rows >= 2^31, OUT_OF_MEMORY when it does not fit.
pf_status kv_pool_create(const pf_model *m, int32_t page_rows, int32_t n_pages, int32_t kv_dtype, KvPool **out);
void kv_pool_destroy(KvPool *p);

// Copies rows [0, rows) of pool page src into page dst, every layer's K and V (a copy-on-write,
// plan/page_pool.h PageCopy), on `stream`.
pf_status kv_pool_copy_page(const KvPool &p, int32_t src, int32_t dst, int64_t rows, cudaStream_t stream);
// Copies pool page `page` to host memory `host` (to_host) or back from it, on `stream`: page_bytes
// there, every attention layer's K rows then its V rows, layer after layer (the prefix cache's
// host tier).
pf_status kv_pool_page_host(const KvPool &p, int32_t page, char *host, bool to_host, cudaStream_t stream);

}  // namespace pf
