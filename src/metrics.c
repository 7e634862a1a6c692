/* Evaluation: a plan run over a dataset, predictions counted per class,
 * losses averaged (ebb_metrics). */
#define _GNU_SOURCE /* strdup */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "training.h"

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

void ebb_metrics_line(const ebb_metrics *m, FILE *f) {
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
    ebb_metrics_line(m, f);
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
    double *score = ebb_host_copy(out, EBB_FLOAT64, sizeof(double));
    int64_t *label = score ? ebb_host_copy(target, EBB_INT64, sizeof(int64_t)) : NULL;
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

ebb_status ebb_metrics_evaluate(const fields *f, const ebb_plan *plan, const ebb_model *model,
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
        st = ebb_fields_make_batch(f, d, order + at, cnt, dev, ts);
        if (st == EBB_OK) st = ebb_run(plan, model, ts, &out, NULL);
        if (st == EBB_OK) st = batch_loss(f, out, ts[f->n_in], &l);
        if (st == EBB_OK && m->classes) st = count_predictions(m, out, ts[f->n_in]);
        ebb_tensor_free(out);
        ebb_tensors_free(ts, f->n);
        sum += l * (double)cnt;
    }
    free(order);
    if (st != EBB_OK) {
        ebb_metrics_free(m);
        return st;
    }
    m->samples = n;
    m->loss = sum / (double)n;
    m->perplexity = ebb_fields_per_token(f, plan) ? exp(m->loss) : NAN;
    double preds = m->predictions ? (double)m->predictions : 1.0;
    m->accuracy = m->classes ? m->accuracy / preds : NAN;
    m->top_k_accuracy = m->top_k ? m->top_k_accuracy / preds : NAN;
    return EBB_OK;
}
