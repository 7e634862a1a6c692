/* A flow's steps (from, through, also, split, merge, gate, switch, loop,
 * tag, using) read and turned into builder nodes, each recorded with its
 * graph path for later errors. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edit_distance.h"
#include "spec_loader.h"

/* ---- nodes ---------------------------------------------------------------------------- */

static ebb_node *make_node(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs);

static const char *const STEP_KEYS[] = {"from", "through", "also", "split",  "merge", "gate",
                                        "switch", "loop",  "repeat", "tag",  "using", NULL};

int ebb_load_is_step_key(const char *k) {
    for (const char *const *p = STEP_KEYS; *p; p++)
        if (strcmp(*p, k) == 0)
            return 1;
    return 0;
}

static int block_index(const loader *ld, const char *name) {
    if (!ld->blocks)
        return -1;
    for (int i = 0; i < ld->blocks->n; i++)
        if (strcmp(ymap_key(ld->blocks, i)->text, name) == 0)
            return i;
    return -1;
}

static int check_arity(loader *ld, const ynode *at, const char *what, int min, int max,
                       int n_inputs) {
    if (n_inputs >= min && (max < 0 || n_inputs <= max))
        return 0;
    char want[64];
    ebb_inputs_wanted(min, max, want, sizeof want);
    if (ld->merging && n_inputs == ld->merging)
        return ebb_load_fail_at(ld, at, "%s takes %s, but the merge gives it the %d open streams",
                                what, want, n_inputs);
    if (n_inputs == 1 && min > 1)
        return ebb_load_fail_at(ld, at,
                                "%s takes %s but gets only the stream; name the others with "
                                "`using: [tag, ...]` beside from/through",
                                what, want);
    return ebb_load_fail_at(ld, at, "%s takes %s, but gets %d (the stream%s)", what, want, n_inputs,
                            n_inputs > 1 ? " and its `using` tags" : "");
}

/* An integer list for a string attribute (reshape's shape, permute's dims):
 * the YAML list [-1, $vocab], each entry a number, a $param or arithmetic, or
 * a comma string "-1,$vocab" (in [] or not) that names a param. Writes
 * the plain text the op parses, "-1,65", into out. */
static int read_int_list(loader *ld, const ynode *v, const char *what, strbuf *out) {
    char item_what[200];
    snprintf(item_what, sizeof item_what, "an entry of %s", what);
    if (v->kind == Y_SEQ) {
        if (v->n > EBB_MAX_DIMS * 8)
            return ebb_load_fail_at(ld, v, "%s has %d entries; a list attribute holds at most %d",
                                    what, v->n, EBB_MAX_DIMS * 8);
        for (int j = 0; j < v->n; j++) {
            size_t m = ebb_load_sb_mark(&ld->kp);
            ebb_load_sb_printf(&ld->kp, "[%d]", j);
            int64_t x = 0;
            if (ebb_load_read_number(ld, v->items[j], 1, item_what, &x, NULL) != 0) return -1;
            ebb_load_sb_printf(out, "%s%lld", j ? "," : "", (long long)x);
            ebb_load_sb_reset(&ld->kp, m);
        }
        return 0;
    }
    expr e = {.ld = ld, .at = v, .what = item_what, .p = v->text};
    ebb_load_expr_space(&e);
    char close = 0; /* '(' opens an expression, not the list */
    if (*e.p == '[') {
        close = ']';
        e.p++;
    }
    for (int j = 0;; j++) {
        ebb_load_expr_space(&e);
        if (*e.p == close || !*e.p)
            break; /* an empty list, or a comma before the end */
        if (j >= EBB_MAX_DIMS * 8)
            return ebb_load_fail_at(ld, v, "%s has more than %d entries", what, EBB_MAX_DIMS * 8);
        int64_t x = 0;
        if (ebb_load_expr_sum(&e, &x) != 0) return -1;
        ebb_load_sb_printf(out, "%s%lld", j ? "," : "", (long long)x);
        ebb_load_expr_space(&e);
        if (*e.p == ',')
            e.p++;
        else if (*e.p != close && *e.p)
            return ebb_load_expr_syntax(&e, "expected ',' between the entries");
    }
    if (close && *e.p != close)
        return ebb_load_expr_syntax(&e, "a '[' lacks its ']'");
    if (close)
        e.p++;
    ebb_load_expr_space(&e);
    if (*e.p)
        return ebb_load_expr_syntax(&e, "expected the end of the list");
    return 0;
}

/* Appends one attribute to the builder's "k=v, k=v" text. */
static int attr_text_add(loader *ld, strbuf *text, const ebb_op *op, const ebb_attr_spec *spec,
                         const ynode *key, const ynode *v) {
    char what[160];
    snprintf(what, sizeof what, "attribute '%s' of %s", spec->name, op->name);
    const char *sep = text->len ? ", " : "";
    switch (spec->type) {
    case EBB_ATTR_INT: {
        int64_t i = 0;
        if (ebb_load_read_number(ld, v, 1, what, &i, NULL) != 0) return -1;
        ebb_load_sb_printf(text, "%s%s=%lld", sep, spec->name, (long long)i);
        return 0;
    }
    case EBB_ATTR_FLOAT: {
        double f = 0;
        if (ebb_load_read_number(ld, v, 0, what, NULL, &f) != 0) return -1;
        ebb_load_sb_printf(text, "%s%s=%.17g", sep, spec->name, f);
        return 0;
    }
    case EBB_ATTR_BOOL: {
        int b = -1;
        if (v && v->kind == Y_SCALAR && v->plain) {
            if (!strcmp(v->text, "true") || !strcmp(v->text, "True") || !strcmp(v->text, "TRUE"))
                b = 1;
            if (!strcmp(v->text, "false") || !strcmp(v->text, "False") ||
                !strcmp(v->text, "FALSE"))
                b = 0;
        }
        if (b < 0) {
            if (v && v->kind == Y_SCALAR && !v->plain)
                return ebb_load_fail_at(ld, v,
                                        "%s must be true or false, got the string \"%.64s\" "
                                        "(remove the quotes)",
                                        what, v->text);
            return ebb_load_fail_at(ld, v, "%s must be true or false, got %s%.64s%s", what,
                                    v && v->kind == Y_SCALAR ? "'" : "",
                                    v && v->kind == Y_SCALAR ? v->text : ebb_load_describe(ld, v),
                                    v && v->kind == Y_SCALAR ? "'" : "");
        }
        ebb_load_sb_printf(text, "%s%s=%s", sep, spec->name, b ? "true" : "false");
        return 0;
    }
    case EBB_ATTR_STRING:
        if ((v && v->kind == Y_SEQ) || (v && v->kind == Y_SCALAR && strchr(v->text, '$'))) {
            strbuf list = {0};
            int rc = read_int_list(ld, v, what, &list);
            if (rc == 0)
                ebb_load_sb_printf(text, "%s%s=\"%s\"", sep, spec->name, ebb_load_sb_str(&list));
            if (rc == 0 && list.oom)
                rc = ebb_load_nomem(ld, v);
            free(list.s);
            return rc;
        }
        if (!v || v->kind != Y_SCALAR || ebb_load_is_null(v))
            return ebb_load_fail_at(ld, v ? v : key, "%s must be a string, got %s", what,
                                    v && v->kind == Y_SCALAR ? "nothing"
                                                             : ebb_load_describe(ld, v));
        if (v->plain && ebb_load_number_form(v->text) != NUM_NONE)
            return ebb_load_fail_at(ld, v, "%s must be a string, got the number %.64s (quote it)",
                                    what, v->text);
        for (const char *p = v->text; *p; p++)
            if (*p == '"' || (unsigned char)*p < 0x20)
                return ebb_load_fail_at(ld, v, "%s may not contain quotes or control characters", what);
        ebb_load_sb_printf(text, "%s%s=\"%s\"", sep, spec->name, v->text);
        return 0;
    }
    return ebb_load_fail_at(ld, v, "%s has an unknown type", what);
}

