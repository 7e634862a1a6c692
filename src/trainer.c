/* The trainer (include/ebb/trainer.h): a spec trained on a dataset with its
 * training plan, evaluated with its inference plan, checkpointed and
 * resumed. `ebb train` and `ebb eval` (src/cli/train.c) parse flags and
 * print; everything they run is here.
 *
 * Training never loses work: a step whose loss is not finite fails the run
 * before anything is written (or, with skip_nonfinite, is undone and
 * counted); no checkpoint or weights file is written with NaN or Inf in it.
 *
 * Layout: the spec's fields and batch shapes; metrics and evaluation; what a
 * checkpoint holds (a `state`: every parameter and its optimizer slots);
 * checkpoints; then the trainer's phases: open, step, epoch end, run. */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ebb/data.h"
#include "ebb/memory.h"
#include "ebb/safetensors.h"
#include "ebb/trainer.h"
#include "run_internal.h"

#define MAX_FIELDS 64
/* the optimizer's state slots (ebb_optimizer_state_slot) */
#define N_SLOTS 8
#define PER_PARAM (1 + N_SLOTS) /* a parameter, then its optimizer state slots */
#define slot_name(k) ebb_optimizer_state_slot(NULL, (k))

/* ---- the spec's fields ----------------------------------------------------- */

/* What a sample is: the spec's inputs, then its targets, and its loss. */
typedef struct fields {
    const ebb_spec *spec;
    int n_in, n_tg, n;
    const char *names[MAX_FIELDS];
    ebb_dtype dtypes[MAX_FIELDS];
    const char *loss; /* the spec's loss op, or the options' */
    int classify;     /* cross_entropy or nll: predictions are counted */
    int64_t block;    /* > 0: the size of the inputs' and targets' second dimension */
} fields;

static ebb_status fields_init(fields *f, const ebb_spec *spec, const char *loss, int64_t block) {
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

/* The loss is per token: a classifier's scores [B, T, V] against [B, T]
 * (a language model), whose mean loss exponentiated is its perplexity. */
static int per_token(const fields *f, const ebb_plan *infer) {
    if (!f->classify || !infer || ebb_plan_output_count(infer) < 1) return 0;
    return ebb_plan_value_at(infer, ebb_plan_output_slot(infer, 0))->shape.ndim > 2;
}

/* The block sizes the first input's second dimension: a symbol it binds, or
 * a size the spec fixed, which it must equal. */
static ebb_status check_block(const fields *f) {
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

/* Text data (ebb/data.h) gives one input and one target of byte tokens, in
 * windows as long as the input's second dimension. */
static ebb_status check_text_spec(const fields *f, const char *desc) {
    if (strncmp(desc, "text:", 5)) return EBB_OK;
    if (f->n_in != 1 || f->n_tg != 1)
        return ebb_error_set(EBB_ERR_ARG,
                             "dataset '%s': text data feeds one input and one target (the next "
                             "byte), but %s has %d input%s and %d target%s",
                             desc, ebb_spec_file(f->spec), f->n_in, f->n_in == 1 ? "" : "s",
                             f->n_tg, f->n_tg == 1 ? "" : "s");
    for (int i = 0; i < 2; i++)
        if (f->dtypes[i] != EBB_INT64 && f->dtypes[i] != EBB_INT32)
            return ebb_error_set(EBB_ERR_ARG,
                                 "dataset '%s': text data gives byte tokens, but %s's %s '%s' is "
                                 "%s: declare it {shape: [batch, T], dtype: int64}",
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

/* Loss scaling's first scale for options o (ebb_trainer_options.loss_scale);
 * 0: none. */
static double scaling_from(const fields *f, const ebb_trainer_options *o) {
    if (o->loss_scale != 0)
        return o->loss_scale > 0 ? o->loss_scale : 0;
    ebb_precision p = o->precision ? o->precision : ebb_spec_precision(f->spec);
    return p == EBB_PRECISION_FP16 ? 65536.0 : 0;
}

/* ZeRO-1 shards the optimizer when there are ranks to shard it over. */
static int zero_sharded(const ebb_trainer_options *o) {
    return o->zero && o->dist && ebb_dist_world_size(o->dist) > 1;
}

/* The training plan when `optim` is given (with o's loss, clipping, frozen
 * parameters and memory budget), else the inference plan. */
static ebb_status compile_plan(const fields *f, int64_t batch, const ebb_trainer_options *o,
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
                                 /* accumulation: the gradients, then one update */
                                 .grads_only = o->accumulate > 1,
                                 .loss_scaling = scaling_from(f, o) > 0 && o->accumulate <= 1,
                                 /* data parallel: buckets averaged in the backward (the
                                  * trainer averages accumulated sums itself; under
                                  * ZeRO-1 that plan still names each one's owner) */
                                 .data_parallel =
                                     o->dist && (o->accumulate <= 1 || zero_sharded(o))
                                         ? ebb_dist_world_size(o->dist)
                                         : 0,
                                 .allreduce_bucket_bytes = o->allreduce_bucket_bytes,
                                 .zero = zero_sharded(o),
                                 .allreduce_overlap = o->allreduce_overlap,
                                 .rank = zero_sharded(o) ? ebb_dist_rank(o->dist) : 0,
                                 .low_weight_copies = o->low_weight_copies};
        co.train = &to;
        co.memory_budget = o->memory_budget;
    }
    st = ebb_spec_compile(out, f->spec, &co);
    free(trained);
    return st;
}

/* A dataset for the spec: its shapes checked against the files' headers
 * before any data is read (a file of the wrong shape costs its header, not
 * its size), and no more data than this process can still get. */
static ebb_status open_data(const fields *f, const ebb_trainer_options *o, const char *desc,
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

static void free_tensors(ebb_tensor **ts, int n) {
    for (int i = 0; i < n; i++) {
        ebb_tensor_free(ts[i]);
        ts[i] = NULL;
    }
}

/* Field tensors for samples index[0..count). */
static ebb_status make_batch(const fields *f, const ebb_dataset *d, const int64_t *index,
                             int64_t count, ebb_device dev, ebb_tensor **ts) {
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS];
    ebb_status st = batch_shapes(f, count, in, tg);
    for (int i = 0; st == EBB_OK && i < f->n; i++)
        st = ebb_dataset_batch(&ts[i], d, i, index, count, i < f->n_in ? &in[i] : &tg[i - f->n_in],
                               f->dtypes[i], dev);
    if (st != EBB_OK) free_tensors(ts, f->n);
    return st;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- metrics ----------------------------------------------------------------- */

double ebb_metrics_class_accuracy(const ebb_metrics *m, int64_t c) {
    if (!m || !m->confusion || c < 0 || c >= m->classes) return NAN;
    int64_t row = 0;
    for (int64_t k = 0; k < m->classes; k++)
        row += m->confusion[c * m->classes + k];
    return row ? (double)m->confusion[c * m->classes + c] / (double)row : NAN;
}

void ebb_metrics_free(ebb_metrics *m) {
    if (!m) return;
    free(m->confusion);
    memset(m, 0, sizeof *m);
}

/* "accuracy 0.3512 top-5 0.7012 loss 2.4563 perplexity 11.66 on 38 samples
 * (2432 tokens)": an evaluation's line, as ebb eval and the epoch lines
 * print it. */
static void metrics_line(const ebb_metrics *m, FILE *f) {
    if (m->classes) fprintf(f, "accuracy %.4f ", m->accuracy);
    if (m->classes && m->top_k) fprintf(f, "top-%d %.4f ", m->top_k, m->top_k_accuracy);
    fprintf(f, "loss %.4f", m->loss);
    int ppl = isfinite(m->perplexity) && m->perplexity > 0;
    if (ppl)
        fprintf(f, m->perplexity < 1e4 ? " perplexity %.2f" : " perplexity %.4g", m->perplexity);
    fprintf(f, " on %lld samples", (long long)m->samples);
    if (ppl) fprintf(f, " (%lld tokens)", (long long)m->predictions);
    fputc('\n', f);
}

void ebb_metrics_print(const ebb_metrics *m, FILE *f) {
    if (!m || !f) return;
    metrics_line(m, f);
    if (!m->classes || !m->confusion) return;
    /* per class: its accuracy, then its row of the confusion matrix */
    int w = 5;
    for (int64_t c = 0; c < m->classes * m->classes; c++) {
        int d = snprintf(NULL, 0, "%lld", (long long)m->confusion[c]);
        w = d + 1 > w ? d + 1 : w;
    }
    fprintf(f, "%5s %9s |", "class", "accuracy");
    for (int64_t c = 0; c < m->classes; c++)
        fprintf(f, "%*lld", w, (long long)c);
    fprintf(f, "  (predicted)\n");
    for (int64_t c = 0; c < m->classes; c++) {
        double a = ebb_metrics_class_accuracy(m, c);
        if (isnan(a))
            fprintf(f, "%5lld %9s |", (long long)c, "-");
        else
            fprintf(f, "%5lld %9.4f |", (long long)c, a);
        for (int64_t k = 0; k < m->classes; k++)
            fprintf(f, "%*lld", w, (long long)m->confusion[c * m->classes + k]);
        fprintf(f, "\n");
    }
}

/* A host copy of t as `dt` ([numel] values), or NULL with the error set. */
static void *host_copy(const ebb_tensor *t, ebb_dtype dt, size_t elem) {
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

/* Counts a batch's predictions into m: top-1 (the first highest score, as
 * argmax picks it), top-k, and the confusion matrix. */
static ebb_status count_predictions(ebb_metrics *m, const ebb_tensor *out,
                                    const ebb_tensor *target) {
    int64_t c = m->classes, n = ebb_tensor_numel(target);
    if (ebb_tensor_numel(out) != n * c)
        return ebb_error_set(EBB_ERR_SHAPE,
                             "evaluation: the output holds %lld scores, not %lld targets times "
                             "%lld classes",
                             (long long)ebb_tensor_numel(out), (long long)n, (long long)c);
    double *score = host_copy(out, EBB_FLOAT64, sizeof(double));
    int64_t *label = score ? host_copy(target, EBB_INT64, sizeof(int64_t)) : NULL;
    ebb_status st = label ? EBB_OK : ebb_errcode();
    for (int64_t i = 0; st == EBB_OK && i < n; i++) {
        const double *s = score + i * c;
        int64_t y = label[i], best = 0, above = 0;
        if (y < 0 || y >= c) {
            st = ebb_error_set(EBB_ERR_ARG, "evaluation: target %lld is not a class of %lld",
                               (long long)y, (long long)c);
            break;
        }
        for (int64_t k = 1; k < c; k++)
            best = s[k] > s[best] || (isnan(s[k]) && !isnan(s[best])) ? k : best;
        for (int64_t k = 0; k < c; k++)
            above += s[k] > s[y];
        m->confusion[y * c + best]++;
        m->accuracy += best == y;
        m->top_k_accuracy += m->top_k && above < m->top_k;
    }
    m->predictions += n;
    free(score);
    free(label);
    return st;
}

/* The loss op's mean over a batch (per token for [B, T, C] scores, as the
 * op computes it: viewed as [B*T, C] against [B*T]). */
static ebb_status batch_loss(const fields *f, const ebb_tensor *out, const ebb_tensor *target,
                             double *loss) {
    ebb_tensor *l = NULL, *fo = NULL, *ft = NULL;
    ebb_status st = EBB_OK;
    ebb_shape os = ebb_tensor_shape(out);
    if (f->classify && os.ndim > 2) {
        int64_t c = os.dim[os.ndim - 1], n = c > 0 ? ebb_shape_numel(&os) / c : 0;
        ebb_shape s2 = EBB_SHAPE(n, c), s1 = EBB_SHAPE(n);
        st = ebb_tensor_reshape(&fo, out, &s2);
        if (st == EBB_OK) st = ebb_tensor_reshape(&ft, target, &s1);
        out = fo;
        target = ft;
    }
    if (st != EBB_OK)
        ;
    else if (!strcmp(f->loss, "cross_entropy"))
        st = ebb_tensor_cross_entropy(&l, NULL, NULL, out, target, -100, 0.0);
    else if (!strcmp(f->loss, "nll"))
        st = ebb_tensor_nll_loss(&l, NULL, out, target, -100);
    else if (!strcmp(f->loss, "mse"))
        st = ebb_tensor_mse_loss(&l, out, target);
    else if (!strcmp(f->loss, "bce_with_logits"))
        st = ebb_tensor_bce_with_logits(&l, out, target);
    else
        st = ebb_error_set(EBB_ERR_UNSUPPORTED, "evaluation: loss '%s' is not one it computes",
                           f->loss);
    if (st == EBB_OK) st = ebb_tensor_item(l, loss);
    ebb_tensor_free(l);
    ebb_tensor_free(fo);
    ebb_tensor_free(ft);
    return st;
}

/* The metrics of the model over a whole dataset, in file order, in batches
 * of `batch` run with the inference plan. */
static ebb_status evaluate(const fields *f, const ebb_plan *plan, const ebb_model *model,
                           const ebb_dataset *d, int64_t batch, int top_k, ebb_metrics *m) {
    memset(m, 0, sizeof *m);
    int64_t n = ebb_dataset_size(d);
    if (f->classify && ebb_plan_output_count(plan) > 0) {
        const ebb_plan_value *v = ebb_plan_value_at(plan, ebb_plan_output_slot(plan, 0));
        m->classes = v->shape.ndim >= 1 ? v->shape.dim[v->shape.ndim - 1] : 0;
    }
    m->top_k = m->classes && top_k > 0 && top_k < m->classes ? top_k : 0;
    int64_t *order = malloc(sizeof *order * (size_t)n + 1);
    if (m->classes && !(m->confusion = calloc((size_t)(m->classes * m->classes), sizeof(int64_t))))
        free(order), order = NULL;
    if (!order) {
        ebb_metrics_free(m);
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    ebb_dataset_order(order, n, 0, 0);
    double sum = 0;
    ebb_status st = EBB_OK;
    ebb_tensor *ts[MAX_FIELDS] = {0};
    ebb_device dev = ebb_model_device(model);
    for (int64_t at = 0; st == EBB_OK && at < n; at += batch) {
        int64_t cnt = n - at < batch ? n - at : batch;
        ebb_tensor *out = NULL;
        double l = 0;
        st = make_batch(f, d, order + at, cnt, dev, ts);
        if (st == EBB_OK) st = ebb_run(plan, model, ts, &out, NULL);
        if (st == EBB_OK) st = batch_loss(f, out, ts[f->n_in], &l);
        if (st == EBB_OK && m->classes) st = count_predictions(m, out, ts[f->n_in]);
        ebb_tensor_free(out);
        free_tensors(ts, f->n);
        sum += l * (double)cnt;
    }
    free(order);
    if (st != EBB_OK) {
        ebb_metrics_free(m);
        return st;
    }
    m->samples = n;
    m->loss = sum / (double)n;
    m->perplexity = per_token(f, plan) ? exp(m->loss) : NAN;
    double preds = m->predictions ? (double)m->predictions : 1.0;
    m->accuracy = m->classes ? m->accuracy / preds : NAN;
    m->top_k_accuracy = m->top_k ? m->top_k_accuracy / preds : NAN;
    return EBB_OK;
}

/* ---- what a checkpoint holds of the model and its optimizer -------------------- */

/* Every parameter, its optimizer state (NULL where it has none) and its
 * update count. Either borrowed from the live model and optimizer
 * (state_view), or copies of them (state_copy: skip_nonfinite's undo). */
typedef struct state {
    int n, owned;
    ebb_tensor **t; /* [i * PER_PARAM]: parameter i; [i * PER_PARAM + 1 + k]: its slot k */
    int64_t *steps; /* [i]: parameter i's updates */
    ebb_loss_scaler scaler; /* the optimizer's loss scaling (written when on) */
} state;

static void state_free(state *s) {
    for (int k = 0; s->owned && s->t && k < s->n * PER_PARAM; k++)
        ebb_tensor_free(s->t[k]);
    free(s->t);
    free(s->steps);
    memset(s, 0, sizeof *s);
}

static ebb_status state_alloc(state *s, int n, int owned) {
    if (s->t) return EBB_OK;
    s->t = calloc((size_t)n * PER_PARAM + 1, sizeof *s->t);
    s->steps = calloc((size_t)n + 1, sizeof *s->steps);
    s->n = n;
    s->owned = owned;
    if (s->t && s->steps) return EBB_OK;
    state_free(s);
    return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
}

static ebb_status state_view(state *s, const ebb_model *m, const ebb_optimizer *opt) {
    ebb_status st = state_alloc(s, ebb_model_param_count(m), 0);
    for (int i = 0; st == EBB_OK && i < s->n; i++) {
        s->t[i * PER_PARAM] = ebb_model_param(m, ebb_model_param_name(m, i));
        for (int k = 0; opt && k < N_SLOTS; k++)
            s->t[i * PER_PARAM + 1 + k] = ebb_optimizer_state_tensor(opt, i, slot_name(k));
        s->steps[i] = opt ? ebb_optimizer_param_step_count(opt, i) : 0;
    }
    s->scaler = opt ? *ebb_optimizer_scaler_const(opt) : (ebb_loss_scaler){0};
    return st;
}

/* s becomes a copy of the live state, reusing the tensors of its last copy. */
static ebb_status state_copy(state *s, const ebb_model *m, const ebb_optimizer *opt) {
    state live = {0};
    ebb_status st = state_view(&live, m, opt);
    if (st == EBB_OK) st = state_alloc(s, live.n, 1);
    for (int k = 0; st == EBB_OK && k < live.n * PER_PARAM; k++) {
        if (!live.t[k]) {
            ebb_tensor_free(s->t[k]);
            s->t[k] = NULL;
        } else {
            st = s->t[k] ? ebb_tensor_copy_(s->t[k], live.t[k])
                         : ebb_tensor_clone(&s->t[k], live.t[k]);
        }
    }
    if (st == EBB_OK) memcpy(s->steps, live.steps, sizeof *s->steps * (size_t)live.n);
    s->scaler = live.scaler;
    state_free(&live);
    return st;
}

/* Whether options `o` keep state slot k (ebb_optimizer_save()'s names). */
static int slot_used(const ebb_optimizer_options *o, int k) {
    const char *name = ebb_optimizer_state_slot(o, k);
    return name && *name;
}

/* Writes s to `path`: the parameters under their names when with_params;
 * the optimizer state as ebb_optimizer_save() names it, under options oo (a
 * slot oo does not keep is left out, and so is all of a parameter's state
 * when it lacks a slot oo keeps: it starts afresh, as torch.optim's would);
 * and n_meta metadata pairs. */
static ebb_status state_write(const state *s, const ebb_model *m, const ebb_optimizer_options *oo,
                              const char *path, int with_params, const char *const *meta,
                              int n_meta) {
    int cap = s->n * (PER_PARAM + 1) + 2, n = 0;
    char **names = calloc((size_t)cap, sizeof *names);
    ebb_tensor **ts = calloc((size_t)cap, sizeof *ts);
    char *made = calloc((size_t)cap, 1);
    ebb_status st = names && ts && made ? EBB_OK : ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int i = 0; st == EBB_OK && i < s->n; i++) {
        const char *pn = ebb_model_param_name(m, i);
        ebb_tensor *const *slot = s->t + i * PER_PARAM + 1;
        if (with_params) {
            names[n] = strdup(pn);
            ts[n++] = s->t[i * PER_PARAM];
        }
        int whole = s->steps[i] > 0;
        for (int k = 0; k < N_SLOTS; k++)
            whole &= !slot_used(oo, k) || slot[k] != NULL;
        for (int k = 0; whole && st == EBB_OK && k <= N_SLOTS; k++) {
            if (k < N_SLOTS && !slot_used(oo, k)) continue;
            size_t len = strlen(pn) + 32;
            if ((names[n] = malloc(len)))
                snprintf(names[n], len, "optim.%s.%s", pn, k < N_SLOTS ? slot_name(k) : "step");
            if (k < N_SLOTS) {
                ts[n] = slot[k];
            } else {
                ebb_shape scalar = {0, {0}};
                made[n] = 1;
                st = ebb_tensor_full(&ts[n], &scalar, (double)s->steps[i], EBB_FLOAT64,
                                     ebb_device_cpu());
            }
            n++;
        }
    }
    if (st == EBB_OK) {
        /* ebb_optimizer_save()'s optim.options, format version 2 */
        double v[15] = {2,          (double)oo->kind, oo->lr,      oo->momentum, oo->dampening,
                        oo->nesterov, oo->weight_decay, oo->beta1, oo->beta2,    oo->eps,
                        oo->amsgrad, oo->rho,          oo->centered, oo->lr_decay,
                        oo->initial_accumulator_value};
        ebb_shape sh = {1, {15}};
        names[n] = strdup("optim.options");
        made[n] = 1;
        st = ebb_tensor_from_host(&ts[n++], v, sizeof v, &sh, EBB_FLOAT64, ebb_device_cpu());
    }
    if (st == EBB_OK && s->scaler.on) {
        names[n] = strdup(EBB_SCALER_NAME);
        made[n] = 1;
        st = ebb_loss_scaler_tensor(&ts[n++], &s->scaler);
    }
    for (int i = 0; st == EBB_OK && i < n; i++)
        if (!names[i]) st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK)
        st = ebb_safetensors_write_meta(path, (const char *const *)names, ts, n, meta, n_meta);
    for (int i = 0; names && ts && made && i < n; i++) {
        free(names[i]);
        if (made[i]) ebb_tensor_free(ts[i]);
    }
    free(names);
    free(ts);
    free(made);
    return st;
}

/* Replaces the optimizer's state and update counts with s's, under options
 * oo, through an anonymous file in memory: ebb_optimizer_load() is the one
 * call that sets them. */
static ebb_status state_load_optimizer(const state *s, const ebb_model *m, ebb_optimizer *opt,
                                       const ebb_optimizer_options *oo) {
    int fd = memfd_create("ebb-optimizer-state", MFD_CLOEXEC);
    if (fd < 0)
        return ebb_error_set(EBB_ERR_IO, "cannot hold the optimizer state in memory: %s",
                             strerror(errno));
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ebb_status st = state_write(s, m, oo, path, 0, NULL, 0);
    if (st == EBB_OK) st = ebb_optimizer_load(opt, path);
    close(fd);
    return st;
}

/* Puts a copy back: the parameters (batch_norm's running statistics among
 * them), the optimizer's state and its update counts. */
static ebb_status state_restore(const state *s, ebb_model *m, ebb_optimizer *opt) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < s->n; i++)
        st = ebb_tensor_copy_(ebb_model_param(m, ebb_model_param_name(m, i)), s->t[i * PER_PARAM]);
    ebb_optimizer_options oo = ebb_optimizer_get_options(opt);
    return st == EBB_OK ? state_load_optimizer(s, m, opt, &oo) : st;
}

/* The NaN and infinite elements of t (none in an integer tensor). */
static ebb_status count_nonfinite(const ebb_tensor *t, int64_t *bad) {
    ebb_dtype dt = ebb_tensor_dtype(t);
    *bad = 0;
    if (dt != EBB_FLOAT32 && dt != EBB_FLOAT64 && dt != EBB_FLOAT16 && dt != EBB_BFLOAT16)
        return EBB_OK;
    int wide = dt == EBB_FLOAT64;
    size_t n = (size_t)ebb_tensor_numel(t);
    void *buf = host_copy(t, wide ? EBB_FLOAT64 : EBB_FLOAT32, wide ? sizeof(double) : sizeof(float));
    if (!buf) return ebb_errcode();
    for (size_t i = 0; i < n; i++)
        *bad += wide ? !isfinite(((const double *)buf)[i]) : !isfinite(((const float *)buf)[i]);
    free(buf);
    return EBB_OK;
}

typedef void (*warn_fn)(const char *message, void *user);

/* EBB_ERR_ARG naming the first tensor of s (parameters only, or with the
 * optimizer state) that holds NaN or Inf; or, when warn is given, one
 * warning per such tensor ("FILE: ...") and EBB_OK. */
static ebb_status state_check_finite(const state *s, const ebb_model *m, int params_only,
                                     warn_fn warn, void *user, const char *file) {
    for (int k = 0; k < s->n * PER_PARAM; k++) {
        int64_t bad = 0;
        int i = k / PER_PARAM, slot = k % PER_PARAM - 1;
        if (!s->t[k] || (params_only && slot >= 0)) continue;
        ebb_status st = count_nonfinite(s->t[k], &bad);
        if (st != EBB_OK) return st;
        if (!bad) continue;
        char what[512], msg[1024];
        snprintf(what, sizeof what, slot < 0 ? "parameter '%s%s'" : "optimizer state 'optim.%s.%s'",
                 ebb_model_param_name(m, i), slot < 0 ? "" : slot_name(slot));
        if (!warn)
            return ebb_error_set(EBB_ERR_ARG, "%s holds %lld NaN or infinite values (of %lld)",
                                 what, (long long)bad, (long long)ebb_tensor_numel(s->t[k]));
        snprintf(msg, sizeof msg, "%s: %s holds %lld NaN or infinite values (of %lld)", file, what,
                 (long long)bad, (long long)ebb_tensor_numel(s->t[k]));
        warn(msg, user);
    }
    return EBB_OK;
}

/* ---- checkpoints ----------------------------------------------------------------- */

void ebb_checkpoint_info_free(ebb_checkpoint_info *ci) {
    if (!ci) return;
    free(ci->no_decay);
    free(ci->keep_best);
    free(ci->data);
    free(ci->stateless);
    memset(ci, 0, sizeof *ci);
}

static int meta_i64(const ebb_safetensors *sf, const char *key, int64_t *out) {
    const char *v = ebb_safetensors_metadata(sf, key);
    char *end = NULL;
    if (!v || !*v) return 0;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno || x < 0) return 0;
    *out = x;
    return 1;
}

