// slab_ring.cuh — the blocks leg's per-call fp16 slabs dequantized ahead of their GEMMs, on a
// stream of their own (tuning gemm_blocks_ring). Internal (namespace pf).
//
// Why: from gemm_blocks_slab_rows rows on, a matrix the f16 leg reads from its GGUF blocks is
// dequantized into an fp16 slab before each GEMM (project_slabs), in line: the step waits for it.
// The dequantization reads the blocks and writes 2 bytes a weight (memory-bound), the GEMM is
// tensor-bound, and between the GEMMs run kernels that leave SMs idle (the delta rule's state
// chain: one block per head; attention's few tiles at short lengths; every kernel's tail). Here a
// step's slab GEMMs are known in order (the layer loop's, listed at executor creation) and each
// slab is dequantized into one of `depth` buffers as soon as the GEMM `depth` places before it has
// read that buffer, on a stream of the lowest priority (the device's default, as the context's
// stream), so that the dequantization runs in those gaps and the GEMM finds its slab ready. The values and the
// GEMMs are the same (the prewarm's kernel, the cache's GEMM on the same bits): the logits are
// bitwise those of the slabs in line.
//
// Measured (session 45, H200, qwen35-4b Q4_K_M without caches, `pyprefill bench FILE -p 512 2048
// --chunk 0 --gemm auto/blocks auto/blocks/ring`): slower, 40.5k / 59.0k tok/s against 42.9k /
// 60.6k in line (one-tile CTAs; with persistent ones 40.7k / 53.4k), measured with the context's
// stream at the highest priority (since put back to the default: see api_core.cu): the
// dequantization takes SMs and DRAM bandwidth from the step's own kernels rather than idle ones. Hence off by default; kept
// behind the flag (with its bitwise test) for the forms that would partition the SMs instead
// (cuBLASLt's SM count target for the GEMMs, a few SMs dequantizing with deep TMA pipelines).
//
// One step (executor): slab_ring_begin (fork, the first `depth` slabs), then for each slab GEMM
// slab_ring_take (the slab, ready on the context's stream) and slab_ring_done (its buffer free
// once the GEMM has run; the slab `depth` ahead issued), then slab_ring_end (join). A slab call
// that is not the next listed one turns the ring off for the rest of the step (joined; the calls
// run in line): correct whatever the list says. A step graph captures the fork, the events'
// dependencies and the join (the whole step must be one capture: the executor runs the ring only
// for steps whose attention is inside the graph, or eager steps).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "base/context.h"
#include "prefill.h"

namespace pf {

struct SlabRing {
    struct Job {
        std::vector<const pf_weight *> parts;  // the slab's matrices side by side (one: a matrix)
        int64_t n = 0, k = 0;
    };
    std::vector<Job> jobs;  // a step's slab GEMMs in order
    int32_t depth = 0;      // buffers (0: no ring)
    size_t slot_bytes = 0;  // each buffer's bytes (the largest job's fp16)
    void *bufs = nullptr;   // depth * slot_bytes
    cudaStream_t side = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    std::vector<cudaEvent_t> ready, used;  // per buffer: its slab written (side), read (context)
    uint64_t weight_forms = 0;             // ctx->weight_forms the jobs were listed under
    // The step in flight.
    bool on = false;
    size_t next = 0;  // the job the next slab call takes
};

// Allocates the ring's buffers (depth of slot_bytes), its stream and events; r->jobs already
// listed (slot_bytes the largest). OUT_OF_MEMORY leaves the ring off (depth 0, nothing held).
pf_status slab_ring_alloc(pf_context *ctx, SlabRing *r, int32_t depth);
// Frees what slab_ring_alloc made (after the context's stream drains).
void slab_ring_free(pf_context *ctx, SlabRing *r);

// A step begins: the ring runs it when `run` (the step's rows reach the slab rows and the step is
// one capture or eager): fork, the first `depth` slabs issued.
pf_status slab_ring_begin(pf_context *ctx, SlabRing *r, bool run);
// For the slab call of w (F16Blocks at the slab rows, its whole fp16 one slab: slab_whole): the
// slab's fp16 ready on the context's stream in *out, or nullptr (not the ring's: dequantize in line).
pf_status slab_ring_take(pf_context *ctx, SlabRing *r, const pf_weight *w, const __half **out);
// After the GEMM that read the slab slab_ring_take gave: its buffer free, the slab `depth` ahead issued.
pf_status slab_ring_done(pf_context *ctx, SlabRing *r);
// The step's end (or a break in it): the context's stream waits for the ring's stream; off.
pf_status slab_ring_end(pf_context *ctx, SlabRing *r);

}  // namespace pf
