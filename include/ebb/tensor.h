/*
 * ebb/tensor.h - the C tensor layer over libtorch (ATen).
 *
 * An ebb_tensor is an opaque handle that owns one reference to a libtorch
 * tensor. Every function that returns a tensor does so through its first
 * argument, `out`, as a NEW handle that the caller releases with
 * ebb_tensor_free(). Views (reshape, transpose, ...) are new handles too; they
 * keep the storage they look at alive. On failure *out is left NULL, nothing
 * is leaked and ebb_errmsg() says what went wrong, naming both shapes of a
 * mismatch:
 *
 *     ebb_tensor *a = NULL, *b = NULL, *c = NULL;
 *     ebb_shape sa = EBB_SHAPE(2, 3), sb = EBB_SHAPE(4, 5);
 *     ebb_tensor_ones(&a, &sa, EBB_FLOAT32, ebb_device_cpu());
 *     ebb_tensor_ones(&b, &sb, EBB_FLOAT32, ebb_device_cpu());
 *     if (ebb_tensor_matmul(&c, a, b) != EBB_OK)
 *         fprintf(stderr, "%s\n", ebb_errmsg());  // ... (2x3 and 4x5)
 *     ebb_tensor_free(a); ebb_tensor_free(b);
 *
 * Unless a function's comment says otherwise, a NULL `out` or a NULL tensor
 * that is not marked optional is EBB_ERR_ARG; dims may be negative (counted
 * from the end), and a dim out of range fails with libtorch's message.
 *
 * All operations run under libtorch's inference mode: ebb never records
 * autograd history, so nothing keeps a tensor alive behind the caller's back.
 */
#ifndef EBB_TENSOR_H
#define EBB_TENSOR_H

#include <stdbool.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_tensor ebb_tensor;

#define EBB_MAX_DIMS 8

typedef struct ebb_shape {
    int ndim;
    int64_t dim[EBB_MAX_DIMS];
} ebb_shape;

/* A shape literal: EBB_SHAPE(8, 256). In C a compound literal; in C++,
 * which has none, a call of ebb_shape_of() on an initializer list. */
#ifdef __cplusplus
} /* extern "C" */
#include <initializer_list>
static inline ebb_shape ebb_shape_of(std::initializer_list<int64_t> dims) {
    ebb_shape s = {static_cast<int>(dims.size()), {0}};
    int i = 0;
    for (int64_t d : dims)
        if (i < EBB_MAX_DIMS)
            s.dim[i++] = d;
    return s;
}
#define EBB_SHAPE(...) ebb_shape_of({__VA_ARGS__})
extern "C" {
#else
#define EBB_SHAPE(...)                                                                             \
    ((ebb_shape){sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}})
#endif

/* Number of elements of a shape (1 for a scalar); -1 for an invalid shape
 * (ndim outside 0..EBB_MAX_DIMS, a negative dimension, or more elements than
 * int64 holds). */
EBB_API int64_t ebb_shape_numel(const ebb_shape *shape);
/* Non-zero when two shapes are equal. NULL or an invalid ndim: 0. */
EBB_API int ebb_shape_equal(const ebb_shape *a, const ebb_shape *b);
/* Writes "[8, 256]" into buf (always NUL-terminated); returns buf. NULL or
 * invalid shape: "[invalid shape]". */
EBB_API const char *ebb_shape_str(const ebb_shape *shape, char *buf, size_t size);

/* ---- lifetime ---------------------------------------------------------- */

/* Releases the handle's reference (NULL is allowed). Storage is freed when the
 * last handle or view on it goes. */
EBB_API void ebb_tensor_free(ebb_tensor *t);
/* A second handle on the same tensor (same storage, no copy). */
EBB_API ebb_status ebb_tensor_ref(ebb_tensor **out, const ebb_tensor *t);
/* A contiguous deep copy. */
EBB_API ebb_status ebb_tensor_clone(ebb_tensor **out, const ebb_tensor *t);

/* ---- creation ---------------------------------------------------------- */

/* A new tensor of zeros (free with ebb_tensor_free). NULL out: EBB_ERR_ARG;
 * NULL or invalid shape: EBB_ERR_ARG, *out NULL. */
EBB_API ebb_status ebb_tensor_zeros(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                            ebb_device device);
/* [end - start] values start, start + 1, ..., end - 1 (torch.arange); end
 * below start is EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_arange(ebb_tensor **out, int64_t start, int64_t end,
                                     ebb_dtype dtype, ebb_device device);
/* A new tensor of ones; NULL and invalid arguments as ebb_tensor_zeros(). */
EBB_API ebb_status ebb_tensor_ones(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                           ebb_device device);
/* A new tensor with every element `value` (converted to dtype); NULL and
 * invalid arguments as ebb_tensor_zeros(). */
EBB_API ebb_status ebb_tensor_full(ebb_tensor **out, const ebb_shape *shape, double value,
                           ebb_dtype dtype, ebb_device device);
/* Uninitialised storage (used for meta-device shape propagation). */
EBB_API ebb_status ebb_tensor_empty(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                            ebb_device device);
/* Standard normal values from a generator seeded with `seed`. Values are drawn
 * on the CPU and copied, so a seed gives the same numbers on every device. */
EBB_API ebb_status ebb_tensor_randn(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                            ebb_device device, uint64_t seed);
/* Uniform values in [lo, hi), seeded like ebb_tensor_randn(). */
EBB_API ebb_status ebb_tensor_uniform(ebb_tensor **out, const ebb_shape *shape, double lo, double hi,
                              ebb_dtype dtype, ebb_device device, uint64_t seed);
/* Copies `nbytes` of host memory laid out contiguously as `shape`/`dtype`.
 * nbytes must equal the tensor's size exactly. */
