// gemm_q16_gemv_kernel.cuh — the f16 leg's product on the GGUF blocks for 1 to 16 rows of X (decode
// steps, short batch items) with the scales applied outside the weight operand: Y[rows][n] (+)=
// X[rows][k] . W^T, W the blocks' exact values (the f32 leg's operand: d * sc * q - dmin * m), X
// the f16 leg's fp16 rows, mma.m16n8k16 with fp32 accumulation, the rows' inverse scales in the
// store. Q4_K, Q5_K and Q6_K (a Q4_K_M file's types: Q6_K its LM head and half its ffn_down /
// attn_v, Q5_K where llama.cpp's mix asks for more bits).
//
// Why another form: the few-rows form (gemm_q16_skinny_kernel.cuh) decodes every weight to the
// prewarm's fp16 by the prewarm's fp32 expression, ~9 instructions a weight in all (session 39's
// ncu), so it is issue-bound at 0.8-1.7 TB/s of blocks where the H200 reads 4.8. Here the weight
// operand is an exact small integer in fp16 and the per-block scales go to the fp32 accumulators:
//  - Q4_K's 4-bit quant q becomes the fp16 1024 + q by one LOP3 (the bias trick of Marlin and
//    FasterTransformer: 0x6400 | q), the high nibble 1024 + 16 q in place; one HFMA2 makes sc * q
//    exactly (sc the 6-bit sub-block scale: sc * q <= 945, an integer fp16 holds exactly; the fused
//    multiply-add rounds once, from the exact sc * q). So A = sc * q, a k16 step's four lanes'
//    columns may come from four sub-blocks with their own scales.
//  - The mins: a second mma on the same X fragments with A = m (the 6-bit min, constant over its
//    sub-block) gives sum_j m_j sum_{i in j} x_i with exact products.
//  - Per 256-column block and row: y += d * acc(sc q) - dmin * acc(m), in fp32.
//  - Q6_K (struct Q6K): its int8 scale times q - 32 can pass 2048, which fp16 does not hold
//    exactly, so the scale goes in two parts, 16 a + b, two exact operands and two mma.
// 3.5 (Q4_K) and 6.4 (Q6_K) instructions a weight by ncu instead of 9. The values: every product
// d sc q x and dmin m x exact before fp32 sums, so the result is the exact weight's (the f32 leg's),
// within fp32 accumulation; against the fp16 cache's GEMM it differs by the cache's rounding of the
// weight to fp16 (|dw| <= 2^-11 |w|). With X's row a unit vector the output is the fp32 value the
// prewarm rounds to fp16 (d sc q - dmin m rounded once from exact terms; Q6_K d sc (q - 32)),
// exactly.
//
// The layout (Q4_K; Q6_K's in struct Q6K). A block has 8 warps: RG groups of 16 weight rows x KS
// slices of K (RG KS = 8, the host's choice: kslices), a warp owns its group's 16 rows over its
// slice's blocks. Lane (g, t): rows g and g + 8 of the group (mma's A rows), tokens g (and 8 + g:
// NT = 2) of X (mma's N). In a block, lane t reads the 32 bytes of qs that hold sub-blocks 2t (low
// nibbles) and 2t + 1 (high nibbles): step s (0..15) of the block takes the bytes 4 (s % 8) .. + 3
// of them, nibbles s / 8, as lane t's k slots (2t, 2t + 1) <- elements 0, 1 and (2t + 8, 2t + 9) <-
// elements 2, 3 (a PRMT puts two bytes in the two halves of a word, a LOP3 masks a nibble and adds
// 0x6400); X's B fragment takes the same four columns, 8 contiguous bytes of X. So the four lanes
// of a quad read 128 contiguous bytes of qs and 128 of X a block, straight from global memory (the
// read-only path), one block ahead in registers. The K slices' partial tiles are summed in shared
// memory in slice order (the same bits run to run), then stored. Rows of W past n are read at
// row n - 1 and not stored; rows of X past `rows` are zeros.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/dequant/quant.cuh"
#include "ptx/mma.cuh"

