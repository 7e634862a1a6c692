/* The `ebb` command: check, plan, run, dot and chart for YAML specs.
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
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ebb/ebb.h"
#include "ebb/safetensors.h"
#include "ebb/spec.h"
/* the library's file writer: every file the command writes goes through it */
#include "../edit_distance.h"
#include "../fileio.h"
/* ebb train and ebb eval */
#include "train.h"


enum { EXIT_SPEC = 1, EXIT_USAGE = 2, EXIT_RUNTIME = 3 };

#define MAX_BINDINGS 64
#define MAX_INPUTS 64

/* What `-` reads as: a name that says where the bytes came from. */
#define STDIN_SPEC_NAME "<stdin>"
#define STDIN_PATH "/dev/stdin"

static const char usage_main[] =
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
    "  dot SPEC [...]       write Graphviz DOT of the graph or the plan\n"
    "  chart SPEC [...]     draw the plan's memory over its steps as SVG (and a run's trace)\n"
    "  help [COMMAND]       this help, or the command's (as `ebb COMMAND --help`)\n"
    "  version              as --version: ebb's version, its libtorch and CUDA\n"
    "\n"
    "Options take their value as `--opt=value` or `--opt value`; `--` ends the\n"
    "options; a SPEC, --weights or --inputs given as `-` is read from standard input.\n"
    "exit codes: 0 ok, 1 spec or input error, 2 usage error, 3 runtime error,\n"
    "            141 the reader of stdout went away\n";

/* Every command's help ends with these, which every command takes. */
#define USAGE_COMMON                                                                               \
    "  -h, --help         this help\n"                                                             \
    "  --completion-helper\n"                                                                      \
    "                     print the options above, one a line (for shell completion)\n"            \
    "  --                 end of options: what follows is a SPEC even if it starts with -\n"

static const char usage_check[] = "usage: ebb check [--] SPEC...\n"
                                 "\n"
                                 "Loads and compiles each spec (symbolic dimensions set to 1).\n"
                                 "Prints 'SPEC: ok (N steps, P parameters)' or\n"
                                 "'SPEC:LINE:COL: error: ...' on stderr. Exit 1 on any error.\n"
                                 "A SPEC of - is read from standard input.\n"
                                 "\n" USAGE_COMMON;

static const char usage_plan[] =
    "usage: ebb plan SPEC [-i NAME=D0,D1,...]... [-p PARAM=N]... [--json] [--keep-all]\n"
    "                [--memory] [--train [--loss NAME] [--optimizer KIND]\n"
    "                [--clip-grad-norm X] [--clip-grad-value X]] [--memory-budget SIZE]\n"
    "\n"
    "  -i NAME=D0,D1,...  the shape of input NAME; or -i SYMBOL=N for a symbolic dim\n"
    "                     (symbolic dimensions not given are 1)\n"
    "  --batch B          -i SYMBOL=B for the first input's symbolic first dimension\n"
    "  -p PARAM=N         replace the value of one of the spec's params\n"
    "  --json             the plan as JSON (see docs/cli.md)\n"
    "  --keep-all         compile without freeing, to compare\n"
    "  --memory           draw predicted live bytes per step\n"
    "  --train            plan a training step: forward, the spec's loss against its\n"
    "                     targets, backward and one update per parameter\n"
    "  --loss NAME        with --train: this loss op instead of the spec's `loss:`\n"
    "  --optimizer KIND   with --train: the updates to count (default adamw)\n"
    "  --clip-grad-norm X with --train: scale the gradients to a global L2 norm of at\n"
    "                     most X (the updates wait for every gradient; the listing says\n"
    "                     what that costs)\n"
    "  --clip-grad-value X\n"
    "                     with --train: clamp each gradient to [-X, X] in its update\n"
    "  --memory-budget SIZE\n"
    "                     the most the step may take at its peak (64MiB, 1.5GB, bytes,\n"
    "                     or `least`):\n"
    "                     a training plan recomputes forward values in the backward to\n"
    "                     fit, and the listing shows what it recomputes and what it costs\n" USAGE_COMMON
    "\n"
    "A SPEC of - is read from standard input.\n";

static const char usage_grad[] =
    "usage: ebb grad SPEC --inputs X.safetensors --grads G.safetensors [--weights W.safetensors]\n"
    "                [-i NAME=DIMS]... [-p PARAM=N]... [--loss NAME] [--trace T.jsonl]\n"
    "                [--device cpu|cuda[:N]] [--seed N] [--memory-budget SIZE]\n"
    "                [--strict-memory]\n"
    "\n"
    "Runs the spec's training step without updating anything: the forward, the loss\n"
    "against the targets, and the backward. Writes one gradient per trained parameter,\n"
    "named like the parameter, and prints the loss and the measured and planned peak.\n"
    "\n"
    "  --inputs FILE      the inputs and the targets, by name (required)\n"
    "  --grads FILE       where the gradients go (required)\n"
    "  --weights FILE     load parameters by name (default: seeded initialisation)\n"
    "  -i NAME=DIMS       input shape, or SYMBOL=N, when the file does not give it\n"
    "  --batch B          -i SYMBOL=B for the first input's symbolic first dimension\n"
    "  -p PARAM=N         replace the value of one of the spec's params\n"
    "  --loss NAME        this loss op instead of the spec's `loss:`\n"
    "  --trace FILE       one JSON object per executed step, backward steps included\n"
    "  --device D         cpu, cuda or cuda:N (default: cuda when available, else cpu)\n"
    "  --seed N           seed for parameters and dropout (default 0)\n"
    "  --memory-budget SIZE\n"
    "                     recompute forward values in the backward to fit SIZE (64MiB,\n"
    "                     or `least`);\n"
    "                     the gradients are the same\n"
    "  --strict-memory    a step that measures more than the plan promised is an error\n"
    "                     (exit 3), not a warning\n" USAGE_COMMON;

