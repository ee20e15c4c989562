// attention_wgmma.cu — the Hopper (sm_90a) flash-attention kernel: wgmma for S = Q K^T and
// O += P V, K/V tiles in 128-byte-swizzled shared memory, fp32 online softmax in base 2.
// Entry points and the contract are in attention.cuh (attention_flash_wgmma).
//
// Schedule (the method of FlashAttention-3, Shah et al. 2024, written here for this cache layout):
//  - A block owns one KV head g and kBM = 128 packed query rows (packed row m = query row m / G of
//    head g*G + m % G, as in the mma.sync kernel), so the G heads of a group share every K/V tile.
//    Warp specialisation: a producer warpgroup (one thread issues the TMA loads; the group
//    gives its registers to the others with setmaxnreg) and two consumer warpgroups (64 packed
//    rows each: the M of one wgmma.m64nNk16).
//  - K and V tiles of BN keys go through two separate 2-stage pipelines, each stage with a full
//    mbarrier (the producer's arrive.expect_tx + the TMA's complete_tx bytes) and an empty one
//    (the 256 consumer threads arrive when the wgmma reading the tile has completed): K_i is
//    released as soon as S_i is done, a tile before V_i, so K_{i+2} loads while tile i+1 is
//    worked on. The TMA writes the 128-byte swizzle itself (box = BN rows x 64 columns) and
//    fills rows past the map with zeros. The map spans pos0 + rows rows, or, with the position
//    on the device (CUDA graphs: the launch must not depend on it), the caches' capacity; then
//    the consumers zero the last V tile's rows from pos0 + rows on themselves.
//  - Per tile, each warpgroup: S = Q K^T (wgmma, A and B from shared memory, K-major), causal mask
//    on the tiles that cross the diagonal only, online softmax (exp2, scale folded into log2 e),
//    P converted to fp16 in registers (the accumulator layout of S is the A-register layout of
//    the next wgmma), O += P V (wgmma, A from registers, B = V from shared memory MN-major).
//    S of tile i+1 is issued before O += P_i V_i and its softmax runs while that product is in
//    flight (FA3's intra-warpgroup pipelining); the two warpgroups take turns issuing their
//    products (FA3's ping-pong), so one's softmax overlaps the other's products (measured faster
//    than without in every A/B run; the switch that turned it off was deleted, docs/notes-archive-2026-12.md).
//  - Key tiles: BN = 176 at D = 128 (device run 36, H32/Hkv8, against 128: 0.9536 vs 0.9958 ms
//    at T = 8192, 1.653 vs 1.769 at 2048 rows on 30720 cached, 0.0905 vs 0.0894 at T = 2048;
//    96 slower too); at D = 256 BN = 80 (FA3's 128 x 80 tiles at hd256; device run 24: 0.938 vs
//    0.984 ms for 64 at T = 8192). The other instances were deleted once docs/notes-archive-2026-12.md kept
//    their numbers; one size per head dim keeps a graph's launch (position on the device) bitwise
//    the host-position launch. Nothing needs BN to be a power of two: BN is a multiple of 16 (whole
//    k-steps of P V, whole n8 tiles of S) and of 8 (each swizzle block of 64 columns x BN rows
//    is whole 1024-byte atoms, so every block and stage starts 1024-aligned).
//  - Tiles past the block's last visible key are never loaded (causal tile skip); blocks are
//    launched heaviest first.
//  - The Q tile (fp32 in global memory) is converted to fp16 by the consumers and stored into the
//    swizzled layout with ordinary stores, then fenced to the async proxy.
//
// Shared-memory layouts, descriptors, TMA and mbarrier helpers: hopper.cuh.
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/attention/attention.cuh"
#include "ptx/common.cuh"
#include "ptx/hopper.cuh"
#include "ptx/mma.cuh"
#include "ptx/wgmma.cuh"

