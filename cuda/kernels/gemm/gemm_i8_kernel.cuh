// gemm_i8_kernel.cuh — the 8-bit leg's GEMM kernel (sm_90a) and its launch, self-contained
// (CUDA runtime, mat.h and hopper.cuh only), so that the library (gemm_i8.cu) and the kernel's
// micro-benchmark (tests/cpp/bench_gemm_i8.cu) build the same code. Operand forms: gemm_i8.cuh.
//
// The GEMM (the structure of DeepGEMM's FP8 GEMM, DeepSeek 2025, written here for int8 with
// per-(row, group) scales on the activations and, on the weights, either per-(row, group) scales
// or the rank-1 form of gemm_i8.cuh; the library runs <128, kI8Cvt, true, true, 1, 2> on a
// persistent grid, the others are the micro-benchmark's measured alternatives):
//  - A block owns a 128-row x BN-column output tile. Warp specialisation: a producer warpgroup
//    (one thread issues the TMA loads, then gives its registers away with setmaxnreg) and two
//    consumer warpgroups of 64 rows each (the M of one wgmma.m64nNk32).
//  - K runs in groups of 128: one pipeline stage holds the group's A tile (128 x 128 int8 = one
//    128-byte swizzled row per matrix row), the W tile (BN x 128) and the scales (the A tile's
//    128 fp32, group-major in global memory, so one 1-row TMA box; the W tile's BN, or with the
//    rank-1 form a box of block factors holding the tile's one).
//  - Per group a consumer issues four wgmma.m64nBNk32.s32.s8.s8 into a fresh int32 fragment
//    (the first with scale-d = 0), then promotes in fp32: acc += float(P) * (sa[row] * b) with
//    the rank-1 form (one FFMA per element; the rows' factors r multiply the tile once, in the
//    epilogue), acc += float(P) * sw[col] * sa[row] otherwise (FMUL + FFMA). The int32 -> fp32
//    conversion: kI8Cvt (I2FP.F32.S32 on sm_90, one instruction on the ALU pipe) or kI8Magic
//    (the 1.5 * 2^23 trick, IADD + FADD; exact for |P| < 2^22, and a 128-deep int8 dot is at
//    most 2 064 512). Measured (NOTES.md, the 8-bit leg): I2FP faster, rank-1 faster.
//  - Two int32 fragments per consumer at BN = 128: group g+1's products are issued before
//    group g's promotion, so the promotion overlaps the tensor cores' work of the same warpgroup
//    (and the other warpgroup's products keep them busy too). At BN = 192 two would not fit the
//    registers: one fragment, and only the other warpgroup's products overlap a promotion.
//  - Tiles are rastered in bands of kI8Band row tiles (row tile fastest) so that the blocks
//    resident at once share their weight tiles in L2.
//  - Clusters (CM x CN blocks) share one TMA load of a tile among the blocks that need it
//    (multicast), and a persistent grid lets the producer load the next tile while the consumers
//    write this one. Measured (bench_gemm_i8, 40 launches back to back, 8192 x 34816 x 5120):
//    one block per tile 3.33-3.43 ms, persistent 3.23-3.35, persistent 1 x 2 clusters 3.07-3.19
//    (2 x 1: 3.08-3.23, 2 x 2: 3.21-3.35) over four runs (NOTES.md, session 35).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/mat.h"
#include "kernels/gemm/gemm_i8.cuh"
#include "kernels/gemm/wgmma_store.cuh"
#include "ptx/hopper.cuh"
#include "ptx/wgmma.cuh"

