// qk_rope.cuh — the attention layer's q/k preparation in one launch (issue 11: short prompts
// are launch-bound). Internal entry (namespace pf), called by the session; no C API.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/error.h"
#include "kernels/attention/attention.cuh"  // KvPages

namespace pf {

// Arguments of qk_norm_rope_kv_at. Shapes: H = n_heads, Hkv = n_kv_heads, D = head_dim.
struct QkRopeKvArgs {
    // q: row t's head h at q[t * ldq + h * q_head_stride], D fp32 values (q_head_stride = D for
    // qwen3, 2*D for qwen35's [q | gate] heads: the gate halves are neither read nor written).
    float *q = nullptr;
    int64_t ldq = 0, q_head_stride = 0;
    // k: row t's KV head g at k[t * ldk + g * D]; v: row t at v[t * ldv], Hkv*D values.
    float *k = nullptr;
    int64_t ldk = 0;
    const float *v = nullptr;
    int64_t ldv = 0;
    int64_t rows = 0;
    int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int32_t rot_dim = 0;           // RoPE on the first rot_dim dims of each head (even, <= D)
    float rope_base = 0.0f;        // theta base (> 1)
    const float *q_norm = nullptr, *k_norm = nullptr;  // [D] each
    float eps = 0.0f;
    const int64_t *pos0_dev = nullptr;  // device: the position of row 0, read when the kernel runs
    // The caches' row 0 ([max_len][Hkv*D] each, element type kv_dtype); rows pos0..pos0+rows-1
    // are written (the caller keeps them within the caches).
    void *k_cache = nullptr, *v_cache = nullptr;
    int32_t kv_dtype = 0;          // PF_KV_F16 or PF_KV_F32
    KvPages pages;                 // paged caches: position p at row pages.row(p)
    bool regs = true;              // the register form where the head shape has one (RowForm.regs)
};

// Whether qk_norm_rope_kv_at serves heads of head_dim values with rot_dim rotated ones (its
// shared memory holds a head per warp and the row's angles).
bool qk_norm_rope_kv_supported(int32_t head_dim, int32_t rot_dim);

// In one launch, for each row t at position p = *pos0_dev + t, what these five do in turn:
//   head_rms_norm_rows(q, ldq, rows, H, q_head_stride, D, q_norm, eps)
//   head_rms_norm_rows(k, ldk, rows, Hkv, D, D, k_norm, eps)
//   rope_neox_rows_at(q, ldq, rows, H, q_head_stride, D, rot_dim, pos0_dev, rope_base)
//   rope_neox_rows_at(k, ldk, rows, Hkv, D, D, rot_dim, pos0_dev, rope_base)
//   kv_write_at(k, ldk, v, ldv, rows, Hkv*D, k_cache, v_cache, kv_dtype, pos0_dev)
// with bitwise the same results (q and k in place, the cache rows): every value goes through
// the same functions of qk_math.cuh, and the RMS sums through the same warp_sum_squares.
// q, k and v must not overlap each other's used columns. rows == 0 is a no-op.
pf_status qk_norm_rope_kv_at(const QkRopeKvArgs &a, cudaStream_t stream);

}  // namespace pf
