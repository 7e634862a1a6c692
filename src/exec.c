#define _POSIX_C_SOURCE 200809L
/* The executor: a loop over the plan's steps. Each step gathers its inputs
 * from the run's slots, runs, stores its outputs, and releases the slots the
 * plan says die on the edge it leaves by. Nothing here decides lifetimes; the
 * compiler did. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ebb/memory.h"
#include "ebb/run.h"
#include "model_internal.h"
#include "plan_internal.h"
#include "run_internal.h"

/* Per-run state: the plan is shared, this is not. */
typedef struct run_ctx {
    const ebb_plan *plan;
    const ebb_model *model;
    ebb_tensor **slots;
    unsigned char *borrowed; /* slots holding the caller's inputs */
    int64_t *counters;
    ebb_tensor **args;   /* scratch: one step's inputs */
    ebb_tensor **params; /* scratch: one step's parameters */
    /* training */
    ebb_shape *shapes;   /* per slot: the shape last stored there (backward's in_shapes) */
    unsigned char *written; /* per slot: stored this run (a branch's rows: the branch ran) */
    ebb_optimizer *opt;  /* the update steps' optimizer (ebb_train_step) */
    ebb_dist *dist;      /* the all-reduce steps' group (data parallel) */
    ebb_dist_work *pending; /* an all-reduce started, not yet waited for (parallel.overlap) */
    ebb_tensor *one;     /* the loss's gradient with respect to itself */
    uint64_t seed;       /* dropout's masks: mixed with the step index */
    int micro_batch, micro_batches; /* accumulation: this run's place in its step */
    ebb_device dev;      /* the model's */
    ebb_kv_cache *kv;    /* generation: the key/value cache the state values are bound to */
    int64_t kv_written;  /* positions this run wrote into it */
    int64_t base;        /* allocator bytes that are not the plan's: grows with optimizer state */
    int64_t run_peak;    /* the largest high-water mark sample_peak() has seen */
} run_ctx;

static void slot_set(run_ctx *r, int slot, ebb_tensor *t) {
    if (r->slots[slot] != t && !r->borrowed[slot])
        ebb_tensor_free(r->slots[slot]);
    r->borrowed[slot] = 0;
    r->slots[slot] = t;
    if (t && r->shapes)
        r->shapes[slot] = ebb_tensor_shape(t);
    if (r->written)
        r->written[slot] = 1;
}

static void slot_release(run_ctx *r, int slot) {
    if (!r->borrowed[slot])
        ebb_tensor_free(r->slots[slot]);
    r->slots[slot] = NULL;
    r->borrowed[slot] = 0;
}

/* ---- routing ------------------------------------------------------------- */

static ebb_status route_switch(const plan_step *s, ebb_tensor *sel, ebb_tensor **out) {
    ebb_dtype dt = ebb_tensor_dtype(sel);
    ebb_shape sh = ebb_tensor_shape(sel);
    if (dt == EBB_INT64 || dt == EBB_INT32 || dt == EBB_UINT8) {
        /* explicit indices: every one must name a branch */
        int64_t n = sh.ndim == 1 ? sh.dim[0] : -1;
        if (n < 0)
            return ebb_error_set(EBB_ERR_SHAPE, "switch: selector gave %d-D indices, expected [batch]",
                                 sh.ndim);
        ebb_tensor *idx = NULL;
        ebb_status st = ebb_tensor_cast(&idx, sel, EBB_INT64);
        if (st != EBB_OK)
            return st;
        int64_t *host = malloc((size_t)(n ? n : 1) * sizeof *host);
        if (!host) {
            ebb_tensor_free(idx);
            return ebb_error_set(EBB_ERR_NOMEM, "switch: out of memory");
        }
        ebb_tensor *cpu = NULL;
        st = ebb_tensor_to(&cpu, idx, ebb_device_cpu(), EBB_INT64);
        if (st == EBB_OK)
            st = ebb_tensor_to_host(cpu, host, (size_t)n * sizeof *host);
        ebb_tensor_free(cpu);
        for (int64_t i = 0; st == EBB_OK && i < n; i++)
            if (host[i] < 0 || host[i] >= s->n_branches)
                st = ebb_error_set(EBB_ERR_RUNTIME,
                                   "switch: row %lld chose branch %lld, but there are %d branches "
                                   "(0..%d)",
                                   (long long)i, (long long)host[i], s->n_branches,
                                   s->n_branches - 1);
        free(host);
        if (st != EBB_OK) {
            ebb_tensor_free(idx);
            return st;
        }
        *out = idx;
        return EBB_OK;
    }
    return ebb_tensor_argmax(out, sel, 1);
}

/* Top-k gate: a [B, k] table holding each row's renormalised weights for its
 * chosen experts and zero elsewhere. */
static ebb_status route_topk(const plan_step *s, ebb_tensor *w, ebb_tensor **out) {
    ebb_tensor *vals = NULL, *idx = NULL, *sum = NULL, *norm = NULL;
    int64_t dim1 = 1;
    ebb_status st = ebb_tensor_topk(&vals, &idx, w, s->top_k, 1);
    if (st == EBB_OK)
        st = ebb_tensor_reduce(&sum, EBB_REDUCE_SUM, vals, &dim1, 1, true);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&norm, EBB_DIV, vals, sum);
    if (st == EBB_OK)
        st = ebb_tensor_scatter(out, w, 1, idx, norm);
    ebb_tensor_free(vals);
    ebb_tensor_free(idx);
    ebb_tensor_free(sum);
    ebb_tensor_free(norm);
    return st;
}

/* ENTER: which rows chose this branch. No rows: jump. All rows: the branch
 * sees x itself (no gather, rows stays empty). */
static ebb_status enter_branch(run_ctx *r, const plan_step *s, int *jump) {
    ebb_tensor *x = r->slots[s->pub.in[0]], *route = r->slots[s->pub.in[1]];
    ebb_tensor *mask = NULL, *col = NULL, *rows = NULL, *xr = NULL;
    ebb_status st;
    if (s->mode == EBB_ROUTE_SWITCH) {
        st = ebb_tensor_compare(&mask, EBB_EQ, route, (double)s->branch);
    } else {
        st = ebb_tensor_select(&col, route, 1, s->branch);
        if (st == EBB_OK)
            st = ebb_tensor_compare(&mask, EBB_NE, col, 0.0);
        ebb_tensor_free(col);
    }
    if (st == EBB_OK)
        st = ebb_tensor_nonzero_1d(&rows, mask);
    ebb_tensor_free(mask);
    if (st != EBB_OK)
        return st;
    int64_t n = ebb_tensor_numel(rows), batch = ebb_tensor_shape(x).dim[0];
    if (n == 0) {
        ebb_tensor_free(rows);
        *jump = 1;
        return EBB_OK;
    }
    if (n == batch) {
        ebb_tensor_free(rows);
        rows = NULL;
        st = ebb_tensor_ref(&xr, x);
    } else {
        st = ebb_tensor_index_select(&xr, x, 0, rows);
    }
    if (st != EBB_OK) {
        ebb_tensor_free(rows);
        return st;
    }
    slot_set(r, s->pub.out[0], rows);
    slot_set(r, s->pub.out[1], xr);
    return EBB_OK;
}

