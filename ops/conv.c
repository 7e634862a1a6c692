/* conv1d and conv2d, PyTorch's layout: weight [out, in/groups, k(, k)],
 * bias [out]; square kernels, one stride/padding/dilation for every
 * spatial dim. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "ops_internal.h"

enum { A_OUT, A_IN, A_KERNEL, A_STRIDE, A_PADDING, A_DILATION, A_GROUPS, A_BIAS };

static const ebb_attr_spec conv_attrs[] = {
    {.name = "out", .type = EBB_ATTR_INT, .required = 1, .doc = "output channels"},
    {.name = "in", .type = EBB_ATTR_INT, .optional = 1,
     .doc = "input channels (inferred from the input's channel dim)"},
    {.name = "kernel", .type = EBB_ATTR_INT, .required = 1, .doc = "kernel size (square)"},
    {.name = "stride", .type = EBB_ATTR_INT, .default_number = 1, .doc = "step between windows"},
    {.name = "padding", .type = EBB_ATTR_INT, .default_number = 0,
     .doc = "zeros added on both sides of every spatial dim"},
    {.name = "dilation", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "spacing between kernel elements"},
    {.name = "groups", .type = EBB_ATTR_INT, .default_number = 1,
     .doc = "blocked connections; must divide in and out"},
    {.name = "bias", .type = EBB_ATTR_BOOL, .default_number = 1, .doc = "add a learned bias"},
};

/* Checks the attributes against the input shape x ([N, C, *spatial] or
 * [C, *spatial]) and returns the input channel count. */
static ebb_status conv_check(const char *op, int nsp, const ebb_attr_value *a, const ebb_shape *x,
                             int64_t *in_channels) {
    char buf[128];
    const char *layout = nsp == 1 ? "[N, C, L] or [C, L]" : "[N, C, H, W] or [C, H, W]";
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be %s", op,
                             ebb_shape_str(x, buf, sizeof buf), layout);
    int cdim = x->ndim - nsp - 1;
    int64_t ch = x->dim[cdim];
    if (a[A_IN].set && a[A_IN].i != ch)
        return ebb_error_set(
            EBB_ERR_SHAPE, "%s: in=%lld but the input %s has %lld channels (dim %d)", op,
            (long long)a[A_IN].i, ebb_shape_str(x, buf, sizeof buf), (long long)ch, cdim);
    int64_t out = a[A_OUT].i, k = a[A_KERNEL].i, g = a[A_GROUPS].i;
    if (out < 1 || k < 1 || a[A_STRIDE].i < 1 || a[A_PADDING].i < 0 || a[A_DILATION].i < 1 || g < 1)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: out=%lld kernel=%lld stride=%lld padding=%lld dilation=%lld "
                             "groups=%lld (need out, kernel, stride, dilation, groups >= 1 and "
                             "padding >= 0)",
                             op, (long long)out, (long long)k, (long long)a[A_STRIDE].i,
                             (long long)a[A_PADDING].i, (long long)a[A_DILATION].i, (long long)g);
    if (ch % g != 0 || out % g != 0)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: groups=%lld must divide in=%lld and out=%lld", op,
                             (long long)g, (long long)ch, (long long)out);
    int64_t span = a[A_DILATION].i * (k - 1) + 1;
    for (int d = x->ndim - nsp; d < x->ndim; d++)
        if (x->dim[d] + 2 * a[A_PADDING].i < span)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: input %s is smaller than kernel %lld (padding %lld, "
                                 "dilation %lld)",
                                 op, ebb_shape_str(x, buf, sizeof buf), (long long)k,
                                 (long long)a[A_PADDING].i, (long long)a[A_DILATION].i);
    *in_channels = ch;
    return EBB_OK;
}

