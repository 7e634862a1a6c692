/* The fluent builder. Each call checks the structural rules it can see (open
 * streams, tags, arity, attributes) and appends one step. The first failure
 * is sticky: it is recorded with the name of the call, and every later call
 * does nothing, so a chain of calls is checked once, at ebb_build(). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

#define EBB_BUILDER_ERR_MAX 1024
#define EBB_MAX_VARARGS 256

struct ebb_builder {
    ebb_builder *parent; /* set for sub-flows */
    char *name;
    ebb_status status;
    char err[EBB_BUILDER_ERR_MAX];
    name_list inputs;
    char *final_name;
    name_list outputs;
    graph_step *steps;
    int n_steps, cap_steps;
    int open;    /* open streams */
    int started; /* a from (or, in a sub-flow, the implicit input) */
    name_list tags;
    name_list pending_using;
    int has_pending_using;
    name_list free_tags;
    name_list targets;
    const ebb_op *loss;
    ebb_attr_value loss_attrs[EBB_MAX_ATTRS];
    char *loss_attr_text;
    ebb_node *owned;
};

/* ---- small helpers ------------------------------------------------------ */

static char *dup_str(const char *s) {
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static int names_find(const name_list *l, const char *s) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->items[i], s) == 0)
            return i;
    return -1;
}

static int names_add(name_list *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        char **items = realloc(l->items, (size_t)cap * sizeof *items);
        if (!items)
            return -1;
        l->items = items;
        l->cap = cap;
    }
    char *d = dup_str(s);
    if (!d)
        return -1;
    l->items[l->n++] = d;
    return 0;
}

static void names_free(name_list *l) {
    for (int i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

/* Node names may be dotted, like PyTorch module paths ("encoder.0.ffn"). */
int ebb_graph_valid_node_name(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '-' || *s == '.'))
            return 0;
    return s[-1] != '.';
}

static int valid_name(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

void ebb_inputs_wanted(int min, int max, char *buf, size_t size) {
    if (min == max)
        snprintf(buf, size, "%d input%s", min, min == 1 ? "" : "s");
    else if (max < 0)
        snprintf(buf, size, "at least %d inputs", min);
    else
        snprintf(buf, size, "%d to %d inputs", min, max);
}

const char *ebb_graph_step_kind_name(step_kind k) {
    static const char *names[] = {"from",   "through", "also", "split", "merge",
                                  "gate",   "switch",  "loop", "tag"};
    return names[k];
}

/* ---- errors --------------------------------------------------------------- */

static int failed(const ebb_builder *b) { return !b || b->status != EBB_OK; }

static void fail_v(ebb_builder *b, ebb_status st, const char *fmt, va_list ap) {
    if (!b || b->status != EBB_OK)
        return;
    b->status = st;
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    ebb_error_set(st, "%s", b->err);
}

static void fail(ebb_builder *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void fail(ebb_builder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(b, EBB_ERR_BUILD, fmt, ap);
    va_end(ap);
}

void ebb_builder_fail(ebb_builder *b, ebb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(b, status, fmt, ap);
    va_end(ap);
}

static void nomem(ebb_builder *b, const char *call) {
    if (b && b->status == EBB_OK) {
        b->status = EBB_ERR_NOMEM;
        snprintf(b->err, sizeof b->err, "%s: out of memory", call);
        ebb_error_set(EBB_ERR_NOMEM, "%s", b->err);
    }
}

ebb_status ebb_builder_status(const ebb_builder *b) { return b ? b->status : EBB_ERR_ARG; }

const char *ebb_builder_errmsg(const ebb_builder *b) { return b ? b->err : "builder is NULL"; }

/* ---- builder lifetime ------------------------------------------------------ */

ebb_builder *ebb_builder_new(const char *name) {
    /* nodes look ops up in the registry ebb_init() fills; it is idempotent */
    if (ebb_init() != EBB_OK)
        return NULL;
    ebb_builder *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->name = dup_str(name ? name : "flow");
    if (!b->name) {
        free(b);
        return NULL;
    }
    return b;
}

static void node_free(ebb_node *n) {
    free(n->name);
    free(n->attr_text);
    free(n->children);
    if (n->graph)
        ebb_graph_free(n->graph);
    names_free(&n->free_tags);
    names_free(&n->share_param);
    names_free(&n->share_source);
    free(n);
}

static void nodes_free(ebb_node *n) {
    while (n) {
        ebb_node *next = n->next_owned;
        node_free(n);
        n = next;
    }
}

static void steps_free(graph_step *steps, int n) {
    for (int i = 0; i < n; i++) {
        free(steps[i].nodes);
        free(steps[i].tag);
        names_free(&steps[i].using_tags);
    }
    free(steps);
}

void ebb_builder_free(ebb_builder *b) {
    if (!b)
        return;
    free(b->name);
    names_free(&b->inputs);
    free(b->final_name);
    names_free(&b->outputs);
    steps_free(b->steps, b->n_steps);
    names_free(&b->tags);
    names_free(&b->pending_using);
    names_free(&b->free_tags);
    names_free(&b->targets);
    free(b->loss_attr_text);
    nodes_free(b->owned);
    free(b);
}

/* ---- nodes ---------------------------------------------------------------- */

static ebb_node *node_new(ebb_builder *b, node_kind kind, const char *call) {
    ebb_node *n = calloc(1, sizeof *n);
    if (!n) {
        nomem(b, call);
        return NULL;
    }
    n->kind = kind;
    n->next_owned = b->owned;
    b->owned = n;
    return n;
}

static int node_owned_by(const ebb_builder *b, const ebb_node *n) {
    for (const ebb_node *o = b->owned; o; o = o->next_owned)
        if (o == n)
            return 1;
    return 0;
}

/* Parses one attribute value against its schema type. */
static int parse_attr_value(const ebb_attr_spec *spec, const char *text, ebb_attr_value *v) {
    char *end = NULL;
    v->type = spec->type;
    v->set = 1;
    switch (spec->type) {
    case EBB_ATTR_INT: {
        errno = 0;
        long long x = strtoll(text, &end, 10);
        if (end == text || *end || errno)
            return -1;
        v->i = x;
        v->f = (double)x;
        return 0;
    }
    case EBB_ATTR_FLOAT: {
        errno = 0;
        double x = strtod(text, &end);
        if (end == text || *end || errno || !isfinite(x))
            return -1;
        v->f = x;
        return 0;
    }
    case EBB_ATTR_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "1"))
            v->i = 1;
        else if (!strcmp(text, "false") || !strcmp(text, "0"))
            v->i = 0;
        else
            return -1;
        return 0;
    case EBB_ATTR_STRING: v->s = text; return 0;
    }
    return -1;
}

