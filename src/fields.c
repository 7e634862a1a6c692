/* What the trainer feeds its plans: the spec's fields (inputs, then
 * targets), batch shapes, the training and inference plans compiled for
 * them, the data opened against them and batches made from it. */
#define _GNU_SOURCE /* strdup, clock_gettime */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "training.h"

/* ---- the spec's fields ----------------------------------------------------- */

ebb_status ebb_fields_init(fields *f, const ebb_spec *spec, const char *loss, int64_t block) {
    memset(f, 0, sizeof *f);
    f->spec = spec;
    f->block = block;
    f->n_in = ebb_spec_input_count(spec);
    f->n_tg = ebb_spec_target_count(spec);
    if (f->n_tg == 0)
        return ebb_error_set(EBB_ERR_SPEC,
                             "%s declares no `targets:`; training and evaluation compare the "
                             "output with them (see docs/spec-format.md)",
                             ebb_spec_file(spec));
    if (f->n_in + f->n_tg > MAX_FIELDS)
        return ebb_error_set(EBB_ERR_SPEC, "%s has more than %d inputs and targets",
                             ebb_spec_file(spec), MAX_FIELDS);
    for (int i = 0; i < f->n_in; i++) {
        f->names[i] = ebb_spec_input_name(spec, i);
        if (!ebb_spec_input_dtype(spec, i, &f->dtypes[i])) f->dtypes[i] = EBB_FLOAT32;
    }
    for (int i = 0; i < f->n_tg; i++) {
        f->names[f->n_in + i] = ebb_spec_target_name(spec, i);
        if (!ebb_spec_target_dtype(spec, i, &f->dtypes[f->n_in + i]))
            f->dtypes[f->n_in + i] = EBB_FLOAT32;
    }
    f->n = f->n_in + f->n_tg;
    f->loss = loss ? loss : ebb_graph_loss(ebb_spec_graph(spec));
    if (!f->loss) return ebb_error_set(EBB_ERR_SPEC, "%s declares no `loss:`", ebb_spec_file(spec));
    const ebb_op *op = ebb_op_find(f->loss); /* a loss of class targets counts accuracy */
    f->classify = op && op->indices == EBB_INDICES_CLASSES;
    return EBB_OK;
}

/* Adds "sym=size" to the bindings unless sym is bound already. */
static void bind_symbol(const char *sym, int64_t size, const char **bind, char (*buf)[96],
                        int *nb) {
    for (int k = 0; k < *nb; k++)
        if (!strncmp(buf[k], sym, strlen(sym)) && buf[k][strlen(sym)] == '=') return;
    if (*nb == 2 * MAX_FIELDS) return;
    snprintf(buf[*nb], sizeof buf[*nb], "%s=%lld", sym, (long long)size);
    bind[*nb] = buf[*nb];
    (*nb)++;
}

/* Shapes for a batch of B: every input's symbolic first dimension bound to
 * B, and with a block, every symbolic second dimension (a sequence) to it;
 * the targets share the symbols (tg NULL: the inputs only). */
static ebb_status batch_shapes(const fields *f, int64_t batch, ebb_shape *in, ebb_shape *tg) {
    const char *bind[2 * MAX_FIELDS];
    char buf[2 * MAX_FIELDS][96];
    int nb = 0;
    for (int i = 0; i < f->n_in; i++) {
        const char *sym = NULL;
        if (ebb_spec_input_ndim(f->spec, i) > 0 && ebb_spec_input_dim(f->spec, i, 0, &sym) < 0 &&
            sym)
            bind_symbol(sym, batch, bind, buf, &nb);
    }
    for (int i = 0; f->block > 0 && i < f->n_in; i++) {
        const char *sym = NULL;
        if (ebb_spec_input_ndim(f->spec, i) > 1 && ebb_spec_input_dim(f->spec, i, 1, &sym) < 0 &&
            sym)
            bind_symbol(sym, f->block, bind, buf, &nb);
    }
    ebb_status st = ebb_spec_resolve_shapes(f->spec, bind, nb, in, MAX_FIELDS);
    if (st == EBB_OK && tg) st = ebb_spec_resolve_target_shapes(f->spec, bind, nb, tg, MAX_FIELDS);
    if (st != EBB_OK) return st;
    for (int i = 0; i < f->n_in + (tg ? f->n_tg : 0); i++) {
        const ebb_shape *s = i < f->n_in ? &in[i] : &tg[i - f->n_in];
        if (s->ndim < 1 || s->dim[0] != batch)
            return ebb_error_set(EBB_ERR_SPEC,
                                 "%s: '%s' has no symbolic first dimension (the batch) that "
                                 "--batch %lld can set",
                                 ebb_spec_file(f->spec), f->names[i], (long long)batch);
    }
    return EBB_OK;
}

int ebb_fields_per_token(const fields *f, const ebb_plan *infer) {
    if (!f->classify || !infer || ebb_plan_output_count(infer) < 1) return 0;
    return ebb_plan_value_at(infer, ebb_plan_output_slot(infer, 0))->shape.ndim > 2;
}

