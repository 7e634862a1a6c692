/* Small arithmetic ops: scale by a constant, mean and sum over dims; and the
 * ops attention is written with when written out: matmul between values,
 * masked_fill and the causal mask. */
#include <math.h>

#include "ops_internal.h"

static const ebb_attr_spec scale_attrs[] = {
    {.name = "factor", .type = EBB_ATTR_FLOAT, .required = 1, .doc = "the multiplier"},
};

static ebb_status scale_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_affine(out, c->in[0], c->attrs[0].f, 0.0);
}

/* A factor of 1 is a copy. Any other is a Scalar operand; an integer input
 * computes in float32, through a float32 copy of itself. */
static int64_t scale_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                               ebb_dtype dt) {
    (void)n_in;
    if (a[0].f == 1.0)
        return 0;
    if (ebb_ops_is_floating(dt))
        return ebb_ops_scalar_bytes(dt);
    int64_t numel = ebb_shape_numel(&in[0]);
    return ebb_ops_scalar_bytes(EBB_FLOAT32) + (numel > 0 ? numel : 0) * 4;
}

/* CUDA: a Scalar operand stays on the CPU; an integer input's float32 copy
 * is a block on the device. */
static int64_t scale_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)n_in;
    if (a[0].f == 1.0 || ebb_ops_is_floating(dt))
        return 0;
    return ebb_cuda_block(ebb_shape_numel(&in[0]) * 4);
}

enum { A_DIMS, A_DIM, A_KEEPDIM };

static const ebb_attr_spec reduce_attrs[] = {
    {.name = "dims", .type = EBB_ATTR_STRING,
     .doc = "dims to reduce, comma-separated (\"1,2\"); with `dim` unset too: all dims"},
    {.name = "dim", .type = EBB_ATTR_INT, .optional = 1, .doc = "a single dim to reduce"},
    {.name = "keepdim", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "keep reduced dims with size 1"},
};

/* The dims the attributes reduce over an input of shape x, checked and made
 * non-negative, into dims[EBB_MAX_DIMS]; *n gets their count. */
static ebb_status reduced_dims(const char *name, const ebb_attr_value *a, const ebb_shape *x,
                               int64_t *dims, int *n) {
    ebb_status st = EBB_OK;
    *n = 0;
    if (a[A_DIMS].set && a[A_DIM].set)
        return ebb_error_set(EBB_ERR_ARG, "%s: give dims or dim, not both", name);
    if (a[A_DIMS].set)
        st = ebb_ops_parse_ints(name, "dims", a[A_DIMS].s, dims, EBB_MAX_DIMS, n);
    else if (a[A_DIM].set)
        dims[(*n)++] = a[A_DIM].i;
    if (st != EBB_OK)
        return st;
    int seen[EBB_MAX_DIMS] = {0};
    for (int i = 0; i < *n; i++) {
        if ((st = ebb_ops_check_dim(name, dims[i], x, &dims[i])) != EBB_OK)
            return st;
        if (seen[dims[i]]++)
            return ebb_error_set(EBB_ERR_ARG, "%s: dim %lld is listed twice", name,
                                 (long long)dims[i]);
    }
    if (a[A_DIMS].set && *n == 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: dims=\"%s\" lists no dims", name, a[A_DIMS].s);
    if (*n == 0) /* every dim, listed so that keepdim is honoured */
        for (; *n < x->ndim; (*n)++)
            dims[*n] = *n;
    return EBB_OK;
}

static ebb_status reduce(const ebb_op_call *c, ebb_reduce_op op, ebb_tensor **out) {
    *out = NULL;
    const char *name = c->op ? c->op->name : (op == EBB_REDUCE_SUM ? "sum" : "mean");
    int64_t dims[EBB_MAX_DIMS];
    int n = 0;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    ebb_status st = reduced_dims(name, c->attrs, &x, dims, &n);
    if (st != EBB_OK)
        return st;
    return ebb_tensor_reduce(out, op, c->in[0], dims, n, c->attrs[A_KEEPDIM].i != 0);
}