static ebb_status conv_params(const char *op, int nsp, const ebb_attr_value *a,
                              const ebb_shape *in, ebb_param_spec *p, int *n) {
    int64_t ch = 0;
    ebb_status st = conv_check(op, nsp, a, &in[0], &ch);
    if (st != EBB_OK)
        return st;
    int64_t k = a[A_KERNEL].i, per_group = ch / a[A_GROUPS].i;
    int64_t fan_in = per_group * k * (nsp == 2 ? k : 1);
    p[0] = (ebb_param_spec){"weight", EBB_SHAPE(a[A_OUT].i, per_group, k), EBB_INIT_UNIFORM_FAN_IN,
                            fan_in, 0, 0, 0};
    if (nsp == 2)
        p[0].shape = EBB_SHAPE(a[A_OUT].i, per_group, k, k);
    *n = 1;
    if (a[A_BIAS].i)
        p[(*n)++] =
            (ebb_param_spec){"bias", EBB_SHAPE(a[A_OUT].i), EBB_INIT_UNIFORM_FAN_IN, fan_in, 0, 0, 0};
    return EBB_OK;
}

static ebb_status conv1d_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_param_spec *p, int *n) {
    (void)n_in;
    return conv_params("conv1d", 1, a, in, p, n);
}

static ebb_status conv2d_params(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_param_spec *p, int *n) {
    (void)n_in;
    return conv_params("conv2d", 2, a, in, p, n);
}

static ebb_status conv_fwd(const char *op, int nsp, const ebb_op_call *c, ebb_tensor **out) {
    *out = NULL;
    const ebb_attr_value *a = c->attrs;
    ebb_shape x = ebb_tensor_shape(c->in[0]);
    int64_t ch = 0;
    ebb_status st = conv_check(op, nsp, a, &x, &ch);
    if (st != EBB_OK)
        return st;
    if (c->n_params < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: no weight given", op);
    int64_t stride[2] = {a[A_STRIDE].i, a[A_STRIDE].i};
    int64_t padding[2] = {a[A_PADDING].i, a[A_PADDING].i};
    int64_t dilation[2] = {a[A_DILATION].i, a[A_DILATION].i};
    return ebb_tensor_conv(out, c->in[0], c->params[0], c->n_params > 1 ? c->params[1] : NULL,
                           stride, padding, dilation, a[A_GROUPS].i);
}

static ebb_status conv1d_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return conv_fwd("conv1d", 1, c, out);
}

static ebb_status conv2d_fwd(const ebb_op_call *c, ebb_tensor **out) {
    return conv_fwd("conv2d", 2, c, out);
}

/* ---- workspace ---------------------------------------------------------------
 *
 * What libtorch 1.13 allocates on the CPU inside one convolution, beyond the
 * output. A 1-D convolution runs as a 2-D one of height 1 (kernel 1 x k).
 *
 * The native path (float64, and float32 where oneDNN is not chosen) is exact:
 *  - without dilation (slow_conv2d), an im2col buffer for the whole batch,
 *    N x C/g*K x output positions, unless the kernel is 1x1 with stride 1
 *    and no padding, where the input is used as is;
 *  - with dilation (slow_conv_dilated2d), the same buffer for one sample,
 *    reused across the batch;
 *  - with groups > 1, one convolution per group: each group's input slice is
 *    copied when the batch has more than one sample (the slice is not
 *    contiguous), its buffer made and freed, and the group outputs, all kept,
 *    are concatenated into the result at the end (twice the output).
 *
 * float32 goes to oneDNN (mkldnn) under libtorch's use_mkldnn() rule. oneDNN
 * reorders the input and weights into channel-blocked layouts, computes into
 * a blocked output and then copies that into the dense result. Which of its
 * kernels runs, and so what it allocates, depends on the CPU and on
 * heuristics that cannot be replayed from shapes: that figure is an upper
 * bound (mkldnn_workspace_bound), exact in practice for plain layers on AVX2
 * (docs/ops.md).
 *
 * float16 has no CPU kernels in libtorch 1.13: ebb_tensor_conv copies the
 * input, weight and bias to float32, convolves (as above) and casts back,
 * after libtorch's own float16 attempt has failed. That is a bound too. */

/* One convolution's sizes, as libtorch sees them: a 2-D one, batched. */
typedef struct conv_dims {
    int64_t n, c, o, g, k, sp_in, sp_out, k_numel;
    int strided, dilated, padded, bias;
    int64_t pad;
    int64_t kh, kw, h, w; /* kh = h = 1 for conv1d */
} conv_dims;

