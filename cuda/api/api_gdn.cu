// api_gdn.cu — kernel-level C API of the Gated DeltaNet ops (gdn.cuh). Each entry checks every
// argument in the order of api_views.h (scalars and shapes, NULL buffers, ctx, ownership and
// fit, overlaps) before any device work, then calls the internal entry on the context's stream.
#include <algorithm>
#include <vector>

#include "api/api_views.h"
#include "base/cuda_check.cuh"
#include "kernels/gdn/gdn.cuh"
#include "kernels/rows/rows.cuh"  // store_i64s

namespace {

pf_status v_heads_arg(const char *fn, int64_t rows, int32_t n_v_heads) {
    PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
    PF_CHECK_ARG(n_v_heads >= 1 && n_v_heads <= 65536, "%s: n_v_heads=%d out of range [1, 65536]",
                 fn, n_v_heads);
    return PF_STATUS_OK;
}

}  // namespace

extern "C" PF_API pf_status pf_gdn_conv1d(pf_context *ctx, const pf_view *m, const pf_view *window,
                                         const pf_view *weight, const pf_view *u, int64_t rows,
                                         int64_t conv_dim, int32_t kc) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(conv_dim >= 1 && conv_dim <= (int64_t(1) << 31),
                     "%s: conv_dim=%lld out of range [1, 2^31]", fn, (long long)conv_dim);
        PF_CHECK_ARG(kc >= 2 && kc <= pf::kGdnMaxConvKernel, "%s: kc=%d must be in [2, %d]", fn,
                     kc, pf::kGdnMaxConvKernel);
        pf::RowsView vm, vwin, vw, vu;
        PF_TRY(pf::matrix_arg(fn, m, "m", rows, conv_dim, conv_dim, &vm));
        PF_TRY(pf::vector_arg(fn, window, "window", (kc - 1) * conv_dim, &vwin));
        PF_TRY(pf::vector_arg(fn, weight, "weight", kc * conv_dim, &vw));
        PF_TRY(pf::matrix_arg(fn, u, "u", rows, conv_dim, conv_dim, &vu));
        PF_TRY(pf::check_views(fn, ctx, {vm, vwin, vw, vu}));
        PF_CHECK_ARG(!pf::views_overlap(vu, vm), "%s: u overlaps m", fn);
        PF_CHECK_ARG(!pf::views_overlap(vu, vwin), "%s: u overlaps window", fn);
        PF_CHECK_ARG(!pf::views_overlap(vu, vw), "%s: u overlaps weight", fn);
        PF_CHECK_ARG(!pf::views_overlap(vwin, vm), "%s: window overlaps m", fn);
        PF_CHECK_ARG(!pf::views_overlap(vwin, vw), "%s: window overlaps weight", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_conv1d_rows(vm.cmat(), vwin.ptr(), vw.ptr(), vu.mat(), rows, conv_dim, kc, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_l2norm(pf_context *ctx, const pf_view *x, int64_t rows,
                                         int32_t n_heads, int32_t head_dim, int64_t head_stride,
                                         float eps, float scale) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t width = 0, natural_ld = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, head_dim, &head_stride, &width, &natural_ld));
        PF_TRY(pf::eps_arg(fn, eps));
        PF_CHECK_ARG(std::isfinite(scale), "%s: scale=%g must be finite", fn, (double)scale);
        pf::RowsView vx;
        PF_TRY(pf::matrix_arg(fn, x, "x", rows, width, natural_ld, &vx));
        PF_TRY(pf::check_views(fn, ctx, {vx}));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_l2norm_rows(vx.mat(), rows, n_heads, head_stride, head_dim, eps, scale, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_gates_args_init(pf_gdn_gates_args *args, size_t struct_size) {
    return pf::args_init(args, struct_size, __func__, "pf_gdn_gates_args");
}

extern "C" PF_API pf_status pf_gdn_gates(pf_context *ctx, const pf_gdn_gates_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_gates_args_init"));
        const pf_gdn_gates_args &a = *args;
        PF_TRY(v_heads_arg(fn, a.rows, a.n_v_heads));
        const int64_t h = a.n_v_heads;
        const pf::RowsView vb = pf::matrix_view(a.b, "b", a.rows, h, h),
                           va = pf::matrix_view(a.alpha, "alpha", a.rows, h, h),
                           vssm = pf::vector_view(a.ssm_a, "ssm_a", h),
                           vdt = pf::vector_view(a.dt_bias, "dt_bias", h),
                           vbeta = pf::matrix_view(a.beta, "beta", a.rows, h, h),
                           vg = pf::matrix_view(a.g, "g", a.rows, h, h);
        PF_TRY(pf::check_views(fn, ctx, {vb, va, vssm, vdt, vbeta, vg}));
        for (const pf::RowsView *out : {&vbeta, &vg})
            for (const pf::RowsView *in : {&vb, &va, &vssm, &vdt})
                PF_CHECK_ARG(!pf::views_overlap(*out, *in), "%s: %s overlaps %s", fn, out->name,
                             in->name);
        PF_CHECK_ARG(!pf::views_overlap(vbeta, vg), "%s: beta overlaps g", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        pf::GdnGatesArgs g;
        g.b = vb.cmat();
        g.alpha = va.cmat();
        g.ssm_a = vssm.ptr();
        g.dt_bias = vdt.ptr();
        g.beta = vbeta.mat();
        g.g = vg.mat();
        g.rows = a.rows;
        g.n_v_heads = a.n_v_heads;
        return pf::gdn_gates_rows(g, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_gated_rms_norm_args_init(pf_gdn_gated_rms_norm_args *args,
                                                           size_t struct_size) {
    return pf::args_init(args, struct_size, __func__, "pf_gdn_gated_rms_norm_args",
                         [](pf_gdn_gated_rms_norm_args &a) { a.eps = 1e-6f; });  // qwen35's eps
}

extern "C" PF_API pf_status pf_gdn_gated_rms_norm(pf_context *ctx,
                                                 const pf_gdn_gated_rms_norm_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_gated_rms_norm_args_init"));
        const pf_gdn_gated_rms_norm_args &a = *args;
        PF_TRY(v_heads_arg(fn, a.rows, a.n_v_heads));
        PF_CHECK_ARG(a.dv >= 1 && a.dv <= 65536, "%s: dv=%d out of range [1, 65536]", fn, a.dv);
        PF_TRY(pf::eps_arg(fn, a.eps));
        const int64_t width = (int64_t)a.n_v_heads * a.dv;
        const pf::RowsView vo = pf::matrix_view(a.o, "o", a.rows, width, width),
                           vz = pf::matrix_view(a.z, "z", a.rows, width, width),
                           vw = pf::vector_view(a.w, "w", a.dv),
                           vy = pf::matrix_view(a.y, "y", a.rows, width, width);
        PF_TRY(pf::check_views(fn, ctx, {vo, vz, vw, vy}));
        PF_CHECK_ARG(pf::views_same(vy, vo) || !pf::views_overlap(vy, vo),
                     "%s: y overlaps o (only y == o, same offset and ld, is allowed)", fn);
        PF_CHECK_ARG(!pf::views_overlap(vy, vz), "%s: y overlaps z", fn);
        PF_CHECK_ARG(!pf::views_overlap(vy, vw), "%s: y overlaps w", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        pf::GdnGatedNormArgs n;
        n.o = vo.cmat();
        n.z = vz.cmat();
        n.w = vw.ptr();
        n.rows = a.rows;
        n.n_v_heads = a.n_v_heads;
        n.dv = a.dv;
        n.eps = a.eps;
        return pf::gdn_gated_rms_norm_rows(n, vy.mat(), ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_scan_args_init(pf_gdn_scan_args *args, size_t struct_size) {
    return pf::args_init(args, struct_size, __func__, "pf_gdn_scan_args",
                         [](pf_gdn_scan_args &a) { a.path = PF_GDN_SCAN_AUTO; });
}

namespace {

// The scalar checks of pf_gdn_scan and pf_gdn_scan_plan, and the path a call runs (AUTO: `tuned`,
// the context's tuning.gdn_scan, first; gdn_scan_choose).
pf_status scan_plan(const char *fn, const pf_gdn_scan_args &a, int32_t tuned, int32_t *path, size_t *ws) {
    PF_CHECK_ARG(a.rows >= 0, "%s: rows=%lld < 0", fn, (long long)a.rows);
    PF_CHECK_ARG(a.n_k_heads >= 1 && a.n_k_heads <= 65536 && a.n_v_heads >= 1 &&
                     a.n_v_heads <= 65536 && a.n_v_heads % a.n_k_heads == 0,
                 "%s: n_v_heads=%d must be a multiple of n_k_heads=%d (both in [1, 65536])",
                 fn, a.n_v_heads, a.n_k_heads);
    const auto dim_ok = [](int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128; };
    PF_CHECK_ARG(dim_ok(a.dk) && dim_ok(a.dv),
                 "%s: dk=%d, dv=%d; each must be 16, 32, 64 or 128", fn, a.dk, a.dv);
    PF_CHECK_ARG(a.path == PF_GDN_SCAN_AUTO || a.path == PF_GDN_SCAN_SEQUENTIAL ||
                     a.path == PF_GDN_SCAN_CHUNKED,
                 "%s: path=%d (PF_GDN_SCAN_AUTO 0, PF_GDN_SCAN_SEQUENTIAL 1, "
                 "PF_GDN_SCAN_CHUNKED 2)",
                 fn, a.path);
    const bool chunk_ok = pf::gdn_chunk_supported(a.dk, a.dv);
    if (a.path == PF_GDN_SCAN_CHUNKED && !chunk_ok)
        return pf::fail(PF_STATUS_UNSUPPORTED,
                        "%s: path=PF_GDN_SCAN_CHUNKED is built for dk = dv = 128, got dk=%d, "
                        "dv=%d; use PF_GDN_SCAN_AUTO or PF_GDN_SCAN_SEQUENTIAL",
                        fn, a.dk, a.dv);
    const int32_t run = pf::gdn_scan_choose(a.path, tuned, false, a.rows, a.dk, a.dv);
    *path = run;
    *ws = run == PF_GDN_SCAN_CHUNKED
              ? pf::gdn_chunk_workspace_bytes(a.rows, a.n_k_heads, a.n_v_heads)
              : 0;
    return PF_STATUS_OK;
}

}  // namespace

extern "C" PF_API pf_status pf_gdn_scan_plan(const pf_gdn_scan_args *args, int32_t *out_path,
                                             size_t *out_workspace_bytes) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_scan_args_init"));
        int32_t path = 0;
        size_t ws = 0;
        PF_TRY(scan_plan(fn, *args, PF_GDN_SCAN_AUTO, &path, &ws));
        if (out_path) *out_path = path;
        if (out_workspace_bytes) *out_workspace_bytes = ws;
        return PF_STATUS_OK;
    });
}

namespace {

// The operands of pf_gdn_scan and pf_gdn_scan_varlen as checked views (phases 1-5): q, k, v,
// beta, g, o of `rows` rows, `state_elems` floats of state, and the caller's workspace of
// `ws_bytes` bytes when `own_ws` (its buf set and the call needs one).
struct ScanViews {
    pf::RowsView q, k, v, beta, g, state, o, ws;
};

pf_status scan_views(const char *fn, pf_context *ctx, const pf_view &q, const pf_view &k, const pf_view &v,
                     const pf_view &beta, const pf_view &g, const pf_view &state, const pf_view &o,
                     const pf_view &workspace, int64_t rows, int32_t n_k_heads, int32_t n_v_heads,
                     int32_t dk, int32_t dv, int64_t state_elems, size_t ws_bytes, bool own_ws,
                     ScanViews *out) {
    const int64_t kw = (int64_t)n_k_heads * dk, vw = (int64_t)n_v_heads * dv, h = n_v_heads;
    ScanViews &w = *out;
    w.q = pf::matrix_view(q, "q", rows, kw, kw);
    w.k = pf::matrix_view(k, "k", rows, kw, kw);
    w.v = pf::matrix_view(v, "v", rows, vw, vw);
    w.beta = pf::matrix_view(beta, "beta", rows, h, h);
    w.g = pf::matrix_view(g, "g", rows, h, h);
    w.state = pf::vector_view(state, "state", state_elems);
    w.o = pf::matrix_view(o, "o", rows, vw, vw);
    // The caller's workspace, in bytes (a vector of ws_bytes uint8 at byte offset off).
    w.ws = pf::vector_view(workspace, "workspace", int64_t(ws_bytes), 1);
    if (own_ws) PF_TRY(pf::check_views(fn, ctx, {w.q, w.k, w.v, w.beta, w.g, w.state, w.o, w.ws}));
    else PF_TRY(pf::check_views(fn, ctx, {w.q, w.k, w.v, w.beta, w.g, w.state, w.o}));
    for (const pf::RowsView *in : {&w.q, &w.k, &w.beta, &w.g, &w.state})
        PF_CHECK_ARG(!pf::views_overlap(w.o, *in), "%s: o overlaps %s", fn, in->name);
    PF_CHECK_ARG(pf::views_same(w.o, w.v) || !pf::views_overlap(w.o, w.v),
                 "%s: o overlaps v (only o == v, same offset and ld, is allowed)", fn);
    for (const pf::RowsView *in : {&w.q, &w.k, &w.v, &w.beta, &w.g})
        PF_CHECK_ARG(!pf::views_overlap(w.state, *in), "%s: state overlaps %s", fn, in->name);
    if (own_ws) {
        PF_CHECK_ARG(workspace.off % 256 == 0, "%s: workspace offset %lld is not a multiple "
                     "of 256 bytes", fn, (long long)workspace.off);
        for (const pf::RowsView *in : {&w.q, &w.k, &w.v, &w.beta, &w.g, &w.state, &w.o})
            PF_CHECK_ARG(workspace.buf != in->buf, "%s: workspace shares a buffer with %s", fn, in->name);
    }
    return PF_STATUS_OK;
}

// The internal operands from checked views; rows and state as the caller sets them.
pf::GdnScanArgs scan_args(const ScanViews &w, int64_t rows, int32_t n_k_heads,
                          int32_t n_v_heads, int32_t dk, int32_t dv) {
    pf::GdnScanArgs sa;
    sa.q = w.q.cmat();
    sa.k = w.k.cmat();
    sa.v = w.v.cmat();
    sa.beta = w.beta.cmat();
    sa.g = w.g.cmat();
    sa.o = w.o.mat();
    sa.rows = rows;
    sa.n_k_heads = n_k_heads;
    sa.n_v_heads = n_v_heads;
    sa.dk = dk;
    sa.dv = dv;
    return sa;
}

}  // namespace

extern "C" PF_API pf_status pf_gdn_scan(pf_context *ctx, const pf_gdn_scan_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_scan_args_init"));
        const pf_gdn_scan_args &a = *args;
        int32_t run = PF_GDN_SCAN_SEQUENTIAL;
        size_t ws_bytes = 0;
        // ctx is checked in its turn below (after the scalars and the views)
        PF_TRY(scan_plan(fn, a, ctx ? ctx->tuning.gdn_scan : PF_GDN_SCAN_AUTO, &run, &ws_bytes));
        const bool own_ws = a.workspace.buf != nullptr && run == PF_GDN_SCAN_CHUNKED;
        ScanViews w;
        PF_TRY(scan_views(fn, ctx, a.q, a.k, a.v, a.beta, a.g, a.state, a.o, a.workspace, a.rows, a.n_k_heads,
                          a.n_v_heads, a.dk, a.dv, (int64_t)a.n_v_heads * a.dv * a.dk, ws_bytes, own_ws, &w));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        pf::GdnScanArgs sa = scan_args(w, a.rows, a.n_k_heads, a.n_v_heads, a.dk, a.dv);
        sa.state = w.state.ptr();
        if (run == PF_GDN_SCAN_SEQUENTIAL || a.rows == 0) return pf::gdn_scan_rows(sa, ctx->stream);
        void *ws = nullptr;
        if (own_ws) {
            ws = static_cast<char *>(a.workspace.buf->ptr) + a.workspace.off;
        } else {
            PF_TRY(pf::scratch_reserve(ctx, ctx->scratch_gdn, ws_bytes, "GDN chunk workspace"));
            ws = ctx->scratch_gdn.ptr;
        }
        return pf::gdn_chunk_scan_rows(sa, ws, ws_bytes, pf::gdn_chunk_plan(ctx->tuning), ctx->stream);
    });
}

// ------------------------------------------------------------------------------ many sequences

extern "C" PF_API pf_status pf_gdn_scan_varlen_args_init(pf_gdn_scan_varlen_args *args, size_t struct_size) {
    return pf::args_init(args, struct_size, __func__, "pf_gdn_scan_varlen_args",
                         [](pf_gdn_scan_varlen_args &a) { a.path = PF_GDN_SCAN_AUTO; });
}

namespace {

// A varlen call as the internal entries run it: rounds of pieces. A piece is the rows of one
// sequence that one round runs (the whole sequence on the sequential path); a round is one
// launch of gdn_scan_rows_varlen or gdn_chunk_scan_rows_varlen over its pieces. Its device table
// (GdnSeqs' arrays, int64: row0[n], rows[n], chunk0[n + 1], state[n]) sits at `table` int64s into
// the workspace's table area.
struct VarlenRound {
    size_t first = 0;    // its first piece
    int32_t n = 0;       // pieces
    int64_t chunks = 0;  // chunks of 64 rows (chunked path)
    size_t table = 0;
};
struct VarlenPiece {
    int32_t seq = 0;
    int64_t row0 = 0, rows = 0;
};
struct VarlenPlan {
    int32_t path = PF_GDN_SCAN_SEQUENTIAL;
    std::vector<VarlenPiece> pieces;
    std::vector<VarlenRound> rounds;
    size_t table_values = 0;  // int64 values of all rounds' tables
    size_t chunk_off = 0;     // byte offset of the chunked path's scratch (256-aligned)
    size_t chunk_bytes = 0;   // its bytes: the largest round's
    size_t bytes = 0;         // the whole workspace
};

constexpr int64_t kVarlenMinShare = 16;  // chunks a sequence gets per round at least (but its rest)
constexpr size_t kTableStoreMax = 512;   // table values stored by kernel arguments (no host wait)

// The chunked path's rounds (at most kGdnVarlenRoundChunks chunks each): every unfinished
// sequence gets an equal share K of the round (water filling: the largest K with
// sum min(rest_i, K) <= the round's chunks) where K >= kVarlenMinShare, so that each state CTA
// runs at least that many chunk steps per state load; with more unfinished sequences than that
// allows, the first ones in order get kVarlenMinShare each (a sequence's pieces stay in order
// from round to round). Every round takes at least one chunk.
void varlen_rounds(const std::vector<int64_t> &rows, VarlenPlan *p) {
    const int64_t cap = pf::kGdnVarlenRoundChunks;
    const size_t n = rows.size();
    std::vector<int64_t> rest(n), done(n, 0);
    for (size_t i = 0; i < n; ++i) rest[i] = (rows[i] + 63) / 64;
    for (;;) {
        std::vector<size_t> act;
        for (size_t i = 0; i < n; ++i)
            if (rest[i] > 0) act.push_back(i);
        if (act.empty()) break;
        const auto fill = [&](int64_t K) {
            int64_t t = 0;
            for (size_t i : act) t += std::min(rest[i], K);
            return t;
        };
        int64_t lo = 0, hi = cap;  // the largest K in [0, cap] with fill(K) <= cap
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (fill(mid) <= cap) lo = mid;
            else hi = mid - 1;
        }
        VarlenRound r;
        r.first = p->pieces.size();
        int64_t K = lo;
        if (K < kVarlenMinShare) K = std::min(kVarlenMinShare, cap);
        for (size_t i : act) {
            const int64_t k = std::min(rest[i], K);
            if (r.chunks + k > cap) break;  // K from the water filling never stops here
            VarlenPiece pc;
            pc.seq = int32_t(i);
            pc.row0 = done[i];  // relative to the sequence; made absolute by the caller
            pc.rows = std::min(k * 64, rows[i] - done[i]);
            p->pieces.push_back(pc);
            done[i] += pc.rows;
            rest[i] -= k;
            r.chunks += k;
            ++r.n;
        }
        p->rounds.push_back(r);
    }
}

// Checks the scalars and host arrays (phase 1) and plans the call. `tuned`: the context's
// tuning.gdn_scan (AUTO's first choice).
pf_status varlen_plan(const char *fn, const pf_gdn_scan_varlen_args &a, int32_t tuned, VarlenPlan *p) {
    PF_CHECK_ARG(a.n_seqs >= 0, "%s: n_seqs=%d < 0", fn, a.n_seqs);
    PF_CHECK_ARG(a.n_states >= 0, "%s: n_states=%d < 0", fn, a.n_states);
    PF_CHECK_ARG(a.n_k_heads >= 1 && a.n_k_heads <= 65536 && a.n_v_heads >= 1 &&
                     a.n_v_heads <= 65536 && a.n_v_heads % a.n_k_heads == 0,
                 "%s: n_v_heads=%d must be a multiple of n_k_heads=%d (both in [1, 65536])",
                 fn, a.n_v_heads, a.n_k_heads);
    const auto dim_ok = [](int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128; };
    PF_CHECK_ARG(dim_ok(a.dk) && dim_ok(a.dv), "%s: dk=%d, dv=%d; each must be 16, 32, 64 or 128", fn,
                 a.dk, a.dv);
    PF_CHECK_ARG(a.path == PF_GDN_SCAN_AUTO || a.path == PF_GDN_SCAN_SEQUENTIAL ||
                     a.path == PF_GDN_SCAN_CHUNKED,
                 "%s: path=%d (PF_GDN_SCAN_AUTO 0, PF_GDN_SCAN_SEQUENTIAL 1, PF_GDN_SCAN_CHUNKED 2)", fn,
                 a.path);
    if (a.path == PF_GDN_SCAN_CHUNKED && !pf::gdn_chunk_supported(a.dk, a.dv))
        return pf::fail(PF_STATUS_UNSUPPORTED,
                        "%s: path=PF_GDN_SCAN_CHUNKED is built for dk = dv = 128, got dk=%d, "
                        "dv=%d; use PF_GDN_SCAN_AUTO or PF_GDN_SCAN_SEQUENTIAL",
                        fn, a.dk, a.dv);
    // The sequences: cu_seqlens (each >= 1 row, the total a view's rows), then their slots.
    PF_CHECK_ARG(a.cu_seqlens != nullptr, "%s: cu_seqlens is NULL (n_seqs + 1 = %lld offsets)", fn,
                 (long long)a.n_seqs + 1);
    PF_CHECK_ARG(a.cu_seqlens[0] == 0, "%s: cu_seqlens[0] = %lld must be 0", fn, (long long)a.cu_seqlens[0]);
    std::vector<int64_t> rows(size_t(a.n_seqs));
    int64_t longest = 0;
    for (int32_t i = 0; i < a.n_seqs; ++i) {
        const int64_t r0 = a.cu_seqlens[i], r1 = a.cu_seqlens[i + 1];
        PF_CHECK_ARG(r1 > r0, "%s: sequence %d has cu_seqlens[%d] = %lld <= cu_seqlens[%d] = %lld "
                     "(each sequence needs >= 1 row)", fn, i, i + 1, (long long)r1, i, (long long)r0);
        PF_CHECK_ARG(r1 <= INT32_MAX, "%s: cu_seqlens[%d] = %lld: at most 2^31 - 1 rows in all", fn, i + 1,
                     (long long)r1);
        rows[size_t(i)] = r1 - r0;
        longest = std::max(longest, r1 - r0);
    }
    if (a.state_indices == nullptr) {
        PF_CHECK_ARG(a.n_states >= a.n_seqs, "%s: n_states=%d < n_seqs=%d (state_indices NULL: slot i "
                     "for sequence i)", fn, a.n_states, a.n_seqs);
    } else {
        std::vector<int32_t> owner(size_t(a.n_states), -1);  // the sequence using each slot
        for (int32_t i = 0; i < a.n_seqs; ++i) {
            const int32_t s = a.state_indices[i];
            PF_CHECK_ARG(s >= 0 && s < a.n_states, "%s: state_indices[%d] = %d is outside [0, n_states=%d)",
                         fn, i, s, a.n_states);
            PF_CHECK_ARG(owner[size_t(s)] < 0, "%s: state_indices[%d] = %d repeats state_indices[%d] (each "
                         "sequence needs its own slot)", fn, i, s, owner[size_t(s)]);
            owner[size_t(s)] = i;
        }
    }
    p->path = pf::gdn_scan_choose(a.path, tuned, false, longest, a.dk, a.dv);
    p->pieces.clear();
    p->rounds.clear();
    if (a.n_seqs == 0) return PF_STATUS_OK;
    if (p->path == PF_GDN_SCAN_CHUNKED) {
        varlen_rounds(rows, p);
    } else {  // one launch of whole sequences
        VarlenRound r;
        r.n = a.n_seqs;
        for (int32_t i = 0; i < a.n_seqs; ++i) {
            VarlenPiece pc;
            pc.seq = i;
            pc.rows = rows[size_t(i)];
            p->pieces.push_back(pc);
            r.chunks += (pc.rows + 63) / 64;
        }
        p->rounds.push_back(r);
    }
    for (VarlenPiece &pc : p->pieces) pc.row0 += a.cu_seqlens[pc.seq];
    size_t values = 0;
    for (VarlenRound &r : p->rounds) {
        r.table = values;
        values += 4 * size_t(r.n) + 1;
        if (p->path == PF_GDN_SCAN_CHUNKED)
            p->chunk_bytes = std::max(p->chunk_bytes,
                                      pf::gdn_chunk_varlen_workspace_bytes(r.chunks, a.n_k_heads, a.n_v_heads));
    }
    p->table_values = values;
    p->chunk_off = (values * sizeof(int64_t) + 255) & ~size_t(255);  // the chunked scratch: 256-aligned
    p->bytes = p->chunk_off + p->chunk_bytes;
    return PF_STATUS_OK;
}

// Writes the rounds' tables (int64 values, `dst` on the device) in stream order: by kernel
// arguments when they are few (no wait for the host), else one copy from host memory (which
// returns once staged, but may first wait for the stream's earlier work).
pf_status varlen_tables(pf_context *ctx, const VarlenPlan &p, const pf_gdn_scan_varlen_args &a, float *pool,
                        int64_t *dst) {
    const int64_t state_elems = (int64_t)a.n_v_heads * a.dk * a.dv;
    std::vector<int64_t> v(p.table_values);
    for (const VarlenRound &r : p.rounds) {
        int64_t *t = v.data() + r.table;
        int64_t c = 0;
        for (int32_t i = 0; i < r.n; ++i) {
            const VarlenPiece &pc = p.pieces[r.first + size_t(i)];
            const int32_t slot = a.state_indices ? a.state_indices[pc.seq] : pc.seq;
            t[i] = pc.row0;
            t[r.n + i] = pc.rows;
            t[2 * r.n + i] = c;
            t[3 * r.n + 1 + i] = int64_t(reinterpret_cast<intptr_t>(pool + slot * state_elems));
            c += (pc.rows + 63) / 64;
        }
        t[3 * r.n] = c;
    }
    if (v.size() <= kTableStoreMax) return pf::store_i64s(dst, v.data(), int64_t(v.size()), ctx->stream);
    PF_CUDA_TRY(cudaMemcpyAsync(dst, v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice, ctx->stream));
    return PF_STATUS_OK;
}

}  // namespace

extern "C" PF_API pf_status pf_gdn_scan_varlen_plan(const pf_gdn_scan_varlen_args *args, int32_t *out_path,
                                                    size_t *out_workspace_bytes) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_scan_varlen_args_init"));
        VarlenPlan p;
        PF_TRY(varlen_plan(fn, *args, PF_GDN_SCAN_AUTO, &p));
        if (out_path) *out_path = p.path;
        if (out_workspace_bytes) *out_workspace_bytes = p.bytes;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_gdn_scan_varlen(pf_context *ctx, const pf_gdn_scan_varlen_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_scan_varlen_args_init"));
        const pf_gdn_scan_varlen_args &a = *args;
        VarlenPlan p;
        // ctx is checked in its turn below (after the scalars and the views)
        PF_TRY(varlen_plan(fn, a, ctx ? ctx->tuning.gdn_scan : PF_GDN_SCAN_AUTO, &p));
        const int64_t total = a.n_seqs > 0 ? a.cu_seqlens[a.n_seqs] : 0;
        const int64_t state_elems = (int64_t)a.n_v_heads * a.dk * a.dv;
        const bool own_ws = a.workspace.buf != nullptr && p.bytes > 0;
        ScanViews w;
        PF_TRY(scan_views(fn, ctx, a.q, a.k, a.v, a.beta, a.g, a.state, a.o, a.workspace, total, a.n_k_heads,
                          a.n_v_heads, a.dk, a.dv, (int64_t)a.n_states * state_elems, p.bytes, own_ws, &w));
        if (a.n_seqs == 0) return PF_STATUS_OK;
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        char *ws = nullptr;
        if (own_ws) {
            ws = static_cast<char *>(a.workspace.buf->ptr) + a.workspace.off;
        } else {
            PF_TRY(pf::scratch_reserve(ctx, ctx->scratch_gdn, p.bytes, "GDN varlen workspace"));
            ws = static_cast<char *>(ctx->scratch_gdn.ptr);
        }
        int64_t *tables = reinterpret_cast<int64_t *>(ws);
        PF_TRY(varlen_tables(ctx, p, a, w.state.ptr(), tables));
        const pf::GdnScanArgs sa = scan_args(w, total, a.n_k_heads, a.n_v_heads, a.dk, a.dv);
        const pf::GdnChunkPlan plan = pf::gdn_chunk_plan(ctx->tuning);
        std::vector<int64_t> host_rows(p.pieces.size());
        for (size_t i = 0; i < p.pieces.size(); ++i) host_rows[i] = p.pieces[i].rows;
        for (const VarlenRound &r : p.rounds) {
            int64_t *t = tables + r.table;
            pf::GdnSeqs seqs;
            seqs.n = r.n;
            seqs.row0 = t;
            seqs.rows = t + r.n;
            seqs.chunk0 = t + 2 * r.n;
            seqs.state = reinterpret_cast<float *const *>(t + 3 * r.n + 1);
            seqs.host_rows = host_rows.data() + r.first;
            if (p.path == PF_GDN_SCAN_SEQUENTIAL) PF_TRY(pf::gdn_scan_rows_varlen(sa, seqs, ctx->stream));
            else PF_TRY(pf::gdn_chunk_scan_rows_varlen(sa, seqs, ws + p.chunk_off, p.chunk_bytes, plan, ctx->stream));
        }
        return PF_STATUS_OK;
    });
}
