/* What the `ebb` command's files share: the check that no output replaces
 * an input, the options of the commands over a spec and their checks, input
 * shapes, and loading and compiling a spec. (Usage errors, exit codes and
 * the flag rows' parser are flags.c's.) */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

void ebb_cli_warn_precision(ebb_precision p, ebb_device d) {
    static int warned;
    ebb_cpu_info ci;
    if (warned || d.type != EBB_DEVICE_CPU || ebb_cpu_info_get(&ci) != EBB_OK)
        return;
    int bf16 = p == EBB_PRECISION_BF16, fp16 = p == EBB_PRECISION_FP16;
    if ((!bf16 || ci.bf16_native) && (!fp16 || ci.fp16_native))
        return;
    warned = 1;
    /* the figures: specs/fashion_cnn.yaml and specs/gpt.yaml's training
     * steps on an AVX2 EPYC (docs/training.md, "Mixed precision") */
    fprintf(stderr,
            "ebb: warning: --precision %s on a CPU without native %s arithmetic (oneDNN %s): "
            "the plan's bytes fall, but its time rises (bf16 ran 6x slower than fp32 on a CNN "
            "and 18x on gpt on an AVX2 CPU); fp32 is faster here\n",
            ebb_precision_name(p), bf16 ? "bfloat16" : "float16", ci.onednn);
}

int ebb_cli_check_over(const ebb_plan *p, const ebb_run_stats *stats, int64_t measured,
                       int strict, const char *when) {
    char over[32], planned[32];
    const char *kind = strict ? "error" : "warning";
    const char *tail = strict ? " (--strict-memory)"
                              : "; this is a bug in ebb, please report it with the spec";
    if (stats->over_step >= 0) {
        const ebb_plan_step *s = ebb_plan_step_at(p, stats->over_step);
        ebb_bytes_str(stats->over_bytes, over, sizeof over);
        ebb_bytes_str(s ? s->peak_bytes : 0, planned, sizeof planned);
        fprintf(stderr, "ebb: %s: step %d (%s, node %s) measured %s more than the plan's %s for "
                        "it%s%s%s\n",
                kind, stats->over_step, s ? s->op : "?", s ? s->node : "?", over, planned,
                when ? " " : "", when ? when : "", tail);
    } else if (measured > stats->planned_peak_bytes) {
        ebb_bytes_str(measured - stats->planned_peak_bytes, over, sizeof over);
        ebb_bytes_str(stats->planned_peak_bytes, planned, sizeof planned);
        fprintf(stderr, "ebb: %s: the run measured %s more than the plan's %s%s%s%s\n", kind, over,
                planned, when ? " " : "", when ? when : "", tail);
    } else {
        return 0;
    }
    return strict ? EXIT_RUNTIME : 0;
}

/* ---- outputs that would destroy inputs ------------------------------------ */

/* What a path is compared by: an existing regular file by its device and
 * inode (so links, hard links and other spellings of it meet); a name not
 * made yet by the real path of its directory and its last name, the file
 * the writer would create; nothing for what is written into as a stream
 * (a device, a pipe, /dev/stdout) or a path that does not resolve. */
typedef struct file_key {
    enum { KEY_NONE, KEY_FILE, KEY_NEW } kind;
    dev_t dev;
    ino_t ino;
    char path[PATH_MAX];
} file_key;

static int is_fd_path(const char *p) {
    return !strncmp(p, "/dev/std", 8) || !strncmp(p, "/dev/fd/", 8) ||
           (!strncmp(p, "/proc/", 6) && strstr(p, "/fd/"));
}

/* The name a path that does not exist would be created as: a dangling link
 * is followed, as the writer follows it. */
static void new_file_key(const char *path, file_key *k) {
    char cur[PATH_MAX], link[PATH_MAX], dir[PATH_MAX], real[PATH_MAX];
    snprintf(cur, sizeof cur, "%s", path);
    for (int hops = 0; hops < 40; hops++) {
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) break;
        link[n] = '\0';
        char *slash = strrchr(cur, '/');
        if (link[0] == '/' || !slash)
            snprintf(cur, sizeof cur, "%s", link);
        else
            snprintf(slash + 1, sizeof cur - (size_t)(slash + 1 - cur), "%s", link);
    }
    char *slash = strrchr(cur, '/');
    const char *base = slash ? slash + 1 : cur;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == cur)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - cur), cur);
    if (!*base || !realpath(dir, real) ||
        snprintf(k->path, sizeof k->path, "%s/%s", strcmp(real, "/") ? real : "", base) >=
            (int)sizeof k->path)
        return;
    k->kind = KEY_NEW;
}

