/* The autodiff pass's walk through control flow: routed regions (switches
 * and top-k gates) and unrolled while/until loops, in reverse; and the
 * ACCUM steps that add a gradient arriving a second time. */
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"

/* ---- gradient sums -------------------------------------------------------------- */

int ebb_ad_accumulate(ad *a, int *into, int g, const char *node) {
    compiler *c = a->c;
    if (*into == -1) {
        *into = g;
        return 0;
    }
    plan_step *s = ebb_compiler_step_new(c, EBB_STEP_ACCUM, "accumulate", node);
    if (!s)
        return -1;
    s->pub.phase = EBB_PHASE_BACKWARD;
    int si = ebb_compiler_step_index(c, s);
    ebb_tensor *m = ebb_compiler_meta_ref(c, *into);
    int out = m ? ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, si, -1) : -1;
    int in[2] = {*into, g};
    if (out < 0 || ebb_compiler_step_set_slots(c, &c->plan->steps[si], in, 2, &out, 1) != 0)
        return -1;
    *into = out;
    return 0;
}

/* ---- switches and top-k gates ------------------------------------------------------- *
 *
 * Walking backwards, a routed region is met at its last exit and left at its
 * route. At the last exit, zero accumulators are made for x's gradient (and
 * for a top-k gate the table's); then per branch, last first: a skip step
 * that jumps past the branch's backward when its forward did not run (the
 * rows were never written), the exit's backward (the branch's rows of the
 * gradient, weighted for top-k, the weights' gradient into the table's
 * column), the branch body's ordinary backward steps, and the enter's
 * backward (the rows added into x's gradient). At the route, x's gradient is
 * handed on, and for top-k the router's, through the renormalisation. */

static int new_zeros(ad *a, int like, const char *node) {
    compiler *c = a->c;
    plan_step *z = ebb_compiler_step_new(c, EBB_STEP_ZEROS, "zeros", node);
    if (!z)
        return -1;
    z->pub.phase = EBB_PHASE_BACKWARD;
    z->shape_of = like;
    int zi = ebb_compiler_step_index(c, z);
    ebb_tensor *m = ebb_compiler_meta_ref(c, like);
    int out = m ? ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, zi, -1) : -1;
    if (out < 0 || ebb_compiler_step_set_slots(c, &c->plan->steps[zi], NULL, 0, &out, 1) != 0)
        return -1;
    return out;
}

static plan_step *control(ad *a, ebb_step_kind kind, const char *name, const char *node,
                          const int *in, int n_in, const int *out, int n_out) {
    compiler *c = a->c;
    plan_step *st = ebb_compiler_step_new(c, kind, name, node);
    if (!st)
        return NULL;
    st->pub.phase = EBB_PHASE_BACKWARD;
    int si = ebb_compiler_step_index(c, st);
    if (ebb_compiler_step_set_slots(c, st, in, n_in, out, n_out) != 0)
        return NULL;
    return &c->plan->steps[si];
}

