/* Small arithmetic ops: scale by a constant, mean and sum over dims. */
#include "ops_internal.h"

static const ebb_attr_spec scale_attrs[] = {
    {.name = "factor", .type = EBB_ATTR_FLOAT, .required = 1, .doc = "the multiplier"},
};

static ebb_status scale_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_affine(out, c->in[0], c->attrs[0].f, 0.0);
}

/* A factor of 1 is a copy. Any other is a Scalar operand; an integer input
 * computes in float32, through a float32 copy of itself. */
static int64_t scale_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                               ebb_dtype dt) {
    (void)n_in;
    if (a[0].f == 1.0)
        return 0;
    if (ebb_ops_is_floating(dt))
        return ebb_ops_scalar_bytes(dt);
    int64_t numel = ebb_shape_numel(&in[0]);
    return ebb_ops_scalar_bytes(EBB_FLOAT32) + (numel > 0 ? numel : 0) * 4;
}

/* CUDA: a Scalar operand stays on the CPU; an integer input's float32 copy
 * is a block on the device. */
static int64_t scale_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)n_in;
    if (a[0].f == 1.0 || ebb_ops_is_floating(dt))
        return 0;
    return ebb_cuda_block(ebb_shape_numel(&in[0]) * 4);
}

enum { A_DIMS, A_DIM, A_KEEPDIM };

static const ebb_attr_spec reduce_attrs[] = {
    {.name = "dims", .type = EBB_ATTR_STRING,
     .doc = "dims to reduce, comma-separated (\"1,2\"); with `dim` unset too: all dims"},
    {.name = "dim", .type = EBB_ATTR_INT, .optional = 1, .doc = "a single dim to reduce"},
    {.name = "keepdim", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "keep reduced dims with size 1"},
};

/* The dims the attributes reduce over an input of shape x, checked and made
 * non-negative, into dims[EBB_MAX_DIMS]; *n gets their count. */
static ebb_status reduced_dims(const char *name, const ebb_attr_value *a, const ebb_shape *x,
                               int64_t *dims, int *n) {
    ebb_status st = EBB_OK;
    *n = 0;
    if (a[A_DIMS].set && a[A_DIM].set)
        return ebb_error_set(EBB_ERR_ARG, "%s: give dims or dim, not both", name);
    if (a[A_DIMS].set)
        st = ebb_ops_parse_ints(name, "dims", a[A_DIMS].s, dims, EBB_MAX_DIMS, n);
    else if (a[A_DIM].set)
        dims[(*n)++] = a[A_DIM].i;
    if (st != EBB_OK)
        return st;
    int seen[EBB_MAX_DIMS] = {0};
    for (int i = 0; i < *n; i++) {
        if ((st = ebb_ops_check_dim(name, dims[i], x, &dims[i])) != EBB_OK)
            return st;
        if (seen[dims[i]]++)
            return ebb_error_set(EBB_ERR_ARG, "%s: dim %lld is listed twice", name,
                                 (long long)dims[i]);
    }
    if (a[A_DIMS].set && *n == 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: dims=\"%s\" lists no dims", name, a[A_DIMS].s);
    if (*n == 0) /* every dim, listed so that keepdim is honoured */
        for (; *n < x->ndim; (*n)++)
            dims[*n] = *n;
    return EBB_OK;
}

static ebb_status reduce(const ebb_op_call *c, ebb_reduce_op op, ebb_tensor **out) {
    *out = NULL;
    const char *name = c->op ? c->op->name : (op == EBB_REDUCE_SUM ? "sum" : "mean");
    int64_t dims[EBB_MAX_DIMS];
    int n = 0;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    ebb_status st = reduced_dims(name, c->attrs, &x, dims, &n);
    if (st != EBB_OK)
        return st;
    return ebb_tensor_reduce(out, op, c->in[0], dims, n, c->attrs[A_KEEPDIM].i != 0);
}

/* The reduction's two-pass scratch (see ebb_ops_reduce_scratch). */
static int64_t reduce_scratch(const char *name, const ebb_attr_value *a, const ebb_shape *x,
                              ebb_dtype dt) {
    int64_t dims[EBB_MAX_DIMS], kept = 1;
    int n = 0, reduced[EBB_MAX_DIMS] = {0};
    if (reduced_dims(name, a, x, dims, &n) != EBB_OK)
        return 0; /* the dry run has reported it */
    for (int i = 0; i < n; i++)
        reduced[dims[i]] = 1;
    for (int d = 0; d < x->ndim; d++)
        kept *= reduced[d] ? 1 : x->dim[d];
    return ebb_ops_reduce_scratch(ebb_shape_numel(x), kept, dt);
}