static void file_key_of(const char *path, int output, file_key *k) {
    struct stat sb;
    k->kind = KEY_NONE;
    if (!strcmp(path, "-") || (output && is_fd_path(path))) {
        /* standard input read where it lies; an output stream is written into */
        if (!output && fstat(0, &sb) == 0 && S_ISREG(sb.st_mode))
            *k = (file_key){.kind = KEY_FILE, .dev = sb.st_dev, .ino = sb.st_ino};
        return;
    }
    if (stat(path, &sb) == 0) {
        if (S_ISREG(sb.st_mode))
            *k = (file_key){.kind = KEY_FILE, .dev = sb.st_dev, .ino = sb.st_ino};
    } else if (errno == ENOENT) {
        new_file_key(path, k);
    }
}

static int same_file(const file_key *a, const file_key *b) {
    if (a->kind != b->kind || a->kind == KEY_NONE) return 0;
    return a->kind == KEY_FILE ? a->dev == b->dev && a->ino == b->ino : !strcmp(a->path, b->path);
}

int ebb_cli_check_aliases(const char *const *list) {
    int n = 0;
    while (list[3 * n])
        n++;
    file_key *keys = calloc((size_t)n + 1, sizeof *keys);
    if (!keys) return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    for (int i = 0; i < n; i++)
        if (list[3 * i + 2])
            file_key_of(list[3 * i + 2], !strncmp(list[3 * i], "out", 3), &keys[i]);
    int rc = 0;
    for (int i = 0; !rc && i < n; i++) {
        const char *role = list[3 * i], *what = list[3 * i + 1], *path = list[3 * i + 2];
        for (int j = 0; strncmp(role, "out", 3) == 0 && !rc && j < n; j++) {
            int j_out = !strncmp(list[3 * j], "out", 3);
            if (j == i || (j_out && j > i) || !same_file(&keys[i], &keys[j]) ||
                (role[3] == '=' && !strcmp(role + 4, list[3 * j + 1])))
                continue;
            if (j_out)
                fprintf(stderr,
                        "ebb: %s %s and %s %s are the same file: one would replace the "
                        "other\n",
                        list[3 * j + 1], list[3 * j + 2], what, path);
            else
                fprintf(stderr,
                        "ebb: %s %s is the same file as %s %s: writing it would replace "
                        "what the command reads\n",
                        what, path, list[3 * j + 1], list[3 * j + 2]);
            rc = EXIT_USAGE;
        }
    }
    free(keys);
    return rc;
}

int fail_write(void) {
    fprintf(stderr, "ebb: %s\n", ebb_errmsg());
    return EXIT_RUNTIME;
}

static int add_spec(const command *c, void *opts, const char *arg) {
    options *o = opts;
    if (c->many)
        o->specs[o->n_specs++] = arg;
    else if (o->spec)
        return ebb_cli_usage_error(c->usage, "unexpected argument %s", arg);
    o->spec = o->spec ? o->spec : arg;
    return 0;
}

int cli_set_ranks(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    int64_t n = 0;
    if (cli_parse_int(v, 1, 4096, &n) != 0)
        return ebb_cli_usage_error(usage, "--data-parallel %s: expected 1 to 4096 ranks", v);
    *(int *)field = (int)n;
    return 0;
}

int cli_set_rank(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f;
    int64_t n = 0;
    if (cli_parse_int(v, 0, 4095, &n) != 0)
        return ebb_cli_usage_error(usage, "--rank %s: expected a rank, 0 to 4095", v);
    *(int *)field = (int)n;
    return 0;
}

