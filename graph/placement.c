/* Update placement: where each update of a training step runs.
 *
 * By default an update follows the backward step that makes its gradient
 * final, so the gradient dies there instead of living to the backward's
 * end. That is not always the lower peak: the update's scratch (Adam's is
 * the parameter's size) lands beside every activation the rest of the
 * backward still needs, and a large layer's update early in the backward
 * can make the step's peak. Moved to the backward's end, the update runs
 * once the activations are gone, and its gradient lives longer instead.
 *
 * The plan knows both costs, so the compiler tries: while the step's peak
 * (the larger of the CPU and CUDA counts, as a budget compares) is at an
 * update step, it compiles the step again with that update deferred, and
 * keeps the change when the peak falls; it also tries deferring every
 * update at once (torch.optim's placement). The first plan is kept when
 * nothing is lower. Each try is one more compile of the step, at most one
 * per trained parameter. */
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

/* The figure placements are compared by. */
static int64_t objective(const ebb_plan *p) { return p->budget_peak_bytes; }

/* A compile with `defer`; *out NULL when it failed (the error is kept for
 * the caller only when it is not a plain refusal of this placement). */
static ebb_status try_placement(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts,
                                const unsigned char *defer) {
    return ebb_pipeline(out, g, opts, &(ebb_choices){.defer = defer});
}

/* The parameter whose update makes the plan's CPU or CUDA peak, or -1. */
static int update_at_peak(const ebb_plan *p, const unsigned char *defer) {
    /* the step with the most bytes during it, CUDA's count when it is the larger */
    int at = p->peak_step;
    if (p->cuda_peak_bytes > p->peak_bytes) {
        int64_t most = -1;
        for (int i = 0; i < p->n_steps; i++)
            if (p->steps[i].pub.peak_bytes > most) {
                most = p->steps[i].pub.peak_bytes;
                at = i;
            }
    }
    if (at < 0 || at >= p->n_steps) return -1;
    const plan_step *s = &p->steps[at];
    if (s->pub.kind != EBB_STEP_UPDATE || defer[s->pub.param]) return -1;
    /* an update already after the last backward step gains nothing by moving */
    for (int i = at + 1; i < p->n_steps; i++)
        if (p->steps[i].pub.phase == EBB_PHASE_BACKWARD) return s->pub.param;
    return -1;
}

ebb_status ebb_place_updates(ebb_plan **plan, const ebb_graph *g, const ebb_compile_options *opts) {
    ebb_plan *best = *plan;
    int n = best->n_params;
    unsigned char *defer = calloc((size_t)n + 1, 1), *all = calloc((size_t)n + 1, 1);
    if (!defer || !all) {
        free(defer);
        free(all);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    }
    ebb_status st = EBB_OK;
    int64_t eager = objective(best);
    /* every update at the end, as torch.optim places them */
    for (int i = 0; i < n; i++)
        all[i] = best->trained[i];
    ebb_plan *q = NULL;
    if ((st = try_placement(&q, g, opts, all)) == EBB_OK && objective(q) < objective(best)) {
        ebb_plan_free(best);
        best = q;
        memcpy(defer, all, (size_t)n);
    } else {
        ebb_plan_free(q);
    }
    /* one update at a time, while an update makes the peak */
    for (int tries = 0; st == EBB_OK && tries < n; tries++) {
        int i = update_at_peak(best, defer);
        if (i < 0) break;
        defer[i] = 1;
        q = NULL;
        if ((st = try_placement(&q, g, opts, defer)) != EBB_OK) break;
        if (objective(q) >= objective(best)) {
            ebb_plan_free(q);
            defer[i] = 0;
            break;
        }
        ebb_plan_free(best);
        best = q;
    }
    if (st != EBB_OK) {
        /* the first plan stands: a placement that fails to compile is not chosen */
        ebb_error_clear();
        st = EBB_OK;
    }
    int n_def = 0;
    for (int i = 0; i < n; i++)
        n_def += defer[i];
    if (n_def) {
        best->deferred = defer;
        best->n_deferred = n_def;
        defer = NULL;
    }
    best->eager_peak_bytes = eager;
    free(defer);
    free(all);
    *plan = best;
    return st;
}
