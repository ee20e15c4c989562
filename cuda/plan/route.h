// route.h — the projection route: for one projection through one weight, the leg that runs it
// and the form its weight operand takes, as one pure function of the plan's leg and the weight's
// facts. Read by the layer loop (runtime/project.cu: every projection of a step, the runs of a
// fused group), the executor (its scratch and its GEMM plan walk the same routes), the step's
// input form (the act16 route: route_takes_f16_rows) and the launcher (kernels/gemm/gemm.cu
// project(), one case per weight form). The input form is the producer's: fp32 rows, or the f16
// leg's fp16 rows with their inverse row scales (kernels/rows/f16_rows.cuh), decided per step.
//
// A new weight form touches: a WeightForm value and its case in route_of_leg (here), its case in
// project() and project_scratch_bytes (kernels/gemm/gemm.cu), its kernel, and a test.
// Host-only (no CUDA types): the CPU tests compile it.
#pragma once

#include <cstdint>

#include "prefill.h"

namespace pf {

// What a route reads of a weight: its type and shape and the copies it holds now (the runtime
// fills them from a pf_weight: weight_facts, kernels/gemm/gemm.cuh).
struct WeightFacts {
    int32_t qtype = 0;
    int64_t n = 0, k = 0;
    bool f16 = false;         // its fp16 cache (a prewarm, pf_weight_cache_f16)
    bool f16_stream = false;  // a model's partial prewarm left it to stream on the f16 leg
    bool i8 = false;          // its int8 copy (the 8-bit leg's rank-1 form)
};

// Where a projection's weight operand comes from.
enum class WeightForm : int8_t {
    F32Slabs,  // f32 leg: the GGUF blocks dequantized to fp32 slabs per call (one row: the GEMV)
    F32,       // f32 leg: an F32 weight, in place
    F16Cache,  // f16 leg: the fp16 cache
    F16,       // f16 leg: an F16 weight, in place
    F16Slabs,  // f16 leg: the blocks dequantized to fp16 slabs per call ("streaming"; one row: the GEMV)
    F16Blocks, // f16 leg: the GGUF blocks dequantized on the chip inside the GEMM (gemm_q16; one row:
               // the GEMV), the same fp16 operand as the cache without holding one
    I8Copy,    // 8-bit leg: the int8 copy
    I8Slabs,   // 8-bit leg: the rank-1 form made per call, slab by slab
};

struct ProjRoute {
    int32_t leg = PF_GEMM_F32;  // PF_GEMM_F32, _F16 or _INT8: what runs (never DEFAULT or AUTO)
    WeightForm weight = WeightForm::F32Slabs;
    bool operator==(const ProjRoute &o) const { return leg == o.leg && weight == o.weight; }
    bool operator!=(const ProjRoute &o) const { return !(*this == o); }
};

// The route of a projection asked on `leg` (PF_GEMM_AUTO, _F32, _F16 or _INT8; PF_GEMM_DEFAULT is
// resolved where the plan is built: resolve_default_leg). `blocks`: the plan lets the f16 leg
// read a block type's GGUF blocks (ExecPlan::gemm_blocks: tuning.gemm_blocks on a device that runs
// it). The f16 leg reads the fp16 cache, else an F16 weight in place, else the blocks (F16Blocks
// where `blocks`, F16Slabs otherwise); AUTO is the f16 leg where the weight has its fp16 cache,
// streams, or (with `blocks`) is a block type or F16 (read as they are), else the f32 leg. INT8 needs k % 16 == 0
// (UNSUPPORTED otherwise; whether the device runs the 8-bit leg at all is the runtime's check,
// int8_leg_check). Anything else is INVALID_ARGUMENT. Messages name `fn`.
pf_status route_of_leg(int32_t leg, const WeightFacts &w, bool blocks, const char *fn, ProjRoute *out);

// The leg a session whose plan runs `plan_leg` asks for a weight: under PF_GEMM_INT8 the 8-bit leg
// where the weight has its int8 copy (the recipe's matrices: ProjGroup::int8_recipe, made when
// the executor is created) and AUTO for the others; plan_leg itself otherwise.
int32_t session_leg(int32_t plan_leg, const WeightFacts &w);

// Whether the route's launcher takes the producers' fp16 rows (the act16 route): the fp16 cache,
// an F16 weight in place, the blocks GEMM and the int8 copy do. (The per-call slabs and the f32
// leg take fp32 rows: a step with such a matrix keeps its producers in fp32.)
inline bool route_takes_f16_rows(const ProjRoute &r) {
    return r.weight == WeightForm::F16Cache || r.weight == WeightForm::F16 || r.weight == WeightForm::F16Blocks ||
           r.weight == WeightForm::I8Copy;
}

// "f16 cache", "int8 copy", ... (messages and the plan's log line).
const char *weight_form_name(WeightForm f);

}  // namespace pf
