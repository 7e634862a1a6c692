/* The compiler: graph + input shapes -> plan.
 *
 * ebb_compile() runs the passes, each a file of its own and each plain
 * counting over the step list:
 *   1. lowering (lower.c): the nested flow becomes a flat list of steps over
 *      value slots, every value shaped by a dry run;
 *   2. liveness (liveness.c): the free list of every control-flow edge, then
 *      in-place marking of elementwise steps whose input dies there;
 *   3. memory (predict.c): live bytes after every step and the peak.
 * This file holds the entry points and the helpers that grow the plan. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"
#include "ebb/cpu.h"

/* ---- growing the plan ------------------------------------------------------ */

char *ebb_compiler_strdupf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

int *ebb_compiler_dup_ints(const int *v, int n) {
    if (n == 0)
        return NULL;
    int *d = malloc((size_t)n * sizeof *d);
    if (d)
        memcpy(d, v, (size_t)n * sizeof *d);
    return d;
}

int ebb_compiler_oom(compiler *c) {
    c->status = ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    return -1;
}

/* A new slot whose shape comes from `meta` (ownership passes to the compiler). */
int ebb_compiler_value_new(compiler *c, ebb_tensor *meta, ebb_value_kind kind, int producer,
                     int alias_of) {
    ebb_plan *p = c->plan;
    if (p->n_values == c->cap_values) {
        int cap = c->cap_values ? 2 * c->cap_values : 32;
        ebb_plan_value *v = realloc(p->values, (size_t)cap * sizeof *v);
        if (!v) {
            ebb_tensor_free(meta);
            return ebb_compiler_oom(c);
        }
        p->values = v;
        ebb_tensor **m = realloc(c->meta, (size_t)cap * sizeof *m);
        if (!m) {
            ebb_tensor_free(meta);
            return ebb_compiler_oom(c);
        }
        c->meta = m;
        c->cap_values = cap;
    }
    int slot = p->n_values++;
    ebb_plan_value *v = &p->values[slot];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->producer = producer;
    v->alias_of = alias_of;
    c->meta[slot] = meta;
    if (meta) {
        v->shape = ebb_tensor_shape(meta);
        v->dtype = ebb_tensor_dtype(meta);
        v->nbytes = alias_of >= 0 ? 0 : (int64_t)ebb_tensor_nbytes(meta);
    }
    return slot;
}

plan_step *ebb_compiler_step_new(compiler *c, ebb_step_kind kind, const char *op_name,
                           const char *path) {
    ebb_plan *p = c->plan;
    if (p->n_steps >= EBB_MAX_STEPS) {
        c->status = ebb_error_set(EBB_ERR_BUILD, "ebb_compile: the plan exceeds %d steps",
                                  EBB_MAX_STEPS);
        return NULL;
    }
    if (p->n_steps == c->cap_steps) {
        int cap = c->cap_steps ? 2 * c->cap_steps : 32;
        plan_step *s = realloc(p->steps, (size_t)cap * sizeof *s);
        if (!s) {
            ebb_compiler_oom(c);
            return NULL;
        }
        p->steps = s;
        c->cap_steps = cap;
    }
    plan_step *s = &p->steps[p->n_steps];
    memset(s, 0, sizeof *s);
    s->pub.kind = kind;
    s->pub.op = op_name;
    s->pub.jump = -1;
    s->pub.param = -1;
    s->pub.node = ebb_compiler_strdupf("%s", path);
    if (!s->pub.node) {
        ebb_compiler_oom(c);
        return NULL;
    }
    p->n_steps++;
    return s;
}

int ebb_compiler_step_set_slots(compiler *c, plan_step *s, const int *in, int n_in, const int *out,
                          int n_out) {
    s->pub.in = ebb_compiler_dup_ints(in, n_in);
    s->pub.n_in = n_in;
    s->pub.out = ebb_compiler_dup_ints(out, n_out);
    s->pub.n_out = n_out;
    if ((n_in && !s->pub.in) || (n_out && !s->pub.out))
        return ebb_compiler_oom(c);
    if (n_in > c->plan->max_in)
        c->plan->max_in = n_in;
    return 0;
}

int ebb_compiler_step_index(const compiler *c, const plan_step *s) {
    return (int)(s - c->plan->steps);
}

ebb_tensor *ebb_compiler_meta_ref(compiler *c, int slot) {
    ebb_tensor *t = NULL;
    if (ebb_tensor_ref(&t, c->meta[slot]) != EBB_OK) {
        c->status = ebb_errcode();
        return NULL;
    }
    return t;
}

