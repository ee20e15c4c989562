// session_state.h — the byte format of a saved session state and the checks a restore makes
// before it touches a session. Host-only: pf_session_save / pf_session_restore (session.cu) and
// the state fuzz target share it.
//
// Format: a 64-byte StateHeader, then per attention layer the K rows then the V rows of
// positions [0, pos) ([pos][kv_dim] of the KV dtype), then per GDN layer its conv window
// (conv_floats fp32) then its recurrent state (ssm_floats fp32). Native byte order. The header
// is checked against the session; the payload is data (not checksummed): only its size is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "prefill.h"

namespace pf {

// What a session expects of a state: its model's identity and shapes, its own KV dtype and
// capacity.
struct StateLayout {
    uint64_t fingerprint = 0;   // the model's (model_fingerprint)
    int32_t kv_dtype = 0;       // PF_KV_*
    int64_t max_tokens = 0;     // the session's capacity in positions
    int32_t n_attn = 0, n_gdn = 0;
    int64_t kv_dim = 0, conv_floats = 0, ssm_floats = 0;
    int64_t n_vocab = 0;        // a saved greedy token must be a token of the model (or -1)
};

struct StateHeader {
    char magic[8];          // "PFSTATE1"
    uint64_t fingerprint;   // the model's
    int64_t pos;
    int32_t kv_dtype;
    int32_t n_attn, n_gdn;
    int32_t last_token;
    int64_t kv_dim, conv_floats, ssm_floats;
};
static_assert(sizeof(StateHeader) == 64, "the state header is part of the saved format");

// One contiguous piece of the payload and where it goes: K or V rows of attention layer
// `index`, or the conv window / recurrent state of the index-th GDN layer.
struct StateSpan {
    enum Kind : int32_t { K, V, Conv, Ssm } kind;
    int32_t index;
    size_t offset;  // from the start of the state (header included)
    size_t bytes;
};

size_t state_kv_elem(int32_t kv_dtype);  // bytes of one KV element
// Bytes of a state of `pos` positions in this layout (header included).
size_t state_bytes(const StateLayout &l, int64_t pos);
StateHeader state_header(const StateLayout &l, int64_t pos, int32_t last_token);
// The payload's spans in order; they tile [sizeof(StateHeader), state_bytes(l, pos)).
std::vector<StateSpan> state_spans(const StateLayout &l, int64_t pos);
// Checks `bytes` bytes at `src` against `want` (magic, model, KV dtype, position within the
// capacity, shapes, greedy token in the vocabulary or -1, exact size) and returns the header in *out. INVALID_ARGUMENT
// naming the first mismatch; nothing is read past src + bytes.
pf_status state_check(const void *src, size_t bytes, const StateLayout &want, StateHeader *out);

}  // namespace pf