namespace pf {
namespace q16v {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;  // two token tiles of 8

// One matrix of the launch: a fused group's parts (Q|K|V, gate|up, ...) run as one grid, their
// 16-row groups side by side, each part's outputs at its columns of y.
struct GemvPart {
    const uint8_t *w;   // the part's blocks, row 0, rows GemvArgs::row_bytes apart (gemv_aligned)
    int32_t n;          // its rows
    int32_t col;        // its first column of y
    int32_t group0;     // its first 16-row group in the grid's order
};
constexpr int kMaxParts = 4;

struct GemvArgs {
    GemvPart part[kMaxParts];
    int32_t nparts;     // 1..kMaxParts, all of one type and k
    int32_t groups;     // the parts' 16-row groups in all
    int64_t row_bytes;
    const __half *x;    // [rows][k] fp16, 16-byte aligned
    float *y;           // [rows][ldy]
    int64_t ldy;
    const float *inv;   // the rows' inverse scales, or nullptr
    int32_t rows, k;
    int32_t kslices;    // KS: 1, 2, 4 or 8
    int32_t accumulate;
};

// A's parts laid out: group0 of each, and `groups` in all.
inline void gemv_layout(GemvArgs &a) {
    int32_t g = 0;
    for (int i = 0; i < a.nparts; ++i) {
        a.part[i].group0 = g;
        g += (a.part[i].n + 15) / 16;
    }
    a.groups = g;
}

// The types this form reads.
constexpr bool gemv_type(int q) { return q == PF_QTYPE_Q4_K || q == PF_QTYPE_Q5_K || q == PF_QTYPE_Q6_K; }
// Whether its loads suit the blocks at w, rows row_bytes apart: Q4_K's and Q5_K's 16-byte vectors
// need rows on 16-byte boundaries; Q6_K's 210-byte blocks are read as words from 2-byte boundaries.
inline bool gemv_aligned(int q, const void *w, int64_t row_bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(w);
    return q == PF_QTYPE_Q6_K ? p % 2 == 0 && row_bytes % 2 == 0 : p % 16 == 0 && row_bytes % 16 == 0;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

__device__ __forceinline__ uint4 ldg_nc16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

// A PRMT selector putting bytes lo and lo + 1 of x into the low bytes of the two halves, byte 0
// of y (0x64) above each: with y = 0x64646464, the fp16 pair (1024 + x[lo], 1024 + x[lo + 1]).
__host__ __device__ constexpr uint32_t byte_pair_sel(uint32_t lo) {
    return lo | (4u << 4) | ((lo + 1u) << 8) | (4u << 12);
}

// (a & B) | c in one LOP3: ptxas gives a LOP3 one immediate, so with c a register (the fp16
// exponent 0x64006400, kept in one) the mask and the or stay one instruction, not two.
template <uint32_t B>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(B), "r"(c));
    return d;
}
// 0x64006400 in a register (the fp16 pair 1024, 1024: the bias of the quants' fp16 form).
__device__ __forceinline__ uint32_t k6464() {
    uint32_t k;
    asm("mov.b32 %0, 0x64006400;" : "=r"(k));
    return k;
}

// A step's two products on its X columns, for each token tile: p += ap . X, q += aq . X, X's B
// fragment from xv[nt][m], the uint4 that holds the step's 4 columns (columns 0, 1 and 2, 3 of its
// half i % 2).
template <int NT>
__device__ __forceinline__ void mma_pair(float (&p)[NT][4], const uint32_t (&ap)[4], float (&q)[NT][4],
                                         const uint32_t (&aq)[4], const uint4 (&xv)[NT][8], int m, int i) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const uint4 &v = xv[nt][m];
        const uint32_t bx = (i & 1) ? v.z : v.x, by = (i & 1) ? v.w : v.y;
        mma_m16n8k16(p[nt], ap, bx, by);
        mma_m16n8k16(q[nt], aq, bx, by);
    }
}