static const char usage_run[] =
    "usage: ebb run SPEC [-i NAME=DIMS]... [-p PARAM=N]... [--device cpu|cuda[:N]] [--seed N]\n"
    "               [--weights W.safetensors [--non-strict]] [--save-weights W.safetensors]\n"
    "               [--inputs X.safetensors] [--outputs Y.safetensors]\n"
    "               [--trace T.jsonl] [--repeat N] [--keep-all] [--cuda-graph] [--force]\n"
    "               [--strict-finite] [--strict-memory]\n"
    "\n"
    "  -i NAME=DIMS       input shape, or SYMBOL=N (symbolic dimensions default to 1)\n"
    "  --batch B          -i SYMBOL=B for the first input's symbolic first dimension\n"
    "  -p PARAM=N         replace the value of one of the spec's params\n"
    "  --device D         cpu, cuda or cuda:N (default: cuda when available, else cpu)\n"
    "  --seed N           seed for parameters and random inputs (default 0)\n"
    "  --weights FILE     load parameters by name; every missing, unexpected or\n"
    "                     mis-shaped tensor is listed, and any is an error\n"
    "  --non-strict       with --weights: list those on stderr as a warning, load the\n"
    "                     parameters that match and keep the others' seeded values\n"
    "  --save-weights F   write the parameters\n"
    "  --inputs FILE      read inputs by name (default: seeded random normal)\n"
    "  --outputs FILE     write outputs by name\n"
    "  --trace FILE       one JSON object per executed step, then a summary\n"
    "  --repeat N         run N times and report the median time (default 1)\n"
    "  --keep-all         free nothing until the end, to compare\n"
    "  --cuda-graph       capture the plan into a CUDA graph once, time its replays\n"
    "  --force            run even if the plan's peak does not fit in what this process\n"
    "                     can get (RLIMIT_AS, RLIMIT_DATA, cgroup limit, MemAvailable)\n"
    "  --strict-finite    NaN or Inf in --weights or --inputs is an error, not a warning\n"
    "  --strict-memory    a step that measures more than the plan promised is an error\n"
    "                     (exit 3), not a warning\n" USAGE_COMMON
    "\n"
    "SPEC, --weights or --inputs (one of them) may be -, standard input; a\n"
    "safetensors file from a pipe is read into memory first. Output files are\n"
    "replaced atomically (a link is followed); a device or pipe such as\n"
    "/dev/stdout is written into. Errors writing them exit 3.\n";

static const char usage_dot[] =
    "usage: ebb dot SPEC [--plan [--train [--loss NAME] [--optimizer KIND]\n"
    "               [--clip-grad-norm X] [--clip-grad-value X]] [--memory-budget SIZE]]\n"
    "               [-i NAME=DIMS]... [-p PARAM=N]... [-o FILE]\n"
    "\n"
    "  -i NAME=DIMS       with --plan: input shape, or SYMBOL=N\n"
    "  --batch B          -i SYMBOL=B for the first input's symbolic first dimension\n"
    "  -p PARAM=N         replace the value of one of the spec's params\n"
    "  --plan             draw the plan (steps, values, bytes) instead of the graph\n"
    "  --train            with --plan: draw the training step\n"
    "  --loss NAME        with --train: this loss op instead of the spec's `loss:`\n"
    "  --optimizer KIND   with --train: the updates to count (default adamw)\n"
    "  --clip-grad-norm X with --train: scale the gradients to a global L2 norm of at\n"
    "                     most X (the updates wait for every gradient; the listing says\n"
    "                     what that costs)\n"
    "  --clip-grad-value X\n"
    "                     with --train: clamp each gradient to [-X, X] in its update\n"
    "  --memory-budget SIZE\n"
    "                     with --plan: the step that fits SIZE (64MiB, or `least`);\n"
    "                     recomputed steps are drawn dashed, in blue\n"
    "  -o FILE            write to FILE (default: DOT on stdout): .dot or .gv get DOT\n"
    "                     text; .svg, .png, .pdf, .jpg, .jpeg, .gif, .ps or .eps render\n"
    "                     through Graphviz. A file is replaced atomically, a device\n"
    "                     written into.\n" USAGE_COMMON
    "\n"
    "A SPEC of - is read from standard input.\n";

