// hopper.cuh — what the sm_90a kernels share: the 128-byte-swizzled shared-memory layout of fp16
// tiles, wgmma shared-memory descriptors, TMA tensor maps and loads, mbarriers, setmaxnreg, and the
// wgmma fence / commit / wait. Device functions are for sm_90a code only (call them inside
// `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` regions); the host helpers build the TMA maps.
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
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from cudart)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pf {
namespace hopper {

constexpr int kSwizzleAtom = 1024;  // 8 rows x 128 bytes: the swizzle's period, and the SBO
constexpr int kSwizzleCols = 64;    // fp16 columns of one swizzled row (128 bytes): a TMA box width
constexpr int kSwizzleRow = 128;    // bytes of one swizzled row (64 fp16)

// Byte offset of row r's 16-byte chunk c (columns 8c .. 8c+7) in a swizzled [rows][D] tile.
__device__ __forceinline__ uint32_t swizzled_offset(int r, int c, int rows) {
    return uint32_t((c >> 3) * rows * kSwizzleRow + r * kSwizzleRow + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
           (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// The descriptor of the same layout `bytes` further on (a multiple of 16): the start address
// field (bits 0-13, address >> 4) moves and nothing else. Exactly smem_desc(addr + bytes, ...)
// while addr + bytes stays below 2^18 (every shared-memory address: 228 KiB per SM), since the
// field then never carries into bit 14; one 32-bit add on the low word instead of rebuilding
// the descriptor (CUTLASS's descriptor iterators do the same).
__device__ __forceinline__ uint64_t desc_add(uint64_t desc, uint32_t bytes) {
    const uint32_t lo = uint32_t(desc) + (bytes >> 4), hi = uint32_t(desc >> 32);
    return (uint64_t(hi) << 32) | lo;
}

// ---- mbarrier (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier")
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of asynchronous transactions (the TMA's writes).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// mbar_arrive where `on`, predicated inside the asm (see mbar_arrive_cluster_if).
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool on) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
        "}\n" ::"r"(bar),
        "r"(uint32_t(on))
        : "memory");
}
// Waits for the phase with parity `parity` to complete (phases alternate 0, 1, 0, ...). A wait
// that never ends (a TMA that never completes, a phase bug) traps after kWaitTries failed tries,
// so the launch fails with an error instead of hanging the device; each try waits up to a
// hardware time limit, so that is seconds or more, where a real wait lasts microseconds. The
// loop stays inside one asm block (one extra register), which keeps the wgmma pipelines around
// it free of spills.
constexpr unsigned kWaitTries = 1u << 27;
// The loop, around one try_wait instruction (TRY_WAIT: its opcode and qualifiers).
#define PF_MBAR_WAIT_LOOP(TRY_WAIT)                                                        \
    "{\n"                                                                                 \
    ".reg .pred p;\n"                                                                     \
    ".reg .u32 n;\n"                                                                      \
    "mov.u32 n, 0;\n"                                                                     \
    "WAIT_LOOP:\n" TRY_WAIT " p, [%0], %1;\n"                                             \
    "@p bra WAIT_DONE;\n"                                                                 \
    "add.u32 n, n, 1;\n"                                                                  \
    "setp.lt.u32 p, n, %2;\n"                                                             \
    "@p bra WAIT_LOOP;\n"                                                                 \
    "trap;\n"                                                                             \
    "WAIT_DONE:\n"                                                                        \
    "}\n"
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(PF_MBAR_WAIT_LOOP("mbarrier.try_wait.parity.shared::cta.b64")::"r"(bar), "r"(parity),
                 "n"(kWaitTries)
                 : "memory");
}

// TMA: the box at (column c0, row c1) of the 2-D tensor map into shared memory at dst, completing
// its bytes on mbarrier bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// TMA: the box at (c0, c1, c2) of the 3-D tensor map into shared memory at dst, completing its
// bytes on mbarrier bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

// ---- thread-block clusters (PTX ISA "Cluster of cooperative thread arrays"; the idea of sharing
// a tile's TMA load between the blocks of a cluster is CUTLASS's and DeepGEMM's multicast)
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster: the barrier, with release / acquire ordering (the
// mbarrier inits of each block visible to the others before any of them uses a remote one).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
// Where `on`: one arrival on the mbarrier at the same shared offset `bar` in the cluster's block
// `cta`, with the default semantics (release at CTA scope, as CUTLASS's ClusterBarrier::arrive:
// what the arrival orders is this thread's reads of its own block's shared memory; a
// release.cluster arrival made the int8 GEMM's consumers twice as slow, NOTES.md). Predicated
// inside the asm, not branched around: a branch in a wgmma loop can make the compiler copy the
// in-flight fragments between loop iterations, and ptxas then serializes the wgmmas (C7514).
__device__ __forceinline__ void mbar_arrive_cluster_if(uint32_t bar, uint32_t cta, bool on) {
    asm volatile(
        "{\n"
        ".reg .b32 ra;\n"
        ".reg .pred p;\n"
        "setp.ne.u32 p, %2, 0;\n"
        "@p mapa.shared::cluster.u32 ra, %0, %1;\n"
        "@p mbarrier.arrive.shared::cluster.b64 _, [ra];\n"
        "}\n" ::"r"(bar),
        "r"(cta), "r"(uint32_t(on))
        : "memory");
}
// The shared address `addr` of this block mapped to the same offset in the cluster's block `cta`
// (a shared::cluster address, for st_cluster_v4 and the remote arrivals).
__device__ __forceinline__ uint32_t mapa_cluster(uint32_t addr, uint32_t cta) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(cta));
    return r;
}
// 16 bytes into another block's shared memory (a shared::cluster address: mapa_cluster).
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, uint4 v) {
    asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}
