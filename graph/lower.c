/* Lowering: the nested flow becomes a flat list of steps over value slots.
 *
 * Every step is dry-run as it is emitted, on libtorch's meta device (or by
 * the op's shape function), which gives every value its shape without
 * allocating it and surfaces shape errors with the node's path. Control flow
 * becomes explicit steps: route / enter / exit for switches and top-k gates,
 * loop counters and conditional jumps for loops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

typedef struct scope {
    const struct scope *parent; /* enclosing flow's tags (sub-flows only) */
    const char **names;
    int *slots;
    int n, cap;
} scope;

static int scope_bind(compiler *c, scope *sc, const char *name, int slot) {
    if (sc->n == sc->cap) {
        int cap = sc->cap ? 2 * sc->cap : 8;
        const char **names = realloc(sc->names, (size_t)cap * sizeof *names);
        if (!names)
            return ebb_compiler_oom(c);
        sc->names = names;
        int *slots = realloc(sc->slots, (size_t)cap * sizeof *slots);
        if (!slots)
            return ebb_compiler_oom(c);
        sc->slots = slots;
        sc->cap = cap;
    }
    sc->names[sc->n] = name;
    sc->slots[sc->n++] = slot;
    return 0;
}

static int scope_lookup(const scope *sc, const char *name) {
    for (; sc; sc = sc->parent)
        for (int i = sc->n - 1; i >= 0; i--)
            if (strcmp(sc->names[i], name) == 0)
                return sc->slots[i];
    return -1;
}

static void scope_free(scope *sc) {
    free(sc->names);
    free(sc->slots);
}

/* ---- the dry run ------------------------------------------------------------ */

/* The most the last-resort CPU dry run may allocate for one op: its stand-in
 * inputs, parameters and output. Planning must stay small whatever the graph
 * would need to run; above this the op needs a meta kernel or a shape
 * function. */
#define DRY_RUN_CPU_LIMIT ((int64_t)64 << 20)

static ebb_status zeros_like_on(ebb_tensor **out, const ebb_tensor *t, ebb_device dev) {
    ebb_shape s = ebb_tensor_shape(t);
    return ebb_tensor_zeros(out, &s, ebb_tensor_dtype(t), dev);
}

static int shares_input(const ebb_tensor *r, ebb_tensor *const *in, int n) {
    for (int i = 0; i < n; i++)
        if (ebb_tensor_same_storage(r, in[i]))
            return i;
    return -1;
}

/* Bytes of the tensors, saturating: meta shapes can describe more than
 * int64 bytes in total. */
static int64_t bytes_of(ebb_tensor *const *ts, int n) {
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        int64_t b = ts[i] ? (int64_t)ebb_tensor_numel(ts[i]) : 0;
        int64_t size = ts[i] ? (int64_t)ebb_dtype_size(ebb_tensor_dtype(ts[i])) : 0;
        if (b > 0 && size > INT64_MAX / b)
            return INT64_MAX;
        b *= size;
        if (b > INT64_MAX - sum)
            return INT64_MAX;
        sum += b;
    }
    return sum;
}

/* The output from the op's shape function: a meta tensor, and a view of
 * in[0] when the op says it is one. */
static ebb_status dry_shape(compiler *c, const ebb_op_call *call, ebb_tensor **out, int *alias) {
    ebb_shape shapes[64];
    ebb_dtype dtypes[64];
    for (int i = 0; i < call->n_in; i++) {
        shapes[i] = ebb_tensor_shape(call->in[i]);
        dtypes[i] = ebb_tensor_dtype(call->in[i]);
    }
    ebb_shape s = {0};
    ebb_dtype dt = call->n_in > 0 ? dtypes[0] : c->plan->dtype;
    ebb_status st = call->op->shape(call->attrs, shapes, dtypes, call->n_in, &s, &dt);
    if (st != EBB_OK)
        return st;
    for (int d = 0; d < s.ndim; d++)
        if (s.dim[d] < 0)
            s.ndim = -1;
    if (s.ndim < 0 || s.ndim > EBB_MAX_DIMS) {
        char buf[96];
        return ebb_error_set(EBB_ERR_SHAPE, "op %s: its shape function returned %s", call->op->name,
                             ebb_shape_str(&s, buf, sizeof buf));
    }
    st = ebb_tensor_empty(out, &s, dt, c->meta_device);
    if (st == EBB_OK)
        *alias = call->op->is_view && call->n_in > 0 ? 0 : -1;
    return st;
}

static ebb_status refuse_cpu_dry_run(const ebb_op_call *call, int64_t bytes, const char *what,
                                     const char *meta_error) {
    return ebb_error_set(EBB_ERR_UNSUPPORTED,
                         "op %s has no meta kernel and no shape function, and its dry run on "
                         "CPU stand-ins would need %lld bytes of %s (%.1f MiB; the limit is "
                         "%lld MiB). Give the op a shape function (ebb_op.shape) or make its "
                         "forward work on meta tensors%s%s%s",
                         call->op->name, (long long)bytes, what, (double)bytes / (1 << 20),
                         (long long)(DRY_RUN_CPU_LIMIT >> 20), meta_error ? " (on meta: " : "",
                         meta_error ? meta_error : "", meta_error ? ")" : "");
}

/* Learns the op's output: a meta tensor of its shape and dtype, with *alias
 * the input whose storage it shares, or -1 (the dry run, not the op's flag,
 * says what is a view). In order: the op's shape function; its forward on
 * the meta device; as a last resort, its forward on CPU zeros of the same
 * sizes, refused when those would be large. */
