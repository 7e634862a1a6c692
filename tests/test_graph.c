/* The graph core: builder errors, liveness seen through run traces, measured
 * against planned bytes, numerics of every node kind, failure cleanup and
 * concurrent runs. */
#include <pthread.h>

#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};

/* ---- a recorded trace ---------------------------------------------------- */

#define MAX_EV 4096
#define MAX_SL 16

typedef struct event {
    int step;
    ebb_step_kind kind;
    int in[MAX_SL], n_in;
    int out[MAX_SL], n_out;
    int freed[64], n_freed;
    int jumped;
    int64_t live;
} event;

typedef struct trace {
    event ev[MAX_EV];
    int n;
} trace;

static void record(const ebb_trace_event *e, void *user) {
    trace *t = user;
    if (t->n == MAX_EV)
        return;
    event *v = &t->ev[t->n++];
    v->step = e->step;
    v->kind = e->info->kind;
    v->n_in = e->info->n_in < MAX_SL ? e->info->n_in : MAX_SL;
    /* the plan's arrays are NULL when empty, and memcpy(dst, NULL, 0) is
     * undefined behaviour (UBSan reports it) */
    if (v->n_in)
        memcpy(v->in, e->info->in, (size_t)v->n_in * sizeof(int));
    v->n_out = e->info->n_out < MAX_SL ? e->info->n_out : MAX_SL;
    if (v->n_out)
        memcpy(v->out, e->info->out, (size_t)v->n_out * sizeof(int));
    v->n_freed = e->n_freed < 64 ? e->n_freed : 64;
    if (v->n_freed)
        memcpy(v->freed, e->freed, (size_t)v->n_freed * sizeof(int));
    v->jumped = e->jumped;
    v->live = e->live_bytes;
}

static int has(const int *a, int n, int x) {
    for (int i = 0; i < n; i++)
        if (a[i] == x)
            return 1;
    return 0;
}

/* Is step index `i` inside the loop that LOOP_NEXT step `next` closes? */
/* Checks, from the trace alone, that every intermediate value was freed right
 * after the event that last read it. The exceptions are the two the plan
 * promises: a value read inside a loop but made outside it is freed when the
 * loop exits, and a value only a skipped branch reads is freed at the skip.
 * Returns the number of values checked. */
static int check_freed_at_last_use(const ebb_plan *p, const trace *t) {
    int checked = 0;
    for (int d = 0; d < t->n; d++) {
        for (int k = 0; k < t->ev[d].n_out; k++) {
            int v = t->ev[d].out[k];
            const ebb_plan_value *val = ebb_plan_value_at(p, v);
            if (val->kind != EBB_VALUE_INTERMEDIATE)
                continue;
            if (t->ev[d].kind == EBB_STEP_ROUTE && k == 1)
                continue; /* the empty accumulator: filled by the exits */
            if (t->ev[d].kind == EBB_STEP_ENTER && t->ev[d].jumped)
                continue; /* a skipped branch made nothing */
            /* the last read before v is freed or written again */
            int r = d, f = -1;
            for (int e = d; e < t->n; e++) {
                if (e > d && has(t->ev[e].in, t->ev[e].n_in, v))
                    r = e;
                if (has(t->ev[e].freed, t->ev[e].n_freed, v)) {
                    f = e;
                    break;
                }
                if (e > d && has(t->ev[e].out, t->ev[e].n_out, v) &&
                    !has(t->ev[e].in, t->ev[e].n_in, v))
                    break; /* redefined without being read: the loop state */
            }
            if (f < 0) {
                /* redefined in place (accumulator, loop state): checked at the
                 * definition that finally dies */
                continue;
            }
            checked++;
            if (f == r)
                continue;
            const event *fe = &t->ev[f];
            int ok = 0;
            int next = -1; /* the LOOP_NEXT of a loop being left */
            if (fe->kind == EBB_STEP_LOOP_NEXT && !fe->jumped)
                next = fe->step;
            else if ((fe->kind == EBB_STEP_JUMP_IF || fe->kind == EBB_STEP_LOOP_INIT) && fe->jumped)
                next = ebb_plan_step_at(p, fe->step)->jump - 1;
            if (next >= 0) {
                /* freed as the loop exits: made before the loop, read in it */
                ok = ebb_plan_step_at(p, next)->kind == EBB_STEP_LOOP_NEXT &&
                     t->ev[d].step < ebb_plan_step_at(p, next)->jump;
                for (int s = ebb_plan_step_at(p, next)->jump; ok && s <= next; s++) {
                    const ebb_plan_step *ps = ebb_plan_step_at(p, s);
                    if (has(ps->in, ps->n_in, v))
                        break;
                    if (s == next)
                        ok = 0;
                }
            } else if (fe->kind == EBB_STEP_ENTER && fe->jumped) {
                /* freed at a skip: a step of the skipped branch reads it */
                const ebb_plan_step *en = ebb_plan_step_at(p, fe->step);
                for (int s = fe->step + 1; s < en->jump && !ok; s++) {
                    const ebb_plan_step *ps = ebb_plan_step_at(p, s);
                    ok = has(ps->in, ps->n_in, v);
                }
            }
            if (!ok)
                fail_msg("value %%%d (made at step %d) last read at step %d but freed at step %d",
                         v, t->ev[d].step, t->ev[r].step, fe->step);
        }
    }
    return checked;
}

/* ---- helpers ------------------------------------------------------------- */

static ebb_tensor *input(int64_t b, int64_t d, uint64_t seed) {
    ebb_shape s = EBB_SHAPE(b, d);
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_randn(&t, &s, EBB_FLOAT32, CPU, seed));
    return t;
}

static ebb_graph *build_or_fail(ebb_builder *b) {
    ebb_graph *g = ebb_build(b);
    if (!g)
        fail_msg("ebb_build: %s", ebb_errmsg());
    ebb_builder_free(b);
    return g;
}

static ebb_plan *compile(const ebb_graph *g, int64_t batch, int64_t dim, int keep_all) {
    ebb_shape s = EBB_SHAPE(batch, dim);
    ebb_compile_options o = {.input_shapes = &s, .n_input_shapes = 1, .keep_all = keep_all};
    ebb_plan *p = NULL;
    assert_ok(ebb_compile(&p, g, &o));
    return p;
}

/* Runs with a trace; checks liveness from the trace; returns output 0. */
static ebb_tensor *run_checked(const ebb_plan *p, const ebb_model *m, ebb_tensor *x, trace *t,
                               ebb_run_stats *st) {
    ebb_tensor *outs[8] = {0};
    ebb_run_options o = {.trace = record, .trace_user = t};
    t->n = 0;
    assert_ok(ebb_run_ex(p, m, &x, outs, &o, st));
    check_freed_at_last_use(p, t);
    for (int i = 1; i < ebb_plan_output_count(p); i++)
        ebb_tensor_free(outs[i]);
    return outs[0];
}

static void assert_close(const ebb_tensor *a, const ebb_tensor *b, double tol) {
    double d = -1;
    assert_ok(ebb_tensor_max_abs_diff(a, b, &d));
    if (d > tol)
        fail_msg("max |a-b| = %g > %g", d, tol);
}