/* The reduction's two-pass scratch (see ebb_ops_reduce_scratch). */
static int64_t reduce_scratch(const char *name, const ebb_attr_value *a, const ebb_shape *x,
                              ebb_dtype dt) {
    int64_t dims[EBB_MAX_DIMS], kept = 1;
    int n = 0, reduced[EBB_MAX_DIMS] = {0};
    if (reduced_dims(name, a, x, dims, &n) != EBB_OK)
        return 0; /* the dry run has reported it */
    for (int i = 0; i < n; i++)
        reduced[dims[i]] = 1;
    for (int d = 0; d < x->ndim; d++)
        kept *= reduced[d] ? 1 : x->dim[d];
    return ebb_ops_reduce_scratch(ebb_shape_numel(x), kept, dt);
}

static ebb_status mean_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return reduce(c, EBB_REDUCE_MEAN, out);
}

/* libtorch's CPU mean is a sum into the output divided in place by the
 * element count, an int64 Scalar (see ebb_ops_wrapped_scalar_bytes); the
 * sum's own scratch is gone by then. */
static int64_t mean_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                              ebb_dtype dt) {
    (void)n_in;
    int64_t scalar = ebb_ops_wrapped_scalar_bytes(EBB_INT64, dt);
    int64_t sum = reduce_scratch("mean", a, &in[0], dt);
    return scalar > sum ? scalar : sum;
}

static int64_t sum_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                             ebb_dtype dt) {
    (void)n_in;
    return reduce_scratch("sum", a, &in[0], dt);
}

static ebb_status sum_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return reduce(c, EBB_REDUCE_SUM, out);
}

/* ---- backward rules ---------------------------------------------------------- */

static ebb_status scale_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_affine(&gin[0], c->grad_out, c->attrs[0].f, 0.0);
}
/* grad_out times the factor: the forward's Scalar operand again. On CUDA
 * the Scalar stays on the CPU (and the gradient is floating): no scratch. */
static int64_t scale_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    (void)in;
    (void)n_in;
    if (a[0].f == 1.0)
        return 0;
    return ebb_ops_scalar_bytes(ebb_ops_is_floating(dt) ? dt : EBB_FLOAT32);
}
static const ebb_op_grad scale_grad = {.backward = scale_bwd, .differentiable = 1u,
                                       .workspace = scale_bwd_workspace,
                                       .workspace_cuda = ebb_ops_no_cuda_scratch};

/* The gradient is grad_out spread back over the reduced dims: only the
 * input's shape is needed, so the input is not saved. */
static ebb_status reduce_bwd(const ebb_op_grad_call *c, bool mean, ebb_tensor **gin) {
    int64_t dims[EBB_MAX_DIMS];
    int n = 0;
    ebb_shape x = c->in_shapes[0];
    ebb_status st = reduced_dims(c->op->name, c->attrs, &x, dims, &n);
    if (st != EBB_OK)
        return st;
    /* n == 0 (a scalar input) means "all", which is nothing to spread */
    return ebb_tensor_reduce_backward(&gin[0], c->grad_out, &x, dims, n,
                                      c->attrs[A_KEEPDIM].i != 0 || x.ndim == 0, mean);
}
static ebb_status mean_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return reduce_bwd(c, true, gin);
}
static ebb_status sum_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return reduce_bwd(c, false, gin);
}
/* mean's gradient is grad_out spread over the input and divided by the
 * element count, a Scalar operand (sum's is a copy: nothing beside it). On
 * CUDA the Scalar stays on the CPU and the spread is a view: no scratch. */
static int64_t mean_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                  ebb_dtype dt) {
    (void)a;
    (void)in;
    (void)n_in;
    return ebb_ops_scalar_bytes(dt);
}
static const ebb_op_grad mean_grad = {.backward = mean_bwd, .differentiable = 1u,
                                      .workspace = mean_bwd_workspace,
                                      .workspace_cuda = ebb_ops_no_cuda_scratch};
static const ebb_op_grad sum_grad = {.backward = sum_bwd, .differentiable = 1u};

