// decode_stage.cuh — GGUF blocks decoded from a copy in shared memory ("the stage"), 8 elements
// at a time: the exact fp32 values of quant.cuh's decode8 (the same exact products), with each
// integer made a float exactly by the bias trick below instead of an I2F. Shared by the prewarm
// (prewarm.cu: flat tiles of a matrix's blocks) and the f16 leg's GEMM on the blocks
// (kernels/gemm/gemm_q16_kernel.cuh: a tile's rows, one slot each): both round the values to
// fp16 with __float2half_rn, so the GEMM's weight operand is the fp16 cache bit for bit.
// Device code only; the offsets are bytes into the stage.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dequant/quant.cuh"

namespace pf {

// ------------------------------------------------------------------ exact integer -> float
//
// The float with bits 0x4B000000 | b (b < 2^23) is exactly 2^23 + b: at 2^23 the unit in the
// last place is 1. So an integer quant q in [0, 255], placed under that exponent and minus the
// bias 2^23 + c, is exactly the float q - c (both operands and the difference are integers
// below 2^24). One PRMT (or LOP) and one FADD, both full rate, instead of an I2F.
constexpr float kTwo23 = 8388608.0f;  // 2^23

// 2^23 + byte e (0..3, a constant after unrolling) of w: PRMT selects byte e of w for the low
// byte, 0x00 twice and 0x4B (the top byte of 0x4B000000) for the high one.
__device__ __forceinline__ float biased_byte(uint32_t w, int e) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | uint32_t(e)));
}
// 2^23 + v for 0 <= v < 2^23.
__device__ __forceinline__ float biased_uint(uint32_t v) {
    return __uint_as_float(0x4B000000u | v);
}

// ------------------------------------------------------------------ shared-memory reads

// The fp16 at byte `off` (even) of the stage, widened exactly.
__device__ __forceinline__ float stage_half(const uint8_t *s, uint32_t off) {
    return __half2float(*reinterpret_cast<const __half *>(s + off));
}
// 8 bytes at an 8-byte-aligned offset.
__device__ __forceinline__ uint2 stage8_aligned(const uint8_t *s, uint32_t off) {
    return *reinterpret_cast<const uint2 *>(s + off);
}
// 8 bytes at an even offset: three aligned words and two funnel shifts (Q4_0, Q8_0 and Q6_K
// blocks are 18, 34 and 210 bytes, so their fields sit at any even offset).
__device__ __forceinline__ uint2 stage8_even(const uint8_t *s, uint32_t off) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(s + (off & ~3u));
    const uint32_t sh = (off & 3u) * 8u;
    return make_uint2(__funnelshift_r(w[0], w[1], sh), __funnelshift_r(w[1], w[2], sh));
}
// Byte e (0..7) of 8 loaded bytes, little-endian as in memory.
__device__ __forceinline__ int byte_at(uint2 q, int e) {
    return int(((e < 4 ? q.x : q.y) >> ((e & 3) * 8)) & 0xFFu);
}

// ------------------------------------------------------------------ decoders from the stage
//
// decode8_stage<Q>(s, bo, i0, v): elements i0 .. i0+7 (i0 % 8 == 0) of the block at byte bo of
// the stage; the same fp32 values as qtraits<Q>::decode8 (quant.cuh): the same exact products,
// with each integer made a float exactly by the bias trick above. The 8 quants come as two
// words of 4 bytes (elements 0-3, then 4-7), each byte holding one element's integer.
//
// In two parts, so that a thread decoding a longer run of one block decodes its scale once:
// run_scale<Q>(s, bo, i0) is the scale (and min) of the kRun<Q> elements of the run holding
// element i0 (runs aligned to kRun: a sub-block, or a whole Q4_0 / Q8_0 block), and
// run_values8<Q>(s, bo, i0, scale, v) the 8 values from it. decode8_stage is the two in a row,
// so that every decoder (the prewarm's, the GEMMs') evaluates the same expression per value.
struct RunScale {
    float d;  // the multiplier of the integer
    float m;  // the min subtracted after (Q4_K, Q5_K; 0 otherwise, never read)
};

