// api_gdn.cu — kernel-level C API of the Gated DeltaNet ops (gdn.cuh). Each entry checks every
// argument in the order of api_views.h (scalars and shapes, NULL buffers, ctx, ownership and
// fit, overlaps) before any device work, then calls the internal entry on the context's stream.
#include "api_views.h"
#include "cuda_check.cuh"
#include "gdn.cuh"

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

extern "C" PF_API pf_status pf_gdn_scan(pf_context *ctx, const pf_gdn_scan_args *args) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_TRY(pf::args_check(fn, args, "pf_gdn_scan_args_init"));
        const pf_gdn_scan_args &a = *args;
        int32_t run = PF_GDN_SCAN_SEQUENTIAL;
        size_t ws_bytes = 0;
        // ctx is checked in its turn below (after the scalars and the views)
        PF_TRY(scan_plan(fn, a, ctx ? ctx->tuning.gdn_scan : PF_GDN_SCAN_AUTO, &run, &ws_bytes));
        const int64_t kw = (int64_t)a.n_k_heads * a.dk, vw = (int64_t)a.n_v_heads * a.dv,
                      h = a.n_v_heads;
        const pf::RowsView vq = pf::matrix_view(a.q, "q", a.rows, kw, kw),
                           vk = pf::matrix_view(a.k, "k", a.rows, kw, kw),
                           vv = pf::matrix_view(a.v, "v", a.rows, vw, vw),
                           vbeta = pf::matrix_view(a.beta, "beta", a.rows, h, h),
                           vg = pf::matrix_view(a.g, "g", a.rows, h, h),
                           vs = pf::vector_view(a.state, "state", vw * a.dk),
                           vo = pf::matrix_view(a.o, "o", a.rows, vw, vw);
        const bool own_ws = a.workspace.buf != nullptr && run == PF_GDN_SCAN_CHUNKED;
        // The caller's workspace, in bytes (a vector of ws_bytes uint8 at byte offset off).
        const pf::RowsView vw_ = pf::vector_view(a.workspace, "workspace", int64_t(ws_bytes), 1);
        if (own_ws) PF_TRY(pf::check_views(fn, ctx, {vq, vk, vv, vbeta, vg, vs, vo, vw_}));
        else PF_TRY(pf::check_views(fn, ctx, {vq, vk, vv, vbeta, vg, vs, vo}));
        for (const pf::RowsView *in : {&vq, &vk, &vbeta, &vg, &vs})
            PF_CHECK_ARG(!pf::views_overlap(vo, *in), "%s: o overlaps %s", fn, in->name);
        PF_CHECK_ARG(pf::views_same(vo, vv) || !pf::views_overlap(vo, vv),
                     "%s: o overlaps v (only o == v, same offset and ld, is allowed)", fn);
        for (const pf::RowsView *in : {&vq, &vk, &vv, &vbeta, &vg})
            PF_CHECK_ARG(!pf::views_overlap(vs, *in), "%s: state overlaps %s", fn, in->name);
        if (own_ws) {
            PF_CHECK_ARG(a.workspace.off % 256 == 0, "%s: workspace offset %lld is not a multiple "
                         "of 256 bytes", fn, (long long)a.workspace.off);
            for (const pf::RowsView *in : {&vq, &vk, &vv, &vbeta, &vg, &vs, &vo})
                PF_CHECK_ARG(a.workspace.buf != in->buf, "%s: workspace shares a buffer with %s",
                             fn, in->name);
        }
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        pf::GdnScanArgs sa;
        sa.q = vq.cmat();
        sa.k = vk.cmat();
        sa.v = vv.cmat();
        sa.beta = vbeta.cmat();
        sa.g = vg.cmat();
        sa.state = vs.ptr();
        sa.o = vo.mat();
        sa.rows = a.rows;
        sa.n_k_heads = a.n_k_heads;
        sa.n_v_heads = a.n_v_heads;
        sa.dk = a.dk;
        sa.dv = a.dv;
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
