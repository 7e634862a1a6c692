/* Op conformance: every op in the registry, present and future, is compiled
 * as a one-node plan and run under the CPU's accounting allocator (or, with
 * EBB_TEST_DEVICE=cuda, the caching allocator's counts), for several shapes,
 * both float dtypes and every input count it accepts. The run must keep the
 * plan's promises:
 *   - the output's shape, dtype and view-ness are the dry run's;
 *   - the measured peak equals the planned one to the byte: the output (0 for
 *     a view) plus the op's declared workspace, nothing undeclared;
 *   - the inputs come back unchanged;
 *   - an op with forward_inplace, run in place, allocates nothing beyond its
 *     workspace and gives the values of its forward.
 *
 * The suite walks ebb_op_count()/ebb_op_at(). The only per-op knowledge is
 * the table of valid inputs below, looked up by op name: an op (or an input
 * count of it) without rows there fails test_every_op_has_cases, naming it,
 * so a newly registered op cannot go unchecked. */
#include "test_util.h"

static const ebb_device CPU = {EBB_DEVICE_CPU, 0};
/* where the plans run: EBB_TEST_DEVICE (CPU by default); inputs are drawn on
 * the CPU and copied there, so that every device sees the same values */
static ebb_device DEV = {EBB_DEVICE_CPU, 0};

#define MAX_IN 5      /* inputs of one call (_cached_attention's five) */
#define VARIADIC_IN 4 /* the counts checked of an op taking any number */
#define MIN_CASES 2 /* distinct shapes per op and input count */

/* Valid inputs for one op. */
typedef struct conf_case {
    const char *op;
    /* The input count this row is for; 0: every count the op accepts (up to
     * MAX_IN), input i shaped in[i] where given, else like in[0]. */
    int n_in;
    ebb_shape in[MAX_IN];
    const char *attrs; /* ebb_node_op() text, or NULL */
    int64_t indices;   /* > 0: in[0] holds int64 indices in [0, indices) */
    /* The dtypes (BOUND_*) for which the op declares an upper bound rather
     * than its exact scratch, for the reason docs/ops.md gives: the run must
     * then stay at or under the plan instead of matching it. */
    unsigned bound;
} conf_case;

/* A loss's target, in[1]: int64 class indices in [0, C) for an op whose
 * descriptor says so (cross_entropy, nll: returns C, in[0]'s last dim),
 * probabilities in [0, 1) for bce_with_logits (-1); 0 for other ops. */
static int64_t target_classes(const conf_case *c) {
    const ebb_op *op = ebb_op_find(c->op);
    if (op && op->indices == EBB_INDICES_CLASSES)
        return c->in[0].dim[c->in[0].ndim - 1];
    return strcmp(c->op, "bce_with_logits") == 0 ? -1 : 0;
}

enum { BOUND_F32 = 1, BOUND_F64 = 2 };

/* A shape usable in a static initializer. */
#define SH(...) {(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}}