/* What depends on several flags at once: 0 or a usage error. */
static int check_options(const command *c, const options *o) {
    const char *usage = c->usage;
    if (!o->spec)
        return ebb_cli_usage_error(usage, "%s", "missing SPEC");
    if (o->non_strict && !o->weights)
        return ebb_cli_usage_error(usage, "%s", "--non-strict applies to --weights, which is not given");
    if ((o->clip_norm > 0 || o->clip_value > 0 || o->loss_scale != 0 || o->parallel.world ||
         o->accumulate) &&
        (!o->train || o->grads_only))
        return ebb_cli_usage_error(usage, "%s",
                                   "--clip-grad-norm, --clip-grad-value, --loss-scale, "
                                   "--accumulate and --data-parallel apply to --train (a step "
                                   "with updates)");
    if (o->weight_copies_set && !o->train)
        return ebb_cli_usage_error(usage, "%s", "--weight-copies applies to --train");
    if (o->parallel.overlap && o->parallel.world < 2)
        return ebb_cli_usage_error(usage, "%s", "--overlap applies to --data-parallel N (2 or "
                                                "more)");
    if (o->parallel.zero && o->parallel.world < 2)
        return ebb_cli_usage_error(usage, "%s", "--zero shards the optimizer over the ranks of "
                                                "--data-parallel N (2 or more)");
    if (o->parallel.rank >= 0 && !o->parallel.zero)
        return ebb_cli_usage_error(usage, "%s", "--rank applies to --zero");
    if (o->parallel.rank >= o->parallel.world && o->parallel.zero) {
        char r[32];
        snprintf(r, sizeof r, "%d", o->parallel.rank);
        return ebb_cli_usage_error(usage, "--rank %s: not a rank of --data-parallel", r);
    }
    if (o->parallel.bucket_bytes && !o->parallel.world)
        return ebb_cli_usage_error(usage, "%s", "--bucket-size applies to --data-parallel");
    if ((o->loss || o->optimizer || o->grads_only) && !o->train && strcmp(c->name, "grad") != 0)
        return ebb_cli_usage_error(usage, "%s",
                           "--loss, --optimizer and --grads-only apply to --train, which is not "
                           "given");
    /* standard input can be read once */
    int from_stdin = (o->inputs && !strcmp(o->inputs, "-")) + (o->weights && !strcmp(o->weights, "-"));
    for (int i = 0; i < (c->many ? o->n_specs : 1); i++)
        from_stdin += !strcmp(c->many ? o->specs[i] : o->spec, "-");
    if (from_stdin > 1)
        return ebb_cli_usage_error(usage, "%s",
                           "standard input (-) can be read once: give it to one SPEC, --weights "
                           "or --inputs");
    /* no output may be an input's file, or another output's */
    const char *chart_trace = !strcmp(c->name, "chart") ? "in" : "out";
    const char *files[] = {"in",
                           "SPEC",
                           c->many ? NULL : o->spec,
                           "in",
                           "--weights",
                           o->weights,
                           "in",
                           "--inputs",
                           o->inputs,
                           chart_trace,
                           "--trace",
                           o->trace,
                           "out",
                           "--outputs",
                           o->outputs,
                           "out",
                           "--save-weights",
                           o->save_weights,
                           "out",
                           "--grads",
                           o->grads,
                           "out",
                           "-o",
                           o->out_file,
                           NULL};
    return ebb_cli_check_aliases(files);
}

/* Parses argv[1..] (argv[0] is the command's name); returns 0, -1 when help
 * was printed, or an exit code. */
int parse_options(int argc, char **argv, const command *c, options *o) {
    memset(o, 0, sizeof *o);
    o->repeat = 1;
    o->parallel.rank = -1;
    /* kept until exit: the command reads them to the end */
    static const char **specs;
    if (c->many && !(specs = calloc((size_t)argc + 1, sizeof *specs)))
        return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    o->specs = specs;
    int rc = cli_flags_parse(c, argc, argv, o, add_spec);
    return rc ? rc : check_options(c, o);
}

/* Dimensions written as the -i help says: positive decimal integers joined
 * by single commas, nothing else (no sign, no space, no empty entry).
 * Returns 0, 1 for malformed text, or 2 for more than EBB_MAX_DIMS. */