/* keep_best's metric, its best value and the step of its checkpoint (a
 * checkpoint without keep_best has none of them). */
static ebb_status read_keep_best(const ebb_safetensors *sf, const char *path,
                                 ebb_checkpoint_info *ci) {
    const char *metric = ebb_safetensors_metadata(sf, "keep_best");
    const char *value = ebb_safetensors_metadata(sf, "keep_best_value");
    ci->keep_best_value = NAN;
    if (!metric || !*metric) return EBB_OK;
    char *end = NULL;
    double v = value ? strtod(value, &end) : 0;
    if (!value || end == value || *end || !meta_i64(sf, "keep_best_step", &ci->keep_best_step))
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: keep_best %s without a number in keep_best_value and a step "
                             "in keep_best_step",
                             path, metric);
    ci->keep_best_value = v;
    if (!(ci->keep_best = strdup(metric))) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    return EBB_OK;
}

ebb_status ebb_checkpoint_read_info(const char *path, ebb_checkpoint_info *ci) {
    if (!path || !ci) return ebb_error_set(EBB_ERR_ARG, "ebb_checkpoint_read_info: NULL argument");
    memset(ci, 0, sizeof *ci);
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    if (st != EBB_OK) return st;
    int64_t seed = 0, shuffle = 0, drop = 0;
    ebb_tensor *t = NULL;
    double v[15] = {0}; /* ebb_optimizer_save()'s optim.options: 15 values, or 11 (version 1) */
    ebb_shape sh;
    ebb_dtype dt;
    if (!ebb_safetensors_metadata(sf, "ebb_checkpoint") || !meta_i64(sf, "step", &ci->step) ||
        !meta_i64(sf, "seed", &seed) || !meta_i64(sf, "batch", &ci->batch) ||
        !meta_i64(sf, "shuffle", &shuffle) || !meta_i64(sf, "drop_last", &drop))
        st = ebb_error_set(EBB_ERR_ARG,
                           "%s: not an ebb train checkpoint (its __metadata__ lacks "
                           "ebb_checkpoint, step, seed, batch, shuffle or drop_last)",
                           path);
    else if (ebb_safetensors_find(sf, "optim.options", &dt, &sh) != EBB_OK || dt != EBB_FLOAT64 ||
             sh.ndim != 1 || (sh.dim[0] != 15 && sh.dim[0] != 11))
        st = ebb_error_set(EBB_ERR_ARG, "%s: no optim.options (float64 [15])", path);
    else if ((st = ebb_safetensors_load(&t, sf, "optim.options", ebb_device_cpu())) == EBB_OK)
        st = ebb_tensor_to_host(t, v, (size_t)sh.dim[0] * sizeof v[0]);
    const char *data = ebb_safetensors_metadata(sf, "data");
    const char *stateless = ebb_safetensors_metadata(sf, "stateless");
    const char *sched = ebb_safetensors_metadata(sf, "lr_schedule");
    if (st == EBB_OK && sched) {
        const char *lr = ebb_safetensors_metadata(sf, "lr_schedule_lr");
        const char *base = ebb_safetensors_metadata(sf, "lr_schedule_base");
        char *end1 = NULL, *end2 = NULL;
        ci->schedule_lr = lr ? strtod(lr, &end1) : NAN;
        ci->schedule_base = base ? strtod(base, &end2) : NAN;
        if (ebb_lr_schedule_parse(&ci->schedule, sched) != EBB_OK ||
            !meta_i64(sf, "lr_schedule_steps", &ci->schedule_steps) || !end1 || *end1 || !end2 ||
            *end2 || !isfinite(ci->schedule_lr) || !isfinite(ci->schedule_base))
            st = ebb_error_set(EBB_ERR_ARG,
                               "%s: its learning-rate schedule '%s' is not one ebb can resume "
                               "(lr_schedule_steps, lr_schedule_lr and lr_schedule_base must be "
                               "numbers)",
                               path, sched);
        ci->has_schedule = 1;
    }
    ci->accumulate = 1;
    if (st == EBB_OK && ebb_safetensors_metadata(sf, "accumulate") &&
        (!meta_i64(sf, "accumulate", &ci->accumulate) || ci->accumulate < 1))
        st = ebb_error_set(EBB_ERR_ARG, "%s: accumulate '%s' is not a count", path,
                           ebb_safetensors_metadata(sf, "accumulate"));
    const char *clip_norm = ebb_safetensors_metadata(sf, "clip_grad_norm");
    const char *clip_value = ebb_safetensors_metadata(sf, "clip_grad_value");
    char *end = NULL;
    if (st == EBB_OK && clip_norm &&
        (ci->clip_grad_norm = strtod(clip_norm, &end), *end || !(ci->clip_grad_norm >= 0)))
        st = ebb_error_set(EBB_ERR_ARG, "%s: clip_grad_norm '%s' is not a number", path, clip_norm);
    if (st == EBB_OK && clip_value &&
        (ci->clip_grad_value = strtod(clip_value, &end), *end || !(ci->clip_grad_value >= 0)))
        st = ebb_error_set(EBB_ERR_ARG, "%s: clip_grad_value '%s' is not a number", path,
                           clip_value);
    const char *no_decay = ebb_safetensors_metadata(sf, "no_decay");
    if (st == EBB_OK && no_decay && *no_decay && !(ci->no_decay = strdup(no_decay)))
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK) st = read_keep_best(sf, path, ci);
    if (st == EBB_OK && ((data && !(ci->data = strdup(data))) ||
                         (stateless && !(ci->stateless = strdup(stateless)))))
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    ebb_tensor_free(t);
    ebb_safetensors_close(sf);
    if (st != EBB_OK) {
        ebb_checkpoint_info_free(ci);
        return st;
    }
    ci->seed = (uint64_t)seed;
    ci->shuffle = shuffle != 0;
    ci->drop_last = drop != 0;
    ci->optimizer = (ebb_optimizer_options){.kind = (ebb_optimizer_kind)(int)v[1],
                                            .lr = v[2],
                                            .momentum = v[3],
                                            .dampening = v[4],
                                            .nesterov = (int)v[5],
                                            .weight_decay = v[6],
                                            .beta1 = v[7],
                                            .beta2 = v[8],
                                            .eps = v[9],
                                            .amsgrad = (int)v[10],
                                            .rho = v[11],
                                            .centered = (int)v[12],
                                            .lr_decay = v[13],
                                            .initial_accumulator_value = v[14],
                                            .complete = 1};
    return EBB_OK;
}

