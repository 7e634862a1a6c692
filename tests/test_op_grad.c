/* Gradient parity: every op in the registry, present and future, has a
 * backward rule, and that rule's gradients equal libtorch autograd's on the
 * same inputs.
 *
 * For each op and each row of cases[] (looked up by op name), in float64
 * with seeded random inputs, parameters and output gradient:
 *   - the rule side runs forward_train (or forward), then the backward with
 *     only what the rule declares saved (NULL for every other input, the
 *     output only with saves_output), so an incomplete declaration fails;
 *   - the reference side clones the same values as autograd leaves (under
 *     ebb_tensor_autograd_begin), runs the same forward (the same seed, so
 *     dropout draws the same mask) and backpropagates the same gradient;
 *   - every differentiable input and every trained parameter must agree to
 *     1e-10 relative, where relative means max|rule - ref| divided by
 *     max(max|ref|, 1e-6): the largest error measured against the reference's
 *     largest magnitude, with an absolute floor for gradients that are ~0;
 *   - inputs without the differentiable bit must get no gradient at all;
 *   - the two forward outputs, and batch_norm's updated running statistics,
 *     must agree too; forward_train of an op whose training forward does not
 *     differ (max_pool2d, layer_norm, group_norm) must give forward's bytes;
 *   - the rule's backward call is measured with the CPU's accounting
 *     allocator: its peak above what was live before it, less the gradients
 *     it returns, is its scratch, which must equal the rule's declared
 *     workspace to the byte (at most it, where the rule says the figure is a
 *     bound), and the call must keep nothing beyond those gradients.
 * The same runs in float32, against autograd to 1e-4 relative, with the
 * same byte checks. Separately, every rule must run on meta tensors (the
 * compiler's dry run) and give gradients of its inputs' and parameters'
 * shapes and dtypes.
 * An op without a rule, or without rows here, fails the suite by name. */
#include "test_util.h"

#define MAX_IN 4
#define TOL 1e-10
#define TOL32 1e-4 /* float32 runs */
#define FLOOR 1e-6

/* The dtype of an output's gradient: the output's own where it is floating
 * (a cast's bfloat16), else the case's. */
static ebb_dtype grad_dtype(const ebb_tensor *out, ebb_dtype dt) {
    ebb_dtype o = ebb_tensor_dtype(out);
    return o == EBB_FLOAT32 || o == EBB_FLOAT64 || o == EBB_BFLOAT16 || o == EBB_FLOAT16 ? o : dt;
}

typedef struct grad_case {
    const char *op;
    int n_in; /* 0: every count the op accepts, up to MAX_IN */
    ebb_shape in[MAX_IN];
    const char *attrs;
    int64_t indices; /* > 0: in[0] holds int64 indices in [0, indices) */
} grad_case;

/* A loss's target, in[1], shaped as its row says (0-dim included): int64
 * class indices in [0, C) for cross_entropy and nll (returns C, in[0]'s last
 * dim), probabilities in [0, 1) for bce_with_logits (-1); 0 for other ops. */
static int64_t target_classes(const grad_case *gc) {
    if (strcmp(gc->op, "cross_entropy") == 0 || strcmp(gc->op, "nll") == 0)
        return gc->in[0].dim[gc->in[0].ndim - 1];
    return strcmp(gc->op, "bce_with_logits") == 0 ? -1 : 0;
}

/* masked_fill's and where's second inputs are bool masks, made from
 * the sign of random values */
static int bool_mask(const grad_case *gc, int i) {
    return (i == 1 && strcmp(gc->op, "masked_fill") == 0) ||
           (i == 1 && strcmp(gc->op, "where") == 0);
}

#define SH(...) {(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}}