// ---------------------------------------------------------------------------- Q4_K, Q5_K
//
// Lane t of a row: the header (d, dmin, the 12 scale bytes) and the 32 bytes of qs that hold
// sub-blocks 2t (low nibbles) and 2t + 1 (high nibbles); Q5_K also the 32 bytes of qh (byte l: the
// fifth bit of element l of sub-block j in bit j). Step (h, i): word i's nibbles h, elements 4 i ..
// 4 i + 3 of sub-block 2t + h, X columns 64 t + 32 h + 4 i of the block. Q5_K's q < 32: sc q <=
// 1953, still an integer fp16 holds exactly.
template <bool kQ5>
struct QK {
    using Block = std::conditional_t<kQ5, block_q5_K, block_q4_K>;
    static constexpr int kQs = int(offsetof(Block, qs));
    struct Raw {
        uint4 head, qa, qb;
        uint4 ha, hb;  // Q5_K: qh (unused for Q4_K)
    };
    // The lane's X columns of a block: its uint4 m (8 columns) starts at this column.
    __device__ static __forceinline__ int xcol(int t, int m) { return 64 * t + 8 * m; }
    __device__ static __forceinline__ Raw load(const uint8_t *row, int blk, int t) {
        const uint8_t *b = row + int64_t(blk) * sizeof(Block);
        Raw r;
        r.head = ldg_nc16(b);
        r.qa = ldg_nc16(b + kQs + 32 * t);
        r.qb = ldg_nc16(b + kQs + 16 + 32 * t);
        if constexpr (kQ5) {
            r.ha = ldg_nc16(b + offsetof(block_q5_K, qh));
            r.hb = ldg_nc16(b + offsetof(block_q5_K, qh) + 16);
        } else {  // never read (the compiler drops them); set so that no copy reads indeterminate values
            r.ha = r.hb = make_uint4(0, 0, 0, 0);
        }
        return r;
    }
    // One row's operands: the sub-blocks' fp16 multipliers and addends (low nibbles: sc, -1024 sc;
    // high nibbles, held as 1024 + 16 q: sc / 16, -64 sc), the mins, d and dmin.
    struct Scales {
        __half2 mul, add, mins;  // .x: sub-block 2t, .y: 2t + 1
        float d, dmin;
    };
    __device__ static __forceinline__ Scales scales(const uint4 &head, int t) {
        // get_scale_min_k4 for all 8 sub-blocks at once, byte-wise: sc 0-3 and m 0-3 are the low 6
        // bits of scales[0..3] and [4..7]; sc 4-7 the low nibbles of scales[8..11] with the top 2
        // bits of scales[0..3] above them, m 4-7 the high nibbles with the top bits of scales[4..7].
        const uint32_t s0 = head.y, s1 = head.z, s2 = head.w;
        const uint32_t sc = t < 2 ? (s0 & 0x3F3F3F3Fu) : ((s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u));
        const uint32_t mn = t < 2 ? (s1 & 0x3F3F3F3Fu) : (((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u));
        const uint32_t sel = byte_pair_sel(2u * uint32_t(t & 1));
        const __half2 k1024 = __float2half2_rn(1024.0f);
        const __half2 scs = __hsub2(u2h(__byte_perm(sc, 0x64646464u, sel)), k1024);  // exact
        Scales r;
        r.mul = __hmul2(scs, __halves2half2(__float2half_rn(1.0f), __float2half_rn(0.0625f)));  // exact
        r.add = __hmul2(r.mul, __float2half2_rn(-1024.0f));                                     // exact
        r.mins = __hsub2(u2h(__byte_perm(mn, 0x64646464u, sel)), k1024);
        const __half2 dd = u2h(head.x);
        r.d = __low2float(dd);
        r.dmin = __high2float(dd);
        return r;
    }
    // Step (H, word w)'s A operands of one row: k slots (2t, 2t + 1) and (2t + 8, 2t + 9). hs: Q5_K's
    // qh word of the step shifted right by 2t (bit 0 of each byte: sub-block 2t's fifth bit, bit 1:
    // 2t + 1's), moved above the nibble (to bit 4, or 8 for the high nibble's 1024 + 16 q).
    template <int H>
    __device__ static __forceinline__ void step(uint32_t w, uint32_t hs, const Scales &s, uint32_t &a01,
                                                uint32_t &a23) {
        constexpr uint32_t kMask = H == 0 ? 0x000F000Fu : 0x00F000F0u, kBit = H == 0 ? 0x00100010u : 0x01000100u;
        const uint32_t b01 = __byte_perm(w, 0u, 0x1100u), b23 = __byte_perm(w, 0u, 0x3322u);
        const __half2 mul = H == 0 ? __low2half2(s.mul) : __high2half2(s.mul);
        const __half2 add = H == 0 ? __low2half2(s.add) : __high2half2(s.add);
        const uint32_t k = k6464();
        uint32_t v01 = and_or<kMask>(b01, k), v23 = and_or<kMask>(b23, k);
        if constexpr (kQ5) {
            constexpr int kUp = H == 0 ? 4 : 7;
            v01 = and_or<kBit>(__byte_perm(hs, 0u, 0x1100u) << kUp, v01);
            v23 = and_or<kBit>(__byte_perm(hs, 0u, 0x3322u) << kUp, v23);
        }
        a01 = h2u(__hfma2(u2h(v01), mul, add));
        a23 = h2u(__hfma2(u2h(v23), mul, add));
    }
    // One block of the lane's two rows into out: y += d * acc(sc q) - dmin * acc(m).
    template <int NT>
    __device__ static __forceinline__ void block(const Raw &r0, const Raw &r1, int t, const uint4 (&xv)[NT][8],
                                                 float (&out)[NT][4]) {
        const Scales s0 = scales(r0.head, t), s1 = scales(r1.head, t);
        float acc[NT][4], accm[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = accm[nt][e] = 0.0f;
        const uint32_t q0[8] = {r0.qa.x, r0.qa.y, r0.qa.z, r0.qa.w, r0.qb.x, r0.qb.y, r0.qb.z, r0.qb.w};
        const uint32_t q1[8] = {r1.qa.x, r1.qa.y, r1.qa.z, r1.qa.w, r1.qb.x, r1.qb.y, r1.qb.z, r1.qb.w};
        const uint32_t h0[8] = {r0.ha.x, r0.ha.y, r0.ha.z, r0.ha.w, r0.hb.x, r0.hb.y, r0.hb.z, r0.hb.w};
        const uint32_t h1[8] = {r1.ha.x, r1.ha.y, r1.ha.z, r1.ha.w, r1.hb.x, r1.hb.y, r1.hb.z, r1.hb.w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // the mins' A operand: m of sub-block 2t + h, rows g and g + 8
            const uint32_t m0 = h2u(h == 0 ? __low2half2(s0.mins) : __high2half2(s0.mins));
            const uint32_t m1 = h2u(h == 0 ? __low2half2(s1.mins) : __high2half2(s1.mins));
            const uint32_t am[4] = {m0, m1, m0, m1};
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t af[4];
                const uint32_t hs0 = kQ5 ? h0[i] >> (2 * t) : 0u, hs1 = kQ5 ? h1[i] >> (2 * t) : 0u;
                if (h == 0) {
                    step<0>(q0[i], hs0, s0, af[0], af[2]);
                    step<0>(q1[i], hs1, s1, af[1], af[3]);
                } else {
                    step<1>(q0[i], hs0, s0, af[0], af[2]);
                    step<1>(q1[i], hs1, s1, af[1], af[3]);
                }
                mma_pair<NT>(acc, af, accm, am, xv, 4 * h + i / 2, i);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float d = e < 2 ? s0.d : s1.d, dm = e < 2 ? s0.dmin : s1.dmin;
                out[nt][e] = fmaf(-dm, accm[nt][e], fmaf(d, acc[nt][e], out[nt][e]));
            }
    }
};

// ---------------------------------------------------------------------------- Q6_K
//
// A block: ql[128] (byte 64 h + m, m < 64: element 128 h + m in the low nibble, 128 h + m + 64 in
// the high), qh[64] (byte 32 h + l: the top 2 bits of elements 128 h + l + 32 c in bits 2c, 2c+1),
// 16 int8 scales (one per 16 elements), d; 210 bytes, so blocks start 2-byte aligned (words and a
// funnel shift: load32). The value d * sc * (q - 32), q in [0, 63]; sc (q - 32) can pass 2048, past
// what fp16 holds exactly, so sc = 16 a + b (b in [0, 15], a in [-8, 7]) and two products: A1 = b
// (q - 32), A2 = a (q - 32), each exact, y += d (acc1 + 16 acc2).
// Lane t of a row: ql bytes 32 t .. + 31 (half h = t / 2, m from 32 (t % 2)) and qh bytes 32 h ..
// + 31. Step (c, i): word i's low (c = 0: elements 128 h + 32 (t % 2) + 4 i ..) or high nibbles
// (c = 1: 64 further on), their top bits from qh word i, bits 2 (t % 2) + 4 c.
struct Q6K {
    struct Raw {
        uint32_t ql[8], qh[8];
        uint32_t sc;  // scale bytes of the lane's groups: low nibbles (i < 4, i >= 4), high nibbles (i < 4, >= 4)
        uint32_t d;   // the fp16 d in the low half
    };
    __device__ static __forceinline__ int xcol(int t, int m) {
        return 128 * (t >> 1) + 32 * (t & 1) + 64 * (m >> 2) + 8 * (m & 3);
    }
    // 32 bytes from a 2-byte aligned address: 9 aligned words, funnel-shifted by 0 or 16 bits.
    __device__ static __forceinline__ void load32(const uint8_t *p, uint32_t (&out)[8]) {
        const uint32_t *w = reinterpret_cast<const uint32_t *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
        const uint32_t sh = uint32_t(reinterpret_cast<uintptr_t>(p) & 2u) * 8u;
        uint32_t v[9];
#pragma unroll
        for (int j = 0; j < 9; ++j) v[j] = __ldg(w + j);
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j] = __funnelshift_r(v[j], v[j + 1], sh);
    }
    __device__ static __forceinline__ Raw load(const uint8_t *row, int blk, int t) {
        const uint8_t *b = row + int64_t(blk) * sizeof(block_q6_K);
        Raw r;
        load32(b + 32 * t, r.ql);
        load32(b + 128 + 32 * (t >> 1), r.qh);
        const uint16_t *sc = reinterpret_cast<const uint16_t *>(b + 192 + 8 * (t >> 1) + 2 * (t & 1));
        r.sc = uint32_t(__ldg(sc)) | (uint32_t(__ldg(sc + 2)) << 16);
        r.d = __ldg(reinterpret_cast<const uint16_t *>(b + 208));
        return r;
    }
    // One row's operands: per nibble set c and group half (i < 4, i >= 4), the multipliers and
    // addends of A1 (b) and A2 (a): low nibbles (1024 + q): b, -1056 b; high (1024 + 16 q): b / 16, -96 b.
    struct Scales {
        __half2 mb[2], ab[2], ma[2], aa[2];  // [c]; .x: words 0-3, .y: 4-7
        float d;
    };
    __device__ static __forceinline__ Scales scales(const Raw &r) {
        const uint32_t b = r.sc & 0x0F0F0F0Fu;                              // b per byte
        const uint32_t a8 = ((r.sc >> 4) & 0x0F0F0F0Fu) ^ 0x08080808u;     // a + 8 per byte
        Scales s;
        const __half2 k1024 = __float2half2_rn(1024.0f), k1032 = __float2half2_rn(1032.0f);
        const __half2 bl = __hsub2(u2h(__byte_perm(b, 0x64646464u, byte_pair_sel(0))), k1024);
        const __half2 bh = __hsub2(u2h(__byte_perm(b, 0x64646464u, byte_pair_sel(2))), k1024);
        const __half2 al = __hsub2(u2h(__byte_perm(a8, 0x64646464u, byte_pair_sel(0))), k1032);
        const __half2 ah = __hsub2(u2h(__byte_perm(a8, 0x64646464u, byte_pair_sel(2))), k1032);
        const __half2 k16 = __float2half2_rn(0.0625f), km1056 = __float2half2_rn(-1056.0f),
                      km96 = __float2half2_rn(-96.0f);
        s.mb[0] = bl;
        s.ab[0] = __hmul2(bl, km1056);
        s.ma[0] = al;
        s.aa[0] = __hmul2(al, km1056);
        s.mb[1] = __hmul2(bh, k16);
        s.ab[1] = __hmul2(bh, km96);
        s.ma[1] = __hmul2(ah, k16);
        s.aa[1] = __hmul2(ah, km96);
        s.d = __half2float(__ushort_as_half(uint16_t(r.d)));
        return s;
    }
    // Step (C, word i)'s two A operands of one row (A1 = b (q - 32), A2 = a (q - 32)), k slots
    // (2t, 2t + 1) and (2t + 8, 2t + 9); qsh = 4 - 2 (t % 2) brings the top bits under the nibble.
    template <int C>
    __device__ static __forceinline__ void step(uint32_t ql, uint32_t qh, uint32_t qsh, const Scales &s, int i,
                                                uint32_t (&a1)[2], uint32_t (&a2)[2]) {
        constexpr uint32_t kLo = C == 0 ? 0x000F000Fu : 0x00F000F0u, kHi = C == 0 ? 0x00300030u : 0x03000300u;
        const __half2 mb = i < 4 ? __low2half2(s.mb[C]) : __high2half2(s.mb[C]);
        const __half2 ab = i < 4 ? __low2half2(s.ab[C]) : __high2half2(s.ab[C]);
        const __half2 ma = i < 4 ? __low2half2(s.ma[C]) : __high2half2(s.ma[C]);
        const __half2 aa = i < 4 ? __low2half2(s.aa[C]) : __high2half2(s.aa[C]);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint32_t sel = p == 0 ? 0x1100u : 0x3322u;
            const uint32_t lq = __byte_perm(ql, 0u, sel), hq = __byte_perm(qh, 0u, sel) << qsh;
            const __half2 v = u2h(and_or<kHi>(hq, and_or<kLo>(lq, k6464())));  // 1024 + q (C = 1: 1024 + 16 q)
            a1[p] = h2u(__hfma2(v, mb, ab));
            a2[p] = h2u(__hfma2(v, ma, aa));
        }
    }
    template <int NT>
    __device__ static __forceinline__ void block(const Raw &r0, const Raw &r1, int t, const uint4 (&xv)[NT][8],
                                                 float (&out)[NT][4]) {
        const Scales s0 = scales(r0), s1 = scales(r1);
        const uint32_t qsh = 4u - 2u * uint32_t(t & 1);
        float acc1[NT][4], acc2[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc1[nt][e] = acc2[nt][e] = 0.0f;
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t x1[2], x2[2], y1[2], y2[2];  // rows g (x) and g + 8 (y)
                if (c == 0) {
                    step<0>(r0.ql[i], r0.qh[i], qsh, s0, i, x1, x2);
                    step<0>(r1.ql[i], r1.qh[i], qsh, s1, i, y1, y2);
                } else {
                    step<1>(r0.ql[i], r0.qh[i], qsh, s0, i, x1, x2);
                    step<1>(r1.ql[i], r1.qh[i], qsh, s1, i, y1, y2);
                }
                const uint32_t f1[4] = {x1[0], y1[0], x1[1], y1[1]}, f2[4] = {x2[0], y2[0], x2[1], y2[1]};
                mma_pair<NT>(acc1, f1, acc2, f2, xv, 4 * c + i / 2, i);
            }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                out[nt][e] = fmaf(e < 2 ? s0.d : s1.d, fmaf(16.0f, acc2[nt][e], acc1[nt][e]), out[nt][e]);
    }
};

