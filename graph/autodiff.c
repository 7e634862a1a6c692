/* The autodiff pass: a training compile turns the lowered forward into one
 * training step, still a flat list of steps over value slots.
 *
 *   1. targets become inputs after the graph's, and the forward's outputs
 *      become ordinary intermediates;
 *   2. op steps whose rule has a training forward (dropout's mask, pooling's
 *      indices, the norms' batch statistics) write its extras as further
 *      outputs, so the backward reads them like any value;
 *   3. the loss step reads the final stream and the targets;
 *   4. walking the forward backwards, each op step that a gradient reaches
 *      gets a BACKWARD step reading what its rule saves and the output's
 *      gradient, writing the gradients of its inputs and parameters. Where a
 *      value's gradient arrives a second time an ACCUM step adds it in (in
 *      place when the first dies there: liveness.c decides);
 *   5. one UPDATE step per trained parameter, right after the backward step
 *      that makes its gradient final, so the gradient dies there; or all of
 *      them after the whole backward (updates_after_backward), so a failure
 *      anywhere before leaves the model as it was (grads_only: the gradients
 *      are outputs instead).
 *
 * Under a memory budget, forward values graph/remat.c chose not to keep are
 * recomputed just before the backward step that first reads them (below).
 *
 * Liveness, in-place marking and the byte count then run over the joint
 * step unchanged. Every backward step is dry-run on the meta device like a
 * forward step, which shapes the gradients and says which of them are views
 * of another value (a reshape's gradient is a view of its output's). */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"

/* ---- names -------------------------------------------------------------------- */

/* "fc1.weight" is named by "fc1.weight" and by "fc1". */
static int names_param(const char *name, const char *full) {
    size_t n = strlen(name);
    return strncmp(full, name, n) == 0 && (full[n] == '\0' || full[n] == '.');
}

static int choose_trained(compiler *c, const ebb_train_options *t) {
    ebb_plan *p = c->plan;
    p->trained = calloc((size_t)p->n_params + 1, 1);
    if (!p->trained)
        return ebb_compiler_oom(c);
    if (t->n_trained > 0 && !t->trained)
        return ebb_compiler_fail(c, ebb_error_set(EBB_ERR_ARG,
                                                  "ebb_compile: ebb_train_options.trained is NULL "
                                                  "with n_trained %d",
                                                  t->n_trained));
    for (int i = 0; i < p->n_params; i++)
        p->trained[i] = !p->params[i].spec.buffer && !p->params[i].spec.counter && !t->trained;
    for (int k = 0; k < t->n_trained; k++) {
        const char *name = t->trained[k];
        int hits = 0;
        for (int i = 0; name && i < p->n_params; i++)
            if (names_param(name, p->params[i].full_name)) {
                if (p->params[i].spec.buffer || p->params[i].spec.counter)
                    return ebb_compiler_fail(
                        c, ebb_error_set(EBB_ERR_ARG,
                                         "ebb_compile: '%s' is a buffer, not a trained "
                                         "parameter",
                                         p->params[i].full_name));
                p->trained[i] = 1;
                hits++;
            }
        if (!hits)
            return ebb_compiler_fail(
                c, ebb_error_set(EBB_ERR_ARG,
                                 "ebb_compile: ebb_train_options.trained names '%s', "
                                 "which is no parameter or node of plan %s",
                                 name ? name : "(null)", p->name));
    }
    return 0;
}

/* ebb_train_options.no_decay: the trained parameters that update without
 * weight decay. */
static int choose_no_decay(compiler *c, const ebb_train_options *t) {
    ebb_plan *p = c->plan;
    if (t->n_no_decay <= 0)
        return 0;
    if (!t->no_decay)
        return ebb_compiler_fail(c, ebb_error_set(EBB_ERR_ARG,
                                                  "ebb_compile: ebb_train_options.no_decay is "
                                                  "NULL with n_no_decay %d",
                                                  t->n_no_decay));
    p->no_decay = calloc((size_t)p->n_params + 1, 1);
    if (!p->no_decay)
        return ebb_compiler_oom(c);
    for (int k = 0; k < t->n_no_decay; k++) {
        int hits = 0;
        for (int i = 0; t->no_decay[k] && i < p->n_params; i++)
            if (p->trained[i] && fnmatch(t->no_decay[k], p->params[i].full_name, 0) == 0) {
                p->no_decay[i] = 1;
                hits++;
            }
        if (!hits)
            return ebb_compiler_fail(
                c, ebb_error_set(EBB_ERR_ARG,
                                 "--no-decay '%s' matches no trained parameter of plan %s",
                                 t->no_decay[k] ? t->no_decay[k] : "(null)", p->name));
    }
    return 0;
}

/* ---- targets and the loss ------------------------------------------------------ */

static int bind_targets(compiler *c, const ebb_graph *g, const ebb_train_options *t) {
    ebb_plan *p = c->plan;
    int n = t->n_target_shapes;
    if (n > 15)
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG, "ebb_compile: %d targets; a loss takes at most 15", n));
    if (n < 1 || !t->target_shapes)
        return ebb_compiler_fail(
            c,
            ebb_error_set(EBB_ERR_ARG, "ebb_compile: a training compile needs the targets' shapes "
                                       "(ebb_train_options.target_shapes)"));
    if (g->targets.n && n != g->targets.n)
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: graph '%s' declares %d target(s), %d shape(s) "
                             "given",
                             g->name, g->targets.n, n));
    int *inputs = realloc(p->inputs, (size_t)(p->n_inputs + n) * sizeof *inputs);
    if (!inputs)
        return ebb_compiler_oom(c);
    p->inputs = inputs;
    for (int i = 0; i < n; i++) {
        const ebb_shape *s = &t->target_shapes[i];
        const char *name = g->targets.n ? g->targets.items[i] : n == 1 ? "y" : NULL;
        char buf[96];
        int ok = s->ndim >= 0 && s->ndim <= EBB_MAX_DIMS;
        for (int d = 0; ok && d < s->ndim; d++)
            ok = s->dim[d] >= 0 && s->dim[d] <= ((int64_t)1 << 40);
        if (!ok)
            return ebb_compiler_fail(c, ebb_error_set(EBB_ERR_SHAPE,
                                                      "ebb_compile: target %d has shape %s", i,
                                                      ebb_shape_str(s, buf, sizeof buf)));
        ebb_tensor *m =
            ebb_compiler_meta_new(c, s, t->target_dtypes ? t->target_dtypes[i] : p->dtype);
        if (!m)
            return -1;
        int slot = ebb_compiler_value_new(c, m, EBB_VALUE_INPUT, -1, -1);
        if (slot < 0)
            return -1;
        p->values[slot].name = name ? name : "y";
        p->inputs[p->n_inputs++] = slot;
        p->n_targets++;
    }
    return 0;
}

/* The loss op and its attributes: the options', else the graph's. Values
 * resolved from the options' text live in the plan's attribute list. */
