// gemm_q16_kernel.cuh — the f16 leg's GEMM with its weight operand read from the GGUF blocks
// (weight form F16Blocks, plan/route.h; sm_90a): Y[rows][n] (+)= X[rows][k] . W^T with X the
// f16 leg's fp16 input rows, W [n][k] GGUF blocks dequantized on the chip to exactly the fp16
// values of the prewarm's cache (decode_stage.cuh: the same exact fp32 values, rounded once to
// nearest even), the products on the tensor cores with fp32 accumulation (wgmma), and the f16
// leg's row unscale fused into the fp32 store. Self-contained (CUDA runtime, ptx/, the
// decoders) so that the library (gemm_q16.cu) and a micro-benchmark build the same code.
//
// The block (the structure of the 8-bit leg's gemm_i8_kernel.cuh, the weight side dequantized
// in the block instead of loaded ready):
//  - 512 threads: two producer warpgroups and two consumer warpgroups. A block owns a 256-row x
//    128-column output tile (kBM x kBN): each consumer the products of 128 rows of X (two
//    64-row accumulators: a decoded W tile serves 256 rows, which halves the decoding per
//    product against 128-row tiles), the producers the operands; setmaxnreg gives the consumers
//    168 registers and the producers 88. Two producer warpgroups, not one: the decoding is a chain of
//    dependent shared-memory reads and conversions, and one warp per SM sub-partition left the
//    tensor cores waiting (first GPU run: 0.25x cuBLAS on the cache at 2048 rows; 2 warps per
//    sub-partition and the passes unrolled give each sub-partition independent work). K runs in
//    stages of kBK = 64 columns (one 128-byte swizzled row of fp16 per matrix row, the layout
//    wgmma reads: ptx/hopper.cuh).
//  - The producers' thread 0 loads a stage's X tile (256 x 64 fp16) with TMA; all 256 producer
//    threads write the stage's W tile (128 weight rows x 64 columns, fp16, swizzled) from the
//    raw blocks, 8 columns of one row per thread and pass (decode8_stage), then fence the async
//    proxy and arrive on the stage's "full" barrier (257 arrivals: 256 + thread 0's TMA one).
//  - The raw blocks come through shared memory in "supersteps" of 256 columns (one K-quant block
//    of each row, 8 Q4_0 / Q8_0 blocks): while the producer decodes the four stages of superstep
//    j, the copies of superstep j + 1 are in flight into the other of two raw buffers (cp.async:
//    16-byte copies where every row's segment is 16-byte aligned, Q4_K / Q5_K and Q4_0 / Q8_0 at
//    k % 256 == 0; 4-byte words otherwise, the segment then sitting 0 or 2 bytes into its slot,
//    which the even-offset decoders read). Each weight row has a slot of kSlot bytes, 32 mod 64
//    so that the 4 rows a warp decodes at once read distinct banks.
//  - A consumer waits for a stage, issues 2 x 4 x wgmma.m64n128k16 on it (A = its 128 rows of X,
//    B = the W tile, both K-major from shared memory), commits, and releases the stage before
//    (one arrival per warp on its "empty" barrier) once the next stage's products are issued:
//    one group in flight while the producer refills.
//  - The epilogue: y = (accumulate ? y : 0) + acc, then y *= inv[row] where the producers
//    scaled a row (kernels/rows/f16_rows.cuh): the f16 leg's GEMM + unscale in one pass.
// One block per tile, tiles rastered in bands of kBand row tiles (row tile fastest) so that the
// blocks resident at once share their weight tile's raw blocks in L2.
//
// Pairs (CM = 2): clusters of two blocks on two row tiles of one weight tile, each decoding half
// of the W tile's rows (64) and storing every decoded 16-byte chunk into its own and the other
// block's stage (st.shared::cluster): the decoding per product halves again (a decoded W tile
// serves 512 rows), as CUTLASS's and DeepGEMM's multicast halve the loads of a shared tile. A
// stage's "full" barrier then counts the 8 producer warps of each block (one arrival per warp
// after __syncwarp; the other block's with release at cluster scope, waited on with acquire at
// cluster scope) and the TMA's; its "empty" barrier the consumer warps of both blocks (each warp
// arrives on both, as the 8-bit leg's clusters do), so a producer overwrites a stage in both
// blocks only when both have consumed it. The products, their order and the outputs are the
// single block's bit for bit. A block whose row tile is past the matrix (an odd number of row
// tiles) decodes its half for the other and reads rows 0.. of X, storing nothing. Rows past `rows`, weight
// rows past n and columns past k read as zeros (the TMA's fill, the decoder's zeros).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/q16_raw.cuh"
#include "kernels/gemm/wgmma_store.cuh"
#include "ptx/hopper.cuh"
#include "ptx/mma.cuh"
#include "ptx/wgmma.cuh"

