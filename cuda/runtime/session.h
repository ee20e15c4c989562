// session.h — pf_session: one sequence (its KV rows, conv windows, recurrent states and position,
// all sized at creation) and, for pf_session_prefill, its own chunk executor (executor.h). The
// state is what a batch item reads and writes in place; the executor is what runs it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "runtime/executor.h"
#include "runtime/model.h"

namespace pf {

// A snapshot held on the device: the recurrent state (every GDN layer's conv window and state)
// at position pos, in slot `slot` of the sequence's snapshot memory.
struct Snapshot {
    int64_t pos = 0;
    int32_t last_token = -1;  // the greedy token after pos when known (a snapshot at a call's end)
    int32_t slot = 0;
};

// One sequence's state, and nothing else.
struct Sequence {
    const pf_model *model = nullptr;
    uint64_t id = 0;                      // unique in the process: the step graphs' key (a freed
                                          // sequence's address can come back with new memory)
    int32_t max_tokens = 0;               // capacity in positions
    int32_t kv_dtype = PF_KV_F16;
    int64_t pos = 0;
    int32_t last_token = -1;              // greedy token after the last position (for generate)
    bool broken = false;                  // a device fault mid-step: state unknown until reset
    std::vector<void *> k_cache, v_cache; // per attention layer [max_tokens][kv_dim]
    std::vector<float *> conv, ssm;       // per layer (GDN layers only; nullptr otherwise)
    void *mem = nullptr;                  // the one allocation all of the above lie in (the
    size_t mem_bytes = 0;                 // context's sequence pool)
    // Snapshots (pf_session_options.snapshot_*): every snap_every positions (0: never), at the
    // end of a call, in snap_slots slots of snap_bytes (one allocation), oldest first.
    int64_t snap_every = 0;
    bool snap_at_end = false;
    int32_t snap_slots = 0;
    size_t snap_bytes = 0;
    char *snap_mem = nullptr;
    std::vector<Snapshot> snaps;          // held, ascending positions
};

// The device bytes of one snapshot of m's recurrent state (0 for a model without GDN layers).
size_t snapshot_bytes(const pf_model *m);
// Keeps q's recurrent state at its position now (after the work queued on `stream`): into a free
// slot, or the oldest's. Asynchronous.
pf_status snapshot_take(Sequence &q, int32_t last_token, cudaStream_t stream);
// Copies src's state into dst (same model and KV dtype, capacity >= src.pos), asynchronously.
pf_status sequence_copy(Sequence &dst, const Sequence &src, cudaStream_t stream);

}  // namespace pf

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
pf_status session_prefill(pf_session *s, const int32_t *tokens, int32_t n, int32_t mode,
                          float *logits, size_t logits_len, int32_t *out_token);
pf_status session_reset(pf_session *s);
size_t session_state_size(const pf_session *s);
pf_status session_save(pf_session *s, void *dst, size_t bytes);
pf_status session_restore(pf_session *s, const void *src, size_t bytes);
pf_status session_copy(pf_session *dst, const pf_session *src);
pf_status session_rollback(pf_session *s, int64_t pos);
}  // namespace pf
