// fuzz_gguf.cpp — libFuzzer target: the GGUF reader and the model validation that
// pf_model_inspect / pf_model_load run before any device work, on arbitrary bytes.
// Contract checked beyond "no crash, no leak, no UB" (ASan + UBSan): every failure is FORMAT_ERROR
// or UNSUPPORTED with a message (bytes in memory are never an IO_ERROR, the status of reading a
// file); every tensor of a valid file lies inside the input (the upload reads each one: so does
// this target, byte for byte); the inspect report matches the plan.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/error.h"
#define PF_FUZZ_TARGET "fuzz_gguf"
#include "fuzz_common.h"
#include "plan/gguf.h"
#include "plan/model_plan.h"

namespace {

void check_failure(pf_status s) {
    if (s != PF_STATUS_FORMAT_ERROR && s != PF_STATUS_UNSUPPORTED) broken(pf_status_name(s));
    if (pf_last_error()[0] == '\0') broken("a failure without a message");
}

// Reads every byte of [p, p + n) so that ASan sees the whole span.
uint8_t touch(const uint8_t *p, size_t n) {
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= p[i];
    return x;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const pf_status s = pf::guard("fuzz_gguf", [&]() -> pf_status {
        pf::GgufFile f;
        PF_TRY(f.open_memory(data, size, "fuzz.gguf"));
        uint8_t sink = 0;
        for (const pf::GgufTensor &t : f.tensors()) {
            if (t.data < data || t.bytes > size || t.data > data + size - t.bytes)
                broken("a tensor outside the input");
            sink ^= touch(t.data, t.bytes);
        }
        asm volatile("" : : "r"(sink));  // keep the reads: ASan checks every tensor byte
        pf::ModelPlan plan;
        PF_TRY(pf::model_plan(f, &plan));
        size_t bytes = 0;
        for (const pf::PlannedTensor &e : plan.tensors) {
            if (!e.t || e.t->ne != e.ne) broken("a planned tensor that was not matched");
            if (e.kind != pf::TensorKind::Matrix && e.t->type != PF_QTYPE_F32) broken("a non-F32 vector");
            if (e.slot == pf::TensorSlot::Layer &&
                (e.layer < 0 || e.layer >= int64_t(plan.layers.size()) || (!e.mat == !e.vec)))
                broken("a layer tensor without a destination");
            bytes += e.t->bytes;
        }
        pf_model_info info;
        pf::model_plan_info(plan, &info);
        if (info.weight_bytes != bytes || info.n_layer <= 0 || info.n_vocab <= 0 ||
            info.n_attn_layers > info.n_layer)
            broken("the inspect report disagrees with the plan");
        // pf_model_inspect's in-memory twin must agree with the step-by-step result
        pf_model_info again;
        PF_TRY(pf::model_inspect_memory(data, size, "fuzz.gguf", &again));
        if (std::memcmp(&info, &again, sizeof info) != 0) broken("model_inspect_memory differs");
        return PF_STATUS_OK;
    });
    if (s != PF_STATUS_OK) check_failure(s);
    return 0;
}
