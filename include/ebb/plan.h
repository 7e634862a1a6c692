/*
 * ebb/plan.h - compiling a graph into a static plan, and reading the plan.
 *
 * A plan is to ebb what a prepared statement is to SQLite: compiled once for
 * given input shapes, run many times, explained on request. It is a flat list
 * of steps over numbered value slots, like a register machine. Each step names
 * its op and node path, the slots it reads and writes, and the slots to free
 * right after it: a dataflow liveness analysis over the plan's control flow
 * decides those, ahead of time.
 *
 *     ebb_shape x = EBB_SHAPE(8, 64);
 *     ebb_compile_options o = {.input_shapes = &x, .n_input_shapes = 1};
 *     ebb_plan *p = NULL;
 *     if (ebb_compile(&p, g, &o) != EBB_OK) ... ebb_errmsg() ...
 *     ebb_plan_print(p, stdout);              // the EXPLAIN listing
 *     ebb_plan_free(p);
 *
 * Freeing rules the compiler implements:
 *   - straight line: a value is freed after the step that reads it last;
 *   - switch / top-k gate: a branch that gets no rows is skipped, and the
 *     values only it would have read are freed as it is skipped;
 *   - loop: values from outside the loop read inside stay live for the whole
 *     loop; values made in the body are freed within the iteration; the loop
 *     state is freed when replaced;
 *   - views: storage is tracked per alias class and counted once;
 *   - graph inputs belong to the caller, outputs are handed to the caller,
 *     parameters belong to the model: the plan frees none of them.
 *
 * Predicted bytes: for a plan whose control flow is fixed (straight line,
 * `for` loops) they are exact, to the byte on the CPU. Where rows are routed
 * by value (switch, top-k gate) or a loop runs until a test says stop
 * (while/until, at most `max` times), or an op's scratch depends on the
 * machine (convolution's oneDNN kernels), they are an upper bound that no
 * routing, iteration count or kernel choice can exceed;
 * ebb_plan_peak_is_bound() says which.
 */
#ifndef EBB_PLAN_H
#define EBB_PLAN_H

#include <stdio.h>

#include "graph.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_plan ebb_plan;

/* A training step: what ebb_compile() appends to the forward when
 * ebb_compile_options.train is set (see ebb/train.h). */
/* Data parallel training (ebb/dist.h): how one rank's step shares its
 * gradients with the other ranks'. ebb_train_options.parallel and
 * ebb_trainer_options.parallel hold one, and a plan keeps what it was
 * compiled with. */
typedef struct ebb_parallel_options {
    /* > 1: the step is one rank's of a group of this many processes, and
     * each gradient is averaged over the ranks before its update. The
     * gradients are gathered into buckets in the order they become final;
     * a bucket is averaged (an EBB_STEP_ALLREDUCE step, one collective)
     * once it holds bucket_bytes, or at the backward's end, and its
     * parameters are updated right after, so the updates of a large model
     * still run inside the backward. The bucket's buffer (its gradients
     * laid end to end) is the step's scratch. ebb_train_step() then needs
     * ebb_run_options.dist. 0 or 1: one process. (The trainer takes it,
     * and rank, from its ebb_dist.) */
    int world;
    /* ZeRO-1: the rank this plan is for (each compiles its own, and
     * ebb_train_step() checks it against ebb_run_options.dist). */
    int rank;
    /* ZeRO-1, with world > 1: the optimizer's state is sharded over the
     * ranks, as torch's ZeroRedundancyOptimizer shards it. Each trained
     * parameter has one owner (largest first, each to the rank that owns
     * the fewest bytes so far: ebb_plan_param_owner()), and only the owner
     * updates it and holds its state, so a rank's update steps and state
     * are about 1/world of them. Each bucket is reduce-scattered (an
     * EBB_STEP_REDUCE_SCATTER step, ebb_dist_reduce_scatter_mean_()): a
     * rank gets the means of the gradients it owns, and the others'
     * gradients die there, with half the all-reduce's traffic (with
     * overlap, an EBB_STEP_REDUCE_SCATTER_START step and an
     * EBB_STEP_REDUCE_SCATTER_WAIT step, as for the all-reduce). The
     * unscale and clip steps read this rank's gradients and agree with the
     * other ranks by a collective: ebb_optimizer_unscale_sharded_(),
     * ebb_dist_clip_grad_norm_(). After the updates one EBB_STEP_BROADCAST
     * per rank sends its parameters to the others, laid end to end in a
     * buffer the size of its share. With grads_only the plan only says who
     * owns what (its model keeps no optimizer state for the others'
     * parameters) and has no collectives: the caller averages the
     * gradients, updates its share and broadcasts it. 0: every rank keeps
     * all of it. */
    int zero;
    /* A bucket's size (DDP's bucket_cap_mb); 0: 25 MiB. */
    int64_t bucket_bytes;
    /* A full bucket's all-reduce only starts where it is full (an
     * EBB_STEP_ALLREDUCE_START step, its buffer a value of the plan), and
     * the backward goes on while the ranks exchange; an
     * EBB_STEP_ALLREDUCE_WAIT step finishes it, and its parameters are
     * updated, when the next bucket is full (or at the backward's end).
     * The gradients and the buffer then live longer, which the plan
     * counts; one collective is under way at a time, as Gloo needs. DDP
     * overlaps so. 0: each all-reduce waits where it starts. */
    int overlap;
} ebb_parallel_options;