namespace pf {
namespace {

using namespace hopper;

constexpr int kWgBM = 128;                         // packed query rows per block (2 x 64)
constexpr int kWgConsumers = 256;                  // 2 consumer warpgroups
constexpr int kWgThreads = 128 + kWgConsumers;     // + the producer warpgroup (warpgroup 0)
// Register split (setmaxnreg): 384 threads start at 168 registers each (65536 / 384, rounded
// down to 8); the producer warpgroup gives back to 24 and the consumers take 240
// (kProducerRegs, kConsumerRegs): 128 * 24 + 256 * 240 = 64512 <= 65536. ptxas allocates the
// consumer code at 240 (it needs the entry count, which __launch_bounds__(384, 1) gives).
constexpr int kStages = 2;                         // K/V pipeline depth

struct WgmmaAttnArgs {
    CMatF q;      // the launcher's q (AttentionArgs q, ldq); head h of row t at q.row(t) + h * qhs
    int64_t qhs;
    MatF o;       // the launcher's o (AttentionArgs o, ldo)
    int32_t G, n_kv_heads;
    int32_t q_vec4;    // q, ldq and the head stride are whole 16-byte units: vector loads of q
    int32_t o_vec2;    // o and ldo are whole 8-byte units: the epilogue stores float2
    int64_t rows, pos0;
    const int64_t *pos0_dev;  // when set, pos0 is read here when the kernel runs (CUDA graphs)
    int64_t map_rows;         // rows the K/V tensor maps span (pos0 + rows, or the capacity);
                              // paged: no bound (every loaded row is a pool row)
    KvPages pages;            // paged caches: key j at row pages.row(j), tiles in kPageBox boxes
    float scale_log2;  // scale * log2(e): the softmax runs in base 2 (exp2f)
};

// Paged caches: a key tile is loaded in boxes of this many rows, each inside one page (BN and
// the page rows are multiples of it), so its rows may come from different pages. The swizzle is
// a function of the shared address (the 128-byte pattern repeats every 8 rows = 1024 bytes), so
// the boxes land exactly where one BN-row box would put them.
constexpr int kPageBox = 16;
static_assert(kKvPageGranule % kPageBox == 0, "no box straddles two pages");

template <int D, int BN>
constexpr size_t wgmma_smem_bytes() {
    // Q tile, kStages of K and V, 4 x kStages + 2 mbarriers (8 bytes each), and the slack that
    // lets the kernel align its base to 1024.
    return size_t(kWgBM) * D * 2 + 2 * kStages * size_t(BN) * D * 2 + (4 * kStages + 2) * 8 +
           kSwizzleAtom;
}
// sm_90's opt-in limit of shared memory per block (227 KiB; launch_wgmma asserts every
// instance under it). The instances: <128, 96> 128 KiB, <128, 176> 208 KiB (+ 1104 B each),
// <128, 128> 160 KiB + 1104 B, <256, 64> 192 KiB + 1104 B,
// <256, 80> 224 KiB + 1104 B = 230480 B (1968 B to spare: the largest this pipeline fits).
constexpr size_t kSm90SmemOptin = 232448;
static_assert(wgmma_smem_bytes<256, 80>() == 230480, "the <256, 80> layout as documented");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PF_WGMMA_DEVICE 1
#endif

#ifdef PF_WGMMA_DEVICE

constexpr int kProducerRegs = 24;   // setmaxnreg split, see kWgThreads
constexpr int kConsumerRegs = 240;
constexpr int kConsumerBarrier = 1;  // named barrier id of the 256 consumer threads

// fp32 -> fp16 rounding to nearest even, saturating at +-65504 (an inf would become NaN in the
// softmax); NaN stays NaN. Same rule as the mma.sync kernel's Q load.
__device__ __forceinline__ __half wg_to_half_sat(float x) {
    if (fabsf(x) > 65504.f) x = copysignf(65504.f, x);
    return __float2half_rn(x);
}

__device__ __forceinline__ void consumer_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kConsumerBarrier), "n"(kWgConsumers) : "memory");
}

// Per-thread online-softmax state of its two rows (gid and gid + 8 of its warp's 16).
struct softmax_state {
    float row_max[2];  // running max of the scaled (base-2) scores
    float row_sum[2];  // this thread's partial sums (quad-reduced at the end)
};

