#define _POSIX_C_SOURCE 200809L
/* ebb_remat_bench: the ebb side of the memory-budget training bench
 * (tests/bench/remat.py, `make bench`, issue 14): one spec's training step
 * compiled for several memory budgets (ebb_compile_options.memory_budget),
 * each plan timed, its peak measured, on one model, through the public C API.
 *
 * The driver runs PyTorch eager (without and with torch.utils.checkpoint) in
 * its own process and alternates rounds with this one, so all are timed side
 * by side.
 *
 * Protocol: one command per line on stdin, one JSON object per line on
 * stdout ("-" stands for an empty argument):
 *   setup SPEC PARAMS_CSV BIND_CSV LOSS PREFIX
 *       loads SPEC with its params replaced ("d=512,depth=64"), binds the
 *       symbolic dims ("batch=64"), draws a seeded input and target (for
 *       cross_entropy int64 classes in [0, C), else randn of the output's
 *       shape), compiles the training step without a budget (plan 0), makes
 *       the model (seed 42) and an AdamW optimizer (lr 1e-3, torch's other
 *       defaults), and writes the initial parameters, "input:x" and
 *       "target:y" to PREFIX.json/.bin for the PyTorch side
 *   compile BUDGET AFTER
 *       compiles the step again with memory_budget BUDGET bytes (0: none);
 *       AFTER 1 sets ebb_train_options.updates_after_backward. Replies the
 *       plan's index, the compile's wall time and ebb_plan_remat_stats(), or
 *       {"nofit": message} when ebb_compile says it cannot fit (EBB_ERR_BUDGET)
 *   check K      the model back to its initial values and a new optimizer,
 *                then two steps of plan K: their losses (the second shows the
 *                first update, so the recomputed backward, was the same)
 *   measure K    one step of plan K with ebb_run_stats: measured and planned
 *   round K N    N steps of plan K; wall ms of each
 *   teardown     frees everything; the live-handle count
 *   quit
 * Threads: libtorch's intra-op pool follows OMP_NUM_THREADS, which the
 * driver sets; the ready line reports libtorch's version. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ebb/ebb.h"
#include "ebb/spec.h"

#include "bench_util.h"

#define MAX_PLANS 32
#define MAX_BIND 8

typedef struct rbench {
    ebb_spec *spec;
    ebb_shape shapes[MAX_BIND];
    int n_inputs;
    ebb_train_options train;
    ebb_shape ys;
    ebb_dtype y_dtype;
    char loss[64];
    ebb_plan *plans[MAX_PLANS];
    ebb_train_options plan_train[MAX_PLANS];
    int n_plans;
    ebb_model *model;
    ebb_optimizer *opt;
    ebb_tensor *x, *y;
    ebb_tensor **init; /* the initial parameter values, in model order */
    int n_params;
} rbench;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put_escaped(const char *s) {
    for (const char *c = s; *c; c++) {
        if (*c == '"' || *c == '\\')
            putchar('\\');
        if (*c == '\n')
            fputs("\\n", stdout);
        else
            putchar(*c);
    }
}

static void reply_error(void) {
    printf("{\"error\": \"");
    put_escaped(ebb_errmsg());
    printf("\"}\n");
    fflush(stdout);
}

static int split_csv(char *buf, char **items, int max) {
    int n = 0;
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ","))
        items[n++] = tok;
    return n;
}

static const char *arg(const char *s) { return strcmp(s, "-") == 0 ? "" : s; }

static void rbench_free(rbench *b) {
    ebb_optimizer_free(b->opt); /* before the model it borrows */
    ebb_model_free(b->model);
    for (int i = 0; i < b->n_plans; i++)
        ebb_plan_free(b->plans[i]);
    for (int i = 0; i < b->n_params; i++)
        ebb_tensor_free(b->init[i]);
    free(b->init);
    ebb_tensor_free(b->x);
    ebb_tensor_free(b->y);
    ebb_spec_free(b->spec);
    memset(b, 0, sizeof *b);
}

