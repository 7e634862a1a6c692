/* The lines a training run prints: the start, each logged step (redrawn
 * in place on a terminal), each epoch's end. */
#define _GNU_SOURCE /* strdup */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "training.h"

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
                   "each a run of the plan (peak %s) adding its gradients into %s of sums held "
                   "beside the parameters; the step's last goes on to the update\n",
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

void ebb_progress_start(const ebb_trainer *t) {
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

void ebb_progress_step(ebb_trainer *t, const ebb_train_event *ev) {
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
    double now = ebb_now_seconds();
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

void ebb_progress_epoch(const ebb_trainer *t, const ebb_train_event *ev) {
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
        ebb_metrics_line(ev->eval, f);
    }
    fflush(f);
}
