#define _POSIX_C_SOURCE 200809L
/* The YAML spec loader (format 1): checks a parsed tree and turns it into
 * builder calls. It checks what it can see in the file itself (keys, types,
 * names, tags, open streams) so each error points at the right YAML node;
 * whatever the builder still refuses is reported at the step that made the
 * call. Every node it makes is recorded with its graph path, so errors the
 * compiler raises later can be traced back to a FILE:LINE:COL. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edit_distance.h"
#include "spec_loader.h"

/* ---- top level ------------------------------------------------------------------------------- */

static const char *const TOP_KEYS[] = {"ebb",    "name",    "params", "inputs",    "targets",
                                       "loss",   "outputs", "blocks", "precision", "flow",
                                       NULL};

static int read_params(loader *ld, const ynode *p) {
    ebb_spec *s = ld->spec;
    ebb_load_sb_printf(&ld->kp, "params");
    if (p->kind != Y_MAP)
        return ebb_load_fail_at(ld, p, "params must be a map {name: number}, got %s", ebb_load_describe(ld, p));
    s->params = ebb_arena_alloc(&s->mem, (size_t)(p->n ? p->n : 1) * sizeof *s->params);
    if (!s->params)
        return ebb_load_nomem(ld, p);
    for (int i = 0; i < p->n; i++) {
        const ynode *k = ymap_key(p, i), *v = ymap_value(p, i);
        size_t m = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, ".%s", k->text);
        if (!ebb_load_is_ident(k->text))
            return ebb_load_fail_at(ld, k,
                                    "a param name is letters, digits and '_', starting with a "
                                    "letter or '_'; got '%.64s'",
                                    k->text);
        number val;
        if (ebb_load_read_value(ld, v, 0, "a param", &val) != 0) return -1;
        int64_t iv = val.i;
        double fv = val.f;
        int is_int = val.is_int;
        /* a caller's override replaces the value written in the file */
        for (int o = 0; o < ld->n_overrides; o++) {
            const char *ov = ld->overrides[o], *eq = strchr(ov, '=');
            if ((size_t)(eq - ov) != strlen(k->text) || strncmp(ov, k->text, (size_t)(eq - ov)))
                continue;
            ld->override_used[o] = 1;
            is_int = ebb_load_number_form(eq + 1) == NUM_INT;
            iv = is_int ? strtoll(eq + 1, NULL, 10) : 0;
            fv = strtod(eq + 1, NULL);
        }
        s->params[s->n_params++] =
            (spec_param){k->text, is_int ? (double)iv : fv, is_int ? iv : 0, is_int, k};
        ebb_load_sb_reset(&ld->kp, m);
    }
    ebb_load_sb_reset(&ld->kp, 0);
    return 0;
}

/* The dtype a spec names: "float32", "int64", ... as ebb_dtype_name() writes
 * them. */
static int read_dtype(loader *ld, const ynode *v, const char *what, const char *name,
                      ebb_dtype *out) {
    if (!v || v->kind != Y_SCALAR || ebb_load_is_null(v))
        return ebb_load_fail_at(ld, v, "the dtype of %s '%s' must be a name like int64, got %s",
                                what, name, ebb_load_describe(ld, v));
    /* PyTorch's other names for them, suggested, not accepted */
    static const char *const aliases[][2] = {{"long", "int64"},   {"int", "int32"},
                                             {"float", "float32"}, {"double", "float64"},
                                             {"half", "float16"}};
    char known[160] = "";
    size_t kl = 0;
    suggest s = {.word = v->text};
    for (size_t a = 0; a < sizeof aliases / sizeof aliases[0]; a++)
        if (strcmp(v->text, aliases[a][0]) == 0) {
            s.best = aliases[a][1];
            s.dist = 0;
        }
    for (int d = EBB_FLOAT32; d <= EBB_BOOL; d++) {
        const char *dn = ebb_dtype_name((ebb_dtype)d);
        if (strcmp(dn, v->text) == 0) {
            *out = (ebb_dtype)d;
            return 0;
        }
        ebb_load_suggest_try(&s, dn);
        if (kl < sizeof known)
            kl += (size_t)snprintf(known + kl, sizeof known - kl, "%s%s", kl ? ", " : "", dn);
    }
    char sb[128];
    return ebb_load_fail_at(ld, v, "unknown dtype '%.64s'%s (known: %s)", v->text,
                            ebb_load_suggest_text(&s, sb, sizeof sb, ""), known);
}

/* The dimensions of one input or target: a list of sizes, $params and
 * symbolic names. */
static int read_dims(loader *ld, const ynode *v, const char *what, spec_input *x) {
    if (v->n > EBB_MAX_DIMS)
        return ebb_load_fail_at(ld, v, "%s '%s' has %d dimensions; at most %d are supported", what,
                                x->name, v->n, EBB_MAX_DIMS);
    x->ndim = v->n;
    for (int d = 0; d < v->n; d++) {
        const ynode *dn = v->items[d];
        size_t dm = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, "[%d]", d);
        if (dn->kind == Y_SCALAR && !ebb_load_is_null(dn) && dn->text[0] != '$' &&
            ebb_load_number_form(dn->text) == NUM_NONE &&
            !(dn->plain && ebb_load_looks_like_expr(dn->text))) {
            if (!ebb_load_is_ident(dn->text))
                return ebb_load_fail_at(ld, dn,
                                        "a dimension is a number, a $param or a symbolic name "
                                        "like batch; got '%.64s'",
                                        dn->text);
            x->dim[d] = -1;
            x->sym[d] = dn->text;
        } else {
            if (dn->kind == Y_SCALAR && !dn->plain)
                return ebb_load_fail_at(ld, dn,
                                        "a dimension is a number, a $param or a symbolic name; "
                                        "got the string \"%.64s\"",
                                        dn->text);
            if (ebb_load_read_int_range(ld, dn, "a dimension", 1, INT64_MAX / 1024, &x->dim[d]) !=
                0)
                return -1;
            x->sym[d] = NULL;
        }
        ebb_load_sb_reset(&ld->kp, dm);
    }
    return 0;
}

/* Reads `inputs` or `targets` (`key`; `what` is "input" or "target"): an
 * ordered map of names to a shape [dims] or {shape: [dims], dtype: NAME}. */
