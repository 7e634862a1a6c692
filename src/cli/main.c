/* The `ebb` command: check, plan, run, grad, dot, chart, train, eval and
 * generate for YAML specs. This file dispatches; each command is a file of
 * its own (src/cli/CMD.c, train.c for train and eval) and what they share
 * is in common.c (cli.h).
 *
 * Options follow git's conventions (getopt_long): `--opt=value` or
 * `--opt value`, `-iVALUE` or `-i VALUE`, options and arguments in any
 * order, `--` ends the options, and `-` names standard input where a file
 * is read (a spec, --weights, --inputs).
 *
 * Exit codes: 0 ok; 1 a spec or input error; 2 a usage error; 3 a runtime
 * error (including out of memory and output that cannot be written); 141
 * when the reader of stdout went away (a closed pipe), quietly, as a shell
 * reports `git log | head`. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_main[] =
    "usage: ebb [-V | --version] [-h | --help] COMMAND [ARGS]\n"
    "\n"
    "Declare a graph in YAML, read its plan, run it.\n"
    "\n"
    "commands:\n"
    "  check SPEC...        validate specs (structure and shapes)\n"
    "  plan SPEC [...]      print the plan listing: steps, frees, predicted live bytes\n"
    "  run SPEC [...]       run the plan and compare measured with planned memory\n"
    "  grad SPEC [...]      the loss and every parameter's gradient, from a training plan\n"
    "  train SPEC [...]     train on a dataset: progress, evaluation, checkpoints\n"
    "  eval SPEC [...]      a trained model's loss and accuracy on a dataset\n"
    "  generate SPEC [...]  continue a text with a trained byte-level language model\n"
    "  dot SPEC [...]       write Graphviz DOT of the graph or the plan\n"
    "  chart SPEC [...]     draw the plan's memory over its steps as SVG (and a run's trace)\n"
    "  help [COMMAND]       this help, or the command's (as `ebb COMMAND --help`)\n"
    "  version              as --version: ebb's version, its libtorch and CUDA\n"
    "\n"
    "Options take their value as `--opt=value` or `--opt value`; `--` ends the\n"
    "options; a SPEC, --weights or --inputs given as `-` is read from standard input.\n"
    "exit codes: 0 ok, 1 spec or input error, 2 usage error, 3 runtime error,\n"
    "            141 the reader of stdout went away\n";

static const command commands[] = {
    {"check", ebb_cli_usage_check, ebb_cli_check_flags, ebb_cli_usage_check_tail, 1, ebb_cli_check},
    {"plan", ebb_cli_usage_plan, ebb_cli_plan_flags, ebb_cli_usage_plan_tail, 0, ebb_cli_plan},
    {"run", ebb_cli_usage_run, ebb_cli_run_flags, ebb_cli_usage_run_tail, 0, ebb_cli_run},
    {"grad", ebb_cli_usage_grad, ebb_cli_grad_flags, ebb_cli_usage_grad_tail, 0, ebb_cli_grad},
    {"dot", ebb_cli_usage_dot, ebb_cli_dot_flags, ebb_cli_usage_dot_tail, 0, ebb_cli_dot},
    {"chart", ebb_cli_usage_chart, ebb_cli_chart_flags, ebb_cli_usage_chart_tail, 0, ebb_cli_chart},
    {"train", ebb_cli_usage_train, ebb_cli_train_flags, ebb_cli_usage_train_tail, 0, ebb_cli_train},
    {"eval", ebb_cli_usage_eval, ebb_cli_eval_flags, ebb_cli_usage_eval_tail, 0, ebb_cli_eval},
    {"generate", ebb_cli_usage_generate, ebb_cli_generate_flags, ebb_cli_usage_generate_tail, 0,
     ebb_cli_generate},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static const command *find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

static int finish_stdout(int rc) {
    int err = 0;
    if (fflush(stdout) != 0)
        err = errno;
    else if (ferror(stdout)) {
        /* an earlier write failed and its bytes are gone: ask the pipe */
        struct pollfd pf = {.fd = 1, .events = 0};
        err = poll(&pf, 1, 0) == 1 && (pf.revents & POLLERR) ? EPIPE : EIO;
    }
    if (fclose(stdout) != 0 && !err)
        err = errno;
    if (!err)
        return rc;
    if (err == EPIPE)
        return rc ? rc : 128 + SIGPIPE;
    fprintf(stderr, "ebb: write error: %s\n", strerror(err));
    return rc ? rc : EXIT_RUNTIME;
}

