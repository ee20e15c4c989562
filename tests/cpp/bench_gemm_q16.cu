// bench_gemm_q16.cu — the f16 leg's GEMM on the GGUF blocks in its forms: the weight decoded into
// shared memory (gemm_q16_kernel.cuh) by single blocks (CM = 1) or by pairs of blocks sharing the
// decoded tile (CM = 2), the weight as wgmma's register operand (gemm_q16_rs_kernel.cuh, "rs",
// an experiment) and as mma.sync's (gemm_q16_mma_kernel.cuh, the compute capability 8.x form, an
// experiment; on Hopper it runs the sm_90a build's mma.sync), timed beside cuBLAS on the fp16
// weights (what the fp16 cache runs) in one device call. Checks first, on fresh random blocks and
// rows, outputs poisoned with NaN: the pair's output equals the single block's bit for bit (the
// same products in the same order), the other forms' differences are reported beside it, every
// output is written, and 64 sampled outputs of each form are within 4e-5 of the
// float64 product of the fp16 rows and the weight decoded by quant.cuh (the prewarm's decoder)
// relative to the sum of the products' magnitudes; with X the identity (one product per output)
// each form's output is that decoded fp16 weight exactly.
// Not a ctest: a tool for kernel work (the library's own tests are tests/python/test_kernel_gemm_q16.py).
// M <= 64: the skinny form (gemm_q16_skinny_kernel.cuh) at every split (run_skinny).
//   bench_gemm_q16 [--check-only] [--type Q6_K] [M N K ...]
//     default: every type's checks on ragged shapes and X = I (the skinny form's too), then the
//     qwen35-4b projections at 2048 and 8192 rows, Q4_K and Q6_K; with M N K: only those shapes,
//     of --type (default Q4_K),
//     checked and timed (one kernel shape per launch: what ncu -k regex:... profiles)
// Prints one line per shape, type and form: median ms of 10 runs and TF/s (2 M N K / time).
// Exit 77: no compute capability 9.0 device or no sm_90a code; 1: a mismatch or an error.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/dequant/quant.cuh"
#include "kernels/gemm/gemm_q16_kernel.cuh"
#include "kernels/gemm/gemm_q16_mma_kernel.cuh"
#include "kernels/gemm/gemm_q16_rs_kernel.cuh"
#include "kernels/gemm/gemm_q16_gemv_kernel.cuh"
#include "kernels/gemm/gemm_q16_skinny_kernel.cuh"
#include "cuda_exit.h"

namespace {

#define CB(x)                                                                        \
    do {                                                                             \
        const cublasStatus_t s_ = (x);                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                           \
            std::fprintf(stderr, "%s:%d %s: cuBLAS %d\n", __FILE__, __LINE__, #x, int(s_)); \
            std::exit(1);                                                            \
        }                                                                            \
    } while (0)

using namespace pf;

// W [n][k] from the blocks with quant.cuh's decoder: T = __half, the prewarm's fp16 values; T =
// float, the same values before their rounding (the exact weights the GEMV form multiplies).
template <int Q, class T>
__global__ void decode_rows(const uint8_t *w, int64_t row_bytes, int n, int k, T *out) {
    const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
    if (i >= int64_t(n) * k) return;
    const int64_t r = i / k, c = i % k;
    float v[8];
    decode8_at<Q>(w + r * row_bytes, c, v);
    for (int e = 0; e < 8; ++e) {
        if constexpr (std::is_same_v<T, __half>) out[i + e] = __float2half_rn(v[e]);
        else out[i + e] = v[e];
    }
}

// Random blocks: random bytes, then every fp16 scale field a small positive fp16 (random bytes
// there could be Inf or NaN). The fields' offsets per type (quant.cuh's block structs).
template <int Q>
void fill_blocks(std::vector<uint8_t> &b, std::mt19937 &rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> d(0.5e-2f, 1.5e-2f);
    for (uint8_t &x : b) x = uint8_t(byte(rng));
    constexpr int kB = qtraits<Q>::kBytes;
    auto put = [&](size_t at) {
        const __half h = __float2half_rn(d(rng));
        std::memcpy(&b[at], &h, 2);
    };
    for (size_t o = 0; o + kB <= b.size(); o += kB) {
        if constexpr (Q == PF_QTYPE_Q4_0 || Q == PF_QTYPE_Q8_0 || Q == PF_QTYPE_IQ4_XS) put(o);
        if constexpr (Q == PF_QTYPE_Q4_K) put(o + offsetof(block_q4_K, d)), put(o + offsetof(block_q4_K, dmin));
        if constexpr (Q == PF_QTYPE_Q5_K) put(o + offsetof(block_q5_K, d)), put(o + offsetof(block_q5_K, dmin));
        if constexpr (Q == PF_QTYPE_Q6_K) put(o + offsetof(block_q6_K, d));
    }
}

const char *type_name(int q) {
    switch (q) {
        case PF_QTYPE_Q4_0: return "Q4_0";
        case PF_QTYPE_Q8_0: return "Q8_0";
        case PF_QTYPE_Q4_K: return "Q4_K";
        case PF_QTYPE_Q5_K: return "Q5_K";
        case PF_QTYPE_Q6_K: return "Q6_K";
        default: return "IQ4_XS";
    }
}

template <class F>
float median_ms(cudaStream_t st, int reps, const F &run) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    run();  // warm
    CK(cudaStreamSynchronize(st));
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a, st));
        run();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// The worst of 64 sampled outputs' errors against the float64 product of the fp16 rows and the
