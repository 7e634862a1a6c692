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

#include "graph_internal.h"
#include "edit_distance.h"
#include "spec_yaml.h"

#define ERR_MAX 2048

/* ---- the loaded spec ---------------------------------------------------- */

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

/* ---- small strings ---------------------------------------------------------- */

static size_t sb_mark(const strbuf *b) { return b->len; }

static void sb_reset(strbuf *b, size_t mark) {
    b->len = mark;
    if (b->s)
        b->s[mark] = '\0';
}

static void sb_printf(strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_printf(strbuf *b, const char *fmt, ...) {
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

static const char *sb_str(const strbuf *b) { return b->s ? b->s : ""; }

/* ---- errors ------------------------------------------------------------------ */

/* Records the first error, at a YAML node, with the current key path. The
 * message goes to ebb_error_set only at the end, after every builder has
 * been freed, so nothing can overwrite it. */
static int fail_at(loader *ld, const ynode *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail_at(loader *ld, const ynode *at, const char *fmt, ...) {
    if (ld->failed)
        return -1;
    ld->failed = 1;
    int line = at ? at->line : 1, col = at ? at->col : 1;
    const char *kp = sb_str(&ld->kp);
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

static int nomem(loader *ld, const ynode *at) { return fail_at(ld, at, "out of memory"); }

static int is_null(const ynode *y);

static const char *kind_name(const ynode *y) {
    if (!y || is_null(y))
        return "nothing";
    switch (y->kind) {
    case Y_SEQ: return "a list";
    case Y_MAP: return "a map";
    case Y_SCALAR: break;
    }
    return y->plain ? "a plain scalar" : "a quoted string";
}

/* What a YAML node is, for "expected X, got Y" messages: the scalar itself
 * when there is one. Uses the loader's buffer: one per message. */
static const char *describe(loader *ld, const ynode *y) {
    if (!y || is_null(y) || y->kind != Y_SCALAR)
        return kind_name(y);
    snprintf(ld->desc, sizeof ld->desc, y->plain ? "'%.64s'" : "the string \"%.64s\"", y->text);
    return ld->desc;
}

/* ---- suggestions ---------------------------------------------------------------- */

typedef struct suggest {
    const char *word;
    const char *best;
    int dist;
} suggest;

static void suggest_try(suggest *s, const char *cand) {
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
 * immediately in one fail_at). */
static const char *suggest_text(const suggest *s, char *buf, size_t size, const char *prefix) {
    if (!s->best)
        return "";
    snprintf(buf, size, "; did you mean '%s%s'?", prefix, s->best);
    return buf;
}

static void suggest_ops(suggest *s) {
    for (int i = 0; i < ebb_op_count(); i++) {
        const ebb_op *op = ebb_op_at(i);
        if (op->name[0] != '_')
            suggest_try(s, op->name);
    }
}

static void suggest_blocks(loader *ld, suggest *s) {
    if (ld->blocks)
        for (int i = 0; i < ld->blocks->n; i++)
            suggest_try(s, ymap_key(ld->blocks, i)->text);
}

/* ---- names and scalars ------------------------------------------------------------ */

static int is_ident(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_'))
            return 0;
    return 1;
}

/* The builder's rule for tags and inputs: [A-Za-z_][A-Za-z0-9_-]* */
static int is_tag_name(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '-'))
            return 0;
    return 1;
}


static int is_null(const ynode *y) {
    return !y || (y->kind == Y_SCALAR && y->plain &&
                  (y->len == 0 || !strcmp(y->text, "~") || !strcmp(y->text, "null")));
}

/* A plain scalar that reads as a number: decimal only, so that YAML 1.1's
 * octal (010), sexagesimal (1:30) and underscores (1_000) cannot mislead. */
typedef enum { NUM_NONE, NUM_INT, NUM_FLOAT } num_form;

static num_form number_form(const char *s) {
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

static const spec_param *find_param_n(const loader *ld, const char *name, size_t len) {
    for (int i = 0; i < ld->spec->n_params; i++)
        if (strlen(ld->spec->params[i].name) == len &&
            strncmp(ld->spec->params[i].name, name, len) == 0)
            return &ld->spec->params[i];
    return NULL;
}

static const spec_param *find_param(const loader *ld, const char *name) {
    return find_param_n(ld, name, strlen(name));
}

static int fail_undefined_param(loader *ld, const ynode *y, const char *name, size_t len) {
    char word[80];
    snprintf(word, sizeof word, "%.*s", (int)(len < 64 ? len : 64), name);
    suggest s = {.word = word};
    for (int i = 0; i < ld->spec->n_params; i++)
        suggest_try(&s, ld->spec->params[i].name);
    char sb[128];
    return fail_at(ld, y, "undefined param '$%s'%s", word, suggest_text(&s, sb, sizeof sb, "$"));
}

/* ---- integer arithmetic on params ------------------------------------------------ */

/* Where a number is wanted, a plain scalar may compute it from params:
 * `$d*3`, `$d/$heads`, `($d+1)*2`, `-$d`. Integers only, with the usual
 * precedence; `/` must divide exactly, and overflow and division by zero are
 * errors. Every error points at the scalar. Parentheses and signs nest at
 * most EXPR_MAX_DEPTH deep, so a hostile scalar cannot exhaust the stack. */
#define EXPR_MAX_DEPTH 32

typedef struct expr {
    loader *ld;
    const ynode *at;   /* the scalar, for positions */
    const char *what;  /* "attribute 'out' of linear", for syntax errors */
    const char *p;     /* the next character */
    int depth;
} expr;

static void expr_space(expr *e) {
    while (isspace((unsigned char)*e->p))
        e->p++;
}

/* A syntax error: "WHAT must be an integer, got 'TEXT' (DETAIL)". */
static int expr_syntax(expr *e, const char *detail) {
    char near[40];
    if (*e->p)
        snprintf(near, sizeof near, "'%.16s'", e->p);
    else
        snprintf(near, sizeof near, "the end");
    return fail_at(e->ld, e->at, "%s must be an integer, got '%.64s' (%s at %s)", e->what,
                   e->at->text, detail, near);
}

static int expr_overflow(expr *e, int64_t a, char op, int64_t b) {
    return fail_at(e->ld, e->at, "in '%.64s': %lld %c %lld overflows a 64-bit integer",
                   e->at->text, (long long)a, op, (long long)b);
}

static int expr_deeper(expr *e) {
    if (++e->depth <= EXPR_MAX_DEPTH)
        return 0;
    return fail_at(e->ld, e->at, "in '%.64s': parentheses and signs nest more than %d deep",
                   e->at->text, EXPR_MAX_DEPTH);
}

static int expr_sum(expr *e, int64_t *out);

/* A number, a $param or a parenthesised expression. */
static int expr_primary(expr *e, int64_t *out) {
    expr_space(e);
    const char *start = e->p;
    if (*e->p == '(') {
        e->p++;
        if (expr_deeper(e) != 0 || expr_sum(e, out) != 0)
            return -1;
        expr_space(e);
        if (*e->p != ')')
            return expr_syntax(e, "a '(' lacks its ')'");
        e->p++;
        e->depth--;
        return 0;
    }
    if (*e->p == '$') {
        const char *name = ++e->p;
        if (!(isalpha((unsigned char)*name) || *name == '_'))
            return expr_syntax(e, "expected a param name after '$'");
        while (isalnum((unsigned char)*e->p) || *e->p == '_')
            e->p++;
        size_t len = (size_t)(e->p - name);
        const spec_param *p = find_param_n(e->ld, name, len);
        if (!p)
            return fail_undefined_param(e->ld, e->at, name, len);
        if (!p->is_int)
            return fail_at(e->ld, e->at, "in '%.64s': param $%s is %.17g; arithmetic takes "
                                         "integers only",
                           e->at->text, p->name, p->value);
        *out = p->ivalue;
        return 0;
    }
    if (isdigit((unsigned char)*e->p)) {
        while (isdigit((unsigned char)*e->p))
            e->p++;
        size_t len = (size_t)(e->p - start);
        if (*e->p == '.' || *e->p == 'e' || *e->p == 'E' || isalpha((unsigned char)*e->p) ||
            *e->p == '_') {
            while (isalnum((unsigned char)*e->p) || *e->p == '.' || *e->p == '_')
                e->p++;
            return fail_at(e->ld, e->at, "in '%.64s': '%.*s' is not an integer; arithmetic "
                                         "takes integers only",
                           e->at->text, (int)((size_t)(e->p - start) < 32 ? e->p - start : 32),
                           start);
        }
        if (len > 1 && start[0] == '0')
            return fail_at(e->ld, e->at, "in '%.64s': '%.*s' has a leading zero (YAML 1.1 "
                                         "reads such numbers as octal); write it without",
                           e->at->text, (int)(len < 32 ? len : 32), start);
        errno = 0;
        long long v = strtoll(start, NULL, 10);
        if (errno)
            return fail_at(e->ld, e->at, "in '%.64s': %.*s is out of range", e->at->text,
                           (int)(len < 32 ? len : 32), start);
        *out = v;
        return 0;
    }
    if (isalpha((unsigned char)*e->p) || *e->p == '_') {
        while (isalnum((unsigned char)*e->p) || *e->p == '_')
            e->p++;
        return fail_at(e->ld, e->at, "in '%.64s': '%.*s' is not a number or a $param (a "
                                     "symbolic dimension cannot take part in arithmetic)",
                       e->at->text, (int)(e->p - start < 32 ? e->p - start : 32), start);
    }
    return expr_syntax(e, "expected a number, a $param or '('");
}

/* A signed primary: -x, +x. */
static int expr_unary(expr *e, int64_t *out) {
    expr_space(e);
    if (*e->p != '-' && *e->p != '+')
        return expr_primary(e, out);
    char sign = *e->p++;
    int64_t v = 0;
    if (expr_deeper(e) != 0 || expr_unary(e, &v) != 0)
        return -1;
    e->depth--;
    if (sign == '-') {
        if (v == INT64_MIN)
            return fail_at(e->ld, e->at, "in '%.64s': -(%lld) overflows a 64-bit integer",
                           e->at->text, (long long)v);
        v = -v;
    }
    *out = v;
    return 0;
}

static int mul_fits(int64_t a, int64_t b) {
    if (a == 0 || b == 0)
        return 1;
    if (a > 0)
        return b > 0 ? a <= INT64_MAX / b : b >= INT64_MIN / a;
    return b > 0 ? a >= INT64_MIN / b : a >= INT64_MAX / b;
}

static int expr_product(expr *e, int64_t *out) {
    int64_t a = 0;
    if (expr_unary(e, &a) != 0)
        return -1;
    for (;;) {
        expr_space(e);
        char op = *e->p;
        if (op != '*' && op != '/')
            break;
        e->p++;
        int64_t b = 0;
        if (expr_unary(e, &b) != 0)
            return -1;
        if (op == '*') {
            if (!mul_fits(a, b))
                return expr_overflow(e, a, op, b);
            a *= b;
        } else if (b == 0) {
            return fail_at(e->ld, e->at, "in '%.64s': division by zero (%lld / 0)",
                           e->at->text, (long long)a);
        } else if (a == INT64_MIN && b == -1) {
            return expr_overflow(e, a, op, b);
        } else if (a % b != 0) {
            return fail_at(e->ld, e->at, "in '%.64s': %lld is not divisible by %lld; '/' must "
                                         "divide exactly",
                           e->at->text, (long long)a, (long long)b);
        } else {
            a /= b;
        }
    }
    *out = a;
    return 0;
}

static int expr_sum(expr *e, int64_t *out) {
    int64_t a = 0;
    if (expr_product(e, &a) != 0)
        return -1;
    for (;;) {
        expr_space(e);
        char op = *e->p;
        if (op != '+' && op != '-')
            break;
        e->p++;
        int64_t b = 0;
        if (expr_product(e, &b) != 0)
            return -1;
        if (op == '+' ? (b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)
                      : (b < 0 && a > INT64_MAX + b) || (b > 0 && a < INT64_MIN + b))
            return expr_overflow(e, a, op, b);
        a = op == '+' ? a + b : a - b;
    }
    *out = a;
    return 0;
}

/* Whether a scalar that is not a plain number is meant as arithmetic: it
 * names a param or holds an operator past its first character. Other text
 * ('big', '3x') keeps the plain "must be an integer" message. */
static int looks_like_expr(const char *s) {
    if (strchr(s, '$') || strchr(s, '(') || strchr(s, '*') || strchr(s, '/'))
        return 1;
    return s[0] && (strchr(s + 1, '+') || strchr(s + 1, '-'));
}

/* Evaluates the whole scalar y as an integer expression. */
static int eval_expr(loader *ld, const ynode *y, const char *what, int64_t *out) {
    expr e = {.ld = ld, .at = y, .what = what, .p = y->text};
    if (expr_sum(&e, out) != 0)
        return -1;
    expr_space(&e);
    if (*e.p)
        return expr_syntax(&e, *e.p == ')' ? "a ')' without its '('" : "expected an operator");
    return 0;
}

/* A number read from the file: exact when is_int. */
typedef struct number {
    int is_int;
    int64_t i;
    double f;
} number;

/* Reads a number: a plain decimal scalar, "$param", or arithmetic on params
 * (an integer). `what` describes the place for messages ("attribute 'out' of
 * linear"). */
static int read_value(loader *ld, const ynode *y, int want_int, const char *what, number *out) {
    if (!y || y->kind != Y_SCALAR)
        return fail_at(ld, y, "%s must be %s, got %s", what, want_int ? "an integer" : "a number",
                       describe(ld, y));
    if (!y->plain)
        return fail_at(ld, y, "%s must be %s, got the string \"%.64s\" (remove the quotes)", what,
                       want_int ? "an integer" : "a number", y->text);
    if (y->text[0] == '$' && is_ident(y->text + 1)) {
        const spec_param *p = find_param(ld, y->text + 1);
        if (!p)
            return fail_undefined_param(ld, y, y->text + 1, strlen(y->text + 1));
        if (want_int && !p->is_int)
            return fail_at(ld, y, "%s must be an integer, but param %s is %.17g", what, y->text,
                           p->value);
        *out = (number){p->is_int, p->is_int ? p->ivalue : 0, p->value};
        return 0;
    }
    num_form f = number_form(y->text);
    if (f == NUM_NONE && looks_like_expr(y->text)) {
        int64_t v = 0;
        if (eval_expr(ld, y, what, &v) != 0)
            return -1;
        *out = (number){1, v, (double)v};
        return 0;
    }
    if (f == NUM_NONE)
        return fail_at(ld, y, "%s must be %s, got '%.64s'", what,
                       want_int ? "an integer" : "a number", y->text);
    if (want_int && f != NUM_INT)
        return fail_at(ld, y, "%s must be an integer, got %.64s", what, y->text);
    errno = 0;
    if (f == NUM_INT) {
        long long v = strtoll(y->text, NULL, 10);
        if (errno)
            return fail_at(ld, y, "%s: %.64s is out of range", what, y->text);
        *out = (number){1, v, (double)v};
        return 0;
    }
    double v = strtod(y->text, NULL);
    if (errno || !isfinite(v))
        return fail_at(ld, y, "%s: %.64s is out of range", what, y->text);
    *out = (number){0, 0, v};
    return 0;
}

static int read_number(loader *ld, const ynode *y, int want_int, const char *what, int64_t *i_out,
                       double *f_out) {
    number n;
    if (read_value(ld, y, want_int, what, &n) != 0)
        return -1;
    if (i_out)
        *i_out = n.is_int ? n.i : 0;
    if (f_out)
        *f_out = n.f;
    return 0;
}

static int read_int_range(loader *ld, const ynode *y, const char *what, int64_t lo, int64_t hi,
                          int64_t *out) {
    if (read_number(ld, y, 1, what, out, NULL) != 0)
        return -1;
    if (*out < lo || *out > hi) {
        if (hi == INT64_MAX)
            return fail_at(ld, y, "%s must be >= %lld, got %lld", what, (long long)lo,
                           (long long)*out);
        return fail_at(ld, y, "%s must be between %lld and %lld, got %lld", what, (long long)lo,
                       (long long)hi, (long long)*out);
    }
    return 0;
}

/* A scalar used as a name. */
static int read_name(loader *ld, const ynode *y, const char *what, const char **out) {
    if (!y || y->kind != Y_SCALAR || is_null(y))
        return fail_at(ld, y, "%s must be a name, got %s", what, y && y->kind == Y_SCALAR ? "nothing" : describe(ld, y));
    *out = y->text;
    return 0;
}

/* Checks the keys of a map against a list; unknown ones get a suggestion. */
static int check_keys(loader *ld, const ynode *m, const char *what, const char *const *known) {
    for (int i = 0; i < m->n; i++) {
        const ynode *k = ymap_key(m, i);
        int ok = 0;
        for (const char *const *p = known; *p; p++)
            ok |= strcmp(*p, k->text) == 0;
        if (ok)
            continue;
        suggest s = {.word = k->text};
        for (const char *const *p = known; *p; p++)
            suggest_try(&s, *p);
        char sb[128];
        return fail_at(ld, k, "unknown key '%.64s' in %s%s", k->text, what,
                       suggest_text(&s, sb, sizeof sb, ""));
    }
    return 0;
}

/* ---- locations --------------------------------------------------------------------- */

static int add_loc(loader *ld, const char *path, const ynode *at) {
    ebb_spec *s = ld->spec;
    if (s->n_locs == s->cap_locs) {
        int cap = s->cap_locs ? s->cap_locs * 2 : 64;
        spec_loc *l = realloc(s->locs, (size_t)cap * sizeof *l);
        if (!l)
            return nomem(ld, at);
        s->locs = l;
        s->cap_locs = cap;
    }
    spec_loc *l = &s->locs[s->n_locs];
    l->path = ebb_arena_strdup(&s->mem, path);
    l->key = ebb_arena_strdup(&s->mem, sb_str(&ld->kp));
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
            return nomem(ld, at);
    }
    if (!l->path || !l->key || ld->kp.oom || ld->np.oom)
        return nomem(ld, at);
    s->n_locs++;
    return 0;
}

/* Counts a graph node or step against EBB_SPEC_MAX_NODES. */
static int count_made(loader *ld, const ynode *at) {
    if (++ld->made > EBB_SPEC_MAX_NODES)
        return fail_at(ld, at,
                       "the spec expands to more than %d graph nodes (the limit; repeat and "
                       "block uses make copies)",
                       EBB_SPEC_MAX_NODES);
    return 0;
}

/* After a builder call: a failure becomes an error at `at`. */
static int check_builder(loader *ld, ebb_builder *b, const ynode *at) {
    if (ebb_builder_status(b) == EBB_OK)
        return 0;
    if (ebb_builder_status(b) == EBB_ERR_NOMEM)
        return nomem(ld, at);
    return fail_at(ld, at, "%s", ebb_builder_errmsg(b));
}

/* ---- tags -------------------------------------------------------------------------- */

static const tagdef *scope_find(const scope *sc, const char *name) {
    for (; sc; sc = sc->parent)
        for (int i = 0; i < sc->n; i++)
            if (strcmp(sc->tags[i].name, name) == 0)
                return &sc->tags[i];
    return NULL;
}

static int scope_add(loader *ld, scope *sc, const char *name, const ynode *at) {
    if (sc->n == sc->cap) {
        int cap = sc->cap ? sc->cap * 2 : 8;
        tagdef *t = realloc(sc->tags, (size_t)cap * sizeof *t);
        if (!t)
            return nomem(ld, at);
        sc->tags = t;
        sc->cap = cap;
    }
    sc->tags[sc->n++] = (tagdef){name, at};
    return 0;
}

/* ---- nodes ---------------------------------------------------------------------------- */

static ebb_node *make_node(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs);
static const spec_input *find_target(const ebb_spec *s, const char *name);
static int build_flow(loader *ld, ebb_builder *b, scope *sc, const ynode *steps, int is_main);

static const char *const STEP_KEYS[] = {"from", "through", "also", "split",  "merge", "gate",
                                        "switch", "loop",  "repeat", "tag",  "using", NULL};

static int is_step_key(const char *k) {
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
    if (min == max)
        snprintf(want, sizeof want, "%d input%s", min, min == 1 ? "" : "s");
    else if (max < 0)
        snprintf(want, sizeof want, "at least %d inputs", min);
    else
        snprintf(want, sizeof want, "%d to %d inputs", min, max);
    if (ld->merging && n_inputs == ld->merging)
        return fail_at(ld, at, "%s takes %s, but the merge gives it the %d open streams", what,
                       want, n_inputs);
    if (n_inputs == 1 && min > 1)
        return fail_at(ld, at, "%s takes %s but gets only the stream; name the others with "
                               "`using: [tag, ...]` beside from/through",
                       what, want);
    return fail_at(ld, at, "%s takes %s, but gets %d (the stream%s)", what, want, n_inputs,
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
            return fail_at(ld, v, "%s has %d entries; a list attribute holds at most %d", what,
                           v->n, EBB_MAX_DIMS * 8);
        for (int j = 0; j < v->n; j++) {
            size_t m = sb_mark(&ld->kp);
            sb_printf(&ld->kp, "[%d]", j);
            int64_t x = 0;
            if (read_number(ld, v->items[j], 1, item_what, &x, NULL) != 0)
                return -1;
            sb_printf(out, "%s%lld", j ? "," : "", (long long)x);
            sb_reset(&ld->kp, m);
        }
        return 0;
    }
    expr e = {.ld = ld, .at = v, .what = item_what, .p = v->text};
    expr_space(&e);
    char close = 0; /* '(' opens an expression, not the list */
    if (*e.p == '[') {
        close = ']';
        e.p++;
    }
    for (int j = 0;; j++) {
        expr_space(&e);
        if (*e.p == close || !*e.p)
            break; /* an empty list, or a comma before the end */
        if (j >= EBB_MAX_DIMS * 8)
            return fail_at(ld, v, "%s has more than %d entries", what, EBB_MAX_DIMS * 8);
        int64_t x = 0;
        if (expr_sum(&e, &x) != 0)
            return -1;
        sb_printf(out, "%s%lld", j ? "," : "", (long long)x);
        expr_space(&e);
        if (*e.p == ',')
            e.p++;
        else if (*e.p != close && *e.p)
            return expr_syntax(&e, "expected ',' between the entries");
    }
    if (close && *e.p != close)
        return expr_syntax(&e, "a '[' lacks its ']'");
    if (close)
        e.p++;
    expr_space(&e);
    if (*e.p)
        return expr_syntax(&e, "expected the end of the list");
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
        if (read_number(ld, v, 1, what, &i, NULL) != 0)
            return -1;
        sb_printf(text, "%s%s=%lld", sep, spec->name, (long long)i);
        return 0;
    }
    case EBB_ATTR_FLOAT: {
        double f = 0;
        if (read_number(ld, v, 0, what, NULL, &f) != 0)
            return -1;
        sb_printf(text, "%s%s=%.17g", sep, spec->name, f);
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
                return fail_at(ld, v, "%s must be true or false, got the string \"%.64s\" "
                                      "(remove the quotes)",
                               what, v->text);
            return fail_at(ld, v, "%s must be true or false, got %s%.64s%s", what,
                           v && v->kind == Y_SCALAR ? "'" : "",
                           v && v->kind == Y_SCALAR ? v->text : describe(ld, v),
                           v && v->kind == Y_SCALAR ? "'" : "");
        }
        sb_printf(text, "%s%s=%s", sep, spec->name, b ? "true" : "false");
        return 0;
    }
    case EBB_ATTR_STRING:
        if ((v && v->kind == Y_SEQ) || (v && v->kind == Y_SCALAR && strchr(v->text, '$'))) {
            strbuf list = {0};
            int rc = read_int_list(ld, v, what, &list);
            if (rc == 0)
                sb_printf(text, "%s%s=\"%s\"", sep, spec->name, sb_str(&list));
            if (rc == 0 && list.oom)
                rc = nomem(ld, v);
            free(list.s);
            return rc;
        }
        if (!v || v->kind != Y_SCALAR || is_null(v))
            return fail_at(ld, v ? v : key, "%s must be a string, got %s", what,
                           v && v->kind == Y_SCALAR ? "nothing" : describe(ld, v));
        if (v->plain && number_form(v->text) != NUM_NONE)
            return fail_at(ld, v, "%s must be a string, got the number %.64s (quote it)", what,
                           v->text);
        for (const char *p = v->text; *p; p++)
            if (*p == '"' || (unsigned char)*p < 0x20)
                return fail_at(ld, v, "%s may not contain quotes or control characters", what);
        sb_printf(text, "%s%s=\"%s\"", sep, spec->name, v->text);
        return 0;
    }
    return fail_at(ld, v, "%s has an unknown type", what);
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
        fail_at(ld, v, "'{i}' in the %s '%.64s' stands for a repeat's copy index, but "
                       "this node is not inside a repeat", what, v->text);
        return NULL;
    }
    strbuf out = {0};
    for (const char *p = v->text; *p;) {
        if (strncmp(p, "{i}", 3) == 0) {
            sb_printf(&out, "%lld", (long long)ld->copy);
            p += 3;
        } else {
            sb_printf(&out, "%c", *p++);
        }
    }
    char *name = ebb_arena_strdup(&ld->spec->mem, sb_str(&out));
    free(out.s);
    if (!name)
        nomem(ld, v);
    return name;
}