/* A seeded target for the forward's output, as bench_ebb.c draws it. */
static ebb_status make_target(rbench *b, const ebb_shape *out, uint64_t seed) {
    return bench_seeded_target(b->loss, out, seed, ebb_device_cpu(), &b->y, &b->ys, &b->y_dtype);
}


static ebb_status compile_with(rbench *b, int64_t budget, int after, ebb_plan **out,
                               ebb_train_options *t) {
    *t = b->train;
    t->updates_after_backward = after;
    ebb_compile_options o = {.input_shapes = b->shapes, .n_input_shapes = b->n_inputs,
                             .train = t, .memory_budget = budget};
    return ebb_spec_compile(out, b->spec, &o);
}

static ebb_status setup(rbench *b, const char *spec, const char *params_csv, const char *bind_csv,
                        const char *loss, const char *prefix) {
    char pbuf[256], bbuf[256];
    char *params[MAX_BIND], *binds[MAX_BIND];
    snprintf(pbuf, sizeof pbuf, "%s", params_csv);
    snprintf(bbuf, sizeof bbuf, "%s", bind_csv);
    int np = split_csv(pbuf, params, MAX_BIND), nb = split_csv(bbuf, binds, MAX_BIND);
    snprintf(b->loss, sizeof b->loss, "%s", loss);
    ebb_spec_options so = {.params = (const char *const *)params, .n_params = np};
    ebb_status st = ebb_spec_load_ex(&b->spec, spec, &so);
    if (st == EBB_OK)
        st = ebb_spec_resolve_shapes(b->spec, (const char *const *)binds, nb, b->shapes, MAX_BIND);
    ebb_plan *inf = NULL;
    if (st == EBB_OK) {
        b->n_inputs = ebb_spec_input_count(b->spec);
        ebb_compile_options o = {.input_shapes = b->shapes, .n_input_shapes = b->n_inputs};
        st = ebb_spec_compile(&inf, b->spec, &o);
    }
    if (st == EBB_OK) { /* the inference plan's output shape is the target's */
        ebb_shape out = ebb_plan_value_at(inf, ebb_plan_output_slot(inf, 0))->shape;
        st = make_target(b, &out, 44);
    }
    ebb_plan_free(inf);
    if (st == EBB_OK) {
        b->train = (ebb_train_options){.target_shapes = &b->ys, .n_target_shapes = 1,
                                       .target_dtypes = &b->y_dtype, .loss = b->loss,
                                       .optimizer = {.kind = EBB_ADAMW, .lr = 1e-3}};
        st = compile_with(b, 0, 0, &b->plans[0], &b->plan_train[0]);
        if (st == EBB_OK)
            b->n_plans = 1;
    }
    if (st == EBB_OK)
        st = ebb_model_new(&b->model, b->plans[0], ebb_device_cpu(), 42);
    if (st == EBB_OK)
        st = ebb_optimizer_new(&b->opt, b->model, &b->train.optimizer);
    if (st == EBB_OK)
        st = ebb_tensor_randn(&b->x, &b->shapes[0], EBB_FLOAT32, ebb_device_cpu(), 43);
    if (st == EBB_OK) {
        b->n_params = ebb_model_param_count(b->model);
        b->init = calloc((size_t)b->n_params + 1, sizeof *b->init);
        if (!b->init)
            st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == EBB_OK && i < b->n_params; i++)
        st = ebb_tensor_clone(&b->init[i],
                              ebb_model_param(b->model, ebb_model_param_name(b->model, i)));
    if (st == EBB_OK && *prefix)
        st = bench_export_model(prefix, b->model, b->x, b->y);
    return st;
}