namespace pf {
namespace i8k {

using namespace hopper;

constexpr int kI8BM = 128;                      // output rows per block (2 consumer warpgroups)
constexpr int kI8Threads = 384;                 // producer warpgroup + 2 consumer warpgroups
constexpr int kI8Consumers = 256;
constexpr int kI8Band = 8;                      // row tiles per raster band
constexpr int kI8TileA = kI8BM * 128;           // bytes of one stage's A tile

template <int BN>
__host__ __device__ constexpr int i8_stages() { return BN == 128 ? 6 : 5; }
// The int32 -> fp32 conversion of a promotion.
enum I8Convert : int {
    kI8Magic = 0,  // IADD of 0x4B400000, FADD of -1.5 * 2^23 (exact for |P| < 2^22)
    kI8Cvt = 1,    // cvt.rn.f32.s32 (__int2float_rn)
};
// Bytes one stage's TMA loads: the A and W tiles, the A scales, and the W scales (BN of them; a
// rank-1 weight form: the box of kI8R1Box block factors holding the tile's).
constexpr int kI8R1Box = 32;
template <int BN, bool R1>
__host__ __device__ constexpr int i8_stage_tx() {
    return kI8TileA + BN * 128 + kI8BM * 4 + (R1 ? kI8R1Box * 4 : BN * 4);
}
// Shared bytes of one stage (every TMA destination 128-byte aligned).
template <int BN, bool R1>
__host__ __device__ constexpr int i8_stage_bytes() { return kI8TileA + BN * 128 + kI8BM * 4 + (R1 ? 128 : BN * 4); }
// Stages of A, of W, of the A scales, of the W scales, 2 mbarriers per stage, and the slack that
// lets the kernel align its base to 1024.
template <int BN, bool R1 = false>
__host__ __device__ constexpr size_t i8_smem_bytes() {
    return size_t(i8_stages<BN>()) * i8_stage_bytes<BN, R1>() + 16 * i8_stages<BN>() + kSwizzleAtom;
}
constexpr size_t kSm90SmemOptinI8 = 232448;
static_assert(i8_smem_bytes<128>() <= kSm90SmemOptinI8, "6 stages of 128 x 128 fit");
static_assert(i8_smem_bytes<128, true>() <= kSm90SmemOptinI8, "6 rank-1 stages of 128 x 128 fit");
static_assert(i8_smem_bytes<192>() <= kSm90SmemOptinI8, "5 stages of 128 x 192 fit");

struct I8GemmArgs {
    MatF y;  // the output rows (the launcher's y, ldy)
    int32_t rows, n, groups;
    int32_t m_tiles, n_tiles;
    int32_t accumulate;
    int32_t y_vec2;  // y and ldy allow float2 stores
    const float *wr; // the rank-1 weight form's row factors [n] (nullptr: per-(row, group) scales)
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PF_I8_DEVICE 1
#endif

#ifdef PF_I8_DEVICE
constexpr int kI8ProducerRegs = 40;
constexpr int kI8ConsumerRegs = 232;  // 128 * 40 + 256 * 232 = 64512 <= 65536

// acc += float(p) * sw * sa for one group's int32 fragment (layout of wgmma.cuh: d[i] is row
// gid + 8 ((i / 2) % 2) of the warp's 16, column 8 (i / 4) + 2 tig + i % 2).
// The rank-1 weight form (gemm_i8.cuh): one factor b per tile and group, so a row's scale is
// sa * b and a promotion is one FFMA per element; the rows' factors r wait for the epilogue.
template <int BN, int Conv>
__device__ __forceinline__ void i8_promote_r1(float (&acc)[BN / 2], const int32_t (&p)[BN / 2],
                                              float s0, float s1) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
        const float f = Conv == kI8Magic ? __int_as_float(p[i] + 0x4B400000) - 12582912.0f
                                         : __int2float_rn(p[i]);
        acc[i] = fmaf(f, ((i >> 1) & 1) ? s1 : s0, acc[i]);
    }
}

template <int BN, int Conv>
__device__ __forceinline__ void i8_promote(float (&acc)[BN / 2], const int32_t (&p)[BN / 2],
                                           const float *sw_tile, float sa0, float sa1, int tig) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const float2 w = *reinterpret_cast<const float2 *>(sw_tile + 8 * j + 2 * tig);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float sa = h ? sa1 : sa0;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 4 * j + 2 * h + e;
                const float f = Conv == kI8Magic ? __int_as_float(p[i] + 0x4B400000) - 12582912.0f
                                                 : __int2float_rn(p[i]);
                acc[i] = fmaf(f * (e ? w.y : w.x), sa, acc[i]);
            }
        }
    }
}

template <int BN>
__device__ __forceinline__ void i8_issue(int32_t (&p)[BN / 2], uint64_t da, uint64_t db) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // 4 x k32 = the group's 128 bytes of each swizzled row
        wgmma::wgmma_s8<BN>(p, desc_add(da, 32 * kk), desc_add(db, 32 * kk), kk > 0);
    wgmma_commit();
}

