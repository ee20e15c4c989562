// api_views.h — the argument checks every kernel-level C entry shares (api_rows.cu, api_gdn.cu,
// api_gemm.cu, api_attention.cu): one strided-view checker (a caller's pf_view becomes a checked
// [rows][ld] operand), the phases of the checking order, overlaps, per-head shapes and the
// size-prefixed argument structs.
//
// Checks run in a fixed order (prefill.h, conventions) so that every scalar check can be
// exercised without a device:
//   1. shape: the op's scalars, then each view: offset >= 0, ld >= width, sizes bounded, and the
//      span (rows-1)*ld + width in elements and bytes computed with overflow checks;
//   2. null: every view's buffer handle is not NULL;
//   3. ctx != NULL;
//   4. ownership and fit: buffers (and weights) belong to ctx; each buffer holds its view's last
//      element;
//   5. overlaps (the entry, with views_overlap / views_same).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "base/context.h"
#include "base/mat.h"

namespace pf {

// One operand as an op uses it: `rows` rows of `width` elements of `elem` bytes, row r starting
// at element off + r*ld of buf.
struct RowsView {
    const pf_buffer *buf = nullptr;
    int64_t off = 0;     // element offset of row 0, column 0
    int64_t ld = 0;      // row stride in elements (resolved: never 0)
    int64_t rows = 0;    // rows used
    int64_t width = 0;   // elements used per row
    size_t elem = sizeof(float);
    const char *name = "";

