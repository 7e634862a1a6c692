/* Shape ops: flatten, reshape, permute, transpose, narrow, unsqueeze, squeeze. All
 * are views: the output looks at the input's storage. flatten and reshape
 * copy only when the input's strides make a view impossible (an input made
 * non-contiguous by permute or transpose), exactly as libtorch's reshape. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "ops_internal.h"

ebb_status ebb_ops_parse_ints(const char *op, const char *attr, const char *text, int64_t *out,
                              int max, int *n) {
    *n = 0;
    if (!text)
        return ebb_error_set(EBB_ERR_ARG, "%s: attribute %s is not set", op, attr);
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    char close = 0;
    if (*p == '[' || *p == '(') {
        close = *p == '[' ? ']' : ')';
        p++;
    }
    for (;;) {
        while (isspace((unsigned char)*p) || *p == ',')
            p++;
        if (!*p || *p == close)
            break;
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno ||
            (*end && *end != ',' && *end != close && !isspace((unsigned char)*end)))
            return ebb_error_set(
                EBB_ERR_ARG, "%s: attribute %s=\"%s\" is not a list of integers (like \"-1,64\")",
                op, attr, text);
        if (*n == max)
            return ebb_error_set(EBB_ERR_ARG, "%s: attribute %s=\"%s\" has more than %d entries",
                                 op, attr, text, max);
        out[(*n)++] = v;
        p = end;
    }
    if (close && *p != close)
        return ebb_error_set(EBB_ERR_ARG, "%s: attribute %s=\"%s\" lacks its closing '%c'", op,
                             attr, text, close);
    if (close)
        p++;
    while (isspace((unsigned char)*p))
        p++;
    if (*p)
        return ebb_error_set(EBB_ERR_ARG, "%s: attribute %s=\"%s\" has text after the list", op,
                             attr, text);
    return EBB_OK;
}

ebb_status ebb_ops_check_dim(const char *op, int64_t dim, const ebb_shape *x, int64_t *out) {
    if (dim < -x->ndim || dim >= x->ndim) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE, "%s: dim %lld is out of range for the %d-D input %s",
                             op, (long long)dim, x->ndim, ebb_shape_str(x, buf, sizeof buf));
    }
    *out = dim < 0 ? dim + x->ndim : dim;
    return EBB_OK;
}

/* ---- flatten ---------------------------------------------------------------- */

static const ebb_attr_spec flatten_attrs[] = {
    {.name = "start_dim", .type = EBB_ATTR_INT, .default_number = 1, .doc = "first dim to merge"},
    {.name = "end_dim", .type = EBB_ATTR_INT, .default_number = -1, .doc = "last dim to merge"},
};

static ebb_status flatten_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t s = 0, e = 0;
    if (x.ndim == 0) /* libtorch flattens a scalar to [1] */
        return ebb_tensor_flatten(out, c->in[0], 0, -1);
    ebb_status st = ebb_ops_check_dim("flatten", c->attrs[0].i, &x, &s);
    if (st == EBB_OK)
        st = ebb_ops_check_dim("flatten", c->attrs[1].i, &x, &e);
    if (st != EBB_OK)
        return st;
    if (s > e) {
        char buf[128];
        return ebb_error_set(
            EBB_ERR_ARG, "flatten: start_dim %lld comes after end_dim %lld for input %s",
            (long long)c->attrs[0].i, (long long)c->attrs[1].i, ebb_shape_str(&x, buf, sizeof buf));
    }
    return ebb_tensor_flatten(out, c->in[0], s, e);
}

/* ---- reshape ---------------------------------------------------------------- */

static const ebb_attr_spec reshape_attrs[] = {
    {.name = "shape", .type = EBB_ATTR_STRING, .required = 1,
     .doc = "target shape, comma-separated; one entry may be -1 (inferred), and 0 keeps the "
            "input's size at that position, e.g. \"0,0,4,-1\""},
};

