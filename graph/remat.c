/* Rematerialization: a training plan that must fit a memory budget keeps
 * fewer forward values for the backward and recomputes the others.
 *
 * The method is checkpointing in segments (Chen et al., 2016), searched:
 *
 *   1. In the plan compiled keeping everything, find the articulation
 *      values: after the forward step that makes one, it is the only value
 *      made so far that later forward steps read (a residual stream between
 *      blocks, a chain's every link). Cutting there leaves nothing else to
 *      keep.
 *   2. A policy (s, d) keeps every s-th articulation value as a checkpoint
 *      and drops every other value made in the first d segments between
 *      checkpoints; the segments after are kept whole. graph/autodiff.c
 *      then recomputes a dropped value just before its first backward read,
 *      from the checkpoint, so a segment is rebuilt once, as its backward
 *      begins, and freed as that backward proceeds.
 *   3. For spacings s near 1, 2, 4, ... up to the articulation count, and
 *      √n among them, the smallest d whose predicted peak fits is found by
 *      bisection, each candidate a full compile. Of the policies that fit,
 *      the one with the least predicted extra compute wins.
 *
 * Droppable values are those an OP step made in the forward where no jump
 * can skip it (not inside a routed branch or an unrolled while/until loop),
 * read in the backward only by backward rules, by an op whose training
 * forward is deterministic and writes no buffer (ebb_op_grad.no_recompute:
 * dropout's mask, batch_norm's running statistics). Everything else is kept.
 *
 * What this does not do: choose checkpoints off the articulation values
 * (Checkmate's integer program does, and can beat this on graphs with wide
 * fan-out), or recompute a segment more than once to save more (Chen's
 * recursive variant). The least peak reported in an error is the least this
 * search reached, not a proof that no plan does better. */
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"
#include "ebb/train.h"


/* Whether running the step's training forward again would not repeat it
 * (it draws random numbers or updates a buffer): its output is never
 * recomputed. */
static int op_draws(const plan_step *s) {
    const ebb_op_grad *g = s->op->grad;
    if (!g)
        return 0;
    return g->draws ? g->draws(s->attrs) : g->no_recompute;
}

/* ---- what may be dropped, and where to cut --------------------------------------- */

typedef struct remat {
    const ebb_plan *p; /* compiled keeping everything */
    int n_fwd;         /* forward steps: the first n_fwd */
    unsigned char *droppable; /* per slot */
    int *seg_of_step;  /* per forward step: its articulation index at or after it */
    int *art;          /* steps making an articulation value, in order */
    int n_art;
} remat;

static int covered_by_jump(const ebb_plan *p, int i) {
    for (int j = 0; j < p->n_steps; j++) {
        int t = p->steps[j].pub.jump;
        if (t < 0)
            continue;
        int lo = j < t ? j : t, hi = j < t ? t : j;
        if (i >= lo && i <= hi)
            return 1;
    }
    return 0;
}

