/* CUDA graph capture: what can be decided without CUDA. A plan is capturable
 * when no step's control flow depends on tensor values. */
#include "ebb/run.h"
#include "internal.h"
#include "model_internal.h"
#include "plan_internal.h"

ebb_status ebb_plan_capture(ebb_capture **out, const ebb_plan *plan, const ebb_model *model,
                            ebb_tensor *const *inputs) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_capture: out is NULL");
    *out = NULL;
    if (!plan || !model || (plan->n_inputs && !inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_capture: plan, model and inputs are required");
    for (int i = 0; i < plan->n_steps; i++) {
        const ebb_plan_step *s = &plan->steps[i].pub;
        if (s->kind == EBB_STEP_ROUTE)
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "ebb_plan_capture: plan %s routes rows by value at step %d (node "
                                 "%s); a switch or top-k gate cannot be captured into a CUDA graph",
                                 plan->name, i, s->node);
        if (s->kind == EBB_STEP_JUMP_IF)
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "ebb_plan_capture: plan %s has a data-dependent loop at step %d "
                                 "(node %s); only `for` loops can be captured into a CUDA graph",
                                 plan->name, i, s->node);
    }
    if (model->device.type != EBB_DEVICE_CUDA) {
        char d[32];
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "ebb_plan_capture: CUDA graphs need a CUDA device; the model is on %s",
                             ebb_device_str(model->device, d, sizeof d));
    }
    return ebb_cuda_graph_capture(out, plan, model, inputs);
}