/* ---- matmul ------------------------------------------------------------------------
 * a @ b between two values (the stream and a `using` tensor), as torch.matmul
 * for operands of 2 or more dims: [..., M, K] @ [..., K, N] -> [..., M, N],
 * the leading dims broadcast. */

typedef struct mm_dims {
    ebb_shape batch;    /* the broadcast leading dims */
    int64_t m, k, n, nb; /* nb: elements of `batch` */
    int a_full, b_full; /* the operand's leading dims are the broadcast ones */
} mm_dims;

static ebb_status mm_dims_of(const ebb_shape *a, const ebb_shape *b, mm_dims *d) {
    char x[128], y[128];
    if (a->ndim < 2 || b->ndim < 2 || a->dim[a->ndim - 1] != b->dim[b->ndim - 2])
        return ebb_error_set(EBB_ERR_SHAPE,
                             "matmul: %s @ %s do not fit [..., M, K] @ [..., K, N]",
                             ebb_shape_str(a, x, sizeof x), ebb_shape_str(b, y, sizeof y));
    int nd = (a->ndim > b->ndim ? a->ndim : b->ndim) - 2;
    d->batch.ndim = nd;
    d->nb = 1;
    d->a_full = a->ndim - 2 == nd;
    d->b_full = b->ndim - 2 == nd;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - (a->ndim - 2)), ib = i - (nd - (b->ndim - 2));
        int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "matmul: the leading dims of %s and %s do not broadcast",
                                 ebb_shape_str(a, x, sizeof x), ebb_shape_str(b, y, sizeof y));
        d->batch.dim[i] = da > db ? da : db;
        d->nb *= d->batch.dim[i];
        d->a_full &= ia >= 0 && da == d->batch.dim[i];
        d->b_full &= ib >= 0 && db == d->batch.dim[i];
    }
    d->m = a->dim[a->ndim - 2];
    d->k = a->dim[a->ndim - 1];
    d->n = b->dim[b->ndim - 1];
    return EBB_OK;
}

static ebb_status matmul_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape a = ebb_tensor_shape(c->in[0]), b = ebb_tensor_shape(c->in[1]);
    mm_dims d;
    ebb_status st = mm_dims_of(&a, &b, &d);
    return st == EBB_OK ? ebb_tensor_matmul(out, c->in[0], c->in[1]) : st;
}

/* A batched product folds the leading dims into one: an operand broadcast
 * over them is copied at the broadcast size first, and so is one whose
 * strides do not fold (a head-split view), which a plan cannot see: both
 * copies are counted where they can happen, so the figure is a bound. */
static int64_t matmul_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_dtype dt) {
    (void)a;
    mm_dims d;
    if (n_in != 2 || mm_dims_of(&in[0], &in[1], &d) != EBB_OK)
        return 0;
    int64_t size = (int64_t)ebb_dtype_size(dt);
    if (d.batch.ndim == 0)
        return 0;
    return (d.nb * d.m * d.k + d.nb * d.k * d.n) * size;
}

/* g @ b^T and a^T @ g, each summed to its operand's shape where that was
 * broadcast (the full product is then scratch). */
static ebb_status matmul_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_status st = EBB_OK;
    for (int j = 0; j < 2 && st == EBB_OK; j++) {
        if (c->skip_input_grad >> j & 1)
            continue;
        const ebb_tensor *other = c->in[1 - j];
        ebb_tensor *t = NULL, *full = NULL;
        int nd = ebb_tensor_ndim(other);
        st = ebb_tensor_transpose(&t, other, nd - 2, nd - 1);
        if (st == EBB_OK)
            st = j == 0 ? ebb_tensor_matmul(&full, c->grad_out, t)
                        : ebb_tensor_matmul(&full, t, c->grad_out);
        ebb_tensor_free(t);
        if (st != EBB_OK)
            break;
        ebb_shape fs = ebb_tensor_shape(full);
        if (ebb_shape_equal(&fs, &c->in_shapes[j])) {
            gin[j] = full;
            continue;
        }
        st = ebb_tensor_sum_to(&gin[j], full, &c->in_shapes[j]);
        ebb_tensor_free(full);
    }
    if (st != EBB_OK)
        ebb_error_prefix("matmul");
    return st;
}

