/* Normalisation layers with PyTorch's parameters: layer_norm and rms_norm
 * over the last dimension, batch_norm (inference, running statistics) and
 * group_norm over the channel dim 1. */
#include <float.h>

#include "internal.h"
#include "ops_internal.h"

enum { A_EPS, A_AFFINE, A_BIAS };

static const ebb_attr_spec layer_norm_attrs[] = {
    {.name = "eps", .type = EBB_ATTR_FLOAT, .default_number = 1e-5, .doc = "added to the variance"},
    {.name = "affine", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "learned weight and bias"},
    {.name = "bias", .type = EBB_ATTR_BOOL, .default_number = 1,
     .doc = "with affine: a learned bias too (nn.LayerNorm(bias=False) has none)"},
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
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(d), EBB_INIT_ONES, d, 0, 0, 0};
    p[1] = (ebb_param_spec){"bias", EBB_SHAPE(d), EBB_INIT_ZEROS, d, 0, 0, 0};
    *n = a[A_BIAS].i ? 2 : 1;
    return EBB_OK;
}

static ebb_status layer_norm_fwd(const ebb_op_call *c, ebb_tensor **out) {
    const ebb_tensor *w = c->n_params > 0 ? c->params[0] : NULL;
    const ebb_tensor *b = c->n_params > 1 ? c->params[1] : NULL;
    return ebb_tensor_layer_norm(out, c->in[0], 1, w, b, c->attrs[A_EPS].f);
}

/* ---- batch_norm ----------------------------------------------------------- */

enum { BN_FEATURES, BN_EPS, BN_MOMENTUM, BN_AFFINE };

static const ebb_attr_spec batch_norm_attrs[] = {
    {.name = "num_features", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "channels (inferred from the input's dim 1)"},
    {.name = "eps", .type = EBB_ATTR_FLOAT, .default_number = 1e-5, .doc = "added to the variance"},
    {.name = "momentum", .type = EBB_ATTR_FLOAT, .default_number = 0.1,
     .doc = "training only; ignored at inference"},
    {.name = "affine", .type = EBB_ATTR_BOOL, .default_number = 1,
     .doc = "learned weight and bias"},
};

/* The channel count of [N, C, ...]: dim 1, checked against an attribute. */
static ebb_status channels(const char *op, const ebb_attr_value *attr, const char *attr_name,
                           const ebb_shape *x, int64_t *out) {
    char buf[128];
    if (x->ndim < 2)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be [N, C, ...]", op,
                             ebb_shape_str(x, buf, sizeof buf));
    if (attr->set && attr->i != x->dim[1])
        return ebb_error_set(
            EBB_ERR_SHAPE, "%s: %s=%lld but the input %s has %lld channels (dim 1)", op, attr_name,
            (long long)attr->i, ebb_shape_str(x, buf, sizeof buf), (long long)x->dim[1]);
    *out = x->dim[1];
    return EBB_OK;
}

static ebb_status batch_norm_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_param_spec *p, int *n) {
    (void)n_in;
    int64_t c = 0;
    *n = 0;
    ebb_status st = channels("batch_norm", &a[BN_FEATURES], "num_features", &in[0], &c);
    if (st != EBB_OK)
        return st;
    if (a[BN_AFFINE].i) {
        p[(*n)++] = (ebb_param_spec){"weight", EBB_SHAPE(c), EBB_INIT_ONES, c, 0, 0, 0};
        p[(*n)++] = (ebb_param_spec){"bias", EBB_SHAPE(c), EBB_INIT_ZEROS, c, 0, 0, 0};
    }
    p[(*n)++] = (ebb_param_spec){"running_mean", EBB_SHAPE(c), EBB_INIT_ZEROS, c, .buffer = 1};
    p[(*n)++] = (ebb_param_spec){"running_var", EBB_SHAPE(c), EBB_INIT_ONES, c, .buffer = 1};
    p[(*n)++] = (ebb_param_spec){"num_batches_tracked", {0, {0}}, EBB_INIT_ZEROS, 0, .buffer = 1,
                                 .counter = 1};
    return EBB_OK;
}

/* The statistics libtorch's CPU kernels allocate per call: layer_norm keeps
 * a mean and an rstd per normalised row, batch_norm (inference) a scale and
 * shift per channel, in the input's float type (float32 for half types). */
static int64_t stat_bytes(ebb_dtype dt) { return dt == EBB_FLOAT64 ? 8 : 4; }

