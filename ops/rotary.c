/* The parts LLaMA's attention adds to GPT's: rotary position embeddings on
 * the queries and keys, and grouped-query attention's repeated key and value
 * heads. */
#include "ops_internal.h"

enum { A_THETA = 0, A_INTERLEAVED = 1, A_SEQ_DIM = 2 };
enum { A_REPEATS = 0, A_DIM = 1 };

static ebb_status rotary_fwd(const ebb_op_call *c, ebb_tensor **out) {
    const ebb_attr_value *a = c->attrs;
    return ebb_tensor_rotary(out, c->in[0], a[A_SEQ_DIM].i, c->position, a[A_THETA].f,
                             a[A_INTERLEAVED].i != 0, false);
}

/* The rotation is linear and orthogonal: its gradient is the gradient
 * turned back by the same angles. Nothing of the forward is kept. */
static ebb_status rotary_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    const ebb_attr_value *a = c->attrs;
    return ebb_tensor_rotary(&gin[0], c->grad_out, a[A_SEQ_DIM].i, 0, a[A_THETA].f,
                             a[A_INTERLEAVED].i != 0, true);
}

/* The cos and sin tables, [T, D/2] each, made in float32 one after the
 * other and, for another dtype, converted before the next is made: the
 * largest moment is the first table converted, the second in float32 and
 * converted. Both are alive beside the output. (Both directions.) */
static int64_t rotary_tables(const ebb_shape *x, int64_t seq_dim, int64_t *pairs) {
    int nd = x->ndim;
    int64_t seq = seq_dim < 0 ? seq_dim + nd : seq_dim;
    if (nd < 2 || seq < 0 || seq >= nd - 1)
        return 0; /* refused by the forward */
    *pairs = x->dim[nd - 1] / 2;
    return x->dim[seq];
}

static int64_t rotary_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_dtype dt) {
    (void)n_in;
    int64_t h = 0, T = rotary_tables(&in[0], a[A_SEQ_DIM].i, &h);
    int64_t e = (int64_t)ebb_dtype_size(dt), tables = 2 * T * h * e;
    if (dt == EBB_FLOAT32)
        return tables;
    int64_t made = T * h * (2 * e + 4) - ebb_shape_numel(&in[0]) * e;
    return made > tables ? made : tables;
}

/* CUDA: the float32 tables are made on the host and copied to the device,
 * a block each. */
static int64_t rotary_workspace_cuda(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                     ebb_dtype dt) {
    (void)n_in;
    int64_t h = 0, T = rotary_tables(&in[0], a[A_SEQ_DIM].i, &h);
    return 2 * ebb_cuda_block(T * h * (int64_t)ebb_dtype_size(dt));
}

static ebb_status repeat_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_repeat_interleave(out, c->in[0], c->attrs[A_DIM].i,
                                        c->attrs[A_REPEATS].i);
}

static ebb_status repeat_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_repeat_interleave_backward(&gin[0], c->grad_out, c->attrs[A_DIM].i,
                                                 c->attrs[A_REPEATS].i);
}

static const ebb_op_grad rotary_grad = {.backward = rotary_bwd, .differentiable = 1u,
                                        .workspace = rotary_workspace,
                                        .workspace_cuda = rotary_workspace_cuda};
static const ebb_op_grad repeat_grad = {.backward = repeat_bwd, .differentiable = 1u};

static const ebb_attr_spec rotary_attrs[] = {
    {.name = "theta", .type = EBB_ATTR_FLOAT, .default_number = 10000.0,
     .doc = "the base of the angles' wavelengths (rope_theta)"},
    {.name = "interleaved", .type = EBB_ATTR_BOOL, .default_number = 0,
     .doc = "pairs (2j, 2j+1), Meta's layout; else (j, j+D/2), Hugging Face's"},
    {.name = "seq_dim", .type = EBB_ATTR_INT, .default_number = -2,
     .doc = "the positions' dim: -2 for [B, H, T, D], 1 for [B, T, H, D]"},
};
static const ebb_attr_spec repeat_attrs[] = {
    {.name = "repeats", .type = EBB_ATTR_INT, .required = 1,
     .doc = "how many query heads share each key/value head (n_heads / n_kv_heads)"},
    {.name = "dim", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "the heads' dim ([B, H, T, D]: 1)"},
};

const ebb_op ebb_ops_rotary[] = {
    {.name = "rotary_embedding", .min_inputs = 1, .max_inputs = 1, .attrs = rotary_attrs,
     .n_attrs = EBB_COUNT(rotary_attrs), .forward = rotary_fwd,
     .doc = "rotary position embeddings (RoPE) of queries or keys", .grad = &rotary_grad,
     .workspace = rotary_workspace, .workspace_cuda = rotary_workspace_cuda},
    {.name = "repeat_kv", .min_inputs = 1, .max_inputs = 1, .attrs = repeat_attrs,
     .n_attrs = EBB_COUNT(repeat_attrs), .forward = repeat_fwd,
     .doc = "each key/value head repeated for its group of query heads", .grad = &repeat_grad},
};
const int ebb_ops_rotary_count = EBB_COUNT(ebb_ops_rotary);
