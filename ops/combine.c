/* Ops over several inputs: the merge reductions, sub and div, and cat/stack.
 * They take the stream plus `using` tensors, or the open streams of a merge. */
#include "ops_internal.h"

/* Two inputs are one binary op. More fold into the output, which stays the
 * only allocation: a chain of binary ops would hold a temporary per input
 * after the second, and the plan would have to count it. */
static ebb_status merge(const ebb_op_call *c, ebb_binary_op op, ebb_tensor **out) {
    return c->n_in == 2 ? ebb_tensor_binary(out, op, c->in[0], c->in[1])
                        : ebb_tensor_fold(out, op, c->in, c->n_in);
}

static ebb_status add_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return merge(c, EBB_ADD, out);
}
static ebb_status mul_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return merge(c, EBB_MUL, out);
}
static ebb_status max_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return merge(c, EBB_MAXIMUM, out);
}
static ebb_status sub_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_binary(out, EBB_SUB, c->in[0], c->in[1]);
}
static ebb_status div_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_binary(out, EBB_DIV, c->in[0], c->in[1]);
}

/* The mean of N streams is their sum, accumulated in the output and scaled
 * there by 1/N. */
static ebb_status average_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_average(out, c->in, c->n_in);
}

/* The inputs' broadcast shape (the output's). */
ebb_shape ebb_ops_broadcast_shape(const ebb_shape *in, int n_in) {
    ebb_shape s = {0};
    for (int i = 0; i < n_in; i++)
        s.ndim = in[i].ndim > s.ndim ? in[i].ndim : s.ndim;
    for (int d = 0; d < s.ndim; d++) {
        int64_t size = 1;
        for (int i = 0; i < n_in; i++) {
            int at = d - (s.ndim - in[i].ndim);
            if (at >= 0 && in[i].dim[at] != 1)
                size = in[i].dim[at];
        }
        s.dim[d] = size;
    }
    return s;
}

/* Elements of the inputs' broadcast shape. */
static int64_t broadcast_numel(const ebb_shape *in, int n_in) {
    ebb_shape s = ebb_ops_broadcast_shape(in, n_in);
    return ebb_shape_numel(&s);
}

/* Scaling by 1/N in place passes libtorch a Scalar, which it wraps in a CPU
 * tensor (and casts to the output's dtype) for the length of the call.
 * Integer inputs (the float32 output's first two are summed in their own
 * type first) go through a temporary of the output's size in that type.
 * Inputs of different dtypes are cast through copies this does not count. */
static int64_t average_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)a;
    if (ebb_ops_is_floating(dt))
        return ebb_ops_scalar_bytes(dt);
    int64_t sum = broadcast_numel(in, n_in) * (int64_t)ebb_dtype_size(dt);
    int64_t scale = ebb_ops_scalar_bytes(EBB_FLOAT32);
    return sum > scale ? sum : scale;
}

/* CUDA: the Scalar stays on the CPU; integer inputs' sum is a block. */
static int64_t average_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    (void)a;
    if (ebb_ops_is_floating(dt))
        return 0;
    return ebb_cuda_block(broadcast_numel(in, n_in) * (int64_t)ebb_dtype_size(dt));
}

static ebb_status cat_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_cat(out, c->in, c->n_in, c->attrs[0].i);
}

static ebb_status stack_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_stack(out, c->in, c->n_in, c->attrs[0].i);
}

/* ---- backward rules ----------------------------------------------------------
 * Every input of a merge is differentiable; each gets the gradient summed
 * back to its own shape where it was broadcast. add and average need their
 * inputs' shapes only (ebb_op_grad_call.in_shapes), not the inputs; mul reads the other factors, maximum which
 * input won (ties split the gradient evenly, as PyTorch's maximum). */

#define ALL_INPUTS 0xffffffffu

static ebb_status fold_bwd(const ebb_op_grad_call *c, ebb_binary_op op, ebb_tensor **gin) {
    if (c->n_in == 1)
        return ebb_tensor_ref(&gin[0], c->grad_out);
    return ebb_tensor_fold_backward(gin, op, c->grad_out, c->in, c->n_in);
}
/* add needs its inputs' shapes only, so it keeps none of them alive. */
static ebb_status add_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < c->n_in; i++)
        if (!(c->skip_input_grad >> i & 1))
            st = ebb_tensor_sum_to(&gin[i], c->grad_out, &c->in_shapes[i]);
    if (st != EBB_OK)
        for (int i = 0; i < c->n_in; i++) {
            ebb_tensor_free(gin[i]);
            gin[i] = NULL;
        }
    return st;
}
static ebb_status mul_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return fold_bwd(c, EBB_MUL, gin);
}
static ebb_status max_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return fold_bwd(c, EBB_MAXIMUM, gin);
}