// decoded fp16 weight, relative to the sum of the products' magnitudes (the same samples for every
// form; the first the last output).
template <class W>
double sampled_error(const std::vector<__half> &hx, const std::vector<W> &hw16, const std::vector<float> &y,
                     int64_t M, int64_t N, int64_t K) {
    double worst = 0;
    std::mt19937 pick(7);
    std::uniform_int_distribution<int64_t> rr(0, M - 1), rc(0, N - 1);
    for (int smp = 0; smp < 64; ++smp) {
        const int64_t r = smp == 0 ? M - 1 : rr(pick), c = smp == 0 ? N - 1 : rc(pick);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < K; ++i) {
            const double p =
                double(__half2float(hx[size_t(r * K + i)])) * double(float(hw16[size_t(c * K + i)]));
            ref += p;
            mag += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(double(y[size_t(r * N + c)]) - ref) / (mag + 1e-30));
    }
    return worst;
}

// cuBLAS on the fp16 weights (the cache's GEMM): Y^T [N][M] = W [N][K] . X^T, column-major;
// median of `reps`, printed.
float time_cublas(cublasHandle_t cb, cudaStream_t st, int reps, const __half *w16, const __half *x, float *y,
                  int64_t M, int64_t N, int64_t K) {
    const float alpha = 1.f, beta = 0.f;
    const float tc = median_ms(st, reps, [&] {
        CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w16, CUDA_R_16F, int(K), x,
                        CUDA_R_16F, int(K), &beta, y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    std::printf("  %-24s %8.4f ms %7.1f TF/s\n", "cuBLAS fp16 (cache)", tc,
                2.0 * double(M) * double(N) * double(K) / tc * 1e-9);
    return tc;
}

// The forms, launched on y: 0 single blocks, 1 pairs, 2 rs (the weight as wgmma's register
// operand), 3 mma (the compute capability 8.x form: mma.sync, the weight as the register operand).
constexpr int kForms = 4;
const char *const kFormName[kForms] = {"blocks, single (CM=1)", "blocks, pairs (CM=2)", "blocks, rs (A = W regs)",
                                       "blocks, mma.sync (8.x)"};

template <int Q>
void allow_smem() {
    CK(cudaFuncSetAttribute(q16::gemm_q16_kernel<Q, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            int(q16::smem_bytes<Q, 1>())));
    CK(cudaFuncSetAttribute(q16::gemm_q16_kernel<Q, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            int(q16::smem_bytes<Q, 2>())));
    CK(cudaFuncSetAttribute(q16rs::gemm_q16_rs_kernel<Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            int(q16rs::smem_bytes<Q>())));
    CK(cudaFuncSetAttribute(q16mma::gemm_q16_mma_kernel<Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            int(q16mma::smem_bytes<Q>())));
}

template <int Q>
void launch_form(int f, const uint8_t *w, int64_t N, int64_t K, const CUtensorMap &tm, const __half *x, int64_t M,
                 float *y, cudaStream_t st) {
    if (f == 3) {
        CK((q16mma::launch<Q>(q16mma::make_args<Q>(w, N, K, nullptr, M, y, N, false), x, st)));
        return;
    }
    if (f == 2) {
        CK((q16rs::launch<Q>(q16rs::make_args<Q>(w, N, K, nullptr, M, y, N, false), tm, st)));
        return;
    }
    const q16::Q16Args a = q16::make_args<Q>(w, N, K, nullptr, M, y, N, false);
    if (f == 0) CK((q16::launch<Q, 1>(a, tm, st)));
    else CK((q16::launch<Q, 2>(a, tm, st)));
}

// One shape and type: checks, then (unless check_only) the timings. Returns false on a mismatch.
// identity: X = I (M = K), each output one product: every form's Y^T must be the decoded weight.
template <int Q>
bool run_shape(int64_t M, int64_t N, int64_t K, bool check_only, cublasHandle_t cb, std::mt19937 &rng,
               bool identity = false) {
    using G = q16::RawGeom<Q>;
    if (K % G::kElems != 0) {
        std::printf("%-7s M=%lld N=%lld K=%lld: K must be a multiple of %d (the block)\n", type_name(Q), (long long)M,
                    (long long)N, (long long)K, G::kElems);
        return false;
    }
    const int64_t row_bytes = K / G::kElems * G::kBlock;
    std::vector<uint8_t> hw(size_t(N * row_bytes));
    fill_blocks<Q>(hw, rng);
    std::vector<__half> hx(size_t(M * K));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < M * K; ++i)
        hx[size_t(i)] = __float2half_rn(identity ? float(i / K == i % K) : u(rng));
    uint8_t *w = nullptr;
    __half *x = nullptr, *w16 = nullptr;
    float *y[kForms] = {}, *yc = nullptr;
    CK(cudaMalloc(&w, hw.size()));
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMalloc(&w16, size_t(N * K) * 2));
    for (float *&p : y) {
        CK(cudaMalloc(&p, size_t(M * N) * 4));
        CK(cudaMemset(p, 0xFF, size_t(M * N) * 4));  // NaN: an unwritten output fails the checks
    }
    CK(cudaMalloc(&yc, size_t(M * N) * 4));
    CK(cudaMemcpy(w, hw.data(), hw.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    decode_rows<Q><<<unsigned((N * K / 8 + 255) / 256), 256>>>(w, row_bytes, int(N), int(K), w16);
    CK(cudaGetLastError());
    CUtensorMap tm;  // boxes of 256 rows: kBM of the shared-memory form, kTN of the rs form
    static_assert(q16::kBM == q16rs::kTN, "one X map for both forms");
    if (hopper::encode_fp16_sw128(&tm, x, K, M, q16::kBM) != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
        std::exit(1);
    }
    allow_smem<Q>();
    cudaStream_t st = nullptr;
    for (int f = 0; f < kForms; ++f) launch_form<Q>(f, w, N, K, tm, x, M, y[f], st);
    CK(cudaDeviceSynchronize());

    std::vector<std::vector<float>> h(kForms, std::vector<float>(size_t(M * N)));
    std::vector<__half> hw16(size_t(N * K));
    for (int f = 0; f < kForms; ++f) CK(cudaMemcpy(h[f].data(), y[f], h[f].size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hw16.data(), w16, hw16.size() * 2, cudaMemcpyDeviceToHost));
    bool ok = true;
    std::printf("%-7s M=%-5lld N=%-6lld K=%-6lld%s\n", type_name(Q), (long long)M, (long long)N, (long long)K,
                identity ? " X = I" : "");
    for (int f = 0; f < kForms; ++f) {
        int64_t unwritten = 0, diff = 0, wrong = 0;
        for (size_t i = 0; i < h[f].size(); ++i) {
            unwritten += !std::isfinite(h[f][i]);
            diff += std::memcmp(&h[f][i], &h[0][i], 4) != 0;
        }
        if (identity)  // Y[t][c] = W16[c][t] exactly
            for (int64_t t = 0; t < M; ++t)
                for (int64_t c = 0; c < N; ++c)
                    wrong += h[f][size_t(t * N + c)] != __half2float(hw16[size_t(c * K + t)]);
        const double worst = identity ? 0.0 : sampled_error(hx, hw16, h[f], M, N, K);
        // the pair must equal the single blocks bit for bit; the rs form's difference is reported
        const bool f_ok = unwritten == 0 && wrong == 0 && worst <= 4e-5 && (f != 1 || diff == 0);
        std::printf("  %-24s check: %s (unwritten %lld, differing from single %lld of %lld, sampled error %.2g%s)\n",
                    kFormName[f], f_ok ? "ok" : "FAIL", (long long)unwritten, (long long)diff,
                    (long long)h[f].size(), worst,
                    identity ? (wrong ? ", NOT the decoded weight" : ", the decoded weight") : "");
        ok &= f_ok;
    }

    if (!check_only && ok) {
        const double flop = 2.0 * double(M) * double(N) * double(K);
        const float tc = time_cublas(cb, st, 10, w16, x, yc, M, N, K);
        for (int f = 0; f < kForms; ++f) {
            const float t = median_ms(st, 10, [&] { launch_form<Q>(f, w, N, K, tm, x, M, y[f], st); });
            std::printf("  %-24s %8.4f ms %7.1f TF/s  %.2fx cache\n", kFormName[f], t, flop / t * 1e-9, tc / t);
        }
    }
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(w16));
    for (float *p : y) CK(cudaFree(p));
    CK(cudaFree(yc));
    return ok;
}

// ---------------------------------------------------------------------------- the skinny form

template <int Q, int MT>
void launch_skinny(const uint8_t *w, int64_t N, int64_t K, const __half *x, int64_t M, float *y, int split,
                   bool tma, cudaStream_t st) {
    CK(cudaFuncSetAttribute(q16s::gemm_q16_skinny_kernel<Q, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            int(q16s::smem_bytes<Q, MT>())));
    CK((q16s::launch<Q, MT>(q16s::make_args<Q>(w, N, K, nullptr, M, y, N, false), x, split, st, tma)));
}

// The library's tiles of X rows (gemm_q16.cu): 8, 16, 32, 64.
template <int Q>
void launch_skinny_any(const uint8_t *w, int64_t N, int64_t K, const __half *x, int64_t M, float *y, int split,
                       bool tma, cudaStream_t st) {
    if (M <= 8) launch_skinny<Q, 1>(w, N, K, x, M, y, split, tma, st);
    else if (M <= 16) launch_skinny<Q, 2>(w, N, K, x, M, y, split, tma, st);
    else if (M <= 32) launch_skinny<Q, 4>(w, N, K, x, M, y, split, tma, st);
    else launch_skinny<Q, 8>(w, N, K, x, M, y, split, tma, st);
}

// The operands of a few-rows case: random blocks W [N][K] of type Q, random fp16 rows X [M][K],
// X's rows as unit vectors e_c (sel: row i's column, row 0 the last one), W decoded to fp16 (the
// cache's values) and to fp32, outputs y and yc; device copies freed with the case.
template <int Q>
struct FewRowsCase {
    int64_t M, N, K, row_bytes;
    std::vector<__half> hx, hw16;
    std::vector<float> hw32;
    std::vector<int64_t> sel;
    uint8_t *w = nullptr;
    __half *x = nullptr, *xsel = nullptr, *w16 = nullptr;
    float *w32 = nullptr, *y = nullptr, *yc = nullptr;
    size_t ybytes;
    FewRowsCase(int64_t m, int64_t n, int64_t k, std::mt19937 &rng)
        : M(m), N(n), K(k), row_bytes(k / q16::RawGeom<Q>::kElems * q16::RawGeom<Q>::kBlock), ybytes(size_t(m * n) * 4) {
        std::vector<uint8_t> hw(size_t(N * row_bytes));
        fill_blocks<Q>(hw, rng);
        hx.resize(size_t(M * K));
        std::vector<__half> hsel(size_t(M * K), __float2half_rn(0.f));
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        for (auto &v : hx) v = __float2half_rn(u(rng));
        sel.assign(size_t(M), K - 1);
        for (int64_t i = 1; i < M; ++i) sel[size_t(i)] = (i * 7919 + 13) % (K - 1);
        for (int64_t i = 0; i < M; ++i) hsel[size_t(i * K + sel[size_t(i)])] = __float2half_rn(1.f);
        CK(cudaMalloc(&w, hw.size()));
        CK(cudaMalloc(&x, hx.size() * 2));
        CK(cudaMalloc(&xsel, hsel.size() * 2));
        CK(cudaMalloc(&w16, size_t(N * K) * 2));
        CK(cudaMalloc(&w32, size_t(N * K) * 4));
        CK(cudaMalloc(&y, ybytes));
        CK(cudaMalloc(&yc, ybytes));
        CK(cudaMemcpy(w, hw.data(), hw.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(xsel, hsel.data(), hsel.size() * 2, cudaMemcpyHostToDevice));
        decode_rows<Q><<<unsigned((N * K / 8 + 255) / 256), 256>>>(w, row_bytes, int(N), int(K), w16);
        decode_rows<Q><<<unsigned((N * K / 8 + 255) / 256), 256>>>(w, row_bytes, int(N), int(K), w32);
        CK(cudaGetLastError());
        hw16.resize(size_t(N * K));
        hw32.resize(size_t(N * K));
        CK(cudaMemcpy(hw16.data(), w16, hw16.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hw32.data(), w32, hw32.size() * 4, cudaMemcpyDeviceToHost));
    }
    ~FewRowsCase() {
        for (void *p : {static_cast<void *>(w), static_cast<void *>(x), static_cast<void *>(xsel),
                        static_cast<void *>(w16), static_cast<void *>(w32), static_cast<void *>(y),
                        static_cast<void *>(yc)})
            CK(cudaFree(p));
    }
    FewRowsCase(const FewRowsCase &) = delete;
    FewRowsCase &operator=(const FewRowsCase &) = delete;
};

// M <= 16 rows of a type the GEMV form reads (gemm_q16_gemv_kernel.cuh): every K-slice count,
// checked (every output written; X's rows unit vectors give the fp32 decoded weight exactly, the
// value the prewarm rounds to fp16; float64 samples of the exact weight's product within 4e-7),
// then timed beside cuBLAS on the fp16 weights and the skinny form; the library's count marked.
template <int Q>
bool run_gemv(int64_t M, int64_t N, int64_t K, bool check_only, cublasHandle_t cb, std::mt19937 &rng, int sms) {
    if (K % 256 != 0 || M > q16v::kMaxRows) {
        std::printf("%-7s M=%lld N=%lld K=%lld: K a multiple of 256 and M <= %d\n", type_name(Q), (long long)M,
                    (long long)N, (long long)K, q16v::kMaxRows);
        return false;
    }
    FewRowsCase<Q> c(M, N, K, rng);
    cudaStream_t st = nullptr;
    const int lib_ks = q16v::pick_kslices(N, K, sms);
    auto args = [&](const __half *xx, int ks) {
        q16v::GemvArgs a{};
        a.nparts = 1;
        a.part[0].w = c.w;
        a.part[0].n = int32_t(N);
        q16v::gemv_layout(a);
        a.row_bytes = c.row_bytes;
        a.x = xx;
        a.y = c.y;
        a.ldy = N;
        a.rows = int32_t(M);
        a.k = int32_t(K);
        a.kslices = ks;
        return a;
    };
    auto launch = [&](const __half *xx, int ks) {
        if (M <= 8) CK((q16v::launch<Q, 1>(args(xx, ks), st)));
        else CK((q16v::launch<Q, 2>(args(xx, ks), st)));
    };
    bool ok = true;
    std::printf("%-7s M=%-5lld N=%-6lld K=%-6lld gemv (library: %d K slices)\n", type_name(Q), (long long)M,
                (long long)N, (long long)K, lib_ks);
    std::vector<float> h(size_t(M * N));
    for (int ks = 1; ks <= q16v::kWarps; ks *= 2) {
        CK(cudaMemset(c.y, 0xFF, c.ybytes));
        launch(c.xsel, ks);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), c.y, c.ybytes, cudaMemcpyDeviceToHost));
        int64_t wrong = 0;
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) wrong += h[size_t(i * N + j)] != c.hw32[size_t(j * K + c.sel[size_t(i)])];
        CK(cudaMemset(c.y, 0xFF, c.ybytes));
        launch(c.x, ks);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), c.y, c.ybytes, cudaMemcpyDeviceToHost));
        int64_t unwritten = 0;
        for (float v : h) unwritten += !std::isfinite(v);
        const double worst = sampled_error(c.hx, c.hw32, h, M, N, K);
        const bool f_ok = unwritten == 0 && wrong == 0 && worst <= 4e-7;
        std::printf("  gemv ks=%d check: %s (unwritten %lld, X = e_c outputs not the fp32 weight %lld, sampled "
                    "error %.2g)\n", ks, f_ok ? "ok" : "FAIL", (long long)unwritten, (long long)wrong, worst);
        ok &= f_ok;
    }
    if (!check_only && ok) {
        const double flop = 2.0 * double(M) * double(N) * double(K);
        const float tc = time_cublas(cb, st, 20, c.w16, c.x, c.yc, M, N, K);
        const double gb = double(N) * double(c.row_bytes) * 1e-9;
        for (int ks = 1; ks <= q16v::kWarps; ks *= 2) {
            const float t = median_ms(st, 20, [&] { launch(c.x, ks); });
            std::printf("  gemv ks=%d %8.4f ms %7.1f TF/s %6.0f GB/s  %.2fx cache%s\n", ks, t, flop / t * 1e-9,
                        gb / t * 1e3, tc / t, ks == lib_ks ? "  <- library" : "");
        }
    }
    return ok;
}

