/* The measure pass: what a step's kernels take, asked of the device itself.
 *
 * Some libraries choose their kernel where they run: cuDNN picks a
 * convolution's engine, and with it the engine's workspace, by heuristics of
 * its own version and GPU; scaled dot-product attention picks among fused
 * kernels and the composite path; on the CPU, oneDNN picks a convolution's
 * kernel (direct, im2col, inner product) by instruction set, shape and
 * thread count. An op marks such figures as a bound (ebb_op.workspace_is_bound
 * and workspace_cuda_is_bound, and their ebb_op_grad twins), and its
 * estimate can be far above what the kernel takes. This pass runs each such
 * step once on zeros of its shapes and takes what the call allocated beyond
 * what it returned as the step's scratch: on CUDA when the plan is compiled
 * for a CUDA device (ebb_compile_options.device), on the CPU when asked
 * (ebb_compile_options.measure_scratch). The plan still calls the step a
 * bound; its figure is now the kernel's own.
 *
 * A step inside a routed branch (a switch, a top-k gate) gets any number of
 * the batch's rows at run time, and a kernel's scratch need not grow with
 * them: oneDNN's AMX matrix products in bfloat16 take more for an odd count
 * than for the even one above it. Such a step is measured at every count
 * the branch can get (probe_rows()) and its figure is the most of them.
 *
 * libtorch keeps the engine cuDNN chose per shape for the process's life, so
 * a later call with those shapes takes what this one took. On CUDA each call
 * runs twice and the second is kept: the first makes the process's one-time
 * state (cuDNN's engine cache). The CPU's allocations repeat call by call.
 * Results are kept per (op, stage, attributes, shapes, dtypes, device and,
 * on the CPU, intra-op threads) for the process, so a budget's many
 * compiles, and a ResNet's repeated blocks, measure once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"
#include "ebb/memory.h"
#include "internal.h"

enum stage { STAGE_FORWARD, STAGE_TRAIN, STAGE_BACKWARD };
static const char *const STAGE_NAME[] = {"forward", "training forward", "backward"};

/* ---- the process's results ------------------------------------------------------ */

typedef struct measured {
    struct measured *next;
    int64_t bytes;
    char key[];
} measured;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static measured *cache;

static int cache_get(const char *key, int64_t *bytes) {
    int found = 0;
    pthread_mutex_lock(&cache_lock);
    for (const measured *m = cache; m && !found; m = m->next)
        if (strcmp(m->key, key) == 0) {
            *bytes = m->bytes;
            found = 1;
        }
    pthread_mutex_unlock(&cache_lock);
    return found;
}

static void cache_put(const char *key, int64_t bytes) {
    size_t n = strlen(key) + 1;
    measured *m = malloc(sizeof *m + n);
    if (!m)
        return; /* measured again next time */
    m->bytes = bytes;
    memcpy(m->key, key, n);
    pthread_mutex_lock(&cache_lock);
    m->next = cache;
    cache = m;
    pthread_mutex_unlock(&cache_lock);
}

/* ---- one step's call, on zeros ---------------------------------------------------- */

typedef struct call {
    const plan_step *s;  /* the forward step (the backward's fwd_step for a backward) */
    const plan_step *bw; /* the backward step, or NULL */
    enum stage stage;
    ebb_device dev;
    ebb_tensor *in[32], *params[EBB_MAX_PARAMS], *out, *saved[EBB_MAX_SAVED], *grad_out;
    ebb_tensor *gin[32], *gp[EBB_MAX_PARAMS];
    ebb_shape in_shapes[32];
    /* a step inside a routed branch: its operands' first dimension is the
     * branch's rows, compiled as `full_rows` (the whole batch); the call
     * runs with `rows` of them (0: as compiled) */
    int64_t rows, full_rows;
} call;