static int claim_name(loader *ld, const char *name, const ynode *at) {
    for (int i = 0; i < ld->n_names; i++)
        if (strcmp(ld->names[i].name, name) == 0 && ld->names[i].at == at)
            return fail_at(ld, at,
                           "node name '%s' would name more than one node: repeat and every use "
                           "of a block make copies, and each needs a name of its own",
                           name);
        else if (strcmp(ld->names[i].name, name) == 0)
            return fail_at(ld, at,
                           "node name '%s' is already used at line %d, column %d",
                           name, ld->names[i].at->line, ld->names[i].at->col);
    if (ld->n_names == ld->cap_names) {
        int cap = ld->cap_names ? ld->cap_names * 2 : 16;
        used_name *n = realloc(ld->names, (size_t)cap * sizeof *n);
        if (!n)
            return nomem(ld, at);
        ld->names = n;
        ld->cap_names = cap;
    }
    ld->names[ld->n_names++] = (used_name){name, at};
    return 0;
}

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

/* Reads `share: {param: source, ...}` of an op node into ex; `k` is the key. */
static int read_share(loader *ld, const ebb_op *op, const ynode *k, const ynode *v,
                      op_extras *ex) {
    if (!op->params)
        return fail_at(ld, k, "%s has no parameters to share", op->name);
    if (!v || v->kind != Y_MAP)
        return fail_at(ld, v ? v : k, "share must be a map {param: source}, like {weight: "
                                      "transformer.wte.weight}, got %s",
                       describe(ld, v));
    if (v->n > EBB_MAX_PARAMS)
        return fail_at(ld, v, "share names %d parameters; an op has at most %d", v->n,
                       EBB_MAX_PARAMS);
    for (int i = 0; i < v->n; i++) {
        const ynode *pk = ymap_key(v, i), *src = ymap_value(v, i);
        size_t m = sb_mark(&ld->kp);
        sb_printf(&ld->kp, ".%s", pk->text);
        if (!ebb_graph_valid_node_name(pk->text))
            return fail_at(ld, pk, "share: '%.64s' is not a parameter name like weight or bias",
                           pk->text);
        if (!src || src->kind != Y_SCALAR || is_null(src))
            return fail_at(ld, src ? src : pk, "share: the source of %s must be a parameter's "
                                               "full name like transformer.wte.weight, got %s",
                           pk->text, describe(ld, src));
        const char *name = copy_name(ld, src, "shared parameter name");
        if (!name)
            return -1;
        if (!ebb_graph_valid_node_name(name))
            return fail_at(ld, src, "share: a parameter's full name is letters, digits, '_', "
                                    "'-' and inner '.', like transformer.wte.weight; got '%.64s'",
                           name);
        ex->share_param[ex->n_share] = pk->text;
        ex->share_source[ex->n_share] = name;
        ex->share_at[ex->n_share] = src;
        ex->n_share++;
        sb_reset(&ld->kp, m);
    }
    return 0;
}

