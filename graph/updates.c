/* What a training plan does with the final gradients: one UPDATE step per
 * trained parameter (as soon as its gradient is final, or after the whole
 * backward), data parallel's buckets (when one is averaged and its updates
 * may follow), clipping by the norm and loss scaling's unscale step; with
 * accumulation first the sums the gradients are added into, and the step
 * that ends every micro-batch but the last. The collectives' own steps are
 * graph/collectives.c's. */
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"

/* One update step: the optimizer reads the parameter's final gradient. */
static int emit_update(ad *a, int i) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int g = a->pgrad[i];
    plan_step *u = ebb_compiler_step_new(c, EBB_STEP_UPDATE, "update", p->params[i].full_name);
    if (!u || ebb_compiler_step_set_slots(c, u, &g, 1, NULL, 0) != 0)
        return -1;
    u->pub.phase = EBB_PHASE_UPDATE;
    u->pub.param = i;
    const ebb_plan_value *gv = &p->values[g];
    /* a parameter group without weight decay counts its update so */
    ebb_optimizer_options oo = a->t->optimizer;
    if (p->no_decay && p->no_decay[i]) {
        oo.weight_decay = 0;
        oo.complete = 1;
    }
    u->workspace = ebb_optimizer_update_scratch_bytes(&oo, gv->dtype, ebb_shape_numel(&gv->shape),
                                                      (ebb_device){EBB_DEVICE_CPU, 0}, 1);
    if (u->workspace < 0) {
        c->status = ebb_errcode();
        return -1;
    }
    /* clip_grad_value: the clamped copy of the gradient the update reads, a
     * block of its own on a GPU */
    if (a->t->clip_grad_value > 0) {
        int64_t cuda = ebb_optimizer_update_scratch_bytes(&oo, gv->dtype,
                                                          ebb_shape_numel(&gv->shape),
                                                          (ebb_device){EBB_DEVICE_CUDA, 0}, 1);
        u->workspace += gv->nbytes;
        u->workspace_cuda = ebb_cuda_block(gv->nbytes) + (cuda > 0 ? cuda : 0);
        u->has_workspace_cuda = 1;
    }
    a->updated[i] = 1;
    return 0;
}

/* Updates the parameters in `which` (n of them) whose gradient is final,
 * smallest gradient first: each frees its gradient, and the scratch of the
 * next (about a parameter's size for Adam) then lands on less; largest
 * first would add the biggest scratch to every gradient. */
static int emit_updates(ad *a, const int *which, int n) {
    ebb_plan *p = a->c->plan;
    for (;;) {
        int best = -1;
        int64_t best_bytes = 0;
        for (int k = 0; k < n; k++) {
            int i = which[k];
            if (a->updated[i] || a->pgrad[i] < 0 || !p->trained[i] ||
                (p->owner && p->owner[i] != p->train_options.parallel.rank))
                continue; /* ZeRO-1: another rank updates it */
            int64_t b = p->values[a->pgrad[i]].nbytes;
            if (best < 0 || b < best_bytes)
                best = i, best_bytes = b;
        }
        if (best < 0)
            return 0;
        if (emit_update(a, best) != 0)
            return -1;
    }
}

/* data parallel: the updates of a bucket's parameters, once it is averaged,
 * but those placement defers to the backward's end (graph/placement.c). */
static int emit_bucket_updates(ad *a, const int *members, int m) {
    int *now = malloc(((size_t)m + 1) * sizeof *now), n = 0;
    if (!now)
        return ebb_compiler_oom(a->c);
    for (int k = 0; k < m; k++)
        if (!(a->c->defer && a->c->defer[members[k]]))
            now[n++] = members[k];
    int rc = emit_updates(a, now, n);
    free(now);
    return rc;
}

/* parallel.overlap: the wait for the bucket under way, then its
 * parameters' updates unless they wait for the backward's end (`updates`). */
static int wait_pending(ad *a, int updates) {
    int n = a->n_pending;
    if (ebb_ad_allreduce_wait(a) != 0)
        return -1;
    return updates && n > 0 ? emit_bucket_updates(a, a->pending, n) : 0;
}

/* data parallel: the parameters which[0..n) have their final gradients;
 * they join the open bucket, which is averaged once it is full (force: now)
 * and its parameters updated after (unless the updates wait for the
 * backward's end). With parallel.overlap a full bucket's all-reduce only
 * starts: the backward goes on while it travels, and it is waited for, and
 * its parameters updated, when the next bucket is full. */