template <int Q>
struct GemvType;
template <>
struct GemvType<PF_QTYPE_Q4_K> {
    using D = QK<false>;
};
template <>
struct GemvType<PF_QTYPE_Q5_K> {
    using D = QK<true>;
};
template <>
struct GemvType<PF_QTYPE_Q6_K> {
    using D = Q6K;
};

// The tile of a warp: its group's 16 rows over its K slice, then its partial tile into `part`
// (part[warp][token][row]).
// The part holding 16-row group G of the grid (G past the last group: the last part, whose rows
// past its n are read at its row n - 1 and not stored).
__device__ __forceinline__ int part_of(const GemvArgs &a, int G) {
    int p = 0;
#pragma unroll
    for (int i = 1; i < kMaxParts; ++i)
        if (i < a.nparts && G >= a.part[i].group0) p = i;
    return p;
}

template <class D, int NT>
__device__ __forceinline__ void gemv_tile(const GemvArgs &a, float *part) {
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane >> 2, t = lane & 3;
    const int ks = warp % a.kslices, rg = warp / a.kslices, groups = kWarps / a.kslices;
    const int G = int(blockIdx.x) * groups + rg;
    const GemvPart &pt = a.part[part_of(a, G)];
    const int n0 = (G - pt.group0) * 16;
    const int nb = a.k / 256;
    const int b0 = ks * nb / a.kslices, b1 = (ks + 1) * nb / a.kslices;
    const uint8_t *row0 = pt.w + int64_t(min(n0 + g, pt.n - 1)) * a.row_bytes;
    const uint8_t *row1 = pt.w + int64_t(min(n0 + g + 8, pt.n - 1)) * a.row_bytes;
    bool tok_in[NT];
    const __half *xrow[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        tok_in[nt] = 8 * nt + g < a.rows;
        xrow[nt] = a.x + int64_t(tok_in[nt] ? 8 * nt + g : 0) * a.k;
    }
    float out[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[nt][e] = 0.0f;
    const auto x_load = [&](int blk, uint4 (&xv)[NT][8]) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int m = 0; m < 8; ++m)
                xv[nt][m] = tok_in[nt] ? ldg_nc16(xrow[nt] + int64_t(blk) * 256 + D::xcol(t, m))
                                       : make_uint4(0, 0, 0, 0);
    };
    // Block blk + 1's bytes in flight while blk's are multiplied. (Two register sets in turn
    // instead of the copy spilled and ran 0.84-0.98x, bench_gemm_q16 on the H200, session 41.)
    typename D::Raw w0, w1;
    if (b0 < b1) {
        w0 = D::load(row0, b0, t);
        w1 = D::load(row1, b0, t);
    }
    for (int blk = b0; blk < b1; ++blk) {
        const typename D::Raw c0 = w0, c1 = w1;
        if (blk + 1 < b1) {
            w0 = D::load(row0, blk + 1, t);
            w1 = D::load(row1, blk + 1, t);
        }
        uint4 xv[NT][8];
        x_load(blk, xv);
        D::template block<NT>(c0, c1, t, xv, out);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            part[(warp * 8 * NT + 8 * nt + 2 * t + (e & 1)) * 16 + g + 8 * (e >> 1)] = out[nt][e];
}