/* A node's name (or a shared parameter's, `what` says which) with "{i}"
 * replaced by the enclosing repeat's copy index, as PyTorch numbers the
 * layers of an nn.ModuleList ("layers.{i}.attn" gives layers.0.attn,
 * layers.1.attn, ...). Returns v->text when there is none to replace, NULL
 * (with the error set) for "{i}" outside a repeat. */
static const char *copy_name(loader *ld, const ynode *v, const char *what) {
    const char *at = strstr(v->text, "{i}");
    if (!at)
        return v->text;
    if (ld->copy < 0) {
        ebb_load_fail_at(ld, v,
                         "'{i}' in the %s '%.64s' stands for a repeat's copy index, but "
                         "this node is not inside a repeat",
                         what, v->text);
        return NULL;
    }
    strbuf out = {0};
    for (const char *p = v->text; *p;) {
        if (strncmp(p, "{i}", 3) == 0) {
            ebb_load_sb_printf(&out, "%lld", (long long)ld->copy);
            p += 3;
        } else {
            ebb_load_sb_printf(&out, "%c", *p++);
        }
    }
    char *name = ebb_arena_strdup(&ld->spec->mem, ebb_load_sb_str(&out));
    free(out.s);
    if (!name)
        ebb_load_nomem(ld, v);
    return name;
}

static int claim_name(loader *ld, const char *name, const ynode *at) {
    for (int i = 0; i < ld->n_names; i++)
        if (strcmp(ld->names[i].name, name) == 0 && ld->names[i].at == at)
            return ebb_load_fail_at(
                ld, at,
                "node name '%s' would name more than one node: repeat and every use "
                "of a block make copies, and each needs a name of its own",
                name);
        else if (strcmp(ld->names[i].name, name) == 0)
            return ebb_load_fail_at(ld, at, "node name '%s' is already used at line %d, column %d",
                                    name, ld->names[i].at->line, ld->names[i].at->col);
    if (ld->n_names == ld->cap_names) {
        int cap = ld->cap_names ? ld->cap_names * 2 : 16;
        used_name *n = realloc(ld->names, (size_t)cap * sizeof *n);
        if (!n)
            return ebb_load_nomem(ld, at);
        ld->names = n;
        ld->cap_names = cap;
    }
    ld->names[ld->n_names++] = (used_name){name, at};
    return 0;
}


/* Reads `share: {param: source, ...}` of an op node into ex; `k` is the key. */
static int read_share(loader *ld, const ebb_op *op, const ynode *k, const ynode *v,
                      op_extras *ex) {
    if (!op->params)
        return ebb_load_fail_at(ld, k, "%s has no parameters to share", op->name);
    if (!v || v->kind != Y_MAP)
        return ebb_load_fail_at(ld, v ? v : k,
                                "share must be a map {param: source}, like {weight: "
                                "transformer.wte.weight}, got %s",
                                ebb_load_describe(ld, v));
    if (v->n > EBB_MAX_PARAMS)
        return ebb_load_fail_at(ld, v, "share names %d parameters; an op has at most %d", v->n,
                                EBB_MAX_PARAMS);
    for (int i = 0; i < v->n; i++) {
        const ynode *pk = ymap_key(v, i), *src = ymap_value(v, i);
        size_t m = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, ".%s", pk->text);
        if (!ebb_graph_valid_node_name(pk->text))
            return ebb_load_fail_at(
                ld, pk, "share: '%.64s' is not a parameter name like weight or bias", pk->text);
        if (!src || src->kind != Y_SCALAR || ebb_load_is_null(src))
            return ebb_load_fail_at(ld, src ? src : pk,
                                    "share: the source of %s must be a parameter's "
                                    "full name like transformer.wte.weight, got %s",
                                    pk->text, ebb_load_describe(ld, src));
        const char *name = copy_name(ld, src, "shared parameter name");
        if (!name)
            return -1;
        if (!ebb_graph_valid_node_name(name))
            return ebb_load_fail_at(ld, src,
                                    "share: a parameter's full name is letters, digits, '_', "
                                    "'-' and inner '.', like transformer.wte.weight; got '%.64s'",
                                    name);
        ex->share_param[ex->n_share] = pk->text;
        ex->share_source[ex->n_share] = name;
        ex->share_at[ex->n_share] = src;
        ex->n_share++;
        ebb_load_sb_reset(&ld->kp, m);
    }
    return 0;
}

/* Reads an op's attribute map (NULL or null: none) into the builder's
 * "k=v, k=v" text, checking names, types and required attributes against
 * the schema; `y` is where the op is written. With ex non-NULL (an op node)
 * the keys `name` and `share`, which are not attributes of the op, are
 * accepted and returned in *ex; with ex NULL (a loss) they are refused. */
