/*
 * ebb/op.h - operators and the op registry.
 *
 * An operator is a static descriptor: its name, how many inputs it takes, an
 * attribute schema, whether its output is a view of its first input, the
 * parameters it owns and a C forward function over the tensor layer. The
 * built-in ops (linear, relu, gelu, layer_norm, cat, ...) are registered by
 * ebb_init(); users register their own with ebb_op_register():
 *
 *     static ebb_status square_fwd(const ebb_op_call *c, ebb_tensor **out) {
 *         return ebb_tensor_binary(out, EBB_MUL, c->in[0], c->in[0]);
 *     }
 *     static const ebb_op square = {.name = "square", .min_inputs = 1,
 *                                   .max_inputs = 1, .forward = square_fwd};
 *     ebb_op_register(&square);   // now usable as ebb_node_op(b, "square", NULL)
 *
 * Attribute values reach the forward function in schema order, already
 * checked and defaulted, so a forward function never looks a name up.
 *
 * ebb_compile() runs every forward function once on meta tensors (shapes
 * without storage) to learn its output's shape, so a forward must work on
 * them. Those built from the tensor layer's functions do; an op that cannot
 * gives a shape function (ebb_op_shape_fn) instead.
 */
#ifndef EBB_OP_H
#define EBB_OP_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ebb_attr_type {
    EBB_ATTR_INT,
    EBB_ATTR_FLOAT,
    EBB_ATTR_BOOL,
    EBB_ATTR_STRING,
} ebb_attr_type;

/* One attribute in an op's schema. A required attribute has no default; an
 * optional one has none either but may be left out (its value is then unset,
 * e.g. linear's `in`, inferred from the input shape). */
typedef struct ebb_attr_spec {
    const char *name;
    ebb_attr_type type;
    int required;
    int optional;
    double default_number; /* INT, FLOAT, BOOL */
    const char *default_string;
    const char *doc;
} ebb_attr_spec;

/* A resolved attribute value. `set` is 0 when an optional attribute with no
 * default was not given (for example linear's `in`, inferred from shapes). */
typedef struct ebb_attr_value {
    ebb_attr_type type;
    int set;
    int64_t i;     /* INT and BOOL */
    double f;      /* FLOAT */
    const char *s; /* STRING */
} ebb_attr_value;

/* How a parameter is initialised, following PyTorch's module defaults. */
typedef enum ebb_init_kind {
    EBB_INIT_ZEROS,
    EBB_INIT_ONES,
    EBB_INIT_UNIFORM_FAN_IN, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)), nn.Linear */
    EBB_INIT_NORMAL,         /* N(0, std^2): nn.Embedding's N(0, 1) when std is 0 */
} ebb_init_kind;

typedef struct ebb_param_spec {
    const char *name; /* suffix after the node name: "weight", "bias" */
    ebb_shape shape;
    ebb_init_kind init;
    int64_t fan_in;
    /* A buffer, not a trained parameter (batch_norm's running statistics):
     * it gets no gradient and no optimizer state; a training forward may
     * update it in place through ebb_op_call.params. */
    int buffer;
    /* An int64 count whatever the plan's dtype, initialised to 0 (batch_norm's
     * num_batches_tracked, as PyTorch keeps it); always a buffer. */
    int counter;
    /* EBB_INIT_NORMAL's standard deviation; 0 means 1. */
    double std;
} ebb_param_spec;

#define EBB_MAX_PARAMS 8
#define EBB_MAX_ATTRS 16

typedef struct ebb_op ebb_op;

/* What a forward function receives. */
typedef struct ebb_op_call {
    const ebb_op *op;
    const ebb_attr_value *attrs; /* op->n_attrs values, schema order */
    ebb_tensor *const *in;       /* the stream, then `using` tensors */
    int n_in;
    ebb_tensor *const *params; /* in the order params() listed them */
    int n_params;
    const char *node; /* node path, for error messages */
    uint64_t seed;    /* training forward: this step's random seed (dropout) */
    /* Generation with a key/value cache (ebb_kv_cache): the positions the
     * cache held before this run, which is where the run's tokens stand in
     * the sequence; 0 otherwise. `positions` and `rotary_embedding` count
     * from it, and _cached_attention writes there. */
    int64_t position;
} ebb_op_call;

/* Computes the output into *out (a new handle). On failure returns a status
 * with ebb_error_set() and leaves *out NULL. */
typedef ebb_status (*ebb_op_forward_fn)(const ebb_op_call *call, ebb_tensor **out);

/* Lists the parameters for the given attributes and input shapes into
 * out[EBB_MAX_PARAMS]; sets *n. May fail when an attribute is inconsistent
 * with the input shape. */