static ebb_status dry_forward(compiler *c, ebb_op_call *call, ebb_tensor **out, int *alias) {
    if (call->op->shape)
        return dry_shape(c, call, out, alias);
    ebb_tensor *r = NULL;
    char *meta_error = NULL;
    int known_no_meta = 0;
    for (int i = 0; i < c->n_no_meta; i++)
        known_no_meta |= c->no_meta[i] == call->op;
    if (!known_no_meta) {
        ebb_status st = call->op->forward(call, &r);
        if (st == EBB_OK) {
            if (!r)
                return ebb_error_set(EBB_ERR_ARG, "op %s returned no tensor", call->op->name);
            *alias = shares_input(r, call->in, call->n_in);
            *out = r;
            return EBB_OK;
        }
        /* a shape or argument error is the answer; anything else may be a
         * missing meta kernel: remember the op (raising is slow) and retry */
        if (st == EBB_ERR_SHAPE || st == EBB_ERR_ARG || st == EBB_ERR_NOMEM)
            return st;
        if (c->n_no_meta < (int)(sizeof c->no_meta / sizeof c->no_meta[0]))
            c->no_meta[c->n_no_meta++] = call->op;
        /* ATen's first sentence names the kernel; the rest lists backends */
        const char *e = ebb_errmsg(), *stop = strstr(e, ". ");
        int len = stop ? (int)(stop - e) : (int)strlen(e);
        meta_error = ebb_compiler_strdupf("%.*s", len < 300 ? len : 300, e);
    }
    /* CPU retry with zeros of the same shapes, if they are small. */
    int64_t in_bytes = bytes_of(call->in, call->n_in);
    int64_t param_bytes = bytes_of(call->params, call->n_params);
    if (in_bytes > DRY_RUN_CPU_LIMIT - param_bytes) {
        int64_t need = in_bytes > INT64_MAX - param_bytes ? INT64_MAX : in_bytes + param_bytes;
        ebb_status st = refuse_cpu_dry_run(call, need, "input and parameters", meta_error);
        free(meta_error);
        return st;
    }
    ebb_tensor **cpu = calloc((size_t)(call->n_in + call->n_params), sizeof *cpu);
    if (!cpu) {
        free(meta_error);
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    }
    ebb_status cst = EBB_OK;
    for (int i = 0; cst == EBB_OK && i < call->n_in; i++)
        cst = zeros_like_on(&cpu[i], call->in[i], ebb_device_cpu());
    for (int i = 0; cst == EBB_OK && i < call->n_params; i++)
        cst = zeros_like_on(&cpu[call->n_in + i], call->params[i], ebb_device_cpu());
    if (cst == EBB_OK) {
        ebb_op_call cc = *call;
        cc.in = cpu;
        cc.params = cpu + call->n_in;
        cst = call->op->forward(&cc, &r);
        if (cst == EBB_OK && !r)
            cst = ebb_error_set(EBB_ERR_ARG, "op %s returned no tensor", call->op->name);
        if (cst == EBB_OK) {
            /* the output's size is known only once it is made; refuse all
             * the same, so the limit covers what the op makes as well as
             * what it reads */
            int64_t total = in_bytes + param_bytes + bytes_of(&r, 1);
            *alias = shares_input(r, cpu, call->n_in);
            ebb_shape s = ebb_tensor_shape(r);
            ebb_dtype dt = ebb_tensor_dtype(r);
            ebb_tensor_free(r);
            r = NULL;
            if (total > DRY_RUN_CPU_LIMIT)
                cst = refuse_cpu_dry_run(call, total, "input, parameters and output", meta_error);
            else
                cst = ebb_tensor_empty(&r, &s, dt, c->meta_device);
        }
    }
    for (int i = 0; i < call->n_in + call->n_params; i++)
        ebb_tensor_free(cpu[i]);
    free(cpu);
    free(meta_error);
    if (cst != EBB_OK)
        return cst;
    *out = r;
    return EBB_OK;
}

/* ---- emitting steps ------------------------------------------------------- */

static int add_param(compiler *c, const ebb_param_spec *spec, const char *prefix,
                     const char *path) {
    ebb_plan *p = c->plan;
    char *full = ebb_compiler_strdupf("%s.%s", prefix, spec->name);
    if (!full)
        return ebb_compiler_oom(c);
    for (int i = 0; i < p->n_params; i++)
        if (strcmp(p->params[i].full_name, full) == 0) {
            c->status = ebb_error_set(EBB_ERR_BUILD,
                                      "node %s: parameter '%s' is already defined by node %s "
                                      "(give the nodes different names)",
                                      path, full, p->params[i].node);
            free(full);
            return -1;
        }
    if (p->n_params == c->cap_params) {
        int cap = c->cap_params ? 2 * c->cap_params : 16;
        plan_param *np = realloc(p->params, (size_t)cap * sizeof *np);
        if (!np) {
            free(full);
            return ebb_compiler_oom(c);
        }
        p->params = np;
        c->cap_params = cap;
    }
    plan_param *pp = &p->params[p->n_params];
    memset(pp, 0, sizeof *pp);
    pp->spec = *spec;
    pp->full_name = full;
    pp->node = ebb_compiler_strdupf("%s", path);
    if (!pp->node) {
        free(full);
        return ebb_compiler_oom(c);
    }
    p->n_params++;
    return 0;
}

/* The parameter a node ties its own `spec` to (ebb_node_share): the plan's
 * parameter named `source`, made by an earlier node, of the same shape and
 * kind. The node's name for it becomes one of the parameter's aliases, so a
 * weights file may hold it under either name. Returns its index or -1. */
static int share_param(compiler *c, const ebb_param_spec *spec, const char *source,
                       const char *prefix) {
    ebb_plan *p = c->plan;
    int found = -1;
    for (int i = 0; i < p->n_params && found < 0; i++)
        if (strcmp(p->params[i].full_name, source) == 0)
            found = i;
    if (found < 0) {
        c->status = ebb_error_set(EBB_ERR_BUILD,
                                  "node %s: its %s is to be shared with '%s', but no node before "
                                  "it makes a parameter of that name",
                                  prefix, spec->name, source);
        return -1;
    }
    plan_param *pp = &p->params[found];
    if (!ebb_shape_equal(&pp->spec.shape, &spec->shape) || pp->spec.buffer != spec->buffer ||
        pp->spec.counter != spec->counter) {
        char a[96], b[96];
        c->status = ebb_error_set(EBB_ERR_SHAPE,
                                  "node %s: its %s %s cannot be shared with '%s' %s%s", prefix,
                                  spec->name, ebb_shape_str(&spec->shape, a, sizeof a), source,
                                  ebb_shape_str(&pp->spec.shape, b, sizeof b),
                                  pp->spec.buffer != spec->buffer ? " (a buffer and a parameter)"
                                                                  : "");
        return -1;
    }
    char *alias = ebb_compiler_strdupf("%s.%s", prefix, spec->name);
    if (!alias)
        return ebb_compiler_oom(c);
    for (int k = 0; k < pp->n_aliases; k++)
        if (strcmp(pp->aliases[k], alias) == 0) { /* a later iteration of an unrolled loop */
            free(alias);
            return found;
        }
    char **more = realloc(pp->aliases, (size_t)(pp->n_aliases + 1) * sizeof *more);
    if (!more) {
        free(alias);
        return ebb_compiler_oom(c);
    }
    pp->aliases = more;
    pp->aliases[pp->n_aliases++] = alias;
    return found;
}

/* The plan's parameter indices for an op step's `specs`: new parameters, the
 * first iteration's in a later iteration of an unrolled loop, or another
 * node's where `node` shares them. Returns 0 or -1. */
static int step_params(compiler *c, const ebb_node *node, const ebb_param_spec *specs, int np,
                       const char *prefix, const char *path, int *index) {
    for (int k = 0; node && k < node->share_param.n; k++) {
        int known = 0;
        for (int i = 0; i < np && !known; i++)
            known = strcmp(specs[i].name, node->share_param.items[k]) == 0;
        if (!known) {
            char names[256] = "";
            size_t at = 0;
            for (int i = 0; i < np && at < sizeof names; i++)
                at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                                       specs[i].name);
            c->status = ebb_error_set(EBB_ERR_BUILD,
                                      "node %s: %s has no parameter '%s' to share (%s%s)", prefix,
                                      node->op->name, node->share_param.items[k],
                                      np ? "its parameters: " : "it has none", names);
            return -1;
        }
    }
    for (int i = 0; i < np; i++) {
        const char *source = NULL;
        for (int k = 0; node && k < node->share_param.n && !source; k++)
            if (strcmp(node->share_param.items[k], specs[i].name) == 0)
                source = node->share_source.items[k];
        if (source) {
            if ((index[i] = share_param(c, &specs[i], source, prefix)) < 0)
                return -1;
            continue;
        }
        index[i] = -1;
        if (c->repeating) {
            /* a later iteration of an unrolled loop: the first one's weights */
            char *full = ebb_compiler_strdupf("%s.%s", prefix, specs[i].name);
            if (!full)
                return ebb_compiler_oom(c);
            for (int k = 0; k < c->plan->n_params && index[i] < 0; k++)
                if (strcmp(c->plan->params[k].full_name, full) == 0)
                    index[i] = k;
            free(full);
        }
        if (index[i] < 0) {
            if (add_param(c, &specs[i], prefix, path) != 0)
                return -1;
            index[i] = c->plan->n_params - 1;
        }
    }
    return 0;
}