static int64_t matmul_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)a;
    mm_dims d;
    if (n_in != 2 || mm_dims_of(&in[0], &in[1], &d) != EBB_OK)
        return 0;
    int64_t size = (int64_t)ebb_dtype_size(dt);
    int64_t ga = ebb_shape_numel(&in[0]) * size, gb = ebb_shape_numel(&in[1]) * size;
    int64_t gaf = d.nb * d.m * d.k * size, gbf = d.nb * d.k * d.n * size;
    int batched = d.batch.ndim > 0;
    /* operand copies where the product folds leading dims: g, and b^T or a^T */
    int64_t g = batched ? d.nb * d.m * d.n * size : 0;
    int64_t cb = batched ? gbf : 0, ca = batched ? gaf : 0;
    int64_t live = 0, peak = 0;
    peak = gaf + g + cb; /* g b^T */
    live = gaf;
    if (gaf != ga) {
        int64_t r = ebb_ops_reduce_scratch(gaf / size, ga / size, dt);
        peak = peak > gaf + ga + r ? peak : gaf + ga + r;
        live = ga;
    }
    int64_t p2 = live + gbf + g + ca; /* a^T g */
    peak = peak > p2 ? peak : p2;
    live += gbf;
    if (gbf != gb) {
        int64_t r = ebb_ops_reduce_scratch(gbf / size, gb / size, dt);
        int64_t p3 = live + gb + r;
        peak = peak > p3 ? peak : p3;
    }
    return peak - ga - gb;
}

static const ebb_op_grad matmul_grad = {.backward = matmul_bwd, .saves_inputs = 0x3u,
                                        .differentiable = 0x3u,
                                        .workspace = matmul_bwd_workspace,
                                        .workspace_is_bound = 1};

/* ---- masked_fill, causal_mask ---------------------------------------------------- */

static const ebb_attr_spec masked_fill_attrs[] = {
    {.name = "value", .type = EBB_ATTR_FLOAT, .default_number = -INFINITY,
     .doc = "what masked positions become (default -inf, for a softmax)"},
};

static ebb_status masked_fill_check(const ebb_shape *x, const ebb_shape *m) {
    int ok = m->ndim <= x->ndim;
    for (int i = 0; ok && i < m->ndim; i++) {
        int64_t dm = m->dim[m->ndim - 1 - i], dx = x->dim[x->ndim - 1 - i];
        ok = dm == dx || dm == 1;
    }
    if (ok)
        return EBB_OK;
    char a[128], b[128];
    return ebb_error_set(EBB_ERR_SHAPE, "masked_fill: the mask %s does not broadcast to the input %s",
                         ebb_shape_str(m, b, sizeof b), ebb_shape_str(x, a, sizeof a));
}

static ebb_status masked_fill_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]), m = ebb_tensor_shape(c->in[1]);
    ebb_status st = masked_fill_check(&x, &m);
    if (st == EBB_OK && ebb_tensor_dtype(c->in[1]) != EBB_BOOL)
        st = ebb_error_set(EBB_ERR_ARG, "masked_fill: the mask is %s, not bool (make it with "
                           "causal_mask or a comparison)", ebb_dtype_name(ebb_tensor_dtype(c->in[1])));
    if (st == EBB_OK)
        st = ebb_tensor_masked_fill(out, c->in[0], c->in[1], c->attrs[0].f);
    return st;
}

/* The gradient passes where the mask is false and is 0 where it was filled. */
static ebb_status masked_fill_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_masked_fill(&gin[0], c->grad_out, c->in[1], 0.0);
}
static const ebb_op_grad masked_fill_grad = {.backward = masked_fill_bwd, .saves_inputs = 0x2u,
                                             .differentiable = 0x1u};