static const grad_case cases[] = {
    /* dtypes */
    {"cast", 1, {SH(4, 8)}, "dtype=float64", 0},
    {"cast", 1, {SH(2, 3, 5)}, "dtype=bfloat16", 0},
    /* activations */
    {"relu", 1, {SH(4, 8)}, NULL, 0},
    {"relu", 1, {SH(2, 3, 5)}, NULL, 0},
    {"gelu", 1, {SH(4, 8)}, NULL, 0},
    {"gelu", 1, {SH(2, 3, 5)}, NULL, 0},
    {"gelu", 1, {SH(4, 8)}, "approximate=tanh", 0},
    {"tanh", 1, {SH(4, 8)}, NULL, 0},
    {"tanh", 1, {SH(2, 3, 5)}, NULL, 0},
    {"sigmoid", 1, {SH(4, 8)}, NULL, 0},
    {"sigmoid", 1, {SH(2, 3, 5)}, NULL, 0},
    {"silu", 1, {SH(4, 8)}, NULL, 0},
    {"silu", 1, {SH(2, 3, 5)}, NULL, 0},
    {"identity", 1, {SH(4, 8)}, NULL, 0},
    {"identity", 1, {SH(3, 1, 5)}, NULL, 0},
    {"dropout", 1, {SH(4, 8)}, NULL, 0},
    {"dropout", 1, {SH(2, 3, 5)}, "p=0.1", 0},
    {"softmax", 1, {SH(4, 8)}, NULL, 0},
    {"softmax", 1, {SH(2, 3, 5)}, "dim=0", 0},
    {"softmax", 1, {SH(64, 1000)}, NULL, 0},
    {"softmax", 1, {SH(300, 7)}, "dim=0", 0},
    {"log_softmax", 1, {SH(4, 8)}, NULL, 0},
    {"log_softmax", 1, {SH(2, 3, 5)}, "dim=1", 0},
    /* linear */
    {"linear", 1, {SH(4, 8)}, "out=6", 0},
    {"linear", 1, {SH(2, 3, 8)}, "out=5", 0},
    {"linear", 1, {SH(2, 3, 8)}, "out=5, bias=false", 0},
    {"linear", 1, {SH(7)}, "out=3", 0},
    {"linear", 1, {SH(1, 1, 8)}, "out=5, bias=false", 0},
    {"learned_halt", 1, {SH(4, 8)}, NULL, 0},
    {"learned_halt", 1, {SH(2, 3, 6)}, NULL, 0},
    /* convolution: batched and unbatched, strided, padded, dilated, grouped.
     * float32 goes to oneDNN where libtorch's use_mkldnn() says so, and its
     * scratch depends on the CPU: a bound there (0), exact on the
     * native path (float64, and float32 elsewhere) */
    {"conv1d", 1, {SH(2, 3, 10)}, "out=4, kernel=3", 0},
    {"conv1d", 1, {SH(3, 12)}, "out=2, kernel=3, stride=2, padding=1, dilation=2", 0},
    {"conv1d", 1, {SH(2, 4, 9)}, "out=6, kernel=3, padding=1, groups=2, bias=false", 0},
    {"conv1d", 1, {SH(2, 4, 9)}, "out=5, kernel=1", 0},
    {"conv2d", 1, {SH(2, 3, 8, 8)}, "out=4, kernel=3, padding=1", 0},
    {"conv2d", 1, {SH(1, 4, 7, 9)}, "out=6, kernel=3, stride=2, dilation=2, groups=2", 0},
    {"conv2d", 1, {SH(3, 6, 6)}, "out=2, kernel=2, bias=false", 0},
    {"conv2d", 1, {SH(2, 4, 5, 5)}, "out=3, kernel=1", 0},
    {"conv2d", 1, {SH(2, 4, 6, 6)}, "out=4, kernel=3, groups=4", 0},
    /* the grid of shapes where oneDNN leaves its direct kernels (docs/ops.md):
     * maps smaller than the kernel (a 3x3 layer on a 2x2 or 1x1 map), strides,
     * dilation, depthwise groups, 1x1 layers from batch 1 to 64 */
    {"conv2d", 1, {SH(4, 256, 2, 2)}, "out=256, kernel=3, padding=1", 0},
    {"conv2d", 1, {SH(2, 8, 1, 1)}, "out=8, kernel=3, padding=1", 0},
    {"conv2d", 1, {SH(2, 16, 3, 3)}, "out=16, kernel=5, stride=2, padding=2", 0},
    {"conv2d", 1, {SH(3, 16, 4, 4)}, "out=16, kernel=3, padding=2, dilation=2, groups=16", 0},
    {"conv2d", 1, {SH(16, 8, 2, 2)}, "out=16, kernel=1", 0},
    {"conv2d", 1, {SH(1, 4, 5, 5)}, "out=4, kernel=1, stride=2", 0},
    {"conv2d", 1, {SH(64, 4, 3, 3)}, "out=8, kernel=3, padding=1, groups=2", 0},
    {"conv2d", 1, {SH(2, 32, 7, 7)}, "out=8, kernel=7", 0},
    {"conv1d", 1, {SH(4, 8, 2)}, "out=8, kernel=3, padding=1", 0},
    /* pooling */
    {"max_pool2d", 1, {SH(2, 3, 8, 8)}, "kernel=2", 0},
    {"max_pool2d", 1, {SH(3, 7, 7)}, "kernel=3, stride=2, padding=1, ceil_mode=true", 0},
    {"avg_pool2d", 1, {SH(2, 3, 8, 8)}, "kernel=2", 0},
    {"avg_pool2d", 1, {SH(3, 7, 7)}, "kernel=3, stride=2, padding=1, count_include_pad=false", 0},
    {"adaptive_avg_pool2d", 1, {SH(2, 3, 8, 8)}, "output_size=1", 0},
    {"adaptive_avg_pool2d", 1, {SH(3, 7, 9)}, "output_size=3", 0},
    /* small maps, 1x1 maps, batch 64 */
    {"max_pool2d", 1, {SH(4, 16, 2, 2)}, "kernel=2", 0},
    {"max_pool2d", 1, {SH(64, 3, 1, 1)}, "kernel=1", 0},
    {"max_pool2d", 1, {SH(2, 8, 3, 3)}, "kernel=3, stride=2, padding=1", 0},
    {"avg_pool2d", 1, {SH(4, 16, 2, 2)}, "kernel=2", 0},
    {"avg_pool2d", 1, {SH(64, 3, 3, 3)}, "kernel=3, padding=1", 0},
    {"adaptive_avg_pool2d", 1, {SH(4, 16, 2, 2)}, "output_size=1", 0},
    {"adaptive_avg_pool2d", 1, {SH(64, 3, 1, 1)}, "output_size=1", 0},
    {"adaptive_avg_pool2d", 1, {SH(2, 8, 5, 5)}, "output_size=2", 0},
    /* normalisation */
    {"layer_norm", 1, {SH(4, 8)}, NULL, 0},
    {"layer_norm", 1, {SH(2, 3, 5)}, "affine=false", 0},
    {"layer_norm", 1, {SH(4, 8)}, "bias=false", 0},
    {"layer_norm", 1, {SH(64, 48)}, "bias=false", 0},
    {"layer_norm", 1, {SH(66000, 1)}, NULL, 0},
    {"batch_norm", 1, {SH(4, 6)}, NULL, 0},
    {"batch_norm", 1, {SH(2, 3, 5, 5)}, NULL, 0},
    {"batch_norm", 1, {SH(2, 4, 7)}, "affine=false", 0},
    {"batch_norm", 1, {SH(4, 256, 2, 2)}, NULL, 0},
    {"batch_norm", 1, {SH(64, 3, 1, 1)}, NULL, 0},
    {"batch_norm", 1, {SH(2, 8, 1, 1)}, NULL, 0},
    {"batch_norm", 1, {SH(64, 16)}, NULL, 0},
    {"batch_norm", 1, {SH(2048, 64)}, NULL, 0},
    {"batch_norm", 1, {SH(20000, 4)}, NULL, 0},
    {"batch_norm", 1, {SH(3000, 1, 5, 5)}, NULL, 0},
    {"batch_norm", 1, {SH(4, 128, 16, 16)}, NULL, 0},
    {"rms_norm", 1, {SH(4, 8)}, NULL, 0},
    {"rms_norm", 1, {SH(2, 3, 5)}, "affine=false", 0},
    {"rms_norm", 1, {SH(8, 1000)}, NULL, 0},
    {"group_norm", 1, {SH(2, 6, 5)}, "num_groups=3", 0},
    {"group_norm", 1, {SH(2, 4, 3, 3)}, "num_groups=2, affine=false", 0},
    {"group_norm", 1, {SH(256, 64)}, "num_groups=4", 0},
    {"group_norm", 1, {SH(64, 32, 4, 4)}, "num_groups=8", 0},
    /* embedding: int64 indices */
    {"embedding", 1, {SH(4, 5)}, "num=10, dim=6", 10},
    {"embedding", 1, {SH(7)}, "num=3, dim=4", 3},
    /* an output under 16 bytes: the index check's two int64s set the peak */
    {"embedding", 1, {SH(1)}, "num=3, dim=1", 3},
    /* attention: self, cross (key = value), and query/key/value */
    {"multi_head_attention", 1, {SH(2, 5, 8)}, "num_heads=2", 0},
    {"multi_head_attention", 1, {SH(2, 5, 8)}, "num_heads=2, dropout=0.25", 0},
    {"multi_head_attention", 2, {SH(2, 4, 8), SH(2, 6, 8)}, "num_heads=4, causal=true, dropout=0.5",
     0},
    {"multi_head_attention", 1, {SH(1, 3, 6)}, "num_heads=3, causal=true, bias=false", 0},
    {"multi_head_attention", 2, {SH(2, 5, 8), SH(2, 7, 8)}, "num_heads=2", 0},
    {"multi_head_attention", 2, {SH(1, 4, 6), SH(1, 2, 6)}, "num_heads=1, bias=false", 0},
    {"multi_head_attention", 3, {SH(2, 5, 8), SH(2, 7, 8), SH(2, 7, 8)}, "num_heads=4", 0},
    {"multi_head_attention", 3, {SH(1, 3, 6), SH(1, 3, 6), SH(1, 3, 6)},
     "num_heads=2, causal=true", 0},
    {"multi_head_attention", 1, {SH(4, 33, 48)}, "num_heads=3, causal=true", 0},
    {"multi_head_attention", 2, {SH(3, 17, 40), SH(3, 29, 40)}, "num_heads=5", 0},
    {"multi_head_attention", 3, {SH(2, 9, 24), SH(2, 31, 24), SH(2, 31, 24)}, "num_heads=4", 0},
    {"multi_head_attention", 2, {SH(4, 1, 16), SH(4, 9, 16)}, "num_heads=2", 0},
    {"multi_head_attention", 1, {SH(8, 128, 128)}, "num_heads=2", 0},
    /* recurrent cells: the state alone, or state and x */
    {"gru_cell", 1, {SH(4, 6)}, "hidden=6", 0},
    {"gru_cell", 1, {SH(2, 5)}, "hidden=5, bias=false", 0},
    {"gru_cell", 2, {SH(4, 6), SH(4, 3)}, "hidden=6", 0},
    {"gru_cell", 2, {SH(1, 5), SH(1, 7)}, "hidden=5, bias=false", 0},
    {"gru_cell", 1, {SH(64, 128)}, "hidden=128", 0},
    {"gru_cell", 2, {SH(32, 96), SH(32, 200)}, "hidden=96", 0},
    {"gru_cell", 2, {SH(7, 33), SH(7, 5)}, "hidden=33, bias=false", 0},
    {"lstm_cell", 1, {SH(4, 12)}, "hidden=6", 0},
    {"lstm_cell", 1, {SH(2, 10)}, "hidden=5, bias=false", 0},
    {"lstm_cell", 2, {SH(3, 10), SH(3, 4)}, "hidden=5", 0},
    {"lstm_cell", 2, {SH(1, 8), SH(1, 9)}, "hidden=4, bias=false", 0},
    {"lstm_cell", 1, {SH(64, 256)}, "hidden=128", 0},
    {"lstm_cell", 2, {SH(16, 60), SH(16, 50)}, "hidden=30", 0},
    /* shape */
    {"flatten", 1, {SH(2, 3, 4)}, NULL, 0},
    {"flatten", 1, {SH(2, 3, 4, 5)}, "start_dim=1, end_dim=2", 0},
    {"reshape", 1, {SH(4, 6)}, "shape=\"-1,3\"", 0},
    {"reshape", 1, {SH(2, 3, 8)}, "shape=\"0,0,2,-1\"", 0},
    {"matmul", 2, {SH(4, 6), SH(6, 3)}, NULL, 0},
    {"matmul", 2, {SH(2, 3, 4, 5), SH(2, 3, 5, 6)}, NULL, 0},
    {"matmul", 2, {SH(2, 3, 4, 5), SH(5, 2)}, NULL, 0},
    {"matmul", 2, {SH(3, 4, 5), SH(2, 1, 5, 6)}, NULL, 0},
    {"masked_fill", 2, {SH(2, 3, 4, 4), SH(4, 4)}, "value=-10000", 0}, /* -inf: no finite error */
    {"masked_fill", 2, {SH(3, 5), SH(3, 5)}, "value=0.5", 0},
    {"causal_mask", 1, {SH(2, 4, 5)}, NULL, 0},
    {"narrow", 1, {SH(2, 3, 12)}, "dim=2, start=4, length=4", 0},
    {"narrow", 1, {SH(5, 4)}, "dim=0, start=-3, length=2", 0},
    {"positions", 1, {SH(2, 7, 3)}, NULL, 0},
    {"scaled_dot_product_attention", 3, {SH(3, 5, 8), SH(3, 7, 8), SH(3, 7, 6)}, NULL, 0},
    {"scaled_dot_product_attention", 3, {SH(1, 2, 5, 4), SH(1, 2, 5, 4), SH(1, 2, 5, 4)},
     "causal=true", 0},
    {"scaled_dot_product_attention", 3, {SH(2, 4, 6, 8), SH(2, 4, 6, 8), SH(2, 4, 6, 8)},
     "causal=true", 0},
    /* an additive float mask; dropout (the same seed on both sides draws the same mask) */
    {"scaled_dot_product_attention", 4, {SH(2, 5, 8), SH(2, 7, 8), SH(2, 7, 6), SH(5, 7)}, NULL,
     0},
    {"scaled_dot_product_attention", 3, {SH(2, 2, 5, 4), SH(2, 2, 5, 4), SH(2, 2, 5, 4)},
     "causal=true, dropout=0.25", 0},
    {"scaled_dot_product_attention", 4, {SH(3, 5, 8), SH(3, 5, 8), SH(3, 5, 8), SH(3, 5, 5)},
     "dropout=0.5", 0},
    {"reshape", 1, {SH(2, 3, 4)}, "shape=\"6,4\"", 0},
    {"permute", 1, {SH(2, 3, 4)}, "dims=\"2,0,1\"", 0},
    {"permute", 1, {SH(4, 5)}, "dims=\"1,0\"", 0},
    {"transpose", 1, {SH(2, 3, 4)}, "dim0=0, dim1=2", 0},
    {"transpose", 1, {SH(4, 5)}, "dim0=0, dim1=1", 0},
    {"unsqueeze", 1, {SH(2, 3)}, "dim=0", 0},
    {"unsqueeze", 1, {SH(2, 3, 4)}, "dim=-1", 0},
    {"squeeze", 1, {SH(2, 1, 3)}, "dim=1", 0},
    {"squeeze", 1, {SH(1, 4, 1)}, NULL, 0},
    /* math */
    {"scale", 1, {SH(4, 8)}, "factor=2.5", 0},
    {"scale", 1, {SH(2, 3, 5)}, "factor=-1", 0},
    {"mean", 1, {SH(4, 8)}, "dim=1", 0},
    {"mean", 1, {SH(2, 3, 5)}, "dims=\"0,2\", keepdim=true", 0},
    {"mean", 1, {SH(2, 3, 5)}, NULL, 0},
    {"sum", 1, {SH(4, 8)}, "dim=0", 0},
    {"sum", 1, {SH(2, 3, 5)}, "dims=\"1,2\"", 0},
    {"sum", 1, {SH(2, 3, 5)}, "keepdim=true", 0},
    /* rotary positions on [B, H, T, D] and [B, T, H, D], both layouts;
     * grouped-query heads */
    {"rotary_embedding", 1, {SH(2, 3, 5, 8)}, NULL, 0},
    {"rotary_embedding", 1, {SH(2, 5, 3, 8)}, "seq_dim=1, interleaved=true", 0},
    {"rotary_embedding", 1, {SH(7, 4)}, "theta=500000", 0},
    {"repeat_kv", 1, {SH(2, 2, 5, 4)}, "repeats=3", 0},
    {"repeat_kv", 1, {SH(2, 4, 3)}, "repeats=2, dim=0", 0},
    {"repeat_kv", 1, {SH(2, 4, 5, 3)}, "repeats=1", 0},
    /* elementwise math (log, sqrt, rsqrt, pow and div's divisor drawn in
     * [0.5, 2): ebb_test_positive_input) */
    {"neg", 1, {SH(4, 8)}, NULL, 0},
    {"neg", 1, {SH(2, 3, 5)}, NULL, 0},
    {"exp", 1, {SH(4, 8)}, NULL, 0},
    {"exp", 1, {SH(2, 3, 5)}, NULL, 0},
    {"log", 1, {SH(4, 8)}, NULL, 0},
    {"log", 1, {SH(2, 3, 5)}, NULL, 0},
    {"sqrt", 1, {SH(4, 8)}, NULL, 0},
    {"sqrt", 1, {SH(2, 3, 5)}, NULL, 0},
    {"rsqrt", 1, {SH(4, 8)}, NULL, 0},
    {"rsqrt", 1, {SH(2, 3, 5)}, NULL, 0},
    {"abs", 1, {SH(4, 8)}, NULL, 0},
    {"abs", 1, {SH(2, 3, 5)}, NULL, 0},
    {"sin", 1, {SH(4, 8)}, NULL, 0},
    {"sin", 1, {SH(2, 3, 5)}, NULL, 0},
    {"cos", 1, {SH(4, 8)}, NULL, 0},
    {"cos", 1, {SH(2, 3, 5)}, NULL, 0},
    {"pow", 1, {SH(4, 8)}, "exponent=2", 0},
    {"pow", 1, {SH(2, 3, 5)}, "exponent=-0.5", 0},
    {"pow", 1, {SH(4, 8)}, "exponent=0", 0},
    {"pow", 1, {SH(3, 5)}, "exponent=1", 0},
    {"clamp", 1, {SH(4, 8)}, "min=-0.5, max=0.5", 0},
    {"clamp", 1, {SH(2, 3, 5)}, "min=0", 0},
    {"clamp", 1, {SH(3, 5)}, "max=0.25", 0},
    {"where", 3, {SH(4, 8), SH(4, 8), SH(4, 8)}, NULL, 0},
    {"where", 3, {SH(2, 3, 5), SH(2, 3, 5), SH(2, 3, 5)}, NULL, 0},
    {"where", 3, {SH(8), SH(4, 1), SH(4, 8)}, NULL, 0},
    {"where", 3, {SH(4, 5), SH(3, 4, 5), SH(1, 5)}, NULL, 0},
    {"sub", 2, {SH(4, 8)}, NULL, 0},
    {"sub", 2, {SH(2, 3, 5)}, NULL, 0},
    {"sub", 2, {SH(4, 1), SH(8)}, NULL, 0},
    {"sub", 2, {SH(8), SH(4, 8)}, NULL, 0},
    {"div", 2, {SH(4, 8)}, NULL, 0},
    {"div", 2, {SH(2, 3, 5)}, NULL, 0},
    {"div", 2, {SH(4, 1), SH(8)}, NULL, 0},
    {"div", 2, {SH(4, 8), SH(8)}, NULL, 0},
    /* combining: equal shapes, and shapes that broadcast (the output can be
     * larger than the first two inputs) */
    {"add", 0, {SH(4, 8)}, NULL, 0},
    {"add", 0, {SH(2, 3, 5)}, NULL, 0},
    {"add", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0},
    {"mul", 0, {SH(4, 8)}, NULL, 0},
    {"mul", 0, {SH(2, 3, 5)}, NULL, 0},
    {"mul", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0},
    {"average", 0, {SH(4, 8)}, NULL, 0},
    {"average", 0, {SH(2, 3, 5)}, NULL, 0},
    {"average", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0},
    {"average", 0, {SH(512), SH(1, 512), SH(200, 1), SH(200, 512)}, NULL, 0},
    {"maximum", 0, {SH(4, 8)}, NULL, 0},
    {"maximum", 0, {SH(2, 3, 5)}, NULL, 0},
    {"maximum", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0},
    {"maximum", 0, {SH(512), SH(1, 512), SH(200, 1), SH(200, 512)}, NULL, 0},
    {"cat", 0, {SH(4, 8)}, NULL, 0},
    {"cat", 0, {SH(2, 3, 5), SH(2, 1, 5), SH(2, 4, 5), SH(2, 2, 5)}, NULL, 0},
    {"cat", 0, {SH(2, 3)}, "dim=0", 0},
    {"stack", 0, {SH(4, 8)}, NULL, 0},
    {"stack", 0, {SH(2, 3, 5)}, "dim=0", 0},
    /* routing */
    {"threshold_halt", 1, {SH(4, 8)}, NULL, 0},
    {"threshold_halt", 1, {SH(2, 3, 5)}, "threshold=0.1", 0},
    {"threshold_halt", 1, {SH(1000, 100)}, NULL, 0},
    {"threshold_halt", 1, {SH(256, 512)}, NULL, 0},
    {"_gate_mix", 2, {SH(4, 3), SH(4, 8)}, "index=1", 0},
    {"_gate_mix", 2, {SH(2, 2), SH(2, 3, 5)}, "index=0", 0},
    {"_gate_mix", 3, {SH(4, 8), SH(4, 3), SH(4, 8)}, "index=2", 0},
    {"_gate_mix", 3, {SH(2, 3, 5), SH(2, 2), SH(2, 3, 5)}, "index=1", 0},
    {"_gate_mix", 2, {SH(512, 16), SH(512, 200)}, "index=3", 0},
    {"_gate_mix", 2, {SH(512, 4), SH(512)}, "index=0", 0},
    /* training-specific */
    {"dropout", 1, {SH(6, 7)}, "p=0.0", 0},
    {"dropout", 1, {SH(3, 4)}, "p=1.0", 0},
    {"maximum", 2, {SH(3, 4), SH(4)}, NULL, 0},
    /* losses: in[1] is the target */
    {"cross_entropy", 2, {SH(4, 10), SH(4)}, NULL, 0},
    {"cross_entropy", 2, {SH(6, 5), SH(6)}, "label_smoothing=0.2", 0},
    {"cross_entropy", 2, {SH(7), {0, {0}}}, "label_smoothing=0.1", 0},
    {"cross_entropy", 2, {SH(8, 3), SH(8)}, "label_smoothing=0.3, ignore_index=1", 0},
    {"cross_entropy", 2, {SH(1000, 100), SH(1000)}, "label_smoothing=0.2", 0},
    {"cross_entropy", 2, {SH(3000, 1), SH(3000)}, NULL, 0},
    {"nll", 2, {SH(4, 10), SH(4)}, NULL, 0},
    {"nll", 2, {SH(6), {0, {0}}}, NULL, 0},
    {"nll", 2, {SH(8, 3), SH(8)}, "ignore_index=0", 0},
    /* per token, classes last: a language model's [B, T, V] against [B, T] */
    {"cross_entropy", 2, {SH(2, 3, 5), SH(2, 3)}, NULL, 0},
    {"cross_entropy", 2, {SH(2, 4, 7), SH(2, 4)}, "label_smoothing=0.1, ignore_index=2", 0},
    {"nll", 2, {SH(3, 2, 6), SH(3, 2)}, NULL, 0},
    {"nll", 2, {SH(1000, 100), SH(1000)}, NULL, 0},
    {"nll", 2, {SH(3000, 1), SH(3000)}, NULL, 0},
    {"mse", 2, {SH(4, 8), SH(4, 8)}, NULL, 0},
    {"mse", 2, {SH(2, 3, 5), SH(2, 3, 5)}, NULL, 0},
    {"bce_with_logits", 2, {SH(4, 8), SH(4, 8)}, NULL, 0},
    {"bce_with_logits", 2, {SH(2, 3, 5), SH(2, 3, 5)}, NULL, 0},
};

