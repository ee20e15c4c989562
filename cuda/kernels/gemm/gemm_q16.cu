// gemm_q16.cu — the launch of the f16 leg's GEMM on the GGUF blocks (gemm_q16.cuh).
#include "kernels/gemm/gemm_q16.cuh"

#include <climits>

#include "kernels/dequant/quant.cuh"
#include "kernels/gemm/gemm_q16_gemv_kernel.cuh"
#include "kernels/gemm/gemm_q16_kernel.cuh"
#include "kernels/gemm/gemm_q16_skinny_kernel.cuh"
#include "plan/defaults.h"
#include "plan/qtype.h"
#include "ptx/common.cuh"

namespace pf {
namespace {

// Few rows (<= q16s::kMaxRows) of blocks that start 16-byte aligned: the skinny form, bound by
// reading the blocks (gemm_q16_skinny_kernel.cuh), MT tiles of 8 rows of X, split K over clusters
// (pick_split).
template <int Q, int MT>
pf_status launch_skinny(const Q16Gemm &g, cudaStream_t st) {
    const q16::Q16Args a = q16s::make_args<Q>(g.blocks, g.n, g.k, g.inv, g.rows, g.y.ptr, g.y.ld, g.accumulate);
    PF_TRY(set_max_dynamic_smem(q16s::gemm_q16_skinny_kernel<Q, MT>, int(q16s::smem_bytes<Q, MT>()),
                                "gemm_q16_skinny_kernel"));
    int sms = 0;
    PF_TRY(device_sm_count(&sms));
    const int split = q16s::pick_split(a, sms);
    if (int64_t(a.n_tiles) * split > kMaxGridX)
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: %d weight tiles exceed one grid", a.n_tiles);
    const cudaError_t e = q16s::launch<Q, MT>(a, g.x16, split, st);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gemm_q16_skinny_kernel<%s, %d> (%lld x %lld x %lld, split %d)",
                           pf_qtype_name(Q), MT, (long long)g.rows, (long long)g.n, (long long)g.k, split);
    return PF_STATUS_OK;
}

// Up to g.gemv_rows rows of Q4_K / Q5_K / Q6_K: the GEMV form (gemm_q16_gemv_kernel.cuh), NT tiles of
// 8 rows of X, K sliced over a block's warps (pick_kslices).
static_assert(q16v::kMaxRows == kQ16GemvMaxRows && q16v::kMaxParts == kQ16GemvMaxParts &&
                  kQ16GemvMaxRows == kBlocksGemvMaxRows,
              "the GEMV form's limits: the kernel's, gemm_q16.cuh's and the tuning check's");

template <int Q, int NT>
pf_status launch_gemv(const Q16Gemm &g, cudaStream_t st) {
    int sms = 0;
    PF_TRY(device_sm_count(&sms));
    q16v::GemvArgs a{};
    a.nparts = g.nparts > 0 ? g.nparts : 1;
    for (int i = 0; i < a.nparts; ++i) {
        a.part[i].w = static_cast<const uint8_t *>(g.nparts > 0 ? g.part_blocks[i] : g.blocks);
        a.part[i].n = int32_t(g.nparts > 0 ? g.part_n[i] : g.n);
        a.part[i].col = i == 0 ? 0 : a.part[i - 1].col + a.part[i - 1].n;
    }
    q16v::gemv_layout(a);
    a.row_bytes = g.k / 256 * int64_t(qtraits<Q>::kBytes);
    a.x = g.x16;
    a.y = g.y.ptr;
    a.ldy = g.y.ld;
    a.inv = g.inv;
    a.rows = int32_t(g.rows);
    a.k = int32_t(g.k);
    a.kslices = q16v::pick_kslices(g.n, g.k, sms);
    a.accumulate = g.accumulate ? 1 : 0;
    const cudaError_t e = q16v::launch<Q, NT>(a, st);
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__,
                           "gemm_q16_gemv_kernel<%s, %d> (%lld x %lld x %lld, %d parts, %d K slices)", pf_qtype_name(Q),
                           NT, (long long)g.rows, (long long)g.n, (long long)g.k, a.nparts, a.kslices);
    return PF_STATUS_OK;
}