template <int N>
__device__ __forceinline__ void fence_iregs(int32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The block's shared memory as 32-bit shared-window addresses (what TMA, mbarriers and the wgmma
// descriptors take): S stages of A tiles, of W tiles, of A scales (128 fp32), of W scales (BN
// fp32, or the rank-1 form's 128-byte box), then the full and the empty mbarrier of each stage;
// base is the dynamic shared memory rounded up to the 1024-byte swizzle atom, base_ptr the same
// as a generic pointer (the consumers' plain loads of the scales).
template <int BN, bool R1>
struct I8Smem {
    static constexpr int S = i8_stages<BN>();
    static constexpr uint32_t kTileW = uint32_t(BN) * 128;
    static constexpr uint32_t kSwBytes = R1 ? 128 : BN * 4;
    const unsigned char *base_ptr;
    uint32_t base;
    uint32_t sA0;   // stage s at sA0 + s * kI8TileA
    uint32_t sW0;   // stage s at sW0 + s * kTileW
    uint32_t sSa0;  // 128 fp32 per stage
    uint32_t sSw0;  // kSwBytes per stage
    uint32_t bars;
    __device__ __forceinline__ uint32_t full(int st) const { return bars + 8 * st; }
    __device__ __forceinline__ uint32_t empty(int st) const { return bars + 8 * (S + st); }
    __device__ __forceinline__ const float *sa_ptr(int st) const {
        return reinterpret_cast<const float *>(base_ptr + (sSa0 - base) + st * kI8BM * 4);
    }
    __device__ __forceinline__ const float *sw_ptr(int st) const {
        return reinterpret_cast<const float *>(base_ptr + (sSw0 - base) + st * kSwBytes);
    }
};

// The tile scheduler: cluster tiles of CM x CN output tiles, rastered in bands of kBand cluster
// rows (kI8Band row tiles), the cluster row running fastest inside a band, so that the blocks
// resident at once share their weight tiles in L2. This block (rank rm + CM rn in its cluster)
// runs the cluster tiles cluster, cluster + clusters, ... of `tiles`.
template <int CM, int CN>
struct I8Raster {
    static constexpr int kBand = kI8Band / CM;
    int rm, rn, cluster, clusters, cm_tiles, cn_tiles, tiles;
    // Output tile (mt, nt) of cluster tile t: a block past the matrix reads zeros.
    __device__ __forceinline__ void tile_of(int t, int &mt, int &nt) const {
        const int band_tiles = kBand * cn_tiles;
        const int band = t / band_tiles, in_band = t - band * band_tiles;
        const int band_rows = min(kBand, cm_tiles - band * kBand);
        mt = (band * kBand + in_band % band_rows) * CM + rm;
        nt = (in_band / band_rows) * CN + rn;
    }
};

// This block's raster: its rank in the cluster, its first cluster tile and stride, the tiles.
template <int CM, int CN>
__device__ __forceinline__ I8Raster<CM, CN> i8_raster(const I8GemmArgs &a) {
    constexpr int CS = CM * CN;
    const int rank = CS > 1 ? int(cluster_ctarank()) : 0;
    const int rm = rank % CM, rn = rank / CM;
    const int cluster = int(blockIdx.x) / CS, clusters = int(gridDim.x) / CS;
    const int cm_tiles = (a.m_tiles + CM - 1) / CM, cn_tiles = (a.n_tiles + CN - 1) / CN;
    return I8Raster<CM, CN>{rm, rn, cluster, clusters, cm_tiles, cn_tiles, cm_tiles * cn_tiles};
}

// The producer (thread 0 of the producer warpgroup): every group of every tile of the block into
// the S stages, each refilled once every consumer warp of the cluster released it; with
// clusters the A tile (CN > 1) or the W tile (CM > 1) comes in 1 / CN (1 / CM) slices, each
// block loading its slice and multicasting it to the blocks that share the tile.
template <int BN, bool R1, int CM, int CN>
__device__ __forceinline__ void i8_produce(const I8Smem<BN, R1> &L, const I8Raster<CM, CN> &R, int G,
                                           const CUtensorMap *tm_a, const CUtensorMap *tm_w,
                                           const CUtensorMap *tm_sa, const CUtensorMap *tm_sw) {
    constexpr int S = I8Smem<BN, R1>::S;
    constexpr uint32_t kTileW = I8Smem<BN, R1>::kTileW, kSwBytes = I8Smem<BN, R1>::kSwBytes;
    constexpr uint32_t kStageTx = uint32_t(i8_stage_tx<BN, R1>());
    uint16_t a_mask = 0, w_mask = 0;  // the blocks sharing my row tile, my weight tile
    for (int j = 0; j < CN; ++j) a_mask |= uint16_t(1u << (R.rm + CM * j));
    for (int i = 0; i < CM; ++i) w_mask |= uint16_t(1u << (i + CM * R.rn));
    int it = 0;  // groups loaded so far (over the tiles): stage it % S, use it / S
    for (int t = R.cluster; t < R.tiles; t += R.clusters) {
        int mt, nt;
        R.tile_of(t, mt, nt);
        const int m0 = mt * kI8BM, n0 = nt * BN;
        for (int g = 0; g < G; ++g, ++it) {
            const int st = it % S, use = it / S;
            if (use > 0) mbar_wait(L.empty(st), (use - 1) & 1);
            mbar_arrive_expect_tx(L.full(st), kStageTx);  // every byte landing here
            if constexpr (CN == 1) {
                tma_load_2d(L.sA0 + st * kI8TileA, tm_a, g * 128, m0, L.full(st));
            } else {
                tma_load_2d_multicast(L.sA0 + st * kI8TileA + R.rn * (kI8TileA / CN), tm_a, g * 128,
                                      m0 + R.rn * (kI8BM / CN), L.full(st), a_mask);
            }
            if constexpr (CM == 1) {
                tma_load_2d(L.sW0 + st * kTileW, tm_w, g * 128, n0, L.full(st));
            } else {
                tma_load_2d_multicast(L.sW0 + st * kTileW + R.rm * (kTileW / CM), tm_w, g * 128,
                                      n0 + R.rm * (BN / CM), L.full(st), w_mask);
            }
            tma_load_2d(L.sSa0 + st * kI8BM * 4, tm_sa, m0, g, L.full(st));
            tma_load_2d(L.sSw0 + st * kSwBytes, tm_sw, R1 ? nt / kI8R1Box * kI8R1Box : n0, g, L.full(st));
        }
    }
    // Every stage released by the whole cluster before this block ends: the other blocks'
    // consumers arrive on this block's barriers until then.
    for (int j = it > S ? it - S : 0; j < it; ++j) mbar_wait(L.empty(j % S), (j / S) & 1);
}

// A consumer thread's place: warpgroup wg (rows 64 wg ..), warp within it, lane and its fragment
// coordinates gid, tig; its rows row_in_tile and row_in_tile + 8 of the tile.
struct I8Thread {
    int wg, warp, lane, gid, tig, row_in_tile;
};

// The consumer's part of pipeline step it + g (group g of the tile whose groups start at step
// it): i8_issue_group waits for the stage and issues its four wgmma into fragment p;
// i8_promote_group adds the finished fragment into acc with its scales and releases the stage
// (once this warp's products of it are done and its scales read: one arrival per warp on the
// barrier of every block of the cluster, whose producers multicast into this block's stage).
template <int BN, bool R1>
__device__ __forceinline__ void i8_issue_group(const I8Smem<BN, R1> &L, uint64_t da0, uint64_t dw0, int it, int g,
                                               int32_t (&p)[BN / 2]) {
    constexpr int S = I8Smem<BN, R1>::S;
    const int st = (it + g) % S;
    mbar_wait(L.full(st), ((it + g) / S) & 1);
    i8_issue<BN>(p, desc_add(da0, uint32_t(st) * kI8TileA), desc_add(dw0, uint32_t(st) * I8Smem<BN, R1>::kTileW));
}
template <int BN, int Conv, bool R1, int CS>
__device__ __forceinline__ void i8_promote_group(const I8Smem<BN, R1> &L, const I8Thread &th, int it, int nt, int g,
                                                 const int32_t (&p)[BN / 2], float (&acc)[BN / 2]) {
    const int st = (it + g) % I8Smem<BN, R1>::S;
    const float *sa = L.sa_ptr(st);
    if constexpr (R1) {
        const float b = L.sw_ptr(st)[nt % kI8R1Box];
        i8_promote_r1<BN, Conv>(acc, p, sa[th.row_in_tile] * b, sa[th.row_in_tile + 8] * b);
    } else {
        i8_promote<BN, Conv>(acc, p, L.sw_ptr(st), sa[th.row_in_tile], sa[th.row_in_tile + 8], th.tig);
    }
    __syncwarp();
    if constexpr (CS == 1) {
        mbar_arrive_if(L.empty(st), th.lane == 0);
    } else {
        mbar_arrive_cluster_if(L.empty(st), uint32_t(th.lane), th.lane < CS);
    }
}

// The main loop of one tile: its G groups into acc (zeroed first). Group g's products go into fragment g % 2
// with two fragments (Two); group g + 1's are issued before group g is promoted. Every branch
// commits and waits for the same groups on every path (ptxas tracks the wgmma groups statically
// and otherwise serializes them with injected waits).
template <int BN, int Conv, bool Two, bool R1, int CS>
__device__ __forceinline__ void i8_tile_mainloop(const I8Smem<BN, R1> &L, const I8Thread &th, uint64_t da0,
                                                 uint64_t dw0, int it, int nt, int G, float (&acc)[BN / 2]) {
    static_assert(!Two || BN <= 128, "two fragments of 192 columns do not fit the registers");
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    int32_t p0[BN / 2], p1[Two ? BN / 2 : 1];  // nothing in flight between tiles
    if constexpr (Two) {
        i8_issue_group(L, da0, dw0, it, 0, p0);
        int g = 0;
        for (; g + 2 < G; g += 2) {  // p0 holds group g in flight; groups g + 1 and g + 2 exist
            i8_issue_group(L, da0, dw0, it, g + 1, p1);
            wgmma_wait<1>();
            fence_iregs(p0);
            i8_promote_group<BN, Conv, R1, CS>(L, th, it, nt, g, p0, acc);
            i8_issue_group(L, da0, dw0, it, g + 2, p0);
            wgmma_wait<1>();
            fence_iregs(p1);
            i8_promote_group<BN, Conv, R1, CS>(L, th, it, nt, g + 1, p1, acc);
        }
        if (g + 1 < G) {  // two groups left
            i8_issue_group(L, da0, dw0, it, g + 1, p1);
            wgmma_wait<1>();
            fence_iregs(p0);
            i8_promote_group<BN, Conv, R1, CS>(L, th, it, nt, g, p0, acc);
            wgmma_wait<0>();
            fence_iregs(p1);
            i8_promote_group<BN, Conv, R1, CS>(L, th, it, nt, g + 1, p1, acc);
        } else {
            wgmma_wait<0>();
            fence_iregs(p0);
            i8_promote_group<BN, Conv, R1, CS>(L, th, it, nt, g, p0, acc);
        }
    } else {  // one fragment: only the other warpgroup's products overlap a promotion
        for (int g = 0; g < G; ++g) {
            i8_issue_group(L, da0, dw0, it, g, p0);
            wgmma_wait<0>();
            fence_iregs(p0);
            i8_promote_group<BN, Conv, R1, CS>(L, th, it, nt, g, p0, acc);
        }
    }
}

// The epilogue of a tile (rows m0 .., columns n0 ..): rows row_in_tile and row_in_tile + 8 of
// this warp, columns 8 j + 2 tig (+1); the rank-1 form's row factors first. A whole tile of
// plain float2 stores goes without the bounds checks.
template <int BN, bool R1>
__device__ __forceinline__ void i8_epilogue(const I8GemmArgs &a, const I8Thread &th, int m0, int n0,
                                            float (&acc)[BN / 2]) {
    const int tig = th.tig;
    const bool whole = m0 + kI8BM <= a.rows && n0 + BN <= a.n && a.y_vec2 && !a.accumulate;
    if constexpr (R1) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int c = n0 + 8 * j + 2 * tig;
            const float r0 = whole || c < a.n ? __ldg(a.wr + c) : 0.f;
            const float r1 = whole || c + 1 < a.n ? __ldg(a.wr + c + 1) : 0.f;
            acc[4 * j] *= r0, acc[4 * j + 1] *= r1, acc[4 * j + 2] *= r0, acc[4 * j + 3] *= r1;
        }
    }
    if (whole) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float *yr = a.y.ptr + int64_t(m0 + th.row_in_tile + 8 * h) * a.y.ld + n0 + 2 * tig;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
                *reinterpret_cast<float2 *>(yr + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m0 + th.row_in_tile + 8 * h;
        if (r >= a.rows) continue;
        float *yr = a.y.ptr + int64_t(r) * a.y.ld;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
            store_pair<false>(yr, n0 + 8 * j + 2 * tig, a.n, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], a.y_vec2,
                              a.accumulate, 1.0f);
    }
}
#endif  // PF_I8_DEVICE

