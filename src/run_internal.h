/* The executor's entry for every kind of plan (src/exec.c), shared with
 * the training calls (src/train.c). */
#ifndef EBB_RUN_INTERNAL_H
#define EBB_RUN_INTERNAL_H

#include "ebb/optim.h"
#include "ebb/run.h"

/* Runs any plan, training plans included: `inputs` holds the graph's inputs
 * followed by a training plan's targets; `opt` runs the update steps (NULL
 * for plans without any). Checks the model and the inputs as ebb_run() does. */
ebb_status ebb_run_plan(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                        ebb_tensor **outputs, const ebb_run_options *opts, ebb_run_stats *stats,
                        ebb_optimizer *opt);

/* ---- the key/value cache (src/kv_cache.c) ---------------------------------
 * Binds the cache's tensors into `slots` (per plan value) at the plan's
 * EBB_VALUE_STATE values, marked in `borrowed` as the caller's, refusing a
 * cache made for another plan (or none for a plan that needs one: the
 * message says which); c may be NULL for a plan without a cache. */
ebb_status ebb_kv_cache_bind(const ebb_kv_cache *c, const ebb_plan *plan, ebb_device device,
                             ebb_tensor **slots, unsigned char *borrowed);
/* A run that wrote `positions` more succeeded: they count as filled. */
ebb_status ebb_kv_cache_advance(ebb_kv_cache *c, int64_t positions);

/* The seed a step's random draws use in a run seeded with `run_seed`
 * (dropout's masks): what ebb_run_plan hands that step. */
uint64_t ebb_run_step_seed(const ebb_plan *plan, uint64_t run_seed, int step);

/* Refuses an optimizer whose kind or options differ from those the plan's
 * update steps were counted for (the message names the difference). */
ebb_status ebb_train_check_optimizer(const ebb_plan *plan, const ebb_optimizer *opt,
                                     const char *fn);

/* The run seed of a training step: the options' seed mixed with the
 * optimizer's step count, so that every step draws new masks. */
uint64_t ebb_train_run_seed(uint64_t seed, const ebb_optimizer *opt);

/* ---- gradient accumulation's sums (src/optim.c) ----------------------------
 * A plan compiled with ebb_train_options.accumulate adds each micro-batch's
 * gradients into a sum per parameter that the optimizer holds for the run
 * (EBB_STEP_GRAD_SUM), and the step's last micro-batch updates from them
 * (EBB_STEP_GRAD_SUMS). A sum's buffer is made at its first gradient and
 * kept; *made gets the bytes a call allocated (or released: negative),
 * which the run counts beside the parameters, as new optimizer state. */
/* The step's first micro-batch: no sum holds a gradient of it yet. */
void ebb_optimizer_sums_restart(ebb_optimizer *opt);
/* Adds g into parameter i's sum; the step's first gradient is copied. */
ebb_status ebb_optimizer_sum_add(ebb_optimizer *opt, int i, const ebb_tensor *g, int64_t *made);
/* Data parallel: parameter i's sum, which no micro-batch of this rank
 * reached and another rank's did, made zeros (a sum holding one stays). */
ebb_status ebb_optimizer_sum_zeros(ebb_optimizer *opt, int i, int64_t *made);
/* Parameter i's sum, borrowed; NULL when no gradient of this step reached it. */
ebb_tensor *ebb_optimizer_sum(const ebb_optimizer *opt, int i);
/* The bytes the sums' buffers hold. */
int64_t ebb_optimizer_sums_bytes(const ebb_optimizer *opt);

/* ---- an optimizer in a CUDA graph (src/optim.c) ----------------------------
 * A captured update cannot take its learning rate and bias corrections as
 * numbers: they would be recorded once. With the device hyperparameters on,
 * each update reads them from a small tensor on the device instead, which
 * ebb_optimizer_hyper_fill() writes for the next step before each replay. */
ebb_status ebb_optimizer_hyper_on(ebb_optimizer *opt, ebb_device device);
void ebb_optimizer_hyper_off(ebb_optimizer *opt);
ebb_status ebb_optimizer_hyper_fill(ebb_optimizer *opt);
/* Adds one to the step count of every parameter in `updated` (per
 * parameter, non-zero: updated), as a replayed step updates them. */
void ebb_optimizer_count_steps(ebb_optimizer *opt, const unsigned char *updated);

/* A copy of the parameters, the optimizer's state and its step counts, to
 * undo the updates of a capture's warm-up runs. */
typedef struct ebb_train_snapshot ebb_train_snapshot;
ebb_status ebb_train_snapshot_new(ebb_train_snapshot **out, ebb_model *model,
                                  const ebb_optimizer *opt);
ebb_status ebb_train_snapshot_restore(const ebb_train_snapshot *s, ebb_model *model,
                                      ebb_optimizer *opt);
/* Only the step counts (host values: a graph being recorded changes them). */
ebb_status ebb_train_snapshot_restore_counts(const ebb_train_snapshot *s, ebb_optimizer *opt);
int64_t ebb_train_snapshot_step_count(const ebb_train_snapshot *s, int param);
void ebb_train_snapshot_free(ebb_train_snapshot *s);
/* Frees parameter i's state and forgets its update count (ZeRO-1: a
 * parameter another rank owns, after a checkpoint gave it state). */
void ebb_optimizer_drop_state(ebb_optimizer *opt, int i);
/* Refuses what a CUDA graph cannot hold (EBB_ERR_UNSUPPORTED, naming it). */
ebb_status ebb_optimizer_check_capturable(const ebb_optimizer *opt, const char *fn);

/* ---- dynamic loss scaling (src/loss_scale.c) --------------------------------
 * GradScaler's state, held by an optimizer (ebb_optimizer_set_loss_scaling). */
typedef struct ebb_loss_scaler {
    int on;
    double scale;             /* what the next step's loss is multiplied by */
    double growth, backoff;   /* its factors */
    int interval;             /* good steps before it grows */
    int tracker;              /* good steps since it last changed */
    int64_t skips;            /* steps skipped for a gradient that was not finite */
} ebb_loss_scaler;
/* The optimizer's scaler (src/optim.c). */
ebb_loss_scaler *ebb_optimizer_scaler(ebb_optimizer *opt);
const ebb_loss_scaler *ebb_optimizer_scaler_const(const ebb_optimizer *opt);
/* Loss scaling's options checked, the message prefixed by `fn` (src/optim.c). */
ebb_status ebb_loss_scaling_check(const ebb_loss_scaling *o, const char *fn);
/* optim.scaler, as ebb_optimizer_save() writes it: a new float64 tensor. */
#define EBB_SCALER_NAME "optim.scaler"
ebb_status ebb_loss_scaler_tensor(ebb_tensor **out, const ebb_loss_scaler *s);
/* Its values back into *out, checked (the message names `path`). */
ebb_status ebb_loss_scaler_from(ebb_loss_scaler *out, const ebb_tensor *t, const char *fn,
                                const char *path);

#endif
