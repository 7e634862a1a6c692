/*
 * ebb/optim.h - optimizers: SGD, Adam, AdamW, RMSprop, Adagrad and Adadelta,
 * updating a model's parameters in place exactly as PyTorch 1.13's
 * torch.optim does.
 *
 *     ebb_optimizer *opt = NULL;
 *     if (ebb_optimizer_new(&opt, model, &(ebb_optimizer_options){.kind = EBB_ADAMW, .lr = 1e-3})
 *         != EBB_OK) ... ebb_errmsg() ...
 *     for (int step = 0; step < n_steps; step++) {
 *         ebb_tensor *grads[N];   // grads[i] for ebb_model_param_name(model, i), or NULL
 *         ...
 *         if (ebb_optimizer_step(opt, grads) != EBB_OK) ... ebb_errmsg() ...
 *     }
 *     ebb_optimizer_save(opt, "optim.safetensors");     // resume with ebb_optimizer_load()
 *     ebb_optimizer_free(opt);
 *
 * The updates follow torch.optim's single-tensor implementations operation
 * by operation (the same ATen in-place kernels in the same order, with the
 * same scalars), so ebb and torch.optim given the same gradients compute the
 * same parameters: bit for bit on the CPU, where tests/test_optim.c checks
 * ten steps of each configuration against PyTorch fixtures.
 *
 * Options and PyTorch's defaults. A field left at 0 takes torch.optim's
 * default for the kind, so the literal above is AdamW with betas (0.9,
 * 0.999), eps 1e-8 and weight_decay 0.01:
 *
 *     field          SGD          Adam       AdamW  RMSprop  Adagrad  Adadelta
 *     lr             (required)   1e-3       1e-3   1e-2     1e-2     1.0
 *     momentum       0            -          -      0        -        -
 *     dampening      0            -          -      -        -        -
 *     nesterov       0 (off)      -          -      -        -        -
 *     weight_decay   0            0          0.01   0        0        0
 *     beta1, beta2   -            0.9, 0.999 (both) -        -        -
 *     eps            -            1e-8 (both)       1e-8     1e-10    1e-6
 *     amsgrad        -            0 (off, both)     -        -        -
 *     rho            -            -          -      0.99     -        0.9
 *                                                   (alpha)
 *     centered       -            -          -      0 (off)  -        -
 *     lr_decay       -            -          -      -        0        -
 *     initial_accumulator_value   -          -      -        0        -
 *
 * To ask for a real 0 where the default is not 0 (AdamW without weight
 * decay, beta1 = 0, eps = 0), start from ebb_optimizer_defaults(), which
 * fills every field and sets `complete`; with `complete` set, every field
 * means what it holds:
 *
 *     ebb_optimizer_options o = ebb_optimizer_defaults(EBB_ADAMW, 1e-3);
 *     o.weight_decay = 0;
 *     ebb_optimizer_new(&opt, model, &o);
 *
 * A field marked "-" belongs to another kind and must be 0 (an SGD with a
 * beta is an error, not silently ignored). What torch.optim refuses is
 * refused too (EBB_ERR_ARG): a negative lr, eps, momentum, weight_decay or
 * lr_decay, a beta outside [0, 1), rho outside [0, 1] (Adadelta) or a
 * negative one (RMSprop), a negative initial_accumulator_value, nesterov
 * without momentum or with dampening, and any value that is not finite. torch.optim's `maximize`, `foreach`, `fused`,
 * `capturable` and `differentiable` have no equivalent.
 *
 * State. Each parameter has its own state, created at its first update as
 * torch.optim creates it: SGD with momentum keeps a momentum buffer (a copy
 * of the first gradient), Adam and AdamW keep exp_avg and exp_avg_sq (zeros
 * before the first update; max_exp_avg_sq too with amsgrad), RMSprop
 * square_avg (and momentum_buffer with momentum, grad_avg when centered),
 * Adagrad sum (initial_accumulator_value), Adadelta square_avg and
 * acc_delta, and every kind counts the parameter's updates. A parameter that never got a gradient has
 * no state, so it costs nothing. Saved, the state is named after the
 * parameter, as PyTorch's state_dict keys would be spelled:
 *
 *     optim.<param name>.momentum_buffer   SGD with momentum
 *     optim.<param name>.exp_avg           Adam, AdamW
 *     optim.<param name>.exp_avg_sq        Adam, AdamW
 *     optim.<param name>.max_exp_avg_sq    Adam, AdamW with amsgrad
 *     optim.<param name>.square_avg        RMSprop, Adadelta
 *     optim.<param name>.grad_avg          RMSprop, centered
 *     optim.<param name>.acc_delta         Adadelta
 *     optim.<param name>.sum               Adagrad
 *     optim.<param name>.step              every kind: the update count (float64 scalar)
 *     optim.options                        the options (float64 [15], see ebb_optimizer_save)
 *
 * An optimizer borrows its model: free the optimizer first. It holds
 * parameters by index, so ebb_model_set_param() and ebb_model_load() may
 * replace values between steps. One thread at a time may use an optimizer.
 */
