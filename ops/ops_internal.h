/* Shared by the op files: the table each family exports to builtin.c. */
#ifndef EBB_OPS_INTERNAL_H
#define EBB_OPS_INTERNAL_H

#include "ebb/op.h"

/* Registers the built-in operators (builtin.c; ebb_init, init.c, calls it). */
ebb_status ebb_ops_register_builtin(void);

extern const ebb_op ebb_ops_activation[];
extern const int ebb_ops_activation_count;
extern const ebb_op ebb_ops_pointwise[];
extern const int ebb_ops_pointwise_count;
extern const ebb_op ebb_ops_linear[];
extern const int ebb_ops_linear_count;
extern const ebb_op ebb_ops_norm[];
extern const int ebb_ops_norm_count;
extern const ebb_op ebb_ops_combine[];
extern const int ebb_ops_combine_count;
extern const ebb_op ebb_ops_routing[];
extern const int ebb_ops_routing_count;

extern const ebb_op ebb_ops_conv[];
extern const int ebb_ops_conv_count;
extern const ebb_op ebb_ops_pool[];
extern const int ebb_ops_pool_count;
extern const ebb_op ebb_ops_embedding[];
extern const int ebb_ops_embedding_count;
extern const ebb_op ebb_ops_attention[];
extern const int ebb_ops_attention_count;
extern const ebb_op ebb_ops_rotary[];
extern const int ebb_ops_rotary_count;
extern const ebb_op ebb_ops_recurrent[];
extern const int ebb_ops_recurrent_count;
extern const ebb_op ebb_ops_shape[];
extern const int ebb_ops_shape_count;
extern const ebb_op ebb_ops_math[];
extern const int ebb_ops_math_count;
extern const ebb_op ebb_ops_loss[];
extern const int ebb_ops_loss_count;

/* Parses a STRING attribute holding a list of integers ("-1,64", "0 2 1",
 * "[1, 2]") into out[max]; *n gets the count. Errors name the op and the
 * attribute (ops/shape.c). */
ebb_status ebb_ops_parse_ints(const char *op, const char *attr, const char *text, int64_t *out,
                              int max, int *n);
/* Checks that dim lies in [-ndim, ndim) and returns it made non-negative in
 * *out; the error names the op and the input shape (ops/shape.c). */
ebb_status ebb_ops_check_dim(const char *op, int64_t dim, const ebb_shape *x, int64_t *out);
/* The shape n_in shapes broadcast to, as libtorch broadcasts them (aligned
 * at the last dim; a size other than 1 wins). Shapes that do not broadcast
 * are the forward's to refuse (ops/combine.c). */
ebb_shape ebb_ops_broadcast_shape(const ebb_shape *in, int n_in);

/* An elementwise op's forward `fn` and its in-place forward `fn`_inplace:
 * ebb_tensor_unary() of `kind` (relu, exp, ...). */
#define EBB_OPS_UNARY(fn, kind)                                                                    \
    static ebb_status fn(const ebb_op_call *c, ebb_tensor **out) {                                 \
        return ebb_tensor_unary(out, kind, c->in[0]);                                              \
    }                                                                                              \
    static ebb_status fn##_inplace(const ebb_op_call *c, ebb_tensor *x) {                          \
        (void)c;                                                                                   \
        return ebb_tensor_unary_(x, kind);                                                         \
    }

/* Non-zero for the floating dtypes. */
static inline int ebb_ops_is_floating(ebb_dtype dt) {
    return dt == EBB_FLOAT32 || dt == EBB_FLOAT64 || dt == EBB_FLOAT16 || dt == EBB_BFLOAT16;
}

/* CPU scratch of one Scalar operand (x * 0.5, x.add_(eps)): libtorch wraps
 * the Scalar in an 8-byte tensor of `scalar` dtype (float64 for a floating
 * Scalar, int64 for an integral one) and, when the op computes in another
 * dtype `dt`, a cast copy of it; both live for the length of the call. */
static inline int64_t ebb_ops_wrapped_scalar_bytes(ebb_dtype scalar, ebb_dtype dt) {
    return 8 + (scalar == dt ? 0 : (int64_t)ebb_dtype_size(dt));
}

/* ebb_op.workspace_cuda of an op whose CPU scratch is only Scalar operands
 * (or a reduction's partial results): on CUDA a Scalar stays on the CPU and
 * the reduction goes straight into the output. (A reduction large enough
 * for a grid-wide pass also stages partial sums on the device; no run
 * measured so far needed one.) */
static inline int64_t ebb_ops_no_cuda_scratch(const ebb_attr_value *a, const ebb_shape *in,
                                              int n_in, ebb_dtype dt) {
    (void)a, (void)in, (void)n_in, (void)dt;
    return 0;
}

/* The same for a floating Scalar. */
static inline int64_t ebb_ops_scalar_bytes(ebb_dtype dt) {
    return ebb_ops_wrapped_scalar_bytes(EBB_FLOAT64, dt);
}

/* CPU scratch of a sum-like reduction of in_numel elements to out_numel:
 * with several intra-op threads, libtorch reduces to a single element in
 * two passes through one partial result per thread (at its grain size of
 * 32768 elements and up). */
static inline int64_t ebb_ops_reduce_scratch(int64_t in_numel, int64_t out_numel, ebb_dtype dt) {
    int threads = ebb_tensor_num_threads();
    if (out_numel != 1 || in_numel < 32768 || threads < 2)
        return 0;
    return (int64_t)threads * (int64_t)ebb_dtype_size(dt);
}

static inline int64_t ebb_ops_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The largest power of two at most n (1 for n < 2), as ATen's CUDA launch
 * helpers compute it (last_pow2). */
static inline int64_t ebb_ops_pow2_floor(int64_t n) {
    int64_t p = 1;
    while (p * 2 <= n)
        p *= 2;
    return p;
}

/* What libtorch's CUDA sum of a contiguous [rows, cols] over its rows
 * (cols = 1: of all its elements) allocates beside its result, partial
 * sums of acc bytes staged across thread blocks: 0 while one thread block
 * per output suffices, else the most any device takes (ops/cuda_reduce.c). */
int64_t ebb_ops_cuda_sum_staging(int64_t rows, int64_t cols, int64_t acc);

#define EBB_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
