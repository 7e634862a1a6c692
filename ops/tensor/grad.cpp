// Derivatives: the tensor layer's half of the backward rules (ops/*.c hold
// the other half). Each function calls ATen's derivative kernel for its op
// (threshold_backward, native_layer_norm_backward, convolution_backward, ...)
// and adds only plain algebra around it (matrix products for linear maps,
// sum_to for broadcasting). Where ATen has no kernel (rms_norm, the n-way
// maximum, attention on libtorch 1.x) the derivative is written out from the
// same ATen calls the forward makes.
//
// Also here: the autograd switch that lets tests differentiate an op's
// forward with libtorch autograd, the reference the rules are checked
// against (never the mechanism).
#include <algorithm>
#include <array>
#include <limits>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#ifdef EBB_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif
#include <ATen/ExpandUtils.h>
#include <ATen/core/grad_mode.h>

#include "internal.h"
#include "shim.hpp"

using ebb::clear;
using ebb::dims;
using ebb::hand_out;
using ebb::wrap;

namespace {

thread_local int autograd_depth = 0;

c10::optional<at::Tensor> opt(const ebb_tensor *t) {
    if (t)
        return t->t;
    return c10::nullopt;
}

// grad reshaped and summed to `shape` where the forward broadcast.
at::Tensor reduce_to(const at::Tensor &g, at::IntArrayRef shape) {
    if (g.sizes().equals(shape))
        return g;
    TORCH_CHECK(at::is_expandable_to(shape, g.sizes()), "gradient ", g.sizes(),
                " cannot be reduced to the input's shape ", shape);
    return at::sum_to(g, shape);
}

void check_same(const char *what, const at::Tensor &g, const at::Tensor &ref) {
    TORCH_CHECK(g.sizes().equals(ref.sizes()), "gradient shape ", g.sizes(),
                " does not match the ", what, "'s shape ", ref.sizes());
}

} // namespace

namespace ebb {
bool autograd_on() { return autograd_depth > 0; }
} // namespace ebb

extern "C" {

/* ---- the autograd reference (tests) --------------------------------------- */

void ebb_tensor_autograd_begin(void) { autograd_depth++; }

void ebb_tensor_autograd_end(void) {
    if (autograd_depth > 0)
        autograd_depth--;
}

ebb_status ebb_tensor_requires_grad_(ebb_tensor *t) {
    static const char fn[] = "ebb_tensor_requires_grad_";
    EBB_NEED(fn, t);
    if (!ebb::autograd_on())
        return ebb_error_set(EBB_ERR_ARG, "%s: call ebb_tensor_autograd_begin() first", fn);
    EBB_TRY(fn, {
        if (t->t.is_inference())
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: %s was made outside ebb_tensor_autograd_begin(); clone it "
                                 "inside to get a leaf autograd can record",
                                 fn, dims(t->t).c_str());
        if (!at::isFloatingType(t->t.scalar_type()))
            return ebb_error_set(EBB_ERR_ARG, "%s: %s is %s; only floating tensors have gradients",
                                 fn, dims(t->t).c_str(),
                                 ebb_dtype_name(ebb::from_aten(t->t.scalar_type())));
        t->t.requires_grad_(true);
    })
    return EBB_OK;
}

ebb_status ebb_tensor_backward(const ebb_tensor *out, const ebb_tensor *grad_out) {
    static const char fn[] = "ebb_tensor_backward";
    EBB_NEED(fn, out);
    EBB_NEED(fn, grad_out);
    if (!ebb::autograd_on())
        return ebb_error_set(EBB_ERR_ARG, "%s: call ebb_tensor_autograd_begin() first", fn);
    EBB_TRY(fn, {
        if (!out->t.requires_grad())
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: output %s does not depend on any tensor that requires grad",
                                 fn, dims(out->t).c_str());
        check_same("output", grad_out->t, out->t);
        out->t.backward(grad_out->t);
    })
    return EBB_OK;
}

ebb_status ebb_tensor_grad(ebb_tensor **out, const ebb_tensor *t) {
    static const char fn[] = "ebb_tensor_grad";
    EBB_OUT(fn, out);
    EBB_NEED(fn, t);
    EBB_TRY(fn, {
        if (!t->t.requires_grad())
            return ebb_error_set(EBB_ERR_ARG, "%s: %s does not require grad", fn,
                                 dims(t->t).c_str());
        at::Tensor g = t->t.grad();
        *out = wrap(g.defined() ? g.detach() : at::zeros_like(t->t).detach());
    })
    return EBB_OK;
}

/* ---- elementwise ------------------------------------------------------------ */

ebb_status ebb_tensor_unary_backward(ebb_tensor **grad_x, ebb_unary_op op, const ebb_tensor *grad,
                                     const ebb_tensor *saved) {
    static const char fn[] = "ebb_tensor_unary_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, saved);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &s = saved->t;
        check_same("saved tensor", g, s);
        at::Tensor r;
        switch (op) {
        case EBB_RELU: r = at::threshold_backward(g, s, 0); break; // s: the output
        case EBB_GELU: r = at::gelu_backward(g, s); break;         // s: the input
        case EBB_GELU_TANH: r = at::gelu_backward(g, s, "tanh"); break; // s: the input
        case EBB_TANH: r = at::tanh_backward(g, s); break;         // s: the output
        case EBB_SIGMOID: r = at::sigmoid_backward(g, s); break;   // s: the output
        case EBB_SILU: r = at::silu_backward(g, s); break;         // s: the input
        case EBB_NEG: r = at::neg(g); break;
        case EBB_EXP: r = at::mul(g, s); break;                    // s: the output
        case EBB_LOG: r = at::div(g, s); break;                    // s: the input
        case EBB_SQRT: r = at::div(g, s).mul_(0.5); break;         // s: the output
        case EBB_RSQRT:                                            // s: the output
            r = at::mul(s, s);
            r.mul_(s).mul_(g).mul_(-0.5);
            break;
        case EBB_ABS: r = at::sgn(s).mul_(g); break;               // s: the input
        case EBB_SIN: r = at::cos(s).mul_(g); break;               // s: the input
        case EBB_COS: r = at::sin(s).mul_(g).neg_(); break;        // s: the input
        default:
            return ebb_error_set(EBB_ERR_UNSUPPORTED, "%s: no derivative for unary op %d", fn,
                                 static_cast<int>(op));
        }
        *grad_x = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_pow_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                   const ebb_tensor *x, double exponent) {
    static const char fn[] = "ebb_tensor_pow_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &s = x->t;
        check_same("input", g, s);
        if (exponent == 0.0) {
            *grad_x = wrap(at::zeros_like(g));
        } else {
            at::Tensor r = at::pow(s, exponent - 1.0);
            r.mul_(exponent).mul_(g);
            *grad_x = wrap(std::move(r));
        }
    })
    return EBB_OK;
}

