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
#include "flags.h"
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

/* --data-parallel N and --rank R (common.c) */
int cli_set_ranks(const cli_flag *f, const char *v, void *field, const char *usage);
int cli_set_rank(const cli_flag *f, const char *v, void *field, const char *usage);

/* Rows the commands over `options` share (flags.h). */
#define SHAPE_FLAG(arg, help)                                                                      \
    {'i', NULL, arg, cli_set_list, offsetof(options, shapes), 0, help, "NAME=D0,D1,..."}
#define PARAM_FLAG                                                                                 \
    {'p', NULL, "PARAM=N", cli_set_list, offsetof(options, params), 0,                             \
     "replace the value of one of the spec's params", "NAME=NUMBER"}
/* --batch B: -i SYMBOL=B for the spec's batch, as ebb train takes it */
#define BATCH_FLAG                                                                                 \
    FLAG_COUNT("batch", "B", options, batch,                                                       \
               "-i SYMBOL=B for the first input's symbolic first dimension")
#define SEED_FLAG(T, F, help)                                                                      \
    {0, "seed", "N", cli_set_u64, offsetof(T, F), 0, help, "a non-negative integer"}
/* --loss and --optimizer of a planned training step (plan, dot, chart) */
#define LOSS_OPTIMIZER_FLAGS                                                                       \
    FLAG_PATH("loss", "NAME", options, loss,                                                       \
              "with --train: this loss op instead of the spec's `loss:`"),                         \
        FLAG_ROW(0, "optimizer", "KIND", cli_set_optimizer, options, optimizer,                    \
                 "with --train: the updates to count (default adamw)")
/* The training step's recipes, which plan, dot and chart take alike (with
 * --train) */
#define CLIP_FLAGS                                                                                 \
    FLAG_ROW(0, "clip-grad-norm", "X", cli_set_positive, options, clip_norm,                       \
             "with --train: scale the gradients to a global L2 norm of at\n"                       \
             "most X (the updates wait for every gradient; the listing says\n"                     \
             "what that costs)"),                                                                  \
        FLAG_ROW(0, "clip-grad-value", "X", cli_set_positive, options, clip_value,                 \
                 "with --train: clamp each gradient to [-X, X] in its update"),                    \
        FLAG_ROW(0, "no-decay", "PATTERN", cli_set_pattern, options, no_decay,                     \
                 "with --train: the parameters whose full name matches update\n"                   \
                 "without weight decay ('*.bias'; repeatable)"),                                   \
        FLAG_ROW(0, "loss-scale", "S", cli_set_loss_scale, options, loss_scale,                    \
                 "with --train: plan dynamic loss scaling (GradScaler's unscale\n"                 \
                 "step, the updates after the backward); `none`: without it\n"                     \
                 "(default: with --precision fp16, as ebb train)"),                                \
        FLAG_COUNT("accumulate", "N", options, accumulate,                                         \
                   "with --train: sum N micro-batches' gradients before one update\n"             \
                   "(ebb train --accumulate N): a grad_sum step per parameter and\n"              \
                   "one grad_sums step, past which only a step's last goes"),                    \
        FLAG_ROW(0, "data-parallel", "N", cli_set_ranks, options, parallel.world,                   \
                 "with --train: one rank's step of N (ebb train --nproc N): the\n"                 \
                 "gradients averaged in all-reduce steps, bucket by bucket"),                      \
        FLAG_ROW(0, "bucket-size", "SIZE", cli_set_bytes, options, parallel.bucket_bytes,                    \
                 "with --data-parallel: a bucket's size (default 25MiB)"),                         \
        FLAG_SWITCH("zero", options, parallel.zero,                                                         \
                    "with --data-parallel: ZeRO-1, the optimizer's state sharded\n"                \
                    "over the ranks (ebb train --zero); the plan is one rank's"),                  \
        FLAG_ROW(0, "rank", "R", cli_set_rank, options, parallel.rank,                                      \
                 "with --zero: plan rank R's step (default 0)"),                                   \
        FLAG_SWITCH("overlap", options, parallel.overlap,                                                   \
                    "with --data-parallel: all-reduces travel while the backward\n"                \
                    "goes on (ebb train --overlap)"),                                              \
        FLAG_GIVEN("weight-copies", "HOW", cli_set_weight_copies, options, weight_copies,          \
                   weight_copies_set, WEIGHT_COPIES_HELP)

