/* 2-D pooling over [N, C, H, W] (or [C, H, W]): max, average, adaptive
 * average. Square windows; no parameters. */
#include "ops_internal.h"

enum { A_KERNEL, A_STRIDE, A_PADDING, A_CEIL, A_COUNT_PAD };

static const ebb_attr_spec max_pool_attrs[] = {
    {.name = "kernel", .type = EBB_ATTR_INT, .required = 1, .doc = "window size (square)"},
    {.name = "stride", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "step between windows (default: kernel)"},
    {.name = "padding", .type = EBB_ATTR_INT, .default_number = 0,
     .doc = "implicit padding on both sides, at most kernel/2"},
    {.name = "ceil_mode", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "round the output size up instead of down"},
};

static const ebb_attr_spec avg_pool_attrs[] = {
    {.name = "kernel", .type = EBB_ATTR_INT, .required = 1, .doc = "window size (square)"},
    {.name = "stride", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "step between windows (default: kernel)"},
    {.name = "padding", .type = EBB_ATTR_INT, .default_number = 0,
     .doc = "implicit zero padding on both sides, at most kernel/2"},
    {.name = "ceil_mode", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "round the output size up instead of down"},
    {.name = "count_include_pad", .type = EBB_ATTR_BOOL, .default_number = 1,
     .doc = "count padded zeros in the average's divisor"},
};

static ebb_status pool_fwd(ebb_pool_op op, const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    const ebb_attr_value *a = c->attrs;
    int64_t k = a[A_KERNEL].i, s = a[A_STRIDE].set ? a[A_STRIDE].i : k, p = a[A_PADDING].i;
    int64_t kernel[2] = {k, k}, stride[2] = {s, s}, padding[2] = {p, p};
    bool count_pad = op == EBB_POOL_AVG ? a[A_COUNT_PAD].i != 0 : true;
    ebb_status st = ebb_tensor_pool2d(out, op, c->in[0], kernel, stride, padding, a[A_CEIL].i != 0,
                                      count_pad);
    if (st != EBB_OK)
        ebb_error_prefix("%s", op == EBB_POOL_MAX ? "max_pool2d" : "avg_pool2d");
    return st;
}

static ebb_status max_pool_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return pool_fwd(EBB_POOL_MAX, c, out);
}

static ebb_status avg_pool_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return pool_fwd(EBB_POOL_AVG, c, out);
}

/* PyTorch's pooling output size along one dim (pooling_output_shape). */
static int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t p, int ceil_mode) {
    int64_t span = in + 2 * p - k + (ceil_mode ? s - 1 : 0);
    int64_t out = (span >= 0 ? span / s : -((-span + s - 1) / s)) + 1;
    if (ceil_mode && (out - 1) * s >= in + p)
        out--;
    return out;
}

/* libtorch's CPU max_pool2d is max_pool2d_with_indices: beside the output it
 * fills an int64 index per output element, then drops it. */
static int64_t max_pool_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)n_in;
    (void)dt;
    const ebb_shape *x = &in[0];
    if (x->ndim != 3 && x->ndim != 4)
        return 0;
    int64_t k = a[A_KERNEL].i, s = a[A_STRIDE].set ? a[A_STRIDE].i : k, p = a[A_PADDING].i;
    if (k < 1 || s < 1)
        return 0;
    int64_t oh = pooled_size(x->dim[x->ndim - 2], k, s, p, a[A_CEIL].i != 0);
    int64_t ow = pooled_size(x->dim[x->ndim - 1], k, s, p, a[A_CEIL].i != 0);
    int64_t planes = x->ndim == 4 ? x->dim[0] * x->dim[1] : x->dim[0];
    return oh > 0 && ow > 0 ? planes * oh * ow * 8 : 0;
}

static const ebb_attr_spec adaptive_attrs[] = {
    {.name = "output_size", .type = EBB_ATTR_INT, .required = 1,
     .doc = "output height and width (square); 1 is global average pooling"},
};

static ebb_status adaptive_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    int64_t s = c->attrs[0].i;
    ebb_status st = ebb_tensor_adaptive_avg_pool2d(out, c->in[0], s, s);
    if (st != EBB_OK)
        ebb_error_prefix("adaptive_avg_pool2d");
    return st;
}

/* An output of 1 x 1 is computed as the mean over H and W (see mean's
 * workspace in math.c). */