static const conf_case cases[] = {
    /* activations */
    {"relu", 1, {SH(4, 8)}, NULL, 0, 0},
    {"relu", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"gelu", 1, {SH(4, 8)}, NULL, 0, 0},
    {"gelu", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"gelu", 1, {SH(4, 8)}, "approximate=tanh", 0, 0},
    {"tanh", 1, {SH(4, 8)}, NULL, 0, 0},
    {"tanh", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"sigmoid", 1, {SH(4, 8)}, NULL, 0, 0},
    {"sigmoid", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"silu", 1, {SH(4, 8)}, NULL, 0, 0},
    {"silu", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"identity", 1, {SH(4, 8)}, NULL, 0, 0},
    {"identity", 1, {SH(3, 1, 5)}, NULL, 0, 0},
    {"dropout", 1, {SH(4, 8)}, NULL, 0, 0},
    {"dropout", 1, {SH(2, 3, 5)}, "p=0.1", 0, 0},
    {"softmax", 1, {SH(4, 8)}, NULL, 0, 0},
    {"softmax", 1, {SH(2, 3, 5)}, "dim=0", 0, 0},
    {"log_softmax", 1, {SH(4, 8)}, NULL, 0, 0},
    {"log_softmax", 1, {SH(2, 3, 5)}, "dim=1", 0, 0},
    /* linear */
    {"linear", 1, {SH(4, 8)}, "out=6", 0, 0},
    {"linear", 1, {SH(2, 3, 8)}, "out=5", 0, 0},
    {"linear", 1, {SH(2, 3, 8)}, "out=5, bias=false", 0, 0},
    {"linear", 1, {SH(7)}, "out=3", 0, 0},
    {"linear", 1, {SH(1, 1, 8)}, "out=5, bias=false", 0, 0}, /* one row: a matrix-vector product */
    {"learned_halt", 1, {SH(4, 8)}, NULL, 0, 0},
    {"learned_halt", 1, {SH(2, 3, 6)}, NULL, 0, 0},
    /* convolution: batched and unbatched, strided, padded, dilated, grouped.
     * float32 goes to oneDNN where libtorch's use_mkldnn() says so, and its
     * scratch depends on the CPU: a bound there (BOUND_F32), exact on the
     * native path (float64, and float32 elsewhere) */
    {"conv1d", 1, {SH(2, 3, 10)}, "out=4, kernel=3", 0, BOUND_F32},
    {"conv1d", 1, {SH(3, 12)}, "out=2, kernel=3, stride=2, padding=1, dilation=2", 0, 0},
    {"conv1d", 1, {SH(2, 4, 9)}, "out=6, kernel=3, padding=1, groups=2, bias=false", 0, BOUND_F32},
    {"conv1d", 1, {SH(2, 4, 9)}, "out=5, kernel=1", 0, 0},
    {"conv2d", 1, {SH(2, 3, 8, 8)}, "out=4, kernel=3, padding=1", 0, BOUND_F32},
    {"conv2d", 1, {SH(1, 4, 7, 9)}, "out=6, kernel=3, stride=2, dilation=2, groups=2", 0,
     BOUND_F32},
    {"conv2d", 1, {SH(3, 6, 6)}, "out=2, kernel=2, bias=false", 0, 0},
    {"conv2d", 1, {SH(2, 4, 5, 5)}, "out=3, kernel=1", 0, 0},
    {"conv2d", 1, {SH(2, 4, 6, 6)}, "out=4, kernel=3, groups=4", 0, BOUND_F32},
    /* the grid of shapes where oneDNN leaves its direct kernels (docs/ops.md):
     * maps smaller than the kernel (a 3x3 layer on a 2x2 or 1x1 map), strides,
     * dilation, depthwise groups, 1x1 layers from batch 1 to 64 */
    {"conv2d", 1, {SH(4, 256, 2, 2)}, "out=256, kernel=3, padding=1", 0, BOUND_F32},
    {"conv2d", 1, {SH(2, 8, 1, 1)}, "out=8, kernel=3, padding=1", 0, BOUND_F32},
    {"conv2d", 1, {SH(2, 16, 3, 3)}, "out=16, kernel=5, stride=2, padding=2", 0, BOUND_F32},
    {"conv2d", 1, {SH(3, 16, 4, 4)}, "out=16, kernel=3, padding=2, dilation=2, groups=16", 0,
     BOUND_F32},
    {"conv2d", 1, {SH(16, 8, 2, 2)}, "out=16, kernel=1", 0, BOUND_F32},
    {"conv2d", 1, {SH(1, 4, 5, 5)}, "out=4, kernel=1, stride=2", 0, 0},
    {"conv2d", 1, {SH(64, 4, 3, 3)}, "out=8, kernel=3, padding=1, groups=2", 0, BOUND_F32},
    {"conv2d", 1, {SH(2, 32, 7, 7)}, "out=8, kernel=7", 0, BOUND_F32},
    {"conv1d", 1, {SH(4, 8, 2)}, "out=8, kernel=3, padding=1", 0, BOUND_F32},
    /* pooling */
    {"max_pool2d", 1, {SH(2, 3, 8, 8)}, "kernel=2", 0, 0},
    {"max_pool2d", 1, {SH(3, 7, 7)}, "kernel=3, stride=2, padding=1, ceil_mode=true", 0, 0},
    {"avg_pool2d", 1, {SH(2, 3, 8, 8)}, "kernel=2", 0, 0},
    {"avg_pool2d", 1, {SH(3, 7, 7)}, "kernel=3, stride=2, padding=1, count_include_pad=false", 0,
     0},
    {"adaptive_avg_pool2d", 1, {SH(2, 3, 8, 8)}, "output_size=1", 0, 0},
    {"adaptive_avg_pool2d", 1, {SH(3, 7, 9)}, "output_size=3", 0, 0},
    /* small maps, 1x1 maps, batch 64 */
    {"max_pool2d", 1, {SH(4, 16, 2, 2)}, "kernel=2", 0, 0},
    {"max_pool2d", 1, {SH(64, 3, 1, 1)}, "kernel=1", 0, 0},
    {"max_pool2d", 1, {SH(2, 8, 3, 3)}, "kernel=3, stride=2, padding=1", 0, 0},
    {"avg_pool2d", 1, {SH(4, 16, 2, 2)}, "kernel=2", 0, 0},
    {"avg_pool2d", 1, {SH(64, 3, 3, 3)}, "kernel=3, padding=1", 0, 0},
    {"adaptive_avg_pool2d", 1, {SH(4, 16, 2, 2)}, "output_size=1", 0, 0},
    {"adaptive_avg_pool2d", 1, {SH(64, 3, 1, 1)}, "output_size=1", 0, 0},
    {"adaptive_avg_pool2d", 1, {SH(2, 8, 5, 5)}, "output_size=2", 0, 0},
    /* normalisation */
    {"layer_norm", 1, {SH(4, 8)}, NULL, 0, 0},
    {"layer_norm", 1, {SH(2, 3, 5)}, "affine=false", 0, 0},
    {"layer_norm", 1, {SH(4, 8)}, "bias=false", 0, 0},
    {"batch_norm", 1, {SH(4, 6)}, NULL, 0, 0},
    {"batch_norm", 1, {SH(2, 3, 5, 5)}, NULL, 0, 0},
    {"batch_norm", 1, {SH(2, 4, 7)}, "affine=false", 0, 0},
    {"batch_norm", 1, {SH(4, 256, 2, 2)}, NULL, 0, 0},
    {"batch_norm", 1, {SH(64, 3, 1, 1)}, NULL, 0, 0},
    {"batch_norm", 1, {SH(2, 8, 1, 1)}, NULL, 0, 0},
    {"batch_norm", 1, {SH(64, 16)}, NULL, 0, 0},
    {"rms_norm", 1, {SH(4, 8)}, NULL, 0, 0},
    {"rms_norm", 1, {SH(2, 3, 5)}, "affine=false", 0, 0},
    {"group_norm", 1, {SH(2, 6, 5)}, "num_groups=3", 0, 0},
    {"group_norm", 1, {SH(2, 4, 3, 3)}, "num_groups=2, affine=false", 0, 0},
    /* embedding: int64 indices */
    {"embedding", 1, {SH(4, 5)}, "num=10, dim=6", 10, 0},
    {"embedding", 1, {SH(7)}, "num=3, dim=4", 3, 0},
    /* an output under 16 bytes: the index check's two int64s set the peak */
    {"embedding", 1, {SH(1)}, "num=3, dim=1", 3, BOUND_F32 | BOUND_F64},
    /* attention: self, cross (key = value), and query/key/value */
    {"multi_head_attention", 1, {SH(2, 5, 8)}, "num_heads=2", 0, 0},
    {"multi_head_attention", 1, {SH(1, 3, 6)}, "num_heads=3, causal=true, bias=false", 0, 0},
    {"multi_head_attention", 2, {SH(2, 5, 8), SH(2, 7, 8)}, "num_heads=2", 0, 0},
    {"multi_head_attention", 2, {SH(1, 4, 6), SH(1, 2, 6)}, "num_heads=1, bias=false", 0, 0},
    {"multi_head_attention", 3, {SH(2, 5, 8), SH(2, 7, 8), SH(2, 7, 8)}, "num_heads=4", 0, 0},
    {"multi_head_attention", 3, {SH(1, 3, 6), SH(1, 3, 6), SH(1, 3, 6)},
     "num_heads=2, causal=true", 0, 0},
    /* recurrent cells: the state alone, or state and x */
    {"gru_cell", 1, {SH(4, 6)}, "hidden=6", 0, 0},
    {"gru_cell", 1, {SH(2, 5)}, "hidden=5, bias=false", 0, 0},
    {"gru_cell", 2, {SH(4, 6), SH(4, 3)}, "hidden=6", 0, 0},
    {"gru_cell", 2, {SH(1, 5), SH(1, 7)}, "hidden=5, bias=false", 0, 0},
    {"lstm_cell", 1, {SH(4, 12)}, "hidden=6", 0, 0},
    {"lstm_cell", 1, {SH(2, 10)}, "hidden=5, bias=false", 0, 0},
    {"lstm_cell", 2, {SH(3, 10), SH(3, 4)}, "hidden=5", 0, 0},
    {"lstm_cell", 2, {SH(1, 8), SH(1, 9)}, "hidden=4, bias=false", 0, 0},
    /* shape */
    {"flatten", 1, {SH(2, 3, 4)}, NULL, 0, 0},
    {"flatten", 1, {SH(2, 3, 4, 5)}, "start_dim=1, end_dim=2", 0, 0},
    {"reshape", 1, {SH(4, 6)}, "shape=\"-1,3\"", 0, 0},
    {"reshape", 1, {SH(2, 3, 8)}, "shape=\"0,0,2,-1\"", 0, 0},
    /* matmul: a bound where leading dims fold (an operand may be copied) */
    {"matmul", 2, {SH(4, 6), SH(6, 3)}, NULL, 0, 0},
    {"matmul", 2, {SH(2, 3, 4, 5), SH(2, 3, 5, 6)}, NULL, 0, BOUND_F32 | BOUND_F64},
    {"matmul", 2, {SH(3, 4, 5), SH(2, 1, 5, 6)}, NULL, 0, BOUND_F32 | BOUND_F64},
    {"masked_fill", 2, {SH(2, 3, 4, 4), SH(4, 4)}, NULL, 0, 0},
    {"masked_fill", 2, {SH(3, 5), SH(3, 5)}, "value=0.5", 0, 0},
    {"causal_mask", 1, {SH(2, 4, 5)}, NULL, 0, 0},
    {"causal_mask", 1, {SH(7, 7)}, NULL, 0, 0},
    {"narrow", 1, {SH(2, 3, 12)}, "dim=2, start=4, length=4", 0, 0},
    {"narrow", 1, {SH(5, 4)}, "dim=0, start=-3, length=2", 0, 0},
    {"positions", 1, {SH(2, 7, 3)}, NULL, 0, 0},
    {"positions", 1, {SH(4, 5)}, "dim=0", 0, 0},
    /* attention over values: exact where no batched product copies (one
     * batch dim, or B = 1), a bound where head-split views would be copied */
    {"scaled_dot_product_attention", 3, {SH(3, 5, 8), SH(3, 7, 8), SH(3, 7, 6)}, NULL, 0, 0},
    {"scaled_dot_product_attention", 3, {SH(1, 2, 5, 4), SH(1, 2, 5, 4), SH(1, 2, 5, 4)},
     "causal=true", 0, 0},
    {"scaled_dot_product_attention", 3, {SH(2, 4, 6, 8), SH(2, 4, 6, 8), SH(2, 4, 6, 8)},
     "causal=true", 0, BOUND_F32 | BOUND_F64},
    /* with a mask (added to the scores): matmul and softmax on every libtorch */
    {"scaled_dot_product_attention", 4, {SH(3, 5, 8), SH(3, 7, 8), SH(3, 7, 6), SH(5, 7)}, NULL,
     0, BOUND_F32 | BOUND_F64},
    {"scaled_dot_product_attention", 3, {SH(3, 5, 8), SH(3, 7, 8), SH(3, 7, 6)}, "dropout=0.5",
     0, 0},
    {"scaled_dot_product_attention", 4, {SH(1, 2, 4, 8), SH(1, 2, 6, 8), SH(1, 2, 6, 8),
     SH(1, 1, 4, 6)}, "causal=true", 0, 0},
    /* through a key/value cache, from its first position (a prompt): the
     * causal attention above on repeated keys and values; its scratch is
     * counted for a later position too when t = 1 (a full cache: a bound) */
    {"_cached_attention", 5, {SH(1, 4, 5, 4), SH(1, 2, 5, 4), SH(1, 2, 5, 4), SH(1, 2, 9, 4),
     SH(1, 2, 9, 4)}, "repeats=2", 0, 0},
    {"_cached_attention", 5, {SH(1, 2, 6, 8), SH(1, 2, 6, 8), SH(1, 2, 6, 8), SH(1, 2, 6, 8),
     SH(1, 2, 6, 8)}, NULL, 0, 0},
    {"_cached_attention", 5, {SH(2, 4, 1, 8), SH(2, 1, 1, 8), SH(2, 1, 1, 8), SH(2, 1, 16, 8),
     SH(2, 1, 16, 8)}, "repeats=4", 0, BOUND_F32 | BOUND_F64},
    {"reshape", 1, {SH(2, 3, 4)}, "shape=\"6,4\"", 0, 0},
    {"permute", 1, {SH(2, 3, 4)}, "dims=\"2,0,1\"", 0, 0},
    {"permute", 1, {SH(4, 5)}, "dims=\"1,0\"", 0, 0},
    {"transpose", 1, {SH(2, 3, 4)}, "dim0=0, dim1=2", 0, 0},
    {"transpose", 1, {SH(4, 5)}, "dim0=0, dim1=1", 0, 0},
    {"unsqueeze", 1, {SH(2, 3)}, "dim=0", 0, 0},
    {"unsqueeze", 1, {SH(2, 3, 4)}, "dim=-1", 0, 0},
    {"squeeze", 1, {SH(2, 1, 3)}, "dim=1", 0, 0},
    {"squeeze", 1, {SH(1, 4, 1)}, NULL, 0, 0},
    /* math */
    {"cast", 1, {SH(4, 8)}, "dtype=bfloat16", 0, 0},
    {"cast", 1, {SH(2, 3, 5)}, "dtype=float64", 0, 0},
    {"scale", 1, {SH(4, 8)}, "factor=2.5", 0, 0},
    {"scale", 1, {SH(2, 3, 5)}, "factor=-1", 0, 0},
    {"mean", 1, {SH(4, 8)}, "dim=1", 0, 0},
    {"mean", 1, {SH(2, 3, 5)}, "dims=\"0,2\", keepdim=true", 0, 0},
    {"mean", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"sum", 1, {SH(4, 8)}, "dim=0", 0, 0},
    {"sum", 1, {SH(2, 3, 5)}, "dims=\"1,2\"", 0, 0},
    {"sum", 1, {SH(2, 3, 5)}, "keepdim=true", 0, 0},
    /* rotary positions on [B, H, T, D] and [B, T, H, D], both layouts;
     * grouped-query heads */
    {"rotary_embedding", 1, {SH(2, 3, 5, 8)}, NULL, 0, 0},
    {"rotary_embedding", 1, {SH(2, 5, 3, 8)}, "seq_dim=1, interleaved=true", 0, 0},
    {"rotary_embedding", 1, {SH(7, 4)}, "theta=500000", 0, 0},
    {"repeat_kv", 1, {SH(2, 2, 5, 4)}, "repeats=3", 0, 0},
    {"repeat_kv", 1, {SH(2, 4, 3)}, "repeats=2, dim=0", 0, 0},
    {"repeat_kv", 1, {SH(2, 4, 5, 3)}, "repeats=1", 0, 0},
    /* elementwise math (log, sqrt, rsqrt, pow and div's divisor drawn in
     * [0.5, 2): ebb_test_positive_input) */
    {"neg", 1, {SH(4, 8)}, NULL, 0, 0},
    {"neg", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"exp", 1, {SH(4, 8)}, NULL, 0, 0},
    {"exp", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"log", 1, {SH(4, 8)}, NULL, 0, 0},
    {"log", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"sqrt", 1, {SH(4, 8)}, NULL, 0, 0},
    {"sqrt", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"rsqrt", 1, {SH(4, 8)}, NULL, 0, 0},
    {"rsqrt", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"abs", 1, {SH(4, 8)}, NULL, 0, 0},
    {"abs", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"sin", 1, {SH(4, 8)}, NULL, 0, 0},
    {"sin", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"cos", 1, {SH(4, 8)}, NULL, 0, 0},
    {"cos", 1, {SH(2, 3, 5)}, NULL, 0, 0},
    {"pow", 1, {SH(4, 8)}, "exponent=2", 0, 0},
    {"pow", 1, {SH(2, 3, 5)}, "exponent=-0.5", 0, 0},
    {"pow", 1, {SH(4, 8)}, "exponent=0", 0, 0},
    {"pow", 1, {SH(3, 5)}, "exponent=1", 0, 0},
    {"clamp", 1, {SH(4, 8)}, "min=-0.5, max=0.5", 0, 0},
    {"clamp", 1, {SH(2, 3, 5)}, "min=0", 0, 0},
    {"clamp", 1, {SH(3, 5)}, "max=0.25", 0, 0},
    {"where", 3, {SH(4, 8), SH(4, 8), SH(4, 8)}, NULL, 0, 0},
    {"where", 3, {SH(2, 3, 5), SH(2, 3, 5), SH(2, 3, 5)}, NULL, 0, 0},
    {"where", 3, {SH(8), SH(4, 1), SH(4, 8)}, NULL, 0, 0},
    {"where", 3, {SH(4, 5), SH(3, 4, 5), SH(1, 5)}, NULL, 0, 0},
    {"sub", 2, {SH(4, 8)}, NULL, 0, 0},
    {"sub", 2, {SH(2, 3, 5)}, NULL, 0, 0},
    {"sub", 2, {SH(4, 1), SH(8)}, NULL, 0, 0},
    {"sub", 2, {SH(8), SH(4, 8)}, NULL, 0, 0},
    {"div", 2, {SH(4, 8)}, NULL, 0, 0},
    {"div", 2, {SH(2, 3, 5)}, NULL, 0, 0},
    {"div", 2, {SH(4, 1), SH(8)}, NULL, 0, 0},
    {"div", 2, {SH(4, 8), SH(8)}, NULL, 0, 0},
    /* combining: equal shapes, and shapes that broadcast (the output can be
     * larger than the first two inputs) */
    {"add", 0, {SH(4, 8)}, NULL, 0, 0},
    {"add", 0, {SH(2, 3, 5)}, NULL, 0, 0},
    {"add", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0, 0},
    {"mul", 0, {SH(4, 8)}, NULL, 0, 0},
    {"mul", 0, {SH(2, 3, 5)}, NULL, 0, 0},
    {"mul", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0, 0},
    {"average", 0, {SH(4, 8)}, NULL, 0, 0},
    {"average", 0, {SH(2, 3, 5)}, NULL, 0, 0},
    {"average", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0, 0},
    {"maximum", 0, {SH(4, 8)}, NULL, 0, 0},
    {"maximum", 0, {SH(2, 3, 5)}, NULL, 0, 0},
    {"maximum", 0, {SH(8), SH(1, 8), SH(4, 1), SH(4, 8)}, NULL, 0, 0},
    {"cat", 0, {SH(4, 8)}, NULL, 0, 0},
    {"cat", 0, {SH(2, 3, 5), SH(2, 1, 5), SH(2, 4, 5), SH(2, 2, 5)}, NULL, 0, 0},
    {"cat", 0, {SH(2, 3)}, "dim=0", 0, 0},
    {"stack", 0, {SH(4, 8)}, NULL, 0, 0},
    {"stack", 0, {SH(2, 3, 5)}, "dim=0", 0, 0},
    /* routing */
    {"threshold_halt", 1, {SH(4, 8)}, NULL, 0, 0},
    {"threshold_halt", 1, {SH(2, 3, 5)}, "threshold=0.1", 0, 0},
    {"_gate_mix", 2, {SH(4, 3), SH(4, 8)}, "index=1", 0, 0},
    {"_gate_mix", 2, {SH(2, 2), SH(2, 3, 5)}, "index=0", 0, 0},
    {"_gate_mix", 3, {SH(4, 8), SH(4, 3), SH(4, 8)}, "index=2", 0, 0},
    {"_gate_mix", 3, {SH(2, 3, 5), SH(2, 2), SH(2, 3, 5)}, "index=1", 0, 0},
    /* losses: in[1] is the target */
    {"cross_entropy", 2, {SH(4, 10), SH(4)}, NULL, 0, 0},
    {"cross_entropy", 2, {SH(6, 5), SH(6)}, "label_smoothing=0.2", 0, 0},
    {"cross_entropy", 2, {SH(7), {0, {0}}}, "label_smoothing=0.1", 0, 0},
    {"cross_entropy", 2, {SH(3), {0, {0}}}, NULL, 0, 0},
    {"cross_entropy", 2, {SH(2, 3, 5), SH(2, 3)}, "label_smoothing=0.1", 0, 0},
    {"nll", 2, {SH(3, 2, 6), SH(3, 2)}, NULL, 0, 0},
    {"nll", 2, {SH(4, 10), SH(4)}, NULL, 0, 0},
    {"nll", 2, {SH(6), {0, {0}}}, "ignore_index=2", 0, 0},
    {"mse", 2, {SH(4, 8), SH(4, 8)}, NULL, 0, 0},
    {"mse", 2, {SH(2, 3, 5), SH(2, 3, 5)}, NULL, 0, 0},
    {"bce_with_logits", 2, {SH(4, 8), SH(4, 8)}, NULL, 0, 0},
    {"bce_with_logits", 2, {SH(2, 3, 5), SH(2, 3, 5)}, NULL, 0, 0},
};