static ebb_status causal_mask_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    if (x.ndim < 2) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE, "causal_mask: the input %s has no [..., T, S] to mask",
                             ebb_shape_str(&x, buf, sizeof buf));
    }
    return ebb_tensor_causal_mask(out, x.dim[x.ndim - 2], x.dim[x.ndim - 1],
                                  ebb_tensor_device(c->in[0]));
}

/* A bool mask carries no gradient back to the scores it was shaped after. */
static ebb_status causal_mask_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)c;
    (void)gin;
    (void)gp;
    return EBB_OK;
}
static const ebb_op_grad causal_mask_grad = {.backward = causal_mask_bwd, .differentiable = 0u};

/* ---- where ------------------------------------------------------------------
 *
 * Tensor.where(cond, y) (torch.where(cond, x, y)) over three streams (a
 * merge, or the stream and two `using` tensors): the values x, a bool
 * condition, the values y where it does not hold; all broadcast. The stream
 * comes first, as masked_fill's: `x where cond, else y`. */

static ebb_status where_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_where(out, c->in[1], c->in[0], c->in[2]);
}

static ebb_status where_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_where_backward(&gin[0], &gin[2], c->grad_out, c->in[1], &c->in_shapes[0],
                                     &c->in_shapes[2]);
}

/* x's gradient: the negated condition (a bool of the condition's shape) and
 * grad_out with zeros where it did not hold, then (where x was broadcast)
 * its sum; the mask goes once the fill is made, the fill once it is summed.
 * Then y's: the fill where the condition held, and its sum. A sum to the
 * output's own shape is the fill itself. (dt is x's dtype.) */
static int64_t where_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    (void)a, (void)n_in;
    ebb_shape out = ebb_ops_broadcast_shape(in, 3);
    int64_t n = ebb_shape_numel(&out), e = (int64_t)ebb_dtype_size(dt), o = n * e;
    int64_t live = 0, peak = ebb_shape_numel(&in[1]) + o, grads = 0;
    for (int i = 0; i <= 2; i += 2) {
        peak = live + o > peak ? live + o : peak;
        if (ebb_shape_equal(&in[i], &out)) {
            live += o;
            grads += o;
            continue;
        }
        int64_t r = ebb_shape_numel(&in[i]) * e;
        int64_t now = live + o + r + ebb_ops_reduce_scratch(n, r / e, dt);
        peak = now > peak ? now : peak;
        live += r;
        grads += r;
    }
    return peak - grads;
}

/* CUDA: the same walk in the caching allocator's blocks; the sums' partial
 * results stay in the kernel. */
static int64_t where_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)a, (void)n_in;
    ebb_shape out = ebb_ops_broadcast_shape(in, 3);
    int64_t o = ebb_cuda_block(ebb_shape_numel(&out) * (int64_t)ebb_dtype_size(dt));
    int64_t live = 0, peak = ebb_cuda_block(ebb_shape_numel(&in[1])) + o, grads = 0;
    for (int i = 0; i <= 2; i += 2) {
        peak = live + o > peak ? live + o : peak;
        int64_t r = ebb_shape_equal(&in[i], &out)
                        ? 0
                        : ebb_cuda_block(ebb_shape_numel(&in[i]) * (int64_t)ebb_dtype_size(dt));
        peak = live + o + r > peak ? live + o + r : peak;
        live += r ? r : o;
        grads += r ? r : o;
    }
    return peak - grads;
}

static const ebb_op_grad where_grad = {.backward = where_bwd, .saves_inputs = 0x2u,
                                       .differentiable = 0x5u,
                                       .workspace = where_bwd_workspace,
                                       .workspace_cuda = where_bwd_workspace_cuda};

/* ---- cast ------------------------------------------------------------------
 *
 * The stream in another floating dtype: what a mixed-precision plan puts
 * between a float32 value and a bfloat16 op (ebb_compile_options.precision),
 * and what a spec may write itself. To its own dtype it is the input. */
static const ebb_attr_spec cast_attrs[] = {
    {.name = "dtype", .type = EBB_ATTR_STRING, .required = 1,
     .doc = "float32, float64, bfloat16 or float16"},
};