template <int Q>
constexpr int kRun = 32;  // Q4_0, Q8_0 (the block), Q4_K, Q5_K, IQ4_XS (the sub-block)
template <>
constexpr int kRun<PF_QTYPE_Q6_K> = 16;  // one int8 scale per 16 elements

template <int Q>
__device__ RunScale run_scale(const uint8_t *s, uint32_t bo, int i0);
template <int Q>
__device__ void run_values8(const uint8_t *s, uint32_t bo, int i0, RunScale sc, float *v);

template <int Q>
__device__ __forceinline__ void decode8_stage(const uint8_t *s, uint32_t bo, int i0, float *v) {
    run_values8<Q>(s, bo, i0, run_scale<Q>(s, bo, i0), v);
}

// Q4_0 and Q8_0: d, the block's fp16 scale.
template <>
__device__ __forceinline__ RunScale run_scale<PF_QTYPE_Q4_0>(const uint8_t *s, uint32_t bo, int) {
    return {stage_half(s, bo), 0.0f};
}
template <>
__device__ __forceinline__ void run_values8<PF_QTYPE_Q4_0>(const uint8_t *s, uint32_t bo, int i0, RunScale sc,
                                                           float *v) {
    const uint2 q = stage8_even(s, bo + 2 + (i0 & 15));
    const int sh = (i0 >> 4) << 2;
    const uint32_t w[2] = {(q.x >> sh) & 0x0F0F0F0Fu, (q.y >> sh) & 0x0F0F0F0Fu};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = sc.d * (biased_byte(w[e >> 2], e & 3) - (kTwo23 + 8.0f));
}

template <>
__device__ __forceinline__ RunScale run_scale<PF_QTYPE_Q8_0>(const uint8_t *s, uint32_t bo, int) {
    return {stage_half(s, bo), 0.0f};
}
template <>
__device__ __forceinline__ void run_values8<PF_QTYPE_Q8_0>(const uint8_t *s, uint32_t bo, int i0, RunScale sc,
                                                           float *v) {
    const uint2 q = stage8_even(s, bo + 2 + i0);
    // int8 x as the byte x + 128: flipping the sign bit of its two's complement.
    const uint32_t w[2] = {q.x ^ 0x80808080u, q.y ^ 0x80808080u};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = sc.d * (biased_byte(w[e >> 2], e & 3) - (kTwo23 + 128.0f));
}

// d * sc and dmin * m of sub-block j of a Q4_K / Q5_K block in the stage: k4_scale_min's
// products (quant.cuh), the 6-bit integers made floats exactly.
template <class Block>
__device__ __forceinline__ void k4_scale_min_stage(const Block *b, int j, float &d1, float &m1) {
    int sc, m;
    get_scale_min_k4(j, b->scales, sc, m);
    d1 = __half2float(b->d) * (biased_uint(uint32_t(sc)) - kTwo23);
    m1 = __half2float(b->dmin) * (biased_uint(uint32_t(m)) - kTwo23);
}

// The run (sub-block) scale and min of a Q4_K / Q5_K block at byte bo.
template <class Block>
__device__ __forceinline__ RunScale k4_run_scale(const uint8_t *s, uint32_t bo, int i0) {
    RunScale r;
    k4_scale_min_stage(reinterpret_cast<const Block *>(s + bo), i0 >> 5, r.d, r.m);
    return r;
}

// Q4_K and Q5_K blocks (144 and 176 bytes) start 16-byte aligned in the stage.
template <>
__device__ __forceinline__ RunScale run_scale<PF_QTYPE_Q4_K>(const uint8_t *s, uint32_t bo, int i0) {
    return k4_run_scale<block_q4_K>(s, bo, i0);
}
template <>
__device__ __forceinline__ void run_values8<PF_QTYPE_Q4_K>(const uint8_t *s, uint32_t bo, int i0, RunScale sc,
                                                           float *v) {
    const int j = i0 >> 5;
    const uint2 q = stage8_aligned(s, bo + offsetof(block_q4_K, qs) + (j >> 1) * 32 + (i0 & 31));
    const int sh = (j & 1) << 2;
    const uint32_t w[2] = {(q.x >> sh) & 0x0F0F0F0Fu, (q.y >> sh) & 0x0F0F0F0Fu};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = sc.d * (biased_byte(w[e >> 2], e & 3) - kTwo23) - sc.m;
}

