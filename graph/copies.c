/* Low copies kept: where a mixed-precision backward gets its weights.
 *
 * A matrix product in bf16 or fp16 computes on a low copy of its float32
 * weight, and its backward needs the same copy again. The forward step can
 * keep it, so it lives from that step to the backward step as a value of
 * the plan, or the backward can cast it again, which costs a cast's time
 * and no bytes in between. Which is cheaper depends on what else is live
 * then: early layers' copies would live through the whole step, and the
 * step's peak is usually at the forward's end or the backward's start.
 *
 * The compiled plan knows every step's bytes, so the choice is counted,
 * not guessed. A copy of C bytes kept by forward step f for backward step b
 * adds C to every step after f up to b (at f it replaces the same bytes of
 * scratch, and at b it replaces the copy b would make). Largest first, each
 * step's copies are kept while every step they add to stays at or below
 * the plan's peak, on the CPU count and CUDA's 512-byte blocks alike. The
 * plan is then compiled again with those steps keeping theirs, and taken
 * only when neither peak rose (ebb_train_options.low_weight_copies can ask
 * for all or none instead). A memory budget recomputes rather than keeps,
 * so under one every copy is cast again. */
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

typedef struct candidate {
    int fwd, bwd;         /* the forward step and its backward */
    int n;                /* its low copies */
    int64_t bytes, cuda;  /* their bytes; in CUDA's blocks */
} candidate;

static int by_bytes(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->fwd - y->fwd;
}

/* Every backward step whose forward casts parameters, with what keeping
 * its copies costs; *n_copies counts the copies. */
static int candidates(const ebb_plan *p, candidate *out, int *n_copies) {
    int n = 0;
    *n_copies = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *b = &p->steps[i];
        if (b->pub.kind != EBB_STEP_BACKWARD || !b->param_cast)
            continue;
        const plan_step *f = &p->steps[b->fwd_step];
        uint32_t m = ebb_low_copy_params(p, f);
        if (!m || f->pub.recompute || f->pub.kind != EBB_STEP_OP)
            continue;
        candidate c = {.fwd = b->fwd_step, .bwd = i};
        for (int j = 0; j < f->n_params; j++) {
            if (!(m >> j & 1))
                continue;
            int64_t bytes = ebb_shape_numel(&p->params[f->param[j]].spec.shape) *
                            (int64_t)ebb_dtype_size(f->param_dtype);
            c.n++;
            c.bytes += bytes;
            c.cuda += ebb_cuda_block(bytes);
        }
        *n_copies += c.n;
        out[n++] = c;
    }
    return n;
}

/* Marks in keep[] the forward steps whose copies fit under the peak. */
static void choose(const ebb_plan *p, candidate *cand, int n, unsigned char *keep) {
    int64_t *cpu = malloc((size_t)p->n_steps * sizeof *cpu);
    int64_t *cuda = malloc((size_t)p->n_steps * sizeof *cuda);
    if (!cpu || !cuda) {
        free(cpu);
        free(cuda);
        return; /* nothing kept: every copy is cast again, as before */
    }
    for (int i = 0; i < p->n_steps; i++) {
        cpu[i] = p->steps[i].pub.peak_bytes;
        cuda[i] = p->steps[i].cuda_peak_bytes;
    }
    qsort(cand, (size_t)n, sizeof *cand, by_bytes);
    for (int k = 0; k < n; k++) {
        const candidate *c = &cand[k];
        int fits = 1;
        for (int i = c->fwd + 1; i <= c->bwd && fits; i++)
            fits = cpu[i] + c->bytes <= p->peak_bytes && cuda[i] + c->cuda <= p->cuda_peak_bytes;
        if (!fits)
            continue;
        keep[c->fwd] = 1;
        for (int i = c->fwd + 1; i <= c->bwd; i++) {
            cpu[i] += c->bytes;
            cuda[i] += c->cuda;
        }
    }
    free(cpu);
    free(cuda);
}

static void count_kept(ebb_plan *q, int n_copies) {
    q->n_kept_copies = 0;
    q->kept_copy_bytes = 0;
    for (int i = 0; i < q->n_steps; i++) {
        const plan_step *s = &q->steps[i];
        if (s->pub.kind != EBB_STEP_OP || !s->keep_copy)
            continue;
        for (int k = s->pub.n_out - ebb_step_kept_copies(s); k < s->pub.n_out; k++) {
            q->n_kept_copies++;
            q->kept_copy_bytes += q->values[s->pub.out[k]].nbytes;
        }
    }
    q->n_recast_copies = n_copies - q->n_kept_copies;
}

ebb_status ebb_keep_low_copies(ebb_plan **plan, const ebb_graph *g, const ebb_compile_options *opts) {
    ebb_plan *p = *plan;
    if (!opts->train || !p->training)
        return EBB_OK;
    ebb_low_copies how = opts->train->low_weight_copies;
    candidate *cand = malloc(((size_t)p->n_steps + 1) * sizeof *cand);
    unsigned char *keep = calloc((size_t)p->n_steps + 1, 1);
    if (!cand || !keep) {
        free(cand);
        free(keep);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    }
    int n_copies = 0, n = candidates(p, cand, &n_copies);
    p->n_recast_copies = n_copies;
    ebb_status st = EBB_OK;
    if (n > 0 && how != EBB_LOW_COPIES_RECAST && opts->memory_budget == 0) {
        if (how == EBB_LOW_COPIES_KEEP)
            for (int k = 0; k < n; k++)
                keep[cand[k].fwd] = 1;
        else
            choose(p, cand, n, keep);
        int any = 0;
        for (int i = 0; i < p->n_steps && !any; i++)
            any = keep[i];
        ebb_plan *q = NULL;
        if (any)
            st = ebb_pipeline(&q, g, opts,
                              &(ebb_choices){.defer = p->deferred, .keep = keep, .n_keep = p->n_steps});
        int better = q && (how == EBB_LOW_COPIES_KEEP ||
                           (q->peak_bytes <= p->peak_bytes && q->cuda_peak_bytes <= p->cuda_peak_bytes));
        if (st != EBB_OK && how == EBB_LOW_COPIES_AUTO) {
            /* the plan without kept copies stands */
            ebb_error_clear();
            st = EBB_OK;
        }
        if (better) {
            /* what update placement chose and measured stays with the plan */
            q->deferred = p->deferred;
            q->n_deferred = p->n_deferred;
            q->eager_peak_bytes = p->eager_peak_bytes;
            p->deferred = NULL;
            count_kept(q, n_copies);
            ebb_plan_free(p);
            *plan = q;
        } else {
            ebb_plan_free(q);
        }
    }
    (*plan)->train_options.low_weight_copies = how;
    free(cand);
    free(keep);
    return st;
}
