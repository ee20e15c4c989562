// bench_gemm_i8.cu — the 8-bit leg's GEMM kernel (gemm_i8_kernel.cuh) in its variants, timed on
// one device call: tile width, int32 -> fp32 conversion, one or two fragments per consumer, and
// the weight scales' form (per row and group, or rank-1). Within a form each variant's output
// must equal the form's first bit for bit (the same sums in the same order; both conversions are
// exact), and the first's 64 sampled outputs the float64 product of the codes and scales (1e-5 of
// the samples' RMS). Not a ctest: a tool for kernel work (scripts/device-check.sh part `int8`).
//   bench_gemm_i8 [--rank1] [M N K ...]   (default: the qwen35-27b shapes at 2048 and 8192 rows;
//                                         --rank1: the rank-1 weight form's variants only)
// Prints one line per variant: shape, variant, median ms of 10 runs, TOPS (2 M N K / time), and
// the mean of 40 launches back to back.
// Exit 77: no compute capability 9.0 device or no sm_90a code; 1: a mismatch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/gemm/gemm_i8_kernel.cuh"
#include "cuda_exit.h"

namespace {


using namespace pf;

struct Variant {
    const char *name;
    int bn, cm, cn;
    bool persistent;  // a grid of the clusters the device holds at once, not one per tile
    cudaError_t (*launch)(const i8k::Maps &, const i8k::I8GemmArgs &, cudaStream_t, int);
    int (*max_clusters)();
    const void *kernel;
    size_t smem;
};

template <int BN, int Conv, bool Two, bool R1 = false, int CM = 1, int CN = 1>
Variant variant(const char *name, bool persistent = false) {
    return {name, BN, CM, CN, persistent, &i8k::launch<BN, Conv, Two, R1, CM, CN>,
            &i8k::max_active_clusters<BN, Conv, Two, R1, CM, CN>,
            reinterpret_cast<const void *>(&i8k::gemm_i8_kernel<BN, Conv, Two, R1, CM, CN>),
            i8k::i8_smem_bytes<BN, R1>()};
}

struct Operand {
    I8Mat m;
    std::vector<int8_t> q;
    std::vector<float> s, r;
    double scale(int64_t g, int64_t row) const {  // the fp32 scale the kernel applies
        if (r.empty()) return s[size_t(g * m.lds + row)];
        return double(r[size_t(row)] * s[size_t(g * m.lds + row / kI8Group)]);
    }
};

// rank1: the rank-1 weight form (a factor per row, one per 128 rows and group).
Operand make_operand(int64_t rows, int64_t k, std::mt19937 &rng, bool rank1 = false) {
    Operand o;
    const int64_t cols = rank1 ? (rows + kI8Group - 1) / kI8Group : rows;
    const int64_t ldq = i8_code_ld(k), lds = i8_scale_ld(cols), G = i8_groups(k);
    o.q.assign(size_t(rows * ldq), 0);
    o.s.assign(size_t(G * lds), 0.f);
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> scale(0.5e-2f, 1.5e-2f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c) o.q[size_t(r * ldq + c)] = int8_t(code(rng));
    for (int64_t g = 0; g < G; ++g)
        for (int64_t r = 0; r < cols; ++r) o.s[size_t(g * lds + r)] = scale(rng);
    CK(cudaMalloc(&o.m.q, o.q.size()));
    CK(cudaMalloc(&o.m.s, o.s.size() * sizeof(float)));
    CK(cudaMemcpy(o.m.q, o.q.data(), o.q.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(o.m.s, o.s.data(), o.s.size() * sizeof(float), cudaMemcpyHostToDevice));
    if (rank1) {
        o.r.resize(size_t(rows));
        for (auto &v : o.r) v = scale(rng) * 100.f;
        CK(cudaMalloc(&o.m.r, o.r.size() * sizeof(float)));
        CK(cudaMemcpy(o.m.r, o.r.data(), o.r.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    o.m.ldq = ldq;
    o.m.lds = lds;
    return o;
}

double reference(const Operand &a, const Operand &w, int64_t r, int64_t c, int64_t k) {
    double y = 0;
    for (int64_t g = 0; g < i8_groups(k); ++g) {
        long long p = 0;
        for (int64_t j = g * kI8Group; j < std::min<int64_t>(k, (g + 1) * kI8Group); ++j)
            p += (long long)a.q[size_t(r * a.m.ldq + j)] * w.q[size_t(c * w.m.ldq + j)];
        y += double(p) * a.scale(g, r) * w.scale(g, c);
    }
    return y;
}

int run_shape(int64_t M, int64_t N, int64_t K, const std::vector<Variant> &vs, bool rank1) {
    std::mt19937 rng(uint32_t(M * 7 + N * 3 + K));
    Operand a = make_operand(M, K, rng), w = make_operand(N, K, rng, rank1);
    float *y = nullptr;
    CK(cudaMalloc(&y, size_t(M * N) * sizeof(float)));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> first, out(size_t(M * N));
    int bad = 0;
    for (const Variant &v : vs) {
        CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.smem)));
        i8k::Maps maps;
        if (i8k::make_maps(&maps, a.m, w.m, M, N, K, v.bn, v.cm, v.cn) != CUDA_SUCCESS) {
            std::fprintf(stderr, "tensor map encoding failed\n");
            return 1;
        }
        const int clusters = v.persistent ? v.max_clusters() : 0;
        if (v.persistent && clusters <= 0) {
            std::printf("  %s: cudaOccupancyMaxActiveClusters failed\n", v.name);
            ++bad;
            continue;
        }
        const i8k::I8GemmArgs f = i8k::make_args(M, N, K, y, N, false, v.bn, w.m.r);
        CK(cudaMemsetAsync(y, 0xFF, size_t(M * N) * sizeof(float), st));  // NaN: unwritten fails
        for (int i = 0; i < 2; ++i) CK(v.launch(maps, f, st, clusters));
        std::vector<float> ms;
        for (int i = 0; i < 10; ++i) {
            CK(cudaEventRecord(e0, st));
            CK(v.launch(maps, f, st, clusters));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float t = 0;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = 0.5 * (ms[4] + ms[5]);
        // Sustained: 40 launches back to back (about 0.1 s at the 27B shapes), the mean; a
        // power- or clock-bound device shows here what the 10 spaced launches above hide.
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 40; ++i) CK(v.launch(maps, f, st, clusters));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float sus = 0;
        CK(cudaEventElapsedTime(&sus, e0, e1));
        sus /= 40;
        CK(cudaMemcpy(out.data(), y, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
        const char *check = "";
        if (first.empty()) {
            first = out;
            std::mt19937 pick(1);
            double worst = 0, rms = 0;
            std::vector<double> err;
            for (int i = 0; i < 64; ++i) {
                const int64_t r = int64_t(pick() % uint32_t(M)), c = int64_t(pick() % uint32_t(N));
                const double want = reference(a, w, r, c, K), got = out[size_t(r * N + c)];
                rms += want * want / 64;
                err.push_back(std::fabs(got - want));
            }
            for (double e : err) worst = std::max(worst, e / std::sqrt(rms));
            if (!(worst <= 1e-5)) {
                std::printf("  MISMATCH vs float64: worst error %.3g of the samples' RMS\n", worst);
                ++bad;
            }
            check = "ref ok";
        } else if (std::memcmp(first.data(), out.data(), out.size() * sizeof(float)) != 0) {
            check = "DIFFERS";
            ++bad;
        } else {
            check = "bitwise";
        }
        std::printf("%6lld %6lld %6lld  %-18s %8.3f ms %7.1f TOPS  sustained %8.3f ms %7.1f TOPS  %s\n",
                    (long long)M, (long long)N, (long long)K, v.name, med,
                    2.0 * M * N * K / (med * 1e-3) / 1e12, sus, 2.0 * M * N * K / (sus * 1e-3) / 1e12, check);
        std::fflush(stdout);
    }
    CK(cudaFree(y));
    CK(cudaFree(a.m.q));
    CK(cudaFree(a.m.s));
    CK(cudaFree(w.m.q));
    CK(cudaFree(w.m.s));
    if (w.m.r) CK(cudaFree(w.m.r));
    CK(cudaStreamDestroy(st));
    return bad;
}

}  // namespace

int main(int argc, char **argv) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        major != 9 || minor != 0 || !hopper::tensor_map_encoder()) {
        std::printf("skipped: needs a compute capability 9.0 device and the driver's TMA encoder\n");
        return 77;
    }
    const std::vector<Variant> per_row = {
        variant<128, i8k::kI8Cvt, true>("128 cvt two"),
        variant<128, i8k::kI8Magic, true>("128 magic two"),
        variant<128, i8k::kI8Cvt, false>("128 cvt one"),
        variant<192, i8k::kI8Cvt, false>("192 cvt one"),
    };
    const std::vector<Variant> rank1 = {
        variant<128, i8k::kI8Cvt, true, true>("r1 128 cvt two"),
        variant<128, i8k::kI8Magic, true, true>("r1 128 magic two"),
        variant<128, i8k::kI8Cvt, false, true>("r1 128 cvt one"),
        variant<128, i8k::kI8Cvt, true, true>("r1 two persist", true),
        variant<128, i8k::kI8Cvt, true, true, 2, 1>("r1 two c2x1"),
        variant<128, i8k::kI8Cvt, true, true, 2, 1>("r1 two c2x1 pers", true),
        variant<128, i8k::kI8Cvt, true, true, 1, 2>("r1 two c1x2 pers", true),
        variant<128, i8k::kI8Cvt, true, true, 2, 2>("r1 two c2x2 pers", true),
    };
    std::vector<int64_t> shapes;
    bool only_rank1 = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--rank1") == 0) {
            only_rank1 = true;
            continue;
        }
        shapes.push_back(std::atoll(argv[i]));
    }
    if (shapes.empty()) shapes = {8192, 34816, 5120, 8192, 5120, 17408, 2048, 34816, 5120};
    int bad = 0;
    for (size_t i = 0; i + 2 < shapes.size(); i += 3) {
        if (!only_rank1) bad += run_shape(shapes[i], shapes[i + 1], shapes[i + 2], per_row, false);
        bad += run_shape(shapes[i], shapes[i + 1], shapes[i + 2], rank1, true);
    }
    return bad ? 1 : 0;
}
