/*
 * ebb/trainer.h - the training loop as a library: a spec trained on a
 * dataset for epochs or steps, evaluated with metrics, checkpointed and
 * resumed, with learning-rate schedules, callbacks and early stopping.
 * `ebb train` and `ebb eval` are thin clients of it.
 *
 *     ebb_spec *spec = NULL;
 *     ebb_trainer *t = NULL;
 *     ebb_metrics m = {0};
 *     ebb_trainer_options o = ebb_trainer_defaults();
 *     o.data = "fashion-mnist";
 *     o.eval_data = "fashion-mnist:test";        // evaluated after every epoch
 *     o.epochs = 2;
 *     o.progress = stdout;                       // `ebb train`'s progress and epoch lines
 *     if (ebb_spec_load(&spec, "specs/fashion_cnn.yaml") != EBB_OK ||
 *         ebb_trainer_open(&t, spec, &o) != EBB_OK || ebb_trainer_run(t) != EBB_OK ||
 *         ebb_trainer_evaluate(t, &m) != EBB_OK)
 *         fprintf(stderr, "%s\n", ebb_errmsg());
 *     ebb_metrics_print(&m, stdout);             // accuracy, top-5, per class, confusion
 *     ebb_metrics_free(&m);
 *     ebb_trainer_free(t);
 *     ebb_spec_free(spec);
 *
 * The spec says what a sample is: its `inputs:` and `targets:` (their
 * names, dtypes, and a symbolic first dimension, the batch) and its
 * `loss:`. A dataset (ebb/data.h) holds one field per input and target.
 *
 * Two plans, one model. The trainer compiles the spec twice at the batch
 * size: a training plan (forward, loss, backward and update, ebb/train.h)
 * and an inference plan (the forward alone). The model is made from the
 * training plan and holds every parameter the inference plan reads, so
 * evaluation runs the inference plan on the same model: it keeps no
 * activation for a backward, draws no dropout mask and updates no
 * batch_norm running statistics. A C program doing its own loop can do the
 * same: ebb_run(infer_plan, model_of_train_plan, ...).
 *
 * Partial batches. A plan compiled for batch B runs a batch from 1 to B
 * (ebb_run: sizes may differ where the ops allow it, which the batch
 * dimension almost always is; a reshape to a fixed size fails, naming its
 * node); its byte figures are for B, which bound the smaller batch's. So the last batch of an epoch, n mod B samples, is a step of its
 * own unless drop_last says to drop it, as torch's DataLoader does, and
 * evaluation's last batch is simply shorter.
 *
 * Language models. A spec whose output is per-token scores [B, T, V]
 * against [B, T] targets trains on text: data "text:FILE" and eval_data
 * "text:FILE:test" (byte tokens, the file's first 90% and last 10%,
 * ebb/data.h), `block` the sequence length T when the spec's is a symbol.
 * The loss is the mean over every token, evaluation counts every token, and
 * the metrics and progress lines give the perplexity, exp(loss).
 *
 * Order and seeds. Epoch e (from 0) visits the samples in the order
 * ebb_dataset_order() draws from seed ^ (0x9E3779B97F4A7C15 * (e + 1))
 * (file order without shuffle); the model's initial weights and dropout's
 * masks come from `seed` too. A run stopped and resumed from its checkpoint
 * reaches the same weights, to the bit, as one that ran straight through.
 *
 * Errors: every function returns an ebb_status and sets ebb_errmsg(),
 * naming the step, the file or the option. A failed step leaves the model
 * as ebb_train_step() says (updates inside the backward may have run) and
 * writes nothing.
 */
#ifndef EBB_TRAINER_H
#define EBB_TRAINER_H

#include <stdio.h>

#include "schedule.h"
#include "dist.h"
#include "spec.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_trainer ebb_trainer;

/* ---- metrics ------------------------------------------------------------ */

/* What an evaluation measured over a dataset. For a classifier (the spec's
 * loss is cross_entropy or nll) the prediction is the argmax of the output's
 * last dimension, compared with the class-index target element by element
 * (so a [B, T, C] output against [B, T] targets counts B*T predictions). */