#ifndef EBB_OPTIM_H
#define EBB_OPTIM_H

#include "dist.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* (declared in optim.h and run.h alike; C99 allows one typedef) */
#ifndef EBB_MODEL_TYPEDEF
#define EBB_MODEL_TYPEDEF
typedef struct ebb_model ebb_model;
#endif
typedef struct ebb_optimizer ebb_optimizer;

typedef enum ebb_optimizer_kind {
    EBB_SGD = 0, /* torch.optim.SGD */
    EBB_ADAM,    /* torch.optim.Adam: weight_decay is an L2 term added to the gradient */
    EBB_ADAMW,   /* torch.optim.AdamW: weight_decay shrinks the parameter directly */
    EBB_RMSPROP, /* torch.optim.RMSprop (rho is its alpha) */
    EBB_ADAGRAD, /* torch.optim.Adagrad */
    EBB_ADADELTA, /* torch.optim.Adadelta */
} ebb_optimizer_kind;

/* The hyperparameters; see the table above for what 0 means. */
typedef struct ebb_optimizer_options {
    ebb_optimizer_kind kind;
    double lr;
    double momentum;     /* SGD */
    double dampening;    /* SGD */
    int nesterov;        /* SGD: non-zero for Nesterov momentum */
    double weight_decay; /* every kind */
    double beta1, beta2; /* Adam, AdamW */
    double eps;          /* Adam, AdamW */
    int amsgrad;         /* Adam, AdamW: non-zero keeps the maximum of exp_avg_sq */
    double rho;          /* RMSprop's alpha, Adadelta's rho: the running averages' decay */
    int centered;        /* RMSprop: normalise by the gradient's estimated variance */
    double lr_decay;     /* Adagrad: lr / (1 + (step - 1) * lr_decay) */
    double initial_accumulator_value; /* Adagrad: sum's starting value */
    int complete;        /* non-zero: every field is meant as it is, zeros included */
} ebb_optimizer_options;

/* The state slots of every kind, by index k from 0: the name of slot k
 * ("momentum_buffer", "exp_avg", ... as ebb_optimizer_save() names them),
 * "" when options `o` keep no such slot (o NULL: every slot's name), NULL
 * past the last slot. */
EBB_API const char *ebb_optimizer_state_slot(const ebb_optimizer_options *o, int k);

/* The kind's name as the command line and specs spell it: "sgd", "adam",
 * "adamw", "rmsprop", "adagrad", "adadelta" ("unknown" for another). */
EBB_API const char *ebb_optimizer_kind_name(ebb_optimizer_kind kind);
/* The kind of one of those names; EBB_ERR_ARG naming the valid ones (and
 * the nearest, for a misspelt one) otherwise. out may be NULL (a check). */
EBB_API ebb_status ebb_optimizer_kind_parse(ebb_optimizer_kind *out, const char *name);

/* torch.optim's default learning rate for `kind` (the table above; 0 for
 * SGD, which has none). */
EBB_API double ebb_optimizer_default_lr(ebb_optimizer_kind kind);

/* torch.optim's defaults for `kind` with learning rate `lr`, every field
 * filled and `complete` set, to adjust before ebb_optimizer_new(). Fields of
 * other kinds are 0. An unknown kind is returned as given, and
 * ebb_optimizer_new() refuses it. */
EBB_API ebb_optimizer_options ebb_optimizer_defaults(ebb_optimizer_kind kind, double lr);