/* EXIT: scatter the branch's rows back into the accumulator, weighted for a
 * top-k gate. */
static ebb_status exit_branch(run_ctx *r, const plan_step *s) {
    ebb_tensor *y = r->slots[s->pub.in[0]], *rows = r->slots[s->pub.in[1]];
    ebb_tensor *route = r->slots[s->pub.in[2]], *acc = r->slots[s->pub.in[3]];
    int acc_slot = s->pub.out[0];
    ebb_status st = EBB_OK;
    ebb_tensor *w = NULL; /* this expert's weights for the rows, shaped to broadcast */
    if (s->mode == EBB_ROUTE_TOPK) {
        ebb_tensor *col = NULL, *picked = NULL;
        st = ebb_tensor_select(&col, route, 1, s->branch);
        if (st == EBB_OK && rows)
            st = ebb_tensor_index_select(&picked, col, 0, rows);
        if (st == EBB_OK) {
            ebb_shape ws = ebb_tensor_shape(y);
            for (int d = 1; d < ws.ndim; d++)
                ws.dim[d] = 1;
            st = ebb_tensor_reshape(&w, picked ? picked : col, &ws);
        }
        ebb_tensor_free(col);
        ebb_tensor_free(picked);
        if (st != EBB_OK)
            return st;
    }
    if (!rows) {
        /* all rows took this branch */
        ebb_tensor *res = NULL;
        if (!w)
            st = acc ? ebb_tensor_binary(&res, EBB_ADD, acc, y) : ebb_tensor_ref(&res, y);
        else
            st = acc ? ebb_tensor_addcmul(&res, acc, y, w) : ebb_tensor_binary(&res, EBB_MUL, y, w);
        ebb_tensor_free(w);
        if (st == EBB_OK)
            slot_set(r, acc_slot, res);
        return st;
    }
    ebb_tensor *contrib = NULL;
    if (w) {
        st = ebb_tensor_binary(&contrib, EBB_MUL, y, w);
        ebb_tensor_free(w);
        if (st != EBB_OK)
            return st;
    }
    if (!acc) {
        ebb_shape as = ebb_tensor_shape(y);
        as.dim[0] = ebb_tensor_shape(route).dim[0];
        st = ebb_tensor_zeros(&acc, &as, ebb_tensor_dtype(y), ebb_tensor_device(y));
        if (st != EBB_OK) {
            ebb_tensor_free(contrib);
            return st;
        }
        slot_set(r, acc_slot, acc);
    }
    if (s->mode == EBB_ROUTE_SWITCH)
        st = ebb_tensor_index_copy_(acc, 0, rows, y);
    else
        st = ebb_tensor_index_add_(acc, 0, rows, contrib);
    ebb_tensor_free(contrib);
    return st;
}

/* ---- training steps -------------------------------------------------------- */