static int bucket_add(ad *a, const int *which, int n, int force) {
    ebb_plan *p = a->c->plan;
    for (int k = 0; k < n; k++) {
        int i = which[k], seen = 0;
        if (a->pgrad[i] < 0 || !p->trained[i] || a->updated[i] || a->reduced[i])
            continue; /* ZeRO-1 updates another rank's parameters nowhere: `reduced` says */
        for (int j = 0; j < a->n_bucket; j++)
            seen |= a->bucket[j] == i;
        if (seen)
            continue;
        a->bucket[a->n_bucket++] = i;
        a->bucket_bytes += p->values[a->pgrad[i]].nbytes;
    }
    int64_t cap = a->t->parallel.bucket_bytes > 0 ? a->t->parallel.bucket_bytes : 25 << 20;
    /* one collective at a time: the bucket under way first (the backward's
     * end waits for it whatever is left to average) */
    if ((force || (a->n_bucket > 0 && a->bucket_bytes >= cap)) &&
        wait_pending(a, !a->hold_updates) != 0)
        return -1;
    if (a->n_bucket == 0 || (!force && a->bucket_bytes < cap))
        return 0;
    if (!force && ebb_ad_can_overlap(a))
        return ebb_ad_allreduce_start(a);
    int m = a->n_bucket, *members = malloc((size_t)m * sizeof *members);
    if (!members)
        return ebb_compiler_oom(a->c);
    memcpy(members, a->bucket, (size_t)m * sizeof *members);
    int rc = ebb_ad_allreduce(a) != 0               ? -1
             : force || a->hold_updates ? 0
                                        : emit_bucket_updates(a, members, m);
    free(members);
    return rc;
}

/* ---- accumulation (ebb_train_options.accumulate) ---- */

static int accumulating(const ad *a) { return a->t->accumulate > 1; }

/* Parameter i's final gradient added into its sum, where it dies: the
 * optimizer holds the sum, and the step makes nothing the plan counts
 * (the buffer, made at the run's first, is counted beside the
 * parameters). */
static int emit_sum(ad *a, int i) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int g = a->pgrad[i];
    plan_step *s = ebb_compiler_step_new(c, EBB_STEP_GRAD_SUM, "grad_sum", p->params[i].full_name);
    if (!s || ebb_compiler_step_set_slots(c, s, &g, 1, NULL, 0) != 0)
        return -1;
    s->pub.phase = EBB_PHASE_BACKWARD;
    s->pub.param = i;
    a->summed[i] = 1; /* a->pgrad[i] stays, for the sum's shape */
    return 0;
}

/* Whether a step makes which gradients exist depend on the data: a route,
 * a branch, a loop. */
static int routes(ebb_step_kind k) {
    return k == EBB_STEP_ROUTE || k == EBB_STEP_ENTER || k == EBB_STEP_JUMP_IF ||
           k == EBB_STEP_LOOP_INIT || k == EBB_STEP_SKIP;
}

/* The sums of the parameters which[0..n) whose gradient is final. */
static int emit_sums(ad *a, const int *which, int n) {
    const ebb_plan *p = a->c->plan;
    for (int k = 0; k < n; k++) {
        int i = which[k];
        if (a->pgrad[i] >= 0 && p->trained[i] && !a->summed[i] && emit_sum(a, i) != 0)
            return -1;
    }
    return 0;
}

/* After the backward: the sums not added yet, then the GRAD_SUMS step,
 * whose outputs (the sums, values the optimizer holds) are the gradients
 * the rest of the plan reads; *at gets its index, whose jump to the end is
 * set once the plan is complete. */
static int emit_sums_step(ad *a, int *at) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int *all = malloc(((size_t)p->n_params + 1) * sizeof *all);
    int *out = malloc(((size_t)p->n_params + 1) * sizeof *out);
    int *of = malloc(((size_t)p->n_params + 1) * sizeof *of), n = 0, rc = 0;
    if (!all || !out || !of)
        rc = ebb_compiler_oom(c);
    for (int i = 0; rc == 0 && i < p->n_params; i++)
        all[i] = i;
    if (rc == 0)
        rc = emit_sums(a, all, p->n_params);
    for (int i = 0; rc == 0 && i < p->n_params; i++) {
        if (!a->summed[i])
            continue;
        ebb_tensor *m = ebb_compiler_meta_ref(c, a->pgrad[i]);
        int v = m ? ebb_compiler_value_new(c, m, EBB_VALUE_HELD, p->n_steps, -1) : -1;
        if (v < 0)
            rc = m ? -1 : ebb_compiler_oom(c);
        else
            a->pgrad[i] = out[n] = v, of[n++] = i;
    }
    plan_step *s = rc == 0 ? ebb_compiler_step_new(c, EBB_STEP_GRAD_SUMS, "grad_sums",
                                                   "gradients") : NULL;
    if (rc == 0 && (!s || ebb_compiler_step_set_slots(c, s, NULL, 0, out, n) != 0))
        rc = -1;
    if (rc == 0) {
        s->pub.phase = EBB_PHASE_UPDATE;
        /* data parallel, where a micro-batch may reach a parameter on one
         * rank only: the ranks' float64 flags, a copy of them and the
         * divisor's wrapping (a bound; such a plan's peak is one anyway) */
        for (int i = 0; p->train_options.parallel.world > 1 && i < p->n_steps && !s->agree; i++)
            s->agree = routes(p->steps[i].pub.kind);
        if (s->agree) {
            s->workspace = 16 * (int64_t)n + 8;
            s->workspace_cuda = 2 * ebb_cuda_block(8 * (int64_t)n) + ebb_cuda_block(8);
            s->has_workspace_cuda = 1;
        }
        s->sums_of = of;
        of = NULL;
        *at = ebb_compiler_step_index(c, s);
    }
    free(all);
    free(out);
    free(of);
    return rc;
}