static ebb_status cast_dtype(const ebb_attr_value *a, ebb_dtype *dt) {
    if (ebb_dtype_parse(dt, a[0].s) != EBB_OK || !ebb_ops_is_floating(*dt)) {
        ebb_error_clear();
        return ebb_error_set(EBB_ERR_ARG,
                             "cast: dtype '%s' is not float32, float64, bfloat16 or float16",
                             a[0].s ? a[0].s : "");
    }
    return EBB_OK;
}

static ebb_status cast_fwd(const ebb_op_call *c, ebb_tensor **out) {
    ebb_dtype dt;
    ebb_status st = cast_dtype(c->attrs, &dt);
    if (st == EBB_OK && !ebb_ops_is_floating(ebb_tensor_dtype(c->in[0])))
        return ebb_error_set(EBB_ERR_ARG, "cast: the input is %s; only floating values cast",
                             ebb_dtype_name(ebb_tensor_dtype(c->in[0])));
    return st == EBB_OK ? ebb_tensor_cast(out, c->in[0], dt) : st;
}

/* The gradient goes back in the input's dtype. */
static ebb_status cast_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    if (!c->in_dtypes)
        return ebb_error_set(EBB_ERR_ARG, "cast backward: the call gives no input dtypes");
    return ebb_tensor_cast(&gin[0], c->grad_out, c->in_dtypes[0]);
}
static const ebb_op_grad cast_grad = {.backward = cast_bwd, .differentiable = 1u,
                                      .workspace_cuda = ebb_ops_no_cuda_scratch};

const ebb_op ebb_ops_math[] = {
    {.name = "cast", .min_inputs = 1, .max_inputs = 1, .attrs = cast_attrs,
     .n_attrs = EBB_COUNT(cast_attrs), .forward = cast_fwd,
     .doc = "the stream in another floating dtype (its gradient back in the input's)",
     .grad = &cast_grad, .workspace_cuda = ebb_ops_no_cuda_scratch},
    {.name = "scale", .min_inputs = 1, .max_inputs = 1, .attrs = scale_attrs,
     .n_attrs = EBB_COUNT(scale_attrs), .forward = scale_fwd, .doc = "x * factor",
     .workspace = scale_workspace, .grad = &scale_grad, .workspace_cuda = scale_workspace_cuda},
    {.name = "mean", .min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs,
     .n_attrs = EBB_COUNT(reduce_attrs), .forward = mean_fwd, .doc = "mean over dims",
     .workspace = mean_workspace, .grad = &mean_grad, .workspace_cuda = ebb_ops_no_cuda_scratch,
     .autocast = EBB_AUTOCAST_FULL},
    {.name = "sum", .min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs,
     .n_attrs = EBB_COUNT(reduce_attrs), .forward = sum_fwd, .doc = "sum over dims",
     .workspace = sum_workspace, .grad = &sum_grad, .autocast = EBB_AUTOCAST_FULL},
    {.name = "matmul", .min_inputs = 2, .max_inputs = 2, .forward = matmul_fwd,
     .doc = "the stream @ a `using` tensor: [..., M, K] @ [..., K, N], leading dims broadcast",
     .workspace = matmul_workspace, .workspace_is_bound = 1, .grad = &matmul_grad,
     .autocast = EBB_AUTOCAST_LOW},
    {.name = "masked_fill", .min_inputs = 2, .max_inputs = 2, .attrs = masked_fill_attrs,
     .n_attrs = EBB_COUNT(masked_fill_attrs), .forward = masked_fill_fwd,
     .doc = "the stream with `value` where a bool `using` mask is true",
     .grad = &masked_fill_grad},
    {.name = "where", .min_inputs = 3, .max_inputs = 3, .forward = where_fwd,
     .doc = "the stream where the second input (bool) holds, else the third",
     .grad = &where_grad},
    {.name = "causal_mask", .min_inputs = 1, .max_inputs = 1, .forward = causal_mask_fwd,
     .doc = "bool [T, S], true where key j > query i, for an input [..., T, S]",
     .grad = &causal_mask_grad},
};
const int ebb_ops_math_count = EBB_COUNT(ebb_ops_math);