// One tile of raw scores s (wgmma accumulator layout, keys j0..j0+BN-1): mask when the tile
// crosses the diagonal, update max and sum (in scaled base-2 units), write P (fp16 A registers
// of the P V product) and the factor alpha[r] the accumulator rows must be multiplied by.
template <int BN>
__device__ __forceinline__ void softmax_tile(float (&s)[BN / 2], int64_t j0, bool masked,
                                             const int64_t (&last_key)[2], int tig,
                                             float scale_log2, softmax_state &st,
                                             uint32_t (&p)[BN / 16][4], float (&alpha)[2]) {
    // The max runs on the raw scores and the scale enters once per element, in the exponent's
    // FFMA: exp2(s * scale_log2 - max * scale_log2) (scale_log2 > 0 keeps the max the max).
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (masked) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int r = (i >> 1) & 1;
            const int64_t j = j0 + 8 * (i >> 2) + 2 * tig + (i & 1);
            if (j > last_key[r]) s[i] = -INFINITY;
            tile_max[r] = fmaxf(tile_max[r], s[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        // The 4 lanes of a quad (same gid) hold the row's columns: reduce over lane bits 0-1.
        tile_max[r] = quad_max(tile_max[r]);
        const float new_max = fmaxf(st.row_max[r], tile_max[r] * scale_log2);
        // A row with no visible key so far keeps max -inf: base 0 makes exp2(-inf) = 0, not NaN
        // (key 0 is visible to every row, so after the first tile the max is finite).
        base[r] = new_max == -INFINITY ? 0.f : new_max;
        alpha[r] = exp2f(st.row_max[r] - base[r]);  // rescales the old O and sum; 0 at first
        st.row_max[r] = new_max;
    }
    float tile_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
        const int r = (i >> 1) & 1;
        s[i] = exp2f(fmaf(s[i], scale_log2, -base[r]));
        tile_sum[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) st.row_sum[r] = st.row_sum[r] * alpha[r] + tile_sum[r];
    // P as fp16 A registers: k-step kk (keys 16kk..16kk+15) = the S n8-tiles 2kk and 2kk+1,
    // i.e. s[8kk .. 8kk+7] (a0: row gid, keys 2tig..; a1: row gid+8; a2, a3: keys +8).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        p[kk][0] = pack_half2(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = pack_half2(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = pack_half2(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = pack_half2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

// S = Q K^T for one warpgroup, issued (not waited): D/16 k-steps; step kk reads columns 16kk..
// of swizzle block kk/4, 32*(kk%4) bytes into its rows. dq, dk: the descriptors of the
// warpgroup's Q rows and of the K stage (K-major, 128-byte swizzle); each step's descriptors
// are theirs moved by a compile-time offset (desc_add), not rebuilt.
template <int D, int BN>
__device__ __forceinline__ void issue_qk(float (&s)[BN / 2], uint64_t dq, uint64_t dk) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = uint32_t(kk & 3) * 32;
        const uint64_t da = desc_add(dq, uint32_t(kk >> 2) * kWgBM * kSwizzleRow + koff);
        const uint64_t db = desc_add(dk, uint32_t(kk >> 2) * BN * kSwizzleRow + koff);
        wgmma::wgmma_ss<BN>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
}

// O += P V for one warpgroup, issued (not waited): B = the V tile MN-major (N = D columns in
// D/64 blocks LBO = BN*128 bytes apart, K = keys in 8-row groups SBO = 1024 apart); k-step kk
// starts 16 rows = 2 atoms further. dv: the V stage's descriptor (smem_desc(sV, BN * 128,
// 1024)).
template <int D, int BN>
__device__ __forceinline__ void issue_pv(float (&acc)[D / 2], const uint32_t (&p)[BN / 16][4],
                                         uint64_t dv) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
        wgmma::wgmma_rs<D>(acc, p[kk], desc_add(dv, uint32_t(kk) * 2 * kSwizzleAtom), 1);
    wgmma_commit();
}

// The block's shared memory as 32-bit shared-window addresses (what TMA, mbarriers and the wgmma
// descriptors take; FA3's SharedStorage): the Q tile at base (the dynamic shared memory rounded
// up to the 1024-byte swizzle atom), kStages of K then of V tiles, then the mbarriers full_k,
// full_v, empty_k, empty_v [stage] and the two ping-pong turns. base_ptr: base as a generic
// pointer, for the plain stores (the Q tile, the zeroed V rows).
template <int D, int BN>
struct AttnSmem {
    static constexpr uint32_t kQBytes = uint32_t(kWgBM) * D * 2;
    static constexpr uint32_t kTileBytes = uint32_t(BN) * D * 2;  // one K or V stage
    unsigned char *base_ptr;
    uint32_t base;
    uint32_t sK0;   // stage s of K at sK0 + s * kTileBytes
    uint32_t sV0;   // stage s of V at sV0 + s * kTileBytes
    uint32_t bars;  // full_k, full_v, empty_k, empty_v [s], sched [2]
    __device__ __forceinline__ uint32_t full_k(int st) const { return bars + 8 * st; }
    __device__ __forceinline__ uint32_t full_v(int st) const { return bars + 8 * (kStages + st); }
    __device__ __forceinline__ uint32_t empty_k(int st) const { return bars + 8 * (2 * kStages + st); }
    __device__ __forceinline__ uint32_t empty_v(int st) const { return bars + 8 * (3 * kStages + st); }
    __device__ __forceinline__ uint32_t sched(int w) const { return bars + 8 * (4 * kStages + w); }
    // The ping-pong turns (attn_mainloop): warpgroup wg waits for its turn k, then passes the turn.
    __device__ __forceinline__ void turn_wait(int wg, int k) const { mbar_wait(sched(wg), uint32_t(k) & 1); }
    __device__ __forceinline__ void turn_pass(int wg) const { mbar_arrive(sched(wg ^ 1)); }
};

// The block's tile (FA3's TileScheduler, one tile per block): KV head kvh and the packed rows
// m0 .. m_end - 1 of `packed`; the keys: the position pos0 (read from the device when the launch
// has pos0_dev), n_keys visible to the block's last row, keys <= diag visible to every row, in
// n_tiles key tiles. One linear grid, KV head fastest and row tiles from the last (most keys) to
// the first: the blocks start heaviest first across all heads, so the tail of the grid is short.
struct AttnTile {
    int64_t packed, m0, m_end, pos0, n_keys, diag;
    int kvh, n_tiles;
};
template <int BN>
__device__ __forceinline__ AttnTile attn_tile(const WgmmaAttnArgs &a) {
    AttnTile t;
    t.packed = a.rows * a.G;
    const int64_t n_mtiles = (t.packed + kWgBM - 1) / kWgBM;
    t.kvh = int(blockIdx.x % unsigned(a.n_kv_heads));
    t.m0 = (n_mtiles - 1 - int64_t(blockIdx.x / unsigned(a.n_kv_heads))) * kWgBM;
    t.m_end = t.m0 + kWgBM < t.packed ? t.m0 + kWgBM : t.packed;
    // The grid, the shared memory and the maps do not depend on the position: the key loop's
    // bound and the causal limits do.
    t.pos0 = a.pos0_dev ? *a.pos0_dev : a.pos0;
    t.n_keys = t.pos0 + (t.m_end - 1) / a.G + 1;  // keys visible to the block's last row
    t.diag = t.pos0 + t.m0 / a.G;  // keys <= diag are visible to every row of the block
    t.n_tiles = int((t.n_keys + BN - 1) / BN);
    return t;
}