typedef struct ebb_metrics {
    int64_t samples;     /* samples evaluated */
    int64_t predictions; /* predictions counted: samples times the target's other dimensions */
    double loss;         /* the loss op's mean, averaged over the samples */
    int64_t classes;     /* the output's last dimension; 0: not a classifier */
    double accuracy;     /* top-1; NAN when not a classifier */
    int top_k;           /* k of top_k_accuracy; 0: not counted (k >= classes, or not asked) */
    double top_k_accuracy; /* the target among the k highest scores (ties counted for it) */
    /* classes x classes counts, row the target class, column the predicted
     * one (the argmax); owned by the metrics, freed by ebb_metrics_free().
     * NULL when not a classifier. */
    int64_t *confusion;
    /* exp(loss), the perplexity, when the loss is per token (cross_entropy
     * or nll on a [B, T, V] output against [B, T] targets: a language
     * model, `predictions` counting its tokens); NAN otherwise */
    double perplexity;
} ebb_metrics;

/* Recall of class c: the predictions for targets of class c that were c,
 * from the confusion matrix. NAN when c has no target, is out of range, or
 * m holds no confusion matrix. */
EBB_API double ebb_metrics_class_accuracy(const ebb_metrics *m, int64_t c);
/* Frees the confusion matrix and zeroes *m. NULL m: no-op. */
EBB_API void ebb_metrics_free(ebb_metrics *m);
/* Writes the metrics as text: the accuracies, the loss (and its perplexity
 * for a per-token loss) on one line, then for a classifier a table of
 * per-class accuracy and the confusion matrix. */
EBB_API void ebb_metrics_print(const ebb_metrics *m, FILE *f);

/* ---- events and callbacks ----------------------------------------------- */

typedef enum ebb_train_event_kind {
    EBB_TRAIN_STEP,  /* after every training step */
    EBB_TRAIN_EPOCH, /* after an epoch's last step (and its evaluation) */
} ebb_train_event_kind;

/* What a callback is told. Steps and epochs count from 1, as the progress
 * line counts them; a resumed run continues the counts. */
typedef struct ebb_train_event {
    ebb_train_event_kind kind;
    int64_t step, total_steps; /* steps done, and the run's last step */
    int64_t epoch, epochs;     /* the epoch under way (ends), and the run's last */
    int64_t samples;           /* samples seen since step 0, this step's included */
    int64_t batch;             /* STEP: this step's samples (the last one may be partial) */
    double loss;   /* STEP: this step's loss, NAN when it was skipped; EPOCH: the epoch's
                      mean over the steps not skipped (NAN: none) */
    double lr;     /* STEP: the learning rate the step used */
    int skipped;   /* STEP: the step updated nothing: its loss or update was not finite
                      and it was undone (ebb_trainer_options.skip_nonfinite), or loss
                      scaling found a gradient that overflowed (overflowed) */
    int overflowed; /* STEP: loss scaling skipped the step's updates (see loss_scale) */
    int traced;    /* STEP: this step ran with ebb_trainer_options.trace */
    int replayed;  /* STEP: replayed from a CUDA graph (cuda_graph); not measured */
    int over_plan; /* STEP: it measured more than its plan promised (a bug in an op's
                      declared scratch; stats says where) */
    const ebb_run_stats *stats; /* STEP: measured and planned peak bytes */
    int64_t epoch_steps, epoch_skipped; /* EPOCH: its steps, and how many were skipped */
    double seconds;                     /* EPOCH: its time */
    double samples_per_s;  /* STEP: since the run began; EPOCH: over the epoch, as its
                              line prints it */
    const ebb_metrics *eval; /* EPOCH: the evaluation of eval_data; NULL without one */
} ebb_train_event;

/* Called with the trainer, the event and ebb_trainer_options.user. Return
 * 0 to go on, anything else to stop training after this event (nothing
 * more runs or is written; ebb_trainer_run() returns EBB_OK and
 * ebb_trainer_stop_reason() says the callback stopped it; a step
 * callback's value is ebb_trainer_stats.stopped_by). Data parallel: a
 * step callback's stop reaches every rank, which stop together one step
 * later (ebb_trainer_stats.stopped_by); an epoch callback's stops its own
 * rank only. */