ebb_status ebb_fields_check_block(const fields *f) {
    if (f->block <= 0) return EBB_OK;
    const char *sym = NULL;
    int nd = ebb_spec_input_ndim(f->spec, 0);
    int64_t d = nd >= 2 ? ebb_spec_input_dim(f->spec, 0, 1, &sym) : -1;
    if (nd < 2)
        return ebb_error_set(EBB_ERR_ARG,
                             "--block %lld sizes a sequence, the input's second dimension, but "
                             "%s's input '%s' has %d dimension%s",
                             (long long)f->block, ebb_spec_file(f->spec), f->names[0], nd,
                             nd == 1 ? "" : "s");
    if (d >= 0 && d != f->block)
        return ebb_error_set(EBB_ERR_ARG,
                             "--block %lld: %s's input '%s' has %lld as its second dimension, "
                             "fixed in the spec (when a params: value gives it, -p sets it)",
                             (long long)f->block, ebb_spec_file(f->spec), f->names[0],
                             (long long)d);
    return EBB_OK;
}

/* Text and token data (ebb/data.h) give one input and one target of
 * tokens, in windows as long as the input's second dimension. */
static ebb_status check_text_spec(const fields *f, const char *desc) {
    if (strncmp(desc, "text:", 5) && strncmp(desc, "tokens:", 7)) return EBB_OK;
    if (f->n_in != 1 || f->n_tg != 1)
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': text and token data feed one input and one target "
                             "(the next token), but %s has %d input%s and %d target%s",
                             desc, ebb_spec_file(f->spec), f->n_in, f->n_in == 1 ? "" : "s",
                             f->n_tg, f->n_tg == 1 ? "" : "s");
    for (int i = 0; i < 2; i++)
        if (f->dtypes[i] != EBB_INT64 && f->dtypes[i] != EBB_INT32)
            return ebb_error_set(EBB_ERR_ARG,
                                 "dataset '%s': text and token data give tokens, but %s's %s '%s' "
                                 "is %s: declare it {shape: [batch, T], dtype: int64}",
                                 desc, ebb_spec_file(f->spec), i ? "target" : "input",
                                 f->names[i], ebb_dtype_name(f->dtypes[i]));
    const char *sym = NULL;
    if (!f->block && ebb_spec_input_ndim(f->spec, 0) >= 2 &&
        ebb_spec_input_dim(f->spec, 0, 1, &sym) < 0 && sym)
        return ebb_error_set(EBB_ERR_ARG,
                             "--block N is needed: %s's input '%s' has the symbol '%s' as its "
                             "second dimension, the length of the windows cut from '%s'",
                             ebb_spec_file(f->spec), f->names[0], sym, desc);
    return EBB_OK;
}

/* The trainer's parallel options as a rank's plan takes them: world and
 * rank from dist. */
static ebb_parallel_options parallel_of(const ebb_trainer_options *o) {
    ebb_parallel_options par = o->parallel;
    int zero = ebb_zero_sharded(o);
    par.world = o->dist ? ebb_dist_world_size(o->dist) : 0;
    par.zero = zero;
    par.rank = zero ? ebb_dist_rank(o->dist) : 0;
    return par;
}

/* The parameters trained: those of the inference plan `infer` that no
 * freeze pattern matches, into names (n of them; borrowed from infer). */
static ebb_status trained_names(const ebb_trainer_options *o, const ebb_plan *infer,
                                const char **names, int *n) {
    int np = ebb_plan_param_count(infer);
    *n = 0;
    for (int k = 0; k < o->n_freeze; k++) {
        int hits = 0;
        for (int i = 0; i < np; i++) {
            const char *full = NULL;
            ebb_plan_param_at(infer, i, &full);
            hits += full && fnmatch(o->freeze[k], full, 0) == 0;
        }
        if (!hits)
            return ebb_error_set(EBB_ERR_ARG, "--freeze '%s' matches no parameter of the spec",
                                 o->freeze[k]);
    }
    for (int i = 0; i < np; i++) {
        const char *full = NULL;
        const ebb_param_spec *ps = ebb_plan_param_at(infer, i, &full);
        int frozen = !full || (ps && ps->buffer);
        for (int k = 0; !frozen && k < o->n_freeze; k++)
            frozen = fnmatch(o->freeze[k], full, 0) == 0;
        if (!frozen) names[(*n)++] = full;
    }
    if (*n == 0)
        return ebb_error_set(EBB_ERR_ARG, "--freeze leaves no parameter to train");
    return EBB_OK;
}

double ebb_fields_scaling(const fields *f, const ebb_trainer_options *o) {
    if (o->loss_scale != 0)
        return o->loss_scale > 0 ? o->loss_scale : 0;
    ebb_precision p = o->precision ? o->precision : ebb_spec_precision(f->spec);
    return p == EBB_PRECISION_FP16 ? 65536.0 : 0;
}

