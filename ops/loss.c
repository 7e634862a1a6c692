/* Training losses, as torch.nn.functional computes them with its default
 * mean reduction: cross_entropy, nll, mse and bce_with_logits. Each takes
 * the prediction (input 0, the stream) and the target (input 1) and gives a
 * 0-dim loss in the prediction's dtype. A training plan appends one after
 * the forward; the backward rule then starts from the seed gradient 1.
 *
 * The target never gets a gradient: class indices are integers, and a
 * regression or probability target is data. */
#include "ops_internal.h"

enum { CE_LABEL_SMOOTHING, CE_IGNORE_INDEX };
enum { NLL_IGNORE_INDEX };

static const ebb_attr_spec cross_entropy_attrs[] = {
    {.name = "label_smoothing", .type = EBB_ATTR_FLOAT, .default_number = 0,
     .doc = "share of the uniform distribution mixed into the targets, in [0, 1]"},
    {.name = "ignore_index", .type = EBB_ATTR_INT, .default_number = -100,
     .doc = "a target with this value counts for nothing"},
};

static const ebb_attr_spec nll_attrs[] = {
    {.name = "ignore_index", .type = EBB_ATTR_INT, .default_number = -100,
     .doc = "a target with this value counts for nothing"},
};

/* ---- checks, shared by the shape functions and the forwards ----------------- */

/* Scores [B, C] with int64 class indices [B], or [C] with a 0-dim index;
 * or per token, classes last: [B, T, ..., C] with indices [B, T, ...], the
 * loss over all of them as F.cross_entropy(x.view(-1, C), y.view(-1)). */
static ebb_status check_classes(const char *op, const char *what, const ebb_shape *in,
                                const ebb_dtype *dt) {
    char xs[96], ts[96];
    ebb_shape_str(&in[0], xs, sizeof xs);
    ebb_shape_str(&in[1], ts, sizeof ts);
    if (!ebb_ops_is_floating(dt[0]))
        return ebb_error_set(EBB_ERR_ARG, "%s: %s are %s %s; expected a floating dtype", op, what,
                             ebb_dtype_name(dt[0]), xs);
    if (in[0].ndim < 1)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: %s %s must be [..., C] (classes last)", op, what,
                             xs);
    if (dt[1] != EBB_INT64)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: target is %s %s; it needs int64 class indices (%s %s %s)", op,
                             ebb_dtype_name(dt[1]), ts, what, ebb_dtype_name(dt[0]), xs);
    /* the target is the scores' shape without its last (class) dimension */
    int fits = in[1].ndim == in[0].ndim - 1;
    for (int d = 0; fits && d < in[1].ndim; d++)
        fits = in[1].dim[d] == in[0].dim[d];
    if (!fits) {
        ebb_shape want = {in[0].ndim - 1, {0}};
        for (int d = 0; d < want.ndim; d++)
            want.dim[d] = in[0].dim[d];
        char ws[96];
        return ebb_error_set(EBB_ERR_SHAPE, "%s: target %s does not fit %s %s: expected %s", op,
                             ts, what, xs, ebb_shape_str(&want, ws, sizeof ws));
    }
    return EBB_OK;
}

/* A prediction and a target of one shape and one floating dtype. */
static ebb_status check_pair(const char *op, const char *what, const ebb_shape *in,
                             const ebb_dtype *dt) {
    char xs[96], ts[96];
    ebb_shape_str(&in[0], xs, sizeof xs);
    ebb_shape_str(&in[1], ts, sizeof ts);
    if (!ebb_shape_equal(&in[0], &in[1]))
        return ebb_error_set(EBB_ERR_SHAPE, "%s: %s %s and target %s differ in shape", op, what,
                             xs, ts);
    if (!ebb_ops_is_floating(dt[0]) || dt[1] != dt[0])
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: %s %s %s and target %s %s must have one floating dtype", op,
                             what, ebb_dtype_name(dt[0]), xs, ebb_dtype_name(dt[1]), ts);
    return EBB_OK;
}

