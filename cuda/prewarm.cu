// prewarm.cu — the fp16 caches of many matrices in a few launches (prewarm.cuh).
//
// Why it is shaped this way (a copy-bandwidth-bound job: each element is read once as a few
// bits and written once as 2 bytes):
//  - One grid for up to kJobsPerLaunch matrices: the job table travels in the kernel's
//    parameters (no table upload, no allocation), and every CTA finds its matrix by a binary
//    search over the jobs' first tiles. A model's ~300 matrices are a handful of launches that
//    fill all SMs, instead of one small launch per matrix with a tail each.
//  - A CTA owns one tile of kTileElems consecutive elements of one matrix. A matrix of GGUF
//    blocks is a flat run of blocks (rows of k / block_elems blocks back to back) and its fp16
//    copy a flat run of elements, so a tile is a contiguous byte range in and out.
//  - Block types: the tile's blocks are staged in shared memory with 16-byte coalesced loads
//    (the tile starts 16-byte aligned: 8 blocks of every type are a multiple of 16 bytes),
//    then each thread decodes 8 consecutive elements (one sub-block, one header) from shared
//    memory with 8-byte loads of the quants, and writes them with one 16-byte store.
//  - Element types (F32, F16, BF16): 16-byte loads and stores straight from and to global.
// The arithmetic is that of quant.cuh's decode8 (exact in fp32), then __float2half_rn per
// element, so the output equals dequantize()'s fp16 output bit for bit.
#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "dequant.cuh"
#include "prewarm.cuh"
#include "qtype.h"
#include "quant.cuh"

