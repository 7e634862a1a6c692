/* The flag rows' parser, help and completion list (flags.h), the setters
 * of the usual kinds of value, and what every command's parsing needs:
 * usage errors (with the nearest flag for an unknown one), exit codes for a
 * status, --threads. */
#define _GNU_SOURCE /* getopt_long */
#include "cli.h"

#define HELP_COLUMN 21 /* where a flag's help starts */

/* ---- usage errors and exit codes ---------------------------------------------- */

int ebb_cli_usage_error(const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, "ebb: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    /* one line where the options are, as git does: the mistake stays in
     * view (the command list without a command, which is short) */
    char cmd[32];
    if (usage == ebb_cli_usage_main || sscanf(usage, "usage: ebb %31s", cmd) != 1) {
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    fprintf(stderr, "try 'ebb help %s' for its usage and options\n", cmd);
    return EXIT_USAGE;
}

/* What PyTorch, Lightning and Hugging Face users type for a flag ebb spells
 * otherwise, one alias a line (underscores read as dashes): suggested
 * before the nearest spelling, where the command has that flag. */
static const struct {
    const char *alias, *flag;
} option_aliases[] = {
    {"learning-rate", "lr"},
    {"wd", "weight-decay"},
    {"batch-size", "batch"},
    {"bs", "batch"},
    {"per-device-train-batch-size", "batch"},
    {"num-epochs", "epochs"},
    {"max-epochs", "epochs"},
    {"num-train-epochs", "epochs"},
    {"max-steps", "steps"},
    {"num-steps", "steps"},
    {"total-steps", "steps"},
    {"grad-accum", "accumulate"},
    {"grad-accum-steps", "accumulate"},
    {"gradient-accumulation-steps", "accumulate"},
    {"accumulate-grad-batches", "accumulate"},
    {"gradient-clip", "clip-grad-norm"},
    {"gradient-clip-val", "clip-grad-norm"},
    {"grad-clip", "clip-grad-norm"},
    {"max-grad-norm", "clip-grad-norm"},
    {"lr-scheduler-type", "lr-schedule"},
    {"scheduler", "lr-schedule"},
    {"resume-from-checkpoint", "resume"},
    {"ckpt-path", "resume"},
    {"save-steps", "checkpoint-every"},
    {"every-n-train-steps", "checkpoint-every"},
    {"monitor", "keep-best"},
    {"save-best", "keep-best"},
    {"patience", "early-stop"},
    {"early-stopping-patience", "early-stop"},
    {"logging-steps", "log-every"},
    {"log-interval", "log-every"},
    {"log-every-n-steps", "log-every"},
    {"fp16", "precision"},
    {"bf16", "precision"},
    {"amp", "precision"},
    {"mixed-precision", "precision"},
    {"nproc-per-node", "nproc"},
    {"world-size", "nproc"},
    {"train-data", "data"},
    {"dataset", "data"},
    {"val-data", "eval-data"},
    {"validation-data", "eval-data"},
    {"eval-dataset", "eval-data"},
    {"pretrained", "weights"},
    {"max-new-tokens", "tokens"},
    {"num-tokens", "tokens"},
    {"num-threads", "threads"},
    {"nthreads", "threads"},
};

static int has_long(const struct option *longs, const char *name) {
    for (const struct option *lo = longs; lo->name; lo++)
        if (!strcmp(lo->name, name))
            return 1;
    return 0;
}

/* The flag `name` (without its dashes) is an alias of, when the command
 * has that flag; else the long option within two edits of it. NULL: none. */
static const char *suggest_long(const struct option *longs, const char *name) {
    for (size_t i = 0; i < sizeof option_aliases / sizeof option_aliases[0]; i++)
        if (!strcmp(name, option_aliases[i].alias) && has_long(longs, option_aliases[i].flag))
            return option_aliases[i].flag;
    const char *best = NULL;
    int best_d = 3;
    for (const struct option *lo = longs; lo->name; lo++) {
        if (!strcmp(lo->name, "completion-helper"))
            continue;
        int d = ebb_edit_distance(name, lo->name, 2);
        if (d < best_d) {
            best = lo->name;
            best_d = d;
        }
    }
    return best;
}

int ebb_cli_unknown_option(const char *usage, const struct option *longs, const char *written) {
    char name[64], key[64], msg[160];
    size_t n = strcspn(written, "=");
    snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), written);
    const char *best = NULL;
    if (!strncmp(name, "--", 2)) {
        /* --batch_size as --batch-size: Python's argparse users write both */
        snprintf(key, sizeof key, "%s", name + 2);
        for (char *p = key; *p; p++)
            *p = *p == '_' ? '-' : *p;
        best = suggest_long(longs, key);
    }
    if (best)
        snprintf(msg, sizeof msg, "unknown option %s; did you mean --%s?", name, best);
    else
        snprintf(msg, sizeof msg, "unknown option %s", name);
    return ebb_cli_usage_error(usage, "%s", msg);
}

