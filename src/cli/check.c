/* `ebb check SPEC...`: load and compile each spec, say ok or why not. */
#define _GNU_SOURCE /* getopt_long, memfd_create */
#include "cli.h"

const char ebb_cli_usage_check[] = "usage: ebb check [--] SPEC...\n"
                                   "\n"
                                   "Loads and compiles each spec (symbolic dimensions set to 1),\n"
                                   "and its training step too (at 2) when it declares a loss. Prints\n"
                                   "'SPEC: ok (N steps, P parameters)', P counted as PyTorch's\n"
                                   "parameters() (tied weights once, buffers apart), or\n"
                                   "'SPEC:LINE:COL: error: ...' on stderr. Exit 1 on any error.\n"
                                   "A SPEC of - is read from standard input.\n"
                                   "\n";

const cli_flag ebb_cli_check_flags[] = {COMMON_FLAGS, END_OF_OPTIONS_HELP, FLAG_END};

const char ebb_cli_usage_check_tail[] = "";

/* Trained parameters' elements and buffers' (batch_norm's running
 * statistics), as PyTorch counts parameters() and buffers() apart. */
static void count_params(const ebb_plan *p, int64_t *params, int64_t *buffers) {
    *params = *buffers = 0;
    for (int i = 0; i < ebb_plan_param_count(p); i++) {
        const ebb_param_spec *ps = ebb_plan_param_at(p, i, NULL);
        *(ps->buffer || ps->counter ? buffers : params) += ebb_shape_numel(&ps->shape);
    }
}

/* Adds "SYMBOL=2" for each symbolic dimension not yet bound. */
static void bind_two(const char *symbol, char bind[][72], const char **binds, int *n, int max) {
    if (!symbol)
        return;
    for (int i = 0; i < *n; i++)
        if (strncmp(binds[i], symbol, strlen(symbol)) == 0 && binds[i][strlen(symbol)] == '=')
            return;
    if (*n < max && strlen(symbol) < 64) {
        snprintf(bind[*n], sizeof bind[*n], "%s=2", symbol);
        binds[*n] = bind[*n];
        (*n)++;
    }
}

/* A spec with a loss: its training step compiles too, so a loss that cannot
 * take the final stream and the targets fails here, as in `ebb plan --train`.
 * Symbolic dimensions are 2 there: a batch of one has no statistics for a
 * training batch_norm over 1x1 maps, which is no fault of the spec. */
static ebb_status check_training(const ebb_spec *s) {
    if (!ebb_graph_loss(ebb_spec_graph(s)))
        return EBB_OK;
    enum { MAX = 16 };
    char bind[MAX][72];
    const char *binds[MAX];
    int n = 0, n_in = ebb_spec_input_count(s), n_tg = ebb_spec_target_count(s);
    for (int i = 0; i < n_in; i++)
        for (int d = 0; d < ebb_spec_input_ndim(s, i); d++) {
            const char *sym = NULL;
            ebb_spec_input_dim(s, i, d, &sym);
            bind_two(sym, bind, binds, &n, MAX);
        }
    for (int i = 0; i < n_tg; i++)
        for (int d = 0; d < ebb_spec_target_ndim(s, i); d++) {
            const char *sym = NULL;
            ebb_spec_target_dim(s, i, d, &sym);
            bind_two(sym, bind, binds, &n, MAX);
        }
    ebb_shape in[8], tg[8];
    if (n_in > 8 || n_tg > 8)
        return EBB_OK; /* the inference compile has checked the structure */
    ebb_status st = ebb_spec_resolve_shapes(s, binds, n, in, 8);
    if (st == EBB_OK)
        st = ebb_spec_resolve_target_shapes(s, binds, n, tg, 8);
    if (st != EBB_OK)
        return st;
    ebb_train_options t = {.target_shapes = tg, .n_target_shapes = n_tg};
    ebb_compile_options o = {.input_shapes = in, .n_input_shapes = n_in, .train = &t};
    ebb_plan *p = NULL;
    st = ebb_spec_compile(&p, s, &o);
    ebb_plan_free(p);
    return st;
}

int ebb_cli_check(const command *self, int argc, char **argv) {
    options o;
    int rc = parse_options(argc, argv, self, &o);
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
        if (st == EBB_OK)
            st = check_training(s);
        if (st != EBB_OK) {
            fprintf(stderr, "%s\n", ebb_errmsg());
            failed = 1;
        } else {
            int64_t params = 0, buffers = 0;
            count_params(p, &params, &buffers);
            printf("%s: ok (%d steps, %lld parameters", ebb_spec_file(s), ebb_plan_step_count(p),
                   (long long)params);
            if (buffers)
                printf(", %lld in buffers", (long long)buffers);
            printf(")\n");
        }
        ebb_plan_free(p);
        ebb_spec_free(s);
    }
    return failed ? EXIT_SPEC : 0;
}