/* Worst relative deviation seen per op family (by registry order), printed
 * at the end so reports can quote it. */
static double worst_dev, worst_dev32;
static char worst_op[64];
/* the tolerance of the run in progress: TOL in float64, TOL32 in float32 */
static double tol = TOL;

/* ---- coverage -------------------------------------------------------------------- */

static int max_count(const ebb_op *op) {
    if (op->max_inputs < 0 || op->max_inputs > MAX_IN)
        return op->min_inputs > MAX_IN ? op->min_inputs : MAX_IN;
    return op->max_inputs;
}

static int case_fits(const grad_case *c, const ebb_op *op, int n_in) {
    return strcmp(c->op, op->name) == 0 && (c->n_in == n_in || c->n_in == 0);
}

/* What the op lacks (a rule, rows for some input count) into msg; returns
 * the number of gaps. */
static int missing(const ebb_op *op, char *msg, size_t size) {
    int gaps = 0;
    msg[0] = '\0';
    if (op->state_inputs)
        return 0; /* it updates state a run holds (a key/value cache): inference only */
    if (!op->grad || !op->grad->backward) {
        snprintf(msg, size, "op '%s' has no backward rule (.grad in its descriptor)", op->name);
        gaps++;
    }
    for (int n = op->min_inputs; n <= max_count(op); n++) {
        int rows = 0;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            rows += case_fits(&cases[i], op, n);
        if (rows)
            continue;
        size_t len = strlen(msg);
        snprintf(msg + len, size - len,
                 "%sop '%s' has no gradient case for %d input(s): add a row to cases[] in "
                 "tests/test_op_grad.c",
                 gaps ? "; " : "", op->name, n);
        gaps++;
    }
    return gaps;
}

static void test_every_op_has_rule_and_cases(void **state) {
    (void)state;
    assert_true(ebb_op_count() > 0);
    int gaps = 0;
    char msg[1024];
    for (int i = 0; i < ebb_op_count(); i++)
        if (missing(ebb_op_at(i), msg, sizeof msg)) {
            print_error("%s\n", msg);
            gaps++;
        }
    if (gaps)
        fail_msg("%d registered op(s) lack a backward rule or gradient cases (listed above)", gaps);
}

static ebb_status newcomer_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_ref(out, c->in[0]);
}

/* The check itself must name an op it has never seen, with or without a rule. */
static void test_coverage_check_names_newcomers(void **state) {
    (void)state;
    char msg[1024];
    const ebb_op bare = {.name = "grad_newcomer", .min_inputs = 1, .max_inputs = 1,
                         .forward = newcomer_fwd};
    assert_int_equal(missing(&bare, msg, sizeof msg), 2);
    assert_non_null(strstr(msg, "op 'grad_newcomer' has no backward rule"));
    assert_non_null(strstr(msg, "no gradient case for 1 input(s)"));
    assert_int_equal(missing(ebb_op_find("relu"), msg, sizeof msg), 0);
}

/* ---- attributes -------------------------------------------------------------------- */

/* Resolves "k=v, k2=\"s\"" against the op's schema, defaults filled in, as
 * the builder would. Strings point into `buf`. */
static void resolve_attrs(const ebb_op *op, const char *text, ebb_attr_value *v, char *buf,
                          size_t size) {
    for (int i = 0; i < op->n_attrs; i++) {
        const ebb_attr_spec *s = &op->attrs[i];
        v[i] = (ebb_attr_value){.type = s->type};
        if (s->required || s->optional)
            continue;
        v[i].set = s->type != EBB_ATTR_STRING || s->default_string;
        v[i].i = (int64_t)s->default_number;
        v[i].f = s->default_number;
        v[i].s = s->default_string;
    }
    if (!text)
        return;
    snprintf(buf, size, "%s", text);
    char *p = buf;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        char *key = p, *eq = strchr(p, '=');
        assert_non_null(eq);
        *eq = '\0';
        char *val = eq + 1, *end;
        if (*val == '"') {
            val++;
            end = strchr(val, '"');
            assert_non_null(end);
            *end++ = '\0';
        } else {
            end = val + strcspn(val, ",");
            if (*end)
                *end++ = '\0';
        }
        int idx = ebb_op_attr_index(op, key);
        if (idx < 0)
            fail_msg("op '%s' has no attribute '%s'", op->name, key);
        ebb_attr_value *a = &v[idx];
        a->set = 1;
        switch (a->type) {
        case EBB_ATTR_BOOL: a->i = strcmp(val, "true") == 0 || strcmp(val, "1") == 0; break;
        case EBB_ATTR_INT: a->i = strtoll(val, NULL, 10); break;
        case EBB_ATTR_FLOAT: a->f = strtod(val, NULL); break;
        case EBB_ATTR_STRING: a->s = val; break;
        }
        p = end;
    }
}

/* ---- comparison ---------------------------------------------------------------------- */

static double max_abs(const ebb_tensor *t) {
    if (ebb_tensor_numel(t) == 0)
        return 0.0;
    ebb_tensor *a = NULL, *m = NULL;
    double v = 0.0;
    if (ebb_tensor_dtype(t) == EBB_BOOL) /* causal_mask's output */
        assert_ok(ebb_tensor_cast(&a, t, EBB_FLOAT64));
    else
        assert_ok(ebb_tensor_unary(&a, EBB_ABS, t));
    assert_ok(ebb_tensor_reduce(&m, EBB_REDUCE_MAX, a, NULL, 0, false));
    assert_ok(ebb_tensor_item(m, &v));
    ebb_tensor_free(a);
    ebb_tensor_free(m);
    return v;
}

