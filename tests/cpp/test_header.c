/* prefill.h must compile as strict C99 (-pedantic -Werror) and link against libprefill. */
#include "prefill.h"

#include <stdio.h>

int main(void) {
    const uint32_t v = pf_version();
    if (v != PF_VERSION_MAJOR * 10000u + PF_VERSION_MINOR * 100u + PF_VERSION_PATCH) {
        fprintf(stderr, "pf_version()=%u does not match the header\n", (unsigned)v);
        return 1;
    }
    printf("prefill.h as C99: pf_version %u, %s\n", (unsigned)v, pf_status_name(PF_STATUS_OK));
    return 0;
}
