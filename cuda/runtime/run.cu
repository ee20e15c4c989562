// run.cu — see run.h.
#include "runtime/run.h"

#include <algorithm>
#include <cstring>

#include "base/cuda_check.cuh"
#include "kernels/rows/rows.cuh"

namespace pf {

RunPlan run_plan(const Executor &e, std::vector<RunItem> items) {
    RunPlan p;
    std::vector<ItemShape> shapes;
    shapes.reserve(items.size());
    for (const RunItem &it : items)
        shapes.push_back(ItemShape{it.n, it.seq->pos, it.seq->snap_every, it.cuts});
    p.steps = plan_steps(shapes, e.L.step_rows, e.L.max_items);
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
    // Paged sequences: the pages of every item's new positions first (a shared partial page
    // copied, fresh pages, the tables uploaded); when the pool is short, the pages taken are
    // given back and nothing has changed.
    for (size_t i = 0; i < p.items.size(); ++i) {
        Sequence &q = *p.items[i].seq;
        if (q.pool && !e->paged_kv)
            return fail(PF_STATUS_UNSUPPORTED, "a paged session runs in an executor made before the model's KV "
                        "pool (a batch: make it after pf_model_kv_pool)");
        const pf_status r = sequence_pages_reserve(q, p.items[i].n, st);
        if (r != PF_STATUS_OK) {
            for (size_t j = 0; j < i; ++j) {
                Sequence &o = *p.items[j].seq;
                (void)sequence_pages_truncate(o, o.pos, o.pos + p.items[j].n);
            }
            return r;
        }
    }
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
                const RunItem &it = p.items[size_t(f.item)];
                if (it.at_cut && std::binary_search(it.cuts.begin(), it.cuts.end(), q->pos)) PF_TRY(it.at_cut(*q, st));
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

}  // namespace pf