namespace pf {
namespace {

constexpr int kThreads = 256;        // 8 warps; several CTAs per SM overlap staging and decoding
constexpr int kGroup = 8;            // elements per thread and step: one 16-byte fp16 store
constexpr int kTileElems = 8192;     // elements per CTA: 4 steps of kThreads x kGroup
constexpr int kJobsPerLaunch = 96;   // 32-byte jobs: the parameters stay under the 4 KB limit
constexpr int kStagePad = 16;        // 8-byte reads at 2-byte-aligned offsets read 4 bytes ahead
// Largest tile of blocks: Q8_0, 34 bytes per 32 elements.
constexpr int kStageBytes = kTileElems / kQK8_0 * int(sizeof(block_q8_0));
static_assert(kTileElems % (kThreads * kGroup) == 0, "a tile is whole steps");
static_assert(kTileElems % (8 * kQK_K) == 0, "a tile is 8 K-quant blocks: 16-byte aligned");
static_assert(kTileElems / kQK_K * sizeof(block_q6_K) <= size_t(kStageBytes), "Q6_K fits");
static_assert(kTileElems / kQK4_0 * sizeof(block_q4_0) <= size_t(kStageBytes), "Q4_0 fits");
static_assert(kTileElems / kQK_K * sizeof(block_q5_K) <= size_t(kStageBytes), "Q5_K fits");

struct batch_job {        // prewarm_job, with where its tiles start in the launch
    const uint8_t *src;
    __half *dst;
    int64_t elems;
    uint32_t first_tile;  // tiles [first_tile, next job's first_tile) are this job's
    int32_t qtype;
};
static_assert(sizeof(batch_job) == 32, "the parameter budget assumes 32-byte jobs");

struct batch_args {
    int32_t n_jobs;
    uint32_t n_tiles;     // all jobs' tiles: the grid
    batch_job job[kJobsPerLaunch];
};
static_assert(sizeof(batch_args) <= 4096, "kernel parameters must stay within 4 KB");

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

// decode8_stage<Q>(s, bo, i0, v): elements i0 .. i0+7 (i0 % 8 == 0) of the block at byte bo of
// the stage; the same arithmetic as qtraits<Q>::decode8 (quant.cuh), so the same fp32 values.
template <int Q>
__device__ void decode8_stage(const uint8_t *s, uint32_t bo, int i0, float *v);

template <>
__device__ __forceinline__ void decode8_stage<PF_QTYPE_Q4_0>(const uint8_t *s, uint32_t bo, int i0,
                                                             float *v) {
    const float d = stage_half(s, bo);
    const uint2 q = stage8_even(s, bo + 2 + (i0 & 15));
    const int sh = (i0 >> 4) << 2;
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = d * float(((byte_at(q, e) >> sh) & 0xF) - 8);
}

template <>
__device__ __forceinline__ void decode8_stage<PF_QTYPE_Q8_0>(const uint8_t *s, uint32_t bo, int i0,
                                                             float *v) {
    const float d = stage_half(s, bo);
    const uint2 q = stage8_even(s, bo + 2 + i0);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = d * float(int8_t(uint8_t(byte_at(q, e))));
}

// Q4_K and Q5_K blocks (144 and 176 bytes) start 16-byte aligned in the stage.
template <>
__device__ __forceinline__ void decode8_stage<PF_QTYPE_Q4_K>(const uint8_t *s, uint32_t bo, int i0,
                                                             float *v) {
    const block_q4_K *b = reinterpret_cast<const block_q4_K *>(s + bo);
    const int j = i0 >> 5;
    float d1, m1;
    k4_scale_min(b, j, d1, m1);
    const uint2 q = stage8_aligned(s, bo + offsetof(block_q4_K, qs) + (j >> 1) * 32 + (i0 & 31));
    const int sh = (j & 1) << 2;
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = d1 * float((byte_at(q, e) >> sh) & 0xF) - m1;
}

template <>
__device__ __forceinline__ void decode8_stage<PF_QTYPE_Q5_K>(const uint8_t *s, uint32_t bo, int i0,
                                                             float *v) {
    const block_q5_K *b = reinterpret_cast<const block_q5_K *>(s + bo);
    const int j = i0 >> 5, l0 = i0 & 31;
    float d1, m1;
    k4_scale_min(b, j, d1, m1);
    const uint2 q = stage8_aligned(s, bo + offsetof(block_q5_K, qs) + (j >> 1) * 32 + l0);
    const uint2 h = stage8_aligned(s, bo + offsetof(block_q5_K, qh) + l0);
    const int sh = (j & 1) << 2;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int qq = ((byte_at(q, e) >> sh) & 0xF) | (((byte_at(h, e) >> j) & 1) << 4);
        v[e] = d1 * float(qq) - m1;
    }
}

template <>
__device__ __forceinline__ void decode8_stage<PF_QTYPE_Q6_K>(const uint8_t *s, uint32_t bo, int i0,
                                                             float *v) {
    const int h = i0 >> 7, r0 = i0 & 127;  // 8 elements: one half, one 16-group, no wrap
    const uint2 ql = stage8_even(s, bo + offsetof(block_q6_K, ql) + h * 64 + (r0 & 63));
    const uint2 qh = stage8_even(s, bo + offsetof(block_q6_K, qh) + h * 32 + (r0 & 31));
    const int shl = (r0 >> 6) << 2, shh = (r0 >> 5) << 1;
    const int sc = int8_t(s[bo + offsetof(block_q6_K, scales) + (i0 >> 4)]);
    const float sd = stage_half(s, bo + offsetof(block_q6_K, d)) * float(sc);
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = sd * float((((byte_at(ql, e) >> shl) & 0xF) | (((byte_at(qh, e) >> shh) & 3) << 4)) - 32);
}

// IQ4_XS blocks (136 bytes) start 8-byte aligned in the stage; qs sits at byte 8.
template <>
__device__ __forceinline__ void decode8_stage<PF_QTYPE_IQ4_XS>(const uint8_t *s, uint32_t bo, int i0,
                                                               float *v) {
    const block_iq4_xs *b = reinterpret_cast<const block_iq4_xs *>(s + bo);
    const int ib = i0 >> 5, j0 = i0 & 31;
    const float dl = iq4xs_scale(b, ib);
    const uint2 q = stage8_aligned(s, bo + offsetof(block_iq4_xs, qs) + ib * 16 + (j0 & 15));
    const int sh = (j0 >> 4) << 2;
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = dl * float(iq4nl_value((byte_at(q, e) >> sh) & 0xF));
}

// ------------------------------------------------------------------ stores

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
    return uint32_t(__half_as_ushort(__float2half_rn(a))) |
           (uint32_t(__half_as_ushort(__float2half_rn(b))) << 16);  // RNE, as numpy
}
// 8 fp16 in one 16-byte store; streaming (.cs): the caches are not read again soon.
__device__ __forceinline__ void store8(__half *out, const float *v) {
    __stcs(reinterpret_cast<uint4 *>(out),
           make_uint4(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]),
                      pack_half2(v[6], v[7])));
}

// ------------------------------------------------------------------ one tile