static int parse_dims(const char *text, ebb_shape *out) {
    memset(out, 0, sizeof *out);
    const char *p = text;
    for (;;) {
        if (*p < '0' || *p > '9')
            return 1;
        int64_t v = 0;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (v > (INT64_MAX - 9) / 10)
                return 1;
            v = v * 10 + (*p - '0');
        }
        if (v < 1)
            return 1;
        if (out->ndim == EBB_MAX_DIMS)
            return 2;
        out->dim[out->ndim++] = v;
        if (!*p)
            return 0;
        if (*p != ',')
            return 1;
        p++;
    }
}

/* "[batch, 64]": input i's shape as the spec declares it. */
static const char *declared_shape(const ebb_spec *s, int i, char *buf, size_t size) {
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ebb_spec_input_ndim(s, i) && at < size; d++) {
        const char *sym = NULL;
        int64_t v = ebb_spec_input_dim(s, i, d, &sym);
        at += v >= 0 ? (size_t)snprintf(buf + at, size - at, "%s%lld", d ? ", " : "", (long long)v)
                     : (size_t)snprintf(buf + at, size - at, "%s%s", d ? ", " : "", sym ? sym : "?");
    }
    if (at < size)
        snprintf(buf + at, size - at, "]");
    return buf;
}

/* The -i SYMBOL=N given for `sym`, or NULL. */
static const char *binding_for(const char *const *bindings, int n, const char *sym) {
    size_t len = strlen(sym);
    for (int b = 0; b < n; b++)
        if (!strncmp(bindings[b], sym, len) && bindings[b][len] == '=')
            return bindings[b];
    return NULL;
}

/* Whether name[0..len) is a symbolic dimension of one of the inputs. */
static int is_symbol(const ebb_spec *s, const char *name, size_t len) {
    for (int i = 0; i < ebb_spec_input_count(s); i++)
        for (int d = 0; d < ebb_spec_input_ndim(s, i); d++) {
            const char *sym = NULL;
            if (ebb_spec_input_dim(s, i, d, &sym) < 0 && sym && strlen(sym) == len &&
                !strncmp(sym, name, len))
                return 1;
        }
    return 0;
}

/* Input shapes from the spec, -i options and (for run) an inputs file. A
 * shape the user gave, directly or through a symbol, must agree with every
 * other source; what the user left out comes from the file, else is 1. */
/* The -i arguments, and --batch B as one more: SYMBOL=B for the symbolic
 * first dimension of the spec's first input (buf holds it). Returns 0 or an
 * exit code. */
static int shape_args(const ebb_spec *s, const options *o, const char **args, int *n, char *buf,
                      size_t size) {
    *n = 0;
    for (int k = 0; k < o->shapes.n; k++)
        args[(*n)++] = o->shapes.v[k];
    if (!o->batch)
        return 0;
    const char *sym = NULL;
    if (ebb_spec_input_count(s) < 1 || ebb_spec_input_ndim(s, 0) < 1 ||
        ebb_spec_input_dim(s, 0, 0, &sym) >= 0 || !sym) {
        fprintf(stderr,
                "ebb: --batch %llu: %s's first input has no symbolic first dimension (the "
                "batch) to set; give its shape with -i\n",
                (unsigned long long)o->batch, ebb_spec_file(s));
        return EXIT_SPEC;
    }
    if (*n == MAX_BINDINGS)
        return ebb_cli_usage_error(ebb_cli_usage_main, "%s", "too many -i options");
    snprintf(buf, size, "%s=%llu", sym, (unsigned long long)o->batch);
    args[(*n)++] = buf;
    return 0;
}

/* Input i's shape from the --inputs file, when the file holds it (*found):
 * checked against the spec's declaration and against `asked` (the -i that
 * set the input's shape, NULL: none; or one that bound a symbol of it), then
 * stored in *shape. Returns 0 or an exit code. */
