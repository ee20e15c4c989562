// quant.cuh — GGUF block layouts and per-element __device__ decoders, one per GGML type.
//
// Shared by the dequantization kernels (dequant.cu), the embedding gather and the fused
// quantized GEMMs (qgemm.cu). Layouts are GGML's (ggml-common.h block_q4_0, block_q8_0,
// block_q4_K, block_q5_K, block_q6_K, block_iq4_xs) and the arithmetic follows
// ggml-quants.c dequantize_row_* (and gguf-py quants.py, the test oracle).
//
// Exactness: every decoded value is a product of an fp16 scale (11 significant bits), an
// integer sub-scale (<= 7 bits) and an integer quant (<= 7 bits) — at most 23 significant bits,
// so each product is exact in fp32 and the only rounding is the single subtraction of the
// K-quant minimum. The result therefore equals ggml's and numpy's fp32 value bit for bit,
// whatever the evaluation order or FMA contraction.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "prefill.h"

namespace pf {

// ------------------------------------------------------------------ block structs (GGML)

constexpr int kQK4_0 = 32;   // elements per Q4_0 block
constexpr int kQK8_0 = 32;   // elements per Q8_0 block
constexpr int kQK_K = 256;   // elements per K-quant / IQ4_XS super-block
constexpr int kKScaleSize = 12;  // packed 6-bit scales + mins of Q4_K / Q5_K

struct block_q4_0 {
    __half d;                 // scale
    uint8_t qs[kQK4_0 / 2];   // element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j-16]
};
struct block_q8_0 {
    __half d;                 // scale
    int8_t qs[kQK8_0];        // element j: qs[j]
};
struct block_q4_K {
    __half d;                     // super-block scale of the 6-bit scales
    __half dmin;                  // super-block scale of the 6-bit mins
    uint8_t scales[kKScaleSize];  // 8 scales + 8 mins, 6 bits each (get_scale_min_k4)
    uint8_t qs[kQK_K / 2];        // sub-block j (32 elems): nibble (j&1) of qs[(j/2)*32 + l]
};
struct block_q5_K {
    __half d;
    __half dmin;
    uint8_t scales[kKScaleSize];
    uint8_t qh[kQK_K / 8];        // 5th bit of sub-block j, element l: bit j of qh[l]
    uint8_t qs[kQK_K / 2];        // low 4 bits, as in Q4_K
};
struct block_q6_K {
    uint8_t ql[kQK_K / 2];        // low 4 bits
    uint8_t qh[kQK_K / 4];        // high 2 bits
    int8_t scales[kQK_K / 16];    // one int8 scale per 16 elements
    __half d;                     // super-block scale
};
struct block_iq4_xs {
    __half d;
    uint16_t scales_h;            // 2 high bits of each of the 8 6-bit sub-block scales
    uint8_t scales_l[kQK_K / 64]; // 4 low bits of each scale, two per byte
    uint8_t qs[kQK_K / 2];        // sub-block ib: nibbles of qs[ib*16 .. ib*16+15], low then high
};
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must be 18 bytes (GGML)");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 must be 34 bytes (GGML)");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K must be 144 bytes (GGML)");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K must be 176 bytes (GGML)");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K must be 210 bytes (GGML)");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs must be 136 bytes (GGML)");