typedef int (*ebb_train_callback)(ebb_trainer *t, const ebb_train_event *e, void *user);

/* ---- options -------------------------------------------------------------- */

typedef struct ebb_trainer_options {
    /* data: descriptions as ebb_dataset_open() takes them ("fashion-mnist",
     * "fashion-mnist:test", an IDX directory or pair, a safetensors file) */
    const char *data;      /* the training data; required unless evaluate_only */
    const char *eval_data; /* evaluated after every epoch, and by ebb_trainer_evaluate() */
    int evaluate_only;     /* compile the inference plan alone: no training, no
                              optimizer; ebb_trainer_evaluate() on eval_data */
    int normalize;         /* inputs become (x - norm_mean) / norm_std */
    double norm_mean, norm_std;

    /* how long */
    int64_t epochs; /* passes over the data (defaults: 1) */
    int64_t steps;  /* > 0: stop after this many steps instead */
    int64_t batch;  /* samples per step and per evaluation run (defaults: 64) */
    /* > 0: the sequence length: every input's symbolic second dimension is
     * bound to it (as batch binds the first), and a fixed one must equal
     * it. Text data ("text:FILE", ebb/data.h) is cut into windows of it; a
     * spec whose sequence is a symbol needs it there. 0: the spec's. */
    int64_t block;
    int drop_last;  /* drop each epoch's last partial batch */
    int shuffle;    /* a new order each epoch (defaults: 1) */
    uint64_t seed;  /* initial weights, order and dropout */

    /* the step */
    ebb_optimizer_options optimizer; /* defaults: AdamW, torch.optim's defaults, lr 1e-3 */
    const ebb_lr_schedule *schedule; /* NULL: a constant rate; copied at open */
    const char *loss;                /* this loss op instead of the spec's `loss:` */
    double clip_grad_norm;  /* > 0: clip the gradients' global L2 norm to it (see
                               ebb_train_options: the updates then wait for the backward) */
    double clip_grad_value; /* > 0: clamp every gradient to [-v, v] in its update */
    /* Gradient accumulation: > 1 makes each step `accumulate` micro-batches
     * of `batch` samples (the last step of an epoch may have fewer): each
     * micro-batch's gradients, scaled by its share of the step's samples,
     * are added into a buffer per trained parameter, and the optimizer
     * updates once from their sum, as PyTorch's loop of (loss / N).backward()
     * then step() does; the weights equal one step at the whole batch's
     * size, to rounding. Each micro-batch is a run of the training plan,
     * compiled with ebb_train_options.accumulate: it adds the gradients
     * into the optimizer's sums, and only the step's last goes on to the
     * update; the sums, one trained parameter's size each, are held for the
     * run beside the parameters (ebb_trainer_stats.accumulate_bytes).
     * Clipping applies to the sum. 0 or 1: none. Not with cuda_graph. */
    int accumulate;
    /* Frozen parameters: full names matched by any of these fnmatch(3)
     * patterns ("fc1.*", "*.bias") get no gradient, no update and no
     * optimizer state (ebb_train_options.trained holds the others). A
     * pattern that matches nothing, or freezing everything, is an error. */
    const char *const *freeze;
    int n_freeze;
    /* A parameter group without weight decay (torch.optim param groups):
     * fnmatch(3) patterns of full names ("*.bias", "*norm*.weight") whose
     * parameters update without it (ebb_train_options.no_decay). */
    const char *const *no_decay;
    int n_no_decay;
    /* Parameter groups at their own learning rate: "PATTERN=FACTOR", the
     * parameters whose full names match the fnmatch(3) pattern update at
     * FACTOR times the rate ("*.bias=0.25"), schedules moving every group's
     * rate in proportion (ebb_optimizer_set_lr_scale). A later entry wins
     * where patterns overlap; one matching no trained parameter, or a bad
     * factor, is an error. A checkpoint does not record them: give the
     * same ones to a resumed run. */
    const char *const *lr_scale;
    int n_lr_scale;
    int64_t memory_budget;           /* compile the step under it (ebb_compile_options) */
    ebb_precision precision;         /* mixed precision (ebb_compile_options.precision); by
                                        default the spec's `precision:` */
    /* Dynamic loss scaling (torch.amp.GradScaler, ebb/optim.h), starting
     * from this scale: > 0 turns it on; < 0 turns it off; 0 means on from
     * 65536 when the precision is fp16, off otherwise. A step whose
     * gradients overflow updates nothing and halves the scale (it is
     * counted, and is not a failure even when its loss is infinite); the
     * scale doubles after 2000 good steps. Checkpoints keep the scale. */
    double loss_scale;
    ebb_device device;               /* defaults: the CPU */
    int cuda_graph;     /* CUDA: replay full batches from a captured step (ebb_train_capture) */
    /* Data parallel (ebb/dist.h): this process is one rank of the group.
     * `batch` is the global batch, which the world size must divide; each
     * epoch's order (the same on every rank) is dealt out as
     * DistributedSampler deals it, sample i to rank i % world_size, so the
     * ranks' shares of a step make up the batch one process would take.
     * The training plan is compiled with ebb_train_options.parallel:
     * each rank computes its share's gradients, bucket by bucket they are
     * averaged over the ranks inside the backward, and every rank makes the
     * same updates: the weights one process would reach, to the order of
     * the sums. CPU only (Gloo). Every rank must train the same plan with
     * the same options on data of the same size: at open each compares its
     * own with rank 0's, and all refuse together (EBB_ERR_ARG), the rank
     * that differs naming what ("lr 0.25 here, 0.5 on rank 0"). Each epoch's last partial batch is dropped (as
     * drop_last). Rank 0's weights are broadcast at open; batch_norm's running
     * statistics stay each rank's own (DDP's broadcast_buffers=False). Only
     * rank 0 writes checkpoints and weights (the others' calls return
     * EBB_OK); every rank evaluates the whole eval_data. With accumulate,
     * each rank sums its micro-batches' gradients and the sums are averaged
     * over the ranks before the one update (one collective per dtype, the
     * buffers laid end to end beside the plan). With skip_nonfinite the
     * ranks undo a step together when any of them finds a value that is
     * not finite (under parallel.zero each checks the state it holds). Not with
     * cuda_graph. NULL: one process. */
    ebb_dist *dist;
    /* Data parallel, as ebb_parallel_options (ebb/plan.h) says: zero
     * (ZeRO-1), bucket_bytes and overlap. world and rank are dist's, which
     * the trainer sets. With zero each rank updates and keeps the state of
     * its share of the parameters, and sends them to the others after each
     * step; checkpoints still hold the whole state (rank 0 gathers it from
     * the others to write them), so a run resumes on any world size, with
     * or without it. */
    ebb_parallel_options parallel;
    /* mixed precision: where the backward gets the weights' low copies
     * (ebb_train_options.low_weight_copies); by default kept where free */
    ebb_low_copies low_weight_copies;
    int skip_nonfinite; /* undo and count a step whose loss or updated state is NaN or
                           infinite (else such a step fails the run, with nothing written) */
    ebb_trace_fn trace; /* a per-plan-step trace of one training step, or NULL */
    void *trace_user;
    int64_t trace_step; /* the step traced (from 1); 0: the run's first */

    /* weights and checkpoints */
    const char *weights;      /* start from these weights (safetensors) */
    const char *resume;       /* continue from this checkpoint: weights, optimizer state
                                 (under `optimizer`, which may differ from its own; a
                                 different kind starts without state), schedule and step */
    int non_strict;           /* resume: a trained parameter without state in the file
                                 starts without (else an error naming it); a tensor
                                 that does not match its checksum is a warning: a
                                 weight is read as it is, damaged optimizer state is
                                 left out (else EBB_ERR_CORRUPT naming it) */
    int allow_nonfinite;      /* NaN or Inf in weights or resume: a warning, not an error */
    /* Where checkpoints go (NULL: none, unless ebb_trainer_checkpoint() is
     * given a path): one at every epoch's end and at the run's end (early
     * stopping's too; a callback's stop writes nothing), each replacing the
     * last, atomically. ebb_trainer_checkpoint(t, NULL) writes here too. */
    const char *checkpoint;
    int64_t checkpoint_every; /* > 0: every N steps and at the run's end instead */
    /* Keep the best checkpoint by a metric read at every epoch's end, one
     * of the JSON epoch line's figures: "loss" and "perplexity" (the
     * epoch's training mean), "eval_loss", "eval_perplexity",
     * "eval_accuracy" and "eval_top_k_accuracy" (eval_data's evaluation).
     * Accuracies are best highest, the others lowest. An epoch whose figure
     * beats every earlier one (strictly; NaN never does) writes a
     * checkpoint, atomically, beside `checkpoint`: PATH.safetensors keeps
     * its best at PATH.best.safetensors, any other PATH at PATH.best
     * (ebb_trainer_stats.best_checkpoint). Checkpoints record the metric
     * and its best value, so a run resumed with the same keep_best
     * replaces the file only for a better one. Needs `checkpoint`, and for
     * the eval_ figures eval_data. NULL: none. */
    const char *keep_best;

    /* evaluation and stopping */
    int top_k;                   /* top-k accuracy's k (defaults: 5); 0: none */
    int early_stop_patience;     /* stop when the evaluation loss has not improved for
                                    this many epochs (needs eval_data); 0: never */
    double early_stop_min_delta; /* an improvement is a fall by more than this */
    /* An exponential moving average of the weights, as torch.optim.swa_utils'
     * AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(ema_decay),
     * use_buffers=True): after every step that updated, each parameter's and
     * buffer's average moves (1 - ema_decay) of the way to it (the first step
     * copies it). Evaluation, keep_best and save_weights use the average;
     * checkpoints hold it beside the weights ("ema." + name) and a resumed
     * run goes on averaging. It costs one more copy of the parameters,
     * outside the plan's figures. 0: none; else between 0 and 1. */
    double ema_decay;

    /* observers */
    ebb_train_callback on_step, on_epoch;
    void *user;
    FILE *progress;   /* the start line, the progress line (redrawn in place on a
                         terminal), log lines and epoch lines, as `ebb train` prints
                         them; NULL: silent */
    int64_t log_every; /* with progress: a line every N steps (0: per epoch only) */
    /* warnings (weights with NaN, a dataset unlike the checkpoint's); NULL:
     * "ebb: warning: MESSAGE" on stderr */
    void (*warning)(const char *message, void *user);
} ebb_trainer_options;