namespace pf {
namespace q16 {

using namespace hopper;

constexpr int kBM = 256;                 // rows of X per block: 2 consumer warpgroups x 2 x 64
constexpr int kBN = 128;                 // weight rows per block
constexpr int kBK = 64;                  // columns per stage: one swizzled fp16 row
constexpr int kStagesPerRaw = kRawCols / kBK;
constexpr int kThreads = 512;            // 2 producer warpgroups + 2 consumer warpgroups
constexpr int kProducers = 256;          // the dequantizing threads (2 warps per SM sub-partition)
constexpr int kConsumerWarps = 8;
constexpr int kStages = 3;               // X / W stages in flight (3 x 48 KiB + the raw buffers)
constexpr int kProducerRegs = 88;        // setmaxnreg split: 256 * 88 + 256 * 168 = 65536
constexpr int kConsumerRegs = 168;       // two 64 x 128 fp32 accumulators (128) and the rest
constexpr int kTileA = kBM * kBK * 2;    // bytes of one stage's X tile
constexpr int kTileB = kBN * kBK * 2;    // bytes of one stage's W tile
constexpr int kBand = 8;                 // row tiles per raster band
constexpr int kProducerBarrier = 1;      // named barrier of the producer warpgroups (0: __syncthreads)

// The smem of a block of a CM-block cluster: its raw buffers hold its kBN / CM rows.
template <int Q, int CM = 1>
__host__ __device__ constexpr size_t smem_bytes() {
    return size_t(kSwizzleAtom) + size_t(kStages) * (kTileA + kTileB) + 2 * size_t(kBN / CM) * RawGeom<Q>::kSlot +
           16 * size_t(kStages);
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PF_Q16_DEVICE 1
#endif

#ifdef PF_Q16_DEVICE

// The shared-memory layout: stage s's X tile, W tile, the two raw buffers (raw_rows rows each),
// the barriers.
struct Smem {
    uint32_t base = 0;     // shared address of the 1024-aligned start
    unsigned char *ptr = nullptr;
    int slot = 0;          // RawGeom<Q>::kSlot
    int raw_rows = kBN;    // kBN / CM: the weight rows this block decodes
    int rank = 0;          // the block's rank in its cluster
    __device__ uint32_t a(int s) const { return base + uint32_t(s) * kTileA; }
    __device__ uint32_t b(int s) const { return base + uint32_t(kStages * kTileA + s * kTileB); }
    __device__ unsigned char *b_ptr(int s) const { return ptr + kStages * kTileA + s * kTileB; }
    __device__ unsigned char *raw(int j) const {
        return ptr + kStages * (kTileA + kTileB) + (j & 1) * raw_rows * slot;
    }
    __device__ uint32_t bars() const { return base + uint32_t(kStages * (kTileA + kTileB) + 2 * raw_rows * slot); }
    __device__ uint32_t full(int s) const { return bars() + 8 * uint32_t(s); }
    __device__ uint32_t empty(int s) const { return bars() + 8 * uint32_t(kStages + s); }
};

// A block's place: its output tile's first row and weight row, its first decoded weight row in
// the tile (r0 = rank * kBN / CM) and its cluster rank; live: its row tile is inside the matrix.
struct Place {
    int m0, n0, r0, rank;
    bool live;
};

__device__ __forceinline__ void producer_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kProducerBarrier), "n"(kProducers) : "memory");
}