static int64_t layer_norm_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)a;
    (void)n_in;
    if (in[0].ndim < 1 || in[0].dim[in[0].ndim - 1] == 0)
        return 0;
    int64_t rows = ebb_shape_numel(&in[0]) / in[0].dim[in[0].ndim - 1];
    return 2 * rows * stat_bytes(dt);
}

/* On CUDA each statistic is a block of its own. Measured on an H200 with
 * libtorch 2.11 (tests/gpu, test_op_conformance on the device). */
static int64_t layer_norm_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                         ebb_dtype dt) {
    return 2 * ebb_cuda_block(layer_norm_workspace(a, in, n_in, dt) / 2);
}

static int64_t batch_norm_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)a;
    (void)n_in;
    if (in[0].ndim < 2)
        return 0;
    /* two per-channel vectors (the batch's mean and inverse std); an empty
     * batch takes libtorch 1.13's separate path, measured at four */
    int64_t vectors = ebb_shape_numel(&in[0]) == 0 ? 4 : 2;
    return vectors * in[0].dim[1] * stat_bytes(dt);
}

/* CUDA: an affine batch_norm of 3 or more dims over at most 65535 samples
 * goes to cuDNN, whose inference kernel allocates nothing; otherwise (no
 * weight, 2-D input, bfloat16) libtorch's own kernel makes the two
 * per-channel vectors, a block each. */
static int64_t batch_norm_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                         ebb_dtype dt) {
    if (in[0].ndim < 2)
        return 0;
    int cudnn = a[BN_AFFINE].i && in[0].ndim >= 3 && in[0].dim[0] <= 65535 && dt != EBB_BFLOAT16;
    if (cudnn)
        return 0;
    int64_t vectors = ebb_shape_numel(&in[0]) == 0 ? 4 : 2;
    return vectors * ebb_cuda_block(batch_norm_workspace(a, in, n_in, dt) / vectors);
}

/* batch_norm's parameters in the order params() lists them, checked against
 * the input: [weight, bias,] running_mean, running_var. */
typedef struct bn_params {
    ebb_tensor *weight, *bias, *running_mean, *running_var, *num_batches_tracked;
} bn_params;

static ebb_status bn_params_of(const ebb_op_call *c, bn_params *bp) {
    *bp = (bn_params){0};
    int affine = c->attrs[BN_AFFINE].i != 0;
    int64_t ch = 0;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    ebb_status st = channels("batch_norm", &c->attrs[BN_FEATURES], "num_features", &x, &ch);
    if (st != EBB_OK)
        return st;
    if (c->n_params != (affine ? 5 : 3))
        return ebb_error_set(EBB_ERR_ARG, "batch_norm: expected %d parameters, got %d",
                             affine ? 5 : 3, c->n_params);
    ebb_tensor *const *p = c->params;
    *bp = (bn_params){affine ? p[0] : NULL, affine ? p[1] : NULL, p[affine ? 2 : 0],
                      p[affine ? 3 : 1], p[affine ? 4 : 2]};
    return EBB_OK;
}

static ebb_status batch_norm_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    bn_params bp;
    ebb_status st = bn_params_of(c, &bp);
    if (st != EBB_OK)
        return st;
    return ebb_tensor_batch_norm(out, c->in[0], bp.running_mean, bp.running_var, bp.weight,
                                 bp.bias, c->attrs[BN_EPS].f);
}

/* ---- rms_norm ---------------------------------------------------------------- */

enum { RMS_EPS, RMS_AFFINE };

static const ebb_attr_spec rms_norm_attrs[] = {
    {.name = "eps", .type = EBB_ATTR_FLOAT, .optional = 1,
     .doc = "added to the mean square (default: float32 machine epsilon, float64's for float64)"},
    {.name = "affine", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "learned weight"},
};

static ebb_status rms_norm_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_param_spec *p, int *n) {
    (void)n_in;
    *n = 0;
    if (in[0].ndim < 1)
        return ebb_error_set(EBB_ERR_SHAPE, "rms_norm: input is a scalar");
    if (!a[RMS_AFFINE].i)
        return EBB_OK;
    int64_t d = in[0].dim[in[0].ndim - 1];
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(d), EBB_INIT_ONES, d, 0, 0, 0};
    *n = 1;
    return EBB_OK;
}

/* PyTorch's default (eps=None) is the epsilon of the compute type, which
 * is float32 for every floating dtype but float64. */
