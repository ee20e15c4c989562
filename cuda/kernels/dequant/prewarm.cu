// prewarm.cu — the fp16 caches of many matrices in a few launches (prewarm.cuh).
//
// Why it is shaped this way (a copy-bandwidth-bound job: each element is read once as a few
// bits and written once as 2 bytes, so the kernel must keep DRAM busy in both directions):
//  - One grid for up to kJobsPerLaunch matrices: the job table travels in the kernel's
//    parameters (no table upload, no allocation). A model's ~300 matrices are a handful of
//    launches that fill all SMs, instead of one small launch per matrix with a tail each.
//  - The work is cut in tiles of kTileElems consecutive elements of one matrix. A matrix of
//    GGUF blocks is a flat run of blocks (rows of k / block_elems blocks back to back) and its
//    fp16 copy a flat run of elements, so a tile is a contiguous byte range in and out.
//  - Persistent CTAs: the grid is what fits on the device at once (occupancy x SMs, at most
//    the tile count) and CTA c takes tiles c, c + grid, c + 2 grid, ... in turn; it finds a
//    tile's matrix by walking the job table forward (the tiles it takes only grow).
//  - Block types, double-buffered: while a CTA decodes tile t from one shared-memory stage, the
//    blocks of its next tile are already on their way into the other (cp.async, 16 bytes per
//    copy, issued before the decode). The load latency thus hides behind a whole tile of
//    decoding, and every resident CTA keeps a tile of reads in flight at all times (v1 staged
//    one tile, waited, decoded: its reads and its writes took turns).
//  - Decoding: each thread decodes 8 consecutive elements (one sub-block, one header) from the
//    stage with 8-byte loads of the quants, and writes them with one 16-byte store. The integer
//    quants become floats through the exponent trick (a byte under the exponent of 2^23 is the
//    float 2^23 + byte, exact; subtracting the bias is exact), not through I2F, a
//    quarter-rate conversion of which v1 spent one per element next to the fp16 rounding.
//  - Element types (F32, F16, BF16): 16-byte loads and stores straight from and to global,
//    two groups' loads issued before either is converted.
// The arithmetic is that of quant.cuh's decode8 on the same exact fp32 values (the products
// are exact, quant.cuh; the decoders from a staged copy of the blocks are decode_stage.cuh's,
// shared with the f16 leg's GEMM on the blocks), then __float2half_rn per element, so the output
// equals dequantize()'s fp16 output bit for bit.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/dequant/decode_stage.cuh"
#include "kernels/dequant/dequant.cuh"
#include "kernels/dequant/prewarm.cuh"
#include "kernels/dequant/quant.cuh"
#include "plan/qtype.h"
#include "ptx/common.cuh"
#include "ptx/mma.cuh"

namespace pf {
namespace {

constexpr int kThreads = 256;        // 8 warps per CTA
constexpr int kMinCtasPerSm = 6;     // 48 warps per SM: caps registers at 40 per thread
constexpr int kGroup = 8;            // elements per thread and step: one 16-byte fp16 store
constexpr int kTileElems = 8192;     // elements per tile: 4 steps of kThreads x kGroup
constexpr int kJobsPerLaunch = 96;   // 32-byte jobs: the parameters stay under the 4 KB limit
constexpr int kStagePad = 16;        // 8-byte reads at 2-byte-aligned offsets read 4 bytes ahead
// Largest tile of blocks: Q8_0, 34 bytes per 32 elements.
constexpr int kStageBytes = kTileElems / kQK8_0 * int(sizeof(block_q8_0));
constexpr int kStageStride = kStageBytes + kStagePad;  // one of the two stages
static_assert(kTileElems % (kThreads * kGroup) == 0, "a tile is whole steps");
static_assert(kTileElems % (8 * kQK_K) == 0, "a tile is 8 K-quant blocks: 16-byte aligned");
static_assert(kTileElems / kQK_K * sizeof(block_q6_K) <= size_t(kStageBytes), "Q6_K fits");
static_assert(kTileElems / kQK4_0 * sizeof(block_q4_0) <= size_t(kStageBytes), "Q4_0 fits");
static_assert(kTileElems / kQK_K * sizeof(block_q5_K) <= size_t(kStageBytes), "Q5_K fits");
static_assert(kStageStride % 16 == 0, "the second stage starts 16-byte aligned (cp.async)");
static_assert(2 * kStageStride <= 48 * 1024, "static shared memory");

struct batch_job {        // prewarm_job, with where its tiles start in the launch
    const uint8_t *src;
    __half *dst;
    int64_t elems;
    uint32_t first_tile;  // tiles [first_tile, next job's first_tile) are this job's
    int32_t qtype;
};
static_assert(sizeof(batch_job) == 32, "the parameter budget assumes 32-byte jobs");

struct BatchArgs {
    int32_t n_jobs;
    uint32_t n_tiles;     // all jobs' tiles (each job has at least one)
    batch_job job[kJobsPerLaunch];
};
static_assert(sizeof(BatchArgs) <= 4096, "kernel parameters must stay within 4 KB");

// ------------------------------------------------------------------ stores

// 8 fp16 in one 16-byte store; streaming (.cs): the caches are not read again soon.
__device__ __forceinline__ void store8(__half *out, const float *v) {
    __stcs(reinterpret_cast<uint4 *>(out),
           make_uint4(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]),
                      pack_half2(v[6], v[7])));
}

