// Losses: torch.nn.functional's cross_entropy, nll_loss, mse_loss and
// binary_cross_entropy_with_logits at their default mean reduction, and
// their derivatives (ops/loss.c holds the ops).
//
// The forwards make the ATen calls PyTorch 1.13's functional makes, in its
// order, so a loss is PyTorch's to the bit on the same build. The
// derivatives call ATen's kernels (nll_loss_backward with the forward's
// total_weight, _log_softmax_backward_data, mse_loss_backward); libtorch
// 1.13 has no kernel for binary_cross_entropy_with_logits, so its derivative
// is autograd's formula, (sigmoid(x) - t) * grad / numel.
//
// Class targets are checked for dtype and shape here; a class index out of
// range is reported by ATen's CPU kernels ("Target 7 is out of bounds."),
// and checked here first on CUDA, where the kernel would stop the device
// with an assert instead.
#include <string>
#include <tuple>
#include <vector>

#include "shim.hpp"

using ebb::clear;
using ebb::dims;
using ebb::hand_out;
using ebb::wrap;

namespace {

const char *dtype_name(const at::Tensor &t) {
    return ebb_dtype_name(ebb::from_aten(t.scalar_type()));
}

bool is_meta(const at::Tensor &t) { return t.device().type() == at::kMeta; }

// The class dim: scores [B, C] or a single sample's [C].
int64_t class_dim(const at::Tensor &x) { return x.dim() == 1 ? 0 : 1; }

// Scores [B, C] with int64 targets [B], or [C] with a 0-dim target.
ebb_status check_classes(const char *fn, const char *what, const at::Tensor &x,
                         const at::Tensor &t) {
    if (!at::isFloatingType(x.scalar_type()))
        return ebb_error_set(EBB_ERR_ARG, "%s: %s %s are %s; expected a floating dtype", fn, what,
                             dims(x).c_str(), dtype_name(x));
    if (x.dim() != 1 && x.dim() != 2)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: %s %s must be [B, C] or [C]", fn, what,
                             dims(x).c_str());
    if (t.scalar_type() != at::kLong)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: target is %s %s; it needs int64 class indices (%s %s %s)", fn,
                             dtype_name(t), dims(t).c_str(), what, dtype_name(x),
                             dims(x).c_str());
    bool fits = x.dim() == 1 ? t.dim() == 0 : t.dim() == 1 && t.size(0) == x.size(0);
    if (!fits)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: target %s does not fit %s %s: expected %s", fn,
                             dims(t).c_str(), what, dims(x).c_str(),
                             x.dim() == 1 ? "[]" : ("[" + std::to_string(x.size(0)) + "]").c_str());
    if (t.device() != x.device())
        return ebb_error_set(EBB_ERR_ARG, "%s: target %s and %s %s are on different devices", fn,
                             dims(t).c_str(), what, dims(x).c_str());
    return EBB_OK;
}

// The first class index in t outside [0, classes) other than ignore_index,
// read back to the host (a synchronisation on a GPU); false when there is none.
bool first_bad_class(const at::Tensor &t, int64_t classes, int64_t ignore_index, int64_t *v) {
    at::Tensor bad = at::logical_and(at::logical_or(t < 0, t >= classes), t != ignore_index);
    if (!bad.any().item<bool>())
        return false;
    *v = t.masked_select(bad).view({-1})[0].item<int64_t>();
    return true;
}

// On CUDA, nll_loss's kernel asserts on a class index outside [0, C) (other
// than ignore_index), which ends the process's use of the device: check on
// the host first, at the price of a synchronisation. The CPU kernel reports
// it as an error itself.
ebb_status check_range_on_device(const char *fn, const at::Tensor &x, const at::Tensor &t,
                                 int64_t ignore_index) {
    if (!t.is_cuda() || t.numel() == 0)
        return EBB_OK;
#ifdef EBB_WITH_CUDA
    // a captured training step checks its targets before each replay
    // (ebb_capture_train_step), as a graph cannot read them back
    if (ebb::cuda_capturing())
        return EBB_OK;
#endif
    int64_t c = x.size(class_dim(x)), v = 0;
    if (!first_bad_class(t, c, ignore_index, &v))
        return EBB_OK;
    return ebb_error_set(EBB_ERR_ARG, "%s: class index %lld in target %s is out of range for %lld "
                         "classes (scores %s)",
                         fn, static_cast<long long>(v), dims(t).c_str(), static_cast<long long>(c),
                         dims(x).c_str());
}