/* After the backward step of forward step fi: the parameters it was the
 * first reader of have their final gradient now. Inside a routed region or
 * an unrolled loop the update waits for the end, where no skip can jump
 * over it. With clipping by the norm, loss scaling or updates_after_backward
 * every update waits for the end; data parallel's buckets still travel as
 * they fill (ZeRO-1's then free the others' gradients there). */
int ebb_ad_updates_after_step(ad *a, int fi) {
    ebb_plan *p = a->c->plan;
    if (a->t->grads_only || a->depth > 0 || a->n_loops > 0 ||
        (a->hold_updates && p->train_options.parallel.world <= 1 && !accumulating(a)))
        return 0;
    if (accumulating(a)) { /* into the sums as each is final; the rest waits for them */
        int which[EBB_MAX_PARAMS], n = 0;
        for (int j = 0; j < p->steps[fi].n_params && n < EBB_MAX_PARAMS; j++)
            if (a->first_use[p->steps[fi].param[j]] == fi)
                which[n++] = p->steps[fi].param[j];
        return emit_sums(a, which, n);
    }
    if (p->train_options.parallel.world > 1) {
        /* a bucket of final gradients is averaged before their updates; a
         * deferred update still has its gradient averaged here, so that the
         * buckets, which every rank must share, do not depend on placement
         * (ZeRO-1's ranks place their own updates) */
        int which[EBB_MAX_PARAMS], n = 0;
        for (int j = 0; j < p->steps[fi].n_params && n < EBB_MAX_PARAMS; j++) {
            int i = p->steps[fi].param[j];
            if (a->first_use[i] == fi)
                which[n++] = i;
        }
        return bucket_add(a, which, n, 0);
    }
    int which[EBB_MAX_PARAMS], n = 0;
    for (int j = 0; j < p->steps[fi].n_params && n < EBB_MAX_PARAMS; j++) {
        int i = p->steps[fi].param[j];
        /* a deferred update waits for the backward's end (graph/placement.c) */
        if (a->first_use[i] == fi && !(a->c->defer && a->c->defer[i]))
            which[n++] = i;
    }
    return emit_updates(a, which, n);
}

/* A step after the backward that reads every trained parameter's gradient
 * (in place; ZeRO-1: those of the parameters this rank owns, and the step
 * is there even when it owns none, since it meets the other ranks in a
 * collective): its index, or -1 when no gradient exists (nothing to emit),
 * -2 on error. */
static int gradients_step(ad *a, ebb_step_kind kind, const char *op) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int *in = malloc(((size_t)p->n_params + 1) * sizeof *in), n = 0, any = 0;
    if (!in) {
        ebb_compiler_oom(c);
        return -2;
    }
    for (int i = 0; i < p->n_params; i++)
        if (p->trained[i] && a->pgrad[i] >= 0) {
            any = 1;
            if (!p->owner || p->owner[i] == p->train_options.parallel.rank)
                in[n++] = a->pgrad[i];
        }
    plan_step *s = any ? ebb_compiler_step_new(c, kind, op, "gradients") : NULL;
    int at = !any ? -1 : s && ebb_compiler_step_set_slots(c, s, in, n, NULL, 0) == 0
                             ? ebb_compiler_step_index(c, s)
                             : -2;
    if (at >= 0)
        p->steps[at].pub.phase = EBB_PHASE_UPDATE;
    free(in);
    return at;
}

/* clip_grad_norm: one step after the backward reads every gradient and
 * scales them in place. Its scratch, as ebb_tensor_clip_grad_norm_()
 * allocates it: a norm per gradient, their stack, the total, then the
 * factor (one element each in the gradients' dtype). ZeRO-1 adds, after
 * those are freed, the float64 element of the squared norms' sum over the
 * ranks (ebb_dist_clip_grad_norm_), the only scratch of a rank that owns no
 * gradient. */