static double rms_eps(const ebb_attr_value *a, ebb_dtype dt) {
    return a[RMS_EPS].set ? a[RMS_EPS].f : dt == EBB_FLOAT64 ? DBL_EPSILON : (double)FLT_EPSILON;
}

static ebb_status rms_norm_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    double eps = rms_eps(c->attrs, ebb_tensor_dtype(c->in[0]));
    return ebb_tensor_rms_norm(out, c->in[0], c->n_params > 0 ? c->params[0] : NULL, eps);
}

/* ---- group_norm ---------------------------------------------------------------- */

enum { GN_GROUPS, GN_CHANNELS, GN_EPS, GN_AFFINE };

static const ebb_attr_spec group_norm_attrs[] = {
    {.name = "num_groups", .type = EBB_ATTR_INT, .required = 1,
     .doc = "groups the channels are split into; must divide them"},
    {.name = "num_channels", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "channels (inferred from the input's dim 1)"},
    {.name = "eps", .type = EBB_ATTR_FLOAT, .default_number = 1e-5, .doc = "added to the variance"},
    {.name = "affine", .type = EBB_ATTR_BOOL, .default_number = 1,
     .doc = "learned per-channel weight and bias"},
};

static ebb_status group_norm_check(const ebb_attr_value *a, const ebb_shape *x, int64_t *c) {
    ebb_status st = channels("group_norm", &a[GN_CHANNELS], "num_channels", x, c);
    if (st != EBB_OK)
        return st;
    if (a[GN_GROUPS].i < 1 || *c % a[GN_GROUPS].i != 0) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "group_norm: num_groups=%lld does not divide the %lld channels of "
                             "input %s",
                             (long long)a[GN_GROUPS].i, (long long)*c,
                             ebb_shape_str(x, buf, sizeof buf));
    }
    return EBB_OK;
}

static ebb_status group_norm_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_param_spec *p, int *n) {
    (void)n_in;
    int64_t c = 0;
    *n = 0;
    ebb_status st = group_norm_check(a, &in[0], &c);
    if (st != EBB_OK || !a[GN_AFFINE].i)
        return st;
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(c), EBB_INIT_ONES, c, 0, 0, 0};
    p[1] = (ebb_param_spec){"bias", EBB_SHAPE(c), EBB_INIT_ZEROS, c, 0, 0, 0};
    *n = 2;
    return EBB_OK;
}

static ebb_status group_norm_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    int64_t ch = 0;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    ebb_status st = group_norm_check(c->attrs, &x, &ch);
    if (st != EBB_OK)
        return st;
    return ebb_tensor_group_norm(out, c->in[0], c->attrs[GN_GROUPS].i,
                                 c->n_params > 0 ? c->params[0] : NULL,
                                 c->n_params > 1 ? c->params[1] : NULL, c->attrs[GN_EPS].f);
}

/* group_norm's per-(sample, group) mean and rstd. */
static int64_t group_norm_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)n_in;
    return in[0].ndim >= 1 ? 2 * in[0].dim[0] * a[GN_GROUPS].i * stat_bytes(dt) : 0;
}

/* CUDA: the mean and rstd per (sample, group), and with a weight over more
 * than one position per channel the per-(sample, channel) scale and shift
 * the kernel folds them into, each a block. */
static int64_t group_norm_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                         ebb_dtype dt) {
    (void)n_in;
    if (in[0].ndim < 2 || in[0].dim[0] * in[0].dim[1] == 0)
        return 0;
    int64_t n = in[0].dim[0], c = in[0].dim[1], s = stat_bytes(dt);
    int64_t hxw = ebb_shape_numel(&in[0]) / (n * c);
    int64_t stats = 2 * ebb_cuda_block(n * a[GN_GROUPS].i * s);
    return stats + (a[GN_AFFINE].i && hxw > 1 ? 2 * ebb_cuda_block(n * c * s) : 0);
}

/* rms_norm is x * rsqrt(mean(x^2) + eps) in libtorch ops: x^2 (the input's
 * size) stays alive until x * rsqrt(...) has been made beside it, with the
 * per-row mean and its rsqrt; before that, the mean's scratch and its and
 * eps's Scalar operands (see ebb_ops_wrapped_scalar_bytes) are the
 * transient peak for tiny inputs. The product with the weight comes after
 * the temporaries are gone. */