/* Frees gin[0..n) after a failure. */
static ebb_status drop_grads(ebb_tensor **gin, int n, ebb_status st) {
    for (int i = 0; st != EBB_OK && i < n; i++) {
        ebb_tensor_free(gin[i]);
        gin[i] = NULL;
    }
    return st;
}

/* a - b: a gets the gradient summed to its shape, b its negation. Where b
 * has the output's shape the negation is a new tensor (grad_out itself is
 * not negated in place: it may be a's gradient too); else b's sum is
 * negated in place. */
static ebb_status sub_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_shape out = ebb_tensor_shape(c->grad_out);
    ebb_status st = ebb_tensor_sum_to(&gin[0], c->grad_out, &c->in_shapes[0]);
    if (st == EBB_OK && ebb_shape_equal(&c->in_shapes[1], &out))
        st = ebb_tensor_unary(&gin[1], EBB_NEG, c->grad_out);
    else if (st == EBB_OK && (st = ebb_tensor_sum_to(&gin[1], c->grad_out, &c->in_shapes[1])) ==
                                 EBB_OK)
        st = ebb_tensor_unary_(gin[1], EBB_NEG);
    return drop_grads(gin, 2, st);
}

/* a / b, as derivatives.yaml: a's gradient is q = grad / b, b's is
 * -grad * a / b^2 = -q * out (the output saved, so a need not be), each
 * summed to its input's shape. */
static ebb_status div_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_tensor *q = NULL, *t = NULL;
    ebb_status st = ebb_tensor_binary(&q, EBB_DIV, c->grad_out, c->in[1]);
    if (st == EBB_OK) st = ebb_tensor_sum_to(&gin[0], q, &c->in_shapes[0]);
    if (st == EBB_OK) st = ebb_tensor_binary(&t, EBB_MUL, q, c->out);
    ebb_tensor_free(q);
    if (st == EBB_OK) st = ebb_tensor_unary_(t, EBB_NEG);
    if (st == EBB_OK) st = ebb_tensor_sum_to(&gin[1], t, &c->in_shapes[1]);
    ebb_tensor_free(t);
    return drop_grads(gin, 2, st);
}

/* d(mean)/dx_i = 1/N, summed to x_i's shape. */
static ebb_status average_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_tensor *scaled = NULL;
    ebb_status st = ebb_tensor_affine(&scaled, c->grad_out, 1.0 / c->n_in, 0.0);
    for (int i = 0; st == EBB_OK && i < c->n_in; i++)
        st = ebb_tensor_sum_to(&gin[i], scaled, &c->in_shapes[i]);
    ebb_tensor_free(scaled);
    if (st != EBB_OK)
        for (int i = 0; i < c->n_in; i++) {
            ebb_tensor_free(gin[i]);
            gin[i] = NULL;
        }
    return st;
}

/* cat: each input's slice of the gradient (a view), at its offset. */
static ebb_status cat_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_shape g = ebb_tensor_shape(c->grad_out);
    int64_t dim = 0, at = 0;
    ebb_status st = ebb_ops_check_dim("cat", c->attrs[0].i, &g, &dim);
    for (int i = 0; st == EBB_OK && i < c->n_in; i++) {
        ebb_shape s = c->in_shapes[i];
        if (s.ndim != g.ndim)
            st = ebb_error_set(EBB_ERR_SHAPE, "cat backward: input %d has %d dims, the gradient %d",
                               i, s.ndim, g.ndim);
        else if ((st = ebb_tensor_narrow(&gin[i], c->grad_out, dim, at, s.dim[dim])) == EBB_OK)
            at += s.dim[dim];
    }
    if (st == EBB_OK && at != g.dim[dim])
        st = ebb_error_set(EBB_ERR_SHAPE, "cat backward: inputs cover %lld of the gradient's %lld "
                           "along dim %lld", (long long)at, (long long)g.dim[dim], (long long)dim);
    if (st != EBB_OK)
        for (int i = 0; i < c->n_in; i++) {
            ebb_tensor_free(gin[i]);
            gin[i] = NULL;
        }
    return st;
}

/* stack: input i's gradient is the gradient's i-th slice along the new dim,
 * so nothing of the forward is needed. */