static const ebb_dtype float_dtypes[] = {EBB_FLOAT32, EBB_FLOAT64};

/* ---- coverage ------------------------------------------------------------------ */

/* The input counts to check: every one the op accepts, variadic ops up to MAX_IN
 * (2, 3 and 4 for the merges). */
static int max_count(const ebb_op *op) {
    if (op->max_inputs < 0 || op->max_inputs > MAX_IN)
        return op->min_inputs > VARIADIC_IN ? op->min_inputs : VARIADIC_IN;
    return op->max_inputs;
}

static int case_fits(const conf_case *c, const ebb_op *op, int n_in) {
    return strcmp(c->op, op->name) == 0 && (c->n_in == n_in || c->n_in == 0);
}

/* Writes what cases[] lacks for `op` into msg (empty when covered); returns the
 * number of input counts with fewer than MIN_CASES rows. */
static int missing_cases(const ebb_op *op, char *msg, size_t size) {
    int gaps = 0;
    msg[0] = '\0';
    for (int n = op->min_inputs; n <= max_count(op); n++) {
        int rows = 0;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            rows += case_fits(&cases[i], op, n);
        if (rows >= MIN_CASES)
            continue;
        size_t len = strlen(msg);
        snprintf(msg + len, size - len,
                 "%sop '%s' has %d conformance case(s) for %d input(s), needs %d: add rows "
                 "for it to cases[] in tests/test_op_conformance.c",
                 gaps ? "; " : "", op->name, rows, n, MIN_CASES);
        gaps++;
    }
    return gaps;
}

