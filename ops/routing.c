/* Ops that serve routing and loops: halting conditions and the weighted
 * accumulation a dense gate lowers to. */
#include <math.h>

#include "ops_internal.h"

static const ebb_attr_spec threshold_attrs[] = {
    {.name = "threshold", .type = EBB_ATTR_FLOAT, .default_number = 0.5,
     .doc = "the condition is true while max(x) > threshold"},
};

/* The maximum is reduced straight into the output and shifted there, so the
 * output is the only tensor made. An empty input (a batch with no rows left)
 * has no maximum, and its condition is false: -inf. */
static ebb_status threshold_halt_fwd(const ebb_op_call *c, ebb_tensor **out) {
    ebb_dtype dt = ebb_tensor_dtype(c->in[0]);
    if (ebb_tensor_numel(c->in[0]) == 0 && ebb_ops_is_floating(dt)) {
        ebb_shape scalar = {0};
        return ebb_tensor_full(out, &scalar, -INFINITY, dt, ebb_tensor_device(c->in[0]));
    }
    ebb_status st = ebb_tensor_reduce(out, EBB_REDUCE_MAX, c->in[0], NULL, 0, false);
    if (st == EBB_OK && (st = ebb_tensor_affine_(*out, 1.0, -c->attrs[0].f)) != EBB_OK) {
        ebb_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

/* The in-place shift passes libtorch a Scalar (see ebb_ops_scalar_bytes). */
static int64_t threshold_halt_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)n_in;
    return a[0].f != 0.0 && ebb_shape_numel(&in[0]) != 0 ? ebb_ops_scalar_bytes(dt) : 0;
}

/* _gate_mix(index=i): inputs (w, y) give w[:, i] * y; inputs (acc, w, y) give
 * acc + w[:, i] * y. A dense gate is a chain of these, so each expert's output
 * is freed as soon as it has been added in. */
static ebb_status gate_mix_fwd(const ebb_op_call *c, ebb_tensor **out) {
    const ebb_tensor *acc = c->n_in == 3 ? c->in[0] : NULL;
    const ebb_tensor *w = c->in[c->n_in - 2], *y = c->in[c->n_in - 1];
    int64_t i = c->attrs[0].i;
    ebb_shape ws = ebb_tensor_shape(w), ys = ebb_tensor_shape(y);
    if (ws.ndim != 2 || ys.ndim < 1 || ws.dim[0] != ys.dim[0] || i >= ws.dim[1]) {
        char a[96], b[96];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "gate: router output %s does not fit expert %lld output %s "
                             "(expected [batch, experts])",
                             ebb_shape_str(&ws, a, sizeof a), (long long)i,
                             ebb_shape_str(&ys, b, sizeof b));
    }
    ebb_tensor *col = NULL, *wcol = NULL;
    ebb_shape cs = ys;
    for (int d = 1; d < cs.ndim; d++)
        cs.dim[d] = 1;
    ebb_status st = ebb_tensor_narrow(&col, w, 1, i, 1);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&wcol, col, &cs);
    ebb_tensor_free(col);
    if (st == EBB_OK)
        st = acc ? ebb_tensor_addcmul(out, acc, y, wcol) : ebb_tensor_binary(out, EBB_MUL, y, wcol);
    ebb_tensor_free(wcol);
    return st;
}

static const ebb_attr_spec gate_mix_attrs[] = {
    {.name = "index", .type = EBB_ATTR_INT, .required = 1, .doc = "expert index"},
};

/* ---- backward rules ----------------------------------------------------------
 * threshold_halt as a loop condition is a hard decision (continue while > 0)
 * and passes no gradient: a compile that only tests it never asks for one.
 * Read as a value, max(x) - threshold differentiates as max does: the
 * gradient goes to the maxima, shared evenly between ties. */
static ebb_status threshold_halt_bwd(const ebb_op_grad_call *c, ebb_tensor **gin,
                                     ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_max_all_backward(&gin[0], c->grad_out, c->in[0]);
}
/* ebb_tensor_max_all_backward on the CPU: the mask x == max(x) (one bool per
 * element) stays to the end; counting its hits sums the bools as int64
 * through an int64 copy of the mask; then the share and a zero (one
 * element each) sit beside the gradient. */