// Where tile j0's keys start in the caches when they lie in one page (or the caches are
// contiguous: row j0), else -1 (paged across a page boundary: attn_load_tile loads pieces).
// 32-bit arithmetic (the producer runs on 24 registers): positions and pool rows < 2^31.
template <int BN>
__device__ __forceinline__ int attn_tile_row(const WgmmaAttnArgs &a, int j0) {
    if (!a.pages.paged()) return j0;
    const int P = a.pages.page_rows, k0 = j0 / P;
    return k0 == (j0 + BN - 1) / P ? __ldg(a.pages.table + k0) * P + (j0 - k0 * P) : -1;
}

// One K or V tile of keys j0 .. j0 + BN - 1 into the stage at dst, completing on bar: in one
// box of BN rows per 64 columns (tm) at row0 = attn_tile_row; paged across a page boundary
// (row0 < 0), a box of kPageBox rows per 64 columns at each piece's pool row (tm_piece: measured
// 0.54-0.66x the one-box loads when every tile went this way, call s42a; pages a multiple of BN
// never take it). Pieces past the chunk's last key (kv_len - 1) read the last page's rows:
// masked scores and zeroed V rows (attn_last_pv), as the contiguous maps' zero fill.
template <int D, int BN>
__device__ __forceinline__ void attn_load_tile(uint32_t dst, const CUtensorMap *tm, const CUtensorMap *tm_piece,
                                               const WgmmaAttnArgs &a, const AttnTile &t, int j0, int row0,
                                               uint32_t bar) {
    if (row0 >= 0) {
#pragma unroll
        for (int b = 0; b < D / kSwizzleCols; ++b)
            tma_load_2d(dst + b * BN * kSwizzleRow, tm, t.kvh * D + b * kSwizzleCols, row0, bar);
        return;
    }
    const int P = a.pages.page_rows, last_page = int((t.pos0 + a.rows - 1) / P);
    for (int r = 0; r < BN; r += kPageBox) {
        const int j = j0 + r, k = j / P;
        const int row = a.pages.table[k < last_page ? k : last_page] * P + (j - k * P);
#pragma unroll
        for (int b = 0; b < D / kSwizzleCols; ++b)
            tma_load_2d(dst + (b * BN + r) * kSwizzleRow, tm_piece, t.kvh * D + b * kSwizzleCols, row, bar);
    }
}

// The producer (thread 0 of the producer warpgroup): the K and V tiles of the block's keys by
// TMA. Tile `it` goes to stage it % kStages once the tile kStages back has been released there
// (its use-th refill waits for release number use - 1); K and V have their own barriers, so
// K_{i+2} loads as soon as S_i is done. Paged, the next tile's page-table entry is read before
// the waits, so its latency hides behind them (read at the use, the D = 256 tiles ran 0.77-0.86x
// the contiguous ones, call s42b).
template <int D, int BN>
__device__ __forceinline__ void attn_produce(const WgmmaAttnArgs &a, const AttnSmem<D, BN> &L, const AttnTile &t,
                                             const CUtensorMap *tm_k, const CUtensorMap *tm_v,
                                             const CUtensorMap *tm_kp, const CUtensorMap *tm_vp) {
    constexpr uint32_t kTileBytes = AttnSmem<D, BN>::kTileBytes;
    int row = t.n_tiles > 0 ? attn_tile_row<BN>(a, 0) : 0;
    for (int it = 0; it < t.n_tiles; ++it) {
        const int st = it % kStages, use = it / kStages;
        const int j0 = it * BN;
        const int row_next = it + 1 < t.n_tiles ? attn_tile_row<BN>(a, j0 + BN) : 0;
        if (use > 0) mbar_wait(L.empty_k(st), (use - 1) & 1);
        mbar_arrive_expect_tx(L.full_k(st), kTileBytes);
        attn_load_tile<D, BN>(L.sK0 + st * kTileBytes, tm_k, tm_kp, a, t, j0, row, L.full_k(st));
        if (use > 0) mbar_wait(L.empty_v(st), (use - 1) & 1);
        mbar_arrive_expect_tx(L.full_v(st), kTileBytes);
        attn_load_tile<D, BN>(L.sV0 + st * kTileBytes, tm_v, tm_vp, a, t, j0, row, L.full_v(st));
        row = row_next;
    }
    // Stay until the consumers have released the last stages: no TMA of this block is
    // in flight when its issuing thread exits.
    for (int it = t.n_tiles > kStages ? t.n_tiles - kStages : 0; it < t.n_tiles; ++it) {
        mbar_wait(L.empty_k(it % kStages), (it / kStages) & 1);
        mbar_wait(L.empty_v(it % kStages), (it / kStages) & 1);
    }
}