static void test_every_op_has_cases(void **state) {
    (void)state;
    assert_true(ebb_op_count() > 0);
    int gaps = 0;
    char msg[1024];
    for (int i = 0; i < ebb_op_count(); i++)
        if (missing_cases(ebb_op_at(i), msg, sizeof msg)) {
            print_error("%s\n", msg);
            gaps++;
        }
    if (gaps)
        fail_msg("%d registered op(s) lack conformance cases (listed above)", gaps);
}

/* The coverage check itself must catch an op it has never heard of, and a
 * known op whose input counts outgrow its rows. */
static void test_coverage_check_names_unknown_ops(void **state) {
    (void)state;
    char msg[1024];
    const ebb_op newcomer = {.name = "conformance_newcomer", .min_inputs = 1, .max_inputs = 1};
    assert_int_equal(missing_cases(&newcomer, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "'conformance_newcomer'"));
    const ebb_op wider = {.name = "gru_cell", .min_inputs = 1, .max_inputs = 3};
    assert_int_equal(missing_cases(&wider, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "for 3 input(s)"));
    assert_int_equal(missing_cases(ebb_op_find("average"), msg, sizeof msg), 0);
}

/* ---- one case ------------------------------------------------------------------ */

typedef struct report {
    int failures;
    int runs; /* cases that compiled and ran */
} report;

