#define _POSIX_C_SOURCE 200809L
/* ebb_first_steps_bench: the ebb side of the first-steps bench
 * (tests/bench/first_steps.py, `make bench`, issue 25): a spec compiled as
 * a training step with AdamW (lr 1e-3, torch's other defaults) through the
 * public C API, as `ebb train` compiles it, then its first training steps
 * from fresh weights and a fresh optimizer, each step's peak reported as
 * planned and as measured.
 *
 * Protocol: one command per line on stdin, one JSON line back on stdout
 * (an {"error": ...} line when a command fails).
 *   setup SPEC BATCH SEED PREFIX   load SPEC, bind its batch symbol to BATCH,
 *                                  compile the training step, make the model
 *                                  (seeded) and its AdamW, draw a seeded
 *                                  randn input and seeded class targets;
 *                                  write PREFIX.json/.bin (parameters in
 *                                  model order, "input:x", "target:y") for
 *                                  the PyTorch side; reply with the plan's
 *                                  peak and the bytes beside the step
 *   steps COUNT                    COUNT training steps on that batch, each
 *                                  with its loss, measured and planned peak
 *                                  (ebb_run_stats), the step over its plan if
 *                                  any, and the optimizer state it made
 *   teardown                       free everything; the live-handle count
 *   quit
 * Threads: libtorch's intra-op pool follows OMP_NUM_THREADS, which the
 * driver sets; the ready line reports the count in use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/ebb.h"
#include "ebb/spec.h"

#include "bench_util.h"

typedef struct fsbench {
    ebb_spec *spec;
    ebb_plan *plan;
    ebb_model *model;
    ebb_optimizer *opt;
    ebb_tensor *x, *y;
    uint64_t seed;
    int64_t steps_done;
} fsbench;

static void fsbench_free(fsbench *b) {
    ebb_tensor_free(b->x);
    ebb_tensor_free(b->y);
    ebb_optimizer_free(b->opt); /* before the model it borrows */
    ebb_model_free(b->model);
    ebb_plan_free(b->plan);
    ebb_spec_free(b->spec);
    memset(b, 0, sizeof *b);
}

static ebb_status setup(fsbench *b, const char *spec, int64_t batch, uint64_t seed,
                        const char *prefix) {
    b->seed = seed;
    ebb_status st = ebb_spec_load(&b->spec, spec);
    const char *sym = NULL;
    ebb_dtype tdt = EBB_FLOAT32;
    if (st == EBB_OK &&
        (ebb_spec_input_count(b->spec) != 1 || ebb_spec_target_count(b->spec) != 1 ||
         ebb_spec_input_dim(b->spec, 0, 0, &sym) >= 0 || !sym ||
         !ebb_spec_target_dtype(b->spec, 0, &tdt) || tdt != EBB_INT64))
        st = ebb_error_set(EBB_ERR_ARG, "%s: the bench takes one input with a symbolic batch "
                           "dimension first, and one target of int64 classes", spec);
    if (st != EBB_OK)
        return st;
    char bind[96];
    snprintf(bind, sizeof bind, "%s=%lld", sym, (long long)batch);
    const char *binds[] = {bind};
    ebb_shape in, tg;
    st = ebb_spec_resolve_shapes(b->spec, binds, 1, &in, 1);
    if (st == EBB_OK)
        st = ebb_spec_resolve_target_shapes(b->spec, binds, 1, &tg, 1);

    /* the forward's output [B, C] gives the classes the targets are drawn from */
    ebb_compile_options co = {.input_shapes = &in, .n_input_shapes = 1};
    ebb_plan *fwd = NULL;
    if (st == EBB_OK)
        st = ebb_spec_compile(&fwd, b->spec, &co);
    ebb_shape ys;
    ebb_dtype ydt;
    if (st == EBB_OK)
        st = bench_seeded_target("cross_entropy",
                                 &ebb_plan_value_at(fwd, ebb_plan_output_slot(fwd, 0))->shape,
                                 seed + 2, ebb_device_cpu(), &b->y, &ys, &ydt);
    ebb_plan_free(fwd);
    if (st == EBB_OK && !ebb_shape_equal(&ys, &tg))
        st = ebb_error_set(EBB_ERR_ARG, "%s: the targets drawn do not have the spec's shape",
                           spec);

    /* the training step, as `ebb train` compiles it (the spec's loss; on
     * the CPU, the scratch of ops that can only bound it measured) */
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_ADAMW, 1e-3);
    ebb_train_options to = {.target_shapes = &tg, .n_target_shapes = 1,
                            .target_dtypes = &tdt, .optimizer = oo};
    co.train = &to;
    co.measure_scratch = 1;
    if (st == EBB_OK)
        st = ebb_spec_compile(&b->plan, b->spec, &co);
    if (st == EBB_OK)
        st = ebb_model_new(&b->model, b->plan, ebb_device_cpu(), seed);
    if (st == EBB_OK)
        st = ebb_optimizer_new(&b->opt, b->model, &oo);
    if (st == EBB_OK)
        st = ebb_tensor_randn(&b->x, &in, EBB_FLOAT32, ebb_device_cpu(), seed + 1);
    if (st == EBB_OK)
        st = bench_export_model(prefix, b->model, b->x, b->y);
    if (st != EBB_OK)
        return st;
    int64_t param_bytes = 0;
    for (int i = 0; i < ebb_model_param_count(b->model); i++)
        param_bytes += (int64_t)ebb_tensor_nbytes(
            ebb_model_param(b->model, ebb_model_param_name(b->model, i)));
    printf("{\"planned_peak\": %lld, \"peak_is_bound\": %d, \"param_bytes\": %lld, "
           "\"params\": %d, \"optimizer_state_bytes\": %lld, "
           "\"plan_optimizer_state_bytes\": %lld, \"input_bytes\": %lld, "
           "\"target_bytes\": %lld, \"plan_steps\": %d}\n",
           (long long)ebb_plan_device_peak_bytes(b->plan, ebb_device_cpu()),
           ebb_plan_peak_is_bound(b->plan), (long long)param_bytes,
           ebb_model_param_count(b->model),
           (long long)ebb_optimizer_state_bytes(b->opt, NULL),
           (long long)ebb_plan_optimizer_state_bytes(b->plan),
           (long long)ebb_tensor_nbytes(b->x), (long long)ebb_tensor_nbytes(b->y),
           ebb_plan_step_count(b->plan));
    fflush(stdout);
    return EBB_OK;
}

