/* multi_head_attention: nn.MultiheadAttention (batch_first) at inference,
 * with PyTorch's parameter names and layouts, so its state_dict loads as is:
 *   in_proj_weight [3E, E] (q, k, v rows stacked), in_proj_bias [3E],
 *   out_proj.weight [E, E], out_proj.bias [E].
 * One input is self-attention; `using` tensors give the key (and value) for
 * cross-attention. Every intermediate is freed as soon as it has been used. */
#include "internal.h"
#include "ops_internal.h"

enum { A_EMBED, A_HEADS, A_CAUSAL, A_BIAS, A_DROPOUT };

static const ebb_attr_spec mha_attrs[] = {
    {.name = "embed_dim", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "model width E (inferred from the input's last dim)"},
    {.name = "num_heads", .type = EBB_ATTR_INT, .required = 1, .doc = "heads; must divide E"},
    {.name = "causal", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "position i attends to positions <= i only"},
    {.name = "bias", .type = EBB_ATTR_BOOL, .default_number = 1,
     .doc = "in_proj_bias and out_proj.bias"},
    {.name = "dropout", .type = EBB_ATTR_FLOAT, .default_number = 0,
     .doc = "drop attention probabilities with this probability while training"},
};

/* Checks query [B, T, E] and key/value [B, S, E] against the attributes. */
static ebb_status mha_check(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                            int64_t *embed) {
    char b0[128], b1[128], b2[128];
    const ebb_shape *q = &in[0];
    if (q->ndim != 3)
        return ebb_error_set(EBB_ERR_SHAPE, "multi_head_attention: input %s must be [B, T, E]",
                             ebb_shape_str(q, b0, sizeof b0));
    int64_t e = q->dim[2];
    if (a[A_EMBED].set && a[A_EMBED].i != e)
        return ebb_error_set(EBB_ERR_SHAPE,
                             "multi_head_attention: embed_dim=%lld but the input %s has %lld "
                             "features",
                             (long long)a[A_EMBED].i, ebb_shape_str(q, b0, sizeof b0),
                             (long long)e);
    if (a[A_HEADS].i < 1 || e % a[A_HEADS].i != 0)
        return ebb_error_set(EBB_ERR_SHAPE,
                             "multi_head_attention: num_heads=%lld does not divide embed_dim=%lld",
                             (long long)a[A_HEADS].i, (long long)e);
    for (int i = 1; i < n_in; i++) {
        const ebb_shape *kv = &in[i];
        if (kv->ndim != 3 || kv->dim[0] != q->dim[0] || kv->dim[2] != e ||
            kv->dim[1] != in[1].dim[1])
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "multi_head_attention: query %s, key %s%s%s do not fit [B, T, E], "
                                 "[B, S, E]",
                                 ebb_shape_str(q, b0, sizeof b0),
                                 ebb_shape_str(&in[1], b1, sizeof b1), n_in > 2 ? ", value " : "",
                                 n_in > 2 ? ebb_shape_str(&in[2], b2, sizeof b2) : "");
    }
    *embed = e;
    return EBB_OK;
}

static ebb_status mha_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_param_spec *p, int *n) {
    int64_t e = 0;
    *n = 0;
    ebb_status st = mha_check(a, in, n_in, &e);
    if (st != EBB_OK)
        return st;
    p[(*n)++] = (ebb_param_spec){"in_proj_weight", EBB_SHAPE(3 * e, e), EBB_INIT_UNIFORM_FAN_IN, e, 0, 0, 0};
    if (a[A_BIAS].i)
        p[(*n)++] = (ebb_param_spec){"in_proj_bias", EBB_SHAPE(3 * e), EBB_INIT_ZEROS, e, 0, 0, 0};
    p[(*n)++] = (ebb_param_spec){"out_proj.weight", EBB_SHAPE(e, e), EBB_INIT_UNIFORM_FAN_IN, e, 0, 0, 0};
    if (a[A_BIAS].i)
        p[(*n)++] = (ebb_param_spec){"out_proj.bias", EBB_SHAPE(e), EBB_INIT_ZEROS, e, 0, 0, 0};
    return EBB_OK;
}

/* Projects x [B, S, E] with rows [j*E, (j+1)*E) of the input projection and
 * splits heads: [B, H, S, D]. */
static ebb_status project(const ebb_tensor *x, const ebb_tensor *w, const ebb_tensor *b, int j,
                          int64_t heads, ebb_tensor **out) {
    ebb_shape xs = ebb_tensor_shape(x);
    int64_t e = xs.dim[2];
    ebb_tensor *wj = NULL, *bj = NULL, *y = NULL, *yh = NULL;
    ebb_status st = ebb_tensor_narrow(&wj, w, 0, j * e, e);
    if (st == EBB_OK && b)
        st = ebb_tensor_narrow(&bj, b, 0, j * e, e);
    if (st == EBB_OK)
        st = ebb_tensor_linear(&y, x, wj, bj);
    ebb_tensor_free(wj);
    ebb_tensor_free(bj);
    ebb_shape split = EBB_SHAPE(xs.dim[0], xs.dim[1], heads, e / heads);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&yh, y, &split);
    ebb_tensor_free(y);
    if (st == EBB_OK)
        st = ebb_tensor_transpose(out, yh, 1, 2);
    ebb_tensor_free(yh);
    return st;
}

/* Self-attention: one [B, T, 3E] projection, split into q, k, v views. */
static ebb_status project_self(const ebb_tensor *x, const ebb_tensor *w, const ebb_tensor *b,
                               int64_t heads, ebb_tensor *qkv[3]) {
    ebb_shape xs = ebb_tensor_shape(x);
    int64_t e = xs.dim[2];
    ebb_tensor *y = NULL, *split = NULL, *perm = NULL;
    ebb_shape s = EBB_SHAPE(xs.dim[0], xs.dim[1], 3, heads, e / heads);
    const int64_t order[5] = {2, 0, 3, 1, 4}; /* [3, B, H, T, D] */
    ebb_status st = ebb_tensor_linear(&y, x, w, b);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&split, y, &s);
    ebb_tensor_free(y);
    if (st == EBB_OK)
        st = ebb_tensor_permute(&perm, split, order, 5);
    ebb_tensor_free(split);
    for (int j = 0; st == EBB_OK && j < 3; j++)
        st = ebb_tensor_select(&qkv[j], perm, 0, j);
    ebb_tensor_free(perm);
    return st;
}

/* The forward; with keep (training with dropout > 0), the attention
 * probabilities are dropped by a mask drawn from the call's seed, returned
 * in *keep for the backward. */
