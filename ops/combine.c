/* Ops over several inputs: the merge reductions and cat/stack. They take the
 * stream plus `using` tensors, or the open streams of a merge. */
#include "ops_internal.h"

/* Folds in[1..] into a fresh copy-free result: the first binary op allocates
 * the output, the rest update it in place. */
static ebb_status fold(const ebb_op_call *c, ebb_binary_op op, ebb_tensor **out) {
    ebb_tensor *acc = NULL;
    ebb_status st = ebb_tensor_binary(&acc, op, c->in[0], c->in[1]);
    for (int i = 2; st == EBB_OK && i < c->n_in; i++) {
        ebb_tensor *next = NULL;
        if (op == EBB_ADD) {
            st = ebb_tensor_add_(acc, c->in[i]);
            continue;
        }
        st = ebb_tensor_binary(&next, op, acc, c->in[i]);
        ebb_tensor_free(acc);
        acc = next;
    }
    if (st != EBB_OK) {
        ebb_tensor_free(acc);
        return st;
    }
    *out = acc;
    return EBB_OK;
}

static ebb_status add_fwd(const ebb_op_call *c, ebb_tensor **out) { return fold(c, EBB_ADD, out); }
static ebb_status mul_fwd(const ebb_op_call *c, ebb_tensor **out) { return fold(c, EBB_MUL, out); }
static ebb_status max_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return fold(c, EBB_MAXIMUM, out);
}

static ebb_status average_fwd(const ebb_op_call *c, ebb_tensor **out) {
    ebb_tensor *sum = NULL;
    ebb_status st = fold(c, EBB_ADD, &sum);
    if (st != EBB_OK)
        return st;
    st = ebb_tensor_affine(out, sum, 1.0 / c->n_in, 0.0);
    ebb_tensor_free(sum);
    return st;
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
     .doc = "elementwise mean of its inputs (merge: mean)"},
    {.name = "maximum", .min_inputs = 2, .max_inputs = -1, .forward = max_fwd,
     .doc = "elementwise maximum of its inputs (merge: max)"},
    {.name = "cat", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = cat_fwd, .doc = "concatenate along dim"},
    {.name = "stack", .min_inputs = 1, .max_inputs = -1, .attrs = dim_attr, .n_attrs = 1,
     .forward = stack_fwd, .doc = "stack along a new dim"},
};
const int ebb_ops_combine_count = EBB_COUNT(ebb_ops_combine);