// The W tile of stage ks (columns 64 ks ..) from the raw buffer of its superstep: the block's
// kBN / CM rows in 4 / CM passes of the producer warpgroups, each thread one row's 8 columns per
// pass (8 lanes a row, 4 rows a warp instruction), decoded and rounded as the prewarm does, one
// 16-byte swizzled store each (CM = 2: into the other block's stage too); the passes unrolled,
// so that their independent reads and conversions overlap. n0: the block's first decoded row
// (the tile's row r0 = n0 - the tile's first).
template <int Q, int CM>
__device__ __forceinline__ void decode_tile(const Q16Args &a, const Smem &sm, int n0, int r0, int ks) {
    using G = RawGeom<Q>;
    const int j = ks / kStagesPerRaw;
    const unsigned char *raw = sm.raw(j);
    unsigned char *dst = sm.b_ptr(ks % kStages);
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int g = lane & 7;
    const int col = ks * kBK + 8 * g;  // this lane's first column
    const int e = col - j * kRawCols;  // its element in the superstep
    constexpr int kRowsPerWarp = kBN / CM / (kProducers / 32);  // 16 / CM: 4 / CM passes of 4 rows
#pragma unroll
    for (int pass = 0; pass < kRowsPerWarp / 4; ++pass) {
        const int r = warp * kRowsPerWarp + pass * 4 + (lane >> 3);  // the block's row r, the tile's r0 + r
        // Branch-free, so that the passes' reads and conversions interleave: a row past n or a
        // column past k decodes whatever its slot holds (inside the slot) and stores zeros.
        const uint32_t o =
            a.copy16 ? 0u : uint32_t(reinterpret_cast<uintptr_t>(raw_src(a, n0, r, j, G::kBytes)) & 3u);
        float v[8];
        decode8_stage<Q>(raw + r * G::kSlot, o + uint32_t(e / G::kElems * G::kBlock), e % G::kElems, v);
        uint4 out = make_uint4(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]),
                               pack_half2(v[6], v[7]));
        if (!(n0 + r < a.n && col < a.k)) out = make_uint4(0u, 0u, 0u, 0u);
        // The tile's row r0 + r, its 16-byte chunk g in the 128-byte swizzle (hopper.cuh
        // swizzled_offset; r0 is a multiple of 8).
        const uint32_t off = uint32_t((r0 + r) * kSwizzleRow + ((g ^ (r & 7)) << 4));
        *reinterpret_cast<uint4 *>(dst + off) = out;
        if constexpr (CM == 2) st_cluster_v4(mapa_cluster(sm.b(ks % kStages) + off, uint32_t(1 - sm.rank)), out);
    }
}

// The producer warpgroups over the tile's stages: the X tile by TMA (thread 0), the W tile
// decoded from the raw superstep, whose copies run one superstep ahead.
template <int Q, int CM>
__device__ __forceinline__ void producer(const Q16Args &a, const CUtensorMap *tm_x, const Smem &sm, const Place &p,
                                         int stages) {
    const int supersteps = (a.k + kRawCols - 1) / kRawCols;
    const int n0 = p.n0 + p.r0;  // the first weight row this block decodes
    raw_issue<Q>(a, sm.raw(0), sm.raw_rows, n0, 0, int(threadIdx.x), kProducers);
    cp_async_commit();
    for (int ks = 0; ks < stages; ++ks) {
        if (ks % kStagesPerRaw == 0) {
            const int j = ks / kStagesPerRaw;
            producer_sync();  // every thread is done with buffer (j + 1) % 2 (superstep j - 1)
            if (j + 1 < supersteps) raw_issue<Q>(a, sm.raw(j + 1), sm.raw_rows, n0, j + 1, int(threadIdx.x), kProducers);
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of superstep j have landed
            producer_sync();     // and everyone's (the half-words' plain stores too)
        }
        const int s = ks % kStages, use = ks / kStages;
        if (use > 0) mbar_wait(sm.empty(s), uint32_t(use - 1) & 1u);  // (CM = 2: both blocks' consumers)
        if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(sm.full(s), kTileA);
            tma_load_2d(sm.a(s), tm_x, ks * kBK, p.live ? p.m0 : 0, sm.full(s));
        }
        decode_tile<Q, CM>(a, sm, n0, p.r0, ks);
        if constexpr (CM == 1) {
            fence_proxy_async();  // the generic-proxy stores, before wgmma reads them
            mbar_arrive(sm.full(s));
        } else {
            fence_proxy_async_cluster();  // this thread's stores into both blocks
            __syncwarp();                 // the warp's stores before its arrivals
            const int lane = int(threadIdx.x) & 31;
            if (lane == 0) mbar_arrive(sm.full(s));
            if (lane == 1) mbar_arrive_release_cluster(mapa_cluster(sm.full(s), uint32_t(1 - sm.rank)));
        }
    }
    cp_async_wait_all();  // nothing in flight when the thread ends
    if constexpr (CM == 2) {
        // The other block's consumers arrive on this block's "empty" barriers until they are done
        // with every stage: this block ends only after the last arrival of each (the stages' last
        // uses released by both blocks), as the 8-bit leg's clusters end (gemm_i8_kernel.cuh).
        for (int ks = max(0, stages - kStages); ks < stages; ++ks)
            mbar_wait(sm.empty(ks % kStages), uint32_t(ks / kStages) & 1u);
    }
}

