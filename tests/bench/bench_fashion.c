#define _POSIX_C_SOURCE 200809L
/* ebb_fashion_bench: the ebb side of the Fashion-MNIST training bench
 * (tests/bench/fashion.py, `make bench`): a spec trained on the 60,000
 * training images through the public C API, the way `ebb train` does it
 * (src/trainer.c): ebb_dataset_open("fashion-mnist") -> ebb_dataset_order
 * -> per step ebb_dataset_batch for the input and the target, then
 * ebb_train_step_ex, AdamW with torch.optim's defaults and lr 1e-3.
 *
 * The driver runs PyTorch eager in its own process and alternates chunks of
 * the epoch with this one, so the two are timed side by side.
 *
 * Protocol: one command per line on stdin, one JSON object per line on
 * stdout:
 *   setup SPEC BATCH SEED PREFIX  load the spec and the dataset, compile the
 *                                 training plan for BATCH, make the model and
 *                                 the optimizer; write the epoch's sample
 *                                 order to PREFIX.order (int64) and the
 *                                 initial parameters to PREFIX.json/.bin
 *   steps FROM COUNT [traced]     run steps FROM .. FROM+COUNT-1 of the epoch
 *                                 (batch k is order[k*BATCH ..]); wall time
 *                                 of the chunk (batches made and steps), of
 *                                 the steps alone, and each step's loss and
 *                                 measured peak (ebb_run_stats), and the
 *                                 optimizer state held after; `traced`
 *                                 adds each step's peak with the optimizer
 *                                 state it created counted in ("total")
 *   profile COUNT                 run steps 0 .. COUNT-1 traced and report
 *                                 each plan step's mean wall time (op, node,
 *                                 phase): where a step's time goes, next to
 *                                 PyTorch's profiler
 *   teardown                      free everything; the live-handle count
 *   quit
 * Threads: libtorch's intra-op pool follows OMP_NUM_THREADS, which the
 * driver sets; the ready line reports the count in use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ebb/data.h"
#include "ebb/ebb.h"
#include "ebb/spec.h"

#include "bench_util.h"

typedef struct fbench {
    ebb_spec *spec;
    ebb_plan *plan;
    ebb_model *model;
    ebb_optimizer *opt;
    ebb_dataset *data;
    int64_t *order, n, batch, per_epoch;
    uint64_t seed;
    char sym[64];        /* the inputs' batch symbol */
    ebb_dtype dtypes[2]; /* input, target */
} fbench;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fbench_free(fbench *b) {
    ebb_optimizer_free(b->opt); /* before the model it borrows */
    ebb_model_free(b->model);
    ebb_plan_free(b->plan);
    ebb_dataset_free(b->data);
    ebb_spec_free(b->spec);
    free(b->order);
    memset(b, 0, sizeof *b);
}

/* The input's and target's shapes for a batch of `count`. */
static ebb_status shapes_for(const fbench *b, int64_t count, ebb_shape *in, ebb_shape *tg) {
    char bind[96];
    snprintf(bind, sizeof bind, "%s=%lld", b->sym, (long long)count);
    const char *binds[] = {bind};
    ebb_status st = ebb_spec_resolve_shapes(b->spec, binds, 1, in, 1);
    if (st == EBB_OK)
        st = ebb_spec_resolve_target_shapes(b->spec, binds, 1, tg, 1);
    return st;
}

/* Batch `k` of the epoch (the last one may be short), gathered from the
 * dataset in memory in the shuffled order, as `ebb train`'s loop does. */
static ebb_status batch_at(const fbench *b, int64_t k, ebb_tensor **x, ebb_tensor **y) {
    int64_t at = k * b->batch, cnt = b->n - at < b->batch ? b->n - at : b->batch;
    ebb_shape in, tg;
    ebb_status st = shapes_for(b, cnt, &in, &tg);
    if (st == EBB_OK)
        st = ebb_dataset_batch(x, b->data, 0, b->order + at, cnt, &in, b->dtypes[0],
                               ebb_device_cpu());
    if (st == EBB_OK)
        st = ebb_dataset_batch(y, b->data, 1, b->order + at, cnt, &tg, b->dtypes[1],
                               ebb_device_cpu());
    return st;
}

/* Parameters as float32 (num_batches_tracked is an int64 count), in the
 * manifest format run.py's load_export reads. */