static int64_t rms_norm_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t numel = ebb_shape_numel(&in[0]), d = in[0].ndim >= 1 ? in[0].dim[in[0].ndim - 1] : 0;
    int64_t e = (int64_t)ebb_dtype_size(dt);
    int64_t mean_scalar = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    if (d == 0)
        return 0;
    if (numel <= 0)
        return mean_scalar; /* an empty batch: the mean still divides by d */
    int64_t x2 = numel * e, rows = numel / d * e;
    int64_t two_pass = ebb_ops_reduce_scratch(numel, numel / d, dt);
    if (two_pass > mean_scalar)
        mean_scalar = two_pass;
    return rows + mean_scalar > x2 + 2 * rows ? rows + mean_scalar : x2 + 2 * rows;
}

/* ---- backward rules ----------------------------------------------------------
 * layer_norm, batch_norm and group_norm run their native_* kernels in
 * training to keep the statistics the *_backward kernels read (saved[0] the
 * mean, saved[1] the rstd or inverse std), and read the input. batch_norm's
 * running_mean and running_var are buffers, not trained: training updates
 * them in place (momentum, unbiased variance) and they get no gradient. */

static ebb_status layer_norm_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    const ebb_tensor *w = c->n_params > 0 ? c->params[0] : NULL;
    const ebb_tensor *b = c->n_params > 1 ? c->params[1] : NULL;
    return ebb_tensor_layer_norm_train(out, &saved[0], &saved[1], c->in[0], 1, w, b,
                                       c->attrs[A_EPS].f);
}
static ebb_status layer_norm_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    const ebb_tensor *w = c->n_params > 0 ? c->params[0] : NULL;
    const ebb_tensor *b = c->n_params > 1 ? c->params[1] : NULL;
    if (c->n_saved < 2)
        return ebb_error_set(EBB_ERR_ARG, "layer_norm backward: mean and rstd were not saved");
    return ebb_tensor_layer_norm_backward(&gin[0], w ? &gp[0] : NULL, b ? &gp[1] : NULL,
                                          c->grad_out, c->in[0], 1, c->saved[0], c->saved[1], w, b);
}

static ebb_status batch_norm_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    *out = NULL;
    bn_params bp;
    ebb_status st = bn_params_of(c, &bp);
    if (st != EBB_OK)
        return st;
    st = ebb_tensor_batch_norm_train(out, &saved[0], &saved[1], c->in[0], bp.running_mean,
                                     bp.running_var, bp.weight, bp.bias, c->attrs[BN_MOMENTUM].f,
                                     c->attrs[BN_EPS].f);
    /* PyTorch counts the batches a training forward has seen */
    if (st == EBB_OK)
        st = ebb_tensor_affine_(bp.num_batches_tracked, 1.0, 1.0);
    return st;
}

static ebb_status batch_norm_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    int affine = c->attrs[BN_AFFINE].i != 0;
    if (c->n_saved < 2)
        return ebb_error_set(EBB_ERR_ARG, "batch_norm backward: batch statistics were not saved");
    return ebb_tensor_batch_norm_backward(&gin[0], affine ? &gp[0] : NULL, affine ? &gp[1] : NULL,
                                          c->grad_out, c->in[0], affine ? c->params[0] : NULL,
                                          c->saved[0], c->saved[1], c->attrs[BN_EPS].f);
}

static ebb_status rms_norm_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    const ebb_tensor *w = c->n_params > 0 ? c->params[0] : NULL;
    return ebb_tensor_rms_norm_backward(&gin[0], w ? &gp[0] : NULL, c->grad_out, c->in[0], w,
                                        rms_eps(c->attrs, ebb_tensor_dtype(c->in[0])));
}

static ebb_status group_norm_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    *out = NULL;
    int64_t ch = 0;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    ebb_status st = group_norm_check(c->attrs, &x, &ch);
    if (st != EBB_OK)
        return st;
    return ebb_tensor_group_norm_train(out, &saved[0], &saved[1], c->in[0], c->attrs[GN_GROUPS].i,
                                       c->n_params > 0 ? c->params[0] : NULL,
                                       c->n_params > 1 ? c->params[1] : NULL, c->attrs[GN_EPS].f);
}
static ebb_status group_norm_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    const ebb_tensor *w = c->n_params > 0 ? c->params[0] : NULL;
    if (c->n_saved < 2)
        return ebb_error_set(EBB_ERR_ARG, "group_norm backward: mean and rstd were not saved");
    return ebb_tensor_group_norm_backward(&gin[0], w ? &gp[0] : NULL, w ? &gp[1] : NULL,
                                          c->grad_out, c->in[0], c->saved[0], c->saved[1], w,
                                          c->attrs[GN_GROUPS].i);
}

