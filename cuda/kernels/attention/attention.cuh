// attention.cuh — attention over a resident KV cache (internal entries).
//
// KV cache layout (design.md "Numbers and layouts"): per attention layer, K and V are two
// separate row-major arrays `[max_len][kv_dim]`, kv_dim = Hkv * D, row p = position p, KV head g
// owns columns [g*D, (g+1)*D). The element type is fp16 (PF_KV_F16, the default) or fp32
// (PF_KV_F32, the exact path). K rows hold k after the QK RMSNorm and RoPE, V rows raw v.
//
// Writing the cache: `kv_write` converts fp32 k/v rows into the cache dtype. For an fp32 cache a
// projection can also write straight into the cache: point its output at
// `k_cache + pos0 * kv_dim` with row stride ldy = kv_dim (and run the norm/RoPE in place there).
//
// Query heads map onto KV heads by grouping (spec.md §0.1 B2, pitfall §7.2): with G = H / Hkv,
// query head h reads KV head h / G (never h % Hkv).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/context.h"
#include "base/mat.h"

namespace pf {

// Where position p of a cache lies (issue 39's paged KV; plan/page_pool.h has the bookkeeping).
// Contiguous (table == nullptr): row p of the arrays. Paged: the arrays are a pool of pages of
// page_rows rows (a positive multiple of 64, the attention kernels' tile granule) and page k of
// the sequence, positions [k P, (k + 1) P), is pool page table[k]: position p lies at row
// table[p / P] * P + p % P. The table is device memory with an entry for every page up to the
// last position a call reads or writes; pages may be shared between tables (read-only then:
// the writer copies first).
struct KvPages {
    const int32_t *table = nullptr;
    int32_t page_rows = 0;
    PF_HD bool paged() const { return table != nullptr; }
    PF_HD int64_t row(int64_t p) const {
        if (!table) return p;
        const int64_t k = p / page_rows;
        return int64_t(table[k]) * page_rows + (p - k * page_rows);
    }
};

// Pages are whole multiples of this many rows (the mma.sync kernel's key tile; the wgmma
// kernel's 16-row TMA boxes divide it, so no box straddles two pages).
constexpr int32_t kKvPageGranule = 64;
// INVALID_ARGUMENT naming fn unless p is contiguous or its page_rows a positive multiple of
// kKvPageGranule.
pf_status check_pages(const KvPages &p, const char *fn);

// One attention layer's KV cache: K and V arrays [capacity][kv_dim] of `dtype` (PF_KV_F16 or
// PF_KV_F32), row p = position p; or, with `pages`, pools of pages addressed through a page
// table (KvPages).
struct KvCache {
    void *k = nullptr, *v = nullptr;
    int32_t dtype = PF_KV_F16;
    KvPages pages;
};

// Converts rows of fp32 k and v into the cache: for r in [0, rows), c in [0, kv_dim):
//   cache.k[cache.pages.row(pos0 + r) * kv_dim + c] = cvt(k.row(r)[c]), same for v
// (contiguous caches: row pos0 + r).
// k, v: device fp32, ld >= kv_dim; the cache holds at least pos0 + rows rows. fp16 conversion
// rounds to nearest even and saturates at +-65504 (finite values never become inf, which would
// turn into NaN in the softmax; NaN stays NaN). rows == 0 is a no-op.
pf_status kv_write(CMatF k, CMatF v, int64_t rows, int64_t kv_dim, const KvCache &cache, int64_t pos0,
                   cudaStream_t stream);
// kv_write with pos0 read from device memory when the kernel runs (a launch that a CUDA graph can
// replay at any position); the caller keeps pos0 + rows within the caches.
pf_status kv_write_at(CMatF k, CMatF v, int64_t rows, int64_t kv_dim, const KvCache &cache,
                      const int64_t *pos0_dev, cudaStream_t stream);

// Arguments of `attention`. Shapes use H = n_heads, Hkv = n_kv_heads, D = head_dim.
struct AttentionArgs {
    // q: query row t (position pos0 + t), head h starts at q[t * ldq + h * q_head_stride],
    // D contiguous fp32 values. qwen3: q_head_stride = D, ldq = H*D. qwen35 (per-head [q | gate]
    // rows of the q projection): q_head_stride = 2*D, ldq = 2*H*D.
    const float *q = nullptr;
    int64_t ldq = 0;
    int64_t q_head_stride = 0;
    // Cache arrays [>= pos0 + rows][Hkv * D] of kv_dtype; rows 0..pos0+rows-1 must be written.
    const void *k_cache = nullptr;
    const void *v_cache = nullptr;
    int32_t kv_dtype = PF_KV_F16;
    // o: [rows][H*D] fp32 with row stride ldo >= H*D; head h at o[t * ldo + h * D]. Must not
    // overlap q or the caches.
    float *o = nullptr;
    int64_t ldo = 0;
    int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int64_t rows = 0;  // query rows in this chunk (0 = no-op)
    int64_t pos0 = 0;  // position of query row 0; keys 0..pos0+t are visible to row t
    float scale = 0;   // softmax scale, normally 1/sqrt(D)
    int32_t path = PF_ATTN_AUTO;
    // Flash path only: pf_attn_kernel (AUTO: wgmma where available).
    int32_t kernel = PF_ATTN_KERNEL_AUTO;
    // cuBLAS path only. The query rows run in passes of at most rows_per_pass rows; 0 = derive it
    // from scores_budget_bytes (0 = kAttnDefaultBudget) so that the workspace stays within it.
    int64_t rows_per_pass = 0;
    size_t scores_budget_bytes = 0;
    // cuBLAS path only: optional caller-owned device workspace (e.g. sized once per session with
    // attention_workspace_bytes, so that the hot path never allocates). When null, a per-context
    // scratch of this family is grown on demand. When given and smaller than one pass of
    // rows_per_pass rows needs, rows_per_pass shrinks to what fits (INVALID_ARGUMENT below 1 row).
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
    // Flash path only: the position on the device (a launch that a CUDA graph can replay at any
    // position). When set, the kernels read pos0 from *pos0_dev when they run (the key count,
    // the number of key tiles and the causal limits follow from it) and a.pos0 is the host's
    // copy, used for the path choice and the checks only; the grid, the shared memory and the
    // wgmma kernel's TMA maps depend on rows and kv_capacity, not on the position. kv_capacity:
    // the rows both caches hold (>= pos0 + rows); the wgmma kernel's maps span them all and the
    // kernel keeps rows at or past *pos0_dev + rows out of the result (masked scores, zeroed V
    // rows). The cuBLAS path ignores both and runs at a.pos0.
    const int64_t *pos0_dev = nullptr;
    int64_t kv_capacity = 0;
    // The flash path's stream (nullptr: the context's); the cuBLAS path always runs on the
    // context's stream (its handle is bound to it).
    cudaStream_t stream = nullptr;
    // Paged KV (KvPages): k_cache / v_cache are pools of pages and position j of the keys lies at
    // row pages.row(j). Every path serves it with bitwise the output of the contiguous caches
    // holding the same rows: the flash kernels translate each key row (the wgmma kernel loads
    // its tiles in 16-row TMA boxes, each inside one page, over maps spanning kv_capacity rows:
    // the pool's), the cuBLAS path gathers rows [0, pos0 + rows) into its workspace first.
    KvPages pages;
};

constexpr size_t kAttnDefaultBudget = size_t(256) << 20;  // 256 MiB of cuBLAS-path workspace

// Causal grouped attention for a chunk (spec.md §0.1 B2, §1.3 step 6, §3.1 A7):
//   o[t, h] = sum_{j <= pos0 + t} softmax_j(scale * q[t, h] . K[j, h / G]) V[j, h / G]
// with fp32 softmax (max-subtracted). Paths (a.path):
//  - PF_ATTN_CUBLAS: per pass of n <= rows_per_pass query rows (positions pos0+r0 ..), over
//    T = pos0 + r0 + n keys: q gathered into a [H][n][D] scratch of the cache dtype; one
//    strided-batched GEMM (batch = Hkv, G*n query rows each) S = scale * Q K^T into fp32 scores
//    [H][n][T]; causal mask + softmax (fp32); Hkv strided-batched GEMMs (batch = G) O = P V
//    written straight into o. fp32 cache: SGEMM on ctx->blas_f32 (pedantic, the exact path,
//    bound 1e-5). fp16 cache: fp16 inputs, fp32 compute and output on ctx->blas_tc; P rounded to
//    fp16 (bound 3e-3).
//    Workspace bytes of a pass of n rows over at most T = pos0 + rows keys (each part aligned to
//    256 bytes):   H * n * D * esz      (gathered q, esz = 2 for fp16, 4 for fp32)
//                + H * n * T * 4        (fp32 scores; the bound the budget controls)
//                + H * n * T * 2        (fp16 probabilities, fp16 cache only)
//    and with paged caches, once, on top of the budget: 2 * T * Hkv * D * esz (K and V rows
//    [0, T) gathered contiguous before the passes, which are those of contiguous caches).
//  - PF_ATTN_FLASH: fused kernel for D in {128, 256} and an fp16 cache (16-byte aligned cache
//    pointers): fp16 Q/K/V/P into mma.sync m16n8k16 tensor-core products, fp32 accumulation and
//    online softmax, no scores materialised; the G query heads of one KV head share a tile, KV
//    tiles past the causal limit are skipped. Bound 3e-3. Anything else: UNSUPPORTED.
//    Two kernels serve it (a.kernel, see attention_resolved_kernel): the mma.sync kernel above
//    (sm_80+), and on Hopper the wgmma kernel of attention_wgmma.cu (128 packed rows per block,
//    wgmma for both products, 128B-swizzled K/V tiles loaded by TMA into a 2-stage mbarrier
//    pipeline, a producer and two consumer warpgroups). Same bound; no workspace. Either
//    kernel takes the position from the host (a.pos0) or from the device (a.pos0_dev, for
//    CUDA graphs): bitwise the same output.
//  - PF_ATTN_AUTO: flash where it applies, else cuBLAS (the choice depends on pos0: a caller
//    that captures the flash launch at one position must check the choice at each replay).
// ctx is needed for the cuBLAS handles, its stream and the scratch; runs on ctx->stream.
// Scalar checks only (the C API validates buffers); rows == 0 is a no-op.
pf_status attention(pf_context *ctx, const AttentionArgs &a);

// True when the flash kernel serves these arguments (fp16 cache, D in {128, 256}, aligned caches).
bool attention_flash_supported(const AttentionArgs &a);
// The path `a` would run: PF_ATTN_CUBLAS or PF_ATTN_FLASH (AUTO resolved).
int32_t attention_resolved_path(const AttentionArgs &a);
// The rows per pass the cuBLAS path uses for `a` (before any workspace shrink), >= 1.
int64_t attention_rows_per_pass(const AttentionArgs &a);
// Workspace bytes the cuBLAS path needs for passes of `rows_per_pass` rows with keys up to
// pos0 + rows (0 for the flash path). Use it to size AttentionArgs::workspace.
size_t attention_workspace_bytes(const AttentionArgs &a, int64_t rows_per_pass);

// The flash kernel `a` runs on `device`: PF_ATTN_KERNEL_MMA or PF_ATTN_KERNEL_WGMMA (an explicit
// a.kernel first, then wgmma where available). An explicit WGMMA where it
// is not available resolves to WGMMA, and attention() reports it UNSUPPORTED.
int32_t attention_resolved_kernel(const AttentionArgs &a, int device);
// Runs the wgmma kernel (D 128 or 256, fp16 cache, 16-byte aligned caches; the caller checked
// attention_flash_supported and sm90a_kernels_available) on `stream`.
pf_status attention_flash_wgmma(const AttentionArgs &a, cudaStream_t stream);

// Frees this family's per-context scratch (call from context teardown; harmless when none).
void attention_release(pf_context *ctx);

}  // namespace pf