/* Every parameter of the model, read from the checkpoint in place. */
static ebb_status load_checkpoint_weights(const char *path, ebb_model *m) {
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(m); i++) {
        const char *pn = ebb_model_param_name(m, i);
        if (!ebb_safetensors_dtype_str(sf, pn))
            st = ebb_error_set(EBB_ERR_ARG, "%s: missing parameter '%s'", path, pn);
        else
            st = ebb_safetensors_load_into(sf, pn, ebb_model_param(m, pn));
    }
    ebb_safetensors_close(sf);
    return st;
}

/* ---- the trainer ------------------------------------------------------------------- */

struct ebb_trainer {
    ebb_trainer_options o;
    ebb_lr_schedule schedule; /* o.schedule points here */
    fields f;
    ebb_checkpoint_info ci; /* o.resume's */
    ebb_plan *plan, *infer;
    ebb_model *m;
    ebb_optimizer *opt;
    ebb_dataset *train, *test;
    char *data; /* the training data's fields, as a checkpoint records them */
    int64_t *order;
    /* the samples this rank takes, in order (data parallel: every
     * world-th of `order`; else `order` itself), and how many of them at a
     * time (batch / world) */
    int64_t *shard, shard_samples, local_batch;
    int world, rank;
    ebb_tensor *ts[MAX_FIELDS];
    state undo;        /* skip_nonfinite: the model and optimizer before the step */
    ebb_capture *cap;  /* cuda_graph: the step, captured at the first full batch */
    int64_t accum, micro_per_epoch; /* micro-batches per step (1: none), and per epoch */
    double scale_from; /* loss scaling's first scale; 0: no loss scaling */
    ebb_tensor **acc;   /* accumulate: per parameter, its gradient buffer (NULL: not trained) */
    ebb_tensor **grads; /* accumulate: one micro-batch's gradients, or the step's to apply */
    unsigned char *got; /* accumulate: per parameter, a gradient reached it this step */
    ebb_lr_scheduler *sched;
    ebb_trainer_stats s;
    char skip_why[512];
    int tty; /* progress is a terminal: the progress line is redrawn in place */
    /* steps count from 1, as the progress line counts them */
    int64_t epoch_samples, epochs, trace_at, shuffled_epoch;
    double t0, t_epoch, last_draw;
    /* losses summed since the last log line and the epoch's start, over the
     * steps counted (not skipped) */
    double log_loss, epoch_loss;
    int64_t log_n, epoch_n, epoch_steps, epoch_skipped;
    /* early stopping */
    double best_loss;
    int64_t best_epoch, bad_epochs;
    int stop, callback_stop; /* the run stops; a callback stopped it (nothing written) */
    char stop_reason[512];
    /* keep_best: its metric (an index of best_metrics) and the file it
     * keeps; the value and step are in s */
    int best_kind;
    char *best_path;
};

ebb_trainer_options ebb_trainer_defaults(void) {
    return (ebb_trainer_options){.epochs = 1,
                                 .batch = 64,
                                 .shuffle = 1,
                                 .optimizer = ebb_optimizer_defaults(EBB_ADAMW, 1e-3),
                                 .device = ebb_device_cpu(),
                                 .top_k = 5};
}

static void warn(const ebb_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(const ebb_trainer *t, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (t->o.warning)
        t->o.warning(msg, t->o.user);
    else
        fprintf(stderr, "ebb: warning: %s\n", msg);
}

static void warn_cb(const char *message, void *user) { warn(user, "%s", message); }

static void warn_nonfinite(const char *path, const char *name, int64_t count, int64_t numel,
                           void *user) {
    warn(user, "%s: parameter '%s' holds %lld NaN or infinite values (of %lld)", path, name,
         (long long)count, (long long)numel);
}

/* Samples seen after `step` steps: whole epochs, then the batches of the
 * epoch under way (the last one partial unless drop_last); -1 when that
 * does not fit in 64 bits. */
static int64_t samples_at(const ebb_trainer *t, int64_t step) {
    int64_t whole, in_epoch, s, per = t->s.steps_per_epoch;
    if (__builtin_mul_overflow(step / per, t->epoch_samples, &whole) ||
        __builtin_mul_overflow(step % per, t->o.batch * t->accum, &in_epoch) ||
        __builtin_add_overflow(whole, in_epoch < t->epoch_samples ? in_epoch : t->epoch_samples,
                               &s))
        return -1;
    return s;
}

/* A comma-separated list of the trained parameters without optimizer state
 * (a branch no row chose has none; a resumed run must tell that from state
 * a file lost), by their update counts steps[]. A new string, or NULL when
 * out of memory. */
static char *stateless_params(const ebb_trainer *t, const int64_t *steps) {
    size_t cap = 1, at = 0;
    for (int i = 0; i < ebb_model_param_count(t->m); i++)
        cap += strlen(ebb_model_param_name(t->m, i)) + 1;
    char *s = malloc(cap);
    for (int i = 0; s && i < ebb_model_param_count(t->m); i++)
        if (ebb_plan_param_trained(t->plan, i) && steps[i] <= 0)
            at += (size_t)snprintf(s + at, cap - at, "%s%s", at ? "," : "",
                                   ebb_model_param_name(t->m, i));
    if (s) s[at] = '\0';
    return s;
}

/* "x float32 [96, 64], y int64 [96]": a dataset's fields as stored. */
static char *data_fields(const ebb_dataset *d) {
    size_t cap = 64 + (size_t)ebb_dataset_field_count(d) * 192, at = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < ebb_dataset_field_count(d) && at < cap; i++) {
        char sh[128];
        ebb_shape shape = ebb_dataset_field_shape(d, i);
        at += (size_t)snprintf(
            s + at, cap - at, "%s%s %s %s", i ? ", " : "", ebb_dataset_field_name(d, i),
            ebb_dtype_name(ebb_dataset_field_dtype(d, i)), ebb_shape_str(&shape, sh, sizeof sh));
    }
    return s;
}

static int in_list(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ','))
        if (strcspn(p, ",") == len && !strncmp(p, name, len)) return 1;
    return 0;
}

static int same_options(const ebb_optimizer_options *a, const ebb_optimizer_options *b) {
    return a->kind == b->kind && a->lr == b->lr && a->momentum == b->momentum &&
           a->dampening == b->dampening && a->nesterov == b->nesterov &&
           a->weight_decay == b->weight_decay && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
           a->eps == b->eps && a->amsgrad == b->amsgrad && a->rho == b->rho &&
           a->centered == b->centered && a->lr_decay == b->lr_decay &&
           a->initial_accumulator_value == b->initial_accumulator_value;
}

/* ---- open ---- */

static ebb_status check_options(const ebb_trainer_options *o) {
    if (!o->evaluate_only && !o->data)
        return ebb_error_set(EBB_ERR_ARG, "the trainer needs training data (options.data)");
    if (o->evaluate_only && !o->eval_data)
        return ebb_error_set(EBB_ERR_ARG, "evaluate_only needs eval_data, the data evaluated");
    if (o->batch < 1)
        return ebb_error_set(EBB_ERR_ARG, "batch %lld: a batch holds at least one sample",
                             (long long)o->batch);
    if (o->block < 0)
        return ebb_error_set(EBB_ERR_ARG, "block %lld: a sequence holds at least one token",
                             (long long)o->block);
    if (!o->evaluate_only && !o->steps && o->epochs < 1)
        return ebb_error_set(EBB_ERR_ARG, "epochs %lld: train for at least one epoch or step",
                             (long long)o->epochs);
    if (o->steps < 0 || o->checkpoint_every < 0 || o->log_every < 0 || o->trace_step < 0 ||
        o->top_k < 0 || o->early_stop_patience < 0)
        return ebb_error_set(EBB_ERR_ARG, "the trainer's counts (steps, checkpoint_every, "
                                          "log_every, trace_step, top_k, early_stop_patience) "
                                          "cannot be negative");
    if (o->early_stop_patience && !o->eval_data)
        return ebb_error_set(EBB_ERR_ARG, "early stopping watches the evaluation loss: it "
                                          "needs eval_data");
    if (o->cuda_graph && o->device.type != EBB_DEVICE_CUDA) {
        char d[32];
        return ebb_error_set(EBB_ERR_ARG,
                             "--cuda-graph needs a CUDA device; training would run on %s (add "
                             "--device cuda)",
                             ebb_device_str(o->device, d, sizeof d));
    }
    if (o->zero && !o->dist)
        return ebb_error_set(EBB_ERR_ARG, "zero shards the optimizer over the ranks of a "
                                          "data-parallel run; there is no dist (--nproc)");
    if (o->dist) {
        int w = ebb_dist_world_size(o->dist);
        if (o->batch % w != 0)
            return ebb_error_set(EBB_ERR_ARG, "--batch %lld is the global batch of %d ranks: "
                                              "it must be a multiple of %d",
                                 (long long)o->batch, w, w);
        ebb_device gd = ebb_dist_device(o->dist);
        if (gd.type != o->device.type || gd.index != o->device.index) {
            char a[32], b[32];
            return ebb_error_set(EBB_ERR_ARG,
                                 "the model trains on %s and its process group's collectives "
                                 "take tensors on %s (ebb_dist_options.device): they must be "
                                 "the same device",
                                 ebb_device_str(o->device, a, sizeof a),
                                 ebb_device_str(gd, b, sizeof b));
        }
        if (o->cuda_graph)
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "data-parallel training does not take --cuda-graph: ebb's "
                                 "captured step holds no collectives yet");
    }
    if (o->cuda_graph && o->skip_nonfinite)
        return ebb_error_set(EBB_ERR_ARG, "cuda_graph and skip_nonfinite cannot be combined: a "
                                          "replayed step cannot be undone (its updates are in "
                                          "the graph)");
    if (o->accumulate < 0 || o->accumulate > 1000000)
        return ebb_error_set(EBB_ERR_ARG, "--accumulate %d: a step takes 1 to 1000000 "
                                          "micro-batches",
                             o->accumulate);
    if (o->accumulate > 1 && o->cuda_graph)
        return ebb_error_set(EBB_ERR_ARG, "--accumulate and --cuda-graph cannot be combined: the "
                                          "captured step is a whole one");
    if (o->checkpoint_every && !o->checkpoint)
        return ebb_error_set(EBB_ERR_ARG, "checkpoint_every needs a checkpoint path");
    return EBB_OK;
}

/* ---- keep_best ---- */

/* The figures keep_best may watch: the JSON epoch line's names. */
enum { BEST_LOSS, BEST_PPL, BEST_EVAL_LOSS, BEST_EVAL_PPL, BEST_EVAL_ACC, BEST_EVAL_TOP_K };
static const char *const best_metrics[] = {"loss", "perplexity", "eval_loss", "eval_perplexity",
                                           "eval_accuracy", "eval_top_k_accuracy"};
