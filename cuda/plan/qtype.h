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
// Whether qtype is a GGUF block type (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS), not an element type.
bool qtype_is_block(int32_t qtype);

}  // namespace pf