template <>
__device__ __forceinline__ RunScale run_scale<PF_QTYPE_Q5_K>(const uint8_t *s, uint32_t bo, int i0) {
    return k4_run_scale<block_q5_K>(s, bo, i0);
}
template <>
__device__ __forceinline__ void run_values8<PF_QTYPE_Q5_K>(const uint8_t *s, uint32_t bo, int i0, RunScale sc,
                                                           float *v) {
    const int j = i0 >> 5, l0 = i0 & 31;
    const uint2 q = stage8_aligned(s, bo + offsetof(block_q5_K, qs) + (j >> 1) * 32 + l0);
    const uint2 h = stage8_aligned(s, bo + offsetof(block_q5_K, qh) + l0);
    const int sh = (j & 1) << 2;
    // Per byte: the nibble, and bit j of the qh byte as bit 4 (a shift of the whole word by
    // j <= 7 brings bit j of every byte to that byte's bit 0).
    const uint32_t w[2] = {((q.x >> sh) & 0x0F0F0F0Fu) | (((h.x >> j) & 0x01010101u) << 4),
                           ((q.y >> sh) & 0x0F0F0F0Fu) | (((h.y >> j) & 0x01010101u) << 4)};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = sc.d * (biased_byte(w[e >> 2], e & 3) - kTwo23) - sc.m;
}

// Q6_K: d times the int8 scale of the 16 elements (as the byte scale + 128: sign bit flipped,
// as for Q8_0).
template <>
__device__ __forceinline__ RunScale run_scale<PF_QTYPE_Q6_K>(const uint8_t *s, uint32_t bo, int i0) {
    const uint32_t sc = uint32_t(s[bo + offsetof(block_q6_K, scales) + (i0 >> 4)]) ^ 0x80u;
    return {stage_half(s, bo + offsetof(block_q6_K, d)) * (biased_uint(sc) - (kTwo23 + 128.0f)), 0.0f};
}
template <>
__device__ __forceinline__ void run_values8<PF_QTYPE_Q6_K>(const uint8_t *s, uint32_t bo, int i0, RunScale sc,
                                                           float *v) {
    const int h = i0 >> 7, r0 = i0 & 127;  // 8 elements: one half, one 16-group, no wrap
    const uint2 ql = stage8_even(s, bo + offsetof(block_q6_K, ql) + h * 64 + (r0 & 63));
    const uint2 qh = stage8_even(s, bo + offsetof(block_q6_K, qh) + h * 32 + (r0 & 31));
    const int shl = (r0 >> 6) << 2, shh = (r0 >> 5) << 1;
    // Per byte: the low nibble and the 2 high bits above it, q in [0, 63]; the value is q - 32.
    const uint32_t w[2] = {((ql.x >> shl) & 0x0F0F0F0Fu) | (((qh.x >> shh) & 0x03030303u) << 4),
                           ((ql.y >> shl) & 0x0F0F0F0Fu) | (((qh.y >> shh) & 0x03030303u) << 4)};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = sc.d * (biased_byte(w[e >> 2], e & 3) - (kTwo23 + 32.0f));
}

// The IQ4_NL code book (quant.cuh kIq4nlLo / kIq4nlHi) with every code's sign bit flipped: the
// byte of code c is c + 128, ready for the bias trick.
constexpr uint64_t kIq4nlLoBiased = kIq4nlLo ^ 0x8080808080808080ull;
constexpr uint64_t kIq4nlHiBiased = kIq4nlHi ^ 0x8080808080808080ull;