/* Options with the defaults above; set the fields to change. */
EBB_API ebb_trainer_options ebb_trainer_defaults(void);

/* ---- the trainer ---------------------------------------------------------- */

/* Compiles the spec's plans at the batch size, opens the data (checking its
 * shapes against the spec's before reading it), makes the model (weights,
 * or the checkpoint resumed) and the optimizer. *out receives a new trainer,
 * freed with ebb_trainer_free(); the spec, and the strings and arrays the
 * options point to (paths, patterns), are borrowed and must outlive it
 * (the schedule is copied).
 * Every failure frees what it made and names the option or the file. */
EBB_API ebb_status ebb_trainer_open(ebb_trainer **out, const ebb_spec *spec,
                                    const ebb_trainer_options *opts);
/* ebb_trainer_open() for a graph built in C (graph.h) rather than a YAML
 * spec: `fields` gives the shape (and dtype) of each of its inputs and
 * targets, as ebb_spec_from_graph() takes them, and the graph declares its
 * loss with ebb_loss(). The trainer holds its own reference to g. */
EBB_API ebb_status ebb_trainer_open_graph(ebb_trainer **out, const ebb_graph *g,
                                          const ebb_spec_field *fields, int n_fields,
                                          const ebb_trainer_options *opts);
/* Frees the trainer, its plans, model, optimizer and data. NULL: no-op. */
EBB_API void ebb_trainer_free(ebb_trainer *t);

