/* `ebb run`: run a spec's plan on inputs (random or a file), measured against its plan. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_run[] =
    "usage: ebb run SPEC [-i NAME=DIMS]... [-p PARAM=N]... [--device cpu|cuda[:N]] [--seed N]\n"
    "               [--weights W.safetensors [--non-strict]] [--save-weights W.safetensors]\n"
    "               [--inputs X.safetensors] [--outputs Y.safetensors]\n"
    "               [--trace T.jsonl] [--repeat N] [--keep-all] [--cuda-graph] [--force]\n"
    "               [--strict-finite] [--strict-memory]\n"
    "\n";

/* --repeat N: 1 to a million runs */
static int set_repeat(const cli_flag *f, const char *v, void *field, const char *usage) {
    uint64_t n = 0;
    int rc = cli_set_u64(f, v, &n, usage);
    if (rc) return rc;
    if (n < 1 || n > 1000000)
        return ebb_cli_usage_error(usage, "%s", "--repeat must be between 1 and 1000000");
    *(int *)field = (int)n;
    return 0;
}

const cli_flag ebb_cli_run_flags[] = {
    SHAPE_FLAG("NAME=DIMS", "input shape, or SYMBOL=N (symbolic dimensions default to 1)"),
    BATCH_FLAG,
    PARAM_FLAG,
    FLAG_PATH("device", "D", options, device,
              "cpu, cuda or cuda:N (default: cuda when available, else cpu)"),
    SEED_FLAG(options, seed, "seed for parameters and random inputs (default 0)"),
    FLAG_PATH("weights", "FILE", options, weights,
              "load parameters by name; every missing, unexpected or\n"
              "mis-shaped tensor is listed, and any is an error"),
    FLAG_SWITCH("non-strict", options, non_strict,
                "with --weights: list those on stderr as a warning, load the\n"
                "parameters that match and keep the others' seeded values"),
    FLAG_PATH("save-weights", "F", options, save_weights, "write the parameters"),
    FLAG_PATH("inputs", "FILE", options, inputs,
              "read inputs by name (default: seeded random normal)"),
    FLAG_PATH("outputs", "FILE", options, outputs, "write outputs by name"),
    FLAG_PATH("trace", "FILE", options, trace,
              "one JSON object per executed step, then a summary"),
    {0, "repeat", "N", set_repeat, offsetof(options, repeat), 0,
     "run N times and report the median time (default 1)", "a non-negative integer"},
    FLAG_SWITCH("keep-all", options, keep_all, "free nothing until the end, to compare"),
    FLAG_SWITCH("cuda-graph", options, cuda_graph,
                "capture the plan into a CUDA graph once, time its replays"),
    FLAG_SWITCH("force", options, force,
                "run even if the plan's peak does not fit in what this process\n"
                "can get (RLIMIT_AS, RLIMIT_DATA, cgroup limit, MemAvailable)"),
    FLAG_SWITCH("strict-finite", options, strict_finite,
                "NaN or Inf in --weights or --inputs is an error, not a warning"),
    STRICT_MEMORY_FLAG,
    PRECISION_FLAG(options, precision),
    COMMON_FLAGS,
    END_OF_OPTIONS_HELP,
    FLAG_END,
};

const char ebb_cli_usage_run_tail[] =
    "\n"
    "SPEC, --weights or --inputs (one of them) may be -, standard input; a\n"
    "safetensors file from a pipe is read into memory first. Output files are\n"
    "replaced atomically (a link is followed); a device or pipe such as\n"
    "/dev/stdout is written into. Errors writing them exit 3.\n";

static void ids(FILE *f, const ebb_plan *p, const int *slots, int n) {
    char id[64];
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        ebb_plan_value_id(p, slots[i], id, sizeof id);
        fprintf(f, "%s\"%s\"", i ? ", " : "", id);
    }
    fputc(']', f);
}