int ebb_load_read_op_attrs(loader *ld, const ebb_op *op, const ynode *y, const ynode *attrs,
                           strbuf *text, op_extras *ex) {
    int given[EBB_MAX_ATTRS] = {0};
    if (attrs && !ebb_load_is_null(attrs)) {
        if (attrs->kind != Y_MAP)
            return ebb_load_fail_at(ld, attrs,
                                    "the attributes of %s must be a map {key: value}, got %s",
                                    op->name, ebb_load_describe(ld, attrs));
        for (int i = 0; i < attrs->n; i++) {
            const ynode *k = ymap_key(attrs, i), *v = ymap_value(attrs, i);
            size_t mark = ebb_load_sb_mark(&ld->kp);
            ebb_load_sb_printf(&ld->kp, ".%s.%s", op->name, k->text);
            if (ex && strcmp(k->text, "name") == 0) {
                const char *nm = v && v->kind == Y_SCALAR && !ebb_load_is_null(v)
                                     ? copy_name(ld, v, "node name")
                                     : NULL;
                if (ld->failed)
                    return -1;
                if (!nm || !ebb_graph_valid_node_name(nm))
                    return ebb_load_fail_at(
                        ld, v ? v : k,
                        "a node name is letters, digits, '_', '-' and inner '.', "
                        "starting with a letter or '_'; got %s%.64s%s",
                        v && v->kind == Y_SCALAR ? "'" : "",
                        v && v->kind == Y_SCALAR ? v->text : ebb_load_describe(ld, v),
                        v && v->kind == Y_SCALAR ? "'" : "");
                ex->name = nm;
                ex->name_at = v;
                ebb_load_sb_reset(&ld->kp, mark);
                continue;
            }
            if (ex && strcmp(k->text, "share") == 0) {
                if (read_share(ld, op, k, v, ex) != 0)
                    return -1;
                ebb_load_sb_reset(&ld->kp, mark);
                continue;
            }
            if (ex && strcmp(k->text, "precision") == 0) {
                if (!v || v->kind != Y_SCALAR || ebb_load_is_null(v) ||
                    ebb_precision_parse(&ex->precision, v->text) != EBB_OK) {
                    ebb_error_clear();
                    return ebb_load_fail_at(ld, v ? v : k,
                                            "precision must be fp32, bf16 or fp16, got %s",
                                            ebb_load_describe(ld, v));
                }
                ebb_load_sb_reset(&ld->kp, mark);
                continue;
            }
            int ai = ebb_op_attr_index(op, k->text);
            if (ai < 0) {
                char known[512] = "";
                size_t kl = 0;
                for (int j = 0; j < op->n_attrs && kl < sizeof known; j++)
                    kl += (size_t)snprintf(known + kl, sizeof known - kl, "%s%s",
                                           j ? ", " : "", op->attrs[j].name);
                if (ex && kl < sizeof known)
                    kl += (size_t)snprintf(known + kl, sizeof known - kl, "%sname, precision",
                                           kl ? ", " : "");
                if (ex && op->params && kl < sizeof known)
                    snprintf(known + kl, sizeof known - kl, ", share");
                /* only a node has a name; a loss is not one */
                if (!ex && strcmp(k->text, "name") == 0)
                    return ebb_load_fail_at(ld, k,
                                            "a loss has no name, only attributes (%s takes %s%s)",
                                            op->name, known[0] ? "" : "none", known);
                suggest s = {.word = k->text};
                for (int j = 0; j < op->n_attrs; j++)
                    ebb_load_suggest_try(&s, op->attrs[j].name);
                if (ex) {
                    ebb_load_suggest_try(&s, "name");
                    ebb_load_suggest_try(&s, "precision");
                }
                if (ex && op->params)
                    ebb_load_suggest_try(&s, "share");
                char sb[128];
                return ebb_load_fail_at(ld, k, "%s has no attribute '%.64s'%s (%s%s)", op->name,
                                        k->text, ebb_load_suggest_text(&s, sb, sizeof sb, ""),
                                        known[0] ? "known: " : "it takes none", known);
            }
            given[ai] = 1;
            if (attr_text_add(ld, text, op, &op->attrs[ai], k, v) != 0)
                return -1;
            ebb_load_sb_reset(&ld->kp, mark);
        }
    }
    for (int i = 0; i < op->n_attrs; i++)
        if (op->attrs[i].required && !given[i])
            return ebb_load_fail_at(ld, y, "%s needs attribute '%s' (%s)", op->name,
                                    op->attrs[i].name,
                                    op->attrs[i].doc ? op->attrs[i].doc : "required");
    return 0;
}

/* An op node: `op` bare, or {op: {attrs}}. `y` is where it is written. */
static ebb_node *make_op(loader *ld, ebb_builder *b, const ebb_op *op, const ynode *y,
                         const ynode *attrs, int n_inputs) {
    if (check_arity(ld, y, op->name, op->min_inputs, op->max_inputs, n_inputs) != 0)
        return NULL;
    strbuf text = {0};
    op_extras ex = {0};
    if (ebb_load_read_op_attrs(ld, op, y, attrs, &text, &ex) != 0) goto fail;
    if (ex.name) {
        if (claim_name(ld, ex.name, ex.name_at) != 0)
            goto fail;
        ebb_load_sb_printf(&text, "%sname=%s", text.len ? ", " : "", ex.name);
    }
    if (text.oom) {
        ebb_load_nomem(ld, y);
        goto fail;
    }
    if (ebb_load_count_made(ld, y) != 0) goto fail;
    ebb_node *n = ebb_node_op(b, op->name, text.len ? text.s : NULL);
    free(text.s);
    if (ex.precision)
        ebb_node_precision(b, n, ex.precision);
    if (ebb_load_check_builder(ld, b, y) != 0) return NULL;
    for (int i = 0; i < ex.n_share; i++) {
        size_t m = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, ".%s.share.%s", op->name, ex.share_param[i]);
        ebb_node_share(b, n, ex.share_param[i], ex.share_source[i]);
        int rc = ebb_load_check_builder(ld, b, ex.share_at[i]);
        ebb_load_sb_reset(&ld->kp, m);
        if (rc != 0)
            return NULL;
    }
    if (ebb_load_add_loc(ld, ebb_load_sb_str(&ld->np), y) != 0 ||
        (ex.name && ebb_load_add_loc(ld, ex.name, y) != 0))
        return NULL;
    return n;
