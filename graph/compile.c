/* The compiler: graph + input shapes -> plan.
 *
 * Three passes, each plain counting over the step list:
 *   1. lowering: the nested flow becomes a flat list of steps over value
 *      slots. Every step is dry-run as it is emitted, on libtorch's meta
 *      device (CPU zeros for ops without meta kernels), which gives every
 *      value its shape and surfaces shape errors with the node's path;
 *   2. liveness: a backward dataflow over the steps' control-flow edges; a
 *      slot is freed on an edge where it is live before and dead after;
 *   3. memory: a walk in listing order that counts storage per alias class
 *      and predicts live bytes after every step and the peak. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/memory.h"
#include "plan_internal.h"

#define EBB_MAX_STEPS 1000000

/* ---- growable arrays ---------------------------------------------------- */

typedef struct scope {
    const struct scope *parent; /* enclosing flow's tags (sub-flows only) */
    const char **names;
    int *slots;
    int n, cap;
} scope;

/* Attribute values for ops the compiler introduces (merge dims, gate
 * indices); the list moves into the plan. */
typedef struct attr_block {
    struct attr_block *next;
    ebb_attr_value v[1];
} attr_block;

typedef struct compiler {
    ebb_plan *plan;
    attr_block *attrs;
    const ebb_op *no_meta[64]; /* ops seen failing on the meta device */
    int n_no_meta;
    int cap_steps, cap_values, cap_params;
    ebb_tensor **meta; /* per slot: a shape-only tensor from the dry run */
    int cap_meta;
    ebb_device meta_device;
    ebb_status status;
} compiler;

static char *dup_printf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

static char *dup_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

static int *dup_ints(const int *v, int n) {
    if (n == 0)
        return NULL;
    int *d = malloc((size_t)n * sizeof *d);
    if (d)
        memcpy(d, v, (size_t)n * sizeof *d);
    return d;
}

static int oom(compiler *c) {
    c->status = ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    return -1;
}

static int scope_bind(compiler *c, scope *sc, const char *name, int slot) {
    if (sc->n == sc->cap) {
        int cap = sc->cap ? 2 * sc->cap : 8;
        const char **names = realloc(sc->names, (size_t)cap * sizeof *names);
        if (!names)
            return oom(c);
        sc->names = names;
        int *slots = realloc(sc->slots, (size_t)cap * sizeof *slots);
        if (!slots)
            return oom(c);
        sc->slots = slots;
        sc->cap = cap;
    }
    sc->names[sc->n] = name;
    sc->slots[sc->n++] = slot;
    return 0;
}

static int scope_lookup(const scope *sc, const char *name) {
    for (; sc; sc = sc->parent)
        for (int i = sc->n - 1; i >= 0; i--)
            if (strcmp(sc->names[i], name) == 0)
                return sc->slots[i];
    return -1;
}

static void scope_free(scope *sc) {
    free(sc->names);
    free(sc->slots);
}

/* ---- values and steps ----------------------------------------------------- */

/* A new slot whose shape comes from `meta` (ownership passes to the compiler). */
static int value_new(compiler *c, ebb_tensor *meta, ebb_value_kind kind, int producer,
                     int alias_of) {
    ebb_plan *p = c->plan;
    if (p->n_values == c->cap_values) {
        int cap = c->cap_values ? 2 * c->cap_values : 32;
        ebb_plan_value *v = realloc(p->values, (size_t)cap * sizeof *v);
        if (!v) {
            ebb_tensor_free(meta);
            return oom(c);
        }
        p->values = v;
        ebb_tensor **m = realloc(c->meta, (size_t)cap * sizeof *m);
        if (!m) {
            ebb_tensor_free(meta);
            return oom(c);
        }
        c->meta = m;
        c->cap_values = cap;
    }
    int slot = p->n_values++;
    ebb_plan_value *v = &p->values[slot];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->producer = producer;
    v->alias_of = alias_of;
    c->meta[slot] = meta;
    if (meta) {
        v->shape = ebb_tensor_shape(meta);
        v->dtype = ebb_tensor_dtype(meta);
        v->nbytes = alias_of >= 0 ? 0 : (int64_t)ebb_tensor_nbytes(meta);
    }
    return slot;
}

static plan_step *step_new(compiler *c, ebb_step_kind kind, const char *op_name,
                           const char *path) {
    ebb_plan *p = c->plan;
    if (p->n_steps >= EBB_MAX_STEPS) {
        c->status = ebb_error_set(EBB_ERR_BUILD, "ebb_compile: the plan exceeds %d steps",
                                  EBB_MAX_STEPS);
        return NULL;
    }
    if (p->n_steps == c->cap_steps) {
        int cap = c->cap_steps ? 2 * c->cap_steps : 32;
        plan_step *s = realloc(p->steps, (size_t)cap * sizeof *s);
        if (!s) {
            oom(c);
            return NULL;
        }
        p->steps = s;
        c->cap_steps = cap;
    }
    plan_step *s = &p->steps[p->n_steps];
    memset(s, 0, sizeof *s);
    s->pub.kind = kind;
    s->pub.op = op_name;
    s->pub.jump = -1;
    s->pub.node = dup_printf("%s", path);
    if (!s->pub.node) {
        oom(c);
        return NULL;
    }
    p->n_steps++;
    return s;
}

static int step_set_slots(compiler *c, plan_step *s, const int *in, int n_in, const int *out,
                          int n_out) {
    s->pub.in = dup_ints(in, n_in);
    s->pub.n_in = n_in;
    s->pub.out = dup_ints(out, n_out);
    s->pub.n_out = n_out;
    if ((n_in && !s->pub.in) || (n_out && !s->pub.out))
        return oom(c);
    if (n_in > c->plan->max_in)
        c->plan->max_in = n_in;
    return 0;
}

static int step_index(const compiler *c, const plan_step *s) {
    return (int)(s - c->plan->steps);
}

/* ---- the dry run ------------------------------------------------------------ */

static ebb_status zeros_like_on(ebb_tensor **out, const ebb_tensor *t, ebb_device dev) {
    ebb_shape s = ebb_tensor_shape(t);
    return ebb_tensor_zeros(out, &s, ebb_tensor_dtype(t), dev);
}