static const char *attr_type_name(ebb_attr_type t) {
    switch (t) {
    case EBB_ATTR_INT: return "an integer";
    case EBB_ATTR_FLOAT: return "a number";
    case EBB_ATTR_BOOL: return "true or false";
    case EBB_ATTR_STRING: return "a string";
    }
    return "?";
}

/* Writes the schema's attribute names into known as "a, b, ...": those with
 * a default first, then the required ones, for "(known: ...)" messages. */
static void known_attrs(const ebb_op *op, char *known, size_t size) {
    known[0] = '\0';
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < op->n_attrs; i++) {
            if (!!op->attrs[i].required != pass)
                continue;
            size_t k = strlen(known);
            snprintf(known + k, size - k, "%s%s", k ? ", " : "", op->attrs[i].name);
        }
}

/* ebb_attrs_resolve(), and for ebb_node_op() the extra key `name`, which is
 * not an attribute of the op: with name_out non-NULL it is accepted, checked
 * and returned pointing into *owned. */
static ebb_status attrs_parse(const ebb_op *op, const char *text, ebb_attr_value *out,
                              char **owned, const char **name_out) {
    *owned = NULL;
    if (name_out)
        *name_out = NULL;
    for (int i = 0; i < op->n_attrs; i++) {
        const ebb_attr_spec *a = &op->attrs[i];
        memset(&out[i], 0, sizeof out[i]);
        out[i].type = a->type;
        if (a->required)
            continue;
        if (a->type == EBB_ATTR_STRING) {
            out[i].s = a->default_string;
            out[i].set = a->default_string != NULL;
        } else {
            out[i].i = (int64_t)a->default_number;
            out[i].f = a->default_number;
            out[i].set = !a->optional;
        }
    }
    ebb_status st = EBB_OK;
    char *copy = NULL;
    if (text) {
        copy = dup_str(text);
        if (!copy)
            return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", op->name);
        char *p = copy;
        int given[EBB_MAX_ATTRS] = {0};
        for (;;) {
            while (*p == ',' || isspace((unsigned char)*p))
                p++;
            if (!*p)
                break;
            char *key = p;
            while (*p && *p != '=' && *p != ',' && !isspace((unsigned char)*p))
                p++;
            if (*p != '=') {
                st = ebb_error_set(EBB_ERR_ARG,
                                   "%s: attribute '%.*s' has no value (expected key=value)",
                                   op->name, (int)(p - key), key);
                goto fail;
            }
            *p++ = '\0';
            char *val = p;
            if (*p == '"') {
                val = ++p;
                while (*p && *p != '"')
                    p++;
                if (*p != '"') {
                    st = ebb_error_set(EBB_ERR_ARG, "%s: unterminated quote in attribute '%s'",
                                       op->name, key);
                    goto fail;
                }
            } else {
                while (*p && *p != ',' && !isspace((unsigned char)*p))
                    p++;
            }
            if (*p)
                *p++ = '\0';
            if (name_out && strcmp(key, "name") == 0) {
                if (!ebb_graph_valid_node_name(val)) {
                    st = ebb_error_set(EBB_ERR_ARG, "%s: invalid node name '%s'", op->name, val);
                    goto fail;
                }
                *name_out = val;
                continue;
            }
            int ai = ebb_op_attr_index(op, key);
            if (ai < 0) {
                char known[512];
                known_attrs(op, known, sizeof known);
                if (name_out)
                    st = ebb_error_set(EBB_ERR_ARG, "%s has no attribute '%s' (known: %s%sname)",
                                       op->name, key, known, known[0] ? ", " : "");
                else if (known[0])
                    st = ebb_error_set(EBB_ERR_ARG, "%s has no attribute '%s' (known: %s)",
                                       op->name, key, known);
                else
                    st = ebb_error_set(EBB_ERR_ARG, "%s has no attribute '%s' (it takes none)",
                                       op->name, key);
                goto fail;
            }
            if (given[ai]) {
                st = ebb_error_set(EBB_ERR_ARG, "%s: attribute '%s' given twice", op->name, key);
                goto fail;
            }
            given[ai] = 1;
            if (parse_attr_value(&op->attrs[ai], val, &out[ai]) != 0) {
                st = ebb_error_set(EBB_ERR_ARG, "%s: attribute '%s' must be %s, got '%s'",
                                   op->name, key, attr_type_name(op->attrs[ai].type), val);
                goto fail;
            }
        }
    }
    for (int i = 0; i < op->n_attrs; i++)
        if (op->attrs[i].required && !out[i].set) {
            st = ebb_error_set(EBB_ERR_ARG, "%s needs attribute '%s'", op->name,
                               op->attrs[i].name);
            goto fail;
        }
    *owned = copy;
    return EBB_OK;
fail:
    free(copy);
    if (name_out)
        *name_out = NULL;
    return st;
}

