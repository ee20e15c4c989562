// session.h — pf_session: one sequence (its KV rows, conv windows, recurrent states and position,
// all sized at creation) and, for pf_session_prefill, its own chunk executor (executor.h). The
// state is what a batch item reads and writes in place; the executor is what runs it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "executor.h"
#include "model.h"

namespace pf {

// One sequence's state, and nothing else.
struct Sequence {
    int32_t max_tokens = 0;               // capacity in positions
    int32_t kv_dtype = PF_KV_F16;
    int64_t pos = 0;
    int32_t last_token = -1;              // greedy token after the last position (for generate)
    bool broken = false;                  // a device fault mid-step: state unknown until reset
    std::vector<void *> k_cache, v_cache; // per attention layer [max_tokens][kv_dim]
    std::vector<float *> conv, ssm;       // per layer (GDN layers only; nullptr otherwise)
    std::vector<std::pair<void *, size_t>> allocs;
};

}  // namespace pf

struct pf_session {
    pf_model *model = nullptr;
    pf_context *ctx = nullptr;
    pf::Sequence seq;
    pf::ExecPlan plan;                    // resolved at creation from the options (plan.h)
    std::unique_ptr<pf::Executor> exec;   // pf_session_prefill's executor (owned)
};

namespace pf {
pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out);
void session_destroy(pf_session *s);
pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                          float *logits, size_t logits_len, int32_t *out_token);
pf_status session_reset(pf_session *s);
size_t session_state_size(const pf_session *s);
pf_status session_save(pf_session *s, void *dst, size_t bytes);
pf_status session_restore(pf_session *s, const void *src, size_t bytes);
}  // namespace pf
