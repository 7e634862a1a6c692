/* Training calls: a training plan run with its targets, then the loss read
 * back. The plan does the work (src/exec.c runs its backward and update
 * steps); this file checks the arguments and keeps a failed step from
 * changing the model. */
#include <stdlib.h>
#include <string.h>

#include "ebb/train.h"
#include "model_internal.h"
#include "plan_internal.h"
#include "run_internal.h"

static const char *kind_name(ebb_optimizer_kind k) {
    static const char *const names[] = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta"};
    return k >= EBB_SGD && k <= EBB_ADADELTA ? names[k] : "unknown";
}

/* The update steps' scratch was counted for the plan's optimizer options:
 * what changes it must agree (the learning rate and betas may differ). */
ebb_status ebb_train_check_optimizer(const ebb_plan *p, const ebb_optimizer *opt, const char *fn) {
    ebb_optimizer_options have = ebb_optimizer_get_options(opt), want = p->train_options.optimizer;
    int want_decay = want.weight_decay != 0 || (want.kind == EBB_ADAMW && !want.complete);
    const char *what = have.kind != want.kind                              ? "kind"
                       : (have.momentum != 0) != (want.momentum != 0)     ? "momentum"
                       : (have.nesterov != 0) != (want.nesterov != 0)     ? "nesterov"
                       : (have.weight_decay != 0) != want_decay           ? "weight decay"
                       : (have.amsgrad != 0) != (want.amsgrad != 0)       ? "amsgrad"
                       : (have.centered != 0) != (want.centered != 0)     ? "centered"
                                                                          : NULL;
    /* a parameter group without weight decay: the plan counted it so */
    for (int i = 0; !what && want_decay && i < p->n_params; i++) {
        int plan_decays = p->trained[i] && !(p->no_decay && p->no_decay[i]);
        if (p->trained[i] && plan_decays != (ebb_optimizer_get_weight_decay(opt, i) != 0))
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: plan %s updates '%s' %s weight decay; the optimizer %s "
                                 "(compile with ebb_train_options.no_decay naming the "
                                 "parameters ebb_optimizer_set_weight_decay() sets to 0)",
                                 fn, p->name, p->params[i].full_name,
                                 plan_decays ? "with" : "without",
                                 plan_decays ? "does not decay it" : "decays it");
    }
    if (!what)
        return EBB_OK;
    return ebb_error_set(EBB_ERR_ARG,
                         "%s: plan %s counts the updates of %s%s%s%s; the optimizer is %s%s%s%s "
                         "(its %s differs: compile with ebb_train_options.optimizer set to the "
                         "optimizer's options)",
                         fn, p->name, kind_name(want.kind), want.momentum != 0 ? " with momentum" : "",
                         want_decay ? " with weight decay" : "", want.nesterov ? " (Nesterov)" : "",
                         kind_name(have.kind), have.momentum != 0 ? " with momentum" : "",
                         have.weight_decay != 0 ? " with weight decay" : "",
                         have.nesterov ? " (Nesterov)" : "", what);
}

/* Copies of the buffers a training forward updates in place (batch_norm's
 * running statistics), to put back when the step fails. */
typedef struct buffers {
    ebb_tensor **copy; /* per parameter: NULL for trained parameters */
    int n;
} buffers;

static ebb_status buffers_save(buffers *b, const ebb_plan *p, const ebb_model *m) {
    b->n = m->n_params;
    b->copy = calloc((size_t)b->n + 1, sizeof *b->copy);
    if (!b->copy)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < b->n; i++)
        if (p->params[i].spec.buffer || p->params[i].spec.counter) {
            ebb_status st = ebb_tensor_clone(&b->copy[i], m->params[i]);
            if (st != EBB_OK)
                return st;
        }
    return EBB_OK;
}

static void buffers_restore(const buffers *b, const ebb_model *m) {
    for (int i = 0; i < b->n; i++)
        if (b->copy[i])
            ebb_tensor_copy_(m->params[i], b->copy[i]);
}

static void buffers_free(buffers *b) {
    for (int i = 0; b->copy && i < b->n; i++)
        ebb_tensor_free(b->copy[i]);
    free(b->copy);
}

uint64_t ebb_train_run_seed(uint64_t seed, const ebb_optimizer *opt) {
    return seed + 0x2545f4914f6cdd1dull * (uint64_t)(ebb_optimizer_step_count(opt) + 1);
}