/* Trains to the last step: steps, events, evaluations, checkpoints. Returns
 * EBB_OK when the run ended, a callback or early stopping stopped it
 * (ebb_trainer_stop_reason()), or the run was already at its last step. */
EBB_API ebb_status ebb_trainer_run(ebb_trainer *t);
/* One training step on the next batch (*loss may be NULL: NAN when the step
 * was skipped); the epoch's end, its evaluation and checkpoints follow as
 * in ebb_trainer_run(). EBB_ERR_ARG past the run's last step. Early
 * stopping or a callback may stop at this step (ebb_trainer_stop_reason(),
 * until the next step); a step after a stop goes on training. */
EBB_API ebb_status ebb_trainer_step(ebb_trainer *t, double *loss);
/* Evaluates the model (the weights' average with ema_decay) on eval_data
 * with the inference plan, in file order;
 * *out receives the metrics (free with ebb_metrics_free()). EBB_ERR_ARG
 * when the trainer has no eval_data. */
EBB_API ebb_status ebb_trainer_evaluate(ebb_trainer *t, ebb_metrics *out);

/* Writes a checkpoint to `path` (NULL: ebb_trainer_options.checkpoint):
 * weights, optimizer state (optim.* as ebb_optimizer_save() names them),
 * the weights' average (ema.*, with ema_decay), the step, the seed, the
 * data order and the schedule, in one atomic
 * safetensors file, which ebb_trainer_options.resume continues. Refuses a
 * state that holds NaN or Inf, leaving the file as it was. */
