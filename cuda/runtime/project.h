// project.h — a step's projections: each weight's route under the executor's plan (plan/route.h),
// the projection groups of the layer description (plan/model_plan.h ProjGroup) run as GEMMs (the
// parts of one route that form one fused block as one GEMM, the others one by one), and the input
// form the step's producers write (fp32 rows, or fp16 rows on the act16 route). The layer loop
// (forward.cu) projects through these; the executor (executor.cu) walks the same GEMMs to size its
// scratch and to plan the f16 leg's GEMM shapes.
#pragma once

#include "kernels/gemm/gemm.cuh"
#include "plan/model_plan.h"
#include "plan/plan.h"
#include "plan/route.h"

namespace pf {

struct Executor;

// The route of a projection through w for a session or batch on `plan`: route_of_leg of the leg
// the plan asks for w (session_leg). PF_GEMM_DEFAULT never reaches here (exec_plan resolved it).
pf_status step_route(const ExecPlan &plan, const pf_weight *w, ProjRoute *out);

// Calls fn(route, weight, col) for each GEMM of group g of layer Lw, in order: consecutive parts
// of one route whose copies form one fused block (plan.fuse_groups, fused_view) as one GEMM through
// the fused view, every other part alone; col is the first output column of the GEMM in the
// group's side-by-side output. A failing fn ends the walk with its status.
template <class F>
pf_status for_each_gemm(const ExecPlan &plan, const LayerWeights &Lw, const ProjGroup &g, F &&fn) {
    pf_weight *parts[4] = {};
    ProjRoute routes[4];
    for (int32_t i = 0; i < g.count; ++i) {
        parts[i] = Lw.*g.parts[i];
        PF_CHECK_ARG(parts[i] != nullptr, "layer projections: part %d of a group is missing", int(i));
        PF_TRY(step_route(plan, parts[i], &routes[i]));
    }
    int64_t col = 0;
    for (int32_t i = 0; i < g.count;) {
        int32_t j = i + 1;
        while (j < g.count && routes[j] == routes[i]) ++j;
        pf_weight view;
        if (plan.fuse_groups && j - i > 1 && fused_view(routes[i], parts + i, j - i, &view)) {
            PF_TRY(fn(routes[i], &view, col));
            col += view.n;
        } else {
            for (int32_t k = i; k < j; ++k) {
                PF_TRY(fn(routes[k], parts[k], col));
                col += parts[k]->n;
            }
        }
        i = j;
    }
    return PF_STATUS_OK;
}

// The width of group g's side-by-side output in layer Lw (the sum of its parts' n).
int64_t group_width(const LayerWeights &Lw, const ProjGroup &g);

// Where e's projections run: its context, its GEMM plan and its workspace's projection scratch.
ProjEnv step_env(Executor *e);
// The input a projection of e's step reads after a producer wrote x32's rows: the producer's fp16
// rows in e->h16 / e->inv16 on the act16 route, x32 otherwise.
ProjIn step_input(const Executor *e, CMatF x32);

// y (+)= in . W^T along w's route (step_route).
pf_status project_in(Executor *e, pf_weight *w, const ProjIn &in, int64_t rows, MatF y, bool accumulate);
// Group g of layer Lw on one input: its parts' outputs side by side in y ([rows][group_width];
// an accumulating group adds into y), through for_each_gemm (the same values within the leg's
// tolerance, the same layout, fused or not).
pf_status project_group(Executor *e, const LayerWeights &Lw, const ProjGroup &g, const ProjIn &in, int64_t rows,
                        MatF y);

}  // namespace pf