/* Mixed precision: a matrix product's backward needs the same low copy of
 * its weight that its forward cast. The forward can keep it for the
 * backward, a value the plan counts from one step to the other (as
 * torch.autocast's cast cache and autograd's saved tensors do), or the
 * backward can cast it again, which costs a cast's time but no bytes
 * between the two. The listing says which each plan did. */
typedef enum ebb_low_copies {
    EBB_LOW_COPIES_AUTO,   /* kept where that does not raise the step's peak (both the CPU
                              and the CUDA count), cast again elsewhere */
    EBB_LOW_COPIES_KEEP,   /* always kept (not with a memory budget, which recomputes) */
    EBB_LOW_COPIES_RECAST, /* always cast again */
} ebb_low_copies;

typedef struct ebb_train_options {
    const ebb_shape *target_shapes; /* one per declared target, in order (required) */
    int n_target_shapes;
    const ebb_dtype *target_dtypes; /* per target (int64 class indices), or NULL: `dtype` */
    const char *loss;       /* a loss op's name; NULL: the graph's (ebb_loss, `loss:`) */
    const char *loss_attrs; /* with `loss`: its attributes ("label_smoothing=0.1"), or NULL */
    /* The parameters trained: full names ("fc1.weight") or node names ("fc1",
     * all of its parameters); NULL: every parameter that is not a buffer.
     * A name that matches nothing is an error. */
    const char *const *trained;
    int n_trained;
    /* What the update steps will run, so the plan counts their scratch
     * exactly; ebb_train_step() refuses an optimizer of another kind or
     * with another momentum / nesterov / weight-decay shape. */
    ebb_optimizer_options optimizer;
    /* No update steps: the gradients become plan outputs, one per trained
     * parameter, for ebb_grad(). */
    int grads_only;
    /* Run every update after the whole backward, as torch.optim's step()
     * does. By default a parameter is updated as soon as its gradient is
     * final, in the middle of the backward, and the gradient dies there
     * rather than living to the end of the backward; but a step that then
     * fails in the backward has updated the parameters it reached. Set this
     * for all-or-nothing steps, or where every gradient must exist at once. */
    int updates_after_backward;
    /* Gradient clipping, as torch.nn.utils does between backward() and
     * step(). clip_grad_norm > 0 (clip_grad_norm_): every gradient is scaled
     * by min(1, clip_grad_norm / (total + 1e-6)), total the L2 norm of all of
     * them together. That needs every gradient before the first update, so
     * the updates wait for the backward's end (as updates_after_backward)
     * and the step's peak holds every gradient at once; the listing says
     * what that costs (ebb_plan_clip_cost_bytes()). clip_grad_value > 0
     * (clip_grad_value_): each update clamps its gradient to [-v, v] first,
     * into a gradient-sized tensor the plan counts, and the updates stay
     * inside the backward. 0: no clipping. */
    double clip_grad_norm;
    double clip_grad_value;
    /* A parameter group without weight decay, as a torch.optim param group
     * with weight_decay 0 (biases and norm weights, typically): parameters
     * whose full name matches one of these fnmatch(3) patterns ("*.bias")
     * update without decay, and the plan counts their updates' scratch so;
     * set the optimizer to match (ebb_optimizer_set_weight_decay(opt, i, 0)
     * for each, ebb_plan_param_decays()). A pattern that matches no trained
     * parameter is an error. */
    const char *const *no_decay;
    int n_no_decay;
    /* Dynamic loss scaling, as torch.amp.GradScaler (ebb/optim.h): the
     * backward starts from the optimizer's scale instead of 1, and one step
     * after the backward (EBB_STEP_UNSCALE) divides every gradient by it;
     * when a gradient holds an infinity or a NaN it jumps past the updates,
     * which therefore wait for the backward's end (as updates_after_backward,
     * and the listing says what that costs). Before clipping, as GradScaler's
     * unscale_() comes before clip_grad_norm_(). The optimizer must have loss
     * scaling on (ebb_optimizer_set_loss_scaling). For fp16; with grads_only,
     * set ebb_run_options.loss_scale and call ebb_optimizer_unscale_()
     * instead. */
    int loss_scaling;
    /* Gradient accumulation: > 1 makes one update of several runs, the
     * micro-batches of a step (ebb_run_options.micro_batch). Each run's
     * gradients are added, as soon as each is final, into a sum per
     * parameter that the optimizer holds for the run (an EBB_STEP_GRAD_SUM
     * step; the step's first micro-batch copies into it, as PyTorch assigns
     * .grad, and its buffers are made at the first). Then one
     * EBB_STEP_GRAD_SUMS step ends every micro-batch but the last; the
     * last goes on, with the sums as the gradients, through the steps an
     * unaccumulated plan runs after its backward: data parallel's
     * collectives, unscale, clip and the updates. Scale each micro-batch's
     * loss by its share of the step (ebb_run_options.loss_scale). The sums'
     * bytes live beside the parameters (ebb_plan_grad_sums_bytes()). The
     * value is kept for the listing and the caller; 0 or 1: none. */
    int accumulate;
    /* Data parallel (ebb_parallel_options above); zeroes: one process. */
    ebb_parallel_options parallel;
    /* Mixed precision: where a backward step gets the low copies of the
     * parameters its forward step cast (ebb_low_copies below). */
    ebb_low_copies low_weight_copies;
} ebb_train_options;

