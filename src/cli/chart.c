/* `ebb chart`: the plan's memory over its steps as SVG, a run's trace over it. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_chart[] =
    "usage: ebb chart SPEC [-i NAME=DIMS]... [-p PARAM=N]... [--keep-all] [--trace T.jsonl]\n"
    "                 [--train [--loss NAME] [--optimizer KIND] [--grads-only]\n"
    "                 [--clip-grad-norm X] [--clip-grad-value X] [--no-decay PATTERN]...\n"
    "                 [--loss-scale S] [--accumulate N] [--weight-copies HOW]\n"
    "                 [--data-parallel N [--bucket-size SIZE] [--overlap] [--zero [--rank R]]]]\n"
    "                 [--memory-budget SIZE]\n"
    "                 [-o FILE.svg]\n"
    "\n";

const cli_flag ebb_cli_chart_flags[] = {
    SHAPE_FLAG("NAME=DIMS", "input shape, or SYMBOL=N (symbolic dimensions default to 1)"),
    BATCH_FLAG,
    PARAM_FLAG,
    FLAG_SWITCH("keep-all", options, keep_all, "chart the plan compiled without freeing, to compare"),
    FLAG_SWITCH("train", options, train,
                "chart a training step: forward, loss, backward and updates,\n"
                "each shaded; the activations kept for the backward outlined"),
    LOSS_OPTIMIZER_FLAGS,
    FLAG_SWITCH("grads-only", options, grads_only,
                "with --train: the step `ebb grad` runs (gradients handed out,\n"
                "no updates), to chart `ebb grad --trace`"),
    CLIP_FLAGS,
    FLAG_ROW(0, "memory-budget", "SIZE", cli_set_budget, options, memory_budget,
             "chart the step that fits SIZE by recomputing (64MiB)"),
    FLAG_PATH("trace", "FILE", options, trace,
              "draw the measured bytes of `ebb run --trace FILE` (or `ebb grad\n"
              "--trace FILE`) over the plan (run with the same -i, -p and\n"
              "--keep-all)"),
    {'o', NULL, "FILE", cli_set_path, offsetof(options, out_file), 0,
     "write the SVG to FILE (default: stdout); replaced atomically,\n"
     "a device written into", NULL},
    PRECISION_FLAG(options, precision),
    COMMON_FLAGS,
    END_OF_OPTIONS_HELP,
    FLAG_END,
};

const char ebb_cli_usage_chart_tail[] =
    "\n"
    "Each value is a band from the step that makes it to the step that frees it, as\n"
    "tall as its bytes; the planned peak is a labelled line. A SPEC of - is read\n"
    "from standard input.\n";

/* A whole-number field of a trace line. */
static int trace_int(const cJSON *line, const char *key, int64_t *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(line, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > 9007199254740992.0)
        return -1;
    *out = (int64_t)it->valuedouble;
    return 0;
}

/* Reads what `ebb run --trace` wrote for plan p into tr (its samples are
 * new, the caller frees them). Each step line must be the plan's step of
 * that index, and the summary's planned peak the plan's, so that a trace of
 * another plan, or of this spec run with other shapes, is refused rather
 * than drawn over the wrong chart. */
