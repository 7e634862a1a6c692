/* Shared by the spec loader's files (graph/spec*.c), by level:
 *
 *   spec.c         the public API and the top level of a spec (params,
 *                  inputs, targets, blocks, the main flow);
 *   spec_nodes.c   the steps of a flow and the nodes they make;
 *   spec_expr.c    integer expressions over params, and typed values;
 *   spec_loader.c  the loader's state: errors at a YAML node, suggestions,
 *                  names and scalars, locations, tags in scope;
 *   spec_yaml.c    the YAML tree (spec_yaml.h).
 *
 * Each calls only the files below it. The functions here are the
 * library's own (hidden, as everything not EBB_API). */
#ifndef EBB_SPEC_LOADER_H
#define EBB_SPEC_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "graph_internal.h"
#include "spec_yaml.h"

#define ERR_MAX 2048

/* An input or a target: its name, shape and, if the spec says, dtype. */
typedef struct spec_input {
    const char *name;
    const ynode *at; /* its key in the file */
    int ndim;
    int64_t dim[EBB_MAX_DIMS];   /* -1: symbolic */
    const char *sym[EBB_MAX_DIMS];
    int has_dtype;
    ebb_dtype dtype;
} spec_input;

/* ---- the loaded spec ---------------------------------------------------- */


typedef struct spec_param {
    const char *name;
    double value;
    int64_t ivalue; /* exact, when is_int */
    int is_int;
    const ynode *at;
} spec_param;

typedef struct spec_loc {
    const char *path; /* graph node path, or an explicit node name */
    int line, col;
    const char *key;  /* key path in the file */
    const char *note; /* "in block 'ffn', used at flow[2].also", or NULL */
} spec_loc;

struct ebb_spec {
    arena mem; /* every string below */
    const char *file;
    const char *name;
    ebb_graph *graph;
    spec_input *inputs;
    int n_inputs;
    spec_input *targets;
    int n_targets;
    spec_param *params;
    int n_params;
    spec_loc *locs;
    int n_locs, cap_locs;
    int loss_loc; /* the loc of the loss step ("loss"), or -1 */
    ebb_precision precision; /* `precision:`, else EBB_PRECISION_DEFAULT */
};

/* ---- loader state ----------------------------------------------------------- */

typedef struct strbuf {
    char *s;
    size_t len, cap;
    int oom;
} strbuf;

typedef struct tagdef {
    const char *name;
    const ynode *at;
} tagdef;

/* The tags visible in one flow; sub-flows chain to the flow they sit in. */
typedef struct scope {
    const struct scope *parent;
    tagdef *tags;
    int n, cap;
} scope;

typedef struct used_name {
    const char *name;
    const ynode *at;
} used_name;

typedef struct block_use {
    const char *name;
    const char *used_at; /* key path of the use */
} block_use;

typedef struct loader {
    ebb_spec *spec;
    const char *file;
    int failed;
    char err[ERR_MAX];
    strbuf kp; /* key path of the YAML node being read: flow[4].gate.experts[2] */
    strbuf np; /* graph path of the node being made: flow.4.gate.2 */
    const ynode *blocks; /* the blocks map, or NULL */
    int *block_used;
    block_use stack[EBB_SPEC_MAX_NESTING + 1];
    int n_stack;  /* blocks being expanded, innermost last */
    int nesting;  /* sub-flows being built */
    long made;    /* graph nodes and steps made so far */
    used_name *names;
    int n_names, cap_names;
    char desc[96];
    const char *const *overrides; /* "name=number" from the caller */
    int n_overrides;
    int override_used[EBB_SPEC_MAX_OVERRIDES];
    int64_t copy; /* the innermost repeat's copy index, -1 outside a repeat */
    int merging;  /* while making a merge's node: the open streams it joins, else 0 */
} loader;

/* ---- suggestions ---------------------------------------------------------------- */

typedef struct suggest {
    const char *word;
    const char *best;
    int dist;
} suggest;

/* A plain scalar that reads as a number: decimal only, so that YAML 1.1's
 * octal (010), sexagesimal (1:30) and underscores (1_000) cannot mislead. */
typedef enum { NUM_NONE, NUM_INT, NUM_FLOAT } num_form;

typedef struct expr {
    loader *ld;
    const ynode *at;   /* the scalar, for positions */
    const char *what;  /* "attribute 'out' of linear", for syntax errors */
    const char *p;     /* the next character */
    int depth;
} expr;

/* A number read from the file: exact when is_int. */
typedef struct number {
    int is_int;
    int64_t i;
    double f;
} number;

/* What an op node carries beside its attributes: its `name`, and the
 * parameters it ties to others' (`share: {weight: SOURCE}`). */