static const char usage_chart[] =
    "usage: ebb chart SPEC [-i NAME=DIMS]... [-p PARAM=N]... [--keep-all] [--trace T.jsonl]\n"
    "                 [--train [--loss NAME] [--optimizer KIND] [--grads-only]\n"
    "                 [--clip-grad-norm X] [--clip-grad-value X]] [--memory-budget SIZE]\n"
    "                 [-o FILE.svg]\n"
    "\n"
    "  -i NAME=DIMS       input shape, or SYMBOL=N (symbolic dimensions default to 1)\n"
    "  --batch B          -i SYMBOL=B for the first input's symbolic first dimension\n"
    "  -p PARAM=N         replace the value of one of the spec's params\n"
    "  --keep-all         chart the plan compiled without freeing, to compare\n"
    "  --train            chart a training step: forward, loss, backward and updates,\n"
    "                     each shaded; the activations kept for the backward outlined\n"
    "  --loss NAME        with --train: this loss op instead of the spec's `loss:`\n"
    "  --optimizer KIND   with --train: the updates to count (default adamw)\n"
    "  --grads-only       with --train: the step `ebb grad` runs (gradients handed out,\n"
    "                     no updates), to chart `ebb grad --trace`\n"
    "  --clip-grad-norm X with --train: scale the gradients to a global L2 norm of at\n"
    "                     most X (the updates wait for every gradient; the listing says\n"
    "                     what that costs)\n"
    "  --clip-grad-value X\n"
    "                     with --train: clamp each gradient to [-X, X] in its update\n"
    "  --memory-budget SIZE\n"
    "                     chart the step that fits SIZE by recomputing (64MiB)\n"
    "  --trace FILE       draw the measured bytes of `ebb run --trace FILE` (or `ebb grad\n"
    "                     --trace FILE`) over the plan (run with the same -i, -p and\n"
    "                     --keep-all)\n"
    "  -o FILE            write the SVG to FILE (default: stdout); replaced atomically,\n"
    "                     a device written into\n" USAGE_COMMON
    "\n"
    "Each value is a band from the step that makes it to the step that frees it, as\n"
    "tall as its bytes; the planned peak is a labelled line. A SPEC of - is read\n"
    "from standard input.\n";

int ebb_cli_usage_error(const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, "ebb: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    /* one line where the options are, as git does: the mistake stays in
     * view (the command list without a command, which is short) */
    char cmd[32];
    if (usage == usage_main || sscanf(usage, "usage: ebb %31s", cmd) != 1) {
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    fprintf(stderr, "try 'ebb help %s' for its usage and options\n", cmd);
    return EXIT_USAGE;
}

int ebb_cli_unknown_option(const char *usage, const struct option *longs, const char *written) {
    char name[64], msg[160];
    size_t n = strcspn(written, "=");
    snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), written);
    const char *best = NULL;
    int best_d = 3;
    if (!strncmp(name, "--", 2))
        for (const struct option *lo = longs; lo->name; lo++) {
            if (!strcmp(lo->name, "completion-helper"))
                continue;
            int d = ebb_edit_distance(name + 2, lo->name, 2);
            if (d < best_d) {
                best = lo->name;
                best_d = d;
            }
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
    case EBB_ERR_BUDGET: return EXIT_SPEC; /* the user's --memory-budget, not memory that ran out */
    default: return EXIT_RUNTIME;
    }
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

/* ---- the commands' options ------------------------------------------------ */

/* Long-only options get values past any character, so that getopt's short
 * option letters and these never meet. */
enum {
    OPT_JSON = 256,
    OPT_KEEP_ALL,
    OPT_MEMORY,
    OPT_PLAN,
    OPT_CUDA_GRAPH,
    OPT_FORCE,
    OPT_STRICT_MEMORY,
    OPT_STRICT_FINITE,
    OPT_NON_STRICT,
    OPT_SEED,
    OPT_REPEAT,
    OPT_DEVICE,
    OPT_WEIGHTS,
    OPT_SAVE_WEIGHTS,
    OPT_INPUTS,
    OPT_OUTPUTS,
    OPT_TRACE,
    OPT_COMPLETION,
    OPT_TRAIN,
    OPT_LOSS,
    OPT_OPTIMIZER,
    OPT_GRADS,
    OPT_GRADS_ONLY,
    OPT_MEMORY_BUDGET,
    OPT_CLIP_GRAD_NORM,
    OPT_CLIP_GRAD_VALUE,
    OPT_BATCH,
};

/* --batch B: -i SYMBOL=B for the spec's batch, as ebb train takes it */
#define BATCH_OPTION {"batch", required_argument, NULL, OPT_BATCH}

#define CLIP_OPTIONS                                                                               \
    {"clip-grad-norm", required_argument, NULL, OPT_CLIP_GRAD_NORM}, {                             \
        "clip-grad-value", required_argument, NULL, OPT_CLIP_GRAD_VALUE                            \
    }

#define COMMON_OPTIONS                                                                             \
    {"help", no_argument, NULL, 'h'}, {"completion-helper", no_argument, NULL, OPT_COMPLETION }