/* Mixed precision (ebb_compile_options.precision), after torch.autocast:
 * parameters and optimizer state stay in the plan's dtype (float32); the
 * matrix products (linear, conv1d, conv2d, matmul, attention) run in the low
 * dtype on low copies of their inputs and parameters; softmax, the norms,
 * the losses and the reductions run in float32; every other op takes its
 * inputs' widest dtype. Each change of dtype is a `cast` step of the plan,
 * its value counted at its own dtype's size and freed at its last use; a
 * parameter's low copy is made inside the step that reads it and freed
 * when the step ends, or in a training step kept for the backward where
 * that is free (ebb_train_options.low_weight_copies). */
/* (ebb_precision itself is declared in graph.h, for ebb_node_precision) */
/* "fp32", "bf16" or "fp16" (also "float32", "bfloat16", "float16") into
 * *out; EBB_ERR_ARG naming the text otherwise. */
EBB_API ebb_status ebb_precision_parse(ebb_precision *out, const char *name);
/* "bf16", "fp16", or "fp32" for the others. */
EBB_API const char *ebb_precision_name(ebb_precision p);

typedef struct ebb_compile_options {
    const ebb_shape *input_shapes; /* one per graph input, in order (required) */
    int n_input_shapes;
    ebb_dtype dtype;               /* of parameters, and of inputs unless given; 0 is float32 */
    const ebb_dtype *input_dtypes; /* per input (e.g. int64 indices), or NULL: `dtype` */
    int keep_all;                  /* free nothing until the run ends (to compare) */
    const ebb_train_options *train; /* NULL: an inference plan; else a training step */
    /* Bytes the step may take at its peak (the plan's peak as the CPU or
     * CUDA counts it, whichever is larger, so it holds on both; parameters
     * and optimizer state are not in it); 0: no limit.
     * A training plan that would take more recomputes forward values in the
     * backward instead of keeping them (rematerialization: docs/plans.md),
     * choosing the least predicted extra compute that fits; a plan that
     * cannot fit, inference or training, fails with EBB_ERR_BUDGET naming
     * the least peak it can reach. EBB_MEMORY_BUDGET_LEAST asks for that
     * least peak, whatever it costs. See ebb_plan_remat_stats(). */
    int64_t memory_budget;
    /* The device the plan will run on; zero is the CPU. On CUDA, a step
     * whose kernel a library chooses on the device (cuDNN's convolutions,
     * scaled dot-product attention) has its CUDA scratch measured there:
     * the compile runs that op once on zeros of the step's shapes and
     * takes what it allocated (graph/measure.c), once per shape in the
     * process. Without it, the plan's CUDA figure for such a step is the
     * op's estimate. The CPU figures are the same either way. */
    ebb_device device;
    /* Non-zero: do the same for the CPU figures, whatever `device`. oneDNN
     * picks a float32 convolution's kernel by instruction set, shape and
     * thread count, and the op's bound for it can be many times what it
     * takes (a 7x7 stem on a 224x224 image); measured, the plan's CPU
     * figure is what the kernel takes at this process's thread count. The
     * compile then runs those ops once on the CPU, which costs their time
     * and memory; without it, compiling allocates no activations at all. */
    int measure_scratch;
    /* Mixed precision for a float32 plan (ebb_precision above); by default
     * the spec's `precision:` (ebb_spec_compile), else float32. */
    ebb_precision precision;
    /* Generation: 0, or the length in positions of a key/value cache the
     * plan reads and writes (docs/plans.md, "Generation"). Every causal
     * scaled_dot_product_attention becomes a _cached_attention step that
     * writes its keys and values into the cache, a [B, Hkv, kv_cache, D]
     * tensor for each, before grouped-query attention's repeat_kv (which
     * the plan then leaves out); `positions` and `rotary_embedding` count
     * from the positions the cache holds. The caches are EBB_VALUE_STATE
     * values, held by an ebb_kv_cache (run.h) across runs, so one plan for
     * the prompt ([B, T]) and one for each next token ([B, 1]) share them.
     * An inference plan only; a graph with no causal attention, with
     * multi_head_attention, or with attention inside a loop or a branch is
     * refused (EBB_ERR_UNSUPPORTED, naming the node). */
    int64_t kv_cache;
} ebb_compile_options;

