// dequant.cu — dequantization of GGUF blocks to fp32 / fp16 and the embedding gather.
//
// Block types: one thread per 8 consecutive elements (they share one block header, read once)
// with 16-byte vector stores where the output is aligned; element types (F32/F16/BF16, any k):
// one thread per element. Grid-stride loops in int64 (n * k reaches 2^31 for the 248k-token
// embedding). Exact per quant.cuh.
#include <algorithm>
#include <cstdint>

#include "base/context.h"
#include "kernels/dequant/dequant.cuh"
#include "kernels/dequant/quant.cuh"
#include "plan/qtype.h"
#include "ptx/common.cuh"

namespace pf {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 16;  // grid-stride beyond this: plenty for any SM count

struct DequantArgs {
    const uint8_t *blocks;  // [rows_src][row_bytes]
    int64_t row_bytes;      // bytes of one source row
    int64_t rows;           // output rows
    int64_t k;              // elements per row
    const int32_t *ids;     // gather: source row of output row r; nullptr = identity
    const int64_t *ids_off_dev;  // when set, the gather reads ids + *ids_off_dev (CUDA graphs)
    int64_t n_src;          // source rows (clamp bound for ids)
    void *out;              // [rows][ldo], float or __half
    int64_t ldo;            // output row stride in elements
};

// G = elements per thread (8 for block types, 1 for element types); kVec: 16-byte stores
// (the output row start and ldo keep every group 16-byte aligned).
template <int Q, bool kF16, int G, bool kVec>
__global__ void dequant_kernel(const __grid_constant__ DequantArgs a) {
    const int64_t kg = a.k / G;  // groups per row
    const int64_t total = a.rows * kg;
    const int32_t *ids = a.ids && a.ids_off_dev ? a.ids + *a.ids_off_dev : a.ids;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < total;
         g += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = g / kg, c0 = (g - r * kg) * G;
        int64_t src = r;
        if (ids) {
            src = ids[r];
            src = src < 0 ? 0 : (src >= a.n_src ? a.n_src - 1 : src);  // memory safety only
        }
        const uint8_t *rp = a.blocks + src * a.row_bytes;
        float v[G];
        if constexpr (G == 8)
            decode8_at<Q>(rp, c0, v);
        else
            v[0] = decode_at<Q>(rp, c0);
        const int64_t o = r * a.ldo + c0;
        if constexpr (kF16) {
            __half *out = static_cast<__half *>(a.out) + o;
            if constexpr (kVec && G == 8) {
                __align__(16) __half h[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) h[e] = __float2half_rn(v[e]);  // RNE, as numpy
                *reinterpret_cast<uint4 *>(out) = *reinterpret_cast<const uint4 *>(h);
            } else {
#pragma unroll
                for (int e = 0; e < G; ++e) out[e] = __float2half_rn(v[e]);
            }
        } else {
            float *out = static_cast<float *>(a.out) + o;
            if constexpr (kVec && G == 8) {
                reinterpret_cast<float4 *>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
                reinterpret_cast<float4 *>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
            } else {
#pragma unroll
                for (int e = 0; e < G; ++e) out[e] = v[e];
            }
        }
    }
}

template <int Q, bool kF16>
void launch_type(const DequantArgs &a, cudaStream_t stream) {
    constexpr int G = qtraits<Q>::kElems == 1 ? 1 : 8;
    const int64_t groups = a.rows * (a.k / G);
    const int grid = int(std::min<int64_t>((groups + kThreads - 1) / kThreads, kMaxBlocks));
    // 16-byte stores need every group start 16-byte aligned: the base and the row stride.
    const size_t esz = kF16 ? sizeof(__half) : sizeof(float);
    const bool vec = G == 8 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0 &&
                     (size_t(a.ldo) * esz) % 16 == 0;
    if (vec)
        dequant_kernel<Q, kF16, G, true><<<grid, kThreads, 0, stream>>>(a);
    else
        dequant_kernel<Q, kF16, G, false><<<grid, kThreads, 0, stream>>>(a);
}

pf_status launch(int32_t qtype, const DequantArgs &a, bool out_f16, cudaStream_t stream,
                 const char *what) {
    if (a.rows <= 0 || a.k <= 0) return PF_STATUS_OK;
    const bool ok = dispatch_qtype(qtype, [&](auto tag) {
        constexpr int Q = decltype(tag)::value;
        if (out_f16)
            launch_type<Q, true>(a, stream);
        else
            launch_type<Q, false>(a, stream);
    });
    if (!ok) return fail(PF_STATUS_UNSUPPORTED, "%s: GGML type %d is not supported", what, int(qtype));
    PF_LAUNCH_CHECK("dequant_kernel<%s, %s> (%s)", pf_qtype_name(qtype), out_f16 ? "fp16" : "fp32",
                    what);
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
    DequantArgs a{static_cast<const uint8_t *>(blocks), rb, n, k, nullptr, nullptr, n, out, k};
    return launch(qtype, a, out_f16, stream, "dequantize");
}

pf_status embed_rows(const QMatrix &table, const int32_t *ids, int64_t rows, MatF om, cudaStream_t stream) {
    const void *blocks = table.blocks;
    const int32_t qtype = table.qtype;
    const int64_t n_vocab = table.n, k = table.k, ldo = om.ld;
    float *out = om.ptr;
    int64_t rb = 0;
    PF_TRY(row_bytes_of(qtype, k, &rb, "embed_rows"));
    PF_CHECK_ARG(ldo >= k, "embed_rows: ldo=%lld < k=%lld", (long long)ldo, (long long)k);
    PF_CHECK_ARG(n_vocab > 0, "embed_rows: n_vocab=%lld must be positive", (long long)n_vocab);
    DequantArgs a{static_cast<const uint8_t *>(blocks), rb, rows, k, ids, nullptr, n_vocab, out, ldo};
    return launch(qtype, a, false, stream, "embed_rows");
}

pf_status embed_rows_at(const QMatrix &table, const int32_t *ids, const int64_t *ids_off_dev, int64_t rows,
                        MatF om, cudaStream_t stream) {
    const void *blocks = table.blocks;
    const int32_t qtype = table.qtype;
    const int64_t n_vocab = table.n, k = table.k, ldo = om.ld;
    float *out = om.ptr;
    int64_t rb = 0;
    PF_TRY(row_bytes_of(qtype, k, &rb, "embed_rows_at"));
    PF_CHECK_ARG(ldo >= k, "embed_rows_at: ldo=%lld < k=%lld", (long long)ldo, (long long)k);
    PF_CHECK_ARG(n_vocab > 0, "embed_rows_at: n_vocab=%lld must be positive", (long long)n_vocab);
    PF_CHECK_ARG(ids != nullptr && ids_off_dev != nullptr, "embed_rows_at: ids=%p ids_off_dev=%p",
                 (const void *)ids, (const void *)ids_off_dev);
    DequantArgs a{static_cast<const uint8_t *>(blocks), rb, rows, k, ids, ids_off_dev, n_vocab, out, ldo};
    return launch(qtype, a, false, stream, "embed_rows_at");
}

}  // namespace pf
