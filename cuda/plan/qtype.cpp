// qtype.cpp — see qtype.h; also pf_qtype_name. Host-only (the GGUF reader and the fuzzers use it).
#include "plan/qtype.h"

#include <climits>

#include "base/error.h"

namespace pf {

bool qtype_block(int32_t qtype, int64_t *elems, int64_t *bytes) {
    switch (qtype) {
        case PF_QTYPE_F32: *elems = 1; *bytes = 4; return true;
        case PF_QTYPE_F16: *elems = 1; *bytes = 2; return true;
        case PF_QTYPE_BF16: *elems = 1; *bytes = 2; return true;
        case PF_QTYPE_Q4_0: *elems = 32; *bytes = 18; return true;
        case PF_QTYPE_Q8_0: *elems = 32; *bytes = 34; return true;
        case PF_QTYPE_Q4_K: *elems = 256; *bytes = 144; return true;
        case PF_QTYPE_Q5_K: *elems = 256; *bytes = 176; return true;
        case PF_QTYPE_Q6_K: *elems = 256; *bytes = 210; return true;
        case PF_QTYPE_IQ4_XS: *elems = 256; *bytes = 136; return true;
        default: return false;
    }
}

pf_status matrix_bytes(int32_t qtype, int64_t n, int64_t k, size_t *out, const char *what) {
    int64_t be = 0, bb = 0;
    if (!qtype_block(qtype, &be, &bb))
        return fail(PF_STATUS_UNSUPPORTED,
                    "%s: GGML type %d is not supported (supported: F32 0, F16 1, Q4_0 2, Q8_0 8, "
                    "Q4_K 12, Q5_K 13, Q6_K 14, IQ4_XS 23, BF16 30)",
                    what, (int)qtype);
    PF_CHECK_ARG(n > 0 && k > 0, "%s: shape n=%lld k=%lld must be positive", what, (long long)n,
                 (long long)k);
    PF_CHECK_ARG(k % be == 0, "%s: k=%lld is not a multiple of the %s block size %lld", what,
                 (long long)k, pf_qtype_name(qtype), (long long)be);
    const int64_t blocks_per_row = k / be;
    // n * blocks_per_row * bb must not overflow 63 bits.
    PF_CHECK_ARG(blocks_per_row <= INT64_MAX / bb && n <= INT64_MAX / (blocks_per_row * bb),
                 "%s: n=%lld x k=%lld overflows", what, (long long)n, (long long)k);
    *out = (size_t)(n * blocks_per_row * bb);
    return PF_STATUS_OK;
}

bool qtype_is_block(int32_t qtype) {
    switch (qtype) {
        case PF_QTYPE_Q4_0:
        case PF_QTYPE_Q8_0:
        case PF_QTYPE_Q4_K:
        case PF_QTYPE_Q5_K:
        case PF_QTYPE_Q6_K:
        case PF_QTYPE_IQ4_XS: return true;
        default: return false;
    }
}

}  // namespace pf

extern "C" PF_API const char *pf_qtype_name(int32_t qtype) {
    switch (qtype) {
        case PF_QTYPE_F32: return "F32";
        case PF_QTYPE_F16: return "F16";
        case PF_QTYPE_BF16: return "BF16";
        case PF_QTYPE_Q4_0: return "Q4_0";
        case PF_QTYPE_Q8_0: return "Q8_0";
        case PF_QTYPE_Q4_K: return "Q4_K";
        case PF_QTYPE_Q5_K: return "Q5_K";
        case PF_QTYPE_Q6_K: return "Q6_K";
        case PF_QTYPE_IQ4_XS: return "IQ4_XS";
        default: return "?";
    }
}
