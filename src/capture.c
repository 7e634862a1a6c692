/* CUDA graph capture of a whole plan (ebb_plan_capture in ebb/run.h). This
 * file decides what may be captured and owns the input and output buffers
 * that the graph reads and writes; the tensor layer records and replays
 * (ops/tensor/cuda_graph.cpp). A plan is capturable when no step's control
 * flow depends on tensor values. */
#include <stdlib.h>
#include <string.h>

#include "ebb/run.h"
#include "ebb/train.h"
#include "internal.h"
#include "model_internal.h"
#include "plan_internal.h"
#include "run_internal.h"

struct ebb_capture {
    const ebb_plan *plan;
    const ebb_model *model;
    ebb_cuda_graph *graph;
    ebb_tensor **in, **out; /* the graph's own buffers */
    int n_in, n_out;
    /* a training step (ebb_train_capture) */
    ebb_model *train_model;
    ebb_optimizer *opt;
    uint64_t seed;             /* ebb_run_options.seed of its steps */
    ebb_train_snapshot *snap;  /* while capturing: the state to return to */
    unsigned char *updated;    /* per parameter: the graph updates it */
    int *draw_step;            /* per random draw: its plan step */
    uint64_t *draw_seed;       /* per random draw: its seed in the next replay */
    int n_draws;
};

static void release(ebb_capture *c) {
    for (int i = 0; i < c->n_in; i++)
        ebb_tensor_free(c->in[i]);
    for (int i = 0; i < c->n_out; i++)
        ebb_tensor_free(c->out[i]);
    ebb_cuda_graph_free(c->graph);
    ebb_train_snapshot_free(c->snap);
    free(c->updated);
    free(c->draw_step);
    free(c->draw_seed);
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

/* What no CUDA graph can hold: control flow that depends on values, and a
 * model that is not on a CUDA device. */
static ebb_status check_capturable(const ebb_plan *plan, const ebb_model *model) {
    if (plan->kv_cache > 0)
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "ebb_plan_capture: plan %s reads and writes a key/value cache at "
                             "positions each run hands its steps; capturing it into a CUDA graph "
                             "is not done yet (run it with ebb_run_ex)",
                             plan->name);
    for (int i = 0; i < plan->n_steps; i++) {
        const ebb_plan_step *s = &plan->steps[i].pub;
        if (s->kind == EBB_STEP_ROUTE)
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "ebb_plan_capture: plan %s routes rows by value at step %d (node "
                                 "%s); a switch or top-k gate cannot be captured into a CUDA graph",
                                 plan->name, i, s->node);
        if (ebb_step_kind_is_collective(s->kind))
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "ebb_plan_capture: plan %s averages gradients over processes at "
                                 "step %d; a CUDA graph cannot hold Gloo's collectives",
                                 plan->name, i);
        if (s->kind == EBB_STEP_UNSCALE)
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "ebb_plan_capture: plan %s scales its loss, and step %d skips the "
                                 "updates when a gradient is not finite; a CUDA graph cannot "
                                 "branch on a value",
                                 plan->name, i);
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
    return EBB_OK;
}

ebb_status ebb_plan_capture(ebb_capture **out, const ebb_plan *plan, const ebb_model *model,
                            ebb_tensor *const *inputs) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_capture: out is NULL");
    *out = NULL;
    if (!plan || !model || (plan->n_inputs && !inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_plan_capture: plan, model and inputs are required");
    if (plan->training)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_plan_capture: plan %s is a training plan; capture its step "
                             "with ebb_train_capture()",
                             plan->name);
    ebb_status cs = check_capturable(plan, model);
    if (cs != EBB_OK)
        return cs;
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

/* An integer attribute of a step, or dflt when it is not set. */
static int64_t step_attr_int(const plan_step *s, const char *name, int64_t dflt) {
    for (int a = 0; a < s->op->n_attrs; a++)
        if (strcmp(s->op->attrs[a].name, name) == 0 && s->attrs[a].set)
            return s->attrs[a].i;
    return dflt;
}

/* A graph cannot read a value back, so the indices that the caller feeds
 * to an op whose descriptor names them (ebb_op.indices: a loss's class
 * targets, an embedding's token ids) are checked here, before each replay:
 * CUDA's kernels assert on one out of range, which ends the process's use
 * of the device. */
static ebb_status check_fed_indices(const ebb_capture *c, const char *fn) {
    const ebb_plan *p = c->plan;
    int first_target = p->n_inputs - p->n_targets;
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        if (s->pub.kind != EBB_STEP_OP)
            continue;
        int loss = s->pub.n_in >= 2 && s->op->indices == EBB_INDICES_CLASSES;
        int lookup = s->pub.n_in >= 1 && s->op->indices == EBB_INDICES_ROWS;
        if (!loss && !lookup)
            continue;
        int value = loss ? s->pub.in[1] : s->pub.in[0], fed = -1;
        for (int k = 0; k < p->n_inputs; k++)
            if (p->inputs[k] == value)
                fed = k;
        if (fed < 0)
            continue; /* computed inside the graph, not fed by the caller */
        ebb_status st;
        if (loss) {
            /* scores [..., C]: classes last, per sample or per token */
            const ebb_shape *x = &p->values[s->pub.in[0]].shape;
            int64_t classes = x->ndim > 0 ? x->dim[x->ndim - 1] : 0;
            st = ebb_tensor_check_class_range(c->in[fed], classes,
                                              step_attr_int(s, "ignore_index", -100));
        } else {
            st = ebb_tensor_check_index_range(c->in[fed], step_attr_int(s, "num", 0));
        }
        if (st != EBB_OK)
            return ebb_error_prefix("%s: %s %d (step %d, %s)", fn,
                                    fed < first_target ? "input" : "target",
                                    fed < first_target ? fed : fed - first_target, i,
                                    s->pub.node);
    }
    return EBB_OK;
}