/* ---- mixed precision (ebb_compile_options.precision) ------------------------------------
 *
 * torch.autocast's policy, on the plan, as each op's descriptor classes it
 * (ebb_op.autocast): a LOW op computes in the low dtype, a FULL one in
 * float32, a KEEP one in its first input's, and any other in its inputs'
 * widest dtype. A `cast` step goes before each input that is in another
 * dtype; parameters are cast inside the step (plan_step.param_cast). */

static int is_float(ebb_dtype dt) {
    return dt == EBB_FLOAT32 || dt == EBB_FLOAT64 || dt == EBB_BFLOAT16 || dt == EBB_FLOAT16;
}

/* The wider of two floating dtypes; bfloat16 and float16 together widen to
 * float32, as torch's type promotion does. */
static ebb_dtype wider(ebb_dtype a, ebb_dtype b) {
    if (a == b)
        return a;
    if (a == EBB_FLOAT64 || b == EBB_FLOAT64)
        return EBB_FLOAT64;
    return EBB_FLOAT32;
}

ebb_dtype ebb_param_dtype_in(const compiler *c, const plan_step *s, int k) {
    const plan_param *pp = &c->plan->params[s->param[k]];
    if (pp->spec.counter)
        return EBB_INT64;
    return s->param_cast ? s->param_dtype : c->plan->dtype;
}

int64_t ebb_param_copy_bytes(const compiler *c, const plan_step *s, int cuda) {
    int64_t bytes = 0;
    for (int k = 0; s->param_cast && k < s->n_params; k++) {
        const plan_param *pp = &c->plan->params[s->param[k]];
        if (pp->spec.counter || (s->keep_copy >> k & 1))
            continue; /* no copy, or one kept from the forward: a value of the plan */
        int64_t n = ebb_shape_numel(&pp->spec.shape) * (int64_t)ebb_dtype_size(s->param_dtype);
        bytes += cuda ? ebb_cuda_block(n) : n;
    }
    return bytes;
}

void ebb_add_param_copies(const compiler *c, plan_step *s) {
    if (!s->param_cast)
        return;
    if (!s->has_workspace_cuda) {
        s->workspace_cuda = ebb_cuda_block(s->workspace);
        s->has_workspace_cuda = 1;
    }
    s->workspace += ebb_param_copy_bytes(c, s, 0);
    s->workspace_cuda += ebb_param_copy_bytes(c, s, 1);
}

int64_t ebb_low_kernel_allowance(const ebb_shape *in, int n_in, const ebb_shape *params, int np,
                                 const ebb_shape *out, int times, int cuda) {
    int64_t total = 0;
    for (int i = 0; i < n_in + np + 1; i++) {
        const ebb_shape *sh = i < n_in ? &in[i] : i < n_in + np ? &params[i - n_in] : out;
        int64_t b = 4 * ebb_shape_numel(sh);
        total += times * (cuda ? ebb_cuda_block(b) : b);
    }
    return total;
}

int64_t ebb_backward_cast_scratch(const compiler *c, const plan_step *b, int64_t rule, int cuda) {
    if (!b->param_cast)
        return rule;
    int64_t copies = ebb_param_copy_bytes(c, b, cuda), low = 0, full = 0;
    for (int k = 0; k < b->n_params; k++) {
        const plan_param *pp = &c->plan->params[b->param[k]];
        if (pp->spec.counter || pp->spec.buffer)
            continue; /* no gradient */
        int64_t n = ebb_shape_numel(&pp->spec.shape);
        int64_t l = n * (int64_t)ebb_dtype_size(b->param_dtype);
        int64_t f = n * (int64_t)ebb_dtype_size(c->plan->dtype);
        low += cuda ? ebb_cuda_block(l) : l;
        full += cuda ? ebb_cuda_block(f) : f;
    }
    int64_t during = copies + rule + low - full;
    return during > low ? during : low;
}

/* A cast step of slot `x` to `dt`; returns its output slot or -1. */
int ebb_lower_cast(compiler *c, int x, ebb_dtype dt, const char *path, int i) {
    const ebb_op *cast = ebb_op_find("cast");
    attr_block *a = calloc(1, sizeof *a);
    char *where = ebb_compiler_strdupf("%s.cast%d", path, i);
    if (!cast || !a || !where) {
        free(a);
        free(where);
        return ebb_compiler_oom(c);
    }
    a->v[0].type = EBB_ATTR_STRING;
    a->v[0].set = 1;
    a->v[0].s = ebb_dtype_name(dt);
    a->next = c->attrs;
    c->attrs = a;
    int slot = ebb_lower_op_node(c, cast, a->v, NULL, where, where, &x, 1);
    free(where);
    return slot;
}

/* Slot y as `dt` (a cast step when they differ): a loop's state and a
 * route's accumulator keep one dtype whatever their body's ops compute in. */
static int conform_dtype(compiler *c, int y, ebb_dtype dt, const char *path) {
    if (!c->autocast || y < 0 || c->plan->values[y].dtype == dt)
        return y;
    return ebb_lower_cast(c, y, dt, path, 0);
}

/* Writes into out[] the slots the op reads under the policy (cast steps
 * emitted where a dtype changes); sets *low when the op computes in the
 * low dtype on copies of its parameters, and *low_input when it computes
 * on a low input with its parameters as they are (batch_norm). */
static int autocast_inputs(compiler *c, const ebb_op *op, const ebb_attr_value *attrs,
                           const char *path, const int *in, int n_in, int *out, int *low,
                           int *low_input) {
    const ebb_plan *p = c->plan;
    ebb_op_autocast k = c->full ? EBB_AUTOCAST_FULL : op->autocast;
    *low = k == EBB_AUTOCAST_LOW;
    *low_input = 0;
    ebb_dtype target = k == EBB_AUTOCAST_LOW ? c->low : p->dtype;
    if (k == EBB_AUTOCAST_KEEP && n_in > 0 && is_float(p->values[in[0]].dtype)) {
        target = p->values[in[0]].dtype;
        *low_input = target != p->dtype;
    }
    if (k == EBB_AUTOCAST_PROMOTE) {
        /* an op with floating parameters computes in theirs (float32) */
        ebb_shape shapes[64];
        ebb_param_spec specs[EBB_MAX_PARAMS];
        int np = 0, has_float = 0, any = 0;
        for (int i = 0; i < n_in; i++)
            shapes[i] = p->values[in[i]].shape;
        if (op->params && op->params(attrs, shapes, n_in, specs, &np) == EBB_OK)
            for (int j = 0; j < np; j++)
                has_float |= !specs[j].counter;
        else
            ebb_error_clear(); /* the lowering below reports it */
        for (int i = 0; i < n_in; i++) {
            ebb_dtype dt = p->values[in[i]].dtype;
            if (!is_float(dt))
                continue;
            target = any ? wider(target, dt) : dt;
            any = 1;
        }
        if (has_float)
            target = any ? wider(target, p->dtype) : p->dtype;
    }
    for (int i = 0; i < n_in; i++) {
        ebb_dtype dt = p->values[in[i]].dtype;
        out[i] = is_float(dt) && dt != target ? ebb_lower_cast(c, in[i], target, path, i) : in[i];
        if (out[i] < 0)
            return -1;
    }
    return 0;
}

