/* The trainer (include/ebb/trainer.h): a spec trained on a dataset with its
 * training plan, evaluated with its inference plan, checkpointed and
 * resumed. `ebb train` and `ebb eval` (src/cli/train.c) parse flags and
 * print; everything they run is here.
 *
 * Training never loses work: a step whose loss is not finite fails the run
 * before anything is written (or, with skip_nonfinite, is undone and
 * counted); no checkpoint or weights file is written with NaN or Inf in it.
 *
 * Layout: the trainer's phases, open, step, epoch end, run, then its
 * checkpoints written; what it calls is in the files below it
 * (training.h). */
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
#include <zlib.h>

#include "training.h"

/* ---- the trainer ------------------------------------------------------------------- */

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

/* --non-strict: a damaged tensor, read as the file has it */
static void warn_damaged(const char *path, const char *name, const char *message, void *user) {
    (void)path;
    (void)name;
    warn(user, "%s; --non-strict: read as it is", message);
}

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
    if (o->ema_decay != 0 && !(o->ema_decay > 0 && o->ema_decay < 1))
        return ebb_error_set(EBB_ERR_ARG, "ema_decay %g: the average's decay is between 0 and 1 "
                                          "(0.999, say), or 0 for none",
                             o->ema_decay);
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
    if (o->parallel.zero && !o->dist)
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

/* ---- ZeRO-1 (ebb_trainer_options.parallel.zero) ---- */

/* Whether this rank holds parameter i's optimizer state. */
static int zero_mine(const ebb_trainer *t, int i) {
    int owner = ebb_plan_param_owner(t->plan, i);
    return owner < 0 || owner == t->rank;
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
                if (!ebb_state_slot_used(&oo, k)) continue;
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
    ebb_status st =
        ebb_checkpoint_load_weights(ck, "", t->m, t->o.non_strict ? warn_damaged : NULL, t);
    if (st == EBB_OK && same_kind) st = ebb_optimizer_load(t->opt, ck);
    if (st == EBB_ERR_CORRUPT && t->o.non_strict) {
        /* the load replaces the state only when all of it is whole */
        warn(t, "%s; --non-strict: the optimizer starts without the checkpoint's state",
             ebb_errmsg());
        ebb_error_clear();
        st = EBB_OK;
    }
    state s = {0};
    if (st == EBB_OK) st = ebb_state_view(&s, t->m, t->opt);
    if (st == EBB_OK && same_kind && !same_options(&t->o.optimizer, &t->ci.optimizer)) {
        st = ebb_state_load_optimizer(&s, t->m, t->opt, &t->o.optimizer);
        ebb_state_free(&s); /* it borrowed the state the load replaced */
        if (st == EBB_OK) st = ebb_state_view(&s, t->m, t->opt);
    }
    if (st == EBB_OK)
        st = ebb_state_check_finite(&s, t->m, 0, t->o.allow_nonfinite ? warn_cb : NULL, t, ck);
    ebb_state_free(&s);
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
    /* early stopping goes on counting from where the run stopped */
    t->best_loss = t->ci.early_stop_best_loss;
    t->best_epoch = t->ci.early_stop_best_epoch;
    t->bad_epochs = t->ci.early_stop_bad_epochs;
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

/* CRC-32 of a list of patterns (--no-decay, --lr-scale, --freeze). */
static uint32_t crc_patterns(const char *const *v, int n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < n; i++)
        if (v[i]) crc = crc32(crc, (const Bytef *)v[i], (uInt)strlen(v[i]) + 1);
    return (uint32_t)crc;
}

/* CRC-32 of the learning-rate schedule's settings (0: none). */
static uint32_t crc_schedule(const ebb_lr_schedule *s) {
    if (!s) return 0;
    double v[] = {s->kind, (double)s->step_size, s->n_milestones, s->gamma, (double)s->t_max,
                  s->eta_min, (double)s->total_iters, s->start_factor, s->end_factor,
                  (double)s->warmup_steps, (double)s->total_steps, s->max_lr, s->pct_start};
    uLong crc = crc32(crc32(0L, Z_NULL, 0), (const Bytef *)v, sizeof v);
    for (int i = 0; i < s->n_milestones && i < EBB_MAX_MILESTONES; i++)
        crc = crc32(crc, (const Bytef *)&s->milestones[i], sizeof s->milestones[i]);
    return (uint32_t)crc;
}