EBB_API ebb_status ebb_trainer_checkpoint(ebb_trainer *t, const char *path);
/* Writes the weights alone (ebb_model_save()), refusing NaN or Inf: their
 * average with ema_decay, the trained weights without. */
EBB_API ebb_status ebb_trainer_save_weights(const ebb_trainer *t, const char *path);

/* Why the last ebb_trainer_run() stopped before the run's end ("early
 * stopping: ...", "stopped by the step callback at step 12"), or NULL. */
EBB_API const char *ebb_trainer_stop_reason(const ebb_trainer *t);

/* What a run has done so far. */
typedef struct ebb_trainer_stats {
    int64_t step;          /* the last step done (a resumed run starts at its checkpoint's) */
    int64_t total_steps;   /* the run's last step */
    int64_t steps_per_epoch;
    int64_t samples;       /* samples in the training data */
    int64_t epoch_samples; /* samples an epoch trains on (drop_last: whole batches only) */
    int64_t samples_seen, samples_total; /* samples seen at `step`, and at the run's last step */
    int64_t done_steps;    /* steps this trainer ran */
    int64_t skipped;       /* of them, undone by skip_nonfinite */
    int64_t overflowed;    /* of them, skipped by loss scaling (their gradients overflowed) */
    double loss_scale;     /* loss scaling's scale for the next step; 0: loss scaling is off */
    int64_t first_skipped; /* the first skipped step (0: none) */
    const char *first_skip_why; /* its reason ("the loss is NaN"); "" when none */
    int64_t replayed;      /* steps replayed from a CUDA graph */
    int64_t over_plan;     /* steps that measured more than their plan */
    int64_t measured_peak_bytes, planned_peak_bytes; /* the most any step measured; the plan's */
    int64_t last_checkpoint; /* the step of the last checkpoint written (-1: none) */
    /* What the step callback that stopped the last ebb_trainer_run()
     * returned (`ebb train` returns the signal); 0 when none did. Data
     * parallel: one rank's callback stops every rank, after the next step,
     * whose loss exchange carries it (so that they stop, and checkpoint,
     * together), with the value it returned. */
    int stopped_by;
    int64_t accumulate_bytes; /* accumulate: the gradient sums held for the run
                                 (ebb_plan_grad_sums_bytes()) */
    int64_t failed_step;   /* the step whose run failed (0: none); a failure elsewhere (an
                              evaluation, a checkpoint) leaves it 0 */
    int nonfinite;         /* the last failure was a loss or state not finite */
    int per_token;         /* the loss is per token (see ebb_metrics.perplexity): the
                              progress lines give exp(loss), the perplexity, too */
    /* keep_best: where the best checkpoint goes (NULL: no keep_best), the
     * best value of the metric so far and the step of its checkpoint (NAN
     * and 0: none yet; a resumed run starts from its checkpoint's) */
    const char *best_checkpoint;
    double best_value;
    int64_t best_step;
} ebb_trainer_stats;
/* The counts so far (NULL t: zeros, last_checkpoint -1, best_value NAN).
 * first_skip_why and best_checkpoint point into the trainer. */