/* CUDA: x^2, the per-row mean and its rsqrt, a block each (eps is a Scalar
 * on the CPU there). */
static int64_t rms_norm_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                       ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t numel = ebb_shape_numel(&in[0]), d = in[0].ndim >= 1 ? in[0].dim[in[0].ndim - 1] : 0;
    if (numel <= 0 || d == 0)
        return 0;
    int64_t e = (int64_t)ebb_dtype_size(dt);
    return ebb_cuda_block(numel * e) + 2 * ebb_cuda_block(numel / d * e);
}

/* ---- backward workspace -------------------------------------------------------
 * What libtorch 1.13's CPU kernels allocate beyond the gradients, for a
 * contiguous input (a view such as transpose's output may take other
 * paths):
 *  - native_layer_norm_backward sums the weight's and bias's gradients
 *    through a buffer of {2, threads, N} in the input's dtype;
 *  - native_batch_norm_backward makes the input's gradient twice and drops
 *    the first (the contiguous path allocates it again); an input with one
 *    value per channel and sample ([N, C], [N, C, 1, 1]) or a 4-D one with
 *    one channel takes the channels-last kernel, which sums through
 *    {2, threads, C} (and a C of ones for a missing weight) once the first
 *    is gone;
 *  - native_group_norm_backward keeps two per-(sample, channel) sums;
 *  - rms_norm's derivative is libtorch ops (ebb_tensor_rms_norm_backward):
 *    the largest moment is the input gradient's expression, whose
 *    temporaries all live until it is complete. */

static int64_t layer_norm_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)n_in;
    if (!a[A_AFFINE].i || in[0].ndim < 1)
        return 0;
    /* per-thread partial sums for the weight's gradient and the bias's: the
     * kernel makes both even when there is no bias (measured) */
    int threads = ebb_tensor_num_threads();
    return 2 * (int64_t)(threads > 1 ? threads : 1) * in[0].dim[in[0].ndim - 1] *
           (int64_t)ebb_dtype_size(dt);
}

static int64_t batch_norm_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)n_in;
    int64_t numel = ebb_shape_numel(&in[0]), e = (int64_t)ebb_dtype_size(dt);
    if (in[0].ndim < 2 || numel <= 0)
        return 0;
    int64_t n = in[0].dim[0], c = in[0].dim[1], twice = numel * e;
    if (numel / (n * c) != 1 && !(c == 1 && in[0].ndim == 4))
        return twice;
    int threads = ebb_tensor_num_threads();
    int64_t sums = (2 * (int64_t)(threads > 1 ? threads : 1) * c + (a[BN_AFFINE].i ? 0 : c)) * e;
    return sums > twice ? sums : twice;
}

static int64_t group_norm_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return in[0].ndim >= 2 ? 2 * in[0].dim[0] * in[0].dim[1] * stat_bytes(dt) : 0;
}

/* With r = rsqrt(mean(x^2) + eps) per row (rows R) and N elements:
 *   gx = gy r - x r^3 mean(gy x),  gy = g w (or g itself)
 * keeps r, gy (with a weight), and the expression's seven tensors: gy x,
 * its mean, r^3, x r^3, their product, gy r and gx: 4N + 3R of scratch
 * beside gx, plus gy. The weight's gradient comes first, with two
 * temporaries of N, and never exceeds that; so do the Scalar operands of
 * the means and of eps. Half types compute in float32 copies of the input
 * and the gradient (counted here, but not measured). */
static int64_t rms_norm_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]), d = in[0].ndim >= 1 ? in[0].dim[in[0].ndim - 1] : 1;
    if (n <= 0 || d <= 0)
        return 0;
    int64_t rows = n / d, gy = a[RMS_AFFINE].i ? n : 0;
    if (dt == EBB_FLOAT32 || dt == EBB_FLOAT64)
        return (4 * n + 3 * rows + gy) * (int64_t)ebb_dtype_size(dt);
    /* float32 copies of x and grad, the float32 gx before its cast back */
    return (2 * n + 5 * n + 3 * rows + gy + d) * 4;
}

