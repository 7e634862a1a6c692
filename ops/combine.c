/* Ops over several inputs: the merge reductions and cat/stack. They take the
 * stream plus `using` tensors, or the open streams of a merge. */
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

/* The mean of N streams is their sum, accumulated in the output and scaled
 * there by 1/N. */
static ebb_status average_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_average(out, c->in, c->n_in);
}

/* Elements of the inputs' broadcast shape (the output's). */
static int64_t broadcast_numel(const ebb_shape *in, int n_in) {
    int ndim = 0;
    for (int i = 0; i < n_in; i++)
        ndim = in[i].ndim > ndim ? in[i].ndim : ndim;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t size = 1;
        for (int i = 0; i < n_in; i++) {
            int at = d - (ndim - in[i].ndim);
            if (at >= 0 && in[i].dim[at] != 1)
                size = in[i].dim[at];
        }
        numel *= size;
    }
    return numel;
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

static ebb_status cat_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_cat(out, c->in, c->n_in, c->attrs[0].i);
}

static ebb_status stack_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_stack(out, c->in, c->n_in, c->attrs[0].i);
}

/* ---- backward rules ----------------------------------------------------------
 * Every input of a merge is differentiable; each gets the gradient summed
 * back to its own shape where it was broadcast. add and average read their
 * inputs for those shapes only; mul reads the other factors, maximum which
 * input won (ties split the gradient evenly, as PyTorch's maximum). */

#define ALL_INPUTS 0xffffffffu

static ebb_status fold_bwd(const ebb_op_grad_call *c, ebb_binary_op op, ebb_tensor **gin) {
    if (c->n_in == 1)
        return ebb_tensor_ref(&gin[0], c->grad_out);
    return ebb_tensor_fold_backward(gin, op, c->grad_out, c->in, c->n_in);
}
static ebb_status add_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return fold_bwd(c, EBB_ADD, gin);
}
static ebb_status mul_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return fold_bwd(c, EBB_MUL, gin);
}
static ebb_status max_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return fold_bwd(c, EBB_MAXIMUM, gin);
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

static const ebb_op_grad add_grad = {.backward = add_bwd, .saves_inputs = ALL_INPUTS,
                                     .differentiable = ALL_INPUTS};
static const ebb_op_grad mul_grad = {.backward = mul_bwd, .saves_inputs = ALL_INPUTS,
                                     .differentiable = ALL_INPUTS};
/* average and cat read only their inputs' shapes (ebb_op_grad_call.in_shapes) */
static const ebb_op_grad average_grad = {.backward = average_bwd, .differentiable = ALL_INPUTS};
static const ebb_op_grad max_grad = {.backward = max_bwd, .saves_inputs = ALL_INPUTS,
                                     .differentiable = ALL_INPUTS};
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
     .grad = &average_grad},
    {.name = "maximum", .min_inputs = 2, .max_inputs = -1, .forward = max_fwd,
     .doc = "elementwise maximum of its inputs (merge: max)", .grad = &max_grad},
    {.name = "cat", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = cat_fwd, .doc = "concatenate along dim", .grad = &cat_grad},
    {.name = "stack", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = stack_fwd, .doc = "stack along a new dim", .grad = &stack_grad},
};
const int ebb_ops_combine_count = EBB_COUNT(ebb_ops_combine);