void ebb_cli_trace_step(const ebb_trace_event *e, void *user) {
    ebb_cli_trace *t = user;
    FILE *f = t->f;
    char id[64];
    t->steps++;
    fprintf(f, "{\"step\": %d, \"op\": \"%s\", \"node\": ", e->step, e->info->op);
    /* node paths and names are identifiers and dots: no escaping needed */
    fprintf(f, "\"%s\", \"inputs\": ", e->info->node);
    ids(f, t->plan, e->info->in, e->info->n_in);
    /* `output` (the step's main value) is kept for readers of the first
     * format; `outputs` lists every value the step writes */
    int skipped = e->jumped && e->info->kind == EBB_STEP_ENTER; /* a branch with no rows */
    fputs(", \"output\": ", f);
    if (e->info->n_out && !skipped) {
        ebb_plan_value_id(t->plan, e->info->out[e->info->kind == EBB_STEP_ENTER ? 1 : 0], id,
                          sizeof id);
        fprintf(f, "\"%s\"", id);
    } else {
        fputs("null", f);
    }
    fputs(", \"outputs\": ", f);
    ids(f, t->plan, e->info->out, skipped ? 0 : e->info->n_out);
    fputs(", \"freed\": ", f);
    ids(f, t->plan, e->freed, e->n_freed);
    fprintf(f,
            ", \"jumped\": %s, \"live_bytes\": %lld, \"peak_bytes\": %lld, "
            "\"planned_peak_bytes\": %lld, \"seconds\": %.9f}\n",
            e->jumped ? "true" : "false", (long long)e->live_bytes, (long long)e->peak_bytes,
            (long long)e->planned_peak_bytes, e->seconds);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_summary(const char *name, const ebb_tensor *t) {
    char sb[96];
    ebb_shape s = ebb_tensor_shape(t);
    printf("output %s %s %s", name, ebb_dtype_name(ebb_tensor_dtype(t)),
           ebb_shape_str(&s, sb, sizeof sb));
    int64_t n = ebb_tensor_numel(t);
    ebb_tensor *cpu = NULL;
    if (n > 0 && ebb_tensor_to(&cpu, t, ebb_device_cpu(), EBB_FLOAT64) == EBB_OK) {
        double *v = malloc((size_t)n * sizeof *v);
        if (v && ebb_tensor_to_host(cpu, v, (size_t)n * sizeof *v) == EBB_OK) {
            double sum = 0, sq = 0, lo = v[0], hi = v[0];
            for (int64_t i = 0; i < n; i++) {
                sum += v[i];
                sq += v[i] * v[i];
                lo = v[i] < lo ? v[i] : lo;
                hi = v[i] > hi ? v[i] : hi;
            }
            double mean = sum / (double)n, var = sq / (double)n - mean * mean;
            printf("  mean %.6g std %.6g min %.6g max %.6g", mean, var > 0 ? sqrt(var) : 0.0, lo,
                   hi);
        }
        free(v);
        ebb_tensor_free(cpu);
    }
    putchar('\n');
}

/* --weights and --inputs holding NaN or Inf: a warning naming the tensor, or
 * with --strict-finite an error (the caller's choice). */
static void warn_nonfinite(const char *path, const char *name, int64_t count, int64_t numel,
                           void *user) {
    fprintf(stderr,
            "ebb: warning: %s: %s '%s' holds %lld NaN or infinite values (of %lld); "
            "--strict-finite makes this an error\n",
            path, (const char *)user, name, (long long)count, (long long)numel);
}

/* --non-strict: what --weights did not match, said once, before the run. */
static void warn_mismatch(const ebb_load_report *r, void *user) {
    (void)user;
    fprintf(stderr,
            "ebb: warning: %s; --non-strict: loaded the other %d parameter%s, the rest keep their "
            "seeded values\n",
            r->text, r->n_loaded, r->n_loaded == 1 ? "" : "s");
}

/* --non-strict: a tensor of --weights whose bytes do not match its checksum. */
static void warn_damaged(const char *path, const char *name, const char *message, void *user) {
    (void)path;
    (void)name;
    (void)user;
    fprintf(stderr, "ebb: warning: %s; --non-strict: read as it is\n", message);
}

/* Bytes of the graph inputs the command will create or load. */
static int64_t input_bytes(const ebb_plan *p) {
    int64_t n = 0;
    for (int i = 0; i < ebb_plan_input_count(p); i++) {
        const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_input_slot(p, i));
        n += ebb_shape_numel(&v->shape) * (int64_t)ebb_dtype_size(v->dtype);
    }
    return n;
}

/* Why a plan's figure is a bound rather than exact: it routes rows or loops
 * by value, or a step's op can only bound its scratch (a kernel chosen at
 * run time, an operand copied or not depending on its strides), named. */