static int choose_loss(compiler *c, const ebb_graph *g, const ebb_train_options *t,
                       const ebb_op **op, const ebb_attr_value **attrs) {
    if (!t->loss) {
        if (!g->loss)
            return ebb_compiler_fail(
                c, ebb_error_set(EBB_ERR_ARG,
                                 "ebb_compile: graph '%s' declares no loss; give one "
                                 "(ebb_loss(), a spec's `loss:`, or "
                                 "ebb_train_options.loss)",
                                 g->name));
        *op = g->loss;
        *attrs = g->loss_attrs;
        return 0;
    }
    *op = ebb_op_find(t->loss);
    if (!*op)
        return ebb_compiler_fail(c, ebb_error_set(EBB_ERR_ARG, "ebb_compile: unknown loss op '%s'", t->loss));
    char *owned = NULL;
    ebb_attr_value v[EBB_MAX_ATTRS];
    ebb_status st = ebb_attrs_resolve(*op, t->loss_attrs, v, &owned);
    if (st != EBB_OK)
        return ebb_compiler_fail(c, st);
    size_t text = owned ? strlen(owned) + 1 : 0;
    attr_block *a = calloc(1, sizeof *a + EBB_MAX_ATTRS * sizeof(ebb_attr_value) + text);
    if (!a) {
        free(owned);
        return ebb_compiler_oom(c);
    }
    char *copy = (char *)(a->v + EBB_MAX_ATTRS + 1);
    if (owned)
        memcpy(copy, owned, text);
    for (int i = 0; i < (*op)->n_attrs; i++) {
        a->v[i] = v[i];
        if (v[i].type == EBB_ATTR_STRING && v[i].s && owned && v[i].s >= owned &&
            v[i].s < owned + text)
            a->v[i].s = copy + (v[i].s - owned);
    }
    free(owned);
    a->next = c->attrs;
    c->attrs = a;
    *attrs = a->v;
    return 0;
}

/* ---- dry runs ----------------------------------------------------------------- */

/* Step s's parameter j as the op sees it: its low copy's dtype under mixed
 * precision (plan_step.param_cast). */
static ebb_tensor *meta_param(compiler *c, const plan_step *s, int j) {
    const plan_param *pp = &c->plan->params[s->param[j]];
    return ebb_compiler_meta_new(c, &pp->spec.shape, ebb_param_dtype_in(c, s, j));
}

/* What the CPU stand-ins of one dry run may take, as lower.c allows its
 * last-resort dry run: planning never allocates a graph's activations. */
#define STANDIN_LIMIT ((int64_t)64 << 20)

/* CPU zeros shaped like each non-NULL meta tensor; NULL stays NULL. Fails
 * (EBB_ERR_UNSUPPORTED) past *budget bytes, which it lowers. */
static ebb_status standins(ebb_tensor *const *meta, int n, ebb_tensor **cpu, int64_t *budget) {
    for (int i = 0; i < n; i++) {
        cpu[i] = NULL;
        if (!meta[i])
            continue;
        int64_t b = (int64_t)ebb_tensor_nbytes(meta[i]);
        if (b > *budget)
            return ebb_error_set(EBB_ERR_UNSUPPORTED, "its CPU stand-ins would exceed %lld MiB",
                                 (long long)(STANDIN_LIMIT >> 20));
        *budget -= b;
        ebb_shape sh = ebb_tensor_shape(meta[i]);
        ebb_status st = ebb_tensor_zeros(&cpu[i], &sh, ebb_tensor_dtype(meta[i]),
                                         ebb_device_cpu());
        if (st != EBB_OK)
            return st;
    }
    return EBB_OK;
}

static void free_all(ebb_tensor **ts, int n) {
    for (int i = 0; i < n; i++) {
        ebb_tensor_free(ts[i]);
        ts[i] = NULL;
    }
}

/* A meta tensor shaped like t, replacing t. */
static ebb_status to_meta(compiler *c, ebb_tensor **t) {
    if (!*t)
        return EBB_OK;
    ebb_shape sh = ebb_tensor_shape(*t);
    ebb_tensor *m = NULL;
    ebb_status st = ebb_tensor_empty(&m, &sh, ebb_tensor_dtype(*t), c->meta_device);
    ebb_tensor_free(*t);
    *t = m;
    return st;
}

/* A training forward on meta tensors, else on CPU stand-ins (ATen has no
 * meta kernel for some training forwards, native_batch_norm's among them). */
static int shares_input(const ebb_tensor *t, ebb_tensor *const *in, int n) {
    for (int i = 0; t && i < n; i++)
        if (in[i] && ebb_tensor_same_storage(t, in[i]))
            return i;
    return -1;
}

/* *alias: the input the output shares storage with, or -1 (dropout's
 * training output is fresh where its inference output is its input). */
/* Ops whose rule failed on the meta device once: it fails again, and
 * raising is slow (libtorch's errors collect a backtrace). */
static int seen_failing(const ebb_op *const *list, int n, const ebb_op *op) {
    for (int i = 0; i < n; i++)
        if (list[i] == op)
            return 1;
    return 0;
}

static ebb_status dry_forward_train(compiler *c, const ebb_op_call *call, ebb_tensor **out,
                                    ebb_tensor **saved, int *alias) {
    const ebb_op_grad *r = call->op->grad;
    int known_no_meta = seen_failing(c->no_meta_train, c->n_no_meta_train, call->op);
    ebb_status st = EBB_OK;
    if (!known_no_meta) {
        st = r->forward_train(call, out, saved);
        *alias = st == EBB_OK ? shares_input(*out, call->in, call->n_in) : -1;
        if (st == EBB_OK || st == EBB_ERR_SHAPE || st == EBB_ERR_ARG || st == EBB_ERR_NOMEM)
            return st;
        if (c->n_no_meta_train < (int)(sizeof c->no_meta_train / sizeof c->no_meta_train[0]))
            c->no_meta_train[c->n_no_meta_train++] = call->op;
        ebb_tensor_free(*out);
        *out = NULL;
        free_all(saved, EBB_MAX_SAVED);
    }
    ebb_tensor *ins[64] = {0}, *params[EBB_MAX_PARAMS] = {0};
    int64_t budget = STANDIN_LIMIT;
    st = standins(call->in, call->n_in, ins, &budget);
    if (st == EBB_OK)
        st = standins(call->params, call->n_params, params, &budget);
    if (st == EBB_OK) {
        ebb_op_call cc = *call;
        cc.in = ins;
        cc.params = params;
        st = r->forward_train(&cc, out, saved);
        if (st == EBB_OK)
            *alias = shares_input(*out, ins, call->n_in);
    } else if (known_no_meta) { /* too large for stand-ins: meta after all */
        free_all(ins, call->n_in);
        free_all(params, call->n_params);
        st = r->forward_train(call, out, saved);
        *alias = st == EBB_OK ? shares_input(*out, call->in, call->n_in) : -1;
        return st;
    }
    free_all(ins, call->n_in);
    free_all(params, call->n_params);
    if (st == EBB_OK)
        st = to_meta(c, out);
    for (int k = 0; st == EBB_OK && k < r->n_saved; k++)
        st = to_meta(c, &saved[k]);
    return st;
}

/* A training forward's extras: forward_train on meta tensors, appended to
 * the step's outputs as fresh values. */
