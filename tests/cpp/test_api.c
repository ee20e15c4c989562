/* Argument checks of the core C API, and the no-device path. Runs with or without a GPU:
 * without one, pf_context_create must return PF_STATUS_NO_DEVICE with a message. */
#include "prefill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures = 0;

#define EXPECT_STATUS(call, want, needle)                                                    \
    do {                                                                                     \
        const pf_status got_ = (call);                                                       \
        if (got_ != (want)) {                                                                \
            fprintf(stderr, "FAIL %s:%d %s -> %s, want %s (%s)\n", __FILE__, __LINE__, #call, \
                    pf_status_name(got_), pf_status_name(want), pf_last_error());            \
            failures++;                                                                      \
        } else if ((needle) && !strstr(pf_last_error(), (needle))) {                         \
            fprintf(stderr, "FAIL %s:%d %s: message \"%s\" lacks \"%s\"\n", __FILE__,          \
                    __LINE__, #call, pf_last_error(), (const char *)(needle));               \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

/* Writes `n` bytes of `bytes` to dir/name, expects pf_model_inspect to refuse it with `want` and
 * a message holding `needle`, and removes the file. */
static void expect_file(const char *dir, const char *name, const char *bytes, size_t n,
                        pf_status want, const char *needle) {
    char path[512];
    pf_model_info mi;
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n) { fprintf(stderr, "FAIL cannot write %s\n", path); failures++; }
    if (f) fclose(f);
    EXPECT_STATUS(pf_model_inspect(path, &mi), want, needle);
    unlink(path);
}

int main(void) {
    size_t bytes = 0;
    int32_t n_dev = -1;
    pf_context *ctx = NULL;
    pf_weight *w = NULL;
    pf_buffer *buf = NULL;
    unsigned char data[1024];
    pf_context_options o;
    memset(data, 0, sizeof data);

    /* statuses and strings */
    for (int s = 0; s < PF_STATUS_COUNT; s++)
        if (!pf_status_name((pf_status)s) || !pf_status_string((pf_status)s)[0]) failures++;
    if (strcmp(pf_status_name((pf_status)99), "PF_STATUS_UNKNOWN") != 0) failures++;

    /* null out-pointers */
    EXPECT_STATUS(pf_device_count(NULL), PF_STATUS_INVALID_ARGUMENT, "out is NULL");
    EXPECT_STATUS(pf_context_create(NULL, NULL), PF_STATUS_INVALID_ARGUMENT, "out is NULL");
    EXPECT_STATUS(pf_buffer_create(NULL, NULL, 16), PF_STATUS_INVALID_ARGUMENT, "out is NULL");
    EXPECT_STATUS(pf_buffer_create(&buf, NULL, 16), PF_STATUS_INVALID_ARGUMENT, "ctx is NULL");
    EXPECT_STATUS(pf_weight_info_get(NULL, NULL), PF_STATUS_INVALID_ARGUMENT, "w is NULL");
    EXPECT_STATUS(pf_qtype_matrix_bytes(PF_QTYPE_Q4_K, 4, 256, NULL), PF_STATUS_INVALID_ARGUMENT,
                  "out_bytes is NULL");

    /* sizes and qtypes */
    EXPECT_STATUS(pf_qtype_matrix_bytes(PF_QTYPE_Q4_K, 4, 256, &bytes), PF_STATUS_OK, NULL);
    if (bytes != 4 * 144) { fprintf(stderr, "FAIL Q4_K bytes %zu\n", bytes); failures++; }
    EXPECT_STATUS(pf_qtype_matrix_bytes(PF_QTYPE_Q8_0, -1, 32, &bytes), PF_STATUS_INVALID_ARGUMENT,
                  "must be positive");
    EXPECT_STATUS(pf_qtype_matrix_bytes(PF_QTYPE_Q4_K, 4, 100, &bytes), PF_STATUS_INVALID_ARGUMENT,
                  "not a multiple");
    EXPECT_STATUS(pf_qtype_matrix_bytes(10 /* Q2_K */, 4, 256, &bytes), PF_STATUS_UNSUPPORTED,
                  "GGML type 10");
    EXPECT_STATUS(pf_qtype_matrix_bytes(PF_QTYPE_F32, (int64_t)1 << 62, (int64_t)1 << 62, &bytes),
                  PF_STATUS_INVALID_ARGUMENT, "overflows");
    EXPECT_STATUS(pf_weight_create(&w, NULL, PF_QTYPE_Q8_0, 2, 32, data, 67),
                  PF_STATUS_INVALID_ARGUMENT, "needs 68");
    EXPECT_STATUS(pf_weight_create(&w, NULL, 77, 2, 32, data, 68), PF_STATUS_UNSUPPORTED,
                  "GGML type 77");
    if (w != NULL) { fprintf(stderr, "FAIL weight out not NULL after failure\n"); failures++; }

    /* options struct size (ABI) */
    EXPECT_STATUS(pf_context_options_init(&o, sizeof o - 4), PF_STATUS_ABI_MISMATCH, "struct_size");
    EXPECT_STATUS(pf_context_options_init(&o, sizeof o), PF_STATUS_OK, NULL);
    o.flags = 2;  /* only PF_CONTEXT_POISON (1) is defined */
    EXPECT_STATUS(pf_context_create(&ctx, &o), PF_STATUS_INVALID_ARGUMENT, "flags");

    /* model and session level: NULL handles and pointers, before any device work */
    {
        pf_model *m = NULL;
        pf_session *ss = NULL;
        pf_model_info mi;
        int32_t pos = 0, tok = 0, one = 1;
        size_t sz = 0;
        EXPECT_STATUS(pf_model_load(NULL, NULL, "x.gguf", NULL), PF_STATUS_INVALID_ARGUMENT, "out is NULL");
        EXPECT_STATUS(pf_model_load(&m, NULL, NULL, NULL), PF_STATUS_INVALID_ARGUMENT, "path is NULL");
        EXPECT_STATUS(pf_model_load(&m, NULL, "x.gguf", NULL), PF_STATUS_INVALID_ARGUMENT, "ctx is NULL");
        EXPECT_STATUS(pf_model_inspect("/nonexistent.gguf", &mi), PF_STATUS_IO_ERROR, "cannot open");
        EXPECT_STATUS(pf_model_inspect(NULL, &mi), PF_STATUS_INVALID_ARGUMENT, "path is NULL");
        EXPECT_STATUS(pf_model_info_get(NULL, &mi), PF_STATUS_INVALID_ARGUMENT, "model is NULL");
        EXPECT_STATUS(pf_session_create(&ss, NULL, NULL), PF_STATUS_INVALID_ARGUMENT, "model is NULL");
        EXPECT_STATUS(pf_session_prefill(NULL, &one, 1, PF_LOGITS_NONE, NULL, 0, &tok),
                      PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        EXPECT_STATUS(pf_session_generate(NULL, 1, &tok), PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        EXPECT_STATUS(pf_session_position(NULL, &pos), PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        EXPECT_STATUS(pf_session_state_size(NULL, &sz), PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        EXPECT_STATUS(pf_session_save(NULL, NULL, 0), PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        EXPECT_STATUS(pf_session_restore(NULL, NULL, 0), PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        EXPECT_STATUS(pf_session_reset(NULL), PF_STATUS_INVALID_ARGUMENT, "session is NULL");
        if (m != NULL || ss != NULL) { fprintf(stderr, "FAIL out handles not NULL after failure\n"); failures++; }
        pf_session_destroy(NULL);
        pf_model_destroy(NULL);
    }

    /* GGUF files (0.6): IO_ERROR for a file that cannot be read, refused before it is opened when
     * it is not a regular file (a FIFO would block the open); FORMAT_ERROR for its contents */
    {
        char dir[] = "/tmp/pf_test_api_XXXXXX";
        char fifo[600];
        pf_model_info mi;
        if (!mkdtemp(dir)) { fprintf(stderr, "FAIL mkdtemp\n"); failures++; return 1; }
        EXPECT_STATUS(pf_model_inspect(dir, &mi), PF_STATUS_IO_ERROR, "not a regular file (a directory)");
        snprintf(fifo, sizeof fifo, "%s/fifo.gguf", dir);
        if (mkfifo(fifo, 0600) != 0) { fprintf(stderr, "FAIL mkfifo\n"); failures++; }
        EXPECT_STATUS(pf_model_inspect(fifo, &mi), PF_STATUS_IO_ERROR, "not a regular file (a FIFO)");
        unlink(fifo);
        expect_file(dir, "empty.gguf", "", 0, PF_STATUS_FORMAT_ERROR, "empty file (0 bytes): not a GGUF");
        expect_file(dir, "notes.txt", "just some text here", 19, PF_STATUS_FORMAT_ERROR,
                    "not a GGUF file (bad magic \"just\", expected \"GGUF\")");
        expect_file(dir, "elf.so", "\177ELF", 4, PF_STATUS_FORMAT_ERROR, "bad magic \"\\x7fELF\"");
        expect_file(dir, "short.gguf", "GG", 2, PF_STATUS_FORMAT_ERROR, "truncated GGUF (2 bytes");
        expect_file(dir, "header.gguf", "GGUF\3\0\0\0", 8, PF_STATUS_FORMAT_ERROR,
                    "truncated GGUF (8 bytes, the header alone is 24)");
        if (rmdir(dir) != 0) { fprintf(stderr, "FAIL %s left behind\n", dir); failures++; }
    }

    /* kernel level (0.2): views, argument structs, and the checking order (scalars and shapes,
     * NULL views and buffers, ctx), all before any device work */
    {
        pf_view v0 = {NULL, 0, 0}, bad_off = {NULL, -3, 0}, narrow = {NULL, 0, 4};
        pf_gdn_scan_args sa;
        pf_gdn_scan_varlen_args va;
        int64_t cu[3] = {0, 2, 2};
        pf_gdn_gates_args ga;
        pf_gdn_gated_rms_norm_args na;
        pf_rope_neox_args ra;
        pf_kv_write_args ka;
        int32_t ids[2] = {0, 1};
        EXPECT_STATUS(pf_rms_norm(NULL, &v0, &v0, &v0, -1, 8, 1e-6f), PF_STATUS_INVALID_ARGUMENT, "rows=-1");
        EXPECT_STATUS(pf_rms_norm(NULL, NULL, &v0, &v0, 1, 8, 1e-6f), PF_STATUS_INVALID_ARGUMENT,
                      "view x is NULL");
        EXPECT_STATUS(pf_rms_norm(NULL, &bad_off, &v0, &v0, 1, 8, 1e-6f), PF_STATUS_INVALID_ARGUMENT,
                      "x offset=-3");
        EXPECT_STATUS(pf_rms_norm(NULL, &narrow, &v0, &v0, 1, 8, 1e-6f), PF_STATUS_INVALID_ARGUMENT,
                      "x row stride ld=4");
        EXPECT_STATUS(pf_rms_norm(NULL, &v0, &v0, &v0, 1, 8, 1e-6f), PF_STATUS_INVALID_ARGUMENT, "x is NULL");
        EXPECT_STATUS(pf_head_rms_norm(NULL, &v0, &v0, 1, 2, 128, 64, 1e-6f), PF_STATUS_INVALID_ARGUMENT,
                      "head_stride=64");
        EXPECT_STATUS(pf_add(NULL, &v0, &v0, 0, 8), PF_STATUS_INVALID_ARGUMENT, "y is NULL");
        EXPECT_STATUS(pf_project(NULL, NULL, &v0, &v0, 1, 0, 9), PF_STATUS_INVALID_ARGUMENT, "leg=9");
        EXPECT_STATUS(pf_project(NULL, NULL, &v0, &v0, 1, 0, 0), PF_STATUS_INVALID_ARGUMENT, "w is NULL");
        EXPECT_STATUS(pf_qgemv(NULL, NULL, &v0, &v0, 2), PF_STATUS_INVALID_ARGUMENT, "accumulate=2");
        EXPECT_STATUS(pf_dequantize(NULL, NULL, &v0, 0), PF_STATUS_INVALID_ARGUMENT, "w is NULL");
        EXPECT_STATUS(pf_embed(NULL, NULL, ids, 2, &v0), PF_STATUS_INVALID_ARGUMENT, "table is NULL");
        EXPECT_STATUS(pf_argmax(NULL, &v0, &v0, 1, 0), PF_STATUS_INVALID_ARGUMENT, "n=0");
        EXPECT_STATUS(pf_argmax(NULL, &v0, &v0, 1, 10), PF_STATUS_INVALID_ARGUMENT, "x is NULL");

        /* argument structs: NULL, ABI, defaults, then the op's own checks */
        EXPECT_STATUS(pf_gdn_scan(NULL, NULL), PF_STATUS_INVALID_ARGUMENT, "pf_gdn_scan_args_init");
        EXPECT_STATUS(pf_gdn_scan_args_init(&sa, sizeof sa - 8), PF_STATUS_ABI_MISMATCH, "struct_size");
        EXPECT_STATUS(pf_gdn_scan_args_init(&sa, sizeof sa), PF_STATUS_OK, NULL);
        if (sa.struct_size != sizeof sa || sa.path != PF_GDN_SCAN_AUTO || sa.rows != 0 || sa.q.buf != NULL) {
            fprintf(stderr, "FAIL pf_gdn_scan_args_init defaults\n");
            failures++;
        }
        sa.n_k_heads = 2; sa.n_v_heads = 4; sa.dk = 32; sa.dv = 32; sa.rows = 3;
        EXPECT_STATUS(pf_gdn_scan(NULL, &sa), PF_STATUS_INVALID_ARGUMENT, "q is NULL");
        sa.path = PF_GDN_SCAN_CHUNKED;
        EXPECT_STATUS(pf_gdn_scan(NULL, &sa), PF_STATUS_UNSUPPORTED, "built for dk = dv = 128");
        sa.path = 3;
        EXPECT_STATUS(pf_gdn_scan(NULL, &sa), PF_STATUS_INVALID_ARGUMENT, "path=3");
        sa.path = PF_GDN_SCAN_SEQUENTIAL; sa.dv = 48;
        EXPECT_STATUS(pf_gdn_scan(NULL, &sa), PF_STATUS_INVALID_ARGUMENT, "dv=48");
        sa.struct_size = 8;
        EXPECT_STATUS(pf_gdn_scan(NULL, &sa), PF_STATUS_ABI_MISMATCH, "pf_gdn_scan_args_init");
        EXPECT_STATUS(pf_gdn_scan_varlen(NULL, NULL), PF_STATUS_INVALID_ARGUMENT, "pf_gdn_scan_varlen_args_init");
        EXPECT_STATUS(pf_gdn_scan_varlen_args_init(&va, sizeof va), PF_STATUS_OK, NULL);
        if (va.path != PF_GDN_SCAN_AUTO || va.cu_seqlens != NULL || va.state_indices != NULL || va.n_seqs != 0) {
            fprintf(stderr, "FAIL pf_gdn_scan_varlen_args_init defaults\n");
            failures++;
        }
        va.n_seqs = 2; va.n_states = 2; va.n_k_heads = 2; va.n_v_heads = 4; va.dk = 32; va.dv = 32;
        va.cu_seqlens = cu;
        EXPECT_STATUS(pf_gdn_scan_varlen(NULL, &va), PF_STATUS_INVALID_ARGUMENT, "sequence 1 has cu_seqlens[2] = 2");
        cu[2] = 7;
        EXPECT_STATUS(pf_gdn_scan_varlen(NULL, &va), PF_STATUS_INVALID_ARGUMENT, "q is NULL");
        va.path = PF_GDN_SCAN_CHUNKED;
        EXPECT_STATUS(pf_gdn_scan_varlen(NULL, &va), PF_STATUS_UNSUPPORTED, "built for dk = dv = 128");
        EXPECT_STATUS(pf_gdn_gates_args_init(&ga, sizeof ga), PF_STATUS_OK, NULL);
        EXPECT_STATUS(pf_gdn_gates(NULL, &ga), PF_STATUS_INVALID_ARGUMENT, "n_v_heads=0");
        EXPECT_STATUS(pf_gdn_gated_rms_norm_args_init(&na, sizeof na), PF_STATUS_OK, NULL);
        if (na.eps != 1e-6f) { fprintf(stderr, "FAIL gated_rms_norm eps default %g\n", (double)na.eps); failures++; }
        na.n_v_heads = 4; na.dv = 16;
        EXPECT_STATUS(pf_gdn_gated_rms_norm(NULL, &na), PF_STATUS_INVALID_ARGUMENT, "o is NULL");
        EXPECT_STATUS(pf_rope_neox_args_init(&ra, sizeof ra), PF_STATUS_OK, NULL);
        ra.n_heads = 2; ra.head_dim = 64; ra.rot_dim = 64;
        EXPECT_STATUS(pf_rope_neox(NULL, &ra), PF_STATUS_INVALID_ARGUMENT, "base=0");
        ra.base = 1e6f;
        EXPECT_STATUS(pf_rope_neox(NULL, &ra), PF_STATUS_INVALID_ARGUMENT, "x is NULL");
        EXPECT_STATUS(pf_kv_write_args_init(&ka, sizeof ka), PF_STATUS_OK, NULL);
        if (ka.kv_dtype != PF_KV_F16) { fprintf(stderr, "FAIL kv_write kv_dtype default\n"); failures++; }
        EXPECT_STATUS(pf_kv_write(NULL, &ka), PF_STATUS_INVALID_ARGUMENT, "kv_dim=0");
        ka.kv_dim = 256; ka.rows = 2;
        EXPECT_STATUS(pf_kv_write(NULL, &ka), PF_STATUS_INVALID_ARGUMENT, "k is NULL");
    }

    /* the prefix cache's entries: their checks before any device work */
    {
        pf_prefix_cache_options po;
        pf_prefix_cache_stats ps;
        pf_prefix_cache *pc = NULL;
        int32_t tok = 0;
        EXPECT_STATUS(pf_prefix_cache_options_init(&po, sizeof po - 8), PF_STATUS_ABI_MISMATCH, "struct_size");
        EXPECT_STATUS(pf_prefix_cache_options_init(&po, sizeof po), PF_STATUS_OK, NULL);
        if (po.snapshot_every != -1 || po.snapshot_slots != -1 || po.device_bytes != 0 || po.host_bytes != 0)
            failures++, fprintf(stderr, "FAIL pf_prefix_cache_options_init: defaults\n");
        EXPECT_STATUS(pf_prefix_cache_create(NULL, NULL, &po), PF_STATUS_INVALID_ARGUMENT, "out is NULL");
        EXPECT_STATUS(pf_prefix_cache_create(&pc, NULL, &po), PF_STATUS_INVALID_ARGUMENT, "model is NULL");
        if (pc != NULL) failures++;
        EXPECT_STATUS(pf_prefix_cache_prefill(NULL, NULL, &tok, 1, PF_LOGITS_NONE, NULL, 0, NULL),
                      PF_STATUS_INVALID_ARGUMENT, "cache is NULL");
        EXPECT_STATUS(pf_prefix_cache_prefill_batch(NULL, NULL, NULL, 0), PF_STATUS_INVALID_ARGUMENT,
                      "cache is NULL");
        EXPECT_STATUS(pf_prefix_cache_evict(NULL, 0), PF_STATUS_INVALID_ARGUMENT, "cache is NULL");
        EXPECT_STATUS(pf_prefix_cache_clear(NULL), PF_STATUS_INVALID_ARGUMENT, "cache is NULL");
        EXPECT_STATUS(pf_prefix_cache_stats_get(NULL, &ps, sizeof ps), PF_STATUS_INVALID_ARGUMENT, "cache is NULL");
        pf_prefix_cache_destroy(NULL); /* a no-op */
    }

    /* devices */
    EXPECT_STATUS(pf_device_count(&n_dev), PF_STATUS_OK, NULL);
    if (n_dev == 0) {
        EXPECT_STATUS(pf_context_create(&ctx, NULL), PF_STATUS_NO_DEVICE, "no CUDA device");
        if (ctx != NULL) failures++;
    } else {
        o.flags = 0;
        o.device = n_dev; /* one past the last */
        EXPECT_STATUS(pf_context_create(&ctx, &o), PF_STATUS_NO_DEVICE, "does not exist");
        EXPECT_STATUS(pf_context_create(&ctx, NULL), PF_STATUS_OK, NULL);
        EXPECT_STATUS(pf_weight_create(&w, ctx, PF_QTYPE_Q8_0, 2, 32, data, 68), PF_STATUS_OK, NULL);
        EXPECT_STATUS(pf_buffer_create(&buf, ctx, 64), PF_STATUS_OK, NULL);
        EXPECT_STATUS(pf_buffer_upload(buf, 60, data, 8), PF_STATUS_INVALID_ARGUMENT, "outside");
        EXPECT_STATUS(pf_buffer_download(buf, 0, data, 64), PF_STATUS_OK, NULL);
        pf_buffer_destroy(buf);
        pf_weight_destroy(w);
        pf_context_destroy(ctx);
    }
    pf_context_destroy(NULL); /* no-ops */
    pf_buffer_destroy(NULL);
    pf_weight_destroy(NULL);

    printf("test_api: %d device(s), %d failure(s)\n", (int)n_dev, failures);
    return failures ? 1 : 0;
}