// IQ4_XS blocks (136 bytes) start 8-byte aligned in the stage; qs sits at byte 8. The scale:
// iq4xs_scale (quant.cuh), d * (ls - 32), ls the 6-bit scale, made a float exactly.
template <>
__device__ __forceinline__ RunScale run_scale<PF_QTYPE_IQ4_XS>(const uint8_t *s, uint32_t bo, int i0) {
    const block_iq4_xs *b = reinterpret_cast<const block_iq4_xs *>(s + bo);
    const int ib = i0 >> 5;
    const uint32_t ls = ((b->scales_l[ib >> 1] >> ((ib & 1) << 2)) & 0xFu) |
                        (((uint32_t(b->scales_h) >> (2 * ib)) & 3u) << 4);
    return {__half2float(b->d) * (biased_uint(ls) - (kTwo23 + 32.0f)), 0.0f};
}
template <>
__device__ __forceinline__ void run_values8<PF_QTYPE_IQ4_XS>(const uint8_t *s, uint32_t bo, int i0, RunScale sc,
                                                             float *v) {
    const int ib = i0 >> 5, j0 = i0 & 31;
    const uint2 q = stage8_aligned(s, bo + offsetof(block_iq4_xs, qs) + ib * 16 + (j0 & 15));
    const int sh = (j0 >> 4) << 2;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const uint32_t c = uint32_t(byte_at(q, e) >> sh) & 0xFu;
        const uint64_t t = c < 8 ? kIq4nlLoBiased : kIq4nlHiBiased;
        v[e] = sc.d * (biased_uint(uint32_t(t >> ((c & 7) * 8)) & 0xFFu) - (kTwo23 + 128.0f));
    }
}

// ------------------------------------------------------------------ two elements at a time
//
// decode2_stage<Q>(s, bo, i0, v): elements i0 and i0 + 1 (i0 even) of the block at byte bo of the
// stage, for a thread that needs two adjacent elements (the register fragment of the GEMMs with
// the weight as the A operand: q16_raw.cuh decode_fragment); each value by the same expression as
// decode8_stage's, so bit for bit its value. Q4_K and Q5_K: decode2x2_stage below (a fragment's
// two pairs share their 6-bit scale and min). The two quants come as one 16-bit load (every field
// of every type sits at an even offset of an even-aligned block).

__device__ __forceinline__ uint32_t stage2(const uint8_t *s, uint32_t off) {
    return *reinterpret_cast<const uint16_t *>(s + off);
}

template <int Q>
__device__ void decode2_stage(const uint8_t *s, uint32_t bo, int i0, float *v);

template <>
__device__ __forceinline__ void decode2_stage<PF_QTYPE_Q4_0>(const uint8_t *s, uint32_t bo, int i0, float *v) {
    const float d = stage_half(s, bo);
    const uint32_t w = (stage2(s, bo + 2 + (i0 & 15)) >> ((i0 >> 4) << 2)) & 0x0F0Fu;
#pragma unroll
    for (int e = 0; e < 2; ++e) v[e] = d * (biased_byte(w, e) - (kTwo23 + 8.0f));
}

template <>
__device__ __forceinline__ void decode2_stage<PF_QTYPE_Q8_0>(const uint8_t *s, uint32_t bo, int i0, float *v) {
    const float d = stage_half(s, bo);
    const uint32_t w = stage2(s, bo + 2 + i0) ^ 0x8080u;
#pragma unroll
    for (int e = 0; e < 2; ++e) v[e] = d * (biased_byte(w, e) - (kTwo23 + 128.0f));
}

template <>
__device__ __forceinline__ void decode2_stage<PF_QTYPE_Q6_K>(const uint8_t *s, uint32_t bo, int i0, float *v) {
    const int h = i0 >> 7, r0 = i0 & 127;
    const uint32_t ql = stage2(s, bo + offsetof(block_q6_K, ql) + h * 64 + (r0 & 63));
    const uint32_t qh = stage2(s, bo + offsetof(block_q6_K, qh) + h * 32 + (r0 & 31));
    const uint32_t sc = uint32_t(s[bo + offsetof(block_q6_K, scales) + (i0 >> 4)]) ^ 0x80u;
    const float sd = stage_half(s, bo + offsetof(block_q6_K, d)) * (biased_uint(sc) - (kTwo23 + 128.0f));
    const uint32_t w = ((ql >> ((r0 >> 6) << 2)) & 0x0F0Fu) | (((qh >> ((r0 >> 5) << 1)) & 0x0303u) << 4);
#pragma unroll
    for (int e = 0; e < 2; ++e) v[e] = sd * (biased_byte(w, e) - (kTwo23 + 32.0f));
}

