/* Predicted memory: plain counting over the steps, the way the executor will
 * walk them.
 *
 * Storage is counted per alias class: a view or an in-place output joins its
 * source's class, and a class's bytes leave when its last slot is freed. The
 * walk follows the plan's control flow with one fixed choice at every branch
 * point, chosen so that the figure is never below any run's:
 *
 *   - a switch branch or top-k expert is entered (skipping one only frees
 *     earlier), and is counted as if every row took it, with its row gather
 *     and row index as fresh storage of the full batch;
 *   - a loop body is walked twice: the first iteration may start from a
 *     value the plan does not count (a graph input), every later one starts
 *     from the previous iteration's state, and from the second on they are
 *     all alike;
 *   - a loop test never leaves early.
 *
 * Where control flow depends on tensor values (a route, a while/until test)
 * the result is therefore an upper bound; elsewhere it is exact. Each step's
 * recorded figures are the largest over its visits. */
#include <stdlib.h>

#include "compile_internal.h"

/* Walking more steps than this means loops nested absurdly deep (each level
 * doubles the walk). */
#define EBB_MAX_WALK 100000000LL

/* at::nonzero's own bookkeeping beside its result: 12 bytes measured on the
 * CPU with libtorch 1.13 whatever the thread count, with room to spare. */
#define NONZERO_SCRATCH 64

typedef struct walk {
    int *cls;       /* slot -> class, or -1 */
    int64_t *bytes; /* class -> bytes */
    int *refs;      /* class -> slots in it */
    int n_cls, cap_cls;
    int64_t live;
    int64_t granule;
    int oom;
} walk;

static int64_t rounded(const walk *w, int64_t n) {
    return w->granule && n > 0 ? (n + w->granule - 1) / w->granule * w->granule : n;
}

/* A step's declared scratch as the allocator holds it: on CUDA the op's own
 * CUDA figure where it has one (already in blocks), else its bytes as one
 * block. */
static int64_t workspace_rounded(const walk *w, const plan_step *s) {
    if (w->granule && s->has_workspace_cuda)
        return rounded(w, s->workspace_cuda);
    return rounded(w, s->workspace);
}

/* Moves slot v into class `to` (-1: none), releasing its old class's bytes
 * when v was the last slot in it. */
static void move_slot(walk *w, int v, int to) {
    int from = w->cls[v];
    if (to == from)
        return;
    if (from >= 0 && --w->refs[from] == 0)
        w->live -= w->bytes[from];
    if (to >= 0 && w->refs[to]++ == 0)
        w->live += w->bytes[to];
    w->cls[v] = to;
}

/* A new class of n bytes: every allocation is one, so a slot written again
 * (a loop's second walk) never disturbs views of its earlier storage. */
static int new_class(walk *w, int64_t n) {
    if (w->n_cls == w->cap_cls) {
        int cap = w->cap_cls ? 2 * w->cap_cls : 64;
        int64_t *b = realloc(w->bytes, (size_t)cap * sizeof *b);
        if (b)
            w->bytes = b;
        int *r = b ? realloc(w->refs, (size_t)cap * sizeof *r) : NULL;
        if (r)
            w->refs = r;
        if (!b || !r) {
            w->oom = 1;
            return -1;
        }
        w->cap_cls = cap;
    }
    w->bytes[w->n_cls] = rounded(w, n);
    w->refs[w->n_cls] = 0;
    return w->n_cls++;
}

static int64_t value_full_bytes(const ebb_plan_value *v) {
    return ebb_shape_numel(&v->shape) * (int64_t)ebb_dtype_size(v->dtype);
}

/* The batch a routed step works on: the route table's first dimension. */
static int64_t route_batch(const ebb_plan *p, int route_slot) {
    const ebb_plan_value *r = &p->values[route_slot];
    return r->shape.ndim ? r->shape.dim[0] : 1;
}

/* Scratch a routing step allocates and releases inside its call, beyond its
 * outputs, as blocks (each rounded on its own for CUDA). What the executor
 * makes (src/exec.c) is what is counted here:
 *   route, top-k:  the top-k values and indices, their row sums and the
 *                  renormalised weights, before they are scattered into the
 *                  [B, experts] table;
 *   enter:         the boolean row mask the row indices come from, and the
 *                  little at::nonzero keeps while it counts;
 *   exit:          a second accumulator while a whole-batch branch's sum is
 *                  formed (or the weighted contribution of a partial one,
 *                  never larger), and for top-k the rows' picked weights. */