/* Reads an op's attribute map (NULL or null: none) into the builder's
 * "k=v, k=v" text, checking names, types and required attributes against
 * the schema; `y` is where the op is written. With ex non-NULL (an op node)
 * the keys `name` and `share`, which are not attributes of the op, are
 * accepted and returned in *ex; with ex NULL (a loss) they are refused. */
static int read_op_attrs(loader *ld, const ebb_op *op, const ynode *y, const ynode *attrs,
                         strbuf *text, op_extras *ex) {
    int given[EBB_MAX_ATTRS] = {0};
    if (attrs && !is_null(attrs)) {
        if (attrs->kind != Y_MAP)
            return fail_at(ld, attrs, "the attributes of %s must be a map {key: value}, got %s",
                           op->name, describe(ld, attrs));
        for (int i = 0; i < attrs->n; i++) {
            const ynode *k = ymap_key(attrs, i), *v = ymap_value(attrs, i);
            size_t mark = sb_mark(&ld->kp);
            sb_printf(&ld->kp, ".%s.%s", op->name, k->text);
            if (ex && strcmp(k->text, "name") == 0) {
                const char *nm = v && v->kind == Y_SCALAR && !is_null(v)
                                     ? copy_name(ld, v, "node name")
                                     : NULL;
                if (ld->failed)
                    return -1;
                if (!nm || !ebb_graph_valid_node_name(nm))
                    return fail_at(ld, v ? v : k,
                                   "a node name is letters, digits, '_', '-' and inner '.', "
                                   "starting with a letter or '_'; got %s%.64s%s",
                                   v && v->kind == Y_SCALAR ? "'" : "",
                                   v && v->kind == Y_SCALAR ? v->text : describe(ld, v),
                                   v && v->kind == Y_SCALAR ? "'" : "");
                ex->name = nm;
                ex->name_at = v;
                sb_reset(&ld->kp, mark);
                continue;
            }
            if (ex && strcmp(k->text, "share") == 0) {
                if (read_share(ld, op, k, v, ex) != 0)
                    return -1;
                sb_reset(&ld->kp, mark);
                continue;
            }
            if (ex && strcmp(k->text, "precision") == 0) {
                if (!v || v->kind != Y_SCALAR || is_null(v) ||
                    ebb_precision_parse(&ex->precision, v->text) != EBB_OK) {
                    ebb_error_clear();
                    return fail_at(ld, v ? v : k, "precision must be fp32, bf16 or fp16, got %s",
                                   describe(ld, v));
                }
                sb_reset(&ld->kp, mark);
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
                    return fail_at(ld, k, "a loss has no name, only attributes (%s takes %s%s)",
                                   op->name, known[0] ? "" : "none", known);
                suggest s = {.word = k->text};
                for (int j = 0; j < op->n_attrs; j++)
                    suggest_try(&s, op->attrs[j].name);
                if (ex) {
                    suggest_try(&s, "name");
                    suggest_try(&s, "precision");
                }
                if (ex && op->params)
                    suggest_try(&s, "share");
                char sb[128];
                return fail_at(ld, k, "%s has no attribute '%.64s'%s (%s%s)", op->name,
                               k->text, suggest_text(&s, sb, sizeof sb, ""),
                               known[0] ? "known: " : "it takes none", known);
            }
            given[ai] = 1;
            if (attr_text_add(ld, text, op, &op->attrs[ai], k, v) != 0)
                return -1;
            sb_reset(&ld->kp, mark);
        }
    }
    for (int i = 0; i < op->n_attrs; i++)
        if (op->attrs[i].required && !given[i])
            return fail_at(ld, y, "%s needs attribute '%s' (%s)", op->name, op->attrs[i].name,
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
    if (read_op_attrs(ld, op, y, attrs, &text, &ex) != 0)
        goto fail;
    if (ex.name) {
        if (claim_name(ld, ex.name, ex.name_at) != 0)
            goto fail;
        sb_printf(&text, "%sname=%s", text.len ? ", " : "", ex.name);
    }
    if (text.oom) {
        nomem(ld, y);
        goto fail;
    }
    if (count_made(ld, y) != 0)
        goto fail;
    ebb_node *n = ebb_node_op(b, op->name, text.len ? text.s : NULL);
    free(text.s);
    if (ex.precision)
        ebb_node_precision(b, n, ex.precision);
    if (check_builder(ld, b, y) != 0)
        return NULL;
    for (int i = 0; i < ex.n_share; i++) {
        size_t m = sb_mark(&ld->kp);
        sb_printf(&ld->kp, ".%s.share.%s", op->name, ex.share_param[i]);
        ebb_node_share(b, n, ex.share_param[i], ex.share_source[i]);
        int rc = check_builder(ld, b, ex.share_at[i]);
        sb_reset(&ld->kp, m);
        if (rc != 0)
            return NULL;
    }
    if (add_loc(ld, sb_str(&ld->np), y) != 0 || (ex.name && add_loc(ld, ex.name, y) != 0))
        return NULL;
    return n;
fail:
    free(text.s);
    return NULL;
}

static ebb_node *make_subflow(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs) {
    if (y->n == 0) {
        fail_at(ld, y, "an empty list is not a node; use identity for a pass-through");
        return NULL;
    }
    if (n_inputs != 1 && ld->merging && n_inputs == ld->merging) {
        fail_at(ld, y, "a sub-flow takes one stream, so it cannot merge %d; merge with an op "
                       "that takes %d inputs, or a block that is one",
                n_inputs, n_inputs);
        return NULL;
    }
    if (n_inputs != 1) {
        fail_at(ld, y, "a sub-flow takes only the stream; read tags inside it with a "
                       "`using` step instead");
        return NULL;
    }
    if (ld->nesting >= EBB_SPEC_MAX_NESTING) {
        fail_at(ld, y, "sub-flows and blocks are nested more than %d deep (the limit)",
                EBB_SPEC_MAX_NESTING);
        return NULL;
    }
    if (count_made(ld, y) != 0)
        return NULL;
    ebb_builder *s = ebb_subflow_begin(b);
    if (!s) {
        nomem(ld, y);
        return NULL;
    }
    ld->nesting++;
    scope inner = {.parent = sc};
    int rc = check_builder(ld, s, y);
    if (rc == 0)
        rc = build_flow(ld, s, &inner, y, 0);
    ld->nesting--;
    free(inner.tags);
    ebb_node *n = ebb_subflow_end(s); /* frees s, also after a failure */
    if (rc != 0)
        return NULL;
    if (check_builder(ld, b, y) != 0)
        return NULL;
    if (add_loc(ld, sb_str(&ld->np), y) != 0)
        return NULL;
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
            fail_at(ld, y, "block '%s' uses itself (%s)", name, chain);
            return NULL;
        }
    if (ld->n_stack >= EBB_SPEC_MAX_NESTING) {
        fail_at(ld, y, "blocks are nested more than %d deep (the limit)", EBB_SPEC_MAX_NESTING);
        return NULL;
    }
    ld->block_used[bi] = 1;
    char *used_at = ebb_arena_strdup(&ld->spec->mem, sb_str(&ld->kp));
    if (!used_at) {
        nomem(ld, y);
        return NULL;
    }
    strbuf saved = ld->kp;
    strbuf fresh = {0};
    ld->kp = fresh;
    sb_printf(&ld->kp, "blocks.%s", name);
    ld->stack[ld->n_stack++] = (block_use){name, used_at};
    ebb_node *n = make_node(ld, b, sc, ymap_value(ld->blocks, bi), n_inputs);
    ld->n_stack--;
    int oom = ld->kp.oom;
    free(ld->kp.s);
    ld->kp = saved;
    if (oom && n) {
        nomem(ld, y);
        return NULL;
    }
    return n;
}

