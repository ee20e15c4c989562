// dequant.cuh — GGUF blocks -> fp32 / fp16 (dequantization) and the token-embedding gather.
// Internal host entry points (namespace pf); the C API lives in api_gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/mat.h"
#include "prefill.h"

namespace pf {

// Dequantizes an [n][k] matrix of GGUF blocks (type `qtype`, k contiguous, rows of
// k / block_elems blocks) into `out`, row-major [n][k] contiguous: float32 when !out_f16,
// fp16 (round to nearest even of the exact fp32 value) when out_f16. Every supported type
// decodes exactly in fp32 (see quant.cuh), so fp32 output equals gguf.quants.dequantize.
// n * k may exceed 2^31. UNSUPPORTED for an unknown qtype; k must be a multiple of the block
// size (checked by the caller). n == 0 or k == 0 is a no-op. Asynchronous on `stream`.
pf_status dequantize(const void *blocks, int32_t qtype, int64_t n, int64_t k, void *out,
                     bool out_f16, cudaStream_t stream);

// Embedding gather: out.row(r)[j] = W[ids[r]][j] (fp32), for r < rows, j < k, where W = table, an
// [n_vocab][k] matrix of GGUF blocks (e.g. token_embd). `ids` is a DEVICE array of `rows` int32
// token ids, already validated against n_vocab by the caller (an id outside [0, n_vocab) is
// clamped to keep memory safe, never read out of bounds). out.ld >= k; columns [k, ld) of `out`
// are not touched. rows == 0 is a no-op.
pf_status embed_rows(const QMatrix &table, const int32_t *ids, int64_t rows, MatF out, cudaStream_t stream);
// embed_rows with the ids at ids + *ids_off_dev, the offset read from device memory when the
// kernel runs (a launch that a CUDA graph can replay for any chunk of a call); the caller keeps
// the rows within ids.
pf_status embed_rows_at(const QMatrix &table, const int32_t *ids, const int64_t *ids_off_dev, int64_t rows,
                        MatF out, cudaStream_t stream);

}  // namespace pf
