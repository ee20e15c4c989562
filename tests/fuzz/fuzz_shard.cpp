// fuzz_shard.cpp — libFuzzer target: the tensor-parallel plan (shard_plan) of a model whose
// hyper-parameters, layer schedule, output and tensor types are decoded from arbitrary bytes,
// over -1..9 ranks. Contract checked beyond "no crash, no leak, no UB": a failure is
// INVALID_ARGUMENT (a rank count outside 1..8, a tensor without a type) or UNSUPPORTED naming the
// rank count, and a message that names the plan; one rank always plans; a model of float
// tensors plans whenever its head counts, FFN width and vocabulary allow the split; an accepted
// plan has even head splits and passes every invariant of shard_plan_valid (each dimension tiled
// once, every value head on its key head's rank, the spans inside each tensor covering it once
// over the ranks and tiling each rank's copy, the rank's model of the shapes of its tensors).
//
// Input layout (zeros past the end; scripts/make_fuzz_seeds.py writes seeds in it):
//   0 flags: 1 qwen35, 2 tied, 4 float tensors only (F32), 8 one tensor without a type,
//            16 ffn_down / attn_v / attn_qkv Q6_K on odd layers (not with flag 4)
//   1 ranks = byte % 11 - 1      2 layers = 1 + byte % 8      3 attention layers (qwen35: bit il)
//   4 KV heads = 1 + byte % 8    5 query heads per KV head = 1 + byte % 6
//   6 head_dim = 16 << (byte % 5)   7 n_embd = 32 (1 + byte % 16)
//   8-9 n_ff = 32 (1 + u16 % 256)   10-11 n_vocab = 1 + u16 % 4096
//   12 GDN key heads = 1 + byte % 16   13 value heads per key head = 1 + byte % 4
//   14 GDN head dim = 16 << (byte % 4)  15 conv kernel = 2 + byte % 3
//   16-29 the type of token_embd, output, ffn_gate, ffn_up, ffn_down, attn_q, attn_k, attn_v,
//         attn_output, attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out: kTypes[byte % 9]
//         (F16 where the block does not divide the row, as llama-quantize falls back)
//   30 the tensor without a type (flag 8): index byte % count
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "base/error.h"
#define PF_FUZZ_TARGET "fuzz_shard"
#include "fuzz_common.h"
#include "plan/model_plan.h"
#include "plan/qtype.h"
#include "plan/shard_plan.h"

namespace {

const int32_t kTypes[9] = {PF_QTYPE_F32,  PF_QTYPE_F16,  PF_QTYPE_BF16, PF_QTYPE_Q4_0,  PF_QTYPE_Q8_0,
                           PF_QTYPE_Q4_K, PF_QTYPE_Q5_K, PF_QTYPE_Q6_K, PF_QTYPE_IQ4_XS};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Reader r{data, size};
    const uint8_t flags = r.u8();
    const bool gdn = flags & 1, tied = flags & 2, floats = flags & 4, untyped = flags & 8, alternate = flags & 16;
    const int32_t n = int32_t(r.u8() % 11) - 1;
    pf::Hparams hp;
    hp.arch = gdn ? PF_ARCH_QWEN35 : PF_ARCH_QWEN3;
    hp.n_layer = hp.n_block = 1 + r.u8() % 8;
    const uint8_t attn_bits = r.u8();
    hp.n_head_kv = 1 + r.u8() % 8;
    hp.n_head = hp.n_head_kv * (1 + r.u8() % 6);
    hp.head_dim = hp.rope_dim = int64_t(16) << (r.u8() % 5);
    hp.n_embd = 32 * (1 + r.u8() % 16);
    hp.n_ff = 32 * (1 + r.u16() % 256);
    hp.n_vocab = 1 + r.u16() % 4096;
    hp.rope_base = 1e6, hp.eps = 1e-6;
    const int64_t hk = 1 + r.u8() % 16, ratio = 1 + r.u8() % 4, dk = int64_t(16) << (r.u8() % 4), kc = 2 + r.u8() % 3;
    if (gdn) {
        hp.interval = 4, hp.conv_kernel = kc;
        hp.ssm_hk = hk, hp.ssm_hv = hk * ratio, hp.ssm_dk = hp.ssm_dv = dk;
    }
    std::vector<bool> attn;
    for (int64_t il = 0; il < hp.n_layer; ++il) attn.push_back(!gdn || (attn_bits >> il) & 1);
    int32_t role_type[14];
    for (int32_t &t : role_type) t = floats ? PF_QTYPE_F32 : kTypes[r.u8() % 9];
    const uint8_t drop = r.u8();