static int conv_dims_of(int nsp, const ebb_attr_value *a, const ebb_shape *x, conv_dims *d) {
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1)
        return -1;
    memset(d, 0, sizeof *d);
    d->n = x->ndim == nsp + 2 ? x->dim[0] : 1;
    d->c = x->dim[x->ndim - nsp - 1];
    d->o = a[A_OUT].i;
    d->g = a[A_GROUPS].i;
    d->k = a[A_KERNEL].i;
    int64_t s = a[A_STRIDE].i, p = a[A_PADDING].i, dl = a[A_DILATION].i;
    if (d->g < 1 || d->k < 1 || s < 1 || dl < 1 || p < 0)
        return -1;
    d->sp_in = d->sp_out = d->k_numel = 1;
    for (int i = x->ndim - nsp; i < x->ndim; i++) {
        int64_t n = (x->dim[i] + 2 * p - dl * (d->k - 1) - 1) / s + 1;
        if (n < 1)
            return -1;
        d->sp_in *= x->dim[i];
        d->sp_out *= n;
        d->k_numel *= d->k;
    }
    d->kh = nsp == 2 ? d->k : 1;
    d->kw = d->k;
    d->h = nsp == 2 ? x->dim[x->ndim - 2] : 1;
    d->w = x->dim[x->ndim - 1];
    d->strided = s != 1;
    d->dilated = dl != 1;
    d->padded = p != 0;
    d->pad = p;
    d->bias = a[A_BIAS].i != 0;
    return 0;
}

/* libtorch 1.13's ConvParams::use_mkldnn for a CPU float32 input. */
static int uses_mkldnn(const conv_dims *d, int threads) {
    int not_1x1 = d->strided || d->dilated || d->n >= 16 || d->kw != 1 || d->kh != 1 ||
                  threads > 1;
    int worth_it = d->g > 1 || (d->kw > 3 && d->kh > 3) || d->n > 1 ||
                   d->n * d->c * d->h * d->w > 20480;
    return not_1x1 && worth_it;
}

static int64_t native_workspace(const conv_dims *d, int64_t e) {
    int64_t cg = d->c / d->g, out = d->n * d->o * d->sp_out * e;
    int64_t per_sample = cg * d->k_numel * d->sp_out * e, cols;
    if (d->dilated)
        cols = per_sample;
    else if (d->k_numel == 1 && !d->strided && !d->padded)
        cols = 0;
    else
        cols = d->n * per_sample;
    if (d->g == 1)
        return cols;
    int64_t slice = d->n > 1 ? d->n * cg * d->sp_in * e : 0;
    return slice + cols > out ? slice + cols : out;
}

/* Whether s starts with prefix, ignoring case. */
static int starts_with_nocase(const char *s, const char *prefix) {
    for (; *prefix; s++, prefix++)
        if (tolower((unsigned char)*s) != tolower((unsigned char)*prefix))
            return 0;
    return 1;
}

/* oneDNN's channel block: 16 floats with AVX-512, 8 on AVX2 (and the SSE4.1
 * and AVX kernels); 16 where the CPU cannot be asked. oneDNN's own cap on
 * the instruction set (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA before 3.0)
 * lowers it as it lowers the kernels. */
static int64_t onednn_block(void) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
    if (!cap || !*cap)
        cap = getenv("DNNL_MAX_CPU_ISA");
    if (cap && *cap && !starts_with_nocase(cap, "ALL") && !starts_with_nocase(cap, "AVX512") &&
        !starts_with_nocase(cap, "AVX10"))
        return 8;
    return __builtin_cpu_supports("avx512f") ? 16 : 8;
#else
    return 16;
#endif
}

static int64_t round_up(int64_t x, int64_t b) { return (x + b - 1) / b * b; }

/* The layers of ordinary CNNs, which oneDNN's direct kernels take on every
 * CPU it supports: no groups or dilation, kernels up to 3x3 with at most
 * "same" padding, and no strided 1x1. */
static int plain_layer(const conv_dims *d) {
    return d->g == 1 && !d->dilated && d->k <= 3 && d->pad <= d->k / 2 &&
           !(d->k == 1 && d->strided);
}