// ------------------------------------------------------------------ staging (cp.async)

// Elements per block and bytes per block of a block type; false for the element types.
__device__ __forceinline__ bool block_geometry(int32_t qtype, int &elems, int &bytes) {
    switch (qtype) {
        case PF_QTYPE_Q4_0: elems = kQK4_0; bytes = int(sizeof(block_q4_0)); return true;
        case PF_QTYPE_Q8_0: elems = kQK8_0; bytes = int(sizeof(block_q8_0)); return true;
        case PF_QTYPE_Q4_K: elems = kQK_K; bytes = int(sizeof(block_q4_K)); return true;
        case PF_QTYPE_Q5_K: elems = kQK_K; bytes = int(sizeof(block_q5_K)); return true;
        case PF_QTYPE_Q6_K: elems = kQK_K; bytes = int(sizeof(block_q6_K)); return true;
        case PF_QTYPE_IQ4_XS: elems = kQK_K; bytes = int(sizeof(block_iq4_xs)); return true;
        default: return false;
    }
}

// First element and element count of tile t of job j.
__device__ __forceinline__ int64_t tile_start(const batch_job &j, uint32_t t) {
    return int64_t(t - j.first_tile) * kTileElems;
}
__device__ __forceinline__ int tile_count(const batch_job &j, int64_t e0) {
    return j.elems - e0 < kTileElems ? int(j.elems - e0) : kTileElems;
}

// Starts copying the blocks of tile t (of job j, a block type) into `stage`: 16-byte cp.async
// copies by all threads (the tile starts 16-byte aligned: a tile is a whole number of 8-block
// runs, and the job's blocks start aligned). A matrix's last tile may end inside a 16-byte
// word: its even tail (block sizes are even) is read with 2-byte loads, never past the matrix,
// and stored at once (visible after the barrier that precedes the decoding). Element-type
// tiles stage nothing. The caller commits the group.
__device__ __forceinline__ void stage_issue(const batch_job &j, uint32_t t, uint8_t *stage) {
    int be = 0, bb = 0;
    if (!block_geometry(j.qtype, be, bb)) return;
    const int64_t e0 = tile_start(j, t);
    const uint8_t *src = j.src + e0 / be * bb;
    const int nbytes = tile_count(j, e0) / be * bb;
    const int nvec = nbytes / 16;
    for (int i = threadIdx.x; i < nvec; i += kThreads) cp_async16(stage + 16 * i, src + 16 * i);
    for (int b = nvec * 16 + 2 * int(threadIdx.x); b < nbytes; b += 2 * kThreads)
        *reinterpret_cast<uint16_t *>(stage + b) = *reinterpret_cast<const uint16_t *>(src + b);
}

// ------------------------------------------------------------------ one tile

// Elements [e0, e0 + n) of a block-type job from its staged blocks: 8 per thread and step.
template <int Q>
__device__ __forceinline__ void tile_blocks(const batch_job &j, int64_t e0, int n,
                                            const uint8_t *stage) {
    using T = qtraits<Q>;
    constexpr int kGroupsPerBlock = T::kElems / kGroup;
    const int groups = n / kGroup;
    __half *dst = j.dst + e0;
#pragma unroll 1  // registers for occupancy (latency is hidden by other warps), not for unrolling
    for (int g = threadIdx.x; g < groups; g += kThreads) {
        const int blk = g / kGroupsPerBlock, i0 = (g % kGroupsPerBlock) * kGroup;
        float v[kGroup];
        decode8_stage<Q>(stage, uint32_t(blk * T::kBytes), i0, v);
        store8(dst + int64_t(g) * kGroup, v);
    }
}

// Element e of an F32 / F16 / BF16 source from its raw bits (qtraits<Q>::decode's arithmetic).
template <int Q>
__device__ __forceinline__ float elem_from_bits(uint32_t bits) {
    if constexpr (Q == PF_QTYPE_F32) return __uint_as_float(bits);
    else if constexpr (Q == PF_QTYPE_F16) return __half2float(__ushort_as_half(uint16_t(bits)));
    else return __uint_as_float(bits << 16);  // BF16: the top half of an fp32
}