    pf::ModelPlan plan;
    pf::plan_tensor_table(hp, attn, tied, &plan);
    using pf::LayerWeights;
    const pf::MatrixField roles[] = {nullptr, nullptr, &LayerWeights::gate, &LayerWeights::up, &LayerWeights::down,
                                     &LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv, &LayerWeights::wo,
                                     &LayerWeights::qkv, &LayerWeights::z, &LayerWeights::beta, &LayerWeights::alpha,
                                     &LayerWeights::ssm_out};
    std::deque<pf::GgufTensor> tensors;
    for (pf::PlannedTensor &e : plan.tensors) {
        int32_t q = PF_QTYPE_F32;
        if (e.kind == pf::TensorKind::Matrix) {
            int role = e.slot == pf::TensorSlot::TokEmbd ? 0 : e.slot == pf::TensorSlot::Output ? 1 : -1;
            for (int i = 2; i < 14 && role < 0; ++i)
                if (e.mat == roles[i]) role = i;
            if (role < 0) broken("a matrix of no known role");
            q = role_type[role];
            if (alternate && !floats && (e.layer & 1) &&
                (e.mat == &LayerWeights::down || e.mat == &LayerWeights::wv || e.mat == &LayerWeights::qkv))
                q = PF_QTYPE_Q6_K;
            int64_t be = 0, bb = 0;
            pf::qtype_block(q, &be, &bb);
            if (e.ne[0] % be) q = PF_QTYPE_F16;
        }
        pf::GgufTensor t;
        t.name = e.name;
        t.ne = e.ne;
        t.type = uint32_t(q);
        if (pf::matrix_bytes(q, e.ne.size() == 1 ? 1 : e.ne[1], e.ne[0], &t.bytes, e.name.c_str()) != PF_STATUS_OK)
            broken("a tensor of the table has no byte count");
        tensors.push_back(t);
        e.t = &tensors.back();
    }
    if (untyped) plan.tensors[drop % plan.tensors.size()].t = nullptr;

    pf::ShardPlan sp;
    const pf_status s = pf::guard("fuzz_shard", [&] { return pf::shard_plan(plan, n, &sp); });
    const bool heads_split = n >= 1 && hp.n_head % n == 0 && (hp.n_head_kv % n == 0 || n % hp.n_head_kv == 0) &&
                             (!gdn || hp.ssm_hk % n == 0) && hp.n_ff >= n && hp.n_vocab >= n;
    if (s != PF_STATUS_OK) {
        if (std::strstr(pf_last_error(), "tensor-parallel plan") == nullptr)
            broken("a failure that does not name the plan");
        const bool bad_ranks = n < 1 || n > pf::kMaxShardRanks;
        if (s == PF_STATUS_INVALID_ARGUMENT) {
            if (!bad_ranks && !untyped) broken("INVALID_ARGUMENT for a valid model and rank count");
            return 0;
        }
        if (s != PF_STATUS_UNSUPPORTED) broken(pf_status_name(s));
        if (bad_ranks) broken("UNSUPPORTED for a rank count outside 1..8");
        if (untyped) return 0;  // the split's checks may come before the missing type
        if (n == 1) broken("one rank did not plan");
        if (floats && heads_split) broken("a float model refused a split its dimensions allow");
        const std::string ranks = std::to_string(n) + " ranks";
        if (std::strstr(pf_last_error(), ranks.c_str()) == nullptr)
            broken("a refusal that does not name the rank count");
        return 0;
    }
    if (untyped || n < 1 || n > pf::kMaxShardRanks) broken("a plan from wrong arguments");
    if (!heads_split) broken("a plan of uneven heads");
    const char *why = "";
    if (!pf::shard_plan_valid(plan, sp, &why)) broken(why);
    return 0;
}