template <>
__device__ __forceinline__ void decode2_stage<PF_QTYPE_IQ4_XS>(const uint8_t *s, uint32_t bo, int i0, float *v) {
    const block_iq4_xs *b = reinterpret_cast<const block_iq4_xs *>(s + bo);
    const int ib = i0 >> 5, j0 = i0 & 31;
    const uint32_t ls = ((b->scales_l[ib >> 1] >> ((ib & 1) << 2)) & 0xFu) |
                        (((uint32_t(b->scales_h) >> (2 * ib)) & 3u) << 4);
    const float dl = __half2float(b->d) * (biased_uint(ls) - (kTwo23 + 32.0f));
    const uint32_t q = stage2(s, bo + offsetof(block_iq4_xs, qs) + ib * 16 + (j0 & 15));
    const int sh = (j0 >> 4) << 2;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const uint32_t c = ((q >> (8 * e)) >> sh) & 0xFu;
        const uint64_t t = c < 8 ? kIq4nlLoBiased : kIq4nlHiBiased;
        v[e] = dl * (biased_uint(uint32_t(t >> ((c & 7) * 8)) & 0xFFu) - (kTwo23 + 128.0f));
    }
}

// decode2x2_stage<Q>(s, bo, i0, v): elements i0, i0 + 1 (v[0], v[1]) and i0 + 8, i0 + 9 (v[2],
// v[3]) of a Q4_K or Q5_K block at byte bo, i0 even with i0 % 16 < 8: a thread's two pairs of one
// 16-column step of the register fragment, which lie in one 32-element sub-block, so its 6-bit
// scale and min are decoded once; each value by decode8_stage's expression. (The other types'
// scales are one or two loads: they decode pair by pair, decode2_stage.)
template <int Q>
__device__ void decode2x2_stage(const uint8_t *s, uint32_t bo, int i0, float *v);

template <>
__device__ __forceinline__ void decode2x2_stage<PF_QTYPE_Q4_K>(const uint8_t *s, uint32_t bo, int i0, float *v) {
    const block_q4_K *b = reinterpret_cast<const block_q4_K *>(s + bo);
    const int j = i0 >> 5;
    float d1, m1;
    k4_scale_min_stage(b, j, d1, m1);
    const uint32_t at = bo + offsetof(block_q4_K, qs) + (j >> 1) * 32 + (i0 & 31), sh = (j & 1) << 2;
    const uint32_t w[2] = {(stage2(s, at) >> sh) & 0x0F0Fu, (stage2(s, at + 8) >> sh) & 0x0F0Fu};
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = d1 * (biased_byte(w[e >> 1], e & 1) - kTwo23) - m1;
}

template <>
__device__ __forceinline__ void decode2x2_stage<PF_QTYPE_Q5_K>(const uint8_t *s, uint32_t bo, int i0, float *v) {
    const block_q5_K *b = reinterpret_cast<const block_q5_K *>(s + bo);
    const int j = i0 >> 5, l0 = i0 & 31;
    float d1, m1;
    k4_scale_min_stage(b, j, d1, m1);
    const uint32_t at = bo + offsetof(block_q5_K, qs) + (j >> 1) * 32 + l0, ah = bo + offsetof(block_q5_K, qh) + l0;
    const uint32_t sh = (j & 1) << 2;
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        w[h] = ((stage2(s, at + 8 * h) >> sh) & 0x0F0Fu) | (((stage2(s, ah + 8 * h) >> j) & 0x0101u) << 4);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = d1 * (biased_byte(w[e >> 1], e & 1) - kTwo23) - m1;
}

}  // namespace pf
