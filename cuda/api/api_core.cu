// api_core.cu — the core C API: version, devices, qtypes, contexts, buffers, weights.
// Every extern "C" entry validates its arguments, then delegates; pf::guard keeps C++
// exceptions from crossing the boundary.
#include <cstring>
#include <new>

#include "base/context.h"
#include "base/cuda_check.cuh"
#include "kernels/attention/attention.cuh"
#include "kernels/dequant/prewarm.cuh"
#include "kernels/gemm/gemm.cuh"  // weight_drop_i8
#include "plan/plan.h"
#include "plan/qtype.h"

namespace {

constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;  // cuBLAS (its Lt kernels) wants >= 32 MiB on Hopper

pf_status context_teardown(pf_context *ctx) {
    pf::attention_release(ctx);
    pf::scratch_release(ctx, ctx->scratch_f32);
    pf::scratch_release(ctx, ctx->scratch_f16_w);
    pf::scratch_release(ctx, ctx->scratch_f16_x);
    pf::scratch_release(ctx, ctx->scratch_gdn);
    if (ctx->blas_lt) cublasLtDestroy(ctx->blas_lt);
    if (ctx->blas_tc) cublasDestroy(ctx->blas_tc);
    if (ctx->blas_f32) cublasDestroy(ctx->blas_f32);
    pf::device_free(ctx, ctx->workspace, ctx->workspace_bytes);
    if (ctx->seq_pool) {
        if (ctx->stream) (void)cudaStreamSynchronize(ctx->stream);
        (void)cudaMemPoolDestroy(ctx->seq_pool);
    }
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    return PF_STATUS_OK;
}

pf_status context_init(pf_context *ctx, const pf_context_options &o) {
    ctx->device = o.device;
    ctx->flags = o.flags;
    ctx->budget = o.memory_budget_bytes;
    ctx->workspace_bytes = o.workspace_bytes ? o.workspace_bytes : kDefaultWorkspaceBytes;
    // The default priority. (Session 45 made it the highest for the slab ring's experiment; the tree
    // soak then saw the driver hold 6 MiB more after its first requests: test_soak's drift check.)
    PF_CUDA_TRY(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    PF_TRY(pf::device_alloc(ctx, ctx->workspace_bytes, &ctx->workspace, "cuBLAS workspace"));
    PF_CUBLAS_TRY(cublasCreate(&ctx->blas_f32));
    PF_CUBLAS_TRY(cublasCreate(&ctx->blas_tc));
    PF_CUBLAS_TRY(cublasLtCreate(&ctx->blas_lt));  // stream and workspace are per call
    for (cublasHandle_t h : {ctx->blas_f32, ctx->blas_tc}) {
        PF_CUBLAS_TRY(cublasSetStream(h, ctx->stream));
        PF_CUBLAS_TRY(cublasSetWorkspace(h, ctx->workspace, ctx->workspace_bytes));
    }
    // The exact leg: fp32 everywhere, no TF32 down-conversion even where the GPU could.
    PF_CUBLAS_TRY(cublasSetMathMode(ctx->blas_f32, CUBLAS_PEDANTIC_MATH));
    // The tensor-op leg: fp16 inputs on tensor cores, fp32 compute chosen per call.
    PF_CUBLAS_TRY(cublasSetMathMode(ctx->blas_tc, CUBLAS_DEFAULT_MATH));
    pf::prewarm_kernel_load();  // the model's prewarm then times the work, not the module load
    return PF_STATUS_OK;
}

// Why the runtime found no device, in words a user can act on. cudart reports a missing driver
// (libcuda.so.1 absent) and an old one alike as cudaErrorInsufficientDriver; the driver version
// tells them apart (cudaDriverGetVersion gives 0 when no driver library could be loaded).
pf_status no_device(cudaError_t e) {
    int drv = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaGetLastError();
    const int rt = CUDART_VERSION;  // the runtime linked into this library (cudart is static)
    const char *min_driver = rt / 1000 == 13 ? "580" : rt / 1000 == 12 ? "525" : "?";
    const char *fn = "pf_context_create: no CUDA device";
    if (e == cudaErrorInsufficientDriver && drv == 0)
        return pf::fail(PF_STATUS_NO_DEVICE,
                        "%s: no NVIDIA driver is installed (libcuda.so.1 could not be loaded); this "
                        "library needs a driver for CUDA %d.%d or newer (version %s or newer)",
                        fn, rt / 1000, rt % 1000 / 10, min_driver);
    if (e == cudaErrorInsufficientDriver)
        return pf::fail(PF_STATUS_NO_DEVICE,
                        "%s: the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime "
                        "this library was built with: update the driver to version %s or newer",
                        fn, drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, min_driver);
    if (e == cudaErrorStubLibrary)
        return pf::fail(PF_STATUS_NO_DEVICE,
                        "%s: the libcuda.so.1 loaded is the CUDA toolkit's stub, not a driver (a "
                        "stubs/ directory on LD_LIBRARY_PATH?)", fn);
    if (e == cudaErrorNoDevice || e == cudaSuccess)
        return pf::fail(PF_STATUS_NO_DEVICE,
                        "%s: the NVIDIA driver (CUDA %d.%d) is installed but sees no GPU", fn,
                        drv / 1000, drv % 1000 / 10);
    return pf::fail(PF_STATUS_NO_DEVICE, "%s: CUDA cannot start: %s (%s)", fn,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace

extern "C" PF_API uint32_t pf_version(void) {
    return PF_VERSION_MAJOR * 10000u + PF_VERSION_MINOR * 100u + PF_VERSION_PATCH;
}

extern "C" PF_API pf_status pf_device_count(int32_t *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_device_count: out is NULL");
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {  // no driver, no device: not an error for this question
            (void)cudaGetLastError();
            n = 0;
        }
        *out = n;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_qtype_matrix_bytes(int32_t qtype, int64_t n, int64_t k,
                                                 size_t *out_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out_bytes != nullptr, "pf_qtype_matrix_bytes: out_bytes is NULL");
        *out_bytes = 0;
        return pf::matrix_bytes(qtype, n, k, out_bytes, "pf_qtype_matrix_bytes");
    });
}

// ------------------------------------------------------------------------------ contexts

extern "C" PF_API pf_status pf_context_options_init(pf_context_options *opts, size_t struct_size) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(pf::struct_init(opts, struct_size, "pf_context_options_init", "pf_context_options"));
        opts->device = 0;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_context_create(pf_context **out, const pf_context_options *opts) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_context_create: out is NULL");
        *out = nullptr;
        pf_context_options o;
        PF_TRY(pf_context_options_init(&o, sizeof o));
        if (opts) {
            PF_TRY(pf::struct_check(opts, "pf_context_create", "opts"));
            o = *opts;
        }
        PF_CHECK_ARG((o.flags & ~uint32_t(PF_CONTEXT_POISON)) == 0,
                     "pf_context_create: flags=%u has bits other than PF_CONTEXT_POISON (1)", o.flags);
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0) return no_device(e);
        if (o.device < 0 || o.device >= n)
            return pf::fail(PF_STATUS_NO_DEVICE,
                            "pf_context_create: device=%d does not exist (%d device(s) found)",
                            o.device, n);
        pf::DeviceGuard dg(o.device);
        PF_TRY(dg.status());
        pf_context *ctx = new pf_context();
        const pf_status s = context_init(ctx, o);
        if (s != PF_STATUS_OK) {
            context_teardown(ctx);
            delete ctx;
            return s;
        }
        *out = ctx;
        return PF_STATUS_OK;
    });
}

