/* gru_cell and lstm_cell as loop bodies: one tensor in, one tensor out, the
 * same shape, so `loop` can apply them again and again.
 *
 *   gru_cell:  state h [B, H] -> h' = GRUCell(x, h)
 *   lstm_cell: state cat(h, c) [B, 2H] -> cat(h', c'), (h', c') = LSTMCell(x, (h, c))
 *
 * x is a second input given with `using` ([B, input_size]); without one the
 * cell reads its own hidden state (x = h, so input_size = hidden). Parameters
 * are nn.GRUCell's / nn.LSTMCell's: weight_ih [G*H, in], weight_hh [G*H, H],
 * bias_ih, bias_hh [G*H] with G = 3 (r, z, n) or 4 (i, f, g, o), all
 * U(-1/sqrt(H), 1/sqrt(H)). */
#include "ops_internal.h"

enum { A_HIDDEN, A_INPUT, A_BIAS };

static const ebb_attr_spec cell_attrs[] = {
    {.name = "hidden", .type = EBB_ATTR_INT, .required = 1, .doc = "hidden size H"},
    {.name = "input_size", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "features of the `using` input x (inferred; hidden when there is no x)"},
    {.name = "bias", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "bias_ih and bias_hh"},
};

/* Checks state (and x) against the attributes; returns x's feature count. */
static ebb_status cell_check(const char *op, int lstm, const ebb_attr_value *a,
                             const ebb_shape *in, int n_in, int64_t *in_size) {
    char b0[128], b1[128];
    int64_t h = a[A_HIDDEN].i, width = lstm ? 2 * h : h;
    const ebb_shape *s = &in[0];
    if (h < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: hidden must be >= 1, got %lld", op, (long long)h);
    if (s->ndim != 2 || s->dim[1] != width)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: state %s must be [B, %s%lld]%s", op,
                             ebb_shape_str(s, b0, sizeof b0), lstm ? "2*hidden = " : "",
                             (long long)width, lstm ? " (h and c side by side)" : "");
    if (n_in < 2) {
        if (a[A_INPUT].set && a[A_INPUT].i != h)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: without a `using` input the cell reads its own state, so "
                                 "input_size=%lld must equal hidden=%lld",
                                 op, (long long)a[A_INPUT].i, (long long)h);
        *in_size = h;
        return EBB_OK;
    }
    const ebb_shape *x = &in[1];
    if (x->ndim != 2 || x->dim[0] != s->dim[0])
        return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s does not fit state %s (expected [B, in])",
                             op, ebb_shape_str(x, b1, sizeof b1), ebb_shape_str(s, b0, sizeof b0));
    if (a[A_INPUT].set && a[A_INPUT].i != x->dim[1])
        return ebb_error_set(
            EBB_ERR_SHAPE, "%s: input_size=%lld but the input %s has %lld features", op,
            (long long)a[A_INPUT].i, ebb_shape_str(x, b1, sizeof b1), (long long)x->dim[1]);
    *in_size = x->dim[1];
    return EBB_OK;
}

static ebb_status cell_params(const char *op, int gates, const ebb_attr_value *a,
                              const ebb_shape *in, int n_in, ebb_param_spec *p, int *n) {
    int64_t in_size = 0, h = a[A_HIDDEN].i;
    *n = 0;
    ebb_status st = cell_check(op, gates == 4, a, in, n_in, &in_size);
    if (st != EBB_OK)
        return st;
    p[(*n)++] =
        (ebb_param_spec){"weight_ih", EBB_SHAPE(gates * h, in_size), EBB_INIT_UNIFORM_FAN_IN, h, 0, 0, 0};
    p[(*n)++] = (ebb_param_spec){"weight_hh", EBB_SHAPE(gates * h, h), EBB_INIT_UNIFORM_FAN_IN, h, 0, 0, 0};
    if (a[A_BIAS].i) {
        p[(*n)++] = (ebb_param_spec){"bias_ih", EBB_SHAPE(gates * h), EBB_INIT_UNIFORM_FAN_IN, h, 0, 0, 0};
        p[(*n)++] = (ebb_param_spec){"bias_hh", EBB_SHAPE(gates * h), EBB_INIT_UNIFORM_FAN_IN, h, 0, 0, 0};
    }
    return EBB_OK;
}

static ebb_status gru_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_param_spec *p, int *n) {
    return cell_params("gru_cell", 3, a, in, n_in, p, n);
}