/* A step's own seed: the run's, mixed with the step index (splitmix64). */
uint64_t ebb_run_step_seed(const ebb_plan *plan, uint64_t run_seed, int step) {
    (void)plan;
    uint64_t z = run_seed + 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t step_seed(const run_ctx *r, const plan_step *s) {
    return ebb_run_step_seed(r->plan, r->seed, (int)(s - r->plan->steps));
}

/* The rule's training forward: the output, then the extras its backward reads. */
static ebb_status forward_train(run_ctx *r, const plan_step *s, ebb_op_call *call) {
    const ebb_op_grad *g = s->op->grad;
    ebb_tensor *out = NULL, *saved[EBB_MAX_SAVED] = {0};
    call->seed = step_seed(r, s);
    ebb_status st = g->forward_train(call, &out, saved);
    for (int k = 0; st == EBB_OK && k < g->n_saved; k++)
        if (!saved[k])
            st = ebb_error_set(EBB_ERR_RUNTIME, "op %s: its training forward made no extra %d",
                               s->op->name, k);
    if (st == EBB_OK && !out)
        st = ebb_error_set(EBB_ERR_RUNTIME, "op %s returned no tensor", s->op->name);
    if (st != EBB_OK) {
        ebb_tensor_free(out);
        for (int k = 0; k < EBB_MAX_SAVED; k++)
            ebb_tensor_free(saved[k]);
        return st;
    }
    slot_set(r, s->pub.out[0], out);
    for (int k = 0; k < g->n_saved; k++)
        slot_set(r, s->pub.out[1 + k], saved[k]);
    return EBB_OK;
}

/* The step's parameters into r->params: the model's own, or under mixed
 * precision (plan_step.param_cast) copies of the floating ones in the
 * step's dtype, written to copies[] for param_copies_free() after the
 * call. The plan counts them in the step's scratch. */
static ebb_status params_for_step(run_ctx *r, const plan_step *s, ebb_tensor **copies,
                                  ebb_tensor *const *kept) {
    for (int j = 0; j < s->n_params; j++) {
        ebb_tensor *p = r->model->params[s->param[j]];
        copies[j] = NULL;
        r->params[j] = p;
        if (!s->param_cast)
            continue; /* every step but a mixed-precision one: the model's own */
        if (kept && kept[j]) {
            r->params[j] = kept[j]; /* the forward's copy (plan_step.keep_copy) */
            continue;
        }
        ebb_dtype dt = ebb_tensor_dtype(p);
        if (dt == s->param_dtype || dt == EBB_INT64)
            continue;
        ebb_status st = ebb_tensor_cast(&copies[j], p, s->param_dtype);
        if (st != EBB_OK) {
            for (int k = 0; k < j; k++) {
                ebb_tensor_free(copies[k]);
                copies[k] = NULL;
            }
            return st;
        }
        r->params[j] = copies[j];
    }
    return EBB_OK;
}

static void param_copies_free(const plan_step *s, ebb_tensor **copies) {
    for (int j = 0; j < s->n_params; j++) {
        ebb_tensor_free(copies[j]);
        copies[j] = NULL;
    }
}

/* A forward's copies that the plan keeps for the backward go to its last
 * outputs; the others are freed. */
static void param_copies_keep(run_ctx *r, const plan_step *s, ebb_tensor **copies) {
    for (int j = 0, o = s->pub.n_out - ebb_step_kept_copies(s); j < s->n_params; j++)
        if (s->keep_copy >> j & 1) {
            slot_set(r, s->pub.out[o++], copies[j]);
            copies[j] = NULL;
        }
    param_copies_free(s, copies);
}

/* The rule's backward, reading what it saved; its gradients go to the
 * step's outputs in order (inputs', then parameters'). */
static ebb_status backward(run_ctx *r, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    const plan_step *f = &r->plan->steps[s->fwd_step];
    ebb_tensor *ins[32] = {0}, *extras[EBB_MAX_SAVED] = {0};
    ebb_tensor *gin[32] = {0}, *gparam[EBB_MAX_PARAMS] = {0};
    ebb_shape in_shapes[32];
    ebb_dtype in_dtypes[32];
    int k = 0;
    for (int i = 0; i < s->n_fwd_in; i++) {
        in_shapes[i] = r->shapes[f->pub.in[i]];
        in_dtypes[i] = r->plan->values[f->pub.in[i]].dtype;
        if (s->saved_in >> i & 1)
            ins[i] = r->slots[ps->in[k++]];
    }
    const ebb_tensor *out = s->saves_out ? r->slots[ps->in[k++]] : NULL;
    for (int j = 0; j < s->n_saved; j++)
        extras[j] = r->slots[ps->in[k++]];
    ebb_tensor *kept[EBB_MAX_PARAMS] = {0};
    for (int j = 0; j < s->n_params; j++)
        if (s->keep_copy >> j & 1)
            kept[j] = r->slots[ps->in[k++]];
    const ebb_tensor *grad_out = s->seed ? r->one : r->slots[ps->in[k++]];
    if (!grad_out)
        return EBB_OK; /* no gradient reached it: only skipped branches read its output */
    for (int i = 0; i < k; i++)
        if (!r->slots[ps->in[i]]) {
            char id[64];
            ebb_plan_value_id(r->plan, ps->in[i], id, sizeof id);
            return ebb_error_set(EBB_ERR_RUNTIME, "input %s is empty", id);
        }
    ebb_tensor *copies[EBB_MAX_PARAMS];
    ebb_status cs = params_for_step(r, s, copies, kept);
    if (cs != EBB_OK)
        return cs;
    ebb_op_grad_call gc = {.op = s->op, .attrs = s->attrs, .in = ins, .n_in = s->n_fwd_in,
                           .params = r->params, .n_params = s->n_params, .out = out,
                           .saved = extras, .n_saved = s->n_saved, .grad_out = grad_out,
                           .node = ps->node, .in_shapes = in_shapes,
                           .skip_input_grad = s->skip_in, .in_dtypes = in_dtypes};
    ebb_status st = s->op->grad->backward(&gc, gin, gparam);
    param_copies_free(s, copies);
    /* mixed precision: the parameters' gradients in their own dtype, all
     * cast before the low ones go (the plan's ebb_backward_cast_scratch) */
    ebb_tensor *low[EBB_MAX_PARAMS] = {0};
    for (int j = 0; st == EBB_OK && s->param_cast && j < s->n_params; j++) {
        ebb_dtype want = ebb_tensor_dtype(r->model->params[s->param[j]]);
        if (!gparam[j] || ebb_tensor_dtype(gparam[j]) == want)
            continue;
        low[j] = gparam[j];
        gparam[j] = NULL;
        st = ebb_tensor_cast(&gparam[j], low[j], want);
    }
    for (int j = 0; j < EBB_MAX_PARAMS; j++)
        ebb_tensor_free(low[j]);
    int o = 0;
    for (int i = 0; i < s->n_fwd_in; i++) {
        if (!(s->grad_in >> i & 1)) {
            ebb_tensor_free(gin[i]);
            continue;
        }
        if (st == EBB_OK && !gin[i])
            st = ebb_error_set(EBB_ERR_RUNTIME, "op %s: its backward gave no gradient for input %d",
                               s->op->name, i);
        if (st == EBB_OK)
            slot_set(r, ps->out[o], gin[i]);
        else
            ebb_tensor_free(gin[i]);
        o++;
    }
    for (int j = 0; j < s->n_params; j++) {
        if (!gparam[j])
            continue;
        if (st == EBB_OK && o < ps->n_out)
            slot_set(r, ps->out[o++], gparam[j]);
        else
            ebb_tensor_free(gparam[j]);
    }
    return st;
}

/* A second gradient for the same value: added into the first where it dies
 * here and nothing else holds its storage. */
static ebb_status accumulate(run_ctx *r, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    ebb_tensor *a = r->slots[ps->in[0]], *b = r->slots[ps->in[1]];
    if (!a || !b) {
        /* one of them came from a branch that did not run */
        ebb_tensor *t = NULL;
        ebb_status st = a || b ? ebb_tensor_ref(&t, a ? a : b) : EBB_OK;
        if (st == EBB_OK)
            slot_set(r, ps->out[0], t);
        return st;
    }
    if (ps->in_place && !r->borrowed[ps->in[0]] && ebb_tensor_is_exclusive(a)) {
        ebb_status st = ebb_tensor_add_(a, b);
        if (st != EBB_OK)
            return st;
        r->slots[ps->in[0]] = NULL;
        slot_set(r, ps->out[0], a);
        return EBB_OK;
    }
    ebb_tensor *sum = NULL;
    ebb_status st = ebb_tensor_binary(&sum, EBB_ADD, a, b);
    if (st == EBB_OK)
        slot_set(r, ps->out[0], sum);
    return st;
}

/* The optimizer's update of one parameter. ebb_optimizer_new() makes the
 * state, so an update adds none; should one ever (an optimizer made some
 * other way), that state belongs to the model, not the plan: the baseline
 * moves up by it. */
static ebb_status update(run_ctx *r, const plan_step *s) {
    ebb_tensor *g = r->slots[s->pub.in[0]];
    if (!r->opt)
        return ebb_error_set(EBB_ERR_ARG, "an update step needs an optimizer (ebb_train_step)");
    if (!g)
        return EBB_OK; /* no gradient reached it: torch.optim skips such a parameter */
    /* state is made at a parameter's first update only; counting it walks
     * every parameter, so only then */
    int first = ebb_optimizer_param_step_count(r->opt, s->pub.param) == 0;
    int64_t before = first ? ebb_optimizer_state_bytes(r->opt, NULL) : 0;
    /* clip_grad_value: the update reads a clamped copy (the plan counts it) */
    ebb_tensor *clamped = NULL;
    ebb_status st =
        r->plan->train_options.clip_grad_value > 0
            ? ebb_tensor_clip_grad_value(&clamped, g, r->plan->train_options.clip_grad_value)
            : EBB_OK;
    if (st == EBB_OK) st = ebb_optimizer_update(r->opt, s->pub.param, clamped ? clamped : g);
    ebb_tensor_free(clamped);
    if (first)
        r->base += ebb_optimizer_state_bytes(r->opt, NULL) - before;
    return st;
}

/* clip_grad_norm: every gradient scaled in place before the first update
 * (a parameter without a gradient this step, a branch no row chose, is left
 * out, as torch skips a None .grad). ZeRO-1: this rank's, by the norm of
 * every rank's. */
static ebb_status clip(run_ctx *r, const plan_step *s) {
    for (int i = 0; i < s->pub.n_in; i++)
        r->args[i] = r->slots[s->pub.in[i]];
    if (r->plan->owner)
        return ebb_dist_clip_grad_norm_(r->dist, r->args, s->pub.n_in,
                                        r->plan->train_options.clip_grad_norm, NULL);
    return ebb_tensor_clip_grad_norm_(r->args, s->pub.n_in, r->plan->train_options.clip_grad_norm,
                                      NULL);
}

/* loss_scaling: every gradient divided by the scale in place, and the
 * updates jumped over when one is not finite (the scale then backs off). */
static ebb_status unscale(run_ctx *r, const plan_step *s, int *jump) {
    if (!r->opt)
        return ebb_error_set(EBB_ERR_ARG, "an unscale step needs an optimizer (ebb_train_step)");
    for (int i = 0; i < s->pub.n_in; i++)
        r->args[i] = r->slots[s->pub.in[i]];
    if (r->plan->owner) /* ZeRO-1: this rank's gradients; the ranks agree on the skip */
        return ebb_optimizer_unscale_sharded_(r->opt, r->args, s->pub.n_in, r->dist, jump);
    return ebb_optimizer_unscale_(r->opt, r->args, s->pub.n_in, jump);
}

/* ---- accumulation ------------------------------------------------------------ */

/* Opcode: GRAD_SUM  (a gradient) ; param = its parameter
 * Synopsis: sums[param] := gradient (the step's first micro-batch), or
 * sums[param] + gradient, in place
 * The sums are the optimizer's, kept across runs; one made here moves the
 * baseline, as new optimizer state does. */
static ebb_status grad_sum(run_ctx *r, const plan_step *s) {
    ebb_tensor *g = r->slots[s->pub.in[0]];
    if (!g)
        return EBB_OK; /* no gradient reached it: a branch no row chose */
    int64_t made = 0;
    ebb_status st = ebb_optimizer_sum_add(r->opt, s->pub.param, g, &made);
    r->base += made;
    return st;
}

/* Data parallel: the ranks agree on which sums hold a gradient, and a sum
 * only other ranks' micro-batches reached is zeros here, so that every
 * rank's buckets hold the same gradients (a sum no rank reached stays out,
 * as torch skips a None .grad). The flags travel as float64 (the step's
 * scratch). */
static ebb_status agree_sums(run_ctx *r, const plan_step *s) {
    int n = s->pub.n_out;
    double *any = calloc((size_t)n + 1, sizeof *any);
    if (!any)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n; k++)
        any[k] = ebb_optimizer_sum(r->opt, s->sums_of[k]) != NULL;
    ebb_shape sh = {1, {n}};
    ebb_tensor *flags = NULL;
    ebb_status st = ebb_tensor_from_host(&flags, any, sizeof *any * (size_t)n, &sh, EBB_FLOAT64,
                                         ebb_dist_device(r->dist));
    if (st == EBB_OK)
        st = ebb_dist_allreduce_mean_(r->dist, &flags, 1);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(flags, any, sizeof *any * (size_t)n);
    ebb_tensor_free(flags);
    for (int k = 0; st == EBB_OK && k < n; k++) {
        int64_t made = 0;
        if (any[k] > 0)
            st = ebb_optimizer_sum_zeros(r->opt, s->sums_of[k], &made);
        r->base += made;
    }
    free(any);
    return st;
}