static const char *const input_names[MAX_IN] = {"x", "u1", "u2", "u3", "u4"};

/* "average, 3 inputs [4, 8] [4, 8] [4, 8], float32, attrs '...'" */
static void describe(char *buf, size_t size, const char *op, const conf_case *c,
                     const ebb_shape *shapes, int n_in, ebb_dtype dt) {
    int len = snprintf(buf, size, "%s, %d input(s)", op, n_in);
    for (int i = 0; i < n_in && len > 0 && (size_t)len < size; i++) {
        char s[96];
        len += snprintf(buf + len, size - (size_t)len, " %s",
                        ebb_shape_str(&shapes[i], s, sizeof s));
    }
    if (len > 0 && (size_t)len < size)
        snprintf(buf + len, size - (size_t)len, ", %s%s, attrs '%s'", ebb_dtype_name(dt),
                 c->indices ? " params (int64 indices)" : "", c->attrs ? c->attrs : "");
}

static void fail_case(report *r, const char *what, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void fail_case(report *r, const char *what, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    print_error("[%s] %s\n", what, msg);
    r->failures++;
}

/* masked_fill's and where's second inputs are bool masks */
static int bool_mask(const conf_case *c, int i) {
    return (i == 1 && strcmp(c->op, "masked_fill") == 0) ||
           (i == 1 && strcmp(c->op, "where") == 0);
}

static void case_shapes(const conf_case *c, int n_in, ebb_shape *shapes, ebb_dtype *dtypes,
                        ebb_dtype dt) {
    for (int i = 0; i < n_in; i++) {
        shapes[i] = c->n_in == 0 && c->in[i].ndim == 0 ? c->in[0] : c->in[i];
        int ints = (i == 0 && c->indices) || (i == 1 && target_classes(c) > 0);
        dtypes[i] = bool_mask(c, i) ? EBB_BOOL : ints ? EBB_INT64 : dt;
    }
}

/* A graph whose first node is `op` applied to inputs x, u1, ... (`using`),
 * optionally preceded by `before` on x (then op reads its output). */
static ebb_graph *graph_of(const char *before, const char *before_attrs, const char *op,
                           const char *attrs, int n_in) {
    ebb_builder *b = ebb_builder_new("conformance");
    for (int i = 0; i < n_in; i++)
        ebb_input(b, input_names[i]);
    if (before) {
        ebb_from(b, ebb_node_op(b, before, before_attrs));
        if (n_in > 1)
            ebb_usingv(b, input_names + 1, n_in - 1);
        ebb_through(b, ebb_node_op(b, op, attrs));
    } else {
        if (n_in > 1)
            ebb_usingv(b, input_names + 1, n_in - 1);
        ebb_from(b, ebb_node_op(b, op, attrs));
    }
    ebb_graph *g = ebb_build(b);
    ebb_builder_free(b);
    return g;
}

static ebb_status make_inputs(const conf_case *c, int n_in, const ebb_shape *shapes,
                              const ebb_dtype *dtypes, ebb_tensor **in) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < n_in; i++) {
        if (dtypes[i] == EBB_INT64) {
            ebb_tensor *u = NULL;
            int64_t hi = i ? target_classes(c) : c->indices;
            st = ebb_tensor_uniform(&u, &shapes[i], 0.0, (double)hi, EBB_FLOAT64, CPU,
                                    11 + (uint64_t)i);
            if (st == EBB_OK)
                st = ebb_tensor_cast(&in[i], u, EBB_INT64);
            ebb_tensor_free(u);
        } else if (dtypes[i] == EBB_BOOL) {
            ebb_tensor *u = NULL;
            st = ebb_tensor_randn(&u, &shapes[i], EBB_FLOAT32, CPU, 11 + (uint64_t)i);
            if (st == EBB_OK)
                st = ebb_tensor_compare(&in[i], EBB_GT, u, 0.0);
            ebb_tensor_free(u);
        } else if (i == 1 && target_classes(c) < 0) {
            st = ebb_tensor_uniform(&in[i], &shapes[i], 0.0, 1.0, dtypes[i], CPU, 12);
        } else if (ebb_test_positive_input(c->op, i)) {
            st = ebb_tensor_uniform(&in[i], &shapes[i], 0.5, 2.0, dtypes[i], CPU,
                                    11 + (uint64_t)i);
        } else {
            st = ebb_tensor_randn(&in[i], &shapes[i], dtypes[i], CPU, 11 + (uint64_t)i);
        }
        if (st == EBB_OK && DEV.type != EBB_DEVICE_CPU) {
            ebb_tensor *d = NULL;
            st = ebb_tensor_to(&d, in[i], DEV, dtypes[i]);
            ebb_tensor_free(in[i]);
            in[i] = d;
        }
    }
    return st;
}