typedef struct op_extras {
    const char *name;
    const ynode *name_at;
    ebb_precision precision; /* `precision:`, the node's own (ebb_node_precision) */
    int n_share;
    const char *share_param[EBB_MAX_PARAMS];
    const char *share_source[EBB_MAX_PARAMS];
    const ynode *share_at[EBB_MAX_PARAMS];
} op_extras;

/* ---- spec_loader.c ---- */

void ebb_load_sb_printf(strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

int ebb_load_fail_at(loader *ld, const ynode *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

size_t ebb_load_sb_mark(const strbuf *b);

void ebb_load_sb_reset(strbuf *b, size_t mark);

const char *ebb_load_sb_str(const strbuf *b);

int ebb_load_nomem(loader *ld, const ynode *at);

/* What a YAML node is, for "expected X, got Y" messages: the scalar itself
 * when there is one. Uses the loader's buffer: one per message. */
const char *ebb_load_describe(loader *ld, const ynode *y);

void ebb_load_suggest_try(suggest *s, const char *cand);

/* "; did you mean 'x'?" or "" (static storage per call site is fine: used
 * immediately in one ebb_load_fail_at). */
const char *ebb_load_suggest_text(const suggest *s, char *buf, size_t size, const char *prefix);

void ebb_load_suggest_ops(suggest *s);

void ebb_load_suggest_blocks(loader *ld, suggest *s);

int ebb_load_is_ident(const char *s);

/* The builder's rule for tags and inputs: [A-Za-z_][A-Za-z0-9_-]* */
int ebb_load_is_tag_name(const char *s);

int ebb_load_is_null(const ynode *y);

num_form ebb_load_number_form(const char *s);

const spec_param *ebb_load_find_param_n(const loader *ld, const char *name, size_t len);

const spec_param *ebb_load_find_param(const loader *ld, const char *name);

int ebb_load_fail_undefined_param(loader *ld, const ynode *y, const char *name, size_t len);

int ebb_load_add_loc(loader *ld, const char *path, const ynode *at);

/* Counts a graph node or step against EBB_SPEC_MAX_NODES. */
int ebb_load_count_made(loader *ld, const ynode *at);

/* After a builder call: a failure becomes an error at `at`. */
int ebb_load_check_builder(loader *ld, ebb_builder *b, const ynode *at);

const tagdef *ebb_load_scope_find(const scope *sc, const char *name);

int ebb_load_scope_add(loader *ld, scope *sc, const char *name, const ynode *at);

/* ---- spec_expr.c ---- */

void ebb_load_expr_space(expr *e);

/* A syntax error: "WHAT must be an integer, got 'TEXT' (DETAIL)". */
int ebb_load_expr_syntax(expr *e, const char *detail);

int ebb_load_expr_sum(expr *e, int64_t *out);

/* Whether a scalar that is not a plain number is meant as arithmetic: it
 * names a param or holds an operator past its first character. Other text
 * ('big', '3x') keeps the plain "must be an integer" message. */
int ebb_load_looks_like_expr(const char *s);

/* Reads a number: a plain decimal scalar, "$param", or arithmetic on params
 * (an integer). `what` describes the place for messages ("attribute 'out' of
 * linear"). */
int ebb_load_read_value(loader *ld, const ynode *y, int want_int, const char *what, number *out);

int ebb_load_read_number(loader *ld, const ynode *y, int want_int, const char *what, int64_t *i_out,
                         double *f_out);

int ebb_load_read_int_range(loader *ld, const ynode *y, const char *what, int64_t lo, int64_t hi,
                            int64_t *out);

/* A scalar used as a name. */
int ebb_load_read_name(loader *ld, const ynode *y, const char *what, const char **out);

/* Checks the keys of a map against a list; unknown ones get a suggestion. */
int ebb_load_check_keys(loader *ld, const ynode *m, const char *what, const char *const *known);

/* ---- spec_nodes.c ---- */

int ebb_load_is_step_key(const char *k);

/* Reads an op's attribute map (NULL or null: none) into the builder's
 * "k=v, k=v" text, checking names, types and required attributes against
 * the schema; `y` is where the op is written. With ex non-NULL (an op node)
 * the keys `name` and `share`, which are not attributes of the op, are
 * accepted and returned in *ex; with ex NULL (a loss) they are refused. */
int ebb_load_read_op_attrs(loader *ld, const ebb_op *op, const ynode *y, const ynode *attrs,
                           strbuf *text, op_extras *ex);

int ebb_load_build_flow(loader *ld, ebb_builder *b, scope *sc, const ynode *steps, int is_main);

const spec_input *ebb_load_find_target(const ebb_spec *s, const char *name);

#endif
