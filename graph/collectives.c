/* The collective steps of a data-parallel training plan, one rank's: the
 * all-reduce that averages a bucket of gradients, ZeRO-1's reduce-scatter,
 * their overlapped start and wait, and ZeRO-1's owners and broadcasts; each
 * with its scratch as ebb/dist.h's calls allocate it. When a bucket
 * travels is graph/updates.c's decision. */
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"

/* data parallel: the open bucket's collective step of `kind`, `op`, at
 * node "bucket<k>" (slots not set yet), its gradients marked averaged; *in
 * receives their slots (a new array of n_bucket). The step's index, or -1. */
static int bucket_step(ad *a, ebb_step_kind kind, const char *op, int **in) {
    compiler *c = a->c;
    int n = a->n_bucket;
    char *name = ebb_compiler_strdupf("bucket%d", c->plan->n_buckets);
    *in = malloc((size_t)n * sizeof **in);
    if (!*in || !name) {
        free(*in);
        free(name);
        *in = NULL;
        return ebb_compiler_oom(c);
    }
    for (int k = 0; k < n; k++) {
        (*in)[k] = a->pgrad[a->bucket[k]];
        a->reduced[a->bucket[k]] = 1;
    }
    plan_step *s = ebb_compiler_step_new(c, kind, op, name);
    free(name);
    if (!s) {
        free(*in);
        *in = NULL;
        return -1;
    }
    s->pub.phase = EBB_PHASE_UPDATE;
    return ebb_compiler_step_index(c, s);
}

/* ZeRO-1: a bucket's step is a reduce-scatter, which leaves each rank the
 * means of its own gradients only (the unscale and clip steps after the
 * backward read those, and agree with the other ranks by a collective).
 * *owners receives the open bucket's owners, a new array (NULL without
 * ZeRO-1); -1 when out of memory. */
static int bucket_owners(ad *a, int **owners) {
    const ebb_plan *p = a->c->plan;
    *owners = NULL;
    if (!p->owner)
        return 0;
    *owners = malloc(((size_t)a->n_bucket + 1) * sizeof **owners);
    if (!*owners)
        return ebb_compiler_oom(a->c);
    for (int k = 0; k < a->n_bucket; k++)
        (*owners)[k] = p->owner[a->bucket[k]];
    return 0;
}

/* libtorch's wrapping of an all-reduce's divisor, a Scalar: 8 bytes, and a
 * copy in the dtype unless that is float64. */
static int64_t divisor_bytes(ebb_dtype dt) {
    return 8 + (dt == EBB_FLOAT64 ? 0 : (int64_t)ebb_dtype_size(dt));
}

/* Of the gradients in[0..n) of dtype `dt` whose owners are owners[0..n)
 * (NULL: every one), those rank `to` owns: how many, and their bytes. A
 * gradient that shares another's tensor (0 bytes of its own) or holds
 * nothing travels not at all (ebb/dist.h), and does not count. */
static int owned_by(const ebb_plan *p, const int *in, const int *owners, int n, int to,
                    ebb_dtype dt, int64_t *bytes) {
    int count = 0;
    *bytes = 0;
    for (int k = 0; k < n; k++)
        if (p->values[in[k]].dtype == dt && p->values[in[k]].nbytes > 0 &&
            (!owners || owners[k] == to)) {
            count++;
            *bytes += p->values[in[k]].nbytes;
        }
    return count;
}

/* Whether in[k] is the first of in[0..n) in its dtype: the collectives run
 * a dtype at a time, and the scratch is counted at its first. */
static int first_of_dtype(const ebb_plan *p, const int *in, int k) {
    for (int j = 0; j < k; j++)
        if (p->values[in[j]].dtype == p->values[in[k]].dtype)
            return 0;
    return 1;
}

/* ZeRO-1's reduce-scatter, rounds `first` .. data_parallel - 1 of the
 * bucket in[0..n) with owners[0..n), gradients of dtype `dt`: the largest
 * outgoing buffer a round lays end to end (0 when each sends one gradient
 * or none), and in *cuda its CUDA block. */