    // Elements from the buffer's start through the view's last element (0 when empty); exact
    // once view_shape has passed.
    int64_t end() const { return rows == 0 ? 0 : off + (rows - 1) * ld + width; }
    template <class T = float>
    T *ptr() const {
        char *p = static_cast<char *>(buf->ptr) + size_t(off) * elem;
        return static_cast<T *>(static_cast<void *>(p));
    }
    // The operand in the internal convention (mat.h).
    MatF mat() const { return MatF{ptr(), ld}; }
    CMatF cmat() const { return CMatF{ptr(), ld}; }
};

// A [rows][ld] matrix operand from the caller's view: ld 0 means natural_ld (the op's natural
// width for this operand).
inline RowsView matrix_view(const pf_view &v, const char *name, int64_t rows, int64_t width,
                            int64_t natural_ld, size_t elem = sizeof(float)) {
    return RowsView{v.buf, v.off, v.ld == 0 ? natural_ld : v.ld, rows, width, elem, name};
}

// A vector operand of n elements (one row; none when n == 0): the view's ld is ignored.
inline RowsView vector_view(const pf_view &v, const char *name, int64_t n,
                            size_t elem = sizeof(float)) {
    if (n == 0) return RowsView{v.buf, v.off, 1, 0, 1, elem, name};
    return RowsView{v.buf, v.off, n, 1, n, elem, name};
}

// The operands behind `const pf_view *` arguments (as matrix_view / vector_view);
// INVALID_ARGUMENT when the pointer is NULL.
inline pf_status matrix_arg(const char *fn, const pf_view *v, const char *name, int64_t rows,
                            int64_t width, int64_t natural_ld, RowsView *out,
                            size_t elem = sizeof(float)) {
    PF_CHECK_ARG(v != nullptr, "%s: view %s is NULL (pass a pf_view)", fn, name);
    *out = matrix_view(*v, name, rows, width, natural_ld, elem);
    return PF_STATUS_OK;
}

inline pf_status vector_arg(const char *fn, const pf_view *v, const char *name, int64_t n,
                            RowsView *out, size_t elem = sizeof(float)) {
    PF_CHECK_ARG(v != nullptr, "%s: view %s is NULL (pass a pf_view)", fn, name);
    *out = vector_view(*v, name, n, elem);
    return PF_STATUS_OK;
}

constexpr int64_t kViewMaxElems = int64_t(1) << 44;  // 64 Ti elements: far past any device

// Bytes from the buffer's start through the view's last element: (off + (rows-1)*ld + width) *
// elem, 0 for rows == 0. False on int64 or size_t overflow.
inline bool view_bytes(const RowsView &v, size_t *out) {
    if (v.rows == 0) {
        *out = 0;
        return true;
    }
    int64_t span = 0;
    if (__builtin_mul_overflow(v.rows - 1, v.ld, &span) ||
        __builtin_add_overflow(span, v.width, &span) || __builtin_add_overflow(span, v.off, &span))
        return false;
    return !__builtin_mul_overflow(size_t(span), v.elem, out);
}

// Phase 1 for one view.
inline pf_status view_shape(const char *fn, const RowsView &v) {
    PF_CHECK_ARG(v.off >= 0 && v.off <= kViewMaxElems, "%s: %s offset=%lld out of range", fn,
                 v.name, (long long)v.off);
    PF_CHECK_ARG(v.width >= 1 && v.width <= kViewMaxElems, "%s: %s width=%lld out of range", fn,
                 v.name, (long long)v.width);
    PF_CHECK_ARG(v.ld >= v.width && v.ld <= kViewMaxElems,
                 "%s: %s row stride ld=%lld must be >= its width %lld (and <= 2^44)", fn, v.name,
                 (long long)v.ld, (long long)v.width);
    PF_CHECK_ARG(v.rows >= 0 && v.rows <= INT32_MAX, "%s: rows=%lld out of range [0, 2^31)", fn,
                 (long long)v.rows);
    size_t bytes = 0;
    PF_CHECK_ARG(view_bytes(v, &bytes) && v.end() <= 4 * kViewMaxElems,
                 "%s: %s of %lld rows x ld %lld overflows", fn, v.name, (long long)v.rows,
                 (long long)v.ld);
    return PF_STATUS_OK;
}

inline pf_status check_shapes(const char *fn, std::initializer_list<RowsView> views) {
    for (const RowsView &v : views) PF_TRY(view_shape(fn, v));
    return PF_STATUS_OK;
}

inline pf_status check_nulls(const char *fn, std::initializer_list<RowsView> views) {
    for (const RowsView &v : views) PF_CHECK_ARG(v.buf != nullptr, "%s: %s is NULL", fn, v.name);
    return PF_STATUS_OK;
}

inline pf_status check_ctx(const char *fn, const pf_context *ctx) {
    PF_CHECK_ARG(ctx != nullptr, "%s: ctx is NULL", fn);
    return PF_STATUS_OK;
}

// Phase 4 for a weight (already known non-NULL).
inline pf_status check_weight(const char *fn, const pf_context *ctx, const pf_weight *w,
                              const char *name) {
    PF_CHECK_ARG(w->ctx == ctx, "%s: %s belongs to another context", fn, name);
    return PF_STATUS_OK;
}

// Phase 4 for views: each buffer belongs to ctx and holds its view's last element.
inline pf_status check_fits(const char *fn, const pf_context *ctx,
                            std::initializer_list<RowsView> views) {
    for (const RowsView &v : views) {
        size_t bytes = 0;
        view_bytes(v, &bytes);  // cannot overflow after view_shape
        PF_TRY(check_buffer(ctx, v.buf, bytes, fn, v.name));
    }
    return PF_STATUS_OK;
}

// Phases 1-4 over all views of an op without weights.
inline pf_status check_views(const char *fn, const pf_context *ctx,
                             std::initializer_list<RowsView> views) {
    PF_TRY(check_shapes(fn, views));
    PF_TRY(check_nulls(fn, views));
    PF_TRY(check_ctx(fn, ctx));
    return check_fits(fn, ctx, views);
}

// True when both views are non-empty, in the same buffer, and may share a byte: their byte
// spans intersect and, for two views of the same element size and row stride (column sections
// of one matrix, e.g. q, k and v inside the conv output), their column ranges modulo ld
// intersect too. Conservative otherwise.
inline bool views_overlap(const RowsView &a, const RowsView &b) {
    if (a.buf != b.buf || a.end() == 0 || b.end() == 0) return false;
    const int64_t a0 = a.off * int64_t(a.elem), a1 = a.end() * int64_t(a.elem);
    const int64_t b0 = b.off * int64_t(b.elem), b1 = b.end() * int64_t(b.elem);
    if (!(a0 < b1 && b0 < a1)) return false;
    if (a.ld == b.ld && a.elem == b.elem) {
        const int64_t L = a.ld;
        const int64_t ab = ((b.off - a.off) % L + L) % L;  // b's first column, seen from a's
        const int64_t ba = ((a.off - b.off) % L + L) % L;
        if (ab >= a.width && ba >= b.width) return false;  // disjoint column ranges (cyclic)
    }
    return true;
}

// Identical views: same buffer, offset and row stride (the allowed in-place cases).
inline bool views_same(const RowsView &a, const RowsView &b) {
    return a.buf == b.buf && a.off == b.off && a.ld == b.ld && a.elem == b.elem;
}

// Scalar checks shared by the per-head entries; resolves head_stride 0 to head_dim and returns
// the width of a row's heads and the natural ld (n_heads * head_stride).
inline pf_status heads_args(const char *fn, int64_t rows, int32_t n_heads, int32_t head_dim,
                            int64_t *head_stride, int64_t *width, int64_t *natural_ld) {
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
    *natural_ld = (int64_t)n_heads * *head_stride;
    return PF_STATUS_OK;
}

inline pf_status eps_arg(const char *fn, float eps) {
    PF_CHECK_ARG(eps >= 0.0f && std::isfinite(eps), "%s: eps=%g must be finite and >= 0", fn,
                 (double)eps);
    return PF_STATUS_OK;
}

// The body of pf_<op>_args_init: zeroes *args, sets struct_size, then applies the documented
// defaults (`defaults(*args)`; zero needs nothing).
template <class T, class Defaults>
pf_status args_init(T *args, size_t struct_size, const char *fn, const char *type,
                    Defaults defaults) {
    return guard(fn, [&]() -> pf_status {
        PF_TRY(struct_init(args, struct_size, fn, type));
        defaults(*args);
        return PF_STATUS_OK;
    });
}

template <class T>
pf_status args_init(T *args, size_t struct_size, const char *fn, const char *type) {
    return args_init(args, struct_size, fn, type, [](T &) {});
}

// A caller's argument struct: not NULL, and filled by its _init function (struct_size).
template <class T>
pf_status args_check(const char *fn, const T *args, const char *init) {
    PF_CHECK_ARG(args != nullptr, "%s: args is NULL (fill one with %s)", fn, init);
    return struct_check(args, fn, "args", init);
}

}  // namespace pf