namespace pf {
void context_retain(pf_context *ctx) { ctx->refs.fetch_add(1, std::memory_order_relaxed); }

void context_release(pf_context *ctx) {
    if (ctx->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    DeviceGuard dg(ctx->device);
    (void)cudaStreamSynchronize(ctx->stream);
    context_teardown(ctx);
    delete ctx;
}
}  // namespace pf

extern "C" PF_API void pf_context_destroy(pf_context *ctx) {
    if (!ctx) return;
    pf::context_release(ctx);  // the user's reference: the children still alive keep the rest
}

extern "C" PF_API pf_status pf_context_set_tuning(pf_context *ctx, const pf_tuning *tuning) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(ctx != nullptr, "pf_context_set_tuning: ctx is NULL");
        const pf_tuning t = tuning ? *tuning : pf_tuning{};
        PF_TRY(pf::tuning_check(t, "pf_context_set_tuning"));
        ctx->tuning = t;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_context_get_tuning(const pf_context *ctx, pf_tuning *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(ctx != nullptr, "pf_context_get_tuning: ctx is NULL");
        PF_CHECK_ARG(out != nullptr, "pf_context_get_tuning: out is NULL");
        *out = ctx->tuning;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_context_synchronize(pf_context *ctx) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(ctx != nullptr, "pf_context_synchronize: ctx is NULL");
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        PF_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_context_memory(pf_context *ctx, size_t *free_bytes,
                                             size_t *total_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(ctx != nullptr, "pf_context_memory: ctx is NULL");
        PF_CHECK_ARG(free_bytes && total_bytes, "pf_context_memory: free_bytes/total_bytes is NULL");
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        PF_TRY(pf::device_free_bytes(ctx, free_bytes, total_bytes));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_context_allocated(pf_context *ctx, size_t *out_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(ctx != nullptr, "pf_context_allocated: ctx is NULL");
        PF_CHECK_ARG(out_bytes != nullptr, "pf_context_allocated: out_bytes is NULL");
        *out_bytes = ctx->allocated;
        return PF_STATUS_OK;
    });
}

// ------------------------------------------------------------------------------ buffers

extern "C" PF_API pf_status pf_buffer_create(pf_buffer **out, pf_context *ctx, size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_buffer_create: out is NULL");
        *out = nullptr;
        PF_CHECK_ARG(ctx != nullptr, "pf_buffer_create: ctx is NULL");
        PF_CHECK_ARG(bytes > 0, "pf_buffer_create: bytes must be > 0");
        PF_CHECK_ARG(bytes <= (size_t(1) << 50), "pf_buffer_create: bytes=%zu is absurdly large", bytes);
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        void *p = nullptr;
        PF_TRY(pf::device_alloc(ctx, bytes, &p, "pf_buffer_create"));
        pf_buffer *b = new (std::nothrow) pf_buffer();
        if (!b) {
            pf::device_free(ctx, p, bytes);
            return pf::fail(PF_STATUS_OUT_OF_MEMORY, "pf_buffer_create: host allocation failed");
        }
        b->ref.reset(ctx);
        b->ctx = ctx;
        b->ptr = p;
        b->bytes = bytes;
        *out = b;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API void pf_buffer_destroy(pf_buffer *buf) {
    if (!buf) return;
    pf::DeviceGuard dg(buf->ctx->device);
    (void)cudaStreamSynchronize(buf->ctx->stream);  // no kernel may still read it
    pf::device_free(buf->ctx, buf->ptr, buf->bytes);
    delete buf;
}

extern "C" PF_API pf_status pf_buffer_size(const pf_buffer *buf, size_t *out_bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(buf != nullptr, "pf_buffer_size: buf is NULL");
        PF_CHECK_ARG(out_bytes != nullptr, "pf_buffer_size: out_bytes is NULL");
        *out_bytes = buf->bytes;
        return PF_STATUS_OK;
    });
}