/* Runs op->forward on the meta device; when the op has no meta kernel, again
 * on CPU zeros. Returns a meta tensor of the output's shape. */
static int shares_input(const ebb_tensor *r, ebb_tensor *const *in, int n) {
    for (int i = 0; i < n; i++)
        if (ebb_tensor_same_storage(r, in[i]))
            return i;
    return -1;
}

/* ... and sets *alias to the input whose storage the output shares, or -1:
 * the dry run, not the op's flag, says what is a view. */
static ebb_status dry_forward(compiler *c, ebb_op_call *call, ebb_tensor **out, int *alias) {
    ebb_tensor *r = NULL;
    int known_no_meta = 0;
    for (int i = 0; i < c->n_no_meta; i++)
        known_no_meta |= c->no_meta[i] == call->op;
    if (!known_no_meta) {
        ebb_status st = call->op->forward(call, &r);
        if (st == EBB_OK) {
            if (!r)
                return ebb_error_set(EBB_ERR_ARG, "op %s returned no tensor", call->op->name);
            *alias = shares_input(r, call->in, call->n_in);
            *out = r;
            return EBB_OK;
        }
        /* a shape or argument error is the answer; anything else may be a
         * missing meta kernel: remember the op (raising is slow) and retry */
        if (st == EBB_ERR_SHAPE || st == EBB_ERR_ARG || st == EBB_ERR_NOMEM)
            return st;
        if (c->n_no_meta < (int)(sizeof c->no_meta / sizeof c->no_meta[0]))
            c->no_meta[c->n_no_meta++] = call->op;
    }
    /* CPU retry with zeros of the same shapes. */
    ebb_tensor **cpu = calloc((size_t)(call->n_in + call->n_params), sizeof *cpu);
    if (!cpu)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    ebb_status cst = EBB_OK;
    for (int i = 0; cst == EBB_OK && i < call->n_in; i++)
        cst = zeros_like_on(&cpu[i], call->in[i], ebb_device_cpu());
    for (int i = 0; cst == EBB_OK && i < call->n_params; i++)
        cst = zeros_like_on(&cpu[call->n_in + i], call->params[i], ebb_device_cpu());
    if (cst == EBB_OK) {
        ebb_op_call cc = *call;
        cc.in = cpu;
        cc.params = cpu + call->n_in;
        cst = call->op->forward(&cc, &r);
        if (cst == EBB_OK && r) {
            *alias = shares_input(r, cpu, call->n_in);
            ebb_shape s = ebb_tensor_shape(r);
            ebb_dtype dt = ebb_tensor_dtype(r);
            ebb_tensor_free(r);
            r = NULL;
            cst = ebb_tensor_empty(&r, &s, dt, c->meta_device);
        }
    }
    for (int i = 0; i < call->n_in + call->n_params; i++)
        ebb_tensor_free(cpu[i]);
    free(cpu);
    if (cst != EBB_OK)
        return cst;
    *out = r;
    return EBB_OK;
}

/* ---- emitting steps ------------------------------------------------------- */

static int add_param(compiler *c, const ebb_param_spec *spec, const char *prefix,
                     const char *path) {
    ebb_plan *p = c->plan;
    char *full = dup_printf("%s.%s", prefix, spec->name);
    if (!full)
        return oom(c);
    for (int i = 0; i < p->n_params; i++)
        if (strcmp(p->params[i].full_name, full) == 0) {
            c->status = ebb_error_set(EBB_ERR_BUILD,
                                      "node %s: parameter '%s' is already defined by node %s "
                                      "(give the nodes different names)",
                                      path, full, p->params[i].node);
            free(full);
            return -1;
        }
    if (p->n_params == c->cap_params) {
        int cap = c->cap_params ? 2 * c->cap_params : 16;
        plan_param *np = realloc(p->params, (size_t)cap * sizeof *np);
        if (!np) {
            free(full);
            return oom(c);
        }
        p->params = np;
        c->cap_params = cap;
    }
    plan_param *pp = &p->params[p->n_params];
    pp->spec = *spec;
    pp->full_name = full;
    pp->node = dup_printf("%s", path);
    if (!pp->node) {
        free(full);
        return oom(c);
    }
    p->n_params++;
    return 0;
}

/* Emits one op step reading `in`; returns the output slot or -1. */
static int emit_op(compiler *c, const ebb_op *op, const ebb_attr_value *attrs, const char *prefix,
                   const char *path, const int *in, int n_in) {
    ebb_shape shapes[64];
    ebb_tensor *ins[64];
    if (n_in < op->min_inputs || (op->max_inputs >= 0 && n_in > op->max_inputs)) {
        c->status = ebb_error_set(EBB_ERR_BUILD, "node %s: %s takes %d to %d inputs, given %d",
                                  prefix, op->name, op->min_inputs, op->max_inputs, n_in);
        return -1;
    }
    if (n_in > 64) {
        c->status = ebb_error_set(EBB_ERR_BUILD, "node %s: %s has %d inputs (at most 64)", path,
                                  op->name, n_in);
        return -1;
    }
    for (int i = 0; i < n_in; i++) {
        ins[i] = c->meta[in[i]];
        shapes[i] = c->plan->values[in[i]].shape;
    }
    ebb_param_spec specs[EBB_MAX_PARAMS];
    int np = 0;
    if (op->params) {
        ebb_status st = op->params(attrs, shapes, n_in, specs, &np);
        if (st != EBB_OK) {
            c->status = ebb_error_prefix("node %s", prefix);
            return -1;
        }
    }
    int param_first = c->plan->n_params;
    for (int i = 0; i < np; i++)
        if (add_param(c, &specs[i], prefix, path) != 0)
            return -1;
    if (np > c->plan->max_params)
        c->plan->max_params = np;

    ebb_tensor *params[EBB_MAX_PARAMS] = {0};
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < np; i++)
        st = ebb_tensor_empty(&params[i], &specs[i].shape, c->plan->dtype, c->meta_device);
    ebb_tensor *out = NULL;
    int alias = -1;
    if (st == EBB_OK) {
        ebb_op_call call = {.op = op, .attrs = attrs, .in = ins, .n_in = n_in,
                            .params = params, .n_params = np, .node = path};
        st = dry_forward(c, &call, &out, &alias);
    }
    for (int i = 0; i < np; i++)
        ebb_tensor_free(params[i]);
    if (st == EBB_OK && ebb_tensor_ndim(out) > EBB_MAX_DIMS) {
        st = ebb_error_set(EBB_ERR_SHAPE, "the output has %d dimensions; ebb supports up to %d",
                           ebb_tensor_ndim(out), EBB_MAX_DIMS);
        ebb_tensor_free(out);
        out = NULL;
    }
    if (st != EBB_OK) {
        c->status = ebb_error_prefix("node %s (%s)", prefix, op->name);
        return -1;
    }
    plan_step *s = step_new(c, EBB_STEP_OP, op->name, prefix);
    if (!s) {
        ebb_tensor_free(out);
        return -1;
    }
    s->op = op;
    s->attrs = attrs;
    if (op->workspace && n_in > 0)
        s->workspace = op->workspace(attrs, shapes, n_in, ebb_tensor_dtype(ins[0]));
    s->param_first = param_first;
    s->n_params = np;
    /* a view op may still copy (reshape of a non-contiguous input), and an op
     * not flagged as a view may hand back its input: trust the dry run */
    int slot = value_new(c, out, EBB_VALUE_INTERMEDIATE, step_index(c, s),
                         alias >= 0 ? in[alias] : -1);
    if (slot < 0 || step_set_slots(c, s, in, n_in, &slot, 1) != 0)
        return -1;
    return slot;
}