static int64_t threshold_halt_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in,
                                            int n_in, ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]), e = (int64_t)ebb_dtype_size(dt);
    if (n <= 0)
        return 0;
    int64_t count = n + 8 * n + 8 + ebb_ops_reduce_scratch(n, 1, EBB_INT64);
    int64_t spread = n + 2 * e + n * e;
    return (count > spread ? count : spread) - n * e;
}
/* The same on CUDA, each tensor a block of its own. The peak is one of
 * three moments: max(x) (one element) beside the mask as the mask is made;
 * the mask, the int64 copy of it that the count sums, the count (one
 * element) and the sum's staging; or the mask, the share and the zero (one
 * element each) beside the gradient that where() makes. The maximum's own
 * staging, before the mask exists, is never the peak. */
static int64_t threshold_halt_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in,
                                                 int n_in, ebb_dtype dt) {
    (void)a;
    (void)n_in;
    int64_t n = ebb_shape_numel(&in[0]), e = (int64_t)ebb_dtype_size(dt);
    if (n <= 0)
        return 0; /* the gradient is zeros_like(x), nothing beside it */
    int64_t mask = ebb_cuda_block(n), grad = ebb_cuda_block(n * e), one = ebb_cuda_block(e);
    int64_t top = one + mask;
    int64_t count = mask + ebb_cuda_block(8 * n) + ebb_cuda_block(8) + ebb_ops_cuda_sum_staging(n, 1, 8);
    int64_t spread = mask + 2 * one + grad;
    int64_t peak = top > count ? top : count;
    peak = spread > peak ? spread : peak;
    return peak - grad;
}
static const ebb_op_grad threshold_halt_grad = {
    .backward = threshold_halt_bwd, .saves_inputs = 1u, .differentiable = 1u,
    .workspace = threshold_halt_bwd_workspace,
    .workspace_cuda = threshold_halt_bwd_workspace_cuda};

/* _gate_mix: [acc +] w[:, i] * y. The router weights w get the gradient of
 * their column i (the sum of grad * y over y's feature dims); y gets grad
 * scaled by the column; acc gets grad itself. */
static ebb_status gate_mix_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    int wi = c->n_in - 2, yi = c->n_in - 1;
    const ebb_tensor *w = c->in[wi], *y = c->in[yi];
    int64_t i = c->attrs[0].i;
    ebb_shape ws = ebb_tensor_shape(w), ys = ebb_tensor_shape(y), cs = ys;
    if (ws.ndim != 2 || ys.ndim < 1 || i < 0 || i >= ws.dim[1])
        return ebb_error_set(EBB_ERR_SHAPE, "_gate_mix backward: router output and expert output "
                             "do not fit (index %lld)", (long long)i);
    for (int d = 1; d < cs.ndim; d++)
        cs.dim[d] = 1;
    ebb_tensor *col = NULL, *wcol = NULL, *gy_w = NULL, *gcol = NULL, *gcol2 = NULL;
    ebb_tensor *onehot = NULL, *zeros = NULL;
    ebb_status st = ebb_tensor_narrow(&col, w, 1, i, 1);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&wcol, col, &cs);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&gin[yi], EBB_MUL, c->grad_out, wcol);
    if (st == EBB_OK)
        st = ebb_tensor_binary(&gy_w, EBB_MUL, c->grad_out, y);
    if (st == EBB_OK)
        st = ebb_tensor_sum_to(&gcol, gy_w, &cs);
    ebb_shape col_shape = EBB_SHAPE(ws.dim[0], 1);
    if (st == EBB_OK)
        st = ebb_tensor_reshape(&gcol2, gcol, &col_shape);
    /* the column's gradient placed at column i of zeros: [B, 1] * one-hot [E] */
    ebb_shape e = EBB_SHAPE(ws.dim[1]);
    if (st == EBB_OK)
        st = ebb_tensor_zeros(&zeros, &e, ebb_tensor_dtype(w), ebb_tensor_device(w));
    if (st == EBB_OK) {
        ebb_tensor *one = NULL;
        st = ebb_tensor_narrow(&one, zeros, 0, i, 1);
        if (st == EBB_OK)
            st = ebb_tensor_affine_(one, 1.0, 1.0);
        ebb_tensor_free(one);
        onehot = zeros;
        zeros = NULL;
    }
    if (st == EBB_OK)
        st = ebb_tensor_binary(&gin[wi], EBB_MUL, gcol2, onehot);
    if (st == EBB_OK && c->n_in == 3)
        st = ebb_tensor_ref(&gin[0], c->grad_out);
    ebb_tensor *tmp[] = {col, wcol, gy_w, gcol, gcol2, onehot, zeros};
    for (int k = 0; k < EBB_COUNT(tmp); k++)
        ebb_tensor_free(tmp[k]);
    if (st != EBB_OK)
        for (int k = 0; k < c->n_in; k++) {
            ebb_tensor_free(gin[k]);
            gin[k] = NULL;
        }
    return st;
}
/* The sizes gate_mix_bwd works with: the batch B and experts E of w, y's
 * elements, and whether y's per-row sum is a new tensor (unless y is
 * [B, 1, ...]); 0 for shapes it refuses. */