static ebb_status stack_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_shape g = ebb_tensor_shape(c->grad_out);
    int64_t dim = 0;
    ebb_status st = ebb_ops_check_dim("stack", c->attrs[0].i, &g, &dim);
    if (st == EBB_OK && g.dim[dim] != c->n_in)
        st = ebb_error_set(EBB_ERR_SHAPE, "stack backward: the gradient has %lld slices along dim "
                           "%lld for %d inputs", (long long)g.dim[dim], (long long)dim, c->n_in);
    for (int i = 0; st == EBB_OK && i < c->n_in; i++)
        st = ebb_tensor_select(&gin[i], c->grad_out, dim, i);
    if (st != EBB_OK)
        for (int i = 0; i < c->n_in; i++) {
            ebb_tensor_free(gin[i]);
            gin[i] = NULL;
        }
    return st;
}

/* ---- backward workspace -------------------------------------------------------
 * Followed allocation by allocation through ebb_tensor_fold_backward and
 * average_bwd (libtorch 1.13, CPU). An input's gradient is the output's
 * gradient summed to its shape (at::sum_to): a new tensor unless the shapes
 * are equal, when it is the unsummed tensor itself. Each sum may add the
 * two-pass scratch of ebb_ops_reduce_scratch, counted at its largest as a
 * bound (it is 0 with one thread). */

/* Bytes of one element of the gradients: the forward's dtype, float32 for
 * integer inputs (their floating output's). */
static int64_t grad_elem(ebb_dtype dt) {
    return (int64_t)ebb_dtype_size(ebb_ops_is_floating(dt) ? dt : EBB_FLOAT32);
}

/* The largest two-pass scratch of summing the output's gradient to an input. */
static int64_t sum_to_scratch(const ebb_shape *in, int n_in, ebb_dtype dt) {
    int64_t out = broadcast_numel(in, n_in), most = 0;
    for (int i = 0; i < n_in; i++) {
        int64_t s = ebb_ops_reduce_scratch(out, ebb_shape_numel(&in[i]), dt);
        most = s > most ? s : most;
    }
    return most;
}

/* add: each gradient is a sum of grad_out or, made after the sums, a copy
 * of it: nothing beside them but the sums' two-pass scratch. */
static int64_t add_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)a;
    ebb_shape out = ebb_ops_broadcast_shape(in, n_in);
    int64_t e = grad_elem(dt), o = ebb_shape_numel(&out), live = 0, peak = 0;
    for (int i = 0; i < n_in; i++) {
        if (ebb_shape_equal(&in[i], &out))
            continue;
        int64_t r = ebb_shape_numel(&in[i]);
        int64_t now = live + r * e + ebb_ops_reduce_scratch(o, r, dt);
        peak = now > peak ? now : peak;
        live += r * e;
    }
    for (int i = 0; i < n_in; i++)
        live += ebb_shape_equal(&in[i], &out) ? o * e : 0;
    return peak > live ? peak - live : 0;
}

/* mul: input i's gradient is grad_out times every other input, a chain of
 * products of the output's size (the previous one alive while the next is
 * made), then summed to input i's shape; the gradients made so far stay. */
static int64_t mul_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)a;
    ebb_shape out = ebb_ops_broadcast_shape(in, n_in);
    int64_t e = grad_elem(dt), o = ebb_shape_numel(&out) * e;
    int64_t live = 0, peak = 0, chain = n_in > 2 ? 2 * o : o;
    for (int i = 0; i < n_in; i++) {
        peak = live + chain > peak ? live + chain : peak;
        if (ebb_shape_equal(&in[i], &out)) {
            live += o;
            continue;
        }
        int64_t r = ebb_shape_numel(&in[i]) * e;
        int64_t sum = live + o + r + ebb_ops_reduce_scratch(o / e, r / e, dt);
        peak = sum > peak ? sum : peak;
        live += r;
    }
    return peak - live;
}

/* div: q = grad / b, then a's sum of it, then t = q * out (negated in
 * place), then b's sum of t; q goes once t is made (unless it is a's
 * gradient), t after b's sum. A sum to the output's own shape is the
 * tensor itself (a's is then q, b's t). */
static int64_t div_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)a;
    ebb_shape out = ebb_ops_broadcast_shape(in, n_in);
    int64_t e = grad_elem(dt), n = ebb_shape_numel(&out), o = n * e, peak = o, live = o;
    int same_a = ebb_shape_equal(&in[0], &out), same_b = ebb_shape_equal(&in[1], &out);
    int64_t ra = same_a ? 0 : ebb_shape_numel(&in[0]) * e;
    int64_t rb = same_b ? 0 : ebb_shape_numel(&in[1]) * e;
    if (!same_a) {
        int64_t now = live + ra + ebb_ops_reduce_scratch(n, ra / e, dt);
        peak = now > peak ? now : peak;
        live += ra;
    }
    live += o; /* t */
    peak = live > peak ? live : peak;
    if (!same_a)
        live -= o; /* q */
    if (!same_b) {
        int64_t now = live + rb + ebb_ops_reduce_scratch(n, rb / e, dt);
        peak = now > peak ? now : peak;
    }
    int64_t grads = (same_a ? o : ra) + (same_b ? o : rb);
    return peak - grads;
}

