// mat.h — the one internal operand convention: a strided row-major matrix {ptr, ld} (row r
// starts at ptr + r * ld, ld in elements >= the width the op uses). Every internal entry takes its
// activations as these; an entry that needs more than eight parameters takes an args struct.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define PF_HD __host__ __device__ __forceinline__
#else
#define PF_HD inline
#endif

namespace pf {

template <class T>
struct Mat {
    T *ptr = nullptr;
    int64_t ld = 0;
    Mat() = default;
    PF_HD Mat(T *p, int64_t l) : ptr(p), ld(l) {}
    // A writable matrix is also a read-only one.
    template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
    PF_HD Mat(const Mat<U> &m) : ptr(m.ptr), ld(m.ld) {}
    PF_HD T *row(int64_t r) const { return ptr + r * ld; }
    // The same rows from column c on (a slice of a side-by-side output).
    PF_HD Mat cols_from(int64_t c) const { return Mat{ptr + c, ld}; }
    // The matrix from row r on.
    PF_HD Mat rows_from(int64_t r) const { return Mat{ptr + r * ld, ld}; }
};

using MatF = Mat<float>;
using CMatF = Mat<const float>;

// A matrix of GGUF blocks on the device: [n][k] of `qtype` (k contiguous, rows of k / block
// elements blocks), read by the quantized kernels without a dequantized copy.
struct QMatrix {
    const void *blocks = nullptr;
    int32_t qtype = 0;
    int64_t n = 0, k = 0;
};

}  // namespace pf