#define N_BEST_METRICS (int)(sizeof best_metrics / sizeof best_metrics[0])

static int best_is_max(int kind) { return kind == BEST_EVAL_ACC || kind == BEST_EVAL_TOP_K; }

/* The output's classes, as an evaluation counts them (0: not a classifier). */
static int64_t classes_of(const ebb_trainer *t) {
    if (!t->f.classify || ebb_plan_output_count(t->infer) < 1) return 0;
    const ebb_plan_value *v = ebb_plan_value_at(t->infer, ebb_plan_output_slot(t->infer, 0));
    return v->shape.ndim >= 1 ? v->shape.dim[v->shape.ndim - 1] : 0;
}

/* keep_best names a figure this run has at every epoch's end; the best
 * goes beside the checkpoint, where a resumed run's best so far is kept.
 * Its refusals name the flag and the figure alone (ebb_trainer_open does
 * not point them into the spec: "loss" is no node of it). */
static ebb_status open_keep_best(ebb_trainer *t) {
    const char *k = t->o.keep_best, *ck = t->o.checkpoint;
    t->s.best_value = NAN;
    if (!k) return EBB_OK;
    if (!ck)
        return ebb_error_set(EBB_ERR_ARG,
                             "--keep-best %s needs a checkpoint path, beside which the best "
                             "checkpoint is kept",
                             k);
    int kind = 0;
    while (kind < N_BEST_METRICS && strcmp(k, best_metrics[kind])) kind++;
    int64_t classes = classes_of(t);
    const char *why = kind == N_BEST_METRICS ? "not a figure it can watch"
                      : kind >= BEST_EVAL_LOSS && !t->test ? "it needs eval_data (--eval-data)"
                      : (kind == BEST_PPL || kind == BEST_EVAL_PPL) && !t->s.per_token
                          ? "the loss is not per token: there is no perplexity"
                      : kind == BEST_EVAL_ACC && !classes
                          ? "the loss counts no predictions (cross_entropy or nll do)"
                      : kind == BEST_EVAL_TOP_K && !(t->o.top_k > 0 && t->o.top_k < classes)
                          ? "no top-k accuracy is counted (top_k must be below the classes)"
                          : NULL;
    if (why)
        return ebb_error_set(EBB_ERR_ARG,
                             "--keep-best %s: %s; it watches loss, perplexity, eval_loss, "
                             "eval_perplexity, eval_accuracy or eval_top_k_accuracy",
                             k, why);
    size_t n = strlen(ck), ext = strlen(".safetensors");
    int has_ext = n > ext && !strcmp(ck + n - ext, ".safetensors");
    if (!(t->best_path = malloc(n + 16))) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    snprintf(t->best_path, n + 16, has_ext ? "%.*s.best.safetensors" : "%.*s.best",
             (int)(has_ext ? n - ext : n), ck);
    t->best_kind = kind;
    t->s.best_checkpoint = t->best_path;
    if (t->ci.keep_best && !strcmp(t->ci.keep_best, k)) {
        t->s.best_value = t->ci.keep_best_value;
        t->s.best_step = t->ci.keep_best_step;
        /* the best file can be newer than the checkpoint resumed (written
         * at an epoch's end after a checkpoint_every one): a better figure
         * it holds stands, so a resumed run never replaces it by a worse */
        ebb_checkpoint_info bi;
        if (ebb_checkpoint_read_info(t->best_path, &bi) == EBB_OK && bi.keep_best &&
            !strcmp(bi.keep_best, k) && !isnan(bi.keep_best_value) &&
            (isnan(t->s.best_value) || (best_is_max(kind) ? bi.keep_best_value > t->s.best_value
                                                          : bi.keep_best_value < t->s.best_value))) {
            t->s.best_value = bi.keep_best_value;
            t->s.best_step = bi.keep_best_step;
        }
        ebb_checkpoint_info_free(&bi);
        ebb_error_clear(); /* no best file yet is no error */
    }
    return EBB_OK;
}

/* Loads `path` into the model; NaN or Inf is an error naming the tensor
 * unless allow_nonfinite, which makes it a warning. */
static ebb_status load_weights(ebb_trainer *t, const char *path) {
    ebb_model_load_options lo = {
        .strict_finite = !t->o.allow_nonfinite, .nonfinite = warn_nonfinite, .user = t};
    return ebb_model_load_ex(t->m, path, &lo);
}

/* A trained parameter without optimizer state, unless the checkpoint says it
 * had none, is state the file lost: resuming would restart it from zero. */
static ebb_status check_missing_state(ebb_trainer *t) {
    char names[1024];
    size_t at = 0;
    int missing = 0;
    names[0] = '\0';
    for (int i = 0; t->ci.step > 0 && i < ebb_model_param_count(t->m); i++) {
        const char *pn = ebb_model_param_name(t->m, i);
        if (!ebb_plan_param_trained(t->plan, i) || ebb_optimizer_param_step_count(t->opt, i) > 0 ||
            in_list(t->ci.stateless, pn))
            continue;
        if (at < sizeof names)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s'%s'", missing ? ", " : "", pn);
        missing++;
    }
    if (!missing) return EBB_OK;
    const char *verb = missing > 1 ? "were" : "was";
    if (t->o.non_strict) {
        warn(t, "%s: no optimizer state for %s, which %s trained at step %lld; --non-strict: "
                "starting without it", t->o.resume, names, verb, (long long)t->ci.step);
        return EBB_OK;
    }
    return ebb_error_set(EBB_ERR_ARG,
                         "%s: no optimizer state for %s, which %s trained at step %lld; "
                         "--non-strict starts without it",
                         t->o.resume, names, verb, (long long)t->ci.step);
}

/* ---- ZeRO-1 (ebb_trainer_options.zero) ---- */

/* Whether this rank holds parameter i's optimizer state. */
static int zero_mine(const ebb_trainer *t, int i) {
    int owner = ebb_plan_param_owner(t->plan, i);
    return owner < 0 || owner == t->rank;
}

/* --accumulate's update under ZeRO-1 (the plan's broadcast steps do it for
 * one batch a step): each rank's parameters, as it updated them, to every
 * other rank, one collective per owner. */
static ebb_status zero_broadcast(ebb_trainer *t) {
    int np = ebb_model_param_count(t->m), world = ebb_dist_world_size(t->o.dist);
    ebb_tensor **mine = calloc((size_t)np + 1, sizeof *mine);
    if (!mine) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    ebb_status st = EBB_OK;
    for (int r = 0; st == EBB_OK && r < world; r++) {
        int n = 0;
        for (int i = 0; i < np; i++)
            if (ebb_plan_param_owner(t->plan, i) == r)
                mine[n++] = ebb_model_param(t->m, ebb_model_param_name(t->m, i));
        if (n > 0) st = ebb_dist_broadcast_(t->o.dist, mine, n, r);
    }
    free(mine);
    return st;
}

/* After a resume, which loaded the whole state: the state of the
 * parameters other ranks own goes. */
static void zero_drop_others(ebb_trainer *t) {
    for (int i = 0; i < ebb_model_param_count(t->m); i++)
        if (!zero_mine(t, i)) ebb_optimizer_drop_state(t->opt, i);
}

/* Before a checkpoint, on every rank: each rank's share of the optimizer
 * state goes to rank 0, which completes s (a view of its own state) with
 * it, in tensors it allocates into made[] (n of them, for the caller to
 * free). Per rank, one transfer: its parameters' slots, then their update
 * counts. */
static ebb_status zero_gather(ebb_trainer *t, state *s, ebb_tensor ***made, int *n_made) {
    ebb_optimizer_options oo = ebb_optimizer_get_options(t->opt);
    int n = ebb_model_param_count(t->m);
    ebb_tensor **ts = calloc((size_t)n * (N_SLOTS + 1) + 2, sizeof *ts);
    ebb_tensor **keep = t->rank == 0 ? calloc((size_t)n * (N_SLOTS + 1) + 2, sizeof *keep) : NULL;
    *made = keep;
    *n_made = 0;
    if (!ts || (t->rank == 0 && !keep)) {
        free(ts);
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    ebb_status st = EBB_OK;
    for (int r = 1; st == EBB_OK && r < t->world; r++) {
        if (t->rank != 0 && t->rank != r) continue; /* a transfer between rank r and rank 0 */
        int m = 0, count = 0;
        for (int i = 0; i < n; i++)
            count += ebb_plan_param_owner(t->plan, i) == r;
        if (count == 0) continue;
        double *steps = calloc((size_t)count, sizeof *steps);
        if (!steps) st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
        for (int i = 0, c = 0; st == EBB_OK && i < n; i++) {
            if (ebb_plan_param_owner(t->plan, i) != r) continue;
            ebb_tensor *p = ebb_model_param(t->m, ebb_model_param_name(t->m, i));
            for (int k = 0; st == EBB_OK && k < N_SLOTS; k++) {
                if (!slot_used(&oo, k)) continue;
                if (t->rank == r) {
                    ts[m++] = ebb_optimizer_state_tensor(t->opt, i, slot_name(k));
                } else {
                    ebb_shape sh = ebb_tensor_shape(p);
                    st = ebb_tensor_zeros(&ts[m], &sh, ebb_tensor_dtype(p),
                                          ebb_dist_device(t->o.dist));
                    keep[(*n_made)++] = ts[m];
                    s->t[i * PER_PARAM + 1 + k] = ts[m++];
                }
            }
            steps[c++] = t->rank == r ? (double)ebb_optimizer_param_step_count(t->opt, i) : 0;
        }
        ebb_shape sh = {1, {count}};
        ebb_tensor *counts = NULL; /* made here on either side */
        if (st == EBB_OK)
            st = ebb_tensor_from_host(&counts, steps, sizeof *steps * (size_t)count, &sh,
                                      EBB_FLOAT64, ebb_dist_device(t->o.dist));
        if (st == EBB_OK) {
            ts[m++] = counts;
            st = t->rank == r ? ebb_dist_send(t->o.dist, ts, m, 0)
                              : ebb_dist_recv_(t->o.dist, ts, m, r);
        }
        if (st == EBB_OK && t->rank == 0)
            st = ebb_tensor_to_host(counts, steps, sizeof *steps * (size_t)count);
        for (int i = 0, c = 0; st == EBB_OK && t->rank == 0 && i < n; i++)
            if (ebb_plan_param_owner(t->plan, i) == r) s->steps[i] = (int64_t)steps[c++];
        ebb_tensor_free(counts);
        free(steps);
    }
    free(ts);
    return st;
}

/* The weights and the optimizer state (under the options in force, which
 * may differ from the checkpoint's), each checked for state lost and for
 * NaN or Inf; a dataset unlike the checkpoint's is a warning. */
static ebb_status resume(ebb_trainer *t) {
    const char *ck = t->o.resume;
    int same_kind = t->o.optimizer.kind == t->ci.optimizer.kind;
    ebb_status st = load_checkpoint_weights(ck, t->m);
    if (st == EBB_OK && same_kind) st = ebb_optimizer_load(t->opt, ck);
    state s = {0};
    if (st == EBB_OK) st = state_view(&s, t->m, t->opt);
    if (st == EBB_OK && same_kind && !same_options(&t->o.optimizer, &t->ci.optimizer)) {
        st = state_load_optimizer(&s, t->m, t->opt, &t->o.optimizer);
        state_free(&s); /* it borrowed the state the load replaced */
        if (st == EBB_OK) st = state_view(&s, t->m, t->opt);
    }
    if (st == EBB_OK)
        st = state_check_finite(&s, t->m, 0, t->o.allow_nonfinite ? warn_cb : NULL, t, ck);
    state_free(&s);
    if (st == EBB_ERR_ARG && strstr(ebb_errmsg(), "NaN or infinite"))
        return ebb_error_prefix("%s", ck);
    if (st != EBB_OK) return st;
    if (!same_kind)
        warn(t, "--override --optimizer %s: the %s state in %s is not used; %s starts without "
                "state",
             ebb_optimizer_kind_name(t->o.optimizer.kind),
             ebb_optimizer_kind_name(t->ci.optimizer.kind), ck,
             ebb_optimizer_kind_name(t->o.optimizer.kind));
    else if ((st = check_missing_state(t)) != EBB_OK)
        return st;
    zero_drop_others(t);
    if (t->ci.data && t->data && strcmp(t->ci.data, t->data))
        warn(t, "--data %s is not the data %s was trained on: %s now, %s then", t->o.data, ck,
             t->data, t->ci.data);
    return EBB_OK;
}

/* Steps per epoch, the run's last step and the step it starts from, with
 * their arithmetic checked: a checkpoint's step comes from a file. */
static ebb_status plan_steps(ebb_trainer *t) {
    const ebb_trainer_options *o = &t->o;
    int64_t n = t->s.samples = ebb_dataset_size(t->train), total = 0;
    int drop_last = o->drop_last || o->dist; /* a rank's share is whole batches */
    if (drop_last && n < o->batch)
        return ebb_error_set(EBB_ERR_ARG,
                             "--drop-last with --batch %lld leaves no step: %s has %lld samples",
                             (long long)o->batch, o->data, (long long)n);
    int64_t micro = t->micro_per_epoch =
        drop_last ? n / o->batch : n / o->batch + (n % o->batch != 0);
    int64_t per = t->s.steps_per_epoch = micro / t->accum + (micro % t->accum != 0);
    t->epoch_samples = drop_last ? micro * o->batch : n;
    t->s.step = t->ci.step;
    if (o->steps) total = o->steps;
    if ((!o->steps && __builtin_mul_overflow(o->epochs, per, &total)) ||
        (t->s.total_steps = total, samples_at(t, total) < 0))
        return ebb_error_set(EBB_ERR_ARG,
                             "%s %lld, %lld steps per epoch, batch %lld: the run's sample count "
                             "overflows 64 bits",
                             o->steps ? "--steps" : "--epochs",
                             (long long)(o->steps ? o->steps : o->epochs), (long long)per,
                             (long long)o->batch);
    if (t->s.step > total)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s is at step %lld, past the %lld steps of %s %lld: nothing to "
                             "train (ask for more steps)",
                             o->resume, (long long)t->s.step, (long long)total,
                             o->steps ? "--steps" : "--epochs",
                             (long long)(o->steps ? o->steps : o->epochs));
    t->epochs = total / per + (total % per != 0);
    t->trace_at = o->trace_step ? o->trace_step : t->s.step < total ? t->s.step + 1 : total;
    if (o->trace && (t->trace_at <= t->s.step || t->trace_at > total))
        return ebb_error_set(EBB_ERR_ARG, "--trace-step %lld: this run takes steps %llu to %lld",
                             (long long)t->trace_at, (unsigned long long)t->s.step + 1,
                             (long long)total);
    t->s.last_checkpoint = -1;
    t->shuffled_epoch = -1;
    return EBB_OK;
}

