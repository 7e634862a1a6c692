/* Shared by the `ebb` command's files: one file per command (check.c,
 * plan.c, run.c, grad.c, dot.c, chart.c, generate.c; train.c holds train
 * and eval), the
 * option parsing, shapes and spec loading they share (common.c), and
 * main.c, which only dispatches. Internal to the command. */
#ifndef EBB_CLI_H
#define EBB_CLI_H

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
    OPT_THREADS,
    OPT_TRAIN,
    OPT_LOSS,
    OPT_OPTIMIZER,
    OPT_GRADS,
    OPT_GRADS_ONLY,
    OPT_MEMORY_BUDGET,
    OPT_CLIP_GRAD_NORM,
    OPT_CLIP_GRAD_VALUE,
    OPT_NO_DECAY,
    OPT_BATCH,
    OPT_PRECISION,
    OPT_LOSS_SCALE,
    OPT_DATA_PARALLEL,
    OPT_BUCKET_SIZE,
    OPT_WEIGHT_COPIES,
    OPT_ZERO,
    OPT_RANK,
    OPT_OVERLAP,
};

/* --batch B: -i SYMBOL=B for the spec's batch, as ebb train takes it */
#define BATCH_OPTION {"batch", required_argument, NULL, OPT_BATCH}
/* --precision fp32|bf16|fp16: mixed precision (ebb_compile_options.precision) */
#define PRECISION_OPTION {"precision", required_argument, NULL, OPT_PRECISION}
#define PRECISION_HELP                                                                             \
    "  --precision P      fp32 (the default), bf16 or fp16: matrix products in the low\n"       \
    "                     dtype, norms, softmax and losses in float32, parameters\n"            \
    "                     float32; every cast a step of the plan\n"

/* The training step's options, which plan, dot and chart take alike (with
 * --train), and their help. */
#define TRAIN_OPTIONS                                                                              \
    {"train", no_argument, NULL, OPT_TRAIN}, {"loss", required_argument, NULL, OPT_LOSS},          \
        {"optimizer", required_argument, NULL, OPT_OPTIMIZER},                                     \
        {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},                             \
        {"clip-grad-norm", required_argument, NULL, OPT_CLIP_GRAD_NORM},                           \
        {"clip-grad-value", required_argument, NULL, OPT_CLIP_GRAD_VALUE},                         \
        {"loss-scale", required_argument, NULL, OPT_LOSS_SCALE},                                   \
        {"data-parallel", required_argument, NULL, OPT_DATA_PARALLEL},                             \
        {"bucket-size", required_argument, NULL, OPT_BUCKET_SIZE},                                 \
        {"weight-copies", required_argument, NULL, OPT_WEIGHT_COPIES},                             \
        {"zero", no_argument, NULL, OPT_ZERO}, {"rank", required_argument, NULL, OPT_RANK},        \
        {"overlap", no_argument, NULL, OPT_OVERLAP}, {                                              \
        "no-decay", required_argument, NULL, OPT_NO_DECAY                                          \
    }
#define CLIP_HELP                                                                                  \
    "  --clip-grad-norm X with --train: scale the gradients to a global L2 norm of at\n"           \
    "                     most X (the updates wait for every gradient; the listing says\n"        \
    "                     what that costs)\n"                                                      \
    "  --clip-grad-value X\n"                                                                      \
    "                     with --train: clamp each gradient to [-X, X] in its update\n"           \
    "  --no-decay PATTERN with --train: the parameters whose full name matches update\n"         \
    "                     without weight decay ('*.bias'; repeatable)\n"                        \
    "  --loss-scale S     with --train: plan dynamic loss scaling (GradScaler's unscale\n"      \
    "                     step, the updates after the backward); `none`: without it\n"        \
    "                     (default: with --precision fp16, as ebb train)\n"                   \
    "  --data-parallel N  with --train: one rank's step of N (ebb train --nproc N): the\n"      \
    "                     gradients averaged in all-reduce steps, bucket by bucket\n"         \
    "  --bucket-size SIZE with --data-parallel: a bucket's size (default 25MiB)\n"           \
    "  --zero             with --data-parallel: ZeRO-1, the optimizer's state sharded\n"       \
    "                     over the ranks (ebb train --zero); the plan is one rank's\n"        \
    "  --rank R           with --zero: plan rank R's step (default 0)\n"                      \
    "  --overlap          with --data-parallel: all-reduces travel while the backward\n"      \
    "                     goes on (ebb train --overlap)\n"                                      \
    WEIGHT_COPIES_HELP