static ebb_status reshape_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape want = {0};
    ebb_status st = ebb_ops_parse_ints("reshape", "shape", c->attrs[0].s, want.dim, EBB_MAX_DIMS,
                                       &want.ndim);
    if (st != EBB_OK)
        return st;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t numel = ebb_shape_numel(&x), known = 1, rest = 1, given = 1;
    int infer = 0, bad = 0;
    for (int i = 0; i < x.ndim; i++)
        if (!(i < want.ndim && want.dim[i] == 0))
            rest *= x.dim[i];
    for (int i = 0; i < want.ndim; i++) {
        int keep = want.dim[i] == 0 && i < x.ndim;
        if (keep) /* the input's size here, as ONNX's Reshape */
            want.dim[i] = x.dim[i];
        if (want.dim[i] == -1)
            infer++;
        else if (want.dim[i] < 0)
            bad = 1;
        else
            known *= want.dim[i];
        if (!keep && want.dim[i] >= 0)
            given *= want.dim[i];
    }
    /* an empty input: -1 is what the dims not kept leave ([0, 8, 128] to
     * "0,0,4,-1" is [0, 8, 4, 32]), as it would be with a batch of one */
    if (numel == 0 && infer == 1 && !bad && given > 0 && rest % given == 0)
        for (int i = 0; i < want.ndim; i++)
            if (want.dim[i] == -1) {
                want.dim[i] = rest / given;
                infer = 0;
            }
    if (bad || infer > 1 || (infer ? known == 0 || numel % known != 0 : known != numel)) {
        char a[128], b[128];
        return ebb_error_set(EBB_ERR_SHAPE, "reshape: cannot reshape %s (%lld elements) to %s",
                             ebb_shape_str(&x, a, sizeof a), (long long)numel,
                             ebb_shape_str(&want, b, sizeof b));
    }
    return ebb_tensor_reshape(out, c->in[0], &want);
}

/* ---- permute, transpose ------------------------------------------------------- */

static const ebb_attr_spec permute_attrs[] = {
    {.name = "dims", .type = EBB_ATTR_STRING, .required = 1,
     .doc = "the new order of the dims, comma-separated, e.g. \"0,2,1\""},
};

static ebb_status permute_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    int64_t dims[EBB_MAX_DIMS];
    int n = 0;
    ebb_status st = ebb_ops_parse_ints("permute", "dims", c->attrs[0].s, dims, EBB_MAX_DIMS, &n);
    if (st != EBB_OK)
        return st;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    if (n != x.ndim) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "permute: dims=\"%s\" lists %d dims but the input %s has %d",
                             c->attrs[0].s, n, ebb_shape_str(&x, buf, sizeof buf), x.ndim);
    }
    int seen[EBB_MAX_DIMS] = {0};
    for (int i = 0; i < n; i++) {
        if ((st = ebb_ops_check_dim("permute", dims[i], &x, &dims[i])) != EBB_OK)
            return st;
        if (seen[dims[i]]++)
            return ebb_error_set(EBB_ERR_ARG, "permute: dims=\"%s\" repeats dim %lld",
                                 c->attrs[0].s, (long long)dims[i]);
    }
    return ebb_tensor_permute(out, c->in[0], dims, n);
}

static const ebb_attr_spec transpose_attrs[] = {
    {.name = "dim0", .type = EBB_ATTR_INT, .required = 1, .doc = "first dim to swap"},
    {.name = "dim1", .type = EBB_ATTR_INT, .required = 1, .doc = "second dim to swap"},
};

static ebb_status transpose_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t d0 = 0, d1 = 0;
    ebb_status st = ebb_ops_check_dim("transpose", c->attrs[0].i, &x, &d0);
    if (st == EBB_OK)
        st = ebb_ops_check_dim("transpose", c->attrs[1].i, &x, &d1);
    return st == EBB_OK ? ebb_tensor_transpose(out, c->in[0], d0, d1) : st;
}

/* ---- narrow -------------------------------------------------------------------- */