static int read_decls(loader *ld, const ynode *in, const char *key, const char *what,
                      spec_input **out, int *count) {
    ebb_spec *s = ld->spec;
    ebb_load_sb_printf(&ld->kp, "%s", key);
    if (in->kind != Y_MAP || in->n == 0)
        return ebb_load_fail_at(
            ld, in, "%s must be a map {name: [dims]} with at least one %s, got %s", key, what,
            in->kind == Y_MAP ? "an empty map" : ebb_load_describe(ld, in));
    spec_input *list = ebb_arena_alloc(&s->mem, (size_t)in->n * sizeof *list);
    if (!list)
        return ebb_load_nomem(ld, in);
    *out = list;
    for (int i = 0; i < in->n; i++) {
        const ynode *k = ymap_key(in, i), *v = ymap_value(in, i);
        size_t m = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, ".%s", k->text);
        if (!ebb_load_is_tag_name(k->text))
            return ebb_load_fail_at(ld, k,
                                    "%s %s name is letters, digits, '_' and '-', starting with "
                                    "a letter or '_'; got '%.64s'",
                                    what[0] == 'i' ? "an" : "a", what, k->text);
        spec_input *x = &list[*count];
        x->name = k->text;
        x->at = k;
        const ynode *shape = v, *dt = NULL;
        if (v && v->kind == Y_MAP) {
            static const char *const keys[] = {"shape", "dtype", NULL};
            char in_what[96];
            snprintf(in_what, sizeof in_what, "%s '%.64s'", what, k->text);
            if (ebb_load_check_keys(ld, v, in_what, keys) != 0) return -1;
            shape = ebb_ymap_get(v, "shape");
            dt = ebb_ymap_get(v, "dtype");
            if (!shape)
                return ebb_load_fail_at(
                    ld, v, "%s '%s' needs a shape: {shape: [dims], dtype: NAME}", what, k->text);
            ebb_load_sb_printf(&ld->kp, ".shape");
            if (shape->kind != Y_SEQ)
                return ebb_load_fail_at(ld, shape,
                                        "the shape of %s '%s' must be a list of dimensions "
                                        "like [batch, 64], got %s",
                                        what, k->text, ebb_load_describe(ld, shape));
        } else if (!v || v->kind != Y_SEQ) {
            return ebb_load_fail_at(ld, v,
                                    "the shape of %s '%s' must be a list of dimensions like "
                                    "[batch, 64] (or {shape: [batch, 64], dtype: int64}), got %s",
                                    what, k->text, ebb_load_describe(ld, v));
        }
        if (read_dims(ld, shape, what, x) != 0)
            return -1;
        if (dt) {
            ebb_load_sb_reset(&ld->kp, m);
            ebb_load_sb_printf(&ld->kp, ".%s.dtype", k->text);
            if (read_dtype(ld, dt, what, k->text, &x->dtype) != 0)
                return -1;
            x->has_dtype = 1;
        }
        (*count)++;
        ebb_load_sb_reset(&ld->kp, m);
    }
    ebb_load_sb_reset(&ld->kp, 0);
    return 0;
}

static int read_inputs(loader *ld, const ynode *in, scope *sc) {
    ebb_spec *s = ld->spec;
    if (read_decls(ld, in, "inputs", "input", &s->inputs, &s->n_inputs) != 0)
        return -1;
    for (int i = 0; i < s->n_inputs; i++)
        if (ebb_load_scope_add(ld, sc, s->inputs[i].name, s->inputs[i].at) != 0) return -1;
    return 0;
}


/* Reads `targets` (after the inputs): like inputs, but no target may have
 * an input's name. */
static int read_targets(loader *ld, const ynode *tg) {
    ebb_spec *s = ld->spec;
    if (read_decls(ld, tg, "targets", "target", &s->targets, &s->n_targets) != 0)
        return -1;
    for (int i = 0; i < s->n_targets; i++)
        for (int j = 0; j < s->n_inputs; j++)
            if (strcmp(s->targets[i].name, s->inputs[j].name) == 0) {
                ebb_load_sb_printf(&ld->kp, "targets.%s", s->targets[i].name);
                return ebb_load_fail_at(
                    ld, s->targets[i].at,
                    "target '%s' has the name of the input at line %d, column %d",
                    s->targets[i].name, s->inputs[j].at->line, s->inputs[j].at->col);
            }
    return 0;
}

/* Reads `loss`: an op name, or {op: {attributes}}. `key` is the `loss` key,
 * where a loss without targets is reported. */
static int read_loss(loader *ld, ebb_builder *b, const ynode *key, const ynode *v) {
    ebb_spec *s = ld->spec;
    ebb_load_sb_printf(&ld->kp, "loss");
    if (s->n_targets == 0)
        return ebb_load_fail_at(ld, key,
                                "a loss compares the final stream with targets, and the spec "
                                "declares none; add `targets:` (e.g. {y: {shape: [batch], "
                                "dtype: int64}})");
    const ynode *opn = v, *attrs = NULL;
    if (v && v->kind == Y_MAP) {
        if (v->n != 1)
            return ebb_load_fail_at(ld, v,
                                    "a loss map has exactly one key, the op name: {op: "
                                    "{attributes}}; this one has %d",
                                    v->n);
        opn = ymap_key(v, 0);
        attrs = ymap_value(v, 0);
    }
    if (!opn || opn->kind != Y_SCALAR || ebb_load_is_null(opn))
        return ebb_load_fail_at(ld, v ? v : key,
                                "loss takes a loss op (cross_entropy, mse, "
                                "bce_with_logits, nll), or {op: {attributes}}, got %s",
                                ebb_load_describe(ld, v));
    const ebb_op *op = ebb_op_find(opn->text);
    if (!op || opn->text[0] == '_') {
        suggest sg = {.word = opn->text};
        ebb_load_suggest_ops(&sg);
        char sb[128];
        return ebb_load_fail_at(ld, opn, "unknown loss op '%.64s'%s", opn->text,
                                ebb_load_suggest_text(&sg, sb, sizeof sb, ""));
    }
    int n = 1 + s->n_targets, min = op->min_inputs, max = op->max_inputs;
    if (n < min || (max >= 0 && n > max)) {
        char want[64];
        ebb_inputs_wanted(min, max, want, sizeof want);
        return ebb_load_fail_at(ld, opn,
                                "%s takes %s (the final stream, then the targets), but the "
                                "spec declares %d target%s",
                                op->name, want, s->n_targets, s->n_targets == 1 ? "" : "s");
    }
    strbuf text = {0};
    int rc = ebb_load_read_op_attrs(ld, op, opn, attrs, &text, NULL);
    if (rc == 0 && text.oom)
        rc = ebb_load_nomem(ld, v);
    if (rc == 0) {
        ebb_loss(b, op->name, text.len ? text.s : NULL);
        rc = ebb_load_check_builder(ld, b, opn);
    }
    /* a training plan's loss step has the node path "loss" */
    if (rc == 0) {
        ebb_load_sb_reset(&ld->kp, 0);
        ebb_load_sb_printf(&ld->kp, "loss");
        ld->spec->loss_loc = ld->spec->n_locs;
        rc = ebb_load_add_loc(ld, "loss", opn);
    }
    free(text.s);
    if (rc == 0)
        ebb_load_sb_reset(&ld->kp, 0);
    return rc;
}