/* Creates an optimizer over every parameter of `model`, in the model's
 * parameter order, and its state for every trained parameter (not a buffer
 * such as batch_norm's running statistics): zeros
 * (momentum buffer; exp_avg and exp_avg_sq; max_exp_avg_sq with amsgrad),
 * made now so that no training step allocates state, and its bytes are known
 * beside the parameters before anything runs (ebb_plan_optimizer_state_bytes).
 * The values are torch.optim's: Adam's moments start at zero, and SGD's
 * momentum buffer takes the gradient at its first update. Out of memory is
 * EBB_ERR_NOMEM, here rather than in a step. `opts` is read, not kept. On success
 * *out is a new optimizer, freed with ebb_optimizer_free(). EBB_ERR_ARG for
 * a NULL argument, an unknown kind, or options torch.optim would refuse (the
 * message names the field and its value). Integer tensors among the
 * parameters (batch_norm's num_batches_tracked) are counters the optimizer
 * never updates: ebb_optimizer_update() refuses them. */
EBB_API ebb_status ebb_optimizer_new(ebb_optimizer **out, ebb_model *model,
                             const ebb_optimizer_options *opts);
/* Frees the optimizer and its state; the model is untouched (NULL is allowed). */
EBB_API void ebb_optimizer_free(ebb_optimizer *opt);

/* The options in force, with every default filled in and `complete` set
 * (zeros for a NULL optimizer). */
EBB_API ebb_optimizer_options ebb_optimizer_get_options(const ebb_optimizer *opt);
/* Sets the learning rate for the updates that follow (a schedule), as
 * assigning param_group['lr'] does. EBB_ERR_ARG for a negative or
 * non-finite lr or a NULL optimizer; the optimizer is then unchanged. */
EBB_API ebb_status ebb_optimizer_set_lr(ebb_optimizer *opt, double lr);

/* Updates parameter `param_index` (the model's order) in place with its
 * gradient, and its state: one step of torch.optim for one parameter. This
 * is what a training plan's per-parameter update step calls, so the gradient
 * may be freed as soon as this returns; `grad` is read, never kept or
 * changed. The gradient must have the parameter's shape, dtype and device:
 * otherwise EBB_ERR_SHAPE (or EBB_ERR_ARG for the device) naming the
 * parameter and both shapes and dtypes, with the parameter and its state
 * unchanged. EBB_ERR_ARG for a NULL optimizer or gradient or an index out of
 * range. State is created here at the parameter's first update; if that
 * allocation fails (EBB_ERR_NOMEM) nothing has changed either. */
EBB_API ebb_status ebb_optimizer_update(ebb_optimizer *opt, int param_index, const ebb_tensor *grad);

/* Parameter groups, as torch.optim's param_groups with their own weight
 * decay: parameter param_index (the model's order) decays by `wd` instead
 * of the options' weight_decay, typically 0 for biases and norm weights. A
 * training plan counts an update's scratch by whether its parameter decays,
 * so compile with ebb_train_options.no_decay naming the same parameters
 * (ebb_train_step() refuses a mismatch). EBB_ERR_ARG for a NULL opt, an
 * index out of range or a negative or non-finite wd. Not saved with the
 * state: set it again after ebb_optimizer_load(). */
EBB_API ebb_status ebb_optimizer_set_weight_decay(ebb_optimizer *opt, int param_index, double wd);
/* Parameter param_index's weight decay (its group's, or the options'). 0 for
 * NULL opt or an index out of range. */
EBB_API double ebb_optimizer_get_weight_decay(const ebb_optimizer *opt, int param_index);
/* Parameter groups with their own learning rate: parameter param_index
 * updates at `scale` times the optimizer's rate (1 by default; 0 leaves it
 * as it is, its state still kept). A schedule changes the optimizer's rate
 * and every group's follows in proportion, as torch.optim.lr_scheduler's
 * multiplicative schedules (step, multistep, exponential, linear warmup,
 * cosine to 0) move each param group's rate from its own initial one.
 * EBB_ERR_ARG for a NULL opt, an index out of range or a negative or
 * non-finite scale. Not saved with the state: set it again after
 * ebb_optimizer_load(). */
EBB_API ebb_status ebb_optimizer_set_lr_scale(ebb_optimizer *opt, int param_index, double scale);
/* Parameter param_index's learning-rate scale (1 unless set). 0 for NULL opt
 * or an index out of range. */
