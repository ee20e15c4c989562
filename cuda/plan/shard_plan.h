// shard_plan.h — the host half of tensor-parallel prefill (issue 30): how a model's heads, FFN
// columns and weights split over N ranks (one GPU each), Megatron style. Host-only (no CUDA, no
// NCCL); nothing runs it on a device yet (docs/architecture.md "Multi-GPU": the communicator,
// the sharded load and the all-reduces are not built). The shard plan's tests and fuzz target
// check every invariant below (shard_plan_valid).
//
// The split over N ranks, rank r (H, Hkv, Hk, Hv: attention, KV, GDN key and value heads):
//  - Attention: query heads [r H/N, (r+1) H/N). KV heads split the same way when Hkv % N == 0;
//    else, when N % Hkv == 0, replicated: rank r holds KV head r / (N/Hkv), the only one its
//    query heads read (spec.md B2: head h reads h / (H/Hkv)), so each KV head, its attn_k /
//    attn_v rows and its cache live on N/Hkv ranks. That is vLLM's rule past Hkv ranks, and
//    Qwen3.5 needs it (Hkv = 2 or 4 on 4 or 8 GPUs): the copies cost N/Hkv times a small
//    projection and cache, where refusing would leave those GPUs unused. Column-parallel attn_q
//    (qwen35: each head's [q | gate] rows), attn_k, attn_v; row-parallel attn_output (the
//    columns of the rank's heads), then an all-reduce.
//  - Gated DeltaNet: key heads [k0, k1) = [r Hk/N, (r+1) Hk/N), and the value heads paired with
//    them. GGUF pairs value head j with key head j mod Hk (spec.md G6, tiled), so those are
//    j = jj Hk + kk for jj < Hv/Hk, kk in [k0, k1): Hv/Hk runs of Hk/N heads. In the rank's
//    order (jj major) local value head p pairs with local key head p mod (Hk/N): the same tiled
//    rule on the rank's heads, so the GDN kernels run unchanged on a shard. A contiguous split of
//    the value heads would not do: with Hv = 2 Hk, rank 0's first Hv/N value heads read every
//    key head. Conv channels (attn_qkv rows, ssm_conv1d rows: q, k, v) follow their heads; the
//    z rows (attn_gate), ssm_beta / ssm_alpha rows, ssm_a and ssm_dt.bias follow the value heads;
//    ssm_norm (shared by the heads) is whole; ssm_out is row-parallel over the value heads'
//    columns, then an all-reduce.
//  - FFN: n_ff in units of ffn_down's quantization block (the largest over the layers: a K split
//    keeps whole blocks: 256 for K-quants and IQ4_XS, 32 for Q4_0 / Q8_0, 1 for F32 / F16 /
//    BF16); U units, rank r gets units [r U/N, (r+1) U/N): even when N divides U, else ranks
//    differ by one unit. ffn_gate / ffn_up column-parallel, ffn_down row-parallel, then an
//    all-reduce.
//  - Norms and token_embd whole (every rank embeds every token). The LM head is vocab-parallel:
//    rows [r V/N, (r+1) V/N) of output.weight (tied: of token_embd, which every rank holds
//    whole), its logits all-gathered.
// So a layer has two all-reduces of a [rows][n_embd] fp32 sum: after its mixer (attn_output or
// ssm_out) and after its FFN (ffn_down), each before the residual add.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/model_plan.h"
#include "prefill.h"