EBB_API ebb_status ebb_tensor_from_host(ebb_tensor **out, const void *data, size_t nbytes,
                                const ebb_shape *shape, ebb_dtype dtype, ebb_device device);
/* Copies the tensor's values, contiguous and row-major, into host memory.
 * nbytes must equal ebb_tensor_nbytes(t). */
EBB_API ebb_status ebb_tensor_to_host(const ebb_tensor *t, void *data, size_t nbytes);
/* A copy on another device and/or dtype (a new handle on `t` if nothing
 * changes). */
EBB_API ebb_status ebb_tensor_to(ebb_tensor **out, const ebb_tensor *t, ebb_device device,
                         ebb_dtype dtype);

/* ---- queries ----------------------------------------------------------- */

/* The shape (ndim 0 and no dims for a tensor of more than EBB_MAX_DIMS
 * dimensions: check ebb_tensor_ndim() where that can happen). NULL t: ndim 0. */
EBB_API ebb_shape ebb_tensor_shape(const ebb_tensor *t);
/* Number of dimensions (0 for a scalar). NULL t: 0. */
EBB_API int ebb_tensor_ndim(const ebb_tensor *t);
/* The element type. NULL t: EBB_FLOAT32. */
EBB_API ebb_dtype ebb_tensor_dtype(const ebb_tensor *t);
/* The device the storage is on. NULL t: the CPU. */
EBB_API ebb_device ebb_tensor_device(const ebb_tensor *t);
/* Number of elements (1 for a scalar). NULL t: 0. */
EBB_API int64_t ebb_tensor_numel(const ebb_tensor *t);
/* Bytes of the tensor's elements: numel * element size. NULL t: 0. */
EBB_API size_t ebb_tensor_nbytes(const ebb_tensor *t);
/* Bytes of the storage the tensor looks at (larger than nbytes for a view of
 * part of a bigger tensor). NULL t: 0. */
EBB_API size_t ebb_tensor_storage_nbytes(const ebb_tensor *t);
/* Non-zero when a and b share storage (one is a view of the other). NULL: 0. */
EBB_API int ebb_tensor_same_storage(const ebb_tensor *a, const ebb_tensor *b);
/* Non-zero when nothing else (another handle, a view, a tensor inside
 * libtorch) shares t's storage, so it may be overwritten in place. NULL t: 0. */
EBB_API int ebb_tensor_is_exclusive(const ebb_tensor *t);
/* The value of a one-element tensor, as a double. */
EBB_API ebb_status ebb_tensor_item(const ebb_tensor *t, double *out);
/* Mean of all elements, as a double (loop conditions). */
EBB_API ebb_status ebb_tensor_mean_value(const ebb_tensor *t, double *out);
/* Largest absolute elementwise difference, and whether shapes match; for tests. */
EBB_API ebb_status ebb_tensor_max_abs_diff(const ebb_tensor *a, const ebb_tensor *b, double *out);
/* Non-zero when every |a-b| <= atol + rtol*|b| (shapes must match). */
EBB_API ebb_status ebb_tensor_allclose(const ebb_tensor *a, const ebb_tensor *b, double rtol, double atol,
                               int *out);

/* ---- arithmetic -------------------------------------------------------- */

typedef enum ebb_unary_op {
    EBB_RELU,
    EBB_GELU,
    EBB_TANH,
    EBB_SIGMOID,
    EBB_SILU,
    EBB_NEG,
    EBB_EXP,
    EBB_LOG,
    EBB_SQRT,
    EBB_ABS,
    EBB_GELU_TANH, /* GELU's tanh approximation (F.gelu(x, approximate="tanh")) */
    EBB_RSQRT,     /* 1 / sqrt(x) */
    EBB_SIN,
    EBB_COS,
} ebb_unary_op;

typedef enum ebb_binary_op {
    EBB_ADD,
    EBB_SUB,
    EBB_MUL,
    EBB_DIV,
    EBB_MAXIMUM,
    EBB_MINIMUM,
} ebb_binary_op;

typedef enum ebb_compare_op { EBB_EQ, EBB_NE, EBB_LT, EBB_LE, EBB_GT, EBB_GE } ebb_compare_op;

typedef enum ebb_reduce_op { EBB_REDUCE_SUM, EBB_REDUCE_MEAN, EBB_REDUCE_MAX, EBB_REDUCE_MIN } ebb_reduce_op;

/* A new tensor op(x), elementwise (relu, gelu, exp, ...). */
EBB_API ebb_status ebb_tensor_unary(ebb_tensor **out, ebb_unary_op op, const ebb_tensor *x);
/* The same, in place: x := op(x). */
EBB_API ebb_status ebb_tensor_unary_(ebb_tensor *x, ebb_unary_op op);
/* Elementwise with broadcasting. */
EBB_API ebb_status ebb_tensor_binary(ebb_tensor **out, ebb_binary_op op, const ebb_tensor *a,
                             const ebb_tensor *b);
/* a += b in place (broadcasting b). */
EBB_API ebb_status ebb_tensor_add_(ebb_tensor *a, const ebb_tensor *b);
/* acc + a * b (broadcasting), one allocation. */
EBB_API ebb_status ebb_tensor_addcmul(ebb_tensor **out, const ebb_tensor *acc, const ebb_tensor *a,
                              const ebb_tensor *b);
/* a += weight * (b - a) in place, as torch's lerp_ (b broadcast to a); no
 * allocation. */
EBB_API ebb_status ebb_tensor_lerp_(ebb_tensor *a, const ebb_tensor *b, double weight);
/* x * scale + shift. */
EBB_API ebb_status ebb_tensor_affine(ebb_tensor **out, const ebb_tensor *x, double scale, double shift);
/* The same, in place: x := x * scale + shift. */
EBB_API ebb_status ebb_tensor_affine_(ebb_tensor *x, double scale, double shift);
/* xs[0] OP xs[1] OP ... xs[n-1] (n >= 2), left to right, with broadcasting and
 * libtorch's type promotion, accumulated in the output: the output is the only
 * allocation, where a chain of binary ops would make a temporary per input
 * after the second. */