/* A control step with no op: in -> out, the outputs' meta tensors given. */
static void drop_metas(ebb_tensor **metas, int from, int n) {
    for (int i = from; i < n; i++) {
        ebb_tensor_free(metas[i]);
        metas[i] = NULL;
    }
}

/* Takes ownership of out_meta[] on every path: the entries are NULL after. */
static plan_step *emit_control(compiler *c, ebb_step_kind kind, const char *name,
                               const char *path, const int *in, int n_in, int *out,
                               ebb_tensor **out_meta, const int *alias_of, int n_out) {
    plan_step *s = step_new(c, kind, name, path);
    if (!s) {
        drop_metas(out_meta, 0, n_out);
        return NULL;
    }
    for (int i = 0; i < n_out; i++) {
        if (out[i] < 0) {
            out[i] = value_new(c, out_meta[i], EBB_VALUE_INTERMEDIATE, step_index(c, s),
                               alias_of ? alias_of[i] : -1);
            out_meta[i] = NULL;
            if (out[i] < 0) {
                drop_metas(out_meta, i + 1, n_out);
                return NULL;
            }
        } else {
            /* a redefinition (loop state, switch accumulator): keep the
             * slot's first shape and drop the new meta tensor */
            drop_metas(out_meta, i, i + 1);
        }
    }
    if (step_set_slots(c, s, in, n_in, out, n_out) != 0)
        return NULL;
    return s;
}

static ebb_tensor *meta_ref(compiler *c, int slot) {
    ebb_tensor *t = NULL;
    if (ebb_tensor_ref(&t, c->meta[slot]) != EBB_OK) {
        c->status = ebb_errcode();
        return NULL;
    }
    return t;
}

static ebb_tensor *meta_new(compiler *c, const ebb_shape *s, ebb_dtype dt) {
    ebb_tensor *t = NULL;
    if (ebb_tensor_empty(&t, s, dt, c->meta_device) != EBB_OK) {
        c->status = ebb_errcode();
        return NULL;
    }
    return t;
}

/* ---- lowering ----------------------------------------------------------- */

static int lower_flow(compiler *c, const ebb_graph *g, const char *prefix, scope *sc,
                      int stream);

static char *shape_text(const ebb_shape *s, char *buf, size_t n) { return (char *)ebb_shape_str(s, buf, n); }

/* Lowers one node applied to in[0..n_in); returns its output slot. */
static int lower_node(compiler *c, const ebb_node *n, const char *path, const scope *sc,
                      const int *in, int n_in) {
    switch (n->kind) {
    case NODE_OP:
        return emit_op(c, n->op, n->attrs, n->name ? n->name : path, path, in, n_in);
    case NODE_SEQ: {
        int slot = -1;
        for (int j = 0; j < n->n_children; j++) {
            char *cp = dup_printf("%s.%d", path, j);
            if (!cp)
                return oom(c);
            slot = j == 0 ? lower_node(c, n->children[0], cp, sc, in, n_in)
                          : lower_node(c, n->children[j], cp, sc, &slot, 1);
            free(cp);
            if (slot < 0)
                return -1;
        }
        return slot;
    }
    case NODE_GRAPH:
    case NODE_SUBFLOW: {
        const ebb_graph *g = n->graph;
        scope inner = {.parent = n->kind == NODE_SUBFLOW ? sc : NULL};
        int out = -1;
        const char *prefix = n->name ? n->name : path;
        for (int i = 0; i < g->inputs.n && i < n_in; i++)
            if (scope_bind(c, &inner, g->inputs.items[i], in[i]) != 0)
                goto done;
        out = lower_flow(c, g, prefix, &inner, in[0]);
    done:
        scope_free(&inner);
        return out;
    }
    }
    return -1;
}

static int resolve_using(compiler *c, const graph_step *st, const scope *sc, const char *path,
                         int stream, int *in) {
    in[0] = stream;
    for (int u = 0; u < st->using_tags.n; u++) {
        int slot = scope_lookup(sc, st->using_tags.items[u]);
        if (slot < 0) {
            c->status = ebb_error_set(EBB_ERR_BUILD, "node %s: undefined tag '%s'", path,
                                      st->using_tags.items[u]);
            return -1;
        }
        in[1 + u] = slot;
    }
    return 1 + st->using_tags.n;
}

static const char *merge_op_name(ebb_merge_op m) {
    switch (m) {
    case EBB_MERGE_ADD: return "add";
    case EBB_MERGE_MEAN: return "average";
    case EBB_MERGE_MUL: return "mul";
    case EBB_MERGE_MAX: return "maximum";
    case EBB_MERGE_CAT: return "cat";
    case EBB_MERGE_STACK: return "stack";
    }
    return "add";
}

