// mma.cuh — the sm_80 primitives the kernel files share (ggml-cuda's mma.cuh / cp-async.cuh idea:
// one copy of each inline-PTX wrapper): ldmatrix, the m16n8k16 fp16 and m16n8k8 tf32 mma.sync
// tiles with their lane layouts, fp16 packing, cp.async, the reductions over an mma quad, and the
// programmatic dependent launch (PDL: the device side and the host launch).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ptx/common.cuh"

namespace pf {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------ fp16 packing

// Two floats as an fp16 pair (round to nearest even, as numpy), lo in the low half.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
    return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}

// ------------------------------------------------------------------ ldmatrix and mma.sync

// Four 8x8 b16 matrices; lane i gives the row address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// d += a (16x16 fp16, row) * b (16x8 fp16, col), fp32 accumulation. Fragments (PTX ISA,
// "mma.m16n8k16"): lane = 4 g + t; a: rows g, g+8 x cols 2t, 2t+1, 2t+8, 2t+9; b: cols g x rows
// 2t, 2t+1, 2t+8, 2t+9; d: rows g, g+8 x cols 2t, 2t+1.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// d += a (16x8 tf32, row) * b (8x8 tf32, col), fp32 accumulation.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                 uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Lane addresses of ldmatrix x4 for the operand shapes of the m16n8k16 tile (tile origin (r0, c0)
// in the stored array, lane i):
//  A, stored [m][k]:               row r0 + (i&7) + 8((i>>3)&1), col c0 + 8(i>>4)
//  A, stored [k][m] (.trans):      row r0 + (i&7) + 8(i>>4),     col c0 + 8((i>>3)&1)
//  B pair, stored [n][k]:          row r0 + (i&7) + 8(i>>4),     col c0 + 8((i>>3)&1)
//  B pair, stored [k][n] (.trans): row r0 + (i&7) + 8((i>>3)&1), col c0 + 8(i>>4)
// (a "B pair" is the fragments of two n-tiles: regs 0,1 for columns n0..n0+7, 2,3 for n0+8..)
__device__ __forceinline__ int lrow_a(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
__device__ __forceinline__ int lcol_a(int lane) { return 8 * (lane >> 4); }
__device__ __forceinline__ int lrow_b(int lane) { return (lane & 7) + 8 * (lane >> 4); }
__device__ __forceinline__ int lcol_b(int lane) { return 8 * ((lane >> 3) & 1); }

// The four lanes of an mma row (a "quad": lanes 4g .. 4g+3 own the row's columns) combined, in
// one fixed order (xor 1, then xor 2): every lane of the quad ends with the same value.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
    return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(kFullMask, v, 1);
    return v + __shfl_xor_sync(kFullMask, v, 2);
}

// ------------------------------------------------------------------ cp.async

// 16 bytes global -> shared through L2 only (.cg: data read once); "memory": no compiler
// reordering of other accesses across it.
__device__ __forceinline__ void cp_async16(void *dst_smem, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst_smem)), "l"(src)
                 : "memory");
}
// The same with zero fill: `valid` false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
// 4 bytes (.ca), zero fill when not valid.
__device__ __forceinline__ void cp_async4_zfill(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups (the newest) are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all_but_newest() { cp_async_wait<1>(); }

// ------------------------------------------------------------------ programmatic dependent launch

// Device side (sm_90+; no-ops below). A kernel launched as its predecessor's programmatic
// dependent (launch_pdl) may be scheduled once every CTA of the predecessor has called
// pdl_launch_dependents(); it must call pdl_wait() before it reads anything the predecessor
// writes (the wait returns when the whole predecessor grid has completed and flushed).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Host side: `kernel` with `args` on `stream`, as the programmatic dependent of the kernel just
// before it when `pdl` (in a stream capture this becomes the graph's programmatic edge), else in
// plain stream order. The launch's own error (PDL) is returned; the caller's PF_LAUNCH_CHECK reads
// the rest.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, unsigned block, size_t smem, bool pdl,
                       cudaStream_t stream, const Args &...args) {
    if (!pdl) {
        kernel<<<grid, block, smem, stream>>>(args...);
        return cudaSuccess;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace pf