/* Opcode: GRAD_SUMS  () -> (the sums)
 * Synopsis: a micro-batch before its step's last jumps to the end; the
 * last's outputs := the sums, borrowed from the optimizer
 * What follows (buckets, unscale, clip, updates) reads the sums as an
 * unaccumulated plan reads the backward's gradients. */
static ebb_status grad_sums(run_ctx *r, const plan_step *s, int *jump) {
    if (r->micro_batches > 1 && r->micro_batch < r->micro_batches - 1) {
        *jump = 1;
        return EBB_OK;
    }
    ebb_status st = s->agree ? agree_sums(r, s) : EBB_OK;
    for (int k = 0; st == EBB_OK && k < s->pub.n_out; k++) {
        slot_set(r, s->pub.out[k], ebb_optimizer_sum(r->opt, s->sums_of[k]));
        r->borrowed[s->pub.out[k]] = 1;
    }
    return st;
}

/* ---- collectives ---------------------------------------------------------------
 *
 * One step kind per collective, each documented where exec_step dispatches
 * it. A bucket's gradients are the step's inputs; with parallel.overlap
 * the started collective's buffers are its outputs, values of the plan
 * until the bucket's wait step, and the work under way is r->pending. */

/* The step's inputs, in order, into r->args. */
static void gather_args(run_ctx *r, const plan_step *s) {
    for (int i = 0; i < s->pub.n_in; i++)
        r->args[i] = r->slots[s->pub.in[i]];
}

/* The buffers a started collective made, into the step's outputs in order
 * (those the compiler saw coming: any other count is a bug, named). */
static ebb_status hand_buffers(run_ctx *r, const plan_step *s, ebb_tensor **made, int n,
                               ebb_status st) {
    int n_made = 0;
    for (int j = 0; j < n; j++)
        n_made += made[j] != NULL;
    if (st == EBB_OK && n_made != s->pub.n_out)
        st = ebb_error_set(EBB_ERR_RUNTIME, "%s (%s): %d buffers made, the plan has %d",
                           s->pub.op, s->pub.node, n_made, s->pub.n_out);
    for (int j = 0, k = 0; j < n; j++) {
        if (made[j] && st == EBB_OK)
            slot_set(r, s->pub.out[k++], made[j]);
        else
            ebb_tensor_free(made[j]);
    }
    return st;
}

static ebb_status allreduce_start(run_ctx *r, const plan_step *s) {
    gather_args(r, s);
    ebb_tensor *flat = NULL;
    ebb_status st = ebb_dist_allreduce_mean_start(r->dist, r->args, s->pub.n_in, &flat,
                                                  &r->pending);
    return hand_buffers(r, s, &flat, 1, st);
}

static ebb_status reduce_scatter_start(run_ctx *r, const plan_step *s) {
    gather_args(r, s);
    ebb_tensor *made[2] = {NULL, NULL};
    ebb_status st = ebb_dist_reduce_scatter_mean_start(r->dist, r->args, s->owners, s->pub.n_in,
                                                       &made[0], &made[1], &r->pending);
    return hand_buffers(r, s, made, 2, st);
}

static ebb_status collective_wait(run_ctx *r) {
    ebb_dist_work *w = r->pending;
    r->pending = NULL;
    return ebb_dist_work_finish(w);
}

/* ZeRO-1: the parameters rank `param` owns, as that rank updated them. */
static ebb_status broadcast(run_ctx *r, const plan_step *s) {
    int n = 0;
    for (int i = 0; i < r->plan->n_params; i++)
        if (r->plan->trained[i] && r->plan->owner[i] == s->pub.param)
            r->args[n++] = r->model->params[i];
    return ebb_dist_broadcast_(r->dist, r->args, n, s->pub.param);
}