/* Any NODE: "op", "block", {op: {attrs}} or a list (a sub-flow). The graph
 * path of the node is in ld->np; the key path of `y` in ld->kp. */
static ebb_node *make_node(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs) {
    if (!y || is_null(y)) {
        fail_at(ld, y, "expected a node (an op, a block, {op: {attributes}} or a list of "
                       "steps), got nothing");
        return NULL;
    }
    if (y->kind == Y_SEQ)
        return make_subflow(ld, b, sc, y, n_inputs);
    const ynode *name_node = y, *attrs = NULL;
    if (y->kind == Y_MAP) {
        if (y->n != 1) {
            fail_at(ld, y, "a node map has exactly one key, the op name: {op: {attributes}}; "
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
        if (attrs && !is_null(attrs)) {
            fail_at(ld, name_node, "block '%s' takes no attributes", name);
            return NULL;
        }
        return make_block(ld, b, sc, y, bi, n_inputs);
    }
    if (is_step_key(name)) {
        fail_at(ld, name_node,
                "'%s' is a step, not a node; write a sub-flow as a list: [{%s: ...}]", name, name);
        return NULL;
    }
    suggest s = {.word = name};
    suggest_ops(&s);
    suggest_blocks(ld, &s);
    char sb[128];
    fail_at(ld, name_node, "unknown op or block '%.64s'%s", name,
            suggest_text(&s, sb, sizeof sb, ""));
    return NULL;
}

/* make_node with ".suffix" appended to the graph path and key path. */
static ebb_node *make_node_at(loader *ld, ebb_builder *b, scope *sc, const ynode *y, int n_inputs,
                              const char *np_suffix, const char *kp_suffix) {
    size_t np_mark = sb_mark(&ld->np), kp_mark = sb_mark(&ld->kp);
    sb_printf(&ld->np, "%s", np_suffix);
    sb_printf(&ld->kp, "%s", kp_suffix);
    ebb_node *n = make_node(ld, b, sc, y, n_inputs);
    sb_reset(&ld->np, np_mark);
    sb_reset(&ld->kp, kp_mark);
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
    return fail_at(ld, at,
                   "%s needs one open stream, but the split at line %d has %d open; merge "
                   "them first",
                   step, st->split_at ? st->split_at->line : 0, st->open);
}

/* A list of NODEs (split branches, gate experts, switch branches). */
static ebb_node **make_node_list(loader *ld, ebb_builder *b, scope *sc, const ynode *list,
                                 const char *key, const char *np_kind, const char *what, int *n) {
    if (!list || list->kind != Y_SEQ)
        return fail_at(ld, list, "%s must be a list of nodes, got %s", key, describe(ld, list)),
               NULL;
    if (list->n < 2)
        return fail_at(ld, list, "a %s needs at least 2 %s, got %d", np_kind, what, list->n),
               NULL;
    ebb_node **nodes = malloc((size_t)list->n * sizeof *nodes);
    if (!nodes)
        return nomem(ld, list), NULL;
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
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".split");
    ebb_node **nodes = make_node_list(ld, b, sc, v, "split", "split", "branches", &n);
    sb_reset(&ld->kp, kp);
    if (!nodes)
        return -1;
    ebb_splitv(b, nodes, n);
    free(nodes);
    if (check_builder(ld, b, step) != 0)
        return -1;
    st->open = n;
    st->split_at = step;
    free(st->split_kp);
    st->split_kp = malloc(ld->kp.len + 1);
    if (!st->split_kp)
        return nomem(ld, step);
    memcpy(st->split_kp, sb_str(&ld->kp), ld->kp.len + 1);
    return 0;
}

static const char *const MERGE_OPS[] = {"add", "mean", "mul", "max", "cat", "stack", NULL};

/* merge by a node: an op or block that takes the k open streams as its
 * inputs, stream 0 first. Its graph path is that of the merge. */
static int merge_by_node(loader *ld, ebb_builder *b, scope *sc, step_state *st,
                         const ynode *step, const ynode *v, const ynode *opn) {
    if (opn && opn->kind == Y_SCALAR && !is_null(opn)) {
        const char *name = opn->text;
        const ebb_op *op = ebb_op_find(name);
        if (!(op && name[0] != '_') && block_index(ld, name) < 0 && !is_step_key(name)) {
            suggest s = {.word = name};
            for (int i = 0; MERGE_OPS[i]; i++)
                suggest_try(&s, MERGE_OPS[i]);
            suggest_ops(&s);
            suggest_blocks(ld, &s);
            char sb[128];
            return fail_at(ld, opn,
                           "unknown merge '%.64s'%s (a merge is add, mean, mul, max, cat or "
                           "stack, or an op or block that takes the open streams)",
                           name, suggest_text(&s, sb, sizeof sb, ""));
        }
    }
    int outer = ld->merging;
    ld->merging = st->open;
    ebb_node *n = make_node_at(ld, b, sc, v, st->open, ".merge", "");
    ld->merging = outer;
    if (!n)
        return -1;
    ebb_merge_node(b, n);
    if (check_builder(ld, b, step) != 0)
        return -1;
    st->open = 1;
    return 0;
}

static int step_merge(loader *ld, ebb_builder *b, scope *sc, step_state *st, const ynode *step,
                      const ynode *v) {
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".merge");
    if (st->open < 2)
        return fail_at(ld, step, "merge needs at least 2 open streams (from a split), but "
                                 "there is 1");
    const ynode *opn = v, *attrs = NULL;
    if (v && v->kind == Y_MAP && v->n == 1) {
        opn = ymap_key(v, 0);
        attrs = ymap_value(v, 0);
    }
    if (!v || is_null(v))
        return fail_at(ld, v, "merge takes one of add, mean, mul, max, cat, stack (cat and "
                              "stack as {cat: {dim: D}}), or a node that takes the open "
                              "streams, got %s",
                       describe(ld, v));
    int which = -1;
    for (int i = 0; opn->kind == Y_SCALAR && MERGE_OPS[i]; i++)
        if (strcmp(MERGE_OPS[i], opn->text) == 0)
            which = i;
    if (which < 0) {
        int rc = merge_by_node(ld, b, sc, st, step, v, v->kind == Y_SEQ ? NULL : opn);
        if (rc == 0)
            sb_reset(&ld->kp, kp);
        return rc;
    }
    static const ebb_merge_op ops[] = {EBB_MERGE_ADD, EBB_MERGE_MEAN, EBB_MERGE_MUL,
                                       EBB_MERGE_MAX, EBB_MERGE_CAT,  EBB_MERGE_STACK};
    int64_t dim = 0;
    if (ops[which] == EBB_MERGE_CAT || ops[which] == EBB_MERGE_STACK)
        dim = 1;
    if (attrs && !is_null(attrs)) {
        sb_printf(&ld->kp, ".%s", opn->text);
        if (dim == 0)
            return fail_at(ld, attrs, "merge '%s' takes no attributes", opn->text);
        if (attrs->kind != Y_MAP)
            return fail_at(ld, attrs, "the attributes of merge '%s' must be a map {dim: D}, got %s",
                           opn->text, describe(ld, attrs));
        static const char *const keys[] = {"dim", NULL};
        if (check_keys(ld, attrs, "merge attributes", keys) != 0)
            return -1;
        const ynode *d = ebb_ymap_get(attrs, "dim");
        if (d) {
            sb_printf(&ld->kp, ".dim");
            if (read_int_range(ld, d, "dim", -EBB_MAX_DIMS - 1, EBB_MAX_DIMS, &dim) != 0)
                return -1;
        }
    }
    sb_reset(&ld->kp, kp);
    ebb_merge(b, ops[which], dim);
    if (check_builder(ld, b, step) != 0)
        return -1;
    st->open = 1;
    return 0;
}