/* max|got - want| / max(max|want|, FLOOR), failing on a shape mismatch. */
static double rel_dev(const char *what, const ebb_tensor *got, const ebb_tensor *want) {
    ebb_shape a = ebb_tensor_shape(got), b = ebb_tensor_shape(want);
    if (!ebb_shape_equal(&a, &b)) {
        char x[96], y[96];
        fail_msg("%s: rule gives %s, autograd %s", what, ebb_shape_str(&a, x, sizeof x),
                 ebb_shape_str(&b, y, sizeof y));
    }
    if (ebb_tensor_numel(want) == 0)
        return 0.0;
    double diff = 0.0, scale = max_abs(want);
    assert_ok(ebb_tensor_max_abs_diff(got, want, &diff));
    return diff / (scale > FLOOR ? scale : FLOOR);
}

static void expect_close(const char *op, const char *what, const ebb_tensor *got,
                         const ebb_tensor *want) {
    char label[160];
    snprintf(label, sizeof label, "%s: %s", op, what);
    double d = rel_dev(label, got, want);
    if (tol != TOL) {
        worst_dev32 = d > worst_dev32 ? d : worst_dev32;
    } else if (d > worst_dev) {
        worst_dev = d;
        snprintf(worst_op, sizeof worst_op, "%s", op);
    }
    if (!(d <= tol))
        fail_msg("%s: relative deviation %.3g from autograd exceeds %.0e", label, d, tol);
}

/* ---- one case ---------------------------------------------------------------------------- */

typedef struct side {
    ebb_tensor *in[MAX_IN], *params[EBB_MAX_PARAMS], *out, *saved[EBB_MAX_SAVED];
    ebb_tensor *gin[MAX_IN], *gp[EBB_MAX_PARAMS];
} side;

static void side_free(side *s) {
    for (int i = 0; i < MAX_IN; i++) {
        ebb_tensor_free(s->in[i]);
        ebb_tensor_free(s->gin[i]);
    }
    for (int i = 0; i < EBB_MAX_PARAMS; i++) {
        ebb_tensor_free(s->params[i]);
        ebb_tensor_free(s->gp[i]);
    }
    for (int i = 0; i < EBB_MAX_SAVED; i++)
        ebb_tensor_free(s->saved[i]);
    ebb_tensor_free(s->out);
    memset(s, 0, sizeof *s);
}

static int is_buffer(const ebb_param_spec *p) { return p->buffer; }

/* The forward as training runs it. */
static void run_forward(const ebb_op *op, const ebb_attr_value *attrs, side *s, int n_in,
                        int n_params, uint64_t seed) {
    ebb_op_call call = {.op = op, .attrs = attrs, .in = s->in, .n_in = n_in,
                        .params = s->params, .n_params = n_params, .node = op->name,
                        .seed = seed};
    if (op->grad->forward_train)
        assert_ok(op->grad->forward_train(&call, &s->out, s->saved));
    else
        assert_ok(op->forward(&call, &s->out));
}

/* ---- backward scratch ------------------------------------------------------------------ */

/* A training plan predicts a backward step's peak as the bytes live before
 * it, plus the new gradients it returns, plus the rule's workspace: it takes
 * every returned gradient to be alive beside the scratch at the call's
 * highest moment. So the scratch measured here is the call's peak above
 * what was live before it, less those gradients, and the prediction must
 * never fall below it. A gradient that is a view of grad_out or of an input
 * (identity, reshape, cat's slices) adds no bytes and is not counted; one
 * that shares an earlier gradient's storage (average's for inputs of the
 * output's shape, lstm_cell's two bias gradients) is counted once. */
static int bytes_failures;

/* Element bytes of the returned gradients whose storage the call made. */
static int64_t new_gradient_bytes(const ebb_op_grad_call *c, const side *r, int n_params) {
    const ebb_tensor *grads[MAX_IN + EBB_MAX_PARAMS];
    int n = 0;
    for (int i = 0; i < c->n_in; i++)
        if (r->gin[i])
            grads[n++] = r->gin[i];
    for (int j = 0; j < n_params; j++)
        if (r->gp[j])
            grads[n++] = r->gp[j];
    int64_t bytes = 0;
    for (int k = 0; k < n; k++) {
        int old = ebb_tensor_same_storage(grads[k], c->grad_out);
        for (int i = 0; i < c->n_in; i++)
            old |= ebb_tensor_same_storage(grads[k], r->in[i]);
        for (int m = 0; m < k; m++)
            old |= ebb_tensor_same_storage(grads[k], grads[m]);
        if (!old)
            bytes += (int64_t)ebb_tensor_nbytes(grads[k]);
    }
    return bytes;
}

/* "conv2d, 1 input(s) [2, 3, 8, 8], float32, attrs '...'" */
static void describe_case(char *buf, size_t size, const ebb_op *op, const grad_case *gc,
                          const ebb_shape *shapes, int n_in, ebb_dtype dt) {
    int len = snprintf(buf, size, "%s, %d input(s)", op->name, n_in);
    for (int i = 0; i < n_in && len > 0 && (size_t)len < size; i++) {
        char sh[96];
        len += snprintf(buf + len, size - (size_t)len, " %s",
                        ebb_shape_str(&shapes[i], sh, sizeof sh));
    }
    if (len > 0 && (size_t)len < size)
        snprintf(buf + len, size - (size_t)len, ", %s, attrs '%s'", ebb_dtype_name(dt),
                 gc->attrs ? gc->attrs : "");
}

/* Compares what one backward call took (peak and kept: bytes above the
 * baseline at its highest and after it) with what its rule declares; exact
 * with one intra-op thread unless the rule's figure is a bound, as in
 * test_op_conformance. Failures are listed and counted, not fatal, so one
 * run names every case that is off. */
static void check_backward_bytes(const ebb_op *op, const grad_case *gc, ebb_dtype dt,
                                 const ebb_op_grad_call *c, const side *r, int n_params,
                                 int64_t peak, int64_t kept) {
    const ebb_op_grad *g = op->grad;
    char what[512];
    describe_case(what, sizeof what, op, gc, c->in_shapes, c->n_in, dt);
    int64_t returned = new_gradient_bytes(c, r, n_params);
    int64_t measured = peak - returned;
    int64_t declared =
        g->workspace ? g->workspace(c->attrs, c->in_shapes, c->n_in, ebb_tensor_dtype(r->in[0]))
                     : 0;
    int exact = !g->workspace_is_bound && ebb_tensor_num_threads() == 1;
    if (kept != returned) {
        print_error("[%s] backward keeps %lld B after the call; its new gradients are %lld B\n",
                    what, (long long)kept, (long long)returned);
        bytes_failures++;
    }
    if (exact ? measured != declared : measured > declared) {
        print_error("[%s] backward scratch measured %lld B (peak %lld B above the baseline, "
                    "less %lld B of new gradients), the rule declares %lld B%s\n",
                    what, (long long)measured, (long long)peak, (long long)returned,
                    (long long)declared, exact ? "" : " as an upper bound");
        bytes_failures++;
    }
}

/* A training plan counts a step that runs forward_train as its output and
 * extras (plan values) plus train_workspace; one without forward_train as
 * its forward, which test_op_conformance checks. */
static void check_train_forward_bytes(const ebb_op *op, const grad_case *gc, ebb_dtype dt,
                                      const ebb_attr_value *attrs, const side *r, int n_in,
                                      int64_t peak) {
    const ebb_op_grad *g = op->grad;
    if (!g->forward_train)
        return;
    ebb_shape shapes[MAX_IN];
    for (int i = 0; i < n_in; i++)
        shapes[i] = ebb_tensor_shape(r->in[i]);
    int64_t made = 0;
    const ebb_tensor *results[1 + EBB_MAX_SAVED] = {r->out};
    for (int k = 0; k < EBB_MAX_SAVED; k++)
        results[1 + k] = r->saved[k];
    for (int k = 0; k < 1 + EBB_MAX_SAVED; k++) {
        int old = !results[k];
        for (int i = 0; i < n_in && !old; i++)
            old = ebb_tensor_same_storage(results[k], r->in[i]);
        for (int m = 0; m < k && !old; m++)
            old = results[m] && ebb_tensor_same_storage(results[k], results[m]);
        if (!old)
            made += (int64_t)ebb_tensor_nbytes(results[k]);
    }
    int64_t declared = g->train_workspace ? g->train_workspace(attrs, shapes, n_in, dt) : 0;
    /* an op whose forward figure is a bound (op->workspace_is_bound) bounds
     * its training forward too */
    int exact = ebb_tensor_num_threads() == 1 && !op->workspace_is_bound;
    if (exact ? peak - made != declared : peak - made > declared) {
        char what[512];
        describe_case(what, sizeof what, op, gc, shapes, n_in, dt);
        print_error("[%s] training forward scratch measured %lld B (peak %lld B less %lld B "
                    "of output and extras), train_workspace declares %lld B%s\n",
                    what, (long long)(peak - made), (long long)peak, (long long)made,
                    (long long)declared, exact ? "" : " as an upper bound");
        bytes_failures++;
    }
}

/* One case's values on the CPU: inputs (shapes[] as the row gives them),
 * parameters and their specs, drawn from `seed`. */
typedef struct case_values {
    ebb_attr_value attrs[EBB_MAX_ATTRS];
    char buf[256];
    ebb_shape shapes[MAX_IN];
    ebb_tensor *in[MAX_IN];
    ebb_param_spec specs[EBB_MAX_PARAMS];
    ebb_tensor *params[EBB_MAX_PARAMS];
    int n_params;
} case_values;

static void case_values_make(case_values *v, const ebb_op *op, const grad_case *gc, int n_in,
                             uint64_t seed, ebb_dtype dt) {
    const ebb_device cpu = ebb_device_cpu();
    memset(v, 0, sizeof *v);
    resolve_attrs(op, gc->attrs, v->attrs, v->buf, sizeof v->buf);
    for (int i = 0; i < n_in; i++) {
        int64_t classes = target_classes(gc);
        v->shapes[i] = gc->in[i].ndim || i == 0 || classes ? gc->in[i] : gc->in[0];
        if (i == 1 && classes) {
            assert_ok(ebb_tensor_uniform(&v->in[1], &v->shapes[1], 0.0,
                                         classes > 0 ? (double)classes : 1.0,
                                         classes > 0 ? EBB_FLOAT64 : dt, cpu, seed + 2));
            ebb_tensor *u = v->in[1];
            if (classes > 0) {
                assert_ok(ebb_tensor_cast(&v->in[1], u, EBB_INT64));
                ebb_tensor_free(u);
            }
        } else if (bool_mask(gc, i)) {
            ebb_tensor *u = NULL;
            assert_ok(ebb_tensor_randn(&u, &v->shapes[i], dt, cpu, seed + 1 + i));
            assert_ok(ebb_tensor_compare(&v->in[i], EBB_GT, u, 0.0));
            ebb_tensor_free(u);
        } else if (i == 0 && gc->indices > 0) {
            ebb_tensor *u = NULL;
            assert_ok(ebb_tensor_uniform(&u, &v->shapes[0], 0.0, (double)gc->indices, dt, cpu,
                                         seed + 1));
            assert_ok(ebb_tensor_cast(&v->in[0], u, EBB_INT64));
            ebb_tensor_free(u);
        } else if (ebb_test_positive_input(gc->op, i)) {
            assert_ok(ebb_tensor_uniform(&v->in[i], &v->shapes[i], 0.5, 2.0, dt, cpu,
                                         seed + 1 + i));
        } else {
            assert_ok(ebb_tensor_randn(&v->in[i], &v->shapes[i], dt, cpu, seed + 1 + i));
        }
    }
    if (op->params)
        assert_ok(op->params(v->attrs, v->shapes, n_in, v->specs, &v->n_params));
    for (int j = 0; j < v->n_params; j++) {
        const ebb_param_spec *ps = &v->specs[j];
        if (ps->counter)
            assert_ok(ebb_tensor_zeros(&v->params[j], &ps->shape, EBB_INT64, cpu));
        else if (strcmp(ps->name, "running_var") == 0)
            assert_ok(ebb_tensor_uniform(&v->params[j], &ps->shape, 0.5, 1.5, dt, cpu,
                                         seed + 20 + j));
        else
            assert_ok(ebb_tensor_randn(&v->params[j], &ps->shape, dt, cpu, seed + 20 + j));
    }
}

