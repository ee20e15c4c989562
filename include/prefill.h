/* prefill.h — prompt prefill of GGUF-quantized LLMs (qwen3, qwen35) on CUDA GPUs.
 *
 * Data model. A context owns one CUDA device, one stream, two cuBLAS handles (fp32
 * pedantic math, and tensor-op math with fp32 compute) and a workspace. Device memory is held
 * in buffers (raw bytes; kernels read them as the dtype their documentation names) and in
 * weights (raw GGUF blocks of an [n][k] matrix, k contiguous; y = x . W^T). Activations are
 * row-major [rows][dim] float32, one row per token. Models and sessions (the model level) are
 * built from the same pieces.
 *
 * Conventions:
 *  - Every fallible call returns pf_status (PF_STATUS_OK == 0). After a failure,
 *    pf_last_error() describes it for the calling thread until that thread's next failure.
 *    Arguments are checked before any device work: a failed call changes nothing.
 *  - Handles are opaque: pf_X_create(&out, ...) / pf_X_destroy(x); destroy(NULL) is a no-op.
 *    Buffers and weights belong to their context and must be destroyed before it.
 *  - Options structs begin with struct_size and are filled by pf_X_options_init(&o, sizeof o).
 *  - Host pointers are C-contiguous. Sizes are int64_t element counts or size_t byte counts.
 *  - A context is used by one thread at a time; several contexts may live in one process.
 *  - No CUDA types appear here (cffi parses this file): the library never prints, throws
 *    or aborts across this boundary.
 *  - GGML quantization type ids are used as they are (PF_QTYPE_*).
 */
#ifndef PREFILL_H
#define PREFILL_H

#include <stddef.h>
#include <stdint.h>

#if defined(PF_BUILDING_LIBRARY)
#define PF_API __attribute__((visibility("default")))
#else
#define PF_API
#endif

#define PF_VERSION_MAJOR 0
#define PF_VERSION_MINOR 1
#define PF_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* PF_CDEF_BEGIN: declarations only below, no preprocessor lines (parsed by pyprefill) */

/* ---------------------------------------------------------------- status and errors */

typedef enum pf_status {
    PF_STATUS_OK = 0,
    PF_STATUS_INVALID_ARGUMENT = 1, /* bad pointer, shape, size or option value */
    PF_STATUS_UNSUPPORTED = 2,      /* valid request this build cannot serve (qtype, arch) */
    PF_STATUS_OUT_OF_MEMORY = 3,    /* host or device allocation failed; the context stays usable */
    PF_STATUS_CUDA_ERROR = 4,       /* a CUDA runtime call failed */
    PF_STATUS_CUBLAS_ERROR = 5,     /* a cuBLAS / cuBLASLt call failed */
    PF_STATUS_IO_ERROR = 6,         /* GGUF missing, truncated or malformed */
    PF_STATUS_ABI_MISMATCH = 7,     /* struct_size differs between caller and library */
    PF_STATUS_NO_DEVICE = 8,        /* no CUDA driver or device, or the ordinal does not exist */
    PF_STATUS_INTERNAL = 9,         /* a bug: report it with pf_last_error() */
    PF_STATUS_COUNT = 10
} pf_status;

PF_API uint32_t pf_version(void);                 /* major*10000 + minor*100 + patch */
PF_API const char *pf_status_name(pf_status s);   /* "PF_STATUS_IO_ERROR"; never NULL */
PF_API const char *pf_status_string(pf_status s); /* one sentence; never NULL */
PF_API const char *pf_last_error(void);           /* this thread's last failure; never NULL */
PF_API pf_status pf_device_count(int32_t *out);   /* *out = 0 when no driver or device */

/* ---------------------------------------------------------------- quantization types */

