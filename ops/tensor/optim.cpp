// Optimizer update kernels: one in-place update of one parameter, as
// PyTorch 1.13's torch.optim computes it in its single-tensor code paths
// (_single_tensor_sgd, _single_tensor_adam, _single_tensor_adamw). The same
// ATen ops run in the same order with the same scalar arguments, so results
// agree with torch.optim bit for bit where the kernels are the same.
//
// Two liberties, neither of which changes a value: every tensor an update
// needs is allocated before the first in-place write (so a failed
// allocation leaves the parameter and its state as they were), and where
// torch.optim makes a fresh tensor from a temporary it writes into that
// temporary's storage instead (the `_out` and in-place forms of the same
// kernels), which keeps an update's scratch to one parameter-sized tensor.
#include <cmath>
#include <string>
#include <vector>

#include "ebb/op.h"
#include "ebb/optim.h"
#include "internal.h"
#include "shim.hpp"

namespace {

using ebb::describe;

// A tensor that an update reads or writes beside the parameter must match it
// exactly: ATen would broadcast a [16] gradient over a [4, 16] parameter, or
// promote a float64 one, without complaint. Returns what is wrong, or "".
std::string mismatch(const char *what, const at::Tensor &t, const at::Tensor &param) {
    if (t.sizes().equals(param.sizes()) && t.scalar_type() == param.scalar_type() &&
        t.device() == param.device())
        return "";
    return std::string(what) + " is " + describe(t) + ", the parameter is " + describe(param);
}

// Frees a handle made during an update unless the update hands it out; it
// lives outside EBB_TRY, whose catch returns straight away.
struct Made {
    ebb_tensor *h = nullptr;
    ~Made() { ebb_tensor_free(h); }
    ebb_tensor *release() {
        ebb_tensor *out = h;
        h = nullptr;
        return out;
    }
};

void check_param(const at::Tensor &param) {
    if (!at::isFloatingType(param.scalar_type()))
        throw std::invalid_argument("the parameter is " + describe(param) +
                                    "; optimizers update floating-point tensors only");
}

} // namespace

extern "C" {

ebb_status ebb_tensor_sgd_update_(ebb_tensor *param, const ebb_tensor *grad,
                                  ebb_tensor **momentum_buffer, const ebb_optimizer_options *opts) {
    return ebb_tensor_sgd_update_hyper_(param, grad, momentum_buffer, opts, nullptr);
}

// With `hyper` (a row of the device hyperparameters, src/optim.c), -lr is
// read from hyper[0] on the device instead of taken as a number, so that a
// CUDA graph that records the update reads the rate of each replay.
ebb_status ebb_tensor_sgd_update_hyper_(ebb_tensor *param, const ebb_tensor *grad,
                                        ebb_tensor **momentum_buffer,
                                        const ebb_optimizer_options *opts,
                                        const ebb_tensor *hyper) {
    const char *fn = "ebb_tensor_sgd_update_";
    EBB_NEED(fn, param);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, opts);
    const double lr = opts->lr, momentum = opts->momentum, dampening = opts->dampening,
                 weight_decay = opts->weight_decay;
    const bool nesterov = opts->nesterov != 0;
    if (momentum != 0) EBB_NEED(fn, momentum_buffer);
    Made fresh; // the buffer made by this call
    EBB_TRY(fn, {
        at::Tensor &p = param->t;
        check_param(p);
        std::string bad = mismatch("the gradient", grad->t, p);
        if (bad.empty() && momentum != 0 && *momentum_buffer)
            bad = mismatch("the momentum buffer", (*momentum_buffer)->t, p);
        if (!bad.empty()) return ebb_error_set(EBB_ERR_SHAPE, "%s: %s", fn, bad.c_str());

        // d_p is the gradient itself until weight decay makes it a temporary
        // that this update owns and may overwrite.
        at::Tensor d_p = grad->t;
        bool owned = false;
        if (weight_decay != 0) {
            d_p = at::add(d_p, p, weight_decay);
            owned = true;
        }
        at::Tensor buf, nesterov_out;
        if (momentum != 0) {
            if (!*momentum_buffer) {
                // torch.optim clones d_p; an owned d_p that is not read again
                // (no Nesterov term) can become the buffer as it is.
                buf = (owned && !nesterov) ? d_p : at::clone(d_p);
                fresh.h = ebb::wrap(buf);
            } else {
                buf = (*momentum_buffer)->t;
            }
            if (nesterov && !owned) nesterov_out = at::empty_like(d_p);
        }

        if (momentum != 0) {
            if (!fresh.h) buf.mul_(momentum).add_(d_p, 1 - dampening);
            if (nesterov) {
                if (owned)
                    d_p.add_(buf, momentum);
                else
                    d_p = at::add_out(nesterov_out, d_p, buf, momentum);
            } else {
                d_p = buf;
            }
        }
        if (hyper)
            p.addcmul_(d_p, hyper->t.select(0, 0)); // p + d_p * (-lr)
        else
            p.add_(d_p, -lr);
        if (fresh.h) *momentum_buffer = fresh.release();
    });
    return EBB_OK;
}