/* average: grad_out / N (a Scalar operand, then a tensor of the output's
 * size) is summed to every input; inputs of the output's shape all get that
 * one tensor, so it is scratch only when none has that shape. */
static int64_t average_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                     ebb_dtype dt) {
    (void)a;
    ebb_shape out = ebb_ops_broadcast_shape(in, n_in);
    int64_t e = grad_elem(dt), o = ebb_shape_numel(&out) * e, summed = 0;
    int shared = 0;
    for (int i = 0; i < n_in; i++) {
        if (ebb_shape_equal(&in[i], &out))
            shared = 1;
        else
            summed += ebb_shape_numel(&in[i]) * e;
    }
    int64_t scale = o + ebb_ops_scalar_bytes(ebb_ops_is_floating(dt) ? dt : EBB_FLOAT32);
    int64_t sums = o + summed + sum_to_scratch(in, n_in, dt);
    int64_t peak = scale > sums ? scale : sums;
    return peak - summed - (shared ? o : 0);
}

/* CUDA: the Scalar stays on the CPU, so grad_out / N is the only tensor
 * beside the gradients. Inputs of the output's shape all get that tensor as
 * their gradient, and the others new sums of it, so it is scratch (one
 * block) only when no input has the output's shape. A sum large enough for
 * a grid-wide pass would stage partial sums too (see
 * ebb_ops_no_cuda_scratch); that is not counted. */
static int64_t average_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                          ebb_dtype dt) {
    (void)a;
    ebb_shape out = ebb_ops_broadcast_shape(in, n_in);
    for (int i = 0; i < n_in; i++)
        if (ebb_shape_equal(&in[i], &out))
            return 0;
    return ebb_cuda_block(ebb_shape_numel(&out) * grad_elem(dt));
}

/* maximum: the fold max(max(x0, x1), x2)... is walked backwards from its
 * last input, with the prefixes p_k = max(x0..xk) recomputed first (kept to
 * the end; p_0 is x0 itself). Step i (from n-1 down to 1), with the running
 * gradient g_i of p_i's shape, makes half = g_i / 2 (an int64 Scalar
 * operand), then each of the two sides' gradients as
 * where(a == b, half, g_i).masked_fill(a < b, 0): two bool masks, the
 * where() and the result, all of p_i's shape; input i keeps its side (summed
 * to its shape), and the other side, summed to p_(i-1)'s shape, is the next
 * running gradient. */
/* The walk above; on CUDA (cuda non-zero) each prefix, half, where() result,
 * side and sum is a block of the caching allocator of its own, and so is
 * each of the two bool masks (a == b, then a < b or b < a); half's Scalar
 * stays on the CPU there, and a reduction's per-thread partial results are
 * the CPU's only. As with average, a CUDA sum large enough for a grid-wide
 * pass would also stage partial sums, which is not counted. */
static int64_t max_bwd_walk(const ebb_shape *in, int n_in, ebb_dtype dt, int cuda) {
    if (n_in < 2 || n_in > 64)
        return 0;
#define BYTES(n) (cuda ? ebb_cuda_block(n) : (n))
    ebb_shape p[64];
    int64_t e = grad_elem(dt), live = 0, peak = 0, kept = 0, run = 0;
    p[0] = in[0];
    for (int k = 1; k < n_in; k++) {
        ebb_shape two[2] = {p[k - 1], in[k]};
        p[k] = ebb_ops_broadcast_shape(two, 2);
        if (k < n_in - 1)
            live += BYTES(ebb_shape_numel(&p[k]) * e); /* the prefixes */
    }
    peak = live;
    int64_t scalar = cuda ? 0 : ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    for (int i = n_in - 1; i >= 1; i--) {
        int64_t pe = ebb_shape_numel(&p[i]), h = BYTES(pe * e), m = BYTES(pe);
        int64_t base = live + kept + run; /* prefixes, gradients so far, g_i */
#define PEAK(x) peak = (x) > peak ? (x) : peak
        PEAK(base + scalar + h);     /* half */
        PEAK(base + 3 * h + 2 * m); /* the first side: half, masks, where, result */
        PEAK(base + 4 * h + 2 * m); /* the second side beside the first */
        int64_t now = base + 3 * h; /* half and both sides */
        if (ebb_shape_equal(&in[i], &p[i])) {
            kept += h;
        } else {
            int64_t n = ebb_shape_numel(&in[i]), r = BYTES(n * e);
            PEAK(now + r + (cuda ? 0 : ebb_ops_reduce_scratch(pe, n, dt)));
            now += r;
            kept += r;
        }
        if (ebb_shape_equal(&p[i - 1], &p[i])) {
            run = h; /* the first side is the next running gradient */
        } else {
            int64_t n = ebb_shape_numel(&p[i - 1]), r = BYTES(n * e);
            PEAK(now + r + (cuda ? 0 : ebb_ops_reduce_scratch(pe, n, dt)));
            run = r;
        }
#undef PEAK
    }
#undef BYTES
    return peak - kept - run; /* the last running gradient is input 0's */
}

