/* Built against an installed libprefill (find_package(prefill)): reports the version and
 * devices, and on a GPU round-trips a buffer and runs one kernel-level op through views.
 * Exit 0 when everything it could check worked. */
#include <math.h>
#include <prefill.h>
#include <stdio.h>

/* y = rms_norm(x) * w for 2 rows of 4 floats, y written at column 1 of 6-wide rows. */
static int rms_norm_through_views(pf_context *ctx) {
    float x[8] = {1, 2, 3, 4, -1, 0, 1, 2}, w[4] = {1, 1, 1, 1}, y[12] = {0};
    pf_buffer *bx = NULL, *bw = NULL, *by = NULL;
    int ok = pf_buffer_create(&bx, ctx, sizeof x) == PF_STATUS_OK &&
             pf_buffer_create(&bw, ctx, sizeof w) == PF_STATUS_OK &&
             pf_buffer_create(&by, ctx, sizeof y) == PF_STATUS_OK &&
             pf_buffer_upload(bx, 0, x, sizeof x) == PF_STATUS_OK &&
             pf_buffer_upload(bw, 0, w, sizeof w) == PF_STATUS_OK &&
             pf_buffer_fill(by, 0, 0, sizeof y) == PF_STATUS_OK;
    if (ok) {
        const pf_view vx = {bx, 0, 0}, vw = {bw, 0, 0}, vy = {by, 1, 6}; /* ld 0: 4 floats */
        ok = pf_rms_norm(ctx, &vx, &vw, &vy, 2, 4, 1e-6f) == PF_STATUS_OK &&
             pf_buffer_download(by, 0, y, sizeof y) == PF_STATUS_OK;
    }
    if (ok) {
        const float inv = 1.0f / sqrtf((1 + 4 + 9 + 16) / 4.0f + 1e-6f);
        ok = y[0] == 0.0f && fabsf(y[1] - inv) < 1e-6f && fabsf(y[4] - 4 * inv) < 1e-5f &&
             y[5] == 0.0f && y[6] == 0.0f;
    }
    pf_buffer_destroy(bx);
    pf_buffer_destroy(bw);
    pf_buffer_destroy(by);
    if (!ok) fprintf(stderr, "consumer: rms_norm: %s\n", pf_last_error());
    return ok;
}

int main(void) {
    int32_t n = 0;
    if (pf_device_count(&n) != PF_STATUS_OK) return 1;
    printf("consumer: libprefill %u, %d device(s)\n", (unsigned)pf_version(), (int)n);
    pf_context *ctx = NULL;
    pf_status s = pf_context_create(&ctx, NULL);
    if (n == 0) {
        /* kernel-level arguments are checked without a device; ctx NULL is reported last */
        const pf_view v = {NULL, 0, 0};
        printf("consumer: no device: %s (%s)\n", pf_status_name(s), pf_last_error());
        const pf_status a = pf_rms_norm(NULL, &v, &v, &v, -1, 4, 1e-6f);
        printf("consumer: argument check: %s (%s)\n", pf_status_name(a), pf_last_error());
        return s == PF_STATUS_NO_DEVICE && a == PF_STATUS_INVALID_ARGUMENT ? 0 : 1;
    }
    if (s != PF_STATUS_OK) return 1;
    float x[5] = {1, 2, 3, 4, 5}, y[5] = {0};
    pf_buffer *b = NULL;
    int ok = pf_buffer_create(&b, ctx, sizeof x) == PF_STATUS_OK &&
             pf_buffer_upload(b, 0, x, sizeof x) == PF_STATUS_OK &&
             pf_buffer_download(b, 0, y, sizeof y) == PF_STATUS_OK && y[4] == 5.0f;
    pf_buffer_destroy(b);
    printf("consumer: buffer round trip %s\n", ok ? "ok" : "FAILED");
    const int ok_norm = rms_norm_through_views(ctx);
    printf("consumer: rms_norm through views %s\n", ok_norm ? "ok" : "FAILED");
    pf_context_destroy(ctx);
    return ok && ok_norm ? 0 : 1;
}
