// common.cu — the host side of common.cuh: the launch-failure message.
#include <cstdarg>
#include <cstdio>

#include "common.cuh"

namespace pf {

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