static int shape_from_file(const ebb_spec *s, const options *o, const ebb_safetensors *inputs,
                           int i, const char *const *bindings, int n_bind, const char *asked,
                           ebb_shape *shape, int *found) {
    const char *name = ebb_spec_input_name(s, i);
    char a[128], b[128];
    const char *file_dtype = inputs ? ebb_safetensors_dtype_str(inputs, name) : NULL;
    ebb_shape fs;
    *found = file_dtype != NULL;
    if (!file_dtype)
        return 0;
    if (ebb_safetensors_find(inputs, name, NULL, &fs) != EBB_OK) {
        fprintf(stderr, "ebb: %s: input '%s' has dtype %s, which ebb does not support\n",
                o->inputs, name, file_dtype);
        return EXIT_SPEC;
    }
    int agrees = fs.ndim == ebb_spec_input_ndim(s, i);
    for (int d = 0; agrees && d < fs.ndim; d++) {
        int64_t fixed = ebb_spec_input_dim(s, i, d, NULL);
        agrees = fixed < 0 || fixed == fs.dim[d];
    }
    if (!agrees) {
        fprintf(stderr, "ebb: %s: input '%s' is %s, but %s declares it %s\n", o->inputs, name,
                ebb_shape_str(&fs, a, sizeof a), ebb_spec_file(s),
                declared_shape(s, i, b, sizeof b));
        return EXIT_SPEC;
    }
    /* the file's shape is used unless the user asked for another */
    for (int d = 0; !asked && d < fs.ndim; d++) {
        const char *sym = NULL;
        ebb_spec_input_dim(s, i, d, &sym);
        if (sym && binding_for(bindings, n_bind, sym) && shape->dim[d] != fs.dim[d])
            asked = binding_for(bindings, n_bind, sym);
    }
    if (asked && !ebb_shape_equal(&fs, shape)) {
        fprintf(stderr, "ebb: %s: input '%s' is %s, but -i %s compiles the plan for %s\n",
                o->inputs, name, ebb_shape_str(&fs, a, sizeof a), asked,
                ebb_shape_str(shape, b, sizeof b));
        return EXIT_SPEC;
    }
    *shape = fs;
    return 0;
}