/* ebb_compile_options.memory_budget: as little memory as recomputing can
 * reach, at the least extra compute that reaches it. */
#define EBB_MEMORY_BUDGET_LEAST ((int64_t)-1)

/* Compiles `g` for the given input shapes. Shapes are propagated through
 * every step (a dry run on libtorch's meta device, or the op's shape
 * function: no activation is allocated), so shape errors surface here,
 * naming the node. On success *out is a new plan (free with ebb_plan_free). */
EBB_API ebb_status ebb_compile(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts);
/* Frees a plan from ebb_compile(); NULL is allowed.
 * Pointers from the getters below die with it. */
EBB_API void ebb_plan_free(ebb_plan *p);

typedef enum ebb_step_kind {
    EBB_STEP_OP,        /* out = op(in...) */
    EBB_STEP_ALIAS,     /* out = in: a second handle on the same storage */
    EBB_STEP_ROUTE,     /* out = routing table from a selector or router output */
    EBB_STEP_ENTER,     /* branch: (x, route) -> (rows, x_rows); jumps when no rows */
    EBB_STEP_EXIT,      /* branch: (y, rows, route[, acc]) -> acc, scattered by row */
    EBB_STEP_LOOP_INIT, /* counter := 0; jumps past the loop when its limit is 0 */
    EBB_STEP_LOOP_NEXT, /* counter += 1; jumps back while counter < limit */
    EBB_STEP_JUMP_IF,   /* jumps when (mean(in) > 0) == sense */
    EBB_STEP_BACKWARD,  /* (saved..., grad_out) -> gradients of an op's inputs and parameters */
    EBB_STEP_ACCUM,     /* out = a + b: a second gradient reaching the same value */
    EBB_STEP_UPDATE,    /* the optimizer updates one parameter from its gradient */
    EBB_STEP_ZEROS,     /* out = zeros: a routed region's gradient accumulator */
    EBB_STEP_SKIP,      /* jumps past a branch's backward when its forward did not run */
    EBB_STEP_EXIT_BACKWARD,  /* (grad_acc, rows, route[, y, grad_route]) -> grad_y[, grad_route] */
    EBB_STEP_ENTER_BACKWARD, /* (grad_rows_input, rows, grad_x) -> grad_x, added by row */
    EBB_STEP_ROUTE_BACKWARD, /* top-k: (router output, route, grad_route) -> grad of the router output */
    EBB_STEP_CLIP,      /* (every gradient): scaled in place to a global L2 norm of at most
                           clip_grad_norm (ebb_train_options) */
    EBB_STEP_UNSCALE,   /* (every gradient): divided by the loss scale in place; jumps past
                           the updates when one is not finite (ebb_train_options.loss_scaling) */
    EBB_STEP_GRAD_SUM,  /* (a gradient): added into its parameter's sum, which the
                           optimizer holds across micro-batches (ebb_train_options.accumulate) */
    EBB_STEP_GRAD_SUMS, /* () -> (the sums): jumps to the end unless this run is its step's
                           last micro-batch, which goes on to update from the sums (data
                           parallel with routing or loops: it first meets the other ranks,
                           which agree on which sums hold a gradient) */
    /* The collectives of data parallel (ebb_parallel_options.world),
     * one kind each; src/exec.c documents each at its case. */
    EBB_STEP_ALLREDUCE, /* (a bucket of gradients): each becomes its mean over the ranks, in
                           place */
    EBB_STEP_BROADCAST, /* ZeRO-1: the parameters one rank owns (`param` is the rank) become
                           that rank's, on every rank (ebb_parallel_options.zero) */
    EBB_STEP_ALLREDUCE_WAIT, /* ([buffer,] a bucket of gradients): waits for the all-reduce an
                                ALLREDUCE_START step started, its means into the gradients
                                (ebb_parallel_options.overlap) */
    EBB_STEP_REDUCE_SCATTER, /* ZeRO-1 (a bucket of gradients): those of the parameters this
                                rank owns become their means over the ranks, in place */
    EBB_STEP_ALLREDUCE_START, /* overlap (a bucket of gradients) -> [buffer]: the
                                 bucket's all-reduce started; the backward goes on */
    EBB_STEP_REDUCE_SCATTER_START, /* ZeRO-1 with overlap (a bucket of gradients)
                                      -> [buffers]: its first round started */
    EBB_STEP_REDUCE_SCATTER_WAIT, /* ([buffers,] a bucket of gradients): the reduce-scatter's
                                     other rounds, then the means this rank owns */
} ebb_step_kind;

