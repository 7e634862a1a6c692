/* Normalisation layers with PyTorch's parameters: layer_norm and rms_norm
 * over the last dimension, batch_norm (inference, running statistics) and
 * group_norm over the channel dim 1. */
#include <float.h>

#include "internal.h"
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
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(d), EBB_INIT_ONES, d, 0, 0};
    p[1] = (ebb_param_spec){"bias", EBB_SHAPE(d), EBB_INIT_ZEROS, d, 0, 0};
    *n = 2;
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
        p[(*n)++] = (ebb_param_spec){"weight", EBB_SHAPE(c), EBB_INIT_ONES, c, 0, 0};
        p[(*n)++] = (ebb_param_spec){"bias", EBB_SHAPE(c), EBB_INIT_ZEROS, c, 0, 0};
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
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(d), EBB_INIT_ONES, d, 0, 0};
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
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(c), EBB_INIT_ONES, c, 0, 0};
    p[1] = (ebb_param_spec){"bias", EBB_SHAPE(c), EBB_INIT_ZEROS, c, 0, 0};
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
    if (numel <= 0 || d == 0)
        return 0;
    int64_t x2 = numel * e, rows = numel / d * e;
    int64_t mean_scalar = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
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

static const ebb_op_grad layer_norm_grad = {.backward = layer_norm_bwd,
                                            .forward_train = layer_norm_train, .n_saved = 2,
                                            .saves_inputs = 1u, .differentiable = 1u,
                                            .workspace = layer_norm_bwd_workspace};
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
                                            .no_recompute = 1};
static const ebb_op_grad rms_norm_grad = {.backward = rms_norm_bwd, .saves_inputs = 1u,
                                          .differentiable = 1u,
                                          .workspace = rms_norm_bwd_workspace};
static const ebb_op_grad group_norm_grad = {.backward = group_norm_bwd,
                                            .forward_train = group_norm_train, .n_saved = 2,
                                            .saves_inputs = 1u, .differentiable = 1u,
                                            .workspace = group_norm_bwd_workspace};

const ebb_op ebb_ops_norm[] = {
    {.name = "layer_norm", .min_inputs = 1, .max_inputs = 1, .attrs = layer_norm_attrs, .n_attrs = 2,
     .params = layer_norm_params, .forward = layer_norm_fwd,
     .doc = "normalise the last dimension, then scale and shift",
     .workspace = layer_norm_workspace, .grad = &layer_norm_grad,
     .workspace_cuda = layer_norm_workspace_cuda},
    {.name = "batch_norm", .min_inputs = 1, .max_inputs = 1, .attrs = batch_norm_attrs,
     .n_attrs = EBB_COUNT(batch_norm_attrs), .params = batch_norm_params, .forward = batch_norm_fwd,
     .doc = "inference batch norm over dim 1 with running statistics",
     .workspace = batch_norm_workspace, .grad = &batch_norm_grad,
     .workspace_cuda = batch_norm_workspace_cuda},
    {.name = "rms_norm", .min_inputs = 1, .max_inputs = 1, .attrs = rms_norm_attrs,
     .n_attrs = EBB_COUNT(rms_norm_attrs), .params = rms_norm_params, .forward = rms_norm_fwd,
     .doc = "x * rsqrt(mean(x^2 over the last dim) + eps) * weight",
     .workspace = rms_norm_workspace, .grad = &rms_norm_grad,
     .workspace_cuda = rms_norm_workspace_cuda},
    {.name = "group_norm", .min_inputs = 1, .max_inputs = 1, .attrs = group_norm_attrs,
     .n_attrs = EBB_COUNT(group_norm_attrs), .params = group_norm_params, .forward = group_norm_fwd,
     .doc = "normalise groups of channels per sample, then scale and shift per channel",
     .workspace = group_norm_workspace, .grad = &group_norm_grad,
     .workspace_cuda = group_norm_workspace_cuda},
};
const int ebb_ops_norm_count = EBB_COUNT(ebb_ops_norm);