static int read_blocks(loader *ld, const ynode *bl) {
    ebb_load_sb_printf(&ld->kp, "blocks");
    if (bl->kind != Y_MAP)
        return ebb_load_fail_at(ld, bl, "blocks must be a map {name: NODE}, got %s", ebb_load_describe(ld, bl));
    for (int i = 0; i < bl->n; i++) {
        const ynode *k = ymap_key(bl, i);
        size_t m = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, ".%s", k->text);
        if (!ebb_load_is_ident(k->text))
            return ebb_load_fail_at(ld, k,
                                    "a block name is letters, digits and '_', starting with a "
                                    "letter or '_'; got '%.64s'",
                                    k->text);
        if (ebb_op_find(k->text))
            return ebb_load_fail_at(ld, k, "block '%s' has the name of an op; rename the block", k->text);
        if (ebb_load_is_step_key(k->text))
            return ebb_load_fail_at(ld, k, "block '%s' has the name of a step; rename the block",
                                    k->text);
        ebb_load_sb_reset(&ld->kp, m);
    }
    ld->blocks = bl;
    ld->block_used = calloc((size_t)(bl->n ? bl->n : 1), sizeof *ld->block_used);
    if (!ld->block_used)
        return ebb_load_nomem(ld, bl);
    ebb_load_sb_reset(&ld->kp, 0);
    return 0;
}

/* Reads `outputs`: the first names the final stream, the rest are tags that
 * must exist in the main flow (checked after it is read). */
static int read_outputs(loader *ld, ebb_builder *b, const ynode *out) {
    ebb_load_sb_printf(&ld->kp, "outputs");
    if (out->kind != Y_SEQ || out->n == 0)
        return ebb_load_fail_at(ld, out, "outputs must be a list of names like [y, h], got %s",
                                out->kind == Y_SEQ ? "an empty list" : ebb_load_describe(ld, out));
    for (int i = 0; i < out->n; i++) {
        const ynode *o = out->items[i];
        size_t m = ebb_load_sb_mark(&ld->kp);
        ebb_load_sb_printf(&ld->kp, "[%d]", i);
        const char *name = NULL;
        if (ebb_load_read_name(ld, o, "an output", &name) != 0) return -1;
        if (!ebb_load_is_tag_name(name))
            return ebb_load_fail_at(ld, o,
                                    "an output name is letters, digits, '_' and '-', starting "
                                    "with a letter or '_'; got '%.64s'",
                                    name);
        for (int j = 0; j < i; j++)
            if (strcmp(out->items[j]->text, name) == 0)
                return ebb_load_fail_at(ld, o, "output '%s' is listed twice (first at line %d)",
                                        name, out->items[j]->line);
        if (i == 0)
            ebb_output_final(b, name);
        else
            ebb_output(b, name);
        if (ebb_load_check_builder(ld, b, o) != 0) return -1;
        ebb_load_sb_reset(&ld->kp, m);
    }
    ebb_load_sb_reset(&ld->kp, 0);
    return 0;
}

static int check_outputs(loader *ld, const ynode *out, const scope *sc) {
    ebb_load_sb_printf(&ld->kp, "outputs");
    for (int i = 1; i < out->n; i++) {
        const ynode *o = out->items[i];
        if (ebb_load_scope_find(sc, o->text)) continue;
        ebb_load_sb_printf(&ld->kp, "[%d]", i);
        suggest s = {.word = o->text};
        for (int j = 0; j < sc->n; j++)
            ebb_load_suggest_try(&s, sc->tags[j].name);
        char sb[128];
        return ebb_load_fail_at(ld, o, "output '%s' is not a tag of the flow%s", o->text,
                                ebb_load_suggest_text(&s, sb, sizeof sb, ""));
    }
    ebb_load_sb_reset(&ld->kp, 0);
    return 0;
}

/* "dir/mlp.yaml" -> "mlp" */
static char *default_name(arena *a, const char *file) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    return ebb_arena_strndup(a, base, n);
}