/* The learning-rate schedule, continued from where the checkpoint stopped
 * when it is the checkpoint's (another one starts afresh from the rate the
 * optimizer has). */
static ebb_status open_schedule(ebb_trainer *t) {
    const ebb_lr_schedule *s = t->o.schedule;
    if (!s) return EBB_OK;
    char text[256];
    if (s->kind == EBB_LR_ONE_CYCLE && s->total_steps < t->s.total_steps)
        return ebb_error_set(EBB_ERR_ARG, "--lr-schedule %s ends after step %lld; this run takes "
                                          "%lld steps",
                             ebb_lr_schedule_str(s, text, sizeof text), (long long)s->total_steps,
                             (long long)t->s.total_steps);
    ebb_status st = ebb_lr_scheduler_new(&t->sched, t->opt, s);
    if (st == EBB_OK && t->ci.has_schedule && !memcmp(s, &t->ci.schedule, sizeof *s))
        st = ebb_lr_scheduler_restore(t->sched, t->ci.schedule_steps, t->ci.schedule_lr,
                                      t->ci.schedule_base);
    return st == EBB_OK ? st
                        : ebb_error_prefix("--lr-schedule %s",
                                           ebb_lr_schedule_str(s, text, sizeof text));
}

/* The parameter group without weight decay, in the optimizer as the plan
 * counted it. */
static ebb_status set_no_decay(ebb_trainer *t) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && t->o.n_no_decay && i < ebb_model_param_count(t->m); i++)
        if (ebb_plan_param_trained(t->plan, i) && !ebb_plan_param_decays(t->plan, i))
            st = ebb_optimizer_set_weight_decay(t->opt, i, 0);
    return st;
}

/* The parameter groups at their own learning rate (ebb_trainer_options.lr_scale). */
static ebb_status set_lr_scales(ebb_trainer *t) {
    for (int k = 0; k < t->o.n_lr_scale; k++) {
        const char *e = t->o.lr_scale[k], *eq = e ? strrchr(e, '=') : NULL;
        char pattern[256], *end = NULL;
        double f = eq ? strtod(eq + 1, &end) : NAN;
        if (!eq || eq == e || (size_t)(eq - e) >= sizeof pattern || !end || end == eq + 1 ||
            *end || !isfinite(f) || f < 0)
            return ebb_error_set(EBB_ERR_ARG,
                                 "--lr-scale '%s': expected PATTERN=FACTOR with a factor >= 0 "
                                 "('*.bias=0.25')",
                                 e ? e : "(null)");
        snprintf(pattern, sizeof pattern, "%.*s", (int)(eq - e), e);
        int matched = 0;
        for (int i = 0; i < ebb_model_param_count(t->m); i++) {
            if (!ebb_plan_param_trained(t->plan, i) ||
                fnmatch(pattern, ebb_model_param_name(t->m, i), 0) != 0)
                continue;
            ebb_status st = ebb_optimizer_set_lr_scale(t->opt, i, f);
            if (st != EBB_OK)
                return st;
            matched++;
        }
        if (!matched)
            return ebb_error_set(EBB_ERR_ARG, "--lr-scale '%s' matches no trained parameter of %s",
                                 e, ebb_spec_file(t->f.spec));
    }
    return EBB_OK;
}

/* accumulate: a zeroed gradient buffer per trained parameter, held for the
 * run, and room for one micro-batch's gradients. */
static ebb_status open_accumulation(ebb_trainer *t) {
    int n = ebb_model_param_count(t->m);
    t->acc = calloc((size_t)n + 1, sizeof *t->acc);
    t->grads = calloc((size_t)n + 1, sizeof *t->grads);
    t->got = calloc((size_t)n + 1, 1);
    if (!t->acc || !t->grads || !t->got) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!ebb_plan_param_trained(t->plan, i)) continue;
        const ebb_tensor *p = ebb_model_param(t->m, ebb_model_param_name(t->m, i));
        ebb_shape sh = ebb_tensor_shape(p);
        ebb_status st = ebb_tensor_zeros(&t->acc[i], &sh, ebb_tensor_dtype(p), t->o.device);
        if (st != EBB_OK) return st;
        t->s.accumulate_bytes += ebb_tensor_numel(p) * (int64_t)ebb_dtype_size(ebb_tensor_dtype(p));
    }
    return EBB_OK;
}

/* Data parallel: every rank starts from rank 0's parameters (its buffers
 * included). */
static ebb_status broadcast_params(ebb_trainer *t) {
    int n = ebb_model_param_count(t->m);
    ebb_tensor **ps = malloc(sizeof *ps * ((size_t)n + 1));
    if (!ps) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) ps[i] = ebb_model_param(t->m, ebb_model_param_name(t->m, i));
    ebb_status st = ebb_dist_broadcast_(t->o.dist, ps, n, 0);
    free(ps);
    return st;
}

/* Data parallel: every rank must train the same plan with the same options
 * on the same data, or their gradients mean nothing together. Rank 0's
 * description is sent to every rank, each compares it with its own, and
 * then every rank learns whether any differed, so that all of them refuse
 * together (the one that differs naming what), before anything is trained. */
#define RUN_TEXT 1024
static ebb_status check_same_run(ebb_trainer *t) {
    const ebb_trainer_options *o = &t->o;
    int64_t numel = 0;
    for (int i = 0; i < ebb_model_param_count(t->m); i++)
        numel += ebb_tensor_numel(ebb_model_param(t->m, ebb_model_param_name(t->m, i)));
    /* ZeRO-1's plans differ by rank in their update steps only */
    int steps = 0;
    for (int i = 0; i < ebb_plan_step_count(t->plan); i++)
        steps += ebb_plan_step_at(t->plan, i)->kind != EBB_STEP_UPDATE;
    char mine[RUN_TEXT] = "", theirs[RUN_TEXT] = "";
    snprintf(mine, sizeof mine,
             "plan %s:%d-steps:%d-parameters:%lld-values batch %lld block %lld epochs %lld "
             "steps %lld seed %llu shuffle %d samples %lld optimizer %s lr %.17g "
             "weight-decay %.17g momentum %.17g precision %s loss-scale %.17g clip-grad-norm "
             "%.17g clip-grad-value %.17g zero %d",
             ebb_plan_name(t->plan), steps,
             ebb_model_param_count(t->m), (long long)numel, (long long)o->batch,
             (long long)o->block, (long long)o->epochs, (long long)o->steps,
             (unsigned long long)o->seed, o->shuffle, (long long)t->s.samples,
             ebb_optimizer_kind_name(o->optimizer.kind), o->optimizer.lr,
             o->optimizer.weight_decay, o->optimizer.momentum, ebb_precision_name(o->precision),
             o->loss_scale, o->clip_grad_norm, o->clip_grad_value, zero_sharded(o));
    ebb_shape sh = {1, {RUN_TEXT}};
    ebb_tensor *text = NULL, *bad = NULL;
    ebb_status st = ebb_tensor_from_host(&text, mine, sizeof mine, &sh, EBB_UINT8,
                                         ebb_dist_device(o->dist));
    if (st == EBB_OK) st = ebb_dist_broadcast_(o->dist, &text, 1, 0);
    if (st == EBB_OK) st = ebb_tensor_to_host(text, theirs, sizeof theirs);
    theirs[RUN_TEXT - 1] = '\0';
    /* the first word that differs, with the name before it */
    char why[512] = "";
    const char *a = mine, *b = theirs, *prev = "";
    size_t prev_len = 0;
    while (st == EBB_OK && *a && *b) {
        size_t la = strcspn(a, " "), lb = strcspn(b, " ");
        if (la != lb || strncmp(a, b, la) != 0) {
            snprintf(why, sizeof why, "%.*s %.*s here, %.*s on rank 0", (int)prev_len, prev,
                     (int)la, a, (int)lb, b);
            break;
        }
        prev = a;
        prev_len = la;
        for (a += la; *a == ' '; a++) continue;
        for (b += lb; *b == ' '; b++) continue;
    }
    if (st == EBB_OK && !why[0] && (*a || *b)) snprintf(why, sizeof why, "a longer description");
    double differs = why[0] ? 1.0 : 0.0;
    ebb_shape one = {1, {1}};
    if (st == EBB_OK)
        st = ebb_tensor_full(&bad, &one, differs, EBB_FLOAT64, ebb_dist_device(o->dist));
    if (st == EBB_OK) st = ebb_dist_allreduce_mean_(o->dist, &bad, 1);
    if (st == EBB_OK) st = ebb_tensor_to_host(bad, &differs, sizeof differs);
    ebb_tensor_free(text);
    ebb_tensor_free(bad);
    if (st != EBB_OK) return st;
    if (why[0])
        return ebb_error_set(EBB_ERR_ARG, "rank %d of %d is not training what rank 0 is: %s",
                             t->rank, t->world, why);
    if (differs > 0)
        return ebb_error_set(EBB_ERR_ARG, "rank %d of %d: another rank is not training what rank "
                             "0 is (its error says what differs)", t->rank, t->world);
    return EBB_OK;
}

static ebb_status trainer_open(ebb_trainer *t, const ebb_spec *spec) {
    ebb_trainer_options *o = &t->o;
    ebb_status st = check_options(o);
    if (st == EBB_OK) st = fields_init(&t->f, spec, o->loss, o->block);
    if (st == EBB_OK) st = check_block(&t->f);
    if (st == EBB_OK && o->resume) st = ebb_checkpoint_read_info(o->resume, &t->ci);
    if (st == EBB_OK) st = compile_plan(&t->f, o->batch, o, NULL, NULL, &t->infer);
    /* data parallel: each rank's step takes its share of the batch */
    t->world = o->dist ? ebb_dist_world_size(o->dist) : 1;
    t->rank = o->dist ? ebb_dist_rank(o->dist) : 0;
    t->local_batch = o->batch / t->world;
    if (st == EBB_OK && !o->evaluate_only)
        st = compile_plan(&t->f, t->local_batch, o, &o->optimizer, t->infer, &t->plan);
    if (st == EBB_OK && !o->evaluate_only) st = open_data(&t->f, o, o->data, t->infer, &t->train);
    if (st == EBB_OK && o->eval_data) st = open_data(&t->f, o, o->eval_data, t->infer, &t->test);
    t->s.per_token = per_token(&t->f, t->infer);
    if (st == EBB_OK && t->train && !(t->data = data_fields(t->train)))
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK)
        st = ebb_model_new(&t->m, t->plan ? t->plan : t->infer, o->device, o->seed);
    if (st == EBB_OK && o->weights) st = load_weights(t, o->weights);
    if (st != EBB_OK || o->evaluate_only) return st;
    t->scale_from = scaling_from(&t->f, o);
    if ((st = ebb_optimizer_new(&t->opt, t->m, &o->optimizer)) != EBB_OK ||
        (t->scale_from > 0 &&
         (st = ebb_optimizer_set_loss_scaling(
              t->opt, &(ebb_loss_scaling){.init_scale = t->scale_from})) != EBB_OK) ||
        (st = set_no_decay(t)) != EBB_OK || (st = set_lr_scales(t)) != EBB_OK ||
        (o->resume && (st = resume(t)) != EBB_OK) || (st = plan_steps(t)) != EBB_OK ||
        (st = open_schedule(t)) != EBB_OK)
        return st;
    if (!(t->order = malloc(sizeof *t->order * (size_t)t->s.samples)))
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    t->shard = t->order;
    t->shard_samples = t->s.samples / t->world;
    if (t->world > 1 && !(t->shard = malloc(sizeof *t->shard * (size_t)(t->shard_samples + 1))))
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (t->accum > 1 && (st = open_accumulation(t)) != EBB_OK) return st;
    if (o->dist && ((st = check_same_run(t)) != EBB_OK || (st = broadcast_params(t)) != EBB_OK))
        return st;
    t->s.planned_peak_bytes = ebb_plan_device_peak_bytes(t->plan, o->device);
    t->s.loss_scale = t->scale_from > 0 ? ebb_optimizer_loss_scale(t->opt) : 0;
    t->s.first_skip_why = t->skip_why;
    t->tty = o->progress && isatty(fileno(o->progress));
    return EBB_OK;
}

ebb_status ebb_trainer_open(ebb_trainer **out, const ebb_spec *spec,
                            const ebb_trainer_options *opts) {
    if (!out || !spec || !opts)
        return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_open: NULL argument");
    *out = NULL;
    ebb_trainer *t = calloc(1, sizeof *t);
    if (!t) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    t->o = *opts;
    if (opts->schedule) {
        t->schedule = *opts->schedule;
        t->o.schedule = &t->schedule;
    }
    t->s.first_skip_why = t->skip_why;
    t->s.best_value = NAN;
    t->accum = opts->accumulate > 1 ? opts->accumulate : 1;
    ebb_status st = trainer_open(t, spec);
    if (st != EBB_OK)
        st = ebb_spec_annotate_error(spec, st);
    else if (!opts->evaluate_only)
        st = open_keep_best(t);
    if (st != EBB_OK) {
        ebb_trainer_free(t);
        return st;
    }
    *out = t;
    return EBB_OK;
}

void ebb_trainer_free(ebb_trainer *t) {
    if (!t) return;
    free_tensors(t->ts, MAX_FIELDS);
    if (t->shard != t->order) free(t->shard);
    free(t->order);
    int np = t->m ? ebb_model_param_count(t->m) : 0;
    if (t->acc) free_tensors(t->acc, np);
    if (t->grads) free_tensors(t->grads, np);
    free(t->acc);
    free(t->grads);
    free(t->got);
    state_free(&t->undo);
    ebb_capture_free(t->cap);
    ebb_lr_scheduler_free(t->sched);
    ebb_optimizer_free(t->opt);
    ebb_model_free(t->m);
    ebb_dataset_free(t->train);
    ebb_dataset_free(t->test);
    free(t->data);
    free(t->best_path);
    ebb_checkpoint_info_free(&t->ci);
    ebb_plan_free(t->plan);
    ebb_plan_free(t->infer);
    free(t);
}