static ebb_status check_smoothing(double ls) {
    if (!(ls >= 0.0 && ls <= 1.0))
        return ebb_error_set(EBB_ERR_ARG,
                             "cross_entropy: label_smoothing must be in [0, 1], got %g", ls);
    return EBB_OK;
}

/* The inputs' shapes and dtypes, as the shape functions see them. */
static void describe(const ebb_op_call *c, ebb_shape *in, ebb_dtype *dt) {
    for (int i = 0; i < 2; i++) {
        in[i] = ebb_tensor_shape(c->in[i]);
        dt[i] = ebb_tensor_dtype(c->in[i]);
    }
}

/* A failure inside the tensor layer (ATen's "Target 7 is out of bounds."),
 * told with the op and both inputs. */
static ebb_status blame(ebb_status st, const char *op, const char *what, const ebb_shape *in,
                        const ebb_dtype *dt) {
    if (st == EBB_OK)
        return st;
    char xs[96], ts[96];
    return ebb_error_prefix("%s (%s %s %s, target %s %s)", op, what, ebb_dtype_name(dt[0]),
                            ebb_shape_str(&in[0], xs, sizeof xs), ebb_dtype_name(dt[1]),
                            ebb_shape_str(&in[1], ts, sizeof ts));
}

/* ---- shapes: a 0-dim loss in the prediction's dtype ------------------------- */

static ebb_status scalar_out(ebb_shape *out, ebb_dtype *out_dtype, ebb_dtype dt) {
    *out = (ebb_shape){0, {0}};
    *out_dtype = dt;
    return EBB_OK;
}

static ebb_status cross_entropy_shape(const ebb_attr_value *a, const ebb_shape *in,
                                      const ebb_dtype *dt, int n_in, ebb_shape *out,
                                      ebb_dtype *out_dtype) {
    (void)n_in;
    ebb_status st = check_smoothing(a[CE_LABEL_SMOOTHING].f);
    if (st == EBB_OK)
        st = check_classes("cross_entropy", "logits", in, dt);
    return st == EBB_OK ? scalar_out(out, out_dtype, dt[0]) : st;
}

static ebb_status nll_shape(const ebb_attr_value *a, const ebb_shape *in, const ebb_dtype *dt,
                            int n_in, ebb_shape *out, ebb_dtype *out_dtype) {
    (void)a;
    (void)n_in;
    ebb_status st = check_classes("nll", "log_probs", in, dt);
    return st == EBB_OK ? scalar_out(out, out_dtype, dt[0]) : st;
}

static ebb_status mse_shape(const ebb_attr_value *a, const ebb_shape *in, const ebb_dtype *dt,
                            int n_in, ebb_shape *out, ebb_dtype *out_dtype) {
    (void)a;
    (void)n_in;
    ebb_status st = check_pair("mse", "pred", in, dt);
    return st == EBB_OK ? scalar_out(out, out_dtype, dt[0]) : st;
}

static ebb_status bce_shape(const ebb_attr_value *a, const ebb_shape *in, const ebb_dtype *dt,
                            int n_in, ebb_shape *out, ebb_dtype *out_dtype) {
    (void)a;
    (void)n_in;
    ebb_status st = check_pair("bce_with_logits", "logits", in, dt);
    return st == EBB_OK ? scalar_out(out, out_dtype, dt[0]) : st;
}

/* ---- per-token scores ------------------------------------------------------------
 * [B, T, ..., C] scores and [B, T, ...] targets run as [N, C] and [N]: views
 * of the same storage (values are contiguous), so nothing is copied and the
 * kernels' scratch is the [N, C] case's. */

/* x and y as 2-D and 1-D views when x has more than two dimensions, else
 * new handles on them; the caller frees both. */
