// test_wgmma_layout.cu — the Hopper building blocks of the wgmma attention kernel, each checked on
// its own against a host reference, so that a wrong flash result can be traced to one of them:
//   1. TMA into the 128-byte swizzle: a [BN][128] fp16 tile loaded as two BN x 64 boxes and read
//      back through hopper::swizzled_offset must equal the source;
//   2. S = Q K^T (wgmma m64nBNk16, A and B from shared memory, both K-major, k over two swizzle
//      blocks: the 32-byte start-address steps and the block offsets);
//   3. O = P V (wgmma m64n128k16, P from registers in the mma A layout, V MN-major over two
//      64-column blocks: the LBO = BN * 128).
// For BN = 64 and 80 (the D = 256 kernel's key tiles; 80 is not a power of two: blocks of 10
// swizzle atoms). One warpgroup, one block. Exits 77 (ctest: skipped) without a compute capability 9.0 device or
// when this build holds no sm_90a code.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ptx/hopper.cuh"
#include "ptx/wgmma.cuh"

namespace {

constexpr int kM = 64;    // query rows (one warpgroup)
constexpr int kD = 128;   // head dim: two swizzle blocks
constexpr int kTileQ = kM * kD * 2;
template <int BN>
__host__ __device__ constexpr int tile_k_bytes() { return BN * kD * 2; }  // one K or V tile
template <int BN>
constexpr size_t smem_bytes() { return size_t(kTileQ) + 2 * tile_k_bytes<BN>() + 8 + 1024; }

struct ProbeArgs {
    const __half *q;  // [kM][kD]
    const __half *p;  // [kM][BN]
    __half *k_back;   // [BN][kD]: the K tile read back from shared memory
    float *s;         // [kM][BN]
    float *o;         // [kM][kD]
};

template <int BN>
__global__ void __launch_bounds__(128) probe_kernel(const __grid_constant__ ProbeArgs a,
                                                    const __grid_constant__ CUtensorMap tm_k,
                                                    const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace pf::hopper;
    constexpr int kTileK = tile_k_bytes<BN>();
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + kSwizzleAtom - 1) & ~uint32_t(kSwizzleAtom - 1);
    unsigned char *const base_ptr = smem_raw + (base - raw);
    const uint32_t sQ = base, sK = sQ + kTileQ, sV = sK + kTileK, bar = sV + kTileK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;

    if (tid == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        mbar_arrive_expect_tx(bar, 2 * kTileK);
        for (int b = 0; b < kD / kSwizzleCols; ++b) {
            tma_load_2d(sK + b * BN * kSwizzleRow, &tm_k, b * kSwizzleCols, 0, bar);
            tma_load_2d(sV + b * BN * kSwizzleRow, &tm_v, b * kSwizzleCols, 0, bar);
        }
    }
    for (int idx = tid; idx < kM * kD / 8; idx += 128) {
        const int r = idx / (kD / 8), c = idx % (kD / 8);
        *reinterpret_cast<uint4 *>(base_ptr + swizzled_offset(r, c, kM)) =
            *reinterpret_cast<const uint4 *>(a.q + r * kD + c * 8);
    }
    fence_proxy_async();
    __syncthreads();
    mbar_wait(bar, 0);

    // 1. the K tile back out of the swizzle
    for (int idx = tid; idx < BN * kD / 8; idx += 128) {
        const int r = idx / (kD / 8), c = idx % (kD / 8);
        *reinterpret_cast<uint4 *>(a.k_back + r * kD + c * 8) =
            *reinterpret_cast<const uint4 *>(base_ptr + kTileQ + swizzled_offset(r, c, BN));
    }

    // 2. S = Q K^T, exactly as the attention kernel's issue_qk addresses it
    float s[BN / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t koff = uint32_t(kk & 3) * 32;
        const uint64_t da = smem_desc(sQ + uint32_t(kk >> 2) * kM * kSwizzleRow + koff, 16, kSwizzleAtom);
        const uint64_t db = smem_desc(sK + uint32_t(kk >> 2) * BN * kSwizzleRow + koff, 16, kSwizzleAtom);
        pf::wgmma::wgmma_ss<BN>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
        const int row = 16 * warp + gid + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * tig + (i & 1);
        a.s[row * BN + col] = s[i];
    }

    // 3. O = P V, P in the A-register layout, V MN-major as the kernel's issue_pv addresses it
    uint32_t p[BN / 16][4];
    const auto pk = [&](int r, int k) {
        return uint32_t(__half_as_ushort(a.p[r * BN + k])) |
               (uint32_t(__half_as_ushort(a.p[r * BN + k + 1])) << 16);
    };
    const int r0 = 16 * warp + gid, r1 = r0 + 8;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        const int k0 = 16 * kk + 2 * tig;
        p[kk][0] = pk(r0, k0);
        p[kk][1] = pk(r1, k0);
        p[kk][2] = pk(r0, k0 + 8);
        p[kk][3] = pk(r1, k0 + 8);
    }
    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        const uint64_t db = smem_desc(sV + uint32_t(kk) * 2 * kSwizzleAtom, uint32_t(BN) * kSwizzleRow,
                                      kSwizzleAtom);
        pf::wgmma::wgmma_rs<kD>(o, p[kk], db, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(p);
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) {
        const int row = 16 * warp + gid + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * tig + (i & 1);
        a.o[row * kD + col] = o[i];
    }