static ebb_status read_trace(const char *path, const ebb_plan *p, ebb_chart_trace *tr) {
    memset(tr, 0, sizeof *tr);
    tr->device = ebb_device_cpu();
    int fd = -1;
    int64_t size = 0;
    ebb_status st = ebb_file_open_read(&fd, &size, path, "--trace");
    if (st != EBB_OK)
        return st;
    size_t cap = (size_t)size + 1, len = 0;
    char *text = malloc(cap);
    for (;;) {
        if (!text) {
            close(fd);
            return ebb_error_set(EBB_ERR_NOMEM, "--trace: out of memory reading '%s'", path);
        }
        if (len + 1 == cap) { /* the file grew while being read */
            char *more = realloc(text, cap * 2);
            if (!more)
                free(text);
            text = more;
            cap *= 2;
            continue;
        }
        ssize_t n = read(fd, text + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            free(text);
            close(fd);
            return ebb_error_set(EBB_ERR_IO, "--trace: cannot read '%s': %s", path, strerror(err));
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    text[len] = '\0';
    ebb_chart_sample *samples = NULL;
    int n_samples = 0, cap_samples = 0, line_no = 0, have_summary = 0, cuda = 0;
    int64_t planned = 0;
    st = EBB_OK;
    for (char *line = text; line < text + len && st == EBB_OK;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        size_t ll = end ? (size_t)(end - line) : (size_t)(text + len - line);
        char *next = line + ll + 1;
        line_no++;
        if (ll == 0) {
            line = next;
            continue;
        }
        cJSON *j = cJSON_ParseWithLength(line, ll);
        const cJSON *summary = cJSON_GetObjectItemCaseSensitive(j, "summary");
        int64_t step = 0, live = 0, peak = 0;
        if (!cJSON_IsObject(j)) {
            st = ebb_error_set(EBB_ERR_ARG, "%s:%d: not a JSON object (a trace from `ebb run "
                                            "--trace` has one per line)", path, line_no);
        } else if (have_summary) {
            st = ebb_error_set(EBB_ERR_ARG, "%s:%d: a line after the summary", path, line_no);
        } else if (summary) {
            const cJSON *dev = cJSON_GetObjectItemCaseSensitive(summary, "device");
            have_summary = 1;
            if (trace_int(summary, "planned_peak_bytes", &planned) != 0)
                st = ebb_error_set(EBB_ERR_ARG, "%s:%d: the summary has no planned_peak_bytes",
                                   path, line_no);
            /* traces written before the summary named the device: CUDA is
             * told by its rounded planned peak */
            cuda = cJSON_IsString(dev) ? !strncmp(dev->valuestring, "cuda", 4)
                                       : planned != ebb_plan_peak_bytes(p, NULL) &&
                                             planned == ebb_plan_device_peak_bytes(
                                                            p, ebb_device_cuda(0));
        } else if (trace_int(j, "step", &step) != 0 || trace_int(j, "live_bytes", &live) != 0 ||
                   trace_int(j, "peak_bytes", &peak) != 0) {
            st = ebb_error_set(EBB_ERR_ARG, "%s:%d: a step line needs whole-number step, "
                                            "live_bytes and peak_bytes", path, line_no);
        } else if (step < 0 || step >= ebb_plan_step_count(p)) {
            st = ebb_error_set(EBB_ERR_ARG, "%s:%d: step %lld, but plan %s has %d steps: a trace "
                                            "of another plan?", path, line_no, (long long)step,
                               ebb_plan_name(p), ebb_plan_step_count(p));
        } else {
            const ebb_plan_step *ps = ebb_plan_step_at(p, (int)step);
            const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "op");
            const cJSON *node = cJSON_GetObjectItemCaseSensitive(j, "node");
            if (!cJSON_IsString(op) || !cJSON_IsString(node) || strcmp(op->valuestring, ps->op) ||
                strcmp(node->valuestring, ps->node)) {
                st = ebb_error_set(EBB_ERR_ARG, "%s:%d: step %lld is %s %s in the plan, %s %s in "
                                                "the trace: a trace of another plan?",
                                   path, line_no, (long long)step, ps->op, ps->node,
                                   cJSON_IsString(op) ? op->valuestring : "(no op)",
                                   cJSON_IsString(node) ? node->valuestring : "(no node)");
            } else if (n_samples == INT32_MAX) {
                st = ebb_error_set(EBB_ERR_ARG, "%s: more than %d step lines", path, INT32_MAX);
            } else {
                if (n_samples == cap_samples) {
                    int nc = cap_samples ? (cap_samples > INT32_MAX / 2 ? INT32_MAX : 2 * cap_samples)
                                         : 256;
                    ebb_chart_sample *m = realloc(samples, (size_t)nc * sizeof *m);
                    if (!m)
                        st = ebb_error_set(EBB_ERR_NOMEM, "--trace: out of memory reading '%s'",
                                           path);
                    else {
                        samples = m;
                        cap_samples = nc;
                    }
                }
                if (st == EBB_OK)
                    samples[n_samples++] = (ebb_chart_sample){(int)step, live, peak};
            }
        }
        cJSON_Delete(j);
        line = next;
    }
    free(text);
    if (st == EBB_OK && n_samples == 0)
        st = ebb_error_set(EBB_ERR_ARG, "%s: no step lines (write one with `ebb run SPEC --trace "
                                        "%s`)", path, path);
    if (st == EBB_OK && have_summary) {
        ebb_device dev = cuda ? ebb_device_cuda(0) : ebb_device_cpu();
        int64_t mine = ebb_plan_device_peak_bytes(p, dev);
        if (planned != mine)
            st = ebb_error_set(EBB_ERR_ARG, "%s: the run was planned for a peak of %lld bytes, "
                                            "this plan's is %lld: chart with the -i, -p and "
                                            "--keep-all of the run", path, (long long)planned,
                               (long long)mine);
        tr->device = dev;
    }
    if (st != EBB_OK) {
        free(samples);
        return st;
    }
    tr->samples = samples;
    tr->n_samples = n_samples;
    return EBB_OK;
}

int ebb_cli_chart(const command *self, int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, self, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    /* the chart is SVG whatever the name says; a name that says otherwise
     * is a mistake */
    const char *base = o.out_file ? strrchr(o.out_file, '/') : NULL;
    const char *ext = o.out_file ? strrchr(base ? base : o.out_file, '.') : NULL;
    if (ext && strcmp(ext, ".svg"))
        return ebb_cli_usage_error(ebb_cli_usage_chart,
                           "-o %s: the chart is SVG; name it .svg (rsvg-convert makes a PNG of it)",
                           o.out_file);
    if (o.out_file && ebb_file_check_writable(o.out_file, "-o") != EBB_OK)
        return fail_write();
    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    ebb_chart_trace tr = {0};
    ebb_file_out *w = NULL;
    rc = load_and_compile(&o, NULL, &s, &p, 0);
    ebb_status st;
    if (!rc && o.trace && (st = read_trace(o.trace, p, &tr)) != EBB_OK)
        rc = ebb_cli_fail_status(st);
    if (!rc && o.out_file && ebb_file_begin(&w, o.out_file, "-o") != EBB_OK)
        rc = fail_write();
    if (!rc) {
        st = ebb_plan_chart_svg_ex(p, o.trace ? &tr : NULL, w ? ebb_file_stream(w) : stdout,
                                   ebb_spec_node_label, s);
        /* a write error on stdout is finish_stdout's to report (quietly for
         * a reader that went away); on a file, the writer's commit says it */
        if (st != EBB_OK && st != EBB_ERR_IO)
            rc = ebb_cli_fail_status(st);
        else if (w) {
            st = ebb_file_commit(w);
            w = NULL;
            if (st != EBB_OK)
                rc = fail_write();
        }
    }
    ebb_file_abort(w);
    free((void *)tr.samples);
    ebb_plan_free(p);
    ebb_spec_free(s);
    return rc;
}