EBB_API ebb_status ebb_tensor_fold(ebb_tensor **out, ebb_binary_op op, ebb_tensor *const *xs, int n);
/* The elementwise mean of xs[0..n) (n >= 2): their sum accumulated in the
 * output, then scaled there by 1/n. Integer inputs give the default float
 * type (float32), as sum * (1/n) would. */
EBB_API ebb_status ebb_tensor_average(ebb_tensor **out, ebb_tensor *const *xs, int n);
/* x ** exponent, elementwise (torch.pow with a number exponent). */
EBB_API ebb_status ebb_tensor_pow(ebb_tensor **out, const ebb_tensor *x, double exponent);
/* The same, in place: x := x ** exponent. */
EBB_API ebb_status ebb_tensor_pow_(ebb_tensor *x, double exponent);
/* x limited to [lo, hi] (torch.clamp); -INFINITY or INFINITY is no bound on
 * that side. NaN stays NaN. lo > hi gives hi everywhere, as torch.clamp. */
EBB_API ebb_status ebb_tensor_clamp(ebb_tensor **out, const ebb_tensor *x, double lo, double hi);
/* The same, in place. */
EBB_API ebb_status ebb_tensor_clamp_(ebb_tensor *x, double lo, double hi);
/* A boolean tensor: x OP value. */
EBB_API ebb_status ebb_tensor_compare(ebb_tensor **out, ebb_compare_op op, const ebb_tensor *x,
                              double value);
/* a @ b with libtorch's matmul broadcasting rules. */
EBB_API ebb_status ebb_tensor_matmul(ebb_tensor **out, const ebb_tensor *a, const ebb_tensor *b);
/* x with `value` where the bool mask (broadcast to x's shape) is true
 * (Tensor.masked_fill); a mask of another dtype is EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_masked_fill(ebb_tensor **out, const ebb_tensor *x,
                                          const ebb_tensor *mask, double value);
/* a where the bool cond is true, else b (torch.where(cond, a, b)); all
 * three broadcast. A cond of another dtype is EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_where(ebb_tensor **out, const ebb_tensor *cond, const ebb_tensor *a,
                                    const ebb_tensor *b);
/* A bool [rows, cols] that is true above the diagonal (column j > row i):
 * the positions a causal attention masks, triu(ones, 1). */
EBB_API ebb_status ebb_tensor_causal_mask(ebb_tensor **out, int64_t rows, int64_t cols,
                                          ebb_device device);
/* x @ weight^T + bias, PyTorch's layout: weight [out, in], bias [out] or NULL. */
EBB_API ebb_status ebb_tensor_linear(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *weight,
                             const ebb_tensor *bias);
/* Softmax along dim (negative counts from the end). dim out of range fails. */
EBB_API ebb_status ebb_tensor_softmax(ebb_tensor **out, const ebb_tensor *x, int64_t dim);
/* log(softmax(x)) along dim, computed stably; dim as ebb_tensor_softmax(). */
EBB_API ebb_status ebb_tensor_log_softmax(ebb_tensor **out, const ebb_tensor *x, int64_t dim);
/* Normalises over the last `normalized_ndim` dims; weight and bias may be NULL. */
EBB_API ebb_status ebb_tensor_layer_norm(ebb_tensor **out, const ebb_tensor *x, int normalized_ndim,
                                 const ebb_tensor *weight, const ebb_tensor *bias, double eps);
/* Reduces over `dims` (all dims when ndims == 0). */
EBB_API ebb_status ebb_tensor_reduce(ebb_tensor **out, ebb_reduce_op op, const ebb_tensor *x,
                             const int64_t *dims, int ndims, bool keepdim);
/* Index of the largest value along dim (int64). */
EBB_API ebb_status ebb_tensor_argmax(ebb_tensor **out, const ebb_tensor *x, int64_t dim);
/* The k largest values along dim and their int64 indices. */
EBB_API ebb_status ebb_tensor_topk(ebb_tensor **values, ebb_tensor **indices, const ebb_tensor *x,
                           int64_t k, int64_t dim);
/* out = zeros_like(x) with out.scatter(dim, index, src). */
EBB_API ebb_status ebb_tensor_scatter(ebb_tensor **out, const ebb_tensor *x, int64_t dim,
                              const ebb_tensor *index, const ebb_tensor *src);

/* libtorch's intra-op thread count on the CPU (at::get_num_threads()): some
 * kernels size their scratch by it. */
EBB_API int ebb_tensor_num_threads(void);

/* ---- joining and indexing ---------------------------------------------- */

/* Copies src's values into dst (same shape; broadcasting and dtype or
 * device conversion as libtorch does), asynchronously on CUDA. */
EBB_API ebb_status ebb_tensor_copy_(ebb_tensor *dst, const ebb_tensor *src);

/* Joins xs[0..n) along an existing dim; shapes must match elsewhere. NULL xs
 * or a NULL element: EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_cat(ebb_tensor **out, ebb_tensor *const *xs, int n, int64_t dim);
/* Joins xs[0..n), all of one shape, along a new dim. NULL xs or a NULL
 * element: EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_stack(ebb_tensor **out, ebb_tensor *const *xs, int n, int64_t dim);
/* Rows (along dim) picked by an int64 index tensor. */
EBB_API ebb_status ebb_tensor_index_select(ebb_tensor **out, const ebb_tensor *x, int64_t dim,
                                   const ebb_tensor *index);
