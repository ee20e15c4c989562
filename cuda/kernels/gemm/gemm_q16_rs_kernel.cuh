// gemm_q16_rs_kernel.cuh — the GEMM on the GGUF blocks with the weight as the register operand
// (sm_90a; an experiment beside gemm_q16_kernel.cuh, timed by tests/cpp/bench_gemm_q16, not in the
// library until it measures faster): Y^T = W X^T, so that the weight is wgmma's A operand, which
// may come from registers, and X is the B operand read from shared memory (K-major, by TMA).
//
// Why (session 37, bench_gemm_q16 on the H200): the shared-memory form decodes each W tile into
// shared memory and has wgmma read it back, beside the X tile: per 64 x 128 x 16 product 6 KiB read
// and, per stage, 16 KiB of decoded W written, about what the SM's shared memory moves in the
// time of the products; pairs of blocks that halved the decoding but not those bytes ran slower
// (Q4_K 0.87x). Here the consumer warps decode their own A fragments from the raw blocks (about 4.5
// bits a weight read from shared memory instead of 16 written and 16 read), while their previous
// wgmma runs: per m64n256k16 product, 8 KiB of X is read and nothing is written (Machete's and
// Marlin's choice of the weight as the register operand, with the GGUF blocks decoded exactly as
// the prewarm does: decode_stage.cuh's decode2_stage, the same values bit for bit).
//
// The block: 384 threads, one producer warpgroup and two consumer warpgroups; an output tile of
// 256 rows of X (tokens: wgmma N = 256) x 128 weight rows (each consumer warpgroup 64: wgmma M).
//  - Producer warp 3, lane 0: the X tiles (256 x 64 fp16, 128-byte swizzle) by TMA into kXStages
//    stages, each refilled when the 8 consumer warps released it.
//  - Producer warps 0-2: the raw blocks of 256 columns of the 128 weight rows ("supersteps", as the
//    shared-memory form's) by cp.async into two raw buffers; a buffer is refilled when the 8
//    consumer warps have decoded everything they need of it.
//  - A consumer thread holds, per 16-column step, the A fragment of wgmma (4 x 2 fp16: weight rows
//    16 w + gid and + 8 of its warpgroup's 64, columns 2 tig, +1, +8, +9): decoded from the raw
//    buffer into one of two register sets while the wgmma of the step before runs on the other.
//  - The epilogue: y[token][weight] = (accumulate ? y : 0) + acc, times the token's inverse scale.
// Columns past k are decoded as zeros (the X tile's are zeros too, the TMA's fill); weight rows
// past n and tokens past `rows` produce outputs that are not stored.
#pragma once

#include "kernels/gemm/gemm_q16_kernel.cuh"

