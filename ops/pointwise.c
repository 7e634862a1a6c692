/* Elementwise math on one input: neg, exp, log, sqrt, rsqrt, abs, sin, cos,
 * pow with a number exponent, and clamp. The arithmetic a LLaMA block writes
 * out (RMSNorm's rsqrt, rotary embeddings' sin and cos, a clamp before a
 * log). Each forward allocates its output only, and runs in place where the
 * compiler allows. (sub and div, on two inputs, are in combine.c.) */
#include <math.h>

#include "ops_internal.h"

EBB_OPS_UNARY(neg_fwd, EBB_NEG)
EBB_OPS_UNARY(exp_fwd, EBB_EXP)
EBB_OPS_UNARY(log_fwd, EBB_LOG)
EBB_OPS_UNARY(sqrt_fwd, EBB_SQRT)
EBB_OPS_UNARY(rsqrt_fwd, EBB_RSQRT)
EBB_OPS_UNARY(abs_fwd, EBB_ABS)
EBB_OPS_UNARY(sin_fwd, EBB_SIN)
EBB_OPS_UNARY(cos_fwd, EBB_COS)

enum { A_EXPONENT = 0 };
enum { A_MIN = 0, A_MAX = 1 };

static ebb_status pow_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_pow(out, c->in[0], c->attrs[A_EXPONENT].f);
}
static ebb_status pow_fwd_inplace(const ebb_op_call *c, ebb_tensor *x) {
    return ebb_tensor_pow_(x, c->attrs[A_EXPONENT].f);
}

/* clamp's bounds: an attribute not given is no bound on that side. */
static double lower(const ebb_attr_value *a) { return a[A_MIN].set ? a[A_MIN].f : -INFINITY; }
static double upper(const ebb_attr_value *a) { return a[A_MAX].set ? a[A_MAX].f : INFINITY; }

static ebb_status clamp_fwd(const ebb_op_call *c, ebb_tensor **out) {
    if (isnan(lower(c->attrs)) || isnan(upper(c->attrs)))
        return ebb_error_set(EBB_ERR_ARG, "clamp: min and max must be numbers, not NaN");
    return ebb_tensor_clamp(out, c->in[0], lower(c->attrs), upper(c->attrs));
}
static ebb_status clamp_fwd_inplace(const ebb_op_call *c, ebb_tensor *x) {
    if (isnan(lower(c->attrs)) || isnan(upper(c->attrs)))
        return ebb_error_set(EBB_ERR_ARG, "clamp: min and max must be numbers, not NaN");
    return ebb_tensor_clamp_(x, lower(c->attrs), upper(c->attrs));
}

/* ---- backward rules ----------------------------------------------------------
 * As derivatives.yaml, each reading its output where that is cheaper (exp,
 * sqrt, rsqrt) and its input otherwise; neg reads nothing. */

#define UNARY_GRAD(name, kind, from_output)                                                        \
    static ebb_status name##_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {  \
        (void)gp;                                                                                  \
        return ebb_tensor_unary_backward(&gin[0], kind, c->grad_out,                               \
                                         from_output ? c->out : c->in[0]);                         \
    }
UNARY_GRAD(exp, EBB_EXP, 1)
UNARY_GRAD(log, EBB_LOG, 0)
UNARY_GRAD(sqrt, EBB_SQRT, 1)
UNARY_GRAD(rsqrt, EBB_RSQRT, 1)
UNARY_GRAD(abs, EBB_ABS, 0)
UNARY_GRAD(sin, EBB_SIN, 0)
UNARY_GRAD(cos, EBB_COS, 0)

static ebb_status neg_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_unary(&gin[0], EBB_NEG, c->grad_out);
}

static ebb_status pow_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_pow_backward(&gin[0], c->grad_out, c->in[0], c->attrs[A_EXPONENT].f);
}

static ebb_status clamp_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_clamp_backward(&gin[0], c->grad_out, c->in[0], lower(c->attrs),
                                     upper(c->attrs));
}

/* sqrt's and rsqrt's gradients end with a product by a number (0.5, -0.5),
 * a Scalar operand; so does pow's (its exponent) unless that is 0, when the
 * gradient is zeros. */
static int64_t scalar_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_dtype dt) {
    (void)a, (void)in, (void)n_in;
    return ebb_ops_scalar_bytes(dt);
}
static int64_t pow_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)in, (void)n_in;
    return a[A_EXPONENT].f == 0.0 ? 0 : ebb_ops_scalar_bytes(dt);
}