/* Emits one op step reading `in`; returns the output slot or -1. */
int ebb_lower_op(compiler *c, const ebb_op *op, const ebb_attr_value *attrs, const char *prefix,
                 const char *path, const int *in, int n_in) {
    return ebb_lower_op_node(c, op, attrs, NULL, prefix, path, in, n_in);
}

int ebb_lower_op_node(compiler *c, const ebb_op *op, const ebb_attr_value *attrs,
                      const ebb_node *node, const char *prefix, const char *path, const int *in,
                      int n_in) {
    ebb_shape shapes[64];
    ebb_tensor *ins[64];
    const ebb_op *same = op->identity_for && n_in == 1 && op->identity_for(attrs)
                             ? ebb_op_find("identity")
                             : NULL;
    if (same)
        op = same; /* the node keeps its name; the plan lists the identity it is */
    if (n_in < op->min_inputs || (op->max_inputs >= 0 && n_in > op->max_inputs)) {
        c->status = ebb_error_set(EBB_ERR_BUILD, "node %s: %s takes %d to %d inputs, given %d",
                                  prefix, op->name, op->min_inputs, op->max_inputs, n_in);
        return -1;
    }
    if (n_in > 64) {
        c->status = ebb_error_set(EBB_ERR_BUILD, "node %s: %s has %d inputs (at most 64)", path,
                                  op->name, n_in);
        return -1;
    }
    int cast_in[64], low = 0, low_input = 0;
    if (c->autocast && strcmp(op->name, "cast") != 0) {
        if (autocast_inputs(c, op, attrs, path, in, n_in, cast_in, &low, &low_input) != 0)
            return -1;
        in = cast_in;
    }
    for (int i = 0; i < n_in; i++) {
        ins[i] = c->meta[in[i]];
        shapes[i] = c->plan->values[in[i]].shape;
    }
    ebb_param_spec specs[EBB_MAX_PARAMS];
    int np = 0;
    if (op->params) {
        ebb_status st = op->params(attrs, shapes, n_in, specs, &np);
        if (st != EBB_OK) {
            c->status = ebb_error_prefix("node %s", prefix);
            return -1;
        }
    }
    int param_index[EBB_MAX_PARAMS];
    if (step_params(c, node, specs, np, prefix, path, param_index) != 0)
        return -1;
    if (np > c->plan->max_params)
        c->plan->max_params = np;

    ebb_tensor *params[EBB_MAX_PARAMS] = {0};
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < np; i++)
        st = ebb_tensor_empty(&params[i], &specs[i].shape,
                              specs[i].counter ? EBB_INT64 : low ? c->low : c->plan->dtype,
                              c->meta_device);
    ebb_tensor *out = NULL;
    int alias = -1;
    if (st == EBB_OK) {
        ebb_op_call call = {.op = op, .attrs = attrs, .in = ins, .n_in = n_in,
                            .params = params, .n_params = np, .node = path};
        st = dry_forward(c, &call, &out, &alias);
    }
    for (int i = 0; i < np; i++)
        ebb_tensor_free(params[i]);
    if (st == EBB_OK && ebb_tensor_ndim(out) > EBB_MAX_DIMS) {
        st = ebb_error_set(EBB_ERR_SHAPE, "the output has %d dimensions; ebb supports up to %d",
                           ebb_tensor_ndim(out), EBB_MAX_DIMS);
        ebb_tensor_free(out);
        out = NULL;
    }
    if (st != EBB_OK) {
        c->status = ebb_error_prefix("node %s (%s)", prefix, op->name);
        return -1;
    }
    plan_step *s = ebb_compiler_step_new(c, EBB_STEP_OP, op->name, prefix);
    if (!s) {
        ebb_tensor_free(out);
        return -1;
    }
    s->op = op;
    s->attrs = attrs;
    if (op->workspace && n_in > 0)
        s->workspace = op->workspace(attrs, shapes, n_in, ebb_tensor_dtype(ins[0]));
    if (op->workspace_cuda && n_in > 0) {
        s->workspace_cuda = op->workspace_cuda(attrs, shapes, n_in, ebb_tensor_dtype(ins[0]));
        s->has_workspace_cuda = 1;
    }
    memcpy(s->param, param_index, sizeof param_index);
    s->n_params = np;
    s->param_cast = low && np > 0;
    s->param_dtype = c->low;
    /* under mixed precision any op that reads a low value is measured: the
     * ops' figures model their float32 and float64 kernels, and a
     * bfloat16 kernel may accumulate in float32 copies (libtorch 2.11's
     * adaptive_avg_pool2d does) */
    int reads_low = 0;
    for (int i = 0; c->autocast && i < n_in; i++) {
        ebb_dtype dt = c->plan->values[in[i]].dtype;
        reads_low |= (dt == EBB_BFLOAT16 || dt == EBB_FLOAT16) && strcmp(op->name, "cast") != 0;
    }
    s->low_kernel = low || low_input || reads_low;
    if (s->low_kernel) {
        /* a float32 copy of every operand and of the result */
        ebb_shape ps[EBB_MAX_PARAMS], os = ebb_tensor_shape(out);
        for (int i = 0; i < np; i++)
            ps[i] = specs[i].shape;
        if (!s->has_workspace_cuda) {
            s->workspace_cuda = ebb_cuda_block(s->workspace);
            s->has_workspace_cuda = 1;
        }
        s->workspace += ebb_low_kernel_allowance(shapes, n_in, ps, np, &os, 1, 0);
        s->workspace_cuda += ebb_low_kernel_allowance(shapes, n_in, ps, np, &os, 1, 1);
    }
    ebb_add_param_copies(c, s);
    /* a view op may still copy (reshape of a non-contiguous input), and an op
     * not flagged as a view may hand back its input: trust the dry run */
    int slot = ebb_compiler_value_new(c, out, EBB_VALUE_INTERMEDIATE, ebb_compiler_step_index(c, s),
                         alias >= 0 ? in[alias] : -1);
    if (slot < 0 || ebb_compiler_step_set_slots(c, s, in, n_in, &slot, 1) != 0)
        return -1;
    return slot;
}

/* A control step with no op: in -> out, the outputs' meta tensors given. */
static void drop_metas(ebb_tensor **metas, int from, int n) {
    for (int i = from; i < n; i++) {
        ebb_tensor_free(metas[i]);
        metas[i] = NULL;
    }
}

/* Takes ownership of out_meta[] on every path: the entries are NULL after. */
static plan_step *emit_control(compiler *c, ebb_step_kind kind, const char *name,
                               const char *path, const int *in, int n_in, int *out,
                               ebb_tensor **out_meta, const int *alias_of, int n_out) {
    plan_step *s = ebb_compiler_step_new(c, kind, name, path);
    if (!s) {
        drop_metas(out_meta, 0, n_out);
        return NULL;
    }
    for (int i = 0; i < n_out; i++) {
        if (out[i] < 0) {
            out[i] = ebb_compiler_value_new(c, out_meta[i], EBB_VALUE_INTERMEDIATE, ebb_compiler_step_index(c, s),
                               alias_of ? alias_of[i] : -1);
            out_meta[i] = NULL;
            if (out[i] < 0) {
                drop_metas(out_meta, i + 1, n_out);
                return NULL;
            }
        } else {
            /* a redefinition (loop state, switch accumulator): keep the
             * slot's first shape and drop the new meta tensor */
            drop_metas(out_meta, i, i + 1);
        }
    }
    if (ebb_compiler_step_set_slots(c, s, in, n_in, out, n_out) != 0)
        return NULL;
    return s;
}