static const ebb_attr_value *int_attr(compiler *c, int64_t value) {
    attr_block *a = calloc(1, sizeof *a);
    if (!a) {
        oom(c);
        return NULL;
    }
    a->v[0].type = EBB_ATTR_INT;
    a->v[0].set = 1;
    a->v[0].i = value;
    a->v[0].f = (double)value;
    a->next = c->attrs;
    c->attrs = a;
    return a->v;
}

/* Switch and top-k gate: route, then per branch enter / body / exit. */
static int lower_routed(compiler *c, const graph_step *st, const char *spath, const scope *sc,
                        int x, int scores, ebb_route_mode mode) {
    const char *kind = mode == EBB_ROUTE_SWITCH ? "switch" : "gate";
    int k = st->n_nodes;
    ebb_plan_value sv = c->plan->values[scores];
    char sb[96], xb[96];
    int64_t batch = c->plan->values[x].shape.ndim ? c->plan->values[x].shape.dim[0] : 1;
    int int_sel = sv.dtype == EBB_INT64 || sv.dtype == EBB_INT32 || sv.dtype == EBB_UINT8;
    int ok_shape = sv.shape.ndim >= 1 && sv.shape.dim[0] == batch &&
                   ((mode == EBB_ROUTE_SWITCH && int_sel && sv.shape.ndim == 1) ||
                    (!int_sel && sv.shape.ndim == 2 && sv.shape.dim[1] == k));
    if (!ok_shape) {
        c->status = ebb_error_set(
            EBB_ERR_SHAPE,
            "node %s.%s: %s output is %s %s, expected %s[%lld, %d] scores for %d %s (input %s)",
            spath, mode == EBB_ROUTE_SWITCH ? "selector" : "router",
            mode == EBB_ROUTE_SWITCH ? "selector" : "router", ebb_dtype_name(sv.dtype),
            shape_text(&sv.shape, sb, sizeof sb),
            mode == EBB_ROUTE_SWITCH ? "[batch] integer indices or " : "", (long long)batch, k, k,
            mode == EBB_ROUTE_SWITCH ? "branches" : "experts",
            shape_text(&c->plan->values[x].shape, xb, sizeof xb));
        return -1;
    }
    char *path = dup_printf("%s.%s", spath, kind);
    if (!path)
        return oom(c);
    int result = -1;
    /* ROUTE: (scores) -> (route table, empty accumulator) */
    ebb_tensor *rm[2];
    ebb_shape rs = mode == EBB_ROUTE_SWITCH ? (ebb_shape){1, {batch}} : sv.shape;
    rm[0] = meta_new(c, &rs, mode == EBB_ROUTE_SWITCH ? EBB_INT64 : sv.dtype);
    rm[1] = NULL;
    int rout[2] = {-1, -1};
    plan_step *route = rm[0] ? emit_control(c, EBB_STEP_ROUTE, "route", path, &scores, 1, rout, rm,
                                            NULL, 1)
                             : NULL;
    if (!route)
        goto out;
    route->mode = mode;
    route->n_branches = k;
    route->top_k = st->top_k;
    /* the accumulator slot starts empty at the route step */
    int acc = value_new(c, NULL, EBB_VALUE_INTERMEDIATE, step_index(c, route), -1);
    if (acc < 0)
        goto out;
    {
        int outs[2] = {rout[0], acc};
        free((void *)route->pub.out);
        route->pub.out = dup_ints(outs, 2);
        route->pub.n_out = 2;
        if (!route->pub.out) {
            oom(c);
            goto out;
        }
    }
    int acc_has_shape = 0;
    for (int j = 0; j < k; j++) {
        char *bpath = dup_printf("%s.%d", path, j);
        if (!bpath) {
            oom(c);
            goto out;
        }
        /* ENTER j: (x, route) -> (rows, x_rows) */
        int ein[2] = {x, rout[0]};
        int eout[2] = {-1, -1};
        ebb_tensor *em[2] = {NULL, meta_ref(c, x)};
        ebb_shape rows_shape = {1, {batch}};
        em[0] = meta_new(c, &rows_shape, EBB_INT64);
        int alias[2] = {-1, x};
        plan_step *enter = (em[0] && em[1])
                               ? emit_control(c, EBB_STEP_ENTER, "enter", bpath, ein, 2, eout, em,
                                              alias, 2)
                               : NULL;
        if (!enter) {
            /* still ours only if emit_control was never called */
            ebb_tensor_free(em[0]);
            ebb_tensor_free(em[1]);
            free(bpath);
            goto out;
        }
        /* rows: no storage in the all-rows walk the prediction follows */
        c->plan->values[eout[0]].nbytes = 0;
        int enter_index = step_index(c, enter);
        enter->mode = mode;
        enter->branch = j;
        int y = lower_node(c, st->nodes[j], bpath, sc, &eout[1], 1);
        if (y < 0) {
            free(bpath);
            goto out;
        }
        ebb_plan_value yv = c->plan->values[y];
        ebb_shape as = yv.shape;
        if (as.ndim < 1 || as.dim[0] != batch) {
            c->status = ebb_error_set(EBB_ERR_SHAPE,
                                      "node %s: branch output %s does not keep the batch of %lld rows",
                                      bpath, shape_text(&as, sb, sizeof sb), (long long)batch);
            free(bpath);
            goto out;
        }
        if (acc_has_shape && !ebb_shape_equal(&as, &c->plan->values[acc].shape)) {
            c->status = ebb_error_set(EBB_ERR_SHAPE,
                                      "node %s: branch output %s differs from branch 0's %s", bpath,
                                      shape_text(&as, sb, sizeof sb),
                                      shape_text(&c->plan->values[acc].shape, xb, sizeof xb));
            free(bpath);
            goto out;
        }
        /* EXIT j: (y, rows, route, acc) -> acc */
        int xin[4] = {y, eout[0], rout[0], acc};
        int xout[1] = {acc};
        ebb_tensor *xm[1] = {NULL};
        plan_step *exit = emit_control(c, EBB_STEP_EXIT, "exit", bpath, xin, 4, xout, xm, NULL, 1);
        free(bpath);
        if (!exit)
            goto out;
        exit->mode = mode;
        exit->branch = j;
        if (!acc_has_shape) {
            ebb_plan_value *av = &c->plan->values[acc];
            av->shape = as;
            av->dtype = yv.dtype;
            av->nbytes = ebb_shape_numel(&as) * (int64_t)ebb_dtype_size(yv.dtype);
            c->meta[acc] = meta_new(c, &as, yv.dtype);
            if (!c->meta[acc])
                goto out;
            acc_has_shape = 1;
        }
        c->plan->steps[enter_index].pub.jump = c->plan->n_steps;
    }
    result = acc;
out:
    free(path);
    return result;
}