static int load_tree(loader *ld, const ynode *root) {
    ebb_spec *s = ld->spec;
    if (!root)
        return ebb_load_fail_at(ld, NULL, "the spec is empty; a spec starts with 'ebb: %d'", EBB_SPEC_FORMAT);
    if (root->kind != Y_MAP)
        return ebb_load_fail_at(ld, root,
                                "a spec is a map of keys (ebb, inputs, flow, ...), got %s",
                                ebb_load_describe(ld, root));
    if (ebb_load_check_keys(ld, root, "the spec", TOP_KEYS) != 0) return -1;
    const ynode *ver = ebb_ymap_get(root, "ebb");
    if (!ver)
        return ebb_load_fail_at(ld, root, "missing 'ebb: %d' (the format version)", EBB_SPEC_FORMAT);
    int64_t version = 0;
    ebb_load_sb_printf(&ld->kp, "ebb");
    if (ebb_load_read_number(ld, ver, 1, "the format version", &version, NULL) != 0) return -1;
    if (version != EBB_SPEC_FORMAT)
        return ebb_load_fail_at(ld, ver,
                                "format version %lld is not supported; this ebb reads format %d",
                                (long long)version, EBB_SPEC_FORMAT);
    ebb_load_sb_reset(&ld->kp, 0);

    const ynode *name = ebb_ymap_get(root, "name");
    if (name) {
        ebb_load_sb_printf(&ld->kp, "name");
        if (ebb_load_read_name(ld, name, "the graph name", &s->name) != 0) return -1;
        if (!ebb_graph_valid_node_name(s->name))
            return ebb_load_fail_at(ld, name,
                                    "a graph name is letters, digits, '_', '-' and inner '.'; "
                                    "got '%.64s'",
                                    s->name);
        ebb_load_sb_reset(&ld->kp, 0);
    } else {
        s->name = default_name(&s->mem, s->file);
        if (!s->name)
            return ebb_load_nomem(ld, root);
    }

    /* mixed precision, as --precision asks it (which overrides it) */
    const ynode *precision = ebb_ymap_get(root, "precision");
    if (precision) {
        ebb_load_sb_printf(&ld->kp, "precision");
        if (precision->kind != Y_SCALAR || ebb_load_is_null(precision) ||
            ebb_precision_parse(&s->precision, precision->text) != EBB_OK) {
            ebb_error_clear();
            return ebb_load_fail_at(ld, precision, "must be fp32, bf16 or fp16, got %s",
                                    ebb_load_describe(ld, precision));
        }
        ebb_load_sb_reset(&ld->kp, 0);
    }

    const ynode *params = ebb_ymap_get(root, "params");
    if (params && !ebb_load_is_null(params) && read_params(ld, params) != 0) return -1;
    const ynode *blocks = ebb_ymap_get(root, "blocks");
    if (blocks && !ebb_load_is_null(blocks) && read_blocks(ld, blocks) != 0) return -1;

    const ynode *inputs = ebb_ymap_get(root, "inputs");
    if (!inputs)
        return ebb_load_fail_at(ld, root, "missing 'inputs' (a map {name: [dims]})");
    scope top = {0};
    ebb_builder *b = NULL;
    int rc = read_inputs(ld, inputs, &top);
    if (rc == 0) {
        b = ebb_builder_new(s->name);
        if (!b)
            rc = ebb_load_nomem(ld, root);
    }
    for (int i = 0; rc == 0 && i < s->n_inputs; i++) {
        ebb_input(b, s->inputs[i].name);
        rc = ebb_load_check_builder(ld, b, ymap_key(inputs, i));
    }
    const ynode *targets = ebb_ymap_get(root, "targets");
    if (rc == 0 && targets)
        rc = read_targets(ld, targets);
    for (int i = 0; rc == 0 && i < s->n_targets; i++) {
        ebb_target(b, s->targets[i].name);
        rc = ebb_load_check_builder(ld, b, s->targets[i].at);
    }
    for (int i = 0; rc == 0 && i < root->n; i++)
        if (strcmp(ymap_key(root, i)->text, "loss") == 0)
            rc = read_loss(ld, b, ymap_key(root, i), ymap_value(root, i));
    const ynode *outputs = ebb_ymap_get(root, "outputs");
    if (rc == 0 && outputs)
        rc = read_outputs(ld, b, outputs);
    const ynode *flow = ebb_ymap_get(root, "flow");
    if (rc == 0 && !flow)
        rc = ebb_load_fail_at(ld, root, "missing 'flow' (the list of steps)");
    if (rc == 0) {
        ebb_load_sb_printf(&ld->kp, "flow");
        if (flow->kind != Y_SEQ || flow->n == 0)
            rc = ebb_load_fail_at(ld, flow, "flow must be a list of steps, got %s",
                                  flow->kind == Y_SEQ ? "an empty list"
                                                      : ebb_load_describe(ld, flow));
        if (rc == 0) {
            ebb_load_sb_printf(&ld->np, "flow");
            rc = ebb_load_build_flow(ld, b, &top, flow, 1);
        }
        ebb_load_sb_reset(&ld->kp, 0);
    }
    if (rc == 0 && outputs)
        rc = check_outputs(ld, outputs, &top);
    for (int i = 0; rc == 0 && ld->blocks && i < ld->blocks->n; i++)
        if (!ld->block_used[i]) {
            ebb_load_sb_printf(&ld->kp, "blocks.%s", ymap_key(ld->blocks, i)->text);
            rc = ebb_load_fail_at(ld, ymap_key(ld->blocks, i), "block '%s' is never used",
                                  ymap_key(ld->blocks, i)->text);
        }
    if (rc == 0) {
        s->graph = ebb_build(b);
        if (!s->graph)
            rc = ebb_load_fail_at(ld, flow, "%s", ebb_errmsg());
    }
    ebb_builder_free(b);
    free(top.tags);
    return rc;
}

/* ---- public API ------------------------------------------------------------------------------- */

void ebb_spec_free(ebb_spec *s) {
    if (!s)
        return;
    ebb_graph_free(s->graph);
    free(s->locs);
    ebb_arena_free(&s->mem);
    free(s);
}

/* ---- a spec around a graph built in C -------------------------------------------------------- */

/* Reads f->shape, "batch, 784" or "[batch, 784]", into x. */
static ebb_status parse_field_shape(const char *graph, const ebb_spec_field *f, spec_input *x,
                                    arena *mem) {
    const char *p = f->shape ? f->shape : "";
    p += strspn(p, " \t");
    int bracket = *p == '[';
    p += bracket;
    for (x->ndim = 0;; x->ndim++) {
        p += strspn(p, " \t");
        if (!*p || *p == ']') break;
        size_t len = strcspn(p, ", \t]");
        char *tok = ebb_arena_strndup(mem, p, len);
        if (!tok) return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_from_graph: out of memory");
        p += len;
        if (x->ndim == EBB_MAX_DIMS)
            return ebb_error_set(EBB_ERR_ARG, "%s: '%s' has shape '%s', more than %d dimensions",
                                 graph, f->name, f->shape, EBB_MAX_DIMS);
        char *end = NULL;
        errno = 0;
        long long v = isdigit((unsigned char)tok[0]) ? strtoll(tok, &end, 10) : 0;
        x->sym[x->ndim] = NULL;
        if (end && !*end && !errno && v >= 1 && v <= INT64_MAX / 1024)
            x->dim[x->ndim] = v;
        else if (!end && ebb_load_is_ident(tok))
            x->dim[x->ndim] = -1, x->sym[x->ndim] = tok;
        else
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: '%s' has shape '%s': a dimension is a size of 1 or more or "
                                 "a symbolic name like batch, got '%s'",
                                 graph, f->name, f->shape, tok);
        p += strspn(p, " \t");
        if (*p == ',') p++;
    }
    if ((*p == ']') != bracket || (bracket && p[1 + strspn(p + 1, " \t")] != '\0'))
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: '%s' has shape '%s': expected dimensions like \"batch, 784\" "
                             "or \"[batch, 784]\"",
                             graph, f->name, f->shape ? f->shape : "(null)");
    return EBB_OK;
}