/* x[index[i]] = src[i] along dim, in place. */
EBB_API ebb_status ebb_tensor_index_copy_(ebb_tensor *x, int64_t dim, const ebb_tensor *index,
                                  const ebb_tensor *src);
/* x[index[i]] += src[i] along dim, in place. */
EBB_API ebb_status ebb_tensor_index_add_(ebb_tensor *x, int64_t dim, const ebb_tensor *index,
                                 const ebb_tensor *src);
/* The int64 positions of the non-zero elements of a 1-D tensor. */
EBB_API ebb_status ebb_tensor_nonzero_1d(ebb_tensor **out, const ebb_tensor *x);
/* Converts to another dtype on the same device. */
EBB_API ebb_status ebb_tensor_cast(ebb_tensor **out, const ebb_tensor *x, ebb_dtype dtype);

/* ---- views (share storage with x) -------------------------------------- */

/* -1 in one dim is inferred. Copies only if the layout requires it. */
EBB_API ebb_status ebb_tensor_reshape(ebb_tensor **out, const ebb_tensor *x, const ebb_shape *shape);
/* A view with dims start_dim..end_dim (inclusive, negative from the end)
 * merged into one. */
EBB_API ebb_status ebb_tensor_flatten(ebb_tensor **out, const ebb_tensor *x, int64_t start_dim,
                              int64_t end_dim);
/* A view with dims reordered: output dim i is input dim dims[i]; ndims must
 * equal x's ndim. */
EBB_API ebb_status ebb_tensor_permute(ebb_tensor **out, const ebb_tensor *x, const int64_t *dims,
                              int ndims);
/* A view with dims dim0 and dim1 swapped. */
EBB_API ebb_status ebb_tensor_transpose(ebb_tensor **out, const ebb_tensor *x, int64_t dim0,
                                int64_t dim1);
/* A view with a size-1 dim inserted at dim (-1: at the end). */
EBB_API ebb_status ebb_tensor_unsqueeze(ebb_tensor **out, const ebb_tensor *x, int64_t dim);
/* A view with dim removed if its size is 1 (else a new handle on x, same
 * shape). */
EBB_API ebb_status ebb_tensor_squeeze(ebb_tensor **out, const ebb_tensor *x, int64_t dim);
/* Elements [start, start+length) along dim. */
EBB_API ebb_status ebb_tensor_narrow(ebb_tensor **out, const ebb_tensor *x, int64_t dim, int64_t start,
                             int64_t length);
/* The slice at `index` along dim, dim removed. */
EBB_API ebb_status ebb_tensor_select(ebb_tensor **out, const ebb_tensor *x, int64_t dim, int64_t index);
/* A contiguous tensor (x itself, as a new handle, if already contiguous). */
EBB_API ebb_status ebb_tensor_contiguous(ebb_tensor **out, const ebb_tensor *x);

/* ---- neural-network layers (used by ops/) ---- */

/* Copies `nbytes` of host memory, laid out contiguously and row-major in dst's
 * dtype, into the existing tensor dst (any device; a strided dst is filled in
 * its logical order). nbytes must equal ebb_tensor_nbytes(dst); `data` need
 * not be aligned. Views of dst see the new values. */
EBB_API ebb_status ebb_tensor_copy_from_host(ebb_tensor *dst, const void *data, size_t nbytes);

/* Convolution, PyTorch layout: x [N, C, *spatial] (or unbatched [C, *spatial]),
 * weight [out, C/groups, *kernel] with 1 to 3 spatial dims, bias [out] or NULL.
 * stride, padding and dilation hold one entry per spatial dim (weight's ndim
 * - 2). Works on meta tensors (shapes only). */
EBB_API ebb_status ebb_tensor_conv(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *weight,
                           const ebb_tensor *bias, const int64_t *stride, const int64_t *padding,
                           const int64_t *dilation, int64_t groups);

typedef enum ebb_pool_op { EBB_POOL_MAX, EBB_POOL_AVG } ebb_pool_op;

/* 2-D max or average pooling over the last two dims of [N, C, H, W] or
 * [C, H, W]. kernel, stride and padding are {h, w}; stride NULL means the
 * kernel, padding NULL means 0 (at most kernel/2). count_include_pad is read
 * for EBB_POOL_AVG only. */
EBB_API ebb_status ebb_tensor_pool2d(ebb_tensor **out, ebb_pool_op op, const ebb_tensor *x,
                             const int64_t kernel[2], const int64_t stride[2],
                             const int64_t padding[2], bool ceil_mode, bool count_include_pad);
/* Average pooling to a fixed out_h x out_w output, PyTorch's bin edges. */
EBB_API ebb_status ebb_tensor_adaptive_avg_pool2d(ebb_tensor **out, const ebb_tensor *x, int64_t out_h,
                                          int64_t out_w);

/* Inference batch norm over dim 1 of [N, C, ...] with running statistics:
 * (x - mean) / sqrt(var + eps) * weight + bias. weight and bias may be NULL. */
EBB_API ebb_status ebb_tensor_batch_norm(ebb_tensor **out, const ebb_tensor *x,
                                 const ebb_tensor *running_mean, const ebb_tensor *running_var,
                                 const ebb_tensor *weight, const ebb_tensor *bias, double eps);
/* Group norm of [N, C, ...]: statistics per sample over C/num_groups channels
 * and all spatial positions; weight and bias [C] may be NULL. */
EBB_API ebb_status ebb_tensor_group_norm(ebb_tensor **out, const ebb_tensor *x, int64_t num_groups,
                                 const ebb_tensor *weight, const ebb_tensor *bias, double eps);
/* x * rsqrt(mean(x^2 over the last dim) + eps) * weight; weight [D] may be
 * NULL. float16/bfloat16 inputs are computed in float32 (as PyTorch's
 * rms_norm); the output has the input's dtype. */