static ebb_status flat_classes(const ebb_tensor *x, const ebb_tensor *y, ebb_tensor **fx,
                               ebb_tensor **fy) {
    *fx = *fy = NULL;
    ebb_shape xs = ebb_tensor_shape(x);
    if (xs.ndim <= 2) {
        ebb_status st = ebb_tensor_ref(fx, x);
        return st == EBB_OK ? ebb_tensor_ref(fy, y) : st;
    }
    int64_t c = xs.dim[xs.ndim - 1], n = c > 0 ? ebb_shape_numel(&xs) / c : 0;
    ebb_shape s2 = EBB_SHAPE(n, c), s1 = EBB_SHAPE(n);
    ebb_status st = ebb_tensor_reshape(fx, x, &s2);
    if (st == EBB_OK) st = ebb_tensor_reshape(fy, y, &s1);
    if (st != EBB_OK) {
        ebb_tensor_free(*fx);
        *fx = NULL;
    }
    return st;
}

/* A gradient computed flat, back in the scores' shape (a view). */
static ebb_status unflat(ebb_tensor **g, const ebb_shape *shape) {
    if (shape->ndim <= 2) return EBB_OK;
    ebb_tensor *v = NULL;
    ebb_status st = ebb_tensor_reshape(&v, *g, shape);
    ebb_tensor_free(*g);
    *g = v;
    return st;
}

/* ---- forwards ------------------------------------------------------------------ */

/* cross_entropy's forward and training forward: the latter keeps the
 * log-probabilities and the count of counted targets for the backward. */
static ebb_status cross_entropy_run(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    *out = NULL;
    ebb_shape in[2];
    ebb_dtype dt[2];
    describe(c, in, dt);
    ebb_status st = cross_entropy_shape(c->attrs, in, dt, 2, &(ebb_shape){0}, &(ebb_dtype){0});
    if (st != EBB_OK)
        return st;
    ebb_tensor *x = NULL, *y = NULL;
    st = flat_classes(c->in[0], c->in[1], &x, &y);
    if (st == EBB_OK)
        st = ebb_tensor_cross_entropy(out, saved ? &saved[0] : NULL, saved ? &saved[1] : NULL, x,
                                      y, c->attrs[CE_IGNORE_INDEX].i,
                                      c->attrs[CE_LABEL_SMOOTHING].f);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    return blame(st, "cross_entropy", "logits", in, dt);
}

static ebb_status cross_entropy_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return cross_entropy_run(c, out, NULL);
}

static ebb_status cross_entropy_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    return cross_entropy_run(c, out, saved);
}

static ebb_status nll_run(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    *out = NULL;
    ebb_shape in[2];
    ebb_dtype dt[2];
    describe(c, in, dt);
    ebb_status st = check_classes("nll", "log_probs", in, dt);
    if (st != EBB_OK)
        return st;
    ebb_tensor *x = NULL, *y = NULL;
    st = flat_classes(c->in[0], c->in[1], &x, &y);
    if (st == EBB_OK)
        st = ebb_tensor_nll_loss(out, saved ? &saved[0] : NULL, x, y,
                                 c->attrs[NLL_IGNORE_INDEX].i);
    ebb_tensor_free(x);
    ebb_tensor_free(y);
    return blame(st, "nll", "log_probs", in, dt);
}

static ebb_status nll_fwd(const ebb_op_call *c, ebb_tensor **out) { return nll_run(c, out, NULL); }

static ebb_status nll_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    return nll_run(c, out, saved);
}

static ebb_status mse_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape in[2];
    ebb_dtype dt[2];
    describe(c, in, dt);
    ebb_status st = check_pair("mse", "pred", in, dt);
    if (st != EBB_OK)
        return st;
    return blame(ebb_tensor_mse_loss(out, c->in[0], c->in[1]), "mse", "pred", in, dt);
}

static ebb_status bce_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape in[2];
    ebb_dtype dt[2];
    describe(c, in, dt);
    ebb_status st = check_pair("bce_with_logits", "logits", in, dt);
    if (st != EBB_OK)
        return st;
    return blame(ebb_tensor_bce_with_logits(out, c->in[0], c->in[1]), "bce_with_logits", "logits",
                 in, dt);
}