static void bound_reason(const ebb_plan *p, ebb_device dev, char *buf, size_t size) {
    for (int i = 0; i < ebb_plan_step_count(p); i++) {
        ebb_step_kind k = ebb_plan_step_at(p, i)->kind;
        if (k == EBB_STEP_ROUTE || k == EBB_STEP_JUMP_IF || k == EBB_STEP_LOOP_NEXT) {
            snprintf(buf, size, "the plan routes rows or loops by value: its figure bounds "
                                "every routing and iteration count");
            return;
        }
    }
    int cuda = dev.type == EBB_DEVICE_CUDA;
    for (int i = 0; i < ebb_plan_step_count(p); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(p, i);
        const ebb_op *op = s->kind == EBB_STEP_OP || s->kind == EBB_STEP_BACKWARD
                               ? ebb_op_find(s->op)
                               : NULL;
        if (!op && s->kind == EBB_STEP_BACKWARD) { /* "linear.backward" */
            char name[128];
            snprintf(name, sizeof name, "%s", s->op);
            char *dot = strrchr(name, '.');
            if (dot)
                *dot = '\0';
            op = ebb_op_find(name);
        }
        if (!op)
            continue;
        int fwd = s->kind == EBB_STEP_OP;
        int is_bound = fwd ? op->workspace_is_bound || (cuda && op->workspace_cuda_is_bound)
                           : op->grad && (op->grad->workspace_is_bound ||
                                          (cuda && op->grad->workspace_cuda_is_bound));
        if (is_bound) {
            snprintf(buf, size, "step %d (%s, node %s) can only bound its scratch on this "
                                "device (a kernel chosen at run time, or operands copied by "
                                "their layout)", i, s->op, s->node);
            return;
        }
    }
    snprintf(buf, size, "on this device some kernels are chosen at run time: its figure bounds "
                        "what they take");
}

/* The plan's inputs on `dev`: read from --inputs, else seeded normal
 * values (indices 0); NaN or Inf a warning, or with --strict-finite an
 * error. Returns 0 or an exit code. */
static int make_inputs(const options *o, const ebb_plan *p, ebb_safetensors *in_file,
                       ebb_device dev, ebb_tensor **inputs) {
    int n_in = ebb_plan_input_count(p);
    ebb_status st = EBB_OK;
    for (int i = 0; i < n_in; i++) {
        const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_input_slot(p, i));
        int64_t bad = 0;
        if (in_file && ebb_safetensors_dtype_str(in_file, v->name))
            st = ebb_safetensors_load_ex(&inputs[i], in_file, v->name, dev, &bad);
        else if (in_file)
            st = ebb_error_set(EBB_ERR_ARG, "%s: no tensor named '%s' (an input of %s)", o->inputs,
                               v->name, o->spec);
        else if (v->dtype == EBB_FLOAT32 || v->dtype == EBB_FLOAT64 || v->dtype == EBB_FLOAT16 ||
                 v->dtype == EBB_BFLOAT16)
            st = ebb_tensor_randn(&inputs[i], &v->shape, v->dtype, dev, o->seed + 1000 + (uint64_t)i);
        else /* indices: 0 is valid for every embedding and every loss */
            st = ebb_tensor_zeros(&inputs[i], &v->shape, v->dtype, dev);
        if (st == EBB_OK && bad && o->strict_finite)
            st = ebb_error_set(EBB_ERR_ARG, "%s: input '%s' holds %lld NaN or infinite values (of "
                                            "%lld)",
                               o->inputs, v->name, (long long)bad,
                               (long long)ebb_tensor_numel(inputs[i]));
        else if (st == EBB_OK && bad)
            warn_nonfinite(o->inputs, v->name, bad, ebb_tensor_numel(inputs[i]), "input");
        if (st != EBB_OK)
            return ebb_cli_fail_status(st);
    }
    return 0;
}

/* --cuda-graph: the plan captured once, its replays timed into times[];
 * the eager run before gave the trace and memory figures. */
static int time_replays(const ebb_plan *p, ebb_model *m, ebb_tensor **inputs, ebb_tensor **outputs,
                        int n_out, int repeat, ebb_device dev, double *times) {
    ebb_capture *cap = NULL;
    ebb_status st = ebb_plan_capture(&cap, p, m, inputs);
    if (st != EBB_OK)
        return ebb_cli_fail_status(st);
    for (int r = 0; r < repeat && st == EBB_OK; r++) {
        for (int k = 0; k < n_out; k++) {
            ebb_tensor_free(outputs[k]);
            outputs[k] = NULL;
        }
        double t0 = now();
        st = ebb_capture_replay(cap, inputs, outputs);
        if (st == EBB_OK)
            st = ebb_device_synchronize(dev);
        times[r] = now() - t0;
    }
    ebb_capture_free(cap);
    return st != EBB_OK ? ebb_cli_fail_status(st) : 0;
}

