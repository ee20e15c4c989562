// attention_wgmma.cu — the Hopper (sm_90a) flash-attention kernel: wgmma for S = Q K^T and
// O += P V, K/V tiles in 128-byte-swizzled shared memory, fp32 online softmax in base 2.
// Entry points and the contract are in attention.cuh (attention_flash_wgmma).
//
// Schedule (the method of FlashAttention-3, Shah et al. 2024, written here for this cache layout):
//  - A block owns one KV head g and kBM = 128 packed query rows (packed row m = query row m / G of
//    head g*G + m % G, as in the mma.sync kernel), so the G heads of a group share every K/V tile.
//    Two consumer warpgroups, 64 packed rows each: the M of one wgmma.m64nNk16.
//  - K/V tiles of BN keys are double-buffered with cp.async (16-byte chunks written straight into
//    the swizzled layout) by all 256 threads: tile i+1 loads while tile i is multiplied.
//  - Per tile, each warpgroup: S = Q K^T (wgmma, A and B from shared memory, K-major), causal mask
//    on the tiles that cross the diagonal only, online softmax (exp2, scale folded into log2 e),
//    P converted to fp16 in registers (the accumulator layout of S is the A-register layout of
//    the next wgmma), O += P V (wgmma, A from registers, B = V from shared memory MN-major).
//  - Tiles past the block's last visible key are never loaded (causal tile skip); blocks are
//    launched heaviest first.
//
// Shared-memory operand layout (both K-major operands and the MN-major V use the same bytes):
// a [rows][D] fp16 tile is stored as D/64 column blocks, block b = rows x 128 bytes (64 fp16
// of columns 64b..64b+63 per row), block b at byte rows * 128 * b. Inside a block, row r's
// 16-byte chunk c (columns 64b + 8c .. +7) sits at r * 128 + ((c ^ (r % 8)) * 16): the 128-byte
// swizzle (Swizzle<3,4,3> in CuTe's notation: address bits 4-6 XOR bits 7-9), which is what the
// hardware undoes when the descriptor says SWIZZLE_128B. Every block starts on a 1024-byte
// boundary (the swizzle repeats every 8 rows x 128 bytes and is applied to absolute address bits).
//
// wgmma shared-memory descriptor (64 bits; CUTLASS cute/arch/mma_sm90_desc.hpp GmmaDescriptor,
// PTX ISA "Matrix Descriptor Format"):
//   bits  0-13  start address >> 4        bits 16-29  leading byte offset (LBO) >> 4
//   bits 32-45  stride byte offset (SBO) >> 4       bits 49-51  base offset (0: 1024-aligned atoms)
//   bits 62-63  layout: 1 = SWIZZLE_128B
// K-major, 128B swizzle (CuTe: Swizzle<3,4,3> o ((8,m),(T,2)):((8T,SBO),(1,T))): 8 rows of 128
// bytes form an atom, SBO = 1024 = the byte step from one 8-row group to the next; LBO is unused
// (1 by convention). The k-th 16-element slice inside the 64-column block starts 32*k bytes
// further (the descriptor's start address moves; the hardware applies the swizzle on top).
// MN-major, 128B swizzle (CuTe: Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))): 64
// contiguous N elements per 128-byte row, LBO = byte step between 64-wide N blocks, SBO = byte
// step between 8-row K groups (1024). For V ([keys][D] row-major), K = keys, N = D.
#include <cuda_fp16.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "attention.cuh"
#include "common.cuh"
#include "wgmma.cuh"

