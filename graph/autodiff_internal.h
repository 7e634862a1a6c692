/* The autodiff pass's state, shared by its three files, one level each:
 *
 *   autodiff.c     the gradients: a backward step per op step, the routed
 *                  regions and unrolled loops walked back, the loss;
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
    /* data parallel: final gradients not averaged yet (the open bucket) */
    int *bucket, n_bucket;
    int64_t bucket_bytes;
    /* data parallel: the buckets travel during the backward, but every
     * update waits for its end (clipping by the norm, loss scaling,
     * updates_after_backward) */
    int hold_updates;
    /* allreduce_overlap: the bucket under way, its parameters, its buffer's
     * slot (-1: a lone gradient travels as it is) and its number */
    int *pending, n_pending, pending_index;
    int pending_step;       /* the step that started it */
    int pending_buffers[2]; /* the buffers it wrote, values until the wait */
    int n_pending_buffers;
} ad;

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
/* allreduce_overlap: the open bucket's collective started (a->pending). */
int ebb_ad_allreduce_start(ad *a);
/* allreduce_overlap: the wait for the started one. */
int ebb_ad_allreduce_wait(ad *a);
/* allreduce_overlap: whether the open bucket can travel during the backward. */
int ebb_ad_can_overlap(const ad *a);
/* ZeRO-1: per rank, the broadcast of the parameters it updated. */
int ebb_ad_broadcasts(ad *a);

#endif