static int analyse(remat *r) {
    const ebb_plan *p = r->p;
    int nv = p->n_values, ns = p->n_steps;
    r->n_fwd = 0;
    while (r->n_fwd < ns && p->steps[r->n_fwd].pub.phase == EBB_PHASE_FORWARD)
        r->n_fwd++;
    r->droppable = calloc((size_t)nv + 1, 1);
    r->seg_of_step = malloc(((size_t)r->n_fwd + 1) * sizeof *r->seg_of_step);
    r->art = malloc(((size_t)r->n_fwd + 1) * sizeof *r->art);
    int *last_fwd = malloc(((size_t)nv + 1) * sizeof *last_fwd);
    int *delta = calloc((size_t)r->n_fwd + 2, sizeof *delta);
    unsigned char *jumped = calloc((size_t)r->n_fwd + 1, 1);
    if (!r->droppable || !r->seg_of_step || !r->art || !last_fwd || !delta || !jumped) {
        free(last_fwd);
        free(delta);
        free(jumped);
        return -1;
    }
    for (int i = 0; i < r->n_fwd; i++)
        jumped[i] = (unsigned char)covered_by_jump(p, i);
    for (int v = 0; v < nv; v++) {
        const ebb_plan_value *pv = &p->values[v];
        int made = pv->producer;
        r->droppable[v] = pv->kind == EBB_VALUE_INTERMEDIATE && made >= 0 && made < r->n_fwd &&
                          p->steps[made].pub.kind == EBB_STEP_OP && !jumped[made] &&
                          !op_draws(&p->steps[made]);
        last_fwd[v] = -1;
    }
    /* the backward's other readers (routing, loops, a zeros' shape) read
     * forward slots themselves: those values stay */
    for (int i = r->n_fwd; i < ns; i++) {
        const plan_step *s = &p->steps[i];
        if (s->pub.phase == EBB_PHASE_LOSS || s->pub.kind == EBB_STEP_BACKWARD ||
            s->pub.kind == EBB_STEP_ACCUM || s->pub.kind == EBB_STEP_UPDATE)
            continue;
        for (int k = 0; k < s->pub.n_in; k++)
            r->droppable[s->pub.in[k]] = 0;
        if (s->pub.kind == EBB_STEP_ZEROS && s->shape_of >= 0)
            r->droppable[s->shape_of] = 0;
    }
    /* articulations: after step i, the only value made so far that a later
     * forward (or loss) step reads is the one step i made */
    for (int i = 0; i < ns; i++) {
        const plan_step *s = &p->steps[i];
        if (s->pub.phase != EBB_PHASE_FORWARD && s->pub.phase != EBB_PHASE_LOSS)
            continue;
        for (int k = 0; k < s->pub.n_in; k++)
            last_fwd[s->pub.in[k]] = i;
    }
    for (int v = 0; v < nv; v++) {
        int made = p->values[v].producer;
        if (p->values[v].kind == EBB_VALUE_INPUT || made < 0 || made >= r->n_fwd ||
            last_fwd[v] <= made)
            continue;
        delta[made] += 1; /* live over steps made .. last_fwd-1 */
        delta[last_fwd[v] < r->n_fwd ? last_fwd[v] : r->n_fwd] -= 1;
    }
    r->n_art = 0;
    int live = 0;
    for (int i = 0; i < r->n_fwd; i++) {
        live += delta[i];
        const plan_step *s = &p->steps[i];
        if (live == 1 && s->pub.n_out > 0 && !jumped[i] && p->values[s->pub.out[0]].producer == i &&
            last_fwd[s->pub.out[0]] > i && s->pub.kind == EBB_STEP_OP)
            r->art[r->n_art++] = i;
    }
    for (int i = r->n_fwd - 1, a = r->n_art; i >= 0; i--) {
        while (a > 0 && r->art[a - 1] >= i)
            a--;
        r->seg_of_step[i] = a; /* articulations strictly before step i */
    }
    free(last_fwd);
    free(delta);
    free(jumped);
    return 0;
}

/* Policy (s, d) as the set of dropped slots. Segment k holds the forward
 * steps after articulation k*s-1 up to and including articulation
 * (k+1)*s-1; the tail after the last checkpoint is the last segment. */
static int segments(const remat *r, int s) { return r->n_art / s + 1; }

static void choose(const remat *r, int s, int d, unsigned char *drop) {
    const ebb_plan *p = r->p;
    memset(drop, 0, (size_t)p->n_values);
    for (int v = 0; v < p->n_values; v++) {
        if (!r->droppable[v])
            continue;
        int made = p->values[v].producer;
        int seg = r->seg_of_step[made] / s; /* articulations before it, in segments */
        int is_checkpoint = 0;
        for (int k = 1; k * s <= r->n_art; k++)
            if (r->art[k * s - 1] == made && p->steps[made].pub.out[0] == v)
                is_checkpoint = 1;
        if (seg < d && !is_checkpoint)
            drop[v] = 1;
    }
}

/* ---- the search ----------------------------------------------------------------- */

typedef struct trial {
    ebb_plan *plan;
    int64_t peak, extra;
    int s, d;
} trial;

static ebb_status try_policy(const remat *r, const ebb_graph *g, const ebb_compile_options *opts,
                             int s, int d, unsigned char *drop, trial *t) {
    choose(r, s, d, drop);
    t->plan = NULL;
    ebb_status st =
        ebb_pipeline(&t->plan, g, opts, &(ebb_choices){.drop = drop, .n_drop = r->p->n_values});
    if (st != EBB_OK)
        return st;
    t->peak = t->plan->budget_peak_bytes;
    t->extra = t->plan->recompute_flops;
    t->s = s;
    t->d = d;
    return EBB_OK;
}