static ebb_status lstm_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_param_spec *p, int *n) {
    return cell_params("lstm_cell", 4, a, in, n_in, p, n);
}

/* Checks the call and finds its parameters: w[0..3] = w_ih, w_hh, b_ih, b_hh. */
static ebb_status cell_call(const char *op, int lstm, const ebb_op_call *c,
                            const ebb_tensor *w[4]) {
    ebb_shape shapes[2] = {{0}};
    int64_t in_size = 0;
    for (int i = 0; i < c->n_in && i < 2; i++)
        shapes[i] = ebb_tensor_shape(c->in[i]);
    ebb_status st = cell_check(op, lstm, c->attrs, shapes, c->n_in, &in_size);
    if (st != EBB_OK)
        return st;
    int bias = c->attrs[A_BIAS].i != 0;
    if (c->n_params != (bias ? 4 : 2))
        return ebb_error_set(EBB_ERR_ARG, "%s: expected %d parameters, got %d", op, bias ? 4 : 2,
                             c->n_params);
    for (int i = 0; i < 4; i++)
        w[i] = i < c->n_params ? c->params[i] : NULL;
    return EBB_OK;
}

static ebb_status gru_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    const ebb_tensor *w[4] = {NULL, NULL, NULL, NULL};
    ebb_status st = cell_call("gru_cell", 0, c, w);
    if (st != EBB_OK)
        return st;
    const ebb_tensor *x = c->n_in > 1 ? c->in[1] : c->in[0];
    st = ebb_tensor_gru_cell(out, x, c->in[0], w[0], w[1], w[2], w[3]);
    if (st != EBB_OK)
        ebb_error_prefix("gru_cell");
    return st;
}

static ebb_status lstm_fwd(const ebb_op_call *c, ebb_tensor **out) {
    const ebb_tensor *w[4] = {NULL, NULL, NULL, NULL};
    *out = NULL;
    ebb_status st = cell_call("lstm_cell", 1, c, w);
    if (st != EBB_OK)
        return st;
    int64_t hidden = c->attrs[A_HIDDEN].i;
    ebb_tensor *h = NULL, *cs = NULL, *hc[2] = {NULL, NULL};
    st = ebb_tensor_narrow(&h, c->in[0], 1, 0, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&cs, c->in[0], 1, hidden, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_lstm_cell(&hc[0], &hc[1], c->n_in > 1 ? c->in[1] : h, h, cs, w[0], w[1],
                                  w[2], w[3]);
    ebb_tensor_free(h);
    ebb_tensor_free(cs);
    if (st == EBB_OK)
        st = ebb_tensor_cat(out, hc, 2, 1);
    ebb_tensor_free(hc[0]);
    ebb_tensor_free(hc[1]);
    if (st != EBB_OK)
        ebb_error_prefix("lstm_cell");
    return st;
}

/* libtorch's CPU cells compute the gates as two [B, G*H] projections, one
 * of x and one of h, both alive at once. A GRU cell then holds its new-gate
 * [B, H] beside them while making h'; an LSTM cell's later temporaries never
 * outgrow the projections, and the cat of h' and c' into the state comes
 * after they are gone. */
static int64_t cell_workspace(int gates, const ebb_attr_value *a, const ebb_shape *in,
                              ebb_dtype dt) {
    if (in[0].ndim != 2)
        return 0;
    int64_t bh = in[0].dim[0] * a[A_HIDDEN].i, e = (int64_t)ebb_dtype_size(dt);
    int64_t peak = gates == 3 ? (2 * 3 + 1 + 1) * bh : 2 * 4 * bh; /* with the output */
    return (peak - (gates == 3 ? bh : 2 * bh)) * e;
}

/* CUDA runs libtorch's fused cells: the input and hidden gate projections
 * (gates x B x H each), and the kernel's outputs: the new state (the GRU's
 * output; the LSTM's h and c, which the output joins after the gates are
 * freed) and a workspace of 5 (GRU) or 4 (LSTM) x B x H, a block each. */
static int64_t cell_workspace_cuda(int gates, const ebb_attr_value *a, const ebb_shape *in,
                                   ebb_dtype dt) {
    if (in[0].ndim != 2)
        return 0;
    int64_t bh = in[0].dim[0] * a[A_HIDDEN].i, e = (int64_t)ebb_dtype_size(dt);
    int64_t proj = 2 * ebb_cuda_block(gates * bh * e);
    if (gates == 3)
        return proj + ebb_cuda_block(5 * bh * e);
    int64_t kernel = proj + 2 * ebb_cuda_block(bh * e) + ebb_cuda_block(4 * bh * e);
    int64_t out = ebb_cuda_block(2 * bh * e);
    return kernel > out ? kernel - out : 0;
}

static int64_t gru_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)n_in;
    return cell_workspace_cuda(3, a, in, dt);
}