ebb_status ebb_tensor_adam_update_(ebb_tensor *param, const ebb_tensor *grad, ebb_tensor *exp_avg,
                                   ebb_tensor *exp_avg_sq, ebb_tensor *max_exp_avg_sq, int64_t step,
                                   const ebb_optimizer_options *opts) {
    return ebb_tensor_adam_update_hyper_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step,
                                         opts, nullptr);
}

// With `hyper` (src/optim.c), the three values that change with the step or
// the learning rate come from the device: hyper[0] = -lr / (1 - beta1^t),
// hyper[1] = sqrt(1 - beta2^t), hyper[2] = 1 - lr * weight_decay. addcdiv_
// takes its factor only as a number, so the last line becomes a division
// into the scratch tensor and an addcmul_ by hyper[0]: the same products,
// with no more scratch.
ebb_status ebb_tensor_adam_update_hyper_(ebb_tensor *param, const ebb_tensor *grad,
                                         ebb_tensor *exp_avg, ebb_tensor *exp_avg_sq,
                                         ebb_tensor *max_exp_avg_sq, int64_t step,
                                         const ebb_optimizer_options *opts,
                                         const ebb_tensor *hyper) {
    const char *fn = "ebb_tensor_adam_update_";
    EBB_NEED(fn, param);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, exp_avg);
    EBB_NEED(fn, exp_avg_sq);
    EBB_NEED(fn, opts);
    const bool amsgrad = opts->amsgrad != 0, decoupled = opts->kind == EBB_ADAMW;
    if (amsgrad) EBB_NEED(fn, max_exp_avg_sq);
    if (step < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: step is %lld; the first update is step 1", fn,
                             static_cast<long long>(step));
    const double lr = opts->lr, beta1 = opts->beta1, beta2 = opts->beta2, eps = opts->eps,
                 weight_decay = opts->weight_decay;
    EBB_TRY(fn, {
        at::Tensor &p = param->t;
        check_param(p);
        std::string bad = mismatch("the gradient", grad->t, p);
        if (bad.empty()) bad = mismatch("exp_avg", exp_avg->t, p);
        if (bad.empty()) bad = mismatch("exp_avg_sq", exp_avg_sq->t, p);
        if (bad.empty() && amsgrad) bad = mismatch("max_exp_avg_sq", max_exp_avg_sq->t, p);
        if (!bad.empty()) return ebb_error_set(EBB_ERR_SHAPE, "%s: %s", fn, bad.c_str());

        // One scratch tensor serves first as Adam's L2-decayed gradient and
        // then as the denominator: the gradient is not read after the moments.
        at::Tensor scratch = at::empty_like(p);

        // Python evaluates these in double precision with C's pow and sqrt.
        const double s = static_cast<double>(step);
        const double bias_correction1 = 1 - std::pow(beta1, s);
        const double bias_correction2 = 1 - std::pow(beta2, s);
        const double step_size = lr / bias_correction1;
        const double bias_correction2_sqrt = std::sqrt(bias_correction2);

        // A Scalar operand of mul_, div_ or add_ becomes a small tensor that
        // libtorch allocates inside the call on the CPU: after the first
        // write, where running out of memory would leave the parameter
        // half-updated. So on the CPU they are made here, before anything is
        // written, as 0-dim tensors of the parameter's dtype (the value the
        // kernels would have read).
        const bool cpu = p.is_cpu();
        auto operand = [&](double v) {
            return cpu ? at::scalar_tensor(v, p.options()) : at::Tensor();
        };
        const bool decay_p = decoupled && weight_decay != 0;
        // torch.optim multiplies by 1 - lr * 0 = 1 too, which changes nothing.
        at::Tensor c_decay = decay_p ? operand(1 - lr * weight_decay) : at::Tensor();
        at::Tensor c_beta1 = operand(beta1), c_beta2 = operand(beta2);
        at::Tensor c_bc2 = operand(bias_correction2_sqrt), c_eps = operand(eps);
        auto mul = [](at::Tensor &x, const at::Tensor &c, double v) -> at::Tensor & {
            return c.defined() ? x.mul_(c) : x.mul_(v);
        };

        at::Tensor g = grad->t;
        if (decay_p && hyper)
            p.mul_(hyper->t.select(0, 2));
        else if (decay_p)
            mul(p, c_decay, 1 - lr * weight_decay);
        else if (!decoupled && weight_decay != 0)
            g = at::add_out(scratch, g, p, weight_decay);
        mul(exp_avg->t, c_beta1, beta1).add_(g, 1 - beta1);
        mul(exp_avg_sq->t, c_beta2, beta2).addcmul_(g, g, 1 - beta2);

        const at::Tensor *second = &exp_avg_sq->t;
        if (amsgrad) {
            at::maximum_out(max_exp_avg_sq->t, max_exp_avg_sq->t, exp_avg_sq->t);
            second = &max_exp_avg_sq->t;
        }
        at::Tensor denom = at::sqrt_out(scratch, *second);
        if (hyper) {
            denom.div_(hyper->t.select(0, 1)).add_(eps);
            at::div_out(scratch, exp_avg->t, denom);
            p.addcmul_(scratch, hyper->t.select(0, 0));
            return EBB_OK;
        }
        if (cpu)
            denom.div_(c_bc2).add_(c_eps);
        else
            denom.div_(bias_correction2_sqrt).add_(eps);
        p.addcdiv_(exp_avg->t, denom, -step_size);
    });
    return EBB_OK;
}

} // extern "C": the helpers below are C++, whose types C linkage cannot carry

