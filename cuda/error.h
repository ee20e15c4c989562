// error.h — statuses, the thread-local last error, and the propagation macros.
// Nothing here throws across the C API: every extern "C" entry runs its body in pf::guard.
#pragma once

#include <cstdarg>
#include <exception>
#include <new>

#include "prefill.h"

namespace pf {

// Formats the message for pf_last_error() on this thread and returns `status`, so that call
// sites read: return pf::fail(PF_STATUS_INVALID_ARGUMENT, "rows=%lld < 0", (long long)rows);
pf_status fail(pf_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Runs `body` (returning pf_status) and turns any C++ exception into a status.
template <class Body>
pf_status guard(const char *fn, Body &&body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(PF_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    } catch (const std::exception &e) {
        return fail(PF_STATUS_INTERNAL, "%s: %s", fn, e.what());
    } catch (...) {
        return fail(PF_STATUS_INTERNAL, "%s: unknown exception", fn);
    }
}

}  // namespace pf

#define PF_TRY(expr)                                  \
    do {                                              \
        const pf_status pf_s_ = (expr);               \
        if (pf_s_ != PF_STATUS_OK) return pf_s_;      \
    } while (0)

#define PF_CHECK_ARG(cond, ...)                                                   \
    do {                                                                          \
        if (!(cond)) return pf::fail(PF_STATUS_INVALID_ARGUMENT, __VA_ARGS__);    \
    } while (0)
