// gemm_q16_skinny_kernel.cuh — the f16 leg's GEMM on the GGUF blocks for few rows of X (1 to
// kMaxRows: decode steps, short batch items), where the product is bound by reading the weight,
// not by the tensor cores: Y[rows][n] (+)= X[rows][k] . W^T, W the GGUF blocks decoded to exactly
// the fp16 of the prewarm's cache (decode_stage.cuh run_scale / run_values8, the expression the
// prewarm evaluates), X the f16 leg's fp16 rows, mma.m16n8k16 with fp32 accumulation, the rows'
// inverse scales in the store. Reads the blocks once (4x fewer bytes than the fp16 cache at
// Q4_K), which gemm_q16_kernel.cuh's 256-row tiles cannot turn into speed: at 16 rows they run
// one block per 128 weight rows (72 blocks for 9216 rows on 132 SMs) with 15/16 of every MMA
// on zero rows.
//
// The block: 256 threads (8 warps), one m16 tile of 16 weight rows per warp (kBN = 128 rows per
// block), 8 MT rows of X (n8 tiles: the tokens are mma's N), over its share of K in supersteps
// of 256 columns. Every superstep's raw blocks (by one TMA where the rows are 16-byte units, as
// gemm_q16_kernel.cuh's; else each row's segment as the 16-byte chunks that cover it, at its
// offset in the slot, by cp.async) and X columns (8 MT rows of 256 fp16, rows past `rows` and
// columns past k zero-filled, by cp.async) are issued up to 4 supersteps ahead (stages(): two
// blocks an SM): a memory-bound kernel keeps bytes in flight.
//  - The weight goes straight from the raw blocks into mma.sync's A fragments: lane (g, t) =
//    (lane / 4, lane % 4) decodes whole 32-column runs (its scale once per run, the prewarm's
//    expression per value: run_scale / run_values8) of its rows g and g + 8: run t of the
//    superstep's first 128 columns, then run 4 + t. mma's k order is free inside a sum and its
//    k slots 2t, 2t + 1, 2t + 8, 2t + 9 belong to lane t in both the A and the B fragment, so lane
//    t feeds its run's 8-column chunks into its slots, two k16 steps a chunk, and X's B fragments
//    (lane (g, t): X row 8 m + g) take the same columns: one 16-byte shared load per chunk and X
//    tile. Each lane rotates its chunk order by t so that the quad's four X loads (runs 64 bytes
//    apart) fall in distinct banks; X's rows lie kXPitch = 576 bytes apart (64 mod 128: rows g
//    and g + 1 in the two halves of the banks). No decoded tile in shared memory.
//  - Split K over a cluster of S blocks (1, 2, 4 or 8, chosen by the host: pick_split): each
//    block sums its share of the supersteps, writes its partial tile into its own
//    shared memory, and after a cluster barrier block r of the cluster adds the partials of
//    elements r, r + S, ... in the fixed order of the ranks (distributed shared memory), so the
//    output is the same bits run after run (no atomics) and no workspace is needed.
//  - The epilogue: y = (accumulate ? y : 0) + sum, times inv[row] where the producers scaled the
//    row (the f16 leg's unscale), one element per thread at a time, coalesced along n.
// Rows of W past n and columns past k decode with a zero scale (zeros: the big kernel's rule);
// X's rows past `rows` and columns past k are zero-filled, so every product past the matrix is 0.
#pragma once

#include <cstdint>

#include "kernels/gemm/q16_raw.cuh"
#include "ptx/hopper.cuh"