static const struct option check_options[] = {COMMON_OPTIONS, {NULL, 0, NULL, 0}};
static const struct option plan_options[] = {
    COMMON_OPTIONS,
    BATCH_OPTION,
    {"json", no_argument, NULL, OPT_JSON},
    {"keep-all", no_argument, NULL, OPT_KEEP_ALL},
    {"memory", no_argument, NULL, OPT_MEMORY},
    {"train", no_argument, NULL, OPT_TRAIN},
    {"loss", required_argument, NULL, OPT_LOSS},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},
    CLIP_OPTIONS,
    {NULL, 0, NULL, 0},
};
static const struct option grad_options[] = {
    COMMON_OPTIONS,
    BATCH_OPTION,
    {"inputs", required_argument, NULL, OPT_INPUTS},
    {"grads", required_argument, NULL, OPT_GRADS},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"loss", required_argument, NULL, OPT_LOSS},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},
    {"strict-memory", no_argument, NULL, OPT_STRICT_MEMORY},
    {NULL, 0, NULL, 0},
};
static const struct option run_options[] = {
    COMMON_OPTIONS,
    BATCH_OPTION,
    {"device", required_argument, NULL, OPT_DEVICE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"non-strict", no_argument, NULL, OPT_NON_STRICT},
    {"save-weights", required_argument, NULL, OPT_SAVE_WEIGHTS},
    {"inputs", required_argument, NULL, OPT_INPUTS},
    {"outputs", required_argument, NULL, OPT_OUTPUTS},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"repeat", required_argument, NULL, OPT_REPEAT},
    {"keep-all", no_argument, NULL, OPT_KEEP_ALL},
    {"cuda-graph", no_argument, NULL, OPT_CUDA_GRAPH},
    {"force", no_argument, NULL, OPT_FORCE},
    {"strict-finite", no_argument, NULL, OPT_STRICT_FINITE},
    {"strict-memory", no_argument, NULL, OPT_STRICT_MEMORY},
    {NULL, 0, NULL, 0},
};
static const struct option dot_options[] = {
    COMMON_OPTIONS,
    BATCH_OPTION,
    {"plan", no_argument, NULL, OPT_PLAN},
    {"train", no_argument, NULL, OPT_TRAIN},
    {"loss", required_argument, NULL, OPT_LOSS},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},
    CLIP_OPTIONS,
    {NULL, 0, NULL, 0},
};
static const struct option chart_options[] = {
    COMMON_OPTIONS,
    BATCH_OPTION,
    {"keep-all", no_argument, NULL, OPT_KEEP_ALL},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"train", no_argument, NULL, OPT_TRAIN},
    {"loss", required_argument, NULL, OPT_LOSS},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"grads-only", no_argument, NULL, OPT_GRADS_ONLY},
    {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},
    CLIP_OPTIONS,
    {NULL, 0, NULL, 0},
};

typedef struct command {
    const char *name;
    const char *usage;
    const char *shorts;           /* getopt's short options */
    const struct option *longs;   /* the long ones: the parser's table */
    int many;                     /* takes several SPECs, not one */
} command;

static const command commands[] = {
    {"check", usage_check, "h", check_options, 1},
    {"plan", usage_plan, "hi:p:", plan_options, 0},
    {"run", usage_run, "hi:p:", run_options, 0},
    {"grad", usage_grad, "hi:p:", grad_options, 0},
    {"dot", usage_dot, "hi:p:o:", dot_options, 0},
    {"chart", usage_chart, "hi:p:o:", chart_options, 0},
    {"train", ebb_cli_usage_train, EBB_CLI_TRAIN_SHORTS, ebb_cli_train_options, 0},
    {"eval", ebb_cli_usage_eval, EBB_CLI_TRAIN_SHORTS, ebb_cli_eval_options, 0},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static const command *find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

typedef struct options {
    const char *spec;
    const char **specs; /* check: every SPEC, in order */
    int n_specs;
    const char *shapes[MAX_BINDINGS];
    int n_shapes;
    const char *params[MAX_BINDINGS];
    int n_params;
    int json, keep_all, memory, plan_view, repeat, cuda_graph, force, strict_finite, non_strict;
    int strict_memory;
    int train, grads_only;
    uint64_t seed;
    const char *device, *weights, *save_weights, *inputs, *outputs, *trace, *out_file;
    const char *loss, *optimizer, *grads;
    int64_t memory_budget; /* 0: none */
    double clip_norm, clip_value; /* --clip-grad-norm, --clip-grad-value; 0: none */
    uint64_t batch;               /* --batch; 0: not given */
} options;

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || *s == '-')
        return -1;
    *out = v;
    return 0;
}

/* "-i" or "--seed": how the user spells the option with getopt value `val`. */
static const char *option_name(const command *c, int val, char *buf, size_t size) {
    if (val > 0 && val < 256 && val != 'h') {
        snprintf(buf, size, "-%c", val);
        return buf;
    }
    for (const struct option *lo = c->longs; lo->name; lo++)
        if (lo->val == val) {
            snprintf(buf, size, "--%s", lo->name);
            return buf;
        }
    snprintf(buf, size, "-%c", val > 0 && val < 256 ? val : '?');
    return buf;
}

/* The options the parser takes, one a line ("--seed=" when it takes a
 * value), as git's --git-completion-helper prints them; the tests compare
 * this list with the help text. */
static void list_options(const command *c) {
    for (const char *s = c->shorts; *s; s++)
        if (*s != ':')
            printf("-%c\n", *s);
    for (const struct option *lo = c->longs; lo->name; lo++)
        printf("--%s%s\n", lo->name, lo->has_arg == required_argument ? "=" : "");
}

static int add_spec(const command *c, options *o, const char *arg) {
    if (c->many)
        o->specs[o->n_specs++] = arg;
    else if (o->spec)
        return ebb_cli_usage_error(c->usage, "unexpected argument %s", arg);
    o->spec = o->spec ? o->spec : arg;
    return 0;
}

/* Parses argv[1..] (argv[0] is the command's name); returns 0, -1 when help
 * was printed, or an exit code. */
