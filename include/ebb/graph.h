/*
 * ebb/graph.h - declaring graphs with the fluent builder.
 *
 * A builder records a flow step by step. The vocabulary is flodl's:
 *
 *     ebb_builder *b = ebb_builder_new("tower");
 *     ebb_input(b, "x");
 *     ebb_from(b, ebb_node_op(b, "linear", "out=64, name=stem"));
 *     ebb_also(b, ebb_node_seq(b, ebb_node_op(b, "linear", "out=64"),
 *                                 ebb_node_op(b, "gelu", NULL), NULL));
 *     ebb_tag(b, "h");
 *     ebb_split(b, ebb_node_op(b, "relu", NULL), ebb_node_op(b, "tanh", NULL), NULL);
 *     ebb_merge(b, EBB_MERGE_ADD, 0);
 *     ebb_using(b, "h", NULL);
 *     ebb_through(b, ebb_node_op(b, "cat", "dim=1"));
 *     ebb_graph *g = ebb_build(b);           // NULL on error: see ebb_errmsg()
 *     ebb_builder_free(b);
 *
 * Errors are sticky, as in cairo: the first failing call records its error
 * (naming the call, e.g. "ebb_merge: only 1 open stream"), every later call
 * is a no-op, and ebb_build() returns NULL with that error. Chains of calls
 * need no checks in between.
 *
 * Node kinds (a "stream" is the current tensor; a split opens several):
 *   from(n)          the node receives the graph's first input
 *   through(n)       stream := n(stream)
 *   also(n)          stream := stream + n(stream)              (residual)
 *   split(n1..nk)    k >= 2 open streams, each ni(stream)
 *   merge(op)        k streams -> 1 by add, mean, mul, max, cat(dim), stack(dim),
 *                    or by any node taking k inputs (ebb_merge_node)
 *   gate(r, e1..ek)  w = r(stream) [B, k]; stream := sum_i w[:, i] * ei(stream);
 *                    with top_k > 0 each row runs only its top_k experts,
 *                    weights renormalised over the chosen ones
 *   switch(s, b1..bk) per row, s(stream) ([B] indices or [B, k] scores, argmax)
 *                    picks one branch; rows are gathered per branch, only
 *                    branches with rows run, results are scattered back
 *   loop             state := body(state), for N / while cond / until cond;
 *                    a condition is true when the mean of its output is > 0
 *   tag(name)        names the stream; graph inputs are tags too
 *   using(names)     the next from/through node receives the stream followed
 *                    by the named tensors
 *
 * Nodes are created by the builder that uses them and owned by it; they must
 * not be shared between builders, and each node is used once.
 *
 * Node paths (used in errors, plans, and as the parameter prefix of unnamed
 * nodes) start at "flow": the node of from/through step i is "flow.i"; other
 * kinds add their name: "flow.i.also", "flow.i.split.j", "flow.i.merge",
 * "flow.i.gate.router", "flow.i.gate.j", "flow.i.switch.selector",
 * "flow.i.switch.j", "flow.i.loop.body", "flow.i.loop.cond". Element j of a
 * sequence or step j of a sub-flow or nested graph at path Q is "Q.j" (plus
 * the kind suffix for non-through steps). A node named with `name=` uses
 * that name instead. A built graph is immutable and may be used
 * as a node of another flow (ebb_node_graph); such a nested flow receives the
 * stream as its first input and `using` tensors as its next inputs.
 */
#ifndef EBB_GRAPH_H
#define EBB_GRAPH_H

#include <stdio.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_builder ebb_builder;
typedef struct ebb_node ebb_node;
typedef struct ebb_graph ebb_graph;

typedef enum ebb_merge_op {
    EBB_MERGE_ADD,
    EBB_MERGE_MEAN,
    EBB_MERGE_MUL,
    EBB_MERGE_MAX,
    EBB_MERGE_CAT,   /* along `dim` */
    EBB_MERGE_STACK, /* along a new `dim` */
} ebb_merge_op;

/* A new, empty builder. `name` (may be NULL) names the graph. Free it with
 * ebb_builder_free(). Calls ebb_init() if needed. Returns NULL only when out of
 * memory or when ebb_init() fails (see ebb_errmsg()). */
EBB_API ebb_builder *ebb_builder_new(const char *name);
/* Frees the builder and every node it made that no built graph took. */
EBB_API void ebb_builder_free(ebb_builder *b);