namespace {
pf_status check_range(const pf_buffer *buf, size_t offset, size_t bytes, const char *fn) {
    PF_CHECK_ARG(buf != nullptr, "%s: buf is NULL", fn);
    PF_CHECK_ARG(offset <= buf->bytes && bytes <= buf->bytes - offset,
                 "%s: range [%zu, %zu + %zu) is outside the buffer of %zu bytes", fn, offset,
                 offset, bytes, buf->bytes);
    return PF_STATUS_OK;
}
}  // namespace

extern "C" PF_API pf_status pf_buffer_upload(pf_buffer *buf, size_t offset, const void *src,
                                            size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(check_range(buf, offset, bytes, "pf_buffer_upload"));
        if (bytes == 0) return PF_STATUS_OK;
        PF_CHECK_ARG(src != nullptr, "pf_buffer_upload: src is NULL");
        pf::DeviceGuard dg(buf->ctx->device);
        PF_TRY(dg.status());
        PF_CUDA_TRY(cudaMemcpyAsync(static_cast<char *>(buf->ptr) + offset, src, bytes,
                                    cudaMemcpyHostToDevice, buf->ctx->stream));
        PF_CUDA_TRY(cudaStreamSynchronize(buf->ctx->stream));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_buffer_download(const pf_buffer *buf, size_t offset, void *dst,
                                              size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(check_range(buf, offset, bytes, "pf_buffer_download"));
        if (bytes == 0) return PF_STATUS_OK;
        PF_CHECK_ARG(dst != nullptr, "pf_buffer_download: dst is NULL");
        pf::DeviceGuard dg(buf->ctx->device);
        PF_TRY(dg.status());
        PF_CUDA_TRY(cudaMemcpyAsync(dst, static_cast<const char *>(buf->ptr) + offset, bytes,
                                    cudaMemcpyDeviceToHost, buf->ctx->stream));
        PF_CUDA_TRY(cudaStreamSynchronize(buf->ctx->stream));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_buffer_fill(pf_buffer *buf, size_t offset, uint8_t value,
                                          size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_TRY(check_range(buf, offset, bytes, "pf_buffer_fill"));
        if (bytes == 0) return PF_STATUS_OK;
        pf::DeviceGuard dg(buf->ctx->device);
        PF_TRY(dg.status());
        PF_CUDA_TRY(cudaMemsetAsync(static_cast<char *>(buf->ptr) + offset, value, bytes,
                                    buf->ctx->stream));
        return PF_STATUS_OK;
    });
}

