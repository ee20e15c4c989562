// api_gdn.cu — kernel-level C API of the Gated DeltaNet ops (gdn.cuh). Each entry checks every
// argument (scalars, then NULL buffers, then ctx, then buffer ownership and sizes, then
// overlaps: see api_views.h) before any device work, then calls the internal entry on the
// context's stream.
#include "api_views.h"
#include "cuda_check.cuh"
#include "gdn.cuh"

extern "C" PF_API pf_status pf_gdn_conv1d_rows(pf_context *ctx, const pf_buffer *m, int64_t m_off,
                                              int64_t ldm, pf_buffer *window, int64_t window_off,
                                              const pf_buffer *weight, int64_t weight_off,
                                              pf_buffer *u, int64_t u_off, int64_t ldu,
                                              int64_t rows, int64_t conv_dim, int32_t kc) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(conv_dim >= 1 && conv_dim <= (int64_t(1) << 31),
                     "%s: conv_dim=%lld out of range [1, 2^31]", fn, (long long)conv_dim);
        PF_CHECK_ARG(kc >= 2 && kc <= pf::kGdnMaxConvKernel, "%s: kc=%d must be in [2, %d]", fn,
                     kc, pf::kGdnMaxConvKernel);
        if (ldm == 0) ldm = conv_dim;
        if (ldu == 0) ldu = conv_dim;
        const pf::RowsView vm{m, m_off, ldm, rows, conv_dim, "m"},
            vu{u, u_off, ldu, rows, conv_dim, "u"};
        const pf::RowsView vwin = pf::vec_view(window, window_off, (kc - 1) * conv_dim, "window");
        const pf::RowsView vw = pf::vec_view(weight, weight_off, kc * conv_dim, "weight");
        PF_TRY(pf::check_views(fn, ctx, {vm, vwin, vw, vu}));
        PF_CHECK_ARG(!pf::views_overlap(vu, vm), "%s: u overlaps m", fn);
        PF_CHECK_ARG(!pf::views_overlap(vu, vwin), "%s: u overlaps window", fn);
        PF_CHECK_ARG(!pf::views_overlap(vu, vw), "%s: u overlaps weight", fn);
        PF_CHECK_ARG(!pf::views_overlap(vwin, vm), "%s: window overlaps m", fn);
        PF_CHECK_ARG(!pf::views_overlap(vwin, vw), "%s: window overlaps weight", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_conv1d_rows(vm.ptr(), ldm, vwin.ptr(), vw.ptr(), vu.ptr(), ldu, rows,
                                   conv_dim, kc, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_l2norm_rows(pf_context *ctx, pf_buffer *x, int64_t x_off,
                                              int64_t ldx, int64_t rows, int32_t n_heads,
                                              int64_t head_stride, int32_t head_dim, float eps,
                                              float scale) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        int64_t width = 0;
        PF_TRY(pf::heads_args(fn, rows, n_heads, &head_stride, head_dim, &ldx, &width));
        PF_TRY(pf::eps_arg(fn, eps));
        PF_CHECK_ARG(std::isfinite(scale), "%s: scale=%g must be finite", fn, (double)scale);
        const pf::RowsView vx{x, x_off, ldx, rows, width, "x"};
        PF_TRY(pf::check_views(fn, ctx, {vx}));
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_l2norm_rows(vx.ptr(), ldx, rows, n_heads, head_stride, head_dim, eps, scale,
                                   ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_gates_rows(pf_context *ctx, const pf_buffer *b, int64_t b_off,
                                             int64_t ldb, const pf_buffer *alpha,
                                             int64_t alpha_off, int64_t ld_alpha,
                                             const pf_buffer *ssm_a, int64_t ssm_a_off,
                                             const pf_buffer *dt_bias, int64_t dt_bias_off,
                                             pf_buffer *beta, int64_t beta_off, int64_t ld_beta,
                                             pf_buffer *g, int64_t g_off, int64_t ld_g,
                                             int64_t rows, int32_t n_v_heads) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(n_v_heads >= 1 && n_v_heads <= 65536,
                     "%s: n_v_heads=%d out of range [1, 65536]", fn, n_v_heads);
        const int64_t h = n_v_heads;
        if (ldb == 0) ldb = h;
        if (ld_alpha == 0) ld_alpha = h;
        if (ld_beta == 0) ld_beta = h;
        if (ld_g == 0) ld_g = h;
        const pf::RowsView vb{b, b_off, ldb, rows, h, "b"},
            va{alpha, alpha_off, ld_alpha, rows, h, "alpha"},
            vbeta{beta, beta_off, ld_beta, rows, h, "beta"}, vg{g, g_off, ld_g, rows, h, "g"};
        const pf::RowsView vssm = pf::vec_view(ssm_a, ssm_a_off, h, "ssm_a"),
                           vdt = pf::vec_view(dt_bias, dt_bias_off, h, "dt_bias");
        PF_TRY(pf::check_views(fn, ctx, {vb, va, vssm, vdt, vbeta, vg}));
        for (const pf::RowsView *out : {&vbeta, &vg})
            for (const pf::RowsView *in : {&vb, &va, &vssm, &vdt})
                PF_CHECK_ARG(!pf::views_overlap(*out, *in), "%s: %s overlaps %s", fn, out->name,
                             in->name);
        PF_CHECK_ARG(!pf::views_overlap(vbeta, vg), "%s: beta overlaps g", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_gates_rows(vb.ptr(), ldb, va.ptr(), ld_alpha, vssm.ptr(), vdt.ptr(),
                                  vbeta.ptr(), ld_beta, vg.ptr(), ld_g, rows, n_v_heads,
                                  ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_gated_rms_norm_rows(pf_context *ctx, const pf_buffer *o,
                                                      int64_t o_off, int64_t ldo,
                                                      const pf_buffer *z, int64_t z_off,
                                                      int64_t ldz, const pf_buffer *w,
                                                      int64_t w_off, pf_buffer *y, int64_t y_off,
                                                      int64_t ldy, int64_t rows,
                                                      int32_t n_v_heads, int32_t dv, float eps) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(n_v_heads >= 1 && n_v_heads <= 65536,
                     "%s: n_v_heads=%d out of range [1, 65536]", fn, n_v_heads);
        PF_CHECK_ARG(dv >= 1 && dv <= 65536, "%s: dv=%d out of range [1, 65536]", fn, dv);
        PF_TRY(pf::eps_arg(fn, eps));
        const int64_t width = (int64_t)n_v_heads * dv;
        if (ldo == 0) ldo = width;
        if (ldz == 0) ldz = width;
        if (ldy == 0) ldy = width;
        const pf::RowsView vo{o, o_off, ldo, rows, width, "o"}, vz{z, z_off, ldz, rows, width, "z"},
            vy{y, y_off, ldy, rows, width, "y"};
        const pf::RowsView vw = pf::vec_view(w, w_off, dv, "w");
        PF_TRY(pf::check_views(fn, ctx, {vo, vz, vw, vy}));
        PF_CHECK_ARG(pf::views_same(vy, vo) || !pf::views_overlap(vy, vo),
                     "%s: y overlaps o (only y == o, same offset and ld, is allowed)", fn);
        PF_CHECK_ARG(!pf::views_overlap(vy, vz), "%s: y overlaps z", fn);
        PF_CHECK_ARG(!pf::views_overlap(vy, vw), "%s: y overlaps w", fn);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_gated_rms_norm_rows(vo.ptr(), ldo, vz.ptr(), ldz, vw.ptr(), vy.ptr(), ldy,
                                           rows, n_v_heads, dv, eps, ctx->stream);
    });
}

extern "C" PF_API pf_status pf_gdn_scan_rows(
    pf_context *ctx, const pf_buffer *q, int64_t q_off, int64_t ldq, const pf_buffer *k,
    int64_t k_off, int64_t ldk, const pf_buffer *v, int64_t v_off, int64_t ldv,
    const pf_buffer *beta, int64_t beta_off, int64_t ld_beta, const pf_buffer *g, int64_t g_off,
    int64_t ld_g, pf_buffer *state, int64_t state_off, pf_buffer *o, int64_t o_off, int64_t ldo,
    int64_t rows, int32_t n_k_heads, int32_t n_v_heads, int32_t dk, int32_t dv) {
    const char *fn = __func__;
    return pf::guard(fn, [&]() -> pf_status {
        PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
        PF_CHECK_ARG(n_k_heads >= 1 && n_k_heads <= 65536 && n_v_heads >= 1 &&
                         n_v_heads <= 65536 && n_v_heads % n_k_heads == 0,
                     "%s: n_v_heads=%d must be a multiple of n_k_heads=%d (both in [1, 65536])",
                     fn, n_v_heads, n_k_heads);
        const auto dim_ok = [](int32_t d) { return d == 16 || d == 32 || d == 64 || d == 128; };
        PF_CHECK_ARG(dim_ok(dk) && dim_ok(dv), "%s: dk=%d, dv=%d; each must be 16, 32, 64 or 128",
                     fn, dk, dv);
        const int64_t kw = (int64_t)n_k_heads * dk, vw = (int64_t)n_v_heads * dv;
        if (ldq == 0) ldq = kw;
        if (ldk == 0) ldk = kw;
        if (ldv == 0) ldv = vw;
        if (ldo == 0) ldo = vw;
        if (ld_beta == 0) ld_beta = n_v_heads;
        if (ld_g == 0) ld_g = n_v_heads;
        const pf::RowsView vq{q, q_off, ldq, rows, kw, "q"}, vk{k, k_off, ldk, rows, kw, "k"},
            vv{v, v_off, ldv, rows, vw, "v"}, vbeta{beta, beta_off, ld_beta, rows, n_v_heads, "beta"},
            vg{g, g_off, ld_g, rows, n_v_heads, "g"}, vo{o, o_off, ldo, rows, vw, "o"};
        const pf::RowsView vs = pf::vec_view(state, state_off, vw * dk, "state");
        PF_TRY(pf::check_views(fn, ctx, {vq, vk, vv, vbeta, vg, vs, vo}));
        for (const pf::RowsView *in : {&vq, &vk, &vbeta, &vg, &vs})
            PF_CHECK_ARG(!pf::views_overlap(vo, *in), "%s: o overlaps %s", fn, in->name);
        PF_CHECK_ARG(pf::views_same(vo, vv) || !pf::views_overlap(vo, vv),
                     "%s: o overlaps v (only o == v, same offset and ld, is allowed)", fn);
        for (const pf::RowsView *in : {&vq, &vk, &vv, &vbeta, &vg})
            PF_CHECK_ARG(!pf::views_overlap(vs, *in), "%s: state overlaps %s", fn, in->name);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        return pf::gdn_scan_rows(vq.ptr(), ldq, vk.ptr(), ldk, vv.ptr(), ldv, vbeta.ptr(), ld_beta,
                                 vg.ptr(), ld_g, vs.ptr(), vo.ptr(), ldo, rows, n_k_heads,
                                 n_v_heads, dk, dv, ctx->stream);
    });
}
