/* layer_norm over the last dimension, with PyTorch's affine parameters. */
#include "ops_internal.h"

enum { A_EPS, A_AFFINE };

static const ebb_attr_spec layer_norm_attrs[] = {
    {.name = "eps", .type = EBB_ATTR_FLOAT, .default_number = 1e-5, .doc = "added to the variance"},
    {.name = "affine", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "learned weight and bias"},
};

static ebb_status layer_norm_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_param_spec *p, int *n) {
    (void)n_in;
    *n = 0;
    if (in[0].ndim < 1)
        return ebb_error_set(EBB_ERR_SHAPE, "layer_norm: input is a scalar");
    if (!a[A_AFFINE].i)
        return EBB_OK;
    int64_t d = in[0].dim[in[0].ndim - 1];
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(d), EBB_INIT_ONES, d};
    p[1] = (ebb_param_spec){"bias", EBB_SHAPE(d), EBB_INIT_ZEROS, d};
    *n = 2;
    return EBB_OK;
}

static ebb_status layer_norm_fwd(const ebb_op_call *c, ebb_tensor **out) {
    const ebb_tensor *w = c->n_params > 0 ? c->params[0] : NULL;
    const ebb_tensor *b = c->n_params > 1 ? c->params[1] : NULL;
    return ebb_tensor_layer_norm(out, c->in[0], 1, w, b, c->attrs[A_EPS].f);
}

const ebb_op ebb_ops_norm[] = {
    {.name = "layer_norm", .min_inputs = 1, .max_inputs = 1, .attrs = layer_norm_attrs, .n_attrs = 2,
     .params = layer_norm_params, .forward = layer_norm_fwd,
     .doc = "normalise the last dimension, then scale and shift"},
};
const int ebb_ops_norm_count = EBB_COUNT(ebb_ops_norm);