// Two float tensors of one shape and dtype (mse, bce_with_logits).
ebb_status check_pair(const char *fn, const char *what, const at::Tensor &x, const at::Tensor &t) {
    if (!at::isFloatingType(x.scalar_type()) || x.scalar_type() != t.scalar_type() ||
        !x.sizes().equals(t.sizes()))
        return ebb_error_set(x.sizes().equals(t.sizes()) ? EBB_ERR_ARG : EBB_ERR_SHAPE,
                             "%s: %s %s %s and target %s %s must have one shape and one floating "
                             "dtype",
                             fn, what, dtype_name(x), dims(x).c_str(), dtype_name(t),
                             dims(t).c_str());
    if (t.device() != x.device())
        return ebb_error_set(EBB_ERR_ARG, "%s: target %s and %s %s are on different devices", fn,
                             dims(t).c_str(), what, dims(x).c_str());
    return EBB_OK;
}

ebb_status check_scalar_grad(const char *fn, const at::Tensor &g) {
    if (g.numel() != 1)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: output gradient %s of a mean loss must have one "
                             "element",
                             fn, dims(g).c_str());
    return EBB_OK;
}

#define EBB_CHECK(call)                                                                            \
    do {                                                                                           \
        ebb_status ebb_check_st_ = (call);                                                         \
        if (ebb_check_st_ != EBB_OK)                                                               \
            return ebb_check_st_;                                                                  \
    } while (0)

} // namespace