ebb_status ebb_tensor_clamp_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                     const ebb_tensor *x, double lo, double hi) {
    static const char fn[] = "ebb_tensor_clamp_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &s = x->t;
        check_same("input", g, s);
        at::Tensor r = g.clone();
        // one mask at a time, negated in place; a NaN input gets no
        // gradient, as torch's (its comparisons are false). 1.13 has no
        // meta kernel for logical_not: the dry run needs the shape only
        if (!std::isinf(lo) && !s.is_meta()) r.masked_fill_(at::ge(s, lo).logical_not_(), 0);
        if (!std::isinf(hi) && !s.is_meta()) r.masked_fill_(at::le(s, hi).logical_not_(), 0);
        *grad_x = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_where_backward(ebb_tensor **grad_a, ebb_tensor **grad_b,
                                     const ebb_tensor *grad, const ebb_tensor *cond,
                                     const ebb_shape *a, const ebb_shape *b) {
    static const char fn[] = "ebb_tensor_where_backward";
    EBB_OUT(fn, grad_a);
    EBB_OUT(fn, grad_b);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, cond);
    EBB_NEED(fn, a);
    EBB_NEED(fn, b);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &c = cond->t;
        // a's gradient summed before b's is made, the negated mask gone
        // before the sum; 1.13 has no meta logical_not, and the dry run
        // needs the shapes only
        at::Tensor fill = g.is_meta() ? at::empty_like(g) : g.masked_fill(c.logical_not(), 0);
        at::Tensor ga = reduce_to(fill, ebb::dims_of(a));
        fill.reset(); // gone before b's is made, unless it is a's gradient
        fill = g.is_meta() ? at::empty_like(g) : g.masked_fill(c, 0);
        at::Tensor gb = reduce_to(fill, ebb::dims_of(b));
        fill.reset();
        ebb_tensor *ta = wrap(std::move(ga));
        try {
            *grad_b = wrap(std::move(gb));
        } catch (...) {
            ebb_tensor_free(ta);
            throw;
        }
        *grad_a = ta;
    })
    return EBB_OK;
}

ebb_status ebb_tensor_softmax_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                       const ebb_tensor *out, int64_t dim, bool log) {
    static const char fn[] = "ebb_tensor_softmax_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, out);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &y = out->t;
        check_same("softmax output", g, y);
        int64_t d = at::maybe_wrap_dim(dim, y.dim());
        *grad_x = wrap(log ? at::_log_softmax_backward_data(g, y, d, y.scalar_type())
                           : at::_softmax_backward_data(g, y, d, y.scalar_type()));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_sum_to(ebb_tensor **out, const ebb_tensor *grad, const ebb_shape *shape) {
    static const char fn[] = "ebb_tensor_sum_to";
    EBB_OUT(fn, out);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, shape);
    EBB_TRY(fn, *out = wrap(reduce_to(grad->t, ebb::dims_of(shape)));)
    return EBB_OK;
}

ebb_status ebb_tensor_reduce_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                      const ebb_shape *x, const int64_t *dims_, int ndims,
                                      bool keepdim, bool mean) {
    static const char fn[] = "ebb_tensor_reduce_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        at::IntArrayRef xs = ebb::dims_of(x);
        std::vector<bool> reduced(xs.size(), ndims == 0);
        for (int i = 0; i < ndims; i++)
            reduced[static_cast<size_t>(at::maybe_wrap_dim(dims_[i], x->ndim))] = true;
        at::Tensor g = grad->t;
        int64_t count = 1;
        for (size_t d = 0; d < xs.size(); d++)
            if (reduced[d]) {
                count *= xs[d];
                if (!keepdim)
                    g = g.unsqueeze(static_cast<int64_t>(d));
            }
        TORCH_CHECK(at::is_expandable_to(g.sizes(), xs), "output gradient ", grad->t.sizes(),
                    " does not fit a reduction of ", xs);
        at::Tensor r = g.expand(xs);
        r = mean ? r / static_cast<double>(count) : r.clone();
        *grad_x = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_max_all_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                       const ebb_tensor *x) {
    static const char fn[] = "ebb_tensor_max_all_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        TORCH_CHECK(grad->t.numel() == 1, "output gradient ", grad->t.sizes(),
                    " of a full max must have one element");
        if (xt.numel() == 0) {
            *grad_x = wrap(at::zeros_like(xt));
            return EBB_OK;
        }
        // as max()'s derivative: the gradient is shared evenly by the ties
        at::Tensor hit = xt == at::max(xt);
        at::Tensor share = grad->t.reshape({}) / hit.sum();
        *grad_x = wrap(at::where(hit, share, at::zeros({}, xt.options())));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_fold_backward(ebb_tensor **grad_xs, ebb_binary_op op, const ebb_tensor *grad,
                                    ebb_tensor *const *xs, int n) {
    static const char fn[] = "ebb_tensor_fold_backward";
    EBB_NEED(fn, grad_xs);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, xs);
    for (int i = 0; i < n; i++)
        grad_xs[i] = nullptr;
    if (n < 2)
        return ebb_error_set(EBB_ERR_ARG, "%s: needs at least 2 inputs, got %d", fn, n);
    for (int i = 0; i < n; i++)
        EBB_NEED(fn, xs[i]);
    EBB_TRY(fn, {
        std::vector<at::Tensor> x, gs(static_cast<size_t>(n));
        for (int i = 0; i < n; i++)
            x.push_back(xs[i]->t);
        const at::Tensor &g = grad->t;
        switch (op) {
        case EBB_ADD:
            for (int i = 0; i < n; i++)
                gs[i] = reduce_to(g, x[i].sizes());
            break;
        case EBB_MUL:
            for (int i = 0; i < n; i++) {
                at::Tensor gi = g;
                for (int j = 0; j < n; j++)
                    if (j != i)
                        gi = gi * x[j];
                gs[i] = reduce_to(gi, x[i].sizes());
            }
            break;
        case EBB_MAXIMUM: {
            // the fold is max(max(max(x0, x1), x2), ...): walk it backwards,
            // recomputing the prefixes; ties split evenly, as maximum's
            // derivative does
            std::vector<at::Tensor> prefix{x[0]};
            for (int i = 1; i < n - 1; i++)
                prefix.push_back(at::maximum(prefix.back(), x[i]));
            at::Tensor gacc = g;
            for (int i = n - 1; i >= 1; i--) {
                const at::Tensor &a = prefix[static_cast<size_t>(i - 1)], &b = x[i];
                at::Tensor half = gacc / 2;
                at::Tensor ga = at::where(a == b, half, gacc).masked_fill(a < b, 0);
                at::Tensor gb = at::where(a == b, half, gacc).masked_fill(b < a, 0);
                gs[i] = reduce_to(gb, b.sizes());
                gacc = reduce_to(ga, a.sizes());
            }
            gs[0] = gacc;
            break;
        }
        default:
            return ebb_error_set(EBB_ERR_UNSUPPORTED, "%s: no derivative for fold op %d", fn,
                                 static_cast<int>(op));
        }
        std::vector<ebb_tensor *> made;
        try {
            for (auto &t : gs)
                made.push_back(wrap(t.defined() && t.is_same(g) ? t.clone() : t));
        } catch (...) {
            for (ebb_tensor *h : made)
                ebb_tensor_free(h);
            throw;
        }
        for (int i = 0; i < n; i++)
            grad_xs[i] = made[static_cast<size_t>(i)];
    })
    return EBB_OK;
}

/* ---- linear ------------------------------------------------------------------- */