/* CRC-32 of the training data's first samples (up to 8), every field as
 * its batch holds it: another dataset of the same size and shapes, or
 * another normalisation, differs here. */
static ebb_status crc_data(ebb_trainer *t, uint32_t *out) {
    int64_t idx[8], n = t->s.samples < 8 ? t->s.samples : 8;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    ebb_tensor *ts[MAX_FIELDS] = {0};
    ebb_status st = ebb_fields_make_batch(&t->f, t->train, idx, n, ebb_device_cpu(), ts);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int k = 0; st == EBB_OK && k < t->f.n; k++) {
        size_t bytes = ebb_tensor_nbytes(ts[k]);
        void *host = malloc(bytes ? bytes : 1);
        if (!host) st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
        if (st == EBB_OK) st = ebb_tensor_to_host(ts[k], host, bytes);
        if (st == EBB_OK) crc = crc32(crc, (const Bytef *)host, (uInt)bytes);
        free(host);
    }
    ebb_tensors_free(ts, t->f.n);
    *out = (uint32_t)crc;
    return st;
}

/* Data parallel: every rank must train the same plan with the same options
 * on the same data, or their gradients mean nothing together. Rank 0's
 * description is sent to every rank, each compares it with its own, and
 * then every rank learns whether any differed, so that all of them refuse
 * together (the one that differs naming what), before anything is trained.
 * The description names the plan's fingerprint (ebb_plan_fingerprint: the
 * spec as compiled, its ops and attributes), every option that changes the
 * arithmetic or meets the other ranks, and the data's fingerprint. */
#define RUN_TEXT 1024
static ebb_status check_same_run(ebb_trainer *t) {
    const ebb_trainer_options *o = &t->o;
    uint32_t data_crc = 0;
    ebb_status data_st = crc_data(t, &data_crc);
    if (data_st != EBB_OK) return data_st;
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
             "%.17g clip-grad-value %.17g zero %d plan-fingerprint %08x loss %s accumulate %d "
             "drop-last %d normalize %d:%.17g:%.17g no-decay %08x lr-scale %08x freeze %08x "
             "schedule %08x skip-nonfinite %d ema %.17g checkpoint-every %lld data %08x",
             ebb_plan_name(t->plan), steps, ebb_model_param_count(t->m), (long long)numel,
             (long long)o->batch, (long long)o->block, (long long)o->epochs, (long long)o->steps,
             (unsigned long long)o->seed, o->shuffle, (long long)t->s.samples,
             ebb_optimizer_kind_name(o->optimizer.kind), o->optimizer.lr, o->optimizer.weight_decay,
             o->optimizer.momentum, ebb_precision_name(o->precision), o->loss_scale,
             o->clip_grad_norm, o->clip_grad_value, ebb_zero_sharded(o),
             ebb_plan_fingerprint(t->plan), o->loss ? o->loss : "spec", (int)t->accum, o->drop_last,
             o->normalize, o->norm_mean, o->norm_std, crc_patterns(o->no_decay, o->n_no_decay),
             crc_patterns(o->lr_scale, o->n_lr_scale), crc_patterns(o->freeze, o->n_freeze),
             crc_schedule(o->schedule), o->skip_nonfinite, o->ema_decay,
             (long long)o->checkpoint_every, (unsigned)data_crc);
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

/* ---- the weights' moving average (ema_decay) ---- */

static ebb_status copy_params(ebb_model *to, const ebb_model *from) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(from); i++) {
        const char *n = ebb_model_param_name(from, i);
        st = ebb_tensor_copy_(ebb_model_param(to, n), ebb_model_param(from, n));
    }
    return st;
}

/* A model beside the trained one that holds its average: the checkpoint's
 * when the run resumed kept one, else a copy of the weights (which the
 * first step's average replaces). */