/* Whether steps of this kind meet the other ranks (every kind from
 * EBB_STEP_ALLREDUCE on above): every rank runs them, in the same order. */
EBB_API int ebb_step_kind_is_collective(ebb_step_kind kind);

/* Which part of a training step a step belongs to (inference: all forward). */
typedef enum ebb_step_phase {
    EBB_PHASE_FORWARD,
    EBB_PHASE_LOSS,
    EBB_PHASE_BACKWARD,
    EBB_PHASE_UPDATE,
} ebb_step_phase;

typedef enum ebb_route_mode {
    EBB_ROUTE_SWITCH, /* table: int64 [B], the branch of each row */
    EBB_ROUTE_TOPK,   /* table: [B, k] weights, zero for experts a row skips */
} ebb_route_mode;

/* One step, read-only. Slot arrays belong to the plan. */
typedef struct ebb_plan_step {
    ebb_step_kind kind;
    const char *op;   /* op name, or the step kind's name for control steps */
    const char *node; /* the node's name, or its path ("flow.3.also") if unnamed */
    const int *in;
    int n_in;
    const int *out;
    int n_out;
    int jump;           /* target step of a jump, -1 if none */
    const int *frees;   /* freed when execution continues to the next step */
    int n_frees;
    const int *jump_frees; /* freed when the jump is taken */
    int n_jump_frees;
    int in_place;       /* the output overwrites its input, which dies here */
    int64_t live_bytes; /* predicted live intermediate bytes after the step */
    int64_t peak_bytes; /* predicted live bytes during the step: before its frees,
                           with the op's internal scratch (ebb_op.workspace) */
    ebb_step_phase phase;
    int param;          /* UPDATE, GRAD_SUM: the parameter it updates or sums into;
                           BROADCAST: the sending rank; else -1 */
    int recompute;      /* OP in the backward: a forward step run again because
                           its output was not kept (ebb_compile_options.memory_budget) */
} ebb_plan_step;

