/* Dynamic loss scaling, torch.amp.GradScaler's rules (include/ebb/optim.h):
 * the scale backs off on every step with a gradient that is not finite, and
 * grows after growth_interval good steps in a row. Its arithmetic is
 * float32's, as GradScaler keeps the scale in a float32 tensor. */
#include <math.h>
#include <stdio.h>

#include "ebb/dist.h"
#include "ebb/optim.h"
#include "run_internal.h"

ebb_status ebb_optimizer_set_loss_scaling(ebb_optimizer *opt, const ebb_loss_scaling *o) {
    const char *fn = "ebb_optimizer_set_loss_scaling";
    if (!opt)
        return ebb_error_set(EBB_ERR_ARG, "%s: opt is NULL", fn);
    ebb_loss_scaling d = o ? *o : (ebb_loss_scaling){0};
    if (d.init_scale == 0) d.init_scale = 65536.0;
    if (d.growth_factor == 0) d.growth_factor = 2.0;
    if (d.backoff_factor == 0) d.backoff_factor = 0.5;
    if (d.growth_interval == 0) d.growth_interval = 2000;
    ebb_status st = ebb_loss_scaling_check(&d, fn);
    if (st != EBB_OK)
        return st;
    ebb_loss_scaler *s = ebb_optimizer_scaler(opt);
    *s = (ebb_loss_scaler){.on = 1,
                           .scale = (float)d.init_scale,
                           .growth = d.growth_factor,
                           .backoff = d.backoff_factor,
                           .interval = d.growth_interval,
                           .skips = s->skips};
    return EBB_OK;
}

double ebb_optimizer_loss_scale(const ebb_optimizer *opt) {
    const ebb_loss_scaler *s = opt ? ebb_optimizer_scaler_const(opt) : NULL;
    return s && s->on ? s->scale : 0.0;
}

int64_t ebb_optimizer_scaled_skips(const ebb_optimizer *opt) {
    return opt ? ebb_optimizer_scaler_const(opt)->skips : 0;
}

/* GradScaler.update() after a step that found_inf or not: the scale and the
 * good-step count move in float32, as _amp_update_scale_ moves them. */
static void update(ebb_loss_scaler *s, int found_inf) {
    if (found_inf) {
        s->scale = (float)((float)s->scale * (float)s->backoff);
        s->tracker = 0;
        s->skips++;
        return;
    }
    if (++s->tracker < s->interval)
        return;
    float grown = (float)s->scale * (float)s->growth;
    if (isfinite(grown))
        s->scale = grown;
    s->tracker = 0;
}

/* ebb_optimizer_unscale_(), and with a group `d` its sharded form: the
 * ranks agree whether any of them found a value that is not finite. */
static ebb_status unscale(const char *fn, ebb_optimizer *opt, ebb_tensor *const *grads, int n,
                          ebb_dist *d, int *skip) {
    if (skip) *skip = 0;
    if (!opt || !skip)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, opt ? "skip" : "opt");
    ebb_loss_scaler *s = ebb_optimizer_scaler(opt);
    if (!s->on)
        return ebb_error_set(EBB_ERR_ARG, "%s: loss scaling is off (ebb_optimizer_set_loss_scaling)",
                             fn);
    /* GradScaler's inverse: the reciprocal in float64, rounded to float32 */
    double inv = (float)(1.0 / s->scale);
    int found = 0;
    ebb_status st = ebb_tensor_unscale_(grads, n, inv, &found);
    double any = found || st != EBB_OK;
    if (d) {
        /* a rank that failed still takes part, so that the others are not
         * left waiting (they skip the step); its error stands */
        char why[512];
        snprintf(why, sizeof why, "%s", st != EBB_OK ? ebb_errmsg() : "");
        ebb_status ds = ebb_dist_sum(d, &any, 1);
        if (st != EBB_OK)
            ebb_error_set(st, "%s", why);
        else
            st = ds;
    }
    if (st != EBB_OK)
        return ebb_error_prefix("%s", fn);
    found = any > 0;
    update(s, found);
    *skip = found;
    return EBB_OK;
}

ebb_status ebb_optimizer_unscale_(ebb_optimizer *opt, ebb_tensor *const *grads, int n, int *skip) {
    return unscale("ebb_optimizer_unscale_", opt, grads, n, NULL, skip);
}

ebb_status ebb_optimizer_unscale_sharded_(ebb_optimizer *opt, ebb_tensor *const *grads, int n,
                                          ebb_dist *d, int *skip) {
    const char *fn = "ebb_optimizer_unscale_sharded_";
    if (!d) {
        if (skip) *skip = 0;
        return ebb_error_set(EBB_ERR_ARG, "%s: the group is NULL", fn);
    }
    return unscale(fn, opt, grads, n, d, skip);
}