extern "C" PF_API pf_status pf_buffer_copy(pf_buffer *dst, size_t dst_offset, const pf_buffer *src,
                                          size_t src_offset, size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(dst != nullptr, "pf_buffer_copy: dst is NULL");
        PF_CHECK_ARG(src != nullptr, "pf_buffer_copy: src is NULL");
        PF_TRY(check_range(dst, dst_offset, bytes, "pf_buffer_copy"));
        PF_TRY(check_range(src, src_offset, bytes, "pf_buffer_copy"));
        PF_CHECK_ARG(dst->ctx == src->ctx, "pf_buffer_copy: dst and src belong to different contexts");
        PF_CHECK_ARG(dst != src || src_offset + bytes <= dst_offset || dst_offset + bytes <= src_offset,
                     "pf_buffer_copy: the ranges [%zu, +%zu) and [%zu, +%zu) overlap", src_offset,
                     bytes, dst_offset, bytes);
        if (bytes == 0) return PF_STATUS_OK;
        pf::DeviceGuard dg(dst->ctx->device);
        PF_TRY(dg.status());
        PF_CUDA_TRY(cudaMemcpyAsync(static_cast<char *>(dst->ptr) + dst_offset,
                                    static_cast<const char *>(src->ptr) + src_offset, bytes,
                                    cudaMemcpyDeviceToDevice, dst->ctx->stream));
        return PF_STATUS_OK;
    });
}

// ------------------------------------------------------------------------------ weights

extern "C" PF_API pf_status pf_weight_create(pf_weight **out, pf_context *ctx, int32_t qtype,
                                            int64_t n, int64_t k, const void *data, size_t bytes) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(out != nullptr, "pf_weight_create: out is NULL");
        *out = nullptr;
        size_t expect = 0;
        PF_TRY(pf::matrix_bytes(qtype, n, k, &expect, "pf_weight_create"));
        PF_CHECK_ARG(bytes == expect,
                     "pf_weight_create: bytes=%zu but a %s matrix of n=%lld x k=%lld needs %zu",
                     bytes, pf_qtype_name(qtype), (long long)n, (long long)k, expect);
        PF_CHECK_ARG(data != nullptr, "pf_weight_create: data is NULL");
        PF_CHECK_ARG(ctx != nullptr, "pf_weight_create: ctx is NULL");
        pf::DeviceGuard dg(ctx->device);
        PF_TRY(dg.status());
        void *p = nullptr;
        PF_TRY(pf::device_alloc(ctx, bytes, &p, "pf_weight_create"));
        cudaError_t e = cudaMemcpyAsync(p, data, bytes, cudaMemcpyHostToDevice, ctx->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
        if (e != cudaSuccess) {
            pf::device_free(ctx, p, bytes);
            return pf::cuda_fail(e, __FILE__, __LINE__, "pf_weight_create: upload");
        }
        pf_weight *w = new (std::nothrow) pf_weight();
        if (!w) {
            pf::device_free(ctx, p, bytes);
            return pf::fail(PF_STATUS_OUT_OF_MEMORY, "pf_weight_create: host allocation failed");
        }
        w->ref.reset(ctx);
        w->ctx = ctx;
        w->qtype = qtype;
        w->n = n;
        w->k = k;
        w->data = p;
        w->bytes = bytes;
        *out = w;
        return PF_STATUS_OK;
    });
}

extern "C" PF_API void pf_weight_destroy(pf_weight *w) {
    if (!w) return;
    pf::DeviceGuard dg(w->ctx->device);
    (void)cudaStreamSynchronize(w->ctx->stream);
    pf::f16_release(w);  // the arena goes with its last cached weight
    pf::weight_drop_i8(w);
    pf::device_free(w->ctx, w->data, w->bytes);
    delete w;
}

extern "C" PF_API pf_status pf_weight_info_get(const pf_weight *w, pf_weight_info *out) {
    return pf::guard(__func__, [&]() -> pf_status {
        PF_CHECK_ARG(w != nullptr, "pf_weight_info_get: w is NULL");
        PF_CHECK_ARG(out != nullptr, "pf_weight_info_get: out is NULL");
        out->qtype = w->qtype;
        out->n = w->n;
        out->k = w->k;
        out->bytes = w->bytes;
        out->f16_bytes = w->f16 ? size_t(w->n) * size_t(w->k) * sizeof(__half) : 0;
        return PF_STATUS_OK;
    });
}