static int64_t adaptive_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)n_in;
    if (a[0].i != 1 || (in[0].ndim != 3 && in[0].ndim != 4))
        return 0;
    int64_t scalar = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    int64_t planes = in[0].ndim == 4 ? in[0].dim[0] * in[0].dim[1] : in[0].dim[0];
    int64_t sum = ebb_ops_reduce_scratch(ebb_shape_numel(&in[0]), planes, dt);
    return scalar > sum ? scalar : sum;
}

/* ---- backward rules ---------------------------------------------------------- */

static void pool_geometry(const ebb_attr_value *a, int64_t kernel[2], int64_t stride[2],
                          int64_t padding[2]) {
    int64_t k = a[A_KERNEL].i, s = a[A_STRIDE].set ? a[A_STRIDE].i : k, p = a[A_PADDING].i;
    kernel[0] = kernel[1] = k;
    stride[0] = stride[1] = s;
    padding[0] = padding[1] = p;
}

/* Training max pooling keeps the argmax indices (int64, one per output
 * element) that its backward scatters the gradient to. */
static ebb_status max_pool_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    int64_t k[2], s[2], p[2];
    pool_geometry(c->attrs, k, s, p);
    ebb_status st = ebb_tensor_max_pool2d_train(out, &saved[0], c->in[0], k, s, p,
                                                c->attrs[A_CEIL].i != 0);
    if (st != EBB_OK)
        ebb_error_prefix("max_pool2d");
    return st;
}
static ebb_status max_pool_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    int64_t k[2], s[2], p[2];
    pool_geometry(c->attrs, k, s, p);
    if (c->n_saved < 1 || !c->saved[0])
        return ebb_error_set(EBB_ERR_ARG, "max_pool2d backward: the indices were not saved");
    return ebb_tensor_max_pool2d_backward(&gin[0], c->grad_out, c->in[0], c->saved[0], k, s, p,
                                          c->attrs[A_CEIL].i != 0);
}
/* avg_pool2d's and adaptive pooling's kernels read the input for its shape */
static ebb_status avg_pool_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    int64_t k[2], s[2], p[2];
    pool_geometry(c->attrs, k, s, p);
    return ebb_tensor_avg_pool2d_backward(&gin[0], c->grad_out, c->in[0], k, s, p,
                                          c->attrs[A_CEIL].i != 0, c->attrs[A_COUNT_PAD].i != 0);
}
static ebb_status adaptive_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_adaptive_avg_pool2d_backward(&gin[0], c->grad_out, c->in[0]);
}
static const ebb_op_grad max_pool_grad = {.backward = max_pool_bwd, .forward_train = max_pool_train,
                                          .n_saved = 1, .saves_inputs = 1u, .differentiable = 1u};
static const ebb_op_grad avg_pool_grad = {.backward = avg_pool_bwd, .saves_inputs = 1u,
                                          .differentiable = 1u};
static const ebb_op_grad adaptive_grad = {.backward = adaptive_bwd, .saves_inputs = 1u,
                                          .differentiable = 1u};

const ebb_op ebb_ops_pool[] = {
    {.name = "max_pool2d", .min_inputs = 1, .max_inputs = 1, .attrs = max_pool_attrs,
     .n_attrs = EBB_COUNT(max_pool_attrs), .forward = max_pool_fwd,
     .doc = "maximum over kernel x kernel windows", .workspace = max_pool_workspace,
     .grad = &max_pool_grad},
    {.name = "avg_pool2d", .min_inputs = 1, .max_inputs = 1, .attrs = avg_pool_attrs,
     .n_attrs = EBB_COUNT(avg_pool_attrs), .forward = avg_pool_fwd,
     .doc = "average over kernel x kernel windows", .grad = &avg_pool_grad},
    {.name = "adaptive_avg_pool2d", .min_inputs = 1, .max_inputs = 1, .attrs = adaptive_attrs,
     .n_attrs = EBB_COUNT(adaptive_attrs), .forward = adaptive_fwd,
     .doc = "average pooling to a fixed output_size x output_size",
     .workspace = adaptive_workspace, .grad = &adaptive_grad,
     .workspace_cuda = ebb_ops_no_cuda_scratch},
};
const int ebb_ops_pool_count = EBB_COUNT(ebb_ops_pool);