static int64_t largest_round(const ebb_plan *p, const int *in, const int *owners, int n,
                             ebb_dtype dt, int first, int64_t *cuda) {
    int64_t most = 0, bytes;
    for (int round = first; round < p->train_options.parallel.world; round++)
        if (owned_by(p, in, owners, n,
                     (p->train_options.parallel.rank + round) % p->train_options.parallel.world, dt,
                     &bytes) > 1)
            most = bytes > most ? bytes : most;
    *cuda = most ? ebb_cuda_block(most) : 0;
    return most;
}

/* ZeRO-1's reduce-scatter of the bucket whose gradients are in[0..n) and
 * whose owners are owners[0..n): its scratch as
 * ebb_dist_reduce_scatter_mean_() allocates it, per dtype, one after
 * another: the buffer this rank's own gradients arrive in, for all the
 * rounds, and beside it the larger of a round's outgoing buffer (the
 * gradients rank + k owns, when more than one) and the divisor's wrapping
 * (when this rank owns any). */
static void scatter_scratch(ebb_plan *p, plan_step *s, const int *in, const int *owners, int n) {
    int64_t cpu = 0, cuda = 0, own, out_cuda;
    for (int k = 0; k < n; k++) {
        ebb_dtype dt = p->values[in[k]].dtype;
        if (!first_of_dtype(p, in, k))
            continue;
        int64_t wrap = owned_by(p, in, owners, n, p->train_options.parallel.rank, dt, &own)
                           ? divisor_bytes(dt)
                           : 0;
        int64_t out = largest_round(p, in, owners, n, dt, 1, &out_cuda);
        out = out > wrap ? out : wrap;
        int64_t here = own + out, here_cuda = (own ? ebb_cuda_block(own) : 0) + out_cuda;
        cpu = here > cpu ? here : cpu;
        cuda = here_cuda > cuda ? here_cuda : cuda;
    }
    s->workspace = cpu;
    s->workspace_cuda = cuda;
    s->has_workspace_cuda = 1;
}

/* An all-reduce of the gradients in[0..n): its scratch, per dtype, one
 * after another: the buffer (when more than one gradient shares it), and
 * the divisor's wrapping. */
static void allreduce_scratch(ebb_plan *p, plan_step *s, const int *in, int n) {
    int64_t cpu = 0, cuda = 0, bytes;
    for (int k = 0; k < n; k++) {
        ebb_dtype dt = p->values[in[k]].dtype;
        if (!first_of_dtype(p, in, k))
            continue;
        int laid = owned_by(p, in, NULL, n, 0, dt, &bytes) > 1;
        int64_t here = (laid ? bytes : 0) + divisor_bytes(dt);
        int64_t here_cuda = laid ? ebb_cuda_block(bytes) : 0;
        cpu = here > cpu ? here : cpu;
        cuda = here_cuda > cuda ? here_cuda : cuda;
    }
    s->workspace = cpu;
    s->workspace_cuda = cuda;
    s->has_workspace_cuda = 1;
}

/* data parallel: one step averaging the open bucket's gradients over the
 * ranks, laid end to end in a buffer (one collective per dtype; a lone
 * gradient of its dtype needs none). Under ZeRO-1 a reduce-scatter. */
int ebb_ad_allreduce(ad *a) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int n = a->n_bucket, *in = NULL, *owners = NULL;
    if (n == 0)
        return 0;
    if (bucket_owners(a, &owners) != 0)
        return -1;
    int scatter = owners != NULL;
    int si = scatter ? bucket_step(a, EBB_STEP_REDUCE_SCATTER, "reduce_scatter", &in)
                     : bucket_step(a, EBB_STEP_ALLREDUCE, "allreduce", &in);
    if (si < 0 || ebb_compiler_step_set_slots(c, &p->steps[si], in, n, NULL, 0) != 0) {
        free(in);
        free(owners);
        return -1;
    }
    plan_step *s = &p->steps[si];
    if (scatter) {
        s->owners = owners;
        scatter_scratch(p, s, in, owners, n);
    } else {
        allreduce_scratch(p, s, in, n);
    }
    free(in);
    p->n_buckets++;
    a->n_bucket = 0;
    a->bucket_bytes = 0;
    return 0;
}

/* ZeRO-1: each trained parameter's owner, as torch's ZeroRedundancyOptimizer
 * partitions them: largest first, each to the rank owning the fewest elements
 * so far (the lowest such rank on a tie). Every rank computes the same. */
