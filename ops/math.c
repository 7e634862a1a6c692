/* Small arithmetic ops: scale by a constant, mean and sum over dims. */
#include "ops_internal.h"

static const ebb_attr_spec scale_attrs[] = {
    {.name = "factor", .type = EBB_ATTR_FLOAT, .required = 1, .doc = "the multiplier"},
};

static ebb_status scale_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_affine(out, c->in[0], c->attrs[0].f, 0.0);
}

enum { A_DIMS, A_DIM, A_KEEPDIM };

static const ebb_attr_spec reduce_attrs[] = {
    {.name = "dims", .type = EBB_ATTR_STRING,
     .doc = "dims to reduce, comma-separated (\"1,2\"); with `dim` unset too: all dims"},
    {.name = "dim", .type = EBB_ATTR_INT, .optional = 1, .doc = "a single dim to reduce"},
    {.name = "keepdim", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "keep reduced dims with size 1"},
};

static ebb_status reduce(const ebb_op_call *c, ebb_reduce_op op, ebb_tensor **out) {
    *out = NULL;
    const char *name = c->op ? c->op->name : (op == EBB_REDUCE_SUM ? "sum" : "mean");
    const ebb_attr_value *a = c->attrs;
    int64_t dims[EBB_MAX_DIMS];
    int n = 0;
    ebb_status st = EBB_OK;
    if (a[A_DIMS].set && a[A_DIM].set)
        return ebb_error_set(EBB_ERR_ARG, "%s: give dims or dim, not both", name);
    if (a[A_DIMS].set)
        st = ebb_ops_parse_ints(name, "dims", a[A_DIMS].s, dims, EBB_MAX_DIMS, &n);
    else if (a[A_DIM].set)
        dims[n++] = a[A_DIM].i;
    if (st != EBB_OK)
        return st;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int seen[EBB_MAX_DIMS] = {0};
    for (int i = 0; i < n; i++) {
        if ((st = ebb_ops_check_dim(name, dims[i], &x, &dims[i])) != EBB_OK)
            return st;
        if (seen[dims[i]]++)
            return ebb_error_set(EBB_ERR_ARG, "%s: dim %lld is listed twice", name,
                                 (long long)dims[i]);
    }
    if (a[A_DIMS].set && n == 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: dims=\"%s\" lists no dims", name, a[A_DIMS].s);
    if (n == 0) /* every dim, listed so that keepdim is honoured */
        for (; n < x.ndim; n++)
            dims[n] = n;
    return ebb_tensor_reduce(out, op, c->in[0], dims, n, a[A_KEEPDIM].i != 0);
}

static ebb_status mean_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return reduce(c, EBB_REDUCE_MEAN, out);
}

static ebb_status sum_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return reduce(c, EBB_REDUCE_SUM, out);
}

const ebb_op ebb_ops_math[] = {
    {.name = "scale", .min_inputs = 1, .max_inputs = 1, .attrs = scale_attrs,
     .n_attrs = EBB_COUNT(scale_attrs), .forward = scale_fwd, .doc = "x * factor"},
    {.name = "mean", .min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs,
     .n_attrs = EBB_COUNT(reduce_attrs), .forward = mean_fwd, .doc = "mean over dims"},
    {.name = "sum", .min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs,
     .n_attrs = EBB_COUNT(reduce_attrs), .forward = sum_fwd, .doc = "sum over dims"},
};
const int ebb_ops_math_count = EBB_COUNT(ebb_ops_math);