/* Keeps the better of *best and *t (fits; then least extra compute; then
 * least peak; of those that do not fit, the least peak, then the least
 * extra compute); frees the other. */
static void keep_better(trial *best, trial *t, int64_t budget) {
    int t_fits = t->peak <= budget, b_fits = best->plan && best->peak <= budget;
    int better = !best->plan || (t_fits && !b_fits) ||
                 (t_fits == b_fits && t_fits &&
                  (t->extra < best->extra || (t->extra == best->extra && t->peak < best->peak))) ||
                 (!t_fits && !b_fits &&
                  (t->peak < best->peak || (t->peak == best->peak && t->extra < best->extra)));
    if (better) {
        ebb_plan_free(best->plan);
        *best = *t;
    } else {
        ebb_plan_free(t->plan);
    }
    t->plan = NULL;
}

ebb_status ebb_remat_fit(ebb_plan **plan, const ebb_graph *g, const ebb_compile_options *opts) {
    ebb_plan *p0 = *plan;
    int least = opts->memory_budget == EBB_MEMORY_BUDGET_LEAST;
    int64_t budget = least ? 0 : opts->memory_budget; /* least: nothing fits, the least wins */
    p0->memory_budget = least ? p0->budget_peak_bytes : budget;
    p0->budget_least = least;
    if (p0->budget_peak_bytes <= budget || (least && !p0->training))
        return EBB_OK;
    char sb[32], pb[32];
    ebb_bytes_str(budget, sb, sizeof sb);
    if (!p0->training) {
        ebb_bytes_str(p0->budget_peak_bytes, pb, sizeof pb);
        ebb_status st = ebb_error_set(EBB_ERR_BUDGET,
                                      "ebb_compile: plan %s needs %s at its peak, over the memory "
                                      "budget of %s (only a training plan can recompute to fit)",
                                      p0->name, pb, sb);
        ebb_plan_free(p0);
        *plan = NULL;
        return st;
    }

    remat r = {.p = p0};
    unsigned char *drop = malloc((size_t)p0->n_values + 1);
    ebb_status st = EBB_OK;
    if (analyse(&r) != 0 || !drop) {
        st = ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
        goto done;
    }
    trial best = {0};
    /* spacings: powers of two, √n and its neighbours, n itself */
    int spacings[48], n_sp = 0, m = r.n_art > 0 ? r.n_art : 1;
    int root = 1;
    while (root * root < m)
        root++;
    for (int s = 1; s <= m && n_sp < 40; s *= 2)
        spacings[n_sp++] = s;
    int extra[4] = {root > 1 ? root - 1 : 1, root, root + 1, m};
    for (int k = 0; k < 4; k++) {
        int dup = extra[k] > m;
        for (int j = 0; j < n_sp; j++)
            dup |= spacings[j] == extra[k];
        if (!dup)
            spacings[n_sp++] = extra[k];
    }
    for (int k = 0; st == EBB_OK && k < n_sp; k++) {
        int s = spacings[k], hi = segments(&r, s);
        trial t;
        /* dropping every segment is this spacing's least peak */
        if ((st = try_policy(&r, g, opts, s, hi, drop, &t)) != EBB_OK)
            break;
        int fits = t.peak <= budget;
        keep_better(&best, &t, budget);
        if (!fits)
            continue;
        int lo = 0; /* d = lo does not fit (d = 0 is the plan keeping everything) */
        while (hi - lo > 1 && st == EBB_OK) {
            int mid = lo + (hi - lo) / 2;
            if ((st = try_policy(&r, g, opts, s, mid, drop, &t)) != EBB_OK)
                break;
            if (t.peak <= budget)
                hi = mid;
            else
                lo = mid;
            keep_better(&best, &t, budget);
        }
    }
    if (st != EBB_OK) {
        ebb_plan_free(best.plan);
        goto done;
    }
    if (least && best.plan && best.peak >= p0->budget_peak_bytes) {
        ebb_plan_free(best.plan); /* recomputing gains nothing here */
        best.plan = NULL;
        goto done;
    }
    if (least && best.plan)
        budget = best.peak;
    if (!best.plan || best.peak > budget) {
        ebb_bytes_str(p0->budget_peak_bytes, pb, sizeof pb);
        char lb[32];
        ebb_bytes_str(best.plan ? best.plan->budget_peak_bytes : p0->budget_peak_bytes, lb, sizeof lb);
        st = ebb_error_set(EBB_ERR_BUDGET,
                           "ebb_compile: plan %s needs %s at its peak keeping every value, and "
                           "%s (%lld bytes) at the least recomputing (checkpoints every %d of %d "
                           "cut points); the memory budget is %s",
                           p0->name, pb, lb,
                           (long long)(best.plan ? best.plan->budget_peak_bytes
                                                 : p0->budget_peak_bytes),
                           best.plan ? best.s : 0, r.n_art, sb);
        ebb_plan_free(best.plan);
        goto done;
    }
    best.plan->memory_budget = budget;
    best.plan->budget_least = least;
    best.plan->no_recompute_peak_bytes = p0->budget_peak_bytes;
    best.plan->remat_segment = best.s;
    ebb_plan_free(p0);
    *plan = best.plan;
    p0 = NULL;
done:
    if (st != EBB_OK) {
        ebb_plan_free(p0);
        *plan = NULL;
    }
    free(drop);
    free(r.droppable);
    free(r.seg_of_step);
    free(r.art);
    return st;
}