// The Q tile by the 256 consumer threads (ctid): fp32 -> fp16 (saturating), written straight
// into the swizzled layout; rows past the chunk are zero and never stored. All of a thread's
// loads are issued before the first conversion (one memory latency per block, not one per
// chunk); 16-byte loads where q, ldq and the head stride allow them (a.q_vec4), else scalar
// ones. Fenced to the async proxy: the wgmma read it.
template <int D, int BN>
__device__ __forceinline__ void attn_load_q(const WgmmaAttnArgs &a, const AttnSmem<D, BN> &L, const AttnTile &t,
                                            int ctid) {
    constexpr int CPR = D / 8;                           // 16-byte chunks per row
    constexpr int kQIters = kWgBM * CPR / kWgConsumers;  // 16-byte chunks of the tile per thread
    static_assert(kWgBM * CPR % kWgConsumers == 0, "whole chunks per thread");
    float qx[kQIters][8];
#pragma unroll
    for (int k = 0; k < kQIters; ++k) {
        const int idx = ctid + k * kWgConsumers, r = idx / CPR, c = idx % CPR;
        const int64_t m = t.m0 + r;
        if (m < t.packed) {
            const int64_t tq = m / a.G, h = int64_t(t.kvh) * a.G + (m - tq * a.G);
            const float *src = a.q.ptr + tq * a.q.ld + h * a.qhs + c * 8;
            if (a.q_vec4) {
                const float4 lo = __ldg(reinterpret_cast<const float4 *>(src));
                const float4 hi = __ldg(reinterpret_cast<const float4 *>(src) + 1);
                qx[k][0] = lo.x, qx[k][1] = lo.y, qx[k][2] = lo.z, qx[k][3] = lo.w;
                qx[k][4] = hi.x, qx[k][5] = hi.y, qx[k][6] = hi.z, qx[k][7] = hi.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) qx[k][e] = __ldg(src + e);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) qx[k][e] = 0.f;
        }
    }
#pragma unroll
    for (int k = 0; k < kQIters; ++k) {
        const int idx = ctid + k * kWgConsumers, r = idx / CPR, c = idx % CPR;
        __align__(16) __half h8[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) h8[e] = wg_to_half_sat(qx[k][e]);
        *reinterpret_cast<uint4 *>(L.base_ptr + swizzled_offset(r, c, kWgBM)) = *reinterpret_cast<const uint4 *>(h8);
    }
    fence_proxy_async();
}