// The CPU operands of Scalar arguments that libtorch would wrap in a tensor
// mid-update (x.mul_(0.9), x.add_(eps)): made up front, as in Adam's update,
// 0-dim tensors of the parameter's dtype; on a GPU the Scalars are passed as
// they are (they stay on the host).
namespace {
struct Operand {
    at::Tensor t;
    double v;
};
Operand operand(const at::Tensor &p, double v) {
    return {p.is_cpu() ? at::scalar_tensor(v, p.options()) : at::Tensor(), v};
}
at::Tensor &mul_by(at::Tensor &x, const Operand &c) {
    return c.t.defined() ? x.mul_(c.t) : x.mul_(c.v);
}
at::Tensor &add_to(at::Tensor &x, const Operand &c) {
    return c.t.defined() ? x.add_(c.t) : x.add_(c.v);
}
// out = x + c, as x.add(c) computes it, into storage made beforehand
at::Tensor &add_out(at::Tensor &out, const at::Tensor &x, const Operand &c) {
    return c.t.defined() ? at::add_out(out, x, c.t) : add_to(out.copy_(x), c);
}
// p -= step * num / den as addcdiv_ computes it, or with `hyper` (a captured
// update) as num / den into `scratch` and an addcmul_ by hyper[0] = -step
void step_addcdiv(at::Tensor &p, const at::Tensor &num, at::Tensor &den, double step,
                  const ebb_tensor *hyper) {
    if (hyper) {
        at::div_out(den, num, den);
        p.addcmul_(den, hyper->t.select(0, 0));
    } else {
        p.addcdiv_(num, den, -step);
    }
}
void check_state(const char *what, const ebb_tensor *t, const at::Tensor &p, std::string &bad) {
    if (bad.empty() && t) bad = mismatch(what, t->t, p);
}
} // namespace