/* ---- workspace ---------------------------------------------------------------------
 * What libtorch 1.13's CPU kernels allocate inside one call, beyond the
 * output (forward) or the gradient (backward); e is the element size, S a
 * Scalar operand (see ebb_ops_scalar_bytes). */

static int64_t elem(ebb_dtype dt) { return (int64_t)ebb_dtype_size(dt); }

/* cross_entropy's and nll's rows: B of [B, C], 1 for one sample's [C]. */
/* The rows the loss runs over: [B, C] has B, per-token scores [B, T, C]
 * flattened B*T (flat_classes, below), [C] one. */
static int64_t rows_of(const ebb_shape *x) {
    return x->ndim >= 2 && x->dim[x->ndim - 1] > 0 ? ebb_shape_numel(x) / x->dim[x->ndim - 1] : 1;
}

/* The label-smoothing term in the forward: the per-row sums of the
 * log-probabilities beside the bool mask of ignored targets and the int64
 * Scalar of the comparison, or later its 0-dim sum beside the Scalar that
 * scales it. */
static int64_t smoothing_scratch(const ebb_shape *x, ebb_dtype dt) {
    int64_t e = elem(dt), b = rows_of(x);
    int64_t sums = b * e + b + 8, scale = e + ebb_ops_scalar_bytes(dt);
    return sums > scale ? sums : scale;
}

/* log_softmax's output and nll's total_weight (which a training forward
 * keeps as its two extras), plus the smoothing term's scratch. */
static int64_t cross_entropy_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                       ebb_dtype dt) {
    (void)n_in;
    int64_t e = elem(dt);
    int64_t w = ebb_shape_numel(&in[0]) * e + e;
    return a[CE_LABEL_SMOOTHING].f > 0 ? w + smoothing_scratch(&in[0], dt) : w;
}

/* A training forward keeps log_softmax's output and total_weight as its
 * extras, which the plan counts as values: the smoothing term's scratch is
 * all that is left. */
static int64_t cross_entropy_train_workspace(const ebb_attr_value *a, const ebb_shape *in,
                                             int n_in, ebb_dtype dt) {
    (void)n_in;
    return a[CE_LABEL_SMOOTHING].f > 0 ? smoothing_scratch(&in[0], dt) : 0;
}

/* nll_loss_forward's total_weight, beside the output (the training
 * forward's extra, so a training forward has no scratch). */
static int64_t nll_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    (void)a;
    (void)in;
    (void)n_in;
    return elem(dt);
}

/* CUDA: before the loss, the target's range check (ops/tensor/loss.cpp,
 * check_range_on_device) holds five bool tensors of the target's size at
 * once (t < 0, t >= C, their or, t != ignore_index and the and of those),
 * a block each; an empty target is not checked. */
static int64_t target_check_cuda(const ebb_shape *target) {
    int64_t n = ebb_shape_numel(target);
    return n > 0 ? 5 * ebb_cuda_block(n) : 0;
}

/* CUDA: cross entropy's label-smoothing term, beside its log-probabilities,
 * loss and total_weight: the per-row sums, with first the bool mask of
 * ignored targets and then the sums' 0-dim sum (the Scalars stay on the
 * CPU). */
static int64_t smoothing_cuda(const ebb_attr_value *a, const ebb_shape *in, ebb_dtype dt) {
    if (!(a[CE_LABEL_SMOOTHING].f > 0))
        return 0;
    int64_t mask = ebb_cuda_block(ebb_shape_numel(&in[1])), sum = ebb_cuda_block(elem(dt));
    return ebb_cuda_block(rows_of(&in[0]) * elem(dt)) + (mask > sum ? mask : sum);
}

/* Beyond the output: the check (made before the output exists) less the
 * output's block, or total_weight. */
