// batch_plan.h — the host half of a batch (issue 28): the checks of pf_batch_plan's items and the
// cutting of the items into steps. Host-only (no CUDA): the batch fuzz target runs both on
// arbitrary bytes, and every caller (a batch, a session's own prefill) plans through them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "prefill.h"

namespace pf {

// What the checks see of one item: its session as plain facts, and the item's fields.
struct ItemFacts {
    const void *session = nullptr;  // identity (NULL: the item has none)
    const void *model = nullptr;    // the session's model
    int32_t kv_dtype = 0;
    bool broken = false;            // a device fault earlier: unusable until reset
    bool batchable = true;          // false: not a session of a batch's kind (kept for messages)
    int64_t pos = 0, capacity = 0;  // the session's position and capacity
    const int32_t *tokens = nullptr;
    int32_t n_tokens = 0;
    int32_t logits_mode = 0;
    const float *logits = nullptr;
    size_t logits_len = 0;
};

// What a batch allows.
struct BatchLimits {
    const void *model = nullptr;
    int32_t kv_dtype = 0;
    int64_t n_vocab = 0;
    int32_t max_items = 0;
    int64_t max_tokens = 0;
    int64_t max_context = 0;        // the largest capacity a session may have (0: any)
};

// Every check of pf_batch_plan, in one order (the count, then item by item: the session, the
// tokens' count and capacity, the mode and its buffer, every token id; then sessions named
// twice): INVALID_ARGUMENT naming `fn`, the item index and the field.
pf_status batch_check(const ItemFacts *items, int32_t n, const BatchLimits &lim, const char *fn);

// One item's share of a step: its rows [row0, row0 + rows) of the step, which are its tokens
// [done, done + rows).
struct Frag {
    int32_t item = 0;
    int64_t row0 = 0, rows = 0, done = 0;
};
struct StepPlan {
    std::vector<Frag> frags;        // row order; an item at most once per step
    int64_t rows = 0;
    int64_t ids_off = 0;            // where the step's ids start (the steps' ids back to back)
};

// What the cutter needs of an item: its tokens, its sequence's position and the positions its
// steps must end at: every `snap_every` positions (a multiple of 64, 0 = none) and each of `cuts`
// (absolute positions, ascending; those outside (pos, pos + n) change nothing: the prefix cache's
// snapshot plan, runtime/prefix_cache.h).
struct ItemShape {
    int64_t n = 0, pos = 0, snap_every = 0;
    std::vector<int64_t> cuts;
};

// Cuts items into steps of at most step_rows rows and max_items fragments: items in order, each
// taking what the step has left (an item longer than that continues in the next steps, its rows
// in order), a fragment ending where its sequence must snapshot and at each of its cuts. Every
// item's tokens are covered exactly once, in order. step_rows >= 1, max_items >= 1.
std::vector<StepPlan> plan_steps(const std::vector<ItemShape> &items, int64_t step_rows, int64_t max_items);

// The invariants of plan_steps' result (for the fuzz target and the tests): false and a reason.
bool steps_valid(const std::vector<ItemShape> &items, const std::vector<StepPlan> &steps, int64_t step_rows,
                 int64_t max_items, const char **why);

}  // namespace pf
