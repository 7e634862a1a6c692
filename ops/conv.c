/* conv1d and conv2d, PyTorch's layout: weight [out, in/groups, k(, k)],
 * bias [out]; square kernels, one stride/padding/dilation for every
 * spatial dim. */
#include "ops_internal.h"

enum { A_OUT, A_IN, A_KERNEL, A_STRIDE, A_PADDING, A_DILATION, A_GROUPS, A_BIAS };

static const ebb_attr_spec conv_attrs[] = {
    {.name = "out", .type = EBB_ATTR_INT, .required = 1, .doc = "output channels"},
    {.name = "in", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "input channels (inferred from the input's channel dim)"},
    {.name = "kernel", .type = EBB_ATTR_INT, .required = 1, .doc = "kernel size (square)"},
    {.name = "stride", .type = EBB_ATTR_INT, .default_number = 1, .doc = "step between windows"},
    {.name = "padding", .type = EBB_ATTR_INT, .default_number = 0,
     .doc = "zeros added on both sides of every spatial dim"},
    {.name = "dilation", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "spacing between kernel elements"},
    {.name = "groups", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "blocked connections; must divide in and out"},
    {.name = "bias", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "add a learned bias"},
};

/* Checks the attributes against the input shape x ([N, C, *spatial] or
 * [C, *spatial]) and returns the input channel count. */
static ebb_status conv_check(const char *op, int nsp, const ebb_attr_value *a, const ebb_shape *x,
                             int64_t *in_channels) {
    char buf[128];
    const char *layout = nsp == 1 ? "[N, C, L] or [C, L]" : "[N, C, H, W] or [C, H, W]";
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be %s", op,
                             ebb_shape_str(x, buf, sizeof buf), layout);
    int cdim = x->ndim - nsp - 1;
    int64_t ch = x->dim[cdim];
    if (a[A_IN].set && a[A_IN].i != ch)
        return ebb_error_set(
            EBB_ERR_SHAPE, "%s: in=%lld but the input %s has %lld channels (dim %d)", op,
            (long long)a[A_IN].i, ebb_shape_str(x, buf, sizeof buf), (long long)ch, cdim);
    int64_t out = a[A_OUT].i, k = a[A_KERNEL].i, g = a[A_GROUPS].i;
    if (out < 1 || k < 1 || a[A_STRIDE].i < 1 || a[A_PADDING].i < 0 || a[A_DILATION].i < 1 || g < 1)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: out=%lld kernel=%lld stride=%lld padding=%lld dilation=%lld "
                             "groups=%lld (need out, kernel, stride, dilation, groups >= 1 and "
                             "padding >= 0)",
                             op, (long long)out, (long long)k, (long long)a[A_STRIDE].i,
                             (long long)a[A_PADDING].i, (long long)a[A_DILATION].i, (long long)g);
    if (ch % g != 0 || out % g != 0)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: groups=%lld must divide in=%lld and out=%lld", op,
                             (long long)g, (long long)ch, (long long)out);
    int64_t span = a[A_DILATION].i * (k - 1) + 1;
    for (int d = x->ndim - nsp; d < x->ndim; d++)
        if (x->dim[d] + 2 * a[A_PADDING].i < span)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: input %s is smaller than kernel %lld (padding %lld, "
                                 "dilation %lld)",
                                 op, ebb_shape_str(x, buf, sizeof buf), (long long)k,
                                 (long long)a[A_PADDING].i, (long long)a[A_DILATION].i);
    *in_channels = ch;
    return EBB_OK;
}

static ebb_status conv_params(const char *op, int nsp, const ebb_attr_value *a,
                              const ebb_shape *in, ebb_param_spec *p, int *n) {
    int64_t ch = 0;
    ebb_status st = conv_check(op, nsp, a, &in[0], &ch);
    if (st != EBB_OK)
        return st;
    int64_t k = a[A_KERNEL].i, per_group = ch / a[A_GROUPS].i;
    int64_t fan_in = per_group * k * (nsp == 2 ? k : 1);
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(a[A_OUT].i, per_group, k), EBB_INIT_UNIFORM_FAN_IN,
                            fan_in};
    if (nsp == 2)
        p[0].shape = EBB_SHAPE(a[A_OUT].i, per_group, k, k);
    *n = 1;
    if (a[A_BIAS].i)
        p[(*n)++] =
            (ebb_param_spec){"bias", EBB_SHAPE(a[A_OUT].i), EBB_INIT_UNIFORM_FAN_IN, fan_in};
    return EBB_OK;
}

static ebb_status conv1d_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_param_spec *p, int *n) {
    (void)n_in;
    return conv_params("conv1d", 1, a, in, p, n);
}

static ebb_status conv2d_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_param_spec *p, int *n) {
    (void)n_in;
    return conv_params("conv2d", 2, a, in, p, n);
}

static ebb_status conv_fwd(const char *op, int nsp, const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    const ebb_attr_value *a = c->attrs;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t ch = 0;
    ebb_status st = conv_check(op, nsp, a, &x, &ch);
    if (st != EBB_OK)
        return st;
    if (c->n_params < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: no weight given", op);
    int64_t stride[2] = {a[A_STRIDE].i, a[A_STRIDE].i};
    int64_t padding[2] = {a[A_PADDING].i, a[A_PADDING].i};
    int64_t dilation[2] = {a[A_DILATION].i, a[A_DILATION].i};
    return ebb_tensor_conv(out, c->in[0], c->params[0], c->n_params > 1 ? c->params[1] : NULL,
                           stride, padding, dilation, a[A_GROUPS].i);
}

static ebb_status conv1d_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return conv_fwd("conv1d", 1, c, out);
}

static ebb_status conv2d_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return conv_fwd("conv2d", 2, c, out);
}

const ebb_op ebb_ops_conv[] = {
    {.name = "conv1d", .min_inputs = 1, .max_inputs = 1, .attrs = conv_attrs,
     .n_attrs = EBB_COUNT(conv_attrs), .params = conv1d_params, .forward = conv1d_fwd,
     .doc = "1-D convolution over [N, C, L]"},
    {.name = "conv2d", .min_inputs = 1, .max_inputs = 1, .attrs = conv_attrs,
     .n_attrs = EBB_COUNT(conv_attrs), .params = conv2d_params, .forward = conv2d_fwd,
     .doc = "2-D convolution over [N, C, H, W]"},
};
const int ebb_ops_conv_count = EBB_COUNT(ebb_ops_conv);
