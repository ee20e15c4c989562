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
 *  - Threads. A context and everything made from it (its buffers, weights, models and their
 *    sessions) is used by one thread at a time: calls on objects of one context must not
 *    overlap, because they share the context's stream, its grow-on-demand scratch (dequantized
 *    weights, fp16 activations, attention workspace) and its byte count. That includes two
 *    sessions of one model: drive them from two threads only under a lock of the caller's
 *    (work already queued stays ordered on the context's stream, so a context may pass from
 *    thread to thread between calls). Different contexts are independent: one thread per
 *    context may run at the same time, on one device or several. Safe from any thread at any time:
 *    pf_version, pf_status_name, pf_status_string, pf_last_error (each thread its own),
 *    pf_device_count, pf_qtype_name, pf_qtype_matrix_bytes, the pf_*_options_init functions,
 *    pf_attention_plan, pf_model_inspect and pf_gemm_default_leg. pf_gemm_set_default_leg is
 *    process-wide: call it while no projection runs.
 *  - No CUDA types appear here (cffi parses this file): the library never prints, throws
 *    or aborts across this boundary.
 *  - GGML quantization type ids are used as they are (PF_QTYPE_*).
 *  - Kernel-level ops (one op family per section below; names pf_<noun>[_<verb>], no _rows
 *    suffix: every op works on rows of tokens):
 *    . Every matrix or vector operand is a view, pf_view {buf, off, ld}, passed as
 *      `const pf_view *` (or held by value in an argument struct): element (r, c) is element
 *      off + r*ld + c of buf, counted in the operand's dtype (float32 unless the op says
 *      otherwise). ld 0 = the op's natural width for that operand (named per op); a vector
 *      operand (one row: a norm weight, a state, one token) ignores ld. A view may start inside
 *      a wider row, e.g. the gate half of a q projection. Weights are pf_weight handles; a KV
 *      cache is a whole buffer (its capacity is its size); pf_attention takes its strides in
 *      pf_attention_options and q, out as whole buffers.
 *    . An entry takes at most 8 parameters. One that needs more takes a size-prefixed argument
 *      struct pf_<op>_args, filled by pf_<op>_args_init(&a, sizeof a) (zeroes it, sets
 *      struct_size and the documented defaults) and then by the caller; a struct_size that
 *      differs from the library's is ABI_MISMATCH. pf_attention_options is this op's struct.
 *    . Checks run in one order, so that every scalar check works without a device: scalars and
 *      shapes (offsets >= 0, ld >= width, sizes in range; sizes never overflow), then NULL
 *      views and buffers, then ctx, then ownership (buffers and weights of ctx) and fit (the
 *      buffer holds the view's last element), then overlaps (an output may alias an input only
 *      where the op says so: same buffer, offset and ld).
 *    . rows == 0 is a no-op after the checks. Calls are asynchronous on ctx's stream unless
 *      stated otherwise.
 *
 * Version 0.2 changed the kernel-level entry points (views, argument structs, names); the core
 * and model-level entry points are those of 0.1. Version 0.3 adds fields at the end of two
 * size-prefixed structs (pf_attention_options.kernel, pf_session_options.cuda_graphs): callers
 * built against 0.2 get ABI_MISMATCH from their _init until rebuilt. Version 0.4 adds
 * device_ms and bytes_read at the end of pf_prewarm_report (the same rule), the context flag
 * PF_CONTEXT_POISON, pf_buffer_copy, pf_weight_copy_f16, pf_model_prewarm_report,
 * pf_model_weight and pf_project_f16x. Version 0.5 adds the tuning fields (pf_tuning, at the end of
 * pf_model_options and pf_session_options, and pf_context_set_tuning / pf_context_get_tuning),
 * which replace the environment switches the library read before (only PREFILL_GEMM,
 * PREFILL_GRAPH, PREFILL_GEMM_LT and PREFILL_LOG remain), and
 * pf_attention_options.position_on_device (the same rule for callers built against 0.4); the
 * delta rule over many sequences in one call (pf_gdn_scan_varlen_args with its _init,
 * pf_gdn_scan_varlen_plan, pf_gdn_scan_varlen); and the many-sequence API: batches
 * (pf_batch_*), pf_session_copy / _fork, snapshots and pf_session_rollback, with
 * pf_session_options.own_executor and snapshot_* at its end; pf_context_options.memory_budget_bytes
 * and pf_prewarm_report.partial at their ends. Version 0.6 adds PF_STATUS_FORMAT_ERROR for the
 * faults of a GGUF's contents, which were IO_ERROR (IO_ERROR keeps those of reading the file;
 * a non-regular file is refused before it is opened, so a FIFO no longer blocks the call), and
 * the tuning fields gemm_blocks, gemm_blocks_slab_rows and gemm_blocks_gemv_rows at the end of pf_tuning (inside
 * pf_model_options and pf_session_options: callers built against an earlier 0.6 header get
 * ABI_MISMATCH from their _init until rebuilt); later in 0.6, the tuning fields
 * prewarm_cache_rows, prewarm_cache_margin and gemm_blocks_ring at the end of pf_tuning and rule_rows,
 * weights_blocks, rule_ratio_min / _max and why at the end of pf_prewarm_report (the same rule).
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
#define PF_VERSION_MINOR 6
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
    PF_STATUS_CUBLAS_ERROR = 5,     /* a cuBLAS call failed */
    PF_STATUS_IO_ERROR = 6,         /* a file cannot be read: missing, no permission, not a
                                       regular file (a directory, a FIFO, a device) */
    PF_STATUS_ABI_MISMATCH = 7,     /* struct_size differs between caller and library */
    PF_STATUS_NO_DEVICE = 8,        /* no CUDA driver or device, or the ordinal does not exist */
    PF_STATUS_INTERNAL = 9,         /* a bug: report it with pf_last_error() */
    PF_STATUS_FORMAT_ERROR = 10,    /* a GGUF's contents: not a GGUF, truncated, malformed, or not
                                       the model it claims (a tensor missing or of a wrong shape,
                                       inconsistent metadata) */
    PF_STATUS_COUNT = 11
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

/* pf_context_options.flags, or-ed. */
typedef enum pf_context_flag {
    PF_CONTEXT_POISON = 1   /* testing: every device allocation of the context (buffers, weights,
                               fp16 caches, scratch, workspaces) is filled with 0xFF bytes (NaN
                               in fp16 and float32) before its first use, so that an element a
                               kernel leaves unwritten shows as NaN. One memset per allocation */
} pf_context_flag;

typedef struct pf_context_options {
    size_t struct_size;     /* set by pf_context_options_init; do not change */
    int32_t device;         /* CUDA ordinal. default 0 */
    uint32_t flags;         /* pf_context_flag values, or-ed; other bits INVALID_ARGUMENT. default 0 */
    size_t workspace_bytes; /* cuBLAS workspace. 0 = library default (32 MiB) */
    size_t memory_budget_bytes; /* the most device bytes the context's allocations may hold, to run
                                   as a smaller card would (a 24 GiB card on an H200): an
                                   allocation past it is OUT_OF_MEMORY, and the free memory the
                                   library plans with (prewarm, auto chunk, pf_context_memory) is
                                   at most budget - held. The CUDA context's own memory is not
                                   counted. default 0 = no budget: the device's memory */
} pf_context_options;

PF_API pf_status pf_context_options_init(pf_context_options *opts, size_t struct_size);

/* Tuning: the engine's internal choices as typed fields, for measurement (A/B runs) and tests.
 * Every field 0 = the library's choice, which is what a deployment wants; the results of any
 * setting are bitwise those of the default unless the field says otherwise. A field left 0
 * takes the value of the level above: a session's tuning over its model's, the model's over
 * its context's (pf_context_set_tuning, which also applies to the kernel-level calls on the
 * context), then the library's default. The environment holds only the deployment knobs
 * (PREFILL_GEMM, PREFILL_GRAPH, PREFILL_GEMM_LT, PREFILL_LOG; docs/tuning.md). */
typedef enum pf_switch {
    PF_SWITCH_DEFAULT = 0,
    PF_SWITCH_ON = 1,
    PF_SWITCH_OFF = 2
} pf_switch;

typedef enum pf_gemm_lt_mode {  /* the f16 leg's per-shape GEMM choice (pf_session_create) */
    PF_GEMM_LT_DEFAULT = 0,     /* on, unless env PREFILL_GEMM_LT=0 */
    PF_GEMM_LT_ON = 1,          /* cuBLASLt where it beat cublasGemmEx by > 3% when timed */
    PF_GEMM_LT_OFF = 2,         /* cublasGemmEx everywhere (not timed) */
    PF_GEMM_LT_FORCE = 3        /* testing: the fastest cuBLASLt algorithm whatever GemmEx's time
                                   (choices kept apart from the normal ones) */
} pf_gemm_lt_mode;

typedef enum pf_row_form {      /* how the f16 producers and the fused q/k RoPE hold a row */
    PF_ROW_FORM_AUTO = 0,       /* in registers where the width allows, else staged */
    PF_ROW_FORM_STAGED = 1,     /* staged in shared memory where it fits (48 KiB), else recomputed */
    PF_ROW_FORM_RECOMPUTE = 2   /* each value computed twice (the form of the widest rows) */
} pf_row_form;

typedef enum pf_gdn_state_kernel {  /* the chunked delta rule's state kernel */
    PF_GDN_STATE_AUTO = 0,          /* warpgroup where it runs (sm_90a build, compute capability
                                       9.0, v rows 16-byte aligned), else warp */
    PF_GDN_STATE_WARP = 1,          /* warp-owned state slices, mma.sync (sm_80 and later) */
    PF_GDN_STATE_WARPGROUP = 2,     /* wgmma + TMA, a CTA per 64 value columns of a head (UNSUPPORTED
                                       where it cannot run) */
    PF_GDN_STATE_WARPGROUP_PAIR = 3 /* the same kernel with a CTA per value head: its two consumer
                                       warpgroups (two state chains on one SM) share each chunk's
                                       copies. Bitwise WARPGROUP's. AUTO takes it where WARPGROUP's
                                       grid (2 CTAs a value head and sequence) exceeds one wave */
} pf_gdn_state_kernel;

