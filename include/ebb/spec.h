/*
 * ebb/spec.h - graphs declared in YAML (format 1, see docs/spec-format.md).
 *
 * A spec is a YAML file that the loader turns into the same builder calls a C
 * program would make, so a spec and its C twin compile to the same plan:
 *
 *     ebb_spec *s = NULL;
 *     if (ebb_spec_load(&s, "specs/mlp.yaml") != EBB_OK) {
 *         fprintf(stderr, "%s\n", ebb_errmsg());   // specs/mlp.yaml:7:5: error: ...
 *         return 1;
 *     }
 *     const char *bind[] = {"batch=8"};
 *     ebb_shape shapes[4];
 *     ebb_spec_resolve_shapes(s, bind, 1, shapes, 4);   // symbolic dims -> sizes
 *     ebb_compile_options o = {.input_shapes = shapes,
 *                              .n_input_shapes = ebb_spec_input_count(s)};
 *     ebb_plan *p = NULL;
 *     if (ebb_spec_compile(&p, s, &o) != EBB_OK)   // shape errors point into the file
 *         fprintf(stderr, "%s\n", ebb_errmsg());
 *     ebb_plan_free(p);
 *     ebb_spec_free(s);
 *
 * The loader is hardened for untrusted input: it never crashes, hangs or
 * leaks, and enforces the limits below itself. Every load error has status
 * EBB_ERR_SPEC and reads "FILE:LINE:COL: error: KEY.PATH: MESSAGE" (1-based
 * line and column of the offending YAML node; the key path is written like
 * flow[4].gate.experts[2]).
 */
#ifndef EBB_SPEC_H
#define EBB_SPEC_H

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The spec format this loader reads (the value of the `ebb:` key). */
#define EBB_SPEC_FORMAT 1

/* Limits enforced on every spec. Inputs beyond them are rejected with an
 * error, never truncated. */
#define EBB_SPEC_MAX_BYTES (1 << 20)   /* size of the YAML text */
#define EBB_SPEC_MAX_DEPTH 64          /* nesting of YAML lists and maps */
#define EBB_SPEC_MAX_YAML_NODES 100000 /* scalars, lists and maps in the file */
#define EBB_SPEC_MAX_NODES 10000       /* graph nodes after blocks and repeat expand */
#define EBB_SPEC_MAX_NESTING 64        /* sub-flows inside sub-flows, blocks included */

typedef struct ebb_spec ebb_spec;

/* Reads and loads the spec at `path`; errors name the file as `path`. On
 * success *out is a new spec (free with ebb_spec_free). EBB_ERR_IO when the
 * file cannot be read, EBB_ERR_SPEC for anything wrong inside it. */
EBB_API ebb_status ebb_spec_load(ebb_spec **out, const char *path);

/* Loads a spec from memory (`len` bytes; NUL bytes inside are an error).
 * `display_name` is the FILE of error messages and, without directory and
 * extension, the default graph name; NULL means "<string>". */
EBB_API ebb_status ebb_spec_load_string(ebb_spec **out, const char *text, size_t len,
                                const char *display_name);

#define EBB_SPEC_MAX_OVERRIDES 64

/* Load options. `params` holds n "name=number" strings that replace the
 * values of the spec's `params:` map, as if the file said so: a width or
 * depth can change without editing the spec. Naming a param the spec lacks
 * is an error. */
typedef struct ebb_spec_options {
    const char *const *params;
    int n_params;
} ebb_spec_options;

/* ebb_spec_load() with options (NULL: none). NULL out or path: EBB_ERR_ARG. */
EBB_API ebb_status ebb_spec_load_ex(ebb_spec **out, const char *path, const ebb_spec_options *opts);
/* ebb_spec_load_string() with options (NULL: none). On success *out is a new
 * spec (free with ebb_spec_free). NULL out, or NULL text with len > 0:
 * EBB_ERR_ARG. */
EBB_API ebb_status ebb_spec_load_string_ex(ebb_spec **out, const char *text, size_t len,
                                   const char *display_name, const ebb_spec_options *opts);

/* ---- a spec around a graph built in C ------------------------------------ */

