// api_views.h — argument checks of the row and GDN kernel-level C API (api_rows.cu,
// api_gdn.cu): an fp32 [rows][ld] view into a pf_buffer starting at an element offset.
//
// Checks run in a fixed order so that every scalar check can be exercised without a device:
//   1. shape: offset >= 0, ld >= width, rows >= 0, sizes bounded (no int64 overflow later);
//   2. null: the buffer handle is not NULL;
//   3. (the caller checks ctx != NULL here)
//   4. fits: the buffer belongs to ctx and holds the view's last element.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "context.h"

namespace pf {

struct RowsView {
    const pf_buffer *buf;
    int64_t off;    // element offset of row 0, column 0
    int64_t ld;     // row stride in elements
    int64_t rows;   // rows used
    int64_t width;  // columns used per row
    const char *name;

    // Elements from the buffer's start through the view's last element (0 when empty).
    int64_t end() const { return rows == 0 ? 0 : off + (rows - 1) * ld + width; }
    float *ptr() const { return static_cast<float *>(buf->ptr) + off; }
};

// A contiguous vector of n floats at element offset off.
inline RowsView vec_view(const pf_buffer *b, int64_t off, int64_t n, const char *name) {
    return RowsView{b, off, n, 1, n, name};
}

constexpr int64_t kViewMaxElems = int64_t(1) << 44;  // 64 TiB of floats: far past any device

inline pf_status view_shape(const char *fn, const RowsView &v) {
    PF_CHECK_ARG(v.off >= 0 && v.off <= kViewMaxElems, "%s: %s offset=%lld out of range", fn,
                 v.name, (long long)v.off);
    PF_CHECK_ARG(v.width >= 1 && v.width <= kViewMaxElems, "%s: %s width=%lld out of range", fn,
                 v.name, (long long)v.width);
    PF_CHECK_ARG(v.ld >= v.width && v.ld <= kViewMaxElems,
                 "%s: %s row stride ld=%lld must be >= its width %lld", fn, v.name,
                 (long long)v.ld, (long long)v.width);
    PF_CHECK_ARG(v.rows >= 0 && v.rows <= INT32_MAX, "%s: rows=%lld out of range [0, 2^31)", fn,
                 (long long)v.rows);
    PF_CHECK_ARG(v.rows <= 1 || (v.rows - 1) <= kViewMaxElems / v.ld,
                 "%s: %s of %lld rows x ld %lld overflows", fn, v.name, (long long)v.rows,
                 (long long)v.ld);
    return PF_STATUS_OK;
}

// Phases 1-4 over all views; `ctx` is checked between the null and the fits phases.
inline pf_status check_views(const char *fn, const pf_context *ctx,
                             std::initializer_list<RowsView> views) {
    for (const RowsView &v : views) PF_TRY(view_shape(fn, v));
    for (const RowsView &v : views) PF_CHECK_ARG(v.buf != nullptr, "%s: %s is NULL", fn, v.name);
    PF_CHECK_ARG(ctx != nullptr, "%s: ctx is NULL", fn);
    for (const RowsView &v : views)
        PF_TRY(check_buffer(ctx, v.buf, size_t(v.end()) * sizeof(float), fn, v.name));
    return PF_STATUS_OK;
}

// True when both views are non-empty, in the same buffer, and may share an element: their
// spans [off, end) intersect and, for two views of the same row stride (column sections of
// one matrix, e.g. q, k and v inside the conv output), their column ranges modulo ld intersect
// too. Conservative otherwise.
inline bool views_overlap(const RowsView &a, const RowsView &b) {
    if (a.buf != b.buf || a.end() == 0 || b.end() == 0) return false;
    if (!(a.off < b.end() && b.off < a.end())) return false;
    if (a.ld == b.ld) {
        const int64_t L = a.ld;
        const int64_t ab = ((b.off - a.off) % L + L) % L;  // b's first column, seen from a's
        const int64_t ba = ((a.off - b.off) % L + L) % L;
        if (ab >= a.width && ba >= b.width) return false;  // disjoint column ranges (cyclic)
    }
    return true;
}

// Identical views: same buffer, offset and row stride (allowed in-place cases).
inline bool views_same(const RowsView &a, const RowsView &b) {
    return a.buf == b.buf && a.off == b.off && a.ld == b.ld;
}

// Scalar checks shared by the per-head entries; resolves head_stride 0 and ld 0.
inline pf_status heads_args(const char *fn, int64_t rows, int32_t n_heads,
                            int64_t *head_stride, int32_t head_dim, int64_t *ld, int64_t *width) {
    PF_CHECK_ARG(rows >= 0, "%s: rows=%lld < 0", fn, (long long)rows);
    PF_CHECK_ARG(n_heads >= 1 && n_heads <= 65536, "%s: n_heads=%d out of range [1, 65536]", fn,
                 n_heads);
    PF_CHECK_ARG(head_dim >= 1 && head_dim <= 65536, "%s: head_dim=%d out of range [1, 65536]",
                 fn, head_dim);
    if (*head_stride == 0) *head_stride = head_dim;
    PF_CHECK_ARG(*head_stride >= head_dim && *head_stride <= (int64_t(1) << 32),
                 "%s: head_stride=%lld must be >= head_dim=%d", fn, (long long)*head_stride,
                 head_dim);
    *width = (int64_t)(n_heads - 1) * *head_stride + head_dim;
    if (*ld == 0) *ld = (int64_t)n_heads * *head_stride;
    return PF_STATUS_OK;
}

inline pf_status eps_arg(const char *fn, float eps) {
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "%s: eps=%g must be finite and >= 0", fn,
                 (double)eps);
    return PF_STATUS_OK;
}

}  // namespace pf