static int64_t max_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)a;
    return max_bwd_walk(in, n_in, dt, 0);
}

static int64_t max_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    (void)a;
    return max_bwd_walk(in, n_in, dt, 1);
}

static const ebb_op_grad add_grad = {.backward = add_bwd,
                                     .differentiable = ALL_INPUTS,
                                     .workspace = add_bwd_workspace};
static const ebb_op_grad mul_grad = {.backward = mul_bwd, .saves_inputs = ALL_INPUTS,
                                     .differentiable = ALL_INPUTS,
                                     .workspace = mul_bwd_workspace};
/* average and cat read only their inputs' shapes (ebb_op_grad_call.in_shapes) */
static const ebb_op_grad average_grad = {.backward = average_bwd, .differentiable = ALL_INPUTS,
                                         .workspace = average_bwd_workspace,
                                         .workspace_cuda = average_bwd_workspace_cuda};
static const ebb_op_grad max_grad = {.backward = max_bwd, .saves_inputs = ALL_INPUTS,
                                     .differentiable = ALL_INPUTS,
                                     .workspace = max_bwd_workspace,
                                     .workspace_cuda = max_bwd_workspace_cuda};
/* sub's gradients are add's, negated in place or made negated: no more
 * scratch than add's sums */
static const ebb_op_grad sub_grad = {.backward = sub_bwd, .differentiable = ALL_INPUTS,
                                     .workspace = add_bwd_workspace};
/* div reads its divisor and its output */
static const ebb_op_grad div_grad = {.backward = div_bwd, .saves_inputs = 2u, .saves_output = 1,
                                     .differentiable = ALL_INPUTS,
                                     .workspace = div_bwd_workspace};
static const ebb_op_grad cat_grad = {.backward = cat_bwd, .differentiable = ALL_INPUTS};
static const ebb_op_grad stack_grad = {.backward = stack_bwd, .differentiable = ALL_INPUTS};

static const ebb_attr_spec dim_attr[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .default_number = 1, .doc = "dimension to join along"},
};

const ebb_op ebb_ops_combine[] = {
    {.name = "add", .min_inputs = 2, .max_inputs = -1, .forward = add_fwd,
     .doc = "elementwise sum of the stream and the `using` tensors", .grad = &add_grad},
    {.name = "mul", .min_inputs = 2, .max_inputs = -1, .forward = mul_fwd,
     .doc = "elementwise product of the stream and the `using` tensors", .grad = &mul_grad},
    {.name = "average", .min_inputs = 2, .max_inputs = -1, .forward = average_fwd,
     .doc = "elementwise mean of its inputs (merge: mean)", .workspace = average_workspace,
     .grad = &average_grad, .workspace_cuda = average_workspace_cuda},
    {.name = "maximum", .min_inputs = 2, .max_inputs = -1, .forward = max_fwd,
     .doc = "elementwise maximum of its inputs (merge: max)", .grad = &max_grad},
    {.name = "sub", .min_inputs = 2, .max_inputs = 2, .forward = sub_fwd,
     .doc = "the first input minus the second, broadcast", .grad = &sub_grad},
    {.name = "div", .min_inputs = 2, .max_inputs = 2, .forward = div_fwd,
     .doc = "the first input divided by the second, broadcast", .grad = &div_grad},
    {.name = "cat", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = cat_fwd, .doc = "concatenate along dim", .grad = &cat_grad},
    {.name = "stack", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = stack_fwd, .doc = "stack along a new dim", .grad = &stack_grad},
};
const int ebb_ops_combine_count = EBB_COUNT(ebb_ops_combine);