// BN: weight rows per block (128 or 192); Conv: I8Convert; Two: two int32 fragments per consumer
// (group g+1 issued before group g is promoted; BN = 128 only: registers); R1: the rank-1
// weight form (BN = 128: a tile is one block of its factors). CM x CN: the blocks of one
// cluster (rank = rm + CM rn): the CM blocks of a column (the same weight tile, CM row tiles)
// each load 1 / CM of the weight tile and multicast it to the others; the CN blocks of a row
// (the same row tile) share the A tile the same way. That cuts each block's L2 reads per group
// from 32 KiB to 16 (1 / CM + 1 / CN) KiB. A block runs the cluster tiles blockIdx / CS,
// + gridDim / CS, ... (persistent when the grid is smaller than the tiles: the producer then
// loads the next tile's groups while the consumers write this one's outputs). Issuing the next
// tile's first group before this tile's epilogue measured slower (3.23 against 3.13 ms back to
// back at 8192 x 34816 x 5120, 1 x 2 clusters: ptxas injects a wgmma wait on the tile loop's back
// edge, C7517) and was removed (NOTES.md, session 35).
// The kernel sets up the shared memory, the raster and the barriers, then splits into the roles
// (setmaxnreg in the role branch, where ptxas needs it: C7508): the producer (i8_produce) and the
// consumers' tile loop (i8_tile_mainloop, i8_epilogue).
template <int BN, int Conv, bool Two, bool R1 = false, int CM = 1, int CN = 1>
__global__ void __launch_bounds__(kI8Threads, 1)
    gemm_i8_kernel(const __grid_constant__ I8GemmArgs a, const __grid_constant__ CUtensorMap tm_a,
                   const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_sa,
                   const __grid_constant__ CUtensorMap tm_sw) {
#ifdef PF_I8_DEVICE
    using Smem = I8Smem<BN, R1>;
    constexpr int S = Smem::S, CS = CM * CN;
    static_assert(!R1 || BN == 128, "a rank-1 factor covers 128 weight rows");
    static_assert(CS <= 4 && (CM == 1 || CM == 2) && (CN == 1 || CN == 2), "clusters of 1, 2 or 2 x 2");
    constexpr int kConsumerWarps = kI8Consumers / 32;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    const uint32_t sW0 = base + S * kI8TileA, sSa0 = sW0 + S * Smem::kTileW, sSw0 = sSa0 + S * kI8BM * 4;
    const Smem L{smem_raw + (base - raw), base, base, sW0, sSa0, sSw0, sSw0 + S * Smem::kSwBytes};

    const I8Raster<CM, CN> R = i8_raster<CM, CN>(a);
    const int G = a.groups;

    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int st = 0; st < S; ++st) {
            mbar_init(L.full(st), 1);
            mbar_init(L.empty(st), kConsumerWarps * CS);  // every consumer warp of the cluster
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CS > 1) {
        cluster_sync();
    } else {
        __syncthreads();
    }

    if (tid < 128) {  // the producer warpgroup: its registers go to the consumers
        setmaxnreg_dec<kI8ProducerRegs>();
        if (tid == 0) i8_produce<BN, R1, CM, CN>(L, R, G, &tm_a, &tm_w, &tm_sa, &tm_sw);
        return;
    }
    setmaxnreg_inc<kI8ConsumerRegs>();
    const int ctid = tid - 128;
    I8Thread th;
    th.wg = ctid >> 7;
    th.warp = (ctid >> 5) & 3;
    th.lane = ctid & 31, th.gid = th.lane >> 2, th.tig = th.lane & 3;
    th.row_in_tile = th.wg * 64 + th.warp * 16 + th.gid;  // and row_in_tile + 8
    const uint64_t da0 = smem_desc(L.sA0 + uint32_t(th.wg) * 64 * kSwizzleRow, 16, kSwizzleAtom);
    const uint64_t dw0 = smem_desc(L.sW0, 16, kSwizzleAtom);

    float acc[BN / 2];
    int it = 0;  // pipeline steps (groups) before this tile
    for (int t = R.cluster; t < R.tiles; t += R.clusters, it += G) {
        int mt, nt;
        R.tile_of(t, mt, nt);
        i8_tile_mainloop<BN, Conv, Two, R1, CS>(L, th, da0, dw0, it, nt, G, acc);
        i8_epilogue<BN, R1>(a, th, mt * kI8BM, nt * BN, acc);
    }