/* reference: x @ W^T + b with the model's parameters */
static ebb_tensor *ref_linear(const ebb_model *m, const char *name, const ebb_tensor *x) {
    char w[128], b[128];
    snprintf(w, sizeof w, "%s.weight", name);
    snprintf(b, sizeof b, "%s.bias", name);
    assert_non_null(ebb_model_param(m, w));
    ebb_tensor *y = NULL;
    assert_ok(ebb_tensor_linear(&y, x, ebb_model_param(m, w), ebb_model_param(m, b)));
    return y;
}

static ebb_tensor *ref_unary(ebb_unary_op op, ebb_tensor *x, int free_x) {
    ebb_tensor *y = NULL;
    assert_ok(ebb_tensor_unary(&y, op, x));
    if (free_x)
        ebb_tensor_free(x);
    return y;
}

static ebb_tensor *ref_add(ebb_tensor *a, ebb_tensor *b, int free_both) {
    ebb_tensor *y = NULL;
    assert_ok(ebb_tensor_binary(&y, EBB_ADD, a, b));
    if (free_both) {
        ebb_tensor_free(a);
        ebb_tensor_free(b);
    }
    return y;
}

/* A test op: the integer in each row's first column, as a switch index. */
static ebb_status first_col_fwd(const ebb_op_call *c, ebb_tensor **out) {
    ebb_tensor *col = NULL;
    ebb_status st = ebb_tensor_select(&col, c->in[0], 1, 0);
    if (st == EBB_OK)
        st = ebb_tensor_cast(out, col, EBB_INT64);
    ebb_tensor_free(col);
    return st;
}
static const ebb_op first_col_op = {.name = "test_first_col", .min_inputs = 1, .max_inputs = 1,
                                    .forward = first_col_fwd};

/* A test op that fails at run time when its input has a negative mean. */
static ebb_status fail_neg_fwd(const ebb_op_call *c, ebb_tensor **out) {
    double m = 0;
    ebb_status st = ebb_tensor_mean_value(c->in[0], &m);
    if (st != EBB_OK)
        return st;
    if (m < 0)
        return ebb_error_set(EBB_ERR_RUNTIME, "test_fail_negative: mean %.3f is negative", m);
    return ebb_tensor_ref(out, c->in[0]);
}
static const ebb_op fail_neg_op = {.name = "test_fail_negative", .min_inputs = 1, .max_inputs = 1,
                                   .is_view = 1, .forward = fail_neg_fwd};

/* A stand-in loss for the builder's checks (never run): two inputs, the
 * final stream and one target, and attributes of two types. */
static const ebb_attr_spec pair_loss_attrs[] = {
    {.name = "scale", .type = EBB_ATTR_FLOAT, .default_number = 1.0},
    {.name = "reduction", .type = EBB_ATTR_STRING, .default_string = "mean"},
};
static ebb_status pair_loss_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_ref(out, c->in[0]);
}
static const ebb_op pair_loss_op = {.name = "test_pair_loss", .min_inputs = 2, .max_inputs = 2,
                                    .attrs = pair_loss_attrs, .n_attrs = 2,
                                    .forward = pair_loss_fwd};

static int register_test_ops(void **state) {
    (void)state;
    if (ebb_init() != EBB_OK)
        return -1;
    if (!ebb_op_find("test_pair_loss") && ebb_op_register(&pair_loss_op) != EBB_OK)
        return -1;
    if (!ebb_op_find("test_first_col") && ebb_op_register(&first_col_op) != EBB_OK)
        return -1;
    if (!ebb_op_find("test_fail_negative") && ebb_op_register(&fail_neg_op) != EBB_OK)
        return -1;
    return 0;
}

/* ---- builder errors ------------------------------------------------------ */

static void expect_build_error(ebb_builder *b, const char *needle) {
    ebb_graph *g = ebb_build(b);
    assert_null(g);
    assert_int_not_equal(ebb_errcode(), EBB_OK);
    assert_errmsg_contains(needle);
    ebb_builder_free(b);
}

static void test_builder_sticky_errors(void **state) {
    (void)state;
    ebb_builder *b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", "out=4"));
    ebb_merge(b, EBB_MERGE_ADD, 0);                 /* fails: the first error */
    ebb_through(b, ebb_node_op(b, "nope", NULL));   /* no-op, would also fail */
    ebb_tag(b, "h");
    assert_int_equal(ebb_builder_status(b), EBB_ERR_BUILD);
    assert_string_equal(ebb_builder_errmsg(b), "ebb_merge: only 1 open stream");
    expect_build_error(b, "ebb_merge: only 1 open stream");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_using(b, "h", NULL);
    expect_build_error(b, "ebb_using: undefined tag 'h'");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_tag(b, "h");
    ebb_tag(b, "h");
    expect_build_error(b, "ebb_tag: duplicate tag 'h'");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_split(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "tanh", NULL), NULL);
    expect_build_error(b, "2 open streams left at the end");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_split(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "tanh", NULL), NULL);
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    expect_build_error(b, "ebb_through: 2 open streams");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "lineer", "out=4"));
    expect_build_error(b, "ebb_node_op: unknown op 'lineer'");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", "out=4, bais=false"));
    expect_build_error(b, "linear has no attribute 'bais'");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", "out=four"));
    expect_build_error(b, "attribute 'out' must be an integer, got 'four'");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", NULL));
    expect_build_error(b, "linear needs attribute 'out'");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "add", NULL));
    expect_build_error(b, "ebb_through: add takes at least 2 inputs, given 1");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_tag(b, "h");
    ebb_using(b, "h", NULL);
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    expect_build_error(b, "ebb_through: relu takes 1 input, given 2");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_gate(b, ebb_node_op(b, "linear", "out=2"), 3, ebb_node_op(b, "relu", NULL),
             ebb_node_op(b, "tanh", NULL), NULL);
    expect_build_error(b, "ebb_gate: top_k=3 with 2 experts");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_switch(b, ebb_node_op(b, "linear", "out=2"), ebb_node_op(b, "relu", NULL), NULL);
    expect_build_error(b, "ebb_switch: needs at least 2 branches, given 1");

    b = ebb_builder_new("bad");
    ebb_node *shared = ebb_node_op(b, "relu", NULL);
    ebb_from(b, shared);
    ebb_through(b, shared);
    expect_build_error(b, "already used");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_using(b, "x", NULL);
    expect_build_error(b, "ebb_using was not followed by a from/through");

    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_seq(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "add", NULL), NULL));
    expect_build_error(b, "ebb_node_seq: element 1 (add) takes 2 inputs");

    /* a compile-time shape contradiction names the node and both sizes */
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", "out=8, in=5, name=stem"));
    ebb_graph *g = build_or_fail(b);
    ebb_shape s = EBB_SHAPE(2, 4);
    ebb_compile_options o = {.input_shapes = &s, .n_input_shapes = 1};
    ebb_plan *p = NULL;
    assert_int_equal(ebb_compile(&p, g, &o), EBB_ERR_SHAPE);
    assert_null(p);
    assert_errmsg_contains("node stem");
    assert_errmsg_contains("in=5");
    assert_errmsg_contains("[2, 4]");
    ebb_graph_free(g);
}

/* ---- targets and the loss ------------------------------------------------- */