ebb_status ebb_fields_compile_plan(const fields *f, int64_t batch, const ebb_trainer_options *o,
                                   const ebb_optimizer_options *optim, const ebb_plan *infer,
                                   ebb_plan **out) {
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS];
    ebb_status st = batch_shapes(f, batch, in, optim ? tg : NULL);
    if (st != EBB_OK) return st;
    ebb_train_options to = {0};
    ebb_compile_options co = {.input_shapes = in, .n_input_shapes = f->n_in,
                              .device = o->device,
                              .measure_scratch = o->device.type == EBB_DEVICE_CPU,
                              .precision = o->precision};
    const char **trained = NULL;
    int n_trained = 0;
    if (optim && o->n_freeze > 0) {
        if (!(trained = malloc(sizeof *trained * ((size_t)ebb_plan_param_count(infer) + 1))))
            return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
        if ((st = trained_names(o, infer, trained, &n_trained)) != EBB_OK) {
            free(trained);
            return st;
        }
    }
    if (optim) {
        to = (ebb_train_options){.target_shapes = tg,
                                 .n_target_shapes = f->n_tg,
                                 .target_dtypes = f->dtypes + f->n_in,
                                 .optimizer = *optim,
                                 .loss = o->loss,
                                 .clip_grad_norm = o->clip_grad_norm,
                                 .clip_grad_value = o->clip_grad_value,
                                 .trained = trained,
                                 .n_trained = n_trained,
                                 .no_decay = o->no_decay,
                                 .n_no_decay = o->n_no_decay,
                                 .accumulate = o->accumulate,
                                 .loss_scaling = ebb_fields_scaling(f, o) > 0,
                                 .parallel = parallel_of(o),
                                 .low_weight_copies = o->low_weight_copies};
        co.train = &to;
        co.memory_budget = o->memory_budget;
    }
    st = ebb_spec_compile(out, f->spec, &co);
    free(trained);
    return st;
}

ebb_status ebb_fields_open_data(const fields *f, const ebb_trainer_options *o, const char *desc,
                                const ebb_plan *infer, ebb_dataset **out) {
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS], want[MAX_FIELDS];
    ebb_status st = batch_shapes(f, 1, in, tg);
    if (st != EBB_OK) return st;
    for (int i = 0; i < f->n; i++)
        want[i] = i < f->n_in ? in[i] : tg[i - f->n_in];
    ebb_dataset_expect expect = {.shapes = want, .n_shapes = f->n};
    if ((st = check_text_spec(f, desc)) != EBB_OK) return st;
    ebb_fit fit = {.available_bytes = -1};
    if (ebb_plan_check_fits(infer, ebb_device_cpu(), NULL, 0, &fit) != EBB_OK)
        ebb_error_clear(); /* the plan's own fit is checked where it runs */
    if (fit.available_bytes > 0) expect.max_bytes = fit.available_bytes;
    st = ebb_dataset_open_ex(out, desc, f->names, f->n, &expect);
    for (int i = 0; st == EBB_OK && o->normalize && i < f->n_in; i++)
        st = ebb_dataset_set_normalize(*out, i, o->norm_mean, o->norm_std);
    if (st == EBB_OK && f->classify && ebb_plan_output_count(infer) > 0) {
        const ebb_plan_value *v = ebb_plan_value_at(infer, ebb_plan_output_slot(infer, 0));
        if (v->shape.ndim >= 1)
            st = ebb_dataset_check_classes(*out, f->n_in, v->shape.dim[v->shape.ndim - 1]);
    }
    if (st == EBB_OK && ebb_dataset_size(*out) == 0)
        st = ebb_error_set(EBB_ERR_ARG, "dataset '%s' has no samples", desc);
    if (st != EBB_OK) {
        ebb_dataset_free(*out);
        *out = NULL;
    }
    return st;
}

void ebb_tensors_free(ebb_tensor **ts, int n) {
    for (int i = 0; i < n; i++) {
        ebb_tensor_free(ts[i]);
        ts[i] = NULL;
    }
}

ebb_status ebb_fields_make_batch(const fields *f, const ebb_dataset *d, const int64_t *index,
                                 int64_t count, ebb_device dev, ebb_tensor **ts) {
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS];
    ebb_status st = batch_shapes(f, count, in, tg);
    for (int i = 0; st == EBB_OK && i < f->n; i++)
        st = ebb_dataset_batch(&ts[i], d, i, index, count, i < f->n_in ? &in[i] : &tg[i - f->n_in],
                               f->dtypes[i], dev);
    if (st != EBB_OK) ebb_tensors_free(ts, f->n);
    return st;
}

double ebb_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *ebb_host_copy(const ebb_tensor *t, ebb_dtype dt, size_t elem) {
    ebb_tensor *h = NULL;
    size_t n = (size_t)ebb_tensor_numel(t);
    void *buf = NULL;
    ebb_status st = ebb_tensor_to(&h, t, ebb_device_cpu(), dt);
    if (st == EBB_OK && !(buf = malloc(n * elem + 1))) ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (buf && ebb_tensor_to_host(h, buf, n * elem) != EBB_OK) {
        free(buf);
        buf = NULL;
    }
    ebb_tensor_free(h);
    return buf;
}