static ebb_status mha_run(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **keep) {
    const ebb_attr_value *a = c->attrs;
    *out = NULL;
    if (!(a[A_DROPOUT].f >= 0 && a[A_DROPOUT].f < 1))
        return ebb_error_set(EBB_ERR_ARG, "multi_head_attention: dropout=%g is not in [0, 1)",
                             a[A_DROPOUT].f);
    ebb_shape shapes[3] = {{0}};
    for (int i = 0; i < c->n_in && i < 3; i++)
        shapes[i] = ebb_tensor_shape(c->in[i]);
    int64_t e = 0, heads = a[A_HEADS].i;
    ebb_status st = mha_check(a, shapes, c->n_in, &e);
    if (st != EBB_OK)
        return st;
    int bias = a[A_BIAS].i != 0;
    if (c->n_params != (bias ? 4 : 2))
        return ebb_error_set(EBB_ERR_ARG, "multi_head_attention: expected %d parameters, got %d",
                             bias ? 4 : 2, c->n_params);
    const ebb_tensor *w_in = c->params[0], *b_in = bias ? c->params[1] : NULL;
    const ebb_tensor *w_out = c->params[bias ? 2 : 1], *b_out = bias ? c->params[3] : NULL;

    ebb_tensor *qkv[3] = {NULL, NULL, NULL};
    if (c->n_in == 1) {
        st = project_self(c->in[0], w_in, b_in, heads, qkv);
    } else {
        const ebb_tensor *src[3] = {c->in[0], c->in[1], c->in[c->n_in - 1]};
        for (int j = 0; st == EBB_OK && j < 3; j++)
            st = project(src[j], w_in, b_in, j, heads, &qkv[j]);
    }
    ebb_tensor *o = NULL, *ot = NULL, *merged = NULL;
    if (st == EBB_OK && keep)
        st = ebb_tensor_attention_ex(&o, keep, qkv[0], qkv[1], qkv[2], NULL,
                                     a[A_CAUSAL].i != 0, a[A_DROPOUT].f, c->seed);
    else if (st == EBB_OK)
        st = ebb_tensor_attention(&o, qkv[0], qkv[1], qkv[2], a[A_CAUSAL].i != 0);
    for (int j = 0; j < 3; j++)
        ebb_tensor_free(qkv[j]);
    ebb_shape m = EBB_SHAPE(shapes[0].dim[0], shapes[0].dim[1], e);
    if (st == EBB_OK)
        st = ebb_tensor_transpose(&ot, o, 1, 2); /* [B, T, H, D] */
    ebb_tensor_free(o);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&merged, ot, &m);
    ebb_tensor_free(ot);
    if (st == EBB_OK)
        st = ebb_tensor_linear(out, merged, w_out, b_out);
    ebb_tensor_free(merged);
    if (st != EBB_OK) {
        if (keep) {
            ebb_tensor_free(*keep);
            *keep = NULL;
        }
        ebb_error_prefix("multi_head_attention");
    }
    return st;
}

static ebb_status mha_fwd(const ebb_op_call *c, ebb_tensor **out) { return mha_run(c, out, NULL); }

/* Training: with dropout the mask is the extra the backward reads; without,
 * the extra is empty and the forward is the inference one. */
static ebb_status mha_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    if (c->attrs[A_DROPOUT].f > 0)
        return mha_run(c, out, &saved[0]);
    ebb_status st = mha_run(c, out, NULL);
    if (st == EBB_OK)
        st = ebb_tensor_empty(&saved[0], &EBB_SHAPE(0), EBB_BOOL, ebb_tensor_device(c->in[0]));
    if (st != EBB_OK) {
        ebb_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

static int mha_draws(const ebb_attr_value *a) { return a[A_DROPOUT].f > 0; }

/* Scratch beyond the output, from the order mha_fwd frees things, with q/k/v
 * the projections (self-attention: one [B, T, 3E] tensor they are views of).
 *
 * With fused attention (libtorch 2.x on the CPU), the kernel makes its output,
 * laid out [B, T, H, D], beside its log-sum-exp and per-thread blocks, which
 * it frees; merging the heads of that output is a view, so after the
 * projections die only the output and its projection are ever alive.
 *
 * Otherwise (matmul + softmax) the B*H*T*S scores are made, and the
 * candidates for the peak are:
 *   q k^T:   q, k, v + copies of q and k made to fold [B, H] into one batch
 *            dim + the scores;
 *   * 1/sqrt(D), masking: q, k, v + scores + the Scalar's tensors, or the
 *            causal mask (T x S bools);
 *   softmax: q, k, v + scores + probabilities;
 *   p v:     q, k, v + probabilities + a copy of v + the [B, T, E] result;
 *   merge:   that result + its copy with the heads joined + the output.
 * A head-split operand needs the copy unless B, H or its sequence length is 1
 * (self-attention's views stride over 3E, so there only B or H). */
/* The sizes of a forward: batch, query and key lengths, embedding, heads;
 * 0 when the shapes are not [B, T, E] or there are no heads. */
typedef struct mha_dims {
    int64_t b, t, s, e, h, size;
    int self;
} mha_dims;

static int mha_dims_of(const ebb_attr_value *a, const ebb_shape *in, int n_in, ebb_dtype dt,
                       mha_dims *d) {
    if (in[0].ndim != 3 || a[A_HEADS].i < 1)
        return 0;
    d->b = in[0].dim[0], d->t = in[0].dim[1], d->e = in[0].dim[2], d->h = a[A_HEADS].i;
    d->self = n_in == 1;
    d->s = !d->self && in[1].ndim == 3 ? in[1].dim[1] : d->t;
    d->size = (int64_t)ebb_dtype_size(dt);
    return 1;
}

/* Training with dropout (train, dropout > 0) goes the matmul + softmax way
 * everywhere: after the softmax, the dropout mask (one byte per score, an
 * extra the plan counts) is drawn from float32 uniforms compared with a
 * Scalar, then applied (the probabilities times the mask, a temporary,
 * times the scale, a Scalar) into the dropped probabilities, which replace
 * them. */
static int64_t mha_scratch(const ebb_attr_value *a, const ebb_shape *in, int n_in, ebb_dtype dt,
                           int train) {
    mha_dims d;
    if (!mha_dims_of(a, in, n_in, dt, &d))
        return 0;
    int64_t b = d.b, t = d.t, e = d.e, h = d.h, s = d.s, size = d.size;
    int self = d.self;
    int64_t bte = b * t * e * size, bse = b * s * e * size, scores = b * h * t * s * size;
    int split = b > 1 && h > 1;
    int64_t qkv = self ? 3 * bte : bte + 2 * bse;
    int64_t keep = train && a[A_DROPOUT].f > 0 ? b * h * t * s : 0;
    if (!keep && ebb_attention_fused(dt, e / h, e / h, t, s)) {
        ebb_attention_fused_bytes fb;
        ebb_attention_fused_bytes_get(b, h, t, s, e / h, dt, ebb_tensor_num_threads(), &fb);
        int64_t kernel = qkv + bte + fb.lse + fb.forward;
        return (kernel > 2 * bte ? kernel : 2 * bte) - bte;
    }
    int64_t q_copy = split && (self || t > 1) ? bte : 0;
    int64_t kv_copy = split && (self || s > 1) ? bse : 0;
    int64_t merge_copy = h > 1 && t > 1 ? bte : 0;
    int64_t scale = ebb_ops_scalar_bytes(dt), mask = a[A_CAUSAL].i ? t * s : 0;
    int64_t phases[] = {
        qkv + q_copy + kv_copy + scores,
        qkv + scores + (scale > mask ? scale : mask),
        qkv + 2 * scores,
        keep ? qkv + scores + 4 * keep + ebb_ops_scalar_bytes(EBB_FLOAT32) + keep : 0,
        keep ? qkv + 3 * scores + scale + keep : 0,
        qkv + scores + kv_copy + bte + keep,
        bte + merge_copy + (merge_copy ? 0 : bte) + keep,
        2 * bte + keep,
    };
    int64_t peak = 0;
    for (int i = 0; i < EBB_COUNT(phases); i++)
        if (phases[i] > peak)
            peak = phases[i];
    return peak - bte - keep;
}

static int64_t mha_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    return mha_scratch(a, in, n_in, dt, 0);
}

