/* embedding: a lookup table, PyTorch's layout weight [num, dim]. The input
 * holds int64 (or int32) indices of any shape; the output adds a last dim.
 * positions: the indices 0..T-1 a position embedding looks up. */
#include "ops_internal.h"

enum { A_NUM, A_DIM, A_STD };

static const ebb_attr_spec embedding_attrs[] = {
    {.name = "num", .type = EBB_ATTR_INT, .required = 1,
     .doc = "number of embeddings (nn.Embedding's num_embeddings)"},
    {.name = "dim", .type = EBB_ATTR_INT, .required = 1,
     .doc = "size of each embedding (nn.Embedding's embedding_dim)"},
    {.name = "init_std", .type = EBB_ATTR_FLOAT, .default_number = 1.0,
     .doc = "the weight's initial N(0, init_std^2) (GPT-2 and nanoGPT use 0.02)"},
};

static ebb_status embedding_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_param_spec *p, int *n) {
    (void)n_in;
    *n = 0;
    if (a[A_NUM].i < 1 || a[A_DIM].i < 1)
        return ebb_error_set(EBB_ERR_ARG, "embedding: num=%lld and dim=%lld must be >= 1",
                             (long long)a[A_NUM].i, (long long)a[A_DIM].i);
    if (!(a[A_STD].f > 0))
        return ebb_error_set(EBB_ERR_ARG, "embedding: init_std=%g must be above 0", a[A_STD].f);
    if (in[0].ndim >= EBB_MAX_DIMS) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "embedding: indices %s leave no room for the embedding dim",
                             ebb_shape_str(&in[0], buf, sizeof buf));
    }
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(a[A_NUM].i, a[A_DIM].i), EBB_INIT_NORMAL,
                            a[A_DIM].i, 0, 0, a[A_STD].f};
    *n = 1;
    return EBB_OK;
}

static ebb_status embedding_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_dtype dt = ebb_tensor_dtype(c->in[0]);
    if (dt != EBB_INT64 && dt != EBB_INT32) {
        ebb_shape x = ebb_tensor_shape(c->in[0]);
        char buf[128];
        return ebb_error_set(EBB_ERR_ARG, "embedding: input %s is %s; expected int64 indices",
                             ebb_shape_str(&x, buf, sizeof buf), ebb_dtype_name(dt));
    }
    if (c->n_params < 1)
        return ebb_error_set(EBB_ERR_ARG, "embedding: no weight given");
    ebb_status st = ebb_tensor_embedding(out, c->params[0], c->in[0]);
    if (st != EBB_OK)
        ebb_error_prefix("embedding");
    return st;
}

/* Before the lookup, the index range check makes two int64 scalars (the
 * smallest and largest index), freed before the output is made; they set
 * the peak only for an output under 16 bytes. `dt` is the indices' dtype, not
 * the output's, so this assumes the narrowest float (2 bytes): exact from 8
 * output elements up, an upper bound below. */
/* What the two scalars (`scalars` bytes as the device holds them) add above
 * an output of at least out_min bytes, rounded by `round` (NULL: none). */
static int64_t index_check_scratch(const ebb_attr_value *a, const ebb_shape *in, int64_t scalars,
                                   int64_t (*round)(int64_t)) {
    int64_t numel = ebb_shape_numel(&in[0]);
    if (numel <= 0)
        return 0;
    int64_t out_min = numel * a[A_DIM].i * 2;
    if (round)
        out_min = round(out_min);
    return out_min < scalars ? scalars - out_min : 0;
}

static int64_t embedding_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                   ebb_dtype dt) {
    (void)n_in;
    (void)dt;
    return index_check_scratch(a, in, 16, NULL);
}

/* CUDA: the check's smallest and largest index are a block each, freed
 * before the output is made, so they set the peak while the output takes
 * under two blocks (assuming the narrowest float, as above: a bound where
 * the output's real dtype is wider, as for float64 [4, 5] x 6 on an H200). */
static int64_t embedding_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                        ebb_dtype dt) {
    (void)n_in;
    (void)dt;
    return index_check_scratch(a, in, 2 * 512, ebb_cuda_block);
}

/* The indices are integers: no gradient. The table's gradient scatters
 * grad_out's rows back to the rows the indices picked. */
static ebb_status embedding_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gin;
    if (c->n_params < 1)
        return ebb_error_set(EBB_ERR_ARG, "embedding backward: no weight given");
    return ebb_tensor_embedding_backward(&gp[0], c->grad_out, c->in[0],
                                         ebb_tensor_shape(c->params[0]).dim[0]);
}
static const ebb_op_grad embedding_grad = {.backward = embedding_bwd, .saves_inputs = 1u,
                                           .differentiable = 0u};

/* ---- positions ------------------------------------------------------------------
 * 0, 1, ..., n-1 as int64, n the input's size along `dim`: torch.arange(T)
 * for a position embedding, from the stream whose length it numbers. Only
 * the input's shape is read, so the input need not stay alive for it. With
 * a key/value cache the run's tokens follow those the cache holds, and
 * count from there (ebb_op_call.position). */

static const ebb_attr_spec positions_attrs[] = {
    {.name = "dim", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "the dim whose length is counted (1: the T of [B, T, ...])"},
};

static ebb_status positions_fwd(const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t d = 0;
    ebb_status st = ebb_ops_check_dim("positions", c->attrs[0].i, &x, &d);
    if (st == EBB_OK)
        st = ebb_tensor_arange(out, c->position, c->position + x.dim[d], EBB_INT64,
                               ebb_tensor_device(c->in[0]));
    return st;
}

/* Integer positions carry no gradient back to the tensor they were counted from. */
static ebb_status positions_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)c;
    (void)gin;
    (void)gp;
    return EBB_OK;
}
static const ebb_op_grad positions_grad = {.backward = positions_bwd, .differentiable = 0u};

const ebb_op ebb_ops_embedding[] = {
    {.name = "embedding", .min_inputs = 1, .max_inputs = 1, .attrs = embedding_attrs,
     .n_attrs = EBB_COUNT(embedding_attrs), .params = embedding_params, .forward = embedding_fwd,
     .doc = "rows of weight picked by int64 indices: [*] -> [*, dim]",
     .workspace = embedding_workspace, .workspace_is_bound = 1, .grad = &embedding_grad,
     .workspace_cuda = embedding_workspace_cuda, .workspace_cuda_is_bound = 1,
     .indices = EBB_INDICES_ROWS},
    {.name = "positions", .min_inputs = 1, .max_inputs = 1, .attrs = positions_attrs,
     .n_attrs = EBB_COUNT(positions_attrs), .forward = positions_fwd,
     .doc = "int64 0..n-1 for the input's length n along dim (feeds a position embedding)",
     .grad = &positions_grad},
};
const int ebb_ops_embedding_count = EBB_COUNT(ebb_ops_embedding);