// The consumer's main loop (one warpgroup wg, its thread at fragment row gid, column pair tig of
// warp `warp`): every key tile but the last, with the ping-pong turns and the pipelining of the
// schedule above; acc holds O (wgmma accumulator layout, see wgmma.cuh) rescaled to the running
// max, sm the softmax state, p the last tile's probabilities, whose product attn_last_pv issues.
// Tile 0's scores and probabilities come before the loop; in iteration it, S of tile it+1 is in
// flight while P_it V_it is issued, and its softmax overlaps that product.
// Ping-pong (FA3's warp-scheduler barrier, on mbarriers so that a stuck wait traps): the two
// warpgroups issue their wgmma batches in turn, batch k of warpgroup 1 after batch k of
// warpgroup 0 and batch k+1 of warpgroup 0 after batch k of warpgroup 1, so that one
// warpgroup's softmax runs while the other's products occupy the tensor cores. Batches:
// 0 = S_0, it+1 = S_{it+1} and P_it V_it, n_tiles = the last P V.
template <int D, int BN>
__device__ __forceinline__ void attn_mainloop(const WgmmaAttnArgs &a, const AttnSmem<D, BN> &L, const AttnTile &t,
                                              int wg, int warp, int gid, int tig, float (&acc)[D / 2],
                                              softmax_state &sm, uint32_t (&p)[BN / 16][4]) {
    constexpr uint32_t kTileBytes = AttnSmem<D, BN>::kTileBytes;
    // This thread's two rows (gid and gid + 8 of its warp's 16): last visible key of each.
    int64_t last_key[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int64_t m = t.m0 + wg * 64 + warp * 16 + gid + 8 * i;
        const int64_t lk = t.pos0 + m / a.G;
        last_key[i] = lk < t.n_keys - 1 ? lk : t.n_keys - 1;
    }
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
    float alpha[2];
    float s[BN / 2];
    const uint32_t q_wg = L.base + uint32_t(wg) * 64 * kSwizzleRow;  // this warpgroup's 64 rows
    // Descriptors of this warpgroup's Q rows and of stage 0 of K and V; the other stages and
    // k-steps are these moved by an offset (desc_add).
    const uint64_t dq = smem_desc(q_wg, 16, kSwizzleAtom);
    const uint64_t dk0 = smem_desc(L.sK0, 16, kSwizzleAtom);
    const uint64_t dv0 = smem_desc(L.sV0, uint32_t(BN) * kSwizzleRow, kSwizzleAtom);
    const auto crosses_diag = [&](int it) { return int64_t(it) * BN + BN - 1 > t.diag; };
    if (wg == 1) mbar_arrive(L.sched(0));  // warpgroup 0 goes first

    mbar_wait(L.full_k(0), 0);
    L.turn_wait(wg, 0);
    issue_qk<D, BN>(s, dq, dk0);
    L.turn_pass(wg);
    wgmma_wait<0>();
    fence_regs(s);
    mbar_arrive(L.empty_k(0));  // K_0 is done with
    softmax_tile<BN>(s, 0, crosses_diag(0), last_key, tig, a.scale_log2, sm, p, alpha);
    // The loop runs the tiles that have a successor; the last tile's product follows it, so
    // every iteration commits the same two wgmma groups (ptxas tracks them statically).
    for (int it = 0; it + 1 < t.n_tiles; ++it) {
        const int st = it % kStages, use = it / kStages;
        const int nst = (it + 1) % kStages;
        mbar_wait(L.full_k(nst), ((it + 1) / kStages) & 1);
        mbar_wait(L.full_v(st), use & 1);
        L.turn_wait(wg, it + 1);
        issue_qk<D, BN>(s, dq, desc_add(dk0, nst * kTileBytes));
        fence_regs(acc);
        issue_pv<D, BN>(acc, p, desc_add(dv0, st * kTileBytes));
        L.turn_pass(wg);
        wgmma_wait<1>();  // S of tile it+1 is done; P_it V_it may still run
        fence_regs(s);
        mbar_arrive(L.empty_k(nst));  // K_{it+1} is done with
        uint32_t p_next[BN / 16][4];
        softmax_tile<BN>(s, int64_t(it + 1) * BN, crosses_diag(it + 1), last_key, tig, a.scale_log2, sm, p_next,
                         alpha);
        wgmma_wait<0>();
        fence_regs(acc);
        fence_regs(p);  // P_it stays in its registers until its product is complete
        mbar_arrive(L.empty_v(st));  // V_it is done with
#pragma unroll
        for (int i = 0; i < D / 2; ++i) acc[i] *= alpha[(i >> 1) & 1];
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) p[kk][e] = p_next[kk][e];
    }
}

// The last tile's product O += P V (ping-pong batch n_tiles). Rows of the last V tile from pos0
// + rows on are not keys of this chunk. Past the maps the TMA filled them with zeros; inside
// (maps spanning the capacity: pos0_dev) they hold whatever the cache held there, and P = 0 times
// a stale or never written value may be NaN, so they are zeroed here first: the same tile as the
// TMA's fill, bitwise the same products. (K needs nothing: scores of those keys are masked to
// -inf, and S column j reads K row j only.) Only the last tile can reach them (n_keys <= pos0 +
// rows); the condition is block-uniform, so both consumer warpgroups meet the barrier or neither.
template <int D, int BN>
__device__ __forceinline__ void attn_last_pv(const WgmmaAttnArgs &a, const AttnSmem<D, BN> &L, const AttnTile &t,
                                             int wg, int ctid, float (&acc)[D / 2], uint32_t (&p)[BN / 16][4]) {
    constexpr uint32_t kTileBytes = AttnSmem<D, BN>::kTileBytes;
    const int it = t.n_tiles - 1, st = it % kStages;
    mbar_wait(L.full_v(st), (it / kStages) & 1);
    const int64_t kv_len = t.pos0 + a.rows;
    const int64_t j_end = int64_t(t.n_tiles) * BN < a.map_rows ? int64_t(t.n_tiles) * BN : a.map_rows;
    if (j_end > kv_len) {
        constexpr int kChunksPerRow = kSwizzleRow / 16;  // a swizzled row permutes its own chunks
        const int r0 = int(kv_len - int64_t(it) * BN), nr = int(j_end - kv_len);
        unsigned char *const tile = L.base_ptr + (L.sV0 - L.base) + st * kTileBytes;
        for (int idx = ctid; idx < nr * (D / kSwizzleCols) * kChunksPerRow; idx += kWgConsumers) {
            const int c = idx % kChunksPerRow, rb = idx / kChunksPerRow;
            const int r = r0 + rb % nr, b = rb / nr;  // row r of swizzle block b (64 columns)
            *reinterpret_cast<uint4 *>(tile + (b * BN + r) * kSwizzleRow + c * 16) = make_uint4(0, 0, 0, 0);
        }
        fence_proxy_async();  // the zeros, seen by the wgmma's (async proxy) reads
        consumer_sync();
    }
    const uint64_t dv0 = smem_desc(L.sV0, uint32_t(BN) * kSwizzleRow, kSwizzleAtom);
    L.turn_wait(wg, t.n_tiles);
    fence_regs(acc);
    issue_pv<D, BN>(acc, p, desc_add(dv0, st * kTileBytes));
    L.turn_pass(wg);
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(p);
    mbar_arrive(L.empty_v(st));
}

