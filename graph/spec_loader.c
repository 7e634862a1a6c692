/* The spec loader's state and its small helpers: errors recorded at a YAML
 * node with the key path, suggestions for misspelt names, names and
 * scalars read, locations kept for later errors, tags in scope. */
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

/* ---- small strings ---------------------------------------------------------- */

size_t ebb_load_sb_mark(const strbuf *b) {
    return b->len;
}

void ebb_load_sb_reset(strbuf *b, size_t mark) {
    b->len = mark;
    if (b->s)
        b->s[mark] = '\0';
}

void ebb_load_sb_printf(strbuf *b, const char *fmt, ...) {
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int k = b->s ? vsnprintf(b->s + b->len, room, fmt, ap) : -2;
        va_end(ap);
        if (k >= 0 && (size_t)k < room) {
            b->len += (size_t)k;
            return;
        }
        if (k == -1) {
            b->oom = 1;
            return;
        }
        size_t need = b->len + (k > 0 ? (size_t)k : 0) + 64;
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < need)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            if (b->s)
                b->s[b->len] = '\0';
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

const char *ebb_load_sb_str(const strbuf *b) {
    return b->s ? b->s : "";
}

/* ---- errors ------------------------------------------------------------------ */

/* Records the first error, at a YAML node, with the current key path. The
 * message goes to ebb_error_set only at the end, after every builder has
 * been freed, so nothing can overwrite it. */
int ebb_load_fail_at(loader *ld, const ynode *at, const char *fmt, ...) {
    if (ld->failed)
        return -1;
    ld->failed = 1;
    int line = at ? at->line : 1, col = at ? at->col : 1;
    const char *kp = ebb_load_sb_str(&ld->kp);
    int k = snprintf(ld->err, sizeof ld->err, "%s:%d:%d: error: %s%s", ld->file, line, col, kp,
                     kp[0] ? ": " : "");
    if (k < 0 || (size_t)k >= sizeof ld->err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(ld->err + k, sizeof ld->err - (size_t)k, fmt, ap);
    va_end(ap);
    if (m >= 0 && ld->n_stack > 0 && (size_t)(k + m) < sizeof ld->err) {
        const block_use *u = &ld->stack[ld->n_stack - 1];
        snprintf(ld->err + k + m, sizeof ld->err - (size_t)(k + m),
                 " (in block '%s', used at %s)", u->name, u->used_at);
    }
    return -1;
}

int ebb_load_nomem(loader *ld, const ynode *at) {
    return ebb_load_fail_at(ld, at, "out of memory");
}

static const char *kind_name(const ynode *y) {
    if (!y || ebb_load_is_null(y)) return "nothing";
    switch (y->kind) {
    case Y_SEQ: return "a list";
    case Y_MAP: return "a map";
    case Y_SCALAR: break;
    }
    return y->plain ? "a plain scalar" : "a quoted string";
}

/* What a YAML node is, for "expected X, got Y" messages: the scalar itself
 * when there is one. Uses the loader's buffer: one per message. */
const char *ebb_load_describe(loader *ld, const ynode *y) {
    if (!y || ebb_load_is_null(y) || y->kind != Y_SCALAR) return kind_name(y);
    snprintf(ld->desc, sizeof ld->desc, y->plain ? "'%.64s'" : "the string \"%.64s\"", y->text);
    return ld->desc;
}


void ebb_load_suggest_try(suggest *s, const char *cand) {
    if (!cand || strcmp(cand, s->word) == 0)
        return;
    int cap = (int)strlen(s->word) / 2 + 1;
    if (cap > 3)
        cap = 3;
    int d = ebb_edit_distance(s->word, cand, cap);
    if (d <= cap && (!s->best || d < s->dist)) {
        s->best = cand;
        s->dist = d;
    }
}

/* "; did you mean 'x'?" or "" (static storage per call site is fine: used
 * immediately in one ebb_load_fail_at). */
const char *ebb_load_suggest_text(const suggest *s, char *buf, size_t size, const char *prefix) {
    if (!s->best)
        return "";
    snprintf(buf, size, "; did you mean '%s%s'?", prefix, s->best);
    return buf;
}

/* What users of PyTorch write for an op ebb names otherwise, compared
 * without case (RMSNorm, LayerNorm): the suggestion wins over any spelling
 * that is merely close (`view` is near `silu`, and means `reshape`). */
static const char *const torch_spellings[][2] = {
    {"arange", "positions"},
    {"view", "reshape"},
    {"chunk", "narrow"},
    {"subtract", "sub"},
    {"divide", "div"},
    {"true_divide", "div"},
    {"multiply", "mul"},
    {"power", "pow"},
    {"clip", "clamp"},
    {"negative", "neg"},
    {"bmm", "matmul"},
    {"mm", "matmul"},
    {"swish", "silu"},
    {"rope", "rotary_embedding"},
    {"apply_rotary_emb", "rotary_embedding"},
    {"repeat_interleave", "repeat_kv"},
    {"rmsnorm", "rms_norm"},
    {"layernorm", "layer_norm"},
    {"groupnorm", "group_norm"},
    {"batchnorm1d", "batch_norm"},
    {"batchnorm2d", "batch_norm"},
    {"sdpa", "scaled_dot_product_attention"},
    {"multiheadattention", "multi_head_attention"},
    {"concat", "cat"},
    {"concatenate", "cat"},
};

/* Whether a and b are the same word but for case. */
static int same_word(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
    return *a == *b;
}

void ebb_load_suggest_ops(suggest *s) {
    for (size_t i = 0; i < sizeof torch_spellings / sizeof *torch_spellings; i++)
        if (same_word(s->word, torch_spellings[i][0]) && ebb_op_find(torch_spellings[i][1])) {
            s->best = torch_spellings[i][1];
            s->dist = -1; /* nothing closer can replace it */
            return;
        }
    for (int i = 0; i < ebb_op_count(); i++) {
        const ebb_op *op = ebb_op_at(i);
        if (op->name[0] != '_')
            ebb_load_suggest_try(s, op->name);
    }
}

void ebb_load_suggest_blocks(loader *ld, suggest *s) {
    if (ld->blocks)
        for (int i = 0; i < ld->blocks->n; i++)
            ebb_load_suggest_try(s, ymap_key(ld->blocks, i)->text);
}

/* ---- names and scalars ------------------------------------------------------------ */

int ebb_load_is_ident(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_'))
            return 0;
    return 1;
}

/* The builder's rule for tags and inputs: [A-Za-z_][A-Za-z0-9_-]* */
int ebb_load_is_tag_name(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '-'))
            return 0;
    return 1;
}


