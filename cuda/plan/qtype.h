// qtype.h — GGML quantization types: block geometry and matrix byte counts. Host-only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "prefill.h"

namespace pf {

// Block geometry of a GGML type: elements and bytes per block. False for unsupported ids.
bool qtype_block(int32_t qtype, int64_t *elems, int64_t *bytes);
// Validates (qtype, n, k) and returns the matrix byte count; fails with a message naming `what`.
pf_status matrix_bytes(int32_t qtype, int64_t n, int64_t k, size_t *out, const char *what);

}  // namespace pf