namespace pf {
namespace q16s {

using q16::kRawCols;
using q16::Q16Args;
using q16::RawGeom;

constexpr int kMaxRows = 64;            // rows of X: up to 8 token tiles of 8
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBN = 16 * kWarps;        // weight rows per block: one m16 tile per warp
constexpr int kRuns = kRawCols / 32;    // 32-column runs per superstep
constexpr int kXPitch = 2 * kRawCols + 64;  // bytes of one X row's superstep in shared memory (below)
constexpr int kMaxSplit = 8;            // blocks per cluster (the portable limit)
constexpr int kStageBudget = 110 * 1024; // the stages' bytes a block aims for: two blocks an SM (of 228 KiB)

// A row's raw slot: its superstep's bytes from a 16-byte boundary at any even offset o < 16
// (copied by the 16-byte chunks that cover them), and the 12 bytes the decoders may read past the
// end, in 16-byte units.
template <int Q>
constexpr int kSlot = (RawGeom<Q>::kBytes + 14 + 12 + 15) / 16 * 16;
template <int Q>
constexpr int kRowChunks = (RawGeom<Q>::kBytes + 14 + 15) / 16;  // 16-byte chunks of a row's superstep, at most

// Bytes of one superstep's stage: the raw blocks of the block's weight rows and 8 MT rows of X.
template <int Q, int MT>
__host__ __device__ constexpr int stage_bytes() {
    return kBN * kSlot<Q> + 8 * MT * kXPitch;
}
// Supersteps in flight: as many as fit kStageBudget, 2 to 4 (session 39, the kernel suite on the
// H200, one row: with 133 KiB of stages a block, one block an SM, the 144 blocks of 9216 x 2560
// ran in two waves, 0.0255 ms, against 0.0137 for the 128 of 8192 x 2560 in one).
template <int Q, int MT>
__host__ __device__ constexpr int stages() {
    constexpr int n = kStageBudget / stage_bytes<Q, MT>();
    return n > 4 ? 4 : n < 2 ? 2 : n;
}
// The partial tile (fp32, [8 MT][kBN]) for the cluster's sum reuses the stages' bytes; then the
// stages' "raw landed" mbarriers (the TMA path).
template <int Q, int MT>
__host__ __device__ constexpr size_t bars_offset() {
    const size_t st = size_t(stages<Q, MT>()) * size_t(stage_bytes<Q, MT>());
    const size_t part = size_t(8 * MT) * size_t(kBN) * sizeof(float);
    return ((st > part ? st : part) + 7) / 8 * 8;
}
template <int Q, int MT>
__host__ __device__ constexpr size_t smem_bytes() {
    return bars_offset<Q, MT>() + 8 * size_t(stages<Q, MT>());
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// The float at shared::cluster address `addr` (mapa_cluster of another block's shared memory).
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}

// Superstep j's raw blocks of the weight rows n0 .. n0 + kBN - 1 (those below n) into `raw`, one
// kSlot<Q> slot per row: the 16-byte chunks that cover the row's segment, from the 16-byte boundary
// below it (the blocks start 16-byte aligned: launch() checks), so the segment sits o = its address
// % 16 bytes into the slot (even; Q4_K, Q5_K, IQ4_XS a multiple of 8, as their decoders read); the
// last chunk copies only the segment's bytes (words and a half-word: a 16-byte copy with a smaller
// source size reads no more, but compute-sanitizer's memcheck counts 16). Constant divisors, a
// few copies per thread.
template <int Q>
__device__ __forceinline__ void raw_issue_chunks(const Q16Args &a, unsigned char *raw, int n0, int j) {
    using G = RawGeom<Q>;
    const int cols = min(kRawCols, a.k - j * kRawCols);  // a whole number of blocks
    const int bytes = cols / G::kElems * G::kBlock;
    const int rows = min(kBN, a.n - n0);
    for (int i = int(threadIdx.x); i < kBN * kRowChunks<Q>; i += kThreads) {
        const int r = i / kRowChunks<Q>, c = i - r * kRowChunks<Q>;
        const uint8_t *src = q16::raw_src(a, n0, r, j, G::kBytes);
        const uint32_t o = uint32_t(reinterpret_cast<uintptr_t>(src) & 15u);
        const int end = int(o) + bytes - 16 * c;  // the segment's bytes from this chunk on
        if (r >= rows || end <= 0) continue;
        unsigned char *dst = raw + r * kSlot<Q> + 16 * c;
        const uint8_t *from = src - o + 16 * c;
        if (end >= 16) {
            cp_async16(dst, from);
        } else {  // the segment's last bytes (an even count): words, then a half-word, nothing past them
            for (int w = 0; w < end / 4; ++w) cp_async4_zfill(dst + 4 * w, from + 4 * w, true);
            if (end & 2) {
                const int h = end & ~3;
                *reinterpret_cast<uint16_t *>(dst + h) = *reinterpret_cast<const uint16_t *>(from + h);
            }
        }
    }
}

// Superstep j's X columns (256 fp16 of each of the 8 MT rows) into `dst` (kXPitch bytes a row).
template <int MT>
__device__ __forceinline__ void x_issue(const Q16Args &a, const __half *x16, unsigned char *dst, int j) {
    constexpr int kChunks = 8 * MT * (kRawCols / 8);  // 16-byte chunks
#pragma unroll
    for (int i = int(threadIdx.x); i < kChunks; i += kThreads) {
        const int r = i / (kRawCols / 8), c = i % (kRawCols / 8);
        const int col = j * kRawCols + 8 * c;
        const bool ok = r < a.rows && col < a.k;
        cp_async16_zfill(dst + r * kXPitch + 16 * c, x16 + (ok ? int64_t(r) * a.k + col : 0), ok);
    }
}

template <int Q, int MT>
__device__ __forceinline__ void skinny_tile(const Q16Args &a, const __half *x16, const CUtensorMap *tm_w,
                                            unsigned char *smem, int n0, int rank, int nranks) {
    using G = RawGeom<Q>;
    constexpr int S = stages<Q, MT>();
    constexpr int kRaw = kBN * kSlot<Q>;
    constexpr int kStage = stage_bytes<Q, MT>();
    // The raw blocks by one TMA a superstep (thread 0; rows kBytes apart, completing on the
    // stage's mbarrier) where a.tma_raw (rows of 16-byte units from 16-byte boundaries: Q4_K,
    // Q5_K, Q4_0 / Q8_0 at k % 256 == 0); else by every thread's 16-byte chunks (kSlot apart).
    const bool tma = a.tma_raw != 0;
    const int pitch = tma ? G::kBytes : kSlot<Q>;
    const uint32_t bars = smem_addr(smem) + uint32_t(bars_offset<Q, MT>());
    if (tma && threadIdx.x == 0) {
        for (int b = 0; b < S; ++b) hopper::mbar_init(bars + 8 * b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane >> 2, t = lane & 3;
    // This block's supersteps [j0, j1): the rank's even share of K's.
    const int supersteps = (a.k + kRawCols - 1) / kRawCols;
    const int j0 = rank * supersteps / nranks, j1 = (rank + 1) * supersteps / nranks;
    const int steps = j1 - j0;
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][e] = 0.f;
    const auto issue = [&](int i) {  // superstep j0 + i into buffer i % S (one commit group, maybe empty)
        if (i < steps) {
            if (!tma) {
                raw_issue_chunks<Q>(a, smem + (i % S) * kStage, n0, j0 + i);
            } else if (threadIdx.x == 0) {  // rows past n land as zeros
                const uint32_t bar = bars + 8 * uint32_t(i % S);
                hopper::mbar_arrive_expect_tx(bar, uint32_t(kBN * G::kBytes));
                hopper::tma_load_3d(smem_addr(smem + (i % S) * kStage), tm_w, 0, (j0 + i) * (G::kBytes / 16), n0, bar);
            }
            x_issue<MT>(a, x16, smem + (i % S) * kStage + kRaw, j0 + i);
        }
        cp_async_commit();
    };
    // This lane's weight rows (the m16 tile's rows g and g + 8): r0, r1 of the block's tile.
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const bool in0 = n0 + r0 < a.n, in1 = n0 + r1 < a.n;
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);
    for (int i = 0; i < steps; ++i) {
        cp_async_wait<S - 2>();  // this thread's copies of superstep i have landed
        __syncthreads();         // everyone's; and buffer (i - 1) % S is no longer read
        issue(i + S - 1);
        if (tma) hopper::mbar_wait(bars + 8 * uint32_t(i % S), uint32_t(i / S) & 1u);  // the TMA's bytes
        const int j = j0 + i;
        const unsigned char *raw = smem + (i % S) * kStage;
        const unsigned char *xs = smem + (i % S) * kStage + kRaw;
        const unsigned char *row0 = raw + r0 * pitch, *row1 = raw + r1 * pitch;
        const uint32_t o0 =
            tma ? 0u : uint32_t(reinterpret_cast<uintptr_t>(q16::raw_src(a, n0, r0, j, G::kBytes)) & 15u);
        const uint32_t o1 =
            tma ? 0u : uint32_t(reinterpret_cast<uintptr_t>(q16::raw_src(a, n0, r1, j, G::kBytes)) & 15u);
#pragma unroll
        for (int grp = 0; grp < kRuns / 4; ++grp) {
            const int u = 4 * grp + t;  // this lane's run of its two rows
            const bool in = j * kRawCols + 32 * u < a.k;
            RunScale s0{}, s1{};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                // The run's 8-column chunk qq, rotated by t: the four lanes of a quad read four
                // runs' X columns 64 bytes apart, whose banks a rotation makes distinct
                // (the lanes t of the A and the B fragments share the order, as mma's k slots
                // 2t, 2t + 1, 2t + 8, 2t + 9 belong to lane t in both).
                const int qq = (q + t) & 3;
                const int e = 32 * u + 8 * qq;  // the chunk's first element in the superstep
                const uint32_t b0 = o0 + uint32_t(e / G::kElems * G::kBlock);
                const uint32_t b1 = o1 + uint32_t(e / G::kElems * G::kBlock);
                if (kRun<Q> < 32 || q == 0) {  // the run's scales (Q6_K: per 16 columns)
                    s0 = run_scale<Q>(row0, b0, e % G::kElems);
                    s1 = run_scale<Q>(row1, b1, e % G::kElems);
                    if (!(in && in0)) s0 = RunScale{0.0f, 0.0f};  // past n or k: zeros
                    if (!(in && in1)) s1 = RunScale{0.0f, 0.0f};
                }
                float v0[8], v1[8];
                run_values8<Q>(row0, b0, e % G::kElems, s0, v0);
                run_values8<Q>(row1, b1, e % G::kElems, s1, v1);
                // two k16 steps: lane t's slots 2t, 2t + 1, 2t + 8, 2t + 9 <- the chunk's columns
                // 0, 1, 2, 3 (step 0) and 4, 5, 6, 7 (step 1); rows g (v0) and g + 8 (v1)
                const uint32_t fa[4] = {pack_half2(v0[0], v0[1]), pack_half2(v1[0], v1[1]), pack_half2(v0[2], v0[3]),
                                        pack_half2(v1[2], v1[3])};
                const uint32_t fb[4] = {pack_half2(v0[4], v0[5]), pack_half2(v1[4], v1[5]), pack_half2(v0[6], v0[7]),
                                        pack_half2(v1[6], v1[7])};
#pragma unroll
                for (int m = 0; m < MT; ++m) {  // X's rows 8 m + g: the same 8 columns
                    const uint4 xv = *reinterpret_cast<const uint4 *>(xs + (8 * m + g) * kXPitch + 2 * e);
                    mma_m16n8k16(acc[m], fa, xv.x, xv.y);
                    mma_m16n8k16(acc[m], fb, xv.z, xv.w);
                }
            }
        }
    }
    cp_async_wait_all();
    __syncthreads();  // every warp is done with the stages: the partial tile reuses them
    // acc[m]: weight rows r0 (e = 0, 1) and r1 (e = 2, 3) of the tile, X rows 8 m + 2 t + e % 2.
    // The partial tile P[8 MT][kBN] in shared memory.
    float *part = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[(8 * m + 2 * t + (e & 1)) * kBN + (e < 2 ? r0 : r1)] = acc[m][e];
    if (nranks > 1) hopper::cluster_sync();  // every block's partial written (release / acquire)
    else __syncthreads();
    const uint32_t part_addr = smem_addr(part);
    const int rows = min(a.rows, 8 * MT);
    for (int i = rank + nranks * int(threadIdx.x); i < rows * kBN; i += nranks * kThreads) {
        const int r = i / kBN, c = i % kBN;
        float s = 0.f;  // the ranks' partials in a fixed order
        if (nranks == 1) s = part[i];
        else
            for (int q = 0; q < nranks; ++q)
                s += ld_cluster_f32(hopper::mapa_cluster(part_addr + uint32_t(i) * 4u, uint32_t(q)));
        if (n0 + c < a.n) {
            float *y = a.y + int64_t(r) * a.ldy + n0 + c;
            const float v = a.accumulate ? *y + s : s;
            *y = a.inv ? v * a.inv[r] : v;
        }
    }
    if (nranks > 1) hopper::cluster_sync();  // no block leaves while another still reads its partials
}

#endif  // __CUDA_ARCH__ >= 900

// Clusters of `split` blocks along x, one cluster per weight tile of kBN rows.
template <int Q, int MT>
__global__ void __launch_bounds__(kThreads)
    gemm_q16_skinny_kernel(const __grid_constant__ Q16Args a, const __half *__restrict__ x16,
                           const __grid_constant__ CUtensorMap tm_w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char smem[];
    const int nranks = int(cluster_nctarank());
    const int rank = nranks > 1 ? int(hopper::cluster_ctarank()) : 0;
    skinny_tile<Q, MT>(a, x16, &tm_w, smem, (int(blockIdx.x) / nranks) * kBN, rank, nranks);
#endif
}

// The arguments (one row tile of up to kMaxRows rows; n tiles of kBN rows).
template <int Q>
inline Q16Args make_args(const void *blocks, int64_t n, int64_t k, const float *inv, int64_t rows, float *y,
                         int64_t ldy, bool accumulate) {
    return q16::args_for<Q>(blocks, n, k, inv, rows, y, ldy, accumulate, kMaxRows, kBN);
}

// The blocks per cluster for a.n_tiles weight tiles on `sms` SMs: the most (1, 2, 4, 8) that
// leave every block at least 5 supersteps (its pipeline's prologue and the cluster's sum are a
// block's fixed costs) and at most 5 blocks an SM. bench_gemm_q16 on the H200 (session 39, Q4_K,
// M = 1 / 16 / 64 at the qwen35-4b and 27B shapes, 1 / 2 / 4 / 8 timed): the fastest split, or
// within 3% of it, at 14 of the 15 (5120 x 17408 at 64 rows: 8, 4% behind 2); Q6_K at 2560 x 9216
// ran 0.85-0.88x of its fastest (8, where this picks 4) at M = 1 and 16.
inline int pick_split(const Q16Args &a, int sms) {
    const int64_t supersteps = (a.k + kRawCols - 1) / kRawCols;
    int s = 1;
    while (s < kMaxSplit && supersteps >= 5 * 2 * s && int64_t(a.n_tiles) * 2 * s <= 5 * int64_t(sms)) s *= 2;
    return s;
}

// The raw blocks come by TMA where a.tma_raw allows (a map of the weight's rows, boxes of a
// superstep of kBN rows: hopper::encode_rows_u8) and `tma` asks, by cp.async otherwise.
template <int Q, int MT>
cudaError_t launch(const Q16Args &a, const __half *x16, int split, cudaStream_t st, bool tma = true) {
    if (reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || a.rows > 8 * MT) return cudaErrorInvalidValue;
    Q16Args b = a;
    CUtensorMap tm_w{};
    b.tma_raw = tma && b.tma_raw &&
                hopper::encode_rows_u8(&tm_w, b.w, b.row_bytes, b.n, RawGeom<Q>::kBytes, kBN) == CUDA_SUCCESS;
    return hopper::launch_clusters(gemm_q16_skinny_kernel<Q, MT>, unsigned(int64_t(b.n_tiles) * split), kThreads,
                                   smem_bytes<Q, MT>(), st, unsigned(split), b, x16, tm_w);
}

}  // namespace q16s
}  // namespace pf
