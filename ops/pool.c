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

const ebb_op ebb_ops_pool[] = {
    {.name = "max_pool2d", .min_inputs = 1, .max_inputs = 1, .attrs = max_pool_attrs,
     .n_attrs = EBB_COUNT(max_pool_attrs), .forward = max_pool_fwd,
     .doc = "maximum over kernel x kernel windows"},
    {.name = "avg_pool2d", .min_inputs = 1, .max_inputs = 1, .attrs = avg_pool_attrs,
     .n_attrs = EBB_COUNT(avg_pool_attrs), .forward = avg_pool_fwd,
     .doc = "average over kernel x kernel windows"},
    {.name = "adaptive_avg_pool2d", .min_inputs = 1, .max_inputs = 1, .attrs = adaptive_attrs,
     .n_attrs = EBB_COUNT(adaptive_attrs), .forward = adaptive_fwd,
     .doc = "average pooling to a fixed output_size x output_size"},
};
const int ebb_ops_pool_count = EBB_COUNT(ebb_ops_pool);