ebb_status ebb_attrs_resolve(const ebb_op *op, const char *text, ebb_attr_value *out,
                             char **owned) {
    if (owned)
        *owned = NULL;
    if (!op || !out || !owned)
        return ebb_error_set(EBB_ERR_ARG, "ebb_attrs_resolve: NULL argument");
    return attrs_parse(op, text, out, owned, NULL);
}

/* A failed ebb_attrs_resolve() becomes the builder's error, under `call`. */
static void fail_attrs(ebb_builder *b, ebb_status st, const char *call) {
    if (st == EBB_ERR_NOMEM)
        nomem(b, call);
    else
        fail(b, "%s: %s", call, ebb_errmsg());
}

ebb_node *ebb_node_op(ebb_builder *b, const char *op_name, const char *attrs) {
    if (failed(b))
        return NULL;
    const ebb_op *op = ebb_op_find(op_name);
    if (!op) {
        fail(b, "ebb_node_op: unknown op '%s'", op_name ? op_name : "(null)");
        return NULL;
    }
    ebb_node *n = node_new(b, NODE_OP, "ebb_node_op");
    if (!n)
        return NULL;
    n->op = op;
    const char *name = NULL;
    ebb_status st = attrs_parse(op, attrs, n->attrs, &n->attr_text, &name);
    if (st != EBB_OK) {
        fail_attrs(b, st, "ebb_node_op");
        return NULL;
    }
    if (name && !(n->name = dup_str(name))) {
        nomem(b, "ebb_node_op");
        return NULL;
    }
    return n;
}

/* Marks a node (about to be placed in a step or container) as used. */
static int node_take(ebb_builder *b, ebb_node *n, const char *call) {
    if (failed(b))
        return -1;
    if (!n) {
        fail(b, "%s: node is NULL", call);
        return -1;
    }
    if (!node_owned_by(b, n)) {
        fail(b, "%s: the node was made by another builder", call);
        return -1;
    }
    if (n->used) {
        fail(b, "%s: the node is already used elsewhere (make a new node for each use)", call);
        return -1;
    }
    n->used = 1;
    return 0;
}

static int merge_free_tags(ebb_builder *b, name_list *into, const name_list *from) {
    for (int i = 0; i < from->n; i++)
        if (names_find(into, from->items[i]) < 0 && names_add(into, from->items[i]) != 0) {
            nomem(b, "ebb_builder");
            return -1;
        }
    return 0;
}

static void node_arity(const ebb_node *n, int *min, int *max);
static const char *node_label(const ebb_node *n);

ebb_node *ebb_node_repeat(ebb_builder *b, int times,
                          ebb_node *(*make)(ebb_builder *b, int i, void *user), void *user) {
    if (failed(b))
        return NULL;
    if (times < 1 || !make) {
        fail(b, "ebb_node_repeat: %s", !make ? "make is NULL" : "times must be at least 1");
        return NULL;
    }
    ebb_node **copies = malloc((size_t)times * sizeof *copies);
    if (!copies) {
        fail(b, "ebb_node_repeat: out of memory");
        return NULL;
    }
    int n = 0;
    while (n < times && (copies[n] = make(b, n, user)) != NULL)
        n++;
    ebb_node *seq = NULL;
    if (n < times) {
        if (!failed(b))
            fail(b, "ebb_node_repeat: make returned no node for copy %d", n);
    } else {
        seq = ebb_node_seqv(b, copies, n);
    }
    free(copies);
    return seq;
}

ebb_node *ebb_node_seqv(ebb_builder *b, ebb_node *const *nodes, int count) {
    if (failed(b))
        return NULL;
    if (count < 1 || !nodes) {
        fail(b, "ebb_node_seq: a sequence needs at least one node");
        return NULL;
    }
    for (int i = 0; i < count; i++)
        if (node_take(b, nodes[i], "ebb_node_seq") != 0)
            return NULL;
    /* only the first element can receive `using` tensors; the rest get the
     * previous element's output alone */
    for (int i = 1; i < count; i++) {
        int min = 1, max = 1;
        node_arity(nodes[i], &min, &max);
        if (min > 1 || max == 0) {
            fail(b, "ebb_node_seq: element %d (%s) takes %d input%s, but inside a sequence it "
                    "gets only the previous element's output",
                 i, node_label(nodes[i]), min, min == 1 ? "" : "s");
            return NULL;
        }
    }
    ebb_node *n = node_new(b, NODE_SEQ, "ebb_node_seq");
    if (!n)
        return NULL;
    n->children = malloc((size_t)count * sizeof *n->children);
    if (!n->children) {
        nomem(b, "ebb_node_seq");
        return NULL;
    }
    memcpy(n->children, nodes, (size_t)count * sizeof *nodes);
    n->n_children = count;
    for (int i = 0; i < count; i++)
        if (merge_free_tags(b, &n->free_tags, &nodes[i]->free_tags) != 0)
            return NULL;
    return n;
}

/* Collects a NULL-terminated va_list of nodes. Returns the count, or -1. */
static int collect_nodes(ebb_builder *b, const char *call, ebb_node *first, va_list ap,
                         ebb_node **out) {
    int n = 0;
    for (ebb_node *x = first; x; x = va_arg(ap, ebb_node *)) {
        if (n == EBB_MAX_VARARGS) {
            fail(b, "%s: more than %d nodes", call, EBB_MAX_VARARGS);
            return -1;
        }
        out[n++] = x;
    }
    return n;
}

ebb_node *ebb_node_seq(ebb_builder *b, ebb_node *first, ...) {
    ebb_node *nodes[EBB_MAX_VARARGS];
    va_list ap;
    va_start(ap, first);
    int n = collect_nodes(b, "ebb_node_seq", first, ap, nodes);
    va_end(ap);
    if (n < 0 || failed(b))
        return NULL;
    if (n == 0) {
        fail(b, "ebb_node_seq: a sequence needs at least one node (was a node NULL?)");
        return NULL;
    }
    return ebb_node_seqv(b, nodes, n);
}