typedef struct pf_tuning {
    int32_t gemm_lt;           /* pf_gemm_lt_mode. Sessions: timed at creation; results equal
                                  within the f16 leg's tolerance, bitwise within one mode */
    int32_t fuse_groups;       /* pf_switch (default on): the prewarm lays out Q|K|V, the GDN
                                  in-projections and gate|up as one fp16 block each and sessions run
                                  each group as one GEMM (off: one GEMM per matrix; within the f16
                                  leg's tolerance). Read at the prewarm and at session creation */
    int32_t f16_producers;     /* pf_switch (default on): RMSNorm, SwiGLU, the gated norm and the
                                  attention gate write the f16 leg's fp16 input (off: a cast pass) */
    int32_t row_form;          /* pf_row_form */
    int32_t fuse_qk_rope;      /* pf_switch (default on): the attention layer's q/k norms, RoPE and
                                  KV-cache write as one kernel (off: five kernels) */
    int32_t fuse_conv_norm;    /* pf_switch (default on): the GDN conv1d + SiLU and the q/k L2
                                  norms as one kernel (off: three) */
    int32_t gdn_scan;          /* pf_gdn_scan_path of a session's chunks and of PF_GDN_SCAN_AUTO in
                                  pf_gdn_scan (default: chunked on the fast legs from 64 rows,
                                  sequential on the f32 leg and below; not bitwise across paths) */
    int32_t gdn_state;         /* pf_gdn_state_kernel (the two agree within the path's tolerance,
                                  not bitwise) */
    int32_t gdn_subpass_rows;  /* rows of the chained sub-passes of the chunked delta rule: 0 =
                                  default (2048; a call of 2048 rows chains two of 1024), -1 = one
                                  pass, else a multiple of 64 up to 8192. The bits are one pass's */
    int32_t gdn_pdl;           /* pf_switch (default on where compute capability >= 9.0): the GDN
                                  state kernel as its prep kernel's programmatic dependent */
    int32_t attn_kernel;       /* pf_attn_kernel of the flash path (default: wgmma where it runs) */
    int32_t prewarm_fail_piece; /* testing: N > 0 makes the allocation of the prewarm's piece N
                                   (1-based) fail as out of memory. default 0 (none) */
    int64_t prewarm_piece_bytes; /* the prewarm's first piece (each next twice the last): 0 =
                                    default (256 MiB), -1 = the whole cache in one allocation */
    int32_t varlen;            /* pf_switch (default on): a step of several sequences (a batch) runs
                                  each GDN layer's conv1d + L2 norms and delta rule as one launch
                                  over all of them (off: one launch per sequence; bitwise the same) */
    int32_t gemm_blocks;       /* pf_switch (default: on for sessions and batches, off for the
                                  kernel-level calls; where the device runs it: an sm_90a build on
                                  compute capability 9.0): the f16 leg on a matrix without an fp16
                                  copy multiplies its GGUF blocks, dequantized on the chip up to 64
                                  rows, as per-call slabs from gemm_blocks_slab_rows on, instead of
                                  fp16 slabs on fp32 rows; PF_GEMM_AUTO then runs such a matrix on
                                  the f16 leg (a model whose prewarm cached nothing, or part: the
                                  f16 leg at its file's size, not the f32 leg). The weight operand
                                  is the cache's fp16 bit for bit, the products within the f16
                                  leg's tolerance */
    int32_t gemm_blocks_slab_rows; /* under gemm_blocks: from this many rows of a call on, the
                                  matrix's blocks are dequantized per call into an fp16 slab (the
                                  prewarm's kernel and bits) and the cache's GEMM runs on it, which
                                  is faster there than the GEMM on the blocks; the weight stays at
                                  its file's size, the slab is scratch of the largest matrix (at
                                  most 512 MiB). 0 = default (65, measured on the H200), -1 =
                                  never, else N >= 2. Products equal the cache's GEMM on the same
                                  shape and algorithm bit for bit */
    int32_t gemm_blocks_gemv_rows; /* under gemm_blocks: calls of up to this many rows on Q4_K or
                                  Q6_K blocks run the GEMV form, which applies the blocks' scales
                                  to the fp32 sums (the exact weight, as the f32 leg's operand,
                                  not the cache's fp16: the products within fp32 accumulation of
                                  the exact weight, within the f16 leg's tolerance of the cache);
                                  the other types and more rows run the few-rows form. 0 = default
                                  (8, measured on the H200), -1 = never, else 1..16 */
    int32_t prewarm_cache_rows; /* the prewarm's cache rule: a matrix the f16 leg can read from its
                                  GGUF blocks (gemm_blocks on where the device runs it, a block type)
                                  gets its fp16 cache only where the cached GEMM measured faster than
                                  the blocks' by more than prewarm_cache_margin percent at this many
                                  rows (each shape once per device and process, as gemm_lt's choice);
                                  else it stays at its file's size. 0 = default (2048, a session's
                                  default step), -1 = no rule (cache whatever fits), else 1..65536.
                                  The LM head and units under 4 MiB of fp16 are outside the rule
                                  (cached: the LM head last, as before) */
    int32_t prewarm_cache_margin; /* the rule's margin in percent: 0 = default (3), else 1..100000
                                  (a large margin keeps every such matrix at its file's size) */
    int32_t gemm_blocks_ring;  /* under gemm_blocks, a session's or batch's steps from
                                  gemm_blocks_slab_rows rows on: this many fp16 slab buffers, filled
                                  ahead of their GEMMs on a stream of their own, so that the
                                  dequantization may run where the step leaves SMs idle (an
                                  experiment, measured slower on the H200). 0 = default (off), -1 =
                                  off, else 2..8. The logits are bitwise the in-line slabs' */
} pf_tuning;

/* Sets the tuning of ctx (copied; NULL = all defaults): the kernel-level calls on ctx use it
 * from now on, and models and sessions created on ctx afterwards inherit it (see above). */
PF_API pf_status pf_context_set_tuning(pf_context *ctx, const pf_tuning *tuning);
PF_API pf_status pf_context_get_tuning(const pf_context *ctx, pf_tuning *out);
/* opts NULL = defaults. NO_DEVICE when there is no usable device of that ordinal. */
PF_API pf_status pf_context_create(pf_context **out, const pf_context_options *opts);
/* Drops the caller's handle. The models, sessions, batches, buffers and weights made on ctx may
 * be destroyed before or after it (each holds the context): the stream, handles and device memory
 * go with the last of them. */
PF_API void pf_context_destroy(pf_context *ctx);
PF_API pf_status pf_context_synchronize(pf_context *ctx); /* waits for the context's stream */
/* Free and total bytes of the context's device, as the driver reports them now, plus the bytes
 * that destroyed sessions gave back to the context's session pool (kept there so that the next
 * session or fork takes no cudaMalloc; any allocation of the library that runs short takes them
 * back first, and pf_context_destroy releases them); with a memory budget, at most budget - held. */
PF_API pf_status pf_context_memory(pf_context *ctx, size_t *free_bytes, size_t *total_bytes);
/* Bytes this context holds on the device: buffers, weights, caches, scratch, live sessions. */
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
/* Device-to-device copy of `bytes` bytes from [src_offset, ...) of src to [dst_offset, ...) of
 * dst (buffers of one context; the ranges must not overlap), asynchronous on the context's
 * stream: the device copy bandwidth that the benchmarks compare with. */
PF_API pf_status pf_buffer_copy(pf_buffer *dst, size_t dst_offset, const pf_buffer *src,
                                size_t src_offset, size_t bytes);

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

/* ---------------------------------------------------------------- views (kernel level) */

/* An operand of a kernel-level op: element (r, c) is element off + r*ld + c of buf, in the
 * operand's dtype (see the conventions at the top). */
typedef struct pf_view {
    pf_buffer *buf; /* the buffer; must belong to the op's context. no default (NULL) */
    int64_t off;    /* element offset of row 0, column 0, >= 0. default 0 */
    int64_t ld;     /* row stride in elements, >= the operand's width; 0 = the op's natural
                       width. Ignored for vector operands. default 0 */
} pf_view;

/* ---- attention (kernel level) ---- */

/* KV cache of one attention layer: two buffers, K and V, each [capacity][kv_dim] row-major with
 * kv_dim = n_kv_heads * head_dim; row p holds position p, KV head g owns columns
 * [g*head_dim, (g+1)*head_dim). capacity = buffer bytes / (kv_dim * element size). K rows hold k
 * after the QK RMSNorm and RoPE, V rows the raw v. Query head h reads KV head h / (H / Hkv)
 * (grouped GQA). */
typedef enum pf_kv_dtype {
    PF_KV_F16 = 0, /* fp16 (default): half the memory; the flash kernel's input */
    PF_KV_F32 = 1  /* fp32: the exact path (cuBLAS SGEMM attention, 1e-5) */
} pf_kv_dtype;

typedef enum pf_attn_path {
    PF_ATTN_AUTO = 0,   /* flash where it applies (fp16 cache, head_dim 128 or 256, enough query
                           rows to fill the GPU), else cuBLAS */
    PF_ATTN_CUBLAS = 1, /* QK^T GEMM, causal mask + fp32 softmax, PV GEMM, in passes of rows */
    PF_ATTN_FLASH = 2   /* fused fp16 tensor-core kernel, fp32 online softmax; UNSUPPORTED for an
                           fp32 cache or head_dim other than 128 and 256 */
} pf_attn_path;

typedef enum pf_attn_kernel {  /* which flash kernel PF_ATTN_FLASH (or AUTO's flash choice) runs */
    PF_ATTN_KERNEL_AUTO = 0,   /* the context's tuning (pf_tuning.attn_kernel) if set, else wgmma
                                  on a compute capability 9.0 device with an sm_90a build, else
                                  mma */
    PF_ATTN_KERNEL_MMA = 1,    /* mma.sync m16n8k16 (sm_80 and later) */
    PF_ATTN_KERNEL_WGMMA = 2   /* Hopper wgmma (cc 9.0 and a build with 90a); UNSUPPORTED at
                                  pf_attention elsewhere */
} pf_attn_kernel;