static const ebb_attr_spec narrow_attrs[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .required = 1, .doc = "the dim to take a slice of"},
    {.name = "start", .type = EBB_ATTR_INT, .required = 1,
     .doc = "first index (negative: from the end)"},
    {.name = "length", .type = EBB_ATTR_INT, .required = 1, .doc = "how many indices"},
};

/* dim, start and length checked against x, as torch.narrow does */
static ebb_status narrow_range(const ebb_attr_value *a, const ebb_shape *x, int64_t *dim,
                               int64_t *start) {
    ebb_status st = ebb_ops_check_dim("narrow", a[0].i, x, dim);
    if (st != EBB_OK)
        return st;
    int64_t size = x->dim[*dim], s = a[1].i < 0 ? a[1].i + size : a[1].i, len = a[2].i;
    if (s < 0 || s > size || len < 0 || len > size - s) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "narrow: start=%lld, length=%lld do not fit dim %lld of size %lld in "
                             "the input %s",
                             (long long)a[1].i, (long long)len, (long long)*dim, (long long)size,
                             ebb_shape_str(x, buf, sizeof buf));
    }
    *start = s;
    return EBB_OK;
}

static ebb_status narrow_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t dim = 0, start = 0;
    ebb_status st = narrow_range(c->attrs, &x, &dim, &start);
    return st == EBB_OK ? ebb_tensor_narrow(out, c->in[0], dim, start, c->attrs[2].i) : st;
}

/* ---- unsqueeze, squeeze -------------------------------------------------------- */

static const ebb_attr_spec unsqueeze_attrs[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .required = 1,
     .doc = "where the new size-1 dim goes, in [-ndim-1, ndim]"},
};

static ebb_status unsqueeze_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t d = c->attrs[0].i;
    if (x.ndim == EBB_MAX_DIMS || d < -x.ndim - 1 || d > x.ndim) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "unsqueeze: cannot insert dim %lld into the %d-D input %s",
                             (long long)d, x.ndim, ebb_shape_str(&x, buf, sizeof buf));
    }
    return ebb_tensor_unsqueeze(out, c->in[0], d);
}

static const ebb_attr_spec squeeze_attrs[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "the dim to drop if it has size 1; unset: every size-1 dim"},
};

static ebb_status squeeze_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    if (c->attrs[0].set) {
        int64_t d = 0;
        ebb_status st = ebb_ops_check_dim("squeeze", c->attrs[0].i, &x, &d);
        return st == EBB_OK ? ebb_tensor_squeeze(out, c->in[0], d) : st;
    }
    /* Dropping size-1 dims never needs a copy, so reshape returns a view. */
    ebb_shape s = {0};
    for (int i = 0; i < x.ndim; i++)
        if (x.dim[i] != 1)
            s.dim[s.ndim++] = x.dim[i];
    return ebb_tensor_reshape(out, c->in[0], &s);
}

/* ---- backward rules ----------------------------------------------------------
 * A view's gradient is grad_out seen in the input's shape. flatten, reshape
 * and squeeze read the input for that shape; the others invert themselves
 * from their attributes alone. */

static ebb_status as_input_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_reshape(&gin[0], c->grad_out, &c->in_shapes[0]);
}

static ebb_status permute_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    int64_t dims[EBB_MAX_DIMS], inverse[EBB_MAX_DIMS];
    int n = 0;
    ebb_shape g = ebb_tensor_shape(c->grad_out);
    ebb_status st = ebb_ops_parse_ints("permute", "dims", c->attrs[0].s, dims, EBB_MAX_DIMS, &n);
    if (st == EBB_OK && n != g.ndim)
        st = ebb_error_set(EBB_ERR_SHAPE, "permute backward: dims=\"%s\" for a %d-D gradient",
                           c->attrs[0].s, g.ndim);
    for (int i = 0; st == EBB_OK && i < n; i++)
        if ((st = ebb_ops_check_dim("permute", dims[i], &g, &dims[i])) == EBB_OK)
            inverse[dims[i]] = i;
    return st == EBB_OK ? ebb_tensor_permute(&gin[0], c->grad_out, inverse, n) : st;
}