ebb_node *ebb_node_graph(ebb_builder *b, const ebb_graph *g) {
    if (failed(b))
        return NULL;
    if (!g) {
        fail(b, "ebb_node_graph: graph is NULL");
        return NULL;
    }
    if (g->free_tags.n > 0) {
        fail(b, "ebb_node_graph: graph '%s' reads tag '%s' it does not define (use the sub-flow "
                "node from ebb_subflow_end instead)",
             g->name, g->free_tags.items[0]);
        return NULL;
    }
    ebb_node *n = node_new(b, NODE_GRAPH, "ebb_node_graph");
    if (!n)
        return NULL;
    n->graph = ebb_graph_ref(g);
    return n;
}

ebb_node *ebb_node_name(ebb_builder *b, ebb_node *n, const char *name) {
    if (failed(b))
        return NULL;
    if (!n) {
        fail(b, "ebb_node_name: node is NULL");
        return NULL;
    }
    if (!ebb_graph_valid_node_name(name)) {
        fail(b, "ebb_node_name: invalid name '%s'", name ? name : "(null)");
        return NULL;
    }
    char *d = dup_str(name);
    if (!d) {
        nomem(b, "ebb_node_name");
        return NULL;
    }
    free(n->name);
    n->name = d;
    return n;
}

ebb_node *ebb_node_precision(ebb_builder *b, ebb_node *n, ebb_precision p) {
    if (failed(b))
        return NULL;
    if (!n) {
        fail(b, "ebb_node_precision: node is NULL");
        return NULL;
    }
    if ((unsigned)p > EBB_PRECISION_FP16) {
        fail(b, "ebb_node_precision: precision %d is not an ebb_precision", (int)p);
        return NULL;
    }
    n->precision = p;
    return n;
}

static int node_has_precision(const ebb_node *n) {
    if (!n)
        return 0;
    if (n->precision != EBB_PRECISION_DEFAULT)
        return 1;
    for (int i = 0; i < n->n_children; i++)
        if (node_has_precision(n->children[i]))
            return 1;
    return n->graph && ebb_graph_has_precision(n->graph);
}

int ebb_graph_has_precision(const ebb_graph *g) {
    for (int i = 0; i < g->n_steps; i++) {
        const graph_step *st = &g->steps[i];
        if (node_has_precision(st->node) || node_has_precision(st->aux))
            return 1;
        /* a merge's n_nodes counts the streams it joins, with no nodes */
        for (int j = 0; st->nodes && j < st->n_nodes; j++)
            if (node_has_precision(st->nodes[j]))
                return 1;
    }
    return 0;
}

ebb_node *ebb_node_share(ebb_builder *b, ebb_node *n, const char *param, const char *source) {
    if (failed(b))
        return NULL;
    if (!n || n->kind != NODE_OP) {
        fail(b, "ebb_node_share: %s", n ? "only an op node has parameters to share" : "node is NULL");
        return NULL;
    }
    if (!ebb_graph_valid_node_name(param)) {
        fail(b, "ebb_node_share: invalid parameter name '%s'", param ? param : "(null)");
        return NULL;
    }
    if (!ebb_graph_valid_node_name(source)) {
        fail(b, "ebb_node_share: invalid source parameter name '%s'", source ? source : "(null)");
        return NULL;
    }
    if (names_find(&n->share_param, param) >= 0) {
        fail(b, "ebb_node_share: %s's parameter '%s' is already shared", n->op->name, param);
        return NULL;
    }
    if (names_add(&n->share_param, param) != 0 || names_add(&n->share_source, source) != 0) {
        nomem(b, "ebb_node_share");
        return NULL;
    }
    return n;
}

/* How many inputs the node accepts, as [min, max] (max -1: unbounded). */
static void node_arity(const ebb_node *n, int *min, int *max) {
    switch (n->kind) {
    case NODE_OP:
        *min = n->op->min_inputs;
        *max = n->op->max_inputs;
        return;
    case NODE_SEQ: node_arity(n->children[0], min, max); return;
    case NODE_GRAPH:
        *min = *max = n->graph->inputs.n;
        return;
    case NODE_SUBFLOW: *min = *max = 1; return;
    }
}

static const char *node_label(const ebb_node *n) {
    switch (n->kind) {
    case NODE_OP: return n->op->name;
    case NODE_SEQ: return "sequence";
    case NODE_GRAPH: return n->graph->name;
    case NODE_SUBFLOW: return "sub-flow";
    }
    return "?";
}

/* Checks that the node takes `inputs` inputs and that the tags it reads from
 * the enclosing flow exist here (or, in a sub-flow, further out). */
static int node_check_use(ebb_builder *b, const ebb_node *n, int inputs, const char *call) {
    int min = 1, max = 1;
    node_arity(n, &min, &max);
    if (inputs < min || (max >= 0 && inputs > max)) {
        if (min == max)
            fail(b, "%s: %s takes %d input%s, given %d", call, node_label(n), min,
                 min == 1 ? "" : "s", inputs);
        else if (max < 0)
            fail(b, "%s: %s takes at least %d inputs, given %d", call, node_label(n), min, inputs);
        else
            fail(b, "%s: %s takes %d to %d inputs, given %d", call, node_label(n), min, max, inputs);
        return -1;
    }
    for (int i = 0; i < n->free_tags.n; i++) {
        const char *t = n->free_tags.items[i];
        if (names_find(&b->tags, t) >= 0)
            continue;
        if (b->parent) {
            if (names_find(&b->free_tags, t) < 0 && names_add(&b->free_tags, t) != 0) {
                nomem(b, call);
                return -1;
            }
            continue;
        }
        fail(b, "%s: undefined tag '%s'", call, t);
        return -1;
    }
    return 0;
}