/* Fills list[0..count) from the fields that name graph's `names`, in the
 * graph's order; `what` is "input" or "target". */
static ebb_status take_fields(ebb_spec *s, const char *what, int count,
                              const char *(*name_at)(const ebb_graph *, int),
                              const ebb_spec_field *fields, int n, int *used, spec_input **out) {
    const char *graph = s->name;
    spec_input *list = count ? ebb_arena_alloc(&s->mem, (size_t)count * sizeof *list) : NULL;
    if (count && !list) return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_from_graph: out of memory");
    for (int i = 0; i < count; i++) {
        const char *name = name_at(s->graph, i);
        int at = -1;
        for (int k = 0; k < n; k++) {
            if (!fields[k].name || strcmp(fields[k].name, name) != 0) continue;
            if (at >= 0)
                return ebb_error_set(EBB_ERR_ARG, "%s: %s '%s' is declared twice (fields %d and %d)",
                                     graph, what, name, at, k);
            at = k;
        }
        if (at < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: %s '%s' has no field giving its shape", graph,
                                 what, name);
        used[at] = 1;
        spec_input *x = &list[i];
        memset(x, 0, sizeof *x);
        x->name = name;
        ebb_status st = parse_field_shape(graph, &fields[at], x, &s->mem);
        if (st != EBB_OK) return st;
        if (fields[at].dtype) {
            if (ebb_dtype_parse(&x->dtype, fields[at].dtype) != EBB_OK)
                return ebb_error_set(EBB_ERR_ARG, "%s: %s '%s' has dtype '%s': %s", graph, what,
                                     name, fields[at].dtype, ebb_errmsg());
            x->has_dtype = 1;
        }
    }
    *out = list;
    return EBB_OK;
}

static ebb_status from_graph(ebb_spec *s, const ebb_spec_field *fields, int n) {
    const ebb_graph *g = s->graph;
    int *used = calloc((size_t)(n ? n : 1), sizeof *used);
    if (!used) return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_from_graph: out of memory");
    ebb_status st = take_fields(s, "input", ebb_graph_input_count(g), ebb_graph_input_name, fields,
                                n, used, &s->inputs);
    if (st == EBB_OK)
        st = take_fields(s, "target", ebb_graph_target_count(g), ebb_graph_target_name, fields, n,
                         used, &s->targets);
    for (int k = 0; st == EBB_OK && k < n; k++)
        if (!used[k])
            st = ebb_error_set(EBB_ERR_ARG,
                               "%s: field %d ('%s') is neither an input nor a target of the graph "
                               "(%d input%s, %d target%s)",
                               s->name, k, fields[k].name ? fields[k].name : "(null)",
                               ebb_graph_input_count(g), ebb_graph_input_count(g) == 1 ? "" : "s",
                               ebb_graph_target_count(g), ebb_graph_target_count(g) == 1 ? "" : "s");
    free(used);
    if (st == EBB_OK) {
        s->n_inputs = ebb_graph_input_count(g);
        s->n_targets = ebb_graph_target_count(g);
    }
    return st;
}

ebb_status ebb_spec_from_graph(ebb_spec **out, const ebb_graph *g, const ebb_spec_field *fields,
                               int n) {
    if (!out || !g || n < 0 || (n > 0 && !fields))
        return ebb_error_set(EBB_ERR_ARG, "ebb_spec_from_graph: %s",
                             !out ? "out is NULL" : !g ? "graph is NULL" : "bad fields");
    *out = NULL;
    ebb_spec *s = calloc(1, sizeof *s);
    if (!s) return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_from_graph: out of memory");
    s->loss_loc = -1;
    s->precision = EBB_PRECISION_DEFAULT;
    s->graph = ebb_graph_ref(g);
    s->name = s->file = ebb_arena_strdup(&s->mem, ebb_graph_name(g));
    ebb_status st = s->file ? from_graph(s, fields, n)
                            : ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_from_graph: out of memory");
    if (st != EBB_OK) {
        ebb_spec_free(s);
        return st;
    }
    *out = s;
    return EBB_OK;
}

/* Checks "name=number" overrides before anything is parsed. */
static ebb_status check_overrides(const ebb_spec_options *opts) {
    if (!opts || opts->n_params == 0)
        return EBB_OK;
    if (opts->n_params < 0 || opts->n_params > EBB_SPEC_MAX_OVERRIDES || !opts->params)
        return ebb_error_set(EBB_ERR_ARG, "spec params: %d overrides given (at most %d)",
                             opts->n_params, EBB_SPEC_MAX_OVERRIDES);
    for (int i = 0; i < opts->n_params; i++) {
        const char *ov = opts->params[i], *eq = ov ? strchr(ov, '=') : NULL;
        if (!eq || eq == ov)
            return ebb_error_set(EBB_ERR_ARG, "spec param '%s': expected NAME=NUMBER",
                                 ov ? ov : "(null)");
        num_form f = ebb_load_number_form(eq + 1);
        double v = strtod(eq + 1, NULL);
        if (f != NUM_INT && f != NUM_FLOAT)
            return ebb_error_set(EBB_ERR_ARG, "spec param '%s': '%s' is not a number", ov, eq + 1);
        if (!isfinite(v))
            return ebb_error_set(EBB_ERR_ARG, "spec param '%s': the value is not finite", ov);
        for (int j = 0; j < i; j++)
            if (!strncmp(opts->params[j], ov, (size_t)(eq - ov) + 1))
                return ebb_error_set(EBB_ERR_ARG, "spec param '%.*s' given twice",
                                     (int)(eq - ov), ov);
    }
    return EBB_OK;
}