EBB_API ebb_status ebb_tensor_rms_norm(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *weight,
                               double eps);

/* Rows of weight [num, dim] picked by int64 (or int32) indices of any shape:
 * out is [*indices, dim]. An index outside [0, num) is an EBB_ERR_ARG naming
 * it (checked before the lookup, which costs a device sync on CUDA). */
EBB_API ebb_status ebb_tensor_embedding(ebb_tensor **out, const ebb_tensor *weight,
                                const ebb_tensor *indices);

/* Rotary position embeddings (RoFormer; as LLaMA applies them to queries
 * and keys): the last dim's pairs of x, at position t along seq_dim (a dim
 * before the last; negative counts from the end), turned by the angle
 * t / theta^(2j / D) for pair j of D / 2. The pairs are (j, j + D/2) (the
 * halves, Hugging Face's rotate_half) or, with `interleaved`, (2j, 2j + 1)
 * (Meta's complex layout). The cos and sin tables, made in float32 as
 * Hugging Face's LlamaRotaryEmbedding makes them and held in x's dtype,
 * [T, D/2] each, are the only allocation beside the output. `inverse` turns
 * by minus the angle: the rotation's gradient. The last dim must be even.
 * Positions count from `start` (0, or where a key/value cache's new tokens
 * begin): row t of the tables is position start + t, the same values a
 * call from 0 gives at that row. */
EBB_API ebb_status ebb_tensor_rotary(ebb_tensor **out, const ebb_tensor *x, int64_t seq_dim,
                                     int64_t start, double theta, bool interleaved, bool inverse);
/* Each slice of x along dim repeated `repeats` times in a row
 * (torch.repeat_interleave(x, repeats, dim)): grouped-query attention's
 * repeat_kv, [B, H_kv, T, D] -> [B, H_kv * repeats, T, D]. One copy, the
 * output; repeats 1 gives x itself. */
EBB_API ebb_status ebb_tensor_repeat_interleave(ebb_tensor **out, const ebb_tensor *x,
                                                int64_t dim, int64_t repeats);
/* Of ebb_tensor_repeat_interleave(): each slice's copies in grad summed. */
EBB_API ebb_status ebb_tensor_repeat_interleave_backward(ebb_tensor **grad_x,
                                                         const ebb_tensor *grad, int64_t dim,
                                                         int64_t repeats);

/* softmax(q k^T / sqrt(E)) v over q [..., L, E], k [..., S, E], v [..., S, Ev]
 * (batch dims broadcast). causal masks key j > query i (top-left aligned, as
 * PyTorch's is_causal). Uses at::scaled_dot_product_attention on libtorch 2.x,
 * matmul and softmax on 1.x. */
EBB_API ebb_status ebb_tensor_attention(ebb_tensor **out, const ebb_tensor *q, const ebb_tensor *k,
                                const ebb_tensor *v, bool causal);

/* One GRU step, nn.GRUCell's layout and gate order (r, z, n): x [B, in],
 * h [B, H], w_ih [3H, in], w_hh [3H, H], biases [3H] or NULL. out is h' [B, H]. */
EBB_API ebb_status ebb_tensor_gru_cell(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *h,
                               const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                               const ebb_tensor *b_ih, const ebb_tensor *b_hh);
/* One LSTM step, nn.LSTMCell's layout and gate order (i, f, g, o): x [B, in],
 * h and c [B, H], w_ih [4H, in], w_hh [4H, H], biases [4H] or NULL. Returns
 * h' and c' as two new handles (both NULL on failure). */
EBB_API ebb_status ebb_tensor_lstm_cell(ebb_tensor **h_out, ebb_tensor **c_out, const ebb_tensor *x,
                                const ebb_tensor *h, const ebb_tensor *c, const ebb_tensor *w_ih,
                                const ebb_tensor *w_hh, const ebb_tensor *b_ih,
                                const ebb_tensor *b_hh);

/* ---- losses (mean reduction, PyTorch's default; each out is 0-dim) ---- */

/* torch.nn.functional.cross_entropy: logits [B, C] (or one sample's [C])
 * against int64 class indices target [B] (or 0-dim), through log_softmax
 * over the classes and nll_loss. A target equal to ignore_index counts for
 * nothing (PyTorch's default is -100); label_smoothing, in [0, 1], mixes
 * that share of the uniform distribution into the targets. log_probs and
 * total_weight (each may be NULL) receive the log_softmax and the number of
 * counted targets (0-dim, the logits' dtype) that
 * ebb_tensor_cross_entropy_backward() reads. A float target is EBB_ERR_ARG
 * (it needs class indices); a class index outside [0, C) is an error naming
 * it. */
EBB_API ebb_status ebb_tensor_cross_entropy(ebb_tensor **out, ebb_tensor **log_probs,
                                            ebb_tensor **total_weight, const ebb_tensor *logits,
                                            const ebb_tensor *target, int64_t ignore_index,
                                            double label_smoothing);
/* torch.nn.functional.nll_loss of log-probabilities [B, C] (or [C]) and
 * int64 class indices [B] (or 0-dim), targets and ignore_index as
 * ebb_tensor_cross_entropy(); total_weight (may be NULL) as there. */
EBB_API ebb_status ebb_tensor_nll_loss(ebb_tensor **out, ebb_tensor **total_weight,
                                       const ebb_tensor *log_probs, const ebb_tensor *target,
                                       int64_t ignore_index);
/* torch.nn.functional.mse_loss: mean((pred - target)^2); pred and target of
 * one shape and one floating dtype. */
EBB_API ebb_status ebb_tensor_mse_loss(ebb_tensor **out, const ebb_tensor *pred,
                                       const ebb_tensor *target);
/* torch.nn.functional.binary_cross_entropy_with_logits: the mean of
 * -[t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], computed stably from the
 * logits; logits and float targets (probabilities) of one shape and dtype. */