/* A builder error, read exactly, then through ebb_build. */
static void expect_exact_build_error(ebb_builder *b, const char *msg) {
    assert_int_equal(ebb_builder_status(b), EBB_ERR_BUILD);
    assert_string_equal(ebb_builder_errmsg(b), msg);
    expect_build_error(b, msg);
}

static void test_builder_targets_and_loss(void **state) {
    (void)state;
    /* targets and a loss travel into the graph; the forward ignores them */
    ebb_builder *b = ebb_builder_new("trained");
    ebb_input(b, "x");
    ebb_target(b, "label");
    ebb_loss(b, "test_pair_loss", "scale=0.5, reduction=\"sum\"");
    ebb_from(b, ebb_node_op(b, "linear", "out=3, name=head"));
    ebb_graph *g = build_or_fail(b);
    assert_int_equal(ebb_graph_input_count(g), 1);
    assert_int_equal(ebb_graph_target_count(g), 1);
    assert_string_equal(ebb_graph_target_name(g, 0), "label");
    assert_null(ebb_graph_target_name(g, 1));
    assert_null(ebb_graph_target_name(g, -1));
    assert_string_equal(ebb_graph_loss(g), "test_pair_loss");
    ebb_plan *p = compile(g, 4, 5, 0);
    assert_int_equal(ebb_plan_input_count(p), 1);
    assert_int_equal(ebb_plan_output_count(p), 1);
    ebb_plan_free(p);
    ebb_graph_free(g);

    /* a target may come after the flow; none and no loss is the default */
    b = ebb_builder_new("plain");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    g = build_or_fail(b);
    assert_int_equal(ebb_graph_target_count(g), 0);
    assert_null(ebb_graph_loss(g));
    ebb_graph_free(g);
    b = ebb_builder_new("late");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_target(b, "y");
    ebb_loss(b, "test_pair_loss", NULL);
    g = build_or_fail(b);
    assert_string_equal(ebb_graph_target_name(g, 0), "y");
    ebb_graph_free(g);
    assert_int_equal(ebb_graph_target_count(NULL), 0);
    assert_null(ebb_graph_target_name(NULL, 0));
    assert_null(ebb_graph_loss(NULL));

    /* names: valid, and not an input, tag or target already */
    b = ebb_builder_new("bad");
    ebb_target(b, NULL);
    ebb_target(b, "y"); /* sticky: ignored */
    expect_exact_build_error(b, "ebb_target: invalid target name '(null)'");
    b = ebb_builder_new("bad");
    ebb_target(b, "1y");
    expect_exact_build_error(b, "ebb_target: invalid target name '1y'");
    b = ebb_builder_new("bad");
    ebb_target(b, "y");
    ebb_target(b, "y");
    expect_exact_build_error(b, "ebb_target: duplicate target 'y'");
    b = ebb_builder_new("bad");
    ebb_input(b, "x");
    ebb_target(b, "x");
    expect_exact_build_error(b, "ebb_target: 'x' is already an input");
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_tag(b, "h");
    ebb_target(b, "h");
    expect_exact_build_error(b, "ebb_target: 'h' is already a tag");
    b = ebb_builder_new("bad");
    ebb_target(b, "y");
    ebb_input(b, "y");
    expect_exact_build_error(b, "ebb_input: 'y' is already a target");
    b = ebb_builder_new("bad");
    ebb_target(b, "y");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_tag(b, "y");
    expect_exact_build_error(b, "ebb_tag: 'y' is already a target");
    b = ebb_builder_new("bad");
    ebb_target(b, "y");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_using(b, "y", NULL);
    expect_exact_build_error(b, "ebb_using: 'y' is a target, which only the loss reads");

    /* the loss: a registered op, once, with attributes its schema accepts
     * (ebb_attrs_resolve's errors, under the call's name) */
    static const struct {
        const char *op, *attrs, *msg;
    } bad_loss[] = {
        {"cross_entropyy", NULL, "ebb_loss: unknown op 'cross_entropyy'"},
        {NULL, NULL, "ebb_loss: unknown op '(null)'"},
        {"test_pair_loss", "scal=2",
         "ebb_loss: test_pair_loss has no attribute 'scal' (known: scale, reduction)"},
        {"test_pair_loss", "name=l",
         "ebb_loss: test_pair_loss has no attribute 'name' (known: scale, reduction)"},
        {"test_pair_loss", "scale=big",
         "ebb_loss: test_pair_loss: attribute 'scale' must be a number, got 'big'"},
        {"test_pair_loss", "scale=1 scale=2",
         "ebb_loss: test_pair_loss: attribute 'scale' given twice"},
        {"test_pair_loss", "scale",
         "ebb_loss: test_pair_loss: attribute 'scale' has no value (expected key=value)"},
        {"test_pair_loss", "reduction=\"sum",
         "ebb_loss: test_pair_loss: unterminated quote in attribute 'reduction'"},
        {"relu", "x=1", "ebb_loss: relu has no attribute 'x' (it takes none)"},
        {"linear", NULL, "ebb_loss: linear needs attribute 'out'"},
    };
    for (size_t i = 0; i < sizeof bad_loss / sizeof bad_loss[0]; i++) {
        b = ebb_builder_new("bad");
        ebb_target(b, "y");
        ebb_loss(b, bad_loss[i].op, bad_loss[i].attrs);
        ebb_loss(b, "test_pair_loss", NULL); /* sticky: the first error stays */
        expect_exact_build_error(b, bad_loss[i].msg);
    }
    b = ebb_builder_new("bad");
    ebb_target(b, "y");
    ebb_loss(b, "test_pair_loss", "scale=2");
    ebb_loss(b, "test_pair_loss", "scale=3");
    expect_exact_build_error(b, "ebb_loss: the graph already has a loss (test_pair_loss)");

    /* the loss reads the final stream and every target */
    b = ebb_builder_new("bad");
    ebb_loss(b, "test_pair_loss", NULL);
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    assert_int_equal(ebb_builder_status(b), EBB_OK);
    expect_build_error(b, "ebb_build: loss test_pair_loss takes 2 inputs (the final stream, then "
                          "the targets), but the graph declares 0 targets");
    b = ebb_builder_new("bad");
    ebb_target(b, "y");
    ebb_target(b, "w");
    ebb_loss(b, "test_pair_loss", NULL);
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    expect_build_error(b, "but the graph declares 2 targets");

    /* sub-flows have neither */
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    ebb_builder *s = ebb_subflow_begin(b);
    ebb_target(s, "y");
    ebb_through(b, ebb_subflow_end(s));
    expect_exact_build_error(b, "ebb_target: a sub-flow cannot declare targets (only the "
                                "top-level flow has a loss)");
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", NULL));
    s = ebb_subflow_begin(b);
    ebb_loss(s, "test_pair_loss", NULL);
    ebb_through(b, ebb_subflow_end(s));
    expect_exact_build_error(b, "ebb_loss: a sub-flow cannot declare a loss (only the top-level "
                                "flow has one)");

    /* ebb_node_op shares the attribute reader; `name` stays its own key */
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "relu", "x=1"));
    expect_exact_build_error(b, "ebb_node_op: relu has no attribute 'x' (known: name)");
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", "out=2, name=1a"));
    expect_exact_build_error(b, "ebb_node_op: linear: invalid node name '1a'");
    b = ebb_builder_new("bad");
    ebb_from(b, ebb_node_op(b, "linear", "bias=maybe, out=2"));
    expect_exact_build_error(b, "ebb_node_op: linear: attribute 'bias' must be true or false, "
                                "got 'maybe'");
}