// clip_grad_norm_'s checks: grads[0..n) (NULL entries skipped) share a
// floating dtype and a device; *first receives the first (nullptr: none).
ebb_status ebb::clip_grad_norm_check(const char *fn, ebb_tensor *const *grads, int n,
                                     double max_norm, const at::Tensor **first) {
    *first = nullptr;
    if (n < 0 || (n > 0 && !grads))
        return ebb_error_set(EBB_ERR_ARG, "%s: %d gradients at %p", fn, n, (const void *)grads);
    if (!(max_norm > 0))
        return ebb_error_set(EBB_ERR_ARG, "%s: max_norm %g must be positive", fn, max_norm);
    for (int i = 0; i < n; i++) {
        if (!grads[i]) continue;
        const at::Tensor &g = grads[i]->t;
        if (!*first) {
            *first = &g;
            if (!at::isFloatingType(g.scalar_type()))
                return ebb_error_set(EBB_ERR_ARG, "%s: gradient %d is %s; norms are of floating "
                                     "point", fn, i, describe(g).c_str());
        } else if (g.scalar_type() != (*first)->scalar_type() || g.device() != (*first)->device()) {
            return ebb_error_set(EBB_ERR_SHAPE, "%s: gradient %d is %s, the first is %s", fn, i,
                                 describe(g).c_str(), describe(**first).c_str());
        }
    }
    return EBB_OK;
}

// Whether grads[i] holds what an earlier gradient holds: one tensor for
// two parameters' gradients (lstm_cell's biases). Its norm counts twice,
// as torch's two .grad tensors would, but it is scaled in place once.
bool ebb::repeated_grad(ebb_tensor *const *grads, int i) {
    const at::Tensor &t = grads[i]->t;
    for (int j = 0; j < i; j++)
        if (grads[j] && grads[j]->t.data_ptr() == t.data_ptr() &&
            grads[j]->t.numel() == t.numel() && grads[j]->t.scalar_type() == t.scalar_type())
            return true;
    return false;
}

// The L2 norm of grads[0..n) together, as torch computes it: each
// gradient's vector norm, then the norm of their stack. The scratch peaks
// here, at 2n + 1 elements (the norms, their stack and the total), and
// only the total is left.
at::Tensor ebb::grad_norm(ebb_tensor *const *grads, int n) {
    std::vector<at::Tensor> norms;
    norms.reserve((size_t)n);
    for (int i = 0; i < n; i++)
        if (grads[i]) norms.push_back(at::linalg_vector_norm(grads[i]->t, 2));
    return at::linalg_vector_norm(at::stack(norms), 2);
}

// max_norm / (total + 1e-6) clamped at 1, in the arithmetic of `dtype` as
// torch's one-element kernels compute it (x.reciprocal() * max_norm is
// Python's max_norm / x): float64 for double gradients, float32 otherwise.
double ebb::clip_factor(double total, at::ScalarType dtype, double max_norm) {
    if (dtype == at::kDouble) {
        double f = (1.0 / (total + 1e-6)) * max_norm;
        return f < 1.0 ? f : 1.0;
    }
    float v = static_cast<float>(total);
    float r = 1.0f / (v + static_cast<float>(1e-6));
    float c = r * static_cast<float>(max_norm);
    return c < 1.0f ? c : 1.0f;
}

extern "C" {

ebb_status ebb_tensor_rmsprop_update_(ebb_tensor *param, const ebb_tensor *grad,
                                      ebb_tensor *square_avg, ebb_tensor *grad_avg,
                                      ebb_tensor *momentum_buffer,
                                      const ebb_optimizer_options *opts,
                                      const ebb_tensor *hyper) {
    const char *fn = "ebb_tensor_rmsprop_update_";
    EBB_NEED(fn, param);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, square_avg);
    EBB_NEED(fn, opts);
    const double lr = opts->lr, alpha = opts->rho, eps = opts->eps, wd = opts->weight_decay,
                 momentum = opts->momentum;
    if (opts->centered) EBB_NEED(fn, grad_avg);
    if (momentum > 0) EBB_NEED(fn, momentum_buffer);
    EBB_TRY(fn, {
        at::Tensor &p = param->t;
        check_param(p);
        std::string bad = mismatch("the gradient", grad->t, p);
        check_state("square_avg", square_avg, p, bad);
        check_state("grad_avg", opts->centered ? grad_avg : nullptr, p, bad);
        check_state("the momentum buffer", momentum > 0 ? momentum_buffer : nullptr, p, bad);
        if (!bad.empty()) return ebb_error_set(EBB_ERR_SHAPE, "%s: %s", fn, bad.c_str());
        // everything allocated before the first write
        at::Tensor decayed = wd != 0 ? at::empty_like(p) : at::Tensor();
        at::Tensor avg = at::empty_like(p);
        Operand c_alpha = operand(p, alpha), c_eps = operand(p, eps);
        Operand c_mom = momentum > 0 ? operand(p, momentum) : Operand{at::Tensor(), 0.0};
        at::Tensor g = wd != 0 ? at::add_out(decayed, grad->t, p, wd) : grad->t;
        mul_by(square_avg->t, c_alpha).addcmul_(g, g, 1 - alpha);
        if (opts->centered) {
            mul_by(grad_avg->t, c_alpha).add_(g, 1 - alpha);
            at::addcmul_out(avg, square_avg->t, grad_avg->t, grad_avg->t, -1).sqrt_();
        } else {
            at::sqrt_out(avg, square_avg->t);
        }
        add_to(avg, c_eps);
        if (momentum > 0) {
            mul_by(momentum_buffer->t, c_mom).addcdiv_(g, avg);
            if (hyper)
                p.addcmul_(momentum_buffer->t, hyper->t.select(0, 0));
            else
                p.add_(momentum_buffer->t, -lr);
        } else {
            step_addcdiv(p, g, avg, lr, hyper);
        }
    });
    return EBB_OK;
}