/* COUNT steps on the batch, reported together once they are all done (no
 * output between them). */
#define MAX_STEPS 64

static ebb_status steps(fsbench *b, int64_t count) {
    if (!b->plan)
        return ebb_error_set(EBB_ERR_ARG, "steps before setup");
    if (count < 1 || count > MAX_STEPS)
        return ebb_error_set(EBB_ERR_ARG, "steps %lld: 1 to %d", (long long)count, MAX_STEPS);
    double loss[MAX_STEPS];
    ebb_run_stats rs[MAX_STEPS];
    int64_t state_made[MAX_STEPS];
    ebb_status st = EBB_OK;
    ebb_run_options ro = {.seed = b->seed};
    for (int64_t k = 0; st == EBB_OK && k < count; k++) {
        int64_t state0 = ebb_optimizer_state_bytes(b->opt, NULL);
        memset(&rs[k], 0, sizeof rs[k]);
        st = ebb_train_step_ex(b->plan, b->model, b->opt, &b->x, &b->y, &loss[k], &ro, &rs[k]);
        state_made[k] = ebb_optimizer_state_bytes(b->opt, NULL) - state0;
    }
    if (st != EBB_OK)
        return st;
    printf("{\"loss\": [");
    for (int64_t k = 0; k < count; k++)
        printf(k ? ", %.9g" : "%.9g", loss[k]);
    printf("], \"measured\": [");
    for (int64_t k = 0; k < count; k++)
        printf(k ? ", %lld" : "%lld", (long long)rs[k].measured_peak_bytes);
    printf("], \"planned\": [");
    for (int64_t k = 0; k < count; k++)
        printf(k ? ", %lld" : "%lld", (long long)rs[k].planned_peak_bytes);
    printf("], \"over_step\": [");
    for (int64_t k = 0; k < count; k++)
        printf(k ? ", %d" : "%d", rs[k].over_step);
    printf("], \"over_bytes\": [");
    for (int64_t k = 0; k < count; k++)
        printf(k ? ", %lld" : "%lld", (long long)rs[k].over_bytes);
    printf("], \"state_made\": [");
    for (int64_t k = 0; k < count; k++)
        printf(k ? ", %lld" : "%lld", (long long)state_made[k]);
    printf("], \"optimizer_state_bytes\": %lld}\n",
           (long long)ebb_optimizer_state_bytes(b->opt, NULL));
    fflush(stdout);
    b->steps_done += count;
    return EBB_OK;
}

int main(void) {
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        return 1;
    }
    printf("{\"ready\": 1, \"libtorch\": \"%s\", \"ebb\": \"%s\", \"threads\": %d}\n",
           ebb_torch_version(), ebb_version(), ebb_tensor_num_threads());
    fflush(stdout);
    fsbench b = {0};
    char line[2048], cmd[32], spec[1024], prefix[1024];
    while (fgets(line, sizeof line, stdin)) {
        long long x1 = 0;
        unsigned long long seed = 0;
        if (sscanf(line, "%31s", cmd) != 1 || !strcmp(cmd, "quit"))
            break;
        if (!strcmp(cmd, "setup") &&
            sscanf(line, "%*s %1023s %lld %llu %1023s", spec, &x1, &seed, prefix) == 4) {
            fsbench_free(&b);
            if (setup(&b, spec, x1, seed, prefix) != EBB_OK) {
                bench_reply_error();
                fsbench_free(&b);
            }
        } else if (!strcmp(cmd, "steps") && sscanf(line, "%*s %lld", &x1) == 1) {
            if (steps(&b, x1) != EBB_OK)
                bench_reply_error();
        } else if (!strcmp(cmd, "teardown")) {
            fsbench_free(&b);
            printf("{\"live_handles\": %lld}\n", (long long)ebb_tensor_live_count());
            fflush(stdout);
        } else {
            ebb_error_set(EBB_ERR_ARG, "unknown command or arguments: %s", cmd);
            bench_reply_error();
        }
    }
    fsbench_free(&b);
    return 0;
}