static int step_gate(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"router", "experts", "top_k", NULL};
    if (!v || v->kind != Y_MAP)
        return fail_at(ld, v, "gate takes a map {router: NODE, experts: [NODE, ...], top_k: K}, "
                              "got %s",
                       describe(ld, v));
    if (check_keys(ld, v, "gate", keys) != 0)
        return -1;
    const ynode *router = ebb_ymap_get(v, "router"), *experts = ebb_ymap_get(v, "experts"),
                *topk = ebb_ymap_get(v, "top_k");
    if (!router)
        return fail_at(ld, v, "gate needs a router");
    if (!experts)
        return fail_at(ld, v, "gate needs experts");
    int64_t k = 0;
    if (topk) {
        size_t kp = sb_mark(&ld->kp);
        sb_printf(&ld->kp, ".top_k");
        if (read_int_range(ld, topk, "top_k", 0, INT64_MAX, &k) != 0)
            return -1;
        if (experts->kind == Y_SEQ && k > experts->n)
            return fail_at(ld, topk, "top_k is %lld, but the gate has only %d experts",
                           (long long)k, experts->n);
        sb_reset(&ld->kp, kp);
    }
    ebb_node *r = make_node_at(ld, b, sc, router, 1, ".gate.router", ".router");
    if (!r)
        return -1;
    int n = 0;
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".experts");
    ebb_node **nodes = make_node_list(ld, b, sc, experts, "experts", "gate", "experts", &n);
    sb_reset(&ld->kp, kp);
    if (!nodes)
        return -1;
    ebb_gatev(b, r, (int)k, nodes, n);
    free(nodes);
    return check_builder(ld, b, step);
}

static int step_switch(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"selector", "branches", NULL};
    if (!v || v->kind != Y_MAP)
        return fail_at(ld, v, "switch takes a map {selector: NODE, branches: [NODE, ...]}, got %s",
                       describe(ld, v));
    if (check_keys(ld, v, "switch", keys) != 0)
        return -1;
    const ynode *sel = ebb_ymap_get(v, "selector"), *branches = ebb_ymap_get(v, "branches");
    if (!sel)
        return fail_at(ld, v, "switch needs a selector");
    if (!branches)
        return fail_at(ld, v, "switch needs branches");
    ebb_node *s = make_node_at(ld, b, sc, sel, 1, ".switch.selector", ".selector");
    if (!s)
        return -1;
    int n = 0;
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".branches");
    ebb_node **nodes = make_node_list(ld, b, sc, branches, "branches", "switch", "branches", &n);
    sb_reset(&ld->kp, kp);
    if (!nodes)
        return -1;
    ebb_switchv(b, s, nodes, n);
    free(nodes);
    return check_builder(ld, b, step);
}

static int step_loop(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"body", "times", "while", "until", "max", NULL};
    if (!v || v->kind != Y_MAP)
        return fail_at(ld, v, "loop takes a map {body: NODE, times: N} (or while/until: NODE "
                              "with max: N), got %s",
                       describe(ld, v));
    if (check_keys(ld, v, "loop", keys) != 0)
        return -1;
    const ynode *body = ebb_ymap_get(v, "body"), *times = ebb_ymap_get(v, "times"),
                *wh = ebb_ymap_get(v, "while"), *un = ebb_ymap_get(v, "until"), *max = ebb_ymap_get(v, "max");
    if (!body)
        return fail_at(ld, v, "loop needs a body");
    int kinds = !!times + !!wh + !!un;
    if (kinds == 0)
        return fail_at(ld, v, "loop needs one of times, while or until");
    if (kinds > 1)
        return fail_at(ld, v, "loop takes only one of times, while and until");
    if (times && max)
        return fail_at(ld, max, "max goes with while or until; times already fixes the count");
    if (!times && !max)
        return fail_at(ld, v, "a loop with %s needs max (the most iterations)",
                       wh ? "while" : "until");
    int64_t count = 0;
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".%s", times ? "times" : "max");
    if (read_int_range(ld, times ? times : max, times ? "times" : "max", 0, INT64_MAX, &count) !=
        0)
        return -1;
    sb_reset(&ld->kp, kp);
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
    return check_builder(ld, b, step);
}