ebb_status ebb_tensor_linear_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                      ebb_tensor **grad_bias, const ebb_tensor *grad,
                                      const ebb_tensor *x, const ebb_tensor *weight) {
    static const char fn[] = "ebb_tensor_linear_backward";
    clear({grad_x, grad_weight, grad_bias});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, weight);
    if (grad_weight && !x)
        return ebb_error_set(EBB_ERR_ARG, "%s: the weight's gradient needs the input x", fn);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &w = weight->t;
        TORCH_CHECK(w.dim() == 2 && g.dim() >= 1 && g.size(-1) == w.size(0), "output gradient ",
                    g.sizes(), " does not fit weight ", w.sizes());
        at::Tensor gx, gw, gb;
        if (grad_x)
            gx = at::matmul(g, w);
        at::Tensor g2 = g.reshape({-1, w.size(0)});
        if (grad_weight) {
            TORCH_CHECK(x->t.dim() >= 1 && x->t.size(-1) == w.size(1), "input ", x->t.sizes(),
                        " does not fit weight ", w.sizes());
            gw = at::mm(g2.t(), x->t.reshape({-1, w.size(1)}));
        }
        if (grad_bias)
            gb = g2.sum(0);
        hand_out({{grad_x, gx}, {grad_weight, gw}, {grad_bias, gb}});
    })
    return EBB_OK;
}

/* ---- dropout ------------------------------------------------------------------ */

#ifdef EBB_WITH_CUDA
namespace {
// A dropout mask drawn on x's GPU: Bernoulli(1 - p) into a bool tensor, by a
// Philox generator seeded with `seed`, so a seed gives the same mask on every
// run on that kind of device. A libtorch whose bernoulli_ has no bool kernel
// gives an undefined tensor, and the caller draws on the CPU instead.
at::Tensor cuda_keep_mask(const at::Tensor &x, double p, uint64_t seed) {
    at::Generator gen = ebb::seeded_cuda_generator(x.device().index(), seed);
    at::Tensor keep = at::empty(x.sizes(), x.options().dtype(at::kBool));
    try {
        keep.bernoulli_(1.0 - p, gen);
    } catch (const c10::NotImplementedError &) {
        return at::Tensor();
    }
    return keep;
}
} // namespace
#endif

} // extern "C"

namespace {

// Which elements a dropout of probability p keeps, for a tensor like x: a
// bool of x's shape drawn from a generator seeded with `seed`. On a GPU it
// is drawn there (a host draw and its copy took 2 ms per half a million
// elements, most of a transformer's step); on the CPU, a float32 uniform of
// x's shape is drawn first and compared (ops count it as scratch).
at::Tensor keep_mask(const at::Tensor &x, double p, uint64_t seed) {
    if (x.is_meta())
        return at::empty(x.sizes(), x.options().dtype(at::kBool));
    at::Tensor keep;
#ifdef EBB_WITH_CUDA
    if (x.is_cuda())
        keep = cuda_keep_mask(x, p, seed);
#endif
    if (!keep.defined()) {
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
        at::Tensor u = at::empty(x.sizes(), at::TensorOptions().dtype(at::kFloat));
        u.uniform_(0.0, 1.0, gen);
        keep = (u >= p).to(x.device());
    }
    return keep;
}

// native_dropout's convention: scale 1/(1-p), and 0 when all drop
double dropout_scale(double p) { return p >= 1.0 ? 0.0 : 1.0 / (1.0 - p); }

} // namespace

