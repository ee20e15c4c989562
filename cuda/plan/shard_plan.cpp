// shard_plan.cpp — see shard_plan.h. Host-only: what a sharded load would decide before it
// touches a device.
#include "plan/shard_plan.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "plan/qtype.h"

namespace pf {
namespace {

using Ranges = std::vector<IndexRange>;

// Drops empty ranges and merges each with the next when they touch (N = 1: one range).
Ranges merged(const Ranges &in) {
    Ranges out;
    for (const IndexRange &r : in) {
        if (r.size() <= 0) continue;
        if (!out.empty() && out.back().end == r.begin) out.back().end = r.end;
        else out.push_back(r);
    }
    return out;
}

Ranges scaled(const Ranges &in, int64_t by, int64_t offset = 0) {
    Ranges out;
    for (const IndexRange &r : in) out.push_back({offset + r.begin * by, offset + r.end * by});
    return out;
}

int64_t total(const Ranges &in) {
    int64_t n = 0;
    for (const IndexRange &r : in) n += r.size();
    return n;
}

// A tensor as rows of whole blocks: ne [k, n] is n rows of k elements, a vector [n] n rows of one.
struct Geometry {
    int64_t rows = 0, row_elems = 0, row_bytes = 0, blk_elems = 1, blk_bytes = 4;
};

pf_status geometry(const PlannedTensor &e, Geometry *g) {
    PF_CHECK_ARG(e.t != nullptr, "tensor-parallel plan: tensor %s has no type (plan it from a file)", e.name.c_str());
    const int32_t qtype = int32_t(e.t->type);
    if (!qtype_block(qtype, &g->blk_elems, &g->blk_bytes))
        return fail(PF_STATUS_UNSUPPORTED, "tensor-parallel plan: tensor %s has GGML type %d", e.name.c_str(), qtype);
    g->rows = e.ne.size() == 1 ? e.ne[0] : e.ne[1];
    g->row_elems = e.ne.size() == 1 ? 1 : e.ne[0];
    PF_CHECK_ARG(g->rows > 0 && g->row_elems > 0 && g->row_elems % g->blk_elems == 0,
                 "tensor-parallel plan: tensor %s: %lld elements per row is not whole %s blocks", e.name.c_str(),
                 (long long)g->row_elems, pf_qtype_name(qtype));
    g->row_bytes = g->row_elems / g->blk_elems * g->blk_bytes;
    PF_CHECK_ARG(g->rows * g->row_bytes == int64_t(e.t->bytes),
                 "tensor-parallel plan: tensor %s: %zu bytes, its shape and type make %lld", e.name.c_str(),
                 e.t->bytes, (long long)(g->rows * g->row_bytes));
    return PF_STATUS_OK;
}

// The spans of one tensor on one rank. `what` says in words what a K split's columns are (for
// the message when they cut through a quantization block).
pf_status shard_tensor(const PlannedTensor &e, ShardSplit split, ShardComm comm, const Ranges &ranges,
                       int32_t rank, int32_t n, const char *what, TensorShard *out) {
    Geometry g;
    PF_TRY(geometry(e, &g));
    out->split = split;
    out->comm = comm;
    out->ne = e.ne;
    out->spans.clear();
    const int64_t whole = split == ShardSplit::Cols ? g.row_elems : g.rows;
    out->ranges = split == ShardSplit::Whole ? Ranges{{0, g.rows}} : merged(ranges);
    const bool all = out->ranges.size() == 1 && out->ranges[0].begin == 0 && out->ranges[0].end == whole;
    if (split == ShardSplit::Whole || all) {
        out->bytes = int64_t(e.t->bytes);
        out->spans.push_back({0, 0, out->bytes, 1, out->bytes, out->bytes});
        return PF_STATUS_OK;
    }
    if (split == ShardSplit::Rows) {
        int64_t dst = 0;
        for (const IndexRange &r : out->ranges) {
            const int64_t len = r.size() * g.row_bytes;
            out->spans.push_back({r.begin * g.row_bytes, dst, len, 1, len, len});
            dst += len;
        }
        out->ne.back() = total(out->ranges);
        out->bytes = dst;
        return PF_STATUS_OK;
    }
    // K split: whole blocks of every row, so the rank's rows are its blocks back to back.
    int64_t row = 0;
    for (const IndexRange &r : out->ranges) {
        if (r.begin % g.blk_elems || r.size() % g.blk_elems)
            return fail(PF_STATUS_UNSUPPORTED,
                        "tensor-parallel plan over %d ranks: %s (%s) row-parallel over %s: rank %d's columns "
                        "[%lld, %lld) of %lld cut its %lld-element blocks", n, e.name.c_str(),
                        pf_qtype_name(int32_t(e.t->type)), what, rank, (long long)r.begin, (long long)r.end,
                        (long long)g.row_elems, (long long)g.blk_elems);
        row += r.size() / g.blk_elems * g.blk_bytes;
    }
    int64_t dst = 0;
    for (const IndexRange &r : out->ranges) {
        const int64_t len = r.size() / g.blk_elems * g.blk_bytes;
        out->spans.push_back({r.begin / g.blk_elems * g.blk_bytes, dst, len, g.rows, g.row_bytes, row});
        dst += len;
    }
    out->ne[0] = total(out->ranges);
    out->bytes = row * g.rows;
    return PF_STATUS_OK;
}

// A tensor's role in the split: what is cut, by which ranges, and what runs after it.
struct Role {
    ShardSplit split = ShardSplit::Whole;
    ShardComm comm = ShardComm::None;
    Ranges ranges;
    const char *what = "";
};

}  // namespace

pf_status shard_plan(const ModelPlan &m, int32_t n, ShardPlan *out) {
    const Hparams &hp = m.hp;
    PF_CHECK_ARG(n >= 1 && n <= kMaxShardRanks, "tensor-parallel plan: n_ranks=%d is outside 1..%d", n,
                 kMaxShardRanks);
    PF_CHECK_ARG(m.layers.size() == size_t(hp.n_layer) && hp.n_head > 0 && hp.n_head_kv > 0 && hp.n_ff > 0 &&
                     hp.n_vocab > 0 && hp.n_head % hp.n_head_kv == 0,
                 "tensor-parallel plan: the model plan is incomplete (no layers, heads, FFN or vocabulary)");
    const bool gdn = hp.arch == PF_ARCH_QWEN35;
    if (hp.n_head % n)
        return fail(PF_STATUS_UNSUPPORTED,
                    "tensor-parallel plan over %d ranks: n_head=%lld attention heads are not divisible by %d ranks",
                    n, (long long)hp.n_head, n);
    int32_t kv_rep = 1;
    if (hp.n_head_kv % n) {
        if (n % hp.n_head_kv)
            return fail(PF_STATUS_UNSUPPORTED,
                        "tensor-parallel plan over %d ranks: n_head_kv=%lld is not divisible by %d ranks, nor %d "
                        "ranks a multiple of %lld (KV heads split over the ranks, or each on ranks / n_head_kv "
                        "of them)", n, (long long)hp.n_head_kv, n, n, (long long)hp.n_head_kv);
        kv_rep = int32_t(n / hp.n_head_kv);
    }
    if (gdn) {
        PF_CHECK_ARG(hp.ssm_hk > 0 && hp.ssm_hv % hp.ssm_hk == 0 && hp.ssm_dk > 0 && hp.ssm_dv > 0,
                     "tensor-parallel plan: GDN heads ssm_hk=%lld, ssm_hv=%lld", (long long)hp.ssm_hk,
                     (long long)hp.ssm_hv);
        if (hp.ssm_hk % n)
            return fail(PF_STATUS_UNSUPPORTED,
                        "tensor-parallel plan over %d ranks: ssm_hk=%lld GDN key heads are not divisible by %d "
                        "ranks (value head j reads key head j mod ssm_hk, spec.md G6: a rank holds whole key heads "
                        "and every value head paired with them)", n, (long long)hp.ssm_hk, n);
    }
    if (hp.n_vocab < n)
        return fail(PF_STATUS_UNSUPPORTED,
                    "tensor-parallel plan over %d ranks: n_vocab=%lld LM head rows are fewer than %d ranks", n,
                    (long long)hp.n_vocab, n);

    // The FFN unit: the largest block of any ffn_down (its K split keeps whole blocks).
    int64_t unit = 1;
    const PlannedTensor *unit_of = nullptr;
    for (const PlannedTensor &e : m.tensors) {
        if (e.slot != TensorSlot::Layer || e.mat != &LayerWeights::down) continue;
        Geometry g;
        PF_TRY(geometry(e, &g));
        if (!unit_of || g.blk_elems > unit) {
            unit = g.blk_elems;
            unit_of = &e;
        }
    }
    PF_CHECK_ARG(hp.n_ff % unit == 0, "tensor-parallel plan: n_ff=%lld is not whole %lld-element blocks",
                 (long long)hp.n_ff, (long long)unit);
    const int64_t units = hp.n_ff / unit;
    if (units < n)
        return fail(PF_STATUS_UNSUPPORTED,
                    "tensor-parallel plan over %d ranks: n_ff=%lld FFN columns are %lld blocks of %lld (%s is %s): "
                    "fewer than %d ranks", n, (long long)hp.n_ff, (long long)units, (long long)unit,
                    unit_of ? unit_of->name.c_str() : "ffn_down",
                    unit_of ? pf_qtype_name(int32_t(unit_of->t->type)) : "?", n);

    ShardPlan plan;
    plan.n_ranks = n;
    plan.kv_replicas = kv_rep;
    plan.ff_unit = unit;
    plan.ff_even = units % n == 0;
    const int64_t H = hp.n_head, D = hp.head_dim, q_rows = hp.q_proj_dim() / H;  // q_rows: D or 2D ([q | gate])
    const int64_t Hk = hp.ssm_hk, runs = gdn ? hp.ssm_hv / Hk : 0;
    int32_t n_attn = 0;
    for (const LayerWeights &L : m.layers) n_attn += L.attn ? 1 : 0;
    const int64_t n_gdn = hp.n_layer - n_attn;

    for (int32_t r = 0; r < n; ++r) {
        RankShard rs;
        rs.rank = r;
        rs.q_heads = {r * H / n, (r + 1) * H / n};
        if (kv_rep == 1) rs.kv_heads = {r * hp.n_head_kv / n, (r + 1) * hp.n_head_kv / n};
        else rs.kv_heads = {r / kv_rep, r / kv_rep + 1};
        rs.ff = {unit * (r * units / n), unit * ((r + 1) * units / n)};
        rs.vocab = {r * hp.n_vocab / n, (r + 1) * hp.n_vocab / n};
        if (gdn) {
            const int64_t hk = Hk / n;
            rs.k_heads = {r * hk, (r + 1) * hk};
            Ranges v;
            for (int64_t jj = 0; jj < runs; ++jj) v.push_back({jj * Hk + rs.k_heads.begin, jj * Hk + rs.k_heads.end});
            rs.v_heads = merged(v);
            Ranges ch = {{rs.k_heads.begin * hp.ssm_dk, rs.k_heads.end * hp.ssm_dk},
                         {hp.key_dim() + rs.k_heads.begin * hp.ssm_dk, hp.key_dim() + rs.k_heads.end * hp.ssm_dk}};
            for (const IndexRange &x : scaled(rs.v_heads, hp.ssm_dv, 2 * hp.key_dim())) ch.push_back(x);
            rs.conv_channels = merged(ch);
        }
        rs.hp = hp;
        rs.hp.n_head = rs.q_heads.size();
        rs.hp.n_head_kv = rs.kv_heads.size();
        rs.hp.n_ff = rs.ff.size();
        if (gdn) {
            rs.hp.ssm_hk = rs.k_heads.size();
            rs.hp.ssm_hv = total(rs.v_heads);
        }

        const Ranges v_cols = scaled(rs.v_heads, hp.ssm_dv);
        rs.tensors.resize(m.tensors.size());
        for (size_t i = 0; i < m.tensors.size(); ++i) {
            const PlannedTensor &e = m.tensors[i];
            Role ro;
            auto rows = [&](Ranges x) {
                ro.split = ShardSplit::Rows;
                ro.ranges = std::move(x);
            };
            auto cols = [&](Ranges x, const char *what) {  // row-parallel: partial sums, all-reduced
                ro.split = ShardSplit::Cols;
                ro.comm = ShardComm::AllReduce;
                ro.ranges = std::move(x);
                ro.what = what;
            };
            if (e.slot == TensorSlot::Output) {
                rows({rs.vocab});
                ro.comm = ShardComm::AllGather;
            } else if (e.slot == TensorSlot::Layer && e.mat) {
                const MatrixField f = e.mat;
                if (f == &LayerWeights::gate || f == &LayerWeights::up) rows({rs.ff});
                else if (f == &LayerWeights::down) cols({rs.ff}, "its FFN columns");
                else if (f == &LayerWeights::wq) rows(scaled({rs.q_heads}, q_rows));
                else if (f == &LayerWeights::wk || f == &LayerWeights::wv) rows(scaled({rs.kv_heads}, D));
                else if (f == &LayerWeights::wo) cols(scaled({rs.q_heads}, D), "its query heads' columns");
                else if (f == &LayerWeights::qkv) rows(rs.conv_channels);
                else if (f == &LayerWeights::z) rows(v_cols);
                else if (f == &LayerWeights::beta || f == &LayerWeights::alpha) rows(rs.v_heads);
                else if (f == &LayerWeights::ssm_out) cols(v_cols, "its GDN value heads' columns");
                else return fail(PF_STATUS_INTERNAL, "tensor-parallel plan: no role for tensor %s", e.name.c_str());
            } else if (e.slot == TensorSlot::Layer && e.vec) {
                const VectorField f = e.vec;
                if (f == &LayerWeights::conv_w) rows(rs.conv_channels);
                else if (f == &LayerWeights::ssm_a || f == &LayerWeights::dt_bias) rows(rs.v_heads);
                // attn_norm, post_norm, q_norm, k_norm (per head dim), ssm_norm (per value dim): whole
            }
            PF_TRY(shard_tensor(e, ro.split, ro.comm, ro.ranges, r, n, ro.what, &rs.tensors[i]));
            rs.weight_bytes += rs.tensors[i].bytes;
        }
        rs.kv_elems_per_token = 2 * n_attn * rs.hp.kv_dim();
        if (gdn) {
            rs.gdn_state_bytes = n_gdn * 4 * rs.hp.ssm_hv * hp.ssm_dk * hp.ssm_dv;
            rs.conv_state_bytes = n_gdn * 4 * (hp.conv_kernel - 1) * total(rs.conv_channels);
        }
        plan.ranks.push_back(std::move(rs));
    }
    *out = std::move(plan);
    return PF_STATUS_OK;
}

// ---------------------------------------------------------------------------------------------
// The invariants

namespace {

thread_local std::string reason;

bool bad(const char **why, const std::string &what) {
    reason = what;
    *why = reason.c_str();
    return false;
}

// Each index of [0, size) is covered exactly `times` times by `ranges` (every one non-empty and
// inside). Sorting the ends is enough: coverage = starts - ends seen so far.
bool covers(const Ranges &ranges, int64_t size, int64_t times) {
    std::vector<std::pair<int64_t, int>> ev;
    for (const IndexRange &r : ranges) {
        if (r.begin < 0 || r.end > size || r.size() <= 0) return false;
        ev.push_back({r.begin, 1});
        ev.push_back({r.end, -1});
    }
    std::sort(ev.begin(), ev.end());
    int64_t depth = 0, at = 0;
    for (size_t i = 0; i < ev.size();) {
        const int64_t x = ev[i].first;
        if (x > at && depth != times) return false;  // [at, x) covered `depth` times
        while (i < ev.size() && ev[i].first == x) depth += ev[i++].second;
        at = x;
    }
    return at == size && depth == 0;
}

std::vector<int64_t> expand(const Ranges &rs) {
    std::vector<int64_t> v;
    for (const IndexRange &r : rs)
        for (int64_t i = r.begin; i < r.end; ++i) v.push_back(i);
    return v;
}

bool same_hparams(const Hparams &a, const Hparams &b) {
    return a.arch == b.arch && a.n_layer == b.n_layer && a.n_embd == b.n_embd && a.n_ff == b.n_ff &&
           a.n_vocab == b.n_vocab && a.n_head == b.n_head && a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim &&
           a.rope_dim == b.rope_dim && a.ssm_hk == b.ssm_hk && a.ssm_hv == b.ssm_hv && a.ssm_dk == b.ssm_dk &&
           a.ssm_dv == b.ssm_dv && a.conv_kernel == b.conv_kernel && a.interval == b.interval;
}

}  // namespace

bool shard_plan_valid(const ModelPlan &m, const ShardPlan &p, const char **why) {
    const Hparams &hp = m.hp;
    const int32_t n = p.n_ranks;
    const bool gdn = hp.arch == PF_ARCH_QWEN35;
    if (n < 1 || n > kMaxShardRanks || p.ranks.size() != size_t(n)) return bad(why, "rank count");
    std::vector<bool> attn;
    int64_t n_attn = 0;
    for (const LayerWeights &L : m.layers) {
        attn.push_back(L.attn);
        n_attn += L.attn ? 1 : 0;
    }
    const int64_t n_gdn = hp.n_layer - n_attn;

    // 1. Each dimension tiled by the ranks' ranges (KV heads kv_replicas times each).
    Ranges q, kv, k, v, ff, vocab, ch;
    for (const RankShard &rs : p.ranks) {
        q.push_back(rs.q_heads);
        kv.push_back(rs.kv_heads);
        ff.push_back(rs.ff);
        vocab.push_back(rs.vocab);
        if (gdn) {
            k.push_back(rs.k_heads);
            v.insert(v.end(), rs.v_heads.begin(), rs.v_heads.end());
            ch.insert(ch.end(), rs.conv_channels.begin(), rs.conv_channels.end());
        }
    }
    const int64_t rep = p.kv_replicas;
    if (rep < 1 || (rep == 1) != (hp.n_head_kv % n == 0) || (rep > 1 && rep * hp.n_head_kv != n))
        return bad(why, "kv_replicas " + std::to_string(rep) + " for " + std::to_string(hp.n_head_kv) + " KV heads");
    if (!covers(q, hp.n_head, 1)) return bad(why, "the query heads are not tiled");
    if (!covers(kv, hp.n_head_kv, rep)) return bad(why, "the KV heads are not tiled kv_replicas times");
    if (!covers(ff, hp.n_ff, 1)) return bad(why, "the FFN columns are not tiled");
    if (!covers(vocab, hp.n_vocab, 1)) return bad(why, "the vocabulary is not tiled");
    if (gdn && (!covers(k, hp.ssm_hk, 1) || !covers(v, hp.ssm_hv, 1) || !covers(ch, hp.conv_dim(), 1)))
        return bad(why, "the GDN key heads, value heads or conv channels are not tiled");

    int64_t kv_elems = 0, gdn_bytes = 0, conv_bytes = 0, ff_min = hp.n_ff, ff_max = 0;
    for (const RankShard &rs : p.ranks) {
        const std::string at = "rank " + std::to_string(rs.rank) + ": ";
        const Hparams &lh = rs.hp;
        if (rs.rank != int32_t(&rs - p.ranks.data())) return bad(why, at + "out of order");
        // 2. The rank's model: its counts (each at least 1: the ranges tile), the rest the model's.
        Hparams expect = hp;
        expect.n_head = rs.q_heads.size();
        expect.n_head_kv = rs.kv_heads.size();
        expect.n_ff = rs.ff.size();
        if (gdn) {
            expect.ssm_hk = rs.k_heads.size();
            expect.ssm_hv = total(rs.v_heads);
        }
        if (!same_hparams(lh, expect) || lh.n_head % lh.n_head_kv || (gdn && lh.ssm_hv % lh.ssm_hk))
            return bad(why, at + "its model's hyper-parameters");
        if (rs.ff.size() % p.ff_unit || rs.ff.begin % p.ff_unit) return bad(why, at + "FFN columns not in units");
        ff_min = std::min(ff_min, rs.ff.size());
        ff_max = std::max(ff_max, rs.ff.size());
        // 3. Pairing: local query head i reads local KV head i / (H_l / Hkv_l), which must be the
        // global head's KV head; local value head p pairs with local key head p mod Hk_l, which
        // must be its global key head j mod Hk (spec.md B2, G6).
        for (int64_t i = 0; i < lh.n_head; ++i) {
            const int64_t h = rs.q_heads.begin + i, g = h / (hp.n_head / hp.n_head_kv);
            if (g != rs.kv_heads.begin + i / (lh.n_head / lh.n_head_kv))
                return bad(why, at + "query head " + std::to_string(h) + " does not find its KV head");
        }
        if (gdn) {
            const std::vector<int64_t> vh = expand(rs.v_heads);
            for (size_t pi = 0; pi < vh.size(); ++pi)
                if (vh[pi] % hp.ssm_hk != rs.k_heads.begin + int64_t(pi) % lh.ssm_hk)
                    return bad(why, at + "value head " + std::to_string(vh[pi]) + " does not find its key head");
            // The local conv channels are [q | k | v] of the local heads, in the local head order.
            std::vector<int64_t> want;
            for (int64_t base : {int64_t(0), hp.key_dim()})
                for (int64_t c = rs.k_heads.begin * hp.ssm_dk; c < rs.k_heads.end * hp.ssm_dk; ++c)
                    want.push_back(base + c);
            for (int64_t j : vh)
                for (int64_t c = 0; c < hp.ssm_dv; ++c) want.push_back(2 * hp.key_dim() + j * hp.ssm_dv + c);
            if (expand(rs.conv_channels) != want) return bad(why, at + "conv channels out of head order");
        }
        // 4. The rank's tensors have the shapes its model's table asks for (the LM head: its rows).
        ModelPlan local;
        plan_tensor_table(lh, attn, m.tied, &local);
        if (local.tensors.size() != m.tensors.size() || rs.tensors.size() != m.tensors.size())
            return bad(why, at + "tensor count");
        int64_t wbytes = 0;
        for (size_t i = 0; i < m.tensors.size(); ++i) {
            const PlannedTensor &e = m.tensors[i];
            const TensorShard &ts = rs.tensors[i];
            const std::string tn = at + e.name + ": ";
            std::vector<int64_t> ne = local.tensors[i].ne;
            if (e.slot == TensorSlot::Output) ne[1] = rs.vocab.size();
            if (local.tensors[i].name != e.name || ts.ne != ne)
                return bad(why, tn + "shape differs from the rank's model");
            int64_t be = 0, bb = 0;
            if (!e.t || !qtype_block(int32_t(e.t->type), &be, &bb)) return bad(why, tn + "no type");
            const int64_t rows = ne.size() == 1 ? ne[0] : ne[1], row_elems = ne.size() == 1 ? 1 : ne[0];
            if (row_elems % be || ts.bytes != rows * (row_elems / be) * bb) return bad(why, tn + "bytes");
            const bool rowpar =
                e.mat == &LayerWeights::wo || e.mat == &LayerWeights::ssm_out || e.mat == &LayerWeights::down;
            ShardComm comm = ShardComm::None;
            if (rowpar) comm = ShardComm::AllReduce;
            else if (e.slot == TensorSlot::Output) comm = ShardComm::AllGather;
            if (ts.comm != comm || (ts.split == ShardSplit::Cols) != rowpar)
                return bad(why, tn + "split or collective");
            // The spans are the bytes of the ranges: whole rows, or whole blocks of every row.
            const int64_t src_rows = e.ne.size() == 1 ? e.ne[0] : e.ne[1];
            const int64_t src_row_bytes = int64_t(e.t->bytes) / src_rows;
            const int64_t unit = ts.split == ShardSplit::Cols ? be : 1;  // a block of a row, or a row
            const int64_t unit_bytes = ts.split == ShardSplit::Cols ? bb : src_row_bytes;
            if (ts.ranges.empty() || total(ts.ranges) != (ts.split == ShardSplit::Cols ? row_elems : rows))
                return bad(why, tn + "ranges and shape differ");
            const bool one =
                ts.spans.size() == 1 && ts.spans[0].count == 1 && ts.spans[0].length == int64_t(e.t->bytes);
            if (!one) {
                if (ts.spans.size() != ts.ranges.size()) return bad(why, tn + "a span per range");
                for (size_t k = 0; k < ts.spans.size(); ++k) {
                    const IndexRange &x = ts.ranges[k];
                    if (k > 0 && ts.ranges[k - 1].end == x.begin)
                        return bad(why, tn + "ranges not merged");
                    if (x.begin % unit || x.size() % unit || ts.spans[k].src != x.begin / unit * unit_bytes ||
                        ts.spans[k].length != x.size() / unit * unit_bytes)
                        return bad(why, tn + "a span is not its range's bytes");
                }
            }
            // 5. The runs stay inside the source tensor and tile the rank's copy: contiguous
            // spans directly, a K split's spans (one run per row) within one row of the copy.
            Ranges dst;
            const int64_t src_bytes = int64_t(e.t->bytes);
            const int64_t period = ts.spans.empty() || ts.spans[0].count == 1 ? ts.bytes : ts.spans[0].dst_stride;
            for (const ShardSpan &s : ts.spans) {
                if (s.length <= 0 || s.count < 1 || s.src < 0 || s.dst < 0 ||
                    (s.count > 1 && (s.src_stride < s.length || s.dst_stride < s.length)) ||
                    s.src + (s.count - 1) * s.src_stride + s.length > src_bytes)
                    return bad(why, tn + "a span outside the tensor");
                if ((s.count == 1) != (period == ts.bytes) ||
                    (s.count > 1 && (s.count != rows || s.dst_stride != period || s.dst + s.length > period)))
                    return bad(why, tn + "a K-split span is not one run per row of the copy");
                dst.push_back({s.dst, s.dst + s.length});
            }
            if (!covers(dst, period, 1) || (period != ts.bytes && period * rows != ts.bytes))
                return bad(why, tn + "the runs do not tile the rank's copy");
            if (n == 1 && (ts.spans.size() != 1 || ts.spans[0].src != 0 || ts.spans[0].length != src_bytes))
                return bad(why, tn + "one rank is not the whole tensor");
            wbytes += ts.bytes;
        }
        if (wbytes != rs.weight_bytes) return bad(why, at + "weight bytes");
        // 6. The state of the rank's model (session.cu sequence_bytes).
        if (rs.kv_elems_per_token != 2 * n_attn * lh.kv_dim() ||
            (gdn && (rs.gdn_state_bytes != n_gdn * 4 * lh.ssm_hv * lh.ssm_dk * lh.ssm_dv ||
                     rs.conv_state_bytes != n_gdn * 4 * (lh.conv_kernel - 1) * lh.conv_dim())))
            return bad(why, at + "state sizes");
        kv_elems += rs.kv_elems_per_token;
        gdn_bytes += rs.gdn_state_bytes;
        conv_bytes += rs.conv_state_bytes;
        if (n == 1 && !same_hparams(lh, hp)) return bad(why, "one rank is not the whole model");
    }
    if (p.ff_even != (ff_min == ff_max)) return bad(why, "ff_even");
    if (kv_elems != rep * 2 * n_attn * hp.kv_dim() ||
        (gdn && (gdn_bytes != n_gdn * 4 * hp.ssm_hv * hp.ssm_dk * hp.ssm_dv ||
                 conv_bytes != n_gdn * 4 * (hp.conv_kernel - 1) * hp.conv_dim())))
        return bad(why, "the ranks' states do not add up to the model's");

    // 7. Over the ranks the spans cover each tensor once (whole tensors n times, replicated KV
    // weights kv_replicas times). A K split's spans are periodic by rows: check one row.
    for (size_t i = 0; i < m.tensors.size(); ++i) {
        const PlannedTensor &e = m.tensors[i];
        int64_t times = 1;
        if (p.ranks[0].tensors[i].split == ShardSplit::Whole) times = n;
        else if (e.mat == &LayerWeights::wk || e.mat == &LayerWeights::wv) times = rep;
        const int64_t rows = e.ne.size() == 1 ? e.ne[0] : e.ne[1], src_bytes = int64_t(e.t->bytes);
        const int64_t row_bytes = src_bytes / rows;
        Ranges runs;
        bool periodic = false;
        for (const RankShard &rs : p.ranks) {
            const TensorShard &ts = rs.tensors[i];
            if (ts.split != p.ranks[0].tensors[i].split) return bad(why, e.name + ": ranks split it differently");
            for (const ShardSpan &s : ts.spans) {
                if (s.count == 1) {
                    runs.push_back({s.src, s.src + s.length});
                    continue;
                }
                if (s.count != rows || s.src_stride != row_bytes || s.src + s.length > row_bytes)
                    return bad(why, e.name + ": a K-split span is not one run per row");
                runs.push_back({s.src, s.src + s.length});
                periodic = true;
            }
        }
        if (!covers(runs, periodic ? row_bytes : src_bytes, times))
            return bad(why, e.name + ": the ranks do not cover it " + std::to_string(times) + " time(s)");
    }
    return true;
}

}  // namespace pf
