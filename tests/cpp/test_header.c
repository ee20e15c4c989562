/* prefill.h must compile as strict C99 (-pedantic -Werror) and link against libprefill. */
#include "prefill.h"

#include <stdio.h>

int main(void) {
    const uint32_t v = pf_version();
    pf_view x = {NULL, 0, 0};
    pf_gdn_scan_args a;
    if (v != PF_VERSION_MAJOR * 10000u + PF_VERSION_MINOR * 100u + PF_VERSION_PATCH) {
        fprintf(stderr, "pf_version()=%u does not match the header\n", (unsigned)v);
        return 1;
    }
    /* a kernel-level argument struct as C fills it: _init, then the fields */
    if (pf_gdn_scan_args_init(&a, sizeof a) != PF_STATUS_OK || a.path != PF_GDN_SCAN_AUTO) {
        fprintf(stderr, "pf_gdn_scan_args_init failed: %s\n", pf_last_error());
        return 1;
    }
    a.q = x;
    printf("prefill.h as C99: pf_version %u, %s\n", (unsigned)v, pf_status_name(PF_STATUS_OK));
    return 0;
}