int ebb_load_is_null(const ynode *y) {
    return !y || (y->kind == Y_SCALAR && y->plain &&
                  (y->len == 0 || !strcmp(y->text, "~") || !strcmp(y->text, "null")));
}


num_form ebb_load_number_form(const char *s) {
    const char *p = s;
    if (*p == '+' || *p == '-')
        p++;
    const char *digits = p;
    while (isdigit((unsigned char)*p))
        p++;
    size_t n_int = (size_t)(p - digits);
    int is_float = 0;
    if (*p == '.') {
        is_float = 1;
        p++;
        const char *f = p;
        while (isdigit((unsigned char)*p))
            p++;
        if (n_int == 0 && p == f)
            return NUM_NONE;
    } else if (n_int == 0) {
        return NUM_NONE;
    }
    if (*p == 'e' || *p == 'E') {
        is_float = 1;
        p++;
        if (*p == '+' || *p == '-')
            p++;
        const char *e = p;
        while (isdigit((unsigned char)*p))
            p++;
        if (p == e)
            return NUM_NONE;
    }
    if (*p)
        return NUM_NONE;
    if (!is_float && n_int > 1 && digits[0] == '0')
        return NUM_NONE; /* leading zero: octal in YAML 1.1 */
    return is_float ? NUM_FLOAT : NUM_INT;
}