/* One collective step; every rank runs the same ones in the same order. */
static ebb_status collective(run_ctx *r, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    switch (ps->kind) {
    /* Opcode: ALLREDUCE  (a bucket of gradients)
     * Synopsis: each gradient := its mean over the ranks, in place
     * The gradients travel laid end to end in one buffer per dtype, the
     * step's scratch (a lone gradient of its dtype as it is). */
    case EBB_STEP_ALLREDUCE:
        gather_args(r, s);
        return ebb_dist_allreduce_mean_(r->dist, r->args, ps->n_in);
    /* Opcode: REDUCE_SCATTER  (a bucket of gradients)
     * Synopsis: the gradients this rank owns := their means over the ranks
     * ZeRO-1: half the all-reduce's traffic; the others' gradients die here
     * (s->owners: each gradient's owning rank). */
    case EBB_STEP_REDUCE_SCATTER:
        gather_args(r, s);
        return ebb_dist_reduce_scatter_mean_(r->dist, r->args, s->owners, ps->n_in);
    /* Opcode: ALLREDUCE_START  (a bucket of gradients) -> [buffer]
     * Synopsis: the bucket's all-reduce started; r->pending := the work
     * parallel.overlap: the backward goes on while the ranks exchange; the
     * buffer (when several gradients share it) is the step's output. */
    case EBB_STEP_ALLREDUCE_START: return allreduce_start(r, s);
    /* Opcode: REDUCE_SCATTER_START  (a bucket of gradients) -> [buffers]
     * Synopsis: the reduce-scatter's first round started; r->pending := it
     * Its outputs: the buffer that round sends (when it lays several
     * gradients end to end) and the one this rank's own arrive in. */
    case EBB_STEP_REDUCE_SCATTER_START: return reduce_scatter_start(r, s);
    /* Opcode: ALLREDUCE_WAIT  ([buffer,] a bucket of gradients)
     * Synopsis: waits for r->pending; each gradient := its mean, in place */
    case EBB_STEP_ALLREDUCE_WAIT: return collective_wait(r);
    /* Opcode: REDUCE_SCATTER_WAIT  ([buffers,] a bucket of gradients)
     * Synopsis: the reduce-scatter's other rounds, then this rank's means
     * The rounds after the first run inside ebb_dist_work_finish. */
    case EBB_STEP_REDUCE_SCATTER_WAIT: return collective_wait(r);
    /* Opcode: BROADCAST  () ; param = the sending rank
     * Synopsis: ZeRO-1: the parameters rank `param` owns := its values
     * After the updates, every rank's share reaches the others, laid end
     * to end in a buffer the size of that share, the step's scratch. */
    case EBB_STEP_BROADCAST: return broadcast(r, s);
    default:
        return ebb_error_set(EBB_ERR_RUNTIME, "step %s (%s) is no collective", ps->op, ps->node);
    }
}

/* ---- routed regions in the backward ---------------------------------------- */

/* EXIT's backward: the branch's rows of the accumulator's gradient, weighted
 * for a top-k gate, whose weights' gradient goes into the route's column. */
static ebb_status exit_backward(run_ctx *r, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    ebb_tensor *g = r->slots[ps->in[0]], *rows = r->slots[ps->in[1]];
    ebb_tensor *route = r->slots[ps->in[2]];
    if (!g)
        return EBB_OK;
    ebb_tensor *gy = NULL;
    ebb_status st = rows ? ebb_tensor_index_select(&gy, g, 0, rows) : ebb_tensor_ref(&gy, g);
    if (st != EBB_OK || s->mode != EBB_ROUTE_TOPK) {
        if (st == EBB_OK)
            slot_set(r, ps->out[0], gy);
        return st;
    }
    ebb_tensor *y = r->slots[ps->in[3]], *gt = r->slots[ps->in[4]];
    ebb_tensor *col = NULL, *w = NULL, *wr = NULL, *gw = NULL, *prod = NULL, *dw = NULL,
               *gcol = NULL;
    ebb_shape ws = ebb_tensor_shape(gy);
    for (int d = 1; d < ws.ndim; d++)
        ws.dim[d] = 1;
    int64_t dims[EBB_MAX_DIMS];
    int nd = 0;
    for (int d = 1; d < ws.ndim; d++)
        dims[nd++] = d;
    st = ebb_tensor_select(&col, route, 1, s->branch);
    if (st == EBB_OK)
        st = rows ? ebb_tensor_index_select(&w, col, 0, rows) : ebb_tensor_ref(&w, col);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&wr, w, &ws);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&gw, EBB_MUL, gy, wr);
    /* d loss / d weight of each row: <grad rows, y> */
    if (st == EBB_OK)
        st = ebb_tensor_binary(&prod, EBB_MUL, gy, y);
    if (st == EBB_OK)
        st = nd ? ebb_tensor_reduce(&dw, EBB_REDUCE_SUM, prod, dims, nd, false)
                : ebb_tensor_ref(&dw, prod);
    if (st == EBB_OK)
        st = ebb_tensor_select(&gcol, gt, 1, s->branch);
    if (st == EBB_OK)
        st = rows ? ebb_tensor_index_add_(gcol, 0, rows, dw) : ebb_tensor_add_(gcol, dw);
    ebb_tensor_free(gy);
    ebb_tensor_free(col);
    ebb_tensor_free(w);
    ebb_tensor_free(wr);
    ebb_tensor_free(prod);
    ebb_tensor_free(dw);
    ebb_tensor_free(gcol);
    if (st != EBB_OK) {
        ebb_tensor_free(gw);
        return st;
    }
    slot_set(r, ps->out[0], gw);
    return EBB_OK;
}

/* ENTER's backward: the branch input's gradient, added into x's by row. */
static ebb_status enter_backward(run_ctx *r, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    ebb_tensor *g = r->slots[ps->in[0]], *rows = r->slots[ps->in[1]];
    ebb_tensor *acc = r->slots[ps->in[2]];
    if (!g)
        return EBB_OK;
    return rows ? ebb_tensor_index_add_(acc, 0, rows, g) : ebb_tensor_add_(acc, g);
}

/* The top-k route's backward: the table holds w_i / S for the chosen
 * experts (S their sum) and 0 elsewhere, so d table_i / d w_j is
 * (δij − table_i) / S over the chosen ones:
 *     grad_w = chosen · (g − Σ_i g_i·table_i) / S. */
static ebb_status route_backward(run_ctx *r, const plan_step *s) {
    const ebb_plan_step *ps = &s->pub;
    ebb_tensor *w = r->slots[ps->in[0]], *t = r->slots[ps->in[1]], *g = r->slots[ps->in[2]];
    ebb_tensor *mask = NULL, *wm = NULL, *sum = NULL, *gt = NULL, *dot = NULL, *diff = NULL,
               *q = NULL, *out = NULL;
    int64_t dim1 = 1;
    ebb_status st = ebb_tensor_compare(&mask, EBB_NE, t, 0.0);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&wm, EBB_MUL, w, mask);
    if (st == EBB_OK)
        st = ebb_tensor_reduce(&sum, EBB_REDUCE_SUM, wm, &dim1, 1, true);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&gt, EBB_MUL, g, t);
    if (st == EBB_OK)
        st = ebb_tensor_reduce(&dot, EBB_REDUCE_SUM, gt, &dim1, 1, true);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&diff, EBB_SUB, g, dot);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&q, EBB_DIV, diff, sum);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&out, EBB_MUL, q, mask);
    ebb_tensor *tmp[] = {mask, wm, sum, gt, dot, diff, q};
    for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++)
        ebb_tensor_free(tmp[i]);
    if (st == EBB_OK)
        slot_set(r, ps->out[0], out);
    return st;
}