/* repeat: N copies of the body, each with its own weights, as one through
 * step over a sequence: copy j has the graph path "<step>.j". */
static int step_repeat(loader *ld, ebb_builder *b, scope *sc, const ynode *step, const ynode *v) {
    static const char *const keys[] = {"times", "body", NULL};
    if (!v || v->kind != Y_MAP)
        return fail_at(ld, v, "repeat takes a map {times: N, body: NODE}, got %s", describe(ld, v));
    if (check_keys(ld, v, "repeat", keys) != 0)
        return -1;
    const ynode *times = ebb_ymap_get(v, "times"), *body = ebb_ymap_get(v, "body");
    if (!times)
        return fail_at(ld, v, "repeat needs times");
    if (!body)
        return fail_at(ld, v, "repeat needs a body");
    int64_t n = 0;
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".repeat.times");
    if (read_int_range(ld, times, "times", 1, EBB_SPEC_MAX_NODES, &n) != 0)
        return -1;
    sb_reset(&ld->kp, kp);
    ebb_node **copies = malloc((size_t)n * sizeof *copies);
    if (!copies)
        return nomem(ld, v);
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
    if (check_builder(ld, b, step) != 0)
        return -1;
    ebb_through(b, seq);
    return check_builder(ld, b, step);
}

/* Names the `using` tags and checks they are visible here. Returns the count
 * (>= 1) with the names in *out (malloc'd), or -1. */
static int read_using(loader *ld, const scope *sc, const ynode *steps, const ynode *u,
                      const char ***out) {
    size_t kp = sb_mark(&ld->kp);
    sb_printf(&ld->kp, ".using");
    if (!u || is_null(u))
        return fail_at(ld, u, "using needs at least one tag");
    const ynode *const *items = &u;
    int n = 1;
    if (u && u->kind == Y_SEQ) {
        items = (const ynode *const *)u->items;
        n = u->n;
        if (n == 0)
            return fail_at(ld, u, "using needs at least one tag");
    }
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names)
        return nomem(ld, u);
    for (int i = 0; i < n; i++) {
        const ynode *t = items[i];
        size_t m = sb_mark(&ld->kp);
        if (u->kind == Y_SEQ)
            sb_printf(&ld->kp, "[%d]", i);
        if (!t || t->kind != Y_SCALAR || is_null(t)) {
            free(names);
            return fail_at(ld, t ? t : u, "using takes tag names, got %s", describe(ld, t));
        }
        if (!scope_find(sc, t->text) && find_target(ld->spec, t->text)) {
            free(names);
            return fail_at(ld, t, "'%.64s' is a target, which only the loss reads; the flow "
                                  "cannot use it",
                           t->text);
        }
        if (!scope_find(sc, t->text)) {
            /* defined later in this flow? */
            for (int j = 0; steps && j < steps->n; j++) {
                const ynode *s = steps->items[j];
                const ynode *tv = s->kind == Y_MAP && s->n == 1 ? ebb_ymap_get(s, "tag") : NULL;
                if (tv && tv->kind == Y_SCALAR && strcmp(tv->text, t->text) == 0) {
                    free(names);
                    return fail_at(ld, t, "tag '%.64s' is used before its definition at line %d",
                                   t->text, tv->line);
                }
            }
            suggest s = {.word = t->text};
            for (const scope *p = sc; p; p = p->parent)
                for (int j = 0; j < p->n; j++)
                    suggest_try(&s, p->tags[j].name);
            char sb[128];
            free(names);
            return fail_at(ld, t, "undefined tag '%.64s'%s", t->text,
                           suggest_text(&s, sb, sizeof sb, ""));
        }
        names[i] = t->text;
        sb_reset(&ld->kp, m);
    }
    sb_reset(&ld->kp, kp);
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
                return fail_at(ld, kk,
                               "a step is a map with one key (and `using` beside from or "
                               "through); found '%.64s' and '%.64s'",
                               key->text, kk->text);
        }
        if (!key)
            return fail_at(ld, step, "`using` stands beside from or through; this step has "
                                     "nothing else");
        if (is_step_key(key->text)) {
            kind = key->text;
            v = ymap_value(step, (int)(key == ymap_key(step, 0) ? 0 : 1));
            bare = 0;
        } else if (!ebb_op_find(key->text) && block_index(ld, key->text) < 0) {
            suggest sg = {.word = key->text};
            for (const char *const *p = STEP_KEYS; *p; p++)
                suggest_try(&sg, *p);
            suggest_ops(&sg);
            suggest_blocks(ld, &sg);
            char sb[128];
            return fail_at(ld, key, "unknown step, op or block '%.64s'%s", key->text,
                           suggest_text(&sg, sb, sizeof sb, ""));
        } else if (using) {
            return fail_at(ld, key,
                           "`using` stands beside from or through; write {through: %.64s, "
                           "using: [...]}",
                           key->text);
        }
        if (using && strcmp(kind, "from") != 0 && strcmp(kind, "through") != 0)
            return fail_at(ld, key, "`using` stands beside from or through, not %s", kind);
    }
    if (count_made(ld, step) != 0)
        return -1;
    size_t np_mark = sb_mark(&ld->np);
    sb_printf(&ld->np, ".%d", k);
    if (!bare && add_loc(ld, sb_str(&ld->np), step) != 0)
        return -1;
    if (!bare && strcmp(kind, "from") != 0 && strcmp(kind, "through") != 0 &&
        strcmp(kind, "repeat") != 0) {
        size_t m = sb_mark(&ld->np), km = sb_mark(&ld->kp);
        sb_printf(&ld->np, ".%s", kind);
        sb_printf(&ld->kp, ".%s", kind);
        int r = add_loc(ld, sb_str(&ld->np), step);
        sb_reset(&ld->np, m);
        sb_reset(&ld->kp, km);
        if (r != 0)
            return -1;
    }
    int rc = -1;
    int is_from = strcmp(kind, "from") == 0;
    if (is_main && k == 0 && !is_from) {
        rc = fail_at(ld, step, "the flow starts with `from` (the node that receives the first "
                               "input); got %s",
                     bare ? "a node" : kind);
    } else if (is_from && !is_main) {
        rc = fail_at(ld, step, "a sub-flow starts from the stream it is applied to; use "
                               "through instead of from");
    } else if (is_from && k > 0) {
        rc = fail_at(ld, step, "from is the first step of the flow only");
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
                    rc = check_builder(ld, b, step);
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
                rc = check_builder(ld, b, step);
            }
        }
    } else if (strcmp(kind, "split") == 0) {
        rc = step_split(ld, b, sc, st, step, v);
    } else if (strcmp(kind, "merge") == 0) {
        rc = step_merge(ld, b, sc, st, step, v);
    } else if (strcmp(kind, "tag") == 0) {
        size_t kp = sb_mark(&ld->kp);
        const char *name = NULL;
        if (need_one(ld, st, step, "tag") == 0)
            sb_printf(&ld->kp, ".tag");
        if (!ld->failed && read_name(ld, v, "a tag", &name) == 0) {
            const tagdef *old = scope_find(sc, name);
            const spec_input *target = find_target(ld->spec, name);
            if (!is_tag_name(name))
                rc = fail_at(ld, v, "a tag name is letters, digits, '_' and '-', starting with "
                                    "a letter or '_'; got '%.64s'",
                             name);
            else if (old)
                rc = fail_at(ld, v, "tag '%s' is already defined at line %d, column %d", name,
                             old->at->line, old->at->col);
            else if (target)
                rc = fail_at(ld, v, "tag '%s' has the name of the target at line %d, column %d",
                             name, target->at->line, target->at->col);
            else if (scope_add(ld, sc, name, v) == 0) {
                sb_reset(&ld->kp, kp);
                ebb_tag(b, name);
                rc = check_builder(ld, b, step);
            }
        }
    } else if (need_one(ld, st, step, kind) == 0) {
        size_t kp = sb_mark(&ld->kp);
        if (strcmp(kind, "repeat") == 0) {
            rc = step_repeat(ld, b, sc, step, v);
        } else {
            sb_printf(&ld->kp, ".%s", kind);
            rc = kind[0] == 'g'   ? step_gate(ld, b, sc, step, v)
                 : kind[0] == 's' ? step_switch(ld, b, sc, step, v)
                                  : step_loop(ld, b, sc, step, v);
        }
        sb_reset(&ld->kp, kp);
    }
    sb_reset(&ld->np, np_mark);
    return rc;
}

static int build_flow(loader *ld, ebb_builder *b, scope *sc, const ynode *steps, int is_main) {
    step_state st = {.open = is_main ? 0 : 1};
    int rc = 0;
    for (int k = 0; rc == 0 && k < steps->n; k++) {
        size_t kp = sb_mark(&ld->kp);
        sb_printf(&ld->kp, "[%d]", k);
        rc = build_step(ld, b, sc, steps, k, &st, is_main);
        sb_reset(&ld->kp, kp);
    }
    if (rc == 0 && st.open > 1) {
        size_t kp = sb_mark(&ld->kp);
        sb_reset(&ld->kp, 0);
        sb_printf(&ld->kp, "%s", st.split_kp ? st.split_kp : "");
        rc = fail_at(ld, st.split_at,
                     "the split leaves %d streams open at the end of the flow; merge them",
                     st.open);
        sb_reset(&ld->kp, kp);
    }
    free(st.split_kp);
    return rc;
}

/* ---- top level ------------------------------------------------------------------------------- */

static const char *const TOP_KEYS[] = {"ebb",    "name",    "params", "inputs",    "targets",
                                       "loss",   "outputs", "blocks", "precision", "flow",
                                       NULL};

