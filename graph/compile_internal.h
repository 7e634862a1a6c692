/* Shared by the compiler's files, by level: compiler.c (the state and the
 * helpers that grow the plan) at the bottom, one file per pass above it,
 * pipeline.c running the passes, the searches (remat.c, placement.c,
 * copies.c) above that, and ebb_compile() (compile.c) on top.
 *
 * The compiler fills an ebb_plan in place: lowering appends values and steps,
 * the later passes annotate them. Every helper that can fail sets c->status
 * (with the message) and returns -1 or NULL. */
#ifndef EBB_COMPILE_INTERNAL_H
#define EBB_COMPILE_INTERNAL_H

#include "plan_internal.h"

#define EBB_MAX_STEPS 1000000

/* Attribute values for ops the compiler introduces (merge dims, gate
 * indices); the list moves into the plan. */
typedef struct attr_block {
    struct attr_block *next;
    ebb_attr_value v[1];
} attr_block;

typedef struct compiler {
    ebb_plan *plan;
    attr_block *attrs;
    const ebb_op *no_meta[64]; /* ops seen failing on the meta device */
    int n_no_meta;
    const ebb_op *no_meta_bwd[64]; /* backward rules seen failing there */
    int n_no_meta_bwd;
    const ebb_op *no_meta_train[64]; /* training forwards seen failing there */
    int n_no_meta_train;
    int training; /* a training compile: `for` loops are unrolled */
    int repeating; /* lowering a later iteration of an unrolled loop: reuse its parameters */
    int cap_steps, cap_values, cap_params;
    ebb_tensor **meta; /* per slot: a shape-only tensor from the dry run */
    int cap_meta;
    ebb_device meta_device;
    /* per forward slot: the backward recomputes it rather than reading it
     * (graph/remat.c chooses; NULL: every value is kept) */
    const unsigned char *drop;
    int n_drop;
    /* per parameter: its update waits for the backward's end rather than
     * following its final gradient (graph/placement.c chooses; NULL: none
     * waits) */
    const unsigned char *defer;
    /* per step of the forward: a mixed-precision step whose parameters'
     * low copies are kept for its backward (graph/copies.c chooses; NULL:
     * each backward casts its own) */
    const unsigned char *keep;
    int n_keep;
    /* mixed precision (ebb_compile_options.precision): the matrix products'
     * dtype, when `autocast` */
    int autocast;
    ebb_dtype low;
    /* inside a float32 region: every op computes in the plan's dtype (a
     * float32 plan whose nodes override its precision, or a node set to
     * EBB_PRECISION_FP32; graph/lower.c) */
    int full;
    ebb_status status;
} compiler;

/* ---- building the plan (graph/compiler.c) -------------------------------- */

int ebb_compiler_oom(compiler *c);
/* c->status := st (its message already set); returns -1. */
int ebb_compiler_fail(compiler *c, ebb_status st);
char *ebb_compiler_strdupf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
int *ebb_compiler_dup_ints(const int *v, int n);
/* A new slot whose shape comes from `meta` (ownership passes to the compiler). */
int ebb_compiler_value_new(compiler *c, ebb_tensor *meta, ebb_value_kind kind, int producer,
                       int alias_of);
plan_step *ebb_compiler_step_new(compiler *c, ebb_step_kind kind, const char *op_name,
                             const char *path);
int ebb_compiler_step_set_slots(compiler *c, plan_step *s, const int *in, int n_in, const int *out,
                            int n_out);
int ebb_compiler_step_index(const compiler *c, const plan_step *s);
/* Drops the steps marked in gone[] (one flag per step) from a plan not yet
 * through liveness, renumbering jumps and producers; 0 or -1. */
int ebb_compiler_steps_remove(compiler *c, const unsigned char *gone);
/* A new handle on a slot's meta tensor, and a new meta tensor. */
ebb_tensor *ebb_compiler_meta_ref(compiler *c, int slot);
ebb_tensor *ebb_compiler_meta_new(compiler *c, const ebb_shape *s, ebb_dtype dt);
/* The parameters (bit j for s->param[j]) a mixed-precision step runs on
 * low copies of. */
uint32_t ebb_low_copy_params(const ebb_plan *p, const plan_step *s);
/* Mixed precision (graph/lower.c): the dtype a step computes parameter k in
 * (its low copy's, or the parameter's own), and the bytes the low copies it
 * makes in its scratch take (`cuda`: in the caching allocator's blocks;
 * copies kept from the forward, plan_step.keep_copy, are values instead). */
ebb_dtype ebb_param_dtype_in(const compiler *c, const plan_step *s, int k);
int64_t ebb_param_copy_bytes(const compiler *c, const plan_step *s, int cuda);
/* A `cast` step of slot x to dt at node "<path>.cast<i>"; its slot or -1. */
int ebb_lower_cast(compiler *c, int x, ebb_dtype dt, const char *path, int i);
/* Adds a step's parameter copies to its forward scratch, on both devices. */
void ebb_add_param_copies(const compiler *c, plan_step *s);
/* What a matrix product in the low dtype may take beyond its figure
 * (plan_step.low_kernel): a float32 copy of each operand and of the result,
 * `times` over (2 for a backward: the gradients too); `cuda`: in blocks. */