ebb_status ebb_spec_load_string(ebb_spec **out, const char *text, size_t len,
                                const char *display_name) {
    return ebb_spec_load_string_ex(out, text, len, display_name, NULL);
}

ebb_status ebb_spec_load_string_ex(ebb_spec **out, const char *text, size_t len,
                                   const char *display_name, const ebb_spec_options *opts) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_spec_load_string: out is NULL");
    *out = NULL;
    ebb_status ost = check_overrides(opts);
    if (ost != EBB_OK)
        return ost;
    if (!text && len)
        return ebb_error_set(EBB_ERR_ARG, "ebb_spec_load_string: text is NULL");
    const char *file = display_name ? display_name : "<string>";
    if (len > EBB_SPEC_MAX_BYTES)
        return ebb_error_set(EBB_ERR_SPEC, "%s:1:1: error: the spec is %zu bytes; the limit is %d",
                             file, len, EBB_SPEC_MAX_BYTES);
    ebb_spec *s = calloc(1, sizeof *s);
    if (!s)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_load_string: out of memory");
    s->loss_loc = -1;
    s->file = ebb_arena_strdup(&s->mem, file);
    if (!s->file) {
        ebb_spec_free(s);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_load_string: out of memory");
    }
    loader *ld = calloc(1, sizeof *ld);
    if (!ld) {
        ebb_spec_free(s);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_load_string: out of memory");
    }
    ld->spec = s;
    ld->file = s->file;
    ld->copy = -1;
    if (opts) {
        ld->overrides = opts->params;
        ld->n_overrides = opts->n_params;
    }
    ynode *root = NULL;
    /* the tree lives in the spec's arena: names in the spec point into it */
    int rc = ebb_spec_yaml_parse(&s->mem, text ? text : "", len, s->file, &root, ld->err,
                             sizeof ld->err);
    if (rc != 0)
        ld->failed = 1;
    else
        rc = load_tree(ld, root);
    for (int o = 0; rc == 0 && o < ld->n_overrides; o++)
        if (!ld->override_used[o]) {
            const char *ov = ld->overrides[o];
            snprintf(ld->err, sizeof ld->err, "%s: no param '%.*s' to set (the spec's params:%s%s",
                     s->file, (int)(strchr(ov, '=') - ov), ov, s->n_params ? " " : " none",
                     s->n_params ? s->params[0].name : "");
            for (int i = 1; i < s->n_params; i++) {
                size_t at = strlen(ld->err);
                snprintf(ld->err + at, sizeof ld->err - at, ", %s", s->params[i].name);
            }
            size_t at = strlen(ld->err);
            snprintf(ld->err + at, sizeof ld->err - at, ")");
            rc = -1;
        }
    free(ld->kp.s);
    free(ld->np.s);
    free(ld->names);
    free(ld->block_used);
    ebb_status st = EBB_OK;
    if (rc != 0) {
        int oom = strstr(ld->err, ": out of memory") != NULL;
        st = ebb_error_set(oom ? EBB_ERR_NOMEM : EBB_ERR_SPEC, "%s", ld->err);
        ebb_spec_free(s);
        s = NULL;
    }
    free(ld);
    *out = s;
    return st;
}

ebb_status ebb_spec_load(ebb_spec **out, const char *path) {
    return ebb_spec_load_ex(out, path, NULL);
}