static int add_extras(compiler *c, int si) {
    ebb_plan *p = c->plan;
    plan_step *s = &p->steps[si];
    const ebb_op_grad *r = s->op->grad;
    ebb_tensor *params[EBB_MAX_PARAMS] = {0};
    ebb_tensor *ins[64];
    ebb_status st = EBB_OK;
    for (int i = 0; i < s->pub.n_in; i++)
        ins[i] = c->meta[s->pub.in[i]];
    for (int j = 0; j < s->n_params; j++)
        if (!(params[j] = meta_param(c, s, j)))
            st = c->status;
    ebb_tensor *out = NULL, *saved[EBB_MAX_SAVED] = {0};
    int alias = -1;
    if (st == EBB_OK) {
        ebb_op_call call = {.op = s->op, .attrs = s->attrs, .in = ins, .n_in = s->pub.n_in,
                            .params = params, .n_params = s->n_params, .node = s->pub.node};
        st = dry_forward_train(c, &call, &out, saved, &alias);
    }
    for (int j = 0; j < s->n_params; j++)
        ebb_tensor_free(params[j]);
    ebb_tensor_free(out);
    for (int k = 0; st == EBB_OK && k < r->n_saved; k++)
        if (!saved[k])
            st = ebb_error_set(EBB_ERR_ARG, "its training forward made %d of %d extras", k,
                               r->n_saved);
    if (st != EBB_OK) {
        for (int k = 0; k < EBB_MAX_SAVED; k++)
            ebb_tensor_free(saved[k]);
        return ebb_compiler_fail(
            c, ebb_error_prefix("node %s (%s, training forward)", s->pub.node, s->op->name));
    }
    int outs[1 + EBB_MAX_SAVED];
    outs[0] = s->pub.out[0];
    for (int k = 0; k < r->n_saved; k++) {
        outs[1 + k] = ebb_compiler_value_new(c, saved[k], EBB_VALUE_INTERMEDIATE, si, -1);
        saved[k] = NULL;
        if (outs[1 + k] < 0) {
            for (int m = k + 1; m < r->n_saved; m++)
                ebb_tensor_free(saved[m]);
            return -1;
        }
    }
    s = &p->steps[si];
    int *o = ebb_compiler_dup_ints(outs, 1 + r->n_saved);
    if (!o)
        return ebb_compiler_oom(c);
    free((int *)s->pub.out);
    s->pub.out = o;
    s->pub.n_out = 1 + r->n_saved;
    s->train = 1;
    /* the training output is a view exactly when the dry run says so */
    ebb_plan_value *y = &p->values[s->pub.out[0]];
    y->alias_of = alias >= 0 ? s->pub.in[alias] : -1;
    y->nbytes = alias >= 0 ? 0 : ebb_shape_numel(&y->shape) * (int64_t)ebb_dtype_size(y->dtype);
    /* the training forward's scratch replaces the forward's, on every device */
    s->workspace = 0;
    s->has_workspace_cuda = 0;
    if (s->pub.n_in > 0 && (r->train_workspace || r->train_workspace_cuda)) {
        ebb_shape shapes[64];
        for (int i = 0; i < s->pub.n_in && i < 64; i++)
            shapes[i] = p->values[s->pub.in[i]].shape;
        ebb_dtype dt = p->values[s->pub.in[0]].dtype;
        if (r->train_workspace)
            s->workspace = r->train_workspace(s->attrs, shapes, s->pub.n_in, dt);
        if (r->train_workspace_cuda) {
            s->workspace_cuda = r->train_workspace_cuda(s->attrs, shapes, s->pub.n_in, dt);
            s->has_workspace_cuda = 1;
        }
    }
    ebb_add_param_copies(c, s);
    return 0;
}

/* A mixed-precision forward step's parameters' low copies, kept for its
 * backward (graph/copies.c chooses which steps): appended to its outputs,
 * after its extras, and no longer in its scratch. */
static int add_kept_copies(compiler *c, int si) {
    ebb_plan *p = c->plan;
    uint32_t keep = ebb_low_copy_params(p, &p->steps[si]);
    int n_out = p->steps[si].pub.n_out;
    int *outs = malloc(((size_t)n_out + EBB_MAX_PARAMS) * sizeof *outs);
    if (!outs)
        return ebb_compiler_oom(c);
    memcpy(outs, p->steps[si].pub.out, (size_t)n_out * sizeof *outs);
    for (int j = 0; j < p->steps[si].n_params; j++) {
        if (!(keep >> j & 1))
            continue;
        ebb_tensor *m = meta_param(c, &p->steps[si], j);
        if (!m || (outs[n_out++] = ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, si,
                                                           -1)) < 0) {
            free(outs);
            return -1;
        }
    }
    plan_step *s = &p->steps[si];
    free((int *)s->pub.out);
    s->pub.out = outs;
    s->pub.n_out = n_out;
    /* the copies leave the scratch: what it held beyond them stays */
    int64_t cpu = ebb_param_copy_bytes(c, s, 0), cuda = ebb_param_copy_bytes(c, s, 1);
    s->keep_copy = keep;
    s->workspace -= cpu - ebb_param_copy_bytes(c, s, 0);
    s->workspace_cuda -= cuda - ebb_param_copy_bytes(c, s, 1);
    return 0;
}

/* ---- recomputation ------------------------------------------------------------ *
 *
 * Under a memory budget some forward values are not kept for the backward
 * (c->drop, chosen by graph/remat.c). Where a backward step reads one, the
 * forward step that made it runs again just before, reading what it read
 * then: kept values, or values recomputed the same way. A copy lives until
 * its last backward read, as the kept value would have, so the values
 * dropped between two kept ones are rebuilt once, from the nearer, when the
 * backward reaches them. remat.c drops only what an OP step made where no
 * jump can skip it, and no op whose training forward draws random numbers or
 * updates a buffer, so running it again gives the same bits. */
static int backward_read(ad *a, int v) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    if (v >= c->n_drop || v >= a->n_copy || !c->drop[v])
        return v;
    if (a->copy[v] >= 0)
        return a->copy[v];
    if (a->depth > 0 || a->n_loops > 0) {
        /* a skip may jump over this point: a copy made here might never be
         * written, so the forward's value is kept instead */
        a->copy[v] = v;
        return v;
    }
    int fi = p->values[v].producer;
    int n_in = p->steps[fi].pub.n_in, n_out = p->steps[fi].pub.n_out;
    int *in = malloc(((size_t)n_in + (size_t)n_out + 1) * sizeof *in);
    if (!in)
        return ebb_compiler_oom(c);
    int *out = in + n_in;
    for (int k = 0; k < n_in; k++)
        if ((in[k] = backward_read(a, p->steps[fi].pub.in[k])) < 0) {
            free(in);
            return -1;
        }
    char *name = ebb_compiler_strdupf("%s.recompute", p->steps[fi].op->name);
    plan_step *r = name ? ebb_compiler_step_new(c, EBB_STEP_OP, name, p->steps[fi].pub.node) : NULL;
    if (!r) {
        free(in);
        if (!name)
            return ebb_compiler_oom(c);
        free(name);
        return -1;
    }
    r->op_owned = name;
    const plan_step *f = &p->steps[fi];
    r->op = f->op;
    r->attrs = f->attrs;
    r->workspace = f->workspace;
    r->workspace_cuda = f->workspace_cuda;
    r->has_workspace_cuda = f->has_workspace_cuda;
    memcpy(r->param, f->param, sizeof r->param);
    r->n_params = f->n_params;
    r->train = f->train;
    r->param_cast = f->param_cast;
    r->param_dtype = f->param_dtype;
    r->low_kernel = f->low_kernel;
    r->pub.phase = EBB_PHASE_BACKWARD;
    r->pub.recompute = 1;
    int ri = ebb_compiler_step_index(c, r);
    for (int k = 0; k < n_out; k++) {
        int o = p->steps[fi].pub.out[k], al = p->values[o].alias_of;
        /* a view of what the step read is a view of what the copy reads */
        int cal = -1;
        for (int j = 0; al >= 0 && cal < 0 && j < n_in; j++)
            if (p->steps[fi].pub.in[j] == al)
                cal = in[j];
        ebb_tensor *m = ebb_compiler_meta_ref(c, o);
        out[k] = m ? ebb_compiler_value_new(c, m, EBB_VALUE_INTERMEDIATE, ri, cal) : -1;
        if (out[k] < 0) {
            free(in);
            return -1;
        }
        if (al >= 0 && cal < 0) /* shares storage with something it did not read: own it */
            p->values[out[k]].nbytes =
                ebb_shape_numel(&p->values[o].shape) * (int64_t)ebb_dtype_size(p->values[o].dtype);
        a->copy[o] = out[k];
    }
    int rc = ebb_compiler_step_set_slots(c, &p->steps[ri], in, n_in, out, n_out);
    free(in);
    return rc != 0 ? -1 : a->copy[v];
}

