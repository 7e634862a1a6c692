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

static const ebb_attr_spec dim_attr[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .default_number = 1, .doc = "dimension to join along"},
};

const ebb_op ebb_ops_combine[] = {
    {.name = "add", .min_inputs = 2, .max_inputs = -1, .forward = add_fwd,
     .doc = "elementwise sum of the stream and the `using` tensors"},
    {.name = "mul", .min_inputs = 2, .max_inputs = -1, .forward = mul_fwd,
     .doc = "elementwise product of the stream and the `using` tensors"},
    {.name = "average", .min_inputs = 2, .max_inputs = -1, .forward = average_fwd,
     .doc = "elementwise mean of its inputs (merge: mean)", .workspace = average_workspace},
    {.name = "maximum", .min_inputs = 2, .max_inputs = -1, .forward = max_fwd,
     .doc = "elementwise maximum of its inputs (merge: max)"},
    {.name = "cat", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = cat_fwd, .doc = "concatenate along dim"},
    {.name = "stack", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = stack_fwd, .doc = "stack along a new dim"},
};
const int ebb_ops_combine_count = EBB_COUNT(ebb_ops_combine);