/* ---- reading the trade ----------------------------------------------------------- */

int ebb_plan_updates_in_backward(const ebb_plan *p) { return p ? p->updates_in_backward : 0; }
double ebb_plan_clip_grad_norm(const ebb_plan *p) {
    return p ? p->train_options.clip_grad_norm : 0;
}
int ebb_plan_loss_scaling(const ebb_plan *p) { return p ? p->train_options.loss_scaling : 0; }
int ebb_plan_param_decays(const ebb_plan *p, int i) {
    if (!p || !p->training || i < 0 || i >= p->n_params || !p->trained[i]) return 0;
    const ebb_optimizer_options *o = &p->train_options.optimizer;
    int decay = o->weight_decay != 0 || (o->kind == EBB_ADAMW && !o->complete);
    return decay && !(p->no_decay && p->no_decay[i]);
}
int64_t ebb_plan_eager_peak_bytes(const ebb_plan *p) {
    if (!p || !p->training) return 0;
    return p->n_deferred ? p->eager_peak_bytes : p->budget_peak_bytes;
}
double ebb_plan_clip_grad_value(const ebb_plan *p) {
    return p ? p->train_options.clip_grad_value : 0;
}
int64_t ebb_plan_clip_cost_bytes(const ebb_plan *p) {
    return p && p->train_options.clip_grad_norm > 0 ? p->budget_peak_bytes - p->unclipped_peak_bytes
                                                    : 0;
}

ebb_status ebb_plan_remat_stats(const ebb_plan *p, ebb_remat_stats *out) {
    if (!p || !out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_remat_stats: plan and out are required");
    memset(out, 0, sizeof *out);
    out->budget = p->budget_least ? EBB_MEMORY_BUDGET_LEAST : p->memory_budget;
    out->peak_bytes = p->budget_peak_bytes;
    out->no_recompute_peak_bytes = p->no_recompute_peak_bytes;
    out->flops = p->flops;
    out->recompute_flops = p->recompute_flops;
    out->segment = p->remat_segment;
    unsigned char *seen = calloc((size_t)p->n_values + 1, 1);
    if (!seen)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_plan_remat_stats: out of memory");
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        if (!s->pub.recompute)
            continue;
        out->n_recompute_steps++;
        for (int k = 0; k < s->pub.n_in; k++) {
            int v = s->pub.in[k], made = p->values[v].producer;
            if (p->values[v].kind == EBB_VALUE_INTERMEDIATE && made >= 0 &&
                !p->steps[made].pub.recompute && !seen[v]) {
                seen[v] = 1;
                out->n_checkpoints++;
            }
        }
    }
    free(seen);
    return EBB_OK;
}