static ebb_status export_params(const fbench *b, const char *prefix) {
    char path[1040]; /* PREFIX (at most 1023) and a suffix */
    snprintf(path, sizeof path, "%s.json", prefix);
    FILE *js = fopen(path, "w");
    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *bin = fopen(path, "wb");
    ebb_status st = js && bin ? EBB_OK : ebb_error_set(EBB_ERR_IO, "cannot write %s", path);
    long long offset = 0;
    if (st == EBB_OK)
        fprintf(js, "{\"tensors\": [");
    int first = 1;
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(b->model); i++) {
        const char *name = ebb_model_param_name(b->model, i);
        st = bench_export_tensor(js, bin, &first, &offset, name, ebb_model_param(b->model, name));
    }
    if (st == EBB_OK)
        fprintf(js, "\n]}\n");
    if (js)
        fclose(js);
    if (bin)
        fclose(bin);
    return st;
}

static ebb_status setup(fbench *b, const char *spec, int64_t batch, uint64_t seed,
                        const char *prefix) {
    double t0 = now_s();
    b->batch = batch;
    b->seed = seed;
    ebb_status st = ebb_spec_load(&b->spec, spec);
    const char *sym = NULL;
    if (st == EBB_OK &&
        (ebb_spec_input_count(b->spec) != 1 || ebb_spec_target_count(b->spec) != 1 ||
         ebb_spec_input_dim(b->spec, 0, 0, &sym) >= 0 || !sym))
        st = ebb_error_set(EBB_ERR_ARG, "%s: the bench takes one input with a symbolic batch "
                           "dimension first, and one target", spec);
    if (st != EBB_OK)
        return st;
    snprintf(b->sym, sizeof b->sym, "%s", sym);
    if (!ebb_spec_input_dtype(b->spec, 0, &b->dtypes[0]))
        b->dtypes[0] = EBB_FLOAT32;
    if (!ebb_spec_target_dtype(b->spec, 0, &b->dtypes[1]))
        b->dtypes[1] = EBB_FLOAT32;

    /* the training plan, as `ebb train` compiles it */
    ebb_shape in, tg;
    ebb_optimizer_options oo = ebb_optimizer_defaults(EBB_ADAMW, 1e-3);
    st = shapes_for(b, batch, &in, &tg);
    ebb_train_options to = {.target_shapes = &tg, .n_target_shapes = 1,
                            .target_dtypes = &b->dtypes[1], .optimizer = oo};
    ebb_compile_options co = {.input_shapes = &in, .n_input_shapes = 1, .train = &to};
    if (st == EBB_OK)
        st = ebb_spec_compile(&b->plan, b->spec, &co);
    if (st == EBB_OK)
        st = ebb_model_new(&b->model, b->plan, ebb_device_cpu(), seed);
    if (st == EBB_OK)
        st = ebb_optimizer_new(&b->opt, b->model, &oo);
    double t_data = now_s();
    const char *names[] = {ebb_spec_input_name(b->spec, 0), ebb_spec_target_name(b->spec, 0)};
    if (st == EBB_OK)
        st = ebb_dataset_open(&b->data, "fashion-mnist", names, 2);
    double load_s = now_s() - t_data;
    if (st != EBB_OK)
        return st;
    b->n = ebb_dataset_size(b->data);
    b->per_epoch = (b->n + batch - 1) / batch;
    if (!(b->order = malloc(sizeof *b->order * (size_t)b->n)))
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    /* epoch 1's order, seeded as `ebb train` seeds it */
    ebb_dataset_order(b->order, b->n, seed ^ 0x9E3779B97F4A7C15ull, 1);
    char path[1040]; /* PREFIX (at most 1023) and a suffix */
    snprintf(path, sizeof path, "%s.order", prefix);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->order, sizeof *b->order, (size_t)b->n, f) != (size_t)b->n)
        st = ebb_error_set(EBB_ERR_IO, "cannot write %s", path);
    if (f)
        fclose(f);
    if (st == EBB_OK)
        st = export_params(b, prefix);
    if (st != EBB_OK)
        return st;
    int64_t param_bytes = 0, state_most = 0;
    for (int i = 0; i < ebb_model_param_count(b->model); i++)
        param_bytes += (int64_t)ebb_tensor_nbytes(
            ebb_model_param(b->model, ebb_model_param_name(b->model, i)));
    ebb_optimizer_state_bytes(b->opt, &state_most);
    printf("{\"samples\": %lld, \"steps_per_epoch\": %lld, \"planned_peak\": %lld, "
           "\"param_bytes\": %lld, \"optimizer_state_bytes\": %lld, \"params\": %d, "
           "\"load_seconds\": %.6f, \"setup_seconds\": %.6f}\n",
           (long long)b->n, (long long)b->per_epoch,
           (long long)ebb_plan_device_peak_bytes(b->plan, ebb_device_cpu()),
           (long long)param_bytes, (long long)state_most, ebb_model_param_count(b->model), load_s,
           now_s() - t0);
    fflush(stdout);
    return EBB_OK;
}

