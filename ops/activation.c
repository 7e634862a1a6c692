/* Elementwise activations, softmax, identity and dropout. */
#include <string.h>

#include "ops_internal.h"

EBB_OPS_UNARY(relu_fwd, EBB_RELU)
EBB_OPS_UNARY(tanh_fwd, EBB_TANH)
EBB_OPS_UNARY(sigmoid_fwd, EBB_SIGMOID)
EBB_OPS_UNARY(silu_fwd, EBB_SILU)

/* gelu's `approximate`, as F.gelu's: "none" (the erf form) or "tanh". */
static ebb_status gelu_kind(const ebb_op_call *c, ebb_unary_op *kind) {
    const char *a = c->attrs[0].s ? c->attrs[0].s : "none";
    if (!strcmp(a, "none") || !strcmp(a, "tanh")) {
        *kind = !strcmp(a, "tanh") ? EBB_GELU_TANH : EBB_GELU;
        return EBB_OK;
    }
    return ebb_error_set(EBB_ERR_ARG, "gelu: approximate '%s' is not none or tanh", a);
}

static ebb_status gelu_fwd(const ebb_op_call *c, ebb_tensor **out) {
    ebb_unary_op kind = EBB_GELU;
    ebb_status st = gelu_kind(c, &kind);
    return st == EBB_OK ? ebb_tensor_unary(out, kind, c->in[0]) : st;
}

static ebb_status gelu_fwd_inplace(const ebb_op_call *c, ebb_tensor *x) {
    ebb_unary_op kind = EBB_GELU;
    ebb_status st = gelu_kind(c, &kind);
    return st == EBB_OK ? ebb_tensor_unary_(x, kind) : st;
}

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

/* ---- backward rules ----------------------------------------------------------
 * As derivatives.yaml: relu, tanh and sigmoid differentiate from their output
 * (so an in-place forward loses nothing), gelu and silu from their input. */

#define UNARY_GRAD(fn, kind, from_output)                                                          \
    static ebb_status fn##_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {    \
        (void)gp;                                                                                  \
        return ebb_tensor_unary_backward(&gin[0], kind, c->grad_out,                               \
                                         from_output ? c->out : c->in[0]);                         \
    }                                                                                              \
    static const ebb_op_grad fn##_grad = {.backward = fn##_bwd,                                    \
                                          .saves_inputs = from_output ? 0u : 1u,                   \
                                          .saves_output = from_output,                             \
                                          .differentiable = 1u};
UNARY_GRAD(relu, EBB_RELU, 1)
UNARY_GRAD(tanh, EBB_TANH, 1)
UNARY_GRAD(sigmoid, EBB_SIGMOID, 1)
UNARY_GRAD(silu, EBB_SILU, 0)

/* gelu differentiates from its input, in the form it was computed. */
static ebb_status gelu_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    const char *a = c->attrs[0].s ? c->attrs[0].s : "none";
    return ebb_tensor_unary_backward(&gin[0], !strcmp(a, "tanh") ? EBB_GELU_TANH : EBB_GELU,
                                     c->grad_out, c->in[0]);
}
static const ebb_op_grad gelu_grad = {.backward = gelu_bwd, .saves_inputs = 1u,
                                      .differentiable = 1u};

/* identity passes the gradient through unchanged. */
static ebb_status identity_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_ref(&gin[0], c->grad_out);
}
static const ebb_op_grad identity_grad = {.backward = identity_bwd, .differentiable = 1u};

/* Training dropout draws its mask from the step's seed and saves it. */
static ebb_status dropout_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    return ebb_tensor_dropout_train(out, &saved[0], c->in[0], c->attrs[0].f, c->seed);
}
static ebb_status dropout_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    if (c->n_saved < 1 || !c->saved[0])
        return ebb_error_set(EBB_ERR_ARG, "dropout backward (%s): the mask was not saved",
                             c->node ? c->node : "?");
    return ebb_tensor_dropout_backward(&gin[0], c->grad_out, c->saved[0], c->attrs[0].f);
}
/* native_dropout_backward is grad * mask * scale: the product with the mask
 * is a temporary of the input's size, alive while the Scalar operand (see
 * ebb_ops_scalar_bytes) and the gradient are made. */
static int64_t dropout_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                     ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return ebb_shape_numel(&in[0]) * (int64_t)ebb_dtype_size(dt) + ebb_ops_scalar_bytes(dt);
}
/* The training forward draws a float32 uniform of the input's size on the
 * CPU and compares it with a Scalar into the mask (an extra the plan
 * counts); once the uniform is gone, the output is x * mask, a temporary of
 * the input's size and dtype, times the scale, a Scalar operand. On CUDA
 * the mask is drawn into its own storage on the device and both directions
 * are one fused kernel (masked_scale) into the result: no scratch. */