EBB_API double ebb_optimizer_get_lr_scale(const ebb_optimizer *opt, int param_index);

/* One optimizer step over all parameters: grads[i] is the gradient of
 * parameter i in the model's order (ebb_model_param_count() entries), and a
 * NULL entry skips that parameter, as torch.optim skips a parameter whose
 * .grad is None (its state and update count stay as they are). Every
 * gradient's shape, dtype and device is checked, and every missing state
 * allocated, before any parameter changes, so a bad gradient anywhere leaves
 * all parameters and all state unchanged. Only a failure inside the update
 * kernels themselves (which check nothing further and allocate at most one
 * scratch tensor each) could stop part-way; the message then names the
 * parameter, and the ones before it have been updated. */
EBB_API ebb_status ebb_optimizer_step(ebb_optimizer *opt, ebb_tensor *const *grads);

/* The number of updates the most-updated parameter has had: the number of
 * steps taken when every step gives every parameter a gradient. 0 for NULL. */
EBB_API int64_t ebb_optimizer_step_count(const ebb_optimizer *opt);
/* The number of updates parameter `param_index` has had (Adam's `step`); -1
 * for a NULL optimizer or an index out of range. */
EBB_API int64_t ebb_optimizer_param_step_count(const ebb_optimizer *opt, int param_index);

/* Bytes of tensor state the optimizer holds now, which is all it ever holds:
 * per trained parameter (not a buffer), its size times 0 (SGD without momentum), 1
 * (SGD with momentum), 2 (Adam, AdamW) or 3 (with amsgrad). *most (when not
 * NULL) receives the same (kept from when state was made at first updates). The update counts are not
 * tensors and cost nothing here. 0 (and *most 0) for NULL. */
EBB_API int64_t ebb_optimizer_state_bytes(const ebb_optimizer *opt, int64_t *most);
/* The tensor bytes the next update of parameter `param_index` allocates
 * beyond the state it keeps, all freed before it returns, so that a plan
 * can count them; exact on the CPU. One parameter-sized scratch tensor for
 * Adam and AdamW, and for SGD with weight decay or Nesterov momentum (except
 * the first update of SGD with momentum and weight decay but no Nesterov,
 * whose scratch becomes the momentum buffer); on the CPU, plus libtorch's
 * wrapper of a Scalar operand (8 bytes, and a copy in the parameter's dtype
 * unless that is float64: 12 bytes for float32) where the update multiplies
 * or divides by a number: always for Adam and AdamW, after the first update
 * for SGD with momentum.
 * -1 for a NULL
 * optimizer or an index out of range. */
EBB_API int64_t ebb_optimizer_scratch_bytes(const ebb_optimizer *opt, int param_index);

/* ebb_optimizer_scratch_bytes() before any optimizer exists: the bytes one
 * update of a parameter of `numel` elements of `dtype` on `device`
 * allocates beyond its state, for options `o` (0 fields meaning their
 * defaults, as for ebb_optimizer_new()), once the parameter has state
 * (has_state non-zero) or at its first update. What a training plan counts
 * for its update steps. -1 for NULL o or a negative numel. */
EBB_API int64_t ebb_optimizer_update_scratch_bytes(const ebb_optimizer_options *o, ebb_dtype dtype,
                                                   int64_t numel, ebb_device device, int has_state);

/* One state tensor of a parameter, borrowed (do not free it; updates change
 * it in place, ebb_optimizer_load() and ebb_optimizer_free() free it): `which` is
 * "momentum_buffer", "exp_avg", "exp_avg_sq" or "max_exp_avg_sq" (zeros
 * until the parameter's first update). NULL when the options keep no such
 * state, for a counter parameter, an unknown `which` or an index out of
 * range. */
EBB_API ebb_tensor *ebb_optimizer_state_tensor(const ebb_optimizer *opt, int param_index,
                                       const char *which);

/* Writes the state under the names above to a safetensors file, as
 * ebb_safetensors_write() does (atomic replacement of a regular file).
 * Parameters not updated yet (torch.optim has no state for them) have no
 * entries. optim.options holds, as
 * float64: {format version 2, kind, lr, momentum, dampening, nesterov,
 * weight_decay, beta1, beta2, eps, amsgrad, rho, centered, lr_decay,
 * initial_accumulator_value}; ebb_optimizer_load() also reads version 1,
 * the first eleven. */