static ebb_status zeros(run_ctx *r, const plan_step *s) {
    const ebb_plan_value *v = &r->plan->values[s->pub.out[0]];
    ebb_tensor *z = NULL;
    ebb_status st = ebb_tensor_zeros(&z, &r->shapes[s->shape_of], v->dtype, r->model->device);
    if (st == EBB_OK)
        slot_set(r, s->pub.out[0], z);
    return st;
}

/* ---- one step ------------------------------------------------------------- */

static ebb_status exec_step(run_ctx *r, const plan_step *s, int *jump) {
    const ebb_plan_step *ps = &s->pub;
    *jump = 0;
    switch (ps->kind) {
    case EBB_STEP_OP: {
        for (int i = 0; i < ps->n_in; i++) {
            r->args[i] = r->slots[ps->in[i]];
            if (!r->args[i]) {
                char id[64];
                ebb_plan_value_id(r->plan, ps->in[i], id, sizeof id);
                return ebb_error_set(EBB_ERR_RUNTIME, "input %s is empty", id);
            }
        }
        ebb_tensor *copies[EBB_MAX_PARAMS];
        ebb_status cs = params_for_step(r, s, copies, NULL);
        if (cs != EBB_OK)
            return cs;
        ebb_op_call call = {.op = s->op, .attrs = s->attrs, .in = r->args, .n_in = ps->n_in,
                            .params = r->params, .n_params = s->n_params, .node = ps->node,
                            .position = ebb_kv_cache_length(r->kv)};
        if (s->op->state_inputs) /* its new positions: ebb_op.state_inputs */
            r->kv_written = ebb_tensor_shape(r->args[0]).dim[ebb_tensor_ndim(r->args[0]) - 2];
        if (s->param_cast) {
            /* never in place: the copies go when the call returns, but
             * those kept for the backward */
            ebb_tensor *out = NULL;
            ebb_status st = s->train ? forward_train(r, s, &call) : s->op->forward(&call, &out);
            if (st == EBB_OK)
                param_copies_keep(r, s, copies);
            param_copies_free(s, copies);
            if (st == EBB_OK && !s->train && !out)
                st = ebb_error_set(EBB_ERR_RUNTIME, "op %s returned no tensor", s->op->name);
            if (st == EBB_OK && !s->train)
                slot_set(r, ps->out[0], out);
            else
                ebb_tensor_free(out);
            return st;
        }
        if (s->pub.in_place && !r->borrowed[ps->in[0]] && ebb_tensor_is_exclusive(r->args[0])) {
            /* the output takes over the input's storage and handle */
            ebb_status st = s->op->forward_inplace(&call, r->args[0]);
            if (st != EBB_OK)
                return st;
            r->slots[ps->in[0]] = NULL;
            slot_set(r, ps->out[0], r->args[0]);
            return EBB_OK;
        }
        ebb_tensor *out = NULL;
        if (s->train)
            return forward_train(r, s, &call);
        ebb_status st = s->op->forward(&call, &out);
        if (st != EBB_OK)
            return st;
        if (!out)
            return ebb_error_set(EBB_ERR_RUNTIME, "op %s returned no tensor", s->op->name);
        slot_set(r, ps->out[0], out);
        return EBB_OK;
    }
    case EBB_STEP_BACKWARD: return backward(r, s);
    case EBB_STEP_ACCUM: return accumulate(r, s);
    case EBB_STEP_UPDATE: return update(r, s);
    case EBB_STEP_CLIP: return clip(r, s);
    case EBB_STEP_UNSCALE: return unscale(r, s, jump);
    case EBB_STEP_GRAD_SUM: return grad_sum(r, s);
    case EBB_STEP_GRAD_SUMS: return grad_sums(r, s, jump);
    case EBB_STEP_ALLREDUCE:
    case EBB_STEP_REDUCE_SCATTER:
    case EBB_STEP_ALLREDUCE_START:
    case EBB_STEP_REDUCE_SCATTER_START:
    case EBB_STEP_ALLREDUCE_WAIT:
    case EBB_STEP_REDUCE_SCATTER_WAIT:
    case EBB_STEP_BROADCAST: return collective(r, s);
    case EBB_STEP_ZEROS: return zeros(r, s);
    case EBB_STEP_SKIP:
        *jump = !r->written[ps->in[0]];
        return EBB_OK;
    case EBB_STEP_EXIT_BACKWARD: return exit_backward(r, s);
    case EBB_STEP_ENTER_BACKWARD: return enter_backward(r, s);
    case EBB_STEP_ROUTE_BACKWARD: return route_backward(r, s);
    case EBB_STEP_ALIAS: {
        ebb_tensor *t = NULL;
        if (!r->slots[ps->in[0]]) {
            /* a gradient only a skipped branch or iteration would have given */
            slot_set(r, ps->out[0], NULL);
            return EBB_OK;
        }
        ebb_status st = ebb_tensor_ref(&t, r->slots[ps->in[0]]);
        if (st == EBB_OK)
            slot_set(r, ps->out[0], t);
        return st;
    }
    case EBB_STEP_ROUTE: {
        ebb_tensor *t = NULL;
        ebb_status st = s->mode == EBB_ROUTE_SWITCH ? route_switch(s, r->slots[ps->in[0]], &t)
                                                    : route_topk(s, r->slots[ps->in[0]], &t);
        if (st != EBB_OK)
            return st;
        slot_set(r, ps->out[0], t);
        slot_set(r, ps->out[1], NULL); /* the accumulator starts empty */
        if (ebb_tensor_shape(t).dim[0] == 0) {
            /* no rows: every branch will be skipped; the result is an empty
             * batch of the planned shape */
            const ebb_plan_value *acc = &r->plan->values[ps->out[1]];
            ebb_shape zs = acc->shape;
            zs.dim[0] = 0;
            ebb_tensor *z = NULL;
            ebb_status st = ebb_tensor_zeros(&z, &zs, acc->dtype, ebb_tensor_device(t));
            if (st != EBB_OK)
                return st;
            slot_set(r, ps->out[1], z);
        }
        return EBB_OK;
    }
    case EBB_STEP_ENTER: return enter_branch(r, s, jump);
    case EBB_STEP_EXIT: return exit_branch(r, s);
    case EBB_STEP_LOOP_INIT:
        r->counters[s->counter] = 0;
        *jump = s->limit == 0;
        return EBB_OK;
    case EBB_STEP_LOOP_NEXT:
        *jump = ++r->counters[s->counter] < s->limit;
        return EBB_OK;
    case EBB_STEP_JUMP_IF: {
        double mean = 0.0;
        ebb_status st = ebb_tensor_mean_value(r->slots[ps->in[0]], &mean);
        if (st != EBB_OK)
            return st;
        *jump = (mean > 0.0) == (s->sense != 0);
        return EBB_OK;
    }
    }
    return ebb_error_set(EBB_ERR_RUNTIME, "unknown step kind %d", (int)ps->kind);
}

/* ---- the run -------------------------------------------------------------- */

