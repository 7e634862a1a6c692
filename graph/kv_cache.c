/* Generation's key/value cache (ebb_compile_options.kv_cache), a pass
 * after lowering. Each causal scaled_dot_product_attention step becomes a
 * _cached_attention step (ops/attention.c) that reads two more inputs, the
 * layer's keys and values for every position so far: EBB_VALUE_STATE
 * values, [B, Hkv, C, D] for a cache of C positions, which no step makes
 * and none frees. The run binds them to the caller's ebb_kv_cache
 * (src/kv_cache.c), so a plan for the prompt and a plan for each next token
 * fill and read the same tensors.
 *
 * Grouped-query attention's keys and values reach the attention through
 * repeat_kv. The cache holds them before the repeat, heads / kv_heads times
 * smaller: the attention step reads repeat_kv's input and repeats itself
 * where it must, and the repeat_kv steps, read by nothing else, leave the
 * plan.
 *
 * A step that runs a varying number of times per run (inside a loop or a
 * branch) cannot own one cache position per run, and multi_head_attention
 * makes its keys inside the op: both are refused, naming the node. */
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

static int refuse(compiler *c, const plan_step *s, const char *why) {
    c->status = ebb_error_set(EBB_ERR_UNSUPPORTED, "node %s (%s): %s; a key/value cache "
                              "(kv_cache) cannot serve it",
                              s->pub.node, s->pub.op, why);
    return -1;
}

/* Whether a jump can skip or repeat step i: a forward jump over it (a
 * branch that may not run) or a backward one around it (a loop). */
static int conditional(const ebb_plan *p, int i) {
    for (int j = 0; j < p->n_steps; j++) {
        int t = p->steps[j].pub.jump;
        if (t >= 0 && ((j < i && i < t) || (t <= i && i <= j)))
            return 1;
    }
    return 0;
}

static int readers(const ebb_plan *p, int v) {
    int n = 0;
    for (int i = 0; i < p->n_steps; i++)
        for (int k = 0; k < p->steps[i].pub.n_in; k++)
            n += p->steps[i].pub.in[k] == v;
    for (int i = 0; i < p->n_outputs; i++)
        n += p->outputs[i] == v;
    return n;
}

/* The repeat_kv step over heads (dim 1 of 4) that made slot v and that
 * nothing else reads, or NULL. */
static plan_step *repeat_of(ebb_plan *p, int v) {
    int at = p->values[v].producer;
    if (at < 0 || p->steps[at].pub.kind != EBB_STEP_OP ||
        strcmp(p->steps[at].op->name, "repeat_kv") != 0 || readers(p, v) != 1)
        return NULL;
    plan_step *r = &p->steps[at];
    int64_t dim = r->attrs[ebb_op_attr_index(r->op, "dim")].i;
    return p->values[v].shape.ndim == 4 && (dim == 1 || dim == -3) ? r : NULL;
}

/* One [B, Hkv, C, D] state value shaped after `like` [B, Hkv, t, D]. */
static int state_value(compiler *c, int like, int64_t positions) {
    ebb_shape sh = c->plan->values[like].shape;
    sh.dim[2] = positions;
    ebb_tensor *m = ebb_compiler_meta_new(c, &sh, c->plan->values[like].dtype);
    return m ? ebb_compiler_value_new(c, m, EBB_VALUE_STATE, -1, -1) : -1;
}

/* Step s (a causal attention) reads q and the keys and values k, v
 * (repeated `repeats` times) and the cache, through `op`. */