/* Runs a training plan: inputs then targets, the loss read back. */
static ebb_status run_training(const ebb_plan *plan, const ebb_model *model, ebb_optimizer *opt,
                               ebb_tensor *const *inputs, ebb_tensor *const *targets, double *loss,
                               ebb_tensor **outputs, int restore_always,
                               const ebb_run_options *opts, ebb_run_stats *stats, const char *fn) {
    int n_in = plan->n_inputs - plan->n_targets;
    if ((n_in && !inputs) || !targets)
        return ebb_error_set(EBB_ERR_ARG, "%s: plan %s needs %d input(s) and %d target(s)", fn,
                             plan->name, n_in, plan->n_targets);
    ebb_tensor **all = calloc((size_t)plan->n_inputs + 1, sizeof *all);
    if (!all)
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    for (int i = 0; i < n_in; i++)
        all[i] = inputs[i];
    for (int i = 0; i < plan->n_targets; i++)
        all[n_in + i] = targets[i];
    buffers saved = {0};
    ebb_status st = buffers_save(&saved, plan, model);
    if (st == EBB_OK) {
        ebb_run_options o = opts ? *opts : (ebb_run_options){0};
        /* accumulation: every micro-batch of a step draws its own masks */
        if (opt)
            o.seed = ebb_train_run_seed(o.seed, opt) + 0x9E3779B97F4A7C15ull * (uint64_t)o.micro_batch;
        st = ebb_run_plan(plan, model, all, outputs, &o, stats, opt);
    }
    if (st == EBB_OK && loss)
        st = ebb_tensor_item(outputs[0], loss);
    if (st != EBB_OK || restore_always)
        buffers_restore(&saved, model);
    buffers_free(&saved);
    free(all);
    if (st != EBB_OK) {
        for (int i = 0; i < plan->n_outputs; i++) {
            ebb_tensor_free(outputs[i]);
            outputs[i] = NULL;
        }
        return ebb_error_prefix("%s", fn);
    }
    return EBB_OK;
}

ebb_status ebb_train_step_ex(const ebb_plan *plan, ebb_model *model, ebb_optimizer *opt,
                             ebb_tensor *const *inputs, ebb_tensor *const *targets, double *loss,
                             const ebb_run_options *opts, ebb_run_stats *stats) {
    const char *fn = "ebb_train_step";
    if (!plan || !model || !opt)
        return ebb_error_set(EBB_ERR_ARG, "%s: plan, model and optimizer are required", fn);
    if (!plan->training || plan->train_options.grads_only)
        return ebb_error_set(EBB_ERR_ARG,
                             plan->training
                                 ? "%s: plan %s was compiled with grads_only (no update steps); "
                                   "use ebb_grad(), or compile without grads_only"
                                 : "%s: plan %s is not a training plan (compile it with "
                                   "ebb_compile_options.train)",
                             fn, plan->name);
    ebb_status st = ebb_train_check_optimizer(plan, opt, fn);
    if (st != EBB_OK)
        return st;
    ebb_tensor *out = NULL;
    st = run_training(plan, model, opt, inputs, targets, loss, &out, 0, opts, stats, fn);
    ebb_tensor_free(out);
    return st;
}

ebb_status ebb_train_step(const ebb_plan *plan, ebb_model *model, ebb_optimizer *opt,
                          ebb_tensor *const *inputs, ebb_tensor *const *targets, double *loss,
                          ebb_run_stats *stats) {
    return ebb_train_step_ex(plan, model, opt, inputs, targets, loss, NULL, stats);
}

ebb_status ebb_grad_ex(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                       ebb_tensor *const *targets, double *loss, ebb_tensor **grads,
                       const ebb_run_options *opts, ebb_run_stats *stats) {
    const char *fn = "ebb_grad";
    if (!plan || !model || !grads)
        return ebb_error_set(EBB_ERR_ARG, "%s: plan, model and grads are required", fn);
    for (int i = 0; i < model->n_params; i++)
        grads[i] = NULL;
    if (!plan->training || !plan->train_options.grads_only)
        return ebb_error_set(EBB_ERR_ARG,
                             plan->training
                                 ? "%s: plan %s has update steps; compile it with "
                                   "ebb_train_options.grads_only for ebb_grad()"
                                 : "%s: plan %s is not a training plan (compile it with "
                                   "ebb_compile_options.train and grads_only)",
                             fn, plan->name);
    if (model->n_params != plan->n_params)
        return ebb_error_set(EBB_ERR_ARG, "%s: the model has %d parameters, plan %s needs %d", fn,
                             model->n_params, plan->name, plan->n_params);
    ebb_tensor **out = calloc((size_t)plan->n_outputs, sizeof *out);
    if (!out)
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    ebb_status st =
        run_training(plan, model, NULL, inputs, targets, loss, out, 1, opts, stats, fn);
    if (st == EBB_OK)
        for (int k = 1; k < plan->n_outputs; k++)
            grads[plan->out_param[k]] = out[k];
    ebb_tensor_free(out[0]);
    free(out);
    return st;
}

ebb_status ebb_grad(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                    ebb_tensor *const *targets, double *loss, ebb_tensor **grads,
                    ebb_run_stats *stats) {
    return ebb_grad_ex(plan, model, inputs, targets, loss, grads, NULL, stats);
}