typedef enum ebb_value_kind {
    EBB_VALUE_INPUT,        /* a graph input: owned by the caller */
    EBB_VALUE_INTERMEDIATE, /* made and freed by the plan */
    EBB_VALUE_OUTPUT,       /* handed to the caller */
    EBB_VALUE_HELD,         /* held across runs by the optimizer (gradient accumulation's
                               sums), counted beside the parameters, not in the peaks */
    EBB_VALUE_STATE,        /* held across runs by the caller's ebb_kv_cache (a layer's
                               keys or values), counted beside the parameters, not in
                               the peaks */
} ebb_value_kind;

/* One value slot, read-only. */
typedef struct ebb_plan_value {
    ebb_value_kind kind;
    const char *name; /* tag or input name, or NULL */
    ebb_shape shape;  /* as compiled (switch branches: the full batch) */
    ebb_dtype dtype;
    int64_t nbytes;   /* storage the value adds: 0 for a view or alias */
    int producer;     /* step that first writes it, -1 for inputs */
    int alias_of;     /* slot whose storage it shares, or -1 */
} ebb_plan_value;

/* Number of steps. NULL p: 0. */
EBB_API int ebb_plan_step_count(const ebb_plan *p);
/* Step i (0-based), owned by the plan. NULL p or i out of range: NULL. */
EBB_API const ebb_plan_step *ebb_plan_step_at(const ebb_plan *p, int i);
/* Number of value slots. NULL p: 0. */
EBB_API int ebb_plan_value_count(const ebb_plan *p);
/* The value in `slot`, owned by the plan. NULL p or slot out of range: NULL. */
EBB_API const ebb_plan_value *ebb_plan_value_at(const ebb_plan *p, int slot);
/* Number of graph inputs; their slots follow, in order. NULL p: 0. */
EBB_API int ebb_plan_input_count(const ebb_plan *p);
/* The slot of graph input i. NULL p or i out of range: -1. */
EBB_API int ebb_plan_input_slot(const ebb_plan *p, int i);
/* Number of graph outputs. NULL p: 0. */
EBB_API int ebb_plan_output_count(const ebb_plan *p);
/* The slot of output i. NULL p or i out of range: -1. */
EBB_API int ebb_plan_output_slot(const ebb_plan *p, int i);
/* The name of output i, owned by the plan. NULL p or i out of range: NULL. */
EBB_API const char *ebb_plan_output_name(const ebb_plan *p, int i);
/* Predicted peak of live intermediate bytes, and the step where it occurs
 * (at_step may be NULL). NULL p: 0, *at_step -1. */
EBB_API int64_t ebb_plan_peak_bytes(const ebb_plan *p, int *at_step);
/* Non-zero when the plan's predicted bytes are an upper bound rather than
 * exact: it routes rows by value, has a while/until loop, or has a step
 * whose op declares its workspace as a bound (ebb_op.workspace_is_bound). A run never
 * exceeds either kind; an exact plan's run matches it (on the CPU, to the
 * byte). NULL p: 0. */
EBB_API int ebb_plan_peak_is_bound(const ebb_plan *p);
/* The same for a run on `device`: on CUDA the plan is also a bound when a
 * step's CUDA scratch is (ebb_op.workspace_cuda_is_bound: cuDNN's
 * convolutions, scaled dot-product attention), which libtorch's CUDA
 * kernels choose by device. NULL p: 0. */
EBB_API int ebb_plan_peak_is_bound_on(const ebb_plan *p, ebb_device device);
/* The predicted peak the same plan would have with keep_all (nothing freed
 * until the end): the figure liveness is compared against. NULL p: 0. */