static int64_t routing_scratch(const walk *w, const ebb_plan *p, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    switch (ps->kind) {
    case EBB_STEP_ROUTE: {
        if (s->mode != EBB_ROUTE_TOPK)
            return 0;
        const ebb_plan_value *t = &p->values[ps->out[0]];
        int64_t b = route_batch(p, ps->out[0]), k = s->top_k;
        int64_t e = (int64_t)ebb_dtype_size(t->dtype);
        return rounded(w, b * k * e) + rounded(w, b * k * 8) + rounded(w, b * e) +
               rounded(w, b * k * e);
    }
    case EBB_STEP_ENTER:
        return rounded(w, route_batch(p, ps->in[1])) + rounded(w, NONZERO_SCRATCH);
    case EBB_STEP_EXIT: {
        const ebb_plan_value *acc = &p->values[ps->out[0]];
        int64_t n = rounded(w, value_full_bytes(acc));
        if (s->mode == EBB_ROUTE_TOPK) {
            const ebb_plan_value *t = &p->values[ps->in[2]];
            n += rounded(w, route_batch(p, ps->in[2]) * (int64_t)ebb_dtype_size(t->dtype));
        }
        return n;
    }
    case EBB_STEP_EXIT_BACKWARD: {
        /* the gathered gradient rows (the output itself); for top-k the
         * weighted copy, the product with y and its row sums, and the
         * gathered weights */
        if (s->mode != EBB_ROUTE_TOPK)
            return 0;
        const ebb_plan_value *gy = &p->values[ps->out[0]];
        const ebb_plan_value *t = &p->values[ps->in[2]];
        int64_t rows = route_batch(p, ps->in[2]) * (int64_t)ebb_dtype_size(t->dtype);
        return 2 * rounded(w, value_full_bytes(gy)) + 3 * rounded(w, rows) +
               rounded(w, NONZERO_SCRATCH);
    }
    case EBB_STEP_ENTER_BACKWARD: return rounded(w, NONZERO_SCRATCH);
    case EBB_STEP_ROUTE_BACKWARD: {
        /* the chosen mask, masked weights, g·table, g − dot, the quotient, and
         * the boolean mask promoted twice; row sums of two; all held to the
         * end (a bound: the plan routes, so nothing here is exact anyway) */
        const ebb_plan_value *t = &p->values[ps->in[1]];
        int64_t table = value_full_bytes(t), rows = route_batch(p, ps->in[1]) *
                                                    (int64_t)ebb_dtype_size(t->dtype);
        return 7 * rounded(w, table) + 3 * rounded(w, rows);
    }
    default: return 0;
    }
}

/* The class a step's k-th output joins. */
static int output_class(walk *w, const ebb_plan *p, const plan_step *s, int k) {
    int v = s->pub.out[k];
    const ebb_plan_value *val = &p->values[v];
    switch (s->pub.kind) {
    case EBB_STEP_EXIT:
        /* the first exit to run makes the accumulator, later ones add into it */
        return w->cls[v] >= 0 ? w->cls[v] : new_class(w, val->nbytes);
    case EBB_STEP_ENTER_BACKWARD:
        return w->cls[v]; /* added into in place */
    case EBB_STEP_EXIT_BACKWARD:
        if (k == 1)
            return w->cls[v]; /* the route's gradient, added into in place */
        return new_class(w, value_full_bytes(val));
    case EBB_STEP_ROUTE:
        return k == 1 ? -1 : new_class(w, val->nbytes); /* the accumulator starts empty */
    case EBB_STEP_ENTER:
        /* any subset of the rows: the row indices and a gathered copy of x
         * are at most the full batch (the plan's values say all rows, no
         * copy) */
        if (k == 0)
            return new_class(w, route_batch(p, s->pub.in[1]) * 8);
        return new_class(w, value_full_bytes(&p->values[s->pub.in[0]]));
    case EBB_STEP_ALIAS: return w->cls[s->pub.in[0]];
    case EBB_STEP_GRAD_SUMS: return -1; /* the optimizer's sums, counted beside the parameters */
    default:
        if (val->alias_of >= 0)
            return w->cls[val->alias_of];
        return val->nbytes > 0 ? new_class(w, val->nbytes) : -1;
    }
}

/* The edge the walk takes out of step i (see the top of the file): 1 for the
 * jump. `visits` counts how often each loop_next sent the walk back. */
static int take_jump(const plan_step *s, int i, int *visits) {
    switch (s->pub.kind) {
    case EBB_STEP_LOOP_INIT: return s->limit == 0;
    case EBB_STEP_LOOP_NEXT:
        if (s->limit >= 2 && visits[i] == 0) {
            visits[i] = 1;
            return 1;
        }
        visits[i] = 0; /* an enclosing loop's next iteration walks it twice again */
        return 0;
    default: return 0;
    }
}

