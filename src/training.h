/* Shared by the trainer's files, by level (include/ebb/trainer.h is the
 * API):
 *
 *   trainer.c     the trainer: open, a step, an epoch's end, the run,
 *                 its checkpoints written;
 *   progress.c    the lines a run prints;
 *   checkpoint.c  what a checkpoint holds (a `state`: every parameter and
 *                 its optimizer slots), read, written and restored;
 *   metrics.c     evaluation: predictions counted, losses averaged;
 *   fields.c      the spec's fields, batch shapes, the plans compiled for
 *                 them, the data opened and batches made.
 *
 * Each calls only the files below it. */
#ifndef EBB_TRAINING_H
#define EBB_TRAINING_H

#include <stdio.h>

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

/* ZeRO-1 shards the optimizer when there are ranks to shard it over. */
static inline int ebb_zero_sharded(const ebb_trainer_options *o) {
    return o->parallel.zero && o->dist && ebb_dist_world_size(o->dist) > 1;
}

/* Every parameter, its optimizer state (NULL where it has none) and its
 * update count. Either borrowed from the live model and optimizer
 * (ebb_state_view), or copies of them (ebb_state_copy: skip_nonfinite's undo). */
typedef struct state {
    int n, owned;
    ebb_tensor **t; /* [i * PER_PARAM]: parameter i; [i * PER_PARAM + 1 + k]: its slot k */
    int64_t *steps; /* [i]: parameter i's updates */
    ebb_loss_scaler scaler; /* the optimizer's loss scaling (written when on) */
} state;

typedef void (*warn_fn)(const char *message, void *user);

struct ebb_trainer {
    ebb_trainer_options o;
    ebb_spec *own_spec; /* ebb_trainer_open_graph's, freed with the trainer */
    ebb_model *ema;      /* the weights' moving average (o.ema_decay), or NULL */
    int64_t ema_updates; /* steps averaged into it */
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
    /* data parallel: this rank's step callback asked to stop (what it
     * returned), sent with the next step's loss; what any rank asked, heard */
    int stop_wish, stop_heard;
    char stop_reason[512];
    /* keep_best: its metric (an index of best_metrics) and the file it
     * keeps; the value and step are in s */
    int best_kind;
    char *best_path;
};

/* ---- src/fields.c: the spec's fields, batches, the plans compiled for them ---- */

ebb_status ebb_fields_init(fields *f, const ebb_spec *spec, const char *loss, int64_t block);

/* The loss is per token: a classifier's scores [B, T, V] against [B, T]
 * (a language model), whose mean loss exponentiated is its perplexity. */
int ebb_fields_per_token(const fields *f, const ebb_plan *infer);

/* The block sizes the first input's second dimension: a symbol it binds, or
 * a size the spec fixed, which it must equal. */
ebb_status ebb_fields_check_block(const fields *f);

/* Loss scaling's first scale for options o (ebb_trainer_options.loss_scale);
 * 0: none. */
double ebb_fields_scaling(const fields *f, const ebb_trainer_options *o);

/* The training plan when `optim` is given (with o's loss, clipping, frozen
 * parameters and memory budget), else the inference plan. */
ebb_status ebb_fields_compile_plan(const fields *f, int64_t batch, const ebb_trainer_options *o,
                                   const ebb_optimizer_options *optim, const ebb_plan *infer,
                                   ebb_plan **out);

/* A dataset for the spec: its shapes checked against the files' headers
 * before any data is read (a file of the wrong shape costs its header, not
 * its size), and no more data than this process can still get. */
ebb_status ebb_fields_open_data(const fields *f, const ebb_trainer_options *o, const char *desc,
                                const ebb_plan *infer, ebb_dataset **out);

void ebb_tensors_free(ebb_tensor **ts, int n);

/* Field tensors for samples index[0..count). */
ebb_status ebb_fields_make_batch(const fields *f, const ebb_dataset *d, const int64_t *index,
                                 int64_t count, ebb_device dev, ebb_tensor **ts);