EBB_API int64_t ebb_plan_keep_all_peak_bytes(const ebb_plan *p);
/* The predicted peak as the device's allocator will count it: on CUDA every
 * block is rounded up to 512 bytes (small blocks are carved from 2 MiB
 * segments, which allocated-bytes statistics do not count) and each op's
 * scratch is its CUDA kernels' (ebb_op.workspace_cuda); on the CPU it is
 * ebb_plan_peak_bytes(). NULL p: 0. */
EBB_API int64_t ebb_plan_device_peak_bytes(const ebb_plan *p, ebb_device device);
/* Non-zero for a plan compiled with keep_all. NULL p: 0. */
EBB_API int ebb_plan_keep_all(const ebb_plan *p);
/* The compiled graph's name, owned by the plan. NULL p: NULL. */
EBB_API const char *ebb_plan_name(const ebb_plan *p);

/* A plan compiled with ebb_compile_options.kv_cache: the cache's length
 * in positions. 0 for other plans (and NULL p). */
EBB_API int64_t ebb_plan_kv_cache_length(const ebb_plan *p);
/* The bytes of the cache's keys and values (every EBB_VALUE_STATE value),
 * which an ebb_kv_cache holds beside the parameters. 0 for plans without
 * one (and NULL p). */
EBB_API int64_t ebb_plan_kv_cache_bytes(const ebb_plan *p);
/* Number of parameters the plan's ops need, in a fixed order. NULL p: 0. */
EBB_API int ebb_plan_param_count(const ebb_plan *p);
/* The bytes the parameters hold, which live beside the plan's intermediates
 * for the whole run. NULL p: 0. */
EBB_API int64_t ebb_plan_param_bytes(const ebb_plan *p);
/* A training plan with updates: the bytes of the state the optimizer it was
 * compiled for keeps, which ebb_optimizer_new() makes (zeros) for every
 * parameter that is not a buffer, so that no step allocates it: beside the
 * parameters, not in any step's peak. Under ZeRO-1, this rank's share (the
 * parameters it owns), a grads_only plan's included (its caller updates).
 * 0 for other plans and NULL p. */
EBB_API int64_t ebb_plan_optimizer_state_bytes(const ebb_plan *p);
/* A fingerprint (CRC-32) of what the plan computes: its parameters' names
 * and shapes and which are trained, and every forward and loss step's
 * kind, op, node, attributes, the shapes and dtypes it reads and its
 * result's. The backward and updates follow from those and the training
 * options; what the compiler chooses for memory (recomputation, kept
 * copies, where updates go), which may differ by rank under ZeRO-1, is
 * left out. Data-parallel ranks compare theirs before the first step (the
 * trainer does). NULL p: 0. */
EBB_API uint32_t ebb_plan_fingerprint(const ebb_plan *p);
/* A training plan with ebb_train_options.accumulate: the bytes of the
 * gradient sums the optimizer holds across a step's micro-batches, one per
 * trained parameter, made at the first micro-batch and kept for the run,
 * beside the parameters (not in any step's peak). 0 for other plans and
 * NULL p. */
EBB_API int64_t ebb_plan_grad_sums_bytes(const ebb_plan *p);
/* Mixed precision, a training plan: how many parameters' low copies its
 * forward keeps for its backward (ebb_train_options.low_weight_copies),
 * their bytes (kept_bytes, may be NULL), and how many its backward casts
 * again (recast, may be NULL). NULL p or no copies: 0. */
EBB_API int ebb_plan_low_copies(const ebb_plan *p, int64_t *kept_bytes, int *recast);
/* ZeRO-1 (ebb_parallel_options.zero): the rank that updates parameter i and
 * holds its optimizer state; -1 for a plan that does not shard, or a
 * parameter no rank updates (a buffer, a frozen one) or i out of range. */
EBB_API int ebb_plan_param_owner(const ebb_plan *p, int i);
/* Parameter i's spec, owned by the plan; its full name ("stem.weight") goes
 * to *full_name when full_name is non-NULL. NULL p or i out of range: NULL,
 * *full_name untouched. */
EBB_API const ebb_param_spec *ebb_plan_param_at(const ebb_plan *p, int i, const char **full_name);