static int64_t mha_train_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    return mha_scratch(a, in, n_in, dt, 1);
}

/* On CUDA, scaled_dot_product_attention picks its kernel by device, dtype
 * and shape: a fused one (flash, memory-efficient: the output, its
 * log-sum-exp, RNG state) or the math path, which makes q and k scaled, the
 * scores, _safe_softmax's probabilities beside its all-masked-rows test, a
 * zero tensor and the where() that applies them, the causal mask and a
 * contiguous copy of v. The bound counts the larger of the two beside the
 * projections and the merge, each tensor a block. */
static int64_t mha_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    mha_dims d;
    if (!mha_dims_of(a, in, n_in, dt, &d))
        return 0;
    int64_t b = d.b, t = d.t, e = d.e, h = d.h, s = d.s, size = d.size;
    int self = d.self;
    int64_t bte = ebb_cuda_block(b * t * e * size), bse = ebb_cuda_block(b * s * e * size);
    int64_t scores = ebb_cuda_block(b * h * t * s * size);
    int64_t qkv = self ? ebb_cuda_block(3 * b * t * e * size) : bte + 2 * bse;
    int64_t math = bte + 2 * bse + 4 * scores + ebb_cuda_block(b * h * t * s) +
                   (a[A_CAUSAL].i ? ebb_cuda_block(t * s) : 0);
    int64_t fused = bte + ebb_cuda_block(b * h * ((t + 31) / 32 * 32) * 4) + 2 * 512;
    return qkv + (math > fused ? math : fused) + 2 * bte;
}

/* Training with dropout adds the dropped probabilities and the draw. */
static int64_t mha_train_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    mha_dims d;
    if (!mha_dims_of(a, in, n_in, dt, &d))
        return 0;
    int64_t n = d.b * d.h * d.t * d.s;
    int64_t extra = a[A_DROPOUT].f > 0 ? ebb_cuda_block(n * d.size) + ebb_cuda_block(4 * n) : 0;
    return mha_workspace_cuda(a, in, n_in, dt) + extra;
}

/* The backward reads the inputs and recomputes the projections and the
 * attention probabilities from them rather than keeping B*H*T*S
 * probabilities from the forward; every input and parameter gets a gradient
 * (self-attention's one input collects its query, key and value parts). */
static ebb_status mha_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    int bias = c->attrs[A_BIAS].i != 0;
    if (c->n_params != (bias ? 4 : 2))
        return ebb_error_set(EBB_ERR_ARG, "multi_head_attention backward: expected %d parameters, "
                             "got %d", bias ? 4 : 2, c->n_params);
    double p = c->attrs[A_DROPOUT].f;
    ebb_status st = ebb_tensor_multi_head_attention_backward(
        gin, gp, c->grad_out, c->in, c->n_in, c->params[0], bias ? c->params[1] : NULL,
        c->params[bias ? 2 : 1], bias ? c->params[3] : NULL, c->attrs[A_HEADS].i,
        c->attrs[A_CAUSAL].i != 0, p > 0 && c->n_saved > 0 ? c->saved[0] : NULL, p);
    if (st != EBB_OK)
        ebb_error_prefix("multi_head_attention");
    return st;
}
/* The backward's scratch, followed through ebb_tensor_multi_head_attention_
 * backward (contiguous inputs), with Q = B*T*E, K = B*S*E and P = B*H*T*S
 * elements. Both ways through it recompute the projections q, k, v and end
 * the same way (mha_bwd_tail); in between:
 *
 * With fused attention (libtorch 2.x on the CPU), the forward kernel's output
 * and log-sum-exp, out_proj's gradients, grad_out's projection, then the
 * backward kernel's gradients of q, k and v beside its per-thread blocks.
 * Its results are laid out [B, L, H, D], so no head merge copies; everything
 * but those gradients dies before the tail.
 *
 * Otherwise (matmul + softmax, libtorch 1.13's CPU path) every named tensor
 * lives to the end of the call, so the live bytes only grow, with transients
 * on top: matmul's copies of head-split operands (as in the forward: one per
 * [B, H, L, D] operand unless B, H or L is 1), its product before a head
 * merge copies it (unless H or L is 1), the Scalar operand of each scaling,
 * the causal mask. The call keeps q, k, v, the scores and probabilities, the
 * merged heads, grad_out's projection, g_p, g_v, g_s, g_q, g_k and the
 * merged copies of the last three.
 *
 * The tail: per projection its weight (E*E) and bias (E) gradients, its
 * input's gradient, summed into the one an input already has (self- and
 * key=value attention), then in_proj's gradients concatenated.
 *
 * On CUDA the call always goes the composite way (the fused kernels above
 * are the CPU's), through cuBLAS's batched products, softmax and its
 * backward: the same tensors, each its own block, except that the scalings'
 * Scalar stays on the CPU while the causal mask is made on the device, and
 * each concatenation is one block. That is B*H*T*S scores, probabilities,
 * g_p and g_s (and g_s's unscaled copy for a moment) beside up to a dozen
 * [B, L, E] tensors, where the forward's fused kernels keep none: so the
 * CPU's figure, rounded as one block, fell far short on the device. One
 * thing there is the device's: from 1024 rows (B*T or B*S; more for E under
 * 128) each bias gradient's sum stages partial sums across thread blocks,
 * as many as the device's multiprocessors allow, up to about twice the
 * projection it sums (ebb_ops_cuda_sum_staging). The figure counts the most
 * any device takes, so it is a bound; an H100 or H200 takes that much up to
 * about 17 million values (B*L*E), and below 1024 rows the figure is exact. */