/* ---- steps ---------------------------------------------------------------- */

static graph_step *step_add(ebb_builder *b, step_kind kind, const char *call) {
    if (b->n_steps == b->cap_steps) {
        int cap = b->cap_steps ? b->cap_steps * 2 : 8;
        graph_step *s = realloc(b->steps, (size_t)cap * sizeof *s);
        if (!s) {
            nomem(b, call);
            return NULL;
        }
        b->steps = s;
        b->cap_steps = cap;
    }
    graph_step *s = &b->steps[b->n_steps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return s;
}

/* Every step but from/through must not have a `using` waiting. */
static int no_pending_using(ebb_builder *b, const char *call) {
    if (b->has_pending_using) {
        fail(b, "%s: ebb_using applies to the next from/through, not to %s", call, call + 4);
        return -1;
    }
    return 0;
}

static int need_one_stream(ebb_builder *b, const char *call) {
    if (!b->started) {
        fail(b, "%s: the flow has not started (call ebb_from first)", call);
        return -1;
    }
    if (b->open != 1) {
        fail(b, "%s: %d open streams; merge them first", call, b->open);
        return -1;
    }
    return 0;
}

void ebb_input(ebb_builder *b, const char *name) {
    if (failed(b))
        return;
    if (b->parent) {
        fail(b, "ebb_input: a sub-flow's only input is the stream");
        return;
    }
    if (b->started) {
        fail(b, "ebb_input: inputs must be declared before ebb_from");
        return;
    }
    if (!valid_name(name)) {
        fail(b, "ebb_input: invalid input name '%s'", name ? name : "(null)");
        return;
    }
    if (names_find(&b->inputs, name) >= 0) {
        fail(b, "ebb_input: duplicate input '%s'", name);
        return;
    }
    if (names_find(&b->targets, name) >= 0) {
        fail(b, "ebb_input: '%s' is already a target", name);
        return;
    }
    if (names_add(&b->inputs, name) != 0 || names_add(&b->tags, name) != 0)
        nomem(b, "ebb_input");
}

void ebb_target(ebb_builder *b, const char *name) {
    if (failed(b))
        return;
    if (b->parent) {
        fail(b, "ebb_target: a sub-flow cannot declare targets (only the top-level flow has a "
                "loss)");
        return;
    }
    if (!valid_name(name)) {
        fail(b, "ebb_target: invalid target name '%s'", name ? name : "(null)");
        return;
    }
    if (names_find(&b->targets, name) >= 0) {
        fail(b, "ebb_target: duplicate target '%s'", name);
        return;
    }
    if (names_find(&b->inputs, name) >= 0) {
        fail(b, "ebb_target: '%s' is already an input", name);
        return;
    }
    if (names_find(&b->tags, name) >= 0) {
        fail(b, "ebb_target: '%s' is already a tag", name);
        return;
    }
    if (names_add(&b->targets, name) != 0)
        nomem(b, "ebb_target");
}

void ebb_loss(ebb_builder *b, const char *op_name, const char *attrs) {
    if (failed(b))
        return;
    if (b->parent) {
        fail(b, "ebb_loss: a sub-flow cannot declare a loss (only the top-level flow has one)");
        return;
    }
    if (b->loss) {
        fail(b, "ebb_loss: the graph already has a loss (%s)", b->loss->name);
        return;
    }
    const ebb_op *op = ebb_op_find(op_name);
    if (!op) {
        fail(b, "ebb_loss: unknown op '%s'", op_name ? op_name : "(null)");
        return;
    }
    ebb_status st = ebb_attrs_resolve(op, attrs, b->loss_attrs, &b->loss_attr_text);
    if (st != EBB_OK) {
        fail_attrs(b, st, "ebb_loss");
        return;
    }
    b->loss = op;
}

void ebb_output(ebb_builder *b, const char *tag) {
    if (failed(b))
        return;
    if (b->parent) {
        fail(b, "ebb_output: a sub-flow has one output, its final stream");
        return;
    }
    if (!valid_name(tag)) {
        fail(b, "ebb_output: invalid tag name '%s'", tag ? tag : "(null)");
        return;
    }
    if (names_find(&b->outputs, tag) >= 0) {
        fail(b, "ebb_output: tag '%s' is already an output", tag);
        return;
    }
    if (names_add(&b->outputs, tag) != 0)
        nomem(b, "ebb_output");
}

void ebb_output_final(ebb_builder *b, const char *name) {
    if (failed(b))
        return;
    if (!valid_name(name)) {
        fail(b, "ebb_output_final: invalid output name '%s'", name ? name : "(null)");
        return;
    }
    free(b->final_name);
    b->final_name = dup_str(name);
    if (!b->final_name)
        nomem(b, "ebb_output_final");
}

/* Moves the pending `using` list into the step. */
static void step_take_using(ebb_builder *b, graph_step *s) {
    s->using_tags = b->pending_using;
    memset(&b->pending_using, 0, sizeof b->pending_using);
    b->has_pending_using = 0;
}

void ebb_from(ebb_builder *b, ebb_node *n) {
    if (failed(b))
        return;
    if (b->parent) {
        fail(b, "ebb_from: a sub-flow starts from the stream it is applied to; use ebb_through");
        return;
    }
    if (b->started) {
        fail(b, "ebb_from: the flow has already started");
        return;
    }
    if (b->inputs.n == 0 && (names_add(&b->inputs, "x") != 0 || names_add(&b->tags, "x") != 0)) {
        nomem(b, "ebb_from");
        return;
    }
    if (node_take(b, n, "ebb_from") != 0 ||
        node_check_use(b, n, 1 + b->pending_using.n, "ebb_from") != 0)
        return;
    graph_step *s = step_add(b, STEP_FROM, "ebb_from");
    if (!s)
        return;
    s->node = n;
    step_take_using(b, s);
    b->started = 1;
    b->open = 1;
}

void ebb_through(ebb_builder *b, ebb_node *n) {
    if (failed(b) || need_one_stream(b, "ebb_through") != 0)
        return;
    if (node_take(b, n, "ebb_through") != 0 ||
        node_check_use(b, n, 1 + b->pending_using.n, "ebb_through") != 0)
        return;
    graph_step *s = step_add(b, STEP_THROUGH, "ebb_through");
    if (!s)
        return;
    s->node = n;
    step_take_using(b, s);
}

void ebb_also(ebb_builder *b, ebb_node *n) {
    if (failed(b) || no_pending_using(b, "ebb_also") != 0 || need_one_stream(b, "ebb_also") != 0)
        return;
    if (node_take(b, n, "ebb_also") != 0 || node_check_use(b, n, 1, "ebb_also") != 0)
        return;
    graph_step *s = step_add(b, STEP_ALSO, "ebb_also");
    if (s)
        s->node = n;
}

/* Takes k nodes for a multi-branch step; each must accept the stream alone. */
static ebb_node **take_branches(ebb_builder *b, ebb_node *const *nodes, int n, int min,
                                const char *call, const char *what) {
    if (!nodes || n < min) {
        fail(b, "%s: needs at least %d %s, given %d", call, min, what, nodes ? n : 0);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (node_take(b, nodes[i], call) != 0 || node_check_use(b, nodes[i], 1, call) != 0)
            return NULL;
    ebb_node **copy = malloc((size_t)n * sizeof *copy);
    if (!copy) {
        nomem(b, call);
        return NULL;
    }
    memcpy(copy, nodes, (size_t)n * sizeof *nodes);
    return copy;
}

void ebb_splitv(ebb_builder *b, ebb_node *const *nodes, int n) {
    if (failed(b) || no_pending_using(b, "ebb_split") != 0 || need_one_stream(b, "ebb_split") != 0)
        return;
    ebb_node **copy = take_branches(b, nodes, n, 2, "ebb_split", "branches");
    if (!copy)
        return;
    graph_step *s = step_add(b, STEP_SPLIT, "ebb_split");
    if (!s) {
        free(copy);
        return;
    }
    s->nodes = copy;
    s->n_nodes = n;
    b->open = n;
}

void ebb_split(ebb_builder *b, ebb_node *first, ...) {
    ebb_node *nodes[EBB_MAX_VARARGS];
    va_list ap;
    va_start(ap, first);
    int n = collect_nodes(b, "ebb_split", first, ap, nodes);
    va_end(ap);
    if (n >= 0)
        ebb_splitv(b, nodes, n);
}

void ebb_merge(ebb_builder *b, ebb_merge_op op, int64_t dim) {
    if (failed(b) || no_pending_using(b, "ebb_merge") != 0)
        return;
    if (!b->started) {
        fail(b, "ebb_merge: the flow has not started");
        return;
    }
    if (b->open < 2) {
        fail(b, "ebb_merge: only 1 open stream");
        return;
    }
    if ((int)op < EBB_MERGE_ADD || op > EBB_MERGE_STACK) {
        fail(b, "ebb_merge: unknown merge op %d", (int)op);
        return;
    }
    graph_step *s = step_add(b, STEP_MERGE, "ebb_merge");
    if (!s)
        return;
    s->merge = op;
    s->dim = dim;
    s->n_nodes = b->open;
    b->open = 1;
}

void ebb_merge_node(ebb_builder *b, ebb_node *n) {
    if (failed(b) || no_pending_using(b, "ebb_merge_node") != 0)
        return;
    if (!b->started) {
        fail(b, "ebb_merge_node: the flow has not started");
        return;
    }
    if (b->open < 2) {
        fail(b, "ebb_merge_node: only 1 open stream");
        return;
    }
    if (node_take(b, n, "ebb_merge_node") != 0 ||
        node_check_use(b, n, b->open, "ebb_merge_node") != 0)
        return;
    graph_step *s = step_add(b, STEP_MERGE, "ebb_merge_node");
    if (!s)
        return;
    s->node = n;
    s->n_nodes = b->open;
    b->open = 1;
}

void ebb_gatev(ebb_builder *b, ebb_node *router, int top_k, ebb_node *const *experts, int n) {
    if (failed(b) || no_pending_using(b, "ebb_gate") != 0 || need_one_stream(b, "ebb_gate") != 0)
        return;
    if (node_take(b, router, "ebb_gate") != 0 || node_check_use(b, router, 1, "ebb_gate") != 0)
        return;
    ebb_node **copy = take_branches(b, experts, n, 2, "ebb_gate", "experts");
    if (!copy)
        return;
    if (top_k < 0 || top_k > n) {
        fail(b, "ebb_gate: top_k=%d with %d experts (expected 0 for dense, or 1..%d)", top_k, n, n);
        free(copy);
        return;
    }
    graph_step *s = step_add(b, STEP_GATE, "ebb_gate");
    if (!s) {
        free(copy);
        return;
    }
    s->aux = router;
    s->nodes = copy;
    s->n_nodes = n;
    s->top_k = top_k;
}

void ebb_gate(ebb_builder *b, ebb_node *router, int top_k, ebb_node *first, ...) {
    ebb_node *nodes[EBB_MAX_VARARGS];
    va_list ap;
    va_start(ap, first);
    int n = collect_nodes(b, "ebb_gate", first, ap, nodes);
    va_end(ap);
    if (n >= 0)
        ebb_gatev(b, router, top_k, nodes, n);
}

void ebb_switchv(ebb_builder *b, ebb_node *selector, ebb_node *const *branches, int n) {
    if (failed(b) || no_pending_using(b, "ebb_switch") != 0 ||
        need_one_stream(b, "ebb_switch") != 0)
        return;
    if (node_take(b, selector, "ebb_switch") != 0 ||
        node_check_use(b, selector, 1, "ebb_switch") != 0)
        return;
    ebb_node **copy = take_branches(b, branches, n, 2, "ebb_switch", "branches");
    if (!copy)
        return;
    graph_step *s = step_add(b, STEP_SWITCH, "ebb_switch");
    if (!s) {
        free(copy);
        return;
    }
    s->aux = selector;
    s->nodes = copy;
    s->n_nodes = n;
}

void ebb_switch(ebb_builder *b, ebb_node *selector, ebb_node *first, ...) {
    ebb_node *nodes[EBB_MAX_VARARGS];
    va_list ap;
    va_start(ap, first);
    int n = collect_nodes(b, "ebb_switch", first, ap, nodes);
    va_end(ap);
    if (n >= 0)
        ebb_switchv(b, selector, nodes, n);
}

static void loop_add(ebb_builder *b, const char *call, ebb_node *body, ebb_node *cond,
                     loop_kind kind, int64_t count) {
    if (failed(b) || no_pending_using(b, call) != 0 || need_one_stream(b, call) != 0)
        return;
    if (count < 0) {
        fail(b, "%s: %s must be >= 0, got %lld", call, kind == LOOP_FOR ? "times" : "max",
             (long long)count);
        return;
    }
    if (node_take(b, body, call) != 0 || node_check_use(b, body, 1, call) != 0)
        return;
    if (kind != LOOP_FOR &&
        (node_take(b, cond, call) != 0 || node_check_use(b, cond, 1, call) != 0))
        return;
    graph_step *s = step_add(b, STEP_LOOP, call);
    if (!s)
        return;
    s->node = body;
    s->aux = kind == LOOP_FOR ? NULL : cond;
    s->loop = kind;
    s->count = count;
}

void ebb_loop_for(ebb_builder *b, ebb_node *body, int64_t times) {
    loop_add(b, "ebb_loop_for", body, NULL, LOOP_FOR, times);
}

void ebb_loop_while(ebb_builder *b, ebb_node *body, ebb_node *cond, int64_t max) {
    loop_add(b, "ebb_loop_while", body, cond, LOOP_WHILE, max);
}

void ebb_loop_until(ebb_builder *b, ebb_node *body, ebb_node *cond, int64_t max) {
    loop_add(b, "ebb_loop_until", body, cond, LOOP_UNTIL, max);
}

void ebb_tag(ebb_builder *b, const char *name) {
    if (failed(b) || no_pending_using(b, "ebb_tag") != 0 || need_one_stream(b, "ebb_tag") != 0)
        return;
    if (!valid_name(name)) {
        fail(b, "ebb_tag: invalid tag name '%s'", name ? name : "(null)");
        return;
    }
    if (names_find(&b->tags, name) >= 0) {
        fail(b, "ebb_tag: duplicate tag '%s'", name);
        return;
    }
    if (names_find(&b->targets, name) >= 0) {
        fail(b, "ebb_tag: '%s' is already a target", name);
        return;
    }
    graph_step *s = step_add(b, STEP_TAG, "ebb_tag");
    if (!s)
        return;
    s->tag = dup_str(name);
    if (!s->tag || names_add(&b->tags, name) != 0)
        nomem(b, "ebb_tag");
}

void ebb_usingv(ebb_builder *b, const char *const *names, int n) {
    if (failed(b))
        return;
    if (b->has_pending_using) {
        fail(b, "ebb_using: called twice before a from/through");
        return;
    }
    if (!names || n < 1) {
        fail(b, "ebb_using: needs at least one tag");
        return;
    }
    for (int i = 0; i < n; i++) {
        const char *t = names[i];
        if (!valid_name(t)) {
            fail(b, "ebb_using: invalid tag name '%s'", t ? t : "(null)");
            return;
        }
        if (names_find(&b->tags, t) < 0) {
            if (names_find(&b->targets, t) >= 0) {
                fail(b, "ebb_using: '%s' is a target, which only the loss reads", t);
                return;
            }
            if (!b->parent) {
                fail(b, "ebb_using: undefined tag '%s'", t);
                return;
            }
            /* a sub-flow may read the enclosing flow's tags */
            if (names_find(&b->free_tags, t) < 0 && names_add(&b->free_tags, t) != 0) {
                nomem(b, "ebb_using");
                return;
            }
        }
        if (names_add(&b->pending_using, t) != 0) {
            nomem(b, "ebb_using");
            return;
        }
    }
    b->has_pending_using = 1;
}

void ebb_using(ebb_builder *b, const char *first, ...) {
    const char *names[EBB_MAX_VARARGS];
    int n = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *t = first; t; t = va_arg(ap, const char *)) {
        if (n == EBB_MAX_VARARGS) {
            va_end(ap);
            fail(b, "ebb_using: more than %d tags", EBB_MAX_VARARGS);
            return;
        }
        names[n++] = t;
    }
    va_end(ap);
    ebb_usingv(b, names, n);
}

/* ---- build ---------------------------------------------------------------- */

ebb_graph *ebb_build(ebb_builder *b) {
    if (!b) {
        ebb_error_set(EBB_ERR_ARG, "ebb_build: builder is NULL");
        return NULL;
    }
    if (b->status == EBB_OK) {
        if (b->has_pending_using)
            fail(b, "ebb_build: ebb_using was not followed by a from/through");
        else if (!b->started && !b->parent)
            fail(b, "ebb_build: the flow is empty (no ebb_from)");
        else if (b->open != 1)
            fail(b, "ebb_build: %d open streams left at the end; merge them", b->open);
        for (int i = 0; b->status == EBB_OK && i < b->outputs.n; i++)
            if (names_find(&b->tags, b->outputs.items[i]) < 0)
                fail(b, "ebb_build: output '%s' is not a tag of the flow", b->outputs.items[i]);
        /* the loss reads the final stream, then the targets in order */
        if (b->status == EBB_OK && b->loss) {
            int n = 1 + b->targets.n, min = b->loss->min_inputs, max = b->loss->max_inputs;
            char want[64];
            ebb_inputs_wanted(min, max, want, sizeof want);
            if (n < min || (max >= 0 && n > max))
                fail(b, "ebb_build: loss %s takes %s (the final stream, then the targets), but "
                        "the graph declares %d target%s",
                     b->loss->name, want, b->targets.n, b->targets.n == 1 ? "" : "s");
        }
    }
    if (b->status != EBB_OK) {
        ebb_error_set(b->status, "%s", b->err);
        return NULL;
    }
    ebb_graph *g = calloc(1, sizeof *g);
    if (!g) {
        nomem(b, "ebb_build");
        return NULL;
    }
    atomic_init(&g->refs, 1);
    g->name = b->name;
    b->name = NULL;
    g->inputs = b->inputs;
    memset(&b->inputs, 0, sizeof b->inputs);
    g->final_name = b->final_name ? b->final_name : dup_str("y");
    b->final_name = NULL;
    g->outputs = b->outputs;
    memset(&b->outputs, 0, sizeof b->outputs);
    g->steps = b->steps;
    g->n_steps = b->n_steps;
    b->steps = NULL;
    b->n_steps = b->cap_steps = 0;
    g->is_subflow = b->parent != NULL;
    g->free_tags = b->free_tags;
    memset(&b->free_tags, 0, sizeof b->free_tags);
    g->targets = b->targets;
    memset(&b->targets, 0, sizeof b->targets);
    g->loss = b->loss;
    memcpy(g->loss_attrs, b->loss_attrs, sizeof g->loss_attrs);
    g->loss_attr_text = b->loss_attr_text;
    b->loss_attr_text = NULL;
    b->loss = NULL;
    g->owned = b->owned;
    b->owned = NULL;
    /* what remains is the consumed builder: make further calls fail clearly */
    b->status = EBB_ERR_BUILD;
    snprintf(b->err, sizeof b->err, "ebb_build: this builder has already been built");
    if (!g->final_name || !g->name) {
        ebb_graph_free(g);
        ebb_error_set(EBB_ERR_NOMEM, "ebb_build: out of memory");
        return NULL;
    }
    return g;
}

/* ---- sub-flows ------------------------------------------------------------- */

ebb_builder *ebb_subflow_begin(ebb_builder *parent) {
    if (!parent)
        return NULL;
    ebb_builder *s = ebb_builder_new("subflow");
    if (!s) {
        nomem(parent, "ebb_subflow_begin");
        return NULL;
    }
    s->parent = parent;
    if (failed(parent)) {
        s->status = parent->status;
        snprintf(s->err, sizeof s->err, "%s", parent->err);
        return s;
    }
    s->started = 1;
    s->open = 1;
    if (names_add(&s->inputs, "_stream") != 0)
        nomem(s, "ebb_subflow_begin");
    return s;
}

ebb_node *ebb_subflow_end(ebb_builder *sub) {
    if (!sub)
        return NULL;
    ebb_builder *parent = sub->parent;
    if (!parent) {
        fail(sub, "ebb_subflow_end: not a sub-flow builder");
        return NULL;
    }
    ebb_node *n = NULL;
    if (!failed(parent)) {
        ebb_graph *g = ebb_build(sub);
        if (!g) {
            parent->status = sub->status;
            snprintf(parent->err, sizeof parent->err, "%s", sub->err);
            ebb_error_set(parent->status, "%s", parent->err);
        } else {
            n = node_new(parent, NODE_SUBFLOW, "ebb_subflow_end");
            if (!n) {
                ebb_graph_free(g);
            } else {
                n->graph = g;
                if (merge_free_tags(parent, &n->free_tags, &g->free_tags) != 0)
                    n = NULL;
            }
        }
    }
    ebb_builder_free(sub);
    return n;
}

/* ---- graphs ---------------------------------------------------------------- */

ebb_graph *ebb_graph_ref(const ebb_graph *g) {
    ebb_graph *mg = (ebb_graph *)g; /* the count is the one field a reference changes */
    atomic_fetch_add(&mg->refs, 1);
    return mg;
}

void ebb_graph_free(ebb_graph *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    free(g->name);
    names_free(&g->inputs);
    free(g->final_name);
    names_free(&g->outputs);
    steps_free(g->steps, g->n_steps);
    names_free(&g->free_tags);
    names_free(&g->targets);
    free(g->loss_attr_text);
    nodes_free(g->owned);
    free(g);
}

const char *ebb_graph_name(const ebb_graph *g) { return g ? g->name : NULL; }
int ebb_graph_input_count(const ebb_graph *g) { return g ? g->inputs.n : 0; }
const char *ebb_graph_input_name(const ebb_graph *g, int i) {
    return g && i >= 0 && i < g->inputs.n ? g->inputs.items[i] : NULL;
}
int ebb_graph_output_count(const ebb_graph *g) { return g ? 1 + g->outputs.n : 0; }
const char *ebb_graph_output_name(const ebb_graph *g, int i) {
    if (!g || i < 0 || i > g->outputs.n)
        return NULL;
    return i == 0 ? g->final_name : g->outputs.items[i - 1];
}
int ebb_graph_target_count(const ebb_graph *g) { return g ? g->targets.n : 0; }
const char *ebb_graph_target_name(const ebb_graph *g, int i) {
    return g && i >= 0 && i < g->targets.n ? g->targets.items[i] : NULL;
}
const char *ebb_graph_loss(const ebb_graph *g) { return g && g->loss ? g->loss->name : NULL; }
int ebb_graph_step_count(const ebb_graph *g) { return g ? g->n_steps : 0; }