static int emit_clip(ad *a) {
    int at = gradients_step(a, EBB_STEP_CLIP, "clip_grad_norm");
    if (at < 0)
        return at == -1 ? 0 : -1;
    const ebb_plan *p = a->c->plan;
    plan_step *s = &p->steps[at];
    int64_t n = s->pub.n_in, e = n ? (int64_t)ebb_dtype_size(p->values[s->pub.in[0]].dtype) : 0;
    s->workspace = n ? 2 * n * e + e : 0;
    s->workspace_cuda = n ? n * ebb_cuda_block(e) + ebb_cuda_block(n * e) + ebb_cuda_block(e) : 0;
    if (p->owner) {
        s->workspace = s->workspace > 8 ? s->workspace : 8;
        s->workspace_cuda = s->workspace_cuda > ebb_cuda_block(8) ? s->workspace_cuda
                                                                  : ebb_cuda_block(8);
    }
    s->has_workspace_cuda = 1;
    return 0;
}

/* loss_scaling: one step after the backward divides every gradient by the
 * scale and jumps past the updates when one is not finite (its target is
 * set once they are emitted). Its scratch is ebb_tensor_unscale_()'s.
 * ZeRO-1: this rank's gradients, and the ranks agree on the jump. */
static int emit_unscale(ad *a, int *at) {
    *at = gradients_step(a, EBB_STEP_UNSCALE, "unscale");
    if (*at < 0)
        return *at == -1 ? 0 : -1;
    const ebb_plan *p = a->c->plan;
    plan_step *s = &p->steps[*at];
    if (s->pub.n_in) {
        ebb_dtype dt = p->values[s->pub.in[0]].dtype;
        s->workspace = ebb_tensor_unscale_scratch(dt, ebb_device_cpu());
        s->workspace_cuda = ebb_tensor_unscale_scratch(dt, (ebb_device){EBB_DEVICE_CUDA, 0});
    }
    if (p->owner) { /* then the flag the ranks sum (ebb_optimizer_unscale_sharded_) */
        s->workspace = s->workspace > 8 ? s->workspace : 8;
        s->workspace_cuda = s->workspace_cuda > ebb_cuda_block(8) ? s->workspace_cuda
                                                                  : ebb_cuda_block(8);
    }
    s->has_workspace_cuda = 1;
    return 0;
}

/* After the backward: data parallel's last bucket, loss scaling's unscale
 * step, clipping by the norm, every update not emitted yet and ZeRO-1's
 * broadcasts, then whether any update runs before the backward ends. */
int ebb_ad_after_backward(ad *a) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int sums = -1;
    if (accumulating(a) && emit_sums_step(a, &sums) != 0)
        return -1;
    /* data parallel: every gradient not averaged yet, in one last bucket
     * (before loss scaling and clipping read them) */
    if (p->train_options.parallel.world > 1) {
        int *all = malloc(((size_t)p->n_params + 1) * sizeof *all);
        if (!all)
            return ebb_compiler_oom(c);
        for (int i = 0; i < p->n_params; i++)
            all[i] = i;
        int rc = bucket_add(a, all, p->n_params, 1);
        free(all);
        if (rc != 0)
            return -1;
    }
    int unscale = -1;
    if (a->t->loss_scaling && emit_unscale(a, &unscale) != 0)
        return -1;
    if (a->t->clip_grad_norm > 0 && emit_clip(a) != 0)
        return -1;
    /* what no backward step has updated yet */
    int *all = malloc(((size_t)p->n_params + 1) * sizeof *all);
    if (!all)
        return ebb_compiler_oom(c);
    for (int i = 0; i < p->n_params; i++)
        all[i] = i;
    int rc = emit_updates(a, all, p->n_params);
    free(all);
    if (rc == 0 && p->owner)
        rc = ebb_ad_broadcasts(a);
    if (unscale >= 0) /* past the clip and the updates (and ZeRO's broadcasts: no rank updated) */
        p->steps[unscale].pub.jump = p->n_steps;
    if (sums >= 0) /* a micro-batch before the step's last ends there */
        p->steps[sums].pub.jump = p->n_steps;
    /* the plan says whether any update runs before the backward ends */
    for (int i = 0, seen = 0; rc == 0 && i < p->n_steps; i++) {
        if (seen && p->steps[i].pub.phase == EBB_PHASE_BACKWARD)
            p->updates_in_backward = 1;
        seen |= p->steps[i].pub.kind == EBB_STEP_UPDATE;
    }
    return rc;
}

