/* The autodiff pass's state, shared by its three files, one level each:
 *
 *   autodiff.c     the gradients: the loss, a backward step per op step,
 *                  the walk back from the loss;
 *   backflow.c     the walk through routed regions (switches, top-k gates)
 *                  and unrolled loops, and the sums where a value's
 *                  gradient arrives twice;
 *   updates.c      what the gradients become: update steps, data
 *                  parallel's buckets (when one travels), clipping by the
 *                  norm, loss scaling's unscale;
 *   collectives.c  the collective steps themselves and their scratch:
 *                  all-reduce, reduce-scatter (ZeRO-1), their overlapped
 *                  start and wait, ZeRO-1's owners and broadcasts.
 *
 * Each calls only the files below it and compile_internal.h. */
#ifndef EBB_AUTODIFF_INTERNAL_H
#define EBB_AUTODIFF_INTERNAL_H

#include "compile_internal.h"

#define SEED (-2) /* the loss's own gradient: 1, supplied by the executor */

/* A routed region being walked back through (backflow.c). */
#define MAX_REGIONS 16
typedef struct region {
    int route, x, table, scores; /* forward slots and step */
    int gx, gtable;              /* gradient accumulators, -1 when not wanted */
    int mode;
    int skip[256];               /* per branch: its skip step, -1 */
} region;

/* An unrolled while/until loop being walked back through (backflow.c). */
#define MAX_LOOPS 16
typedef struct loop_back {
    int loop;    /* the loop's id (plan_step.counter) */
    int g;       /* G's slot; -1 before the first iteration is met */
    int skip;    /* the skip step of the iteration being walked, -1 */
    int dead;    /* no gradient reaches the result */
} loop_back;

typedef struct ad {
    compiler *c;
    const ebb_train_options *t;
    unsigned char *req; /* per forward slot: depends on a trained parameter */
    int *grad;          /* per forward slot: its gradient's slot, SEED or -1 */
    int n_grad;
    int *pgrad; /* per parameter */
    struct region *regions; /* routed regions being walked back through, innermost last */
    int depth;
    struct loop_back *loops; /* unrolled while/until loops being walked back, innermost last */
    int n_loops;
    int *copy;      /* per forward slot under c->drop: its recomputed copy, or -1 */
    int n_copy;
    int *first_use; /* per parameter: the first forward step that reads it */
    unsigned char *updated; /* per parameter: its update step is emitted */
    unsigned char *reduced; /* per parameter (data parallel): its gradient is averaged */
    unsigned char *summed;  /* per parameter (accumulate): its GRAD_SUM step is emitted */
    /* data parallel: final gradients not averaged yet (the open bucket) */
    int *bucket, n_bucket;
    int64_t bucket_bytes;
    /* data parallel: the buckets travel during the backward, but every
     * update waits for its end (clipping by the norm, loss scaling,
     * updates_after_backward) */
    int hold_updates;
    /* parallel.overlap: the bucket under way, its parameters, its buffer's
     * slot (-1: a lone gradient travels as it is) and its number */
    int *pending, n_pending, pending_index;
    int pending_step;       /* the step that started it */
    int pending_buffers[2]; /* the buffers it wrote, values until the wait */
    int n_pending_buffers;
} ad;

/* ---- backflow.c ---------------------------------------------------------------- */

/* Adds gradient g into *into (-1: g becomes it) with an ACCUM step at
 * `node`. */
int ebb_ad_accumulate(ad *a, int *into, int g, const char *node);
/* The backward of forward step i, an EXIT, ENTER or ROUTE step. */
int ebb_ad_routed_backward(ad *a, int i);
/* The backward of forward step i, an unrolled loop's result (ALIAS). */
int ebb_ad_loop_backward(ad *a, int i);

/* ---- updates.c ---------------------------------------------------------------- */

/* After the backward step of forward step fi: the updates (or data
 * parallel's bucket) of the parameters it gave their final gradient. */
int ebb_ad_updates_after_step(ad *a, int fi);
/* After the whole backward: the last bucket, unscale, clip, the updates
 * not emitted yet, ZeRO-1's broadcasts. */
int ebb_ad_after_backward(ad *a);

/* ---- collectives.c -------------------------------------------------------------- */

/* ZeRO-1: each trained parameter's owning rank, into c->plan->owner. */
int ebb_ad_assign_owners(compiler *c, int world);
/* The open bucket averaged over the ranks (reduce-scatter under ZeRO-1);
 * the bucket is empty after. */
int ebb_ad_allreduce(ad *a);
/* parallel.overlap: the open bucket's collective started (a->pending). */
int ebb_ad_allreduce_start(ad *a);
/* parallel.overlap: the wait for the started one. */
int ebb_ad_allreduce_wait(ad *a);
/* parallel.overlap: whether the open bucket can travel during the backward. */
int ebb_ad_can_overlap(const ad *a);
/* ZeRO-1: per rank, the broadcast of the parameters it updated. */
int ebb_ad_broadcasts(ad *a);

#endif