/* Lowers a loop's condition on the state and the jump that leaves the loop
 * when (mean(cond) > 0) == sense. Returns the jump's step index, or -1. */
static int emit_loop_test(compiler *c, const graph_step *st, const char *path,
                          const char *cond_path, const scope *sc, int state, int sense) {
    int cv = lower_node(c, st->aux, cond_path, sc, &state, 1);
    if (cv < 0)
        return -1;
    plan_step *j = emit_control(c, EBB_STEP_JUMP_IF, "jump_if", path, &cv, 1, NULL, NULL, NULL, 0);
    if (!j)
        return -1;
    j->sense = sense;
    return step_index(c, j);
}

static int lower_loop(compiler *c, const graph_step *st, const char *spath, const scope *sc,
                      int x) {
    char *path = dup_printf("%s.loop", spath);
    char *body_path = dup_printf("%s.loop.body", spath);
    char *cond_path = dup_printf("%s.loop.cond", spath);
    int result = -1;
    if (!path || !body_path || !cond_path) {
        oom(c);
        goto out;
    }
    /* The state gets a slot of its own: the body redefines it each iteration. */
    int state[1] = {-1};
    ebb_tensor *sm[1] = {meta_ref(c, x)};
    int alias[1] = {x};
    if (!sm[0] || !emit_control(c, EBB_STEP_ALIAS, "alias", path, &x, 1, state, sm, alias, 1))
        goto out;
    int counter = c->plan->n_counters++;
    plan_step *init = step_new(c, EBB_STEP_LOOP_INIT, "loop_init", path);
    if (!init)
        goto out;
    init->counter = counter;
    init->limit = st->count; /* a limit of 0 jumps straight past the loop */
    int init_index = step_index(c, init);
    int head = c->plan->n_steps;
    int cond_jump = -1;
    /* while: test before the body, leave when the condition is false */
    if (st->loop == LOOP_WHILE && (cond_jump = emit_loop_test(c, st, path, cond_path, sc, state[0], 0)) < 0)
        goto out;
    int y = lower_node(c, st->node, body_path, sc, state, 1);
    if (y < 0)
        goto out;
    ebb_shape ys = c->plan->values[y].shape, ss = c->plan->values[state[0]].shape;
    if (!ebb_shape_equal(&ys, &ss)) {
        char a[96], b[96];
        c->status = ebb_error_set(EBB_ERR_SHAPE,
                                  "node %s: the loop body maps state %s to %s; a loop body must "
                                  "keep the state's shape",
                                  body_path, shape_text(&ss, a, sizeof a),
                                  shape_text(&ys, b, sizeof b));
        goto out;
    }
    ebb_tensor *ym[1] = {meta_ref(c, y)};
    int alias_y[1] = {y};
    if (!ym[0] || !emit_control(c, EBB_STEP_ALIAS, "alias", path, &y, 1, state, ym, alias_y, 1))
        goto out;
    /* until: test after the body, leave when the condition is true */
    if (st->loop == LOOP_UNTIL && (cond_jump = emit_loop_test(c, st, path, cond_path, sc, state[0], 1)) < 0)
        goto out;
    plan_step *next = step_new(c, EBB_STEP_LOOP_NEXT, "loop_next", path);
    if (!next)
        goto out;
    next->counter = counter;
    next->limit = st->count;
    next->pub.jump = head;
    if (cond_jump >= 0)
        c->plan->steps[cond_jump].pub.jump = c->plan->n_steps;
    c->plan->steps[init_index].pub.jump = c->plan->n_steps;
    result = state[0];
out:
    free(path);
    free(body_path);
    free(cond_path);
    return result;
}

/* Lowers a flow's steps. `stream` is the open stream for sub-flows and
 * nested graphs (-1 for the top level, which starts with from). */
