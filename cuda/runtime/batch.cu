// batch.cu — pf_batch: a model's executor shared by the items of a batch (batch.h).
#include "runtime/batch.h"

#include "base/cuda_check.cuh"
#include "plan/defaults.h"

namespace pf {

pf_status batch_create(pf_model *m, const pf_batch_options &o, pf_batch **out) {
    std::unique_ptr<pf_batch> b(new pf_batch());
    b->model = m;
    b->ref.reset(m->ctx);
    b->ctx = m->ctx;
    b->opts = o;
    const int32_t step_rows = o.step_tokens ? o.step_tokens : kDefaultStepRows;
    b->opts.step_tokens = step_rows;
    b->opts.max_tokens = o.max_tokens ? o.max_tokens : kDefaultBatchSteps * step_rows;
    b->opts.max_context = o.max_context ? o.max_context : kDefaultCapacity;
    b->plan = model_exec_plan(m, o.gemm_leg, o.tuning, o.attn_path, o.kv_dtype, o.cuda_graphs);
    Executor *e = nullptr;
    PF_TRY(executor_create(m, b->plan, step_rows, b->opts.max_context, o.max_items, b->opts.max_tokens, &e));
    b->exec.reset(e);
    *out = b.release();
    return PF_STATUS_OK;
}

void batch_destroy(pf_batch *b) {
    if (!b) return;
    DeviceGuard dg(b->ctx->device);
    (void)cudaStreamSynchronize(b->ctx->stream);
    delete b;
}

pf_status batch_plan(pf_batch *b, const pf_batch_item *items, int32_t n) {
    const char *fn = "pf_batch_plan";
    BatchLimits lim;
    lim.model = b->model;
    lim.kv_dtype = b->opts.kv_dtype;
    lim.n_vocab = b->model->hp.n_vocab;
    lim.max_items = b->opts.max_items;
    lim.max_tokens = b->opts.max_tokens;
    lim.max_context = b->opts.max_context;
    std::vector<ItemFacts> facts(items && n > 0 ? size_t(n) : 0);
    for (size_t i = 0; i < facts.size(); ++i) {
        const pf_batch_item &it = items[i];
        ItemFacts &f = facts[i];
        f.session = it.session;
        if (it.session) {
            const Sequence &q = it.session->seq;
            f.model = it.session->model;
            f.kv_dtype = q.kv_dtype;
            f.broken = q.broken;
            f.pos = q.pos;
            f.capacity = q.capacity;
        }
        f.tokens = it.tokens;
        f.n_tokens = it.n_tokens;
        f.logits_mode = it.logits_mode;
        f.logits = it.logits;
        f.logits_len = it.logits_len;
    }
    PF_TRY(batch_check(facts.data(), n, lim, fn));  // every check before anything changes
    b->planned = false;
    std::vector<RunItem> run(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        run[size_t(i)].seq = &items[i].session->seq;
        run[size_t(i)].tokens = items[i].tokens;
        run[size_t(i)].n = items[i].n_tokens;
        run[size_t(i)].mode = items[i].logits_mode;
        run[size_t(i)].logits = items[i].logits;
        run[size_t(i)].out_token = items[i].out_token;
        run[size_t(i)].planned_pos = items[i].session->seq.pos;
    }
    b->run = run_plan(*b->exec, std::move(run));
    b->planned = true;
    return PF_STATUS_OK;
}

pf_status batch_run(pf_batch *b) {
    PF_CHECK_ARG(b->planned, "pf_batch_run: no planned batch (pf_batch_plan first; a plan runs once)");
    // The plan's steps (cuts at snapshot positions) were made for where the sessions stood then.
    for (size_t i = 0; i < b->run.items.size(); ++i) {
        const RunItem &it = b->run.items[i];
        PF_CHECK_ARG(it.seq->pos == it.planned_pos && !it.seq->broken,
                     "pf_batch_run: items[%zu]'s session moved (or failed) since pf_batch_plan; plan again", i);
    }
    b->planned = false;
    DeviceGuard dg(b->ctx->device);
    PF_TRY(dg.status());
    return run_execute(b->exec.get(), b->run);
}

}  // namespace pf