int ebb_cli_fail_status(ebb_status st) {
    fprintf(stderr, "ebb: %s\n", ebb_errmsg());
    switch (st) {
    case EBB_ERR_SPEC:
    case EBB_ERR_BUILD:
    case EBB_ERR_SHAPE:
    case EBB_ERR_ARG:
    case EBB_ERR_IO:
    case EBB_ERR_CORRUPT:
    case EBB_ERR_BUDGET: return EXIT_SPEC; /* the user's --memory-budget, not memory that ran out */
    default: return EXIT_RUNTIME;
    }
}

int ebb_cli_set_threads(const char *usage, const char *val) {
    uint64_t n = 0;
    if (ebb_cli_parse_u64(val, &n) != 0 || n < 1 || n > 1024)
        return ebb_cli_usage_error(usage, "--threads %s: give a thread count from 1 to 1024", val);
    ebb_status st = ebb_set_num_threads((int)n);
    return st == EBB_OK ? 0 : ebb_cli_fail_status(st);
}

int ebb_cli_parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || *s == '-')
        return -1;
    *out = v;
    return 0;
}

int ebb_cli_weight_copies(const char *val, ebb_low_copies *out) {
    static const char *const names[] = {"auto", "keep", "recast"};
    for (int i = 0; i < 3; i++)
        if (strcmp(val, names[i]) == 0) {
            *out = (ebb_low_copies)i; /* EBB_LOW_COPIES_AUTO, _KEEP, _RECAST */
            return 0;
        }
    return -1;
}


/* ---- setters ---------------------------------------------------------------- */

/* "--name" or "-p", as messages write the flag. */
static const char *flag_name(const cli_flag *f, char *buf, size_t size) {
    if (f->name)
        snprintf(buf, size, "--%s", f->name);
    else
        snprintf(buf, size, "-%c", f->letter);
    return buf;
}

/* ebb_cli_usage_error() with the flag's name as the message's first %s and
 * `arg` as its second. */
static int flag_error(const cli_flag *f, const char *usage, const char *fmt, const char *arg) {
    char name[64], msg[512];
    snprintf(msg, sizeof msg, fmt, flag_name(f, name, sizeof name), arg ? arg : "");
    return ebb_cli_usage_error(usage, "%s", msg);
}

int cli_set_switch(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f, (void)v, (void)usage;
    *(int *)field = 1;
    return 0;
}

int cli_set_path(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (!*v) return flag_error(f, usage, "%s needs a value", NULL);
    *(const char **)field = v;
    return 0;
}

int cli_set_text(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f, (void)usage;
    *(const char **)field = v;
    return 0;
}

int cli_set_list(const cli_flag *f, const char *v, void *field, const char *usage) {
    cli_list *l = field;
    if (l->n == CLI_LIST_MAX) return flag_error(f, usage, "too many %s options", NULL);
    l->v[l->n++] = v;
    return 0;
}

int cli_set_pattern(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (strchr(v, ',')) return flag_error(f, usage, "%s %s: one pattern each, no comma", v);
    return cli_set_list(f, v, field, usage);
}

int cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_set_count(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (cli_parse_int(v, 1, 1000000000, field) != 0)
        return flag_error(f, usage, "%s needs a positive integer, at most 1000000000", NULL);
    return 0;
}

int cli_set_u64(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (ebb_cli_parse_u64(v, field) != 0)
        return flag_error(f, usage, "%s needs a non-negative integer", NULL);
    return 0;
}

/* A finite number >= 0 into *out: 0, or -1. */
static int parse_nonneg(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < 0) return -1;
    *out = v;
    return 0;
}