// The epilogue: normalise and store the thread's rows of this chunk (fp32): its two columns
// 2tig, 2tig+1 of each n8 tile as one float2 where o and ldo allow it (a.o_vec2), else two
// scalars.
template <int D>
__device__ __forceinline__ void attn_epilogue(const WgmmaAttnArgs &a, const AttnTile &t, int wg, int warp, int gid,
                                              int tig, const float (&acc)[D / 2], const softmax_state &sm) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(sm.row_sum[r]);
        const float inv = 1.f / l;  // l >= 1 (the max term); NaN inputs stay NaN
        const int64_t m = t.m0 + wg * 64 + warp * 16 + gid + 8 * r;
        if (m >= t.packed) continue;
        const int64_t tq = m / a.G, h = int64_t(t.kvh) * a.G + (m - tq * a.G);
        float *orow = a.o.ptr + tq * a.o.ld + h * D;
        if (a.o_vec2) {
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt)
                *reinterpret_cast<float2 *>(orow + dt * 8 + 2 * tig) =
                    make_float2(acc[4 * dt + 2 * r] * inv, acc[4 * dt + 2 * r + 1] * inv);
        } else {
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                orow[dt * 8 + 2 * tig] = acc[4 * dt + 2 * r] * inv;
                orow[dt * 8 + 2 * tig + 1] = acc[4 * dt + 2 * r + 1] * inv;
            }
        }
    }
}

#endif  // PF_WGMMA_DEVICE