static int lower_flow(compiler *c, const ebb_graph *g, const char *prefix, scope *sc, int stream) {
    int open[256];
    int n_open = stream >= 0 ? 1 : 0;
    open[0] = stream;
    int in[65];
    for (int i = 0; i < g->n_steps; i++) {
        const graph_step *st = &g->steps[i];
        if (st->n_nodes > 256 || st->using_tags.n > 64) {
            c->status = ebb_error_set(EBB_ERR_BUILD,
                                      "step %s.%d: at most 256 branches and 64 using tags", prefix, i);
            return -1;
        }
        char *spath = dup_printf("%s.%d", prefix, i);
        if (!spath)
            return oom(c);
        int out = -1, ok = 1;
        switch (st->kind) {
        case STEP_FROM:
        case STEP_THROUGH: {
            int first = st->kind == STEP_FROM ? scope_lookup(sc, g->inputs.items[0]) : open[0];
            int n_in = resolve_using(c, st, sc, spath, first, in);
            out = n_in < 0 ? -1 : lower_node(c, st->node, spath, sc, in, n_in);
            n_open = 1;
            break;
        }
        case STEP_ALSO: {
            char *np = dup_printf("%s.also", spath);
            if (!np) {
                ok = 0;
                oom(c);
                break;
            }
            int y = lower_node(c, st->node, np, sc, &open[0], 1);
            free(np);
            if (y >= 0) {
                int pair[2] = {open[0], y};
                out = emit_op(c, ebb_op_find("add"), NULL, spath, spath, pair, 2);
            }
            break;
        }
        case STEP_SPLIT: {
            int x = open[0];
            for (int j = 0; j < st->n_nodes && ok; j++) {
                char *np = dup_printf("%s.split.%d", spath, j);
                open[j] = np ? lower_node(c, st->nodes[j], np, sc, &x, 1) : oom(c);
                free(np);
                ok = open[j] >= 0;
            }
            n_open = st->n_nodes;
            out = ok ? open[0] : -1;
            break;
        }
        case STEP_MERGE: {
            char *np = dup_printf("%s.merge", spath);
            const ebb_op *op = ebb_op_find(merge_op_name(st->merge));
            const ebb_attr_value *attrs = NULL;
            if (st->merge == EBB_MERGE_CAT || st->merge == EBB_MERGE_STACK)
                attrs = int_attr(c, st->dim);
            if (np && (attrs || !(st->merge == EBB_MERGE_CAT || st->merge == EBB_MERGE_STACK)))
                out = emit_op(c, op, attrs, np, np, open, n_open);
            else if (!np)
                oom(c);
            free(np);
            n_open = 1;
            break;
        }
        case STEP_GATE: {
            int x = open[0];
            char *rp = dup_printf("%s.gate.router", spath);
            int w = rp ? lower_node(c, st->aux, rp, sc, &x, 1) : oom(c);
            free(rp);
            if (w < 0)
                break;
            if (st->top_k > 0) {
                out = lower_routed(c, st, spath, sc, x, w, EBB_ROUTE_TOPK);
                break;
            }
            ebb_plan_value wv = c->plan->values[w];
            if (wv.shape.ndim != 2 || wv.shape.dim[1] != st->n_nodes) {
                char a[96];
                c->status = ebb_error_set(EBB_ERR_SHAPE,
                                          "node %s.gate.router: router output is %s, expected "
                                          "[batch, %d] weights for %d experts",
                                          spath, shape_text(&wv.shape, a, sizeof a), st->n_nodes,
                                          st->n_nodes);
                break;
            }
            int acc = -1;
            for (int j = 0; j < st->n_nodes; j++) {
                char *ep = dup_printf("%s.gate.%d", spath, j);
                int y = ep ? lower_node(c, st->nodes[j], ep, sc, &x, 1) : oom(c);
                const ebb_attr_value *idx = y >= 0 ? int_attr(c, j) : NULL;
                if (idx) {
                    int mix_in[3] = {acc, w, y};
                    acc = acc < 0 ? emit_op(c, ebb_op_find("_gate_mix"), idx, ep, ep, mix_in + 1, 2)
                                  : emit_op(c, ebb_op_find("_gate_mix"), idx, ep, ep, mix_in, 3);
                } else {
                    acc = -1;
                }
                free(ep);
                if (acc < 0)
                    break;
            }
            out = acc;
            break;
        }
        case STEP_SWITCH: {
            int x = open[0];
            char *sp = dup_printf("%s.switch.selector", spath);
            int sel = sp ? lower_node(c, st->aux, sp, sc, &x, 1) : oom(c);
            free(sp);
            if (sel >= 0)
                out = lower_routed(c, st, spath, sc, x, sel, EBB_ROUTE_SWITCH);
            break;
        }
        case STEP_LOOP: out = lower_loop(c, st, spath, sc, open[0]); break;
        case STEP_TAG:
            out = open[0];
            if (scope_bind(c, sc, st->tag, out) != 0)
                out = -1;
            else if (!c->plan->values[out].name)
                c->plan->values[out].name = st->tag;
            break;
        }
        free(spath);
        if (out < 0 || !ok) {
            if (c->status == EBB_OK)
                c->status = ebb_errcode() != EBB_OK ? ebb_errcode() : EBB_ERR_BUILD;
            return -1;
        }
        if (st->kind != STEP_SPLIT)
            open[0] = out;
    }
    return open[0];
}

/* ---- liveness ----------------------------------------------------------- */

typedef uint64_t word;
#define WBITS 64

static int bit_get(const word *s, int i) { return (int)((s[i / WBITS] >> (i % WBITS)) & 1u); }
static void bit_set(word *s, int i) { s[i / WBITS] |= (word)1 << (i % WBITS); }

/* The successors of step i: fall-through (i+1, or -1) and jump (or -1). */
static void successors(const ebb_plan *p, int i, int *fall, int *jump) {
    const plan_step *s = &p->steps[i];
    *fall = i + 1;
    *jump = s->pub.jump;
    (void)p;
}

/* Computes per-edge free lists. live_in[n_steps] (the exit) holds the outputs. */
static int compute_frees(compiler *c) {
    ebb_plan *p = c->plan;
    int n = p->n_steps, nv = p->n_values;
    int words = (nv + WBITS - 1) / WBITS;
    if (words == 0)
        words = 1;
    word *live = calloc((size_t)(n + 1) * (size_t)words, sizeof *live);
    word *keep = calloc((size_t)words, sizeof *keep);
    int *list = malloc((size_t)(nv ? nv : 1) * sizeof *list);
    if (!live || !keep || !list) {
        free(live);
        free(keep);
        free(list);
        return oom(c);
    }
    for (int i = 0; i < p->n_inputs; i++)
        bit_set(keep, p->inputs[i]);
    /* Outputs are live at the exit, so no edge frees the value they end with;
     * a slot that is rewritten before the end (a loop state that is also the
     * output) may still drop its earlier values. */
    for (int i = 0; i < p->n_outputs; i++)
        bit_set(&live[(size_t)n * words], p->outputs[i]);
    /* backward iteration to a fixed point */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = n - 1; i >= 0; i--) {
            const plan_step *s = &p->steps[i];
            word *in = &live[(size_t)i * words];
            int fall, jump;
            successors(p, i, &fall, &jump);
            for (int w = 0; w < words; w++) {
                word out = live[(size_t)fall * words + w];
                if (jump >= 0)
                    out |= live[(size_t)jump * words + w];
                word def = 0, use = 0;
                for (int k = 0; k < s->pub.n_out; k++)
                    if (s->pub.out[k] / WBITS == w)
                        def |= (word)1 << (s->pub.out[k] % WBITS);
                for (int k = 0; k < s->pub.n_in; k++)
                    if (s->pub.in[k] / WBITS == w)
                        use |= (word)1 << (s->pub.in[k] % WBITS);
                word nw = use | (out & ~def);
                if (nw != in[w]) {
                    in[w] = nw;
                    changed = 1;
                }
            }
        }
    }
    /* frees on an edge i -> t: (live_in(i) | def(i)) & ~live_in(t), minus
     * the caller's inputs. keep_all: nothing. */
    for (int i = 0; i < n && !p->keep_all; i++) {
        plan_step *s = &p->steps[i];
        int fall, jump;
        successors(p, i, &fall, &jump);
        for (int e = 0; e < 2; e++) {
            int t = e == 0 ? fall : jump;
            if (t < 0)
                continue;
            int count = 0;
            for (int v = 0; v < nv; v++) {
                int here = bit_get(&live[(size_t)i * words], v);
                for (int k = 0; !here && k < s->pub.n_out; k++)
                    here = s->pub.out[k] == v;
                if (here && !bit_get(&live[(size_t)t * words], v) && !bit_get(keep, v))
                    list[count++] = v;
            }
            int *copy = dup_ints(list, count);
            if (count && !copy) {
                free(live);
                free(keep);
                free(list);
                return oom(c);
            }
            if (e == 0) {
                s->pub.frees = copy;
                s->pub.n_frees = count;
            } else {
                s->pub.jump_frees = copy;
                s->pub.n_jump_frees = count;
            }
        }
    }
    free(live);
    free(keep);
    free(list);
    return 0;
}