/* ---- backward and training-forward scratch on CUDA ----------------------------
 * What libtorch 2.11's CUDA kernels allocate beyond the gradients (or the
 * training forward's output and extras), each allocation a block of the
 * caching allocator, for a contiguous input and output gradient.
 *
 * Where a kernel sizes its work by the device (a reduction's split across
 * thread blocks, layer_norm's choice of a two-pass weight gradient), the
 * figures take the most any device allocates. */

/* layer_norm's backward writes the input's gradient and, for up to 65536
 * rows, the weight's and bias's straight from its kernels. Over 65536 rows
 * of fewer than 32 x (multiprocessors / 2) values (2112 on an H100 or H200)
 * it sums each in two passes: partial sums of both, [by, d] in the input's
 * dtype for by = min(32768 / ceil(d / 32), ceil(rows / 32)), then each
 * summed over by into a new gradient while the one allocated first is
 * still held (one [d] beside the results), and the sum's own staging. As
 * the limit on d depends on the device, the figure counts the two passes
 * for every d over 65536 rows, and is a bound (layer_norm_grad). */
static int64_t layer_norm_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                             int n_in, ebb_dtype dt) {
    (void)n_in;
    int64_t numel = ebb_shape_numel(&in[0]), d = in[0].ndim >= 1 ? in[0].dim[in[0].ndim - 1] : 0;
    if (!a[A_AFFINE].i || numel <= 0 || d <= 0)
        return 0;
    int64_t rows = numel / d, e = (int64_t)ebb_dtype_size(dt);
    if (rows <= 64 * 1024)
        return 0;
    int64_t by = 32768 / ebb_ops_ceil_div(d, 32);
    if (by > ebb_ops_ceil_div(rows, 32))
        by = ebb_ops_ceil_div(rows, 32);
    return ebb_cuda_block(d * e) + 2 * ebb_cuda_block(by * d * e) +
           ebb_ops_cuda_sum_staging(by, d, stat_bytes(dt));
}

/* batch_norm's channels-last kernels (Normalization.cuh) reduce over
 * per-channel partial results staged across thread blocks when the grid
 * has 8 or more rows of blocks (flexible_launch_configs): `per` values of
 * acc bytes per channel and row, and one semaphore per column of blocks. */
static int64_t bn_staging(int64_t reduction, int64_t channels, int64_t per, int64_t acc) {
    int64_t bx = ebb_ops_pow2_floor(channels) < 32 ? ebb_ops_pow2_floor(channels) : 32;
    int64_t by = ebb_ops_pow2_floor(ebb_ops_ceil_div(reduction, 16));
    if (by > 512 / bx)
        by = 512 / bx;
    if (bx * by != 512)
        bx = ebb_ops_pow2_floor(channels) < 512 / by ? ebb_ops_pow2_floor(channels) : 512 / by;
    int64_t gy = ebb_ops_ceil_div(reduction, by * 16);
    if (gy > 128)
        gy = 128;
    if (gy < 8)
        return 0;
    return ebb_cuda_block(per * channels * gy * acc) + ebb_cuda_block(4 * ebb_ops_ceil_div(channels, bx));
}

/* Whether native_batch_norm_backward takes the channels-last kernels: a
 * contiguous input with one value per channel and sample ([N, C],
 * [N, C, 1, 1]), whose channel stride is 1, or a 4-D one with one channel,
 * which is channels-last contiguous as well. */
static int bn_channels_last(const ebb_shape *x) {
    int64_t numel = ebb_shape_numel(x);
    return numel / (x->dim[0] * x->dim[1]) == 1 || (x->ndim == 4 && x->dim[1] == 1);
}

/* native_batch_norm_backward on CUDA (libtorch's own kernels: the rule
 * calls it directly, never cuDNN). Any other contiguous input takes the
 * fused kernel, which allocates nothing but the gradients. The
 * channels-last kernels keep two per-channel sums (sum_dy and sum_dy_xmu,
 * in the accumulate type) until the input's gradient is made; their
 * staging, when the grid needs it, is freed before that gradient comes and
 * counts only where it is larger. An input of 2^31 elements or more takes
 * the general path: the two sums, and a one-element weight of ones when
 * there is none. */
