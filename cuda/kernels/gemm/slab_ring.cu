// slab_ring.cu — see slab_ring.cuh.
#include "kernels/gemm/slab_ring.cuh"

#include <algorithm>
#include <cstdio>

#include "base/cuda_check.cuh"
#include "base/error.h"
#include "kernels/dequant/prewarm.cuh"
#include "kernels/gemm/gemm.cuh"  // append_side_by_side
#include "plan/plan.h"  // log_enabled

namespace pf {
namespace {

// Job j into its buffer on the ring's stream, after the GEMM that last read that buffer.
pf_status issue(SlabRing *r, size_t j) {
    const size_t slot = j % size_t(r->depth);
    if (j >= size_t(r->depth)) PF_CUDA_TRY(cudaStreamWaitEvent(r->side, r->used[slot], 0));
    const SlabRing::Job &job = r->jobs[j];
    __half *dst = reinterpret_cast<__half *>(static_cast<unsigned char *>(r->bufs) + slot * r->slot_bytes);
    std::vector<prewarm_job> parts;
    append_side_by_side(parts, job.parts.data(), job.parts.size(), dst);
    PF_TRY(prewarm_dequantize(parts, r->side, true));  // short CTAs: the context's kernels come first
    PF_CUDA_TRY(cudaEventRecord(r->ready[slot], r->side));
    return PF_STATUS_OK;
}

// Whether the slab call of w is job j (the same matrices in the same order).
bool is_job(const SlabRing::Job &job, const pf_weight *w) {
    if (w->nparts == 0) return job.parts.size() == 1 && job.parts[0] == w;
    if (job.parts.size() != size_t(w->nparts)) return false;
    for (int32_t i = 0; i < w->nparts; ++i)
        if (job.parts[size_t(i)] != w->parts[i]) return false;
    return true;
}

}  // namespace

pf_status slab_ring_alloc(pf_context *ctx, SlabRing *r, int32_t depth) {
    r->slot_bytes = 0;
    for (const SlabRing::Job &j : r->jobs)
        r->slot_bytes = std::max(r->slot_bytes, size_t(j.n) * size_t(j.k) * sizeof(__half));
    r->slot_bytes = (r->slot_bytes + 255) / 256 * 256;
    if (depth < 2 || r->jobs.empty() || r->slot_bytes == 0) return PF_STATUS_OK;
    const pf_status s = device_alloc(ctx, size_t(depth) * r->slot_bytes, &r->bufs, "slab ring (tuning gemm_blocks_ring)");
    if (s == PF_STATUS_OUT_OF_MEMORY) {
        r->bufs = nullptr;
        return PF_STATUS_OK;  // no ring: the slabs in line
    }
    PF_TRY(s);
    r->depth = depth;
    int least = 0, greatest = 0;
    PF_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    PF_CUDA_TRY(cudaStreamCreateWithPriority(&r->side, cudaStreamNonBlocking, least));
    PF_CUDA_TRY(cudaEventCreateWithFlags(&r->fork, cudaEventDisableTiming));
    PF_CUDA_TRY(cudaEventCreateWithFlags(&r->join, cudaEventDisableTiming));
    r->ready.assign(size_t(depth), nullptr);
    r->used.assign(size_t(depth), nullptr);
    for (int32_t i = 0; i < depth; ++i) {
        PF_CUDA_TRY(cudaEventCreateWithFlags(&r->ready[size_t(i)], cudaEventDisableTiming));
        PF_CUDA_TRY(cudaEventCreateWithFlags(&r->used[size_t(i)], cudaEventDisableTiming));
    }
    return PF_STATUS_OK;
}

void slab_ring_free(pf_context *ctx, SlabRing *r) {
    if (r->side) (void)cudaStreamSynchronize(r->side);
    (void)cudaStreamSynchronize(ctx->stream);
    for (cudaEvent_t *e : {&r->fork, &r->join})
        if (*e) (void)cudaEventDestroy(*e), *e = nullptr;
    for (std::vector<cudaEvent_t> *v : {&r->ready, &r->used}) {
        for (cudaEvent_t e : *v)
            if (e) (void)cudaEventDestroy(e);
        v->clear();
    }
    if (r->side) (void)cudaStreamDestroy(r->side), r->side = nullptr;
    if (r->bufs) device_free(ctx, r->bufs, size_t(r->depth) * r->slot_bytes);
    r->bufs = nullptr;
    r->depth = 0;
    r->on = false;
}

pf_status slab_ring_begin(pf_context *ctx, SlabRing *r, bool run) {
    r->on = false;
    r->next = 0;
    if (!run || r->depth < 2 || r->jobs.empty()) return PF_STATUS_OK;
    PF_CUDA_TRY(cudaEventRecord(r->fork, ctx->stream));
    PF_CUDA_TRY(cudaStreamWaitEvent(r->side, r->fork, 0));
    r->on = true;
    for (size_t j = 0; j < std::min(size_t(r->depth), r->jobs.size()); ++j) PF_TRY(issue(r, j));
    return PF_STATUS_OK;
}

pf_status slab_ring_take(pf_context *ctx, SlabRing *r, const pf_weight *w, const __half **out) {
    *out = nullptr;
    if (!r->on) return PF_STATUS_OK;
    if (size_t(w->n) * size_t(w->k) * sizeof(__half) > r->slot_bytes) return PF_STATUS_OK;  // never listed
    if (r->next >= r->jobs.size() || !is_job(r->jobs[r->next], w)) return slab_ring_end(ctx, r);  // off: in line
    const size_t slot = r->next % size_t(r->depth);
    PF_CUDA_TRY(cudaStreamWaitEvent(ctx->stream, r->ready[slot], 0));
    *out = reinterpret_cast<const __half *>(static_cast<const unsigned char *>(r->bufs) + slot * r->slot_bytes);
    return PF_STATUS_OK;
}

pf_status slab_ring_done(pf_context *ctx, SlabRing *r) {
    const size_t slot = r->next % size_t(r->depth);
    PF_CUDA_TRY(cudaEventRecord(r->used[slot], ctx->stream));
    if (r->next + size_t(r->depth) < r->jobs.size()) PF_TRY(issue(r, r->next + size_t(r->depth)));
    ++r->next;
    return PF_STATUS_OK;
}

pf_status slab_ring_end(pf_context *ctx, SlabRing *r) {
    if (!r->on) return PF_STATUS_OK;
    r->on = false;
    if (log_enabled(kLogRing))  // steps run eagerly or captured (a replay runs no host code)
        std::fprintf(stderr, "libprefill: slab ring: %zu of %zu slabs taken ahead (%d buffers)\n", r->next,
                     r->jobs.size(), int(r->depth));
    PF_CUDA_TRY(cudaEventRecord(r->join, r->side));
    PF_CUDA_TRY(cudaStreamWaitEvent(ctx->stream, r->join, 0));
    return PF_STATUS_OK;
}

}  // namespace pf
