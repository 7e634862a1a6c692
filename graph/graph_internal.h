/* The graph IR shared by the builder and the compiler. A graph is the flow as
 * the user declared it: steps over nodes, with attributes resolved and every
 * structural rule already checked. It holds no tensors. */
#ifndef EBB_GRAPH_INTERNAL_H
#define EBB_GRAPH_INTERNAL_H

#include <stdatomic.h>

#include "ebb/graph.h"

typedef enum node_kind {
    NODE_OP,      /* a registered op with attributes */
    NODE_SEQ,     /* children applied in order */
    NODE_GRAPH,   /* a built graph, closed: it sees only its own inputs */
    NODE_SUBFLOW, /* an inline sub-flow: may read tags of the enclosing flow */
} node_kind;

typedef struct name_list {
    char **items;
    int n, cap;
} name_list;

struct ebb_node {
    node_kind kind;
    char *name; /* explicit name, or NULL: the node path is used */
    const ebb_op *op;
    ebb_attr_value attrs[EBB_MAX_ATTRS];
    char *attr_text; /* owns the STRING attribute values */
    ebb_node **children;
    int n_children;
    ebb_graph *graph; /* NODE_GRAPH: a reference; NODE_SUBFLOW: owned */
    name_list free_tags; /* tags read but not defined inside (sub-flows) */
    /* weight tying (ebb_node_share): share_param[i] of this op node is the
     * parameter named share_source[i], made by an earlier node */
    name_list share_param, share_source;
    int used;
    ebb_precision precision; /* ebb_node_precision(); DEFAULT: the plan's */
    ebb_node *next_owned; /* the owning builder's or graph's list */
};

typedef enum step_kind {
    STEP_FROM,
    STEP_THROUGH,
    STEP_ALSO,
    STEP_SPLIT,
    STEP_MERGE,
    STEP_GATE,
    STEP_SWITCH,
    STEP_LOOP,
    STEP_TAG,
} step_kind;

typedef enum loop_kind { LOOP_FOR, LOOP_WHILE, LOOP_UNTIL } loop_kind;

typedef struct graph_step {
    step_kind kind;
    ebb_node *node;   /* from, through, also, loop body */
    ebb_node **nodes; /* split branches, gate experts, switch branches */
    int n_nodes;
    ebb_node *aux;    /* gate router, switch selector, loop condition */
    int top_k;
    ebb_merge_op merge; /* when `node` is NULL; else merge by that node */
    int64_t dim;
    loop_kind loop;
    int64_t count; /* for: iterations; while/until: max */
    char *tag;     /* tag name */
    name_list using_tags;
} graph_step;

struct ebb_graph {
    atomic_int refs;
    char *name;
    name_list inputs;
    char *final_name;  /* name of the final stream's output */
    name_list outputs; /* extra outputs: tags */
    name_list targets; /* training targets (ebb_target), bound after the inputs */
    const ebb_op *loss; /* the declared loss (ebb_loss), or NULL */
    ebb_attr_value loss_attrs[EBB_MAX_ATTRS]; /* resolved, schema order */
    char *loss_attr_text; /* owns the loss's STRING attribute values */
    graph_step *steps;
    int n_steps;
    int is_subflow;
    name_list free_tags;
    ebb_node *owned; /* every node of this graph */
};

/* Takes a reference to g, released by ebb_graph_free(): a graph is never
 * changed once built, so whoever holds one may share it. */
ebb_graph *ebb_graph_ref(const ebb_graph *g);

/* An op's input count as a message wants it: "1 input", "at least 2
 * inputs", "2 to 3 inputs" (max < 0: no upper bound). */
void ebb_inputs_wanted(int min, int max, char *buf, size_t size);

const char *ebb_graph_step_kind_name(step_kind k);
/* Resolves "key=value, ..." attribute text (NULL: none) against op's schema
 * into out[0..op->n_attrs), defaults filled, as ebb_node_op() does. STRING
 * values point into *owned (a copy of the text the caller frees; NULL when
 * there is none). On error returns a status with ebb_error_set() naming the
 * op and the attribute, *owned NULL. (graph/builder.c) */
ebb_status ebb_attrs_resolve(const ebb_op *op, const char *text, ebb_attr_value *out, char **owned);
/* The rule for node names: letters, digits, '_', '-' and inner dots, not
 * starting with a digit (the builder's, and the YAML loader's). */
int ebb_graph_valid_node_name(const char *s);
/* Non-zero when a node of g, or of a graph nested in it, overrides the
 * plan's precision (ebb_node_precision). */
int ebb_graph_has_precision(const ebb_graph *g);

#endif