int ebb_ad_routed_backward(ad *a, int i) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    /* a copy: every step made below may move p->steps (its slot arrays and
     * node name are the step's own and stay put) */
    const plan_step step = p->steps[i], *s = &step;
    region *regions = a->regions;
    char *node = ebb_compiler_strdupf("%s", s->pub.node);
    if (!node)
        return ebb_compiler_oom(c);
    int rc = 0;
    if (s->pub.kind == EBB_STEP_EXIT) {
        int acc = s->pub.out[0], j = s->branch;
        const plan_step *enter = &p->steps[p->values[s->pub.in[1]].producer];
        int x = enter->pub.in[0], table = enter->pub.in[1];
        if (j == s->n_branches - 1 || a->depth == 0 || regions[a->depth - 1].table != table) {
            /* entering the region from its end */
            if (a->depth == MAX_REGIONS) {
                free(node);
                return ebb_compiler_fail(
                    c,
                    ebb_error_set(EBB_ERR_UNSUPPORTED,
                                  "node %s: routed regions nest more than 16 deep", s->pub.node));
            }
            region *rg = &regions[a->depth++];
            const plan_step *route = &p->steps[p->values[table].producer];
            *rg = (region){.route = p->values[table].producer, .x = x, .table = table,
                           .scores = route->pub.in[0], .gx = -1, .gtable = -1, .mode = s->mode};
            for (int b = 0; b < 256; b++)
                rg->skip[b] = -1;
            if (a->grad[acc] >= 0 && a->req[x])
                rg->gx = new_zeros(a, x, node);
            if (rc == 0 && a->grad[acc] >= 0 && s->mode == EBB_ROUTE_TOPK && a->req[table])
                rg->gtable = new_zeros(a, table, node);
            if ((a->req[x] && rg->gx < 0 && a->grad[acc] >= 0) ||
                (s->mode == EBB_ROUTE_TOPK && a->req[table] && a->grad[acc] >= 0 &&
                 rg->gtable < 0))
                rc = -1;
        }
        region *rg = &regions[a->depth - 1];
        int y = s->pub.in[0], rows = s->pub.in[1];
        if (rc == 0 && a->grad[acc] >= 0 && (a->req[y] || rg->gtable >= 0)) {
            plan_step *sk = control(a, EBB_STEP_SKIP, "skip", node, &rows, 1, NULL, 0);
            rc = sk ? 0 : -1;
            if (sk)
                rg->skip[j] = ebb_compiler_step_index(c, sk);
            int in[5] = {a->grad[acc], rows, table, y, rg->gtable};
            int gy = -1;
            if (rc == 0) {
                plan_step *eb = NULL;
                ebb_tensor *m = ebb_compiler_meta_ref(c, y);
                int bi = p->n_steps;
                gy = m ? ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, bi, -1) : -1;
                int out[2] = {gy, rg->gtable};
                int topk = rg->gtable >= 0;
                if (gy >= 0)
                    eb = control(a, EBB_STEP_EXIT_BACKWARD, "exit.backward", node, in,
                                 topk ? 5 : 3, out, topk ? 2 : 1);
                if (eb) {
                    eb->mode = topk ? EBB_ROUTE_TOPK : EBB_ROUTE_SWITCH;
                    eb->branch = j;
                }
                rc = eb ? 0 : -1;
            }
            if (rc == 0 && a->req[y])
                rc = ebb_ad_accumulate(a, &a->grad[y], gy, node);
        }
    } else if (s->pub.kind == EBB_STEP_ENTER && a->depth > 0) {
        region *rg = &regions[a->depth - 1];
        int j = s->branch, xr = s->pub.out[1], rows = s->pub.out[0];
        if (rg->gx >= 0 && a->grad[xr] >= 0) {
            int in[3] = {a->grad[xr], rows, rg->gx};
            rc = control(a, EBB_STEP_ENTER_BACKWARD, "enter.backward", node, in, 3, &rg->gx, 1)
                     ? 0
                     : -1;
        }
        if (rc == 0 && rg->skip[j] >= 0)
            p->steps[rg->skip[j]].pub.jump = p->n_steps;
    } else if (s->pub.kind == EBB_STEP_ROUTE && a->depth > 0) {
        region rg = regions[--a->depth];
        if (rg.gx >= 0)
            rc = ebb_ad_accumulate(a, &a->grad[rg.x], rg.gx, node);
        if (rc == 0 && rg.gtable >= 0 && a->req[rg.scores]) {
            ebb_tensor *m = ebb_compiler_meta_ref(c, rg.scores);
            int gs = m ? ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, p->n_steps, -1) : -1;
            int in[3] = {rg.scores, rg.table, rg.gtable};
            rc = gs >= 0 && control(a, EBB_STEP_ROUTE_BACKWARD, "route.backward", node, in, 3,
                                    &gs, 1)
                     ? 0
                     : -1;
            if (rc == 0)
                rc = ebb_ad_accumulate(a, &a->grad[rg.scores], gs, node);
        }
    }
    free(node);
    return rc;
}