static void free_all(ebb_tensor **t, int n) {
    for (int i = 0; i < n; i++) {
        ebb_tensor_free(t[i]);
        t[i] = NULL;
    }
}

/* Whether the plan must match the run to the byte: unless the case's row
 * marks the op's figure as a bound for this dtype, and with one intra-op
 * thread (as ctest runs it), since some kernels size their scratch by the
 * thread count; otherwise the run must stay within the plan. */
static int exact_for(const conf_case *c, ebb_dtype dt) {
    unsigned bit = dt == EBB_FLOAT64 ? BOUND_F64 : BOUND_F32;
    return !(c->bound & bit) && ebb_tensor_num_threads() == 1;
}

/* Compiles `g`, runs it on `in` and checks the measured peak against the
 * planned one. Returns the output (a new handle) or NULL after a failure. */
static ebb_tensor *run_checked(report *r, const char *what, const ebb_graph *g,
                               const ebb_shape *shapes, const ebb_dtype *dtypes, int n_in,
                               ebb_dtype dt, int keep_all, int exact, ebb_tensor **in,
                               ebb_plan **plan_out) {
    ebb_compile_options o = {.input_shapes = shapes, .n_input_shapes = n_in, .dtype = dt,
                             .input_dtypes = dtypes, .keep_all = keep_all, .device = DEV};
    ebb_plan *p = NULL;
    ebb_model *m = NULL;
    ebb_tensor *y = NULL;
    *plan_out = NULL;
    if (ebb_compile(&p, g, &o) != EBB_OK) {
        fail_case(r, what, "ebb_compile: %s", ebb_errmsg());
        return NULL;
    }
    if (ebb_model_new(&m, p, DEV, 5) != EBB_OK) {
        fail_case(r, what, "ebb_model_new: %s", ebb_errmsg());
        ebb_plan_free(p);
        return NULL;
    }
    /* on CUDA, cuDNN's and attention's kernels are chosen by the device:
     * their plans say they are a bound there */
    if (DEV.type == EBB_DEVICE_CUDA && ebb_plan_peak_is_bound_on(p, DEV))
        exact = 0;
    ebb_run_stats st;
    if (ebb_run(p, m, in, &y, &st) != EBB_OK) {
        fail_case(r, what, "ebb_run: %s", ebb_errmsg());
    } else if (exact ? st.measured_peak_bytes != st.planned_peak_bytes
                     : st.measured_peak_bytes > st.planned_peak_bytes) {
        /* the op is the last step; what it adds is its output plus workspace */
        int last = ebb_plan_step_count(p) - 1;
        const ebb_plan_step *s = ebb_plan_step_at(p, last);
        int64_t out = ebb_plan_value_at(p, s->out[0])->nbytes;
        int64_t before = last > 0 ? ebb_plan_step_at(p, last - 1)->live_bytes : 0;
        fail_case(r, what,
                  "measured peak %lld B, planned %lld B%s (the op's step: output %lld B%s, "
                  "declared workspace %lld B)",
                  (long long)st.measured_peak_bytes, (long long)st.planned_peak_bytes,
                  exact ? "" : " as an upper bound",
                  (long long)out, s->in_place ? " (in place)" : "",
                  (long long)(s->peak_bytes - before - out));
        ebb_tensor_free(y);
        y = NULL;
    }
    ebb_model_free(m);
    if (y) {
        r->runs++;
        *plan_out = p;
    } else {
        ebb_plan_free(p);
    }
    return y;
}