static ebb_status transpose_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_shape g = ebb_tensor_shape(c->grad_out);
    int64_t d0 = 0, d1 = 0;
    ebb_status st = ebb_ops_check_dim("transpose", c->attrs[0].i, &g, &d0);
    if (st == EBB_OK)
        st = ebb_ops_check_dim("transpose", c->attrs[1].i, &g, &d1);
    return st == EBB_OK ? ebb_tensor_transpose(&gin[0], c->grad_out, d0, d1) : st;
}

/* the inserted dim, counted in the output (grad_out) */
static ebb_status unsqueeze_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_shape g = ebb_tensor_shape(c->grad_out);
    int64_t d = 0;
    ebb_status st = ebb_ops_check_dim("unsqueeze", c->attrs[0].i, &g, &d);
    if (st == EBB_OK && g.dim[d] != 1)
        st = ebb_error_set(EBB_ERR_SHAPE, "unsqueeze backward: gradient dim %lld has size %lld, "
                           "not 1", (long long)d, (long long)g.dim[d]);
    return st == EBB_OK ? ebb_tensor_squeeze(&gin[0], c->grad_out, d) : st;
}

/* The slice's gradient placed in zeros of the input's shape (slice_backward):
 * the zeros are the gradient it returns, so no scratch. */
static ebb_status narrow_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    int64_t dim = 0, start = 0;
    ebb_status st = narrow_range(c->attrs, &c->in_shapes[0], &dim, &start);
    ebb_tensor *g = NULL, *part = NULL;
    if (st == EBB_OK)
        st = ebb_tensor_zeros(&g, &c->in_shapes[0], ebb_tensor_dtype(c->grad_out),
                              ebb_tensor_device(c->grad_out));
    if (st == EBB_OK)
        st = ebb_tensor_narrow(&part, g, dim, start, c->attrs[2].i);
    if (st == EBB_OK)
        st = ebb_tensor_copy_(part, c->grad_out);
    ebb_tensor_free(part);
    if (st != EBB_OK) {
        ebb_tensor_free(g);
        return st;
    }
    gin[0] = g;
    return EBB_OK;
}

/* reshape, flatten, squeeze: the input's shape is all the backward needs */
static const ebb_op_grad as_input_grad = {.backward = as_input_bwd, .differentiable = 1u};
static const ebb_op_grad permute_grad = {.backward = permute_bwd, .differentiable = 1u};
static const ebb_op_grad transpose_grad = {.backward = transpose_bwd, .differentiable = 1u};
static const ebb_op_grad unsqueeze_grad = {.backward = unsqueeze_bwd, .differentiable = 1u};
static const ebb_op_grad narrow_grad = {.backward = narrow_bwd, .differentiable = 1u};

#define VIEW_OP(n, a, f, d, g)                                                                     \
    {.name = n, .min_inputs = 1, .max_inputs = 1, .attrs = a, .n_attrs = EBB_COUNT(a),            \
     .is_view = 1, .forward = f, .doc = d, .grad = &g}

const ebb_op ebb_ops_shape[] = {
    VIEW_OP("flatten", flatten_attrs, flatten_fwd, "merge dims start_dim..end_dim into one",
            as_input_grad),
    VIEW_OP("reshape", reshape_attrs, reshape_fwd, "the same elements in a new shape", as_input_grad),
    VIEW_OP("permute", permute_attrs, permute_fwd, "reorder the dims", permute_grad),
    VIEW_OP("transpose", transpose_attrs, transpose_fwd, "swap two dims", transpose_grad),
    VIEW_OP("narrow", narrow_attrs, narrow_fwd, "the indices start..start+length-1 of one dim",
            narrow_grad),
    VIEW_OP("unsqueeze", unsqueeze_attrs, unsqueeze_fwd, "insert a size-1 dim", unsqueeze_grad),
    VIEW_OP("squeeze", squeeze_attrs, squeeze_fwd, "drop a size-1 dim (or all of them)",
            as_input_grad),
};
const int ebb_ops_shape_count = EBB_COUNT(ebb_ops_shape);