typedef ebb_status (*ebb_op_params_fn)(const ebb_attr_value *attrs, const ebb_shape *in_shapes,
                                       int n_in, ebb_param_spec *out, int *n);

/* Bytes of scratch the forward function allocates and releases inside one
 * call, beyond its output (layer_norm's per-row mean and rstd, say). The
 * compiler adds them to the step's peak, so predicted peaks match the
 * allocator's. `dtype` is the first input's. */
typedef int64_t (*ebb_op_workspace_fn)(const ebb_attr_value *attrs, const ebb_shape *in_shapes,
                                       int n_in, ebb_dtype dtype);

/* The output's shape and dtype for the given attributes and inputs, without
 * computing anything. *out_dtype comes in as the first input's dtype. On a
 * bad combination returns a status with ebb_error_set() (EBB_ERR_SHAPE for
 * shapes that do not fit), which ebb_compile() reports for the node.
 *
 * The compiler learns every output's shape by a dry run: it calls the forward
 * function on meta tensors (shapes without storage, libtorch's meta device).
 * Ops built from the tensor layer's functions work there as they are. An op
 * whose forward cannot (it reads values, or calls ATen code without a meta
 * kernel) gives a shape function instead; the compiler then calls it rather
 * than the forward, and the output is a view of in[0] exactly when is_view
 * is set. With neither, the compiler's last resort runs the forward on CPU
 * zeros of the real sizes, and refuses (EBB_ERR_UNSUPPORTED, naming the node
 * and the bytes) when those stand-ins would exceed 64 MiB: planning a graph
 * never allocates its activations. */
typedef ebb_status (*ebb_op_shape_fn)(const ebb_attr_value *attrs, const ebb_shape *in_shapes,
                                      const ebb_dtype *in_dtypes, int n_in, ebb_shape *out_shape,
                                      ebb_dtype *out_dtype);

/* ---- backward rules ------------------------------------------------------
 *
 * An op that can be trained through says how, in the manner of PyTorch's
 * derivatives.yaml: what its backward reads (saved inputs, the output, small
 * extras the training forward makes such as a dropout mask or pooling
 * indices), which inputs get a gradient, and a function that computes those
 * gradients from the output's, calling ATen's derivative kernels
 * (threshold_backward, gelu_backward, native_layer_norm_backward,
 * convolution_backward, ...) through the tensor layer. A training compile
 * makes saved values ordinary plan values, so liveness keeps each exactly
 * until its backward has read it. An op with no rule cannot be trained
 * through: the compiler refuses it, naming the op and the node; it never
 * treats it as having a zero gradient.
 *
 *     static ebb_status square_bwd(const ebb_op_grad_call *c, ebb_tensor **gin,
 *                                  ebb_tensor **gparam) {
 *         (void)gparam;            // d(x*x)/dx = 2x
 *         ebb_tensor *two_x = NULL;
 *         ebb_status st = ebb_tensor_affine(&two_x, c->in[0], 2.0, 0.0);
 *         if (st == EBB_OK)
 *             st = ebb_tensor_binary(&gin[0], EBB_MUL, two_x, c->grad_out);
 *         ebb_tensor_free(two_x);
 *         return st;
 *     }
 *     static const ebb_op_grad square_grad = {.backward = square_bwd,
 *                                             .saves_inputs = 1u << 0,
 *                                             .differentiable = 1u << 0};
 *     // in the descriptor: .grad = &square_grad
 */

/* What a backward function receives. */
typedef struct ebb_op_grad_call {
    const ebb_op *op;
    const ebb_attr_value *attrs; /* as the forward saw them */
    ebb_tensor *const *in;       /* forward inputs: NULL where saves_inputs has no bit */
    int n_in;
    ebb_tensor *const *params;   /* the parameters, as the forward saw them */
    int n_params;
    const ebb_tensor *out;       /* the forward output if saves_output, else NULL */
    ebb_tensor *const *saved;    /* the extras forward_train made, n_saved of them */
    int n_saved;
    const ebb_tensor *grad_out;  /* the loss's gradient with respect to the output */
    const char *node;
    const ebb_shape *in_shapes;  /* every input's shape, saved or not: a rule that needs
                                    only an input's shape (add's broadcast, reshape, sum)
                                    reads it here and need not keep the input alive */
    /* Bit i: nothing needs input i's gradient (a graph input, say), so the
     * rule may leave grad_in[i] NULL and save the work, as PyTorch's
     * needs_input_grad lets a backward do. Deterministic: a training plan's
     * dry run sees what the rule does with the same bits. 0: give them all. */
    uint32_t skip_input_grad;
    /* Every input's dtype, saved or not: a gradient has its input's dtype,
     * which a rule that changes dtypes (cast) reads here. May be NULL for
     * rules whose inputs and output share one dtype. */
    const ebb_dtype *in_dtypes;
} ebb_op_grad_call;

