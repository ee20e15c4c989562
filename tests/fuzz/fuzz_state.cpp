// fuzz_state.cpp — libFuzzer target: the checks pf_session_restore makes on a saved state
// before it touches the session (state_check), and the copy plan it then follows
// (state_spans), on arbitrary bytes against a few session layouts (attention only, hybrid,
// fp32 KV). Contract checked beyond "no crash, no leak, no UB": a failure is INVALID_ARGUMENT
// with a message; an accepted state matches the session in every header field, holds a
// greedy token of the model (or none), has the very header a save would write, and its spans
// tile the input exactly and fit the session's buffers (copied here into host buffers of the
// session's capacity, under ASan).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/error.h"
#define PF_FUZZ_TARGET "fuzz_state"
#include "fuzz_common.h"
#include "plan/session_state.h"

namespace {

// Small stand-ins for the tiny test models: (fingerprint, kv dtype, capacity, attention
// layers, GDN layers, kv_dim, conv floats, ssm floats, vocabulary). Seeds are states of these.
const pf::StateLayout kLayouts[] = {
    {0x1111222233334444ull, PF_KV_F16, 8, 2, 0, 16, 0, 0, 64},   // qwen3-like
    {0x5555666677778888ull, PF_KV_F16, 6, 1, 3, 8, 24, 32, 64},  // qwen35-like
    {0x5555666677778888ull, PF_KV_F32, 4, 1, 3, 8, 24, 32, 64},  // the same model, fp32 KV
};

// A session's buffers on the host: the KV caches at full capacity, the GDN windows and states.
struct HostSession {
    std::vector<std::vector<uint8_t>> k, v, conv, ssm;
    explicit HostSession(const pf::StateLayout &l) {
        const size_t kv = size_t(l.max_tokens) * size_t(l.kv_dim) * pf::state_kv_elem(l.kv_dtype);
        k.assign(size_t(l.n_attn), std::vector<uint8_t>(kv));
        v.assign(size_t(l.n_attn), std::vector<uint8_t>(kv));
        conv.assign(size_t(l.n_gdn), std::vector<uint8_t>(size_t(l.conv_floats) * 4));
        ssm.assign(size_t(l.n_gdn), std::vector<uint8_t>(size_t(l.ssm_floats) * 4));
    }
    std::vector<uint8_t> &target(const pf::StateSpan &sp) {
        auto &set = sp.kind == pf::StateSpan::K ? k : sp.kind == pf::StateSpan::V ? v
                  : sp.kind == pf::StateSpan::Conv ? conv : ssm;
        if (sp.index < 0 || size_t(sp.index) >= set.size()) broken("a span for a layer that does not exist");
        return set[size_t(sp.index)];
    }
};

void restore_into(const uint8_t *data, size_t size, const pf::StateLayout &l) {
    pf::StateHeader h;
    const pf_status s = pf::guard("fuzz_state", [&] { return pf::state_check(data, size, l, &h); });
    if (s != PF_STATUS_OK) {
        if (s != PF_STATUS_INVALID_ARGUMENT) broken(pf_status_name(s));
        if (pf_last_error()[0] == '\0') broken("a failure without a message");
        return;
    }
    if (h.pos < 0 || h.pos > l.max_tokens) broken("a position beyond the capacity");
    if (h.kv_dtype != l.kv_dtype || h.fingerprint != l.fingerprint || h.n_attn != l.n_attn ||
        h.n_gdn != l.n_gdn || h.kv_dim != l.kv_dim || h.conv_floats != l.conv_floats ||
        h.ssm_floats != l.ssm_floats)
        broken("a header field that differs from the session");
    if (h.last_token < -1 || h.last_token >= l.n_vocab) broken("a greedy token outside the vocabulary");
    const pf::StateHeader saved = pf::state_header(l, h.pos, h.last_token);
    if (std::memcmp(&saved, &h, sizeof h) != 0) broken("an accepted header that a save would not write");
    HostSession dev(l);
    size_t at = sizeof(pf::StateHeader);
    for (const pf::StateSpan &sp : pf::state_spans(l, h.pos)) {
        if (sp.offset != at || sp.bytes > size - at) broken("spans that do not tile the state");
        std::vector<uint8_t> &dst = dev.target(sp);
        if (sp.bytes > dst.size()) broken("a span larger than the session's buffer");
        std::memcpy(dst.data(), data + sp.offset, sp.bytes);
        at += sp.bytes;
    }
    if (at != size) broken("bytes left over after the last span");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (const pf::StateLayout &l : kLayouts) restore_into(data, size, l);
    return 0;
}
