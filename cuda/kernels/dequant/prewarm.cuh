// prewarm.cuh — many matrices of GGUF blocks -> fp16 in a few launches (the weights' fp16
// caches, filled at prewarm). Internal host entry point (namespace pf); the C API reaches it
// through prewarm_f16_groups (gemm.cu) and pf_weight_cache_f16.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "prefill.h"

namespace pf {

// One matrix to dequantize: all of its n * k elements, GGUF blocks in, packed fp16 out.
struct prewarm_job {
    const void *src;  // the weight's blocks ([n][k], k contiguous: a flat run of blocks)
    __half *dst;      // n * k fp16 elements, row-major
    int64_t elems;    // n * k (a multiple of the qtype's block size)
    int32_t qtype;    // PF_QTYPE_*
};

// Writes every job's fp16 copy, each element the round to nearest even of its exact fp32
// value: bitwise what dequantize(..., out_f16 = true) writes. Jobs of one launch share the
// grid (tiles of 8192 elements, taken in turn by persistent CTAs, as many as are resident on
// the device), so a model's few hundred matrices take ceil(jobs / 96) launches. A job whose
// blocks are not 16-byte aligned (never the case for a pf_weight, whose blocks are a cudaMalloc
// of their own) or whose block-type output is not 16-byte aligned runs through dequantize()
// instead: same bytes, slower.
// UNSUPPORTED for an unknown qtype (nothing launched). Asynchronous on `stream`.
// one_tile: a CTA per tile instead of persistent CTAs (work on a low-priority stream beside
// another's kernels: short CTAs leave the SMs to the higher priority as they end).
pf_status prewarm_dequantize(const std::vector<prewarm_job> &jobs, cudaStream_t stream, bool one_tile = false);

// Loads the prewarm kernel on the current device now. CUDA loads kernels lazily, at their first
// launch (CUDA_MODULE_LOADING=LAZY, the default since 12.2): context creation calls this so
// that a model's prewarm time is the work alone. Failures are left to the first launch.
void prewarm_kernel_load();

}  // namespace pf
