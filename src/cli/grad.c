/* `ebb grad`: a training step's loss and gradients, updating nothing. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_grad[] =
    "usage: ebb grad SPEC --inputs X.safetensors --grads G.safetensors [--weights W.safetensors]\n"
    "                [-i NAME=DIMS]... [-p PARAM=N]... [--loss NAME] [--trace T.jsonl]\n"
    "                [--device cpu|cuda[:N]] [--seed N] [--memory-budget SIZE]\n"
    "                [--strict-memory]\n"
    "\n"
    "Runs the spec's training step without updating anything: the forward, the loss\n"
    "against the targets, and the backward. Writes one gradient per trained parameter,\n"
    "named like the parameter, and prints the loss and the measured and planned peak.\n"
    "\n";

const cli_flag ebb_cli_grad_flags[] = {
    FLAG_PATH("inputs", "FILE", options, inputs, "the inputs and the targets, by name (required)"),
    FLAG_PATH("grads", "FILE", options, grads, "where the gradients go (required)"),
    FLAG_PATH("weights", "FILE", options, weights,
              "load parameters by name (default: seeded initialisation)"),
    SHAPE_FLAG("NAME=DIMS", "input shape, or SYMBOL=N, when the file does not give it"),
    BATCH_FLAG,
    PARAM_FLAG,
    FLAG_PATH("loss", "NAME", options, loss, "this loss op instead of the spec's `loss:`"),
    FLAG_PATH("trace", "FILE", options, trace,
              "one JSON object per executed step, backward steps included"),
    FLAG_PATH("device", "D", options, device,
              "cpu, cuda or cuda:N (default: cuda when available, else cpu)"),
    SEED_FLAG(options, seed, "seed for parameters and dropout (default 0)"),
    FLAG_ROW(0, "memory-budget", "SIZE", cli_set_budget, options, memory_budget,
             "recompute forward values in the backward to fit SIZE (64MiB,\n"
             "or `least`);\n"
             "the gradients are the same"),
    STRICT_MEMORY_FLAG,
    PRECISION_FLAG(options, precision),
    COMMON_FLAGS,
    END_OF_OPTIONS_HELP,
    FLAG_END,
};

const char ebb_cli_usage_grad_tail[] = "";

int ebb_cli_grad(const command *self, int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, self, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (!o.inputs || !o.grads)
        return ebb_cli_usage_error(ebb_cli_usage_grad, "%s", !o.inputs ? "--inputs is required (the inputs and "
                                                         "the targets, by name)"
                                                       : "--grads is required");
    o.train = 1;
    o.grads_only = 1;
    ebb_device dev = ebb_device_default();
    ebb_status st;
    if (o.device && (st = ebb_device_parse(&dev, o.device)) != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return st == EBB_ERR_UNSUPPORTED ? EXIT_RUNTIME : EXIT_USAGE;
    }
    if (ebb_file_check_writable(o.grads, "--grads") != EBB_OK ||
        (o.trace && ebb_file_check_writable(o.trace, "--trace") != EBB_OK))
        return fail_write();
    if ((rc = stdin_safetensors(&o.inputs)) || (rc = stdin_safetensors(&o.weights)))
        return rc;
    ebb_safetensors *in_file = NULL;
    if ((st = ebb_safetensors_open(&in_file, o.inputs)) != EBB_OK)
        return ebb_cli_fail_status(st);
    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    ebb_model *m = NULL;
    ebb_tensor *inputs[MAX_INPUTS] = {0}, **grads = NULL;
    ebb_file_out *tw = NULL;
    o.run_device = dev;
    o.measure_scratch = dev.type == EBB_DEVICE_CPU;
    rc = load_and_compile(&o, in_file, &s, &p, 0);
    if (rc)
        goto done;
    ebb_cli_warn_precision(o.precision ? o.precision : ebb_spec_precision(s), dev);
    int n_in = ebb_plan_input_count(p);
    if ((st = ebb_model_new(&m, p, dev, o.seed)) != EBB_OK ||
        (o.weights && (st = ebb_model_load(m, o.weights)) != EBB_OK)) {
        rc = ebb_cli_fail_status(st);
        goto done;
    }
    /* the inputs, then the targets: every one from the file */
    for (int i = 0; i < n_in && i < MAX_INPUTS; i++) {
        const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_input_slot(p, i));
        st = ebb_safetensors_dtype_str(in_file, v->name)
                 ? ebb_safetensors_load(&inputs[i], in_file, v->name, dev)
                 : ebb_error_set(EBB_ERR_ARG, "%s: no tensor named '%s' (%s of %s)", o.inputs,
                                 v->name,
                                 i < n_in - ebb_plan_target_count(p) ? "an input" : "a target",
                                 o.spec);
        if (st != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
    }
    int n_params = ebb_model_param_count(m);
    grads = calloc((size_t)n_params + 1, sizeof *grads);
    if (!grads) {
        rc = ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
        goto done;
    }
    ebb_cli_trace to = {.plan = p};
    if (o.trace) {
        if (ebb_file_begin(&tw, o.trace, "--trace") != EBB_OK) {
            rc = fail_write();
            goto done;
        }
        to.f = ebb_file_stream(tw);
    }
    int n_targets = ebb_plan_target_count(p);
    ebb_run_options ro = {.trace = tw ? ebb_cli_trace_step : NULL, .trace_user = &to,
                          .seed = o.seed};
    ebb_run_stats stats = {0};
    double loss = 0;
    st = ebb_grad_ex(p, m, inputs, inputs + (n_in - n_targets), &loss, grads, &ro, &stats);
    if (st != EBB_OK) {
        rc = ebb_cli_fail_status(ebb_spec_annotate_error(s, st));
        goto done;
    }
    int64_t planned = ebb_plan_device_peak_bytes(p, dev);
    /* a step over its plan: said before anything is written, which
     * --strict-memory then stops */
    if ((rc = ebb_cli_check_over(p, &stats, stats.measured_peak_bytes, o.strict_memory, NULL)))
        goto done;
    char dn[32];
    if (tw)
        fprintf(to.f,
                "{\"summary\": {\"steps\": %lld, \"peak_bytes\": %lld, \"planned_peak_bytes\": "
                "%lld, \"peak_kind\": \"%s\", \"loss\": %.9g, \"device\": \"%s\"}}\n",
                (long long)to.steps, (long long)stats.measured_peak_bytes, (long long)planned,
                ebb_plan_peak_is_bound_on(p, dev) ? "bound" : "exact", loss,
                ebb_device_str(dev, dn, sizeof dn));
    /* the gradients, named like their parameters */
    const char **names = calloc((size_t)n_params + 1, sizeof *names);
    ebb_tensor **ts = calloc((size_t)n_params + 1, sizeof *ts);
    int n = 0;
    for (int i = 0; names && ts && i < n_params; i++)
        if (grads[i]) {
            names[n] = ebb_model_param_name(m, i);
            ts[n++] = grads[i];
        }
    if (!names || !ts)
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    else
        st = ebb_safetensors_write(o.grads, names, ts, n);
    free(names);
    free(ts);
    if (st != EBB_OK) {
        rc = st == EBB_ERR_NOMEM ? ebb_cli_fail_status(st) : fail_write();
        goto done;
    }
    char mb[32], pb[32];
    ebb_bytes_str(stats.measured_peak_bytes, mb, sizeof mb);
    ebb_bytes_str(planned, pb, sizeof pb);
    printf("loss %.6g\n", loss);
    printf("%d gradients written to %s\n", n, o.grads);
    printf("peak intermediate bytes: measured %lld (%s), planned %lld (%s, %s)\n",
           (long long)stats.measured_peak_bytes, mb, (long long)planned, pb,
           ebb_plan_peak_is_bound_on(p, dev) ? "upper bound" : "exact");
    fflush(stdout);
    if (tw) {
        st = ebb_file_commit(tw);
        tw = NULL;
        if (st != EBB_OK)
            rc = fail_write();
    }
done:
    ebb_file_abort(tw);
    for (int i = 0; i < MAX_INPUTS; i++)
        ebb_tensor_free(inputs[i]);
    for (int i = 0; grads && i < ebb_model_param_count(m); i++)
        ebb_tensor_free(grads[i]);
    free(grads);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_spec_free(s);
    ebb_safetensors_close(in_file);
    return rc;
}

/* What remains of stdout goes out now, so that a failure to write it is
 * seen: "ebb: write error: ..." and exit 3, except a reader that went away
 * (a closed pipe, `ebb plan --json | head -c 10`): the reader has what it
 * wanted, so that exits 141 in silence, the status a shell reports for
 * `git log | head`. */