/* Writes a new tensor into grad_in[i] for every input whose differentiable
 * bit is set (the caller has set all entries to NULL; leave the others), and
 * into grad_params[j] for every parameter that is not a buffer. Gradients have the shapes of what
 * they differentiate. */
typedef ebb_status (*ebb_op_backward_fn)(const ebb_op_grad_call *call, ebb_tensor **grad_in,
                                         ebb_tensor **grad_params);

/* The forward as training runs it, when that differs from inference (dropout
 * drops, batch_norm uses the batch's statistics and updates its running
 * ones) or when the backward needs extras: writes the output and n_saved
 * tensors into saved[]. */
typedef ebb_status (*ebb_op_forward_train_fn)(const ebb_op_call *call, ebb_tensor **out,
                                              ebb_tensor **saved);

typedef struct ebb_op_grad {
    ebb_op_backward_fn backward;
    ebb_op_forward_train_fn forward_train; /* NULL: training runs `forward` */
    uint32_t saves_inputs;   /* bit i: the backward reads input i */
    int saves_output;        /* the backward reads the output */
    int n_saved;             /* extras forward_train makes (at most EBB_MAX_SAVED) */
    uint32_t differentiable; /* bit i: input i gets a gradient (not integer indices) */
    /* Bytes of scratch the backward allocates and releases inside one call,
     * beyond the gradients it returns (the forward's ebb_op.workspace, for
     * the backward): a training plan adds them to the backward step's peak.
     * `in_shapes` and `dtype` are the forward's inputs'. NULL: none. */
    ebb_op_workspace_fn workspace;
    /* Set when `workspace` can only bound the backward's scratch (a kernel
     * chosen per machine): the training plan's peak is then a bound. */
    int workspace_is_bound;
    /* Scratch of forward_train beyond its output and its extras (which the
     * plan counts as values), where it has one; NULL: none. A training plan
     * counts this, not ebb_op.workspace, for a step that runs forward_train. */
    ebb_op_workspace_fn train_workspace;
    /* Optional: `workspace` and `train_workspace` on a CUDA device, in the
     * caching allocator's blocks (see ebb_op.workspace_cuda). NULL: the CPU
     * figure, rounded as one block. */
    ebb_op_workspace_fn workspace_cuda;
    ebb_op_workspace_fn train_workspace_cuda;
    /* Set when workspace_cuda and train_workspace_cuda can only bound what
     * the CUDA kernels take (a library that chooses its kernel on the
     * device): a training plan with such a step is an upper bound on CUDA. */
    int workspace_cuda_is_bound;
    /* Set when running forward_train twice would not repeat it: it draws
     * random numbers (dropout) or updates a buffer (batch_norm's running
     * statistics). Under a memory budget its output is then always kept,
     * never recomputed in the backward. */
    int no_recompute;
    /* Optional: whether forward_train draws random numbers (or updates a
     * buffer) with these attributes, for an op that does so only with some
     * (attention's dropout above 0); when given it decides, not no_recompute. */
    int (*draws)(const ebb_attr_value *attrs);
} ebb_op_grad;

#define EBB_MAX_SAVED 4

/* What a mixed-precision plan (ebb_compile_options.precision bf16 or fp16)
 * does with the op, as torch.autocast's lists class it. */
typedef enum ebb_op_autocast {
    EBB_AUTOCAST_PROMOTE = 0, /* the widest of its inputs' dtypes and its float parameters' */
    EBB_AUTOCAST_LOW,         /* a matrix product: in the low dtype, on low copies */
    EBB_AUTOCAST_FULL,        /* float32 whatever its inputs (softmax, norms, losses, sums) */
    EBB_AUTOCAST_KEEP,        /* its first input's dtype, float32 parameters (batch_norm) */
} ebb_op_autocast;

/* Inputs holding indices that a CUDA kernel asserts on when one is out of
 * range, which ends the process's use of the device: a captured CUDA graph
 * checks those the caller feeds before each replay (ebb_capture_replay). */
typedef enum ebb_op_indices {
    EBB_INDICES_NONE = 0,
    EBB_INDICES_CLASSES, /* in[1]: classes of in[0]'s last dimension (attr "ignore_index" skipped) */
    EBB_INDICES_ROWS,    /* in[0]: rows of a table of attr "num" rows */
} ebb_op_indices;

