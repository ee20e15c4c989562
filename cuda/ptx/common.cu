// common.cu — the host side of common.cuh: per-device set-up and the launch-failure message.
#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "ptx/common.cuh"
#include "ptx/hopper.cuh"

namespace pf {
namespace {

std::mutex g_device_mu;                                   // guards the three caches below
std::map<std::pair<int, cudaDeviceAttr>, int> g_attr;     // (device, attribute) -> value
std::map<std::pair<int, const void *>, int> g_smem;       // (device, kernel) -> dynamic smem allowed
std::map<std::pair<int, const void *>, int> g_value;      // (device, key) -> per_device_value

// An attribute of the current device, queried once per (device, attribute).
pf_status cached_device_attribute(cudaDeviceAttr attr, int *out) {
    int dev = 0;
    PF_CUDA_TRY(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(g_device_mu);
    auto it = g_attr.find({dev, attr});
    if (it == g_attr.end()) {
        int n = 0;
        PF_CUDA_TRY(cudaDeviceGetAttribute(&n, attr, dev));
        it = g_attr.emplace(std::make_pair(dev, attr), n).first;
    }
    *out = it->second;
    return PF_STATUS_OK;
}

}  // namespace

pf_status device_sm_count(int *out) {
    return cached_device_attribute(cudaDevAttrMultiProcessorCount, out);
}

pf_status device_smem_optin(int *out) {
    return cached_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, out);
}

pf_status device_cc_major(int *out) {
    return cached_device_attribute(cudaDevAttrComputeCapabilityMajor, out);
}

int current_device() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
}

int per_device_value(const void *key, int (*query)()) {
    const int dev = current_device();
    if (dev < 0) return -1;
    std::lock_guard<std::mutex> lock(g_device_mu);
    auto it = g_value.find({dev, key});
    if (it == g_value.end()) it = g_value.emplace(std::make_pair(dev, key), query()).first;
    return it->second;
}

bool sm90a_kernels_available(int device) {
#ifdef PF_HAVE_SM90A
    // The sm_90a SASS runs on compute capability 9.0 only (the "a" features are not forward
    // compatible), and the TMA maps need the driver's encoder. Cached per device: the query is
    // cheap, but this runs on every call.
    constexpr int kMaxDevices = 64;
    static std::atomic<int> cache[kMaxDevices];  // 0 unknown, 1 no, 2 yes
    if (device < 0 || device >= kMaxDevices) return false;
    int v = cache[device].load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0, minor = 0;
        const bool ok =
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
        (void)cudaGetLastError();
        v = ok && major == 9 && minor == 0 && hopper::tensor_map_encoder() != nullptr ? 2 : 1;
        cache[device].store(v, std::memory_order_relaxed);
    }
    return v == 2;
#else
    (void)device;
    return false;
#endif
}

pf_status set_max_dynamic_smem(const void *kernel, int bytes, const char *name) {
    int dev = 0;
    PF_CUDA_TRY(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(g_device_mu);
    int &allowed = g_smem[{dev, kernel}];  // 0 for a new entry
    if (allowed >= bytes) return PF_STATUS_OK;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess) {
        char what[160];
        std::snprintf(what, sizeof what, "%s: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d)",
                      name, bytes);
        return cuda_fail(e, __FILE__, __LINE__, what);
    }
    allowed = bytes;
    return PF_STATUS_OK;
}

pf_status launch_fail(cudaError_t e, const char *file, int line, const char *fmt, ...) {
    char kernel[128];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(kernel, sizeof kernel, fmt, ap);
    va_end(ap);
    char what[160];
    std::snprintf(what, sizeof what, "launch of %s", kernel);
    return cuda_fail(e, file, line, what);
}

}  // namespace pf
