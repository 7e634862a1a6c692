/* `ebb dot`: Graphviz DOT of a graph or a plan, rendered when -o names a picture. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_dot[] =
    "usage: ebb dot SPEC [--plan [--train [--loss NAME] [--optimizer KIND]\n"
    "               [--clip-grad-norm X] [--clip-grad-value X] [--no-decay PATTERN]...\n"
    "               [--loss-scale S] [--accumulate N] [--weight-copies HOW]\n"
    "               [--data-parallel N [--bucket-size SIZE] [--overlap] [--zero [--rank R]]]]\n"
    "               [--memory-budget SIZE]]\n"
    "               [-i NAME=DIMS]... [-p PARAM=N]... [-o FILE]\n"
    "\n";

const cli_flag ebb_cli_dot_flags[] = {
    SHAPE_FLAG("NAME=DIMS", "with --plan: input shape, or SYMBOL=N"),
    BATCH_FLAG,
    PARAM_FLAG,
    FLAG_SWITCH("plan", options, plan_view,
                "draw the plan (steps, values, bytes) instead of the graph"),
    FLAG_SWITCH("train", options, train, "with --plan: draw the training step"),
    LOSS_OPTIMIZER_FLAGS,
    CLIP_FLAGS,
    FLAG_ROW(0, "memory-budget", "SIZE", cli_set_budget, options, memory_budget,
             "with --plan: the step that fits SIZE (64MiB, or `least`);\n"
             "recomputed steps are drawn dashed, in blue"),
    {'o', NULL, "FILE", cli_set_path, offsetof(options, out_file), 0,
     "write to FILE (default: DOT on stdout): .dot or .gv get DOT\n"
     "text; .svg, .png, .pdf, .jpg, .jpeg, .gif, .ps or .eps render\n"
     "through Graphviz. A file is replaced atomically, a device\n"
     "written into.", NULL},
    PRECISION_FLAG(options, precision),
    COMMON_FLAGS,
    END_OF_OPTIONS_HELP,
    FLAG_END,
};

const char ebb_cli_usage_dot_tail[] = "\nA SPEC of - is read from standard input.\n";

static int have_program(const char *name) {
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char buf[4096];
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, name);
        if (access(buf, X_OK) == 0)
            return 1;
        p = end ? end + 1 : p + len;
    }
    return 0;
}

/* An output file could not be written: a runtime failure (exit 3), the
 * command line being fine. */

/* Pipes DOT text through Graphviz's `dot -T<fmt>`, whose output goes into
 * the writer's file, so a render is replaced atomically like any output. */
static int render(const char *dot_text, size_t len, const char *fmt, const char *file,
                  ebb_file_out *w) {
    int out_fd = ebb_file_fd(w);
    int fds[2];
    if (pipe(fds) != 0) {
        perror("ebb: pipe");
        return EXIT_RUNTIME;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("ebb: fork");
        close(fds[0]);
        close(fds[1]);
        return EXIT_RUNTIME;
    }
    if (pid == 0) {
        if (dup2(fds[0], 0) < 0 || dup2(out_fd, 1) < 0)
            _exit(126);
        close(fds[0]);
        close(fds[1]);
        char tflag[16];
        snprintf(tflag, sizeof tflag, "-T%s", fmt);
        execlp("dot", "dot", tflag, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    size_t at = 0;
    while (at < len) {
        ssize_t n = write(fds[1], dot_text + at, len - at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        at += (size_t)n;
    }
    close(fds[1]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "ebb: dot failed to render %s\n", file);
        return EXIT_RUNTIME;
    }
    return 0;
}

/* What `dot -o` writes, by the file's extension; ebb_cli_usage_dot and docs/cli.md
 * list the same (tests/test_cli.c compares them). */
static const char *const dot_text[] = {".dot", ".gv"};
static const char *const dot_rendered[] = {".svg", ".png", ".pdf", ".jpg",
                                           ".jpeg", ".gif", ".ps", ".eps"};

int ebb_cli_dot(const command *self, int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, self, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *ext = o.out_file ? strrchr(o.out_file, '.') : NULL;
    int render_it = 0, text_it = 0;
    for (size_t k = 0; ext && k < sizeof dot_rendered / sizeof dot_rendered[0]; k++)
        render_it |= !strcmp(ext, dot_rendered[k]);
    for (size_t k = 0; ext && k < sizeof dot_text / sizeof dot_text[0]; k++)
        text_it |= !strcmp(ext, dot_text[k]);
    if (o.out_file && !render_it && !text_it) {
        /* the message lists the tables above, so it cannot disagree with them */
        char list[256];
        size_t at = (size_t)snprintf(list, sizeof list, "-o %%s: use");
        for (size_t k = 0; k < sizeof dot_text / sizeof dot_text[0]; k++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s %s", k ? " or" : "",
                                   dot_text[k]);
        at += (size_t)snprintf(list + at, sizeof list - at, " for DOT text, or");
        size_t n = sizeof dot_rendered / sizeof dot_rendered[0];
        for (size_t k = 0; k < n; k++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s %s",
                                   k == 0 ? "" : k + 1 == n ? " or" : ",", dot_rendered[k]);
        snprintf(list + at, sizeof list - at, " to render");
        return ebb_cli_usage_error(ebb_cli_usage_dot, list, o.out_file);
    }
    if ((o.train || o.memory_budget) && !o.plan_view)
        return ebb_cli_usage_error(ebb_cli_usage_dot, "%s", "--train and --memory-budget apply to --plan, which "
                                            "is not given");
    if (o.out_file && ebb_file_check_writable(o.out_file, "-o") != EBB_OK)
        return fail_write();
    if (render_it && !have_program("dot")) {
        fprintf(stderr, "ebb: rendering %s needs Graphviz's `dot`, which is not installed "
                        "(Debian: apt-get install graphviz); or write DOT with -o FILE.dot\n",
                o.out_file);
        return EXIT_SPEC;
    }
    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    if (o.plan_view) {
        rc = load_and_compile(&o, NULL, &s, &p, 0);
    } else {
        ebb_status st = load_spec(&o, &s);
        rc = st == EBB_OK ? 0 : ebb_cli_fail_status(st);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = rc ? NULL : open_memstream(&text, &len);
    if (!rc && !mem)
        rc = ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    if (mem) {
        if (p)
            ebb_plan_write_dot(p, mem, ebb_spec_node_label, s);
        else
            ebb_graph_write_dot(ebb_spec_graph(s), mem, ebb_spec_node_label, s);
        fclose(mem);
        ebb_file_out *w = NULL;
        if (!o.out_file)
            fwrite(text, 1, len, stdout);
        else if (ebb_file_begin(&w, o.out_file, "-o") != EBB_OK)
            rc = fail_write();
        else {
            if (render_it)
                rc = render(text, len, ext + 1, o.out_file, w);
            else
                fwrite(text, 1, len, ebb_file_stream(w));
            if (rc)
                ebb_file_abort(w);
            else if (ebb_file_commit(w) != EBB_OK)
                rc = fail_write();
        }
        free(text);
    }
    ebb_plan_free(p);
    ebb_spec_free(s);
    return rc;
}