static void check_forward(report *r, const ebb_op *op, const conf_case *c, int n_in, ebb_dtype dt) {
    ebb_shape shapes[MAX_IN];
    ebb_dtype dtypes[MAX_IN];
    char what[512];
    case_shapes(c, n_in, shapes, dtypes, dt);
    describe(what, sizeof what, op->name, c, shapes, n_in, dt);

    ebb_graph *g = graph_of(NULL, NULL, op->name, c->attrs, n_in);
    if (!g) {
        fail_case(r, what, "ebb_build: %s", ebb_errmsg());
        return;
    }
    ebb_tensor *in[MAX_IN] = {NULL}, *before[MAX_IN] = {NULL};
    if (make_inputs(c, n_in, shapes, dtypes, in) != EBB_OK) {
        fail_case(r, what, "making inputs: %s", ebb_errmsg());
        goto done;
    }
    for (int i = 0; i < n_in; i++)
        if (ebb_tensor_clone(&before[i], in[i]) != EBB_OK) {
            fail_case(r, what, "ebb_tensor_clone: %s", ebb_errmsg());
            goto done;
        }
    ebb_plan *p = NULL;
    ebb_tensor *y = run_checked(r, what, g, shapes, dtypes, n_in, dt, 0, exact_for(c, dt), in, &p);
    if (!y)
        goto done;
    if (ebb_plan_step_count(p) != 1 || ebb_plan_step_at(p, 0)->kind != EBB_STEP_OP) {
        fail_case(r, what, "a one-node graph compiled to %d steps", ebb_plan_step_count(p));
    } else {
        const ebb_plan_value *v = ebb_plan_value_at(p, ebb_plan_output_slot(p, 0));
        ebb_shape ys = ebb_tensor_shape(y);
        char a[96], b[96];
        if (!ebb_shape_equal(&ys, &v->shape))
            fail_case(r, what, "output shape %s, the dry run said %s",
                      ebb_shape_str(&ys, a, sizeof a), ebb_shape_str(&v->shape, b, sizeof b));
        if (ebb_tensor_dtype(y) != v->dtype)
            fail_case(r, what, "output dtype %s, the dry run said %s",
                      ebb_dtype_name(ebb_tensor_dtype(y)), ebb_dtype_name(v->dtype));
        for (int i = 0; i < n_in; i++) {
            int planned = v->alias_of == ebb_plan_input_slot(p, i);
            int shares = ebb_tensor_same_storage(y, in[i]);
            if (planned != shares)
                fail_case(r, what, "the output %s input %d's storage, the dry run said it %s",
                          shares ? "shares" : "does not share", i, planned ? "does" : "does not");
        }
        for (int i = 0; i < n_in; i++) {
            double d = 0.0;
            if (op->state_inputs & (1u << i))
                continue; /* state the op writes: a key/value cache */
            if (ebb_tensor_max_abs_diff(in[i], before[i], &d) != EBB_OK || d != 0.0)
                fail_case(r, what, "input %d changed (max |difference| %g)", i, d);
        }
    }
    ebb_tensor_free(y);
    ebb_plan_free(p);
done:
    free_all(in, MAX_IN);
    free_all(before, MAX_IN);
    ebb_graph_free(g);
}

/* x -> scale(factor=1) -> op: the op's input is an intermediate that dies
 * there, so the plan runs it in place. The same graph with keep_all runs it
 * out of place; both must keep their planned peaks and agree on the values. */
static void check_in_place(report *r, const ebb_op *op, const conf_case *c, ebb_dtype dt) {
    ebb_shape shape[1];
    ebb_dtype dtype[1];
    char what[512];
    case_shapes(c, 1, shape, dtype, dt);
    describe(what, sizeof what, op->name, c, shape, 1, dt);
    strncat(what, ", in place", sizeof what - strlen(what) - 1);

    ebb_graph *g = graph_of("scale", "factor=1", op->name, c->attrs, 1);
    if (!g) {
        fail_case(r, what, "ebb_build: %s", ebb_errmsg());
        return;
    }
    ebb_tensor *in[1] = {NULL};
    ebb_plan *p = NULL, *pk = NULL;
    ebb_tensor *y = NULL, *yk = NULL;
    if (make_inputs(c, 1, shape, dtype, in) != EBB_OK) {
        fail_case(r, what, "making inputs: %s", ebb_errmsg());
        goto done;
    }
    y = run_checked(r, what, g, shape, dtype, 1, dt, 0, exact_for(c, dt), in, &p);
    yk = run_checked(r, what, g, shape, dtype, 1, dt, 1, exact_for(c, dt), in, &pk);
    if (!y || !yk)
        goto done;
    if (ebb_plan_step_count(p) != 2 || !ebb_plan_step_at(p, 1)->in_place) {
        fail_case(r, what, "the op has forward_inplace but the plan does not run it in place");
        goto done;
    }
    double d = 0.0;
    if (ebb_tensor_max_abs_diff(y, yk, &d) != EBB_OK || d != 0.0)
        fail_case(r, what, "in place and out of place differ (max |difference| %g)", d);
done:
    ebb_tensor_free(y);
    ebb_tensor_free(yk);
    ebb_plan_free(p);
    ebb_plan_free(pk);
    free_all(in, 1);
    ebb_graph_free(g);
}