static int gate_mix_sizes(const ebb_shape *in, int n_in, int64_t *b, int64_t *experts,
                          int64_t *ny, int *summed) {
    if (n_in < 2)
        return 0;
    const ebb_shape *w = &in[n_in - 2], *y = &in[n_in - 1];
    if (w->ndim != 2 || y->ndim < 1)
        return 0;
    *b = w->dim[0];
    *experts = w->dim[1];
    *ny = ebb_shape_numel(y);
    *summed = 0;
    for (int d = 1; d < y->ndim; d++)
        *summed |= y->dim[d] != 1;
    return 1;
}

/* In gate_mix_bwd's order: y's gradient (kept), grad * y (Y elements), its
 * sum per row (B, none when y is [B]), the one-hot [E] (made by adding a
 * Scalar to a zero, see ebb_ops_scalar_bytes) and w's gradient [B, E]
 * (kept); acc's gradient is grad_out itself. */
static int64_t gate_mix_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                      ebb_dtype dt) {
    (void)a;
    int64_t b, experts, ny, e = (int64_t)ebb_dtype_size(dt);
    int summed;
    if (!gate_mix_sizes(in, n_in, &b, &experts, &ny, &summed))
        return 0;
    int64_t bw = b * experts * e, sums = summed ? b * e : 0;
    int64_t sum_peak = 2 * ny * e + sums + (sums ? ebb_ops_reduce_scratch(ny, b, dt) : 0);
    int64_t onehot = 2 * ny * e + sums + experts * e + ebb_ops_scalar_bytes(dt);
    int64_t last = 2 * ny * e + sums + experts * e + bw;
    int64_t peak = sum_peak > onehot ? sum_peak : onehot;
    peak = last > peak ? last : peak;
    return peak - ny * e - bw;
}
/* The same on CUDA, where the one-hot's Scalar stays on the CPU: all of
 * grad * y, the per-row sum (where y is not [B, 1, ...]) and the one-hot
 * are still alive when w's gradient is made, each a block of its own. A
 * per-row sum large enough for a grid-wide pass would also stage partial
 * sums (see ebb_ops_no_cuda_scratch); that is not counted. */
static int64_t gate_mix_bwd_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                           ebb_dtype dt) {
    (void)a;
    int64_t b, experts, ny, e = (int64_t)ebb_dtype_size(dt);
    int summed;
    if (!gate_mix_sizes(in, n_in, &b, &experts, &ny, &summed))
        return 0;
    return ebb_cuda_block(ny * e) + (summed ? ebb_cuda_block(b * e) : 0) +
           ebb_cuda_block(experts * e);
}
/* bits for (w, y) and for (acc, w, y): w and y are the last two inputs */
static const ebb_op_grad gate_mix_grad = {.backward = gate_mix_bwd, .saves_inputs = 0x7u,
                                          .differentiable = 0x7u,
                                          .workspace = gate_mix_bwd_workspace,
                                          .workspace_cuda = gate_mix_bwd_workspace_cuda};

const ebb_op ebb_ops_routing[] = {
    {.name = "threshold_halt", .min_inputs = 1, .max_inputs = 1, .attrs = threshold_attrs,
     .n_attrs = 1, .forward = threshold_halt_fwd, .doc = "max(x) - threshold, a loop condition",
     .workspace = threshold_halt_workspace, .grad = &threshold_halt_grad,
     .workspace_cuda = ebb_ops_no_cuda_scratch, .autocast = EBB_AUTOCAST_FULL},
    {.name = "_gate_mix", .min_inputs = 2, .max_inputs = 3, .attrs = gate_mix_attrs, .n_attrs = 1,
     .forward = gate_mix_fwd, .doc = "internal: one expert's weighted term of a dense gate",
     .grad = &gate_mix_grad},
};
const int ebb_ops_routing_count = EBB_COUNT(ebb_ops_routing);
