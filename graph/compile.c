/* The compiler's entry point: graph + input shapes -> plan.
 *
 * ebb_compile() checks the options, runs the pipeline once (pipeline.c)
 * keeping every value, then the searches that change its choices: under a
 * memory budget, recomputation (remat.c); else the updates' placement
 * (placement.c); under mixed precision, which low copies are kept
 * (copies.c). With clipping by the norm or loss scaling it also compiles
 * the step without them, for the figure of what they cost. */
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"
#include "ebb/cpu.h"

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
    ebb_status st = ebb_pipeline(&q, g, &o, NULL);
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
    if (opts->precision == EBB_PRECISION_FP16 && opts->device.type == EBB_DEVICE_CPU &&
        ebb_cpu_info_get(&ci) == EBB_OK && !ci.fp16_usable)
        return ebb_error_set(EBB_ERR_UNSUPPORTED,
                             "ebb_compile: graph '%s' in fp16 on the CPU: libtorch %s has no "
                             "float16 matrix product on the CPU; use bf16, libtorch 2.x, or a "
                             "CUDA device",
                             g->name, ebb_torch_version());
    ebb_plan *p = NULL;
    st = ebb_pipeline(&p, g, opts, NULL);
    if (st == EBB_OK && opts->memory_budget != 0)
        st = ebb_remat_fit(&p, g, opts);
    else if (st == EBB_OK && p->updates_in_backward)
        st = ebb_place_updates(&p, g, opts);
    if (st == EBB_OK)
        st = ebb_keep_low_copies(&p, g, opts);
    if (st == EBB_OK && (p->train_options.clip_grad_norm > 0 || p->train_options.loss_scaling))
        st = unclipped_peak(p, g, opts);
    if (st != EBB_OK) {
        ebb_plan_free(p);
        p = NULL;
    }
    *out = p;
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