/* ---- while/until loops -------------------------------------------------------------- *
 *
 * lower.c unrolls them for training: s0 := x, R := s0, then per iteration k
 * the test, y_k = body(s_k), R := y_k (so R ends as the last iteration's
 * output). Walking back, G holds the gradient of the state after the
 * iteration being walked: first R's, then, per iteration that ran, the
 * gradient its body gives its input. An iteration that did not run is
 * skipped (its body's output was never written), which leaves G as it was:
 * the result's gradient belongs to the last iteration that ran. The tests
 * are hard decisions, as a switch's, and get no gradient. */

/* G := g, or a new G slot viewing g. */
static int move_into(ad *a, int g, int *G, const char *node) {
    compiler *c = a->c;
    int out = *G;
    ebb_tensor *m = NULL;
    if (out < 0) {
        m = ebb_compiler_meta_ref(c, g);
        if (!m)
            return -1;
    }
    plan_step *al = ebb_compiler_step_new(c, EBB_STEP_ALIAS, "alias", node);
    if (!al) {
        ebb_tensor_free(m);
        return -1;
    }
    al->pub.phase = EBB_PHASE_BACKWARD;
    int ai = ebb_compiler_step_index(c, al);
    if (out < 0 && (out = ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, ai, g)) < 0)
        return -1;
    *G = out;
    return ebb_compiler_step_set_slots(c, &c->plan->steps[ai], &g, 1, &out, 1);
}

int ebb_ad_loop_backward(ad *a, int i) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    /* a copy, as in routed_backward: move_into and the skip step move p->steps */
    const plan_step step = p->steps[i], *s = &step;
    int loop = s->counter, result = s->pub.out[0], in = s->pub.in[0];
    loop_back *lb = a->n_loops ? &a->loops[a->n_loops - 1] : NULL;
    if (!lb || lb->loop != loop) {
        if (s->unrolled == 2) /* no iteration at all: R is x */
            return ebb_ad_accumulate(a, &a->grad[in], a->grad[result], s->pub.node);
        if (a->n_loops == MAX_LOOPS)
            return ebb_compiler_fail(c, ebb_error_set(EBB_ERR_UNSUPPORTED,
                                                      "node %s: loops nest more than %d deep",
                                                      s->pub.node, MAX_LOOPS));
        lb = &a->loops[a->n_loops++];
        *lb = (loop_back){.loop = loop, .g = -1, .skip = -1, .dead = a->grad[result] < 0};
    }
    char *node = ebb_compiler_strdupf("%s", s->pub.node);
    if (!node)
        return ebb_compiler_oom(c);
    int rc = 0;
    if (!lb->dead) {
        if (lb->g < 0) {
            rc = move_into(a, a->grad[result], &lb->g, node); /* the last iteration: G := R's */
        } else if (a->grad[in] < 0) {
            rc = ebb_compiler_fail(
                c, ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "node %s: the loop body's output does not depend on its "
                                 "state, so no gradient reaches earlier iterations",
                                 node));
        } else {
            /* close the iteration after this one: G := what its body gave its input */
            rc = move_into(a, a->grad[in], &lb->g, node);
            if (rc == 0)
                p->steps[lb->skip].pub.jump = p->n_steps;
        }
        if (rc == 0 && s->unrolled == 1) {
            plan_step *sk = ebb_compiler_step_new(c, EBB_STEP_SKIP, "skip", node);
            rc = sk && ebb_compiler_step_set_slots(c, sk, &in, 1, NULL, 0) == 0 ? 0 : -1;
            if (rc == 0) {
                sk->pub.phase = EBB_PHASE_BACKWARD;
                lb->skip = ebb_compiler_step_index(c, sk);
            }
        }
        /* the iteration's output (or, at the head, the loop's input) has G */
        if (rc == 0)
            a->grad[in] = lb->g;
    }
    if (s->unrolled == 2)
        a->n_loops--;
    free(node);
    return rc;
}