typedef struct pf_attention_options {
    size_t struct_size;         /* set by pf_attention_options_init; do not change */
    int32_t n_heads;            /* H query heads, 1..4096. no default (0) */
    int32_t n_kv_heads;         /* Hkv, 1..H, divides H. no default (0) */
    int32_t head_dim;           /* D, even, 2..4096. no default (0) */
    int32_t kv_dtype;           /* pf_kv_dtype of both cache buffers. default PF_KV_F16 */
    int64_t rows;               /* query rows of this chunk, >= 0 (0: validate only). default 0 */
    int64_t pos0;               /* position of query row 0, >= 0: row t attends to cache rows
                                   0..pos0+t, which must already be written. default 0 */
    float scale;                /* softmax scale, finite, >= 0; 0 = 1/sqrt(head_dim). default 0 */
    int32_t path;               /* pf_attn_path. default PF_ATTN_AUTO */
    int64_t q_head_stride;      /* floats from one head to the next in a q row, >= D; 0 = D.
                                   qwen35 ([q | gate] per head): 2*D. default 0 */
    int64_t q_row_stride;       /* floats between q rows, >= (H-1)*q_head_stride + D;
                                   0 = H * q_head_stride. default 0 */
    int64_t out_row_stride;     /* floats between out rows, >= H*D; 0 = H*D. default 0 */
    int64_t rows_per_pass;      /* cuBLAS path: most query rows per pass, >= 0; 0 = the most that
                                   fit in scores_budget_bytes. default 0 */
    size_t scores_budget_bytes; /* cuBLAS path: device workspace of one pass, about
                                   H * rows_per_pass * (pos0 + rows) * (4 fp32 scores + 2 fp16
                                   probabilities for an fp16 cache) bytes; 0 = 256 MiB. default 0 */
    int32_t kernel;             /* flash path: pf_attn_kernel. default PF_ATTN_KERNEL_AUTO */
    int32_t position_on_device; /* testing: 1 runs the flash path as a session's CUDA graph runs
                                   it, pos0 read from device memory and the wgmma kernel's maps
                                   over the caches' whole capacity (bitwise the same output).
                                   default 0 */
    int64_t page_rows;          /* 0: contiguous caches (pf_attention). > 0: paged caches
                                   (pf_attention_paged): rows per page, a multiple of 64. default 0 */
} pf_attention_options;

PF_API pf_status pf_attention_options_init(pf_attention_options *opts, size_t struct_size);

/* What pf_attention would do for `opts` (pure; no context or device needed): *out_path is
 * PF_ATTN_CUBLAS or PF_ATTN_FLASH, *out_rows_per_pass the cuBLAS pass size (0 for flash) and
 * *out_workspace_bytes the scratch the call reserves in its context (0 for flash). Any out pointer
 * may be NULL. Fails as pf_attention would on the same options. */
PF_API pf_status pf_attention_plan(const pf_attention_options *opts, int32_t *out_path,
                                   int64_t *out_rows_per_pass, size_t *out_workspace_bytes);

/* Writes a->rows rows into a KV cache at positions pos0..pos0+rows-1, converting to kv_dtype
 * (fp16: round to nearest even, saturating at +-65504; NaN stays NaN):
 *   k_cache[pos0 + r][c] = k[r][c], v_cache[pos0 + r][c] = v[r][c], c < kv_dim.
 * pos0 + rows must not exceed either cache's capacity. For an fp32 cache a projection may
 * instead write straight into the cache (a view at element pos0*kv_dim, ld kv_dim). */
typedef struct pf_kv_write_args {
    size_t struct_size;  /* set by pf_kv_write_args_init; do not change */
    pf_view k, v;        /* float32 [rows][ld] sources, kv_dim columns read; ld 0 = kv_dim,
                            at most 2^31 - 1. no default */
    pf_buffer *k_cache;  /* K cache (whole buffer, see above) of kv_dtype. no default (NULL) */
    pf_buffer *v_cache;  /* V cache, a buffer distinct from k_cache; neither cache may be the
                            buffer of k or v. no default (NULL) */
    int64_t rows;        /* rows to write, 0..2^31-1. default 0 */
    int64_t kv_dim;      /* n_kv_heads * head_dim, 1..2^31-1. no default (0) */
    int64_t pos0;        /* cache row of row 0, >= 0, pos0 + rows < 2^31. default 0 */
    int32_t kv_dtype;    /* pf_kv_dtype of both caches. default PF_KV_F16 */
    pf_buffer *page_table; /* NULL: contiguous caches. Else the caches are pools of pages of
                            page_rows rows and this int32 buffer their page table (see
                            pf_attention_paged); position p goes to pool row
                            table[p / page_rows] * page_rows + p % page_rows. The pages written
                            must be distinct. default NULL */
    int64_t page_rows;   /* with page_table: rows per page, a multiple of 64. default 0 */
} pf_kv_write_args;

PF_API pf_status pf_kv_write_args_init(pf_kv_write_args *args, size_t struct_size);
PF_API pf_status pf_kv_write(pf_context *ctx, const pf_kv_write_args *args);

/* Causal grouped attention of `opts->rows` query rows at positions pos0..pos0+rows-1 over the
 * cache rows 0..pos0+rows-1 (spec B2):
 *   out[t][h*D + d] = sum_{j <= pos0+t} softmax_j(scale * q_h[t] . K[j, g]) V[j, g][d],
 *   g = h / (H / Hkv), q_h[t] = q[t * q_row_stride + h * q_head_stride + 0..D-1].
 * q: float32 buffer (from its start); out: float32 [rows][out_row_stride] buffer (columns past
 * H*D untouched); k_cache, v_cache: kv_dtype caches (see above) with capacity >= pos0 + rows.
 * out must be a buffer distinct from q and the caches. Runs on the context's stream. */
PF_API pf_status pf_attention(pf_context *ctx, const pf_attention_options *opts, const pf_buffer *q,
                              const pf_buffer *k_cache, const pf_buffer *v_cache, pf_buffer *out);

/* pf_attention over paged caches: k_pool and v_pool hold pages of opts->page_rows rows (> 0, a
 * multiple of 64; each pool a whole number of pages, at most 2^31 - 1 rows) and page_table
 * (int32, from its start) lists the pool page of each page of positions: key j is pool row
 *   page_table[j / page_rows] * page_rows + j % page_rows,
 * for j < pos0 + rows, so the table needs ceil((pos0 + rows) / page_rows) entries, each a page
 * of both pools. Pages may repeat (shared prefixes). The output is bitwise pf_attention's on
 * contiguous caches holding the same rows, on every path and kernel. The table's entries are
 * read and checked first (a synchronous copy of that many int32). */
PF_API pf_status pf_attention_paged(pf_context *ctx, const pf_attention_options *opts, const pf_buffer *q,
                                    const pf_buffer *k_pool, const pf_buffer *v_pool,
                                    const pf_buffer *page_table, pf_buffer *out);

/* Greedy decoding: out_ids[r] = argmax_{i < n} x[r][i] for r < rows.
 * x: float32 [rows][ld] view, ld 0 = n, at most 2^31 - 1; 1 <= n <= 2^31 - 1. out_ids: a
 * vector of rows int32 (off counted in int32), not overlapping x. Ties go to the lowest index;
 * NaN ranks above every number (numpy.argmax's rule: the first NaN wins); a row of -inf
 * gives 0. */
PF_API pf_status pf_argmax(pf_context *ctx, const pf_view *x, const pf_view *out_ids, int64_t rows,
                           int64_t n);

/* ---- gemm (kernel level) ---- */
/* Dequantization, the embedding gather, projections Y = X . W^T through a chosen leg, the
 * weights' fp16 caches and their all-or-nothing prewarm, and the fused Q4_0 / Q8_0 kernels.
 * Activations are float32 views [rows][ld]; columns beyond an output's width are never
 * written; an output must not overlap an input. Weights must belong to ctx. */

typedef enum pf_gemm_leg {
    PF_GEMM_DEFAULT = 0, /* the process default: env PREFILL_GEMM = f16 | f32 | auto (unset = auto) */
    PF_GEMM_AUTO = 1,    /* f16 when the weight has an fp16 cache (or, with tuning gemm_blocks: a
                            block type or F16), else f32 */
    PF_GEMM_F32 = 2,     /* fp32 dequantized weight, SGEMM in pedantic fp32 (no TF32): bound 1e-5 */
    PF_GEMM_F16 = 3,     /* fp16 weight (cache, or dequantized per call) and fp16 activations on
                            tensor cores, fp32 accumulation and output: bound 3e-3 */
    PF_GEMM_INT8 = 4     /* the 8-bit leg (Hopper, compute capability 9.0; UNSUPPORTED elsewhere
                            and for k % 16 != 0): X quantized to int8 per row and 128 columns
                            (scale amax/127, round to nearest even), W to int8 from its
                            dequantized values with rank-1 scales (a factor per output row times
                            one per 128 rows and 128 columns), int8 tensor cores with one fp32
                            promotion per 128 columns, fp32 output. About 1e-2 relative per
                            projection: not a bound of the f16 kind. Sessions and batches on it
                            run only the recipe's matrices (attn_q, the GDN attn_gate, ffn_gate,
                            ffn_up) on this leg and the others on the f16 leg
                            (docs/int8-recipe.md, recipe int8-g128-w128r-mix); never the default */
} pf_gemm_leg;

/* The process default leg, resolved to PF_GEMM_AUTO, _F32 or _F16. The env variable is read
 * once per process; an invalid value prints one warning line on stderr and means auto. A session
 * resolves its leg once, at creation. */
PF_API pf_status pf_gemm_default_leg(int32_t *out);
/* Overrides the process default (PF_GEMM_AUTO, _F32 or _F16); PF_GEMM_DEFAULT restores the
 * env value. Process-wide; meant for tests and tools. */
PF_API pf_status pf_gemm_set_default_leg(int32_t leg);

/* Dequantizes weight w ([n][k]) into out: [n][k] of float32 elements when out_f16 == 0 (equal
 * to gguf.quants.dequantize), fp16 elements (round to nearest even) when out_f16 == 1; out.off
 * counts those elements. Rows are written packed: out.ld must be 0 or k (else UNSUPPORTED). */
PF_API pf_status pf_dequantize(pf_context *ctx, const pf_weight *w, const pf_view *out,
                               int32_t out_f16);

