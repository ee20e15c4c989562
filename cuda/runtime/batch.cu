// batch.cu — running items through a chunk executor (batch.h), and pf_batch: a model's executor
// shared by the items of a batch.
#include <algorithm>
#include <cstring>

#include "base/cuda_check.cuh"
#include "kernels/rows/rows.cuh"
#include "runtime/batch.h"

namespace pf {

RunPlan run_plan(const Executor &e, std::vector<RunItem> items) {
    RunPlan p;
    std::vector<ItemShape> shapes;
    shapes.reserve(items.size());
    for (const RunItem &it : items) shapes.push_back(ItemShape{it.n, it.seq->pos, it.seq->snap_every});
    p.steps = plan_steps(shapes, e.L.rows, e.L.max_items);
    int64_t total = 0;
    for (const StepPlan &s : p.steps) total += s.rows;
    p.ids.resize(size_t(total));
    for (const StepPlan &s : p.steps)  // the ids of each step's rows, in step order
        for (const Frag &f : s.frags)
            std::memcpy(p.ids.data() + s.ids_off + f.row0, items[size_t(f.item)].tokens + f.done,
                        size_t(f.rows) * sizeof(int32_t));
    p.items = std::move(items);
    return p;
}

pf_status run_execute(Executor *e, RunPlan &p) {
    const Hparams &hp = e->model->hp;
    const int64_t V = hp.n_vocab, d = hp.n_embd, lm = e->L.lm_rows;
    cudaStream_t st = e->ctx->stream;
    executor_begin(e);
    std::vector<int32_t> finished;  // the item of each greedy token in e->argmax, in order
    auto body = [&]() -> pf_status {
        // The run's ids in one copy (a copy from pageable memory may wait for the stream: once
        // per run), in step order: a step's ids are then at e->ids + its offset, which the
        // graphed embedding reads from the device.
        PF_TRY(executor_upload_ids(e, p.ids.data(), int64_t(p.ids.size()), 0));
        std::vector<StepItem> items;
        std::vector<const Frag *> last;
        for (const StepPlan &sp : p.steps) {
            items.clear();
            for (const Frag &f : sp.frags) {
                Sequence *q = p.items[size_t(f.item)].seq;
                items.push_back(StepItem{q, f.row0, f.rows, q->pos});
            }
            PF_TRY(executor_step(e, items, sp.ids_off));
            // Every row's logits for the items that want them (LM head passes of lm rows), the
            // greedy token of an item's last row from its pass.
            last.clear();
            for (const Frag &f : sp.frags) {
                const RunItem &it = p.items[size_t(f.item)];
                const bool ends = f.done + f.rows == it.n;
                if (it.mode != PF_LOGITS_ALL) {
                    if (ends) last.push_back(&f);
                    continue;
                }
                for (int64_t r0 = 0; r0 < f.rows; r0 += lm) {
                    const int64_t rn = std::min(lm, f.rows - r0);
                    PF_TRY(executor_lm_head(e, e->x + (f.row0 + r0) * d, rn));
                    PF_CUDA_TRY(cudaMemcpyAsync(it.logits + size_t(f.done + r0) * size_t(V), e->logits,
                                                size_t(rn) * size_t(V) * 4, cudaMemcpyDeviceToHost, st));
                    if (ends && r0 + rn == f.rows) {
                        PF_TRY(argmax_rows(e->logits + (rn - 1) * V, 1, V, V, e->argmax + finished.size(), st));
                        finished.push_back(f.item);
                    }
                }
            }
            // The last rows of the other items that end here, lm at a time: final norm, LM head
            // and argmax over them together (one row: read in place; several: gathered).
            for (size_t g0 = 0; g0 < last.size(); g0 += size_t(lm)) {
                const size_t gn = std::min(last.size() - g0, size_t(lm));
                const float *x = e->x + (last[g0]->row0 + last[g0]->rows - 1) * d;
                if (gn > 1) {
                    std::vector<int64_t> rows(gn);
                    for (size_t j = 0; j < gn; ++j) rows[j] = last[g0 + j]->row0 + last[g0 + j]->rows - 1;
                    PF_TRY(gather_rows(CMatF{e->x, d}, rows.data(), int64_t(gn), MatF{e->xg, d}, d, st));
                    x = e->xg;
                }
                PF_TRY(executor_lm_head(e, x, int64_t(gn)));
                PF_TRY(argmax_rows(e->logits, int64_t(gn), V, V, e->argmax + finished.size(), st));
                for (size_t j = 0; j < gn; ++j) {
                    const RunItem &it = p.items[size_t(last[g0 + j]->item)];
                    if (it.mode == PF_LOGITS_LAST)
                        PF_CUDA_TRY(cudaMemcpyAsync(it.logits, e->logits + j * size_t(V), size_t(V) * 4,
                                                    cudaMemcpyDeviceToHost, st));
                    finished.push_back(last[g0 + j]->item);
                }
            }
            // Positions, and the snapshots due at them (in stream order after the step).
            for (const Frag &f : sp.frags) {
                Sequence *q = p.items[size_t(f.item)].seq;
                q->pos += f.rows;
                if (q->snap_every > 0 && q->pos % q->snap_every == 0) PF_TRY(snapshot_take(*q, -1, st));
            }
        }
        std::vector<int32_t> tok(finished.size(), -1);
        if (!tok.empty())
            PF_CUDA_TRY(cudaMemcpyAsync(tok.data(), e->argmax, tok.size() * 4, cudaMemcpyDeviceToHost, st));
        PF_CUDA_TRY(cudaStreamSynchronize(st));
        for (size_t j = 0; j < finished.size(); ++j) {
            RunItem &it = p.items[size_t(finished[j])];
            it.seq->last_token = tok[j];
            if (it.out_token) *it.out_token = tok[j];
        }
        // The end-of-call snapshots, with their greedy token (and that of a snapshot just kept
        // at the same position).
        for (RunItem &it : p.items) {
            Sequence &q = *it.seq;
            if (!q.snaps.empty() && q.snaps.back().pos == q.pos) q.snaps.back().last_token = q.last_token;
            else if (q.snap_at_end) PF_TRY(snapshot_take(q, q.last_token, st));
        }
        PF_CUDA_TRY(cudaStreamSynchronize(st));
        return PF_STATUS_OK;
    };
    const pf_status r = body();
    if (r != PF_STATUS_OK)
        for (RunItem &it : p.items) it.seq->broken = true;  // caches and states may be half-written
    return r;
}

// ---------------------------------------------------------------------------- pf_batch

namespace {
constexpr int32_t kDefaultStepTokens = 2048;
constexpr int32_t kDefaultMaxContext = 4096;
}  // namespace

pf_status batch_create(pf_model *m, const pf_batch_options &o, pf_batch **out) {
    std::unique_ptr<pf_batch> b(new pf_batch());
    b->model = m;
    b->ref.reset(m->ctx);
    b->ctx = m->ctx;
    b->opts = o;
    const int32_t step = o.step_tokens ? o.step_tokens : kDefaultStepTokens;
    b->opts.step_tokens = step;
    b->opts.max_tokens = o.max_tokens ? o.max_tokens : 8 * step;
    b->opts.max_context = o.max_context ? o.max_context : kDefaultMaxContext;
    const pf_tuning t = tuning_over(o.tuning, tuning_over(m->tuning, m->ctx->tuning));
    b->plan = exec_plan(o.gemm_leg ? o.gemm_leg : m->gemm_leg, t, o.attn_path, o.kv_dtype, o.cuda_graphs == 1);
    Executor *e = nullptr;
    PF_TRY(executor_create(m, b->plan, step, b->opts.max_context, o.max_items, b->opts.max_tokens, &e));
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
            f.capacity = q.max_tokens;
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
