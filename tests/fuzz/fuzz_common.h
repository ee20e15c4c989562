// fuzz_common.h — what the fuzz targets share: the contract-violation abort (named by target,
// with the library's last error) and a byte reader over the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "prefill.h"

#ifndef PF_FUZZ_TARGET
#error "define PF_FUZZ_TARGET (the target's name) before including fuzz_common.h"
#endif

namespace {

[[noreturn]] inline void broken(const char *what) {
    std::fprintf(stderr, PF_FUZZ_TARGET ": contract violated: %s (last error: %s)\n", what, pf_last_error());
    std::abort();
}

// Reads the input as a little stream of bytes (zeros past its end).
struct Reader {
    const uint8_t *p;
    size_t n, at = 0;
    uint8_t u8() { return at < n ? p[at++] : 0; }
    uint16_t u16() { return uint16_t(u8() | (u8() << 8)); }
    bool more() const { return at < n; }
};

}  // namespace
