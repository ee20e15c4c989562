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
//    raw blocks, 32 columns of one row per thread (decode_tile; Q6_K 8 columns of four rows),
//    then fence the async proxy and arrive on the stage's "full" barrier (257 arrivals: 256 +
//    thread 0's TMA one).
//  - The raw blocks come through shared memory in "supersteps" of 256 columns (one K-quant block
//    of each row, 8 Q4_0 / Q8_0 blocks): while the producer decodes the four stages of superstep
//    j, the copies of superstep j + 1 are in flight into the other of two raw buffers. By one TMA
//    (thread 0, a 3-D map of the rows as 16-byte units, completing on the buffer's "raw_full"
//    barrier) where every row's segment is 16-byte units from a 16-byte boundary: Q4_K, Q5_K,
//    Q4_0 / Q8_0 at k % 256 == 0 (Q16Args::tma_raw); the rows then lie kBytes apart. Otherwise by
//    cp.async from every producer (16-byte copies where the segments are 16-byte aligned; 4-byte
//    words otherwise, the segment then sitting 0 or 2 bytes into its slot, which the even-offset
//    decoders read), each row in a slot of kSlot bytes, 32 mod 64 so that the 4 rows a warp
//    decodes at once read distinct banks. The TMA took the Q4_K GEMMs from 0.61-0.68x to
//    0.70-0.72x the cached cuBLAS (bench_gemm_q16, H200): the copies' address arithmetic, the
//    waits and the second barrier per superstep were a sixth of the time.
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
           16 * size_t(kStages) + 16;
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
    int slot = 0;          // bytes from one row's raw blocks to the next: RawGeom<Q>::kSlot, or kBytes (TMA)
    int buf = 0;           // bytes of one raw buffer: raw_rows * RawGeom<Q>::kSlot
    int raw_rows = kBN;    // kBN / CM: the weight rows this block decodes
    int rank = 0;          // the block's rank in its cluster
    __device__ uint32_t a(int s) const { return base + uint32_t(s) * kTileA; }
    __device__ uint32_t b(int s) const { return base + uint32_t(kStages * kTileA + s * kTileB); }
    __device__ unsigned char *b_ptr(int s) const { return ptr + kStages * kTileA + s * kTileB; }
    __device__ unsigned char *raw(int j) const {
        return ptr + kStages * (kTileA + kTileB) + (j & 1) * buf;
    }
    __device__ uint32_t raw_addr(int j) const { return base + uint32_t(kStages * (kTileA + kTileB) + (j & 1) * buf); }
    __device__ uint32_t bars() const { return base + uint32_t(kStages * (kTileA + kTileB) + 2 * buf); }
    __device__ uint32_t full(int s) const { return bars() + 8 * uint32_t(s); }
    __device__ uint32_t empty(int s) const { return bars() + 8 * uint32_t(kStages + s); }
    // raw buffer j % 2 landed (the TMA's bytes: Q16Args::tma_raw)
    __device__ uint32_t raw_full(int j) const { return bars() + 8 * uint32_t(2 * kStages + (j & 1)); }
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

// Columns of one row a producer thread decodes in a row ("a run" of the thread): 32 / CM (a
// stage's share of the thread), one K-quant sub-block or a 32-element block, so that its scale and
// its row's address are decoded once; Q6_K 8, in passes over rows, as the first form did: its
// 210-byte blocks sit at any even offset, and 8 columns of four rows per warp instruction read
// distinct banks where 32 columns of sixteen rows did not (bench_gemm_q16, H200: the 32-column
// runs took Q6_K's single blocks from 1.84 to 2.10 ms at 8192 x 2560 x 9216).
template <int Q, int CM>
constexpr int kThreadRun = Q == PF_QTYPE_Q6_K ? 8 : 32 / CM;

// The W tile of stage ks (columns 64 ks ..) from the raw buffer of its superstep: the block's
// kBN / CM rows in passes, each thread kE = kThreadRun consecutive columns of one row per pass
// (kParts threads a row), decoded and rounded as the prewarm does (decode_stage.cuh: a run's
// scale decoded once, then 8 values at a time, unrolled so that their independent reads and
// conversions overlap), one 16-byte swizzled store per 8 columns (CM = 2: into the other
// block's stage too). n0: the block's first decoded row (the tile's row r0 = n0 - the tile's
// first).
template <int Q, int CM>
__device__ __forceinline__ void decode_tile(const Q16Args &a, const Smem &sm, int n0, int r0, int ks) {
    using G = RawGeom<Q>;
    constexpr int kE = kThreadRun<Q, CM>;
    constexpr int kParts = kBK / kE;                            // threads per row
    constexpr int kRowsPerPass = kProducers / kParts;
    constexpr int kPasses = kBN / CM / kRowsPerPass;
    static_assert(kE % 8 == 0 && kPasses * kRowsPerPass * kParts * kE == kBN / CM * kBK, "every element once");
    const int j = ks / kStagesPerRaw;
    unsigned char *dst = sm.b_ptr(ks % kStages);
    const int part = int(threadIdx.x) % kParts;
    const int c0 = ks * kBK + part * kE;  // this thread's first column
    const int e0 = c0 - j * kRawCols;     // its element in the superstep
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const int r = pass * kRowsPerPass + int(threadIdx.x) / kParts;  // the tile's row r0 + r
        const unsigned char *row = sm.raw(j) + r * sm.slot;
        const uint32_t o =
            a.copy16 ? 0u : uint32_t(reinterpret_cast<uintptr_t>(raw_src(a, n0, r, j, G::kBytes)) & 3u);
        const bool row_in = n0 + r < a.n;
        RunScale sc{};
#pragma unroll
        for (int g = 0; g < kE / 8; ++g) {
            const int e = e0 + 8 * g;
            const uint32_t bo = o + uint32_t(e / G::kElems * G::kBlock);
            // Runs are aligned to kRun<Q> and e0 to kE, so a new run starts at the groups with
            // 8 g % kRun == 0 (only g = 0 when kE <= kRun). Branch-free: a row past n or a
            // column past k decodes whatever its slot holds (inside the slot) with a zero scale
            // and min, so stores zeros (+0 or -0: every integer term is finite, the bias trick's).
            if ((8 * g) % kRun<Q> == 0) sc = run_scale<Q>(row, bo, e % G::kElems);
            const bool in = row_in && c0 + 8 * g < a.k;
            float v[8];
            run_values8<Q>(row, bo, e % G::kElems, RunScale{in ? sc.d : 0.0f, in ? sc.m : 0.0f}, v);
            const uint4 out = make_uint4(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]),
                                         pack_half2(v[6], v[7]));
            // The tile's row r0 + r, its 16-byte chunk part * kE / 8 + g in the 128-byte swizzle
            // (hopper.cuh swizzled_offset; r0 is a multiple of 8).
            const int chunk = part * (kE / 8) + g;
            const uint32_t off = uint32_t((r0 + r) * kSwizzleRow + ((chunk ^ (r & 7)) << 4));
            *reinterpret_cast<uint4 *>(dst + off) = out;
            if constexpr (CM == 2)
                st_cluster_v4(mapa_cluster(sm.b(ks % kStages) + off, uint32_t(1 - sm.rank)), out);
        }
    }
}