/* Embedding gather: out[r][j] = float32 row ids[r] of table ([n_vocab][k] = [n][k]), for
 * r < rows, j < k. ids: HOST array of `rows` int32 token ids, each in [0, n_vocab) (else
 * INVALID_ARGUMENT naming the position and the value; nothing is written). ids may be NULL
 * only when rows == 0. out: float32 [rows][ld] view, ld 0 = k. Synchronous for ids (copied
 * to the device before returning). */
PF_API pf_status pf_embed(pf_context *ctx, const pf_weight *table, const int32_t *ids,
                          int64_t rows, const pf_view *out);

/* Projection: Y[r][j] = (accumulate ? Y[r][j] : 0) + sum_i X[r][i] * W[j][i] for r < rows,
 * j < n, with W = weight w ([n][k]). x: float32 [rows][ld] view, ld 0 = k; y: float32
 * [rows][ld] view, ld 0 = n; rows and both ld at most 2^31 - 1 (cuBLAS); x and y must not
 * overlap. accumulate: 0 or 1 (1 = the fused residual add). leg: a pf_gemm_leg. Activations
 * beyond the fp16 range on the f16 leg are scaled per row by a power of two (exact), never
 * turned into Inf. */
PF_API pf_status pf_project(pf_context *ctx, pf_weight *w, const pf_view *x, const pf_view *y,
                            int64_t rows, int32_t accumulate, int32_t leg);

/* Projection from the f16 leg's input form, the form the engine's producers write on the act16
 * route (RMSNorm, SwiGLU and the gates write fp16 rows and power-of-two row scales; no cast
 * pass): Y[r][j] = inv[r] * ((accumulate ? Y[r][j] : 0) + sum_i X16[r][i] * W[j][i]), fp32
 * accumulation and output, on w's fp16 copy (pf_weight_cache_f16, or an F16 weight; else
 * UNSUPPORTED). x16: fp16 [rows][k] view (off in fp16 elements; ld must be 0 or k, else
 * UNSUPPORTED); inv: float32 [rows] vector view of row scales, NULL = 1 for every row (no
 * unscale pass); y: float32 [rows][ld] view, ld 0 = n, not overlapping x16 or inv. With
 * accumulate and a row scale other than 1 the caller holds Y's row divided by inv[r] (as the
 * producers do for the residual stream). Bitwise pf_project on the f16 leg of X = X16 * inv
 * wherever that leg's cast leaves the rows unscaled. */
PF_API pf_status pf_project_f16x(pf_context *ctx, pf_weight *w, const pf_view *x16,
                                 const pf_view *inv, const pf_view *y, int64_t rows,
                                 int32_t accumulate);

/* Caches w as fp16 ([n][k], n*k*2 bytes; pf_weight_info.f16_bytes reports it); a no-op when
 * already cached. pf_weight_drop_f16 frees the cache (waits for ctx's stream); no-op if none. */
PF_API pf_status pf_weight_cache_f16(pf_weight *w);
PF_API pf_status pf_weight_drop_f16(pf_weight *w);
/* The 8-bit leg's copy of w (PF_GEMM_INT8): int8 codes [n][k] and the rank-1 scales' factors
 * (about n*k bytes: half the fp16 cache). Made from w's dequantized fp32 values; a no-op when
 * already cached; UNSUPPORTED where that leg cannot run. pf_project on PF_GEMM_INT8 uses it, or
 * without it quantizes w per call (the same bits). Synchronizes ctx's stream. pf_weight_drop_i8
 * frees it (a no-op when none). A model loaded with gemm_leg PF_GEMM_INT8 gives the recipe's
 * matrices this copy instead of the fp16 one. */
PF_API pf_status pf_weight_cache_i8(pf_weight *w);
PF_API pf_status pf_weight_drop_i8(pf_weight *w);
/* Copies w's fp16 cache into out: fp16 elements [n][k], packed (out.off counts fp16 elements,
 * out.ld 0 or k, else UNSUPPORTED). INVALID_ARGUMENT when w has no cache. For tests and tools. */
PF_API pf_status pf_weight_copy_f16(pf_context *ctx, const pf_weight *w, const pf_view *out);

typedef struct pf_prewarm_report {
    size_t struct_size;      /* set by pf_prewarm_report_init */
    int32_t armed;           /* 1: every weight of the set has its fp16 cache (or, in a model's
                                prewarm, stays on its blocks by the cache rule); 0: none added */
    int32_t weights_total;   /* distinct weights in the set */
    int32_t weights_cached;  /* of them, cached after the call */
    int32_t weights_added;   /* cached by this call */
    size_t bytes_total;      /* fp16 bytes of the whole set */
    size_t bytes_needed;     /* fp16 bytes of the weights not cached before the call */
    size_t bytes_added;      /* bytes this call allocated and kept */
    size_t free_bytes;       /* free device memory seen before allocating */
    size_t headroom_bytes;   /* the headroom asked for */
    double elapsed_ms;       /* wall time of the call: host set-up, cudaMemGetInfo, the cache's
                                allocations, the launches and the final synchronization */
    char reason[192];        /* why not armed; "" when armed */
    double device_ms;        /* device time of the dequantization (CUDA events from before the
                                first launch, after the first piece of the cache is allocated, to
                                after the last): the kernels, plus any wait of the device for a
                                later piece's allocation; not the first allocation. 0 when
                                nothing was dequantized */
    size_t bytes_read;       /* GGUF bytes read by the dequantization (bytes_added were written) */
    int32_t partial;         /* 1: a model's prewarm that did not fit whole cached what fitted
                                (whole fused groups, largest first, the LM head last: weights_cached of
                                weights_total, bytes_added bytes); the model's other matrices
                                run the f16 leg by streaming (dequantized per call into the
                                session's scratch), also under PF_GEMM_AUTO. 0 otherwise */
    int32_t rule_rows;       /* rows at which the cache rule measured (tuning prewarm_cache_rows;
                                0: no rule ran). pf_prewarm_f16 runs no rule */
    int32_t weights_blocks;  /* weights the rule left at their file's size (the f16 leg reads their
                                blocks); armed counts them as done */
    double rule_ratio_min;   /* over the shapes measured: the blocks' time / the cache's time at */
    double rule_ratio_max;   /* rule_rows (0 when none was measured) */
    char why[256];           /* what is cached and why, one line */
} pf_prewarm_report;

PF_API pf_status pf_prewarm_report_init(pf_prewarm_report *report, size_t struct_size);
/* Caches every weight of weights[0..count) as fp16, all or nothing: only when the bytes still
 * needed + headroom_bytes fit in the device's free memory. The caches are allocated in a few
 * pieces of whole fused groups (each dequantized while the next is allocated), so two weights of
 * one call need not be adjacent unless they are one fused block. A shortfall or an allocation
 * failure (of any piece) frees what this call cached and returns OK with report->armed = 0 and
 * the reason;
 * bad arguments and CUDA faults return their status. Weights already cached count as done;
 * repeated entries count once. report (NULL = not wanted) must come from
 * pf_prewarm_report_init. Synchronizes ctx's stream. */
PF_API pf_status pf_prewarm_f16(pf_context *ctx, pf_weight *const *weights, int32_t count,
                                size_t headroom_bytes, pf_prewarm_report *report);

/* Fused kernels straight on the weight's blocks (no dequantized copy; built for every
 * supported type, Q4_0 / Q8_0 being the ones they are meant for), fp32 math on exactly decoded
 * weights (bound 1e-5). The tiled kernels (pf_qgemm with rows > 1, pf_qgemm_swiglu) need k a
 * multiple of 32.
 * pf_qgemm: the contract of pf_project (rows == 1 runs the GEMV).
 * pf_qgemm_swiglu: w is [2n][k], rows [0, n) gate and [n, 2n) up; out[r][j] = silu(g) * u
 * with g = X[r] . W[j], u = X[r] . W[n+j]; x: [rows][ld], ld 0 = k; out: [rows][ld], ld 0 = n.
 * pf_qgemv: one row; x and y are vectors of k and n floats (y += when accumulate). */
PF_API pf_status pf_qgemm(pf_context *ctx, const pf_weight *w, const pf_view *x, const pf_view *y,
                          int64_t rows, int32_t accumulate);
PF_API pf_status pf_qgemm_swiglu(pf_context *ctx, const pf_weight *w, const pf_view *x,
                                 const pf_view *out, int64_t rows);
PF_API pf_status pf_qgemv(pf_context *ctx, const pf_weight *w, const pf_view *x, const pf_view *y,
                          int32_t accumulate);

/* ---- rows (kernel level) ---- */
/* Row kernels of the prefill on float32 views. Matrix operands are [rows][ld] with ld 0 = the
 * width named per op. Per-head ops address head h of row r at column h*head_stride of the view
 * (head_stride >= head_dim, 0 = head_dim; qwen35 [q | gate] rows: 2*head_dim) and take ld 0 =
 * n_heads*head_stride. fp32 math, deterministic (fixed reduction orders); bound 1e-5 relative
 * against float64. */

/* RMSNorm: y[r][c] = x[r][c] / sqrt(mean_c(x[r][.]^2) + eps) * w[c], c < cols; eps finite,
 * >= 0. w: vector of cols floats. x, y: ld 0 = cols. y may be x itself (same buffer, off and
 * ld); no other overlap. */
PF_API pf_status pf_rms_norm(pf_context *ctx, const pf_view *x, const pf_view *w, const pf_view *y,
                             int64_t rows, int64_t cols, float eps);

/* Per-head RMSNorm in place (QK-norm): each head of x is normalised as above with w (vector of
 * head_dim floats), which must not overlap x. n_heads, head_dim in 1..65536. */
PF_API pf_status pf_head_rms_norm(pf_context *ctx, const pf_view *x, const pf_view *w, int64_t rows,
                                  int32_t n_heads, int32_t head_dim, int64_t head_stride,
                                  float eps);

/* Partial NEOX RoPE in place (spec B1). Row t is at position pos0 + t; pairs (i, i + rot_dim/2)
 * for i < rot_dim/2 rotate by phi = p * base^(-2i/rot_dim); dims [rot_dim, head_dim) are
 * untouched. The angle is computed in float64 (exact to fp32 rounding at any position). */