/* What a spec's `inputs:` or `targets:` says of one of them. */
typedef struct ebb_spec_field {
    const char *name;  /* an input (ebb_input) or target (ebb_target) of the graph */
    const char *shape; /* its dimensions as a spec lists them, "batch, 784" or
                        * "[batch, 784]": sizes, and symbolic names bound when
                        * it is compiled (the trainer binds batch, and --block
                        * binds an input's second one) */
    const char *dtype; /* "int64", ...; NULL: the plan's dtype, as a spec without
                        * `dtype:` (float32 unless the compile says otherwise) */
} ebb_spec_field;

/* A spec around a graph built with the builder calls (graph.h), so that
 * whatever takes a spec (ebb_spec_compile, the trainer) takes a C-built
 * model too. `fields` declares each input and target of g exactly once, in
 * any order. The spec holds its own reference to g (free yours when you
 * like), is named after g in its errors, and has no params and the default
 * precision. EBB_ERR_ARG, naming the field, for a name that is neither an
 * input nor a target of g, one declared twice or not at all, and a shape or
 * dtype that does not parse. On success *out is a new spec (free with
 * ebb_spec_free). */
EBB_API ebb_status ebb_spec_from_graph(ebb_spec **out, const ebb_graph *g,
                                       const ebb_spec_field *fields, int n);

/* Frees a spec and its reference to its graph. NULL is allowed. */
EBB_API void ebb_spec_free(ebb_spec *s);

/* The graph the spec declares, owned by the spec (valid until ebb_spec_free;
 * take a reference by nesting it with ebb_node_graph if it must outlive it).
 * NULL s: NULL. */
EBB_API const ebb_graph *ebb_spec_graph(const ebb_spec *s);
/* The graph name: the `name:` key, else the file name without extension;
 * owned by the spec. NULL s: NULL. */
EBB_API const char *ebb_spec_name(const ebb_spec *s);
/* The FILE used in error messages, owned by the spec. NULL s: NULL. */
EBB_API const char *ebb_spec_file(const ebb_spec *s);
/* The spec's `precision:` (fp32, bf16 or fp16), which ebb_spec_compile()
 * uses where its options leave precision at EBB_PRECISION_DEFAULT; that
 * value when the spec has none. NULL s: EBB_PRECISION_DEFAULT. */
EBB_API ebb_precision ebb_spec_precision(const ebb_spec *s);

/* ---- inputs and their shapes --------------------------------------------- */

/* Number of declared inputs. NULL s: 0. */
EBB_API int ebb_spec_input_count(const ebb_spec *s);
/* The name of input i, owned by the spec. NULL s or i out of range: NULL. */
EBB_API const char *ebb_spec_input_name(const ebb_spec *s, int i);
/* The number of dimensions of input i. NULL s or i out of range: -1. */
EBB_API int ebb_spec_input_ndim(const ebb_spec *s, int i);
/* Dimension d of input i: its size, or -1 for a symbolic dimension, whose
 * name is then stored in *symbol (else *symbol is set to NULL; symbol may be
 * NULL). NULL s, i or d out of range: -1 (and *symbol NULL). */
EBB_API int64_t ebb_spec_input_dim(const ebb_spec *s, int i, int d, const char **symbol);

/* Resolves every input's shape into shapes[0..ebb_spec_input_count-1] (at
 * most `max_shapes`). `bindings` holds n strings "name=size" (size >= 1) for
 * symbolic dimensions; an unbound symbol is 1. Fails with EBB_ERR_ARG for a
 * malformed binding or one naming no symbolic dimension (with the nearest
 * symbol suggested). */
EBB_API ebb_status ebb_spec_resolve_shapes(const ebb_spec *s, const char *const *bindings, int n,
                                   ebb_shape *shapes, int max_shapes);
/* The dtype declared for input i ({shape: [...], dtype: int64}): returns 1
 * and stores it in *dtype (dtype may be NULL), or returns 0 when the spec
 * declares none for it (NULL s or i out of range: 0, *dtype untouched). */
EBB_API int ebb_spec_input_dtype(const ebb_spec *s, int i, ebb_dtype *dtype);

/* ---- training targets and the loss ---------------------------------------- */