typedef struct mha_bwd_sizes {
    int64_t q, k, ee, eb; /* bytes: Q, K, one E*E weight, one E bias (0 without) */
    int64_t w3, b3;       /* in_proj's weight and bias gradients, concatenated */
    int64_t p;            /* B*H*T*S scores */
    int64_t scalar, mask; /* a scaling's Scalar operand; the causal mask (0 without) */
    int64_t sum_q, sum_k; /* a bias sum's staging over B*T and B*S rows (CUDA's) */
    int n_in;
    int drop;             /* training dropout: the probabilities dropped, and g_p */
} mha_bwd_sizes;

#define PEAK(x) peak = (x) > peak ? (x) : peak

/* From `live` bytes before the tail to the call's peak beyond what it returns. */
static int64_t mha_bwd_tail(const mha_bwd_sizes *z, int64_t live, int64_t peak) {
    int64_t grads[3] = {0, 0, 0};
    for (int j = 0; j < 3; j++) {
        int64_t size_j = j == 0 ? z->q : z->k;
        int to = j == 0 ? 0 : (j < z->n_in - 1 ? j : z->n_in - 1);
        live += z->ee;
        PEAK(live + z->eb + (j == 0 ? z->sum_q : z->sum_k)); /* the bias's sum */
        live += z->eb;
        if (grads[to]) {
            PEAK(live + 2 * size_j); /* the product, then its sum with the first */
        } else {
            grads[to] = size_j;
            live += size_j;
        }
        PEAK(live);
    }
    live += z->w3 + z->b3; /* in_proj's gradients concatenated */
    PEAK(live);
    return peak - (grads[0] + grads[1] + grads[2] + z->w3 + z->b3 + z->ee + z->eb);
}

static int64_t mha_bwd_fused(const mha_bwd_sizes *z, const ebb_attention_fused_bytes *fb) {
    int64_t q = z->q, k = z->k, live = q + 2 * k, peak = 0;
    PEAK(live + q + fb->lse + fb->forward); /* the forward kernel */
    live += q + fb->lse + z->ee + z->eb;    /* its output and log-sum-exp; out_proj's gradients */
    live += q;                              /* grad_out's projection */
    PEAK(live + q + 2 * k + fb->backward);  /* the backward kernel */
    live += q + 2 * k;
    live -= (q + 2 * k) + q + fb->lse + q; /* q, k, v, the output, its log-sum-exp, g_o */
    return mha_bwd_tail(z, live, peak);
}

static int64_t mha_bwd_composite(const mha_bwd_sizes *z, int64_t b, int64_t t, int64_t s,
                                 int64_t h) {
    int64_t q = z->q, k = z->k, p = z->p;
    int64_t cq = b > 1 && h > 1 && t > 1 ? q : 0, ck = b > 1 && h > 1 && s > 1 ? k : 0;
    int64_t mq = h > 1 && t > 1 ? q : 0, mk = h > 1 && s > 1 ? k : 0;
    int64_t scalar = z->scalar, mask = z->mask;
    int64_t live = q + 2 * k, peak = 0;
    PEAK(live + cq + ck + p); /* q k^T */
    live += p;
    PEAK(live + (scalar > mask ? scalar : mask));
    live += p;                /* probabilities */
    if (z->drop) {
        PEAK(live + 2 * p + scalar); /* dropped: p * mask, a temporary, times the scale */
        live += p;
    }
    PEAK(live + ck + q);      /* p v */
    PEAK(live + q + mq);      /* ... its heads merged */
    live += q + z->ee;             /* merged; out_proj's weight gradient */
    PEAK(live + z->eb + z->sum_q); /* its bias's, summed */
    live += z->eb + q;             /* grad_out's projection */
    PEAK(live + cq + ck + p);      /* g_p */
    live += p;
    PEAK(live + cq + k); /* g_v */
    live += k;
    if (z->drop)
        PEAK(live + 2 * p + scalar); /* g_p back through the mask, replacing it */
    PEAK(live + 2 * p + scalar); /* g_s and its scaling */
    live += p;
    PEAK(live + ck + q); /* g_q */
    live += q;
    PEAK(live + cq + k); /* g_k */
    live += k + mq + 2 * mk;
    return mha_bwd_tail(z, live, peak);
}
#undef PEAK

/* One allocation of n bytes: as is on the CPU, a caching allocator's block on CUDA. */
static int64_t mha_bytes(int64_t n, int cuda) { return cuda ? ebb_cuda_block(n) : n; }

static int64_t mha_bwd_scratch(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                               ebb_dtype dt, int cuda) {
    if (in[0].ndim != 3 || a[A_HEADS].i < 1 || n_in < 1 || n_in > 3)
        return 0;
    int64_t b = in[0].dim[0], t = in[0].dim[1], e = in[0].dim[2], h = a[A_HEADS].i;
    int64_t s = n_in > 1 && in[1].ndim == 3 ? in[1].dim[1] : t, size = (int64_t)ebb_dtype_size(dt);
    int64_t eb = a[A_BIAS].i ? e * size : 0, mask = a[A_CAUSAL].i ? t * s : 0;
    mha_bwd_sizes z = {.q = mha_bytes(b * t * e * size, cuda),
                       .k = mha_bytes(b * s * e * size, cuda),
                       .ee = mha_bytes(e * e * size, cuda),
                       .eb = mha_bytes(eb, cuda),
                       .w3 = mha_bytes(3 * e * e * size, cuda),
                       .b3 = mha_bytes(3 * eb, cuda),
                       .p = mha_bytes(b * h * t * s * size, cuda),
                       .scalar = cuda ? 0 : ebb_ops_scalar_bytes(dt),
                       .mask = mha_bytes(mask, cuda),
                       .sum_q = cuda && eb ? ebb_ops_cuda_sum_staging(b * t, e, size) : 0,
                       .sum_k = cuda && eb ? ebb_ops_cuda_sum_staging(b * s, e, size) : 0,
                       .n_in = n_in,
                       .drop = a[A_DROPOUT].f > 0};
    if (!cuda && !z.drop && ebb_attention_fused(dt, e / h, e / h, t, s)) {
        ebb_attention_fused_bytes fb;
        ebb_attention_fused_bytes_get(b, h, t, s, e / h, dt, ebb_tensor_num_threads(), &fb);
        return mha_bwd_fused(&z, &fb);
    }
    return mha_bwd_composite(&z, b, t, s, h);
}