// One 8-element group of an element type: its source words (two 16-byte loads for F32, one
// for F16 / BF16), then the fp16 store.
template <int Q>
struct elem_group {
    static constexpr int kWords = qtraits<Q>::kBytes == 4 ? 2 : 1;  // 16-byte loads per group
    uint4 w[kWords];
    __device__ __forceinline__ void load(const uint8_t *src, int g) {
#pragma unroll
        for (int i = 0; i < kWords; ++i)
            w[i] = __ldcs(reinterpret_cast<const uint4 *>(src) + kWords * g + i);
    }
    __device__ __forceinline__ void store(__half *dst, int g) const {
        float v[kGroup];
        if constexpr (kWords == 2) {
            const uint32_t u[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = elem_from_bits<Q>(u[e]);
        } else {
            const uint32_t u[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[2 * e] = elem_from_bits<Q>(u[e] & 0xFFFFu);
                v[2 * e + 1] = elem_from_bits<Q>(u[e] >> 16);
            }
        }
        store8(dst + int64_t(g) * kGroup, v);
    }
};

// Elements [e0, e0 + n) of an element-type job: 16-byte loads and stores when both ends are
// 16-byte aligned (then every 8-element group is), two groups per thread loaded before either
// is stored (the compiler may not move a load above a store that could alias it); element by
// element otherwise and for the tail of a length that is not a multiple of 8.
template <int Q>
__device__ __forceinline__ void tile_elems(const batch_job &j, int64_t e0, int n) {
    using T = qtraits<Q>;
    const uint8_t *src = j.src + e0 * T::kBytes;
    __half *dst = j.dst + e0;
    const bool vec = ((reinterpret_cast<uintptr_t>(j.src) | reinterpret_cast<uintptr_t>(j.dst)) & 15) == 0;
    const int groups = vec ? n / kGroup : 0;
    for (int g = threadIdx.x; g < groups; g += 2 * kThreads) {
        const bool second = g + kThreads < groups;
        elem_group<Q> a, b;
        a.load(src, g);
        if (second) b.load(src, g + kThreads);
        a.store(dst, g);
        if (second) b.store(dst, g + kThreads);
    }
    for (int e = groups * kGroup + int(threadIdx.x); e < n; e += kThreads)
        dst[e] = __float2half_rn(T::decode(src + int64_t(e) * T::kBytes, 0));
}

// Tile t of job j: decoded from `stage` (block types, staged by stage_issue) or converted
// straight from global (element types).
__device__ __forceinline__ void run_tile(const batch_job &j, uint32_t t, const uint8_t *stage) {
    const int64_t e0 = tile_start(j, t);
    const int n = tile_count(j, e0);
    switch (j.qtype) {
        case PF_QTYPE_F32: tile_elems<PF_QTYPE_F32>(j, e0, n); break;
        case PF_QTYPE_F16: tile_elems<PF_QTYPE_F16>(j, e0, n); break;
        case PF_QTYPE_BF16: tile_elems<PF_QTYPE_BF16>(j, e0, n); break;
        case PF_QTYPE_Q4_0: tile_blocks<PF_QTYPE_Q4_0>(j, e0, n, stage); break;
        case PF_QTYPE_Q8_0: tile_blocks<PF_QTYPE_Q8_0>(j, e0, n, stage); break;
        case PF_QTYPE_Q4_K: tile_blocks<PF_QTYPE_Q4_K>(j, e0, n, stage); break;
        case PF_QTYPE_Q5_K: tile_blocks<PF_QTYPE_Q5_K>(j, e0, n, stage); break;
        case PF_QTYPE_Q6_K: tile_blocks<PF_QTYPE_Q6_K>(j, e0, n, stage); break;
        case PF_QTYPE_IQ4_XS: tile_blocks<PF_QTYPE_IQ4_XS>(j, e0, n, stage); break;
        default: break;  // the host admits only the types above
    }
}

// The job that owns tile t: the last one whose first tile is <= t (jobs are in tile order).
__device__ __forceinline__ int find_job(const BatchArgs &a, uint32_t t) {
    int lo = 0, hi = a.n_jobs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (a.job[mid].first_tile <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
// The same from job `from` on, for a tile t at or after that job's first: a CTA's tiles only
// grow, so over a launch it walks the table once.
__device__ __forceinline__ int next_job(const BatchArgs &a, int from, uint32_t t) {
    while (from + 1 < a.n_jobs && a.job[from + 1].first_tile <= t) ++from;
    return from;
}

// Persistent CTAs over all tiles of the launch (gridDim.x <= n_tiles): CTA c takes tiles c,
// c + gridDim.x, ... Two stages: tile t is decoded from stage[buf] while the next tile's blocks
// arrive in stage[buf ^ 1]. Per tile, one cp.async group per thread (empty when there is
// nothing to stage), so "all but the newest group done" means "tile t staged" for this thread,
// and the barrier after it extends that to the CTA. The barrier after the decoding frees
// stage[buf] for the copy issued at the top of the next iteration. Every branch below is
// uniform over the CTA (t, the job and the stage are the same in all threads).
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    prewarm_kernel(const __grid_constant__ BatchArgs a) {
    __shared__ __align__(16) uint8_t stage[2][kStageStride];
    uint32_t t = blockIdx.x;
    int jt = find_job(a, t);
    stage_issue(a.job[jt], t, stage[0]);
    cp_async_commit();
    for (int buf = 0;; buf ^= 1) {
        const uint32_t next = t + gridDim.x;  // < 2^32: t < n_tiles and gridDim.x <= n_tiles < 2^31
        const bool more = next < a.n_tiles;
        const int jn = more ? next_job(a, jt, next) : jt;
        if (more) stage_issue(a.job[jn], next, stage[buf ^ 1]);
        cp_async_commit();
        cp_async_wait_all_but_newest();
        __syncthreads();
        run_tile(a.job[jt], t, stage[buf]);
        if (!more) break;
        __syncthreads();
        t = next;
        jt = jn;
    }
}

bool is_block_type(int32_t qtype) {
    return qtype != PF_QTYPE_F32 && qtype != PF_QTYPE_F16 && qtype != PF_QTYPE_BF16;
}

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// CTAs of prewarm_kernel resident on the current device at once: the persistent grid.
pf_status resident_ctas(int64_t *out) {
    int sms = 0, per_sm = 0;
    PF_TRY(device_sm_count(&sms));
    PF_CUDA_TRY(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, prewarm_kernel, kThreads, 0));
    *out = int64_t(std::max(sms, 1)) * std::max(per_sm, 1);
    return PF_STATUS_OK;
}

pf_status launch_batch(BatchArgs &a, int64_t max_grid, cudaStream_t stream) {
    if (a.n_jobs == 0) return PF_STATUS_OK;
    const unsigned grid = unsigned(std::min<int64_t>(a.n_tiles, max_grid));
    prewarm_kernel<<<grid, kThreads, 0, stream>>>(a);
    PF_LAUNCH_CHECK("prewarm_kernel (%d matrices, %u tiles, %u CTAs)", int(a.n_jobs), a.n_tiles,
                    grid);
    a.n_jobs = 0;
    a.n_tiles = 0;
    return PF_STATUS_OK;
}

}  // namespace

void prewarm_kernel_load() {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, prewarm_kernel) != cudaSuccess) (void)cudaGetLastError();
}