/* ---- lowering ----------------------------------------------------------- */

static int lower_flow(compiler *c, const ebb_graph *g, const char *prefix, scope *sc,
                      int stream);

static char *shape_text(const ebb_shape *s, char *buf, size_t n) { return (char *)ebb_shape_str(s, buf, n); }

static int lower_node_as_set(compiler *c, const ebb_node *n, const char *path, const scope *sc,
                             const int *in, int n_in);

/* Lowers one node applied to in[0..n_in); returns its output slot. A node
 * with a precision of its own (ebb_node_precision) is a region: its ops
 * follow that precision, and the plan's resumes after it. */
static int lower_node(compiler *c, const ebb_node *n, const char *path, const scope *sc,
                      const int *in, int n_in) {
    if (n->precision == EBB_PRECISION_DEFAULT)
        return lower_node_as_set(c, n, path, sc, in, n_in);
    int full = c->full;
    ebb_dtype low = c->low;
    c->full = n->precision == EBB_PRECISION_FP32;
    if (!c->full)
        c->low = n->precision == EBB_PRECISION_FP16 ? EBB_FLOAT16 : EBB_BFLOAT16;
    int out = lower_node_as_set(c, n, path, sc, in, n_in);
    c->full = full;
    c->low = low;
    return out;
}

static int lower_node_as_set(compiler *c, const ebb_node *n, const char *path, const scope *sc,
                             const int *in, int n_in) {
    switch (n->kind) {
    case NODE_OP:
        return ebb_lower_op_node(c, n->op, n->attrs, n, n->name ? n->name : path, path, in, n_in);
    case NODE_SEQ: {
        int slot = -1;
        for (int j = 0; j < n->n_children; j++) {
            char *cp = ebb_compiler_strdupf("%s.%d", path, j);
            if (!cp)
                return ebb_compiler_oom(c);
            slot = j == 0 ? lower_node(c, n->children[0], cp, sc, in, n_in)
                          : lower_node(c, n->children[j], cp, sc, &slot, 1);
            free(cp);
            if (slot < 0)
                return -1;
        }
        return slot;
    }
    case NODE_GRAPH:
    case NODE_SUBFLOW: {
        const ebb_graph *g = n->graph;
        scope inner = {.parent = n->kind == NODE_SUBFLOW ? sc : NULL};
        int out = -1;
        const char *prefix = n->name ? n->name : path;
        for (int i = 0; i < g->inputs.n && i < n_in; i++)
            if (scope_bind(c, &inner, g->inputs.items[i], in[i]) != 0)
                goto done;
        out = lower_flow(c, g, prefix, &inner, in[0]);
    done:
        scope_free(&inner);
        return out;
    }
    }
    return -1;
}

static int resolve_using(compiler *c, const graph_step *st, const scope *sc, const char *path,
                         int stream, int *in) {
    in[0] = stream;
    for (int u = 0; u < st->using_tags.n; u++) {
        int slot = scope_lookup(sc, st->using_tags.items[u]);
        if (slot < 0) {
            c->status = ebb_error_set(EBB_ERR_BUILD, "node %s: undefined tag '%s'", path,
                                      st->using_tags.items[u]);
            return -1;
        }
        in[1 + u] = slot;
    }
    return 1 + st->using_tags.n;
}

static const char *merge_op_name(ebb_merge_op m) {
    switch (m) {
    case EBB_MERGE_ADD: return "add";
    case EBB_MERGE_MEAN: return "average";
    case EBB_MERGE_MUL: return "mul";
    case EBB_MERGE_MAX: return "maximum";
    case EBB_MERGE_CAT: return "cat";
    case EBB_MERGE_STACK: return "stack";
    }
    return "add";
}

static const ebb_attr_value *int_attr(compiler *c, int64_t value) {
    attr_block *a = calloc(1, sizeof *a);
    if (!a) {
        ebb_compiler_oom(c);
        return NULL;
    }
    a->v[0].type = EBB_ATTR_INT;
    a->v[0].set = 1;
    a->v[0].i = value;
    a->v[0].f = (double)value;
    a->next = c->attrs;
    c->attrs = a;
    return a->v;
}