namespace pf {
namespace q16rs {

using namespace hopper;
using q16::kRawCols;
using q16::Q16Args;
using q16::RawGeom;

constexpr int kTN = 256;                  // rows of X (tokens) per block: wgmma N
constexpr int kWM = 128;                  // weight rows per block: 2 consumer warpgroups x 64
constexpr int kBK = 64;                   // columns per X stage (one 128-byte swizzled fp16 row)
constexpr int kXStages = 4;               // X stages (4 x 32 KiB)
constexpr int kSteps = kBK / 16;          // 16-column wgmma steps per stage
constexpr int kStepsPerRaw = kRawCols / 16;
constexpr int kThreads = 384;
constexpr int kRawThreads = 96;           // producer warps 0-2
constexpr int kConsumerWarps = 8;
constexpr int kProducerRegs = 56;         // setmaxnreg: 128 * 56 + 256 * 224 <= 65536
constexpr int kConsumerRegs = 224;        // the 64 x 256 fp32 accumulator (128) and the decoding
constexpr int kTileX = kTN * kBK * 2;     // bytes of one X stage
constexpr int kBand = 8;                  // token tiles per raster band

template <int Q>
__host__ __device__ constexpr size_t smem_bytes() {
    return size_t(kSwizzleAtom) + size_t(kXStages) * kTileX + 2 * size_t(kWM) * RawGeom<Q>::kSlot +
           8 * size_t(2 * kXStages + 4);
}

#ifdef PF_Q16_DEVICE

struct Smem {
    uint32_t base = 0;
    unsigned char *ptr = nullptr;
    int slot = 0;
    __device__ uint32_t x(int s) const { return base + uint32_t(s * kTileX); }
    __device__ unsigned char *raw(int j) const { return ptr + kXStages * kTileX + (j & 1) * kWM * slot; }
    __device__ uint32_t bars() const { return base + uint32_t(kXStages * kTileX + 2 * kWM * slot); }
    __device__ uint32_t xfull(int s) const { return bars() + 8 * uint32_t(s); }
    __device__ uint32_t xempty(int s) const { return bars() + 8 * uint32_t(kXStages + s); }
    __device__ uint32_t rawfull(int j) const { return bars() + 8 * uint32_t(2 * kXStages + (j & 1)); }
    __device__ uint32_t rawempty(int j) const { return bars() + 8 * uint32_t(2 * kXStages + 2 + (j & 1)); }
};

// The producer warpgroup: X tiles (warp 3, lane 0) and raw supersteps (warps 0-2).
template <int Q>
__device__ __forceinline__ void producer(const Q16Args &a, const CUtensorMap *tm_x, const Smem &sm, int m0, int n0,
                                         int stages) {
    const int tid = int(threadIdx.x), warp = tid >> 5;
    if (warp == 3) {
        if (tid != 96) return;
        for (int ks = 0; ks < stages; ++ks) {
            const int s = ks % kXStages, use = ks / kXStages;
            if (use > 0) mbar_wait(sm.xempty(s), uint32_t(use - 1) & 1u);
            mbar_arrive_expect_tx(sm.xfull(s), kTileX);
            tma_load_2d(sm.x(s), tm_x, ks * kBK, m0, sm.xfull(s));
        }
        return;
    }
    const int supersteps = (a.k + kRawCols - 1) / kRawCols;
    for (int j = 0; j < supersteps; ++j) {
        if (j >= 2) mbar_wait(sm.rawempty(j), uint32_t(j / 2 - 1) & 1u);
        q16::raw_issue<Q>(a, sm.raw(j), kWM, n0, j, tid, kRawThreads);
        cp_async_commit();
        cp_async_wait<0>();       // this thread's copies (and its plain half-word stores) are done
        mbar_arrive(sm.rawfull(j));  // release: they are visible to the consumers that wait on it
    }
}

// A consumer warpgroup: the products of its 64 weight rows with the tile's 256 rows of X over k,
// then the stores.
template <int Q>
__device__ __forceinline__ void consumer(const Q16Args &a, const Smem &sm, int m0, int n0, int stages) {
    const int ctid = int(threadIdx.x) - 128;
    const int wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int r0 = wg * 64 + warp * 16 + gid;  // the tile's weight rows r0 and r0 + 8
    const uint64_t db0 = smem_desc(sm.x(0), 16, kSwizzleAtom);
    const auto release = [&](uint32_t bar) {
        __syncwarp();
        mbar_arrive_if(bar, lane == 0);
    };
    float acc[kTN / 2];  // not zeroed: the first product overwrites it (scale-d false), so that no
                         // other instruction defines it near the wgmma pipeline (ptxas C7515)
    // Two fragment register sets, named (a dynamic index would put them in local memory): step i
    // multiplies `cur` while step i + 1's fragment is decoded into `next`.
    uint32_t fa[4], fb[4];
    mbar_wait(sm.rawfull(0), 0u);
    uint32_t o0 = q16::raw_offset<Q>(a, n0, r0, 0), o1 = q16::raw_offset<Q>(a, n0, r0 + 8, 0);
    q16::decode_fragment<Q>(a, sm.raw(0), r0, o0, o1, 0, tig, fa);
    // Step kk (0..3, a constant after unrolling) of stage ks: its product on `cur`, then the next
    // step's fragment into `next` while the product runs.
    const auto step = [&](int ks, int kk, const uint32_t(&cur)[4], uint32_t(&next)[4]) {
        const int s = ks % kXStages;
        if (kk == 0) mbar_wait(sm.xfull(s), uint32_t(ks / kXStages) & 1u);
        wgmma_fence();  // the fragment's registers, written by the decoding, before wgmma reads them
        wgmma::wgmma_rsk<kTN>(acc, cur, desc_add(db0, uint32_t(s * kTileX + 32 * kk)), ks > 0 || kk > 0);
        wgmma_commit();
        wgmma_wait<1>();  // the step before is done: its fragment (next) may be rewritten
        if (kk == 0 && ks >= 1) release(sm.xempty((ks - 1) % kXStages));  // stage ks - 1's products
        const int n = ks * kSteps + kk + 1;
        if (kk < kSteps - 1 || ks + 1 < stages) {
            if (kk == kSteps - 1 && n % kStepsPerRaw == 0) {  // a new superstep: the last one's buffer is decoded
                const int j = n / kStepsPerRaw;
                release(sm.rawempty(j - 1));
                mbar_wait(sm.rawfull(j), uint32_t(j / 2) & 1u);
                o0 = q16::raw_offset<Q>(a, n0, r0, j);
                o1 = q16::raw_offset<Q>(a, n0, r0 + 8, j);
            }
            q16::decode_fragment<Q>(a, sm.raw(n / kStepsPerRaw), r0, o0, o1, n, tig, next);
        }
    };
    for (int ks = 0; ks < stages; ++ks) {
        step(ks, 0, fa, fb);
        step(ks, 1, fb, fa);
        step(ks, 2, fa, fb);
        step(ks, 3, fb, fa);
    }
    wgmma_wait<0>();
    fence_regs(acc);
    release(sm.xempty((stages - 1) % kXStages));
    // acc[i]: weight row r0 + 8 ((i / 2) % 2), token 8 (i / 4) + 2 tig + i % 2 (ptx/wgmma.cuh).
#pragma unroll
    for (int i = 0; i < kTN / 2; ++i) {
        const int w = n0 + r0 + 8 * ((i / 2) % 2), t = m0 + 8 * (i / 4) + 2 * tig + i % 2;
        if (w < a.n && t < a.rows) {
            float *y = a.y + int64_t(t) * a.ldy + w;
            const float v = (a.accumulate ? *y : 0.f) + acc[i];
            *y = a.inv ? v * a.inv[t] : v;
        }
    }
}

#endif  // PF_Q16_DEVICE

// One block per 256-token x 128-weight-row output tile (m_tiles x n_tiles of kTN x kWM), kThreads
// threads, smem_bytes<Q>() of dynamic shared memory.
template <int Q>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_q16_rs_kernel(const __grid_constant__ Q16Args a, const __grid_constant__ CUtensorMap tm_x) {
#ifdef PF_Q16_DEVICE
    extern __shared__ unsigned char smem_raw[];
    Smem sm;
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    sm.base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    sm.ptr = smem_raw + (sm.base - raw);
    sm.slot = RawGeom<Q>::kSlot;
    int mt, nt;
    q16::band_tile(int(blockIdx.x), a.m_tiles, a.n_tiles, kBand, mt, nt);
    const int m0 = mt * kTN, n0 = nt * kWM;
    const int stages = (a.k + kBK - 1) / kBK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kXStages; ++s) {
            mbar_init(sm.xfull(s), 1);  // the TMA's expect_tx arrival
            mbar_init(sm.xempty(s), kConsumerWarps);
        }
        for (int j = 0; j < 2; ++j) {
            mbar_init(sm.rawfull(j), kRawThreads);
            mbar_init(sm.rawempty(j), kConsumerWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        setmaxnreg_dec<kProducerRegs>();
        producer<Q>(a, &tm_x, sm, m0, n0, stages);
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    consumer<Q>(a, sm, m0, n0, stages);
#endif  // PF_Q16_DEVICE
}

// The arguments of q16::make_args with the tiles of this kernel (kTN tokens x kWM weight rows).
template <int Q>
inline Q16Args make_args(const void *blocks, int64_t n, int64_t k, const float *inv, int64_t rows, float *y,
                         int64_t ldy, bool accumulate) {
    return q16::args_for<Q>(blocks, n, k, inv, rows, y, ldy, accumulate, kTN, kWM);
}

// Launches m_tiles x n_tiles blocks; smem_bytes<Q>() must have been allowed first. The X map: the
// fp16 rows in boxes of kTN rows x 64 columns (hopper::encode_fp16_sw128(.., kTN)).
template <int Q>
cudaError_t launch(const Q16Args &a, const CUtensorMap &tm_x, cudaStream_t st) {
    gemm_q16_rs_kernel<Q><<<unsigned(int64_t(a.m_tiles) * a.n_tiles), kThreads, smem_bytes<Q>(), st>>>(a, tm_x);
    return cudaGetLastError();
}

}  // namespace q16rs
}  // namespace pf
