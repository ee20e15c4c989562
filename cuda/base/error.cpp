// error.cpp — pf_last_error (per thread, unlike NCCL's global) and the status names. Host-only
// (no CUDA), so that the host-only parsers (gguf.cpp, model_plan.cpp, session_state.cpp) link
// without the CUDA runtime, e.g. into the fuzz targets; the CUDA/cuBLAS mapping is in error.cu.
#include <cstring>
#include <cstdio>

#include "base/error.h"

namespace {
thread_local char g_last_error[1024] = "";

const char *const kStatusNames[PF_STATUS_COUNT] = {
    "PF_STATUS_OK",          "PF_STATUS_INVALID_ARGUMENT", "PF_STATUS_UNSUPPORTED",
    "PF_STATUS_OUT_OF_MEMORY", "PF_STATUS_CUDA_ERROR",     "PF_STATUS_CUBLAS_ERROR",
    "PF_STATUS_IO_ERROR",    "PF_STATUS_ABI_MISMATCH",     "PF_STATUS_NO_DEVICE",
    "PF_STATUS_INTERNAL",    "PF_STATUS_FORMAT_ERROR",
};
const char *const kStatusStrings[PF_STATUS_COUNT] = {
    "success",
    "invalid argument (see pf_last_error() for which one)",
    "unsupported by this build (quantization type or architecture)",
    "out of memory (host or device); the context is still usable",
    "a CUDA runtime call failed (see pf_last_error())",
    "a cuBLAS call failed (see pf_last_error())",
    "a file cannot be read (missing, no permission, or not a regular file)",
    "options struct size differs between caller and library (rebuild against this header)",
    "no CUDA driver or device (or the device ordinal does not exist)",
    "internal error: please report it with the text of pf_last_error()",
    "not a well-formed GGUF of a supported model (truncated, malformed, or a tensor missing or "
    "of a wrong shape; see pf_last_error())",
};
}  // namespace

namespace pf {

pf_status fail(pf_status status, const char *fmt, ...) {
    // Formatted into a local buffer first: an argument may be pf_last_error() itself (a message
    // that wraps the previous one), which vsnprintf must not read while overwriting it.
    char text[sizeof g_last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    std::memcpy(g_last_error, text, sizeof text);
    return status;
}

}  // namespace pf

extern "C" PF_API const char *pf_last_error(void) { return g_last_error; }

extern "C" PF_API const char *pf_status_name(pf_status s) {
    return (s >= 0 && s < PF_STATUS_COUNT) ? kStatusNames[s] : "PF_STATUS_UNKNOWN";
}

extern "C" PF_API const char *pf_status_string(pf_status s) {
    return (s >= 0 && s < PF_STATUS_COUNT) ? kStatusStrings[s] : "unknown status code";
}