fail:
    free(text.s);
    return NULL;
}

static ebb_node *make_subflow(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs) {
    if (y->n == 0) {
        ebb_load_fail_at(ld, y, "an empty list is not a node; use identity for a pass-through");
        return NULL;
    }
    if (n_inputs != 1 && ld->merging && n_inputs == ld->merging) {
        ebb_load_fail_at(ld, y,
                         "a sub-flow takes one stream, so it cannot merge %d; merge with an op "
                         "that takes %d inputs, or a block that is one",
                         n_inputs, n_inputs);
        return NULL;
    }
    if (n_inputs != 1) {
        ebb_load_fail_at(ld, y,
                         "a sub-flow takes only the stream; read tags inside it with a "
                         "`using` step instead");
        return NULL;
    }
    if (ld->nesting >= EBB_SPEC_MAX_NESTING) {
        ebb_load_fail_at(ld, y, "sub-flows and blocks are nested more than %d deep (the limit)",
                         EBB_SPEC_MAX_NESTING);
        return NULL;
    }
    if (ebb_load_count_made(ld, y) != 0) return NULL;
    ebb_builder *s = ebb_subflow_begin(b);
    if (!s) {
        ebb_load_nomem(ld, y);
        return NULL;
    }
    ld->nesting++;
    scope inner = {.parent = sc};
    int rc = ebb_load_check_builder(ld, s, y);
    if (rc == 0)
        rc = ebb_load_build_flow(ld, s, &inner, y, 0);
    ld->nesting--;
    free(inner.tags);
    ebb_node *n = ebb_subflow_end(s); /* frees s, also after a failure */
    if (rc != 0)
        return NULL;
    if (ebb_load_check_builder(ld, b, y) != 0) return NULL;
    if (ebb_load_add_loc(ld, ebb_load_sb_str(&ld->np), y) != 0) return NULL;
    return n;
}

static ebb_node *make_block(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int bi,
                            int n_inputs) {
    const char *name = ymap_key(ld->blocks, bi)->text;
    for (int i = 0; i < ld->n_stack; i++)
        if (strcmp(ld->stack[i].name, name) == 0) {
            char chain[512] = "";
            size_t k = 0;
            for (int j = i; j < ld->n_stack && k < sizeof chain; j++)
                k += (size_t)snprintf(chain + k, sizeof chain - k, "%s -> ", ld->stack[j].name);
            if (k < sizeof chain)
                snprintf(chain + k, sizeof chain - k, "%s", name);
            ebb_load_fail_at(ld, y, "block '%s' uses itself (%s)", name, chain);
            return NULL;
        }
    if (ld->n_stack >= EBB_SPEC_MAX_NESTING) {
        ebb_load_fail_at(ld, y, "blocks are nested more than %d deep (the limit)", EBB_SPEC_MAX_NESTING);
        return NULL;
    }
    ld->block_used[bi] = 1;
    char *used_at = ebb_arena_strdup(&ld->spec->mem, ebb_load_sb_str(&ld->kp));
    if (!used_at) {
        ebb_load_nomem(ld, y);
        return NULL;
    }
    strbuf saved = ld->kp;
    strbuf fresh = {0};
    ld->kp = fresh;
    ebb_load_sb_printf(&ld->kp, "blocks.%s", name);
    ld->stack[ld->n_stack++] = (block_use){name, used_at};
    ebb_node *n = make_node(ld, b, sc, ymap_value(ld->blocks, bi), n_inputs);
    ld->n_stack--;
    int oom = ld->kp.oom;
    free(ld->kp.s);
    ld->kp = saved;
    if (oom && n) {
        ebb_load_nomem(ld, y);
        return NULL;
    }
    return n;
}

/* Any NODE: "op", "block", {op: {attrs}} or a list (a sub-flow). The graph
 * path of the node is in ld->np; the key path of `y` in ld->kp. */
static ebb_node *make_node(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs) {
    if (!y || ebb_load_is_null(y)) {
        ebb_load_fail_at(ld, y,
                         "expected a node (an op, a block, {op: {attributes}} or a list of "
                         "steps), got nothing");
        return NULL;
    }
    if (y->kind == Y_SEQ)
        return make_subflow(ld, b, sc, y, n_inputs);
    const ynode *name_node = y, *attrs = NULL;
    if (y->kind == Y_MAP) {
        if (y->n != 1) {
            ebb_load_fail_at(ld, y,
                             "a node map has exactly one key, the op name: {op: {attributes}}; "
                             "this one has %d",
                             y->n);
            return NULL;
        }
        name_node = ymap_key(y, 0);
        attrs = ymap_value(y, 0);
    }
    const char *name = name_node->text;
    const ebb_op *op = ebb_op_find(name);
    int bi = block_index(ld, name);
    if (op && name[0] != '_' && bi < 0)
        return make_op(ld, b, op, y, attrs, n_inputs);
    if (bi >= 0) {
        if (attrs && !ebb_load_is_null(attrs)) {
            ebb_load_fail_at(ld, name_node, "block '%s' takes no attributes", name);
            return NULL;
        }
        return make_block(ld, b, sc, y, bi, n_inputs);
    }
    if (ebb_load_is_step_key(name)) {
        ebb_load_fail_at(ld, name_node,
                         "'%s' is a step, not a node; write a sub-flow as a list: [{%s: ...}]",
                         name, name);
        return NULL;
    }
    suggest s = {.word = name};
    ebb_load_suggest_ops(&s);
    ebb_load_suggest_blocks(ld, &s);
    char sb[128];
    ebb_load_fail_at(ld, name_node, "unknown op or block '%.64s'%s", name,
                     ebb_load_suggest_text(&s, sb, sizeof sb, ""));
    return NULL;
}

/* make_node with ".suffix" appended to the graph path and key path. */
static ebb_node *make_node_at(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs,
                              const char *np_suffix, const char *kp_suffix) {
    size_t np_mark = ebb_load_sb_mark(&ld->np), kp_mark = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->np, "%s", np_suffix);
    ebb_load_sb_printf(&ld->kp, "%s", kp_suffix);
    ebb_node *n = make_node(ld, b, sc, y, n_inputs);
    ebb_load_sb_reset(&ld->np, np_mark);
    ebb_load_sb_reset(&ld->kp, kp_mark);
    return n;
}