/* ---- gradients ---------------------------------------------------------------- */

/* The dry run of a backward, for the gradients' shapes and which of them
 * share storage with what the step reads (the caller compares storages).
 * On meta tensors; else on CPU stand-ins, where a gradient that is a view of
 * grad_out comes back as a handle on the meta grad_out, so the caller sees
 * the view; when stand-ins would be too large, fresh tensors of the shapes
 * the rule promises. */
static ebb_status dry_backward(compiler *c, const plan_step *f, const ebb_op_grad_call *gc,
                               ebb_tensor **gin, ebb_tensor **gparam) {
    const ebb_op_grad *r = f->op->grad;
    int known_no_meta = seen_failing(c->no_meta_bwd, c->n_no_meta_bwd, f->op);
    ebb_status st = EBB_OK;
    if (!known_no_meta) {
        st = r->backward(gc, gin, gparam);
        if (st == EBB_OK || st == EBB_ERR_SHAPE || st == EBB_ERR_ARG || st == EBB_ERR_NOMEM)
            return st;
        if (c->n_no_meta_bwd < (int)(sizeof c->no_meta_bwd / sizeof c->no_meta_bwd[0]))
            c->no_meta_bwd[c->n_no_meta_bwd++] = f->op;
    }
    free_all(gin, gc->n_in);
    free_all(gparam, gc->n_params);
    /* CPU stand-ins of everything the rule reads */
    ebb_tensor *ins[32] = {0}, *params[EBB_MAX_PARAMS] = {0}, *extras[EBB_MAX_SAVED] = {0};
    ebb_tensor *out = NULL, *grad_out = NULL;
    int64_t budget = STANDIN_LIMIT;
    st = standins(gc->in, gc->n_in, ins, &budget);
    if (st == EBB_OK)
        st = standins(gc->params, gc->n_params, params, &budget);
    if (st == EBB_OK)
        st = standins(gc->saved, gc->n_saved, extras, &budget);
    if (st == EBB_OK && gc->out)
        st = standins((ebb_tensor *const *)&gc->out, 1, &out, &budget);
    if (st == EBB_OK)
        st = standins((ebb_tensor *const *)&gc->grad_out, 1, &grad_out, &budget);
    int ran = 0;
    if (st == EBB_OK) {
        ebb_op_grad_call cc = *gc;
        cc.in = ins;
        cc.params = params;
        cc.saved = extras;
        cc.out = out;
        cc.grad_out = grad_out;
        st = r->backward(&cc, gin, gparam);
        ran = 1;
        /* which gradients are views of what the step reads */
        for (int i = 0; st == EBB_OK && i < gc->n_in; i++)
            if (gin[i] && grad_out && ebb_tensor_same_storage(gin[i], grad_out)) {
                ebb_tensor *v = NULL;
                st = ebb_tensor_ref(&v, gc->grad_out); /* marks the alias for the caller */
                ebb_tensor_free(gin[i]);
                gin[i] = v;
            }
    }
    free_all(ins, gc->n_in);
    free_all(params, gc->n_params);
    free_all(extras, gc->n_saved);
    ebb_tensor_free(out);
    ebb_tensor_free(grad_out);
    if (ran && st != EBB_OK && st != EBB_ERR_UNSUPPORTED && st != EBB_ERR_TORCH)
        return st;
    if (ran && st == EBB_OK) {
        for (int i = 0; st == EBB_OK && i < gc->n_in; i++)
            if (gin[i] && ebb_tensor_device(gin[i]).type != EBB_DEVICE_META)
                st = to_meta(c, &gin[i]);
        for (int j = 0; st == EBB_OK && j < gc->n_params; j++)
            st = to_meta(c, &gparam[j]);
        return st;
    }
    if (!ran && known_no_meta) { /* too large for stand-ins: meta after all */
        st = r->backward(gc, gin, gparam);
        if (st == EBB_OK || st == EBB_ERR_SHAPE || st == EBB_ERR_ARG || st == EBB_ERR_NOMEM)
            return st;
    }
    /* what the rule promises, as fresh storage */
    const ebb_plan *p = c->plan;
    free_all(gin, gc->n_in);
    free_all(gparam, gc->n_params);
    st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < gc->n_in; i++)
        if ((r->differentiable >> i & 1) && !(gc->skip_input_grad >> i & 1)) {
            const ebb_plan_value *v = &p->values[f->pub.in[i]];
            st = ebb_tensor_empty(&gin[i], &v->shape, v->dtype, c->meta_device);
        }
    for (int j = 0; st == EBB_OK && j < gc->n_params; j++) {
        const plan_param *pp = &p->params[f->param[j]];
        if (!pp->spec.buffer && !pp->spec.counter)
            st = ebb_tensor_empty(&gparam[j], &pp->spec.shape, p->dtype, c->meta_device);
    }
    return st;
}

/* The slot whose storage t shares among the step's reads, or -1. */
static int alias_among(const ebb_tensor *t, ebb_tensor *const *metas, const int *slots, int n) {
    for (int k = 0; k < n; k++)
        if (metas[k] && ebb_tensor_same_storage(t, metas[k]))
            return slots[k];
    return -1;
}

/* One backward rule as the compile runs it on meta tensors: what the step
 * reads (saved inputs, the output, the extras, kept low copies, grad_out)
 * and what the rule gave. bwd_call_free() releases whatever it still holds. */
typedef struct bwd_call {
    int n_in;
    uint32_t saved, diff, skip; /* bit i: input i saved / differentiable / not needed */
    int reads[32 + 2 + EBB_MAX_SAVED + EBB_MAX_PARAMS], n_reads;
    ebb_tensor *read_meta[32 + 2 + EBB_MAX_SAVED + EBB_MAX_PARAMS];
    ebb_tensor *ins[32], *params[EBB_MAX_PARAMS], *extras[EBB_MAX_SAVED];
    ebb_shape in_shapes[32];
    ebb_dtype in_dtypes[32];
    int src_y;          /* the slot of the saved output */
    ebb_tensor *seed;   /* grad_out when the output is the loss itself */
    ebb_tensor *gin[32], *gparam[EBB_MAX_PARAMS]; /* the rule's gradients */
} bwd_call;

static void bwd_call_free(bwd_call *k) {
    ebb_tensor_free(k->seed);
    for (int i = 0; i < 32; i++)
        ebb_tensor_free(k->gin[i]);
    for (int j = 0; j < EBB_MAX_PARAMS; j++) {
        ebb_tensor_free(k->gparam[j]);
        ebb_tensor_free(k->params[j]);
    }
    memset(k, 0, sizeof *k);
}

static void bwd_read(bwd_call *k, int slot, ebb_tensor *meta) {
    k->read_meta[k->n_reads] = meta;
    k->reads[k->n_reads++] = slot;
}

/* The values forward step fi's rule reads, kept or recomputed here (which
 * may append steps: the step is re-taken by index after). */
