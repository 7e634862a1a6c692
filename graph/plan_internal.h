/* The compiled plan, shared by the compiler (graph/) and the executor (src/).
 * Immutable once ebb_compile() returns. */
#ifndef EBB_PLAN_INTERNAL_H
#define EBB_PLAN_INTERNAL_H

#include "ebb/plan.h"
#include "graph_internal.h"

typedef struct plan_step {
    ebb_plan_step pub; /* the read-only view; its arrays point into the plan */
    const ebb_op *op;  /* EBB_STEP_OP */
    const ebb_attr_value *attrs;
    int64_t workspace; /* scratch bytes the op allocates inside the call */
    int64_t workspace_cuda; /* on CUDA, in allocator blocks, when has_workspace_cuda */
    int has_workspace_cuda;
    int64_t cuda_peak_bytes; /* pub.peak_bytes as CUDA's allocator counts it */
    /* mixed precision: the op runs on copies of its floating parameters in
     * param_dtype, made for the call and freed after it; a backward casts
     * their gradients back to the parameters' dtype */
    int param_cast;
    ebb_dtype param_dtype;
    /* mixed precision, a training forward and its backward: the parameters
     * (bit j for param[j]) whose low copy the forward keeps for the
     * backward rather than freeing it. The forward's outputs end with the
     * copies (after its extras) and the backward reads them (after the
     * extras, before grad_out), so they are values with liveness; neither
     * step makes them in its scratch (graph/copies.c chooses). */
    uint32_t keep_copy;
    /* mixed precision: a matrix product in the low dtype, whose CPU and
     * CUDA kernels' scratch the op's figures do not model: a bound (with a
     * float32 copy of every operand allowed), measured where the compile
     * measures (graph/measure.c) */
    int low_kernel;
    int param[EBB_MAX_PARAMS]; /* indices into the plan's parameter table, n_params of them */
    int n_params;
    ebb_route_mode mode; /* ROUTE, ENTER, EXIT */
    int branch;          /* ENTER, EXIT */
    int n_branches;      /* ROUTE */
    int top_k;           /* ROUTE in TOPK mode */
    int counter;         /* LOOP_INIT, LOOP_NEXT */
    int64_t limit;       /* LOOP_NEXT */
    int sense;           /* JUMP_IF: jump when (mean > 0) == sense */
    /* training */
    int train;           /* OP: runs the rule's forward_train; pub.out[1..] are its extras */
    int *owners;         /* REDUCE_SCATTER(_START) (ZeRO-1): per input, the rank that
                            owns its parameter; only this rank's own become means */
    int *sums_of;        /* GRAD_SUMS: per output, the parameter whose sum it is */
    int agree;           /* GRAD_SUMS, data parallel with routing or loops: the ranks
                            agree on which sums hold a gradient (src/exec.c) */
    int fwd_step;        /* BACKWARD: the forward step it differentiates */
    int n_fwd_in;        /* BACKWARD: the forward step's input count */
    uint32_t saved_in;   /* BACKWARD: forward inputs in pub.in, in order; then the
                            output (saves_out), the extras, and grad_out (unless seed) */
    int saves_out;
    int n_saved;
    int seed;            /* BACKWARD: grad_out is the loss's seed, 1 */
    uint32_t grad_in;    /* BACKWARD: inputs whose gradients lead pub.out, in order;
                            the parameters' (buffers excepted) follow */
    uint32_t skip_in;    /* BACKWARD: ebb_op_grad_call.skip_input_grad */
    char *op_owned;      /* pub.op when the compiler made the name ("linear.backward") */
    int shape_of;        /* ZEROS: the slot whose run-time shape it takes */
    /* ALIAS in a training compile's unrolled while/until loop: 1 writes the
     * loop's result from iteration `branch` (its body's output), 2 starts
     * the result as the loop's input; `counter` names the loop. */
    int unrolled;
} plan_step;

/* How many low copies the step keeps for (or reads from) the other. */
static inline int ebb_step_kept_copies(const plan_step *s) {
    int n = 0;
    for (uint32_t m = s->keep_copy; m; m &= m - 1)
        n++;
    return n;
}

typedef struct plan_param {
    ebb_param_spec spec;
    char *full_name; /* "<node name or path>.<param>" */
    char *node;      /* node path that owns it (for duplicate-name errors) */
    char **aliases;  /* the full names tied nodes give it (ebb_node_share) */
    int n_aliases;
} plan_param;