/* ---- steps --------------------------------------------------------------------------------- */

typedef struct step_state {
    int open;              /* open streams */
    const ynode *split_at; /* where the open streams were split */
    char *split_kp;        /* its key path (malloc'd) */
} step_state;

static int need_one(loader *ld, step_state *st, const ynode *at, const char *step) {
    if (st->open == 1)
        return 0;
    return ebb_load_fail_at(ld, at,
                            "%s needs one open stream, but the split at line %d has %d open; merge "
                            "them first",
                            step, st->split_at ? st->split_at->line : 0, st->open);
}

/* A list of NODEs (split branches, gate experts, switch branches). */
static ebb_node **make_node_list(loader *ld, ebb_builder *b, scope *sc, const ynode *list,
                                 const char *key, const char *np_kind, const char *what, int *n) {
    if (!list || list->kind != Y_SEQ)
        return ebb_load_fail_at(ld, list, "%s must be a list of nodes, got %s", key,
                                ebb_load_describe(ld, list)),
               NULL;
    if (list->n < 2)
        return ebb_load_fail_at(ld, list, "a %s needs at least 2 %s, got %d", np_kind, what,
                                list->n),
               NULL;
    ebb_node **nodes = malloc((size_t)list->n * sizeof *nodes);
    if (!nodes)
        return ebb_load_nomem(ld, list), NULL;
    for (int j = 0; j < list->n; j++) {
        char nps[64], kps[96];
        snprintf(nps, sizeof nps, ".%s.%d", np_kind, j);
        snprintf(kps, sizeof kps, "[%d]", j);
        nodes[j] = make_node_at(ld, b, sc, list->items[j], 1, nps, kps);
        if (!nodes[j]) {
            free(nodes);
            return NULL;
        }
    }
    *n = list->n;
    return nodes;
}

static int step_split(loader *ld, ebb_builder *b, scope *sc, step_state *st, const ynode *step,
                      const ynode *v) {
    if (need_one(ld, st, step, "split") != 0)
        return -1;
    int n = 0;
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".split");
    ebb_node **nodes = make_node_list(ld, b, sc, v, "split", "split", "branches", &n);
    ebb_load_sb_reset(&ld->kp, kp);
    if (!nodes)
        return -1;
    ebb_splitv(b, nodes, n);
    free(nodes);
    if (ebb_load_check_builder(ld, b, step) != 0) return -1;
    st->open = n;
    st->split_at = step;
    free(st->split_kp);
    st->split_kp = malloc(ld->kp.len + 1);
    if (!st->split_kp)
        return ebb_load_nomem(ld, step);
    memcpy(st->split_kp, ebb_load_sb_str(&ld->kp), ld->kp.len + 1);
    return 0;
}

static const char *const MERGE_OPS[] = {"add", "mean", "mul", "max", "cat", "stack", NULL};

/* merge by a node: an op or block that takes the k open streams as its
 * inputs, stream 0 first. Its graph path is that of the merge. */
static int merge_by_node(loader *ld, ebb_builder *b, scope *sc, step_state *st,
                         const ynode *step, const ynode *v, const ynode *opn) {
    if (opn && opn->kind == Y_SCALAR && !ebb_load_is_null(opn)) {
        const char *name = opn->text;
        const ebb_op *op = ebb_op_find(name);
        if (!(op && name[0] != '_') && block_index(ld, name) < 0 && !ebb_load_is_step_key(name)) {
            suggest s = {.word = name};
            for (int i = 0; MERGE_OPS[i]; i++)
                ebb_load_suggest_try(&s, MERGE_OPS[i]);
            ebb_load_suggest_ops(&s);
            ebb_load_suggest_blocks(ld, &s);
            char sb[128];
            return ebb_load_fail_at(
                ld, opn,
                "unknown merge '%.64s'%s (a merge is add, mean, mul, max, cat or "
                "stack, or an op or block that takes the open streams)",
                name, ebb_load_suggest_text(&s, sb, sizeof sb, ""));
        }
    }
    int outer = ld->merging;
    ld->merging = st->open;
    ebb_node *n = make_node_at(ld, b, sc, v, st->open, ".merge", "");
    ld->merging = outer;
    if (!n)
        return -1;
    ebb_merge_node(b, n);
    if (ebb_load_check_builder(ld, b, step) != 0) return -1;
    st->open = 1;
    return 0;
}

static int step_merge(loader *ld, ebb_builder *b, scope *sc, step_state *st, const ynode *step,
                      const ynode *v) {
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".merge");
    if (st->open < 2)
        return ebb_load_fail_at(ld, step,
                                "merge needs at least 2 open streams (from a split), but "
                                "there is 1");
    const ynode *opn = v, *attrs = NULL;
    if (v && v->kind == Y_MAP && v->n == 1) {
        opn = ymap_key(v, 0);
        attrs = ymap_value(v, 0);
    }
    if (!v || ebb_load_is_null(v))
        return ebb_load_fail_at(ld, v,
                                "merge takes one of add, mean, mul, max, cat, stack (cat and "
                                "stack as {cat: {dim: D}}), or a node that takes the open "
                                "streams, got %s",
                                ebb_load_describe(ld, v));
    int which = -1;
    for (int i = 0; opn->kind == Y_SCALAR && MERGE_OPS[i]; i++)
        if (strcmp(MERGE_OPS[i], opn->text) == 0)
            which = i;
    if (which < 0) {
        int rc = merge_by_node(ld, b, sc, st, step, v, v->kind == Y_SEQ ? NULL : opn);
        if (rc == 0)
            ebb_load_sb_reset(&ld->kp, kp);
        return rc;
    }
    static const ebb_merge_op ops[] = {EBB_MERGE_ADD, EBB_MERGE_MEAN, EBB_MERGE_MUL,
                                       EBB_MERGE_MAX, EBB_MERGE_CAT,  EBB_MERGE_STACK};
    int64_t dim = 0;
    if (ops[which] == EBB_MERGE_CAT || ops[which] == EBB_MERGE_STACK)
        dim = 1;
    if (attrs && !ebb_load_is_null(attrs)) {
        ebb_load_sb_printf(&ld->kp, ".%s", opn->text);
        if (dim == 0)
            return ebb_load_fail_at(ld, attrs, "merge '%s' takes no attributes", opn->text);
        if (attrs->kind != Y_MAP)
            return ebb_load_fail_at(ld, attrs,
                                    "the attributes of merge '%s' must be a map {dim: D}, got %s",
                                    opn->text, ebb_load_describe(ld, attrs));
        static const char *const keys[] = {"dim", NULL};
        if (ebb_load_check_keys(ld, attrs, "merge attributes", keys) != 0) return -1;
        const ynode *d = ebb_ymap_get(attrs, "dim");
        if (d) {
            ebb_load_sb_printf(&ld->kp, ".dim");
            if (ebb_load_read_int_range(ld, d, "dim", -EBB_MAX_DIMS - 1, EBB_MAX_DIMS, &dim) != 0)
                return -1;
        }
    }
    ebb_load_sb_reset(&ld->kp, kp);
    ebb_merge(b, ops[which], dim);
    if (ebb_load_check_builder(ld, b, step) != 0) return -1;
    st->open = 1;
    return 0;
}