EBB_API ebb_trainer_stats ebb_trainer_get_stats(const ebb_trainer *t);

/* The parts, borrowed from the trainer (NULL t: NULL). */
/* The model: the parameters, in the training plan's order. */
EBB_API ebb_model *ebb_trainer_model(const ebb_trainer *t);
/* The optimizer; NULL when evaluate_only. */
EBB_API ebb_optimizer *ebb_trainer_optimizer(const ebb_trainer *t);
/* The training plan (forward, loss, backward, update); NULL when evaluate_only. */
EBB_API const ebb_plan *ebb_trainer_train_plan(const ebb_trainer *t);
/* The inference plan evaluation runs. */
EBB_API const ebb_plan *ebb_trainer_infer_plan(const ebb_trainer *t);
/* The training data; NULL when evaluate_only. */
EBB_API const ebb_dataset *ebb_trainer_data(const ebb_trainer *t);
/* The evaluation data; NULL without eval_data. */
EBB_API const ebb_dataset *ebb_trainer_eval_data(const ebb_trainer *t);
/* The options as opened (the schedule pointing at the trainer's copy). */
EBB_API const ebb_trainer_options *ebb_trainer_get_options(const ebb_trainer *t);
/* The learning-rate scheduler (NULL without a schedule). */
EBB_API ebb_lr_scheduler *ebb_trainer_scheduler(const ebb_trainer *t);

/* ---- checkpoints ------------------------------------------------------------ */

/* What a checkpoint says about its run, read from its header. */
typedef struct ebb_checkpoint_info {
    int64_t step, batch;
    uint64_t seed;
    int shuffle, drop_last;
    ebb_optimizer_options optimizer;
    char *data;      /* the data's fields as stored ("x float32 [96, 64], ..."); NULL: not
                        recorded */
    char *stateless; /* trained parameters that had no optimizer state, comma-separated;
                        NULL: not recorded */
    double clip_grad_norm, clip_grad_value; /* 0: none */
    int64_t accumulate; /* micro-batches per step (1: none) */
    char *no_decay;     /* the no_decay patterns, comma-separated; NULL: none */
    int has_schedule; /* the schedule and where it was */
    ebb_lr_schedule schedule;
    int64_t schedule_steps;
    double schedule_lr, schedule_base; /* the rate the next step takes, and the rate
                                          the schedule scales (PyTorch's base_lrs) */
    char *keep_best;        /* the keep_best metric of the run; NULL: none */
    double keep_best_value; /* its best value by then (NAN: none yet) */
    int64_t keep_best_step; /* the step of the checkpoint kept for it (0: none) */
    /* early stopping's state (ebb_trainer_options.early_stop_patience): the
     * best evaluation loss, its epoch (0: none yet, or not recorded) and the
     * epochs since without improvement; a resumed run goes on counting */
    double early_stop_best_loss;
    int64_t early_stop_best_epoch, early_stop_bad_epochs;
    /* the weights' moving average (ebb_trainer_options.ema_decay): its decay
     * (0: the run kept none) and the steps averaged into it */
    double ema_decay;
    int64_t ema_updates;
} ebb_checkpoint_info;

/* Reads a checkpoint's header into *out (free with
 * ebb_checkpoint_info_free()). EBB_ERR_ARG naming the file for one that is
 * not an ebb checkpoint. */
EBB_API ebb_status ebb_checkpoint_read_info(const char *path, ebb_checkpoint_info *out);
/* Frees the strings and zeroes *ci. NULL: no-op. */
EBB_API void ebb_checkpoint_info_free(ebb_checkpoint_info *ci);

#ifdef __cplusplus
}
#endif
#endif /* EBB_TRAINER_H */