int ebb_ad_assign_owners(compiler *c, int world) {
    ebb_plan *p = c->plan;
    int n = p->n_params;
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    int64_t *load = calloc((size_t)world, sizeof *load);
    p->owner = malloc(((size_t)n + 1) * sizeof *p->owner);
    if (!order || !load || !p->owner) {
        free(order);
        free(load);
        return ebb_compiler_oom(c);
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        p->owner[i] = -1;
        if (p->trained[i])
            order[m++] = i;
    }
    /* by bytes, descending, then by index: a stable order on every rank */
    for (int k = 1; k < m; k++)
        for (int j = k; j > 0; j--) {
            int64_t a = ebb_shape_numel(&p->params[order[j - 1]].spec.shape);
            int64_t b = ebb_shape_numel(&p->params[order[j]].spec.shape);
            if (a >= b)
                break;
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int k = 0; k < m; k++) {
        int best = 0;
        for (int r = 1; r < world; r++)
            if (load[r] < load[best])
                best = r;
        p->owner[order[k]] = best;
        load[best] += ebb_shape_numel(&p->params[order[k]].spec.shape);
    }
    free(order);
    free(load);
    return 0;
}

/* ZeRO-1, after the updates: per rank, one step that broadcasts the
 * parameters it owns (and so updated) to every other rank. Its scratch is
 * the buffer ebb_dist_broadcast_() lays them end to end in, per dtype (a
 * lone tensor of its dtype travels as it is). */
int ebb_ad_broadcasts(ad *a) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    for (int r = 0; r < p->train_options.parallel.world; r++) {
        /* trained parameters are all of the plan's dtype */
        int count = 0;
        int64_t bytes = 0;
        for (int i = 0; i < p->n_params; i++)
            if (p->trained[i] && p->owner[i] == r) {
                count++;
                bytes += ebb_shape_numel(&p->params[i].spec.shape) *
                         (int64_t)ebb_dtype_size(p->dtype);
            }
        if (count == 0)
            continue;
        char *name = ebb_compiler_strdupf("shard%d", r);
        if (!name)
            return ebb_compiler_oom(c);
        plan_step *s = ebb_compiler_step_new(c, EBB_STEP_BROADCAST, "broadcast", name);
        free(name);
        if (!s)
            return -1;
        s->pub.phase = EBB_PHASE_UPDATE;
        s->pub.param = r;
        if (count > p->max_in) /* the executor gathers the parameters in its input scratch */
            p->max_in = count;
        s->workspace = count > 1 ? bytes : 0;
        s->workspace_cuda = count > 1 ? ebb_cuda_block(bytes) : 0;
        s->has_workspace_cuda = 1;
    }
    return 0;
}

/* A flat value of `numel` elements of `dt` that step si writes: its slot,
 * or -1. */
static int buffer_value(compiler *c, int si, int64_t numel, ebb_dtype dt) {
    ebb_shape flat = {1, {numel}};
    ebb_tensor *m = ebb_compiler_meta_new(c, &flat, dt);
    return m ? ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, si, -1) : -1;
}

/* parallel.overlap: the open bucket's all-reduce started, its updates left
 * for when it is waited for (emit_wait). The step writes the buffer the
 * gradients travel in, a value of the plan until the wait. Under ZeRO-1 a
 * reduce-scatter's first round: its values are the buffer that round sends
 * (when it lays more than one gradient end to end) and the one this rank's
 * own arrive in (when it owns any). */