static int step_gate(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"router", "experts", "top_k", NULL};
    if (!v || v->kind != Y_MAP)
        return ebb_load_fail_at(ld, v,
                                "gate takes a map {router: NODE, experts: [NODE, ...], top_k: K}, "
                                "got %s",
                                ebb_load_describe(ld, v));
    if (ebb_load_check_keys(ld, v, "gate", keys) != 0) return -1;
    const ynode *router = ebb_ymap_get(v, "router"), *experts = ebb_ymap_get(v, "experts"),
                *topk = ebb_ymap_get(v, "top_k");
    if (!router)
        return ebb_load_fail_at(ld, v, "gate needs a router");
    if (!experts)
        return ebb_load_fail_at(ld, v, "gate needs experts");
    int64_t k = 0;
    if (topk) {
        size_t kp = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, ".top_k");
        if (ebb_load_read_int_range(ld, topk, "top_k", 0, INT64_MAX, &k) != 0) return -1;
        if (experts->kind == Y_SEQ && k > experts->n)
            return ebb_load_fail_at(ld, topk, "top_k is %lld, but the gate has only %d experts",
                                    (long long)k, experts->n);
        ebb_load_sb_reset(&ld->kp, kp);
    }
    ebb_node *r = make_node_at(ld, b, sc, router, 1, ".gate.router", ".router");
    if (!r)
        return -1;
    int n = 0;
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".experts");
    ebb_node **nodes = make_node_list(ld, b, sc, experts, "experts", "gate", "experts", &n);
    ebb_load_sb_reset(&ld->kp, kp);
    if (!nodes)
        return -1;
    ebb_gatev(b, r, (int)k, nodes, n);
    free(nodes);
    return ebb_load_check_builder(ld, b, step);
}

static int step_switch(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"selector", "branches", NULL};
    if (!v || v->kind != Y_MAP)
        return ebb_load_fail_at(
            ld, v, "switch takes a map {selector: NODE, branches: [NODE, ...]}, got %s",
            ebb_load_describe(ld, v));
    if (ebb_load_check_keys(ld, v, "switch", keys) != 0) return -1;
    const ynode *sel = ebb_ymap_get(v, "selector"), *branches = ebb_ymap_get(v, "branches");
    if (!sel)
        return ebb_load_fail_at(ld, v, "switch needs a selector");
    if (!branches)
        return ebb_load_fail_at(ld, v, "switch needs branches");
    ebb_node *s = make_node_at(ld, b, sc, sel, 1, ".switch.selector", ".selector");
    if (!s)
        return -1;
    int n = 0;
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".branches");
    ebb_node **nodes = make_node_list(ld, b, sc, branches, "branches", "switch", "branches", &n);
    ebb_load_sb_reset(&ld->kp, kp);
    if (!nodes)
        return -1;
    ebb_switchv(b, s, nodes, n);
    free(nodes);
    return ebb_load_check_builder(ld, b, step);
}

static int step_loop(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"body", "times", "while", "until", "max", NULL};
    if (!v || v->kind != Y_MAP)
        return ebb_load_fail_at(ld, v,
                                "loop takes a map {body: NODE, times: N} (or while/until: NODE "
                                "with max: N), got %s",
                                ebb_load_describe(ld, v));
    if (ebb_load_check_keys(ld, v, "loop", keys) != 0) return -1;
    const ynode *body = ebb_ymap_get(v, "body"), *times = ebb_ymap_get(v, "times"),
                *wh = ebb_ymap_get(v, "while"), *un = ebb_ymap_get(v, "until"), *max = ebb_ymap_get(v, "max");
    if (!body)
        return ebb_load_fail_at(ld, v, "loop needs a body");
    int kinds = !!times + !!wh + !!un;
    if (kinds == 0)
        return ebb_load_fail_at(ld, v, "loop needs one of times, while or until");
    if (kinds > 1)
        return ebb_load_fail_at(ld, v, "loop takes only one of times, while and until");
    if (times && max)
        return ebb_load_fail_at(ld, max, "max goes with while or until; times already fixes the count");
    if (!times && !max)
        return ebb_load_fail_at(ld, v, "a loop with %s needs max (the most iterations)",
                                wh ? "while" : "until");
    int64_t count = 0;
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".%s", times ? "times" : "max");
    if (ebb_load_read_int_range(ld, times ? times : max, times ? "times" : "max", 0, INT64_MAX,
                                &count) != 0)
        return -1;
    ebb_load_sb_reset(&ld->kp, kp);
    ebb_node *bn = make_node_at(ld, b, sc, body, 1, ".loop.body", ".body");
    if (!bn)
        return -1;
    if (times) {
        ebb_loop_for(b, bn, count);
    } else {
        ebb_node *cn = make_node_at(ld, b, sc, wh ? wh : un, 1, ".loop.cond", wh ? ".while" : ".until");
        if (!cn)
            return -1;
        if (wh)
            ebb_loop_while(b, bn, cn, count);
        else
            ebb_loop_until(b, bn, cn, count);
    }
    return ebb_load_check_builder(ld, b, step);
}

/* repeat: N copies of the body, each with its own weights, as one through
 * step over a sequence: copy j has the graph path "<step>.j". */