static ebb_status open_ema(ebb_trainer *t) {
    ebb_status st = ebb_model_new(&t->ema, t->plan, t->o.device, t->o.seed);
    if (st == EBB_OK && t->o.resume && t->ci.ema_decay > 0) {
        t->ema_updates = t->ci.ema_updates;
        return ebb_checkpoint_load_weights(t->o.resume, "ema.", t->ema,
                                           t->o.non_strict ? warn_damaged : NULL, t);
    }
    if (st == EBB_OK && t->o.resume)
        warn(t, "%s kept no average of the weights: --ema starts one from its weights",
             t->o.resume);
    return st == EBB_OK ? copy_params(t->ema, t->m) : st;
}

/* After a step that updated: each average moves (1 - decay) of the way to
 * its weight (lerp_, as get_ema_multi_avg_fn does, in place); the first
 * step copies the weights (AveragedModel's n_averaged == 0), and so does
 * every step for a tensor of integers. */
static ebb_status update_ema(ebb_trainer *t) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(t->m); i++) {
        const char *n = ebb_model_param_name(t->m, i);
        ebb_tensor *w = ebb_model_param(t->m, n), *avg = ebb_model_param(t->ema, n);
        ebb_dtype dt = ebb_tensor_dtype(w);
        int real = dt == EBB_FLOAT32 || dt == EBB_FLOAT64 || dt == EBB_FLOAT16 || dt == EBB_BFLOAT16;
        st = t->ema_updates == 0 || !real ? ebb_tensor_copy_(avg, w)
                                          : ebb_tensor_lerp_(avg, w, 1 - t->o.ema_decay);
    }
    t->ema_updates += st == EBB_OK;
    return st == EBB_OK ? st : ebb_error_prefix("the weights' average (ema_decay)");
}

/* What evaluation and save_weights read: the average when there is one. */
static const ebb_model *eval_model(const ebb_trainer *t) { return t->ema ? t->ema : t->m; }

static ebb_status trainer_open(ebb_trainer *t, const ebb_spec *spec) {
    ebb_trainer_options *o = &t->o;
    ebb_status st = check_options(o);
    if (st == EBB_OK) st = ebb_fields_init(&t->f, spec, o->loss, o->block);
    if (st == EBB_OK) st = ebb_fields_check_block(&t->f);
    if (st == EBB_OK && o->resume) st = ebb_checkpoint_read_info(o->resume, &t->ci);
    if (st == EBB_OK) st = ebb_fields_compile_plan(&t->f, o->batch, o, NULL, NULL, &t->infer);
    /* data parallel: each rank's step takes its share of the batch */
    t->world = o->dist ? ebb_dist_world_size(o->dist) : 1;
    t->rank = o->dist ? ebb_dist_rank(o->dist) : 0;
    t->local_batch = o->batch / t->world;
    if (st == EBB_OK && !o->evaluate_only)
        st = ebb_fields_compile_plan(&t->f, t->local_batch, o, &o->optimizer, t->infer, &t->plan);
    if (st == EBB_OK && !o->evaluate_only)
        st = ebb_fields_open_data(&t->f, o, o->data, t->infer, &t->train);
    if (st == EBB_OK && o->eval_data)
        st = ebb_fields_open_data(&t->f, o, o->eval_data, t->infer, &t->test);
    t->s.per_token = ebb_fields_per_token(&t->f, t->infer);
    if (st == EBB_OK && t->train && !(t->data = data_fields(t->train)))
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK)
        st = ebb_model_new(&t->m, t->plan ? t->plan : t->infer, o->device, o->seed);
    if (st == EBB_OK && o->weights) st = load_weights(t, o->weights);
    if (st != EBB_OK || o->evaluate_only) return st;
    t->scale_from = ebb_fields_scaling(&t->f, o);
    if ((st = ebb_optimizer_new(&t->opt, t->m, &o->optimizer)) != EBB_OK ||
        (t->scale_from > 0 &&
         (st = ebb_optimizer_set_loss_scaling(
              t->opt, &(ebb_loss_scaling){.init_scale = t->scale_from})) != EBB_OK) ||
        (st = set_no_decay(t)) != EBB_OK || (st = set_lr_scales(t)) != EBB_OK ||
        (o->resume && (st = resume(t)) != EBB_OK) || (st = plan_steps(t)) != EBB_OK ||
        (o->ema_decay > 0 && (st = open_ema(t)) != EBB_OK) ||
        (st = open_schedule(t)) != EBB_OK)
        return st;
    if (!(t->order = malloc(sizeof *t->order * (size_t)t->s.samples)))
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    t->shard = t->order;
    t->shard_samples = t->s.samples / t->world;
    if (t->world > 1 && !(t->shard = malloc(sizeof *t->shard * (size_t)(t->shard_samples + 1))))
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    t->s.accumulate_bytes = ebb_plan_grad_sums_bytes(t->plan);
    if (o->dist && ((st = check_same_run(t)) != EBB_OK || (st = broadcast_params(t)) != EBB_OK))
        return st;
    /* every rank's average starts from rank 0's weights, as they do */
    if (o->dist && t->ema && t->ema_updates == 0 && (st = copy_params(t->ema, t->m)) != EBB_OK)
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