typedef struct pf_rope_neox_args {
    size_t struct_size;  /* set by pf_rope_neox_args_init; do not change */
    pf_view x;           /* float32 [rows][ld] of heads, rotated in place; ld 0 =
                            n_heads*head_stride. no default */
    int64_t rows;        /* rows, >= 0. default 0 */
    int32_t n_heads;     /* heads per row, 1..65536. no default (0) */
    int32_t head_dim;    /* floats per head, 1..65536. no default (0) */
    int64_t head_stride; /* floats from one head to the next, >= head_dim; 0 = head_dim.
                            default 0 */
    int32_t rot_dim;     /* rotated dims, even, 2..head_dim. no default (0) */
    float base;          /* frequency base, finite, > 1. no default (0) */
    int64_t pos0;        /* position of row 0, 0..2^52. default 0 */
} pf_rope_neox_args;

PF_API pf_status pf_rope_neox_args_init(pf_rope_neox_args *args, size_t struct_size);
PF_API pf_status pf_rope_neox(pf_context *ctx, const pf_rope_neox_args *args);

/* SwiGLU: out[r][c] = silu(g[r][c]) * u[r][c], silu(x) = x / (1 + exp(-x)), c < cols; ld 0 =
 * cols. out may be g or u itself (same buffer, off and ld); no other overlap. */
PF_API pf_status pf_swiglu(pf_context *ctx, const pf_view *g, const pf_view *u, const pf_view *out,
                           int64_t rows, int64_t cols);

/* Residual add: y[r][c] += x[r][c], c < cols; ld 0 = cols. x and y must not overlap. */
PF_API pf_status pf_add(pf_context *ctx, const pf_view *y, const pf_view *x, int64_t rows,
                        int64_t cols);

/* Sigmoid output gate (qwen35 attention, spec A8), in place on o:
 *   o[r][h*head_dim + i] *= sigmoid(gate[r][h*gate_head_stride + i]).
 * o: ld 0 = n_heads*head_dim; gate: heads as above with gate_head_stride (0 = head_dim),
 * ld 0 = n_heads*gate_head_stride. qwen35: gate is the q-projection output viewed from
 * off = head_dim (the gate half of head 0), gate_head_stride = 2*head_dim. o and gate must not
 * overlap. */
PF_API pf_status pf_sigmoid_gate(pf_context *ctx, const pf_view *o, const pf_view *gate,
                                 int64_t rows, int32_t n_heads, int32_t head_dim,
                                 int64_t gate_head_stride);

/* ---- gdn (kernel level) ---- */
/* Gated DeltaNet ops (spec 3.2) on float32 views, as the row kernels. Each is bitwise equal to
 * `rows` calls of itself with rows = 1 over the same rows in order (the per-token twin used by
 * decode). State operands (conv window, recurrent state) are float32 vectors updated in place,
 * so consecutive calls continue one sequence. */

/* Causal depthwise conv1d + SiLU over a chunk (G3). m: pre-conv rows [rows][ld], conv_dim
 * columns read, ld 0 = conv_dim. window: vector of (kc-1)*conv_dim floats, [kc-1][conv_dim],
 * oldest row first; replaced by the last kc-1 rows of concat(window, m) (valid for rows < kc-1
 * too). weight: vector of conv_dim*kc floats, [conv_dim][kc], tap kc-1 multiplies the current
 * token. u[r][ch] = silu(sum_i X[r+i][ch] * weight[ch][i]), X = concat(window, m); u: ld 0 =
 * conv_dim. conv_dim in 1..2^31, kc in 2..8. u must not overlap m, window or weight; window
 * must not overlap m or weight. */
PF_API pf_status pf_gdn_conv1d(pf_context *ctx, const pf_view *m, const pf_view *window,
                               const pf_view *weight, const pf_view *u, int64_t rows,
                               int64_t conv_dim, int32_t kc);

/* Per-head L2 norm in place (G5), HF's formula: x_h <- x_h * rsqrt(sum x_h^2 + eps) * scale,
 * heads addressed as in the row kernels. eps finite, >= 0 (1e-6 for qwen35); scale finite: 1
 * for k, 1/sqrt(head_dim) for q. (llama.cpp's x / max(||x||, eps) differs by ~eps/(2||x||^2).) */
PF_API pf_status pf_gdn_l2norm(pf_context *ctx, const pf_view *x, int64_t rows, int32_t n_heads,
                               int32_t head_dim, int64_t head_stride, float eps, float scale);

/* Gates (G2): beta[r][j] = sigmoid(b[r][j]); g[r][j] = ssm_a[j] * softplus(alpha[r][j] +
 * dt_bias[j]) (softplus(x) = x for x > 20), j < n_v_heads. Outputs must not overlap inputs or
 * each other. */
typedef struct pf_gdn_gates_args {
    size_t struct_size;  /* set by pf_gdn_gates_args_init; do not change */
    pf_view b, alpha;    /* float32 [rows][ld] inputs, ld 0 = n_v_heads. no default */
    pf_view ssm_a;       /* vector of n_v_heads floats (-exp(A_log)). no default */
    pf_view dt_bias;     /* vector of n_v_heads floats. no default */
    pf_view beta, g;     /* float32 [rows][ld] outputs, ld 0 = n_v_heads. no default */
    int64_t rows;        /* rows, >= 0. default 0 */
    int32_t n_v_heads;   /* value heads, 1..65536. no default (0) */
} pf_gdn_gates_args;

PF_API pf_status pf_gdn_gates_args_init(pf_gdn_gates_args *args, size_t struct_size);
PF_API pf_status pf_gdn_gates(pf_context *ctx, const pf_gdn_gates_args *args);

/* Gated RMSNorm (G8): y[r][j*dv + i] = RMSNorm(o[r][j*dv + .]; w, eps)[i] * silu(z[r][j*dv + i])
 * for j < n_v_heads, i < dv. y may be o itself (same buffer, off and ld); no other overlap. */
typedef struct pf_gdn_gated_rms_norm_args {
    size_t struct_size;  /* set by pf_gdn_gated_rms_norm_args_init; do not change */
    pf_view o, z;        /* float32 [rows][ld] inputs, ld 0 = n_v_heads*dv. no default */
    pf_view w;           /* vector of dv floats (ssm_norm, shared by the heads). no default */
    pf_view y;           /* float32 [rows][ld] output, ld 0 = n_v_heads*dv. no default */
    int64_t rows;        /* rows, >= 0. default 0 */
    int32_t n_v_heads;   /* value heads, 1..65536. no default (0) */
    int32_t dv;          /* floats per value head, 1..65536. no default (0) */
    float eps;           /* finite, >= 0. default 1e-6 (qwen35) */
} pf_gdn_gated_rms_norm_args;

PF_API pf_status pf_gdn_gated_rms_norm_args_init(pf_gdn_gated_rms_norm_args *args,
                                                 size_t struct_size);
PF_API pf_status pf_gdn_gated_rms_norm(pf_context *ctx, const pf_gdn_gated_rms_norm_args *args);

/* Gated delta rule (G7) over `rows` tokens. Value head j uses key head j % n_k_heads (qwen35
 * tiled pairing). Per token, per head: S = exp(g) S; e = (v - S^T k) * beta; S += k e^T;
 * o = S^T q. The state is read at the start and written back at the end, so consecutive calls
 * continue one sequence. */
typedef enum pf_gdn_scan_path {
    PF_GDN_SCAN_AUTO = 0,       /* chunked for dk = dv = 128 and rows >= 64, else sequential;
                                   pf_gdn_scan takes the context's tuning.gdn_scan first */
    PF_GDN_SCAN_SEQUENTIAL = 1, /* token by token with the state on chip: the exact path (fp32,
                                   bound 1e-5) and decode's; bitwise equal to `rows` calls of
                                   one row */
    PF_GDN_SCAN_CHUNKED = 2     /* chunkwise-parallel WY/UT form (spec 3.2.1) on tensor cores:
                                   fp16 operands with exact per-chunk power-of-two scales, fp32
                                   accumulation and state; tested at 2e-3 relative against
                                   float64 (3e-4 to 7e-4 measured, NOTES.md). dk = dv = 128 only (else UNSUPPORTED); q and k
                                   must be L2-normalised (|x| <= 1). Chunks of 64 rows restart at
                                   every call: not bitwise equal across different splits */
} pf_gdn_scan_path;

typedef struct pf_gdn_scan_args {
    size_t struct_size; /* set by pf_gdn_scan_args_init; do not change */
    pf_view q, k;       /* float32 [rows][ld], n_k_heads heads of dk (ld 0 = n_k_heads*dk);
                           typically inside the conv output (q at column 0, k at n_k_heads*dk),
                           already L2-normalised, q scaled by 1/sqrt(dk). no default */
    pf_view v;          /* float32 [rows][ld], n_v_heads heads of dv (ld 0 = n_v_heads*dv).
                           no default */
    pf_view beta, g;    /* float32 [rows][ld] of n_v_heads (ld 0 = n_v_heads). no default */
    pf_view state;      /* float32 [n_v_heads][dk][dv] (key index, then value index) at element
                           off, read and written back; ld is ignored. no default */
    pf_view o;          /* float32 [rows][ld], n_v_heads heads of dv (ld 0 = n_v_heads*dv); must
                           not overlap q, k, beta, g or state; may be v itself (same buffer,
                           off and ld). no default */
    int64_t rows;       /* tokens, >= 0. default 0 */
    int32_t n_k_heads;  /* key heads, 1..65536. no default (0) */
    int32_t n_v_heads;  /* value heads, a multiple of n_k_heads, <= 65536. no default (0) */
    int32_t dk, dv;     /* head dims, each 16, 32, 64 or 128. no default (0) */
    int32_t path;       /* pf_gdn_scan_path. default PF_GDN_SCAN_AUTO */
    pf_view workspace;  /* the chunked path's scratch: bytes from BYTE offset off (ld ignored),
                           at least pf_gdn_scan_plan's workspace bytes, 256-byte aligned, not
                           overlapping any operand. buf NULL (default): the context's own
                           scratch, grown on demand (an allocation on the call) */
} pf_gdn_scan_args;