EBB_API ebb_status ebb_tensor_bce_with_logits(ebb_tensor **out, const ebb_tensor *logits,
                                              const ebb_tensor *target);

/* ---- derivatives (used by the ops' backward rules) ------------------------
 *
 * Each computes the gradient(s) of one forward with ATen's derivative kernel
 * for it. Gradients come back as new handles with the shapes of what they
 * differentiate; an out-pointer given as NULL is a gradient not wanted (not
 * computed). On failure every out is NULL and ebb_errmsg() names the shapes. */

/* relu, tanh, sigmoid, exp, sqrt and rsqrt take their OUTPUT as `saved`;
 * gelu, silu, log, abs, sin and cos their input; neg reads only grad
 * (pass it as `saved`). As derivatives.yaml: threshold_backward,
 * tanh_backward, sigmoid_backward, gelu_backward, silu_backward; exp:
 * grad * y; log: grad / x; sqrt: grad / y * 0.5; rsqrt: grad * y^3 *
 * -0.5; abs: grad * sgn(x); sin: grad * cos(x); cos: -grad * sin(x). Each
 * allocates its result only, besides a Scalar operand (sqrt, rsqrt). */
EBB_API ebb_status ebb_tensor_unary_backward(ebb_tensor **grad_x, ebb_unary_op op, const ebb_tensor *grad,
                                     const ebb_tensor *saved);
/* Of x ** exponent: grad * exponent * x ** (exponent - 1) (zeros for an
 * exponent of 0), as derivatives.yaml's pow_backward: the power, then two
 * products in place (one a Scalar operand). */
EBB_API ebb_status ebb_tensor_pow_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                           const ebb_tensor *x, double exponent);
/* Of ebb_tensor_clamp(x, lo, hi): grad where lo <= x <= hi, else 0 (NaN
 * included, as torch's): a copy of grad, zeroed through one bool mask at a
 * time. */
EBB_API ebb_status ebb_tensor_clamp_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                             const ebb_tensor *x, double lo, double hi);
/* Of ebb_tensor_where(cond, a, b): grad where cond (zeros elsewhere) for a,
 * grad where not cond for b, each summed to its input's shape (a and b).
 * a's is made first, through the negated mask, which goes before b's. */
EBB_API ebb_status ebb_tensor_where_backward(ebb_tensor **grad_a, ebb_tensor **grad_b,
                                             const ebb_tensor *grad, const ebb_tensor *cond,
                                             const ebb_shape *a, const ebb_shape *b);
/* From the (log_)softmax output: _(log_)softmax_backward_data. */
EBB_API ebb_status ebb_tensor_softmax_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                       const ebb_tensor *out, int64_t dim, bool log);
/* grad summed over the dims where `shape` was broadcast to grad's. */
EBB_API ebb_status ebb_tensor_sum_to(ebb_tensor **out, const ebb_tensor *grad, const ebb_shape *shape);
/* Of a sum (or mean) of an input of shape x over dims (all when ndims 0). */
EBB_API ebb_status ebb_tensor_reduce_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                      const ebb_shape *x, const int64_t *dims, int ndims,
                                      bool keepdim, bool mean);
/* Of max(x) over all elements: shared evenly by the maxima (zeros for an
 * empty x). */
EBB_API ebb_status ebb_tensor_max_all_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                       const ebb_tensor *x);
/* Of ebb_tensor_fold() (EBB_ADD, EBB_MUL, EBB_MAXIMUM; n >= 2) into
 * grad_xs[0..n), each reduced to its input's shape. */
EBB_API ebb_status ebb_tensor_fold_backward(ebb_tensor **grad_xs, ebb_binary_op op, const ebb_tensor *grad,
                                    ebb_tensor *const *xs, int n);
/* Of x @ weight^T + bias: grad @ weight, grad^T x and grad summed over rows.
 * x may be NULL when grad_weight is. */
EBB_API ebb_status ebb_tensor_linear_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                      ebb_tensor **grad_bias, const ebb_tensor *grad,
                                      const ebb_tensor *x, const ebb_tensor *weight);
/* Training dropout: keeps each element with probability 1-p (a bool mask
 * drawn by a generator seeded with `seed`: on the CPU for CPU tensors, on the
 * GPU for CUDA ones, so a seed drops the same elements on every run on one
 * kind of device, and other ones on the CPU and on CUDA) and scales the kept
 * ones by 1/(1-p). */
EBB_API ebb_status ebb_tensor_dropout_train(ebb_tensor **out, ebb_tensor **mask, const ebb_tensor *x,
                                    double p, uint64_t seed);
/* Of ebb_tensor_dropout_train(): grad * mask / (1-p). mask must have grad's
 * shape. */
EBB_API ebb_status ebb_tensor_dropout_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                       const ebb_tensor *mask, double p);
/* native_layer_norm: the output and the per-row mean and rstd its backward
 * reads. */
EBB_API ebb_status ebb_tensor_layer_norm_train(ebb_tensor **out, ebb_tensor **mean, ebb_tensor **rstd,
                                       const ebb_tensor *x, int normalized_ndim,
                                       const ebb_tensor *weight, const ebb_tensor *bias,
                                       double eps);
/* Of ebb_tensor_layer_norm_train(), from its mean and rstd; weight and bias
 * may be NULL (then no grad_weight or grad_bias). */
EBB_API ebb_status ebb_tensor_layer_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                          ebb_tensor **grad_bias, const ebb_tensor *grad,
                                          const ebb_tensor *x, int normalized_ndim,
                                          const ebb_tensor *mean, const ebb_tensor *rstd,
                                          const ebb_tensor *weight, const ebb_tensor *bias);