namespace pf {
namespace {

constexpr int kWgBM = 128;          // packed query rows per block (2 warpgroups x 64)
constexpr int kWgThreads = 256;     // 2 consumer warpgroups
constexpr int kSwizzleAtom = 1024;  // 8 rows x 128 bytes: the swizzle's period and the SBO

struct wgmma_attn_args {
    const float *q;
    int64_t ldq, qhs;
    const __half *k_cache, *v_cache;
    int64_t kv_dim;
    float *o;
    int64_t ldo;
    int32_t G;
    int64_t rows, pos0;
    float scale_log2;  // scale * log2(e): the softmax runs in base 2 (exp2f)
};

template <int D, int BN>
constexpr size_t wgmma_smem_bytes() {
    // Q tile, 2 stages of K and V, and the slack that lets the kernel align its base to 1024.
    return size_t(kWgBM) * D * 2 + 2 * 2 * size_t(BN) * D * 2 + kSwizzleAtom;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PF_WGMMA_DEVICE 1
#endif

#ifdef PF_WGMMA_DEVICE

constexpr int kSwizzleRow = 128;  // bytes of one swizzled row (64 fp16)

// fp32 -> fp16 rounding to nearest even, saturating at +-65504 (an inf would become NaN in the
// softmax); NaN stays NaN. Same rule as the mma.sync kernel's Q load.
__device__ __forceinline__ __half wg_to_half_sat(float x) {
    if (fabsf(x) > 65504.f) x = copysignf(65504.f, x);
    return __float2half_rn(x);
}

__device__ __forceinline__ uint32_t wg_pack_float2(float lo, float hi) {
    return uint32_t(__half_as_ushort(__float2half_rn(lo))) |
           (uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// Byte offset of row r's 16-byte chunk c (columns 8c .. 8c+7) in a swizzled [rows][D] tile.
__device__ __forceinline__ uint32_t swizzled_offset(int r, int c, int rows) {
    return uint32_t((c >> 3) * rows * kSwizzleRow + r * kSwizzleRow + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
           (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 fills the chunk with zeros (keys past
// the visible range: P is 0 there, and 0 * whatever was in shared memory could be NaN).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by this thread's generic-proxy stores (st.shared, cp.async) becomes
// visible to the async proxy that wgmma reads its shared operands through.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Pins the accumulator registers in program order around the asynchronous wgmma: the compiler
// sees each register redefined here, so no read of it moves above the wait (CUTLASS calls this
// warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

#endif  // PF_WGMMA_DEVICE

template <int D, int BN>
__global__ void __launch_bounds__(kWgThreads, 1) wgmma_attn_kernel(const __grid_constant__ wgmma_attn_args a) {
#ifdef PF_WGMMA_DEVICE
    static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256, "whole swizzle blocks, whole k-steps");
    constexpr int CPR = D / 8;                            // 16-byte chunks per row
    constexpr uint32_t kQBytes = uint32_t(kWgBM) * D * 2;
    constexpr uint32_t kTileBytes = uint32_t(BN) * D * 2;  // one K or V stage

    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    unsigned char *const base_ptr = smem_raw + (base - raw);
    const uint32_t sQ = base;
    const uint32_t sK0 = sQ + kQBytes;                 // stage s of K at sK0 + s * kTileBytes
    const uint32_t sV0 = sK0 + 2 * kTileBytes;         // stage s of V at sV0 + s * kTileBytes

    const int tid = threadIdx.x;
    const int wg = tid >> 7;                 // warpgroup: packed rows 64 wg .. 64 wg + 63
    const int warp = (tid >> 5) & 3;         // warp within the warpgroup: 16 rows each
    const int lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    const int kvh = blockIdx.y;
    // Heaviest tiles (most keys, the end of the chunk) first, so the tail of the grid is short.
    const int64_t m0 = int64_t(gridDim.x - 1 - blockIdx.x) * kWgBM;
    const int64_t packed = a.rows * a.G;
    const int64_t m_end = m0 + kWgBM < packed ? m0 + kWgBM : packed;
    const int64_t n_keys = a.pos0 + (m_end - 1) / a.G + 1;  // keys visible to the block's last row
    const int64_t diag = a.pos0 + m0 / a.G;  // keys <= diag are visible to every row of the block
    const int n_tiles = int((n_keys + BN - 1) / BN);

    // K/V tile `it` into stage `st`: BN rows x CPR chunks each, zero past n_keys.
    const auto load_kv = [&](int it, int st) {
        const int64_t j0 = int64_t(it) * BN;
        const __half *kg = a.k_cache + int64_t(kvh) * D;
        const __half *vg = a.v_cache + int64_t(kvh) * D;
        for (int idx = tid; idx < BN * CPR; idx += kWgThreads) {
            const int r = idx / CPR, c = idx % CPR;
            const int64_t j = j0 + r;
            const bool ok = j < n_keys;
            const int64_t off = ok ? j * a.kv_dim + c * 8 : 0;  // a valid address even when unused
            const uint32_t so = swizzled_offset(r, c, BN);
            cp_async16(sK0 + st * kTileBytes + so, kg + off, ok ? 16 : 0);
            cp_async16(sV0 + st * kTileBytes + so, vg + off, ok ? 16 : 0);
        }
    };

    load_kv(0, 0);
    cp_async_commit();

    // Q tile: fp32 -> fp16 (saturating), written straight into the swizzled layout; rows past
    // the chunk are zero and never stored. Scalar loads: ldq and the head stride may be odd.
    for (int idx = tid; idx < kWgBM * CPR; idx += kWgThreads) {
        const int r = idx / CPR, c = idx % CPR;
        const int64_t m = m0 + r;
        __align__(16) __half h8[8];
        if (m < packed) {
            const int64_t t = m / a.G, h = int64_t(kvh) * a.G + (m - t * a.G);
            const float *src = a.q + t * a.ldq + h * a.qhs + c * 8;
#pragma unroll
            for (int e = 0; e < 8; ++e) h8[e] = wg_to_half_sat(src[e]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) h8[e] = __float2half_rn(0.f);
        }
        *reinterpret_cast<uint4 *>(base_ptr + swizzled_offset(r, c, kWgBM)) =
            *reinterpret_cast<const uint4 *>(h8);
    }

    // This thread's two rows (gid and gid + 8 of its warp's 16): last visible key of each.
    int64_t last_key[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int64_t m = m0 + wg * 64 + warp * 16 + gid + 8 * i;
        const int64_t lk = a.pos0 + m / a.G;
        last_key[i] = lk < n_keys - 1 ? lk : n_keys - 1;
    }

    float acc[D / 2];  // O: 64 x D per warpgroup, wgmma accumulator layout (see wgmma.cuh)
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // running max of the scaled (base-2) scores
    float row_sum[2] = {0.f, 0.f};              // this thread's partial sums (quad-reduced at the end)

    const uint32_t q_wg = sQ + uint32_t(wg) * 64 * kSwizzleRow;  // this warpgroup's 64 rows

    for (int it = 0; it < n_tiles; ++it) {
        const int st = it & 1;
        __syncthreads();  // both warpgroups are done with stage st ^ 1 (tile it - 1)
        if (it + 1 < n_tiles) load_kv(it + 1, st ^ 1);
        cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile it
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();  // every thread's chunks of tile it (and the Q tile) are in place

        const uint32_t sK = sK0 + st * kTileBytes, sV = sV0 + st * kTileBytes;
        const int64_t j0 = int64_t(it) * BN;

        // S = Q K^T: D/16 k-steps; step kk reads columns 16kk.. of block kk/4 at byte 32*(kk%4).
        float s[BN / 2];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t koff = uint32_t(kk & 3) * 32;
            const uint64_t da = smem_desc(q_wg + uint32_t(kk >> 2) * kWgBM * kSwizzleRow + koff,
                                          16, kSwizzleAtom);
            const uint64_t db = smem_desc(sK + uint32_t(kk >> 2) * BN * kSwizzleRow + koff, 16,
                                          kSwizzleAtom);
            wgmma::wgmma_ss<BN>(s, da, db, kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(s);

        // Scale, causal mask on the tiles that cross the diagonal, tile row max.
        float tile_max[2] = {-INFINITY, -INFINITY};
        if (j0 + BN - 1 > diag) {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int r = (i >> 1) & 1;
                const int64_t j = j0 + 8 * (i >> 2) + 2 * tig + (i & 1);
                const float x = j <= last_key[r] ? s[i] * a.scale_log2 : -INFINITY;
                s[i] = x;
                tile_max[r] = fmaxf(tile_max[r], x);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int r = (i >> 1) & 1;
                s[i] *= a.scale_log2;
                tile_max[r] = fmaxf(tile_max[r], s[i]);
            }
        }
        float alpha[2], base2[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // The 4 lanes of a quad (same gid) hold the row's columns: reduce over lane bits 0-1.
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 2));
            const float new_max = fmaxf(row_max[r], tile_max[r]);
            // A row with no visible key so far keeps max -inf: base 0 makes exp2(-inf) = 0, not
            // NaN (key 0 is visible to every row, so after the first tile the max is finite).
            base2[r] = new_max == -INFINITY ? 0.f : new_max;
            alpha[r] = exp2f(row_max[r] - base2[r]);  // rescales the old O and sum; 0 at first
            row_max[r] = new_max;
        }
        float tile_sum[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int r = (i >> 1) & 1;
            s[i] = exp2f(s[i] - base2[r]);
            tile_sum[r] += s[i];
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * alpha[r] + tile_sum[r];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) acc[i] *= alpha[(i >> 1) & 1];

        // P as fp16 A registers: k-step kk (keys 16kk..16kk+15) = the S n8-tiles 2kk and 2kk+1,
        // i.e. s[8kk .. 8kk+7] (a0: row gid, keys 2tig..; a1: row gid+8; a2, a3: keys +8).
        uint32_t p[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            p[kk][0] = wg_pack_float2(s[8 * kk + 0], s[8 * kk + 1]);
            p[kk][1] = wg_pack_float2(s[8 * kk + 2], s[8 * kk + 3]);
            p[kk][2] = wg_pack_float2(s[8 * kk + 4], s[8 * kk + 5]);
            p[kk][3] = wg_pack_float2(s[8 * kk + 6], s[8 * kk + 7]);
        }

        // O += P V: B = V tile MN-major (N = D columns in NB blocks of 64 at LBO = BN*128 bytes
        // apart, K = keys in 8-row groups at SBO = 1024); k-step kk starts 16 rows = 2 atoms on.
        fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint64_t db = smem_desc(sV + uint32_t(kk) * 2 * kSwizzleAtom,
                                          uint32_t(BN) * kSwizzleRow, kSwizzleAtom);
            wgmma::wgmma_rs<D>(acc, p[kk], db, 1);
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(acc);
    }

    // Normalise and store the rows of this chunk (fp32; scalar stores: ldo may be odd).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = row_sum[r];
        l += __shfl_xor_sync(kFullMask, l, 1);
        l += __shfl_xor_sync(kFullMask, l, 2);
        const float inv = 1.f / l;  // l >= 1 (the max term); NaN inputs stay NaN
        const int64_t m = m0 + wg * 64 + warp * 16 + gid + 8 * r;
        if (m >= packed) continue;
        const int64_t t = m / a.G, h = int64_t(kvh) * a.G + (m - t * a.G);
        float *orow = a.o + t * a.ldo + h * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            orow[dt * 8 + 2 * tig] = acc[4 * dt + 2 * r] * inv;
            orow[dt * 8 + 2 * tig + 1] = acc[4 * dt + 2 * r + 1] * inv;
        }
    }
#endif  // PF_WGMMA_DEVICE
}

template <int D, int BN>
pf_status launch_wgmma(const attention_args &a, cudaStream_t st) {
    constexpr size_t smem = wgmma_smem_bytes<D, BN>();
    PF_TRY(set_max_dynamic_smem(wgmma_attn_kernel<D, BN>, int(smem), "wgmma_attn_kernel"));
    wgmma_attn_args f;
    f.q = a.q;
    f.ldq = a.ldq;
    f.qhs = a.q_head_stride;
    f.k_cache = static_cast<const __half *>(a.k_cache);
    f.v_cache = static_cast<const __half *>(a.v_cache);
    f.kv_dim = int64_t(a.n_kv_heads) * D;
    f.o = a.o;
    f.ldo = a.ldo;
    f.G = a.n_heads / a.n_kv_heads;
    f.rows = a.rows;
    f.pos0 = a.pos0;
    f.scale_log2 = a.scale * 1.4426950408889634f;
    const dim3 grid(unsigned(ceil_div(a.rows * f.G, kWgBM)), unsigned(a.n_kv_heads));
    wgmma_attn_kernel<D, BN><<<grid, kWgThreads, smem, st>>>(f);
    PF_LAUNCH_CHECK("wgmma_attn_kernel<%d, %d>", D, BN);
    return PF_STATUS_OK;
}

}  // namespace

bool attention_wgmma_available(int device) {
#ifdef PF_HAVE_SM90A
    // The sm_90a SASS runs on compute capability 9.0 only (the "a" features are not forward
    // compatible). Cached per device: the query is cheap, but this runs on every call.
    constexpr int kMaxDevices = 64;
    static std::atomic<int> cache[kMaxDevices];  // 0 unknown, 1 no, 2 yes
    if (device < 0 || device >= kMaxDevices) return false;
    int v = cache[device].load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0, minor = 0;
        const bool ok =
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
        (void)cudaGetLastError();
        v = ok && major == 9 && minor == 0 ? 2 : 1;
        cache[device].store(v, std::memory_order_relaxed);
    }
    return v == 2;
#else
    (void)device;
    return false;
#endif
}

int32_t attention_kernel_env() {
    // Read once per process: the bench sets it before the library loads, or before the first
    // attention call.
    static const int32_t v = [] {
        const char *e = std::getenv("PREFILL_ATTN_KERNEL");
        if (e && std::strcmp(e, "mma") == 0) return int32_t(PF_ATTN_KERNEL_MMA);
        if (e && std::strcmp(e, "wgmma") == 0) return int32_t(PF_ATTN_KERNEL_WGMMA);
        return int32_t(PF_ATTN_KERNEL_AUTO);
    }();
    return v;
}

pf_status attention_flash_wgmma(const attention_args &a, cudaStream_t st) {
    if (a.head_dim == 128) return launch_wgmma<128, 128>(a, st);
    if (a.head_dim == 256) return launch_wgmma<256, 64>(a, st);
    return fail(PF_STATUS_UNSUPPORTED, "attention: the wgmma kernel needs head_dim 128 or 256 (got %d)",
                a.head_dim);
}

}  // namespace pf
