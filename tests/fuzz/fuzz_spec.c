/* libFuzzer target: the YAML spec loader, then the compiler on whatever
 * loads. Checks beyond the sanitizers: every load error is a FILE:LINE:COL
 * message, and no tensor handle outlives an input.
 *
 *   make fuzz                       # 60 s, seeds from specs/ and tests/specs_bad/
 *   build-fuzz/tests/fuzz/fuzz_spec -dict=tests/fuzz/spec.dict CORPUS specs
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/ebb.h"
#include "ebb/spec.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        abort();
    }
    return 0;
}

/* Compiling falls back to real CPU tensors for ops without meta kernels, so
 * huge inputs are left to the loader alone. */
static int small_enough(const ebb_spec *s) {
    for (int i = 0; i < ebb_spec_input_count(s); i++) {
        double numel = 1;
        for (int d = 0; d < ebb_spec_input_ndim(s, i); d++) {
            int64_t v = ebb_spec_input_dim(s, i, d, NULL);
            numel *= v < 1 ? 1 : (double)v;
        }
        if (numel > 65536)
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t handles = ebb_tensor_live_count();
    ebb_spec *s = NULL;
    ebb_status st = ebb_spec_load_string(&s, (const char *)data, size, "fuzz.yaml");
    if (st != EBB_OK) {
        if (s || (st != EBB_ERR_SPEC && st != EBB_ERR_NOMEM) ||
            strncmp(ebb_errmsg(), "fuzz.yaml:", 10) != 0 || !strstr(ebb_errmsg(), ": error: ")) {
            fprintf(stderr, "bad load error (%s): %s\n", ebb_status_name(st), ebb_errmsg());
            abort();
        }
    } else {
        if (!ebb_spec_graph(s))
            abort();
        if (small_enough(s)) {
            ebb_plan *p = NULL;
            if (ebb_spec_compile(&p, s, NULL) == EBB_OK && !p)
                abort();
            ebb_plan_free(p);
        }
        ebb_spec_free(s);
    }
    if (ebb_tensor_live_count() != handles) {
        fprintf(stderr, "%lld tensor handle(s) leaked\n",
                (long long)(ebb_tensor_live_count() - handles));
        abort();
    }
    return 0;
}