#define COMMON_OPTIONS                                                                             \
    {"help", no_argument, NULL, 'h'}, {"completion-helper", no_argument, NULL, OPT_COMPLETION},    \
        {"threads", required_argument, NULL, OPT_THREADS}

typedef struct command {
    const char *name;
    const char *usage;
    const char *shorts;           /* getopt's short options */
    const struct option *longs;   /* the long ones: the parser's table */
    int many;                     /* takes several SPECs, not one */
    /* the command itself, handed its own row (argv[0] is its name) */
    int (*main)(const struct command *self, int argc, char **argv);
} command;

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
    double loss_scale;            /* --loss-scale: > 0 on, -1 none, 0 on with fp16 */
    int data_parallel;            /* --data-parallel N: ranks (0: one process) */
    int64_t bucket_size;          /* --bucket-size (0: the default) */
    int weight_copies_set;        /* --weight-copies given */
    int zero, rank;               /* --zero, --rank R (-1: not given) */
    int overlap;                  /* --overlap */
    ebb_low_copies weight_copies; /* --weight-copies */
    const char *no_decay[16];     /* --no-decay PATTERN */
    int n_no_decay;
    uint64_t batch;               /* --batch; 0: not given */
    ebb_precision precision;      /* --precision; default: the spec's */
    ebb_device run_device;        /* where the plan will run (run, grad): the compile
                                     measures there the scratch its ops can only bound */
    int measure_scratch;          /* run, grad on the CPU: measure oneDNN's too */
} options;

/* Every command's help ends with these, which every command takes (train's
 * and eval's with their own, src/cli/train.c). */
#define USAGE_COMMON                                                                               \
    THREADS_HELP                                                                                   \
    "  -h, --help         this help\n"                                                             \
    "  --completion-helper\n"                                                                      \
    "                     print the options above, one a line (for shell completion)\n"            \
    "  --                 end of options: what follows is a SPEC even if it starts with -\n"

/* Each command: its usage text, its options (the parser's table) and its
 * function, which parses its own arguments (argv[0] is the command's name)
 * and returns the exit code. */
extern const char ebb_cli_usage_main[];
extern const char ebb_cli_usage_check[];
extern const struct option ebb_cli_check_options[];
int ebb_cli_check(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_plan[];
extern const struct option ebb_cli_plan_options[];
int ebb_cli_plan(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_dot[];
extern const struct option ebb_cli_dot_options[];
int ebb_cli_dot(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_chart[];
extern const struct option ebb_cli_chart_options[];
int ebb_cli_chart(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_run[];
extern const struct option ebb_cli_run_options[];
int ebb_cli_run(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_grad[];
extern const struct option ebb_cli_grad_options[];
int ebb_cli_grad(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_generate[];
extern const struct option ebb_cli_generate_options[];
int ebb_cli_generate(const command *self, int argc, char **argv);


/* ---- common.c ---- */

/* Parses argv for command c into *o: 0, -1 when help or the completion list
 * was printed, or a usage error's exit code. */
int parse_options(int argc, char **argv, const command *c, options *o);
/* Loads the spec at `path` ("-": standard input) with o's -p values. */
ebb_status load_spec_path(const char *path, const options *o, ebb_spec **spec);
/* Loads o's SPEC. */
ebb_status load_spec(const options *o, ebb_spec **spec);
/* "-" as --inputs or --weights: standard input read into an anonymous file
 * first; *path is then that file's name. 0 or an exit code. */
int stdin_safetensors(const char **path);
/* Loads o's SPEC and compiles it with o's shapes (-i, --batch, or the
 * inputs file's), and with --train its training step. 0 or an exit code. */
int load_and_compile(const options *o, const ebb_safetensors *inputs, ebb_spec **spec,
                     ebb_plan **plan, int quiet);
/* The parameter elements of a plan, as `ebb check` counts them. */
int64_t param_elements(const ebb_plan *p);
/* An output that could not be written: the message, exit 3. */
int fail_write(void);

#endif /* EBB_CLI_H */