static int64_t nll_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t tw = ebb_cuda_block(elem(dt)), check = target_check_cuda(&in[1]) - tw;
    return check > tw ? check : tw;
}

/* Beyond the output: the check less the output's block, or the
 * log-probabilities and total_weight with the smoothing term's scratch. */
static int64_t cross_entropy_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                            int n_in, ebb_dtype dt) {
    (void)n_in;
    int64_t e = elem(dt), one = ebb_cuda_block(e); /* the output, total_weight */
    int64_t loss = ebb_cuda_block(ebb_shape_numel(&in[0]) * e) + one + smoothing_cuda(a, in, dt);
    int64_t check = target_check_cuda(&in[1]) - one;
    return check > loss ? check : loss;
}

/* mse_loss makes the elementwise loss and, as the 0-dim result's storage,
 * another tensor of the input's size (one element at least), then divides
 * the sum in place by the element count (an int64 Scalar); the result is
 * copied out of that storage. */
static int64_t mse_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]), e = elem(dt);
    int64_t mean = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    int64_t two_pass = ebb_ops_reduce_scratch(n, 1, dt);
    if (two_pass > mean)
        mean = two_pass;
    return n * e + (n > 0 ? n : 1) * e + mean - e;
}

/* CUDA: the elementwise loss only; the mean's Scalar stays on the CPU. */
static int64_t mse_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return ebb_cuda_block(ebb_shape_numel(&in[0]) * elem(dt));
}

/* ebb_tensor_bce_with_logits makes the elementwise loss in one input-sized
 * tensor (softplus, then t*x taken off in place), whose mean then needs the
 * reduction's scratch. */
static int64_t bce_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]), e = elem(dt);
    int64_t mean = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    int64_t two_pass = ebb_ops_reduce_scratch(n, 1, dt);
    if (two_pass > mean)
        mean = two_pass;
    return n * e + mean;
}

/* nll_loss_backward's gradient of the log-probabilities, which
 * _log_softmax_backward_data then reads; with label smoothing, before that,
 * the Scalars that scale it and the smoothing share, and the mask of
 * ignored rows. */
static int64_t cross_entropy_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in,
                                           int n_in, ebb_dtype dt) {
    (void)n_in;
    int64_t e = elem(dt), g = ebb_shape_numel(&in[0]) * e;
    if (!(a[CE_LABEL_SMOOTHING].f > 0))
        return g;
    int64_t share = e + ebb_ops_scalar_bytes(dt), mask = rows_of(&in[0]) + 8;
    int64_t most = share > mask ? share : mask;
    return g > most ? g : most;
}

/* mse_loss_backward and nll_loss_backward write the gradient directly;
 * bce_with_logits divides it in place by the element count, an int64
 * Scalar. */
static int64_t bce_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    (void)a;
    (void)in;
    (void)n_in;
    return ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
}

/* ---- backward rules ----------------------------------------------------------------
 * cross_entropy reads the log-probabilities its training forward kept
 * (saved[0]) and the count of counted targets (saved[1], nll_loss's
 * total_weight), not the logits; nll reads only the targets and that count,
 * since its gradient does not depend on the log-probabilities' values (their
 * shape comes from in_shapes); mse and bce_with_logits read both inputs. */

static ebb_status need_target(const ebb_op_grad_call *c, const char *op) {
    if (c->n_in < 2 || !c->in[1])
        return ebb_error_set(EBB_ERR_ARG, "%s backward (%s): the target was not saved", op,
                             c->node ? c->node : "?");
    return EBB_OK;
}

