// defaults.h — the defaults of the options, one constant each (the C API's option structs say
// "0 = default" or their _init sets them; pyprefill/_defaults.py mirrors the first two).
// Names: a step's rows are "step rows" (pf_session_options.chunk_tokens, pf_batch_options.step_tokens
// in the API: rows of all its items that one pass through the layers runs); a sequence's
// positions are its "capacity" (pf_session_options.max_tokens, pf_batch_options.max_context).
// "Chunk" is kept for the delta rule's 64-row chunks.
#pragma once

#include <cstdint>

namespace pf {

// A session's capacity (pf_session_options_init) and the largest capacity a batch serves
// (pf_batch_options.max_context = 0).
constexpr int32_t kDefaultCapacity = 4096;
// Rows per step: a batch's step_tokens = 0, and the auto step of a session (chunk_tokens = 0;
// measured ~20% faster than 512 for qwen35-4b on the H200), which auto_step_rows may halve.
constexpr int32_t kDefaultStepRows = 2048;
// The auto step of a session whose plan reads a layer matrix from its GGUF blocks (no fp16 cache,
// tuning gemm_blocks): each such matrix's per-call slab is dequantized once per step, so longer
// steps amortize it (qwen35-4b Q4_K_M on the blocks, pp8192, H200, session 45: 57.6k / 60.2k /
// 63.6k tok/s at steps of 2048 / 4096 / 8192; the cache 62.4k / 63.7k / 64.6k).
constexpr int32_t kBlocksStepRows = 8192;
// The blocks leg's slab ring (tuning gemm_blocks_ring): buffers by default (0: off) and at most.
constexpr int32_t kBlocksRingDefault = 0;
constexpr int32_t kBlocksRingMax = 8;
// The prewarm's cache rule (tuning prewarm_cache_rows / _margin): a matrix the f16 leg can read
// from its blocks is cached where the cached GEMM measured more than 3% faster at a session's
// default step (the issue "Weights at their GGUF size": the rule the prewarm follows).
constexpr int32_t kPrewarmCacheMargin = 3;        // percent
constexpr int32_t kPrewarmCacheMaxRows = 65536;
constexpr int32_t kPrewarmCacheMaxMargin = 100000;
// Units under this many fp16 bytes are cached without a measurement: launch latency, not the
// work, sets their times (a tiny model's every matrix), and their bytes are small.
constexpr size_t kPrewarmRuleMinBytes = size_t(4) << 20;
// A batch's max_tokens = 0: the token ids of this many full steps per call.
constexpr int32_t kDefaultBatchSteps = 8;
// The blocks leg (tuning gemm_blocks): from this many rows of a call on, a matrix's blocks are
// dequantized into an fp16 slab per call and the cache's GEMM runs on it; below, the GEMM on the
// blocks runs its few-rows form (up to 64 rows). Measured on the H200 (NOTES.md, session 40: the
// kernel suite at 128-8192 rows, qwen35-4b shapes): the slabs beat the GEMM on the blocks at
// every shape and type from 128 rows but attn_qkv Q4_K at 512 (0.0554 against 0.0506 ms), and
// the 256-row tiles that 65-127 rows would take run as slowly as at 128. tuning.gemm_blocks_slab_rows
// overrides.
constexpr int64_t kBlocksSlabRows = 65;
// The blocks leg: calls of up to this many rows on Q4_K / Q5_K / Q6_K blocks run the GEMV form
// (kernels/gemm/gemm_q16_gemv_kernel.cuh: the scales on the fp32 sums). Measured on the H200
// (NOTES.md, session 41: bench_gemm_q16, qwen35-4b and 27B shapes): at one row 1.47-2.09x the
// cache's GEMM where the few-rows form ran 1.05-1.51x; at 8 rows 0.86-1.13x the few-rows form's
// speed (the LM head slower, the 4B's projections faster); at 16 rows 0.72-0.79x the cache where
// the few-rows form ran 0.99-1.03x. tuning.gemm_blocks_gemv_rows overrides.
constexpr int64_t kBlocksGemvRows = 8;
// The most rows the GEMV form takes (its two token tiles; gemm_q16.cuh kQ16GemvMaxRows, checked
// equal there): tuning.gemm_blocks_gemv_rows's upper bound.
constexpr int32_t kBlocksGemvMaxRows = 16;

}  // namespace pf