static void print_stats(const ebb_plan *p) {
    ebb_remat_stats rs;
    if (ebb_plan_remat_stats(p, &rs) != EBB_OK)
        memset(&rs, 0, sizeof rs);
    printf("\"budget\": %lld, \"peak_bytes\": %lld, \"no_recompute_peak_bytes\": %lld, "
           "\"flops\": %lld, \"recompute_flops\": %lld, \"n_recompute_steps\": %d, "
           "\"n_checkpoints\": %d, \"segment\": %d, \"plan_peak_bytes\": %lld, \"steps\": %d, "
           "\"updates_in_backward\": %d",
           (long long)rs.budget, (long long)rs.peak_bytes, (long long)rs.no_recompute_peak_bytes,
           (long long)rs.flops, (long long)rs.recompute_flops, rs.n_recompute_steps,
           rs.n_checkpoints, rs.segment, (long long)ebb_plan_peak_bytes(p, NULL),
           ebb_plan_step_count(p), ebb_plan_updates_in_backward(p));
}

static void cmd_compile(rbench *b, long long budget, int after) {
    if (!b->spec)
        return (void)(ebb_error_set(EBB_ERR_ARG, "compile: nothing set up"), reply_error());
    if (b->n_plans >= MAX_PLANS)
        return (void)(ebb_error_set(EBB_ERR_ARG, "compile: too many plans"), reply_error());
    ebb_plan *p = NULL;
    double t0 = now_s();
    ebb_status st = compile_with(b, budget, after, &p, &b->plan_train[b->n_plans]);
    double ms = (now_s() - t0) * 1e3;
    if (st == EBB_ERR_BUDGET) {
        printf("{\"nofit\": \"");
        put_escaped(ebb_errmsg());
        printf("\", \"compile_ms\": %.3f}\n", ms);
        fflush(stdout);
        return;
    }
    if (st != EBB_OK)
        return reply_error();
    b->plans[b->n_plans] = p;
    printf("{\"index\": %d, \"compile_ms\": %.3f, ", b->n_plans++, ms);
    print_stats(p);
    printf("}\n");
    fflush(stdout);
}

static const ebb_plan *plan_at(const rbench *b, int k) {
    if (k < 0 || k >= b->n_plans) {
        ebb_error_set(EBB_ERR_ARG, "bench: no plan %d", k);
        return NULL;
    }
    return b->plans[k];
}

static void cmd_check(rbench *b, int k) {
    const ebb_plan *p = plan_at(b, k);
    if (!p)
        return reply_error();
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < b->n_params; i++)
        st = ebb_model_set_param(b->model, ebb_model_param_name(b->model, i), b->init[i]);
    ebb_optimizer_free(b->opt);
    b->opt = NULL;
    if (st == EBB_OK)
        st = ebb_optimizer_new(&b->opt, b->model, &b->train.optimizer);
    double loss[2] = {0, 0};
    for (int i = 0; st == EBB_OK && i < 2; i++)
        st = ebb_train_step(p, b->model, b->opt, &b->x, &b->y, &loss[i], NULL);
    if (st != EBB_OK)
        return reply_error();
    printf("{\"loss\": [%.17g, %.17g]}\n", loss[0], loss[1]);
    fflush(stdout);
}

static void cmd_measure(rbench *b, int k) {
    const ebb_plan *p = plan_at(b, k);
    if (!p)
        return reply_error();
    ebb_run_stats rs;
    if (ebb_train_step(p, b->model, b->opt, &b->x, &b->y, NULL, &rs) != EBB_OK)
        return reply_error();
    printf("{\"measured\": %lld, \"planned\": %lld, \"seconds\": %.6f}\n",
           (long long)rs.measured_peak_bytes, (long long)rs.planned_peak_bytes, rs.seconds);
    fflush(stdout);
}

static void cmd_round(rbench *b, int k, int n) {
    const ebb_plan *p = plan_at(b, k);
    if (!p || n < 0)
        return reply_error();
    double *ms = malloc(((size_t)n + 1) * sizeof *ms);
    if (!ms)
        return (void)(ebb_error_set(EBB_ERR_NOMEM, "out of memory"), reply_error());
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        if (ebb_train_step(p, b->model, b->opt, &b->x, &b->y, NULL, NULL) != EBB_OK) {
            free(ms);
            return reply_error();
        }
        ms[i] = (now_s() - t0) * 1e3;
    }
    printf("{\"ms\": [");
    for (int i = 0; i < n; i++)
        printf(i ? ", %.4f" : "%.4f", ms[i]);
    printf("]}\n");
    fflush(stdout);
    free(ms);
}