static int bwd_gather(ad *a, int fi, bwd_call *k) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    const ebb_op_grad *r = p->steps[fi].op->grad;
    int y = p->steps[fi].pub.out[0], gy = a->grad[y];
    uint32_t all = k->n_in == 32 ? 0xffffffffu : ((1u << k->n_in) - 1);
    k->saved = r->saves_inputs & all;
    k->diff = r->differentiable & all;
    int src_in[32], src_x[EBB_MAX_SAVED];
    k->src_y = y;
    for (int i = 0; i < k->n_in; i++)
        if ((k->saved >> i & 1) && (src_in[i] = backward_read(a, p->steps[fi].pub.in[i])) < 0)
            return -1;
    if (r->saves_output && (k->src_y = backward_read(a, y)) < 0)
        return -1;
    for (int j = 0; j < r->n_saved; j++)
        if ((src_x[j] = backward_read(a, p->steps[fi].pub.out[1 + j])) < 0)
            return -1;
    const plan_step *f = &p->steps[fi]; /* after the recompute steps: the list may have moved */
    for (int i = 0; i < k->n_in; i++) {
        int x = f->pub.in[i];
        if ((k->diff >> i & 1) && !(x < a->n_grad && a->req[x]))
            k->skip |= 1u << i; /* nothing needs its gradient: the rule may skip it */
        k->in_shapes[i] = p->values[x].shape;
        k->in_dtypes[i] = p->values[x].dtype;
        if (k->saved >> i & 1)
            bwd_read(k, src_in[i], k->ins[i] = c->meta[src_in[i]]);
    }
    if (r->saves_output)
        bwd_read(k, k->src_y, c->meta[k->src_y]);
    for (int j = 0; j < r->n_saved; j++)
        bwd_read(k, src_x[j], k->extras[j] = c->meta[src_x[j]]);
    /* the parameters' low copies the forward kept, its last outputs */
    for (int j = 0, o = f->pub.n_out - ebb_step_kept_copies(f); j < f->n_params; j++)
        if (f->keep_copy >> j & 1) {
            bwd_read(k, f->pub.out[o], c->meta[f->pub.out[o]]);
            o++;
        }
    if (gy == SEED) {
        ebb_shape scalar = {0};
        if (!(k->seed = ebb_compiler_meta_new(c, &scalar, p->values[y].dtype)))
            return -1;
    } else {
        bwd_read(k, gy, c->meta[gy]);
    }
    for (int j = 0; j < f->n_params; j++)
        if (!(k->params[j] = meta_param(c, f, j)))
            return ebb_compiler_fail(c, ebb_error_prefix("node %s (%s.backward)", f->pub.node, f->op->name));
    return 0;
}

/* Every gradient the rule promised, of the promised shape; nothing else. */
static ebb_status bwd_check(const ebb_plan *p, const plan_step *f, const bwd_call *k) {
    char sa[96], sb[96];
    for (int i = 0; i < k->n_in; i++) {
        const ebb_plan_value *v = &p->values[f->pub.in[i]];
        ebb_shape gs = k->gin[i] ? ebb_tensor_shape(k->gin[i]) : v->shape;
        if (!(k->diff >> i & 1) && k->gin[i])
            return ebb_error_set(EBB_ERR_ARG, "the rule gave input %d, marked not "
                                              "differentiable, a gradient", i);
        if ((k->diff >> i & 1) && !k->gin[i] && !(k->skip >> i & 1))
            return ebb_error_set(EBB_ERR_ARG, "the rule gave no gradient for input %d", i);
        if (!ebb_shape_equal(&gs, &v->shape))
            return ebb_error_set(EBB_ERR_SHAPE, "the gradient of input %d is %s, the input %s", i,
                                 ebb_shape_str(&gs, sa, sizeof sa),
                                 ebb_shape_str(&v->shape, sb, sizeof sb));
    }
    for (int j = 0; j < f->n_params; j++) {
        const plan_param *pp = &p->params[f->param[j]];
        int want = !pp->spec.buffer && !pp->spec.counter;
        if (want != (k->gparam[j] != NULL))
            return ebb_error_set(EBB_ERR_ARG, "the rule %s a gradient for %s '%s'",
                                 want ? "gave no" : "gave", want ? "parameter" : "buffer",
                                 pp->full_name);
        ebb_shape gs = want ? ebb_tensor_shape(k->gparam[j]) : pp->spec.shape;
        if (!ebb_shape_equal(&gs, &pp->spec.shape))
            return ebb_error_set(EBB_ERR_SHAPE, "the gradient of '%s' is %s, the parameter %s",
                                 pp->full_name, ebb_shape_str(&gs, sa, sizeof sa),
                                 ebb_shape_str(&pp->spec.shape, sb, sizeof sb));
    }
    return EBB_OK;
}

/* Runs the rule on the gathered metas and checks what it gave. Mixed
 * precision: the rule's low parameter gradients become the parameters'
 * dtype, as the step casts them back. */
static int bwd_run(ad *a, int fi, bwd_call *k) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    const plan_step *f = &p->steps[fi];
    int gy = a->grad[f->pub.out[0]];
    ebb_op_grad_call gc = {.op = f->op, .attrs = f->attrs, .in = k->ins, .n_in = k->n_in,
                           .params = k->params, .n_params = f->n_params,
                           .out = f->op->grad->saves_output ? c->meta[k->src_y] : NULL,
                           .saved = k->extras, .n_saved = f->op->grad->n_saved,
                           .grad_out = k->seed ? k->seed : c->meta[gy], .node = f->pub.node,
                           .in_shapes = k->in_shapes, .skip_input_grad = k->skip,
                           .in_dtypes = k->in_dtypes};
    ebb_status st = dry_backward(c, f, &gc, k->gin, k->gparam);
    if (st == EBB_OK)
        st = bwd_check(p, f, k);
    if (st != EBB_OK)
        return ebb_compiler_fail(c, ebb_error_prefix("node %s (%s.backward)", f->pub.node, f->op->name));
    for (int j = 0; f->param_cast && j < f->n_params; j++) {
        if (!k->gparam[j])
            continue;
        ebb_tensor_free(k->gparam[j]);
        k->gparam[j] = ebb_compiler_meta_new(c, &p->params[f->param[j]].spec.shape, p->dtype);
        if (!k->gparam[j])
            return -1;
    }
    return 0;
}

/* The backward step of forward step fi: what it reads and saves, and its
 * scratch (the rule's, low kernels' allowance, the casts back). */