double ebb_now_seconds(void);

/* A host copy of t as `dt` ([numel] values), or NULL with the error set. */
void *ebb_host_copy(const ebb_tensor *t, ebb_dtype dt, size_t elem);

/* ---- src/metrics.c: predictions counted, losses averaged ---- */

/* "accuracy 0.3512 top-5 0.7012 loss 2.4563 perplexity 11.66 on 38 samples
 * (2432 tokens)": an evaluation's line, as ebb eval and the epoch lines
 * print it. */
void ebb_metrics_line(const ebb_metrics *m, FILE *f);

/* The metrics of the model over a whole dataset, in file order, in batches
 * of `batch` run with the inference plan. */
ebb_status ebb_metrics_evaluate(const fields *f, const ebb_plan *plan, const ebb_model *model,
                                const ebb_dataset *d, int64_t batch, int top_k, ebb_metrics *m);

/* ---- src/checkpoint.c: what a checkpoint holds, read and written ---- */

void ebb_state_free(state *s);

ebb_status ebb_state_view(state *s, const ebb_model *m, const ebb_optimizer *opt);

/* s becomes a copy of the live state, reusing the tensors of its last copy. */
ebb_status ebb_state_copy(state *s, const ebb_model *m, const ebb_optimizer *opt);

/* Whether options `o` keep state slot k (ebb_optimizer_save()'s names). */
int ebb_state_slot_used(const ebb_optimizer_options *o, int k);

/* Writes s to `path`: the parameters under their names when with_params;
 * the optimizer state as ebb_optimizer_save() names it, under options oo (a
 * slot oo does not keep is left out, and so is all of a parameter's state
 * when it lacks a slot oo keeps: it starts afresh, as torch.optim's would);
 * the weights' average, when `ema` is given, as "ema." + each name; and
 * n_meta metadata pairs. */
ebb_status ebb_state_write(const state *s, const ebb_model *m, const ebb_model *ema,
                           const ebb_optimizer_options *oo, const char *path, int with_params,
                           const char *const *meta, int n_meta);

/* Replaces the optimizer's state and update counts with s's, under options
 * oo, through an anonymous file in memory: ebb_optimizer_load() is the one
 * call that sets them. */
ebb_status ebb_state_load_optimizer(const state *s, const ebb_model *m, ebb_optimizer *opt,
                                    const ebb_optimizer_options *oo);

/* Puts a copy back: the parameters (batch_norm's running statistics among
 * them), the optimizer's state and its update counts. */
ebb_status ebb_state_restore(const state *s, ebb_model *m, ebb_optimizer *opt);

/* EBB_ERR_ARG naming the first tensor of s (parameters only, or with the
 * optimizer state) that holds NaN or Inf; or, when warn is given, one
 * warning per such tensor ("FILE: ...") and EBB_OK. */
ebb_status ebb_state_check_finite(const state *s, const ebb_model *m, int params_only, warn_fn warn,
                                  void *user, const char *file);

/* Every parameter of the model, read from the checkpoint in place: the
 * tensor named `prefix` + its name ("": the weights; "ema.": their average).
 * A tensor that does not match its checksum is EBB_ERR_CORRUPT, or, when
 * `damaged` is not NULL, read as it is and reported to it. */
ebb_status ebb_checkpoint_load_weights(const char *path, const char *prefix, ebb_model *m,
                                       ebb_damaged_fn damaged, void *user);

/* ---- src/progress.c: the lines a run prints ---- */

void ebb_progress_start(const ebb_trainer *t);

/* The log line every log_every steps, with the rate the step took (as its
 * event and the CSV and JSON lines give it), and on a terminal the progress
 * line. */
void ebb_progress_step(ebb_trainer *t, const ebb_train_event *ev);

void ebb_progress_epoch(const ebb_trainer *t, const ebb_train_event *ev);

#endif