// IQ4_NL / IQ4_XS non-linear 4-bit code book (ggml-common.h kvalues_iq4nl):
//   {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
// packed as little-endian int8 bytes into two 64-bit immediates, so that a lookup is a shift
// in registers (no constant-memory serialization when the lanes of a warp pick different codes).
constexpr uint64_t kIq4nlLo = 0xF6EADDCFBFAD9881ull;  // codes 0..7
constexpr uint64_t kIq4nlHi = 0x7159453526190D01ull;  // codes 8..15
__device__ __forceinline__ int iq4nl_value(int q) {
    const uint64_t t = q < 8 ? kIq4nlLo : kIq4nlHi;
    return int(int8_t(uint8_t(t >> ((q & 7) * 8))));
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (ggml get_scale_min_k4).
__device__ __forceinline__ void get_scale_min_k4(int j, const uint8_t *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// d * sc and dmin * m of sub-block j of a Q4_K / Q5_K block: both products exact (<= 17 bits).
template <class Block>
__device__ __forceinline__ void k4_scale_min(const Block *b, int j, float &d1, float &m1) {
    int sc, m;
    get_scale_min_k4(j, b->scales, sc, m);
    d1 = __half2float(b->d) * float(sc);
    m1 = __half2float(b->dmin) * float(m);
}

// The scale of sub-block ib (0..7, 32 elements) of an IQ4_XS block: d * (6-bit scale - 32).
__device__ __forceinline__ float iq4xs_scale(const block_iq4_xs *b, int ib) {
    const int ls = ((b->scales_l[ib >> 1] >> ((ib & 1) << 2)) & 0xF) |
                   (((b->scales_h >> (2 * ib)) & 3) << 4);
    return __half2float(b->d) * float(ls - 32);
}

// ------------------------------------------------------------------ per-type traits

// qtraits<Q>: kElems elements per block in kBytes bytes; decode(block, i) = element i (fp32).
template <int Q>
struct qtraits;

template <>
struct qtraits<PF_QTYPE_F32> {
    static constexpr int kElems = 1, kBytes = 4;
    __device__ static __forceinline__ float decode(const uint8_t *p, int) {
        return *reinterpret_cast<const float *>(p);
    }
};
template <>
struct qtraits<PF_QTYPE_F16> {
    static constexpr int kElems = 1, kBytes = 2;
    __device__ static __forceinline__ float decode(const uint8_t *p, int) {
        return __half2float(*reinterpret_cast<const __half *>(p));  // exact, subnormals included
    }
};
template <>
struct qtraits<PF_QTYPE_BF16> {
    static constexpr int kElems = 1, kBytes = 2;
    __device__ static __forceinline__ float decode(const uint8_t *p, int) {
        // bf16 is the top half of an fp32: widen by a shift (keeps NaN payloads like numpy).
        return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t *>(p)) << 16);
    }
};
template <>
struct qtraits<PF_QTYPE_Q4_0> {
    static constexpr int kElems = kQK4_0, kBytes = sizeof(block_q4_0);
    __device__ static __forceinline__ float decode(const uint8_t *p, int i) {
        const block_q4_0 *b = reinterpret_cast<const block_q4_0 *>(p);
        const int q = (b->qs[i & 15] >> ((i >> 4) << 2)) & 0xF;  // i >= 16 reads the high nibble
        return __half2float(b->d) * float(q - 8);
    }
    // Elements i0 .. i0+7 (i0 % 8 == 0): the same arithmetic as decode(), the header read once.
    __device__ static __forceinline__ void decode8(const uint8_t *p, int i0, float *v) {
        const block_q4_0 *b = reinterpret_cast<const block_q4_0 *>(p);
        const float d = __half2float(b->d);
        const uint8_t *q = b->qs + (i0 & 15);
        const int sh = (i0 >> 4) << 2;
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = d * float(((q[e] >> sh) & 0xF) - 8);
    }
};
template <>
struct qtraits<PF_QTYPE_Q8_0> {
    static constexpr int kElems = kQK8_0, kBytes = sizeof(block_q8_0);
    __device__ static __forceinline__ float decode(const uint8_t *p, int i) {
        const block_q8_0 *b = reinterpret_cast<const block_q8_0 *>(p);
        return __half2float(b->d) * float(b->qs[i]);
    }
    __device__ static __forceinline__ void decode8(const uint8_t *p, int i0, float *v) {
        const block_q8_0 *b = reinterpret_cast<const block_q8_0 *>(p);
        const float d = __half2float(b->d);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = d * float(b->qs[i0 + e]);
    }
};
template <>
struct qtraits<PF_QTYPE_Q4_K> {
    static constexpr int kElems = kQK_K, kBytes = sizeof(block_q4_K);
    __device__ static __forceinline__ float decode(const uint8_t *p, int i) {
        const block_q4_K *b = reinterpret_cast<const block_q4_K *>(p);
        const int j = i >> 5, l = i & 31;  // sub-block of 32, element in it
        float d1, m1;
        k4_scale_min(b, j, d1, m1);
        const int q = (b->qs[(j >> 1) * 32 + l] >> ((j & 1) << 2)) & 0xF;
        return d1 * float(q) - m1;  // one rounding, as ggml
    }
    __device__ static __forceinline__ void decode8(const uint8_t *p, int i0, float *v) {
        const block_q4_K *b = reinterpret_cast<const block_q4_K *>(p);
        const int j = i0 >> 5;  // the 8 elements share one sub-block of 32
        float d1, m1;
        k4_scale_min(b, j, d1, m1);
        const uint8_t *q = b->qs + (j >> 1) * 32 + (i0 & 31);
        const int sh = (j & 1) << 2;
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = d1 * float((q[e] >> sh) & 0xF) - m1;
    }
};
template <>
struct qtraits<PF_QTYPE_Q5_K> {
    static constexpr int kElems = kQK_K, kBytes = sizeof(block_q5_K);
    __device__ static __forceinline__ float decode(const uint8_t *p, int i) {
        const block_q5_K *b = reinterpret_cast<const block_q5_K *>(p);
        const int j = i >> 5, l = i & 31;
        float d1, m1;
        k4_scale_min(b, j, d1, m1);
        const int q = ((b->qs[(j >> 1) * 32 + l] >> ((j & 1) << 2)) & 0xF) |
                      (((b->qh[l] >> j) & 1) << 4);
        return d1 * float(q) - m1;
    }
    __device__ static __forceinline__ void decode8(const uint8_t *p, int i0, float *v) {
        const block_q5_K *b = reinterpret_cast<const block_q5_K *>(p);
        const int j = i0 >> 5, l0 = i0 & 31;
        float d1, m1;
        k4_scale_min(b, j, d1, m1);
        const uint8_t *q = b->qs + (j >> 1) * 32 + l0;
        const int sh = (j & 1) << 2;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int qq = ((q[e] >> sh) & 0xF) | (((b->qh[l0 + e] >> j) & 1) << 4);
            v[e] = d1 * float(qq) - m1;
        }
    }
};
template <>
struct qtraits<PF_QTYPE_Q6_K> {
    static constexpr int kElems = kQK_K, kBytes = sizeof(block_q6_K);
    __device__ static __forceinline__ float decode(const uint8_t *p, int i) {
        const block_q6_K *b = reinterpret_cast<const block_q6_K *>(p);
        const int h = i >> 7, r = i & 127;  // half of the super-block, position in it
        const int lo = (b->ql[h * 64 + (r & 63)] >> ((r >> 6) << 2)) & 0xF;
        const int hi = (b->qh[h * 32 + (r & 31)] >> ((r >> 5) << 1)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        return (__half2float(b->d) * float(b->scales[i >> 4])) * float(q);  // exact products
    }
    __device__ static __forceinline__ void decode8(const uint8_t *p, int i0, float *v) {
        const block_q6_K *b = reinterpret_cast<const block_q6_K *>(p);
        const int h = i0 >> 7, r0 = i0 & 127;  // 8 elements: one half, one 16-group, no wrap
        const uint8_t *ql = b->ql + h * 64 + (r0 & 63);
        const uint8_t *qh = b->qh + h * 32 + (r0 & 31);
        const int shl = (r0 >> 6) << 2, shh = (r0 >> 5) << 1;
        const float s = __half2float(b->d) * float(b->scales[i0 >> 4]);
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[e] = s * float((((ql[e] >> shl) & 0xF) | (((qh[e] >> shh) & 3) << 4)) - 32);
    }
};
template <>
struct qtraits<PF_QTYPE_IQ4_XS> {
    static constexpr int kElems = kQK_K, kBytes = sizeof(block_iq4_xs);
    __device__ static __forceinline__ float decode(const uint8_t *p, int i) {
        const block_iq4_xs *b = reinterpret_cast<const block_iq4_xs *>(p);
        const int ib = i >> 5, j = i & 31;
        const float dl = iq4xs_scale(b, ib);
        const int q = (b->qs[ib * 16 + (j & 15)] >> ((j >> 4) << 2)) & 0xF;
        return dl * float(iq4nl_value(q));
    }
    __device__ static __forceinline__ void decode8(const uint8_t *p, int i0, float *v) {
        const block_iq4_xs *b = reinterpret_cast<const block_iq4_xs *>(p);
        const int ib = i0 >> 5, j0 = i0 & 31;
        const float dl = iq4xs_scale(b, ib);
        const uint8_t *q = b->qs + ib * 16 + (j0 & 15);
        const int sh = (j0 >> 4) << 2;
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = dl * float(iq4nl_value((q[e] >> sh) & 0xF));
    }
};

// Elements col0 .. col0+7 of a row (col0 % 8 == 0). Block types decode the 8 together (they
// always lie in one block and one sub-block); element types (kElems == 1) one by one.
template <int Q>
__device__ __forceinline__ void decode8_at(const uint8_t *row_ptr, int64_t col0, float *v) {
    using T = qtraits<Q>;
    if constexpr (T::kElems == 1) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = T::decode(row_ptr + (col0 + e) * T::kBytes, 0);
    } else {
        T::decode8(row_ptr + (col0 / T::kElems) * T::kBytes, int(col0 % T::kElems), v);
    }
}