// Blocks an SM the registers are held to: two with one token tile (Q4_K fits 128 registers; Q6_K
// spills ~280 bytes there and still ran 1.00-1.19x its one-block build at one row, bench_gemm_q16
// on the H200, session 41: the LM head 248320 x 2560 0.3137 against 0.3327 ms); one with two.
template <int NT>
constexpr int kMinBlocks = NT == 1 ? 2 : 1;

template <int Q, int NT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<NT>) gemm_q16_gemv_kernel(const __grid_constant__ GemvArgs a) {
    __shared__ float part[kWarps * 8 * NT * 16];
    gemv_tile<typename GemvType<Q>::D, NT>(a, part);
    __syncthreads();
    const int groups = kWarps / a.kslices;
    const int rows = min(a.rows, 8 * NT);
    for (int i = int(threadIdx.x); i < groups * rows * 16; i += kThreads) {
        const int rg = i / (rows * 16), rest = i - rg * rows * 16, tok = rest / 16, r = rest % 16;
        const int G = int(blockIdx.x) * groups + rg;
        const GemvPart &pt = a.part[part_of(a, G)];
        const int c = (G - pt.group0) * 16 + r;  // the part's row
        if (G >= a.groups || c >= pt.n) continue;
        const int col = pt.col + c;
        float s = 0.0f;
        for (int ks = 0; ks < a.kslices; ++ks) s += part[((rg * a.kslices + ks) * 8 * NT + tok) * 16 + r];
        float *y = a.y + int64_t(tok) * a.ldy + col;
        const float v = a.accumulate ? *y + s : s;
        *y = a.inv ? v * a.inv[tok] : v;
    }
}