PF_API pf_status pf_gdn_scan_args_init(pf_gdn_scan_args *args, size_t struct_size);
/* What pf_gdn_scan would run for `args` (pure; no context or device needed; views unread):
 * *out_path is PF_GDN_SCAN_SEQUENTIAL or PF_GDN_SCAN_CHUNKED and *out_workspace_bytes the
 * scratch it needs (0 for sequential). Out pointers may be NULL. The same argument errors as
 * pf_gdn_scan for the scalar fields. */
PF_API pf_status pf_gdn_scan_plan(const pf_gdn_scan_args *args, int32_t *out_path,
                                  size_t *out_workspace_bytes);
PF_API pf_status pf_gdn_scan(pf_context *ctx, const pf_gdn_scan_args *args);

/* The gated delta rule over several sequences in one call ("varlen"): sequence i is rows
 * [cu_seqlens[i], cu_seqlens[i+1]) of q, k, v, beta, g and o (back to back, each >= 1 row) with
 * its own state, slot state_indices[i] of the state pool, read and written back. Exactly as if
 * each sequence ran alone through pf_gdn_scan on its rows and its slot (same path): no sequence
 * reads another's rows or slot. The sequential path is bitwise those calls; the chunked path
 * too (its chunks start at each sequence's first row; tested for sequences of up to 8192 rows,
 * within one pass of pf_gdn_scan). The chunked path runs in rounds of at most 128 chunks of 64
 * rows (a long sequence continues in the next round, its slot carrying the state), each round
 * one launch over all its sequences. Asynchronous on ctx's stream; the sequence tables (4 n + 1
 * int64 per round) go to the device as kernel arguments, or, past 512 values (about 127
 * sequences), as one copy from host memory that may first wait for the stream's earlier work. */
typedef struct pf_gdn_scan_varlen_args {
    size_t struct_size;            /* set by pf_gdn_scan_varlen_args_init; do not change */
    pf_view q, k, v, beta, g, o;   /* as pf_gdn_scan_args, rows = cu_seqlens[n_seqs]. no default */
    pf_view state;                 /* float32 [n_states][n_v_heads][dk][dv] pool at element off,
                                      read and written in place (ld ignored). no default */
    const int64_t *cu_seqlens;     /* HOST [n_seqs + 1]: cu_seqlens[0] = 0, strictly increasing.
                                      no default */
    const int32_t *state_indices;  /* HOST [n_seqs]: pool slot of each sequence, distinct, in
                                      [0, n_states). default NULL = slot i */
    int32_t n_seqs;                /* sequences, >= 0 (0: nothing to do). default 0 */
    int32_t n_states;              /* slots in the pool, >= 1 when n_seqs >= 1. default 0 */
    int32_t n_k_heads, n_v_heads;  /* as pf_gdn_scan_args. no default (0) */
    int32_t dk, dv;                /* as pf_gdn_scan_args. no default (0) */
    int32_t path;                  /* pf_gdn_scan_path. AUTO: the context's tuning.gdn_scan, then
                                      chunked where supported (dk = dv = 128) and the longest
                                      sequence has >= 64 rows, every sequence on it; else
                                      sequential. default PF_GDN_SCAN_AUTO */
    pf_view workspace;             /* as pf_gdn_scan_args, at least pf_gdn_scan_varlen_plan's
                                      bytes (the sequence tables, and the chunked path's scratch);
                                      buf NULL (default): the context's own scratch */
} pf_gdn_scan_varlen_args;

PF_API pf_status pf_gdn_scan_varlen_args_init(pf_gdn_scan_varlen_args *args, size_t struct_size);
/* What pf_gdn_scan_varlen would run for `args` (pure; views unread; cu_seqlens and state_indices
 * read and checked): *out_path and the workspace bytes it needs. The same argument errors as
 * pf_gdn_scan_varlen for the scalar fields. Out pointers may be NULL. */
PF_API pf_status pf_gdn_scan_varlen_plan(const pf_gdn_scan_varlen_args *args, int32_t *out_path,
                                         size_t *out_workspace_bytes);
PF_API pf_status pf_gdn_scan_varlen(pf_context *ctx, const pf_gdn_scan_varlen_args *args);

/* ---- models and sessions (model level) ----
 * A model is a GGUF file of arch qwen3 or qwen35, validated tensor by tensor and uploaded to a
 * context's device. A session holds one sequence: its KV caches (attention layers), conv
 * windows and recurrent states (GDN layers) and its position; its capacity and scratch are
 * fixed when it is created, so prefill allocates nothing. */

typedef struct pf_model pf_model;
typedef struct pf_session pf_session;

typedef enum pf_arch { PF_ARCH_QWEN3 = 1, PF_ARCH_QWEN35 = 2 } pf_arch;

/* Progress of a long step: stage is "load" or "prewarm"; done/total in bytes. The model keeps
 * the function and calls it again on pf_model_prewarm: it must stay valid while the model lives. */
typedef void (*pf_progress_fn)(void *user, const char *stage, int64_t done, int64_t total);

typedef struct pf_model_options {
    size_t struct_size;            /* set by pf_model_options_init; do not change */
    int32_t gemm_leg;              /* PF_GEMM_* of sessions that do not choose. default 0 = process
                                      default. PF_GEMM_INT8: the prewarm gives the 8-bit leg's
                                      matrices their int8 copy instead of the fp16 one
                                      (UNSUPPORTED off Hopper) */
    int32_t prewarm;               /* 1: cache every matrix as fp16 at load; when the whole set does
                                      not fit in the free memory (less the headroom), cache what
                                      fits and stream the rest on the f16 leg (the prewarm report
                                      says which: partial = 1). default 1 */
    size_t prewarm_headroom_bytes; /* free VRAM left after the prewarm. default 0 = 2 GiB */
    pf_progress_fn progress;       /* NULL = no progress reports. default NULL */
    void *progress_user;           /* passed to progress. default NULL */
    pf_tuning tuning;              /* over the context's; read by the prewarm (fuse_groups,
                                      prewarm_*) and inherited by the model's sessions. default 0 */
} pf_model_options;

typedef struct pf_model_info {
    int32_t arch;                  /* PF_ARCH_* */
    int32_t n_layer;               /* blocks run (MTP blocks excluded) */
    int32_t n_embd, n_ff, n_vocab;
    int32_t n_head, n_head_kv, head_dim, rope_dim;
    int32_t n_attn_layers;         /* layers with a KV cache */
    int32_t ssm_hk, ssm_hv, ssm_dk, ssm_dv, conv_kernel; /* 0 for qwen3 */
    int32_t tied_output;           /* 1: token_embd is the LM head */
    int32_t f16_armed;             /* 1: every matrix has its fp16 copy (prewarm done) */
    int64_t context_length;
    size_t weight_bytes;           /* raw GGUF bytes on the device */
    size_t f16_bytes;              /* fp16 copies on the device */
    double load_ms, prewarm_ms;
} pf_model_info;

PF_API pf_status pf_model_options_init(pf_model_options *opts, size_t struct_size);
/* Loads `path` onto ctx's device. IO_ERROR for a file that cannot be read (missing, not a regular
 * file: checked before it is opened); FORMAT_ERROR for one that is not a GGUF, is truncated or
 * malformed, or lacks a tensor or has one of the wrong shape (the message names it);
 * UNSUPPORTED for another arch or a quantization type this build does not know. opts NULL =
 * defaults. */
PF_API pf_status pf_model_load(pf_model **out, pf_context *ctx, const char *path,
                               const pf_model_options *opts);
PF_API void pf_model_destroy(pf_model *model);
/* Parses and validates a GGUF as pf_model_load does, without a device: fills *out (f16 fields 0,
 * weight_bytes = tensor bytes). The same errors as pf_model_load. */
PF_API pf_status pf_model_inspect(const char *path, pf_model_info *out);
PF_API pf_status pf_model_info_get(const pf_model *model, pf_model_info *out);
/* Caches every matrix as fp16 now; *armed = 1 when all are cached or left at their file's size
 * by the cache rule (tuning prewarm_cache_rows), 0 when the set did not fit (then what fits is
 * cached and the rest streams: pf_model_prewarm_report). */
PF_API pf_status pf_model_prewarm(pf_model *model, size_t headroom_bytes, int32_t *armed);
/* The report of the model's last prewarm (at load or pf_model_prewarm); armed = 0 and
 * reason "not run" when there was none. A model's prewarm runs the cache rule (tuning
 * prewarm_cache_rows): rule_rows, weights_blocks, the ratios and why say what it measured and
 * kept. report must come from pf_prewarm_report_init. */
PF_API pf_status pf_model_prewarm_report(const pf_model *model, pf_prewarm_report *report);
/* The weight of the model's matrix `name` (a GGUF tensor name, e.g. "blk.0.ffn_up.weight"):
 * borrowed, valid while the model lives; do not destroy it. INVALID_ARGUMENT when the model has
 * no matrix of that name (1-D tensors are not weights). For tests and tools. */
PF_API pf_status pf_model_weight(pf_model *model, const char *name, pf_weight **out);
/* Paged KV (issue 39): a pool of n_pages pages of page_rows positions (a multiple of 64) of every
 * attention layer's K and V rows in kv_dtype, allocated now, from which sessions created with
 * pf_session_options.kv_paged = 1 take pages as their positions reach them. Forks and
 * pf_session_copy / _copy_prefix of paged sessions share the pages of their common prefix
 * (reference counts; a shared partial page is copied when written), rollback and reset give
 * pages back; the logits are bitwise those of contiguous sessions. Pages a multiple of the
 * Hopper attention kernel's key tiles (704 rows at head_dim 128, 320 at 256) keep its tiles in
 * one page. One pool per model: a second call replaces it while no session uses it (else
 * INVALID_ARGUMENT). A prefill that needs more pages than are free fails with OUT_OF_MEMORY
 * and changes nothing. UNSUPPORTED for a model without attention layers. */
PF_API pf_status pf_model_kv_pool(pf_model *model, int32_t page_rows, int32_t n_pages, int32_t kv_dtype);
/* The pool's pages in all and free, its page rows and device bytes (all 0 when there is none);
 * any out pointer may be NULL. */
PF_API pf_status pf_model_kv_pool_info(const pf_model *model, int32_t *n_pages, int32_t *n_free,
                                       int32_t *page_rows, size_t *bytes);