static ebb_status cross_entropy_bwd(const ebb_op_grad_call *c, ebb_tensor **gin,
                                    ebb_tensor **gp) {
    (void)gp;
    ebb_status st = need_target(c, "cross_entropy");
    if (st != EBB_OK)
        return st;
    if (c->n_saved < 2 || !c->saved[0] || !c->saved[1])
        return ebb_error_set(EBB_ERR_ARG,
                             "cross_entropy backward (%s): log_probs and total_weight were not "
                             "saved",
                             c->node ? c->node : "?");
    /* per token: the saved log-probabilities are [N, C] already */
    ebb_tensor *y = NULL;
    ebb_shape ys = ebb_tensor_shape(c->in[1]), sp = ebb_tensor_shape(c->saved[0]);
    ebb_shape flat = EBB_SHAPE(sp.ndim == 2 ? sp.dim[0] : 1);
    st = ys.ndim > 1 ? ebb_tensor_reshape(&y, c->in[1], &flat) : ebb_tensor_ref(&y, c->in[1]);
    if (st == EBB_OK)
        st = ebb_tensor_cross_entropy_backward(&gin[0], c->grad_out, c->saved[0], y, c->saved[1],
                                               c->attrs[CE_IGNORE_INDEX].i,
                                               c->attrs[CE_LABEL_SMOOTHING].f);
    ebb_tensor_free(y);
    if (st == EBB_OK && ys.ndim > 1) {
        ebb_shape xs = ys; /* the scores: the target's shape and the classes */
        xs.dim[xs.ndim++] = sp.dim[1];
        st = unflat(&gin[0], &xs);
    }
    return st;
}

static ebb_status nll_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_status st = need_target(c, "nll");
    if (st != EBB_OK)
        return st;
    if (c->n_saved < 1 || !c->saved[0] || !c->in_shapes)
        return ebb_error_set(EBB_ERR_ARG,
                             "nll backward (%s): total_weight was not saved or in_shapes not given",
                             c->node ? c->node : "?");
    const ebb_shape *xs = &c->in_shapes[0];
    if (xs->ndim <= 2)
        return ebb_tensor_nll_loss_backward(&gin[0], c->grad_out, xs, c->in[1], c->saved[0],
                                            c->attrs[NLL_IGNORE_INDEX].i);
    /* per token: computed as [N, C] against [N], handed back in the scores' shape */
    int64_t classes = xs->dim[xs->ndim - 1], n = classes > 0 ? ebb_shape_numel(xs) / classes : 0;
    ebb_shape s2 = EBB_SHAPE(n, classes), s1 = EBB_SHAPE(n);
    ebb_tensor *y = NULL;
    st = ebb_tensor_reshape(&y, c->in[1], &s1);
    if (st == EBB_OK)
        st = ebb_tensor_nll_loss_backward(&gin[0], c->grad_out, &s2, y, c->saved[0],
                                          c->attrs[NLL_IGNORE_INDEX].i);
    ebb_tensor_free(y);
    return st == EBB_OK ? unflat(&gin[0], xs) : st;
}

static ebb_status mse_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_status st = need_target(c, "mse");
    if (st != EBB_OK)
        return st;
    return ebb_tensor_mse_loss_backward(&gin[0], c->grad_out, c->in[0], c->in[1]);
}

static ebb_status bce_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_status st = need_target(c, "bce_with_logits");
    if (st != EBB_OK)
        return st;
    return ebb_tensor_bce_with_logits_backward(&gin[0], c->grad_out, c->in[0], c->in[1]);
}

/* CUDA: the training forwards keep the loss and total_weight (and cross
 * entropy its log-probabilities) as values, all made after the target's
 * check: the scratch is what the check holds beyond them, or cross
 * entropy's smoothing term; nll_loss_forward's own kernel allocates
 * nothing more. */
static int64_t nll_train_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t check = target_check_cuda(&in[1]) - 2 * ebb_cuda_block(elem(dt));
    return check > 0 ? check : 0;
}

static int64_t cross_entropy_train_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                                  int n_in, ebb_dtype dt) {
    (void)n_in;
    int64_t e = elem(dt);
    int64_t kept = ebb_cuda_block(ebb_shape_numel(&in[0]) * e) + 2 * ebb_cuda_block(e);
    int64_t check = target_check_cuda(&in[1]) - kept, smooth = smoothing_cuda(a, in, dt);
    int64_t most = check > smooth ? check : smooth;
    return most > 0 ? most : 0;
}