static int64_t mha_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt) {
    return mha_bwd_scratch(a, in, n_in, dt, 0);
}

static int64_t mha_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    return mha_bwd_scratch(a, in, n_in, dt, 1);
}

static const ebb_op_grad mha_grad = {.backward = mha_bwd, .forward_train = mha_train,
                                     .saves_inputs = 0x7u, .n_saved = 1,
                                     .differentiable = 0x7u, .workspace = mha_bwd_workspace,
                                     .train_workspace = mha_train_workspace,
                                     .workspace_cuda = mha_bwd_workspace_cuda,
                                     .train_workspace_cuda = mha_train_workspace_cuda,
                                     .workspace_cuda_is_bound = 1, .draws = mha_draws};

/* ---- scaled_dot_product_attention ------------------------------------------------
 *
 * softmax(q k^T / sqrt(E) [+ mask]) v over values the flow made, as
 * F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal):
 * q [..., L, E], k [..., S, E], v [..., S, Ev], usually [B, H, T, D] heads
 * split by reshape and transpose, and an optional fourth input, the mask.
 * No parameters. */

enum { S_CAUSAL, S_DROPOUT };

static const ebb_attr_spec sdpa_attrs[] = {
    {.name = "causal", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "query i attends to keys j <= i only (top-left aligned, as is_causal)"},
    {.name = "dropout", .type = EBB_ATTR_FLOAT, .default_number = 0,
     .doc = "drop attention probabilities with this probability while training"},
};

static const ebb_tensor *sdpa_mask(ebb_tensor *const *in, int n_in) {
    return n_in > 3 ? in[3] : NULL;
}

static ebb_status sdpa_fwd(const ebb_op_call *c, ebb_tensor **out) {
    const ebb_attr_value *a = c->attrs;
    ebb_status st = EBB_OK;
    if (!(a[S_DROPOUT].f >= 0 && a[S_DROPOUT].f < 1))
        st = ebb_error_set(EBB_ERR_ARG, "dropout=%g is not in [0, 1)", a[S_DROPOUT].f);
    else if (c->n_in > 3)
        st = ebb_tensor_attention_ex(out, NULL, c->in[0], c->in[1], c->in[2], c->in[3],
                                     a[S_CAUSAL].i != 0, 0.0, 0);
    else
        st = ebb_tensor_attention(out, c->in[0], c->in[1], c->in[2], a[S_CAUSAL].i != 0);
    if (st != EBB_OK)
        ebb_error_prefix("scaled_dot_product_attention");
    return st;
}

/* Training: with dropout, the probabilities are dropped by a mask drawn from
 * the step's seed, kept for the backward; without, the extra is empty. */
static ebb_status sdpa_train(const ebb_op_call *c, ebb_tensor **out, ebb_tensor **saved) {
    double p = c->attrs[S_DROPOUT].f;
    ebb_status st;
    if (p > 0) {
        st = ebb_tensor_attention_ex(out, &saved[0], c->in[0], c->in[1], c->in[2],
                                     sdpa_mask(c->in, c->n_in), c->attrs[S_CAUSAL].i != 0, p,
                                     c->seed);
        if (st != EBB_OK)
            ebb_error_prefix("scaled_dot_product_attention");
        return st;
    }
    st = sdpa_fwd(c, out);
    if (st == EBB_OK)
        st = ebb_tensor_empty(&saved[0], &EBB_SHAPE(0), EBB_BOOL, ebb_tensor_device(c->in[0]));
    if (st != EBB_OK) {
        ebb_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

static int sdpa_draws(const ebb_attr_value *a) { return a[S_DROPOUT].f > 0; }

/* The sizes of one call, in bytes: q, k, v, the output (grad_out), the
 * B*H*L*S scores (p) and their count (n); `copy` says whether a batched
 * product may copy its operands (more than one batch dim over 1: a
 * head-split view's batch dims cannot be merged without a copy); `mask` is
 * what a bool mask's negation takes (a float mask is added in place, but the
 * dtype is not known here: a bound), `keep` and `draw` the dropout mask and
 * the float32 uniforms it is drawn from. */
typedef struct sdpa_sizes {
    int64_t q, k, v, o, p, n, ls, batch, l, s, e, mask, keep, draw, scalar;
    int copy, causal;
} sdpa_sizes;

static int sdpa_sizes_of(const ebb_attr_value *a, const ebb_shape *in, int n_in, ebb_dtype dt,
                         int train, sdpa_sizes *z) {
    if (n_in < 3 || in[0].ndim < 2 || in[1].ndim != in[0].ndim || in[2].ndim != in[0].ndim)
        return 0;
    int nd = in[0].ndim, big = 0;
    int64_t size = (int64_t)ebb_dtype_size(dt), batch = 1;
    for (int i = 0; i < nd - 2; i++) {
        batch *= in[0].dim[i];
        big += in[0].dim[i] > 1;
    }
    z->l = in[0].dim[nd - 2], z->s = in[1].dim[nd - 2], z->e = in[0].dim[nd - 1];
    z->batch = batch;
    z->q = batch * z->l * z->e * size;
    z->k = batch * z->s * z->e * size;
    z->v = batch * z->s * in[2].dim[nd - 1] * size;
    z->o = batch * z->l * in[2].dim[nd - 1] * size;
    z->n = batch * z->l * z->s;
    z->p = z->n * size;
    z->ls = z->l * z->s;
    z->copy = big > 1;
    z->causal = a[S_CAUSAL].i != 0;
    z->mask = n_in > 3 ? ebb_shape_numel(&in[3]) : 0;
    z->keep = train && a[S_DROPOUT].f > 0 ? z->n : 0;
    z->draw = z->keep ? 4 * z->n : 0;
    z->scalar = ebb_ops_scalar_bytes(dt);
    return 1;
}

/* the fused kernels: libtorch 2.x on the CPU, 4-D, no mask, no dropout */
static int sdpa_fused(const ebb_shape *in, int n_in, ebb_dtype dt, const sdpa_sizes *z) {
    return n_in == 3 && !z->keep && in[0].ndim == 4 &&
           ebb_attention_fused(dt, z->e, in[2].dim[3], z->l, z->s);
}

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

/* The forward's scratch beyond its output (and the dropout mask it keeps).
 * Fused: the kernel's log-sum-exp and per-thread blocks. Otherwise matmul
 * and softmax: the scores; the Scalar of the scaling, the causal mask, a bool
 * mask's negation; the probabilities beside the scores; the dropout mask's
 * uniforms and the dropped probabilities; then the product. A batched
 * product of head-split views first copies its operands (counted: a bound). */
static int64_t sdpa_scratch(const ebb_attr_value *a, const ebb_shape *in, int n_in, ebb_dtype dt,
                            int train) {
    sdpa_sizes z;
    if (!sdpa_sizes_of(a, in, n_in, dt, train, &z))
        return 0;
    if (sdpa_fused(in, n_in, dt, &z)) {
        ebb_attention_fused_bytes fb;
        ebb_attention_fused_bytes_get(in[0].dim[0], in[0].dim[1], z.l, z.s, z.e, dt,
                                      ebb_tensor_num_threads(), &fb);
        return fb.lse + fb.forward;
    }
    int64_t cq = z.copy ? z.q : 0, ck = z.copy ? z.k : 0, cv = z.copy ? z.v : 0;
    int64_t peak = z.p + cq + ck;
    peak = MAX2(peak, z.p + MAX2(MAX2(z.scalar, z.causal ? z.ls : 0), z.mask));
    peak = MAX2(peak, 2 * z.p);
    if (z.keep) {
        /* the mask drawn from float32 uniforms compared with a Scalar; then
         * applied (native_dropout_backward: p * mask, a temporary, times the
         * scale, a Scalar, into the dropped probabilities) */
        peak = MAX2(peak, z.p + z.draw + ebb_ops_scalar_bytes(EBB_FLOAT32) + z.keep);
        peak = MAX2(peak, 3 * z.p + z.scalar + z.keep);
    }
    return MAX2(peak, z.p + z.keep + cv + z.o) - z.o - z.keep;
}

static int64_t sdpa_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_dtype dt) {
    return sdpa_scratch(a, in, n_in, dt, 0);
}

static int64_t sdpa_train_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    return sdpa_scratch(a, in, n_in, dt, 1);
}

