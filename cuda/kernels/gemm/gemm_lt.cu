// gemm_lt.cu — the f16 leg's GEMM and its per-shape algorithm choice (gemm_lt.cuh): the
// process-wide table of choices, the timing at session creation, the call.
//
// The GEMM, row-major Y[rows][ldy] = X[rows][k] . W[n][k]^T read column-major (gemm.cu):
//   op(A) = W^T' (A stored k x n, ld k, OP_T), B = X^T (k x rows, ld k, OP_N), C = D = Y^T
//   (n x rows, ld ldy); fp16 A/B, fp32 C/D, fp32 compute and scale.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "base/cuda_check.cuh"
#include "kernels/gemm/gemm_lt.cuh"
#include "plan/plan.h"

namespace pf {
namespace {

constexpr int kLtCandidates = 8;      // cuBLASLt heuristic algorithms timed per shape
constexpr int kWarmupRuns = 2;        // per candidate, untimed (module load, clocks)
constexpr int kTimedRounds = 5;       // each round times every candidate once (interleaved)
constexpr double kLtMargin = 0.97;    // an Lt algorithm must run in < 97% of GemmEx's median
constexpr uint32_t kLtAlignBytes = 256;  // the A/B/C/D alignment the algorithms are chosen for
constexpr unsigned char kXFillByte = 0x3C;  // x for the timing: every fp16 0x3C3C = 1.0586

// ------------------------------------------------------------------ the process-wide choices

// `forced`: a choice made under PF_GEMM_LT_FORCE (a test mode) is kept apart, so that it never
// becomes the choice of a normal session of the process.
struct ShapeKey {
    int device;
    int64_t n, rows, k, ldy;
    bool accumulate, forced;
    bool operator<(const ShapeKey &o) const {
        return std::tie(device, n, rows, k, ldy, accumulate, forced) <
               std::tie(o.device, o.n, o.rows, o.k, o.ldy, o.accumulate, o.forced);
    }
};

struct Choice {
    bool lt = false;  // false: GemmEx
    cublasLtMatmulAlgo_t algo{};
    size_t workspace_bytes = 0;
};

// Filled once per shape (the first session that needs it), never changed or erased: every later
// session of the process reuses the choice (bitwise equal logits). The lock is held while a
// shape is timed, so a shape is timed once even when two threads create sessions.
std::mutex g_choices_mu;
std::map<ShapeKey, Choice> g_choices;

bool log_on() { return log_enabled(kLogGemm); }  // PREFILL_LOG=gemm

bool aligned(const void *p) { return reinterpret_cast<uintptr_t>(p) % kLtAlignBytes == 0; }

// ------------------------------------------------------------------ descriptors

struct Descs {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    void destroy() {
        if (c) (void)cublasLtMatrixLayoutDestroy(c);
        if (b) (void)cublasLtMatrixLayoutDestroy(b);
        if (a) (void)cublasLtMatrixLayoutDestroy(a);
        if (op) (void)cublasLtMatmulDescDestroy(op);
        op = nullptr, a = b = c = nullptr;
    }
};

// Host objects only (no device memory, no stream): made at session creation.
cublasStatus_t descs_create(const GemmShape &s, Descs *d) {
    cublasStatus_t st = cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&d->a, CUDA_R_16F, uint64_t(s.k), uint64_t(s.n), s.k);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&d->b, CUDA_R_16F, uint64_t(s.k), uint64_t(s.rows), s.k);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&d->c, CUDA_R_32F, uint64_t(s.n), uint64_t(s.rows), s.ldy);
    if (st != CUBLAS_STATUS_SUCCESS) d->destroy();
    return st;
}

cublasStatus_t lt_run(pf_context *ctx, const Descs &d, const cublasLtMatmulAlgo_t &algo, size_t ws,
                      const __half *w, const __half *x, float *y, float beta) {
    const float alpha = 1.0f;
    // The workspace size passed is the algorithm's need, the same in every call and context.
    return cublasLtMatmul(ctx->blas_lt, d.op, &alpha, w, d.a, x, d.b, &beta, y, d.c, y, d.c, &algo,
                          ws ? ctx->workspace : nullptr, ws, ctx->stream);
}

