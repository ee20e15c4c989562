// batch_plan.cpp — the checks of a batch's items and the cutting into steps (batch_plan.h).
#include "plan/batch_plan.h"

#include <algorithm>
#include <unordered_map>

#include "base/error.h"

namespace pf {

pf_status batch_check(const ItemFacts *items, int32_t n, const BatchLimits &lim, const char *fn) {
    PF_CHECK_ARG(n >= 1, "%s: n_items=%d: a batch needs at least one item", fn, n);
    PF_CHECK_ARG(n <= lim.max_items, "%s: n_items=%d exceeds the batch's max_items=%d", fn, n, lim.max_items);
    PF_CHECK_ARG(items != nullptr, "%s: items is NULL", fn);
    int64_t total = 0;
    for (int32_t i = 0; i < n; ++i) {
        const ItemFacts &it = items[i];
        PF_CHECK_ARG(it.session != nullptr, "%s: items[%d].session is NULL", fn, i);
        PF_CHECK_ARG(it.model == lim.model, "%s: items[%d].session belongs to another model", fn, i);
        PF_CHECK_ARG(it.batchable, "%s: items[%d].session cannot run in a batch", fn, i);
        PF_CHECK_ARG(it.kv_dtype == lim.kv_dtype, "%s: items[%d].session has kv_dtype=%d, the batch %d", fn, i,
                     it.kv_dtype, lim.kv_dtype);
        PF_CHECK_ARG(!it.broken, "%s: items[%d].session hit a device error earlier; reset it first", fn, i);
        PF_CHECK_ARG(lim.max_context <= 0 || it.capacity <= lim.max_context,
                     "%s: items[%d].session holds %lld positions, more than the batch's max_context=%lld", fn, i,
                     (long long)it.capacity, (long long)lim.max_context);
        PF_CHECK_ARG(it.n_tokens >= 1, "%s: items[%d].n_tokens=%d: an item needs at least one token", fn, i,
                     it.n_tokens);
        PF_CHECK_ARG(it.tokens != nullptr, "%s: items[%d].tokens is NULL", fn, i);
        PF_CHECK_ARG(it.pos + it.n_tokens <= it.capacity,
                     "%s: items[%d]: %d tokens at position %lld exceed its session's capacity of %lld", fn, i,
                     it.n_tokens, (long long)it.pos, (long long)it.capacity);
        total += it.n_tokens;
        PF_CHECK_ARG(total <= lim.max_tokens, "%s: items[0..%d] hold %lld tokens, more than the batch's "
                     "max_tokens=%lld", fn, i, (long long)total, (long long)lim.max_tokens);
        PF_CHECK_ARG(it.logits_mode >= PF_LOGITS_NONE && it.logits_mode <= PF_LOGITS_ALL,
                     "%s: items[%d].logits_mode=%d is not a pf_logits_mode", fn, i, it.logits_mode);
        const size_t need = it.logits_mode == PF_LOGITS_ALL    ? size_t(it.n_tokens) * size_t(lim.n_vocab)
                            : it.logits_mode == PF_LOGITS_LAST ? size_t(lim.n_vocab)
                                                               : 0;
        if (need) {
            PF_CHECK_ARG(it.logits != nullptr, "%s: items[%d].logits is NULL", fn, i);
            PF_CHECK_ARG(it.logits_len >= need, "%s: items[%d].logits_len=%zu, its mode needs %zu floats", fn, i,
                         it.logits_len, need);
        }
        for (int32_t t = 0; t < it.n_tokens; ++t)
            PF_CHECK_ARG(it.tokens[t] >= 0 && it.tokens[t] < lim.n_vocab,
                         "%s: items[%d].tokens[%d]=%d is outside the vocabulary [0, %lld)", fn, i, t, it.tokens[t],
                         (long long)lim.n_vocab);
    }
    std::unordered_map<const void *, int32_t> seen;
    seen.reserve(size_t(n));
    for (int32_t i = 0; i < n; ++i) {
        auto r = seen.emplace(items[i].session, i);
        PF_CHECK_ARG(r.second, "%s: items[%d] and items[%d] name the same session (one item per session)", fn,
                     r.first->second, i);
    }
    return PF_STATUS_OK;
}

std::vector<StepPlan> plan_steps(const std::vector<ItemShape> &items, int64_t step_rows, int64_t max_items) {
    std::vector<StepPlan> steps;
    std::vector<int64_t> done(items.size(), 0);
    size_t first = 0;  // items before it are complete
    int64_t ids = 0;
    while (first < items.size()) {
        StepPlan st;
        st.ids_off = ids;
        for (size_t i = first; i < items.size() && st.rows < step_rows && int64_t(st.frags.size()) < max_items;
             ++i) {
            const ItemShape &it = items[i];
            const int64_t left = it.n - done[i];
            if (left <= 0) continue;
            int64_t take = std::min(left, step_rows - st.rows);
            const int64_t at = it.pos + done[i];
            if (it.snap_every > 0)  // end at the sequence's next snapshot position
                take = std::min(take, it.snap_every - at % it.snap_every);
            const auto cut = std::upper_bound(it.cuts.begin(), it.cuts.end(), at);  // and at its next cut
            if (cut != it.cuts.end()) take = std::min(take, *cut - at);
            st.frags.push_back(Frag{int32_t(i), st.rows, take, done[i]});
            st.rows += take;
            done[i] += take;
            // An item that must continue keeps its place: the next step starts with it, so its
            // rows stay in order and no later item runs ahead of it in its own step.
            if (done[i] < it.n) break;
        }
        while (first < items.size() && done[first] >= items[first].n) ++first;
        ids += st.rows;
        steps.push_back(std::move(st));
    }
    return steps;
}

bool steps_valid(const std::vector<ItemShape> &items, const std::vector<StepPlan> &steps, int64_t step_rows,
                 int64_t max_items, const char **why) {
    std::vector<int64_t> done(items.size(), 0);
    int64_t ids = 0;
    for (const StepPlan &st : steps) {
        if (st.frags.empty() || st.rows < 1 || st.rows > step_rows) return *why = "step rows out of range", false;
        if (int64_t(st.frags.size()) > max_items) return *why = "too many fragments in a step", false;
        if (st.ids_off != ids) return *why = "ids offsets not back to back", false;
        int64_t row = 0;
        std::vector<bool> here(items.size(), false);
        for (const Frag &f : st.frags) {
            if (f.item < 0 || size_t(f.item) >= items.size()) return *why = "fragment of no item", false;
            if (here[size_t(f.item)]) return *why = "an item twice in one step", false;
            here[size_t(f.item)] = true;
            if (f.row0 != row || f.rows < 1) return *why = "fragment rows not back to back", false;
            if (f.done != done[size_t(f.item)]) return *why = "an item's rows out of order", false;
            const ItemShape &it = items[size_t(f.item)];
            const int64_t at = it.pos + f.done;
            if (it.snap_every > 0 && at / it.snap_every != (at + f.rows - 1) / it.snap_every)
                return *why = "a fragment crosses a snapshot position", false;
            const auto cut = std::upper_bound(it.cuts.begin(), it.cuts.end(), at);
            if (cut != it.cuts.end() && *cut < at + f.rows) return *why = "a fragment crosses a cut", false;
            done[size_t(f.item)] += f.rows;
            row += f.rows;
        }
        if (row != st.rows) return *why = "step rows do not add up", false;
        ids += st.rows;
    }
    for (size_t i = 0; i < items.size(); ++i)
        if (done[i] != items[i].n) return *why = "an item's tokens not covered exactly once", false;
    return true;
}

}  // namespace pf