static int step_repeat(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"times", "body", NULL};
    if (!v || v->kind != Y_MAP)
        return ebb_load_fail_at(ld, v, "repeat takes a map {times: N, body: NODE}, got %s", ebb_load_describe(ld, v));
    if (ebb_load_check_keys(ld, v, "repeat", keys) != 0) return -1;
    const ynode *times = ebb_ymap_get(v, "times"), *body = ebb_ymap_get(v, "body");
    if (!times)
        return ebb_load_fail_at(ld, v, "repeat needs times");
    if (!body)
        return ebb_load_fail_at(ld, v, "repeat needs a body");
    int64_t n = 0;
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".repeat.times");
    if (ebb_load_read_int_range(ld, times, "times", 1, EBB_SPEC_MAX_NODES, &n) != 0) return -1;
    ebb_load_sb_reset(&ld->kp, kp);
    ebb_node **copies = malloc((size_t)n * sizeof *copies);
    if (!copies)
        return ebb_load_nomem(ld, v);
    int64_t outer = ld->copy;
    for (int64_t j = 0; j < n; j++) {
        char nps[32];
        snprintf(nps, sizeof nps, ".%lld", (long long)j);
        ld->copy = j;
        copies[j] = make_node_at(ld, b, sc, body, 1, nps, ".repeat.body");
        if (!copies[j]) {
            ld->copy = outer;
            free(copies);
            return -1;
        }
    }
    ld->copy = outer;
    ebb_node *seq = ebb_node_seqv(b, copies, (int)n);
    free(copies);
    if (ebb_load_check_builder(ld, b, step) != 0) return -1;
    ebb_through(b, seq);
    return ebb_load_check_builder(ld, b, step);
}

/* Names the `using` tags and checks they are visible here. Returns the count
 * (>= 1) with the names in *out (malloc'd), or -1. */
static int read_using(loader *ld, const scope *sc, const ynode *steps, const ynode *u,
                      const char ***out) {
    size_t kp = ebb_load_sb_mark(&ld->kp);
    ebb_load_sb_printf(&ld->kp, ".using");
    if (!u || ebb_load_is_null(u)) return ebb_load_fail_at(ld, u, "using needs at least one tag");
    const ynode *const *items = &u;
    int n = 1;
    if (u && u->kind == Y_SEQ) {
        items = (const ynode *const *)u->items;
        n = u->n;
        if (n == 0)
            return ebb_load_fail_at(ld, u, "using needs at least one tag");
    }
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names)
        return ebb_load_nomem(ld, u);
    for (int i = 0; i < n; i++) {
        const ynode *t = items[i];
        size_t m = ebb_load_sb_mark(&ld->kp);
        if (u->kind == Y_SEQ)
            ebb_load_sb_printf(&ld->kp, "[%d]", i);
        if (!t || t->kind != Y_SCALAR || ebb_load_is_null(t)) {
            free(names);
            return ebb_load_fail_at(ld, t ? t : u, "using takes tag names, got %s", ebb_load_describe(ld, t));
        }
        if (!ebb_load_scope_find(sc, t->text) && ebb_load_find_target(ld->spec, t->text)) {
            free(names);
            return ebb_load_fail_at(ld, t,
                                    "'%.64s' is a target, which only the loss reads; the flow "
                                    "cannot use it",
                                    t->text);
        }
        if (!ebb_load_scope_find(sc, t->text)) {
            /* defined later in this flow? */
            for (int j = 0; steps && j < steps->n; j++) {
                const ynode *s = steps->items[j];
                const ynode *tv = s->kind == Y_MAP && s->n == 1 ? ebb_ymap_get(s, "tag") : NULL;
                if (tv && tv->kind == Y_SCALAR && strcmp(tv->text, t->text) == 0) {
                    free(names);
                    return ebb_load_fail_at(ld, t,
                                            "tag '%.64s' is used before its definition at line %d",
                                            t->text, tv->line);
                }
            }
            suggest s = {.word = t->text};
            for (const scope *p = sc; p; p = p->parent)
                for (int j = 0; j < p->n; j++)
                    ebb_load_suggest_try(&s, p->tags[j].name);
            char sb[128];
            free(names);
            return ebb_load_fail_at(ld, t, "undefined tag '%.64s'%s", t->text,
                                    ebb_load_suggest_text(&s, sb, sizeof sb, ""));
        }
        names[i] = t->text;
        ebb_load_sb_reset(&ld->kp, m);
    }
    ebb_load_sb_reset(&ld->kp, kp);
    *out = names;
    return n;
}

/* One step of a flow. `k` is its index; ld->np holds the flow's graph path
 * and ld->kp the step's key path. */