/* The builder's sticky status (EBB_OK until a call fails). NULL b: EBB_ERR_ARG. */
EBB_API ebb_status ebb_builder_status(const ebb_builder *b);
/* The builder's first error message ("" when none), owned by the builder.
 * NULL b: "builder is NULL". */
EBB_API const char *ebb_builder_errmsg(const ebb_builder *b);

/* Records a builder error from outside (the YAML loader uses this to report
 * a spec position). Ignored if the builder already failed. */
EBB_API void ebb_builder_fail(ebb_builder *b, ebb_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- nodes -------------------------------------------------------------- */

/* An op node. `attrs` is NULL or "key=value" pairs separated by commas or
 * spaces: "out=64, name=stem", "dim=-1", "bias=false". Values are checked
 * against the op's schema; the attribute `name` names the node (its
 * parameters become "<name>.weight", ...). Returns NULL after an error. */
EBB_API ebb_node *ebb_node_op(ebb_builder *b, const char *op, const char *attrs);
/* A chain of nodes, applied in order (NULL-terminated). */
EBB_API ebb_node *ebb_node_seq(ebb_builder *b, ebb_node *first, ...) EBB_SENTINEL;
/* ebb_node_seq() from an array of n nodes (n >= 1). NULL nodes or n < 1 is a
 * builder error; returns NULL after an error. */
EBB_API ebb_node *ebb_node_seqv(ebb_builder *b, ebb_node *const *nodes, int n);
/* `times` copies of a body, applied in order, each with its own weights:
 * what a spec's `repeat` makes. make(b, i, user) builds copy i (0-based) and
 * returns its node; give the copies' nodes names with the index in them, as
 * PyTorch numbers an nn.ModuleList:
 *
 *     static ebb_node *layer(ebb_builder *b, int i, void *user) {
 *         char a[64];
 *         snprintf(a, sizeof a, "out=64, name=layers.%d.fc", i);
 *         return ebb_node_seq(b, ebb_node_op(b, "linear", a), ebb_node_op(b, "gelu", NULL), NULL);
 *     }
 *     ebb_through(b, ebb_node_repeat(b, 4, layer, NULL));   // layers.0.fc.weight, ...
 *
 * Returns NULL after an error (times < 1, make NULL or returning NULL). */
EBB_API ebb_node *ebb_node_repeat(ebb_builder *b, int times,
                          ebb_node *(*make)(ebb_builder *b, int i, void *user), void *user);
/* A built graph used as a node. The node keeps its own reference to `g`. */
EBB_API ebb_node *ebb_node_graph(ebb_builder *b, const ebb_graph *g);
/* Sets a node's name (the prefix of its parameters' names). */
EBB_API ebb_node *ebb_node_name(ebb_builder *b, ebb_node *n, const char *name);

/* Mixed precision (ebb_compile_options.precision in ebb/plan.h, which
 * explains the policy). */
typedef enum ebb_precision {
    EBB_PRECISION_DEFAULT = 0, /* ebb_spec_compile: the spec's `precision:`; else fp32 */
    EBB_PRECISION_FP32,        /* every op in the plan's dtype */
    EBB_PRECISION_BF16,        /* the matrix products in bfloat16 */
    EBB_PRECISION_FP16,        /* the matrix products in float16 */
} ebb_precision;
/* A per-node override of the plan's precision, as a torch.autocast region
 * around one module: every op inside node `n` (a sequence, sub-flow or
 * nested graph included) computes as `p` says, whatever the plan was
 * compiled with. EBB_PRECISION_FP32 runs them in float32, their inputs cast
 * up where they arrive in a low dtype (autocast disabled, inputs .float());
 * EBB_PRECISION_BF16 or FP16 applies autocast's policy in that dtype, even
 * in a float32 plan. The casts in and out are plan steps like any other.
 * EBB_PRECISION_DEFAULT removes an override. A float32 graph only: a plan of
 * another dtype refuses overrides at compile. Returns n, or NULL after an
 * error (n NULL, p not an ebb_precision). */
EBB_API ebb_node *ebb_node_precision(ebb_builder *b, ebb_node *n, ebb_precision p);
/* Weight tying: the op node `n` uses the parameter named `source` (a full
 * name such as "transformer.wte.weight", defined by a node earlier in the
 * flow) as its own parameter `param` ("weight") instead of making one. The
 * shapes must agree (checked at compile time). Both uses' gradients are
 * summed into one, the parameter is updated once, and a weights file may
 * hold it under either name or both, as PyTorch's state_dict holds tied
 * keys. Call once per tied parameter. Returns n, or NULL after an error
 * (n not an op node, a NULL or invalid name, `param` tied twice). */
EBB_API ebb_node *ebb_node_share(ebb_builder *b, ebb_node *n, const char *param,
                                 const char *source);

/* An inline sub-flow: a builder whose single input is the stream it is
 * applied to, and which may read (`using`) the tags of the enclosing flow
 * visible where the sub-flow node is used. Tags it defines stay local.
 *
 *     ebb_builder *s = ebb_subflow_begin(b);
 *     ebb_through(s, ebb_node_op(s, "linear", "out=64"));
 *     ebb_using(s, "h", NULL);                      // h is a tag of b
 *     ebb_through(s, ebb_node_op(s, "add", NULL));
 *     ebb_node *n = ebb_subflow_end(s);             // a node of b; s is freed
 *
 * The sub-flow starts with one open stream (no ebb_from). An error inside it
 * becomes the parent's sticky error. */
EBB_API ebb_builder *ebb_subflow_begin(ebb_builder *parent);
/* Ends a sub-flow from ebb_subflow_begin(): frees `sub` and returns the node
 * for the parent (owned by the parent builder), or NULL after an error. NULL
 * sub: NULL. */
EBB_API ebb_node *ebb_subflow_end(ebb_builder *sub);

/* ---- steps -------------------------------------------------------------- */

/* Declares a graph input, in order. Without any, the graph has one input "x".
 * Each input is also a tag. */
EBB_API void ebb_input(ebb_builder *b, const char *name);
/* Declares a tag as an extra graph output, after the final stream. The tag
 * must exist by the end of the flow. */
EBB_API void ebb_output(ebb_builder *b, const char *tag);
/* Names the final stream's output ("y" by default). */
EBB_API void ebb_output_final(ebb_builder *b, const char *name);

/* Declares a training target, in order (a class index or a regression
 * target that the loss compares the final stream with). Targets are not
 * inputs of the forward: only a training compile binds them, after the
 * inputs. A NULL, invalid or duplicate name (inputs included) is a builder
 * error. */
EBB_API void ebb_target(ebb_builder *b, const char *name);
/* Declares the graph's loss: `op` is a loss op of the registry
 * ("cross_entropy", "mse", "bce_with_logits", "nll"), applied to the final
 * stream and the targets in order; `attrs` as for ebb_node_op()
 * ("label_smoothing=0.1") or NULL. At most once; an unknown op or bad
 * attribute is a builder error. A training compile uses it unless its
 * options name another loss. */
EBB_API void ebb_loss(ebb_builder *b, const char *op, const char *attrs);

/* Starts the flow: n receives the graph's first input. Only once, and not in
 * a sub-flow. NULL n is a builder error. */
EBB_API void ebb_from(ebb_builder *b, ebb_node *n);
/* stream := n(stream), plus any pending ebb_using() tensors as n's next
 * inputs. NULL n is a builder error. */
EBB_API void ebb_through(ebb_builder *b, ebb_node *n);
/* A residual step: stream := stream + n(stream). NULL n is a builder error. */
EBB_API void ebb_also(ebb_builder *b, ebb_node *n);
/* NULL-terminated branch nodes, at least 2. */
EBB_API void ebb_split(ebb_builder *b, ebb_node *first, ...) EBB_SENTINEL;
/* ebb_split() from an array of n branch nodes; NULL nodes or n < 2 is a
 * builder error. */
EBB_API void ebb_splitv(ebb_builder *b, ebb_node *const *nodes, int n);
/* `dim` is used by EBB_MERGE_CAT and EBB_MERGE_STACK. */
EBB_API void ebb_merge(ebb_builder *b, ebb_merge_op op, int64_t dim);
/* Joins the k open streams with a node that takes k inputs, stream 0
 * first: an op such as scaled_dot_product_attention (q, k, v), a sub-flow
 * built for k inputs or a nested graph. NULL n, or a node that cannot take
 * k inputs, is a builder error. */
EBB_API void ebb_merge_node(ebb_builder *b, ebb_node *n);
/* top_k == 0: dense, every expert runs on every row. NULL-terminated experts. */
EBB_API void ebb_gate(ebb_builder *b, ebb_node *router, int top_k, ebb_node *first_expert, ...) EBB_SENTINEL;
/* ebb_gate() from an array of n experts (n >= 2); NULL router or experts, or
 * top_k outside 0..n, is a builder error. */
EBB_API void ebb_gatev(ebb_builder *b, ebb_node *router, int top_k, ebb_node *const *experts, int n);
/* NULL-terminated branches, at least 2. */
EBB_API void ebb_switch(ebb_builder *b, ebb_node *selector, ebb_node *first_branch, ...) EBB_SENTINEL;
/* ebb_switch() from an array of n branches (n >= 2); NULL selector or
 * branches is a builder error. */
EBB_API void ebb_switchv(ebb_builder *b, ebb_node *selector, ebb_node *const *branches, int n);
/* The body runs exactly `times` times (0 is allowed). */
EBB_API void ebb_loop_for(ebb_builder *b, ebb_node *body, int64_t times);
/* Checks cond(state) before each iteration; at most `max` iterations. */
EBB_API void ebb_loop_while(ebb_builder *b, ebb_node *body, ebb_node *cond, int64_t max);
/* Checks cond(state) after each iteration, stops when true; at most `max`. */
EBB_API void ebb_loop_until(ebb_builder *b, ebb_node *body, ebb_node *cond, int64_t max);
/* Names the current stream so later ebb_using() calls can read it. A NULL,
 * invalid or duplicate name is a builder error. */
EBB_API void ebb_tag(ebb_builder *b, const char *name);
/* NULL-terminated tag names, for the next from/through. */
EBB_API void ebb_using(ebb_builder *b, const char *first, ...) EBB_SENTINEL;
/* ebb_using() from an array of n tag names (n >= 1); NULL names, a NULL name
 * or n < 1 is a builder error. */
EBB_API void ebb_usingv(ebb_builder *b, const char *const *names, int n);

/* Finishes the flow. Returns a new graph (free with ebb_graph_free) or NULL
 * with the builder's first error in ebb_errmsg(). The builder can be freed
 * right after; the graph does not depend on it. */
EBB_API ebb_graph *ebb_build(ebb_builder *b);

/* ---- graphs ------------------------------------------------------------- */

/* Releases a graph (graphs are reference-counted; nodes that nest it keep it
 * alive). NULL is allowed. */
EBB_API void ebb_graph_free(ebb_graph *g);
/* The graph's name, owned by the graph ("flow" when the builder had none).
 * NULL g: NULL. */
EBB_API const char *ebb_graph_name(const ebb_graph *g);
/* Number of graph inputs (at least 1). NULL g: 0. */
EBB_API int ebb_graph_input_count(const ebb_graph *g);
/* Name of input i, owned by the graph. NULL g or i out of range: NULL. */
EBB_API const char *ebb_graph_input_name(const ebb_graph *g, int i);
/* Number of outputs: the final stream ("y" unless renamed), then the
 * ebb_output() tags. NULL g: 0. */
EBB_API int ebb_graph_output_count(const ebb_graph *g);
/* Name of output i (0 is the final stream), owned by the graph. NULL g or i
 * out of range: NULL. */
EBB_API const char *ebb_graph_output_name(const ebb_graph *g, int i);
/* Number of declared training targets. NULL g: 0. */
EBB_API int ebb_graph_target_count(const ebb_graph *g);
/* Name of target i, owned by the graph. NULL g or i out of range: NULL. */
EBB_API const char *ebb_graph_target_name(const ebb_graph *g, int i);
/* The declared loss op's name, or NULL when the graph declares none (also
 * for NULL g). */
EBB_API const char *ebb_graph_loss(const ebb_graph *g);
/* Number of steps of the top-level flow. NULL g: 0. */
EBB_API int ebb_graph_step_count(const ebb_graph *g);
/* Writes the graph as Graphviz DOT: split/merge fan out and in, gate and
 * switch as diamonds with branches in clusters, loop bodies as clusters with
 * their back edge, `using` reads as dashed edges. Each op node is named by
 * label(user, path) where `label` is given and says something (a spec's
 * block and place, ebb_spec_node_label()), else by its path; the callback's
 * type is plan.h's ebb_node_label_fn. NULL g or f: writes nothing. */
EBB_API void ebb_graph_write_dot(const ebb_graph *g, FILE *f,
                                 const char *(*label)(void *user, const char *node), void *user);

#ifdef __cplusplus
}
#endif
#endif /* EBB_GRAPH_H */
