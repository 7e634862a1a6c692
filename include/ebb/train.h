/*
 * ebb/train.h - training steps: forward, loss, backward and update as one
 * static plan.
 *
 * A training compile (ebb_compile_options.train) appends to the forward the
 * loss, one backward step per op in reverse order (each op's backward rule,
 * ebb/op.h), a sum wherever a value's gradient arrives from several readers,
 * and one update step per trained parameter, placed right after the backward
 * step that makes its gradient final, so the gradient dies there rather than
 * living to the end of the backward. One liveness analysis covers it
 * all: an activation the backward needs is an ordinary plan value that lives
 * until its last backward read, everything else dies in the forward, and
 * the step's peak is predicted before it runs, like any plan's.
 *
 *     ebb_shape x = EBB_SHAPE(32, 784), y = EBB_SHAPE(32);
 *     ebb_dtype y_dtype = EBB_INT64;
 *     ebb_train_options t = {.target_shapes = &y, .n_target_shapes = 1,
 *                            .target_dtypes = &y_dtype, .loss = "cross_entropy",
 *                            .optimizer = {.kind = EBB_ADAMW, .lr = 1e-3}};
 *     ebb_compile_options o = {.input_shapes = &x, .n_input_shapes = 1, .train = &t};
 *     ebb_plan *plan = NULL;
 *     ebb_compile(&plan, graph, &o);                  // ebb_plan_print(): the whole step
 *     ebb_model *model = NULL;
 *     ebb_model_new(&model, plan, ebb_device_cpu(), 42);
 *     ebb_optimizer *opt = NULL;
 *     ebb_optimizer_new(&opt, model, &t.optimizer);
 *     for (...) {
 *         double loss;
 *         if (ebb_train_step(plan, model, opt, &images, &labels, &loss, NULL) != EBB_OK)
 *             ... ebb_errmsg() ...                    // the model is as it was
 *     }
 *     ebb_optimizer_free(opt);
 *     ebb_model_free(model);
 *
 * The steps of a training plan carry their phase (ebb_plan_step.phase):
 * forward, loss, backward, update. Backward steps are listed as
 * "<op>.backward" under the forward node's path.
 *
 * What a failed step leaves: every intermediate is freed; an error in the
 * forward or the loss leaves the parameters and the optimizer state
 * unchanged, and batch_norm's running statistics, which its training forward
 * updates, are restored. An error in the backward, after updates have begun
 * there, leaves the parameters already updated changed; compile with
 * ebb_train_options.updates_after_backward for steps that change nothing
 * when the forward, loss or backward fails (every gradient then lives until
 * the backward ends). Either way the updates run one parameter at a time, so
 * a failure in one update (out of memory) leaves the parameters updated
 * before it changed; that update itself writes nothing unless it can finish
 * (tests/test_faults.c makes every allocation of a step fail in turn).
 *
 * Under a memory budget (ebb_compile_options.memory_budget) the plan keeps
 * fewer activations and recomputes the others in the backward, from kept
 * checkpoints; the gradients are the same to the bit, and the listing shows
 * what is recomputed where, the peak against the peak keeping everything,
 * and the extra compute (ebb_plan_remat_stats()). docs/plans.md says how the
 * compiler chooses.
 *
 * Switches (each branch's gradient rows scattered back; the selector's
 * choice is hard and gets no gradient, as argmax gets none in PyTorch),
 * gates dense and top-k (the router's gradient flows through the
 * renormalised weights, as autograd computes it for topk and a gather),
 * split/merge, also, tag/using, repeat, nested flows and `for` loops
 * (unrolled: one set of weights, one gradient per iteration, summed) train.
 * and while/until loops (unrolled to their `max`; the iterations that did
 * not run are skipped in the backward, and the test, a hard decision, gets
 * no gradient). A branch no row chose is skipped in the backward too, and
 * its parameters get no gradient and no update, as torch.optim skips a
 * parameter whose .grad is None.
 */
#ifndef EBB_TRAIN_H
#define EBB_TRAIN_H

#include "optim.h"
#include "run.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Non-zero for a plan compiled with ebb_compile_options.train. NULL p: 0. */
EBB_API int ebb_plan_is_training(const ebb_plan *p);
/* Number of targets a training plan binds after its inputs (ebb_run's
 * inputs do not include them). NULL p or an inference plan: 0. */
EBB_API int ebb_plan_target_count(const ebb_plan *p);
/* Non-zero when parameter i (the plan's order) gets a gradient in this
 * training plan. NULL p, i out of range or an inference plan: 0. */
