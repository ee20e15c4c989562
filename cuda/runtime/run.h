// run.h — running items (sequences with tokens and wanted outputs) through an executor: the one
// path of pf_session_prefill (one item, the session's executor) and of pf_batch (many items, the
// batch's executor). plan/batch_plan.h cuts the items into steps; this runs the steps, writes the
// outputs, advances the positions and keeps the snapshots.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "plan/batch_plan.h"
#include "runtime/executor.h"
#include "runtime/sequence.h"

namespace pf {

// One item of a run.
struct RunItem {
    Sequence *seq = nullptr;
    const int32_t *tokens = nullptr;  // host, read when the run is planned
    int64_t n = 0;
    int32_t mode = PF_LOGITS_NONE;
    float *logits = nullptr;          // host: [V] (LAST) or [n][V] (ALL)
    int32_t *out_token = nullptr;     // host, may be NULL
    int64_t planned_pos = 0;          // the sequence's position when the run was planned
    // Absolute positions, ascending: the item's steps end at each of them (besides its
    // sequence's snap_every multiples) and at_cut(seq, stream) runs, in stream order, after each
    // step that ends at one (the prefix cache's snapshot plan: runtime/prefix_cache.h).
    std::vector<int64_t> cuts;
    std::function<pf_status(Sequence &, cudaStream_t)> at_cut;
};

// A planned run: the items, their steps and their ids in step order.
struct RunPlan {
    std::vector<RunItem> items;
    std::vector<StepPlan> steps;
    std::vector<int32_t> ids;
};

// Plans `items` (already checked) for steps of e's rows and items.
RunPlan run_plan(const Executor &e, std::vector<RunItem> items);
// Runs a plan on e: every step's launches, each item's outputs (LAST / ALL logits, the greedy token
// after its last row, which also becomes its sequence's last_token), positions, snapshots (every
// snap_every positions and at the end). On failure the items' sequences are marked broken.
pf_status run_execute(Executor *e, RunPlan &plan);

}  // namespace pf

