// q16_raw.cuh — what the GEMMs on the GGUF blocks share (gemm_q16_kernel.cuh: the weight decoded
// into shared memory, sm_90a; gemm_q16_rs_kernel.cuh and gemm_q16_mma_kernel.cuh: the weight as the
// register operand, sm_90a and sm_80): their arguments, the "raw" copies of the blocks in shared
// memory (supersteps of 256 columns of a tile's weight rows, one slot per row) and the decoding of
// a register fragment from them. Device code for compute capability 8.0 and up (cp.async).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dequant/decode_stage.cuh"
#include "ptx/mma.cuh"

namespace pf {
namespace q16 {

constexpr int kRawCols = 256;  // columns per raw superstep: one K-quant block per row

// The raw geometry of type Q: bytes of 256 columns of a row, and the slot a row's bytes take in
// a raw buffer: the bytes, up to 2 bytes of a leading half-word (4-byte word copies of a
// segment at an even address), 8 bytes the even-offset decoders may read past the end
// (stage8_even reads whole words), rounded up to 32 mod 64.
template <int Q>
struct RawGeom {
    static constexpr int kElems = qtraits<Q>::kElems;
    static constexpr int kBlock = qtraits<Q>::kBytes;
    static constexpr int kBytes = kRawCols / kElems * kBlock;
    static constexpr int kSlot = (kBytes + 12 - 32 + 63) / 64 * 64 + 32;
    static_assert(kSlot >= kBytes + 12 && kSlot % 64 == 32, "slot");
};

struct Q16Args {
    const uint8_t *w;    // the weight's GGUF blocks, row 0
    int64_t row_bytes;   // bytes from one weight row to the next
    float *y;            // [rows][ldy] fp32 output
    int64_t ldy;
    const float *inv;    // the inverse scales of X's rows (nullptr: every row unscaled)
    int32_t rows, n, k;
    int32_t m_tiles, n_tiles;
    int32_t accumulate;
    int32_t copy16;      // every raw segment 16-byte aligned and long: 16-byte copies
    int32_t y_vec2;      // y and ldy allow float2 stores
    int32_t tma_raw;     // rows and supersteps 16-byte aligned: gemm_q16_kernel (and the skinny form) copy them by TMA
};

// A kernel's arguments for y [rows][ldy] (+)= x16 . W^T (then times inv[row] where inv is not
// null), W [n][k] the GGUF blocks of type Q at `blocks` (k a whole number of blocks), in output
// tiles of tile_rows rows of X x tile_n weight rows. copy16 says
// whether the raw blocks may be copied 16 bytes at a time: where it is false, Q4_K and Q5_K (whose
// decoders read 8-byte aligned) do not run.
template <int Q>
inline Q16Args args_for(const void *blocks, int64_t n, int64_t k, const float *inv, int64_t rows, float *y,
                        int64_t ldy, bool accumulate, int tile_rows, int tile_n) {
    using G = RawGeom<Q>;
    Q16Args a{};
    a.w = static_cast<const uint8_t *>(blocks);
    a.row_bytes = k / G::kElems * G::kBlock;
    a.y = y;
    a.ldy = ldy;
    a.inv = inv;
    a.rows = int32_t(rows);
    a.n = int32_t(n);
    a.k = int32_t(k);
    a.m_tiles = int32_t((rows + tile_rows - 1) / tile_rows);
    a.n_tiles = int32_t((n + tile_n - 1) / tile_n);
    a.accumulate = accumulate ? 1 : 0;
    // 16-byte copies of the raw blocks where every row's segment of every superstep starts and
    // ends on 16 bytes (the last superstep of k % 256 != 0 holds fewer blocks).
    const int64_t tail = (k % kRawCols) / G::kElems * G::kBlock;
    a.copy16 = reinterpret_cast<uintptr_t>(blocks) % 16 == 0 && a.row_bytes % 16 == 0 && G::kBytes % 16 == 0 &&
               tail % 16 == 0;
    a.y_vec2 = reinterpret_cast<uintptr_t>(y) % 8 == 0 && ldy % 2 == 0;
    // a superstep's bytes of a row are 16-byte units from a 16-byte boundary (Q4_0, Q8_0, Q4_K,
    // Q5_K with the rows 16-byte aligned; not Q6_K's 210-byte or IQ4_XS's 136-byte blocks)
    a.tma_raw = reinterpret_cast<uintptr_t>(blocks) % 16 == 0 && a.row_bytes % 16 == 0 && G::kBytes % 16 == 0;
    return a;
}

// Output tile t of a raster in bands of `band` row tiles, the row tile fastest inside a band (so
// that the blocks resident at once share their weight tile's raw blocks in L2): its row tile mt and
// weight tile nt.
__host__ __device__ inline void band_tile(int t, int m_tiles, int n_tiles, int band, int &mt, int &nt) {
    const int band_tiles = band * n_tiles;
    const int b = t / band_tiles, in_band = t - b * band_tiles;
    const int rest = m_tiles - b * band, band_rows = rest < band ? rest : band;
    mt = b * band + in_band % band_rows;
    nt = in_band / band_rows;
}

#if defined(__CUDA_ARCH__)

// The byte at which the weight row n0 + r's segment of superstep j starts.
__device__ __forceinline__ const uint8_t *raw_src(const Q16Args &a, int n0, int r, int j, int seg_bytes) {
    return a.w + int64_t(n0 + r) * a.row_bytes + int64_t(j) * seg_bytes;
}

// Starts the copies of superstep j (columns 256 j ..) of the weight rows n0 .. n0 + raw_rows - 1
// into the raw buffer `raw` (one slot of RawGeom<Q>::kSlot bytes per row): thread `tid` of the
// `nthreads` that copy takes its share (the caller commits the group). Rows past n are not copied.
template <int Q>
__device__ __forceinline__ void raw_issue(const Q16Args &a, unsigned char *raw, int raw_rows, int n0, int j, int tid,
                                          int nthreads) {
    using G = RawGeom<Q>;
    const int c0 = j * kRawCols;
    const int cols = min(kRawCols, a.k - c0);  // a whole number of blocks (the host checks k)
    const int bytes = cols / G::kElems * G::kBlock;
    const int rows = min(raw_rows, a.n - n0);
    if (a.copy16) {
        const int chunks = bytes / 16;
        for (int i = tid; i < rows * chunks; i += nthreads) {
            const int r = i / chunks, c = i - r * chunks;
            cp_async16(raw + r * G::kSlot + 16 * c, raw_src(a, n0, r, j, G::kBytes) + 16 * c);
        }
        return;
    }
    // 4-byte words from the segment's start rounded down to a word: [o, o + bytes) of the slot
    // holds the segment (o = 0 or 2: blocks and rows have even sizes); a last half-word is
    // copied with a plain 2-byte load (never a word past the matrix's end).
    constexpr int kMaxWords = (G::kBytes + 2) / 4 + 1;
    for (int i = tid; i < rows * kMaxWords; i += nthreads) {
        const int r = i / kMaxWords, wi = i - r * kMaxWords;
        const uint8_t *src = raw_src(a, n0, r, j, G::kBytes);
        const uint32_t o = uint32_t(reinterpret_cast<uintptr_t>(src) & 3u);
        const uint8_t *w0 = src - o;
        const int full_words = int((o + uint32_t(bytes)) / 4u);
        unsigned char *dst = raw + r * G::kSlot;
        if (wi < full_words) {
            cp_async4_zfill(dst + 4 * wi, w0 + 4 * wi, true);
        } else if (wi == full_words && ((o + uint32_t(bytes)) & 3u) != 0) {
            *reinterpret_cast<uint16_t *>(dst + 4 * wi) = *reinterpret_cast<const uint16_t *>(w0 + 4 * wi);
        }
    }
}

// The A fragment of 16-column step `step` (columns 16 step ..) for weight rows r0 and r0 + 8 of
// the tile: a[0] = (r0, c, c + 1), a[1] = (r0 + 8, c, c + 1), a[2] = (r0, c + 8, c + 9), a[3] =
// (r0 + 8, c + 8, c + 9), c = 16 step + 2 tig (the mma.m16n8k16 A layout of the warp's 16 rows);
// zeros past column k. `raw`: the buffer of the step's superstep (raw_issue), holding the rows'
// blocks at offsets o0, o1 (0 or 2: the rows' segments as copied: raw_offset). The weight as the
// register operand of wgmma (gemm_q16_rs_kernel.cuh) or of mma.sync (gemm_q16_mma_kernel.cuh).
template <int Q>
__device__ __forceinline__ void decode_fragment(const Q16Args &a, const unsigned char *raw, int r0, uint32_t o0,
                                                uint32_t o1, int step, int tig, uint32_t (&frag)[4]) {
    using G = RawGeom<Q>;
    const int j = step / (kRawCols / 16);
    const int col = step * 16 + 2 * tig;
    const int e = col - j * kRawCols;  // the first element in the superstep (even, e % 16 < 8)
    const uint32_t bo = uint32_t(e / G::kElems * G::kBlock);  // columns c .. c + 9: one block
    const bool in = col < a.k;  // k is a multiple of 32: the step's 16 columns all in or all out
    if constexpr (Q == PF_QTYPE_Q4_K || Q == PF_QTYPE_Q5_K) {
        // their 6-bit scale and min decoded once per row for both pairs (decode2x2_stage)
        float v0[4], v1[4];  // rows r0 and r0 + 8: columns c, c + 1, c + 8, c + 9
        decode2x2_stage<Q>(raw + r0 * G::kSlot, o0 + bo, e % G::kElems, v0);
        decode2x2_stage<Q>(raw + (r0 + 8) * G::kSlot, o1 + bo, e % G::kElems, v1);
        frag[0] = in ? pack_half2(v0[0], v0[1]) : 0u;
        frag[1] = in ? pack_half2(v1[0], v1[1]) : 0u;
        frag[2] = in ? pack_half2(v0[2], v0[3]) : 0u;
        frag[3] = in ? pack_half2(v1[2], v1[3]) : 0u;
    } else {
        // pair by pair (with the four-value form the compiler serialized the rs form's wgmma,
        // ptxas C7513, for these types)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // columns c and c + 8
            float v0[2], v1[2];
            decode2_stage<Q>(raw + r0 * G::kSlot, o0 + bo, e % G::kElems + 8 * h, v0);
            decode2_stage<Q>(raw + (r0 + 8) * G::kSlot, o1 + bo, e % G::kElems + 8 * h, v1);
            frag[2 * h] = in ? pack_half2(v0[0], v0[1]) : 0u;
            frag[2 * h + 1] = in ? pack_half2(v1[0], v1[1]) : 0u;
        }
    }
}

// The rows' offsets in raw superstep j's slots: 0, or 2 where the 4-byte word copies started the
// segment below it (q16::raw_issue).
template <int Q>
__device__ __forceinline__ uint32_t raw_offset(const Q16Args &a, int n0, int r, int j) {
    return a.copy16 ? 0u
                    : uint32_t(reinterpret_cast<uintptr_t>(raw_src(a, n0, r, j, RawGeom<Q>::kBytes)) & 3u);
}

#endif  // __CUDA_ARCH__

}  // namespace q16
}  // namespace pf