EBB_API int ebb_plan_param_trained(const ebb_plan *p, int i);

/* Non-zero when the plan updates each parameter as soon as its gradient is
 * final, inside the backward (the default; see
 * ebb_train_options.updates_after_backward). NULL p, an inference plan or a
 * grads_only plan: 0. */
EBB_API int ebb_plan_updates_in_backward(const ebb_plan *p);

/* The step's peak (the larger of the CPU and CUDA counts) with every update
 * right after its gradient: what the compiler compared its placement with
 * (graph/placement.c moves an update to the backward's end when that lowers
 * the peak). The plan's own when no update moved, or when a memory budget
 * or updates_after_backward decided. NULL p or an inference plan: 0. */
EBB_API int64_t ebb_plan_eager_peak_bytes(const ebb_plan *p);

/* Non-zero when a training plan updates parameter i with weight decay: its
 * optimizer options decay and ebb_train_options.no_decay does not name it.
 * NULL p, i out of range, an untrained parameter or an inference plan: 0. */
EBB_API int ebb_plan_param_decays(const ebb_plan *p, int i);

/* The gradient clipping a training plan was compiled for
 * (ebb_train_options.clip_grad_norm, .clip_grad_value); 0: none. NULL p: 0. */
EBB_API double ebb_plan_clip_grad_norm(const ebb_plan *p);
/* Non-zero for a plan compiled with ebb_train_options.loss_scaling. */
EBB_API int ebb_plan_loss_scaling(const ebb_plan *p);
/* ebb_train_options.clip_grad_value of the plan; 0: none. NULL p: 0. */
EBB_API double ebb_plan_clip_grad_value(const ebb_plan *p);
/* What clipping by norm costs the step's peak: its peak (the larger of the
 * CPU and CUDA counts) less that of the same step without it (its updates
 * then placed by the peak: inside the backward or after it). 0 without
 * clip_grad_norm. NULL p: 0. */
EBB_API int64_t ebb_plan_clip_cost_bytes(const ebb_plan *p);

/* What a memory budget traded (ebb_compile_options.memory_budget). */
typedef struct ebb_remat_stats {
    int64_t budget;          /* the budget compiled for; 0: none; or EBB_MEMORY_BUDGET_LEAST */
    int64_t peak_bytes;      /* the plan's peak as compared with the budget: the larger
                                of ebb_plan_peak_bytes() and its CUDA-rounded figure */
    int64_t no_recompute_peak_bytes; /* the same step's peak keeping every value */
    int64_t flops;           /* predicted compute of the step without recomputation */
    int64_t recompute_flops; /* predicted extra compute: the recompute steps' */
    int n_recompute_steps;   /* forward steps run again in the backward */
    int n_checkpoints;       /* values kept for recomputing from */
    int segment;             /* checkpoint spacing the search chose (docs/plans.md); 0: none */
} ebb_remat_stats;

/* Fills *out for plan p. FLOPs are estimates (a multiply-add is 2; matrix
 * products and convolutions from their shapes, elementwise ops one per
 * element), good for comparing choices, not for timing. A plan without a
 * budget reports its peak twice and no recomputation. EBB_ERR_ARG for a
 * NULL argument. */
EBB_API ebb_status ebb_plan_remat_stats(const ebb_plan *p, ebb_remat_stats *out);

/* One training step: runs the plan's forward, loss and backward on `inputs`
 * (one per graph input) and `targets` (one per target), then updates every
 * trained parameter with `opt`. The plan must be a training plan with update
 * steps (not grads_only), and `opt` an optimizer over `model` of the kind the
 * plan was compiled for (its ebb_train_options.optimizer). *loss (may be
 * NULL) receives the loss; `stats` (may be NULL) the measured and planned
 * peak, as for ebb_run(). On failure every intermediate is freed, the model
 * is as it was unless the failure came after the first update inside the
 * backward (see the top of this file), and the message names the step and
 * the node. */
EBB_API ebb_status ebb_train_step(const ebb_plan *plan, ebb_model *model, ebb_optimizer *opt,
                                  ebb_tensor *const *inputs, ebb_tensor *const *targets,
                                  double *loss, ebb_run_stats *stats);