/* ---- straight line: memory measured == planned ---------------------------- */

static ebb_graph *straight_mlp(void) {
    ebb_builder *b = ebb_builder_new("mlp");
    ebb_input(b, "x");
    ebb_from(b, ebb_node_op(b, "linear", "out=64, name=l0"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_through(b, ebb_node_op(b, "linear", "out=128, name=l1"));
    ebb_through(b, ebb_node_op(b, "tanh", NULL));
    ebb_also(b, ebb_node_op(b, "linear", "out=128, name=res"));
    ebb_through(b, ebb_node_op(b, "linear", "out=16, name=head"));
    return build_or_fail(b);
}

static void test_straight_line_peak_matches(void **state) {
    (void)state;
    ebb_graph *g = straight_mlp();
    ebb_plan *p = compile(g, 32, 48, 0);
    ebb_plan *pk = compile(g, 32, 48, 1);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 1));
    assert_int_equal(ebb_model_param_count(m), 8);
    assert_non_null(ebb_model_param(m, "l0.weight"));
    assert_non_null(ebb_model_param(m, "head.bias"));
    ebb_tensor *x = input(32, 48, 3);
    trace *t = calloc(1, sizeof *t);
    ebb_run_stats st;
    ebb_tensor *y = run_checked(p, m, x, t, &st);
    assert_true(check_freed_at_last_use(p, t) >= 6);

    /* bytes: every intermediate is [32, 64] or [32, 128] float32 */
    int at = -1;
    int64_t planned = ebb_plan_peak_bytes(p, &at);
    assert_int_equal(st.planned_peak_bytes, planned);
    assert_int_equal(st.measured_peak_bytes, planned);
    /* the peak is two [32,128] values at once (tanh output and the residual branch) */
    assert_int_equal(planned, 2 * 32 * 128 * 4 + 32 * 128 * 4);
    /* live bytes after every step agree with the plan */
    for (int i = 0; i < t->n; i++)
        assert_int_equal(t->ev[i].live, ebb_plan_step_at(p, t->ev[i].step)->live_bytes);

    /* keep_all: nothing freed until the end, peak = all intermediates */
    ebb_model *mk = NULL;
    assert_ok(ebb_model_new(&mk, pk, CPU, 1));
    ebb_run_stats sk;
    ebb_tensor *yk = NULL;
    assert_ok(ebb_run(pk, mk, &x, &yk, &sk));
    int64_t all = 32 * 4 * (64 + 64 + 128 + 128 + 128 + 128 + 16);
    assert_int_equal(ebb_plan_peak_bytes(pk, NULL), all);
    assert_int_equal(sk.measured_peak_bytes, all);
    assert_int_equal(ebb_plan_keep_all_peak_bytes(p), all);
    assert_true(sk.measured_peak_bytes - st.measured_peak_bytes == all - planned);
    assert_close(y, yk, 0);

    /* numerics against the tensor layer by hand */
    ebb_tensor *r = ref_unary(EBB_RELU, ref_linear(m, "l0", x), 1);
    ebb_tensor *h = ref_unary(EBB_TANH, ref_linear(m, "l1", r), 1);
    ebb_tensor_free(r);
    ebb_tensor *lin = ref_linear(m, "res", h);
    ebb_tensor *res = ref_add(h, lin, 0);
    ebb_tensor_free(lin);
    ebb_tensor *ref = ref_linear(m, "head", res);
    assert_close(y, ref, 1e-5);
    ebb_tensor_free(h);
    ebb_tensor_free(res);
    ebb_tensor_free(ref);
    ebb_tensor_free(y);
    ebb_tensor_free(yk);
    ebb_tensor_free(x);
    free(t);
    ebb_model_free(m);
    ebb_model_free(mk);
    ebb_plan_free(p);
    ebb_plan_free(pk);
    ebb_graph_free(g);
}

/* ---- in-place activations ---------------------------------------------- */

static void test_in_place_only_when_safe(void **state) {
    (void)state;
    ebb_builder *b = ebb_builder_new("inplace");
    ebb_from(b, ebb_node_op(b, "relu", NULL));             /* reads the graph input */
    ebb_through(b, ebb_node_op(b, "linear", "out=16, name=a"));
    ebb_through(b, ebb_node_op(b, "tanh", NULL));          /* input dies here */
    ebb_tag(b, "h");
    ebb_through(b, ebb_node_op(b, "sigmoid", NULL));       /* h is read again later */
    ebb_using(b, "h", NULL);
    ebb_through(b, ebb_node_op(b, "add", NULL));
    ebb_through(b, ebb_node_op(b, "identity", NULL));
    ebb_through(b, ebb_node_op(b, "gelu", NULL));          /* input is a view */
    ebb_graph *g = build_or_fail(b);
    ebb_plan *p = compile(g, 4, 8, 0), *pk = compile(g, 4, 8, 1);
    int expect[] = {0, 0, 1, 0, 0, 0, 0};
    assert_int_equal(ebb_plan_step_count(p), 7);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(ebb_plan_step_at(p, i)->in_place, expect[i]);
        assert_int_equal(ebb_plan_step_at(pk, i)->in_place, 0);
    }
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 3));
    ebb_tensor *x = input(4, 8, 2), *x0 = NULL, *y = NULL, *yk = NULL;
    assert_ok(ebb_tensor_clone(&x0, x));
    trace *t = calloc(1, sizeof *t);
    ebb_run_stats st;
    y = run_checked(p, m, x, t, &st);
    assert_int_equal(st.measured_peak_bytes, st.planned_peak_bytes);
    assert_ok(ebb_run(pk, m, &x, &yk, NULL));
    assert_close(y, yk, 0);
    assert_close(x, x0, 0); /* the caller's input is never overwritten */
    /* in place, tanh adds no bytes: the plan's live bytes do not grow there */
    assert_int_equal(ebb_plan_step_at(p, 2)->peak_bytes, ebb_plan_step_at(p, 1)->live_bytes);
    ebb_tensor *fr[] = {x, x0, y, yk};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        ebb_tensor_free(fr[i]);
    free(t);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_plan_free(pk);
    ebb_graph_free(g);
}

/* ---- split / merge / tag / using ---------------------------------------- */