/* Switch and top-k gate: route, then per branch enter / body / exit. */
static int lower_routed(compiler *c, const graph_step *st, const char *spath, const scope *sc,
                        int x, int scores, ebb_route_mode mode) {
    const char *kind = mode == EBB_ROUTE_SWITCH ? "switch" : "gate";
    int k = st->n_nodes;
    ebb_plan_value sv = c->plan->values[scores];
    char sb[96], xb[96];
    int64_t batch = c->plan->values[x].shape.ndim ? c->plan->values[x].shape.dim[0] : 1;
    int int_sel = sv.dtype == EBB_INT64 || sv.dtype == EBB_INT32 || sv.dtype == EBB_UINT8;
    int ok_shape = sv.shape.ndim >= 1 && sv.shape.dim[0] == batch &&
                   ((mode == EBB_ROUTE_SWITCH && int_sel && sv.shape.ndim == 1) ||
                    (!int_sel && sv.shape.ndim == 2 && sv.shape.dim[1] == k));
    if (!ok_shape) {
        c->status = ebb_error_set(
            EBB_ERR_SHAPE,
            "node %s.%s: %s output is %s %s, expected %s[%lld, %d] scores for %d %s (input %s)",
            spath, mode == EBB_ROUTE_SWITCH ? "selector" : "router",
            mode == EBB_ROUTE_SWITCH ? "selector" : "router", ebb_dtype_name(sv.dtype),
            shape_text(&sv.shape, sb, sizeof sb),
            mode == EBB_ROUTE_SWITCH ? "[batch] integer indices or " : "", (long long)batch, k, k,
            mode == EBB_ROUTE_SWITCH ? "branches" : "experts",
            shape_text(&c->plan->values[x].shape, xb, sizeof xb));
        return -1;
    }
    char *path = ebb_compiler_strdupf("%s.%s", spath, kind);
    if (!path)
        return ebb_compiler_oom(c);
    int result = -1;
    /* ROUTE: (scores) -> (route table, empty accumulator) */
    ebb_tensor *rm[2];
    ebb_shape rs = mode == EBB_ROUTE_SWITCH ? (ebb_shape){1, {batch}} : sv.shape;
    rm[0] = ebb_compiler_meta_new(c, &rs, mode == EBB_ROUTE_SWITCH ? EBB_INT64 : sv.dtype);
    rm[1] = NULL;
    int rout[2] = {-1, -1};
    plan_step *route = rm[0] ? emit_control(c, EBB_STEP_ROUTE, "route", path, &scores, 1, rout, rm,
                                            NULL, 1)
                             : NULL;
    if (!route)
        goto out;
    route->mode = mode;
    route->n_branches = k;
    route->top_k = st->top_k;
    /* the accumulator slot starts empty at the route step */
    int acc = ebb_compiler_value_new(c, NULL, EBB_VALUE_INTERMEDIATE, ebb_compiler_step_index(c, route), -1);
    if (acc < 0)
        goto out;
    {
        int outs[2] = {rout[0], acc};
        free((void *)route->pub.out);
        route->pub.out = ebb_compiler_dup_ints(outs, 2);
        route->pub.n_out = 2;
        if (!route->pub.out) {
            ebb_compiler_oom(c);
            goto out;
        }
    }
    int acc_has_shape = 0;
    for (int j = 0; j < k; j++) {
        char *bpath = ebb_compiler_strdupf("%s.%d", path, j);
        if (!bpath) {
            ebb_compiler_oom(c);
            goto out;
        }
        /* ENTER j: (x, route) -> (rows, x_rows) */
        int ein[2] = {x, rout[0]};
        int eout[2] = {-1, -1};
        ebb_tensor *em[2] = {NULL, ebb_compiler_meta_ref(c, x)};
        ebb_shape rows_shape = {1, {batch}};
        em[0] = ebb_compiler_meta_new(c, &rows_shape, EBB_INT64);
        int alias[2] = {-1, x};
        plan_step *enter = (em[0] && em[1])
                               ? emit_control(c, EBB_STEP_ENTER, "enter", bpath, ein, 2, eout, em,
                                              alias, 2)
                               : NULL;
        if (!enter) {
            /* still ours only if emit_control was never called */
            ebb_tensor_free(em[0]);
            ebb_tensor_free(em[1]);
            free(bpath);
            goto out;
        }
        /* rows: no storage in the all-rows walk the prediction follows */
        c->plan->values[eout[0]].nbytes = 0;
        int enter_index = ebb_compiler_step_index(c, enter);
        enter->mode = mode;
        enter->branch = j;
        int y = lower_node(c, st->nodes[j], bpath, sc, &eout[1], 1);
        if (y < 0) {
            free(bpath);
            goto out;
        }
        ebb_plan_value yv = c->plan->values[y];
        ebb_shape as = yv.shape;
        if (as.ndim < 1 || as.dim[0] != batch) {
            c->status = ebb_error_set(EBB_ERR_SHAPE,
                                      "node %s: branch output %s does not keep the batch of %lld rows",
                                      bpath, shape_text(&as, sb, sizeof sb), (long long)batch);
            free(bpath);
            goto out;
        }
        /* one dtype for every branch: a gate weighs its branches' rows by
         * its route table, in their wider dtype */
        ebb_dtype ydt = c->plan->values[y].dtype;
        if (mode != EBB_ROUTE_SWITCH && ydt != c->plan->values[rout[0]].dtype)
            ydt = wider(ydt, c->plan->values[rout[0]].dtype);
        if (acc_has_shape)
            ydt = c->plan->values[acc].dtype;
        if ((y = conform_dtype(c, y, ydt, bpath)) < 0) {
            free(bpath);
            goto out;
        }
        yv = c->plan->values[y];
        if (acc_has_shape && !ebb_shape_equal(&as, &c->plan->values[acc].shape)) {
            c->status = ebb_error_set(EBB_ERR_SHAPE,
                                      "node %s: branch output %s differs from branch 0's %s", bpath,
                                      shape_text(&as, sb, sizeof sb),
                                      shape_text(&c->plan->values[acc].shape, xb, sizeof xb));
            free(bpath);
            goto out;
        }
        /* EXIT j: (y, rows, route, acc) -> acc */
        int xin[4] = {y, eout[0], rout[0], acc};
        int xout[1] = {acc};
        ebb_tensor *xm[1] = {NULL};
        plan_step *exit = emit_control(c, EBB_STEP_EXIT, "exit", bpath, xin, 4, xout, xm, NULL, 1);
        free(bpath);
        if (!exit)
            goto out;
        exit->mode = mode;
        exit->branch = j;
        if (!acc_has_shape) {
            ebb_plan_value *av = &c->plan->values[acc];
            av->shape = as;
            av->dtype = yv.dtype;
            av->nbytes = ebb_shape_numel(&as) * (int64_t)ebb_dtype_size(yv.dtype);
            c->meta[acc] = ebb_compiler_meta_new(c, &as, yv.dtype);
            if (!c->meta[acc])
                goto out;
            acc_has_shape = 1;
        }
        c->plan->steps[enter_index].pub.jump = c->plan->n_steps;
    }
    result = acc;
out:
    free(path);
    return result;
}

/* Lowers a loop's condition on the state and the jump that leaves the loop
 * when (mean(cond) > 0) == sense. Returns the jump's step index, or -1. */
static int emit_loop_test(compiler *c, const graph_step *st, const char *path,
                          const char *cond_path, const scope *sc, int state, int sense) {
    int cv = lower_node(c, st->aux, cond_path, sc, &state, 1);
    if (cv < 0)
        return -1;
    plan_step *j = emit_control(c, EBB_STEP_JUMP_IF, "jump_if", path, &cv, 1, NULL, NULL, NULL, 0);
    if (!j)
        return -1;
    j->sense = sense;
    return ebb_compiler_step_index(c, j);
}

/* One pass of a loop's body over `state`; returns its output, which must
 * have the state's shape, or -1. */
static int lower_body(compiler *c, const graph_step *st, const char *body, const scope *sc,
                      int state) {
    int y = lower_node(c, st->node, body, sc, &state, 1);
    if (y < 0)
        return -1;
    ebb_shape ys = c->plan->values[y].shape, ss = c->plan->values[state].shape;
    if (!ebb_shape_equal(&ys, &ss)) {
        char a[96], b[96];
        c->status = ebb_error_set(EBB_ERR_SHAPE,
                                  "node %s: the loop body maps state %s to %s; a loop body must "
                                  "keep the state's shape",
                                  body, shape_text(&ss, a, sizeof a), shape_text(&ys, b, sizeof b));
        return -1;
    }
    return y;
}

/* A training compile unrolls a `for` loop: each iteration's values are
 * values of their own, so what each iteration's backward reads is simply
 * kept, as a stack of iterations would keep it, and the weights every
 * iteration shares get one gradient per iteration, summed. The steps keep
 * the body's node paths, so errors and parameters name the loop's nodes. */
static int unroll_for(compiler *c, const graph_step *st, const char *spath, const scope *sc,
                      int x) {
    int state = x;
    char *body = ebb_compiler_strdupf("%s.loop.body", spath);
    if (!body)
        return ebb_compiler_oom(c);
    for (int64_t k = 0; k < st->count; k++) {
        c->repeating += k == 1;
        int y = lower_body(c, st, body, sc, state);
        if (y < 0) {
            c->repeating -= k >= 1;
            free(body);
            return -1;
        }
        state = y;
    }
    c->repeating -= st->count >= 2;
    free(body);
    return state;
}

/* A training compile unrolls a while/until loop to its `max` iterations,
 * each test jumping past all the rest: every iteration's values are its
 * own, and the loop's result is a slot each iteration's output is aliased
 * into (the last one run is the result). autodiff.c walks it back,
 * skipping the iterations that did not run. */
#define MAX_UNROLLED 256