/* Training batch norm (native_batch_norm): normalises with the batch's
 * statistics, returns the per-channel mean and inverse std its backward
 * reads, and updates running_mean and running_var in place with `momentum`
 * (the unbiased variance), as nn.BatchNorm does in training. */
EBB_API ebb_status ebb_tensor_batch_norm_train(ebb_tensor **out, ebb_tensor **save_mean,
                                       ebb_tensor **save_invstd, const ebb_tensor *x,
                                       ebb_tensor *running_mean, ebb_tensor *running_var,
                                       const ebb_tensor *weight, const ebb_tensor *bias,
                                       double momentum, double eps);
/* grad_weight and grad_bias need weight (affine). */
EBB_API ebb_status ebb_tensor_batch_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                          ebb_tensor **grad_bias, const ebb_tensor *grad,
                                          const ebb_tensor *x, const ebb_tensor *weight,
                                          const ebb_tensor *save_mean,
                                          const ebb_tensor *save_invstd, double eps);
/* native_group_norm: the output and the per-(sample, group) mean and rstd. */
EBB_API ebb_status ebb_tensor_group_norm_train(ebb_tensor **out, ebb_tensor **mean, ebb_tensor **rstd,
                                       const ebb_tensor *x, int64_t num_groups,
                                       const ebb_tensor *weight, const ebb_tensor *bias,
                                       double eps);
/* Of ebb_tensor_group_norm_train(), from its mean and rstd; weight may be
 * NULL (then no grad_weight or grad_bias). */
EBB_API ebb_status ebb_tensor_group_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                          ebb_tensor **grad_bias, const ebb_tensor *grad,
                                          const ebb_tensor *x, const ebb_tensor *mean,
                                          const ebb_tensor *rstd, const ebb_tensor *weight,
                                          int64_t num_groups);
/* Of ebb_tensor_rms_norm (libtorch 1.13 has no kernel: written out from the
 * forward's ATen calls). */
EBB_API ebb_status ebb_tensor_rms_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                        const ebb_tensor *grad, const ebb_tensor *x,
                                        const ebb_tensor *weight, double eps);
/* Of ebb_tensor_conv (convolution_backward); grad_bias given means the
 * forward had a bias. */
EBB_API ebb_status ebb_tensor_conv_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                    ebb_tensor **grad_bias, const ebb_tensor *grad,
                                    const ebb_tensor *x, const ebb_tensor *weight,
                                    const int64_t *stride, const int64_t *padding,
                                    const int64_t *dilation, int64_t groups);
/* The stride ebb_tensor_conv_backward() hands libtorch along one spatial dim
 * of extent `in` on the CPU: `stride`, except for bfloat16 where the stride
 * is longer than the input needs for its one output position. oneDNN's
 * bfloat16 weight gradient reads memory it never wrote there, so the
 * shortest stride with that one position (the same convolution) is used.
 * The plan's scratch figure for the backward follows the same rule. */
EBB_API int64_t ebb_tensor_conv_backward_stride(int64_t in, int64_t kernel, int64_t stride,
                                                int64_t padding, int64_t dilation,
                                                ebb_dtype dtype);
/* max_pool2d_with_indices: the output and the int64 argmax per output
 * element, which its backward scatters the gradient to. */
EBB_API ebb_status ebb_tensor_max_pool2d_train(ebb_tensor **out, ebb_tensor **indices, const ebb_tensor *x,
                                       const int64_t kernel[2], const int64_t stride[2],
                                       const int64_t padding[2], bool ceil_mode);
/* Of ebb_tensor_max_pool2d_train(): grad scattered to the saved indices.
 * NULL kernel, stride or padding: EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_max_pool2d_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                          const ebb_tensor *x, const ebb_tensor *indices,
                                          const int64_t kernel[2], const int64_t stride[2],
                                          const int64_t padding[2], bool ceil_mode);
/* Of average pooling with ebb_tensor_pool2d() (same arguments). NULL kernel,
 * stride or padding: EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_avg_pool2d_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                          const ebb_tensor *x, const int64_t kernel[2],
                                          const int64_t stride[2], const int64_t padding[2],
                                          bool ceil_mode, bool count_include_pad);
/* Of ebb_tensor_adaptive_avg_pool2d(); x is the forward's 3-D or 4-D input. */
EBB_API ebb_status ebb_tensor_adaptive_avg_pool2d_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                                   const ebb_tensor *x);
/* The weight's gradient of an embedding lookup (embedding_dense_backward). */
EBB_API ebb_status ebb_tensor_embedding_backward(ebb_tensor **grad_weight, const ebb_tensor *grad,
                                         const ebb_tensor *indices, int64_t num_weights);
/* ebb_tensor_attention() with an attention mask and dropout, as
 * F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
 * is_causal=causal): `mask` (NULL: none) broadcasts to the scores [..., L,
 * S] and is bool (true: the key takes part) or floating (added to the
 * scores); with dropout > 0 the probabilities are dropped with a mask drawn
 * from `seed`, returned in *keep (bool [..., L, S]) for the backward, and
 * scaled by 1/(1 - dropout). These go through matmul and softmax. */
EBB_API ebb_status ebb_tensor_attention_ex(ebb_tensor **out, ebb_tensor **keep,
                                           const ebb_tensor *q, const ebb_tensor *k,
                                           const ebb_tensor *v, const ebb_tensor *mask,
                                           bool causal, double dropout, uint64_t seed);
/* Of ebb_tensor_attention and ebb_tensor_attention_ex: the gradients of q,
 * k and v from the output's, the probabilities recomputed from q and k
 * rather than kept; with the forward's mask (NULL: none), its keep mask
 * (NULL without dropout) and dropout (0: none). */