/* CUDA: nll_loss_backward's kernel takes its input contiguous, and the
 * stand-in ebb_tensor_nll_loss_backward passes (total_weight expanded to the
 * log-probabilities' shape, zero strides) is not: the kernel copies it into
 * a tensor of their size and dtype, alive beside the gradient. */
static int64_t nll_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    (void)a;
    (void)n_in;
    return ebb_cuda_block(ebb_shape_numel(&in[0]) * elem(dt));
}

static const ebb_op_grad cross_entropy_grad = {
    .backward = cross_entropy_bwd, .forward_train = cross_entropy_train, .n_saved = 2,
    .saves_inputs = 1u << 1, .differentiable = 1u, .workspace = cross_entropy_bwd_workspace,
    .train_workspace = cross_entropy_train_workspace,
    .train_workspace_cuda = cross_entropy_train_workspace_cuda};
static const ebb_op_grad nll_grad = {.backward = nll_bwd, .forward_train = nll_train,
                                     .n_saved = 1, .saves_inputs = 1u << 1,
                                     .differentiable = 1u,
                                     .workspace_cuda = nll_bwd_workspace_cuda,
                                     .train_workspace_cuda = nll_train_workspace_cuda};
static const ebb_op_grad mse_grad = {.backward = mse_bwd, .saves_inputs = 3u,
                                     .differentiable = 1u};
/* bce_with_logits: on CUDA the division's Scalar stays on the CPU and the
 * 0-dim grad_out is read in place: no scratch. */
static const ebb_op_grad bce_grad = {.backward = bce_bwd, .saves_inputs = 3u,
                                     .differentiable = 1u, .workspace = bce_bwd_workspace,
                                     .workspace_cuda = ebb_ops_no_cuda_scratch};

const ebb_op ebb_ops_loss[] = {
    {.name = "cross_entropy", .min_inputs = 2, .max_inputs = 2, .attrs = cross_entropy_attrs,
     .n_attrs = EBB_COUNT(cross_entropy_attrs), .forward = cross_entropy_fwd,
     .doc = "mean cross entropy of logits [B, C] and int64 class indices [B]",
     .workspace = cross_entropy_workspace, .shape = cross_entropy_shape,
     .grad = &cross_entropy_grad, .workspace_cuda = cross_entropy_workspace_cuda,
     .autocast = EBB_AUTOCAST_FULL, .indices = EBB_INDICES_CLASSES},
    {.name = "nll", .min_inputs = 2, .max_inputs = 2, .attrs = nll_attrs,
     .n_attrs = EBB_COUNT(nll_attrs), .forward = nll_fwd,
     .doc = "mean negative log likelihood of log-probabilities [B, C] and int64 class indices [B]",
     .workspace = nll_workspace, .shape = nll_shape, .grad = &nll_grad,
     .workspace_cuda = nll_workspace_cuda,
     .autocast = EBB_AUTOCAST_FULL, .indices = EBB_INDICES_CLASSES},
    {.name = "mse", .min_inputs = 2, .max_inputs = 2, .forward = mse_fwd,
     .doc = "mean squared error of a prediction and a target of one shape",
     .workspace = mse_workspace, .shape = mse_shape, .grad = &mse_grad,
     .workspace_cuda = mse_workspace_cuda, .autocast = EBB_AUTOCAST_FULL},
    {.name = "bce_with_logits", .min_inputs = 2, .max_inputs = 2, .forward = bce_fwd,
     .doc = "mean binary cross entropy of logits and probability targets of one shape",
     .workspace = bce_workspace, .shape = bce_shape, .grad = &bce_grad,
     .autocast = EBB_AUTOCAST_FULL},
};
const int ebb_ops_loss_count = EBB_COUNT(ebb_ops_loss);