// M <= 64 rows: the skinny form at every split, checked (every output written, sampled float64
// errors; with X's rows unit vectors e_c, one product per output: Y[i][j] = W16[j][c_i], the
// decoded weight exactly), then timed beside cuBLAS on the fp16 weights; the library's split
// (gemm_q16.cu: pick_split) marked.
template <int Q>
bool run_skinny(int64_t M, int64_t N, int64_t K, bool check_only, cublasHandle_t cb, std::mt19937 &rng, int sms) {
    using G = q16::RawGeom<Q>;
    if (K % G::kElems != 0 || M > q16s::kMaxRows) {
        std::printf("%-7s M=%lld N=%lld K=%lld: K a multiple of %d and M <= %d\n", type_name(Q), (long long)M,
                    (long long)N, (long long)K, G::kElems, q16s::kMaxRows);
        return false;
    }
    FewRowsCase<Q> c(M, N, K, rng);
    cudaStream_t st = nullptr;
    const int lib_split = q16s::pick_split(q16s::make_args<Q>(c.w, N, K, nullptr, M, c.y, N, false), sms);
    const int supersteps = int((K + q16::kRawCols - 1) / q16::kRawCols);
    bool ok = true;
    std::printf("%-7s M=%-5lld N=%-6lld K=%-6lld skinny (library: split %d)\n", type_name(Q), (long long)M,
                (long long)N, (long long)K, lib_split);
    std::vector<float> h(size_t(M * N));
    // the raw blocks by TMA (where the rows allow: Q16Args::tma_raw) and by 16-byte chunks
    const int copies = q16s::make_args<Q>(c.w, N, K, nullptr, M, c.y, N, false).tma_raw ? 2 : 1;
    for (int cp = 0; cp < copies; ++cp)
    for (int split = 1; split <= q16s::kMaxSplit && split <= supersteps; split *= 2) {
        const bool tma = cp == 0;
        // X's rows unit vectors: one product per output, the decoded weight
        CK(cudaMemset(c.y, 0xFF, c.ybytes));
        launch_skinny_any<Q>(c.w, N, K, c.xsel, M, c.y, split, tma, st);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), c.y, c.ybytes, cudaMemcpyDeviceToHost));
        int64_t wrong = 0;
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j)
                wrong += h[size_t(i * N + j)] != __half2float(c.hw16[size_t(j * K + c.sel[size_t(i)])]);
        // random rows: written, float64 samples
        CK(cudaMemset(c.y, 0xFF, c.ybytes));
        launch_skinny_any<Q>(c.w, N, K, c.x, M, c.y, split, tma, st);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), c.y, c.ybytes, cudaMemcpyDeviceToHost));
        int64_t unwritten = 0;
        for (float v : h) unwritten += !std::isfinite(v);
        const double worst = sampled_error(c.hx, c.hw16, h, M, N, K);
        const bool f_ok = unwritten == 0 && wrong == 0 && worst <= 4e-5;
        std::printf("  skinny %s split=%d check: %s (unwritten %lld, X = e_c outputs not the weight %lld, sampled "
                    "error %.2g)\n",
                    tma && copies == 2 ? "tma" : "chunks", split, f_ok ? "ok" : "FAIL", (long long)unwritten,
                    (long long)wrong, worst);
        ok &= f_ok;
    }
    if (!check_only && ok) {
        const double flop = 2.0 * double(M) * double(N) * double(K);
        const float tc = time_cublas(cb, st, 20, c.w16, c.x, c.yc, M, N, K);
        const double gb = double(N) * double(c.row_bytes) * 1e-9;
        for (int cp = 0; cp < copies; ++cp)
            for (int split = 1; split <= q16s::kMaxSplit && split <= supersteps; split *= 2) {
                const bool tma = cp == 0;
                const float t = median_ms(st, 20, [&] { launch_skinny_any<Q>(c.w, N, K, c.x, M, c.y, split, tma, st); });
                std::printf("  skinny %s split=%d %8.4f ms %7.1f TF/s %6.0f GB/s  %.2fx cache%s\n",
                            tma && copies == 2 ? "tma" : "chunks", split, t, flop / t * 1e-9, gb / t * 1e3, tc / t,
                            tma && split == lib_split ? "  <- library" : "");
            }
    }
    return ok;
}

}  // namespace