static void case_values_free(case_values *v) {
    for (int i = 0; i < MAX_IN; i++)
        ebb_tensor_free(v->in[i]);
    for (int j = 0; j < EBB_MAX_PARAMS; j++)
        ebb_tensor_free(v->params[j]);
    memset(v, 0, sizeof *v);
}

static void run_case(const ebb_op *op, const grad_case *gc, int n_in, uint64_t seed,
                     ebb_dtype dt) {
    const ebb_device cpu = ebb_device_cpu();
    const ebb_op_grad *g = op->grad;
    case_values v;
    case_values_make(&v, op, gc, n_in, seed, dt);
    ebb_attr_value *attrs = v.attrs;
    ebb_tensor **base_in = v.in, **base_p = v.params;
    ebb_param_spec *specs = v.specs;
    int n_params = v.n_params;

    /* the rule */
    side r = {0};
    for (int i = 0; i < n_in; i++)
        assert_ok(ebb_tensor_clone(&r.in[i], base_in[i]));
    for (int j = 0; j < n_params; j++)
        assert_ok(ebb_tensor_clone(&r.params[j], base_p[j]));
    uint64_t drop_seed = seed * 7919 + 3;
    {
        int64_t fwd_base = ebb_memory_current(cpu);
        ebb_memory_reset_peak(cpu);
        run_forward(op, attrs, &r, n_in, n_params, drop_seed);
        ebb_memory_stats fs;
        assert_ok(ebb_memory_stats_get(cpu, &fs));
        check_train_forward_bytes(op, gc, dt, attrs, &r, n_in, fs.peak_bytes - fwd_base);
    }
    ebb_shape os = ebb_tensor_shape(r.out);
    ebb_tensor *grad_out = NULL;
    assert_ok(ebb_tensor_randn(&grad_out, &os, grad_dtype(r.out, dt), cpu, seed + 50));
    ebb_tensor *seen_in[MAX_IN] = {NULL};
    ebb_shape in_shapes[MAX_IN];
    ebb_dtype in_dtypes[MAX_IN];
    for (int i = 0; i < n_in; i++) {
        seen_in[i] = (g->saves_inputs >> i) & 1u ? r.in[i] : NULL;
        in_shapes[i] = ebb_tensor_shape(r.in[i]);
        in_dtypes[i] = ebb_tensor_dtype(r.in[i]);
    }
    int n_saved = 0;
    for (int k = 0; k < EBB_MAX_SAVED; k++)
        if (r.saved[k])
            n_saved = k + 1;
    assert_true(n_saved <= g->n_saved);
    ebb_op_grad_call gcall = {.op = op, .attrs = attrs, .in = seen_in, .n_in = n_in,
                              .params = r.params, .n_params = n_params,
                              .out = g->saves_output ? r.out : NULL, .saved = r.saved,
                              .n_saved = g->n_saved, .grad_out = grad_out, .node = op->name,
                              .in_shapes = in_shapes, .in_dtypes = in_dtypes};
    /* what the call allocates, against the same baseline as the plan */
    int64_t baseline = ebb_memory_current(cpu);
    ebb_memory_reset_peak(cpu);
    ebb_status st = g->backward(&gcall, r.gin, r.gp);
    ebb_memory_stats ms;
    assert_ok(ebb_memory_stats_get(cpu, &ms));
    if (st != EBB_OK)
        fail_msg("%s (%s, %d inputs, %s): backward -> %s: %s", op->name,
                 gc->attrs ? gc->attrs : "", n_in, ebb_dtype_name(dt), ebb_status_name(st),
                 ebb_errmsg());
    check_backward_bytes(op, gc, dt, &gcall, &r, n_params, ms.peak_bytes - baseline,
                         ms.current_bytes - baseline);

    /* the reference: autograd through the same forward */
    side a = {0};
    ebb_tensor_autograd_begin();
    for (int i = 0; i < n_in; i++) {
        assert_ok(ebb_tensor_clone(&a.in[i], base_in[i]));
        if (ebb_tensor_dtype(a.in[i]) == dt)
            assert_ok(ebb_tensor_requires_grad_(a.in[i]));
    }
    for (int j = 0; j < n_params; j++) {
        assert_ok(ebb_tensor_clone(&a.params[j], base_p[j]));
        if (!is_buffer(&specs[j]))
            assert_ok(ebb_tensor_requires_grad_(a.params[j]));
    }
    run_forward(op, attrs, &a, n_in, n_params, drop_seed);
    ebb_tensor *ref_in[MAX_IN] = {NULL}, *ref_p[EBB_MAX_PARAMS] = {NULL};
    int any = 0;
    for (int i = 0; i < n_in; i++)
        any |= ebb_tensor_dtype(a.in[i]) == dt;
    any |= n_params > 0;
    /* an output that depends on nothing trainable (dropout with p=1) has
     * zero gradients everywhere */
    if (any && ebb_tensor_backward(a.out, grad_out) != EBB_OK &&
        !strstr(ebb_errmsg(), "does not depend"))
        fail_msg("%s: autograd backward: %s", op->name, ebb_errmsg());
    ebb_error_clear();
    for (int i = 0; i < n_in; i++)
        if (ebb_tensor_dtype(a.in[i]) == dt)
            assert_ok(ebb_tensor_grad(&ref_in[i], a.in[i]));
    for (int j = 0; j < n_params; j++)
        if (!is_buffer(&specs[j]))
            assert_ok(ebb_tensor_grad(&ref_p[j], a.params[j]));
    ebb_tensor_autograd_end();

    /* compare */
    char what[64];
    expect_close(op->name, "forward output", r.out, a.out);
    for (int i = 0; i < n_in; i++) {
        snprintf(what, sizeof what, "gradient of input %d (attributes %s, %s)", i,
                 gc->attrs ? gc->attrs : "none", ebb_dtype_name(dt));
        if (!((g->differentiable >> i) & 1u)) {
            if (r.gin[i])
                fail_msg("%s: input %d is not differentiable but got a gradient", op->name, i);
            continue;
        }
        if (!r.gin[i])
            fail_msg("%s: no gradient for differentiable input %d", op->name, i);
        expect_close(op->name, what, r.gin[i], ref_in[i]);
    }
    for (int j = 0; j < n_params; j++) {
        snprintf(what, sizeof what, "gradient of parameter %s", specs[j].name);
        if (is_buffer(&specs[j])) {
            if (r.gp[j])
                fail_msg("%s: buffer %s got a gradient", op->name, specs[j].name);
            /* both runs updated their running statistics alike */
            snprintf(what, sizeof what, "updated %s", specs[j].name);
            expect_close(op->name, what, r.params[j], a.params[j]);
            continue;
        }
        if (!r.gp[j])
            fail_msg("%s: no gradient for parameter %s", op->name, specs[j].name);
        expect_close(op->name, what, r.gp[j], ref_p[j]);
    }

    /* where training does not change the forward, forward_train gives its bytes
     * (an op whose training forward draws, as attention's dropout, does) */
    if (g->forward_train && strcmp(op->name, "dropout") != 0 &&
        strcmp(op->name, "batch_norm") != 0 && !(g->draws && g->draws(attrs))) {
        ebb_tensor *plain = NULL;
        ebb_op_call call = {.op = op, .attrs = attrs, .in = r.in, .n_in = n_in,
                            .params = r.params, .n_params = n_params, .node = op->name};
        assert_ok(op->forward(&call, &plain));
        double d = -1.0;
        assert_ok(ebb_tensor_max_abs_diff(plain, r.out, &d));
        if (d != 0.0)
            fail_msg("%s: forward_train's output differs from forward's by %g", op->name, d);
        ebb_tensor_free(plain);
    }

    for (int i = 0; i < n_in; i++)
        ebb_tensor_free(ref_in[i]);
    for (int j = 0; j < n_params; j++)
        ebb_tensor_free(ref_p[j]);
    case_values_free(&v);
    ebb_tensor_free(grad_out);
    side_free(&r);
    side_free(&a);
}

static void test_every_rule_matches_autograd(void **state) {
    (void)state;
    int ran = 0;
    for (int i = 0; i < ebb_op_count(); i++) {
        const ebb_op *op = ebb_op_at(i);
        if (!op->grad || !op->grad->backward)
            continue; /* test_every_op_has_rule_and_cases names it */
        worst_dev = worst_dev32 = 0.0;
        worst_op[0] = '\0';
        for (int n = op->min_inputs; n <= max_count(op); n++)
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
                if (case_fits(&cases[k], op, n)) {
                    uint64_t seed = 1000 + k * 10 + (uint64_t)n;
                    tol = TOL;
                    run_case(op, &cases[k], n, seed, EBB_FLOAT64);
                    tol = TOL32;
                    run_case(op, &cases[k], n, seed, EBB_FLOAT32);
                    tol = TOL;
                    ran++;
                }
        print_message("%-22s max relative deviation %.2e (float32 %.2e)\n", op->name, worst_dev,
                      worst_dev32);
    }
    assert_true(ran > 0);
    if (bytes_failures)
        fail_msg("%d backward call(s) took other scratch than their rule declares (listed "
                 "above)", bytes_failures);
}

/* ---- on the test device ------------------------------------------------------------------ */

/* With EBB_TEST_DEVICE=cuda every case runs its rule a second time on the
 * GPU, from the same values copied there:
 *   - the training forward's and the backward's scratch, measured with the
 *     caching allocator's counts, must equal what the training plan counts
 *     for them on CUDA (the rule's workspace_cuda / train_workspace_cuda,
 *     else its CPU figure as one block): exactly, or at most it where the
 *     figure is a bound (the rule's, or cuDNN's and fused attention's choice
 *     of kernel, ebb_op.workspace_cuda_is_bound);
 *   - the call keeps nothing but its new gradients, each counted as the
 *     allocator's blocks;
 *   - its gradients equal the CPU rule's within 1e-4 relative (TF32 off),
 *     or, in float32, are at most ten times further from the float64
 *     result than the CPU's float32 ones: a gradient that cancels (a norm
 *     over two values) is rounding noise in both engines. A mask drawn on
 *     the device (dropout, attention's dropout) is not the CPU's, so only
 *     the bytes of such a case compare.
 * On the CPU this test has nothing to add and passes at once. */