/* Appends a tensor's strides ("/s0,s1,..."), the layout a kernel sees. */
static size_t append_strides(char *buf, size_t n, size_t cap, const ebb_tensor *t) {
    int64_t st[EBB_MAX_DIMS];
    int nd = t ? ebb_tensor_strides(t, st, EBB_MAX_DIMS) : -1;
    for (int d = 0; d < nd && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%c%lld", d ? ',' : '/', (long long)st[d]);
    return n;
}

/* The key of a call: everything its kernels' choice can depend on, the
 * inputs' layouts included. */
static int call_key(const compiler *cc, const call *c, char *buf, size_t cap) {
    const ebb_plan *p = cc->plan;
    const plan_step *s = c->s;
    char dev[32];
    size_t n = (size_t)snprintf(buf, cap, "%s|%d|%s|%d|%u", s->op->name, (int)c->stage,
                                ebb_device_str(c->dev, dev, sizeof dev),
                                c->dev.type == EBB_DEVICE_CPU ? ebb_tensor_num_threads() : 0,
                                c->bw ? c->bw->skip_in : 0u);
    for (int i = 0; i < s->pub.n_in && n < cap; i++) {
        const ebb_plan_value *v = &p->values[s->pub.in[i]];
        char sh[96];
        n += (size_t)snprintf(buf + n, cap - n, "|%d%s", (int)v->dtype,
                              ebb_shape_str(&v->shape, sh, sizeof sh));
        if (cc->meta)
            n = append_strides(buf, n, cap, cc->meta[s->pub.in[i]]);
    }
    if (c->bw && !c->bw->seed && c->bw->pub.n_in > 0 && cc->meta && n < cap) {
        /* the incoming gradient's layout */
        n += (size_t)snprintf(buf + n, cap - n, "|g");
        n = append_strides(buf, n, cap, cc->meta[c->bw->pub.in[c->bw->pub.n_in - 1]]);
    }
    for (int j = 0; j < s->n_params && n < cap; j++) {
        char sh[96];
        n += (size_t)snprintf(buf + n, cap - n, "|p%d%s", (int)ebb_param_dtype_in(cc, s, j),
                              ebb_shape_str(&p->params[s->param[j]].spec.shape, sh, sizeof sh));
    }
    for (int a = 0; a < s->op->n_attrs && n < cap; a++) {
        const ebb_attr_value *v = &s->attrs[a];
        n += (size_t)snprintf(buf + n, cap - n, "|%d:%lld:%a:%s", v->set, (long long)v->i, v->f,
                              v->s ? v->s : "");
    }
    if (c->rows > 0 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "|rows %lld of %lld", (long long)c->rows,
                              (long long)c->full_rows);
    return n < cap ? 0 : -1;
}

static void call_release(call *c) {
    ebb_tensor_free(c->out);
    ebb_tensor_free(c->grad_out);
    c->out = c->grad_out = NULL;
    for (int k = 0; k < EBB_MAX_SAVED; k++) {
        ebb_tensor_free(c->saved[k]);
        c->saved[k] = NULL;
    }
    for (int i = 0; i < 32; i++) {
        ebb_tensor_free(c->gin[i]);
        c->gin[i] = NULL;
    }
    for (int j = 0; j < EBB_MAX_PARAMS; j++) {
        ebb_tensor_free(c->gp[j]);
        c->gp[j] = NULL;
    }
}

/* Bytes the allocator holds for the tensors in `made` that are new: not a
 * view of anything in `old` nor of an earlier one in `made`; on CUDA each
 * in its 512-byte blocks. */
static int64_t new_blocks(ebb_device dev, ebb_tensor *const *made, int n, ebb_tensor *const *old,
                          int n_old) {
    int64_t bytes = 0;
    for (int k = 0; k < n; k++) {
        if (!made[k])
            continue;
        int seen = 0;
        for (int m = 0; m < n_old && !seen; m++)
            seen = old[m] && ebb_tensor_same_storage(made[k], old[m]);
        for (int m = 0; m < k && !seen; m++)
            seen = made[m] && ebb_tensor_same_storage(made[k], made[m]);
        if (!seen) {
            int64_t b = (int64_t)ebb_tensor_nbytes(made[k]);
            bytes += dev.type == EBB_DEVICE_CUDA ? ebb_cuda_block(b) : b;
        }
    }
    return bytes;
}

/* Runs the forward the stage needs (the training forward before a
 * backward); with `measure`, its peak above the start less what it made. */
static ebb_status run_forward(call *c, int measure, int64_t *scratch) {
    const plan_step *s = c->s;
    const ebb_op_grad *g = s->op->grad;
    int train = c->stage != STAGE_FORWARD && g && g->forward_train;
    ebb_op_call oc = {.op = s->op, .attrs = s->attrs, .in = c->in, .n_in = s->pub.n_in,
                      .params = c->params, .n_params = s->n_params, .node = s->pub.node,
                      .seed = 1};
    int64_t base = ebb_memory_current(c->dev);
    ebb_memory_reset_peak(c->dev);
    ebb_status st = train ? g->forward_train(&oc, &c->out, c->saved) : s->op->forward(&oc, &c->out);
    if (st != EBB_OK)
        return st;
    if (!c->out)
        return ebb_error_set(EBB_ERR_RUNTIME, "op %s returned no tensor", s->op->name);
    if (measure) {
        ebb_memory_stats ms;
        if ((st = ebb_memory_stats_get(c->dev, &ms)) != EBB_OK)
            return st;
        ebb_tensor *made[1 + EBB_MAX_SAVED] = {c->out};
        for (int k = 0; k < EBB_MAX_SAVED; k++)
            made[1 + k] = c->saved[k];
        int64_t mine = new_blocks(c->dev, made, 1 + EBB_MAX_SAVED, c->in, s->pub.n_in);
        *scratch = ms.peak_bytes - base - mine;
    }
    return EBB_OK;
}

/* Zeros for slot v on the device, laid out as the dry run laid it out (a
 * view's strides: a kernel copies a non-contiguous operand), else
 * contiguous. */
static ebb_status zeros_for(const compiler *cc, int v, ebb_device dev, ebb_tensor **out) {
    const ebb_plan_value *pv = &cc->plan->values[v];
    const ebb_tensor *like = cc->meta ? cc->meta[v] : NULL;
    if (like) {
        ebb_shape ls = ebb_tensor_shape(like);
        if (ebb_shape_equal(&ls, &pv->shape) && ebb_tensor_dtype(like) == pv->dtype)
            return ebb_tensor_zeros_laid_out(out, like, dev);
    }
    return ebb_tensor_zeros(out, &pv->shape, pv->dtype, dev);
}

/* The shape slot v has in this call: a routed operand (its first dimension
 * the branch's compiled rows) with the call's rows. */
static ebb_shape shape_in_call(const compiler *cc, const call *c, int v) {
    ebb_shape sh = cc->plan->values[v].shape;
    if (c->rows > 0 && sh.ndim > 0 && sh.dim[0] == c->full_rows)
        sh.dim[0] = c->rows;
    return sh;
}

/* Zeros for slot v in this call: as zeros_for(), or contiguous with the
 * call's rows for a routed operand. */
static ebb_status zeros_in_call(const compiler *cc, const call *c, int v, ebb_tensor **out) {
    ebb_shape sh = shape_in_call(cc, c, v);
    if (ebb_shape_equal(&sh, &cc->plan->values[v].shape))
        return zeros_for(cc, v, c->dev, out);
    return ebb_tensor_zeros(out, &sh, cc->plan->values[v].dtype, c->dev);
}

static ebb_status run_backward(const compiler *cc, call *c, int64_t *scratch) {
    const plan_step *s = c->s, *b = c->bw;
    const ebb_op_grad *g = s->op->grad;
    ebb_shape os = ebb_tensor_shape(c->out);
    /* grad_out is the backward step's last input, unless it is the loss's seed */
    int gy = b->pub.n_in > 0 ? b->pub.in[b->pub.n_in - 1] : -1;
    ebb_status st = b->seed ? ebb_tensor_ones(&c->grad_out, &(ebb_shape){0, {0}},
                                              ebb_tensor_dtype(c->out), c->dev)
                    : gy >= 0 ? zeros_in_call(cc, c, gy, &c->grad_out)
                              : ebb_tensor_zeros(&c->grad_out, &os, ebb_tensor_dtype(c->out), c->dev);
    if (st != EBB_OK)
        return st;
    ebb_tensor *seen_in[32] = {0};
    ebb_dtype in_dtypes[32];
    for (int i = 0; i < s->pub.n_in; i++) {
        seen_in[i] = g->saves_inputs >> i & 1u ? c->in[i] : NULL;
        in_dtypes[i] = ebb_tensor_dtype(c->in[i]);
    }
    ebb_op_grad_call gc = {.op = s->op, .attrs = s->attrs, .in = seen_in, .n_in = s->pub.n_in,
                           .params = c->params, .n_params = s->n_params,
                           .out = g->saves_output ? c->out : NULL, .saved = c->saved,
                           .n_saved = g->n_saved, .grad_out = c->grad_out, .node = b->pub.node,
                           .in_shapes = c->in_shapes, .skip_input_grad = b->skip_in,
                           .in_dtypes = in_dtypes};
    int64_t base = ebb_memory_current(c->dev);
    ebb_memory_reset_peak(c->dev);
    if ((st = g->backward(&gc, c->gin, c->gp)) != EBB_OK)
        return st;
    ebb_memory_stats ms;
    if ((st = ebb_memory_stats_get(c->dev, &ms)) != EBB_OK)
        return st;
    ebb_tensor *old[32 + EBB_MAX_PARAMS + 2 + EBB_MAX_SAVED];
    int n_old = 0;
    for (int i = 0; i < s->pub.n_in; i++)
        old[n_old++] = c->in[i];
    for (int j = 0; j < s->n_params; j++)
        old[n_old++] = c->params[j];
    old[n_old++] = c->out;
    old[n_old++] = c->grad_out;
    for (int k = 0; k < EBB_MAX_SAVED; k++)
        old[n_old++] = c->saved[k];
    ebb_tensor *made[32 + EBB_MAX_PARAMS];
    int n_made = 0;
    for (int i = 0; i < s->pub.n_in; i++)
        made[n_made++] = c->gin[i];
    for (int j = 0; j < s->n_params; j++)
        made[n_made++] = c->gp[j];
    *scratch = ms.peak_bytes - base - new_blocks(c->dev, made, n_made, old, n_old);
    return EBB_OK;
}

/* One measurement: the inputs and parameters made, the call run (twice on
 * CUDA, the second's scratch kept). */
static ebb_status measure_call(const compiler *cc, call *c, int64_t *bytes) {
    const ebb_plan *p = cc->plan;
    const plan_step *s = c->s;
    ebb_status st = EBB_OK;
    for (int i = 0; i < s->pub.n_in && st == EBB_OK; i++) {
        c->in_shapes[i] = shape_in_call(cc, c, s->pub.in[i]);
        st = zeros_in_call(cc, c, s->pub.in[i], &c->in[i]);
    }
    for (int j = 0; j < s->n_params && st == EBB_OK; j++)
        st = ebb_tensor_zeros(&c->params[j], &p->params[s->param[j]].spec.shape,
                              ebb_param_dtype_in(cc, s, j), c->dev);
    int rounds = c->dev.type == EBB_DEVICE_CUDA ? 2 : 1;
    for (int round = 0; round < rounds && st == EBB_OK; round++) {
        if (c->stage == STAGE_BACKWARD) {
            st = run_forward(c, 0, NULL);
            if (st == EBB_OK)
                st = run_backward(cc, c, bytes);
        } else {
            st = run_forward(c, 1, bytes);
        }
        call_release(c);
    }
    for (int i = 0; i < 32; i++)
        ebb_tensor_free(c->in[i]);
    for (int j = 0; j < EBB_MAX_PARAMS; j++)
        ebb_tensor_free(c->params[j]);
    if (st == EBB_OK && *bytes < 0)
        *bytes = 0;
    return st;
}

/* Whether the step's figure on `dev` is its op's bound, and which call it makes. */
static int bounded(const ebb_plan *p, const plan_step *s, ebb_device dev, enum stage *stage) {
    int cuda = dev.type == EBB_DEVICE_CUDA;
    if (s->pub.kind == EBB_STEP_BACKWARD) {
        *stage = STAGE_BACKWARD;
        return s->low_kernel ||
               (cuda ? s->op->grad->workspace_cuda_is_bound : s->op->grad->workspace_is_bound);
    }
    if (s->pub.kind != EBB_STEP_OP || !s->op || s->pub.n_in == 0 || s->pub.in_place)
        return 0;
    *stage = s->train ? STAGE_TRAIN : STAGE_FORWARD;
    if (s->low_kernel)
        return 1;
    if (!cuda)
        return s->op->workspace_is_bound;
    return s->op->workspace_cuda_is_bound ||
           (p->training && s->op->grad && s->op->grad->workspace_cuda_is_bound);
}

/* The rows of the routed branch each step runs in (0: none): a forward
 * step between its branch's ENTER and EXIT, a backward one between the
 * branch's EXIT_BACKWARD and ENTER_BACKWARD (nested branches: the
 * innermost). A branch's rows are its operands' first dimension, compiled
 * as the whole batch. Returns NULL when out of memory. */
static int64_t *branch_rows(const ebb_plan *p) {
    int64_t *rows = calloc((size_t)p->n_steps + 1, sizeof *rows);
    int64_t stack[64];
    int depth = 0;
    for (int i = 0; rows && i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        switch (s->pub.kind) {
        case EBB_STEP_ENTER: /* (x, route) -> (rows, x_rows) */
        case EBB_STEP_EXIT_BACKWARD: { /* -> grad_y[, grad_route] */
            int v = s->pub.kind == EBB_STEP_ENTER ? 1 : 0;
            if (depth < 64)
                stack[depth] = s->pub.n_out > v && p->values[s->pub.out[v]].shape.ndim > 0
                                   ? p->values[s->pub.out[v]].shape.dim[0]
                                   : 0;
            depth++;
            break;
        }
        case EBB_STEP_EXIT:
        case EBB_STEP_ENTER_BACKWARD:
            depth -= depth > 0;
            break;
        default:
            rows[i] = depth > 0 && depth <= 64 ? stack[depth - 1] : 0;
        }
    }
    return rows;
}

/* The row counts a routed step is measured with besides the whole batch:
 * every count up to PROBE_ALL, and above it the PROBE_ALL highest (a
 * kernel's blocking repeats with a period far below it). */
enum { PROBE_ALL = 512 };

static int64_t probe_rows(int64_t full, int k) {
    if (full - 1 <= 2 * PROBE_ALL)
        return k + 1 < full ? k + 1 : 0;
    if (k < PROBE_ALL)
        return k + 1;
    return k < 2 * PROBE_ALL ? full - 2 * PROBE_ALL + k : 0;
}

/* One call's scratch: the process's earlier result for its key, or measured. */
static ebb_status scratch_of(compiler *c, call *k, int *prepared, int64_t *bytes) {
    char key[2048];
    *bytes = 0;
    int keyed = call_key(c, k, key, sizeof key) == 0;
    if (keyed && cache_get(key, bytes))
        return EBB_OK;
    ebb_status st = EBB_OK;
    if (k->dev.type == EBB_DEVICE_CUDA && !*prepared) {
        /* the libraries' per-stream state first, as ebb_run makes it */
        st = ebb_device_prepare(k->dev, NULL);
        *prepared = 1;
    }
    if (st == EBB_OK)
        st = measure_call(c, k, bytes);
    if (st == EBB_OK && keyed)
        cache_put(key, *bytes);
    return st;
}

int ebb_pass_measure(compiler *c, ebb_device dev) {
    ebb_plan *p = c->plan;
    int cuda = dev.type == EBB_DEVICE_CUDA, prepared = 0;
    int64_t *rows = branch_rows(p);
    if (!rows) {
        c->status = ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
        return -1;
    }
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        enum stage stage = STAGE_FORWARD;
        if (!bounded(p, s, dev, &stage))
            continue;
        call k = {.s = stage == STAGE_BACKWARD ? &p->steps[s->fwd_step] : s,
                  .bw = stage == STAGE_BACKWARD ? s : NULL, .stage = stage, .dev = dev,
                  .full_rows = rows[i]};
        int64_t bytes = 0;
        ebb_status st = scratch_of(c, &k, &prepared, &bytes);
        /* a routed branch gets any number of the rows, and a kernel's
         * scratch need not grow with them (oneDNN's AMX matrix products
         * take more for an odd count than for the even one above it): the
         * most over every count. A count the op refuses is not a run. */
        for (int r = 0; st == EBB_OK && rows[i] > 1 && (k.rows = probe_rows(rows[i], r)) > 0;
             r++) {
            int64_t b = 0;
            if (scratch_of(c, &k, &prepared, &b) == EBB_OK && b > bytes)
                bytes = b;
        }
        if (st != EBB_OK) {
            char d[32];
            free(rows);
            c->status = ebb_error_prefix("ebb_compile: measuring the scratch of step %d "
                                         "(%s %s, node %s) on %s",
                                         i, s->op->name, STAGE_NAME[stage], s->pub.node,
                                         ebb_device_str(dev, d, sizeof d));
            return -1;
        }
        /* under mixed precision the op ran on its parameters' low copies,
         * which the step makes and frees around it */
        bytes = stage == STAGE_BACKWARD ? ebb_backward_cast_scratch(c, s, bytes, cuda)
                                        : bytes + ebb_param_copy_bytes(c, s, cuda);
        if (cuda) {
            s->workspace_cuda = bytes;
            s->has_workspace_cuda = 1;
        } else {
            s->workspace = bytes;
        }
    }
    free(rows);
    return 0;
}
