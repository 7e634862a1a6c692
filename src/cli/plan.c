/* `ebb plan`: the plan listing (EXPLAIN), its JSON, its memory per step. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_plan[] =
    "usage: ebb plan SPEC [-i NAME=D0,D1,...]... [-p PARAM=N]... [--json] [--keep-all]\n"
    "                [--memory] [--train [--loss NAME] [--optimizer KIND]\n"
    "                [--clip-grad-norm X] [--clip-grad-value X] [--no-decay PATTERN]...\n"
    "                [--loss-scale S] [--accumulate N] [--weight-copies HOW]\n"
    "                [--data-parallel N [--bucket-size SIZE] [--overlap] [--zero [--rank R]]]]\n"
    "                [--memory-budget SIZE] [--kv-cache N]\n"
    "\n";

const cli_flag ebb_cli_plan_flags[] = {
    SHAPE_FLAG("NAME=D0,D1,...", "the shape of input NAME; or -i SYMBOL=N for a symbolic dim\n"
                                 "(symbolic dimensions not given are 1)"),
    BATCH_FLAG,
    PARAM_FLAG,
    FLAG_SWITCH("json", options, json, "the plan as JSON (see docs/cli.md)"),
    FLAG_SWITCH("keep-all", options, keep_all, "compile without freeing, to compare"),
    FLAG_SWITCH("memory", options, memory, "draw predicted live bytes per step"),
    FLAG_SWITCH("train", options, train,
                "plan a training step: forward, the spec's loss against its\n"
                "targets, backward and one update per parameter"),
    LOSS_OPTIMIZER_FLAGS,
    CLIP_FLAGS,
    FLAG_ROW(0, "memory-budget", "SIZE", cli_set_budget, options, memory_budget,
             "the most the step may take at its peak (64MiB, 1.5GB, bytes,\n"
             "or `least`):\n"
             "a training plan recomputes forward values in the backward to\n"
             "fit, and the listing shows what it recomputes and what it costs"),
    FLAG_COUNT("kv-cache", "N", options, kv_cache,
               "generation: plan causal attention through a key/value cache\n"
               "of N positions, which the listing shows (-i SYMBOL=1 for the\n"
               "plan of one next token)"),
    PRECISION_FLAG(options, precision),
    COMMON_FLAGS,
    END_OF_OPTIONS_HELP,
    FLAG_END,
};

const char ebb_cli_usage_plan_tail[] = "\nA SPEC of - is read from standard input.\n";

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

int ebb_cli_plan(const command *self, int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, self, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    ebb_spec *s = NULL;
    ebb_plan *p = NULL;
    rc = load_and_compile(&o, NULL, &s, &p, o.json);
    if (!rc) {
        if (o.json)
            ebb_plan_write_json(p, stdout);
        else
            ebb_plan_print_ex(p, stdout, ebb_spec_node_label, s);
        if (o.memory && !o.json)
            memory_chart(p);
    }
    ebb_plan_free(p);
    ebb_spec_free(s);
    return rc;
}