#define TOL_DEVICE 1e-4
static int device_failures;

static int64_t device_blocks(const ebb_tensor *const *t, int n, const ebb_tensor *const *old,
                             int n_old) {
    int64_t bytes = 0;
    for (int k = 0; k < n; k++) {
        if (!t[k])
            continue;
        int seen = 0;
        for (int m = 0; m < n_old && !seen; m++)
            seen = old[m] && ebb_tensor_same_storage(t[k], old[m]);
        for (int m = 0; m < k && !seen; m++)
            seen = t[m] && ebb_tensor_same_storage(t[k], t[m]);
        if (!seen)
            bytes += ebb_cuda_block((int64_t)ebb_tensor_nbytes(t[k]));
    }
    return bytes;
}

static void device_bytes_check(const char *what, const char *stage, int64_t measured,
                               int64_t declared, int bound) {
    if (bound ? measured <= declared : measured == declared)
        return;
    print_error("[%s] %s scratch on the device measured %lld B, the plan counts %lld B%s\n",
                what, stage, (long long)measured, (long long)declared,
                bound ? " as an upper bound" : "");
    device_failures++;
}

/* max|got - ref| / max(max|ref|, FLOOR), with got cast to ref's dtype. */
static double err_against(const ebb_tensor *got, const ebb_tensor *ref) {
    ebb_tensor *g = NULL;
    assert_ok(ebb_tensor_cast(&g, got, ebb_tensor_dtype(ref)));
    double diff = 0.0, scale = max_abs(ref);
    assert_ok(ebb_tensor_max_abs_diff(g, ref, &diff));
    ebb_tensor_free(g);
    return diff / (scale > FLOOR ? scale : FLOOR);
}

/* The CPU rule on the case's values and grad_out cast to float64: what a
 * float32 row's gradients would be without rounding. */
static void reference_f64(const ebb_op *op, const case_values *v, int n_in, uint64_t drop_seed,
                          const ebb_tensor *grad_out, const ebb_shape *in_shapes, side *r) {
    const ebb_op_grad *g = op->grad;
    for (int i = 0; i < n_in; i++) {
        ebb_dtype t = ebb_tensor_dtype(v->in[i]);
        assert_ok(ebb_tensor_cast(&r->in[i], v->in[i], t == EBB_FLOAT32 ? EBB_FLOAT64 : t));
    }
    for (int j = 0; j < v->n_params; j++) {
        ebb_dtype t = ebb_tensor_dtype(v->params[j]);
        assert_ok(ebb_tensor_cast(&r->params[j], v->params[j], t == EBB_FLOAT32 ? EBB_FLOAT64 : t));
    }
    run_forward(op, v->attrs, r, n_in, v->n_params, drop_seed);
    ebb_tensor *go = NULL;
    assert_ok(ebb_tensor_cast(&go, grad_out, EBB_FLOAT64));
    ebb_tensor *seen[MAX_IN] = {NULL};
    ebb_dtype in_dtypes[MAX_IN];
    for (int i = 0; i < n_in; i++) {
        seen[i] = (g->saves_inputs >> i) & 1u ? r->in[i] : NULL;
        in_dtypes[i] = ebb_tensor_dtype(r->in[i]);
    }
    ebb_op_grad_call rc = {.op = op, .attrs = v->attrs, .in = seen, .n_in = n_in,
                           .params = r->params, .n_params = v->n_params,
                           .out = g->saves_output ? r->out : NULL, .saved = r->saved,
                           .n_saved = g->n_saved, .grad_out = go, .node = op->name,
                           .in_shapes = in_shapes, .in_dtypes = in_dtypes};
    assert_ok(g->backward(&rc, r->gin, r->gp));
    ebb_tensor_free(go);
}

static void run_case_on_device(const ebb_op *op, const grad_case *gc, int n_in, uint64_t seed,
                               ebb_dtype dt, ebb_device dev) {
    const ebb_device cpu = ebb_device_cpu();
    const ebb_op_grad *g = op->grad;
    case_values v;
    case_values_make(&v, op, gc, n_in, seed, dt);
    uint64_t drop_seed = seed * 7919 + 3;
    char what[512];
    describe_case(what, sizeof what, op, gc, v.shapes, n_in, dt);
    int bound = g->workspace_is_bound || g->workspace_cuda_is_bound || op->workspace_cuda_is_bound;

    /* the CPU rule, for the values */
    side c = {0}, d = {0};
    for (int i = 0; i < n_in; i++)
        assert_ok(ebb_tensor_clone(&c.in[i], v.in[i]));
    for (int j = 0; j < v.n_params; j++)
        assert_ok(ebb_tensor_clone(&c.params[j], v.params[j]));
    run_forward(op, v.attrs, &c, n_in, v.n_params, drop_seed);
    ebb_shape os = ebb_tensor_shape(c.out);
    ebb_tensor *grad_out = NULL, *grad_out_dev = NULL;
    assert_ok(ebb_tensor_randn(&grad_out, &os, grad_dtype(c.out, dt), cpu, seed + 50));
    ebb_shape in_shapes[MAX_IN];
    ebb_dtype in_dtypes[MAX_IN];
    ebb_tensor *seen_c[MAX_IN] = {NULL}, *seen_d[MAX_IN] = {NULL};
    for (int i = 0; i < n_in; i++) {
        in_shapes[i] = v.shapes[i];
        in_dtypes[i] = ebb_tensor_dtype(v.in[i]);
        seen_c[i] = (g->saves_inputs >> i) & 1u ? c.in[i] : NULL;
    }
    ebb_op_grad_call cc = {.op = op, .attrs = v.attrs, .in = seen_c, .n_in = n_in,
                           .params = c.params, .n_params = v.n_params,
                           .out = g->saves_output ? c.out : NULL, .saved = c.saved,
                           .n_saved = g->n_saved, .grad_out = grad_out, .node = op->name,
                           .in_shapes = in_shapes, .in_dtypes = in_dtypes};
    assert_ok(g->backward(&cc, c.gin, c.gp));

    /* the same on the device, measured */
    for (int i = 0; i < n_in; i++) {
        assert_ok(ebb_tensor_to(&d.in[i], v.in[i], dev, ebb_tensor_dtype(v.in[i])));
        seen_d[i] = (g->saves_inputs >> i) & 1u ? d.in[i] : NULL;
    }
    for (int j = 0; j < v.n_params; j++)
        assert_ok(ebb_tensor_to(&d.params[j], v.params[j], dev, ebb_tensor_dtype(v.params[j])));
    assert_ok(ebb_tensor_to(&grad_out_dev, grad_out, dev, ebb_tensor_dtype(grad_out)));
    int64_t base = ebb_memory_current(dev);
    ebb_memory_reset_peak(dev);
    run_forward(op, v.attrs, &d, n_in, v.n_params, drop_seed);
    ebb_memory_stats fs;
    assert_ok(ebb_memory_stats_get(dev, &fs));
    if (g->forward_train) {
        const ebb_tensor *made[1 + EBB_MAX_SAVED] = {d.out};
        for (int k = 0; k < EBB_MAX_SAVED; k++)
            made[1 + k] = d.saved[k];
        int64_t outs = device_blocks(made, 1 + EBB_MAX_SAVED, (const ebb_tensor *const *)d.in,
                                     n_in);
        int64_t declared =
            g->train_workspace_cuda
                ? g->train_workspace_cuda(v.attrs, in_shapes, n_in, dt)
                : ebb_cuda_block(g->train_workspace
                                     ? g->train_workspace(v.attrs, in_shapes, n_in, dt)
                                     : 0);
        device_bytes_check(what, "training forward", fs.peak_bytes - base - outs, declared,
                           bound);
    }
    ebb_op_grad_call dc = cc;
    dc.in = seen_d;
    dc.params = d.params;
    dc.out = g->saves_output ? d.out : NULL;
    dc.saved = d.saved;
    dc.grad_out = grad_out_dev;
    base = ebb_memory_current(dev);
    ebb_memory_reset_peak(dev);
    ebb_status st = g->backward(&dc, d.gin, d.gp);
    ebb_memory_stats bs;
    assert_ok(ebb_memory_stats_get(dev, &bs));
    if (st != EBB_OK)
        fail_msg("[%s] backward on the device -> %s: %s", what, ebb_status_name(st),
                 ebb_errmsg());
    const ebb_tensor *grads[MAX_IN + EBB_MAX_PARAMS], *old[MAX_IN + 1];
    int n_grads = 0, n_old = 0;
    for (int i = 0; i < n_in; i++)
        grads[n_grads++] = d.gin[i];
    for (int j = 0; j < v.n_params; j++)
        grads[n_grads++] = d.gp[j];
    for (int i = 0; i < n_in; i++)
        old[n_old++] = d.in[i];
    old[n_old++] = grad_out_dev;
    int64_t returned = device_blocks(grads, n_grads, old, n_old);
    int64_t declared = g->workspace_cuda
                           ? g->workspace_cuda(v.attrs, in_shapes, n_in, dt)
                           : ebb_cuda_block(g->workspace
                                                ? g->workspace(v.attrs, in_shapes, n_in, dt)
                                                : 0);
    device_bytes_check(what, "backward", bs.peak_bytes - base - returned, declared, bound);
    if (bs.current_bytes - base != returned) {
        print_error("[%s] backward on the device keeps %lld B after the call; its new "
                    "gradients are %lld B\n",
                    what, (long long)(bs.current_bytes - base), (long long)returned);
        device_failures++;
    }

    /* the values, against the CPU rule's; a mask drawn on the device
     * (dropout, attention's dropout) differs from the CPU's, so only the
     * bytes compare there */
    int draws = strcmp(op->name, "dropout") == 0 || (g->draws && g->draws(v.attrs));
    side r = {0};
    if (!draws && dt == EBB_FLOAT32)
        reference_f64(op, &v, n_in, drop_seed, grad_out, in_shapes, &r);
    for (int k = 0; !draws && k < n_in + v.n_params; k++) {
        ebb_tensor *got = k < n_in ? d.gin[k] : d.gp[k - n_in];
        ebb_tensor *want = k < n_in ? c.gin[k] : c.gp[k - n_in];
        if (!got != !want) {
            print_error("[%s] gradient %d: %s on the device, %s on the CPU\n", what, k,
                        got ? "given" : "none", want ? "given" : "none");
            device_failures++;
            continue;
        }
        if (!got)
            continue;
        ebb_tensor *host = NULL;
        assert_ok(ebb_tensor_to(&host, got, cpu, ebb_tensor_dtype(got)));
        double dev_rel = rel_dev(what, host, want);
        /* float32 where the gradient cancels (a norm over two values, a
         * softmax over one): both engines' rounding is measured against
         * float64, and the device may not be ten times further off */
        double dev_err = 0, cpu_err = 0;
        ebb_tensor *ref = k < n_in ? r.gin[k] : r.gp[k - n_in];
        if (!(dev_rel <= TOL_DEVICE) && ref) {
            dev_err = err_against(host, ref);
            cpu_err = err_against(want, ref);
        }
        ebb_tensor_free(host);
        if (!(dev_rel <= TOL_DEVICE) && !(ref && dev_err <= 10 * cpu_err)) {
            print_error("[%s] gradient %d differs from the CPU's by %.3g relative\n", what, k,
                        dev_rel);
            if (ref)
                print_error("[%s] gradient %d: against float64, the device is %.3g off, the "
                            "CPU's float32 %.3g\n",
                            what, k, dev_err, cpu_err);
            device_failures++;
        }
    }
    side_free(&r);
    ebb_tensor_free(grad_out);
    ebb_tensor_free(grad_out_dev);
    side_free(&c);
    side_free(&d);
    case_values_free(&v);
}