int cli_set_rate(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (parse_nonneg(v, field) != 0)
        return flag_error(f, usage, "%s needs a non-negative number", NULL);
    return 0;
}

int cli_set_positive(const cli_flag *f, const char *v, void *field, const char *usage) {
    double d = 0;
    if (parse_nonneg(v, &d) != 0 || !(d > 0))
        return flag_error(f, usage, "%s needs a positive number", NULL);
    *(double *)field = d;
    return 0;
}

int cli_set_bytes(const cli_flag *f, const char *v, void *field, const char *usage) {
    int64_t *n = field;
    if (ebb_bytes_parse(v, n) != EBB_OK || *n <= 0)
        return flag_error(f, usage, "%s %s: expected a byte count above 0, like 4MiB", v);
    return 0;
}

int cli_set_budget(const cli_flag *f, const char *v, void *field, const char *usage) {
    int64_t *n = field;
    if (!strcmp(v, "least"))
        *n = EBB_MEMORY_BUDGET_LEAST;
    else if (ebb_bytes_parse(v, n) != EBB_OK || *n == 0)
        return flag_error(f, usage,
                          "%s %s: expected a byte count above 0, like 64MiB or 1.5GB, or `least`",
                          v);
    return 0;
}

int cli_set_precision(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (ebb_precision_parse(field, v) != EBB_OK)
        return flag_error(f, usage, "%s %s: expected fp32, bf16 or fp16", v);
    return 0;
}

int cli_set_weight_copies(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (ebb_cli_weight_copies(v, field) != 0)
        return flag_error(f, usage, "%s %s: expected auto, keep or recast", v);
    return 0;
}

int cli_set_loss_scale(const cli_flag *f, const char *v, void *field, const char *usage) {
    double s = -1;
    /* a normal float32, which the scaled gradients are */
    if (strcmp(v, "none") != 0 && (parse_nonneg(v, &s) != 0 || !(s >= 1.1754944e-38) || s > 3.4e38))
        return flag_error(f, usage,
                          "%s %s: expected a positive scale, a normal float32 (65536), or none", v);
    *(double *)field = s;
    return 0;
}

int cli_set_optimizer(const cli_flag *f, const char *v, void *field, const char *usage) {
    if (ebb_optimizer_kind_parse(NULL, v) != EBB_OK)
        return flag_error(f, usage, "%s: %s", ebb_errmsg());
    *(const char **)field = v;
    return 0;
}

int cli_set_threads(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f, (void)field;
    return ebb_cli_set_threads(usage, v);
}

/* Never called: the parser answers these rows itself. */
int cli_set_help(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f, (void)v, (void)field, (void)usage;
    return -1;
}

int cli_set_completion(const cli_flag *f, const char *v, void *field, const char *usage) {
    (void)f, (void)v, (void)field, (void)usage;
    return -1;
}

/* ---- help and completion ---------------------------------------------------- */

void cli_flags_help(const command *c, FILE *f) {
    fputs(c->usage, f);
    for (const cli_flag *r = c->flags; r->help; r++) {
        if (!r->set) {
            fputs(r->help, f);
            continue;
        }
        char left[96];
        int n = r->letter ? snprintf(left, sizeof left, "  -%c%s", r->letter, r->name ? ", " : "")
                          : snprintf(left, sizeof left, "  ");
        if (r->name) n += snprintf(left + n, sizeof left - (size_t)n, "--%s", r->name);
        if (r->arg) n += snprintf(left + n, sizeof left - (size_t)n, " %s", r->arg);
        if (n < HELP_COLUMN)
            fprintf(f, "%-*s", HELP_COLUMN, left);
        else
            fprintf(f, "%s\n%*s", left, HELP_COLUMN, "");
        for (const char *line = r->help; *line;) {
            size_t len = strcspn(line, "\n");
            fprintf(f, "%.*s\n", (int)len, line);
            line += len;
            if (*line == '\n' && line[1]) fprintf(f, "%*s", HELP_COLUMN, "");
            line += *line == '\n';
        }
    }
    if (c->usage_tail) fputs(c->usage_tail, f);
}

/* The flags, one a line ("--seed=" when it takes a value), as git's
 * --git-completion-helper prints them; the tests compare this list with the
 * help text. */
