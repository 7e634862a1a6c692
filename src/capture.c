/* CUDA graph capture of a whole plan (ebb_plan_capture in ebb/run.h). This
 * file decides what may be captured and owns the input and output buffers
 * that the graph reads and writes; the tensor layer records and replays
 * (ops/tensor/cuda_graph.cpp). A plan is capturable when no step's control
 * flow depends on tensor values. */
#include <stdlib.h>

#include "ebb/run.h"
#include "internal.h"
#include "model_internal.h"
#include "plan_internal.h"

struct ebb_capture {
    const ebb_plan *plan;
    const ebb_model *model;
    ebb_cuda_graph *graph;
    ebb_tensor **in, **out; /* the graph's own buffers */
    int n_in, n_out;
};

static void release(ebb_capture *c) {
    for (int i = 0; i < c->n_in; i++)
        ebb_tensor_free(c->in[i]);
    for (int i = 0; i < c->n_out; i++)
        ebb_tensor_free(c->out[i]);
    ebb_cuda_graph_free(c->graph);
    free(c->in);
    free(c->out);
    free(c);
}

/* One run of the plan; warm-up runs drop their outputs, the recorded run
 * keeps them as the buffers that replays refill. */
static ebb_status capture_body(void *ctx, int capturing) {
    ebb_capture *c = ctx;
    ebb_status st = ebb_run(c->plan, c->model, c->in, c->out, NULL);
    if (!capturing)
        for (int k = 0; k < c->n_out; k++) {
            ebb_tensor_free(c->out[k]);
            c->out[k] = NULL;
        }
    return st;
}

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
    ebb_capture *c = calloc(1, sizeof *c);
    if (!c)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_plan_capture: out of memory");
    c->plan = plan;
    c->model = model;
    c->n_in = plan->n_inputs;
    c->n_out = plan->n_outputs;
    c->in = calloc((size_t)c->n_in + 1, sizeof *c->in);
    c->out = calloc((size_t)c->n_out + 1, sizeof *c->out);
    ebb_status st = c->in && c->out ? EBB_OK
                                    : ebb_error_set(EBB_ERR_NOMEM, "ebb_plan_capture: out of memory");
    for (int i = 0; i < c->n_in && st == EBB_OK; i++)
        st = ebb_tensor_clone(&c->in[i], inputs[i]);
    if (st == EBB_OK)
        st = ebb_cuda_graph_capture(&c->graph, model->device.index, capture_body, c);
    if (st != EBB_OK) {
        release(c);
        return st;
    }
    *out = c;
    return EBB_OK;
}

ebb_status ebb_capture_replay(ebb_capture *c, ebb_tensor *const *inputs, ebb_tensor **outputs) {
    if (!c || !outputs || (c->n_in && !inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_capture_replay: capture, inputs and outputs are required");
    for (int i = 0; i < c->n_in; i++) {
        ebb_shape want = ebb_tensor_shape(c->in[i]), got = ebb_tensor_shape(inputs[i]);
        if (!ebb_shape_equal(&want, &got)) {
            char a[96], b[96];
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "ebb_capture_replay: input %d of plan %s has shape %s; it was "
                                 "captured with %s",
                                 i, c->plan->name, ebb_shape_str(&got, a, sizeof a),
                                 ebb_shape_str(&want, b, sizeof b));
        }
        ebb_status st = ebb_tensor_copy_(c->in[i], inputs[i]);
        if (st != EBB_OK)
            return st;
    }
    ebb_status st = ebb_cuda_graph_replay(c->graph);
    if (st != EBB_OK)
        return st;
    for (int k = 0; k < c->n_out; k++) {
        outputs[k] = NULL;
        st = ebb_tensor_ref(&outputs[k], c->out[k]);
        if (st != EBB_OK) {
            for (int j = 0; j < k; j++) {
                ebb_tensor_free(outputs[j]);
                outputs[j] = NULL;
            }
            return st;
        }
    }
    return EBB_OK;
}

void ebb_capture_free(ebb_capture *c) {
    if (c)
        release(c);
}