/* A step's peak counting the optimizer state it creates. ebb_run_stats
 * leaves that state out: an update that creates state moves the run's
 * baseline by it (src/exec.c). A traced run resets the allocator's peak before
 * each plan step and reports it above the baseline of that moment, so adding
 * the state made since the train step began gives the peak above the bytes
 * live when it began, which is what PyTorch's profiler counts. */
typedef struct total_peak {
    const ebb_optimizer *opt;
    int64_t state0, peak;
} total_peak;

static void on_step(const ebb_trace_event *ev, void *user) {
    total_peak *t = user;
    int64_t p = ev->peak_bytes + ebb_optimizer_state_bytes(t->opt, NULL) - t->state0;
    if (ev->peak_bytes >= 0 && p > t->peak)
        t->peak = p;
}

/* Per plan step: summed wall time over a profile's train steps. */
typedef struct step_times {
    const ebb_plan *plan;
    double *seconds;
} step_times;

static void on_step_time(const ebb_trace_event *ev, void *user) {
    step_times *t = user;
    t->seconds[ev->step] += ev->seconds;
}

static ebb_status profile(fbench *b, int64_t count) {
    if (!b->plan)
        return ebb_error_set(EBB_ERR_ARG, "profile before setup");
    if (count < 1 || count > b->per_epoch)
        return ebb_error_set(EBB_ERR_ARG, "profile %lld: the epoch has %lld", (long long)count,
                             (long long)b->per_epoch);
    int n = ebb_plan_step_count(b->plan);
    step_times t = {.plan = b->plan, .seconds = calloc((size_t)n, sizeof(double))};
    if (!t.seconds)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    ebb_run_options ro = {.seed = b->seed, .trace = on_step_time, .trace_user = &t};
    ebb_status st = EBB_OK;
    double total = 0;
    for (int64_t k = 0; st == EBB_OK && k < count; k++) {
        ebb_tensor *x = NULL, *y = NULL;
        double loss = 0;
        st = batch_at(b, k, &x, &y);
        double ts = now_s();
        if (st == EBB_OK)
            st = ebb_train_step_ex(b->plan, b->model, b->opt, &x, &y, &loss, &ro, NULL);
        total += now_s() - ts;
        ebb_tensor_free(x);
        ebb_tensor_free(y);
    }
    if (st == EBB_OK) {
        static const char *const phases[] = {"forward", "loss", "backward", "update"};
        printf("{\"step_seconds\": %.6f, \"steps\": [", total / (double)count);
        for (int i = 0; i < n; i++) {
            const ebb_plan_step *ps = ebb_plan_step_at(b->plan, i);
            printf("%s{\"op\": \"%s\", \"node\": \"%s\", \"phase\": \"%s\", "
                   "\"seconds\": %.9f}",
                   i ? ", " : "", ps->op, ps->node ? ps->node : "",
                   (unsigned)ps->phase < 4 ? phases[ps->phase] : "?",
                   t.seconds[i] / (double)count);
        }
        printf("]}\n");
        fflush(stdout);
    }
    free(t.seconds);
    return st;
}

/* Steps [from, from+count) of the epoch: each makes its batch from the
 * dataset in memory, then trains on it, as `ebb train`'s loop does. */