static void test_every_rule_on_device(void **state) {
    (void)state;
    ebb_device dev = ebb_test_device();
    if (dev.type == EBB_DEVICE_CPU)
        return;
    int64_t ignored = 0;
    assert_ok(ebb_device_prepare(dev, &ignored));
    int ran = 0;
    for (int i = 0; i < ebb_op_count(); i++) {
        const ebb_op *op = ebb_op_at(i);
        if (!op->grad || !op->grad->backward)
            continue;
        for (int n = op->min_inputs; n <= max_count(op); n++)
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
                if (case_fits(&cases[k], op, n)) {
                    uint64_t seed = 1000 + k * 10 + (uint64_t)n;
                    run_case_on_device(op, &cases[k], n, seed, EBB_FLOAT64, dev);
                    run_case_on_device(op, &cases[k], n, seed, EBB_FLOAT32, dev);
                    ran++;
                }
    }
    print_message("%d cases on the device, %d failure(s)\n", ran, device_failures);
    assert_true(ran > 0);
    if (device_failures)
        fail_msg("%d device check(s) failed (listed above)", device_failures);
}

/* ---- the dry run on meta tensors -------------------------------------------------------------- */

/* A training compile learns each gradient's shape, and whether it is a view
 * of grad_out, by running the training forward and then the rule on meta
 * tensors (shapes without storage). What fails there, per stage: */
enum { META_FORWARD = 1, META_BACKWARD = 2 };

/* The ops libtorch 1.13 cannot dry-run, and where: the ATen function named
 * has no Meta kernel (or, for batch_norm, the tensor layer's meta path for
 * the int64 counter's increment wraps a double). The compiler must learn
 * their shapes another way. The test fails when an op fails elsewhere, and
 * when a listed op starts to work, so that this list stays true. */
static const struct {
    const char *op;
    unsigned stages;
} not_on_meta[] = {
    /* training forward: native_dropout_backward (the mask); backward: the same */
    {"dropout", META_FORWARD | META_BACKWARD},
    /* native_layer_norm; native_layer_norm_backward */
    {"layer_norm", META_FORWARD | META_BACKWARD},
    /* num_batches_tracked += 1; native_batch_norm_backward */
    {"batch_norm", META_FORWARD | META_BACKWARD},
    {"group_norm", META_BACKWARD},         /* native_group_norm_backward */
    {"conv1d", META_BACKWARD},             /* convolution_backward */
    {"conv2d", META_BACKWARD},             /* convolution_backward */
    {"adaptive_avg_pool2d", META_BACKWARD}, /* _adaptive_avg_pool2d_backward */
    {"maximum", META_BACKWARD},            /* where */
    {"threshold_halt", META_BACKWARD},     /* max */
    {"embedding", META_BACKWARD},          /* embedding_dense_backward */
};

static unsigned meta_known(const char *op) {
    for (size_t i = 0; i < sizeof not_on_meta / sizeof not_on_meta[0]; i++)
        if (strcmp(not_on_meta[i].op, op) == 0)
            return not_on_meta[i].stages;
    return 0;
}

/* The output and extras of the training forward as meta tensors, learnt on
 * the CPU from zeros of r's shapes (for an op whose forward cannot run on
 * meta). */
static void forward_shapes_on_cpu(const ebb_op *op, const ebb_attr_value *attrs, side *r,
                                  int n_in, int n_params) {
    const ebb_device meta = {EBB_DEVICE_META, 0};
    side c = {0};
    for (int i = 0; i < n_in; i++) {
        ebb_shape sh = ebb_tensor_shape(r->in[i]);
        assert_ok(ebb_tensor_zeros(&c.in[i], &sh, ebb_tensor_dtype(r->in[i]), ebb_device_cpu()));
    }
    for (int j = 0; j < n_params; j++) {
        ebb_shape sh = ebb_tensor_shape(r->params[j]);
        assert_ok(ebb_tensor_zeros(&c.params[j], &sh, ebb_tensor_dtype(r->params[j]),
                                   ebb_device_cpu()));
    }
    run_forward(op, attrs, &c, n_in, n_params, 1);
    ebb_tensor_free(r->out);
    r->out = NULL;
    ebb_shape os = ebb_tensor_shape(c.out);
    assert_ok(ebb_tensor_empty(&r->out, &os, ebb_tensor_dtype(c.out), meta));
    for (int k = 0; k < EBB_MAX_SAVED; k++) {
        ebb_tensor_free(r->saved[k]);
        r->saved[k] = NULL;
        if (c.saved[k]) {
            ebb_shape ss = ebb_tensor_shape(c.saved[k]);
            assert_ok(ebb_tensor_empty(&r->saved[k], &ss, ebb_tensor_dtype(c.saved[k]), meta));
        }
    }
    side_free(&c);
}

/* Runs one case on meta tensors; returns the stages that failed there
 * (printing why unless meta_known() expects it), after checking that every
 * gradient has the shape and dtype of what it differentiates. A training
 * forward that fails on meta is replaced by forward_shapes_on_cpu(), so that
 * the rule itself is still tried. */
static unsigned meta_case(const ebb_op *op, const grad_case *gc, int n_in, int *wrong) {
    const ebb_device meta = {EBB_DEVICE_META, 0};
    const ebb_dtype dt = EBB_FLOAT32;
    const ebb_op_grad *g = op->grad;
    char buf[256], what[512], a[96], b[96];
    ebb_attr_value attrs[EBB_MAX_ATTRS];
    resolve_attrs(op, gc->attrs, attrs, buf, sizeof buf);
    ebb_shape shapes[MAX_IN];
    side r = {0};
    ebb_tensor *grad_out = NULL;
    unsigned failed = 0, known = meta_known(op->name);
    for (int i = 0; i < n_in; i++) {
        int64_t classes = target_classes(gc);
        shapes[i] = gc->in[i].ndim || i == 0 || classes ? gc->in[i] : gc->in[0];
        int ints = (i == 0 && gc->indices > 0) || (i == 1 && classes > 0);
        assert_ok(ebb_tensor_empty(&r.in[i], &shapes[i],
                                   bool_mask(gc, i) ? EBB_BOOL : ints ? EBB_INT64 : dt, meta));
    }
    describe_case(what, sizeof what, op, gc, shapes, n_in, dt);
    ebb_param_spec specs[EBB_MAX_PARAMS];
    int n_params = 0;
    if (op->params)
        assert_ok(op->params(attrs, shapes, n_in, specs, &n_params));
    for (int j = 0; j < n_params; j++)
        assert_ok(ebb_tensor_empty(&r.params[j], &specs[j].shape,
                                   specs[j].counter ? EBB_INT64 : dt, meta));
    ebb_op_call call = {.op = op, .attrs = attrs, .in = r.in, .n_in = n_in, .params = r.params,
                        .n_params = n_params, .node = op->name, .seed = 1};
    ebb_status st = g->forward_train ? g->forward_train(&call, &r.out, r.saved)
                                     : op->forward(&call, &r.out);
    if (st != EBB_OK) {
        if (!(known & META_FORWARD))
            print_error("[%s] on meta: the training forward -> %s: %.200s\n", what,
                        ebb_status_name(st), ebb_errmsg());
        failed |= META_FORWARD;
        ebb_error_clear();
        forward_shapes_on_cpu(op, attrs, &r, n_in, n_params);
    }
    ebb_shape os = ebb_tensor_shape(r.out);
    assert_ok(ebb_tensor_empty(&grad_out, &os, ebb_tensor_dtype(r.out), meta));
    ebb_tensor *seen_in[MAX_IN] = {NULL};
    ebb_dtype in_dtypes[MAX_IN];
    for (int i = 0; i < n_in; i++) {
        seen_in[i] = (g->saves_inputs >> i) & 1u ? r.in[i] : NULL;
        in_dtypes[i] = ebb_tensor_dtype(r.in[i]);
    }
    ebb_op_grad_call gcall = {.op = op, .attrs = attrs, .in = seen_in, .n_in = n_in,
                              .params = r.params, .n_params = n_params,
                              .out = g->saves_output ? r.out : NULL, .saved = r.saved,
                              .n_saved = g->n_saved, .grad_out = grad_out, .node = op->name,
                              .in_shapes = shapes, .in_dtypes = in_dtypes};
    st = g->backward(&gcall, r.gin, r.gp);
    if (st != EBB_OK) {
        if (!(known & META_BACKWARD))
            print_error("[%s] on meta: backward -> %s: %.200s\n", what, ebb_status_name(st),
                        ebb_errmsg());
        failed |= META_BACKWARD;
        goto done;
    }
    for (int k = 0; k < n_in + n_params; k++) {
        int is_in = k < n_in, j = k - n_in;
        const ebb_tensor *grad = is_in ? r.gin[k] : r.gp[j];
        const ebb_tensor *of = is_in ? r.in[k] : r.params[j];
        int wanted = is_in ? (int)((g->differentiable >> k) & 1u) : !specs[j].buffer;
        if (!wanted || (is_in && ebb_tensor_dtype(of) == EBB_INT64))
            continue;
        ebb_shape gs = ebb_tensor_shape(grad), want = ebb_tensor_shape(of);
        if (!grad || !ebb_shape_equal(&gs, &want) || ebb_tensor_dtype(grad) != dt ||
            ebb_tensor_device(grad).type != EBB_DEVICE_META) {
            print_error("[%s] on meta: the gradient of %s %s is %s %s, expected float32 %s\n",
                        what, is_in ? "input" : "parameter", is_in ? "" : specs[j].name,
                        grad ? ebb_dtype_name(ebb_tensor_dtype(grad)) : "missing",
                        grad ? ebb_shape_str(&gs, a, sizeof a) : "",
                        ebb_shape_str(&want, b, sizeof b));
            (*wrong)++;
        }
    }
done:
    ebb_tensor_free(grad_out);
    side_free(&r);
    ebb_error_clear();
    return failed;
}

static void test_every_rule_runs_on_meta(void **state) {
    (void)state;
    int failures = 0, ran = 0, wrong = 0;
    for (int i = 0; i < ebb_op_count(); i++) {
        const ebb_op *op = ebb_op_at(i);
        if (!op->grad || !op->grad->backward)
            continue;
        unsigned failed = 0, known = meta_known(op->name);
        for (int n = op->min_inputs; n <= max_count(op); n++)
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
                if (case_fits(&cases[k], op, n)) {
                    failed |= meta_case(op, &cases[k], n, &wrong);
                    ran++;
                }
        if (failed & ~known) {
            print_error("op '%s' does not run on meta tensors (listed above)\n", op->name);
            failures++;
        } else if (known & ~failed) {
            print_error("op '%s' now runs on meta tensors: update not_on_meta[] in "
                        "tests/test_op_grad.c\n", op->name);
            failures++;
        } else if (known) {
            print_message("%-22s not on meta: %s%s%s\n", op->name,
                          known & META_FORWARD ? "training forward" : "",
                          known == (META_FORWARD | META_BACKWARD) ? ", " : "",
                          known & META_BACKWARD ? "backward" : "");
        }
    }
    assert_true(ran > 0);
    if (failures || wrong)
        fail_msg("%d op(s) differ from not_on_meta[], %d gradient(s) of the wrong shape or dtype "
                 "on meta (listed above)", failures, wrong);
}