static int64_t lstm_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    (void)n_in;
    return cell_workspace_cuda(4, a, in, dt);
}

static int64_t gru_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    (void)n_in;
    return cell_workspace(3, a, in, dt);
}

static int64_t lstm_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_dtype dt) {
    (void)n_in;
    return cell_workspace(4, a, in, dt);
}

/* ---- backward rules ----------------------------------------------------------
 * The gate projections are recomputed from the saved state and x, and
 * _thnn_differentiable_{gru,lstm}_cell_backward differentiates the gates;
 * the LSTM's also reads its new cell state, the right half of the output.
 * Without a `using` x the cell reads its state twice, so the state's
 * gradient collects both parts. */

static ebb_status gru_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    int bias = c->attrs[A_BIAS].i != 0;
    if (c->n_params != (bias ? 4 : 2))
        return ebb_error_set(EBB_ERR_ARG, "gru_cell backward: expected %d parameters, got %d",
                             bias ? 4 : 2, c->n_params);
    const ebb_tensor *x = c->n_in > 1 ? c->in[1] : c->in[0];
    ebb_tensor *gx = NULL, *gh = NULL;
    ebb_status st = ebb_tensor_gru_cell_backward(&gx, &gh, gp, c->grad_out, x, c->in[0],
                                                 c->params[0], c->params[1],
                                                 bias ? c->params[2] : NULL,
                                                 bias ? c->params[3] : NULL);
    if (st == EBB_OK && c->n_in == 1)
        st = ebb_tensor_add_(gh, gx);
    if (st == EBB_OK) {
        gin[0] = gh;
        gh = NULL;
        if (c->n_in > 1) {
            gin[1] = gx;
            gx = NULL;
        }
    }
    ebb_tensor_free(gx);
    ebb_tensor_free(gh);
    if (st != EBB_OK) {
        for (int i = 0; i < 4; i++) {
            ebb_tensor_free(gp[i]);
            gp[i] = NULL;
        }
        ebb_error_prefix("gru_cell");
    }
    return st;
}

static ebb_status lstm_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    int bias = c->attrs[A_BIAS].i != 0;
    int64_t hidden = c->attrs[A_HIDDEN].i;
    if (c->n_params != (bias ? 4 : 2))
        return ebb_error_set(EBB_ERR_ARG, "lstm_cell backward: expected %d parameters, got %d",
                             bias ? 4 : 2, c->n_params);
    if (!c->out)
        return ebb_error_set(EBB_ERR_ARG, "lstm_cell backward: the output was not saved");
    ebb_tensor *h = NULL, *cs = NULL, *cy = NULL, *gh_out = NULL, *gc_out = NULL;
    ebb_tensor *gx = NULL, *gh = NULL, *gc = NULL;
    ebb_status st = ebb_tensor_narrow(&h, c->in[0], 1, 0, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&cs, c->in[0], 1, hidden, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&cy, c->out, 1, hidden, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&gh_out, c->grad_out, 1, 0, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&gc_out, c->grad_out, 1, hidden, hidden);
    if (st == EBB_OK)
        st = ebb_tensor_lstm_cell_backward(&gx, &gh, &gc, gp, gh_out, gc_out,
                                           c->n_in > 1 ? c->in[1] : h, h, cs, cy, c->params[0],
                                           c->params[1], bias ? c->params[2] : NULL,
                                           bias ? c->params[3] : NULL);
    if (st == EBB_OK && c->n_in == 1)
        st = ebb_tensor_add_(gh, gx);
    if (st == EBB_OK) {
        ebb_tensor *parts[2] = {gh, gc};
        st = ebb_tensor_cat(&gin[0], parts, 2, 1);
    }
    if (st == EBB_OK && c->n_in > 1) {
        gin[1] = gx;
        gx = NULL;
    }
    ebb_tensor *tmp[] = {h, cs, cy, gh_out, gc_out, gx, gh, gc};
    for (int i = 0; i < EBB_COUNT(tmp); i++)
        ebb_tensor_free(tmp[i]);
    if (st != EBB_OK) {
        ebb_tensor_free(gin[0]);
        gin[0] = NULL;
        for (int i = 0; i < 4; i++) {
            ebb_tensor_free(gp[i]);
            gp[i] = NULL;
        }
        ebb_error_prefix("lstm_cell");
    }
    return st;
}