extern "C" {

/* ---- forwards ----------------------------------------------------------------- */

ebb_status ebb_tensor_cross_entropy(ebb_tensor **out, ebb_tensor **log_probs,
                                    ebb_tensor **total_weight, const ebb_tensor *logits,
                                    const ebb_tensor *target, int64_t ignore_index,
                                    double label_smoothing) {
    static const char fn[] = "ebb_tensor_cross_entropy";
    clear({out, log_probs, total_weight});
    EBB_NEED(fn, out);
    EBB_NEED(fn, logits);
    EBB_NEED(fn, target);
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
        return ebb_error_set(EBB_ERR_ARG, "%s: label_smoothing must be in [0, 1], got %g", fn,
                             label_smoothing);
    EBB_TRY(fn, {
        const at::Tensor &x = logits->t, &t = target->t;
        EBB_CHECK(check_classes(fn, "logits", x, t));
        if (is_meta(x)) {
            hand_out({{out, at::empty({}, x.options())},
                      {log_probs, at::empty_like(x)},
                      {total_weight, at::empty({}, x.options())}});
            return EBB_OK;
        }
        EBB_CHECK(check_range_on_device(fn, x, t, ignore_index));
        // cross_entropy_loss and, with smoothing, cross_entropy_loss_label_smoothing
        int64_t cd = class_dim(x);
        at::Tensor logp = at::log_softmax(x, cd, x.scalar_type());
        auto nll = at::nll_loss_forward(logp, t, {}, at::Reduction::Mean, ignore_index);
        at::Tensor loss = std::get<0>(nll);
        const at::Tensor &tw = std::get<1>(nll);
        if (label_smoothing > 0.0) {
            // PyTorch's (1 - ls) * nll + ls/C * sum(-logp.sum(cd) masked) / count,
            // the same roundings in place and one step at a time, so the
            // scratch is what ebb_op.workspace says; the count of counted
            // rows is nll's total_weight, the float of the int64 count
            // PyTorch divides by
            at::Tensor smooth = logp.sum(cd);
            smooth.neg_();
            smooth.masked_fill_(t == ignore_index, 0.0);
            at::Tensor ret = smooth.sum();
            smooth.reset();
            ret.div_(tw).mul_(label_smoothing / static_cast<double>(x.size(cd)));
            loss.mul_(1 - label_smoothing).add_(ret);
        }
        hand_out({{out, loss}, {log_probs, logp}, {total_weight, tw}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_nll_loss(ebb_tensor **out, ebb_tensor **total_weight,
                               const ebb_tensor *log_probs, const ebb_tensor *target,
                               int64_t ignore_index) {
    static const char fn[] = "ebb_tensor_nll_loss";
    clear({out, total_weight});
    EBB_NEED(fn, out);
    EBB_NEED(fn, log_probs);
    EBB_NEED(fn, target);
    EBB_TRY(fn, {
        const at::Tensor &x = log_probs->t, &t = target->t;
        EBB_CHECK(check_classes(fn, "log_probs", x, t));
        EBB_CHECK(check_range_on_device(fn, x, t, ignore_index));
        // the meta device has nll_loss_forward's kernel
        auto r = at::nll_loss_forward(x, t, {}, at::Reduction::Mean, ignore_index);
        hand_out({{out, std::get<0>(r)}, {total_weight, std::get<1>(r)}});
    })
    return EBB_OK;
}

ebb_status ebb_tensor_mse_loss(ebb_tensor **out, const ebb_tensor *pred, const ebb_tensor *target) {
    static const char fn[] = "ebb_tensor_mse_loss";
    EBB_OUT(fn, out);
    EBB_NEED(fn, pred);
    EBB_NEED(fn, target);
    EBB_TRY(fn, {
        EBB_CHECK(check_pair(fn, "pred", pred->t, target->t));
        // libtorch 1.13 makes the 0-dim result with the storage of an
        // elementwise one (numel elements) and keeps it: a copy frees it, so
        // the output holds its one element only
        *out = wrap(at::mse_loss(pred->t, target->t, at::Reduction::Mean).clone());
    })
    return EBB_OK;
}

ebb_status ebb_tensor_bce_with_logits(ebb_tensor **out, const ebb_tensor *logits,
                                      const ebb_tensor *target) {
    static const char fn[] = "ebb_tensor_bce_with_logits";
    EBB_OUT(fn, out);
    EBB_NEED(fn, logits);
    EBB_NEED(fn, target);
    EBB_TRY(fn, {
        const at::Tensor &x = logits->t, &t = target->t;
        EBB_CHECK(check_pair(fn, "logits", x, t));
        if (is_meta(x)) {
            *out = wrap(at::empty({}, x.options()));
            return EBB_OK;
        }
        // softplus(x) - t*x, the mean of (1-t)*x - log(sigmoid(x)) in one
        // input-sized temporary: libtorch's own binary_cross_entropy_with_logits
        // keeps five (1.13) or three (2.x), so its scratch would depend on
        // the version
        at::Tensor loss = at::softplus(x, 1, 20);
        loss.addcmul_(t, x, -1);
        *out = wrap(loss.mean());
    })
    return EBB_OK;
}

/* ---- derivatives -------------------------------------------------------------- */

ebb_status ebb_tensor_cross_entropy_backward(ebb_tensor **grad_logits, const ebb_tensor *grad,
                                             const ebb_tensor *log_probs,
                                             const ebb_tensor *target,
                                             const ebb_tensor *total_weight,
                                             int64_t ignore_index, double label_smoothing) {
    static const char fn[] = "ebb_tensor_cross_entropy_backward";
    EBB_OUT(fn, grad_logits);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, log_probs);
    EBB_NEED(fn, target);
    EBB_NEED(fn, total_weight);
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
        return ebb_error_set(EBB_ERR_ARG, "%s: label_smoothing must be in [0, 1], got %g", fn,
                             label_smoothing);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &lp = log_probs->t, &t = target->t, &tw = total_weight->t;
        EBB_CHECK(check_classes(fn, "log_probs", lp, t));
        EBB_CHECK(check_scalar_grad(fn, g));
        if (is_meta(lp)) { // shapes only
            *grad_logits = wrap(at::empty_like(lp));
            return EBB_OK;
        }
        int64_t cd = class_dim(lp);
        at::Tensor g_lp =
            at::nll_loss_backward(g, lp, t, {}, at::Reduction::Mean, ignore_index, tw);
        if (label_smoothing > 0.0) {
            // (1 - ls) of nll's gradient, less the smoothing term's: ls/C
            // times the mean over counted rows of -sum(log_probs) gives every
            // class of a counted row the same share, an ignored row nothing
            // (also when none counts and the share is infinite, as autograd
            // has it)
            g_lp.mul_(1 - label_smoothing);
            at::Tensor share = g.mul(label_smoothing / static_cast<double>(lp.size(cd)));
            share.div_(tw);
            g_lp.sub_(share);
            share.reset();
            at::Tensor ignored = t == ignore_index;
            g_lp.masked_fill_(cd == 1 ? ignored.unsqueeze(1) : ignored, 0.0);
        }
        *grad_logits = wrap(at::_log_softmax_backward_data(g_lp, lp, cd, lp.scalar_type()));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_nll_loss_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                        const ebb_shape *x, const ebb_tensor *target,
                                        const ebb_tensor *total_weight, int64_t ignore_index) {
    static const char fn[] = "ebb_tensor_nll_loss_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, x);
    EBB_NEED(fn, target);
    EBB_NEED(fn, total_weight);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t, &tw = total_weight->t;
        // nll_loss_backward reads only its input's sizes and dtype: a
        // zero-stride view of total_weight (the input's dtype) stands in for
        // it, so the log-probabilities need not be kept for the backward
        at::Tensor self = tw.reshape({}).expand(ebb::dims_of(x));
        EBB_CHECK(check_classes(fn, "log_probs", self, target->t));
        EBB_CHECK(check_scalar_grad(fn, g));
        *grad_x = wrap(at::nll_loss_backward(g, self, target->t, {}, at::Reduction::Mean,
                                             ignore_index, tw));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_mse_loss_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                        const ebb_tensor *pred, const ebb_tensor *target) {
    static const char fn[] = "ebb_tensor_mse_loss_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, pred);
    EBB_NEED(fn, target);
    EBB_TRY(fn, {
        EBB_CHECK(check_pair(fn, "pred", pred->t, target->t));
        EBB_CHECK(check_scalar_grad(fn, grad->t));
        if (is_meta(pred->t)) { // mse_loss_backward has no meta kernel in 1.13
            *grad_x = wrap(at::empty_like(pred->t));
            return EBB_OK;
        }
        *grad_x = wrap(at::mse_loss_backward(grad->t, pred->t, target->t, at::Reduction::Mean));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_bce_with_logits_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                               const ebb_tensor *logits,
                                               const ebb_tensor *target) {
    static const char fn[] = "ebb_tensor_bce_with_logits_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, logits);
    EBB_NEED(fn, target);
    EBB_TRY(fn, {
        const at::Tensor &x = logits->t;
        EBB_CHECK(check_pair(fn, "logits", x, target->t));
        EBB_CHECK(check_scalar_grad(fn, grad->t));
        // autograd's formula, in place in the one tensor it makes
        at::Tensor gx = at::sigmoid(x);
        gx.sub_(target->t).mul_(grad->t.reshape({})).div_(x.numel());
        *grad_x = wrap(std::move(gx));
    })
    return EBB_OK;
}

} // extern "C"

extern "C" ebb_status ebb_tensor_check_class_range(const ebb_tensor *t, int64_t classes,
                                                   int64_t ignore_index) {
    static const char fn[] = "ebb_tensor_check_class_range";
    EBB_NEED(fn, t);
    EBB_TRY(fn, {
        const at::Tensor &x = t->t;
        int64_t v = 0;
        if (x.numel() == 0 || !first_bad_class(x, classes, ignore_index, &v))
            return EBB_OK;
        return ebb_error_set(EBB_ERR_ARG, "class index %lld in target %s is out of range for "
                             "%lld classes",
                             static_cast<long long>(v), dims(x).c_str(),
                             static_cast<long long>(classes));
    })
    return EBB_OK;
}