/* On CUDA at::scaled_dot_product_attention picks a fused kernel or the math
 * path by device: the bound takes the math path's scores, probabilities and
 * their companions (as multi_head_attention's), each a block, beside copies
 * of q, k and v, and the dropout mask's draw. */
static int64_t sdpa_cuda_scratch(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                 ebb_dtype dt, int train) {
    sdpa_sizes z;
    if (!sdpa_sizes_of(a, in, n_in, dt, train, &z))
        return 0;
    int64_t p = ebb_cuda_block(z.p);
    return ebb_cuda_block(z.q) + ebb_cuda_block(z.k) + ebb_cuda_block(z.v) + 4 * p +
           ebb_cuda_block(z.n) + (z.causal ? ebb_cuda_block(z.ls) : 0) + ebb_cuda_block(z.mask) +
           (z.keep ? p + ebb_cuda_block(z.draw) : 0) +
           ebb_cuda_block(z.batch * ((z.l + 31) / 32 * 32) * 4) + 2 * 512;
}

static int64_t sdpa_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    return sdpa_cuda_scratch(a, in, n_in, dt, 0);
}

static int64_t sdpa_train_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                         ebb_dtype dt) {
    return sdpa_cuda_scratch(a, in, n_in, dt, 1);
}

/* q, k and v get gradients; the mask none. */
static ebb_status sdpa_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    double p = c->attrs[S_DROPOUT].f;
    ebb_status st = ebb_tensor_attention_backward(
        &gin[0], &gin[1], &gin[2], c->grad_out, c->in[0], c->in[1], c->in[2],
        sdpa_mask(c->in, c->n_in), p > 0 && c->n_saved > 0 ? c->saved[0] : NULL,
        c->attrs[S_CAUSAL].i != 0, p);
    if (st != EBB_OK)
        ebb_error_prefix("scaled_dot_product_attention");
    return st;
}

/* The backward's scratch beyond the three gradients it returns, following
 * ebb_tensor_attention_backward. Fused: the forward kernel's output and
 * log-sum-exp beside its blocks, then beside the backward kernel's
 * gradients and blocks. Otherwise, with G, Q, K the gradients of v, q, k:
 * the probabilities recomputed as in the forward (P), the dropped ones (P)
 * while G is made, g_p (P), its dropout and softmax backwards (P each) while
 * g_p lives, then Q and K; head-split operands may be copied by each
 * product (counted: a bound). */
static int64_t sdpa_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    sdpa_sizes z;
    if (!sdpa_sizes_of(a, in, n_in, dt, 1, &z))
        return 0;
    int64_t grads = z.q + z.k + z.v;
    if (sdpa_fused(in, n_in, dt, &z)) {
        ebb_attention_fused_bytes fb;
        ebb_attention_fused_bytes_get(in[0].dim[0], in[0].dim[1], z.l, z.s, z.e, dt,
                                      ebb_tensor_num_threads(), &fb);
        /* the kernel reads grad_out laid out [B, L, H, D] and copies it
         * there unless it already is (a gradient through a head-split view
         * is; a contiguous one is not): counted, a bound */
        int64_t peak =
            MAX2(z.o + fb.lse + fb.forward, 2 * z.o + fb.lse + grads + fb.backward);
        return peak - grads;
    }
    int64_t cq = z.copy ? z.q : 0, ck = z.copy ? z.k : 0, cv = z.copy ? z.v : 0;
    int64_t cg = z.copy ? z.o : 0, p = z.p, pd = z.keep ? p : 0;
    int64_t peak = p + cq + ck;                                                   /* q k^T */
    peak = MAX2(peak, p + MAX2(MAX2(z.scalar, z.causal ? z.ls : 0), z.mask));     /* masked */
    peak = MAX2(peak, 2 * p);                                                     /* softmax */
    if (pd) /* dropped: p * mask, a temporary, times the scale */
        peak = MAX2(peak, 3 * p + z.scalar);
    peak = MAX2(peak, p + pd + z.v + cg);          /* g_v = (dropped p)^T g */
    peak = MAX2(peak, 2 * p + z.v + cg + cv);      /* g_p = g v^T */
    if (pd) /* its dropout backward, a temporary beside it */
        peak = MAX2(peak, 4 * p + z.v + z.scalar);
    peak = MAX2(peak, 3 * p + z.v);                /* its softmax backward */
    peak = MAX2(peak, p + z.v + z.scalar);         /* scaled */
    peak = MAX2(peak, p + z.v + z.q + ck);         /* g_q = g_s k */
    peak = MAX2(peak, p + grads + cq);             /* g_k = g_s^T q */
    return peak - grads;
}

