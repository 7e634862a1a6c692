/* What a checkpoint holds of the model and its optimizer (a `state`),
 * written, read and restored; a checkpoint's record read back
 * (ebb_checkpoint_read_info). */
#define _GNU_SOURCE /* memfd_create, strdup */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "training.h"

/* ---- what a checkpoint holds of the model and its optimizer -------------------- */

void ebb_state_free(state *s) {
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
    ebb_state_free(s);
    return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
}

ebb_status ebb_state_view(state *s, const ebb_model *m, const ebb_optimizer *opt) {
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

ebb_status ebb_state_copy(state *s, const ebb_model *m, const ebb_optimizer *opt) {
    state live = {0};
    ebb_status st = ebb_state_view(&live, m, opt);
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
    ebb_state_free(&live);
    return st;
}

int ebb_state_slot_used(const ebb_optimizer_options *o, int k) {
    const char *name = ebb_optimizer_state_slot(o, k);
    return name && *name;
}

ebb_status ebb_state_write(const state *s, const ebb_model *m, const ebb_model *ema,
                           const ebb_optimizer_options *oo, const char *path, int with_params,
                           const char *const *meta, int n_meta) {
    int cap = s->n * (PER_PARAM + 1) + ebb_model_param_count(ema) + 2, n = 0;
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
            whole &= !ebb_state_slot_used(oo, k) || slot[k] != NULL;
        for (int k = 0; whole && st == EBB_OK && k <= N_SLOTS; k++) {
            if (k < N_SLOTS && !ebb_state_slot_used(oo, k)) continue;
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
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(ema); i++) {
        const char *pn = ebb_model_param_name(ema, i);
        size_t len = strlen(pn) + 8;
        if ((names[n] = malloc(len))) snprintf(names[n], len, "ema.%s", pn);
        ts[n++] = ebb_model_param(ema, pn);
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

ebb_status ebb_state_load_optimizer(const state *s, const ebb_model *m, ebb_optimizer *opt,
                                    const ebb_optimizer_options *oo) {
    int fd = memfd_create("ebb-optimizer-state", MFD_CLOEXEC);
    if (fd < 0)
        return ebb_error_set(EBB_ERR_IO, "cannot hold the optimizer state in memory: %s",
                             strerror(errno));
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ebb_status st = ebb_state_write(s, m, NULL, oo, path, 0, NULL, 0);
    if (st == EBB_OK) st = ebb_optimizer_load(opt, path);
    close(fd);
    return st;
}

ebb_status ebb_state_restore(const state *s, ebb_model *m, ebb_optimizer *opt) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < s->n; i++)
        st = ebb_tensor_copy_(ebb_model_param(m, ebb_model_param_name(m, i)), s->t[i * PER_PARAM]);
    ebb_optimizer_options oo = ebb_optimizer_get_options(opt);
    return st == EBB_OK ? ebb_state_load_optimizer(s, m, opt, &oo) : st;
}

/* The NaN and infinite elements of t (none in an integer tensor). */
static ebb_status count_nonfinite(const ebb_tensor *t, int64_t *bad) {
    ebb_dtype dt = ebb_tensor_dtype(t);
    *bad = 0;
    if (dt != EBB_FLOAT32 && dt != EBB_FLOAT64 && dt != EBB_FLOAT16 && dt != EBB_BFLOAT16)
        return EBB_OK;
    int wide = dt == EBB_FLOAT64;
    size_t n = (size_t)ebb_tensor_numel(t);
    void *buf =
        ebb_host_copy(t, wide ? EBB_FLOAT64 : EBB_FLOAT32, wide ? sizeof(double) : sizeof(float));
    if (!buf) return ebb_errcode();
    for (size_t i = 0; i < n; i++)
        *bad += wide ? !isfinite(((const double *)buf)[i]) : !isfinite(((const float *)buf)[i]);
    free(buf);
    return EBB_OK;
}

ebb_status ebb_state_check_finite(const state *s, const ebb_model *m, int params_only, warn_fn warn,
                                  void *user, const char *file) {
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

/* Early stopping's state, when the run recorded it: all three or none. */
static ebb_status read_early_stop(const ebb_safetensors *sf, const char *path,
                                  ebb_checkpoint_info *ci) {
    const char *loss = ebb_safetensors_metadata(sf, "early_stop_best_loss");
    if (!loss) return EBB_OK;
    char *end = NULL;
    double v = strtod(loss, &end);
    if (end == loss || *end || !isfinite(v) ||
        !meta_i64(sf, "early_stop_best_epoch", &ci->early_stop_best_epoch) ||
        !meta_i64(sf, "early_stop_bad_epochs", &ci->early_stop_bad_epochs) ||
        ci->early_stop_best_epoch < 1) {
        ci->early_stop_best_epoch = ci->early_stop_bad_epochs = 0;
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: early_stop_best_loss '%s' without a finite number, an epoch "
                             "from 1 in early_stop_best_epoch and a count in "
                             "early_stop_bad_epochs",
                             path, loss);
    }
    ci->early_stop_best_loss = v;
    return EBB_OK;
}

/* The weights' average's decay and updates, when the run kept one. */
static ebb_status read_ema(const ebb_safetensors *sf, const char *path, ebb_checkpoint_info *ci) {
    const char *decay = ebb_safetensors_metadata(sf, "ema_decay");
    if (!decay) return EBB_OK;
    char *end = NULL;
    double v = strtod(decay, &end);
    if (end == decay || *end || !(v > 0 && v < 1) ||
        !meta_i64(sf, "ema_updates", &ci->ema_updates) || ci->ema_updates < 0) {
        ci->ema_updates = 0;
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: ema_decay '%s' without a decay between 0 and 1 and a count "
                             "in ema_updates",
                             path, decay);
    }
    ci->ema_decay = v;
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
    else if (ci->step < 0 || ci->batch < 1 || (shuffle != 0 && shuffle != 1) ||
             (drop != 0 && drop != 1))
        st = ebb_error_set(EBB_ERR_ARG,
                           "%s: step %lld, batch %lld, shuffle %lld, drop_last %lld: a step is "
                           "0 or more, a batch 1 or more, shuffle and drop_last 0 or 1",
                           path, (long long)ci->step, (long long)ci->batch, (long long)shuffle,
                           (long long)drop);
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
    if (st == EBB_OK) st = read_early_stop(sf, path, ci);
    if (st == EBB_OK) st = read_ema(sf, path, ci);
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

ebb_status ebb_checkpoint_load_weights(const char *path, const char *prefix, ebb_model *m,
                                       ebb_damaged_fn damaged, void *user) {
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    char name[512];
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(m); i++) {
        const char *pn = ebb_model_param_name(m, i);
        snprintf(name, sizeof name, "%s%s", prefix, pn);
        if (!ebb_safetensors_dtype_str(sf, name))
            st = ebb_error_set(EBB_ERR_ARG, "%s: missing %s '%s'", path,
                               *prefix ? "average of parameter" : "parameter", name);
        else
            st = ebb_safetensors_load_into(sf, name, ebb_model_param(m, pn));
        if (st == EBB_ERR_CORRUPT && damaged) {
            damaged(path, name, ebb_errmsg(), user); /* read as the file has it */
            ebb_error_clear();
            st = EBB_OK;
        }
    }
    ebb_safetensors_close(sf);
    return st;
}