// Rows row_in_tile and row_in_tile + 8 of the consumer warp, columns 8 j + 2 tig (+1), j < 16
// (the wgmma D layout, ptx/wgmma.cuh): y = (accumulate ? y : 0) + acc, times the row's inverse
// scale where the producer scaled it.
__device__ __forceinline__ void epilogue(const Q16Args &a, const float (&acc)[kBN / 2], int m0, int n0,
                                         int row_in_tile, int tig) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m0 + row_in_tile + 8 * h;
        if (r >= a.rows) continue;
        const float s = a.inv ? a.inv[r] : 1.0f;
        float *yr = a.y + int64_t(r) * a.ldy;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
            store_pair<true>(yr, n0 + 8 * j + 2 * tig, a.n, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], a.y_vec2,
                             a.accumulate, s);
    }
}

// A consumer warpgroup over the tile's stages, then its 128 rows' outputs: two accumulators of
// 64 rows each (the M of one wgmma), both against the stage's one W tile. CM = 2: a stage is
// released to both blocks' producers (lane 0 arrives on block 0's barrier, lane 1 on block 1's).
template <int CM>
__device__ __forceinline__ void consumer(const Q16Args &a, const Smem &sm, const Place &p, int stages) {
    const int m0 = p.m0, n0 = p.n0;
    const int ctid = int(threadIdx.x) - kProducers;
    const int wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    constexpr int kRowsPerWg = kBM / 2;
    const uint64_t da0 = smem_desc(sm.a(0) + uint32_t(wg * kRowsPerWg) * kSwizzleRow, 16, kSwizzleAtom);
    const uint64_t db0 = smem_desc(sm.b(0), 16, kSwizzleAtom);
    const auto release = [&](int s) {
        __syncwarp();
        if constexpr (CM == 1) mbar_arrive_if(sm.empty(s), lane == 0);
        else mbar_arrive_cluster_if(sm.empty(s), uint32_t(lane), lane < CM);
    };
    float acc0[kBN / 2], acc1[kBN / 2];
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc0[i] = 0.f, acc1[i] = 0.f;
    for (int ks = 0; ks < stages; ++ks) {
        const int s = ks % kStages;
        if constexpr (CM == 1) mbar_wait(sm.full(s), uint32_t(ks / kStages) & 1u);
        else mbar_wait_cluster(sm.full(s), uint32_t(ks / kStages) & 1u);  // the other block's stores too
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {  // 4 x k16 = the stage's 128 bytes of each row
            const uint64_t da = desc_add(da0, uint32_t(s) * kTileA + 32 * kk);
            const uint64_t db = desc_add(db0, uint32_t(s) * kTileB + 32 * kk);
            wgmma::wgmma_ss<kBN>(acc0, da, db, 1);
            wgmma::wgmma_ss<kBN>(acc1, desc_add(da, 64 * kSwizzleRow), db, 1);
        }
        wgmma_commit();
        if (ks > 0) {
            wgmma_wait<1>();  // stage ks - 1's products are done: its tiles may be refilled
            release((ks - 1) % kStages);
        }
    }
    wgmma_wait<0>();
    fence_regs(acc0);
    fence_regs(acc1);
    release((stages - 1) % kStages);
    if (!p.live) return;  // a pair's block past the matrix: rows 0.. of X, nothing to store
    epilogue(a, acc0, m0, n0, wg * kRowsPerWg + warp * 16 + gid, tig);
    epilogue(a, acc1, m0, n0, wg * kRowsPerWg + 64 + warp * 16 + gid, tig);
}