// The kernel sets up the shared memory, the tile and the barriers, then splits into the roles
// (the setmaxnreg split stays here, in the if/else of the roles: ptxas needs it at the branch,
// C7508): the producer warpgroup's thread 0 (attn_produce), the consumer warpgroups (attn_load_q,
// attn_mainloop, attn_last_pv, attn_epilogue).
template <int D, int BN>
__global__ void __launch_bounds__(kWgThreads, 1)
    wgmma_attn_kernel(const __grid_constant__ WgmmaAttnArgs a,
                      const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v,
                      const __grid_constant__ CUtensorMap tm_kp,
                      const __grid_constant__ CUtensorMap tm_vp) {
#ifdef PF_WGMMA_DEVICE
    // BN % 16: whole k-steps of P V (and n8 tiles of S); BN % 8 is then implied, which keeps
    // each BN-row swizzle block whole 1024-byte atoms. BN <= 256: wgmma's N and the TMA box.
    static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256, "whole swizzle blocks, whole k-steps");
    static_assert(uint32_t(BN) * kSwizzleRow % kSwizzleAtom == 0, "swizzle blocks 1024-aligned");
    using Smem = AttnSmem<D, BN>;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    const uint32_t sK0 = base + Smem::kQBytes, sV0 = sK0 + kStages * Smem::kTileBytes;
    const Smem L{smem_raw + (base - raw), base, sK0, sV0, sV0 + kStages * Smem::kTileBytes};

    const int tid = threadIdx.x;
    const AttnTile t = attn_tile<BN>(a);
    if (tid == 0) {
        for (int st = 0; st < kStages; ++st) {
            mbar_init(L.full_k(st), 1);  // the producer's arrive.expect_tx
            mbar_init(L.full_v(st), 1);
            mbar_init(L.empty_k(st), kWgConsumers);  // every consumer thread
            mbar_init(L.empty_v(st), kWgConsumers);
        }
        mbar_init(L.sched(0), kWgConsumers / 2);  // the 128 threads of the other warpgroup
        mbar_init(L.sched(1), kWgConsumers / 2);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();  // the last block-wide barrier: the producer warpgroup leaves after its loop

    if (tid < 128) {  // the producer warpgroup: its registers go to the consumers
        setmaxnreg_dec<kProducerRegs>();
        if (tid == 0) attn_produce<D, BN>(a, L, t, &tm_k, &tm_v, &tm_kp, &tm_vp);
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    const int ctid = tid - 128;              // consumer thread 0..255
    const int wg = ctid >> 7;                // consumer warpgroup: packed rows 64 wg .. 64 wg + 63
    const int warp = (ctid >> 5) & 3;        // warp within the warpgroup: 16 rows each
    const int lane = ctid & 31, gid = lane >> 2, tig = lane & 3;
    attn_load_q<D, BN>(a, L, t, ctid);
    consumer_sync();  // the whole Q tile is in place for both warpgroups' wgmma

    float acc[D / 2];  // O: 64 x D per warpgroup, wgmma accumulator layout (see wgmma.cuh)
    softmax_state sm = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
    uint32_t p[BN / 16][4];
    attn_mainloop<D, BN>(a, L, t, wg, warp, gid, tig, acc, sm, p);
    attn_last_pv<D, BN>(a, L, t, wg, ctid, acc, p);
    attn_epilogue<D>(a, t, wg, warp, gid, tig, acc, sm);
#endif  // PF_WGMMA_DEVICE
}

// ------------------------------------------------------------------------------------ host

// The 2-D map of one cache: columns kv_dim (innermost), rows n_rows (rows past it read as zeros),
// boxes of BN rows x 64 columns landing in the 128-byte swizzle.
template <int BN>
pf_status make_cache_map(CUtensorMap *map, const void *cache, int64_t kv_dim, int64_t n_rows,
                         const char *which) {
    if (!tensor_map_encoder())
        return fail(PF_STATUS_CUDA_ERROR, "attention: cuTensorMapEncodeTiled is unavailable");
    const CUresult r = encode_fp16_sw128(map, cache, kv_dim, n_rows, BN);
    if (r != CUDA_SUCCESS)
        return fail(PF_STATUS_CUDA_ERROR,
                    "attention: cuTensorMapEncodeTiled(%s cache, kv_dim=%lld, rows=%lld) failed: %d",
                    which, (long long)kv_dim, (long long)n_rows, int(r));
    return PF_STATUS_OK;
}

template <int D, int BN>
pf_status launch_wgmma(const AttentionArgs &a, cudaStream_t st) {
    constexpr size_t smem = wgmma_smem_bytes<D, BN>();
    static_assert(smem <= kSm90SmemOptin, "Q + kStages of K and V exceed sm_90's 227 KiB");
    PF_TRY(set_max_dynamic_smem(wgmma_attn_kernel<D, BN>, int(smem), "wgmma_attn_kernel"));
    const int64_t kv_dim = int64_t(a.n_kv_heads) * D;
    // The maps span the keys of this call, or with the position on the device the caches'
    // whole capacity (the same map at any position; the kernel bounds its loop); paged, the
    // pools (kv_capacity rows), in boxes of kPageBox rows.
    const bool paged = a.pages.paged();
    const int64_t map_rows = paged || a.pos0_dev ? a.kv_capacity : a.pos0 + a.rows;
    CUtensorMap tm_k, tm_v, tm_kp, tm_vp;  // BN-row boxes; kPageBox-row boxes (paged only)
    PF_TRY(make_cache_map<BN>(&tm_k, a.k_cache, kv_dim, map_rows, "K"));
    PF_TRY(make_cache_map<BN>(&tm_v, a.v_cache, kv_dim, map_rows, "V"));
    if (paged) {
        PF_TRY(make_cache_map<kPageBox>(&tm_kp, a.k_cache, kv_dim, map_rows, "K"));
        PF_TRY(make_cache_map<kPageBox>(&tm_vp, a.v_cache, kv_dim, map_rows, "V"));
    } else {
        tm_kp = tm_k;  // never read
        tm_vp = tm_v;
    }
    WgmmaAttnArgs f;
    f.q = CMatF{a.q, a.ldq};
    f.qhs = a.q_head_stride;
    f.o = MatF{a.o, a.ldo};
    f.G = a.n_heads / a.n_kv_heads;
    f.n_kv_heads = a.n_kv_heads;
    f.q_vec4 = (reinterpret_cast<uintptr_t>(a.q) & 15) == 0 && a.ldq % 4 == 0 && a.q_head_stride % 4 == 0;
    f.o_vec2 = (reinterpret_cast<uintptr_t>(a.o) & 7) == 0 && a.ldo % 2 == 0;
    f.rows = a.rows;
    f.pos0 = a.pos0;
    f.pos0_dev = a.pos0_dev;
    f.map_rows = paged ? INT64_MAX : map_rows;
    f.pages = a.pages;
    f.scale_log2 = a.scale * 1.4426950408889634f;
    const int64_t blocks = ceil_div(a.rows * f.G, kWgBM) * a.n_kv_heads;
    if (blocks > kMaxGridX)
        return fail(PF_STATUS_UNSUPPORTED, "attention: %lld rows x %d heads exceed one grid",
                    (long long)a.rows, a.n_heads);
    const dim3 grid{unsigned(blocks)};
    wgmma_attn_kernel<D, BN><<<grid, kWgThreads, smem, st>>>(f, tm_k, tm_v, tm_kp, tm_vp);
    PF_LAUNCH_CHECK("wgmma_attn_kernel<%d, %d>", D, BN);
    return PF_STATUS_OK;
}

}  // namespace

pf_status attention_flash_wgmma(const AttentionArgs &a, cudaStream_t st) {
    // Key tiles: 176 at D = 128, 80 at D = 256 (shared memory: Q + 2 stages of K and V, 208 and
    // 224 KiB; registers: O, two S and two P at 240 per consumer thread, no spills). The page
    // sizes that keep a tile in one page (pyprefill.kernels.attention.tile_page_rows, the pool's
    // default there, and prefill.h's pf_model_kv_pool text) follow from these two numbers.
    if (a.head_dim == 128) return launch_wgmma<128, 176>(a, st);
    if (a.head_dim == 256) return launch_wgmma<256, 80>(a, st);
    return fail(PF_STATUS_UNSUPPORTED, "attention: the wgmma kernel needs head_dim 128 or 256 (got %d)",
                a.head_dim);
}

}  // namespace pf