static int64_t batch_norm_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                             int n_in, ebb_dtype dt) {
    (void)n_in;
    int64_t numel = ebb_shape_numel(&in[0]);
    if (in[0].ndim < 2 || numel <= 0)
        return 0;
    int64_t c = in[0].dim[1], acc = stat_bytes(dt);
    int64_t sums = 2 * ebb_cuda_block(c * acc);
    if (numel >= INT32_MAX)
        return sums + (a[BN_AFFINE].i ? 0 : ebb_cuda_block(acc));
    if (!bn_channels_last(&in[0]))
        return 0;
    int64_t staging = bn_staging(numel / c, c, 2, acc);
    int64_t grad = ebb_cuda_block(numel * (int64_t)ebb_dtype_size(dt));
    return sums + (staging > grad ? staging - grad : 0);
}

/* native_batch_norm in training on CUDA: the batch's mean and inverse std
 * are the extras, and the running statistics are updated in place. Only
 * the channels-last statistics kernel ([N, C] or [N, C, 1, 1]; a 4-D input
 * with one channel takes the contiguous one here) allocates: its staging
 * of four values per channel and row of blocks, with the semaphores, when
 * the batch is large enough for a grid-wide pass. (Inputs of 2^31 elements
 * or more take a general path through var_mean, not counted here.) */
static int64_t batch_norm_train_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                               int n_in, ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t numel = ebb_shape_numel(&in[0]);
    if (in[0].ndim < 2 || numel <= 0)
        return 0;
    int64_t c = in[0].dim[1];
    if (numel / (in[0].dim[0] * c) != 1)
        return 0;
    return bn_staging(numel / c, c, 4, stat_bytes(dt));
}

/* native_group_norm_backward on CUDA: the output gradient's per-(sample,
 * channel) sums ds and db, and for the input's gradient the coefficients
 * c2 and c3 per (sample, group) and, with a weight over more than one
 * position, c1 per (sample, channel), all in the accumulate type and alive
 * together. One position per channel (HxW = 1) takes a kernel that needs
 * only c2 and c3, but ds and db are allocated before that branch. */
static int64_t group_norm_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                             int n_in, ebb_dtype dt) {
    (void)n_in;
    if (in[0].ndim < 2 || ebb_shape_numel(&in[0]) <= 0)
        return 0;
    int64_t n = in[0].dim[0], c = in[0].dim[1], s = stat_bytes(dt);
    int64_t hxw = ebb_shape_numel(&in[0]) / (n * c);
    int64_t per_channel = ebb_cuda_block(n * c * s);
    int64_t per_group = ebb_cuda_block(n * a[GN_GROUPS].i * s);
    return 2 * per_channel + 2 * per_group + (a[GN_AFFINE].i && hxw > 1 ? per_channel : 0);
}

/* native_group_norm in training: the mean and rstd are the extras, so what
 * remains of the forward's CUDA scratch is the per-(sample, channel) scale
 * and shift it folds a weight into over more than one position. */
static int64_t group_norm_train_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                               int n_in, ebb_dtype dt) {
    (void)n_in;
    if (in[0].ndim < 2 || ebb_shape_numel(&in[0]) <= 0 || !a[GN_AFFINE].i)
        return 0;
    int64_t n = in[0].dim[0], c = in[0].dim[1];
    if (ebb_shape_numel(&in[0]) / (n * c) == 1)
        return 0;
    return 2 * ebb_cuda_block(n * c * stat_bytes(dt));
}

/* rms_norm's derivative on CUDA, each tensor a block (N elements, R rows):
 * the largest moment is again the input gradient's expression, whose
 * temporaries all live until it is complete: r, gy (with a weight), and
 * gy r, r^3, x r^3, gy x, its mean and their product beside gx: 3 blocks of
 * R and 4 of N, 5 with a weight. r's own expression (x^2 and three of R)
 * and the weight's gradient (two of N) come before with less; a
 * reduction's staging (a long last dim, or the weight's sum over many
 * rows) stays under the tensors of N that follow it. Half types work in
 * float32: the copies of the input and the gradient and the expression's
 * five tensors of N are float32, and the call returns gx cast back. */
static int64_t rms_norm_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                           ebb_dtype dt) {
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]), d = in[0].ndim >= 1 ? in[0].dim[in[0].ndim - 1] : 1;
    if (n <= 0 || d <= 0)
        return 0;
    int64_t rows = n / d;
    if (dt == EBB_FLOAT32 || dt == EBB_FLOAT64) {
        int64_t e = (int64_t)ebb_dtype_size(dt), big = ebb_cuda_block(n * e);
        return 3 * ebb_cuda_block(rows * e) + 4 * big + (a[RMS_AFFINE].i ? big : 0);
    }
    int64_t big = ebb_cuda_block(n * 4);
    return 7 * big + 3 * ebb_cuda_block(rows * 4) + (a[RMS_AFFINE].i ? big : 0) -
           ebb_cuda_block(n * (int64_t)ebb_dtype_size(dt));
}