int main(int argc, char **argv) {
    int dev = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess || p.major != 9) {
        std::printf("skipped: not a compute capability 9.0 device\n");
        return 77;
    }
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, q16::gemm_q16_kernel<PF_QTYPE_Q4_K, 1>) != cudaSuccess || fa.binaryVersion < 90) {
        std::printf("skipped: no sm_90a code in this build\n");
        return 77;
    }
    bool check_only = false;
    std::string type = "Q4_K";
    std::vector<int64_t> dims;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--check-only") == 0) check_only = true;
        else if (std::strcmp(argv[i], "--type") == 0 && i + 1 < argc) type = argv[++i];
        else dims.push_back(std::atoll(argv[i]));
    }
    if (dims.size() % 3 != 0 || (!dims.empty() && *std::min_element(dims.begin(), dims.end()) < 1)) {
        std::fprintf(stderr, "bench_gemm_q16: M N K triples of positive sizes expected\n");
        return 2;
    }
    std::mt19937 rng(20261203);
    cublasHandle_t cb;
    CB(cublasCreate(&cb));
    bool ok = true;
    if (!dims.empty()) {   // only the shapes asked for
        for (size_t i = 0; i + 2 < dims.size(); i += 3) {
            const int64_t M = dims[i], N = dims[i + 1], K = dims[i + 2];
            if (M <= q16s::kMaxRows) {
                const int sms = p.multiProcessorCount;
                if (type == "Q4_K" && M <= q16v::kMaxRows) ok &= run_gemv<PF_QTYPE_Q4_K>(M, N, K, check_only, cb, rng, sms);
                if (type == "Q6_K" && M <= q16v::kMaxRows) ok &= run_gemv<PF_QTYPE_Q6_K>(M, N, K, check_only, cb, rng, sms);
                if (type == "Q5_K" && M <= q16v::kMaxRows) ok &= run_gemv<PF_QTYPE_Q5_K>(M, N, K, check_only, cb, rng, sms);
                if (type == "Q4_K") ok &= run_skinny<PF_QTYPE_Q4_K>(M, N, K, check_only, cb, rng, sms);
                else if (type == "Q5_K") ok &= run_skinny<PF_QTYPE_Q5_K>(M, N, K, check_only, cb, rng, sms);
                else if (type == "Q6_K") ok &= run_skinny<PF_QTYPE_Q6_K>(M, N, K, check_only, cb, rng, sms);
                else if (type == "Q8_0") ok &= run_skinny<PF_QTYPE_Q8_0>(M, N, K, check_only, cb, rng, sms);
                else if (type == "Q4_0") ok &= run_skinny<PF_QTYPE_Q4_0>(M, N, K, check_only, cb, rng, sms);
                else if (type == "IQ4_XS") ok &= run_skinny<PF_QTYPE_IQ4_XS>(M, N, K, check_only, cb, rng, sms);
                else {
                    std::fprintf(stderr, "bench_gemm_q16: --type %s (Q4_0 Q8_0 Q4_K Q5_K Q6_K IQ4_XS)\n",
                                 type.c_str());
                    return 2;
                }
                continue;
            }
            if (type == "Q4_K") ok &= run_shape<PF_QTYPE_Q4_K>(M, N, K, check_only, cb, rng);
            else if (type == "Q5_K") ok &= run_shape<PF_QTYPE_Q5_K>(M, N, K, check_only, cb, rng);
            else if (type == "Q6_K") ok &= run_shape<PF_QTYPE_Q6_K>(M, N, K, check_only, cb, rng);
            else if (type == "Q8_0") ok &= run_shape<PF_QTYPE_Q8_0>(M, N, K, check_only, cb, rng);
            else if (type == "Q4_0") ok &= run_shape<PF_QTYPE_Q4_0>(M, N, K, check_only, cb, rng);
            else if (type == "IQ4_XS") ok &= run_shape<PF_QTYPE_IQ4_XS>(M, N, K, check_only, cb, rng);
            else {
                std::fprintf(stderr, "bench_gemm_q16: --type %s (Q4_0 Q8_0 Q4_K Q5_K Q6_K IQ4_XS)\n", type.c_str());
                return 2;
            }
        }
        CB(cublasDestroy(cb));
        return ok ? 0 : 1;
    }
    // Every type on ragged shapes (an odd number of row tiles: a pair's block past the matrix; k
    // not a multiple of 256 for the 32-element blocks: a short last superstep).
    ok &= run_shape<PF_QTYPE_Q4_0>(700, 300, 2592, true, cb, rng);
    ok &= run_shape<PF_QTYPE_Q8_0>(513, 257, 2592, true, cb, rng);
    ok &= run_shape<PF_QTYPE_Q4_K>(700, 300, 2304, true, cb, rng);
    ok &= run_shape<PF_QTYPE_Q5_K>(300, 129, 2304, true, cb, rng);
    ok &= run_shape<PF_QTYPE_Q6_K>(1100, 200, 2304, true, cb, rng);
    ok &= run_shape<PF_QTYPE_IQ4_XS>(257, 384, 2304, true, cb, rng);
    // Q4_0 and Q8_0 rows of 16-byte multiples (k % 256 == 0): their raw blocks by TMA
    ok &= run_shape<PF_QTYPE_Q4_0>(700, 300, 2560, true, cb, rng);
    ok &= run_shape<PF_QTYPE_Q8_0>(513, 257, 2304, true, cb, rng);
    // The skinny form: every type, every row-tile count, ragged n and k (a short last superstep
    // for the 32-element types; Q6_K and IQ4_XS rows only 2-byte aligned)
    ok &= run_skinny<PF_QTYPE_Q4_0>(1, 300, 2592, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q8_0>(17, 257, 2592, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q4_K>(33, 300, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q5_K>(64, 129, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q6_K>(7, 200, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q6_K>(50, 136, 768, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_IQ4_XS>(40, 384, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q4_0>(64, 300, 2560, true, cb, rng, p.multiProcessorCount);
    // The GEMV form: 1, 8, 9 and 16 rows, n not a multiple of the 16-row group, one to 9 blocks a slice
    ok &= run_gemv<PF_QTYPE_Q4_K>(1, 300, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q4_K>(8, 137, 256, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q4_K>(9, 520, 4096, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q4_K>(16, 33, 2560, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q5_K>(1, 300, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q5_K>(11, 520, 4096, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q6_K>(1, 300, 2304, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q6_K>(8, 137, 256, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q6_K>(9, 520, 4096, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q6_K>(16, 33, 2560, true, cb, rng, p.multiProcessorCount);
    ok &= run_gemv<PF_QTYPE_Q6_K>(3, 129, 768, true, cb, rng, p.multiProcessorCount);
    ok &= run_skinny<PF_QTYPE_Q8_0>(2, 96, 96, true, cb, rng, p.multiProcessorCount);
    // X = I: each output one product, the decoded fp16 weight exactly (every form's operand)
    ok &= run_shape<PF_QTYPE_Q4_0>(544, 136, 544, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_Q8_0>(288, 130, 288, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_Q4_K>(512, 136, 512, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_Q5_K>(512, 136, 512, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_Q6_K>(768, 136, 768, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_IQ4_XS>(512, 136, 512, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_Q4_0>(512, 136, 512, true, cb, rng, true);
    ok &= run_shape<PF_QTYPE_Q8_0>(512, 136, 512, true, cb, rng, true);
    {
        const int64_t shapes[][2] = {{8192, 2560}, {18432, 2560}, {2560, 9216}};  // qkv, gate|up, down
        for (int64_t m : {2048, 8192})
            for (const auto &s : shapes) {
                ok &= run_shape<PF_QTYPE_Q4_K>(m, s[0], s[1], check_only, cb, rng);
                if (s[1] == 9216) ok &= run_shape<PF_QTYPE_Q6_K>(m, s[0], s[1], check_only, cb, rng);
            }
    }
    CB(cublasDestroy(cb));
    return ok ? 0 : 1;
}