/* ---- the suite ------------------------------------------------------------------ */

static void test_forward_keeps_the_plan(void **state) {
    (void)state;
    if (ebb_tensor_num_threads() != 1)
        print_message("note: %d intra-op threads; byte counts are exact for one "
                      "(OMP_NUM_THREADS=1, as ctest sets), so runs are checked against the plan as "
                      "a bound\n",
                      ebb_tensor_num_threads());
    report r = {0, 0};
    int ops = 0;
    for (int k = 0; k < ebb_op_count(); k++) {
        const ebb_op *op = ebb_op_at(k);
        int before = r.runs;
        for (int n = op->min_inputs; n <= max_count(op); n++)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                for (size_t d = 0; d < sizeof float_dtypes / sizeof float_dtypes[0]; d++)
                    if (case_fits(&cases[i], op, n))
                        check_forward(&r, op, &cases[i], n, float_dtypes[d]);
        ops += r.runs > before;
    }
    if (r.failures)
        fail_msg("%d conformance failure(s), listed above (%d runs kept their plan)", r.failures,
                 r.runs);
    /* every op with rows ran; test_every_op_has_cases reports those without */
    char msg[1024];
    int covered = 0;
    for (int k = 0; k < ebb_op_count(); k++)
        covered += missing_cases(ebb_op_at(k), msg, sizeof msg) == 0;
    assert_true(ops >= covered);
}

static void test_in_place_keeps_the_plan(void **state) {
    (void)state;
    report r = {0, 0};
    int ops = 0;
    for (int k = 0; k < ebb_op_count(); k++) {
        const ebb_op *op = ebb_op_at(k);
        if (!op->forward_inplace)
            continue;
        ops++;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (size_t d = 0; d < sizeof float_dtypes / sizeof float_dtypes[0]; d++)
                if (op->min_inputs <= 1 && case_fits(&cases[i], op, 1))
                    check_in_place(&r, op, &cases[i], float_dtypes[d]);
    }
    if (r.failures)
        fail_msg("%d in-place conformance failure(s) (listed above)", r.failures);
    assert_true(ops > 0);
    assert_true(r.runs >= 2 * MIN_CASES * ops);
}

/* What each descriptor says of itself holds for its schema: a LOW op
 * (autocast's matrix products) multiplies parameters or inputs together, an
 * op of CLASSES indices takes the classes as a second input (and an integer
 * ignore_index if any), one of ROWS has the table's rows in an integer
 * "num"; and the ops that say nothing keep the defaults. */
static void test_descriptors_hold(void **state) {
    (void)state;
    int n_low = 0, n_indices = 0;
    for (int k = 0; k < ebb_op_count(); k++) {
        const ebb_op *op = ebb_op_at(k);
        int two = op->max_inputs < 0 || op->max_inputs >= 2;
        if ((unsigned)op->autocast > EBB_AUTOCAST_KEEP || (unsigned)op->indices > EBB_INDICES_ROWS)
            fail_msg("%s: autocast %d, indices %d: not an enum value", op->name, (int)op->autocast,
                     (int)op->indices);
        if (op->autocast == EBB_AUTOCAST_LOW && !op->params && !two)
            fail_msg("%s is autocast LOW but has no parameters and one input: nothing to "
                     "multiply",
                     op->name);
        int ignore = ebb_op_attr_index(op, "ignore_index"), num = ebb_op_attr_index(op, "num");
        if (op->indices == EBB_INDICES_CLASSES && op->max_inputs >= 0 && op->max_inputs < 2)
            fail_msg("%s holds class indices in in[1]: it takes %d to %d inputs", op->name,
                     op->min_inputs, op->max_inputs);
        if (op->indices == EBB_INDICES_CLASSES && ignore >= 0 &&
            op->attrs[ignore].type != EBB_ATTR_INT)
            fail_msg("%s: its ignore_index is not an integer", op->name);
        if (op->indices == EBB_INDICES_ROWS && (num < 0 || op->attrs[num].type != EBB_ATTR_INT))
            fail_msg("%s holds row indices in in[0] but has no integer attr \"num\"", op->name);
        n_low += op->autocast == EBB_AUTOCAST_LOW;
        n_indices += op->indices != EBB_INDICES_NONE;
    }
    /* linear, the convolutions, matmul, attention; two losses and embedding */
    assert_true(n_low >= 6);
    assert_true(n_indices >= 3);
    assert_int_equal(ebb_op_find("linear")->autocast, EBB_AUTOCAST_LOW);
    assert_int_equal(ebb_op_find("relu")->autocast, EBB_AUTOCAST_PROMOTE);
    assert_int_equal(ebb_op_find("relu")->indices, EBB_INDICES_NONE);
}

int main(void) {
    DEV = ebb_test_device();
    const struct CMUnitTest tests[] = {
        EBB_TEST(test_every_op_has_cases),
        EBB_TEST(test_descriptors_hold),
        EBB_TEST(test_coverage_check_names_unknown_ops),
        EBB_TEST(test_forward_keeps_the_plan),
        EBB_TEST(test_in_place_keeps_the_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