ebb_status ebb_trainer_open_graph(ebb_trainer **out, const ebb_graph *g,
                                  const ebb_spec_field *fields, int n_fields,
                                  const ebb_trainer_options *opts) {
    if (!out || !g || !opts)
        return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_open_graph: NULL argument");
    *out = NULL;
    ebb_spec *spec = NULL;
    ebb_status st = ebb_spec_from_graph(&spec, g, fields, n_fields);
    if (st == EBB_OK) st = ebb_trainer_open(out, spec, opts);
    if (st != EBB_OK) {
        ebb_spec_free(spec);
        return st;
    }
    (*out)->own_spec = spec;
    return EBB_OK;
}

void ebb_trainer_free(ebb_trainer *t) {
    if (!t) return;
    ebb_tensors_free(t->ts, MAX_FIELDS);
    if (t->shard != t->order) free(t->shard);
    free(t->order);
    ebb_state_free(&t->undo);
    ebb_capture_free(t->cap);
    ebb_lr_scheduler_free(t->sched);
    ebb_optimizer_free(t->opt);
    ebb_model_free(t->m);
    ebb_model_free(t->ema);
    ebb_dataset_free(t->train);
    ebb_dataset_free(t->test);
    free(t->data);
    free(t->best_path);
    ebb_checkpoint_info_free(&t->ci);
    ebb_plan_free(t->plan);
    ebb_plan_free(t->infer);
    ebb_spec_free(t->own_spec);
    free(t);
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
        ebb_status st = ebb_state_view(&s, t->m, t->opt);
        if (st == EBB_OK) st = ebb_state_check_finite(&s, t->m, 0, NULL, NULL, NULL);
        ebb_state_free(&s);
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
    ebb_status st = ebb_state_restore(&t->undo, t->m, t->opt);
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
 * averaged inside the step, by its all-reduce steps), and with it whether
 * any rank's step callback asked to stop: the flag's mean, and the value
 * the askers returned (the same signal, as a rule: their mean). */
static ebb_status dist_mean_loss(ebb_trainer *t, double *loss) {
    double v[3] = {*loss, t->stop_wish != 0, t->stop_wish};
    ebb_shape three = {1, {3}};
    ebb_tensor *l = NULL;
    ebb_status st = ebb_tensor_from_host(&l, v, sizeof v, &three, EBB_FLOAT64,
                                         ebb_dist_device(t->o.dist));
    if (st == EBB_OK) st = ebb_dist_allreduce_mean_(t->o.dist, &l, 1);
    if (st == EBB_OK) st = ebb_tensor_to_host(l, v, sizeof v);
    ebb_tensor_free(l);
    *loss = v[0];
    if (st == EBB_OK && v[1] > 0) t->stop_heard = (int)lround(v[2] / v[1]);
    return st;
}