static int unroll_while(compiler *c, const graph_step *st, const char *spath, const scope *sc,
                        int x) {
    if (st->count > MAX_UNROLLED) {
        c->status = ebb_error_set(EBB_ERR_UNSUPPORTED,
                                  "node %s.loop: training through a while or until loop of at most "
                                  "%lld iterations is not supported (at most %d)",
                                  spath, (long long)st->count, MAX_UNROLLED);
        return -1;
    }
    char *path = ebb_compiler_strdupf("%s.loop", spath);
    char *body = ebb_compiler_strdupf("%s.loop.body", spath);
    char *cond = ebb_compiler_strdupf("%s.loop.cond", spath);
    int *exits = calloc((size_t)st->count + 1, sizeof *exits);
    int result = -1, n_exits = 0, loop = c->plan->n_counters++;
    if (!path || !body || !cond || !exits) {
        ebb_compiler_oom(c);
        goto out;
    }
    /* s0 := x (the body's own input slot), R := s0 (the result) */
    int s0[1] = {-1}, res[1] = {-1};
    ebb_tensor *m0[1] = {ebb_compiler_meta_ref(c, x)};
    int a0[1] = {x};
    if (!m0[0] || !emit_control(c, EBB_STEP_ALIAS, "alias", path, &x, 1, s0, m0, a0, 1))
        goto out;
    ebb_tensor *mr[1] = {ebb_compiler_meta_ref(c, s0[0])};
    int ar[1] = {s0[0]};
    plan_step *head = mr[0] ? emit_control(c, EBB_STEP_ALIAS, "alias", path, s0, 1, res, mr, ar, 1)
                            : NULL;
    if (!head)
        goto out;
    head->unrolled = 2;
    head->counter = loop;
    int state = s0[0];
    for (int64_t k = 0; k < st->count; k++) {
        c->repeating += k == 1;
        int j = -1;
        if (st->loop == LOOP_WHILE && (j = emit_loop_test(c, st, path, cond, sc, state, 0)) < 0)
            goto fail_iter;
        if (j >= 0)
            exits[n_exits++] = j;
        int y = lower_body(c, st, body, sc, state);
        if ((y = conform_dtype(c, y, c->plan->values[res[0]].dtype, body)) < 0)
            goto fail_iter;
        ebb_tensor *my[1] = {ebb_compiler_meta_ref(c, y)};
        int ay[1] = {y};
        plan_step *al = my[0] ? emit_control(c, EBB_STEP_ALIAS, "alias", path, &y, 1, res, my, ay, 1)
                              : NULL;
        if (!al)
            goto fail_iter;
        al->unrolled = 1;
        al->counter = loop;
        al->branch = (int)k;
        if (st->loop == LOOP_UNTIL && (j = emit_loop_test(c, st, path, cond, sc, y, 1)) < 0)
            goto fail_iter;
        if (st->loop == LOOP_UNTIL)
            exits[n_exits++] = j;
        state = y;
        continue;
    fail_iter:
        c->repeating -= k >= 1;
        goto out;
    }
    c->repeating -= st->count >= 2;
    for (int i = 0; i < n_exits; i++)
        c->plan->steps[exits[i]].pub.jump = c->plan->n_steps;
    result = res[0];
out:
    free(path);
    free(body);
    free(cond);
    free(exits);
    return result;
}

static int lower_loop(compiler *c, const graph_step *st, const char *spath, const scope *sc,
                      int x) {
    if (c->training && st->loop == LOOP_FOR)
        return unroll_for(c, st, spath, sc, x);
    if (c->training)
        return unroll_while(c, st, spath, sc, x);
    char *path = ebb_compiler_strdupf("%s.loop", spath);
    char *body_path = ebb_compiler_strdupf("%s.loop.body", spath);
    char *cond_path = ebb_compiler_strdupf("%s.loop.cond", spath);
    int result = -1;
    if (!path || !body_path || !cond_path) {
        ebb_compiler_oom(c);
        goto out;
    }
    /* The state gets a slot of its own: the body redefines it each iteration. */
    int state[1] = {-1};
    ebb_tensor *sm[1] = {ebb_compiler_meta_ref(c, x)};
    int alias[1] = {x};
    if (!sm[0] || !emit_control(c, EBB_STEP_ALIAS, "alias", path, &x, 1, state, sm, alias, 1))
        goto out;
    int counter = c->plan->n_counters++;
    plan_step *init = ebb_compiler_step_new(c, EBB_STEP_LOOP_INIT, "loop_init", path);
    if (!init)
        goto out;
    init->counter = counter;
    init->limit = st->count; /* a limit of 0 jumps straight past the loop */
    int init_index = ebb_compiler_step_index(c, init);
    int head = c->plan->n_steps;
    int cond_jump = -1;
    /* while: test before the body, leave when the condition is false */
    if (st->loop == LOOP_WHILE && (cond_jump = emit_loop_test(c, st, path, cond_path, sc, state[0], 0)) < 0)
        goto out;
    int y = lower_body(c, st, body_path, sc, state[0]);
    if ((y = conform_dtype(c, y, c->plan->values[state[0]].dtype, body_path)) < 0)
        goto out;
    ebb_tensor *ym[1] = {ebb_compiler_meta_ref(c, y)};
    int alias_y[1] = {y};
    if (!ym[0] || !emit_control(c, EBB_STEP_ALIAS, "alias", path, &y, 1, state, ym, alias_y, 1))
        goto out;
    /* until: test after the body, leave when the condition is true */
    if (st->loop == LOOP_UNTIL && (cond_jump = emit_loop_test(c, st, path, cond_path, sc, state[0], 1)) < 0)
        goto out;
    plan_step *next = ebb_compiler_step_new(c, EBB_STEP_LOOP_NEXT, "loop_next", path);
    if (!next)
        goto out;
    next->counter = counter;
    next->limit = st->count;
    next->pub.jump = head;
    if (cond_jump >= 0)
        c->plan->steps[cond_jump].pub.jump = c->plan->n_steps;
    c->plan->steps[init_index].pub.jump = c->plan->n_steps;
    result = state[0];
out:
    free(path);
    free(body_path);
    free(cond_path);
    return result;
}

/* Lowers a flow's steps. `stream` is the open stream for sub-flows and
 * nested graphs (-1 for the top level, which starts with from). */