/* Number of declared training targets (`targets:`). NULL s: 0. */
EBB_API int ebb_spec_target_count(const ebb_spec *s);
/* The name of target i, owned by the spec. NULL s or i out of range: NULL. */
EBB_API const char *ebb_spec_target_name(const ebb_spec *s, int i);
/* The number of dimensions of target i. NULL s or i out of range: -1. */
EBB_API int ebb_spec_target_ndim(const ebb_spec *s, int i);
/* Dimension d of target i, as ebb_spec_input_dim() gives an input's. */
EBB_API int64_t ebb_spec_target_dim(const ebb_spec *s, int i, int d, const char **symbol);
/* The dtype declared for target i, as ebb_spec_input_dtype() gives an
 * input's: 1 and *dtype, or 0 when the spec declares none. */
EBB_API int ebb_spec_target_dtype(const ebb_spec *s, int i, ebb_dtype *dtype);
/* Resolves every target's shape into shapes[0..ebb_spec_target_count-1], with
 * the binding rules of ebb_spec_resolve_shapes(). Inputs and targets share
 * their symbols: "batch=32" sizes `batch` wherever it appears, and a binding
 * is valid when an input or a target has that symbol. */
EBB_API ebb_status ebb_spec_resolve_target_shapes(const ebb_spec *s, const char *const *bindings,
                                                  int n, ebb_shape *shapes, int max_shapes);

/* ---- params ---------------------------------------------------------------- */

/* Number of entries of the `params:` map, kept in file order. NULL s: 0. */
EBB_API int ebb_spec_param_count(const ebb_spec *s);
/* The name of param i, owned by the spec. NULL s or i out of range: NULL. */
EBB_API const char *ebb_spec_param_name(const ebb_spec *s, int i);
/* The value of param i (after overrides). NULL s or i out of range: 0. */
EBB_API double ebb_spec_param_value(const ebb_spec *s, int i);

/* ---- compiling and locating nodes ----------------------------------------- */

/* ebb_compile() on the spec's graph. With opts NULL or opts->input_shapes
 * NULL, the inputs get the spec's shapes with every symbol 1 (the other
 * options from opts, if given). With opts->input_dtypes NULL, inputs with a
 * declared dtype get it and the others opts->dtype. For a training compile
 * (opts->train) the same holds for targets: target_shapes NULL takes the
 * spec's with every symbol 1, target_dtypes NULL the declared dtypes; the
 * spec's `loss:` is the graph's loss. When the compiler's error names a node
 * of the spec, the message is rewritten to "FILE:LINE:COL: error: KEY.PATH:
 * <compiler message>" pointing at the YAML node that made it (the loss step,
 * node "loss", points at `loss:` unless opts->train names another loss); the
 * status stays the compiler's (EBB_ERR_SHAPE for a shape contradiction). */
EBB_API ebb_status ebb_spec_compile(ebb_plan **out, const ebb_spec *s, const ebb_compile_options *opts);

/* If this thread's last error names a node of the spec (a compile error, or
 * a run error from ebb_run on the spec's plan), rewrites it as "FILE:LINE:COL:
 * error: KEY.PATH: <message>"; otherwise leaves it. Returns `status`, so it
 * wraps a call: st = ebb_spec_annotate_error(s, ebb_run(...)). */
EBB_API ebb_status ebb_spec_annotate_error(const ebb_spec *s, ebb_status status);

/* Finds the YAML position of a graph node path (as in plans and errors, e.g.
 * "flow.4.also.0", or a node's `name`). Returns 1 and fills the non-NULL out
 * arguments (1-based line and column, the key path such as
 * "flow[4].also[0]" or "blocks.ffn[0]", valid while s lives), or returns 0. */
EBB_API int ebb_spec_locate(const ebb_spec *s, const char *node_path, int *line, int *col,
                    const char **key_path);

/* The name a spec gives the node at `node_path` where the path alone does
 * not say it: for a node of a block, the block and its place there
 * ("feedforward[3]", "block[0].also[2]"); NULL for a node of the flow
 * itself (its path reads as the spec does) or one the spec does not have.
 * Valid while the spec lives. Its signature is ebb_node_label_fn's, with
 * the spec as `user`, so the writers take it as it is:
 *     ebb_plan_print_ex(plan, stdout, ebb_spec_node_label, spec); */
EBB_API const char *ebb_spec_node_label(void *spec, const char *node_path);

#ifdef __cplusplus
}
#endif
#endif /* EBB_SPEC_H */
