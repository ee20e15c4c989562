// dequant.cu — dequantization of GGUF blocks to fp32 / fp16 and the embedding gather.
//
// One thread per output element over a grid-stride loop in int64 (n * k reaches 2^31 for the
// 248k-token embedding): writes are fully coalesced, and the block headers (scales) that
// neighbouring threads re-read come from L1. Exact per quant.cuh; speed later without
// changing the entry points (e.g. one warp per block with vector stores).
#include <algorithm>

#include "context.h"
#include "cuda_check.cuh"
#include "dequant.cuh"
#include "quant.cuh"

namespace pf {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 16;  // grid-stride beyond this: plenty for any SM count

struct dequant_args {
    const uint8_t *blocks;  // [rows_src][row_bytes]
    int64_t row_bytes;      // bytes of one source row
    int64_t rows;           // output rows
    int64_t k;              // elements per row
    const int32_t *ids;     // gather: source row of output row r; nullptr = identity
    int64_t n_src;          // source rows (clamp bound for ids)
    void *out;              // [rows][ldo], float or __half
    int64_t ldo;            // output row stride in elements
};

template <int Q, bool kF16>
__global__ void dequant_kernel(const __grid_constant__ dequant_args a) {
    const int64_t total = a.rows * a.k;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = e / a.k, col = e - r * a.k;
        int64_t src = r;
        if (a.ids) {
            src = a.ids[r];
            src = src < 0 ? 0 : (src >= a.n_src ? a.n_src - 1 : src);  // memory safety only
        }
        const float v = decode_at<Q>(a.blocks + src * a.row_bytes, col);
        if (kF16)
            static_cast<__half *>(a.out)[r * a.ldo + col] = __float2half_rn(v);  // RNE, as numpy
        else
            static_cast<float *>(a.out)[r * a.ldo + col] = v;
    }
}

pf_status launch(int32_t qtype, const dequant_args &a, bool out_f16, cudaStream_t stream,
                 const char *what) {
    if (a.rows <= 0 || a.k <= 0) return PF_STATUS_OK;
    const int64_t total = a.rows * a.k;
    const int grid = int(std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks));
    const bool ok = dispatch_qtype(qtype, [&](auto tag) {
        constexpr int Q = decltype(tag)::value;
        if (out_f16)
            dequant_kernel<Q, true><<<grid, kThreads, 0, stream>>>(a);
        else
            dequant_kernel<Q, false><<<grid, kThreads, 0, stream>>>(a);
    });
    if (!ok) return fail(PF_STATUS_UNSUPPORTED, "%s: GGML type %d is not supported", what, int(qtype));
    PF_LAUNCH_CHECK(what);
    return PF_STATUS_OK;
}

pf_status row_bytes_of(int32_t qtype, int64_t k, int64_t *out, const char *what) {
    int64_t be = 0, bb = 0;
    if (!qtype_block(qtype, &be, &bb))
        return fail(PF_STATUS_UNSUPPORTED, "%s: GGML type %d is not supported", what, int(qtype));
    PF_CHECK_ARG(k % be == 0, "%s: k=%lld is not a multiple of the %s block size %lld", what,
                 (long long)k, pf_qtype_name(qtype), (long long)be);
    *out = k / be * bb;
    return PF_STATUS_OK;
}

}  // namespace

pf_status dequantize(const void *blocks, int32_t qtype, int64_t n, int64_t k, void *out,
                     bool out_f16, cudaStream_t stream) {
    int64_t rb = 0;
    PF_TRY(row_bytes_of(qtype, k, &rb, "dequantize"));
    dequant_args a{static_cast<const uint8_t *>(blocks), rb, n, k, nullptr, n, out, k};
    return launch(qtype, a, out_f16, stream, "dequantize");
}

pf_status embed_rows(const void *blocks, int32_t qtype, int64_t n_vocab, int64_t k,
                     const int32_t *ids, int64_t rows, float *out, int64_t ldo,
                     cudaStream_t stream) {
    int64_t rb = 0;
    PF_TRY(row_bytes_of(qtype, k, &rb, "embed_rows"));
    PF_CHECK_ARG(ldo >= k, "embed_rows: ldo=%lld < k=%lld", (long long)ldo, (long long)k);
    PF_CHECK_ARG(n_vocab > 0, "embed_rows: n_vocab=%lld must be positive", (long long)n_vocab);
    dequant_args a{static_cast<const uint8_t *>(blocks), rb, rows, k, ids, n_vocab, out, ldo};
    return launch(qtype, a, false, stream, "embed_rows");
}

}  // namespace pf