/* --outputs: the outputs by name into one safetensors file. */
static int write_outputs(const char *path, const ebb_plan *p, ebb_tensor **outputs, int n_out) {
    const char **names = calloc((size_t)n_out, sizeof *names);
    if (!names)
        return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    for (int k = 0; k < n_out; k++)
        names[k] = ebb_plan_output_name(p, k);
    ebb_status st = ebb_safetensors_write(path, names, outputs, n_out);
    free(names);
    if (st != EBB_OK)
        return st == EBB_ERR_NOMEM ? ebb_cli_fail_status(st) : fail_write();
    return 0;
}

/* The run's figures: measured against planned peak (and why a bound was
 * not reached), then the time, median of the sorted times[]. */
static void print_peak(const ebb_plan *p, ebb_device dev, int64_t peak) {
    char mb[32], pb[32], kb[32];
    ebb_bytes_str(peak, mb, sizeof mb);
    ebb_bytes_str(ebb_plan_device_peak_bytes(p, dev), pb, sizeof pb);
    ebb_bytes_str(ebb_plan_keep_all_peak_bytes(p), kb, sizeof kb);
    int bound = ebb_plan_peak_is_bound_on(p, dev);
    printf("peak intermediate bytes: measured %lld (%s), planned %lld (%s, %s), keep_all %lld "
           "(%s)\n",
           (long long)peak, mb, (long long)ebb_plan_device_peak_bytes(p, dev), pb,
           bound ? "upper bound" : "exact", (long long)ebb_plan_keep_all_peak_bytes(p), kb);
    if (bound && peak < ebb_plan_device_peak_bytes(p, dev)) {
        char why[256];
        bound_reason(p, dev, why, sizeof why);
        printf("(%s; this run's took %.0f%% of it)\n", why,
               100.0 * (double)peak / (double)ebb_plan_device_peak_bytes(p, dev));
    }
}

static void print_time(ebb_device dev, const double *times, int repeat, int cuda_graph) {
    char dn[32];
    printf("time on %s%s: median %.3f ms over %d run%s (min %.3f, max %.3f)\n",
           ebb_device_str(dev, dn, sizeof dn), cuda_graph ? " (CUDA graph replay)" : "",
           times[repeat / 2] * 1e3, repeat, repeat == 1 ? "" : "s", times[0] * 1e3,
           times[repeat - 1] * 1e3);
}