static int read_params(loader *ld, const ynode *p) {
    ebb_spec *s = ld->spec;
    sb_printf(&ld->kp, "params");
    if (p->kind != Y_MAP)
        return fail_at(ld, p, "params must be a map {name: number}, got %s", describe(ld, p));
    s->params = ebb_arena_alloc(&s->mem, (size_t)(p->n ? p->n : 1) * sizeof *s->params);
    if (!s->params)
        return nomem(ld, p);
    for (int i = 0; i < p->n; i++) {
        const ynode *k = ymap_key(p, i), *v = ymap_value(p, i);
        size_t m = sb_mark(&ld->kp);
        sb_printf(&ld->kp, ".%s", k->text);
        if (!is_ident(k->text))
            return fail_at(ld, k, "a param name is letters, digits and '_', starting with a "
                                  "letter or '_'; got '%.64s'",
                           k->text);
        number val;
        if (read_value(ld, v, 0, "a param", &val) != 0)
            return -1;
        int64_t iv = val.i;
        double fv = val.f;
        int is_int = val.is_int;
        /* a caller's override replaces the value written in the file */
        for (int o = 0; o < ld->n_overrides; o++) {
            const char *ov = ld->overrides[o], *eq = strchr(ov, '=');
            if ((size_t)(eq - ov) != strlen(k->text) || strncmp(ov, k->text, (size_t)(eq - ov)))
                continue;
            ld->override_used[o] = 1;
            is_int = number_form(eq + 1) == NUM_INT;
            iv = is_int ? strtoll(eq + 1, NULL, 10) : 0;
            fv = strtod(eq + 1, NULL);
        }
        s->params[s->n_params++] =
            (spec_param){k->text, is_int ? (double)iv : fv, is_int ? iv : 0, is_int, k};
        sb_reset(&ld->kp, m);
    }
    sb_reset(&ld->kp, 0);
    return 0;
}

/* The dtype a spec names: "float32", "int64", ... as ebb_dtype_name() writes
 * them. */
static int read_dtype(loader *ld, const ynode *v, const char *what, const char *name,
                      ebb_dtype *out) {
    if (!v || v->kind != Y_SCALAR || is_null(v))
        return fail_at(ld, v, "the dtype of %s '%s' must be a name like int64, got %s", what,
                       name, describe(ld, v));
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
        suggest_try(&s, dn);
        if (kl < sizeof known)
            kl += (size_t)snprintf(known + kl, sizeof known - kl, "%s%s", kl ? ", " : "", dn);
    }
    char sb[128];
    return fail_at(ld, v, "unknown dtype '%.64s'%s (known: %s)", v->text,
                   suggest_text(&s, sb, sizeof sb, ""), known);
}

/* The dimensions of one input or target: a list of sizes, $params and
 * symbolic names. */
static int read_dims(loader *ld, const ynode *v, const char *what, spec_input *x) {
    if (v->n > EBB_MAX_DIMS)
        return fail_at(ld, v, "%s '%s' has %d dimensions; at most %d are supported", what,
                       x->name, v->n, EBB_MAX_DIMS);
    x->ndim = v->n;
    for (int d = 0; d < v->n; d++) {
        const ynode *dn = v->items[d];
        size_t dm = sb_mark(&ld->kp);
        sb_printf(&ld->kp, "[%d]", d);
        if (dn->kind == Y_SCALAR && !is_null(dn) && dn->text[0] != '$' &&
            number_form(dn->text) == NUM_NONE && !(dn->plain && looks_like_expr(dn->text))) {
            if (!is_ident(dn->text))
                return fail_at(ld, dn, "a dimension is a number, a $param or a symbolic name "
                                       "like batch; got '%.64s'",
                               dn->text);
            x->dim[d] = -1;
            x->sym[d] = dn->text;
        } else {
            if (dn->kind == Y_SCALAR && !dn->plain)
                return fail_at(ld, dn, "a dimension is a number, a $param or a symbolic name; "
                                       "got the string \"%.64s\"",
                               dn->text);
            if (read_int_range(ld, dn, "a dimension", 1, INT64_MAX / 1024, &x->dim[d]) != 0)
                return -1;
            x->sym[d] = NULL;
        }
        sb_reset(&ld->kp, dm);
    }
    return 0;
}

/* Reads `inputs` or `targets` (`key`; `what` is "input" or "target"): an
 * ordered map of names to a shape [dims] or {shape: [dims], dtype: NAME}. */
static int read_decls(loader *ld, const ynode *in, const char *key, const char *what,
                      spec_input **out, int *count) {
    ebb_spec *s = ld->spec;
    sb_printf(&ld->kp, "%s", key);
    if (in->kind != Y_MAP || in->n == 0)
        return fail_at(ld, in, "%s must be a map {name: [dims]} with at least one %s, got %s",
                       key, what, in->kind == Y_MAP ? "an empty map" : describe(ld, in));
    spec_input *list = ebb_arena_alloc(&s->mem, (size_t)in->n * sizeof *list);
    if (!list)
        return nomem(ld, in);
    *out = list;
    for (int i = 0; i < in->n; i++) {
        const ynode *k = ymap_key(in, i), *v = ymap_value(in, i);
        size_t m = sb_mark(&ld->kp);
        sb_printf(&ld->kp, ".%s", k->text);
        if (!is_tag_name(k->text))
            return fail_at(ld, k, "%s %s name is letters, digits, '_' and '-', starting with "
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
            if (check_keys(ld, v, in_what, keys) != 0)
                return -1;
            shape = ebb_ymap_get(v, "shape");
            dt = ebb_ymap_get(v, "dtype");
            if (!shape)
                return fail_at(ld, v, "%s '%s' needs a shape: {shape: [dims], dtype: NAME}", what,
                               k->text);
            sb_printf(&ld->kp, ".shape");
            if (shape->kind != Y_SEQ)
                return fail_at(ld, shape, "the shape of %s '%s' must be a list of dimensions "
                                          "like [batch, 64], got %s",
                               what, k->text, describe(ld, shape));
        } else if (!v || v->kind != Y_SEQ) {
            return fail_at(ld, v, "the shape of %s '%s' must be a list of dimensions like "
                                  "[batch, 64] (or {shape: [batch, 64], dtype: int64}), got %s",
                           what, k->text, describe(ld, v));
        }
        if (read_dims(ld, shape, what, x) != 0)
            return -1;
        if (dt) {
            sb_reset(&ld->kp, m);
            sb_printf(&ld->kp, ".%s.dtype", k->text);
            if (read_dtype(ld, dt, what, k->text, &x->dtype) != 0)
                return -1;
            x->has_dtype = 1;
        }
        (*count)++;
        sb_reset(&ld->kp, m);
    }
    sb_reset(&ld->kp, 0);
    return 0;
}

static int read_inputs(loader *ld, const ynode *in, scope *sc) {
    ebb_spec *s = ld->spec;
    if (read_decls(ld, in, "inputs", "input", &s->inputs, &s->n_inputs) != 0)
        return -1;
    for (int i = 0; i < s->n_inputs; i++)
        if (scope_add(ld, sc, s->inputs[i].name, s->inputs[i].at) != 0)
            return -1;
    return 0;
}

static const spec_input *find_target(const ebb_spec *s, const char *name) {
    for (int i = 0; i < s->n_targets; i++)
        if (strcmp(s->targets[i].name, name) == 0)
            return &s->targets[i];
    return NULL;
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
                sb_printf(&ld->kp, "targets.%s", s->targets[i].name);
                return fail_at(ld, s->targets[i].at,
                               "target '%s' has the name of the input at line %d, column %d",
                               s->targets[i].name, s->inputs[j].at->line,
                               s->inputs[j].at->col);
            }
    return 0;
}

/* Reads `loss`: an op name, or {op: {attributes}}. `key` is the `loss` key,
 * where a loss without targets is reported. */
static int read_loss(loader *ld, ebb_builder *b, const ynode *key, const ynode *v) {
    ebb_spec *s = ld->spec;
    sb_printf(&ld->kp, "loss");
    if (s->n_targets == 0)
        return fail_at(ld, key, "a loss compares the final stream with targets, and the spec "
                                "declares none; add `targets:` (e.g. {y: {shape: [batch], "
                                "dtype: int64}})");
    const ynode *opn = v, *attrs = NULL;
    if (v && v->kind == Y_MAP) {
        if (v->n != 1)
            return fail_at(ld, v, "a loss map has exactly one key, the op name: {op: "
                                  "{attributes}}; this one has %d",
                           v->n);
        opn = ymap_key(v, 0);
        attrs = ymap_value(v, 0);
    }
    if (!opn || opn->kind != Y_SCALAR || is_null(opn))
        return fail_at(ld, v ? v : key, "loss takes a loss op (cross_entropy, mse, "
                                        "bce_with_logits, nll), or {op: {attributes}}, got %s",
                       describe(ld, v));
    const ebb_op *op = ebb_op_find(opn->text);
    if (!op || opn->text[0] == '_') {
        suggest sg = {.word = opn->text};
        suggest_ops(&sg);
        char sb[128];
        return fail_at(ld, opn, "unknown loss op '%.64s'%s", opn->text,
                       suggest_text(&sg, sb, sizeof sb, ""));
    }
    int n = 1 + s->n_targets, min = op->min_inputs, max = op->max_inputs;
    if (n < min || (max >= 0 && n > max)) {
        char want[64];
        if (min == max)
            snprintf(want, sizeof want, "%d input%s", min, min == 1 ? "" : "s");
        else if (max < 0)
            snprintf(want, sizeof want, "at least %d inputs", min);
        else
            snprintf(want, sizeof want, "%d to %d inputs", min, max);
        return fail_at(ld, opn, "%s takes %s (the final stream, then the targets), but the "
                                "spec declares %d target%s",
                       op->name, want, s->n_targets, s->n_targets == 1 ? "" : "s");
    }
    strbuf text = {0};
    int rc = read_op_attrs(ld, op, opn, attrs, &text, NULL);
    if (rc == 0 && text.oom)
        rc = nomem(ld, v);
    if (rc == 0) {
        ebb_loss(b, op->name, text.len ? text.s : NULL);
        rc = check_builder(ld, b, opn);
    }
    /* a training plan's loss step has the node path "loss" */
    if (rc == 0) {
        sb_reset(&ld->kp, 0);
        sb_printf(&ld->kp, "loss");
        ld->spec->loss_loc = ld->spec->n_locs;
        rc = add_loc(ld, "loss", opn);
    }
    free(text.s);
    if (rc == 0)
        sb_reset(&ld->kp, 0);
    return rc;
}

