// test_route.cpp — the projection route (cuda/plan/route.cpp) and the layer description's
// projection groups (cuda/plan/model_plan.cpp layer_groups), host only: every leg on weights of
// every form of copy, against the table the launchers dispatch on (kernels/gemm/gemm.cu project),
// the errors, the session's per-matrix leg under PF_GEMM_INT8, and the groups' parts, order,
// outputs and 8-bit recipe.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "expect.h"
#include "plan/model_plan.h"
#include "plan/route.h"

namespace {

using pf::ProjRoute;
using pf::WeightFacts;
using pf::WeightForm;

WeightFacts facts(int32_t qtype, bool f16, bool stream, bool i8, int64_t k = 256) {
    WeightFacts f;
    f.qtype = qtype;
    f.n = 96;
    f.k = k;
    f.f16 = f16;
    f.f16_stream = stream;
    f.i8 = i8;
    return f;
}

void expect_route(int32_t leg, const WeightFacts &f, int32_t want_leg, WeightForm want_form, const char *what,
                  bool blocks = false) {
    ProjRoute r;
    const pf_status s = pf::route_of_leg(leg, f, blocks, "test", &r);
    EXPECT(s == PF_STATUS_OK, "%s: status %d (%s)", what, int(s), pf_last_error());
    EXPECT(r.leg == want_leg && r.weight == want_form, "%s: leg %d form %s, want leg %d form %s", what, int(r.leg),
           pf::weight_form_name(r.weight), int(want_leg), pf::weight_form_name(want_form));
}

void test_routes() {
    const int32_t Q = PF_QTYPE_Q4_K;
    // f32: the blocks dequantized to fp32 slabs, an F32 weight in place; whatever copies exist.
    expect_route(PF_GEMM_F32, facts(Q, false, false, false), PF_GEMM_F32, WeightForm::F32Slabs, "f32 blocks");
    expect_route(PF_GEMM_F32, facts(Q, true, false, true), PF_GEMM_F32, WeightForm::F32Slabs, "f32 ignores copies");
    expect_route(PF_GEMM_F32, facts(PF_QTYPE_F32, false, false, false), PF_GEMM_F32, WeightForm::F32, "f32 in place");
    // f16: the cache first, an F16 weight in place, else slabs.
    expect_route(PF_GEMM_F16, facts(Q, true, false, false), PF_GEMM_F16, WeightForm::F16Cache, "f16 cache");
    expect_route(PF_GEMM_F16, facts(PF_QTYPE_F16, true, false, false), PF_GEMM_F16, WeightForm::F16Cache,
                 "f16 cache of an F16 weight");
    expect_route(PF_GEMM_F16, facts(PF_QTYPE_F16, false, false, false), PF_GEMM_F16, WeightForm::F16, "F16 in place");
    expect_route(PF_GEMM_F16, facts(Q, false, false, false), PF_GEMM_F16, WeightForm::F16Slabs, "f16 slabs");
    expect_route(PF_GEMM_F16, facts(PF_QTYPE_F32, false, false, false), PF_GEMM_F16, WeightForm::F16Slabs,
                 "f16 leg on an F32 weight");
    // auto: the f16 leg where the weight is cached or streams, else f32.
    expect_route(PF_GEMM_AUTO, facts(Q, true, false, false), PF_GEMM_F16, WeightForm::F16Cache, "auto cached");
    expect_route(PF_GEMM_AUTO, facts(Q, false, true, false), PF_GEMM_F16, WeightForm::F16Slabs, "auto streamed");
    expect_route(PF_GEMM_AUTO, facts(Q, false, false, false), PF_GEMM_F32, WeightForm::F32Slabs, "auto cold");
    expect_route(PF_GEMM_AUTO, facts(PF_QTYPE_F32, false, false, false), PF_GEMM_F32, WeightForm::F32,
                 "auto cold F32");
    expect_route(PF_GEMM_AUTO, facts(PF_QTYPE_F16, false, false, false), PF_GEMM_F32, WeightForm::F32Slabs,
                 "auto cold F16 (no cache: the exact leg)");
    // The blocks GEMM (a plan with gemm_blocks): the f16 leg on an uncached block type reads the
    // blocks, AUTO takes the f16 leg for it; a cache still wins; element types keep their forms.
    const bool B = true;
    expect_route(PF_GEMM_F16, facts(Q, false, false, false), PF_GEMM_F16, WeightForm::F16Blocks, "f16 blocks", B);
    expect_route(PF_GEMM_AUTO, facts(Q, false, false, false), PF_GEMM_F16, WeightForm::F16Blocks, "auto blocks", B);
    expect_route(PF_GEMM_AUTO, facts(Q, false, true, false), PF_GEMM_F16, WeightForm::F16Blocks, "auto streamed", B);
    expect_route(PF_GEMM_AUTO, facts(Q, true, false, false), PF_GEMM_F16, WeightForm::F16Cache, "cache wins", B);
    expect_route(PF_GEMM_F32, facts(Q, false, false, false), PF_GEMM_F32, WeightForm::F32Slabs, "f32 as asked", B);
    expect_route(PF_GEMM_F16, facts(PF_QTYPE_F16, false, false, false), PF_GEMM_F16, WeightForm::F16,
                 "F16 in place", B);
    expect_route(PF_GEMM_F16, facts(PF_QTYPE_BF16, false, false, false), PF_GEMM_F16, WeightForm::F16Slabs,
                 "BF16: slabs", B);
    expect_route(PF_GEMM_AUTO, facts(PF_QTYPE_F32, false, false, false), PF_GEMM_F32, WeightForm::F32,
                 "auto cold F32", B);
    expect_route(PF_GEMM_AUTO, facts(PF_QTYPE_F16, false, false, false), PF_GEMM_F16, WeightForm::F16,
                 "auto cold F16: in place", B);
    for (int32_t q : {int32_t(PF_QTYPE_Q4_0), int32_t(PF_QTYPE_Q8_0), int32_t(PF_QTYPE_Q5_K), int32_t(PF_QTYPE_Q6_K),
                      int32_t(PF_QTYPE_IQ4_XS)})
        expect_route(PF_GEMM_F16, facts(q, false, false, false), PF_GEMM_F16, WeightForm::F16Blocks, "blocks type", B);
    // int8: the copy or the per-call slabs; k % 16.
    expect_route(PF_GEMM_INT8, facts(Q, false, false, true), PF_GEMM_INT8, WeightForm::I8Copy, "int8 copy");
    expect_route(PF_GEMM_INT8, facts(Q, true, false, false), PF_GEMM_INT8, WeightForm::I8Slabs, "int8 slabs");
    ProjRoute r;
    EXPECT(pf::route_of_leg(PF_GEMM_INT8, facts(Q, false, false, false, 264), false, "test", &r) == PF_STATUS_UNSUPPORTED,
           "int8 with k %% 16 != 0");
    EXPECT(std::strstr(pf_last_error(), "k % 16") != nullptr, "message: %s", pf_last_error());
    for (int32_t bad : {int32_t(PF_GEMM_DEFAULT), -1, 5, 99}) {
        EXPECT(pf::route_of_leg(bad, facts(Q, true, false, false), false, "test", &r) == PF_STATUS_INVALID_ARGUMENT,
               "leg %d must be refused (DEFAULT is resolved where the plan is built)", int(bad));
    }
    // Which fp16 rows a route takes (the act16 route): the cache and the int8 copy.
    for (int f = 0; f <= int(WeightForm::I8Slabs); ++f) {  // every form (I8Slabs is the last)
        ProjRoute x;
        x.weight = WeightForm(f);
        const bool want = x.weight == WeightForm::F16Cache || x.weight == WeightForm::F16 ||
                          x.weight == WeightForm::F16Blocks || x.weight == WeightForm::I8Copy;
        EXPECT(pf::route_takes_f16_rows(x) == want, "form %s", pf::weight_form_name(x.weight));
        EXPECT(std::strcmp(pf::weight_form_name(x.weight), "?") != 0, "form %d has no name", f);
    }
}

void test_session_leg() {
    const WeightFacts with = facts(PF_QTYPE_Q8_0, true, false, true), without = facts(PF_QTYPE_Q8_0, true, false, false);
    EXPECT(pf::session_leg(PF_GEMM_INT8, with) == PF_GEMM_INT8, "recipe matrix: the 8-bit leg");
    EXPECT(pf::session_leg(PF_GEMM_INT8, without) == PF_GEMM_AUTO, "other matrices: auto");
    for (int32_t leg : {int32_t(PF_GEMM_AUTO), int32_t(PF_GEMM_F32), int32_t(PF_GEMM_F16)})
        EXPECT(pf::session_leg(leg, with) == leg && pf::session_leg(leg, without) == leg, "leg %d as asked", int(leg));
}

void test_layer_groups() {
    using L = pf::LayerWeights;
    for (bool attn : {true, false}) {
        const pf::ProjGroup *g = pf::layer_groups(attn);
        // Mixer in (several parts, side by side), mixer out (accumulate), FFN in, FFN out.
        EXPECT(g[pf::kMixerIn].count == (attn ? 3 : 4) && !g[pf::kMixerIn].accumulate, "mixer in");
        EXPECT(g[pf::kMixerOut].count == 1 && g[pf::kMixerOut].accumulate, "mixer out");
        EXPECT(g[pf::kFfnIn].count == 2 && !g[pf::kFfnIn].accumulate, "ffn in");
        EXPECT(g[pf::kFfnOut].count == 1 && g[pf::kFfnOut].accumulate, "ffn out");
        EXPECT(g[pf::kMixerOut].parts[0] == (attn ? &L::wo : &L::ssm_out), "mixer out part");
        EXPECT(g[pf::kFfnIn].parts[0] == &L::gate && g[pf::kFfnIn].parts[1] == &L::up, "gate | up order");
        EXPECT(g[pf::kFfnOut].parts[0] == &L::down, "down");
        // The output column order the layer loop reads (forward.cu: q | k | v, qkv | z | beta | alpha).
        if (attn)
            EXPECT(g[0].parts[0] == &L::wq && g[0].parts[1] == &L::wk && g[0].parts[2] == &L::wv, "q | k | v");
        else
            EXPECT(g[0].parts[0] == &L::qkv && g[0].parts[1] == &L::z && g[0].parts[2] == &L::beta &&
                       g[0].parts[3] == &L::alpha,
                   "qkv | z | beta | alpha");
        // The 8-bit recipe (docs/int8-recipe.md): attn_q or the GDN gate z, and gate | up.
        EXPECT(g[0].int8_recipe == (attn ? 0b001 : 0b0010), "mixer recipe %u", unsigned(g[0].int8_recipe));
        EXPECT(g[pf::kFfnIn].int8_recipe == 0b11 && g[pf::kMixerOut].int8_recipe == 0 &&
                   g[pf::kFfnOut].int8_recipe == 0,
               "ffn / out recipes");
        // Every matrix of a layer in exactly one group.
        int n = 0;
        for (int i = 0; i < pf::kLayerGroups; ++i) n += g[i].count;
        EXPECT(n == (attn ? 7 : 8), "%d matrices", n);
    }
}

}  // namespace

int main() {
    test_routes();
    test_session_leg();
    test_layer_groups();
    if (failures) {
        std::fprintf(stderr, "test_route: %d failures\n", failures);
        return 1;
    }
    std::printf("test_route: routes, session legs and layer groups as documented\n");
    return 0;
}
