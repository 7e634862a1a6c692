/*
 * Learning-rate schedules: torch.optim.lr_scheduler's, step for step.
 *
 *     ebb_lr_schedule s;
 *     ebb_lr_schedule_parse(&s, "cosine:1000");       // or fill the struct
 *     ebb_lr_scheduler *sched;
 *     ebb_lr_scheduler_new(&sched, opt, &s);           // sets the step-0 rate
 *     for (...) {
 *         ebb_train_step(plan, model, opt, x, y, &loss, NULL);
 *         ebb_lr_scheduler_step(sched);                // then the next rate
 *     }
 *     ebb_lr_scheduler_free(sched);
 *
 * A scheduler changes the optimizer's learning rate (ebb_optimizer_set_lr)
 * after each step, as `scheduler.step()` after `optimizer.step()` does in
 * PyTorch; a schedule counts optimizer steps (PyTorch's `last_epoch`), so
 * one stepped per batch is a per-step schedule. Each computes its rates with
 * the same formula and in the same order as PyTorch's class (the
 * recursive forms where PyTorch uses them), in double precision, so the
 * rates equal PyTorch's to the last bit or within a few units of it
 * (tests/test_optim.c compares 100 steps of each with torch 1.13's).
 *
 * The base rate is the optimizer's learning rate when the scheduler is made
 * (PyTorch's `initial_lr`), except for one-cycle, which sets its own.
 *
 *   kind         text form                        PyTorch
 *   constant     constant                         (no scheduler)
 *   step         step:SIZE[:GAMMA]                StepLR(step_size, gamma=0.1)
 *   multistep    multistep:M1,M2,...[:GAMMA]      MultiStepLR(milestones, gamma=0.1)
 *   exponential  exponential:GAMMA                ExponentialLR(gamma)
 *   cosine       cosine:T_MAX[:ETA_MIN]           CosineAnnealingLR(T_max, eta_min=0)
 *   linear       linear:ITERS[:START[:END]]       LinearLR(start_factor=1/3, end_factor=1,
 *                                                          total_iters=ITERS)
 *   warmup-cosine warmup-cosine:WARMUP:TOTAL      LambdaLR with transformers'
 *                 [:MIN_LR]                       get_cosine_schedule_with_warmup: a linear
 *                                                 warmup from 0 over WARMUP steps, then a
 *                                                 half cosine to 0 at TOTAL; with MIN_LR
 *                                                 (a rate), the cosine ends at MIN_LR and
 *                                                 stays there, as nanoGPT's get_lr
 *   onecycle     onecycle:MAX_LR:TOTAL[:PCT]      OneCycleLR(max_lr, total_steps, pct_start=0.3,
 *                                                 anneal_strategy="cos", div_factor=25,
 *                                                 final_div_factor=1e4,
 *                                                 cycle_momentum=False)
 *
 * One-cycle here does not cycle the momentum (PyTorch's does by default);
 * past TOTAL it refuses a step, as PyTorch raises.
 */
#ifndef EBB_SCHEDULE_H
#define EBB_SCHEDULE_H

#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ebb_lr_schedule_kind {
    EBB_LR_CONSTANT,
    EBB_LR_STEP,
    EBB_LR_MULTISTEP,
    EBB_LR_EXPONENTIAL,
    EBB_LR_COSINE,
    EBB_LR_LINEAR,
    EBB_LR_WARMUP_COSINE,
    EBB_LR_ONE_CYCLE,
} ebb_lr_schedule_kind;

#define EBB_MAX_MILESTONES 16

typedef struct ebb_lr_schedule {
    ebb_lr_schedule_kind kind;
    int64_t step_size;                        /* step */
    int64_t milestones[EBB_MAX_MILESTONES];   /* multistep, increasing */
    int n_milestones;
    double gamma;                             /* step, multistep, exponential */
    int64_t t_max;                            /* cosine */
    double eta_min;                           /* cosine */
    int64_t total_iters;                      /* linear */
    double start_factor, end_factor;          /* linear */
    int64_t warmup_steps;                     /* warmup-cosine */
    int64_t total_steps;                      /* warmup-cosine, onecycle */
    double max_lr, pct_start;                 /* onecycle */
    double min_lr;                            /* warmup-cosine: the rate the decay ends at
                                                 (0: HF's schedule exactly) */
} ebb_lr_schedule;

/* Parses a schedule's text form (the table above; numbers as C writes
 * them). Optional fields take PyTorch's defaults. EBB_ERR_ARG naming the
 * text and what was expected there, with the nearest kind for a misspelt
 * one. */
EBB_API ebb_status ebb_lr_schedule_parse(ebb_lr_schedule *out, const char *text);

/* The schedule's text form with every field, which ebb_lr_schedule_parse()
 * reads back to the same schedule (each number in the fewest digits that
 * do). Returns buf. */
EBB_API char *ebb_lr_schedule_str(const ebb_lr_schedule *s, char *buf, size_t size);

typedef struct ebb_lr_scheduler ebb_lr_scheduler;

/* A scheduler of `opt`'s learning rate, at step 0: it sets the rate of the
 * first step (a warmup's first, one-cycle's initial rate) as PyTorch's
 * constructor does. The optimizer is borrowed and must outlive it.
 * EBB_ERR_ARG for a schedule that PyTorch would refuse (a zero step size,
 * milestones out of order, a factor outside (0, 1], ...), naming it. */
EBB_API ebb_status ebb_lr_scheduler_new(ebb_lr_scheduler **out, ebb_optimizer *opt,
                                        const ebb_lr_schedule *s);
/* Frees the scheduler (the optimizer keeps its last rate). NULL is allowed. */
EBB_API void ebb_lr_scheduler_free(ebb_lr_scheduler *s);

/* After an optimizer step: the schedule's next rate, set on the optimizer.
 * EBB_ERR_ARG past a one-cycle's last step (the rate is left as it was). */
EBB_API ebb_status ebb_lr_scheduler_step(ebb_lr_scheduler *s);

/* The rate the next optimizer step uses. */
EBB_API double ebb_lr_scheduler_lr(const ebb_lr_scheduler *s);
/* How many times the scheduler was stepped (PyTorch's last_epoch). */
EBB_API int64_t ebb_lr_scheduler_steps(const ebb_lr_scheduler *s);
/* The base rate the schedule scales (PyTorch's base_lrs[0]). */
EBB_API double ebb_lr_scheduler_base_lr(const ebb_lr_scheduler *s);

/* Puts a scheduler where a saved one was: `steps` steps taken, `lr` the
 * rate they left and `base_lr` its base (what ebb_lr_scheduler_steps(),
 * _lr() and _base_lr() returned then), and sets the optimizer's rate to
 * `lr`; the next step continues as the saved scheduler would have, to the
 * bit. EBB_ERR_ARG for a negative count or a rate that is not finite. */
EBB_API ebb_status ebb_lr_scheduler_restore(ebb_lr_scheduler *s, int64_t steps, double lr,
                                            double base_lr);

#ifdef __cplusplus
}
#endif
#endif /* EBB_SCHEDULE_H */