/* Separate and not inlined, so that a profiler can collect exactly these:
 *   valgrind --tool=callgrind --toggle-collect='bench_remat_steps' \
 *     ebb_remat_bench profile SPEC PARAMS_CSV BIND_CSV LOSS BUDGET AFTER N */
__attribute__((noinline)) ebb_status bench_remat_steps(rbench *b, int k, int n) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < n; i++)
        st = ebb_train_step(b->plans[k], b->model, b->opt, &b->x, &b->y, NULL, NULL);
    return st;
}

static int profile(int argc, char **argv) {
    if (argc < 9) {
        fprintf(stderr, "usage: ebb_remat_bench profile SPEC PARAMS_CSV BIND_CSV LOSS BUDGET "
                        "AFTER N\n");
        return 2;
    }
    rbench b = {0};
    ebb_status st = setup(&b, argv[2], arg(argv[3]), arg(argv[4]), argv[5], "");
    int k = 0;
    if (st == EBB_OK && (atoll(argv[6]) > 0 || atoi(argv[7]))) {
        st = compile_with(&b, atoll(argv[6]), atoi(argv[7]), &b.plans[1], &b.plan_train[1]);
        if (st == EBB_OK)
            k = b.n_plans++;
    }
    int n = atoi(argv[8]);
    if (st == EBB_OK)
        st = bench_remat_steps(&b, k, 2); /* warm-up: AdamW's state, the allocator */
    double t0 = now_s();
    if (st == EBB_OK)
        st = bench_remat_steps(&b, k, n);
    if (st != EBB_OK)
        fprintf(stderr, "%s\n", ebb_errmsg());
    else
        fprintf(stderr, "%d steps of plan %d, %.1f ms each\n", n, k, (now_s() - t0) * 1e3 / n);
    rbench_free(&b);
    return st == EBB_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "profile") == 0)
        return profile(argc, argv);
    printf("{\"ready\": 1, \"libtorch\": \"%s\", \"ebb\": \"%s\"}\n", ebb_torch_version(),
           ebb_version());
    fflush(stdout);
    rbench b = {0};
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = "", a1[1024] = "", a2[256] = "", a3[256] = "", a4[64] = "",
             a5[1024] = "";
        if (sscanf(line, "%31s %1023s %255s %255s %63s %1023s", cmd, a1, a2, a3, a4, a5) < 1)
            break;
        if (strcmp(cmd, "setup") == 0) {
            rbench_free(&b);
            if (setup(&b, a1, arg(a2), arg(a3), a4, arg(a5)) != EBB_OK) {
                reply_error();
                rbench_free(&b);
                continue;
            }
            printf("{\"ok\": 1, \"params\": %d, ", b.n_params);
            print_stats(b.plans[0]);
            printf("}\n");
            fflush(stdout);
        } else if (strcmp(cmd, "compile") == 0) {
            cmd_compile(&b, atoll(a1), atoi(a2));
        } else if (strcmp(cmd, "check") == 0) {
            cmd_check(&b, atoi(a1));
        } else if (strcmp(cmd, "measure") == 0) {
            cmd_measure(&b, atoi(a1));
        } else if (strcmp(cmd, "round") == 0) {
            cmd_round(&b, atoi(a1), atoi(a2));
        } else if (strcmp(cmd, "teardown") == 0) {
            rbench_free(&b);
            printf("{\"live_handles\": %lld}\n", (long long)ebb_tensor_live_count());
            fflush(stdout);
        } else if (strcmp(cmd, "quit") == 0) {
            break;
        } else {
            ebb_error_set(EBB_ERR_ARG, "unknown command %s", cmd);
            reply_error();
        }
    }
    rbench_free(&b);
    return 0;
}