static int to_cached(compiler *c, plan_step *s, const ebb_op *op, int k, int v, int64_t repeats) {
    ebb_plan *p = c->plan;
    attr_block *a = calloc(1, sizeof *a);
    if (!a)
        return ebb_compiler_oom(c);
    a->v[0] = (ebb_attr_value){.type = EBB_ATTR_INT, .set = 1, .i = repeats};
    a->next = c->attrs;
    c->attrs = a;
    int kc = state_value(c, k, p->kv_cache);
    int vc = kc >= 0 ? state_value(c, v, p->kv_cache) : -1;
    if (vc < 0)
        return -1;
    int in[5] = {s->pub.in[0], k, v, kc, vc};
    ebb_shape shapes[5];
    for (int i = 0; i < 5; i++)
        shapes[i] = p->values[in[i]].shape;
    int out = s->pub.out[0];
    free((int *)s->pub.in);
    free((int *)s->pub.out);
    if (ebb_compiler_step_set_slots(c, s, in, 5, &out, 1) != 0)
        return -1;
    ebb_dtype dt = p->values[in[0]].dtype;
    s->op = op;
    s->pub.op = op->name;
    s->attrs = a->v;
    s->workspace = op->workspace(a->v, shapes, 5, dt);
    s->workspace_cuda = op->workspace_cuda(a->v, shapes, 5, dt);
    s->has_workspace_cuda = 1;
    /* a next token's attention reads as many keys as the cache holds by
     * then: its scratch is counted at a full cache */
    p->peak_is_bound |= shapes[0].dim[2] == 1;
    return 0;
}

int ebb_pass_kv_cache(compiler *c, const ebb_compile_options *opts) {
    ebb_plan *p = c->plan;
    if (opts->train) {
        c->status = ebb_error_set(EBB_ERR_ARG, "ebb_compile: a key/value cache (kv_cache) "
                                  "serves generation; a training plan cannot have one");
        return -1;
    }
    p->kv_cache = opts->kv_cache;
    const ebb_op *sdpa = ebb_op_find("scaled_dot_product_attention");
    const ebb_op *cached = ebb_op_find("_cached_attention");
    unsigned char *gone = calloc((size_t)p->n_steps + 1, 1);
    if (!gone)
        return ebb_compiler_oom(c);
    int n_cached = 0, rc = 0;
    for (int i = 0; rc == 0 && i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        if (s->pub.kind != EBB_STEP_OP)
            continue;
        if (strcmp(s->op->name, "multi_head_attention") == 0) {
            rc = refuse(c, s, "multi_head_attention makes its keys and values inside the op; "
                              "write the attention from linear, reshape and "
                              "scaled_dot_product_attention (specs/gpt.yaml)");
            break;
        }
        if (s->op != sdpa)
            continue;
        if (!s->attrs[ebb_op_attr_index(sdpa, "causal")].i)
            rc = refuse(c, s, "attention without `causal: true` reads later positions");
        else if (s->pub.n_in > 3)
            rc = refuse(c, s, "attention with a mask input");
        else if (p->values[s->pub.in[1]].shape.ndim != 4)
            rc = refuse(c, s, "keys that are not [B, H, T, D]");
        else if (conditional(p, i))
            rc = refuse(c, s, "attention inside a loop or a branch runs a varying number of "
                              "times a run");
        if (rc)
            break;
        int k = s->pub.in[1], v = s->pub.in[2];
        int64_t repeats = 1;
        plan_step *rk = repeat_of(p, k), *rv = repeat_of(p, v);
        int64_t nk = rk ? rk->attrs[ebb_op_attr_index(rk->op, "repeats")].i : 0;
        int64_t nv = rv ? rv->attrs[ebb_op_attr_index(rv->op, "repeats")].i : 0;
        if (rk && rv && nk == nv) {
            gone[ebb_compiler_step_index(c, rk)] = gone[ebb_compiler_step_index(c, rv)] = 1;
            k = rk->pub.in[0], v = rv->pub.in[0], repeats = nk;
        }
        rc = to_cached(c, s, cached, k, v, repeats);
        n_cached++;
    }
    if (rc == 0 && n_cached == 0)
        rc = ebb_compiler_fail(c, ebb_error_set(EBB_ERR_UNSUPPORTED,
                                                "ebb_compile: graph %s has no causal "
                                                "scaled_dot_product_attention for a key/value "
                                                "cache (kv_cache) to serve",
                                                p->name));
    if (rc == 0)
        rc = ebb_compiler_steps_remove(c, gone);
    free(gone);
    return rc;
}