static plan_step *bwd_step_new(ad *a, int fi, const bwd_call *k) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    const ebb_op_grad *r = p->steps[fi].op->grad;
    char *name = ebb_compiler_strdupf("%s.backward", p->steps[fi].op->name);
    plan_step *b = name ? ebb_compiler_step_new(c, EBB_STEP_BACKWARD, name, p->steps[fi].pub.node)
                        : NULL;
    if (!b) {
        if (!name)
            ebb_compiler_oom(c);
        free(name);
        return NULL;
    }
    const plan_step *f = &p->steps[fi]; /* the step list may have moved */
    int n_in = k->n_in, y = f->pub.out[0];
    b->op_owned = name;
    b->op = f->op;
    b->attrs = f->attrs;
    memcpy(b->param, f->param, sizeof b->param);
    b->n_params = f->n_params;
    b->fwd_step = fi;
    b->n_fwd_in = n_in;
    b->saved_in = k->saved;
    b->saves_out = r->saves_output;
    b->n_saved = r->n_saved;
    b->seed = a->grad[y] == SEED;
    b->skip_in = k->skip;
    b->grad_in = 0; /* the gradients the dry run gave, in input order */
    for (int i = 0; i < n_in; i++)
        if (k->gin[i])
            b->grad_in |= 1u << i;
    b->pub.phase = EBB_PHASE_BACKWARD;
    ebb_dtype dt = n_in > 0 ? p->values[f->pub.in[0]].dtype : p->dtype;
    if (r->workspace && n_in > 0)
        b->workspace = r->workspace(f->attrs, k->in_shapes, n_in, dt);
    if (r->workspace_cuda && n_in > 0) {
        b->workspace_cuda = r->workspace_cuda(f->attrs, k->in_shapes, n_in, dt);
        b->has_workspace_cuda = 1;
    }
    b->param_cast = f->param_cast;
    b->param_dtype = f->param_dtype;
    b->keep_copy = f->keep_copy;
    b->low_kernel = f->low_kernel;
    if ((b->param_cast || b->low_kernel) && !b->has_workspace_cuda) {
        b->workspace_cuda = ebb_cuda_block(b->workspace);
        b->has_workspace_cuda = 1;
    }
    if (b->low_kernel) {
        ebb_shape ps[EBB_MAX_PARAMS];
        for (int j = 0; j < f->n_params; j++)
            ps[j] = p->params[f->param[j]].spec.shape;
        const ebb_shape *ys = &p->values[y].shape;
        b->workspace += ebb_low_kernel_allowance(k->in_shapes, n_in, ps, f->n_params, ys, 2, 0);
        b->workspace_cuda +=
            ebb_low_kernel_allowance(k->in_shapes, n_in, ps, f->n_params, ys, 2, 1);
    }
    if (b->param_cast) {
        b->workspace = ebb_backward_cast_scratch(c, b, b->workspace, 0);
        b->workspace_cuda = ebb_backward_cast_scratch(c, b, b->workspace_cuda, 1);
    }
    return b;
}

/* One value per gradient the rule gave, made by backward step bi: a view
 * of what the step reads shares its slot, a view of the seed takes no
 * bytes, and one tensor for several inputs or parameters is one value.
 * The metas pass to the values (or are freed); gin_slot and gp_slot get
 * the slots, -1 where there is none. */
static int bwd_values(ad *a, int fi, int bi, bwd_call *k, int *gin_slot, int *gp_slot) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    const plan_step *f = &p->steps[fi];
    int outs[32 + EBB_MAX_PARAMS], n_outs = 0, failed = 0;
    for (int i = 0; i < k->n_in; i++) {
        gin_slot[i] = -1;
        if (!k->gin[i])
            continue;
        int al = failed ? -1 : alias_among(k->gin[i], k->read_meta, k->reads, k->n_reads);
        if (al < 0 && k->seed && ebb_tensor_same_storage(k->gin[i], k->seed))
            al = -2; /* a view of the seed: storage the executor owns */
        for (int j = 0; al == -1 && j < i; j++) /* one tensor for several inputs */
            if (gin_slot[j] >= 0 && ebb_tensor_same_storage(k->gin[i], c->meta[gin_slot[j]]))
                al = gin_slot[j];
        gin_slot[i] = failed ? -1
                             : ebb_compiler_value_new(c, k->gin[i], EBB_VALUE_INTERMEDIATE, bi,
                                                      al >= 0 ? al : -1);
        if (!failed && al == -2)
            p->values[gin_slot[i]].nbytes = 0;
        if (failed)
            ebb_tensor_free(k->gin[i]);
        k->gin[i] = NULL;
        failed |= gin_slot[i] < 0;
        outs[n_outs++] = gin_slot[i];
    }
    for (int j = 0; j < f->n_params; j++) {
        gp_slot[j] = -1;
        if (!k->gparam[j])
            continue;
        int al = failed ? -1 : alias_among(k->gparam[j], k->read_meta, k->reads, k->n_reads);
        /* one tensor for several gradients (lstm_cell's two biases): under
         * ZeRO-1 one rank owns both, so that the tensor is averaged once,
         * for both, where it is owned */
        for (int m = 0; !failed && al < 0 && m < j; m++)
            if (gp_slot[m] >= 0 && ebb_tensor_same_storage(k->gparam[j], c->meta[gp_slot[m]])) {
                al = gp_slot[m];
                if (p->owner)
                    p->owner[f->param[j]] = p->owner[f->param[m]];
            }
        for (int i = 0; !failed && al < 0 && i < k->n_in; i++)
            if (gin_slot[i] >= 0 && ebb_tensor_same_storage(k->gparam[j], c->meta[gin_slot[i]]))
                al = gin_slot[i];
        gp_slot[j] = failed ? -1
                            : ebb_compiler_value_new(c, k->gparam[j], EBB_VALUE_INTERMEDIATE, bi,
                                                     al);
        if (failed)
            ebb_tensor_free(k->gparam[j]);
        k->gparam[j] = NULL;
        failed |= gp_slot[j] < 0;
        outs[n_outs++] = gp_slot[j];
    }
    if (failed ||
        ebb_compiler_step_set_slots(c, &p->steps[bi], k->reads, k->n_reads, outs, n_outs) != 0)
        return -1;
    return 0;
}

/* Hands the gradients on to the values and parameters that need them. */
static int bwd_hand_on(ad *a, int fi, const int *gin_slot, const int *gp_slot) {
    ebb_plan *p = a->c->plan;
    char *node = ebb_compiler_strdupf("%s", p->steps[fi].pub.node);
    if (!node)
        return ebb_compiler_oom(a->c);
    int rc = 0;
    for (int i = 0; rc == 0 && i < p->steps[fi].pub.n_in; i++) {
        int x = p->steps[fi].pub.in[i];
        if (gin_slot[i] >= 0 && x < a->n_grad && a->req[x])
            rc = ebb_ad_accumulate(a, &a->grad[x], gin_slot[i], node);
    }
    for (int j = 0; rc == 0 && j < p->steps[fi].n_params; j++) {
        int pi = p->steps[fi].param[j];
        if (gp_slot[j] >= 0 && p->trained[pi])
            rc = ebb_ad_accumulate(a, &a->pgrad[pi], gp_slot[j], node);
    }
    free(node);
    return rc;
}

/* The backward of forward step fi: its rule run on meta tensors, checked,
 * made a step with a value per gradient, the gradients handed on. */
static int emit_backward(ad *a, int fi) {
    compiler *c = a->c;
    const plan_step *f = &c->plan->steps[fi];
    if (f->pub.n_in > 32)
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "node %s: %s has %d inputs; a backward step takes at most 32",
                             f->pub.node, f->op->name, f->pub.n_in));
    bwd_call k = {.n_in = f->pub.n_in};
    int gin_slot[32], gp_slot[EBB_MAX_PARAMS];
    plan_step *b = NULL;
    int rc = bwd_gather(a, fi, &k);
    if (rc == 0)
        rc = bwd_run(a, fi, &k);
    if (rc == 0 && !(b = bwd_step_new(a, fi, &k)))
        rc = -1;
    if (rc == 0)
        rc = bwd_values(a, fi, ebb_compiler_step_index(c, b), &k, gin_slot, gp_slot);
    bwd_call_free(&k);
    return rc == 0 ? bwd_hand_on(a, fi, gin_slot, gp_slot) : rc;
}

/* ---- the pass --------------------------------------------------------------------- */

/* The step's outputs: the loss, and with grads_only the gradients; then the
 * updates and what comes with them (graph/updates.c). */