typedef struct pf_session_options {
    size_t struct_size;    /* set by pf_session_options_init; do not change */
    int32_t max_tokens;    /* capacity in positions. default 4096 */
    int32_t chunk_tokens;  /* rows per internal chunk (scratch is sized for it). default 0 = auto:
                              2048 rows (measured ~20% faster than 512 on qwen35-4b, H200), or
                              8192 where the session reads a layer matrix from its GGUF blocks
                              (no fp16 cache: each is dequantized once per chunk, so longer chunks
                              amortize it), capped at max_tokens and halved (down to 256) while the chunk's
                              scratch would take more than 1/4 of the device memory left free
                              after the KV caches and states (a model whose prewarm was partial:
                              more than all of it, less 768 MiB for the streaming scratch) */
    int32_t kv_dtype;      /* 0 = fp16 KV cache (default), 1 = fp32 */
    int32_t gemm_leg;      /* PF_GEMM_*; 0 = the model's. The exact f32 leg also runs the delta
                              rule token by token; the fast legs run it chunked
                              (PF_GDN_SCAN_CHUNKED) for chunks of >= 64 rows */
    int32_t attn_path;     /* 0 = auto (flash for an fp16 cache), 1 = cuBLAS, 2 = flash */
    int32_t cuda_graphs;   /* 1: a chunk length that comes back is captured as a CUDA graph
                              (every launch reads the position from device memory, flash
                              attention included: one graph per chunk; chunks on the cuBLAS
                              attention path are captured as segments with attention launched
                              between them) and replayed, for up to 8 graphs per session; results
                              are bitwise those of 0 (every kernel launched). Env PREFILL_GRAPH=0
                              forces 0. default 1 */
    pf_tuning tuning;      /* over the model's (see pf_tuning); resolved, with the options above,
                              the device and the environment, into the session's execution plan
                              once, here. default 0 */
    int32_t own_executor;  /* 1: the session gets its own chunk executor (scratch of chunk_tokens
                              rows, its graphs) for pf_session_prefill / _generate; 0: state only,
                              for sessions that run in a pf_batch (those two calls are then
                              UNSUPPORTED; chunk_tokens and cuda_graphs are unused). default 1 */
    int32_t snapshot_every; /* keep the recurrent state (conv windows and GDN states) every this
                               many positions during a prefill, on the device: a multiple of 64,
                               0 = never. The session's steps then end at those positions (the
                               64-row chunks of the delta rule stay whole). default 0 */
    int32_t snapshot_at_end; /* 1: also keep one at the end of every prefill call (and batch item).
                                default 0 */
    int32_t snapshot_slots; /* device slots for snapshots, allocated now (pf_session_snapshots
                               reports their bytes); when all are held the oldest is dropped.
                               default 0 (then snapshot_every and snapshot_at_end must be 0) */
    int32_t kv_paged;      /* 1: the KV rows in pages of the model's pool (pf_model_kv_pool, of this
                              kv_dtype), taken as positions reach them; max_tokens still bounds
                              the positions. Copies between a paged and a contiguous session are
                              UNSUPPORTED. default 0 (the session's own max_tokens rows) */
} pf_session_options;

typedef enum pf_logits_mode {
    PF_LOGITS_NONE = 0,    /* no logits (the greedy token may still be asked for) */
    PF_LOGITS_LAST = 1,    /* logits of the last token: [n_vocab] */
    PF_LOGITS_ALL = 2      /* logits of every token of the call: [n_tokens][n_vocab] */
} pf_logits_mode;

PF_API pf_status pf_session_options_init(pf_session_options *opts, size_t struct_size);
/* Sizes every state and scratch of the session now (a prefill then allocates nothing). On the f16
 * leg it also fixes the GEMM algorithm of each projection shape at rows = chunk_tokens: cuBLAS's
 * default (cublasGemmEx) or a cuBLASLt algorithm that beat it by > 3%, timed on the device by the
 * first session of the process that needs the shape (tens of ms, once; synchronizes) and reused,
 * never changed, by every later session of the process on that device, other models of the same
 * shapes included: logits stay bitwise equal between sessions and models of one process, and
 * graphs bitwise eager. Two processes may choose differently: their f16-leg logits then agree
 * within the leg's tolerance, not bitwise. Env PREFILL_GEMM_LT=0 or tuning.gemm_lt runs
 * cublasGemmEx everywhere; PREFILL_LOG=gemm prints each choice made to stderr (PREFILL_LOG=plan the
 * session's execution plan). The f32 leg is untouched. */
PF_API pf_status pf_session_create(pf_session **out, pf_model *model, const pf_session_options *opts);
PF_API void pf_session_destroy(pf_session *s);
/* Runs n_tokens tokens (any count, in internal chunks) from the session's position, which then
 * advances by n_tokens. logits: host float32 of logits_len floats (n_vocab or n_tokens*n_vocab
 * by mode; NULL with PF_LOGITS_NONE). out_token (may be NULL): the greedy next token after the
 * last one (the LM head runs for the last row in every mode, so that pf_session_generate can
 * continue; PF_LOGITS_ALL runs it for every row, 32 rows at a time, never [n_tokens][n_vocab] on
 * the device). Tokens past capacity or ids outside [0, n_vocab): INVALID_ARGUMENT and the
 * session is unchanged. A device fault mid-call leaves the session unusable until
 * pf_session_reset (or pf_session_restore). */
PF_API pf_status pf_session_prefill(pf_session *s, const int32_t *tokens, int32_t n_tokens,
                                    int32_t logits_mode, float *logits, size_t logits_len,
                                    int32_t *out_token);
/* Greedy decoding: feeds the session's last greedy token, n times; writes the n tokens. Needs a
 * prior prefill. */
PF_API pf_status pf_session_generate(pf_session *s, int32_t n, int32_t *out_tokens);
PF_API pf_status pf_session_position(const pf_session *s, int32_t *out);
PF_API pf_status pf_session_reset(pf_session *s);
/* State (position, KV rows, conv windows, recurrent states) as bytes: size, save, restore into
 * a session of the same model and KV dtype with enough capacity. A restore checks the whole
 * header (format, model, KV dtype, position within the capacity, shapes, the next greedy token)
 * and the exact byte count before the session changes: INVALID_ARGUMENT names the first
 * mismatch and the session is as it was. The payload itself is data (not checksummed). */
PF_API pf_status pf_session_state_size(const pf_session *s, size_t *out_bytes);
PF_API pf_status pf_session_save(pf_session *s, void *dst, size_t bytes);
PF_API pf_status pf_session_restore(pf_session *s, const void *src, size_t bytes);

/* Fork, on the device: dst takes src's state (KV rows [0, pos), conv windows, recurrent states,
 * position, greedy token) bit for bit, so that both continue as src would have. dst: a session
 * of the same model and KV dtype with capacity >= src's position; its own state (and its
 * snapshots) are replaced. src is unchanged; dst == src is INVALID_ARGUMENT. Synchronizes. */
PF_API pf_status pf_session_copy(pf_session *dst, const pf_session *src);
/* A prefix of src, on the device: dst takes src's state as it stood at position pos (KV rows
 * [0, pos); for a qwen35 model the recurrent state of src's snapshot at pos, or src's own when pos
 * is its position; the greedy token after pos where that snapshot has it), bit for bit, so that dst
 * continues as a session that ran src's first pos tokens in src's calls would. 0 <= pos <= src's
 * position (INVALID_ARGUMENT otherwise); a qwen35 src needs a snapshot at pos unless pos is 0 or
 * its position: UNSUPPORTED naming the nearest held ones, dst unchanged. dst: a session of the
 * same model and KV dtype with capacity >= pos; its state and snapshots are replaced; src is
 * unchanged; dst == src is INVALID_ARGUMENT. What a prefix cache attaches. Synchronizes. */
PF_API pf_status pf_session_copy_prefix(pf_session *dst, const pf_session *src, int32_t pos);
/* A new session with src's options, holding src's state (pf_session_copy). */
PF_API pf_status pf_session_fork(pf_session **out, const pf_session *src);

/* Snapshots (pf_session_options.snapshot_*): the positions held, ascending, into
 * positions[0 .. min(count, capacity)) (positions may be NULL when capacity is 0), their number in
 * *count, the device bytes of one snapshot in *bytes_each (slots x bytes_each were allocated at
 * creation). Any out pointer may be NULL. */
PF_API pf_status pf_session_snapshots(const pf_session *s, int32_t *positions, int32_t capacity,
                                      int32_t *count, size_t *bytes_each);
/* Returns the session to position pos (0 <= pos <= its position), exactly as if only its first
 * pos tokens had been prefilled: KV rows past pos are dropped (a model without recurrent layers
 * can go to any pos), and a qwen35 model's recurrent state is restored from the snapshot at pos
 * (pos 0: the zero state; pos = the position: nothing changes). No snapshot at pos:
 * UNSUPPORTED naming the nearest held ones, the session unchanged. Snapshots past pos are
 * dropped. The greedy token after pos is kept where the snapshot has it (one taken at the end
 * of a call), else unknown (pf_session_generate then needs a prefill first). */
PF_API pf_status pf_session_rollback(pf_session *s, int32_t pos);

/* ---- batches: many sequences at once (model level) ----
 * A batch runs the tokens of many sessions of one model together: the projections, norms and FFN
 * run once over the rows of all its items; what reads or writes a sequence's state (its conv
 * window, its delta rule, its KV cache and attention) runs per item, on that session's state, in
 * place. Items are ragged: any lengths, sessions at any positions (a fresh prompt, a continuing
 * one, a decode step of one token), in one batch. The batch owns a chunk executor (scratch of
 * step_tokens rows, its CUDA graphs and GEMM plan); an item longer than what a step has left is
 * cut into steps, its rows in order. pf_batch_plan does all host work (validation of every item
 * before any device work, rows, positions, steps); pf_batch_run launches the plan, writes each
 * item's outputs and advances its session; pf_batch_prefill does both. A step whose shape
 * (sessions and rows) comes back is replayed as CUDA graphs (a decode loop over the same
 * sessions, a bucketed shape). An item gives the logits and greedy token its session would give
 * if run alone (within the leg's tolerance: the GEMMs see other rows beside it, not other bits). */
typedef struct pf_batch pf_batch;