// Element `col` of row `row_ptr` (the row's first block) of a matrix of type Q.
template <int Q>
__device__ __forceinline__ float decode_at(const uint8_t *row_ptr, int64_t col) {
    using T = qtraits<Q>;
    return T::decode(row_ptr + (col / T::kElems) * T::kBytes, int(col % T::kElems));
}

// Calls f(std::integral_constant-like tag) for a runtime qtype; false when unsupported.
// Usage: dispatch_qtype(qtype, [&](auto tag) { constexpr int Q = decltype(tag)::value; ... });
template <int Q>
struct qtype_tag {
    static constexpr int value = Q;
};
template <class F>
bool dispatch_qtype(int32_t qtype, F &&f) {
    switch (qtype) {
        case PF_QTYPE_F32: f(qtype_tag<PF_QTYPE_F32>{}); return true;
        case PF_QTYPE_F16: f(qtype_tag<PF_QTYPE_F16>{}); return true;
        case PF_QTYPE_BF16: f(qtype_tag<PF_QTYPE_BF16>{}); return true;
        case PF_QTYPE_Q4_0: f(qtype_tag<PF_QTYPE_Q4_0>{}); return true;
        case PF_QTYPE_Q8_0: f(qtype_tag<PF_QTYPE_Q8_0>{}); return true;
        case PF_QTYPE_Q4_K: f(qtype_tag<PF_QTYPE_Q4_K>{}); return true;
        case PF_QTYPE_Q5_K: f(qtype_tag<PF_QTYPE_Q5_K>{}); return true;
        case PF_QTYPE_Q6_K: f(qtype_tag<PF_QTYPE_Q6_K>{}); return true;
        case PF_QTYPE_IQ4_XS: f(qtype_tag<PF_QTYPE_IQ4_XS>{}); return true;
        default: return false;
    }
}

}  // namespace pf