/* ebb_train_step() with run options (NULL: none): a per-step trace, the
 * check_fits refusal, and the seed of dropout's masks (each step of a run
 * draws from the seed and its step index; ebb_train_step() uses the
 * optimizer's step count, so every step draws new masks). A plan compiled
 * with ebb_train_options.accumulate N takes a step as N calls, micro_batch
 * 0 .. N - 1 of micro_batches N, each loss_scale its micro-batch's share
 * of the step's samples (each micro-batch draws its own masks); only the
 * last updates:
 *
 *     for (int k = 0; k < 4; k++) {
 *         ebb_run_options ro = {.loss_scale = 0.25, .micro_batch = k, .micro_batches = 4};
 *         ebb_train_step_ex(plan, model, opt, &x[k], &y[k], &loss[k], &ro, NULL);
 *     } */
EBB_API ebb_status ebb_train_step_ex(const ebb_plan *plan, ebb_model *model, ebb_optimizer *opt,
                                     ebb_tensor *const *inputs, ebb_tensor *const *targets,
                                     double *loss, const ebb_run_options *opts,
                                     ebb_run_stats *stats);

/* ---- a training step in a CUDA graph ---------------------------------------
 *
 * Launching a step's kernels one by one costs host time that small models
 * feel: a CUDA graph records the whole step (forward, loss, backward and
 * every update) once and relaunches it with one call.
 *
 *     ebb_capture *cap;
 *     ebb_train_capture(&cap, plan, model, opt, x, y, 0);   // one batch's shapes
 *     for (...) ebb_capture_train_step(cap, x, y, &loss);    // new values each step
 *     ebb_capture_free(cap);
 *
 * ebb_train_capture() runs the step twice to warm up (libraries set
 * themselves up lazily) and undoes those updates, then records it: the model
 * and the optimizer are as they were when it returns, and it holds a copy of
 * the parameters and the optimizer state while it works. Each
 * ebb_capture_train_step() is then one ebb_train_step_ex() with run seed
 * `seed`: the same updates, the optimizer's step counts advanced, dropout's
 * masks drawn from the same seeds (so the masks equal an eager step's), the
 * learning rate read at each step (ebb_optimizer_set_lr() works between
 * steps). The optimizer's learning rate and bias corrections are read from a
 * small tensor on the device, so its values can differ from an eager step's
 * in the last bit (one multiply-add fused otherwise).
 *
 * Needs a CUDA model and a build with CUDA; refuses plans whose control flow
 * depends on data (as ebb_plan_capture() does), an optimizer other than the
 * plan's, and SGD with momentum before its first step (EBB_ERR_UNSUPPORTED,
 * saying why). Inputs and targets must keep the capture's shapes and dtypes.
 * The graph keeps its step's intermediates in a memory pool of its own for
 * its life: the plan's peak, held. Class-index targets, and inputs that an
 * embedding looks up, are checked before each replay (a read back). The caller must not use the model or the
 * optimizer with another plan while a capture of them is in use, except
 * through ebb_train_step() on the same plan, which sees the same state. */
EBB_API ebb_status ebb_train_capture(ebb_capture **out, const ebb_plan *plan, ebb_model *model,
                                     ebb_optimizer *opt, ebb_tensor *const *inputs,
                                     ebb_tensor *const *targets, uint64_t seed);
/* One captured training step on new `inputs` and `targets` (copied into the
 * graph's buffers first); *loss (may be NULL: then nothing waits for the
 * device) receives the loss. */
EBB_API ebb_status ebb_capture_train_step(ebb_capture *cap, ebb_tensor *const *inputs,
                                          ebb_tensor *const *targets, double *loss);

/* The loss and the gradient of every trained parameter, updating nothing:
 * `plan` must be compiled with ebb_train_options.grads_only. grads has
 * ebb_model_param_count(model) entries; grads[i] receives a new handle on the
 * gradient of parameter i, or NULL for a parameter that is not trained (a
 * buffer, one left out of ebb_train_options.trained, one no gradient can
 * reach) or that this run gave no gradient (it belongs to a branch no row
 * chose, or to loop iterations that did not run: PyTorch's .grad is None
 * there too). On failure every entry is NULL. */
EBB_API ebb_status ebb_grad(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                            ebb_tensor *const *targets, double *loss, ebb_tensor **grads,
                            ebb_run_stats *stats);
/* ebb_grad() with run options (NULL: none), as ebb_train_step_ex(). */
EBB_API ebb_status ebb_grad_ex(const ebb_plan *plan, const ebb_model *model,
                               ebb_tensor *const *inputs, ebb_tensor *const *targets, double *loss,
                               ebb_tensor **grads, const ebb_run_options *opts,
                               ebb_run_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* EBB_TRAIN_H */