typedef struct pf_batch_options {
    size_t struct_size;     /* set by pf_batch_options_init; do not change */
    int32_t max_items;      /* items per plan, 1..4096. default 64 */
    int32_t step_tokens;    /* rows per step (the executor's scratch). default 0 = 2048 */
    int32_t max_tokens;     /* tokens per plan, all items together. default 0 = 8 x step_tokens */
    int32_t max_context;    /* the largest capacity (positions) of a session in the batch, for the
                               cuBLAS attention path's workspace. default 0 = 4096 */
    int32_t kv_dtype;       /* pf_kv_dtype of the sessions (items must match). default fp16 */
    int32_t gemm_leg;       /* PF_GEMM_*; 0 = the model's */
    int32_t attn_path;      /* pf_attn_path. default 0 = auto */
    int32_t cuda_graphs;    /* 1: step shapes that come back replay as CUDA graphs (env
                               PREFILL_GRAPH=0 forces 0). default 1 */
    pf_tuning tuning;       /* over the model's. default 0 */
} pf_batch_options;

typedef struct pf_batch_item {
    pf_session *session;    /* the sequence this item continues (a session of the batch's model);
                               one item per session */
    const int32_t *tokens;  /* host [n_tokens], ids in [0, n_vocab); read at pf_batch_plan */
    int32_t n_tokens;       /* >= 1 */
    int32_t logits_mode;    /* pf_logits_mode */
    float *logits;          /* host: n_vocab floats (LAST) or n_tokens * n_vocab (ALL); NULL with
                               NONE. Written by pf_batch_run: must stay valid until then */
    size_t logits_len;      /* floats at logits */
    int32_t *out_token;     /* host, NULL = not wanted: the greedy token after the item's last one */
} pf_batch_item;

PF_API pf_status pf_batch_options_init(pf_batch_options *opts, size_t struct_size);
/* Sizes and allocates the batch's executor now (a run allocates nothing). opts NULL = defaults. */
PF_API pf_status pf_batch_create(pf_batch **out, pf_model *model, const pf_batch_options *opts);
PF_API void pf_batch_destroy(pf_batch *b);
/* Checks every item (the session: non-NULL, of this model, of the batch's KV dtype, not broken,
 * not in another item, capacity for its tokens; the tokens; the logits mode and buffers) before
 * any device work, and plans the steps; INVALID_ARGUMENT naming the item and the field, nothing
 * changed. Replaces an earlier plan that did not run. */
PF_API pf_status pf_batch_plan(pf_batch *b, const pf_batch_item *items, int32_t n_items);
/* Runs the planned batch (INVALID_ARGUMENT without one; a plan runs once): every item's outputs
 * written, every session advanced by its tokens. A device fault leaves the batch's sessions
 * unusable until reset or restored, like pf_session_prefill. */
PF_API pf_status pf_batch_run(pf_batch *b);
PF_API pf_status pf_batch_prefill(pf_batch *b, const pf_batch_item *items, int32_t n_items);

/* ---- the prefix cache: every computed prompt prefix reused (issue 39) ----
 * One per model, over its KV pool (pf_model_kv_pool first): a radix tree over token ids whose
 * nodes hold KV pages of the pool (shared by reference with the sessions that attach them) and,
 * for a qwen35 model, snapshots of the recurrent state (conv windows + GDN states) in slots of the
 * cache's own: at the end of every cached prompt and at the multiples of snapshot_every that keep
 * a prompt's snapshots at most snapshot_every apart (a multiple is skipped where the snapshots on
 * either side of it are that close), so that a prompt that diverges anywhere re-runs at most about
 * snapshot_every tokens. pf_prefix_cache_prefill
 * puts a prompt into a session through the cache: the pages below the deepest snapshot at or
 * below the longest cached prefix (R) are shared, the recurrent state is restored from it, and
 * the tokens from R on run in the session (steps ending at the snapshot positions),
 * then the prompt's new positions and snapshots go into the tree. Tokens re-run below the point
 * where the prompt leaves the tree are the session's own rows: the tree keeps the session's
 * versions of those pages in its new branch and none of its states at or below that point, so
 * that every prefix's pages and snapshot are of one chain of calls (plan/prefix_tree.h's re-run
 * rule). After each call the cache's device bytes (pages it
 * holds, a page a session shares included, and snapshots) are brought within device_bytes, least
 * recently used first, into the host tier (pinned memory; a later hit copies them back) when there
 * is one and it has room, else dropped. The host tier's copies run on a stream of the cache's own:
 * an eviction's copies overlap the next work on the context's stream, and the pages they read
 * return to the model's pool at the cache's next call (or its clear) after they are done. A run that finds the pool short drops cached pages and
 * runs again. Calls on one cache are serialized (a mutex); sessions and other caches of the model
 * may run on other threads. Destroy the cache before its model. */
typedef struct pf_prefix_cache pf_prefix_cache;

typedef struct pf_prefix_cache_options {
    size_t struct_size;       /* set by pf_prefix_cache_options_init; do not change */
    int32_t snapshot_every;   /* qwen35: snapshots at most this many positions apart (at its
                                 multiples and prompts' ends), a positive multiple of 64; must be 0 for a model without recurrent layers. -1 (the
                                 _init value) = the model's default: 1024 for qwen35, else 0 */
    int32_t snapshot_slots;   /* device slots for the snapshots, allocated now (pf_session_snapshots'
                                 bytes each); when all are held a prefill evicts for one or skips
                                 that snapshot (stats). -1 = the default: 64 for qwen35, else 0 */
    int64_t device_bytes;     /* the device bytes the cache may hold after each call (pages at the
                                 pool's page bytes, snapshots), at least one page and one snapshot.
                                 default 0 = half the pool's bytes plus half the slots' */
    int64_t host_bytes;       /* the host tier: at most this many bytes of pages and snapshots in
                                 pinned host memory (pinned now: this for the pages and, for qwen35,
                                 this again for the snapshots); 0 = none (default) */
} pf_prefix_cache_options;

typedef struct pf_prefix_cache_stats {
    size_t struct_size;           /* set by pf_prefix_cache_stats_get */
    int64_t requests;             /* prefills through the cache */
    int64_t prompt_tokens;        /* their tokens */
    int64_t matched_tokens;       /* positions found in the tree (their KV pages shared) */
    int64_t served_tokens;        /* positions not computed again (the resume points R) */
    int64_t rerun_tokens;         /* matched positions run again for the recurrent state */
    int64_t prefilled_tokens;     /* positions the sessions ran (prompt_tokens - served_tokens) */
    int64_t nodes;                /* the tree's nodes */
    int64_t device_pages, device_snapshots, device_bytes;
    int64_t host_pages, host_snapshots, host_bytes;
    int64_t evicted_pages, evicted_snapshots;      /* dropped, from either tier */
    int64_t offloaded_pages, offloaded_snapshots;  /* moved to the host tier */
    int64_t restored_pages, restored_snapshots;    /* moved back to the device */
    int64_t snapshots_skipped;    /* snapshots not kept: every slot held and none could be freed */
    int64_t pinned_bytes;         /* the host tier's pinned memory */
} pf_prefix_cache_stats;

PF_API pf_status pf_prefix_cache_options_init(pf_prefix_cache_options *opts, size_t struct_size);
/* A cache of model's prompts (opts NULL: the defaults). INVALID_ARGUMENT when the model has no KV
 * pool or an option is out of range (named); OUT_OF_MEMORY when the slots or the pinned tier do
 * not fit. */
PF_API pf_status pf_prefix_cache_create(pf_prefix_cache **out, pf_model *model, const pf_prefix_cache_options *opts);
PF_API void pf_prefix_cache_destroy(pf_prefix_cache *c);
/* Prefills tokens[0, n_tokens) into s from position 0 through the cache: s ends at position
 * n_tokens as after pf_session_reset and pf_session_prefill of the same tokens (its snapshots
 * dropped), with the last token's logits (PF_LOGITS_LAST or NONE) and the greedy token after it,
 * bitwise those of a cold session with the same options that ran the same calls: those that
 * computed the resumed prefix [0, R), then the rest in calls ending at the positions where the
 * cache took snapshots (its steps end there; an uncut call of the rest where it took none but the
 * end). s: a paged session
 * (kv_paged = 1) of this model with its own executor, holding n_tokens positions. Bad arguments
 * (another model's session, a contiguous one, tokens outside the vocabulary, ...): INVALID_ARGUMENT
 * naming them, nothing changed. Any other failure leaves s reset (position 0) and the cache as it
 * was before the call, less what it evicted. */
PF_API pf_status pf_prefix_cache_prefill(pf_prefix_cache *c, pf_session *s, const int32_t *tokens,
                                         int32_t n_tokens, int32_t logits_mode, float *logits,
                                         size_t logits_len, int32_t *out_token);
/* pf_prefix_cache_prefill for many prompts at once, on b's executor (a batch of the cache's model
 * made after its KV pool, of the sessions' KV dtype): items[i].session (paged, distinct, capacity
 * at most b's max_context) takes items[i].tokens from position 0 (logits_mode NONE or LAST); the
 * items' calls run together, each request's its own as in pf_prefix_cache_prefill. A prefix that
 * two prompts share 64 or more tokens beyond what the cache holds is served first, once, as a
 * request of its own (in one of their sessions; it counts in the statistics), and every prompt
 * then resumes from it. Every item is checked before anything runs: INVALID_ARGUMENT naming it.
 * The items' outputs are those of pf_prefix_cache_prefill on the same history within the leg's
 * tolerance (a batch's steps hold other rows). */
PF_API pf_status pf_prefix_cache_prefill_batch(pf_prefix_cache *c, pf_batch *b, const pf_batch_item *items,
                                               int32_t n_items);
/* Evicts (as after a call) until the cache's device bytes are at most target_bytes (>= 0):
 * into the host tier where it has room. */
PF_API pf_status pf_prefix_cache_evict(pf_prefix_cache *c, int64_t target_bytes);
/* Drops every cached prefix (the statistics' counts stay). */
PF_API pf_status pf_prefix_cache_clear(pf_prefix_cache *c);
PF_API pf_status pf_prefix_cache_stats_get(pf_prefix_cache *c, pf_prefix_cache_stats *out, size_t struct_size);

/* PF_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* PREFILL_H */