static int64_t dropout_train_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                       ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]);
    int64_t draw = n * 4 + ebb_ops_scalar_bytes(EBB_FLOAT32);
    int64_t scale = n * (int64_t)ebb_dtype_size(dt) + ebb_ops_scalar_bytes(dt);
    return draw > scale ? draw : scale;
}
static const ebb_op_grad dropout_grad = {.backward = dropout_bwd, .forward_train = dropout_train,
                                         .n_saved = 1, .differentiable = 1u,
                                         .workspace = dropout_bwd_workspace,
                                         .train_workspace = dropout_train_workspace,
                                         .workspace_cuda = ebb_ops_no_cuda_scratch,
                                         .train_workspace_cuda = ebb_ops_no_cuda_scratch,
                                         .no_recompute = 1};

static ebb_status softmax_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_softmax_backward(&gin[0], c->grad_out, c->out, c->attrs[0].i, false);
}
static ebb_status log_softmax_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_softmax_backward(&gin[0], c->grad_out, c->out, c->attrs[0].i, true);
}
/* On the CPU both kernels write the gradient straight from grad_out and the
 * output. CUDA's softmax_backward first multiplies grad_out by the output
 * into a temporary of the input's size and dtype, which its kernel reads
 * beside the gradient (log_softmax's kernel needs none). */
static int64_t softmax_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                          ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return ebb_cuda_block(ebb_shape_numel(&in[0]) * (int64_t)ebb_dtype_size(dt));
}
static const ebb_op_grad softmax_grad = {.backward = softmax_bwd, .saves_output = 1,
                                         .differentiable = 1u,
                                         .workspace_cuda = softmax_bwd_workspace_cuda};
static const ebb_op_grad log_softmax_grad = {.backward = log_softmax_bwd, .saves_output = 1,
                                             .differentiable = 1u};

static const ebb_attr_spec softmax_attrs[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .default_number = -1, .doc = "dimension to normalise"},
};
static const ebb_attr_spec gelu_attrs[] = {
    {.name = "approximate", .type = EBB_ATTR_STRING, .default_string = "none",
     .doc = "none (the erf form) or tanh, as F.gelu's"},
};
static const ebb_attr_spec dropout_attrs[] = {
    {.name = "p", .type = EBB_ATTR_FLOAT, .default_number = 0.5, .doc = "drop probability (training only)"},
};

/* Dropout at p = 0 gives its input back, in training too (as PyTorch's
 * F.dropout does): lowered to identity, it draws and keeps no mask. */
static int dropout_is_identity(const ebb_attr_value *a) { return a[0].f == 0.0; }

#define SIMPLE(n, f, d, g)                                                                         \
    {.name = n, .min_inputs = 1, .max_inputs = 1, .forward = f, .doc = d,                         \
     .forward_inplace = f##_inplace, .grad = &g}

const ebb_op ebb_ops_activation[] = {
    SIMPLE("relu", relu_fwd, "max(x, 0)", relu_grad),
    {.name = "gelu", .min_inputs = 1, .max_inputs = 1, .attrs = gelu_attrs, .n_attrs = 1,
     .forward = gelu_fwd, .forward_inplace = gelu_fwd_inplace,
     .doc = "Gaussian error linear unit: the erf form, or approximate: tanh", .grad = &gelu_grad},
    SIMPLE("tanh", tanh_fwd, "hyperbolic tangent", tanh_grad),
    SIMPLE("sigmoid", sigmoid_fwd, "1 / (1 + exp(-x))", sigmoid_grad),
    SIMPLE("silu", silu_fwd, "x * sigmoid(x)", silu_grad),
    {.name = "identity", .min_inputs = 1, .max_inputs = 1, .is_view = 1, .forward = identity_fwd,
     .doc = "returns its input", .grad = &identity_grad},
    {.name = "dropout", .min_inputs = 1, .max_inputs = 1, .attrs = dropout_attrs, .n_attrs = 1,
     .is_view = 1, .forward = identity_fwd, .doc = "identity at inference",
     .grad = &dropout_grad, .identity_for = dropout_is_identity},
    {.name = "softmax", .min_inputs = 1, .max_inputs = 1, .attrs = softmax_attrs, .n_attrs = 1,
     .forward = softmax_fwd, .doc = "softmax along dim", .grad = &softmax_grad,
     .autocast = EBB_AUTOCAST_FULL},
    {.name = "log_softmax", .min_inputs = 1, .max_inputs = 1, .attrs = softmax_attrs, .n_attrs = 1,
     .forward = log_softmax_fwd, .doc = "log of softmax along dim",
     .grad = &log_softmax_grad, .autocast = EBB_AUTOCAST_FULL},
};
const int ebb_ops_activation_count = EBB_COUNT(ebb_ops_activation);