ebb_status ebb_spec_load_ex(ebb_spec **out, const char *path, const ebb_spec_options *opts) {
    if (!out || !path)
        return ebb_error_set(EBB_ERR_ARG, "ebb_spec_load: %s is NULL", out ? "path" : "out");
    *out = NULL;
    /* non-blocking, so a FIFO cannot hang the open; only a regular file is read */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return ebb_error_set(EBB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return ebb_error_set(EBB_ERR_IO, "%s: cannot read: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ebb_error_set(EBB_ERR_IO, "%s is %s, not a spec file", path,
                             S_ISDIR(sb.st_mode)    ? "a directory"
                             : S_ISFIFO(sb.st_mode) ? "a FIFO"
                             : S_ISCHR(sb.st_mode)  ? "a character device"
                             : S_ISBLK(sb.st_mode)  ? "a block device"
                             : S_ISSOCK(sb.st_mode) ? "a socket"
                                                    : "not a regular file");
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        return ebb_error_set(EBB_ERR_IO, "%s: cannot open: %s", path, strerror(err));
    }
    size_t cap = 64 * 1024, len = 0;
    char *buf = malloc(cap);
    /* read one byte past the limit, to tell "too large" from "just fits" */
    for (;;) {
        if (!buf)
            break;
        if (len == cap) {
            if (cap > EBB_SPEC_MAX_BYTES)
                break;
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf)
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory reading the spec", path);
    if (bad) {
        free(buf);
        return ebb_error_set(EBB_ERR_IO, "%s: read error", path);
    }
    if (len > EBB_SPEC_MAX_BYTES) {
        free(buf);
        return ebb_error_set(EBB_ERR_SPEC, "%s:1:1: error: the spec is larger than %d bytes (the "
                                           "limit)",
                             path, EBB_SPEC_MAX_BYTES);
    }
    ebb_status st = ebb_spec_load_string_ex(out, buf, len, path, opts);
    free(buf);
    return st;
}

const ebb_graph *ebb_spec_graph(const ebb_spec *s) { return s ? s->graph : NULL; }
const char *ebb_spec_name(const ebb_spec *s) { return s ? s->name : NULL; }
const char *ebb_spec_file(const ebb_spec *s) { return s ? s->file : NULL; }
ebb_precision ebb_spec_precision(const ebb_spec *s) {
    return s ? s->precision : EBB_PRECISION_DEFAULT;
}
int ebb_spec_input_count(const ebb_spec *s) { return s ? s->n_inputs : 0; }

const char *ebb_spec_input_name(const ebb_spec *s, int i) {
    return s && i >= 0 && i < s->n_inputs ? s->inputs[i].name : NULL;
}

int ebb_spec_input_ndim(const ebb_spec *s, int i) {
    return s && i >= 0 && i < s->n_inputs ? s->inputs[i].ndim : -1;
}

int64_t ebb_spec_input_dim(const ebb_spec *s, int i, int d, const char **symbol) {
    if (symbol)
        *symbol = NULL;
    if (!s || i < 0 || i >= s->n_inputs || d < 0 || d >= s->inputs[i].ndim)
        return -1;
    if (symbol)
        *symbol = s->inputs[i].sym[d];
    return s->inputs[i].dim[d];
}

int ebb_spec_param_count(const ebb_spec *s) { return s ? s->n_params : 0; }

const char *ebb_spec_param_name(const ebb_spec *s, int i) {
    return s && i >= 0 && i < s->n_params ? s->params[i].name : NULL;
}

double ebb_spec_param_value(const ebb_spec *s, int i) {
    return s && i >= 0 && i < s->n_params ? s->params[i].value : 0.0;
}

int ebb_spec_input_dtype(const ebb_spec *s, int i, ebb_dtype *dtype) {
    if (!s || i < 0 || i >= s->n_inputs || !s->inputs[i].has_dtype)
        return 0;
    if (dtype)
        *dtype = s->inputs[i].dtype;
    return 1;
}

int ebb_spec_target_count(const ebb_spec *s) { return s ? s->n_targets : 0; }

const char *ebb_spec_target_name(const ebb_spec *s, int i) {
    return s && i >= 0 && i < s->n_targets ? s->targets[i].name : NULL;
}

int ebb_spec_target_ndim(const ebb_spec *s, int i) {
    return s && i >= 0 && i < s->n_targets ? s->targets[i].ndim : -1;
}

int64_t ebb_spec_target_dim(const ebb_spec *s, int i, int d, const char **symbol) {
    if (symbol)
        *symbol = NULL;
    if (!s || i < 0 || i >= s->n_targets || d < 0 || d >= s->targets[i].ndim)
        return -1;
    if (symbol)
        *symbol = s->targets[i].sym[d];
    return s->targets[i].dim[d];
}

int ebb_spec_target_dtype(const ebb_spec *s, int i, ebb_dtype *dtype) {
    if (!s || i < 0 || i >= s->n_targets || !s->targets[i].has_dtype)
        return 0;
    if (dtype)
        *dtype = s->targets[i].dtype;
    return 1;
}

/* Whether any input or target has the symbolic dimension bnd[0..nl). */
static int has_symbol(const spec_input *list, int count, const char *bnd, size_t nl,
                      suggest *sg) {
    int found = 0;
    for (int i = 0; i < count; i++)
        for (int d = 0; d < list[i].ndim; d++) {
            const char *sym = list[i].sym[d];
            if (!sym)
                continue;
            if (strlen(sym) == nl && strncmp(sym, bnd, nl) == 0)
                found = 1;
            ebb_load_suggest_try(sg, sym);
        }
    return found;
}

/* ebb_spec_resolve_shapes() for `list` (the inputs or the targets); the
 * bindings may name a symbol of either, as they share their symbols. */
static ebb_status resolve_shapes(const ebb_spec *s, const spec_input *list, int count,
                                 const char *call, const char *what, const char *const *bindings,
                                 int n, ebb_shape *shapes, int max_shapes) {
    if (!s || !shapes || (n > 0 && !bindings))
        return ebb_error_set(EBB_ERR_ARG, "%s: NULL argument", call);
    if (max_shapes < count)
        return ebb_error_set(EBB_ERR_ARG, "%s: room for %d shapes, the spec has %d %s", call,
                             max_shapes, count, what);
    /* check every binding first: a typo should not pass silently */
    for (int j = 0; j < n; j++) {
        const char *bnd = bindings[j];
        const char *eq = bnd ? strchr(bnd, '=') : NULL;
        if (!eq || eq == bnd)
            return ebb_error_set(EBB_ERR_ARG, "%s: binding '%s' is not name=size", s->file,
                                 bnd ? bnd : "(null)");
        char *end = NULL;
        errno = 0;
        long long v = strtoll(eq + 1, &end, 10);
        if (end == eq + 1 || *end || errno || v < 1)
            return ebb_error_set(EBB_ERR_ARG, "%s: binding '%s': the size must be an integer >= 1",
                                 s->file, bnd);
        size_t nl = (size_t)(eq - bnd);
        suggest sg = {0};
        char word[65];
        snprintf(word, sizeof word, "%.*s", (int)(nl < 64 ? nl : 64), bnd);
        sg.word = word;
        int found = has_symbol(s->inputs, s->n_inputs, bnd, nl, &sg);
        found |= has_symbol(s->targets, s->n_targets, bnd, nl, &sg);
        if (!found) {
            char sb[128];
            return ebb_error_set(EBB_ERR_ARG, "%s: no input%s has a symbolic dimension '%s'%s",
                                 s->file, s->n_targets ? " or target" : "", word,
                                 ebb_load_suggest_text(&sg, sb, sizeof sb, ""));
        }
    }
    for (int i = 0; i < count; i++) {
        const spec_input *x = &list[i];
        shapes[i].ndim = x->ndim;
        for (int d = 0; d < x->ndim; d++) {
            int64_t v = x->dim[d];
            if (x->sym[d]) {
                v = 1;
                size_t sl = strlen(x->sym[d]);
                for (int j = 0; j < n; j++) /* the last binding of a name wins */
                    if (strncmp(bindings[j], x->sym[d], sl) == 0 && bindings[j][sl] == '=')
                        v = strtoll(bindings[j] + sl + 1, NULL, 10);
            }
            shapes[i].dim[d] = v;
        }
    }
    return EBB_OK;
}

ebb_status ebb_spec_resolve_shapes(const ebb_spec *s, const char *const *bindings, int n,
                                   ebb_shape *shapes, int max_shapes) {
    return resolve_shapes(s, s ? s->inputs : NULL, s ? s->n_inputs : 0, "ebb_spec_resolve_shapes",
                          "inputs", bindings, n, shapes, max_shapes);
}

ebb_status ebb_spec_resolve_target_shapes(const ebb_spec *s, const char *const *bindings, int n,
                                          ebb_shape *shapes, int max_shapes) {
    return resolve_shapes(s, s ? s->targets : NULL, s ? s->n_targets : 0,
                          "ebb_spec_resolve_target_shapes", "targets", bindings, n, shapes,
                          max_shapes);
}

static int path_boundary_ok(const char *msg, const char *at, size_t len) {
    if (at > msg) {
        char c = at[-1];
        if (isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-')
            return 0;
    }
    char c = at[len];
    if (isalnum((unsigned char)c) || c == '_' || c == '-')
        return 0;
    if (c == '.' && (isalnum((unsigned char)at[len + 1]) || at[len + 1] == '_'))
        return 0;
    return 1;
}

/* The location whose path is the longest one named in msg, or NULL. */
static const spec_loc *find_loc_in(const ebb_spec *s, const char *msg, int skip) {
    const spec_loc *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < s->n_locs; i++) {
        const spec_loc *l = &s->locs[i];
        if (i == skip)
            continue;
        size_t len = strlen(l->path);
        if (len < best_len) /* on a tie the later entry, the node, beats its step */
            continue;
        for (const char *p = strstr(msg, l->path); p; p = strstr(p + 1, l->path))
            if (path_boundary_ok(msg, p, len)) {
                best = l;
                best_len = len;
                break;
            }
    }
    return best;
}

int ebb_spec_locate(const ebb_spec *s, const char *node_path, int *line, int *col,
                    const char **key_path) {
    if (!s || !node_path)
        return 0;
    for (int i = s->n_locs - 1; i >= 0; i--)
        if (strcmp(s->locs[i].path, node_path) == 0) {
            if (line)
                *line = s->locs[i].line;
            if (col)
                *col = s->locs[i].col;
            if (key_path)
                *key_path = s->locs[i].key;
            return 1;
        }
    return 0;
}

const char *ebb_spec_node_label(void *spec, const char *node_path) {
    const char *key = NULL;
    if (!spec || !node_path || !ebb_spec_locate(spec, node_path, NULL, NULL, &key) || !key)
        return NULL;
    static const char prefix[] = "blocks.";
    return strncmp(key, prefix, sizeof prefix - 1) == 0 ? key + sizeof prefix - 1 : NULL;
}

/* ebb_spec_annotate_error(), with locs[skip] left out (-1: none). */
static ebb_status annotate(const ebb_spec *s, ebb_status status, int skip) {
    if (!s || status == EBB_OK)
        return status;
    const char *msg = ebb_errmsg();
    if (strncmp(msg, s->file, strlen(s->file)) == 0 && msg[strlen(s->file)] == ':')
        return status; /* already points into the file */
    const spec_loc *l = find_loc_in(s, msg, skip);
    if (!l)
        return status;
    size_t n = strlen(msg) + 1;
    char *copy = malloc(n);
    if (!copy)
        return status;
    memcpy(copy, msg, n);
    ebb_error_set(status, "%s:%d:%d: error: %s%s%s%s%s%s", s->file, l->line, l->col, l->key,
                  l->key[0] ? ": " : "", copy, l->note ? " (" : "", l->note ? l->note : "",
                  l->note ? ")" : "");
    free(copy);
    return status;
}

ebb_status ebb_spec_annotate_error(const ebb_spec *s, ebb_status status) {
    return annotate(s, status, -1);
}

/* The dtypes a spec declares for `list`, the others `fallback`; NULL (and
 * *st EBB_OK) when it declares none. */
static ebb_dtype *spec_dtypes(const spec_input *list, int count, ebb_dtype fallback,
                              ebb_status *st) {
    *st = EBB_OK;
    int any = 0;
    for (int i = 0; i < count; i++)
        any |= list[i].has_dtype;
    if (!any)
        return NULL;
    ebb_dtype *dt = malloc((size_t)count * sizeof *dt);
    if (!dt) {
        *st = ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_compile: out of memory");
        return NULL;
    }
    for (int i = 0; i < count; i++)
        dt[i] = list[i].has_dtype ? list[i].dtype : fallback;
    return dt;
}

ebb_status ebb_spec_compile(ebb_plan **out, const ebb_spec *s, const ebb_compile_options *opts) {
    if (!out || !s)
        return ebb_error_set(EBB_ERR_ARG, "ebb_spec_compile: %s is NULL", out ? "spec" : "out");
    *out = NULL;
    ebb_compile_options o = {0};
    if (opts)
        o = *opts;
    if (o.precision == EBB_PRECISION_DEFAULT)
        o.precision = s->precision;
    ebb_shape shapes[64];
    if (!o.input_shapes) {
        if (s->n_inputs > 64)
            return ebb_error_set(EBB_ERR_ARG, "ebb_spec_compile: more than 64 inputs; pass shapes");
        ebb_status st = ebb_spec_resolve_shapes(s, NULL, 0, shapes, 64);
        if (st != EBB_OK)
            return st;
        o.input_shapes = shapes;
        o.n_input_shapes = s->n_inputs;
    }
    ebb_status st = EBB_OK;
    ebb_dtype *input_dtypes = NULL, *target_dtypes = NULL;
    ebb_shape *target_shapes = NULL;
    ebb_train_options t;
    if (!o.input_dtypes) {
        input_dtypes = spec_dtypes(s->inputs, s->n_inputs, o.dtype, &st);
        o.input_dtypes = input_dtypes;
    }
    if (st == EBB_OK && o.train) {
        t = *o.train;
        if (!t.target_shapes && s->n_targets > 0) {
            target_shapes = malloc((size_t)s->n_targets * sizeof *target_shapes);
            if (!target_shapes)
                st = ebb_error_set(EBB_ERR_NOMEM, "ebb_spec_compile: out of memory");
            else
                st = ebb_spec_resolve_target_shapes(s, NULL, 0, target_shapes, s->n_targets);
            t.target_shapes = target_shapes;
            t.n_target_shapes = s->n_targets;
        }
        if (st == EBB_OK && !t.target_dtypes) {
            target_dtypes = spec_dtypes(s->targets, s->n_targets, o.dtype, &st);
            t.target_dtypes = target_dtypes;
        }
        o.train = &t;
    }
    /* a loss the options name is not the one the file declares */
    if (st == EBB_OK)
        st = annotate(s, ebb_compile(out, s->graph, &o),
                      o.train && o.train->loss ? s->loss_loc : -1);
    free(input_dtypes);
    free(target_dtypes);
    free(target_shapes);
    return st;
}