/* ---- in-place steps ---------------------------------------------------- */

/* An elementwise op may overwrite its input when that input dies at this
 * step and owns its storage outright: made by an op (not a view or alias of
 * anything) and looked at by no other value. The executor re-checks at run
 * time that nothing else holds the storage. */
static void mark_in_place(compiler *c) {
    ebb_plan *p = c->plan;
    if (p->keep_all)
        return;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        if (s->pub.kind != EBB_STEP_OP || !s->op->forward_inplace || s->pub.n_in != 1)
            continue;
        int x = s->pub.in[0], y = s->pub.out[0];
        const ebb_plan_value *xv = &p->values[x], *yv = &p->values[y];
        if (xv->kind != EBB_VALUE_INTERMEDIATE || xv->alias_of >= 0 || xv->nbytes <= 0 ||
            yv->alias_of >= 0 || yv->dtype != xv->dtype || !ebb_shape_equal(&yv->shape, &xv->shape))
            continue;
        int dies = 0, shared = 0;
        for (int k = 0; k < s->pub.n_frees; k++)
            dies |= s->pub.frees[k] == x;
        for (int v = 0; v < p->n_values && !shared; v++)
            shared = v != y && p->values[v].alias_of == x;
        /* the slot must not be written again elsewhere (loop state, accumulator) */
        for (int j = 0; j < p->n_steps && !shared; j++)
            for (int k = 0; k < p->steps[j].pub.n_out; k++)
                shared |= j != xv->producer && p->steps[j].pub.out[k] == x;
        if (!dies || shared)
            continue;
        s->pub.in_place = 1;
        p->values[y].alias_of = x;
        p->values[y].nbytes = 0;
    }
}

/* ---- predicted memory --------------------------------------------------- */

/* Walks the steps in listing order (branches taken, loop bodies once) and
 * counts storage per alias class. With `no_frees`, nothing is released: the
 * keep_all figure. Writes per-step figures unless no_frees. */
static int64_t predict(compiler *c, int no_frees, int64_t granule, int *peak_step) {
    ebb_plan *p = c->plan;
    int nv = p->n_values;
    int *cls = malloc((size_t)(nv ? nv : 1) * sizeof *cls);      /* slot -> class (-1) */
    int64_t *bytes = calloc((size_t)(nv ? nv : 1), sizeof *bytes); /* class -> bytes */
    int *refs = calloc((size_t)(nv ? nv : 1), sizeof *refs);       /* class -> slots */
    if (!cls || !bytes || !refs) {
        free(cls);
        free(bytes);
        free(refs);
        oom(c);
        return -1;
    }
    for (int v = 0; v < nv; v++)
        cls[v] = -1;
    int64_t live = 0, peak = 0;
    int at = 0;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        for (int k = 0; k < s->pub.n_out; k++) {
            int v = s->pub.out[k];
            const ebb_plan_value *val = &p->values[v];
            int new_cls;
            if (s->pub.kind == EBB_STEP_EXIT && cls[v] >= 0) {
                new_cls = cls[v]; /* scattered into in place */
            } else if (val->alias_of >= 0 && s->pub.kind != EBB_STEP_EXIT) {
                new_cls = cls[val->alias_of];
                if (s->pub.kind == EBB_STEP_ALIAS)
                    new_cls = cls[s->pub.in[0]];
            } else if (s->pub.kind == EBB_STEP_ROUTE && k == 1) {
                new_cls = -1; /* the empty accumulator */
            } else if (val->nbytes > 0) {
                new_cls = v;
                bytes[v] = granule ? (val->nbytes + granule - 1) / granule * granule : val->nbytes;
            } else {
                new_cls = -1;
            }
            if (new_cls != cls[v]) {
                if (cls[v] >= 0 && --refs[cls[v]] == 0)
                    live -= bytes[cls[v]];
                if (new_cls >= 0 && refs[new_cls]++ == 0)
                    live += bytes[new_cls];
                cls[v] = new_cls;
            }
        }
        int64_t ws = s->workspace;
        if (granule && ws)
            ws = (ws + granule - 1) / granule * granule;
        if (live + ws > peak) {
            peak = live + ws;
            at = i;
        }
        int record = !no_frees && !granule;
        if (record)
            s->pub.peak_bytes = live + ws;
        for (int k = 0; !no_frees && k < s->pub.n_frees; k++) {
            int v = s->pub.frees[k];
            if (cls[v] >= 0 && --refs[cls[v]] == 0)
                live -= bytes[cls[v]];
            cls[v] = -1;
        }
        if (record)
            s->pub.live_bytes = live;
    }
    free(cls);
    free(bytes);
    free(refs);
    if (peak_step)
        *peak_step = at;
    return peak;
}