/* clamp: the gradient is a copy of grad_out, zeroed where a bound's bool
 * mask (x >= min, then x <= max, negated in place) is false: one mask of
 * the input's elements at a time, made with a Scalar operand. */
static int64_t clamp_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    (void)n_in;
    if (isinf(lower(a)) && isinf(upper(a)))
        return 0;
    return ebb_shape_numel(&in[0]) + ebb_ops_scalar_bytes(dt);
}
static int64_t clamp_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)n_in, (void)dt;
    if (isinf(lower(a)) && isinf(upper(a)))
        return 0;
    return ebb_cuda_block(ebb_shape_numel(&in[0]));
}

#define GRAD(name, from_output, ws)                                                                \
    static const ebb_op_grad name##_grad = {.backward = name##_bwd,                                \
                                            .saves_inputs = from_output ? 0u : 1u,                 \
                                            .saves_output = from_output,                           \
                                            .differentiable = 1u,                                  \
                                            .workspace = ws,                                       \
                                            .workspace_cuda = ebb_ops_no_cuda_scratch};
GRAD(exp, 1, NULL)
GRAD(log, 0, NULL)
GRAD(sqrt, 1, scalar_workspace)
GRAD(rsqrt, 1, scalar_workspace)
GRAD(abs, 0, NULL)
GRAD(sin, 0, NULL)
GRAD(cos, 0, NULL)
GRAD(pow, 0, pow_bwd_workspace)
static const ebb_op_grad neg_grad = {.backward = neg_bwd, .differentiable = 1u};
static const ebb_op_grad clamp_grad = {.backward = clamp_bwd, .saves_inputs = 1u,
                                       .differentiable = 1u, .workspace = clamp_bwd_workspace,
                                       .workspace_cuda = clamp_bwd_workspace_cuda};

static const ebb_attr_spec pow_attrs[] = {
    {.name = "exponent", .type = EBB_ATTR_FLOAT, .required = 1,
     .doc = "the power every element is raised to"},
};
static const ebb_attr_spec clamp_attrs[] = {
    {.name = "min", .type = EBB_ATTR_FLOAT, .optional = 1, .doc = "lower bound (none if not given)"},
    {.name = "max", .type = EBB_ATTR_FLOAT, .optional = 1, .doc = "upper bound (none if not given)"},
};

/* exp, log, rsqrt and pow run in float32 in a bf16 or fp16 plan, as
 * torch.autocast lists them. */
#define POINTWISE(n, f, d, g, cast)                                                                \
    {.name = n, .min_inputs = 1, .max_inputs = 1, .forward = f, .forward_inplace = f##_inplace,   \
     .doc = d, .grad = &g, .autocast = cast}

const ebb_op ebb_ops_pointwise[] = {
    POINTWISE("neg", neg_fwd, "-x", neg_grad, EBB_AUTOCAST_PROMOTE),
    POINTWISE("exp", exp_fwd, "e to the x", exp_grad, EBB_AUTOCAST_FULL),
    POINTWISE("log", log_fwd, "natural logarithm", log_grad, EBB_AUTOCAST_FULL),
    POINTWISE("sqrt", sqrt_fwd, "square root", sqrt_grad, EBB_AUTOCAST_PROMOTE),
    POINTWISE("rsqrt", rsqrt_fwd, "1 / sqrt(x)", rsqrt_grad, EBB_AUTOCAST_FULL),
    POINTWISE("abs", abs_fwd, "|x|", abs_grad, EBB_AUTOCAST_PROMOTE),
    POINTWISE("sin", sin_fwd, "sine (radians)", sin_grad, EBB_AUTOCAST_PROMOTE),
    POINTWISE("cos", cos_fwd, "cosine (radians)", cos_grad, EBB_AUTOCAST_PROMOTE),
    {.name = "pow", .min_inputs = 1, .max_inputs = 1, .attrs = pow_attrs, .n_attrs = 1,
     .forward = pow_fwd, .forward_inplace = pow_fwd_inplace, .doc = "x ** exponent",
     .grad = &pow_grad, .autocast = EBB_AUTOCAST_FULL},
    {.name = "clamp", .min_inputs = 1, .max_inputs = 1, .attrs = clamp_attrs, .n_attrs = 2,
     .forward = clamp_fwd, .forward_inplace = clamp_fwd_inplace,
     .doc = "x limited to [min, max]", .grad = &clamp_grad},
};
const int ebb_ops_pointwise_count = EBB_COUNT(ebb_ops_pointwise);
