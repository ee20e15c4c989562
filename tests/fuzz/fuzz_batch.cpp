// fuzz_batch.cpp — libFuzzer target: the checks pf_batch_plan makes on its items before any
// device work (batch_check) and the cutting of the checked items into steps (plan_steps), on
// items decoded from arbitrary bytes against a batch of a few limits. Contract checked beyond
// "no crash, no leak, no UB": a failure is INVALID_ARGUMENT with a message naming the call; an
// accepted batch has at least one item, at most max_items, no session twice, every session of
// the batch's model and KV dtype, every item within its session's capacity and the vocabulary,
// every wanted logits buffer long enough (written in full here, under ASan); and its steps
// (steps_valid) cover every item's tokens exactly once, in order, within the step limits, never
// across a snapshot position or one of its cuts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "plan/batch_plan.h"
#include "base/error.h"
#define PF_FUZZ_TARGET "fuzz_batch"
#include "fuzz_common.h"

namespace {

int dummy_sessions[8], dummy_models[2];  // identities the items point at

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Reader r{data, size};
    pf::BatchLimits lim;
    lim.model = &dummy_models[0];
    lim.kv_dtype = r.u8() & 1;
    lim.n_vocab = 1 + (r.u8() & 63);
    lim.max_items = 1 + (r.u8() & 7);
    lim.max_tokens = 1 + r.u16() % 600;
    lim.max_context = r.u8() & 1 ? 0 : 1 + r.u16() % 700;
    const int64_t step_rows = 1 + r.u16() % 300;
    const int32_t n = int32_t(r.u8() % 10) - 1;  // -1 .. 8 items: the count checks too
    std::vector<pf::ItemFacts> items(n > 0 ? size_t(n) : 0);
    std::vector<std::vector<int32_t>> tokens(items.size());
    std::vector<std::vector<float>> logits(items.size());
    std::vector<int64_t> snap(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
        pf::ItemFacts &it = items[i];
        const uint8_t s = r.u8();
        it.session = s & 0x80 ? nullptr : &dummy_sessions[s & 7];
        it.model = s & 0x40 ? &dummy_models[1] : &dummy_models[0];
        it.kv_dtype = (s >> 4) & 1 ? 1 - lim.kv_dtype : lim.kv_dtype;
        it.broken = (s & 0x08) && (r.u8() & 1);
        it.capacity = 1 + r.u16() % 700;
        it.pos = r.u16() % (it.capacity + 1);
        it.n_tokens = int32_t(r.u16() % 300) - 2;
        tokens[i].resize(it.n_tokens > 0 ? size_t(it.n_tokens) : 0);
        for (int32_t &t : tokens[i]) t = int32_t(r.u8()) - 2;  // some outside [0, n_vocab)
        it.tokens = r.u8() & 0x10 ? nullptr : tokens[i].data();
        it.logits_mode = int32_t(r.u8() % 5) - 1;
        const size_t want = it.logits_mode == PF_LOGITS_ALL    ? size_t(std::max(it.n_tokens, 0)) * size_t(lim.n_vocab)
                            : it.logits_mode == PF_LOGITS_LAST ? size_t(lim.n_vocab)
                                                               : 0;
        const uint8_t b = r.u8();
        logits[i].resize(b & 1 ? want : want / 2);  // sometimes short
        it.logits = b & 2 ? nullptr : logits[i].data();
        it.logits_len = logits[i].size();
        snap[i] = (r.u8() & 3) == 0 ? 64 * (1 + (r.u8() & 3)) : 0;
    }
    const pf_status s = pf::guard("fuzz_batch", [&] {
        return pf::batch_check(items.data(), n, lim, "pf_batch_plan");
    });
    if (s != PF_STATUS_OK) {
        if (s != PF_STATUS_INVALID_ARGUMENT) broken(pf_status_name(s));
        if (std::strstr(pf_last_error(), "pf_batch_plan") == nullptr) broken("a failure that does not name the call");
        return 0;
    }
    // Accepted: everything the checks promise holds.
    if (n < 1 || n > lim.max_items) broken("an item count out of range");
    int64_t total = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        const pf::ItemFacts &it = items[i];
        if (!it.session || it.model != lim.model || it.kv_dtype != lim.kv_dtype || it.broken)
            broken("an unusable session accepted");
        for (size_t j = 0; j < i; ++j)
            if (items[j].session == it.session) broken("a session twice");
        if (it.n_tokens < 1 || !it.tokens || it.pos + it.n_tokens > it.capacity) broken("tokens past capacity");
        if (lim.max_context > 0 && it.capacity > lim.max_context) broken("a session larger than max_context");
        for (int32_t t = 0; t < it.n_tokens; ++t)
            if (it.tokens[t] < 0 || it.tokens[t] >= lim.n_vocab) broken("a token outside the vocabulary");
        if (it.logits_mode < PF_LOGITS_NONE || it.logits_mode > PF_LOGITS_ALL) broken("a bad logits mode");
        const size_t want = it.logits_mode == PF_LOGITS_ALL    ? size_t(it.n_tokens) * size_t(lim.n_vocab)
                            : it.logits_mode == PF_LOGITS_LAST ? size_t(lim.n_vocab)
                                                               : 0;
        if (want) {
            if (!it.logits || it.logits_len < want) broken("a short logits buffer accepted");
            std::memset(const_cast<float *>(it.logits), 0, want * sizeof(float));  // ASan: it must hold them
        }
        total += it.n_tokens;
    }
    if (total > lim.max_tokens) broken("more tokens than max_tokens");
    std::vector<pf::ItemShape> shapes;
    for (size_t i = 0; i < items.size(); ++i) {
        pf::ItemShape sh{items[i].n_tokens, items[i].pos, snap[i], {}};
        // cuts (a prefix cache's snapshot plan): ascending, some outside the item's positions
        int64_t c = items[i].pos - 8;
        while (r.more() && (r.u8() & 3) != 0 && sh.cuts.size() < 6) sh.cuts.push_back(c += 1 + r.u8() % 40);
        shapes.push_back(std::move(sh));
    }
    const int64_t max_items = 1 + (r.more() ? r.u8() % 8 : 3);
    const std::vector<pf::StepPlan> steps = pf::plan_steps(shapes, step_rows, max_items);
    const char *why = "";
    if (!pf::steps_valid(shapes, steps, step_rows, max_items, &why)) broken(why);
    return 0;
}