/* accumulate: micro-batches first .. first + n of the epoch, each a run of
 * the plan with its loss scaled by its share of the step's `total`
 * samples. The plan adds their gradients into the optimizer's sums, and
 * its last run goes on to average, unscale, clip and update from them.
 * *loss: the step's mean loss; *stats: the micro-batch that measured most. */
static ebb_status accumulate_step(ebb_trainer *t, int64_t first, int64_t n, int64_t total,
                                  int traced, double *loss, ebb_run_stats *stats) {
    const ebb_trainer_options *o = &t->o;
    ebb_status st = EBB_OK;
    *loss = 0;
    for (int64_t k = 0; st == EBB_OK && k < n; k++) {
        int64_t at = 0, cnt = micro_batch(t, first + k, &at);
        ebb_run_options ro = {.seed = o->seed,
                              .trace = traced && k == 0 ? o->trace : NULL,
                              .trace_user = o->trace_user,
                              .loss_scale = (double)cnt / (double)total,
                              .dist = o->dist,
                              .micro_batch = (int)k,
                              .micro_batches = (int)n};
        ebb_run_stats ms = {0};
        double l = NAN;
        st = ebb_fields_make_batch(&t->f, t->train, t->shard + at, cnt, o->device, t->ts);
        if (st == EBB_OK)
            st = ebb_train_step_ex(t->plan, t->m, t->opt, t->ts, t->ts + t->f.n_in, &l, &ro, &ms);
        ebb_tensors_free(t->ts, t->f.n);
        *loss += l * (double)cnt / (double)total;
        if (k == 0 || ms.measured_peak_bytes > stats->measured_peak_bytes || ms.over_step >= 0)
            *stats = ms;
    }
    if (st == EBB_OK && o->dist) st = dist_mean_loss(t, loss);
    return st;
}

/* One whole step on samples order[at .. at + cnt): eager, or replayed from
 * the captured CUDA graph (cuda_graph: full batches, made at the first; a
 * graph is not measured, so such a step reports its plan). */