cublasStatus_t gemmex_run(pf_context *ctx, const __half *w, int64_t n, int64_t k, const __half *x,
                          int64_t rows, float *y, int64_t ldy, float beta) {
    const float alpha = 1.0f;
    // fp16 A/B on tensor cores, fp32 accumulation and fp32 C: no fp16 intermediate anywhere.
    return cublasGemmEx(ctx->blas_tc, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows), int(k), &alpha, w,
                        CUDA_R_16F, int(k), x, CUDA_R_16F, int(k), &beta, y, CUDA_R_32F, int(ldy),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// ------------------------------------------------------------------ timing

// Events recorded between consecutive launches of one stream; destroyed with the scope.
struct EventRow {
    std::vector<cudaEvent_t> ev;
    ~EventRow() {
        for (cudaEvent_t e : ev) (void)cudaEventDestroy(e);
    }
};

double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : double(v[v.size() / 2]);  // odd counts: the middle one
}

// cuBLASLt's heuristic list for shape s (at most kLtCandidates, workspace within the context's).
pf_status heuristic(pf_context *ctx, const Descs &d, std::vector<cublasLtMatmulHeuristicResult_t> *out) {
    cublasLtMatmulPreference_t pref = nullptr;
    PF_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ctx->workspace_bytes;
    const uint32_t align = kLtAlignBytes;
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (cublasLtMatmulPreferenceAttributes_t a :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, a, &align, sizeof align);
    out->assign(kLtCandidates, cublasLtMatmulHeuristicResult_t{});
    int got = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(ctx->blas_lt, d.op, d.a, d.b, d.c, d.c, pref, kLtCandidates,
                                            out->data(), &got);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    out->resize(st == CUBLAS_STATUS_SUCCESS ? size_t(got) : 0);  // NOT_SUPPORTED: none, GemmEx
    out->erase(std::remove_if(out->begin(), out->end(),
                              [&](const cublasLtMatmulHeuristicResult_t &r) {
                                  return r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > ctx->workspace_bytes;
                              }),
               out->end());
    return PF_STATUS_OK;
}

