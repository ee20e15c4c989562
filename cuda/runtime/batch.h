// batch.h — pf_batch: a model's executor shared by the items (sessions with tokens and wanted
// outputs) of each call; plan/batch_plan.h checks the items and cuts them into steps, run.h
// runs them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/executor.h"
#include "runtime/run.h"
#include "runtime/session.h"

struct pf_batch {
    pf::CtxRef ref;                       // first: the last member to go
    pf_model *model = nullptr;
    pf_context *ctx = nullptr;
    pf_batch_options opts{};
    pf::ExecPlan plan;
    std::unique_ptr<pf::Executor> exec;
    bool planned = false;
    pf::RunPlan run;
};

namespace pf {
pf_status batch_create(pf_model *m, const pf_batch_options &o, pf_batch **out);
void batch_destroy(pf_batch *b);
pf_status batch_plan(pf_batch *b, const pf_batch_item *items, int32_t n);
pf_status batch_run(pf_batch *b);
}  // namespace pf