#endif  // PF_I8_DEVICE
}

// ------------------------------------------------------------------ host

inline CUresult encode_plain_2d(CUtensorMap *map, CUtensorMapDataType dtype, const void *base,
                                int64_t cols, int64_t rows, int64_t row_bytes, int box_cols) {
    const encode_tiled_fn enc = tensor_map_encoder();
    if (!enc) return CUDA_ERROR_NOT_FOUND;
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), 1};
    const cuuint32_t elem_strides[2] = {1, 1};
    return enc(map, dtype, 2, const_cast<void *>(base), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The four TMA maps of a product with BN-row weight tiles: codes in 128-byte swizzled boxes
// (128 columns x 128 / CN rows of A, BN / CM rows of W: a block's share of a cluster's tile),
// the group-major scales in 1-row boxes.
struct Maps {
    CUtensorMap a, w, sa, sw;
};
inline CUresult make_maps(Maps *m, const I8Mat &a, const I8Mat &w, int64_t rows, int64_t n,
                          int64_t k, int bn, int cm = 1, int cn = 1) {
    const bool r1 = w.r != nullptr;
    const int64_t groups = i8_groups(k);
    CUresult r = encode_2d_sw128(&m->a, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.q, k, rows, a.ldq, 128, kI8BM / cn);
    if (r == CUDA_SUCCESS)
        r = encode_2d_sw128(&m->w, CU_TENSOR_MAP_DATA_TYPE_UINT8, w.q, k, n, w.ldq, 128, bn / cm);
    if (r == CUDA_SUCCESS)
        r = encode_plain_2d(&m->sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, a.s, rows, groups, a.lds * 4, kI8BM);
    if (r == CUDA_SUCCESS)
        r = r1 ? encode_plain_2d(&m->sw, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, w.s, (n + kI8BM - 1) / kI8BM,
                                 groups, w.lds * 4, kI8R1Box)
               : encode_plain_2d(&m->sw, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, w.s, n, groups, w.lds * 4, bn);
    return r;
}

inline I8GemmArgs make_args(int64_t rows, int64_t n, int64_t k, float *y, int64_t ldy,
                            bool accumulate, int bn, const float *wr = nullptr) {
    I8GemmArgs f;
    f.wr = wr;
    f.y = MatF{y, ldy};
    f.rows = int32_t(rows);
    f.n = int32_t(n);
    f.groups = int32_t(i8_groups(k));
    f.m_tiles = int32_t((rows + kI8BM - 1) / kI8BM);
    f.n_tiles = int32_t((n + bn - 1) / bn);
    f.accumulate = accumulate ? 1 : 0;
    f.y_vec2 = (reinterpret_cast<uintptr_t>(y) & 7) == 0 && ldy % 2 == 0;
    return f;
}

// Launches the kernel; its dynamic shared memory (i8_smem_bytes<BN>(), above the default 48 KiB)
// must have been allowed on the device first (cudaFuncAttributeMaxDynamicSharedMemorySize).
// max_clusters > 0: a persistent grid of at most that many clusters (max_active_clusters);
// 0: one cluster per cluster tile.
template <int BN, int Conv, bool Two, bool R1 = false, int CM = 1, int CN = 1>
cudaError_t launch(const Maps &m, const I8GemmArgs &f, cudaStream_t st, int max_clusters = 0) {
    constexpr size_t smem = i8_smem_bytes<BN, R1>();
    constexpr int CS = CM * CN;
    int64_t clusters = int64_t((f.m_tiles + CM - 1) / CM) * ((f.n_tiles + CN - 1) / CN);
    if (max_clusters > 0 && clusters > max_clusters) clusters = max_clusters;
    return launch_clusters(gemm_i8_kernel<BN, Conv, Two, R1, CM, CN>, unsigned(clusters * CS), kI8Threads, smem, st,
                           unsigned(CS), f, m.a, m.w, m.sa, m.sw);
}

// The clusters of CM x CN blocks the device holds at once (a persistent grid's size); 0 when the
// query fails (the caller then launches one cluster per tile).
template <int BN, int Conv, bool Two, bool R1 = false, int CM = 1, int CN = 1>
int max_active_clusters() {
    return max_active_clusters_of(gemm_i8_kernel<BN, Conv, Two, R1, CM, CN>, kI8Threads, i8_smem_bytes<BN, R1>(),
                                  unsigned(CM * CN));
}

}  // namespace i8k
}  // namespace pf