ebb_status ebb_tensor_adagrad_update_(ebb_tensor *param, const ebb_tensor *grad, ebb_tensor *sum,
                                      int64_t step, const ebb_optimizer_options *opts,
                                      const ebb_tensor *hyper) {
    const char *fn = "ebb_tensor_adagrad_update_";
    EBB_NEED(fn, param);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, sum);
    EBB_NEED(fn, opts);
    if (step < 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: step is %lld; the first update is step 1", fn,
                             static_cast<long long>(step));
    const double wd = opts->weight_decay, eps = opts->eps;
    // Python computes it from the step as a float
    const double clr = opts->lr / (1 + (static_cast<double>(step) - 1) * opts->lr_decay);
    EBB_TRY(fn, {
        at::Tensor &p = param->t;
        check_param(p);
        std::string bad = mismatch("the gradient", grad->t, p);
        check_state("sum", sum, p, bad);
        if (!bad.empty()) return ebb_error_set(EBB_ERR_SHAPE, "%s: %s", fn, bad.c_str());
        at::Tensor decayed = wd != 0 ? at::empty_like(p) : at::Tensor();
        at::Tensor std_ = at::empty_like(p);
        Operand c_eps = operand(p, eps);
        at::Tensor g = wd != 0 ? at::add_out(decayed, grad->t, p, wd) : grad->t;
        sum->t.addcmul_(g, g, 1);
        add_to(at::sqrt_out(std_, sum->t), c_eps);
        step_addcdiv(p, g, std_, clr, hyper);
    });
    return EBB_OK;
}

ebb_status ebb_tensor_adadelta_update_(ebb_tensor *param, const ebb_tensor *grad,
                                       ebb_tensor *square_avg, ebb_tensor *acc_delta,
                                       const ebb_optimizer_options *opts,
                                       const ebb_tensor *hyper) {
    const char *fn = "ebb_tensor_adadelta_update_";
    EBB_NEED(fn, param);
    EBB_NEED(fn, grad);
    EBB_NEED(fn, square_avg);
    EBB_NEED(fn, acc_delta);
    EBB_NEED(fn, opts);
    const double lr = opts->lr, rho = opts->rho, eps = opts->eps, wd = opts->weight_decay;
    EBB_TRY(fn, {
        at::Tensor &p = param->t;
        check_param(p);
        std::string bad = mismatch("the gradient", grad->t, p);
        check_state("square_avg", square_avg, p, bad);
        check_state("acc_delta", acc_delta, p, bad);
        if (!bad.empty()) return ebb_error_set(EBB_ERR_SHAPE, "%s: %s", fn, bad.c_str());
        at::Tensor decayed = wd != 0 ? at::empty_like(p) : at::Tensor();
        at::Tensor std_ = at::empty_like(p), delta = at::empty_like(p);
        Operand c_rho = operand(p, rho), c_eps = operand(p, eps);
        at::Tensor g = wd != 0 ? at::add_out(decayed, grad->t, p, wd) : grad->t;
        mul_by(square_avg->t, c_rho).addcmul_(g, g, 1 - rho);
        add_out(std_, square_avg->t, c_eps).sqrt_();
        add_out(delta, acc_delta->t, c_eps).sqrt_().div_(std_).mul_(g);
        mul_by(acc_delta->t, c_rho).addcmul_(delta, delta, 1 - rho);
        if (hyper)
            p.addcmul_(delta, hyper->t.select(0, 0));
        else
            p.add_(delta, -lr);
    });
    return EBB_OK;
}

