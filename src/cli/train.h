/* `ebb train` and `ebb eval` (src/cli/train.c): their help, their option
 * tables (main.c lists them for `ebb help` and --completion-helper) and the
 * commands, each parsing its own arguments (argv[0] is the command's name). */
#ifndef EBB_CLI_TRAIN_H
#define EBB_CLI_TRAIN_H

#include <getopt.h>
#include <stdio.h>

#include "ebb/ebb.h"
#include "flags.h"

extern const char ebb_cli_usage_train[];
extern const char ebb_cli_usage_eval[];
extern const char ebb_cli_usage_train_tail[];
extern const char ebb_cli_usage_eval_tail[];
extern const cli_flag ebb_cli_train_flags[];
extern const cli_flag ebb_cli_eval_flags[];

/* Prints "ebb: " and fmt (with arg), then the command's synopsis (the usage
 * text up to its first blank line) and where its options are listed, to
 * stderr; returns the usage exit code (2). */
int ebb_cli_usage_error(const char *usage, const char *fmt, const char *arg);
/* --weight-copies VAL into *out; 0, or -1 when VAL is none of auto, keep
 * and recast. */
int ebb_cli_weight_copies(const char *val, ebb_low_copies *out);
/* --weight-copies auto|keep|recast (ebb_train_options.low_weight_copies) */
#define WEIGHT_COPIES_HELP                                                                         \
    "with a low --precision: where each backward gets the low\n"                                   \
    "copies of the weights its forward cast: auto (kept where\n"                                   \
    "that does not raise the peak), keep, or recast"

/* --threads, which every command takes (EBB_NUM_THREADS in the environment
 * the same): set before the plan is compiled, since some kernels' scratch
 * grows with the threads. Sets the threads from --threads VAL: 0, or a usage error naming it. */
int ebb_cli_set_threads(const char *usage, const char *val);

/* Warns once per process where --precision P (bf16, fp16) on the CPU saves
 * bytes but costs time: the CPU lacks that arithmetic, as oneDNN sees it. */
void ebb_cli_warn_precision(ebb_precision p, ebb_device d);

/* The usage error for an unknown option as written (argv's "--weigths=x"),
 * with a "did you mean" when one of `longs` is near. */
int ebb_cli_unknown_option(const char *usage, const struct option *longs, const char *written);
/* A non-negative decimal integer (a seed, a count) into *out: 0, or -1 for
 * anything else (a sign, trailing text, overflow). */
int ebb_cli_parse_u64(const char *s, uint64_t *out);
/* Prints ebb_errmsg(); returns exit 1 when the status says the input was at
 * fault (spec, shape, argument, file), else 3, a runtime failure. */
int ebb_cli_fail_status(ebb_status st);

/* The JSONL trace of `ebb run --trace` (docs/cli.md), written by
 * ebb_cli_trace_step as an ebb_run_options.trace callback with an
 * ebb_cli_trace as its user pointer (src/cli/run.c). */
typedef struct ebb_cli_trace {
    FILE *f;
    const ebb_plan *plan;
    int64_t steps; /* lines written */
} ebb_cli_trace;
void ebb_cli_trace_step(const ebb_trace_event *e, void *user);

/* Refuses, exit 2 with a message, a command whose outputs include the file
 * of one of its inputs or of another output. `list` holds triples, ending
 * at a NULL role: a role ("in", "out", or "out=WHAT": an output that may be
 * the file of input WHAT, which is read whole before it is written), what
 * the command line calls it ("--trace"), and its path (NULL: not given).
 * Every command's one check (src/cli/common.c). */
int ebb_cli_check_aliases(const char *const *list);

/* After a run that measured `measured` peak bytes: when that is more than
 * its plan promised, says so on stderr, naming the step the CPU's per-step
 * check caught (ebb_run_stats.over_step) and `when` ("at training step 3",
 * or NULL): a warning, or with `strict` (--strict-memory) an error. Returns
 * 0, or the runtime exit code (3) for the error. */
int ebb_cli_check_over(const ebb_plan *p, const ebb_run_stats *stats, int64_t measured,
                       int strict, const char *when);

/* --nproc N (src/cli/launch.c): this command again in N processes, ranks
 * 0 .. N-1 meeting on a free loopback port, watched as torchrun's agent
 * watches them (its signals passed on, the others stopped once one fails);
 * the first failure is the exit code, -1 when every rank succeeded. */
int ebb_cli_launch_ranks(int n, int argc, char **argv);
/* A rank --nproc started: dies with its launcher (a parent-death signal).
 * 0, or the runtime exit code when the launcher is already gone. */
int ebb_cli_follow_launcher(void);
/* SIGINT, SIGTERM and SIGHUP ask training to stop between steps (a second
 * one stops at once); one ignored when the command started stays ignored. */
void ebb_cli_signals_install(void);
void ebb_cli_signals_restore(void);
/* The signal that asked training to stop, 0 when none has; its name. */
int ebb_cli_stop_signal(void);
const char *ebb_cli_signal_name(int sig);

int ebb_cli_train(const command *self, int argc, char **argv);
int ebb_cli_eval(const command *self, int argc, char **argv);

#endif /* EBB_CLI_TRAIN_H */