/* ---- entry points --------------------------------------------------------- */

void ebb_plan_free(ebb_plan *p) {
    if (!p)
        return;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        free((char *)s->pub.node);
        free((int *)s->pub.in);
        free((int *)s->pub.out);
        free((int *)s->pub.frees);
        free((int *)s->pub.jump_frees);
    }
    free(p->steps);
    free(p->values);
    free(p->inputs);
    free(p->outputs);
    free(p->output_names);
    for (int i = 0; i < p->n_params; i++) {
        free(p->params[i].full_name);
        free(p->params[i].node);
    }
    free(p->params);
    while (p->attrs) {
        attr_block *next = ((attr_block *)p->attrs)->next;
        free(p->attrs);
        p->attrs = next;
    }
    free(p->name);
    ebb_graph_free(p->graph);
    free(p);
}

ebb_status ebb_compile(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: out is NULL");
    *out = NULL;
    if (!g || !opts)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: graph and options are required");
    if (g->is_subflow)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: '%s' is a sub-flow; compile the flow that "
                                          "uses it",
                             g->name);
    if (opts->n_input_shapes != g->inputs.n || (g->inputs.n && !opts->input_shapes))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: graph '%s' has %d input(s), %d shape(s) given", g->name,
                             g->inputs.n, opts->n_input_shapes);
    ebb_status st = ebb_init();
    if (st != EBB_OK)
        return st;

    compiler c = {.meta_device = {EBB_DEVICE_META, 0}};
    ebb_plan *p = calloc(1, sizeof *p);
    if (!p)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    static atomic_uint_fast64_t next_plan_id = 1;
    c.plan = p;
    p->id = atomic_fetch_add(&next_plan_id, 1);
    p->graph = (ebb_graph *)g;
    atomic_fetch_add(&p->graph->refs, 1);
    p->keep_all = opts->keep_all;
    p->dtype = opts->dtype;
    p->peak_step = -1;
    p->name = malloc(strlen(g->name) + 1);
    p->inputs = calloc((size_t)g->inputs.n + 1, sizeof *p->inputs);
    p->n_outputs = 1 + g->outputs.n;
    p->outputs = calloc((size_t)p->n_outputs, sizeof *p->outputs);
    p->output_names = calloc((size_t)p->n_outputs, sizeof *p->output_names);
    scope top = {0};
    if (!p->name || !p->inputs || !p->outputs || !p->output_names) {
        oom(&c);
        goto fail;
    }
    strcpy(p->name, g->name);

    for (int i = 0; i < g->inputs.n; i++) {
        const ebb_shape *s = &opts->input_shapes[i];
        char buf[96];
        if (s->ndim < 0 || s->ndim > EBB_MAX_DIMS) {
            c.status = ebb_error_set(EBB_ERR_SHAPE, "ebb_compile: input '%s' has %d dims", g->inputs.items[i], s->ndim);
            goto fail;
        }
        int64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) {
            /* refuse shapes whose byte size would overflow int64 */
            if (s->dim[d] > 0 && numel > (INT64_MAX / 16) / s->dim[d]) {
                c.status = ebb_error_set(EBB_ERR_SHAPE, "ebb_compile: input '%s' of shape %s is too large",
                                         g->inputs.items[i], ebb_shape_str(s, buf, sizeof buf));
                goto fail;
            }
            numel *= s->dim[d] > 0 ? s->dim[d] : 1;
        }
        for (int d = 0; d < s->ndim; d++)
            if (s->dim[d] < 0) {
                c.status = ebb_error_set(EBB_ERR_SHAPE, "ebb_compile: input '%s' has shape %s",
                                         g->inputs.items[i], ebb_shape_str(s, buf, sizeof buf));
                goto fail;
            }
        ebb_tensor *m = meta_new(&c, s, opts->input_dtypes ? opts->input_dtypes[i] : p->dtype);
        if (!m)
            goto fail;
        int slot = value_new(&c, m, EBB_VALUE_INPUT, -1, -1);
        if (slot < 0)
            goto fail;
        p->values[slot].name = g->inputs.items[i];
        p->inputs[i] = slot;
        p->n_inputs++;
        if (scope_bind(&c, &top, g->inputs.items[i], slot) != 0)
            goto fail;
    }
    int y = lower_flow(&c, g, "flow", &top, -1);
    if (y < 0)
        goto fail;
    p->outputs[0] = y;
    p->output_names[0] = g->final_name;
    for (int i = 0; i < g->outputs.n; i++) {
        p->outputs[1 + i] = scope_lookup(&top, g->outputs.items[i]);
        p->output_names[1 + i] = g->outputs.items[i];
    }
    for (int i = 0; i < p->n_outputs; i++)
        if (p->values[p->outputs[i]].kind != EBB_VALUE_INPUT)
            p->values[p->outputs[i]].kind = EBB_VALUE_OUTPUT;
    if (compute_frees(&c) != 0)
        goto fail;
    /* keep_all is the figure without liveness, so without in-place steps too */
    p->keep_all_peak_bytes = predict(&c, 1, 0, NULL);
    mark_in_place(&c);
    p->peak_bytes = predict(&c, 0, 0, &p->peak_step);
    /* CUDA's caching allocator counts blocks rounded up to 512 bytes */
    p->cuda_peak_bytes = predict(&c, p->keep_all, 512, NULL);
    if (p->peak_bytes < 0 || p->keep_all_peak_bytes < 0 || p->cuda_peak_bytes < 0)
        goto fail;
    p->attrs = c.attrs;
    for (int v = 0; v < p->n_values; v++)
        ebb_tensor_free(c.meta[v]);
    free(c.meta);
    scope_free(&top);
    *out = p;
    return EBB_OK;

fail:
    st = c.status != EBB_OK ? c.status : (ebb_errcode() != EBB_OK ? ebb_errcode() : EBB_ERR_BUILD);
    p->attrs = c.attrs;
    for (int v = 0; v < p->n_values; v++)
        ebb_tensor_free(c.meta[v]);
    free(c.meta);
    scope_free(&top);
    ebb_plan_free(p);
    return st;
}
