/* Elementwise activations, softmax, identity and dropout. */
#include "ops_internal.h"

#define UNARY(fn, kind)                                                                            \
    static ebb_status fn(const ebb_op_call *c, ebb_tensor **out) {                                 \
        return ebb_tensor_unary(out, kind, c->in[0]);                                              \
    }                                                                                              \
    static ebb_status fn##_inplace(const ebb_op_call *c, ebb_tensor *x) {                          \
        (void)c;                                                                                   \
        return ebb_tensor_unary_(x, kind);                                                         \
    }
UNARY(relu_fwd, EBB_RELU)
UNARY(gelu_fwd, EBB_GELU)
UNARY(tanh_fwd, EBB_TANH)
UNARY(sigmoid_fwd, EBB_SIGMOID)
UNARY(silu_fwd, EBB_SILU)

/* identity and dropout (inference) hand back the input's storage. */
static ebb_status identity_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_ref(out, c->in[0]);
}

static ebb_status softmax_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_softmax(out, c->in[0], c->attrs[0].i);
}

static ebb_status log_softmax_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_log_softmax(out, c->in[0], c->attrs[0].i);
}

static const ebb_attr_spec softmax_attrs[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .default_number = -1, .doc = "dimension to normalise"},
};
static const ebb_attr_spec dropout_attrs[] = {
    {.name = "p", .type = EBB_ATTR_FLOAT, .default_number = 0.5, .doc = "drop probability (training only)"},
};

#define SIMPLE(n, f, d)                                                                            \
    {.name = n, .min_inputs = 1, .max_inputs = 1, .forward = f, .doc = d,                         \
     .forward_inplace = f##_inplace}

const ebb_op ebb_ops_activation[] = {
    SIMPLE("relu", relu_fwd, "max(x, 0)"),
    SIMPLE("gelu", gelu_fwd, "Gaussian error linear unit (erf form)"),
    SIMPLE("tanh", tanh_fwd, "hyperbolic tangent"),
    SIMPLE("sigmoid", sigmoid_fwd, "1 / (1 + exp(-x))"),
    SIMPLE("silu", silu_fwd, "x * sigmoid(x)"),
    {.name = "identity", .min_inputs = 1, .max_inputs = 1, .is_view = 1, .forward = identity_fwd,
     .doc = "returns its input"},
    {.name = "dropout", .min_inputs = 1, .max_inputs = 1, .attrs = dropout_attrs, .n_attrs = 1,
     .is_view = 1, .forward = identity_fwd, .doc = "identity at inference"},
    {.name = "softmax", .min_inputs = 1, .max_inputs = 1, .attrs = softmax_attrs, .n_attrs = 1,
     .forward = softmax_fwd, .doc = "softmax along dim"},
    {.name = "log_softmax", .min_inputs = 1, .max_inputs = 1, .attrs = softmax_attrs, .n_attrs = 1,
     .forward = log_softmax_fwd, .doc = "log of softmax along dim"},
};
const int ebb_ops_activation_count = EBB_COUNT(ebb_ops_activation);