/* The forward's floating-point operations beyond multiplying its parameters
 * (2 per weight element and output row, which the compiler counts itself):
 * attention's scores and weighted sums. Used to weigh what recomputation
 * costs (ebb_compile_options.memory_budget). */
typedef int64_t (*ebb_op_flops_fn)(const ebb_attr_value *attrs, const ebb_shape *in, int n_in,
                                   const ebb_shape *out);

struct ebb_op {
    const char *name;
    int min_inputs;
    int max_inputs; /* -1: any number >= min_inputs */
    const ebb_attr_spec *attrs;
    int n_attrs;
    int is_view;                 /* output shares storage with in[0] */
    ebb_op_params_fn params;     /* NULL: no parameters */
    ebb_op_forward_fn forward;
    const char *doc;
    ebb_op_workspace_fn workspace; /* NULL: the output is the only allocation */
    /* Set when `workspace` can only bound what the kernel takes (a library
     * that picks its algorithm by machine, as oneDNN does for convolution):
     * plans with such a step say their peak is an upper bound, not exact. */
    int workspace_is_bound;
    /* Optional: computes the result into call->in[0] itself (an elementwise op
     * whose output has its input's shape and dtype). The compiler uses it when
     * the input dies at this step and shares its storage with nothing else,
     * so the output reuses the input's memory. */
    ebb_status (*forward_inplace)(const ebb_op_call *call, ebb_tensor *x);
    /* Optional: the output's shape without running the forward, for ops that
     * cannot run on meta tensors (see ebb_op_shape_fn). */
    ebb_op_shape_fn shape;
    /* How to differentiate the op (see "backward rules" above); NULL: it has
     * no gradient and a training compile refuses it. */
    const ebb_op_grad *grad;
    /* Optional: the forward's scratch on a CUDA device where libtorch's CUDA
     * kernels allocate otherwise than its CPU ones (fused recurrent cells,
     * cuDNN, reductions; a Scalar operand stays on the CPU there), in the
     * caching allocator's bytes: each allocation rounded up with
     * ebb_cuda_block(). NULL: `workspace`, rounded as one block. */
    ebb_op_workspace_fn workspace_cuda;
    /* Set when workspace_cuda can only bound what the kernel takes (cuDNN
     * picks a convolution's algorithm, and scaled dot-product attention its
     * kernel, by device): a plan with such a step is exact on the CPU and an
     * upper bound on CUDA (ebb_plan_peak_is_bound_on()). */
    int workspace_cuda_is_bound;
    /* In a bf16 or fp16 plan (default PROMOTE: the widest input). */
    ebb_op_autocast autocast;
    /* Optional: flops besides the parameters' products; NULL: none. */
    ebb_op_flops_fn flops;
    /* Indices a CUDA graph's caller feeds that must be in range. */
    ebb_op_indices indices;
    /* Optional: non-zero when, for these attributes, the op gives back its
     * first input unchanged (dropout at p = 0). The compiler
     * then lowers the node to `identity`, a view whose gradient passes
     * through: no copy, no mask, nothing kept. */
    int (*identity_for)(const ebb_attr_value *attrs);
    /* Bit i: input i is state the op updates in place, held across runs
     * by the caller rather than made by the plan (generation's key/value
     * cache, ebb_kv_cache); the positions a run adds to it are its first
     * input's second-to-last dim. Such an op only serves inference: it has
     * no backward rule, and a spec cannot name it. */
    uint32_t state_inputs;
};

/* What one allocation of n bytes holds on a CUDA device: the caching
 * allocator rounds every block up to 512 bytes (0 for n <= 0). */
static inline int64_t ebb_cuda_block(int64_t n) { return n > 0 ? (n + 511) / 512 * 512 : 0; }

/* Adds an op to the process-wide registry. The descriptor (and its strings)
 * must outlive the process's use of ebb. Fails (EBB_ERR_ARG) if the name is
 * taken or the descriptor is incomplete: no forward, bad input counts, a
 * backward rule without a backward function, or extras (n_saved) without a
 * forward_train to make them. Not thread-safe with concurrent lookups:
 * register ops at start-up, after ebb_init(). */
EBB_API ebb_status ebb_op_register(const ebb_op *op);

/* The op registered under `name`, or NULL (also for a NULL name). */
EBB_API const ebb_op *ebb_op_find(const char *name);

/* Number of registered ops (the built-ins once ebb_init() has run). */
EBB_API int ebb_op_count(void);
/* The i-th registered op, in registration order; owned by the registry.
 * i out of range: NULL. */
EBB_API const ebb_op *ebb_op_at(int i);

/* Index of attribute `name` in op's schema, or -1 (also for NULL op or name). */
EBB_API int ebb_op_attr_index(const ebb_op *op, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* EBB_OP_H */