static void test_split_merge_using(void **state) {
    (void)state;
    ebb_builder *b = ebb_builder_new("sm");
    ebb_from(b, ebb_node_op(b, "linear", "out=16, name=stem"));
    ebb_tag(b, "h");
    ebb_split(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "tanh", NULL),
              ebb_node_op(b, "linear", "out=16, name=c"), NULL);
    ebb_merge(b, EBB_MERGE_ADD, 0);
    ebb_using(b, "h", NULL);
    ebb_through(b, ebb_node_op(b, "cat", "dim=1"));
    ebb_split(b, ebb_node_op(b, "sigmoid", NULL), ebb_node_op(b, "silu", NULL), NULL);
    ebb_merge(b, EBB_MERGE_MEAN, 0);
    ebb_output(b, "h");
    ebb_graph *g = build_or_fail(b);
    assert_int_equal(ebb_graph_output_count(g), 2);
    assert_string_equal(ebb_graph_output_name(g, 1), "h");
    ebb_plan *p = compile(g, 8, 10, 0);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 9));
    ebb_tensor *x = input(8, 10, 4);
    trace *t = calloc(1, sizeof *t);
    ebb_tensor *outs[2] = {0};
    ebb_run_options o = {.trace = record, .trace_user = t};
    assert_ok(ebb_run_ex(p, m, &x, outs, &o, NULL));
    assert_true(check_freed_at_last_use(p, t) >= 6);

    ebb_tensor *h = ref_linear(m, "stem", x);
    assert_close(outs[1], h, 0);
    ebb_tensor *a = ref_unary(EBB_RELU, h, 0), *bb = ref_unary(EBB_TANH, h, 0);
    ebb_tensor *c = ref_linear(m, "c", h);
    ebb_tensor *sum = ref_add(ref_add(a, bb, 1), c, 1);
    ebb_tensor *cat = NULL, *pair[2] = {sum, h};
    assert_ok(ebb_tensor_cat(&cat, pair, 2, 1));
    ebb_tensor *s1 = ref_unary(EBB_SIGMOID, cat, 0), *s2 = ref_unary(EBB_SILU, cat, 0);
    ebb_tensor *s12 = ref_add(s1, s2, 1), *ref = NULL;
    assert_ok(ebb_tensor_affine(&ref, s12, 0.5, 0));
    assert_close(outs[0], ref, 1e-6);
    ebb_shape ys = ebb_tensor_shape(outs[0]);
    assert_int_equal(ys.dim[1], 32);

    ebb_tensor *fr[] = {h, sum, cat, s12, ref, outs[0], outs[1], x};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        ebb_tensor_free(fr[i]);
    free(t);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

/* ---- gate ------------------------------------------------------------------ */

static ebb_graph *gate_graph(int top_k) {
    ebb_builder *b = ebb_builder_new("gate");
    ebb_from(b, ebb_node_op(b, "linear", "out=12, name=stem"));
    ebb_node *router = ebb_node_seq(b, ebb_node_op(b, "linear", "out=4, name=router"),
                                    ebb_node_op(b, "softmax", "dim=-1"), NULL);
    ebb_node *e[4];
    for (int i = 0; i < 4; i++) {
        char attrs[64];
        snprintf(attrs, sizeof attrs, "out=12, name=e%d", i);
        e[i] = ebb_node_op(b, "linear", attrs);
    }
    ebb_gatev(b, router, top_k, e, 4);
    return build_or_fail(b);
}

/* reference: sum_i w[:, i] * e_i(h), w zeroed outside each row's top_k and
 * renormalised */
static ebb_tensor *gate_reference(const ebb_model *m, const ebb_tensor *x, int top_k) {
    ebb_tensor *h = ref_linear(m, "stem", x), *logits = ref_linear(m, "router", h), *w = NULL;
    assert_ok(ebb_tensor_softmax(&w, logits, -1));
    ebb_tensor_free(logits);
    float wh[16 * 4];
    ebb_shape ws = ebb_tensor_shape(w);
    int64_t B = ws.dim[0];
    assert_ok(ebb_tensor_to_host(w, wh, (size_t)(B * 4) * sizeof(float)));
    if (top_k > 0)
        for (int64_t r = 0; r < B; r++) {
            float *row = &wh[r * 4], keep[4] = {0}, sum = 0;
            for (int k = 0; k < top_k; k++) {
                int best = -1;
                for (int i = 0; i < 4; i++)
                    if (keep[i] == 0 && (best < 0 || row[i] > row[best]))
                        best = i;
                keep[best] = row[best];
                sum += row[best];
            }
            for (int i = 0; i < 4; i++)
                row[i] = keep[i] / sum;
        }
    ebb_tensor *acc = NULL;
    ebb_shape hs = ebb_tensor_shape(h);
    assert_ok(ebb_tensor_zeros(&acc, &hs, EBB_FLOAT32, CPU));
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "e%d", i);
        ebb_tensor *y = ref_linear(m, name, h), *wi = NULL, *t = NULL, *nacc = NULL;
        float col[16];
        for (int64_t r = 0; r < B; r++)
            col[r] = wh[r * 4 + i];
        ebb_shape cs = EBB_SHAPE(B, 1);
        assert_ok(ebb_tensor_from_host(&wi, col, (size_t)B * sizeof(float), &cs, EBB_FLOAT32, CPU));
        assert_ok(ebb_tensor_binary(&t, EBB_MUL, y, wi));
        assert_ok(ebb_tensor_binary(&nacc, EBB_ADD, acc, t));
        ebb_tensor_free(acc);
        acc = nacc;
        ebb_tensor_free(y);
        ebb_tensor_free(wi);
        ebb_tensor_free(t);
    }
    ebb_tensor_free(h);
    ebb_tensor_free(w);
    return acc;
}

/* merge by a node: the open streams, in order, are its inputs */
static void test_merge_node(void **state) {
    (void)state;
    ebb_builder *b = ebb_builder_new("mn");
    ebb_from(b, ebb_node_op(b, "linear", "out=6, name=stem"));
    ebb_split(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "tanh", NULL),
              ebb_node_op(b, "sigmoid", NULL), NULL);
    ebb_merge_node(b, ebb_node_op(b, "maximum", NULL));
    ebb_graph *g = build_or_fail(b);
    ebb_plan *p = compile(g, 4, 5, 0);
    const ebb_plan_step *last = ebb_plan_step_at(p, ebb_plan_step_count(p) - 1);
    assert_string_equal(last->op, "maximum");
    assert_string_equal(last->node, "flow.2.merge");
    assert_int_equal(last->n_in, 3);
    ebb_plan_free(p);
    ebb_graph_free(g);

    /* a node that cannot take the open streams */
    b = ebb_builder_new("mn");
    ebb_from(b, ebb_node_op(b, "linear", "out=6"));
    ebb_split(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "tanh", NULL), NULL);
    ebb_merge_node(b, ebb_node_op(b, "scaled_dot_product_attention", NULL));
    expect_build_error(b, "ebb_merge_node: scaled_dot_product_attention takes 3 to 4 inputs, given 2");
    b = ebb_builder_new("mn");
    ebb_from(b, ebb_node_op(b, "linear", "out=6"));
    ebb_merge_node(b, ebb_node_op(b, "maximum", NULL));
    expect_build_error(b, "ebb_merge_node: only 1 open stream");
}

/* weight tying: errors name the node, the parameter and the source */
static void expect_share_error(const char *param, const char *source, const char *out,
                               const char *needle) {
    ebb_builder *b = ebb_builder_new("tie");
    ebb_from(b, ebb_node_op(b, "linear", "out=4, name=a"));
    char attrs[64];
    snprintf(attrs, sizeof attrs, "out=%s, name=b", out);
    ebb_through(b, ebb_node_share(b, ebb_node_op(b, "linear", attrs), param, source));
    ebb_graph *g = build_or_fail(b);
    ebb_shape s = EBB_SHAPE(2, 4);
    ebb_compile_options o = {.input_shapes = &s, .n_input_shapes = 1};
    ebb_plan *p = NULL;
    assert_int_not_equal(ebb_compile(&p, g, &o), EBB_OK);
    assert_null(p);
    assert_errmsg_contains(needle);
    ebb_graph_free(g);
}