/* ---- refusals and training behaviour -------------------------------------------------------- */

/* A rule given a gradient of the wrong shape refuses, naming both shapes,
 * and leaves nothing behind. */
static void test_rules_refuse_bad_shapes(void **state) {
    (void)state;
    const ebb_device cpu = ebb_device_cpu();
    ebb_shape xs = EBB_SHAPE(4, 8), bad = EBB_SHAPE(4, 5), ws = EBB_SHAPE(6, 8);
    ebb_tensor *x = NULL, *g = NULL, *w = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    assert_ok(ebb_tensor_randn(&x, &xs, EBB_FLOAT64, cpu, 1));
    assert_ok(ebb_tensor_randn(&g, &bad, EBB_FLOAT64, cpu, 2));
    assert_ok(ebb_tensor_randn(&w, &ws, EBB_FLOAT64, cpu, 3));
    /* relu's rule from a mismatched output */
    assert_int_equal(ebb_tensor_unary_backward(&gx, EBB_RELU, g, x), EBB_ERR_SHAPE);
    assert_null(gx);
    assert_errmsg_contains("[4, 5]");
    assert_errmsg_contains("[4, 8]");
    /* linear: gradient [4, 5] for a weight of 6 outputs */
    assert_int_not_equal(ebb_tensor_linear_backward(&gx, &gw, &gb, g, x, w), EBB_OK);
    assert_null(gx);
    assert_null(gw);
    assert_null(gb);
    assert_errmsg_contains("[6, 8]");
    /* the descriptor's rule for sum: a gradient that does not fit the input */
    const ebb_op *sum = ebb_op_find("sum");
    ebb_attr_value attrs[EBB_MAX_ATTRS];
    char buf[64];
    resolve_attrs(sum, "dim=0", attrs, buf, sizeof buf);
    ebb_tensor *in[1] = {x}, *gin[1] = {NULL}, *gp[1] = {NULL};
    ebb_shape x_shape = ebb_tensor_shape(x);
    ebb_op_grad_call c = {.op = sum, .attrs = attrs, .in = in, .n_in = 1, .grad_out = g,
                          .node = "s", .in_shapes = &x_shape};
    assert_int_not_equal(sum->grad->backward(&c, gin, gp), EBB_OK);
    assert_null(gin[0]);
    /* an op whose rule needs saved extras refuses without them */
    const ebb_op *drop = ebb_op_find("dropout");
    resolve_attrs(drop, NULL, attrs, buf, sizeof buf);
    ebb_op_grad_call d = {.op = drop, .attrs = attrs, .in = in, .n_in = 1, .grad_out = x,
                          .node = "d"};
    assert_int_equal(drop->grad->backward(&d, gin, gp), EBB_ERR_ARG);
    assert_errmsg_contains("mask");
    assert_null(gin[0]);
    ebb_tensor_free(x);
    ebb_tensor_free(g);
    ebb_tensor_free(w);
}

/* Dropout in training drops about p of the elements, scales the rest by
 * 1/(1-p), and a seed always draws the same mask. */
static void test_dropout_train_is_seeded(void **state) {
    (void)state;
    const ebb_op *drop = ebb_op_find("dropout");
    ebb_attr_value attrs[EBB_MAX_ATTRS];
    char buf[64];
    resolve_attrs(drop, "p=0.25", attrs, buf, sizeof buf);
    ebb_shape s = EBB_SHAPE(64, 64);
    ebb_tensor *x = NULL, *y1 = NULL, *y2 = NULL, *y3 = NULL;
    ebb_tensor *m1[EBB_MAX_SAVED] = {NULL}, *m2[EBB_MAX_SAVED] = {NULL}, *m3[EBB_MAX_SAVED] = {NULL};
    assert_ok(ebb_tensor_ones(&x, &s, EBB_FLOAT64, ebb_device_cpu()));
    ebb_tensor *in[1] = {x};
    ebb_op_call c = {.op = drop, .attrs = attrs, .in = in, .n_in = 1, .seed = 42};
    assert_ok(drop->grad->forward_train(&c, &y1, m1));
    assert_ok(drop->grad->forward_train(&c, &y2, m2));
    c.seed = 43;
    assert_ok(drop->grad->forward_train(&c, &y3, m3));
    double d = -1, mean = 0;
    assert_ok(ebb_tensor_max_abs_diff(y1, y2, &d));
    assert_true(d == 0.0);
    assert_ok(ebb_tensor_max_abs_diff(y1, y3, &d));
    assert_true(d > 0.0);
    /* kept elements are 1/(1-p), so the mean stays near 1 */
    assert_ok(ebb_tensor_mean_value(y1, &mean));
    assert_true(mean > 0.9 && mean < 1.1);
    assert_ok(ebb_tensor_max_abs_diff(y1, x, &d));
    assert_true(d > 0.3); /* some element dropped */
    ebb_tensor_free(x);
    ebb_tensor_free(y1);
    ebb_tensor_free(y2);
    ebb_tensor_free(y3);
    ebb_tensor_free(m1[0]);
    ebb_tensor_free(m2[0]);
    ebb_tensor_free(m3[0]);
}

/* The autograd switch is scoped: outside it, tensors cannot become leaves. */
static void test_autograd_switch_is_scoped(void **state) {
    (void)state;
    ebb_shape s = EBB_SHAPE(3);
    ebb_tensor *x = NULL;
    assert_ok(ebb_tensor_ones(&x, &s, EBB_FLOAT64, ebb_device_cpu()));
    assert_int_equal(ebb_tensor_requires_grad_(x), EBB_ERR_ARG);
    assert_errmsg_contains("autograd_begin");
    ebb_tensor *i = NULL, *y = NULL, *g = NULL;
    ebb_tensor_autograd_begin();
    assert_ok(ebb_tensor_cast(&i, x, EBB_INT64));
    assert_int_equal(ebb_tensor_requires_grad_(i), EBB_ERR_ARG);
    assert_errmsg_contains("only floating");
    assert_ok(ebb_tensor_clone(&y, x));
    assert_int_equal(ebb_tensor_grad(&g, y), EBB_ERR_ARG); /* not a leaf that requires grad */
    ebb_tensor_autograd_end();
    ebb_tensor_free(x);
    ebb_tensor_free(i);
    ebb_tensor_free(y);
}

/* A user's op registers with a rule only if the rule is complete. */
static ebb_status ident_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return ebb_tensor_ref(out, c->in[0]);
}

static ebb_status ident_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    return ebb_tensor_ref(&gin[0], c->grad_out);
}

static void test_register_checks_rules(void **state) {
    (void)state;
    static const ebb_op_grad no_backward = {.differentiable = 1u};
    static const ebb_op bad1 = {.name = "test_rule_no_backward", .min_inputs = 1,
                                .max_inputs = 1, .forward = ident_fwd, .grad = &no_backward};
    assert_int_equal(ebb_op_register(&bad1), EBB_ERR_ARG);
    assert_errmsg_contains("'test_rule_no_backward' has a backward rule without a backward");
    assert_null(ebb_op_find("test_rule_no_backward"));
    /* extras come from a training forward, which this rule lacks */
    static const ebb_op_grad extras = {.backward = ident_bwd, .n_saved = 1, .differentiable = 1u};
    static const ebb_op bad2 = {.name = "test_rule_extras", .min_inputs = 1, .max_inputs = 1,
                                .forward = ident_fwd, .grad = &extras};
    assert_int_equal(ebb_op_register(&bad2), EBB_ERR_ARG);
    assert_errmsg_contains("extras (at most 4) come from a forward_train function");
    assert_null(ebb_op_find("test_rule_extras"));
}

/* Rules that register but give the wrong thing: a training compile runs
 * each rule on meta tensors and refuses what it gave, naming the node and
 * the rule (graph/autodiff.c, bwd_check), with nothing left behind. */
static ebb_status short_grad_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)gp;
    ebb_shape s = EBB_SHAPE(3);
    return ebb_tensor_zeros(&gin[0], &s, ebb_tensor_dtype(c->grad_out),
                            ebb_tensor_device(c->grad_out));
}

static ebb_status no_grad_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    (void)c;
    (void)gin;
    (void)gp;
    return EBB_OK;
}

static void expect_rule_refused(const char *op, const char *needle) {
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "ebb: 1\nname: rules\ninputs:\n  x: [4, 3]\ntargets:\n  y: [4, 3]\n"
             "loss: mse\nflow:\n  - from: {linear: {in: 3, out: 3}}\n  - {%s: {name: odd}}\n",
             op);
    ebb_spec *spec = NULL;
    assert_ok(ebb_spec_load_string(&spec, yaml, strlen(yaml), "rules.yaml"));
    ebb_shape xs = EBB_SHAPE(4, 3);
    ebb_train_options t = {.target_shapes = &xs, .n_target_shapes = 1,
                           .optimizer = {.kind = EBB_SGD, .lr = 0.1}};
    ebb_compile_options o = {.input_shapes = &xs, .n_input_shapes = 1, .train = &t};
    ebb_plan *plan = NULL;
    int64_t live = ebb_tensor_live_count();
    assert_int_not_equal(ebb_spec_compile(&plan, spec, &o), EBB_OK);
    assert_null(plan);
    assert_errmsg_contains("node odd (");
    assert_errmsg_contains(needle);
    printf("[ rules    ] %s\n", ebb_errmsg());
    assert_int_equal(ebb_tensor_live_count(), live);
    ebb_spec_free(spec);
}

static void test_compile_checks_what_rules_give(void **state) {
    (void)state;
    static const ebb_op_grad short_rule = {.backward = short_grad_bwd, .differentiable = 1u};
    static const ebb_op_grad silent_rule = {.backward = no_grad_bwd, .differentiable = 1u};
    static const ebb_op short_op = {.name = "test_rule_short", .min_inputs = 1, .max_inputs = 1,
                                    .forward = ident_fwd, .grad = &short_rule};
    static const ebb_op silent_op = {.name = "test_rule_silent", .min_inputs = 1,
                                     .max_inputs = 1, .forward = ident_fwd, .grad = &silent_rule};
    if (!ebb_op_find(short_op.name))
        assert_ok(ebb_op_register(&short_op));
    if (!ebb_op_find(silent_op.name))
        assert_ok(ebb_op_register(&silent_op));
    expect_rule_refused("test_rule_short", "the gradient of input 0 is [3], the input [4, 3]");
    expect_rule_refused("test_rule_silent", "the rule gave no gradient for input 0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_every_op_has_rule_and_cases),
        EBB_TEST(test_coverage_check_names_newcomers),
        EBB_TEST(test_every_rule_matches_autograd),
        EBB_TEST(test_every_rule_on_device),
        EBB_TEST(test_every_rule_runs_on_meta),
        EBB_TEST(test_rules_refuse_bad_shapes),
        EBB_TEST(test_dropout_train_is_seeded),
        EBB_TEST(test_autograd_switch_is_scoped),
        EBB_TEST(test_register_checks_rules),
        EBB_TEST(test_compile_checks_what_rules_give),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
