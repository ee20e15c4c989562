// gemm_q16.cu — the launch of the f16 leg's GEMM on the GGUF blocks (gemm_q16.cuh).
#include "kernels/gemm/gemm_q16.cuh"

#include <climits>

#include "kernels/dequant/quant.cuh"
#include "kernels/gemm/gemm_q16_kernel.cuh"
#include "plan/qtype.h"
#include "ptx/common.cuh"

namespace pf {
namespace {

template <int Q>
pf_status launch(const Q16Gemm &g, cudaStream_t st) {
    using G = q16::RawGeom<Q>;
    CUtensorMap tm_x;
    const CUresult r = hopper::encode_fp16_sw128(&tm_x, g.x16, g.k, g.rows, q16::kBM);
    if (r != CUDA_SUCCESS)
        return fail(PF_STATUS_CUDA_ERROR, "gemm_q16: cuTensorMapEncodeTiled(rows=%lld, k=%lld) failed: %d",
                    (long long)g.rows, (long long)g.k, int(r));
    q16::Q16Args a{};
    a.w = static_cast<const uint8_t *>(g.blocks);
    a.row_bytes = g.k / G::kElems * G::kBlock;
    a.y = g.y.ptr;
    a.ldy = g.y.ld;
    a.inv = g.inv;
    a.rows = int32_t(g.rows);
    a.n = int32_t(g.n);
    a.k = int32_t(g.k);
    a.m_tiles = int32_t(ceil_div(g.rows, q16::kBM));
    a.n_tiles = int32_t(ceil_div(g.n, q16::kBN));
    a.accumulate = g.accumulate ? 1 : 0;
    // 16-byte copies of the raw blocks where every row's segment of every superstep starts and
    // ends on 16 bytes (the last superstep of k % 256 != 0 holds fewer blocks).
    const int64_t tail = (g.k % q16::kRawCols) / G::kElems * G::kBlock;
    a.copy16 = reinterpret_cast<uintptr_t>(g.blocks) % 16 == 0 && a.row_bytes % 16 == 0 && G::kBytes % 16 == 0 &&
               tail % 16 == 0;
    if (!a.copy16 && (Q == PF_QTYPE_Q4_K || Q == PF_QTYPE_Q5_K))  // their decoders read 8-byte aligned
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: %s blocks not 16-byte aligned", pf_qtype_name(Q));
    a.y_vec2 = reinterpret_cast<uintptr_t>(g.y.ptr) % 8 == 0 && g.y.ld % 2 == 0;
    const auto kernel = q16::gemm_q16_kernel<Q>;
    PF_TRY(set_max_dynamic_smem(kernel, int(q16::smem_bytes<Q>()), "gemm_q16_kernel"));
    const int64_t blocks = int64_t(a.m_tiles) * a.n_tiles;
    if (blocks > kMaxGridX)
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: %d x %d tiles exceed one grid", a.m_tiles, a.n_tiles);
    kernel<<<unsigned(blocks), q16::kThreads, q16::smem_bytes<Q>(), st>>>(a, tm_x);
    PF_LAUNCH_CHECK("gemm_q16_kernel<%s> (%lld x %lld x %lld)", pf_qtype_name(Q), (long long)g.rows,
                    (long long)g.n, (long long)g.k);
    return PF_STATUS_OK;
}

}  // namespace

bool gemm_q16_type(int32_t qtype) { return qtype_is_block(qtype); }

bool gemm_q16_available(int device) { return sm90a_kernels_available(device); }

pf_status gemm_q16(const Q16Gemm &g, cudaStream_t st) {
    if (!gemm_q16_type(g.qtype))
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: type %s is not a GGUF block type", pf_qtype_name(g.qtype));
    if (!gemm_q16_available(current_device()))
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: the f16 leg's GEMM on the blocks needs an sm_90a build on "
                                           "a compute capability 9.0 device (Hopper) with the driver's TMA encoder");
    int64_t be = 1, bb = 1;
    qtype_block(g.qtype, &be, &bb);
    PF_CHECK_ARG(g.rows >= 0 && g.n >= 0 && g.k > 0 && g.rows <= INT_MAX && g.n <= INT_MAX && g.k <= INT_MAX &&
                     g.k % be == 0 && g.y.ld >= g.n,
                 "gemm_q16: rows=%lld n=%lld k=%lld y.ld=%lld (k a whole number of %lld-element blocks, sizes "
                 "below 2^31, y.ld >= n)", (long long)g.rows, (long long)g.n, (long long)g.k, (long long)g.y.ld,
                 (long long)be);
    PF_CHECK_ARG(reinterpret_cast<uintptr_t>(g.x16) % 16 == 0 && g.k % 8 == 0,
                 "gemm_q16: the fp16 rows must start 16-byte aligned with k %% 8 == 0 (TMA)");
    if (g.rows == 0 || g.n == 0) return PF_STATUS_OK;
    pf_status s = PF_STATUS_OK;
    dispatch_qtype(g.qtype, [&](auto tag) {
        constexpr int Q = decltype(tag)::value;
        if constexpr (Q == PF_QTYPE_F32 || Q == PF_QTYPE_F16 || Q == PF_QTYPE_BF16) s = PF_STATUS_INTERNAL;
        else s = launch<Q>(g, st);
    });
    return s;
}

}  // namespace pf