static void test_shared_params(void **state) {
    (void)state;
    /* b's weight is a's: one parameter, two steps read it */
    ebb_builder *b = ebb_builder_new("tie");
    ebb_from(b, ebb_node_op(b, "linear", "out=4, name=a"));
    ebb_through(b, ebb_node_share(b, ebb_node_op(b, "linear", "out=4, name=b"), "weight",
                                  "a.weight"));
    ebb_graph *g = build_or_fail(b);
    ebb_plan *p = compile(g, 2, 4, 0);
    assert_int_equal(ebb_plan_param_count(p), 3); /* a.weight, a.bias, b.bias */
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 3));
    assert_ptr_equal(ebb_model_param(m, "b.weight"), ebb_model_param(m, "a.weight"));
    ebb_tensor *x = input(2, 4, 1), *y = NULL;
    assert_ok(ebb_run(p, m, &x, &y, NULL));
    ebb_tensor *h = ref_linear(m, "a", x);
    ebb_tensor *ref = NULL, *w = ebb_model_param(m, "a.weight");
    assert_ok(ebb_tensor_linear(&ref, h, w, ebb_model_param(m, "b.bias")));
    assert_close(y, ref, 0);
    ebb_tensor *fr[] = {x, y, h, ref};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        ebb_tensor_free(fr[i]);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);

    expect_share_error("weight", "nothing.weight", "4",
                       "node b: its weight is to be shared with 'nothing.weight', but no node "
                       "before it makes a parameter of that name");
    expect_share_error("weight", "a.weight", "5",
                       "node b: its weight [5, 4] cannot be shared with 'a.weight' [4, 4]");
    expect_share_error("wieght", "a.weight", "4",
                       "node b: linear has no parameter 'wieght' to share (its parameters: "
                       "weight, bias)");
    b = ebb_builder_new("tie");
    ebb_node *n = ebb_node_op(b, "linear", "out=4");
    ebb_node_share(b, n, "weight", "a.weight");
    ebb_node_share(b, n, "weight", "a.weight");
    expect_build_error(b, "ebb_node_share: linear's parameter 'weight' is already shared");
    b = ebb_builder_new("tie");
    ebb_node_share(b, ebb_node_seq(b, ebb_node_op(b, "relu", NULL), NULL), "weight", "a.weight");
    expect_build_error(b, "ebb_node_share: only an op node has parameters to share");
}

static void test_gate_dense_and_topk(void **state) {
    (void)state;
    for (int top_k = 0; top_k <= 2; top_k += 2) {
        ebb_graph *g = gate_graph(top_k);
        ebb_plan *p = compile(g, 16, 6, 0);
        ebb_model *m = NULL;
        assert_ok(ebb_model_new(&m, p, CPU, 21));
        ebb_tensor *x = input(16, 6, 5);
        trace *t = calloc(1, sizeof *t);
        ebb_tensor *y = run_checked(p, m, x, t, NULL);
        assert_true(check_freed_at_last_use(p, t) >= 6);
        if (getenv("EBB_TEST_VERBOSE"))
            ebb_plan_print(p, stderr);
        ebb_tensor *ref = gate_reference(m, x, top_k);
        assert_close(y, ref, 1e-5);
        if (top_k == 0) {
            /* dense: each expert output is freed as soon as it is mixed in:
             * at the peak, the stem output, the weights, the running sum, one
             * expert output and the new sum are live, never four experts */
            int at;
            int64_t peak = ebb_plan_peak_bytes(p, &at), v = 16 * 12 * 4;
            assert_int_equal(peak, 4 * v + 16 * 4 * 4);
            assert_int_equal(ebb_plan_keep_all_peak_bytes(p), 9 * v + 2 * 16 * 4 * 4);
        }
        ebb_tensor_free(y);
        ebb_tensor_free(ref);
        ebb_tensor_free(x);
        free(t);
        ebb_model_free(m);
        ebb_plan_free(p);
        ebb_graph_free(g);
    }
}

/* ---- switch ------------------------------------------------------------------ */

static ebb_graph *switch_graph(void) {
    ebb_builder *b = ebb_builder_new("switch");
    ebb_from(b, ebb_node_op(b, "identity", NULL));
    ebb_tag(b, "h");
    ebb_switch(b, ebb_node_op(b, "test_first_col", NULL),
               ebb_node_seq(b, ebb_node_op(b, "linear", "out=5, name=b0"),
                            ebb_node_op(b, "relu", NULL), NULL),
               ebb_node_op(b, "linear", "out=5, name=b1"),
               ebb_node_op(b, "tanh", NULL), NULL);
    return build_or_fail(b);
}

static ebb_tensor *rows_input(const float *first_col, int64_t B) {
    float data[8 * 5];
    for (int64_t r = 0; r < B; r++)
        for (int c = 0; c < 5; c++)
            data[r * 5 + c] = c == 0 ? first_col[r] : (float)(r + 1) * 0.1f * (float)(c - 2);
    ebb_shape s = EBB_SHAPE(B, 5);
    ebb_tensor *t = NULL;
    assert_ok(ebb_tensor_from_host(&t, data, (size_t)(B * 5) * sizeof(float), &s, EBB_FLOAT32, CPU));
    return t;
}

/* row-by-row reference */
static void switch_reference(const ebb_model *m, const ebb_tensor *x, const ebb_tensor *y) {
    ebb_shape s = ebb_tensor_shape(x);
    for (int64_t r = 0; r < s.dim[0]; r++) {
        ebb_tensor *row = NULL, *yrow = NULL, *ref = NULL;
        assert_ok(ebb_tensor_narrow(&row, x, 0, r, 1));
        assert_ok(ebb_tensor_narrow(&yrow, y, 0, r, 1));
        float first[5];
        assert_ok(ebb_tensor_to_host(row, first, sizeof first));
        int branch = (int)first[0];
        if (branch == 0)
            ref = ref_unary(EBB_RELU, ref_linear(m, "b0", row), 1);
        else if (branch == 1)
            ref = ref_linear(m, "b1", row);
        else
            ref = ref_unary(EBB_TANH, row, 0);
        assert_close(yrow, ref, 1e-6);
        ebb_tensor_free(row);
        ebb_tensor_free(yrow);
        ebb_tensor_free(ref);
    }
}

static int count_kind(const trace *t, ebb_step_kind k, int jumped) {
    int n = 0;
    for (int i = 0; i < t->n; i++)
        n += t->ev[i].kind == k && (jumped < 0 || t->ev[i].jumped == jumped);
    return n;
}