// One arrival on the mbarrier at shared::cluster address `rbar` (mapa_cluster) with release at
// cluster scope: the data this thread wrote into that block's shared memory (and what it saw
// other threads write, by an earlier barrier) is visible to the threads that then complete a
// wait on it with acquire at cluster scope (mbar_wait_cluster).
__device__ __forceinline__ void mbar_arrive_release_cluster(uint32_t rbar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(rbar) : "memory");
}
// mbar_wait with acquire at cluster scope: the phase's arrivals include another block's
// (mbar_arrive_release_cluster) whose writes into this block's shared memory are read next.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
    asm volatile(PF_MBAR_WAIT_LOOP("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64")::"r"(bar),
                 "r"(parity), "n"(kWaitTries)
                 : "memory");
}
// tma_load_2d into the same shared offset of every block of the cluster in cta_mask (bit i =
// rank i), each block's mbarrier at offset bar completing the bytes that land there.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap *map, int c0,
                                                      int c1, uint32_t bar, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
        : "memory");
}

// Shared memory written by this thread's generic-proxy stores becomes visible to the async proxy
// that wgmma reads its shared operands through.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// fence_proxy_async for stores into this block's and the cluster's other blocks' shared memory
// (st_cluster_v4) that their wgmma read.
__device__ __forceinline__ void fence_proxy_async_cluster() {
    asm volatile("fence.proxy.async.shared::cluster;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins registers in program order around the asynchronous wgmma: the compiler sees each one
// redefined here, so no read moves above the wait and no register an in-flight wgmma still
// reads is reused before it (CUTLASS calls this warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void fence_regs(float (&r)[M][N]) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int e = 0; e < N; ++e) asm volatile("" : "+f"(r[i][e])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// ------------------------------------------------------------------------------------ host

// A launch configuration of `grid` blocks of `threads` threads and `smem` bytes of dynamic shared
// memory in clusters of `cluster` blocks along x; *attr holds the cluster attribute it points to.
inline cudaLaunchConfig_t cluster_config(unsigned grid, unsigned threads, size_t smem, cudaStream_t st,
                                         unsigned cluster, cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = cluster;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

// Launches kernel(args...) on `grid` blocks in clusters of `cluster` (1: an ordinary launch).
template <class... Params, class... Args>
inline cudaError_t launch_clusters(void (*kernel)(Params...), unsigned grid, unsigned threads, size_t smem,
                                   cudaStream_t st, unsigned cluster, Args... args) {
    if (cluster == 1) {
        kernel<<<grid, threads, smem, st>>>(args...);
        return cudaGetLastError();
    }
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config(grid, threads, smem, st, cluster, &attr);
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// The clusters of `cluster` blocks of kernel the device holds at once (a persistent grid's size);
// 0 when the query fails.
template <class... Params>
inline int max_active_clusters_of(void (*kernel)(Params...), unsigned threads, size_t smem, unsigned cluster) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config(cluster, threads, smem, nullptr, cluster, &attr);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

using encode_tiled_fn = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda link); null when the
// driver does not provide it. Looked up once.
inline encode_tiled_fn tensor_map_encoder() {
    static const encode_tiled_fn fn = []() -> encode_tiled_fn {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                               cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        return reinterpret_cast<encode_tiled_fn>(p);
    }();
    return fn;
}

// The 2-D TMA map of a row-major matrix [rows][cols] of `dtype` (elem_bytes each; rows row_bytes
// apart, a multiple of 16; 16-byte aligned base): boxes of box_rows rows x box_cols columns
// (box_cols * elem_bytes = 128) that land in the 128-byte swizzle above; rows past `rows` read
// as zeros. CUDA_ERROR_NOT_FOUND when there is no encoder.
inline CUresult encode_2d_sw128(CUtensorMap *map, CUtensorMapDataType dtype, const void *base,
                                int64_t cols, int64_t rows, int64_t row_bytes, int box_cols,
                                int box_rows) {
    const encode_tiled_fn enc = tensor_map_encoder();
    if (!enc) return CUDA_ERROR_NOT_FOUND;
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};  // bytes from one row to the next
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    const cuuint32_t elem_strides[2] = {1, 1};
    return enc(map, dtype, 2, const_cast<void *>(base), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Rows of bytes [rows][row_bytes] (row_bytes a multiple of 16, 16-byte aligned base) as 16-byte
// units: a box of box_rows rows x seg_bytes (a multiple of 16, at most 4096) lands dense, row after
// row, seg_bytes apart, starting at the unit coordinate (c1 = byte / 16, c2 = row); units past a
// row's end and rows past `rows` read as zeros. CUDA_ERROR_NOT_FOUND when there is no encoder.
inline CUresult encode_rows_u8(CUtensorMap *map, const void *base, int64_t row_bytes, int64_t rows, int seg_bytes,
                               int box_rows) {
    const encode_tiled_fn enc = tensor_map_encoder();
    if (!enc) return CUDA_ERROR_NOT_FOUND;
    const cuuint64_t dims[3] = {16, cuuint64_t(row_bytes / 16), cuuint64_t(rows)};
    const cuuint64_t strides[2] = {16, cuuint64_t(row_bytes)};
    const cuuint32_t box[3] = {16, cuuint32_t(seg_bytes / 16), cuuint32_t(box_rows)};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void *>(base), dims, strides, box, elem_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// A dense row-major fp16 matrix [rows][cols] (cols a multiple of 8) in boxes of box_rows rows x
// 64 columns.
inline CUresult encode_fp16_sw128(CUtensorMap *map, const void *base, int64_t cols, int64_t rows,
                                  int box_rows) {
    return encode_2d_sw128(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, base, cols, rows, cols * 2,
                           kSwizzleCols, box_rows);
}

}  // namespace hopper
}  // namespace pf
