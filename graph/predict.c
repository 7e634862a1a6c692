/* Predicted memory: plain counting over the step list.
 *
 * Walks the steps in listing order (branches taken, loop bodies once) and
 * counts storage per alias class: a view or an in-place output joins its
 * source's class, and a class's bytes leave when its last slot is freed. */
#include <stdlib.h>

#include "compile_internal.h"

/* Walks the steps in listing order (branches taken, loop bodies once) and
 * counts storage per alias class. With `no_frees`, nothing is released: the
 * keep_all figure. Writes per-step figures unless no_frees. */
int64_t ebb_pass_predict(compiler *c, int no_frees, int64_t granule, int *peak_step) {
    ebb_plan *p = c->plan;
    int nv = p->n_values;
    int *cls = malloc((size_t)(nv ? nv : 1) * sizeof *cls);      /* slot -> class (-1) */
    int64_t *bytes = calloc((size_t)(nv ? nv : 1), sizeof *bytes); /* class -> bytes */
    int *refs = calloc((size_t)(nv ? nv : 1), sizeof *refs);       /* class -> slots */
    if (!cls || !bytes || !refs) {
        free(cls);
        free(bytes);
        free(refs);
        compiler_oom(c);
        return -1;
    }
    for (int v = 0; v < nv; v++)
        cls[v] = -1;
    int64_t live = 0, peak = 0;
    int at = 0;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        for (int k = 0; k < s->pub.n_out; k++) {
            int v = s->pub.out[k];
            const ebb_plan_value *val = &p->values[v];
            int new_cls;
            if (s->pub.kind == EBB_STEP_EXIT && cls[v] >= 0) {
                new_cls = cls[v]; /* scattered into in place */
            } else if (val->alias_of >= 0 && s->pub.kind != EBB_STEP_EXIT) {
                new_cls = cls[val->alias_of];
                if (s->pub.kind == EBB_STEP_ALIAS)
                    new_cls = cls[s->pub.in[0]];
            } else if (s->pub.kind == EBB_STEP_ROUTE && k == 1) {
                new_cls = -1; /* the empty accumulator */
            } else if (val->nbytes > 0) {
                new_cls = v;
                bytes[v] = granule ? (val->nbytes + granule - 1) / granule * granule : val->nbytes;
            } else {
                new_cls = -1;
            }
            if (new_cls != cls[v]) {
                if (cls[v] >= 0 && --refs[cls[v]] == 0)
                    live -= bytes[cls[v]];
                if (new_cls >= 0 && refs[new_cls]++ == 0)
                    live += bytes[new_cls];
                cls[v] = new_cls;
            }
        }
        int64_t ws = s->workspace;
        if (granule && ws)
            ws = (ws + granule - 1) / granule * granule;
        if (live + ws > peak) {
            peak = live + ws;
            at = i;
        }
        int record = !no_frees && !granule;
        if (record)
            s->pub.peak_bytes = live + ws;
        for (int k = 0; !no_frees && k < s->pub.n_frees; k++) {
            int v = s->pub.frees[k];
            if (cls[v] >= 0 && --refs[cls[v]] == 0)
                live -= bytes[cls[v]];
            cls[v] = -1;
        }
        if (record)
            s->pub.live_bytes = live;
    }
    free(cls);
    free(bytes);
    free(refs);
    if (peak_step)
        *peak_step = at;
    return peak;
}
