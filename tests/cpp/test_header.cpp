// prefill.h must compile as C++17 (-pedantic -Werror) with C linkage for every pf_ function.
#include "prefill.h"

#include <cstdio>
#include <cstring>

int main() {
    pf_context_options o;
    const pf_status s = pf_context_options_init(&o, sizeof o);
    if (s != PF_STATUS_OK || o.struct_size != sizeof o) {
        std::fprintf(stderr, "pf_context_options_init failed: %s\n", pf_last_error());
        return 1;
    }
    if (std::strcmp(pf_status_name(PF_STATUS_NO_DEVICE), "PF_STATUS_NO_DEVICE") != 0) return 1;
    // Kernel level: views by pointer, checked before any device work (ctx NULL comes last).
    const pf_view x{nullptr, 0, 0};
    if (pf_add(nullptr, &x, &x, -1, 8) != PF_STATUS_INVALID_ARGUMENT) return 1;
    std::printf("prefill.h as C++17: ok\n");
    return 0;
}