typedef enum pf_qtype {
    PF_QTYPE_F32 = 0,
    PF_QTYPE_F16 = 1,
    PF_QTYPE_Q4_0 = 2,   /* blocks of 32, 18 bytes */
    PF_QTYPE_Q8_0 = 8,   /* blocks of 32, 34 bytes */
    PF_QTYPE_Q4_K = 12,  /* blocks of 256, 144 bytes */
    PF_QTYPE_Q5_K = 13,  /* blocks of 256, 176 bytes */
    PF_QTYPE_Q6_K = 14,  /* blocks of 256, 210 bytes */
    PF_QTYPE_IQ4_XS = 23, /* blocks of 256, 136 bytes */
    PF_QTYPE_BF16 = 30
} pf_qtype;

/* Bytes of an [n][k] matrix of this type; INVALID_ARGUMENT when k is not a multiple of the
 * block size or a size is negative, UNSUPPORTED for any other type id. */
PF_API pf_status pf_qtype_matrix_bytes(int32_t qtype, int64_t n, int64_t k, size_t *out_bytes);
PF_API const char *pf_qtype_name(int32_t qtype); /* "Q4_K"; "?" for an unknown id */

/* ---------------------------------------------------------------- contexts */

typedef struct pf_context pf_context;

typedef struct pf_context_options {
    size_t struct_size;     /* set by pf_context_options_init; do not change */
    int32_t device;         /* CUDA ordinal. default 0 */
    uint32_t flags;         /* reserved, must be 0 */
    size_t workspace_bytes; /* cuBLAS workspace. 0 = library default (32 MiB) */
} pf_context_options;

PF_API pf_status pf_context_options_init(pf_context_options *opts, size_t struct_size);
/* opts NULL = defaults. NO_DEVICE when there is no usable device of that ordinal. */
PF_API pf_status pf_context_create(pf_context **out, const pf_context_options *opts);
PF_API void pf_context_destroy(pf_context *ctx);
PF_API pf_status pf_context_synchronize(pf_context *ctx); /* waits for the context's stream */
/* Free and total bytes of the context's device, as the driver reports them now. */
PF_API pf_status pf_context_memory(pf_context *ctx, size_t *free_bytes, size_t *total_bytes);
/* Bytes this context holds on the device: buffers, weights, caches, scratch. */
PF_API pf_status pf_context_allocated(pf_context *ctx, size_t *out_bytes);

/* ---------------------------------------------------------------- device buffers */

typedef struct pf_buffer pf_buffer;

/* Device memory of `bytes` bytes (> 0), contents undefined. OUT_OF_MEMORY leaves ctx usable. */
PF_API pf_status pf_buffer_create(pf_buffer **out, pf_context *ctx, size_t bytes);
PF_API void pf_buffer_destroy(pf_buffer *buf);
PF_API pf_status pf_buffer_size(const pf_buffer *buf, size_t *out_bytes);
/* Copies between host memory and [offset, offset + bytes) of the buffer; synchronous. */
PF_API pf_status pf_buffer_upload(pf_buffer *buf, size_t offset, const void *src, size_t bytes);
PF_API pf_status pf_buffer_download(const pf_buffer *buf, size_t offset, void *dst, size_t bytes);
/* Sets every byte of [offset, offset + bytes) to `value` (e.g. 0xFF poisons float32 as NaN). */
PF_API pf_status pf_buffer_fill(pf_buffer *buf, size_t offset, uint8_t value, size_t bytes);

/* ---------------------------------------------------------------- weights */

typedef struct pf_weight pf_weight;

typedef struct pf_weight_info {
    int32_t qtype;     /* PF_QTYPE_* */
    int64_t n;         /* output rows */
    int64_t k;         /* input columns (contiguous) */
    size_t bytes;      /* raw GGUF bytes on the device */
    size_t f16_bytes;  /* bytes of the cached fp16 copy; 0 when not cached */
} pf_weight_info;

/* Uploads an [n][k] matrix of raw GGUF blocks. `bytes` must equal
 * pf_qtype_matrix_bytes(qtype, n, k). */
PF_API pf_status pf_weight_create(pf_weight **out, pf_context *ctx, int32_t qtype, int64_t n,
                                  int64_t k, const void *data, size_t bytes);
PF_API void pf_weight_destroy(pf_weight *w);
PF_API pf_status pf_weight_info_get(const pf_weight *w, pf_weight_info *out);

/* PF_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PREFILL_H */
