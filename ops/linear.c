/* linear (PyTorch layout: weight [out, in], bias [out]) and learned_halt. */
#include "ops_internal.h"

enum { A_OUT, A_IN, A_BIAS };

static const ebb_attr_spec linear_attrs[] = {
    {.name = "out", .type = EBB_ATTR_INT, .required = 1, .doc = "output features"},
    {.name = "in", .type = EBB_ATTR_INT, .optional = 1, .doc = "input features (inferred from the input shape)"},
    {.name = "bias", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "add a learned bias"},
};

/* The input feature count: the `in` attribute, checked against the shape. */
static ebb_status in_features(const char *op, const ebb_attr_value *in_attr, const ebb_shape *x,
                              int64_t *out) {
    if (x->ndim < 1)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: input is a scalar; expected [..., in]", op);
    int64_t have = x->dim[x->ndim - 1];
    if (in_attr->set && in_attr->i != have) {
        char buf[96];
        return ebb_error_set(EBB_ERR_SHAPE, "%s: in=%lld but the input %s has %lld features", op,
                             (long long)in_attr->i, ebb_shape_str(x, buf, sizeof buf),
                             (long long)have);
    }
    *out = have;
    return EBB_OK;
}

static ebb_status linear_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_param_spec *p, int *n) {
    (void)n_in;
    int64_t fan_in = 0;
    ebb_status st = in_features("linear", &a[A_IN], &in[0], &fan_in);
    if (st != EBB_OK)
        return st;
    if (a[A_OUT].i < 1)
        return ebb_error_set(EBB_ERR_ARG, "linear: out must be >= 1, got %lld", (long long)a[A_OUT].i);
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(a[A_OUT].i, fan_in), EBB_INIT_UNIFORM_FAN_IN, fan_in, 0, 0, 0};
    *n = 1;
    if (a[A_BIAS].i)
        p[(*n)++] = (ebb_param_spec){"bias", EBB_SHAPE(a[A_OUT].i), EBB_INIT_UNIFORM_FAN_IN, fan_in, 0, 0, 0};
    return EBB_OK;
}

static ebb_status linear_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_linear(out, c->in[0], c->params[0], c->n_params > 1 ? c->params[1] : NULL);
}

static const ebb_attr_spec halt_attrs[] = {
    {.name = "in", .type = EBB_ATTR_INT, .optional = 1, .doc = "input features (inferred from the input shape)"},
};

static ebb_status halt_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_param_spec *p, int *n) {
    (void)n_in;
    int64_t fan_in = 0;
    ebb_status st = in_features("learned_halt", &a[0], &in[0], &fan_in);
    if (st != EBB_OK)
        return st;
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(1, fan_in), EBB_INIT_UNIFORM_FAN_IN, fan_in, 0, 0, 0};
    p[1] = (ebb_param_spec){"bias", EBB_SHAPE(1), EBB_INIT_UNIFORM_FAN_IN, fan_in, 0, 0, 0};
    *n = 2;
    return EBB_OK;
}

static ebb_status halt_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_linear(out, c->in[0], c->params[0], c->params[1]);
}

/* The weight's gradient reads the input; the input's only the weight (a
 * parameter, always at hand). learned_halt is linear(in, 1) and shares the
 * rule: a loop condition is a hard decision (mean > 0) that passes no
 * gradient, so when it only steers a loop the compiler never asks for one
 * and its weights stay as they are, as with PyTorch's `if halt(x).mean() >
 * 0`; read as a value, it differentiates as the linear map it is. */
static ebb_status linear_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    if (c->n_params < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s backward (%s): no weight given", c->op->name,
                             c->node ? c->node : "?");
    /* the input's gradient is one matrix product PyTorch skips when nothing
     * needs it (the first layer's input) */
    return ebb_tensor_linear_backward(c->skip_input_grad & 1u ? NULL : &gin[0], &gp[0],
                                      c->n_params > 1 ? &gp[1] : NULL, c->grad_out, c->in[0],
                                      c->params[0]);
}
/* Matrix products straight into the gradients; the bias's is a sum over the
 * rows, which takes ebb_ops_reduce_scratch's two passes when it has one
 * element (learned_halt's, or linear's with out=1). */
static int64_t bias_sum_scratch(const ebb_shape *x, int64_t out, ebb_dtype dt) {
    if (x->ndim < 1 || x->dim[x->ndim - 1] == 0)
        return 0;
    return ebb_ops_reduce_scratch(ebb_shape_numel(x) / x->dim[x->ndim - 1] * out, out, dt);
}
static int64_t linear_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)n_in;
    return a[A_BIAS].i ? bias_sum_scratch(&in[0], a[A_OUT].i, dt) : 0;
}
static int64_t halt_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return bias_sum_scratch(&in[0], 1, dt);
}
static const ebb_op_grad linear_grad = {.backward = linear_bwd, .saves_inputs = 1u,
                                        .differentiable = 1u, .workspace = linear_bwd_workspace};
static const ebb_op_grad halt_grad = {.backward = linear_bwd, .saves_inputs = 1u,
                                      .differentiable = 1u, .workspace = halt_bwd_workspace};

const ebb_op ebb_ops_linear[] = {
    {.name = "linear", .min_inputs = 1, .max_inputs = 1, .attrs = linear_attrs, .n_attrs = 3,
     .params = linear_params, .forward = linear_fwd, .doc = "x @ weight^T + bias",
     .grad = &linear_grad, .autocast = EBB_AUTOCAST_LOW},
    {.name = "learned_halt", .min_inputs = 1, .max_inputs = 1, .attrs = halt_attrs, .n_attrs = 1,
     .params = halt_params, .forward = halt_fwd,
     .doc = "linear(in, 1): a learned loop condition (true when its mean is > 0)",
     .grad = &halt_grad, .autocast = EBB_AUTOCAST_FULL},
};
const int ebb_ops_linear_count = EBB_COUNT(ebb_ops_linear);