/* Writes the EXPLAIN listing: one row per step (index, op, node, inputs,
 * output, shape, values freed, predicted live bytes), then a summary. NULL p
 * or f: writes nothing. */
EBB_API void ebb_plan_print(const ebb_plan *p, FILE *f);

/* How the writers name a node for a reader, beside its path: given a node
 * path as plans name nodes ("flow.1.0.2.also.3"), a label for it (where a
 * spec declared it: "feedforward[3]", see ebb_spec_node_label()), or NULL
 * for none. The string must live until the writer returns. */
typedef const char *(*ebb_node_label_fn)(void *user, const char *node);

/* ebb_plan_print() with each step's label (label(user, node), when not
 * NULL) in a last column, `spec`. */
EBB_API void ebb_plan_print_ex(const ebb_plan *p, FILE *f, ebb_node_label_fn label, void *user);
/* Writes the plan as one JSON object (the `ebb plan --json` format of
 * docs/cli.md: name, inputs, outputs, params, values, steps, peaks). NULL p
 * or f: writes nothing. */
EBB_API void ebb_plan_write_json(const ebb_plan *p, FILE *f);
/* Writes the plan as Graphviz DOT: steps in columns of at most ten, each
 * naming the value it makes (shape, bytes) and its live bytes, fill by
 * bytes, the peak step outlined with the peak figure. Edges join only steps
 * a short way apart in one column; a value read from further away is named
 * on its reader ("reads v3 from 2"). A step is named by label(user, node)
 * where `label` is given and has one for it, else by its node path. NULL p
 * or f: writes nothing. */
EBB_API void ebb_plan_write_dot(const ebb_plan *p, FILE *f, ebb_node_label_fn label, void *user);

/* One executed step of a run as measured: a line of `ebb run --trace`
 * (ebb_trace_event holds the same figures). */
typedef struct ebb_chart_sample {
    int step;           /* the plan step's index */
    int64_t live_bytes; /* measured after the step, its frees included */
    int64_t peak_bytes; /* measured high-water mark during the step */
} ebb_chart_sample;

/* A measured run to draw over a chart: its samples in execution order (a
 * step inside a loop appears once per iteration, a skipped branch's steps
 * not at all). */
typedef struct ebb_chart_trace {
    const ebb_chart_sample *samples;
    int n_samples;
    ebb_device device; /* where it ran: on CUDA each block is rounded up to 512
                          bytes, which the comparison with the plan allows for */
} ebb_chart_trace;

/* Writes the plan's memory over time as a standalone SVG: the x axis is the
 * steps, the y axis bytes; each value that owns storage is a band from the
 * step that makes it to the step that frees it, stacked, as tall as its
 * bytes and coloured by its op; views and in-place outputs continue their
 * source's band. The planned peak is a labelled line, op workspace a band
 * at its step, and a training plan's phases are shaded. With `trace` (may be
 * NULL) the measured live bytes after each step are a line over the bands,
 * the measured in-step peaks ticks, and a step that measured more than the
 * plan promised is marked red. Past a few hundred steps, bands thinner than
 * a pixel are merged into one "other" band. Hovering over a band or a step
 * shows what it is (SVG <title>). NULL p or f, or a sample naming a step
 * the plan lacks: EBB_ERR_ARG; a failed write: EBB_ERR_IO. */
EBB_API ebb_status ebb_plan_chart_svg(const ebb_plan *p, const ebb_chart_trace *trace, FILE *f);
/* ebb_plan_chart_svg() with each step's label, where it has one, beside its
 * node path in what hovering shows. */
EBB_API ebb_status ebb_plan_chart_svg_ex(const ebb_plan *p, const ebb_chart_trace *trace, FILE *f,
                                         ebb_node_label_fn label, void *user);

/* The value's id in listings, JSON and traces: an input's name, else "vN",
 * written into buf (NUL-terminated). NULL p or slot out of range: "". */
EBB_API void ebb_plan_value_id(const ebb_plan *p, int slot, char *buf, size_t size);
/* The last step (in listing order) that reads the value; its producer if none.
 * NULL p or slot out of range: -1. */
EBB_API int ebb_plan_value_last_use(const ebb_plan *p, int slot);

#ifdef __cplusplus
}
#endif
#endif /* EBB_PLAN_H */