static int build_step(loader *ld, ebb_builder *b, scope *sc, const ynode *steps, int k,
                      step_state *st, int is_main) {
    const ynode *step = steps->items[k];
    const char *kind = "through";
    const ynode *v = step, *using = NULL;
    int bare = 1;
    if (step->kind == Y_MAP) {
        const ynode *key = NULL;
        for (int i = 0; i < step->n; i++) {
            const ynode *kk = ymap_key(step, i);
            if (strcmp(kk->text, "using") == 0)
                using = ymap_value(step, i);
            else if (!key)
                key = kk;
            else
                return ebb_load_fail_at(ld, kk,
                                        "a step is a map with one key (and `using` beside from or "
                                        "through); found '%.64s' and '%.64s'",
                                        key->text, kk->text);
        }
        if (!key)
            return ebb_load_fail_at(ld, step,
                                    "`using` stands beside from or through; this step has "
                                    "nothing else");
        if (ebb_load_is_step_key(key->text)) {
            kind = key->text;
            v = ymap_value(step, (int)(key == ymap_key(step, 0) ? 0 : 1));
            bare = 0;
        } else if (!ebb_op_find(key->text) && block_index(ld, key->text) < 0) {
            suggest sg = {.word = key->text};
            for (const char *const *p = STEP_KEYS; *p; p++)
                ebb_load_suggest_try(&sg, *p);
            ebb_load_suggest_ops(&sg);
            ebb_load_suggest_blocks(ld, &sg);
            char sb[128];
            return ebb_load_fail_at(ld, key, "unknown step, op or block '%.64s'%s", key->text,
                                    ebb_load_suggest_text(&sg, sb, sizeof sb, ""));
        } else if (using) {
            return ebb_load_fail_at(ld, key,
                                    "`using` stands beside from or through; write {through: %.64s, "
                                    "using: [...]}",
                                    key->text);
        }
        if (using && strcmp(kind, "from") != 0 && strcmp(kind, "through") != 0)
            return ebb_load_fail_at(ld, key, "`using` stands beside from or through, not %s", kind);
    }
    if (ebb_load_count_made(ld, step) != 0) return -1;
    size_t np_mark = ebb_load_sb_mark(&ld->np);
    ebb_load_sb_printf(&ld->np, ".%d", k);
    if (!bare && ebb_load_add_loc(ld, ebb_load_sb_str(&ld->np), step) != 0) return -1;
    if (!bare && strcmp(kind, "from") != 0 && strcmp(kind, "through") != 0 &&
        strcmp(kind, "repeat") != 0) {
        size_t m = ebb_load_sb_mark(&ld->np), km = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->np, ".%s", kind);
        ebb_load_sb_printf(&ld->kp, ".%s", kind);
        int r = ebb_load_add_loc(ld, ebb_load_sb_str(&ld->np), step);
        ebb_load_sb_reset(&ld->np, m);
        ebb_load_sb_reset(&ld->kp, km);
        if (r != 0)
            return -1;
    }
    int rc = -1;
    int is_from = strcmp(kind, "from") == 0;
    if (is_main && k == 0 && !is_from) {
        rc = ebb_load_fail_at(ld, step,
                              "the flow starts with `from` (the node that receives the first "
                              "input); got %s",
                              bare ? "a node" : kind);
    } else if (is_from && !is_main) {
        rc = ebb_load_fail_at(ld, step,
                              "a sub-flow starts from the stream it is applied to; use "
                              "through instead of from");
    } else if (is_from && k > 0) {
        rc = ebb_load_fail_at(ld, step, "from is the first step of the flow only");
    } else if (is_from || strcmp(kind, "through") == 0) {
        if (is_from || need_one(ld, st, step, "through") == 0) {
            const char **names = NULL;
            int n_using = 0;
            if (using && (n_using = read_using(ld, sc, steps, using, &names)) < 0) {
                rc = -1;
            } else {
                ebb_node *n = make_node_at(ld, b, sc, v, 1 + n_using, "", bare ? "" : is_from ? ".from" : ".through");
                if (n) {
                    if (n_using > 0)
                        ebb_usingv(b, names, n_using);
                    if (is_from)
                        ebb_from(b, n);
                    else
                        ebb_through(b, n);
                    rc = ebb_load_check_builder(ld, b, step);
                    st->open = 1;
                }
            }
            free(names);
        }
    } else if (strcmp(kind, "also") == 0) {
        if (need_one(ld, st, step, "also") == 0) {
            ebb_node *n = make_node_at(ld, b, sc, v, 1, ".also", ".also");
            if (n) {
                ebb_also(b, n);
                rc = ebb_load_check_builder(ld, b, step);
            }
        }
    } else if (strcmp(kind, "split") == 0) {
        rc = step_split(ld, b, sc, st, step, v);
    } else if (strcmp(kind, "merge") == 0) {
        rc = step_merge(ld, b, sc, st, step, v);
    } else if (strcmp(kind, "tag") == 0) {
        size_t kp = ebb_load_sb_mark(&ld->kp);
        const char *name = NULL;
        if (need_one(ld, st, step, "tag") == 0)
            ebb_load_sb_printf(&ld->kp, ".tag");
        if (!ld->failed && ebb_load_read_name(ld, v, "a tag", &name) == 0) {
            const tagdef *old = ebb_load_scope_find(sc, name);
            const spec_input *target = ebb_load_find_target(ld->spec, name);
            if (!ebb_load_is_tag_name(name))
                rc = ebb_load_fail_at(ld, v,
                                      "a tag name is letters, digits, '_' and '-', starting with "
                                      "a letter or '_'; got '%.64s'",
                                      name);
            else if (old)
                rc = ebb_load_fail_at(ld, v, "tag '%s' is already defined at line %d, column %d",
                                      name, old->at->line, old->at->col);
            else if (target)
                rc = ebb_load_fail_at(ld, v,
                                      "tag '%s' has the name of the target at line %d, column %d",
                                      name, target->at->line, target->at->col);
            else if (ebb_load_scope_add(ld, sc, name, v) == 0) {
                ebb_load_sb_reset(&ld->kp, kp);
                ebb_tag(b, name);
                rc = ebb_load_check_builder(ld, b, step);
            }
        }
    } else if (need_one(ld, st, step, kind) == 0) {
        size_t kp = ebb_load_sb_mark(&ld->kp);
        if (strcmp(kind, "repeat") == 0) {
            rc = step_repeat(ld, b, sc, step, v);
        } else {
            ebb_load_sb_printf(&ld->kp, ".%s", kind);
            rc = kind[0] == 'g'   ? step_gate(ld, b, sc, step, v)
                 : kind[0] == 's' ? step_switch(ld, b, sc, step, v)
                                  : step_loop(ld, b, sc, step, v);
        }
        ebb_load_sb_reset(&ld->kp, kp);
    }
    ebb_load_sb_reset(&ld->np, np_mark);
    return rc;
}

int ebb_load_build_flow(loader *ld, ebb_builder *b, scope *sc, const ynode *steps, int is_main) {
    step_state st = {.open = is_main ? 0 : 1};
    int rc = 0;
    for (int k = 0; rc == 0 && k < steps->n; k++) {
        size_t kp = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, "[%d]", k);
        rc = build_step(ld, b, sc, steps, k, &st, is_main);
        ebb_load_sb_reset(&ld->kp, kp);
    }
    if (rc == 0 && st.open > 1) {
        size_t kp = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_reset(&ld->kp, 0);
        ebb_load_sb_printf(&ld->kp, "%s", st.split_kp ? st.split_kp : "");
        rc = ebb_load_fail_at(ld, st.split_at,
                              "the split leaves %d streams open at the end of the flow; merge them",
                              st.open);
        ebb_load_sb_reset(&ld->kp, kp);
    }
    free(st.split_kp);
    return rc;
}


const spec_input *ebb_load_find_target(const ebb_spec *s, const char *name) {
    for (int i = 0; i < s->n_targets; i++)
        if (strcmp(s->targets[i].name, name) == 0)
            return &s->targets[i];
    return NULL;
}