EBB_API ebb_status ebb_tensor_attention_backward(ebb_tensor **grad_q, ebb_tensor **grad_k,
                                                 ebb_tensor **grad_v, const ebb_tensor *grad,
                                                 const ebb_tensor *q, const ebb_tensor *k,
                                                 const ebb_tensor *v, const ebb_tensor *mask,
                                                 const ebb_tensor *keep, bool causal,
                                                 double dropout);
/* Of the multi_head_attention op (ops/attention.c): grad_in[0..n_in) for
 * query[, key[, value]] and grad_params[] in the op's parameter order
 * (in_proj_weight, [in_proj_bias,] out_proj.weight[, out_proj.bias]).
 * Recomputes the attention probabilities from the inputs; a training
 * forward that dropped some (dropout > 0) gives the bool mask `keep` [B, H,
 * T, S] it kept (ebb_tensor_attention_ex's), else NULL and 0. */
EBB_API ebb_status ebb_tensor_multi_head_attention_backward(
    ebb_tensor **grad_in, ebb_tensor **grad_params, const ebb_tensor *grad, ebb_tensor *const *in,
    int n_in, const ebb_tensor *w_in, const ebb_tensor *b_in, const ebb_tensor *w_out,
    const ebb_tensor *b_out, int64_t heads, bool causal, const ebb_tensor *keep, double dropout);
/* Of ebb_tensor_gru_cell: grad_w[4] for w_ih, w_hh, b_ih, b_hh (biases
 * only when given). _thnn_differentiable_gru_cell_backward does the gates. */
EBB_API ebb_status ebb_tensor_gru_cell_backward(ebb_tensor **grad_x, ebb_tensor **grad_h,
                                        ebb_tensor **grad_w, const ebb_tensor *grad,
                                        const ebb_tensor *x, const ebb_tensor *h,
                                        const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                                        const ebb_tensor *b_ih, const ebb_tensor *b_hh);
/* Of ebb_tensor_lstm_cell, from the gradients of h' and c' and the new cell
 * state cy (_thnn_differentiable_lstm_cell_backward). */
EBB_API ebb_status ebb_tensor_lstm_cell_backward(ebb_tensor **grad_x, ebb_tensor **grad_h,
                                         ebb_tensor **grad_c, ebb_tensor **grad_w,
                                         const ebb_tensor *grad_hy, const ebb_tensor *grad_cy,
                                         const ebb_tensor *x, const ebb_tensor *h,
                                         const ebb_tensor *c, const ebb_tensor *cy,
                                         const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                                         const ebb_tensor *b_ih, const ebb_tensor *b_hh);
/* Of ebb_tensor_cross_entropy(), from its log_probs and total_weight
 * (nll_loss_backward, then _log_softmax_backward_data); grad has one
 * element. */
EBB_API ebb_status ebb_tensor_cross_entropy_backward(ebb_tensor **grad_logits,
                                                     const ebb_tensor *grad,
                                                     const ebb_tensor *log_probs,
                                                     const ebb_tensor *target,
                                                     const ebb_tensor *total_weight,
                                                     int64_t ignore_index,
                                                     double label_smoothing);
/* Of ebb_tensor_nll_loss() (nll_loss_backward), from the input's shape x,
 * the targets and total_weight alone: the gradient does not depend on the
 * log-probabilities' values. */
EBB_API ebb_status ebb_tensor_nll_loss_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                                const ebb_shape *x, const ebb_tensor *target,
                                                const ebb_tensor *total_weight,
                                                int64_t ignore_index);
/* Of ebb_tensor_mse_loss() with respect to pred (mse_loss_backward). */
EBB_API ebb_status ebb_tensor_mse_loss_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                                const ebb_tensor *pred, const ebb_tensor *target);
/* Of ebb_tensor_bce_with_logits() with respect to the logits:
 * (sigmoid(x) - target) * grad / numel, autograd's formula (libtorch 1.13
 * has no kernel for it). */
EBB_API ebb_status ebb_tensor_bce_with_logits_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                                       const ebb_tensor *logits,
                                                       const ebb_tensor *target);

/* ---- the autograd reference: a testing aid --------------------------------
 *
 * ebb computes gradients with the rules above; libtorch autograd is the
 * reference they are checked against, never the mechanism. Between
 * ebb_tensor_autograd_begin() and _end() (per thread, nestable) the tensor
 * layer records autograd history instead of running in inference mode, so
 * an op's ordinary forward, run on leaves, can be differentiated:
 *
 *     ebb_tensor_autograd_begin();
 *     ebb_tensor_clone(&leaf, x);          // made inside: a leaf autograd sees
 *     ebb_tensor_requires_grad_(leaf);
 *     op->forward(&call_on_leaf, &y);
 *     ebb_tensor_backward(y, grad_y);
 *     ebb_tensor_grad(&gx, leaf);          // d<y, grad_y>/dx
 *     ebb_tensor_autograd_end();
 *
 * Tensors made outside (inference tensors) cannot become leaves. */

/* Starts recording autograd history on this thread (nestable: pair each call
 * with ebb_tensor_autograd_end()). */
EBB_API void ebb_tensor_autograd_begin(void);
/* Ends the innermost ebb_tensor_autograd_begin() on this thread (extra calls
 * do nothing). */
EBB_API void ebb_tensor_autograd_end(void);
/* Marks a floating tensor made under autograd as a leaf that gets a .grad. */
EBB_API ebb_status ebb_tensor_requires_grad_(ebb_tensor *t);
/* Backpropagates grad_out (of out's shape) into the leaves' .grad. */
EBB_API ebb_status ebb_tensor_backward(const ebb_tensor *out, const ebb_tensor *grad_out);
/* The accumulated gradient of a leaf; zeros when nothing reached it. */
EBB_API ebb_status ebb_tensor_grad(ebb_tensor **out, const ebb_tensor *t);

#ifdef __cplusplus
}
#endif
#endif /* EBB_TENSOR_H */