#endif  // PF_Q16_DEVICE

// One block per kBM x kBN output tile, in clusters of CM blocks on CM row tiles of one weight
// tile (m_tiles rounded up to CM, times n_tiles blocks), kThreads threads, smem_bytes<Q, CM>() of
// dynamic shared memory.
template <int Q, int CM = 1>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_q16_kernel(const __grid_constant__ Q16Args a, const __grid_constant__ CUtensorMap tm_x) {
    static_assert(CM == 1 || CM == 2, "a block or a pair");
#ifdef PF_Q16_DEVICE
    extern __shared__ unsigned char smem_raw[];
    Smem sm;
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    sm.base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    sm.ptr = smem_raw + (sm.base - raw);
    sm.slot = RawGeom<Q>::kSlot;
    sm.raw_rows = kBN / CM;
    sm.rank = CM > 1 ? int(cluster_ctarank()) : 0;
    // Cluster tiles (CM row tiles) in bands of kBand / CM cluster rows.
    int mc, nt;
    band_tile(int(blockIdx.x) / CM, (a.m_tiles + CM - 1) / CM, a.n_tiles, kBand / CM, mc, nt);
    const int mt = mc * CM + sm.rank;
    const Place p{mt * kBM, nt * kBN, sm.rank * (kBN / CM), sm.rank, mt < a.m_tiles};
    const int stages = (a.k + kBK - 1) / kBK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            // The decoders (CM = 1: every thread; 2: each warp of both blocks) + the TMA's expect_tx.
            mbar_init(sm.full(s), CM == 1 ? kProducers + 1 : 2 * (kProducers / 32) + 1);
            mbar_init(sm.empty(s), CM * kConsumerWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CM == 1) __syncthreads();
    else cluster_sync();  // both blocks' barriers initialized before either arrives on the other's
    if (threadIdx.x < kProducers) {
        setmaxnreg_dec<kProducerRegs>();
        producer<Q, CM>(a, &tm_x, sm, p, stages);
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    consumer<CM>(a, sm, p, stages);
#endif  // PF_Q16_DEVICE
}

// The arguments of this kernel's tiles (kBM rows of X x kBN weight rows).
template <int Q>
inline Q16Args make_args(const void *blocks, int64_t n, int64_t k, const float *inv, int64_t rows, float *y,
                         int64_t ldy, bool accumulate) {
    return args_for<Q>(blocks, n, k, inv, rows, y, ldy, accumulate, kBM, kBN);
}

// The blocks of a launch: m_tiles rounded up to CM, times n_tiles.
template <int CM>
inline int64_t grid_blocks(const Q16Args &a) {
    return int64_t((a.m_tiles + CM - 1) / CM) * CM * a.n_tiles;
}

// Launches the kernel in clusters of CM blocks (grid_blocks<CM>(a) blocks); its dynamic shared
// memory (smem_bytes<Q, CM>(), above the default 48 KiB) must have been allowed on the device
// first (cudaFuncAttributeMaxDynamicSharedMemorySize).
template <int Q, int CM>
cudaError_t launch(const Q16Args &a, const CUtensorMap &tm_x, cudaStream_t st) {
    return launch_clusters(gemm_q16_kernel<Q, CM>, unsigned(grid_blocks<CM>(a)), kThreads, smem_bytes<Q, CM>(), st,
                           unsigned(CM), a, tm_x);
}

}  // namespace q16
}  // namespace pf
