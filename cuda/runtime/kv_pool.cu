// kv_pool.cu — see kv_pool.h.
#include "runtime/kv_pool.h"

#include <climits>
#include <memory>

#include "base/cuda_check.cuh"
#include "runtime/model.h"

namespace pf {

pf_status kv_pool_create(const pf_model *m, int32_t page_rows, int32_t n_pages, int32_t kv_dtype, KvPool **out) {
    *out = nullptr;
    PF_CHECK_ARG(page_rows > 0 && page_rows % kKvPageGranule == 0,
                 "kv pool: page_rows=%d must be a positive multiple of %d", (int)page_rows, kKvPageGranule);
    PF_CHECK_ARG(n_pages >= 1 && int64_t(n_pages) * page_rows <= INT_MAX,
                 "kv pool: %d pages of %d rows: at least one page and fewer than 2^31 rows", (int)n_pages,
                 (int)page_rows);
    PF_CHECK_ARG(kv_dtype == PF_KV_F16 || kv_dtype == PF_KV_F32, "kv pool: kv_dtype=%d", (int)kv_dtype);
    PF_CHECK_ARG(m->n_attn_layers > 0, "kv pool: the model has no attention layers");
    std::unique_ptr<KvPool> p(new KvPool());
    p->ctx = m->ctx;
    p->page_rows = page_rows;
    p->kv_dtype = kv_dtype;
    p->kv_dim = m->hp.kv_dim();
    PF_TRY(p->ids.init(n_pages, "KV page"));
    const size_t array = (size_t(n_pages) * size_t(page_rows) * p->row_bytes() + 255) & ~size_t(255);
    p->mem_bytes = array * 2 * size_t(m->n_attn_layers);
    p->page_bytes = size_t(page_rows) * p->row_bytes() * 2 * size_t(m->n_attn_layers);
    PF_TRY(device_alloc(m->ctx, p->mem_bytes, &p->mem, "KV page pool"));
    char *at = static_cast<char *>(p->mem);
    for (int32_t i = 0; i < m->n_attn_layers; ++i) {
        p->k.push_back(at);
        p->v.push_back(at + array);
        at += 2 * array;
    }
    *out = p.release();
    return PF_STATUS_OK;
}

void kv_pool_destroy(KvPool *p) {
    if (!p) return;
    device_free(p->ctx, p->mem, p->mem_bytes);
    delete p;
}

pf_status kv_pool_copy_page(const KvPool &p, int32_t src, int32_t dst, int64_t rows, cudaStream_t st) {
    const size_t off_src = size_t(src) * size_t(p.page_rows) * p.row_bytes(),
                 off_dst = size_t(dst) * size_t(p.page_rows) * p.row_bytes(), bytes = size_t(rows) * p.row_bytes();
    for (size_t i = 0; i < p.k.size(); ++i) {
        PF_CUDA_TRY(cudaMemcpyAsync(static_cast<char *>(p.k[i]) + off_dst, static_cast<const char *>(p.k[i]) + off_src,
                                    bytes, cudaMemcpyDeviceToDevice, st));
        PF_CUDA_TRY(cudaMemcpyAsync(static_cast<char *>(p.v[i]) + off_dst, static_cast<const char *>(p.v[i]) + off_src,
                                    bytes, cudaMemcpyDeviceToDevice, st));
    }
    return PF_STATUS_OK;
}

pf_status kv_pool_page_host(const KvPool &p, int32_t page, char *host, bool to_host, cudaStream_t st) {
    const size_t bytes = size_t(p.page_rows) * p.row_bytes(), off = size_t(page) * bytes;
    for (size_t i = 0; i < p.k.size(); ++i)
        for (int kv = 0; kv < 2; ++kv) {
            char *d = static_cast<char *>(kv ? p.v[i] : p.k[i]) + off, *h = host + (2 * i + size_t(kv)) * bytes;
            PF_CUDA_TRY(to_host ? cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, st)
                                : cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st));
        }
    return PF_STATUS_OK;
}

}  // namespace pf
