/* The `ebb` command's flags, one row each, as git's parse-options: a row
 * says the flag's letter and name, its value, the field of the command's
 * options it sets and how, and its help. The parser, the help text and
 * --completion-helper are all made from the rows, so a flag is written
 * once:
 *
 *     FLAG_COUNT("epochs", "N", topts, epochs, "passes over the data (default 1)"),
 *
 * A command lists its rows in its help's order, shared groups of rows as
 * macros (TRAIN_FLAGS, COMMON_FLAGS). What depends on several flags at once
 * ("--zero applies to --data-parallel") is each command's check after the
 * parse. Internal to the command (src/cli/). */
#ifndef EBB_CLI_FLAGS_H
#define EBB_CLI_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ebb/ebb.h"

/* A repeatable flag's values (-p, --freeze), in the order given. */
#define CLI_LIST_MAX 64
typedef struct cli_list {
    const char *v[CLI_LIST_MAX];
    int n;
} cli_list;

typedef struct cli_flag cli_flag;

/* Reads `value` (NULL for a switch) into `field`, the row's field of the
 * command's options. Returns 0, or a usage error's exit code (from
 * ebb_cli_usage_error(usage, ...), naming the flag). */
typedef int (*cli_flag_set)(const cli_flag *f, const char *value, void *field, const char *usage);

struct cli_flag {
    char letter;      /* -p; 0: long only */
    const char *name; /* --memory-budget without its dashes; NULL: a letter only */
    const char *arg;  /* the value as the help writes it ("SIZE"); NULL: a switch */
    cli_flag_set set; /* NULL: a line of help only, no flag */
    size_t at;        /* offsetof the field it sets */
    size_t given;     /* offsetof + 1 of an int set to 1 when the flag is given; 0: none */
    const char *help; /* lines joined by '\n', each at most 59 columns, shown from
                       * column 21 (a help-only row's are shown as they are) */
    const char *needs; /* "X needs NEEDS" when the value is missing; NULL: "a value" */
};

/* A decimal integer from lo to hi into *out: 0, or -1 for anything else
 * (empty, trailing text, out of range). For a setter's own checks. */
int cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* Setters for the usual kinds of value. */
int cli_set_switch(const cli_flag *f, const char *v, void *field, const char *usage); /* int = 1 */
int cli_set_path(const cli_flag *f, const char *v, void *field, const char *usage); /* non-empty */
int cli_set_text(const cli_flag *f, const char *v, void *field, const char *usage); /* any */
int cli_set_list(const cli_flag *f, const char *v, void *field, const char *usage); /* cli_list */
int cli_set_pattern(const cli_flag *f, const char *v, void *field, const char *usage); /* no comma */
int cli_set_count(const cli_flag *f, const char *v, void *field, const char *usage); /* int64 >= 1 */
int cli_set_u64(const cli_flag *f, const char *v, void *field, const char *usage);   /* uint64 */
int cli_set_rate(const cli_flag *f, const char *v, void *field, const char *usage);  /* double >= 0 */
int cli_set_positive(const cli_flag *f, const char *v, void *field, const char *usage); /* > 0 */
int cli_set_bytes(const cli_flag *f, const char *v, void *field, const char *usage); /* int64 > 0 */
int cli_set_budget(const cli_flag *f, const char *v, void *field, const char *usage); /* or least */
int cli_set_precision(const cli_flag *f, const char *v, void *field, const char *usage);
int cli_set_weight_copies(const cli_flag *f, const char *v, void *field, const char *usage);
int cli_set_loss_scale(const cli_flag *f, const char *v, void *field, const char *usage);
int cli_set_optimizer(const cli_flag *f, const char *v, void *field, const char *usage);
/* Recognised by the parser itself: the help, the completion list, --threads. */
int cli_set_help(const cli_flag *f, const char *v, void *field, const char *usage);
int cli_set_completion(const cli_flag *f, const char *v, void *field, const char *usage);
int cli_set_threads(const cli_flag *f, const char *v, void *field, const char *usage);

/* Rows. T is the options struct, F the field (a path: common.spec). */
#define FLAG_ROW(letter, name, arg, set, T, F, help) \
    {letter, name, arg, set, offsetof(T, F), 0, help, NULL}
#define FLAG_SWITCH(name, T, F, help) FLAG_ROW(0, name, NULL, cli_set_switch, T, F, help)
#define FLAG_PATH(name, arg, T, F, help) FLAG_ROW(0, name, arg, cli_set_path, T, F, help)
#define FLAG_COUNT(name, arg, T, F, help) FLAG_ROW(0, name, arg, cli_set_count, T, F, help)
/* a row whose setter also sets the int G of T to 1 */
#define FLAG_GIVEN(name, arg, set, T, F, G, help) \
    {0, name, arg, set, offsetof(T, F), offsetof(T, G) + 1, help, NULL}
#define FLAG_HELP_TEXT(text) {0, NULL, NULL, NULL, 0, 0, text, NULL}
#define FLAG_END {0, NULL, NULL, NULL, 0, 0, NULL, NULL}

/* --precision fp32|bf16|fp16: mixed precision (ebb_compile_options.precision) */
#define PRECISION_FLAG(T, F)                                                                       \
    FLAG_ROW(0, "precision", "P", cli_set_precision, T, F,                                         \
             "fp32 (the default), bf16 or fp16: matrix products in the low\n"                      \
             "dtype, norms, softmax and losses in float32, parameters\n"                           \
             "float32; every cast a step of the plan")
/* -h, --help; --completion-helper; --threads; `--` (every command's last rows) */
#define COMMON_FLAGS                                                                               \
    {0, "threads", "N", cli_set_threads, 0, 0,                                                     \
     "libtorch's intra-op threads (default: EBB_NUM_THREADS, else\n"                              \
     "one per core the load average leaves idle)", NULL},                                         \
    {'h', "help", NULL, cli_set_help, 0, 0, "this help", NULL},                                    \
    {0, "completion-helper", NULL, cli_set_completion, 0, 0,                                       \
     "print the options above, one a line (for shell completion)", NULL}

/* A command as the dispatcher (main.c) lists it and hands it its own row. */
typedef struct command {
    const char *name;
    const char *usage;         /* the synopsis and what the command does: the help's head */
    const cli_flag *flags;     /* its flags in the help's order, ending with FLAG_END */
    const char *usage_tail;    /* the help after the flags, or NULL */
    int many;                  /* takes several SPECs, not one */
    /* the command itself, handed its own row (argv[0] is its name) */
    int (*main)(const struct command *self, int argc, char **argv);
} command;

/* Parses argv[1..] (argv[0] is the command's name) into opts by c's rows.
 * Each argument that is not a flag goes to positional() in order (options
 * may follow it; after `--` everything is one). Returns 0, -1 when the help
 * or the completion list was printed, or a usage error's exit code. */
int cli_flags_parse(const command *c, int argc, char **argv, void *opts,
                    int (*positional)(const command *c, void *opts, const char *arg));

/* The command's help: its usage, the rows' help, its tail. */
void cli_flags_help(const command *c, FILE *f);

#endif /* EBB_CLI_FLAGS_H */
