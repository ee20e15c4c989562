// context.h — the internals of pf_context, pf_buffer and pf_weight, shared by every op family.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "prefill.h"

namespace pf {


// The device allocation behind fp16 caches: one per prewarm (every weight it caches, fused
// groups back to back) or per lone pf_weight_cache_f16. Each cached weight holds a reference;
// the last one to drop its cache frees it (f16_release).
struct F16Arena {
    void *ptr = nullptr;
    size_t bytes = 0;
    int32_t refs = 0;
};

// A device allocation that grows on demand (never shrinks); used for per-context scratch.
// A fixed Scratch (a slice of an executor's workspace) never grows: scratch_reserve fails on it
// with INTERNAL when it is short (the workspace was sized for every call at creation).
struct Scratch {
    void *ptr = nullptr;
    size_t bytes = 0;
    bool fixed = false;
};

// Makes `ctx->device` current for the scope (contexts of several devices in one thread).
class DeviceGuard {
  public:
    explicit DeviceGuard(int device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;
    pf_status status() const { return status_; }

  private:
    int previous_ = -1;
    pf_status status_ = PF_STATUS_OK;
};

}  // namespace pf

struct pf_context {
    // The user's handle (pf_context_destroy) and each live child (buffer, weight, model, session,
    // batch: pf::CtxRef) hold a reference; the context goes with the last one, so that a child
    // destroyed after pf_context_destroy still finds its stream and pool.
    std::atomic<int32_t> refs{1};
    // Bumped whenever a weight of this context gains or loses a cached form (an fp16 or int8 copy:
    // f16_arena_create, arena_release; a model's prewarm, which also moves f16_stream): a step
    // graph captured before holds the old addresses and routes, so its key includes this count.
    std::atomic<uint64_t> weight_forms{0};
    int32_t device = 0;
    uint32_t flags = 0;                 // pf_context_options.flags (PF_CONTEXT_POISON)
    cudaStream_t stream = nullptr;
    cublasHandle_t blas_f32 = nullptr;  // CUBLAS_PEDANTIC_MATH: fp32 in and out, no TF32
    cublasHandle_t blas_tc = nullptr;   // tensor-op math, fp32 compute (fp16 inputs)
    cublasLtHandle_t blas_lt = nullptr; // the f16 leg's chosen cuBLASLt algorithms (gemm_lt.cuh)
    void *workspace = nullptr;  // cuBLAS workspace, shared by the three handles (one stream)
    size_t workspace_bytes = 0;
    size_t allocated = 0;       // device bytes held by this context (buffers, weights, scratch)
    size_t budget = 0;          // pf_context_options.memory_budget_bytes (0: none)
    // Sequences' state (session KV rows, conv windows, recurrent states, snapshots) comes from
    // this stream-ordered pool, which keeps what destroyed sessions freed (no release threshold),
    // so that a fork or a new session of a size seen before costs no cudaMalloc. Created at the
    // first sequence; trimmed when a cudaMalloc runs out of memory and before a free-memory query
    // decides a size (device_free_bytes).
    cudaMemPool_t seq_pool = nullptr;
    pf::Scratch scratch_f32;    // f32 leg: dequantized weight (kernel-level calls)
    pf::Scratch scratch_f16_w;  // f16 streaming leg: dequantized weight (kernel-level calls)
    pf::Scratch scratch_f16_x;  // f16 leg: activations rounded to fp16 (kernel-level calls)
    pf::Scratch scratch_gdn;    // chunked delta rule (kernel-level calls without a workspace)
    pf::Scratch scratch_attn;   // cuBLAS attention path (kernel-level calls without a workspace)
    // The scratches above serve the kernel-level calls only: sessions and batches run in their
    // executors' workspaces (executor.h). The tuning of the kernel-level calls, and the base of
    // the models and sessions made on this context (pf_context_set_tuning).
    pf_tuning tuning{};
};

namespace pf {
// Takes a reference to a context (pf_context::refs); drops it when destroyed.
void context_retain(pf_context *ctx);
void context_release(pf_context *ctx);
class CtxRef {
  public:
    CtxRef() = default;
    CtxRef(const CtxRef &) = delete;
    CtxRef &operator=(const CtxRef &) = delete;
    ~CtxRef() { reset(nullptr); }
    void reset(pf_context *ctx) {
        if (ctx) context_retain(ctx);
        if (c_) context_release(c_);
        c_ = ctx;
    }