static int read_blocks(loader *ld, const ynode *bl) {
    sb_printf(&ld->kp, "blocks");
    if (bl->kind != Y_MAP)
        return fail_at(ld, bl, "blocks must be a map {name: NODE}, got %s", describe(ld, bl));
    for (int i = 0; i < bl->n; i++) {
        const ynode *k = ymap_key(bl, i);
        size_t m = sb_mark(&ld->kp);
        sb_printf(&ld->kp, ".%s", k->text);
        if (!is_ident(k->text))
            return fail_at(ld, k, "a block name is letters, digits and '_', starting with a "
                                  "letter or '_'; got '%.64s'",
                           k->text);
        if (ebb_op_find(k->text))
            return fail_at(ld, k, "block '%s' has the name of an op; rename the block", k->text);
        if (is_step_key(k->text))
            return fail_at(ld, k, "block '%s' has the name of a step; rename the block", k->text);
        sb_reset(&ld->kp, m);
    }
    ld->blocks = bl;
    ld->block_used = calloc((size_t)(bl->n ? bl->n : 1), sizeof *ld->block_used);
    if (!ld->block_used)
        return nomem(ld, bl);
    sb_reset(&ld->kp, 0);
    return 0;
}

/* Reads `outputs`: the first names the final stream, the rest are tags that
 * must exist in the main flow (checked after it is read). */
static int read_outputs(loader *ld, ebb_builder *b, const ynode *out) {
    sb_printf(&ld->kp, "outputs");
    if (out->kind != Y_SEQ || out->n == 0)
        return fail_at(ld, out, "outputs must be a list of names like [y, h], got %s",
                       out->kind == Y_SEQ ? "an empty list" : describe(ld, out));
    for (int i = 0; i < out->n; i++) {
        const ynode *o = out->items[i];
        size_t m = sb_mark(&ld->kp);
        sb_printf(&ld->kp, "[%d]", i);
        const char *name = NULL;
        if (read_name(ld, o, "an output", &name) != 0)
            return -1;
        if (!is_tag_name(name))
            return fail_at(ld, o, "an output name is letters, digits, '_' and '-', starting "
                                  "with a letter or '_'; got '%.64s'",
                           name);
        for (int j = 0; j < i; j++)
            if (strcmp(out->items[j]->text, name) == 0)
                return fail_at(ld, o, "output '%s' is listed twice (first at line %d)", name,
                               out->items[j]->line);
        if (i == 0)
            ebb_output_final(b, name);
        else
            ebb_output(b, name);
        if (check_builder(ld, b, o) != 0)
            return -1;
        sb_reset(&ld->kp, m);
    }
    sb_reset(&ld->kp, 0);
    return 0;
}

static int check_outputs(loader *ld, const ynode *out, const scope *sc) {
    sb_printf(&ld->kp, "outputs");
    for (int i = 1; i < out->n; i++) {
        const ynode *o = out->items[i];
        if (scope_find(sc, o->text))
            continue;
        sb_printf(&ld->kp, "[%d]", i);
        suggest s = {.word = o->text};
        for (int j = 0; j < sc->n; j++)
            suggest_try(&s, sc->tags[j].name);
        char sb[128];
        return fail_at(ld, o, "output '%s' is not a tag of the flow%s", o->text,
                       suggest_text(&s, sb, sizeof sb, ""));
    }
    sb_reset(&ld->kp, 0);
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
        return fail_at(ld, NULL, "the spec is empty; a spec starts with 'ebb: %d'", EBB_SPEC_FORMAT);
    if (root->kind != Y_MAP)
        return fail_at(ld, root, "a spec is a map of keys (ebb, inputs, flow, ...), got %s",
                       describe(ld, root));
    if (check_keys(ld, root, "the spec", TOP_KEYS) != 0)
        return -1;
    const ynode *ver = ebb_ymap_get(root, "ebb");
    if (!ver)
        return fail_at(ld, root, "missing 'ebb: %d' (the format version)", EBB_SPEC_FORMAT);
    int64_t version = 0;
    sb_printf(&ld->kp, "ebb");
    if (read_number(ld, ver, 1, "the format version", &version, NULL) != 0)
        return -1;
    if (version != EBB_SPEC_FORMAT)
        return fail_at(ld, ver, "format version %lld is not supported; this ebb reads format %d",
                       (long long)version, EBB_SPEC_FORMAT);
    sb_reset(&ld->kp, 0);

    const ynode *name = ebb_ymap_get(root, "name");
    if (name) {
        sb_printf(&ld->kp, "name");
        if (read_name(ld, name, "the graph name", &s->name) != 0)
            return -1;
        if (!ebb_graph_valid_node_name(s->name))
            return fail_at(ld, name, "a graph name is letters, digits, '_', '-' and inner '.'; "
                                     "got '%.64s'",
                           s->name);
        sb_reset(&ld->kp, 0);
    } else {
        s->name = default_name(&s->mem, s->file);
        if (!s->name)
            return nomem(ld, root);
    }

    /* mixed precision, as --precision asks it (which overrides it) */
    const ynode *precision = ebb_ymap_get(root, "precision");
    if (precision) {
        sb_printf(&ld->kp, "precision");
        if (precision->kind != Y_SCALAR || is_null(precision) ||
            ebb_precision_parse(&s->precision, precision->text) != EBB_OK) {
            ebb_error_clear();
            return fail_at(ld, precision, "must be fp32, bf16 or fp16, got %s",
                           describe(ld, precision));
        }
        sb_reset(&ld->kp, 0);
    }

    const ynode *params = ebb_ymap_get(root, "params");
    if (params && !is_null(params) && read_params(ld, params) != 0)
        return -1;
    const ynode *blocks = ebb_ymap_get(root, "blocks");
    if (blocks && !is_null(blocks) && read_blocks(ld, blocks) != 0)
        return -1;

    const ynode *inputs = ebb_ymap_get(root, "inputs");
    if (!inputs)
        return fail_at(ld, root, "missing 'inputs' (a map {name: [dims]})");
    scope top = {0};
    ebb_builder *b = NULL;
    int rc = read_inputs(ld, inputs, &top);
    if (rc == 0) {
        b = ebb_builder_new(s->name);
        if (!b)
            rc = nomem(ld, root);
    }
    for (int i = 0; rc == 0 && i < s->n_inputs; i++) {
        ebb_input(b, s->inputs[i].name);
        rc = check_builder(ld, b, ymap_key(inputs, i));
    }
    const ynode *targets = ebb_ymap_get(root, "targets");
    if (rc == 0 && targets)
        rc = read_targets(ld, targets);
    for (int i = 0; rc == 0 && i < s->n_targets; i++) {
        ebb_target(b, s->targets[i].name);
        rc = check_builder(ld, b, s->targets[i].at);
    }
    for (int i = 0; rc == 0 && i < root->n; i++)
        if (strcmp(ymap_key(root, i)->text, "loss") == 0)
            rc = read_loss(ld, b, ymap_key(root, i), ymap_value(root, i));
    const ynode *outputs = ebb_ymap_get(root, "outputs");
    if (rc == 0 && outputs)
        rc = read_outputs(ld, b, outputs);
    const ynode *flow = ebb_ymap_get(root, "flow");
    if (rc == 0 && !flow)
        rc = fail_at(ld, root, "missing 'flow' (the list of steps)");
    if (rc == 0) {
        sb_printf(&ld->kp, "flow");
        if (flow->kind != Y_SEQ || flow->n == 0)
            rc = fail_at(ld, flow, "flow must be a list of steps, got %s",
                         flow->kind == Y_SEQ ? "an empty list" : describe(ld, flow));
        if (rc == 0) {
            sb_printf(&ld->np, "flow");
            rc = build_flow(ld, b, &top, flow, 1);
        }
        sb_reset(&ld->kp, 0);
    }
    if (rc == 0 && outputs)
        rc = check_outputs(ld, outputs, &top);
    for (int i = 0; rc == 0 && ld->blocks && i < ld->blocks->n; i++)
        if (!ld->block_used[i]) {
            sb_printf(&ld->kp, "blocks.%s", ymap_key(ld->blocks, i)->text);
            rc = fail_at(ld, ymap_key(ld->blocks, i), "block '%s' is never used",
                         ymap_key(ld->blocks, i)->text);
        }
    if (rc == 0) {
        s->graph = ebb_build(b);
        if (!s->graph)
            rc = fail_at(ld, flow, "%s", ebb_errmsg());
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
        num_form f = number_form(eq + 1);
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
            suggest_try(sg, sym);
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
                                 suggest_text(&sg, sb, sizeof sb, ""));
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