static ebb_status steps(fbench *b, int64_t from, int64_t count, int traced) {
    if (!b->plan)
        return ebb_error_set(EBB_ERR_ARG, "steps before setup");
    if (from < 0 || count < 1 || from + count > b->per_epoch)
        return ebb_error_set(EBB_ERR_ARG, "steps %lld %lld: the epoch has %lld", (long long)from,
                             (long long)count, (long long)b->per_epoch);
    double *loss = malloc(sizeof *loss * (size_t)count);
    int64_t *peak = malloc(sizeof *peak * (size_t)count);
    int64_t *total = malloc(sizeof *total * (size_t)count);
    if (!loss || !peak || !total) {
        free(loss);
        free(peak);
        free(total);
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    ebb_status st = EBB_OK;
    ebb_run_options ro = {.seed = b->seed};
    double step_s = 0, t0 = now_s();
    for (int64_t k = 0; st == EBB_OK && k < count; k++) {
        ebb_tensor *x = NULL, *y = NULL;
        ebb_run_stats rs = {0};
        total_peak tp = {.opt = b->opt, .state0 = ebb_optimizer_state_bytes(b->opt, NULL)};
        if (traced)
            ro.trace = on_step, ro.trace_user = &tp;
        st = batch_at(b, from + k, &x, &y);
        double ts = now_s();
        if (st == EBB_OK)
            st = ebb_train_step_ex(b->plan, b->model, b->opt, &x, &y, &loss[k], &ro, &rs);
        step_s += now_s() - ts;
        peak[k] = rs.measured_peak_bytes;
        total[k] = tp.peak;
        ebb_tensor_free(x);
        ebb_tensor_free(y);
    }
    double secs = now_s() - t0;
    if (st == EBB_OK) {
        printf("{\"seconds\": %.6f, \"step_seconds\": %.6f, \"optimizer_state_bytes\": %lld, "
               "\"loss\": [",
               secs, step_s, (long long)ebb_optimizer_state_bytes(b->opt, NULL));
        for (int64_t k = 0; k < count; k++)
            printf(k ? ", %.9g" : "%.9g", loss[k]);
        printf("], \"peak\": [");
        for (int64_t k = 0; k < count; k++)
            printf(k ? ", %lld" : "%lld", (long long)peak[k]);
        printf("]");
        if (traced) {
            printf(", \"total\": [");
            for (int64_t k = 0; k < count; k++)
                printf(k ? ", %lld" : "%lld", (long long)total[k]);
            printf("]");
        }
        printf("}\n");
        fflush(stdout);
    }
    free(loss);
    free(peak);
    free(total);
    return st;
}

int main(void) {
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb_init: %s\n", ebb_errmsg());
        return 1;
    }
    printf("{\"ready\": 1, \"libtorch\": \"%s\", \"ebb\": \"%s\", \"threads\": %d}\n",
           ebb_torch_version(), ebb_version(), ebb_tensor_num_threads());
    fflush(stdout);
    fbench b = {0};
    char line[2048], cmd[32], spec[1024], prefix[1024];
    while (fgets(line, sizeof line, stdin)) {
        long long x1 = 0, x2 = 0;
        unsigned long long seed = 0;
        if (sscanf(line, "%31s", cmd) != 1 || !strcmp(cmd, "quit"))
            break;
        if (!strcmp(cmd, "setup") &&
            sscanf(line, "%*s %1023s %lld %llu %1023s", spec, &x1, &seed, prefix) == 4) {
            fbench_free(&b);
            if (setup(&b, spec, x1, seed, prefix) != EBB_OK) {
                bench_reply_error();
                fbench_free(&b);
            }
        } else if (!strcmp(cmd, "steps") && sscanf(line, "%*s %lld %lld", &x1, &x2) == 2) {
            if (steps(&b, x1, x2, strstr(line, "traced") != NULL) != EBB_OK)
                bench_reply_error();
        } else if (!strcmp(cmd, "profile") && sscanf(line, "%*s %lld", &x1) == 1) {
            if (profile(&b, x1) != EBB_OK)
                bench_reply_error();
        } else if (!strcmp(cmd, "teardown")) {
            fbench_free(&b);
            printf("{\"live_handles\": %lld}\n", (long long)ebb_tensor_live_count());
            fflush(stdout);
        } else {
            ebb_error_set(EBB_ERR_ARG, "unknown command or arguments: %s", cmd);
            bench_reply_error();
        }
    }
    fbench_free(&b);
    return 0;
}