struct ebb_plan {
    uint64_t id;      /* unique per process, from 1 */
    ebb_graph *graph; /* a reference: ops' attributes live in its nodes */
    char *name;
    plan_step *steps;
    int n_steps;
    ebb_plan_value *values;
    int n_values;
    int *inputs; /* slots */
    int n_inputs;
    int *outputs; /* slots */
    char **output_names;
    int n_outputs;
    plan_param *params;
    int n_params;
    int n_counters;
    int max_in;     /* most inputs of one step, for the executor's scratch */
    int max_params; /* most parameters of one step */
    int keep_all;
    ebb_dtype dtype;
    int64_t peak_bytes;
    int peak_step;
    int peak_is_bound; /* routing or a data-dependent loop: the peaks are upper bounds */
    int cuda_peak_is_bound; /* that, or a step whose CUDA scratch is a bound (cuDNN, SDPA) */
    int64_t keep_all_peak_bytes; /* the same graph's peak with nothing freed */
    int64_t cuda_peak_bytes;     /* peak_bytes with CUDA's 512-byte block rounding */
    /* training plans (ebb_compile_options.train) */
    int training;
    int n_targets;     /* the last n_targets of inputs[] */
    unsigned char *trained;  /* per parameter */
    unsigned char *no_decay; /* per parameter: updated without weight decay (NULL: none) */
    int *out_param;    /* per output: the parameter whose gradient it is, or -1 */
    /* the training options it was compiled with, their arrays left out
     * (trained and no_decay are the per-parameter arrays above): grads_only
     * (outputs 1.. are gradients, no update steps), the optimizer the update
     * steps' scratch was counted for, clipping and loss scaling (0 with
     * grads_only), accumulate (0 for none), parallel (world 0 with
     * grads_only, rank 0 without zero)
     * and low_weight_copies */
    ebb_train_options train_options;
    int updates_in_backward; /* each update follows its gradient's last backward step */
    int64_t unclipped_peak_bytes; /* clip_grad_norm or loss_scaling: the step's peak with the
                                     updates inside the backward (without either) */
    int n_buckets;     /* its EBB_STEP_ALLREDUCE steps */
    /* ZeRO-1 (parallel.zero): per parameter the rank that updates it (-1:
     * none); NULL: not sharded */
    int *owner;
    /* graph/placement.c: updates moved to the backward's end because the
     * step's peak is lower so (per parameter), and the peak with every
     * update right after its gradient */
    unsigned char *deferred;
    int n_deferred;
    int64_t eager_peak_bytes;
    /* graph/copies.c, mixed precision: parameters' low copies kept from the
     * forward for the backward (plan_step.keep_copy), their bytes, and
     * those the backward makes again because keeping them would raise the
     * peak (or the options say so) */
    int n_kept_copies, n_recast_copies;
    int64_t kept_copy_bytes;
    /* a memory budget (graph/remat.c) */
    int64_t memory_budget;           /* EBB_MEMORY_BUDGET_LEAST: the peak it reached */
    int budget_least;                /* compiled for EBB_MEMORY_BUDGET_LEAST */
    int64_t budget_peak_bytes;       /* what a budget bounds: the larger of the CPU and CUDA peaks */
    int64_t no_recompute_peak_bytes; /* budget_peak_bytes with every value kept */
    int64_t flops;                   /* estimated: every step but the recompute steps */
    int64_t recompute_flops;
    int remat_segment;               /* the checkpoint spacing chosen; 0: none */
    /* generation (ebb_compile_options.kv_cache): the cache's length in
     * positions; its tensors are the EBB_VALUE_STATE values, in slot order */
    int64_t kv_cache;
    void *attrs; /* attribute values of compiler-made ops (a list) */
};

/* Non-zero when a training plan's backward reads the value, made in the
 * forward (an activation kept for the backward). */
int ebb_plan_value_saved(const ebb_plan *p, int slot);
/* "forward", "loss", "backward", "update". */
const char *ebb_plan_phase_name(ebb_step_phase phase);

/* Writes s as a JSON (and DOT) string literal, quotes included. */
void ebb_json_string(FILE *f, const char *s);

/* Steps own their node path and slot arrays (pub.node, pub.in, ...). */

#endif
