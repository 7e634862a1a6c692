/* One compile: the passes run in order for one set of choices the
 * searches made (values recomputed, updates deferred, low copies kept):
 *   1. lowering (lower.c): the nested flow becomes a flat list of steps over
 *      value slots, every value shaped by a dry run; for generation, causal
 *      attention then reads and writes a key/value cache (kv_cache.c);
 *   2. autodiff (autodiff.c, updates.c, collectives.c), for training: the
 *      loss, the backward, the updates and the collectives;
 *   3. measurement (measure.c) of the steps whose scratch an op can only
 *      bound, on the plan's device and for mixed precision on the CPU;
 *   4. liveness (liveness.c): the free list of every control-flow edge, then
 *      in-place marking of elementwise steps whose input dies there;
 *   5. memory and compute (predict.c): live bytes after every step, the
 *      peak, the FLOPs.
 * The searches (remat.c, placement.c, copies.c) call this with their
 * choices, and ebb_compile() (compile.c) calls them. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

ebb_status ebb_pipeline(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts,
                        const ebb_choices *ch) {
    static const ebb_choices none = {0};
    if (!ch)
        ch = &none;
    ebb_status st = EBB_OK;
    *out = NULL;
    int low_plan = opts->precision == EBB_PRECISION_BF16 || opts->precision == EBB_PRECISION_FP16;
    compiler c = {.meta_device = {EBB_DEVICE_META, 0}, .training = opts->train != NULL,
                  /* a node's own precision needs the casts a mixed plan has */
                  .autocast = low_plan || ebb_graph_has_precision(g), .full = !low_plan,
                  .low = opts->precision == EBB_PRECISION_FP16 ? EBB_FLOAT16 : EBB_BFLOAT16,
                  .drop = ch->drop, .n_drop = ch->drop ? ch->n_drop : 0, .defer = ch->defer,
                  .keep = ch->keep, .n_keep = ch->keep ? ch->n_keep : 0};
    ebb_plan *p = calloc(1, sizeof *p);
    if (!p)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    static atomic_uint_fast64_t next_plan_id = 1;
    c.plan = p;
    p->id = atomic_fetch_add(&next_plan_id, 1);
    p->graph = (ebb_graph *)g;
    atomic_fetch_add(&p->graph->refs, 1);
    p->keep_all = opts->keep_all;
    p->dtype = opts->dtype;
    p->peak_step = -1;
    p->name = malloc(strlen(g->name) + 1);
    p->inputs = calloc((size_t)g->inputs.n + 1, sizeof *p->inputs);
    p->n_outputs = 1 + g->outputs.n;
    p->outputs = calloc((size_t)p->n_outputs, sizeof *p->outputs);
    p->output_names = calloc((size_t)p->n_outputs, sizeof *p->output_names);
    if (!p->name || !p->inputs || !p->outputs || !p->output_names) {
        ebb_compiler_oom(&c);
        goto fail;
    }
    strcpy(p->name, g->name);

    if (ebb_pass_lower(&c, g, opts) != 0)
        goto fail;
    if (opts->kv_cache > 0 && ebb_pass_kv_cache(&c, opts) != 0)
        goto fail;
    if (opts->train && ebb_pass_autodiff(&c, g, opts) != 0)
        goto fail;
    if (opts->device.type == EBB_DEVICE_CUDA && ebb_pass_measure(&c, opts->device) != 0)
        goto fail;
    /* a matrix product in a low dtype has no CPU figure but its own: mixed
     * precision measures on the CPU whatever measure_scratch says */
    int low_kernels = 0;
    for (int i = 0; i < p->n_steps; i++)
        low_kernels |= p->steps[i].low_kernel;
    if ((opts->measure_scratch || low_plan || low_kernels) &&
        ebb_pass_measure(&c, ebb_device_cpu()) != 0)
        goto fail;
    /* routing and while/until loops depend on values; some kernels' scratch
     * depends on the machine */
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        int bound_scratch = s->low_kernel ||
                            (s->pub.kind == EBB_STEP_BACKWARD ? s->op->grad->workspace_is_bound
                                                              : s->op && s->op->workspace_is_bound);
        p->peak_is_bound |= s->pub.kind == EBB_STEP_ROUTE || s->pub.kind == EBB_STEP_JUMP_IF ||
                            (bound_scratch && s->workspace > 0);
        int bound_cuda = s->pub.kind == EBB_STEP_BACKWARD ? s->op->grad->workspace_cuda_is_bound
                         : s->pub.kind == EBB_STEP_OP
                             ? s->op->workspace_cuda_is_bound ||
                                   (p->training && s->op->grad &&
                                    s->op->grad->workspace_cuda_is_bound)
                             : 0;
        bound_cuda |= s->low_kernel;
        p->cuda_peak_is_bound |= bound_cuda && s->has_workspace_cuda && s->workspace_cuda > 0;
    }
    p->cuda_peak_is_bound |= p->peak_is_bound;
    if (ebb_pass_liveness(&c) != 0)
        goto fail;
    /* keep_all is the figure without liveness, so without in-place steps too */
    p->keep_all_peak_bytes = ebb_pass_predict(&c, 1, 0, NULL);
    ebb_pass_in_place(&c);
    p->peak_bytes = ebb_pass_predict(&c, 0, 0, &p->peak_step);
    /* CUDA's caching allocator counts blocks rounded up to 512 bytes */
    p->cuda_peak_bytes = ebb_pass_predict(&c, p->keep_all, 512, NULL);
    if (p->peak_bytes < 0 || p->keep_all_peak_bytes < 0 || p->cuda_peak_bytes < 0)
        goto fail;
    p->budget_peak_bytes = p->cuda_peak_bytes > p->peak_bytes ? p->cuda_peak_bytes : p->peak_bytes;
    p->no_recompute_peak_bytes = p->budget_peak_bytes;
    /* loss scaling: a step whose gradients overflow skips its updates, so
     * where the peak is among them, that step stays below it; so do an
     * accumulation's micro-batches before the last */
    for (int i = 0, after = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        if (after && (s->pub.peak_bytes >= p->peak_bytes || s->cuda_peak_bytes >= p->cuda_peak_bytes)) {
            p->peak_is_bound = p->cuda_peak_is_bound = 1;
            break;
        }
        after |= s->pub.kind == EBB_STEP_UNSCALE || s->pub.kind == EBB_STEP_GRAD_SUMS;
    }
    for (int i = 0; i < p->n_steps; i++) {
        int64_t fl = ebb_step_flops(p, &p->steps[i]);
        *(p->steps[i].pub.recompute ? &p->recompute_flops : &p->flops) += fl;
    }
    p->attrs = c.attrs;
    for (int v = 0; v < p->n_values; v++)
        ebb_tensor_free(c.meta[v]);
    free(c.meta);
    *out = p;
    return EBB_OK;

fail:
    st = c.status != EBB_OK ? c.status : (ebb_errcode() != EBB_OK ? ebb_errcode() : EBB_ERR_BUILD);
    p->attrs = c.attrs;
    for (int v = 0; v < p->n_values; v++)
        ebb_tensor_free(c.meta[v]);
    free(c.meta);
    ebb_plan_free(p);
    return st;
}
