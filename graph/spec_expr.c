/* Integer arithmetic on a spec's params (`width * 4`, `(d + 1) / 2`),
 * checked for overflow and division by zero, and typed values read with
 * their ranges. */
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

/* ---- integer arithmetic on params ------------------------------------------------ */

/* Where a number is wanted, a plain scalar may compute it from params:
 * `$d*3`, `$d/$heads`, `($d+1)*2`, `-$d`. Integers only, with the usual
 * precedence; `/` must divide exactly, `//` rounds down as Python's does
 * (Meta's `multiple_of * ((h + multiple_of - 1) // multiple_of)`), and
 * overflow and division by zero are errors. Every error points at the scalar. Parentheses and signs nest at
 * most EXPR_MAX_DEPTH deep, so a hostile scalar cannot exhaust the stack. */
#define EXPR_MAX_DEPTH 32

void ebb_load_expr_space(expr *e) {
    while (isspace((unsigned char)*e->p))
        e->p++;
}

/* A syntax error: "WHAT must be an integer, got 'TEXT' (DETAIL)". */
int ebb_load_expr_syntax(expr *e, const char *detail) {
    char near[40];
    if (*e->p)
        snprintf(near, sizeof near, "'%.16s'", e->p);
    else
        snprintf(near, sizeof near, "the end");
    return ebb_load_fail_at(e->ld, e->at, "%s must be an integer, got '%.64s' (%s at %s)", e->what,
                            e->at->text, detail, near);
}

static int expr_overflow(expr *e, int64_t a, char op, int64_t b) {
    return ebb_load_fail_at(e->ld, e->at, "in '%.64s': %lld %c %lld overflows a 64-bit integer",
                            e->at->text, (long long)a, op, (long long)b);
}

static int expr_deeper(expr *e) {
    if (++e->depth <= EXPR_MAX_DEPTH)
        return 0;
    return ebb_load_fail_at(e->ld, e->at,
                            "in '%.64s': parentheses and signs nest more than %d deep", e->at->text,
                            EXPR_MAX_DEPTH);
}


/* A number, a $param or a parenthesised expression. */
static int expr_primary(expr *e, int64_t *out) {
    ebb_load_expr_space(e);
    const char *start = e->p;
    if (*e->p == '(') {
        e->p++;
        if (expr_deeper(e) != 0 || ebb_load_expr_sum(e, out) != 0) return -1;
        ebb_load_expr_space(e);
        if (*e->p != ')')
            return ebb_load_expr_syntax(e, "a '(' lacks its ')'");
        e->p++;
        e->depth--;
        return 0;
    }
    if (*e->p == '$') {
        const char *name = ++e->p;
        if (!(isalpha((unsigned char)*name) || *name == '_'))
            return ebb_load_expr_syntax(e, "expected a param name after '$'");
        while (isalnum((unsigned char)*e->p) || *e->p == '_')
            e->p++;
        size_t len = (size_t)(e->p - name);
        const spec_param *p = ebb_load_find_param_n(e->ld, name, len);
        if (!p)
            return ebb_load_fail_undefined_param(e->ld, e->at, name, len);
        if (!p->is_int)
            return ebb_load_fail_at(e->ld, e->at,
                                    "in '%.64s': param $%s is %.17g; arithmetic takes "
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
            return ebb_load_fail_at(e->ld, e->at,
                                    "in '%.64s': '%.*s' is not an integer; arithmetic "
                                    "takes integers only",
                                    e->at->text,
                                    (int)((size_t)(e->p - start) < 32 ? e->p - start : 32), start);
        }
        if (len > 1 && start[0] == '0')
            return ebb_load_fail_at(e->ld, e->at,
                                    "in '%.64s': '%.*s' has a leading zero (YAML 1.1 "
                                    "reads such numbers as octal); write it without",
                                    e->at->text, (int)(len < 32 ? len : 32), start);
        errno = 0;
        long long v = strtoll(start, NULL, 10);
        if (errno)
            return ebb_load_fail_at(e->ld, e->at, "in '%.64s': %.*s is out of range", e->at->text,
                                    (int)(len < 32 ? len : 32), start);
        *out = v;
        return 0;
    }
    if (isalpha((unsigned char)*e->p) || *e->p == '_') {
        while (isalnum((unsigned char)*e->p) || *e->p == '_')
            e->p++;
        return ebb_load_fail_at(e->ld, e->at,
                                "in '%.64s': '%.*s' is not a number or a $param (a "
                                "symbolic dimension cannot take part in arithmetic)",
                                e->at->text, (int)(e->p - start < 32 ? e->p - start : 32), start);
    }
    return ebb_load_expr_syntax(e, "expected a number, a $param or '('");
}