/* ---- progress ---- */

/* A mean loss as the progress prints it: "0.1234", or "-" when every step
 * it covers was skipped or it is not finite. */
static const char *fmt_loss(double sum, int64_t n, char *buf, size_t size) {
    double v = n ? sum / (double)n : NAN;
    snprintf(buf, size, isfinite(v) ? "%.4f" : "-", v);
    return buf;
}

/* " perplexity 12.34" of a mean per-token loss (the exponential of the
 * mean), "" when the loss is not per token. */
static const char *fmt_ppl(int per_tok, double sum, int64_t n, char *buf, size_t size) {
    double v = n ? exp(sum / (double)n) : NAN;
    if (!per_tok)
        buf[0] = '\0';
    else if (!isfinite(v))
        snprintf(buf, size, " perplexity -");
    else
        snprintf(buf, size, v < 1e4 ? " perplexity %.2f" : " perplexity %.4g", v);
    return buf;
}

static void fmt_eta(double s, char *buf, size_t size) {
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, size, "?");
    else if (s >= 3600)
        snprintf(buf, size, "%d:%02d:%02d", (int)(s / 3600), (int)(s / 60) % 60, (int)s % 60);
    else
        snprintf(buf, size, "%d:%02d", (int)(s / 60), (int)s % 60);
}

/* The start line's memory figures: what a memory budget, accumulation or
 * clipping make of the step's peak, as this run's device counts it, which
 * `ebb plan` prints and the steps measure. The plan knows the figures
 * without recomputation or clipping as the larger of the CPU and CUDA
 * counts only: off CUDA they are about the device's peak plus the
 * difference the larger counts give. */
static void print_peaks(const ebb_trainer *t, FILE *f) {
    ebb_remat_stats rs;
    char bb[32], pk[32], nb[32];
    int64_t peak = t->s.planned_peak_bytes; /* ebb_plan_device_peak_bytes() */
    int cuda = t->o.device.type == EBB_DEVICE_CUDA;
    if (t->o.memory_budget && ebb_plan_remat_stats(t->plan, &rs) == EBB_OK)
        fprintf(f,
                "memory budget %s: the step's peak %s, %s%s keeping every activation; %d steps "
                "recomputed, %.0f%% more compute\n",
                rs.budget == EBB_MEMORY_BUDGET_LEAST ? "least"
                                                     : ebb_bytes_str(rs.budget, bb, sizeof bb),
                ebb_bytes_str(peak, pk, sizeof pk), cuda ? "" : "about ",
                ebb_bytes_str(rs.no_recompute_peak_bytes - (rs.peak_bytes - peak), nb, sizeof nb),
                rs.n_recompute_steps,
                rs.flops ? 100.0 * (double)rs.recompute_flops / (double)rs.flops : 0.0);
    if (t->accum > 1)
        fprintf(f, "accumulate %lld: %lld micro-batches of %lld samples a step (%lld samples), "
                   "each through the gradient plan (peak %s), summed into %s of gradient buffers "
                   "held beside the parameters\n",
                (long long)t->accum, (long long)t->accum, (long long)t->o.batch,
                (long long)(t->accum * t->o.batch), ebb_bytes_str(peak, pk, sizeof pk),
                ebb_bytes_str(t->s.accumulate_bytes, nb, sizeof nb));
    if (t->o.clip_grad_norm > 0 && t->accum == 1)
        fprintf(f,
                "clip_grad_norm %g: the updates wait for the whole backward: the step's peak %s, "
                "%s%s without clipping\n",
                t->o.clip_grad_norm, ebb_bytes_str(peak, pk, sizeof pk), cuda ? "" : "about ",
                ebb_bytes_str(peak - ebb_plan_clip_cost_bytes(t->plan), nb, sizeof nb));
}

static void print_start(const ebb_trainer *t) {
    FILE *f = t->o.progress;
    if (!f) return;
    char sched[256] = "";
    size_t at = 0;
    if (t->sched) {
        memcpy(sched, ", schedule ", 12);
        ebb_lr_schedule_str(&t->schedule, sched + 11, sizeof sched - 11);
        at = strlen(sched);
    }
    if (t->scale_from > 0 && at < sizeof sched)
        at += (size_t)snprintf(sched + at, sizeof sched - at, ", loss scale %g (dynamic)",
                               ebb_optimizer_loss_scale(t->opt));
    if (t->o.clip_grad_norm > 0 && at < sizeof sched)
        at += (size_t)snprintf(sched + at, sizeof sched - at, ", clip_grad_norm %g",
                               t->o.clip_grad_norm);
    if (t->o.clip_grad_value > 0 && at < sizeof sched)
        at += (size_t)snprintf(sched + at, sizeof sched - at, ", clip_grad_value %g",
                               t->o.clip_grad_value);
    for (int k = 0; k < t->o.n_no_decay && at < sizeof sched; k++)
        at += (size_t)snprintf(sched + at, sizeof sched - at, "%s%s",
                               k ? " " : ", no weight decay for ", t->o.no_decay[k]);
    for (int k = 0; k < t->o.n_lr_scale && at < sizeof sched; k++)
        at += (size_t)snprintf(sched + at, sizeof sched - at, "%s%s",
                               k ? " " : ", lr scaled for ", t->o.lr_scale[k]);
    int threads = ebb_tensor_num_threads(); /* on a CUDA device too: the host's side */
    if (at < sizeof sched)
        at += (size_t)snprintf(sched + at, sizeof sched - at, ", %d thread%s", threads,
                               threads == 1 ? "" : "s");
    fprintf(f, "training %s on %s: %lld samples, batch %lld, %lld steps per epoch, %s lr %g%s\n",
            ebb_spec_file(t->f.spec), t->o.data, (long long)t->s.samples,
            (long long)(t->o.batch * t->accum),
            (long long)t->s.steps_per_epoch, ebb_optimizer_kind_name(t->o.optimizer.kind),
            t->sched ? ebb_lr_scheduler_base_lr(t->sched) : ebb_optimizer_get_options(t->opt).lr,
            sched);
    print_peaks(t, f);
    if (t->s.step > 0)
        fprintf(f, "resumed from %s at step %lld%s\n", t->o.resume, (long long)t->s.step,
                t->s.step == t->s.total_steps ? ", the run's last: nothing to train" : "");
    fflush(f);
}

/* The log line every log_every steps, with the rate the step took (as its
 * event and the CSV and JSON lines give it), and on a terminal the progress
 * line. */
static void print_step(ebb_trainer *t, const ebb_train_event *ev) {
    FILE *f = t->o.progress;
    double rate = ev->samples_per_s;
    if (!f) return;
    char lb[32], eta[32], mb[32], pb[32], pp[48];
    int64_t e = (t->s.step - 1) / t->s.steps_per_epoch, step = t->s.step, total = t->s.total_steps;
    if (t->o.log_every && step % t->o.log_every == 0) {
        fmt_ppl(t->s.per_token, t->log_loss, t->log_n, pp, sizeof pp);
        if (!t->tty && t->sched)
            fprintf(f, "epoch %lld step %lld/%lld loss %s%s lr %.6g %.0f samples/s\n",
                    (long long)e + 1, (long long)step, (long long)total,
                    fmt_loss(t->log_loss, t->log_n, lb, sizeof lb), pp, ev->lr, rate);
        else if (!t->tty)
            fprintf(f, "epoch %lld step %lld/%lld loss %s%s %.0f samples/s\n", (long long)e + 1,
                    (long long)step, (long long)total,
                    fmt_loss(t->log_loss, t->log_n, lb, sizeof lb), pp, rate);
        t->log_loss = 0;
        t->log_n = 0;
        fflush(f); /* a log read as it is written (a pipe, tail -f) */
    }
    double now = now_s();
    if (t->tty && (now - t->last_draw > 0.2 || step == total)) {
        fmt_eta((double)(total - step) * (double)(t->o.batch * t->accum) / rate, eta, sizeof eta);
        fprintf(f,
                "\repoch %lld/%lld step %lld/%lld %.0f samples/s loss %s%s ETA %s peak %s/%s "
                "planned\033[K",
                (long long)e + 1, (long long)t->epochs, (long long)step, (long long)total, rate,
                fmt_loss(t->epoch_loss, t->epoch_n, lb, sizeof lb),
                fmt_ppl(t->s.per_token, t->epoch_loss, t->epoch_n, pp, sizeof pp), eta,
                ebb_bytes_str(t->s.measured_peak_bytes, mb, sizeof mb),
                ebb_bytes_str(t->s.planned_peak_bytes, pb, sizeof pb));
        fflush(f);
        t->last_draw = now;
    }
}

static void print_epoch(const ebb_trainer *t, const ebb_train_event *ev) {
    FILE *f = t->o.progress;
    if (!f) return;
    char lb[32], skips[64] = "", pp[48];
    if (t->tty) fprintf(f, "\n");
    if (ev->epoch_skipped)
        snprintf(skips, sizeof skips, ", %lld skipped", (long long)ev->epoch_skipped);
    fprintf(f, "epoch %lld: loss %s%s (%lld steps%s, %.1f s, %.0f samples/s)\n",
            (long long)ev->epoch, fmt_loss(ev->loss, 1, lb, sizeof lb),
            fmt_ppl(t->s.per_token, ev->loss, 1, pp, sizeof pp), (long long)ev->epoch_steps, skips,
            ev->seconds, ev->samples_per_s);
    if (ev->eval) {
        fputs("eval: ", f);
        metrics_line(ev->eval, f);
    }
    fflush(f);
}

/* ---- the steps ---- */

/* After a step, its loss must be finite, and with skip_nonfinite the state
 * it left too. The updates ran inside the backward, so the model has them
 * already: skip_nonfinite puts back the copy taken before the step and
 * counts it; otherwise the run fails, before anything is written. */
static ebb_status check_step(ebb_trainer *t, double loss, int *skipped) {
    char why[512] = "";
    *skipped = 0;
    if (!isfinite(loss)) {
        snprintf(why, sizeof why, "the loss is %s", isnan(loss) ? "NaN" : "infinite");
    } else if (t->o.skip_nonfinite) {
        state s = {0};
        ebb_status st = state_view(&s, t->m, t->opt);
        if (st == EBB_OK) st = state_check_finite(&s, t->m, 0, NULL, NULL, NULL);
        state_free(&s);
        if (st == EBB_ERR_ARG)
            snprintf(why, sizeof why, "the update left %s", ebb_errmsg());
        else if (st != EBB_OK)
            return st;
        /* data parallel: the ranks undo together (under ZeRO-1 each checked
         * only the state it holds) */
        double bad = why[0] ? 1 : 0;
        ebb_tensor *flag = NULL;
        ebb_shape one = {1, {1}};
        st = t->o.dist ? ebb_tensor_full(&flag, &one, bad, EBB_FLOAT64, ebb_dist_device(t->o.dist)) : EBB_OK;
        if (st == EBB_OK && flag) st = ebb_dist_allreduce_mean_(t->o.dist, &flag, 1);
        if (st == EBB_OK && flag) st = ebb_tensor_to_host(flag, &bad, sizeof bad);
        ebb_tensor_free(flag);
        if (st != EBB_OK) return st;
        if (bad > 0 && !why[0])
            snprintf(why, sizeof why, "another rank's update left a value that is not finite");
    }
    if (!why[0]) return EBB_OK;
    if (!t->o.skip_nonfinite) {
        char last[1024] = "";
        if (t->s.last_checkpoint > 0)
            snprintf(last, sizeof last, " (%s holds step %lld)", t->o.checkpoint,
                     (long long)t->s.last_checkpoint);
        t->s.nonfinite = 1;
        return ebb_error_set(EBB_ERR_RUNTIME,
                             "step %lld: %s, and the step's updates are in the model: training "
                             "stops, writing nothing%s; lower --lr, or --skip-nonfinite undoes "
                             "such steps",
                             (long long)t->s.step, why, last);
    }
    ebb_status st = state_restore(&t->undo, t->m, t->opt);
    if (st != EBB_OK) return st;
    zero_drop_others(t); /* the restore gave every parameter state */
    if (!t->s.skipped++) {
        t->s.first_skipped = t->s.step;
        snprintf(t->skip_why, sizeof t->skip_why, "%s", why);
    }
    *skipped = 1;
    return EBB_OK;
}

/* The samples of micro-batch m of an epoch: the first and how many. */
static int64_t micro_batch(const ebb_trainer *t, int64_t m, int64_t *at) {
    *at = m * t->local_batch;
    return t->shard_samples - *at < t->local_batch ? t->shard_samples - *at : t->local_batch;
}

/* data parallel: the ranks' mean of this rank's loss (the gradients were
 * averaged inside the step, by its all-reduce steps) */
static ebb_status dist_mean_loss(ebb_trainer *t, double *loss) {
    ebb_shape one = {1, {1}};
    ebb_tensor *l = NULL;
    ebb_status st = ebb_tensor_full(&l, &one, *loss, EBB_FLOAT64, ebb_dist_device(t->o.dist));
    if (st == EBB_OK) st = ebb_dist_allreduce_mean_(t->o.dist, &l, 1);
    if (st == EBB_OK) st = ebb_tensor_to_host(l, loss, sizeof *loss);
    ebb_tensor_free(l);
    return st;
}

/* accumulate with ranks: the step's summed gradients averaged over the
 * ranks, as the unaccumulated plan's bucket steps average them, in one
 * collective per dtype (under ZeRO-1 a reduce-scatter). The ranks first
 * agree on which parameters any of their micro-batches reached: one no rank
 * reached keeps no gradient (as torch skips a None .grad); one only others
 * reached adds zeros here. */