static int resolve_shapes(const ebb_spec *s, const options *o, const ebb_safetensors *inputs,
                          ebb_shape *shapes, int quiet) {
    int n = ebb_spec_input_count(s);
    if (n > MAX_INPUTS) {
        fprintf(stderr, "ebb: %s has %d inputs (at most %d)\n", ebb_spec_file(s), n, MAX_INPUTS);
        return EXIT_SPEC;
    }
    const char *args[MAX_BINDINGS + 1];
    char batch_arg[96];
    int n_args = 0, rc = shape_args(s, o, args, &n_args, batch_arg, sizeof batch_arg);
    if (rc)
        return rc;
    const char *bindings[MAX_BINDINGS + 1];
    int n_bind = 0, explicit_shape[MAX_INPUTS] = {0};
    const char *explicit_arg[MAX_INPUTS] = {0};
    ebb_shape given[MAX_INPUTS];
    for (int k = 0; k < n_args; k++) {
        const char *arg = args[k], *eq = strchr(arg, '=');
        if (!eq || eq == arg || !eq[1]) {
            fprintf(stderr, "ebb: -i %s: expected NAME=D0,D1,... or SYMBOL=N\n", arg);
            return EXIT_USAGE;
        }
        for (int j = 0; j < k; j++) {
            const char *prev = args[j], *peq = strchr(prev, '=');
            if (peq && peq - prev == eq - arg && !strncmp(prev, arg, (size_t)(eq - arg))) {
                if (arg == batch_arg)
                    fprintf(stderr, "ebb: --batch %llu and -i %s both set '%.*s'\n",
                            (unsigned long long)o->batch, prev, (int)(eq - arg), arg);
                else
                    fprintf(stderr, "ebb: -i %.*s given twice (%s, %s)\n", (int)(eq - arg), arg,
                            prev, arg);
                return EXIT_USAGE;
            }
        }
        int input = -1;
        for (int i = 0; i < n; i++)
            if (strlen(ebb_spec_input_name(s, i)) == (size_t)(eq - arg) &&
                !strncmp(ebb_spec_input_name(s, i), arg, (size_t)(eq - arg)))
                input = i;
        ebb_shape sh;
        int bad = parse_dims(eq + 1, &sh);
        if (bad == 2) {
            fprintf(stderr, "ebb: -i %s: more than %d dimensions (ebb's limit)\n", arg,
                    EBB_MAX_DIMS);
            return EXIT_USAGE;
        }
        if (input < 0 && (bad || sh.ndim != 1) && is_symbol(s, arg, (size_t)(eq - arg))) {
            fprintf(stderr,
                    "ebb: -i %s: a symbolic dimension takes one positive integer (no sign, "
                    "space or comma)\n",
                    arg);
            return EXIT_USAGE;
        }
        if (input < 0 && !bad && sh.ndim != 1) {
            fprintf(stderr, "ebb: -i %s: %s has no input named '%.*s'\n", arg, ebb_spec_file(s),
                    (int)(eq - arg), arg);
            return EXIT_USAGE;
        }
        if (bad) {
            fprintf(stderr,
                    "ebb: -i %s: dimensions must be positive integers separated by commas "
                    "(no signs, spaces or empty entries)\n",
                    arg);
            return EXIT_USAGE;
        }
        if (input < 0) {
            bindings[n_bind++] = arg; /* a symbolic dimension */
            continue;
        }
        int want = ebb_spec_input_ndim(s, input);
        if (sh.ndim != want) {
            fprintf(stderr, "ebb: -i %s: input '%s' has %d dimensions in %s, %d given\n", arg,
                    ebb_spec_input_name(s, input), want, ebb_spec_file(s), sh.ndim);
            return EXIT_SPEC;
        }
        for (int d = 0; d < want; d++) {
            int64_t fixed = ebb_spec_input_dim(s, input, d, NULL);
            if (fixed >= 0 && fixed != sh.dim[d]) {
                fprintf(stderr, "ebb: -i %s: dimension %d of input '%s' is %lld in %s\n", arg, d,
                        ebb_spec_input_name(s, input), (long long)fixed, ebb_spec_file(s));
                return EXIT_SPEC;
            }
        }
        given[input] = sh;
        explicit_shape[input] = 1;
        explicit_arg[input] = arg;
    }
    ebb_status st = ebb_spec_resolve_shapes(s, bindings, n_bind, shapes, MAX_INPUTS);
    if (st != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_USAGE;
    }
    for (int i = 0; i < n; i++) {
        const char *name = ebb_spec_input_name(s, i);
        /* a symbol bound with -i must not be contradicted by a shape given
         * for an input that uses it: one of the two would be ignored */
        for (int d = 0; explicit_shape[i] && d < given[i].ndim; d++) {
            const char *sym = NULL;
            ebb_spec_input_dim(s, i, d, &sym);
            const char *bind = sym ? binding_for(bindings, n_bind, sym) : NULL;
            if (bind && given[i].dim[d] != shapes[i].dim[d]) {
                fprintf(stderr,
                        "ebb: -i %s contradicts -i %s: dimension %d of input '%s' is '%s'\n",
                        bind, explicit_arg[i], d, name, sym);
                return EXIT_USAGE;
            }
        }
        if (explicit_shape[i])
            shapes[i] = given[i];
        int found = 0, rc2 = shape_from_file(s, o, inputs, i, bindings, n_bind, explicit_arg[i],
                                             &shapes[i], &found);
        if (rc2)
            return rc2;
        if (!found && !explicit_shape[i] && !quiet) {
            for (int d = 0; d < ebb_spec_input_ndim(s, i); d++) {
                const char *sym = NULL;
                if (ebb_spec_input_dim(s, i, d, &sym) < 0 && sym &&
                    !binding_for(bindings, n_bind, sym))
                    fprintf(stderr,
                            "ebb: note: symbolic dimension '%s' of input '%s' defaults to 1 "
                            "(set it with -i %s=N)\n",
                            sym, name, sym);
            }
        }
    }
    return 0;
}

/* The spec must be a regular file: a FIFO would block its reader forever
 * and a directory reads as an unhelpful error. Opened without blocking. */
static int spec_file_ok(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 1; /* the loader says why, as for any file it cannot open */
    struct stat sb;
    int ok = fstat(fd, &sb) != 0 || S_ISREG(sb.st_mode);
    close(fd);
    if (!ok)
        ebb_error_set(EBB_ERR_IO, "%s: is %s, not a spec file", path,
                      ebb_file_kind_name(sb.st_mode));
    return ok;
}