/* Copies new values into the graph's input buffers [first, first + n),
 * refusing a shape or dtype other than the capture's. */
static ebb_status fill_inputs(ebb_capture *c, int first, int n, ebb_tensor *const *values,
                              const char *fn, const char *what) {
    for (int i = 0; i < n; i++) {
        const ebb_tensor *buf = c->in[first + i];
        ebb_shape want = ebb_tensor_shape(buf), got = ebb_tensor_shape(values[i]);
        ebb_dtype wd = ebb_tensor_dtype(buf), gd = ebb_tensor_dtype(values[i]);
        if (!ebb_shape_equal(&want, &got) || wd != gd) {
            char a[96], b[96];
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: %s %d of plan %s is %s %s; it was captured with %s %s", fn,
                                 what, i, c->plan->name, ebb_dtype_name(gd),
                                 ebb_shape_str(&got, a, sizeof a), ebb_dtype_name(wd),
                                 ebb_shape_str(&want, b, sizeof b));
        }
        ebb_status st = ebb_tensor_copy_(c->in[first + i], values[i]);
        if (st != EBB_OK)
            return st;
    }
    return EBB_OK;
}

ebb_status ebb_capture_replay(ebb_capture *c, ebb_tensor *const *inputs, ebb_tensor **outputs) {
    if (!c || !outputs || (c->n_in && !inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_capture_replay: capture, inputs and outputs are required");
    if (c->opt)
        return ebb_error_set(EBB_ERR_ARG, "ebb_capture_replay: the capture of plan %s is a "
                                          "training step; replay it with ebb_capture_train_step()",
                             c->plan->name);
    ebb_status st = fill_inputs(c, 0, c->n_in, inputs, "ebb_capture_replay", "input");
    if (st == EBB_OK)
        st = check_fed_indices(c, "ebb_capture_replay");
    if (st != EBB_OK)
        return st;
    st = ebb_cuda_graph_replay(c->graph, NULL);
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

/* ---- a training step ------------------------------------------------------------------ */

/* One training step as the graph records it. The warm-up runs are real
 * steps on the capture's batch, so each starts from the snapshot taken
 * before the first and leaves its updates to be undone; the recorded run
 * executes nothing, but its host side counts the updates, so the step
 * counts go back to the snapshot's first. */
static ebb_status train_body(void *ctx, int capturing) {
    ebb_capture *c = ctx;
    ebb_status st = capturing ? ebb_train_snapshot_restore_counts(c->snap, c->opt)
                              : ebb_train_snapshot_restore(c->snap, c->train_model, c->opt);
    if (st == EBB_OK && !capturing)
        st = ebb_optimizer_hyper_fill(c->opt);
    if (st != EBB_OK)
        return st;
    ebb_run_options o = {.seed = ebb_train_run_seed(c->seed, c->opt)};
    st = ebb_run_plan(c->plan, c->model, c->in, c->out, &o, NULL, c->opt);
    if (!capturing)
        for (int k = 0; k < c->n_out; k++) {
            ebb_tensor_free(c->out[k]);
            c->out[k] = NULL;
        }
    return st;
}

/* Which plan step drew each of the graph's random numbers: the one whose
 * seed, in the recorded run, was the draw's. */
static ebb_status map_draws(ebb_capture *c, uint64_t run_seed) {
    const uint64_t *seeds = NULL;
    c->n_draws = ebb_cuda_graph_draws(c->graph, &seeds);
    c->draw_step = calloc((size_t)c->n_draws + 1, sizeof *c->draw_step);
    c->draw_seed = calloc((size_t)c->n_draws + 1, sizeof *c->draw_seed);
    if (!c->draw_step || !c->draw_seed)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_train_capture: out of memory");
    for (int d = 0; d < c->n_draws; d++) {
        c->draw_step[d] = -1;
        for (int j = 0; j < c->plan->n_steps && c->draw_step[d] < 0; j++)
            if (ebb_run_step_seed(c->plan, run_seed, j) == seeds[d])
                c->draw_step[d] = j;
        if (c->draw_step[d] < 0)
            return ebb_error_set(EBB_ERR_RUNTIME,
                                 "ebb_train_capture: random draw %d of plan %s comes from no "
                                 "step's seed",
                                 d, c->plan->name);
    }
    return EBB_OK;
}

ebb_status ebb_train_capture(ebb_capture **out, const ebb_plan *plan, ebb_model *model,
                             ebb_optimizer *opt, ebb_tensor *const *inputs,
                             ebb_tensor *const *targets, uint64_t seed) {
    const char *fn = "ebb_train_capture";
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!plan || !model || !opt || !targets)
        return ebb_error_set(EBB_ERR_ARG, "%s: plan, model, optimizer and targets are required",
                             fn);
    int n_x = plan->n_inputs - plan->n_targets;
    if (n_x && !inputs)
        return ebb_error_set(EBB_ERR_ARG, "%s: plan %s needs %d input(s)", fn, plan->name, n_x);
    if (!plan->training || plan->train_options.grads_only)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: plan %s has no update steps (compile it with "
                             "ebb_compile_options.train, without grads_only)",
                             fn, plan->name);
    if (plan->train_options.accumulate > 1)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: plan %s sums %d micro-batches a step, and a captured step is "
                             "one run (compile it without ebb_train_options.accumulate)",
                             fn, plan->name, plan->train_options.accumulate);
    ebb_status st = ebb_train_check_optimizer(plan, opt, fn);
    if (st == EBB_OK)
        st = check_capturable(plan, model);
    if (st == EBB_OK)
        st = ebb_optimizer_check_capturable(opt, fn);
    if (st != EBB_OK)
        return st;
    ebb_capture *c = calloc(1, sizeof *c);
    if (!c)
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    c->plan = plan;
    c->model = model;
    c->train_model = model;
    c->opt = opt;
    c->seed = seed;
    c->n_in = plan->n_inputs;
    c->n_out = plan->n_outputs;
    c->in = calloc((size_t)c->n_in + 1, sizeof *c->in);
    c->out = calloc((size_t)c->n_out + 1, sizeof *c->out);
    c->updated = calloc((size_t)model->n_params + 1, sizeof *c->updated);
    st = c->in && c->out && c->updated ? EBB_OK
                                       : ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    for (int i = 0; i < c->n_in && st == EBB_OK; i++)
        st = ebb_tensor_clone(&c->in[i], i < n_x ? inputs[i] : targets[i - n_x]);
    if (st == EBB_OK)
        st = ebb_train_snapshot_new(&c->snap, model, opt);
    if (st == EBB_OK)
        st = ebb_optimizer_hyper_on(opt, model->device);
    if (st == EBB_OK) {
        st = ebb_cuda_graph_capture(&c->graph, model->device.index, train_body, c);
        /* the updates the recorded run counted are the graph's */
        for (int i = 0; i < model->n_params; i++)
            c->updated[i] = ebb_optimizer_param_step_count(opt, i) >
                            ebb_train_snapshot_step_count(c->snap, i);
    }
    ebb_optimizer_hyper_off(opt);
    /* the warm-up runs' updates undone, the step counts as they were */
    if (c->snap) {
        ebb_status rs = ebb_train_snapshot_restore(c->snap, model, opt);
        if (st == EBB_OK)
            st = rs;
    }
    if (st == EBB_OK)
        st = map_draws(c, ebb_train_run_seed(seed, opt));
    ebb_train_snapshot_free(c->snap);
    c->snap = NULL;
    if (st != EBB_OK) {
        release(c);
        return ebb_error_prefix("%s", fn);
    }
    *out = c;
    return EBB_OK;
}

ebb_status ebb_capture_train_step(ebb_capture *c, ebb_tensor *const *inputs,
                                  ebb_tensor *const *targets, double *loss) {
    const char *fn = "ebb_capture_train_step";
    if (!c || !targets)
        return ebb_error_set(EBB_ERR_ARG, "%s: capture and targets are required", fn);
    if (!c->opt)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: the capture of plan %s is not a training step; replay it "
                             "with ebb_capture_replay()",
                             fn, c->plan->name);
    int n_x = c->plan->n_inputs - c->plan->n_targets;
    if (n_x && !inputs)
        return ebb_error_set(EBB_ERR_ARG, "%s: plan %s needs %d input(s)", fn, c->plan->name,
                             n_x);
    ebb_status st = fill_inputs(c, 0, n_x, inputs, fn, "input");
    if (st == EBB_OK)
        st = fill_inputs(c, n_x, c->plan->n_targets, targets, fn, "target");
    if (st == EBB_OK)
        st = check_fed_indices(c, fn);
    if (st == EBB_OK)
        st = ebb_optimizer_hyper_fill(c->opt);
    if (st != EBB_OK)
        return st;
    uint64_t run_seed = ebb_train_run_seed(c->seed, c->opt);
    for (int d = 0; d < c->n_draws; d++)
        c->draw_seed[d] = ebb_run_step_seed(c->plan, run_seed, c->draw_step[d]);
    st = ebb_cuda_graph_replay(c->graph, c->draw_seed);
    if (st != EBB_OK)
        return ebb_error_prefix("%s", fn);
    ebb_optimizer_count_steps(c->opt, c->updated);
    return loss ? ebb_tensor_item(c->out[0], loss) : EBB_OK;
}
