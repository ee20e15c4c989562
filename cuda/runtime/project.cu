// project.cu — see project.h.
#include "runtime/project.h"

#include "runtime/executor.h"

namespace pf {

pf_status step_route(const ExecPlan &plan, const pf_weight *w, ProjRoute *out) {
    const WeightFacts f = weight_facts(w);
    return route_of_leg(session_leg(plan.leg, f), f, plan.gemm_blocks, "project", out);
}

int64_t group_width(const LayerWeights &Lw, const ProjGroup &g) {
    int64_t n = 0;
    for (int32_t i = 0; i < g.count; ++i) n += (Lw.*g.parts[i])->n;
    return n;
}

ProjEnv step_env(Executor *e) {
    ProjEnv p;
    p.ctx = e->ctx;
    p.plan = e->gemm_plan.get();
    p.w32 = &e->w32;
    p.w16 = &e->w16;
    p.x16 = &e->x16;
    p.blocks_slab_rows = e->plan.blocks_slab_rows;
    p.blocks_gemv_rows = e->plan.blocks_gemv_rows;
    p.ring = e->ring.on ? &e->ring : nullptr;
    return p;
}

ProjIn step_input(const Executor *e, CMatF x32) {
    return e->act16 ? ProjIn::f16(e->h16, e->inv16) : ProjIn::f32(x32);
}

pf_status project_in(Executor *e, pf_weight *w, const ProjIn &in, int64_t rows, MatF y, bool accumulate) {
    ProjRoute r;
    PF_TRY(step_route(e->plan, w, &r));
    return project(step_env(e), r, w, in, y, rows, accumulate);
}

pf_status project_group(Executor *e, const LayerWeights &Lw, const ProjGroup &g, const ProjIn &in, int64_t rows,
                        MatF y) {
    const ProjEnv env = step_env(e);
    return for_each_gemm(e->plan, Lw, g, [&](const ProjRoute &r, pf_weight *w, int64_t col) {
        return project(env, r, w, in, y.cols_from(col), rows, g.accumulate);
    });
}

}  // namespace pf