/* Which oneDNN kernel runs decides the buffers; bounded here as:
 *  - a depthwise convolution blocks the channels themselves;
 *  - otherwise channels are blocked per group, except a first layer
 *    (groups 1, under 8 input channels, a kernel over 1x1) that reads the
 *    plain input, with its weights blocked by output channel only;
 *  - some shapes (grouped channels off the block, padding as wide as the
 *    kernel, large kernels on few channels, ...) fall to its im2col (gemm)
 *    kernel, and a strided 1x1 to one that gathers the strided input:
 *    per-thread scratch of one sample's columns. The rules for that choice
 *    weigh register blocking and cache sizes and differ between oneDNN
 *    versions, so outside plain_layer() the scratch is always counted, at
 *    the thread count at plan time. */
static int64_t mkldnn_workspace_bound(const conv_dims *d, int threads) {
    const int64_t e = 4, align = 128, blk = onednn_block();
    int64_t cg = d->c / d->g, og = d->o / d->g;
    int depthwise = d->g > 1 && cg == 1;
    int64_t src, wts, dst;
    if (depthwise) {
        src = d->n * round_up(d->c, blk) * d->sp_in;
        wts = round_up(d->g, blk) * og * d->k_numel;
        dst = d->n * round_up(d->o, blk) * d->sp_out;
    } else {
        int flat = d->g == 1 && d->c < 8 && d->k_numel > 1;
        src = flat ? 0 : d->n * d->g * round_up(cg, blk) * d->sp_in;
        wts = d->g * (flat ? cg : round_up(cg, blk)) * round_up(og, blk) * d->k_numel;
        dst = d->n * d->g * round_up(og, blk) * d->sp_out;
    }
    int64_t cols = threads * (round_up(cg, blk) * d->k_numel * d->sp_out * e + align);
    if (plain_layer(d))
        cols = 0;
    /* a bias whose channels do not fill the blocks is padded in scratch */
    int64_t bias = d->bias && (og % blk != 0 || d->o % blk != 0)
                       ? d->g * round_up(og, blk) * e + align
                       : 0;
    int64_t out = d->n * d->o * d->sp_out * e;
    int64_t during = (src + wts + dst) * e + bias + cols - out; /* before the dense copy */
    /* oneDNN 3 runs a layer whose window covers the whole unpadded input as
     * an inner product (matmul), which reorders the weights once more */
    if (d->sp_out == 1 && !d->padded && !plain_layer(d))
        during += threads * 65536 + wts * e;
    return during > dst * e ? during : dst * e;                /* the copy: dst + out */
}

static int64_t conv_workspace(int nsp, const ebb_attr_value *a, const ebb_shape *in,
                              ebb_dtype dt) {
    conv_dims d;
    if (conv_dims_of(nsp, a, &in[0], &d) != 0 || d.c % d.g != 0 || d.o % d.g != 0)
        return 0;
    int threads = ebb_tensor_num_threads();
    if (threads < 1)
        threads = 1;
    int64_t f32 = uses_mkldnn(&d, threads) ? mkldnn_workspace_bound(&d, threads)
                                           : native_workspace(&d, 4);
    switch (dt) {
    case EBB_FLOAT32: return f32;
    case EBB_FLOAT64: return native_workspace(&d, 8);
    case EBB_BFLOAT16: {
        /* libtorch gives bfloat16 to oneDNN only on CPUs with AVX-512 (BW,
         * VL, DQ), and to its native path elsewhere */
        int64_t native = native_workspace(&d, 2);
        int64_t mk = mkldnn_workspace_bound(&d, threads);
        return native > mk ? native : mk;
    }
    case EBB_FLOAT16: {
        int64_t out16 = d.n * d.o * d.sp_out * 2, out32 = 2 * out16;
        int64_t copies = (d.n * d.c * d.sp_in + d.o * (d.c / d.g) * d.k_numel +
                          (a[A_BIAS].i ? d.o : 0)) * 4;
        /* libtorch first tries float16 itself, and its native path makes the
         * output and buffers before the kernel refuses the type */
        int64_t during = copies + out32 + f32 - out16, cast = out32;
        int64_t tried = native_workspace(&d, 2);
        int64_t ws = during > cast ? during : cast;
        return tried > ws ? tried : ws;
    }
    default: return 0;
    }
}