extern "C" {

ebb_status ebb_tensor_dropout_train(ebb_tensor **out, ebb_tensor **mask, const ebb_tensor *x,
                                    double p, uint64_t seed) {
    static const char fn[] = "ebb_tensor_dropout_train";
    clear({out, mask});
    EBB_NEED(fn, out);
    EBB_NEED(fn, mask);
    EBB_NEED(fn, x);
    if (!(p >= 0.0 && p <= 1.0))
        return ebb_error_set(EBB_ERR_ARG, "%s: p must be in [0, 1], got %g", fn, p);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        at::Tensor keep = keep_mask(xt, p, seed);
        at::Tensor y = at::native_dropout_backward(xt, keep, dropout_scale(p));
        hand_out({{out, y}, {mask, keep}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_dropout_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                       const ebb_tensor *mask, double p) {
    static const char fn[] = "ebb_tensor_dropout_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, mask);
    EBB_TRY(fn, {
        check_same("dropout mask", grad->t, mask->t);
        double scale = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
        *grad_x = wrap(at::native_dropout_backward(grad->t, mask->t.to(at::kBool), scale));
    })
    return EBB_OK;
}

/* ---- normalisation ------------------------------------------------------------- */

ebb_status ebb_tensor_layer_norm_train(ebb_tensor **out, ebb_tensor **mean, ebb_tensor **rstd,
                                       const ebb_tensor *x, int normalized_ndim,
                                       const ebb_tensor *weight, const ebb_tensor *bias,
                                       double eps) {
    static const char fn[] = "ebb_tensor_layer_norm_train";
    clear({out, mean, rstd});
    EBB_NEED(fn, out);
    EBB_NEED(fn, mean);
    EBB_NEED(fn, rstd);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        int64_t nd = x->t.dim();
        if (normalized_ndim < 1 || normalized_ndim > nd)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: cannot normalise %d dims of input %s", fn,
                                 normalized_ndim, dims(x->t).c_str());
        at::IntArrayRef norm = x->t.sizes().slice(static_cast<size_t>(nd - normalized_ndim));
        auto r = at::native_layer_norm(x->t, norm, opt(weight), opt(bias), eps);
        hand_out({{out, std::get<0>(r)}, {mean, std::get<1>(r)}, {rstd, std::get<2>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_layer_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                          ebb_tensor **grad_bias, const ebb_tensor *grad,
                                          const ebb_tensor *x, int normalized_ndim,
                                          const ebb_tensor *mean, const ebb_tensor *rstd,
                                          const ebb_tensor *weight, const ebb_tensor *bias) {
    static const char fn[] = "ebb_tensor_layer_norm_backward";
    clear({grad_x, grad_weight, grad_bias});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, mean);
    EBB_NEED(fn, rstd);
    EBB_TRY(fn, {
        check_same("input", grad->t, x->t);
        int64_t nd = x->t.dim();
        if (normalized_ndim < 1 || normalized_ndim > nd)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: cannot normalise %d dims of input %s", fn,
                                 normalized_ndim, dims(x->t).c_str());
        at::IntArrayRef norm = x->t.sizes().slice(static_cast<size_t>(nd - normalized_ndim));
        auto r = at::native_layer_norm_backward(
            grad->t, x->t, norm, mean->t, rstd->t, opt(weight), opt(bias),
            {grad_x != nullptr, grad_weight != nullptr && weight, grad_bias != nullptr && bias});
        hand_out({{grad_x, std::get<0>(r)}, {grad_weight, std::get<1>(r)},
                  {grad_bias, std::get<2>(r)}});
    })
    return EBB_OK;
}

// Measured with a counting allocator: 1.13 holds two [C] temporaries; 2.x
// holds two plus one per intra-op thread (its per-thread partial sums) on
// its channels-last path ([N, C] or [N, C, 1, 1]: one value per channel and
// sample), two otherwise.
int64_t ebb_batch_norm_train_scratch(const ebb_shape *x, ebb_dtype dtype) {
    if (x->ndim < 2)
        return 0;
    int64_t numel = ebb_shape_numel(x), per_channel = 2;
#if TORCH_VERSION_MAJOR >= 2
    if (x->dim[0] * x->dim[1] > 0 && numel / (x->dim[0] * x->dim[1]) == 1)
        per_channel = 2 + (ebb_tensor_num_threads() > 1 ? ebb_tensor_num_threads() : 1);
#else
    (void)numel;
#endif
    return per_channel * x->dim[1] * static_cast<int64_t>(ebb_dtype_size(dtype));
}

ebb_status ebb_tensor_batch_norm_train(ebb_tensor **out, ebb_tensor **save_mean,
                                       ebb_tensor **save_invstd, const ebb_tensor *x,
                                       ebb_tensor *running_mean, ebb_tensor *running_var,
                                       const ebb_tensor *weight, const ebb_tensor *bias,
                                       double momentum, double eps) {
    static const char fn[] = "ebb_tensor_batch_norm_train";
    clear({out, save_mean, save_invstd});
    EBB_NEED(fn, out);
    EBB_NEED(fn, save_mean);
    EBB_NEED(fn, save_invstd);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        if (xt.dim() < 2)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be [N, C, ...]", fn,
                                 dims(xt).c_str());
        if (xt.numel() / xt.size(1) < 2)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: input %s has one value per channel; training batch norm "
                                 "needs more",
                                 fn, dims(xt).c_str());
        if (xt.is_meta()) {
            int64_t c = xt.size(1);
            hand_out({{out, at::empty(xt.sizes(), xt.options())},
                      {save_mean, at::empty({c}, xt.options())},
                      {save_invstd, at::empty({c}, xt.options())}});
            return EBB_OK;
        }
        // updates the running statistics in place, as nn.BatchNorm's
        // training forward does (unbiased variance)
        auto r = at::native_batch_norm(xt, opt(weight), opt(bias), opt(running_mean),
                                       opt(running_var), /*training=*/true, momentum, eps);
        hand_out({{out, std::get<0>(r)}, {save_mean, std::get<1>(r)},
                  {save_invstd, std::get<2>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_batch_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                          ebb_tensor **grad_bias, const ebb_tensor *grad,
                                          const ebb_tensor *x, const ebb_tensor *weight,
                                          const ebb_tensor *save_mean,
                                          const ebb_tensor *save_invstd, double eps) {
    static const char fn[] = "ebb_tensor_batch_norm_backward";
    clear({grad_x, grad_weight, grad_bias});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, save_mean);
    EBB_NEED(fn, save_invstd);
    EBB_TRY(fn, {
        check_same("input", grad->t, x->t);
        auto r = at::native_batch_norm_backward(
            grad->t, x->t, opt(weight), c10::nullopt, c10::nullopt, save_mean->t, save_invstd->t,
            /*train=*/true, eps,
            {grad_x != nullptr, grad_weight != nullptr && weight, grad_bias != nullptr && weight});
        hand_out({{grad_x, std::get<0>(r)}, {grad_weight, std::get<1>(r)},
                  {grad_bias, std::get<2>(r)}});
    })
    return EBB_OK;
}

} // extern "C"

namespace {
// N, C and H*W of a group norm input [N, C, *].
std::array<int64_t, 3> group_dims(const at::Tensor &x, int64_t groups) {
    TORCH_CHECK(x.dim() >= 2, "input ", x.sizes(), " must be [N, C, ...]");
    TORCH_CHECK(groups >= 1 && x.size(1) % groups == 0, groups,
                " groups do not divide the channels of input ", x.sizes());
    int64_t n = x.size(0), c = x.size(1);
    return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}
} // namespace

extern "C" {

ebb_status ebb_tensor_group_norm_train(ebb_tensor **out, ebb_tensor **mean, ebb_tensor **rstd,
                                       const ebb_tensor *x, int64_t num_groups,
                                       const ebb_tensor *weight, const ebb_tensor *bias,
                                       double eps) {
    static const char fn[] = "ebb_tensor_group_norm_train";
    clear({out, mean, rstd});
    EBB_NEED(fn, out);
    EBB_NEED(fn, mean);
    EBB_NEED(fn, rstd);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        auto d = group_dims(xt, num_groups);
        if (xt.is_meta()) {
            hand_out({{out, at::empty(xt.sizes(), xt.options())},
                      {mean, at::empty({d[0], num_groups}, xt.options())},
                      {rstd, at::empty({d[0], num_groups}, xt.options())}});
            return EBB_OK;
        }
        auto r = at::native_group_norm(xt.contiguous(), opt(weight), opt(bias), d[0], d[1], d[2],
                                       num_groups, eps);
        hand_out({{out, std::get<0>(r).view(xt.sizes())}, {mean, std::get<1>(r)},
                  {rstd, std::get<2>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_group_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                          ebb_tensor **grad_bias, const ebb_tensor *grad,
                                          const ebb_tensor *x, const ebb_tensor *mean,
                                          const ebb_tensor *rstd, const ebb_tensor *weight,
                                          int64_t num_groups) {
    static const char fn[] = "ebb_tensor_group_norm_backward";
    clear({grad_x, grad_weight, grad_bias});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, mean);
    EBB_NEED(fn, rstd);
    EBB_TRY(fn, {
        check_same("input", grad->t, x->t);
        auto d = group_dims(x->t, num_groups);
        auto r = at::native_group_norm_backward(
            grad->t.contiguous(), x->t.contiguous(), mean->t, rstd->t, opt(weight), d[0], d[1],
            d[2], num_groups,
            {grad_x != nullptr, grad_weight != nullptr && weight, grad_bias != nullptr && weight});
        at::Tensor gx = std::get<0>(r);
        if (gx.defined())
            gx = gx.view(x->t.sizes());
        hand_out({{grad_x, gx}, {grad_weight, std::get<1>(r)}, {grad_bias, std::get<2>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_rms_norm_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                        const ebb_tensor *grad, const ebb_tensor *x,
                                        const ebb_tensor *weight, double eps) {
    static const char fn[] = "ebb_tensor_rms_norm_backward";
    clear({grad_x, grad_weight});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        check_same("input", grad->t, x->t);
        // libtorch 1.13 has no rms_norm kernel; with r = rsqrt(mean(x^2) + eps)
        // over the last dim and y = x r w:
        //   dx = r (g w) - x r^3 mean(g w x),  dw = sum over rows of g x r
        at::ScalarType st = x->t.scalar_type();
        bool low = st == at::kHalf || st == at::kBFloat16;
        at::Tensor xf = low ? x->t.to(at::kFloat) : x->t;
        at::Tensor g = low ? grad->t.to(at::kFloat) : grad->t;
        at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, true).add(eps));
        at::Tensor gx, gw;
        if (grad_weight && weight)
            gw = (g * xf * r).reshape({-1, xf.size(-1)}).sum(0).to(weight->t.scalar_type());
        if (grad_x) {
            at::Tensor gy = weight ? g * weight->t : g;
            gx = gy * r - xf * r.pow(3) * (gy * xf).mean(-1, true);
            gx = gx.to(st);
        }
        hand_out({{grad_x, gx}, {grad_weight, gw}});
    })
    return EBB_OK;
}

/* ---- convolution and pooling ---------------------------------------------------- */

// oneDNN's bfloat16 weight-gradient kernels on the CPU (libtorch 1.13 and
// 2.x alike) read memory they never wrote when a stride is longer than the
// input along its dim: the gradient comes out with garbage, NaN where freed
// memory held NaN and wrong finite values elsewhere. Such a dim has one
// output position for every stride beyond in + 2*padding - span, so the
// shortest of those computes the same convolution, and oneDNN gets it
// right. Checked against float32 on every map up to 3x2, kernel up to 5,
// stride up to 4, padding up to k/2+1 and dilation up to 2, with freed
// memory full of NaN and of 1e30 (docs/ops.md, conv1d and conv2d).
extern "C" int64_t ebb_tensor_conv_backward_stride(int64_t in, int64_t kernel, int64_t stride,
                                                  int64_t padding, int64_t dilation,
                                                  ebb_dtype dtype) {
    int64_t room = in + 2 * padding - dilation * (kernel - 1) - 1;
    if (dtype != EBB_BFLOAT16 || room < 0 || stride <= room + 1)
        return stride;
    return room + 1;
}

ebb_status ebb_tensor_conv_backward(ebb_tensor **grad_x, ebb_tensor **grad_weight,
                                    ebb_tensor **grad_bias, const ebb_tensor *grad,
                                    const ebb_tensor *x, const ebb_tensor *weight,
                                    const int64_t *stride, const int64_t *padding,
                                    const int64_t *dilation, int64_t groups) {
    static const char fn[] = "ebb_tensor_conv_backward";
    clear({grad_x, grad_weight, grad_bias});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, weight);
    EBB_NEED(fn, stride);
    EBB_NEED(fn, padding);
    EBB_NEED(fn, dilation);
    EBB_TRY(fn, {
        const at::Tensor &w = weight->t;
        int64_t nsp = w.dim() - 2;
        TORCH_CHECK(nsp >= 1 && nsp <= 3, "weight ", w.sizes(), " must have 1 to 3 spatial dims");
        bool batched = x->t.dim() == nsp + 2;
        TORCH_CHECK(batched || x->t.dim() == nsp + 1, "input ", x->t.sizes(),
                    " does not fit weight ", w.sizes());
        TORCH_CHECK(grad->t.dim() == x->t.dim(), "output gradient ", grad->t.sizes(),
                    " does not fit input ", x->t.sizes());
        at::Tensor xt = batched ? x->t : x->t.unsqueeze(0);
        at::Tensor g = batched ? grad->t : grad->t.unsqueeze(0);
        std::vector<int64_t> bias_sizes{w.size(0)}, out_pad(static_cast<size_t>(nsp), 0);
        at::IntArrayRef s(stride, static_cast<size_t>(nsp)), p(padding, static_cast<size_t>(nsp)),
            dl(dilation, static_cast<size_t>(nsp));
        std::vector<int64_t> sb(s.begin(), s.end());
        if (xt.is_cpu())
            for (size_t i = 0; i < sb.size(); i++)
                sb[i] = ebb_tensor_conv_backward_stride(xt.size(static_cast<int64_t>(i) + 2),
                                                        w.size(static_cast<int64_t>(i) + 2), sb[i],
                                                        p[i], dl[i], ebb::from_aten(xt.scalar_type()));
        auto r = at::convolution_backward(
            g, xt, w, grad_bias ? at::OptionalIntArrayRef(bias_sizes) : c10::nullopt, sb, p, dl,
            /*transposed=*/false, out_pad, groups,
            {grad_x != nullptr, grad_weight != nullptr, grad_bias != nullptr});
        at::Tensor gx = std::get<0>(r);
        if (gx.defined() && !batched)
            gx = gx.squeeze(0);
        hand_out({{grad_x, gx}, {grad_weight, std::get<1>(r)}, {grad_bias, std::get<2>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_max_pool2d_train(ebb_tensor **out, ebb_tensor **indices, const ebb_tensor *x,
                                       const int64_t kernel[2], const int64_t stride[2],
                                       const int64_t padding[2], bool ceil_mode) {
    static const char fn[] = "ebb_tensor_max_pool2d_train";
    clear({out, indices});
    EBB_NEED(fn, out);
    EBB_NEED(fn, indices);
    EBB_NEED(fn, x);
    EBB_NEED(fn, kernel);
    EBB_NEED(fn, stride);
    EBB_NEED(fn, padding);
    EBB_TRY(fn, {
        TORCH_CHECK(x->t.dim() == 3 || x->t.dim() == 4, "input ", x->t.sizes(),
                    " must be [N, C, H, W] or [C, H, W]");
        auto r = at::max_pool2d_with_indices(x->t, {kernel[0], kernel[1]}, {stride[0], stride[1]},
                                             {padding[0], padding[1]}, {1, 1}, ceil_mode);
        hand_out({{out, std::get<0>(r)}, {indices, std::get<1>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_max_pool2d_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                          const ebb_tensor *x, const ebb_tensor *indices,
                                          const int64_t kernel[2], const int64_t stride[2],
                                          const int64_t padding[2], bool ceil_mode) {
    static const char fn[] = "ebb_tensor_max_pool2d_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, indices);
    EBB_NEED(fn, kernel);
    EBB_NEED(fn, stride);
    EBB_NEED(fn, padding);
    EBB_TRY(fn, {
        check_same("pooling indices", grad->t, indices->t);
        *grad_x = wrap(at::max_pool2d_with_indices_backward(
            grad->t, x->t, {kernel[0], kernel[1]}, {stride[0], stride[1]},
            {padding[0], padding[1]}, {1, 1}, ceil_mode, indices->t));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_avg_pool2d_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                          const ebb_tensor *x, const int64_t kernel[2],
                                          const int64_t stride[2], const int64_t padding[2],
                                          bool ceil_mode, bool count_include_pad) {
    static const char fn[] = "ebb_tensor_avg_pool2d_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, kernel);
    EBB_NEED(fn, stride);
    EBB_NEED(fn, padding);
    EBB_TRY(fn, {
        *grad_x = wrap(at::avg_pool2d_backward(grad->t, x->t, {kernel[0], kernel[1]},
                                               {stride[0], stride[1]}, {padding[0], padding[1]},
                                               ceil_mode, count_include_pad, c10::nullopt));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_adaptive_avg_pool2d_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                                   const ebb_tensor *x) {
    static const char fn[] = "ebb_tensor_adaptive_avg_pool2d_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        TORCH_CHECK(grad->t.dim() == x->t.dim() && (x->t.dim() == 3 || x->t.dim() == 4),
                    "output gradient ", grad->t.sizes(), " does not fit input ", x->t.sizes());
        *grad_x = wrap(at::_adaptive_avg_pool2d_backward(grad->t, x->t));
    })
    return EBB_OK;
}

/* ---- embedding ------------------------------------------------------------------ */

ebb_status ebb_tensor_embedding_backward(ebb_tensor **grad_weight, const ebb_tensor *grad,
                                         const ebb_tensor *indices, int64_t num_weights) {
    static const char fn[] = "ebb_tensor_embedding_backward";
    EBB_OUT(fn, grad_weight);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, indices);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &idx = indices->t;
        TORCH_CHECK(g.dim() == idx.dim() + 1 && g.sizes().slice(0, idx.dim()).equals(idx.sizes()),
                    "output gradient ", g.sizes(), " does not fit indices ", idx.sizes());
        *grad_weight = wrap(at::embedding_dense_backward(g, idx, num_weights, /*padding_idx=*/-1,
                                                         /*scale_grad_by_freq=*/false));
    })
    return EBB_OK;
}

/* ---- attention ------------------------------------------------------------------ */

} // extern "C"

namespace {

// [B, T, H*D] <-> [B, H, T, D]
at::Tensor split_heads(const at::Tensor &x, int64_t heads) {
    return x.reshape({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}
at::Tensor merge_heads(const at::Tensor &x) {
    at::Tensor t = x.transpose(1, 2);
    return t.reshape({t.size(0), t.size(1), t.size(2) * t.size(3)});
}

// What both ways through multi-head attention's backward read.
struct MhaArgs {
    const at::Tensor &g, *x[3]; // grad_out; query, key and value inputs
    int n_in;                   // 1: self-attention, 2: key = value, 3
    at::Tensor w[3];            // in_proj_weight's query, key and value rows
    c10::optional<at::Tensor> b[3];
    const at::Tensor &wo;
    bool out_bias, causal;
    int64_t heads, e;
    const at::Tensor *keep; // the training forward's dropout mask, or NULL
    double dropout;
};

// The projections again, from the saved inputs: [B, H, L, D] each.
void project(const MhaArgs &a, at::Tensor qkv[3]) {
    for (int j = 0; j < 3; j++)
        qkv[j] = split_heads(at::linear(*a.x[j], a.w[j], a.b[j]), a.heads);
}

// From the gradients of q, k and v ([B, H, L, D] each) to those of the
// inputs and of in_proj; returns every gradient the call hands out: the
// inputs', in_proj's weight and bias, then out_proj's (g_wo, g_bo). Self-
// attention reads its one input three times and cross-attention with one
// `using` tensor reads it as key and value: their parts are summed.
std::vector<at::Tensor> project_back(const MhaArgs &a, const at::Tensor g_qkv[3],
                                     const at::Tensor &g_wo, const at::Tensor &g_bo) {
    std::vector<at::Tensor> outs;
    at::Tensor proj[3] = {merge_heads(g_qkv[0]), merge_heads(g_qkv[1]), merge_heads(g_qkv[2])};
    std::vector<at::Tensor> g_w, g_b, g_x(static_cast<size_t>(a.n_in));
    for (int j = 0; j < 3; j++) {
        at::Tensor pj = proj[j].reshape({-1, a.e});
        g_w.push_back(at::mm(pj.t(), a.x[j]->reshape({-1, a.e})));
        if (a.b[j])
            g_b.push_back(pj.sum(0));
        at::Tensor gx = at::matmul(proj[j], a.w[j]);
        size_t to = static_cast<size_t>(j == 0 ? 0 : std::min(j, a.n_in - 1));
        g_x[to] = g_x[to].defined() ? g_x[to] + gx : gx;
    }
    outs.insert(outs.end(), g_x.begin(), g_x.end());
    outs.push_back(at::cat(g_w, 0));
    if (a.b[0])
        outs.push_back(at::cat(g_b, 0));
    outs.push_back(g_wo);
    if (a.out_bias)
        outs.push_back(g_bo);
    return outs;
}

// out_proj's weight and bias gradients, from the heads merged [B, T, E].
void out_proj_back(const MhaArgs &a, const at::Tensor &merged, at::Tensor &g_wo,
                   at::Tensor &g_bo) {
    at::Tensor g2 = a.g.reshape({-1, a.e});
    g_wo = at::mm(g2.t(), merged.reshape({-1, a.e}));
    if (a.out_bias)
        g_bo = g2.sum(0);
}

// Through matmul and softmax, the probabilities recomputed rather than kept
// from the forward (B*H*T*S of them). Every named tensor lives to the end:
// ops/attention.c's composite formula counts them so.
std::vector<at::Tensor> mha_backward_composite(const MhaArgs &a) {
    at::Tensor qkv[3];
    project(a, qkv);
    const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
    double scale = 1.0 / std::sqrt(static_cast<double>(a.e / a.heads));
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
    if (a.causal) {
        at::Tensor above =
            at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu_(1);
        scores.masked_fill_(above, -std::numeric_limits<double>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1);
    // with dropout the product reads the dropped probabilities, and the
    // gradient goes back through the same mask
    bool drop = a.keep && !q.is_meta();
    double dscale = a.dropout >= 1.0 ? 0.0 : 1.0 / (1.0 - a.dropout);
    at::Tensor dropped = drop ? at::native_dropout_backward(probs, *a.keep, dscale) : probs;
    at::Tensor merged = merge_heads(at::matmul(dropped, v));
    at::Tensor g_wo, g_bo;
    out_proj_back(a, merged, g_wo, g_bo);
    at::Tensor g_o = split_heads(at::matmul(a.g, a.wo), a.heads);
    at::Tensor g_p = at::matmul(g_o, v.transpose(-2, -1));
    at::Tensor g_v = at::matmul(dropped.transpose(-2, -1), g_o);
    if (drop)
        g_p = at::native_dropout_backward(g_p, *a.keep, dscale);
    at::Tensor g_s = at::_softmax_backward_data(g_p, probs, -1, probs.scalar_type()) * scale;
    at::Tensor g_qkv[3] = {at::matmul(g_s, k), at::matmul(g_s.transpose(-2, -1), q), g_v};
    return project_back(a, g_qkv, g_wo, g_bo);
}

#if EBB_FLASH_ATTENTION
// Through libtorch's flash-attention CPU kernels: the forward again for its
// output and log-sum-exp, then its backward, which recomputes the
// probabilities block by block. Their results are laid out [B, L, H, D], so
// merging heads copies nothing; each is released once read.
std::vector<at::Tensor> mha_backward_fused(const MhaArgs &a) {
    at::Tensor qkv[3];
    project(a, qkv);
    auto fwd = at::_scaled_dot_product_flash_attention_for_cpu(qkv[0], qkv[1], qkv[2], 0.0,
                                                               a.causal);
    at::Tensor o = std::move(std::get<0>(fwd)), lse = std::move(std::get<1>(fwd));
    at::Tensor g_wo, g_bo;
    out_proj_back(a, merge_heads(o), g_wo, g_bo);
    at::Tensor g_o = split_heads(at::matmul(a.g, a.wo), a.heads);
    auto bwd = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        g_o, qkv[0], qkv[1], qkv[2], o, lse, 0.0, a.causal);
    for (auto &t : qkv)
        t.reset();
    o.reset();
    lse.reset();
    g_o.reset();
    at::Tensor g_qkv[3] = {std::move(std::get<0>(bwd)), std::move(std::get<1>(bwd)),
                           std::move(std::get<2>(bwd))};
    return project_back(a, g_qkv, g_wo, g_bo);
}
#endif

} // namespace

extern "C" {

ebb_status ebb_tensor_multi_head_attention_backward(
    ebb_tensor **grad_in, ebb_tensor **grad_params, const ebb_tensor *grad, ebb_tensor *const *in,
    int n_in, const ebb_tensor *w_in, const ebb_tensor *b_in, const ebb_tensor *w_out,
    const ebb_tensor *b_out, int64_t heads, bool causal, const ebb_tensor *keep, double dropout) {
    static const char fn[] = "ebb_tensor_multi_head_attention_backward";
    if (dropout > 0 && !keep)
        return ebb_error_set(EBB_ERR_ARG, "%s: dropout %g without the forward's mask", fn, dropout);
    EBB_NEED(fn, grad_in);
    EBB_NEED(fn, grad_params);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, in);
    EBB_NEED(fn, w_in);
    EBB_NEED(fn, w_out);
    if (n_in < 1 || n_in > 3)
        return ebb_error_set(EBB_ERR_ARG, "%s: takes 1 to 3 inputs, got %d", fn, n_in);
    int n_params = b_in ? 4 : 2;
    for (int i = 0; i < n_in; i++) {
        grad_in[i] = nullptr;
        EBB_NEED(fn, in[i]);
    }
    for (int i = 0; i < n_params; i++)
        grad_params[i] = nullptr;
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &wi = w_in->t, &wo = w_out->t;
        int64_t e = wo.size(0);
        const at::Tensor &xq = in[0]->t, &xk = in[n_in > 1 ? 1 : 0]->t,
                         &xv = in[n_in > 2 ? 2 : n_in - 1]->t;
        TORCH_CHECK(xq.dim() == 3 && xq.size(2) == e && heads >= 1 && e % heads == 0,
                    "query ", xq.sizes(), " does not fit ", heads, " heads of width ", e);
        check_same("query", g, xq);
        MhaArgs a{g,     {&xq, &xk, &xv}, n_in, {}, {}, wo, b_out != nullptr, causal, heads, e,
                  dropout > 0 ? &keep->t : nullptr, dropout};
        for (int j = 0; j < 3; j++) {
            a.w[j] = wi.narrow(0, j * e, e);
            if (b_in)
                a.b[j] = b_in->t.narrow(0, j * e, e);
        }
        // the projections split into heads are [B, H, L, D] views with unit
        // stride, which the fused kernels take whenever the dtype and
        // lengths suit them, as in the forward
        std::vector<at::Tensor> outs;
#if EBB_FLASH_ATTENTION
        if (!a.keep && xq.is_cpu() &&
            ebb_attention_fused(ebb::from_aten(xq.scalar_type()), e / heads,
                                               e / heads, xq.size(1), xk.size(1)))
            outs = mha_backward_fused(a);
#endif
        if (outs.empty())
            outs = mha_backward_composite(a);
        std::vector<ebb_tensor *> made;
        try {
            for (auto &t : outs)
                made.push_back(wrap(t));
        } catch (...) {
            for (ebb_tensor *h : made)
                ebb_tensor_free(h);
            throw;
        }
        for (int i = 0; i < n_in; i++)
            grad_in[i] = made[static_cast<size_t>(i)];
        for (int i = 0; i < n_params; i++)
            grad_params[i] = made[static_cast<size_t>(n_in + i)];
    })
    return EBB_OK;
}

} // extern "C"

namespace {

void check_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                     const at::Tensor *mask) {
    TORCH_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() &&
                    k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2),
                "query ", q.sizes(), ", key ", k.sizes(), " and value ", v.sizes(),
                " do not fit [..., L, E], [..., S, E], [..., S, Ev]");
    if (mask) {
        std::vector<int64_t> scores(q.sizes().begin(), q.sizes().end());
        scores.back() = k.size(-2);
        TORCH_CHECK(at::infer_size(mask->sizes(), scores) == at::IntArrayRef(scores),
                    "the mask ", mask->sizes(), " does not broadcast to the scores ",
                    at::IntArrayRef(scores));
    }
}

// softmax(q k^T * scale [+ mask]) with the causal mask applied: the
// probabilities, the scores released as soon as the softmax has read them.
// A bool mask says which keys take part (true), as PyTorch's attn_mask; a
// float one is added to the scores.
at::Tensor attention_probs(const at::Tensor &q, const at::Tensor &k, const at::Tensor *mask,
                           bool causal, double scale) {
    at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
    if (causal) {
        at::Tensor above =
            at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu_(1);
        s.masked_fill_(above, -std::numeric_limits<double>::infinity());
    }
    if (mask && mask->scalar_type() == at::kBool)
        s.masked_fill_(mask->logical_not(), -std::numeric_limits<double>::infinity());
    else if (mask)
        s.add_(*mask);
    return at::softmax(s, -1);
}

} // namespace

extern "C" {

ebb_status ebb_tensor_attention_ex(ebb_tensor **out, ebb_tensor **keep, const ebb_tensor *q,
                                   const ebb_tensor *k, const ebb_tensor *v,
                                   const ebb_tensor *mask, bool causal, double dropout,
                                   uint64_t seed) {
    static const char fn[] = "ebb_tensor_attention_ex";
    clear({out, keep});
    EBB_NEED(fn, out);
    EBB_NEED(fn, q);
    EBB_NEED(fn, k);
    EBB_NEED(fn, v);
    if (!(dropout >= 0.0 && dropout < 1.0))
        return ebb_error_set(EBB_ERR_ARG, "%s: dropout must be in [0, 1), got %g", fn, dropout);
    if (dropout > 0 && !keep)
        return ebb_error_set(EBB_ERR_ARG, "%s: dropout %g needs `keep` for its mask", fn, dropout);
    if (!mask && dropout == 0)
        return ebb_tensor_attention(out, q, k, v, causal);
    EBB_TRY(fn, {
        const at::Tensor &qt = q->t, &kt = k->t, &vt = v->t;
        const at::Tensor *m = mask ? &mask->t : nullptr;
        check_attention(qt, kt, vt, m);
        at::Tensor p, kept;
        if (qt.is_meta()) {
            p = at::matmul(qt, kt.transpose(-2, -1));
            if (dropout > 0)
                kept = at::empty(p.sizes(), p.options().dtype(at::kBool));
        } else {
            p = attention_probs(qt, kt, m, causal, 1.0 / std::sqrt(static_cast<double>(qt.size(-1))));
            if (dropout > 0) {
                kept = keep_mask(p, dropout, seed);
                p = at::native_dropout_backward(p, kept, dropout_scale(dropout));
            }
        }
        at::Tensor o = at::matmul(p, vt);
        p.reset();
        hand_out({{out, std::move(o)}, {keep, std::move(kept)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_attention_backward(ebb_tensor **grad_q, ebb_tensor **grad_k,
                                            ebb_tensor **grad_v, const ebb_tensor *grad,
                                            const ebb_tensor *q, const ebb_tensor *k,
                                            const ebb_tensor *v, const ebb_tensor *mask,
                                            const ebb_tensor *keep, bool causal, double dropout) {
    static const char fn[] = "ebb_tensor_attention_backward";
    clear({grad_q, grad_k, grad_v});
    EBB_NEED(fn, grad_q);
    EBB_NEED(fn, grad_k);
    EBB_NEED(fn, grad_v);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, q);
    EBB_NEED(fn, k);
    EBB_NEED(fn, v);
    if (dropout > 0 && !keep)
        return ebb_error_set(EBB_ERR_ARG, "%s: dropout %g without the forward's mask", fn, dropout);
    EBB_TRY(fn, {
        const at::Tensor &qt = q->t, &kt = k->t, &vt = v->t, &g = grad->t;
        const at::Tensor *m = mask ? &mask->t : nullptr;
        check_attention(qt, kt, vt, m);
        at::Tensor gq, gk, gv;
#if EBB_FLASH_ATTENTION
        if (!m && dropout == 0 && qt.is_cpu() && qt.dim() == 4 && ebb::flash_takes(qt, kt, vt)) {
            // the forward again for its output and log-sum-exp, then the
            // kernel's backward; both are released before returning
            auto fwd = at::_scaled_dot_product_flash_attention_for_cpu(qt, kt, vt, 0.0, causal);
            at::Tensor o = std::move(std::get<0>(fwd)), lse = std::move(std::get<1>(fwd));
            auto bwd = at::_scaled_dot_product_flash_attention_for_cpu_backward(g, qt, kt, vt, o,
                                                                                lse, 0.0, causal);
            gq = std::move(std::get<0>(bwd));
            gk = std::move(std::get<1>(bwd));
            gv = std::move(std::get<2>(bwd));
        }
#endif
        if (!gq.defined()) {
            // softmax(q k^T * scale) v by the chain rule, the probabilities
            // recomputed; each temporary is released as soon as its last
            // reader has run (ops/attention.c counts them in this order)
            double scale = 1.0 / std::sqrt(static_cast<double>(qt.size(-1)));
            double dscale = dropout_scale(dropout);
            at::Tensor p = attention_probs(qt, kt, m, causal, scale);
            // on meta (the compiler's dry run) the same products in the same
            // layouts, without native_dropout_backward, which has no meta kernel
            bool drop = dropout > 0 && !qt.is_meta();
            if (drop) {
                at::Tensor pd = at::native_dropout_backward(p, keep->t, dscale);
                gv = at::matmul(pd.transpose(-2, -1), g);
            } else {
                gv = at::matmul(p.transpose(-2, -1), g);
            }
            at::Tensor gs = at::matmul(g, vt.transpose(-2, -1));
            if (drop)
                gs = at::native_dropout_backward(gs, keep->t, dscale);
            gs = at::_softmax_backward_data(gs, p, -1, p.scalar_type());
            p.reset();
            gs.mul_(scale);
            gq = at::matmul(gs, kt);
            gk = at::matmul(gs.transpose(-2, -1), qt);
        }
        hand_out({{grad_q, std::move(gq)}, {grad_k, std::move(gk)}, {grad_v, std::move(gv)}});
    })
    return EBB_OK;
}

/* ---- recurrent cells --------------------------------------------------------------- */

ebb_status ebb_tensor_gru_cell_backward(ebb_tensor **grad_x, ebb_tensor **grad_h,
                                        ebb_tensor **grad_w, const ebb_tensor *grad,
                                        const ebb_tensor *x, const ebb_tensor *h,
                                        const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                                        const ebb_tensor *b_ih, const ebb_tensor *b_hh) {
    static const char fn[] = "ebb_tensor_gru_cell_backward";
    EBB_NEED(fn, grad_w);
    clear({grad_x, grad_h, &grad_w[0], &grad_w[1], &grad_w[2], &grad_w[3]});
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, h);
    EBB_NEED(fn, w_ih);
    EBB_NEED(fn, w_hh);
    EBB_TRY(fn, {
        check_same("hidden state", grad->t, h->t);
        const at::Tensor &wi = w_ih->t, &wh = w_hh->t, &g = grad->t, &hx = h->t;
        // The gates again, from x and h. Written out rather than through
        // _thnn_differentiable_gru_cell_backward, whose temporaries differ
        // between libtorch versions: here every gate gradient is written in
        // place into the two [B, 3H] gradients, so the scratch is the same
        // on each (ops/recurrent.c counts it).
        at::Tensor ig = at::linear(x->t, wi), hg = at::linear(hx, wh);
        if (b_ih)
            ig.add_(b_ih->t);
        if (b_hh)
            hg.add_(b_hh->t);
        at::Tensor g_ig = at::empty_like(ig), g_hg = at::empty_like(hg), gh;
        {
            // r = s(i_r + h_r), z = s(i_z + h_z), n = tanh(i_n + r*h_n),
            // h' = n + z*(h - n)
            auto ic = ig.chunk(3, 1), hc = hg.chunk(3, 1);
            auto gi = g_ig.chunk(3, 1), gw = g_hg.chunk(3, 1);
            at::Tensor r = at::add(ic[0], hc[0]).sigmoid_();
            at::Tensor z = at::add(ic[1], hc[1]).sigmoid_();
            at::Tensor n = at::mul(r, hc[2]).add_(ic[2]).tanh_();
            gh = at::mul(g, z);
            at::sub_out(gi[2], g, gh); // g*(1 - z), into n's pre-activation
            at::tanh_backward_out(gi[2], gi[2], n);
            at::mul_out(gw[2], gi[2], r);
            at::sub_out(gi[1], hx, n); // g*(h - n), into z's
            gi[1].mul_(g);
            at::sigmoid_backward_out(gi[1], gi[1], z);
            at::mul_out(gi[0], gi[2], hc[2]); // through r*h_n, into r's
            at::sigmoid_backward_out(gi[0], gi[0], r);
            gw[0].copy_(gi[0]);
            gw[1].copy_(gi[1]);
        }
        ig.reset();
        hg.reset();
        at::Tensor gb_ih = b_ih ? g_ig.sum(0) : at::Tensor();
        at::Tensor gb_hh = b_hh ? g_hg.sum(0) : at::Tensor();
        at::Tensor gx = at::mm(g_ig, wi);
        gh.addmm_(g_hg, wh);
        hand_out({{grad_x, gx},
                  {grad_h, gh},
                  {&grad_w[0], at::mm(g_ig.t(), x->t)},
                  {&grad_w[1], at::mm(g_hg.t(), hx)},
                  {b_ih ? &grad_w[2] : nullptr, gb_ih},
                  {b_hh ? &grad_w[3] : nullptr, gb_hh}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_lstm_cell_backward(ebb_tensor **grad_x, ebb_tensor **grad_h,
                                         ebb_tensor **grad_c, ebb_tensor **grad_w,
                                         const ebb_tensor *grad_hy, const ebb_tensor *grad_cy,
                                         const ebb_tensor *x, const ebb_tensor *h,
                                         const ebb_tensor *c, const ebb_tensor *cy,
                                         const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                                         const ebb_tensor *b_ih, const ebb_tensor *b_hh) {
    static const char fn[] = "ebb_tensor_lstm_cell_backward";
    EBB_NEED(fn, grad_w);
    clear({grad_x, grad_h, grad_c, &grad_w[0], &grad_w[1], &grad_w[2], &grad_w[3]});
    EBB_NEED(fn, grad_hy);
    EBB_NEED(fn, grad_cy);
    EBB_NEED(fn, x);
    EBB_NEED(fn, h);
    EBB_NEED(fn, c);
    EBB_NEED(fn, cy);
    EBB_NEED(fn, w_ih);
    EBB_NEED(fn, w_hh);
    EBB_TRY(fn, {
        check_same("hidden state", grad_hy->t, h->t);
        check_same("cell state", grad_cy->t, c->t);
        const at::Tensor &wi = w_ih->t, &wh = w_hh->t;
        at::Tensor ig = at::linear(x->t, wi), hg = at::linear(h->t, wh);
        auto r = at::_thnn_differentiable_lstm_cell_backward(
            grad_hy->t, grad_cy->t, ig, hg, opt(b_ih), opt(b_hh), c->t, cy->t);
        // one gradient for both gate projections: they are summed
        const at::Tensor &g_gates = std::get<0>(r);
        hand_out({{grad_x, at::mm(g_gates, wi)},
                  {grad_h, at::mm(g_gates, wh)},
                  {grad_c, std::get<2>(r)},
                  {&grad_w[0], at::mm(g_gates.t(), x->t)},
                  {&grad_w[1], at::mm(g_gates.t(), h->t)},
                  {b_ih ? &grad_w[2] : nullptr, std::get<3>(r)},
                  {b_hh ? &grad_w[3] : nullptr, std::get<4>(r)}});
    })
    return EBB_OK;
}

} // extern "C"
