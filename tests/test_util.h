/* Helpers shared by the cmocka tests. Every test group uses ebb_test_setup and
 * ebb_test_teardown, so each test ends by checking that no ebb_tensor handle
 * is left alive. */
#ifndef EBB_TEST_UTIL_H
#define EBB_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ebb/ebb.h"

static int64_t ebb_test_handles_before;

/* Whether input i of `op` must be drawn in [0.5, 2) rather than from a
 * normal: outside their domain log, sqrt, rsqrt and pow's fractional powers
 * give NaN, which no run can be compared with, and a divisor near 0 blows
 * div's values up (the op suites: test_op_grad, test_op_conformance). */
static inline int ebb_test_positive_input(const char *op, int i) {
    static const char *const ops[] = {"log", "sqrt", "rsqrt", "pow"};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++)
        if (i == 0 && !strcmp(op, ops[k])) return 1;
    return i == 1 && !strcmp(op, "div");
}

/* Seconds (C11's clock): for deadlines and the times tests print. */
static inline double ebb_test_now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ebb_test_setup(void **state) {
    (void)state;
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        return -1;
    }
    ebb_error_clear();
    ebb_test_handles_before = ebb_tensor_live_count();
    return 0;
}

static int ebb_test_teardown(void **state) {
    (void)state;
    int64_t live = ebb_tensor_live_count();
    if (live != ebb_test_handles_before) {
        fprintf(stderr, "teardown: %lld ebb_tensor handle(s) leaked\n",
                (long long)(live - ebb_test_handles_before));
        return -1;
    }
    return 0;
}

#define EBB_TEST(fn) cmocka_unit_test_setup_teardown(fn, ebb_test_setup, ebb_test_teardown)

/* The device the device-aware tests run on: EBB_TEST_DEVICE=cuda (or cuda:N)
 * selects a GPU, with TF32 off so results compare with float32 CPU ones;
 * unset, the CPU. An unusable setting stops the test program. */
static inline ebb_device ebb_test_device(void) {
    const char *env = getenv("EBB_TEST_DEVICE");
    ebb_device d = ebb_device_cpu();
    if (!env || !*env)
        return d;
    if (ebb_init() != EBB_OK || ebb_device_parse(&d, env) != EBB_OK) {
        fprintf(stderr, "EBB_TEST_DEVICE=%s: %s\n", env, ebb_errmsg());
        exit(1);
    }
    if (d.type == EBB_DEVICE_CUDA)
        ebb_cuda_set_tf32(0);
    return d;
}

/* Asserts a call returned EBB_OK, printing ebb_errmsg() when it did not. */
#define assert_ok(call)                                                                            \
    do {                                                                                           \
        ebb_status st_ = (call);                                                                   \
        if (st_ != EBB_OK)                                                                         \
            fail_msg("%s -> %s: %s", #call, ebb_status_name(st_), ebb_errmsg());                   \
    } while (0)

#define assert_errmsg_contains(needle)                                                             \
    do {                                                                                           \
        if (!strstr(ebb_errmsg(), (needle)))                                                       \
            fail_msg("error message \"%s\" lacks \"%s\"", ebb_errmsg(), (needle));                 \
    } while (0)

/* Why bfloat16 cannot run on this CPU here (a static string), or NULL:
 * libtorch 1.13 hands bfloat16 to oneDNN by the CPU's own flags, so under a
 * ONEDNN_MAX_CPU_ISA below the CPU's AVX-512 (the AVX2 pass of .ci/run)
 * oneDNN refuses it, and ebb_compile says so (ebb_cpu_info.bf16_usable).
 * The bfloat16 cases skip there; libtorch 2.x runs them under the same caps. */
static inline const char *ebb_test_bf16_unusable(void) {
    ebb_cpu_info ci;
    if (ebb_init() == EBB_OK && ebb_cpu_info_get(&ci) == EBB_OK && !ci.bf16_usable)
        return "libtorch 1.13's bfloat16 kernels fail under ONEDNN_MAX_CPU_ISA below the CPU's "
               "AVX-512";
    return NULL;
}

/* Runs the group, or one shard of it: ctest registers a long suite several
 * times with EBB_TEST_SHARD=K/N (tests/CMakeLists.txt), and shard K runs the
 * tests at indices K-1, K-1+N, ... of the table, so that the shards run side
 * by side and none takes minutes on a busy machine. CMOCKA_FILTER=NAME (a
 * glob) picks tests by name, within the shard. */
static inline int ebb_test_run_group(const char *name, const struct CMUnitTest *tests, size_t n,
                                     CMFixtureFunction setup, CMFixtureFunction teardown) {
    const char *filter = getenv("CMOCKA_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const char *shard = getenv("EBB_TEST_SHARD");
    unsigned k = 1, of = 1;
    if (shard && *shard && (sscanf(shard, "%u/%u", &k, &of) != 2 || k < 1 || k > of)) {
        fprintf(stderr, "%s: EBB_TEST_SHARD=%s: expected K/N with 1 <= K <= N\n", name, shard);
        return 1;
    }
    struct CMUnitTest *mine = calloc(n ? n : 1, sizeof *mine);
    if (!mine)
        return 1;
    size_t m = 0;
    for (size_t i = k - 1; i < n; i += of)
        mine[m++] = tests[i];
    int rc = _cmocka_run_group_tests(name, mine, m, setup, teardown);
    free(mine);
    return rc;
}

#define ebb_test_run(name, tests, setup, teardown)                                                 \
    ebb_test_run_group((name), (tests), sizeof(tests) / sizeof((tests)[0]), (setup), (teardown))

/* Whether a step of this kind starts a bucket's collective (an all-reduce or
 * ZeRO-1's reduce-scatter, blocking or started), and whether it is a
 * reduce-scatter's. */
static inline int ebb_test_bucket_step(ebb_step_kind k) {
    return k == EBB_STEP_ALLREDUCE || k == EBB_STEP_REDUCE_SCATTER ||
           k == EBB_STEP_ALLREDUCE_START || k == EBB_STEP_REDUCE_SCATTER_START;
}
static inline int ebb_test_scatter_step(ebb_step_kind k) {
    return k == EBB_STEP_REDUCE_SCATTER || k == EBB_STEP_REDUCE_SCATTER_START;
}

#endif