static int lower_flow(compiler *c, const ebb_graph *g, const char *prefix, scope *sc, int stream) {
    int open[256];
    int n_open = stream >= 0 ? 1 : 0;
    open[0] = stream;
    int in[65];
    for (int i = 0; i < g->n_steps; i++) {
        const graph_step *st = &g->steps[i];
        if (st->n_nodes > 256 || st->using_tags.n > 64) {
            c->status = ebb_error_set(EBB_ERR_BUILD,
                                      "step %s.%d: at most 256 branches and 64 using tags", prefix, i);
            return -1;
        }
        char *spath = ebb_compiler_strdupf("%s.%d", prefix, i);
        if (!spath)
            return ebb_compiler_oom(c);
        int out = -1, ok = 1;
        switch (st->kind) {
        case STEP_FROM:
        case STEP_THROUGH: {
            int first = st->kind == STEP_FROM ? scope_lookup(sc, g->inputs.items[0]) : open[0];
            int n_in = resolve_using(c, st, sc, spath, first, in);
            out = n_in < 0 ? -1 : lower_node(c, st->node, spath, sc, in, n_in);
            n_open = 1;
            break;
        }
        case STEP_ALSO: {
            char *np = ebb_compiler_strdupf("%s.also", spath);
            if (!np) {
                ok = 0;
                ebb_compiler_oom(c);
                break;
            }
            int y = lower_node(c, st->node, np, sc, &open[0], 1);
            free(np);
            if (y >= 0) {
                int pair[2] = {open[0], y};
                out = ebb_lower_op(c, ebb_op_find("add"), NULL, spath, spath, pair, 2);
            }
            break;
        }
        case STEP_SPLIT: {
            int x = open[0];
            for (int j = 0; j < st->n_nodes && ok; j++) {
                char *np = ebb_compiler_strdupf("%s.split.%d", spath, j);
                open[j] = np ? lower_node(c, st->nodes[j], np, sc, &x, 1) : ebb_compiler_oom(c);
                free(np);
                ok = open[j] >= 0;
            }
            n_open = st->n_nodes;
            out = ok ? open[0] : -1;
            break;
        }
        case STEP_MERGE: {
            char *np = ebb_compiler_strdupf("%s.merge", spath);
            if (st->node) {
                out = np ? lower_node(c, st->node, np, sc, open, n_open) : ebb_compiler_oom(c);
                free(np);
                n_open = 1;
                break;
            }
            const ebb_op *op = ebb_op_find(merge_op_name(st->merge));
            const ebb_attr_value *attrs = NULL;
            if (st->merge == EBB_MERGE_CAT || st->merge == EBB_MERGE_STACK)
                attrs = int_attr(c, st->dim);
            if (np && (attrs || !(st->merge == EBB_MERGE_CAT || st->merge == EBB_MERGE_STACK)))
                out = ebb_lower_op(c, op, attrs, np, np, open, n_open);
            else if (!np)
                ebb_compiler_oom(c);
            free(np);
            n_open = 1;
            break;
        }
        case STEP_GATE: {
            int x = open[0];
            char *rp = ebb_compiler_strdupf("%s.gate.router", spath);
            int w = rp ? lower_node(c, st->aux, rp, sc, &x, 1) : ebb_compiler_oom(c);
            free(rp);
            if (w < 0)
                break;
            if (st->top_k > 0) {
                out = lower_routed(c, st, spath, sc, x, w, EBB_ROUTE_TOPK);
                break;
            }
            ebb_plan_value wv = c->plan->values[w];
            if (wv.shape.ndim != 2 || wv.shape.dim[1] != st->n_nodes) {
                char a[96];
                c->status = ebb_error_set(EBB_ERR_SHAPE,
                                          "node %s.gate.router: router output is %s, expected "
                                          "[batch, %d] weights for %d experts",
                                          spath, shape_text(&wv.shape, a, sizeof a), st->n_nodes,
                                          st->n_nodes);
                break;
            }
            int acc = -1;
            for (int j = 0; j < st->n_nodes; j++) {
                char *ep = ebb_compiler_strdupf("%s.gate.%d", spath, j);
                int y = ep ? lower_node(c, st->nodes[j], ep, sc, &x, 1) : ebb_compiler_oom(c);
                const ebb_attr_value *idx = y >= 0 ? int_attr(c, j) : NULL;
                if (idx) {
                    int mix_in[3] = {acc, w, y};
                    acc = acc < 0 ? ebb_lower_op(c, ebb_op_find("_gate_mix"), idx, ep, ep, mix_in + 1, 2)
                                  : ebb_lower_op(c, ebb_op_find("_gate_mix"), idx, ep, ep, mix_in, 3);
                } else {
                    acc = -1;
                }
                free(ep);
                if (acc < 0)
                    break;
            }
            out = acc;
            break;
        }
        case STEP_SWITCH: {
            int x = open[0];
            char *sp = ebb_compiler_strdupf("%s.switch.selector", spath);
            int sel = sp ? lower_node(c, st->aux, sp, sc, &x, 1) : ebb_compiler_oom(c);
            free(sp);
            if (sel >= 0)
                out = lower_routed(c, st, spath, sc, x, sel, EBB_ROUTE_SWITCH);
            break;
        }
        case STEP_LOOP: out = lower_loop(c, st, spath, sc, open[0]); break;
        case STEP_TAG:
            out = open[0];
            if (scope_bind(c, sc, st->tag, out) != 0)
                out = -1;
            else if (!c->plan->values[out].name)
                c->plan->values[out].name = st->tag;
            break;
        }
        free(spath);
        if (out < 0 || !ok) {
            if (c->status == EBB_OK)
                c->status = ebb_errcode() != EBB_OK ? ebb_errcode() : EBB_ERR_BUILD;
            return -1;
        }
        if (st->kind != STEP_SPLIT)
            open[0] = out;
    }
    return open[0];
}

/* ---- the pass -------------------------------------------------------------- */

int ebb_pass_lower(compiler *c, const ebb_graph *g, const ebb_compile_options *opts) {
    ebb_plan *p = c->plan;
    scope top = {0};
    for (int i = 0; i < g->inputs.n; i++) {
        const ebb_shape *s = &opts->input_shapes[i];
        char buf[96];
        if (s->ndim < 0 || s->ndim > EBB_MAX_DIMS) {
            c->status = ebb_error_set(EBB_ERR_SHAPE, "ebb_compile: input '%s' has %d dims", g->inputs.items[i], s->ndim);
            goto fail;
        }
        int64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) {
            /* refuse shapes whose byte size would overflow int64 */
            if (s->dim[d] > 0 && numel > (INT64_MAX / 16) / s->dim[d]) {
                c->status = ebb_error_set(EBB_ERR_SHAPE, "ebb_compile: input '%s' of shape %s is too large",
                                         g->inputs.items[i], ebb_shape_str(s, buf, sizeof buf));
                goto fail;
            }
            numel *= s->dim[d] > 0 ? s->dim[d] : 1;
        }
        for (int d = 0; d < s->ndim; d++)
            if (s->dim[d] < 0) {
                c->status = ebb_error_set(EBB_ERR_SHAPE, "ebb_compile: input '%s' has shape %s",
                                         g->inputs.items[i], ebb_shape_str(s, buf, sizeof buf));
                goto fail;
            }
        ebb_tensor *m = ebb_compiler_meta_new(c, s, opts->input_dtypes ? opts->input_dtypes[i] : p->dtype);
        if (!m)
            goto fail;
        int slot = ebb_compiler_value_new(c, m, EBB_VALUE_INPUT, -1, -1);
        if (slot < 0)
            goto fail;
        p->values[slot].name = g->inputs.items[i];
        p->inputs[i] = slot;
        p->n_inputs++;
        if (scope_bind(c, &top, g->inputs.items[i], slot) != 0)
            goto fail;
    }
    int y = lower_flow(c, g, "flow", &top, -1);
    if (y < 0)
        goto fail;
    p->outputs[0] = y;
    p->output_names[0] = g->final_name;
    for (int i = 0; i < g->outputs.n; i++) {
        p->outputs[1 + i] = scope_lookup(&top, g->outputs.items[i]);
        p->output_names[1 + i] = g->outputs.items[i];
    }
    for (int i = 0; i < p->n_outputs; i++)
        if (p->values[p->outputs[i]].kind != EBB_VALUE_INPUT)
            p->values[p->outputs[i]].kind = EBB_VALUE_OUTPUT;
    scope_free(&top);
    return 0;

fail:
    scope_free(&top);
    return -1;
}