/* The backward's scratch on libtorch 1.13's CPU path, with u = B*H, the
 * input size I (H without a `using` x) and G the gates per unit:
 *  - the gate projections of x and h are recomputed (2*G*u) and live to
 *    the end of ebb_tensor_{gru,lstm}_cell_backward;
 *  - the GRU's, written out in the tensor layer, adds the biases in place,
 *    then holds r, z, n, the two [B, 3H] gate gradients and h's direct
 *    gradient (10u) beside them; the projections and r, z, n are freed
 *    before the biases' gradients (3H each);
 *  - inside _thnn_differentiable_lstm_cell_backward, at its end: the LSTM's
 *    gates (4u), their activations (4u), the cell's gradient, four gate
 *    gradients and their concatenation (9u), one bias gradient (4H) that
 *    both biases share;
 *  - then the products with the weights: x's gradient [B, I], h's (the GRU
 *    adds its product in place; the LSTM's is new), and the weights'
 *    [G*H, I] and [G*H, H];
 *  - the LSTM's state gradient is cat(h's, c's) [B, 2H], made last.
 * Without a `using` x, x's gradient is added into h's and freed: scratch. */
static int64_t cell_bwd_workspace(int gates, const ebb_attr_value *a, const ebb_shape *in,
                                  int n_in, ebb_dtype dt) {
    if (in[0].ndim != 2)
        return 0;
    int64_t b = in[0].dim[0], hid = a[A_HIDDEN].i, size = (int64_t)ebb_dtype_size(dt);
    int64_t x_in = n_in > 1 && in[1].ndim == 2 ? in[1].dim[1] : hid;
    int64_t u = b * hid, gh = gates * hid, bias = a[A_BIAS].i != 0;
    int64_t weights = gh * x_in + gh * hid, gx = b * x_in;
    int64_t peak, ret;
    if (gates == 3) {
        int64_t inner = 6 * u + 10 * u;
        int64_t outer = 7 * u + (bias ? 2 * gh : 0) + gx + weights;
        peak = inner > outer ? inner : outer;
        ret = u + (n_in > 1 ? gx : 0) + weights + (bias ? 2 * gh : 0);
    } else {
        int64_t inner = 8 * u + 17 * u + (bias ? gh : 0);
        int64_t outer = 13 * u + (bias ? gh : 0) + gx + u + weights;
        int64_t state = gx + 4 * u + weights + (bias ? gh : 0);
        peak = inner > outer ? inner : outer;
        peak = state > peak ? state : peak;
        ret = 2 * u + (n_in > 1 ? gx : 0) + weights + (bias ? gh : 0);
    }
    return (peak - ret) * size;
}

/* The same backward on CUDA, in the caching allocator's blocks (each tensor
 * its own), with u = B*H and I as above. ebb_tensor_{gru,lstm}_cell_backward
 * run the same ATen calls there, through cuBLAS products and elementwise and
 * reduction kernels (no cuDNN), read here from libtorch 2.11:
 *  - GRU: the projections ig, hg [B, 3H], their gradients g_ig, g_hg and
 *    r, z, n, h's direct gradient [B, H] are all alive when the gates are
 *    done; then ig, hg, r, z, n die before the bias gradients [3H] (each sum
 *    with its staging), x's gradient [B, I] and the weights' [3H, I] and
 *    [3H, H] are made.
 *  - LSTM: _thnn_differentiable_lstm_cell_backward peaks at its cat of the
 *    four gate gradients [B, 4H], with ig, hg, the summed gates (4 blocks of
 *    [B, 4H]) and i, f, c, o, tanh(c'), the cell's gradient and the four
 *    gate gradients (9 of [B, H]) alive; then the shared bias gradient [4H]
 *    is summed with the four gate gradients gone; after it, the gate
 *    gradient, the cell's, the bias gradient and the four products stand
 *    beside ig and hg; last, cat(h's, c's) [B, 2H] beside its two parts.
 * Exact, except that from a batch of 1024 (more for H under 32) a bias
 * sum's staging (see ebb_ops_cuda_sum_staging) depends on the device: the
 * GRU's never reaches its peak, but the LSTM's, up to about twice the gate
 * gradient, can, and then the figure is the most a device takes, which an
 * H100 or H200 takes while B*4H is under about 17 million. The rule is not
 * marked a bound: below that batch it is exact, and above it, it can only
 * overstate. */