static void test_switch_routing(void **state) {
    (void)state;
    ebb_graph *g = switch_graph();
    ebb_plan *p = compile(g, 6, 5, 0);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 2));
    trace *t = calloc(1, sizeof *t);

    /* mixed per-row routing: rows go to branches 0, 1 and 2 */
    const float mixed[6] = {1, 0, 2, 1, 1, 0};
    ebb_tensor *x = rows_input(mixed, 6);
    ebb_tensor *y = run_checked(p, m, x, t, NULL);
    switch_reference(m, x, y);
    assert_int_equal(count_kind(t, EBB_STEP_ENTER, 1), 0);
    assert_int_equal(count_kind(t, EBB_STEP_EXIT, -1), 3);
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* two branches used, one skipped */
    const float two[6] = {0, 2, 2, 0, 0, 2};
    x = rows_input(two, 6);
    y = run_checked(p, m, x, t, NULL);
    switch_reference(m, x, y);
    assert_int_equal(count_kind(t, EBB_STEP_ENTER, 1), 1);
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* every row picks branch 1: no gather, the branch sees x itself */
    const float all1[6] = {1, 1, 1, 1, 1, 1};
    x = rows_input(all1, 6);
    y = run_checked(p, m, x, t, NULL);
    switch_reference(m, x, y);
    assert_int_equal(count_kind(t, EBB_STEP_ENTER, 1), 2);
    assert_int_equal(count_kind(t, EBB_STEP_EXIT, -1), 1);
    /* the entered branch's input shares x's storage */
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* an empty batch skips every branch and gives an empty result */
    ebb_shape empty = EBB_SHAPE(0, 5);
    assert_ok(ebb_tensor_zeros(&x, &empty, EBB_FLOAT32, CPU));
    y = run_checked(p, m, x, t, NULL);
    ebb_shape ys = ebb_tensor_shape(y);
    assert_int_equal(ys.ndim, 2);
    assert_int_equal(ys.dim[0], 0);
    assert_int_equal(ys.dim[1], 5);
    assert_int_equal(count_kind(t, EBB_STEP_ENTER, 1), 3);
    ebb_tensor_free(x);
    ebb_tensor_free(y);

    /* an index out of range is a runtime error naming the row and node */
    const float bad[6] = {0, 1, 7, 0, 0, 0};
    x = rows_input(bad, 6);
    ebb_tensor *outs[1] = {0};
    int64_t before = ebb_memory_current(CPU), handles = ebb_tensor_live_count();
    assert_int_equal(ebb_run(p, m, &x, outs, NULL), EBB_ERR_RUNTIME);
    assert_null(outs[0]);
    assert_errmsg_contains("row 2 chose branch 7");
    assert_errmsg_contains("flow.2.switch");
    assert_int_equal(ebb_memory_current(CPU), before);
    assert_int_equal(ebb_tensor_live_count(), handles);
    ebb_tensor_free(x);

    free(t);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

/* ---- loops ------------------------------------------------------------------- */

static ebb_graph *loop_graph(int kind, int64_t n, double threshold) {
    ebb_builder *b = ebb_builder_new("loop");
    ebb_from(b, ebb_node_op(b, "linear", "out=8, name=stem"));
    ebb_tag(b, "h");
    ebb_builder *body = ebb_subflow_begin(b);
    ebb_through(body, ebb_node_op(body, "linear", "out=8, name=cell"));
    ebb_through(body, ebb_node_op(body, "tanh", NULL));
    ebb_using(body, "h", NULL);
    ebb_through(body, ebb_node_op(body, "add", NULL));
    ebb_node *bn = ebb_subflow_end(body);
    char attrs[64];
    snprintf(attrs, sizeof attrs, "threshold=%g", threshold);
    if (kind == 0)
        ebb_loop_for(b, bn, n);
    else if (kind == 1)
        ebb_loop_while(b, bn, ebb_node_op(b, "threshold_halt", attrs), n);
    else
        ebb_loop_until(b, bn, ebb_node_op(b, "threshold_halt", attrs), n);
    ebb_through(b, ebb_node_op(b, "linear", "out=3, name=head"));
    return build_or_fail(b);
}

static ebb_tensor *loop_reference(const ebb_model *m, const ebb_tensor *x, int iters) {
    ebb_tensor *h = ref_linear(m, "stem", x), *s = NULL;
    assert_ok(ebb_tensor_ref(&s, h));
    for (int i = 0; i < iters; i++) {
        ebb_tensor *t = ref_unary(EBB_TANH, ref_linear(m, "cell", s), 1);
        ebb_tensor *next = ref_add(t, h, 0);
        ebb_tensor_free(t);
        ebb_tensor_free(s);
        s = next;
    }
    ebb_tensor *y = ref_linear(m, "head", s);
    ebb_tensor_free(h);
    ebb_tensor_free(s);
    return y;
}

static void run_loop_case(int kind, int64_t n, double threshold, int expect_iters) {
    ebb_graph *g = loop_graph(kind, n, threshold);
    ebb_plan *p = compile(g, 4, 6, 0);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 8));
    /* one body, shared weights: stem, cell, head */
    assert_int_equal(ebb_model_param_count(m), 6);
    assert_non_null(ebb_model_param(m, "cell.weight"));
    ebb_tensor *x = input(4, 6, 6);
    trace *t = calloc(1, sizeof *t);
    ebb_tensor *y = run_checked(p, m, x, t, NULL);
    assert_true(check_freed_at_last_use(p, t) >= 2 + 2 * expect_iters);
    int iters = 0;
    for (int i = 0; i < t->n; i++)
        iters += t->ev[i].kind == EBB_STEP_OP && strstr(ebb_plan_step_at(p, t->ev[i].step)->op, "tanh") != NULL;
    assert_int_equal(iters, expect_iters);
    /* memory stays flat across iterations: the body's values die inside it */
    int64_t first = -1;
    for (int i = 0; i < t->n; i++)
        if (t->ev[i].kind == EBB_STEP_LOOP_NEXT) {
            if (first < 0)
                first = t->ev[i].live;
            else if (t->ev[i].jumped)
                assert_int_equal(t->ev[i].live, first);
        }
    ebb_tensor *ref = loop_reference(m, x, expect_iters);
    assert_close(y, ref, 1e-5);
    ebb_tensor_free(ref);
    ebb_tensor_free(y);
    ebb_tensor_free(x);
    free(t);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

static void test_loop_for(void **state) {
    (void)state;
    run_loop_case(0, 3, 0, 3);
    run_loop_case(0, 0, 0, 0);
}

static void test_loop_while_zero_iterations(void **state) {
    (void)state;
    /* max(state) - 1e9 < 0: the condition is false before the first iteration */
    run_loop_case(1, 5, 1e9, 0);
    /* always true: runs to max */
    run_loop_case(1, 4, -1e9, 4);
}

static void test_loop_until_hits_max(void **state) {
    (void)state;
    /* never true: until runs to max */
    run_loop_case(2, 5, 1e9, 5);
    /* true after the first iteration */
    run_loop_case(2, 5, -1e9, 1);
}

/* ---- nesting ------------------------------------------------------------------- */