/* A signed primary: -x, +x. */
static int expr_unary(expr *e, int64_t *out) {
    ebb_load_expr_space(e);
    if (*e->p != '-' && *e->p != '+')
        return expr_primary(e, out);
    char sign = *e->p++;
    int64_t v = 0;
    if (expr_deeper(e) != 0 || expr_unary(e, &v) != 0)
        return -1;
    e->depth--;
    if (sign == '-') {
        if (v == INT64_MIN)
            return ebb_load_fail_at(e->ld, e->at, "in '%.64s': -(%lld) overflows a 64-bit integer",
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
        ebb_load_expr_space(e);
        char op = *e->p;
        if (op != '*' && op != '/')
            break;
        e->p++;
        int floor_div = op == '/' && *e->p == '/';
        if (floor_div)
            e->p++;
        int64_t b = 0;
        if (expr_unary(e, &b) != 0)
            return -1;
        if (op == '*') {
            if (!mul_fits(a, b))
                return expr_overflow(e, a, op, b);
            a *= b;
        } else if (b == 0) {
            return ebb_load_fail_at(e->ld, e->at, "in '%.64s': division by zero (%lld %s 0)",
                                    e->at->text, (long long)a, floor_div ? "//" : "/");
        } else if (a == INT64_MIN && b == -1) {
            return expr_overflow(e, a, op, b);
        } else if (floor_div) {
            int64_t q = a / b; /* toward zero; Python's // rounds toward -inf */
            a = q - ((a % b != 0) && ((a < 0) != (b < 0)));
        } else if (a % b != 0) {
            return ebb_load_fail_at(e->ld, e->at,
                                    "in '%.64s': %lld is not divisible by %lld; '/' must "
                                    "divide exactly ('//' rounds down)",
                                    e->at->text, (long long)a, (long long)b);
        } else {
            a /= b;
        }
    }
    *out = a;
    return 0;
}

int ebb_load_expr_sum(expr *e, int64_t *out) {
    int64_t a = 0;
    if (expr_product(e, &a) != 0)
        return -1;
    for (;;) {
        ebb_load_expr_space(e);
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
int ebb_load_looks_like_expr(const char *s) {
    if (strchr(s, '$') || strchr(s, '(') || strchr(s, '*') || strchr(s, '/'))
        return 1;
    return s[0] && (strchr(s + 1, '+') || strchr(s + 1, '-'));
}

/* Evaluates the whole scalar y as an integer expression. */
static int eval_expr(loader *ld, const ynode *y, const char *what, int64_t *out) {
    expr e = {.ld = ld, .at = y, .what = what, .p = y->text};
    if (ebb_load_expr_sum(&e, out) != 0) return -1;
    ebb_load_expr_space(&e);
    if (*e.p)
        return ebb_load_expr_syntax(&e, *e.p == ')' ? "a ')' without its '('" : "expected an operator");
    return 0;
}


/* Reads a number: a plain decimal scalar, "$param", or arithmetic on params
 * (an integer). `what` describes the place for messages ("attribute 'out' of
 * linear"). */
int ebb_load_read_value(loader *ld, const ynode *y, int want_int, const char *what, number *out) {
    if (!y || y->kind != Y_SCALAR)
        return ebb_load_fail_at(ld, y, "%s must be %s, got %s", what,
                                want_int ? "an integer" : "a number", ebb_load_describe(ld, y));
    if (!y->plain)
        return ebb_load_fail_at(ld, y,
                                "%s must be %s, got the string \"%.64s\" (remove the quotes)", what,
                                want_int ? "an integer" : "a number", y->text);
    if (y->text[0] == '$' && ebb_load_is_ident(y->text + 1)) {
        const spec_param *p = ebb_load_find_param(ld, y->text + 1);
        if (!p)
            return ebb_load_fail_undefined_param(ld, y, y->text + 1, strlen(y->text + 1));
        if (want_int && !p->is_int)
            return ebb_load_fail_at(ld, y, "%s must be an integer, but param %s is %.17g", what,
                                    y->text, p->value);
        *out = (number){p->is_int, p->is_int ? p->ivalue : 0, p->value};
        return 0;
    }
    num_form f = ebb_load_number_form(y->text);
    if (f == NUM_NONE && ebb_load_looks_like_expr(y->text)) {
        int64_t v = 0;
        if (eval_expr(ld, y, what, &v) != 0)
            return -1;
        *out = (number){1, v, (double)v};
        return 0;
    }
    if (f == NUM_NONE)
        return ebb_load_fail_at(ld, y, "%s must be %s, got '%.64s'", what,
                                want_int ? "an integer" : "a number", y->text);
    if (want_int && f != NUM_INT)
        return ebb_load_fail_at(ld, y, "%s must be an integer, got %.64s", what, y->text);
    errno = 0;
    if (f == NUM_INT) {
        long long v = strtoll(y->text, NULL, 10);
        if (errno)
            return ebb_load_fail_at(ld, y, "%s: %.64s is out of range", what, y->text);
        *out = (number){1, v, (double)v};
        return 0;
    }
    double v = strtod(y->text, NULL);
    if (errno || !isfinite(v))
        return ebb_load_fail_at(ld, y, "%s: %.64s is out of range", what, y->text);
    *out = (number){0, 0, v};
    return 0;
}

int ebb_load_read_number(loader *ld, const ynode *y, int want_int, const char *what, int64_t *i_out,
                         double *f_out) {
    number n;
    if (ebb_load_read_value(ld, y, want_int, what, &n) != 0) return -1;
    if (i_out)
        *i_out = n.is_int ? n.i : 0;
    if (f_out)
        *f_out = n.f;
    return 0;
}

int ebb_load_read_int_range(loader *ld, const ynode *y, const char *what, int64_t lo, int64_t hi,
                            int64_t *out) {
    if (ebb_load_read_number(ld, y, 1, what, out, NULL) != 0) return -1;
    if (*out < lo || *out > hi) {
        if (hi == INT64_MAX)
            return ebb_load_fail_at(ld, y, "%s must be >= %lld, got %lld", what, (long long)lo,
                                    (long long)*out);
        return ebb_load_fail_at(ld, y, "%s must be between %lld and %lld, got %lld", what,
                                (long long)lo, (long long)hi, (long long)*out);
    }
    return 0;
}

/* A scalar used as a name. */
int ebb_load_read_name(loader *ld, const ynode *y, const char *what, const char **out) {
    if (!y || y->kind != Y_SCALAR || ebb_load_is_null(y))
        return ebb_load_fail_at(ld, y, "%s must be a name, got %s", what,
                                y && y->kind == Y_SCALAR ? "nothing" : ebb_load_describe(ld, y));
    *out = y->text;
    return 0;
}

/* Checks the keys of a map against a list; unknown ones get a suggestion. */
int ebb_load_check_keys(loader *ld, const ynode *m, const char *what, const char *const *known) {
    for (int i = 0; i < m->n; i++) {
        const ynode *k = ymap_key(m, i);
        int ok = 0;
        for (const char *const *p = known; *p; p++)
            ok |= strcmp(*p, k->text) == 0;
        if (ok)
            continue;
        suggest s = {.word = k->text};
        for (const char *const *p = known; *p; p++)
            ebb_load_suggest_try(&s, *p);
        char sb[128];
        return ebb_load_fail_at(ld, k, "unknown key '%.64s' in %s%s", k->text, what,
                                ebb_load_suggest_text(&s, sb, sizeof sb, ""));
    }
    return 0;
}

