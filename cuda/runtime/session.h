// session.h — pf_session: one sequence (sequence.h: its KV rows, conv windows, recurrent states
// and position, all sized at creation) and, for pf_session_prefill, its own executor
// (executor.h). The state is what a batch item reads and writes in place; the executor is what
// runs it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "runtime/executor.h"
#include "runtime/model.h"
#include "runtime/sequence.h"

struct pf_session {
    pf::CtxRef ref;                       // first: the last member to go
    pf_model *model = nullptr;
    pf_context *ctx = nullptr;
    pf_session_options opts{};            // as created (pf_session_fork makes another)
    pf::Sequence seq;
    pf::ExecPlan plan;                    // resolved at creation from the options (plan.h)
    // pf_session_prefill's executor (none with own_executor 0); a fork shares its source's, as
    // both run on the context's one stream and a step graph is keyed by its sequence.
    std::shared_ptr<pf::Executor> exec;
};

namespace pf {
// A new session of m with options o; `like` (optional, a session of m made with the same options):
// share its executor instead of making one, and leave the state unzeroed (the caller copies
// into it: pf_session_fork).
pf_status session_create(pf_model *m, const pf_session_options &o, pf_session **out, const pf_session *like = nullptr);
void session_destroy(pf_session *s);
// Runs n tokens (checked by the API: prefill_check) through s's executor from its position.
pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode, float *logits,
                          int32_t *out_token);
pf_status session_reset(pf_session *s);
size_t session_state_size(const pf_session *s);
pf_status session_save(pf_session *s, void *dst, size_t bytes);
pf_status session_restore(pf_session *s, const void *src, size_t bytes);
pf_status session_copy(pf_session *dst, const pf_session *src);
pf_status session_copy_prefix(pf_session *dst, const pf_session *src, int64_t pos);
pf_status session_rollback(pf_session *s, int64_t pos);
}  // namespace pf
