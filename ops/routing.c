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

const ebb_op ebb_ops_routing[] = {
    {.name = "threshold_halt", .min_inputs = 1, .max_inputs = 1, .attrs = threshold_attrs,
     .n_attrs = 1, .forward = threshold_halt_fwd, .doc = "max(x) - threshold, a loop condition",
     .workspace = threshold_halt_workspace},
    {.name = "_gate_mix", .min_inputs = 2, .max_inputs = 3, .attrs = gate_mix_attrs, .n_attrs = 1,
     .forward = gate_mix_fwd, .doc = "internal: one expert's weighted term of a dense gate"},
};
const int ebb_ops_routing_count = EBB_COUNT(ebb_ops_routing);