#else

template <int Q, int NT>
__global__ void gemm_q16_gemv_kernel(const __grid_constant__ GemvArgs) {}

#endif  // __CUDA_ARCH__ >= 800

// K slices per weight-row group: the fewest (1, 2, 4, 8) that give the grid 64 warps an SM (four
// waves of two blocks), then fewer while a slice would hold under 2.5 of the row's blocks (its
// first load's latency is a slice's fixed cost). bench_gemm_q16 on the H200 (session 41, one row,
// every count timed at the qwen35-4b and 27B shapes and the LM head, Q4_K and Q6_K): the fastest
// count or within 4% of it at each.
inline int pick_kslices(int64_t n, int64_t k, int sms) {
    const int64_t groups = (n + 15) / 16, nb = k / 256;
    int ks = 1;
    while (ks < kWarps && groups * ks < 64 * int64_t(sms)) ks *= 2;
    while (ks > 1 && 2 * nb < 5 * int64_t(ks)) ks /= 2;
    return ks;
}

template <int Q, int NT>
inline cudaError_t launch(const GemvArgs &a, cudaStream_t st) {
    bool parts_ok = a.nparts >= 1 && a.nparts <= kMaxParts;
    for (int i = 0; parts_ok && i < a.nparts; ++i)
        parts_ok = a.part[i].n >= 1 && gemv_aligned(Q, a.part[i].w, a.row_bytes) &&
                   a.part[i].group0 == (i == 0 ? 0 : a.part[i - 1].group0 + (a.part[i - 1].n + 15) / 16);
    if (!parts_ok || a.rows > 8 * NT || a.rows < 1 || a.k % 256 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 ||
        (a.kslices != 1 && a.kslices != 2 && a.kslices != 4 && a.kslices != 8))
        return cudaErrorInvalidValue;
    const int groups = kWarps / a.kslices;
    const unsigned grid = unsigned((int64_t(a.groups) + groups - 1) / groups);
    gemm_q16_gemv_kernel<Q, NT><<<grid, kThreads, 0, st>>>(a);
    return cudaGetLastError();
}

}  // namespace q16v
}  // namespace pf