static int finish(ad *a, int loss) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int n_out = 1;
    for (int i = 0; i < p->n_params; i++) {
        /* a parameter no gradient reaches (a switch's selector) is not trained,
         * nor owned by a ZeRO-1 rank */
        if (a->pgrad[i] < 0) {
            p->trained[i] = 0;
            if (p->owner)
                p->owner[i] = -1;
        }
        n_out += a->t->grads_only && a->pgrad[i] >= 0;
    }
    int *outputs = calloc((size_t)n_out, sizeof *outputs);
    char **names = calloc((size_t)n_out, sizeof *names);
    int *out_param = calloc((size_t)n_out, sizeof *out_param);
    if (!outputs || !names || !out_param) {
        free(outputs);
        free(names);
        free(out_param);
        return ebb_compiler_oom(c);
    }
    free(p->outputs);
    free(p->output_names);
    p->outputs = outputs;
    p->output_names = names;
    p->out_param = out_param;
    p->n_outputs = n_out;
    outputs[0] = loss;
    names[0] = (char *)"loss";
    out_param[0] = -1;
    p->values[loss].kind = EBB_VALUE_OUTPUT;
    if (a->t->grads_only) {
        for (int i = 0, k = 1; i < p->n_params; i++) {
            int g = a->pgrad[i];
            if (g < 0)
                continue;
            outputs[k] = g;
            names[k] = p->params[i].full_name;
            out_param[k++] = i;
            p->values[g].kind = EBB_VALUE_OUTPUT;
        }
        return 0;
    }
    return ebb_ad_after_backward(a);
}

/* The training options the plan keeps, checked: clipping, loss scaling,
 * data parallel and ZeRO-1's owners. */
static int take_train_options(compiler *c, const ebb_train_options *t) {
    ebb_plan *p = c->plan;
    ebb_train_options *k = &p->train_options;
    p->training = 1;
    /* verbatim, less what points into the caller's memory (the plan has
     * its own per-parameter arrays), then made what the plan does */
    *k = *t;
    k->target_shapes = NULL;
    k->n_target_shapes = 0;
    k->target_dtypes = NULL;
    k->loss = k->loss_attrs = NULL;
    k->trained = k->no_decay = NULL;
    k->n_trained = k->n_no_decay = 0;
    if (!(t->clip_grad_norm >= 0) || !(t->clip_grad_value >= 0))
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             "clip_grad_norm %g, clip_grad_value %g: clipping takes a "
                             "positive number (0: none)",
                             t->clip_grad_norm, t->clip_grad_value));
    k->clip_grad_norm = t->grads_only ? 0 : t->clip_grad_norm;
    k->clip_grad_value = t->grads_only ? 0 : t->clip_grad_value;
    if (t->loss_scaling && t->grads_only)
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             "loss_scaling needs update steps; a grads_only plan takes its "
                             "scale from ebb_run_options.loss_scale, and the caller "
                             "unscales (ebb_optimizer_unscale_)"));
    k->loss_scaling = t->loss_scaling != 0;
    if (t->accumulate < 0 || (t->accumulate > 1 && t->grads_only))
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             t->accumulate < 0
                                 ? "accumulate %d: a count of micro-batches (0 or 1: none)"
                                 : "accumulate %d sums the gradients inside the plan; a "
                                   "grads_only plan hands them out instead",
                             t->accumulate));
    k->accumulate = t->accumulate > 1 ? t->accumulate : 0;
    const ebb_parallel_options *par = &t->parallel;
    if (par->world < 0 || par->bucket_bytes < 0)
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             "parallel.world %d, parallel.bucket_bytes %lld: a count of "
                             "ranks and a size (0: the defaults)",
                             par->world, (long long)par->bucket_bytes));
    if (par->world > 1 && t->grads_only && !par->zero)
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG, "data parallel needs update steps; with grads_only the "
                                          "caller averages the gradients "
                                          "(ebb_dist_allreduce_mean_)"));
    if (par->zero && (par->zero != 1 || par->world < 2 || par->rank < 0 || par->rank >= par->world))
        return ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             "zero %d, rank %d of world %d: ZeRO-1 (zero 1) shards the "
                             "optimizer over 2 or more ranks, and the plan is one rank's",
                             par->zero, par->rank, par->world));
    k->parallel.world = t->grads_only ? 0 : par->world;
    k->parallel.rank = par->zero ? par->rank : 0;
    /* with grads_only, ZeRO-1's owners only: the caller averages the
     * gradients and updates its share */
    if (par->zero && ebb_ad_assign_owners(c, par->world) != 0)
        return -1;
    return 0;
}

/* The walk's state for a forward of n_fwd steps: no gradient anywhere yet,
 * each parameter's first reader found. */
static int ad_init(ad *a, int n_fwd) {
    ebb_plan *p = a->c->plan;
    a->n_grad = p->n_values + 1;
    a->req = calloc((size_t)a->n_grad, 1);
    a->grad = malloc((size_t)a->n_grad * sizeof *a->grad);
    a->pgrad = malloc(((size_t)p->n_params + 1) * sizeof *a->pgrad);
    a->regions = malloc(MAX_REGIONS * sizeof *a->regions);
    a->loops = malloc(MAX_LOOPS * sizeof *a->loops);
    a->copy = malloc((size_t)a->n_grad * sizeof *a->copy);
    a->first_use = malloc(((size_t)p->n_params + 1) * sizeof *a->first_use);
    a->updated = calloc((size_t)p->n_params + 1, 1);
    a->reduced = calloc((size_t)p->n_params + 1, 1);
    a->summed = calloc((size_t)p->n_params + 1, 1);
    a->bucket = malloc(((size_t)p->n_params + 1) * sizeof *a->bucket);
    a->pending = malloc(((size_t)p->n_params + 1) * sizeof *a->pending);
    if (!a->req || !a->grad || !a->pgrad || !a->regions || !a->loops || !a->copy || !a->first_use ||
        !a->updated || !a->reduced || !a->summed || !a->bucket || !a->pending)
        return ebb_compiler_oom(a->c);
    a->n_copy = a->n_grad;
    for (int v = 0; v < a->n_copy; v++)
        a->copy[v] = -1;
    for (int i = 0; i < p->n_params; i++)
        a->first_use[i] = -1;
    for (int i = n_fwd - 1; i >= 0; i--)
        for (int j = 0; p->steps[i].pub.kind == EBB_STEP_OP && j < p->steps[i].n_params; j++)
            a->first_use[p->steps[i].param[j]] = i;
    for (int v = 0; v < a->n_grad; v++)
        a->grad[v] = -1;
    for (int i = 0; i < p->n_params; i++)
        a->pgrad[i] = -1;
    return 0;
}

static void ad_free(ad *a) {
    free(a->req);
    free(a->grad);
    free(a->pgrad);
    free(a->regions);
    free(a->loops);
    free(a->copy);
    free(a->first_use);
    free(a->updated);
    free(a->reduced);
    free(a->summed);
    free(a->pending);
    free(a->bucket);
}

/* Which values of the forward's n_fwd steps depend on a trained parameter,
 * into a->req. */
static void mark_required(ad *a, int n_fwd) {
    const ebb_plan *p = a->c->plan;
    for (int i = 0; i < n_fwd; i++) {
        const plan_step *s = &p->steps[i];
        int r = 0;
        if (s->pub.n_out == 0)
            continue; /* a loop's test */
        if (s->pub.kind == EBB_STEP_ROUTE) {
            /* a top-k table passes gradients to the router; a switch's
             * choice is a hard one and passes none */
            a->req[s->pub.out[0]] = s->mode == EBB_ROUTE_TOPK && a->req[s->pub.in[0]];
            continue;
        } else if (s->pub.kind == EBB_STEP_ENTER) {
            a->req[s->pub.out[1]] = a->req[s->pub.in[0]];
            continue;
        } else if (s->pub.kind == EBB_STEP_EXIT) {
            a->req[s->pub.out[0]] |= a->req[s->pub.in[0]] || a->req[s->pub.in[2]];
            continue;
        } else if (s->pub.kind == EBB_STEP_ALIAS) {
            r = a->req[s->pub.in[0]] || a->req[s->pub.out[0]]; /* a loop's result, rewritten */
        } else if (s->pub.kind == EBB_STEP_OP) {
            uint32_t diff = s->op->grad ? s->op->grad->differentiable : 0xffffffffu;
            for (int k = 0; k < s->pub.n_in; k++)
                r |= a->req[s->pub.in[k]] && (k >= 32 || (diff >> k & 1));
            for (int j = 0; j < s->n_params; j++)
                r |= p->trained[s->param[j]];
        }
        a->req[s->pub.out[0]] = (unsigned char)r;
    }
}