static ebb_status dist_mean_grads(ebb_trainer *t) {
    int np = ebb_model_param_count(t->m);
    double *any = calloc((size_t)np + 1, sizeof *any);
    if (!any) return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < np; i++) any[i] = t->got[i];
    ebb_shape sh = {1, {np}};
    ebb_tensor *flags = NULL;
    ebb_status st = ebb_tensor_from_host(&flags, any, sizeof *any * (size_t)np, &sh, EBB_FLOAT64,
                                         ebb_dist_device(t->o.dist));
    if (st == EBB_OK) st = ebb_dist_allreduce_mean_(t->o.dist, &flags, 1);
    if (st == EBB_OK) st = ebb_tensor_to_host(flags, any, sizeof *any * (size_t)np);
    ebb_tensor_free(flags);
    for (int i = 0; st == EBB_OK && i < np; i++) {
        if (!(any[i] > 0) || t->got[i] || !t->acc[i]) continue;
        ebb_tensor *z = NULL;
        ebb_shape ps = ebb_tensor_shape(t->acc[i]);
        st = ebb_tensor_zeros(&z, &ps, ebb_tensor_dtype(t->acc[i]), ebb_tensor_device(t->acc[i]));
        if (st == EBB_OK) st = ebb_tensor_copy_(t->acc[i], z);
        ebb_tensor_free(z);
        t->got[i] = 1;
    }
    free(any);
    for (int i = 0; i < np; i++)
        t->grads[i] = t->got[i] ? t->acc[i] : NULL;
    /* ZeRO-1: each rank needs the means of its own only */
    int *owner = NULL;
    if (st == EBB_OK && zero_sharded(&t->o)) {
        owner = malloc(((size_t)np + 1) * sizeof *owner);
        if (!owner) st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
        for (int i = 0; owner && i < np; i++) owner[i] = ebb_plan_param_owner(t->plan, i);
    }
    if (st == EBB_OK)
        st = owner ? ebb_dist_reduce_scatter_mean_(t->o.dist, t->grads, owner, np)
                   : ebb_dist_allreduce_mean_(t->o.dist, t->grads, np);
    free(owner);
    for (int i = 0; i < np; i++) t->grads[i] = NULL; /* borrowed */
    return st;
}

/* accumulate: micro-batches first .. first + n of epoch e through the
 * gradient plan, each micro-batch's loss scaled by its share of the step's
 * `total` samples, their gradients summed into the buffers (the first
 * copied, as PyTorch assigns .grad, then added), clipped, and one optimizer
 * step from the sums. *loss: the step's mean loss; *stats: the micro-batch
 * that measured most. */
static ebb_status accumulate_step(ebb_trainer *t, int64_t first, int64_t n, int64_t total,
                                  int traced, double *loss, ebb_run_stats *stats) {
    const ebb_trainer_options *o = &t->o;
    int np = ebb_model_param_count(t->m);
    ebb_status st = EBB_OK;
    memset(t->got, 0, (size_t)np);
    *loss = 0;
    for (int64_t k = 0; st == EBB_OK && k < n; k++) {
        int64_t at = 0, cnt = micro_batch(t, first + k, &at);
        /* a micro-batch's dropout masks: the run's seed and its place in the run */
        uint64_t micro = (uint64_t)(t->s.step * t->accum + k);
        ebb_run_options ro = {.seed = o->seed + 0x2545f4914f6cdd1dull * (micro + 1),
                              .trace = traced && k == 0 ? o->trace : NULL,
                              .trace_user = o->trace_user,
                              .loss_scale = (double)cnt / (double)total *
                                            (t->scale_from > 0 ? ebb_optimizer_loss_scale(t->opt)
                                                               : 1.0)};
        ebb_run_stats ms = {0};
        double l = NAN;
        st = make_batch(&t->f, t->train, t->shard + at, cnt, o->device, t->ts);
        if (st == EBB_OK)
            st = ebb_grad_keep_buffers(t->plan, t->m, t->ts, t->ts + t->f.n_in, &l, t->grads,
                                       &ro, &ms);
        free_tensors(t->ts, t->f.n);
        for (int i = 0; st == EBB_OK && i < np; i++) {
            if (!t->grads[i] || !t->acc[i]) continue;
            st = t->got[i] ? ebb_tensor_add_(t->acc[i], t->grads[i])
                           : ebb_tensor_copy_(t->acc[i], t->grads[i]);
            t->got[i] = 1;
        }
        free_tensors(t->grads, np);
        *loss += l * (double)cnt / (double)total;
        if (k == 0 || ms.measured_peak_bytes > stats->measured_peak_bytes || ms.over_step >= 0)
            *stats = ms;
    }
    if (st == EBB_OK && o->dist) st = dist_mean_grads(t);
    if (st == EBB_OK && o->dist) st = dist_mean_loss(t, loss);
    /* unscaling and clipping, as between the last backward() and step();
     * ZeRO-1: of this rank's share, the averaged gradients it has, agreeing
     * with the other ranks on the overflow check and the norm */
    int zero = zero_sharded(o);
    for (int i = 0; i < np; i++)
        t->grads[i] = t->got[i] && (!zero || zero_mine(t, i)) ? t->acc[i] : NULL;
    int overflow = 0;
    if (st == EBB_OK && t->scale_from > 0)
        st = zero ? ebb_optimizer_unscale_sharded_(t->opt, t->grads, np, o->dist, &overflow)
                  : ebb_optimizer_unscale_(t->opt, t->grads, np, &overflow);
    if (overflow) {
        for (int i = 0; i < np; i++) t->grads[i] = NULL;
        return st;
    }
    if (st == EBB_OK && o->clip_grad_norm > 0)
        st = zero ? ebb_dist_clip_grad_norm_(o->dist, t->grads, np, o->clip_grad_norm, NULL)
                  : ebb_tensor_clip_grad_norm_(t->grads, np, o->clip_grad_norm, NULL);
    for (int i = 0; st == EBB_OK && o->clip_grad_value > 0 && i < np; i++)
        if (t->grads[i]) {
            t->grads[i] = NULL;
            st = ebb_tensor_clip_grad_value(&t->grads[i], t->acc[i], o->clip_grad_value);
        }
    /* ZeRO-1: each rank updates its share, then sends it to the others */
    if (st == EBB_OK) st = ebb_optimizer_step(t->opt, t->grads);
    if (st == EBB_OK && zero_sharded(o)) st = zero_broadcast(t);
    for (int i = 0; i < np; i++)
        if (t->grads[i] == t->acc[i]) t->grads[i] = NULL; /* borrowed */
    free_tensors(t->grads, np);
    return st;
}

/* One whole step on samples order[at .. at + cnt): eager, or replayed from
 * the captured CUDA graph (cuda_graph: full batches, made at the first; a
 * graph is not measured, so such a step reports its plan). */
static ebb_status whole_step(ebb_trainer *t, int64_t at, int64_t cnt, int graphed,
                             const ebb_run_options *ro, double *loss, ebb_run_stats *stats) {
    const ebb_trainer_options *o = &t->o;
    ebb_tensor **in = t->ts, **tg = t->ts + t->f.n_in;
    ebb_status st = make_batch(&t->f, t->train, t->shard + at, cnt, o->device, t->ts);
    if (st == EBB_OK && graphed && !t->cap)
        st = ebb_train_capture(&t->cap, t->plan, t->m, t->opt, in, tg, o->seed);
    if (st == EBB_OK && graphed) {
        st = ebb_capture_train_step(t->cap, in, tg, loss);
        *stats = (ebb_run_stats){.planned_peak_bytes = t->s.planned_peak_bytes, .over_step = -1};
    } else if (st == EBB_OK) {
        st = ebb_train_step_ex(t->plan, t->m, t->opt, in, tg, loss, ro, stats);
    }
    if (st == EBB_OK && o->dist) st = dist_mean_loss(t, loss);
    return st;
}

/* The training step proper on the next batch (accumulate: micro-batches):
 * *ev gets its event. */
static ebb_status run_step(ebb_trainer *t, ebb_train_event *ev, ebb_run_stats *stats) {
    const ebb_trainer_options *o = &t->o;
    int64_t per = t->s.steps_per_epoch, e = t->s.step / per, first = t->s.step % per * t->accum;
    int64_t n_micro = t->micro_per_epoch - first < t->accum ? t->micro_per_epoch - first : t->accum;
    /* `at`: the first of the step's samples in this rank's share */
    int64_t at = 0, cnt = 0, unused;
    for (int64_t k = 0; k < n_micro; k++)
        cnt += micro_batch(t, first + k, k ? &unused : &at);
    int traced = o->trace && t->s.step + 1 == t->trace_at;
    int graphed = o->cuda_graph && !traced && cnt == o->batch;
    double loss = NAN;
    if (e != t->shuffled_epoch) {
        ebb_dataset_order(t->order, t->s.samples,
                          o->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(e + 1)), o->shuffle);
        /* DistributedSampler's share: every world-th sample from this rank's */
        for (int64_t j = 0; t->world > 1 && j < t->shard_samples; j++)
            t->shard[j] = t->order[j * t->world + t->rank];
        t->shuffled_epoch = e;
    }
    ebb_run_options ro = {.seed = o->seed,
                          .trace = traced ? o->trace : NULL,
                          .trace_user = o->trace_user,
                          .dist = o->dist};
    int64_t overflows = ebb_optimizer_scaled_skips(t->opt);
    ebb_status st = o->skip_nonfinite ? state_copy(&t->undo, t->m, t->opt) : EBB_OK;
    if (st == EBB_OK && t->accum > 1)
        st = accumulate_step(t, first, n_micro, cnt, traced, &loss, stats);
    else if (st == EBB_OK)
        st = whole_step(t, at, cnt, graphed, &ro, &loss, stats);
    free_tensors(t->ts, t->f.n);
    if (st != EBB_OK) {
        t->s.failed_step = t->s.step + 1;
        return ebb_spec_annotate_error(t->f.spec, st);
    }
    t->s.step++;
    t->s.done_steps++;
    t->s.replayed += graphed;
    double lr = ebb_optimizer_get_options(t->opt).lr;
    /* the next step's rate, as scheduler.step() after optimizer.step() */
    if (t->sched && (st = ebb_lr_scheduler_step(t->sched)) != EBB_OK)
        return ebb_error_prefix("step %lld", (long long)t->s.step);
    if (stats->measured_peak_bytes > t->s.measured_peak_bytes)
        t->s.measured_peak_bytes = stats->measured_peak_bytes;
    int over = stats->over_step >= 0 || stats->measured_peak_bytes > stats->planned_peak_bytes;
    t->s.over_plan += over;
    /* loss scaling skipped the updates: nothing changed, nothing to check */
    int overflowed = ebb_optimizer_scaled_skips(t->opt) > overflows;
    int skipped = overflowed;
    t->s.overflowed += overflowed;
    t->s.loss_scale = t->scale_from > 0 ? ebb_optimizer_loss_scale(t->opt) : 0;
    if (!overflowed && (st = check_step(t, loss, &skipped)) != EBB_OK) return st;
    *ev = (ebb_train_event){.kind = EBB_TRAIN_STEP,
                            .step = t->s.step,
                            .total_steps = t->s.total_steps,
                            .epoch = e + 1,
                            .epochs = t->epochs,
                            .samples = samples_at(t, t->s.step),
                            .batch = cnt * t->world,
                            .loss = skipped ? NAN : loss,
                            .lr = lr,
                            .skipped = skipped,
                            .overflowed = overflowed,
                            .traced = traced,
                            .replayed = graphed,
                            .over_plan = over,
                            .stats = stats};
    return EBB_OK;
}

static int stop_by(ebb_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int stop_by(ebb_trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->stop_reason, sizeof t->stop_reason, fmt, ap);
    va_end(ap);
    t->stop = 1;
    return 1;
}

/* Samples a second over steps from+1 .. to, taken in `secs`: the samples
 * those steps saw, a short last batch counted as it was. */
static double rate_of(const ebb_trainer *t, int64_t from, int64_t to, double secs) {
    return (double)(samples_at(t, to) - samples_at(t, from)) / (secs > 1e-9 ? secs : 1e-9);
}

/* Early stopping's count after epoch e, whose evaluation loss is `loss`. */
static void early_stop(ebb_trainer *t, int64_t e, double loss) {
    if (e == 1 || loss < t->best_loss - t->o.early_stop_min_delta) {
        t->best_loss = loss;
        t->best_epoch = e;
        t->bad_epochs = 0;
    } else if (++t->bad_epochs >= t->o.early_stop_patience) {
        stop_by(t,
                "early stopping after epoch %lld: the evaluation loss has not fallen more "
                "than %g below %.4f (epoch %lld) for %lld epochs",
                (long long)e, t->o.early_stop_min_delta, t->best_loss, (long long)t->best_epoch,
                (long long)t->bad_epochs);
        if (t->o.progress) fprintf(t->o.progress, "%s\n", t->stop_reason);
    }
}

/* Data parallel: rank 0's *v on every rank. */
static ebb_status dist_root_value(ebb_trainer *t, double *v) {
    ebb_shape one = {1, {1}};
    ebb_tensor *x = NULL;
    ebb_status st = ebb_tensor_full(&x, &one, *v, EBB_FLOAT64, ebb_dist_device(t->o.dist));
    if (st == EBB_OK) st = ebb_dist_broadcast_(t->o.dist, &x, 1, 0);
    if (st == EBB_OK) st = ebb_tensor_to_host(x, v, sizeof *v);
    ebb_tensor_free(x);
    return st;
}

static ebb_status write_checkpoint(ebb_trainer *t, const char *path);

/* keep_best at an epoch's end: the best checkpoint, when the epoch's figure
 * beats every earlier one. Data parallel: rank 0's figure decides for all
 * (each rank's evaluation uses its own batch_norm statistics, and ZeRO-1's
 * ranks must all take part in a checkpoint). */
static ebb_status keep_best(ebb_trainer *t, const ebb_train_event *ev) {
    const ebb_metrics *m = ev->eval; /* there for the eval_ figures (open_keep_best) */
    int k = t->best_kind;
    double v = k == BEST_LOSS        ? ev->loss
               : k == BEST_PPL       ? exp(ev->loss)
               : k == BEST_EVAL_LOSS ? m->loss
               : k == BEST_EVAL_PPL  ? m->perplexity
               : k == BEST_EVAL_ACC  ? m->accuracy
                                     : m->top_k_accuracy;
    ebb_status st = t->o.dist ? dist_root_value(t, &v) : EBB_OK;
    double was = t->s.best_value;
    int64_t was_step = t->s.best_step;
    if (st != EBB_OK || isnan(v) || !(isnan(was) || (best_is_max(k) ? v > was : v < was)))
        return st;
    /* the file records the best it holds */
    t->s.best_value = v;
    t->s.best_step = t->s.step;
    if ((st = write_checkpoint(t, t->best_path)) != EBB_OK) {
        t->s.best_value = was;
        t->s.best_step = was_step;
        return st;
    }
    if (t->o.progress)
        fprintf(t->o.progress, "%s %.6g, the best yet: checkpoint written to %s\n", t->o.keep_best,
                v, t->best_path);
    return EBB_OK;
}