#endif
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        const cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

// Largest |out - ref| over max |ref|; prints the first bad element.
double compare(const char *what, const std::vector<double> &ref, const std::vector<float> &out,
               int cols) {
    double mx = 0, err = 0;
    for (double v : ref) mx = std::fmax(mx, std::fabs(v));
    int first = -1;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double e = std::fabs(double(out[i]) - ref[i]);
        if (!(e <= 1e-3 * mx) && first < 0) first = int(i);
        err = std::fmax(err, std::isnan(out[i]) ? INFINITY : e);
    }
    std::printf("%s: max error %.3e of max |ref| %.3e%s\n", what, err, mx, first < 0 ? "" : "  FAIL");
    if (first >= 0)
        std::printf("  first bad [%d][%d]: got %g, want %g\n", first / cols, first % cols,
                    double(out[first]), ref[first]);
    return first < 0 ? 0 : 1;
}

// Checks 1-3 for key tiles of BN; the number of failed checks, or 1 on a CUDA error.
template <int BN>
int run_case() {
    std::mt19937 gen(1234);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const auto fill = [&](std::vector<__half> &v) { for (auto &x : v) x = __float2half_rn(u(gen)); };
    std::vector<__half> q(kM * kD), k(BN * kD), v(BN * kD), p(kM * BN);
    fill(q), fill(k), fill(v), fill(p);

    __half *dq, *dk, *dv, *dp, *dkb;
    float *ds, *dout;
    CHECK(cudaMalloc(&dq, q.size() * 2));
    CHECK(cudaMalloc(&dk, k.size() * 2));
    CHECK(cudaMalloc(&dv, v.size() * 2));
    CHECK(cudaMalloc(&dp, p.size() * 2));
    CHECK(cudaMalloc(&dkb, k.size() * 2));
    CHECK(cudaMalloc(&ds, kM * BN * 4));
    CHECK(cudaMalloc(&dout, kM * kD * 4));
    CHECK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dp, p.data(), p.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dkb, 0xff, k.size() * 2));  // NaN poison
    CHECK(cudaMemset(ds, 0xff, kM * BN * 4));
    CHECK(cudaMemset(dout, 0xff, kM * kD * 4));

    CUtensorMap tm_k, tm_v;
    if (pf::hopper::encode_fp16_sw128(&tm_k, dk, kD, BN, BN) != CUDA_SUCCESS ||
        pf::hopper::encode_fp16_sw128(&tm_v, dv, kD, BN, BN) != CUDA_SUCCESS) {
        std::printf("cuTensorMapEncodeTiled failed: FAIL\n");
        return 1;
    }
    CHECK(cudaFuncSetAttribute(probe_kernel<BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(smem_bytes<BN>())));
    probe_kernel<BN><<<1, 128, smem_bytes<BN>()>>>(ProbeArgs{dq, dp, dkb, ds, dout}, tm_k, tm_v);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    std::vector<__half> kb(k.size());
    std::vector<float> s(kM * BN), o(kM * kD);
    CHECK(cudaMemcpy(kb.data(), dkb, kb.size() * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));

    std::vector<double> kref(k.size()), sref(s.size(), 0.0), oref(o.size(), 0.0);
    std::vector<float> kbf(k.size());
    for (size_t i = 0; i < k.size(); ++i) kref[i] = __half2float(k[i]), kbf[i] = __half2float(kb[i]);
    for (int r = 0; r < kM; ++r)
        for (int j = 0; j < BN; ++j)
            for (int d = 0; d < kD; ++d)
                sref[r * BN + j] += double(__half2float(q[r * kD + d])) * __half2float(k[j * kD + d]);
    for (int r = 0; r < kM; ++r)
        for (int d = 0; d < kD; ++d)
            for (int j = 0; j < BN; ++j)
                oref[r * kD + d] += double(__half2float(p[r * BN + j])) * __half2float(v[j * kD + d]);
    int bad = 0;
    std::printf("BN = %d\n", BN);
    bad += int(compare("1. TMA 128B swizzle read-back of K", kref, kbf, kD));
    bad += int(compare("2. S = Q K^T (SS, K-major, SW128)", sref, s, BN));
    bad += int(compare("3. O = P V (RS, V MN-major, SW128, LBO)", oref, o, kD));
    for (void *ptr : {(void *)dq, (void *)dk, (void *)dv, (void *)dp, (void *)dkb, (void *)ds,
                      (void *)dout})
        CHECK(cudaFree(ptr));
    return bad;
}

}  // namespace

int main() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        std::printf("no CUDA device: skipped\n");
        return 77;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, probe_kernel<64>));
    if (prop.major != 9 || prop.minor != 0 || fa.binaryVersion != 90) {
        std::printf("needs a compute capability 9.0 device and sm_90a code (device %d.%d, code %d): "
                    "skipped\n", prop.major, prop.minor, fa.binaryVersion);
        return 77;
    }
    if (!pf::hopper::tensor_map_encoder()) {
        std::printf("cuTensorMapEncodeTiled unavailable: FAIL\n");
        return 1;
    }

    const int bad = run_case<64>() + run_case<80>();
    std::printf(bad ? "FAIL\n" : "OK\n");
    return bad ? 1 : 0;
}