int64_t ebb_pass_predict(compiler *c, int no_frees, int64_t granule, int *peak_step) {
    ebb_plan *p = c->plan;
    int nv = p->n_values, n = p->n_steps;
    size_t cap = (size_t)(nv ? nv : 1);
    walk w = {.cls = malloc(cap * sizeof *w.cls), .granule = granule};
    int *visits = calloc((size_t)n + 1, sizeof *visits);
    unsigned char *seen = calloc((size_t)n + 1, 1);
    int64_t result = -1;
    if (!w.cls || !visits || !seen) {
        ebb_compiler_oom(c);
        goto out;
    }
    for (int v = 0; v < nv; v++)
        w.cls[v] = -1;
    /* per-step figures: the exact CPU count, and the CUDA one (blocks) */
    int record = !no_frees && !granule, record_cuda = granule == 512;
    int64_t peak = 0, walked = 0;
    int at = 0;
    for (int i = 0; i < n;) {
        if (++walked > EBB_MAX_WALK) {
            c->status = ebb_error_set(EBB_ERR_BUILD,
                                      "ebb_compile: plan %s nests loops too deeply to predict its "
                                      "memory (more than %lld steps walked)",
                                      p->name, (long long)EBB_MAX_WALK);
            goto out;
        }
        plan_step *s = &p->steps[i];
        for (int k = 0; k < s->pub.n_out; k++)
            move_slot(&w, s->pub.out[k], output_class(&w, p, s, k));
        if (w.oom) {
            ebb_compiler_oom(c);
            goto out;
        }
        int64_t during = w.live + workspace_rounded(&w, s) + routing_scratch(&w, p, s);
        if (during > peak) {
            peak = during;
            at = i;
        }
        int jump = take_jump(s, i, visits);
        const int *frees = jump ? s->pub.jump_frees : s->pub.frees;
        int n_frees = jump ? s->pub.n_jump_frees : s->pub.n_frees;
        for (int k = 0; !no_frees && k < n_frees; k++)
            move_slot(&w, frees[k], -1);
        if (record) {
            if (!seen[i] || during > s->pub.peak_bytes)
                s->pub.peak_bytes = during;
            if (!seen[i] || w.live > s->pub.live_bytes)
                s->pub.live_bytes = w.live;
            seen[i] = 1;
        } else if (record_cuda) {
            if (!seen[i] || during > s->cuda_peak_bytes)
                s->cuda_peak_bytes = during;
            seen[i] = 1;
        }
        i = jump ? s->pub.jump : i + 1;
    }
    if (peak_step)
        *peak_step = at;
    result = peak;
out:
    free(w.cls);
    free(w.bytes);
    free(w.refs);
    free(visits);
    free(seen);
    return result;
}

/* ---- estimated compute ---------------------------------------------------------- */

static int64_t numel_of(const ebb_plan *p, int slot) {
    return ebb_shape_numel(&p->values[slot].shape);
}

/* Forward FLOPs of an op step: 2 per multiply-add through each weight
 * matrix (a linear's, a convolution's, a recurrent cell's), attention's two
 * products, else one per output element. */
static int64_t op_flops(const ebb_plan *p, const plan_step *s) {
    if (s->pub.n_out < 1)
        return 0;
    const ebb_shape *out = &p->values[s->pub.out[0]].shape;
    int64_t n = ebb_shape_numel(out), total = 0;
    for (int j = 0; j < s->n_params; j++) {
        const ebb_shape *w = &p->params[s->param[j]].spec.shape;
        if (w->ndim < 2 || w->dim[0] <= 0)
            continue;
        /* rows the weight multiplies: the output's elements over its feature
         * dim (last for a linear, 1 for a convolution) */
        int64_t feat = out->ndim ? out->dim[out->ndim - 1] : 1;
        if (out->ndim > 1 && out->dim[1] == w->dim[0] && feat != w->dim[0])
            feat = out->dim[1];
        int64_t rows = feat > 0 ? n / feat : 0;
        total += 2 * rows * ebb_shape_numel(w);
    }
    if (s->op && s->op->flops) {
        ebb_shape in[64];
        int n_in = s->pub.n_in < 64 ? s->pub.n_in : 64;
        for (int i = 0; i < n_in; i++)
            in[i] = p->values[s->pub.in[i]].shape;
        total += s->op->flops(s->attrs, in, n_in, out);
    }
    return total > 0 ? total : n;
}

int64_t ebb_step_flops(const ebb_plan *p, const plan_step *s) {
    switch (s->pub.kind) {
    case EBB_STEP_OP:
        return op_flops(p, s);
    case EBB_STEP_BACKWARD: /* the input's gradient and the weights': twice the forward */
        return 2 * op_flops(p, &p->steps[s->fwd_step]);
    case EBB_STEP_ACCUM:
    case EBB_STEP_EXIT_BACKWARD:
    case EBB_STEP_ENTER_BACKWARD:
        return s->pub.n_out ? numel_of(p, s->pub.out[0]) : 0;
    case EBB_STEP_GRAD_SUM: /* an add */
        return numel_of(p, s->pub.in[0]);
    case EBB_STEP_UPDATE: /* a handful per element: Adam's moments, SGD's momentum */
        return 4 * numel_of(p, s->pub.in[0]);
    default:
        return 0;
    }
}