static int print_version(void) {
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
#ifdef EBB_WITH_CUDA
    const char *cuda = "compiled in";
#else
    const char *cuda = "not compiled in";
#endif
    printf("ebb %s (libtorch %s, CUDA %s%s)\n", ebb_version(), ebb_torch_version(), cuda,
           ebb_cuda_available() ? ", a device is available" : "");
    ebb_cpu_info ci;
    char line[256];
    if (ebb_cpu_info_get(&ci) == EBB_OK)
        printf("cpu: %s\n", ebb_cpu_info_str(&ci, line, sizeof line));
    return 0;
}

/* ---- the test suite's ops (EBB_TEST_OPS=1) -------------------------------- */

/* test_overrun: a copy of its input that allocates `bytes` of scratch it
 * does not declare, the way an op with a wrong workspace figure would: the
 * tests' way to a run that measures more than its plan. Registered only when
 * the environment sets EBB_TEST_OPS (docs/cli.md). */
static const ebb_attr_spec overrun_attrs[] = {
    {.name = "bytes", .type = EBB_ATTR_INT, .default_number = 4096,
     .doc = "undeclared scratch, in bytes"},
};

static ebb_status overrun_fwd(const ebb_op_call *c, ebb_tensor **out) {
    int64_t n = c->attrs[0].i / 4;
    ebb_tensor *scratch = NULL;
    ebb_shape s = {1, {n > 0 ? n : 1}};
    ebb_status st = ebb_tensor_zeros(&scratch, &s, EBB_FLOAT32, ebb_tensor_device(c->in[0]));
    if (st == EBB_OK)
        st = ebb_tensor_clone(out, c->in[0]);
    ebb_tensor_free(scratch);
    return st;
}

static ebb_status overrun_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_clone(&gin[0], c->grad_out);
}

static const ebb_op_grad overrun_grad = {.backward = overrun_bwd, .differentiable = 1u};
static const ebb_op overrun_op = {
    .name = "test_overrun", .min_inputs = 1, .max_inputs = 1, .attrs = overrun_attrs,
    .n_attrs = 1, .forward = overrun_fwd, .grad = &overrun_grad,
    .doc = "test only: a copy that takes undeclared scratch (EBB_TEST_OPS=1)"};

/* "unknown command 'plna'; did you mean 'plan'?" and where the commands
 * are: two lines, as git says it. */
static int unknown_command(const char *name) {
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < N_COMMANDS; i++) {
        int d = ebb_edit_distance(name, commands[i].name, 2);
        if (d < best_d) {
            best = commands[i].name;
            best_d = d;
        }
    }
    if (best)
        fprintf(stderr, "ebb: unknown command '%s'; did you mean '%s'?\n", name, best);
    else
        fprintf(stderr, "ebb: unknown command '%s'\n", name);
    fputs("try 'ebb help' for the commands\n", stderr);
    return EXIT_USAGE;
}

static int dispatch(int argc, char **argv) {
    if (argc < 2)
        return ebb_cli_usage_error(ebb_cli_usage_main, "%s", "missing COMMAND");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        /* `ebb help plan`, as git: that command's help */
        if (argc > 3)
            return ebb_cli_usage_error(ebb_cli_usage_main, "%s", "help takes one COMMAND");
        const command *c = argc == 3 ? find_command(argv[2]) : NULL;
        if (argc == 3 && !c)
            return unknown_command(argv[2]);
        if (c)
            cli_flags_help(c, stdout);
        else
            fputs(ebb_cli_usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        if (argc > 2)
            return ebb_cli_usage_error(ebb_cli_usage_main, "unexpected argument %s", argv[2]);
        return print_version();
    }
    const command *c = find_command(cmd);
    if (!c && cmd[0] == '-')
        return ebb_cli_usage_error(ebb_cli_usage_main, "unknown option %s", cmd);
    if (!c)
        return unknown_command(cmd);
    if (ebb_init() != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    const char *test_ops = getenv("EBB_TEST_OPS");
    if (test_ops && *test_ops && strcmp(test_ops, "0") != 0 &&
        ebb_op_register(&overrun_op) != EBB_OK) {
        fprintf(stderr, "ebb: EBB_TEST_OPS: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    /* the command's name is argv[0] to its parser, as a program's own */
    return c->main(c, argc - 1, argv + 1);
}

int main(int argc, char **argv) {
    /* EPIPE instead of death by SIGPIPE: a renderer (`dot -T...`) that exits
     * early is an error to report, and a closed stdout is told apart at the
     * end (finish_stdout) */
    signal(SIGPIPE, SIG_IGN);
    return finish_stdout(dispatch(argc, argv));
}