namespace pf {

constexpr int32_t kMaxShardRanks = 8;  // one host's GPUs

struct IndexRange {
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
};

enum class ShardSplit : int32_t {
    Whole,  // every rank holds the whole tensor
    Rows,   // a subset of the rows (ne[1]; a vector's elements): column-parallel for a projection
    Cols,   // a subset of the reduction dimension K (ne[0], whole blocks): row-parallel
};

// What runs after the projection that uses a tensor.
enum class ShardComm : int32_t {
    None,
    AllReduce,  // sum of the ranks' partial [rows][n_embd] outputs (attn_output, ssm_out, ffn_down)
    AllGather,  // the ranks' vocabulary slices of the logits (the LM head)
};

// `count` runs of `length` bytes: run i is bytes [src + i src_stride, + length) of the GGUF
// tensor's data and lands at [dst + i dst_stride, + length) of the rank's copy: one
// cudaMemcpy2D (width length, height count, pitches src_stride / dst_stride). A row split is one
// run per range of whole rows; a K split is one span of `rows` runs per range of columns.
struct ShardSpan {
    int64_t src = 0, dst = 0, length = 0, count = 1, src_stride = 0, dst_stride = 0;
};

// One tensor on one rank.
struct TensorShard {
    ShardSplit split = ShardSplit::Whole;
    ShardComm comm = ShardComm::None;
    std::vector<IndexRange> ranges;  // Rows: row ranges; Cols: column (element) ranges of K;
                                     // Whole: [0, rows). In the rank's order, adjacent ones merged
    std::vector<int64_t> ne;         // the rank's tensor, GGUF order
    int64_t bytes = 0;               // the rank's tensor: the spans' runs tile [0, bytes)
    std::vector<ShardSpan> spans;
};

// One rank: its heads and columns, its model and the pieces of every tensor.
struct RankShard {
    int32_t rank = 0;
    Hparams hp;                    // the rank's model: a valid model of the same architecture
                                   // (n_vocab: token_embd's rows, whole; the LM head's are `vocab`)
    IndexRange q_heads, kv_heads;  // attention
    IndexRange k_heads;            // GDN key heads (qwen35)
    std::vector<IndexRange> v_heads;        // GDN value heads, GGUF numbering, the rank's order
    std::vector<IndexRange> conv_channels;  // rows of attn_qkv / ssm_conv1d: [q | k | v runs]
    IndexRange ff;                 // FFN columns
    IndexRange vocab;              // the LM head's rows (logits columns)
    std::vector<TensorShard> tensors;  // parallel to ModelPlan::tensors
    int64_t weight_bytes = 0;          // every tensor's rank bytes
    // One sequence's state on this rank (session.cu sequence_bytes of the rank's model):
    int64_t kv_elems_per_token = 0;    // K and V of every attention layer
    int64_t gdn_state_bytes = 0;       // recurrent states [Hv/N][dk][dv] fp32 of the GDN layers
    int64_t conv_state_bytes = 0;      // conv windows [Kc - 1][conv channels] fp32
    int64_t kv_bytes_per_token(int32_t kv_dtype) const {
        return kv_elems_per_token * (kv_dtype == PF_KV_F32 ? 4 : 2);
    }
};

struct ShardPlan {
    int32_t n_ranks = 0;
    int32_t kv_replicas = 1;       // ranks holding each KV head: 1 (split) or N / Hkv
    int64_t ff_unit = 1;           // FFN columns per unit of the split (ffn_down's block)
    bool ff_even = true;           // every rank the same FFN width
    std::vector<RankShard> ranks;
};

// The plan of `model` (a ModelPlan whose tensors have `t` set: their types and byte counts) over
// n_ranks ranks. INVALID_ARGUMENT for n_ranks outside 1..kMaxShardRanks or a tensor without a
// type; UNSUPPORTED naming the dimension and the rank count when the model does not split that
// way (a head count not divisible by the ranks, a K split through a quantization block, fewer
// FFN blocks or vocabulary rows than ranks). n_ranks = 1 is the whole model: one span per tensor.
pf_status shard_plan(const ModelPlan &model, int32_t n_ranks, ShardPlan *out);

// Every invariant of a plan (for the tests and the fuzz target): each dimension's ranges tile it
// (KV heads: kv_replicas times each), every query head's KV head and every value head's key head
// is on its rank with the same local pairing, the rank's model has the shapes of its tensors,
// the spans stay inside each tensor and cover it once over the ranks (whole tensors N times,
// replicated KV weights kv_replicas times), their runs tile the rank's copy, the state sizes add
// up, and N = 1 is the whole model. False and a reason (valid until the next call).
bool shard_plan_valid(const ModelPlan &model, const ShardPlan &plan, const char **why);

}  // namespace pf