static ebb_status check_model(const ebb_plan *p, const ebb_model *m) {
    if (atomic_load_explicit(&((ebb_model *)m)->checked_plan, memory_order_acquire) == p->id)
        return EBB_OK;
    if (m->n_params != p->n_params)
        return ebb_error_set(EBB_ERR_ARG, "ebb_run: the model has %d parameters, plan %s needs %d",
                             m->n_params, p->name, p->n_params);
    for (int i = 0; i < p->n_params; i++) {
        ebb_shape have = ebb_tensor_shape(m->params[i]);
        if (strcmp(m->names[i], p->params[i].full_name) != 0 ||
            !ebb_shape_equal(&have, &p->params[i].spec.shape)) {
            char a[96], b[96];
            return ebb_error_set(EBB_ERR_ARG,
                                 "ebb_run: model parameter %s %s does not match plan parameter %s %s",
                                 m->names[i], ebb_shape_str(&have, a, sizeof a),
                                 p->params[i].full_name,
                                 ebb_shape_str(&p->params[i].spec.shape, b, sizeof b));
        }
    }
    atomic_store_explicit(&((ebb_model *)m)->checked_plan, p->id, memory_order_release);
    return EBB_OK;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ebb_status ebb_run(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                   ebb_tensor **outputs, ebb_run_stats *stats) {
    return ebb_run_ex(plan, model, inputs, outputs, NULL, stats);
}

ebb_status ebb_run_ex(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                      ebb_tensor **outputs, const ebb_run_options *opts, ebb_run_stats *stats) {
    if (!plan || !model || !outputs || (plan->n_inputs && !inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_run: plan, model, inputs and outputs are required");
    if (plan->training)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: plan %s is a training step; run it with ebb_train_step() "
                             "or ebb_grad()",
                             plan->name);
    return ebb_run_plan(plan, model, inputs, outputs, opts, stats, NULL);
}

/* The run's state: slots, scratch, counters and flags in one allocation;
 * for a training plan also the shapes and written flags per slot and the
 * loss's seed gradient (made before the baseline is taken, so that the
 * run's figures are the plan's). The caller's inputs are borrowed into their
 * slots. On failure the caller still calls run_ctx_free, which frees what
 * was made. */
static ebb_status run_ctx_init(run_ctx *r, const ebb_plan *plan, const ebb_model *model,
                               ebb_tensor *const *inputs, const ebb_run_options *opts,
                               ebb_optimizer *opt) {
    *r = (run_ctx){.plan = plan, .model = model, .opt = opt, .seed = opts ? opts->seed : 0,
                   .dist = opts ? opts->dist : NULL, .dev = model->device,
                   .kv = opts ? opts->kv_cache : NULL,
                   .micro_batch = opts ? opts->micro_batch : 0,
                   .micro_batches = opts ? opts->micro_batches : 0};
    /* accumulation: the step's first micro-batch starts the sums afresh */
    if (plan->train_options.accumulate > 1 && r->micro_batch == 0)
        ebb_optimizer_sums_restart(opt);
    ebb_status st = EBB_OK;
    if (plan->training) {
        ebb_shape scalar = {0};
        const ebb_plan_value *loss = &plan->values[plan->outputs[0]];
        r->shapes = calloc((size_t)plan->n_values + 1, sizeof *r->shapes);
        r->written = calloc((size_t)plan->n_values + 1, 1);
        if (!r->shapes || !r->written)
            return ebb_error_set(EBB_ERR_NOMEM, "ebb_run: out of memory");
        double seed_grad = opts && opts->loss_scale != 0 ? opts->loss_scale : 1.0;
        if (plan->train_options.loss_scaling) {
            double scale = ebb_optimizer_loss_scale(opt);
            if (!(scale > 0))
                return ebb_error_set(EBB_ERR_ARG,
                                     "plan %s scales its loss, and the optimizer "
                                     "has no loss scale (ebb_optimizer_set_loss_scaling)",
                                     plan->name);
            seed_grad *= scale;
        }
        if ((st = ebb_tensor_full(&r->one, &scalar, seed_grad, loss->dtype, r->dev)) != EBB_OK)
            return st;
    }
    size_t n_ptr = (size_t)plan->n_values + (size_t)plan->max_in + (size_t)plan->max_params + 3;
    void *block = calloc(1, n_ptr * sizeof(ebb_tensor *) +
                                ((size_t)plan->n_counters + 1) * sizeof(int64_t) +
                                (size_t)plan->n_values + 1);
    if (!block)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_run: out of memory");
    r->slots = block;
    r->args = r->slots + plan->n_values + 1;
    r->params = r->args + plan->max_in + 1;
    r->counters = (int64_t *)(r->params + plan->max_params + 1);
    r->borrowed = (unsigned char *)(r->counters + plan->n_counters + 1);
    for (int i = 0; i < plan->n_inputs; i++) {
        r->slots[plan->inputs[i]] = inputs[i];
        r->borrowed[plan->inputs[i]] = 1;
        if (r->shapes)
            r->shapes[plan->inputs[i]] = ebb_tensor_shape(inputs[i]);
    }
    /* the key/value cache's tensors are the caller's too */
    return ebb_kv_cache_bind(r->kv, plan, r->dev, r->slots, r->borrowed);
}

/* Releases every slot the run still holds (the caller's inputs stay the
 * caller's) and the run's own allocations. */
static void run_ctx_free(run_ctx *r) {
    if (r->slots)
        for (int v = 0; v < r->plan->n_values; v++)
            if (r->slots[v])
                slot_release(r, v);
    free(r->slots);
    free(r->shapes);
    free(r->written);
    ebb_tensor_free(r->one);
    *r = (run_ctx){0};
}

/* A data-parallel plan needs its group: of its size, and for a ZeRO-1
 * plan this process as the rank the plan is for. */
static ebb_status check_dist(const ebb_plan *plan, const ebb_run_options *opts) {
    const ebb_parallel_options *par = &plan->train_options.parallel;
    if (par->world > 1 && (!opts || ebb_dist_world_size(opts->dist) != par->world))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: plan %s averages its gradients over %d ranks; "
                             "ebb_run_options.dist is %s",
                             plan->name, par->world,
                             opts && opts->dist ? "a group of another size" : "NULL");
    if (plan->owner && par->world > 1 && ebb_dist_rank(opts->dist) != par->rank)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: plan %s is rank %d's share of a sharded optimizer "
                             "(ebb_parallel_options.zero); this process is rank %d",
                             plan->name, par->rank, ebb_dist_rank(opts->dist));
    return EBB_OK;
}

/* A micro-batch's place in its step, which only an accumulating plan takes. */
static ebb_status check_micro(const ebb_plan *plan, const ebb_run_options *opts) {
    int k = opts ? opts->micro_batch : 0, n = opts ? opts->micro_batches : 0;
    if (k < 0 || n < 0 || (n > 0 && k >= n) || (n == 0 && k != 0))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: micro_batch %d of micro_batches %d: a micro-batch is "
                             "0 .. micro_batches - 1",
                             k, n);
    if (n > 1 && plan->train_options.accumulate <= 1)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_run: plan %s updates from every run; compile it with "
                             "ebb_train_options.accumulate to sum %d micro-batches",
                             plan->name, n);
    return EBB_OK;
}

/* The allocator's high-water mark since its last reset, over the run's
 * baseline, kept in r->run_peak when it is the largest yet; -1 where the
 * device cannot say. */