int64_t ebb_low_kernel_allowance(const ebb_shape *in, int n_in, const ebb_shape *params, int np,
                                 const ebb_shape *out, int times, int cuda);
/* A mixed-precision backward step's scratch around its rule's `rule`: the
 * parameters' low copies (C) and the rule's low gradients (G) beside the
 * gradients cast back (F, the step's outputs): max(C + rule + G - F, G).
 * The rule's own figure where the step casts nothing. */
int64_t ebb_backward_cast_scratch(const compiler *c, const plan_step *b, int64_t rule, int cuda);

/* What the searches choose, for one compile (NULL arrays: none):
 *  - drop, per forward slot (n_drop): recomputed in the backward rather
 *    than kept (remat.c);
 *  - defer, per parameter: its update moved to the backward's end
 *    (placement.c);
 *  - keep, per forward step (n_keep): its parameters' low copies kept for
 *    the backward (copies.c). */
typedef struct ebb_choices {
    const unsigned char *drop;
    int n_drop;
    const unsigned char *defer;
    const unsigned char *keep;
    int n_keep;
} ebb_choices;

/* graph/pipeline.c: one compile, every pass in order, with the choices
 * given (NULL: keep every value, defer nothing, keep no low copy). */
ebb_status ebb_pipeline(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts,
                        const ebb_choices *choices);
/* graph/copies.c: under mixed precision, keeps the low copies of the
 * parameters a training forward casts for its backward where that does not
 * raise the step's peak (or as ebb_train_options.low_weight_copies says);
 * *plan is replaced when a copy is kept. */
ebb_status ebb_keep_low_copies(ebb_plan **plan, const ebb_graph *g, const ebb_compile_options *opts);
/* graph/placement.c: moves updates whose scratch or timing makes the
 * step's peak to the backward's end, one at a time while the peak falls
 * (*plan is replaced by the better plan). */
ebb_status ebb_place_updates(ebb_plan **plan, const ebb_graph *g, const ebb_compile_options *opts);

/* ---- the passes, in the order ebb_compile runs them ------------------------ */

/* graph/lower.c: binds the inputs, lowers the nested flow to a flat list of
 * steps over value slots (dry-running each op for its output's shape), and
 * marks the outputs. */
int ebb_pass_lower(compiler *c, const ebb_graph *g, const ebb_compile_options *opts);
/* graph/lower.c: emits one op step reading `in` (dry-running it for its
 * output's shape); returns the output slot or -1. */
int ebb_lower_op(compiler *c, const ebb_op *op, const ebb_attr_value *attrs, const char *prefix,
                 const char *path, const int *in, int n_in);
/* ebb_lower_op() for an op node of the graph, whose ebb_node_share() ties
 * may name another node's parameters (NULL node: none). */
int ebb_lower_op_node(compiler *c, const ebb_op *op, const ebb_attr_value *attrs,
                      const ebb_node *node, const char *prefix, const char *path, const int *in,
                      int n_in);
/* graph/kv_cache.c: generation (opts->kv_cache > 0): causal attention
 * through a key/value cache of state values (see the file's comment). */
int ebb_pass_kv_cache(compiler *c, const ebb_compile_options *opts);
/* graph/autodiff.c: a training compile's loss, backward and update steps
 * after the lowered forward (see the file's comment). */
int ebb_pass_autodiff(compiler *c, const ebb_graph *g, const ebb_compile_options *opts);
/* graph/remat.c: under opts->memory_budget, replaces *plan (compiled
 * keeping every value) with the cheapest plan whose peak fits, or fails
 * naming the least peak reached. */
ebb_status ebb_remat_fit(ebb_plan **plan, const ebb_graph *g, const ebb_compile_options *opts);
/* graph/predict.c: estimated floating-point operations of one step. */
int64_t ebb_step_flops(const ebb_plan *p, const plan_step *s);
/* graph/liveness.c: the free lists on every control-flow edge. */
int ebb_pass_liveness(compiler *c);
/* graph/liveness.c: marks elementwise steps whose input dies there as in
 * place (after liveness: it reads the free lists). */
void ebb_pass_in_place(compiler *c);
/* graph/predict.c: live bytes after every step and the peak, counted per
 * alias class. With `no_frees`, nothing is released (the keep_all figure);
 * `granule` rounds every block up (CUDA's 512). Writes the per-step figures
 * for the exact CPU count (no_frees 0, granule 0: ebb_plan_step.peak_bytes
 * and live_bytes) and for CUDA's (granule 512: plan_step.cuda_peak_bytes).
 * Returns -1 on OOM. */
int64_t ebb_pass_predict(compiler *c, int no_frees, int64_t granule, int *peak_step);
/* graph/measure.c: each step whose scratch on `dev` its op can only bound
 * (workspace_is_bound on the CPU, workspace_cuda_is_bound on CUDA) is run
 * there on zeros, and what it took becomes its workspace (CPU) or
 * workspace_cuda (CUDA). */
int ebb_pass_measure(compiler *c, ebb_device dev);

#endif
