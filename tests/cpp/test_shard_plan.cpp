// test_shard_plan.cpp — the tensor-parallel plan (cuda/shard_plan.cpp) on every preset shape of
// pyprefill/formats/synth.py, in the quantization mixes of its presets, over 1, 2, 4 and 8 ranks:
// every invariant of shard_plan_valid (each dimension tiled once, every value head on its key
// head's rank, spans inside the tensor covering it once over the ranks, N = 1 the whole model),
// the splits each shape should get, one plan checked number by number, and the errors of the
// splits that cannot be made. Host only: no GPU, no NCCL. Prints one line per preset and rank
// count (largest rank's weights, its state), for the record.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "base/error.h"
#include "expect.h"
#include "plan/model_plan.h"
#include "plan/qtype.h"
#include "plan/shard_plan.h"

namespace {

// pyprefill/formats/synth.py PRESETS (spec.md §5).
struct Preset {
    const char *name;
    int32_t arch;
    int64_t d, layers, H, Hkv, D, ff, V;
    bool tied;
    int64_t hk = 0, hv = 0;
};
Preset qwen3(const char *n, int64_t d, int64_t L, int64_t H, int64_t Hkv, int64_t ff, bool tied, int64_t V = 151936) {
    return Preset{n, PF_ARCH_QWEN3, d, L, H, Hkv, 128, ff, V, tied};
}
Preset qwen35(const char *n, int64_t d, int64_t L, int64_t H, int64_t Hkv, int64_t hk, int64_t hv, int64_t ff,
              bool tied, int64_t V = 248320) {
    return Preset{n, PF_ARCH_QWEN35, d, L, H, Hkv, 256, ff, V, tied, hk, hv};
}
const Preset kPresets[] = {
    qwen3("qwen3-0.6b", 1024, 28, 16, 8, 3072, true),
    qwen3("qwen3-4b", 2560, 36, 32, 8, 9728, true),
    qwen3("qwen3-8b", 4096, 36, 32, 8, 12288, false),
    qwen35("qwen35-0.8b", 1024, 24, 8, 2, 16, 16, 3584, true),
    qwen35("qwen35-2b", 2048, 24, 8, 2, 16, 16, 6144, true),
    qwen35("qwen35-4b", 2560, 32, 16, 4, 16, 32, 9216, true),
    qwen35("qwen35-9b", 4096, 32, 16, 4, 16, 32, 12288, false),
    qwen35("qwen35-27b", 5120, 64, 24, 4, 16, 48, 17408, false),
    qwen3("qwen3-tiny", 256, 4, 4, 2, 512, true, 1024),
    qwen35("qwen35-tiny", 256, 4, 2, 1, 2, 4, 512, false, 1024),
    qwen35("qwen35-tiny-hv1", 256, 4, 2, 1, 2, 2, 512, false, 1024),
    qwen35("qwen35-tiny-hv3", 256, 4, 2, 1, 2, 6, 512, false, 1024),
};

pf::Hparams hparams(const Preset &p) {
    pf::Hparams hp;
    hp.arch = p.arch;
    hp.n_layer = hp.n_block = p.layers;
    hp.n_embd = p.d, hp.n_ff = p.ff, hp.n_vocab = p.V;
    hp.n_head = p.H, hp.n_head_kv = p.Hkv, hp.head_dim = p.D;
    hp.rope_dim = p.arch == PF_ARCH_QWEN35 ? 64 : p.D;
    hp.rope_base = p.arch == PF_ARCH_QWEN35 ? 1e7 : 1e6;
    hp.eps = 1e-6;
    if (p.arch == PF_ARCH_QWEN35) {
        hp.interval = 4, hp.conv_kernel = 4, hp.ssm_dk = hp.ssm_dv = 128;
        hp.ssm_hk = p.hk, hp.ssm_hv = p.hv;
    }
    return hp;
}

// The quantization mixes of synth.py's tensor_qtype (llama-quantize's Q4_K_M rules, the
// unsloth-like "ud" mix, and the plain ones), with its fallback for rows a block does not divide.
bool more_bits(int64_t il, int64_t n) { return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2; }

int32_t qtype_of(const std::string &mix, const pf::PlannedTensor &e, const pf::ModelPlan &m) {
    if (e.kind != pf::TensorKind::Matrix) return PF_QTYPE_F32;
    const std::string name = e.name;
    // "blk.7.attn_qkv.weight" -> attn_qkv, "token_embd.weight" -> token_embd
    const size_t at = name.rfind("blk.", 0) == 0 ? name.find('.', 4) + 1 : 0;
    const std::string role = name.substr(at, name.rfind('.') - at);
    const bool output_like = role == "output" || (role == "token_embd" && m.tied);
    int32_t q = PF_QTYPE_F32;
    if (mix == "f32") q = PF_QTYPE_F32;
    else if (mix == "f16") q = PF_QTYPE_F16;
    else if (mix == "q8_0") q = PF_QTYPE_Q8_0;
    else if (mix == "q4_0") q = PF_QTYPE_Q4_0;
    else if (mix == "q4_k_m") {
        if (output_like) q = PF_QTYPE_Q6_K;
        else if ((role == "attn_v" || role == "attn_qkv" || role == "ffn_down") && more_bits(e.layer, m.hp.n_layer))
            q = PF_QTYPE_Q6_K;
        else if (role == "attn_qkv") q = PF_QTYPE_Q5_K;
        else q = PF_QTYPE_Q4_K;
    } else if (mix == "ud") {
        if (role == "ffn_gate" || role == "ffn_up" || role == "ffn_down") q = PF_QTYPE_IQ4_XS;
        else if (role == "ssm_alpha" || role == "ssm_beta") q = PF_QTYPE_Q8_0;
        else if (role == "token_embd" || role == "output" || role == "attn_v" || role == "attn_qkv")
            q = PF_QTYPE_Q6_K;
        else q = PF_QTYPE_Q5_K;
    }
    int64_t be = 0, bb = 0;
    pf::qtype_block(q, &be, &bb);
    if (e.ne[0] % be) q = e.ne[0] % 32 == 0 ? PF_QTYPE_Q8_0 : PF_QTYPE_F16;
    return q;
}
const char *const kMixes[] = {"f32", "f16", "q8_0", "q4_0", "q4_k_m", "ud"};

// A ModelPlan as model_plan makes from a file of this shape and mix: the table, and each
// tensor's type and byte count (the tensors themselves are never needed).
struct Model {
    pf::ModelPlan plan;
    std::deque<pf::GgufTensor> tensors;  // what plan.tensors[i].t points at
};

void make_model(const pf::Hparams &hp, const std::string &mix, bool tied, Model *out) {
    std::vector<bool> attn;
    for (int64_t il = 0; il < hp.n_layer; ++il)
        attn.push_back(hp.arch != PF_ARCH_QWEN35 || (il + 1) % hp.interval == 0);
    pf::plan_tensor_table(hp, attn, tied, &out->plan);
    out->tensors.clear();
    for (pf::PlannedTensor &e : out->plan.tensors) {
        pf::GgufTensor t;
        t.name = e.name;
        t.ne = e.ne;
        t.type = uint32_t(qtype_of(mix, e, out->plan));
        size_t bytes = 0;
        const int64_t n = e.ne.size() == 1 ? 1 : e.ne[1];
        if (pf::matrix_bytes(int32_t(t.type), n, e.ne[0], &bytes, e.name.c_str()) != PF_STATUS_OK)
            std::fprintf(stderr, "matrix_bytes: %s\n", pf_last_error());
        t.bytes = bytes;
        out->tensors.push_back(t);
        e.t = &out->tensors.back();
        out->plan.tensor_bytes += bytes;
    }
}

pf_status plan_of(const Model &m, int32_t n, pf::ShardPlan *p) {
    return pf::guard("test_shard_plan", [&] { return pf::shard_plan(m.plan, n, p); });
}

const pf::TensorShard &shard(const Model &m, const pf::RankShard &r, const std::string &name) {
    for (size_t i = 0; i < m.plan.tensors.size(); ++i)
        if (m.plan.tensors[i].name == name) return r.tensors[i];
    std::fprintf(stderr, "no tensor %s\n", name.c_str());
    std::abort();
}

bool span_is(const pf::ShardSpan &s, int64_t src, int64_t dst, int64_t len, int64_t count, int64_t sstride,
             int64_t dstride) {
    return s.src == src && s.dst == dst && s.length == len && s.count == count && s.src_stride == sstride &&
           s.dst_stride == dstride;
}

// What each preset shape should give: every real shape splits over 1, 2, 4 and 8 ranks in every
// mix; the tiny ones (4 or 2 attention heads, 2 GDN key heads of 128, 512 FFN columns) cannot
// split everywhere: the expected message or nullptr.
const char *expected_error(const Preset &p, const std::string &mix, int32_t n) {
    const bool kq = mix == "q4_k_m" || mix == "ud";  // 256-element blocks
    const std::string name = p.name;
    if (name == "qwen3-tiny") {
        if (n == 8) return "n_head=4 attention heads are not divisible by 8 ranks";
        if (n == 4 && kq) return "n_ff=512 FFN columns are 2 blocks of 256";
        return nullptr;
    }
    if (name.rfind("qwen35-tiny", 0) == 0) {
        if (n >= 4) return "attention heads are not divisible by";
        // one key head per rank: ssm_out's 128 columns per value-head run cut a 256-block
        if (n == 2 && kq) return "ssm_out.weight";
        return nullptr;
    }
    return nullptr;
}

void test_presets() {
    for (const Preset &p : kPresets) {
        for (const char *mix : kMixes) {
            Model m;
            make_model(hparams(p), mix, p.tied, &m);
            for (int32_t n : {1, 2, 4, 8}) {
                pf::ShardPlan sp;
                const pf_status s = plan_of(m, n, &sp);
                const char *want = expected_error(p, mix, n);
                const std::string at = std::string(p.name) + " " + mix + " N=" + std::to_string(n);
                if (want) {
                    EXPECT(s == PF_STATUS_UNSUPPORTED, "%s: status %s, expected UNSUPPORTED", at.c_str(),
                           pf_status_name(s));
                    EXPECT(std::strstr(pf_last_error(), want) && std::strstr(pf_last_error(), "ranks"),
                           "%s: message '%s' lacks '%s'", at.c_str(), pf_last_error(), want);
                    continue;
                }
                EXPECT(s == PF_STATUS_OK, "%s: %s %s", at.c_str(), pf_status_name(s), pf_last_error());
                if (s != PF_STATUS_OK) continue;
                const char *why = "";
                EXPECT(pf::shard_plan_valid(m.plan, sp, &why), "%s: %s", at.c_str(), why);
                // N = 1 is the whole model; more ranks hold less than it each.
                const pf::RankShard &r0 = sp.ranks[0];
                if (n == 1) {
                    EXPECT(r0.weight_bytes == int64_t(m.plan.tensor_bytes), "%s: whole model bytes", at.c_str());
                    EXPECT(sp.kv_replicas == 1 && sp.ff_even, "%s", at.c_str());
                }
                // The Hkv = 2 / 4 shapes replicate their KV heads past Hkv ranks.
                EXPECT(sp.kv_replicas == (n > p.Hkv ? n / p.Hkv : 1), "%s: kv_replicas %d", at.c_str(),
                       sp.kv_replicas);
                EXPECT(n == 1 || r0.weight_bytes < int64_t(m.plan.tensor_bytes), "%s", at.c_str());
            }
        }
    }
}

// One plan, number by number: qwen35-4b (Hk 16, Hv 32: value heads j and j + 16 share key head
// j) in Q8_0 (34-byte blocks of 32) over 2 ranks, rank 1.
void test_qwen35_4b_rank1() {
    Model m;
    make_model(hparams(kPresets[5]), "q8_0", true, &m);
    pf::ShardPlan sp;
    EXPECT(plan_of(m, 2, &sp) == PF_STATUS_OK, "%s", pf_last_error());
    if (sp.ranks.size() != 2) return;
    const pf::RankShard &r = sp.ranks[1];
    EXPECT(r.q_heads.begin == 8 && r.q_heads.end == 16 && r.kv_heads.begin == 2 && r.kv_heads.end == 4,
           "attention heads");
    EXPECT(r.k_heads.begin == 8 && r.k_heads.end == 16, "key heads");
    EXPECT(r.v_heads.size() == 2 && r.v_heads[0].begin == 8 && r.v_heads[0].end == 16 && r.v_heads[1].begin == 24 &&
               r.v_heads[1].end == 32, "value heads: the two runs paired with key heads 8..15");
    // conv channels: q [8, 16) x 128, k 2048 + the same, v 4096 + [8, 16) x 128 and 4096 + [24, 32) x 128
    const int64_t ch[4][2] = {{1024, 2048}, {3072, 4096}, {5120, 6144}, {7168, 8192}};
    EXPECT(r.conv_channels.size() == 4, "conv channel ranges: %zu", r.conv_channels.size());
    for (size_t i = 0; i < 4 && i < r.conv_channels.size(); ++i)
        EXPECT(r.conv_channels[i].begin == ch[i][0] && r.conv_channels[i].end == ch[i][1], "conv range %zu", i);
    EXPECT(r.ff.begin == 4608 && r.ff.end == 9216 && sp.ff_unit == 32 && sp.ff_even, "FFN columns");
    EXPECT(r.hp.n_head == 8 && r.hp.n_head_kv == 2 && r.hp.ssm_hk == 8 && r.hp.ssm_hv == 16 && r.hp.n_ff == 4608 &&
               r.hp.conv_dim() == 4096, "the rank's model");
    // attn_qkv [2560, 8192] Q8_0: 2720-byte rows; four row ranges of 1024 rows
    const pf::TensorShard &qkv = shard(m, r, "blk.0.attn_qkv.weight");
    EXPECT(qkv.split == pf::ShardSplit::Rows && qkv.spans.size() == 4 && qkv.ne[1] == 4096, "attn_qkv");
    for (size_t i = 0; i < 4 && i < qkv.spans.size(); ++i)
        EXPECT(span_is(qkv.spans[i], ch[i][0] * 2720, int64_t(i) * 1024 * 2720, 1024 * 2720, 1, 1024 * 2720,
                       1024 * 2720), "attn_qkv span %zu", i);
    // ssm_out [4096, 2560] Q8_0: 4352-byte rows, the rank's 2 x 1024 columns = 2 x 1088 bytes of each
    const pf::TensorShard &out = shard(m, r, "blk.0.ssm_out.weight");
    EXPECT(out.split == pf::ShardSplit::Cols && out.comm == pf::ShardComm::AllReduce && out.spans.size() == 2 &&
               out.ne[0] == 2048 && out.ne[1] == 2560 && out.bytes == 2176 * 2560, "ssm_out");
    if (out.spans.size() == 2) {
        EXPECT(span_is(out.spans[0], 1088, 0, 1088, 2560, 4352, 2176), "ssm_out span 0");
        EXPECT(span_is(out.spans[1], 3264, 1088, 1088, 2560, 4352, 2176), "ssm_out span 1");
    }
    // ffn_down [9216, 2560] Q8_0: 9792-byte rows, the second half of each
    const pf::TensorShard &down = shard(m, r, "blk.0.ffn_down.weight");
    EXPECT(down.spans.size() == 1 && span_is(down.spans[0], 4896, 0, 4896, 2560, 9792, 4896), "ffn_down");
    // ssm_beta [2560, 32]: value heads 8..15 and 24..31 (rows of 2720 bytes)
    const pf::TensorShard &beta = shard(m, r, "blk.0.ssm_beta.weight");
    EXPECT(beta.spans.size() == 2 && span_is(beta.spans[0], 8 * 2720, 0, 8 * 2720, 1, 8 * 2720, 8 * 2720) &&
               span_is(beta.spans[1], 24 * 2720, 8 * 2720, 8 * 2720, 1, 8 * 2720, 8 * 2720), "ssm_beta");
    // attn_gate (z) [2560, 4096]: the value heads' 128 rows each, like attn_qkv's v part
    const pf::TensorShard &z = shard(m, r, "blk.0.attn_gate.weight");
    EXPECT(z.spans.size() == 2 && span_is(z.spans[0], 1024 * 2720, 0, 1024 * 2720, 1, 1024 * 2720, 1024 * 2720) &&
               span_is(z.spans[1], 3072 * 2720, 1024 * 2720, 1024 * 2720, 1, 1024 * 2720, 1024 * 2720), "attn_gate");
    // ssm_conv1d (F32 [4, 8192]: 16-byte rows): the conv channels of attn_qkv
    const pf::TensorShard &conv = shard(m, r, "blk.0.ssm_conv1d.weight");
    EXPECT(conv.spans.size() == 4 && conv.bytes == 4096 * 16 && conv.ne[0] == 4 && conv.ne[1] == 4096, "ssm_conv1d");
    for (size_t i = 0; i < 4 && i < conv.spans.size(); ++i)
        EXPECT(conv.spans[i].src == ch[i][0] * 16 && conv.spans[i].length == 1024 * 16, "ssm_conv1d span %zu", i);
    // FFN gate / up: rows [4608, 9216) of 2720 bytes
    for (const char *t : {"blk.0.ffn_gate.weight", "blk.7.ffn_up.weight"}) {
        const pf::TensorShard &g = shard(m, r, t);
        EXPECT(g.spans.size() == 1 && span_is(g.spans[0], 4608 * 2720, 0, 4608 * 2720, 1, 4608 * 2720, 4608 * 2720),
               "%s", t);
    }
    // attn_k / attn_v [2560, 4 x 256]: KV heads 2, 3 = rows [512, 1024)
    for (const char *t : {"blk.3.attn_k.weight", "blk.3.attn_v.weight"}) {
        const pf::TensorShard &k = shard(m, r, t);
        EXPECT(k.spans.size() == 1 && k.spans[0].src == 512 * 2720 && k.bytes == 512 * 2720 && k.ne[1] == 512, "%s",
               t);
    }
    for (const char *t : {"blk.3.attn_q_norm.weight", "blk.3.attn_k_norm.weight", "blk.3.attn_norm.weight"})
        EXPECT(shard(m, r, t).split == pf::ShardSplit::Whole, "%s whole", t);
    const pf::TensorShard &dt = shard(m, r, "blk.1.ssm_dt.bias");
    EXPECT(dt.spans.size() == 2 && dt.spans[0].src == 32 && dt.spans[1].src == 96 && dt.bytes == 64, "ssm_dt.bias");
    // ssm_a (F32 [32]): the same heads, 4 bytes each
    const pf::TensorShard &a = shard(m, r, "blk.0.ssm_a");
    EXPECT(a.spans.size() == 2 && a.spans[0].src == 32 && a.spans[1].src == 96 && a.bytes == 64, "ssm_a");
    // attn_q [2560, 2 x 16 x 256] (rows per head [q | gate]): heads 8..15 = rows [4096, 8192)
    const pf::TensorShard &wq = shard(m, r, "blk.3.attn_q.weight");
    EXPECT(wq.spans.size() == 1 && wq.spans[0].src == 4096 * 2720 && wq.ne[1] == 4096, "attn_q");
    const pf::TensorShard &wo = shard(m, r, "blk.3.attn_output.weight");
    EXPECT(wo.spans.size() == 1 && span_is(wo.spans[0], 2048 / 32 * 34, 0, 2048 / 32 * 34, 2560, 4096 / 32 * 34,
                                           2048 / 32 * 34), "attn_output");
    EXPECT(shard(m, r, "blk.0.ssm_norm.weight").split == pf::ShardSplit::Whole, "ssm_norm whole");
    EXPECT(shard(m, r, "token_embd.weight").split == pf::ShardSplit::Whole && r.vocab.begin == 124160 &&
               r.vocab.end == 248320, "tied: token_embd whole, the LM head's rows the second half");
    // state: 8 attention layers x K and V x 2 KV heads x 256; 24 GDN layers of 16 x 128 x 128 and 3 x 4096 floats
    EXPECT(r.kv_elems_per_token == 8192 && r.kv_bytes_per_token(PF_KV_F16) == 16384 &&
               r.kv_bytes_per_token(PF_KV_F32) == 32768, "KV per token");
    EXPECT(r.gdn_state_bytes == 24LL * 4 * 16 * 128 * 128 && r.conv_state_bytes == 24LL * 4 * 3 * 4096, "GDN state");
}

// Replicated KV heads: qwen35-27b (24 heads, 4 KV heads) over 8 ranks: 3 query heads each, KV
// head r / 2 on ranks r (twice each), and the uneven FFN (68 blocks of 256 over 8 ranks).
void test_replicated_kv() {
    Model m;
    make_model(hparams(kPresets[7]), "q4_k_m", false, &m);
    pf::ShardPlan sp;
    EXPECT(plan_of(m, 8, &sp) == PF_STATUS_OK, "%s", pf_last_error());
    if (sp.ranks.size() != 8) return;
    EXPECT(sp.kv_replicas == 2 && sp.ff_unit == 256 && !sp.ff_even, "27b over 8");
    for (const pf::RankShard &r : sp.ranks) {
        EXPECT(r.q_heads.begin == 3 * r.rank && r.kv_heads.begin == r.rank / 2 && r.kv_heads.size() == 1, "rank %d",
               r.rank);
        EXPECT(r.ff.size() == 256 * 8 || r.ff.size() == 256 * 9, "rank %d ff %lld", r.rank, (long long)r.ff.size());
        EXPECT(r.v_heads.size() == 3 && r.k_heads.size() == 2, "rank %d: 3 runs of 2 value heads", r.rank);
    }
    const pf::TensorShard &k0 = shard(m, sp.ranks[0], "blk.3.attn_k.weight");
    const pf::TensorShard &k1 = shard(m, sp.ranks[1], "blk.3.attn_k.weight");
    EXPECT(k0.spans.size() == 1 && k1.spans.size() == 1 && k0.spans[0].src == k1.spans[0].src,
           "ranks 0, 1 share KV head 0");
    const pf::TensorShard &out = shard(m, sp.ranks[7], "output.weight");
    EXPECT(out.comm == pf::ShardComm::AllGather && out.ne[1] == 248320 / 8, "vocab-parallel LM head");
}

// The splits that cannot be made, and the arguments that are wrong.
void test_errors() {
    struct Case {
        const char *what;
        pf::Hparams hp;
        int32_t n;
        pf_status status;
        const char *message;
    };
    pf::Hparams q3 = hparams(kPresets[2]), q27 = hparams(kPresets[7]);
    pf::Hparams gdn3 = hparams(kPresets[3]);  // 12 heads, 3 KV heads, 16 key heads: only the GDN split fails over 3
    gdn3.n_head = 12, gdn3.n_head_kv = 3;
    pf::Hparams vocab4 = q3;
    vocab4.n_vocab = 4;
    pf::Hparams kv3 = q3;  // 24 heads over 6 KV heads: 4 ranks neither divide nor are a multiple of 6
    kv3.n_head = 24, kv3.n_head_kv = 6;
    const Case cases[] = {
        {"0 ranks", q3, 0, PF_STATUS_INVALID_ARGUMENT, "n_ranks=0 is outside 1..8"},
        {"9 ranks", q3, 9, PF_STATUS_INVALID_ARGUMENT, "n_ranks=9 is outside 1..8"},
        {"-1 ranks", q3, -1, PF_STATUS_INVALID_ARGUMENT, "n_ranks=-1"},
        {"heads over 3", q3, 3, PF_STATUS_UNSUPPORTED, "n_head=32 attention heads are not divisible by 3 ranks"},
        {"KV heads over 3", q27, 3, PF_STATUS_UNSUPPORTED, "n_head_kv=4 is not divisible by 3 ranks"},
        {"KV heads over 6", q27, 6, PF_STATUS_UNSUPPORTED, "n_head_kv=4 is not divisible by 6 ranks"},
        {"KV heads 6 over 4", kv3, 4, PF_STATUS_UNSUPPORTED, "n_head_kv=6 is not divisible by 4 ranks"},
        {"GDN key heads over 3", gdn3, 3, PF_STATUS_UNSUPPORTED,
         "ssm_hk=16 GDN key heads are not divisible by 3 ranks"},
        {"vocabulary over 8", vocab4, 8, PF_STATUS_UNSUPPORTED, "n_vocab=4 LM head rows are fewer than 8 ranks"},
    };
    for (const Case &c : cases) {
        Model m;
        make_model(c.hp, "q4_k_m", false, &m);
        pf::ShardPlan sp;
        const pf_status s = plan_of(m, c.n, &sp);
        EXPECT(s == c.status, "%s: %s (%s)", c.what, pf_status_name(s), pf_last_error());
        EXPECT(std::strstr(pf_last_error(), c.message) != nullptr, "%s: '%s' lacks '%s'", c.what, pf_last_error(),
               c.message);
    }
    // A K split through a block: one attention head of 128 (qwen3-tiny over 4 ranks) in Q4_K.
    Model m;
    pf::Hparams t = hparams(kPresets[8]);
    t.n_ff = 1024;  // 4 blocks of 256: the FFN splits, attn_output does not
    make_model(t, "q4_k_m", true, &m);
    pf::ShardPlan sp;
    EXPECT(plan_of(m, 4, &sp) == PF_STATUS_UNSUPPORTED, "%s", pf_last_error());
    EXPECT(std::strstr(pf_last_error(), "blk.0.attn_output.weight (Q4_K) row-parallel over its query heads' columns: "
                                        "rank 0's columns [0, 128) of 512 cut its 256-element blocks"),
           "%s", pf_last_error());
    // A tensor without its type (a table that was not checked against a file).
    Model bare;
    make_model(q3, "q8_0", false, &bare);
    bare.plan.tensors[5].t = nullptr;
    EXPECT(plan_of(bare, 2, &sp) == PF_STATUS_INVALID_ARGUMENT && std::strstr(pf_last_error(), "has no type"), "%s",
           pf_last_error());
}

// The record: each real shape in Q4_K_M, the largest rank's weights and per-sequence state.
void print_table() {
    std::printf("%-12s %2s %9s %4s %5s %12s %12s %12s\n", "preset", "N", "kv_repl", "ff", "even", "max rank MiB",
                "KV B/token", "GDN+conv MiB");
    for (const Preset &p : kPresets) {
        if (std::strstr(p.name, "tiny")) continue;
        Model m;
        make_model(hparams(p), "q4_k_m", p.tied, &m);
        for (int32_t n : {1, 2, 4, 8}) {
            pf::ShardPlan sp;
            if (plan_of(m, n, &sp) != PF_STATUS_OK) continue;
            int64_t w = 0, kv = 0, st = 0, ff = 0;
            for (const pf::RankShard &r : sp.ranks) {
                if (r.weight_bytes <= w) continue;
                w = r.weight_bytes;
                kv = r.kv_bytes_per_token(PF_KV_F16);
                st = r.gdn_state_bytes + r.conv_state_bytes;
                ff = r.ff.size();
            }
            std::printf("%-12s %2d %9d %4lld %5s %12.1f %12lld %12.2f\n", p.name, n, sp.kv_replicas, (long long)ff,
                        sp.ff_even ? "yes" : "no", double(w) / (1 << 20), (long long)kv, double(st) / (1 << 20));
        }
    }
}

}  // namespace

int main() {
    test_presets();
    test_qwen35_4b_rank1();
    test_replicated_kv();
    test_errors();
    print_table();
    if (failures) {
        std::fprintf(stderr, "test_shard_plan: %d failure(s)\n", failures);
        return 1;
    }
    std::printf("test_shard_plan: ok\n");
    return 0;
}