EBB_API ebb_status ebb_optimizer_save(const ebb_optimizer *opt, const char *path);
/* Reads the state (and the options) back from a safetensors file, replacing
 * the optimizer's; like torch.optim's load_state_dict, the options in the
 * file replace the optimizer's (call ebb_optimizer_set_lr() afterwards to
 * change the learning rate), but the kind must be the optimizer's. Tensors
 * whose names do not begin with "optim." are ignored, so the file may also
 * hold the model's parameters. Everything is checked, and every tensor read,
 * before anything changes: a missing optim.options, another kind, a
 * parameter with part of its state (exp_avg without exp_avg_sq, say), a
 * state tensor whose shape or dtype is not its parameter's, a step that is
 * not a non-negative whole number, or an "optim." name the model has no
 * parameter or the kind no state for, is an error (EBB_ERR_ARG, or
 * EBB_ERR_SHAPE for shapes and dtypes) naming the tensor and the file, and
 * the optimizer is left as it was. A parameter the file holds no state for
 * gets zeros, as ebb_optimizer_new() makes them. */
EBB_API ebb_status ebb_optimizer_load(ebb_optimizer *opt, const char *path);

/* ---- dynamic loss scaling ---------------------------------------------------
 * float16's range ends at 65504 and its smallest normal is 6e-5, so small
 * gradients of an fp16 step vanish unless the loss is scaled up first and the
 * gradients scaled back before the update: torch.amp.GradScaler. With loss
 * scaling on, an optimizer keeps GradScaler's state beside its own: the
 * scale, and the count of steps since it last changed. A training plan
 * compiled with ebb_train_options.loss_scaling then starts its backward from
 * the scale instead of 1, and before its updates calls
 * ebb_optimizer_unscale_(), which divides every gradient by the scale and
 * checks them:
 *   - a gradient holds an infinity or a NaN: the step's updates are skipped
 *     (parameters, state and update counts as they were) and the scale is
 *     multiplied by backoff_factor;
 *   - else the updates run, and after growth_interval such steps in a row
 *     the scale is multiplied by growth_factor (when that stays finite in
 *     float32).
 * bfloat16 has float32's range and needs none of this. ebb_optimizer_save()
 * writes the state as optim.scaler (float64 {1, scale, growth_factor,
 * backoff_factor, growth_interval, growth_tracker}, the version first), and
 * ebb_optimizer_load() reads it back. */
typedef struct ebb_loss_scaling {
    double init_scale;     /* the first scale; 0: 65536 (2^16) */
    double growth_factor;  /* > 1; 0: 2 */
    double backoff_factor; /* in (0, 1); 0: 0.5 */
    int growth_interval;   /* > 0; 0: 2000 */
} ebb_loss_scaling;

/* Turns loss scaling on (or restarts it) with options `o` (NULL: the
 * defaults): the scale is set to init_scale and the count of good steps to
 * 0. EBB_ERR_ARG for a NULL optimizer or an option outside its range (the
 * message names it); the optimizer is then unchanged. */
EBB_API ebb_status ebb_optimizer_set_loss_scaling(ebb_optimizer *opt, const ebb_loss_scaling *o);
/* The scale the next step's loss is multiplied by; 0 when loss scaling is
 * off (or opt is NULL). */
EBB_API double ebb_optimizer_loss_scale(const ebb_optimizer *opt);
/* Steps whose updates ebb_optimizer_unscale_() skipped, since the optimizer
 * was made (not saved). 0 for NULL. */
EBB_API int64_t ebb_optimizer_scaled_skips(const ebb_optimizer *opt);
/* GradScaler's unscale_, then its update: grads[0..n) (NULL entries
 * skipped) are divided by the scale in place; *skip receives 1 when one of
 * them holds an infinity or a NaN (the caller then updates nothing), 0
 * otherwise; and the scale moves as said above. What a loss-scaled plan runs
 * before its updates, and a loop over ebb_grad() runs before
 * ebb_optimizer_step(). EBB_ERR_ARG when loss scaling is off; EBB_ERR_SHAPE
 * when the gradients differ in dtype or device. */