static ebb_status mean_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return reduce(c, EBB_REDUCE_MEAN, out);
}

/* libtorch's CPU mean is a sum into the output divided in place by the
 * element count, an int64 Scalar (see ebb_ops_wrapped_scalar_bytes); the
 * sum's own scratch is gone by then. */
static int64_t mean_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_dtype dt) {
    (void)n_in;
    int64_t scalar = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    int64_t sum = reduce_scratch("mean", a, &in[0], dt);
    return scalar > sum ? scalar : sum;
}

static int64_t sum_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    (void)n_in;
    return reduce_scratch("sum", a, &in[0], dt);
}

static ebb_status sum_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return reduce(c, EBB_REDUCE_SUM, out);
}

/* ---- backward rules ---------------------------------------------------------- */

static ebb_status scale_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_affine(&gin[0], c->grad_out, c->attrs[0].f, 0.0);
}
/* grad_out times the factor: the forward's Scalar operand again. On CUDA
 * the Scalar stays on the CPU (and the gradient is floating): no scratch. */
static int64_t scale_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    (void)in;
    (void)n_in;
    if (a[0].f == 1.0)
        return 0;
    return ebb_ops_scalar_bytes(ebb_ops_is_floating(dt) ? dt : EBB_FLOAT32);
}
static const ebb_op_grad scale_grad = {.backward = scale_bwd, .differentiable = 1u,
                                       .workspace = scale_bwd_workspace,
                                       .workspace_cuda = ebb_ops_no_cuda_scratch};

/* The gradient is grad_out spread back over the reduced dims: only the
 * input's shape is needed, so the input is not saved. */
static ebb_status reduce_bwd(const ebb_op_grad_call *c, bool mean, ebb_tensor **gin) {
    int64_t dims[EBB_MAX_DIMS];
    int n = 0;
    ebb_shape x = c->in_shapes[0];
    ebb_status st = reduced_dims(c->op->name, c->attrs, &x, dims, &n);
    if (st != EBB_OK)
        return st;
    /* n == 0 (a scalar input) means "all", which is nothing to spread */
    return ebb_tensor_reduce_backward(&gin[0], c->grad_out, &x, dims, n,
                                      c->attrs[A_KEEPDIM].i != 0 || x.ndim == 0, mean);
}
static ebb_status mean_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return reduce_bwd(c, true, gin);
}
static ebb_status sum_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return reduce_bwd(c, false, gin);
}
/* mean's gradient is grad_out spread over the input and divided by the
 * element count, a Scalar operand (sum's is a copy: nothing beside it). On
 * CUDA the Scalar stays on the CPU and the spread is a view: no scratch. */
static int64_t mean_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)a;
    (void)in;
    (void)n_in;
    return ebb_ops_scalar_bytes(dt);
}
static const ebb_op_grad mean_grad = {.backward = mean_bwd, .differentiable = 1u,
                                      .workspace = mean_bwd_workspace,
                                      .workspace_cuda = ebb_ops_no_cuda_scratch};
static const ebb_op_grad sum_grad = {.backward = sum_bwd, .differentiable = 1u};

const ebb_op ebb_ops_math[] = {
    {.name = "scale", .min_inputs = 1, .max_inputs = 1, .attrs = scale_attrs,
     .n_attrs = EBB_COUNT(scale_attrs), .forward = scale_fwd, .doc = "x * factor",
     .workspace = scale_workspace, .grad = &scale_grad, .workspace_cuda = scale_workspace_cuda},
    {.name = "mean", .min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs,
     .n_attrs = EBB_COUNT(reduce_attrs), .forward = mean_fwd, .doc = "mean over dims",
     .workspace = mean_workspace, .grad = &mean_grad, .workspace_cuda = ebb_ops_no_cuda_scratch},
    {.name = "sum", .min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs,
     .n_attrs = EBB_COUNT(reduce_attrs), .forward = sum_fwd, .doc = "sum over dims",
     .workspace = sum_workspace, .grad = &sum_grad},
};
const int ebb_ops_math_count = EBB_COUNT(ebb_ops_math);