static int64_t sdpa_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                       ebb_dtype dt) {
    sdpa_sizes z;
    if (!sdpa_sizes_of(a, in, n_in, dt, 1, &z))
        return 0;
    return 6 * ebb_cuda_block(z.p) + ebb_cuda_block(z.q) + ebb_cuda_block(z.k) +
           2 * ebb_cuda_block(z.v) + ebb_cuda_block(z.o) + (z.causal ? ebb_cuda_block(z.ls) : 0) +
           ebb_cuda_block(z.mask) + ebb_cuda_block(z.batch * ((z.l + 31) / 32 * 32) * 4) +
           2 * 512;
}
#undef MAX2

static const ebb_op_grad sdpa_grad = {.backward = sdpa_bwd, .forward_train = sdpa_train,
                                      .saves_inputs = 0xfu, .n_saved = 1,
                                      .differentiable = 0x7u, .workspace = sdpa_bwd_workspace,
                                      .workspace_is_bound = 1,
                                      .train_workspace = sdpa_train_workspace,
                                      .workspace_cuda = sdpa_bwd_workspace_cuda,
                                      .train_workspace_cuda = sdpa_train_workspace_cuda,
                                      .workspace_cuda_is_bound = 1, .draws = sdpa_draws};

/* ---- _cached_attention ---------------------------------------------------------
 *
 * What a plan compiled with a key/value cache (ebb_compile_options.kv_cache)
 * runs in place of a causal scaled_dot_product_attention: inputs q [B, H, t,
 * D], k [B, Hkv, t, D], v [B, Hkv, t, Dv] (the key and value heads before
 * grouped-query attention repeats them, H = Hkv * repeats) and the cache's
 * two tensors kc [B, Hkv, C, D] and vc [B, Hkv, C, Dv], state the run holds
 * (ebb_op.state_inputs). The run's t positions start at ebb_op_call.position:
 *   - k and v are written into the cache at [position, position + t);
 *   - from position 0 (a prompt) the attention is the causal one the plan
 *     without a cache computes, on the same tensors, by the same calls;
 *   - one position later on (a generated token) its query attends to the
 *     position + 1 keys the cache holds, without a mask; grouped heads are
 *     read as [B, Hkv, repeats, D] queries per key head, so the cache is
 *     never repeated.
 * t > 1 after position 0 is refused: a cache takes a prompt from its start,
 * then a position a run. */

enum { C_REPEATS };

static const ebb_attr_spec cached_attrs[] = {
    {.name = "repeats", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "query heads per key/value head (grouped-query attention)"},
};

static ebb_status cached_check(const ebb_op_call *c, const ebb_shape *sh) {
    int64_t rep = c->attrs[C_REPEATS].i;
    const ebb_shape *q = &sh[0], *k = &sh[1], *v = &sh[2], *kc = &sh[3], *vc = &sh[4];
    int ok = rep >= 1;
    for (int i = 0; i < 5; i++)
        ok = ok && sh[i].ndim == 4 && sh[i].dim[0] == q->dim[0];
    ok = ok && q->dim[1] == k->dim[1] * rep && k->dim[1] == v->dim[1] &&
         q->dim[2] == k->dim[2] && k->dim[2] == v->dim[2] && q->dim[3] == k->dim[3] &&
         kc->dim[1] == k->dim[1] && kc->dim[3] == k->dim[3] && vc->dim[1] == v->dim[1] &&
         vc->dim[3] == v->dim[3] && vc->dim[2] == kc->dim[2];
    if (ok)
        return EBB_OK;
    char b[5][96];
    for (int i = 0; i < 5; i++)
        ebb_shape_str(&sh[i], b[i], sizeof b[i]);
    return ebb_error_set(EBB_ERR_SHAPE,
                         "query %s, key %s, value %s, cache %s and %s with repeats=%lld do not "
                         "fit [B, H, t, D], [B, Hkv, t, D] twice, [B, Hkv, C, D] twice "
                         "(H = Hkv * repeats)",
                         b[0], b[1], b[2], b[3], b[4], (long long)rep);
}

/* From position 0: the causal attention over the run's own keys. */
static ebb_status cached_prompt(const ebb_op_call *c, ebb_tensor **out) {
    int64_t rep = c->attrs[C_REPEATS].i;
    ebb_tensor *k = NULL, *v = NULL;
    ebb_status st = ebb_tensor_repeat_interleave(&k, c->in[1], 1, rep);
    if (st == EBB_OK)
        st = ebb_tensor_repeat_interleave(&v, c->in[2], 1, rep);
    if (st == EBB_OK)
        st = ebb_tensor_attention(out, c->in[0], k, v, true);
    ebb_tensor_free(k);
    ebb_tensor_free(v);
    return st;
}

/* One position after `pos` others: its query over the pos + 1 cached keys. */
static ebb_status cached_next(const ebb_op_call *c, const ebb_shape *sh, int64_t pos,
                              ebb_tensor **out) {
    int64_t rep = c->attrs[C_REPEATS].i, b = sh[0].dim[0], hkv = sh[1].dim[1];
    ebb_tensor *k = NULL, *v = NULL, *q = NULL, *o = NULL;
    ebb_status st = ebb_tensor_narrow(&k, c->in[3], 2, 0, pos + 1);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&v, c->in[4], 2, 0, pos + 1);
    if (st == EBB_OK && rep == 1) {
        st = ebb_tensor_attention(out, c->in[0], k, v, false);
    } else if (st == EBB_OK) {
        /* query head h reads key head h / repeats: [B, Hkv, repeats, D] */
        ebb_shape grouped = EBB_SHAPE(b, hkv, rep, sh[0].dim[3]);
        ebb_shape heads = EBB_SHAPE(b, sh[0].dim[1], 1, sh[2].dim[3]);
        st = ebb_tensor_reshape(&q, c->in[0], &grouped);
        if (st == EBB_OK)
            st = ebb_tensor_attention(&o, q, k, v, false);
        if (st == EBB_OK)
            st = ebb_tensor_reshape(out, o, &heads);
    }
    ebb_tensor *tmp[] = {k, v, q, o};
    for (int i = 0; i < 4; i++)
        ebb_tensor_free(tmp[i]);
    return st;
}