// The producer warpgroups over the tile's stages: the X tile by TMA (thread 0), the W tile
// decoded from the raw superstep, whose copies run one superstep ahead.
template <int Q, int CM>
__device__ __forceinline__ void producer(const Q16Args &a, const CUtensorMap *tm_x, const CUtensorMap *tm_w,
                                         const Smem &sm, const Place &p, int stages) {
    using G = RawGeom<Q>;
    const int supersteps = (a.k + kRawCols - 1) / kRawCols;
    const int n0 = p.n0 + p.r0;  // the first weight row this block decodes
    // Superstep j's raw blocks by one TMA (thread 0; rows and bytes past the matrix land as zeros).
    const auto raw_load = [&](int j) {
        mbar_arrive_expect_tx(sm.raw_full(j), uint32_t(sm.raw_rows * G::kBytes));
        tma_load_3d(sm.raw_addr(j), tm_w, 0, j * (G::kBytes / 16), n0, sm.raw_full(j));
    };
    if (a.tma_raw) {
        if (threadIdx.x == 0) raw_load(0);
    } else {
        raw_issue<Q>(a, sm.raw(0), sm.raw_rows, n0, 0, int(threadIdx.x), kProducers);
        cp_async_commit();
    }
    for (int ks = 0; ks < stages; ++ks) {
        if (ks % kStagesPerRaw == 0) {
            const int j = ks / kStagesPerRaw;
            producer_sync();  // every thread is done with buffer (j + 1) % 2 (superstep j - 1)
            if (a.tma_raw) {
                if (threadIdx.x == 0 && j + 1 < supersteps) raw_load(j + 1);
                mbar_wait(sm.raw_full(j), uint32_t(j >> 1) & 1u);  // superstep j's bytes have landed
            } else {
                if (j + 1 < supersteps)
                    raw_issue<Q>(a, sm.raw(j + 1), sm.raw_rows, n0, j + 1, int(threadIdx.x), kProducers);
                cp_async_commit();
                cp_async_wait<1>();  // this thread's copies of superstep j have landed
                producer_sync();     // and everyone's (the half-words' plain stores too)
            }
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
    gemm_q16_kernel(const __grid_constant__ Q16Args a, const __grid_constant__ CUtensorMap tm_x,
                    const __grid_constant__ CUtensorMap tm_w) {
    static_assert(CM == 1 || CM == 2, "a block or a pair");
#ifdef PF_Q16_DEVICE
    extern __shared__ unsigned char smem_raw[];
    Smem sm;
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    sm.base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    sm.ptr = smem_raw + (sm.base - raw);
    sm.slot = a.tma_raw ? RawGeom<Q>::kBytes : RawGeom<Q>::kSlot;
    sm.buf = (kBN / CM) * RawGeom<Q>::kSlot;
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
        for (int j = 0; j < 2; ++j) mbar_init(sm.raw_full(j), 1);  // thread 0's expect_tx
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (CM == 1) __syncthreads();
    else cluster_sync();  // both blocks' barriers initialized before either arrives on the other's
    if (threadIdx.x < kProducers) {
        setmaxnreg_dec<kProducerRegs>();
        producer<Q, CM>(a, &tm_x, &tm_w, sm, p, stages);
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
// The raw blocks come by TMA where a.tma_raw allows (the map of the weight's rows, boxes of a
// superstep of kBN / CM rows: hopper::encode_rows_u8), by cp.async otherwise (and where the
// driver has no encoder).
template <int Q, int CM>
cudaError_t launch(const Q16Args &a, const CUtensorMap &tm_x, cudaStream_t st) {
    Q16Args b = a;
    CUtensorMap tm_w{};
    if (b.tma_raw && hopper::encode_rows_u8(&tm_w, b.w, b.row_bytes, b.n, RawGeom<Q>::kBytes, kBN / CM) !=
                         CUDA_SUCCESS)
        b.tma_raw = 0;
    return launch_clusters(gemm_q16_kernel<Q, CM>, unsigned(grid_blocks<CM>(b)), kThreads, smem_bytes<Q, CM>(), st,
                           unsigned(CM), b, tm_x, tm_w);
}

}  // namespace q16
}  // namespace pf