pf_status prewarm_dequantize(const std::vector<prewarm_job> &jobs, cudaStream_t stream, bool one_tile) {
    for (const prewarm_job &j : jobs) {
        int64_t be = 0, bb = 0;
        if (!qtype_block(j.qtype, &be, &bb))
            return fail(PF_STATUS_UNSUPPORTED, "prewarm: GGML type %d is not supported", int(j.qtype));
        PF_CHECK_ARG(j.elems >= 0 && j.elems % be == 0,
                     "prewarm: %lld elements is not a whole number of %s blocks", (long long)j.elems,
                     pf_qtype_name(j.qtype));
    }
    int64_t max_grid = kMaxGridX;
    if (!one_tile) PF_TRY(resident_ctas(&max_grid));
    BatchArgs a{};
    for (const prewarm_job &j : jobs) {
        if (j.elems == 0) continue;
        // The fast path stages 16-byte words of the blocks and stores 16-byte fp16 groups.
        if (!aligned16(j.src) || (is_block_type(j.qtype) && !aligned16(j.dst))) {
            PF_TRY(dequantize(j.src, j.qtype, 1, j.elems, j.dst, true, stream));
            continue;
        }
        const int64_t tiles = (j.elems + kTileElems - 1) / kTileElems;
        if (a.n_jobs == kJobsPerLaunch || int64_t(a.n_tiles) + tiles > kMaxGridX)
            PF_TRY(launch_batch(a, max_grid, stream));
        // A single matrix of more than 2^31 tiles (2^44 elements) cannot exist on a device.
        a.job[a.n_jobs++] = batch_job{static_cast<const uint8_t *>(j.src), j.dst, j.elems,
                                      a.n_tiles, j.qtype};
        a.n_tiles += uint32_t(tiles);
    }
    return launch_batch(a, max_grid, stream);
}

}  // namespace pf