int ebb_ad_allreduce_start(ad *a) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int n = a->n_bucket, *in = NULL, out[2] = {-1, -1}, n_out = 0, *owners = NULL;
    if (bucket_owners(a, &owners) != 0)
        return -1;
    int scatter = owners != NULL;
    int si = scatter ? bucket_step(a, EBB_STEP_REDUCE_SCATTER_START, "reduce_scatter.start", &in)
                     : bucket_step(a, EBB_STEP_ALLREDUCE_START, "allreduce.start", &in);
    if (si < 0) {
        free(owners);
        return -1;
    }
    for (int k = 0; k < n; k++)
        a->pending[k] = a->bucket[k];
    ebb_dtype dt = p->values[in[0]].dtype;
    int64_t e = (int64_t)ebb_dtype_size(dt), sent, own, all;
    if (scatter) {
        if (owned_by(p, in, owners, n,
                     (p->train_options.parallel.rank + 1) % p->train_options.parallel.world, dt,
                     &sent) > 1)
            out[n_out++] = buffer_value(c, si, sent / e, dt);
        if (owned_by(p, in, owners, n, p->train_options.parallel.rank, dt, &own) > 0)
            out[n_out++] = buffer_value(c, si, own / e, dt);
    } else if (owned_by(p, in, NULL, n, 0, dt, &all) > 1) {
        out[n_out++] = buffer_value(c, si, all / e, dt);
    }
    int ok = 1;
    for (int k = 0; k < n_out; k++)
        ok &= out[k] >= 0;
    if (!ok || ebb_compiler_step_set_slots(c, &p->steps[si], in, n, out, n_out) != 0) {
        free(in);
        free(owners);
        return -1;
    }
    free(in);
    plan_step *s = &p->steps[si];
    s->owners = owners;
    s->has_workspace_cuda = 1;
    a->n_pending = n;
    a->pending_step = si;
    memcpy(a->pending_buffers, out, sizeof out);
    a->n_pending_buffers = n_out;
    a->pending_index = p->n_buckets++;
    a->n_bucket = 0;
    a->bucket_bytes = 0;
    return 0;
}

/* parallel.overlap: the wait for the bucket under way (the means into its
 * gradients, in place); a->pending keeps its parameters. Its scratch: libtorch's wrapping of the
 * divisor, as the all-reduce step's; a reduce-scatter's runs its other
 * rounds here too, each round's outgoing buffer in turn (when it lays
 * more than one gradient end to end), and divides only when this rank owns
 * any. */
int ebb_ad_allreduce_wait(ad *a) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int n = a->n_pending, nb = a->n_pending_buffers;
    if (n == 0)
        return 0;
    int *in = malloc(((size_t)n + 2) * sizeof *in), k = 0;
    char *name = ebb_compiler_strdupf("bucket%d", a->pending_index);
    if (!in || !name) {
        free(in);
        free(name);
        return ebb_compiler_oom(c);
    }
    for (int j = 0; j < nb; j++)
        in[k++] = a->pending_buffers[j];
    for (int j = 0; j < n; j++)
        in[k++] = a->pgrad[a->pending[j]];
    const int *owners = p->steps[a->pending_step].owners;
    plan_step *s = owners ? ebb_compiler_step_new(c, EBB_STEP_REDUCE_SCATTER_WAIT,
                                                  "reduce_scatter.wait", name)
                          : ebb_compiler_step_new(c, EBB_STEP_ALLREDUCE_WAIT, "allreduce.wait", name);
    free(name);
    if (!s || ebb_compiler_step_set_slots(c, s, in, k, NULL, 0) != 0) {
        free(in);
        return -1;
    }
    /* (the start step may have moved with the steps array) */
    owners = p->steps[a->pending_step].owners;
    const int *grads = in + nb;
    ebb_dtype dt = p->values[grads[0]].dtype;
    int64_t bytes;
    s->pub.phase = EBB_PHASE_UPDATE;
    s->workspace = divisor_bytes(dt);
    if (owners) { /* the rounds after the first, then the mean of its own */
        int64_t wrap = owned_by(p, grads, owners, n, p->train_options.parallel.rank, dt, &bytes)
                           ? divisor_bytes(dt)
                           : 0;
        int64_t out = largest_round(p, grads, owners, n, dt, 2, &s->workspace_cuda);
        s->workspace = out > wrap ? out : wrap;
    }
    free(in);
    s->has_workspace_cuda = 1;
    a->n_pending = 0;
    return 0;
}

/* parallel.overlap: whether the open bucket can travel while the backward
 * goes on (the started collectives take one dtype). */
int ebb_ad_can_overlap(const ad *a) {
    const ebb_plan *p = a->c->plan;
    if (!a->t->parallel.overlap)
        return 0;
    for (int k = 1; k < a->n_bucket; k++)
        if (p->values[a->pgrad[a->bucket[k]]].dtype != p->values[a->pgrad[a->bucket[0]]].dtype)
            return 0;
    return 1;
}
