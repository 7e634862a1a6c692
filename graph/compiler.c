/* The compiler's state and the helpers that grow the plan, below every
 * pass: new values and steps, their slot lists, the dry run's meta
 * tensors; and the plan's release. Each helper that fails sets c->status
 * (with the message) and returns -1 or NULL. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

/* ---- growing the plan ------------------------------------------------------ */

char *ebb_compiler_strdupf(const char *fmt, ...) {
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

int *ebb_compiler_dup_ints(const int *v, int n) {
    if (n == 0)
        return NULL;
    int *d = malloc((size_t)n * sizeof *d);
    if (d)
        memcpy(d, v, (size_t)n * sizeof *d);
    return d;
}

int ebb_compiler_fail(compiler *c, ebb_status st) {
    c->status = st;
    return -1;
}

int ebb_compiler_oom(compiler *c) {
    c->status = ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    return -1;
}

/* A new slot whose shape comes from `meta` (ownership passes to the compiler). */
int ebb_compiler_value_new(compiler *c, ebb_tensor *meta, ebb_value_kind kind, int producer,
                     int alias_of) {
    ebb_plan *p = c->plan;
    if (p->n_values == c->cap_values) {
        int cap = c->cap_values ? 2 * c->cap_values : 32;
        ebb_plan_value *v = realloc(p->values, (size_t)cap * sizeof *v);
        if (!v) {
            ebb_tensor_free(meta);
            return ebb_compiler_oom(c);
        }
        p->values = v;
        ebb_tensor **m = realloc(c->meta, (size_t)cap * sizeof *m);
        if (!m) {
            ebb_tensor_free(meta);
            return ebb_compiler_oom(c);
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

plan_step *ebb_compiler_step_new(compiler *c, ebb_step_kind kind, const char *op_name,
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
            ebb_compiler_oom(c);
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
    s->pub.param = -1;
    s->pub.node = ebb_compiler_strdupf("%s", path);
    if (!s->pub.node) {
        ebb_compiler_oom(c);
        return NULL;
    }
    p->n_steps++;
    return s;
}

int ebb_compiler_step_set_slots(compiler *c, plan_step *s, const int *in, int n_in, const int *out,
                          int n_out) {
    s->pub.in = ebb_compiler_dup_ints(in, n_in);
    s->pub.n_in = n_in;
    s->pub.out = ebb_compiler_dup_ints(out, n_out);
    s->pub.n_out = n_out;
    if ((n_in && !s->pub.in) || (n_out && !s->pub.out))
        return ebb_compiler_oom(c);
    if (n_in > c->plan->max_in)
        c->plan->max_in = n_in;
    return 0;
}

int ebb_compiler_step_index(const compiler *c, const plan_step *s) {
    return (int)(s - c->plan->steps);
}

ebb_tensor *ebb_compiler_meta_ref(compiler *c, int slot) {
    ebb_tensor *t = NULL;
    if (ebb_tensor_ref(&t, c->meta[slot]) != EBB_OK) {
        c->status = ebb_errcode();
        return NULL;
    }
    return t;
}

ebb_tensor *ebb_compiler_meta_new(compiler *c, const ebb_shape *s, ebb_dtype dt) {
    ebb_tensor *t = NULL;
    if (ebb_tensor_empty(&t, s, dt, c->meta_device) != EBB_OK) {
        c->status = ebb_errcode();
        return NULL;
    }
    return t;
}

/* Drops the steps marked in gone[] (before liveness: nothing reads their
 * outputs). Jumps and producers are renumbered; a dropped step's outputs
 * stay as slots no step writes, of no bytes. */
int ebb_compiler_steps_remove(compiler *c, const unsigned char *gone) {
    ebb_plan *p = c->plan;
    int *to = malloc(((size_t)p->n_steps + 1) * sizeof *to), n = 0;
    if (!to)
        return ebb_compiler_oom(c);
    for (int i = 0; i < p->n_steps; i++)
        to[i] = n, n += !gone[i];
    to[p->n_steps] = n;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        if (!gone[i]) {
            if (s->pub.jump >= 0)
                s->pub.jump = to[s->pub.jump];
            p->steps[to[i]] = *s;
            continue;
        }
        for (int k = 0; k < s->pub.n_out; k++) {
            p->values[s->pub.out[k]].producer = -1;
            p->values[s->pub.out[k]].nbytes = 0;
        }
        free((char *)s->pub.node);
        free((int *)s->pub.in);
        free((int *)s->pub.out);
        free(s->op_owned);
    }
    for (int v = 0; v < p->n_values; v++)
        if (p->values[v].producer >= 0)
            p->values[v].producer = to[p->values[v].producer];
    p->n_steps = n;
    free(to);
    return 0;
}

/* ---- what a step runs on ---------------------------------------------------- */

uint32_t ebb_low_copy_params(const ebb_plan *p, const plan_step *s) {
    uint32_t m = 0;
    for (int j = 0; s->param_cast && j < s->n_params; j++) {
        const plan_param *pp = &p->params[s->param[j]];
        if (!pp->spec.counter && s->param_dtype != p->dtype)
            m |= 1u << j;
    }
    return m;
}

/* ---- release ----------------------------------------------------------------- */

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
        free(s->op_owned);
        free(s->owners);
        free(s->sums_of);
    }
    free(p->steps);
    free(p->values);
    free(p->inputs);
    free(p->outputs);
    free(p->output_names);
    free(p->trained);
    free(p->deferred);
    free(p->no_decay);
    free(p->out_param);
    free(p->owner);
    for (int i = 0; i < p->n_params; i++) {
        free(p->params[i].full_name);
        free(p->params[i].node);
        for (int k = 0; k < p->params[i].n_aliases; k++)
            free(p->params[i].aliases[k]);
        free(p->params[i].aliases);
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
