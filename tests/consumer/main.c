/* Built against an installed libprefill (find_package(prefill)): reports the version and
 * devices, and on a GPU round-trips a buffer. Exit 0 when everything it could check worked. */
#include <prefill.h>
#include <stdio.h>

int main(void) {
    int32_t n = 0;
    if (pf_device_count(&n) != PF_STATUS_OK) return 1;
    printf("consumer: libprefill %u, %d device(s)\n", (unsigned)pf_version(), (int)n);
    pf_context *ctx = NULL;
    pf_status s = pf_context_create(&ctx, NULL);
    if (n == 0) {
        printf("consumer: no device: %s (%s)\n", pf_status_name(s), pf_last_error());
        return s == PF_STATUS_NO_DEVICE ? 0 : 1;
    }
    if (s != PF_STATUS_OK) return 1;
    float x[5] = {1, 2, 3, 4, 5}, y[5] = {0};
    pf_buffer *b = NULL;
    int ok = pf_buffer_create(&b, ctx, sizeof x) == PF_STATUS_OK &&
             pf_buffer_upload(b, 0, x, sizeof x) == PF_STATUS_OK &&
             pf_buffer_download(b, 0, y, sizeof y) == PF_STATUS_OK && y[4] == 5.0f;
    pf_buffer_destroy(b);
    pf_context_destroy(ctx);
    printf("consumer: buffer round trip %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