static int64_t conv1d_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_dtype dt) {
    (void)n_in;
    return conv_workspace(1, a, in, dt);
}

static int64_t conv2d_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                ebb_dtype dt) {
    (void)n_in;
    return conv_workspace(2, a, in, dt);
}

/* On CUDA, cuDNN picks the engine, and with it the workspace, by device
 * and shape: the CPU's figure is the estimate there (both ops set
 * workspace_cuda to it, marked a bound), and a plan compiled for a CUDA
 * device measures the step there instead (graph/measure.c). On an H100 a
 * 7x7 kernel on a 7x7 map took 2.75 times the estimate. */

/* ---- backward rule: convolution_backward, from the input and the weight --- */

static ebb_status conv_bwd(const ebb_op_grad_call *c, ebb_tensor **gin, ebb_tensor **gp) {
    const ebb_attr_value *a = c->attrs;
    if (c->n_params < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s backward: no weight given", c->op->name);
    int64_t stride[2] = {a[A_STRIDE].i, a[A_STRIDE].i};
    int64_t padding[2] = {a[A_PADDING].i, a[A_PADDING].i};
    int64_t dilation[2] = {a[A_DILATION].i, a[A_DILATION].i};
    /* the first layer's input gradient (the images') nothing reads: skipped,
     * as PyTorch skips it; the scratch figure above stays a bound */
    ebb_tensor **gx = (c->skip_input_grad & 1u) ? NULL : &gin[0];
    ebb_status st = ebb_tensor_conv_backward(gx, &gp[0], c->n_params > 1 ? &gp[1] : NULL,
                                             c->grad_out, c->in[0], c->params[0], stride, padding,
                                             dilation, a[A_GROUPS].i);
    if (st != EBB_OK)
        ebb_error_prefix("%s", c->op->name);
    return st;
}
/* ---- backward workspace ----------------------------------------------------------
 *
 * What libtorch 1.13's convolution_backward allocates on the CPU beside the
 * three gradients it returns, on the same paths as the forward.
 *
 * The native path is exact. Per group (the whole convolution when groups is
 * 1):
 *  - without dilation (slow_conv2d), the weight's gradient unfolds the
 *    whole batch's input into columns, N x C/g*K x output positions (none
 *    for a 1x1 kernel with stride 1 and no padding); the input's gradient
 *    folds one sample's columns at a time, which is never more;
 *  - with dilation (slow_conv_dilated2d), one sample's columns, and per
 *    sample the bias's partial sum (out/g);
 *  - with groups > 1, each group's slices of grad_out and of the input are
 *    copied when the batch has more than one sample; every group's three
 *    gradients are kept until they are concatenated into the results, so
 *    the concatenation holds the gradients twice.
 *
 * float32 through oneDNN is bounded, as the forward is: the backward of
 * the input computes a blocked input gradient from blocked copies of
 * grad_out and the weights, then copies it out; the backward of the weights
 * reads blocked copies of the input and grad_out, and accumulates the
 * weights' (and bias's) gradients in blocked buffers. With several threads
 * a layer with few output channels splits the batch between them and sums
 * per-thread partial gradients: measured at about 25 KiB per extra thread
 * however small the weights (AVX2), and up to twice the blocked weights
 * (AVX-512), counted as two blocked weight copies plus 32 KiB. Outside
 * plain_layer() a kernel may work through one sample's columns per thread,
 * and a strided 1x1 gathers its strided input per thread: measured at up to
 * 36 floats per input position, counted as 64. */

/* Scratch of one native convolution without groups (d->g == 1), or of one
 * group of it, beside its gradients. */
static int64_t native_bwd_group(const conv_dims *d, int64_t e) {
    int64_t cg = d->c / d->g, og = d->o / d->g;
    if (d->dilated)
        return (cg * d->k_numel * d->sp_out + (d->bias ? og : 0)) * e;
    if (d->k_numel == 1 && !d->strided && !d->padded)
        return 0;
    return d->n * cg * d->k_numel * d->sp_out * e;
}

static int64_t native_bwd_workspace(const conv_dims *d, int64_t e) {
    int64_t group = native_bwd_group(d, e);
    if (d->g == 1)
        return group;
    int64_t cg = d->c / d->g, og = d->o / d->g;
    int64_t copies = d->n > 1 ? d->n * (cg * d->sp_in + og * d->sp_out) * e : 0;
    int64_t grads = (d->n * d->c * d->sp_in + d->o * cg * d->k_numel + (d->bias ? d->o : 0)) * e;
    return copies + group > grads ? copies + group : grads;
}

/* Whether oneDNN's direct kernels take both halves of the backward on every
 * CPU: a plain layer, unstrided, whose input is at least the kernel in each
 * dim (AVX2's direct weights kernel needs the kernel's height of input rows:
 * a 3x3 layer on a 2x2 map falls to gemm there). */
static int direct_backward(const conv_dims *d) {
    return plain_layer(d) && !d->strided && d->h >= d->kh && d->w >= d->kw;
}

/* The backward's allowance for oneDNN's other kernels, beside the direct
 * figure: gemm (im2col) weights kernels keep about four weight-sized buffers
 * and one sample's columns per thread; oneDNN 3's brgemm kernels a fixed
 * block of scratch per thread (about 56 KiB); and its strided data kernels
 * a blocked copy of the whole input gradient. Measured on a grid of small
 * maps, strides, dilations, groups and batches (docs/ops.md). */
static int64_t other_kernels_bwd_bound(const conv_dims *d, int threads) {
    if (direct_backward(d))
        return 0;
    const int64_t e = 4, blk = onednn_block();
    int64_t cg = d->c / d->g, og = d->o / d->g;
    int64_t wts = d->g * round_up(cg, blk) * round_up(og, blk) * d->k_numel * e;
    int64_t cols = round_up(cg, blk) * d->k_numel * d->sp_out * e;
    int64_t strided = d->strided ? d->n * round_up(d->c, blk) * d->sp_in * e : 0;
    return threads * (4 * wts + cols + 65536) + strided;
}

static int64_t mkldnn_bwd_workspace_bound(const conv_dims *d, int threads) {
    const int64_t e = 4, align = 128, blk = onednn_block();
    int64_t cg = d->c / d->g, og = d->o / d->g;
    int depthwise = d->g > 1 && cg == 1;
    int64_t src, wts, dst, bias;
    if (depthwise) {
        src = d->n * round_up(d->c, blk) * d->sp_in;
        wts = round_up(d->g, blk) * og * d->k_numel;
        dst = d->n * round_up(d->o, blk) * d->sp_out;
        bias = d->bias ? round_up(d->o, blk) : 0;
    } else {
        src = d->n * d->g * round_up(cg, blk) * d->sp_in;
        wts = d->g * round_up(cg, blk) * round_up(og, blk) * d->k_numel;
        dst = d->n * d->g * round_up(og, blk) * d->sp_out;
        bias = d->bias ? d->g * round_up(og, blk) : 0;
    }
    int64_t per_thread = 0;
    if (!plain_layer(d)) {
        int64_t cols = round_up(cg, blk) * d->k_numel * d->sp_out;
        int64_t gather = d->k_numel == 1 && d->strided ? 64 * d->sp_in : 0;
        per_thread = threads * ((cols > gather ? cols : gather) * e + align);
    }
    /* partial weight gradients of the threads beyond the first */
    int64_t partial = 2 * (wts + bias) * e + 32768;
    /* a bias whose channels do not fill the blocks is padded in scratch */
    int64_t pad_bias = d->bias && (og % blk != 0 || d->o % blk != 0)
                           ? d->g * round_up(og, blk) * e + align
                           : 0;
    int64_t gx = d->n * d->c * d->sp_in * e, gw = d->o * cg * d->k_numel * e;
    int64_t gb = d->bias ? d->o * e : 0;
    int64_t phases[] = {
        (src + dst + wts) * e + per_thread,                   /* the input's gradient */
        src * e + gx,                                         /* ... copied out */
        gx + (src + dst + wts + bias) * e + per_thread + pad_bias + /* the weights' */
            (int64_t)(threads - 1) * partial,
        gx + (wts + bias) * e + gw + gb,                      /* ... copied out */
    };
    int64_t peak = 0;
    for (int i = 0; i < EBB_COUNT(phases); i++)
        peak = phases[i] > peak ? phases[i] : peak;
    return peak - gx - gw - gb + other_kernels_bwd_bound(d, threads);
}

static int64_t conv_bwd_workspace_of(int nsp, const ebb_attr_value *a, const ebb_shape *in,
                                     ebb_dtype dt) {
    conv_dims d;
    if (conv_dims_of(nsp, a, &in[0], &d) != 0 || d.c % d.g != 0 || d.o % d.g != 0)
        return 0;
    /* the stride libtorch is handed (ebb_tensor_conv_backward_stride): a
     * bfloat16 stride longer than its dim needs becomes the shortest */
    int64_t s = a[A_STRIDE].i, p = a[A_PADDING].i, dl = a[A_DILATION].i;
    d.strided = ebb_tensor_conv_backward_stride(d.w, d.kw, s, p, dl, dt) != 1 ||
                (nsp == 2 && ebb_tensor_conv_backward_stride(d.h, d.kh, s, p, dl, dt) != 1);
    int threads = ebb_tensor_num_threads();
    if (threads < 1)
        threads = 1;
    switch (dt) {
    case EBB_FLOAT64: return native_bwd_workspace(&d, 8);
    case EBB_FLOAT32:
        return uses_mkldnn(&d, threads) ? mkldnn_bwd_workspace_bound(&d, threads)
                                        : native_bwd_workspace(&d, 4);
    default: {
        /* bfloat16 takes either path (see conv_workspace); float16 has no
         * CPU kernels in libtorch 1.13 */
        int64_t native = native_bwd_workspace(&d, (int64_t)ebb_dtype_size(dt));
        int64_t mk = mkldnn_bwd_workspace_bound(&d, threads);
        return native > mk ? native : mk;
    }
    }
}

/* One rule per op: an unbatched conv2d input [C, H, W] has a batched
 * conv1d's rank, so the rule must know which op it serves. */
static int64_t conv1d_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)n_in;
    return conv_bwd_workspace_of(1, a, in, dt);
}