ebb_status ebb_tensor_clip_grad_value(ebb_tensor **out, const ebb_tensor *grad, double clip) {
    const char *fn = "ebb_tensor_clip_grad_value";
    EBB_OUT(fn, out);
    EBB_NEED(fn, grad);
    if (!(clip > 0))
        return ebb_error_set(EBB_ERR_ARG, "%s: clip %g; it bounds |g|, so it must be positive", fn,
                             clip);
    EBB_TRY(fn, {
        // Scalar bounds: clamp wraps no operand in a tensor
        *out = ebb::wrap(at::clamp(grad->t, at::Scalar(-clip), at::Scalar(clip)));
    });
    return EBB_OK;
}

// torch.nn.utils.clip_grad_norm_ with norm_type 2, in its order: the norm
// (grad_norm), the factor (clip_factor), and every gradient multiplied by
// it in place, even by 1.
ebb_status ebb_tensor_clip_grad_norm_(ebb_tensor *const *grads, int n, double max_norm,
                                      double *total_norm) {
    const char *fn = "ebb_tensor_clip_grad_norm_";
    if (total_norm) *total_norm = 0;
    const at::Tensor *first = nullptr;
    ebb_status st = ebb::clip_grad_norm_check(fn, grads, n, max_norm, &first);
    if (st != EBB_OK || !first) return st; // no gradient: nothing to clip, as torch returns 0
    EBB_TRY(fn, {
        at::Tensor total = ebb::grad_norm(grads, n);
        at::Tensor factor;
        if (total.is_cpu()) {
            // on the host; Scalar operands would be wrapped in tensors
            double v = total.scalar_type() == at::kDouble ? total.item<double>()
                                                          : total.to(at::kFloat).item<float>();
            if (total_norm) *total_norm = v;
            total.reset();
            factor = at::full({}, ebb::clip_factor(v, first->scalar_type(), max_norm),
                              first->options());
        } else {
            // on the device, without a read back (a CUDA graph can hold it)
            factor = total.add(1e-6).reciprocal_().mul_(max_norm).clamp_max_(1.0);
            total.reset();
            if (total_norm) *total_norm = NAN;
        }
        for (int i = 0; i < n; i++)
            if (grads[i] && !ebb::repeated_grad(grads, i)) grads[i]->t.mul_(factor);
    });
    return EBB_OK;
}

// What the kernels above allocate beside the state they keep, all freed
// before they return: the one scratch tensor; for SGD, libtorch's CPU
// wrapper of a floating Scalar operand (x.mul_(0.9): an 8-byte float64
// tensor, and a copy in the parameter's dtype unless that is float64); for
// Adam, its operands made up front on the CPU, one element each.
int64_t ebb_optimizer_update_scratch_bytes(const ebb_optimizer_options *o, ebb_dtype dtype,
                                           int64_t numel, ebb_device device, int has_state) {
    if (!o || numel < 0) return -1;
    // AdamW's weight decay defaults to 0.01 when the options are not complete
    bool decay = o->weight_decay != 0 || (o->kind == EBB_ADAMW && !o->complete);
    // RMSprop, Adagrad and Adadelta: their tensors (each a block of the
    // caching allocator on a GPU) and on the CPU their Scalar operands
    const int64_t elem0 = (int64_t)ebb_dtype_size(dtype);
    const bool cpu = device.type == EBB_DEVICE_CPU;
    const int64_t t = cpu ? numel * elem0 : ebb_cuda_block(numel * elem0);
    switch (o->kind) {
    case EBB_RMSPROP: // the decayed gradient, avg; alpha, eps (and momentum)
        return (decay ? 2 : 1) * t + (cpu ? (2 + (o->momentum > 0)) * elem0 : 0);
    case EBB_ADAGRAD: // the decayed gradient, std; eps
        return (decay ? 2 : 1) * t + (cpu ? elem0 : 0);
    case EBB_ADADELTA: // the decayed gradient, std, delta; rho and eps
        return (decay ? 3 : 2) * t + (cpu ? 2 * elem0 : 0);
    default:
        break;
    }
    bool tensor = true, scalar = true;
    if (o->kind == EBB_SGD) {
        bool first = o->momentum != 0 && !has_state;
        // a first update without Nesterov keeps the decayed gradient as its buffer
        tensor = (decay || o->nesterov) && !(first && decay && !o->nesterov);
        // only buf.mul_(momentum) takes a Scalar operand
        scalar = o->momentum != 0 && !first;
    }
    int64_t elem = (int64_t)ebb_dtype_size(dtype);
    int64_t bytes = tensor ? numel * elem : 0;
    if (device.type != EBB_DEVICE_CPU)
        return bytes;
    if (o->kind != EBB_SGD) // beta1, beta2, the bias correction, eps, AdamW's decay
        return bytes + (4 + (o->kind == EBB_ADAMW && decay)) * elem;
    if (scalar)
        bytes += 8 + (dtype == EBB_FLOAT64 ? 0 : elem);
    return bytes;
}

} // extern "C"