/* A spec given as `-`: standard input, read to its end (one byte past the
 * loader's limit is enough for it to say the spec is too long). */
static ebb_status load_spec_stdin(ebb_spec **spec, const ebb_spec_options *so) {
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    for (;;) {
        if (!text)
            return ebb_error_set(EBB_ERR_NOMEM, "out of memory reading standard input");
        if (len == cap) {
            char *more = cap > EBB_SPEC_MAX_BYTES ? NULL : realloc(text, cap * 2);
            if (!more)
                break; /* past the limit: the loader refuses it by its length */
            text = more;
            cap *= 2;
        }
        ssize_t n = read(0, text + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            free(text);
            return ebb_error_set(EBB_ERR_IO, "%s: cannot read standard input: %s",
                                 STDIN_SPEC_NAME, strerror(err));
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    ebb_status st = ebb_spec_load_string_ex(spec, text, len, STDIN_SPEC_NAME, so);
    free(text);
    return st;
}

ebb_status load_spec_path(const char *path, const options *o, ebb_spec **spec) {
    ebb_spec_options so = {.params = o->params.v, .n_params = o->params.n};
    if (!strcmp(path, "-"))
        return load_spec_stdin(spec, &so);
    if (!spec_file_ok(path))
        return ebb_errcode();
    return ebb_spec_load_ex(spec, path, &so);
}

ebb_status load_spec(const options *o, ebb_spec **spec) {
    return load_spec_path(o->spec, o, spec);
}

/* A safetensors file given as `-`. The reader needs a regular file (it
 * reads each tensor at its offset), so a pipe is first copied into an
 * anonymous file in memory, which then becomes standard input; either way
 * the file is read as /dev/stdin, the name messages give it. */
int stdin_safetensors(const char **path) {
    if (!*path || strcmp(*path, "-"))
        return 0;
    *path = STDIN_PATH;
    struct stat sb;
    if (fstat(0, &sb) == 0 && S_ISREG(sb.st_mode))
        return 0;
    int fd = memfd_create("ebb-stdin", MFD_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "ebb: cannot hold standard input in memory: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "ebb: cannot read standard input: %s\n", strerror(errno));
            close(fd);
            return EXIT_SPEC;
        }
        if (n == 0)
            break;
        for (ssize_t at = 0; at < n;) {
            ssize_t w = write(fd, buf + at, (size_t)(n - at));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                fprintf(stderr, "ebb: cannot hold standard input in memory: %s\n",
                        strerror(errno));
                close(fd);
                return EXIT_RUNTIME;
            }
            at += w;
        }
    }
    int moved = dup2(fd, 0);
    close(fd);
    if (moved < 0) {
        fprintf(stderr, "ebb: cannot replace standard input: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    return 0;
}

/* A training compile's options: the targets' shapes and dtypes from the
 * inputs file where it has them, else from the spec with the -i bindings;
 * the loss and the optimizer from the command line. */
static int train_options(const ebb_spec *s, const options *o, const ebb_safetensors *inputs,
                         ebb_shape *shapes, ebb_dtype *dtypes, ebb_train_options *t) {
    int n = ebb_spec_target_count(s);
    if (n == 0) {
        fprintf(stderr,
                "ebb: %s declares no `targets:`; a training step compares the output with "
                "them (see docs/spec-format.md)\n",
                ebb_spec_file(s));
        return EXIT_SPEC;
    }
    if (n > MAX_INPUTS) {
        fprintf(stderr, "ebb: %s has %d targets (at most %d)\n", ebb_spec_file(s), n, MAX_INPUTS);
        return EXIT_SPEC;
    }
    /* -i arguments that name no input are symbol bindings */
    const char *args[MAX_BINDINGS + 1], *bindings[MAX_BINDINGS + 1];
    char batch_arg[96];
    int n_args = 0, n_bind = 0, rc = shape_args(s, o, args, &n_args, batch_arg, sizeof batch_arg);
    if (rc)
        return rc;
    for (int k = 0; k < n_args; k++) {
        const char *arg = args[k], *eq = strchr(arg, '=');
        int input = 0;
        for (int i = 0; eq && i < ebb_spec_input_count(s); i++)
            input |= strlen(ebb_spec_input_name(s, i)) == (size_t)(eq - arg) &&
                     !strncmp(ebb_spec_input_name(s, i), arg, (size_t)(eq - arg));
        if (eq && !input)
            bindings[n_bind++] = arg;
    }
    ebb_status st = ebb_spec_resolve_target_shapes(s, bindings, n_bind, shapes, MAX_INPUTS);
    if (st != EBB_OK)
        return ebb_cli_fail_status(st);
    for (int i = 0; i < n; i++) {
        ebb_dtype dt = EBB_FLOAT32;
        if (!ebb_spec_target_dtype(s, i, &dt))
            dt = EBB_FLOAT32;
        dtypes[i] = dt;
        if (inputs && ebb_safetensors_dtype_str(inputs, ebb_spec_target_name(s, i))) {
            st = ebb_safetensors_find(inputs, ebb_spec_target_name(s, i), &dtypes[i], &shapes[i]);
            if (st != EBB_OK)
                return ebb_cli_fail_status(st);
        }
    }
    *t = (ebb_train_options){.target_shapes = shapes, .n_target_shapes = n,
                             .target_dtypes = dtypes, .loss = o->loss,
                             .grads_only = o->grads_only, .clip_grad_norm = o->clip_norm,
                             .clip_grad_value = o->clip_value, .no_decay = o->no_decay.v,
                             .n_no_decay = o->no_decay.n};
    /* as ebb train: on with fp16 unless --loss-scale none */
    ebb_precision pr = o->precision ? o->precision : ebb_spec_precision(s);
    if (o->weight_copies != EBB_LOW_COPIES_AUTO && pr != EBB_PRECISION_BF16 &&
        pr != EBB_PRECISION_FP16) {
        fprintf(stderr, "ebb: --weight-copies keep or recast applies to a low precision "
                        "(--precision bf16 or fp16, or the spec's precision:)\n");
        return EXIT_USAGE;
    }
    t->accumulate = (int)o->accumulate;
    t->parallel = o->parallel;
    t->parallel.rank = o->parallel.zero && o->parallel.rank > 0 ? o->parallel.rank : 0;
    t->low_weight_copies = o->weight_copies;
    t->loss_scaling = !o->grads_only && (o->loss_scale > 0 ||
                                         (o->loss_scale == 0 && pr == EBB_PRECISION_FP16));
    t->optimizer.kind = EBB_ADAMW;
    if (o->optimizer) /* checked when the options were read */
        ebb_optimizer_kind_parse(&t->optimizer.kind, o->optimizer);
    return 0;
}

int load_and_compile(const options *o, const ebb_safetensors *inputs, ebb_spec **spec,
                            ebb_plan **plan, int quiet) {
    ebb_status st = load_spec(o, spec);
    if (st != EBB_OK)
        return ebb_cli_fail_status(st);
    ebb_shape shapes[MAX_INPUTS];
    int rc = resolve_shapes(*spec, o, inputs, shapes, quiet);
    if (rc)
        return rc;
    ebb_compile_options co = {.input_shapes = shapes,
                              .n_input_shapes = ebb_spec_input_count(*spec),
                              .keep_all = o->keep_all,
                              .memory_budget = o->memory_budget,
                              .device = o->run_device,
                              .measure_scratch = o->measure_scratch,
                              .precision = o->precision,
                              .kv_cache = o->kv_cache};
    ebb_shape target_shapes[MAX_INPUTS];
    ebb_dtype target_dtypes[MAX_INPUTS];
    ebb_train_options to = {0};
    if (o->train && (rc = train_options(*spec, o, inputs, target_shapes, target_dtypes, &to)))
        return rc;
    if (o->train)
        co.train = &to;
    st = ebb_spec_compile(plan, *spec, &co);
    return st == EBB_OK ? 0 : ebb_cli_fail_status(st);
}

int64_t param_elements(const ebb_plan *p) {
    int64_t n = 0;
    for (int i = 0; i < ebb_plan_param_count(p); i++)
        n += ebb_shape_numel(&ebb_plan_param_at(p, i, NULL)->shape);
    return n;
}