/* The loss step, reading the final stream and the targets, its gradient
 * seeded: its value's slot and, in *at, its step; -1 on error. */
static int emit_loss(ad *a, const ebb_op *loss_op, const ebb_attr_value *loss_attrs, int final,
                     int *at) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    int loss_in[1 + 16] = {final};
    int n_loss_in = 1 + p->n_targets;
    for (int i = 0; i < p->n_targets && i < 16; i++)
        loss_in[1 + i] = p->inputs[p->n_inputs - p->n_targets + i];
    int loss = ebb_lower_op(c, loss_op, loss_attrs, "loss", "loss", loss_in, n_loss_in);
    if (loss < 0)
        return -1;
    int loss_step = *at = p->n_steps - 1;
    p->steps[loss_step].pub.phase = EBB_PHASE_LOSS;
    if (loss_op->grad && loss_op->grad->forward_train && add_extras(c, loss_step) != 0)
        return -1;
    if (p->values[loss].shape.ndim != 0) {
        char sb[96];
        ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_SHAPE, "loss %s gives %s; a loss must be a scalar",
                             loss_op->name, ebb_shape_str(&p->values[loss].shape, sb, sizeof sb)));
        return -1;
    }
    if (!loss_op->grad) {
        ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_UNSUPPORTED, "loss %s has no backward rule", loss_op->name));
        return -1;
    }
    /* the loss and every forward value are below n_grad */
    if (loss >= a->n_grad) {
        int *g2 = realloc(a->grad, ((size_t)loss + 1) * sizeof *g2);
        unsigned char *r2 = g2 ? realloc(a->req, (size_t)loss + 1) : NULL;
        if (g2)
            a->grad = g2;
        if (r2)
            a->req = r2;
        if (!g2 || !r2)
            return ebb_compiler_oom(c);
        for (int v = a->n_grad; v <= loss; v++) {
            a->grad[v] = -1;
            a->req[v] = 0;
        }
        a->n_grad = loss + 1;
    }
    a->req[loss] = 1;
    a->grad[loss] = SEED;
    return loss;
}

/* The backward: the loss step, then the forward from its end, each step a
 * gradient reaches given its backward (and the updates it makes due). */
static int walk_back(ad *a, int loss_step, int n_fwd) {
    compiler *c = a->c;
    ebb_plan *p = c->plan;
    for (int k = -1; k < n_fwd; k++) {
        int i = k < 0 ? loss_step : n_fwd - 1 - k;
        const plan_step *s = &p->steps[i];
        if (s->pub.kind == EBB_STEP_EXIT || s->pub.kind == EBB_STEP_ENTER ||
            s->pub.kind == EBB_STEP_ROUTE) {
            if (ebb_ad_routed_backward(a, i) != 0) return -1;
            continue;
        }
        if (s->pub.kind == EBB_STEP_JUMP_IF)
            continue; /* a loop's test: a hard decision, no gradient */
        if (s->pub.kind == EBB_STEP_ALIAS && s->unrolled) {
            if (ebb_ad_loop_backward(a, i) != 0) return -1;
            continue;
        }
        if (s->pub.kind != EBB_STEP_OP && s->pub.kind != EBB_STEP_ALIAS) {
            ebb_compiler_fail(c, ebb_error_set(EBB_ERR_UNSUPPORTED,
                                               "node %s: training through a %s step is "
                                               "not supported",
                                               s->pub.node, s->pub.op));
            return -1;
        }
        int y = s->pub.out[0];
        if (a->grad[y] == -1 || !a->req[y])
            continue;
        if (s->pub.kind == EBB_STEP_ALIAS) {
            char *node = ebb_compiler_strdupf("%s", s->pub.node);
            int x = s->pub.in[0];
            int r2 = node ? ebb_ad_accumulate(a, &a->grad[x], a->grad[y], node) : ebb_compiler_oom(c);
            free(node);
            if (r2 != 0)
                return -1;
            continue;
        }
        if (!s->op->grad) {
            ebb_compiler_fail(
                c, ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "node %s: op %s has no backward rule (ebb_op.grad), so it "
                                 "cannot be trained through",
                                 s->pub.node, s->op->name));
            return -1;
        }
        if (emit_backward(a, i) != 0 || ebb_ad_updates_after_step(a, i) != 0)
            return -1;
    }
    return 0;
}

int ebb_pass_autodiff(compiler *c, const ebb_graph *g, const ebb_compile_options *opts) {
    ebb_plan *p = c->plan;
    const ebb_train_options *t = opts->train;
    if (choose_trained(c, t) != 0 || choose_no_decay(c, t) != 0 || bind_targets(c, g, t) != 0)
        return -1;
    if (take_train_options(c, t) != 0)
        return -1;
    const ebb_op *loss_op = NULL;
    const ebb_attr_value *loss_attrs = NULL;
    if (choose_loss(c, g, t, &loss_op, &loss_attrs) != 0)
        return -1;

    /* the forward's outputs are the loss's business now */
    int final = p->outputs[0];
    for (int i = 0; i < p->n_outputs; i++)
        if (p->values[p->outputs[i]].kind == EBB_VALUE_OUTPUT)
            p->values[p->outputs[i]].kind = EBB_VALUE_INTERMEDIATE;

    /* mixed precision: the loss computes in float32; its input's cast is a
     * forward step, which the gradient walk below covers */
    ebb_dtype fdt = p->values[final].dtype;
    if (c->autocast && fdt != p->dtype &&
        (fdt == EBB_BFLOAT16 || fdt == EBB_FLOAT16 || fdt == EBB_FLOAT32) &&
        (final = ebb_lower_cast(c, final, p->dtype, "loss", 0)) < 0)
        return -1;

    int n_fwd = p->n_steps;
    for (int i = 0; i < n_fwd; i++)
        if (p->steps[i].pub.kind == EBB_STEP_OP && p->steps[i].op->grad &&
            p->steps[i].op->grad->forward_train && add_extras(c, i) != 0)
            return -1;
    for (int i = 0; i < n_fwd && i < c->n_keep; i++)
        if (c->keep[i] && p->steps[i].pub.kind == EBB_STEP_OP && add_kept_copies(c, i) != 0)
            return -1;

    ad a = {.c = c,
            .t = t,
            .hold_updates = t->updates_after_backward || t->clip_grad_norm > 0 ||
                            t->loss_scaling};
    int rc = -1;
    if (ad_init(&a, n_fwd) != 0)
        goto out;
    mark_required(&a, n_fwd);
    if (!a.req[final]) {
        ebb_compiler_fail(
            c, ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: the output of graph '%s' does not depend on any "
                             "trained parameter, so the loss has no gradient",
                             g->name));
        goto out;
    }
    int loss_step = -1, loss = emit_loss(&a, loss_op, loss_attrs, final, &loss_step);
    if (loss < 0 || walk_back(&a, loss_step, n_fwd) != 0)
        goto out;
    rc = finish(&a, loss);
out:
    ad_free(&a);
    return rc;
}
