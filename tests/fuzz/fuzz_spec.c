/* libFuzzer target: the YAML spec loader, then the compiler on whatever
 * loads. Checks beyond the sanitizers: every load error is a FILE:LINE:COL
 * message, no tensor handle outlives an input, and compiling allocates no
 * real tensor memory.
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
        /* whatever shapes the spec declares, the dry run runs on meta
         * tensors, so the RSS limit (make fuzz: 2 GiB) holds; a spec that
         * compiles allocated nothing real on the way */
        ebb_device cpu = ebb_device_cpu();
        int64_t before = ebb_memory_current(cpu);
        ebb_memory_reset_peak(cpu);
        ebb_plan *p = NULL;
        if (ebb_spec_compile(&p, s, NULL) == EBB_OK) {
            ebb_memory_stats ms;
            if (!p || ebb_memory_stats_get(cpu, &ms) != EBB_OK)
                abort();
            if (ms.peak_bytes != before) {
                fprintf(stderr, "compiling allocated %lld real CPU bytes\n",
                        (long long)(ms.peak_bytes - before));
                abort();
            }
        }
        ebb_plan_free(p);
        ebb_spec_free(s);
    }
    if (ebb_tensor_live_count() != handles) {
        fprintf(stderr, "%lld tensor handle(s) leaked\n",
                (long long)(ebb_tensor_live_count() - handles));
        abort();
    }
    return 0;
}