  private:
    pf_context *c_ = nullptr;
};
}  // namespace pf

// Each child below declares its CtxRef first: members go in reverse order, so it is the last.
struct pf_buffer {
    pf::CtxRef ref;
    pf_context *ctx = nullptr;
    void *ptr = nullptr;
    size_t bytes = 0;
};

struct pf_weight {
    pf::CtxRef ref;
    pf_context *ctx = nullptr;
    int32_t qtype = 0;
    int64_t n = 0, k = 0;
    void *data = nullptr;  // raw GGUF blocks, [n][k]
    size_t bytes = 0;
    __half *f16 = nullptr;  // cached fp16 copy [n][k], or nullptr
    // The allocation that holds f16 (shared by every weight of one prewarm; the last reference
    // frees it), and the first weight of the fused group f16 belongs to: a group of
    // prewarm_f16_groups is laid out back to back, so that its members' caches form one
    // [sum n][k] matrix (fused_f16_view). A weight cached alone is its own group. Both nullptr
    // when uncached.
    pf::F16Arena *f16_arena = nullptr;
    const pf_weight *f16_block = nullptr;
    // A model's partial prewarm left this matrix uncached: PF_GEMM_AUTO runs it on the f16 leg by
    // streaming (a per-call dequantized copy), as it runs the cached ones, not on the f32 leg.
    bool f16_stream = false;
    // The 8-bit leg's copy (gemm_i8.cuh, the rank-1 weight form): int8 codes [n][i8_code_ld(k)],
    // row factors i8_r [n] and block factors i8_b ([groups][i8_ldb], this weight's blocks of 128
    // rows from column 0), in an arena shared by a fused group (weight_cache_i8_groups: the
    // members' rows back to back, i8_block = the group's first weight). nullptr when uncached.
    int8_t *i8 = nullptr;
    float *i8_r = nullptr, *i8_b = nullptr;
    int64_t i8_ldb = 0;
    pf::F16Arena *i8_arena = nullptr;
    const pf_weight *i8_block = nullptr;
    // A fused view of F16Blocks parts (fused_view; a value on the caller's stack): the group's
    // members in order, each with its own blocks (data is nullptr); n is the sum of theirs.
    pf_weight *const *parts = nullptr;
    int32_t nparts = 0;
};

namespace pf {

// cudaMalloc with accounting; OUT_OF_MEMORY leaves the context usable. With PF_CONTEXT_POISON
// the new bytes are set to 0xFF (NaN as fp16 and fp32) on ctx's stream before any use.
pf_status device_alloc(pf_context *ctx, size_t bytes, void **out, const char *what);
void device_free(pf_context *ctx, void *ptr, size_t bytes);
// The same from the context's sequence pool (seq_pool), in the order of ctx's stream; the bytes
// freed stay in the pool for the next sequence.
pf_status device_alloc_pooled(pf_context *ctx, size_t bytes, void **out, const char *what);
void device_free_pooled(pf_context *ctx, void *ptr, size_t bytes);
// Gives the pool's unused bytes back to the device (after ctx's stream drains).
void seq_pool_trim(pf_context *ctx);
// cudaMemGetInfo's free bytes plus the sequence pool's unused ones (device_alloc trims the pool
// when it needs them).
pf_status device_free_bytes(const pf_context *ctx, size_t *free_b, size_t *total_b);
// Ensures scratch `s` holds at least `bytes` (reallocating, contents lost).
pf_status scratch_reserve(pf_context *ctx, Scratch &s, size_t bytes, const char *what);
void scratch_release(pf_context *ctx, Scratch &s);

// Drops one reference to arena a (nullptr: nothing); the last frees it once ctx's stream drains.
void arena_release(pf_context *ctx, F16Arena *a);
// A new arena of `bytes` (device_alloc) with no reference yet; nullptr and a status on failure.
pf_status f16_arena_create(pf_context *ctx, size_t bytes, F16Arena **out, const char *what);
// Drops w's fp16 cache: clears its fields and releases its reference to the arena, freeing
// the arena (after ctx's stream drains: a queued GEMM may still read it) when it was the last.
// A no-op for an uncached weight.
void f16_release(pf_weight *w);

// Checks that buffer `b` (non-null, of this context) holds at least `bytes` from its start.
pf_status check_buffer(const pf_context *ctx, const pf_buffer *b, size_t bytes, const char *fn,
                       const char *arg);

}  // namespace pf