/* An epoch's end: the evaluation, its line and event, early stopping, and
 * the checkpoints (none after a callback's stop). */
static ebb_status epoch_end(ebb_trainer *t) {
    ebb_metrics m = {0};
    int64_t e = (t->s.step - 1) / t->s.steps_per_epoch + 1;
    double secs = now_s() - t->t_epoch;
    ebb_status st = t->test ? ebb_trainer_evaluate(t, &m) : EBB_OK;
    if (st != EBB_OK) {
        if (t->tty) fprintf(t->o.progress, "\n");
        return st;
    }
    ebb_train_event ev = {.kind = EBB_TRAIN_EPOCH,
                          .step = t->s.step,
                          .total_steps = t->s.total_steps,
                          .epoch = e,
                          .epochs = t->epochs,
                          .samples = samples_at(t, t->s.step),
                          .loss = t->epoch_n ? t->epoch_loss / (double)t->epoch_n : NAN,
                          .epoch_steps = t->epoch_steps,
                          .epoch_skipped = t->epoch_skipped,
                          .seconds = secs,
                          .samples_per_s = rate_of(t, t->s.step - t->epoch_steps, t->s.step, secs),
                          .eval = t->test ? &m : NULL};
    print_epoch(t, &ev);
    if (t->o.on_epoch && t->o.on_epoch(t, &ev, t->o.user))
        t->callback_stop =
            stop_by(t, "stopped by the epoch callback after epoch %lld", (long long)e);
    if (!t->stop && t->o.early_stop_patience) early_stop(t, e, m.loss);
    if (!t->callback_stop && t->best_path) st = keep_best(t, &ev);
    if (st == EBB_OK && !t->callback_stop && t->o.checkpoint && !t->o.checkpoint_every)
        st = ebb_trainer_checkpoint(t, NULL);
    ebb_metrics_free(&m);
    t->epoch_loss = 0;
    t->epoch_n = t->epoch_steps = t->epoch_skipped = 0;
    t->t_epoch = now_s();
    return st;
}

ebb_status ebb_trainer_step(ebb_trainer *t, double *loss) {
    if (!t || t->o.evaluate_only)
        return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_step: %s",
                             t ? "the trainer was opened to evaluate only" : "NULL trainer");
    if (t->s.step >= t->s.total_steps)
        return ebb_error_set(EBB_ERR_ARG, "the run is at its last step, %lld",
                             (long long)t->s.total_steps);
    if (t->t0 == 0) t->t0 = t->t_epoch = now_s();
    ebb_run_stats stats = {0};
    ebb_train_event ev;
    ebb_status st = run_step(t, &ev, &stats);
    if (loss) *loss = st == EBB_OK ? ev.loss : NAN;
    if (st != EBB_OK) return st;
    int counted = !ev.skipped;
    t->log_loss += counted ? ev.loss : 0;
    t->epoch_loss += counted ? ev.loss : 0;
    t->log_n += counted;
    t->epoch_n += counted;
    t->epoch_steps++;
    t->epoch_skipped += !counted;
    ev.samples_per_s = rate_of(t, t->s.step - t->s.done_steps, t->s.step, now_s() - t->t0);
    if (t->o.on_step && t->o.on_step(t, &ev, t->o.user))
        t->callback_stop =
            stop_by(t, "stopped by the step callback at step %lld", (long long)t->s.step);
    print_step(t, &ev);
    int last = t->s.step == t->s.total_steps;
    /* a callback's stop ends the run here: no evaluation, nothing written */
    if (!t->stop && (t->s.step % t->s.steps_per_epoch == 0 || last) &&
        (st = epoch_end(t)) != EBB_OK)
        return st;
    /* the run's end (early stopping's too) gets its checkpoint */
    int due = last || t->stop || (t->o.checkpoint_every && t->s.step % t->o.checkpoint_every == 0);
    if (!t->callback_stop && due && t->o.checkpoint && t->s.last_checkpoint != t->s.step)
        st = ebb_trainer_checkpoint(t, NULL);
    return st;
}

ebb_status ebb_trainer_run(ebb_trainer *t) {
    if (!t || t->o.evaluate_only)
        return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_run: %s",
                             t ? "the trainer was opened to evaluate only" : "NULL trainer");
    t->stop = t->callback_stop = 0;
    t->stop_reason[0] = '\0';
    print_start(t);
    t->t0 = t->t_epoch = now_s();
    ebb_status st = EBB_OK;
    while (st == EBB_OK && !t->stop && t->s.step < t->s.total_steps)
        st = ebb_trainer_step(t, NULL);
    /* a run resumed at its last step still gets its checkpoint */
    if (st == EBB_OK && !t->callback_stop && t->o.checkpoint && t->s.last_checkpoint != t->s.step)
        st = ebb_trainer_checkpoint(t, NULL);
    return st;
}

ebb_status ebb_trainer_evaluate(ebb_trainer *t, ebb_metrics *out) {
    if (!t || !out) return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_evaluate: NULL argument");
    memset(out, 0, sizeof *out);
    if (!t->test) return ebb_error_set(EBB_ERR_ARG, "the trainer has no eval_data to evaluate");
    ebb_status st = evaluate(&t->f, t->infer, t->m, t->test, t->o.batch, t->o.top_k, out);
    return st == EBB_OK ? st : ebb_spec_annotate_error(t->f.spec, st);
}

/* ---- writing ---- */

/* Refuses to write a model (params_only) or a checkpoint holding NaN or
 * Inf: the file at `path` keeps what it had. */
static ebb_status refuse_nonfinite(const ebb_trainer *t, const state *s, int params_only,
                                   const char *who, const char *path) {
    ebb_status st = state_check_finite(s, t->m, params_only, NULL, NULL, NULL);
    if (st != EBB_ERR_ARG) return st;
    char why[1024];
    snprintf(why, sizeof why, "%s", ebb_errmsg());
    return ebb_error_set(EBB_ERR_ARG, "%s %s not written after step %lld: %s; it is left as it was",
                         who, path, (long long)t->s.step, why);
}

/* A checkpoint's __metadata__: what ebb_checkpoint_read_info() reads back. */
typedef struct ckpt_meta {
    char step[32], epoch[32], seed[32], batch[32], clip_norm[32], clip_value[32], accum[32];
    char no_decay[1024], sched[256], sched_steps[32], sched_lr[32], sched_base[32];
    char best_value[32], best_step[32];
    const char *pairs[2 * 24];
    int n; /* pairs */
} ckpt_meta;

static void meta_add(ckpt_meta *m, const char *key, const char *value) {
    m->pairs[2 * m->n] = key;
    m->pairs[2 * m->n + 1] = value;
    m->n++;
}

static void checkpoint_meta(const ebb_trainer *t, const char *stateless, ckpt_meta *m) {
    const ebb_trainer_options *o = &t->o;
    m->n = 0;
    m->no_decay[0] = '\0';
    for (int k = 0, at = 0; k < o->n_no_decay && at < (int)sizeof m->no_decay; k++)
        at += snprintf(m->no_decay + at, sizeof m->no_decay - (size_t)at, "%s%s", k ? "," : "",
                       o->no_decay[k]);
    snprintf(m->accum, sizeof m->accum, "%lld", (long long)t->accum);
    snprintf(m->clip_norm, sizeof m->clip_norm, "%.17g", o->clip_grad_norm);
    snprintf(m->clip_value, sizeof m->clip_value, "%.17g", o->clip_grad_value);
    snprintf(m->step, sizeof m->step, "%lld", (long long)t->s.step);
    snprintf(m->epoch, sizeof m->epoch, "%lld", (long long)(t->s.step / t->s.steps_per_epoch));
    snprintf(m->seed, sizeof m->seed, "%llu", (unsigned long long)o->seed);
    snprintf(m->batch, sizeof m->batch, "%lld", (long long)o->batch);
    meta_add(m, "ebb_checkpoint", "1");
    meta_add(m, "step", m->step);
    meta_add(m, "epoch", m->epoch);
    meta_add(m, "seed", m->seed);
    meta_add(m, "batch", m->batch);
    meta_add(m, "shuffle", o->shuffle ? "1" : "0");
    meta_add(m, "drop_last", o->drop_last ? "1" : "0");
    meta_add(m, "data", t->data);
    meta_add(m, "stateless", stateless);
    meta_add(m, "clip_grad_norm", m->clip_norm);
    meta_add(m, "clip_grad_value", m->clip_value);
    meta_add(m, "accumulate", m->accum);
    meta_add(m, "no_decay", m->no_decay);
    if (t->sched) {
        ebb_lr_schedule_str(&t->schedule, m->sched, sizeof m->sched);
        snprintf(m->sched_steps, sizeof m->sched_steps, "%lld",
                 (long long)ebb_lr_scheduler_steps(t->sched));
        snprintf(m->sched_lr, sizeof m->sched_lr, "%.17g", ebb_lr_scheduler_lr(t->sched));
        snprintf(m->sched_base, sizeof m->sched_base, "%.17g", ebb_lr_scheduler_base_lr(t->sched));
        meta_add(m, "lr_schedule", m->sched);
        meta_add(m, "lr_schedule_steps", m->sched_steps);
        meta_add(m, "lr_schedule_lr", m->sched_lr);
        meta_add(m, "lr_schedule_base", m->sched_base);
    }
    if (t->best_path) {
        snprintf(m->best_value, sizeof m->best_value, "%.17g", t->s.best_value);
        snprintf(m->best_step, sizeof m->best_step, "%lld", (long long)t->s.best_step);
        meta_add(m, "keep_best", o->keep_best);
        meta_add(m, "keep_best_value", m->best_value);
        meta_add(m, "keep_best_step", m->best_step);
    }
}

/* ebb_trainer_checkpoint() to `path`, leaving last_checkpoint alone. */
static ebb_status write_checkpoint(ebb_trainer *t, const char *path) {
    /* data parallel: rank 0 writes for all, ZeRO-1's ranks sending it their state first */
    int zero = zero_sharded(&t->o);
    if (t->rank != 0 && !zero) return EBB_OK;
    state s = {0};
    ebb_tensor **made = NULL;
    int n_made = 0;
    ebb_status st = t->rank == 0 ? state_view(&s, t->m, t->opt) : EBB_OK;
    if (st == EBB_OK && zero) st = zero_gather(t, &s, &made, &n_made);
    char *stateless = st == EBB_OK && t->rank == 0 ? stateless_params(t, s.steps) : NULL;
    if (st == EBB_OK && t->rank == 0 && !stateless)
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    const char *who = path == t->best_path ? "--keep-best" : "--checkpoint";
    if (st == EBB_OK && t->rank == 0) st = refuse_nonfinite(t, &s, 0, who, path);
    if (st == EBB_OK && t->rank == 0) {
        ckpt_meta meta;
        ebb_optimizer_options oo = ebb_optimizer_get_options(t->opt);
        checkpoint_meta(t, stateless, &meta);
        st = state_write(&s, t->m, &oo, path, 1, meta.pairs, meta.n);
    }
    state_free(&s);
    for (int k = 0; k < n_made; k++)
        ebb_tensor_free(made[k]);
    free(made);
    free(stateless);
    return st;
}

ebb_status ebb_trainer_checkpoint(ebb_trainer *t, const char *path) {
    if (!t || t->o.evaluate_only)
        return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_checkpoint: %s",
                             t ? "the trainer was opened to evaluate only" : "NULL trainer");
    if (!path) path = t->o.checkpoint;
    if (!path) return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_checkpoint: no path, and no "
                                                 "options.checkpoint");
    ebb_status st = write_checkpoint(t, path);
    /* every rank counts it, as rank 0 does: the ranks agree when the next is due */
    if (st == EBB_OK) t->s.last_checkpoint = t->s.step;
    return st;
}

ebb_status ebb_trainer_save_weights(const ebb_trainer *t, const char *path) {
    if (!t || !path) return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_save_weights: NULL argument");
    if (t->rank != 0) return EBB_OK; /* data parallel: rank 0 writes for all */
    state s = {0};
    ebb_status st = state_view(&s, t->m, NULL);
    if (st == EBB_OK) st = refuse_nonfinite(t, &s, 1, "--save-weights", path);
    state_free(&s);
    return st == EBB_OK ? ebb_model_save(t->m, path) : st;
}

/* ---- accessors ---- */

const char *ebb_trainer_stop_reason(const ebb_trainer *t) {
    return t && t->stop ? t->stop_reason : NULL;
}

ebb_trainer_stats ebb_trainer_get_stats(const ebb_trainer *t) {
    ebb_trainer_stats s = {.first_skip_why = "", .last_checkpoint = -1, .best_value = NAN};
    if (!t) return s;
    s = t->s;
    if (t->train && s.steps_per_epoch > 0) {
        s.epoch_samples = t->epoch_samples;
        s.samples_seen = samples_at(t, s.step);
        s.samples_total = samples_at(t, s.total_steps);
    }
    return s;
}

ebb_model *ebb_trainer_model(const ebb_trainer *t) { return t ? t->m : NULL; }
ebb_optimizer *ebb_trainer_optimizer(const ebb_trainer *t) { return t ? t->opt : NULL; }
const ebb_plan *ebb_trainer_train_plan(const ebb_trainer *t) { return t ? t->plan : NULL; }
const ebb_plan *ebb_trainer_infer_plan(const ebb_trainer *t) { return t ? t->infer : NULL; }
const ebb_dataset *ebb_trainer_data(const ebb_trainer *t) { return t ? t->train : NULL; }
const ebb_dataset *ebb_trainer_eval_data(const ebb_trainer *t) { return t ? t->test : NULL; }
const ebb_trainer_options *ebb_trainer_get_options(const ebb_trainer *t) {
    return t ? &t->o : NULL;
}
ebb_lr_scheduler *ebb_trainer_scheduler(const ebb_trainer *t) { return t ? t->sched : NULL; }