static ebb_status cached_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape sh[5];
    for (int i = 0; i < 5; i++)
        sh[i] = ebb_tensor_shape(c->in[i]);
    ebb_status st = cached_check(c, sh);
    int64_t pos = c->position, t = sh[0].dim[2], cap = sh[3].dim[2];
    if (st == EBB_OK && pos + t > cap)
        st = ebb_error_set(EBB_ERR_ARG,
                           "the key/value cache holds %lld positions: %lld are filled and this "
                           "run adds %lld",
                           (long long)cap, (long long)pos, (long long)t);
    else if (st == EBB_OK && pos > 0 && t > 1)
        st = ebb_error_set(EBB_ERR_UNSUPPORTED,
                           "a run of %lld positions after %lld in the key/value cache: the "
                           "cache takes a prompt from position 0, then one position a run",
                           (long long)t, (long long)pos);
    ebb_tensor *kc = NULL, *vc = NULL;
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&kc, c->in[3], 2, pos, t);
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&vc, c->in[4], 2, pos, t);
    if (st == EBB_OK)
        st = ebb_tensor_copy_(kc, c->in[1]);
    if (st == EBB_OK)
        st = ebb_tensor_copy_(vc, c->in[2]);
    ebb_tensor_free(kc);
    ebb_tensor_free(vc);
    if (st == EBB_OK)
        st = pos == 0 ? cached_prompt(c, out) : cached_next(c, sh, pos, out);
    if (st != EBB_OK)
        ebb_error_prefix("_cached_attention");
    return st;
}

/* The scratch beyond the output. From position 0: the repeated keys and
 * values beside scaled_dot_product_attention's scratch for the same
 * shapes. One position (t = 1) may also be a later one, whose query reads
 * up to a full cache: the attention's scratch over C keys, whose batch dims
 * [B, Hkv] a product folds into one without copies (the cache's narrowed
 * view and the grouped query merge them), so the figure is the one for a
 * single batch dim; the fused kernels' output, laid out [B, L, H, D], is
 * copied when the heads are merged back. Counted too: the grouped query,
 * where a reshape cannot view it (a query that is not contiguous). The
 * larger of the two, which is an upper bound: the cache fills as the run
 * goes. `cuda`: in the caching allocator's blocks. */
static int64_t cached_scratch(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_dtype dt, int cuda) {
    if (n_in != 5 || in[0].ndim != 4 || in[1].ndim != 4 || in[2].ndim != 4 || in[3].ndim != 4)
        return 0;
    int64_t rep = a[C_REPEATS].i > 0 ? a[C_REPEATS].i : 1, size = (int64_t)ebb_dtype_size(dt);
    int64_t b = in[0].dim[0], h = in[0].dim[1], t = in[0].dim[2], d = in[0].dim[3];
    int64_t dv = in[2].dim[3], cap = in[3].dim[2];
    const ebb_attr_value causal[2] = {{EBB_ATTR_BOOL, 1, 1, 0, NULL},
                                      {EBB_ATTR_FLOAT, 1, 0, 0, NULL}};
    const ebb_attr_value open[2] = {{EBB_ATTR_BOOL, 1, 0, 0, NULL},
                                    {EBB_ATTR_FLOAT, 1, 0, 0, NULL}};
    ebb_shape prompt[3] = {in[0], EBB_SHAPE(b, h, t, d), EBB_SHAPE(b, h, t, dv)};
    int64_t kr = rep > 1 ? b * h * t * d * size : 0, vr = rep > 1 ? b * h * t * dv * size : 0;
    int64_t first = cuda ? ebb_cuda_block(kr) + ebb_cuda_block(vr) +
                               sdpa_cuda_scratch(causal, prompt, 3, dt, 0)
                         : kr + vr + sdpa_scratch(causal, prompt, 3, dt, 0);
    if (t != 1)
        return first;
    int64_t hkv = h / rep;
    int fused = !cuda && ebb_attention_fused(dt, d, dv, rep, cap);
    ebb_shape four[3] = {EBB_SHAPE(b, hkv, rep, d), EBB_SHAPE(b, hkv, cap, d),
                         EBB_SHAPE(b, hkv, cap, dv)};
    ebb_shape three[3] = {EBB_SHAPE(b * hkv, rep, d), EBB_SHAPE(b * hkv, cap, d),
                          EBB_SHAPE(b * hkv, cap, dv)};
    int64_t q = rep > 1 ? b * h * d * size : 0, o = rep > 1 && fused ? b * h * dv * size : 0;
    int64_t later = cuda ? ebb_cuda_block(q) + ebb_cuda_block(b * h * dv * size) +
                               sdpa_cuda_scratch(open, four, 3, dt, 0)
                         : q + o + sdpa_scratch(open, fused ? four : three, 3, dt, 0);
    return first > later ? first : later;
}

static int64_t cached_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_dtype dt) {
    return cached_scratch(a, in, n_in, dt, 0);
}

static int64_t cached_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                     ebb_dtype dt) {
    return cached_scratch(a, in, n_in, dt, 1);
}

/* Self-attention's scores and weighted sums over its [B, T, E] output:
 * 2 B T^2 E each; the projections are its parameters' products. */
static int64_t mha_flops(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                         const ebb_shape *out) {
    (void)a;
    (void)in;
    (void)n_in;
    return out->ndim == 3 ? 4 * out->dim[0] * out->dim[1] * out->dim[1] * out->dim[2] : 0;
}

const ebb_op ebb_ops_attention[] = {
    {.name = "multi_head_attention", .min_inputs = 1, .max_inputs = 3, .attrs = mha_attrs,
     .n_attrs = EBB_COUNT(mha_attrs), .params = mha_params, .forward = mha_fwd,
     .doc = "multi-head attention over [B, T, E] (self; or cross with `using` key[, value])",
     .workspace = mha_workspace, .grad = &mha_grad, .workspace_cuda = mha_workspace_cuda,
     .workspace_cuda_is_bound = 1, .autocast = EBB_AUTOCAST_LOW, .flops = mha_flops},
    {.name = "scaled_dot_product_attention", .min_inputs = 3, .max_inputs = 4,
     .attrs = sdpa_attrs, .n_attrs = EBB_COUNT(sdpa_attrs), .forward = sdpa_fwd,
     .doc = "softmax(q k^T / sqrt(E) [+ mask]) v over q, k, v [..., T, E] (merge three "
            "streams; a fourth, `using`, is the mask)",
     .workspace = sdpa_workspace, .workspace_is_bound = 1, .grad = &sdpa_grad,
     .workspace_cuda = sdpa_workspace_cuda, .workspace_cuda_is_bound = 1,
     .autocast = EBB_AUTOCAST_LOW},
    {.name = "_cached_attention", .min_inputs = 5, .max_inputs = 5, .attrs = cached_attrs,
     .n_attrs = EBB_COUNT(cached_attrs), .forward = cached_fwd,
     .doc = "causal attention through a key/value cache (what a plan compiled with "
            "kv_cache runs for scaled_dot_product_attention)",
     .workspace = cached_workspace, .workspace_cuda = cached_workspace_cuda,
     .workspace_cuda_is_bound = 1, .autocast = EBB_AUTOCAST_LOW, .state_inputs = 0x18u},
};
const int ebb_ops_attention_count = EBB_COUNT(ebb_ops_attention);