static void list_flags(const command *c) {
    for (const cli_flag *r = c->flags; r->help; r++)
        if (r->set && r->letter) printf("-%c\n", r->letter);
    for (const cli_flag *r = c->flags; r->help; r++)
        if (r->set && r->name) printf("--%s%s\n", r->name, r->arg ? "=" : "");
}

/* ---- the parser ------------------------------------------------------------- */

/* A long-only row's getopt value: past every character. */
#define LONG_VAL(i) (256 + (i))

/* getopt_long's tables for c's rows: "-:" and the letters (a ':' after
 * one taking a value), and the long options, ending with a zero row. */
static struct option *getopt_tables(const command *c, char *shorts, size_t size) {
    int n = 0;
    for (const cli_flag *r = c->flags; r->help; r++) n++;
    struct option *longs = calloc((size_t)n + 1, sizeof *longs);
    if (!longs) return NULL;
    /* '-' first: arguments come back in order (as 1) whatever POSIXLY_CORRECT
     * says, so options may follow the SPEC; ':' next: a missing value is
     * told apart from an unknown option */
    size_t at = (size_t)snprintf(shorts, size, "-:");
    int k = 0;
    for (int i = 0; i < n; i++) {
        const cli_flag *r = &c->flags[i];
        if (!r->set) continue;
        if (r->letter && at + 3 < size) {
            shorts[at++] = r->letter;
            if (r->arg) shorts[at++] = ':';
            shorts[at] = '\0';
        }
        if (r->name)
            longs[k++] = (struct option){r->name, r->arg ? required_argument : no_argument, NULL,
                                         r->letter ? r->letter : LONG_VAL(i)};
    }
    return longs;
}

/* The row getopt_long answered `val` for, or NULL. */
static const cli_flag *row_of(const command *c, int val) {
    for (int i = 0; c->flags[i].help; i++)
        if (c->flags[i].set && (val < 256 ? c->flags[i].letter == val : LONG_VAL(i) == val))
            return &c->flags[i];
    return NULL;
}

/* A usage error for getopt's ':' (a value missing) or '?' (an unknown flag,
 * or a switch given a value). */
static int getopt_error(const command *c, const struct option *longs, char **argv, int opt) {
    char name[64], msg[160];
    const cli_flag *r = optopt ? row_of(c, optopt) : NULL;
    if (opt == ':' && r) {
        snprintf(msg, sizeof msg, "%s needs %s", flag_name(r, name, sizeof name),
                 r->needs ? r->needs : "a value");
        return ebb_cli_usage_error(c->usage, "%s", msg);
    }
    if (r && r->name && !r->arg && !strncmp(argv[optind - 1], "--", 2))
        return ebb_cli_usage_error(c->usage, "option %s takes no value",
                                   flag_name(r, name, sizeof name));
    if (optopt > 0 && optopt < 256) {
        snprintf(name, sizeof name, "-%c", optopt);
        return ebb_cli_usage_error(c->usage, "unknown option %s", name);
    }
    /* an unknown or ambiguous long option, as written */
    return ebb_cli_unknown_option(c->usage, longs, argv[optind - 1]);
}

int cli_flags_parse(const command *c, int argc, char **argv, void *opts,
                    int (*positional)(const command *c, void *opts, const char *arg)) {
    char shorts[64];
    struct option *longs = getopt_tables(c, shorts, sizeof shorts);
    if (!longs) return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    opterr = 0;
    optind = 0;
    int opt, rc = 0;
    while (!rc && (opt = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        const cli_flag *r = opt == 1 ? NULL : row_of(c, opt);
        if (opt == 1) {
            rc = positional(c, opts, optarg);
        } else if (!r) {
            rc = getopt_error(c, longs, argv, opt);
        } else if (r->set == cli_set_help) {
            cli_flags_help(c, stdout);
            rc = -1;
        } else if (r->set == cli_set_completion) {
            list_flags(c);
            rc = -1;
        } else if (!(rc = r->set(r, optarg, (char *)opts + r->at, c->usage)) && r->given) {
            *(int *)((char *)opts + r->given - 1) = 1;
        }
    }
    for (; !rc && optind < argc; optind++) /* after `--` */
        rc = positional(c, opts, argv[optind]);
    free(longs);
    return rc;
}