static int64_t sample_peak(run_ctx *r) {
    ebb_memory_stats ms;
    if (ebb_memory_stats_get(r->dev, &ms) != EBB_OK)
        return -1;
    int64_t peak = ms.peak_bytes - r->base;
    if (peak > r->run_peak)
        r->run_peak = peak;
    return peak;
}

ebb_status ebb_run_plan(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                        ebb_tensor **outputs, const ebb_run_options *opts, ebb_run_stats *stats,
                        ebb_optimizer *opt) {
    for (int i = 0; i < plan->n_outputs; i++)
        outputs[i] = NULL;
    if (stats)
        *stats = (ebb_run_stats){.measured_peak_bytes = -1, .over_step = -1};
    ebb_status st = check_model(plan, model);
    if (st != EBB_OK)
        return st;
    ebb_device dev = model->device;
    for (int i = 0; i < plan->n_inputs; i++) {
        const ebb_plan_value *v = &plan->values[plan->inputs[i]];
        if (!inputs[i])
            return ebb_error_set(EBB_ERR_ARG, "ebb_run: input '%s' is NULL", v->name);
        ebb_shape have = ebb_tensor_shape(inputs[i]);
        ebb_device d = ebb_tensor_device(inputs[i]);
        ebb_dtype dt = ebb_tensor_dtype(inputs[i]);
        if (have.ndim != v->shape.ndim || dt != v->dtype || d.type != dev.type ||
            d.index != dev.index) {
            char a[96], b[96], da[32], db[32];
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "ebb_run: input '%s' is %s %s on %s; plan %s expects %s %s on %s",
                                 v->name, ebb_dtype_name(dt), ebb_shape_str(&have, a, sizeof a),
                                 ebb_device_str(d, da, sizeof da), plan->name,
                                 ebb_dtype_name(v->dtype), ebb_shape_str(&v->shape, b, sizeof b),
                                 ebb_device_str(dev, db, sizeof db));
        }
    }

    /* the figures count what the process holds already: model and inputs */
    if (opts && opts->check_fits && ebb_plan_check_fits(plan, dev, model, 0, NULL) != EBB_OK)
        return ebb_error_prefix("ebb_run");

    if ((st = check_dist(plan, opts)) != EBB_OK || (st = check_micro(plan, opts)) != EBB_OK)
        return st;
    run_ctx r;
    if ((st = run_ctx_init(&r, plan, model, inputs, opts, opt)) != EBB_OK)
        goto done;

    /* cuBLAS's handle and workspace, made at the first matrix product and
     * kept for the process's life, exist before the baseline is taken: they
     * are a fixed cost like the parameters, not an intermediate */
    if (dev.type == EBB_DEVICE_CUDA && (st = ebb_device_prepare(dev, NULL)) != EBB_OK)
        goto done;
    ebb_memory_reset_peak(dev);
    r.base = ebb_memory_current(dev);
    double t0 = now_seconds();
    int64_t executed = 0;
    ebb_trace_fn trace = opts ? opts->trace : NULL;
    /* A traced run measures each step's own high-water mark: the allocator's
     * peak is reset before every step, so the run's peak is kept in r.run_peak.
     * So is an update step's, whose optimizer state moves the baseline. */
    double step_t0 = 0.0;
    /* On the CPU every step's own peak is measured (the counters are two
     * atomics) and held to the plan's figure for it: the first step above
     * it is reported in the stats. */
    int check_steps = dev.type == EBB_DEVICE_CPU;
    int over_step = -1;
    int64_t over_bytes = 0;
    for (int pc = 0; pc < plan->n_steps;) {
        const plan_step *s = &plan->steps[pc];
        int jump = 0;
        int own_peak = trace || s->pub.kind == EBB_STEP_UPDATE || check_steps;
        if (own_peak) {
            sample_peak(&r);
            ebb_memory_reset_peak(dev);
            step_t0 = now_seconds();
        }
        st = exec_step(&r, s, &jump);
        if (st != EBB_OK) {
            ebb_error_prefix("step %d (%s, node %s)", pc, s->pub.op, s->pub.node);
            goto done;
        }
        executed++;
        int64_t step_peak = -1;
        const int *freed = jump ? s->pub.jump_frees : s->pub.frees;
        int n_freed = jump ? s->pub.n_jump_frees : s->pub.n_frees;
        for (int k = 0; k < n_freed; k++)
            slot_release(&r, freed[k]);
        if (trace) {
            ebb_device_synchronize(dev);
            step_peak = sample_peak(&r);
            ebb_trace_event ev = {.step = pc, .info = &s->pub, .freed = freed, .n_freed = n_freed,
                                  .jumped = jump, .live_bytes = ebb_memory_current(dev) - r.base,
                                  .peak_bytes = step_peak, .seconds = now_seconds() - step_t0,
                                  .planned_peak_bytes = dev.type == EBB_DEVICE_CUDA
                                                            ? s->cuda_peak_bytes
                                                            : s->pub.peak_bytes};
            trace(&ev, opts->trace_user);
        } else if (own_peak) {
            step_peak = sample_peak(&r);
            ebb_memory_reset_peak(dev);
        }
        if (check_steps && over_step < 0 && step_peak > s->pub.peak_bytes) {
            over_step = pc;
            over_bytes = step_peak - s->pub.peak_bytes;
        }
        pc = jump ? s->pub.jump : pc + 1;
    }
    if ((st = ebb_kv_cache_advance(r.kv, r.kv_written)) != EBB_OK)
        goto done;
    for (int i = 0; i < plan->n_outputs; i++) {
        ebb_tensor *t = r.slots[plan->outputs[i]];
        if (!t && plan->training && i > 0)
            continue; /* a gradient only a branch or iteration that did not run would give */
        st = t ? ebb_tensor_ref(&outputs[i], t)
               : ebb_error_set(EBB_ERR_RUNTIME, "ebb_run: output '%s' was not produced",
                               plan->output_names[i]);
        if (st != EBB_OK)
            goto done;
    }
    if (stats) {
        ebb_device_synchronize(dev);
        stats->seconds = now_seconds() - t0;
        stats->measured_peak_bytes = sample_peak(&r) < 0 ? -1 : r.run_peak;
        stats->planned_peak_bytes = ebb_plan_device_peak_bytes(plan, dev);
        stats->steps_executed = executed;
        stats->over_step = over_step;
        stats->over_bytes = over_bytes;
    }
done:
    /* a run that failed with an all-reduce under way waits for it (bounded
     * by the group's timeout) before its tensors go; the first error stands */
    if (r.pending) {
        char first[1024];
        snprintf(first, sizeof first, "%s", ebb_errmsg());
        ebb_status ws = ebb_dist_work_finish(r.pending);
        r.pending = NULL;
        if (st != EBB_OK)
            ebb_error_set(st, "%s", first);
        else
            st = ws;
    }
    if (st != EBB_OK)
        for (int i = 0; i < plan->n_outputs; i++) {
            ebb_tensor_free(outputs[i]);
            outputs[i] = NULL;
        }
    run_ctx_free(&r);
    return st;
}
