// gemm_lt.cuh — the f16 leg's GEMM (fp16 W [n][k] x fp16 X [rows][k] -> fp32 Y [rows][ldy],
// fp32 compute) and its per-shape algorithm: cublasGemmEx (CUBLAS_GEMM_DEFAULT), or a cuBLASLt
// algorithm that beat it when timed at session creation.
//
// Why: cuBLAS's default pick is not the fastest on every shape of the 4B models (device run 23,
// H200: the fused gate|up GEMM of qwen3-4b at 2048 rows 0.337 ms with GemmEx, 0.293 ms with the
// best of cuBLASLt's heuristic list; Lt's first heuristic alone is no better than GemmEx), so the
// choice is measured.
//
// Determinism. The choice of a shape (device, n, rows, k, ldy, beta != 0) is made once per
// process by the first session that needs it and never changes; every later session of the
// process (other models of the same shapes included) runs the same algorithm, so logits stay
// bitwise equal between sessions and between models in one process, and graphs stay bitwise
// eager. Two processes may choose differently (the timing is noisy): between processes the f16
// leg's logits agree within its tolerance, not bitwise. The f32 leg never comes here.
#pragma once

#include <cublasLt.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "base/context.h"
#include "base/mat.h"
#include "plan/plan.h"  // GemmLtMode

namespace pf {

// One f16-leg GEMM shape: Y[rows][ldy] = beta * Y + X[rows][k] . W[n][k]^T, beta 0 or 1.
struct GemmShape {
    int64_t n = 0, rows = 0, k = 0, ldy = 0;
    bool accumulate = false;  // beta = 1 (the residual add)
};

// A shape whose process choice is a cuBLASLt algorithm, with the descriptors that run it.
struct LtGemm {
    GemmShape shape;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace_bytes = 0;  // what the algorithm needs of ctx->workspace
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
};

// A chunk executor's GEMM plan: the shapes that run a cuBLASLt algorithm; every other call runs
// GemmEx. Owned by the executor and passed to each projection it runs (ProjEnv::plan);
// kernel-level calls (pf_project) pass none and always run GemmEx.
class GemmPlan {
  public:
    GemmPlan() = default;
    ~GemmPlan();
    GemmPlan(const GemmPlan &) = delete;
    GemmPlan &operator=(const GemmPlan &) = delete;
    // The entry for this call, or nullptr (GemmEx).
    const LtGemm *find(int64_t n, int64_t rows, int64_t k, int64_t ldy, bool accumulate) const;
    size_t size() const { return lt_.size(); }
    std::vector<LtGemm> lt_;
};

// One shape to choose for, with the session's real buffers to time it on: w the fp16 weight
// (or fused block) [n][k] the prefill will read.
struct GemmTuneJob {
    GemmShape shape;
    const __half *w = nullptr;
};

// The mode (plan.h GemmLtMode, from tuning.gemm_lt and PREFILL_GEMM_LT): off = GemmEx everywhere
// (no timing, an empty plan); force = a test mode: a shape timed under it takes the fastest Lt
// algorithm whatever GemmEx's time (so that the Lt path runs on shapes where it does not win;
// such choices are kept apart from the normal ones); on = the timed choice.

// Fills *plan for `jobs` (duplicates count once): each shape's process choice, timed now when the
// process has none for it yet (GemmEx and cuBLASLt's top <= 8 heuristic algorithms, a few warm-up
// runs then 5 interleaved timed rounds, cudaEvents on ctx->stream; an Lt algorithm is chosen only
// when its median beats GemmEx's by > 3%). x: fp16 scratch of x_elems >= rows * k, y: fp32
// scratch of y_elems >= rows * ldy; both are overwritten (never the session's state). Synchronizes
// ctx->stream. Not while ctx->stream is capturing (nothing is timed then: the plan stays empty for
// the shapes not chosen yet). PREFILL_LOG=gemm prints each choice made to stderr (one line per
// shape timed; nothing for a shape the process had chosen for already). `mode`: kGemmLtOn or
// kGemmLtForce.
pf_status gemm_plan_build(pf_context *ctx, const std::vector<GemmTuneJob> &jobs, __half *x,
                          size_t x_elems, float *y, size_t y_elems, GemmLtMode mode, GemmPlan *plan);

// One f16-leg GEMM: y[rows][ld] = beta * y + x[rows][k] . w[n][k]^T (fp16 w and x, fp32 y).
struct F16Gemm {
    const __half *w = nullptr;
    int64_t n = 0, k = 0;
    const __half *x = nullptr;  // [rows][k]
    int64_t rows = 0;
    MatF y;
    float beta = 0.0f;
};

// The f16 leg's GEMM on ctx->stream: the algorithm `plan` (may be nullptr) has for this shape
// when it has one and the pointers are 256-byte aligned (what the Lt algorithms were chosen for),
// else cublasGemmEx on ctx->blas_tc (pointer mode host). Sizes fit in int32 (checked by the
// callers).
pf_status gemm_f16(pf_context *ctx, const GemmPlan *plan, const F16Gemm &g);

}  // namespace pf