ebb_tensor *ebb_compiler_meta_new(compiler *c, const ebb_shape *s, ebb_dtype dt) {
    ebb_tensor *t = NULL;
    if (ebb_tensor_empty(&t, s, dt, c->meta_device) != EBB_OK) {
        c->status = ebb_errcode();
        return NULL;
    }
    return t;
}

/* ---- entry points --------------------------------------------------------- */

void ebb_plan_free(ebb_plan *p) {
    if (!p)
        return;
    for (int i = 0; i < p->n_steps; i++) {
        plan_step *s = &p->steps[i];
        free((char *)s->pub.node);
        free((int *)s->pub.in);
        free((int *)s->pub.out);
        free((int *)s->pub.frees);
        free((int *)s->pub.jump_frees);
        free(s->op_owned);
        free(s->owners);
    }
    free(p->steps);
    free(p->values);
    free(p->inputs);
    free(p->outputs);
    free(p->output_names);
    free(p->trained);
    free(p->deferred);
    free(p->no_decay);
    free(p->out_param);
    free(p->owner);
    for (int i = 0; i < p->n_params; i++) {
        free(p->params[i].full_name);
        free(p->params[i].node);
        for (int k = 0; k < p->params[i].n_aliases; k++)
            free(p->params[i].aliases[k]);
        free(p->params[i].aliases);
    }
    free(p->params);
    while (p->attrs) {
        attr_block *next = ((attr_block *)p->attrs)->next;
        free(p->attrs);
        p->attrs = next;
    }
    free(p->name);
    ebb_graph_free(p->graph);
    free(p);
}

/* What clipping by norm or loss scaling costs, since the updates wait for
 * the whole backward: the same step compiled without either, its updates
 * placed as they would be then, under the same budget. */
static ebb_status unclipped_peak(ebb_plan *p, const ebb_graph *g, const ebb_compile_options *opts) {
    ebb_train_options t = *opts->train;
    ebb_compile_options o = *opts;
    t.clip_grad_norm = 0;
    t.loss_scaling = 0;
    o.train = &t;
    ebb_plan *q = NULL;
    ebb_status st = ebb_compile_once(&q, g, &o, NULL, 0);
    if (st == EBB_OK && o.memory_budget != 0)
        st = ebb_remat_fit(&q, g, &o);
    else if (st == EBB_OK && q->updates_in_backward)
        st = ebb_place_updates(&q, g, &o);
    if (st == EBB_OK)
        p->unclipped_peak_bytes = q->budget_peak_bytes;
    ebb_plan_free(q);
    return st;
}

ebb_status ebb_compile(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: out is NULL");
    *out = NULL;
    if (!g || !opts)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: graph and options are required");
    if (g->is_subflow)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: '%s' is a sub-flow; compile the flow that "
                                          "uses it",
                             g->name);
    if (opts->n_input_shapes != g->inputs.n || (g->inputs.n && !opts->input_shapes))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: graph '%s' has %d input(s), %d shape(s) given", g->name,
                             g->inputs.n, opts->n_input_shapes);
    if (opts->memory_budget < 0 && opts->memory_budget != EBB_MEMORY_BUDGET_LEAST)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: memory_budget is %lld; give bytes, 0 for none or "
                             "EBB_MEMORY_BUDGET_LEAST",
                             (long long)opts->memory_budget);
    if ((unsigned)opts->precision > EBB_PRECISION_FP16)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: precision is %d; use an ebb_precision",
                             (int)opts->precision);
    int low = opts->precision == EBB_PRECISION_BF16 || opts->precision == EBB_PRECISION_FP16;
    if (opts->dtype != EBB_FLOAT32 && ebb_graph_has_precision(g))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: graph '%s' sets a node's precision, which is for a "
                             "float32 plan; this one is %s",
                             g->name, ebb_dtype_name(opts->dtype));
    if (low && opts->dtype != EBB_FLOAT32)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_compile: precision %s is for a float32 plan; this one is %s",
                             ebb_precision_name(opts->precision), ebb_dtype_name(opts->dtype));
    if (opts->train && (unsigned)opts->train->low_weight_copies > EBB_LOW_COPIES_RECAST)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: low_weight_copies is %d; use an "
                                          "ebb_low_copies",
                             (int)opts->train->low_weight_copies);
    if (opts->train && opts->train->low_weight_copies == EBB_LOW_COPIES_KEEP &&
        opts->memory_budget != 0)
        return ebb_error_set(EBB_ERR_ARG, "ebb_compile: low_weight_copies KEEP with a memory "
                                          "budget: a budget recomputes rather than keeps, so "
                                          "its backward casts every copy again");
    ebb_status st = ebb_init();
    if (st != EBB_OK)
        return st;
    ebb_cpu_info ci;
    if (opts->precision == EBB_PRECISION_BF16 && opts->device.type == EBB_DEVICE_CPU &&
        ebb_cpu_info_get(&ci) == EBB_OK && !ci.bf16_usable)
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "ebb_compile: graph '%s' in bf16 on the CPU: libtorch %s hands "
                             "bfloat16 to oneDNN by the CPU's own flags, and oneDNN, capped at "
                             "%s (ONEDNN_MAX_CPU_ISA), refuses it; unset the cap, or use "
                             "libtorch 2.x",
                             g->name, ebb_torch_version(), ci.onednn);
    ebb_plan *p = NULL;
    st = ebb_compile_once(&p, g, opts, NULL, 0);
    if (st == EBB_OK && opts->memory_budget != 0)
        st = ebb_remat_fit(&p, g, opts);
    else if (st == EBB_OK && p->updates_in_backward)
        st = ebb_place_updates(&p, g, opts);
    if (st == EBB_OK)
        st = ebb_keep_low_copies(&p, g, opts);
    if (st == EBB_OK && (p->clip_grad_norm > 0 || p->loss_scaling))
        st = unclipped_peak(p, g, opts);
    if (st != EBB_OK) {
        ebb_plan_free(p);
        p = NULL;
    }
    *out = p;
    return st;
}