static int64_t cell_bwd_workspace_cuda(int gates, const ebb_attr_value *a, const ebb_shape *in,
                                       int n_in, ebb_dtype dt) {
    if (in[0].ndim != 2)
        return 0;
    int64_t b = in[0].dim[0], hid = a[A_HIDDEN].i, size = (int64_t)ebb_dtype_size(dt);
    int64_t x_in = n_in > 1 && in[1].ndim == 2 ? in[1].dim[1] : hid;
    int64_t u = b * hid, gh = gates * hid;
    int64_t b1 = ebb_cuda_block(u * size), bg = ebb_cuda_block(gates * u * size);
    int64_t bias = a[A_BIAS].i ? ebb_cuda_block(gh * size) : 0;
    int64_t staging = a[A_BIAS].i ? ebb_ops_cuda_sum_staging(b, gh, size) : 0;
    int64_t gx = ebb_cuda_block(b * x_in * size);
    int64_t weights = ebb_cuda_block(gh * x_in * size) + ebb_cuda_block(gh * hid * size);
    int64_t phases[4] = {0, 0, 0, 0}, ret;
    if (gates == 3) {
        phases[0] = 4 * bg + 4 * b1;                  /* the gates done */
        phases[1] = 2 * bg + b1 + 2 * bias + staging; /* bias_hh's sum */
        phases[2] = 2 * bg + b1 + 2 * bias + gx + weights;
        ret = b1 + (n_in > 1 ? gx : 0) + weights + 2 * bias;
    } else {
        int64_t state = ebb_cuda_block(2 * u * size);
        phases[0] = 4 * bg + 9 * b1;                  /* the gate gradients' cat */
        phases[1] = 4 * bg + 5 * b1 + bias + staging; /* the bias gradient's sum */
        phases[2] = 3 * bg + 2 * b1 + bias + gx + weights;
        phases[3] = gx + 2 * b1 + bias + weights + state; /* cat(h's, c's) */
        ret = state + (n_in > 1 ? gx : 0) + weights + bias;
    }
    int64_t peak = 0;
    for (int i = 0; i < 4; i++)
        peak = phases[i] > peak ? phases[i] : peak;
    return peak - ret;
}

static int64_t gru_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    return cell_bwd_workspace(3, a, in, n_in, dt);
}

static int64_t lstm_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    return cell_bwd_workspace(4, a, in, n_in, dt);
}

static int64_t gru_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    return cell_bwd_workspace_cuda(3, a, in, n_in, dt);
}

static int64_t lstm_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                       ebb_dtype dt) {
    return cell_bwd_workspace_cuda(4, a, in, n_in, dt);
}

static const ebb_op_grad gru_grad = {.backward = gru_bwd, .saves_inputs = 0x3u,
                                     .differentiable = 0x3u, .workspace = gru_bwd_workspace,
                                     .workspace_cuda = gru_bwd_workspace_cuda};
static const ebb_op_grad lstm_grad = {.backward = lstm_bwd, .saves_inputs = 0x3u,
                                      .saves_output = 1, .differentiable = 0x3u,
                                      .workspace = lstm_bwd_workspace,
                                      .workspace_cuda = lstm_bwd_workspace_cuda};

const ebb_op ebb_ops_recurrent[] = {
    {.name = "gru_cell", .min_inputs = 1, .max_inputs = 2, .attrs = cell_attrs,
     .n_attrs = EBB_COUNT(cell_attrs), .params = gru_params, .forward = gru_fwd,
     .doc = "one GRU step on the state h [B, H] (x from `using`, else h)",
     .workspace = gru_workspace, .grad = &gru_grad, .workspace_cuda = gru_workspace_cuda},
    {.name = "lstm_cell", .min_inputs = 1, .max_inputs = 2, .attrs = cell_attrs,
     .n_attrs = EBB_COUNT(cell_attrs), .params = lstm_params, .forward = lstm_fwd,
     .doc = "one LSTM step on the state cat(h, c) [B, 2H] (x from `using`, else h)",
     .workspace = lstm_workspace, .grad = &lstm_grad, .workspace_cuda = lstm_workspace_cuda},
};
const int ebb_ops_recurrent_count = EBB_COUNT(ebb_ops_recurrent);