int ebb_cli_run(const command *self, int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, self, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    ebb_device dev = ebb_device_default();
    ebb_status st;
    if (o.device && (st = ebb_device_parse(&dev, o.device)) != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return st == EBB_ERR_UNSUPPORTED ? EXIT_RUNTIME : EXIT_USAGE;
    }
    /* a path that cannot be written is found now, not after the run */
    if ((o.outputs && ebb_file_check_writable(o.outputs, "--outputs") != EBB_OK) ||
        (o.save_weights && ebb_file_check_writable(o.save_weights, "--save-weights") != EBB_OK) ||
        (o.trace && ebb_file_check_writable(o.trace, "--trace") != EBB_OK))
        return fail_write();
    if ((rc = stdin_safetensors(&o.inputs)) || (rc = stdin_safetensors(&o.weights)))
        return rc;
    ebb_safetensors *in_file = NULL;
    if (o.inputs && (st = ebb_safetensors_open(&in_file, o.inputs)) != EBB_OK)
        return ebb_cli_fail_status(st);

    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    ebb_model *m = NULL;
    ebb_tensor *inputs[MAX_INPUTS] = {0}, **outputs = NULL;
    double *times = NULL;
    ebb_file_out *tw = NULL;
    o.run_device = dev;
    o.measure_scratch = dev.type == EBB_DEVICE_CPU;
    rc = load_and_compile(&o, in_file, &s, &p, 0);
    if (rc)
        goto done;
    ebb_cli_warn_precision(o.precision ? o.precision : ebb_spec_precision(s), dev);
    /* before anything large is allocated: parameters, inputs, the run */
    if (!o.force && (st = ebb_plan_check_fits(p, dev, NULL, input_bytes(p), NULL)) != EBB_OK) {
        fprintf(stderr, "ebb: %s; --force runs it anyway\n", ebb_errmsg());
        rc = EXIT_RUNTIME;
        goto done;
    }
    int n_in = ebb_plan_input_count(p), n_out = ebb_plan_output_count(p);
    outputs = calloc((size_t)n_out, sizeof *outputs);
    times = calloc((size_t)o.repeat, sizeof *times);
    if (!outputs || !times) {
        rc = ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
        goto done;
    }
    ebb_model_load_options lo = {.strict_finite = o.strict_finite,
                                 .nonfinite = warn_nonfinite,
                                 .user = "parameter",
                                 .non_strict = o.non_strict,
                                 .mismatch = warn_mismatch,
                                 .damaged = o.non_strict ? warn_damaged : NULL};
    if ((st = ebb_model_new(&m, p, dev, o.seed)) != EBB_OK ||
        (o.weights && (st = ebb_model_load_ex(m, o.weights, &lo)) != EBB_OK)) {
        rc = ebb_cli_fail_status(st);
        goto done;
    }
    if ((rc = make_inputs(&o, p, in_file, dev, inputs)))
        goto done;
    ebb_cli_trace to = {.plan = p};
    if (o.trace) {
        if (ebb_file_begin(&tw, o.trace, "--trace") != EBB_OK) {
            rc = fail_write();
            goto done;
        }
        to.f = ebb_file_stream(tw);
    }
    ebb_run_stats stats = {0}, over = {.over_step = -1};
    int64_t peak = 0;
    for (int r = 0; r < o.repeat; r++) {
        for (int k = 0; k < n_out; k++) {
            ebb_tensor_free(outputs[k]);
            outputs[k] = NULL;
        }
        ebb_run_options ro = {.trace = (tw && r == 0) ? ebb_cli_trace_step : NULL,
                              .trace_user = &to};
        st = ebb_run_ex(p, m, inputs, outputs, &ro, &stats);
        if (st != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
        times[r] = stats.seconds;
        if (stats.measured_peak_bytes > peak)
            peak = stats.measured_peak_bytes;
        if (over.over_step < 0 && stats.over_step >= 0)
            over = stats;
    }
    if (over.over_step < 0)
        over = stats;
    if (o.cuda_graph && (rc = time_replays(p, m, inputs, outputs, n_out, o.repeat, dev, times)))
        goto done;
    if (dev.type == EBB_DEVICE_CUDA) {
        ebb_memory_stats ms;
        if (ebb_memory_stats_get(dev, &ms) == EBB_OK &&
            ms.reserved_bytes > 2 * ms.peak_bytes + (64 << 20))
            fprintf(stderr,
                    "ebb: warning: the CUDA caching allocator reserves %lld bytes for a peak of "
                    "%lld allocated; cached blocks, not live tensors, hold the difference\n",
                    (long long)ms.reserved_bytes, (long long)ms.peak_bytes);
    }
    char dn_trace[32];
    if (tw)
        fprintf(to.f,
                "{\"summary\": {\"steps\": %lld, \"peak_bytes\": %lld, \"planned_peak_bytes\": "
                "%lld, \"peak_kind\": \"%s\", \"live_tensors_after\": %lld, \"device\": \"%s\"}}\n",
                (long long)to.steps, (long long)peak, (long long)ebb_plan_device_peak_bytes(p, dev),
                ebb_plan_peak_is_bound_on(p, dev) ? "bound" : "exact",
                (long long)(ebb_tensor_live_count() - n_in - n_out - ebb_model_param_count(m)),
                ebb_device_str(dev, dn_trace, sizeof dn_trace));
    for (int k = 0; k < n_out; k++)
        print_summary(ebb_plan_output_name(p, k), outputs[k]);
    qsort(times, (size_t)o.repeat, sizeof *times, cmp_double);
    print_peak(p, dev, peak);
    if ((rc = ebb_cli_check_over(p, &over, peak, o.strict_memory, NULL)))
        goto done;
    print_time(dev, times, o.repeat, o.cuda_graph);
    /* what was printed goes out before a file that may be stdout itself */
    fflush(stdout);
    if (tw) {
        st = ebb_file_commit(tw);
        tw = NULL;
        if (st != EBB_OK) {
            rc = fail_write();
            goto done;
        }
    }
    if (o.outputs && (rc = write_outputs(o.outputs, p, outputs, n_out)))
        goto done;
    if (o.save_weights && (st = ebb_model_save(m, o.save_weights)) != EBB_OK)
        rc = st == EBB_ERR_NOMEM ? ebb_cli_fail_status(st) : fail_write();
done:
    ebb_file_abort(tw); /* a failed run leaves the old trace, if any, as it was */
    for (int i = 0; i < MAX_INPUTS; i++)
        ebb_tensor_free(inputs[i]);
    if (outputs)
        for (int k = 0; k < ebb_plan_output_count(p); k++)
            ebb_tensor_free(outputs[k]);
    free(outputs);
    free(times);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_spec_free(s);
    ebb_safetensors_close(in_file);
    return rc;
}