ebb_status ebb_compile_once(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts,
                            const unsigned char *drop, int n_drop) {
    return ebb_compile_placed(out, g, opts, drop, n_drop, NULL);
}

static ebb_status compile_chosen(ebb_plan **out, const ebb_graph *g,
                                 const ebb_compile_options *opts, const unsigned char *drop,
                                 int n_drop, const unsigned char *defer, const unsigned char *keep,
                                 int n_keep);

ebb_status ebb_compile_placed(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts,
                              const unsigned char *drop, int n_drop, const unsigned char *defer) {
    return compile_chosen(out, g, opts, drop, n_drop, defer, NULL, 0);
}

ebb_status ebb_compile_kept(ebb_plan **out, const ebb_graph *g, const ebb_compile_options *opts,
                            const unsigned char *defer, const unsigned char *keep, int n_keep) {
    return compile_chosen(out, g, opts, NULL, 0, defer, keep, n_keep);
}

/* One compile with every choice the searches make given: values dropped
 * for recomputation, updates deferred, low copies kept. */
static ebb_status compile_chosen(ebb_plan **out, const ebb_graph *g,
                                 const ebb_compile_options *opts, const unsigned char *drop,
                                 int n_drop, const unsigned char *defer, const unsigned char *keep,
                                 int n_keep) {
    ebb_status st = EBB_OK;
    *out = NULL;
    int low_plan = opts->precision == EBB_PRECISION_BF16 || opts->precision == EBB_PRECISION_FP16;
    compiler c = {.meta_device = {EBB_DEVICE_META, 0}, .training = opts->train != NULL,
                  /* a node's own precision needs the casts a mixed plan has */
                  .autocast = low_plan || ebb_graph_has_precision(g), .full = !low_plan,
                  .low = opts->precision == EBB_PRECISION_FP16 ? EBB_FLOAT16 : EBB_BFLOAT16,
                  .drop = drop, .n_drop = drop ? n_drop : 0, .defer = defer,
                  .keep = keep, .n_keep = keep ? n_keep : 0};
    ebb_plan *p = calloc(1, sizeof *p);
    if (!p)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_compile: out of memory");
    static atomic_uint_fast64_t next_plan_id = 1;
    c.plan = p;
    p->id = atomic_fetch_add(&next_plan_id, 1);
    p->graph = (ebb_graph *)g;
    atomic_fetch_add(&p->graph->refs, 1);
    p->keep_all = opts->keep_all;
    p->dtype = opts->dtype;
    p->peak_step = -1;
    p->name = malloc(strlen(g->name) + 1);
    p->inputs = calloc((size_t)g->inputs.n + 1, sizeof *p->inputs);
    p->n_outputs = 1 + g->outputs.n;
    p->outputs = calloc((size_t)p->n_outputs, sizeof *p->outputs);
    p->output_names = calloc((size_t)p->n_outputs, sizeof *p->output_names);
    if (!p->name || !p->inputs || !p->outputs || !p->output_names) {
        ebb_compiler_oom(&c);
        goto fail;
    }
    strcpy(p->name, g->name);

    if (ebb_pass_lower(&c, g, opts) != 0)
        goto fail;
    if (opts->train && ebb_pass_autodiff(&c, g, opts) != 0)
        goto fail;
    if (opts->device.type == EBB_DEVICE_CUDA && ebb_pass_measure(&c, opts->device) != 0)
        goto fail;
    /* a matrix product in a low dtype has no CPU figure but its own: mixed
     * precision measures on the CPU whatever measure_scratch says */
    int low_kernels = 0;
    for (int i = 0; i < p->n_steps; i++)
        low_kernels |= p->steps[i].low_kernel;
    if ((opts->measure_scratch || low_plan || low_kernels) &&
        ebb_pass_measure(&c, ebb_device_cpu()) != 0)
        goto fail;
    /* routing and while/until loops depend on values; some kernels' scratch
     * depends on the machine */
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        int bound_scratch = s->low_kernel ||
                            (s->pub.kind == EBB_STEP_BACKWARD ? s->op->grad->workspace_is_bound
                                                              : s->op && s->op->workspace_is_bound);
        p->peak_is_bound |= s->pub.kind == EBB_STEP_ROUTE || s->pub.kind == EBB_STEP_JUMP_IF ||
                            (bound_scratch && s->workspace > 0);
        int bound_cuda = s->pub.kind == EBB_STEP_BACKWARD ? s->op->grad->workspace_cuda_is_bound
                         : s->pub.kind == EBB_STEP_OP
                             ? s->op->workspace_cuda_is_bound ||
                                   (p->training && s->op->grad &&
                                    s->op->grad->workspace_cuda_is_bound)
                             : 0;
        bound_cuda |= s->low_kernel;
        p->cuda_peak_is_bound |= bound_cuda && s->has_workspace_cuda && s->workspace_cuda > 0;
    }
    p->cuda_peak_is_bound |= p->peak_is_bound;
    if (ebb_pass_liveness(&c) != 0)
        goto fail;
    /* keep_all is the figure without liveness, so without in-place steps too */
    p->keep_all_peak_bytes = ebb_pass_predict(&c, 1, 0, NULL);
    ebb_pass_in_place(&c);
    p->peak_bytes = ebb_pass_predict(&c, 0, 0, &p->peak_step);
    /* CUDA's caching allocator counts blocks rounded up to 512 bytes */
    p->cuda_peak_bytes = ebb_pass_predict(&c, p->keep_all, 512, NULL);
    if (p->peak_bytes < 0 || p->keep_all_peak_bytes < 0 || p->cuda_peak_bytes < 0)
        goto fail;
    p->budget_peak_bytes = p->cuda_peak_bytes > p->peak_bytes ? p->cuda_peak_bytes : p->peak_bytes;
    p->no_recompute_peak_bytes = p->budget_peak_bytes;
    /* loss scaling: a step whose gradients overflow skips its updates, so
     * where the peak is among them, that step stays below it */
    for (int i = 0, after = 0; i < p->n_steps; i++) {
        const plan_step *s = &p->steps[i];
        if (after && (s->pub.peak_bytes >= p->peak_bytes || s->cuda_peak_bytes >= p->cuda_peak_bytes)) {
            p->peak_is_bound = p->cuda_peak_is_bound = 1;
            break;
        }
        after |= s->pub.kind == EBB_STEP_UNSCALE;
    }
    for (int i = 0; i < p->n_steps; i++) {
        int64_t fl = ebb_step_flops(p, &p->steps[i]);
        *(p->steps[i].pub.recompute ? &p->recompute_flops : &p->flops) += fl;
    }
    p->attrs = c.attrs;
    for (int v = 0; v < p->n_values; v++)
        ebb_tensor_free(c.meta[v]);
    free(c.meta);
    *out = p;
    return EBB_OK;

