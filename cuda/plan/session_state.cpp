// session_state.cpp — see session_state.h.
#include "plan/session_state.h"

#include <cstring>

#include "base/error.h"

namespace pf {
namespace {
constexpr char kStateMagic[8] = {'P', 'F', 'S', 'T', 'A', 'T', 'E', '1'};
}  // namespace

size_t state_kv_elem(int32_t kv_dtype) { return kv_dtype == PF_KV_F32 ? 4 : 2; }

size_t state_bytes(const StateLayout &l, int64_t pos) {
    const size_t kv = size_t(pos) * size_t(l.kv_dim) * state_kv_elem(l.kv_dtype) * 2 * size_t(l.n_attn);
    const size_t gdn = size_t(l.n_gdn) * 4 * size_t(l.conv_floats + l.ssm_floats);
    return sizeof(StateHeader) + kv + gdn;
}

StateHeader state_header(const StateLayout &l, int64_t pos, int32_t last_token) {
    StateHeader h;
    std::memcpy(h.magic, kStateMagic, 8);
    h.fingerprint = l.fingerprint;
    h.pos = pos;
    h.kv_dtype = l.kv_dtype;
    h.n_attn = l.n_attn;
    h.n_gdn = l.n_gdn;
    h.last_token = last_token;
    h.kv_dim = l.kv_dim;
    h.conv_floats = l.conv_floats;
    h.ssm_floats = l.ssm_floats;
    return h;
}

std::vector<StateSpan> state_spans(const StateLayout &l, int64_t pos) {
    std::vector<StateSpan> out;
    out.reserve(size_t(2 * l.n_attn + 2 * l.n_gdn));
    size_t off = sizeof(StateHeader);
    const size_t kv_rows = size_t(pos) * size_t(l.kv_dim) * state_kv_elem(l.kv_dtype);
    for (int32_t i = 0; i < l.n_attn; i++) {
        out.push_back({StateSpan::K, i, off, kv_rows});
        off += kv_rows;
        out.push_back({StateSpan::V, i, off, kv_rows});
        off += kv_rows;
    }
    for (int32_t i = 0; i < l.n_gdn; i++) {
        out.push_back({StateSpan::Conv, i, off, size_t(l.conv_floats) * 4});
        off += size_t(l.conv_floats) * 4;
        out.push_back({StateSpan::Ssm, i, off, size_t(l.ssm_floats) * 4});
        off += size_t(l.ssm_floats) * 4;
    }
    return out;
}

pf_status state_check(const void *src, size_t bytes, const StateLayout &want, StateHeader *out) {
    PF_CHECK_ARG(src != nullptr, "pf_session_restore: src is NULL");
    PF_CHECK_ARG(bytes >= sizeof(StateHeader), "pf_session_restore: %zu bytes is too short for a state", bytes);
    StateHeader h;
    std::memcpy(&h, src, sizeof h);
    PF_CHECK_ARG(std::memcmp(h.magic, kStateMagic, 8) == 0, "pf_session_restore: not a pyprefill session state");
    PF_CHECK_ARG(h.fingerprint == want.fingerprint, "pf_session_restore: the state was saved from another model");
    PF_CHECK_ARG(h.kv_dtype == want.kv_dtype,
                 "pf_session_restore: the state's KV dtype (%d) differs from the session's (%d)", h.kv_dtype,
                 want.kv_dtype);
    PF_CHECK_ARG(h.pos >= 0 && h.pos <= want.max_tokens,
                 "pf_session_restore: the state holds %lld positions, the session's capacity is %lld",
                 (long long)h.pos, (long long)want.max_tokens);
    PF_CHECK_ARG(h.n_attn == want.n_attn && h.n_gdn == want.n_gdn && h.kv_dim == want.kv_dim &&
                     h.conv_floats == want.conv_floats && h.ssm_floats == want.ssm_floats,
                 "pf_session_restore: the state's layout does not match this model");
    // The greedy token generate would feed next: -1 (none yet) or a token of this model. A
    // crafted one used to be accepted and failed only at the next generate (found by fuzz_state).
    PF_CHECK_ARG(h.last_token >= -1 && h.last_token < want.n_vocab,
                 "pf_session_restore: the state's next token %d is outside the vocabulary [0, %lld)",
                 h.last_token, (long long)want.n_vocab);
    const size_t need = state_bytes(want, h.pos);
    PF_CHECK_ARG(bytes == need, "pf_session_restore: %zu bytes, a state of %lld positions has %zu", bytes,
                 (long long)h.pos, need);
    *out = h;
    return PF_STATUS_OK;
}

}  // namespace pf