static int64_t conv2d_bwd_workspace(const ebb_attr_value *a, const ebb_shape *in, int n_in,
                                    ebb_dtype dt) {
    (void)n_in;
    return conv_bwd_workspace_of(2, a, in, dt);
}

static const ebb_op_grad conv1d_grad = {.backward = conv_bwd, .saves_inputs = 1u,
                                        .differentiable = 1u, .workspace = conv1d_bwd_workspace,
                                        .workspace_is_bound = 1};
static const ebb_op_grad conv2d_grad = {.backward = conv_bwd, .saves_inputs = 1u,
                                        .differentiable = 1u, .workspace = conv2d_bwd_workspace,
                                        .workspace_is_bound = 1};

const ebb_op ebb_ops_conv[] = {
    {.name = "conv1d", .min_inputs = 1, .max_inputs = 1, .attrs = conv_attrs,
     .n_attrs = EBB_COUNT(conv_attrs), .params = conv1d_params, .forward = conv1d_fwd,
     .doc = "1-D convolution over [N, C, L]", .workspace = conv1d_workspace,
     .workspace_is_bound = 1, .grad = &conv1d_grad, .workspace_cuda = conv1d_workspace,
     .workspace_cuda_is_bound = 1, .autocast = EBB_AUTOCAST_LOW},
    {.name = "conv2d", .min_inputs = 1, .max_inputs = 1, .attrs = conv_attrs,
     .n_attrs = EBB_COUNT(conv_attrs), .params = conv2d_params, .forward = conv2d_fwd,
     .doc = "2-D convolution over [N, C, H, W]", .workspace = conv2d_workspace,
     .workspace_is_bound = 1, .grad = &conv2d_grad, .workspace_cuda = conv2d_workspace,
     .workspace_cuda_is_bound = 1, .autocast = EBB_AUTOCAST_LOW},
};
const int ebb_ops_conv_count = EBB_COUNT(ebb_ops_conv);