fail:
    st = c.status != EBB_OK ? c.status : (ebb_errcode() != EBB_OK ? ebb_errcode() : EBB_ERR_BUILD);
    p->attrs = c.attrs;
    for (int v = 0; v < p->n_values; v++)
        ebb_tensor_free(c.meta[v]);
    free(c.meta);
    ebb_plan_free(p);
    return st;
}

/* ---- mixed precision ---------------------------------------------------------- */

ebb_status ebb_precision_parse(ebb_precision *out, const char *name) {
    static const struct {
        const char *name;
        ebb_precision p;
    } names[] = {{"fp32", EBB_PRECISION_FP32}, {"float32", EBB_PRECISION_FP32},
                 {"bf16", EBB_PRECISION_BF16}, {"bfloat16", EBB_PRECISION_BF16},
                 {"fp16", EBB_PRECISION_FP16}, {"float16", EBB_PRECISION_FP16}};
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_precision_parse: out is NULL");
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].p;
            return EBB_OK;
        }
    return ebb_error_set(EBB_ERR_ARG, "precision '%s' is not fp32, bf16 or fp16",
                         name ? name : "(null)");
}

const char *ebb_precision_name(ebb_precision p) {
    switch (p) {
    case EBB_PRECISION_BF16: return "bf16";
    case EBB_PRECISION_FP16: return "fp16";
    default: return "fp32";
    }
}