static void test_nested_graph_node(void **state) {
    (void)state;
    ebb_builder *ib = ebb_builder_new("block");
    ebb_from(ib, ebb_node_op(ib, "linear", "out=8"));
    ebb_through(ib, ebb_node_op(ib, "gelu", NULL));
    ebb_graph *block = build_or_fail(ib);

    ebb_builder *b = ebb_builder_new("outer");
    ebb_from(b, ebb_node_op(b, "linear", "out=8, name=stem"));
    ebb_also(b, ebb_node_graph(b, block));
    ebb_through(b, ebb_node_graph(b, block));
    ebb_graph *g = build_or_fail(b);
    ebb_graph_free(block); /* the outer graph keeps its own references */
    ebb_plan *p = compile(g, 3, 4, 0);
    /* each use is its own copy, named by its path */
    const char *name = NULL;
    int found = 0;
    for (int i = 0; i < ebb_plan_param_count(p); i++) {
        ebb_plan_param_at(p, i, &name);
        found += strcmp(name, "flow.1.also.0.weight") == 0 || strcmp(name, "flow.2.0.weight") == 0;
    }
    assert_int_equal(found, 2);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 3));
    ebb_tensor *x = input(3, 4, 7), *y = NULL;
    assert_ok(ebb_run(p, m, &x, &y, NULL));
    ebb_tensor *h = ref_linear(m, "stem", x);
    ebb_tensor *inner = ref_unary(EBB_GELU, ref_linear(m, "flow.1.also.0", h), 1);
    ebb_tensor *a = ref_add(h, inner, 0);
    ebb_tensor_free(inner);
    ebb_tensor *ref = ref_unary(EBB_GELU, ref_linear(m, "flow.2.0", a), 1);
    assert_close(y, ref, 1e-6);
    ebb_tensor *fr[] = {h, a, ref, x, y};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        ebb_tensor_free(fr[i]);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

/* ---- failure cleanup -------------------------------------------------------- */

static void test_failed_run_frees_everything(void **state) {
    (void)state;
    ebb_builder *b = ebb_builder_new("fails");
    ebb_from(b, ebb_node_op(b, "linear", "out=16, name=a"));
    ebb_through(b, ebb_node_op(b, "relu", NULL));
    ebb_tag(b, "h");
    ebb_through(b, ebb_node_op(b, "linear", "out=16, name=b"));
    ebb_through(b, ebb_node_op(b, "tanh", NULL));
    ebb_through(b, ebb_node_op(b, "test_fail_negative", NULL));
    ebb_using(b, "h", NULL);
    ebb_through(b, ebb_node_op(b, "add", NULL));
    ebb_graph *g = build_or_fail(b);
    ebb_plan *p = compile(g, 8, 4, 0);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 5));
    /* make the mean before step 5 negative: a large negative bias */
    ebb_tensor *bias = NULL;
    ebb_shape bs = EBB_SHAPE(16);
    assert_ok(ebb_tensor_full(&bias, &bs, -50.0, EBB_FLOAT32, CPU));
    assert_ok(ebb_model_set_param(m, "b.bias", bias));
    ebb_tensor_free(bias);
    ebb_tensor *x = input(8, 4, 1), *y = (ebb_tensor *)&bs;
    int64_t before = ebb_memory_current(CPU), handles = ebb_tensor_live_count();
    assert_int_equal(ebb_run(p, m, &x, &y, NULL), EBB_ERR_RUNTIME);
    assert_null(y);
    assert_errmsg_contains("step 4 (test_fail_negative, node flow.5)");
    assert_errmsg_contains("is negative");
    assert_int_equal(ebb_memory_current(CPU), before);
    assert_int_equal(ebb_tensor_live_count(), handles);

    /* a model that does not match the plan is refused before running */
    ebb_plan *other = compile(g, 8, 5, 0);
    assert_int_equal(ebb_run(other, m, &x, &y, NULL), EBB_ERR_ARG);
    assert_errmsg_contains("a.weight");
    ebb_plan_free(other);
    ebb_tensor_free(x);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

/* ---- threads ------------------------------------------------------------------- */

typedef struct job {
    const ebb_plan *p;
    const ebb_model *m;
    ebb_tensor *x, *y;
    ebb_status st;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    for (int i = 0; i < 20 && j->st == EBB_OK; i++) {
        ebb_tensor_free(j->y);
        j->y = NULL;
        j->st = ebb_run(j->p, j->m, &j->x, &j->y, NULL);
    }
    return NULL;
}

static void test_two_threads_one_plan(void **state) {
    (void)state;
    ebb_graph *g = gate_graph(2);
    ebb_plan *p = compile(g, 16, 6, 0);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 4));
    job j[2] = {{.p = p, .m = m, .x = input(16, 6, 11)}, {.p = p, .m = m, .x = input(16, 6, 12)}};
    ebb_tensor *expect[2];
    for (int i = 0; i < 2; i++)
        assert_ok(ebb_run(p, m, &j[i].x, &expect[i], NULL));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, run_job, &j[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(j[i].st, EBB_OK);
        assert_close(j[i].y, expect[i], 0);
        ebb_tensor_free(j[i].y);
        ebb_tensor_free(j[i].x);
        ebb_tensor_free(expect[i]);
    }
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

/* ---- CUDA graph capture: refusals that need no GPU ------------------------- */

static void test_capture_refuses_data_dependent_plans(void **state) {
    (void)state;
    ebb_capture *c = (ebb_capture *)&c;
    ebb_graph *g = switch_graph();
    ebb_plan *p = compile(g, 6, 5, 0);
    ebb_model *m = NULL;
    assert_ok(ebb_model_new(&m, p, CPU, 2));
    ebb_tensor *x = input(6, 5, 1);
    assert_int_equal(ebb_plan_capture(&c, p, m, &x), EBB_ERR_UNSUPPORTED);
    assert_null(c);
    assert_errmsg_contains("step 2 (node flow.2.switch)");
    ebb_tensor_free(x);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);

    g = loop_graph(1, 4, 0.0);
    p = compile(g, 4, 6, 0);
    assert_ok(ebb_model_new(&m, p, CPU, 2));
    x = input(4, 6, 1);
    assert_int_equal(ebb_plan_capture(&c, p, m, &x), EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("data-dependent loop");
    ebb_tensor_free(x);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);

    /* a `for` loop is capturable, but not on the CPU */
    g = loop_graph(0, 3, 0.0);
    p = compile(g, 4, 6, 0);
    assert_ok(ebb_model_new(&m, p, CPU, 2));
    x = input(4, 6, 1);
    assert_int_equal(ebb_plan_capture(&c, p, m, &x), EBB_ERR_UNSUPPORTED);
    assert_errmsg_contains("need a CUDA device; the model is on cpu");
    ebb_tensor_free(x);
    ebb_model_free(m);
    ebb_plan_free(p);
    ebb_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_builder_sticky_errors),
        EBB_TEST(test_builder_targets_and_loss),
        EBB_TEST(test_straight_line_peak_matches),
        EBB_TEST(test_in_place_only_when_safe),
        EBB_TEST(test_split_merge_using),
        EBB_TEST(test_merge_node),
        EBB_TEST(test_shared_params),
        EBB_TEST(test_gate_dense_and_topk),
        EBB_TEST(test_switch_routing),
        EBB_TEST(test_loop_for),
        EBB_TEST(test_loop_while_zero_iterations),
        EBB_TEST(test_loop_until_hits_max),
        EBB_TEST(test_nested_graph_node),
        EBB_TEST(test_failed_run_frees_everything),
        EBB_TEST(test_two_threads_one_plan),
        EBB_TEST(test_capture_refuses_data_dependent_plans),
    };
    return cmocka_run_group_tests_name("graph", tests, register_test_ops, NULL);
}