// A short description of an algorithm for the log: its id, tile, split-K and stages.
void describe(const cublasLtMatmulAlgo_t &algo, char *buf, size_t n) {
    int32_t id = -1, splitk = 1;
    uint32_t tile = 0, stages = 0;
    size_t w = 0;
    (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    std::snprintf(buf, n, "id %d tile %u splitk %d stages %u", int(id), unsigned(tile), int(splitk),
                  unsigned(stages));
}

// Times GemmEx and the heuristic list on shape s with the job's buffers; *out the choice (force:
// the fastest Lt algorithm whatever GemmEx's time). Candidates whose launch fails are dropped; a
// failing GemmEx or a CUDA error is returned.
pf_status time_shape(pf_context *ctx, const GemmTuneJob &j, const __half *x, float *y, bool force,
                     Choice *out) {
    const GemmShape &s = j.shape;
    *out = Choice{};
    Descs d;
    if (descs_create(s, &d) != CUBLAS_STATUS_SUCCESS) return PF_STATUS_OK;  // GemmEx
    std::vector<cublasLtMatmulHeuristicResult_t> cands;
    const pf_status hs = heuristic(ctx, d, &cands);
    if (hs != PF_STATUS_OK || cands.empty()) {
        d.destroy();
        if (hs == PF_STATUS_OK && log_on())
            std::fprintf(stderr,
                         "libprefill: gemm choice: device %d n=%lld rows=%lld k=%lld ldy=%lld beta=%d: "
                         "no Lt algorithm -> GemmEx\n",
                         ctx->device, (long long)s.n, (long long)s.rows, (long long)s.k, (long long)s.ldy,
                         s.accumulate ? 1 : 0);
        return hs;
    }
    const float beta = s.accumulate ? 1.0f : 0.0f;
    cudaStream_t st = ctx->stream;
    // Candidate 0 is GemmEx, 1.. the heuristic list. Each runs kWarmupRuns times (a launch that
    // fails drops the candidate), then kTimedRounds rounds time each live one once.
    const size_t nc = cands.size() + 1;
    std::vector<bool> live(nc, true);
    auto run = [&](size_t c) -> cublasStatus_t {
        if (c == 0) return gemmex_run(ctx, j.w, s.n, s.k, x, s.rows, y, s.ldy, beta);
        return lt_run(ctx, d, cands[c - 1].algo, cands[c - 1].workspaceSize, j.w, x, y, beta);
    };
    pf_status r = PF_STATUS_OK;
    auto body = [&]() -> pf_status {
        PF_CUBLAS_TRY(cublasSetPointerMode(ctx->blas_tc, CUBLAS_POINTER_MODE_HOST));
        // y starts at 0 (beta 1 then adds bounded sums: x ~ 1, 5 + 7 runs per candidate)
        PF_CUDA_TRY(cudaMemsetAsync(y, 0, size_t(s.rows) * size_t(s.ldy) * sizeof(float), st));
        for (int i = 0; i < kWarmupRuns; ++i)
            for (size_t c = 0; c < nc; ++c) {
                if (!live[c]) continue;
                const cublasStatus_t bs = run(c);
                if (bs == CUBLAS_STATUS_SUCCESS) continue;
                if (c == 0) return cublas_fail(bs, __FILE__, __LINE__, "gemm choice: cublasGemmEx");
                (void)cudaGetLastError();  // a refused launch: drop the candidate, keep no error
                live[c] = false;
            }
        EventRow evs;
        evs.ev.reserve(size_t(kTimedRounds) * nc + 1);
        for (size_t i = 0; i < size_t(kTimedRounds) * nc + 1; ++i) {
            cudaEvent_t e = nullptr;
            PF_CUDA_TRY(cudaEventCreate(&e));
            evs.ev.push_back(e);
        }
        size_t at = 0;
        std::vector<std::vector<size_t>> slots(nc);  // event index before each timed run
        PF_CUDA_TRY(cudaEventRecord(evs.ev[at], st));
        for (int round = 0; round < kTimedRounds; ++round)
            for (size_t c = 0; c < nc; ++c) {
                if (!live[c]) continue;
                const cublasStatus_t bs = run(c);
                if (bs != CUBLAS_STATUS_SUCCESS)
                    return cublas_fail(bs, __FILE__, __LINE__, "gemm choice: a timed run");
                slots[c].push_back(at);
                PF_CUDA_TRY(cudaEventRecord(evs.ev[++at], st));
            }
        PF_CUDA_TRY(cudaStreamSynchronize(st));
        std::vector<double> med(nc, 0.0);
        for (size_t c = 0; c < nc; ++c) {
            if (!live[c]) continue;
            std::vector<float> ms;
            for (size_t e : slots[c]) {
                float t = 0;
                PF_CUDA_TRY(cudaEventElapsedTime(&t, evs.ev[e], evs.ev[e + 1]));
                ms.push_back(t);
            }
            med[c] = median(ms);
        }
        size_t best = 0;
        for (size_t c = 1; c < nc; ++c)
            if (live[c] && (best == 0 || med[c] < med[best])) best = c;
        const bool pick = best != 0 && (force || med[best] < kLtMargin * med[0]);
        if (pick) {
            out->lt = true;
            out->algo = cands[best - 1].algo;
            out->workspace_bytes = cands[best - 1].workspaceSize;
        }
        if (log_on()) {
            char what[96] = "none";
            if (best != 0) describe(cands[best - 1].algo, what, sizeof what);
            std::fprintf(stderr,
                         "libprefill: gemm choice: device %d n=%lld rows=%lld k=%lld ldy=%lld beta=%d: "
                         "GemmEx %.4f ms, best of %zu Lt %.4f ms (%s, workspace %zu) -> %s\n",
                         ctx->device, (long long)s.n, (long long)s.rows, (long long)s.k, (long long)s.ldy,
                         s.accumulate ? 1 : 0, med[0], nc - 1, best ? med[best] : 0.0, what,
                         best ? cands[best - 1].workspaceSize : size_t(0),
                         pick ? (force ? "Lt (forced)" : "Lt") : "GemmEx");
        }
        return PF_STATUS_OK;
    };
    r = body();
    if (r != PF_STATUS_OK) (void)cudaStreamSynchronize(st);  // nothing queued may outlive d
    d.destroy();
    return r;
}

}  // namespace