/* --strict-memory (run, grad) */
#define STRICT_MEMORY_FLAG                                                                         \
    FLAG_SWITCH("strict-memory", options, strict_memory,                                           \
                "a step that measures more than the plan promised is an error\n"                   \
                "(exit 3), not a warning")

/* Every command's help ends with COMMON_FLAGS; these commands' with `--` too. */
#define END_OF_OPTIONS_HELP                                                                        \
    FLAG_HELP_TEXT("  --                 end of options: what follows is a SPEC even if it "      \
                   "starts with -\n")


typedef struct options {
    const char *spec;
    const char **specs; /* check: every SPEC, in order */
    int n_specs;
    cli_list shapes;    /* -i */
    cli_list params;    /* -p */
    int json, keep_all, memory, plan_view, repeat, cuda_graph, force, strict_finite, non_strict;
    int strict_memory;
    int train, grads_only;
    uint64_t seed;
    const char *device, *weights, *save_weights, *inputs, *outputs, *trace, *out_file;
    const char *loss, *optimizer, *grads;
    int64_t memory_budget; /* 0: none */
    int64_t kv_cache;      /* --kv-cache N: generation's key/value cache (0: none) */
    double clip_norm, clip_value; /* --clip-grad-norm, --clip-grad-value; 0: none */
    double loss_scale;            /* --loss-scale: > 0 on, -1 none, 0 on with fp16 */
    int64_t accumulate;           /* --accumulate N: micro-batches a step (0: not given) */
    /* --data-parallel N (world; 0: one process), --bucket-size, --zero,
     * --rank R (-1: not given) and --overlap */
    ebb_parallel_options parallel;
    int weight_copies_set;        /* --weight-copies given */
    ebb_low_copies weight_copies; /* --weight-copies */
    cli_list no_decay;            /* --no-decay PATTERN */
    int64_t batch;                /* --batch; 0: not given */
    ebb_precision precision;      /* --precision; default: the spec's */
    ebb_device run_device;        /* where the plan will run (run, grad): the compile
                                     measures there the scratch its ops can only bound */
    int measure_scratch;          /* run, grad on the CPU: measure oneDNN's too */
} options;

/* Each command: its usage (the help's head), its flags (flags.h), the
 * help's tail where it has one, and its function, which parses its own
 * arguments (argv[0] is the command's name) and returns the exit code. */
extern const char ebb_cli_usage_main[];
extern const char ebb_cli_usage_check[];
extern const cli_flag ebb_cli_check_flags[];
extern const char ebb_cli_usage_check_tail[];
int ebb_cli_check(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_plan[];
extern const cli_flag ebb_cli_plan_flags[];
extern const char ebb_cli_usage_plan_tail[];
int ebb_cli_plan(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_dot[];
extern const cli_flag ebb_cli_dot_flags[];
extern const char ebb_cli_usage_dot_tail[];
int ebb_cli_dot(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_chart[];
extern const cli_flag ebb_cli_chart_flags[];
extern const char ebb_cli_usage_chart_tail[];
int ebb_cli_chart(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_run[];
extern const cli_flag ebb_cli_run_flags[];
extern const char ebb_cli_usage_run_tail[];
int ebb_cli_run(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_grad[];
extern const cli_flag ebb_cli_grad_flags[];
extern const char ebb_cli_usage_grad_tail[];
int ebb_cli_grad(const command *self, int argc, char **argv);
extern const char ebb_cli_usage_generate[];
extern const cli_flag ebb_cli_generate_flags[];
extern const char ebb_cli_usage_generate_tail[];
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