static int parse_options(int argc, char **argv, const command *c, options *o) {
    memset(o, 0, sizeof *o);
    o->repeat = 1;
    const char *usage = c->usage;
    /* kept until exit: the command reads them to the end */
    static const char **specs;
    if (c->many && !(specs = calloc((size_t)argc + 1, sizeof *specs)))
        return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    o->specs = specs;
    /* '-' first: arguments come back in order (as 1) whatever POSIXLY_CORRECT
     * says, so options may follow the SPEC; ':' next: a missing value is
     * told apart from an unknown option */
    char shorts[32];
    snprintf(shorts, sizeof shorts, "-:%s", c->shorts);
    opterr = 0;
    optind = 0;
    char name[64];
    int opt, rc;
    while ((opt = getopt_long(argc, argv, shorts, c->longs, NULL)) != -1) {
        const char *val = optarg;
        const char **slot = NULL;
        switch (opt) {
        case 1:
            if ((rc = add_spec(c, o, val)))
                return rc;
            break;
        case 'h': fputs(usage, stdout); return -1;
        case OPT_COMPLETION: list_options(c); return -1;
        case 'i':
        case 'p':
            if ((opt == 'i' ? o->n_shapes : o->n_params) == MAX_BINDINGS)
                return ebb_cli_usage_error(usage, "too many %s options", opt == 'i' ? "-i" : "-p");
            if (opt == 'i')
                o->shapes[o->n_shapes++] = val;
            else
                o->params[o->n_params++] = val;
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_KEEP_ALL: o->keep_all = 1; break;
        case OPT_MEMORY: o->memory = 1; break;
        case OPT_PLAN: o->plan_view = 1; break;
        case OPT_CUDA_GRAPH: o->cuda_graph = 1; break;
        case OPT_FORCE: o->force = 1; break;
        case OPT_STRICT_MEMORY: o->strict_memory = 1; break;
        case OPT_STRICT_FINITE: o->strict_finite = 1; break;
        case OPT_NON_STRICT: o->non_strict = 1; break;
        case OPT_TRAIN: o->train = 1; break;
        case OPT_GRADS_ONLY: o->grads_only = 1; break;
        case OPT_LOSS: slot = &o->loss; break;
        case OPT_OPTIMIZER: slot = &o->optimizer; break;
        case OPT_CLIP_GRAD_NORM:
        case OPT_CLIP_GRAD_VALUE: {
            char *end = NULL;
            double v = strtod(val, &end);
            if (end == val || *end || !(v > 0) || !isfinite(v))
                return ebb_cli_usage_error(usage, "%s needs a positive number",
                                           opt == OPT_CLIP_GRAD_NORM ? "--clip-grad-norm"
                                                                     : "--clip-grad-value");
            *(opt == OPT_CLIP_GRAD_NORM ? &o->clip_norm : &o->clip_value) = v;
            break;
        }
        case OPT_GRADS: slot = &o->grads; break;
        case OPT_MEMORY_BUDGET:
            if (!strcmp(val, "least"))
                o->memory_budget = EBB_MEMORY_BUDGET_LEAST;
            else if (ebb_bytes_parse(val, &o->memory_budget) != EBB_OK || o->memory_budget == 0)
                return ebb_cli_usage_error(usage, "--memory-budget %s: expected a byte count above 0, "
                                          "like 64MiB or 1.5GB, or `least`",
                                   val);
            break;
        case OPT_BATCH:
            if (parse_u64(val, &o->batch) != 0 || o->batch == 0 || o->batch > 1000000000)
                return ebb_cli_usage_error(usage, "%s", "--batch needs a positive integer");
            break;
        case OPT_SEED:
        case OPT_REPEAT: {
            uint64_t v;
            const char *n = opt == OPT_SEED ? "--seed" : "--repeat";
            if (parse_u64(val, &v) != 0)
                return ebb_cli_usage_error(usage, "%s needs a non-negative integer", n);
            if (opt == OPT_SEED)
                o->seed = v;
            else if (v < 1 || v > 1000000)
                return ebb_cli_usage_error(usage, "%s must be between 1 and 1000000", n);
            else
                o->repeat = (int)v;
            break;
        }
        case OPT_DEVICE: slot = &o->device; break;
        case OPT_WEIGHTS: slot = &o->weights; break;
        case OPT_SAVE_WEIGHTS: slot = &o->save_weights; break;
        case OPT_INPUTS: slot = &o->inputs; break;
        case OPT_OUTPUTS: slot = &o->outputs; break;
        case OPT_TRACE: slot = &o->trace; break;
        case 'o': slot = &o->out_file; break;
        case ':':
            option_name(c, optopt, name, sizeof name);
            if (optopt == 'i')
                return ebb_cli_usage_error(usage, "%s needs NAME=D0,D1,...", name);
            if (optopt == 'p')
                return ebb_cli_usage_error(usage, "%s needs NAME=NUMBER", name);
            if (optopt == OPT_SEED || optopt == OPT_REPEAT)
                return ebb_cli_usage_error(usage, "%s needs a non-negative integer", name);
            return ebb_cli_usage_error(usage, "%s needs a value", name);
        default: /* '?' */
            /* a known long option given a value it does not take */
            for (const struct option *lo = c->longs; optopt && lo->name; lo++)
                if (lo->val == optopt && lo->has_arg == no_argument &&
                    !strncmp(argv[optind - 1], "--", 2)) {
                    snprintf(name, sizeof name, "--%s", lo->name);
                    return ebb_cli_usage_error(usage, "option %s takes no value", name);
                }
            if (optopt > 0 && optopt < 256) {
                snprintf(name, sizeof name, "-%c", optopt);
                return ebb_cli_usage_error(usage, "unknown option %s", name);
            }
            /* an unknown or ambiguous long option, as written */
            return ebb_cli_unknown_option(usage, c->longs, argv[optind - 1]);
        }
        if (slot) {
            if (!*val)
                return ebb_cli_usage_error(usage, "%s needs a value", option_name(c, opt, name, sizeof name));
            *slot = val;
        }
    }
    for (; optind < argc; optind++) /* after `--` */
        if ((rc = add_spec(c, o, argv[optind])))
            return rc;
    if (!o->spec)
        return ebb_cli_usage_error(usage, "%s", "missing SPEC");
    if (o->non_strict && !o->weights)
        return ebb_cli_usage_error(usage, "%s", "--non-strict applies to --weights, which is not given");
    if ((o->clip_norm > 0 || o->clip_value > 0) && (!o->train || o->grads_only))
        return ebb_cli_usage_error(usage, "%s",
                                   "--clip-grad-norm and --clip-grad-value apply to --train (a "
                                   "step with updates)");
    if ((o->loss || o->optimizer || o->grads_only) && !o->train && strcmp(c->name, "grad") != 0)
        return ebb_cli_usage_error(usage, "%s",
                           "--loss, --optimizer and --grads-only apply to --train, which is not "
                           "given");
    if (o->optimizer && ebb_optimizer_kind_parse(NULL, o->optimizer) != EBB_OK)
        return ebb_cli_usage_error(usage, "--optimizer: %s", ebb_errmsg());
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
    for (int k = 0; k < o->n_shapes; k++)
        args[(*n)++] = o->shapes[k];
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
        return ebb_cli_usage_error(usage_main, "%s", "too many -i options");
    snprintf(buf, size, "%s=%llu", sym, (unsigned long long)o->batch);
    args[(*n)++] = buf;
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
        char a[128], b[128];
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
        const char *file_dtype = inputs ? ebb_safetensors_dtype_str(inputs, name) : NULL;
        ebb_shape fs;
        if (file_dtype && ebb_safetensors_find(inputs, name, NULL, &fs) != EBB_OK) {
            fprintf(stderr, "ebb: %s: input '%s' has dtype %s, which ebb does not support\n",
                    o->inputs, name, file_dtype);
            return EXIT_SPEC;
        }
        if (file_dtype) {
            int agrees = fs.ndim == ebb_spec_input_ndim(s, i);
            for (int d = 0; agrees && d < fs.ndim; d++) {
                int64_t fixed = ebb_spec_input_dim(s, i, d, NULL);
                agrees = fixed < 0 || fixed == fs.dim[d];
            }
            if (!agrees) {
                fprintf(stderr, "ebb: %s: input '%s' is %s, but %s declares it %s\n", o->inputs,
                        name, ebb_shape_str(&fs, a, sizeof a), ebb_spec_file(s),
                        declared_shape(s, i, b, sizeof b));
                return EXIT_SPEC;
            }
            /* the file's shape is used unless the user asked for another */
            const char *asked = explicit_arg[i];
            for (int d = 0; !asked && d < fs.ndim; d++) {
                const char *sym = NULL;
                ebb_spec_input_dim(s, i, d, &sym);
                if (sym && binding_for(bindings, n_bind, sym) && shapes[i].dim[d] != fs.dim[d])
                    asked = binding_for(bindings, n_bind, sym);
            }
            if (asked && !ebb_shape_equal(&fs, &shapes[i])) {
                fprintf(stderr, "ebb: %s: input '%s' is %s, but -i %s compiles the plan for %s\n",
                        o->inputs, name, ebb_shape_str(&fs, a, sizeof a), asked,
                        ebb_shape_str(&shapes[i], b, sizeof b));
                return EXIT_SPEC;
            }
            shapes[i] = fs;
        } else if (!explicit_shape[i] && !quiet) {
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

static ebb_status load_spec_path(const char *path, const options *o, ebb_spec **spec) {
    ebb_spec_options so = {.params = o->params, .n_params = o->n_params};
    if (!strcmp(path, "-"))
        return load_spec_stdin(spec, &so);
    if (!spec_file_ok(path))
        return ebb_errcode();
    return ebb_spec_load_ex(spec, path, &so);
}

static ebb_status load_spec(const options *o, ebb_spec **spec) {
    return load_spec_path(o->spec, o, spec);
}

/* A safetensors file given as `-`. The reader needs a regular file (it
 * reads each tensor at its offset), so a pipe is first copied into an
 * anonymous file in memory, which then becomes standard input; either way
 * the file is read as /dev/stdin, the name messages give it. */
static int stdin_safetensors(const char **path) {
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
                             .clip_grad_value = o->clip_value};
    t->optimizer.kind = EBB_ADAMW;
    if (o->optimizer) /* checked when the options were read */
        ebb_optimizer_kind_parse(&t->optimizer.kind, o->optimizer);
    return 0;
}

static int load_and_compile(const options *o, const ebb_safetensors *inputs, ebb_spec **spec,
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
                              .memory_budget = o->memory_budget};
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

static int64_t param_elements(const ebb_plan *p) {
    int64_t n = 0;
    for (int i = 0; i < ebb_plan_param_count(p); i++)
        n += ebb_shape_numel(&ebb_plan_param_at(p, i, NULL)->shape);
    return n;
}

/* ---- check --------------------------------------------------------------- */

static int cmd_check(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, find_command("check"), &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    int failed = 0;
    for (int i = 0; i < o.n_specs; i++) {
        const char *path = o.specs[i];
        ebb_spec *s = NULL;
        ebb_plan *p = NULL;
        ebb_status st = load_spec_path(path, &o, &s);
        if (st == EBB_OK)
            st = ebb_spec_compile(&p, s, NULL);
        if (st != EBB_OK) {
            fprintf(stderr, "%s\n", ebb_errmsg());
            failed = 1;
        } else {
            printf("%s: ok (%d steps, %lld parameters)\n", ebb_spec_file(s),
                   ebb_plan_step_count(p), (long long)param_elements(p));
        }
        ebb_plan_free(p);
        ebb_spec_free(s);
    }
    return failed ? EXIT_SPEC : 0;
}

/* ---- plan ---------------------------------------------------------------- */

static void memory_chart(const ebb_plan *p) {
    int at = 0;
    int64_t peak = ebb_plan_peak_bytes(p, &at);
    printf("\npredicted live bytes per step (peak %lld at step %d)\n", (long long)peak, at);
    for (int i = 0; i < ebb_plan_step_count(p); i++) {
        const ebb_plan_step *s = ebb_plan_step_at(p, i);
        int width = peak > 0 ? (int)((50.0 * (double)s->peak_bytes) / (double)peak + 0.5) : 0;
        char hb[32];
        ebb_bytes_str(s->peak_bytes, hb, sizeof hb);
        printf("%4d %-10.10s |", i, s->op);
        for (int k = 0; k < width; k++)
            fputs(i == at ? "#" : "=", stdout);
        printf("%*s| %s\n", 50 - width, "", hb);
    }
}

static int cmd_plan(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, find_command("plan"), &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    rc = load_and_compile(&o, NULL, &s, &p, o.json);
    if (!rc) {
        if (o.json)
            ebb_plan_write_json(p, stdout);
        else
            ebb_plan_print(p, stdout);
        if (o.memory && !o.json)
            memory_chart(p);
    }
    ebb_plan_free(p);
    ebb_spec_free(s);
    return rc;
}

/* ---- dot ----------------------------------------------------------------- */

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
static int fail_write(void) {
    fprintf(stderr, "ebb: %s\n", ebb_errmsg());
    return EXIT_RUNTIME;
}

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

/* What `dot -o` writes, by the file's extension; usage_dot and docs/cli.md
 * list the same (tests/test_cli.c compares them). */
static const char *const dot_text[] = {".dot", ".gv"};
static const char *const dot_rendered[] = {".svg", ".png", ".pdf", ".jpg",
                                           ".jpeg", ".gif", ".ps", ".eps"};

static int cmd_dot(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, find_command("dot"), &o);
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
        return ebb_cli_usage_error(usage_dot, list, o.out_file);
    }
    if ((o.train || o.memory_budget) && !o.plan_view)
        return ebb_cli_usage_error(usage_dot, "%s", "--train and --memory-budget apply to --plan, which "
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
            ebb_plan_write_dot(p, mem);
        else
            ebb_graph_write_dot(ebb_spec_graph(s), mem);
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

/* ---- chart --------------------------------------------------------------- */

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

static int cmd_chart(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, find_command("chart"), &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    /* the chart is SVG whatever the name says; a name that says otherwise
     * is a mistake */
    const char *base = o.out_file ? strrchr(o.out_file, '/') : NULL;
    const char *ext = o.out_file ? strrchr(base ? base : o.out_file, '.') : NULL;
    if (ext && strcmp(ext, ".svg"))
        return ebb_cli_usage_error(usage_chart,
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
        st = ebb_plan_chart_svg(p, o.trace ? &tr : NULL, w ? ebb_file_stream(w) : stdout);
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

/* ---- run ----------------------------------------------------------------- */


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
            (long long)e->info->peak_bytes, e->seconds);
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

/* Bytes of the graph inputs the command will create or load. */
static int64_t input_bytes(const ebb_plan *p) {
    int64_t n = 0;
    for (int i = 0; i < ebb_plan_input_count(p); i++) {
        const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_input_slot(p, i));
        n += ebb_shape_numel(&v->shape) * (int64_t)ebb_dtype_size(v->dtype);
    }
    return n;
}

static int cmd_run(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, find_command("run"), &o);
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
    rc = load_and_compile(&o, in_file, &s, &p, 0);
    if (rc)
        goto done;
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
                                 .mismatch = warn_mismatch};
    if ((st = ebb_model_new(&m, p, dev, o.seed)) != EBB_OK ||
        (o.weights && (st = ebb_model_load_ex(m, o.weights, &lo)) != EBB_OK)) {
        rc = ebb_cli_fail_status(st);
        goto done;
    }
    for (int i = 0; i < n_in; i++) {
        const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_input_slot(p, i));
        int64_t bad = 0;
        if (in_file && ebb_safetensors_dtype_str(in_file, v->name))
            st = ebb_safetensors_load_ex(&inputs[i], in_file, v->name, dev, &bad);
        else if (in_file)
            st = ebb_error_set(EBB_ERR_ARG, "%s: no tensor named '%s' (an input of %s)", o.inputs,
                               v->name, o.spec);
        else if (v->dtype == EBB_FLOAT32 || v->dtype == EBB_FLOAT64 || v->dtype == EBB_FLOAT16 ||
                 v->dtype == EBB_BFLOAT16)
            st = ebb_tensor_randn(&inputs[i], &v->shape, v->dtype, dev, o.seed + 1000 + (uint64_t)i);
        else /* indices: 0 is valid for every embedding and every loss */
            st = ebb_tensor_zeros(&inputs[i], &v->shape, v->dtype, dev);
        if (st == EBB_OK && bad && o.strict_finite)
            st = ebb_error_set(EBB_ERR_ARG, "%s: input '%s' holds %lld NaN or infinite values (of "
                                            "%lld)",
                               o.inputs, v->name, (long long)bad,
                               (long long)ebb_tensor_numel(inputs[i]));
        else if (st == EBB_OK && bad)
            warn_nonfinite(o.inputs, v->name, bad, ebb_tensor_numel(inputs[i]), "input");
        if (st != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
    }
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
    if (o.cuda_graph) {
        /* the eager run above gave the trace and memory figures; now time replays */
        ebb_capture *cap = NULL;
        if ((st = ebb_plan_capture(&cap, p, m, inputs)) != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
        for (int r = 0; r < o.repeat && st == EBB_OK; r++) {
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
        if (st != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
    }
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
    char mb[32], pb[32], kb[32], dn[32];
    ebb_bytes_str(peak, mb, sizeof mb);
    ebb_bytes_str(ebb_plan_device_peak_bytes(p, dev), pb, sizeof pb);
    ebb_bytes_str(ebb_plan_keep_all_peak_bytes(p), kb, sizeof kb);
    int bound = ebb_plan_peak_is_bound_on(p, dev);
    printf("peak intermediate bytes: measured %lld (%s), planned %lld (%s, %s), keep_all %lld "
           "(%s)\n",
           (long long)peak, mb, (long long)ebb_plan_device_peak_bytes(p, dev), pb,
           bound ? "upper bound" : "exact", (long long)ebb_plan_keep_all_peak_bytes(p), kb);
    if (bound && peak < ebb_plan_device_peak_bytes(p, dev))
        printf("(%s; this run's took %.0f%% of it)\n",
               ebb_plan_peak_is_bound(p)
                   ? "the plan routes rows or loops by value: its figure bounds every routing "
                     "and iteration count"
                   : "on this device some kernels are chosen at run time: its figure bounds "
                     "what they take",
               100.0 * (double)peak / (double)ebb_plan_device_peak_bytes(p, dev));
    if ((rc = ebb_cli_check_over(p, &over, peak, o.strict_memory, NULL)))
        goto done;
    printf("time on %s%s: median %.3f ms over %d run%s (min %.3f, max %.3f)\n",
           ebb_device_str(dev, dn, sizeof dn), o.cuda_graph ? " (CUDA graph replay)" : "", times[o.repeat / 2] * 1e3, o.repeat,
           o.repeat == 1 ? "" : "s", times[0] * 1e3, times[o.repeat - 1] * 1e3);
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
    if (o.outputs) {
        const char **names = calloc((size_t)n_out, sizeof *names);
        if (!names) {
            rc = ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
            goto done;
        }
        for (int k = 0; k < n_out; k++)
            names[k] = ebb_plan_output_name(p, k);
        st = ebb_safetensors_write(o.outputs, names, outputs, n_out);
        free(names);
        if (st != EBB_OK) {
            rc = st == EBB_ERR_NOMEM ? ebb_cli_fail_status(st) : fail_write();
            goto done;
        }
    }
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

/* ---- grad ---------------------------------------------------------------- */

static int cmd_grad(int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, find_command("grad"), &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (!o.inputs || !o.grads)
        return ebb_cli_usage_error(usage_grad, "%s", !o.inputs ? "--inputs is required (the inputs and "
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
    rc = load_and_compile(&o, in_file, &s, &p, 0);
    if (rc)
        goto done;
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
        return ebb_cli_usage_error(usage_main, "%s", "missing COMMAND");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        /* `ebb help plan`, as git: that command's help */
        if (argc > 3)
            return ebb_cli_usage_error(usage_main, "%s", "help takes one COMMAND");
        const command *c = argc == 3 ? find_command(argv[2]) : NULL;
        if (argc == 3 && !c)
            return unknown_command(argv[2]);
        fputs(c ? c->usage : usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        if (argc > 2)
            return ebb_cli_usage_error(usage_main, "unexpected argument %s", argv[2]);
        return print_version();
    }
    const command *c = find_command(cmd);
    if (!c && cmd[0] == '-')
        return ebb_cli_usage_error(usage_main, "unknown option %s", cmd);
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
    if (!strcmp(cmd, "check"))
        return cmd_check(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan"))
        return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "run"))
        return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "chart"))
        return cmd_chart(argc - 1, argv + 1);
    if (!strcmp(cmd, "grad"))
        return cmd_grad(argc - 1, argv + 1);
    if (!strcmp(cmd, "train"))
        return ebb_cli_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval"))
        return ebb_cli_eval(argc - 1, argv + 1);
    return cmd_dot(argc - 1, argv + 1);
}

int main(int argc, char **argv) {
    /* EPIPE instead of death by SIGPIPE: a renderer (`dot -T...`) that exits
     * early is an error to report, and a closed stdout is told apart at the
     * end (finish_stdout) */
    signal(SIGPIPE, SIG_IGN);
    return finish_stdout(dispatch(argc, argv));
}