// ------------------------------------------------------------------ the plan

GemmPlan::~GemmPlan() {
    for (LtGemm &g : lt_) {
        Descs d{g.op, g.a, g.b, g.c};
        d.destroy();
    }
}

const LtGemm *GemmPlan::find(int64_t n, int64_t rows, int64_t k, int64_t ldy, bool accumulate) const {
    for (const LtGemm &g : lt_)  // a handful of shapes per model
        if (g.shape.n == n && g.shape.rows == rows && g.shape.k == k && g.shape.ldy == ldy &&
            g.shape.accumulate == accumulate)
            return &g;
    return nullptr;
}

pf_status gemm_plan_build(pf_context *ctx, const std::vector<GemmTuneJob> &jobs, __half *x,
                          size_t x_elems, float *y, size_t y_elems, GemmLtMode mode, GemmPlan *plan) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PF_CUDA_TRY(cudaStreamIsCapturing(ctx->stream, &cap));
    const bool may_time = cap == cudaStreamCaptureStatusNone;  // never time inside a capture
    std::set<ShapeKey> done;
    bool filled = false;
    plan->lt_.reserve(plan->lt_.size() + jobs.size());  // push_back below never reallocates
    for (const GemmTuneJob &j : jobs) {
        const GemmShape &s = j.shape;
        const ShapeKey key{ctx->device, s.n, s.rows, s.k, s.ldy, s.accumulate, mode == kGemmLtForce};
        if (s.rows < 1 || !done.insert(key).second) continue;
        // Buffers the algorithms could not run on as timed: not chosen here (GemmEx in this session).
        if (!j.w || !aligned(j.w) || !aligned(x) || !aligned(y) || size_t(s.rows) * size_t(s.k) > x_elems ||
            size_t(s.rows) * size_t(s.ldy) > y_elems)
            continue;
        Choice c;
        {
            std::lock_guard<std::mutex> lock(g_choices_mu);
            auto it = g_choices.find(key);
            if (it != g_choices.end()) {
                c = it->second;
            } else {
                if (!may_time) continue;
                if (!filled) {  // bounded fp16 input for every shape of this call
                    PF_CUDA_TRY(cudaMemsetAsync(x, kXFillByte, x_elems * sizeof(__half), ctx->stream));
                    filled = true;
                }
                PF_TRY(time_shape(ctx, j, x, y, mode == kGemmLtForce, &c));
                g_choices.emplace(key, c);
            }
        }
        if (!c.lt) continue;
        LtGemm g;
        g.shape = s;
        g.algo = c.algo;
        g.workspace_bytes = c.workspace_bytes;
        Descs d;
        PF_CUBLAS_TRY(descs_create(s, &d));
        g.op = d.op, g.a = d.a, g.b = d.b, g.c = d.c;
        plan->lt_.push_back(g);  // reserved above: no throw between create and ownership
    }
    return PF_STATUS_OK;
}

pf_status gemm_f16(pf_context *ctx, const GemmPlan *plan, const F16Gemm &m) {
    if (plan) {
        const LtGemm *g = plan->find(m.n, m.rows, m.k, m.y.ld, m.beta != 0.0f);
        if (g && aligned(m.w) && aligned(m.x) && aligned(m.y.ptr) && g->workspace_bytes <= ctx->workspace_bytes) {
            const Descs d{g->op, g->a, g->b, g->c};
            PF_CUBLAS_TRY(lt_run(ctx, d, g->algo, g->workspace_bytes, m.w, m.x, m.y.ptr, m.beta));
            return PF_STATUS_OK;
        }
    }
    PF_CUBLAS_TRY(gemmex_run(ctx, m.w, m.n, m.k, m.x, m.rows, m.y.ptr, m.y.ld, m.beta));
    return PF_STATUS_OK;
}

}  // namespace pf