template <int Q>
pf_status launch(const Q16Gemm &g, cudaStream_t st) {
    if constexpr (q16v::gemv_type(Q)) {
        bool runs = gemm_q16_gemv_runs(Q, g.blocks, g.k, g.rows, g.gemv_rows);
        for (int i = 0; i < g.nparts; ++i)
            runs = runs && gemm_q16_gemv_runs(Q, g.part_blocks[i], g.k, g.rows, g.gemv_rows);
        if (runs) return g.rows <= 8 ? launch_gemv<Q, 1>(g, st) : launch_gemv<Q, 2>(g, st);
    }
    if (g.nparts > 0)
        return fail(PF_STATUS_INTERNAL, "gemm_q16: %d parts of %s at %lld rows, which the GEMV form does not run",
                    int(g.nparts), pf_qtype_name(Q), (long long)g.rows);
    // Few rows: 8, 16, 32 or 64 rows of X a block (rows 33-64 in one form: at most 3 of 8 tiles of
    // zeros); blocks off a 16-byte boundary (its chunk copies' premise) take the 256-row tiles.
    if (reinterpret_cast<uintptr_t>(g.blocks) % 16 == 0) {
        if (g.rows <= 8) return launch_skinny<Q, 1>(g, st);
        if (g.rows <= 16) return launch_skinny<Q, 2>(g, st);
        if (g.rows <= 32) return launch_skinny<Q, 4>(g, st);
        if (g.rows <= q16s::kMaxRows) return launch_skinny<Q, 8>(g, st);
    }
    CUtensorMap tm_x;
    const CUresult r = hopper::encode_fp16_sw128(&tm_x, g.x16, g.k, g.rows, q16::kBM);
    if (r != CUDA_SUCCESS)
        return fail(PF_STATUS_CUDA_ERROR, "gemm_q16: cuTensorMapEncodeTiled(rows=%lld, k=%lld) failed: %d",
                    (long long)g.rows, (long long)g.k, int(r));
    const q16::Q16Args a = q16::make_args<Q>(g.blocks, g.n, g.k, g.inv, g.rows, g.y.ptr, g.y.ld, g.accumulate);
    if (!a.copy16 && (Q == PF_QTYPE_Q4_K || Q == PF_QTYPE_Q5_K))  // their decoders read 8-byte aligned
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: %s blocks not 16-byte aligned", pf_qtype_name(Q));
    // Pairs of blocks sharing the decoded weight tile (gemm_q16_kernel.cuh, CM = 2) where they
    // measured faster: Q6_K, whose decoding is the heaviest (bench_gemm_q16 on the H200, session
    // 38: 1.19x / 1.18x the single blocks at 2048 / 8192 rows, 2560 x 9216); Q4_K's pairs ran
    // 0.70-0.73x of its single blocks (those read their raw blocks by TMA and decode 32-column
    // runs), the other types' were not timed.
    const int cm = Q == PF_QTYPE_Q6_K && a.m_tiles >= 2 ? 2 : 1;
    if (q16::grid_blocks<2>(a) > kMaxGridX)
        return fail(PF_STATUS_UNSUPPORTED, "gemm_q16: %d x %d tiles exceed one grid", a.m_tiles, a.n_tiles);
    cudaError_t e = cudaSuccess;
    if constexpr (Q == PF_QTYPE_Q6_K) {
        if (cm == 2) {
            PF_TRY(set_max_dynamic_smem(q16::gemm_q16_kernel<Q, 2>, int(q16::smem_bytes<Q, 2>()), "gemm_q16_kernel"));
            e = q16::launch<Q, 2>(a, tm_x, st);
        }
    }
    if (cm == 1) {
        PF_TRY(set_max_dynamic_smem(q16::gemm_q16_kernel<Q, 1>, int(q16::smem_bytes<Q, 1>()), "gemm_q16_kernel"));
        e = q16::launch<Q, 1>(a, tm_x, st);
    }
    if (e != cudaSuccess)
        return launch_fail(e, __FILE__, __LINE__, "gemm_q16_kernel<%s, %d> (%lld x %lld x %lld)", pf_qtype_name(Q),
                           cm, (long long)g.rows, (long long)g.n, (long long)g.k);
    return PF_STATUS_OK;
}

}  // namespace

bool gemm_q16_type(int32_t qtype) { return qtype_is_block(qtype); }

bool gemm_q16_gemv_runs(int32_t qtype, const void *blocks, int64_t k, int64_t rows, int64_t gemv_rows) {
    if (!q16v::gemv_type(qtype) || rows < 1 || rows > gemv_rows || rows > q16v::kMaxRows || k % 256 != 0) return false;
    int64_t be = 1, bb = 1;
    qtype_block(qtype, &be, &bb);
    return q16v::gemv_aligned(qtype, blocks, k / be * bb);
}

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
    PF_CHECK_ARG(g.nparts == 0 || (g.nparts >= 2 && g.nparts <= q16v::kMaxParts),
                 "gemm_q16: %d parts (2..%d)", int(g.nparts), q16v::kMaxParts);
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