EBB_API ebb_status ebb_optimizer_unscale_(ebb_optimizer *opt, ebb_tensor *const *grads, int n,
                                          int *skip);
/* ebb_optimizer_unscale_() on a rank that holds a share of the gradients
 * (ZeRO): grads[0..n) are its share (none at all is allowed), and the ranks
 * of group `d` agree, with one ebb_dist_sum() of a flag, whether any share
 * held a value that is not finite: then every rank skips its updates and
 * backs its scale off alike. Every rank must call it. Its scratch:
 * ebb_tensor_unscale_()'s, then ebb_dist_sum()'s one element. */
EBB_API ebb_status ebb_optimizer_unscale_sharded_(ebb_optimizer *opt, ebb_tensor *const *grads,
                                                  int n, ebb_dist *d, int *skip);

/* ---- update kernels (the tensor layer) ---------------------------------------
 * One in-place update of one parameter, used by the optimizer above and
 * available to callers that keep state themselves. `opts` must be complete
 * (as ebb_optimizer_get_options() returns them); they are not validated
 * again. The gradient and every state tensor must have the parameter's shape,
 * dtype and device (EBB_ERR_SHAPE otherwise, naming both shapes, dtypes and
 * devices), checked
 * before anything is written, and all scratch is allocated before the first
 * write too. */

/* torch.optim.SGD's update. *momentum_buffer is the state: NULL before the
 * first update, when (with momentum) it receives a new handle holding the
 * buffer, which the caller frees; unused without momentum. */
EBB_API ebb_status ebb_tensor_sgd_update_(ebb_tensor *param, const ebb_tensor *grad,
                                  ebb_tensor **momentum_buffer, const ebb_optimizer_options *opts);
/* torch.optim.Adam's (or, for kind EBB_ADAMW, AdamW's) update. exp_avg and
 * exp_avg_sq are updated in place (zeros before the first update);
 * max_exp_avg_sq is required with amsgrad and ignored without. `step` is the
 * parameter's update count including this update (1 for the first). */
EBB_API ebb_status ebb_tensor_adam_update_(ebb_tensor *param, const ebb_tensor *grad, ebb_tensor *exp_avg,
                                   ebb_tensor *exp_avg_sq, ebb_tensor *max_exp_avg_sq, int64_t step,
                                   const ebb_optimizer_options *opts);

/* torch.nn.utils.clip_grad_value_, into a new tensor: *out = grad clamped
 * to [-clip, clip] element by element (the caller frees it). clip <= 0:
 * EBB_ERR_ARG. */
EBB_API ebb_status ebb_tensor_clip_grad_value(ebb_tensor **out, const ebb_tensor *grad,
                                              double clip);
/* torch.nn.utils.clip_grad_norm_(max_norm, norm_type=2): scales grads[0..n)
 * in place by min(1, max_norm / (total + 1e-6)), total the L2 norm of all of
 * them together, in torch's order of operations; NULL entries are skipped (a
 * parameter without a gradient). *total_norm (may be NULL) receives total on
 * the CPU, NAN on a GPU (where reading it would wait for the device, and a
 * CUDA graph could not hold the step).
 * The gradients must share a floating dtype and a device (EBB_ERR_SHAPE
 * names the first that does not). Scratch: a norm per gradient, their stack,
 * the total and the factor, one element each. */
EBB_API ebb_status ebb_tensor_clip_grad_norm_(ebb_tensor *const *grads, int n, double max_norm,
                                              double *total_norm);

/* GradScaler's unscale_ on its own: grads[0..n) (NULL entries skipped, all
 * of one floating dtype and device) multiplied by inv_scale in place, and
 * *found_inf set when any element of any of them was infinite or NaN.
 * Scratch: ebb_tensor_unscale_scratch(). */
EBB_API ebb_status ebb_tensor_unscale_(ebb_tensor *const *grads, int n, double inv_scale,
                                       int *found_inf);
/* The bytes ebb_tensor_unscale_() allocates while it works, all freed before
 * it returns, for gradients of `dtype` on `device`: exact on the CPU. */
EBB_API int64_t ebb_tensor_unscale_scratch(ebb_dtype dtype, ebb_device device);

#ifdef __cplusplus
}
#endif
#endif /* EBB_OPTIM_H */