// GradScaler's unscale_ (torch.amp): *found_inf when any element of any
// gradient is infinite or NaN, and every gradient multiplied by inv_scale in
// place either way. On CUDA ATen's fused kernel does both in one launch per
// dtype, and the flag is read back once. On the CPU, where libtorch 1.13 has
// no such kernel, each gradient's extremes are taken (a NaN or an infinity
// shows in one of them) and read at once, then it is scaled by a
// one-element factor: a Scalar operand would be wrapped in a tensor of its
// own. The CPU's scratch is the factor and the two extremes, 3 elements of
// the gradients' dtype (ebb_tensor_unscale_scratch()).
ebb_status ebb_tensor_unscale_(ebb_tensor *const *grads, int n, double inv_scale, int *found_inf) {
    const char *fn = "ebb_tensor_unscale_";
    if (n < 0 || (n > 0 && !grads) || !found_inf)
        return ebb_error_set(EBB_ERR_ARG, "%s: %d gradients at %p, found_inf %p", fn, n,
                             (const void *)grads, (const void *)found_inf);
    *found_inf = 0;
    const at::Tensor *first = nullptr;
    for (int i = 0; i < n; i++) {
        if (!grads[i]) continue;
        const at::Tensor &g = grads[i]->t;
        if (!at::isFloatingType(g.scalar_type()))
            return ebb_error_set(EBB_ERR_ARG, "%s: gradient %d is %s; only floating point is "
                                 "scaled", fn, i, describe(g).c_str());
        if (!first) {
            first = &g;
        } else if (g.scalar_type() != first->scalar_type() || g.device() != first->device()) {
            return ebb_error_set(EBB_ERR_SHAPE, "%s: gradient %d is %s, the first is %s", fn, i,
                                 describe(g).c_str(), describe(*first).c_str());
        }
    }
    if (!first) return EBB_OK;
    EBB_TRY(fn, {
        if (first->is_cuda()) {
            std::vector<at::Tensor> list;
            list.reserve((size_t)n);
            for (int i = 0; i < n; i++)
                if (grads[i] && !ebb::repeated_grad(grads, i)) list.push_back(grads[i]->t);
            auto f32 = first->options().dtype(at::kFloat);
            at::Tensor found = at::zeros({1}, f32);
            at::Tensor inv = at::full({1}, inv_scale, f32);
            at::_amp_foreach_non_finite_check_and_unscale_(list, found, inv);
            *found_inf = found.item<float>() != 0.0f;
        } else {
            at::Tensor inv = at::full({}, inv_scale, first->options());
            for (int i = 0; i < n; i++) {
                if (!grads[i] || grads[i]->t.numel() == 0 || ebb::repeated_grad(grads, i))
                    continue;
                at::Tensor &g = grads[i]->t;
                if (!*found_inf) {
                    at::Tensor lo = at::min(g), hi = at::max(g);
                    double a = lo.item<double>(), b = hi.item<double>();
                    *found_inf = !std::isfinite(a) || !std::isfinite(b);
                }
                g.mul_(inv);
            }
        }
    });
    return EBB_OK;
}

int64_t ebb_tensor_unscale_scratch(ebb_dtype dtype, ebb_device device) {
    int64_t e = (int64_t)ebb_dtype_size(dtype);
    if (device.type == EBB_DEVICE_CUDA) return 2 * ebb_cuda_block(4);
    return 3 * e;
}