const spec_param *ebb_load_find_param_n(const loader *ld, const char *name, size_t len) {
    for (int i = 0; i < ld->spec->n_params; i++)
        if (strlen(ld->spec->params[i].name) == len &&
            strncmp(ld->spec->params[i].name, name, len) == 0)
            return &ld->spec->params[i];
    return NULL;
}

const spec_param *ebb_load_find_param(const loader *ld, const char *name) {
    return ebb_load_find_param_n(ld, name, strlen(name));
}

int ebb_load_fail_undefined_param(loader *ld, const ynode *y, const char *name, size_t len) {
    char word[80];
    snprintf(word, sizeof word, "%.*s", (int)(len < 64 ? len : 64), name);
    suggest s = {.word = word};
    for (int i = 0; i < ld->spec->n_params; i++)
        ebb_load_suggest_try(&s, ld->spec->params[i].name);
    char sb[128];
    return ebb_load_fail_at(ld, y, "undefined param '$%s'%s", word, ebb_load_suggest_text(&s, sb, sizeof sb, "$"));
}

/* ---- locations --------------------------------------------------------------------- */

int ebb_load_add_loc(loader *ld, const char *path, const ynode *at) {
    ebb_spec *s = ld->spec;
    if (s->n_locs == s->cap_locs) {
        int cap = s->cap_locs ? s->cap_locs * 2 : 64;
        spec_loc *l = realloc(s->locs, (size_t)cap * sizeof *l);
        if (!l)
            return ebb_load_nomem(ld, at);
        s->locs = l;
        s->cap_locs = cap;
    }
    spec_loc *l = &s->locs[s->n_locs];
    l->path = ebb_arena_strdup(&s->mem, path);
    l->key = ebb_arena_strdup(&s->mem, ebb_load_sb_str(&ld->kp));
    l->line = at ? at->line : 1;
    l->col = at ? at->col : 1;
    l->note = NULL;
    if (ld->n_stack > 0) {
        const block_use *u = &ld->stack[ld->n_stack - 1];
        size_t n = strlen(u->name) + strlen(u->used_at) + 32;
        char *note = ebb_arena_alloc(&s->mem, n);
        if (note)
            snprintf(note, n, "in block '%s', used at %s", u->name, u->used_at);
        l->note = note;
        if (!note)
            return ebb_load_nomem(ld, at);
    }
    if (!l->path || !l->key || ld->kp.oom || ld->np.oom)
        return ebb_load_nomem(ld, at);
    s->n_locs++;
    return 0;
}

/* Counts a graph node or step against EBB_SPEC_MAX_NODES. */
int ebb_load_count_made(loader *ld, const ynode *at) {
    if (++ld->made > EBB_SPEC_MAX_NODES)
        return ebb_load_fail_at(
            ld, at,
            "the spec expands to more than %d graph nodes (the limit; repeat and "
            "block uses make copies)",
            EBB_SPEC_MAX_NODES);
    return 0;
}

/* After a builder call: a failure becomes an error at `at`. */
int ebb_load_check_builder(loader *ld, ebb_builder *b, const ynode *at) {
    if (ebb_builder_status(b) == EBB_OK)
        return 0;
    if (ebb_builder_status(b) == EBB_ERR_NOMEM)
        return ebb_load_nomem(ld, at);
    return ebb_load_fail_at(ld, at, "%s", ebb_builder_errmsg(b));
}

/* ---- tags -------------------------------------------------------------------------- */

const tagdef *ebb_load_scope_find(const scope *sc, const char *name) {
    for (; sc; sc = sc->parent)
        for (int i = 0; i < sc->n; i++)
            if (strcmp(sc->tags[i].name, name) == 0)
                return &sc->tags[i];
    return NULL;
}

int ebb_load_scope_add(loader *ld, scope *sc, const char *name, const ynode *at) {
    if (sc->n == sc->cap) {
        int cap = sc->cap ? sc->cap * 2 : 8;
        tagdef *t = realloc(sc->tags, (size_t)cap * sizeof *t);
        if (!t)
            return ebb_load_nomem(ld, at);
        sc->tags = t;
        sc->cap = cap;
    }
    sc->tags[sc->n++] = (tagdef){name, at};
    return 0;
}