static ebb_status whole_step(ebb_trainer *t, int64_t at, int64_t cnt, int graphed,
                             const ebb_run_options *ro, double *loss, ebb_run_stats *stats) {
    const ebb_trainer_options *o = &t->o;
    ebb_tensor **in = t->ts, **tg = t->ts + t->f.n_in;
    ebb_status st = ebb_fields_make_batch(&t->f, t->train, t->shard + at, cnt, o->device, t->ts);
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
    ebb_status st = o->skip_nonfinite ? ebb_state_copy(&t->undo, t->m, t->opt) : EBB_OK;
    if (st == EBB_OK && t->accum > 1)
        st = accumulate_step(t, first, n_micro, cnt, traced, &loss, stats);
    else if (st == EBB_OK)
        st = whole_step(t, at, cnt, graphed, &ro, &loss, stats);
    ebb_tensors_free(t->ts, t->f.n);
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
    if (t->ema && !skipped && (st = update_ema(t)) != EBB_OK) return st;
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
    if (t->best_epoch == 0 || loss < t->best_loss - t->o.early_stop_min_delta) {
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
    double secs = ebb_now_seconds() - t->t_epoch;
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
    ebb_progress_epoch(t, &ev);
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
    t->t_epoch = ebb_now_seconds();
    return st;
}

ebb_status ebb_trainer_step(ebb_trainer *t, double *loss) {
    if (!t || t->o.evaluate_only)
        return ebb_error_set(EBB_ERR_ARG, "ebb_trainer_step: %s",
                             t ? "the trainer was opened to evaluate only" : "NULL trainer");
    if (t->s.step >= t->s.total_steps)
        return ebb_error_set(EBB_ERR_ARG, "the run is at its last step, %lld",
                             (long long)t->s.total_steps);
    if (t->t0 == 0) t->t0 = t->t_epoch = ebb_now_seconds();
    /* a step after a stop (early stopping's, a callback's) is the caller
     * going on: the stop was that step's news, not this one's */
    if (t->callback_stop) t->s.stopped_by = t->stop_wish = t->stop_heard = 0;
    t->stop = t->callback_stop = 0;
    t->stop_reason[0] = '\0';
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
    ev.samples_per_s =
        rate_of(t, t->s.step - t->s.done_steps, t->s.step, ebb_now_seconds() - t->t0);
    int wish = t->o.on_step ? t->o.on_step(t, &ev, t->o.user) : 0;
    if (wish && t->world > 1 && !t->stop_wish) /* told with the next step's loss */
        t->stop_wish = wish;
    else if (wish && t->world <= 1)
        t->s.stopped_by = wish;
    if (t->world > 1 && t->stop_heard) /* every rank stops here, together */
        t->s.stopped_by = t->stop_heard;
    if (t->s.stopped_by)
        t->callback_stop =
            stop_by(t, "stopped by the step callback%s at step %lld",
                    t->world > 1 && !t->stop_wish ? " of another rank" : "", (long long)t->s.step);
    ebb_progress_step(t, &ev);
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
    t->s.stopped_by = t->stop_wish = t->stop_heard = 0;
    t->stop_reason[0] = '\0';
    ebb_progress_start(t);
    t->t0 = t->t_epoch = ebb_now_seconds();
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
    ebb_status st =
        ebb_metrics_evaluate(&t->f, t->infer, eval_model(t), t->test, t->o.batch, t->o.top_k, out);
    return st == EBB_OK ? st : ebb_spec_annotate_error(t->f.spec, st);
}

/* ---- writing ---- */

/* Refuses to write a model (params_only) or a checkpoint holding NaN or
 * Inf: the file at `path` keeps what it had. */
static ebb_status refuse_nonfinite(const ebb_trainer *t, const state *s, int params_only,
                                   const char *who, const char *path) {
    ebb_status st = ebb_state_check_finite(s, t->m, params_only, NULL, NULL, NULL);
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
    char best_value[32], best_step[32], stop_loss[32], stop_epoch[32], stop_bad[32];
    char ema_decay[32], ema_updates[32];
    const char *pairs[2 * 32];
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
    if (o->early_stop_patience > 0 && t->best_epoch > 0) {
        snprintf(m->stop_loss, sizeof m->stop_loss, "%.17g", t->best_loss);
        snprintf(m->stop_epoch, sizeof m->stop_epoch, "%lld", (long long)t->best_epoch);
        snprintf(m->stop_bad, sizeof m->stop_bad, "%lld", (long long)t->bad_epochs);
        meta_add(m, "early_stop_best_loss", m->stop_loss);
        meta_add(m, "early_stop_best_epoch", m->stop_epoch);
        meta_add(m, "early_stop_bad_epochs", m->stop_bad);
    }
    if (t->ema) {
        snprintf(m->ema_decay, sizeof m->ema_decay, "%.17g", o->ema_decay);
        snprintf(m->ema_updates, sizeof m->ema_updates, "%lld", (long long)t->ema_updates);
        meta_add(m, "ema_decay", m->ema_decay);
        meta_add(m, "ema_updates", m->ema_updates);
    }
}

/* ebb_trainer_checkpoint() to `path`, leaving last_checkpoint alone. */
static ebb_status write_checkpoint(ebb_trainer *t, const char *path) {
    /* data parallel: rank 0 writes for all, ZeRO-1's ranks sending it their state first */
    int zero = ebb_zero_sharded(&t->o);
    if (t->rank != 0 && !zero) return EBB_OK;
    state s = {0};
    ebb_tensor **made = NULL;
    int n_made = 0;
    ebb_status st = t->rank == 0 ? ebb_state_view(&s, t->m, t->opt) : EBB_OK;
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
        st = ebb_state_write(&s, t->m, t->ema, &oo, path, 1, meta.pairs, meta.n);
    }
    ebb_state_free(&s);
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
    ebb_status st = ebb_state_view(&s, eval_model(t), NULL);
    if (st == EBB_OK) st = refuse_nonfinite(t, &s, 1, "--save-weights", path);
    ebb_state_free(&s);
    return st == EBB_OK ? ebb_model_save(eval_model(t), path) : st;
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
