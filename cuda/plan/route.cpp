// route.cpp — see route.h.
#include "plan/route.h"

#include "base/error.h"
#include "plan/qtype.h"

namespace pf {

pf_status route_of_leg(int32_t leg, const WeightFacts &w, bool blocks, const char *fn, ProjRoute *out) {
    const bool on_blocks = blocks && qtype_is_block(w.qtype);
    // Under `blocks` the f16 leg needs no copy of a block type or an F16 weight (read in place).
    const bool no_copy = on_blocks || (blocks && w.qtype == PF_QTYPE_F16);
    ProjRoute r;
    switch (leg) {
        case PF_GEMM_AUTO:
            r.leg = w.f16 || w.f16_stream || no_copy ? PF_GEMM_F16 : PF_GEMM_F32;
            break;
        case PF_GEMM_F32:
        case PF_GEMM_F16:
            r.leg = leg;
            break;
        case PF_GEMM_INT8:
            if (w.k % 16 != 0)
                return fail(PF_STATUS_UNSUPPORTED, "%s: the 8-bit leg needs k %% 16 == 0 (weight n=%lld k=%lld)", fn,
                            (long long)w.n, (long long)w.k);
            r.leg = PF_GEMM_INT8;
            r.weight = w.i8 ? WeightForm::I8Copy : WeightForm::I8Slabs;
            *out = r;
            return PF_STATUS_OK;
        default:
            return fail(PF_STATUS_INVALID_ARGUMENT, "%s: leg=%d is not a pf_gemm_leg", fn, int(leg));
    }
    if (r.leg == PF_GEMM_F32)
        r.weight = w.qtype == PF_QTYPE_F32 ? WeightForm::F32 : WeightForm::F32Slabs;
    else
        r.weight = w.f16                     ? WeightForm::F16Cache
                   : w.qtype == PF_QTYPE_F16 ? WeightForm::F16
                   : on_blocks               ? WeightForm::F16Blocks
                                             : WeightForm::F16Slabs;
    *out = r;
    return PF_STATUS_OK;
}

int32_t session_leg(int32_t plan_leg, const WeightFacts &w) {
    if (plan_leg != PF_GEMM_INT8) return plan_leg;
    return w.i8 ? PF_GEMM_INT8 : PF_GEMM_AUTO;
}

const char *weight_form_name(WeightForm f) {
    switch (f) {
        case WeightForm::F32Slabs: return "fp32 slabs";
        case WeightForm::F32: return "F32 in place";
        case WeightForm::F16Cache: return "fp16 cache";
        case WeightForm::F16: return "F16 in place";
        case WeightForm::F16Slabs: return "fp16 slabs (streamed)";
        case WeightForm::F16Blocks: return "GGUF blocks (GEMM on the chip)";
        case WeightForm::I8Copy: return "int8 copy";
        case WeightForm::I8Slabs: return "int8 slabs";
    }
    return "?";
}

}  // namespace pf