static const ebb_op_grad layer_norm_grad = {.backward = layer_norm_bwd,
                                            .forward_train = layer_norm_train, .n_saved = 2,
                                            .saves_inputs = 1u, .differentiable = 1u,
                                            .workspace = layer_norm_bwd_workspace,
                                            .workspace_cuda = layer_norm_bwd_workspace_cuda,
                                            .workspace_cuda_is_bound = 1};
/* The training forward's batch statistics come out as the two extras; the
 * CPU kernel also holds per-channel temporaries while it updates the
 * running statistics, as many as the tensor layer says. */
static int64_t batch_norm_train_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                          ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return ebb_batch_norm_train_scratch(&in[0], dt);
}
static const ebb_op_grad batch_norm_grad = {.backward = batch_norm_bwd,
                                            .forward_train = batch_norm_train, .n_saved = 2,
                                            .saves_inputs = 1u, .differentiable = 1u,
                                            .workspace = batch_norm_bwd_workspace,
                                            .train_workspace = batch_norm_train_workspace,
                                            .workspace_cuda = batch_norm_bwd_workspace_cuda,
                                            .train_workspace_cuda =
                                                batch_norm_train_workspace_cuda,
                                            .no_recompute = 1};
static const ebb_op_grad rms_norm_grad = {.backward = rms_norm_bwd, .saves_inputs = 1u,
                                          .differentiable = 1u,
                                          .workspace = rms_norm_bwd_workspace,
                                          .workspace_cuda = rms_norm_bwd_workspace_cuda};
static const ebb_op_grad group_norm_grad = {.backward = group_norm_bwd,
                                            .forward_train = group_norm_train, .n_saved = 2,
                                            .saves_inputs = 1u, .differentiable = 1u,
                                            .workspace = group_norm_bwd_workspace,
                                            .workspace_cuda = group_norm_bwd_workspace_cuda,
                                            .train_workspace_cuda =
                                                group_norm_train_workspace_cuda};

const ebb_op ebb_ops_norm[] = {
    {.name = "layer_norm", .min_inputs = 1, .max_inputs = 1, .attrs = layer_norm_attrs, .n_attrs = 3,
     .params = layer_norm_params, .forward = layer_norm_fwd,
     .doc = "normalise the last dimension, then scale and shift",
     .workspace = layer_norm_workspace, .grad = &layer_norm_grad,
     .workspace_cuda = layer_norm_workspace_cuda, .autocast = EBB_AUTOCAST_FULL},
    {.name = "batch_norm", .min_inputs = 1, .max_inputs = 1, .attrs = batch_norm_attrs,
     .n_attrs = EBB_COUNT(batch_norm_attrs), .params = batch_norm_params, .forward = batch_norm_fwd,
     .doc = "inference batch norm over dim 1 with running statistics",
     .workspace = batch_norm_workspace, .grad = &batch_norm_grad,
     .workspace_cuda = batch_norm_workspace_cuda, .autocast = EBB_AUTOCAST_KEEP},
    {.name = "rms_norm", .min_inputs = 1, .max_inputs = 1, .attrs = rms_norm_attrs,
     .n_attrs = EBB_COUNT(rms_norm_attrs), .params = rms_norm_params, .forward = rms_norm_fwd,
     .doc = "x * rsqrt(mean(x^2 over the last dim) + eps) * weight",
     .workspace = rms_norm_workspace, .grad = &rms_norm_grad,
     .workspace_cuda = rms_norm_workspace_cuda, .autocast = EBB_AUTOCAST_FULL},
    {.name = "group_norm", .min_inputs = 1, .max_inputs = 1, .attrs = group_norm_attrs,
     .n_attrs = EBB_COUNT(group_norm_attrs), .params = group_norm_params, .forward = group_norm_fwd,
     .doc = "normalise groups of channels per sample, then scale and shift per channel",
     .workspace = group_norm_workspace, .grad = &group_norm_grad,
     .workspace_cuda = group_norm_workspace_cuda, .autocast = EBB_AUTOCAST_FULL},
};
const int ebb_ops_norm_count = EBB_COUNT(ebb_ops_norm);
