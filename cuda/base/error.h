// error.h — statuses, the thread-local last error, and the propagation macros.
// Nothing here throws across the C API: every extern "C" entry runs its body in pf::guard.
#pragma once

#include <cstdarg>
#include <cstring>
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

// Size-prefixed structs (options, reports): the caller passes the size it was compiled with,
// so a header/library skew is an ABI_MISMATCH instead of a write past the caller's struct.
// struct_init zeroes *s and sets its struct_size (the caller then sets defaults).
template <class T>
pf_status struct_init(T *s, size_t struct_size, const char *fn, const char *type) {
    if (s == nullptr) return fail(PF_STATUS_INVALID_ARGUMENT, "%s: %s pointer is NULL", fn, type);
    if (struct_size != sizeof(T))
        return fail(PF_STATUS_ABI_MISMATCH,
                    "%s: struct_size=%zu but this library's %s has %zu bytes (header and library "
                    "differ: rebuild against this header)", fn, struct_size, type, sizeof(T));
    std::memset(static_cast<void *>(s), 0, sizeof(T));
    s->struct_size = sizeof(T);
    return PF_STATUS_OK;
}

// Checks a struct the caller filled (via its _init function, named by `init` when given)
// before the library reads it.
template <class T>
pf_status struct_check(const T *s, const char *fn, const char *name, const char *init = nullptr) {
    if (s->struct_size != sizeof(T))
        return fail(PF_STATUS_ABI_MISMATCH,
                    "%s: %s->struct_size=%zu, expected %zu (fill %s with %s)", fn, name,
                    s->struct_size, sizeof(T), name, init ? init : "its _init function");
    return PF_STATUS_OK;
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