// Elements [e0, e0 + n) of a block-type job: stage the blocks, then decode 8 per thread.
template <int Q>
__device__ __forceinline__ void tile_blocks(const batch_job &j, int64_t e0, int n, uint8_t *stage) {
    using T = qtraits<Q>;
    constexpr int kGroupsPerBlock = T::kElems / kGroup;
    const uint8_t *src = j.src + (e0 / T::kElems) * T::kBytes;  // 16-byte aligned (a tile start)
    const int nbytes = n / T::kElems * T::kBytes;
    const int nvec = nbytes / 16;
    for (int i = threadIdx.x; i < nvec; i += kThreads)
        reinterpret_cast<uint4 *>(stage)[i] = __ldcs(reinterpret_cast<const uint4 *>(src) + i);
    // A matrix's last tile may end inside a 16-byte word: its even tail (block sizes are even)
    // in 2-byte reads, never past the matrix.
    for (int b = nvec * 16 + 2 * int(threadIdx.x); b < nbytes; b += 2 * kThreads)
        *reinterpret_cast<uint16_t *>(stage + b) = *reinterpret_cast<const uint16_t *>(src + b);
    __syncthreads();
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

// Elements [e0, e0 + n) of an element-type job: 16-byte loads and stores when both ends are
// 16-byte aligned (then every 8-element group is), element by element otherwise and for the
// tail of a length that is not a multiple of 8.
template <int Q>
__device__ __forceinline__ void tile_elems(const batch_job &j, int64_t e0, int n) {
    using T = qtraits<Q>;
    const uint8_t *src = j.src + e0 * T::kBytes;
    __half *dst = j.dst + e0;
    const bool vec = ((reinterpret_cast<uintptr_t>(j.src) | reinterpret_cast<uintptr_t>(j.dst)) & 15) == 0;
    const int groups = vec ? n / kGroup : 0;
    for (int g = threadIdx.x; g < groups; g += kThreads) {
        float v[kGroup];
        if constexpr (T::kBytes == 4) {
            const uint4 a = __ldcs(reinterpret_cast<const uint4 *>(src) + 2 * g);
            const uint4 b = __ldcs(reinterpret_cast<const uint4 *>(src) + 2 * g + 1);
            const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = elem_from_bits<Q>(w[e]);
        } else {
            const uint4 a = __ldcs(reinterpret_cast<const uint4 *>(src) + g);
            const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[2 * e] = elem_from_bits<Q>(w[e] & 0xFFFFu);
                v[2 * e + 1] = elem_from_bits<Q>(w[e] >> 16);
            }
        }
        store8(dst + int64_t(g) * kGroup, v);
    }
    for (int e = groups * kGroup + int(threadIdx.x); e < n; e += kThreads)
        dst[e] = __float2half_rn(T::decode(src + int64_t(e) * T::kBytes, 0));
}

// The job that owns tile t: the last one whose first tile is <= t (jobs are in tile order).
__device__ __forceinline__ int find_job(const batch_args &a, uint32_t t) {
    int lo = 0, hi = a.n_jobs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (a.job[mid].first_tile <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// One tile per CTA (the host keeps a launch within kMaxGridX tiles). Every branch below is
// uniform over the CTA, so __syncthreads inside tile_blocks is reached by all threads.
__global__ void __launch_bounds__(kThreads) prewarm_kernel(const __grid_constant__ batch_args a) {
    __shared__ __align__(16) uint8_t stage[kStageBytes + kStagePad];
    const uint32_t t = blockIdx.x;
    const batch_job &j = a.job[find_job(a, t)];
    const int64_t e0 = int64_t(t - j.first_tile) * kTileElems;
    const int n = j.elems - e0 < kTileElems ? int(j.elems - e0) : kTileElems;
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

bool is_block_type(int32_t qtype) {
    return qtype != PF_QTYPE_F32 && qtype != PF_QTYPE_F16 && qtype != PF_QTYPE_BF16;
}

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

pf_status launch_batch(batch_args &a, cudaStream_t stream) {
    if (a.n_jobs == 0) return PF_STATUS_OK;
    prewarm_kernel<<<a.n_tiles, kThreads, 0, stream>>>(a);
    PF_LAUNCH_CHECK("prewarm_kernel (%d matrices, %u tiles)", int(a.n_jobs), a.n_tiles);
    a.n_jobs = 0;
    a.n_tiles = 0;
    return PF_STATUS_OK;
}

}  // namespace

void prewarm_kernel_load() {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, prewarm_kernel) != cudaSuccess) (void)cudaGetLastError();
}

pf_status prewarm_dequantize(const std::vector<prewarm_job> &jobs, cudaStream_t stream) {
    for (const prewarm_job &j : jobs) {
        int64_t be = 0, bb = 0;
        if (!qtype_block(j.qtype, &be, &bb))
            return fail(PF_STATUS_UNSUPPORTED, "prewarm: GGML type %d is not supported", int(j.qtype));
        PF_CHECK_ARG(j.elems >= 0 && j.elems % be == 0,
                     "prewarm: %lld elements is not a whole number of %s blocks", (long long)j.elems,
                     pf_qtype_name(j.qtype));
    }
    batch_args a{};
    for (const prewarm_job &j : jobs) {
        if (j.elems == 0) continue;
        // The fast path stages 16-byte words of the blocks and stores 16-byte fp16 groups.
        if (!aligned16(j.src) || (is_block_type(j.qtype) && !aligned16(j.dst))) {
            PF_TRY(dequantize(j.src, j.qtype, 1, j.elems, j.dst, true, stream));
            continue;
        }
        const int64_t tiles = (j.elems + kTileElems - 1) / kTileElems;
        if (a.n_jobs == kJobsPerLaunch || int64_t(a.n_tiles) + tiles > kMaxGridX)
            PF_TRY(launch_batch(a, stream));
        // A single matrix of more than 2^31 tiles (2^44 elements) cannot exist on a device.
        a.job[a.n_jobs++] = batch_job{static_cast<const uint8_t *>(j.src), j.dst, j.elems,
                                      a.n_tiles, j.qtype};
        a.n_tiles += uint32_t(tiles);
    }
    return launch_batch(a, stream);
}

}  // namespace pf
